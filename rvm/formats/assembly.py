"""Assembly text (.rasm) <-> Program. The syntax is documented in docs/assembly.md."""

from __future__ import annotations

import difflib
import re

from ..core import isa
from ..core.errors import AsmError, VerifyError
from ..core.program import (
    FuncRef,
    Function,
    Imm,
    Instruction,
    Label,
    Mem,
    Program,
    Reg,
    Symbol,
    View,
)
from ..core.verify import verify

_TOKEN = re.compile(r"""
    (?P<ws>[ \t]+)
  | (?P<comment>[;\#].*)
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>\.?[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[,\[\]+\-():])
""", re.VERBOSE)
_REG = re.compile(r"([rf])(\d+)")


class _Line:
    """The tokens of one source line, with a cursor and located errors."""

    def __init__(self, text: str, lineno: int, file: str):
        self.text, self.lineno, self.file = text, lineno, file
        self.tokens: list[tuple[str, str, int]] = []   # (kind, text, column)
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                self.error(pos + 1, f"unexpected character {text[pos]!r}")
            if m.lastgroup not in ("ws", "comment"):
                self.tokens.append((m.lastgroup, m.group(), pos + 1))
            pos = m.end()
        self.i = 0

    def error(self, col: int, message: str, hint: str = ""):
        raise AsmError(message, self.file, self.lineno, col, self.text.rstrip("\n"), hint)

    def peek(self, k: int = 0):
        j = self.i + k
        return self.tokens[j] if j < len(self.tokens) else ("eol", "", len(self.text) + 1)

    def next(self):
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, text: str, what: str = ""):
        _, t, col = self.next()
        if t != text:
            self.error(col, f"expected {what or repr(text)}, found {t or 'end of line'!r}")

    def done(self) -> bool:
        return self.i >= len(self.tokens)


def _number(text: str, negative: bool):
    if text[:2].lower() == "0x":
        v = int(text, 16)
    elif any(c in text for c in ".eE"):
        v = float(text)
    else:
        v = int(text)
    return -v if negative else v


class Assembler:
    def __init__(self, text: str, file: str):
        self.text, self.file = text, file
        self.functions: dict[str, Function] = {}
        self.fn_lines: dict[str, tuple[int, int, _Line]] = {}

    def register(self, line: _Line, tok, aliases: dict) -> Reg | None:
        kind, text, _ = tok
        if kind != "name":
            return None
        if text in aliases:
            return aliases[text]
        m = _REG.fullmatch(text)
        return Reg(isa.INT if m.group(1) == "r" else isa.FLOAT, int(m.group(2))) if m else None

    def operand(self, line: _Line, kind: str, aliases: dict):
        tok = line.next()
        k, text, col = tok
        if text == "[":
            base = self.register(line, line.next(), aliases)
            if base is None:
                line.error(col + 1, "expected a base register after '['",
                           "memory operands look like [r1], [r1 + 3] or [r1 + r2]")
            off = 0
            if line.peek()[1] in "+-" and line.peek()[1]:
                off = self.part(line, aliases, line.next()[1] == "-",
                                "an offset register or integer")
            if line.peek()[1] == ":":           # a view: [rB + off : s0, s1]
                line.next()
                s0 = self.stride(line, aliases)
                line.expect(",", "',' between the view's two strides")
                s1 = self.stride(line, aliases)
                line.expect("]", "']' to close the view")
                return View(base, off, s0, s1)
            line.expect("]", "']' to close the memory operand")
            return Mem(base, off)
        if text == "-" and line.peek()[0] == "num":
            return Imm(_number(line.next()[1], True))
        if k == "num":
            return Imm(_number(text, False))
        if k == "name":
            reg = self.register(line, tok, aliases)
            if reg is not None:
                return reg
            return FuncRef(text) if kind == "F" else Label(text)
        line.error(col, f"expected an operand, found {text or 'end of line'!r}")

    def part(self, line: _Line, aliases: dict, negative: bool, what: str, hint: str = ""):
        """A memory operand's offset or a view's stride: a register (not negated) or an
        integer (`1e3` and `2.0` are floats, refused)."""
        tok = line.next()
        reg = None if negative else self.register(line, tok, aliases)
        if reg is not None:
            return reg
        value = _number(tok[1], negative) if tok[0] == "num" else None
        if type(value) is not int:
            line.error(tok[2], f"expected {what}, found {tok[1] or 'end of line'!r}", hint)
        return value

    def stride(self, line: _Line, aliases: dict):
        negative = line.peek()[1] == "-" and line.peek(1)[0] == "num"
        if negative:
            line.next()
        return self.part(line, aliases, negative, "a stride (a register or an integer)",
                         "views look like [r1 + r2 : r3, 1]")

    def statement(self, line: _Line, aliases: dict) -> Instruction:
        kind, mnemonic, col = line.next()
        spec = isa.lookup(mnemonic) if kind == "name" else None
        if spec is None:
            names = {s.upper(): s for s in isa.OPS}
            close = difflib.get_close_matches(mnemonic.upper(), names, 1)
            hint = f"did you mean {names[close[0]]}?" if close else \
                "see docs/isa.md for the instruction set"
            line.error(col, f"unknown instruction {mnemonic!r}", hint)
        args = []
        kinds = spec.kinds
        while not line.done():
            if args:
                line.expect(",", "',' between operands")
            k = kinds[len(args)] if len(args) < len(kinds) else ("S" if spec.variadic else "?")
            args.append(self.operand(line, k, aliases))
        if len(args) != len(kinds) and not (spec.variadic and args):
            line.error(col, f"{spec.name} takes {len(kinds)} operand"
                       f"{'s' if len(kinds) != 1 else ''} "
                       f"({', '.join(spec.names)}), got {len(args)}")
        return Instruction(spec.name, tuple(args), line.lineno)

    def parse(self) -> Program:
        fn = None          # (name, params, code, labels, line, aliases, _Line)
        for lineno, text in enumerate(self.text.splitlines(), 1):
            line = _Line(text, lineno, self.file)
            while line.peek()[0] == "name" and line.peek(1)[1] == ":":
                _, label, col = line.next()
                line.next()
                if fn is None:
                    line.error(col, f"label {label!r} outside a function")
                if label in fn[3]:
                    line.error(col, f"label {label!r} is already defined in {fn[0]}")
                fn[3][label] = len(fn[2])
            if line.done():
                continue
            _, word, col = line.peek()
            if word == ".func":
                line.next()
                if fn is not None:
                    line.error(col, f"missing .end for function {fn[0]!r} before this .func")
                fn = self.header(line)
            elif word == ".end":
                line.next()
                if fn is None:
                    line.error(col, ".end without .func")
                self.close(fn, line)
                fn = None
            elif word == ".alias":
                line.next()
                if fn is None:
                    line.error(col, ".alias outside a function")
                _, name, ncol = line.next()
                reg = self.register(line, line.next(), {})
                if reg is None or _REG.fullmatch(name):
                    line.error(ncol, "expected .alias NAME REGISTER, e.g. .alias n r0")
                fn[5][name] = reg
            elif fn is None:
                line.error(col, "instruction outside a function", "start one with .func NAME(...)")
            else:
                fn[2].append(self.statement(line, fn[5]))
            if not line.done():
                line.error(line.peek()[2], f"unexpected {line.peek()[1]!r}")
        if fn is not None:
            lines = self.text.splitlines()
            raise AsmError(f"function {fn[0]!r} has no .end", self.file, len(lines) or 1,
                           1, lines[-1] if lines else "")
        program = Program(self.functions, self.file)
        try:
            return verify(program)
        except VerifyError as e:
            raise self.located(e) from None

    def header(self, line: _Line):
        kind, name, col = line.next()
        if kind != "name":
            line.error(col, "expected a function name after .func")
        if name in self.functions or name in self.fn_lines:
            line.error(col, f"function {name!r} is defined twice")
        aliases: dict = {}
        params = []
        line.expect("(", "'(' and the parameter registers")
        while line.peek()[1] != ")":
            if params:
                line.expect(",", "',' between parameters")
            tok = line.next()
            reg = self.register(line, tok, {})
            if reg is None:
                line.error(tok[2], f"expected a parameter register like r0 or f1, found "
                           f"{tok[1] or 'end of line'!r}")
            if reg in params:
                line.error(tok[2], f"parameter {reg} is listed twice")
            params.append(reg)
        line.expect(")")
        return (name, tuple(params), [], {}, line.lineno, aliases, line)

    def close(self, fn, line: _Line) -> None:
        name, params, code, labels, start, aliases, head = fn
        for label, index in labels.items():
            if index == len(code):
                line.error(1, f"label {label!r} at the end of {name} labels no instruction")
        symbols = tuple(Symbol(a, (r,), start, line.lineno) for a, r in aliases.items())
        self.functions[name] = Function(name, params, tuple(code), labels, start, line.lineno,
                                        symbols=symbols)
        self.fn_lines[name] = (start, line.lineno, head)

    def located(self, e: VerifyError) -> AsmError:
        """A verifier error, pointed at the offending source line and its mnemonic."""
        lines = self.text.splitlines()
        text = lines[e.line - 1] if 0 < e.line <= len(lines) else ""
        col = 1
        fn = self.functions.get(e.function)
        if fn is not None and e.index is not None:
            m = re.search(re.escape(fn.code[e.index].op.split(".")[0]), text, re.IGNORECASE)
            col = m.start() + 1 if m else 1
        where = f"in {e.function}: " if e.function else ""
        return AsmError(where + e.message, self.file, e.line or 1, col, text, e.hint)


def assemble(text: str, file: str = "<string>") -> Program:
    """Assemble and verify; raises AsmError (file:line:col, the line, a caret, a hint)."""
    if not isinstance(text, str):
        raise TypeError(f"rvm.assemble takes assembly text (a str), got "
                        f"{type(text).__name__}" + ("; .rvmb bytecode is read by rvm.loads"
                                                     if isinstance(text, bytes) else ""))
    return Assembler(text, file).parse()


# --------------------------------------------------------------------------- disassembly


def format_instruction(fn: Function, index: int) -> str:
    """One instruction as assembly, with its labels: 'top:    CF.NE    r3, 0, back'."""
    head = " ".join(f"{label}:" for label in fn.labels_at(index))
    return f"{head:<7} {fn.code[index]}" if head else f"{'':<8}{fn.code[index]}"


def disassemble_function(fn: Function, annotate: bool = False,
                         source: list[str] | None = None) -> str:
    params = ", ".join(map(str, fn.params))
    out = [f".func {fn.name}({params})"]
    shown = 0
    for i in range(len(fn.code)):
        line = fn.code[i].line
        if source and line != shown and 0 < line <= len(source):
            out.append(f"; {line:>4}| {source[line - 1].rstrip()}")
            shown = line
        text = format_instruction(fn, i)
        if annotate:
            text = f"{text:<44}; {i:>4}" + (f"  line {fn.code[i].line}" if fn.code[i].line else "")
        out.append(text)
    out.append(".end")
    return "\n".join(out)


def disassemble(program: Program, annotate: bool = False, source: bool = False) -> str:
    """Program -> assembly text that assembles back to the same program.

    With annotate, each line also carries '; index  line N' (the source map) as a comment;
    with source, the source lines the instructions came from are interleaved as comments.
    """
    lines = None
    if source and program.source:
        from .bytecode import shown_source  # a file named by bytecode: only if it matches
        lines = shown_source(program.source)
    return "\n\n".join(disassemble_function(f, annotate, lines)
                       for f in program.functions.values()) + "\n"
