"""The array instructions' helpers (rvm.engines.arrays) lowered to LLVM IR, for
rvm.engines.lowering: the same checks, made once per instruction before any cell is
touched (shape, each view inside the heap, the cells written apart from the cells read, no
repeated cell in a view changed in place), then loops over the elements that LLVM
vectorises. A family's value and partial derivatives are its templates from the
instruction table, lowered per element. Results that are not finite end the run with a
fault after the loop (the machine re-runs the pass on the interpreter, which reports it).
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib

from ..core.isa import MAX_FLOAT, MIN_NORMAL, family
from .arrays import BLAS_DEEP, BLAS_WIDE, BLAS_WORK, LIMIT, SCRATCH_ROWS
from .blas import NO_TRANS, ROW_MAJOR, TRANS

# each helper's arguments (after HI, HF, HG, TOP) fixed where it is used: the family, the
# sign, which operand (vgrad), the operation and whether on shadows (vscale, vswap, vneg)
STATIC = {"vacc": (0, 1), "vgrad": (0, 1, 2), "vpull": (0, 1, 2), "vmm": (0,),
          "vmm_pull": (0, 1), "vscale": (0, 5), "vdotg": (), "vswap": (4,), "vneg": (3,)}
HELPERS = frozenset(STATIC)
# helpers whose sign (the argument at this position) is a value, not fixed in the
# function: one function serves += and -= (a multiply by -1.0 is exact: a - b == a +
# -1.0 * b)
SIGNED = {"vacc": 1, "vgrad": 1, "vpull": 1, "vmm": 0, "vmm_pull": 0}


@functools.cache
def _tree(text: str, args: tuple) -> ast.expr:
    """A family template of the table as an expression over the element locals."""
    return ast.parse(text.format(**{a: f"_e{a}" for a in args}), mode="eval").body


BLAS_GEMM = "rvm_dgemm"        # cblas_dgemm with 64-bit integers (rvm.engines.llvm: blas)
BLAS_DOT = "rvm_ddot"          # cblas_ddot, the same (a 1 x k by k x 1 product: dgemm's
                               # kernel for it takes 2.3x as long)
COLUMNS = 64                   # the columns a sum per column takes at once
NARROW_DEEP = 8                # (see ArrayLowering._product_loops)


class ArrayLowering:
    """Mixed into rvm.engines.lowering.Lowering (which gives it loop_over, guard, cell,
    expr, coerce, new_flag, raise_flag, non_finite, intrinsic and the fault exits)."""

    def array_helper(self, name: str, args: list):
        """A call of the helper's function, made once per module for its fixed arguments
        (the family, which operands are views) and called at every site with the
        operands' values (the sign, a view's start and strides, scalars, the shape): an array
        instruction costs one call's worth of IR where it is used, not its loops. A fault
        inside leaves its code in the flag, and this function returns as a callee's
        fault does."""
        b, t = self.b, self.t
        parts, kinds, values = [], [], []

        # every operand a value, constants too: fixing strides of 0 or 1 and shapes of 1
        # in the function made 20 kinds of each helper of the GMM's, a third of its
        # compile time, for 2-3% of its run time
        def given(e):
            v = self.expr(e)
            v = v if v.type in (t.i64, t.f64) else self.coerce(v, t.i64)
            kinds.append("f" if v.type == t.f64 else "i")
            values.append(v)
            return ("value", len(values) - 1)
        for k, e in enumerate(args[4:]):            # (after HI, HF, HG, TOP)
            if k == SIGNED.get(name):
                parts.append(given(ast.Constant(float(ast.literal_eval(e)))))
            elif k in STATIC[name]:
                parts.append(ast.literal_eval(e))
                kinds.append(repr(parts[-1]))
            elif isinstance(e, ast.Tuple):
                kinds.append("view")
                parts.append(("view", tuple(given(x) for x in e.elts)))
            else:
                parts.append(given(e))
        key = f"rvm_array_{name}_" + hashlib.sha256(repr(kinds).encode()).hexdigest()[:16]
        f = self._outlined(key, name, parts, [v.type for v in values])
        out = b.call(f, [self.S, self.flag, self.H, self.G, self.cap, *values])
        self.guard(b.icmp_signed("!=", b.load(self.flag), t.s64(0)), self.passed)
        return out

    _SAVED = ("b", "fn", "vars", "S", "flag", "H", "G", "cap", "fault_block", "later",
              "adjoint", "checking")

    @contextlib.contextmanager
    def _building(self, key: str, result, params: list):
        """A new function of the module (internal, never inlined: one copy of its loops,
        the point of it), built inside the block as this lowering's current function,
        whose state is put back after."""
        f = self.ir.Function(self.b.module, self.ir.FunctionType(result, params), key)
        f.linkage = "internal"
        f.attributes.add("noinline")
        saved = {k: getattr(self, k) for k in self._SAVED}
        try:
            self.fn, self.vars = f, {}
            self.b = self.ir.IRBuilder(f.append_basic_block("entry"))
            yield f
        finally:
            for k, v in saved.items():
                setattr(self, k, v)

    def _outlined(self, key: str, name: str, parts: list, types: list):
        """The module's function for one helper with these fixed arguments (made on first
        use): the helper's checks and loops, on its parameters."""
        f = self.b.module.globals.get(key)
        if f is not None:
            return f
        t = self.t
        with self._building(key, t.f64, [a.type for a in self.fn.args[:5]] + types) as f:
            self.S, self.flag, self.H, self.G, self.cap = f.args[:5]
            self.later, self.adjoint, self.checking = None, False, False
            self.fault_block = f.append_basic_block("fault")
            with self.b.goto_block(self.fault_block):
                self.b.store(t.s64(self.FAULT), self.flag)
                self.b.ret(t.f64(0.0))
            given = f.args[5:]

            def value(p):           # a parameter, or a constant fixed in the function
                if isinstance(p, tuple) and p[0] == "value":
                    return given[p[1]]
                if isinstance(p, tuple):
                    return tuple(self._int(value(x)) for x in p[1])
                return p
            real = [value(p) for p in parts]
            out = getattr(self, "_" + name)(*real)
            self.b.ret(out if out is not None else t.f64(0.0))
        return f

    # ---------------------------------------------------------------- pieces
    def _int(self, e):
        if isinstance(e, int):
            return self.t.i64(e)
        return self.coerce(self.expr(e) if isinstance(e, ast.AST) else e, self.t.i64)

    def _view(self, e) -> tuple | None:
        """(start, s0, s1) of a view operand; None for a scalar."""
        if isinstance(e, tuple):
            return e
        if isinstance(e, ast.Tuple):
            return tuple(self._int(x) for x in e.elts)
        return None

    def _abs(self, v):
        b = self.b
        return b.select(b.icmp_signed("<", v, v.type(0)), b.neg(v), v)

    def _span(self, view, m, n) -> tuple:
        b, t = self.b, self.t
        start, s0, s1 = view
        zero, one = t.i64(0), t.i64(1)
        d0, d1 = b.mul(b.sub(m, one), s0), b.mul(b.sub(n, one), s1)
        lo = b.add(start, b.add(self._min(zero, d0), self._min(zero, d1)))
        hi = b.add(start, b.add(self._max(zero, d0), self._max(zero, d1)))
        return lo, hi

    def _min(self, a, c):
        return self.b.select(self.b.icmp_signed("<", a, c), a, c)

    def _max(self, a, c):
        return self.b.select(self.b.icmp_signed(">", a, c), a, c)

    def _some(self, m, n):
        b, t = self.b, self.t
        return b.and_(b.icmp_signed(">", m, t.i64(0)), b.icmp_signed(">", n, t.i64(0)))

    def _bad_shape(self, *dims):
        b, t = self.b, self.t
        bad = t.i1(0)
        for d in dims:
            bad = b.or_(bad, b.icmp_unsigned(">=", d, t.i64(LIMIT)))    # (negative too)
        return bad

    def _bad_view(self, view, m, n):
        """The view reaches outside the heap (or its numbers are out of range)."""
        b, t = self.b, self.t
        start, s0, s1 = view
        limit = t.i64(LIMIT)
        bad = b.or_(b.icmp_signed(">=", self._abs(s0), limit),
                    b.icmp_signed(">=", self._abs(s1), limit))
        bad = b.or_(bad, b.or_(b.icmp_signed("<=", start, t.i64(-LIMIT)),
                               b.icmp_signed(">=", start, t.i64(1 << 62))))
        lo, hi = self._span(view, m, n)
        top = b.load(self.slot(0))
        outside = b.or_(b.icmp_signed("<", lo, t.i64(0)), b.icmp_signed(">=", hi, top))
        return b.or_(bad, b.and_(self._some(m, n), outside))

    def _overlap(self, one, m, n, two, r, c):
        """The views share a cell (rvm.engines.arrays.apart): their ranges meet and their
        lattices do too."""
        b, t = self.b, self.t
        lo, hi = self._span(one, m, n)
        lo2, hi2 = self._span(two, r, c)
        both = b.and_(self._some(m, n), self._some(r, c))
        meet = b.and_(b.icmp_signed("<=", lo, hi2), b.icmp_signed("<=", lo2, hi))
        step = self._gcd(self._gcd(*self._moving(one, m, n)), self._gcd(*self._moving(two, r, c)))
        d = b.sub(one[0], two[0])
        zero = t.i64(0)
        safe = b.select(b.icmp_signed("==", step, zero), t.i64(1), step)
        same = b.select(b.icmp_signed("==", step, zero), b.icmp_signed("==", d, zero),
                        b.icmp_signed("==", b.srem(d, safe), zero))
        return b.and_(both, b.and_(meet, same))

    def _moving(self, view, m, n) -> tuple:
        """The strides of the dimensions longer than 1 (others count as 0), made positive."""
        b, t = self.b, self.t
        one, zero = t.i64(1), t.i64(0)
        return (b.select(b.icmp_signed(">", m, one), self._abs(view[1]), zero),
                b.select(b.icmp_signed(">", n, one), self._abs(view[2]), zero))

    def _gcd(self, x, y):
        """Euclid's gcd of two non-negative int64 values (a loop in the IR)."""
        b, t = self.b, self.t
        px, py = self._alloca(t.i64, x), self._alloca(t.i64, y)
        head, body, after = (self.fn.append_basic_block() for _ in range(3))
        b.branch(head)
        b.position_at_end(head)
        b.cbranch(b.icmp_signed("!=", b.load(py), t.i64(0)), body, after)
        b.position_at_end(body)
        u, v = b.load(px), b.load(py)
        b.store(v, px)
        b.store(b.urem(u, v), py)
        b.branch(head)
        b.position_at_end(after)
        return b.load(px)

    def _repeats(self, view, m, n):
        b, t = self.b, self.t
        _, s0, s1 = view
        a0, a1 = self._abs(s0), self._abs(s1)
        one, zero = t.i64(1), t.i64(0)
        row = b.icmp_signed("==", m, one)
        line = b.or_(row, b.icmp_signed("==", n, one))
        stride = b.select(row, a1, a0)
        long = b.icmp_signed(">", self._max(m, n), one)
        in_line = b.and_(b.icmp_signed("==", stride, zero), long)
        apart = b.or_(b.icmp_signed("<=", b.mul(a1, n), a0), b.icmp_signed("<=", b.mul(a0, m), a1))
        flat = b.or_(b.or_(b.icmp_signed("==", a0, zero), b.icmp_signed("==", a1, zero)),
                     b.not_(apart))
        return b.and_(self._some(m, n), b.select(line, in_line, flat))

    def _check(self, bad) -> None:
        self.guard(bad, self.fault_block)

    def _at(self, view, i, j):
        b = self.b
        start, s0, s1 = view
        return b.add(start, b.add(b.mul(i, s0), b.mul(j, s1)))

    def _each(self, m, n, body) -> None:
        """body(i, j) for every element, row by row."""
        zero, loop = self.t.i64(0), self.loop_over
        loop(self.b, zero, m, lambda i: loop(self.b, zero, n, lambda j: body(i, j)))

    def _alloca(self, ty, first):
        """A stack slot in the function's entry block, holding `first` from here."""
        with self.b.goto_block(self.fn.entry_basic_block):
            ptr = self.b.alloca(ty)
        self.b.store(first, ptr)
        return ptr

    def _local(self, name: str, ty):
        ptr = self.vars.get(name)
        if ptr is None:
            with self.b.goto_block(self.fn.entry_basic_block):
                ptr = self.vars[name] = self.b.alloca(ty, name=name)
        return ptr

    def _element(self, text: str, names: tuple, values: list):
        """A template of the table evaluated on one element's operand values."""
        for a, v in zip(names, values):
            self.b.store(v, self._local(f"_e{a}", self.t.f64))
        outer, self.adjoint, self.elementwise = self.adjoint, False, True
        try:
            return self.coerce(self.expr(_tree(text, names)), self.t.f64)
        finally:
            self.adjoint, self.elementwise = outer, False

    def _sign(self, e):
        return float(e) if isinstance(e, (int, float)) else e

    def _value(self, s):
        """s (a constant or a value) as a value."""
        return self.t.f64(s) if isinstance(s, float) else s

    def _signed(self, s, v):
        """s * v (s a constant or a value; v itself where s is the constant 1)."""
        if isinstance(s, float):
            return v if s == 1.0 else self.b.fmul(self.t.f64(s), v)
        return self.b.fmul(s, v)

    def _operands(self, ops, m, n, written):
        """The operands as views (checked) or scalar values; the flag of any bad one."""
        b, t = self.b, self.t
        bad = b.or_(self._bad_shape(m, n), self._bad_view(written, m, n))
        out = []
        for e in ops:
            view = self._view(e)
            if view is None:
                out.append(t.f64(float(e)) if isinstance(e, (int, float)) else
                           self.coerce(e, t.f64))
                continue
            bad = b.or_(bad, b.or_(self._bad_view(view, m, n),
                                   self._overlap(written, m, n, view, m, n)))
            out.append(view)
        return out, bad

    def _load(self, x, i, j, shadows: bool = False):
        if isinstance(x, tuple):
            return self.b.load(self.cell("HG" if shadows else "HF", self._at(x, i, j)))
        return self.t.f64(0.0) if shadows else x

    # ---------------------------------------------------------------- helpers
    def _accumulating(self, fam, s, y, rest):
        names, value, partials = family(fam)
        m, n = self._int(rest[-2]), self._int(rest[-1])
        yv = self._view(y)
        ops, bad = self._operands(rest[:-2], m, n, yv)
        self._check(bad)
        return names, value, partials, self._sign(s), yv, ops, m, n

    def _into(self, view, m, n, value, shadows: bool = False, flag=None) -> None:
        """cell += value(i, j) over the view. A view that names no cell twice adds each
        value into its own cell; a target of strides (0, 0) takes one sum, (s, 0) a sum
        per row, (0, s) a sum per column, each summed from 0 in the order of the elements
        and added once, as rvm.engines.arrays does, so a sum taken back out with the
        opposite sign leaves exactly what was there. (Rows that overlap with no zero
        stride, which the interpreter sums cell by cell, are added element by element in
        order here: docs/engines.md says so.) flag: raised where a value cell's result
        is not finite."""
        b, t = self.b, self.t
        heap = "HG" if shadows else "HF"
        one, zero = t.i64(1), t.i64(0)
        z0 = b.or_(b.icmp_signed("<=", m, one), b.icmp_signed("==", view[1], zero))
        z1 = b.or_(b.icmp_signed("<=", n, one), b.icmp_signed("==", view[2], zero))
        acc = self._alloca(t.f64, t.f64(0.0))

        def add(i, j, v):
            ptr = self.cell(heap, self._at(view, i, j))
            new = b.fadd(b.load(ptr), v)
            if flag is not None:
                self.raise_flag(flag, self.non_finite([new]))
            b.store(new, ptr)

        def summed(outer, inner, at):       # a sum per outer index (or one in all)
            def each(o):
                b.store(t.f64(0.0), acc)
                self.loop_over(b, zero, inner, lambda k: b.store(
                    b.fadd(b.load(acc), value(*at(o, k))), acc))
                add(*at(o, zero), b.load(acc))
            self.loop_over(b, zero, outer, each)
        after = self.fn.append_basic_block()
        cases = [self.fn.append_basic_block() for _ in range(5)]
        one_cell, rows = b.and_(z0, z1), b.and_(z1, b.not_(z0))
        direct = self.fn.append_basic_block()
        b.cbranch(self._repeats(view, m, n), cases[4], direct)   # (no cell named twice:
        b.position_at_end(cases[4])             # each added to its own, as the interpreter
        b.cbranch(one_cell, cases[0], cases[1])     # does; -0.0 + -0.0 stays -0.0)
        b.position_at_end(cases[1])
        b.cbranch(rows, cases[2], cases[3])
        b.position_at_end(cases[0])         # one cell: a sum over all, row by row
        b.store(t.f64(0.0), acc)
        self._each(m, n, lambda i, j: b.store(b.fadd(b.load(acc), value(i, j)), acc))
        add(zero, zero, b.load(acc))
        b.branch(after)
        b.position_at_end(cases[2])         # a cell per row
        summed(m, n, lambda i, j: (i, j))
        b.branch(after)
        b.position_at_end(cases[3])
        columns = self.fn.append_basic_block()
        b.cbranch(z0, columns, direct)
        b.position_at_end(columns)          # a cell per column
        self._column_sums(m, n, value, add)
        b.branch(after)
        b.position_at_end(direct)
        self._each(m, n, lambda i, j: add(i, j, value(i, j)))
        b.branch(after)
        b.position_at_end(after)

    def _in_blocks(self, n, fill, out) -> None:
        """Sums for columns 0 .. n - 1, COLUMNS at a time in a block on the stack: for
        each block of columns j0 .. j0 + w - 1, the block zeroed, fill(j0, w, at) adding
        into it (at(c): column j0 + c's sum, the inner loop along c, which LLVM
        vectorises: a lane a column), then out(j, sum) for each of its columns. Each sum
        is taken in the order fill adds into it, as one column at a time would."""
        b, t = self.b, self.t
        zero, width = t.i64(0), t.i64(COLUMNS)
        with b.goto_block(self.fn.entry_basic_block):
            block = b.alloca(t.f64, size=width)

        def each(k):
            j0 = b.mul(k, width)
            w = self._min(width, b.sub(n, j0))
            self.loop_over(b, zero, w, lambda c: b.store(t.f64(0.0), b.gep(block, [c])))
            fill(j0, w, lambda c: b.gep(block, [c]))
            self.loop_over(b, zero, w, lambda c: out(b.add(j0, c),
                                                      b.load(b.gep(block, [c]))))
        self.loop_over(b, zero, b.sdiv(b.add(n, t.i64(COLUMNS - 1)), width), each)

    def _column_sums(self, m, n, value, add) -> None:
        """add(0, j, the sum of value(i, j) over the rows i) for every column j, each sum
        from 0 in the order of the rows, a block of columns at a time (_in_blocks: the
        same sums, bit for bit, as one column at a time)."""
        b, zero = self.b, self.t.i64(0)

        def fill(j0, w, at):
            def row(i):
                def one(c):
                    b.store(b.fadd(b.load(at(c)), value(i, b.add(j0, c))), at(c))
                self.loop_over(b, zero, w, one)
            self.loop_over(b, zero, m, row)
        self._in_blocks(n, fill, lambda j, total: add(zero, j, total))

    def _vacc(self, fam, s, y, *rest):
        names, value, _, s, yv, ops, m, n = self._accumulating(fam, s, y, rest)
        b = self.b
        flag = self.new_flag()

        def element(i, j):
            v = self._element(value, names, [self._load(x, i, j) for x in ops])
            return self._signed(s, v)
        self._into(yv, m, n, element, flag=flag)
        self._check(b.load(flag))

    def _pullback(self, yv, ops, names, partial, s, i, j):
        """s * gy * the partial at element (i, j): 0 where gy is 0 (a zero shadow pulls
        back nothing)."""
        b, t = self.b, self.t
        gy = b.load(self.cell("HG", self._at(yv, i, j)))
        d = b.fmul(gy, self._element(partial, names, [self._load(x, i, j) for x in ops]))
        d = b.select(b.fcmp_ordered("!=", gy, t.f64(0.0)), d, t.f64(0.0))
        return self._signed(s, d)

    def _vgrad(self, fam, s, k, y, *rest):
        """A scalar operand k's gradient: its pullbacks summed over the elements."""
        names, _, partials, s, yv, ops, m, n = self._accumulating(fam, s, y, rest)
        b = self.b
        total = self._alloca(self.t.f64, self.t.f64(0.0))
        self._each(m, n, lambda i, j: b.store(b.fadd(b.load(total), self._pullback(
            yv, ops, names, partials[k], s, i, j)), total))
        return b.load(total)

    def _vpull(self, fam, s, pull, y, *rest):
        """Each view operand's shadow += its pullbacks (one pass per operand, so that a
        broadcast operand's repeated cells sum as the interpreter sums them); operand k's
        where bit k of pull is set."""
        names, _, partials, s, yv, ops, m, n = self._accumulating(fam, s, y, rest)
        for k, (x, p) in enumerate(zip(ops, partials)):
            if isinstance(x, tuple) and pull >> k & 1:
                self._into(x, m, n, lambda i, j, p=p: self._pullback(yv, ops, names, p, s,
                                                                     i, j), shadows=True)

    def _product(self, y, a, c, m, k, n):
        b = self.b
        m, k, n = self._int(m), self._int(k), self._int(n)
        yv, av, cv = self._view(y), self._view(a), self._view(c)
        bad = b.or_(self._bad_shape(m, k, n), self._bad_view(yv, m, n))
        bad = b.or_(bad, b.or_(self._bad_view(av, m, k), self._bad_view(cv, k, n)))
        bad = b.or_(bad, b.or_(self._overlap(yv, m, n, av, m, k),
                               self._overlap(yv, m, n, cv, k, n)))
        self._check(bad)
        return yv, av, cv, m, k, n

    def _dot(self, k, term):
        """sum(term(l) for l < k), in order."""
        b, t = self.b, self.t
        acc = self._alloca(t.f64, t.f64(0.0))
        self.loop_over(b, t.i64(0), k, lambda l_: b.store(b.fadd(b.load(acc), term(l_)), acc))
        return b.load(acc)

    def _layout(self, view, rows, cols) -> tuple:
        """(BLAS can read it, its transpose flag, its leading dimension) for an m x n
        view: rows apart by s0 with unit columns (as stored), or the transpose of that."""
        b, t = self.b, self.t
        one = t.i64(1)
        s0 = b.select(b.icmp_signed("<=", rows, one), self._max(cols, one), view[1])
        s1 = b.select(b.icmp_signed("<=", cols, one), one, view[2])
        plain = b.and_(b.icmp_signed("==", s1, one),
                       b.icmp_signed(">=", s0, self._max(cols, one)))
        flipped = b.and_(b.icmp_signed("==", s0, one),
                         b.icmp_signed(">=", s1, self._max(rows, one)))
        i32 = self.ir.IntType(32)
        return (b.or_(plain, flipped), b.select(plain, i32(NO_TRANS), i32(TRANS)),
                b.select(plain, s0, s1))

    def _shared_gemm(self, alpha, A, B, C, m, k, n) -> None:
        """C += alpha * A @ B (each a (view, heap) pair; C's cells apart from A's and
        B's, and none repeated; no test of finiteness: a pullback's), through the
        module's one function for it (made on first use), so that a module has one copy
        of _gemm_body's paths for all its pullbacks' products (two each: a third of a
        one-product program's compile time). A forward product stays inline: outlined,
        its narrow rows (n <= 2, k <= 4) ran 7-10% slower."""
        b, t = self.b, self.t
        f = b.module.globals.get("rvm.gemm")
        if f is None:
            view = [t.i64] * 3 + [t.fptr]
            with self._building("rvm.gemm", self.ir.VoidType(),
                                [t.f64] + view * 3 + [t.i64] * 3) as f:
                a = f.args
                X = lambda o: ((a[o], a[o + 1], a[o + 2]), a[o + 3])
                self._gemm_body(a[0], X(1), X(5), X(9), a[13], a[14], a[15], None)
                self.b.ret_void()
        base = lambda X: self.cell(X[1], t.i64(0))
        b.call(f, [self._value(alpha), *A[0], base(A), *B[0], base(B), *C[0], base(C),
                   m, k, n])

    def _cellp(self, heap, index):
        """A pointer to cell `index` of heap (a pointer to its first cell)."""
        return self.b.gep(heap, [index])

    def _gemm_body(self, alpha, A, B, C, m, k, n, flag) -> None:
        """C += alpha * A @ B (C's cells apart from A's and B's, and none repeated):
        BLAS's dgemm from BLAS_WORK multiply-adds on when the views are laid out as BLAS
        reads them, else loops (a sum per element, in order). alpha a value (+-1.0: a
        product by it is exact); each of A, B, C a (view, pointer to the heap's first
        cell) pair; flag (or None) raised where a result is not finite."""
        b, t = self.b, self.t
        okA, ta, lda = self._layout(A[0], m, k)
        okB, tb, ldb = self._layout(B[0], k, n)
        okC, tc, ldc = self._layout(C[0], m, n)
        work = b.mul(b.mul(m, k), n)
        big = b.and_(self._some(m, n), b.icmp_signed(">=", work, t.i64(BLAS_WORK)))
        # (at m = 10^4, BLAS's dgemm adding into C is 1.5-5x faster than the loops from
        # rows of 8 on and from an inner dimension of 16 on; with narrower rows and a
        # shallower inner dimension it is up to 3.4x slower, and 3-6x faster writing the
        # product into a block of its own that is then added to C, as numpy does)
        fit = b.or_(b.icmp_signed(">=", n, t.i64(BLAS_WIDE)),
                    b.icmp_signed(">=", k, t.i64(BLAS_DEEP)))
        readable = b.and_(big, b.and_(okA, okB))
        use = b.and_(b.and_(readable, fit),
                     b.and_(okC, b.icmp_signed("==", tc, self.ir.IntType(32)(NO_TRANS))))
        blas, loops, after = (self.fn.append_basic_block() for _ in range(3))
        scratch, rest = self.fn.append_basic_block(), self.fn.append_basic_block()
        # a dot product (1 x k by k x 1, its elements any positive distance apart): ddot
        one = t.i64(1)
        dot = b.and_(b.and_(big, b.and_(b.icmp_signed("==", m, one),
                                        b.icmp_signed("==", n, one))),
                     b.and_(b.icmp_signed(">=", A[0][2], one),
                            b.icmp_signed(">=", B[0][1], one)))
        ddot, general = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(dot, ddot, general)
        b.position_at_end(ddot)
        f64p = t.f64.as_pointer()
        ptr = lambda X: self._cellp(X[1], X[0][0])
        sum_ = b.call(self.declare(BLAS_DOT, t.f64, [t.i64, f64p, t.i64, f64p, t.i64]),
                      [k, ptr(A), A[0][2], ptr(B), B[0][1]])
        into = ptr(C)
        new = b.fadd(b.load(into), b.fmul(alpha, sum_))
        if flag is not None:
            self.raise_flag(flag, self.non_finite([new]))
        b.store(new, into)
        b.branch(after)
        b.position_at_end(general)
        b.cbranch(use, blas, rest)
        b.position_at_end(rest)
        b.cbranch(b.and_(readable, b.not_(fit)), scratch, loops)
        b.position_at_end(blas)
        i32 = self.ir.IntType(32)
        gemm = self.declare(BLAS_GEMM, self.ir.VoidType(),
                            [i32, i32, i32, t.i64, t.i64, t.i64, t.f64, f64p, t.i64,
                             f64p, t.i64, t.f64, f64p, t.i64])
        b.call(gemm, [i32(ROW_MAJOR), ta, tb, m, n, k, alpha, ptr(A), lda, ptr(B),
                      ldb, t.f64(1.0), ptr(C), ldc])
        if flag is not None:
            self._each(m, n, lambda i, j: self.raise_flag(flag, self.non_finite(
                [b.load(self._cellp(C[1], self._at(C[0], i, j)))])))
        b.branch(after)
        b.position_at_end(scratch)
        self._through_scratch(gemm, alpha, (A, ta, lda), (B, tb, ldb), C, m, k, n, flag,
                              loops, after)
        b.position_at_end(loops)
        self._product_loops(alpha, A, B, C, m, k, n, flag)
        b.branch(after)
        b.position_at_end(after)

    def _through_scratch(self, gemm, alpha, A, B, C, m, k, n, flag, failed, after) -> None:
        """C += alpha * A @ B (rows narrower than BLAS_WIDE): BLAS's dgemm writes the
        product of SCRATCH_ROWS rows of A at a time into a block of memory of its own,
        added to C's rows in turn; to `failed` (the loops) if that block cannot be had."""
        b, t = self.b, self.t
        i8p, f64p, i32 = self.ir.IntType(8).as_pointer(), t.fptr, self.ir.IntType(32)
        (Av, ta, lda), (Bv, tb, ldb) = A, B
        rows = self._min(m, t.i64(SCRATCH_ROWS))
        raw = b.call(self.declare("malloc", i8p, [t.i64]), [b.mul(b.mul(rows, n), t.i64(8))])
        got = self.fn.append_basic_block()
        b.cbranch(b.icmp_unsigned("==", raw, i8p(None)), failed, got)
        b.position_at_end(got)
        block = b.bitcast(raw, f64p)
        zero = t.i64(0)
        first_b = self._cellp(Bv[1], Bv[0][0])

        def part(q):
            i0 = b.mul(q, t.i64(SCRATCH_ROWS))
            w = self._min(t.i64(SCRATCH_ROWS), b.sub(m, i0))
            first = self._cellp(Av[1], self._at(Av[0], i0, zero))
            b.call(gemm, [i32(ROW_MAJOR), ta, tb, w, n, k, alpha, first, lda,
                          first_b, ldb, t.f64(0.0), block, n])
            self._each(w, n, lambda r, j: self._add_into(
                C, b.add(i0, r), j, b.load(b.gep(block, [b.add(b.mul(r, n), j)])), flag))
        parts = b.sdiv(b.add(m, t.i64(SCRATCH_ROWS - 1)), t.i64(SCRATCH_ROWS))
        self.loop_over(b, zero, parts, part)
        b.call(self.declare("free", self.ir.VoidType(), [i8p]), [raw])
        b.branch(after)

    def _add_into(self, C, i, j, v, flag) -> None:
        """C[i, j] += v (C a (view, heap) pair); flag raised where the result is not
        finite."""
        b = self.b
        ptr = self._cellp(C[1], self._at(C[0], i, j))
        new = b.fadd(b.load(ptr), v)
        if flag is not None:
            self.raise_flag(flag, self.non_finite([new]))
        b.store(new, ptr)

    def _product_loops(self, alpha, A, B, C, m, k, n, flag) -> None:
        """_gemm_body's loops: C[i, j] += alpha * the sum of A[i, l] B[l, j] over l, from
        0 in the order of l, a row of C at a time, a block of its elements at a time
        (_in_blocks, the inner loop along a row of B: the same sums, bit for bit, as one
        element at a time); for rows narrower than BLAS_WIDE and a shallow inner
        dimension, one element at a time."""
        b, t = self.b, self.t
        zero = t.i64(0)
        load = lambda X, i, j: b.load(self._cellp(X[1], self._at(X[0], i, j)))

        def row(i):
            def fill(j0, w, at):
                def term(l_):
                    a = load(A, i, l_)

                    def one(c):
                        b.store(b.fadd(b.load(at(c)), b.fmul(a, load(B, l_, b.add(j0, c)))),
                                at(c))
                    self.loop_over(b, zero, w, one)
                self.loop_over(b, zero, k, term)

            self._in_blocks(n, fill, lambda j, v: out(i, j, v))

        def out(i, j, v):
            self._add_into(C, i, j, b.fmul(alpha, v), flag)

        def element(i, j):      # (the same sum: from 0, in the order of l)
            out(i, j, self._dot(k, lambda l_: b.fmul(load(A, i, l_), load(B, l_, j))))
        # rows narrower than BLAS_WIDE and an inner dimension under NARROW_DEEP: one
        # element at a time (blocks along a row cost 2.6-6.7x as much there: 4,000 x 1 x
        # 4, 500 x 1 x 2, 10^5 x 1 x 1; blocks down C's columns were faster still from
        # 16 rows on, but cost a small program's first gradient 70% more compile time)
        rows, elements, after = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(b.and_(b.icmp_signed("<", n, t.i64(BLAS_WIDE)),
                         b.icmp_signed("<", k, t.i64(NARROW_DEEP))), elements, rows)
        b.position_at_end(rows)
        self.loop_over(b, zero, m, row)
        b.branch(after)
        b.position_at_end(elements)
        self._each(m, n, element)
        b.branch(after)
        b.position_at_end(after)

    def _vmm(self, s, y, a, c, m, k, n):
        b = self.b
        s = self._sign(s)
        yv, av, cv, m, k, n = self._product(y, a, c, m, k, n)
        flag = self.new_flag()

        def element(i, j):
            return self._signed(s, self._dot(k, lambda l_: b.fmul(self._load(av, i, l_),
                                                                 self._load(cv, l_, j))))
        plain, summed, after = (self.fn.append_basic_block() for _ in range(3))
        b.cbranch(self._repeats(yv, m, n), summed, plain)
        b.position_at_end(plain)
        heap = self.cell("HF", self.t.i64(0))       # (inline: see _shared_gemm)
        self._gemm_body(self._value(s), (av, heap), (cv, heap), (yv, heap), m, k, n, flag)
        b.branch(after)
        b.position_at_end(summed)           # a target that sums (a dot product): in order
        self._into(yv, m, n, element, flag=flag)
        b.branch(after)
        b.position_at_end(after)
        self._check(b.load(flag))

    def _vmm_pull(self, s, pull, y, a, c, m, k, n):
        """a's shadow += s * gy @ c.T (bit 0 of pull); c's += s * a.T @ gy (bit 1) (a, c
        repeat no cell: they are shadows added into once per element pair; a view that
        repeats cells goes to the loops, in order)."""
        s = self._sign(s)
        yv, av, cv, m, k, n = self._product(y, a, c, m, k, n)
        tr = lambda v: (v[0], v[2], v[1])
        if pull & 1:
            self._shared_gemm(s, (yv, "HG"), (tr(cv), "HF"), (av, "HG"), m, n, k)
        if pull & 2:
            self._shared_gemm(s, (tr(av), "HF"), (yv, "HG"), (cv, "HG"), k, m, n)

    def _in_place(self, x, m, n):
        b = self.b
        m, n = self._int(m), self._int(n)
        xv = self._view(x)
        bad = b.or_(self._bad_shape(m, n), self._bad_view(xv, m, n))
        return xv, m, n, b.or_(bad, self._repeats(xv, m, n))

    def _vscale(self, op, x, c, m, n, g):
        b, t = self.b, self.t
        xv, m, n, bad = self._in_place(x, m, n)
        c = t.f64(float(c)) if isinstance(c, (int, float)) else self.coerce(c, t.f64)
        self._check(b.or_(bad, b.fcmp_unordered("==", c, t.f64(0.0))))
        shadows, divide = g == 1, op == "/"
        flag = self.new_flag()

        def body(i, j):
            ptr = self.cell("HG" if shadows else "HF", self._at(xv, i, j))
            old = b.load(ptr)
            new = b.fdiv(old, c) if divide else b.fmul(old, c)
            if not shadows:         # a result outside the normal range could not be undone
                small = t.f64(MIN_NORMAL)
                normal = b.and_(b.fcmp_ordered("<=", small, self.intrinsic("fabs", old)),
                                b.fcmp_ordered("<=", small, self.intrinsic("fabs", new)))
                normal = b.and_(normal, b.fcmp_ordered("<=", self.intrinsic("fabs", new),
                                                       t.f64(MAX_FLOAT)))
                zero = b.fcmp_ordered("==", old, t.f64(0.0))
                self.raise_flag(flag, b.not_(b.or_(zero, normal)))
            b.store(new, ptr)
        self._each(m, n, body)
        self._check(b.load(flag))

    def _vdotg(self, x, m, n):
        b, t = self.b, self.t
        xv, m, n, bad = self._in_place(x, m, n)
        self._check(bad)
        total = self._alloca(t.f64, t.f64(0.0))

        def body(i, j):
            at = self._at(xv, i, j)
            term = b.fmul(b.load(self.cell("HG", at)), b.load(self.cell("HF", at)))
            b.store(b.fadd(b.load(total), term), total)
        self._each(m, n, body)
        return b.load(total)

    def _vswap(self, a, c, m, n, g):
        b = self.b
        av, m, n, bad = self._in_place(a, m, n)
        cv = self._view(c)
        bad = b.or_(bad, b.or_(self._bad_view(cv, m, n), self._repeats(cv, m, n)))
        self._check(b.or_(bad, self._overlap(av, m, n, cv, m, n)))
        view = "HG" if g == 1 else "HI"     # (the bits, as they are)

        def body(i, j):
            p, q = self.cell(view, self._at(av, i, j)), self.cell(view, self._at(cv, i, j))
            x, y = b.load(p), b.load(q)
            b.store(y, p)
            b.store(x, q)
        self._each(m, n, body)

    def _vneg(self, x, m, n, g):
        b = self.b
        xv, m, n, bad = self._in_place(x, m, n)
        self._check(bad)
        view = "HG" if g == 1 else "HF"

        def body(i, j):
            p = self.cell(view, self._at(xv, i, j))
            b.store(b.fneg(b.load(p)), p)
        self._each(m, n, body)
