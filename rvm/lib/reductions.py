"""Reductions of a vector to a number: logsumexp and the Euclidean norm.

Each adds its result to `out` (`out += ...`), computes what it needs in ancillas and
uncomputes them, so the inputs come back unchanged and `~f` subtracts the result again.
"""

from __future__ import annotations

from ..lang import Array, ancilla, compute, nograd, reversible, zeros


@reversible
def logsumexp(out: float, x: Array[float]):
    """out += log(sum(exp(x))), shifted by max(x) so that no exp overflows. The running
    maxima are kept in an ancilla array (len(x) floats) and uncomputed; the shift is read
    with nograd (the result does not depend on it), so the gradient is softmax(x)."""
    assert len(x) > 0
    with ancilla(top=zeros(len(x)), s=0.0):
        with compute() as r:
            top[0] += x[0]
            for i in range(1, len(x)):
                if x[i] > top[i - 1]:
                    top[i] += x[i]
                else:
                    top[i] += top[i - 1]
            for i in range(len(x)):
                s += exp(x[i] - nograd(top[len(x) - 1]))
        out += log(s)
        out += nograd(top[len(x) - 1])
        ~r


@reversible
def norm(out: float, x: Array[float]):
    """out += sqrt(sum(x ** 2)), numpy.linalg.norm(x); the gradient is x / norm(x)
    (not finite at x = 0)."""
    with ancilla(s=0.0):
        with compute() as r:
            for i in range(len(x)):
                s += x[i] * x[i]
        out += sqrt(s)
        ~r
