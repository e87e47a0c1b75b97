"""exp(x) by its Taylor series in constant memory (after iexp in Liu & Zhao,
*Instruction level automatic differentiation on a reversible Turing machine*).

The term s_n = s_{n-1} * x / n is updated in place with the reversible pair *= and /=
(so s_{n-1} is uncomputed arithmetically instead of being stored), and the series is
uncomputed after its sum is copied out. Needs x != 0.
"""

import rvm
from rvm import ancilla, compute


@rvm.reversible
def iexp(out: float, x: float):
    with ancilla(s=0.0, total=0.0, n=0):
        with compute() as series:
            s += 1.0
            while (abs(s) > 1e-17, n != 0):
                n += 1
                s *= x
                s /= n
                total += s
        out += 1.0
        out += total
        ~series
