"""The verifier refuses every malformed program with a message naming the problem."""

import pathlib

import pytest

import rvm
from rvm.core.program import FuncRef, Function, Imm, Instruction, Label, Program, Reg
from rvm.core.verify import verify

CASES = {
    "unpaired branch": (".func f(r0)\nb: BR.EQ r0, 0, x\n ADD r0, 1\nx: NOP\n.end",
                        "not a comefrom"),
    "comefrom naming a non-jump": (".func f(r0)\na: ADD r0, 1\nc: CF.EQ r0, 1, a\n.end",
                                   "not a jump"),
    "jump whose target's comefrom names another jump": (
        ".func f(r0)\nb1: BR.EQ r0, 0, c\nb2: BR.EQ r0, 1, c\nc: CF.EQ r0, 0, b2\n.end",
        "names b2 instead of this jump"),
    "CF.cc never entered by fall-through": (
        ".func f(r0)\nj: JMP c\nc: CF.EQ r0, 0, j\n.end", "never be entered by fall-through"),
    "CF that could be entered by fall-through": (
        ".func f(r0)\nb: BR.EQ r0, 0, c\n ADD r0, 1\nc: CF b\n.end",
        "could be entered by fall-through"),
    "CF at function entry": (".func f(r0)\nc: CF j\nj: JMP c\n.end",
                             "could be entered by fall-through"),
    "JMP not followed by CF": (".func f(r0)\nj: JMP c\n ADD r0, 1\nc: CF j\n.end",
                               "must be a CF"),
    "wrong register class (float op on ints)": (".func f(r0, r1)\n ADD.exp r0, r1\n.end",
                                                "wrong register class"),
    "wrong register class (int reads float)": (".func f(r0, f1)\n ADD r0, f1\n.end",
                                               "wrong register class"),
    "wrong register class (swap mixes)": (".func f(r0, f1)\n SWAP r0, f1\n.end",
                                          "wrong register class"),
    "wrong register class (address)": (".func f(r0, f1)\n EXCH r0, [f1]\n.end",
                                       "wrong register class"),
    "unknown function": (".func f(r0)\n CALL g, r0\n.end", "unknown function 'g'"),
    "wrong call arity": (".func g(r0, r1)\n.end\n.func f(r0)\n CALL g, r0\n.end",
                         "g takes 2 arguments, got 1"),
    "wrong class in call": (".func g(f0)\n.end\n.func f(r0)\n CALL g, r0\n.end",
                            "wrong register class"),
    "same register twice in a call": (".func g(r0, r1)\n.end\n.func f(r0)\n CALL g, r0, r0\n.end",
                                      "same register is passed twice"),
    "destination among its sources": (".func f(f0, f1)\n ADD.mul f0, f0, f1\n.end",
                                      "destination f0 is also one of its operands"),
    "exchange with own address": (".func f(r0)\n EXCH r0, [r0 + 1]\n.end",
                                  "destination r0 is also one of its operands"),
    "rotation of a register with itself": (".func f(f0)\n ROT f0, f0, 0.5\n.end",
                                           "destination f0 is also one of its operands"),
    "unknown label": (".func f(r0)\n BR.EQ r0, 0, nowhere\n.end", "unknown label 'nowhere'"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_verifier_refuses(name):
    text, message = CASES[name]
    with pytest.raises(rvm.AsmError) as err:
        rvm.assemble(text, "case.rasm")
    assert message in str(err.value)
    assert str(err.value).startswith("case.rasm:")


def test_unknown_opcode_in_a_program_built_by_hand():
    fn = Function("f", (Reg("i", 0),), (Instruction("FROB", (Reg("i", 0),)),))
    with pytest.raises(rvm.VerifyError, match=r"unknown opcode 'FROB'") as err:
        verify(Program({"f": fn}))
    assert err.value.function == "f" and err.value.index == 0


def test_verify_error_names_function_and_instruction():
    fn = Function("f", (Reg("i", 0),), (
        Instruction("NOP"), Instruction("CALL", (FuncRef("g"), Reg("i", 0)), line=7)))
    with pytest.raises(rvm.VerifyError) as err:
        verify(Program({"f": fn}, "prog.rasm"))
    assert "in f, instruction 1" in str(err.value) and "prog.rasm:7" in str(err.value)


def test_infinite_immediate_refused():
    fn = Function("f", (Reg("f", 0),), (Instruction("ADD", (Reg("f", 0), Imm(float("inf")))),))
    with pytest.raises(rvm.VerifyError, match="not a finite number"):
        verify(Program({"f": fn}))


def test_label_operand_must_be_label():
    fn = Function("f", (Reg("i", 0),), (Instruction("JMP", (Reg("i", 0),)),))
    with pytest.raises(rvm.VerifyError, match="must be a label"):
        verify(Program({"f": fn}))


def test_well_formed_loop_passes():
    text = (pathlib.Path(__file__).parent.parent / "asm" / "fib.rasm").read_text()
    assert "fib" in rvm.assemble(text).functions


def test_label_resolution():
    p = rvm.assemble(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.NE r0, 1, b\n.end")
    fn = p.functions["f"]
    assert fn.labels == {"b": 0, "c": 2}
    assert fn.code[0].args[-1] == Label("c")
