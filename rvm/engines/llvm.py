"""The native engine's back end: LLVM IR written straight from the generated functions.

numba spends most of a first compile in its Python front end (type inference and
lowering, about 5 ms per generated line). The functions rvm generates need none of
that: every local's type follows from its name (`r3` int64, `f3` and `gf3` float64,
`_ok` a flag), and the statements are a small fixed subset of Python (assignments,
if/while/break/continue, heap cells and helpers, calls of other generated functions,
`raise Fault`). This module lowers that subset to LLVM IR with llvmlite, optimises it
with LLVM's -O2 pipeline and keeps the machine code in the on-disk cache as an object
file. Entries: the four run modes of every function, the fused value-and-gradient calls
(vg; vgs for programs without heap) and the batch loops of rvm.vmap (csb, usb, vgsb,
jsb), each a CPython builtin that unboxes its arguments and boxes its results itself.

Semantics are the numba engine's (the same source, after rvm.engines.native's rewrite):
int64 arithmetic wraps; a failed check, a non-finite float result, an exhausted step
budget, an integer division by zero sets a fault code and returns, and the machine re-runs
the pass on the interpreter to report it ("heap capacity exceeded" grows the heap first).
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import importlib.util
import os
import pathlib
import re
import sys

import numpy as np

from ..core.isa import MIN_NORMAL
from .templates import Fault

available = importlib.util.find_spec("llvmlite") is not None
# RVM_LLVM=0: every native function from numba (to compare the two back ends)
enabled = available and os.environ.get("RVM_LLVM", "1") != "0"


def usable() -> bool:
    """Is the back end on, and llvmlite recent enough (LLVM's new pass manager)?"""
    return enabled and _recent()


@functools.cache
def _recent() -> bool:
    try:
        import llvmlite.binding as ll
    except ImportError:
        return False
    with contextlib.suppress(RuntimeError):     # older llvmlite must be initialised
        ll.initialize()
    return hasattr(ll, "create_pass_builder")


# a local's type follows from its name
_INT_NAMES = re.compile(r"g?r\d+|_n|_b|_a|T0|t0|b0")
_FLOAT_NAMES = re.compile(r"g?f\d+|_fin|p|c|s")
_REGISTER = re.compile(r"f\d+")     # a float register's value (not its shadow)
# functions that raise in Python where machine code returns inf or nan: those whose
# domain is a half line, and the others (sin and cos raise only on inf, which no finite
# register holds; tanh and atan2 never do)
_DOMAIN = {"math.sqrt": "<", "math.log": "<="}
_MATH_ERRORS = {"math.exp", "math.pow", "math.fmod", "np.fmod", "dpow_db"}
_FLAGS = {"_ok", "_m"}
FAULT, FULL = 1, 2      # fault codes: a failed check (or a limit); the heap is full
MESSAGES = {FAULT: "invertibility check failed", FULL: "heap capacity exceeded"}


@functools.cache
def _llvm():
    """llvmlite, initialised once, and a target machine for this CPU."""
    import llvmlite.binding as ll
    import llvmlite.ir as ir
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    safe_codegen()
    return ll, ir, _target_machine()


@functools.cache
def safe_codegen() -> None:
    """Turn off LLVM's early (before register allocation) tail duplication, for every
    compile in this process (numba's too: they share one LLVM). In the LLVM that llvmlite
    ships (up to 22.1) it can miscompile a loop whose phis take each other's values (two
    registers swapped on a back edge): the swap's copies were made twice on one path,
    and a random program gave wrong results (LLVM's fix: "[TailDuplicator] Fix
    miss-compile with PHI referencing each other in TailBB"). The later tail duplication,
    after register allocation, still runs."""
    import llvmlite.binding as ll
    ll.set_option("rvm", "-disable-early-taildup")


def _target_machine():
    """A target machine for this CPU (an execution engine owns, and frees, its own)."""
    import llvmlite.binding as ll
    return ll.Target.from_default_triple().create_target_machine(
        cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(), opt=2,
        codemodel="jitdefault")


class _Types:
    def __init__(self, ir):
        self.i64, self.f64, self.i1 = ir.IntType(64), ir.DoubleType(), ir.IntType(1)
        self.ptr = self.i64.as_pointer()
        self.fptr = self.f64.as_pointer()

    def of(self, name: str):
        if name in _FLAGS:
            return self.i1
        if _INT_NAMES.fullmatch(name):
            return self.i64
        if _FLOAT_NAMES.fullmatch(name):
            return self.f64
        return None


_FLOAT_OPS = {ast.Add: "fadd", ast.Sub: "fsub", ast.Mult: "fmul", ast.Div: "fdiv"}
_INT_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}


def _loop(b, lo, hi, body, after=None) -> None:
    """body(i) for i in range(lo, hi), leaving to `after` (a new block if None), where the
    builder ends up. The counter lives in the entry block (in the loop, it would take a
    new stack slot every time round)."""
    fn = b.function
    with b.goto_block(fn.entry_basic_block):
        i = b.alloca(lo.type)
    b.store(lo, i)
    head, loop = fn.append_basic_block(), fn.append_basic_block()
    after = after or fn.append_basic_block()
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(i), hi), loop, after)
    b.position_at_end(loop)
    body(b.load(i))
    b.store(b.add(b.load(i), lo.type(1)), i)
    b.branch(head)
    b.position_at_end(after)


def _guard(b, bad, block) -> None:
    """Leave through `block` where `bad` holds; go on where it does not."""
    ok = b.function.append_basic_block()
    b.cbranch(bad, block, ok)
    b.position_at_end(ok)


class Unsupported(Exception):
    """Source outside the subset this back end lowers (the caller falls back to numba)."""


class _Lowering:
    """One generated function (an ast.FunctionDef) as an LLVM function."""

    def __init__(self, ir, t: _Types, functions: dict, node: ast.FunctionDef):
        self.ir, self.t, self.functions, self.node = ir, t, functions, node
        self.fn = functions[node.name][0]
        self.params = functions[node.name][1]
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.S, self.flag, self.H, self.G, self.cap = self.fn.args[:5]
        self.vars: dict = {}
        for name in _assigned(node) | set(self.params):
            ty = t.of(name)
            if ty is None:
                raise Unsupported(f"a local of unknown type: {name}")
            self.vars[name] = self.b.alloca(ty, name=name)
        for name, arg in zip(self.params, self.fn.args[5:]):
            self.b.store(arg, self.vars[name])
        self.loops: list = []       # (continue block, break block)
        self.cases: dict | None = None    # the dispatch loop's blocks (see dispatch)
        self.checking = False       # lowering a check (its failure is a fault anyway)
        self.adjoint = False        # lowering a shadow's update (see python_error)
        self.fault_block, self.full_block = self.exit(FAULT), self.exit(FULL)
        self.passed = self.exit(None)          # a callee's fault: return, its code kept
        self.body(node.body)
        if not self.b.block.is_terminated:
            self.b.unreachable()

    def exit(self, code: int | None):
        """A block that sets the fault flag to `code` (if any) and returns."""
        block = self.fn.append_basic_block(f"fault{code or ''}")
        with self.b.goto_block(block):
            if code is not None:
                self.b.store(self.t.i64(code), self.flag)
            self.b.ret(self.ir.Constant(self.fn.return_value.type, None))
        return block

    def slot(self, k: int):
        return self.b.gep(self.S, [self.t.i64(k)])

    def cell(self, view: str, index):
        """A pointer to heap cell `index` of view HI, HF (HI's cells as floats) or HG."""
        b, t = self.b, self.t
        index = self.coerce(index, t.i64)
        if view == "HI":
            return b.gep(self.H, [index])
        if view == "HF":
            return b.gep(b.bitcast(self.H, t.fptr), [index])
        if view == "HG":
            return b.gep(self.G, [index])
        raise Unsupported(f"heap view {view}")

    def guard(self, bad, block) -> None:
        _guard(self.b, bad, block)

    def helper(self, name: str, args: list):
        """The heap helpers of rvm.engines.native (alloc, free, push, pop, gpush, gpop),
        inline, with the same checks: the value (or values) they return, or None."""
        b, t = self.b, self.t
        top = lambda: b.load(self.slot(0))
        value = lambda k: self.expr(args[k])
        if name == "alloc":                     # alloc(HI, TOP, n)
            n, base = self.coerce(value(2), t.i64), top()
            self.guard(b.or_(b.icmp_signed("<", n, t.i64(0)),
                             b.icmp_signed(">", n, b.sub(self.cap, base))), self.full_block)
            b.store(b.add(base, n), self.slot(0))
            return base
        if name == "free":                      # free(HI, HF, HG, TOP, d, n)
            d, n = self.coerce(value(4), t.i64), self.coerce(value(5), t.i64)
            end = top()
            self.guard(b.or_(b.icmp_signed("<", n, t.i64(0)),
                             b.icmp_signed("!=", d, b.sub(end, n))), self.fault_block)

            def zero(c):
                x = self.intrinsic("fabs", b.load(self.cell("HF", c)))
                small = b.and_(b.fcmp_ordered("<=", t.f64(MIN_NORMAL), x),
                               b.fcmp_ordered("<=", x, t.f64(self.functions["TOL"])))
                bad = b.and_(b.icmp_signed("!=", b.load(self.cell("HI", c)), t.i64(0)),
                             b.not_(small))
                self.guard(bad, self.fault_block)

            def clear(c):
                b.store(t.i64(0), self.cell("HI", c))
                b.store(t.f64(0.0), self.cell("HG", c))
            _loop(b, d, end, zero)
            _loop(b, d, end, clear)
            b.store(d, self.slot(0))
            return None
        if name in ("push", "gpush"):           # push(view, TOP, v); gpush(HF, HG, TOP, v, g)
            view, v = args[0].id, value(2 if name == "push" else 3)
            at = top()
            self.guard(b.icmp_signed(">=", at, self.cap), self.full_block)
            ptr = self.cell(view, at)
            if v.type == t.f64:
                self.finite(v)
            b.store(self.coerce(v, ptr.type.pointee), ptr)
            b.store(b.add(at, t.i64(1)), self.slot(0))
            if name == "gpush":
                b.store(self.coerce(value(4), t.f64), self.cell("HG", at))
            return None
        if name in ("pop", "gpop"):             # pop(view, HI, TOP); gpop(HI, HF, HG, TOP)
            view = args[0].id if name == "pop" else "HF"
            at = top()
            self.guard(b.icmp_signed("==", at, t.i64(0)), self.fault_block)
            at = b.sub(at, t.i64(1))
            b.store(at, self.slot(0))
            v = b.load(self.cell(view, at))
            b.store(t.i64(0), self.cell("HI", at))
            if name == "pop":
                return v
            g = b.load(self.cell("HG", at))
            b.store(t.f64(0.0), self.cell("HG", at))
            return v, g
        raise Unsupported(name)

    # ------------------------------------------------------------ statements
    def body(self, stmts) -> None:
        for s in stmts:
            if self.b.block.is_terminated:
                return
            self.stmt(s)

    def stmt(self, s) -> None:
        outer = self.adjoint
        self.adjoint = outer or _writes_shadow(s)
        try:
            self.statement(s)
        finally:
            self.adjoint = outer

    def statement(self, s) -> None:
        b, ir = self.b, self.ir
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            target = s.targets[0]
            if isinstance(target, ast.Tuple) and isinstance(s.value, ast.Call) and \
                    isinstance(s.value.func, ast.Name) and s.value.func.id in self.functions:
                self.call(target, s.value)
            elif isinstance(target, ast.Tuple) and isinstance(s.value, ast.Call):
                for t_, v in zip(target.elts, self.expr(s.value)):    # gpop
                    self.store(t_, v)
            elif isinstance(target, ast.Tuple):
                values = [self.expr(v) for v in s.value.elts]
                for t_, v in zip(target.elts, values):
                    self.store(t_, v)
            elif self.cases is not None and _named(target, "_b") and \
                    isinstance(s.value, (ast.Constant, ast.UnaryOp)):
                self.jump(ast.literal_eval(s.value))
            elif isinstance(target, ast.Name) and target.id == "_m" and \
                    (terms := _address_terms(s.value)):
                self.store(target, self.in_heap(*terms))
            else:
                self.store(target, self.expr(s.value))
        elif isinstance(s, ast.AugAssign) and _named(s.target, "_ok"):
            # a check: rvm.engines.native.defer_checks folds them into a flag tested when
            # control leaves a straight run of code (fewer blocks for numba); here each is
            # its own branch to the fault exit, so `_ok` stays true (its tests are
            # dropped) and an address `(a) * _m` comes after its check has passed
            self.checking = True        # its comparisons fail alike on nan: no finite()
            self.guard(self.b.not_(self.truth(self.expr(s.value))), self.fault_block)
            self.checking = False
        elif isinstance(s, ast.AugAssign) and _named(s.target, "_fin"):
            pass                        # finiteness: see finite()
        elif isinstance(s, ast.AugAssign):
            self.store(s.target, self.binop(s.op, self.expr(s.target), self.expr(s.value)))
        elif isinstance(s, ast.If):
            if _is_raise(s.body) and isinstance(s.test, ast.UnaryOp) and \
                    _named(s.test.operand, "_ok"):
                return
            if _is_raise(s.body):
                self.checking = True
                self.guard(self.truth(self.expr(s.test)), self.fault_block)
                self.checking = False
                return
            then, other, after = (self.fn.append_basic_block() for _ in range(3))
            b.cbranch(self.truth(self.expr(s.test)), then, other)
            for block, stmts in ((then, s.body), (other, s.orelse)):
                b.position_at_end(block)
                self.body(stmts)
                if not b.block.is_terminated:
                    b.branch(after)
            b.position_at_end(after)
        elif isinstance(s, ast.While) and (cases := _dispatch(s)) is not None:
            self.dispatch(cases)
        elif isinstance(s, ast.While):
            head, loop, after = (self.fn.append_basic_block() for _ in range(3))
            b.branch(head)
            b.position_at_end(head)
            b.cbranch(self.truth(self.expr(s.test)), loop, after)
            b.position_at_end(loop)
            self.loops.append((head, after))
            self.body(s.body)
            self.loops.pop()
            if not b.block.is_terminated:
                b.branch(head)
            b.position_at_end(after)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            self.expr(s.value)
        elif isinstance(s, ast.Break):
            b.branch(self.loops[-1][1])
        elif isinstance(s, ast.Continue):
            b.branch(self.loops[-1][0])
        elif isinstance(s, ast.Pass):
            pass
        elif isinstance(s, ast.Raise):
            b.branch(self.fault_block)
        elif isinstance(s, ast.Return):
            self.finite(*(b.load(self.vars[name]) for name in sorted(self.vars)
                          if _REGISTER.fullmatch(name)))
            elts = s.value.elts if isinstance(s.value, ast.Tuple) else [s.value]
            out = ir.Constant(self.fn.return_value.type, None)
            for k, e in enumerate(elts):
                v = self.expr(e)
                out = b.insert_value(out, self.coerce(v, self.fn.return_value.type.elements[k]),
                                     k)
            b.ret(out)
        else:
            raise Unsupported(ast.unparse(s))

    def finite(self, *values) -> None:
        """Fault unless every value is finite. The Python code tests each float result
        (`_fin += x - x`, once per straight run); here only where a non-finite value could
        stop showing: in a comparison (it would steer control flow), on its way to the
        heap, and in every float register when the function returns. Elsewhere a
        register's value only changes by arithmetic that keeps inf and nan (d += ...,
        x *= y, x /= y, rotations, swaps), so a value that stops being finite is still
        caught before it is seen, and a failed run goes to the interpreter, which reports
        where it happened. (Shadows are not tested: gradients may overflow as in the
        Python engines; where those stop, see python_error.)"""
        bad = self.non_finite(values)
        if bad is not None:
            self.guard(bad, self.fault_block)

    def non_finite(self, values):
        """A flag: some value is inf or nan (x - x is nan then, 0 otherwise); None when
        all are constants."""
        b = self.b
        terms = [b.fsub(v, v) for v in values if not isinstance(v, self.ir.Constant)]
        if not terms:
            return None
        total = functools.reduce(b.fadd, terms)
        return b.fcmp_unordered("uno", total, total)

    def dispatch(self, cases: dict) -> None:
        """The generated code's loop over basic blocks (`while _b >= 0:` `if _b == 0: ...`
        `elif _b == 1: ...`) as the blocks themselves: each `_b = k` is a branch to case
        k (k < 0: out of the loop), so LLVM sees the program's own control flow instead of
        every transfer meeting at one switch."""
        b = self.b
        head, after = self.fn.append_basic_block(), self.fn.append_basic_block()
        blocks = {k: self.fn.append_basic_block() for k in cases}
        outer, self.cases = self.cases, (head, after, blocks)
        b.branch(head)
        b.position_at_end(head)
        at = b.load(self.vars["_b"])
        switch = b.switch(at, after)
        for k, block in blocks.items():
            switch.add_case(self.t.i64(k), block)
        for k, stmts in cases.items():
            b.position_at_end(blocks[k])
            self.body(stmts)
            if not b.block.is_terminated:
                b.branch(head)           # no transfer: the same case again, as in Python
        self.cases = outer
        b.position_at_end(after)

    def jump(self, k: int) -> None:
        head, after, blocks = self.cases
        self.b.store(self.t.i64(k), self.vars["_b"])
        self.b.branch(after if k < 0 else blocks.get(k, head))

    def in_heap(self, base: str, off: str):
        """The address check of a register offset (rvm.engines.templates.address_check:
        base + off in 0 .. T0 - 1, with two negative terms refused) as one overflow test and
        one unsigned comparison: the true sum lies in the heap iff int64 addition does not
        overflow and the sum is below T0 unsigned."""
        b, t = self.b, self.t
        fn = b.module.globals.get("llvm.sadd.with.overflow.i64") or self.ir.Function(
            b.module, self.ir.FunctionType(self.ir.LiteralStructType([t.i64, t.i1]),
                                           [t.i64, t.i64]), "llvm.sadd.with.overflow.i64")
        out = b.call(fn, [b.load(self.vars[base]), b.load(self.vars[off])])
        inside = b.icmp_unsigned("<", b.extract_value(out, 0), b.load(self.vars["T0"]))
        return b.and_(inside, b.not_(b.extract_value(out, 1)))

    def call(self, target: ast.Tuple, value: ast.Call) -> None:
        callee = self.functions[value.func.id][0]
        args = [self.S, self.flag, self.H, self.G, self.cap] + [
            self.coerce(self.expr(a), ty)
            for a, ty in zip(value.args[4:], callee.function_type.args[5:])]
        out = self.b.call(callee, args)
        self.guard(self.b.icmp_signed("!=", self.b.load(self.flag), self.t.i64(0)), self.passed)
        for k, t_ in enumerate(target.elts):
            self.store(t_, self.b.extract_value(out, k))

    def store(self, target, value) -> None:
        if isinstance(target, ast.Name):
            ptr = self.vars[target.id]
        elif isinstance(target, ast.Subscript) and _state_index(target) is not None:
            ptr = self.slot(_state_index(target))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            ptr = self.cell(target.value.id, self.expr(target.slice))
        else:
            raise Unsupported(ast.unparse(target))
        if value.type == self.t.f64 and isinstance(target, ast.Subscript) and \
                _state_index(target) is None and target.value.id != "HG":
            self.finite(value)          # a value leaving the registers for the heap
        self.b.store(self.coerce(value, ptr.type.pointee), ptr)

    # ----------------------------------------------------------- expressions
    def coerce(self, v, ty):
        t, b = self.t, self.b
        if v.type == ty:
            return v
        if ty == t.f64:
            return b.uitofp(v, ty) if v.type == t.i1 else b.sitofp(v, ty)
        if ty == t.i64 and v.type == t.i1:
            return b.zext(v, ty)
        if ty == t.i1:
            return self.truth(v)
        raise Unsupported(f"a float value where an int is wanted: {ty}")

    def truth(self, v):
        t, b = self.t, self.b
        if v.type == t.i1:
            return v
        if v.type == t.i64:
            return b.icmp_signed("!=", v, t.i64(0))
        return b.fcmp_unordered("!=", v, t.f64(0.0))

    def expr(self, e):
        t, b = self.t, self.b
        if isinstance(e, ast.Constant):
            if isinstance(e.value, bool):
                return t.i1(int(e.value))
            if isinstance(e.value, int):
                return t.i64(e.value)
            if isinstance(e.value, float):
                return t.f64(e.value)
        elif isinstance(e, ast.Name):
            if e.id in self.vars:
                return b.load(self.vars[e.id])
            if e.id == "TOL":
                return t.f64(self.functions["TOL"])
        elif isinstance(e, ast.Subscript) and _state_index(e) is not None:
            return b.load(self.slot(_state_index(e)))
        elif isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            return b.load(self.cell(e.value.id, self.expr(e.slice)))
        elif isinstance(e, ast.BinOp):
            return self.binop(e.op, self.expr(e.left), self.expr(e.right))
        elif isinstance(e, ast.UnaryOp):
            v = self.expr(e.operand)
            if isinstance(e.op, ast.USub):
                return b.fneg(v) if v.type == t.f64 else b.neg(self.coerce(v, t.i64))
            if isinstance(e.op, ast.UAdd):
                return v
            if isinstance(e.op, ast.Not):
                return b.not_(self.truth(v))
            if isinstance(e.op, ast.Invert) and v.type != t.f64:
                return b.not_(v)
        elif isinstance(e, ast.Compare) and len(e.ops) == 1:
            return self.compare(e.ops[0], self.expr(e.left), self.expr(e.comparators[0]))
        elif isinstance(e, ast.BoolOp):
            values = [self.truth(self.expr(v)) for v in e.values]
            out = values[0]
            for v in values[1:]:
                out = b.and_(out, v) if isinstance(e.op, ast.And) else b.or_(out, v)
            return out
        elif isinstance(e, ast.Call):
            return self.function(e)
        elif isinstance(e, ast.IfExp):
            return self.select(self.truth(self.expr(e.test)), self.expr(e.body),
                               self.expr(e.orelse))
        raise Unsupported(ast.unparse(e))

    def select(self, cond, a, b_):
        if a.type != b_.type:
            a, b_ = self.coerce(a, self.t.f64), self.coerce(b_, self.t.f64)
        return self.b.select(cond, a, b_)

    def compare(self, op, a, c):
        t, b = self.t, self.b
        sym = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
               ast.GtE: ">="}[type(op)]
        if t.f64 in (a.type, c.type):
            a, c = self.coerce(a, t.f64), self.coerce(c, t.f64)
            if not self.checking:       # no float steers control flow unless finite
                self.finite(a, c)
            if sym == "!=":             # as Python: nan != anything
                return b.fcmp_unordered(sym, a, c)
            return b.fcmp_ordered(sym, a, c)
        a, c = self.coerce(a, t.i64), self.coerce(c, t.i64)
        return b.icmp_signed(sym, a, c)

    def binop(self, op, a, c):
        t, b = self.t, self.b
        if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            if a.type == t.i1 and c.type == t.i1:
                ty = t.i1
            else:
                ty = t.i64
                a, c = self.coerce(a, ty), self.coerce(c, ty)
            return {ast.BitAnd: b.and_, ast.BitOr: b.or_, ast.BitXor: b.xor}[type(op)](a, c)
        if isinstance(op, (ast.Div, ast.Pow)) or t.f64 in (a.type, c.type):
            a, c = self.coerce(a, t.f64), self.coerce(c, t.f64)
            if isinstance(op, ast.Pow):
                return self.intrinsic("pow", a, c)
            name = _FLOAT_OPS.get(type(op))
        else:
            a, c = self.coerce(a, t.i64), self.coerce(c, t.i64)
            if isinstance(op, (ast.FloorDiv, ast.Mod)):
                return self.floor_div_mod(a, c, isinstance(op, ast.Mod))
            name = _INT_OPS.get(type(op))
        if name is None:
            raise Unsupported(f"{a.type} {type(op).__name__}")
        if name == "fdiv" and self.adjoint:     # Python stops on a division by zero
            self.guard(b.fcmp_ordered("==", c, t.f64(0.0)), self.fault_block)
        return getattr(b, name)(a, c)

    def floor_div_mod(self, a, c, mod: bool):
        """Python's a // c or a % c on int64 (wrapping, as numba): c = 0 faults, and
        c = -1 is taken apart (the hardware traps on INT64_MIN / -1)."""
        t, b = self.t, self.b
        self.guard(b.icmp_signed("==", c, t.i64(0)), self.fault_block)
        minus_one = b.icmp_signed("==", c, t.i64(-1))
        safe = b.select(minus_one, t.i64(1), c)
        q, r = b.sdiv(a, safe), b.srem(a, safe)
        # floor: step down where the remainder is non-zero and its sign differs from c's
        adjust = b.and_(b.icmp_signed("!=", r, t.i64(0)),
                        b.icmp_signed("<", b.xor(r, safe), t.i64(0)))
        if mod:
            r = b.select(adjust, b.add(r, safe), r)
            return b.select(minus_one, t.i64(0), r)
        q = b.select(adjust, b.sub(q, t.i64(1)), q)
        return b.select(minus_one, b.neg(a), q)

    def intrinsic(self, name: str, *args):
        f64 = self.t.f64
        fn = self.b.module.declare_intrinsic(f"llvm.{name}", [f64])
        return self.b.call(fn, list(args))

    def libm(self, name: str, *args):
        module, f64 = self.b.module, self.t.f64
        fn = module.globals.get(name)
        if fn is None:
            fn = self.ir.Function(module, self.ir.FunctionType(f64, [f64] * len(args)), name)
        return self.b.call(fn, list(args))

    def pure(self, name: str, args: list):
        value = self.math(name, args)
        if not self.adjoint:
            return value
        if name in _DOMAIN:             # sqrt of a negative, log of zero or less
            x = self.coerce(args[0], self.t.f64)
            self.guard(self.b.fcmp_ordered(_DOMAIN[name], x, self.t.f64(0.0)),
                       self.fault_block)
        elif name in _MATH_ERRORS:
            self.python_error(value, [self.coerce(a, self.t.f64) for a in args])
        return value

    def python_error(self, value, args) -> None:
        """Fault where Python's math module would raise: a non-finite result from
        finite arguments (an overflow, or a domain error such as log 0 or sqrt -1). The
        interpreter then reports it, as the Python engines do. Made (with the test of a
        division's divisor) in the updates of gradient shadows only, which are never
        tested for finiteness and may be dead (the derivative of sqrt at 0 for a local
        nothing reads: LLVM may drop the computation, but not this test); a value's own
        computation leaves a non-finite value in a register, which finite() catches."""
        bad, given = self.non_finite([value]), self.non_finite(args)
        if given is not None:
            bad = self.b.and_(bad, self.b.not_(given))
        self.guard(bad, self.fault_block)

    def math(self, name: str, args: list):
        t, b = self.t, self.b
        if name in ("math.sin", "math.cos", "math.exp", "math.log", "math.sqrt"):
            return self.intrinsic(name[5:], self.coerce(args[0], t.f64))
        if name in ("math.pow",):
            return self.intrinsic("pow", *(self.coerce(a, t.f64) for a in args))
        if name in ("math.tanh", "math.atan2"):
            return self.libm(name[5:], *(self.coerce(a, t.f64) for a in args))
        if name in ("np.fmod", "math.fmod"):
            return b.frem(self.coerce(args[0], t.f64), self.coerce(args[1], t.f64))
        if name == "math.trunc":
            return self.intrinsic("trunc", self.coerce(args[0], t.f64))
        if name == "abs":
            v = args[0]
            if v.type == t.f64:
                return self.intrinsic("fabs", v)
            v = self.coerce(v, t.i64)
            return b.select(b.icmp_signed("<", v, t.i64(0)), b.neg(v), v)
        if name == "sign":
            v = self.coerce(args[0], t.f64)
            pos = b.uitofp(b.fcmp_ordered(">", v, t.f64(0.0)), t.f64)
            neg = b.uitofp(b.fcmp_ordered("<", v, t.f64(0.0)), t.f64)
            return b.fsub(pos, neg)
        if name == "dpow_db":
            x, y = (self.coerce(a, t.f64) for a in args)
            value = b.fmul(self.intrinsic("pow", x, y), self.intrinsic("log", x))
            return b.select(b.fcmp_ordered(">", x, t.f64(0.0)), value, t.f64(0.0))
        if name == "zero":
            return b.fcmp_ordered("<=", self.intrinsic("fabs", self.coerce(args[1], t.f64)),
                                  args[0])
        if name == "float":
            return self.coerce(args[0], t.f64)
        if name == "int":
            if args[0].type == t.f64:
                raise Unsupported("int() of a float")
            return self.coerce(args[0], t.i64)
        if name == "wrap":
            return args[0]
        raise Unsupported(name)

    def function(self, e: ast.Call):
        name = ast.unparse(e.func)
        if name in ("alloc", "free", "push", "pop", "gpush", "gpop"):
            return self.helper(name, e.args)
        return self.pure(name, [self.expr(a) for a in e.args])


_ADDRESS = ast.dump(ast.parse("((A >= 0) | (B >= 0)) & ((0 <= A + B) & (A + B < T0))",
                               mode="eval").body)


def _address_terms(e) -> tuple[str, str] | None:
    """(base, offset) if e is the native text of a register-offset address check."""
    try:
        a = e.left.left.left.id
        c = e.left.right.left.id
    except AttributeError:
        return None
    pattern = _ADDRESS.replace("id='A'", f"id={a!r}").replace("id='B'", f"id={c!r}")
    return (a, c) if ast.dump(e) == pattern else None


def _named(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _state_index(node) -> int | None:
    """k for TOP[k] (the state array), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            node.value.id == "TOP" and isinstance(node.slice, ast.Constant):
        return node.slice.value
    return None


def _writes_shadow(s) -> bool:
    """Does this statement update a gradient shadow (gfK, or a cell of HG)?"""
    if isinstance(s, ast.Assign):
        targets = [e for t in s.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    elif isinstance(s, ast.AugAssign):
        targets = [s.target]
    else:
        return False
    return any((isinstance(t, ast.Name) and t.id.startswith("gf")) or
               (isinstance(t, ast.Subscript) and _named(t.value, "HG")) for t in targets)


def _dispatch(loop: ast.While) -> dict | None:
    """{k: statements} of the generated code's block loop (`while _b >= 0:` with one
    if/elif chain on `_b == k`), or None for any other loop."""
    test = loop.test
    if not (isinstance(test, ast.Compare) and _named(test.left, "_b") and
            isinstance(test.ops[0], ast.GtE) and len(loop.body) == 1 and
            ast.dump(test.comparators[0]) == ast.dump(ast.Constant(0))):
        return None
    cases, s = {}, loop.body[0]
    while isinstance(s, ast.If):
        t = s.test
        if not (isinstance(t, ast.Compare) and _named(t.left, "_b") and
                isinstance(t.ops[0], ast.Eq) and isinstance(t.comparators[0], ast.Constant)):
            return None
        cases[t.comparators[0].value] = s.body
        if not s.orelse:
            return cases
        if len(s.orelse) != 1:
            return None
        s = s.orelse[0]
    return None


def _is_raise(stmts) -> bool:
    return len(stmts) == 1 and isinstance(stmts[0], ast.Raise)


def _assigned(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return out


def _returns(node: ast.FunctionDef) -> list[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Return):
            return [e.id for e in n.value.elts]
    raise Unsupported(f"{node.name} returns nothing")


def _signature(ir, t: _Types, node: ast.FunctionDef):
    params = [a.arg for a in node.args.args[4:]]        # after HI, HF, HG, TOP
    returns = _returns(node)
    for name in params + returns:
        if t.of(name) is None:
            raise Unsupported(f"a parameter of unknown type: {name}")
    ret = ir.LiteralStructType([t.of(n) for n in returns])
    heap = [t.ptr, t.ptr, t.ptr, t.fptr, t.i64]     # state, fault flag, HI, HG, capacity
    return ir.FunctionType(ret, heap + [t.of(n) for n in params]), params, returns


def _py_function(ir, t: _Types, module, name: str):
    """`rvm_py_<name>`, a CPython function (METH_FASTCALL: self, argument vector, argument
    count) and a builder at its entry; with `api` (CPython's functions), `address(k, ty)`
    (argument k, a Python int, as a pointer of type ty) and `checked()`, which returns
    NULL from the function where converting the arguments raised a Python error."""
    o = ir.IntType(8).as_pointer()
    api = functools.partial(_api, ir, t, module)
    fn = ir.Function(module, ir.FunctionType(o, [o, o.as_pointer(), t.i64]), f"rvm_py_{name}")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    argv = fn.args[1]
    item = lambda k: b.load(b.gep(argv, [t.i64(k)]))
    address = lambda k, ty: b.bitcast(b.call(api("PyLong_AsVoidPtr"), [item(k)]), ty)

    def checked():
        null = fn.append_basic_block("null")
        with b.goto_block(null):
            b.ret(ir.Constant(o, None))
        _guard(b, b.icmp_unsigned("!=", b.call(api("PyErr_Occurred"), []),
                                  ir.Constant(o, None)), null)
    return fn, b, api, item, address, checked


def _entry(ir, t: _Types, module, name: str, inner, returns: list[str], fused=None):
    """`rvm_py_<name>`, a CPython function (METH_FASTCALL) that runs `inner`: its arguments
    are the addresses of the state array, the heap's cells and their shadows, the heap's
    capacity in cells, [the budget,] the scalars [and the seeds]; its result the results
    as a tuple, or the fault code (the caller raises Fault). A wrong number of arguments
    is a fault too; a wrong type raises Python's own error (TypeError, OverflowError).

    `fused` = (the forward function, its result names, budget?):
    run it first, then `inner` (the gradient pass) from its results and the seeds, and
    return the pair (values, gradient pass results); the heap top must be back where it
    was, and the step budget is set afresh for each pass: from the budget argument, on
    an empty heap (as the numba engine's vgs), or as found in the state array (vg)."""
    fn, b, api, item, address, checked = _py_function(ir, t, module, name)
    first = fused[0] if fused else inner
    nparams = len(first.function_type.args) - 5
    split = fused[3] if fused else 0    # the forward run returns this many registers
    # the seeds: one per float parameter
    extra = sum(ty == t.f64 for ty in first.function_type.args[5:]) if fused else 0
    lead = [t.i64] if fused and fused[2] else []
    types = lead + list(first.function_type.args[5:]) + [t.f64] * extra
    code = b.alloca(t.i64, name="fault")
    b.store(t.i64(FAULT), code)
    fault = fn.append_basic_block("fault")
    with b.goto_block(fault):
        b.ret(b.call(api("PyLong_FromLongLong"), [b.load(code)]))
    _guard(b, b.icmp_signed("!=", fn.args[2], t.i64(4 + len(types))), fault)
    S, H, G = address(0, t.ptr), address(1, t.ptr), address(2, t.fptr)
    cap = b.call(api("PyLong_AsLongLong"), [item(3)])
    rest = [b.call(api("PyFloat_AsDouble" if ty == t.f64 else "PyLong_AsLongLong"),
                   [item(k + 4)]) for k, ty in enumerate(types)]
    checked()
    state = lambda k: b.gep(S, [t.i64(k)])

    def run(f, values):
        b.store(t.i64(0), code)
        out = b.call(f, [S, code, H, G, cap] + values)
        _guard(b, b.icmp_signed("!=", b.load(code), t.i64(0)), fault)
        return out

    def boxed(out, names, at=None):
        return [b.call(api("PyFloat_FromDouble" if t.of(names[k]) == t.f64 else
                           "PyLong_FromLongLong"), [b.extract_value(out, k)])
                for k in (range(len(names)) if at is None else at)]

    def pack(items):
        tup = b.call(api("PyTuple_New"), [t.i64(len(items))])
        for k, v in enumerate(items):
            b.call(api("PyTuple_SetItem"), [tup, t.i64(k), v])
        return tup

    if fused:
        if fused[2]:
            budget = rest.pop(0)
            b.store(t.i64(0), state(0))
            b.store(budget, state(1))
        else:
            budget = b.load(state(1))
        top = b.load(state(0))
        forward = run(first, rest[:nparams])
        moved = b.icmp_signed("!=", b.load(state(0)), top)    # a heap block left allocated
        b.store(t.i64(FAULT), code)
        _guard(b, moved, fault)
        b.store(budget, state(1))
        values = [b.extract_value(forward, k) for k in range(split or nparams)] + \
            rest[nparams:] + _local_shadows(t, inner, split, extra)
        back = run(inner, values)
        b.store(budget, state(1))
        keep = None if not split else [*range(nparams), *range(split, split + extra)]
        out = pack([pack(boxed(forward, fused[1], range(nparams))),
                    pack(boxed(back, returns, keep))])
    else:
        out = pack(boxed(run(inner, rest), returns))
    o = ir.IntType(8).as_pointer()
    failed = fn.append_basic_block()     # out of memory: an item is missing
    ok = fn.append_basic_block()
    b.cbranch(b.icmp_unsigned("!=", b.call(api("PyErr_Occurred"), []), ir.Constant(o, None)),
              failed, ok)
    b.position_at_end(failed)
    b.call(api("Py_DecRef"), [out])
    b.ret(ir.Constant(o, None))
    b.position_at_end(ok)
    b.ret(out)


_CAPI = {   # the CPython functions the entries call: (result, arguments); o = PyObject *
    "PyLong_AsVoidPtr": ("o", "o"), "PyLong_AsLongLong": ("l", "o"),
    "PyFloat_AsDouble": ("d", "o"), "PyErr_Occurred": ("o", ""),
    "PyTuple_New": ("o", "l"), "PyTuple_SetItem": ("i", "olo"),
    "PyFloat_FromDouble": ("o", "d"), "PyLong_FromLongLong": ("o", "l"),
    "Py_DecRef": ("v", "o"), "PyEval_SaveThread": ("o", ""),
    "PyEval_RestoreThread": ("v", "o"),
}


def _api(ir, t: _Types, module, fname: str):
    """The CPython function `fname`, declared in module."""
    f = module.globals.get(fname)
    if f is None:
        o = ir.IntType(8).as_pointer()
        kinds = {"o": o, "l": t.i64, "d": t.f64, "i": ir.IntType(32), "v": ir.VoidType()}
        res, args = _CAPI[fname]
        f = ir.Function(module, ir.FunctionType(kinds[res], [kinds[a] for a in args]), fname)
    return f


def _local_shadows(t: _Types, gbw, split: int, seeds: int) -> list:
    """A split function's gradient pass takes every register the forward run returned
    (`split` of them), then the shadows of the float ones: the parameters' are the seeds,
    the locals' start at zero."""
    if not split:
        return []
    return [t.f64(0.0)] * (len(gbw.function_type.args) - 5 - split - seeds)


def _batch_entry(ir, t: _Types, module, name: str, mode: str, fw, gbw, split: int = 0):
    """`rvm_py_<name>`, a native loop over rows of scalar arguments (rvm.vmap), as a CPython
    function (METH_FASTCALL) that runs without the GIL: mode "csb" calls fw on each row,
    "usb" calls fw (there the function's inverse), "vgsb" a value and gradient (fw then
    gbw from its results and the seeds), "jsb" fw then gbw once per row of seeds.
    Arguments: the budget, the row count n, [for jsb the seed rows,] the addresses of
    the argument columns, [vgsb: the seeds; jsb: the seed array's address,] the
    addresses of the result columns [vgsb: and of the gradient columns; jsb: of the
    gradient array (rows x seed rows x float parameters)]. The result: 0, or the
    first fault's code (the caller runs the rows one by one to report it)."""
    fn, b, api, item, pointer, checked = _py_function(ir, t, module, name)
    ptypes = list(fw.function_type.args[5:])
    k = len(ptypes)
    floats = [j for j, ty in enumerate(ptypes) if ty == t.f64]
    head = 3 if mode == "jsb" else 2
    seeds = len(floats) if mode == "vgsb" else (1 if mode == "jsb" else 0)
    outs = k + (len(floats) if mode == "vgsb" else (1 if mode == "jsb" else 0))
    count = head + k + seeds + outs
    wrong = fn.append_basic_block()
    with b.goto_block(wrong):
        b.ret(b.call(api("PyLong_FromLongLong"), [t.i64(FAULT)]))
    _guard(b, b.icmp_signed("!=", fn.args[2], t.i64(count)), wrong)
    integer = lambda j: b.call(api("PyLong_AsLongLong"), [item(j)])
    address = lambda j, ty: pointer(j, ty.as_pointer())
    budget, n = integer(0), integer(1)
    nseeds = integer(2) if mode == "jsb" else None
    cols = [address(head + j, ty) for j, ty in enumerate(ptypes)]
    at = head + k
    if mode == "vgsb":
        seed = [b.call(api("PyFloat_AsDouble"), [item(at + j)]) for j in range(len(floats))]
    elif mode == "jsb":
        seed = address(at, t.f64)
    at += seeds
    results = [address(at + j, ty) for j, ty in enumerate(ptypes)]
    grads = [address(at + k + j, t.f64) for j in range(outs - k)]
    checked()
    S, flag, code = b.alloca(t.i64, t.i64(2)), b.alloca(t.i64), b.alloca(t.i64)
    b.store(t.i64(0), code)
    saved = b.call(api("PyEval_SaveThread"), [])
    done = fn.append_basic_block()
    heap = [ir.Constant(t.ptr, None), ir.Constant(t.fptr, None), t.i64(0)]

    def run(f, values):
        b.store(t.i64(0), flag)
        b.store(budget, b.gep(S, [t.i64(1)]))
        out = b.call(f, [S, flag, *heap, *values])
        failed, ok = fn.append_basic_block(), fn.append_basic_block()
        b.cbranch(b.icmp_signed("!=", b.load(flag), t.i64(0)), failed, ok)
        with b.goto_block(failed):
            b.store(b.load(flag), code)
            b.branch(done)
        b.position_at_end(ok)
        return out

    def one(row):
        b.store(t.i64(0), b.gep(S, [t.i64(0)]))
        out = run(fw, [b.load(b.gep(c, [row])) for c in cols])
        values = [b.extract_value(out, j) for j in range(split or k)]
        for j, c in enumerate(results):
            b.store(values[j], b.gep(c, [row]))
        zeros = _local_shadows(t, gbw, split, len(floats))
        if mode == "vgsb":
            back = run(gbw, values + seed + zeros)
            for j, g in enumerate(grads):
                b.store(b.extract_value(back, (split or k) + j), b.gep(g, [row]))
        elif mode == "jsb":
            width = t.i64(len(floats))

            def pass_(s):
                back = run(gbw, values + [b.load(b.gep(seed, [b.add(b.mul(s, width),
                                                                     t.i64(j))]))
                                          for j in range(len(floats))] + zeros)
                base = b.mul(b.add(b.mul(row, nseeds), s), width)
                for j in range(len(floats)):
                    b.store(b.extract_value(back, (split or k) + j),
                            b.gep(grads[0], [b.add(base, t.i64(j))]))
            _loop(b, t.i64(0), nseeds, pass_)
    _loop(b, t.i64(0), n, one, done)
    b.call(api("PyEval_RestoreThread"), [saved])
    b.ret(b.call(api("PyLong_FromLongLong"), [b.load(code)]))


def ir_module(source: str, tol: float, fused: dict, batches: dict, runs: bool = True) -> str:
    """LLVM IR for the generated functions in `source` (the native engine's text), with an
    entry `rvm_py_<name>` for each, for each of `fused` ({name: (forward, gradient pass,
    budget argument?)}) and for each of `batches` ({name: (mode, forward, gradient
    pass)}). runs=False: no entries for the generated functions themselves."""
    _, ir, _ = _llvm()
    t = _Types(ir)
    module = ir.Module(name="rvm")
    module.triple = _llvm()[2].triple
    nodes = [n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]
    functions: dict = {"TOL": tol}
    for node in nodes:
        ftype, params, returns = _signature(ir, t, node)
        f = ir.Function(module, ftype, f"{node.name}_")
        f.linkage = "internal"
        for arg in f.args[:4]:      # state, fault flag, cells, shadows: four separate buffers
            arg.add_attribute("noalias")
        functions[node.name] = (f, params, returns)
    for node in nodes:
        _Lowering(ir, t, functions, node)
    for node in nodes if runs else ():
        f, params, returns = functions[node.name]
        _entry(ir, t, module, node.name, f, returns)
    for name, (fw, gbw, budget, split) in fused.items():
        _entry(ir, t, module, name, functions[gbw][0], functions[gbw][2],
               fused=(functions[fw][0], functions[fw][2], budget, split))
    for name, (mode, fw, gbw, split) in batches.items():
        _batch_entry(ir, t, module, name, mode, functions[fw][0], functions[gbw][0], split)
    return str(module)


def compile_ir(text: str) -> bytes:
    """Optimised machine code (an object file) for LLVM IR text."""
    ll, _, tm = _llvm()
    mod = ll.parse_assembly(text)
    mod.verify()
    pto = ll.create_pipeline_tuning_options(speed_level=2)
    pb = ll.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


class Library:
    """Machine code loaded for calling: entry addresses by name."""

    def __init__(self, obj: bytes):
        ll = _llvm()[0]
        self.engine = ll.create_mcjit_compiler(ll.parse_assembly(""), _target_machine())
        self.engine.add_object_file(ll.ObjectFileRef.from_data(obj))
        self.engine.finalize_object()
        self.tables: list = []      # the builtins' method tables (see _builtin)

    def address(self, name: str) -> int:
        return self.engine.get_function_address(f"rvm_{name}")


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


_METH_FASTCALL = 0x80


def _builtin(library: Library, name: str):
    """The entry rvm_py_<name> as a Python builtin function (its method table entry kept
    alive with the library that holds its code)."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object,
                                                   ctypes.py_object]
    table = _MethodDef(name.encode(), library.address(f"py_{name}"), _METH_FASTCALL, None)
    library.tables.append(table)
    return new(ctypes.addressof(table), None, None)


class _Call:
    """An entry called from Python with the addresses of the state array (heap top, step
    budget), the heap's cells and their shadows, and the heap's capacity, then the
    scalar arguments; a fault code back (an int) instead of the results' tuple."""

    def __init__(self, library: Library, name: str):
        self.library = library          # the machine code lives as long as its callers
        self.call = _builtin(library, name)
        self.arrays = (None, None, None, ())

    def addresses(self, HI, HG, TOP) -> tuple:
        """(state, cells, shadows, capacity) for these arrays, checked as native code needs
        them (remembered for the same arrays, as a machine passes its own every time)."""
        cached = self.arrays
        if cached[0] is not HI or cached[1] is not HG or cached[2] is not TOP:
            ok = TOP.dtype == "int64" and TOP.size >= 2 and TOP.flags.c_contiguous
            if HI is None:          # a program without heap (rvm.engines.native: vgs)
                heap = (0, 0, 0)
            else:
                ok = ok and HI.dtype == "int64" and HG.dtype == "float64" and \
                    1 <= HI.size <= HG.size and HI.flags.c_contiguous and \
                    HG.flags.c_contiguous
                heap = (HI.ctypes.data, HG.ctypes.data, HI.size)
            if not ok:
                raise TypeError("native code needs contiguous int64 state and heap arrays "
                                "and float64 shadows at least as long")
            cached = self.arrays = (HI, HG, TOP, (TOP.ctypes.data, *heap))
        return cached[3]


def _check(out):
    if type(out) is not tuple:
        raise Fault(MESSAGES[out])
    return out


class Run(_Call):
    """One run mode of one function, called as the numba engine's: (HI, HF, HG, TOP,
    *arguments) -> results, the heap top and the step budget kept in TOP. (Also a fused
    value and gradient on a heap, vg: arguments, then seeds.)"""

    def __call__(self, HI, HF, HG, TOP, *args):
        return _check(self.call(*self.addresses(HI, HG, TOP), *args))


class Fused(_Call):
    """A whole value and gradient of a program without heap, called as the numba
    engine's vgs: (T, H, budget, *arguments, *seeds) -> (values, the gradient pass's
    results)."""

    def __call__(self, T, H, budget, *args):
        return _check(self.call(*self.addresses(None, None, T), budget, *args))


class Batch:
    """A batch loop called as the numba engine's (rvm.engines.native.on_threads):
    (budget, argument columns..., [seeds... | S], result columns..., [gradient columns...
    | G]), numpy arrays checked here and passed by address; the loop runs without the
    GIL. Raises Fault if a row fails (the caller runs the rows one by one)."""

    signatures = True       # compiled already (on_threads may split it across threads)

    def __init__(self, library: Library, name: str, mode: str, kinds: list[str]):
        self.library, self.mode, self.kinds = library, mode, kinds
        self.call = _builtin(library, name)

    def __call__(self, budget, *arrays):
        k, mode = len(self.kinds), self.mode
        nf = self.kinds.count("float64")
        cols, rest = arrays[:k], arrays[k:]
        n = cols[0].shape[0] if cols else 0
        lead: list = [int(budget), n]
        if mode == "vgsb":
            seeds, outs, grads = [float(x) for x in rest[:nf]], rest[nf:nf + k], rest[nf + k:]
        elif mode == "jsb":
            S, outs, grads = np.asarray(rest[0]), rest[1:1 + k], rest[1 + k:]
            lead.append(S.shape[0])
            if S.shape != (S.shape[0], nf) or S.dtype != np.float64:
                raise TypeError("seed rows must be float64, one column per float parameter")
            seeds = [S]
        else:
            seeds, outs, grads = [], rest, ()
        wanted = [*self.kinds, *(["float64"] if mode == "jsb" else []), *self.kinds,
                  *["float64"] * len(grads)]
        given = [*cols, *(seeds if mode == "jsb" else []), *outs, *grads]
        if len(given) != len(wanted) or len(cols) != k:
            raise TypeError(f"{self.mode} takes {k} argument and result columns")
        for j, (a, kind) in enumerate(zip(given, wanted)):
            rows = 0 if mode == "jsb" and j == k else n        # (S: any number of rows)
            if not (isinstance(a, np.ndarray) and a.dtype == kind and a.flags.c_contiguous
                    and a.ndim >= 1 and a.shape[0] >= rows):
                raise TypeError("batch columns must be contiguous arrays of the right "
                                "dtype, one row per argument row")
        if mode == "jsb" and grads[0].shape[1:] != (S.shape[0], nf):
            raise TypeError("the gradient array must be rows x seed rows x float parameters")
        addresses = [a.ctypes.data for a in given]
        if mode == "vgsb":
            addresses[k:k] = seeds
        code = self.call(*lead, *addresses)
        if code:
            raise Fault(MESSAGES[code])


def _kinds(source: str) -> dict:
    """{generated function: its parameters' dtypes}, from the names in its def line."""
    out = {}
    for name, params in re.findall(r"^def (\w+)\(HI, HF, HG, TOP(.*)\):", source, re.M):
        names = [p.strip() for p in params.split(",") if p.strip()]
        out[name] = ["float64" if _FLOAT_NAMES.fullmatch(p) else "int64" for p in names]
    return out


@functools.cache
def _lowering_digest() -> str:
    """A digest of this module's text (the lowering and the code generator's options):
    machine code cached by one version is never loaded by another (an editable install
    changes without a version number). Where the text cannot be read (a frozen
    install), the cache's version stands in."""
    import hashlib
    try:
        return hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:16]
    except OSError:
        from .cache import VERSION
        return VERSION


def functions(source: str, fused: dict, batches: dict, tol: float, runs: bool = True) -> dict:
    """Callables for the generated functions in `source`: a Run for each (unless runs is
    False), one for each of
    `fused` ({name: (forward, gradient pass, budget argument?)}: a Fused with the budget
    argument, a Run without), a Batch for each of `batches` ({name: (mode, forward,
    gradient pass)}). The machine code comes from the on-disk cache, or is compiled and
    put there."""
    from . import cache
    ll, _, tm = _llvm()
    stamp = f"{_lowering_digest()}|{ll.llvm_version_info}|{tm.triple}|" \
        f"{ll.get_host_cpu_name()}|{ll.get_host_cpu_features().flatten()}|{sys.version}|" \
        f"{tol!r}|" \
        f"{sorted(fused.items())}|{sorted(batches.items())}|{runs}"
    obj = cache.load_object(stamp + source, lambda: compile_ir(ir_module(source, tol, fused,
                                                                           batches, runs)))
    lib = Library(obj)
    names = re.findall(r"^def (\w+)\(", source, re.M)
    out: dict = {name: Run(lib, name) for name in names} if runs else {}
    out.update({name: (Fused if budget else Run)(lib, name)
                for name, (_, _, budget, _) in fused.items()})
    kinds = _kinds(source)
    out.update({name: Batch(lib, name, mode, kinds[fw]) for name, (mode, fw, _, _) in
                batches.items()})
    return out
