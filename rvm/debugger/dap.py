"""`rvm dap`: the bidirectional debugger in an editor, over the Debug Adapter Protocol.

The server speaks DAP (`Content-Length: N` headers, then N bytes of JSON) over stdio, or
over TCP on the loopback address with `--port`. It stands on the debugger's core
(rvm.debugger.core): moves, breakpoints, watches, expressions, gradient mode and the map
from instructions to source lines are the core's; this module translates requests into
them and their results into responses and events. DAP's reverse execution
(`supportsStepBack`) maps onto the core's moves backwards, which execute inverse
instructions and record nothing.

Threads: a reader thread parses messages and answers `pause` at once (it sets a flag the
core's moves look at between instructions); every other request is handled in order by
the session's own thread, so the core is only ever touched by one thread. A request that
arrives during a long `continue` interrupts it, is served, and the run resumes. The end
of the input (the client went away) ends the session: the move under way stops, and any
move still queued stops at once, so the server ends promptly whatever was queued.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import queue
import re
import shlex
import socket
import sys
import threading
import traceback
import types

import attrs
import numpy as np

from ..core import isa
from ..core.errors import RvmError
from ..core.program import Program
from .core import (
    ALIASES,
    COMMANDS,
    Breakpoint,
    CommandError,
    Debugger,
    Watch,
    fmt,
    format_at,
)

MAX_MESSAGE = 64 << 20          # bytes in one message; longer ones are refused
HEADER = re.compile(rb"content-length:\s*(\S*)", re.I)
ENGINES = ("interp", "python", "native", "auto")
TRANSFORMS = ("inverse", "adjoint", "tangent")
MOVING = {"step", "stepi", "next", "continue", "finish", "goto", "run"} | {
    f"reverse-{m}" for m in ("step", "stepi", "next", "continue", "finish")}
LAUNCH_ATTRIBUTES = ("program", "entry", "args", "cwd", "stopOnEntry", "stopAtEnd", "engine",
                     "gradient", "transform", "maxSteps", "heapLimit", "noDebug")
HIT = re.compile(r"\s*(==|>=|<=|>|<|%)?\s*(\d+)\s*$")
PAGE = 1000                     # array elements shown without paging

CAPABILITIES = {
    "supportsConfigurationDoneRequest": True,
    "supportsFunctionBreakpoints": True,
    "supportsConditionalBreakpoints": True,
    "supportsHitConditionalBreakpoints": True,
    "supportsDataBreakpoints": True,
    "supportsEvaluateForHovers": True,
    "supportsStepBack": True,
    "supportsRestartRequest": True,
    "supportsTerminateRequest": True,
    "supportsSteppingGranularity": True,
    "supportsExceptionInfoRequest": True,
    "supportsDelayedStackTraceLoading": True,
    "exceptionBreakpointFilters": [],
}


class ProtocolError(Exception):
    """A message that is not DAP: answered with an error response, then the next one."""


class RequestError(Exception):
    """A request the server cannot carry out: an error response with this message."""


# ---------------------------------------------------------------------- the wire
class Transport:
    """DAP's framing on a pair of binary streams."""

    def __init__(self, rfile, wfile):
        self.rfile, self.wfile = rfile, wfile
        self.lock = threading.Lock()
        self.seq = 0
        self.closed = False

    def read(self) -> dict | None:
        """The next message, or None at the end of the input. A malformed one raises
        ProtocolError after its bytes are consumed, so the next read starts afresh."""
        length, bad, first = None, None, None
        while True:
            line = self.rfile.readline(65536)
            if not line:
                return None
            if not line.strip():
                if first is None:
                    continue                # stray blank lines between messages
                break
            if first is None:
                first = line.strip()
            found = HEADER.search(line)     # (also after a body a bad header left unread)
            if found:
                try:
                    length = int(found.group(1))
                except ValueError:
                    bad = f"bad Content-Length header {found.group(1).decode('latin-1')!r}"
        if bad:
            raise ProtocolError(bad)
        if length is None:                  # its body, if any, runs into the next header
            raise ProtocolError("a header block without a Content-Length header: "
                                f"{first.decode('latin-1')[:80]!r}")
        if not 0 <= length <= MAX_MESSAGE:
            raise ProtocolError(f"Content-Length {length} is out of range (0..{MAX_MESSAGE})")
        body = self.rfile.read(length)
        if len(body) < length:
            return None
        try:
            msg = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ProtocolError(f"the message is not JSON: {e}") from None
        if not isinstance(msg, dict):
            raise ProtocolError(f"a message must be a JSON object, got {type(msg).__name__}")
        return msg

    def write(self, msg: dict) -> None:
        with self.lock:
            if self.closed:
                return
            self.seq += 1
            msg["seq"] = self.seq
            try:
                body = json.dumps(msg, allow_nan=False).encode()
            except ValueError:          # a NaN or infinity somewhere: as JSON strings
                body = json.dumps(_no_nan(msg)).encode()
            try:
                self.wfile.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
                self.wfile.flush()
            except (OSError, ValueError):
                self.closed = True      # the client went away: the session ends


def _no_nan(v):
    if isinstance(v, float) and not np.isfinite(v):
        return repr(v)
    if isinstance(v, dict):
        return {k: _no_nan(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_no_nan(x) for x in v]
    return v


class _Output(io.TextIOBase):
    """A text stream whose lines become `output` events (the program's prints)."""

    def __init__(self, emit, category: str):
        self.emit, self.category, self.buf = emit, category, ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.buf += s
        if "\n" in self.buf:
            head, _, self.buf = self.buf.rpartition("\n")
            self.emit(head + "\n", self.category)
        return len(s)

    def flush(self) -> None:
        if self.buf:
            text, self.buf = self.buf, ""
            self.emit(text, self.category)


# ---------------------------------------------------------------------- the debugger
class DapDebugger(Debugger):
    """The core debugger with what an editor adds: a stop flag the server sets from
    another thread, hit-count breakpoints, the program's prints as events, and data
    breakpoints that keep watching while their expression is out of scope (in a call)."""

    def __init__(self, program, entry, args, *, names=None, max_steps, heap_limit, out,
                 external=lambda: False):
        self.out, self.heap_limit, self.external = out, heap_limit, external
        self._interrupted = False
        self.hit_tests: dict[int, object] = {}      # breakpoint number -> test of a count
        self.arrivals: dict[int, int] = {}
        super().__init__(program, entry, args, names=names, max_steps=max_steps)

    @property
    def interrupted(self) -> bool:              # looked at between instructions
        return self._interrupted or self.external()

    @interrupted.setter
    def interrupted(self, value: bool) -> None:
        self._interrupted = value

    def restart(self) -> None:
        super().restart()
        self.m.out = self.out
        self.m.heap_limit = self.heap_limit
        self.arrivals.clear()

    def counts(self, bp: Breakpoint) -> bool:
        test = self.hit_tests.get(bp.number)
        if test is None:
            return True
        self.arrivals[bp.number] = self.arrivals.get(bp.number, 0) + 1
        return test(self.arrivals[bp.number])

    def comparable(self, w: Watch, new) -> bool:
        if new is None:                 # not in scope here: keep the last value seen
            return False
        if w.value is None:
            w.value = new
            return False
        return True


def hit_test(text: str):
    """A DAP hit condition: `N` or `== N` (the Nth arrival), `>= N`, `> N`, `<= N`,
    `< N`, `% N` (every Nth)."""
    m = HIT.match(text)
    if not m:
        raise RequestError(f"bad hit condition {text!r} (use N, >= N, > N, <= N, < N or % N)")
    op, n = m.group(1) or "==", int(m.group(2))
    if op == "%" and n == 0:
        raise RequestError("hit condition % 0: the count must be at least 1")
    return {"==": lambda k: k == n, ">=": lambda k: k >= n, ">": lambda k: k > n,
            "<=": lambda k: k <= n, "<": lambda k: k < n, "%": lambda k: k % n == 0}[op]


# ---------------------------------------------------------------------- arguments
def _get(args: dict, name: str, kinds, default=None, required: bool = False, where=""):
    if name not in args or args[name] is None:
        if required:
            raise RequestError(f"{where}: the argument {name!r} is required")
        return default
    v = args[name]
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in _tuple(kinds)):
        names = " or ".join(k.__name__ for k in _tuple(kinds))
        raise RequestError(f"{where}: {name!r} must be {names.replace('str', 'a string')}"
                           f", got {json.dumps(v)[:80]}")
    return v


def _tuple(kinds) -> tuple:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _arg_texts(raw) -> list[str]:
    """Launch arguments as the CLI writes them: a list of strings (numbers and arrays
    also as JSON values), or one string split like a shell."""
    if isinstance(raw, str):
        return shlex.split(raw)
    out = []
    for v in raw:
        if isinstance(v, bool) or not isinstance(v, (str, int, float, list)):
            raise RequestError(f"launch: each of 'args' must be a string or a number, got "
                               f"{json.dumps(v)[:80]}")
        out.append(v if isinstance(v, str) else json.dumps(v))
    return out


def _plain(v):
    """A numpy scalar as the Python number it holds."""
    return v.item() if isinstance(v, np.generic) else v


def _shown(v) -> str:
    v = _plain(v)
    if isinstance(v, np.ndarray):
        return fmt(v)
    return "<unavailable>" if v is None else repr(v)


# ---------------------------------------------------------------------- the session
class Session:
    def __init__(self, transport: Transport, load):
        self.t = transport
        self.read_program = load           # (path, entry, argument texts) -> program, entry, values
        self.dbg: DapDebugger | None = None
        self.queue: queue.Queue = queue.Queue()
        self.deferred: list = []
        self.running = False            # a move is under way (in the session's thread)
        self.resumable = False          # ... a continue, which a request may interrupt
        self.pause_requested = False
        self.gone = False               # the input ended: every move stops at once
        self.service = False            # a request waits for a continue to let it in
        self.finished = False
        self.config_done = False
        self.launch_args: dict = {}
        self.lines_start_at1 = self.columns_start_at1 = True
        self.refs: dict[int, object] = {}
        self.exception: tuple[str, str] | None = None
        self.source_bps: dict[str, list[int]] = {}
        self.function_bps: list[int] = []
        self.data_bps: list[int] = []
        self.stdout = _Output(self.output, "stdout")

    # ------------------------------------------------------------------ messages
    def send_event(self, event: str, body: dict | None = None) -> None:
        msg = {"type": "event", "event": event}
        if body is not None:
            msg["body"] = body
        self.t.write(msg)

    def respond(self, req: dict, body: dict | None = None) -> None:
        msg = {"type": "response", "request_seq": req.get("seq", 0), "success": True,
               "command": req.get("command", "")}
        if body is not None:
            msg["body"] = body
        self.t.write(msg)

    def fail(self, req: dict | None, message: str) -> None:
        req = req or {}
        seq = req.get("seq", 0)
        command = req.get("command", "")
        self.t.write({"type": "response",
                      "request_seq": seq if isinstance(seq, int) else 0,
                      "success": False, "command": command if isinstance(command, str) else "",
                      "message": message,
                      "body": {"error": {"id": 1, "format": message, "showUser": True}}})

    def output(self, text: str, category: str = "console") -> None:
        self.send_event("output", {"category": category, "output": text})

    # ------------------------------------------------------------------ the loops
    def run(self) -> None:
        """Serve until the client disconnects or goes away."""
        reader = threading.Thread(target=self.read_loop, name="rvm-dap-reader", daemon=True)
        reader.start()
        while not self.finished and not self.t.closed:
            msg = self.deferred.pop(0) if self.deferred else self.queue.get()
            if self.gone and msg is not None and msg["command"] in MOVE_REQUESTS | {
                    "restart"}:
                self.fail(msg, f"{msg['command']}: not run: the input ended (the client "
                          "went away)")
                continue
            if msg is None:
                break
            self.handle(msg)
            if not self.running and self.queue.empty():
                self.pause_requested = False

    def read_loop(self) -> None:
        while True:
            try:
                msg = self.t.read()
            except ProtocolError as e:
                self.fail(None, f"malformed message: {e}")
                continue
            except (OSError, ValueError):
                msg = None
            if msg is None:
                self.gone = True                    # stop a run, then end the session
                self.queue.put(None)
                return
            command = msg.get("command")
            if msg.get("type") != "request" or not isinstance(command, str) or \
                    not isinstance(msg.get("seq", 0), int):
                self.fail(msg if isinstance(command, str) else None,
                          "malformed message: expected a request "
                          '({"type": "request", "seq": N, "command": "...", ...})')
                continue
            if command == "pause":
                if self.running or not self.queue.empty() or self.deferred:
                    self.pause_requested = True
                self.respond(msg)
                continue
            if command in ("disconnect", "terminate"):
                self.pause_requested = True
            elif self.running and self.resumable:
                self.service = True
            self.queue.put(msg)

    def handle(self, req: dict) -> None:
        command = req["command"]
        handler = getattr(self, "on_" + command, None) if command.isidentifier() else None
        try:
            if handler is None:
                raise RequestError(f"unknown request {command!r}")
            args = req.get("arguments", {})
            if args is None:
                args = {}
            if not isinstance(args, dict):
                raise RequestError(f"{command}: 'arguments' must be an object")
            handler(req, args)
        except RequestError as e:
            self.fail(req, str(e))
        except CommandError as e:
            self.fail(req, f"{command}: {e}")
        except RvmError as e:
            self.fail(req, f"{command}: {type(e).__name__}: {e}")
        except Exception as e:                  # a bug of ours: reported, the server goes on
            traceback.print_exc(file=sys.stderr)
            self.fail(req, f"{command}: internal error: {type(e).__name__}: {e}")

    def serve_waiting(self) -> None:
        """Handle requests that came in during a continue (then it resumes)."""
        self.service = False
        while True:
            try:
                msg = self.queue.get_nowait()
            except queue.Empty:
                return
            if msg is None or msg["command"] in MOVE_REQUESTS or \
                    msg["command"] in ("disconnect", "terminate", "restart", "evaluate"):
                self.deferred.append(msg)
            else:
                self.handle(msg)

    # ------------------------------------------------------------------ set-up
    def on_initialize(self, req, args) -> None:
        self.lines_start_at1 = _get(args, "linesStartAt1", bool, True, where="initialize")
        self.columns_start_at1 = _get(args, "columnsStartAt1", bool, True,
                                      where="initialize")
        self.respond(req, CAPABILITIES)

    def on_launch(self, req, args) -> None:
        if self.dbg is not None:
            raise RequestError("launch: a program is launched already (restart it instead)")
        self.dbg = self.load(args)
        self.launch_args = args
        self.respond(req)
        self.send_event("initialized")
        if self.config_done:
            self.start()

    def load(self, args: dict) -> DapDebugger:
        where = "launch"
        program = _get(args, "program", str, required=True, where=where)
        cwd = _get(args, "cwd", str, "", where=where)
        entry = _get(args, "entry", str, where=where)
        texts = _arg_texts(_get(args, "args", (list, str), [], where=where))
        engine = _get(args, "engine", str, None, where=where)
        if engine is not None and engine not in ENGINES:
            raise RequestError(f"launch: 'engine' must be one of {', '.join(ENGINES)}, "
                               f"got {engine!r}")
        _get(args, "stopOnEntry", bool, False, where=where)
        _get(args, "stopAtEnd", bool, True, where=where)
        _get(args, "noDebug", bool, False, where=where)
        transform = _get(args, "transform", str, None, where=where)
        if transform is not None and transform not in TRANSFORMS:
            raise RequestError(f"launch: 'transform' must be one of {', '.join(TRANSFORMS)}"
                               f", got {transform!r}")
        gradient = _get(args, "gradient", dict, None, where=where)
        if gradient is not None:
            _get(gradient, "loss", str, required=True, where="launch: gradient")
        max_steps = _get(args, "maxSteps", int, 100_000_000, where=where)
        heap_limit = _get(args, "heapLimit", int, 1 << 24, where=where)
        if max_steps < 1 or heap_limit < 1:
            raise RequestError("launch: 'maxSteps' and 'heapLimit' must be at least 1")
        path = os.path.join(cwd, program) if cwd else program
        if not os.path.isfile(path):
            raise RequestError(f"launch: {path}: no such file")
        if not path.endswith((".py", ".ja", ".rasm", ".rvmb")):
            raise RequestError(f"launch: {path}: expected a .py, .ja, .rasm or .rvmb file")
        code, name, values = self.read_program(path, entry, texts)
        if transform in ("tangent", "adjoint") and \
                any(isinstance(v, np.ndarray) for v in values):
            # (as rvm.tangent and rvm.adjoint call it: each array with its tangents)
            from ..ad.derivatives import packed_call
            _, code, name, values = packed_call(code[name], transform, list(values))
        else:
            code, name = derived(code, name, transform)
        dbg = DapDebugger(code, name, tuple(values), max_steps=max_steps,
                          heap_limit=heap_limit, out=self.stdout,
                          external=lambda: self.pause_requested or self.service or
                          self.gone)
        dbg.path = os.path.abspath(path)
        dbg.engine = engine
        if gradient is not None:
            self.gradient_setup(dbg, gradient["loss"])
        return dbg

    def gradient_setup(self, dbg: DapDebugger, loss: str) -> None:
        """Gradient mode: run forwards to the end (past breakpoints and watches), seed the
        loss with 1; stepping backwards then pulls the gradient back."""
        kept = dbg.breakpoints, dbg.watches
        dbg.breakpoints, dbg.watches = {}, {}
        try:
            msg = dbg.travel(1)
        finally:
            dbg.breakpoints, dbg.watches = kept
        if not msg.startswith("reached the end"):
            raise RequestError(f"gradient: the forward pass did not reach the end: {msg}")
        out = dbg.execute(f"grad on {loss}")
        if not out.startswith("gradient mode on"):
            raise RequestError(f"gradient: {out}")
        for w in dbg.watches.values():
            w.value = dbg.watch_value(w)

    def on_configurationDone(self, req, args) -> None:
        self.respond(req)
        self.config_done = True
        if self.dbg is not None:
            self.start()

    def start(self) -> None:
        args, dbg = self.launch_args, self.need()
        if args.get("noDebug"):
            self.run_without_debugging()
        elif args.get("gradient"):
            loss = args["gradient"]["loss"]
            self.stopped("entry", f"gradient mode: at the end of {dbg.entry}, d{loss} = 1; "
                                  "step back to pull the gradient back")
        elif args.get("stopOnEntry"):
            self.stopped("entry", f"at the start of {dbg.entry}")
        else:
            self.move(lambda: self.travel_serving(1), "continue", d=1)

    def run_without_debugging(self) -> None:
        dbg = self.need()
        if self.gone:                   # (a run without debugging cannot be interrupted)
            return
        from ..engines.machine import Machine
        m = Machine(dbg.program, max_steps=dbg.max_steps, heap_limit=dbg.heap_limit,
                    engine=dbg.engine)
        m.out = self.stdout
        m.enter(dbg.entry, *[a.copy() if isinstance(a, np.ndarray) else a for a in dbg.args],
                names=dbg.names)
        try:
            m.finish()
            self.results(m)
            code = 0
        except RvmError as e:
            self.output(f"{type(e).__name__}: {e}\n", "stderr")
            code = 1
        self.exit(code)

    def exit(self, code: int = 0) -> None:
        self.send_event("exited", {"exitCode": code})
        self.send_event("terminated")

    def need(self) -> DapDebugger:
        if self.dbg is None:
            raise RequestError("no program is launched yet (send launch first)")
        return self.dbg

    # ------------------------------------------------------------------ breakpoints
    def on_setBreakpoints(self, req, args) -> None:
        dbg = self.need()
        source = _get(args, "source", dict, required=True, where="setBreakpoints")
        path = _get(source, "path", str, "", where="setBreakpoints: source")
        wanted = _get(args, "breakpoints", list, None, where="setBreakpoints")
        if wanted is None:
            wanted = [{"line": n} for n in _get(args, "lines", list, [],
                                                where="setBreakpoints")]
        key = os.path.realpath(path) if path else ""
        for n in self.source_bps.pop(key, []):
            dbg.breakpoints.pop(n, None)
            dbg.hit_tests.pop(n, None)
        mine = key and key == os.path.realpath(dbg.path)
        out, numbers = [], []
        for b in wanted:
            if not isinstance(b, dict) or not isinstance(b.get("line"), int) or \
                    isinstance(b.get("line"), bool):
                raise RequestError("setBreakpoints: each breakpoint needs a 'line' number")
            line = b["line"] + (0 if self.lines_start_at1 else 1)
            if not mine:
                out.append({"verified": False, "line": b["line"], "message":
                            f"not in the program being debugged ({dbg.path})"})
                continue
            try:
                line, places = self.line_places(dbg, line)
                n = self.add_breakpoint(dbg, str(line), places, b)
            except (CommandError, RequestError) as e:
                out.append({"verified": False, "line": b["line"], "message": str(e)})
                continue
            numbers.append(n)
            out.append({"id": n, "verified": True, "source": source,
                        "line": line - (0 if self.lines_start_at1 else 1)})
        if key:
            self.source_bps[key] = numbers
        self.respond(req, {"breakpoints": out})

    def line_places(self, dbg: DapDebugger, line: int) -> tuple[int, frozenset]:
        """The core's places for a line; a line without code moves to the next line with
        code in the same function (as editors expect)."""
        try:
            return line, dbg.places(str(line))
        except CommandError:
            for fn in dbg.program.functions.values():
                if fn.line <= line <= fn.end_line:
                    later = sorted({ins.line for ins in fn.code if ins.line > line})
                    if later:
                        return later[0], dbg.places(str(later[0]))
            raise

    def add_breakpoint(self, dbg: DapDebugger, where: str, places, b: dict) -> int:
        condition = _get(b, "condition", str, "", where="breakpoint")
        hit = _get(b, "hitCondition", str, "", where="breakpoint")
        if condition.strip():
            try:
                ast.parse(condition.strip(), mode="eval")
            except SyntaxError:
                raise RequestError(f"cannot parse condition {condition!r}") from None
        test = hit_test(hit) if hit.strip() else None
        n = dbg.new_number()
        dbg.breakpoints[n] = Breakpoint(n, where, places, condition=condition.strip())
        if test is not None:
            dbg.hit_tests[n] = test
        return n

    def on_setFunctionBreakpoints(self, req, args) -> None:
        dbg = self.need()
        wanted = _get(args, "breakpoints", list, required=True,
                      where="setFunctionBreakpoints")
        for n in self.function_bps:
            dbg.breakpoints.pop(n, None)
            dbg.hit_tests.pop(n, None)
        self.function_bps, out = [], []
        for b in wanted:
            name = b.get("name") if isinstance(b, dict) else None
            if not isinstance(name, str):
                raise RequestError("setFunctionBreakpoints: each breakpoint needs a 'name'")
            if name not in dbg.program.functions:
                close = [f for f in dbg.program.functions if f.split(".")[0] == name]
                hint = f" (this program has: {', '.join(dbg.program.functions)})"
                out.append({"verified": False, "message": f"no function {name!r}" +
                            ("" if close else hint)})
                continue
            try:
                n = self.add_breakpoint(dbg, name, dbg.places(name), b)
            except (CommandError, RequestError) as e:
                out.append({"verified": False, "message": str(e)})
                continue
            self.function_bps.append(n)
            fn = dbg.program.functions[name]
            line = fn.code[0].line if fn.code else fn.line
            out.append({"id": n, "verified": True, "line": self.client_line(line),
                        "source": self.source()})
        self.respond(req, {"breakpoints": out})

    def on_setExceptionBreakpoints(self, req, args) -> None:
        self.respond(req, {"breakpoints": []})      # errors always stop the program

    def on_dataBreakpointInfo(self, req, args) -> None:
        dbg = self.need()
        name = _get(args, "name", str, required=True, where="dataBreakpointInfo")
        ref = _get(args, "variablesReference", int, 0, where="dataBreakpointInfo")
        entry = self.refs.get(ref)
        expr = entry.names.get(name, name) if entry is not None else name
        k = entry.frame if entry is not None else 0
        with self.at_frame(k):
            try:
                value = dbg.evaluate(expr)
            except (CommandError, ArithmeticError, ValueError, IndexError, TypeError) as e:
                self.respond(req, {"dataId": None, "description": f"cannot watch {name}: {e}"})
                return
        self.respond(req, {"dataId": expr, "accessTypes": ["write"], "canPersist": True,
                           "description": f"{expr} changes (now {_shown(value)}), "
                                          "forwards or backwards"})

    def on_setDataBreakpoints(self, req, args) -> None:
        dbg = self.need()
        wanted = _get(args, "breakpoints", list, required=True, where="setDataBreakpoints")
        for n in self.data_bps:
            dbg.watches.pop(n, None)
        self.data_bps, out = [], []
        for b in wanted:
            expr = b.get("dataId") if isinstance(b, dict) else None
            if not isinstance(expr, str) or not expr.strip():
                raise RequestError("setDataBreakpoints: each breakpoint needs a 'dataId'")
            with self.at_frame(0):
                try:
                    value = dbg.evaluate(expr)
                except (CommandError, ArithmeticError, ValueError, IndexError,
                        TypeError) as e:
                    out.append({"verified": False, "message": f"cannot watch {expr}: {e}"})
                    continue
            n = dbg.new_number()
            dbg.watches[n] = Watch(n, expr, value)
            self.data_bps.append(n)
            out.append({"id": n, "verified": True})
        self.respond(req, {"breakpoints": out})

    # ------------------------------------------------------------------ moves
    def on_continue(self, req, args) -> None:
        dbg = self.need()
        self.respond(req, {"allThreadsContinued": True})
        if dbg.m.at_end and not dbg.m.grad:
            self.results(dbg.m)
            self.exit(0)
            return
        self.move(lambda: self.travel_serving(1), "continue", d=1)

    def on_reverseContinue(self, req, args) -> None:
        self.need()
        self.respond(req)
        self.move(lambda: self.travel_serving(-1), "continue", d=-1)

    def granular(self, args: dict, where: str) -> bool:
        g = _get(args, "granularity", str, "statement", where=where)
        if g not in ("statement", "line", "instruction"):
            raise RequestError(f"{where}: 'granularity' must be statement, line or "
                               f"instruction, got {g!r}")
        return g == "instruction"

    def on_next(self, req, args) -> None:
        self.step_request(req, args, "next", 1, over=True)

    def on_stepIn(self, req, args) -> None:
        self.step_request(req, args, "stepIn", 1, over=False)

    def on_stepBack(self, req, args) -> None:
        self.step_request(req, args, "stepBack", -1, over=True)

    def step_request(self, req, args, where: str, d: int, over: bool) -> None:
        dbg = self.need()
        one = self.granular(args, where)
        self.respond(req)
        if one:
            self.move(lambda: dbg.travel(d, lambda: False, limit=1), "step", d)
        else:
            self.move(lambda: dbg.line_step(d, over=over, count=1), "step", d)

    def on_stepOut(self, req, args) -> None:
        dbg = self.need()
        self.granular(args, "stepOut")
        self.respond(req)
        self.move(lambda: dbg.finish(1), "step", 1)

    def travel_serving(self, d: int) -> str:
        """A continue that lets requests in (and resumes) until it stops for good."""
        dbg = self.need()
        self.resumable = True
        try:
            while True:
                msg = dbg.travel(d)
                if not (msg.startswith("interrupted") and self.service and
                        not self.pause_requested and not self.gone):
                    return msg
                self.serve_waiting()
        finally:
            self.resumable = False

    def move(self, run, kind: str, d: int) -> None:
        """Run a move, then tell the client where and why it stopped."""
        self.refs.clear()
        self.exception = None
        self.running = True
        try:
            msg = run()
        finally:
            self.running = False
            self.pause_requested = False
            self.service = False
        self.after_move(msg, kind, d)

    def after_move(self, msg: str, kind: str, d: int) -> None:
        dbg = self.need()
        reason, ids, text = "step", None, None
        if m := re.match(r"breakpoint (\d+),", msg):
            n = int(m.group(1))
            reason = "function breakpoint" if n in self.function_bps else "breakpoint"
            ids = [n]
        elif re.match(r"watchpoint (\d+):", msg):      # (each one that changed)
            reason, ids = "data breakpoint", [int(n) for n in re.findall(
                r"^watchpoint (\d+):", msg, re.M)]
        elif msg.startswith("stopped by an error"):
            reason = "exception"
            name, _, message = msg.partition("\n")[2].partition(": ")
            self.exception = (name, message)
            text = f"{name}: {message}"
            self.output(text + "\n", "stderr")
        elif msg.startswith("interrupted"):
            reason = "pause"
        elif msg.startswith("reached the end"):
            reason = "end" if kind == "continue" else "step"
            if kind == "continue" and not self.launch_args.get("stopAtEnd", True) and \
                    not dbg.m.grad:
                self.results(dbg.m)
                self.exit(0)
                return
        elif msg.startswith("reached the start"):
            reason = "start" if kind == "continue" else "step"
        if msg and reason not in ("step", "exception"):
            self.output(msg + "\n")
        self.stopped(reason, msg.split("\n")[0] if msg else None, ids, text)

    def stopped(self, reason: str, description: str | None = None, ids=None,
                text: str | None = None) -> None:
        self.refs.clear()
        body = {"reason": reason, "threadId": 1, "allThreadsStopped": True}
        if description:
            body["description"] = description
        if ids:
            body["hitBreakpointIds"] = ids
        if text:
            body["text"] = text
        self.send_event("stopped", body)

    def results(self, m) -> None:
        """The parameters' final values, as `rvm run` prints them."""
        try:
            values = m.results()
            if "janus" in m.program.cache:
                from ..lang import janus
                if self.need().entry == "main":
                    self.output(janus.show_store(m.program, values) + "\n", "stdout")
                    return
            shown = ", ".join(f"{b.name} = {_shown(v)}" for b, v in zip(m.bindings, values))
            self.output(f"{self.need().entry} finished: {shown}\n")
        except (RvmError, ArithmeticError, ValueError, IndexError, TypeError, KeyError):
            pass

    def on_restart(self, req, args) -> None:
        dbg = self.need()
        config = _get(args, "arguments", dict, None, where="restart")
        if config is not None:          # the latest launch configuration (edited, maybe)
            self.relaunch(req, dbg, config)
            return
        self.respond(req)
        dbg.restart()           # (which takes the watches' values anew)
        loss = (self.launch_args.get("gradient") or {}).get("loss")
        if loss:
            try:
                self.gradient_setup(dbg, loss)
            except RequestError as e:
                self.output(f"{e}\n", "stderr")
        self.start()

    def relaunch(self, req, old: DapDebugger, config: dict) -> None:
        """A restart with a new launch configuration: the program is loaded again with it
        (a configuration that does not load fails the request, and the session goes on as
        it was); the breakpoints and data breakpoints carry over where they still fit."""
        dbg = self.load(config)
        dbg.counter = old.counter
        same_file = os.path.realpath(dbg.path) == os.path.realpath(old.path)
        for n, bp in old.breakpoints.items():
            try:
                if bp.where.isdigit():      # a source line: only in the same file
                    if not same_file:
                        continue
                    places = self.line_places(dbg, int(bp.where))[1]
                else:
                    places = dbg.places(bp.where)
            except CommandError:
                continue
            dbg.breakpoints[n] = attrs.evolve(bp, places=places, hits=0)
            if n in old.hit_tests:
                dbg.hit_tests[n] = old.hit_tests[n]
        for n, w in old.watches.items():
            dbg.watches[n] = attrs.evolve(w, value=dbg.try_eval(w.expr))
        self.source_bps = {k: [n for n in v if n in dbg.breakpoints]
                           for k, v in self.source_bps.items()}
        self.function_bps = [n for n in self.function_bps if n in dbg.breakpoints]
        self.dbg, self.launch_args = dbg, config
        self.respond(req)
        self.start()

    def on_disconnect(self, req, args) -> None:
        self.respond(req)
        self.finished = True

    def on_terminate(self, req, args) -> None:
        self.respond(req)
        self.exit(0)

    # ------------------------------------------------------------------ state
    def on_threads(self, req, args) -> None:
        name = self.dbg.entry if self.dbg is not None else "rvm"
        self.respond(req, {"threads": [{"id": 1, "name": name}]})

    def client_line(self, line: int) -> int:
        return line if self.lines_start_at1 else line - 1

    def source(self) -> dict:
        dbg = self.need()
        out = {"name": os.path.basename(dbg.path), "path": dbg.path}
        lines, why = dbg.source()
        if lines is None:
            out["presentationHint"] = "deemphasize"
            if why:
                out["origin"] = f"source lines not shown: {why}"
        return out

    def on_stackTrace(self, req, args) -> None:
        dbg = self.need()
        start = _get(args, "startFrame", int, 0, where="stackTrace")
        levels = _get(args, "levels", int, 0, where="stackTrace")
        total = len(dbg.m.stack)
        stop = total if levels <= 0 else min(total, start + levels)
        frames = []
        for k in range(max(0, start), stop):
            fr = dbg.frame(k)
            name = fr.fn.name + ("  (backwards)" if fr.dir < 0 else "")
            frames.append({"id": k + 1, "name": name, "source": self.source(),
                           "line": self.client_line(dbg.line(fr)),
                           "column": 1 if self.columns_start_at1 else 0,
                           "instructionPointerReference": f"{fr.fn.name}:*{dbg.index(fr)}"})
        self.respond(req, {"stackFrames": frames, "totalFrames": total})

    def frame_number(self, frame_id, where: str) -> int:
        dbg = self.need()
        if frame_id is None:
            return 0
        if not isinstance(frame_id, int) or isinstance(frame_id, bool) or \
                not 1 <= frame_id <= len(dbg.m.stack):
            raise RequestError(f"{where}: no frame {json.dumps(frame_id)[:40]} (the stack "
                               f"has frames 1..{len(dbg.m.stack)})")
        return frame_id - 1

    @contextlib.contextmanager
    def at_frame(self, k: int):
        dbg = self.need()
        old, dbg.selected = dbg.selected, k
        try:
            yield
        finally:
            dbg.selected = old

    def ref(self, frame: int, children) -> int:
        """A variablesReference for children(start, count) -> variables, valid until the
        next move."""
        n = len(self.refs) + 1
        self.refs[n] = types.SimpleNamespace(frame=frame, children=children, names={})
        return n

    def on_scopes(self, req, args) -> None:
        dbg = self.need()
        k = self.frame_number(args.get("frameId"), "scopes")
        fr = dbg.frame(k)
        line = dbg.line(fr)
        params = set(fr.fn.params)
        named = {}
        for s in fr.fn.symbols:
            if s.first <= line <= s.last:
                base = s.name.rsplit(".", 1)[0] if s.name.endswith((".real", ".imag")) \
                    else s.name
                named.setdefault(base, s)
        args_, locals_ = [n for n, s in named.items() if s.regs[0] in params], \
            [n for n, s in named.items() if s.regs[0] not in params]
        scopes = []
        if named:
            scopes.append(self.scope("Arguments", k, args_, "arguments"))
            scopes.append(self.scope("Locals", k, locals_, "locals"))
        scopes.append({"name": "Registers", "presentationHint": "registers",
                       "variablesReference": self.ref(k, self.registers(k)),
                       "expensive": bool(named)})
        if dbg.m.grad:
            floats = [n for n, s in named.items() if s.regs[0].cls == isa.FLOAT or
                      (len(s.regs) > 1 and s.dtype == isa.FLOAT)]
            scopes.append(self.scope("Gradients", k, floats, None, shadow=True))
        scopes.append({"name": "Machine", "variablesReference": self.ref(k, self.machine(k)),
                       "expensive": False})
        self.respond(req, {"scopes": scopes})

    def scope(self, title: str, k: int, names: list[str], hint, shadow=False) -> dict:
        n = self.ref(k, None)
        entry = self.refs[n]
        entry.children = lambda start, count: self.named(entry, names, shadow)
        out = {"name": title, "variablesReference": n, "namedVariables": len(names),
               "expensive": False}
        if hint:
            out["presentationHint"] = hint
        return out

    def named(self, entry, names: list[str], shadow: bool) -> list[dict]:
        dbg = self.need()
        out = []
        stacks = self.janus_stacks(dbg.frame(entry.frame).fn)
        with self.at_frame(entry.frame):
            for name in names:
                try:
                    value = dbg.lookup(name, shadow=shadow)
                except (CommandError, ArithmeticError, ValueError, IndexError, TypeError):
                    value = None
                expr = f"grad[{name}]" if shadow else name
                entry.names[name] = expr
                out.append(self.variable(entry.frame, name, value, expr,
                                         stack=name in stacks))
        return out

    def janus_stacks(self, fn) -> set[str]:
        """The names of Janus stacks in fn (a stack is an int array: its size, then the
        elements from the bottom)."""
        info = self.need().program.cache.get("janus")
        if not info:
            return set()
        decls = info["main"] if fn.name == "main" else info["procedures"].get(fn.name, [])
        declared = {d.name: d.type for d in decls}
        return {s.name for s in fn.symbols
                if len(s.regs) == 2 and declared.get(s.name, "stack") == "stack"}

    def variable(self, k: int, name: str, value, expr: str | None, stack=False) -> dict:
        value = _plain(value)
        var = {"name": name, "value": _shown(value), "variablesReference": 0}
        if expr:
            var["evaluateName"] = expr
        if isinstance(value, np.ndarray):
            if stack and value.ndim == 1 and len(value) and 0 <= value[0] < len(value):
                items = [int(x) for x in value[1:int(value[0]) + 1]][::-1]     # top first
                var["value"] = "<" + ", ".join(map(str, items)) + "]" if items else "nil"
                var["type"] = "stack"
                if items:
                    var["variablesReference"] = self.ref(k, self.elements(
                        k, np.array(items), None, labels=["top"] + [
                            f"[{j}]" for j in range(1, len(items))]))
                    var["indexedVariables"] = len(items)
                return var
            var["type"] = f"{value.dtype}[{', '.join(map(str, value.shape))}]"
            if value.size:
                var["variablesReference"] = self.ref(k, self.elements(k, value, expr))
                var["indexedVariables"] = value.shape[0]
        elif value is not None:
            var["type"] = type(value).__name__
        return var

    def elements(self, k: int, array: np.ndarray, expr: str | None, labels=None):
        def children(start: int, count: int) -> list[dict]:
            stop = len(array) if count <= 0 else min(len(array), start + count)
            stop = min(stop, start + PAGE) if count <= 0 else stop
            out = []
            for j in range(max(0, start), stop):
                name = labels[j] if labels else f"[{j}]"
                sub = f"{expr}[{j}]" if expr and not expr.startswith("grad[") else None
                out.append(self.variable(k, name, array[j], sub))
            return out
        return children

    def registers(self, k: int):
        def children(start: int, count: int) -> list[dict]:
            dbg = self.need()
            fn = dbg.frame(k).fn
            out = []
            for reg in sorted(fn.registers, key=lambda r: (r.cls != isa.INT, r.n)):
                value = dbg.register_value(k, fn.slot(reg))
                var = self.variable(k, str(reg), value, str(reg))
                if dbg.m.grad and reg.cls == isa.FLOAT:
                    var["value"] += f"   (grad {dbg.register_value(k, fn.slot(reg), True)!r})"
                out.append(var)
            return out
        return children

    def machine(self, k: int):
        def children(start: int, count: int) -> list[dict]:
            dbg = self.need()
            fr = dbg.frame(k)
            i = dbg.index(fr)
            rows = [("step", str(dbg.m.steps)),
                    ("instruction", f"{i}: {format_at(fr.fn, i)}"),
                    ("direction", "forwards" if fr.dir > 0 else "backwards"),
                    ("heap cells in use", str(dbg.m.top)),
                    ("gradient mode", "on" if dbg.m.grad else "off")]
            return [{"name": a, "value": b, "variablesReference": 0} for a, b in rows]
        return children

    def on_variables(self, req, args) -> None:
        self.need()
        n = _get(args, "variablesReference", int, required=True, where="variables")
        entry = self.refs.get(n)
        if entry is None:
            raise RequestError(f"variables: no variables reference {n} (references last "
                               "until the program moves)")
        start = _get(args, "start", int, 0, where="variables")
        count = _get(args, "count", int, 0, where="variables")
        self.respond(req, {"variables": entry.children(start, count)})

    def on_evaluate(self, req, args) -> None:
        dbg = self.need()
        text = _get(args, "expression", str, required=True, where="evaluate")
        k = self.frame_number(args.get("frameId"), "evaluate")
        context = args.get("context")
        with self.at_frame(k):
            try:
                value = dbg.evaluate(text)
            except CommandError as e:
                if context == "repl" and self.is_command(text):
                    self.command(req, text, k)
                    return
                raise RequestError(str(e)) from None
            except (ArithmeticError, ValueError, IndexError, TypeError) as e:
                raise RequestError(f"{text}: {e}") from None
        var = self.variable(k, text, value, text)
        self.respond(req, {"result": var["value"], "type": var.get("type", ""),
                           "variablesReference": var["variablesReference"],
                           "indexedVariables": var.get("indexedVariables", 0)})

    def is_command(self, text: str) -> bool:
        head = text.split()[0] if text.split() else ""
        return ALIASES.get(head, head).split()[0] in COMMANDS

    def command(self, req, text: str, k: int) -> None:
        """A debugger command typed in the editor's console (`info breakpoints`,
        `goto 120`, `grad on out`, `x 0 4`): its text; a move also stops the editor."""
        dbg = self.need()
        head = text.split()[0]
        name = ALIASES.get(head, head).split()[0]
        if name == "quit":
            raise RequestError("quit: use the editor's Stop button")
        if name in MOVING:
            self.refs.clear()
            self.running = True
            try:
                out = dbg.execute(text)
            finally:
                self.running = False
                self.pause_requested = False
            self.respond(req, {"result": out, "variablesReference": 0})
            self.stopped("goto" if name in ("goto", "run") else "step")
            return
        dbg.selected = k
        out = dbg.execute(text)
        self.respond(req, {"result": out, "variablesReference": 0})

    def on_exceptionInfo(self, req, args) -> None:
        if self.exception is None:
            raise RequestError("exceptionInfo: the program did not stop at an error")
        name, message = self.exception
        self.respond(req, {"exceptionId": name, "description": message,
                           "breakMode": "always"})


MOVE_REQUESTS = {"continue", "reverseContinue", "next", "stepIn", "stepOut", "stepBack"}


def derived(program: Program, entry: str, transform: str | None) -> tuple[Program, str]:
    """The program to debug: the program itself, its inverse (its entry run backwards from
    its outputs), or the tangent or adjoint program of the entry."""
    if transform is None:
        return program, entry
    if transform == "inverse":
        from ..core.inverse import inverse_function
        name = f"{entry}.inverse"
        inverse = attrs.evolve(inverse_function(program.functions[entry]), name=name)
        kept = {k: v for k, v in program.cache.items() if isinstance(k, str)}
        return Program({**program.functions, name: inverse}, program.source, kept,
                       program.engine), name
    from ..ad import transforms
    return getattr(transforms, transform)(program, entry)


# ---------------------------------------------------------------------- serving
def serve_stdio(load) -> None:
    """One session over stdin and stdout. Anything else written to stdout while it runs
    (a stray print) becomes an output event instead of corrupting the protocol. `load`
    reads a program as the CLI does: (path, entry, argument texts) -> (program, entry,
    argument values)."""
    sys.stdout.flush()
    wfile = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # file descriptor 1 now writes to stderr
    # a reader of its own: the reader thread may still wait on it when the process ends
    rfile = os.fdopen(os.dup(0), "rb")
    session = Session(Transport(rfile, wfile), load)
    saved, sys.stdout = sys.stdout, session.stdout
    try:
        session.run()
    finally:
        sys.stdout = saved
        with contextlib.suppress(OSError):
            wfile.close()


def serve_tcp(port: int, load, host: str = "127.0.0.1", once: bool = False) -> None:
    """Sessions over TCP on the loopback address, one connection at a time."""
    with socket.create_server((host, port)) as server:
        print(f"rvm dap: listening on {host}:{server.getsockname()[1]}", file=sys.stderr,
              flush=True)
        while True:
            conn, _ = server.accept()
            with conn:
                rfile, wfile = conn.makefile("rb"), conn.makefile("wb")
                Session(Transport(rfile, wfile), load).run()
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            if once:
                return
