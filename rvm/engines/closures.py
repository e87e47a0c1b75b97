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

from ..core import isa
from ..core.program import Function, Program
from .templates import Operands, condition, esc, fault, pulled, render, shows

END, CALL = -1, -2


def _body(fn: Function, i: int, mode: str, layout: dict, fall: bool) -> list[str]:
    """Statements of the closure for one state.

    Forward modes: the state "about to run instruction i" (fall=True: by fall-through).
    Backward modes: the state "just after instruction i" (fall=True) or "at comefrom i,
    arrived by a jump" (fall=False), whose undo is the paired jump.
    """
    ins = fn.code[i]
    spec, forward = ins.spec, mode in ("fw", "gfw")
    ops = Operands(fn, ins, layout)
    cc = isa.condition(ins.op)
    label = esc(ins.args[-1]) if ins.args else ""
    if not fall:   # arrived by jump: only comefroms have such states
        if ins.op not in isa.COMEFROMS:
            return ["raise Fault('unreachable state: arrived by jump at a non-comefrom')"]
        if forward:
            if cc is None:
                return [f"return {2 * i + 2}"]
            return [f"if not ({condition(ops, cc)}): " + fault(
                f"comefrom at {label}: arrived by its jump, but {shows(ops, cc)} is false"),
                f"return {2 * i + 2}"]
        j = fn.labels[ins.args[-1].name]       # undo the jump at j: it must have been taken
        jop = Operands(fn, fn.code[j], layout)
        jcc = isa.condition(fn.code[j].op)
        lines = [] if jcc is None else [f"if not ({condition(jop, jcc)}): " + fault(
            f"jump at {label}: comefrom decided it was taken, but {shows(jop, jcc)} "
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
            return [f"if {condition(ops, cc)}: return {2 * fn.labels[ins.args[-1].name] + 1}",
                    f"return {nxt}"]
        return [f"if {condition(ops, cc)}: " + fault(
            f"branch to {label}: reached by fall-through going backwards, but "
            f"{shows(ops, cc)} holds"), f"return {back}"]
    if ins.op.startswith("CF."):
        if forward:
            return [f"if {condition(ops, cc)}: " + fault(
                f"comefrom at {label}: entered by fall-through, but {shows(ops, cc)} holds"),
                f"return {nxt}"]
        return [f"if {condition(ops, cc)}: return {2 * i + 1}", f"return {back}"]
    if ins.op == "NOP" and ins.line in dict(fn.outputs):       # an output statement
        return [f"M.output({output_parts(fn, dict(fn.outputs)[ins.line])!r}, R)",
                f"return {nxt if forward else back}"]
    # arithmetic and memory: forward template, or the inverse's, or an adjoint
    gradient = mode in ("gfw", "gbw") and ops.cls == isa.FLOAT
    if forward:
        op = spec if not gradient else isa.OPS[spec.inverse]
    else:
        op = spec if gradient else isa.OPS[spec.inverse]
    template = pulled(op.adjoint, ins) if gradient else op.forward[ops.cls]
    return render(template, ops) + [f"return {nxt if forward else back}"]


def output_parts(fn: Function, parts: tuple) -> tuple:
    """An output statement's parts with registers as frame slots: text as it is, values
    as (kind, slots...) for Machine.output."""
    return tuple(p if isinstance(p, str) else (p[0], *(fn.slot(r) for r in p[1]))
                 for p in parts)


def source(fn: Function, mode: str, derived=()) -> str:
    """Python source of a factory returning the list of closures for fn in this mode.
    derived: the registers that hold derivatives (rvm.engines.compiled.derived_registers),
    whose zero tests (ZERO, POP) scale with the largest magnitude a derivative has held."""
    layout = {r: fn.slot(r) for r in fn.registers}
    scaled = {f"zero(R[{layout[r]}])": f"(zero(R[{layout[r]}]) or abs(R[{layout[r]}]) <= "
              f"M.tol * M.dscale)" for r in derived}
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
        for old, new in scaled.items() if "zero(" in "".join(body) else ():
            body = [b.replace(old, new) for b in body]
        lines += ["        " + b for b in body]
        table.append(f"s{s}")
    lines.append(f"    return [{', '.join(table)}]")
    return "\n".join(lines) + "\n"


def factory(program: Program, fn: Function, mode: str):
    """The (cached) factory for fn in this mode: factory(M, ...) -> list of closures."""
    key = (fn.name, mode)
    if key not in program.cache:
        from .compiled import derived_registers
        namespace: dict = {}
        code = compile(source(fn, mode, derived_registers(program, fn) or ()),
                       f"<rvm {fn.name} {mode}>", "exec")
        exec(code, namespace)   # the source is generated from a verified Program only
        program.cache[key] = namespace["factory"]
    return program.cache[key]
