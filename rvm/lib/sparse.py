"""Products with sparse matrices in compressed sparse row (CSR) form.

A matrix is scipy's three arrays: `data` (the nonzeros, row by row), `indices` (their
column indices) and `indptr` (row i's nonzeros are data[indptr[i]:indptr[i + 1]]), as in
`scipy.sparse.csr_matrix((data, indices, indptr))`. Every product accumulates into its
output (`y += A @ x`), so its inverse subtracts it again; gradients flow to `data` and
to the dense operand (the NiLang paper's sparse benchmarks, in CSR instead of CSC).
"""

from __future__ import annotations

from ..lang import Array, ancilla, reversible, zeros


@reversible
def csr_matvec(y: Array[float], data: Array[float], indices: Array[int],
               indptr: Array[int], x: Array[float]):
    """y += A @ x."""
    assert len(indptr) == len(y) + 1
    for i in range(len(y)):
        for p in range(indptr[i], indptr[i + 1]):
            y[i] += data[p] * x[indices[p]]


@reversible
def csr_rmatvec(y: Array[float], data: Array[float], indices: Array[int],
                indptr: Array[int], x: Array[float]):
    """y += A.T @ x."""
    assert len(indptr) == len(x) + 1
    for i in range(len(x)):
        for p in range(indptr[i], indptr[i + 1]):
            y[indices[p]] += data[p] * x[i]


@reversible
def csr_matmat(C: Array[float, 2], data: Array[float], indices: Array[int],
               indptr: Array[int], B: Array[float, 2]):
    """C += A @ B, B and C dense."""
    assert len(indptr) == C.shape[0] + 1
    assert B.shape[1] == C.shape[1]
    for i in range(C.shape[0]):
        for p in range(indptr[i], indptr[i + 1]):
            for j in range(C.shape[1]):
                C[i, j] += data[p] * B[indices[p], j]


@reversible
def csr_dot(out: float, a_data: Array[float], a_indices: Array[int],
            a_indptr: Array[int], b_data: Array[float], b_indices: Array[int],
            b_indptr: Array[int], ncols: int):
    """out += sum_ij A_ij B_ij, A and B of the same shape (ncols columns) with any two
    sparsity patterns. Row by row, B's row is scattered into a dense work row, A's
    nonzeros read from it, and the scatter undone: O(nnz + rows) time, one row of
    memory, no branches to remember (duplicate entries add up, as in scipy)."""
    assert len(a_indptr) == len(b_indptr)
    with ancilla(work=zeros(ncols)):
        for i in range(len(a_indptr) - 1):
            for q in range(b_indptr[i], b_indptr[i + 1]):
                work[b_indices[q]] += b_data[q]
            for p in range(a_indptr[i], a_indptr[i + 1]):
                out += a_data[p] * work[a_indices[p]]
            for q in range(b_indptr[i], b_indptr[i + 1]):
                work[b_indices[q]] -= b_data[q]
