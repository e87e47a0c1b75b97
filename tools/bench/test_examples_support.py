"""A random CSC matrix (the one tests/test_examples.py builds), for the sparse benchmark."""

import numpy as np


def random_csc(rng, m, n, density):
    dense = (rng.random((m, n)) < density) * rng.normal(size=(m, n))
    ptr, rows, vals = [0], [], []
    for j in range(n):
        r = np.nonzero(dense[:, j])[0]
        rows += list(r)
        vals += list(dense[r, j])
        ptr.append(len(rows))
    return dense, np.array(ptr, np.int64), np.array(rows, np.int64), np.array(vals)
