"""Activity: the pullbacks that a gradient with respect to some arguments only can leave
out, as JAX leaves out the cotangents no requested gradient needs.

A value is *varied* where it depends on an argument the gradient is taken with respect
to. The gradient pass pulls each shadow back into what its value was computed from; into
an operand whose cells never hold a varied value, that reaches only the gradients of
values that are not varied either (what such a value was computed from), none of which
is asked for. So an instruction's pullback into such an operand is left out
(Instruction.pull): a matrix product's into the data it multiplies, an elementwise
statement's into a view of the data, a scalar instruction's into a float register or a
heap cell read in (rvm.engines.templates.pulled). The gradients asked for come out bit
for bit as before; the others are not worked out, and not returned.

The analysis is a may-analysis of the whole program, insensitive to order and to calling
context: one fact per register of each function, per heap block and for the stack.

- Blocks: each array argument of the entry function, and each ALLOC instruction (every
  block it makes, as one). An integer register may point into the blocks whose base
  addresses reach it: through integer arithmetic, calls (a parameter and its argument
  are one register), exchanges with heap cells and the stack. A memory or view operand
  addresses the blocks its base and offset registers may point into; one that may
  address none (an address made of plain numbers) stops the analysis, and every
  pullback stays.
- Varied: the differentiated arguments (float scalars, and float arrays' blocks), then
  every float register, block, or the stack, that an instruction writes from a varied one
  (an exchange both ways; a read as a constant, ADDK, carries no derivative, nor do
  integers).

Only the functions the entry function reaches are analysed. It counts on an address
staying inside the block its base points into: the Python frontend checks every index and
slice against its array's bounds before using it, so the analysis is made for programs
this process compiled from Python only (rvm.lang.FRONTEND): not for assembly, nor for
bytecode read from a file (whose debug information may say anything), nor where the
entry reaches a derived function of rvm.tangent or rvm.adjoint, which lays out a heap of
its own (a derived program, or one whose reversible code calls a derivative program:
rvm.lang.MERGED).
"""

from __future__ import annotations

import threading

import attrs

from ..core import isa
from ..core.program import Function, Mem, Program, Reg, View
from ..engines.arrays import INTERLEAVED
from ..engines.compiled import DERIVED
from ..lang import FRONTEND, MERGED

STACK = ("stack",)
PULLED = frozenset({"VMADD", "VMSUB"} | {s.name for s in isa.TABLE
                                          if s.name.startswith(("VADD", "VSUB"))})
# scalar instructions whose gradients add into the shadows of the operands after the
# target (rvm.engines.templates.pulled leaves out those an instruction's pull clears)
SCALAR_PULLED = frozenset({s.name for s in isa.TABLE if s.group in ("arith", "family")} |
                          (isa.READS - isa.CONSTANT_READS))


def pruned(program: Program, name: str, arrays: frozenset, active: frozenset) -> Program:
    """The program with the pullbacks left out that a gradient of function `name` with
    respect to its parameters `active` does not need (indices into its params: float
    scalars' registers, float arrays' base registers; `arrays`: every array argument's
    base register), or the program itself where none is (or the analysis does not
    apply). Kept per program."""
    key = ("activity", name, arrays, active)
    with _LOCK:             # (threads calling one gradient share one pruned program)
        if key not in program.cache:
            program.cache[key] = _Analysis(program, name, arrays, active).pruned() or program
    return program.cache[key]


_LOCK = threading.Lock()


class _Unknown(Exception):
    """An operand may address no known block."""


class _Analysis:
    def __init__(self, program: Program, name: str, arrays: frozenset, active: frozenset):
        self.program = program
        calls, reached = program.calls(), [name]      # (the functions the entry reaches:
        for f in reached:                               # the others' parameters point
            reached += [g for g in calls[f] if g not in reached]    # nowhere)
        self.fns = {f: program.functions[f] for f in reached}
        entry = self.fns[name]
        self.points: dict = {}      # a register or a block's cells -> blocks it may point into
        self.varied: set = set()    # float registers, blocks, the stack
        self.known = False          # (every address's blocks found: see blocks)
        for k in arrays:
            self.points[self.reg(entry, entry.params[k])] = {("arg", k)}
        for k in active:
            self.varied.add(("arg", k) if k in arrays else self.reg(entry, entry.params[k]))

    def pruned(self) -> Program | None:
        program = self.program
        derived = {*program.cache.get(DERIVED, {}), *program.cache.get(MERGED, ())}
        if not program.cache.get(FRONTEND) or INTERLEAVED in program.cache or \
                any(f in derived for f in self.fns) or \
                not any(ins.op in PULLED or ins.op in SCALAR_PULLED
                        for f in self.fns.values() for ins in f.code):
            return None
        try:
            self.fixpoint(self.int_flows, self.points)
            self.known = True
            for f in self.fns.values():         # (every address's blocks known, or stop)
                for ins in f.code:
                    for a in ins.args:
                        if isinstance(a, Mem):
                            self.blocks(f, a)
            self.fixpoint(self.float_flows, self.varied)
            changed = {}
            for f in self.fns.values():
                code = tuple(attrs.evolve(ins, pull=self.pull(f, ins))
                             if ins.op in PULLED or ins.op in SCALAR_PULLED else ins
                             for ins in f.code)
                if code != f.code:
                    changed[f.name] = attrs.evolve(f, code=code)
        except _Unknown:
            return None
        if not changed:
            return None
        # (of its cache, what it says of the program; the rest, its machines and code,
        # is made again)
        kept = {k: program.cache[k] for k in (DERIVED,) if k in program.cache}
        return attrs.evolve(program, cache=kept, functions={
            n: changed.get(n, f) for n, f in program.functions.items()})

    # ------------------------------------------------------------------ facts
    @staticmethod
    def reg(f: Function, r: Reg) -> tuple:
        return (r.cls, f.name, r.n)

    def blocks(self, f: Function, m: Mem) -> set:
        """The blocks a memory or view operand may address (so far, while addresses are
        still being followed; then none stops the analysis)."""
        out = set(self.points.get(self.reg(f, m.base), ()))
        if isinstance(m.off, Reg):
            out |= self.points.get(self.reg(f, m.off), set())
        if not out and self.known:
            raise _Unknown
        return out

    def fixpoint(self, flows, facts) -> None:
        """flows(f, pc, ins) for every instruction, until no fact changes."""
        size = lambda: sum(map(len, facts.values())) if isinstance(facts, dict) \
            else len(facts)
        before = -1
        while size() != before:
            before = size()
            for f in self.fns.values():
                for pc, ins in enumerate(f.code):
                    flows(f, pc, ins)

    def calls(self, f: Function, ins, cls: str):
        """(argument, parameter) register keys a call binds, of one register class."""
        callee = self.fns[ins.args[0].name]
        for r, p in zip(ins.args[1:], callee.params):
            if isinstance(r, Reg) and r.cls == cls:
                yield self.reg(f, r), self.reg(callee, p)

    # ------------------------------------------------------------------ addresses
    def join(self, dst, *srcs) -> None:
        points = self.points
        got = set().union(*(points.get(s, ()) for s in srcs))
        if not got <= points.get(dst, set()):
            points.setdefault(dst, set()).update(got)

    def alike(self, f: Function, ins, cls: str, link, cell) -> bool:
        """The flows of calls, arithmetic, and exchanges and reads between a register and
        the heap, alike for addresses (integers: link is join, cell(block) the key of the
        block's cells) and derivatives (floats: mark, a block its own key; a read as a
        constant carries no derivative): True where ins is one of those."""
        spec, args = ins.spec, ins.args
        if spec.group == "memory" and ins.op not in ("ALLOC", "FREE"):
            if args[0].cls == cls:
                r = self.reg(f, args[0])
                cells = [cell(STACK)] if ins.op in ("PUSH", "POP") else \
                    [cell(b) for b in self.blocks(f, args[1])]
                for c in cells:     # (a push or pop both ways: uncalled, one is the other)
                    if cls == isa.INT or ins.op not in ("ADDK", "SUBK"):
                        link(r, c)
                    if ins.op in ("EXCH", "PUSH", "POP"):
                        link(c, r)
            return True
        if spec.group == "call":
            for a, p in self.calls(f, ins, cls):
                link(a, p)
                link(p, a)
            return True
        if spec.group not in ("arith", "family"):
            return False
        if spec.kinds[1:2] != ("V",):       # (a comparison's 0 or 1, or a check: none)
            regs = [self.reg(f, a) for a in args if isinstance(a, Reg) and a.cls == cls]
            for a, k in zip(args, spec.kinds):
                if k in "DX" and isinstance(a, Reg) and a.cls == cls:
                    link(self.reg(f, a), *regs)
        return True

    def int_flows(self, f: Function, pc: int, ins) -> None:
        spec, args = ins.spec, ins.args
        if self.alike(f, ins, isa.INT, self.join, lambda b: ("cells", b)):
            return
        if ins.op == "ALLOC":
            self.points.setdefault(self.reg(f, args[0]), set()).add(("alloc", f.name, pc))
        elif spec.group == "array":     # (cells moved or mixed bit for bit: conservatively)
            views = [self.blocks(f, a) for a in args if isinstance(a, View)]
            for b in views[0] if views else ():
                self.join(("cells", b), *(("cells", c) for v in views for c in v))

    # ------------------------------------------------------------------ derivatives
    def mark(self, dst, *srcs) -> None:
        if dst not in self.varied and any(s in self.varied for s in srcs):
            self.varied.add(dst)

    def float_flows(self, f: Function, pc: int, ins) -> None:
        spec, args = ins.spec, ins.args
        if self.alike(f, ins, isa.FLOAT, self.mark, lambda b: b):
            return
        if spec.group == "array":
            sources = [b for a in args[1:] if isinstance(a, View) for b in self.blocks(f, a)]
            sources += [self.reg(f, a) for a in args if isinstance(a, Reg) and
                        a.cls == isa.FLOAT]
            written = self.blocks(f, args[0])
            if ins.op == "VSWAP":
                written |= self.blocks(f, args[1])
            for b in written:
                self.mark(b, *written, *sources)

    def pull(self, f: Function, ins) -> int:
        """The instruction's pull mask: bit k cleared for an operand k after the target
        that never holds a varied value: a view or a heap cell whose blocks do not, a
        float register that does not."""
        pull, array = -1, ins.op in PULLED
        for k, a in enumerate(ins.args[1:3] if array else ins.args[1:]):
            if array:
                unvaried = isinstance(a, View) and not self.blocks(f, a) & self.varied
            elif isinstance(a, Reg):
                unvaried = a.cls == isa.FLOAT and self.reg(f, a) not in self.varied
            else:       # (a heap cell read into a float)
                unvaried = isinstance(a, Mem) and ins.args[0].cls == isa.FLOAT and \
                    not self.blocks(f, a) & self.varied
            if unvaried:
                pull &= ~(1 << k)
        return pull
