"""Every engine gives the same results: the test programs, their inverses and gradients run
on the stepping interpreter (the reference) and on the compiled engine, compared bit for
bit for integers and within 1e-12 for floats."""

import contextlib
import functools
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from progen import program as random_program

import rvm
from rvm import Array, ancilla, compute, zeros
from rvm.engines import native
from rvm.engines.compiled import compiled
from rvm.engines.machine import resolve_engine

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
EXPECT = re.compile(r";\s*(expect|grad):\s*(\w+)\s*(.*?)\s*=>")


def same(a, b) -> bool:
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.allclose(a, b, rtol=1e-12, atol=1e-300) if \
            a.dtype.kind == "f" else np.array_equal(a, b)
    if isinstance(a, int) and not isinstance(a, bool):
        return type(b) is int and a == b
    return abs(a - b) <= 1e-12 * max(1.0, abs(a), abs(b))


def parse(text):
    if text.startswith("["):
        return np.array([float(v) for v in text[1:-1].split(",")])
    return float(text) if any(c in text for c in ".eE") else int(text)


def asm_cases():
    for path in sorted((ROOT / "asm").glob("*.rasm")):
        for m in EXPECT.finditer(path.read_text()):
            given_, _, loss = m.group(3).partition(" loss ")
            yield pytest.param(path, m.group(1), m.group(2), given_, loss.strip(),
                               id=f"{path.name}:{m.group(2)}:{m.start()}")


ENGINES = ["interp", "python"] + (["native"] if native.available else [])


@pytest.mark.parametrize("path,kind,name,args,loss", list(asm_cases()))
def test_asm_programs_agree(path, kind, name, args, loss):
    values = [parse(a) for a in args.split()]
    results = {}
    for engine in ENGINES:
        program = rvm.load(path, engine=engine)
        fresh = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
        if kind == "grad":
            results[engine] = rvm.grad(program[name], loss=loss)(*fresh)
        else:
            out = program.call(name, *fresh)
            results[engine] = (out, program.uncall(name, *out))
    for engine in ENGINES[1:]:
        assert same(results["interp"], results[engine]), engine


EXAMPLES = [("fib", "rrfib", (0, 12), None), ("iexp", "iexp", (0.0, 1.3), "out"),
            ("besselj", "besselj", (0.0, 2, 1.0), "out"),
            ("besselj", "besselj_inplace", (0.0, 3, 2.5), "out"),
            ("complex_log", "complex_log", (0.1, 0.2, -1.0, 0.5), "y_im"),
            ("unitary", "givens", (np.arange(4.0), np.linspace(0, 1, 6)), (0, 1)),
            ("bennett", "bennett", (np.eye(1, 17)[0], 2, 0, 16), (0, 16))]


@pytest.mark.parametrize("module,name,args,loss", EXAMPLES, ids=[e[1] for e in EXAMPLES])
def test_examples_agree(module, name, args, loss):
    f = getattr(__import__(module), name)
    fresh = lambda: [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    out = {e: f(*fresh(), engine=e) for e in ENGINES}
    back = {e: (~f)(*out[e], engine=e) for e in ENGINES}
    grads = {e: rvm.grad(f, loss=loss, engine=e)(*fresh()) for e in ENGINES} \
        if loss is not None else {}
    for e in ENGINES[1:]:
        assert same(out["interp"], out[e]) and same(back["interp"], back[e]), e
        if grads:
            assert same(grads["interp"], grads[e]), e


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), args=st.tuples(*[st.integers(-9, 9)] * 3, *[
    st.integers(-16, 16).map(lambda k: k / 8) | st.just(-0.0)] * 3))
def test_random_programs_agree(seed, args):
    text = random_program(seed)
    results = []
    for engine in ("interp", "python"):
        p = rvm.assemble(text, f"gen{seed}.rasm")
        try:
            results.append(p.call("main", *args, engine=engine))
        except rvm.MachineError as e:
            results.append(type(e).__name__)
    assert results[0] == results[1] if isinstance(results[0], str) else \
        same(results[0], results[1])


def test_errors_are_reported_with_the_instruction_under_every_engine():
    p = rvm.assemble(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 0, b\n.end",
                     "t.rasm")
    for engine in ("interp", "python"):
        with pytest.raises(rvm.InvertibilityError) as err:
            p.call("f", -1, engine=engine)
        assert err.value.index == 2 and err.value.line == 4


def test_checks_off_skips_invertibility_checks():
    leaky = rvm.assemble(".func f(r0)\n ADD r1, r0\n.end")
    with pytest.raises(rvm.InvertibilityError):
        leaky.call("f", 3)
    assert leaky.call("f", 3, checks=False) == (3,)


def test_engine_selection():
    assert resolve_engine(None) == "auto"
    with pytest.raises(rvm.MachineError, match="unknown engine"):
        resolve_engine("gpu")
    if native.available:
        assert resolve_engine("native") == "native"
    else:
        with pytest.raises(rvm.MachineError, match="needs llvmlite"):
            resolve_engine("native")
    p = rvm.load(ROOT / "asm" / "fib.rasm", engine="interp")
    assert p.engine == "interp" and p.call("fib", 5, 0, 0) == (5, 5, 8)


NATIVE_CASES = [
    ("fib.rasm", "fib", (40, 0, 0), None), ("besselj.rasm", "besselj", (0.0, 2, 1.0), 0),
    ("poly.rasm", "f", (0.0, 1.0, 3.0), 0), ("iexp.rasm", "iexp", (0.0, 1.6), 0),
    ("reverse.rasm", "main", (7, 0), None),
    ("arrays.rasm", "dot", (np.arange(3.0), np.ones(3), 0.5), 2)]


@pytest.mark.skipif(not native.available, reason="llvmlite is missing: pip install rvm[fast]")
@pytest.mark.parametrize("file,name,args,loss", NATIVE_CASES, ids=[c[0] for c in NATIVE_CASES])
def test_native_engine_agrees(file, name, args, loss):
    results = {}
    for engine in ("interp", "native"):
        p = rvm.load(ROOT / "asm" / file, engine=engine)
        fresh = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        out = p.call(name, *fresh)
        back = p.uncall(name, *out)
        grads = rvm.grad(p[name], loss=loss)(*fresh) if loss is not None else None
        results[engine] = (out, back, grads)
    assert same(results["interp"], results["native"])


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_errors_fall_back_to_the_exact_report():
    p = rvm.assemble(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 0, b\n.end",
                     "t.rasm")
    with pytest.raises(rvm.InvertibilityError) as err:
        p.call("f", -1, engine="native")
    assert err.value.index == 2 and err.value.line == 4


def test_auto_engine_moves_to_native_code_with_use():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    m = rvm.Machine(p)
    assert m.engine == "auto"
    tiers = []
    for _ in range(5):
        m.enter("fib", 20, 0, 0)
        m.run()
        tiers.append(m._compiled.native)
        assert m.results() == (20, 6765, 10946)
    assert tiers[:3] == [False] * 3
    assert tiers[-1] is native.available       # native once llvmlite is there


def test_vmap_over_values_and_gradients():
    p = rvm.load(ROOT / "asm" / "iexp.rasm")
    xs = np.array([-1.0, 0.5, 2.0])
    outs, xs2 = rvm.vmap(p["iexp"], in_axes=(None, 0))(0.0, xs)
    assert np.allclose(outs, np.exp(xs), rtol=1e-14) and np.array_equal(xs2, xs)
    g = rvm.vmap(rvm.grad(p["iexp"], loss=0), in_axes=(None, 0))(0.0, xs)
    assert np.allclose(g[1], np.exp(xs), rtol=1e-12) and np.array_equal(g[0], [1.0] * 3)
    arrays = rvm.load(ROOT / "asm" / "arrays.rasm")
    batch = np.arange(6.0).reshape(2, 3)
    out = rvm.vmap(arrays["sumsq"], in_axes=(0, None))(batch, 0.0)
    assert np.array_equal(out[1], (batch ** 2).sum(axis=1)) and np.array_equal(out[0], batch)
    with pytest.raises(rvm.RvmError, match="same length"):
        rvm.vmap(p["iexp"])(np.zeros(2), np.ones(3))


def test_repeated_calls_reuse_one_machine():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    from rvm.engines.machine import machines
    p.call("fib", 5, 0, 0)
    mine = list(machines(p).values())
    p.call("fib", 6, 0, 0)
    assert list(machines(p).values()) == mine and len(mine) == 1
    with pytest.raises(rvm.MachineError):
        p.call("fib", 0, 0, 0, max_steps=1000)        # a failed run...
    assert p.call("fib", 7, 0, 0, max_steps=1000) == (7, 13, 21)   # ...leaves no trace


def test_push_pop_and_their_gradients_agree():
    p = rvm.assemble(".func t(r0, f0, f1)\n PUSH r0\n PUSH f0\n POP f2\n ADD.mul f1, f2, f2\n"
                     " PUSH f2\n POP f0\n POP r1\n SWAP r0, r1\n.end")
    for engine in ENGINES:
        assert p.call("t", 3, 1.5, 0.0, engine=engine) == (3, 1.5, 2.25)
        assert rvm.grad(p["t"], loss=2, engine=engine)(3, 1.5, 0.0) == (None, 3.0, 1.0)


def test_recursive_programs_never_run_natively():
    # native code has no recursion limit: a runaway recursion must raise, not crash
    fact = rvm.load(ROOT / "asm" / "fact.rasm")
    from rvm.engines.machine import recursive
    assert recursive(fact) and not recursive(rvm.load(ROOT / "asm" / "isqrt.rasm"))
    engine = "native" if native.available else "python"
    with pytest.warns(UserWarning, match="recursive") if native.available else \
            contextlib.nullcontext():
        assert fact.call("fact", 10, 0, engine=engine) == (10, 3628800)
    with pytest.raises(rvm.MachineError, match="call depth"):
        fact.call("fact", -1, 0, engine=engine)


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_every_instruction_compiles_natively_in_every_mode():
    """The LLVM back end lowers the generated code of every instruction form: no program
    falls back to the python engine (forwards, uncall, gradient)."""
    import warnings

    from test_transforms import FORMS, program
    ints = ["ADD r0, r1", "SUB.mul r0, r1, 3", "ADD.div r0, r1, 2", "ADD.mod r0, r1, 5",
            "XOR.and r0, r1, 6", "XOR.or r0, r1, 6", "XOR.lt r0, r1, 2", "ADD.abs r0, r1",
            "NEG r0", "INC r0", "DEC r0", "SWAP r0, r1"]
    for body in [b for b, _ in FORMS] + ints:
        n = 3 if body.startswith(("ROT", "IROT")) or body.count(",") == 2 else 2
        cls = "r" if body in ints else "f"
        p = rvm.assemble(f".func t({', '.join(f'{cls}{k}' for k in range(n))})\n"
                         f"    {body}\n.end\n", "t.rasm")
        args = [3] * n if cls == "r" else [1.25, 1.5, 0.5][:n]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = p.call("t", *args, engine="native")
            p.uncall("t", *out, engine="native")
            if cls == "f":
                rvm.grad(p["t"], loss=0, engine="native")(*args)
    assert program  # the forms come from the transform tests


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_code_is_cached_on_disk_across_processes(tmp_path):
    """A second process finds the programs' machine code in RVM_CACHE_DIR and does not
    compile it again: LLVM object files, one per group of entries made on first need
    (the gradient of each program, with the forward run it starts with, and the batch
    loop of the scalar one, made on its first rvm.vmap; numba is never imported); `rvm
    cache info|clear` show and empty the cache."""
    import os
    import subprocess
    import sys
    cache = tmp_path / "cache"
    script = ("import time, sys, rvm, numpy as np; p = rvm.load('asm/poly.rasm'); "
              "t = time.time(); g = rvm.grad(p['f'], loss=0, engine='native'); "
              "print(g(0.0, 1.0, 3.0)[1:]); print(time.time() - t); "
              "a = rvm.load('asm/arrays.rasm'); "
              "print(rvm.grad(a['sumsq'], loss=1, engine='native')(np.array([1.0, 2.0]), "
              "0.0)[0].tolist()); "
              "print(rvm.vmap(g, in_axes=(0, None, None))(np.zeros(3), 1.0, 3.0)[1].tolist()); "
              "print('numba' in sys.modules)")
    env = dict(os.environ, RVM_CACHE_DIR=str(cache))
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=600) for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "(660.0, 528.0)" and lines[2] == "[2.0, 4.0]"
        assert lines[3] == "[660.0, 660.0, 660.0]"
        assert lines[4] == "False"          # native code needs no numba at all
    first, second = (float(r.stdout.splitlines()[1]) for r in runs)
    assert second < first
    objects = sorted(cache.glob("rvm_llvm_*.o"))
    assert len(objects) == 3 and not list(cache.glob("rvm_native_*"))
    stamps = [p.stat().st_mtime_ns for p in objects]
    runs = [subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env)]
    assert [p.stat().st_mtime_ns for p in objects] == stamps       # not rewritten
    cli = [sys.executable, "-m", "rvm.cli", "cache"]
    info = subprocess.run(cli + ["info"], env=env, capture_output=True, text=True)
    assert "3 module(s)" in info.stdout
    cleared = subprocess.run(cli + ["clear"], env=env, capture_output=True, text=True)
    assert "removed 3" in cleared.stdout and not list(cache.glob("rvm_*"))


def test_without_a_writable_cache_native_code_compiles_in_memory(monkeypatch, tmp_path):
    from rvm.engines import cache
    monkeypatch.setenv("RVM_CACHE_DIR", "")
    assert cache.directory() is None
    assert cache.load_object("key", lambda: b"code") == b"code"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("RVM_CACHE_DIR", str(blocked / "sub"))
    assert cache.load_object("key", lambda: b"made") == b"made"


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_vmap_of_a_gradient_runs_the_batch_in_one_native_call():
    p = rvm.load(ROOT / "asm" / "iexp.rasm")
    g = rvm.grad(p["iexp"], loss=0, engine="native")
    xs = np.linspace(-1.0, 2.0, 50)
    batched = rvm.vmap(g, in_axes=(None, 0))(0.0, xs)
    assert batched[0].tolist() == [1.0] * 50
    assert np.allclose(batched[1], np.exp(xs), rtol=1e-12)
    rows = [g(0.0, x) for x in xs[:5]]
    assert np.array_equal(batched[1][:5], [r[1] for r in rows])
    vg = rvm.value_and_grad(p["iexp"], loss=0, engine="native")
    values, grads = rvm.vmap(vg, in_axes=(None, 0))(0.0, xs)
    assert np.allclose(values[0], np.exp(xs), rtol=1e-12) and np.array_equal(values[1], xs)
    assert np.array_equal(grads[1], batched[1])
    # a row that fails (x = 0 divides by zero in the series) falls back to the row-by-row
    # path, which reports it
    with pytest.raises(rvm.RvmError):
        rvm.vmap(g, in_axes=(None, 0))(0.0, np.array([1.0, 0.0, 2.0]))


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_vmap_with_the_default_engine_moves_to_the_native_loop(monkeypatch):
    """With engine auto the first runs are generated Python; once the program runs
    natively, rvm.vmap of a call, and of a forward-mode derivative, is one native loop."""
    from rvm.engines.machine import Machine
    loops = []
    batch = Machine.batch
    monkeypatch.setattr(Machine, "batch", lambda self, *a: loops.append(
        batch(self, *a)) or loops[-1])

    @rvm.reversible
    def cube(out: float, x: float):
        out += x * x * x
    xs = np.linspace(-1.0, 1.0, 30)
    for f, args, check in [
            (cube, (0.0, xs), lambda out: np.allclose(out[0], xs ** 3)),
            (rvm.tangent(cube), (0.0, xs, 0.0, 1.0), lambda out: np.allclose(out[2],
                                                                           3 * xs ** 2))]:
        mapped = rvm.vmap(f, in_axes=(None, 0) + (None,) * (len(args) - 2))
        loops.clear()
        for _ in range(3):
            assert check(mapped(*args))
        assert loops and loops[-1] is not None, f


@rvm.reversible
def scaled_square(out: float, x: float, k: int):
    """out += k x^2 (a scalar program: no heap)."""
    out += k * x * x


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_vmap_of_a_call_runs_the_batch_in_one_native_call(monkeypatch):
    """rvm.vmap of a program's function, of its inverse, and of a reversible function
    (machine options through functools.partial) runs one native loop over the rows, with
    the row-by-row results; a failing row falls back to the rows, which report it."""
    import functools

    from rvm.engines.machine import Machine
    loops = []
    batch = Machine.batch
    monkeypatch.setattr(Machine, "batch", lambda self, *a: loops.append(
        batch(self, *a)) or loops[-1])
    p = rvm.load(ROOT / "asm" / "poly.rasm", engine="native")
    xs, ys = np.linspace(-2.0, 2.0, 40), np.linspace(0.5, 3.0, 40)
    out = rvm.vmap(p["f"], in_axes=(None, 0, 0))(0.0, xs, ys)
    assert loops[-1] is not None and len(loops) == 1
    rows = [p.call("f", 0.0, x, y) for x, y in zip(xs, ys)]
    assert np.array_equal(out[0], [r[0] for r in rows]) and np.array_equal(out[1], xs)
    back = rvm.vmap(~p["f"])(out[0], xs, ys)
    assert loops[-1] is not None and np.allclose(back[0], 0.0, atol=1e-9)
    n = np.arange(-3, 5)
    done = rvm.vmap(functools.partial(scaled_square, engine="native"), in_axes=(None, 0, 0))(
        1.0, np.linspace(0, 1, 8), n)
    assert loops[-1] is not None and done[2].dtype == np.int64 and np.array_equal(done[2], n)
    assert np.array_equal(done[0], [scaled_square(1.0, x, int(k))[0]
                                    for x, k in zip(np.linspace(0, 1, 8), n)])
    with pytest.raises(rvm.InvertibilityError, match="not finite"):
        rvm.vmap(p["f"], in_axes=(None, 0, 0))(0.0, np.array([1.0, 2.0]),
                                                np.array([3.0, np.inf]))
    assert loops[-1] is None            # the loop failed; the rows found and reported it
    # a batch large enough to be split across threads: every row in its place
    xs, ys = np.linspace(-2.0, 2.0, 20_000), np.linspace(0.5, 3.0, 20_000)
    out = rvm.vmap(p["f"], in_axes=(None, 0, 0))(0.0, xs, ys)
    assert loops[-1] is not None
    assert np.allclose(out[0], ((xs + 1) * (2 * xs + ys * ys)) ** 2, rtol=1e-14, atol=0)
    # columns that would not convert exactly (unsigned, object) go row by row
    assert rvm.vmap(scaled_square, in_axes=(None, 0, 0))(
        0.0, np.ones(3), np.array([1, 2, 3], np.uint64))[0].tolist() == [1.0, 2.0, 3.0]


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_repeated_native_calls_go_straight_to_native_code():
    """After one call through a frame, calls of the same kind skip the machine; results,
    uncalls and errors are the same as the general path's."""
    p = rvm.load(ROOT / "asm" / "poly.rasm", engine="native")
    m = rvm.Machine(p, engine="native")
    first = m.call("f", 0.0, 1.0, 3.0)
    assert m._fast[("f", False, (float, float, float))] is not None
    assert m.call("f", 0.0, 1.0, 3.0) == first == (484.0, 1.0, 3.0)
    assert m.uncall("f", *first) == m.uncall("f", *first) == (0.0, 1.0, 3.0)
    with pytest.raises(rvm.InvertibilityError, match="not finite"):
        m.call("f", 0.0, 1.0, float("inf"))               # reported by the interpreter
    assert m.call("f", 0.0, 2.0, 3.0)[0] == ((2 + 1) * (4 + 9)) ** 2


@rvm.reversible
def scatter_add(out: Array[float], idx: Array[int], vals: Array[float], total: float):
    """out[idx[k]] += vals[k] (idx from data: a bad index fails at run time); the int
    array is rotated by one place, so int arrays are written too."""
    for k in range(len(vals)):
        out[idx[k]] += vals[k] * 2.0
        total += vals[k] * vals[k]
    with ancilla(t=0):
        t ^= idx[0]
        for k in range(1, len(idx)):
            idx[k - 1], idx[k] = idx[k], idx[k - 1]
        t ^= idx[len(idx) - 1]


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_repeated_native_calls_with_arrays_go_straight_to_native_code():
    """Calls and gradients with arrays on native code take a private heap after the first
    call: the same values and gradients as the interpreter's, int arrays written back,
    errors reported by the general path, and good calls after a failed one still right."""
    out, idx, vals = np.zeros(4), np.array([2, 0, 3]), np.array([0.5, -1.0, 2.0])
    want = scatter_add(out, idx, vals, 0.25, engine="interp")
    g = rvm.grad(scatter_add, loss="total", engine="native")
    g_want = rvm.grad(scatter_add, loss="total", engine="interp")(out, idx, vals, 0.25)
    for _ in range(3):
        got = scatter_add(out, idx, vals, 0.25, engine="native")
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(g(out, idx, vals, 0.25), g_want):
            np.testing.assert_array_equal(a, b)
    assert got[1].tolist() == [0, 3, 2] and idx.tolist() == [2, 0, 3]
    # rvm.grad runs forwards and back in one native call; value_and_grad keeps the values
    vg = rvm.value_and_grad(scatter_add, loss="total", engine="native")
    for _ in range(3):
        values, grads = vg(out, idx, vals, 0.25)
        for a, b in zip(values, want):
            np.testing.assert_array_equal(a, b)
        for a, b in zip(grads, g_want):
            np.testing.assert_array_equal(a, b)
    # a gradient function built for one call answers from the run that planned it
    once = rvm.grad(scatter_add, loss="total", engine="native")(out, idx, vals, 0.25)
    for a, b in zip(once, g_want):
        np.testing.assert_array_equal(a, b)
    from rvm.engines.machine import machine_for
    program, name, _ = scatter_add.specialize((out, idx, vals, 0.25))
    plans = machine_for(program, engine="native")._fast
    assert any(f is not None for (n, _, _), f in plans.items() if n == name)   # planned
    e = rvm.grad(scatter_add, loss=(0, 2), engine="native")(out, idx, vals, 0.25)
    np.testing.assert_array_equal(e[2], [2.0, 0.0, 0.0])
    bad = np.array([2, 7, 3])
    with pytest.raises(rvm.RvmError, match=r"the index idx\[k\] = 7 is outside out"):
        scatter_add(out, bad, vals, 0.25, engine="native")
    with pytest.raises(rvm.RvmError, match="is outside out"):
        g(out, bad, vals, 0.25)
    for a, b in zip(scatter_add(out, idx, vals, 0.25, engine="native"), want):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(g(out, idx, vals, 0.25)[2], g_want[2])


def test_vmap_on_a_dask_cluster():
    """Each chunk is a batch on one of two workers of a LocalCluster started here; the
    results are dask arrays equal to the local batch."""
    distributed = pytest.importorskip("dask.distributed")
    import dask.array as da
    from dask_gradients import loss, per_sample_gradients
    rng = np.random.default_rng(1)
    xs_np = rng.normal(size=1000)
    xs = da.from_array(xs_np, chunks=300)                 # four chunks
    ys = da.tanh(0.7 * xs)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster):
        grads = per_sample_gradients(0.5, xs, ys)
        assert isinstance(grads, da.Array) and grads.numblocks == (4,)
        got = grads.compute()
    g = rvm.grad(loss, loss="out")
    want = [g(0.0, 0.5, x, np.tanh(0.7 * x))[1] for x in xs_np[:20]]
    assert np.allclose(got[:20], want, rtol=1e-12) and got.shape == (1000,)
    with pytest.raises(rvm.UsageError, match="unknown backend"):
        rvm.vmap(g, backend="spark")


def test_native_runs_grow_the_heap_instead_of_falling_back():
    """A native run that needs more heap than the machine has grows it and runs natively
    again (the interpreter, which counts steps, is not used)."""
    pytest.importorskip("llvmlite")
    text = """
.func f(f0, r0)
        ALLOC r1, r0
        EXCH f0, [r1 + 4000]
        EXCH f0, [r1 + 4000]
        FREE r1, r0
.end
"""
    prog = rvm.assemble(text, "grow.rasm")
    m = rvm.Machine(prog, engine="native")
    m.enter("f", 1.5, 5000)
    assert m.run() == 0            # ran natively: the interpreter would return its steps
    assert m.results() == (1.5, 5000) and m.cap >= 5000


REPEATED_CHECKS = """
.func f(r0, r1, f0)
        ASSERT.LT r0, r1
        ADD     f0, r0
        ASSERT.LT r0, r1
        INC     r0
        ASSERT.LT r0, r1
.end
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_check_repeated_on_unchanged_registers_is_made_once(engine):
    """Compiled code drops an ASSERT that repeats one made in the same block on registers
    nothing has changed since (the second line), never one after a change (the third)."""
    from rvm.engines.compiled import Compiled
    p = rvm.assemble(REPEATED_CHECKS, "checks.rasm")
    for mode in ("fw", "bw"):
        assert Compiled(p).bodies[f"F0_{mode}"].count("assertion r0 < r1") == 2
    assert p.call("f", 0, 2, 0.5, engine=engine) == (1, 2, 0.5)
    with pytest.raises(rvm.RvmError, match="r0 < r1"):
        p.call("f", 1, 2, 0.5, engine=engine)
    assert p.uncall("f", 1, 2, 0.5, engine=engine) == (0, 2, 0.5)
    with pytest.raises(rvm.RvmError, match="r0 < r1"):
        p.uncall("f", 2, 2, 0.5, engine=engine)


# ------------------------------------------------------------------ counted loops
# The python engine runs a block that loops onto itself with a counter stepping by one
# as a Python for loop, after testing on entry what the general loop tests per pass.
COUNTED = """
.func up(r0, r1, f0, f1)       ; r1 counts up to r0; f1 += f0 * (count), f0 += sin f1
top:    CF.NE  r1, 0, back
        ADD.mul f1, f0, 0.5
        ADD.sin f0, f1
        INC    r1
exit:   BR.EQ  r1, r0, done
back:   JMP    top
done:   CF     exit
.end
.func down(r0, r2, f0)         ; r1 counts from r0 down to 0; r2 += r1 before each step
        ADD    r1, r0
top:    CF.LT  r1, r0, back
        ADD    r2, r1
        SUB    r1, 1
        MUL    f0, 1.25
back:   BR.NE  r1, 0, top
.end
.func first(r0, r1, r2)        ; the back edge's check fails on the first pass
top:    CF.LT  r1, r2, back
        INC    r1
exit:   BR.EQ  r1, r0, done
back:   JMP    top
done:   CF     exit
.end
.func upto(r0, r2)             ; r1 counts up while r1 <= r0: r2 += r1 after each step
top:    CF.NE  r1, 0, back
        INC    r1
        ADD    r2, r1
back:   BR.LE  r1, r0, top
        SUB    r1, r0
        SUB    r1, 1
.end
"""


def outcome(thunk):
    try:
        return thunk()
    except rvm.RvmError as e:
        return type(e).__name__, str(e)


def engines_agree(program, name, args, loss=None, **options):
    """call, uncall of its results and (with loss) the gradient agree on every engine,
    results or errors alike (the same error, found by the same instruction)."""
    def run(engine):
        out = outcome(lambda: program.call(name, *args, engine=engine, **options))
        back = outcome(lambda: program.uncall(name, *out, engine=engine, **options)) \
            if isinstance(out, tuple) and not isinstance(out[0], str) else None
        grad = outcome(lambda: rvm.grad(program[name], loss=loss, engine=engine, **options)(
            *args)) if loss is not None else None
        return out, back, grad
    seen = {engine: run(engine) for engine in ENGINES}
    for engine in ENGINES[1:]:
        for a, b in zip(seen["interp"], seen[engine]):
            assert a == b if a is None or isinstance(a[0], str) else same(a, b), \
                (engine, a, b)
    return seen["interp"]


def test_counted_loops_agree_with_the_interpreter():
    p = rvm.assemble(COUNTED, "counted.rasm")
    out, back, _ = engines_agree(p, "up", (5, 0, 0.5, 1.0), loss="f0")
    assert out[:2] == (5, 5) and back == (5, 0, 0.5, 1.0)
    assert engines_agree(p, "down", (7, 0, 1.0), loss="f0")[0] == (7, 28, 1.25 ** 7)
    assert engines_agree(p, "upto", (3, 0))[0] == (3, 1 + 2 + 3 + 4)
    assert engines_agree(p, "up", (1, 0, 0.5, 1.0), loss="f1")[0][1] == 1   # one pass
    # the python engine's loops: a loop variable only where the body reads the counter
    from rvm.engines.compiled import compiled
    source = compiled(p).source
    fw = {name: source[source.index(f"def {compiled(p).name(name, 'fw')}("):]
          for name in ("up", "down", "upto")}
    assert "for _ in _repeat(None, (r0 - r1)):" in fw["up"].split("def ")[1]
    assert "for _ in _repeat(None, " in fw["down"].split("def ")[1]
    assert "for r1 in range(r1 + 1, " in fw["upto"].split("def ")[1]


def test_a_counted_loop_fails_where_the_general_loop_would():
    p = rvm.assemble(COUNTED, "counted.rasm")
    out = engines_agree(p, "first", (5, 0, 0))[0]
    assert out[0] == "InvertibilityError" and "comefrom" in out[1]
    # the counter starts past its end: the loop wraps around the int64 range
    out = engines_agree(p, "up", (-3, 0, 0.5, 1.0), max_steps=10_000)[0]
    assert out[0] == "MachineError" and "budget" in out[1]
    # r1 <= INT64_MAX always holds: the counter wraps, and the budget runs out
    big = 2 ** 63 - 1
    assert engines_agree(p, "upto", (big, 0), max_steps=10_000)[0][0] == \
        "MachineError"
    # a trip count far past the budget: refused on entry, not after 10^12 passes
    assert engines_agree(p, "up", (10 ** 12, 0, 0.5, 1.0), max_steps=10_000)[0][0] == \
        "MachineError"
    # the loop's steps exactly fill the budget, and one step fewer
    steps = rvm.Machine(p, engine="interp")
    steps.enter("up", 40, 0, 0.5, 1.0)
    need = steps.run(1)
    assert isinstance(engines_agree(p, "up", (40, 0, 0.5, 1.0), max_steps=need)[0][0], int)
    assert engines_agree(p, "up", (40, 0, 0.5, 1.0), max_steps=need - 1)[0][0] == \
        "MachineError"


def test_a_counted_loop_reports_a_float_that_stops_being_finite():
    p = rvm.assemble("""
.func grow(r0, f0, f1)
top:    CF.NE  r1, 0, back
        ADD.mul f1, f0, f0
        SWAP   f0, f1
        INC    r1
exit:   BR.EQ  r1, r0, done
back:   JMP    top
done:   CF     exit
        SUB    r1, r0
.end
""", "grow.rasm")
    assert engines_agree(p, "grow", (5, 2.0, 0.0))[0][1] > 0
    out = engines_agree(p, "grow", (40, 2.0, 0.0))[0]     # 2 ** (2 ** 40) overflows
    assert out[0] == "InvertibilityError" and "not finite" in out[1]


ROW = """
.func row(r1, r3, r6, f0, f1)   ; f1 += cells r3 * r1 .. r3 * r1 + r1 - 1 of 12 (f0 in 9)
        ALLOC  r4, 12
        EXCH   f0, [r4 + 9]
top:    CF.NE  r7, 0, back
        ADD.mul r8, r3, r1      ; the frontend's element address: made, used, unmade
        ADD    r8, r7
        ASSERT.GE r6, 0         ; a second index, two per pass
        ASSERT.LT r6, 24
        ADDM   f1, [r4 + r8]
        SUB    r8, r7
        SUB.mul r8, r3, r1
        ADD    r6, 2
        INC    r7
exit:   BR.EQ  r7, r1, done
back:   JMP    top
done:   CF     exit
        SUB    r7, r1
        EXCH   f0, [r4 + 9]
        FREE   r4, 12
.end
"""


def test_checks_on_addresses_a_pass_makes_and_unmakes_are_made_once():
    """The frontend's element addresses live in registers made and unmade around each
    access, and a second index may step beside the counter: their checks depend on the
    pass only through affine functions of it, so a counted loop makes them on entry, for
    the first and last passes; a check that would fail on some pass (or values past the
    int64 range, which registers wrap) sends the run down the general loop, which stops
    where the interpreter stops."""
    p = rvm.assemble(ROW, "row.rasm")
    from rvm.engines.compiled import compiled
    source = compiled(p).source
    loop = source[source.index("for _ in _repeat("):]
    loop = loop[:loop.index("else:")]
    assert "outside the heap" not in loop and "assertion" not in loop
    assert engines_agree(p, "row", (4, 2, 0, 1.5, 0.0), loss="f1")[0] == \
        (4, 2, 8, 1.5, 1.5)
    for args in [(4, 3, 0, 1.5, 0.0),       # the whole row outside the heap
                 (5, 2, 0, 1.5, 0.0),       # its third element
                 (4, 2, 20, 1.5, 0.0),      # the second index on the third pass
                 (4, -1, 0, 1.5, 0.0),      # a negative address
                 (4, 2, -2, 1.5, 0.0)]:     # the second index on the first pass
        assert engines_agree(p, "row", args, loss="f1")[0][0] == "InvertibilityError", args
    # r3 * r1 = 2 ** 64 wraps to 0: the interpreter reads row 0, and so does every engine
    assert engines_agree(p, "row", (4, 2 ** 62, 0, 1.5, 0.0), loss="f1")[0] == \
        (4, 2 ** 62, 8, 1.5, 0.0)
    assert engines_agree(p, "row", (4, 2 ** 62 + 2, 0, 1.5, 0.0))[0][4] == 1.5


COLUMN = """
.func column(r0, r1, r3, f0, f1) ; f1 += cells r3, r3 + r1, ... (r0 of them) of 12 (f0 in 9)
        ALLOC  r4, 12
        EXCH   f0, [r4 + 9]
top:    CF.NE  r7, 0, back
        ADD.mul r8, r7, r1      ; element [r7, r3] of rows r1 long: the counter times a
        ADD    r8, r3           ; register the loop leaves alone
        ADDM   f1, [r4 + r8]
        SUB    r8, r3
        SUB.mul r8, r7, r1
        INC    r7
exit:   BR.EQ  r7, r0, done
back:   JMP    top
done:   CF     exit
        SUB    r7, r0
        EXCH   f0, [r4 + 9]
        FREE   r4, 12
.end
"""


def test_checks_on_a_column_walk_are_made_once():
    """An address that moves by a register the loop leaves alone on each pass (down a
    column: the counter times the row length) is still affine in the pass, so a counted
    loop checks it on entry for the first and last passes; one that leaves the heap on
    some pass, or whose values pass the int64 range, goes down the general loop and
    stops where the interpreter stops."""
    p = rvm.assemble(COLUMN, "column.rasm")
    from rvm.engines.compiled import compiled
    source = compiled(p).source
    loop = source[source.index("for _ in _repeat("):]
    loop = loop[:loop.index("else:")]
    assert "outside the heap" not in loop
    assert engines_agree(p, "column", (4, 3, 0, 1.5, 0.0), loss="f1")[0] == \
        (4, 3, 0, 1.5, 1.5)
    assert engines_agree(p, "column", (4, -3, 9, 1.5, 0.0), loss="f1")[0] == \
        (4, -3, 9, 1.5, 1.5)                # up the column: the slope may be negative
    assert engines_agree(p, "column", (3, 4, 1, 1.5, 0.0), loss="f1")[0] == \
        (3, 4, 1, 1.5, 1.5)
    for args in [(5, 3, 0, 1.5, 0.0),       # the fifth element past the heap
                 (4, 3, -1, 1.5, 0.0),      # the first before it
                 (5, -3, 9, 1.5, 0.0),      # the fifth, going up
                 (4, 2 ** 62, 0, 1.5, 0.0),  # the products wrap around int64
                 (4, 2 ** 63 - 1, 3, 1.5, 0.0)]:
        assert engines_agree(p, "column", args, loss="f1")[0][0] == "InvertibilityError", \
            args


def test_a_counted_loop_that_stores_a_float_that_is_not_finite_still_fails():
    """Native code tests the floats a counted loop stores in the heap once, after the
    loop (no branch in it), where no float becomes an int in the loop; the run fails all
    the same, with the interpreter's error. A loop that makes an int of a float tests
    each store in place."""
    p = rvm.assemble("""
.func scale(r1, f0, f1)        ; cells 0 .. r1 - 1 of 8 get f0 * f0; f1 += cell 3
        ALLOC  r4, 8
top:    CF.NE  r7, 0, back
        EXCH   f2, [r4 + r7]
        ADD.mul f2, f0, f0
        EXCH   f2, [r4 + r7]
        INC    r7
exit:   BR.EQ  r7, r1, done
back:   JMP    top
done:   CF     exit
        ADDM   f1, [r4 + 3]
top2:   CF.NE  r7, r1, back2
        DEC    r7
        EXCH   f2, [r4 + r7]
        SUB.mul f2, f0, f0
        EXCH   f2, [r4 + r7]
exit2:  BR.EQ  r7, 0, done2
back2:  JMP    top2
done2:  CF     exit2
        FREE   r4, 8
.end
.func sign(r1, r2, f0)         ; r2 counts the cells whose value is above f0
        ALLOC  r4, 8
top:    CF.NE  r7, 0, back
        EXCH   f2, [r4 + r7]
        ADD    f2, f0
        XOR.gt r2, f2, 1.0
        EXCH   f2, [r4 + r7]
        INC    r7
exit:   BR.EQ  r7, r1, done
back:   JMP    top
done:   CF     exit
        SUB    r7, r1
.end
""", "scale.rasm")
    from rvm.engines.compiled import compiled
    source = compiled(p, True, native=True).native_bodies
    scale, sign = source.split("def F1_fw")[0], source.split("def F1_fw")[1]
    sign = sign.split("def ")[0]
    assert "_finite_after(range(" in scale and "_finite_after(" not in sign
    assert "for _ in _passes(range(" in sign
    out = engines_agree(p, "scale", (8, 1e200, 0.0))[0]
    assert out[0] == "InvertibilityError" and "not finite" in out[1], out
    assert engines_agree(p, "scale", (8, 2.0, 0.0), loss="f1")[0] == (8, 2.0, 4.0)


def _split_point(f, *args):
    """Where a reversible function's split forward run stops, for these arguments' types
    (rvm.engines.compiled.split_point), or None."""
    from rvm.engines.compiled import split_point
    p, name, _ = f.specialize(args)
    return split_point(p, p.functions[name])


def test_a_gradient_starts_from_the_copy_and_still_checks_the_uncompute():
    """The value and gradient of a compute-copy-uncompute function (python and native
    engines) runs forwards to the copy and starts the gradient pass there (no uncompute,
    no recompute): the same gradients, and the gradient pass's last part is the
    uncompute, so a residue it leaves in an ancilla is still an error."""
    @rvm.reversible
    def scaled(out: float, x: float, y: float):
        with ancilla(t=0.0):
            with compute() as c:
                t += x
                t *= y
            out += t
            ~c

    @rvm.reversible
    def rescales(out: float, x: float, y: float):     # the copy changes what ~c reads
        with ancilla(t=0.0):
            with compute() as c:
                t += x
                t *= y
            out += t
            y *= 1.0
            ~c

    @rvm.reversible
    def in_place(out: float, x: float):                # ~c changes a parameter back
        with compute() as c:
            x *= 2.0
        out += x
        ~c
    assert _split_point(scaled, 0.0, 1.0, 2.0) == 4    # ZERO t; t += x; t *= y | out += t
    assert _split_point(rescales, 0.0, 1.0, 2.0) is None
    assert _split_point(in_place, 0.0, 1.0) is None
    from rvm.engines.compiled import compiled
    p, name, _ = scaled.specialize((0.0, 1.0, 2.0))
    assert compiled(p, True, True).splits == {name: 4}       # fws returns out, x, y, t
    for f, args in ((scaled, (0.0, 1.5, 1.1)), (rescales, (0.0, 1.5, 1.1)),
                    (in_place, (0.0, 1.5))):
        want = rvm.value_and_grad(f, loss="out", engine="interp")(*args)
        assert rvm.value_and_grad(f, loss="out", engine="native")(*args) == want
        batch = rvm.vmap(rvm.grad(f, loss="out", engine="native"),
                         in_axes=(None,) + (0,) * (len(args) - 1))
        rows = batch(0.0, *(np.full(3, a) for a in args[1:]))
        assert all(np.array_equal(r, np.full(3, w)) for r, w in zip(rows[1:], want[1][1:]))
    # (1e12 * 1.1) / 1.1 is 1e12 - 1.2e-4: t is not back to zero
    with pytest.raises(rvm.InvertibilityError, match="t"):
        scaled(0.0, 1e12, 1.1, engine="native")
    for engine in ("python", "native"):
        with pytest.raises(rvm.InvertibilityError, match="t"):
            rvm.value_and_grad(scaled, loss="out", engine=engine)(0.0, 1e12, 1.1)
    with pytest.raises(rvm.RvmError):
        rvm.vmap(rvm.grad(scaled, loss="out", engine="native"), in_axes=(None, 0, 0))(
            0.0, np.full(3, 1e12), np.full(3, 1.1))


@rvm.reversible
def _with_arrays(out: float, x: Array[float], w: Array[float, 2], reps: int):
    with ancilla(t=zeros(len(x)), s=0.0):
        with compute() as pre:
            for _ in range(reps):           # a long compute block, a short copy
                for i in range(len(x)):
                    t[i] += x[i] * x[i] + w[i, 0]
            s += exp(t[0])
        for i in range(len(x)):
            out += t[i] * w[i, 1] + s
        ~pre


@rvm.reversible
def _copy_writes_the_array(out: float, x: Array[float]):   # the copy changes what ~c reads
    with ancilla(t=zeros(len(x))):
        with compute() as c:
            t[0] += x[0] * x[1]
        out += t[0]
        t[0] += 1.0
        t[0] -= 1.0
        ~c


@rvm.reversible
def _uncompute_writes_an_argument(out: float, x: Array[float]):
    with compute() as c:
        x[0] *= 2.0
    out += x[0] * x[1]
    ~c


@rvm.reversible
def _reuses_a_counter(out: float, x: Array[float], n: int):  # B changes k and restores it
    with ancilla(k=0, t=zeros(2)):
        with compute() as c:
            k += n
            t[0] += x[0] * k
        k += 1
        out += t[0] * x[1]
        k -= 1
        ~c


def test_a_gradient_with_arrays_starts_from_the_copy():
    """A compute-copy-uncompute function with ancilla arrays (allocated before the
    compute block, freed after the uncompute): its value and gradient on the native
    engine run forwards to the copy, leaving the arrays allocated, and start the gradient
    pass there: the same values (arrays included) and gradients as the interpreter's four passes, on
    every engine and array path; a copy that exchanges into an array the uncompute reads,
    or an uncompute that changes an argument, is not split; a register the copy and the
    uncompute share is checked around the copy (here it is not zero: the general path
    answers); a residue the uncompute leaves is still an error."""
    from rvm.engines.compiled import compiled
    x, w = np.array([0.3, -0.2, 0.5]), np.array([[0.1, 1.5], [0.2, -0.7], [0.3, 0.4]])
    args = (0.0, x, w, 20)
    assert _split_point(_with_arrays, *args) is not None
    p, name, _ = _with_arrays.specialize(args)
    assert name in compiled(p, True, True).splits
    want = rvm.value_and_grad(_with_arrays, loss="out", engine="interp")(*args)
    for engine in ("python", "native"):
        vg = rvm.value_and_grad(_with_arrays, loss="out", engine=engine)
        for _ in range(2):          # planned, then the direct path
            assert same(vg(*args), want), engine
        g = rvm.grad(_with_arrays, loss="out", engine=engine)
        for _ in range(2):
            assert same(g(*args), want[1]), engine
    # the native functions a gradient asks for: the split ones, and the fused entry
    # (forwards and back in one call) made of them
    from rvm.engines import llvm
    asked, made = [], {}

    def spy(self, key):
        asked.append(key)
        return dict.__getitem__(self, key)

    def functions(source, fused, *a, **k):
        made.update(fused)
        return real(source, fused, *a, **k)
    real = llvm.functions
    comp = compiled(p, True, True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native.Functions, "__getitem__", spy, raising=False)
        mp.setattr(llvm, "functions", functions)
        for _ in range(2):
            assert same(rvm.value_and_grad(_with_arrays, loss="out", engine="native")(*args),
                        want)
        native.Functions(comp, 1e-9)[comp.name(name, "vg")]
    assert {comp.name(name, "fws"), comp.name(name, "gbws")} <= set(asked)
    # (the last: the instructions from the uncompute on, for the budget's test)
    assert made[comp.name(name, "vg")] == (comp.name(name, "fws"), comp.name(name, "gbws"),
                                           False, comp.splits[name],
                                           len(p.functions[name].code) -
                                           comp.split_at[name][1])
    vector = (0.0, np.array([0.5, 3.0]))
    assert _split_point(_copy_writes_the_array, *vector) is None
    assert _split_point(_uncompute_writes_an_argument, *vector) is None
    assert _split_point(_reuses_a_counter, *vector, 3) is not None
    for f, a in ((_copy_writes_the_array, vector), (_uncompute_writes_an_argument, vector),
                 (_reuses_a_counter, vector + (3,))):
        want = rvm.value_and_grad(f, loss="out", engine="interp")(*a)
        for _ in range(2):
            assert same(rvm.value_and_grad(f, loss="out", engine="native")(*a), want), f
    # (1e12 * 1.1) / 1.1 is 1e12 - 1.2e-4: t[0] is not back to zero when it is freed
    assert _split_point(_scaled_in_array, 0.0, 1e12, 1.1) is not None
    want = rvm.value_and_grad(_scaled_in_array, loss="out", engine="interp")(0.0, 1.5, 1.1)
    for engine in ("python", "native"):
        for _ in range(2):
            assert same(rvm.value_and_grad(_scaled_in_array, loss="out", engine=engine)(
                0.0, 1.5, 1.1), want)
    for engine in ("python", "native"):
        with pytest.raises(rvm.InvertibilityError):
            rvm.value_and_grad(_scaled_in_array, loss="out", engine=engine)(0.0, 1e12, 1.1)


@rvm.reversible
def _scaled_in_array(out: float, x: float, y: float):
    with ancilla(t=zeros(1)):
        with compute() as c:
            t[0] += x
            t[0] *= y
        out += t[0]
        ~c


@rvm.reversible
def _fill(t: Array[float], x: Array[float], y: float):
    for i in range(len(x)):
        t[i] += x[i] * y
        if (x[i] > 0.0, x[i] > 0.0):
            t[i] += sin(x[i])
        else:
            t[i] -= y * y


@rvm.reversible
def _array_calls(out: float, x: Array[float], y: float):
    with ancilla(t=zeros(len(x)), u=zeros(2), s=0.0):
        with compute() as c:
            _fill(t, x, y)
            for i in range(len(x)):
                u[i % 2] += t[i] * t[i]
            s += exp(u[0]) + u[1]
        for i in range(len(x)):
            out += t[i] * s
        out += u[1] * y
        ~c


@settings(max_examples=15, deadline=None)
@given(x=st.lists(st.integers(-32, 32).map(lambda k: k / 16), min_size=1, max_size=5),
       y=st.floats(-1.5, 1.5).filter(lambda v: v == 0.0 or abs(v) > 1e-6),
       reps=st.integers(0, 3))
def test_split_gradients_with_arrays_agree_with_the_interpreter(x, y, reps):
    """Value and gradient of compute-copy-uncompute functions with ancilla arrays (filled
    by a callee, with branches and loops) on the native engine, which starts the gradient
    pass at the copy with the arrays still allocated, against the interpreter's four
    passes: the same values, arrays included, and gradients (up to the rounding that the
    four passes' rebuilt states carry: x = [-0.5, 0], y = 0, reps = 3 gives 2.2e-16 there
    where the split gives 0). (Values whose products are subnormal are left out: a heap
    cell left holding a subnormal residue is refused when freed, by design; an ancilla
    left holding a residue past tol, such as exp(29.9)'s last place in `s`, is refused by
    both.)"""
    xs = np.array(x)
    w = np.stack([xs, xs[::-1] * 0.5], axis=1)
    for f, args in ((_array_calls, (0.0, xs, y)), (_with_arrays, (0.0, xs, w, reps))):
        assert _split_point(f, *args) is not None, f.name
        run = rvm.value_and_grad(f, loss="out", engine="native")
        try:
            want = rvm.value_and_grad(f, loss="out", engine="interp")(*args)
        except rvm.InvertibilityError as e:
            for _ in range(2):
                with pytest.raises(rvm.InvertibilityError) as got:
                    run(*args)
                assert str(got.value) == str(e)
            continue
        for _ in range(2):          # the general path's plan, then the direct one
            got = run(*args)
            for a, b in zip(got[0] + got[1], want[0] + want[1]):
                assert (a is None) == (b is None), f.name
                if b is not None:
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=f.name)


@rvm.reversible
def _square_into(out: float, x: float):
    out += x * x


@rvm.reversible
def _branchy(out: float, x: float, y: float):
    with ancilla(a=0.0, b=0.0):
        with compute() as c:
            a += x * y
            if (a > 0.0, a > 0.0):
                b += sin(a) * y
            else:
                b += exp(a) - y
        out += b * b + a
        ~c


@rvm.reversible
def _looped(out: float, x: float, n: int):
    with ancilla(t=0.0, s=0.0):
        with compute() as c:
            t += x
            for i in range(n):
                s += t * t / (1.0 + i)
        out += s * x
        ~c


@rvm.reversible
def _calls(out: float, x: float, y: float):
    with ancilla(a=0.0):
        with compute() as c:
            _square_into(a, x)
            a += y
        out += a * y
        ~c


@settings(max_examples=25, deadline=None)
@given(x=st.floats(-2.0, 2.0), y=st.floats(-2.0, 2.0), n=st.integers(0, 5))
def test_split_gradients_agree_with_the_interpreter(x, y, n):
    """Value and gradient of compute-copy-uncompute functions (branches, loops, calls in
    the compute block) on the python and native engines, which start the gradient pass at
    the copy, against the interpreter's four passes; one at a time and as a batch."""
    for f, args in ((_branchy, (0.0, x, y)), (_looped, (0.0, x, n)), (_calls, (0.0, x, y))):
        assert _split_point(f, *args) is not None, f.name
        want = rvm.value_and_grad(f, loss="out", engine="interp")(*args)
        for engine in ("python", "native"):
            assert same(rvm.value_and_grad(f, loss="out", engine=engine)(*args), want)
            rows = rvm.vmap(rvm.grad(f, loss="out", engine=engine),
                            in_axes=(None,) + (0,) * (len(args) - 1))(
                0.0, *(np.full(2, a) for a in args[1:]))
            assert all(same(float(r[0]), w) for r, w in zip(rows[1:], want[1][1:])
                       if w is not None), engine


EXACT = """
.func once(f0, f1)
        ALLOC  r0, 1
        EXCH   f1, [r0]
        ADDM   f2, [r0]
        ADD.atan2 f0, f2, -1.0
        SUBM   f2, [r0]
        EXCH   f1, [r0]
        FREE   r0, 1
.end

.func loop(r2, f0, f1)
        ALLOC  r0, 1
        EXCH   f1, [r0]
top:    CF.NE  r1, 0, back
        ADDM   f2, [r0]
        ADD.atan2 f0, f2, -1.0
        SUBM   f2, [r0]
        ADD    r1, 1
exit:   BR.EQ  r1, r2, done
back:   JMP    top
done:   CF     exit
        SUB    r1, r2
        EXCH   f1, [r0]
        FREE   r0, 1
.end
"""


def native_fw(p, name: str) -> str:
    from rvm.engines.compiled import compiled
    source = compiled(p, native=True).native_bodies
    return source[source.index(f"def {compiled(p).name(name, 'fw')}("):].split("\ndef ")[0]


def test_reads_into_a_zero_register_keep_every_bit():
    """Native code writes a read into a register known to be +0.0 as the cell, made
    `0.0 + cell` before a use that could tell -0.0 from +0.0 (here atan2), and its removal
    as `cell - cell` (no chain from one pass of a loop to the next): the same values bit
    for bit, the sign of a zero and a non-finite cell included."""
    p = rvm.assemble(EXACT, "exact.rasm")
    for name in ("once", "loop"):
        fw = native_fw(p, name)
        assert "f2 = M.hf[_a]" in fw and "f2 = 0.0 + f2" in fw, fw
        assert "f2 = (M.hf[_a]) - (M.hf[_a])" in fw, fw
    # a copy of the cell would give f2 = -0.0 and atan2(-0.0, -1) = -pi
    out = engines_agree(p, "once", (0.0, -0.0), loss="f0")[0]
    assert out[0] == math.pi and math.copysign(1.0, out[1]) == -1.0
    out = engines_agree(p, "loop", (3, 0.0, -0.0), loss="f0")[0]
    assert out[1] == pytest.approx(3 * math.pi)
    out = engines_agree(p, "loop", (3, 0.0, math.inf))[0]
    assert out[0] == "InvertibilityError" and "not finite" in out[1]


RAW = """
.func dot(r2, f0, f4, f5)       ; f0 += sum of cell0 * cell1 over r2 passes, f4 and f5 the
        ALLOC  r0, 2            ; cells; f3 (a local: +0.0) the same sum
        EXCH   f4, [r0]
        EXCH   f5, [r0 + 1]
top:    CF.NE  r1, 0, back
        ADDM   f1, [r0]
        ADDM   f2, [r0 + 1]
        ADD.mul f0, f1, f2
        ADD.mul f3, f2, f1
        SUBM   f2, [r0 + 1]
        SUBM   f1, [r0]
        ADD    r1, 1
exit:   BR.EQ  r1, r2, done
back:   JMP    top
done:   CF     exit
        SUB    r1, r2
        EXCH   f5, [r0 + 1]
        EXCH   f4, [r0]
        FREE   r0, 2
        ADD.atan2 f5, f0, -1.0
        ADD.atan2 f0, f3, -1.0
.end
"""


@pytest.mark.parametrize("sum0", [0.0, -0.0, 1.0])
@pytest.mark.parametrize("passes", [1, 9])
@pytest.mark.parametrize("cells", [(-0.0, 2.0), (0.0, -2.0), (-0.0, -0.0), (3.0, 0.5),
                                   (math.inf, 1.0)])
def test_raw_reads_in_products_keep_every_bit(sum0, passes, cells):
    """A cell read into a zero register stays as read where it is only a factor of a
    product added to a sum that cannot hold -0.0 (a local from +0.0; a parameter a
    counted loop tests on entry): the zero signs the interpreter has, everywhere (atan2
    of the sums tells them apart)."""
    p = rvm.assemble(RAW, "raw.rasm")
    fw = native_fw(p, "dot")
    assert "_plus(f0)" in fw and "f1 = M.hf[_a]" in fw, fw
    engines_agree(p, "dot", (passes, sum0, *cells), loss="f5")


FINITE = """
.func stash(f0, f1)
        ALLOC  r0, 1
        ADD.mul f1, f0, f0
        EXCH   f1, [r0]
        EXCH   f1, [r0]
        SUB.mul f1, f0, f0
        FREE   r0, 1
.end
.func spill(r0, r1, f0)
        ADD.mul f1, f0, f0
        EXCH   f1, [r0]
.end
.func hidden(f0, f1, f2)
        SUB.mul f2, f0, f0
        ADD.exp f1, f2
        ADD.mul f2, f0, f0
.end
.func creep(r0, f1, f2)
top:    CF.NE  r0, 0, back
        ADD    f1, f2
        INC    r0
exit:   BR.GE  f1, 10.0, done
back:   JMP    top
done:   CF     exit
.end
"""


def test_a_float_that_stops_being_finite_is_reported_on_every_engine():
    """Native code tests finiteness where a value could stop showing (a comparison, the
    heap, the return) rather than after each result; the same errors still come out."""
    p = rvm.assemble(FINITE, "finite.rasm")
    assert engines_agree(p, "stash", (3.0, 0.0), loss="f1")[0] == (3.0, 0.0)
    assert engines_agree(p, "spill", (np.zeros(1), 3.0))[0][0].tolist() == [9.0]
    for name, args in [("stash", (1e200, 0.0)), ("spill", (np.zeros(1), 1e200)),
                       ("hidden", (1e200, 0.0, 0.0)),
                       ("creep", (0, 0.0, float("nan"))),
                       ("creep", (0, 0.0, float("inf")))]:
        out = engines_agree(p, name, args)[0]
        assert out[0] == "InvertibilityError" and "not finite" in out[1], (name, out)
    assert engines_agree(p, "creep", (0, 0.0, 2.5))[0][:2] == (4, 10.0)


SHADOWS = """
.func root(f0, f1)              ; out += sqrt(x): d/dx is 0.5 / sqrt(x)
        ADD.sqrt f0, f1
.end
.func dropped(f0, f1)           ; out += sqrt(t) + x, t a local (zero): t's shadow is dropped
        ADD.sqrt f0, f2
        ADD     f0, f1
.end
.func zeroed(f0, f1)            ; the same, t's shadow dropped by ZERO before the return
        ZERO    f2
        ADD.sqrt f0, f2
        ADD     f0, f1
.end
.func power(f0, f1)             ; out += x ** 0.5: d/dx is 0.5 * x ** -0.5, pow(0, -0.5)
        ADD.pow f0, f1, 0.5
.end
.func cell(r0, r1, f0)          ; out += sqrt(x[0]): the shadow goes back to the array
        EXCH    f1, [r0]
        ADD.sqrt f0, f1
        EXCH    f1, [r0]
.end
.func aside(f0, f1, f2)         ; out += x and y += sqrt(x): the loss out does not need y
        ADD     f0, f1
        ADD.sqrt f2, f1
.end
"""


def test_a_partial_derivative_the_loss_does_not_need_is_not_taken():
    """No gradient flows through y = sqrt(x) when the loss is out: the derivative of sqrt
    at 0 is not evaluated (as PyTorch and JAX skip what the loss does not depend on), on
    every engine; with the loss y it is, and fails."""
    p = rvm.assemble(SHADOWS, "shadows.rasm")
    assert engines_agree(p, "aside", (0.0, 0.0, 0.0), loss="f0")[2] == (1.0, 1.0, 0.0)
    grad = engines_agree(p, "aside", (0.0, 0.0, 0.0), loss="f2")[2]
    assert grad[0] == "MachineError" and "division by zero" in grad[1], grad
    assert engines_agree(p, "aside", (0.0, 4.0, 0.0), loss="f2")[2] == (0.0, 0.25, 1.0)


def test_a_partial_derivative_that_divides_by_zero_fails_alike_on_every_engine():
    """The Python engines stop on the derivative of sqrt at 0 (a division by zero); machine
    code would compute inf, so it tests each division's divisor in a shadow's update, and
    the interpreter reports the error, whether the shadow reaches an argument, is dropped
    with a local (nothing reads it: LLVM drops the computation, not the test), or goes
    back into an array."""
    p = rvm.assemble(SHADOWS, "shadows.rasm")
    for name, args in [("root", (0.0, 0.0)), ("dropped", (0.0, 2.0)),
                       ("zeroed", (0.0, 2.0)), ("cell", (np.zeros(1), 0.0))]:
        grad = engines_agree(p, name, args, loss="f0")[2]
        assert grad[0] == "MachineError" and "division by zero" in grad[1], (name, grad)
    assert engines_agree(p, "root", (0.0, 4.0), loss="f0")[2] == (1.0, 0.25)
    assert engines_agree(p, "cell", (np.array([4.0]), 0.0), loss="f0")[2][0].tolist() == \
        [0.25]


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_a_nan_never_steers_a_native_loop(tmp_path):
    """A loop whose exit test reads a float that became nan would run until the step
    budget ends (here 10^15 steps, hours): native code stops at the comparison."""
    script = tmp_path / "creep.py"
    script.write_text(
        "import rvm, sys\n"
        f"p = rvm.assemble({FINITE!r})\n"
        "try:\n"
        "    p.call('creep', 0, 0.0, float('nan'), engine='native', max_steps=10**15)\n"
        "except rvm.InvertibilityError as e:\n"
        "    print('caught', e)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.stdout.startswith("caught") and "not finite" in done.stdout, done.stderr


def test_a_pure_call_is_computed_once_while_its_arguments_are_unchanged():
    from rvm.engines.templates import common_calls
    lines = ["    f3 = f3 + math.sin(f0)", "    f1 = f1 - f2 * f3", "    f3 = f3 - math.sin(f0)",
             "    f0, f1 = f1, f0", "    f3 = f3 + math.sin(f0)"]
    assert common_calls(lines) == [
        "    _c1 = math.sin(f0)", "    f3 = f3 + _c1", "    f1 = f1 - f2 * f3",
        "    f3 = f3 - _c1", "    f0, f1 = f1, f0", "    f3 = f3 + math.sin(f0)"]
    # not across control flow
    assert common_calls(["    f3 = f3 + math.sin(f0)", "    if r0 == 1:",
                         "        f3 = f3 - math.sin(f0)"])[0] == "    f3 = f3 + math.sin(f0)"


def test_only_shadows_that_nothing_reads_are_dropped():
    from rvm.engines.templates import dead_shadows
    lines = ["def f(M, f0, gf0):", "    gf1 = 0.0", "    gf2 = 0.0", "    if f0 > 0:",
             "        gf2 += gf0 * f0", "    gf1 += gf0 * 2.0", "    gf0 += gf1 * 3.0",
             "    return (f0, gf0, )"]
    assert dead_shadows(lines) == lines[:2] + ["    if f0 > 0:", "        pass"] + lines[5:]
    # an update that could fail (a division: the derivative of sqrt at 0) stays
    lines[4] = "        gf2 += gf0 * (0.5 / math.sqrt(f0))"
    assert dead_shadows(lines) == lines


def test_a_partial_derivative_outside_a_math_functions_domain_fails_alike():
    """The derivative of x ** 0.5 at 0 calls math.pow(0, -0.5), which raises in Python;
    rvm's machine code tests a math call's result in a shadow's update for it."""
    p = rvm.assemble(SHADOWS, "shadows.rasm")
    grad = engines_agree(p, "power", (0.0, 0.0), loss="f0")[2]
    assert grad[0] == "MachineError" and "domain error" in grad[1], grad
    assert engines_agree(p, "power", (0.0, 4.0), loss="f0")[2] == (1.0, 0.25)


def test_int64_sums_wrap_at_both_ends_on_every_engine():
    p = rvm.assemble("""
.func edges(r0, r1, r2, r3)
        ADD    r0, r1
        SUB    r2, r3
        NEG    r3
        INC    r1
        DEC    r2
        ADD    r0, -9223372036854775808
.end
""", "edges.rasm")
    big, small = 2 ** 63 - 1, -2 ** 63
    for args in [(big, big, small, big), (small, small, big, small), (small, big, 0, small),
                 (1, -1, small, 1)]:
        out = engines_agree(p, "edges", args)[0]
        assert all(small <= v <= big for v in out)
    assert engines_agree(p, "edges", (big, big, small, big))[0] == (big - 1, small, 0, -big)


def test_checks_made_once_for_a_counted_loop_fail_where_the_pass_would():
    """A counted loop tests its ASSERTs on the counter or on fixed values, and its heap
    addresses, once on entry for every pass; a check that would fail on some pass sends
    the run down the general loop, which stops at that pass, as the interpreter does."""
    p = rvm.assemble("""
.func walk(r0, r2, f0, f1)     ; f1 += cells r2 .. r2 + r0 - 1 of 4 (twice), f0 in cell 2
        ALLOC  r3, 4
        EXCH   f0, [r3 + 2]
        ADD    r4, r2           ; the counter's start and end
        ADD    r5, r2
        ADD    r5, r0
top:    CF.NE  r2, r4, back
        ADDM   f1, [r3 + r2]
        ADDM   f1, [r2 + r3]
        INC    r2
        ASSERT.LE r2, r5
        ASSERT.GT r2, r4
        ASSERT.GE r3, 0
exit:   BR.EQ  r2, r5, done
back:   JMP    top
done:   CF     exit
        SUB    r2, r0
        SUB    r4, r2
        SUB    r5, r2
        SUB    r5, r0
        EXCH   f0, [r3 + 2]
        FREE   r3, 4
.end
.func bound(r0, r6)            ; r2 counts 1 .. r0, each checked against r6 after its step
top:    CF.NE  r2, 0, back
        INC    r2
        ASSERT.LT r2, r6
exit:   BR.EQ  r2, r0, done
back:   JMP    top
done:   CF     exit
        SUB    r2, r0
.end
""", "walk.rasm")
    assert engines_agree(p, "bound", (3, 4))[0] == (3, 4)
    assert engines_agree(p, "bound", (3, 3))[0][0] == "InvertibilityError"
    for args in [(4, 0, 1.5, 0.0), (2, 1, 1.5, 0.0), (3, 2, 1.5, 0.0), (1, 3, 1.5, 0.0),
                 (2, -1, 1.5, 0.0), (5, 0, 1.5, 0.0), (2, 3, 1.5, 0.0)]:
        out = engines_agree(p, "walk", args, loss="f1")[0]
        fits = args[1] >= 0 and args[1] + args[0] <= 4
        assert isinstance(out[0], int) == fits, (args, out)
        if fits:
            assert out[3] == (3.0 if args[1] <= 2 < args[1] + args[0] else 0.0)


STOPPED = """
.func f(r0, f0)                 ; fails with a live block holding f0 when r0 >= 5
        ALLOC  r1, 4
        EXCH   f0, [r1 + 2]
        ASSERT.LT r0, 5
        EXCH   f0, [r1 + 2]
        FREE   r1, 4
.end
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_that_stopped_leaves_nothing_for_the_next_call(engine):
    """Entering a function clears the cells below the heap top only (above it every cell
    is zero between instructions): a run that stopped with a live block, or a larger
    call before, leaves nothing the next call could see."""
    from rvm.engines.machine import Machine
    m = Machine(rvm.assemble(STOPPED, "stopped.rasm"), engine=engine)
    with pytest.raises(rvm.RvmError, match="assertion"):
        m.call("f", 7, 3.0)
    assert m.top == 4 and m.hf[2] == 3.0            # stopped where the check failed
    assert m.call("f", 1, 2.0) == (1, 2.0) and m.top == 0
    assert not any(m.hi) and not any(m.hg)


@rvm.reversible
def _spin(out: float, a: Array[float], n: int):
    """out += n * sum(a) * 1e-9, element by element: a long native run on the heap."""
    for _k in range(n):
        for j in range(len(a)):
            out += a[j] * 1e-9


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_runs_release_the_gil():
    """While one thread runs native code, the others run Python: the longest pause the
    main thread sees is a small part of the native run's length."""
    import threading
    import time
    a = np.linspace(0.0, 1.0, 1000)
    run = lambda n: _spin(0.0, a, n, engine="native", max_steps=10 ** 12)
    run(1)                                              # compiled before timing
    t = time.perf_counter()
    run(200_000)
    alone = time.perf_counter() - t
    worker = threading.Thread(target=run, args=(200_000,))
    worker.start()
    longest, last = 0.0, time.perf_counter()
    while worker.is_alive():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    worker.join()
    assert alone > 0.05 and longest < alone / 3, (alone, longest)


@pytest.mark.parametrize("engine", ENGINES)
def test_threads_calling_one_program_get_their_own_answers(engine):
    """Calls, gradients and Hessian-vector products of one function from several threads
    at once (each thread on its own machine and its own direct-call buffers) give each
    thread what a call alone gives."""
    from concurrent.futures import ThreadPoolExecutor
    g = rvm.value_and_grad(_spin, argnums=1, engine=engine)
    size, n = (400, 40) if engine == "native" else (30, 2)     # native runs long enough
    arrays = [np.linspace(0.0, k, size) for k in range(1, 9)]   # to overlap

    def answers(k):
        a = arrays[k % 8]
        out, back = _spin(0.0, a, n, engine=engine), g(0.0, a, n)
        hv = rvm.hvp(_cube, (0.0, float(k % 8)), (0.0, 1.0), engine=engine)
        return out[0], back[0][0], back[1].tolist(), hv
    want = [answers(k) for k in range(8)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda k: [answers(k) for _ in range(5)], range(16)))
    assert all(runs == [want[k % 8]] * 5 for k, runs in enumerate(got))


@rvm.reversible
def _cube(out: float, x: float):
    out += x * x * x


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_runs_never_compile_the_python_functions():
    """Only the python engine runs the generated Python functions: a program that runs
    natively never compiles them (Python's compiler holds on to about 60 bytes of memory
    per byte of their source)."""
    from rvm.engines.compiled import compiled
    p = rvm.load(ROOT / "asm" / "poly.rasm")
    assert p.call("f", 0.0, 1.0, 3.0, engine="native") == (484.0, 1.0, 3.0)
    assert rvm.grad(p["f"], loss=0, engine="native")(0.0, 1.0, 3.0)[2] == 2 * 22 * 2 * 6
    assert "_make" not in compiled(p, True, native=True).__dict__
    assert p.call("f", 0.0, 1.0, 3.0, engine="python") == (484.0, 1.0, 3.0)
    assert "_make" in compiled(p, True, native=False).__dict__


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_threads_calling_a_new_function_at_once_compile_it_once(monkeypatch):
    """The first calls of a reversible function from several threads at once share one
    program and one native compile (the others wait for it)."""
    from concurrent.futures import ThreadPoolExecutor

    from rvm.engines import llvm
    if not llvm.usable():
        pytest.skip("needs the LLVM back end")
    compiles = []
    functions = llvm.functions

    def counted(source, fused, batches, *args, **kw):
        compiles.append((kw.get("runs"), tuple(fused), tuple(batches)))
        return functions(source, fused, batches, *args, **kw)
    monkeypatch.setattr(llvm, "functions", counted)

    @rvm.reversible
    def fresh(out: float, a: Array[float]):
        for i in range(len(a)):
            out += a[i] * a[i] * 0.25
    a = np.linspace(0.0, 1.0, 10)
    g = rvm.value_and_grad(fresh, loss="out", argnums=1, engine="native")
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda _: g(0.0, a), range(8)))
    assert len(compiles) == 1     # the gradient's group, with the forward run it starts with
    assert all(np.allclose(grad, a / 2, rtol=1e-15, atol=0) for _, grad in got)


OUTPUT_JANUS = """
procedure f(int n, int x, int a[], int m[][], stack s)
    print("start")
    printf("n=%d x=%d", n, x)
    from x = 0 do
        x += n
        printf("x is %d, a is %a", x, a)
        a[1] += x
        m[1][0] -= x
    until x = 3 * n
    local int t = 7
        push(t, s)
    delocal int t = 0
    show(a, m, s)
    print("end")
procedure g(int x)
    x += 1
    printf("before the check: %d", x)
    if x = 5 then
        x += 10
    fi x = 5
procedure main()
    int x
"""


def _janus(tmp_path, text=OUTPUT_JANUS):
    path = tmp_path / "out.ja"
    path.write_text(text)
    return rvm.load(path)


def _printed(capsys, run):
    """(what run() returns or the error it raises, what it printed)."""
    try:
        out = run()
    except rvm.RvmError as e:
        out = (type(e), str(e).split(" (compiled engine")[0])
    return out, capsys.readouterr().out


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_output_statements_print_as_the_interpreter_prints(tmp_path, capsys, engine):
    from rvm.engines.machine import Machine
    prog = _janus(tmp_path)
    args = (2, 0, np.array([1, 2, 3]), np.array([[1, 2], [3, 4]]), np.zeros(6, np.int64))

    def both(name):
        m = Machine(prog, engine=name)
        m.enter("f", *args)
        steps = m.run(1)        # 0: a compiled run (it did not fall back to the interpreter)
        out = m.results()
        m.enter("f", *out, backward=True)
        steps += m.run(1)
        assert (steps == 0) == (name != "interp")
        assert m._compiled is None or m._compiled.native == (name == "native")
        return out + m.results()
    want = _printed(capsys, lambda: both("interp"))
    assert want[1].count("\n") == 14 and "s = <7]" in want[1]
    got = _printed(capsys, lambda: both(engine))
    assert got[1] == want[1] and same(got[0], want[0])
    # output before a failing check: printed once, and the error is the interpreter's
    want = _printed(capsys, lambda: Machine(prog, engine="interp").call("g", 4))
    got = _printed(capsys, lambda: Machine(prog, engine=engine).call("g", 4))
    assert want[1] == "before the check: 5\n" and got == want


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_python_frontend_print_on_every_engine(capsys, engine):
    @rvm.reversible
    def f(n: int, s: float, v: Array[float]):
        with rvm.ancilla(i=0):
            with rvm.from_(i == 0, until=i == n):
                i += 1
                rvm.loop()
                s += v[i - 1] * 0.5
                print("i", i, "s", s, v)
            rvm.delocal(i=n)
        assert s < 100.0
        print("done", s)

    v = np.array([1.0, -0.0, 2.5])
    for e in ("interp", engine):
        outs = [f(3, 0.0, v, engine=e), (~f)(3, 1.75, v, engine=e)]
        text = capsys.readouterr().out
        if e == "interp":
            want = (outs, text)
    assert text == want[1] and text.count("\n") == 6 and same(outs[0], want[0][0])
    grads = {}
    for e in ("interp", engine):    # a gradient prints what the interpreter's prints
        grads[e] = (rvm.grad(f, loss=1, engine=e)(3, 0.0, v), capsys.readouterr().out)
    assert grads[engine][1] == grads["interp"][1] and "done 0.5" in grads[engine][1]
    assert same(grads[engine][0][2], grads["interp"][0][2])
    failed = [_printed(capsys, lambda e=e: f(3, 99.8, v, engine=e)) for e in ("interp", engine)]
    assert failed[0][0][0] is rvm.InvertibilityError and failed[1] == failed[0]
    assert failed[0][1] == "i 1 s 100.3 [1.0, -0.0, 2.5]\ni 2 s 100.3 [1.0, -0.0, 2.5]\n"


@pytest.mark.parametrize("engine", ENGINES[1:])
def test_a_counted_loop_prints_its_counter_in_every_pass(capsys, engine):
    """A loop counted by an integer that only a print reads: native code ran it as a
    counted loop whose counter steps once, after the last pass, and printed `i = 0` in
    every pass (from 8 passes on). Forwards, backwards and down."""
    @rvm.reversible
    def f(out: float, n: int):
        for i in range(n):
            print("i =", i)
            out += 1.0
        for j in range(n, 0, -1):
            print("j =", j)
            out -= 0.5

    for n in (3, 12, 40):
        want = _printed(capsys, lambda n=n: (f(0.0, n, engine="interp"),
                                             (~f)(n / 2, n, engine="interp")))
        got = _printed(capsys, lambda n=n: (f(0.0, n, engine=engine),
                                            (~f)(n / 2, n, engine=engine)))
        assert got == want and f"i = {n - 1}\n" in want[1], (n, got[1][:80])


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_a_gradient_of_a_scalar_function_that_prints_stays_native(capsys):
    """A program without heap but with output has no scalar fused call (its output lives
    in the machine's state array): its gradient's native group is the heap one, not a
    missing entry that sent the whole program to the python engine with a warning."""
    import warnings

    @rvm.reversible
    def f(out: float, x: float):
        out += x * x
        print("x is", x)
    got = {}
    for e in ("interp", "native"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got[e] = (rvm.grad(f, loss="out", engine=e)(0.0, 3.0), capsys.readouterr().out)
    assert got["native"] == got["interp"] and got["native"][0] == (1.0, 6.0)


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_output_past_its_buffer_and_past_the_step_budget(tmp_path, capsys):
    from rvm.engines import machine
    prog = _janus(tmp_path, """
procedure f(int n, int x, int a[])
    from x = 0 do
        x += 1
        printf("%d %a", x, a)
    until x = n
procedure main()
    int x
""")
    a = np.arange(5)
    lines = _printed(capsys, lambda: machine.Machine(prog, engine="interp").call("f", 3000, 0, a))
    m = machine.Machine(prog, engine="native")
    got = _printed(capsys, lambda: m.call("f", 3000, 0, a))
    assert got[1] == lines[1] and same(got[0], lines[0]) and m._compiled.native
    assert m.said_cells > machine.SAID_CELLS      # the buffer grew (3000 * 10 cells)
    # out of steps midway: the lines the interpreter prints before it stops, once
    want = _printed(capsys, lambda: machine.Machine(prog, engine="interp", max_steps=500)
                    .call("f", 3000, 0, a))
    got = _printed(capsys, lambda: machine.Machine(prog, engine="native", max_steps=500)
                   .call("f", 3000, 0, a))
    assert got == want and want[0][0] is rvm.MachineError and \
        10 < want[1].count("\n") < 500


def test_a_function_whose_last_instruction_branches_back_to_its_first_loops_on_every_engine():
    """One block whose last instruction is the loop's branch back to the first (a
    do-while with nothing after it): the compiled engines ran its body once and
    returned (1.0, 10.0, 1), silently, where the interpreter loops ten times; native
    code could not be made for it (a warning, then the python engine's answer)."""
    import warnings

    from rvm.engines.machine import Machine
    p = rvm.assemble("""
.func root(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
back:   BR.LT  f0, f1, top
.end
""")
    for engine in ("interp", "python", "native"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            m = Machine(p, engine=engine)
            assert m.call("root", 0.0, 10.0, 0) == (10.0, 10.0, 10), engine
            assert m.uncall("root", 10.0, 10.0, 10) == (0.0, 10.0, 0), engine


def test_a_cleared_register_that_held_inf_minus_inf_is_refused_on_every_engine():
    """An ancilla that takes in a cell holding inf and gives it back holds inf - inf =
    nan where it is cleared: the interpreter refuses the value where it became inf, and
    so does native code, which knew the register as `e - e` and had cleared it without
    a test (a skeptic's case: native code returned 1.0, and the default engine's calls
    went from the error to that once they moved to native code)."""
    f = rvm.reversible.source('''
def f(out: float, x: Array[float]):
    with ancilla(s=0.0):
        s += x[0]
        out += 1.0
        s -= x[0]
''', {"Array": rvm.Array, "ancilla": rvm.ancilla})
    for x in (np.inf, -np.inf, np.nan):
        for engine in ENGINES:
            with pytest.raises(rvm.InvertibilityError, match="`s` would become") as e:
                f(0.0, np.array([x]), engine=engine)
            assert e.value.index == 2, (engine, str(e.value))   # (after ZERO s)
        with pytest.raises(rvm.InvertibilityError):
            rvm.grad(f, loss="out", engine="native")(0.0, np.array([x]))
    assert f(0.0, np.array([2.0]), engine="native")[0] == 1.0


READ_AS_IT_IS = {
    "a product's factor": "out += x[0] * w",
    "a product's factor, by zero": "out += x[0] * (w - w)",
    "a function's argument": "out += exp(x[0]) * w",
    "two reads, one product": "out += x[0] * x[1] * w",
    "read, unused": "with ancilla(s=0.0):\n        s += x[0]\n        out += w\n        s -= x[0]",
}


@pytest.mark.parametrize("case", READ_AS_IT_IS)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_a_cell_read_as_it_is_that_holds_inf_or_nan_is_refused_alike(case, bad):
    """Native code reads a cell into a register known to hold zero as it is and takes it
    back out as `cell - cell`, untested where a product took the value (its inf or nan
    went into the product's register, tested later), tested where anything else reads
    it or nothing does: every engine refuses the read that the interpreter refuses, at
    that instruction (exp(-inf) is 0: untested there, the -inf would be lost)."""
    f = rvm.reversible.source(f"def f(out: float, x: Array[float], w: float):\n"
                              f"    {READ_AS_IT_IS[case]}\n",
                              {"Array": rvm.Array, "ancilla": rvm.ancilla, "exp": np.exp})
    x = np.array([bad, 2.0])
    errors = []
    for engine in ENGINES:
        with pytest.raises(rvm.InvertibilityError) as e:
            f(0.0, x, 1.5, engine=engine)
        errors.append((str(e.value), e.value.index))
    assert len(set(errors)) == 1, errors
    assert f(0.0, np.array([0.5, 2.0]), 1.5, engine="native")[0] == \
        f(0.0, np.array([0.5, 2.0]), 1.5, engine="interp")[0]


def test_zero_of_a_register_known_to_hold_zero_is_not_tested_again():
    """The frontend clears every float temporary (ZERO) before its compute; where the
    compiled code knows the register holds 0.0 there (a heap cell read in and taken back
    out exactly: `d = e - e`), the clearing makes no test of its tolerance (in the GMM
    example's loops the tests took 40% of a gradient), only of e - e's finiteness
    (test_a_cleared_register_that_held_inf_minus_inf_is_refused_on_every_engine). The
    others still test."""
    f = rvm.reversible.source('''
def f(out: float, x: Array[float], n: int):
    for i in range(n):
        out += exp(x[i]) * x[i]
''', {"Array": rvm.Array, "exp": np.exp})
    program, name, _ = f.specialize((0.0, np.ones(3), 3))
    zeros = sum(ins.op == "ZERO" and ins.args[0].cls == "f"
                for ins in program.functions[name].code)
    body = compiled(program, native=True).body("F0_fw")
    assert 0 < body.count("zero(") < zeros
    for engine in ENGINES:
        x = np.array([0.5, -1.0, 2.0])
        assert f(0.0, x, 3, engine=engine)[0] == pytest.approx(np.sum(np.exp(x) * x), rel=1e-12)


def test_a_square_is_a_product_on_every_engine():
    """x ** 2 is x * x on every engine (the C library's pow, which the interpreter
    called, is a last bit off for about 1 in 1,200 values, where native code, numpy and
    the element loops square by a product), a run-time exponent of 2.0 too, and so is
    the square in tanh's derivative; other exponents are the C library's pow."""
    import random
    r = random.Random(0)
    xs: list[float] = []
    while len(xs) < 4:
        x = r.uniform(-1e3, 1e3)
        if math.pow(x, 2.0) != x * x and math.pow(math.tanh(x / 400), 2.0) != \
                math.tanh(x / 400) * math.tanh(x / 400):
            xs.append(x)
    p = rvm.assemble(".func h(f0, f1)\n    ADD.pow f1, f0, 2.0\n.end\n"
                     ".func k(f0, f1, f2)\n    ADD.pow f2, f0, f1\n.end\n"
                     ".func t(f0, f1)\n    ADD.tanh f1, f0\n.end\n")
    for x in xs:
        for engine in ENGINES:
            assert p.call("h", x, 0.0, engine=engine) == (x, x * x)
            assert p.call("k", x, 2.0, 0.0, engine=engine) == (x, 2.0, x * x)
            assert p.call("k", abs(x), 0.5, 0.0, engine=engine)[2] == math.pow(abs(x), 0.5)
            th = math.tanh(x / 400)
            assert rvm.grad(p["t"], loss=1, engine=engine)(x / 400, 0.0)[0] == \
                1.0 - th * th
        if native.available:        # (rows in lockstep: the vector code squares too)
            rows = rvm.vmap(functools.partial(p["h"], engine="native"), in_axes=(0, None))
            assert set(rows(np.full(19, x), 0.0)[1]) == {x * x}


def test_integers_in_float_arithmetic_and_comparisons_are_floats_on_every_engine():
    """An integer register read by a float instruction's arithmetic (n / 3, n * n,
    n ** 2, abs(n)) or compared with a float (n > x, in a branch or XOR.gt) is converted
    to a float first on every engine. The interpreter and the python engine took
    Python's exact integers (and exact comparisons), native code int64 arithmetic, which
    wraps (n * n of 2**53 + 1 was 1.8e16 there, abs(-2**63) negative) and float
    conversions: past 2**53 they gave other answers, so the default engine's answer
    changed after a few calls."""
    from rvm.engines import native
    h = rvm.reversible.source(
        "def h(n: int, x: float, a: float, b: float, c: float, d: float, e: float):\n"
        "    a += n / 3\n    b += n * n\n    c += n ** 2\n    d += abs(n)\n"
        "    if n > x:\n        e += 1.0\n")
    p = rvm.assemble(".func c(r0, f0, r1)\n    XOR.gt r1, r0, f0\n.end\n"
                     ".func k(f0, r1, f1)\n    XOR.lt r1, f0, 9007199254740993\n"
                     "    ADD.div f1, 9007199254740993, 3\n.end\n")
    engines = ["interp", "python"] + (["native"] if native.available else [])
    for n, x in [(2**53 + 1, 2.0**53), (-2**63, -2.0**63), (-2**63 + 1, -2.0**63),
                 (2**62 + 1, 2.0**62), (7, 6.5), (-5, -5.0)]:
        f = float(n)
        want = (f / 3, f * f, f * f, abs(f), float(f > x))
        for e in engines:
            assert h(n, x, 0.0, 0.0, 0.0, 0.0, 0.0, engine=e)[2:] == want, (n, e)
            assert p.call("c", n, x, 0, engine=e)[2] == int(f > x), (n, e)
    for e in engines:       # (and integer constants: 2**53 + 1 is 2**53 as a float)
        assert p.call("k", 2.0**53, 0, 0.0, engine=e) == \
            (2.0**53, 0, 9007199254740992.0 / 3), e


def test_a_scale_out_of_the_normal_range_says_the_operation_and_its_operands():
    """`DIV f0, -0.5` of -5e-324 said "f0 = -5e-324 / -0.5 = -0.5 would leave the normal
    float range": -0.5 read as the result. It says the operation, then its values."""
    from rvm.engines import native
    p = rvm.assemble(".func g(f0)\n    DIV f0, -0.5\n.end\n.func h(f0, f1)\n"
                     "    MUL f0, f1\n.end\n")
    for e in ["interp", "python"] + (["native"] if native.available else []):
        with pytest.raises(rvm.InvertibilityError,
                           match=r"f0 /= -0\.5: -5e-324 / -0\.5 would leave the normal"):
            p.call("g", -5e-324, engine=e)
        with pytest.raises(rvm.InvertibilityError,
                           match=r"f0 \*= f1: 1e\+300 \* 1e\+300 would leave the normal"):
            p.call("h", 1e300, 1e300, engine=e)
