"""Gradient mode: reverse-mode AD by running the program backwards.

Run the function forwards (plain instructions), seed the loss's gradient shadow with 1,
then run backwards with every float instruction switched to its adjoint. The backward pass
restores the inputs and leaves d loss / d input in their shadows. Nothing is recorded: the
extra memory is one shadow per float register and heap cell, whatever the step count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..core import isa
from ..core.errors import InvertibilityError, MachineError, RvmError, UsageError, user_facing
from ..core.inverse import inverse_function
from ..core.program import Function, Mem, Program, Reg
from ..engines.arguments import (
    INT64,
    Binding,
    batch_columns,
    call_kind,
    coercers,
    exact_columns,
    first_row,
    place_keywords,
    plural,
    read_array,
    scalar,
)
from ..engines.arrays import INTERLEAVED
from ..engines.compiled import DERIVED
from ..engines.machine import (
    DIRECT_HEAP,
    FAR,
    NATIVE_AFTER,
    Machine,
    PerThread,
    Transient,
    machine_for,
    native_heap,
)
from ..engines.native import on_threads
from ..engines.templates import LEFT, SHADOWS, SHADOWS_BAD, SNAP, STATE
from ..lang import FRONTEND, MERGED
from .activity import pruned

Loss = int | str | tuple


def target(fn, args) -> tuple:
    """(program, function name, parameter names) of a loaded-program handle, a reversible
    function (compiled for these arguments) or a transformed one. For an inverse (`~f`)
    the function is f's bytecode inverse: derivative and inverse commute."""
    if hasattr(fn, "pack") and any(isinstance(a, np.ndarray) for a in args):
        raise UsageError(f"{fn.name} of a function of arrays is not differentiated again "
                         "(its arrays travel packed with their derivatives): for second "
                         "derivatives use rvm.hvp or rvm.hessian")
    if hasattr(fn, "specialize"):
        program, name, names = fn.specialize(args)
    else:
        program, name, names = getattr(fn, "program", None), getattr(fn, "name", None), None
        if program is None or name not in getattr(program, "functions", {}):
            raise TypeError("rvm.grad needs a function of a loaded program (prog['name']), "
                            f"a reversible function (@rvm.reversible), got {fn!r}")
    if getattr(fn, "backward", False):
        program, name = with_inverse(program, name)
    return program, name, names


def with_inverse(program: Program, name: str) -> tuple[Program, str]:
    """The program with name's bytecode inverse added (as `name.inv`)."""
    key = ("inverse", name)
    if key not in program.cache:
        fn = program.functions[name]
        inv = inverse_function(fn)
        inv = Function(f"{name}.inv", inv.params, inv.code, inv.labels, fn.line, fn.end_line,
                       fn.names, fn.symbols, checks=fn.checks)
        kept = {}       # a derived function's inverse is derived alike (DERIVED)
        if name in program.cache.get(DERIVED, {}):
            kept[DERIVED] = {**program.cache[DERIVED], inv.name: program.cache[DERIVED][name]}
        if INTERLEAVED in program.cache:
            kept[INTERLEAVED] = program.cache[INTERLEAVED]
        for k in (FRONTEND, MERGED):        # (what rvm.ad.activity asks of the program)
            if k in program.cache:
                kept[k] = program.cache[k]
        program.cache[key] = Program({**program.functions, inv.name: inv}, program.source,
                                     kept, engine=program.engine)
    return program.cache[key], f"{name}.inv"


def whole_run_fits(comp, fn: Function, used: int, budget: int) -> bool:
    """Would the whole forward run of compute-copy-uncompute function fn fit the step
    budget, given the steps `used` by its run to the copy? The direct calls skip the
    uncompute, which the machine's forward run takes: at most as many steps again, and
    the straight code after it. Where that bound is over the budget the general path
    runs and decides exactly, as the interpreter counts (a direct call must not succeed
    where the interpreter's run stops). Fused native calls make the same test themselves
    (rvm.engines.llvm: _entry)."""
    return 2 * used + comp.tails[fn.name] <= budget


def split_passes(comp, funcs, fn: Function, floats: int) -> tuple:
    """fn's split forward run and gradient pass (rvm.engines.compiled.split_point), the
    gradient pass called as the whole one is: the forward run's registers and the seeds
    in (the locals' shadows start at zero), the parameters then their shadows out."""
    fws, gbws = funcs[comp.name(fn.name, "fws")], funcs[comp.name(fn.name, "gbws")]
    zeros = (0.0,) * sum(r.cls == isa.FLOAT for r in fn.locals)
    k, every = len(fn.params), comp.splits[fn.name]

    def gradient(*a):
        back = gbws(*a, *zeros)
        return back[:k] + back[every:every + floats]
    return fws, gradient


def find_argument(bindings: list[Binding], fn, which: Loss, what: str,
          whole_arrays: bool = False) -> tuple[Binding, int | None]:
    """The argument a loss/output/wrt names, and an element index for array elements
    (None for a scalar, or for a whole array where `whole_arrays` allows one)."""
    element = None
    if isinstance(which, tuple):
        if len(which) != 2:
            raise MachineError(f"{what} {which!r}: name an array's element as (argument, "
                               "index), the index an int or a tuple of one int per axis",
                               fn.name)
        which, element = which
    if isinstance(which, (int, np.integer)) and not isinstance(which, bool):
        if not 0 <= which < len(bindings):
            raise MachineError(f"{what} index {which} is out of range: {fn.name} has "
                               f"{len(bindings)} arguments", fn.name)
        b = bindings[which]
    elif isinstance(which, str):
        names = [b.name for b in bindings]
        for b in bindings:
            if which == b.name or which in b.name.split(":")[:1]:
                break
        else:
            raise MachineError(f"unknown {what} {which!r}: the parameters of {fn.name} are "
                               f"{', '.join(names)}", fn.name)
    else:
        raise MachineError(f"{what} must be a parameter index or name, got {which!r}", fn.name)
    if b.cls != isa.FLOAT:
        raise MachineError(f"{what} {b.name} is an integer parameter; integers carry no "
                           "gradient: choose a float parameter", fn.name)
    if b.complex:
        raise MachineError(f"{what} {b.name} is complex; a {what} must be real: accumulate "
                           "a real quantity (abs(z), z.real, ...) into a float parameter and "
                           "name that (rvm.grad gives complex arguments their gradients)",
                           fn.name)
    if b.is_array and element is None and not whole_arrays:
        raise MachineError(f"{what} {b.name} is an array; name one element as "
                           f"({which!r}, index)", fn.name)
    if element is not None:
        if not b.is_array:
            raise MachineError(f"{what} {b.name} is a scalar; it has no elements", fn.name)
        index = element if isinstance(element, tuple) else (element,)
        shape = tuple(b.shape) if isinstance(element, tuple) else (int(np.prod(b.shape)),)
        if len(index) != len(shape) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in index):
            raise MachineError(f"{what} element {element!r} of {b.name} (shape {b.shape}): "
                               "an element is an int (its place in the flattened array) or "
                               f"a tuple of {plural(len(b.shape), 'int')}, one per axis",
                               fn.name)
        if not all(0 <= i < n for i, n in zip(index, shape)):
            raise MachineError(f"{what} element {element} is outside {b.name} "
                               f"(shape {b.shape})", fn.name)
        element = int(np.ravel_multi_index(index, shape))
    return b, element


class Pass:
    """One machine reused for the forward run and any number of backward passes.
    active: the indices of the arguments whose gradients are asked for (None: all), for
    which the program's array pullbacks that no such gradient needs are left out
    (rvm.ad.activity)."""

    def __init__(self, fn, machine_options: dict, active: frozenset | None = None):
        if not hasattr(fn, "specialize"):
            target(fn, ())          # fail early on something that is not a function
        self.fn, self.options, self.active = fn, machine_options, active
        self.name = getattr(fn, "name", "fn")
        self.pruned: dict = {}      # id(program) -> (program, its pruned program)

    def entered(self, args) -> Machine:
        """The machine with the function entered (its arguments checked), not run."""
        program, name, names = target(self.fn, args)
        known = self.pruned.get(id(program))
        m = machine_for(program if known is None else known[1], **self.options)
        m.enter(name, *args, names=names)
        if self.active is not None and known is None:
            arrays = frozenset(b.params[0] for b in m.bindings if b.is_array)
            active = frozenset(p for k, b in enumerate(m.bindings) if k in self.active and
                               b.cls == isa.FLOAT for p in b.params[:1 if b.is_array else None])
            less = pruned(program, name, arrays, active)
            self.pruned[id(program)] = (program, less)
            if less is not program:
                m = machine_for(less, **self.options)
                m.enter(name, *args, names=names)
        return m

    def target(self, args) -> tuple:
        """target(), with the array pullbacks left out that this gradient does not need
        (the program its runs run)."""
        program, name, names = target(self.fn, args)
        if self.active is not None:
            program = self.entered(args).program
        return program, name, names

    def forward(self, args) -> Machine:
        m = self.entered(args)
        m.wants_gradient = True
        try:
            m.run(1)
        finally:
            m.wants_gradient = False
        m.check_locals(m.stack[0])
        return m

    @staticmethod
    def backward(m: Machine, seed: tuple[Binding, int | None]) -> tuple:
        """Seed one output's shadow with 1 and run back in gradient mode; the gradients."""
        m.set_grad(True)
        m.clear_shadows()
        b, element = seed
        fr = m.stack[0]
        if element is None:
            fr.G[fr.fn.slot(fr.fn.params[b.params[0]])] = 1.0
        else:
            m.hg[b.base + element] = 1.0
        m.run(-1)
        grads = []
        for b in m.bindings:
            if b.cls != isa.FLOAT:
                grads.append(None)
            elif b.is_array:
                grads.append(read_array(m, b, shadows=True))
            else:
                grads.append(scalar(fr, b, fr.G))
        m.set_grad(False)
        return tuple(grads)


class _Direct:
    """Scalar arguments on a compiled engine: call the generated forward and adjoint
    functions directly, with no machine frame in between. Any error (or anything unusual)
    sends the call down the general path, which reports it exactly."""

    def __init__(self, runner: Pass, loss: Loss, values: bool = True):
        self.runner, self.loss = runner, loss
        self.local = PerThread(plans=dict)    # per thread: a plan's buffers (a
        # private heap, the state array) serve one native call at a time, without the GIL
        self.values = values         # False: the caller wants gradients only
        self.batches = Transient()   # argument types -> the native batch loop, if any

    @property
    def plans(self) -> dict:
        """This thread's plans, by argument kinds."""
        return self.local.plans

    def batch(self, columns: list) -> tuple | None:
        """(values, gradients) for rows of scalar arguments (one array per parameter) in
        one native call, or None (no native batch loop for these: the caller loops)."""
        first = first_row(columns)
        key = tuple(map(type, first))
        kind = call_kind(first)
        if self.plans.get(kind, False) is False:
            # planned without a call: the batch loop is what runs (the plan's own native
            # call, forwards and back for one row, compiles when a single call comes)
            plan = self.make(first, batch=True)
            if plan is None or plan == "later":
                return None                     # (the caller runs the rows one by one)
            self.plans[kind] = plan
        plan = self.batches.get(key)
        if plan is None:
            return None
        (funcs, name), budget, fn, floats, seed = plan
        if not exact_columns(columns, fn.params):   # the rows check the rest one by one
            return None
        loop = funcs[name]
        n = len(columns[0])
        cols = batch_columns(columns, fn.params, loop)
        if self.values or not getattr(loop, "spreads", False):
            outs = [np.empty(n, c.dtype) for c in cols]
        else:                   # gradients only: the loop need not store the values
            outs = [None] * len(cols)
        grads = [np.empty(n) for _ in floats]
        try:
            on_threads(loop, n, (budget,), cols, seed, outs + grads)
        except Exception:      # a row failed: the row-by-row path finds and reports it
            return None
        spread: list = [None] * len(cols)
        for k, g in zip(floats, grads):
            spread[k] = g
        return tuple(outs), tuple(spread)

    @staticmethod
    def fused(m: Machine) -> bool:
        """Will the plan for m's program be one native call forwards and back (scalars,
        no heap, no output), so that its first call needs no forward run on the machine?"""
        from ..engines.compiled import compiled
        if m.engine != "native" or not m.fits() or m.tier() != "native":
            return False
        comp = compiled(m.program, m.checks, native=True)
        return not comp.uses_heap and not comp.statements

    def loss_of(self, m: Machine, args, ran: bool) -> tuple[Binding, int | None]:
        """The loss's argument and element; where the loss names none and the machine
        has not run, the program's own error comes first, as the general path reports
        it (its forward run, then the loss)."""
        try:
            return find_argument(m.bindings, m.stack[0].fn, self.loss, "loss")
        except Exception:           # (a malformed element is numpy's ValueError)
            if not ran:
                self.runner.forward(args)
            raise

    def make(self, args, batch: bool = False):
        from ..engines.compiled import compiled
        if any(isinstance(a, np.ndarray) for a in args):
            return self.make_arrays(args)
        m = self.runner.entered(args)          # also validates the arguments
        fused = self.fused(m)   # (one native call forwards and back: no forward run first,
        if not fused:                           # whose native code it would compile)
            m = self.runner.forward(args)
        b, _ = self.loss_of(m, args, not fused)
        fn = m.stack[0].fn
        if m.engine == "interp" or len(fn.params) != len(args) or m.said_cells or \
                not m.fits():   # (output statements: the machine's runs print them)
            return None
        comp = compiled(m.program, m.checks, native=fused or m._compiled.native)
        funcs = comp.bind(m)
        heap = comp.heap(m) if comp.native else (m,)
        floats = [k for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
        seed = tuple(1.0 if k == b.params[0] else 0.0 for k in floats)
        kinds = [int if p.cls == isa.INT else float for p in fn.params]
        self.batches[tuple(map(type, args))] = None
        state = heap[-1] if comp.native else None   # (native code's state array)
        if comp.native and not comp.uses_heap:      # one native call, scalars only
            both = self.when_called(funcs, comp.name(fn.name, "vgs"), call_kind(args)) \
                if batch else funcs[comp.name(fn.name, "vgs")]
            heap = (np.zeros(STATE, np.int64), np.zeros(1), m.max_steps)   # under the GIL
            state = heap[0]
            self.batches[tuple(map(type, args))] = ((funcs, comp.name(fn.name, "vgsb")),
                                                    m.max_steps, fn, floats, seed)
        elif comp.native:       # forwards and gradient pass in one native call
            both = funcs[comp.name(fn.name, "vg")]
        elif fn.name in comp.splits:    # forwards to the copy, the gradient pass from there
            fws, gbws = split_passes(comp, funcs, fn, len(floats))
            k = len(fn.params)

            def both(m_, *a):
                top = m.top
                m.budget, m.dscale = m.max_steps, 0.0   # (dscale: a pass's own, as run)
                out = fws(m_, *a[:k])
                if not whole_run_fits(comp, fn, m.max_steps - m.budget, m.max_steps):
                    raise MachineError("the whole run may not fit the step budget")
                m.budget, m.dscale = m.max_steps, 0.0
                back = gbws(m_, *out, *a[k:])
                if m.top != top:        # a block left allocated: the general path reports it
                    raise MachineError("heap block left allocated")
                return out[:k], back
        else:
            fw, gbw = funcs[comp.name(fn.name, "fw")], funcs[comp.name(fn.name, "gbw")]
            h, k = len(heap), len(fn.params)

            def both(*a):
                top = m.top
                m.budget, m.dscale = m.max_steps, 0.0   # (dscale: a pass's own, as run)
                out = fw(*a[:h], *a[h:h + k])
                if m.top != top:        # a block left allocated: the general path reports it
                    raise MachineError("heap block left allocated")
                m.budget, m.dscale = m.max_steps, 0.0
                return out, gbw(*a[:h], *out, *a[h + k:])
        # arguments of exactly the parameters' kinds need no conversion, only their
        # integers a range check (an int may not fit in int64); others convert as a
        # general call converts them: the same values, the same errors
        exact = [type(a) for a in args] == kinds
        convert = [k for k, kind in enumerate(kinds) if kind is int] if exact else \
            coercers(fn.params, fn.name)
        n = len(fn.params)
        if floats == list(range(n)):                      # every parameter is a float
            def scatter(back):
                return back[n:]
        else:
            def scatter(back):
                grads: list = [None] * n
                for k, g in zip(floats, back[n:]):
                    grads[k] = g
                return tuple(grads)
        # engine 'auto': plan again once the machine would have moved on to native code
        from ..engines import native
        upgrade = [NATIVE_AFTER + 1, m.program] if m.engine == "auto" and \
            not comp.native and native.available else None
        return both, heap, (exact, convert), seed, scatter, upgrade, state

    def when_called(self, funcs, name: str, kind):
        """The plan's native call `name`, compiled on its first call (a batch's plan
        need not wait for it), which puts the compiled call in the plan in its place."""
        if name in funcs:
            return funcs[name]

        def both(*a):
            real = funcs[name]
            plan = self.plans.get(kind)
            if isinstance(plan, tuple) and plan[0] is both:
                self.plans[kind] = (real, *plan[1:])
            return real(*a)
        return both

    def native(self, args) -> bool:
        """Did this thread's direct call with these arguments run native code?"""
        plan = self.plans.get(call_kind(args))
        return isinstance(plan, tuple) and plan[-1] is not None

    def looked(self, args) -> int | None:
        """After this thread's direct call with these arguments returned gradients that
        are not finite: the budget left at the last look of its native gradient pass at
        a loop's shadows before one found them not finite (see not_finite), or None."""
        plan = self.plans.get(call_kind(args))
        state = plan[-1] if isinstance(plan, tuple) else None
        if state is None or not state[SHADOWS_BAD] or state[SHADOWS] < 0:
            return None
        return int(state[SHADOWS])

    def ended(self, args) -> tuple | None:
        """After this thread's direct call with arrays returned gradients that are not
        finite: (the forward run's final registers, the heap's cells where it ended, its
        steps), or None (not a fused native call, or a heap it did not copy: see
        rvm.engines.lowering, FORWARD_CELLS)."""
        plan = self.plans.get(call_kind(args))
        forward, snap, _ = getattr(plan, "forward_end", (None, None, None))
        from ..engines.lowering import SNAP_AT, SNAP_HEAD, SNAP_NAME, SNAP_TOP
        if forward is None or snap is None or snap[SNAP_AT] != -2:
            return None
        # (the header as the forward run's end leaves it: -2, the top, its steps)
        return (tuple(forward), snap[SNAP_HEAD:SNAP_HEAD + int(snap[SNAP_TOP])].copy(),
                int(snap[SNAP_NAME]))

    def make_arrays(self, args):
        """Arguments with arrays, on native code: the forward and the gradient functions
        called directly on a private numpy heap holding the arrays at fixed places (as a
        general run places them), their values copied out between the two calls and
        their gradients from the heap's shadows after. On the native engine the plan is
        made from the machine with the arguments placed, not run: the first call is the
        plan's own (a forward run on the machine would compile the function's whole
        forward run, its uncompute's inverses of the callees included: a third of the
        GMM example's code); a call that fails goes the general way."""
        from ..engines.compiled import compiled
        if any(type(a) is np.ndarray and a.dtype.kind == "c" for a in args):
            return None
        m = self.runner.entered(args)          # also validates the arguments
        native = m.engine == "native" and m.fits() and m.tier() == "native" and \
            not compiled(m.program, m.checks, native=True).statements
        if not native:
            m = self.runner.forward(args)
            native = m._compiled is not None and m._compiled.native
        b, element = self.loss_of(m, args, not native)
        fn, bindings = m.stack[0].fn, m.bindings
        if m.said_cells:        # output statements: the machine's runs print them
            return None
        if m.engine == "auto" and not native:
            return "later"                   # plan again once auto has gone native
        places = m.array_places(args)
        if m.engine == "interp" or not native or places is None or not m.fits():
            return None
        comp = compiled(m.program, m.checks, native=True)
        funcs = comp.bind(m)
        floats = [k for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
        # a compute-copy-uncompute function: forwards to the copy, the gradient pass from there
        split = fn.name in comp.splits
        if split:
            fw, gbw = split_passes(comp, funcs, fn, len(floats))
        else:           # (the gradient pass first: its group has the forward run too)
            gbw = funcs[comp.name(fn.name, "gbw")]
            fw = funcs[comp.name(fn.name, "fw")]
        # gradients only, of a scalar loss: forwards and back in one native call
        fused = None if self.values or element is not None else \
            funcs[comp.name(fn.name, "vg")]
        total, heap, room = m.entry_top, m.private_heap(), m.heap_room()
        if heap is None:
            return None
        regs: list = [None] * len(fn.params)
        for a in bindings:
            if a.is_array:
                regs[a.params[0]:a.params[0] + 1 + len(a.shape)] = [a.base, *a.shape]
        seed = [0.0] * len(floats)
        if element is None:
            seed[floats.index(b.params[0])] = 1.0
        seed_cell = None if element is None else b.base + element

        def placed(heap):
            return heap, [(k, lo, hi_, shape, heap[1] if is_float else heap[0], is_float)
                          for k, lo, hi_, shape, is_float in places]
        now = [placed(heap)]        # the private heap and the arrays' places on it
        budget, n = m.max_steps, len(fn.params)
        # (a fused call leaves the heap where its forward run ended in a snapshot buffer
        # where the copy is cheap beside the run, and its final registers here: where
        # its gradient is not finite, the search starts from them: see ended, not_finite;
        # the buffer's pages are touched only where a copy is made)
        from ..engines.lowering import FORWARD_ROOM, SNAP_AT, SNAP_HEAD, SNAP_ROOM
        snap = np.empty(SNAP_HEAD + total, np.int64) \
            if fused is not None and total <= FORWARD_ROOM else None
        if snap is not None:
            snap[:SNAP_HEAD] = 0
            snap[SNAP_AT], snap[SNAP_ROOM] = -1, total
        forward_end: list = [None, snap, None if snap is None else snap.ctypes.data]
        convert = coercers(fn.params, fn.name)
        scalars = [(j, a.params[0], convert[a.params[0]])
                   for j, a in enumerate(bindings) if not a.is_array]
        float_grads = [(j, n + floats.index(a.params[0])) for j, a in enumerate(bindings)
                       if a.cls == isa.FLOAT and not a.is_array]
        want_values = self.values

        def attempt(values):
            """The call on the private heap: its results, or the cells it wanted where
            the heap was too small, or None where it failed otherwise."""
            heap, arrays = now[0]
            for k, lo, hi_, _, view, _ in arrays:
                view[lo:hi_] = values[k].ravel()
            r = list(regs)
            top = heap[3]
            try:
                for j, reg, kind in scalars:
                    r[reg] = kind(values[j])
                top[0], top[1] = total, budget
                if fused is not None:   # (which tests the whole run's bound itself)
                    if snap is not None:
                        top[SNAP] = forward_end[2]   # (and ROOT 0: no frame claims it)
                    forward_end[0] = None       # (this call's, or none: a call that fails
                    forward_end[0], back = fused(*heap, *r, *seed)  # goes the general way)
                    finals = None
                else:
                    out = fw(*heap, *r)
                    if split and not whole_run_fits(comp, fn, budget - int(top[1]), budget):
                        raise MachineError("the whole run may not fit the step budget")
                    if top[0] != total and not split:
                        raise MachineError("heap block left allocated")
                    finals = None       # (gradients only: no copies of the values)
                    if want_values:
                        finals = [out[a.params[0]] for a in bindings]
                        for k, lo, hi_, shape, view, _ in arrays:
                            finals[k] = view[lo:hi_].reshape(shape).copy()
                    if seed_cell is not None:
                        heap[2][seed_cell] = 1.0
                    top[1] = budget
                    back = gbw(*heap, *out, *seed)
                if top[0] != total:
                    raise MachineError("heap block left allocated")
            except Exception as exc:        # the general path reports it exactly
                from ..engines.lowering import FULL
                wanted = int(top[0]) if getattr(exc, "code", None) == FULL else 0
                heap[0][:] = 0
                heap[2][:] = 0
                return wanted if len(heap[0]) < wanted <= room else None
            grads: list = [None] * len(bindings)
            for j, k in float_grads:
                grads[j] = back[k]
            # the pass left every cell as the call found it: the arrays' values (the next
            # call overwrites them) and zeros elsewhere; only the shadows are cleared
            for k, lo, hi_, shape, _view, is_float in arrays:
                if is_float:
                    grads[k] = heap[2][lo:hi_].reshape(shape).copy()
                heap[2][lo:hi_] = 0
            return None if finals is None else tuple(finals), tuple(grads)

        def run(values):
            out = attempt(values)
            while type(out) is int:     # the heap grown (at least doubled) until the call
                cells = min(max(out + DIRECT_HEAP, 2 * len(now[0][0][0])), room)  # fits:
                now[0] = placed(native_heap(cells))  # the plan was made before any run
                out = attempt(values)
            return out
        run.forward_end = forward_end
        return run      # (this call too: the gradient needs no more native code than the
        # direct calls' group, which the forward run made; rvm.engines.native.Functions)

    def __call__(self, args):
        key = call_kind(args)
        plan = self.plans.get(key, False)
        if plan is False:
            plan = self.plans[key] = self.make(args)
        if plan == "later":
            del self.plans[key]
            return None
        if plan is None:
            return None
        if not isinstance(plan, tuple):      # arguments with arrays
            return plan(args)
        both, heap, convert, seed, scatter, upgrade, _ = plan
        if upgrade is not None:
            upgrade[0] -= 1
            if upgrade[0] <= 0:          # these calls count as runs of the program
                cache = upgrade[1].cache
                cache["runs"] = max(cache.get("runs", 0), NATIVE_AFTER)
                del self.plans[key]
        try:
            exact, convert = convert
            if not exact:
                args = [c(a) for c, a in zip(convert, args)]
            else:
                for k in convert:
                    if not INT64[0] <= args[k] <= INT64[1]:
                        return None     # the general path reports it
            out, back = both(*heap, *args, *seed)
        except Exception:       # the general path reports it exactly
            return None
        return out, scatter(back)


def value_and_grad(fn, loss: Loss = 0, argnums=None, wrt=None, has_aux: bool = False,
                   **machine_options) -> Callable[..., tuple]:
    """A function returning (values, gradients) for the same arguments as fn (positional,
    or by parameter name).

    values: the final value of every argument (arrays as numpy arrays). gradients: one per
    argument, d loss / d (its value on entry): a float for a float scalar, a numpy array for
    a float array, None for integers. `loss` is an argument index, a parameter name like
    "f0", or (index, element) for an element of an array. `argnums` (indices) or `wrt`
    (names) choose the arguments gradients are returned for, as in JAX: one index or name
    gives one gradient, a sequence a tuple. With `has_aux`, the result is
    ((loss value, values), gradients).
    """
    return _value_and_grad_function(fn, loss, argnums, wrt, has_aux, machine_options)


def _value_and_grad_function(fn, loss: Loss, argnums, wrt, has_aux: bool,
                             machine_options: dict, values: bool = True):
    """value_and_grad; with values=False (rvm.grad without has_aux) the values may come
    back as None, which lets a call with arrays run forwards and back in one native call."""
    check_options(machine_options)
    pick, chosen = _selector(fn, argnums, wrt)
    core = _value_and_grad(fn, loss, machine_options, values or has_aux, chosen)
    plain = argnums is None and wrt is None and not has_aux

    @user_facing
    def run(*args, **kwargs) -> tuple:
        args = positional(fn, args, kwargs)
        values, grads = core(*args)
        if has_aux:
            k, element = loss_index(fn, args, loss)
            lv = values[k] if element is None else np.ravel(values[k])[element]
            return (lv, values), pick(grads)
        return values, pick(grads)

    if plain:                  # rvm.vmap runs a batch in one native call where it can
        run.batch = core.batch
    run.__name__ = f"value_and_grad_{getattr(fn, 'name', 'fn')}"
    run.differentiated = fn         # (rvm.vmap names arguments by its parameters)
    return run


def check_options(options: dict) -> None:
    from ..engines.machine import OPTIONS
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise TypeError(f"unknown keyword argument {unknown[0]!r}; the gradient functions "
                        "take loss, argnums, wrt, has_aux and the machine options "
                        f"{', '.join(OPTIONS)}")


def parameter_names(fn) -> list[str] | None:
    """The names a function's arguments can be given by (None if unknown)."""
    node = getattr(fn, "node", None)
    if node is not None:
        return [a.arg for a in node.args.args]
    program, name = getattr(fn, "program", None), getattr(fn, "name", None)
    if program is not None and name in getattr(program, "functions", {}):
        f = program.functions[name]
        return list(f.names) or [str(p) for p in f.params]
    signature = getattr(fn, "signature", None)      # (a derivative: rvm.tangent's, ...)
    sig = signature() if callable(signature) else None
    return None if sig is None else list(sig[0])


def positional(fn, args: tuple, kwargs: dict, names=parameter_names) -> tuple:
    """args with keyword arguments put in place by parameter name (names(fn): the
    parameters' names, None where they are not known)."""
    if not kwargs:
        return args
    known, who = names(fn), getattr(fn, "name", None) or getattr(fn, "__name__", "fn")
    if known is None:
        raise TypeError(f"{who} takes positional arguments only")
    return place_keywords(known, args, kwargs, who)


def _selector(fn, argnums, wrt) -> tuple:
    """(a function picking the requested gradients out of all of them, the indices of the
    arguments they are of: None for all, or where pick will refuse an unknown name)."""
    if argnums is not None and wrt is not None:
        raise UsageError("give argnums or wrt, not both")
    if argnums is None and wrt is None:
        return (lambda grads: grads), None
    which = argnums if argnums is not None else wrt
    what = "argnums" if argnums is not None else "wrt"
    single = isinstance(which, (int, str, np.integer)) and not isinstance(which, bool)
    if not single and not (isinstance(which, (Sequence, np.ndarray)) and np.ndim(which) == 1):
        raise UsageError(f"{what} must be an argument index or name, or a sequence of "
                         f"them; got {which!r}")
    items = [which] if single else list(which)
    for w in items:
        if not isinstance(w, (int, str, np.integer)) or isinstance(w, bool):
            raise UsageError(f"{what}: {w!r} is not an argument index (an int) or name")
    names = parameter_names(fn) or []

    def index(w) -> int:
        if isinstance(w, str):
            if w not in names:
                raise UsageError(f"wrt: unknown argument {w!r} (the arguments are "
                                 f"{', '.join(names)})")
            return names.index(w)
        return int(w)

    def pick(grads):
        out = []
        for w in items:
            k = index(w)
            if not 0 <= k < len(grads):
                raise UsageError(f"argnums: {k} is out of range for {len(grads)} arguments")
            out.append(grads[k])
        return out[0] if single else tuple(out)
    try:
        chosen = frozenset(map(index, items))
    except UsageError:
        chosen = None               # (pick says so, when called)
    return pick, chosen


def loss_index(fn, args, loss) -> tuple[int, int | None]:
    """(argument index, element or None) of the loss."""
    program, name, names = target(fn, args)
    m = machine_for(program)
    m.enter(name, *args, names=names)
    b, element = find_argument(m.bindings, m.stack[0].fn, loss, "loss")
    return m.bindings.index(b), element


def _value_and_grad(fn, loss: Loss, machine_options: dict, values: bool = True,
                    active: frozenset | None = None) -> Callable[..., tuple]:
    runner = Pass(fn, machine_options, active)
    direct = _Direct(runner, loss, values)

    def run(*args) -> tuple[tuple, tuple]:
        if not all(type(a) in _PLAIN for a in args) and any(map(is_function, args)):
            return with_functions(fn, args, loss, machine_options)   # functions passed
        fast = direct(args)
        if fast is None:
            m = runner.forward(args)
            target = find_argument(m.bindings, m.stack[0].fn, loss, "loss")
            fast = m.results(), runner.backward(m, target)
        if finite(fast[1]):     # (every gradient finite: the usual call, no more to do)
            return fast
        chosen = fast[1] if active is None else tuple(      # (the others are not checked:
            g if k in active else None for k, g in enumerate(fast[1])) # some not worked out)
        if not finite(chosen):
            native = direct.native(args)
            raise not_finite(runner, args, loss, chosen, direct.looked(args),
                             fast[0] if native else None,
                             None if native else direct.ended(args))
        return fast

    def batch(columns: list):
        done = direct.batch(columns)
        if done is not None and not finite(done[1]):
            return None               # row by row: the first such row reports it
        return done

    run.batch = batch
    return run


FINITE_BY_DOT = 1 << 12       # elements from which _finite_array tries a dot product


def finite(grads) -> bool:
    """Are all these gradients (floats, arrays or None) finite?"""
    for g in grads:
        if type(g) is float:
            if g - g != 0.0:                   # inf - inf and nan - nan are nan
                return False
        elif g is not None and not _finite_array(g):
            return False
    return True


def _finite_array(g) -> bool:
    """Is every element of this array (or number) finite? For a large float array, first
    a dot product of the array with itself, finite where every element is (1.35-3.5x
    faster than isfinite at 10^6 elements; slower at 10^3); an inf or nan makes it inf or
    nan, and so may elements too large to square: then each element is tested."""
    if type(g) is np.ndarray and g.dtype == np.float64 and g.size >= FINITE_BY_DOT and \
            g.flags.c_contiguous:
        x = g.reshape(-1)
        with np.errstate(all="ignore"):         # (no warning for an overflow here)
            if math.isfinite(x @ x):
                return True
    return bool(np.isfinite(g).all())


def not_finite(runner: Pass, args, loss: Loss, grads, looked: int | None = None,
               ended: tuple | None = None, forward_end: tuple | None = None) -> MachineError:
    """The error for gradients that came out inf or nan: which argument's, and where in
    the gradient pass a shadow first stopped being finite (a shadow that overflows where
    nothing reads it, a constant's, is not an error). Native code does not test shadows
    inside the pass, so the place is found by running the pass again with step budgets
    that end where a search asks (each run stops exactly where the interpreter would:
    Machine._exhausted), starting at the last look native code made at a loop's shadows
    before one that found them not finite, to within SEARCHED steps, from where the
    interpreter steps one instruction at a time: a few native passes, not the whole
    pass on the interpreter (it took 13 s for a pass native code runs in 1 ms).
    ended: the arguments' final values from the native call that found the gradients
    not finite: the search starts from them, at the function's end, without running
    the forward pass again (a program without a heap, its locals checked to be zero
    there, ends with nothing else); forward_end: the final registers of the forward
    run of a direct call with arrays, the heap's cells there and its steps
    (_Direct.ended), where the search of a program with a heap starts likewise. The
    native runs are of the build whose gradient passes look at the shadows where one is
    dropped and where a function returns (Compiled.looks); a program with a heap whose
    pass is short (INTERPRETED) is searched by the interpreter alone."""
    from ..engines.compiled import compiled
    from ..engines.explain import names_at
    from ..engines.lowering import CELL_LOOKS, LOOK_EVERY, SEARCH_CELLS
    program, name, names = runner.target(args)
    m = Machine(program, **runner.options)
    heap = any(ins.spec.group in HEAP_GROUPS for f in program.functions.values()
               for ins in f.code)
    steps = None        # (the forward run's, where a program with a heap ran natively)
    if ended is not None and m.checks and not heap:
        fr = m.enter(name, *ended, names=names)
        fr.state = 2 * len(fr.fn.code)
        m._compiled = compiled(program, m.checks, native=True, looks=True)
    elif forward_end is not None and m.checks and heap and \
            _at_forward_end(m, name, args, names, forward_end):
        m._compiled = compiled(program, m.checks, native=True, looks=True)
        steps = forward_end[2]
    else:
        m = Machine(program, **runner.options)      # (_at_forward_end may have entered)
        m.enter(name, *args, names=names)
        m.run(1)
    native = m._compiled is not None and m._compiled.native
    if native and heap:     # (the gradient pass as long as the run: its steps)
        if steps is None:
            steps = m.max_steps - int(m._native_state()[LEFT])
        native = steps > INTERPRETED
    # (a heap larger than the search's snapshots take: the build that notes a cell's
    # shadow made not finite, rvm.engines.lowering: Lowering.shadow_made)
    looks = CELL_LOOKS if heap and m.top > SEARCH_CELLS else True
    if native and m._compiled.looks != looks:
        m._compiled = compiled(program, m.checks, native=True, looks=looks)
        m._compiled_functions = None
    which = [b.name for b, g in zip(m.bindings, grads) if g is not None and not finite([g])]
    shown = next(g for g in grads if g is not None and not finite([g]))
    shown = f"is {shown}" if type(shown) is float else "has inf or nan elements"
    seed = find_argument(m.bindings, m.stack[0].fn, loss, "loss")
    m.set_grad(True)
    m.clear_shadows()
    fr = m.stack[0]
    if seed[1] is None:
        fr.G[fr.fn.slot(fr.fn.params[seed[0].params[0]])] = 1.0
    else:
        m.hg[seed[0].base + seed[1]] = 1.0
    what = f"the gradient of the loss with respect to `{which[0]}` {shown}: not finite"
    small_heap = m.top <= 4096
    # (steps the interpreter steps through at the end, fewer where each tests a large heap)
    window = SEARCHED if small_heap else max(16, SEARCHED * 4096 // m.top)

    def heap_bad() -> bool:
        """Is a cell's shadow not finite?"""
        return not np.isfinite(np.asarray(m.hg[:m.top])).all()

    def cells_bad(fr, ins) -> bool:
        """After a step of ins (a heap instruction) in fr: is a cell's shadow that it may
        have changed not finite? (Every cell's, where the heap has at most SCANNED cells
        or ins is an array instruction; else the cell its memory operand names, if any:
        a test of a large heap at every step took minutes, and of 2,000 cells made the
        interpreter's steps from a snapshot cost more than the search.)"""
        if m.top <= SCANNED or ins.spec.group == "array":
            return heap_bad()
        for a in ins.args:
            if isinstance(a, Mem):
                cell = fr.R[fr.fn.slot(a.base)] + (fr.R[fr.fn.slot(a.off)]
                                                   if isinstance(a.off, Reg) else a.off)
                return 0 <= cell < m.top and not math.isfinite(m.hg[cell])
        return False

    def shadows_finite(fr) -> bool:     # (a frame's float registers' shadows)
        return fr.G is None or finite(fr.G[fr.fn.n_int:])

    start, budget = m.saved(), m.max_steps
    at = [0]            # the steps the machine stands at, in the pass

    def bad_after(k: int) -> bool:
        """The pass run k steps from its start: is a shadow not finite there (any
        frame's, or a cell's), or did the pass end before, or fail (an array
        instruction's gradient that would not be finite, which native code does not
        test: the interpreter, stepping to the budget from a back edge past it, makes
        that test late; the walk makes it where it fails)?"""
        m.restore(start)
        at[0] = k
        state = m._native_state()       # (a run the interpreter makes leaves it as is)
        if state is not None:
            state[SHADOWS], state[SHADOWS_BAD] = -1, 0
        if k:
            m.max_steps = k
            try:
                m.run(-1, heap=start[1])
            except MachineError as e:
                if "step budget" not in str(e):
                    return True
            finally:
                m.max_steps = budget
        state = m._native_state()       # (or a look before it found a shadow not
        # finite: one that is dropped again, a local of a callee that returned, is bad
        # from there on, as the interpreter's walk from the start finds it first)
        return m.at_start or heap_bad() or not all(map(shadows_finite, m.stack)) or \
            (state is not None and bool(state[SHADOWS_BAD]))

    def walk(limit: int) -> MachineError | None:
        """The interpreter's steps from where the machine stands, up to limit: the
        error at the first where a shadow of the frame that took it (or a cell's) is
        not finite, or None."""
        found: list = []

        def bad(fr, i: int) -> bool:
            if not 0 <= i < len(fr.fn.code):
                return False        # (a frame run by UNCALL, left: tested at its steps)
            G, regs = fr.G, []
            if G is not None:
                total = sum(G[fr.fn.n_int:])    # (inf or nan if one is, or on overflow)
                if total - total != 0.0:
                    regs = [r for r in fr.fn.registers if r.cls == isa.FLOAT and
                            not finite([G[fr.fn.slot(r)]])]
            ins = fr.fn.code[i]
            if regs or (m.top and ins.spec.group in HEAP_GROUPS and cells_bad(fr, ins)):
                found.append((fr.fn, ins, regs))
                return True
            return False
        i = m.walk(-1, limit, bad)
        if i is None:
            return None
        fn, ins, regs = found[0]
        label = names_at(fn, ins.line).get(regs[0]) if regs else None
        whose = f"`{label}`" if label else f"{regs[0]}" if regs else "a heap cell"
        return InvertibilityError(
            f"{what}; it stopped being finite in the gradient of {whose} at {ins} (a "
            "partial derivative overflowed, or was inf or nan)",
            fn.name, i, ins.line, program.source)

    # (not native: a pass again would be the interpreter's)
    lo, hi = 0, 0
    if native:
        # the pass natively, to the first look (every SEARCH_EVERY steps) that finds a
        # shadow not finite, in a function that writes no heap cell: it stops there and
        # leaves the look before it, where the machine is put and the interpreter steps
        # the few steps to the place (rvm.engines.lowering: Lowering.keep); in the root
        # frame of a function that writes a heap of at most SEARCH_CELLS cells, its
        # looks' copies come with snapshots of the heap and its shadows, whose shadows
        # it tests (a cell's shadow not finite stops it too: Lowering.snapshot).
        # Elsewhere the pass runs whole, and notes the last look at a loop's (or a
        # returning frame's) shadows before one found them not finite, or a cell's
        # shadow made not finite since (note_shadows, shadow_made); as a rule the place
        # is soon after it. (A budget that ends a step before the look's back edge stops
        # natively there, in one run.)
        try:
            m.run(-1, heap=start[1])
        except RvmError as e:
            # (placed where every frame's shadows and every cell's are finite, as a
            # look before the first that found one not finite is: a callee's look
            # knows only its own frame, and a caller's shadow, or a cell's, may have
            # overflowed first)
            if "a shadow not finite" in str(e) and m._exhausted(-1, place=True) == 0 \
                    and not heap_bad() and all(map(shadows_finite, m.stack)):
                found = walk(FAR)
                if found is not None:
                    return found
            m.restore(start)        # (else the searches below, from the start)
        # (the look that pass noted: its looks come more often than the failing call's,
        # and they count a cell's shadow made not finite since the last:
        # rvm.engines.lowering, Lowering.shadow_made)
        state = m._native_state()
        if state is not None and state[SHADOWS_BAD] and state[SHADOWS] >= 0:
            looked = int(state[SHADOWS])
        look = budget - looked - 1 if looked is not None else 0
        if look > 0 and not bad_after(look):
            found = walk(FAR if small_heap else max(window, 2 * LOOK_EVERY))
            if found is not None:
                return found
            lo = look
        hi, step = lo + window, window
        while hi < budget and not bad_after(hi):
            lo, step = hi, 4 * step
            hi = lo + step
    while hi - lo > window:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if bad_after(mid) else (mid, hi)
    if at[0] != lo:
        bad_after(lo)
    return walk(budget) or InvertibilityError(what, name)


def _at_forward_end(m: Machine, name: str, args, names, ended: tuple) -> bool:
    """The machine entered with these arguments, then put where the forward run of a
    direct call with arrays ended (_Direct.ended: its registers, and the heap's cells,
    as many as the arguments' arrays take: the call checked that the top came back),
    so the search starts there without running the forward pass again; False (the
    machine as entered) where that cannot be told so."""
    forward, cells, _ = ended
    fr = m.enter(name, *args, names=names)
    if m.top != len(cells) or len(forward) != len(fr.fn.params):
        return False
    np.frombuffer(m._buf, np.int64)[:m.top] = cells
    for p, v in zip(fr.fn.params, forward):
        fr.R[fr.fn.slot(p)] = v
    fr.state = 2 * len(fr.fn.code)
    return True


SCANNED = 1 << 8        # a heap of at most this many cells is scanned whole at a step of
# a heap instruction while the search steps (more: the cell the instruction names)

SEARCHED = 1 << 10      # steps of the gradient pass not_finite steps through on the
# interpreter (beyond them, a bisection of native runs)
INTERPRETED = 1 << 16   # a program with a heap whose pass has more steps is searched on
# native code (the build that looks at shadows: a compile), fewer by the interpreter alone
HEAP_GROUPS = frozenset({"memory", "array"})


_PLAIN = frozenset({int, float, np.ndarray})


def is_function(value) -> bool:
    """A reversible function passed as an argument (a string has `lower` too)."""
    return hasattr(value, "specialize") or (hasattr(value, "lower") and
                                            not isinstance(value, (str, bytes)))


class _Bound:
    """fn with its function arguments fixed: the other arguments are the machine's."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.name, self.backward = getattr(fn, "name", "fn"), getattr(fn, "backward", False)

    def specialize(self, values):
        it = iter(values)
        return self.fn.specialize([a if is_function(a) else next(it) for a in self.args])


def with_functions(fn, args, loss: Loss, options: dict) -> tuple[tuple, tuple]:
    """value_and_grad for a call that passes functions: they come back as they are, with
    None as their gradient; an index `loss` counts every argument."""
    positions = [k for k, a in enumerate(args) if not is_function(a)]
    if not hasattr(fn, "specialize"):
        k = next(k for k, a in enumerate(args) if is_function(a))
        raise MachineError(f"argument {k} is a function; only reversible functions "
                           "(rvm.reversible) take functions as arguments",
                           getattr(fn, "name", ""))
    if isinstance(loss, (int, np.integer)) and not isinstance(loss, bool):
        if loss not in positions:
            raise MachineError(f"loss index {loss} is not a number argument", fn.name)
        loss = positions.index(loss)
    elif isinstance(loss, tuple) and loss and isinstance(loss[0], int):
        loss = (positions.index(loss[0]), *loss[1:])
    values, grads = _value_and_grad(_Bound(fn, args), loss, options)(
        *[args[k] for k in positions])
    out_v, out_g = list(args), [None] * len(args)
    for k, v, g in zip(positions, values, grads):
        out_v[k], out_g[k] = v, g
    return tuple(out_v), tuple(out_g)


def grad(fn, loss: Loss = 0, argnums=None, wrt=None, has_aux: bool = False,
         **machine_options) -> Callable[..., tuple]:
    """A function returning one gradient of `loss` per argument (see value_and_grad; with
    has_aux: (gradients, values))."""
    vg = _value_and_grad_function(fn, loss, argnums, wrt, False, machine_options,
                                  values=has_aux)

    @user_facing
    def run(*args, **kwargs) -> tuple:
        values, grads = vg(*args, **kwargs)
        return (grads, values) if has_aux else grads

    if hasattr(vg, "batch"):
        run.batch = lambda columns: (lambda r: None if r is None else r[1])(vg.batch(columns))

    run.__name__ = f"grad_{getattr(fn, 'name', 'fn')}"
    run.differentiated = fn         # (rvm.vmap names arguments by its parameters)
    return run


def jacobian(fn, outputs: Sequence[Loss], wrt: Sequence[Loss], has_aux: bool = False,
             **machine_options) -> Callable[..., np.ndarray]:
    """A function returning the Jacobian d outputs / d wrt as a 2-D array (with has_aux:
    (Jacobian, the final values of every argument)).

    One backward pass per output (scalar, or (array arg, element)). Rows follow `outputs`;
    columns follow `wrt`, where an array argument contributes all its elements in order.
    From the second call with the same kinds of arguments each row is a value_and_grad
    call (native code called directly where the program runs natively).
    rvm.vmap of it runs, for a scalar program on native code, one native loop over the
    rows: per row one forward run and one gradient pass per output.
    """
    check_options(machine_options)
    for what, given in (("outputs", outputs), ("wrt", wrt)):
        if isinstance(given, (str, bytes)) or not isinstance(given, Sequence) or not given:
            raise UsageError(f"rvm.jacobian: {what} must be a non-empty sequence of "
                             f"arguments (indices, names, or (index, element)); got {given!r}")
    runner = Pass(fn, machine_options)
    plans = Transient()         # argument types -> the native Jacobian loop
    # after a first call of a kind of arguments: one value-and-gradient per output, each
    # on the direct path (native code called straight) where it can, of the columns'
    # arguments (the others' gradients not worked out where that saves work, nor tested)
    cores: dict = {}            # the columns' arguments -> those calls
    # argument kinds -> ((argument, element or None) per column, those calls)
    places: dict = {}

    def direct(args, where, calls) -> np.ndarray | tuple:
        rows = []
        for core in calls:
            values, grads = core(*args)
            row: list[float] = []
            for j, element in where:
                g = np.ravel(grads[j])
                row += list(g) if element is None else [g[element]]
            rows.append(row)
        J = np.array(rows, dtype=np.float64).reshape(len(outputs), -1)
        return (J, values) if has_aux else J

    @user_facing
    def run(*args, **kwargs) -> np.ndarray | tuple:
        args = positional(fn, args, kwargs)
        kind = call_kind(args)
        if kind in places:
            return direct(args, *places[kind])
        m = runner.forward(args)
        values = m.results()
        fnobj = m.stack[0].fn
        seeds = [find_argument(m.bindings, fnobj, o, "output") for o in outputs]
        cols = [find_argument(m.bindings, fnobj, w, "wrt", whole_arrays=True) for w in wrt]
        where = [(m.bindings.index(b), element) for b, element in cols]
        chosen = frozenset(j for j, _ in where)
        if not any(b.complex for b in m.bindings):
            if chosen not in cores:
                cores[chosen] = [_value_and_grad(fn, o, machine_options, True, chosen)
                                 for o in outputs]
            places[kind] = where, cores[chosen]
        by = runner
        if len(chosen) < len(m.bindings):   # (the pass the columns need, as later calls run
            by = Pass(fn, machine_options, chosen)      # it: a pullback into an argument not
            m = by.forward(args)            # asked for may fail, as sqrt's at 0 does)
        rows = []
        for k, seed in enumerate(seeds):
            if k:       # (from the arguments, as each later call's row starts: the inputs
                m = by.forward(args)    # a backward pass rebuilds are a few bits off
                # where the program's float arithmetic does not undo exactly)
            grads = by.backward(m, seed)
            grads = tuple(g if j in chosen else None for j, g in enumerate(grads))
            if not finite(grads):       # (as a value_and_grad call of this output says it)
                raise not_finite(by, args, outputs[k], grads)
            row: list[float] = []
            for b, element in cols:
                g = grads[m.bindings.index(b)]
                row += list(np.ravel(g)) if element is None else [np.ravel(g)[element]]
            rows.append(row)
        J = np.array(rows, dtype=np.float64).reshape(len(seeds), -1)
        return (J, values) if has_aux else J

    def batch(columns: list):
        """Jacobians (and values) for rows of scalar arguments in one native call, or None
        (the caller loops over the rows)."""
        first = first_row(columns)
        key = tuple(map(type, first))
        if key not in plans:
            plans[key] = jacobian_plan(runner, first, outputs, wrt)
        plan = plans[key]
        if plan is None:
            return None
        loop, budget, params, S, picks = plan
        n = len(columns[0])
        cols = batch_columns(columns, params, loop)
        outs = [np.empty(n, c.dtype) for c in cols]
        G = np.empty((n, S.shape[0], S.shape[1]))
        try:
            on_threads(loop, n, (budget,), cols, (S,), outs + [G])
        except Exception:      # a row failed: the row-by-row path finds and reports it
            return None
        if not finite(G[:, :, picks]):      # (a gradient not finite: so does that path)
            return None
        J = G[:, :, picks]
        return (J, tuple(outs)) if has_aux else J

    run.batch = batch
    run.differentiated = fn         # (rvm.vmap names arguments by its parameters)
    return run


def jacobian_plan(runner: Pass, args: tuple, outputs, wrt) -> tuple | None:
    """The native Jacobian loop for these argument types (a scalar program on the native
    or auto engine), its seeds (one row per output) and the columns `wrt` picks."""
    from ..engines import native
    from ..engines.compiled import compiled
    m = runner.forward(args)              # validates the arguments and names
    fn = m.stack[0].fn
    if m.engine not in ("native", "auto") or not native.available or \
            len(fn.params) != len(args) or m.said_cells or not m.fits():
        return None
    comp = compiled(m.program, m.checks, native=True)
    if comp.uses_heap or any(b.is_array or b.complex for b in m.bindings):
        return None
    floats = [k for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
    seeds = [find_argument(m.bindings, fn, o, "output") for o in outputs]
    cols = [find_argument(m.bindings, fn, w, "wrt", whole_arrays=True) for w in wrt]
    S = np.zeros((len(seeds), len(floats)))
    for r, (b, _) in enumerate(seeds):
        S[r, floats.index(b.params[0])] = 1.0
    picks = [floats.index(b.params[0]) for b, _ in cols]
    loop = comp.bind(m)[comp.name(fn.name, "jsb")]
    return loop, m.max_steps, fn.params, S, picks
