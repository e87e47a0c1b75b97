"""The bidirectional step debugger: gdb-style commands in both directions, no recording.

Going back executes the inverse instruction, so memory stays flat however far you go.
`Debugger.execute(command)` runs one command and returns its text; `repl()` is the
interactive loop (rich panels on a terminal, plain text otherwise); see docs/debugger.md.
"""

from __future__ import annotations

import ast
import difflib
import linecache
import operator
import time
from collections.abc import Callable

import attrs
import numpy as np

from ..core import isa
from ..core.errors import RvmError
from ..core.program import Program, Reg
from ..engines.machine import Machine
from ..formats.assembly import format_instruction
from ..formats.bytecode import SourceName, printable, source_lines

BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
          ast.BitXor: operator.xor}
CHUNK = 20_000         # steps between looks at Ctrl-C and progress in a long move
MAX_BITS = 4096        # integers the expression evaluator will build (bounded time and size)
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
           ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


# The command table. rvm.debugger.commands fills it (one function per command, with its
# help text), so the core dispatches commands without importing them.
COMMANDS: dict[str, Callable[[Debugger, str], str]] = {}
ALIASES: dict[str, str] = {}
HELP: dict[str, str] = {}
# what `info` shows (for the command and for Tab completion)
INFO = ("registers", "breakpoints", "watchpoints", "display", "frame", "locals", "args")


class CommandError(Exception):
    """A bad command, breakpoint or expression: reported, and the debugger carries on."""


@attrs.define
class Breakpoint:
    number: int
    where: str                            # as the user wrote it
    # {(function name, instruction index)}; index ENTRY: the function's entry, once a call
    places: frozenset
    temporary: bool = False
    enabled: bool = True
    condition: str = ""
    hits: int = 0
    ignore: int = 0                       # arrivals still to pass by (gdb's ignore N COUNT)


ENTRY = -1      # a place: a function at its start (state 0), not its loop head re-entered


@attrs.define
class Watch:
    number: int
    expr: str
    value: object = None
    enabled: bool = True
    # the frame it was set in, as gdb scopes a watch on a local: its depth in the stack
    # (0: the entry function's), its function and the frame itself (a second call of
    # the function is another frame); None: the innermost frame, whichever it is
    depth: int | None = None
    function: str | None = None
    frame: object = None


class Debugger:
    def __init__(self, program: Program, entry: str, args: tuple, *, names=None,
                 max_steps: int = 100_000_000):
        self.program, self.entry, self.args, self.names = program, entry, tuple(args), names
        self.max_steps = max_steps
        self.breakpoints: dict[int, Breakpoint] = {}
        self.watches: dict[int, Watch] = {}
        self.displays: list[str] = []
        self.counter = 0
        self.direction = 1
        self.selected = 0                 # 0 = innermost frame
        self.done = False
        self.last_command = ""
        self._source: tuple | None = None   # (lines or None, why not), read once
        self.told = False                   # whether a stop has said why source is not shown
        # `run ARGS`: the argument texts as values (the CLI sets its own parser here)
        self.convert: Callable[[list[str]], list] | None = None
        self.restart()

    # ------------------------------------------------------------------ state
    def restart(self) -> None:
        self.interrupted = False        # set by Ctrl-C; a move stops at the next look
        self.progress = None            # progress(steps, direction) during long moves
        self.m = Machine(self.program, max_steps=self.max_steps)
        self.m.enter(self.entry, *[a.copy() if isinstance(a, np.ndarray) else a
                                   for a in self.args], names=self.names)
        self.selected = 0
        self.previous = self.registers_snapshot()
        # (a watch of the entry function's frame is the new run's; one of a callee's
        # frame has no frame now: gone, as gdb's is once its frame has returned)
        self.dropped = [w for w in self.watches.values() if w.depth]
        for w in self.dropped:
            del self.watches[w.number]
        for w in self.watches.values():
            if w.depth == 0:
                w.frame = self.m.stack[0]
            w.value = self.watch_value(w)

    def frame(self, k: int | None = None):
        stack = self.m.stack
        k = self.selected if k is None else k
        return stack[len(stack) - 1 - k]

    def index(self, fr) -> int:
        """The instruction a frame is at (about to run, in its function's forward sense)."""
        return fr.state // 2

    def between_statements(self) -> bool:
        """Is the innermost frame at the start of a line's run of instructions (or of its
        function, or at its end), where the program's values are its statements'?"""
        fr = self.m.stack[-1]
        i, code = self.index(fr), fr.fn.code
        return i <= 0 or i >= len(code) or not code[i].line or \
            code[i].line != code[i - 1].line

    def line(self, fr) -> int:
        i = self.index(fr)
        return fr.fn.code[i].line if i < len(fr.fn.code) else fr.fn.end_line

    def where(self, fr=None) -> str:
        fr = fr or self.frame(0)
        i = self.index(fr)
        at = f"instruction {i}" if i < len(fr.fn.code) else "end"
        return f"{fr.fn.name}, {at}, {self.program.source or '?'}:{self.line(fr)}"

    def source(self) -> tuple[list[str] | None, str]:
        """The program's source lines, or (None, why they are not shown). Read once, from
        a regular file only; a source named by bytecode only if it matches the recorded
        digest (rvm.formats.bytecode.source_lines)."""
        if self._source is None:
            name = self.program.source
            if not name or (not isinstance(name, SourceName) and name.startswith("<")
                            and name.endswith(">")):
                # a string, or a notebook cell: only what linecache holds in memory
                lines = [x.rstrip("\n") for x in linecache.getlines(name)] if name else []
                self._source = (lines or None, "")
            else:
                self._source = source_lines(name)
        return self._source

    def source_line(self, n: int) -> str:
        lines, _ = self.source()
        return lines[n - 1] if lines is not None and 1 <= n <= len(lines) else ""

    def registers_snapshot(self) -> dict:
        return {(len(self.m.stack), k): v for k, v in enumerate(self.frame(0).R)}

    # ------------------------------------------------------------------ moving
    def move(self, d: int) -> bool:
        return self.m.step() if d > 0 else self.m.back()

    def at_breakpoint(self, skip: tuple | None = None) -> Breakpoint | None:
        """The breakpoint that stops the machine here, if any. A function's breakpoint
        (place ENTRY) holds once a call: at the frame's start (state 0), which a loop
        whose head is the first instruction passes again only in state 1. `skip` is the
        place (depth, function, index) a move started from: no stop there again."""
        fr = self.m.stack[-1]
        i = self.index(fr)
        if skip is not None and skip == (len(self.m.stack), fr.fn.name, i):
            return None
        place = (fr.fn.name, i)
        entry = (fr.fn.name, ENTRY) if fr.state == 0 else None
        for bp in self.breakpoints.values():
            if bp.enabled and (place in bp.places or entry in bp.places):
                if bp.condition and not self.try_eval(bp.condition):
                    continue
                if bp.ignore > 0:
                    bp.ignore -= 1
                    continue
                if not self.counts(bp):
                    continue
                return bp
        return None

    def place_key(self) -> tuple:
        """Where the machine is, for `skip`: (stack depth, function, instruction)."""
        fr = self.m.stack[-1]
        return len(self.m.stack), fr.fn.name, self.index(fr)

    def counts(self, bp: Breakpoint) -> bool:
        """Does this arrival at bp stop (an editor's hit-count breakpoints say)?"""
        return True

    def changed_watch(self) -> str | None:
        """Every watch whose value changed (all are told, and all take their new values:
        one told alone left the others' old values behind, to be told late or not at
        all), or None."""
        told = []
        for w in list(self.watches.values()):
            if not w.enabled:
                continue
            if not self.in_scope(w):
                del self.watches[w.number]
                told.append(f"watchpoint {w.number} deleted: the program left "
                            f"{w.function}, where `{w.expr}` is watched")
                continue
            new = self.watch_value(w)
            if not self.comparable(w, new):
                continue
            if not same_value(new, w.value):
                old, w.value = w.value, new
                told.append(f"watchpoint {w.number}: {w.expr}\n  old value = {fmt(old)}\n"
                            f"  new value = {fmt(new)}")
        return "\n".join(told) or None

    def scoped_watch(self, number: int, expr: str, value) -> Watch:
        """A watch of the selected frame where EXPR names a variable or register (gdb
        scopes a watch on a local to its frame), else of no frame (`heap[0]`)."""
        names = {n.id for n in ast.walk(ast.parse(expr.strip(), mode="eval"))
                 if isinstance(n, ast.Name)} - {"heap"}
        if not names:
            return Watch(number, expr, value)
        fr = self.frame()
        return Watch(number, expr, value, depth=len(self.m.stack) - 1 - self.selected,
                     function=fr.fn.name, frame=fr)

    def in_scope(self, w: Watch) -> bool:
        """Is the frame the watch was set in still running (gdb deletes a watch on a
        local when its frame returns; here also when a backward move leaves it)?"""
        stack = self.m.stack
        return w.depth is None or (w.depth < len(stack) and stack[w.depth] is w.frame)

    def watch_value(self, w: Watch):
        """The watch's expression's value in the frame it was set in (None: not
        available there, or that frame is not running)."""
        if w.depth is None:
            return self.try_eval(w.expr)
        if not self.in_scope(w):
            return None
        selected = self.selected
        self.selected = len(self.m.stack) - 1 - w.depth
        try:
            return self.try_eval(w.expr)
        finally:
            self.selected = selected

    def comparable(self, w: Watch, new) -> bool:
        """Is the watch's new value to be compared with its last one (an editor's data
        breakpoints keep the last value seen while their variable is out of scope)?"""
        return True

    def travel(self, d: int, until: Callable[[], bool] | None = None,
               limit: int | None = None, skip: tuple | None = None) -> str:
        """Move in direction d until `until` holds, a breakpoint or watch triggers, the
        program's end/start, an error, or `limit` steps. Returns why it stopped. With
        `skip` (a place_key), breakpoints at that place do not stop the move."""
        limit = self.max_steps if limit is None else limit
        self.selected = 0
        self.interrupted = False
        fast = until is None and not self.watches and not any(
            b.enabled for b in self.breakpoints.values())
        start, began = time.monotonic(), self.m.steps
        try:
            if fast:             # in chunks: between them, Ctrl-C and progress get a look in
                done = 0
                while done < limit:
                    chunk = min(CHUNK, limit - done)
                    taken = self.m._move(d, chunk)
                    done += taken
                    if taken < chunk:
                        return self.boundary_message(d)
                    if self.interrupted:
                        return self.interrupt_message(d)
                    self.report(d, start, began)
                return ""
            # (watches are compared between statements, where a line's first instruction
            # is about to run, either way: a line's instructions may hold a value out of
            # its cell meanwhile, as an element's update exchanges it into a register and
            # back, a state the program never has between its statements)
            for k in range(limit):
                if not self.move(d):
                    return self.boundary_message(d)
                if self.interrupted:
                    return self.interrupt_message(d)
                if k % CHUNK == CHUNK - 1:
                    self.report(d, start, began)
                bp = self.at_breakpoint(skip)
                if bp is not None:
                    bp.hits += 1
                    if bp.temporary:
                        del self.breakpoints[bp.number]
                    return f"breakpoint {bp.number}, {self.where()}"
                if self.watches and self.between_statements():
                    change = self.changed_watch()
                    if change:
                        return change
                if until is not None and until():
                    return ""
            return ""
        except RvmError as e:
            return ("stopped by an error (the state is as before the failing step):\n"
                    f"{type(e).__name__}: {e}")

    def report(self, d: int, start: float, began: int) -> None:
        """Tell the progress callback about a move running for over a second."""
        if self.progress is not None and time.monotonic() - start > 1.0:
            self.progress(abs(self.m.steps - began), d)

    def interrupt_message(self, d: int) -> str:
        self.interrupted = False
        return (f"interrupted {'forwards' if d > 0 else 'backwards'} at step {self.m.steps}, "
                f"{self.where()}")

    def boundary_message(self, d: int) -> str:
        if d > 0:
            return f"reached the end of {self.entry}; step back with reverse-step / rc"
        return f"reached the start of {self.entry}"

    def key(self) -> tuple:
        """Where a line step is: (stack depth, function, source line)."""
        fr = self.m.stack[-1]
        at_end = self.index(fr) >= len(fr.fn.code)      # the end is a stop of its own
        return len(self.m.stack), fr.fn.name, self.line(fr), at_end

    def line_step(self, d: int, over: bool, count: int) -> str:
        """step/next (over=True skips deeper frames). Forwards: run until the line (or
        frame) changes. Backwards: run back into the previous line, then to its start —
        so reverse-step retraces exactly the stops that step makes."""
        msg = ""
        for _ in range(count):
            depth, start = len(self.m.stack), self.key()

            def changed(depth=depth, start=start):
                k = self.key()
                return not (over and k[0] > depth) and k != start
            msg = self.travel(d, changed)
            if msg or d > 0:
                if msg:
                    break
                continue
            line = self.key()

            def left(line=line):
                k = self.key()
                return not (over and k[0] > line[0]) and k != line
            msg = self.travel(d, left)
            if not msg:                 # one step (or one call) too far: return to the line
                msg = self.travel(-d, lambda line=line: self.key() == line)
            elif msg.startswith("reached"):
                msg = ""
            if msg:
                break
        return msg

    def finish(self, d: int) -> str:
        """Run until the current function returns (d > 0) or back to its call (d < 0);
        breakpoints at the place it started from do not stop it (a loop passing there
        again would keep it there)."""
        depth, skip = len(self.m.stack), self.place_key()
        if depth == 1:
            return self.travel(d, skip=skip)
        return self.travel(d, lambda: len(self.m.stack) < depth, skip=skip)

    def at_places(self, places) -> bool:
        """Is the machine at one of these places (ENTRY: a function's start)?"""
        fr = self.m.stack[-1]
        return (fr.fn.name, self.index(fr)) in places or (
            fr.state == 0 and (fr.fn.name, ENTRY) in places)

    def until(self, d: int, where: str = "", frame_only: bool = True) -> str:
        """gdb's until / advance. With no place: like next, but a jump back to an earlier
        line (a loop's next pass) does not stop it, so it leaves the loop. With a place:
        run to it, or until the current function returns (`frame_only`: only in this frame
        or its callers, not in deeper calls)."""
        depth = len(self.m.stack)
        if where:
            places = self.places(where)
            return self.travel(d, lambda: len(self.m.stack) < depth or (
                self.at_places(places) and (not frame_only or len(self.m.stack) <= depth)))
        start = self.key()
        while True:
            msg = self.line_step(d, over=True, count=1)
            k = self.key()
            if msg or k[0] != depth or k[1] != start[1] or k[3] or \
                    (k[2] - start[2]) * d > 0:
                return msg

    def variables(self, args: bool) -> list[tuple[str, object]]:
        """The selected frame's arguments (args) or its other variables in scope, by their
        source names (registers by number in a program without names)."""
        fr = self.frame()
        fn, line = fr.fn, self.line(fr)
        params = set(fn.params)
        out, seen = [], set()
        for s in fn.symbols:
            if not s.first <= line <= s.last:
                continue
            name = s.name.rpartition(".")[0] if s.name.endswith((".real", ".imag")) \
                else s.name
            if name in seen or (s.regs[0] in params) != args:
                continue
            if self.symbol(s.name, fr) is not s:        # shadowed by an inner one
                continue
            seen.add(name)
            try:
                out.append((name, self.lookup(name)))
            except CommandError:
                out.append((name, None))
        if not fn.symbols:
            regs = fn.params if args else [r for r in fn.registers if r not in params]
            out = [(str(r), self.register_value(self.selected, fn.slot(r))) for r in regs]
        return out

    # ------------------------------------------------------------------ expressions
    def symbol(self, name: str, fr):
        line = self.line(fr)
        best = None
        for s in fr.fn.symbols:
            if s.name == name and s.first <= line <= s.last and (best is None or
                                                                  s.first >= best.first):
                best = s
        return best

    def register_place(self, k: int, slot: int) -> tuple:
        """Where a register of frame k (0 = innermost) lives now: (frame, slot). An argument
        a call moved into its callee lives in the callee's parameter register (and so on
        down the stack) until the call returns."""
        stack = self.m.stack
        j = len(stack) - 1 - k
        while j + 1 < len(stack):
            link = next((c for a, c in stack[j + 1].links if a == slot), None)
            if link is None:
                break
            j, slot = j + 1, link
        return stack[j], slot

    def register_value(self, k: int, slot: int, shadow: bool = False):
        """A register of frame k (0 = innermost), following arguments moved into callees."""
        fr, slot = self.register_place(k, slot)
        if shadow:
            return fr.G[slot] if fr.G is not None else 0.0
        return fr.R[slot]

    def lookup(self, name: str, shadow: bool = False):
        fr = self.frame()
        sym = self.symbol(name, fr)
        if sym is not None:
            if len(sym.regs) > 1:       # an array: (base, dims...)
                base, *dims = (self.register_value(self.selected, fr.fn.slot(r))
                               for r in sym.regs)
                return self.cells(base, int(np.prod(dims)), sym.dtype or isa.FLOAT,
                                  shadow).reshape(dims)
            return self.register_value(self.selected, fr.fn.slot(sym.regs[0]), shadow)
        if self.symbol(name + ".real", fr) is not None:      # a complex scalar
            return complex(self.lookup(name + ".real", shadow),
                           self.lookup(name + ".imag", shadow))
        if len(name) > 1 and name[0] in "rf" and name[1:].isdigit():
            reg = Reg(isa.INT if name[0] == "r" else isa.FLOAT, int(name[1:]))
            if reg in fr.fn.registers:
                return self.register_value(self.selected, fr.fn.slot(reg), shadow)
            raise CommandError(f"{fr.fn.name} has no register {name}")
        if any(s.name == name for s in fr.fn.symbols):
            raise CommandError(f"{name} is not in scope at line {self.line(fr)}")
        raise CommandError(f"no variable or register {name!r} in {fr.fn.name}")

    def cells(self, base: int, n: int, cls: str, shadow: bool = False) -> np.ndarray:
        if not (base >= 0 and base + n <= self.m.top):
            raise CommandError(f"heap cells {base}..{base + n - 1} are not in use "
                               f"(the heap has {self.m.top} cells)")
        dtype = "<f8" if cls == isa.FLOAT or shadow else "<i8"
        return self.m.cells(base, n, dtype, shadow).copy()

    def evaluate(self, text: str):
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError:
            raise CommandError(f"cannot parse expression {text!r}") from None
        return self._eval(tree.body)

    def try_eval(self, text: str):
        try:
            return self.evaluate(text)
        except (CommandError, ArithmeticError, ValueError, IndexError, TypeError):
            return None

    def _eval(self, e):
        if isinstance(e, ast.Constant) and isinstance(e.value, (int, float)):
            return e.value
        if isinstance(e, ast.Name):
            return self.lookup(e.id)
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and \
                e.attr in ("real", "imag"):             # a part of a complex variable
            return self.lookup(f"{e.value.id}.{e.attr}")
        if isinstance(e, ast.Subscript):
            if isinstance(e.value, ast.Name) and e.value.id == "heap":
                addr = self._eval(e.slice)
                return self.cells(int(addr), 1, isa.INT)[0]
            if isinstance(e.value, ast.Name) and e.value.id == "grad":
                return self.lookup(e.slice.id, shadow=True) if isinstance(
                    e.slice, ast.Name) else None
            arr = self._eval(e.value)
            if not isinstance(arr, np.ndarray):
                raise CommandError(f"{ast.unparse(e.value)} is not an array")
            idx = tuple(self._eval(x) for x in e.slice.elts) if isinstance(
                e.slice, ast.Tuple) else self._eval(e.slice)
            try:
                return arr[idx]
            except (IndexError, TypeError, ValueError):
                raise CommandError(f"bad index {ast.unparse(e.slice)} for "
                                   f"{ast.unparse(e.value)} (shape {arr.shape})") from None
        if isinstance(e, ast.BinOp) and type(e.op) in BINARY:
            left, right = self._eval(e.left), self._eval(e.right)
            if isinstance(e.op, ast.Pow) and isinstance(left, int) and \
                    isinstance(right, int) and abs(left) > 1 and \
                    right * left.bit_length() > MAX_BITS:
                raise CommandError(f"{ast.unparse(e)} is too large to compute")
            try:
                value = BINARY[type(e.op)](left, right)
            except ZeroDivisionError:
                raise CommandError(f"division by zero in {ast.unparse(e)}") from None
            except (ArithmeticError, TypeError, ValueError) as exc:
                raise CommandError(f"{ast.unparse(e)}: {exc}") from None
            if isinstance(value, int) and value.bit_length() > MAX_BITS:
                raise CommandError(f"{ast.unparse(e)} is too large to show")
            return value
        if isinstance(e, ast.UnaryOp):
            v = self._eval(e.operand)
            return -v if isinstance(e.op, ast.USub) else (not v) if isinstance(
                e.op, ast.Not) else v
        if isinstance(e, ast.Compare):
            left = self._eval(e.left)
            for op, c in zip(e.ops, e.comparators):
                right = self._eval(c)
                if not COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(e, ast.BoolOp):
            values = [self._eval(v) for v in e.values]
            return all(values) if isinstance(e.op, ast.And) else any(values)
        raise CommandError(f"unsupported expression: {ast.unparse(e)} (use registers, "
                           "variables, heap[ADDR], grad[VAR], numbers, arithmetic, "
                           "comparisons)")

    # ------------------------------------------------------------------ breakpoints
    def places(self, where: str) -> frozenset:
        funcs = self.program.functions
        fn_name, _, rest = where.rpartition(":") if ":" in where else ("", "", where)
        if rest.startswith("*"):
            fn = funcs.get(fn_name) if fn_name else self.frame().fn
            if fn is None:
                raise CommandError(f"no function {fn_name!r}")
            try:
                i = int(rest[1:])
            except ValueError:
                raise CommandError(f"bad instruction index {rest!r}") from None
            if not 0 <= i < len(fn.code):
                raise CommandError(f"{fn.name} has instructions 0..{len(fn.code) - 1}")
            return frozenset({(fn.name, i)})
        if where in funcs:
            return frozenset({(where, ENTRY)})
        try:
            line = int(rest)
        except ValueError:
            close = difflib.get_close_matches(where, list(funcs), 1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise CommandError(f"no function or line {where!r}{hint} (break LINE, FUNCTION, "
                               "*INDEX or FUNCTION:*INDEX)") from None
        found = set()
        for fn in funcs.values():
            for i, ins in enumerate(fn.code):
                if ins.line == line and (i == 0 or fn.code[i - 1].line != line):
                    found.add((fn.name, i))
        if not found:
            lines = sorted({ins.line for fn in funcs.values() for ins in fn.code})
            near = min(lines, key=lambda x: abs(x - line)) if lines else None
            raise CommandError(f"no code at line {line}" +
                               (f"; the nearest line with code is {near}" if near else ""))
        return frozenset(found)

    def new_number(self) -> int:
        self.counter += 1
        return self.counter

    # ------------------------------------------------------------------ commands
    def execute(self, command: str) -> str:
        command = command.strip()
        if not command:
            command = self.last_command
        if not command or command.startswith("#"):
            return ""
        self.last_command = command
        head, _, rest = command.partition(" ")
        head = ALIASES.get(head, head)
        if " " in head:
            head, _, extra = head.partition(" ")
            rest = (extra + " " + rest).strip()
        handler = COMMANDS.get(head)
        if handler is None:
            names = list(COMMANDS) + list(ALIASES)
            close = difflib.get_close_matches(head, names, 1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            return f"unknown command {head!r}{hint} (try 'help')"
        self.previous = self.registers_snapshot()
        # names from debug info (file, function, variable names) and source lines are
        # escaped on the way out: no control character reaches the terminal raw
        try:
            return printable(handler(self, rest.strip()) or "")
        except CommandError as e:
            return printable(str(e))
        except RvmError as e:                   # a run-time error of the program
            return printable(f"error: {e}")
        except (ArithmeticError, ValueError, TypeError, IndexError, KeyError) as e:
            # a command that fails prints one line and the session goes on
            return printable(f"error: {head}: {e}")

    def stop_text(self, message: str) -> str:
        """What a movement command prints: why it stopped, where, and displays."""
        fr = self.frame(0)
        out = [message] if message else []
        source = self.source_line(self.line(fr)).strip()
        i = self.index(fr)
        ins = format_at(fr.fn, i)
        out.append(f"[step {self.m.steps}] {self.where(fr)}")
        if source:
            out.append(f"{self.line(fr):>5}  {source}")
        else:
            lines, why = self.source()
            if lines is None and why and not self.told:   # once a session
                self.told = True
                out.append(f"(source lines not shown: {why}; showing instructions)")
        out.append(f"  --> {i:>4}  {ins}")
        for k, d in enumerate(self.displays, 1):
            out.append(f"{k}: {d} = {fmt(self.try_eval(d))}")
        return printable("\n".join(out))


def format_at(fn, i: int) -> str:
    return format_instruction(fn, i).strip() if i < len(fn.code) else "(end of function)"


def same_value(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and \
            a.shape == b.shape and bool(np.all(a == b))
    return a == b and type(a) is type(b)


def fmt(v) -> str:
    if isinstance(v, np.ndarray):
        return np.array2string(v, separator=", ", threshold=20)
    if isinstance(v, np.generic):       # (an array's element: as a scalar shows, 2 not
        v = v.item()                    # np.int64(2))
    return "<unavailable>" if v is None else repr(v)


def debugger_for(fn, args) -> Debugger:
    """A Debugger for a reversible function or a function of a loaded program."""
    if hasattr(fn, "specialize"):
        program, name, names = fn.specialize(args)
        return Debugger(program, name, args, names=names)
    return Debugger(fn.program, fn.name, args)

