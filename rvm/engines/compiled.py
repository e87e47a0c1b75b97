"""The compiled engine: each bytecode function becomes one generated Python function.

Registers become local variables and control flow a small loop over basic blocks, so a run
costs Python statements instead of one closure call per instruction. The instruction bodies
come from the same templates as the interpreter (rvm.core.isa, rendered by
rvm.engines.templates), and no backward semantics are written here at all: the backward
function of `f` is the forward function of `f`'s bytecode inverse (rvm.core.inverse:
reversed, each instruction inverted, branches and comefroms swapping roles), and the
gradient pass is the forward run of that inverse with each float instruction switched to
its adjoint.

    fw   f forwards                gfw   f forwards, inverting adjoint steps
    bw   invert(f) forwards        gbw   invert(f) forwards with adjoints (the gradient pass)

The stepping interpreter stays the reference (and the debugger's engine); the tests check
that both give the same results.
"""

from __future__ import annotations

import functools
import math
import re

from ..core import isa
from ..core.errors import InvertibilityError, MachineError
from ..core.inverse import inverse_function
from ..core.program import Function, Program, Reg
from . import templates
from .templates import Fault, Limit, Operands, condition, esc, fault, render, shows

MODES = {"fw": (False, False), "bw": (True, False), "gfw": (False, True), "gbw": (True, True)}


# the interpreter re-runs a failed pass and reports which it was, and where
BUDGET_OR_FINITE = ("raise Limit('step budget exhausted, or a float result not finite "
                    "(the interpreter tells which)')")


def _local(reg: Reg) -> tuple[str, str]:
    return (f"r{reg.n}", f"gr{reg.n}") if reg.cls == isa.INT else (f"f{reg.n}", f"gf{reg.n}")


def _repeated(ins, checked: set) -> bool:
    """Is ins an ASSERT already made, on registers nothing has changed since (the frontend
    mirrors each check so that either direction checks before it acts: the mirror is
    redundant in the direction that has just checked)? Updates `checked`."""
    if ins.op.startswith("ASSERT"):
        key = (ins.op, ins.args)
        if key in checked:
            return True
        checked.add(key)
        return False
    if ins.op in isa.CALLS:
        checked.clear()
        return False
    written = {a for a, k in zip(ins.args, ins.spec.kinds) if k in "DX"}
    if written:
        for key in [c for c in checked if written & set(c[1])]:
            checked.discard(key)
    return False


class _Writer:
    """Python source for one function in one mode."""

    def __init__(self, compiled: Compiled, fn: Function, gradient: bool):
        self.c, self.fn, self.gradient = compiled, fn, gradient
        self.lines: list[str] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def params(self) -> list[str]:
        names = [_local(p)[0] for p in self.fn.params]
        if self.gradient:
            names += [_local(p)[1] for p in self.fn.params if p.cls == isa.FLOAT]
        return names

    def arrive(self, depth: int, i: int, jumped: bool) -> None:
        """Checks a comefrom makes when control arrives at instruction i."""
        if not self.c.checks or i >= len(self.fn.code):
            return
        ins = self.fn.code[i]
        cc = isa.condition(ins.op)
        if ins.op not in isa.COMEFROMS or cc is None:
            return
        ops = Operands(self.fn, ins, {}, _local)
        cond = condition(ops, cc)
        label = esc(ins.args[-1])
        if jumped:
            self.emit(depth, f"if not ({cond}): " + fault(
                f"{self.fn.name}: comefrom at {label}: arrived by its jump, but "
                f"{shows(ops, cc)} is false"))
        else:
            self.emit(depth, f"if {cond}: " + fault(
                f"{self.fn.name}: comefrom at {label}: entered by fall-through, but "
                f"{shows(ops, cc)} holds"))

    def call(self, depth: int, ins) -> None:
        callee = self.c.program.functions[ins.args[0].name]
        regs = list(ins.args[1:])
        forward = ins.op == "CALL"
        mode = ("g" if self.gradient else "") + ("fw" if forward else "bw")
        outs = [_local(r)[0] for r in regs]
        if self.gradient:
            outs += [_local(r)[1] for r, p in zip(regs, callee.params) if p.cls == isa.FLOAT]
        target = self.c.name(callee.name, mode)
        self.emit(depth, "M.budget = _n")
        self.emit(depth, f"{', '.join(outs)}, = {target}(M, {', '.join(outs)})")
        self.emit(depth, "_n = M.budget")

    def instruction(self, depth: int, ins) -> None:
        spec = ins.spec
        ops = Operands(self.fn, ins, {}, _local)
        if self.gradient and ops.cls == isa.FLOAT:
            template = isa.OPS[spec.inverse].adjoint
        else:
            template = spec.forward[ops.cls]
        for line in render(template, ops, deferred=True):
            self.emit(depth, line)

    def resolve(self, target: int, jumped: bool) -> tuple[list[tuple[int, bool]], int]:
        """The arrivals a transfer to `target` makes, and the instructions it passes: a
        block that only jumps on (a JMP, or a comefrom right before one) is passed through
        to its jump's target."""
        code, path, passed = self.fn.code, [(target, jumped)], 0
        while target < len(code) and len(path) < 8:
            if code[target].op == "JMP":
                nxt = target
            elif code[target].op in isa.COMEFROMS and target + 1 < len(code) and \
                    code[target + 1].op == "JMP":
                nxt = target + 1
            elif code[target].op in isa.COMEFROMS and target + 1 in self.block:
                target += 1             # a block that is only a comefrom: fall through
                path.append((target, False))
                passed += 1
                continue
            else:
                break
            passed += nxt - target + 1
            target = self.fn.labels[code[nxt].args[0].name]
            path.append((target, True))
        return path, passed

    def block_of(self, target: int) -> int:
        return self.block.get(target, -1) if target < len(self.fn.code) else -1

    def goto(self, depth: int, k: int, target: int, jumped: bool) -> None:
        """Transfer control: the comefroms' checks, then the next block (`continue` when a
        block loops onto itself, inside its own `while True`)."""
        path, passed = self.resolve(target, jumped)
        for t, j in path:
            self.arrive(depth, t, j)
        if passed:
            self.emit(depth, f"_n -= {passed}")
        b = self.block_of(path[-1][0])
        if 0 <= b <= k:                 # a back edge: the only way to run for ever
            self.emit(depth, "if _n < 0 or _fin != 0.0: " + BUDGET_OR_FINITE)
        if b == k and self.inner:
            self.emit(depth, "continue")
            return
        self.emit(depth, f"_b = {b}")
        if self.inner:
            self.emit(depth, "break")

    def targets(self, start: int, end: int) -> set[int]:
        """Blocks that block [start, end) can transfer control to."""
        code, out = self.fn.code, set()
        last = code[end - 1]
        if last.op in isa.BRANCHES:
            target = self.fn.labels[last.args[-1].name]
            out.add(self.block_of(self.resolve(target, True)[0][-1][0]))
        if last.op != "JMP":            # fall-through (or a conditional branch not taken)
            out.add(self.block_of(self.resolve(end, False)[0][-1][0]))
        return out

    def source(self, name: str) -> str:
        fn, code = self.fn, self.fn.code
        n = len(code)
        leaders = sorted({0} | {i for i, ins in enumerate(code) if ins.op in isa.COMEFROMS}
                         | {i + 1 for i, ins in enumerate(code) if ins.op in isa.BRANCHES})
        leaders = [b for b in leaders if b < n] or [0]
        self.block = {start: k for k, start in enumerate(leaders)}
        self.emit(1, f"def {name}(M, {', '.join(self.params())}):")
        params = set(fn.params)
        for r in fn.registers:
            value, shadow = _local(r)
            if r not in params:
                self.emit(2, f"{value} = {'0' if r.cls == isa.INT else '0.0'}")
            if self.gradient and r.cls == isa.FLOAT and r not in params:
                self.emit(2, f"{shadow} = 0.0")
        self.arrive(2, 0, False)
        self.emit(2, "_n = M.budget")
        self.emit(2, "_fin = 0.0")
        loop = len(leaders) > 1
        if loop:
            self.emit(2, "_b = 0")
            self.emit(2, "while _b >= 0:")
        for k, start in enumerate(leaders):
            end = leaders[k + 1] if k + 1 < len(leaders) else n
            depth = 2
            self.inner = False
            if loop:
                self.emit(3, f"{'if' if k == 0 else 'elif'} _b == {k}:")
                depth = 4
                if k in self.targets(start, end):     # the block loops onto itself
                    self.emit(4, "while True:")
                    self.inner, depth = True, 5
            # the step budget counts instructions as the interpreter does (a call: two
            # steps, entering and leaving, besides the callee's own), charged per block
            cost = sum(2 if ins.op in isa.CALLS else 1 for ins in code[start:end])
            self.emit(depth, f"_n -= {cost}")
            last = None
            before = len(self.lines)
            checked: set = set()        # ASSERTs made in this block on unchanged registers
            for i in range(start, end):
                ins = code[i]
                last = ins
                if ins.op in isa.COMEFROMS or _repeated(ins, checked):
                    continue
                if ins.op in isa.BRANCHES:
                    t = fn.labels[ins.args[-1].name]
                    if ins.op == "JMP":
                        self.goto(depth, k, t, True)
                    else:
                        ops = Operands(fn, ins, {}, _local)
                        self.emit(depth, f"if {condition(ops, isa.condition(ins.op))}:")
                        self.goto(depth + 1, k, t, True)
                        self.emit(depth, "else:")
                        self.goto(depth + 1, k, i + 1, False)
                elif ins.op in isa.CALLS:
                    self.call(depth, ins)
                else:
                    self.instruction(depth, ins)
            if last is None or last.op not in isa.BRANCHES:
                if loop:
                    self.goto(depth, k, end, False)
                else:
                    self.arrive(depth, end, False)
            if len(self.lines) == before:
                self.emit(depth, "pass")
        if self.c.checks:
            for r in fn.locals:
                value = _local(r)[0]
                test = f"{value} != 0" if r.cls == isa.INT else f"abs({value}) > M.tol"
                self.emit(2, f"if {test}: " + fault(
                    f"{fn.name}: local {r} = {{{value}!r}} not restored to zero when "
                    "leaving the frame"))
        self.emit(2, "if _n < 0 or _fin != 0.0: " + BUDGET_OR_FINITE)
        self.emit(2, "M.budget = _n")
        self.emit(2, f"return ({''.join(p + ', ' for p in self.params())})")
        return "\n".join(self.lines)


class Compiled:
    """The generated functions of one program (all four modes of every function)."""

    def __init__(self, program: Program, checks: bool = True, native: bool = False):
        self.program, self.checks, self.native = program, checks, native
        self.names = {name: f"F{k}" for k, name in enumerate(program.functions)}
        parts = ["def make(Fault, Limit, wrap, zero, sign, dpow_db, math):"]
        self.bodies = {}
        for fname, fn in program.functions.items():
            inverse = inverse_function(fn)
            for mode, (backward, gradient) in MODES.items():
                writer = _Writer(self, inverse if backward else fn, gradient)
                body = writer.source(self.name(fname, mode))
                self.bodies[self.name(fname, mode)] = body
                # generated Python: direct assignments, finiteness once per straight run,
                # math functions as local names
                parts.append(re.sub(r"\bmath\.(\w+)\(", r"_math_\1(",
                                    "\n".join(templates.straighten(body.split("\n")))))
        used = sorted(set(re.findall(r"\b_math_(\w+)\(", "\n".join(parts))))
        parts[1:1] = [f"    _math_{name} = math.{name}" for name in used]
        parts.append("    return {" + ", ".join(
            f"'{self.name(f, m)}': {self.name(f, m)}" for f in program.functions
            for m in MODES) + "}")
        self.source = "\n".join(parts) + "\n"
        namespace: dict = {}
        exec(compile(self.source, "<rvm compiled>", "exec"), namespace)  # from verified code
        self._make = namespace["make"]
        self._native: dict = {}

    def name(self, function: str, mode: str) -> str:
        return f"{self.names[function]}_{mode}"

    def bind(self, machine) -> dict:
        if self.native:         # compiled once per tolerance, then shared
            key = (machine.tol,)
            if key not in self._native:
                from . import native
                self._native[key] = native.Functions(self, *key)
            return self._native[key]
        zero = lambda v: abs(v) <= machine.tol
        return self._make(Fault, Limit, templates.wrap, zero, templates.sign, templates.dpow_db,
                          math)

    @functools.cached_property
    def native_bodies(self) -> str:
        """The generated functions of every mode, rewritten for native code (numba's or
        LLVM's: rvm.engines.native, rvm.engines.llvm); made once, read by each build."""
        from . import native
        return native.defer_checks("\n".join(
            native.rewrite(line[4:]) for body in self.bodies.values()
            for line in body.split("\n"))) + "\n"

    def native_source(self) -> tuple[str, list[str]]:
        """The generated functions rewritten for numba, with the fused and batch
        functions, and their names (text only: rvm.engines.native compiles it)."""
        source = self.native_bodies
        source += "\n".join(self.fused(f) for f in self.program.functions.values()) + "\n"
        names = list(self.bodies) + [self.name(f, "vg") for f in self.program.functions]
        if not self.uses_heap:     # scalars only: no arrays to pass at all
            source += "\n".join(self.fused(f, heap=False) + self.batch(f) + self.jacobian(f)
                                + self.calls(f, "csb") + self.calls(f, "usb")
                                for f in self.program.functions.values()) + "\n"
            names += [self.name(f, m) for f in self.program.functions
                      for m in ("vgs", "vgsb", "jsb", "csb", "usb")]
        return source, names

    @property
    def uses_heap(self) -> bool:
        return any(ins.spec.group == "memory" for f in self.program.functions.values()
                   for ins in f.code)

    def fused(self, fn: Function, heap: bool = True) -> str:
        """A native function running fn forwards then its gradient pass (one call for a
        whole value-and-gradient). Without heap, for programs that never touch it, the
        caller passes two small arrays it keeps (the heap top and budget T, an unused
        cell H), and the function is self-contained: allocating the arrays here, or
        calling the heap version, would cost the first call about a second more of numba
        compiling, for a tenth of a microsecond saved per call."""
        params = [f"a{k}" for k in range(len(fn.params))]
        seeds = [f"s{k}" for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
        outs = [f"o[{k}]" for k in range(len(fn.params))]
        if heap:
            head = f"def {self.name(fn.name, 'vg')}(HI, HF, HG, TOP, "
            arrays, top, start = "HI, HF, HG, TOP", "TOP", "    t0, b0 = TOP[0], TOP[1]\n"
        else:
            head = f"def {self.name(fn.name, 'vgs')}(T, H, b0, "
            arrays, top, start = "T, H, H, T", "T", "    t0 = T[0] = 0\n    T[1] = b0\n"
        return (head + f"{', '.join(params + seeds)}):\n" + start +
                f"    o = {self.name(fn.name, 'fw')}({arrays}, {', '.join(params)})\n"
                f"    if {top}[0] != t0:\n"
                "        raise Fault('heap block left allocated')\n"
                f"    {top}[1] = b0\n"
                f"    g = {self.name(fn.name, 'gbw')}({arrays}, {', '.join(outs + seeds)})\n"
                f"    {top}[1] = b0\n"
                "    return o, g\n")

    def batch(self, fn: Function) -> str:
        """A native loop over rows of fused value-and-gradient calls (rvm.vmap of a
        gradient): one call for a whole batch, arguments and results as arrays."""
        n = len(fn.params)
        floats = [k for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
        a, s = [f"a{k}" for k in range(n)], [f"s{j}" for j in range(len(floats))]
        o, g = [f"o{k}" for k in range(n)], [f"g{j}" for j in range(len(floats))]
        body = _rows(f"{self.name(fn.name, 'vgsb')}(budget, {', '.join(a + s + o + g)})") + [
                f"        o, g = {self.name(fn.name, 'vg')}(hi, hf, hg, top, "
                f"{', '.join(x + '[i]' for x in a)}{', ' if s else ''}{', '.join(s)})"]
        body += [f"        o{k}[i] = o[{k}]" for k in range(n)]
        body += [f"        g{j}[i] = g[{n + j}]" for j in range(len(floats))]
        return "\n".join(body) + "\n"

    def calls(self, fn: Function, mode: str) -> str:
        """A native loop over rows of whole calls (mode csb) or uncalls (usb) of fn, for
        rvm.vmap of a function: arguments and results as arrays, one per parameter."""
        n = len(fn.params)
        a, o = [f"a{k}" for k in range(n)], [f"o{k}" for k in range(n)]
        run = self.name(fn.name, "fw" if mode == "csb" else "bw")
        body = _rows(f"{self.name(fn.name, mode)}(budget, {', '.join(a + o)})") + [
                f"        o = {run}(hi, hf, hg, top, {', '.join(x + '[i]' for x in a)})"]
        body += [f"        o{k}[i] = o[{k}]" for k in range(n)]
        return "\n".join(body) + "\n"

    def jacobian(self, fn: Function) -> str:
        """A native loop over rows of Jacobians (rvm.vmap of rvm.jacobian): per row, one
        forward run, then one gradient pass per output, each from the forward run's
        results (a scalar program leaves nothing else behind), seeded by a row of S.
        Values go to o0, o1, ... (one array per parameter), gradients to G (rows x outputs
        x float parameters)."""
        n = len(fn.params)
        floats = [k for k, p in enumerate(fn.params) if p.cls == isa.FLOAT]
        a = [f"a{k}" for k in range(n)]
        outs = ", ".join(f"o[{k}]" for k in range(n))
        seeds = ", ".join(f"S[s, {j}]" for j in range(len(floats)))
        body = _rows(f"{self.name(fn.name, 'jsb')}(budget, {', '.join(a)}, S, "
                     f"{', '.join(f'o{k}' for k in range(n))}, G)") + [
                f"        o = {self.name(fn.name, 'fw')}(hi, hf, hg, top, "
                f"{', '.join(x + '[i]' for x in a)})"]
        body += [f"        o{k}[i] = o[{k}]" for k in range(n)]
        body += ["        for s in range(S.shape[0]):",
                 "            top[1] = budget",
                 f"            g = {self.name(fn.name, 'gbw')}(hi, hf, hg, top, {outs}, {seeds})"]
        body += [f"            G[i, s, {j}] = g[{n + j}]" for j in range(len(floats))]
        return "\n".join(body) + "\n"

    @staticmethod
    def heap(machine) -> tuple:
        """numpy views of the machine's heap for native code (remade when it grows); the
        last holds the heap top and the step budget of a run."""
        import numpy as np
        cached = machine.__dict__.get("_native_heap")
        if cached is None or cached[0] is not machine._buf:
            if len(machine._buf) < 8:   # never: native code masks bad addresses to cell 0
                raise MachineError("the native engine needs a heap of at least one cell",
                                   "")
            hi = np.frombuffer(machine._buf, dtype=np.int64)
            cached = (machine._buf, hi, hi.view(np.float64),
                      np.frombuffer(machine._gbuf, dtype=np.float64), np.zeros(2, np.int64))
            machine._native_heap = cached
        cached[4][0], cached[4][1] = machine.top, machine.max_steps
        return cached[1:]

    def run(self, machine, direction: int) -> None:
        """Run the machine's root frame to its end (or start) in one compiled call."""
        fr = machine.stack[0]
        fn = fr.fn
        e = fr.dir * direction
        grad = machine.grad
        mode = ("g" if grad else "") + ("fw" if e > 0 else "bw")
        funcs = machine._compiled_functions
        if funcs is None:
            funcs = machine._compiled_functions = self.bind(machine)
        R, slots = fr.R, fn.param_slots
        args = [R[k] for k in slots]
        floats = [k for p, k in zip(fn.params, slots) if p.cls == isa.FLOAT]
        if grad:
            args += [fr.G[k] for k in floats]
        machine.budget = machine.max_steps
        heap = self.heap(machine) if self.native else (machine,)
        function = funcs[self.name(fn.name, mode)]
        try:
            if self.native:
                from .native import compiling
                with compiling(self.program.source or fn.name, function):
                    out = function(*heap, *args)
            else:
                out = function(*heap, *args)
        except Fault as exc:
            raise InvertibilityError(f"{exc} (compiled engine; use engine='interp' to see "
                                     "the instruction)", fn.name) from None
        except RecursionError:
            raise MachineError("call depth limit exceeded (unbounded recursion?)",
                               fn.name) from None
        except (ArithmeticError, ValueError) as exc:
            raise MachineError(f"arithmetic error: {exc}", fn.name) from None
        if self.native:
            machine.top = int(heap[3][0])
            out = [v.item() if hasattr(v, "item") else v for v in out]
        for k, v in zip(slots, out):
            R[k] = v
        if grad:
            for k, g in zip(floats, out[len(slots):]):
                fr.G[k] = g
        fr.state = 2 * len(fn.code) if e > 0 else 0


def _rows(signature: str) -> list[str]:
    """The head of a native loop over the rows of a batch of scalar calls: the (unused)
    heap arrays made once per batch, not once per row, and each row's heap top and step
    budget set afresh."""
    return [f"def {signature}:",
            "    hi = np.zeros(1, np.int64)",
            "    hf = hi.view(np.float64)",
            "    hg = np.zeros(1)",
            "    top = np.zeros(2, np.int64)",
            "    for i in range(a0.shape[0]):",
            "        top[0] = 0",
            "        top[1] = budget"]


def compiled(program: Program, checks: bool = True, native: bool = False) -> Compiled:
    key = ("compiled", checks, native)
    if key not in program.cache:
        program.cache[key] = Compiled(program, checks, native)
    return program.cache[key]
