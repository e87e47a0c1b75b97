"""Bennett's time-space trade-off for reverse computing (after the NiLang
paper, Liu & Zhao).

A program of N = k^n unit steps (here: state[i + 1] += 2 * state[i]) is split into k
sectors, run forwards (P), and every intermediate state but the last of each sector is
uncomputed by running the sector backwards (Q), recursively. Only the final state
survives; the peak number of live states is n (k - 1) + 2 and the number of unit steps
executed is (2k - 1)^n (tests/test_examples.py measures both by stepping the machine).
"""

import rvm
from rvm import Array, ancilla


@rvm.reversible
def bennett(state: Array[float], k: int, base: int, length: int):
    if length == 1:
        state[base + 1] += 2.0 * state[base]
    else:
        with ancilla(n=length // k):
            for j in range(1, k + 1):
                bennett(state, k, base + n * (j - 1), n)
            for j in range(k - 1, 0, -1):
                ~bennett(state, k, base + n * (j - 1), n)
