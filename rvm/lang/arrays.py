"""Array statements of the reversible Python subset (docs/language.md, "Arrays").

`y += a * x`, `y[1:n] -= np.exp(x)`, `y += A @ x`, `C += A.T @ B`, `s += x @ y`,
`s += np.sum(e, axis=k)`, `x *= c`, `x, y = y, x`, `neg(x)` on whole arrays and slices,
with numpy's syntax and broadcasting.

Two halves, kept apart:

- the analysis: which statement this is (one `Form` per kind: elementwise accumulation,
  matrix product / dot, sum, scale, swap, neg), with which views of which arrays
  (`View`: the array, the index or range taken along each axis, transposed or not; its
  offset, shape and strides), the shapes that must agree (`Dim`s, compared when
  compiling where they are known and checked when running otherwise) and the overlaps
  a target may not have with its operands;
- the emission: each form becomes nested counted `for` loops over the target's
  elements, whose body is the scalar statement of one element (`emit_*`). These go
  through the frontend's statement compiler like any loop the user writes, so every
  engine and transform runs them unchanged. (An array instruction can later replace a
  loop: only the `emit_*` functions change.)
"""

from __future__ import annotations

import ast
from collections.abc import Callable

import attrs

from .expressions import FUNCS

LOOP_HINT = "write the loop: for i in range(...): y[i] += ... (see docs/language.md, Arrays)"
ARITH = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow, ast.FloorDiv, ast.Mod, ast.BitAnd,
         ast.BitOr, ast.BitXor, ast.LShift, ast.RShift)


# ---------------------------------------------------------------------------- analysis
@attrs.frozen
class Dim:
    """A length: its expression, and a linear form (symbol -> coefficient, constant) to
    compare lengths while compiling (symbols: an array dimension's register, a variable)."""

    expr: ast.expr
    form: tuple          # (frozenset of (symbol, coefficient), constant)

    @property
    def const(self) -> int | None:
        return self.form[1] if not self.form[0] else None

    def text(self) -> str:
        return ast.unparse(self.expr)


def _lin(terms: dict, c: int) -> tuple:
    return (frozenset((k, v) for k, v in terms.items() if v), c)


def _sub(a: tuple, b: tuple) -> tuple:
    terms = dict(a[0])
    for k, v in b[0]:
        terms[k] = terms.get(k, 0) - v
    return _lin(terms, a[1] - b[1])


@attrs.frozen
class Axis:
    """What a view takes along one axis of its array: one index (`at`) or the range
    [lo, hi)."""

    lo: ast.expr
    lo_form: tuple
    hi: ast.expr | None = None      # None: the single index lo
    hi_form: tuple | None = None
    dim: Dim | None = None          # the array's length along the axis

    @property
    def free(self) -> bool:
        return self.hi is not None


@attrs.frozen
class View:
    """A whole array, a slice of it, a row or column of a matrix, or a transpose: an array
    `name` read at `offset + sum(i_k * strides[k])` for i within `shape`."""

    name: str
    node: ast.expr
    axes: tuple                 # one Axis per array axis
    transposed: bool = False
    dtype: str = ""

    @property
    def free_axes(self) -> list[int]:
        free = [k for k, a in enumerate(self.axes) if a.free]
        return free[::-1] if self.transposed else free

    @property
    def shape(self) -> list[Dim]:
        out = []
        for k in self.free_axes:
            a = self.axes[k]
            out.append(Dim(length(a.lo, a.hi), _sub(a.hi_form, a.lo_form)))
        return out

    @property
    def rank(self) -> int:
        return len(self.free_axes)

    def layout(self) -> tuple:
        """(base array, offset, shape, strides) as expressions: the description an array
        instruction takes."""
        strides = [ast.Constant(1)] if len(self.axes) == 1 else [
            _attr_shape(self.name, 1), ast.Constant(1)]
        offset = None
        for a, s in zip(self.axes, strides):
            term = _mul(a.lo, s)
            offset = term if offset is None else _add(offset, term)
        return (self.name, offset, [d.expr for d in self.shape],
                [strides[k] for k in self.free_axes])

    def element(self, idx: list) -> ast.Subscript:
        """The element at index idx (one expression per free axis, in view order)."""
        free = dict(zip(self.free_axes, idx))
        parts = [_add(a.lo, free[k]) if a.free else a.lo for k, a in enumerate(self.axes)]
        sl = parts[0] if len(parts) == 1 else ast.Tuple(parts, ast.Load())
        return ast.Subscript(ast.Name(self.name, ast.Load()), sl, ast.Load())

    def describe(self) -> str:
        return ast.unparse(self.node)


def scaled(coeff: list | None, term: ast.expr) -> ast.expr:
    """The element term times (or divided by) the scalar factors of its product or sum,
    in the source's order: c * x[k] / n."""
    for g, div in coeff or ():
        term = ast.BinOp(term, ast.Div(), g) if div else ast.BinOp(g, ast.Mult(), term)
    return term


@attrs.frozen
class Product:
    """c * (A @ B), np.dot(A, B): A and B views of rank 1 or 2."""

    a: View
    b: View
    coeff: list | None          # (factor, is a divisor)
    node: ast.expr


@attrs.frozen
class Sum:
    """c * np.sum(e) or c * np.sum(e, axis=k)."""

    expr: ast.expr
    axis: int | None
    coeff: list | None          # (factor, is a divisor)
    node: ast.expr


@attrs.frozen
class Form:
    """One array statement: kind is accumulate | product | sum | scale | swap | neg."""

    kind: str
    node: ast.stmt
    target: View | ast.expr | None      # a View, or a scalar target's expression
    op: str = "+="                      # the statement's operator for the element
    value: object = None                # accumulate: the expression; product: a Product;
                                        # sum: a Sum; scale: the factor; swap: the other View


def length(lo: ast.expr, hi: ast.expr) -> ast.expr:
    if isinstance(lo, ast.Constant) and lo.value == 0:
        return hi
    if isinstance(lo, ast.Constant) and isinstance(hi, ast.Constant):
        return ast.Constant(hi.value - lo.value)
    return ast.BinOp(hi, ast.Sub(), lo)


def _add(a: ast.expr, b: ast.expr) -> ast.expr:
    if isinstance(a, ast.Constant) and a.value == 0:
        return b
    if isinstance(b, ast.Constant) and b.value == 0:
        return a
    return ast.BinOp(a, ast.Add(), b)


def _mul(a: ast.expr, b: ast.expr) -> ast.expr:
    if isinstance(b, ast.Constant) and b.value == 1:
        return a
    return ast.BinOp(a, ast.Mult(), b)


def _attr_shape(name: str, k: int) -> ast.expr:
    return ast.Subscript(ast.Attribute(ast.Name(name, ast.Load()), "shape", ast.Load()),
                         ast.Constant(k), ast.Load())


def _dim_expr(name: str, rank: int, k: int) -> ast.expr:
    if rank == 1:
        return ast.Call(ast.Name("len", ast.Load()), [ast.Name(name, ast.Load())], [])
    return _attr_shape(name, k)


class Arrays:
    """The analysis of one array statement for a function compiler `c`."""

    def __init__(self, c):
        self.c = c

    # ------------------------------------------------------------ what is an array
    def array_var(self, name: str):
        var = self.c.lookup(name)
        return var if var is not None and var.kind == "array" and not var.complex else None

    def is_view(self, e) -> bool:
        """Is e an array-valued view: an array, a slice, a row / column, a transpose?"""
        if isinstance(e, ast.Name):
            return self.array_var(e.id) is not None
        if isinstance(e, ast.Attribute) and e.attr == "T":
            return self.is_view(e.value)
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            var = self.array_var(e.value.id)
            if var is None:
                return False
            parts = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
            return any(isinstance(p, ast.Slice) for p in parts) or \
                len(parts) < len(var.regs) - 1
        return False

    def has_array(self, e) -> bool:
        """Does the expression e have an array value somewhere (a view, @, np.dot,
        np.sum)?"""
        if self.is_view(e):
            return True
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.MatMult):
            return True
        if isinstance(e, ast.Call):
            name = self.c.callee_name(e.func)
            if name in ("dot", "sum"):
                return True
            if name in ("len", "nograd"):
                return False
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            return False
        if isinstance(e, ast.Subscript):        # A[i]: the index is a scalar
            return False
        return any(self.has_array(x) for x in ast.iter_child_nodes(e)
                   if isinstance(x, ast.expr))

    def handles(self, s) -> bool:
        """Is the statement s an array statement?"""
        if isinstance(s, ast.AugAssign):
            return self.is_view(s.target) or self.has_array(s.value)
        if isinstance(s, ast.Assign):
            return any(self.is_view(t) for t in s.targets) or any(
                isinstance(t, ast.Tuple) and any(self.is_view(x) for x in t.elts)
                for t in s.targets)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and \
                self.c.callee_name(s.value.func) == "neg" and len(s.value.args) == 1:
            return self.is_view(s.value.args[0])
        return False

    # ------------------------------------------------------------ views and lengths
    def form_of(self, e) -> tuple:
        """e's linear form for comparing lengths while compiling."""
        v = self.c.constant_or_none(e)
        if isinstance(v, int):
            return _lin({}, v)
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            a, b = self.form_of(e.left), self.form_of(e.right)
            if isinstance(e.op, ast.Sub):
                return _sub(a, b)
            return _sub(a, _sub(_lin({}, 0), b))
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            for k, x in ((self.c.constant_or_none(e.left), e.right),
                         (self.c.constant_or_none(e.right), e.left)):
                if isinstance(k, int):
                    f = self.form_of(x)
                    return _lin({s: k * v for s, v in f[0]}, k * f[1])
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return _sub(_lin({}, 0), self.form_of(e.operand))
        reg = self.c.dimension_of(e)
        if reg is not None:
            return _lin({("dim", reg): 1}, 0)
        if isinstance(e, ast.Name):
            return _lin({("var", e.id): 1}, 0)
        return _lin({("expr", ast.dump(e)): 1}, 0)

    def view(self, e) -> View:
        if isinstance(e, ast.Attribute) and e.attr == "T":
            v = self.view(e.value)
            return attrs.evolve(v, node=e, transposed=not v.transposed) if v.rank == 2 \
                else attrs.evolve(v, node=e)
        if isinstance(e, ast.Name):
            var = self.array_var(e.id)
            sub, parts = None, []
        elif isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            var = self.array_var(e.value.id)
            sub = e
            parts = list(e.slice.elts) if isinstance(e.slice, ast.Tuple) else [e.slice]
        else:
            raise self.c.error(e, f"{ast.unparse(e)} is not an array or a slice of one",
                               "the operands of @, np.dot and array statements are arrays, "
                               "slices (y[a:b], A[i, :], A[:, j]) or transposes (A.T)")
        if var is None:
            raise self.c.error(e, f"{ast.unparse(e)} is not an array here")
        rank = len(var.regs) - 1
        if len(parts) > rank:
            raise self.c.error(e, f"{var.name} has {rank} dimension(s), indexed with "
                               f"{len(parts)}")
        parts += [ast.Slice(None, None, None)] * (rank - len(parts))
        axes = []
        for k, p in enumerate(parts):
            dim_e = _dim_expr(var.name, rank, k)
            dim = Dim(dim_e, _lin({("dim", self.c.dims.get(var.regs[1 + k],
                                                             var.regs[1 + k])): 1}, 0))
            if not isinstance(p, ast.Slice):
                if self.c.typeof(p) != "int":
                    raise self.c.error(p, "array indices must be integers")
                axes.append(Axis(p, self.form_of(p), dim=dim))
                continue
            if p.step is not None and self.c.constant_or_none(p.step) != 1:
                raise self.c.error(p, "slices with a step are not supported",
                                   "take a contiguous slice y[a:b], or " + LOOP_HINT)
            lo = self.bound(p.lower, dim, ast.Constant(0))
            hi = self.bound(p.upper, dim, dim.expr)
            axes.append(Axis(lo, self.form_of(lo), hi, self.form_of(hi), dim))
        del sub
        return View(var.name, e, tuple(axes), dtype=var.dtype)

    def bound(self, e, dim: Dim, default: ast.expr) -> ast.expr:
        """A slice bound: a negative constant counts from the end, as in Python."""
        if e is None:
            return default
        if self.c.typeof(e) != "int":
            raise self.c.error(e, "slice bounds must be integers")
        v = self.c.constant_or_none(e)
        if isinstance(v, int) and v < 0:
            return ast.BinOp(dim.expr, ast.Sub(), ast.Constant(-v))
        return e

    # ------------------------------------------------------------ statements
    def statement(self, s) -> list[Form]:
        if isinstance(s, ast.Assign):
            return [self.assignment(s)]
        if isinstance(s, ast.Expr):
            target = self.view(s.value.args[0])
            return [Form("neg", s, target)]
        op = type(s.op)
        target = self.view(s.target) if self.is_view(s.target) else s.target
        if op in (ast.Mult, ast.Div):
            if not isinstance(target, View):
                raise self.c.error(s.value, "a scalar target is scaled by a scalar",
                                   "scale an array in place: x *= c")
            if self.has_array(s.value):
                raise self.c.error(s.value, "an array is scaled by a scalar in place "
                                   "(x *= c, x /= c)", "multiply elementwise into a zero "
                                   "array instead: with ancilla(t=zeros(n)): t += x * w")
            return [Form("scale", s, target, "*=" if op is ast.Mult else "/=", s.value)]
        if op not in (ast.Add, ast.Sub, ast.BitXor):
            raise self.c.error(s, f"{type(s.op).__name__} assignment is not reversible",
                               "use +=, -=, ^=, *= or /=")
        sign = -1 if op is ast.Sub else 1
        if op is ast.BitXor:
            terms = [(1, s.value)]
        else:
            terms = self.terms(s.value, sign)
        forms, rest = [], []
        for sg, t in terms:
            special = self.special(t) if op is not ast.BitXor else None
            if special is None:
                rest.append((sg, t))
                continue
            kind = "product" if isinstance(special, Product) else "sum"
            forms.append(Form(kind, s, target, "+=" if sg > 0 else "-=", special))
        if rest:
            if op is ast.BitXor:
                forms.append(Form("accumulate", s, target, "^=", s.value))
            else:
                expr = rest[0][1] if rest[0][0] > 0 else ast.UnaryOp(ast.USub(), rest[0][1])
                for sg, t in rest[1:]:
                    expr = ast.BinOp(expr, ast.Add() if sg > 0 else ast.Sub(), t)
                expr = ast.copy_location(expr, s.value)
                forms.insert(0, Form("accumulate", s, target, "+=", expr))
        for f in forms:
            self.check_overlap(f)
        return forms

    def terms(self, e, sign: int) -> list:
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            return self.terms(e.left, sign) + self.terms(
                e.right, sign if isinstance(e.op, ast.Add) else -sign)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return self.terms(e.operand, -sign)
        return [(sign, e)]

    def special(self, t) -> Product | Sum | None:
        """A product or a sum, times or divided by scalar factors, or None (an
        elementwise term)."""
        factors = self.factors(t, False)
        found = [f for f, _ in factors if self.is_product(f) or self.is_sum(f)]
        if not found:
            for n in ast.walk(t):
                if self.is_product(n) or self.is_sum(n):
                    raise self.c.error(n, f"{ast.unparse(n)} is used inside an expression",
                                       "a product or a sum is a term of its own: y += A @ x "
                                       "+ b, s += 2.0 * np.sum(x); or accumulate it into "
                                       "an ancilla first")
            return None
        if len(found) > 1:
            raise self.c.error(t, "one product or sum per term",
                               "accumulate one into an ancilla array first")
        f = found[0]
        if any(div for g, div in factors if g is f):
            raise self.c.error(f, f"{ast.unparse(f)} is a divisor",
                               "accumulate it into an ancilla first")
        coeff = []
        for g, div in factors:
            if g is f:
                continue
            if self.has_array(g):
                raise self.c.error(g, f"{ast.unparse(g)} is an array; a product or a sum "
                                   "may be scaled by scalars only",
                                   "accumulate the product into an ancilla array first")
            coeff.append((g, div))
        if self.is_sum(f):
            return self.sum_of(f, coeff or None)
        a, b = (f.left, f.right) if isinstance(f, ast.BinOp) else tuple(f.args)
        for x in (a, b):
            if not self.is_view(x):
                raise self.c.error(x, f"the operand {ast.unparse(x)} of a matrix product "
                                   "is not an array, a slice or a transpose",
                                   "accumulate it into an ancilla array first: with "
                                   "ancilla(t=zeros(n)): t += ...; y += A @ t; t -= ...")
        return Product(self.view(a), self.view(b), coeff or None, f)

    def factors(self, t, div: bool) -> list:
        """(factor, is a divisor) of a term a * b / c ..."""
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Mult):
            return self.factors(t.left, div) + self.factors(t.right, div)
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Div) and not div:
            return self.factors(t.left, div) + [(t.right, True)]
        return [(t, div)]

    def is_product(self, e) -> bool:
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.MatMult):
            return True
        return isinstance(e, ast.Call) and self.c.callee_name(e.func) == "dot"

    def is_sum(self, e) -> bool:
        return isinstance(e, ast.Call) and self.c.callee_name(e.func) == "sum"

    def sum_of(self, e, coeff) -> Sum:
        axis = None
        for k in e.keywords:
            if k.arg != "axis":
                raise self.c.error(k.value, "np.sum takes the expression and axis=k")
            axis = self.c.constant_or_none(k.value)
            if not isinstance(axis, int):
                raise self.c.error(k.value, "the axis of np.sum must be a constant")
        if len(e.args) == 2 and axis is None:
            axis = self.c.constant_or_none(e.args[1])
        if len(e.args) not in (1, 2) or (len(e.args) == 2 and not isinstance(axis, int)):
            raise self.c.error(e, "np.sum takes the expression and axis=k")
        return Sum(e.args[0], axis, coeff, e)

    def assignment(self, s) -> Form:
        t = s.targets[0]
        if (len(s.targets) == 1 and isinstance(t, ast.Tuple) and isinstance(s.value, ast.Tuple)
                and len(t.elts) == 2 and len(s.value.elts) == 2
                and ast.unparse(t.elts[0]) == ast.unparse(s.value.elts[1])
                and ast.unparse(t.elts[1]) == ast.unparse(s.value.elts[0])):
            a, b = t.elts
            if not (self.is_view(a) and self.is_view(b)):
                raise self.c.error(s, "an array is swapped with an array of the same shape")
            form = Form("swap", s, self.view(a), "=", self.view(b))
            self.check_overlap(form)
            return form
        target = next(x for x in ([t] if not isinstance(t, ast.Tuple) else t.elts)
                      if self.is_view(x))
        name = ast.unparse(target)
        raise self.c.error(s, f"{name} = ... overwrites the array, which is not reversible",
                           f"accumulate instead: {name} += ... when {name} is zero, or into "
                           "a zero ancilla array: with ancilla(t=zeros(n)): t += ...")

    # ------------------------------------------------------------ shapes
    def shape_of(self, e) -> list[Dim]:
        """The broadcast shape of an elementwise expression (its highest-rank view's)."""
        views = self.views(e)
        return max((v.shape for v in views), key=len, default=[])

    def views(self, e) -> list[View]:
        if self.is_view(e):
            return [self.view(e)]
        if isinstance(e, ast.Subscript) or (isinstance(e, ast.Call) and self.c.callee_name(
                e.func) in ("len", "nograd")) or (isinstance(e, ast.Attribute) and
                                                   e.attr == "shape"):
            return []
        return [v for x in ast.iter_child_nodes(e) if isinstance(x, ast.expr)
                for v in self.views(x)]

    def agree(self, checks: list, a: Dim, b: Dim, node, what: Callable[[], str]) -> None:
        """Lengths a and b must be equal: refused now if they differ for every size, else
        checked when running (unless they are the same for every size)."""
        diff = _sub(a.form, b.form)
        if not diff[0]:
            if diff[1] != 0:
                raise self.c.error(node, f"shape mismatch: {what()}",
                                   "numpy's broadcasting: the trailing axes must have the "
                                   "same lengths")
            return
        checks.append(ast.Compare(a.expr, [ast.Eq()], [b.expr]))

    def shape_text(self, dims: list[Dim]) -> str:
        shown = [d.text() for d in dims]
        return "(" + ", ".join(shown) + ("," if len(shown) == 1 else "") + ")"

    def broadcast(self, checks: list, e, shape: list[Dim], against: str) -> None:
        """Every view in e broadcasts to `shape`: numpy's rule, its axes are the last."""
        for v in self.views(e):
            vs = v.shape
            if len(vs) > len(shape):
                raise self.c.error(v.node, f"{v.describe()} has {len(vs)} axes, more than "
                                   f"{against} ({len(shape)})",
                                   "sum along an axis with np.sum(e, axis=k)" if not shape
                                   or len(shape) == 1 else "")
            for d, t in zip(vs, shape[len(shape) - len(vs):]):
                self.agree(checks, d, t, v.node, lambda v=v, vs=vs: (
                    f"{v.describe()} has shape {self.shape_text(vs)}, {against} has shape "
                    f"{self.shape_text(shape)}"))

    # ------------------------------------------------------------ overlap
    def check_overlap(self, f: Form) -> list:
        """A target may not overlap what its statement reads: refused here where that is
        seen, else checked when the statement runs (the checks are returned)."""
        checks: list = []
        if not isinstance(f.target, View):
            return checks
        reads = self.read_views(f)
        for v in reads:
            if v.name != f.target.name:
                continue
            test = self.disjoint(f.target, v)
            if test is True:
                continue
            if test is False or len(f.target.axes) == 2:
                what = "is swapped with" if f.kind == "swap" else "reads"
                raise self.c.error(v.node, f"{f.target.describe()} {what} "
                                   f"{v.describe()}, which overlaps it",
                                   "a whole-array update may not read its own target; "
                                   + LOOP_HINT + ", or go through a zero ancilla array")
            checks.append(test)
        return checks

    def read_views(self, f: Form) -> list[View]:
        if f.kind == "swap":
            return [f.value]
        if f.kind == "product":
            return [f.value.a, f.value.b]
        if f.kind == "sum":
            return self.views(f.value.expr)
        if f.kind in ("accumulate", "scale"):
            out = self.views(f.value)
            for n in ast.walk(f.value):     # an element (y[0]) of the target's array too
                if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and \
                        n.value.id == f.target.name and not self.is_view(n):
                    out.append(self.view(n))
            return out
        return []

    def disjoint(self, a: View, b: View):
        """True if the views share no element for any size, False if they share one for
        every size they can have, else a test (an expression) that they do not."""
        tests = []
        fixed = True
        for x, y in zip(a.axes, b.axes):
            xs = (x.lo_form, x.hi_form or _sub(x.lo_form, _lin({}, -1)))
            ys = (y.lo_form, y.hi_form or _sub(y.lo_form, _lin({}, -1)))
            for hi, lo in ((xs[1], ys[0]), (ys[1], xs[0])):
                d = _sub(hi, lo)
                if not d[0] and d[1] <= 0:
                    return True
            syms = {k[0] for form in (*xs, *ys) for k, _ in form[0]}
            fixed = fixed and syms <= {"dim"}
            tests.append(ast.BoolOp(ast.Or(), [
                ast.Compare(self.hi_expr(x), [ast.LtE()], [y.lo]),
                ast.Compare(self.hi_expr(y), [ast.LtE()], [x.lo])]))
        if fixed:
            return False
        return tests[0] if len(tests) == 1 else ast.BoolOp(ast.Or(), tests)

    @staticmethod
    def hi_expr(x: Axis) -> ast.expr:
        return x.hi if x.free else ast.BinOp(x.lo, ast.Add(), ast.Constant(1))

    def bounds_checks(self, v: View) -> list:
        """Slice bounds within the array: 0 <= lo <= hi <= len, except what is known."""
        out = []
        for a in v.axes:
            if not a.free:
                continue
            zero = _lin({}, 0)
            pairs = [(ast.Constant(0), zero, a.lo, a.lo_form),
                     (a.lo, a.lo_form, a.hi, a.hi_form),
                     (a.hi, a.hi_form, a.dim.expr, a.dim.form)]
            for lo, lf, hi, hf in pairs:
                d = _sub(hf, lf)
                if not d[0]:
                    if d[1] < 0:
                        raise self.c.error(v.node, f"the slice {v.describe()} is outside "
                                           f"{v.name} or empty the wrong way round",
                                           "slices are y[a:b] with 0 <= a <= b <= len(y)")
                    continue
                if lf == hf:
                    continue
                out.append(ast.Compare(lo, [ast.LtE()], [hi]))
        return out


# ---------------------------------------------------------------------------- emission
class Emitter:
    """Nested counted loops whose body is one element's scalar statement."""

    def __init__(self, c, an: Arrays, s):
        self.c, self.an, self.s = c, an, s
        self.used: set[str] = set()

    def counter(self, stem: str) -> str:
        k = 0
        while True:
            name = f"{stem}_{k}"
            if name not in self.used and self.c.lookup(name) is None and \
                    self.c.env(name) is None:
                self.used.add(name)
                return name
            k += 1

    def loops(self, dims: list[Dim], body: Callable[[list], ast.stmt]) -> ast.stmt:
        names = [self.counter("_i") for _ in dims]
        stmt = body([ast.Name(n, ast.Load()) for n in names])
        for n, d in reversed(list(zip(names, dims))):
            stmt = ast.For(ast.Name(n, ast.Store()),
                           ast.Call(ast.Name("range", ast.Load()), [d.expr], []),
                           [stmt], [])
        return stmt

    def elem(self, e, idx: list, rank: int):
        """e with every view replaced by its element at the last axes of idx."""
        if self.an.is_view(e):
            v = self.an.view(e)
            return v.element(idx[len(idx) - v.rank:] if v.rank else [])
        if isinstance(e, (ast.Subscript, ast.Name, ast.Constant, ast.Attribute)):
            return e
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.MatMult):
                raise self.c.error(e, "@ is a term of its own: y += A @ x")
            return ast.copy_location(ast.BinOp(self.elem(e.left, idx, rank), e.op,
                                               self.elem(e.right, idx, rank)), e)
        if isinstance(e, ast.UnaryOp):
            return ast.copy_location(ast.UnaryOp(e.op, self.elem(e.operand, idx, rank)), e)
        if isinstance(e, ast.Call):
            name = self.c.callee_name(e.func)
            if name in FUNCS or name in ("nograd", "len"):
                return ast.copy_location(ast.Call(e.func, [self.elem(a, idx, rank)
                                                           for a in e.args], e.keywords), e)
            raise self.c.error(e, f"{name}() cannot be used in an array expression",
                               "array expressions use + - * / **, exp log sin cos tanh "
                               "sqrt abs and the integer operators")
        if isinstance(e, (ast.Compare, ast.BoolOp)):
            return ast.copy_location(type(e)(**{
                f: ([self.elem(x, idx, rank) for x in getattr(e, f)]
                    if isinstance(getattr(e, f), list) and f != "ops" else
                    self.elem(getattr(e, f), idx, rank) if isinstance(getattr(e, f), ast.expr)
                    else getattr(e, f)) for f in e._fields}), e)
        return e

    @staticmethod
    def aug(target, op: str, value) -> ast.stmt:
        ops = {"+=": ast.Add, "-=": ast.Sub, "^=": ast.BitXor, "*=": ast.Mult, "/=": ast.Div}
        return ast.AugAssign(target, ops[op](), value)

    def target_elem(self, f: Form, idx: list):
        return f.target.element(idx) if isinstance(f.target, View) else f.target

    def target_shape(self, f: Form) -> list[Dim]:
        return f.target.shape if isinstance(f.target, View) else []

    def target_name(self, f: Form) -> str:
        return f.target.describe() if isinstance(f.target, View) else \
            f"the scalar target {ast.unparse(f.target)}"

    # ------------------------------------------------------------ one function per form
    def emit_accumulate(self, f: Form, checks: list) -> list:
        shape = self.target_shape(f)
        if not shape:
            raise self.c.error(f.value, f"{ast.unparse(f.value)} is an array; "
                               f"{self.target_name(f)} takes a number",
                               "sum it: s += np.sum(...), or s += x @ y")
        self.an.broadcast(checks, f.value, shape, self.target_name(f))
        return [self.loops(shape, lambda idx: self.aug(
            self.target_elem(f, idx), f.op, self.elem(f.value, idx, len(shape))))]

    def emit_product(self, f: Form, checks: list) -> list:
        p: Product = f.value
        a, b = p.a, p.b
        if a.rank == 0 or b.rank == 0:
            raise self.c.error(p.node, "@ takes arrays; scale by a scalar with *")
        inner_a, inner_b = a.shape[-1], b.shape[0]
        self.an.agree(checks, inner_a, inner_b, p.node, lambda: (
            f"{a.describe()} @ {b.describe()}: {a.describe()} has shape "
            f"{self.an.shape_text(a.shape)}, {b.describe()} has shape "
            f"{self.an.shape_text(b.shape)}"))
        out = a.shape[:-1] + b.shape[1:]
        shape = self.target_shape(f)
        if len(out) != len(shape):
            raise self.c.error(p.node, f"{ast.unparse(p.node)} has {len(out)} axes, "
                               f"{self.target_name(f)} has {len(shape)}",
                               "y += A @ x (1-D), C += A @ B (2-D), s += x @ y (a number)")
        for d, t in zip(out, shape):
            self.an.agree(checks, d, t, p.node, lambda: (
                f"{ast.unparse(p.node)} has shape {self.an.shape_text(out)}, "
                f"{self.target_name(f)} has shape {self.an.shape_text(shape)}"))
        k = self.counter("_k")
        kn = ast.Name(k, ast.Load())

        def body(idx):
            ia, ib = idx[:a.rank - 1], idx[a.rank - 1:]
            term = scaled(p.coeff, ast.BinOp(a.element(ia + [kn]), ast.Mult(),
                                             b.element([kn] + ib)))
            inner = self.aug(self.target_elem(f, idx), f.op, term)
            return ast.For(ast.Name(k, ast.Store()), ast.Call(
                ast.Name("range", ast.Load()), [inner_a.expr], []), [inner], [])
        if not shape:
            return [body([])]
        return [self.loops(shape, body)]

    def emit_sum(self, f: Form, checks: list) -> list:
        sm: Sum = f.value
        eshape = self.an.shape_of(sm.expr)
        if not eshape:
            raise self.c.error(sm.expr, "np.sum takes an array expression")
        self.an.broadcast(checks, sm.expr, eshape, ast.unparse(sm.expr))
        shape = self.target_shape(f)
        if sm.axis is None:
            out_axes = []
        else:
            ax = sm.axis + len(eshape) if sm.axis < 0 else sm.axis
            if not 0 <= ax < len(eshape):
                raise self.c.error(sm.node, f"axis {sm.axis} is out of range for "
                                   f"{ast.unparse(sm.expr)} ({len(eshape)} axes)")
            out_axes = [k for k in range(len(eshape)) if k != ax]
        out = [eshape[k] for k in out_axes]
        if len(out) != len(shape):
            raise self.c.error(sm.node, f"{ast.unparse(sm.node)} has {len(out)} axes, "
                               f"{self.target_name(f)} has {len(shape)}",
                               "s += np.sum(e) takes a number; t += np.sum(A, axis=k) a "
                               "1-D array")
        for d, t in zip(out, shape):
            self.an.agree(checks, d, t, sm.node, lambda: (
                f"{ast.unparse(sm.node)} has shape {self.an.shape_text(out)}, "
                f"{self.target_name(f)} has shape {self.an.shape_text(shape)}"))
        summed = [k for k in range(len(eshape)) if k not in out_axes]

        def body(idx):
            inner_names = [self.counter("_k") for _ in summed]
            full: list = [None] * len(eshape)
            for k, i in zip(out_axes, idx):
                full[k] = i
            for k, n in zip(summed, inner_names):
                full[k] = ast.Name(n, ast.Load())
            term = scaled(sm.coeff, self.elem(sm.expr, full, len(eshape)))
            stmt = self.aug(self.target_elem(f, idx), f.op, term)
            for k, n in reversed(list(zip(summed, inner_names))):
                stmt = ast.For(ast.Name(n, ast.Store()), ast.Call(
                    ast.Name("range", ast.Load()), [eshape[k].expr], []), [stmt], [])
            return stmt
        if not shape:
            return [body([])]
        return [self.loops(shape, body)]

    def emit_scale(self, f: Form, checks: list) -> list:
        return [self.loops(f.target.shape, lambda idx: self.aug(
            f.target.element(idx), f.op, f.value))]

    def emit_swap(self, f: Form, checks: list) -> list:
        a, b = f.target, f.value
        if a.rank != b.rank:
            raise self.c.error(f.node, f"{a.describe()} and {b.describe()} have different "
                               "shapes", "a swap exchanges arrays of the same shape")
        for x, y in zip(a.shape, b.shape):
            self.an.agree(checks, x, y, f.node, lambda: (
                f"{a.describe()} has shape {self.an.shape_text(a.shape)}, {b.describe()} "
                f"has shape {self.an.shape_text(b.shape)}"))
        if a.dtype != b.dtype:
            raise self.c.error(f.node, "swap needs two arrays of the same type")

        def body(idx):
            ea, eb = a.element(idx), b.element(idx)
            return ast.Assign([ast.Tuple([ea, eb], ast.Store())],
                              ast.Tuple([b.element(idx), a.element(idx)], ast.Load()))
        return [self.loops(a.shape, body)]

    def emit_neg(self, f: Form, checks: list) -> list:
        return [self.loops(f.target.shape, lambda idx: ast.Expr(ast.Call(
            ast.Name("neg", ast.Load()), [f.target.element(idx)], [])))]


def statement(c, s) -> None:
    """Compile the array statement s (Arrays.handles(s)) with the function compiler c."""
    an = Arrays(c)
    forms = an.statement(s)
    em = Emitter(c, an, s)
    out: list = []
    for f in forms:
        checks: list = []
        views = [f.target] if isinstance(f.target, View) else []
        views += an.read_views(f)
        seen = set()
        for v in views:
            for t in an.bounds_checks(v):
                key = ast.dump(t)
                if key not in seen:
                    seen.add(key)
                    checks.append(t)
        checks += an.check_overlap(f)
        loops = getattr(em, "emit_" + f.kind)(f, checks)
        out += [ast.Assert(t, None) for t in checks] + loops
    for st in out:
        ast.copy_location(st, s)
        _locate(st, s)
        c.line = s.lineno
        c.statement(st)


def _locate(node, s) -> None:
    """Give the generated nodes the statement's location (user nodes keep theirs)."""
    for n in ast.walk(node):
        if "lineno" in n._attributes and not hasattr(n, "lineno"):
            ast.copy_location(n, s)

