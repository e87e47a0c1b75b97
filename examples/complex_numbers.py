"""Complex numbers: the complex logarithm as a complex type, a complex dot product with
conjugation, and a complex sparse matrix times a vector with its gradient (after the
NiLang paper's complex log and sparse `mul!` listings, Liu & Zhao).

A complex value is a pair of float registers; a complex array an n x 2 float array. The
gradient of a real loss with respect to a complex argument z = x + iy is
dL/dx + i dL/dy, PyTorch's convention (JAX returns its complex conjugate).

    python examples/complex_numbers.py
"""

import numpy as np

import rvm
from rvm import Array, ancilla


@rvm.reversible
def complex_log(y: complex, x: complex):
    """y += log(x) = log|x| + i arg x."""
    y += log(x)


@rvm.reversible
def cdot(out: complex, a: Array[complex], b: Array[complex]):
    """out += sum_i conj(a_i) b_i (numpy's vdot)."""
    for i in range(len(a)):
        out += conj(a[i]) * b[i]


@rvm.reversible
def spmv(y: Array[complex], colptr: Array[int], rowval: Array[int], nzval: Array[complex],
         x: Array[complex], alpha: complex):
    """y += alpha A x for A in compressed sparse column form (column pointers, row
    indices, values): each column's alpha x_j is computed into an ancilla, used, and
    uncomputed."""
    for j in range(len(colptr) - 1):
        with ancilla(ax=0j):
            ax += alpha * x[j]
            for k in range(colptr[j], colptr[j + 1]):
                y[rowval[k]] += nzval[k] * ax
            ax -= alpha * x[j]


@rvm.reversible
def spmv_loss(loss: float, y: Array[complex], colptr: Array[int], rowval: Array[int],
              nzval: Array[complex], x: Array[complex], alpha: complex):
    """loss += |y|^2 after y += alpha A x: a real loss to differentiate."""
    spmv(y, colptr, rowval, nzval, x, alpha)
    for i in range(len(y)):
        loss += y[i].real * y[i].real + y[i].imag * y[i].imag


def random_csc(rng, m: int, n: int, density: float):
    """A random complex m x n matrix: (dense, colptr, rowval, nzval)."""
    mask = rng.random((m, n)) < density
    dense = mask * (rng.normal(size=(m, n)) + 1j * rng.normal(size=(m, n)))
    colptr, rows = [0], []
    for j in range(n):
        rows += list(np.nonzero(mask[:, j])[0])
        colptr.append(len(rows))
    rowval = np.array(rows, np.int64)
    cols = np.repeat(np.arange(n), np.diff(colptr))
    return dense, np.array(colptr, np.int64), rowval, dense[rowval, cols]


if __name__ == "__main__":
    y, x = complex_log(0j, 1 + 2j)
    print(f"log(1+2j) = {y:.12f}")
    a, b = np.array([1 + 2j, 3 - 1j]), np.array([2 - 1j, 1 + 1j])
    print("vdot:", cdot(0j, a, b)[0], "numpy:", np.vdot(a, b))
    rng = np.random.default_rng(0)
    dense, colptr, rowval, nzval = random_csc(rng, 6, 5, 0.5)
    x = rng.normal(size=5) + 1j * rng.normal(size=5)
    y0 = np.zeros(6, complex)
    print("A x matches numpy:", np.allclose(spmv(y0, colptr, rowval, nzval, x, 1 + 0j)[0],
                                            dense @ x))
    grads = rvm.grad(spmv_loss, loss="loss")(0.0, y0, colptr, rowval, nzval, x, 1 + 0j)
    y = dense @ x
    print("dL/dx = 2 A^H y:", np.allclose(grads[5], 2 * dense.conj().T @ y))
    print("dL/dA = 2 y conj(x) at the nonzeros:",
          np.allclose(grads[4], 2 * y[rowval] * np.repeat(x.conj(), np.diff(colptr))))
