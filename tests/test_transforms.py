"""Derivatives as programs: every float instruction's tangent and adjoint against finite
differences, on every engine; the transformed programs run backwards; the seed papers'
second-order reference results; inverse and derivative commute."""

import math
import pathlib
import sys

import numpy as np
import pytest

import rvm
from rvm.core import isa
from rvm.engines import native

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
ENGINES = ["interp", "python"] + (["native"] if native.available else [])
H = 1e-6

# one program per float instruction form: (body, arguments), all parameters float
UNARY = {"exp": 0.3, "log": 1.7, "sin": 0.4, "cos": 0.4, "tanh": 0.6, "sqrt": 2.3,
         "abs": -0.8, "sign": 0.5, "trunc": 2.5}
BINARY = {"mul": (1.3, -0.7), "div": (1.3, -0.7), "mod": (5.3, 1.7), "pow": (1.3, 2.2),
          "atan2": (0.6, -1.1), "max": (1.3, -0.7), "min": (1.3, -0.7), "gt": (1.3, -0.7),
          "plus": (1.3, -0.7)}
FORMS = [("ADD f0, f1", (0.5, 1.5)), ("SUB f0, f1", (0.5, 1.5)), ("NEG f0", (0.7,)),
         ("SWAP f0, f1", (0.5, 1.5)), ("ROT f0, f1, f2", (0.3, -1.2, 0.7)),
         ("IROT f0, f1, f2", (0.3, -1.2, 0.7)), ("MUL f0, f1", (1.3, -2.5)),
         ("DIV f0, f1", (1.3, -2.5)), ("ADD f0, 2.5", (0.5,)), ("ADD.mul f0, f1, 3.0", (0.5, 1.5))]
FORMS += [(f"{s}.{fam} f0, f1", (0.25, x)) for fam, x in UNARY.items() for s in ("ADD", "SUB")]
FORMS += [(f"{s}.{fam} f0, f1, f2", (0.25, *xy)) for fam, xy in BINARY.items()
          for s in ("ADD", "SUB")]


def program(body: str, n: int) -> rvm.Program:
    params = ", ".join(f"f{k}" for k in range(n))
    return rvm.assemble(f".func t({params})\n    {body}\n.end\n", "t.rasm")


def fd_jacobian(fn, args) -> np.ndarray:
    """Central differences of all final values with respect to all arguments."""
    cols = []
    for k in range(len(args)):
        up, down = list(args), list(args)
        up[k] += H
        down[k] -= H
        cols.append((np.array(fn(*up)) - np.array(fn(*down))) / (2 * H))
    return np.array(cols).T


def test_every_float_instruction_has_a_form_here():
    covered = {body.split()[0] for body, _ in FORMS}
    floats = {s.name for s in isa.TABLE if s.forward.get(isa.FLOAT) and s.name != "NOP"
              and s.group in ("arith", "family") and s.name != "ZERO"}
    assert floats <= covered, floats - covered


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body,args", FORMS, ids=[b for b, _ in FORMS])
def test_tangent_and_adjoint_of_each_instruction_match_finite_differences(engine, body, args):
    p = program(body, len(args))
    t = p["t"]
    jac = fd_jacobian(lambda *a: p.call("t", *a, engine="interp"), args)
    n = len(args)
    for k in range(n):                                    # forward mode: one column each
        dots = [0.0] * n
        dots[k] = 1.0
        values, out = rvm.jvp(t, args, dots, engine=engine)
        assert np.allclose(values, p.call("t", *args)), body
        assert np.allclose(out, jac[:, k], atol=1e-6), (body, k)
    ybar = tuple(np.linspace(0.5, 1.5, n))
    a = rvm.adjoint(t)
    out = a(*args, *ybar, engine=engine)
    assert np.allclose(out[:n], args)                     # values come back
    assert np.allclose(out[n:], jac.T @ np.array(ybar), atol=1e-6), body
    # both derivative programs run backwards to their inputs
    assert np.allclose((~a)(*out, engine=engine), (*args, *ybar))
    tan = rvm.tangent(t)
    forward = tan(*args, *ybar, engine=engine)
    assert np.allclose((~tan)(*forward, engine=engine), (*args, *ybar))


def test_the_hessian_vector_product_of_the_pearlmutter_siskind_example_four_ways():
    from hvp import f, hvp_by_adjoint_of_adjoint, hvp_by_reverse_over_reverse
    assert rvm.hvp(f, (0.0, 3.0, 4.0), (0.0, 7.0, 8.0), loss="out")[1:] == (52.0, 85.0)
    af = rvm.adjoint(f)
    _, dots = rvm.jvp(af, (0.0, 3.0, 4.0, 1.0, 0.0, 0.0), (0.0, 7.0, 8.0, 0.0, 0.0, 0.0))
    assert dots[4:] == (52.0, 85.0)
    assert hvp_by_reverse_over_reverse(3.0, 4.0, 7.0, 8.0) == (52.0, 85.0)
    assert hvp_by_adjoint_of_adjoint(3.0, 4.0, 7.0, 8.0) == (52.0, 85.0)
    assert np.array_equal(rvm.hessian(f, loss="out", wrt=["x", "y"])(0.0, 3.0, 4.0),
                          [[4.0, 3.0], [3.0, 8.0]])


@pytest.mark.parametrize("engine", ENGINES)
def test_adjoint_as_a_function(engine):
    from hvp import f
    af = rvm.adjoint(f, engine=engine)
    assert af(0.0, 3.0, 4.0, 1.0, 0.0, 0.0) == (0.0, 3.0, 4.0, 1.0, 24.0, 41.0)
    assert (~af)(0.0, 3.0, 4.0, 1.0, 24.0, 41.0) == (0.0, 3.0, 4.0, 1.0, 0.0, 0.0)


def test_second_derivative_of_the_bessel_function():
    from besselj import besselj
    h = rvm.hvp(besselj, (0.0, 2, 1.0), (0.0, None, 1.0), loss="out")
    assert h[1] is None
    assert abs(h[2] - 0.13446683844358093) < 1e-8       # NiLang paper's value


def test_second_derivative_of_iexp_is_exp():
    from iexp import iexp
    assert abs(rvm.hvp(iexp, (0.0, 1.6), (0.0, 1.0), loss="out")[1] - math.exp(1.6)) < 1e-12


def test_the_jacobian_column_by_column_in_forward_mode():
    p = rvm.load(ROOT / "asm" / "poly.rasm")
    cols = [rvm.jvp(p["f"], (0.0, 1.0, 3.0), (0.0, *e))[1][0] for e in ((1.0, 0.0),
                                                                       (0.0, 1.0))]
    assert cols == [660.0, 528.0]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("path,name,args", [
    ("besselj.rasm", "besselj", (0.0, 2, 1.0)), ("iexp.rasm", "iexp", (0.0, 1.6)),
    ("givens.rasm", "givens", (1.0, 2.0, -0.5, 3.0)), ("poly.rasm", "f", (0.0, 1.0, 3.0))])
def test_transforms_of_the_asm_samples_match_finite_differences(engine, path, name, args):
    p = rvm.load(ROOT / "asm" / path)
    fn = p[name]
    floats = [k for k, a in enumerate(args) if isinstance(a, float)]

    def F(*x):
        full = list(args)
        for k, v in zip(floats, x):
            full[k] = v
        return [p.call(name, *full, engine="interp")[k] for k in floats]
    jac = fd_jacobian(F, [args[k] for k in floats])
    for j, k in enumerate(floats):
        dots = [None if not isinstance(a, float) else 0.0 for a in args]
        dots[k] = 1.0
        _, out = rvm.jvp(fn, args, dots, engine=engine)
        assert np.allclose([out[i] for i in floats], jac[:, j], rtol=1e-5, atol=1e-6)
    ybar = [0.5 + k for k in range(len(floats))]
    out = rvm.adjoint(fn)(*args, *ybar, engine=engine)
    assert np.allclose(out[:len(args)], args)
    assert np.allclose(out[len(args):], jac.T @ np.array(ybar), rtol=1e-5, atol=1e-6)


def test_inverse_and_derivative_commute():
    p = rvm.assemble(".func h(f0, f1)\n ADD.exp f0, f1\n.end\n", "h.rasm")
    h = p["h"]
    e = math.exp(0.5)
    values, grads = rvm.value_and_grad(~h, loss=0)(5.0, 0.5)
    assert values == (5.0 - e, 0.5) and grads == (1.0, -e)
    assert rvm.grad(~h, loss=0)(5.0, 0.5) == (1.0, -e)
    assert np.allclose(rvm.jacobian(~h, outputs=[0], wrt=[0, 1])(5.0, 0.5), [[1.0, -e]])
    assert rvm.jvp(~h, (5.0, 0.5), (0.0, 1.0))[1] == (-e, 1.0)


INACTIVE = """
.func scale(f0, f1, r0)         ; out += x / d, d = 1e-160 + r0 (from constants and ints)
        ADD     f2, 1e-160
        ADD     f2, r0
        ADD.div f0, f1, f2
        SUB     f2, r0
        SUB     f2, 1e-160
.end
.func mixed(f0, f1, f2)         ; a register varied only through a swap, and a call
        ADD     f3, 2.0
        SWAP    f3, f1
        ADD.mul f0, f1, f3
        SWAP    f3, f1
        SUB     f3, 2.0
        CALL    scale, f0, f2, r0
.end
"""


def test_only_varied_registers_carry_tangent_rules():
    """Activity analysis: a register computed from constants and integers only has a
    zero tangent, so the tangent program leaves out its terms; anything a varied register
    reaches (arithmetic, swaps, calls) keeps them."""
    from rvm.ad.transforms import _varied, tangent
    from rvm.core.program import Reg
    p = rvm.assemble(INACTIVE, "inactive.rasm")
    f = lambda k: Reg(isa.FLOAT, k)
    assert _varied(p.functions["scale"]) == {f(0), f(1)}
    assert _varied(p.functions["mixed"]) == {f(0), f(1), f(2), f(3)}
    program, entry = tangent(p, "scale")
    text = "\n".join(str(i) for i in program.functions[entry].code)
    assert "f2" in text and "f5" not in text    # d's tangent register: never touched


@pytest.mark.parametrize("engine", ENGINES)
def test_an_inactive_register_with_an_infinite_partial_leaves_the_tangent_finite(engine):
    """d/dd (x / d) = -x / d^2 overflows for x = 1e100, d = 1e-160, but d's tangent is
    zero: the tangent is x'/d (0 * inf would have made it nan), as the gradient says."""
    p = rvm.assemble(INACTIVE, "inactive.rasm")
    values, dots = rvm.jvp(p["scale"], (0.0, 1e100, 0), (0.0, 1e-200, None), engine=engine)
    assert values[0] == pytest.approx(1e260) and dots[0] == pytest.approx(1e-40)
    grads = rvm.grad(p["scale"], loss=0, engine=engine)(0.0, 1e100, 0)
    assert grads[1] == pytest.approx(1e160)
    assert rvm.jvp(p["mixed"], (0.0, 3.0, 1e100), (0.0, 1.0, 1e-200),
                   engine=engine)[1][0] == pytest.approx(2.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dot", ["dot", "dotx"])
def test_adjoints_of_array_programs(engine, dot):
    """Shadows of array arguments live beside their cells (an interleaved heap): the
    adjoint of a dot product (reading in place, or by exchange) and of Givens rotations
    against gradient mode, uncalled."""
    p = rvm.load(ROOT / "asm" / "arrays.rasm")
    x, y = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, -6.0])
    ad = rvm.adjoint(p[dot], engine=engine)
    out = ad(x, y, 0.5, np.zeros(3), np.zeros(3), 2.0)
    for got, want in zip(out, (x, y, 0.5, 2 * y, 2 * x, 2.0)):
        np.testing.assert_array_equal(got, want)
    for got, want in zip((~ad)(*out), (x, y, 0.5, np.zeros(3), np.zeros(3), 2.0)):
        np.testing.assert_array_equal(got, want)
    from unitary import givens
    v, th, vbar = np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.2, 0.3]), np.array([0.5, -1, 2])
    out = rvm.adjoint(givens, engine=engine)(v, th, vbar, np.zeros(3))
    np.testing.assert_allclose(out[0], v, atol=1e-15)
    # J^T vbar = the gradient of vbar . givens(v, th), by gradient mode
    jt = [np.sum([vbar[k] * g for k, g in enumerate(
        rvm.grad(givens, loss=(0, k))(v, th)[j] for k in range(3))], axis=0)
        for j in range(2)]
    np.testing.assert_allclose(out[2], jt[0], atol=1e-13)
    np.testing.assert_allclose(out[3], jt[1], atol=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_adjoint_of_a_program_that_allocates_is_its_gradient(engine):
    # (sparse_dot's ancilla arrays: the sweep reaches each block's allocation with the
    # gradient of its initial value in its shadows, and leaves the block for the
    # clean-up, as it pushes the shadows of float locals; refused before)
    from sparse_dot import random_csc, sparse_dot
    _, ap, ar, av = random_csc(np.random.default_rng(0), 4, 4, 0.5)
    _, bp, br, bv = random_csc(np.random.default_rng(1), 4, 4, 0.5)
    args = (0.0, ap, ar, av, bp, br, bv, 4)
    a = rvm.adjoint(sparse_dot)
    out = a(*args, 2.0, np.zeros(len(av)), np.zeros(len(bv)), engine=engine)
    g = rvm.grad(sparse_dot, loss=0, engine=engine)(*args)
    assert np.allclose(out[9], 2.0 * g[3], rtol=1e-14) and \
        np.allclose(out[10], 2.0 * g[6], rtol=1e-14) and out[8] == 2.0
    back = (~a)(*out, engine=engine)
    assert np.allclose(back[9], 0.0, rtol=0, atol=1e-14) and back[0] == 0.0  # (rounding)


def test_derivatives_of_derivatives_of_arrays_in_gradient_mode_are_refused():
    p = rvm.load(ROOT / "asm" / "arrays.rasm")
    x = np.ones(3)
    # (rvm.tangent(rvm.adjoint(f)) and rvm.jvp of an adjoint take arrays:
    # tests/test_derived.py; gradient mode of a derivative does not)
    for f in (rvm.grad(rvm.tangent(p["dot"]), loss=5),
              rvm.jacobian(rvm.adjoint(p["dot"]), outputs=[2], wrt=[0])):
        with pytest.raises(rvm.UsageError, match="not differentiated again"):
            f(x, x, 0.5, x, x, 1.0)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dot", ["dot", "dotx"])
def test_tangents_hvps_and_hessians_of_array_programs(engine, dot):
    p = rvm.load(ROOT / "asm" / "arrays.rasm")
    x, y = np.array([1.0, 2.0, 3.0]), np.array([4.0, 5.0, -6.0])
    values, dots = rvm.jvp(p[dot], (x, y, 0.5), (np.array([1.0, 0.0, 2.0]),
                                                  np.array([0.0, 1.0, 0.0]), 1.0),
                           engine=engine)
    assert np.array_equal(values[0], x) and values[2] == 0.5 + x @ y
    assert dots[2] == 1.0 + 4.0 + 2.0 * -6.0 + 2.0 and np.array_equal(dots[0], [1, 0, 2])
    t = rvm.tangent(p[dot])
    out = t(x, y, 0.0, np.ones(3), np.zeros(3), 0.0, engine=engine)
    back = (~t)(*out, engine=engine)                 # the tangent program runs backwards
    assert np.array_equal(back[0], x) and back[2] == 0.0 and np.all(back[3] == 1.0)
    h = rvm.hvp(p["sumsq"], (x, 0.0), (np.array([1.0, -1.0, 0.5]), 0.0), loss=1,
                engine=engine)
    assert np.array_equal(h[0], [2.0, -2.0, 1.0])
    H = rvm.hessian(p[dot], loss=2, wrt=[0, 1], engine=engine)(x, y, 0.0)
    assert np.array_equal(H, np.block([[np.zeros((3, 3)), np.eye(3)],
                                       [np.eye(3), np.zeros((3, 3))]]))


@pytest.mark.parametrize("engine", ENGINES)
def test_min_max_saddle_points_by_gradients_inside_gradients(engine):
    from minmax import coupled, outer1, saddle_bowl, saddle_coupled
    (s, t), (u, v) = saddle_bowl(engine=engine)
    assert max(abs(s), abs(t), abs(u), abs(v)) < 1e-10
    x, y = saddle_coupled(engine=engine)
    assert abs(x + 1 / 6.5) < 1e-12 and abs(y + 1.5 / 6.5) < 1e-12
    # the outer gradient goes through the inner step: dL/dx = 6.5 x + 1, by hand
    g = rvm.grad(outer1, loss="L", engine=engine)(coupled, rvm.adjoint(coupled), 0.0, 2.0,
                                                   0.0, 0.5)
    assert g[:2] == (None, None) and g[3] == 14.0


def test_a_function_argument_compiles_one_copy_per_function():
    from minmax import ascend1, coupled
    a, b = rvm.adjoint(coupled), rvm.tangent(coupled)
    assert ascend1(a, 0.0, 2.0, 0.0, 0.5) == (a, 3.0, 2.0, 0.0, 0.5)
    program, _, names = ascend1.specialize((a, 0.0, 2.0, 0.0, 0.5))
    assert names == ["y1", "x", "y0", "eta"]
    other, _, _ = ascend1.specialize((rvm.adjoint(coupled), 0.0, 2.0, 0.0, 0.5))
    assert other is not program                      # another function, another copy
    # the tangent takes six arguments too: the same code computes a directional derivative
    assert ascend1(b, 0.0, 2.0, 0.0, 0.5) == (b, 0.0, 2.0, 0.0, 0.5)
    with pytest.raises(rvm.CompileError, match="takes 3 arguments"):
        ascend1(coupled, 0.0, 2.0, 0.0, 0.5)


# the training on the native engine (7 s, most of it compiling; each of its 24 Hessians
# of 50 tangents takes 1 s on the python engine): the python engine's with RVM_SLOW=1
TRAIN_ENGINES = ["native", pytest.param("python", marks=pytest.mark.slow)] \
    if native.available else ["python"]


@pytest.mark.parametrize("engine", TRAIN_ENGINES)
def test_graph_embedding_by_trust_region_newton_on_hessians(engine):
    """The Petersen graph in R^5: loss below 1e-10 in about twenty exact Hessians, with
    non-edges sqrt(2) times as long as edges (the NiLang paper's result)."""
    from graph_embedding import embedding_loss, petersen, ratio, train
    x, losses, hessians = train(k=5, engine=engine)
    assert losses[-1] < 1e-10 and hessians <= 30
    assert abs(ratio(x) - math.sqrt(2)) < 1e-8
    # the Hessian is exact: a column against finite differences of the gradient
    l1, l2 = petersen()
    x0 = np.random.default_rng(3).normal(size=(10, 2))
    H = rvm.hessian(embedding_loss, loss="out", wrt=["x"], engine="python")(0.0, x0, l1, l2)
    g = rvm.grad(embedding_loss, loss="out", engine="python")
    e = np.zeros_like(x0)
    e[4, 1] = 1e-6
    fd = (g(0.0, x0 + e, l1, l2)[1] - g(0.0, x0 - e, l1, l2)[1]).ravel() / 2e-6
    assert np.allclose(H[:, 9], fd, atol=1e-6) and np.allclose(H, H.T, atol=1e-12)


def test_derivative_programs_speak_in_the_sources_names():
    from hvp import f
    tangent_text = rvm.debug(rvm.tangent(f), 0.0, 3.0, 4.0, 0.0, 1.0, 0.0,
                             commands=["c", "info registers"])
    assert "out_dot    24.0" in tangent_text and "x_dot      1.0" in tangent_text
    adjoint_text = rvm.debug(rvm.adjoint(f), 0.0, 3.0, 4.0, 1.0, 0.0, 0.0,
                             commands=["c", "info registers"])
    assert "x_bar      24.0" in adjoint_text and "y_bar      41.0" in adjoint_text


def test_hvp_repeated_calls_take_the_planned_path_and_stay_exact():
    """Later calls with the same argument types reuse the first call's machine (straight
    into compiled code): the values must still follow the arguments."""
    from hvp import f  # 2x^2 + 3xy + 4y^2: H = [[4, 3], [3, 8]]
    for engine in ENGINES:
        for x, y, v in [(3.0, 4.0, (7.0, 8.0)), (1.0, -2.0, (1.0, 0.0)), (0.5, 0.5, (0.0, 2.0))]:
            got = rvm.hvp(f, (0.0, x, y), (0.0, *v), loss="out", engine=engine)
            assert got == (0.0, 4 * v[0] + 3 * v[1], 3 * v[0] + 8 * v[1]), (engine, got)


def test_hvp_of_an_array_program_repeated_follows_its_arguments():
    """From the second call with the same kinds of arguments an array program's HVP is
    the planned gradient of its tangent program: new values, lengths and tangents give new
    products, and bad tangents are still refused."""
    from rvm.ad.derivatives import _HVP_PLANS
    p = rvm.load(ROOT / "asm" / "arrays.rasm")
    for engine in ENGINES:
        for x, v in [(np.array([1.0, 2.0, 3.0]), np.array([1.0, -1.0, 0.5])),
                     (np.array([4.0, 5.0]), np.array([0.0, 3.0])),
                     (np.arange(6.0), np.ones(6))]:
            h = rvm.hvp(p["sumsq"], (x, 0.0), (v, 0.0), loss=1, engine=engine)
            assert np.array_equal(h[0], 2 * v) and h[1] == 0.0, (engine, h)
        assert any(plan[0] == "arrays" for plan in _HVP_PLANS.plans.values())
        with pytest.raises(rvm.UsageError, match="shape"):
            rvm.hvp(p["sumsq"], (np.ones(3), 0.0), (np.ones(2), 0.0), loss=1, engine=engine)
        with pytest.raises(rvm.UsageError, match="integer"):
            rvm.hvp(p["isum"], (np.array([1, 2]), 5), (None, 1.0), loss=1, engine=engine)


def _example_cases():
    """(name, function, arguments) for the examples' reversible functions."""
    sys.path.insert(0, str(ROOT / "examples"))
    import ba
    from besselj import besselj_inplace
    from complex_log import complex_log
    from hvp import f as pearlmutter
    from iexp import iexp
    from unitary import givens
    rng = np.random.default_rng(5)
    cam = [0.1, -0.2, 0.05, 0.1, -0.2, 0.3, 2.0, 0.5, -0.5, 0.01, 0.001]
    return [("besselj_inplace", besselj_inplace, (0.0, 2, 1.0)),
            ("iexp", iexp, (0.0, 1.6)),
            ("complex_log", complex_log, (0.5, -0.25, -1.5, 2.0)),
            ("pearlmutter", pearlmutter, (0.0, 3.0, 4.0)),
            ("ba.residual", ba.residual, (0.0, 0.0, *cam, 1.0, 2.0, 5.0, 0.8, 0.3, 0.4)),
            ("givens", givens, (rng.normal(size=4), rng.normal(size=6)))]


EXAMPLES = _example_cases()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", EXAMPLES, ids=[c[0] for c in EXAMPLES])
def test_transforms_of_the_examples_match_finite_differences(engine, case):
    """rvm.jvp (every example) and rvm.adjoint (the scalar ones) of the examples' functions
    against central differences of the plain function, on every engine."""
    _, fn, args = case
    floats = [k for k, a in enumerate(args) if not isinstance(a, int)]
    sizes = [np.size(args[k]) for k in floats]

    def unflatten(x):
        full, at = list(args), 0
        for k, n in zip(floats, sizes):
            part = x[at:at + n]
            full[k] = part.reshape(np.shape(args[k])) if np.ndim(args[k]) else float(part[0])
            at += n
        return full

    def flat(values):
        return np.concatenate([np.ravel(values[k]) for k in floats])
    x0 = flat(args)
    eps = 1e-6
    jac = np.stack([(flat(fn(*unflatten(x0 + eps * e), engine="interp")) -
                     flat(fn(*unflatten(x0 - eps * e), engine="interp"))) / (2 * eps)
                    for e in np.eye(len(x0))], axis=1)
    rng = np.random.default_rng(1)
    v = rng.normal(size=len(x0))
    dots = unflatten(v)
    dots = [None if isinstance(a, int) else d for a, d in zip(args, dots)]
    _, out = rvm.jvp(fn, args, dots, engine=engine)
    assert np.allclose(flat(out), jac @ v, rtol=1e-5, atol=1e-6)
    if all(np.ndim(a) == 0 for a in args):        # the adjoint program takes scalars
        ybar = rng.normal(size=len(x0))
        res = rvm.adjoint(fn)(*args, *ybar, engine=engine)
        assert np.allclose(res[:len(args)], args, rtol=1e-9, atol=1e-9)
        assert np.allclose(res[len(args):], jac.T @ ybar, rtol=1e-5, atol=1e-6)


@rvm.reversible
def with_ancilla(out: float, x: float, y: float):
    with rvm.ancilla(t=0.0):
        t += x * sin(y)
        out += t * t + exp(x) * y
        t -= x * sin(y)


adjoint_with_ancilla = rvm.adjoint(with_ancilla)


@rvm.reversible
def v_dot_grad_with_ancilla(s: float, out: float, x: float, y: float, gout: float,
                            gx: float, gy: float, v1: float, v2: float):
    adjoint_with_ancilla(out, x, y, gout, gx, gy)
    s += v1 * gx + v2 * gy
    ~adjoint_with_ancilla(out, x, y, gout, gx, gy)


@pytest.mark.parametrize("engine", ENGINES)
def test_adjoint_through_an_adjoint_that_drops_shadows(engine):
    """rvm.adjoint of a function calling rvm.adjoint(g), g with a float ancilla (its
    adjoint keeps garbage on the heap stack): the nested adjoint is swept as one
    operation, and reverse over reverse agrees with forward over reverse and with
    finite differences of the gradient."""
    x, y, v = 0.7, 1.3, (0.4, -0.9)
    args = (0.0, 0.0, x, y, 1.0, 0.0, 0.0, *v)
    outer = rvm.adjoint(v_dot_grad_with_ancilla, engine=engine)
    out = outer(*args, 1.0, *[0.0] * 8)
    assert out[:9] == pytest.approx(args, abs=1e-14)
    hv = rvm.hvp(with_ancilla, (0.0, x, y), (0.0, *v), loss="out", engine=engine)
    assert out[11:13] == pytest.approx(hv[1:], abs=1e-12)

    def grad_at(x, y):
        return np.array(rvm.grad(with_ancilla, loss="out")(0.0, x, y)[1:])
    fd = (grad_at(x + H * v[0], y + H * v[1]) - grad_at(x - H * v[0], y - H * v[1])) / (2 * H)
    assert out[11:13] == pytest.approx(fd, abs=1e-7)
    assert out[9:] == pytest.approx(rvm.grad(v_dot_grad_with_ancilla, loss="s",
                                             engine=engine)(*args), abs=1e-12)
    back = (~outer)(*out)
    assert back == pytest.approx(args + (1.0,) + (0.0,) * 8, abs=1e-12)
    # the adjoint of an adjoint: its shadows of g's inputs are H v, of its shadows J v
    twice = rvm.adjoint(adjoint_with_ancilla, engine=engine)(
        0.0, x, y, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, *v)
    assert twice[7:9] == pytest.approx(hv[1:], abs=1e-12)
    assert twice[9] == pytest.approx(float(np.dot(grad_at(x, y), v)), abs=1e-12)


@rvm.reversible
def _maxima(out: float, a: float, b: float, c: float):
    out += min(c, b)
    out += max(a, b) * a
    out += min(c, b)


@pytest.mark.parametrize("args", [(0.0, 0.3, 0.3, -5.0), (0.0, 1.0, 1.0 + 1e-14, -1000.0)],
                         ids=["tie", "near"])
def test_derived_programs_of_max_and_min_are_exact_at_and_near_ties(args):
    """The partials of max and min are comparisons (the gt family), which the tangent and
    adjoint programs compute and take back exactly: a float b - a left rounding in a
    scratch register that turned the next sign (a tie became one-sided), and overflowed
    for large operands."""
    grads = rvm.grad(_maxima, loss="out")(*args)
    adj = rvm.adjoint(_maxima)(*args, 1.0, 0.0, 0.0, 0.0)
    assert adj[4:] == pytest.approx(grads, rel=1e-15, abs=0.0)
    for k in (1, 2, 3):
        seed = [0.0] * 4
        seed[k] = 1.0
        assert rvm.jvp(_maxima, args, tuple(seed))[1][0] == grads[k]
    H = rvm.hessian(_maxima, loss="out", wrt=("a", "b"))(*args)
    a, b = args[1], args[2]
    want = [[1.0, 0.5], [0.5, 0.0]] if a == b else [[2.0, 0.0], [0.0, 0.0]] if a > b else \
        [[0.0, 1.0], [1.0, 0.0]]
    assert np.array_equal(H, want), H


def test_derived_programs_of_max_take_operands_whose_difference_overflows():
    f = rvm.reversible.source("def f(out: float, a: float, b: float):\n"
                              "    out += max(a, b) * 1e-300\n")
    args = (0.0, 1e308, -1e308)
    assert rvm.grad(f, loss="out")(*args) == (1.0, 1e-300, 0.0)
    assert rvm.adjoint(f)(*args, 1.0, 0.0, 0.0)[3:] == (1.0, 1e-300, 0.0)
    assert rvm.jvp(f, args, (0.0, 1.0, 1.0))[1][0] == 1e-300


def test_a_summed_scratch_register_is_cleared_before_its_next_use_in_either_direction():
    """atan2's partials sum a*a + b*b into one scratch register; taken apart again it can
    keep a rounding residue. Cleared on both sides of each use, so that the adjoint's
    backward runs (its clean-up, through a frontend temporary) do not take it in: the
    adjoint equals the gradient, and the Hessian is symmetric and right."""
    f = rvm.reversible.source("import math\n\ndef f(out: float, a: float, b: float, "
                              "c: float):\n    out += math.atan2(a, b)\n"
                              "    out += math.atan2(c, a) * 2.0\n")
    for args in [(0.0, 1e-9, 1.0, 0.5), (0.0, 7332.782915489681, 2719.6038235215146,
                                         3147.5433575369816)]:
        grads = rvm.grad(f, loss="out")(*args)
        adj = rvm.adjoint(f)(*args, 1.0, 0.0, 0.0, 0.0)
        assert adj[4:] == pytest.approx(grads, rel=1e-15, abs=1e-300)
    a, b, c = args[1:]
    H = rvm.hessian(f, loss="out", wrt=("a", "b", "c"))(*args)
    # the exact Hessian: d2/dx2 of atan2(a, b) + 2 atan2(c, a)
    r1, r2 = a * a + b * b, c * c + a * a
    want = np.array([[-2 * a * b / r1 ** 2 + 4 * a * c / r2 ** 2,
                      (a * a - b * b) / r1 ** 2, -2 * (a * a - c * c) / r2 ** 2],
                     [(a * a - b * b) / r1 ** 2, 2 * a * b / r1 ** 2, 0.0],
                     [-2 * (a * a - c * c) / r2 ** 2, 0.0, -4 * a * c / r2 ** 2]])
    np.testing.assert_allclose(H, want, rtol=1e-9, atol=1e-9 * abs(want).max())
