"""Derived programs (rvm.tangent, rvm.adjoint, rvm.hvp, rvm.hessian) on functions the
register-only adjoint cannot take: heap ancillas (`zeros(n)`), and ancillas restored only
approximately (the dirty ancilla of the NiLang paper), on every engine."""

import pathlib
import re
import sys

import numpy as np
import pytest

import rvm
from rvm import ancilla, compute
from rvm.core.errors import InvertibilityError
from rvm.engines import native

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
ENGINES = ["interp", "python"] + (["native"] if native.available else [])
SLOW_NATIVE = ["interp", "python"] + ([pytest.param("native", marks=pytest.mark.slow)]
                                      if native.available else [])


@rvm.reversible
def squares(out: float, x: float, y: float, n: int):
    """out += sum_i (x^2 + i y)^2, the terms kept in a heap ancilla."""
    with ancilla(buf=zeros(n)):
        with compute() as terms:
            for i in range(n):
                buf[i] += x * x
                buf[i] += y * i
        for i in range(n):
            out += buf[i] * buf[i]
        ~terms


def squares_hessian(x: float, y: float, n: int) -> np.ndarray:
    """By hand: g_i = x^2 + i y; d2/dx2 = sum 8x^2 + 4 g_i, d2/dxdy = sum 4 x i,
    d2/dy2 = sum 2 i^2."""
    i = np.arange(n)
    g = x * x + i * y
    return np.array([[np.sum(8 * x * x + 4 * g), np.sum(4 * x * i)],
                     [np.sum(4 * x * i), np.sum(2.0 * i * i)]])


@pytest.mark.parametrize("engine", ENGINES)
def test_hvp_and_hessian_of_a_function_with_a_heap_ancilla(engine):
    x, y, n = 1.5, -0.75, 4
    want = squares_hessian(x, y, n)
    h = rvm.hvp(squares, (0.0, x, y, n), (0.0, 1.0, 2.0, None), loss="out", engine=engine)
    assert h[0] is not None and h[3] is None
    assert np.allclose(h[1:3], want @ [1.0, 2.0], rtol=1e-12)
    H = rvm.hessian(squares, loss="out", wrt=["x", "y"], engine=engine)(0.0, x, y, n)
    assert np.allclose(H, want, rtol=1e-12)
    # and against central differences of rvm.grad
    g = rvm.grad(squares, loss="out", engine=engine)
    eps = 1e-6
    fd = np.array([(np.array(g(0.0, x + eps * dx, y + eps * dy, n)[1:3]) -
                    np.array(g(0.0, x - eps * dx, y - eps * dy, n)[1:3])) / (2 * eps)
                   for dx, dy in ((1, 0), (0, 1))]).T
    assert np.allclose(H, fd, rtol=1e-6)


DIRTY = [(0, 0.5), (3, 3.7), (2, 2.0), (1, 5.0)]


@pytest.mark.parametrize("engine", SLOW_NATIVE)      # native: 30 s of compiling
def test_a_dirty_ancillas_derivative_residue_is_told_in_the_users_terms(engine):
    """The shadows of an approximately restored ancilla carry the rounding of values far
    larger than its own; past the absolute tol, the failure names the variable, its
    function and the transform, and the tol that accepts the residue (which gives
    J_nu''(z))."""
    from besselj import besselj
    from scipy.special import jvp
    for nu, z in DIRTY:
        with pytest.raises(InvertibilityError) as e:
            rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine=engine)
        text = str(e.value)
        named = re.search(r"`(\w+?)_bar(_dot)?` is the (tangent of the )?shadow of `(\w+)`",
                          text)
        assert named and named.group(1) == named.group(4) and \
            named.group(4) in ("halfz", "dirt", "ratio", "fact_nu", "power"), text
        assert "rvm.hvp" in text and "tol=" in text
        tol = float(re.search(r"tol=([0-9.e-]+)", text).group(1))
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine=engine,
                    tol=tol)[2]
        assert abs(h - jvp(nu, z, 2)) < 1e-5
    with pytest.raises(InvertibilityError, match=r"rvm\.hessian.*tol="):
        rvm.hessian(besselj, loss="out", wrt=["z"], engine=engine)(0.0, 0, 0.5)


def test_hvp_and_hessian_of_besselj_at_random_points():
    """20 random points (fixed seed): the Hessian in z against scipy's J_nu''(z), with tol
    loosened for the dirty ancilla's derivatives. (Past z = 3.4 or so the dirty
    multiplier's first-order tangent itself can overflow: rvm.jvp fails there too.)"""
    from besselj import besselj
    from scipy.special import jvp
    rng = np.random.default_rng(1)
    for _ in range(20):
        nu, z = int(rng.integers(0, 4)), float(rng.uniform(0.2, 3.0))
        want = jvp(nu, z, 2)
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine="python",
                    tol=1e-4)[2]
        H = rvm.hessian(besselj, loss="out", wrt=["z"], engine="python", tol=1e-4)(0.0, nu, z)
        assert abs(h - want) < 1e-6 and abs(H[0, 0] - want) < 1e-6, (nu, z, h, want)
