"""Rows in lockstep (rvm.engines.lanes): rvm.vmap's native batch loops run groups of rows
through vector versions of the generated functions. Each row must compute exactly what it
computes alone, however the rows' paths part (branches, loops with their own trip counts,
calls), and a check that fails in one row must fail the batch as it fails that row."""

import functools
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rvm
from rvm import ancilla, compute
from rvm.engines import lanes, llvm, native
from rvm.engines.compiled import compiled

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.skipif(not llvm.usable(), reason="needs llvmlite's LLVM back end")


@rvm.reversible
def _square_into(out: float, x: float):
    out += x * x


@rvm.reversible
def _parted(out: float, x: float, n: int):
    """A branch on the row's value, a loop with the row's own trip count, a call."""
    with ancilla(a=0.0, s=0.0):
        with compute() as c:
            a += x * 0.5
            if (a > 0.0, a > 0.0):
                _square_into(s, a)
            else:
                s += exp(a) - x
            for i in range(n):
                s += sin(a + i) * a / (1.0 + i)
        out += s * x + a
        ~c


def exactly(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))


def in_lockstep(program, name: str) -> bool:
    """Does the batch loop of `name`'s calls get lane functions?"""
    c = compiled(program, True, native=True)
    f = c.name(name, "")
    text = llvm.ir_module(c.native_bodies, 1e-9, {}, {f + "csb": ("csb", f + "fw", f + "gbw", 0)},
                          runs=())
    return f"{f}fw_lanes" in text


@pytest.fixture
def batches(monkeypatch):
    """The modes of the native batch loops called, and whether each raised."""
    seen = []
    run = llvm.Batch.__call__

    def call(self, *a):
        try:
            run(self, *a)
        except Exception:
            seen.append((self.mode, "raised"))
            raise
        seen.append((self.mode, "ok"))
    monkeypatch.setattr(llvm.Batch, "__call__", call)
    return seen


@settings(max_examples=20, deadline=None)
@given(xs=st.lists(st.floats(-3.0, 3.0), min_size=8, max_size=40),
       seed=st.integers(0, 2 ** 16))
def test_rows_in_lockstep_compute_what_each_computes_alone(xs, seed):
    """Gradients and values of a batch (whole groups of rows and a remainder) equal the
    single calls' to the bit, with each row taking its own branch and trip count."""
    xs = np.array(xs)
    ns = np.random.default_rng(seed).integers(0, 7, len(xs))
    g = rvm.grad(_parted, loss="out", engine="native")
    vg = rvm.value_and_grad(_parted, loss="out", engine="native")
    with pytest.MonkeyPatch.context() as mp:
        seen: list = []
        run = llvm.Batch.__call__
        mp.setattr(llvm.Batch, "__call__", lambda self, *a: run(self, *a) or seen.append(1))
        grads = rvm.vmap(g, in_axes=(None, 0, 0))(0.0, xs, ns)
        values, grads2 = rvm.vmap(vg, in_axes=(None, 0, 0))(0.0, xs, ns)
    assert seen == [1, 1]       # both in one native call each, no row failed
    rows = [vg(0.0, float(x), int(n)) for x, n in zip(xs, ns)]
    for k in (0, 1):
        want = [r[1][k] for r in rows]
        assert exactly(grads[k], want) and exactly(grads2[k], want)
    assert exactly(values[0], [r[0][0] for r in rows])
    interp = [rvm.grad(_parted, loss="out", engine="interp")(0.0, float(x), int(n))
              for x, n in zip(xs[:3], ns[:3])]
    assert np.allclose(grads[1][:3], [r[1] for r in interp], rtol=1e-12)


def test_the_batch_entries_have_lane_functions():
    """The batch loops of a program without heap get lane versions of the functions they
    run; RVM_LANES=0 turns them off."""
    p, name, _ = _parted.specialize((0.0, 1.0, 3))
    c = compiled(p, True, native=True)
    f = c.name(name, "")
    batches = {f + "vgsb": ("vgsb", f + "fws", f + "gbws", c.splits[name]),
               f + "csb": ("csb", f + "fw", f + "gbw", 0)}
    text = llvm.ir_module(c.native_bodies, 1e-9, {}, batches, runs=())
    for fn in ("fws", "gbws", "fw"):
        assert f"{f}{fn}_lanes" in text
    assert "<8 x double>" in text and "llvm.vector.reduce.smin" in text
    was, lanes.enabled = lanes.enabled, False
    try:
        assert "_lanes" not in llvm.ir_module(c.native_bodies, 1e-9, {}, batches, runs=())
    finally:
        lanes.enabled = was


def test_calls_and_uncalls_in_lockstep(batches):
    """rvm.vmap of a call and of its inverse (isqrt: a loop that runs sqrt(n) times)."""
    p = rvm.load(ROOT / "asm" / "isqrt.rasm", engine="native")
    assert in_lockstep(p, "isqrt")
    ns = np.arange(0, 300, 7)
    out = rvm.vmap(p["isqrt"])(ns, np.zeros_like(ns))
    assert exactly(out[1], np.floor(np.sqrt(ns)).astype(np.int64))
    back = rvm.vmap(~p["isqrt"])(*out)
    assert exactly(back[0], ns) and exactly(back[1], np.zeros_like(ns))
    assert batches == [("csb", "ok"), ("usb", "ok")]


def test_idle_rows_never_divide_by_zero(batches):
    """A row that skips a division may be idle while the others divide: it divides by 1
    there, so nothing traps, and its result is its own."""
    p = rvm.assemble(".func t(r0, r1, r2)\n"
                     "br:     BR.EQ   r1, 0, skip\n"
                     "        ADD.div r0, r2, r1\n"
                     "skip:   CF.EQ   r1, 0, br\n"
                     ".end\n")
    d = np.array([0, 3, -2, 0, 5, 1, 0, 7, 0, 0, 4, -1, 6, 0, 2, 9, 0])
    assert in_lockstep(p, "t")
    t = functools.partial(p["t"], engine="native")
    out = rvm.vmap(t)(np.zeros_like(d), d, np.full_like(d, 100))
    assert exactly(out[0], [100 // x if x else 0 for x in d])
    assert batches == [("csb", "ok")]


def test_a_row_that_fails_fails_the_batch_as_alone(batches):
    """A failed check in one row of a group (a division's inverse that does not restore
    zero), and a row that exhausts the step budget: the batch raises what that row raises
    alone, and the other rows' results are never returned half made."""
    p = rvm.assemble(".func t(f0, r0)\n    ADD f0, r0\n    ASSERT.LT r0, 50\n.end\n")
    t = functools.partial(p["t"], engine="native")
    ns = np.arange(40)
    assert exactly(rvm.vmap(t)(np.zeros(40), ns)[0], ns.astype(float))
    ns[13] = 77
    with pytest.raises(rvm.RvmError) as alone:
        t(0.0, 77)
    with pytest.raises(type(alone.value)):
        rvm.vmap(t)(np.zeros(40), ns)
    assert batches == [("csb", "ok"), ("csb", "raised")]
    p = rvm.load(ROOT / "asm" / "isqrt.rasm")
    isqrt = functools.partial(p["isqrt"], engine="native", max_steps=10_000)
    ns = np.full(24, 49)
    assert exactly(rvm.vmap(isqrt)(ns, np.zeros_like(ns))[1], np.full(24, 7))
    ns[17] = 10 ** 12                   # a million iterations in one row
    with pytest.raises(rvm.MachineError, match="step"):
        rvm.vmap(isqrt)(ns, np.zeros_like(ns))
    assert batches[2:] == [("csb", "ok"), ("csb", "raised")]


def test_a_value_that_stops_being_finite_at_the_return_fails_the_batch(batches):
    """The gradient pass's product overflows (its rotation backwards leaves f1 at 1e284
    rounding error instead of 0.375) and nothing looks at f2 again before the return: the
    registers' finiteness test there fails the batch as it fails the row alone, even after
    a call of that row (which plans the batch without trying a row first)."""
    p = rvm.assemble(".func t(f0, f1, f2)\n    SUB.mul f2, f1, f0\n"
                     "    ROT f0, f1, 0.7395861745469263\n.end\n")
    g = rvm.grad(p["t"], loss=0, engine="native")
    row = (1e300, 0.375, 1.25)
    with pytest.raises(rvm.RvmError, match="f2 would become -inf") as alone:
        g(*row)
    with pytest.raises(type(alone.value), match="f2 would become -inf"):
        rvm.vmap(g)(*(np.full(8, v) for v in row))
    assert ("vgsb", "raised") in batches


def test_batch_loops_take_one_value_for_every_row():
    """A column given as one value (a stride-0 view, as rvm.vmap passes in_axes None) is
    read as that value in every row, without an array of copies; values not wanted are
    not stored (None)."""
    from rvm.engines.native import Functions
    p = rvm.assemble(".func t(f0, f1, r0)\n    ADD.mul f0, f1, r0\n.end\n")
    funcs = Functions(compiled(p, True, native=True), 1e-9)
    loop = funcs["F0_csb"]
    assert loop.spreads
    n = 21
    ys, o0, o1, o2 = np.linspace(0, 2, n), np.empty(n), np.empty(n), np.empty(n, np.int64)
    loop(1000, np.broadcast_to(np.float64(1.5), (n,)), ys,
         np.broadcast_to(np.int64(3), (n,)), o0, o1, o2)
    assert exactly(o0, 1.5 + ys * 3) and exactly(o2, np.full(n, 3))
    grad = funcs["F0_vgsb"]
    g0, g1 = np.empty(n), np.empty(n)
    grad(1000, np.zeros(n), ys, np.broadcast_to(np.int64(2), (n,)), 1.0, 0.0,
         None, None, None, g0, g1)
    assert exactly(g0, np.ones(n)) and exactly(g1, np.full(n, 2.0))
    loop(1000, np.zeros(0), np.zeros(0), np.zeros(0, np.int64), np.empty(0), np.empty(0),
         np.empty(0, np.int64))                             # no rows: nothing read


def test_batches_on_threads_keep_their_rows():
    """Split across the worker threads (a pool started once), every slice writes its own
    rows; a failed slice raises after the others have finished."""
    from besselj import besselj_inplace
    g = rvm.grad(besselj_inplace, loss="out", engine="native")
    zs = np.linspace(0.5, 3.0, 3 * native.THREAD_ROWS + 5)
    batch = rvm.vmap(g, in_axes=(None, None, 0))
    got = batch(0.0, 2, zs)
    picks = [0, 1, native.THREAD_ROWS, len(zs) // 2, len(zs) - 1]
    assert exactly(got[2][picks], [g(0.0, 2, float(zs[i]))[2] for i in picks])
    assert native._pool() is native._pool()


def test_forward_mode_batches_run_in_lockstep(batches):
    """rvm.vmap of a tangent (with machine options given by functools.partial, as to a
    call): one native loop, the rows' tangents equal to single calls'."""
    t = rvm.tangent(_parted)
    xs, ns = np.linspace(-2, 2, 19), np.arange(19) % 5
    out = rvm.vmap(functools.partial(t, engine="native"), in_axes=(None, 0, 0, None, None))(
        0.0, xs, ns, 0.0, 1.0)
    want = [t(0.0, float(x), int(n), 0.0, 1.0, engine="native") for x, n in zip(xs, ns)]
    assert all(exactly(out[k], [w[k] for w in want]) for k in range(5))
    assert batches == [("csb", "ok")]


def test_jacobian_batches_run_in_lockstep(batches):
    """rvm.vmap of a Jacobian: per group one forward run, then a gradient pass per output,
    the same numbers as row by row."""
    jac = rvm.jacobian(_parted, outputs=("out",), wrt=("out", "x"), engine="native")
    xs, ns = np.linspace(-2, 2, 21), np.arange(21) % 6
    got = rvm.vmap(jac, in_axes=(None, 0, 0))(0.0, xs, ns)
    want = [jac(0.0, float(x), int(n)) for x, n in zip(xs, ns)]
    assert exactly(got, want) and got.shape == (21, 1, 2)
    assert batches == [("jsb", "ok")]


def test_one_value_columns_are_never_copied():
    """rvm.vmap passes an unbatched argument as a stride-0 view; the loop gets that view
    (or, for another dtype, a view of one converted value), never n copies."""
    from rvm.engines.arguments import batch_columns
    from rvm.engines.native import Functions
    p = rvm.assemble(".func t(f0, r0)\n    ADD f0, r0\n.end\n")
    fn = p.functions["t"]
    loop = Functions(compiled(p, True, native=True), 1e-9)["F0_csb"]
    one = np.broadcast_to(np.float64(2.5), (10 ** 6,))
    cols = batch_columns([one, np.broadcast_to(np.int32(3), (10 ** 6,))], fn.params, loop)
    assert cols[0] is one and cols[1].strides == (0,) and cols[1].dtype == np.int64
    assert cols[1].base.size == 1


def test_a_gradients_first_batch_compiles_its_batch_loop_alone(monkeypatch):
    """rvm.vmap of a gradient runs its rows in one native batch loop: its first batch
    compiles that loop alone, not also the gradient's single native call for one row
    (the first batch of the Bessel gradient spent 0.19 s of its 1.5 s on it); a single
    call later compiles its own, once."""
    import uuid
    texts: list = []
    real = llvm.compile_ir
    monkeypatch.setattr(llvm, "compile_ir",
                        lambda text, **kw: (texts.append(text), real(text, **kw))[1])
    c = uuid.uuid4().int % 1000 / 1000     # (a program no cache holds)
    p = rvm.assemble(f".func f(f0, f1)\n    ADD.mul f1, f0, f0\n    ADD f1, {c}\n.end\n")
    g = rvm.grad(p["f"], loss="f1", engine="native")
    xs = np.linspace(0.5, 3.0, 37)
    dx, dc = rvm.vmap(g, in_axes=(0, None))(xs, 0.0)
    assert np.array_equal(dx, 2 * xs) and np.array_equal(dc, np.ones(37))
    assert len(texts) == 1 and '@"rvm_py_F0_vgsb"(' in texts[0]
    assert '@"rvm_py_F0_vgs"(' not in texts[0]
    assert g(1.5, 0.0) == (3.0, 1.0) and g(2.0, 0.0) == (4.0, 1.0)
    assert len(texts) == 2 and '@"rvm_py_F0_vgs"(' in texts[1]
    assert rvm.vmap(g, in_axes=(0, None))(xs, 0.0)[0][3] == 2 * xs[3]
    assert len(texts) == 2
