"""Sparse CSR products from the standard library, with gradients: a least-squares loss
|A x - b|^2 with a sparse A, differentiated with respect to x and to A's nonzeros, and the
sparse dot product of two 1000 x 1000 matrices of density 0.05 (the NiLang paper's size).

    python examples/lib_sparse.py
"""

import numpy as np
import scipy.sparse as sp

import rvm
from rvm import Array, ancilla, compute, zeros
from rvm.lib import csr_dot, csr_matvec


@rvm.reversible
def residual(loss: float, data: Array[float], indices: Array[int], indptr: Array[int],
             x: Array[float], b: Array[float]):
    """loss += |A x - b|^2."""
    with ancilla(r=zeros(len(b))):
        with compute() as c:
            csr_matvec(r, data, indices, indptr, x)
            for i in range(len(b)):
                r[i] -= b[i]
        for i in range(len(b)):
            loss += r[i] * r[i]
        ~c


def main():
    A = sp.random(50, 20, density=0.1, format="csr", random_state=0)
    rng = np.random.default_rng(0)
    x, b = rng.normal(size=20), rng.normal(size=50)
    a = (A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64))
    (loss, *_), g = rvm.value_and_grad(residual, loss="loss")(0.0, *a, x, b)
    print(f"|Ax - b|^2 = {loss:.10f} (numpy {np.sum((A @ x - b) ** 2):.10f})")
    print(f"|d/dx - 2 A^T (Ax - b)| = {np.linalg.norm(g[4] - 2 * A.T @ (A @ x - b)):.1e}")
    A = sp.random(1000, 1000, density=0.05, format="csr", random_state=1)
    B = sp.random(1000, 1000, density=0.05, format="csr", random_state=2)
    args = (A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64),
            B.data, B.indices.astype(np.int64), B.indptr.astype(np.int64), 1000)
    values, grads = rvm.value_and_grad(csr_dot, loss="out")(0.0, *args)
    print(f"sum A * B over 1000 x 1000: {values[0]:.10f} (scipy {A.multiply(B).sum():.10f})")
    rows = np.repeat(np.arange(1000), np.diff(A.indptr))
    print(f"gradient in A's values = B at A's places: "
          f"{np.allclose(grads[1], B[rows, A.indices].A1)}")


if __name__ == "__main__":
    main()
