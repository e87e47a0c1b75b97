"""A unitary (orthogonal) matrix applied to a vector as a sequence of Givens rotations
(after Liu & Zhao, *Instruction level automatic differentiation on a reversible
Turing machine*). Each rot(a, b, t) is exactly invertible (irot), so the
whole transformation runs backwards, and its gradient with respect to the angles comes
from the ROT adjoint.
"""

import rvm
from rvm import Array


@rvm.reversible
def givens(v: Array[float], thetas: Array[float]):
    """Rotate each pair (v[i], v[j]), i < j, by the next angle: n (n - 1) / 2 angles."""
    with rvm.ancilla(k=0):
        for i in range(len(v)):
            for j in range(i + 1, len(v)):
                rvm.rot(v[i], v[j], thetas[k])
                k += 1
        k -= len(v) * (len(v) - 1) // 2
