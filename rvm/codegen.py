"""Compile verified functions into Python closures, one per machine state and direction.

A frame's position is a *state* ``s = 2*i + j``: about to execute instruction ``i``, and
``j = 1`` if control arrived there by a jump (only a comefrom can be arrived at that way).
This keeps one instruction per step in both directions: a taken branch moves to its comefrom's
jumped-in state, and the comefrom asserts (forwards) or decides (backwards) on its own step.

For each function and mode the generator emits one closure per state, ``s(R, G) -> state``,
where R is the frame's register list and G its gradient shadows (None outside gradient mode).
A closure returns the next state, or END (the frame finished in this direction) or CALL (the
machine must push a callee frame). Modes:

    fw   forwards                         bw   backwards (each instruction's inverse)
    gbw  backwards with adjoints           gfw  forwards, inverting gbw (debugger stepping)

Checks come before any write, so a closure that raises leaves the state as it was.
"""

from __future__ import annotations

import math
import re

from . import isa
from .program import Function, Imm, Mem, Program, Reg

END, CALL = -1, -2
_INT_BOUNDS = f"{-(1 << 63)} <= _v <= {(1 << 63) - 1}"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _esc(text: str) -> str:
    """Literal text for inside an f-string: braces doubled (the whole string is repr'd)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def _fault(text: str) -> str:
    """`raise Fault(f'...')` for a message whose {expr} parts are generated expressions."""
    return f"raise Fault(f{text!r})"


class Fault(Exception):
    """Raised by generated code when a reversibility check fails (wrapped by the machine)."""


def wrap(v: int) -> int:
    """Wrap a Python int to int64 (two's complement)."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def sign(v: float) -> float:
    return 1.0 if v > 0 else -1.0 if v < 0 else 0.0


def dpow_db(a: float, b: float) -> float:
    """d(a**b)/db, taken as 0 where a <= 0 (a**b is then not differentiable in b)."""
    return math.pow(a, b) * math.log(a) if a > 0 else 0.0


class _Operands:
    """How each operand of one instruction reads in generated code."""

    def __init__(self, fn: Function, ins, layout: dict, local=None):
        """layout maps registers to frame slots (R[k]); `local`, if given, maps a register
        to the name of a local variable instead (the compiled engine)."""
        self.value, self.shadow, self.src, self.prelude = {}, {}, {}, []
        spec = ins.spec
        written = [a for a, k in zip(ins.args, spec.kinds) if k in "DX"]
        self.cls = written[0].cls if written else isa.INT
        self.arithmetic = spec.group in ("arith", "family")
        for name, a in zip(spec.names, ins.args):
            self.src[name] = str(a)
            if isinstance(a, Reg):
                value, shadow = (f"R[{layout[a]}]", f"G[{layout[a]}]") if local is None \
                    else local(a)
                self.value[name] = value
                self.shadow[name] = shadow if a.cls == isa.FLOAT else None
            elif isinstance(a, Imm):
                self.value[name] = f"({a.value!r})" if a.value < 0 else repr(a.value)
                self.shadow[name] = None
            elif isinstance(a, Mem):
                reg = (lambda r: f"R[{layout[r]}]") if local is None else \
                    (lambda r: local(r)[0])
                off = reg(a.off) if isinstance(a.off, Reg) else repr(a.off)
                view = "hf" if self.cls == isa.FLOAT else "hi"
                self.prelude += [
                    f"_a = {reg(a.base)} + {off}",
                    "if not 0 <= _a < M.top: " + _fault(
                        f"heap address {_esc(a)} = {{_a}} is outside the heap "
                        "(0..{M.top - 1})"),
                ]
                self.value[name] = f"M.{view}[_a]"
                self.shadow[name] = "M.hg[_a]" if self.cls == isa.FLOAT else None

    def expr(self, text: str) -> str:
        def sub(m):
            key = m.group(1)
            if key.endswith("_src"):
                return self.src[key[:-4]]
            if key.startswith("g") and key[1:] in self.shadow:
                return self.shadow[key[1:]]
            return self.value[key]
        return _PLACEHOLDER.sub(sub, text)

    def message(self, text: str) -> str:
        """An f-string literal: {x} shows x's value, {x_src} its assembly text."""
        def sub(m):
            key = m.group(1)
            if key.endswith("_src"):
                return _esc(self.src[key[:-4]])
            return "{" + self.value[key] + "!r}"
        parts = _PLACEHOLDER.split(text)   # literal, key, literal, key, ...
        out = "".join(_esc(p) if k % 2 == 0 else sub(_Key(p)) for k, p in enumerate(parts))
        return "f" + repr(out)

    def has_missing_shadow(self, line: str) -> bool:
        return any(k.startswith("g") and k[1:] in self.shadow and self.shadow[k[1:]] is None
                   for k in _PLACEHOLDER.findall(line))


class _Key:
    """Stands in for a regex match in _Operands.message."""

    def __init__(self, key: str):
        self.key = key

    def group(self, _):
        return self.key


def render(template: str, ops: _Operands) -> list[str]:
    """Python statements for one template (see the template language in rvm.isa)."""
    out = list(ops.prelude) if template.strip() else []
    for line in template.splitlines():
        if not line.strip() or ops.has_missing_shadow(line):
            continue
        if line.startswith("check "):
            cond, msg = line[6:].split(" : ", 1)
            out.append(f"if not ({ops.expr(cond)}): raise Fault({ops.message(msg)})")
        elif line.startswith(("let ", "do ")):
            out.append(ops.expr(line.split(" ", 1)[1]))
        else:
            lhs, op, rhs = line.partition(" = ")
            target = _PLACEHOLDER.fullmatch(lhs.strip())
            if op and target and not target.group(1).startswith("g"):
                out.append(f"_v = {ops.expr(rhs)}")
                if ops.cls == isa.INT:
                    out.append(f"{ops.expr(lhs)} = _v if {_INT_BOUNDS} else wrap(_v)")
                    continue
                if ops.arithmetic:   # inf or nan could not be subtracted back out
                    out.append("if _v - _v != 0.0: " + _fault(
                        f"{_esc(ops.src[target.group(1)])} would become {{_v}}: not finite"))
                out.append(f"{ops.expr(lhs)} = _v")
            else:
                out.append(ops.expr(line))
    return out


def _condition(ops: _Operands, cc: str) -> str:
    return f"{ops.value['a']} {isa.CONDITIONS[cc]} {ops.value['b']}"


def _shows(ops: _Operands, cc: str) -> str:
    """Message text showing a condition and the values it compared (f-string ready)."""
    a, b = _esc(ops.src["a"]), _esc(ops.src["b"])
    vals = ", ".join(f"{s} = {{{ops.value[n]}!r}}" for n, s in (("a", a), ("b", b))
                     if not s[0].isdigit() and not s.startswith("-"))
    return f"{a} {isa.CONDITIONS[cc]} {b}" + (f" ({vals})" if vals else "")


def _body(fn: Function, i: int, mode: str, layout: dict, fall: bool) -> list[str]:
    """Statements of the closure for one state.

    Forward modes: the state "about to run instruction i" (fall=True: by fall-through).
    Backward modes: the state "just after instruction i" (fall=True) or "at comefrom i,
    arrived by a jump" (fall=False), whose undo is the paired jump.
    """
    ins = fn.code[i]
    spec, forward = ins.spec, mode in ("fw", "gfw")
    ops = _Operands(fn, ins, layout)
    cc = isa.condition(ins.op)
    label = _esc(ins.args[-1]) if ins.args else ""
    if not fall:   # arrived by jump: only comefroms have such states
        if ins.op not in isa.COMEFROMS:
            return ["raise Fault('unreachable state: arrived by jump at a non-comefrom')"]
        if forward:
            if cc is None:
                return [f"return {2 * i + 2}"]
            return [f"if not ({_condition(ops, cc)}): " + _fault(
                f"comefrom at {label}: arrived by its jump, but {_shows(ops, cc)} is false"),
                f"return {2 * i + 2}"]
        j = fn.labels[ins.args[-1].name]       # undo the jump at j: it must have been taken
        jop = _Operands(fn, fn.code[j], layout)
        jcc = isa.condition(fn.code[j].op)
        lines = [] if jcc is None else [f"if not ({_condition(jop, jcc)}): " + _fault(
            f"jump at {label}: comefrom decided it was taken, but {_shows(jop, jcc)} "
            "is false")]
        return lines + [f"return {2 * j}"]
    nxt, back = 2 * i + 2, 2 * i
    if spec.group == "call":
        return [f"return {CALL}"]
    if ins.op == "JMP":
        if forward:
            return [f"return {2 * fn.labels[ins.args[0].name] + 1}"]
        return ["raise Fault('unreachable state: fell through a JMP')"]
    if ins.op == "CF":
        if forward:
            return ["raise Fault('unreachable state: fell through into a CF')"]
        return [f"return {2 * i + 1}"]
    if ins.op.startswith("BR."):
        if forward:
            return [f"if {_condition(ops, cc)}: return {2 * fn.labels[ins.args[-1].name] + 1}",
                    f"return {nxt}"]
        return [f"if {_condition(ops, cc)}: " + _fault(
            f"branch to {label}: reached by fall-through going backwards, but "
            f"{_shows(ops, cc)} holds"), f"return {back}"]
    if ins.op.startswith("CF."):
        if forward:
            return [f"if {_condition(ops, cc)}: " + _fault(
                f"comefrom at {label}: entered by fall-through, but {_shows(ops, cc)} holds"),
                f"return {nxt}"]
        return [f"if {_condition(ops, cc)}: return {2 * i + 1}", f"return {back}"]
    # arithmetic and memory: forward template, or the inverse's, or an adjoint
    gradient = mode in ("gfw", "gbw") and ops.cls == isa.FLOAT
    if forward:
        op = spec if not gradient else isa.OPS[spec.inverse]
    else:
        op = spec if gradient else isa.OPS[spec.inverse]
    template = op.adjoint if gradient else op.forward[ops.cls]
    return render(template, ops) + [f"return {nxt if forward else back}"]


def source(fn: Function, mode: str) -> str:
    """Python source of a factory returning the list of closures for fn in this mode."""
    layout = {r: fn.slot(r) for r in fn.registers}
    n = len(fn.code)
    lines = ["def factory(M, Fault, wrap, zero, sign, dpow_db, math):",
             "    def dead(R, G): raise Fault('unreachable machine state')",
             f"    def end(R, G): return {END}"]
    table = []
    for s in range(2 * n + 2):
        i, jumped = divmod(s, 2)
        if mode in ("fw", "gfw"):
            if i == n:
                table.append("end" if not jumped else "dead")
                continue
            if jumped and fn.code[i].op not in isa.COMEFROMS:
                table.append("dead")
                continue
            body = _body(fn, i, mode, layout, fall=not jumped)
        else:   # backward: state s undoes what led to it
            if s == 0:
                table.append("end")
                continue
            if jumped:
                if i == n or fn.code[i].op not in isa.COMEFROMS:
                    table.append("dead")
                    continue
                body = _body(fn, i, mode, layout, fall=False)
            else:
                body = _body(fn, i - 1, mode, layout, fall=True)
        lines.append(f"    def s{s}(R, G):")
        lines += ["        " + b for b in body]
        table.append(f"s{s}")
    lines.append(f"    return [{', '.join(table)}]")
    return "\n".join(lines) + "\n"


def factory(program: Program, fn: Function, mode: str):
    """The (cached) factory for fn in this mode: factory(M, ...) -> list of closures."""
    key = (fn.name, mode)
    if key not in program.cache:
        namespace: dict = {}
        code = compile(source(fn, mode), f"<rvm {fn.name} {mode}>", "exec")
        exec(code, namespace)   # the source is generated from a verified Program only
        program.cache[key] = namespace["factory"]
    return program.cache[key]
