"""The array instructions' run-time helpers (rvm.core.isa, group "array") for the
interpreter and the python engine, with numpy; native code lowers the same helpers
(rvm.engines.arraylowering). Their semantics, element by element, come from the
instruction table: a family's value and partial derivatives are its scalar templates,
evaluated on arrays.

A view is (start, row stride, column stride) over the instruction's shape m x n: element
(i, j) is heap cell start + i * row stride + j * column stride. Every helper checks, before
it writes anything, that the shape is not negative, that each view lies inside the heap
(below its top), and that the cells it writes do not overlap the cells it reads (their
address ranges, lowest to highest cell, are disjoint, or the lattices their cells lie on
never meet: see apart); a view written in place (scale, negate, swap) may not repeat a
cell. A target that repeats a cell (a stride of 0) sums into it: `y[0 : 0, 0] += x` over n
elements is y += sum(x), the sum taken from 0 in the order of the elements and added
once, as native code does. Elementwise exp, log, sin, cos, tanh, pow and atan2 are native
code's own (rvm.engines.vectormath: the engines agree to the bit on them), products
numpy's matmul (BLAS): they may round differently from a loop of scalar instructions.
"""

from __future__ import annotations

import ast
import math
import typing

import numpy as np

from ..core.isa import FAMILIES, MAX_FLOAT, MIN_NORMAL, family
from . import blas, vectormath
from .blas import NO_TRANS, ROW_MAJOR, TRANS
from .templates import Fault

LIMIT = 1 << 31         # shapes and strides beyond this are refused (no int64 overflow)
# a matrix product's way, on every engine alike (Helpers._gemm; native code:
# rvm.engines.arraylowering, ArrayLowering._gemm_body): BLAS's dgemm adding into the target
# from BLAS_WORK multiply-adds on, where the views are laid out as BLAS reads them and its
# rows (n) are BLAS_WIDE wide or its inner dimension (k) BLAS_DEEP deep; with narrower
# rows and a shallower inner dimension dgemm writes the product of SCRATCH_ROWS rows at a
# time into a block of its own, added to the target after; ddot for a dot product; else a
# sum per element, from 0 in the order of the inner index
BLAS_WORK = 1 << 14
BLAS_WIDE, BLAS_DEEP = 8, 16
SCRATCH_ROWS = 4096


def in_turn(terms: np.ndarray) -> float:
    """The sum of terms from 0.0, one after another, row by row, as native code's loop
    adds them (np.sum's pairwise sum is a last bit apart from it, now and then)."""
    if not terms.size:
        return 0.0
    with np.errstate(all="ignore"):
        return float(np.cumsum(terms.ravel())[-1] + 0.0)


class _Math:
    """The math functions of the table's templates, on arrays: exp, log, sin, cos, tanh,
    pow and atan2 as native code's element loops compute them (rvm.engines.vectormath:
    the engines agree to the bit), numpy's where there is no native engine."""

    sqrt, fmod, trunc = np.sqrt, np.fmod, np.trunc
    _NUMPY: typing.ClassVar = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos,
                               "tanh": np.tanh, "pow": lambda a, b: np.where(
                                   np.equal(b, 2.0), np.multiply(a, a), np.power(a, b)),
                               "atan2": np.arctan2}     # (pow: templates.power's squares)

    def __getattr__(self, name: str):
        if name not in self._NUMPY:
            raise AttributeError(name)
        f = vectormath.array_function(name) or self._NUMPY[name]
        setattr(self, name, f)
        return f


def _dpow_db(a, b):
    with np.errstate(all="ignore"):
        return np.where(a > 0, _MATH.pow(a, b) * _MATH.log(np.where(a > 0, a, 1.0)), 0.0)


_MATH = _Math()
_NAMES = {"math": _MATH, "abs": np.abs, "sign": np.sign, "dpow_db": _dpow_db, "where": np.where,
          "float": lambda x: np.asarray(x, dtype=float)}


class _Where(ast.NodeTransformer):
    """`x if c else y` of a template as np.where(c, x, y), element by element."""

    def visit_IfExp(self, node):
        self.generic_visit(node)
        return ast.Call(ast.Name("where", ast.Load()), [node.test, node.body, node.orelse],
                        [])


def _compiled(text: str, args: tuple):
    """A family template of the instruction table as a function of numpy arrays."""
    body = text.format(**{a: a for a in args})
    if " if " in body:
        body = ast.unparse(_Where().visit(ast.parse(body, mode="eval")))
    return eval(f"lambda {', '.join(args)}: {body}", dict(_NAMES))   # the table's text


def _family(name: str):
    args, value, partials = family(name)
    return args, _compiled(value, args), tuple(_compiled(p, args) for p in partials)


_FAMILIES = {name: _family(name) for name in ("id", *FAMILIES)}


def _span(view, m: int, n: int) -> tuple[int, int]:
    """The lowest and highest cell of a view (m, n > 0)."""
    start, s0, s1 = view
    lo = start + min(0, (m - 1) * s0) + min(0, (n - 1) * s1)
    hi = start + max(0, (m - 1) * s0) + max(0, (n - 1) * s1)
    return lo, hi


def _lattice(view, m: int, n: int) -> int:
    """The step of the lattice a view's cells lie on: every cell is start + a multiple of
    it (the gcd of the strides that move: a dimension of 1 does not)."""
    return math.gcd(abs(view[1]) if m > 1 else 0, abs(view[2]) if n > 1 else 0)


def apart(one, m: int, n: int, two, r: int, c: int) -> bool:
    """Do two non-empty views share no cell? Yes if their address ranges are disjoint, or
    if their cells lie on lattices that never meet (a value and its derivative on the
    interleaved heap: even and odd cells)."""
    lo, hi = _span(one, m, n)
    lo2, hi2 = _span(two, r, c)
    if hi < lo2 or hi2 < lo:
        return True
    step = math.gcd(_lattice(one, m, n), _lattice(two, r, c))
    return (one[0] - two[0]) % step != 0 if step else one[0] != two[0]


def _layout(view, rows: int, cols: int) -> tuple[bool, int, int]:
    """(BLAS can read it, its transpose flag, its leading dimension) for a rows x cols
    view: rows apart by s0 with unit columns (as stored), or the transpose of that
    (rvm.engines.arraylowering: ArrayLowering._layout, alike)."""
    _, s0, s1 = view
    s0 = max(cols, 1) if rows <= 1 else s0
    s1 = 1 if cols <= 1 else s1
    plain = s1 == 1 and s0 >= max(cols, 1)
    flipped = s0 == 1 and s1 >= max(rows, 1)
    return plain or flipped, NO_TRANS if plain else TRANS, s0 if plain else s1


def _repeats(view, m: int, n: int) -> bool:
    """Does the view name a cell twice?"""
    s0, s1 = abs(view[1]), abs(view[2])
    if m == 1 or n == 1:
        return (s1 if m == 1 else s0) == 0 and max(m, n) > 1
    return s0 == 0 or s1 == 0 or not (s1 * n <= s0 or s0 * m <= s1)


# Program.cache key of a derived program on the interleaved heap (rvm.ad.transforms: the
# source's cell a at 2a, its derivative at 2a + 1), with how many times it was interleaved,
# d (a derivative of a derivative: 2): the cells of the first source are those at a
# multiple of 2^d, the rest hold derivatives (and the derivative programs' temporaries),
# whose zero test when freed scales as a derived register's does (Machine.free)
INTERLEAVED = "interleaved"


class Helpers:
    """Mixed into the Machine: the helpers the generated code calls (M.vacc(...) ...)."""

    def _floats(self, shadows: bool = False) -> np.ndarray:
        return np.frombuffer(self._gbuf if shadows else self._buf, dtype="<f8",
                             count=self.cap)

    def _shape(self, *dims) -> None:
        for d in dims:
            if not 0 <= d < LIMIT:
                raise Fault(f"array shape {' x '.join(map(str, dims))}: a dimension is "
                            f"negative or too large ({d})")

    def _check(self, view, m: int, n: int, name: str) -> None:
        """The view lies inside the heap (below its top)."""
        start, s0, s1 = view
        if not (abs(s0) < LIMIT and abs(s1) < LIMIT and -LIMIT < start < 1 << 62):
            raise Fault(f"view {name} = (start {start}, strides {s0}, {s1}) is outside "
                        f"the heap ({self.top} cells in use)")
        if m and n:
            lo, hi = _span(view, m, n)
            if lo < 0 or hi >= self.top:
                raise Fault(f"view {name}: cells {lo}..{hi} of an {m} x {n} view are "
                            f"outside the heap ({self.top} cells in use)")

    def _of(self, view, m: int, n: int, shadows: bool = False) -> np.ndarray:
        """The view's cells (or their shadows) as a strided m x n numpy array (checked)."""
        if not (m and n):
            return np.zeros((m, n))
        start, s0, s1 = view
        return np.ndarray((m, n), "<f8", self._gbuf if shadows else self._buf, 8 * start,
                          (8 * s0, 8 * s1))

    def _apart(self, written, read: list, m: int, n: int, shapes=None) -> None:
        """The cells written do not overlap the cells read (address ranges)."""
        if not (m and n):
            return
        for k, (view, (r, c)) in enumerate(zip(read, shapes or [(m, n)] * len(read))):
            if isinstance(view, tuple) and r and c and not apart(written, m, n, view, r, c):
                (lo, hi), (lo2, hi2) = _span(written, m, n), _span(view, r, c)
                raise Fault(f"the view written (cells {lo}..{hi}) overlaps operand "
                            f"{k + 1} (cells {lo2}..{hi2}): the update would read what "
                            "it changes")

    def _add(self, shadows: bool, view, m: int, n: int, values, what: str) -> None:
        """The view's cells += values, refused unless every result is finite; nothing is
        written then. A repeated cell gets the sum of its values, summed from 0 in the
        order of the elements (cumsum is sequential, as native code sums), added once."""
        if not (m and n):
            return
        values = np.broadcast_to(values, (m, n))
        start, s0, s1 = view
        cells = self._of(view, m, n, shadows)
        one_row, one_column = m <= 1 or s0 == 0, n <= 1 or s1 == 0
        if not _repeats(view, m, n):
            target, add = cells, values
            where = lambda k: start + (k // n) * s0 + (k % n) * s1
        elif one_row and one_column:                    # one cell: one sum (from +0.0:
            target, add = cells[:1, 0], np.array([in_turn(values)])    # never -0.0)
            where = lambda k: start
        elif one_column:                                # a cell per row
            target, add = cells[:, 0], np.cumsum(values, axis=1)[:, -1] + 0.0
            where = lambda k: start + k * s0
        elif one_row:                                   # a cell per column
            target, add = cells[0], np.cumsum(values, axis=0)[-1] + 0.0
            where = lambda k: start + k * s1
        else:                                           # rows that overlap: cell by cell
            index = (start + np.arange(m)[:, None] * s0 + np.arange(n)[None, :] * s1).ravel()
            flat, inverse = np.unique(index, return_inverse=True)
            sums = np.zeros(len(flat))
            np.add.at(sums, inverse, values.ravel())
            target, add = self._floats(shadows)[flat], sums
            with np.errstate(all="ignore"):
                new = target + add
            self._finite(new, lambda k: flat[k], what)
            self._floats(shadows)[flat] = new
            return None if shadows else self._noted(view, new)
        with np.errstate(all="ignore"):
            new = target + add
        self._finite(new, where, what)
        target[...] = new
        if not shadows:
            self._noted(view, new)

    def _noted(self, view, new: np.ndarray) -> None:
        """After an array instruction wrote derivatives, their largest magnitude noted in
        dscale: a derivative's residue left in a heap cell when it is freed is then judged
        as a derived register's is (Machine.free). In a derived program on the interleaved
        heap (INTERLEAVED, d times), the views of the first source's values start at a
        multiple of 2^d with strides that are; every other view holds derivatives or a
        derivative program's temporaries (as the derived registers do)."""
        depth = self.program.cache.get(INTERLEAVED)
        if depth and new.size and (view[0] | view[1] | view[2]) & ((1 << depth) - 1):
            self.dscale = max(self.dscale, float(abs(new).max()))

    def _finite(self, new: np.ndarray, cell, what: str) -> None:
        bad = ~np.isfinite(new)
        if bad.any():
            k = int(np.argmax(bad))
            raise Fault(f"{what}heap cell {int(cell(k))} would become "
                        f"{float(new.ravel()[k])!r}: not finite")

    def _operand(self, x, m: int, n: int, k: int):
        """An operand's values (an m x n array, or a scalar as it is)."""
        if isinstance(x, tuple):
            self._check(x, m, n, f"operand {k + 1}")
            return self._of(x, m, n)
        return float(x)

    def _accumulation(self, fam: str, y, rest: tuple):
        ops, (m, n) = rest[:-2], rest[-2:]
        self._shape(m, n)
        self._check(y, m, n, "written")
        self._apart(y, list(ops), m, n)
        values = [self._operand(x, m, n, k) for k, x in enumerate(ops)]
        return _FAMILIES[fam], ops, values, m, n

    def vacc(self, fam: str, s: int, y, *rest) -> None:
        """y += s * f(ops) element by element (VADD, VSUB and their families)."""
        (_, f, _), _, values, m, n = self._accumulation(fam, y, rest)
        if m and n:
            with np.errstate(all="ignore"):
                v = np.asarray(f(*values), dtype=float)
            self._add(False, y, m, n, v if s == 1 else -v, "")

    def _pullbacks(self, fam: str, s: int, y, rest: tuple):
        (_, _, partials), ops, values, m, n = self._accumulation(fam, y, rest)
        gy = self._of(y, m, n, True)
        for k, (x, p) in enumerate(zip(ops, partials)):
            with np.errstate(all="ignore"):     # a zero shadow pulls back nothing
                d = np.where(gy != 0.0, gy * p(*values), 0.0) * s
            yield k, x, d, m, n

    def vgrad(self, fam: str, s: int, k: int, y, *rest) -> float:
        """The gradient a scalar operand k gets: s * sum(gy * df/dop_k)."""
        for j, _, d, _, _ in self._pullbacks(fam, s, y, rest):
            if j == k:
                g = in_turn(d)
                if not np.isfinite(g):
                    raise Fault(f"the gradient of operand {k + 1} would become {g!r}: "
                                "not finite")
                return g
        return 0.0

    def vpull(self, fam: str, s: int, pull: int, y, *rest) -> None:
        """The view operands' shadows += s * gy * df/dop (operand k's where bit k of pull
        is set: rvm.ad.activity)."""
        for k, x, d, m, n in self._pullbacks(fam, s, y, rest):
            if isinstance(x, tuple) and d.size and pull >> k & 1:
                self._add(True, x, m, n, d, "the gradient of ")

    def _product(self, y, a, b, m: int, k: int, n: int):
        self._shape(m, k, n)
        self._check(y, m, n, "written")
        self._check(a, m, k, "a")
        self._check(b, k, n, "b")
        self._apart(y, [a, b], m, n, [(m, k), (k, n)])
        return self._of(a, m, k), self._of(b, k, n)

    def vmm(self, s: int, y, a, b, m: int, k: int, n: int) -> None:
        """y += s * a @ b (VMADD, VMSUB)."""
        self._product(y, a, b, m, k, n)
        if m and n and _repeats(y, m, n):    # (a sum into cells: each term in order)
            self._add(False, y, m, n, s * self._in_order(a, False, b, False, m, k, n), "")
            return
        self._gemm(float(s), (a, False), (b, False), (y, False), m, k, n, "")

    def vmm_pull(self, s: int, pull: int, y, a, b, m: int, k: int, n: int) -> None:
        """a's shadow += s * gy @ b.T (bit 0 of pull); b's += s * a.T @ gy (bit 1)."""
        self._product(y, a, b, m, k, n)
        tr = lambda v: (v[0], v[2], v[1])
        if pull & 1:
            self._gemm(float(s), (y, True), (tr(b), False), (a, True), m, n, k,
                       "the gradient of ")
        if pull & 2:
            self._gemm(float(s), (tr(a), False), (y, True), (b, True), k, m, n,
                       "the gradient of ")

    def _in_order(self, a, ga: bool, b, gb: bool, m: int, k: int, n: int) -> np.ndarray:
        """a @ b with each element's sum from 0 in the order of the inner index (no
        pairwise or blocked sums: a loop's, as native code's loops take it)."""
        A, B = self._of(a, m, k, ga), self._of(b, k, n, gb)
        with np.errstate(all="ignore"):
            if m * n <= 64 and m * k * n <= 1 << 22 and k:  # (a few long sums: cumsum,
                terms = A[:, None, :] * B.T[None, :, :]         # sequential; + 0.0 as
                return np.cumsum(terms, axis=2)[:, :, -1] + 0.0  # from 0)
            out = np.zeros((m, n))
            for l_ in range(k):
                out += A[:, l_:l_ + 1] * B[l_:l_ + 1, :]
        return out

    def _gemm(self, alpha: float, A: tuple, B: tuple, C: tuple, m: int, k: int, n: int,
              what: str) -> None:
        """C += alpha * A @ B, each a (view, of the shadows?) pair (C's cells apart from
        A's and B's), computed as native code computes it, bit for bit: the same BLAS
        routines on the same cells, or the same sums in the same order (see BLAS_WORK;
        rvm.engines.arraylowering: ArrayLowering._gemm_body). Nothing is written where a
        result is not finite (an error)."""
        (a, ga), (b, gb), (c, gc) = A, B, C
        okA, ta, lda = _layout(a, m, k)
        okB, tb, ldb = _layout(b, k, n)
        okC, tc, ldc = _layout(c, m, n)
        big = m > 0 and n > 0 and m * k * n >= BLAS_WORK
        fit = n >= BLAS_WIDE or k >= BLAS_DEEP
        at = lambda view, shadows, i=0, j=0: self._address(shadows) + \
            8 * (view[0] + i * view[1] + j * view[2])
        if big and m == 1 and n == 1 and a[2] >= 1 and b[1] >= 1:     # a dot product
            value = blas.dot()(k, at(a, ga), a[2], at(b, gb), b[1])
            self._sum_into(c, gc, 1, 1, np.array([[alpha * value]]), what)
        elif big and okA and okB and fit and okC and tc == NO_TRANS:
            cells = self._of(c, m, n, gc)
            before = cells.copy()
            with np.errstate(all="ignore"):
                blas.gemm()(ROW_MAJOR, ta, tb, m, n, k, alpha, at(a, ga), lda, at(b, gb), ldb,
                            1.0, at(c, gc), ldc)
            try:
                self._finite(cells, lambda q: c[0] + (q // n) * c[1] + (q % n) * c[2], what)
            except Fault:
                cells[...] = before
                raise
            if not gc:
                self._noted(c, cells)
        elif big and okA and okB and not fit:       # narrow rows, shallow: through a block
            block = np.empty((min(m, SCRATCH_ROWS), n))
            out = np.empty((m, n))
            for i0 in range(0, m, SCRATCH_ROWS):
                w = min(SCRATCH_ROWS, m - i0)
                blas.gemm()(ROW_MAJOR, ta, tb, w, n, k, alpha, at(a, ga, i0), lda,
                            at(b, gb), ldb, 0.0, block.ctypes.data, n)
                out[i0:i0 + w] = block[:w]
            self._sum_into(c, gc, m, n, out, what)
        else:
            self._sum_into(c, gc, m, n, alpha * self._in_order(a, ga, b, gb, m, k, n), what)

    def _address(self, shadows: bool) -> int:
        """The address of the heap's first cell (or its shadow's)."""
        return np.frombuffer(self._gbuf if shadows else self._buf, np.uint8).ctypes.data

    def _sum_into(self, view, shadows: bool, m: int, n: int, values, what: str) -> None:
        """The view's cells += values, element by element in order, as native code adds a
        product's elements (a view that repeats a cell, a pullback's: each term added into
        it in turn); nothing is written where a result is not finite."""
        if not (m and n and _repeats(view, m, n)):
            self._add(shadows, view, m, n, values, what)
            return
        cells, start, s0, s1 = self._floats(shadows), *view
        index = [start + i * s0 + j * s1 for i in range(m) for j in range(n)]
        before = cells[index].copy()
        with np.errstate(all="ignore"):
            for q, v in zip(index, np.ravel(values)):
                cells[q] += v
        bad = [q for q in index if not math.isfinite(cells[q])]
        if bad:
            cells[index[::-1]] = before[::-1]
            raise Fault(f"{what}heap cell {bad[0]} would become {float(cells[bad[0]])!r}: "
                        "not finite")
        if not shadows:
            self._noted(view, cells[index])

    def _in_place(self, x, m: int, n: int, shadows: bool, name: str = "x") -> np.ndarray:
        self._shape(m, n)
        self._check(x, m, n, name)
        if m and n and _repeats(x, m, n):
            raise Fault(f"view {name} names a cell twice (a stride of 0, or rows that "
                        "overlap): it cannot be changed in place element by element")
        return self._of(x, m, n, shadows)

    def vscale(self, op: str, x, c: float, m: int, n: int, g: int) -> None:
        """x *= c or x /= c (g: the shadows, unchecked but for finiteness)."""
        cells = self._in_place(x, m, n, bool(g))
        c = float(c)
        if c == 0.0:
            raise Fault("the factor is zero: an array cannot be scaled by 0 reversibly")
        old = cells
        with np.errstate(all="ignore"):
            new = old * c if op == "*" else old / c
        where = lambda k: x[0] + (k // n) * x[1] + (k % n) * x[2]
        if g:
            self._finite(new, where, "the gradient of ")
        else:
            size = np.abs(new)
            bad = (old != 0.0) & ~((np.abs(old) >= MIN_NORMAL) & (size >= MIN_NORMAL)
                                   & (size <= MAX_FLOAT))
            if bad.any():
                j = int(np.argmax(bad))
                raise Fault(f"heap cell {where(j)} = {float(old.ravel()[j])!r} {op} {c!r} "
                            "would leave the normal float range (to zero, a subnormal or "
                            "infinity) and could not be undone")
            self._noted(x, new)
        cells[...] = new

    def vdotg(self, x, m: int, n: int) -> float:
        """sum(shadow * value) over a view (a scale's pullback into its factor)."""
        values = self._in_place(x, m, n, False)
        with np.errstate(all="ignore"):     # (not finite: refused below)
            g = in_turn(self._of(x, m, n, True) * values)
        if not np.isfinite(g):
            raise Fault(f"the factor's gradient would become {g!r}: not finite")
        return g

    def vswap(self, a, b, m: int, n: int, g: int) -> None:
        one, two = self._in_place(a, m, n, bool(g), "a"), self._in_place(b, m, n, bool(g), "b")
        self._apart(a, [b], m, n)
        kept = one.copy()
        one[...] = two
        two[...] = kept

    def vneg(self, x, m: int, n: int, g: int) -> None:
        cells = self._in_place(x, m, n, bool(g))
        np.negative(cells, out=cells)
