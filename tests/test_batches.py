"""rvm.vmap's batches: functions that have run natively pickle without their native code
(a dask worker in another process finds it again), empty batches, and the mistakes a
batch's arguments can make, on the plain and the Dask path."""

import pickle

import numpy as np
import pytest

import rvm
from rvm.engines import native
from rvm.engines.machine import NATIVE_AFTER

needs_native = pytest.mark.skipif(not native.available, reason="llvmlite is not installed")

POLY = """
.func f(f0, f1, r0)        ; f0 += f1 * f1; r0 += 1
        ADD.mul  f0, f1, f1
        INC      r0
.end
"""

@rvm.reversible
def scaled(out: float, x: float, k: int):
    """out += k tanh(x)."""
    out += k * tanh(x)


def fresh():
    """A reversible function of its own (so its runs are counted from zero here), made
    inside a function: pickled by value, as dask sends a script's functions."""
    @rvm.reversible
    def model(out: float, w: float, x: float):
        out += tanh(w * x) * x
    return model


def native_code(program) -> bool:
    """Has the program (in this process) native code?"""
    return any(isinstance(k, tuple) and k[0] == "compiled" and k[2] for k in program.cache)


def warm(fn, *args, **options):
    for _ in range(NATIVE_AFTER + 2):
        fn(*args, **options)
    return fn


# ---------------------------------------------------------------- pickling


@needs_native
def test_a_function_that_ran_natively_pickles_and_runs_the_same_after():
    """A program's function run on the native engine, and a reversible function after
    engine auto has moved it to native code, round-trip through plain pickle (without
    their native code, found again on the next call) and give the same results."""
    prog = rvm.assemble(POLY, "poly.rasm")
    h = warm(prog["f"], 0.0, 0.5, 3, engine="native")
    assert native_code(prog)
    h2 = pickle.loads(pickle.dumps(h))
    assert not native_code(h2.program)
    assert h2(0.0, 0.5, 3, engine="native") == h(0.0, 0.5, 3, engine="native")
    assert native_code(h2.program)
    xs = np.linspace(-1, 1, 9)
    assert np.array_equal(rvm.vmap(h2, in_axes=(None, 0, None))(0.0, xs, 3)[0],
                          rvm.vmap(h, in_axes=(None, 0, None))(0.0, xs, 3)[0])

    warm(scaled, 0.0, 0.25, 2)                     # engine auto, gone native
    assert native_code(scaled.specialize((0.0, 0.25, 2))[0])
    for f in (scaled, ~scaled):
        f2 = pickle.loads(pickle.dumps(f))
        assert f2(1.0, 0.25, 2) == f(1.0, 0.25, 2)


@needs_native
def test_warmed_gradients_pickle_by_value_as_dask_sends_them():
    """cloudpickle (dask's serializer) sends a gradient function and its reversible
    function by value: without native code, which the copy compiles or finds in the
    cache; its engine auto goes on natively as the original had."""
    cloudpickle = pytest.importorskip("cloudpickle")
    f = fresh()
    g = warm(rvm.grad(f, loss="out", engine="native"), 0.0, 0.5, 2.0)
    copy = pickle.loads(cloudpickle.dumps(g))
    assert copy(0.0, 0.5, 2.0) == g(0.0, 0.5, 2.0)
    xs = np.linspace(-2, 2, 11)
    assert np.array_equal(rvm.vmap(copy, in_axes=(None, None, 0))(0.0, 0.5, xs)[1],
                          rvm.vmap(g, in_axes=(None, None, 0))(0.0, 0.5, xs)[1])
    warm(f, 0.0, 0.5, 2.0)                         # engine auto, gone native
    copy = pickle.loads(cloudpickle.dumps(f))
    program = copy.specialize((0.0, 0.5, 2.0))[0]
    assert not native_code(program)
    assert copy(0.0, 0.5, 2.0) == f(0.0, 0.5, 2.0)
    assert native_code(program)                    # its first call there is native


@pytest.fixture(scope="module")
def cluster():
    """One worker process (started once for the module: about a second)."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.LocalCluster(processes=True, n_workers=1, threads_per_worker=1,
                                  dashboard_address=":0") as c, distributed.Client(c) as client:
        yield client


@needs_native
def test_vmap_on_a_process_cluster_after_native_runs(cluster):
    """backend='dask' on a worker process: a gradient that ran on the native engine, and
    a function engine auto moved to native code, are sent (pickled without native code)
    and run there natively; the results equal the local batch's."""
    import dask.array as da
    f = fresh()
    g = warm(rvm.grad(f, loss="out", engine="native"), 0.0, 0.5, 2.0)
    xs = np.linspace(-2, 2, 40)
    got = rvm.vmap(g, in_axes=(None, None, 0), backend="dask")(0.0, 0.5, da.from_array(
        xs, chunks=10))
    assert isinstance(got[1], da.Array)
    assert np.array_equal(got[1].compute(), rvm.vmap(g, in_axes=(None, None, 0))(
        0.0, 0.5, xs)[1])
    warm(f, 0.0, 0.5, 2.0)
    got = rvm.vmap(f, in_axes=(None, None, 0), backend="dask")(0.0, 0.5, xs)
    assert np.array_equal(got[0].compute(), rvm.vmap(f, in_axes=(None, None, 0))(
        0.0, 0.5, xs)[0])

    def natively(fn):          # on the worker: a batch, then has its program native code?
        rvm.vmap(fn, in_axes=(None, None, 0))(0.0, 0.5, np.ones(3))
        return native_code(fn.specialize((0.0, 0.5, 1.0))[0])
    assert cluster.submit(natively, f, pure=False).result()


# ---------------------------------------------------------------- empty batches


def test_an_empty_batch_gives_one_empty_array_per_output():
    """Typed and shaped as a batch of rows gives them: float64 / int64 columns, rows of
    an array argument, None for an integer's gradient, Jacobians (0, outputs, wrt)."""
    prog = rvm.assemble(POLY, "poly.rasm")
    e, ei = np.array([]), np.array([], np.int64)
    out = rvm.vmap(prog["f"])(e, e, ei)
    assert [(a.shape, a.dtype) for a in out] == [((0,), np.float64)] * 2 + [
        ((0,), np.int64)]
    out = rvm.vmap(scaled, in_axes=(None, 0, None))(0.0, e, 3)
    assert [(a.shape, a.dtype) for a in out] == [((0,), np.float64)] * 2 + [
        ((0,), np.int64)]
    g = rvm.vmap(rvm.grad(scaled, loss="out"), in_axes=(None, 0, None))(0.0, e, 3)
    assert [(a.shape, a.dtype) for a in g[:2]] == [((0,), np.float64)] * 2 and g[2] is None
    values, grads = rvm.vmap(rvm.value_and_grad(scaled, loss="out"),
                             in_axes=(None, 0, None))(0.0, e, 3)
    assert values[2].dtype == np.int64 and grads[1].shape == (0,) and grads[2] is None
    J = rvm.vmap(rvm.jacobian(scaled, ["out"], ["out", "x"]), in_axes=(None, 0, None))(
        0.0, e, 3)
    assert J.shape == (0, 1, 2) and J.dtype == np.float64

    @rvm.reversible
    def total(out: float, x: rvm.Array[float]):
        for i in range(len(x)):
            out += x[i]
    out = rvm.vmap(total, in_axes=(None, 0))(0.0, np.zeros((0, 3)))
    assert out[0].shape == (0,) and out[1].shape == (0, 3)
    # the same as a non-empty batch's, less its rows
    full = rvm.vmap(total, in_axes=(None, 0))(0.0, np.ones((2, 3)))
    assert [(a.shape[1:], a.dtype) for a in out] == [(a.shape[1:], a.dtype) for a in full]


def test_an_empty_batch_on_the_dask_path():
    da = pytest.importorskip("dask.array")
    out = rvm.vmap(scaled, in_axes=(None, 0, 0), backend="dask")(
        0.0, np.array([]), da.from_array(np.array([], np.int64)))
    assert all(isinstance(a, da.Array) for a in out)
    got = [a.compute() for a in out]
    assert [(a.shape, a.dtype) for a in got] == [((0,), np.float64)] * 2 + [
        ((0,), np.int64)]
    g = rvm.vmap(rvm.grad(scaled, loss="out"), in_axes=(None, 0, None), backend="dask")(
        0.0, np.array([]), 3)
    assert g[1].compute().shape == (0,) and g[2] is None


# ---------------------------------------------------------------- mistakes


@pytest.mark.parametrize("backend", [None, "dask"])
def test_mismatched_lengths_and_scalars_name_the_argument(backend):
    if backend == "dask":
        pytest.importorskip("dask.array")
    prog = rvm.assemble(POLY, "poly.rasm")
    with pytest.raises(rvm.UsageError, match=r"argument 1 \(x\) has 3 rows, argument 0 "
                                             r"\(out\) has 2"):
        rvm.vmap(scaled, in_axes=(0, 0, None), backend=backend)(np.zeros(2), np.ones(3), 1)
    with pytest.raises(rvm.UsageError, match=r"argument 2 \(k\) is batched .* scalar"):
        rvm.vmap(scaled, backend=backend)(np.zeros(2), np.ones(2), 3)
    with pytest.raises(rvm.UsageError, match=r"argument 2 \(k\) is batched .* scalar"):
        rvm.vmap(rvm.grad(scaled, loss="out", engine="python"), backend=backend)(
            np.zeros(2), np.ones(2), 3)
    with pytest.raises(rvm.UsageError, match=r"argument 2 \(r0\) has 1 rows"):
        rvm.vmap(prog["f"], backend=backend)(np.zeros(2), np.ones(2), np.ones(1, np.int64))
    with pytest.raises(rvm.UsageError, match=r"argument 1 is batched .* scalar"):
        rvm.vmap(lambda a, b: a + b, backend=backend)(np.zeros(2), 1.0)


def test_batches_split_across_the_cores_this_process_may_use(monkeypatch):
    """A process pinned to one core (taskset, a container's CPU set) runs a native batch
    on one thread: the cores counted are those it may run on, not the machine's."""
    import os

    from rvm.engines import native
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    native._cores.cache_clear()
    try:
        assert native._cores() == 1
    finally:
        native._cores.cache_clear()
