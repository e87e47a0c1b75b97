"""Execution traces: each step with the instruction and the registers it changed.

Used by `rvm run --trace` (and reusable by the debugger)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from ..core.errors import MachineError
from ..engines.explain import shown_names, with_names
from ..engines.machine import Machine
from ..formats.assembly import format_instruction


def changes(fn, before: list, after: list, line: int = 0) -> str:
    """'r2: 0 -> 1, f1: 0.5 -> 0.25' for the registers of fn that differ, by their source
    or `.alias` names at `line` where they have one ('x: 0.5 -> 0.25')."""
    names = shown_names(fn, line) if line else {}
    out = []
    for reg in fn.registers:
        k = fn.slot(reg)
        if before[k] != after[k]:
            out.append(f"{names.get(str(reg), reg)}: {before[k]!r} -> {after[k]!r}")
    return ", ".join(out)


def describe_step(m: Machine, move: Callable[[], bool], direction: int) -> str | None:
    """Take one step with `move` and describe it; None if nothing was left to do."""
    depth, fr = len(m.stack), m.stack[-1]
    i, before = fr.index(fr.dir * direction), list(fr.R)
    if not move():
        return None
    arrow = "->" if direction > 0 else "<-"
    head = f"{m.steps:>8} {arrow} {fr.fn.name}"
    if len(m.stack) > depth:
        new = m.stack[-1]
        how = "forwards" if new.dir * direction > 0 else "backwards"
        return f"{head}: enter {new.fn.name} ({how})"
    if len(m.stack) < depth:
        return f"{m.steps:>8} {arrow} {m.stack[-1].fn.name}: leave {fr.fn.name}"
    line = fr.fn.code[i].line
    text = f"{head} {i:>4}  {with_names(fr.fn, format_instruction(fr.fn, i), line)}"
    diff = changes(fr.fn, before, fr.R, line)
    return f"{text:<60} {diff}" if diff else text


def traced_run(m: Machine, direction: int, out: TextIO) -> None:
    """Run to the end (or start) one step at a time, printing each step."""
    move = m.step if direction > 0 else m.back
    for _ in range(m.max_steps):
        line = describe_step(m, move, direction)
        if line is None:
            return
        print(line, file=out)
    if not m.at_boundary(direction):
        raise MachineError(f"step budget of {m.max_steps} steps exhausted (an endless loop?); "
                           "raise --max-steps")
