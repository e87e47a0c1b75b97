"""Embedding the Petersen graph by a trust-region Newton method on rvm.hessian (after the
graph-embedding example of the NiLang paper, Liu & Zhao).

Place the 10 vertices in R^k so that all 15 edges have one length l1 and all 30 other
pairs another, l2: the loss Var(edge lengths) + Var(other lengths) +
exp(relu(mean(l1) - mean(l2) + 0.1)) - 1 is zero exactly then. It is far above zero for
k < 5 and reaches zero at k = 5, where l2 / l1 = sqrt(2). Two vertices stay fixed.
Each Newton step takes the exact Hessian from rvm.hessian (tangents of the loss program,
differentiated backwards: no tape, O(1) extra memory).
"""

import itertools

import numpy as np

import rvm
from rvm import Array, ancilla, compute, zeros


@rvm.reversible
def distances(d: Array[float], x: Array[float, 2], pairs: Array[int, 2]):
    for e in range(len(pairs)):
        with ancilla(s=0.0, i=pairs[e, 0], j=pairs[e, 1]):    # the pair's vertices
            for c in range(x.shape[1]):
                s += (x[i, c] - x[j, c]) ** 2
            d[e] += sqrt(s)
            s -= d[e] ** 2          # uncomputed from the distance: the sum runs once


@rvm.reversible
def mean_var(m: float, v: float, d: Array[float]):
    m += np.sum(d) / len(d)
    v += np.sum((d - m) ** 2) / len(d)


@rvm.reversible
def embedding_loss(out: float, x: Array[float, 2], l1: Array[int, 2], l2: Array[int, 2]):
    """Var(dist over L1) + Var(dist over L2) + exp(relu(mean L1 - mean L2 + 0.1)) - 1."""
    with ancilla(d1=zeros(len(l1)), d2=zeros(len(l2)), m1=0.0, m2=0.0, v1=0.0, v2=0.0,
                 gap=0.0):
        with compute() as stats:
            distances(d1, x, l1)
            distances(d2, x, l2)
            mean_var(m1, v1, d1)
            mean_var(m2, v2, d2)
            gap += m1 - m2 + 0.1
        out += v1 + v2
        if gap > 0.0:
            out += exp(gap) - 1.0
        ~stats


def petersen() -> tuple[np.ndarray, np.ndarray]:
    """(edges, non-edges) of the Petersen graph as rows of vertex pairs."""
    edges = [(i, (i + 1) % 5) for i in range(5)] + [(i, i + 5) for i in range(5)] + \
        [(5 + i, 5 + (i + 2) % 5) for i in range(5)]
    others = [p for p in itertools.combinations(range(10), 2)
              if p not in edges and p[::-1] not in edges]
    return np.array(edges, dtype=np.int64), np.array(others, dtype=np.int64)


def trust_region_step(g: np.ndarray, H: np.ndarray, radius: float) -> np.ndarray:
    """The step p minimising g.p + p.H.p / 2 with |p| <= radius (exact, by eigenvalues)."""
    w, V = np.linalg.eigh(H)
    gt = V.T @ g
    floor = 1e-12 * max(1.0, abs(w).max())

    def step(lam):
        return -V @ (gt / np.maximum(w + lam, floor))
    lo = max(0.0, -w.min()) + floor
    p = step(lo)
    if np.linalg.norm(p) <= radius:
        return p
    hi = lo + np.linalg.norm(g) / radius + abs(w).max()
    for _ in range(100):                  # bisect for |p(lam)| = radius
        lam = (lo + hi) / 2
        lo, hi = (lam, hi) if np.linalg.norm(step(lam)) > radius else (lo, lam)
    return step(hi)


def train(k: int = 5, iters: int = 40, seed: int = 1, tol: float = 1e-10, engine=None):
    """Trust-region Newton from a random start; (x, losses, hessians computed)."""
    l1, l2 = petersen()
    x = np.random.default_rng(seed).normal(size=(10, k))
    free = np.ones((10, k), dtype=bool)
    free[:2] = False                       # vertices 0 and 1 stay where they are

    def loss(x):
        return embedding_loss(0.0, x, l1, l2, engine=engine)[0]
    grad = rvm.grad(embedding_loss, loss="out", engine=engine)
    hess = rvm.hessian(embedding_loss, loss="out", wrt=["x"], engine=engine)
    radius, losses, hessians = 1.0, [loss(x)], 0
    for _ in range(iters):
        if losses[-1] < tol:
            break
        g = grad(0.0, x, l1, l2)[1][free]
        H = hess(0.0, x, l1, l2)[np.ix_(free.ravel(), free.ravel())]
        hessians += 1
        p = trust_region_step(g, H, radius)
        trial = x.copy()
        trial[free] += p
        new = loss(trial)
        predicted = -(g @ p + p @ H @ p / 2)
        rho = (losses[-1] - new) / predicted if predicted > 0 else -1.0
        if rho > 0.75 and np.linalg.norm(p) > 0.99 * radius:
            radius *= 2
        elif rho < 0.25:
            radius /= 4
        if rho > 0:
            x, losses = trial, losses + [new]
    return x, losses, hessians


def ratio(x: np.ndarray) -> float:
    """mean non-edge length / mean edge length."""
    l1, l2 = petersen()
    d = lambda pairs: np.linalg.norm(x[pairs[:, 0]] - x[pairs[:, 1]], axis=1).mean()
    return d(l2) / d(l1)


def adam(k: int, steps: int = 5000, lr: float = 0.01, seed: int = 1, engine=None):
    """Train by Adam on rvm.grad (two vertices fixed); (x, final loss)."""
    l1, l2 = petersen()
    x = np.random.default_rng(seed).normal(size=(10, k))
    free = np.ones((10, k), dtype=bool)
    free[:2] = False
    grad = rvm.grad(embedding_loss, loss="out", engine=engine)
    m, v = np.zeros_like(x), np.zeros_like(x)
    b1, b2 = 0.9, 0.999
    for t in range(1, steps + 1):
        g = grad(0.0, x, l1, l2)[1] * free
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x = x - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + 1e-12)
    return x, embedding_loss(0.0, x, l1, l2, engine=engine)[0]


def sweep(ks=range(1, 11), steps: int = 5000, engine=None) -> list[tuple[int, float, float]]:
    """(k, final loss, l2/l1) for each dimension k, trained by Adam."""
    out = []
    for k in ks:
        x, loss = adam(k, steps, engine=engine)
        out.append((k, loss, ratio(x)))
    return out


if __name__ == "__main__":
    import sys
    if "--sweep" in sys.argv:       # Adam for k = 1 .. 10, and a plot of the final loss
        rows = sweep()
        for k, loss, r in rows:
            print(f"k = {k:2d}: final loss {loss:.3g}, l2/l1 = {r:.6f}")
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            sys.exit(0)
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.semilogy([k for k, *_ in rows], [max(loss, 1e-16) for _, loss, _ in rows], "o-")
        ax.set(xlabel="embedding dimension k", ylabel="final loss (Adam)",
               title="Petersen graph embedding")
        fig.tight_layout()
        fig.savefig("graph_embedding_sweep.png", dpi=120)
        print("wrote graph_embedding_sweep.png")
    else:
        x, losses, n = train(k=5)
        print(f"k = 5: loss {losses[-1]:.3g} after {n} Hessians; l2/l1 = {ratio(x):.12f} "
              f"(sqrt 2 = {np.sqrt(2):.12f})")
