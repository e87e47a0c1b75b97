"""Regression tests for what a hostile input found: memory safety of every engine at the
int64 edges of address arithmetic, heap blocks left allocated, scaling that underflows or
overflows, and disassembly that re-assembles exactly."""

import contextlib
import json
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
from rvm.engines import native

INT64_MAX, INT64_MIN = (1 << 63) - 1, -(1 << 63)
ENGINES = ["interp", "python"]          # in-process; native runs in a subprocess below

ADDRESSING = """
.func imm_max(r0, r1)
        EXCH    r1, [r0 + 9223372036854775807]
.end
.func imm_plus1(r0, r1)
        EXCH    r1, [r0 + 1]
.end
.func imm_minus1(r0, r1)
        EXCH    r1, [r0 - 1]
.end
.func imm_min(r0, r1)
        EXCH    r1, [r0 - 9223372036854775808]
.end
.func reg_off(r0, r2, r1)
        EXCH    r1, [r0 + r2]
.end
.func float_pair(r0, r2, f0, f1)
        EXCH    f0, [r0 + r2]
        ADD     f1, f0
        EXCH    f0, [r0 + r2]
.end
.func read_pair(r0, r2, f0, f1)
        ADDM    f0, [r0 + r2]
        ADD     f1, f0
        SUBM    f0, [r0 + r2]
.end
.func read_imm(r0, r1)
        ADDM    r1, [r0 + 9223372036854775807]
.end
.func on_heap(r0, r2, r1)
        ALLOC   r3, 4
        EXCH    r1, [r3 + r2]
        ADD     r0, r1
        EXCH    r1, [r3 + r2]
        FREE    r3, 4
.end
"""
# (function, arguments, True if the access is inside the heap)
EDGES = [
    ("imm_max", (1_000_000_000, 5), False), ("imm_max", (1_000_000, 5), False),
    ("imm_max", (INT64_MIN, 5), False), ("imm_max", (-INT64_MAX, 5), False),
    ("imm_plus1", (INT64_MAX, 5), False), ("imm_plus1", (-1, 5), False),
    ("imm_minus1", (INT64_MIN, 5), False), ("imm_minus1", (0, 5), False),
    ("imm_min", (INT64_MAX, 5), False), ("imm_min", (-1, 5), False),
    ("reg_off", (INT64_MAX, 1, 5), False), ("reg_off", (1, INT64_MAX, 5), False),
    ("reg_off", (INT64_MIN, -1, 5), False), ("reg_off", (-1, INT64_MIN, 5), False),
    ("reg_off", (INT64_MAX, INT64_MIN, 5), False), ("reg_off", (INT64_MIN, INT64_MAX, 5), False),
    ("reg_off", (0, 0, 5), False),
    # an access right after float arithmetic (once left unmasked in native code)
    ("float_pair", (0, 1 << 40, 0.0, 1.0), False), ("float_pair", (INT64_MAX, 1, 0.0, 1.0), False),
    ("float_pair", (-1, INT64_MIN, 0.0, 1.0), False),
    # reads in place, after float arithmetic and at the immediate's edge
    ("read_pair", (0, 1 << 40, 0.0, 1.0), False), ("read_pair", (INT64_MAX, 1, 0.0, 1.0), False),
    ("read_pair", (-1, INT64_MIN, 0.0, 1.0), False), ("read_imm", (1_000_000, 5), False),
    ("read_imm", (-INT64_MAX, 5), False), ("read_imm", (INT64_MIN, 5), False),
    ("on_heap", (0, 0, 0), True), ("on_heap", (0, 3, 0), True), ("on_heap", (0, 4, 0), False),
    ("on_heap", (0, -1, 0), False), ("on_heap", (0, INT64_MAX, 0), False),
    ("on_heap", (0, INT64_MIN, 0), False),
]


def outcome(program, name, args, engine):
    try:
        return list(program.call(name, *args, engine=engine))
    except rvm.RvmError as e:
        return "outside the heap" if "outside the heap" in str(e) else str(e)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("name,args,inside", EDGES)
def test_addresses_at_the_int64_edges_are_checked(engine, name, args, inside):
    p = rvm.assemble(ADDRESSING, "addressing.rasm")
    got = outcome(p, name, args, engine)
    assert (got != "outside the heap") == inside, got


NATIVE_SCRIPT = """
import json, sys
import rvm
sys.path.insert(0, {tests!r})
from test_reliability import ADDRESSING, EDGES, outcome
p = rvm.assemble(ADDRESSING, "addressing.rasm")
print(json.dumps([outcome(p, n, a, "native") for n, a, _ in EDGES]))
"""


@pytest.mark.skipif(not native.available, reason="llvmlite is not installed")
def test_native_addresses_at_the_int64_edges_are_checked_in_a_subprocess():
    """A wild access would crash the process, so the native engine runs in a child."""
    tests = str(pathlib.Path(__file__).parent)
    r = subprocess.run([sys.executable, "-c", NATIVE_SCRIPT.format(tests=tests)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    p = rvm.assemble(ADDRESSING, "addressing.rasm")
    expected = [outcome(p, n, a, "interp") for n, a, _ in EDGES]
    assert json.loads(r.stdout.splitlines()[-1]) == expected


def test_every_native_heap_access_is_masked_by_its_check():
    """Native code masks a failed address to cell 0; the generator refuses to emit an
    access whose check is not right before it (text only, no compiling), unless the
    access is in a counted loop whose entry test made the check for every pass."""
    from rvm.engines.compiled import compiled
    programs = [rvm.load(f) for f in sorted(pathlib.Path("asm").glob("*.rasm"))]
    programs += [rvm.assemble(random_program(seed, wild=True), "gen.rasm")
                 for seed in range(40)]
    programs.append(rvm.assemble(ADDRESSING, "addressing.rasm"))
    accesses = hoisted = 0

    def enclosing(lines, k):
        """The nearest line before k indented less than line k."""
        depth = len(lines[k]) - len(lines[k].lstrip())
        return next(j for j in range(k - 1, -1, -1)
                    if len(lines[j]) - len(lines[j].lstrip()) < depth)

    for p in programs:
        source = compiled(p, native=True).native_bodies
        raw = source.split("\n")
        lines = [line.strip() for line in raw]
        for k, line in enumerate(lines):
            if line.startswith("_a = "):
                accesses += 1
                assert line.endswith(" * _m"), line
                if lines[k - 1] == "_m = True":
                    loop = enclosing(raw, k)
                    assert lines[loop].startswith("for ") and \
                        lines[enclosing(raw, loop)].startswith("if _exact("), lines[loop]
                    hoisted += 1
                else:
                    assert lines[k - 1] == "_ok &= _m", lines[k - 3:k + 1]
    assert accesses > 100 and hoisted > 10


LEAK = """
.func leak(r0, r1)
        ALLOC   r2, 1
        EXCH    r1, [r2]
.end
.func leakf(f0, f1)
        ADD.exp f1, f0
        PUSH    f1
.end
"""


@pytest.mark.parametrize("engine", ENGINES + (["native"] if native.available else []))
def test_a_block_left_allocated_at_the_end_is_refused(engine):
    p = rvm.assemble(LEAK, "leak.rasm")
    for x in (42, 7):                 # both would end in the same state: information lost
        with pytest.raises(rvm.InvertibilityError, match="still allocated"):
            p.call("leak", 0, x, engine=engine)
    for _ in range(5):                # the direct gradient paths check it too
        with pytest.raises(rvm.InvertibilityError, match="still allocated"):
            rvm.grad(p["leakf"], loss=1, engine=engine)(0.5, 0.0)


SCALE = """
.func mul(f0)
        MUL     f0, 1e-320
.end
.func mulr(f0, f1)
        MUL     f0, f1
.end
.func div(f0, f1)
        DIV     f0, f1
.end
"""


@pytest.mark.parametrize("engine", ENGINES + (["native"] if native.available else []))
@pytest.mark.parametrize("name,args", [
    ("mul", (1e-10,)), ("mulr", (1e300, 1e300)), ("mulr", (1e-300, 1e-300)),
    ("mulr", (1e-310, 2.0)), ("div", (1.0, 1e-310)), ("div", (1e-300, 1e300))])
def test_scaling_out_of_the_normal_range_is_refused(engine, name, args):
    p = rvm.assemble(SCALE, "scale.rasm")
    with pytest.raises(rvm.InvertibilityError, match="normal float range"):
        p.call(name, *args, engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_scaling_inside_the_normal_range_still_inverts(engine):
    p = rvm.assemble(SCALE, "scale.rasm")
    assert p.call("mulr", 0.0, 1e-300, engine=engine) == (0.0, 1e-300)
    assert p.call("div", 3.0, 2.0, engine=engine) == (1.5, 2.0)
    assert p.uncall("div", 1.5, 2.0, engine=engine) == (3.0, 2.0)
    assert rvm.grad(p["div"], loss=0, engine=engine)(3.0, 2.0) == (0.5, -0.75)


MANY_LABELS = """
.func fib(r0, r1, r2)
        ADD    r2, 1
top:    CF.NE  r3, 0, back
        ADD    r1, r2
        SWAP   r1, r2
        INC    r3
exitbr: BR.EQ  r3, r0, x
back:   JMP    top
x: done: CF     exitbr
        SUB    r3, r0
.end
"""


def same_code(p1, p2) -> bool:
    """The same functions, instructions and labels (line numbers set aside)."""
    strip = lambda p: {n: ([(i.op, i.args) for i in f.code], f.params, f.labels)
                       for n, f in p.functions.items()}
    return strip(p1) == strip(p2)


def test_disassembly_keeps_every_label():
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    text = rvm.disassemble(p)
    assert "x: done:" in text
    assert same_code(rvm.assemble(text, "again.rasm"), p)


@pytest.mark.parametrize("engine", ENGINES + (["native"] if native.available else []))
def test_a_jump_to_a_second_label_runs_both_ways(engine):
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    assert p.call("fib", 10, 0, 0, engine=engine) == (10, 55, 89)
    assert p.uncall("fib", 10, 55, 89, engine=engine) == (10, 0, 0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_disassembly_reassembles_to_the_same_program(seed):
    p = rvm.assemble(random_program(seed), f"gen{seed}.rasm")
    assert same_code(rvm.assemble(rvm.disassemble(p), "again.rasm"), p)
    assert same_code(rvm.assemble(rvm.disassemble(p, annotate=True), "again.rasm"), p)


def exact_steps(text: str, name: str, args) -> int:
    m = rvm.Machine(rvm.assemble(text, "steps.rasm"), engine="interp")
    m.enter(name, *args)
    return m.run(1)


ALL_ENGINES = ENGINES + (["native"] if native.available else [])


@pytest.mark.parametrize("engine", ALL_ENGINES)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_the_step_budget_is_one_per_run_and_counted_alike(engine, seed):
    """Every engine counts executed instructions (a call: two steps besides the callee's),
    so a budget of exactly the run's steps passes and one less is refused, everywhere.
    (A program whose run fails, a product that overflows in a loop, say, fails alike on
    every engine: seed 67377, drawn once.)"""
    text = random_program(seed)
    args = (3, -2, 5, 0.5, -1.25, 2.0)
    p = rvm.assemble(text, "steps.rasm")
    try:
        steps = exact_steps(text, "main", args)
    except rvm.RvmError as e:
        with pytest.raises(rvm.RvmError) as got:
            p.call("main", *args, engine=engine)
        assert str(got.value) == str(e)
        return
    assert p.call("main", *args, engine=engine, max_steps=steps) == \
        p.call("main", *args, engine="interp")
    if steps > 1:
        with pytest.raises(rvm.MachineError, match="step budget"):
            p.call("main", *args, engine=engine, max_steps=steps - 1)


FACT = (pathlib.Path(__file__).resolve().parent.parent / "asm" / "fact.rasm").read_text()


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_a_recursive_runaway_stops_at_the_budget(engine):
    p = rvm.assemble(FACT, "fact.rasm")
    warns = pytest.warns(UserWarning) if engine == "native" else contextlib.nullcontext()
    with warns, pytest.raises(rvm.MachineError, match="step budget of 1000 steps"):
        p.call("fact", 40, 0, engine=engine, max_steps=1000)


@pytest.mark.parametrize("options", [dict(heap_limit=0), dict(heap_limit=-1), dict(max_steps=0),
                                     dict(tol=-1.0), dict(tol=float("nan")),
                                     dict(max_depth=0), dict(heap_limit=1.5)])
def test_limits_are_validated_up_front(options):
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    with pytest.raises(rvm.UsageError):
        p.call("fib", 10, 0, 0, **options)


def test_small_heap_limits_work_and_bound_the_heap():
    p = rvm.assemble(ADDRESSING, "addressing.rasm")
    assert p.call("on_heap", 0, 1, 0, heap_limit=8, engine="interp") == (0, 1, 0)
    with pytest.raises(rvm.MachineError, match="heap limit of 3 cells"):
        p.call("on_heap", 0, 1, 0, heap_limit=3, engine="interp")


def test_register_files_count_against_the_memory_limit():
    text = """
.func main(r0)
        CALL    deep, r0
.end
.func deep(r0)
        INC     r60000
        CALL    main, r0
        DEC     r60000
.end
"""
    p = rvm.assemble(text, "deep.rasm")
    with pytest.raises(rvm.MachineError, match="memory limit"):
        p.call("main", 0, engine="interp", heap_limit=1 << 20)


def test_cli_usage_errors_exit_2_without_a_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(
        pathlib.Path(__file__).resolve().parent.parent / "asm" / "fib.rasm"),
        "--args", "10", "0", "0", "--heap-limit", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "heap_limit must be a positive integer" in r.stderr


# ---------------------------------------------------------------- bad input: the frontend

FRONTEND_ERRORS = [
    ("out: float, x: float", "    out += x < 1\n    out += x < 1 and x > 5", None),
    ("r: int, x: int, y: int", "    r += x & y\n    r -= x | y\n    r += x ^ y\n"
     "    r += (x << 3) - (y >> 1)", None),
    ("r: int, x: int", "    r += x << x", "shift by a constant"),
    ("r: float, x: Array[float,]", "    r += x[0]", "is not an array type"),
    ("r: int, x: int", "    r += 99999999999999999999999", "does not fit in int64"),
    ("r: int, x: int", "    r += [x][0]", "only array variables"),
    ("r: int, x: int", "    r += x if x else 1", "IfExp is not supported"),
    ("r: float, x: float", "    r += x & 1", "needs integer operands"),
    ("r: int, x: int, n: int", "    r += x ** n", "needs a constant exponent from 0 to 64"),
    ("f: float, x: int, n: int", "    f += x ** n + x ** 65", None),    # (float powers)
    ("r: int, x: int", "    r += x ** 65", "needs a constant exponent from 0 to 64"),
    ("r: int, x: int", "    r += x ** -1", "cannot absorb a float expression"),
    ("r: int, x: float", "    r += x ** 2", "cannot absorb a float expression"),
]


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_an_int_to_a_constant_power_is_an_int_as_in_python(tmp_path, engine):
    # `x ** k` of ints with a constant k >= 0 is an int in Python: the product x * x * ...
    # (1 for k = 0), into an integer target, a condition, an index, an int array statement
    path = tmp_path / "p.py"
    path.write_text("import numpy as np\nfrom rvm import Array, reversible\n\n"
                    "@reversible\ndef f(r: int, x: int, A: Array[int], y: Array[int]):\n"
                    "    r += x ** 0 + x ** 1 - x ** 3 + (x + 1) ** 2\n"
                    "    r ^= x ** 2\n"
                    "    if x ** 2 > 4:\n"
                    "        r += A[x ** 2 - 5]\n"
                    "    y += A ** 2\n")
    f = rvm.load(path)["f"]
    for x in (3, -7, 0):
        A, y = np.arange(60), np.arange(60) - 30
        want = (0 + 1 + x - x ** 3 + (x + 1) ** 2) ^ x ** 2
        want += A[x ** 2 - 5] if x ** 2 > 4 else 0
        out = f(0, x, A, y, engine=engine)
        assert out[0] == want and np.array_equal(out[3], y + A ** 2)
        back = (~f)(*out, engine=engine)
        assert back[0] == 0 and np.array_equal(back[3], y)


def test_a_large_int_power_is_a_balanced_tree_of_products_wrapping_as_python_int64():
    # (a chain of k - 1 products took 2^(k - 1) instructions: x ** 16 compiled for 70 s)
    f = rvm.reversible.source("def f(r: int, x: int):\n    r += x ** 64 - x ** 13\n", {})
    p, name, _ = f.specialize((0, 3))
    assert len(p.functions[name].code) < 2000
    for x in (3, -2, 7, 2 ** 40):
        want = (x ** 64 - x ** 13 + 2 ** 63) % 2 ** 64 - 2 ** 63     # int64, wrapped
        assert f(0, x)[0] == want and (~f)(want, x)[0] == 0


@pytest.mark.parametrize("params,body,error", FRONTEND_ERRORS)
def test_frontend_sources_compile_or_fail_with_a_located_error(tmp_path, params, body, error):
    path = tmp_path / "f.py"
    path.write_text(f"import rvm\nfrom rvm import Array\nX = {{[1]: 2}}\n\n"
                    f"@rvm.reversible\ndef f({params}):\n{body}\n")
    if error is None:
        rvm.load(path)
        return
    with pytest.raises(rvm.CompileError, match=error) as e:
        rvm.load(path)
    assert e.value.file == str(path) and e.value.line >= 6 and e.value.col >= 1


@pytest.mark.parametrize("expr", ["' + '.join(['x'] * 20000)", "'-' * 100000 + 'x'"])
def test_too_deep_sources_are_a_clear_error(tmp_path, expr):
    path = tmp_path / "deep.py"
    path.write_text("import rvm\n\n@rvm.reversible\ndef f(r: int, x: int):\n    r += "
                    + eval(expr) + "\n")
    with pytest.raises(rvm.CompileError, match="too deeply nested"):
        rvm.load(path)


def test_comparisons_and_bit_operators_are_integer_values():
    path = pathlib.Path(__file__).with_name("_bits_fixture.py")
    path.write_text("""import rvm

@rvm.reversible
def bits(r: int, x: int, y: int):
    r += (x & y) + 10 * (x | y) + 100 * (x ^ y) + 1000 * (x < y) + (x << 4) - (x >> 1)
""")
    try:
        p = rvm.load(path)
        for x, y in [(5, 3), (-7, 12), (0, 0), (-1, -2)]:
            want = (x & y) + 10 * (x | y) + 100 * (x ^ y) + 1000 * (x < y) + (x << 4) - (x >> 1)
            out = p.call("bits", 0, x, y)
            assert out == (want, x, y)
            assert p.uncall("bits", *out) == (0, x, y)
    finally:
        path.unlink()


def test_and_or_short_circuit_so_guarded_reads_stay_in_bounds():
    path = pathlib.Path(__file__).with_name("_guard_fixture.py")
    path.write_text("""import rvm
from rvm import Array

@rvm.reversible
def guard(r: int, n: int, a: Array[int]):
    if n == 0 or a[n - 1] != 5:
        r += 1
    if n > 0 and a[n - 1] == 5:
        r += 10
""")
    try:
        p = rvm.load(path)
        arr = np.array([7, 5])
        for n, want in [(0, 1), (1, 1), (2, 10)]:
            out = p.call("guard", 0, n, arr.copy())
            assert out[0] == want
            assert p.uncall("guard", *out)[0] == 0
    finally:
        path.unlink()


# ---------------------------------------------------------------- bad input: the debugger

@pytest.mark.parametrize("command,message", [
    ("p r0 % 0", "division by zero"), ("display r0 % 0", "division by zero"),
    ("p r0[0]", "not an array"), ("watch r0[0]", "not an array"),
    ("p 2 ** 99999", "too large"), ("p 2 ** 9999999999", "too large"),
    ("grad on f0", "loss must be a float"), ("p heap[5]", "not in use"),
    ("x/4 99", ""), ("frobnicate", "unknown command")])
def test_a_failing_debugger_command_prints_one_line_and_the_session_goes_on(command, message):
    from rvm.debugger import Debugger
    dbg = Debugger(rvm.assemble(MANY_LABELS, "labels.rasm"), "fib", (6, 0, 0))
    out = dbg.execute(command)
    assert message in out
    assert not dbg.m.grad                       # a refused `grad on` changes nothing
    assert "r0 = 6" in dbg.execute("p r0")      # the session goes on
    dbg.execute("c")
    assert "r1 = 8" in dbg.execute("p r1")


# ---------------------------------------------------------------- bad input: the API

@pytest.mark.parametrize("call,error,message", [
    (lambda p: rvm.Machine(p).step(), rvm.MachineError, "no function entered"),
    (lambda p: rvm.Machine(p).back(), rvm.MachineError, "no function entered"),
    (lambda p: rvm.Machine(p).results(), rvm.MachineError, "no function entered"),
    (lambda p: rvm.Machine(None), TypeError, "needs a Program"),
    (lambda p: rvm.assemble(None), TypeError, "assembly text"),
    (lambda p: rvm.assemble(b".func f(r0)\n.end"), TypeError, "rvm.loads"),
    (lambda p: rvm.loads(None), TypeError, ".rvmb bytes"),
    (lambda p: p.call("fib", 1, 0, 0, foo=1), TypeError, "unknown option 'foo'"),
    (lambda p: rvm.vmap(p["fib"])(3, np.array([0]), np.array([0])), ValueError, "scalar"),
    (lambda p: rvm.vmap(p["fib"], in_axes=(None, 1)), ValueError, "in_axes"),
    (lambda p: rvm.vmap(p["fib"])(np.arange(2), np.arange(3), np.arange(3)), ValueError,
     "same length"),
])
def test_api_misuse_names_the_mistake(call, error, message):
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    with pytest.raises(error, match=message):
        call(p)


def test_an_empty_batch_gives_an_empty_result():
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    empty = np.array([], dtype=np.int64)
    out = rvm.vmap(p["fib"])(empty, empty, empty)
    assert [(a.shape, a.dtype) for a in out] == [((0,), np.int64)] * 3


def test_error_messages_name_their_class_once():
    p = rvm.assemble(MANY_LABELS, "labels.rasm")
    with pytest.raises(rvm.MachineError) as e:
        rvm.Machine(p).step()
    assert "MachineError" not in str(e.value)


# ---------------------------------------------------------------- JAX habits

def test_argnums_wrt_has_aux_and_keyword_arguments():
    f = rvm.load(pathlib.Path(__file__).resolve().parent.parent / "asm" / "poly.rasm")["f"]
    assert rvm.grad(f, loss=0, argnums=1)(0.0, 1.0, 3.0) == 660.0
    assert rvm.grad(f, loss=0, argnums=(2, 1))(0.0, 1.0, 3.0) == (528.0, 660.0)
    assert rvm.grad(f, loss="f0", wrt=["f1"])(0.0, 1.0, 3.0) == (660.0,)
    assert rvm.grad(f, loss=0, has_aux=True)(0.0, 1.0, 3.0) == ((1.0, 660.0, 528.0),
                                                               (484.0, 1.0, 3.0))
    assert rvm.value_and_grad(f, loss=0, has_aux=True)(0.0, 1.0, 3.0)[0][0] == 484.0
    assert rvm.grad(f, loss=0)(0.0, f2=3.0, f1=1.0) == (1.0, 660.0, 528.0)
    with pytest.raises(TypeError, match="unknown keyword argument 'argnum'"):
        rvm.grad(f, loss=0, argnum=1)
    with pytest.raises(TypeError, match="arguments of f are f0, f1, f2"):
        rvm.grad(f, loss=0)(0.0, f7=1.0)
    with pytest.raises(rvm.UsageError, match="out of range"):
        rvm.grad(f, loss=0, argnums=5)(0.0, 1.0, 3.0)
    assert rvm.grad(f, loss=0, argnums=range(1, 3))(0.0, 1.0, 3.0) == (660.0, 528.0)
    assert rvm.grad(f, loss=0, argnums=np.array([2]))(0.0, 1.0, 3.0) == (528.0,)


@pytest.mark.parametrize("argnums, wrt, message", [
    ((1.5,), None, "argnums: 1.5 is not an argument index"),   # (it took argument 1's)
    ((2.9,), None, "argnums: 2.9 is not an argument index"),   # (argument 2's)
    (1.0, None, "argnums must be an argument index or name, or a sequence"),
    ({1: 2}, None, "argnums must be"), (True, None, "argnums must be"),
    ([[1]], None, "argnums must be"), (None, [["f1"]], "wrt must be"),
    (None, 3.0, "wrt must be")])
def test_argnums_and_wrt_of_the_wrong_kind_are_refused(argnums, wrt, message):
    """An index that is not an int, or a container that is not a sequence, is a usage
    error, not an argument taken by int() of it nor a TypeError from inside."""
    f = rvm.load(pathlib.Path(__file__).resolve().parent.parent / "asm" / "poly.rasm")["f"]
    with pytest.raises(rvm.UsageError, match=re.escape(message)):
        rvm.grad(f, loss=0, argnums=argnums, wrt=wrt)(0.0, 1.0, 3.0)


@pytest.mark.parametrize("loss, message", [
    ((2, (5,)), "loss element (5,) is outside y (shape (2,))"),
    ((1, (2, 0)), "loss element (2, 0) is outside A (shape (2, 3))"),
    ((2, "a"), "loss element 'a' of y (shape (2,)): an element is an int"),
    ((1, (0, 0, 0)), "a tuple of 2 ints, one per axis"),
    ((2, 1.5), "loss element 1.5 of y"),
    ((1, (0, 0.0)), "loss element (0, 0.0) of A"),
    ((2,), "loss (2,): name an array's element as (argument, index)"),
    ((2, 0, 1), "loss (2, 0, 1): name an array's element")])
def test_a_malformed_loss_element_is_an_rvm_error(loss, message):
    """Each malformed (argument, element) loss is one rvm error naming it: they were
    numpy's ValueError and TypeError, or an unpacking error, and (3, 1.5) was taken as
    element 1."""
    f = rvm.reversible.source('''
def f(out: float, A: Array[float, 2], y: Array[float]):
    out += np.sum(A * A)
    out += np.sum(y * y)
''', {"Array": rvm.Array, "np": np})
    with pytest.raises(rvm.RvmError, match=re.escape(message)):
        rvm.grad(f, loss=loss)(0.0, np.ones((2, 3)), np.ones(2))
    unit = np.zeros((2, 3))
    unit[1, 2] = 1.0            # (the loss A[1, 2], which f leaves as it is)
    assert (rvm.grad(f, loss=(1, (1, 2)))(0.0, np.ones((2, 3)), np.ones(2))[1] == unit).all()


def test_arrays_of_other_dtypes_lists_and_0d_arrays_are_converted():
    p = rvm.load(pathlib.Path(__file__).resolve().parent.parent / "asm" / "arrays.rasm")
    for x in (np.array([1, 2], dtype=np.float32), [1.0, 2.0], (1.0, 2.0)):
        out = p.call("sumsq", x, np.array(0.5))
        assert out[1] == 5.5 and out[0].dtype == np.float64
    with pytest.raises(rvm.MachineError, match="does not fit in int64"):
        p.call("sumsq", np.array([2 ** 64 - 1], dtype=np.uint64), 0.5)  # (it wrapped to -1)
    i32 = np.array([3, 4], dtype=np.int32)
    assert rvm.load(pathlib.Path(__file__).resolve().parent.parent / "asm" /
                    "reverse.rasm").call("reverse", i32)[0].dtype == np.int64


# ---------------------------------------------------------------- errors in the user's terms

ERRS = """import rvm
from rvm import ancilla


@rvm.reversible
def dirty(out: float, x: float):
    with ancilla(t=0.0):
        t += x
        out += t * 2.0
        t += 1.0


@rvm.reversible
def broken_if(out: float, x: float):
    if (x < 1.0, out < 1.0):
        out += 5.0
    else:
        out += 0.5
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_runtime_errors_name_source_variables_and_constructs(tmp_path, engine):
    path = tmp_path / "errs.py"
    path.write_text(ERRS)
    p = rvm.load(path)
    with pytest.raises(rvm.InvertibilityError) as e:
        p.call("dirty", 0.0, 1.0, engine=engine)
    assert "ancilla `t` is 2.0 when its block ends at line 7; it must be back to 0.0" \
        in str(e.value)
    assert "f2" in e.value.detail and "f2" not in str(e.value)
    with pytest.raises(rvm.InvertibilityError) as e:
        p.call("broken_if", 0.0, 0.5, engine=engine)
    assert ("the `if` at line 15: its post-condition `out < 1.0` is false after the "
            "then-branch, with out = 5.0") in str(e.value)
    with pytest.raises(rvm.InvertibilityError, match="is true after the else-branch"):
        p.call("broken_if", 0.0, 3.0, engine=engine)
    assert str(e.value).count("InvertibilityError") == 0


def test_errors_from_python_calls_show_the_users_frame(tmp_path):
    import traceback
    path = tmp_path / "errs.py"
    path.write_text(ERRS)
    p = rvm.load(path)
    try:
        p.call("dirty", 0.0, 1.0)
    except rvm.InvertibilityError as e:
        frames = traceback.extract_tb(e.__traceback__)
    assert len(frames) <= 3 and not any("machine.py" in f.filename for f in frames)


def test_verbose_cli_errors_keep_the_register_detail(tmp_path):
    path = tmp_path / "errs.py"
    path.write_text(ERRS)
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(path), "--entry",
                        "dirty", "--args", "0.0", "1.0", "--verbose"], capture_output=True,
                       text=True)
    assert r.returncode == 1 and "ancilla `t`" in r.stderr and "ZERO     f2" in r.stderr
