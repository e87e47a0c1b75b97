"""The debugger's panes — source, disassembly, registers, stack, heap, watches — as lines
tagged with a style, rendered as rich panels on a terminal and as plain text otherwise;
and the interactive loop."""

from __future__ import annotations

import linecache
import sys
from typing import TextIO

import numpy as np

from ..core import isa
from ..formats.assembly import format_instruction
from .core import fmt

Lines = list[tuple[str, str]]      # (text, style): style "" | "current" | "changed" | "dim"


def source_lines(dbg, center: int | None = None, around: int = 4) -> Lines:
    fr = dbg.frame()
    path = dbg.program.source
    current = dbg.line(fr)
    center = center or current
    out: Lines = []
    for n in range(max(1, center - around), center + around + 1):
        text = linecache.getline(path, n) if path else ""
        if not text:
            continue
        mark = "->" if n == current else "  "
        out.append((f"{mark}{n:>5}  {text.rstrip()}", "current" if n == current else ""))
    return out


def disassembly_lines(dbg, around: int = 5) -> Lines:
    """The `rvm dis` listing around the current instruction: line, -->, >> (jump target)."""
    fr = dbg.frame()
    fn, here = fr.fn, dbg.index(fr)
    targets = set(fn.labels.values())
    out: Lines = []
    for i in range(max(0, here - around), min(len(fn.code), here + around + 1)):
        mark = "-->" if i == here else "   "
        jump = ">>" if i in targets else "  "
        out.append((f"{fn.code[i].line:>5} {mark} {jump} {i:>4}  {format_instruction(fn, i)}",
                    "current" if i == here else ""))
    if here >= len(fn.code):
        out.append((f"{fn.end_line:>5} -->        (end of {fn.name})", "current"))
    return out


def registers_lines(dbg) -> Lines:
    """Registers of the selected frame, named by their source variable where there is one,
    with gradient shadows in gradient mode; changed ones (since the last command) marked."""
    fr = dbg.frame()
    fn = fr.fn
    names = {}
    line = dbg.line(fr)
    for s in fn.symbols:
        if s.first <= line <= s.last:
            names[s.regs[0]] = s.name + ("[]" if len(s.regs) > 1 else "")
    out: Lines = []
    depth = len(dbg.m.stack)
    for reg in sorted(fn.registers, key=lambda r: (r.cls != isa.INT, r.n)):
        slot = fn.slot(reg)
        value = dbg.register_value(dbg.selected, slot)
        text = f"{reg!s:>5} {names.get(reg, ''):<10} {value!r}"
        if dbg.m.grad and reg.cls == isa.FLOAT:
            text += f"   grad {dbg.register_value(dbg.selected, slot, shadow=True)!r}"
        old = dbg.previous.get((depth, slot)) if dbg.selected == 0 else value
        out.append((text, "changed" if old is not None and old != value else ""))
    return out


def stack_lines(dbg) -> Lines:
    out: Lines = []
    for k in range(len(dbg.m.stack)):
        fr = dbg.frame(k)
        how = "forwards" if fr.dir > 0 else "backwards"
        sel = "*" if k == dbg.selected else " "
        out.append((f"{sel}#{k}  {dbg.where(fr)}  ({how})", "current" if k == 0 else ""))
    return out


def heap_lines(dbg, limit: int = 12) -> Lines:
    top = dbg.m.top
    if not top:
        return [("(empty)", "dim")]
    ints = np.frombuffer(dbg.m.read_cells(0, min(top, limit)), dtype="<i8")
    out = [(f"[{a:>3}] {int(v):>20}  {float(np.int64(v).view('<f8'))!r}", "")
           for a, v in enumerate(ints)]
    if top > limit:
        out.append((f"... {top - limit} more cells in use", "dim"))
    return out


def watch_lines(dbg) -> Lines:
    out = [(f"{w.number}: watch {w.expr} = {fmt(dbg.try_eval(w.expr))}", "")
           for w in dbg.watches.values()]
    out += [(f"display {d} = {fmt(dbg.try_eval(d))}", "") for d in dbg.displays]
    return out or [("(none)", "dim")]


def status(dbg) -> str:
    direction = "forward" if dbg.direction > 0 else "reverse"
    mode = ", gradient mode" if dbg.m.grad else ""
    return f"step {dbg.m.steps} | {dbg.where()} | direction {direction}{mode}"


PANES = [("source", source_lines), ("disassembly", disassembly_lines),
         ("registers", registers_lines), ("stack", stack_lines), ("heap", heap_lines),
         ("watches", watch_lines)]


def plain_view(dbg) -> str:
    out = [status(dbg)]
    for title, pane in PANES:
        out.append(f"--- {title}")
        out += [text for text, _ in pane(dbg)]
    return "\n".join(out)


def rich_view(dbg, console, message: str) -> None:
    from rich.columns import Columns
    from rich.panel import Panel
    from rich.text import Text
    styles = {"current": "bold reverse", "changed": "bold yellow", "dim": "dim", "": ""}

    def panel(title, pane, width=None):
        text = Text()
        for k, (line, style) in enumerate(pane(dbg)):
            if k:
                text.append("\n")
            text.append(line, style=styles[style])
        return Panel(text, title=title, title_align="left", width=width)

    console.clear()
    console.print(Text(status(dbg), style="bold"))
    console.print(Columns([panel("source", source_lines), panel("disassembly",
                                                               disassembly_lines)]))
    console.print(Columns([panel("registers", registers_lines), panel("stack", stack_lines),
                           panel("heap", heap_lines), panel("watches", watch_lines)]))
    if message:
        console.print(message, markup=False, highlight=False)


def repl(dbg, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
         batch: list[str] | None = None) -> None:
    """The interactive loop: rich panels on a terminal, plain text otherwise."""
    from rich.console import Console
    terminal = batch is None and stdout.isatty() and stdin.isatty()
    console = Console(file=stdout) if terminal else None
    if terminal:
        rich_view(dbg, console, "rvm debugger: 'help' lists commands, 'q' quits")
    else:
        print(dbg.stop_text(f"rvm debugger: {dbg.entry}"), file=stdout)
    commands = iter(batch) if batch is not None else None
    while not dbg.done:
        if commands is not None:
            line = next(commands, None)
            if line is None:
                break
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            print(f"(rvm) {line.rstrip()}", file=stdout)
        else:
            try:
                line = input("(rvm) ") if terminal else _read(stdin, stdout)
            except EOFError:
                break
            if line is None:
                break
        out = dbg.execute(line)
        if terminal and not dbg.done:
            rich_view(dbg, console, out)
        elif out:
            print(out, file=stdout)


def _read(stdin: TextIO, stdout: TextIO) -> str | None:
    stdout.write("(rvm) ")
    stdout.flush()
    line = stdin.readline()
    return line if line else None
