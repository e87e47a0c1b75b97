"""Sorting by Batcher's odd-even merge sort network.

Sorting forgets the order the values came in, so it is not reversible in place; these
functions sort out of place: `sort(out, x)` adds sorted(x) to `out` and `argsort(perm,
x)` adds the sorting permutation to `perm`, leaving x as it was. Inside, x is copied into
an ancilla with its indices, the network runs on the copy, each comparator recording in
an ancilla bit whether it swapped, the result is copied out and the network is run
backwards (Bennett's compute-copy-uncompute), so no garbage stays behind.

The network is Batcher's odd-even merge sort for any n (19 comparators for 8 values,
63 for 16; O(n log^2 n)), computed from n by the loops below: one comparator's decision
does not depend on the others' positions, so the stages run in a fixed order. Ties are
broken by index, so argsort is stable (numpy's kind="stable").
"""

from __future__ import annotations

from ..lang import Array, ancilla, compute, reversible, zeros


@reversible
def levels(pw: Array[int], depth: int, n: int):
    """pw[t] += 2**t (t < 63); depth += the number of merge levels, ceil(log2(n))."""
    pw[0] += 1
    for t in range(1, len(pw)):
        pw[t] += 2 * pw[t - 1]
    for t in range(len(pw)):
        depth += pw[t] < n


@reversible
def network(w: Array[float], idx: Array[int], bits: Array[int, 2], pw: Array[int],
            depth: int):
    """Batcher's odd-even merge sort of (w, idx) pairs, in place; comparator (a, b) of
    stage s records in bits[s, a] whether it swapped (bits must start zero)."""
    for lp in range(depth):                    # merging runs of p = 2**lp
        for lk in range(lp, -1, -1):           # comparators k = p, p/2, ..., 1 apart
            with ancilla(p=pw[lp], k=pw[lk], s=lp * (lp + 1) // 2 + lp - lk):
                for jj in range((len(w) - k - k % p + 2 * k - 1) // (2 * k)):
                    with ancilla(j=k % p + 2 * k * jj):
                        for i in range(k):
                            if i + j + k < len(w) and (i + j) // (2 * p) == \
                                    (i + j + k) // (2 * p):
                                compare(w, idx, bits, s, i + j, i + j + k)


@reversible
def compare(w: Array[float], idx: Array[int], bits: Array[int, 2], s: int, a: int,
            b: int):
    """Put the pair at a < b in order (by value, then index), recording a swap."""
    bits[s, a] ^= w[a] > w[b] or (w[a] == w[b] and idx[a] > idx[b])
    if bits[s, a] == 1:
        w[a], w[b] = w[b], w[a]
        idx[a], idx[b] = idx[b], idx[a]


@reversible
def sort(out: Array[float], x: Array[float]):
    """out += sorted(x), x unchanged."""
    assert len(out) == len(x)
    with ancilla(pw=zeros(63, int), depth=0):
        with compute() as r:
            levels(pw, depth, len(x))
        with ancilla(w=zeros(len(x)), idx=zeros(len(x), int),
                     bits=zeros((depth * (depth + 1) // 2 + 1, len(x)), int)):
            with compute() as q:
                for i in range(len(x)):
                    w[i] += x[i]
                    idx[i] += i
                network(w, idx, bits, pw, depth)
            for i in range(len(x)):
                out[i] += w[i]
            ~q
        ~r


@reversible
def argsort(perm: Array[int], x: Array[float]):
    """perm += the stable sorting permutation of x (numpy.argsort(x, kind="stable")),
    x unchanged."""
    assert len(perm) == len(x)
    with ancilla(pw=zeros(63, int), depth=0):
        with compute() as r:
            levels(pw, depth, len(x))
        with ancilla(w=zeros(len(x)), idx=zeros(len(x), int),
                     bits=zeros((depth * (depth + 1) // 2 + 1, len(x)), int)):
            with compute() as q:
                for i in range(len(x)):
                    w[i] += x[i]
                    idx[i] += i
                network(w, idx, bits, pw, depth)
            for i in range(len(x)):
                perm[i] += idx[i]
            ~q
        ~r
