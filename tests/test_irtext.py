"""rvm.engines.irtext, the LLVM IR text writer of the native engine's back end: the
modules it writes are llvmlite.ir's, up to the names of values and blocks. LLVM parses
both to the same module and compiles both to the same machine code, byte for byte."""

import os
import pathlib
import re
import sys

import numpy as np
import pytest
from test_lanes import _parted, _square_into

import rvm
from rvm.engines import irtext, llvm

pytestmark = pytest.mark.skipif(not llvm.usable(), reason="needs llvmlite's LLVM back end")

ROOT = pathlib.Path(__file__).resolve().parent.parent
_LOCAL = re.compile(r'%("[^"]*"|[-\w$.]+)|^("[^"]*"|[-\w$.]+):', re.M)


def canonical(text: str) -> str:
    """The module LLVM parses from `text`, verified and printed, with its local names
    (values and blocks) numbered in order of first appearance in each function."""
    ll = llvm._llvm()[0]
    mod = ll.parse_assembly(text)
    mod.verify()
    out = []
    for chunk in re.split(r"(?m)^(?=define )", str(mod)):
        names: dict = {}

        def rename(m, names=names):
            if m.group(1) is not None:
                return "%v" + str(names.setdefault(m.group(1).strip('"'), len(names)))
            return "v" + str(names.setdefault(m.group(2).strip('"'), len(names))) + ":"
        out.append(re.sub(r"[ \t]+;", " ;", _LOCAL.sub(rename, chunk)))
    return "".join(out)


def machine_code(text: str) -> bytes:
    return llvm._compile_ir(text)


def both(monkeypatch, make):
    """make(ir) -> IR text, with ir llvmlite.ir and then rvm.engines.irtext (as the back
    end's ir module, for the code that asks rvm.engines.llvm._llvm for it)."""
    import llvmlite.ir
    ll, _, tm = llvm._llvm()
    out = []
    for ir in (llvmlite.ir, irtext):
        monkeypatch.setattr(llvm, "_llvm", lambda ir=ir: (ll, ir, tm))
        out.append(make(ir))
    monkeypatch.undo()
    return out


def _every_form(ir) -> str:
    """A module that uses every part of llvmlite.ir the back end uses."""
    i64, i1, f64 = ir.IntType(64), ir.IntType(1), ir.DoubleType()
    v8, m8 = ir.VectorType(f64, 8), ir.VectorType(i1, 8)
    pair = ir.LiteralStructType([i64, f64])
    module = ir.Module(name="t")
    cell = ir.GlobalVariable(module, i64, "cell")
    table = ir.GlobalVariable(module, pair, "table")
    table.linkage, table.global_constant = "internal", True
    table.initializer = ir.Constant(pair, [i64(7), f64(-0.0)])
    libm = ir.Function(module, ir.FunctionType(f64, [f64, f64]), "atan2")
    reduce = ir.Function(module, ir.FunctionType(i1, [m8]), "llvm.vector.reduce.or.v8i1")
    fn = ir.Function(module, ir.FunctionType(pair, [i64.as_pointer(), f64, i64, v8]), "f")
    fn.linkage = "internal"
    fn.args[0].add_attribute("noalias")
    fn.attributes.add("alwaysinline")
    p, x, n, v = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    slot = b.alloca(i64, name="slot")
    two = b.alloca(f64, i64(2), name="slot")        # (the same name twice)
    b.store(x, b.gep(two, [i64(1)]), align=8)
    b.store_atomic(n, cell, "monotonic", 8)
    k = b.load_atomic(cell, "monotonic", 8)
    y = b.fadd(x, b.load(b.gep(two, [i64(1)]), align=8), flags=("nsz",))
    for op in ("fsub", "fmul", "fdiv", "frem"):
        y = getattr(b, op)(y, f64(0.25))
    y = b.fneg(y)
    for op in ("add", "sub", "mul", "sdiv", "srem", "and_", "or_", "xor", "lshr"):
        k = getattr(b, op)(k, i64(3))
    k = b.neg(b.not_(k))
    c = b.and_(b.icmp_signed("<=", k, n), b.icmp_unsigned(">", k, i64(-1)))
    c = b.or_(c, b.fcmp_ordered("==", y, f64(1.5)))
    c = b.xor(c, b.fcmp_unordered("!=", y, f64(float("inf"))))
    c = b.and_(c, b.fcmp_unordered("uno", y, y))
    k = b.select(c, k, b.zext(c, i64))
    y = b.select(c, b.sitofp(k, f64), b.uitofp(c, f64))
    bits = b.bitcast(y, i64)
    addr = b.ptrtoint(p, i64)
    q = b.inttoptr(b.add(addr, b.zext(b.trunc(b.lshr(bits, i64(60)), i1), i64)), p.type)
    b.store(b.load(q), slot)
    fabs = module.declare_intrinsic("llvm.fabs", [f64])
    pow_ = module.declare_intrinsic("llvm.pow", [f64])
    y = b.call(pow_, [b.call(fabs, [y]), b.call(libm, [y, f64(2.0)])])
    w = b.insert_element(v8(0.0), y, i64(3))
    w = b.fmul(w, v, flags=("nsz",))
    y = b.extract_element(w, i64(3))
    any_ = b.call(reduce, [b.fcmp_ordered("<", w, v8(1.0))])
    fn_entry = fn.entry_basic_block
    loop, after = fn.append_basic_block(), fn.append_basic_block("after")
    b.cbranch(any_, loop, after)
    b.position_at_end(loop)
    with b.goto_block(fn_entry):        # (before the entry's terminator)
        late = b.alloca(i1)
    b.store(any_, late)
    with b.if_then(b.load(late)):
        b.store(i64(0), slot)
    sw = b.switch(b.load(slot), after)
    for j in range(3):
        target = fn.append_basic_block()
        sw.add_case(i64(j), target)
        with b.goto_block(target):
            b.branch(after)
    b.position_at_end(after)
    phi = b.phi(i64)
    phi.add_incoming(i64(0), fn_entry)
    for block in fn.blocks[4:8]:       # (the if's end, by default, and the cases)
        phi.add_incoming(k, block)
    out = b.insert_value(ir.Constant(pair, None), phi, 0)
    out = b.insert_value(out, b.extract_value(b.insert_value(out, y, 1), 1), 1)
    never = fn.append_basic_block()
    b.ret(out)
    b.position_at_end(never)
    b.unreachable()
    g = ir.Function(module, ir.FunctionType(ir.IntType(8).as_pointer(), []), "g")
    b = ir.IRBuilder(g.append_basic_block())
    b.call(ir.Function(module, ir.FunctionType(ir.VoidType(), [i64]), "h"), [i64(1)])
    b.ret(ir.Constant(g.return_value.type, None))
    return str(module)


def test_every_form_is_written_as_llvmlite_writes_it(monkeypatch):
    """Each builder call, type, constant and global of the subset prints as llvmlite.ir
    prints it (the module LLVM parses is the same, names aside), and compiles to the same
    machine code."""
    theirs, ours = both(monkeypatch, _every_form)
    assert canonical(ours) == canonical(theirs)
    assert machine_code(ours) == machine_code(theirs)
    assert "0x8000000000000000" in ours         # -0.0 keeps its sign
    assert '%"slot.1" = alloca double, i64 2' in ours


def test_irtext_is_the_default(monkeypatch):
    """The back end writes its IR with irtext unless RVM_IRTEXT=0 (llvmlite.ir, to
    compare); the two never share cached machine code."""
    import llvmlite.ir
    assert (os.environ.get("RVM_IRTEXT", "1") != "0") == llvm.IRTEXT
    assert llvm._llvm()[1] is (irtext if llvm.IRTEXT else llvmlite.ir)
    digest = llvm._lowering_digest.__wrapped__
    monkeypatch.setattr(llvm, "IRTEXT", True)
    ours = digest()
    monkeypatch.setattr(llvm, "IRTEXT", False)
    assert digest() != ours


def _recorded(monkeypatch, tmp_path, run) -> list:
    """The arguments of every ir_module call made while run() runs (on an empty cache)."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    calls = []
    real = llvm.ir_module

    def record(*a, **k):
        calls.append((a, k))
        return real(*a, **k)
    monkeypatch.setattr(llvm, "ir_module", record)
    run()
    monkeypatch.undo()
    assert calls
    return [lambda ir, a=a, k=k: real(*a, **k) for a, k in calls]


def _calls_and_loops():
    """CALL and UNCALL in a loop (isqrt): runs of every mode."""
    rvm.assemble((ROOT / "asm" / "isqrt.rasm").read_text()).call("isqrt", 17, 7,
                                                                   engine="native")


def _bessel():
    """The Bessel function's gradient (a while loop, libm, fused value and gradient)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from besselj import besselj
    finally:
        sys.path.remove(str(ROOT / "examples"))
    rvm.value_and_grad(besselj, loss="out", engine="native")(0.0, 3, 2.5)


def _lanes():
    g = rvm.grad(_parted, loss="out", engine="native")
    rvm.vmap(g, in_axes=(None, 0, 0))(0.0, np.linspace(-2, 2, 11), np.arange(11) % 4)


def _small_lanes():
    g = rvm.grad(_square_into, loss="out", engine="native")
    rvm.vmap(g, in_axes=(None, 0))(0.0, np.linspace(-2, 2, 11))


@pytest.mark.parametrize("program", [
    _calls_and_loops, _small_lanes, pytest.param(_bessel, marks=pytest.mark.slow),
    pytest.param(_lanes, marks=pytest.mark.slow)])
def test_programs_compile_to_the_same_machine_code(monkeypatch, tmp_path, program):
    """The back end's modules for a program (runs, gradients, a batch in lockstep),
    written both ways: LLVM parses them to the same module, names aside, and compiles
    them to the same bytes."""
    for make in _recorded(monkeypatch, tmp_path, program):
        theirs, ours = both(monkeypatch, make)
        assert canonical(ours) == canonical(theirs)
        assert machine_code(ours) == machine_code(theirs)
    if program in (_lanes, _small_lanes):
        assert "<8 x double>" in ours


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
