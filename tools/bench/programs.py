"""Reversible programs for the benchmarks (the Bessel function is examples/besselj.py, the
graph-embedding loss examples/graph_embedding.py)."""

import pathlib
import sys

import rvm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
from graph_embedding import distances, embedding_loss, mean_var  # noqa: F401


@rvm.reversible
def leapfrog(q: float, p: float, n: int, dt: float):
    """A pendulum, n leapfrog steps: p -= dt sin q; q += dt p."""
    for i in range(n):
        p -= dt * sin(q)
        q += dt * p


