"""The Bessel function of the first kind J_nu(z), after NiLang's ibesselj
(Liu & Zhao).

J_nu(z) = sum_k (-1)^k (z/2)^(2k+nu) / (k! (k+nu)!). Each term comes from the previous
one through an approximate reversible multiplier (imul: the result goes into a dirty
ancilla, the old value is uncomputed approximately by division, then the two are swapped),
so the data-dependent while loop runs in constant memory. Everything the series computes
is uncomputed after its sum is copied out (compute-copy-uncompute).

The loop stops when a term falls below ATOL = 1e-8, as in the paper. A much smaller ATOL
does not help this version: the multiplier leaves a residue in its dirty ancilla that the
next step divides by the (shrinking) ratio, so late terms would carry growing rounding
noise. `besselj_inplace` uses the machine's exact-inverse pair (term *= ratio, i.e. MUL)
instead and can run to full precision.
"""

import rvm
from rvm import ancilla, compute

ATOL = 1e-8


@rvm.reversible
def imul(out: float, x: float, anc: float):
    """out *= x approximately: anc (about 0 on entry) takes the product, out is
    uncomputed by division, then the two swap. Needs x != 0."""
    anc += out * x
    out -= anc / x
    out, anc = anc, out


@rvm.reversible
def first_term(term: float, halfz_2: float, nu: int, z: float):
    """term += (z/2)^nu / nu!; halfz_2 += (z/2)^2. The power is an integer one, nu
    multiplications in place (as `halfz ^ nu` with an integer nu is in Julia), cheaper than
    the float `**`."""
    with ancilla(fact_nu=1.0, power=1.0, halfz=0.0):
        with compute() as setup:
            halfz += z / 2
            for i in range(1, nu + 1):
                fact_nu *= i
                power *= halfz
        term += power / fact_nu
        halfz_2 += halfz * halfz
        ~setup


@rvm.reversible
def besselj(out: float, nu: int, z: float):
    """out += J_nu(z), for z != 0."""
    with ancilla(k=0, halfz_2=0.0, term=0.0, sum_=0.0, d=0.0, ratio=0.0, dirt=0.0):
        with compute() as series:
            first_term(term, halfz_2, nu, z)
            sum_ += term
            while (abs(term) > ATOL, k != 0):
                k += 1
                with compute() as step:
                    d -= k * (k + nu)
                    ratio += halfz_2 / d
                imul(term, ratio, dirt)
                sum_ += term
                ~step
        out += sum_
        ~series


@rvm.reversible
def besselj_inplace(out: float, nu: int, z: float):
    """out += J_nu(z), for z != 0, with in-place multiplication (MUL/DIV) for the terms:
    each term is the previous one times the ratio -(z/2)^2 / (k (k + nu)), worked out
    beside it, so a term waits for one multiplication, not for a division."""
    with ancilla(k=0, halfz_2=0.0, term=0.0, sum_=0.0, d=0.0, ratio=0.0):
        with compute() as series:
            first_term(term, halfz_2, nu, z)
            sum_ += term
            while (abs(term) > 1e-17, k != 0):
                k += 1
                with compute() as step:
                    d -= k * (k + nu)
                    ratio += halfz_2 / d
                term *= ratio
                ~step
                sum_ += term
        out += sum_
        ~series
