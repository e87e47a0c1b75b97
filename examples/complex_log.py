"""The complex logarithm y += log(x) on (re, im) pairs (after the NiLang paper's
example, Liu & Zhao):
log x = log |x| + i arg x. The modulus goes into an ancilla that is computed, used and
uncomputed (compute-copy-uncompute).
"""

import rvm
from rvm import ancilla, compute


@rvm.reversible
def complex_log(y_re: float, y_im: float, x_re: float, x_im: float):
    with ancilla(n=0.0):
        with compute() as modulus:
            n += sqrt(x_re * x_re + x_im * x_im)
        y_re += log(n)
        y_im += atan2(x_im, x_re)
        ~modulus
