"""Derived programs (rvm.tangent, rvm.adjoint, rvm.hvp, rvm.hessian) on functions the
register-only adjoint cannot take: heap ancillas (`zeros(n)`), and ancillas restored only
approximately (the dirty ancilla of the NiLang paper), on every engine; and derivatives of
derivatives (rvm.tangent(rvm.adjoint(f)), ...) of functions of arrays."""

import pathlib
import re
import sys

import numpy as np
import pytest

import rvm
from rvm import Array, ancilla, compute
from rvm.ad import transforms
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
def test_a_dirty_ancillas_derivatives_pass_a_zero_test_scaled_to_their_magnitudes(engine):
    """The shadows of an approximately restored ancilla carry the rounding of values far
    larger than its own (past 10^8 inside the dirty multiplier): a derived ancilla's zero
    test accepts tol times the largest magnitude a derivative has held, so rvm.hvp and
    rvm.hessian take the default tol where an absolute test fails (residues of 1e-8 to
    8e-8 in `halfz_bar_dot`, `dirt_bar_dot`), and give J_nu''(z)."""
    from besselj import besselj
    from scipy.special import jvp
    for nu, z in DIRTY:
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine=engine)[2]
        assert abs(h - jvp(nu, z, 2)) < 2e-6, (nu, z, h)
    H = rvm.hessian(besselj, loss="out", wrt=["z"], engine=engine)(0.0, 0, 0.5)
    assert abs(H[0, 0] - jvp(0, 0.5, 2)) < 1e-6


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_a_derived_ancillas_residue_past_its_scaled_test_is_told_in_the_users_terms(engine):
    """Past tol times the magnitudes (tol=1e-16 here), the failure names the variable, its
    function and the transform, and a tol that accepts the residue (which gives
    J_nu''(z)); a zero test at a block's end (ZERO) is told so too."""
    from besselj import besselj
    from scipy.special import jvp
    for nu, z in DIRTY:
        with pytest.raises(InvertibilityError) as e:
            rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine=engine,
                    tol=1e-16)
        text = str(e.value)
        named = re.search(r"`(\w+?)(?:_bar|_dot)+` is the [a-z ]+ of `(\w+)`", text)
        assert named and named.group(1) == named.group(2) and \
            named.group(2) in ("halfz", "dirt", "ratio", "fact_nu", "power"), text
        assert "rvm.hvp" in text and "tol=" in text and "largest magnitude" in text
        tol = float(re.search(r"tol=([0-9.e-]+)", text).group(1))
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine=engine,
                    tol=tol)[2]
        assert abs(h - jvp(nu, z, 2)) < 1e-5
    with pytest.raises(InvertibilityError, match=r"rvm\.hessian.*tol="):
        rvm.hessian(besselj, loss="out", wrt=["z"], engine=engine, tol=1e-16)(0.0, 0, 0.5)


def besselj_points(n: int) -> list:
    """n random (nu, z) (fixed seed). Past z = 3.2 or so the dirty multiplier's first-order
    tangent itself can overflow (rvm.jvp fails there too)."""
    rng = np.random.default_rng(1)
    return [(int(rng.integers(0, 4)), float(rng.uniform(0.2, 3.0))) for _ in range(n)]


@pytest.mark.slow          # (the default engine compiles native code after a warm-up: 5 s)
def test_hvp_and_hessian_of_besselj_at_random_points():
    """20 random points, on the default engine and the default tol: the Hessian in z
    against scipy's J_nu''(z)."""
    from besselj import besselj
    from scipy.special import jvp
    for nu, z in besselj_points(20):
        want = jvp(nu, z, 2)
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out")[2]
        H = rvm.hessian(besselj, loss="out", wrt=["z"])(0.0, nu, z)
        assert abs(h - want) < 1e-6 and abs(H[0, 0] - want) < 1e-6, (nu, z, h, want)


@pytest.mark.slow          # (4 s of compiling)
@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_hvp_of_besselj_on_native_at_random_points():
    """Three of those points on native code (whose test of a derived ancilla is tol alone:
    where it fails, the interpreter runs the pass again and decides)."""
    from besselj import besselj
    from scipy.special import jvp
    for nu, z in besselj_points(20)[:3]:
        h = rvm.hvp(besselj, (0.0, nu, z), (0.0, None, 1.0), loss="out", engine="native")[2]
        assert abs(h - jvp(nu, z, 2)) < 1e-6, (nu, z, h)


# ------------------------------------------------- derivatives of derivatives, on arrays

@rvm.reversible
def sin_squares(out: float, x: Array[float]):
    """out += sum_i sin(x_i) x_i^2."""
    for i in range(len(x)):
        out += sin(x[i]) * x[i] * x[i]


@rvm.reversible
def weighted_cubes(out: float, x: Array[float], w: Array[float]):
    """out += sum_i w_i x_i^3 (a dot product with a weight array)."""
    for i in range(len(x)):
        out += w[i] * x[i] * x[i] * x[i]


@rvm.reversible
def weighted_grid(out: float, x: Array[float, 2], w: Array[float]):
    """out += sum_ij w_j x_ij^2 cos(x_ij): a 2-D array, packed along its last axis."""
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out += w[j] * x[i, j] * x[i, j] * cos(x[i, j])


X = np.array([0.3, -1.2, 2.0])
W = np.array([1.5, -0.5, 2.0])
GRID = np.array([[0.1, -0.7, 1.3], [0.4, 2.2, -0.2]])
ARRAYS = [(sin_squares, (0.0, X)), (weighted_cubes, (0.0, X, W)),
          (weighted_grid, (0.0, GRID, W[:3]))]


def _zeros(args):
    return [np.zeros_like(a) if isinstance(a, np.ndarray) else 0.0 for a in args]


def _basis(a, e):
    v = np.zeros_like(a)
    v.flat[e] = 1.0
    return v


def _fd_hessian(f, args, eps=1e-6):
    """Central differences of rvm.grad (the loss is argument 0), in the arrays' elements."""
    g = rvm.grad(f, loss=0, engine="python")
    flat = lambda gs: np.concatenate([np.ravel(v) for v in gs[1:]])
    cols = []
    for k in range(1, len(args)):
        for e in range(args[k].size):
            hi, lo = list(args), list(args)
            hi[k] = args[k] + eps * _basis(args[k], e)
            lo[k] = args[k] - eps * _basis(args[k], e)
            cols.append((flat(g(*hi)) - flat(g(*lo))) / (2 * eps))
    return np.array(cols).T


@pytest.mark.parametrize("f, args, engine", [(f, a, "interp") for f, a in ARRAYS] +
                         [(sin_squares, (0.0, X), "python")],
                         ids=lambda v: getattr(v, "name", v if isinstance(v, str) else ""))
def test_tangent_of_adjoint_and_adjoint_of_tangent_take_arrays(f, args, engine):
    """rvm.tangent(rvm.adjoint(f)) and rvm.adjoint(rvm.tangent(f)) of functions of arrays:
    their shadows' tangents (and the tangents' shadows) are the Hessian's columns, as
    rvm.hessian and central differences of rvm.grad give them; arrays in, arrays out."""
    H = rvm.hessian(f, loss="out", wrt=range(1, len(args)), engine=engine)(*args)
    assert np.allclose(H, _fd_hessian(f, args), atol=1e-6)
    zero = _zeros(args)
    seed = [1.0] + zero[1:]                           # the shadow of out
    ta = rvm.tangent(rvm.adjoint(f), engine=engine)
    at = rvm.adjoint(rvm.tangent(f), engine=engine)
    n, j = len(args), 0
    for k in range(1, n):
        for e in range(args[k].size):
            v = [0.0] + [_basis(args[k], e) if i == k else z
                         for i, z in enumerate(zero[1:], 1)]
            # (x, xbar, xdot, xbar_dot): the tangent of the adjoint along v
            out = ta(*args, *seed, *v, *zero, engine=engine)
            assert len(out) == 4 * n and out[1].shape == args[1].shape
            col = np.concatenate([np.ravel(a) for a in out[3 * n + 1:]])
            assert np.allclose(col, H[:, j], rtol=1e-12, atol=1e-12)
            # (x, xdot, shadows of both): the adjoint of the tangent, seeded on out's tangent
            out = at(*args, *v, *zero, *seed, engine=engine)
            col = np.concatenate([np.ravel(a) for a in out[2 * n + 1:3 * n]])
            assert np.allclose(col, H[:, j], rtol=1e-12, atol=1e-12)
            j += 1
    # rvm.jvp of the adjoint is the same product (rvm.hvp's forward over reverse)
    v = [0.0] + [np.ones_like(a) for a in args[1:]]
    _, dots = rvm.jvp(rvm.adjoint(f), tuple(args) + tuple(seed), tuple(v) + tuple(zero))
    hv = rvm.hvp(f, args, v, loss="out")
    for k in range(1, n):
        assert np.allclose(dots[n + k], hv[k], rtol=1e-12, atol=1e-12)
    # the tangent of the tangent along v twice: v . H v; and the inverse undoes a call
    tt = rvm.tangent(rvm.tangent(f), engine=engine)
    out = tt(*args, *v, *v, *zero)
    vv = np.concatenate([np.ravel(a) for a in v[1:]])
    assert np.isclose(out[3 * n], vv @ H @ vv, rtol=1e-12)
    out = ta(*args, *seed, *v, *zero)
    back = (~ta)(*out)
    for r, want in zip(back, list(args) + seed + v + zero):
        assert np.allclose(r, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("f, args", ARRAYS, ids=lambda v: getattr(v, "name", ""))
def test_adjoint_of_adjoint_takes_arrays_and_inverts(f, args):
    """rvm.adjoint(rvm.adjoint(f)) of arrays: (x, s, xb, sb) -> (x, s, xb + H_s sb,
    J sb), from tangent programs; its inverse takes the results back."""
    H = rvm.hessian(f, loss="out", wrt=range(1, len(args)), engine="python")(*args)
    zero, n = _zeros(args), len(args)
    seed = [1.0] + zero[1:]
    aa = rvm.adjoint(rvm.adjoint(f), engine="python")
    j = 0
    for k in range(1, n):
        for e in range(args[k].size):
            sb = [0.0] + [_basis(args[k], e) if i == k else z
                          for i, z in enumerate(zero[1:], 1)]
            xb = [0.5] + [np.full_like(z, 0.25) for z in zero[1:]]
            out = aa(*args, *seed, *xb, *sb)
            assert len(out) == 4 * n
            col = np.concatenate([np.ravel(a - 0.25) for a in out[2 * n + 1:3 * n]])
            assert np.allclose(col, H[:, j], rtol=1e-12, atol=1e-12)
            _, jsb = rvm.jvp(f, args, sb)
            for r, want in zip(out[3 * n:], jsb):
                assert np.allclose(r, want, rtol=1e-12, atol=1e-12)
            back = (~aa)(*out)
            for r, want in zip(back[2 * n:], xb + sb):
                assert np.allclose(r, want, rtol=1e-12, atol=1e-12)
            j += 1


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_a_constant_exponents_partial_is_not_a_variable_of_the_derivative_program(engine):
    # the tangent of a ** 2 computed 2 - 1 into a register, so the adjoint of the
    # tangent took pow's partial in that exponent, a^b log a: log(-1.0) is undefined
    @rvm.reversible
    def square(s: float, x: float, y: float):
        s += (x - y) ** 2
    at = rvm.adjoint(rvm.tangent(square))
    out = at(0.0, 1.0, 2.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, engine=engine)
    assert out[6:9] == (1.0, -2.0, 2.0)             # s's shadow, then d s / dx, d s / dy
    out = at(0.0, 1.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, engine=engine)
    assert out[7:9] == (2.0, -2.0)                  # (the Hessian along x' = 1)
    # tanh's partial 1 - tanh^2, whose tangent took the same partial in a constant
    # exponent: the third derivative at x < 0 (a skeptic's finding) is -2 (1 - t^2)
    # (1 - 3 t^2), t = tanh x
    f = rvm.reversible.source("def g(y: Array[float], x: Array[float]):\n"
                              "    y += np.tanh(x)\n", {"Array": Array, "np": np})
    x, z, o = np.array([0.3, -0.7]), np.zeros(2), np.ones(2)
    out = rvm.tangent(rvm.tangent(rvm.adjoint(f)))(z, x, o, z, z, o, z, z, z, o, z, z, z,
                                                    z, z, z, engine=engine)
    t = np.tanh(x)
    assert np.allclose(out[-1], -2 * (1 - t * t) * (1 - 3 * t * t), rtol=1e-13)


def test_derivatives_of_the_adjoint_of_a_heap_ancilla_program():
    """The graph-embedding loss allocates heap ancillas (`zeros(n)`): its adjoint
    program's sweep leaves each block, with the gradient of its initial value in its
    shadows, for the clean-up (refused before); the tangent of the adjoint is then its
    Hessian-vector product, the adjoint of the adjoint (x, s, xb, sb) -> (x, s, xb +
    H_s sb, J sb), and the adjoint of the tangent its transpose, as rvm.hvp, rvm.jvp
    and rvm.grad give them."""
    from graph_embedding import embedding_loss, petersen
    l1, l2 = petersen()
    rng = np.random.default_rng(0)
    x, d = rng.normal(size=(10, 5)), rng.normal(size=(10, 5))
    z = np.zeros_like(x)
    hv = rvm.hvp(embedding_loss, (0.0, x, l1, l2), (0.0, d, None, None), loss=0)[1]
    grad = rvm.grad(embedding_loss, loss=0)(0.0, x, l1, l2)[1]
    (_, *_), (dout, *_) = rvm.jvp(embedding_loss, (0.0, x, l1, l2), (0.0, d, None, None))
    for engine in ("python", "native"):
        ta = rvm.tangent(rvm.adjoint(embedding_loss))(0.0, x, l1, l2, 1.0, z, 0.0, d, 0.0, z,
                                                      engine=engine)
        assert np.allclose(ta[9], hv, rtol=1e-12, atol=1e-12)
        aa = rvm.adjoint(rvm.adjoint(embedding_loss))(0.0, x, l1, l2, 1.0, z, 0.0, z, 0.0, d,
                                                      engine=engine)
        assert np.allclose(aa[7], hv, rtol=1e-12, atol=1e-12)      # xb + H sb
        assert aa[8] == pytest.approx(dout, rel=1e-12) and np.allclose(aa[9], d)  # J sb
        # the adjoint of the tangent program (a program on the interleaved heap: the
        # sweep keeps its blocks at even cells of its own) along x' = d, seeded on out':
        # (x, x', c, c') -> (x, x', J^T c + H_c' x', J^T c')
        at = rvm.adjoint(rvm.tangent(embedding_loss))
        out = at(0.0, x, l1, l2, 0.0, d, 0.0, z, 1.0, z, engine=engine)
        assert np.allclose(out[7], hv, rtol=1e-10, atol=1e-12)
        assert np.allclose(out[9], grad, rtol=1e-10, atol=1e-12)
        back = (~at)(*out, engine=engine)
        assert np.allclose(back[7], 0.0, atol=1e-12) and back[8] == 1.0


def test_derivatives_that_need_the_adjoint_of_an_adjoint_programs_sweep_are_refused():
    # the adjoint of a second-order program: its inner adjoint's sweep keeps the shadows
    # it drops on the stack, which adjoint programs do not take
    t = rvm.adjoint(rvm.tangent(rvm.adjoint(sin_squares)))
    with pytest.raises(transforms.TransformError, match=r"^adjoint\(tangent\(adjoint\("
                       r"sin_squares\)\)\): .*PUSH.*the sweep of an adjoint program"):
        t(*([0.0, X] * 8), engine="python")
    # a derivative of rvm.adjoint(rvm.adjoint(f)) of arrays: not one program, refused
    for t in (rvm.tangent(rvm.adjoint(rvm.adjoint(sin_squares))),
              rvm.adjoint(rvm.adjoint(rvm.adjoint(sin_squares)))):
        with pytest.raises(transforms.TransformError, match=r"^adjoint\(adjoint\(sin_squares"
                           r"\)\) of a function of arrays runs as two tangent programs"):
            t(*([0.0, X] * 8), engine="python")


def test_tangent_and_adjoint_take_machine_options_for_every_call():
    """rvm.tangent(f, max_steps=...) (and rvm.adjoint, and their inverses) run every call
    with those machine options, as rvm.grad does; a call's own options come on top; an
    unknown option is refused when the transform is made."""
    t = rvm.tangent(squares, max_steps=20)
    with pytest.raises(rvm.MachineError, match="step budget of 20 steps"):
        t(0.0, 1.0, 2.0, 50, 0.0, 1.0, 0.0)
    assert t(0.0, 1.0, 2.0, 50, 0.0, 1.0, 0.0, max_steps=10 ** 6)[4] == \
        rvm.tangent(squares)(0.0, 1.0, 2.0, 50, 0.0, 1.0, 0.0)[4]
    with pytest.raises(rvm.MachineError, match="step budget of 20 steps"):
        (~t)(0.0, 1.0, 2.0, 50, 0.0, 1.0, 0.0)
    a = rvm.adjoint(rvm.assemble(".func f(f0, f1, r0)\nl: CF.NE r1, 0, m\n"
                                 "    ADD.mul f1, f0, f0\n    INC r1\n"
                                 "m:  BR.NE r1, r0, l\n    SUB r1, r0\n.end\n")["f"],
                    max_steps=20)
    with pytest.raises(rvm.MachineError, match="step budget of 20 steps"):
        a(1.0, 0.0, 50, 0.0, 1.0)
    assert a(1.0, 0.0, 50, 0.0, 1.0, max_steps=10 ** 6)[3] == 100.0
    with pytest.raises(TypeError, match="max_step"):
        rvm.tangent(squares, max_step=5)


ODD_TOP = '''
import numpy as np
import rvm
from rvm import Array, ancilla, compute, zeros


@rvm.reversible
def g(out: float, a: float, b: float):
    with ancilla(t=zeros(3), c=zeros(3)):
        with compute() as pre:
            c += b
            t += a * c
        out += np.sum(np.exp(t))
        ~pre


A = rvm.adjoint(g)
T = rvm.tangent(g)


@rvm.reversible
def F(s: float, w: Array[float], a: float, b: float, out: float, gout: float, ga: float,
      gb: float):
    with ancilla(u=zeros(len(w)), q=zeros(len(w))):
        with compute() as pre:
            q += b
            u += w * q
        A(out, a, b, gout, ga, gb)
        s += ga
        s += np.sum(u * u)
        ~A(out, a, b, gout, ga, gb)
        T(out, a, b, gout, ga, gb)
        s += gout
        ~T(out, a, b, gout, ga, gb)
        ~pre
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_a_derivative_program_called_with_an_odd_heap_top(engine, tmp_path):
    """The caller's blocks take an odd number of cells (w, u, q of 3): the derivative
    programs, whose interleaved heap takes cells two by two, run above a cell of padding
    (they failed with `r5 = 1, must be 0 before ALLOC`)."""
    (tmp_path / "odd.py").write_text(ODD_TOP)
    F = rvm.load(tmp_path / "odd.py")["F"]
    a, b = 0.3, 0.2
    for n in (2, 3, 4):
        w = np.full(n, 0.1)
        s = F(0.0, w, a, b, 0.0, 1.0, 0.0, 0.0, engine=engine)[0]
        dg_da = 3 * np.exp(a * b) * b       # the adjoint's ga = d out / d a, gout = 1;
        # the tangent's gout: 1 + d out / d a * 0 + d out / d b * 0
        assert s == pytest.approx(dg_da + n * (0.1 * b) ** 2 + 1.0, rel=1e-12)


def test_derivatives_convert_whole_numbers_for_floats_as_a_call_does():
    """An integer array (or a list of ints) for an Array[float] argument is a float
    array, as in a plain call: its tangent or shadow follows it (the derivative had
    counted it as an integer argument, with no tangent: every count was refused). A
    scalar's tangent that is not a number is a usage error."""
    f = rvm.reversible.source("def f(out: float, x: Array[float]):\n"
                              "    out += x[0] * x[1]\n", {"Array": rvm.Array})
    want = rvm.tangent(f)(0.0, np.array([3.0, 5.0]), 0.0, np.array([1.0, 0.0]))
    for x, t in ((np.array([3, 5]), np.array([1, 0])), ([3, 5], [1, 0])):
        got = rvm.tangent(f)(0.0, x, 0.0, t)
        assert got[0] == want[0] == 15.0 and got[2] == want[2] == 5.0
        assert got[1].dtype == np.float64 and np.array_equal(got[3], want[3])
    assert np.array_equal(rvm.adjoint(f)(15.0, [3, 5], 1.0, [0, 0])[3], [5.0, 3.0])
    with pytest.raises(rvm.UsageError, match="must be a real number"):
        rvm.tangent(f)(0.0, [3.0, 5.0], [0.0], [1.0, 0.0])
    # a scalar program too: a complex tangent of a float is refused, a 0-d array is its
    # number (it named the program's registers: `argument 3 of f.tan is complex`)
    sq = rvm.reversible.source("def sq(out: float, x: float):\n    out += x * x\n")
    assert rvm.tangent(sq)(0.0, 3.0, 0.0, np.array(1.0)) == (9.0, 3.0, 6.0, 1.0)
    with pytest.raises(rvm.UsageError, match="of argument 1 must be a real number"):
        rvm.tangent(sq)(0.0, 3.0, 0.0, 1j)
    ab = rvm.reversible.source("def ab(out: float, z: complex):\n    out += abs(z)\n")
    assert rvm.tangent(ab)(0.0, 3 + 4j, 0.0, 1 + 0j)[2] == pytest.approx(0.6)


def test_a_derived_ancillas_residue_is_judged_alike_when_native_code_fails_it():
    """t_dot sums 0.3 three times and 1e150, then takes them back in the other order:
    -0.9 is left, within tol times the largest magnitude the derivatives held (1e150),
    which the interpreter accepts. Native code tests derived ancillas against tol alone
    and hands a failure to the interpreter, which stepped on from a place midway (its
    look), not knowing that magnitude, and refused the call: rvm.jvp raised on native
    code and from the default engine's fourth call. A derived program's failure is now
    decided by the interpreter's whole pass."""
    g = rvm.reversible.source(
        "def g(x: float, out: float, a: rvm.Array[float]):\n"
        "    with ancilla(t=0.0):\n        with compute() as c:\n"
        "            for i in range(len(a)):\n                t += a[i] * x\n"
        "        out += t\n        ~c\n",
        {"rvm": rvm, "ancilla": rvm.ancilla, "compute": rvm.compute})
    a = np.array([0.3, 0.3, 0.3, 1e150])
    engines = ["interp", "python", None, None, None, None, None] + \
        (["native"] if native.available else [])
    for e in engines:
        values, tangents = rvm.jvp(g, (1e-160, 0.0, a), (1.0, 0.0, np.zeros(4)), engine=e)
        assert tangents[1] == 1e150 and values[1] == pytest.approx(1e-10), e
