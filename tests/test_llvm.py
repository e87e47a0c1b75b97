"""The LLVM back end of the native engine (programs that never touch the heap): every
instruction form agrees with the python engine forwards, backwards and in gradient mode;
int64 edge cases wrap or fail as the machine says; failures are reported, never crash."""

import functools
import math
import random

import numpy as np
import pytest
from test_roundtrip import CASES, build

import rvm
from rvm import Array, ancilla, compute
from rvm.core import isa
from rvm.engines import llvm, native
from rvm.engines.compiled import compiled
from rvm.engines.templates import STATE

pytestmark = pytest.mark.skipif(not (native.available and llvm.usable()),
                                reason="llvmlite is not installed")

SCALAR = [(op, cls) for op, cls in CASES if isa.OPS[op].group != "memory"]


def on_llvm(program) -> bool:
    """Did the native engine give this program LLVM-compiled functions?"""
    funcs = compiled(program, True, native=True)._native
    return bool(funcs) and all(isinstance(f["F0_fw"], llvm.Run) for f in funcs.values())


def agree(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(agree(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and (a == b or np.isclose(a, b, rtol=1e-13, atol=1e-13)
                                       or (a != a and b != b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("op,cls", SCALAR, ids=[f"{o}-{c}" for o, c in SCALAR])
def test_every_instruction_form_agrees_with_the_python_engine(op, cls):
    rng = random.Random(f"llvm {op} {cls}")
    for _ in range(12):
        text, values = build(isa.OPS[op], cls, rng)
        if op.startswith("ASSERT."):
            a = rng.uniform(-3, 3)
            b = {"EQ": a, "NE": a + 1, "LT": a + 1, "LE": a, "GT": a - 1, "GE": a}[op[7:]]
            text, values = f".func t(f0, f1)\n        {op} f0, f1\n.end\n", [a, b]
        results = {}
        for engine in ("python", "native"):
            p = rvm.assemble(text)
            out = p.call("t", *values, engine=engine)
            back = p.uncall("t", *out, engine=engine)
            grad = rvm.grad(p["t"], loss=0, engine=engine)(*values) \
                if text.split("(")[1].startswith("f") else None
            results[engine] = (out, back, grad)
            if engine == "native":
                assert on_llvm(p), text
        assert agree(results["python"], results["native"]), (text, values, results)


EDGES = [   # (instruction, r0, r1): int64 wrapping and Python's floor division and modulo
    ("ADD r0, r1", 2 ** 63 - 1, 1), ("SUB r0, r1", -2 ** 63, 1),
    ("ADD.mul r0, r1, r1", 0, 2 ** 40), ("ADD.div r0, r1, -3", 0, 7),
    ("ADD.div r0, r1, -3", 0, -7), ("ADD.div r0, r1, 3", 0, -7), ("ADD.mod r0, r1, -3", 0, 7),
    ("ADD.mod r0, r1, 3", 0, -7), ("ADD.mod r0, r1, -3", 0, -7),
    ("ADD.div r0, r1, -1", 0, -2 ** 63), ("ADD.mod r0, r1, -1", 5, -2 ** 63),
    ("ADD.abs r0, r1", 0, -2 ** 63), ("NEG r0", -2 ** 63, 0), ("XOR.lt r0, r1, 2", 1, 1),
]


@pytest.mark.parametrize("body,a,b", EDGES)
def test_int64_edges_agree_with_the_python_engine(body, a, b):
    text = f".func t(r0, r1)\n    {body}\n.end\n"
    got = {e: rvm.assemble(text).call("t", a, b, engine=e) for e in ("python", "native")}
    assert got["python"] == got["native"], got


@pytest.mark.parametrize("body", ["ADD.div r0, r1, r2", "ADD.mod r0, r1, r2"])
def test_integer_division_by_zero_is_an_error_not_a_crash(body):
    p = rvm.assemble(f".func t(r0, r1, r2)\n    {body}\n.end\n")
    with pytest.raises(rvm.RvmError):
        p.call("t", 0, 5, 0, engine="native")
    assert p.call("t", 0, 5, 2, engine="native") == (2 if "div" in body else 1, 5, 2)
    assert on_llvm(p)


def test_failures_are_reported_from_the_interpreter():
    """A failed check, a non-finite result and an exhausted budget end the native run;
    the machine re-runs the pass on the interpreter, which names the instruction."""
    p = rvm.assemble(".func t(f0, f1)\n    ZERO f1\n    ADD.log f0, f1\n.end\n")
    with pytest.raises(rvm.RvmError, match="must be 0"):
        p.call("t", 0.0, 1.0, engine="native")
    with pytest.raises(rvm.RvmError, match=r"ADD\.log"):
        p.call("t", 0.0, 0.0, engine="native")
    assert on_llvm(p)
    loop = rvm.assemble(ASM_LOOP)
    with pytest.raises(rvm.RvmError, match="budget"):
        loop.call("t", 0, engine="native", max_steps=1000)


ASM_LOOP = """
.func t(r0)
top:    CF.NE   r1, 0, back
        INC     r1
exit:   BR.EQ   r1, 0, done
back:   JMP     top
done:   CF      exit
.end
"""


def test_calls_and_loops_agree_with_the_python_engine(monkeypatch):
    import pathlib
    root = pathlib.Path(__file__).resolve().parent.parent
    text = (root / "asm" / "isqrt.rasm").read_text()       # CALL and UNCALL in a loop
    for n in (0, 17, 10 ** 6):
        out = {e: rvm.assemble(text).call("isqrt", n, 7, engine=e) for e in ("python", "native")}
        assert out["python"] == out["native"] == (n, 7 + int(n ** 0.5))
    monkeypatch.syspath_prepend(str(root / "examples"))
    from besselj import besselj
    want = rvm.grad(besselj, loss="out", engine="python")(0.0, 3, 2.5)
    got = rvm.grad(besselj, loss="out", engine="native")(0.0, 3, 2.5)
    assert agree(want, got)


def test_the_block_loop_is_lowered_as_the_programs_own_branches():
    """Every `_b = k` of the generated code's block loop is a branch straight to block k
    (or out of the loop), not a store that goes round through one switch: LLVM then sees
    the program's control flow (the optimised loops are 15-30% faster)."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parent.parent
    program = rvm.assemble((root / "asm" / "isqrt.rasm").read_text())
    source = compiled(program, True, native=True).native_bodies
    assert "while _b >= 0:" in source
    text = llvm.ir_module(source, 1e-9, {}, {})
    stores = 0
    for function in re.findall(r"define .*?\n}", text, re.S):
        lines = [line.strip() for line in function.splitlines()]
        switches = [k for k, line in enumerate(lines) if line.startswith("switch ")]
        assert len(switches) <= 1
        for k, line in enumerate(lines):
            if switches and k > switches[0] and \
                    re.match(r'store i64 -?\d+, (i64\*|ptr) %"_b"', line):
                stores += 1
                assert lines[k + 1].startswith("br label"), lines[k - 2: k + 2]
                head = lines[switches[0] - 2].rstrip(":").strip('"')
                assert lines[k + 1] != f'br label %"{head}"'
    assert stores > 8


def test_a_program_the_back_end_cannot_lower_runs_on_the_python_engine(monkeypatch,
                                                                      tmp_path):
    """Native code that cannot be made (the lowering refuses the generated code) is a
    warning and a run on the python engine, never a traceback."""
    from rvm.engines.lowering import Unsupported
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))

    def refuse(*a, **k):
        raise Unsupported("a construct the back end does not lower")
    monkeypatch.setattr(llvm, "ir_module", refuse)
    p = rvm.assemble(".func t(f0, f1)\n    ADD.sin f0, f1\n.end\n")
    with pytest.warns(UserWarning, match="could not compile"):
        assert p.call("t", 0.0, 1.0, engine="native")[0] == pytest.approx(np.sin(1.0))


def test_entries_refuse_bad_arguments_without_crashing():
    from rvm.engines.native import Functions
    from rvm.engines.templates import Fault
    p = rvm.assemble(".func t(f0, r0)\n    ADD f0, r0\n.end\n")
    funcs = Functions(compiled(p, True, native=True), 1e-9)
    run, top = funcs["F0_fw"], np.array([0, 1000] + [0] * (STATE - 2), np.int64)
    hi, hg = np.zeros(1, np.int64), np.zeros(1)
    with pytest.raises(TypeError):      # a state array shorter than native code writes
        run(None, None, None, top[:2].copy(), 1.5, 2)
    assert run(None, None, None, top, 1.5, 2) == (3.5, 2)      # no heap: none needed
    assert run(hi, None, hg, top, 1.5, 2) == (3.5, 2)
    assert top[1] == 998                     # one step charged to the budget per call
    with pytest.raises(Fault):
        run(None, None, None, top, 1.5)              # too few arguments: no read past them
    with pytest.raises(TypeError):
        run(None, None, None, top, 1.5, "two")
    with pytest.raises(OverflowError):
        run(None, None, None, top, 1.5, 2 ** 64)
    with pytest.raises(TypeError):
        run(None, None, None, np.zeros(2), 1.5, 2)     # the state array must be int64
    with pytest.raises(TypeError):
        run(hi, None, np.zeros(0), top, 1.5, 2)          # shadows for every cell
    assert run(None, None, None, top, 1.5, 2) == (3.5, 2)


HEAP_PROGRAMS = {   # name: (text, arguments, expected results or None for an error)
    "grow": (".func t(r0, r1)\n    ALLOC r1, r0\n    FREE r1, r0\n.end\n", (1000, 0),
             (1000, 0)),
    "pop-empty": (".func t(f0)\n    POP f0\n.end\n", (0.0,), None),
    "free-dirty": (".func t(r0, f0)\n    ALLOC r0, 2\n    EXCH f0, [r0 + 1]\n"
                   "    FREE r0, 2\n.end\n", (0, 1.5), None),
    "push-pop": (".func t(f0, f1)\n    PUSH f0\n    ADD f1, 2.0\n    POP f0\n.end\n",
                 (1.5, 1.0), (1.5, 3.0)),
    "exchange": (".func t(r0, f0)\n    ALLOC r0, 3\n    EXCH f0, [r0 + 2]\n"
                 "    ADDM f0, [r0 + 2]\n    SUBM f0, [r0 + 2]\n    EXCH f0, [r0 + 2]\n"
                 "    FREE r0, 3\n.end\n", (0, 2.5), (0, 2.5)),
}


@pytest.mark.parametrize("name", HEAP_PROGRAMS)
def test_heap_programs_agree_with_the_python_engine(name):
    """The heap helpers (ALLOC, FREE, PUSH, POP) and cell access in LLVM code: the same
    results, or the same error; a full heap grows and the run goes native again."""
    text, args, want = HEAP_PROGRAMS[name]
    out = {}
    for engine in ("python", "native"):
        p = rvm.assemble(text)
        try:
            out[engine] = p.call("t", *args, engine=engine)
        except rvm.RvmError as e:
            out[engine] = str(e)
        if engine == "native":
            assert on_llvm(p)
    assert out["python"] == out["native"]
    if want is not None:
        assert out["native"] == want
    else:
        assert isinstance(out["native"], str)


@pytest.mark.parametrize("at", [0, 1, 7, 8, 30, 36])
@pytest.mark.parametrize("value", [1.5, 1e-12, 5e-324, float("nan")])
def test_free_tests_every_cell_of_the_block(at, value):
    """FREE of a 37-cell block (a vector loop's body and remainder) fails wherever the
    one dirty cell is, as on the python engine, and passes a value within the tolerance
    (1e-12); the block's cells are tested together, after the scan."""
    text = (".func t(r0, r1, f0)\n    ALLOC r0, 37\n    EXCH f0, [r0 + r1]\n"
            "    FREE r0, 37\n.end\n")
    out = {}
    for engine in ("python", "native"):
        p = rvm.assemble(text)
        try:
            out[engine] = p.call("t", 0, at, value, engine=engine)
        except rvm.RvmError as e:
            out[engine] = str(e)
        if engine == "native":      # (a nan argument: the python engine runs it, as
            assert on_llvm(p) != (value != value)   # native code would refuse it)
    assert out["python"] == out["native"]
    assert isinstance(out["native"], str) == (value != 1e-12)


def test_counted_loops_are_lowered_with_an_exact_entry_test():
    """A counted loop's entry test is Python arithmetic (unbounded ints); LLVM code makes
    it with overflow-checked operations, and the loop's passes without per-pass checks
    (the test's results and failures are in test_engines)."""
    from test_engines import ROW
    p = rvm.assemble(ROW, "row.rasm")
    assert p.call("row", 4, 2, 0, 1.5, 0.0, engine="native") == (4, 2, 8, 1.5, 1.5)
    assert on_llvm(p)
    source = compiled(p, True, native=True).native_bodies
    assert "if _exact(" in source and "for _ in _finite_after(range(" in source
    text = llvm.ir_module(source, 1e-9, {}, {})
    assert "llvm.smul.with.overflow.i64" in text and "llvm.sadd.with.overflow.i64" in text


def test_a_counted_loops_entry_test_works_out_each_sum_once():
    """The entry tests repeat their bounds' sums (each element address's, at the first
    and the last pass, for each check of it): each distinct +, - or * of a test is one
    overflow-checked operation in the LLVM code, made once, however often it appears."""
    import ast
    import re

    from test_engines import ROW
    p = rvm.assemble(ROW, "row.rasm")
    source = compiled(p, True, native=True).native_bodies
    forward = source[source.index("def F0_fw("):]
    forward = forward[:forward.index("\ndef ")]
    test = next(line.strip()[3:-1] for line in forward.split("\n") if "_exact(" in line)
    sums = [ast.dump(n) for n in ast.walk(ast.parse(test, mode="eval"))
            if isinstance(n, ast.BinOp) and type(n.op) in (ast.Add, ast.Sub, ast.Mult)]
    assert len(sums) > 2 * len(set(sums))       # (the test repeats them)

    def checked(source) -> int:     # overflow-checked operations in F0_fw's LLVM code
        text = llvm.ir_module(source, 1e-9, {}, {})
        ir = text[text.index('@"F0_fw_"('):]
        return len(re.findall(r"call \{i64, i1\} @\"llvm\.s\w+\.with\.overflow",
                              ir[:ir.index("\n}")]))
    # (the build without counted loops has the general loop's own: its address sum)
    plain = compiled(p, True, native=True, strict=True).native_bodies
    assert checked(source) == checked(plain) + len(set(sums))
    assert p.call("row", 4, 2, 0, 1.5, 0.0, engine="native") == (4, 2, 8, 1.5, 1.5)


def test_shadow_arithmetic_may_drop_the_sign_of_zero():
    """A gradient pass's shadow arithmetic is lowered with LLVM's nsz flag (a shadow that
    is zero may come out as -0.0 or 0.0), so that a shadow made zero and then added to
    is just the addition; the values' own arithmetic keeps IEEE semantics exactly."""
    p = rvm.assemble(".func sq(f0, f1)\n    ADD.mul f1, f0, f0\n.end\n")
    source = compiled(p, True, native=True).native_bodies
    text = llvm.ir_module(source, 1e-9, {}, {})
    forward = text[text.index('@"F0_fw_"('):]
    forward = forward[:forward.index("\n}")]
    back = text[text.index('@"F0_gbw_"('):]
    back = back[:back.index("\n}")]
    assert "nsz" not in forward and "fmul double" in forward
    assert "fmul nsz double" in back and "fadd nsz double" in back
    assert rvm.grad(p["sq"], loss="f1", engine="native")(3.0, 0.0)[0] == 6.0


def test_a_heap_address_is_its_checks_sum_without_a_mask():
    """Native text masks each heap address by its check (`_a = (r0 + r1) * _m`, so that a
    failed check folded into a flag touches cell 0 only); the LLVM code branches to the
    fault exit on each check instead, so after it the address is the sum the check made:
    no multiplication by the mask, and no second addition of the two registers."""
    import re
    text = (".func t(r0, r1, f0)\n    ALLOC r2, 4\n    EXCH f0, [r0 + r1]\n"
            "    EXCH f0, [r0 + r1]\n    FREE r2, 4\n.end\n")
    p = rvm.assemble(text)
    source = compiled(p, True, native=True).native_bodies
    assert source.count(") * _m") >= 2
    ir = llvm.ir_module(source, 1e-9, {}, {})
    ir = ir[ir.index('@"F0_fw_"('):]
    ir = ir[:ir.index("\n}")]
    assert "mul i64" not in ir
    sums = re.findall(r"(%\S+) = call \{i64, i1\} @\"llvm\.sadd\.with\.overflow", ir)
    assert len(sums) == 2
    assert not re.search(r"= add i64 %\S+, %\S+\n", ir)      # (only constants added)
    assert p.call("t", 1, 2, 2.5, engine="native") == (1, 2, 2.5)


def test_native_text_keeps_the_machines_operations_for_the_back_end_to_read():
    """Native code's text is the compiled engine's, its checks folded into a flag: the
    machine's operations and fields stay as the Python engine writes them (`M.alloc(n)`,
    `M.hf[a]`, `M.budget`, a fault's message), and the back end takes them from the
    parsed function (rvm.engines.lowering.MachineOperations), not from text rewritten by
    regular expressions."""
    import ast

    from rvm.engines.lowering import native_tree
    text = (".func t(r0, f0)\n    ALLOC r2, 4\n    EXCH f0, [r2 + 1]\n    PUSH r0\n"
            "    POP r0\n    EXCH f0, [r2 + 1]\n    FREE r2, 4\n.end\n")
    p = rvm.assemble(text)
    c = compiled(p, True, native=True)
    fw = c.name("t", "fw")
    source = c.native_text([fw])
    for form in ("def F0_fw(M, ", "M.alloc(", "M.hf[_a]", "M.push(r0)", "M.pop(False)",
                 "M.free(", "_n = M.budget", "M.budget = _n", "raise Limit('step budget"):
        assert form in source, form
    assert "alloc(HI" not in source and "TOP[1]" not in source
    native = ast.unparse(native_tree(ast.parse(source).body[0]))
    for form in ("def F0_fw(HI, HF, HG, TOP, r0: int, f0: float)", "alloc(HI, TOP, ",
                 "HF[_a]", "push(HI, TOP, r0)", "pop(HI, HI, TOP)", "free(HI, HF, HG, TOP, ",
                 "_n = TOP[1]", "TOP[1] = _n", "raise Fault('step budget exhausted')"):
        assert form in native, form
    assert "M." not in native
    run = llvm.functions(source, {}, {}, 1e-9)[fw]
    assert run is not None and p.call("t", 7, 2.5, engine="native") == (7, 2.5)


ADDRESSES = [(0, 3), (3, 0), (2, -1), (-1, 1), (4, 0), (0, -1), (-1, -1),
             (-2 ** 63, -2 ** 63), (2 ** 63 - 1, 1), (2 ** 62, 2 ** 62), (1, 2 ** 63 - 1)]


@pytest.mark.parametrize("base,off", ADDRESSES)
def test_register_offset_addresses_at_the_int64_edges(base, off):
    """[rB + rO] is in the heap iff rB or rO is not negative and 0 <= rB + rO < top, in
    the LLVM code's overflow-checked form too: two negative terms that wrap into the heap,
    and sums past int64's top, are refused like the python engine refuses them."""
    text = (".func t(r0, r1, f0)\n    ALLOC r2, 4\n    EXCH f0, [r0 + r1]\n"
            "    EXCH f0, [r0 + r1]\n    FREE r2, 4\n.end\n")
    out = {}
    for engine in ("python", "native"):
        p = rvm.assemble(text)
        try:
            out[engine] = p.call("t", base, off, 2.5, engine=engine)
        except rvm.RvmError as e:
            out[engine] = type(e).__name__
    assert out["python"] == out["native"]
    inside = (base >= 0 or off >= 0) and 0 <= base + off < 4
    assert isinstance(out["native"], tuple) == inside
    assert on_llvm(p)


SWAP_LOOP = """
.func helper(r0, r1, f0, f1)
        XOR.and r1, r0, 12
L2:     CF.NE   r11, 0, L4
        SWAP    r1, r0
L7:     BR.GE   r0, 0, L9
L8:     JMP     L10
L9:     CF      L7
L10:    CF.LT   r0, 0, L8
        INC     r11
L3:     BR.EQ   r11, 2, L6
L4:     JMP     L2
L6:     CF      L3
        SUB     r11, 2
.end

.func main(r0, r1, r2, f0, f1, f2)
L2:     CF.NE   r11, 0, L4
        ALLOC   r17, 2
        EXCH    f2, [r17 + 1]
        PUSH    r0
        POP     r0
L8:     BR.LE   r0, r2, L10
L9:     JMP     L11
L10:    CF      L8
L11:    CF.GT   r0, r2, L9
        EXCH    f2, [r17 + 1]
        FREE    r17, 2
        INC     r11
L3:     BR.EQ   r11, 1, L5
L4:     JMP     L2
L5:     CF      L3
        SUB     r11, 1
        UNCALL  helper, r1, r0, f0, f1
.end
"""

@pytest.mark.parametrize("hashseed", ["1", "2", "3"])
def test_a_loop_that_swaps_two_registers_is_compiled_correctly(tmp_path, hashseed):
    """A random program (found by fuzzing) that LLVM's early tail duplication miscompiled
    in the LLVM llvmlite ships: the swap on the helper's back edge was made twice on one
    path. rvm turns that pass off (llvm.safe_codegen). Fresh processes with fixed hash
    seeds, since the order of the function's locals (and so whether the bug shows)
    follows Python's string hashing; without the workaround all three gave wrong
    results."""
    import os
    import subprocess
    import sys
    script = (
        "import rvm, sys\n"
        "text = sys.stdin.read()\n"
        "bad = 0\n"
        "for a in range(-9, 10, 2):\n"
        "    for c in range(-9, 10, 3):\n"
        "        args = (a, 9, c, -1.125, -0.25, 0.625)\n"
        "        want = rvm.assemble(text).call('main', *args, engine='python')\n"
        "        got = rvm.assemble(text).call('main', *args, engine='native')\n"
        "        bad += want != got\n"
        "print(bad)\n")
    env = dict(os.environ, PYTHONHASHSEED=hashseed, RVM_CACHE_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", script], input=SWAP_LOOP, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


def test_batch_loops_agree_with_the_python_engine(monkeypatch):
    """rvm.vmap of a call, a gradient and a Jacobian: one LLVM loop over the rows (numba
    is not needed), the same numbers as row by row on the python engine."""
    loops = []
    run = llvm.Batch.__call__
    monkeypatch.setattr(llvm.Batch, "__call__",
                        lambda self, *a: loops.append(self.mode) or run(self, *a))
    p = rvm.assemble(".func t(f0, f1, r0)\n    ADD.sin f0, f1\n    ADD.mul f1, r0, f0\n"
                     "    XOR r0, 5\n.end\n")
    xs, ys, ns = np.linspace(-1, 1, 7), np.linspace(0.5, 2, 7), np.arange(7)
    rows = list(zip(xs, ys, ns.tolist()))
    for engine in ("native",):
        call = rvm.vmap(functools.partial(p["t"], engine=engine))(xs, ys, ns)
        want = [p.call("t", *r, engine="python") for r in rows]
        assert np.allclose(np.array(call).T, want) and call[2].dtype == np.int64
        grad = rvm.vmap(rvm.grad(p["t"], loss=1, engine=engine))(xs, ys, ns)
        want = [rvm.grad(p["t"], loss=1, engine="python")(*r) for r in rows]
        assert np.allclose(grad[0], [w[0] for w in want])
        assert np.allclose(grad[1], [w[1] for w in want])
        jac = rvm.vmap(rvm.jacobian(p["t"], outputs=(0, 1), wrt=(0, 1), engine=engine))(
            xs, ys, ns)
        want = [rvm.jacobian(p["t"], outputs=(0, 1), wrt=(0, 1), engine="python")(*r)
                for r in rows]
        assert np.allclose(jac, want)
    assert loops == ["csb", "vgsb", "jsb"] and on_llvm(p)


def test_batch_loops_check_their_arrays():
    from rvm.engines.native import Functions
    from rvm.engines.templates import Fault
    p = rvm.assemble(".func t(f0, r0)\n    ADD f0, r0\n    ASSERT.LT r0, 5\n.end\n")
    loop = Functions(compiled(p, True, native=True), 1e-9)["F0_csb"]
    xs, ns = np.zeros(4), np.arange(4)
    o0, o1 = np.empty(4), np.empty(4, np.int64)
    loop(1000, xs, ns, o0, o1)
    assert o0.tolist() == [0.0, 1.0, 2.0, 3.0] and o1.tolist() == [0, 1, 2, 3]
    for bad in [(xs, ns.astype(float), o0, o1), (xs, ns, o0[:2], o1), (xs, ns, o0),
                (xs, ns, np.empty(8)[::2], o1)]:                  # not contiguous
        with pytest.raises(TypeError):
            loop(1000, *bad)
    with pytest.raises(Fault):       # a row fails its assertion: the caller goes row by row
        loop(1000, xs, np.arange(4) + 3, o0, o1)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_cached_object_is_compiled_again_not_loaded(tmp_path, damage):
    """Machine code that is not what LLVM wrote would crash the process: the cached file
    carries a digest of its contents, and one that does not match is made again (in a
    child process, so a crash would fail the test instead of ending the run)."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, RVM_CACHE_DIR=str(tmp_path))
    script = ("import rvm; p = rvm.load('asm/poly.rasm'); "
              "print(p.call('f', 0.0, 1.0, 3.0, engine='native'))")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = lambda: subprocess.run([sys.executable, "-c", script], cwd=root, env=env,
                                 capture_output=True, text=True, timeout=300)
    assert run().stdout.strip() == "(484.0, 1.0, 3.0)"
    [obj] = tmp_path.glob("rvm_llvm_*.o")
    data = obj.read_bytes()
    obj.write_bytes({"garbage": os.urandom(len(data)), "truncated": data[:len(data) // 2],
                     "empty": b""}[damage])
    again = run()
    assert again.returncode == 0 and again.stdout.strip() == "(484.0, 1.0, 3.0)", again.stderr
    assert obj.read_bytes() == data             # written again, whole


def test_a_changed_lowering_never_loads_old_machine_code(tmp_path, monkeypatch):
    """The cached object's name follows the LLVM back end's own text too: machine code
    from another version of the lowering (an editable install changes without a
    version number) is compiled again, not loaded."""
    from rvm.engines.native import Functions
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    p = rvm.assemble(".func t(f0, r0)\n    ADD f0, r0\n.end\n")
    Functions(compiled(p, True, native=True), 1e-9)["F0_fw"]
    first = set(tmp_path.glob("rvm_llvm_*.o"))
    Functions(compiled(p, True, native=True), 1e-9)["F0_fw"]
    assert set(tmp_path.glob("rvm_llvm_*.o")) == first and len(first) == 1
    monkeypatch.setattr(llvm, "_lowering_digest", lambda: "another lowering")
    funcs = Functions(compiled(p, True, native=True), 1e-9)
    funcs["F0_fw"]
    assert len(set(tmp_path.glob("rvm_llvm_*.o")) - first) == 1
    top = np.array([0, 1000] + [0] * (STATE - 2), np.int64)
    assert funcs["F0_fw"](None, None, None, top, 1.5, 2) == (3.5, 2)


def test_heap_programs_in_gradient_mode_agree_with_the_python_engine():
    """The gradient forms of the heap helpers (a push keeps the shadow, a pop restores
    it) and of exchanges with heap cells, on LLVM code."""
    text = (".func t(f0, f1, r0)\n    ALLOC r0, 2\n    ADD.mul f1, f0, f0\n    PUSH f1\n"
            "    ADD.sin f1, f0\n    EXCH f1, [r0 + 1]\n    ADDM f0, [r0 + 1]\n"
            "    SUBM f0, [r0 + 1]\n    EXCH f1, [r0 + 1]\n    SUB.sin f1, f0\n    POP f1\n"
            "    ADD.exp f1, f0\n    FREE r0, 2\n.end\n")
    got = {}
    for engine in ("python", "native"):
        p = rvm.assemble(text)
        got[engine] = rvm.value_and_grad(p["t"], loss=1, engine=engine)(0.3, 0.5, 0)
        if engine == "native":
            assert on_llvm(p)
    assert agree(got["python"], got["native"]), got



def _weighted(minus: bool = False):
    """A fresh reversible function (its own program, compiled anew) with heap arrays,
    calls and a compute block (minus: the same but for one instruction, SUB for ADD)."""
    @rvm.reversible
    def square_into(out: float, s: float):
        out += s * s

    if minus:
        @rvm.reversible
        def square_into(out: float, s: float):
            out -= s * s

    @rvm.reversible
    def weighted(out: float, a: Array[float], b: Array[float]):
        with ancilla(s=0.0):
            with compute() as c:
                for i in range(len(a)):
                    s += a[i] * b[i]
            square_into(out, s)
            ~c
    return weighted


def test_a_cached_program_loads_without_writing_its_functions(monkeypatch, tmp_path):
    """Machine code in the cache is found by the program and the code generator's own
    text: a program whose code is there is never written out as generated functions nor
    rewritten for native code (seconds for a large program), and a native run never
    makes the Python engine's module either; the code loaded computes what the code
    compiled did, and a program that differs in one instruction is compiled anew."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    a, b = np.linspace(1.0, 2.0, 7), np.linspace(-1.0, 3.0, 7)
    made = []
    for _ in range(2):                  # compiled, then loaded from the cache
        f = _weighted()
        value, grads = rvm.value_and_grad(f, loss="out", engine="native")(0.5, a, b)
        program = f.specialize((0.5, a, b))[0]
        comp = compiled(program, native=True)
        made.append((bool(comp._bodies), bool(comp._native_bodies),
                     "source" in vars(comp), value[0], grads[1].tolist()))
    assert made[0][:3] == (True, True, False) and made[1][:3] == (False, False, False)
    assert made[0][3:] == made[1][3:]
    assert made[0][3] == pytest.approx(0.5 + (a @ b) ** 2)
    assert _weighted(minus=True)(0.5, a, b, engine="native")[0] == \
        pytest.approx(0.5 - (a @ b) ** 2)


def _scalar():
    """A fresh scalar reversible function (its own program: rvm.vmap runs it natively)."""
    @rvm.reversible
    def cube(out: float, x: float):
        out += x * x * x
    return cube


def test_a_cached_batch_loop_loads_without_writing_its_functions(monkeypatch, tmp_path):
    """The same for a batch loop (rvm.vmap of a gradient): from the cache, the program
    is not written out, and the rows' gradients are the same."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    xs = np.linspace(-2.0, 2.0, 50)
    made = []
    for _ in range(2):
        f = _scalar()
        grads = rvm.vmap(rvm.grad(f, loss="out", engine="native"))(np.zeros(50), xs)[1]
        comp = compiled(f.specialize((0.0, 1.0))[0], native=True)
        assert any(name.endswith("_vgsb") for name in comp._native[(1e-8,)])  # the loop
        made.append((bool(comp._bodies), np.asarray(grads).tolist()))
    assert made[0][0] and not made[1][0]
    assert made[0][1] == made[1][1]
    np.testing.assert_allclose(made[1][1], 3 * xs ** 2)


def test_native_code_is_made_in_groups_on_first_need(monkeypatch, tmp_path):
    """A call compiles the forward run of the function called and what it calls, nothing
    else (not the uncall, not the gradient, not an unrelated function); a gradient then
    compiles its own group; each group is one object file in the cache."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    p = rvm.assemble(".func sq(f0, f1)\n    ADD.mul f1, f0, f0\n.end\n"
                     ".func f(f0, f1, f2)\n    CALL sq, f0, f1\n    ADD.sin f2, f1\n.end\n"
                     ".func other(f0, f1)\n    ADD.exp f1, f0\n.end\n")
    comp = compiled(p, True, native=True)
    assert p.call("f", 0.5, 0.0, 0.0, engine="native") == (0.5, 0.25, math.sin(0.25))
    funcs = comp._native[(1e-8,)]
    assert sorted(funcs) == ["F1_fw"]
    assert sorted(comp._native_bodies) == ["F0_fw", "F1_fw"]
    assert len(list(tmp_path.glob("rvm_llvm_*.o"))) == 1
    g = rvm.grad(p["f"], loss=2, engine="native")(0.5, 0.0, 0.0)
    assert g[0] == pytest.approx(math.cos(0.25) * 2 * 0.5)
    assert not any(name.startswith("F2") for name in comp._native_bodies)
    assert not any(name.endswith("_bw") for name in funcs)
    assert len(list(tmp_path.glob("rvm_llvm_*.o"))) == 2     # the call's, the gradient's


def test_an_entry_keeps_its_code_and_method_table_alive():
    """A native entry (a CPython builtin) holds the library with its machine code and its
    method table: the garbage collector may free what refers to them in any order (at
    interpreter exit it once freed the library first, and the process crashed reading the
    method table of a function still to be freed)."""
    import gc
    import weakref
    p = rvm.assemble(".func f(f0)\n    ADD f0, 1.0\n.end\n", "tiny.rasm")
    c = compiled(p, True, native=True)
    entries = llvm.functions(c.native_bodies, {}, {}, 1e-9)
    run = entries[c.name("f", "fw")]
    call, library = run.call, weakref.ref(run.library)
    del entries, run
    gc.collect()
    assert library() is not None and call.__name__ == c.name("f", "fw")
    del call
    gc.collect()
    assert library() is None


def test_a_function_writes_its_records_in_one_place():
    """Every call that can run out of steps, and every back edge's budget test, leaves the
    frame's registers in a record (rvm.engines.lowering.Lowering.record): one block per
    function writes them, which the sites branch to with what differs (the kind, the
    block, the budget left), not a store of every register at every site."""
    import re
    calls = "\n".join("    CALL     g, r0, f0" for _ in range(12))
    p = rvm.assemble(".func g(r0, f0)\n    ADD f0, 1.0\n.end\n"
                     f".func f(r0, f0)\n{calls}\n"
                     "top: CF.NE r0, 0, again\n    ADD f0, 0.5\n    ADD r0, 1\n"
                     "again: BR.LT r0, 100, top\n    SUB r0, 100\n.end\n")
    text = llvm.ir_module(compiled(p, True, native=True).native_bodies, 1e-9, {}, {})
    body = re.search(r'define [^\n]*@"F1_fw_"\(.*?\n}', text, re.S).group(0)
    assert body.count("CALL") == 0 and len(re.findall(r'@"?F0_fw_"?\(', body)) == 12
    records = re.findall(r'call [^\n]*@"?rvm_record"?\([^\n]*', body)
    # (and one of the copy of the registers a look keeps: Lowering.from_kept)
    kept = [r for r in records if "i64 4," in r]
    assert len(kept) == 1 and 1 <= len(records) - len(kept) <= 2
    assert p.call("f", 0, 0.0, engine="native") == (0, 62.0)
    with pytest.raises(rvm.MachineError, match="step budget"):
        p.call("f", 0, 0.0, engine="native", max_steps=40)


def test_a_locals_type_is_its_declaration_not_its_name():
    """Generated functions declare every local's type (`f2: float`, parameters
    annotated): the back end lowers each local as declared, whatever its name, and
    refuses a local that is not declared rather than guess."""
    import re
    p = rvm.assemble(".func f(f0, f1)\n    ADD f0, f1\n    ADD.exp f2, f0\n"
                     "    SUB.exp f2, f0\n.end\n", "declared.rasm")
    c = compiled(p, True, native=True)
    fw = c.name("f", "fw")
    text = c.native_bodies
    text = text[text.index(f"def {fw}("):]
    text = text[:text.index("\ndef ") + 1] if "\ndef " in text else text
    # the float registers renamed as integer registers are named: r7 is f0, r8 is f2
    renamed = re.sub(r"\bf2\b", "r8", re.sub(r"\bf0\b", "r7", text))
    assert "r7: float" in renamed and "r8: float" in renamed
    run = llvm.functions(renamed, {}, {}, 1e-9)[fw]
    top = np.array([0, 1000] + [0] * (STATE - 2), np.int64)
    assert run(None, None, None, top, 1.5, 0.25) == (1.75, 0.25)
    # a local without its declaration: refused (the engine then runs the Python code)
    undeclared = renamed.replace("    r8: float\n", "")
    with pytest.raises(llvm.Unsupported, match="undeclared type: r8"):
        llvm.functions(undeclared, {}, {}, 1e-9)
