"""Rows in lockstep: the batch loops of rvm.vmap run several rows at once, one per lane of
the CPU's vector registers (SIMD), for programs without heap.

Each generated function gets a lane version (`<name>_lanes`) in which every local is a
vector with one element per row, and control flow is the rows' own, made of masks: an
`if` runs both arms, each under the rows its test picks; a loop runs while some row is
still in it; the generated code's block loop (`while _b >= 0:` with a case per basic
block, see rvm.engines.lowering's dispatch) runs, each time round, the lowest-numbered
block that some row is at, for the rows at it. Every assignment changes only the rows in
the current mask, so a row computes exactly what it computes alone, instruction by
instruction (the same IEEE operations, in the same order: the results are the scalar
loop's to the bit), and rows that finish early wait for the others.

Masks cost more than their selects: a value computed under a mask waits for the test
that made it, where the scalar code's predicted branch lets the processor run ahead. So
each block (and each loop that every row enters) is lowered twice, once without masks for
when every row runs it, chosen by a predicted branch; a block whose rows all go to one
block goes straight there; and failed checks are collected per row and acted on where
control leaves a straight run of code, not by a branch per check.

A check that fails in any active row (an invertibility check, a non-finite value
steering control flow, an exhausted step budget, which each row counts for itself) ends
the whole batch call with a fault, as in the scalar loop; the caller then runs the rows
one by one to report it. Idle rows never fault: checks are masked, and an integer
division takes a divisor of 1 where a row is idle.

The batch entry (rvm.engines.llvm._batch_entry) runs whole groups of LANES rows through
the lane functions and the last few rows through the scalar ones.
"""

from __future__ import annotations

import ast
import os

from .lowering import (
    Lowering,
    Types,
    Unsupported,
    block_cases,
    callees,
    declared,
    guard,
    is_exact,
    is_raise,
    pure_function,
    returns_of,
    state_index,
)

LANES = 8       # rows per group: one AVX-512 register of doubles, two AVX ones
enabled = os.environ.get("RVM_LANES", "1") != "0"    # 0: a row at a time (to compare)


class LaneTypes(Types):
    """The locals' types as vectors of LANES elements (the heap's pointers stay scalar;
    s64 is a scalar int64, for indices and the fault flag)."""

    def __init__(self, ir, lanes: int = LANES):
        super().__init__(ir)
        self.lanes = lanes
        self.i64, self.f64, self.i1 = (ir.VectorType(ty, lanes)
                                       for ty in (self.i64, self.f64, self.i1))
        self.state = self.i64.as_pointer()      # heap top and step budget, per row

    def vector(self, ty):
        """The vector type of a scalar parameter type."""
        return {"i64": self.i64, "double": self.f64, "i1": self.i1}[str(ty)]


def signature(ir, t: LaneTypes, node: ast.FunctionDef):
    """A lane function's type: (state, fault flag, the heap's three, mask, parameters)
    -> the results, each a vector."""
    params = [a.arg for a in node.args.args[4:]]
    returns = returns_of(node)
    types = declared(node)
    if any(t.of(types.get(n)) is None for n in params + returns):
        raise Unsupported("a parameter of undeclared type")
    ret = ir.LiteralStructType([t.of(types[n]) for n in returns])
    head = [t.state, t.ptr, t.ptr, t.fptr, t.s64, t.i1]
    return ir.FunctionType(ret, head + [t.of(types[n]) for n in params]), params, returns


def inlined(calls: dict, names) -> set:
    """Those of `names` that never call themselves, directly or not (calls: {generated
    function: the names it calls}): their lane versions are inlined where they are
    called, so a call from a block every row runs passes the constant mask, and the
    callee's masks fold away."""
    return {n for n in names if n not in callees(calls, calls.get(n, ()))}


class Lanes(Lowering):
    """One generated function as its lane version: the scalar lowering's expressions
    (LLVM's operations take vectors as they take scalars), with masked statements."""

    def prologue(self) -> None:
        b, t = self.b, self.t
        self.mask = self.fn.args[5]
        self.none, self.everyone = t.i1(0), t.i1(1)
        self.failed = b.alloca(t.i1, name="failed")     # rows whose checks failed
        b.store(self.none, self.failed)
        for name, ptr in self.vars.items():     # idle rows are at no block (-1)
            b.store(t.f64(0.0) if ptr.type.pointee == t.f64 else
                    ptr.type.pointee(-1 if name == "_b" else 0), ptr)
        for name, arg in zip(self.params, self.fn.args[6:]):
            b.store(arg, self.vars[name])

    # --------------------------------------------------------------- masks
    def reduce(self, op: str, v):
        """llvm.vector.reduce.<op> of v: a scalar."""
        ty = v.type
        name = f"llvm.vector.reduce.{op}.v{self.t.lanes}{ty.element}"
        return self.b.call(self.declare(name, ty.element, [ty]), [v])

    def both_(self, a, b):
        """a and b, row by row (the constant masks folded here: less IR for LLVM)."""
        if a is self.everyone or b is self.none:
            return b
        if b is self.everyone or a is self.none:
            return a
        return self.b.and_(a, b)

    def either(self, a, b):
        """a or b, row by row."""
        if a is self.none or b is self.everyone:
            return b
        if b is self.none or a is self.everyone:
            return a
        return self.b.or_(a, b)

    def some(self, v):
        """Is v true in some row? (a scalar flag)"""
        return self.reduce("or", v)

    def guard(self, bad, block) -> None:
        """Leave through `block` where `bad` holds in an active row; a failed check
        (the fault exit) is noted in `failed` and acted on when control leaves the
        straight run of code (see flush): until then the row computes on harmlessly (no
        heap, no trapping arithmetic), and the others need no branch per check."""
        b = self.b
        bad = self.both_(bad, self.mask)
        if block is self.fault_block:
            b.store(b.or_(b.load(self.failed), bad), self.failed)
        else:
            guard(b, self.some(bad), block)

    def flush(self) -> None:
        """Fault if a check failed in some row."""
        guard(self.b, self.some(self.b.load(self.failed)), self.fault_block)

    leaving = flush         # a return: after the registers' finiteness, which it tests

    # ---------------------------------------------------------- statements
    def slot(self, k: int):
        return self.b.gep(self.S, [self.t.s64(k)])

    def store(self, target, value) -> None:
        if isinstance(target, ast.Name):
            ptr = self.vars[target.id]
        elif state_index(target) is not None:
            ptr = self.slot(state_index(target))
        else:
            raise Unsupported("the heap, in lockstep")
        value = self.coerce(value, ptr.type.pointee)
        if self.mask is not self.everyone:      # (every row: a plain store)
            value = self.b.select(self.mask, value, self.b.load(ptr))
        self.b.store(value, ptr)

    def jump(self, k: int) -> None:
        """`_b = k`: the rows in the mask go to block k, and leave this one. From a block
        that every row runs (see both), straight to block k, which every row runs next."""
        self.store(ast.Name("_b"), self.t.i64(k))
        head, after, uniform = self.cases
        if self.mask is self.everyone and not self.loops:
            self.flush()
            self.b.branch(after if k < 0 else uniform.get(k, head))
        self.jumped.add(k)
        self.mask = self.none

    def onward(self) -> None:
        """The end of a block: where every row went to the same block (one this block
        jumps to), straight there; else back to the block loop's head."""
        b, t = self.b, self.t
        head, after, uniform = self.cases
        self.flush()
        at = b.load(self.vars["_b"])
        for k in sorted(self.jumped):
            there = b.icmp_signed("<" if k < 0 else "==", at, t.i64(max(k, 0)))
            guard(b, self.reduce("and", there), after if k < 0 else uniform.get(k, head))
        b.branch(head)

    def both(self, mask, lower) -> None:
        """lower() twice: for when every row is in `mask` (self.mask the constant
        everyone: no selects, so no value waits for the mask, and the branch that picks
        this version is predicted), and for a part of them. self.mask is then what
        either left."""
        b = self.b
        every, part, after = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(self.reduce("and", mask), every, part)
        ends = []
        for block, m in ((every, self.everyone), (part, mask)):
            b.position_at_end(block)
            self.mask = m
            lower()
            if not b.block.is_terminated:
                ends.append((self.mask, b.block))
                b.branch(after)
        b.position_at_end(after)
        if not ends:
            b.unreachable()
            return
        self.mask = b.phi(self.t.i1)
        for m, block in ends:
            self.mask.add_incoming(m, block)

    def statement(self, s) -> None:
        b = self.b
        if isinstance(s, ast.If) and is_exact(s.test):
            self.body(s.orelse)         # rows would loop different numbers of times
        elif isinstance(s, ast.If) and not is_raise(s.body):
            test = self.truth(self.expr(s.test))
            outer = self.mask
            self.mask = self.both_(outer, test)
            self.body(s.body)
            then = self.mask
            self.mask = self.both_(outer, b.not_(test))
            self.body(s.orelse)
            self.mask = self.either(then, self.mask)
        elif isinstance(s, ast.While) and block_cases(s) is None:
            self.loop(s)
        elif isinstance(s, (ast.Break, ast.Continue)):
            ptr = self.loops[-1][isinstance(s, ast.Break)]
            b.store(self.either(b.load(ptr), self.mask), ptr)
            self.mask = self.none
        elif isinstance(s, ast.Raise):
            self.guard(self.t.i1(1), self.fault_block)
        else:
            super().statement(s)

    def loop(self, s: ast.While) -> None:
        """A loop that runs while its test holds in some row still in it: rows leave it
        by break (or a jump to another block), stay by continue or its body's end."""
        b, t = self.b, self.t
        # every row can be in the loop only if every row came to it (in a block's masked
        # version, some rows are elsewhere: no version without masks there)
        whole = self.mask is self.everyone or self.mask is self.fn.args[5]
        with b.goto_block(self.fn.entry_basic_block):
            live, cont, out = (b.alloca(t.i1) for _ in range(3))
        b.store(self.mask, live)
        b.store(self.none, out)
        head, body, after = (self.fn.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        mask = b.load(live)
        if not (isinstance(s.test, ast.Constant) and s.test.value is True):
            self.mask = mask
            test = self.truth(self.expr(s.test))
            b.store(b.or_(b.load(out), b.and_(mask, b.not_(test))), out)
            mask = b.and_(mask, test)
        b.cbranch(self.some(mask), body, after)
        b.position_at_end(body)

        def once():
            b.store(self.none, cont)
            self.loops.append((cont, out))
            self.body(s.body)
            self.loops.pop()
            b.store(self.either(self.mask, b.load(cont)), live)
        if whole:
            self.both(mask, once)
        else:
            self.mask = mask
            once()
        self.flush()
        b.branch(head)
        b.position_at_end(after)
        self.mask = b.load(out)

    def dispatch(self, cases: dict) -> None:
        """The block loop: each time round, the lowest-numbered block some row is at, for
        the rows at it (a row's blocks run in its own order; rows that went on wait)."""
        b, t = self.b, self.t
        head, pick, after = (self.fn.append_basic_block() for _ in range(3))
        entries = {k: self.fn.append_basic_block() for k in cases}
        uniform = {k: self.fn.append_basic_block() for k in cases}
        outer, self.cases, entry = self.cases, (head, after, uniform), self.mask
        b.branch(head)
        b.position_at_end(head)
        at = b.load(self.vars["_b"])
        live = b.icmp_signed(">=", at, t.i64(0))
        b.cbranch(self.some(live), pick, after)
        b.position_at_end(pick)
        switch = b.switch(self.reduce("smin", b.select(live, at, t.i64(2 ** 62))), after)
        for k, stmts in cases.items():
            switch.add_case(t.s64(k), entries[k])
            b.position_at_end(entries[k])
            mask = b.icmp_signed("==", b.load(self.vars["_b"]), t.i64(k))
            part = self.fn.append_basic_block()
            b.cbranch(self.reduce("and", mask), uniform[k], part)
            for block, m in ((uniform[k], self.everyone), (part, mask)):
                b.position_at_end(block)
                self.mask, self.jumped = m, set()
                self.body(stmts)
                if not b.block.is_terminated:
                    self.onward()
        self.cases, self.mask = outer, entry
        b.position_at_end(after)

    def call(self, target: ast.Tuple, value: ast.Call) -> None:
        """A callee's lane version, for the rows in the mask (it leaves the others be)."""
        b = self.b
        callee = self.functions[value.func.id][0]
        args = [self.S, self.flag, self.H, self.G, self.cap, self.mask] + [
            self.coerce(self.expr(a), ty)
            for a, ty in zip(value.args[4:], callee.function_type.args[6:])]
        out = b.call(callee, args)
        guard(b, b.icmp_signed("!=", b.load(self.flag), self.t.s64(0)), self.passed)
        for k, t_ in enumerate(target.elts):
            self.store(t_, b.extract_value(out, k))

    def helper(self, name: str, args: list):
        raise Unsupported("the heap, in lockstep")

    def array_helper(self, name: str, args: list):
        raise Unsupported("the heap, in lockstep")

    def in_heap(self, base: str, off: str):
        raise Unsupported("the heap, in lockstep")

    # --------------------------------------------------------- expressions
    def intrinsic(self, name: str, *args):
        if name == "pow":       # (a square a product, else libm's row by row: POW)
            return Lowering.intrinsic(self, name, *args)
        ty = self.t.f64
        fn = self.declare(f"llvm.{name}.v{self.t.lanes}f64", ty, [ty] * len(args))
        return self.b.call(fn, list(args))

    def libm(self, name: str, *args):
        """A C library function, row by row."""
        b, f64 = self.b, self.t.f64.element
        fn = pure_function(self.declare(name, f64, [f64] * len(args)))
        out = self.t.f64(0.0)
        for k in range(self.t.lanes):
            at = self.t.s64(k)
            out = b.insert_element(out, b.call(fn, [b.extract_element(a, at) for a in args]),
                                   at)
        return out


def splat(b, t: LaneTypes, value):
    """A vector with `value` (a scalar) in every row."""
    out = t.vector(value.type)(0.0 if str(value.type) == "double" else 0)
    for k in range(t.lanes):
        out = b.insert_element(out, value, t.s64(k))
    return out
