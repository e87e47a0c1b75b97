"""Reversible programs for the benchmarks (the Bessel function is examples/besselj.py)."""

import rvm
from rvm import Array, ancilla, compute, zeros


@rvm.reversible
def leapfrog(q: float, p: float, n: int, dt: float):
    """A pendulum, n leapfrog steps: p -= dt sin q; q += dt p."""
    for i in range(n):
        p -= dt * sin(q)
        q += dt * p


@rvm.reversible
def distances(d: Array[float], x: Array[float, 2], pairs: Array[int, 2]):
    for e in range(len(pairs)):
        with ancilla(s=0.0):
            with compute() as squares:
                for c in range(x.shape[1]):
                    s += (x[pairs[e, 0], c] - x[pairs[e, 1], c]) ** 2
            d[e] += sqrt(s)
            ~squares


@rvm.reversible
def mean_var(m: float, v: float, d: Array[float]):
    for i in range(len(d)):
        m += d[i] / len(d)
    for i in range(len(d)):
        v += (d[i] - m) ** 2 / len(d)


@rvm.reversible
def embedding_loss(out: float, x: Array[float, 2], l1: Array[int, 2], l2: Array[int, 2]):
    """Seed 001, appendix D.2: Var(dist L1) + Var(dist L2) + exp(relu(mean L1 - mean L2
    + 0.1)) - 1, for the Petersen graph (L1: edges, L2: non-edges)."""
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
