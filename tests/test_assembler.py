"""Assembly syntax, errors with file:line:col + caret + hint, and round trips."""

import pathlib

import pytest

import rvm
from rvm.core.program import Imm, Mem, Reg
from rvm.formats.bytecode import dumps

ASM = pathlib.Path(__file__).resolve().parent.parent / "asm"


def error(text):
    with pytest.raises(rvm.AsmError) as err:
        rvm.assemble(text, "t.rasm")
    return err.value


def test_syntax_contract_operands():
    p = rvm.assemble("""
; comment
# also a comment
.func f(r0, r1, f0)    ; trailing comment
        ADD     r0, 0x10
        ADD     f0, -0.25
        ADD     f0, 1e-8
        EXCH    r1, [r0]
        EXCH    r1, [r0 + 3]
        EXCH    r1, [r0 - 2]
        EXCH    r1, [r0 + r2]
.end""")
    code = p.functions["f"].code
    assert code[0].args[1] == Imm(16)
    assert code[1].args[1] == Imm(-0.25) and code[2].args[1] == Imm(1e-8)
    assert code[3].args[1] == Mem(Reg("i", 0), 0)
    assert code[4].args[1] == Mem(Reg("i", 0), 3)
    assert code[5].args[1] == Mem(Reg("i", 0), -2)
    assert code[6].args[1] == Mem(Reg("i", 0), Reg("i", 2))
    assert code[0].line == 5


def test_aliases():
    p = rvm.assemble(".func f(r0)\n.alias n r0\n.alias t r1\n ADD t, n\n SUB t, n\n.end")
    assert p.call("f", 4) == (4,)


def test_error_location_caret_and_hint_for_unknown_mnemonic():
    e = error(".func f(r0)\n    ADDD r0, 1\n.end")
    text = str(e)
    assert text.startswith("t.rasm:2:5: error: unknown instruction 'ADDD'")
    assert "    ADDD r0, 1" in text and "\n        ^" in text
    assert "did you mean ADD?" in text


@pytest.mark.parametrize("text,where,msg", [
    (".func f(r0)\n ADD r0,\n.end", "2:9", "expected an operand"),
    (".func f(r0)\n ADD r0 1\n.end", "2:9", "expected ',' between operands"),
    (".func f(r0)\n ADD r0, 1, 2\n.end", "2:2", "ADD takes 2 operands"),
    (".func f(r0)\n EXCH r0, [ 1]\n.end", "2:12", "expected a base register"),
    (".func f(r0)\n EXCH r0, [r1 + 1\n.end", "2:18", "']' to close"),
    (" ADD r0, 1", "1:2", "instruction outside a function"),
    (".func f(r0)\n ADD r0, 1\n", "2:1", "has no .end"),
    (".func f(r0)\nx: NOP\nx: NOP\n.end", "3:1", "label 'x' is already defined"),
    (".func f(r0)\n.end\n.func f(r1)\n.end", "3:7", "defined twice"),
    (".func f(r0, r0)\n.end", "1:13", "listed twice"),
    (".func f(r0)\n ADD r0, $\n.end", "2:10", "unexpected character '$'"),
    (".func f(r0)\n ADD.exp r0, r1\n.end", "2:2", "wrong register class"),
    (".end", "1:1", ".end without .func"),
])
def test_errors_are_located(text, where, msg):
    e = error(text)
    assert f"t.rasm:{where}: error:" in str(e), str(e)
    assert msg in str(e)


@pytest.mark.parametrize("path", sorted(ASM.glob("*.rasm")), ids=lambda p: p.name)
def test_assemble_disassemble_assemble_is_identical(path):
    p1 = rvm.load(path)
    text = rvm.disassemble(p1)
    p2 = rvm.assemble(text, str(path))
    strip = lambda p: {n: [(i.op, i.args) for i in f.code] for n, f in p.functions.items()}
    assert strip(p1) == strip(p2)
    # identical bytecode once the source map (line numbers) is set aside
    p3 = rvm.assemble(rvm.disassemble(p2), str(path))
    assert dumps(p2) == dumps(p3)
    annotated = rvm.assemble(rvm.disassemble(p1, annotate=True), str(path))
    assert strip(annotated) == strip(p1)
