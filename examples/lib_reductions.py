"""logsumexp and norm from the standard library, inside a reversible loss: the
log-likelihood of a softmax classifier's label, and its gradient (softmax minus one-hot).

    python examples/lib_reductions.py
"""

import numpy as np

import rvm
from rvm import Array, ancilla, compute
from rvm.lib import logsumexp, norm


@rvm.reversible
def nll(loss: float, z: Array[float], label: int):
    """loss += logsumexp(z) - z[label]: the negative log-likelihood of `label`."""
    logsumexp(loss, z)
    loss -= z[label]


@rvm.reversible
def unit_dot(out: float, u: Array[float], x: Array[float]):
    """out += u . x / |x|."""
    with ancilla(r=0.0):
        with compute() as c:
            norm(r, x)
        for i in range(len(x)):
            out += u[i] * x[i] / r
        ~c


def main():
    z = np.array([2.0, -1.0, 0.5, 3.0])
    (loss, *_), (_, g, _) = rvm.value_and_grad(nll, loss="loss")(0.0, z, 3)
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    print(f"loss {loss:.12f} = {-np.log(p[3]):.12f}")
    print(f"gradient {g}, softmax - onehot {p - np.eye(4)[3]}")
    u, x = np.array([1.0, 0.0, 0.0]), np.array([3.0, 4.0, 12.0])
    (out, *_), grads = rvm.value_and_grad(unit_dot, loss="out")(0.0, u, x)
    print(f"u . x / |x| = {out}, gradient in x {grads[2]}")


if __name__ == "__main__":
    main()
