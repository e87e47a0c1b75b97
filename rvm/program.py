"""Program / Function / Instruction, and the verifier that every load runs.

A program the verifier accepts can run backwards: every branch is paired one-to-one with the
comefrom it jumps to, every operand has the register class its instruction needs, and no
instruction writes a register it also reads.
"""

from __future__ import annotations

import functools
import math
import re

import attrs

from . import isa
from .errors import VerifyError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
MAX_REGISTER = 0xFFFF


@attrs.frozen
class Reg:
    cls: str   # isa.INT ("i", written r0, r1, ...) or isa.FLOAT ("f", written f0, f1, ...)
    n: int

    def __str__(self) -> str:
        return ("r" if self.cls == isa.INT else "f") + str(self.n)


@attrs.frozen
class Imm:
    value: int | float

    @property
    def cls(self) -> str:
        return isa.FLOAT if isinstance(self.value, float) else isa.INT

    def __str__(self) -> str:
        return repr(self.value)


@attrs.frozen
class Mem:
    base: Reg
    off: Reg | int = 0

    def __str__(self) -> str:
        if isinstance(self.off, Reg):
            return f"[{self.base} + {self.off}]"
        if self.off == 0:
            return f"[{self.base}]"
        return f"[{self.base} {'-' if self.off < 0 else '+'} {abs(self.off)}]"

    @property
    def regs(self) -> tuple[Reg, ...]:
        return (self.base, self.off) if isinstance(self.off, Reg) else (self.base,)


@attrs.frozen
class Label:
    name: str

    def __str__(self) -> str:
        return self.name


@attrs.frozen
class FuncRef:
    name: str

    def __str__(self) -> str:
        return self.name


Operand = Reg | Imm | Mem | Label | FuncRef


@attrs.frozen
class Instruction:
    op: str                        # mnemonic, a key of isa.OPS
    args: tuple = ()               # operands
    line: int = 0                  # source line (the source map); 0 if unknown

    @property
    def spec(self) -> isa.OpSpec:
        return isa.OPS[self.op]

    def __str__(self) -> str:
        return f"{self.op:<8} {', '.join(map(str, self.args))}".rstrip()


@attrs.frozen
class Symbol:
    """A source name for registers, in scope on lines first..last (debug info)."""

    name: str
    regs: tuple                    # one register, or an array's (base, dims...)
    first: int
    last: int
    dtype: str = ""                # arrays: element class


@attrs.frozen
class Function:
    name: str
    params: tuple[Reg, ...]
    code: tuple[Instruction, ...]
    labels: dict = attrs.field(factory=dict, eq=True)   # label -> instruction index
    line: int = 0                  # line of the .func directive
    end_line: int = 0              # line of the .end directive
    # debug info, not part of a program's identity (and not kept in .rvmb files):
    names: tuple = attrs.field(default=(), eq=False)     # source names of the arguments
    symbols: tuple = attrs.field(default=(), eq=False)   # Symbol per source variable

    @functools.cached_property
    def registers(self) -> list[Reg]:
        """Every register the function mentions (params first), without repeats."""
        seen: dict[Reg, None] = dict.fromkeys(self.params)
        for ins in self.code:
            for a in ins.args:
                for r in (a,) if isinstance(a, Reg) else a.regs if isinstance(a, Mem) else ():
                    seen.setdefault(r)
        return list(seen)

    @functools.cached_property
    def n_int(self) -> int:
        return 1 + max((r.n for r in self.registers if r.cls == isa.INT), default=-1)

    @functools.cached_property
    def n_float(self) -> int:
        return 1 + max((r.n for r in self.registers if r.cls == isa.FLOAT), default=-1)

    def slot(self, reg: Reg) -> int:
        """Index of a register in the frame's register list: ints first, then floats."""
        return reg.n if reg.cls == isa.INT else self.n_int + reg.n

    @functools.cached_property
    def locals(self) -> list[Reg]:
        params = set(self.params)
        return [r for r in self.registers if r not in params]

    @functools.cached_property
    def param_slots(self) -> list[int]:
        return [self.slot(p) for p in self.params]

    @functools.cached_property
    def local_slots(self) -> list[tuple[Reg, int]]:
        return [(r, self.slot(r)) for r in self.locals]

    def label_at(self, index: int) -> str | None:
        for name, i in self.labels.items():
            if i == index:
                return name
        return None


@attrs.frozen
class Program:
    functions: dict = attrs.field(factory=dict)   # name -> Function, in source order
    source: str = ""                               # file the program came from
    cache: dict = attrs.field(factory=dict, eq=False, repr=False)  # compiled code
    engine: str | None = attrs.field(default=None, eq=False)       # default engine

    def __getitem__(self, name: str):
        from .api import FunctionHandle
        if name not in self.functions:
            raise KeyError(f"no function {name!r} in the program "
                           f"(it has: {', '.join(self.functions) or 'none'})")
        return FunctionHandle(self, name)

    def call(self, name: str, *args, **options):
        """Run `name` forwards on the arguments; return the parameters' final values.
        Options (engine, checks, max_steps, heap_limit, tol) go to the machine."""
        from .machine import machine_for
        return machine_for(self, **options).call(name, *args)

    def uncall(self, name: str, *args, **options):
        """Run `name` backwards on the arguments; return the parameters' final values."""
        from .machine import machine_for
        return machine_for(self, **options).uncall(name, *args)


# ------------------------------------------------------------------------------ verifier


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
        written = [a for a, k in zip(ins.args, spec.kinds) if k in "DX"]
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
