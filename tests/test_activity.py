"""A gradient with respect to some arguments only leaves out the array pullbacks no
requested gradient needs (rvm.ad.activity), and the gradients it returns are the same,
bit for bit, as those of a gradient with respect to every argument."""

import pathlib
import sys

import numpy as np
import pytest

import rvm
from rvm.ad import activity
from rvm.ad.gradient import Pass, find_argument, target
from rvm.core.inverse import inverse_function
from rvm.engines import native

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import gmm  # noqa: E402
import gmm_arrays  # noqa: E402

ENGINES = ["interp", "python", pytest.param("native", marks=pytest.mark.skipif(
    not native.available, reason="needs llvmlite"))]
SMALL = ROOT.parent / "shared" / "data" / "adbench" / "gmm" / "1k" / "gmm_d2_K5.txt"


def gmm_args() -> tuple:
    if not SMALL.exists():
        pytest.skip("the ADBench GMM inputs are not here")
    data = gmm.load(SMALL)
    data["x"] = data["x"][:60]          # (fewer points: the interpreter is timed too)
    return gmm.arguments(data)


def pulls(program, fname: str) -> dict:
    return {str(ins): ins.pull for ins in program.functions[fname].code
            if ins.op in activity.PULLED}


def pruned_for(fn, args, wrt: tuple):
    """(the program, the program a gradient with respect to arguments wrt runs)."""
    return target(fn, args)[0], Pass(fn, {}, frozenset(wrt)).entered(args).program


def test_the_gmm_gradient_leaves_out_the_points_pullbacks():
    """Without the points' gradient: the product's pullback into the monomials (made
    from the points alone), the monomials' into the points, the points' copy's into
    them; the pullbacks into the parameters stay."""
    args = gmm_args()
    program, less = pruned_for(gmm_arrays.gmm_objective, args, (1, 2, 3))
    assert less is not program
    product = pulls(less, "gmm_objective")
    assert set(product.values()) == {~2}        # E += W @ P: into W, not into P
    assert set(pulls(less, "monomials").values()) == {~3, ~1, -1}   # (X * X, X, a constant)
    assert pulls(less, "copy_in") == {s: (~1 if "1, r22]" in s else -1)
                                      for s in pulls(program, "copy_in")}
    assert set(pulls(less, "weights").values()) == {-1}   # (all from the parameters)
    assert set(pulls(program, "gmm_objective").values()) == {-1}
    # the gradient pass runs the inverse function's code: it keeps the masks
    back = inverse_function(less.functions["gmm_objective"])
    assert {ins.pull for ins in back.code if ins.op in activity.PULLED} == {~2}
    # every argument asked for: nothing left out
    _, all_of_them = pruned_for(gmm_arrays.gmm_objective, args, tuple(range(11)))
    assert all_of_them is program


@pytest.mark.parametrize("engine", ENGINES)
def test_the_gradients_asked_for_are_the_same_bit_for_bit(engine):
    args = gmm_args()
    every = rvm.value_and_grad(gmm_arrays.gmm_objective, loss="out", engine=engine,
                               max_steps=gmm.STEPS)
    some = rvm.value_and_grad(gmm_arrays.gmm_objective, loss="out", argnums=(1, 2, 3),
                              engine=engine, max_steps=gmm.STEPS)
    named = rvm.grad(gmm_arrays.gmm_objective, loss="out",
                     wrt=("alphas", "means", "icf"), engine=engine, max_steps=gmm.STEPS)
    (values, grads), (values2, grads2) = every(*args), some(*args)
    for k, g in zip((1, 2, 3), grads2):
        assert np.array_equal(grads[k], g)
    for g, h in zip(grads2, named(*args)):
        assert np.array_equal(g, h)
    for v, w in zip(values, values2):
        assert np.array_equal(np.asarray(v), np.asarray(w))
    # the points' gradient, worked out when every gradient is asked for, is not zero
    assert np.abs(grads[4]).max() > 0


MIXED = '''
import numpy as np
from rvm import Array, ancilla, compute, reversible, zeros


@reversible
def mix(x: Array[float], w: Array[float]):
    x += w * 2.0


@reversible
def total(s: float, w: Array[float]):
    s += np.sum(w)


@reversible
def f(out: float, w: Array[float], x: Array[float], c: Array[float]):
    with ancilla(t=zeros(len(x)), u=zeros(len(x)), s=0.0):
        mix(x, w)
        with compute() as pre:
            total(s, w)
            u += s * c
            t += x * c
        out += np.sum(np.exp(t))
        out += x @ c
        out += np.sum(u * u)
        ~pre
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_data_that_a_differentiated_argument_reaches_keeps_its_pullbacks(engine, tmp_path):
    """x is data, but a callee adds w into it; s, a float, gets w's sum from another
    callee (through the call's binding, back to the caller), and u is made from s: the
    pullbacks into x and u carry w's gradient (left out, it would lose those terms). c is
    data nothing reaches."""
    (tmp_path / "mixed.py").write_text(MIXED)
    f = rvm.load(tmp_path / "mixed.py")["f"]
    rng = np.random.default_rng(3)
    w, x, c = rng.normal(size=5) * 0.3, rng.normal(size=5) * 0.3, rng.normal(size=5)
    args = (0.0, w, x, c)
    _, less = pruned_for(f, args, (1,))
    kept = {}
    for text, pull in pulls(less, "f").items():
        kept.setdefault(text.split()[0], set()).add(pull)
    # (x * c and x @ c: into x, not c; s * c: into nothing, c; u * u, exp(t): into u, t)
    assert kept == {"VADD.mul": {~2, -1}, "VSUB.mul": {~2}, "VMADD": {~2}, "VADD.exp": {-1}}
    assert set(pulls(less, "mix").values()) == {-1}
    gw = rvm.grad(f, loss="out", argnums=1, engine=engine)(*args)
    every = rvm.grad(f, loss="out", engine=engine)(*args)
    assert np.array_equal(gw, every[1])
    xw = x + 2.0 * w
    closed = 2.0 * (np.exp(xw * c) * c + c) + 2.0 * w.sum() * (c * c).sum()
    assert np.allclose(gw, closed, rtol=1e-12)


SCALAR = '''
from rvm import Array, ancilla, reversible


@reversible
def f(out: float, w: Array[float], c: Array[float], d: float, n: int):
    for i in range(n):
        with ancilla(t=0.0):
            t += w[i] * c[i]
            out += t * d
            out += c[i] * c[i]
            t -= w[i] * c[i]
'''


def scalar_pulls(program, fname: str) -> dict:
    """Each scalar instruction's text -> its pull mask, where that is not every bit."""
    return {str(ins): ins.pull & 7 for ins in program.functions[fname].code
            if ins.op in activity.SCALAR_PULLED and ins.pull != -1}


@pytest.mark.parametrize("engine", ENGINES)
def test_scalar_pullbacks_into_data_are_left_out(engine, tmp_path):
    """Scalar instructions too: with respect to w only, the products' pullbacks into
    c's elements (read into registers) and into c's cells are left out, and so are d's
    (a float argument not asked for); the gradient of w is the same bit for bit, and
    is the closed form. With respect to d as well, d's come back."""
    (tmp_path / "s.py").write_text(SCALAR)
    f = rvm.load(tmp_path / "s.py")["f"]
    rng = np.random.default_rng(5)
    w, c = rng.normal(size=6), rng.normal(size=6)
    args = (0.0, w, c, 0.7, 6)
    program, less = pruned_for(f, args, (1,))
    masks = scalar_pulls(less, "f")
    assert masks and 7 not in masks.values(), masks
    # every product whose operand comes from c: that operand's bit cleared
    assert all(m & 3 != 3 for text, m in masks.items() if ".mul" in text), masks
    _, with_d = pruned_for(f, args, (1, 3))
    assert len(scalar_pulls(with_d, "f")) < len(masks)
    assert not scalar_pulls(program, "f")
    gw = rvm.grad(f, loss="out", argnums=1, engine=engine)(*args)
    every = rvm.grad(f, loss="out", engine=engine)(*args)
    assert np.array_equal(gw, every[1]) and np.allclose(gw, 0.7 * c, rtol=1e-14)
    gwd = rvm.grad(f, loss="out", argnums=(1, 3), engine=engine)(*args)
    assert np.array_equal(gwd[0], gw) and gwd[1] == every[3] == pytest.approx(w @ c)
    # the pass itself: nothing was pulled back into c or d (both were, in every[2, 3])
    runner = Pass(f, {"engine": engine}, frozenset({1}))
    m = runner.forward(args)
    grads = runner.backward(m, find_argument(m.bindings, m.stack[0].fn, "out", "loss"))
    assert np.array_equal(grads[1], gw) and not grads[2].any() and grads[3] == 0.0
    assert every[2].all() and every[3] != 0.0


def test_assembly_programs_keep_every_pullback():
    p = rvm.assemble(".func f(r0, r1, f0)\n        VADD.mul [r0 : 0, 1], [r1 : 0, 1], 2.0, "
                     "1, 3\n.end\n")
    assert activity.pruned(p, "f", frozenset({0, 1}), frozenset({0})) is p


UNCHOSEN = '''
import numpy as np
from rvm import Array, reversible


@reversible
def f(out: float, w: Array[float], c: Array[float], k: Array[float], big: float):
    out += big * c[0]
    out += np.sum(c * k)
    out += big * c[0]
    out += np.sum(w * w)


@reversible
def g(out: float, s: float, big: float, w: Array[float]):
    out += s * big
    out += s * big
    out += np.sum(w * w)


@reversible
def unused(a: Array[float], b: Array[float]):
    a += b * b
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gradient_not_chosen_is_not_checked(engine, tmp_path):
    """f: c's gradient is 2e308 - 1e308 in all, but the pullback into c from c * k (k is
    data) is left out, so c's partial sum overflows; g: s's gradient overflows. Neither
    is chosen: the chosen gradient comes back, as JAX gives it."""
    (tmp_path / "unchosen.py").write_text(UNCHOSEN)
    prog = rvm.load(tmp_path / "unchosen.py")
    args = (0.0, np.array([1.0, 2.0]), np.array([1e-300, 0.0]), np.array([-1e308, 0.0]), 1e308)
    every = rvm.grad(prog["f"], loss="out", engine=engine)(*args)
    assert np.array_equal(every[2], [1e308, 0.0])
    chosen = rvm.grad(prog["f"], loss="out", argnums=1, engine=engine)(*args)
    assert np.array_equal(chosen, every[1]) and np.array_equal(chosen, [2.0, 4.0])
    g = rvm.grad(prog["g"], loss="out", argnums=3, engine=engine)
    assert np.array_equal(g(0.0, 1e-300, 1e308, np.array([1.0, 2.0])), [2.0, 4.0])
    with pytest.raises(rvm.RvmError, match="`s`"):
        rvm.grad(prog["g"], loss="out", argnums=(1, 3), engine=engine)(
            0.0, 1e-300, 1e308, np.array([1.0, 2.0]))


def test_functions_the_entry_does_not_reach_leave_the_analysis_on(tmp_path):
    """A loaded file's other functions (whose array parameters no call binds), and the
    bytecode inverse's function under ~f, are not analysed; a function defined by
    rvm.reversible.source is."""
    (tmp_path / "unchosen.py").write_text(UNCHOSEN)
    f = rvm.load(tmp_path / "unchosen.py")["f"]
    args = (0.0, np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([3.0, 0.0]), 1.0)
    program, less = pruned_for(f, args, (1,))
    assert less is not program and set(pulls(less, "f").values()) == {-1, ~3}
    program, less = pruned_for(~f, args, (1,))
    assert less is not program
    h = rvm.reversible.source(UNCHOSEN.split("@reversible\n")[1], env={
        "np": np, "Array": rvm.Array})
    program, less = pruned_for(h, args, (1,))
    assert less is not program
    assert np.array_equal(rvm.grad(~f, loss="out", argnums=1)(*args),
                          rvm.grad(~f, loss="out")(*args)[1])


def test_a_program_calling_a_derivative_program_keeps_every_pullback(tmp_path):
    """rvm.adjoint(sq) called from reversible code brings sq's derived functions in, which
    lay out a heap of their own: the analysis leaves such a program alone."""
    (tmp_path / "calls.py").write_text('''
import numpy as np
import rvm
from rvm import Array, reversible


@reversible
def sq(out: float, s: float):
    out += s * s


A = rvm.adjoint(sq)


@reversible
def h(out: float, w: Array[float], c: Array[float], s: float, gout: float, gs: float):
    out += np.sum(w * c)
    A(out, s, gout, gs)
''')
    h = rvm.load(tmp_path / "calls.py")["h"]
    args = (0.0, np.array([1.0, 2.0]), np.array([3.0, 4.0]), 0.5, 1.0, 0.0)
    program, less = pruned_for(h, args, (1,))
    assert less is program
    assert np.array_equal(rvm.grad(h, loss="out", argnums=1)(*args), [3.0, 4.0])


def test_bytecode_read_from_a_file_keeps_every_pullback(tmp_path):
    """A .rvmb names its Python source in its debug information, which a file may get
    wrong: the analysis is for programs this process compiled."""
    (tmp_path / "unchosen.py").write_text(UNCHOSEN)
    f = rvm.load(tmp_path / "unchosen.py")["f"]
    args = (0.0, np.array([1.0, 2.0]), np.array([1.0, 0.0]), np.array([3.0, 0.0]), 1.0)
    program, less = pruned_for(f, args, (1,))
    assert less is not program
    from rvm.formats import bytecode
    path = tmp_path / "unchosen.rvmb"
    path.write_bytes(bytecode.dumps(program))
    read = rvm.load(path)["f"]
    program, less = pruned_for(read, args, (1,))
    assert program.source.endswith("unchosen.py") and less is program
