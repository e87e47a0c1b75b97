"""The dot product of two sparse matrices, sum_ij A_ij B_ij (the NiLang paper's sparse
matrix example), on compressed sparse column (CSC) arrays: column pointers, row indices, values.

Per column, B's values are scattered into a dense work vector, A's nonzeros read from it,
and the scatter is uncomputed. This takes O(nnz) time, needs no branch-keeping, and works
for different sparsity patterns. `out` accumulates the result; the gradient with respect to
A's values is B at A's positions, and the other way round.
"""

import numpy as np

import rvm
from rvm import Array, ancilla, zeros


@rvm.reversible
def sparse_dot(out: float, a_ptr: Array[int], a_row: Array[int], a_val: Array[float],
               b_ptr: Array[int], b_row: Array[int], b_val: Array[float], m: int):
    with ancilla(work=zeros(m)):
        for j in range(len(a_ptr) - 1):
            for q in range(b_ptr[j], b_ptr[j + 1]):
                work[b_row[q]] += b_val[q]
            for p in range(a_ptr[j], a_ptr[j + 1]):
                out += a_val[p] * work[a_row[p]]
            for q in range(b_ptr[j], b_ptr[j + 1]):
                work[b_row[q]] -= b_val[q]


def random_csc(rng, m: int, n: int, density: float):
    """A random m x n matrix with about `density` nonzeros: (dense, colptr, rows, values)."""
    dense = (rng.random((m, n)) < density) * rng.normal(size=(m, n))
    ptr, rows, vals = [0], [], []
    for j in range(n):
        r = np.nonzero(dense[:, j])[0]
        rows += list(r)
        vals += list(dense[r, j])
        ptr.append(len(rows))
    return dense, np.array(ptr, np.int64), np.array(rows, np.int64), np.array(vals)
