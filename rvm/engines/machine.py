"""The machine: frames with typed register files, a LIFO heap, and a control stack whose
frames each remember their direction. `step()` and `back()` move exactly one instruction;
nothing is recorded, because the previous state is recomputed by the inverse instruction.

Direction: the machine moves forwards (D = +1, `step`) or backwards (D = -1, `back`). A frame
runs its function forwards when ``frame.dir * D > 0``; a frame pushed by UNCALL has dir = -1,
so it runs its function backwards while the machine moves forwards.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import threading
import time

import numpy as np

from ..core import isa
from ..core.errors import InvertibilityError, MachineError, RvmError, UsageError
from ..core.inverse import inverse_function
from ..core.program import INT64_MAX, Function, Program
from . import closures, templates
from .arguments import (
    OPTIONS,
    batch_columns,
    bind,
    call_kind,
    coercers,
    exact_columns,
    first_row,
    read_array,
    scalar,
)
from .arrays import INTERLEAVED, Helpers
from .closures import END
from .explain import explain, explain_locals
from .templates import LAST, NO_STOP, NOW, STATE, STOP, Fault, Limit, show_value

MIN_NORMAL = 2.2250738585072014e-308


class Frame:
    """One activation. While a callee runs, its caller sits at the CALL (state 2 * site)
    and the argument registers are moved into the callee (zero in the caller), so every
    machine state has one representation whichever direction it was reached from."""

    __slots__ = ("G", "R", "dir", "fn", "inverse", "links", "site", "state")

    def __init__(self, fn: Function, dir: int, state: int):
        self.fn, self.dir, self.state = fn, dir, state
        self.R = [0] * fn.n_int + [0.0] * fn.n_float
        self.G = None
        self.site, self.inverse = -1, False       # caller's CALL index; pushed by UNCALL?
        self.links: list[tuple[int, int]] = []   # (caller slot, callee slot) per parameter

    def index(self, e: int) -> int:
        """The instruction the frame is at, moving in effective direction e."""
        s = self.state
        return s >> 1 if e > 0 or s & 1 else (s >> 1) - 1


_AGAIN = object()     # (Machine._failed_natively: run the native code again)


class Machine(Helpers):
    """Runs one program. `call`/`uncall` run a function to completion; `enter` then
    `step`/`back`/`run` move through it one instruction at a time (the debugger's way)."""

    default_progress = None     # the CLI sets a status line here when stderr is a terminal

    def __init__(self, program: Program, *, max_steps: int = 100_000_000,
                 heap_limit: int = 1 << 24, tol: float = 1e-8, max_depth: int = 10_000,
                 grad: bool = False, engine: str | None = None, checks: bool = True):
        if not isinstance(program, Program):
            raise TypeError("Machine needs a Program (from rvm.load, rvm.assemble or "
                            f"rvm.loads), got {type(program).__name__}")
        check_limits(max_steps=max_steps, heap_limit=heap_limit, tol=tol, max_depth=max_depth)
        self.program, self.max_steps, self.heap_limit = program, max_steps, heap_limit
        self.budget = max_steps            # steps left in a compiled run (shared by calls)
        self.frame_cells = 0               # registers of the live frames (memory, with the heap)
        # compiled code keeps no frames: it runs a root function only where every chain of
        # calls under it fits max_depth, and keeps its heap within heap_limit less the
        # registers of the largest such chain (reserve: those past the root's), so that
        # none of the interpreter's frame checks could fail (see fits, Program.deepest);
        # where they might, the interpreter runs and decides
        self.reserve, self.too_deep, self.compiling = 0, False, False
        self.live = 1                      # frames live in a compiled run (recursive programs)
        self._made_before = False          # a record held a value not finite (see _late)
        self.engine = resolve_engine(engine if engine is not None else program.engine)
        self.out = None                    # where output statements print (None: stdout)
        # a compiled run's output, printed when the run succeeds (see run), and native
        # code's output buffer (cells; 0: the program has no output statements)
        self.pending: list[str] = []
        self.said_cells = SAID_CELLS if printing(program) else 0
        self.checks = checks
        self._compiled = None
        self._compiled_functions = None
        self.tol, self.max_depth = tol, max_depth
        self.stack: list[Frame] = []
        self.steps = 0                    # the step counter ("time")
        self.top = self.cap = self.entry_top = 0
        self.grad = False
        self._buf = self._gbuf = bytearray()
        self.hi = self.hf = self.hg = memoryview(self._buf)
        self._codes: dict = {}
        self._derived: dict = {}    # function -> the slots of its derivatives (_tracked)
        self.dscale = 0.0           # the largest magnitude a derivative held (_tracked)
        self._fast: dict = {}            # (function, backward, argument types) -> direct call
        self.progress = Machine.default_progress   # progress(steps, direction), long runs
        self.wants_gradient = False     # a forward run before a gradient (native code for
        # both is then compiled at once)
        self._grow(min(64, heap_limit))
        if grad:
            self.set_grad(True)

    # ------------------------------------------------------------------ heap
    def _grow(self, need: int, exact: bool = False) -> None:
        """Room for `need` heap cells: the heap doubled (at least), or (exact) just that
        large (room for a checkpoint: Machine.run)."""
        if need > self.heap_room(self.compiling):
            raise Limit(f"heap limit of {self.heap_limit} cells exceeded (asked for {need} "
                        f"heap cells, with {self.frame_cells} registers in live frames); "
                        "raise heap_limit / --heap-limit")
        # (a little past the cells asked for: native code's checkpoint records go above
        # the top, and a heap just large enough for a call's arrays had no room for them,
        # so a run that failed was run once more: Machine._record_room)
        cap = need if exact else min(max(need + SLACK, 2 * self.cap, 64), self.heap_limit)
        try:
            buf, gbuf = bytearray(cap * 8), bytearray(cap * 8)
        except MemoryError:
            raise Limit(f"out of memory: a heap of {cap} cells ({16 * cap / 2**30:.1f} GiB "
                        "with gradient shadows) could not be allocated (asked for "
                        f"{need} heap cells); lower heap_limit / --heap-limit to fail "
                        "sooner, or use less memory") from None
        self._buf = buf
        self._buf[: len(self.hi) * 8] = self.hi.cast("B")
        self.hi, self.hf = memoryview(self._buf).cast("q"), memoryview(self._buf).cast("d")
        gbuf[: len(self.hg) * 8] = self.hg.cast("B")
        self._gbuf, self.hg = gbuf, memoryview(gbuf).cast("d")
        self.cap = cap
        if exact:
            self._roomy = self._buf       # (one such run again per heap)

    def is_zero_cell(self, c: int) -> bool:
        """A cell counts as zero if its bits are zero, or it holds a float residue within
        tolerance (a normal float: small integers look like denormals and are refused)."""
        if self.hi[c] == 0:
            return True
        v = abs(self.hf[c])
        return MIN_NORMAL <= v <= self.tol

    def _derived_residue(self, c: int) -> bool:
        """Is cell c a derivative's (in a derived program on the interleaved heap, a cell
        not at a multiple of 2^d: arrays.INTERLEAVED) holding a float zero or a residue
        within tol times the largest magnitude (at least 1) a derivative has held
        (dscale, which array instructions writing derivatives raise too:
        arrays.Helpers._noted), as a derived register's zero test scales?"""
        depth = self.program.cache.get(INTERLEAVED)
        if not depth or not c & ((1 << depth) - 1):
            return False
        v = abs(self.hf[c])         # (a float: -0.0 is a zero, not the int -2^63)
        return v == 0.0 or MIN_NORMAL <= v <= self.tol * max(1.0, self.dscale)

    def alloc(self, n: int) -> int:
        if n < 0:
            raise Fault(f"ALLOC of a negative number of cells ({n})")
        base = self.top
        # (heap_room(self.compiling), written out: PUSH and ALLOC are hot paths)
        if base + n > self.cap or base + n + self.frame_cells + \
                self.compiling * self.reserve > self.heap_limit:
            self._grow(base + n)        # (which refuses what the limit does not allow)
        self.top = base + n
        return base

    def free(self, d: int, n: int) -> None:
        if n < 0 or d != self.top - n:
            raise Fault(f"FREE of {n} cells at {d}, but the top block of the heap is "
                        f"{max(self.top - n, 0)}..{self.top - 1}: blocks are freed LIFO")
        for c in range(d, self.top):
            if not self.is_zero_cell(c) and not self._derived_residue(c):
                raise Fault(f"FREE of a cell that is not zero: heap[{c}] = {self.hi[c]} "
                            f"(as float {self.hf[c]!r}); freeing would lose it")
        for c in range(d, self.top):
            self.hi[c] = 0
            self.hg[c] = 0.0          # a freed cell's gradient is dropped (docs/gradients.md)
        self.top = d

    def push(self, v) -> None:
        if self.top >= self.cap or self.top + 1 + self.frame_cells + \
                self.compiling * self.reserve > self.heap_limit:       # (as ALLOC's)
            self._grow(self.top + 1)
        if type(v) is float:
            self.hf[self.top] = v
        else:
            self.hi[self.top] = v
        self.top += 1

    def pop(self, is_float: bool):
        if self.top == 0:
            raise Fault("POP from an empty heap")
        self.top -= 1
        v = self.hf[self.top] if is_float else self.hi[self.top]
        self.hi[self.top] = 0
        return v

    def gpush(self, v: float, g: float) -> None:
        self.push(v)
        self.hg[self.top - 1] = g

    def gpop(self, is_float: bool):
        g = self.hg[self.top - 1] if self.top else 0.0
        v = self.pop(is_float)
        self.hg[self.top] = 0.0
        return v, g

    def write_cells(self, base: int, data: bytes) -> None:
        self._buf[8 * base:8 * base + len(data)] = data

    def read_cells(self, base: int, n: int, shadows: bool = False) -> bytes:
        buf = self._gbuf if shadows else self._buf
        return bytes(buf[8 * base:8 * (base + n)])

    def cells(self, base: int, n: int, dtype: str, shadows: bool = False):
        """A numpy view (little-endian int64 '<i8' or float64 '<f8') of n heap cells (or
        their shadows): valid until the heap grows."""
        return np.frombuffer(self._gbuf if shadows else self._buf, dtype=dtype, count=n,
                             offset=8 * base)

    def _clear(self, buf: bytearray) -> None:
        """Zero the cells below the heap top: every cell above it is zero already (the
        heap's invariant between instructions: ALLOC takes zero cells, FREE and POP leave
        the cells they give back zero, shadows included, and nothing else writes above
        the top)."""
        np.frombuffer(buf, np.uint8, 8 * self.top)[:] = 0

    def clear_shadows(self) -> None:
        """Zero every gradient shadow (registers of all frames and heap cells)."""
        self._clear(self._gbuf)
        for fr in self.stack:
            if fr.G is not None:
                fr.G[:] = [0.0] * len(fr.G)

    # ------------------------------------------------------------------ code
    def set_grad(self, on: bool) -> None:
        """Switch gradient mode: float instructions then also move gradient shadows."""
        self.grad = on
        for fr in self.stack:
            if on and fr.G is None:
                fr.G = [0.0] * len(fr.R)

    def _code(self, fn: Function, e: int):
        mode = ("g" if self.grad else "") + ("fw" if e > 0 else "bw")
        key = (fn.name, mode)
        code = self._codes.get(key)
        if code is None:
            make = closures.factory(self.program, fn, mode)
            code = make(self, Fault, templates.wrap, self._zero, templates.sign,
                        templates.dpow_db, templates.MATH)
            code = self._tracked(fn, code, e)
            self._codes[key] = code
        return code

    def _derivatives(self, fn: Function) -> frozenset:
        """The slots of fn's registers that hold derivatives (fn a function of a derived
        program: rvm.engines.compiled.derived_registers), else empty."""
        slots = self._derived.get(fn.name)
        if slots is None:
            from .compiled import derived_registers
            slots = self._derived[fn.name] = frozenset(
                fn.slot(r) for r in derived_registers(self.program, fn) or ())
        return slots

    def _tracked(self, fn: Function, code: list, e: int) -> list:
        """fn's closures (direction e), those of its instructions that write a derivative
        followed by noting its magnitude in dscale, the largest so far in the run (a derived
        ancilla's zero test scales with it: compiled.derived_registers). A call's
        arguments are noted when it returns (_pop)."""
        slots = self._derivatives(fn)
        if not slots:
            return code
        out = list(code)
        for s in range(len(code)):
            i = s >> 1 if e > 0 else (s >> 1) - 1      # the instruction the state runs
            if s & 1 or not 0 <= i < len(fn.code) or fn.code[i].op in isa.CALLS:
                continue
            ks = [fn.slot(r) for r in fn.code[i].written if fn.slot(r) in slots]
            if ks:
                out[s] = self._noting(code[s], ks)
        return out

    def _noting(self, run, ks: list):
        def noted(R, G):
            sig = run(R, G)
            for k in ks:
                if abs(R[k]) > self.dscale:
                    self.dscale = abs(R[k])
            return sig
        return noted

    def _zero(self, v: float) -> bool:
        return abs(v) <= self.tol

    # ------------------------------------------------------------------ frames
    def _frame_limits(self, live: int, size: int, name: str) -> None:
        """Refuse a frame of `size` registers (of function `name`) on `live` frames past
        max_depth, or its registers and the heap past heap_limit."""
        if live >= self.max_depth:
            raise Limit(f"call depth limit of {self.max_depth} frames exceeded "
                        "(unbounded recursion?)")
        if self.frame_cells + size + self.top > self.heap_limit:
            raise Limit(f"memory limit of {self.heap_limit} cells (heap and registers) "
                        f"exceeded by a frame of {name} ({size} registers, "
                        f"{live} frames live); raise heap_limit / --heap-limit")

    def framed(self, size: int, name: str) -> None:
        """A call in a compiled run of a recursive program (the python engine: compiled
        code keeps no frames): the interpreter's frame limits, then the frame counted
        (`unframed` when it returns; a failure is reported by the interpreter's run)."""
        self._frame_limits(self.live, size, name)
        self.live += 1
        self.frame_cells += size

    def unframed(self, size: int) -> None:
        self.live -= 1
        self.frame_cells -= size

    def _new_frame(self, fn: Function, dir: int, D: int) -> Frame:
        size = fn.n_int + fn.n_float
        self._frame_limits(len(self.stack), size, fn.name)
        fr = Frame(fn, dir, 0 if dir * D > 0 else 2 * len(fn.code))
        self.frame_cells += size
        if self.grad:
            fr.G = [0.0] * len(fr.R)
        return fr

    def _push(self, caller: Frame, e: int, D: int) -> None:
        i = caller.index(e)
        ins = caller.fn.code[i]
        callee = self.program.functions[ins.args[0].name]
        fr = self._new_frame(callee, caller.dir * (1 if ins.op == "CALL" else -1), D)
        fr.site, fr.inverse = i, ins.op == "UNCALL"
        fr.links = [(caller.fn.slot(a), callee.slot(p))
                    for a, p in zip(ins.args[1:], callee.params)]
        _move(caller, fr, fr.links, 0, 1)
        caller.state = 2 * i
        self.stack.append(fr)

    def check_locals(self, fr: Frame) -> None:
        """Locals must be zero when a frame is left (floats within tol; residue cleared).
        Leaving the root frame, the heap must also be back to the argument arrays: a block
        left allocated would be discarded with the machine, and its values lost."""
        fn, bad = fr.fn, {}
        if fr is self.stack[0] and self.top != self.entry_top:
            at_end = fr.state != 0
            raise InvertibilityError(
                f"heap cells {self.entry_top}..{self.top - 1} are still allocated (or pushed) "
                f"when {fn.name} {'ends' if at_end else 'returns to its start'}; FREE (or POP) "
                "them before the function is left, or their values would be lost",
                fn.name, None, fn.end_line if at_end else fn.line, self.program.source)
        R = fr.R
        derived = self._derivatives(fn)
        for r, k in fn.local_slots:
            v = R[k]
            if v != 0 and not self._residue(fn, k, v, derived):
                bad[str(r)] = v
        if bad:
            at_end = fr.state != 0
            line = fn.end_line if at_end else fn.line
            detail = (f"local register{'s' if len(bad) > 1 else ''} {', '.join(bad)} not "
                      f"restored to zero when leaving the frame at its "
                      f"{'end' if at_end else 'start'}; the values would be lost")
            err = InvertibilityError(explain_locals(fn, line, bad) or detail, fn.name, None,
                                     line, self.program.source, bad)
            err.detail = detail
            raise err
        G = fr.G
        for r, k in fn.local_slots:
            R[k] = 0 if r.cls == isa.INT else 0.0
            if G is not None:
                G[k] = 0.0                # a local's gradient is dropped with it

    def _residue(self, fn: Function, k: int, v, derived=None) -> bool:
        """Is v, in fn's register slot k, a float's residue a local may be left with
        (within tol, or for a derivative within tol times the largest one)?"""
        if type(v) is not float:
            return False
        derived = self._derivatives(fn) if derived is None else derived
        return abs(v) <= self.tol or (k in derived and abs(v) <= self.tol * self.dscale)

    def _pop(self, e: int) -> None:
        """Leave the top frame, which reached its end (e > 0) or start (e < 0)."""
        fr = self.stack[-1]
        self.check_locals(fr)
        self.stack.pop()
        self.frame_cells -= len(fr.R)
        caller = self.stack[-1]
        _move(fr, caller, fr.links, 1, 0)
        derived = self._derivatives(caller.fn)
        for k, _ in fr.links if derived else ():    # the derivatives the call was given
            if k in derived and abs(caller.R[k]) > self.dscale:
                self.dscale = abs(caller.R[k])
        completed = (e > 0) != fr.inverse     # did the CALL/UNCALL run to completion?
        caller.state = 2 * fr.site + (2 if completed else 0)

    # ------------------------------------------------------------------ stepping
    def _move(self, D: int, limit: int) -> int:
        """Take up to `limit` steps in direction D; stop early at the root frame's end."""
        taken, stack = 0, self.stack
        try:
            while taken < limit:
                fr = stack[-1]
                e = fr.dir * D
                code, R, G, s = self._code(fr.fn, e), fr.R, fr.G, fr.state
                n, k, sig = limit - taken, 0, 0
                try:
                    while k < n:
                        sig = code[s](R, G)
                        if sig < 0:
                            break
                        s = sig
                        k += 1
                finally:
                    fr.state = s
                    taken += k
                if sig >= 0:
                    break
                if sig == END:
                    if len(stack) == 1:
                        break
                    self._pop(e)
                else:
                    self._push(fr, e, D)
                taken += 1
        except (Fault, ArithmeticError, ValueError) as exc:
            raise self._failed(exc, D) from None
        finally:
            self.steps += D * taken
        if len(stack) == 1 and self.at_boundary(D):
            self._settle()
        return taken

    def _failed(self, exc: Exception, D: int) -> MachineError:
        """The error for a step in direction D that raised exc (a check, an arithmetic
        error), at the instruction the top frame stands at."""
        if isinstance(exc, Fault):
            return self._located(exc, D, InvertibilityError if type(exc) is Fault
                                 else MachineError)
        return self._located(exc, D, MachineError, "arithmetic error: ")

    def _located(self, exc: Exception, D: int, kind, prefix: str = "") -> MachineError:
        fr = self.stack[-1]
        i = fr.index(fr.dir * D)
        ins = fr.fn.code[i] if 0 <= i < len(fr.fn.code) else None
        detail = f"{prefix}{exc}"
        if ins is not None:
            detail += f"\n    at: {i}  {ins}"
        line = ins.line if ins else 0
        msg = explain(fr.fn, ins, line, self.program.source, fr.R, str(exc)) or detail
        err = kind(msg, fr.fn.name, i, line, self.program.source)
        err.detail = detail            # the register-level account (rvm run --verbose)
        err.limit = isinstance(exc, Limit)     # (a memory, depth or step limit)
        return err

    def entered(self) -> None:
        """Refuse to move or read results before a function is entered."""
        if not self.stack:
            raise MachineError("no function entered yet: call enter(name, *args) first "
                               "(or call(name, *args) to run one)")

    def walk(self, D: int, limit: int, bad) -> int | None:
        """Up to `limit` steps in direction D, one at a time, each followed by bad(frame,
        i) (the frame that took it, the index of its instruction): stop after the first
        it is true for, and return that index (None: it never was, or the pass ended).
        The steps are _move's, which takes a call and a return; the others run here
        without its bookkeeping per call, two to three times faster (the search for a
        gradient that stopped being finite steps whole passes:
        rvm.ad.gradient.not_finite); a step that fails raises _move's error, the machine
        left as _move leaves it (a step may change registers before it fails: it is not
        run again)."""
        self.entered()
        stack, taken = self.stack, 0
        while taken < limit:
            fr = stack[-1]
            e = fr.dir * D
            code, R, G = self._code(fr.fn, e), fr.R, fr.G
            while taken < limit:
                try:
                    sig = code[fr.state](R, G)
                except (Fault, ArithmeticError, ValueError) as exc:
                    raise self._failed(exc, D) from None    # (as _move reports it)
                if sig < 0:
                    break
                i = fr.index(e)
                fr.state = sig
                self.steps += D
                taken += 1
                if self.at_boundary(D):
                    self._settle()
                if bad(fr, i):
                    return i
            if taken >= limit:
                break
            i = fr.index(e)
            if self._move(D, 1) != 1:
                break
            taken += 1
            if bad(fr, i):
                return i
        return None

    def step(self) -> bool:
        """Execute one instruction forwards. False if already at the end."""
        self.entered()
        return self._move(1, 1) == 1

    def back(self) -> bool:
        """Undo one instruction (run its inverse). False if already at the start."""
        self.entered()
        return self._move(-1, 1) == 1

    def _settle(self) -> None:
        """The root frame, stepped to its end or start: its float locals' residues
        (within tol) cleared, as leaving a frame clears them. Compiled code starts every
        pass with its locals at zero and leaves them so, and the next pass (a run back,
        a gradient pass) is then the same on every engine."""
        fr = self.stack[0]
        derived = self._derivatives(fr.fn)
        for _, k in fr.fn.local_slots:
            if fr.R[k] != 0 and self._residue(fr.fn, k, fr.R[k], derived):
                fr.R[k] = 0.0

    def run(self, direction: int = 1, max_steps: int | None = None,
            heap: tuple | None = None) -> int:
        """Run to the end (direction +1) or back to the start (-1); return steps taken
        (0 when the compiled engine ran the whole pass: it does not count steps). heap:
        the heap as it is now, where the caller has it (saved()[1]: a search that runs
        a pass again from one state), so that a compiled run need not copy it to undo
        its writes where it fails."""
        self.entered()
        if self.at_boundary(-direction):    # a whole pass: the derivatives' magnitudes
            self.dscale = 0.0               # are its own (compiled.derived_registers)
        if self.engine != "interp" and self.at_boundary(-direction) and max_steps is None \
                and self.fits():
            engine = self.tier()
            root = self.stack[0]
            if engine == "native" and \
                    not all(map(math.isfinite, root.R[root.fn.n_int:])):
                # native code refuses a value that is not finite where it is compared or
                # returned (it cannot tell one the program made, which the interpreter
                # refuses where it is made, from one it was given); the python engine
                # tests what the program makes, as the interpreter does
                engine = "python"
            if self._compiled is None or self._compiled.native != (engine == "native"):
                from .compiled import compiled
                self._compiled = compiled(self.program, self.checks,
                                          native=engine == "native")
                self._compiled_functions = None
            heap = self._heap_state() if heap is None else heap

            def undo():
                """The heap as before the run (the cells above the top zero)."""
                self._restore_heap(heap)
            if self._compiled.native:
                from .llvm import interrupts
                interrupts()            # Ctrl-C stops native code (KeyboardInterrupt)
            while True:
                try:
                    self.pending.clear()
                    self.compiling = True
                    try:
                        self._compiled.run(self, direction)
                    finally:
                        self.compiling = False
                    self.speak()
                    return 0
                except RvmError as e:
                    # (a failed run's output is dropped: the interpreter's run of the
                    # pass prints it, up to where it fails)
                    self.pending.clear()
                    began = self._root_state()
                    try:
                        taken = self._failed_natively(e, direction, undo)
                    except InvertibilityError as failed:
                        if not self._scaled_check(failed):
                            raise
                        # a derived ancilla's check scales with the largest magnitude the
                        # derivatives held in the pass so far (compiled.derived_registers),
                        # which native code does not keep, nor does an interpreter that
                        # steps on from a place midway: it runs the whole pass, and decides
                        self._restore(began)
                        undo()
                        break
                    if taken is _AGAIN:
                        continue
                    if taken is not None:
                        return taken
                    break
                except Exception as exc:    # no native code could be made for it
                    self.pending.clear()
                    undo()
                    if not self._compiled.native:
                        raise
                    import warnings
                    what = self.program.source or "this program"
                    warnings.warn(f"the native engine could not compile {what} "
                                  f"({type(exc).__name__}); using the python engine",
                                  stacklevel=2)
                    self.program.cache["native_failed"] = True
                    self.engine, self._compiled = "python", None
                    return self.run(direction)
                except BaseException:       # KeyboardInterrupt: the machine as before
                    self.pending.clear()
                    undo()
                    raise
        budget = self.max_steps if max_steps is None else max_steps
        if self.progress is None:
            taken = self._move(direction, budget)
        else:                 # in chunks, telling the progress callback after a second
            taken, start = 0, time.monotonic()
            while taken < budget:
                chunk = min(PROGRESS_CHUNK, budget - taken)
                moved = self._move(direction, chunk)
                taken += moved
                if moved < chunk:
                    break
                if time.monotonic() - start > 1.0:
                    self.progress(taken, direction)
        if taken >= budget and not self.at_boundary(direction):
            raise self._out_of_steps(budget, direction)
        return taken

    def _scaled_check(self, e: InvertibilityError) -> bool:
        """Did e fail a check whose test scales with the derivatives' magnitudes so far:
        a derived register's (rvm.engines.compiled.derived_registers), or a FREE's of a
        derived program's heap (_derived_residue)?"""
        from .compiled import derived_registers
        fn = self.program.functions.get(e.function)
        if fn is None or e.index is None or not 0 <= e.index < len(fn.code):
            return False
        ins = fn.code[e.index]
        if ins.op == "FREE" and self.program.cache.get(INTERLEAVED):
            return True
        derived = derived_registers(self.program, fn) or ()
        return any(a in derived for a in ins.args)

    def _failed_natively(self, e: RvmError, direction: int, undo) -> int | object | None:
        """After a native run failed with e: run it again (_AGAIN: a larger heap or
        output buffer), or the steps the interpreter took to the failure from a place
        native code left (it raises the interpreter's error there), or None: the
        interpreter runs the whole pass (the heap as before)."""
        if "output buffer full" in str(e):
            undo()
            if self.said_cells < SAID_LIMIT:
                self.said_cells = min(2 * self.said_cells, SAID_LIMIT)
                return _AGAIN
            return None           # the interpreter runs the pass, printing as it goes
        # undo the heap writes; then either grow a heap the compiled code ran
        # out of and run again, or let the reference engine find and report
        # the failing instruction, leaving the state exactly where it stops
        if "a shadow not finite" in str(e):
            # (the build that searches a gradient pass stopped at the first
            # look that found one, leaving the look before in a record: the
            # search puts the machine there, place=True)
            raise MachineError("a shadow not finite",
                               self.stack[0].fn.name) from None
        need = self._wanted()
        if "step budget exhausted" in str(e) or \
                "a float result not finite" in str(e):
            err = self._exhausted(direction)
            if isinstance(err, MachineError):
                raise err from None
            if err is not None:     # (the interpreter ended the pass)
                return err
        room = self._record_room()
        last, now = self._last_clean(), self._failed_at()
        undo()
        if room:        # no room for the checkpoint: make it, run again
            with contextlib.suppress(Limit):
                self._grow(room, exact=True)
                return _AGAIN
        if "heap capacity exceeded" in str(e) and self.cap < self.heap_limit \
                and need <= self.heap_room():
            # as large as the cells wanted (when the code says how many), and
            # never past the limit: a refused request is refused before any
            # cell is allocated for it (the interpreter then reports it)
            with contextlib.suppress(Limit):    # (out of memory: reported so)
                self._grow(min(max(need, 2 * self.cap), self.heap_room()))
                return _AGAIN
        if "invertibility check failed" in str(e) or \
                "step budget exhausted" in str(e) or \
                "a float result not finite" in str(e):
            # (a failed compiled run leaves the root frame as the pass began)
            entry, taken = self._root_state(), None
            self._made_before = False
            # (a check that failed more than FAR steps past the last look,
            # or past the start where no look was made (every float was
            # finite there): after, or in, a counted loop; see _general)
            seen = last if last >= 0 else self.max_steps
            far = 0 <= now < seen - FAR and self._compiled.counted
            if last >= 0 and not far:
                taken = self._replay(direction, last, FAR)
                if taken is not None and taken != -1:
                    return taken
                if taken == -1:     # the failure is far from that back edge
                    self._restore(entry)
                undo()
            # (no back edge passed before it: a counted loop's, if any,
            # unless the budget is short: then the interpreter's run of
            # the pass is short too)
            if self._made_before or taken == -1 or far or \
                    (last < 0 and now < 0 and self._compiled.counted and
                     self.max_steps > FAR):
                if far and not self._made_before:
                    taken = self._general(direction, now, undo, entry)
                    if taken is not None:
                        return taken
                taken = self._late(direction, undo)
                if taken is not None:
                    return taken
                self._restore(entry)
        return None

    def _out_of_steps(self, budget: int, direction: int) -> MachineError:
        top = self.stack[-1]
        return MachineError(f"step budget of {budget} steps exhausted before the "
                            f"{'end' if direction > 0 else 'start'} (an endless loop?); "
                            "raise max_steps / --max-steps", top.fn.name,
                            top.index(top.dir * direction))

    def _exhausted(self, direction: int, place: bool = False) -> MachineError | int | None:
        """After a native run of the root function ran out of steps (forwards or
        backwards, plain or in gradient mode): the machine put where the interpreter's
        run would have stopped, and the error it reports, or None (nothing changed) where
        that cannot be told so (then the interpreter runs the pass again), or 0 where the
        interpreter, taking over, ended the pass within the budget. Native code
        tests the budget at back edges, and leaves there, in the heap cells above the
        top, its registers (and their shadows) and the block the edge goes to, and each
        caller its registers and the block of its call (rvm.engines.lowering:
        Lowering.record), a few steps past the end of the budget: the machine takes that
        state and steps back over those few steps (the inverse instructions); a function
        without loops tests it at its calls, a few steps before the end of the budget
        (rvm.engines.compiled: Compiled.tested), and the machine steps on from there; so a
        failing run costs about what a succeeding one does. A frame run backwards is
        native code of the function's inverse (rvm.core.inverse): its blocks and states
        are the inverse's, mapped back onto the function's own. A float register holding
        -0.0 is taken as it is: native code makes a heap cell it read raw what the
        interpreter holds (0.0 + cell) before a back edge or a call, where records are
        left (rvm.engines.compiled: _Writer.goto); a shadow may hold -0.0 (no branch
        reads one). A failed check in a function that writes no heap cell leaves, in
        the same form, the registers its last look kept (AT_LOOK, with callers' records
        as here): the machine goes there and steps forwards to the failure (_from_look);
        place=True: only goes there (0), where a search steps on its own way."""
        from .lowering import (
            AT_BACK_EDGE,
            AT_CALL,
            AT_END,
            AT_LOOK,
            AT_SITE,
            CHECKPOINT,
            RECORD,
            name_id,
        )
        heap, fr = self.__dict__.get("_native_heap"), self.stack[0]
        if heap is None or heap[0] is not self._buf or len(self.stack) != 1 or \
                self.said_cells:    # (output: the interpreter's run prints it)
            return None
        grad = self.grad
        hi, t = heap[1], int(heap[4][0])
        records, pos = [], t          # innermost first
        while 0 <= pos <= len(hi) - RECORD and hi[pos] == CHECKPOINT:
            name, kind, block, arg, count = (int(v) for v in hi[pos + 1:pos + RECORD])
            end = pos + RECORD + 2 * count
            if count < 0 or end > len(hi):
                return None
            pairs = hi[pos + RECORD:end].reshape(-1, 2)
            records.append((name, kind, block, arg, {int(k): int(v) for k, v in pairs}))
            pos = end
        stop = int(heap[4][STOP])   # (a budget test before a call stopped the run)
        looked = bool(records) and records[0][1] == AT_LOOK
        if not records or (records[0][1] == AT_CALL and stop == NO_STOP) or \
                (records[0][1] not in (AT_SITE, AT_CALL, AT_LOOK) and records[0][3] >= 0) or \
                (looked and records[0][3] < 0) or any(r[1] != AT_CALL for r in records[1:]):
            return None     # (budget left at the test: a value not finite, see _replay)
        frames = []         # (machine state, registers, shadows), the root's first
        fn, e, owed = fr.fn, fr.dir * direction, 0
        for k, (name, kind, block, arg, found) in enumerate(reversed(records)):
            mode = ("g" if grad else "") + ("fw" if e > 0 else "bw")
            if name != name_id(self._compiled.name(fn.name, mode)):
                return None
            R = [0] * fn.n_int + [0.0] * fn.n_float
            G = [0.0] * len(R) if grad else None
            if kind == AT_END:      # the parameters (the locals are zero: checked) and,
                if k != 0:          # in a gradient pass, the float locals' shadows
                    return None
                regs = fn.params
                for r in fn.locals if grad else ():
                    if r.cls == isa.FLOAT:
                        bits = found.get(name_id(f"gf{r.n}"))
                        if bits is None:
                            return None
                        G[fn.slot(r)] = np.int64(bits).view(np.float64).item()
            else:
                regs = fn.registers
            for r in regs:
                reg = f"{'r' if r.cls == isa.INT else 'f'}{r.n}"
                bits = found.get(name_id(reg))
                if bits is None:
                    return None
                R[fn.slot(r)] = bits if r.cls == isa.INT else \
                    np.int64(bits).view(np.float64).item()
                if r.cls == isa.FLOAT and not math.isfinite(R[fn.slot(r)]):
                    self._made_before = True    # (native code tests it only when seen:
                    return None                 # see _late)
                if grad and r.cls == isa.FLOAT:
                    bits = found.get(name_id("g" + reg))
                    if bits is None:
                        return None
                    G[fn.slot(r)] = np.int64(bits).view(np.float64).item()
            # native code runs a frame moving backwards as its inverse's forward run
            code = fn.code if e > 0 else self._inverse(fn).code
            n = len(code)
            leaders = _leaders(code)
            if kind == AT_END:
                state = 2 * n
            elif kind == AT_SITE:   # before instruction `block` (n: the end)
                if not 0 <= block <= n:
                    return None
                state = 2 * block
            elif not 0 <= block < len(leaders):
                return None
            elif kind == AT_CALL:   # the block's nth call of the callee named
                end_of_block = leaders[block + 1] if block + 1 < len(leaders) else n
                sites = []
                for i in range(leaders[block], end_of_block):
                    if code[i].op not in isa.CALLS:
                        continue
                    callee = self.program.functions[code[i].args[0].name]
                    d = 1 if code[i].op == "CALL" else -1     # (native code's own)
                    wanted = ("g" if grad else "") + ("fw" if d > 0 else "bw")
                    if name_id(self._compiled.name(callee.name, wanted)) == arg & 0xFFFFFFFF:
                        sites.append((i, callee, d))
                if not 0 <= arg >> 32 < len(sites):
                    return None
                site, inner, inner_e = sites[arg >> 32]
                # the block's steps were charged on entry to it: those after the call,
                # and the call's return, are not taken yet (before the innermost: the
                # budget left before it, STOP)
                if k + 1 < len(records):
                    owed += closures_cost(code[site + 1:end_of_block]) + 1
                state = 2 * site
            else:                   # AT_BACK_EDGE, AT_LOOK
                state = 2 * leaders[block]
            edge = kind in (AT_BACK_EDGE, AT_LOOK)
            if e < 0:               # the inverse's state as the function's own
                state = self._own_state(fn, code, state, R, G, edge)
            elif edge and code[state >> 1].op in isa.COMEFROMS:
                with contextlib.suppress(Fault):    # arrived by its jump? (its test tells)
                    self._code(fn, 1)[state + 1](list(R), None if G is None else list(G))
                    state += 1
            frames.append((state, R, G))
            left = stop if k + 1 == len(records) and kind == AT_CALL else arg
            if kind == AT_CALL:
                fn, e = inner, inner_e
        left += owed            # steps the interpreter's run takes from that state
        saved, steps = self._root_state(), self.steps
        hi[t:pos] = 0
        self.top = t
        if looked and len(records) == 1:
            self._from_snapshot(records[0], max(t, pos))
        try:
            for k, (state, R, G) in enumerate(frames):
                top = self.stack[-1]
                if k:           # pushed by the caller's CALL (UNCALL), then as it was
                    self._push(top, top.dir * direction, direction)
                    top = self.stack[-1]
                top.R[:], top.state = R, state
                if G is not None:
                    top.G[:] = G
            self.steps = steps + direction * (self.max_steps - left)
            if not looked:
                moved = self._move(direction, left) if left > 0 else 0
                if left >= 0 and self.at_boundary(direction):
                    return 0    # a budget test at a call stopped early (it counts a caller's
                    # steps after the call as taken): the budget held, the pass is done
                while moved < -left:    # back over the steps past the budget, where exact
                    top = self.stack[-1]
                    i = top.index(-top.dir * direction)
                    if not 0 <= i < len(top.fn.code) or \
                            not _undone_exactly(top.fn.code[i], grad):
                        raise MachineError("not exactly")   # (then _replay, forwards)
                    if self._move(-direction, 1) != 1:
                        break
                    moved += 1
                if moved != abs(left) or self.at_boundary(direction):
                    raise MachineError("the checkpoint is not reachable")
        except (RvmError, Fault):   # (never, if native code and the interpreter agree)
            self._restore(saved)
            return None
        if looked and place:    # (placed: a search steps on: rvm.ad.gradient.not_finite)
            return 0
        if looked:      # (the interpreter's error, where it fails, goes to the caller)
            return self._from_look(direction, left, records[0], saved)
        return self._out_of_steps(self.max_steps, direction)

    def _snapshot_of(self, record: tuple) -> bool:
        """Is the machine's snapshot (Lowering.snapshot) the one taken with this look's
        record (AT_LOOK: the same function, the same budget left)?"""
        from .lowering import SNAP_AT, SNAP_NAME
        snap = self.__dict__.get("_snapshot", (None,))[0]
        return snap is not None and 0 <= snap[SNAP_AT] == record[3] and \
            snap[SNAP_NAME] == record[0]

    def _from_snapshot(self, record: tuple, end: int) -> None:
        """A root frame's look record (AT_LOOK) in a function whose run writes the heap
        comes with a snapshot of the heap at that look (rvm.engines.lowering:
        Lowering.snapshot): the heap's cells (and in a gradient pass their shadows) as
        they were there, the cells above its top zero (up to `end`, the records' end)."""
        from .lowering import SNAP_HEAD, SNAP_ROOM, SNAP_TOP
        if not self._snapshot_of(record):
            return          # (a function that writes no heap cell: the heap is as it was)
        snap = self._snapshot[0]
        heap, top = self._native_heap, int(snap[SNAP_TOP])
        heap[1][:top] = snap[SNAP_HEAD:SNAP_HEAD + top]
        heap[1][top:end] = 0
        if self.grad:
            room = SNAP_HEAD + int(snap[SNAP_ROOM])
            heap[3][:top] = snap[room:room + top].view(np.float64)
            heap[3][top:end] = 0.0
        self.top = top

    def _from_look(self, direction: int, left: int, record: tuple, saved: tuple) -> int | None:
        """The machine placed at the last look before a native run failed (a check, or a
        float found not finite), which left the registers of that look (an AT_LOOK
        record, `at` steps of budget left there: rvm.engines.lowering, Lowering.from_kept;
        nothing wrote the heap since, or the snapshot taken with the look put it back),
        with `left` steps of budget: the interpreter steps on to the failing instruction
        and raises its error there (about CLEAN_EVERY steps and a pass from the look), as
        the whole run on the interpreter would; one native run, not a second to that
        look. Where the failure is more than FAR steps past the look, and than the steps
        native code ran to it over STEP_COST (the interpreter's steps would cost more
        than a native run), native code starts again from the look in the root frame of
        a function whose looks take snapshots (_resume), else (the root frame as before;
        the heap is the caller's to undo) None, as where the interpreter does not end
        the pass (never, if native code and the interpreter agree) or does not find the
        failure within its steps (a counted loop's, after it: see _general)."""
        at = record[3]
        now = self._failed_at()
        reach = max(FAR, (self.max_steps - now) // STEP_COST) if now >= 0 else FAR
        resumable = self._resumable(record, now, direction) \
            if 0 <= now < at - RESUMED else None
        if resumable is not None or 0 <= now < at - reach:
            taken = None if resumable is None else \
                self._resume(direction, at, *resumable, saved)
            if taken is None:
                self._restore(saved)
            return taken
        far = min(left, reach)
        taken = self._move(direction, far)      # (the interpreter's error, if it fails)
        if self.at_boundary(direction):
            return taken
        if far < left:
            self._restore(saved)
            return None
        return self._out_of_steps(self.max_steps, direction)

    def _resumable(self, record: tuple, now: int, direction: int) -> tuple | None:
        """For _resume, where the machine was put back to the snapshot taken with a root
        frame's look (its AT_LOOK record) and the failed run failed with `now` steps of
        budget left: the steps from there to one step before the last budget test (a
        back edge where every float was finite: _last_clean) the failed run passed
        after it, the look's block and registers as native code starts from them
        (Lowering.resume), and the build that does (Compiled.resume: compiled on first
        need, where the failed run took RESUME_STEPS steps or more: a shorter one's
        second run costs less than the compile); else None."""
        from .compiled import compiled
        _, _, block, at, found = record
        last = self._last_clean()
        if not self._snapshot_of(record) or not 0 <= last < at or self.said_cells:
            return None
        usual = self._compiled
        build = compiled(self.program, self.checks, native=True, strict=usual.strict,
                         resume=True)
        functions = build.bind(self)
        fr = self.stack[0]
        mode = ("g" if self.grad else "") + ("fw" if fr.dir * direction > 0 else "bw")
        if build.name(fr.fn.name, mode) not in functions and \
                self.max_steps - now < RESUME_STEPS:
            return None
        return (at - last - 1, np.array([block, len(found), *found.values()], np.int64),
                build, functions)

    def _resume(self, direction: int, at: int, stop: int, record, build, functions,
                entry: tuple) -> int | None:
        """The machine placed at a look in the root frame, `at` steps of budget left
        there, with the heap of the snapshot taken there, before the failure of the
        native run that left the look's record (_resumable): native code starts the root
        frame at that look (its registers and block: rvm.engines.lowering,
        Lowering.resume: `record`; native code of `build`, whose `functions` are made
        on first need) with a budget of `stop` steps, which ends one step before the
        last budget test the failed run passed, where it stops and leaves its record
        (_exhausted puts the machine there); the interpreter steps on to the failure and
        raises its error. So a failure far from the look costs a native run from its
        snapshot, not a second run of the whole pass, nor the interpreter's steps from
        the look. The root frame is entered with the registers it was entered with in
        the failed run (`entry`: its checks on entry hold as they did there) before it
        takes the look's. None (the heap is the caller's to undo, the state array as
        the failed run left it) where the run from the look does not stop where it
        should."""
        budget, start = self.max_steps, self.steps
        # (the failed run's state array, for the way taken otherwise)
        failed = self._native_heap[4].copy()
        fr = self.stack[0]
        fr.R[:] = entry[0]
        if entry[1] is not None:
            fr.G[:] = entry[1]
        usual = self._compiled, self._compiled_functions
        self.max_steps, self._resume_record = stop, record
        self._compiled, self._compiled_functions = build, functions
        try:
            self.pending.clear()
            self._compiled.run(self, direction)
            stopped = False             # (never: it stops before)
        except RvmError as e:
            stopped = "step budget exhausted" in str(e) and \
                self._exhausted(direction) is not None
        finally:
            self.max_steps = budget
            self.pending.clear()
            self.__dict__.pop("_resume_record", None)
            self._compiled, self._compiled_functions = usual
        if not stopped:
            self._native_heap[4][:len(failed)] = failed
            return None
        rest = at - stop                # (the budget left where the machine stands)
        taken = self._move(direction, rest)
        if taken >= rest and not self.at_boundary(direction):
            raise self._out_of_steps(budget, direction)
        return abs(self.steps - start)

    def _inverse(self, fn: Function) -> Function:
        """fn's inverse (rvm.core.inverse), made once per program."""
        key = ("inverse", fn.name)
        made = self.program.cache.get(key)
        if made is None or made[0] is not fn:
            made = self.program.cache[key] = (fn, inverse_function(fn))
        return made[1]

    def _last_clean(self) -> int:
        """The budget left at the last back edge a failed native run passed where it found
        every float register finite (rvm.engines.lowering: Lowering.clean), or -1: the
        failing frame's, or a caller's if it passed none, or, where the run went past its
        budget after its last back edge, the one the root (or a callee that returned last)
        handed back on return."""
        state = self._native_state()
        if state is None:
            return -1
        return int(state[1]) if state[1] >= 0 else int(state[LAST])

    def _failed_at(self) -> int:
        """The budget left where a failed native run's check failed (-1: not known)."""
        state = self._native_state()
        return -1 if state is None else int(state[NOW])

    def _native_state(self):
        """The state array a native run left (templates.STATE), or None."""
        heap = self.__dict__.get("_native_heap")
        return heap[4] if heap and self._compiled.native else None

    def _general(self, direction: int, now: int, undo, entry: tuple) -> int | None:
        """After a native run failed inside (or soon after) a counted loop, far from the
        last back edge before it: native code again with a budget that ends GENERAL steps
        before the failure, so that the loop, short of budget for all its passes, runs as
        the general loop (rvm.engines.compiled: counted), whose back edges look at the
        float registers and stop at the budget; then either the interpreter steps from
        that stop to the failure, or the general loop failed first, and native code runs
        a third time to its last look before the failure (the loop again short of
        budget), where the interpreter takes over. Three native runs, no second build.
        The interpreter's steps, or None (the machine as before, the heap to be undone).
        """
        taken = self._replay(direction, now + GENERAL, FAR)
        if taken is not None and taken != -1:
            return taken
        # (that run's budget was the steps to its stop: its last look, as budget left
        # of the whole run's, is that many steps more)
        last = self._last_clean() if taken is None else -1
        if last >= 0:
            last += now + GENERAL + 1
        self._restore(entry)
        undo()
        if last < 0 or self._made_before:
            return None
        taken = self._replay(direction, last, FAR)
        if taken is not None and taken != -1:
            return taken
        self._restore(entry)
        undo()
        return None

    def _replay(self, direction: int, left: int, far: int | None = None) -> int | None:
        """After a native run of the root function failed where the interpreter must say
        how (a failed check, a value not finite, an exhausted budget its record could not
        tell): native code left the budget left at the last budget test (a back edge) the
        failing frame (or, if it passed none, a caller) passed. Run natively again with a
        budget that ends one step before that test: native code stops there and leaves
        its record (_exhausted puts the machine there), and the interpreter runs on from
        it with the rest of the budget, to the failure (the steps since that back edge).
        So a failing run costs about two native runs and a pass of the interpreter, not
        the whole run on the interpreter. The interpreter's steps, or None (nothing
        changed but the heap, to be undone) where it cannot."""
        budget, start = self.max_steps, self.steps
        stop = budget - left - 1        # the steps to that test, less one
        if not 0 <= stop < budget or self.said_cells:
            return None
        self.max_steps = stop
        try:
            self.pending.clear()
            self._compiled.run(self, direction)
            return 0                # (never: it fails, or stops, before; else it ran)
        except RvmError as e:
            if "step budget exhausted" not in str(e) or self._exhausted(direction) is None:
                return None
        finally:
            self.max_steps = budget
            self.pending.clear()
        # the machine stands `stop` steps in, as the interpreter's run would
        rest = budget - stop
        if far is not None and rest > far:      # (a counted loop's failure can be far)
            if self._move(direction, far) >= far and not self.at_boundary(direction):
                return -1       # (the caller puts the machine back: see _restore)
            rest -= far
        taken = self._move(direction, rest)
        if taken >= rest and not self.at_boundary(direction):
            raise self._out_of_steps(budget, direction)
        return abs(self.steps - start)

    def saved(self) -> tuple:
        """The machine between passes (at the root frame's start or end), its heap and
        shadows included, for restore: a search that runs a pass again and again from
        one state (rvm.ad.gradient.not_finite)."""
        return self._root_state(), self._heap_state()

    def restore(self, saved: tuple) -> None:
        """The machine back as saved() took it."""
        self._restore(saved[0])
        self._restore_heap(saved[1])

    def _heap_state(self) -> tuple:
        """The heap's top, cells, shadows (in gradient mode) and dscale (_restore_heap)."""
        return (self.top, bytes(self._buf[:8 * self.top]),
                bytes(self._gbuf[:8 * self.top]) if self.grad else b"", self.dscale)

    def _restore_heap(self, saved: tuple) -> None:
        """The heap as _heap_state took it (the cells above the top zero)."""
        self.top, cells, shadows, self.dscale = saved
        for buf, data in ((self._buf, cells), (self._gbuf, shadows)):
            buf[:len(data)] = data
            np.frombuffer(buf, np.uint8)[len(data):] = 0

    def _root_state(self) -> tuple:
        """The root frame's registers, shadows and state, and the step count (_restore)."""
        fr = self.stack[0]
        return list(fr.R), None if fr.G is None else list(fr.G), fr.state, self.steps

    def _restore(self, saved: tuple) -> None:
        """The machine back at the root frame as _root_state took it."""
        fr = self.stack[0]
        R, G, state, steps = saved
        self.stack, self.frame_cells, self.steps = [fr], len(fr.R), steps
        fr.R[:], fr.state = R, state
        if G is not None:
            fr.G[:] = G

    def _late(self, direction: int, undo) -> int | None:
        """After _replay found a value that is not finite already made at the last back
        edge before native code saw it (a counted loop's, tested after its last pass, or
        a parameter's), or found the failure far from it (after a counted loop, which
        has no back edge inside): native code that runs no loop as a counted loop
        (Compiled.strict) runs the pass to fail at the first back edge after the failure,
        then _replay (with the usual code, which stops at the same back edges, unless it
        has counted loops) steps from the one before it. The interpreter's steps, or None
        (the heap as before) where that cannot be done."""
        from .compiled import compiled
        normal = self._compiled, self._compiled_functions
        self._compiled = compiled(self.program, self.checks, native=True, strict=True)
        self._compiled_functions = None
        try:
            self.compiling = True
            try:
                self._compiled.run(self, direction)
                undo()
                return None         # (never: the usual code failed)
            except RvmError:
                last = self._last_clean()
            except Exception:       # (no strict build could be made: the interpreter)
                return None
            finally:
                self.compiling = False
            undo()
            if last < 0:
                return None
            if not normal[0].counted:   # the usual code stops at the same back edges,
                self._compiled, self._compiled_functions = normal     # and runs faster
            taken = self._replay(direction, last)
            if taken is None:
                undo()
            return taken
        finally:
            self._compiled, self._compiled_functions = normal

    def _own_state(self, fn: Function, code, state: int, R: list, G, edge: bool) -> int:
        """A state of fn's inverse (`code`, run forwards) as fn's own state run
        backwards: before inverse instruction q (by fall-through) is after fn's
        instruction n-1-q; at the inverse's comefrom q arrived by its jump (the inverse of
        fn's branch j = n-1-q) is at fn's comefrom that j jumps to, arrived by the jump
        (reached by a back edge, the comefrom's test tells which of the two)."""
        n = len(code)
        q = state >> 1
        own = 2 * (n - q)
        if edge and q < n and code[q].op in isa.COMEFROMS:
            j = n - 1 - q
            jumped = 2 * fn.labels[fn.code[j].args[-1].name] + 1
            try:
                self._code(fn, -1)[jumped](list(R), None if G is None else list(G))
                return jumped
            except Fault:
                pass
        return own

    def _record_room(self) -> int:
        """After a native run ran out of steps, with no checkpoint for _exhausted: the heap
        size (cells) that leaves room for the records of every function (and, in gradient
        mode, their float registers' shadows) above the top,
        if the heap was too small for them (and the run could use them), else 0."""
        from .lowering import RECORD
        heap = self.__dict__.get("_native_heap")
        if heap is None or heap[0] is not self._buf or self.said_cells or \
                getattr(self, "_roomy", None) is self._buf:
            return 0
        room = sum(RECORD + 2 * len(f.registers) + 2 * self.grad * f.n_float  # (shadows)
                   for f in self.program.functions.values())
        top = int(heap[4][0])
        if not 0 <= top <= self.cap or self.cap - top >= room or \
                top + room > self.heap_room():
            return 0
        return top + room

    def _wanted(self) -> int:
        """The heap cells a native run that ran out of heap wanted (native code leaves
        them in the heap top: rvm.engines.lowering), or 0 when it does not say."""
        heap = self.__dict__.get("_native_heap")
        if heap is None or heap[0] is not self._buf or not self._compiled.native:
            return 0
        return max(int(heap[4][0]), 0)

    def tier(self) -> str:
        """The compiled engine to use now (engine 'auto' moves to native with use).
        Recursive programs never run natively: native code has no recursion limit, so a
        runaway recursion would crash the process instead of raising an error."""
        cache = self.program.cache
        if self.engine == "native":
            if not recursive(self.program):
                return "native"
            if not cache.get("native_warned"):
                import warnings
                warnings.warn("recursive programs run on the python engine, not natively "
                              "(native code has no recursion limit)", stacklevel=3)
                cache["native_warned"] = True
            return "python"
        if self.engine != "auto":
            return self.engine
        from . import native
        cache["runs"] = cache.get("runs", 0) + 1
        if native.available and cache["runs"] > NATIVE_AFTER and \
                not cache.get("native_failed") and not recursive(self.program):
            return "native"
        return "python"

    def at_boundary(self, direction: int) -> bool:
        """True when the root frame is at its end (direction +1) or start (-1)."""
        if len(self.stack) != 1:
            return False
        fr = self.stack[0]
        e = fr.dir * direction
        return fr.state == (2 * len(fr.fn.code) if e > 0 else 0)

    @property
    def at_end(self) -> bool:
        return self.at_boundary(1)

    @property
    def at_start(self) -> bool:
        return self.at_boundary(-1)

    # ------------------------------------------------------------------ calls
    def enter(self, name: str, *args, backward: bool = False,
              names: list[str] | None = None) -> Frame:
        """Set up `name` on the arguments as the root frame, ready to step (or uncall).

        numpy arrays are copied onto the heap (see rvm.arguments); the heap is reset."""
        fn = self.program.functions.get(name)
        if fn is None:
            raise MachineError(f"no function {name!r} in the program (it has: "
                               f"{', '.join(self.program.functions) or 'none'})")
        self._clear(self._buf)
        self._clear(self._gbuf)
        self.top = 0
        try:
            values, self.bindings = bind(self, fn, args, names or list(fn.names) or None)
        except Limit as e:          # the argument arrays alone are past the heap limit
            err = MachineError(str(e), name)
            err.limit = True
            raise err from None
        self.entry_top = self.top          # the argument arrays; the rest must be freed
        fr = Frame(fn, -1 if backward else 1, 2 * len(fn.code) if backward else 0)
        for p, v in zip(fn.params, values):
            fr.R[fn.slot(p)] = v
        self.stack, self.steps = [fr], 0
        self.dscale = 0.0
        self.frame_cells = len(fr.R)
        deepest = self.program.deepest(name)      # None: recursive (the python engine
        self.too_deep = deepest is not None and deepest[0] > self.max_depth  # counts)
        self.reserve = 0 if deepest is None else deepest[1] - len(fr.R)
        if self.grad:
            fr.G = [0.0] * len(fr.R)
        return fr

    def fits(self) -> bool:
        """May compiled code run the root function from here? Not where a chain of calls
        under it could pass max_depth, or its registers and the heap pass heap_limit (the
        interpreter then runs, and reports it where it happens)."""
        room = self.heap_room()     # (native code needs a cell: none left, it may not run)
        return not self.too_deep and self.top <= room and room >= 1

    def heap_room(self, compiled: bool = True) -> int:
        """The heap cells the live frames leave under heap_limit; for compiled code (which
        keeps no frames), those the root's and the largest chain of calls under it leave."""
        return self.heap_limit - self.frame_cells - (self.reserve if compiled else 0)

    def output(self, parts: tuple, R: list) -> None:
        """Run an output statement: its text parts and values (from the frame's registers
        and the heap) printed as one line, in either direction."""
        text = "".join(p if isinstance(p, str) else self._shown(p[0], [R[s] for s in p[1:]])
                       for p in parts)
        self._print(text)

    def said(self, k: int, *values) -> None:
        """An output statement run by the python engine (rvm.engines.compiled: said_text):
        statement k of the program, shown now from these values (a tuple or a list of
        registers' for one of several registers) and the heap, printed if the run
        succeeds (see run)."""
        parts = self._compiled.statements[k]
        items = iter(values)
        self.pending.append("".join(
            p if isinstance(p, str) else self._shown(p[0], list(v) if isinstance(
                v := next(items), (tuple, list)) else [v]) for p in parts))

    def speak(self) -> None:
        """Print a compiled run's output (see said), in order."""
        if self.pending:
            self._print("\n".join(self.pending))
            self.pending.clear()

    def _print(self, text: str) -> None:
        """Print output statements' text; characters the stream cannot encode (a char
        array's bytes >= 128 on an ASCII terminal) as backslash escapes, not an error."""
        out = self.out or sys.stdout
        try:
            print(text, file=out, flush=True)
        except UnicodeEncodeError:
            enc = getattr(out, "encoding", None) or "ascii"
            print(text.encode(enc, "backslashreplace").decode(enc), file=out, flush=True)

    def _shown(self, kind: str, values: list) -> str:
        """One value of an output statement: its registers' values, and an array's cells
        read from the heap now."""
        cells = None
        if kind in ("floats", "ints", "janus", "stack", "chars"):
            base, n = values[0], math.prod(values[1:])
            if not (base >= 0 and 0 <= n <= self.top - base and
                    all(d >= 0 for d in values[1:])):
                raise Fault(f"an output statement shows an array outside the heap "
                            f"(cells {base} to {base + n - 1}, heap top {self.top})")
            view = self.hf if kind == "floats" else self.hi
            cells = view[base:base + n].tolist()
        return show_value(kind, values, cells)

    def results(self) -> tuple:
        """The final value of each argument: scalars from the root frame's parameters,
        arrays read back from the heap."""
        self.entered()
        fr = self.stack[0]
        out = []
        for b in self.bindings:
            out.append(read_array(self, b) if b.is_array else scalar(fr, b, fr.R))
        return tuple(out)

    def finish(self, direction: int = 1) -> tuple:
        """Run to the end in `direction`, check the root's locals, return its parameters."""
        self.run(direction)
        if self.checks:
            self.check_locals(self.stack[0])
        return self.results()

    def call(self, name: str, *args) -> tuple:
        """Run function `name` forwards; return its parameters' final values."""
        return self._whole(name, args, False)

    def uncall(self, name: str, *args) -> tuple:
        """Run function `name` backwards; return its parameters' final values."""
        return self._whole(name, args, True)

    def _whole(self, name: str, args: tuple, backward: bool) -> tuple:
        """A whole call: straight into native code when an earlier call of the same kind
        ran natively (scalars, no heap), else through a frame on the machine."""
        key = (name, backward, call_kind(args))
        fast = self._fast.get(key)
        if fast:
            out = fast(args)
            if out is not None:
                return out
        self.enter(name, *args, backward=backward)
        out = self.finish()
        # planned once the call ran natively (engine auto moves there with use): a direct
        # call, or False for none
        if fast is None and self._compiled is not None and self._compiled.native and \
                self.fits():
            self._fast[key] = self._direct(args, backward) or False
        return out

    def batch(self, name: str, columns: list, backward: bool = False) -> tuple | None:
        """Calls (or uncalls) of `name` on rows of scalar arguments, one array per
        parameter, in one native loop: the results' columns, or None when there is no
        such loop for them (not native code, a heap, arrays), and the caller loops. The
        first row runs the general way first, which checks the arguments and plans."""
        first = first_row(columns)
        self._whole(name, first, backward)
        c, fn = self._compiled, self.program.functions[name]
        if not self._fast.get((name, backward, call_kind(first))) or c is None or \
                not c.native or c.uses_heap or len(columns) != len(fn.params):
            return None
        if not exact_columns(columns, fn.params):   # the rows check the rest one by one
            return None
        from .native import on_threads
        try:
            loop = self._compiled_functions[c.name(name, "usb" if backward else "csb")]
        except KeyError:            # no loop could be made: row by row
            return None
        n = len(columns[0])
        cols = batch_columns(columns, fn.params, loop)
        outs = [np.empty(n, col.dtype) for col in cols]
        try:
            on_threads(loop, n, (self.max_steps,), cols, (), outs)
        except Exception:      # a row failed: the row-by-row path finds and reports it
            return None
        return tuple(outs)

    def _direct(self, args: tuple, backward: bool):
        """A function calling the native code of the root function directly (the machine
        and its frames are bypassed), or None. Anything unusual returns None, and the call
        goes the general way, which reports it exactly."""
        c, fn = self._compiled, self.stack[0].fn
        if c is None or not c.native or self.said_cells:    # (output: printed by run)
            return None
        if any(type(a) is np.ndarray for a in args):
            return self._direct_arrays(args, backward)
        if len(args) != len(fn.params):
            return None
        function = self._compiled_functions[c.name(fn.name, "bw" if backward else "fw")]
        # a private heap: programs that only push and pop scalars (as derivative programs
        # do) run on it; one that needs more, or leaves cells in use, goes the general way
        heap = native_heap(min(DIRECT_HEAP, self.heap_room()) if c.uses_heap else 1)
        kinds = coercers(fn.params, fn.name)      # as bind() converts: same values, errors
        budget = self.max_steps

        def direct(values):
            heap[3][0], heap[3][1] = 0, budget
            try:
                out = tuple(function(*heap, *[k(v) for k, v in zip(kinds, values)]))
            except Exception:
                out = None
            if heap[3][0] != 0 or out is None:
                heap[0][:] = 0
                heap[2][:] = 0
                return None
            return out
        return direct

    def private_heap(self) -> tuple | None:
        """A fresh native heap (int64 cells, their float64 view, shadows, the state array)
        for direct calls with this run's argument arrays where the run placed them: as
        large as the run's heap grew and DIRECT_HEAP cells past the arrays, within the heap
        limit; None if the arrays alone exceed it."""
        cells = min(max(self.cap, self.entry_top + DIRECT_HEAP), self.heap_room())
        if cells < self.entry_top:
            return None
        return native_heap(cells)

    def array_places(self, args: tuple) -> list | None:
        """(argument index, first cell, end cell, shape, float?) of each array argument
        where this run placed it, for direct calls on a private_heap(); None if args are
        not what the run bound (a list where it took an array)."""
        b = self.bindings
        if len(b) != len(args) or any(x.is_array and type(a) is not np.ndarray
                                      for a, x in zip(args, b)):
            return None
        return [(k, x.base, x.base + math.prod(x.shape), x.shape, x.cls == isa.FLOAT)
                for k, x in enumerate(b) if x.is_array]

    def _direct_arrays(self, args: tuple, backward: bool):
        """The direct native call for arguments with arrays of these shapes: a private
        numpy heap with the arrays at fixed places (as the general run just placed them),
        copied in before the call and out after it; no machine frame, no snapshot."""
        c, fn, bindings = self._compiled, self.stack[0].fn, self.bindings
        arrays = self.array_places(args)
        if arrays is None or any(b.complex for b in bindings):
            return None
        function = self._compiled_functions[c.name(fn.name, "bw" if backward else "fw")]
        total, heap = self.entry_top, self.private_heap()
        if heap is None:
            return None
        fr = self.stack[0]
        params = [fr.R[fn.slot(p)] for p in fn.params]      # array bases and dimensions
        scalars = [(b.params[0], coercer) for b, coercer in
                   zip(bindings, coercers([fn.params[b.params[0]] for b in bindings],
                                          fn.name))]
        arrays = [(k, lo, hi_, shape, heap[1] if is_float else heap[0])
                  for k, lo, hi_, shape, is_float in arrays]
        budget = self.max_steps

        def direct(values):
            values = list(values)
            for k, lo, hi_, _, view in arrays:
                view[lo:hi_] = values[k].ravel()
            regs = list(params)
            heap[3][0], heap[3][1] = total, budget
            try:
                for (p, kind), v, b in zip(scalars, values, bindings):
                    if not b.is_array:
                        regs[p] = kind(v)
                out = function(*heap, *regs)
            except Exception:
                out = None
            if heap[3][0] != total or out is None:
                heap[0][:] = 0
                heap[2][:] = 0
                return None
            results = [out[b.params[0]] for b in bindings]
            for k, lo, hi_, shape, view in arrays:     # (left there: the next call's
                results[k] = view[lo:hi_].reshape(shape).copy()  # arrays overwrite them)
            return tuple(results)
        return direct

    def snapshot(self) -> tuple:
        """The whole machine state (for tests and the debugger), without the step counter."""
        frames = tuple((f.fn.name, f.state, f.dir, tuple(f.R),
                        tuple(f.G) if f.G is not None else None) for f in self.stack)
        return frames, self.top, bytes(self._buf[: self.top * 8])


ENGINES = ("interp", "python", "native", "auto")
DIRECT_HEAP = 4096            # cells of the private heap of a direct native call
# native code's output buffer (int64 cells): at first, and at most (a run whose output
# does not fit is run again with twice the buffer, up to this; past it, the interpreter
# runs the pass, printing as it goes)
SAID_CELLS, SAID_LIMIT = 1 << 12, 1 << 24
PROGRESS_CHUNK = 200_000      # steps between progress reports of a stepped run


def _undone_exactly(ins, grad: bool) -> bool:
    """Stepping back over `ins` (its inverse) gives every register, cell and shadow back
    bit for bit: control, integer instructions and float moves (isa.MOVES); not float
    arithmetic, which rounds, nor in a gradient pass anything that drops shadows (a
    freed cell's, a returned callee's locals')."""
    op = ins.op
    if op in isa.BRANCHES or op in isa.COMEFROMS:
        return True
    if grad and (op in isa.CALLS or ins.spec.group in ("memory", "array")):
        return False
    if op in isa.CALLS or (ins.cls == isa.INT and ins.spec.group != "array"):
        return True
    return op in isa.MOVES and not grad


GENERAL = 1 << 10  # steps before a failure where Machine._general's native run stops
SLACK = 1 << 12  # heap cells past those asked for when the heap grows (Machine._grow)
FAR = 1 << 13   # interpreter steps from a replay's back edge before another way is tried
STEP_COST = 1 << 8  # what an interpreter step costs, in native code's steps (about)
RESUMED = 1 << 9    # a failure further than this from a look with a snapshot: native code
# starts again from the look (Machine._resume), not the interpreter (a native run's own
# costs, and the snapshot's copy, are about this many interpreter steps)
RESUME_STEPS = 1 << 27  # ... where the build that does is made, or the failed run took
# this many steps (about 0.1 s: less, and a second run costs less than its compile)


def _leaders(code) -> list[int]:
    """The first instruction of each block, as compiled code numbers its blocks."""
    leaders = sorted({0} | {i for i, ins in enumerate(code) if ins.op in isa.COMEFROMS}
                     | {i + 1 for i, ins in enumerate(code) if ins.op in isa.BRANCHES})
    return [b for b in leaders if b < len(code)] or [0]


def closures_cost(code) -> int:
    """Steps the interpreter counts for these instructions (a call: entering and
    leaving), as the compiled engine charges them."""
    return sum(2 if ins.op in isa.CALLS else 1 for ins in code)


def native_heap(cells: int) -> tuple:
    """A fresh heap of `cells` cells for direct native calls: the int64 cells, their
    float64 view, the shadows and the state array (templates.STATE cells)."""
    hi = np.zeros(cells, np.int64)
    return hi, hi.view(np.float64), np.zeros(cells), np.zeros(STATE, np.int64)


def check_limits(**limits) -> None:
    """Refuse limits that could not bound a run: they are usage errors, found up front."""
    for name, v in limits.items():
        if name == "tol":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1:
                raise UsageError(f"tol must be a number in [0, 1), got {v!r}")
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name} must be a positive integer, got {v!r}")
        elif v > INT64_MAX:         # (native code counts in int64)
            raise UsageError(f"{name} must be at most 2**63 - 1, got {v!r}")


def recursive(program: Program) -> bool:
    """Does the call graph (CALL and UNCALL) have a cycle?"""
    return program.call_order()[1]




def machine_for(program: Program, **options) -> Machine:
    """A machine for program with these options, reused from call to call (entering a
    function resets it), so repeated calls do not pay for setting one up. One per thread:
    threads calling the same program each run their own (natively compiled code runs
    without the GIL, so they run side by side)."""
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise TypeError(f"unknown option {unknown[0]!r}; the options are "
                        f"{', '.join(OPTIONS)}")
    mine = machines(program)
    key = tuple(sorted(options.items()))
    m = mine.get(key)
    if m is None or (m.stack and not (m.at_end or m.at_start)):
        m = mine[key] = Machine(program, **options)
    m.set_grad(False)
    return m


def machines(program: Program) -> dict:
    """This thread's reusable machines for program, by options (thread-local: a thread's
    machines go when it ends)."""
    local = program.cache.get("machines")
    if local is None:
        local = program.cache.setdefault("machines", PerThread(by_options=dict))
    return local.by_options


class PerThread(threading.local):
    """Thread-local fields, each made by its factory (dict, set, ...) in every thread
    that uses them; pickled, it comes back empty (a program sent to another process, a
    dask worker's, say, starts there with no machines)."""

    def __init__(self, **factories):
        self._factories = factories
        for name, make in factories.items():
            setattr(self, name, make())

    def __reduce__(self):
        return functools.partial(PerThread, **self._factories), ()


class Transient(dict):
    """A dict of what this process made (native function pointers, plans that call them):
    pickled, it comes back empty, and is filled again on need where it is unpickled."""

    def __reduce__(self):
        return Transient, ()


NATIVE_AFTER = 3      # runs of a program before engine=None compiles it natively


def printing(program: Program) -> bool:
    """Whether the program has output statements (native code keeps their output in a
    buffer: see Machine.run)."""
    if "printing" not in program.cache:
        program.cache["printing"] = any(f.outputs for f in program.functions.values())
    return program.cache["printing"]


def resolve_engine(engine: str | None) -> str:
    """'interp' (the stepping interpreter, the reference), 'python' (generated Python
    functions), 'native' (those compiled to machine code), or None: 'auto', the fastest available
    in steady state — generated Python for a program's first runs, then native code (if
    llvmlite is installed) once the program has run NATIVE_AFTER times, since compiling costs
    about a second per program and only pays for repeated runs."""
    from . import native
    if engine is None or engine == "auto":
        return "auto"
    if engine not in ENGINES:
        raise MachineError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    if engine == "native" and not native.available:
        raise MachineError("the native engine needs llvmlite: pip install 'rvm[fast]' "
                           "(or use engine='python')")
    return engine


def _move(src: Frame, dst: Frame, links, s: int, d: int) -> None:
    """Move parameter values (and gradients) between frames along (caller, callee) links."""
    for link in links:
        a, b = link[s], link[d]
        v = src.R[a]
        dst.R[b], src.R[a] = v, 0.0 if type(v) is float else 0
        if dst.G is not None and src.G is not None:
            dst.G[b], src.G[a] = src.G[a], 0.0
