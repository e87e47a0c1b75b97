"""The compiled engine: each bytecode function becomes one generated Python function.

Registers become local variables (in native code's text each declared with its type: see
TYPES), and control flow a small loop over basic blocks, so a run costs Python statements
instead of one closure call per instruction. The instruction bodies come from the same
templates as the interpreter (rvm.core.isa, rendered by rvm.engines.templates), and no
backward semantics are written here at all: the backward function of `f` is the forward
function of `f`'s bytecode inverse (rvm.core.inverse: reversed, each instruction
inverted, branches and comefroms swapping roles), and the gradient pass is the forward
run of that inverse with each float instruction switched to its adjoint.

    fw   f forwards                gfw   f forwards, inverting adjoint steps
    bw   invert(f) forwards        gbw   invert(f) forwards with adjoints (the gradient pass)
    fws  f forwards to its copy    gbws  the gradient pass from there (a compute-copy-
                                         uncompute f: see split_point)

The stepping interpreter stays the reference (and the debugger's engine); the tests check
that both give the same results.
"""

from __future__ import annotations

import functools
import math
import re
import threading

import attrs

from ..core import isa
from ..core.errors import InvertibilityError, MachineError
from ..core.inverse import inverse_function
from ..core.program import INT64_MAX, INT64_MIN, Function, Imm, Label, Mem, Program, Reg
from ..core.program import Instruction as _Instruction
from . import affine, templates
from .templates import (
    LAST,
    LEFT,
    NO_STOP,
    NOW,
    RESUME,
    ROOT,
    SHADOWS,
    SHADOWS_BAD,
    SNAP,
    STATE,
    STOP,
    Fault,
    Limit,
    Operands,
    condition,
    esc,
    fault,
    render,
    show_value,
    shows,
)

_COMPILING = threading.RLock()      # one native compile at a time (Compiled.bind)

MODES = {"fw": (False, False), "bw": (True, False), "gfw": (False, True), "gbw": (True, True)}


# the interpreter re-runs a failed pass and reports which it was, and where
BUDGET_OR_FINITE = ("raise Limit('step budget exhausted, or a float result not finite "
                    "(the interpreter tells which)')")


def _local(reg: Reg) -> tuple[str, str]:
    return (f"r{reg.n}", f"gr{reg.n}") if reg.cls == isa.INT else (f"f{reg.n}", f"gf{reg.n}")


# Native code's generated functions are typed: each parameter is annotated and every
# other local declared (`f3: float`) before the body, so that the back end reads each
# local's type from the code itself (rvm.engines.lowering), never from its name. (The
# Python engine's text, which needs no types, goes without: they made it a fifth
# longer.) Besides the registers and their shadows, the locals a generated function may
# use: the step budget left and the finiteness sum (always), the block to run next (a
# function of several blocks), the derivatives' largest magnitude (derived_registers),
# a heap address (an instruction with a memory operand: rvm.engines.templates,
# Operands) and the instruction table's temporaries (rvm.core.isa.TEMPORARIES, in the
# templates that use them)
TYPES = {isa.INT: "int", isa.FLOAT: "float"}
_LET = re.compile(r"^let (\w+) =", re.M)


def _scratch(fn: Function, loop: bool, derived: bool) -> dict[str, str]:
    """The locals besides registers and shadows that fn's generated function declares."""
    out = {"_n": "int", "_fin": "float", "_lost": "float"}
    if loop:
        out["_b"] = "int"
    if derived:
        out["_s"] = "float"
    if any(isinstance(a, Mem) for ins in fn.code for a in ins.args):
        out["_a"] = "int"
    specs = {ins.spec.name: ins.spec for ins in fn.code}
    for spec in specs.values():
        for template in (*spec.forward.values(), spec.adjoint or ""):
            for name in _LET.findall(template):
                out[name] = TYPES[isa.TEMPORARIES[name]]
    return out


# Program.cache key of a derived program's (rvm.ad.transforms) {function: the number of
# float registers of the function it was derived from}: its float registers from there on
# are derivatives (shadows, tangents, their temporaries) of the source's
DERIVED = "derived"


def derived_registers(program: Program, fn: Function) -> list[Reg] | None:
    """The float registers of fn that hold derivatives (fn is a function of a derived
    program, DERIVED), or None if fn is not derived.

    Their values can be far larger than the source's, and a source ancilla restored only
    approximately (within tol, as a dirty ancilla is) leaves in the derived ancillas the
    rounding of those magnitudes. So the zero test of a derived ancilla (a float local
    among them) on leaving a frame scales with them: |x| <= tol * max(1, m), where m is
    the largest magnitude any derived register has held in the run so far (after an
    instruction of its frame wrote it, or a call it was passed to returned): the
    interpreter's Machine.dscale; the python engine's generated code keeps it in `_s`
    and hands it on through M.dscale at calls and returns. Native code tests with tol
    alone: where that fails, the interpreter runs the pass again, and decides."""
    n = program.cache.get(DERIVED, {}).get(fn.name)
    if n is None:
        return None
    return [r for r in fn.registers if r.cls == isa.FLOAT and r.n >= n]


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
    written = set(ins.written)
    if written:
        for key in [c for c in checked if written & set(c[1])]:
            checked.discard(key)
    return False


def _cost(code) -> int:
    """Steps the interpreter counts for these instructions (a call: entering and leaving)."""
    return sum(2 if ins.op in isa.CALLS else 1 for ins in code)


# native code of a function without loops that can take more steps than this (its calls'
# included) tests the step budget before its calls (see Compiled.tested), those at most
# SPAN steps apart (see _reach)
TESTED_ABOVE, SPAN = 1 << 12, 1 << 10


def _reach(fn: Function, tested, most, every: bool) -> tuple[list[int], set[int]]:
    """Where fn's native code tests the step budget at a call, and for each instruction i
    of fn (and its end, len(fn.code)) the most steps the interpreter counts from before i
    to the next such test or back edge (from the end: the caller's step out of the call,
    1). The calls tested: those of a function that tested(name) says tests its own; with
    `every` (fn itself tests: Compiled.tested, or it loops), also a call of a function
    without loops from which the steps to the next test would pass SPAN (a call of a
    few steps in a run of thousands is not: a loop's pass of a hundred calls of 3,000
    steps each is). most: a callee's most steps (None: it loops, and tests the budget
    at its own back edges)."""
    code = fn.code
    reach, calls = [0] * len(code) + [1], set()
    for i in reversed(range(len(code))):
        ins = code[i]
        after = [] if ins.op == "JMP" else [reach[i + 1]]
        if ins.op in isa.BRANCHES:
            t = fn.labels[ins.args[-1].name]
            after.append(reach[t] if t > i else 0)
        step = 1
        if ins.op in isa.CALLS:
            name = ins.args[0].name
            step = 2 + (most(name) or 0)
            if tested(name) or (every and most(name) is not None and
                                step + max(after) > SPAN):
                calls.add(i)
                continue
        reach[i] = max(after) + step
    return reach, calls


def _written(ins) -> set:
    """The registers ins may change (a call: all it passes, by reference)."""
    return set(ins.args[1:] if ins.op in isa.CALLS else ins.written)


def _mentioned(ins) -> set:
    return _mentioned_args(ins.args)


def _mentioned_args(args) -> set:
    return {r for a in args for r in ((a,) if isinstance(a, Reg) else
                                      a.regs if isinstance(a, Mem) else ())}


# Exactly-zero float registers (native code). The frontend reads a value into a zeroed
# ancilla, uses it and takes it back out (`t += e ... t -= e`): as written, each pass
# around a loop waits for the ancilla's previous add and subtract, a chain LLVM may not
# cut (x + e - e is not x in floating point). Where the register is known to hold +0.0,
# `t = 0.0 + e` and then `t = e - e` compute the same values, bit for bit (nan and inf
# included), without reading t.
_HEAP_WRITES = frozenset({"EXCH", "PUSH", "POP", "ALLOC", "FREE"}) | isa.CALLS | isa.ARRAYS


def _accumulates(ins) -> tuple | None:
    """(sign, value) for a float `d (+|-)= value` (ADD, SUB and their families, ADDM,
    SUBM): the value as its operation and operands."""
    head, _, family = ins.op.partition(".")
    if head not in ("ADD", "SUB", *isa.READS) or not isinstance(ins.args[0], Reg) or \
            ins.args[0].cls != isa.FLOAT:
        return None
    return ("+" if head.startswith("ADD") else "-"), (head in isa.READS, family, ins.args[1:])


class _Known:
    """What native code may know about the float registers at a point, stepped through a
    block's instructions: which hold +0.0; which were accumulated into from +0.0 and not
    changed since (pending: `d = 0.0 + e`, until its opposite with the same value, nothing
    it reads changed since, cancels it: `d = e - e`); which cannot hold -0.0 (plus: a sum
    is -0.0 only if both terms are, so a register that starts at +0.0 and is only
    accumulated into never is); which hold a heap cell as read, not yet `0.0 + cell`
    (raw: the two differ only for a cell holding -0.0); and in a gradient pass, which
    shadows hold 0.0 (an update that adds or scales only zero shadows is left out).

    A raw register is made by a read into a known-zero register (`d = cell`, one addition
    fewer per read: the element loops of the frontend read every operand so). Where it
    is a factor of a product accumulated into a register that cannot hold -0.0, and (in a
    gradient pass) the product's other factors' shadows are zero, the raw value gives the
    same results: at most the sign of a zero product changes, and x + 0.0 == x + -0.0
    for every x but -0.0. Before any other use, and on leaving the function, the register
    is made `0.0 + cell` (self.canon: the registers to do that for before the
    instruction)."""

    def __init__(self, zeros=(), gzeros=(), pending=None, plus=(), raw=(), lent=None,
                 used=()):
        self.zeros, self.gzeros = set(zeros), set(gzeros)
        # raw registers read as a factor of a product (on every way here): an inf or nan
        # they hold went into the product's register, which is tested later, so their
        # cancel `d = cell - cell` needs no test of its own (see _exact)
        self.used = set(used)
        self.pending = dict(pending or {})
        self.plus, self.raw = set(plus), set(raw)
        # registers exchanged into a cell: {register: (the cell, was it zero, plus)}; the
        # same exchange again, the cell not written since, gives the register back
        self.lent = dict(lent or {})
        self.canon: list = []

    def copy(self) -> _Known:
        return _Known(self.zeros, self.gzeros, self.pending, self.plus, self.raw, self.lent,
                      self.used)

    def meet(self, other: _Known) -> _Known:
        """What holds on both ways in (a register raw on either way may be raw)."""
        return _Known(self.zeros & other.zeros, self.gzeros & other.gzeros,
                      {r: v for r, v in self.pending.items() if other.pending.get(r) == v},
                      self.plus & other.plus, self.raw | other.raw,
                      {r: v for r, v in self.lent.items() if other.lent.get(r) == v},
                      self.used & other.used)

    def __eq__(self, other) -> bool:
        return isinstance(other, _Known) and (self.zeros, self.gzeros, self.pending,
                                              self.plus, self.raw, self.lent,
                                              self.used) == \
            (other.zeros, other.gzeros, other.pending, other.plus, other.raw, other.lent,
             other.used)

    def _raw_ok(self, ins, acc, gradient: bool) -> bool:
        """May ins read its raw registers as they are (a product accumulated as above)?"""
        if acc is None or acc[1][1] != "mul" or acc[1][0]:
            return False
        d, a, b = ins.args
        factors = {x for x in (a, b) if isinstance(x, Reg)}
        return d not in self.raw and d in self.plus and d not in factors and \
            (not gradient or factors <= self.gzeros)

    def step(self, ins, gradient: bool) -> str | None:
        """Account for ins; the template to emit for it (None: the usual one)."""
        acc = _accumulates(ins)
        d = ins.args[0] if acc else None
        # (ZERO of a register known to hold 0.0 needs no test: it holds +0.0, or `e - e`
        # for an e tested finite where it was accumulated into the register: _exact)
        cleared = ins.op == "ZERO" and ins.args[0] in self.zeros
        action = None
        if acc and d in self.zeros:
            action = "fresh"
        elif acc and self.pending.get(d) == ("-" if acc[0] == "+" else "+", acc[1]):
            action = "cancel"
        # (a comparison does not tell -0.0 from +0.0)
        # (a call: every raw register, since a callee out of steps leaves this frame's
        # registers at the call for the machine: see _Writer.goto)
        read = set(self.raw) if ins.op in isa.CALLS else \
            _mentioned(ins) & self.raw if ins.spec.group != "control" else set()
        if action == "cancel":
            read.discard(d)                     # `d = e - e` does not read d
        self.canon = [] if not read or self._raw_ok(ins, acc, gradient) else \
            sorted(read, key=str)
        self.raw -= set(self.canon)
        if read and not self.canon:     # (factors of a product)
            self.used |= read
        # a raw register's cancel where no product took it: `cell - cell`, tested
        untested = action == "cancel" and d in self.raw and d not in self.used
        template = None
        raw = action == "fresh" and acc[0] == "+" and acc[1][0]
        if ins.op not in isa.CALLS and ins.spec.group != "control":
            template = _exact(_template(ins, gradient), "raw" if raw else action, untested)
            if cleared:
                template = "\n".join(line for line in template.splitlines()
                                      if not line.startswith("check "))
            if gradient:
                template = self.shadows(ins, template)
        elif ins.op in isa.CALLS:
            self.gzeros -= set(ins.args[1:])
        written, heap = _written(ins), ins.op in _HEAP_WRITES
        for r, (_, (memory, _, args)) in list(self.pending.items()):
            if r in written or (memory and heap) or written & _mentioned_args(args):
                del self.pending[r]
        back = None
        if ins.op == "EXCH" and ins.args[0].cls == isa.FLOAT:
            back = self.lent.pop(ins.args[0], None)
            back = back[1:] if back is not None and back[0] == ins.args[1] else None
        for r, (m, _, _) in list(self.lent.items()) if heap or written else ():
            if heap or written & _mentioned_args((m,)):
                del self.lent[r]
        if ins.op == "EXCH" and ins.args[0].cls == isa.FLOAT and back is None:
            x = ins.args[0]
            self.lent[x] = (ins.args[1], x in self.zeros, x in self.plus)
        swapped = [[a in s for a in ins.args] for s in (self.zeros, self.plus)] \
            if ins.op == "SWAP" else None
        self.zeros -= written
        self.raw -= written
        self.used -= written
        if not acc:
            self.plus -= written
        if action == "fresh":
            self.pending[d] = acc
            self.plus.add(d)
            if raw:
                self.raw.add(d)
        elif action == "cancel":
            self.zeros.add(d)
            self.plus.add(d)
        elif ins.op in ("ZERO", "PUSH") and ins.args[0].cls == isa.FLOAT:
            self.zeros.add(ins.args[0])         # both set it to 0.0
            self.plus.add(ins.args[0])
        elif back is not None:                  # what it held before it was lent
            self.zeros |= {ins.args[0]} if back[0] else set()
            self.plus |= {ins.args[0]} if back[1] else set()
        elif swapped is not None:
            self.zeros |= {b for b, z in zip(reversed(ins.args), swapped[0]) if z}
            self.plus |= {b for b, z in zip(reversed(ins.args), swapped[1]) if z}
        return template

    def shadows(self, ins, template: str) -> str:
        """The template without the shadow updates that add or scale only zeros, and
        the zero shadows after it."""
        regs = {n: a for n, a in zip(ins.spec.names, ins.args)
                if isinstance(a, Reg) and a.cls == isa.FLOAT}
        if len(set(regs.values())) < len(regs):    # one register twice: no shortcuts
            self.gzeros -= set(regs.values())
            return template
        known = {n for n, a in regs.items() if a in self.gzeros}
        out = []
        for line in template.split("\n"):
            lhs, op, rhs = re.fullmatch(r"(.*?)( [-+]?= |$)(.*)", line).groups()
            targets = re.findall(r"\{g(\w+)\}", lhs)
            used = set(re.findall(r"\{g(\w+)\}", rhs))
            if len(targets) == 1 and lhs == f"{{g{targets[0]}}}":
                target = targets[0]
                if used and used <= known and (op != " = " or target in used):
                    continue                    # adds or scales zeros
                if op == " = " and rhs == "0.0":
                    known.add(target)
                else:
                    known.discard(target)
            elif targets and re.fullmatch(r"\{g(\w+)\}, \{g(\w+)\}", lhs) and \
                    rhs == "{{g{1}}}, {{g{0}}}".format(*targets):
                a, b = targets                  # a swap
                known = (known - {a, b}) | ({b} if a in known else set()) | \
                    ({a} if b in known else set())
            else:
                known -= set(targets)
            out.append(line)
        self.gzeros -= set(regs.values())
        self.gzeros |= {regs[n] for n in known if n in regs}
        return "\n".join(out)


def _sums(code) -> set:
    """The float registers the code only accumulates into, at least once a product."""
    sums = {ins.args[0] for ins in code if (acc := _accumulates(ins)) and acc[1][1] == "mul"}
    return {r for r in sums if all(_accumulates(ins) and ins.args[0] == r
                                   for ins in code if r in _written(ins))}


def _template(ins, gradient: bool) -> str:
    """An instruction's statement template in a run or a gradient pass (rvm.core.isa)."""
    cls = ins.cls
    if gradient and cls == isa.FLOAT:
        return templates.pulled(isa.OPS[ins.spec.inverse].adjoint, ins)
    return ins.spec.forward[cls]


def _exact(template: str, action: str | None, test: bool = False) -> str:
    """The template with its value line rewritten for a known-zero destination. In a
    gradient pass its shadow lines stay: the shadow of a register that holds zero is
    pulled back as the interpreter pulls it back, although nothing the loss depends on
    flows through a register that is zero as a function of the inputs (a local's start,
    a ZERO, or e - e). Set to zero there, what it holds would not go through e twice,
    with opposite signs, when the pair's other half runs: the same gradient in exact
    arithmetic, not always to the last bit, so an engine's answer would depend on which
    registers its compiler knew to be zero. action "raw": a heap cell read into a
    known-zero register as it is (see _Known). What a fresh line puts in d is tested
    finite there (`_lost`), where the interpreter tests the instruction's result, so
    that the cancel `d = e - e` is +0.0 and a ZERO of d needs no test (_Known.step):
    untested, an inf that e held became nan and was cleared. A raw read is tested where
    it stops being raw (_Writer.canonical) or, with `test`, at its cancel (`cell -
    cell`, nan where the cell is not finite) where no product took it; a product took
    its inf or nan into a register tested later (_Known.used)."""
    if action is None:
        return template
    first, _, rest = template.partition("\n")
    head = "{d} = {d} "
    assert first.startswith(head), first
    value = first[len(head) + 2:]
    line = {"fresh": f"{{d}} = 0.0 {first[len(head)]} ({value})", "raw": f"{{d}} = {value}",
            "cancel": f"{{d}} = ({value}) - ({value})"}[action]
    if action == "fresh" or test:      # (so that `d = e - e` is +0.0: see above)
        line += "\n_lost += {d}"
    return line + ("\n" + rest if rest else "")


_MIRROR = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_STEPS = {"INC": 1, "DEC": -1, "ADD": 1, "SUB": -1}
# a back edge's check `counter op z` for every counter value in lo..hi
_RANGE = {"LT": "{{hi}} < {z}", "LE": "{{hi}} <= {z}", "GT": "{{lo}} > {z}",
          "GE": "{{lo}} >= {z}", "NE": "not ({{lo}} <= {z} <= {{hi}})",
          "EQ": "{{lo}} == {z} == {{hi}}"}


@attrs.frozen
class Counted:
    """A block that loops onto itself a number of times known when it is entered: one
    integer register (the counter) changes by one per pass, and the block's branch
    compares it with a value the block does not change."""

    reg: Reg                    # the counter
    step: int                   # +1 or -1 per pass
    at: int                     # the instruction that steps it
    end: str                    # its value after the last pass (an expression)
    bounds: tuple               # guards that keep `end` in the int64 range
    passed: int                 # instructions the back edge passes (charged per pass)
    checks: tuple               # the back edge's comefrom checks, over counter values lo..hi
    counter: bool               # nothing reads the counter before it steps: a for variable
    floats: tuple | None        # float registers to test once after the loop (None: in it)
    exit: int                   # where the loop goes when it ends
    exit_jumped: bool
    hoisted: tuple = ()         # ASSERT and heap-address checks made once, for every pass
    skip: frozenset = frozenset()       # the ASSERTs among them (instruction indices)
    addresses: frozenset = frozenset()  # the address checks among them (their conditions)
    later: bool = False         # native: floats stored to the heap tested after the loop


def counted(w: _Writer, k: int, start: int, end: int) -> Counted | None:
    """Block k as a counted loop, or None. The generated code tests, on entry, that the
    trip count T fits the step budget and that every comefrom check of the back edge
    holds for the counter values it would see; it then runs the block T times in a Python
    for loop (no per-pass budget, exit test or comefrom check), else the general loop.
    Where the block cannot move a float off its registers (no call, store or float
    comparison into an integer), a non-finite float stays in a register (arithmetic keeps
    it), so one finiteness test after the loop sees what a test per pass would."""
    fn, code = w.fn, w.fn.code
    last = code[end - 1]
    if last.op not in isa.BRANCHES or last.op == "JMP" or w.c.strict:
        return None     # (the strict build tests the budget at every pass: see Compiled)
    taken, _ = w.resolve(fn.labels[last.args[-1].name], True)
    fall, _ = w.resolve(end, False)
    loops = w.block_of(taken[-1][0]) == k
    if loops == (w.block_of(fall[-1][0]) == k):
        return None
    back_target, back_jumped = (taken if loops else fall)[0]
    back, passed = w.resolve(back_target, back_jumped)
    out = (fall if loops else taken)[0]
    cc = isa.condition(last.op) if loops else isa.NEGATED[isa.condition(last.op)]
    body = [(i, code[i]) for i in range(start, end - 1) if code[i].op not in isa.COMEFROMS]
    if any(ins.op in isa.ARRAYS for _, ins in body):
        return None
    written = set().union(set(), *(_written(ins) for _, ins in body))

    def invariant(x) -> bool:
        return isinstance(x, Imm) or (isinstance(x, Reg) and x not in written)

    def text(x) -> str:
        return _local(x)[0] if isinstance(x, Reg) else f"({x.value!r})"

    a, b = last.args[0], last.args[1]
    if isinstance(a, Reg) and a in written and invariant(b):
        reg, other, op = a, b, cc
    elif isinstance(b, Reg) and b in written and invariant(a):
        reg, other, op = b, a, _MIRROR[cc]
    else:
        return None
    if reg.cls != isa.INT or other.cls != isa.INT:
        return None
    steps = [(i, ins) for i, ins in body if reg in _written(ins)]
    if len(steps) != 1:
        return None
    at, ins = steps[0]
    if ins.op in ("INC", "DEC"):
        step = _STEPS[ins.op]
    elif ins.op in ("ADD", "SUB") and isinstance(ins.args[1], Imm) and \
            ins.args[1].value in (1, -1) and ins.args[1].cls == isa.INT:
        step = _STEPS[ins.op] * ins.args[1].value
    else:
        return None
    y = text(other)
    if (step, op) in ((1, "LT"), (1, "NE"), (-1, "GT"), (-1, "NE")):
        last_value, bounds = y, ()
    elif (step, op) == (1, "LE"):
        last_value, bounds = f"({y} + 1)", (f"{y} < {INT64_MAX}",)
    elif (step, op) == (-1, "GE"):
        last_value, bounds = f"({y} - 1)", (f"{y} > {INT64_MIN}",)
    else:
        return None
    checks = []
    for t, jumped in back if w.c.checks else ():
        cf = code[t] if t < len(code) else None
        if cf is None or cf.op not in isa.COMEFROMS or isa.condition(cf.op) is None:
            continue
        must = isa.condition(cf.op) if jumped else isa.NEGATED[isa.condition(cf.op)]
        p, q = cf.args[0], cf.args[1]
        if p.cls != q.cls:      # (an integer compared with a float as a float: per pass)
            return None
        if invariant(p) and invariant(q):
            checks.append(f"{text(p)} {isa.CONDITIONS[must]} {text(q)}")
        elif p == reg and invariant(q):
            checks.append(_RANGE[must].format(z=text(q)))
        elif q == reg and invariant(p):
            checks.append(_RANGE[_MIRROR[must]].format(z=text(p)))
        else:
            return None
    counter = not any(reg in w.mentioned(ins) for i, ins in body if i < at)
    floats = tuple(sorted({_local(r)[0] for r in written if r.cls == isa.FLOAT}))
    for _, ins in body:
        regs = _mentioned(ins)
        if ins.op in isa.CALLS or (any(r.cls == isa.FLOAT for r in regs) and (
                ins.op.startswith("XOR") or (ins.spec.group == "memory" and
                ins.op not in isa.READS))):
            floats = None
    # native code: a float on its way to the heap may be tested after the loop (where no
    # float becomes an int in it, so a nan never reaches an address or a branch)
    later = not any(ins.op in isa.CALLS or (
        any(r.cls == isa.FLOAT for r in _mentioned(ins)) and
        any(r.cls == isa.INT for r in _written(ins))) for _, ins in body)
    hoisted, skip, addresses = _hoisted(body, reg, step, at, last_value, invariant, text)
    return Counted(reg, step, at, last_value, bounds, passed, tuple(checks), counter, floats,
                   *out, hoisted, skip, addresses, later)


def _hoisted(body, reg, step, at, last_value, invariant, text) -> tuple:
    """The checks of a counted loop's body that hold for every pass if they hold for the
    counter's first and last values (on entry, with T the trip count): ASSERTs on values
    the loop does not change or on the counter, and heap-address checks of such
    addresses while the heap top cannot move (no allocation, push, pop or call)."""
    rv = _local(reg)[0]
    # the counter's values at an instruction before its step, and after it
    before = (rv, f"{last_value} - 1") if step > 0 else (f"{last_value} + 1", rv)
    after = (f"{rv} + 1", last_value) if step > 0 else (last_value, f"{rv} - 1")
    fixed_top = not any(ins.op in isa.CALLS or ins.op in ("ALLOC", "FREE", "PUSH", "POP")
                        for _, ins in body)
    local = (lambda r: _local(r)[0])
    hoisted, skip, addresses = [], set(), set()
    # the registers as affine functions of the pass number (rvm.engines.affine), for the
    # checks whose operands the loop changes otherwise than by its counter
    last = f"({last_value} - {rv} - 1)" if step > 0 else f"({rv} - {last_value} - 1)"
    states = functools.cache(lambda: affine.passes(body, reg, step) or {})
    ends = ("0", last)

    def value(i, x):
        if isinstance(x, (int, Imm)):
            return affine.Affine(x if isinstance(x, int) else x.value)
        return states().get(i, {}).get(x, affine.Affine(terms={local(x): 1}))

    def in_int64(v) -> list[str]:
        return [] if v.fixed and v.c == 0 and list(v.terms.values()) in ([], [1]) else \
            [f"{INT64_MIN} <= {v.text(e)} <= {INT64_MAX}" for e in ends]

    for i, ins in body:
        lo, hi = before if i < at else after
        if ins.op.startswith("ASSERT."):
            cc, (p, q) = ins.op.split(".")[1], ins.args
            op = isa.CONDITIONS[cc]
            if p.cls != q.cls:      # (an integer compared with a float: made per pass)
                continue
            if invariant(p) and invariant(q):
                hoisted.append(f"{text(p)} {op} {text(q)}")
            elif p == reg and invariant(q):
                hoisted.append(_RANGE[cc].format(z=text(q)).format(lo=lo, hi=hi))
            elif q == reg and invariant(p):
                hoisted.append(_RANGE[_MIRROR[cc]].format(z=text(p)).format(lo=lo, hi=hi))
            elif p.cls == q.cls == isa.INT and \
                    None not in (a := value(i, p), b := value(i, q)) and \
                    (cc not in ("EQ", "NE") or (a - b).fixed):
                # a - b is monotonic in the pass: the first and last passes bound it
                hoisted.append(" and ".join(
                    [*in_int64(a), *in_int64(b),
                     *(f"{(a - b).text(e)} {op} 0" for e in ends)]))
            else:
                continue
            skip.add(i)
        # (a cell's address: an array instruction checks its views itself)
        for m in (a for a in ins.args if type(a) is Mem) if fixed_top else ():
            base, off = m.base, m.off
            check = templates.address_check(local(base), off, local)
            terms = [base] + ([off] if isinstance(off, Reg) else [])
            if all(invariant(t) for t in terms):
                hoisted.append(check)
            elif terms.count(reg) == 1 and all(t == reg or invariant(t) for t in terms):
                if isinstance(off, Reg):    # counter + z, z fixed
                    z = local(off if base == reg else base)
                    hoisted.append(f"({z} >= 0 or {lo} >= 0) and 0 <= {z} + {lo} and "
                                   f"{z} + {hi} < M.top")
                else:                       # counter + a constant
                    hoisted.append(f"0 <= {lo} + ({off}) and {hi} + ({off}) < M.top")
            elif None not in (vs := [value(i, x) for x in (base, off)]):
                # both terms not negative and their sum in the heap, on the first and
                # the last pass: then on every pass (a stronger test than the check's)
                hoisted.append(" and ".join(
                    [*(f"{v.text(e)} >= 0" for v in vs[:len(terms)] for e in ends),
                     *(f"0 <= {(vs[0] + vs[1]).text(e)} < M.top" for e in ends)]))
            else:
                continue
            addresses.add(check)
    return tuple(f"({h})" for h in dict.fromkeys(hoisted)), frozenset(skip), \
        frozenset(addresses)


class _Writer:
    """Python source for one function in one mode."""

    def __init__(self, compiled: Compiled, fn: Function, gradient: bool,
                 outputs: list | None = None, restores: list | None = None):
        """outputs: the registers to return (default: the parameters, and in gradient
        mode their shadows); restores: the registers that must be back to zero at the
        end (default: the locals)."""
        self.c, self.fn, self.gradient = compiled, fn, gradient
        self.outputs = outputs
        self.entry: _Known | None = None    # what is known on entry (native; default:
        self.exit = _Known()                # the locals are zero) and on leaving
        self.restores = fn.locals if restores is None else restores
        self.lines: list[str] = []
        self.defer = False      # finiteness checked after a counted loop, not in it
        self.drop: frozenset = frozenset()  # address checks a counted loop made on entry
        self.known: list | None = None      # per block: what is known on entry (native)
        # derivatives: their largest magnitude so far in `_s` (derived_registers)
        self.derived = derived_registers(compiled.program, fn)
        self.scaled = set(self.derived or ()) & set(self.restores)     # (their ancillas)
        self.tests = self.costs = None      # its budget tests at calls (see call)

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def params(self, typed: bool = False) -> list[str]:
        """The parameters' names (typed: annotated with their types, see TYPES)."""
        def named(name: str, kind: str) -> str:
            return f"{name}: {kind}" if typed else name
        names = [named(_local(p)[0], TYPES[p.cls]) for p in self.fn.params]
        if self.gradient:
            names += [named(_local(p)[1], "float") for p in self.fn.params
                      if p.cls == isa.FLOAT]
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

    def call(self, depth: int, ins, site: tuple | None = None) -> None:
        """A call; in native code at `site` (i, the end of its block), with the budget
        tests that Compiled.tested asks for (none in a counted loop's passes, whose
        entry test counts its callees' most steps)."""
        callee = self.c.program.functions[ins.args[0].name]
        regs = list(ins.args[1:])
        forward = ins.op == "CALL"
        mode = ("g" if self.gradient else "") + ("fw" if forward else "bw")
        outs = [_local(r)[0] for r in regs]
        if self.gradient:
            outs += [_local(r)[1] for r, p in zip(regs, callee.params) if p.cls == isa.FLOAT]
        target = self.c.name(callee.name, mode)
        tests = False
        if self.c.native and site is not None:
            if self.tests is None:      # (the function's: see _reach; the steps from
                code = self.fn.code     # each instruction to its end, for its block's)
                self.tests = self.c.reach(self.fn)
                self.costs = [_cost(code[i:i + 1]) for i in range(len(code))] + [0]
                for i in reversed(range(len(code))):
                    self.costs[i] += self.costs[i + 1]
            (reach, calls), costs = self.tests, self.costs
            i, end = site
            tests = i in calls
        if tests:           # (the budget before instruction i: _n + the block's steps
            code = self.fn.code     # from i on, charged when the block began)
            # short of the steps to the next test: a callee that tests nothing, run
            # whole, and the steps after it; a tested one, its steps to its first test
            need = 1 + self.c.entry_reach(callee.name, forward) \
                if self.c.tested(callee.name) else \
                2 + self.c.most_steps(callee.name) + reach[i + 1]
            left = f"_n + {costs[i] - costs[end]}"
            self.emit(depth, f"if {left} < {min(need, INT64_MAX)}: _stop_before({left})")
        self.emit(depth, "M.budget = _n")
        if self.derived is not None:
            self.emit(depth, self.dscale("M.dscale = _s"))       # (_s >= M.dscale: track)
        call = f"{target}(M, {', '.join(outs)})"
        # a recursive program (python engine only) keeps the interpreter's count of live
        # frames and their registers (a failed test: the interpreter reports it)
        size = callee.n_int + callee.n_float
        if self.c.recursive:
            self.emit(depth, f"M.framed({size}, {callee.name!r})")
        self.emit(depth, f"{', '.join(outs)}, = {call}" if outs else call)    # no parameters
        if self.c.recursive:
            self.emit(depth, f"M.unframed({size})")
        self.emit(depth, "_n = M.budget")
        if tests and self.c.tested(callee.name) and reach[i + 1] > costs[i + 1] - costs[end] + 1:
            # after a tested callee (which leaves at least a step for the return, and
            # the budget this block charged on entry): the steps to the next test, where
            # they go past this block
            left = f"_n + {costs[i + 1] - costs[end]}"
            self.emit(depth, f"if {left} < {reach[i + 1]}: _stop_at({i + 1}, {left})")
        if self.derived is not None:
            self.emit(depth, self.dscale("_s = M.dscale"))

    def dscale(self, line: str) -> str:
        """A line that keeps a derivative's largest magnitude (derived_registers) as the
        python engine runs it; native code keeps none (its test of a derived ancilla is
        tol alone, and the interpreter decides): `_s` is 0.0 there, and the line that
        would change it a `pass` (a statement all the same: a straight run ends there)."""
        if not self.c.native:
            return line
        return "_s = 0.0" if line == "_s = M.dscale" else "pass"

    def mentioned(self, ins) -> set:
        """The registers ins reads or writes, an output statement's (a NOP that prints)
        included: a counted loop whose counter a print shows steps it in every pass (it
        showed the first value in every pass, natively)."""
        regs = _mentioned(ins)
        return regs | self.c.said_regs(self.fn.name, ins.line) if ins.op == "NOP" else regs

    def shown(self, depth: int, known: _Known | None, ins) -> None:
        """Before an output statement (native): the raw registers it shows made `0.0 +
        cell`, so that it shows what the interpreter's registers hold (see _Known)."""
        if known is None or ins.op != "NOP":
            return
        regs = self.c.said_regs(self.fn.name, ins.line) & known.raw
        self.canonical(depth, None, sorted(regs, key=str))
        known.raw -= regs

    def track(self, depth: int, ins) -> None:
        """The largest magnitude of a derivative so far, after ins wrote derived registers
        (derived_registers; a call: its arguments, which the callee may have changed; an
        array instruction: the derivative cells it wrote, noted in M.dscale by its helper,
        arrays.Helpers._noted)."""
        if ins.op in isa.ARRAYS and self.derived is not None:
            self.emit(depth, self.dscale("if M.dscale > _s: _s = M.dscale"))
        for r in ins.args[1:] if ins.op in isa.CALLS else ins.written:
            if r in (self.derived or ()):
                x = _local(r)[0]
                self.emit(depth, self.dscale(f"if abs({x}) > _s: _s = abs({x})"))

    def canonical(self, depth: int, known: _Known | None, regs=None) -> None:
        """Raw registers made `0.0 + cell` (see _Known): those the instruction just
        stepped through reads in another way, or `regs`."""
        for r in (known.canon if known is not None else []) if regs is None else regs:
            x = _local(r)[0]
            self.emit(depth, f"{x} = 0.0 + {x}")
            self.emit(depth, f"_lost += {x}")      # (a cell as read: see _exact)

    def instruction(self, depth: int, ins, template: str | None = None) -> None:
        if ins.op == "NOP" and ins.line in self.c.said_at.get(self.fn.name, {}):
            self.emit(depth, self.c.said_text(self.fn.name, ins.line))
            return
        ops = Operands(self.fn, ins, {}, _local)
        template = _template(ins, self.gradient) if template is None else template
        for line in render(template, ops, deferred=True, wraps=not self.c.native):
            if self.defer and line == "_fin += _v - _v":
                continue
            if line.startswith("if not (") and line[8:line.find("): raise")] in self.drop:
                if self.c.native:       # the address needs no mask (native.defer_checks)
                    self.emit(depth, "_m = True")
                continue
            for r in self.derived or () if "zero(" in line else ():    # (ZERO, POP)
                x = _local(r)[0]
                line = line.replace(f"zero({x})", f"(zero({x}) or abs({x}) <= M.tol * _s)")
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

    def goto(self, depth: int, k: int, target: int, jumped: bool,
             known: _Known | None = None) -> None:
        """Transfer control: the comefroms' checks, then the next block (`continue` when a
        block loops onto itself, inside its own `while True`). Native code: at a back
        edge, where a run out of steps leaves its registers for the machine (a record,
        rvm.engines.lowering), the raw registers (known: see _Known) are first made what
        the interpreter holds (`0.0 + cell`), so a record never holds a cell's -0.0 the
        interpreter has as 0.0."""
        path, passed = self.resolve(target, jumped)
        for t, j in path:
            self.arrive(depth, t, j)
        if passed:
            self.emit(depth, f"_n -= {passed}")
        b = self.block_of(path[-1][0])
        if 0 <= b <= k:                 # a back edge: the only way to run for ever
            if known is not None and known.raw:
                self.canonical(depth, None, sorted(known.raw, key=str))
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

    def known_entries(self, leaders: list[int]) -> list[_Known]:
        """What is known on entry to each block (see _Known): on entry to the function the
        locals and their shadows are zero; then what every way into a block leaves known
        (to a fixed point; a block reached only through another's pass-through: nothing).
        Also sets self.exit, what is known on leaving."""
        code = self.fn.code
        ends = leaders[1:] + [len(code)]
        entry: list = [None] * len(leaders)
        floats = {r for r in self.fn.locals if r.cls == isa.FLOAT}
        entry[0] = self.entry.copy() if self.entry is not None else \
            _Known(floats, floats if self.gradient else (), plus=floats)
        exits: list = []
        work = [0]
        while work:
            k = work.pop()
            state = entry[k].copy()
            for ins in code[leaders[k]:ends[k]]:
                state.step(ins, self.gradient)
            for t in self.targets(leaders[k], ends[k]) if ends[k] > leaders[k] else [-1]:
                if t < 0:
                    exits.append(state)
                    continue
                new = state.copy() if entry[t] is None else entry[t].meet(state)
                if new != entry[t]:
                    entry[t] = new
                    work.append(t)
        self.exit = functools.reduce(_Known.meet, exits) if exits else _Known()
        return [e or _Known() for e in entry]

    def block_body(self, depth: int, k: int, start: int, end: int) -> None:
        """Block k, [start, end): its instructions, then the transfer at its end."""
        code, fn = self.fn.code, self.fn
        # the step budget counts instructions as the interpreter does (a call: two
        # steps, entering and leaving, besides the callee's own), charged per block
        self.emit(depth, f"_n -= {_cost(code[start:end])}")
        last = None
        before = len(self.lines)
        checked: set = set()        # ASSERTs made in this block on unchanged registers
        known = self.known[k].copy() if self.known is not None else None
        for i in range(start, end):
            ins = code[i]
            last = ins
            template = known.step(ins, self.gradient) if known is not None else None
            self.canonical(depth, known)
            self.shown(depth, known, ins)
            if ins.op in isa.COMEFROMS or _repeated(ins, checked):
                continue
            if ins.op in isa.BRANCHES:
                t = fn.labels[ins.args[-1].name]
                if ins.op == "JMP":
                    self.goto(depth, k, t, True, known)
                else:
                    ops = Operands(fn, ins, {}, _local)
                    self.emit(depth, f"if {condition(ops, isa.condition(ins.op))}:")
                    self.goto(depth + 1, k, t, True, known)
                    self.emit(depth, "else:")
                    self.goto(depth + 1, k, i + 1, False, known)
            elif ins.op in isa.CALLS:
                self.call(depth, ins, (i, end))
            else:
                self.instruction(depth, ins, template)
            self.track(depth, ins)
        if last is None or last.op not in isa.BRANCHES:
            if len(self.block) > 1:
                self.goto(depth, k, end, False, known)
            else:
                self.arrive(depth, end, False)
        if len(self.lines) == before:
            self.emit(depth, "pass")

    def counted_loop(self, depth: int, k: int, start: int, end: int, c: Counted) -> None:
        """`if <the loop's trip count is known and its checks hold>:` the block run by a
        Python for loop (see counted), then its exit."""
        code = self.fn.code
        rv, cost = _local(c.reg)[0], _cost(code[start:end])
        trips = f"({c.end} - {rv})" if c.step > 0 else f"({rv} - {c.end})"
        first, last = (f"{rv} + 1", f"{c.end} - 1") if c.step > 0 else \
            (f"{c.end} + 1", f"{rv} - 1")
        # a short loop runs faster without the entry test: measured, from 3 passes on in
        # Python code, 8 in native code (where a check per pass costs little)
        up, down = (" - 7", " + 7") if self.c.native else (" - 2", " + 2")
        # (the budget for every pass, its callees' steps included: they charge their own
        # as they go, so a short budget runs the general loop, which stops where it ends)
        calls = [self.c.most_steps(code[i].args[0].name) for i in range(start, end - 1)
                 if code[i].op in isa.CALLS]
        callees = 0 if None in calls else sum(calls)
        guards = [f"{rv} < {c.end}{up}" if c.step > 0 else f"{c.end}{down} < {rv}",
                  *c.bounds, f"{trips} * {cost + c.passed + callees} <= _n"]
        guards += [check.format(lo=first, hi=last) for check in c.checks] + list(c.hoisted)
        # native code: the sums of products the block only accumulates into cannot hold
        # -0.0 in any pass if they do not on entry (see _Known)
        known = self.known[k].copy() if self.known is not None else None
        if known is not None:
            sums = _sums(code[start:end - 1]) - known.plus
            guards += [f"_plus({_local(r)[0]})" for r in sorted(sums, key=str)]
            known.plus |= sums
        test = " and ".join(guards)
        # native code: the test in Python's unbounded ints (rvm.engines.lowering.counted)
        self.emit(depth, f"if _exact({test}):" if self.c.native else f"if {test}:")
        depth += 1
        self.emit(depth, f"_n -= {trips} * {cost + c.passed} - {c.passed}")
        read = any(c.reg in self.mentioned(code[i]) for i in range(start, end - 1)
                   if i != c.at and i not in c.skip and code[i].op not in isa.COMEFROMS)
        # (native code: `_finite_after(range(...), K, P, C)` or `_passes(...)`: the steps a
        # pass charges, the comefrom steps of the back edge and its callees' most steps,
        # for its looks at the floats; see rvm.engines.lowering.for_)
        passes = "range({})"
        if self.c.native:
            # (and what the registers are at the end of a chunk of passes, for a look's
            # copy of them: `()` they are the general loop's at its back edge, `(counter,
            # end, step)` but the counter, which steps only after the last pass, None not
            # so (a register may hold a heap cell as read raw: see canonical))
            hint = "None" if known is not None and self.known[k].raw else \
                f"({rv!r}, {c.end}, {c.step})" if c.counter and not read else "()"
            passes = ("_finite_after" if c.later else "_passes") + \
                f"(range({{}}), {cost + c.passed}, {c.passed}, {callees}, {hint})"
        if c.counter and read:
            self.emit(depth, f"for {rv} in " + passes.format(
                f"{rv} {'+' if c.step > 0 else '-'} 1, {c.end} {'+' if c.step > 0 else '-'} "
                f"1{'' if c.step > 0 else ', -1'}") + ":")
        elif self.c.native:
            self.emit(depth, f"for _ in {passes.format(trips)}:")
        else:                           # no loop variable: no int object made per pass
            self.emit(depth, f"for _ in _repeat(None, {trips}):")
        before = len(self.lines)
        checked: set = set()
        self.defer = c.floats is not None
        self.drop = c.addresses
        # what holds on entry to the block holds at the start of every pass (native)
        for i in range(start, end - 1):
            ins = code[i]
            template = known.step(ins, self.gradient) if known is not None else None
            self.canonical(depth + 1, known)
            self.shown(depth + 1, known, ins)
            if ins.op in isa.COMEFROMS or i in c.skip or _repeated(ins, checked):
                continue
            if i == c.at:
                if not c.counter:
                    self.emit(depth + 1, f"{rv} = {rv} {'+' if c.step > 0 else '-'} 1")
            elif ins.op in isa.CALLS:
                self.call(depth + 1, ins)
            else:
                self.instruction(depth + 1, ins, template)
            self.track(depth + 1, ins)
        self.defer, self.drop = False, frozenset()
        if known is not None:   # no register raw where the general loop's analysis has not
            self.canonical(depth + 1, None, sorted(known.raw - self.known[k].raw, key=str))
        if len(self.lines) == before:
            self.emit(depth + 1, "pass")
        if known is not None:
            self.canonical(depth, None, sorted(known.raw, key=str))
        if c.counter and not read:
            self.emit(depth, f"{rv} = {c.end}")
        if c.floats:
            self.emit(depth, "_fin += " + " + ".join(f"({x} - {x})" for x in c.floats))
        self.goto(depth, k, c.exit, c.exit_jumped)

    def source(self, name: str) -> str:
        fn, code = self.fn, self.fn.code
        n = len(code)
        leaders = sorted({0} | {i for i, ins in enumerate(code) if ins.op in isa.COMEFROMS}
                         | {i + 1 for i, ins in enumerate(code) if ins.op in isa.BRANCHES})
        leaders = [b for b in leaders if b < n] or [0]
        self.block = {start: k for k, start in enumerate(leaders)}
        self.known = self.known_entries(leaders) if self.c.native else None
        native = self.c.native          # (native code's text is typed: see TYPES)
        self.emit(1, f"def {name}(M, {', '.join(self.params(typed=native))}):")

        def local(name: str, kind: str, zero: str) -> None:
            if native:
                self.emit(2, f"{name}: {kind}")
            self.emit(2, f"{name} = {zero}")
        params = set(fn.params)
        for r in dict.fromkeys(fn.registers + (self.outputs or [])):
            value, shadow = _local(r)
            if r not in params:
                local(value, TYPES[r.cls], "0" if r.cls == isa.INT else "0.0")
            if self.gradient and r.cls == isa.FLOAT and r not in params:
                local(shadow, "float", "0.0")
        # (a block loop: several blocks, or one whose last instruction branches back to it)
        loop = len(leaders) > 1 or any(ins.op in isa.BRANCHES for ins in code)
        scratch = _scratch(fn, loop, self.derived is not None) if native else {}
        for other, kind in scratch.items():
            self.emit(2, f"{other}: {kind}")
        if self.derived is not None:
            self.emit(2, self.dscale("_s = M.dscale"))
        self.arrive(2, 0, False)
        self.emit(2, "_n = M.budget")
        self.emit(2, "_fin = 0.0")
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
                    loop_info = counted(self, k, start, end)
                    if loop_info is not None:
                        self.counted_loop(depth, k, start, end, loop_info)
                        self.emit(depth, "else:")
                        depth += 1
                    self.emit(depth, "while True:")
                    self.inner, depth = True, depth + 1
            self.block_body(depth, k, start, end)
        if self.known is not None:      # the values leave as the interpreter has them
            self.canonical(2, None, sorted(self.exit.raw, key=str))
        if self.derived is not None:
            self.emit(2, self.dscale("M.dscale = _s"))
        if self.c.checks:
            for r in self.restores:
                value = _local(r)[0]
                test = f"{value} != 0" if r.cls == isa.INT else f"abs({value}) > M.tol"
                if r in self.scaled:
                    test += f" and abs({value}) > M.tol * _s"
                self.emit(2, f"if {test}: " + fault(
                    f"{fn.name}: local {r} = {{{value}!r}} not restored to zero when "
                    "leaving the frame"))
        self.emit(2, "if _n < 0 or _fin != 0.0: " + BUDGET_OR_FINITE)
        self.emit(2, "M.budget = _n")
        names = self.params() if self.outputs is None else \
            [_local(r)[0] for r in self.outputs]
        self.emit(2, f"return ({''.join(p + ', ' for p in names)})")
        return "\n".join(self.lines)


# Compute, copy, uncompute: a function whose code is P (straight-line set-up: ancilla
# arrays allocated, their sizes), A (a compute block), B, then A's inverse (its uncompute)
# and Q (straight-line: the ancillas' ZERO checks, the arrays freed). Its gradient pass runs
# Q's inverse and A again (the inverse of the uncompute, with every shadow but the loss's
# zero, so their adjoints add nothing), then B, A and P backwards with the adjoints. A value
# and gradient in one call need neither the forward run's uncompute nor that recompute:
# run P, A and B (fws, which returns every register, leaving P's arrays allocated), then
# the gradient pass from there (gbws). Nothing is lost: the gradient pass's last part, A
# and P backwards, is the uncompute and the freeing, computing the same values from the
# same registers and cells (B changes none that they read: registers both use are
# checked to be zero before and after B, as the frontend's reused temporaries are; cells
# are told apart by the array they are reached through), so it makes the same checks and
# fails where the forward run would; and the uncompute and Q change no parameter (nor a
# caller's array), so the values after P, A and B are the function's results.

def _written_params(program: Program, fn: Function, memo: dict) -> set:
    """The parameters of fn that a run may change (directly or through its calls): from
    the summaries (_summaries); all of them for a function not summarised yet, which is
    one on a cycle of calls with the function asking."""
    found = memo.get(fn.name)
    return found if found is not None else set(fn.params)


def _summaries(program: Program) -> dict:
    """Each function's written parameters and, under ("cells", name), its _callee_cells,
    made callees first (Program.call_order), so no walk recurses along a chain of calls."""
    if "summaries" not in program.cache:
        memo: dict = {}
        order, _ = program.call_order()
        for name in order:
            fn = program.functions[name]
            memo[name] = _writes(program, fn.code, memo) & set(fn.params)
        for name in order:
            memo[("cells", name)] = _cells_of(program, program.functions[name], memo)
        program.cache["summaries"] = memo
    return program.cache["summaries"]


def _writes(program: Program, code, memo: dict) -> set:
    out = set()
    for ins in code:
        if ins.op in isa.CALLS:
            callee = program.functions[ins.args[0].name]
            changed = _written_params(program, callee, memo)
            out |= {r for r, p in zip(ins.args[1:], callee.params) if p in changed}
        else:
            out |= set(ins.written)
    return out


def _own_blocks(program: Program, fn: Function, memo: dict) -> set:
    """fn's locals that hold its own heap blocks: written by ALLOC and FREE only (a call
    may pass them, if the callee leaves them as they are)."""
    written: dict = {}
    for ins in fn.code:
        for r in _writes(program, [ins], memo):
            written.setdefault(r, set()).add(ins.op)
    return {r for r, ops in written.items() if r not in fn.params and ops <= {"ALLOC", "FREE"}}


def _cells(program: Program, fn: Function, code, memo: dict) -> tuple[set, set] | None:
    """(the registers of fn through which code, with its calls, may exchange into heap
    cells; those through which it may reach cells at all), a callee's own blocks left out;
    None if not known: a PUSH or POP, or a cell reached through a callee's register that
    is neither its parameter nor its own block."""
    into, reached = set(), set()
    for ins in code:
        if ins.op in ("PUSH", "POP"):
            return None
        if ins.op in isa.CALLS:
            callee = program.functions[ins.args[0].name]
            inner = _callee_cells(program, callee, memo)
            if inner is None:
                return None
            args = dict(zip(callee.params, ins.args[1:]))
            into |= {args[p] for p in inner[0]}
            reached |= {args[p] for p in inner[1]}
            continue
        for k, a in enumerate(ins.args):
            if isinstance(a, Mem):
                reached.add(a.base)
                # an array instruction writes its first view (a swap: both)
                if ins.op == "EXCH" or (ins.op in isa.ARRAYS and
                                        (k == 0 or (k == 1 and ins.op == "VSWAP"))):
                    into.add(a.base)
    return into, reached


def _callee_cells(program: Program, fn: Function, memo: dict) -> tuple[set, set] | None:
    """_cells of a whole callee, as its parameters (its own blocks are fresh cells), from
    the summaries; None (not known) for one on a cycle of calls not summarised yet."""
    return memo.get(("cells", fn.name))


def _cells_of(program: Program, fn: Function, memo: dict) -> tuple[set, set] | None:
    found = _cells(program, fn, fn.code, memo)
    if found is not None:
        own = _own_blocks(program, fn, memo)
        if any(r not in fn.params and r not in own for r in found[1]):
            return None
        found = tuple({r for r in regs if r in fn.params} for regs in found)
    return found


def _split(program: Program, fn: Function) -> tuple[int, int, list] | None:
    """(a, b, the registers B and the uncompute share) for fn = P, A = code[s:a], B =
    code[a:b], A's uncompute, Q (see above), if its value and gradient may skip the
    uncompute and the recompute; None if fn does not have that shape."""
    code, regions = fn.code, {(r[0], r[1]): r[2:] for r in fn.regions}
    for (name, kind), (s, a) in regions.items():
        if kind != "compute" or (name, "uncompute") not in regions:
            continue
        b, c = regions[(name, "uncompute")]
        if not s < a < b or c - b != a - s or not _mirrors(fn, s, a, b):
            continue
        if any(ins.spec.group in ("control", "call") for ins in code[:s] + code[c:]):
            continue
        if any(isinstance(x, Label) and not s <= fn.labels[x.name] < b
               for ins in code[s:b] for x in ins.args):
            continue                # A's and B's control flow stays within them
        memo = _summaries(program)
        tail = code[b:]
        params = set(fn.params)
        if _writes(program, tail, memo) & params:
            continue
        shared = _writes(program, code[a:b], memo) & set().union(*map(_mentioned, tail))
        if shared & params:
            continue
        # cells: the copy and the uncompute store only into fn's own ancilla arrays, the
        # copy into none the uncompute reaches, which reaches only those and arguments'
        ours, theirs = _cells(program, fn, code[a:b], memo), _cells(program, fn, tail, memo)
        own = _own_blocks(program, fn, memo)
        if ours is None or theirs is None or (ours[0] | theirs[0]) - own or \
                theirs[1] - own - params or ours[0] & theirs[1]:
            continue
        return a, b, sorted(shared, key=str)
    return None


def _mirrors(fn: Function, s: int, a: int, b: int) -> bool:
    """Is code[b:b + a - s] the bytecode inverse of code[s:a] (labels renamed alike)?"""
    code, at = fn.code, fn.labels
    for j in range(a - s):
        one, two = code[a - 1 - j], code[b + j]
        if two.op != isa.OPS[one.op].inverse or len(one.args) != len(two.args):
            return False
        for x, y in zip(one.args, two.args):
            if isinstance(x, Label) and isinstance(y, Label):
                if not s <= at[x.name] < a or at[y.name] != b + a - 1 - at[x.name]:
                    return False
            elif x != y:
                return False
    return True


def split_point(program: Program, fn: Function) -> int | None:
    """b, where fn is P, A, B = code[a:b], A's uncompute, Q (see above), and its value and
    gradient may skip the uncompute and the recompute; None if fn does not have that
    shape."""
    found = _split(program, fn)
    return None if found is None else found[1]


_CALLED = re.compile(r"\b(F\d+_[a-z]+)\(")      # a generated function called
# the output buffer of native code: the state array's cells from OUT0 on (its cell 2 is
# where the next record goes, cell 3 the array's length; see templates.STATE)
OUT0 = STATE
SHOWN_ARRAYS = frozenset({"floats", "ints", "janus", "stack", "chars"})   # kinds showing cells


def _python(body: str) -> str:
    """A generated function as the python engine runs it: direct assignments, finiteness
    once per straight run, math functions as local names."""
    lines = templates.straighten(body.split("\n"))
    lines = templates.common_calls(templates.dead_shadows(lines))
    lines = templates.wrap_once(lines)
    text = re.sub(r"\bmath\.(\w+)\(", r"_m_\1(", "\n".join(lines))
    names = sorted(set(re.findall(r"\b_m_(\w+)\(", text)))
    head, _, rest = text.partition("\n")
    return "\n".join([head] + [f"        _m_{x} = _math_{x}" for x in names] + [rest])


@functools.cache
def _generator_digest() -> str:
    """A digest of the text of the code that writes the generated functions (the
    engines' and the machine model's modules): a cache key made of a program and this
    digest changes with either."""
    import pathlib

    from .cache import text_digest
    here = pathlib.Path(__file__).resolve().parent
    return text_digest(f for folder in (here, here.parent / "core")
                       for f in sorted(folder.glob("*.py")))


class Compiled:
    """The generated functions of one program (all four modes of every function, and for
    a compute-copy-uncompute function the split value and gradient)."""

    def __init__(self, program: Program, checks: bool = True, native: bool = False,
                 strict: bool = False, looks: bool | str = False, resume: bool = False):
        self.program, self.checks, self.native = program, checks, native
        # native code that runs no loop as a counted loop (whose checks are made after
        # its last pass, and which has no back edge to stop at): run only to find where
        # a run failed (Machine._late)
        self.strict = strict
        # native code whose gradient passes look at the shadows where one is dropped and
        # where a function returns: run only to find where a gradient stopped being
        # finite (rvm.ad.gradient.not_finite); rvm.engines.lowering.CELL_LOOKS: over a
        # large heap
        self.looks = looks
        # native code whose root frame may start at a look with a snapshot (the same
        # functions, a second way into the root's block loop): run only to go on from
        # a snapshot far before a failure (Machine._resume)
        self.resume = resume
        self.names = {name: f"F{k}" for k, name in enumerate(program.functions)}
        self.recursive = program.call_order()[1]      # (never native code)
        # function -> (where B starts, where its fws stops, registers checked around B)
        self.split_at: dict[str, tuple] = {}
        for fname, fn in program.functions.items():
            found = _split(program, fn)
            if found is not None:
                self.split_at[fname] = found
        self.splits = {fname: len(program.functions[fname].params) +   # function ->
                       len(program.functions[fname].locals)     # registers its fws returns
                       for fname in self.split_at}
        # function -> the instructions from its uncompute on, which its split runs skip
        # (their bound on the whole run's steps: rvm.ad.gradient.whole_run_fits)
        self.tails = {fname: len(program.functions[fname].code) - at[1]
                      for fname, at in self.split_at.items()}
        self._native: dict = {}
        self._bodies: dict[str, str] = {}
        self._native_bodies: dict[str, str] = {}
        self._by_id = {v: k for k, v in self.names.items()}     # F3 -> its name
        # output statements, numbered in the program's order (the number is in the
        # generated code, and in native code cached on disk): their parts by number, and
        # function -> {line: number}
        self.statements: list[tuple] = []
        self.said_at: dict[str, dict[int, int]] = {}
        for fname, fn in program.functions.items():
            for line, parts in fn.outputs:
                self.said_at.setdefault(fname, {})[line] = len(self.statements)
                self.statements.append(parts)

    def said_text(self, fname: str, line: int) -> str:
        """The generated statement of the output statement of function fname at line:
        `M.said(k, values...)`, a value a register's name, a tuple of them (a complex
        number; an array's size), or a list of them (an array: its base and dimensions;
        native code copies its cells too)."""
        k = self.said_at[fname][line]
        items = []
        for part in self.statements[k]:
            if isinstance(part, str):
                continue
            kind, regs = part
            names = ", ".join(_local(r)[0] for r in regs)
            items.append(f"[{names}]" if kind in SHOWN_ARRAYS else
                         names if len(regs) == 1 else f"({names},)")
        return f"M.said({k}{''.join(', ' + x for x in items)})"

    def said_regs(self, fname: str, line: int) -> set:
        """The registers the output statement of fname at line shows (none: no such)."""
        k = self.said_at.get(fname, {}).get(line)
        return set() if k is None else \
            {r for part in self.statements[k] if not isinstance(part, str) for r in part[1]}

    def spoken(self, S) -> list[str]:
        """The lines native code's output records (in the state array S, after OUT0, up
        to S[2]) show, in order (see rvm.engines.lowering: Lowering.said)."""
        import numpy as np
        words, lines, pos = S[OUT0:int(S[2])], [], 0
        floats = words.view(np.float64)
        while pos + 2 <= len(words):
            k, size = int(words[pos]), int(words[pos + 1])
            at, end = pos + 2, pos + size
            if not 0 <= k < len(self.statements) or not pos + 2 <= end <= len(words):
                raise MachineError("malformed output records from native code", "")
            shown = []                  # every value's registers, then arrays' cells
            for part in self.statements[k]:
                if not isinstance(part, str):
                    shown.append([int(words[at + j]) if r.cls == isa.INT else
                                  float(floats[at + j]) for j, r in enumerate(part[1])])
                    at += len(part[1])
            text, values = [], iter(shown)
            for part in self.statements[k]:
                if isinstance(part, str):
                    text.append(part)
                    continue
                kind, cells = part[0], None
                regs = next(values)
                if kind in SHOWN_ARRAYS:
                    n = math.prod(regs[1:])
                    cells = (floats if kind == "floats" else words)[at:at + n].tolist()
                    at += n
                text.append(show_value(kind, regs, cells))
            if at != end:
                raise MachineError("malformed output records from native code", "")
            lines.append("".join(text))
            pos = end
        return lines

    def body(self, name: str) -> str:
        """One generated function's text (`F3_gbw`), made on first need: a native compile
        writes only the functions its entries reach, and a program found in the disk cache
        none at all (see key)."""
        text = self._bodies.get(name)
        if text is None:
            fname = self._by_id[name.split("_")[0]]
            mode = name.split("_", 1)[1]
            fn = self.program.functions[fname]
            if mode in ("fws", "gbws"):
                self._bodies.update(self.split(fname, fn, *self.split_at[fname]))
            else:
                backward, gradient = MODES[mode]
                writer = _Writer(self, inverse_function(fn) if backward else fn, gradient)
                self._bodies[name] = writer.source(name)
            text = self._bodies[name]
        return text

    @property
    def bodies(self) -> dict[str, str]:
        """Every generated function's text by name, in the order of body_names."""
        return {name: self.body(name) for name in self.body_names()}

    def body_names(self) -> list[str]:
        """The generated functions' names, in the order of bodies."""
        return [self.name(f, mode) for f in self.program.functions for mode in MODES] + \
            [self.name(f, mode) for f in self.split_at for mode in ("fws", "gbws")]

    def param_kinds(self) -> dict[str, list[str]]:
        """{generated function: its parameters' dtypes} for the forward, backward and split
        forward modes (their parameters are the function's)."""
        return {self.name(f, mode): ["float64" if p.cls == isa.FLOAT else "int64"
                                     for p in fn.params]
                for f, fn in self.program.functions.items() for mode in ("fw", "bw", "fws")}

    def most_steps(self, fname: str) -> int | None:
        """The most steps a call of fname can take (the interpreter's count, its callees'
        included), or None where it can loop (a branch back, a call of such, recursion)."""
        most = self.__dict__.get("_most_steps")
        if most is None:        # every function's, callees first (no Python recursion)
            order, cyclic = self.program.call_order()
            most = self._most_steps = {}
            for name in order:
                fn, total = self.program.functions[name], 0
                for i, ins in enumerate(fn.code):
                    inner = most.get(ins.args[0].name) if ins.op in isa.CALLS else -1
                    if inner is None or cyclic or (ins.op in isa.BRANCHES and
                                                   fn.labels[ins.args[-1].name] <= i):
                        total = None
                        break
                    total += 1 if inner < 0 else 2 + inner
                most[name] = total
        return most.get(fname)

    def tested(self, fname: str) -> bool:
        """Does fname's native code test the step budget before its calls (at most SPAN
        steps apart: see _reach; its callers before and after each call of it)? A
        function without loops that calls others and can take more than TESTED_ABOVE
        steps does: with no back edge it would test nothing, and a tree of such calls
        can take 2^40 steps. Where a test finds the budget short of the steps to the
        next test, the run stops there, before the call (the call's checkpoint record,
        the budget left in the state array's STOP cell) or after it (a record of its
        own, AT_SITE: rvm.engines.lowering, Lowering.stop_at), and the interpreter
        takes the few steps from there to where the budget runs out
        (Machine._exhausted)."""
        return fname in self._tested

    @functools.cached_property
    def _tested(self) -> frozenset:
        """The functions that test the budget at their calls (see tested)."""
        return frozenset(
            name for name, fn in self.program.functions.items()
            if (self.most_steps(name) or 0) > TESTED_ABOVE and
            any(ins.op in isa.CALLS for ins in fn.code))

    def reach(self, fn: Function) -> tuple[list[int], set[int]]:
        """_reach for fn (a function's code run either way, or a part of it): its calls
        with a budget test, and the steps to the next test from each instruction."""
        own = fn.name in self.program.functions
        return _reach(fn, self.tested, self.most_steps, own and (
            self.tested(fn.name) or self.most_steps(fn.name) is None))

    def entry_reach(self, fname: str, forward: bool) -> int:
        """The steps from the start of fname (run forwards or backwards) to its first
        budget test (see reach)."""
        cache = self.__dict__.setdefault("_entry_reach", {})
        if (fname, forward) not in cache:
            fn = self.program.functions[fname]
            cache[fname, forward] = self.reach(fn if forward else inverse_function(fn))[0][0]
        return cache[fname, forward]

    @functools.cached_property
    def counted(self) -> bool:
        """May a loop of its native code run as a counted loop (see counted: a loop that
        ends in a branch on two integers)? Known from the program alone, so the same
        whether the code was made or found in the disk cache (it was set while writing
        it: False for code from the cache)."""
        return self.native and not self.strict and any(
            ins.op in isa.BRANCHES and ins.op != "JMP" and
            all(x.cls == isa.INT for x in ins.args[:2])
            for fn in self.program.functions.values() for ins in fn.code)

    @functools.cached_property
    def key(self) -> str:
        """Text that determines the generated functions: the program's functions as they
        print (every field, debug symbols included) and the text of the code that writes
        them, for finding the machine code in the disk cache without writing them."""
        return f"{_generator_digest()}|{self.checks}|{self.native}|{self.strict}|" \
            f"{self.looks}|{self.resume}|" \
            f"{[repr(fn) for fn in self.program.functions.values()]}"

    @functools.cached_property
    def source(self) -> str:
        """The Python engine's module: a factory of the generated functions (made on
        first need: native runs never read it)."""
        parts = ["def make(Fault, Limit, wrap, zero, sign, dpow_db, math):",
                 "    from itertools import repeat as _repeat"]
        parts += [_python(body) for body in self.bodies.values()]
        used = sorted(set(re.findall(r"\b_m_(\w+)\(", "\n".join(parts))))
        parts[1:1] = [f"    _math_{name} = math.{name}" for name in used]
        parts.append("    return {" + ", ".join(f"'{name}': {name}" for name in self.bodies)
                     + "}")
        return "\n".join(parts) + "\n"

    @functools.cached_property
    def _make(self):
        """The Python functions' factory, compiled on first need: native runs never need
        it (Python's compiler holds on to about 60 bytes of memory per byte of source,
        90 MB for the GMM example's 1.5 MB)."""
        namespace: dict = {}
        exec(compile(self.source, "<rvm compiled>", "exec"), namespace)  # from verified code
        return namespace["make"]

    def name(self, function: str, mode: str) -> str:
        return f"{self.names[function]}_{mode}"

    def split(self, fname: str, fn: Function, a: int, b: int, shared: list) -> dict[str, str]:
        """fws and gbws for a function split after code[:b], B = code[a:b] (see _split):
        fws checks that the registers B and the uncompute share are zero before and
        after B."""
        regs = list(fn.params) + list(fn.locals)
        k = len(shared)
        zeros = tuple(_Instruction("ZERO", (r,), fn.code[a].line) for r in shared)
        head = attrs.evolve(fn, code=fn.code[:a] + zeros + fn.code[a:b] + zeros,
                            labels={x: i + k * (i >= a) for x, i in fn.labels.items() if i < b})
        forward = _Writer(self, head, False, outputs=regs, restores=[])
        out = {self.name(fname, "fws"): forward.source(self.name(fname, "fws"))}
        inverse = inverse_function(fn)
        s = len(fn.code) - b
        tail = attrs.evolve(inverse, params=tuple(regs), code=inverse.code[s:],
                            labels={k: i - s for k, i in inverse.labels.items() if i >= s})
        backward = _Writer(self, tail, True, restores=list(fn.locals))
        floats = {r for r in fn.locals if r.cls == isa.FLOAT}
        backward.entry = _Known(forward.exit.zeros, floats, forward.exit.pending,
                                forward.exit.plus)  # the
        # same registers, same values; the locals' shadows start at zero
        out[self.name(fname, "gbws")] = backward.source(self.name(fname, "gbws"))
        return out

    def bind(self, machine) -> dict:
        if self.native:         # compiled once per tolerance, then shared
            key = (machine.tol,)
            if key not in self._native:
                from . import native
                with _COMPILING:         # threads wanting the same code wait for one compile
                    if key not in self._native:
                        self._native[key] = native.Functions(self, *key)
            return self._native[key]
        zero = lambda v: abs(v) <= machine.tol
        return self._make(Fault, Limit, templates.wrap, zero, templates.sign, templates.dpow_db,
                          templates.MATH)

    def native_text(self, roots) -> str:
        """The generated functions that `roots` (names of generated functions) run,
        themselves included, rewritten for native code (rvm.engines.llvm lowers them)."""
        from . import native
        out, seen, work = [], set(), list(roots)
        while work:
            name = work.pop()
            if name in seen:
                continue
            seen.add(name)
            text = self._native_bodies.get(name)
            if text is None:
                text = native.defer_checks("\n".join(
                    line[4:] for line in self.body(name).split("\n")))
                self._native_bodies[name] = text
            out.append(text)
            work += _CALLED.findall(text)
        return "\n".join(out) + "\n"

    @property
    def native_bodies(self) -> str:
        """Every generated function, rewritten for native code."""
        return self.native_text(reversed(self.body_names()))

    @property
    def uses_heap(self) -> bool:
        return any(ins.spec.group == "memory" for f in self.program.functions.values()
                   for ins in f.code)

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
                      np.frombuffer(machine._gbuf, dtype=np.float64),
                      np.zeros(STATE, np.int64))
            machine._native_heap = cached
        if machine.said_cells and len(cached[4]) != OUT0 + machine.said_cells:
            # a program with output statements: its output buffer after the state
            # (rvm.engines.lowering: Lowering.said)
            state = np.zeros(OUT0 + machine.said_cells, np.int64)
            state[3] = len(state)
            cached = machine._native_heap = cached[:4] + (state,)
        cached[4][0], cached[4][LEFT] = machine.top, machine.max_steps
        cached[4][LAST] = cached[4][NOW] = -1      # (a run's own: see templates.STATE)
        cached[4][STOP] = NO_STOP
        cached[4][SHADOWS], cached[4][SHADOWS_BAD] = -1, 0
        # the heap at a look in the root frame, as large as the heap (Lowering.snapshot),
        # and its address (numpy's costs a microsecond a run)
        snap, at = machine.__dict__.get("_snapshot") or (None, 0)
        from .lowering import SNAP_AT, SNAP_CELLS, SNAP_HEAD, SNAP_ROOM
        room = min(machine.cap, SNAP_CELLS)
        if snap is None or snap[SNAP_ROOM] < room:
            snap = np.zeros(SNAP_HEAD + 2 * room, np.int64)
            snap[SNAP_ROOM], at = room, snap.ctypes.data
            machine._snapshot = snap, at
        snap[SNAP_AT] = -1      # (none taken in this run yet)
        cached[4][ROOT], cached[4][SNAP] = -1, at       # (run names the root)
        # a look's record the root frame starts from (Machine._resume), else its entry
        resume = machine.__dict__.get("_resume_record")
        cached[4][RESUME] = 0 if resume is None else resume.ctypes.data
        if machine.said_cells:
            cached[4][2] = OUT0         # nothing written yet
        room = machine.heap_room()      # (compiled code keeps its frames' room free)
        if room < len(cached[1]):
            return tuple(a[:max(room, 1)] for a in cached[1:4]) + cached[4:]
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
        machine.live, cells = 1, machine.frame_cells     # (see _Writer.call)
        heap = self.heap(machine) if self.native else (machine,)
        if self.native and machine.wants_gradient and mode == "fw":
            funcs.gradient(fn.name)       # this forward run's code comes with the gradient's
        function = funcs[self.name(fn.name, mode)]
        if self.native:         # (its frame may keep snapshots: Lowering.claim)
            from .lowering import name_id
            heap[3][ROOT] = name_id(self.name(fn.name, mode))
        try:
            out = function(*heap, *args)
        except Fault as exc:
            raise InvertibilityError(f"{exc} (compiled engine; use engine='interp' to see "
                                     "the instruction)", fn.name) from None
        except RecursionError:
            raise MachineError("call depth limit exceeded (unbounded recursion?)",
                               fn.name) from None
        except (ArithmeticError, ValueError) as exc:
            raise MachineError(f"arithmetic error: {exc}", fn.name) from None
        finally:
            machine.frame_cells = cells
        if self.native:
            machine.top = int(heap[3][0])
            out = [v.item() if hasattr(v, "item") else v for v in out]
            if self.statements:
                machine.pending += self.spoken(heap[3])
        for k, v in zip(slots, out):
            R[k] = v
        if grad:
            for k, g in zip(floats, out[len(slots):]):
                fr.G[k] = g
        fr.state = 2 * len(fn.code) if e > 0 else 0


def compiled(program: Program, checks: bool = True, native: bool = False,
             strict: bool = False, looks: bool | str = False,
             resume: bool = False) -> Compiled:
    key = ("compiled", checks, native) + (("strict",) if strict else ()) + \
        (("looks", looks) if looks else ()) + (("resume",) if resume else ())
    if key not in program.cache:
        with _COMPILING:        # threads wanting it at once share one (and its native code)
            if key not in program.cache:
                program.cache[key] = Compiled(program, checks, native, strict, looks, resume)
    return program.cache[key]
