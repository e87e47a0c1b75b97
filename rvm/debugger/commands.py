"""The debugger's commands: one function per command, registered with its help text.
`Debugger.execute` dispatches here; docs/debugger.md lists them."""

from __future__ import annotations

import ast

import numpy as np

from ..core import isa
from ..core.errors import RvmError
from ..core.program import Reg
from .core import ALIASES, COMMANDS, ENTRY, HELP, Breakpoint, CommandError, Debugger, fmt

ALIASES.update({
    "s": "step", "si": "stepi", "n": "next", "c": "continue", "rs": "reverse-step",
    "rsi": "reverse-stepi", "rn": "reverse-next", "rc": "reverse-continue", "b": "break",
    "p": "print", "l": "list", "bt": "backtrace", "where": "backtrace", "q": "quit",
    "regs": "info registers", "restart": "run", "d": "delete", "exit": "quit",
    "disassemble": "disas", "u": "until", "f": "frame", "i": "info",
})
# ---------------------------------------------------------------------- command table


def command(*names: str, help: str):
    def register(fn):
        for n in names:
            COMMANDS[n] = fn
        HELP[names[0]] = help
        return fn
    return register


def _count(rest: str) -> int:
    try:
        n = int(rest) if rest else 1
    except ValueError:
        raise CommandError(f"expected a count, got {rest!r}") from None
    if n < 1:
        raise CommandError("the count must be at least 1")
    return n


def _movement(name: str, reverse: bool, kind: str, help: str):
    @command(name, help=help)
    def run(dbg: Debugger, rest: str) -> str:
        d = -dbg.direction if reverse else dbg.direction
        if kind == "stepi":
            msg = dbg.travel(d, lambda: False, limit=_count(rest))
        elif kind == "step":
            msg = dbg.line_step(d, over=False, count=_count(rest))
        elif kind == "next":
            msg = dbg.line_step(d, over=True, count=_count(rest))
        elif kind == "finish":
            msg = dbg.finish(d)
        else:
            msg = dbg.travel(d)
        return dbg.stop_text(msg)
    return run


for _name, _kind, _help in [
        ("step", "step", "step [N]: run to the next source line, into calls"),
        ("stepi", "stepi", "stepi [N]: execute one instruction"),
        ("next", "next", "next [N]: run to the next source line, over calls"),
        ("continue", "continue", "continue: run to a breakpoint, a watch, or the end"),
        ("finish", "finish", "finish: run until the current function returns")]:
    _movement(_name, False, _kind, _help)
    _movement("reverse-" + _name, True, _kind, "reverse-" + _help.replace(":", ", backwards:", 1)
              .replace("the end", "the start").replace("returns", "was called"))


SET_VAR = ("set var: refused: rvm does not edit a program's values. Going back runs each "
           "instruction's inverse on the state as it is, so after an edit the steps back "
           "would compute a history the program never had (and an edited local could not "
           "return to zero): the state would no longer be reversible. To try other values, "
           "restart with them: run ARGS")


@command("until", help="until [LOCATION]: like next, but not back into a loop (runs until "
         "a later line); with LOCATION, run there or until the current function returns")
def _until(dbg: Debugger, rest: str) -> str:
    return dbg.stop_text(dbg.until(dbg.direction, rest, frame_only=True))


@command("advance", help="advance LOCATION: run to LOCATION (in any call) or until the "
         "current function returns")
def _advance(dbg: Debugger, rest: str) -> str:
    if not rest:
        raise CommandError("usage: advance LOCATION (a line, a function, *INDEX or "
                           "FUNCTION:*INDEX)")
    return dbg.stop_text(dbg.until(dbg.direction, rest, frame_only=False))


@command("set", help="set exec-direction forward|reverse: which way step/next/continue go "
         "(set var is refused: an edit would break reversibility; use run ARGS)")
def _set(dbg: Debugger, rest: str) -> str:
    parts = rest.split()
    if parts and (parts[0] in ("var", "variable") or "=" in rest):
        raise CommandError(SET_VAR)
    if len(parts) != 2 or parts[0] != "exec-direction" or parts[1] not in ("forward",
                                                                           "reverse"):
        raise CommandError("usage: set exec-direction forward|reverse")
    dbg.direction = 1 if parts[1] == "forward" else -1
    return f"execution direction: {parts[1]}"


@command("goto", help="goto STEP: move to step number STEP, forwards or backwards")
def _goto(dbg: Debugger, rest: str) -> str:
    try:
        target = int(rest)
    except ValueError:
        raise CommandError("usage: goto STEP (a step number)") from None
    if target < 0:
        raise CommandError("step numbers start at 0")
    d = 1 if target > dbg.m.steps else -1
    # breakpoints at the place it starts from do not stop it (a loop passes there again)
    msg = "" if target == dbg.m.steps else dbg.travel(d, lambda: dbg.m.steps == target,
                                                      limit=abs(target - dbg.m.steps),
                                                      skip=dbg.place_key())
    return dbg.stop_text(msg)


def _break(temporary: bool):
    def run(dbg: Debugger, rest: str) -> str:
        if not rest:
            raise CommandError("usage: break LINE | FUNCTION | *INDEX | FUNCTION:*INDEX")
        n = dbg.new_number()
        places = dbg.places(rest)
        dbg.breakpoints[n] = Breakpoint(n, rest, places, temporary)
        return f"{'temporary ' if temporary else ''}breakpoint {n} at {_places_text(places)}"
    return run


def _places_text(places) -> str:
    """'f instruction 3, g instruction 0 (its entry, once a call)'."""
    return ", ".join(f"{f} instruction 0 (its entry, once a call)" if i == ENTRY else
                     f"{f} instruction {i}" for f, i in sorted(places))


COMMANDS["break"], HELP["break"] = _break(False), \
    "break LINE|FUNCTION|*INDEX|FUNCTION:*INDEX: stop there, in both directions"
COMMANDS["tbreak"], HELP["tbreak"] = _break(True), "tbreak LOCATION: a breakpoint used once"


def _numbers(dbg: Debugger, rest: str) -> list[int]:
    try:
        nums = [int(x) for x in rest.split()]
    except ValueError:
        raise CommandError(f"expected breakpoint numbers, got {rest!r}") from None
    for n in nums:
        if n not in dbg.breakpoints and n not in dbg.watches:
            raise CommandError(f"no breakpoint or watchpoint number {n}")
    return nums


@command("delete", help="delete [N...]: delete breakpoints/watchpoints (all if none given)")
def _delete(dbg: Debugger, rest: str) -> str:
    nums = _numbers(dbg, rest) if rest else list(dbg.breakpoints) + list(dbg.watches)
    for n in nums:
        dbg.breakpoints.pop(n, None)
        dbg.watches.pop(n, None)
    return f"deleted {len(nums)}"


def _able(enabled: bool):
    def run(dbg: Debugger, rest: str) -> str:
        nums = _numbers(dbg, rest) if rest else list(dbg.breakpoints) + list(dbg.watches)
        for n in nums:
            (dbg.breakpoints.get(n) or dbg.watches[n]).enabled = enabled
        what = " ".join(map(str, nums)) or "nothing (no breakpoints or watchpoints)"
        return f"{'enabled' if enabled else 'disabled'} {what}"
    return run


COMMANDS["enable"], HELP["enable"] = _able(True), \
    "enable [N...]: enable breakpoints/watches (all if none given)"
COMMANDS["disable"], HELP["disable"] = _able(False), "disable [N...]: disable them (all if " \
    "none given)"


@command("clear", help="clear [LOCATION]: delete the breakpoints at LOCATION (default: "
         "where the selected frame is)")
def _clear(dbg: Debugger, rest: str) -> str:
    if rest:
        wanted = dbg.places(rest)
        entries = {(f, ENTRY) for f, i in wanted if i == ENTRY or i == 0}
        wanted = wanted | entries
    else:
        fr = dbg.frame()
        wanted = {(fr.fn.name, dbg.index(fr))} | ({(fr.fn.name, ENTRY)} if fr.state == 0
                                                    else set())
    gone = [n for n, b in dbg.breakpoints.items() if b.places & wanted]
    if not gone:
        raise CommandError(f"no breakpoint at {rest or dbg.where(dbg.frame())}")
    for n in gone:
        del dbg.breakpoints[n]
    return f"deleted breakpoint{'s' if len(gone) > 1 else ''} {' '.join(map(str, gone))}"


@command("ignore", help="ignore N COUNT: pass breakpoint N by its next COUNT arrivals")
def _ignore(dbg: Debugger, rest: str) -> str:
    parts = rest.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or \
            int(parts[0]) not in dbg.breakpoints:
        raise CommandError("usage: ignore N COUNT (N a breakpoint number, COUNT >= 0)")
    bp, count = dbg.breakpoints[int(parts[0])], int(parts[1])
    bp.ignore = count
    if count == 0:
        return f"will stop next time breakpoint {bp.number} is reached"
    return f"will ignore next {count} crossing{'s' if count > 1 else ''} of breakpoint " \
           f"{bp.number}"


@command("condition", help="condition N EXPR: stop at breakpoint N only when EXPR holds")
def _condition(dbg: Debugger, rest: str) -> str:
    num, _, expr = rest.partition(" ")
    if not num.isdigit() or int(num) not in dbg.breakpoints:
        raise CommandError("usage: condition N EXPR (N a breakpoint number)")
    if expr:
        ast_ok = dbg.try_eval(expr) is not None or _parses(expr)
        if not ast_ok:
            raise CommandError(f"cannot parse condition {expr!r}")
    dbg.breakpoints[int(num)].condition = expr.strip()
    return f"breakpoint {num} condition: {expr.strip() or '(none)'}"


def _parses(expr: str) -> bool:
    try:
        ast.parse(expr, mode="eval")
        return True
    except SyntaxError:
        return False


@command("watch", help="watch EXPR: stop when its value changes (register, variable, "
         "heap[ADDR]), in both directions")
def _watch(dbg: Debugger, rest: str) -> str:
    if not rest:
        raise CommandError("usage: watch EXPR")
    value = dbg.evaluate(rest)
    n = dbg.new_number()
    dbg.watches[n] = dbg.scoped_watch(n, rest, value)   # (after `up`, the caller's frame)
    return f"watchpoint {n}: {rest} = {fmt(value)}"


@command("display", help="display EXPR: show EXPR after every stop")
def _display(dbg: Debugger, rest: str) -> str:
    if not rest:
        return "\n".join(f"{k}: {d} = {fmt(dbg.try_eval(d))}"
                         for k, d in enumerate(dbg.displays, 1)) or "no displays"
    dbg.evaluate(rest)
    dbg.displays.append(rest)
    return f"{len(dbg.displays)}: {rest} = {fmt(dbg.evaluate(rest))}"


@command("undisplay", help="undisplay [N...]: stop showing displays N (all if none given)")
def _undisplay(dbg: Debugger, rest: str) -> str:
    try:
        nums = sorted({int(x) for x in rest.split()}, reverse=True)
    except ValueError:
        raise CommandError(f"expected display numbers, got {rest!r}") from None
    if not nums:
        dbg.displays.clear()
        return "deleted all displays"
    for n in nums:
        if not 1 <= n <= len(dbg.displays):
            raise CommandError(f"no display number {n}")
    for n in nums:
        del dbg.displays[n - 1]
    return f"deleted display {' '.join(map(str, sorted(nums)))}"


@command("print", help="print EXPR: registers (r0, f1), variables, heap[ADDR], grad[VAR], "
         "arithmetic")
def _print(dbg: Debugger, rest: str) -> str:
    if not rest:
        raise CommandError("usage: print EXPR")
    return f"{rest} = {fmt(dbg.evaluate(rest))}"


@command("x", help="x ADDR [N]: show N heap cells from ADDR (as int and float)")
def _x(dbg: Debugger, rest: str) -> str:
    parts = rest.split()
    try:
        addr, n = int(parts[0]), int(parts[1]) if len(parts) > 1 else 1
    except (ValueError, IndexError):
        raise CommandError("usage: x ADDR [N]") from None
    ints = dbg.cells(addr, n, isa.INT)
    floats = ints.view("<f8")
    return "\n".join(f"heap[{addr + k}] = {int(i)} (as float {float(f)!r})"
                     for k, (i, f) in enumerate(zip(ints, floats)))


@command("info", help="info registers [all]|breakpoints|watchpoints|display|frame|locals|"
         "args")
def _info(dbg: Debugger, rest: str) -> str:
    what = rest.split()[0] if rest else ""
    if what in ("locals", "args"):
        rows = dbg.variables(args=what == "args")
        return "\n".join(f"{n} = {fmt(v)}" for n, v in rows) or \
            f"no {'arguments' if what == 'args' else 'locals'}"
    if what in ("registers", "regs", "r"):
        from .views import registers_lines
        show_all = rest.split()[1:2] == ["all"]
        return "\n".join(text for text, _ in registers_lines(dbg, show_all))
    if what in ("breakpoints", "break", "b", "watchpoints", "watch"):
        rows = [f"{b.number}  {'temporary ' if b.temporary else ''}breakpoint at {b.where}"
                f" ({_places_text(b.places)})"
                f"{'' if b.enabled else ' (disabled)'}"
                f"{' if ' + b.condition if b.condition else ''}  hits: {b.hits}"
                f"{f'  (ignore next {b.ignore})' if b.ignore else ''}"
                for b in dbg.breakpoints.values()]
        rows += [f"{w.number}  watchpoint {w.expr}"
                 f"{f' (in {w.function})' if w.function else ''}"
                 f"{'' if w.enabled else ' (disabled)'}"
                 for w in dbg.watches.values()]
        return "\n".join(rows) or "no breakpoints or watchpoints"
    if what == "display":
        return _display(dbg, "")
    if what == "frame":
        return dbg.where(dbg.frame())
    raise CommandError("usage: info registers [all]|breakpoints|watchpoints|display|frame|"
                       "locals|args")


@command("list", help="list [LINE]: source around the current line (or LINE)")
def _list(dbg: Debugger, rest: str) -> str:
    from .views import source_lines
    center = int(rest) if rest.isdigit() else None
    if rest.strip() and center is None:
        raise CommandError(f"usage: list [LINE] (a line number, not {rest.strip()!r})")
    known, _ = dbg.source()
    if center is not None and known is not None and not 1 <= center <= len(known):
        raise CommandError(f"line {center} is outside the source ({len(known)} lines)")
    lines = source_lines(dbg, center, 5)
    return "\n".join(t for t, _ in lines) if lines else "no source available"


@command("disas", help="disas: the disassembly around the current instruction")
def _disas(dbg: Debugger, rest: str) -> str:
    from .views import disassembly_lines
    return "\n".join(t for t, _ in disassembly_lines(dbg, 8))


@command("backtrace", help="backtrace: the call stack, with each frame's direction")
def _backtrace(dbg: Debugger, rest: str) -> str:
    from .views import stack_lines
    return "\n".join(t for t, _ in stack_lines(dbg))


def _updown(sign: int):
    def run(dbg: Debugger, rest: str) -> str:
        n = _count(rest)
        new = max(0, min(len(dbg.m.stack) - 1, dbg.selected + sign * n))
        if new == dbg.selected:
            edge = "outermost" if sign > 0 else "innermost"
            return f"already at the {edge} frame (#{new}, {dbg.where(dbg.frame())})"
        dbg.selected = new
        return f"#{dbg.selected}  {dbg.where(dbg.frame())}"
    return run


@command("frame", help="frame [N]: select frame N (0 = innermost, as backtrace numbers "
         "them), or show the selected one")
def _frame(dbg: Debugger, rest: str) -> str:
    if rest:
        if not rest.isdigit():
            raise CommandError("usage: frame [N] (a frame number from backtrace)")
        n = int(rest)
        if n >= len(dbg.m.stack):
            raise CommandError(f"no frame #{n} (frames #0..#{len(dbg.m.stack) - 1})")
        dbg.selected = n
    return f"#{dbg.selected}  {dbg.where(dbg.frame())}"


COMMANDS["up"], HELP["up"] = _updown(1), "up [N]: select the caller's frame"
COMMANDS["down"], HELP["down"] = _updown(-1), "down [N]: select the callee's frame"


@command("grad", help="grad on [LOSS] | off: gradient mode (shadows shown beside values); "
         "LOSS, if given, gets gradient 1 (then step backwards for the adjoint pass)")
def _grad(dbg: Debugger, rest: str) -> str:
    parts = rest.split()
    if not parts or parts[0] not in ("on", "off"):
        raise CommandError("usage: grad on [LOSS] | grad off")
    if parts[0] == "off":
        dbg.m.set_grad(False)
        return "gradient mode off"
    if len(parts) > 1:
        name = parts[1]
        fr = dbg.frame()
        sym = dbg.symbol(name, fr)
        regs = sym.regs if sym is not None else None
        if regs is None and name[:1] == "f" and name[1:].isdigit():
            regs = (Reg(isa.FLOAT, int(name[1:])),)
        if not regs or len(regs) != 1 or regs[0].cls != isa.FLOAT or \
                regs[0] not in fr.fn.registers:
            raise CommandError(f"the loss must be a float variable or register of "
                               f"{fr.fn.name}, got {name}")
        dbg.m.set_grad(True)
        # seed the register where the value lives now: an argument of a call under way
        # is held by the callee (its own register here is zero until the call returns)
        home, slot = dbg.register_place(dbg.selected, fr.fn.slot(regs[0]))
        home.G[slot] = 1.0
        held = f", in {home.fn.name}, which holds {name} during the call" \
            if home is not fr else ""
        return f"gradient mode on; d{name} = 1{held} (now step backwards)"
    dbg.m.set_grad(True)
    return "gradient mode on"


@command("run", help="run [ARGS]: restart from the beginning (breakpoints are kept), with "
         "new arguments if given (numbers, arrays like [1.0,2.0])")
def _run(dbg: Debugger, rest: str) -> str:
    if not rest:
        dbg.restart()
        return _dropped(dbg) + dbg.stop_text("restarted")
    values = dbg.convert(rest.split()) if dbg.convert else [_value(t) for t in rest.split()]
    old = dbg.args
    dbg.args = tuple(values)
    try:
        dbg.restart()
    except RvmError as e:
        dbg.args = old
        dbg.restart()
        raise CommandError(f"run: {e} (restarted with the previous arguments)") from None
    shown = " ".join(fmt(v) for v in values)
    return _dropped(dbg) + dbg.stop_text(f"restarted with arguments {shown}")


def _dropped(dbg: Debugger) -> str:
    """What `run` says of the watches of a callee's frame that it deleted."""
    return "".join(f"watchpoint {w.number} deleted: {w.function}'s frame, where `{w.expr}` "
                   "was watched, is not running\n" for w in dbg.dropped)


def _value(text: str):
    """An argument as `rvm run --args` takes it: an integer, a float, a complex number
    (1+2j), or an array ([1.0,2.5] float64, [1,2] int64)."""
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            return float(text)          # inf, nan
        except ValueError:
            raise CommandError(f"argument {text!r} is not a number or an array like "
                               "[1.0,2.0]") from None
    if isinstance(v, list):
        floats = "." in text or any(isinstance(x, float) for x in v)
        try:
            return np.array(v, dtype=np.float64 if floats else np.int64)
        except (TypeError, ValueError):
            raise CommandError(f"argument {text!r}: an array holds numbers") from None
    if isinstance(v, bool) or not isinstance(v, (int, float, complex)):
        raise CommandError(f"argument {text!r} is not a number or an array like [1.0,2.0]")
    return v


@command("view", help="view: show every pane (source, disassembly, registers, stack, heap)")
def _view(dbg: Debugger, rest: str) -> str:
    from .views import plain_view
    return plain_view(dbg)


@command("quit", help="quit: leave the debugger")
def _quit(dbg: Debugger, rest: str) -> str:
    dbg.done = True
    return ""


@command("help", help="help [COMMAND]: list commands, or describe one")
def _help(dbg: Debugger, rest: str) -> str:
    if rest:
        name = ALIASES.get(rest, rest)
        if name not in HELP:
            raise CommandError(f"no command {rest!r}")
        return HELP[name]
    aliases = {}
    for a, full in ALIASES.items():
        aliases.setdefault(full, []).append(a)
    return "\n".join(f"  {HELP[n]}" + (f"  (alias: {', '.join(aliases[n])})"
                                       if n in aliases else "") for n in HELP)


