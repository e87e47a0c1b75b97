"""The verifier that every load runs.

A program the verifier accepts can run backwards: every branch is paired one-to-one with the
comefrom it jumps to, every operand has the register class its instruction needs, and no
instruction writes a register it also reads.
"""

from __future__ import annotations

import math

from . import isa
from .errors import VerifyError
from .program import (
    INT64_MAX,
    INT64_MIN,
    MAX_REGISTER,
    NAME,
    FuncRef,
    Function,
    Imm,
    Instruction,
    Label,
    Mem,
    Program,
    Reg,
    View,
)


class _Checker:
    def __init__(self, program: Program, fn: Function):
        self.program, self.fn = program, fn

    def fail(self, index: int | None, message: str, hint: str = "") -> None:
        line = self.fn.code[index].line if index is not None else self.fn.line
        raise VerifyError(message, self.fn.name, index, line, self.program.source, hint)

    def function(self) -> None:
        fn = self.fn
        for name in (fn.name, *fn.labels):
            if not NAME.fullmatch(name):
                self.fail(None, f"{name!r} is not a valid name (letters, digits, _ and .)")
        if len(set(fn.params)) != len(fn.params):
            self.fail(None, "a parameter register is listed twice")
        for name, index in fn.labels.items():
            if not 0 <= index < len(fn.code):
                self.fail(None, f"label {name!r} points outside the function")
        for r in fn.registers:
            if r.n > MAX_REGISTER:
                self.fail(None, f"register {r} is out of range (at most {MAX_REGISTER})")
        for i, ins in enumerate(fn.code):
            self.instruction(i, ins)

    def target(self, i: int, label) -> int:
        if not isinstance(label, Label):
            self.fail(i, f"{self.fn.code[i].op}: operand {label} must be a label")
        if label.name not in self.fn.labels:
            self.fail(i, f"unknown label {label.name!r}")
        return self.fn.labels[label.name]

    def instruction(self, i: int, ins: Instruction) -> None:
        spec = isa.OPS.get(ins.op)
        if spec is None:
            self.fail(i, f"unknown opcode {ins.op!r}")
        if spec.variadic:
            return self.call(i, ins)
        if len(ins.args) != len(spec.kinds):
            self.fail(i, f"{ins.op} takes {len(spec.kinds)} operands, got {len(ins.args)}")
        written = ins.written
        for a in written:
            if not isinstance(a, Reg):
                self.fail(i, f"{ins.op}: operand {a} must be a register")
        cls = written[0].cls if written else None
        if cls is not None and spec.forward and cls not in spec.forward:
            want = "float (f)" if isa.FLOAT in spec.forward else "integer (r)"
            self.fail(i, f"wrong register class: {ins.op} needs {want} registers, "
                      f"got {written[0]}")
        for a, kind in zip(ins.args, spec.kinds):
            self.operand(i, ins, a, kind, cls)
        self.no_aliasing(i, ins, written)
        if ins.op in isa.BRANCHES or ins.op in isa.COMEFROMS:
            self.pairing(i, ins)

    def operand(self, i: int, ins: Instruction, a, kind: str, cls: str | None) -> None:
        if isinstance(a, Imm):
            v = a.value
            if isinstance(v, float) and not math.isfinite(v):
                self.fail(i, f"immediate {v} is not a finite number")
            if isinstance(v, int) and not INT64_MIN <= v <= INT64_MAX:
                self.fail(i, f"immediate {v} does not fit in int64")
        if kind in "DX":
            if a.cls != cls:
                self.fail(i, f"wrong register class: {ins.op} mixes {a} with "
                          f"{'integer' if cls == isa.INT else 'float'} registers")
        elif kind == "S":
            if not isinstance(a, (Reg, Imm)):
                self.fail(i, f"{ins.op}: operand {a} must be a register or an immediate")
            if cls == isa.INT and a.cls != isa.INT:
                self.fail(i, f"wrong register class: {ins.op} on integers cannot read {a}",
                          "an integer result cannot absorb a float value exactly")
        elif kind == "V":
            if not isinstance(a, (Reg, Imm)):
                self.fail(i, f"{ins.op}: operand {a} must be a register or an immediate")
        elif kind == "C":
            if not isinstance(a, (Reg, Imm)) or a.cls != isa.INT:
                self.fail(i, f"{ins.op}: the count {a} must be an integer register or immediate")
            if isinstance(a, Imm) and a.value < 0:
                self.fail(i, f"{ins.op}: the count {a} is negative")
        elif kind in "WU" and isinstance(a, Mem):
            if not isinstance(a, View):
                self.fail(i, f"{ins.op}: operand {a} must be a view like [r1 + r2 : r3, 1]",
                          "a view names its strides: [base + offset : row stride, "
                          "column stride]")
            if any(r.cls != isa.INT for r in a.regs):
                self.fail(i, f"wrong register class: the view {a} must use integer registers")
            for s in (a.off, a.s0, a.s1):
                if isinstance(s, int) and not INT64_MIN <= s <= INT64_MAX:
                    self.fail(i, f"{ins.op}: {s} in the view {a} does not fit in int64")
        elif kind == "W":
            self.fail(i, f"{ins.op}: operand {a} must be a view like [r1 + r2 : r3, 1]")
        elif kind == "U":
            if not isinstance(a, (Reg, Imm)):
                self.fail(i, f"{ins.op}: operand {a} must be a view, a register or an "
                          "immediate")
        elif isinstance(a, View):
            self.fail(i, f"{ins.op}: a view ({a}) is an operand of the array instructions "
                      "only", "a memory operand is one cell: [r1], [r1 + 3] or [r1 + r2]")
        elif kind == "M":
            if not isinstance(a, Mem):
                self.fail(i, f"{ins.op}: operand {a} must be a memory operand like [r1 + 2]")
            if any(r.cls != isa.INT for r in a.regs):
                self.fail(i, f"wrong register class: the address {a} must use integer registers")
        elif kind == "L" and not isinstance(a, Label):
            self.fail(i, f"{ins.op}: operand {a} must be a label")

    def no_aliasing(self, i: int, ins: Instruction, written: list) -> None:
        regs = []
        for a in ins.args:
            regs += [a] if isinstance(a, Reg) else list(a.regs) if isinstance(a, Mem) else []
        for w in written:
            if regs.count(w) > 1:
                self.fail(i, f"{ins.op}: destination {w} is also one of its operands; the "
                          "instruction would not be invertible",
                          "accumulate into a register that is not among the operands, "
                          "e.g. through a zeroed temporary")

    def pairing(self, i: int, ins: Instruction) -> None:
        fn = self.fn
        j = self.target(i, ins.args[-1])
        other = fn.code[j]
        if ins.op in isa.BRANCHES:
            if other.op not in isa.COMEFROMS:
                self.fail(i, f"{ins.op} jumps to {ins.args[-1]}, which is {other.op}, "
                          "not a comefrom", "a jump must land on a CF naming the jump's label")
            if self.target(j, other.args[-1] if other.args else None) != i:
                self.fail(i, f"{ins.op} jumps to {ins.args[-1]}, whose comefrom names "
                          f"{other.args[-1]} instead of this jump",
                          "give this jump a label and name it in the CF it targets")
            if ins.op == "JMP":
                nxt = fn.code[i + 1] if i + 1 < len(fn.code) else None
                if nxt is not None and nxt.op in isa.COMEFROMS and nxt.op != "CF":
                    self.fail(i + 1, f"{nxt.op} could never be entered by fall-through "
                              "(a JMP comes before it)", "use a plain CF")
                if nxt is None or nxt.op != "CF":
                    self.fail(i, "the instruction after a JMP can only be reached by a jump, "
                              "so it must be a CF", "end the function with a fall-through, "
                              "and start the code after JMP with CF")
        else:
            if other.op not in isa.BRANCHES:
                self.fail(i, f"{ins.op} names {ins.args[-1]}, which is {other.op}, not a jump")
            if self.target(j, other.args[-1] if other.args else None) != i:
                self.fail(i, f"{ins.op} names the jump at {ins.args[-1]}, which jumps "
                          "elsewhere: unpaired comefrom")
            prev = fn.code[i - 1].op if i > 0 else None
            if ins.op == "CF" and prev != "JMP":
                self.fail(i, "CF could be entered by fall-through "
                          f"({'function entry' if prev is None else prev} comes before it)",
                          "use CF.cc with a condition that tells the two ways in apart, "
                          "or put a JMP before it")

    def call(self, i: int, ins: Instruction) -> None:
        if not ins.args or not isinstance(ins.args[0], FuncRef):
            self.fail(i, f"{ins.op} needs a function name first")
        name, regs = ins.args[0].name, ins.args[1:]
        callee = self.program.functions.get(name)
        if callee is None:
            self.fail(i, f"{ins.op} of unknown function {name!r}")
        if len(regs) != len(callee.params):
            self.fail(i, f"{name} takes {len(callee.params)} arguments, got {len(regs)}")
        for k, (a, p) in enumerate(zip(regs, callee.params)):
            if not isinstance(a, Reg):
                self.fail(i, f"argument {k + 1} of {name} must be a register "
                          f"(arguments are passed by reference), got {a}")
            if a.cls != p.cls:
                self.fail(i, f"wrong register class: argument {k + 1} of {name} is {a}, "
                          f"but the parameter is {p}")
        if len(set(regs)) != len(regs):
            self.fail(i, f"the same register is passed twice to {name}",
                      "pass distinct registers: each argument is aliased to the callee's "
                      "parameter")


def verify(program: Program) -> Program:
    """Check the program can run backwards; raise VerifyError naming the first problem."""
    for fn in program.functions.values():
        _Checker(program, fn).function()
    return program
