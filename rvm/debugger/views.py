"""The debugger's panes — source, disassembly, registers, stack, heap, watches — as lines
tagged with a style, rendered as rich panels on a terminal and as plain text otherwise;
and the interactive loop."""

from __future__ import annotations

import cmd
import contextlib
import os
import signal
import sys
from typing import TextIO

import numpy as np

from ..core import isa
from ..formats.assembly import format_instruction
from ..formats.bytecode import printable
from .core import INFO, fmt

Lines = list[tuple[str, str]]      # (text, style): style "" | "current" | "changed" | "dim"


def source_lines(dbg, center: int | None = None, around: int = 4) -> Lines:
    fr = dbg.frame()
    current = dbg.line(fr)
    center = center or current
    lines, why = dbg.source()
    if lines is None:
        return [(f"(source lines not shown: {why})", "dim")] if why else []
    out: Lines = []
    for n in range(max(1, center - around), min(len(lines), center + around) + 1):
        text = lines[n - 1]
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


def registers_lines(dbg, show_all: bool = False) -> Lines:
    """Registers of the selected frame, named by their source variable where there is one,
    with gradient shadows in gradient mode; changed ones (since the last command) marked.
    In a compiled program, temporaries and array bases are hidden unless show_all."""
    fr = dbg.frame()
    fn = fr.fn
    names = {}
    line = dbg.line(fr)
    for s in fn.symbols:
        if s.first <= line <= s.last:
            names[s.regs[0]] = s.name + ("[]" if len(s.regs) > 1 else "")
    out: Lines = []
    depth = len(dbg.m.stack)
    shown = [r for r in fn.registers if show_all or not fn.symbols or
             (r in names and not names[r].endswith("[]"))]
    for reg in sorted(shown, key=lambda r: (r.cls != isa.INT, r.n)):
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
    """Heap cells, each shown as the type the program uses it as: argument arrays by their
    element type (and name), other cells as integers when they look like one (small
    integers are subnormal floats), as floats otherwise."""
    top = dbg.m.top
    if not top:
        return [("(empty)", "dim")]
    ints = np.frombuffer(dbg.m.read_cells(0, min(top, limit)), dtype="<i8")
    kinds = {}
    for b in getattr(dbg.m, "bindings", ()):
        if b.is_array:
            for k in range(int(np.prod(b.shape))):
                kinds[b.base + k] = (b.cls, f"{b.name}[{k}]")
    out = []
    for a, v in enumerate(ints):
        cls, label = kinds.get(a, (isa.INT if abs(int(v)) < 1 << 53 else isa.FLOAT, ""))
        shown = repr(int(v)) if cls == isa.INT else repr(float(np.int64(v).view("<f8")))
        out.append((f"[{a:>3}] {shown:>24}  {label}".rstrip(), ""))
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
    return printable("\n".join(out))


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
            text.append(printable(line), style=styles[style])
        return Panel(text, title=title, title_align="left", width=width)

    console.clear()
    console.print(Text(printable(status(dbg)), style="bold"))
    console.print(Columns([panel("source", source_lines), panel("disassembly",
                                                               disassembly_lines)]))
    console.print(Columns([panel("registers", registers_lines), panel("stack", stack_lines),
                           panel("heap", heap_lines), panel("watches", watch_lines)]))
    if message:
        console.print(printable(message), markup=False, highlight=False)


def repl(dbg, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
         batch: list[str] | None = None) -> None:
    """The interactive loop: on a terminal, a line-editing shell (history, Tab completion,
    Ctrl-C stops a running move) over rich panels that redraw after moves only; plain text
    otherwise (pipes, --batch, tests)."""
    terminal = batch is None and stdout.isatty() and stdin.isatty()
    if terminal:
        Shell(dbg, stdout).run()
        return
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
            line = _read(stdin, stdout)
            if line is None:
                break
        out = dbg.execute(line)
        if out:
            print(out, file=stdout)


def _read(stdin: TextIO, stdout: TextIO) -> str | None:
    stdout.write("(rvm) ")
    stdout.flush()
    line = stdin.readline()
    return line if line else None


class ProgressLine:
    """A transient rich status line for long moves: steps so far, direction, rate.
    Callable as a machine's or the debugger's progress(steps, direction)."""

    def __init__(self, console, note: str = ""):
        self.console, self.note = console, note
        self.live = self.start = None

    def __call__(self, steps: int, direction: int) -> None:
        import time

        from rich.live import Live
        from rich.text import Text
        now = time.monotonic()
        if self.live is None:
            self.start = now
            self.live = Live(console=self.console, transient=True, auto_refresh=False)
            self.live.start()
        rate = steps / max(now - self.start, 1e-9)
        self.live.update(Text(f"running {'forwards' if direction > 0 else 'backwards'}: "
                              f"{steps:,} steps ({rate:,.0f}/s){self.note}", style="bold"),
                         refresh=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None


HISTORY = os.path.join(os.path.expanduser("~"), ".rvm_history")


class Shell(cmd.Cmd):
    """gdb's everyday comforts on the standard library's cmd and readline: line editing,
    persistent history (~/.rvm_history, or $RVM_HISTORY), Tab completion of commands,
    variables, registers, functions and breakpoint locations; Ctrl-C stops a running move
    where it is (at the prompt it just clears the line); moves over a second show their
    progress. Panes redraw after a command that moved or changed the machine; commands
    that only print (bt, info, p, help, errors) print below them."""

    prompt = "(rvm) "

    def __init__(self, dbg, stdout: TextIO):
        super().__init__(stdout=stdout)
        from rich.console import Console
        self.dbg, self.console = dbg, Console(file=stdout)
        self.history = os.environ.get("RVM_HISTORY", HISTORY)
        self.progress = ProgressLine(self.console, " (Ctrl-C stops)")

    # ------------------------------------------------------------------ the loop
    def run(self) -> None:
        try:
            import readline
        except ImportError:          # no readline on this platform: plain input()
            readline = None
        if readline is not None:
            readline.set_completer_delims(" \t\n")
            readline.set_history_length(1000)
            with contextlib.suppress(OSError):
                readline.read_history_file(self.history)
        self.dbg.progress = self.progress
        rich_view(self.dbg, self.console, "rvm debugger: 'help' lists commands, 'q' quits; "
                                          "Tab completes, Ctrl-C stops a running move")
        try:
            while True:
                try:
                    self.cmdloop()
                    break
                except KeyboardInterrupt:        # Ctrl-C at the prompt: a fresh line
                    self.stdout.write("^C\n")
        finally:
            self.dbg.progress = None
            if readline is not None:
                with contextlib.suppress(OSError):
                    readline.write_history_file(self.history)

    def onecmd(self, line: str) -> bool:
        if line == "EOF":
            self.stdout.write("\n")
            return True
        dbg = self.dbg
        before = _state(dbg)
        previous = signal.signal(signal.SIGINT, self.interrupt)
        try:
            out = dbg.execute(line)
        finally:
            signal.signal(signal.SIGINT, previous)
            self.progress.stop()
        if dbg.done:
            return True
        if _state(dbg) != before:
            rich_view(dbg, self.console, out)
        elif out:
            self.console.print(out, markup=False, highlight=False)
        return False

    def emptyline(self) -> bool:
        return self.onecmd("")          # Enter repeats the last command, as in gdb

    def interrupt(self, signum, frame) -> None:
        self.dbg.interrupted = True     # the move stops between two instructions

    # ------------------------------------------------------------------ completion
    def completenames(self, text: str, *ignored) -> list[str]:
        from .core import ALIASES, COMMANDS
        return sorted(n for n in set(COMMANDS) | set(ALIASES) if n.startswith(text))

    def completedefault(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return completions(self.dbg, line[:begidx], text)


# what each command's arguments are, position by position (the last kind repeats)
ARGUMENTS = {
    "print": ["expr"], "display": ["expr"], "watch": ["expr"], "x": ["expr"],
    "break": ["location"], "tbreak": ["location"], "until": ["location"],
    "advance": ["location"], "clear": ["location"], "list": ["line"],
    "delete": ["number"], "disable": ["number"], "enable": ["number"],
    "condition": ["number", "expr"], "ignore": ["number", "none"],
    "undisplay": ["display"], "frame": ["frame"], "up": ["none"], "down": ["none"],
    "info": ["info", "info-more"], "grad": ["on-off", "float"],
    "set": ["set", "set-more"], "help": ["command"],
}


def completions(dbg, before: str, text: str) -> list[str]:
    """Tab completion by position: the words that fit where the cursor is (`p ` offers
    variables and registers, `break ` locations, `info ` its subcommands, `delete `
    breakpoint numbers), never words of another command."""
    from .core import ALIASES, COMMANDS
    words = before.split()
    if not words:
        return sorted(n for n in set(COMMANDS) | set(ALIASES) if n.startswith(text))
    head = ALIASES.get(words[0], words[0])
    if " " in head:                     # an alias with its first argument: regs
        head, _, extra = head.partition(" ")
        words = [head, *extra.split(), *words[1:]]
    kinds = ARGUMENTS.get(head, ["none"])
    kind = kinds[min(len(words) - 1, len(kinds) - 1)]
    fr = dbg.frame()
    fn = fr.fn
    if kind == "expr":
        line = dbg.line(fr)
        names = {s.name.rpartition(".")[0] if s.name.endswith((".real", ".imag"))
                 else s.name for s in fn.symbols if s.first <= line <= s.last}
        names |= {str(r) for r in fn.registers} | {"heap[", "grad["}
        if text.startswith("grad["):
            names = {f"grad[{n}]" for n in names if not n.endswith("[")}
    elif kind == "float":
        names = {s.name for s in fn.symbols if len(s.regs) == 1 and s.regs[0].cls == isa.FLOAT}
        names |= {str(r) for r in fn.registers if r.cls == isa.FLOAT}
    elif kind == "location":
        names = set()
        for f in dbg.program.functions.values():
            names.add(f.name)
            names.update(f"{f.name}:*{i}" for i in range(len(f.code)))
        names.update(f"*{i}" for i in range(len(fn.code)))
        names.update(str(ins.line) for ins in fn.code)
    elif kind == "line":
        names = {str(ins.line) for ins in fn.code}
    elif kind == "number":
        names = {str(n) for n in list(dbg.breakpoints) + list(dbg.watches)}
    elif kind == "display":
        names = {str(k) for k in range(1, len(dbg.displays) + 1)}
    elif kind == "frame":
        names = {str(k) for k in range(len(dbg.m.stack))}
    elif kind == "info":
        names = set(INFO)
    elif kind == "info-more":
        names = {"all"} if words[1:2] == ["registers"] else set()
    elif kind == "on-off":
        names = {"on", "off"}
    elif kind == "set":
        names = {"exec-direction"}
    elif kind == "set-more":
        names = {"forward", "reverse"} if words[1:2] == ["exec-direction"] else set()
    elif kind == "command":
        names = set(COMMANDS) | set(ALIASES)
    else:
        names = set()
    return sorted(w for w in names if w.startswith(text))


def _state(dbg) -> tuple:
    """What a redraw depends on: where the machine is and what the panes show."""
    m = dbg.m
    return (m.steps, dbg.selected, len(m.stack), m.grad, m.top, len(dbg.watches),
            len(dbg.displays), len(dbg.breakpoints))
