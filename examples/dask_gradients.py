"""Per-sample gradients over a data set larger than one chunk, on a dask cluster.

Each chunk of the data set is one batch on a worker (a single native call where the
function allows: rvm.vmap of a scalar gradient compiles the loop over rows), and the
results are dask arrays. Here the cluster is a LocalCluster of two workers; point a
dask.distributed.Client at a real cluster to run the same code across machines.

    pip install '.[dask]' && python examples/dask_gradients.py
"""

import numpy as np

import rvm


@rvm.reversible
def loss(out: float, w: float, x: float, y: float):
    """out += (tanh(w x) - y)^2: one sample's squared error."""
    out += (tanh(w * x) - y) ** 2


def per_sample_gradients(w: float, xs, ys):
    """d loss / d w for every sample, as a dask array (lazy)."""
    g = rvm.grad(loss, loss="out")
    return rvm.vmap(g, in_axes=(None, None, 0, 0), backend="dask")(0.0, w, xs, ys)[1]


if __name__ == "__main__":
    import dask.array as da
    from dask.distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster) as client:
        print("dashboard:", client.dashboard_link)
        rng = np.random.default_rng(0)
        xs = da.from_array(rng.normal(size=200_000), chunks=50_000)
        ys = da.tanh(0.7 * xs)
        grads = per_sample_gradients(0.5, xs, ys)
        print(f"{grads.shape[0]} gradients in {grads.numblocks[0]} chunks; "
              f"mean {float(grads.mean().compute()):.6f}")
