"""The array instructions' run-time helpers (rvm.core.isa, group "array") for the
interpreter and the python engine, with numpy; native code lowers the same helpers
(rvm.engines.lowering). Their semantics, element by element, come from the instruction
table: a family's value and partial derivatives are its scalar templates, evaluated on
arrays.

A view is (start, row stride, column stride) over the instruction's shape m x n: element
(i, j) is heap cell start + i * row stride + j * column stride. Every helper checks, before
it writes anything, that the shape is not negative, that each view lies inside the heap
(below its top), and that the cells it writes do not overlap the cells it reads (their
address ranges, lowest to highest cell, are disjoint, or the lattices their cells lie on
never meet: see apart); a view written in place (scale,
negate, swap) may not repeat a cell. A target that repeats a cell (a stride of 0) sums
into it: `y[0 : 0, 0] += x` over n elements is y += sum(x). Sums are numpy's (BLAS's for
products): they may round differently from a loop of scalar instructions.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.isa import FAMILIES, MAX_FLOAT, MIN_NORMAL
from .templates import Fault

LIMIT = 1 << 31         # shapes and strides beyond this are refused (no int64 overflow)


class _Math:
    exp, log, sin, cos, tanh, sqrt = np.exp, np.log, np.sin, np.cos, np.tanh, np.sqrt
    pow, fmod, atan2, trunc = np.power, np.fmod, np.arctan2, np.trunc


def _dpow_db(a, b):
    with np.errstate(all="ignore"):
        return np.where(a > 0, np.power(a, b) * np.log(np.where(a > 0, a, 1.0)), 0.0)


_NAMES = {"math": _Math, "abs": np.abs, "sign": np.sign, "dpow_db": _dpow_db,
          "float": lambda x: np.asarray(x, dtype=float)}


def _compiled(text: str, args: tuple):
    """A family template of the instruction table as a function of numpy arrays."""
    body = text.format(**{a: a for a in args})
    return eval(f"lambda {', '.join(args)}: {body}", dict(_NAMES))   # the table's text


def _family(name: str):
    if name == "id":
        return ("a",), _compiled("{a}", ("a",)), (_compiled("1.0 + 0.0 * {a}", ("a",)),)
    args, value, partials, _ = FAMILIES[name]
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


def _repeats(view, m: int, n: int) -> bool:
    """Does the view name a cell twice?"""
    s0, s1 = abs(view[1]), abs(view[2])
    if m == 1 or n == 1:
        return (s1 if m == 1 else s0) == 0 and max(m, n) > 1
    return s0 == 0 or s1 == 0 or not (s1 * n <= s0 or s0 * m <= s1)


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

    def _index(self, view, m: int, n: int, name: str) -> np.ndarray:
        """The view's cells as an m x n array of addresses, checked to be in the heap."""
        start, s0, s1 = view
        if not (abs(s0) < LIMIT and abs(s1) < LIMIT and -LIMIT < start < 1 << 62):
            raise Fault(f"view {name} = (start {start}, strides {s0}, {s1}) is outside "
                        f"the heap ({self.top} cells in use)")
        if m and n:
            lo, hi = _span(view, m, n)
            if lo < 0 or hi >= self.top:
                raise Fault(f"view {name}: cells {lo}..{hi} of an {m} x {n} view are "
                            f"outside the heap ({self.top} cells in use)")
        return start + np.arange(m)[:, None] * s0 + np.arange(n)[None, :] * s1

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

    def _add(self, shadows: bool, index: np.ndarray, values: np.ndarray, what: str,
             view=None) -> None:
        """cells[index] += values (index: a view's m x n addresses), refused unless every
        result is finite; nothing is written then. A repeated cell gets the sum of its
        values, summed from 0 in the order of the elements (cumsum is sequential; native
        code sums alike), added once."""
        cells = self._floats(shadows)
        m, n = index.shape
        values = np.broadcast_to(values, index.shape)     # (sums + 0.0: native code sums
        # from +0.0, which never gives -0.0)
        if view is not None and not _repeats(view, m, n):
            flat, add = index.ravel(), values.ravel()
        elif view is not None and (m <= 1 or view[1] == 0) and (n <= 1 or view[2] == 0):
            flat, add = index.ravel()[:1], np.cumsum(values.ravel())[-1:] + 0.0
        elif view is not None and (n <= 1 or view[2] == 0):        # a cell per row
            flat, add = index[:, 0], np.cumsum(values, axis=1)[:, -1] + 0.0
        elif view is not None and (m <= 1 or view[1] == 0):        # a cell per column
            flat, add = index[0], np.cumsum(values, axis=0)[-1] + 0.0
        else:
            flat, add = index.ravel(), values.ravel()
            if len(flat) and len(np.unique(flat)) < len(flat):
                flat, inverse = np.unique(flat, return_inverse=True)
                sums = np.zeros(len(flat))
                np.add.at(sums, inverse, add)
                add = sums
        with np.errstate(all="ignore"):
            new = cells[flat] + add
        self._finite(new, flat, what)
        cells[flat] = new

    def _finite(self, new: np.ndarray, flat: np.ndarray, what: str) -> None:
        bad = ~np.isfinite(new)
        if bad.any():
            k = int(np.argmax(bad))
            raise Fault(f"{what}heap cell {int(flat[k])} would become "
                        f"{float(new[k])!r}: not finite")

    def _operand(self, x, m: int, n: int, k: int, shadows: bool = False):
        """An operand's values (an m x n array, or a scalar as it is)."""
        if isinstance(x, tuple):
            return self._floats(shadows)[self._index(x, m, n, f"operand {k + 1}")]
        return 0.0 if shadows else float(x)

    def _accumulation(self, fam: str, y, rest: tuple):
        ops, (m, n) = rest[:-2], rest[-2:]
        self._shape(m, n)
        yi = self._index(y, m, n, "written")
        self._apart(y, list(ops), m, n)
        values = [self._operand(x, m, n, k) for k, x in enumerate(ops)]
        return _FAMILIES[fam], yi, ops, values, m, n

    def vacc(self, fam: str, s: int, y, *rest) -> None:
        """y += s * f(ops) element by element (VADD, VSUB and their families)."""
        (_, f, _), yi, _, values, _, _ = self._accumulation(fam, y, rest)
        if not yi.size:
            return
        with np.errstate(all="ignore"):
            v = f(*values)
        self._add(False, yi, s * np.asarray(v, dtype=float), "", y)

    def _pullbacks(self, fam: str, s: int, y, rest: tuple):
        (_, _, partials), yi, ops, values, m, n = self._accumulation(fam, y, rest)
        gy = self._floats(True)[yi]
        for k, (x, p) in enumerate(zip(ops, partials)):
            with np.errstate(all="ignore"):     # a zero shadow pulls back nothing
                d = np.where(gy != 0.0, gy * p(*values), 0.0) * s
            yield k, x, d, m, n

    def vgrad(self, fam: str, s: int, k: int, y, *rest) -> float:
        """The gradient a scalar operand k gets: s * sum(gy * df/dop_k)."""
        for j, _, d, _, _ in self._pullbacks(fam, s, y, rest):
            if j == k:
                g = float(np.sum(d))
                if not np.isfinite(g):
                    raise Fault(f"the gradient of operand {k + 1} would become {g!r}: "
                                "not finite")
                return g
        return 0.0

    def vpull(self, fam: str, s: int, y, *rest) -> None:
        """The view operands' shadows += s * gy * df/dop."""
        for k, x, d, m, n in self._pullbacks(fam, s, y, rest):
            if isinstance(x, tuple) and d.size:
                self._add(True, self._index(x, m, n, f"operand {k + 1}"), d,
                          "the gradient of ", x)

    def _product(self, y, a, b, m: int, k: int, n: int):
        self._shape(m, k, n)
        yi = self._index(y, m, n, "written")
        ai, bi = self._index(a, m, k, "a"), self._index(b, k, n, "b")
        self._apart(y, [a, b], m, n, [(m, k), (k, n)])
        return yi, ai, bi

    def vmm(self, s: int, y, a, b, m: int, k: int, n: int) -> None:
        """y += s * a @ b (VMADD, VMSUB)."""
        yi, ai, bi = self._product(y, a, b, m, k, n)
        if yi.size:
            h = self._floats()
            with np.errstate(all="ignore"):
                self._add(False, yi, s * (h[ai] @ h[bi]), "", y)

    def vmm_pull(self, s: int, y, a, b, m: int, k: int, n: int) -> None:
        """a's shadow += s * gy @ b.T; b's += s * a.T @ gy."""
        yi, ai, bi = self._product(y, a, b, m, k, n)
        if not yi.size or not k:
            return
        h, gy = self._floats(), self._floats(True)[yi]
        with np.errstate(all="ignore"):
            ga, gb = s * (gy @ h[bi].T), s * (h[ai].T @ gy)
        self._add(True, ai, ga, "the gradient of ", a)
        self._add(True, bi, gb, "the gradient of ", b)

    def _in_place(self, x, m: int, n: int, name: str = "x") -> np.ndarray:
        self._shape(m, n)
        xi = self._index(x, m, n, name)
        if m and n and _repeats(x, m, n):
            raise Fault(f"view {name} names a cell twice (a stride of 0, or rows that "
                        "overlap): it cannot be changed in place element by element")
        return xi.ravel()

    def vscale(self, op: str, x, c: float, m: int, n: int, g: int) -> None:
        """x *= c or x /= c (g: the shadows, unchecked but for finiteness)."""
        xi = self._in_place(x, m, n)
        c = float(c)
        if c == 0.0:
            raise Fault("the factor is zero: an array cannot be scaled by 0 reversibly")
        cells = self._floats(bool(g))
        old = cells[xi]
        with np.errstate(all="ignore"):
            new = old * c if op == "*" else old / c
        if g:
            self._finite(new, xi, "the gradient of ")
        else:
            size = np.abs(new)
            bad = (old != 0.0) & ~((np.abs(old) >= MIN_NORMAL) & (size >= MIN_NORMAL)
                                   & (size <= MAX_FLOAT))
            if bad.any():
                j = int(np.argmax(bad))
                raise Fault(f"heap cell {int(xi[j])} = {float(old[j])!r} {op} {c!r} would leave "
                            "the normal float range (to zero, a subnormal or infinity) and "
                            "could not be undone")
        cells[xi] = new

    def vdotg(self, x, m: int, n: int) -> float:
        """sum(shadow * value) over a view (a scale's pullback into its factor)."""
        xi = self._in_place(x, m, n)
        g = float(np.dot(self._floats(True)[xi], self._floats()[xi]))
        if not np.isfinite(g):
            raise Fault(f"the factor's gradient would become {g!r}: not finite")
        return g

    def vswap(self, a, b, m: int, n: int, g: int) -> None:
        ai, bi = self._in_place(a, m, n, "a"), self._in_place(b, m, n, "b")
        self._apart(a, [b], m, n)
        cells = self._floats(bool(g))
        cells[ai], cells[bi] = cells[bi], cells[ai].copy()

    def vneg(self, x, m: int, n: int, g: int) -> None:
        xi = self._in_place(x, m, n)
        cells = self._floats(bool(g))
        cells[xi] = -cells[xi]
