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
- the emission (`Emitter.emit_*`): each form becomes array instructions (VADD/VSUB and
  their families, VMADD/VMSUB, VMUL/VDIV, VSWAP, VNEG over strided views of the heap:
  `Instructions`), one per statement where the statement maps onto one, a few with zero
  ancilla arrays computed and uncomputed for compound expressions; where it does not
  (integer arrays, operators no instruction has, nograd of a view, a swap of 2-D views of
  one array whose address ranges may meet) nested counted `for` loops over the target's
  elements, whose body is the scalar statement of one element, compiled like any loop
  the user writes.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable

import attrs

from ..core.inverse import invert
from ..core.isa import FLOAT
from ..core.program import Imm, Mem, Reg
from ..core.program import View as ViewOperand
from .expressions import BINARY_FAMILIES, FUNC_FAMILIES, FUNCS, REDUCTIONS

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


@attrs.frozen
class Check:
    """A test made when the statement runs: its failure's message in the source's terms
    and the source text of the test's two sides (shown with their values), or ()."""

    test: ast.expr
    message: str
    operands: tuple = ()
    hint: str = ""
    shown: str = ""         # (without operands: the text whose variables' values are shown)


def _compared(lo: ast.expr, hi: ast.expr, message: str, op=ast.LtE) -> Check:
    """lo <= hi (or op), with both sides' text."""
    return Check(ast.Compare(lo, [op()], [hi]), message, (ast.unparse(lo), ast.unparse(hi)))


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
    if isinstance(a, ast.Constant) and a.value == 0:
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

    def untransposed(self, s: ast.stmt) -> ast.stmt:
        """s with each index of a transpose, A.T[...], written as the index of A it is:
        A.T[i, j] is A[j, i], A.T[i] the column A[:, i], A.T[a:b] the transpose
        A[:, a:b].T (a copy of s where there is any)."""
        def is_transpose(n) -> bool:
            return isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) \
                and n.value.attr == "T" and isinstance(n.value.value, ast.Name) \
                and (var := self.array_var(n.value.value.id)) is not None \
                and len(var.regs) == 3

        if not any(is_transpose(n) for n in ast.walk(s)):
            return s

        an = self

        class Rewrite(ast.NodeTransformer):
            def visit_Subscript(self, n):
                self.generic_visit(n)
                if not is_transpose(n):
                    return n
                parts = list(n.slice.elts) if isinstance(n.slice, ast.Tuple) else [n.slice]
                if len(parts) > 2:
                    raise an.c.error(n, f"{ast.unparse(n)} has {len(parts)} indices; "
                                     f"{ast.unparse(n.value)} has 2 axes")
                if len(parts) == 1:
                    parts.append(ast.Slice())
                index = ast.Tuple([parts[1], parts[0]], ast.Load())
                out = ast.Subscript(n.value.value, index, n.ctx)
                if all(isinstance(p, ast.Slice) for p in parts):
                    out = ast.Attribute(out, "T", n.ctx)
                for x in ast.walk(out):
                    if "lineno" in x._attributes and not hasattr(x, "lineno"):
                        ast.copy_location(x, n)
                return out
        return Rewrite().visit(copy.deepcopy(s))

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
        for n in ast.walk(s.value):
            if isinstance(n, ast.Attribute) and n.attr == "T" and not self.is_view(n.value):
                raise self.c.error(n, f"{ast.unparse(n)} transposes an expression; .T "
                                   "applies to an array or a slice",
                                   "transpose the operands instead: np.exp(A.T), A.T @ x")
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
        checks.append(_compared(a.expr, b.expr, "shape mismatch", ast.Eq))

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
        target = f.target
        element = isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
            and self.array_var(target.value.id) is not None
        if element:                 # a scalar target, an element (x[0] += np.sum(x[1:]))
            target = self.view(target)
        elif not isinstance(target, View):
            return checks
        reads = [v for v in self.read_views(f) if not element or self.is_view(v.node)]
        for v in reads:
            if v.name != target.name:
                continue
            test = self.disjoint(target, v)
            if test is True:
                continue
            # (an instruction sees address ranges, which 2-D views can share apart)
            if test is False or (len(target.axes) == 2 and not element):
                what = "is swapped with" if f.kind == "swap" else "reads"
                raise self.c.error(v.node, f"{target.describe()} {what} "
                                   f"{v.describe()}, which overlaps it",
                                   "a whole-array update may not read its own target; "
                                   + LOOP_HINT + ", or go through a zero ancilla array")
            how = "is swapped with" if f.kind == "swap" else "overlaps"
            whom = "which overlaps it" if f.kind == "swap" else "which the statement reads"
            checks.append(Check(test, f"{target.describe()} {how} {v.describe()}, {whom}",
                                (), "a whole-array update may not read its own target; "
                                f"{LOOP_HINT}, or go through a zero ancilla array",
                                f"{target.describe()}, {v.describe()}"))
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
                        isinstance(f.target, View) and n.value.id == f.target.name and \
                        not self.is_view(n):
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
    def apart_along(x: Axis, y: Axis) -> bool:
        """Do the ranges two views take along one axis never meet, for any size?"""
        xs = (x.lo_form, x.hi_form or _sub(x.lo_form, _lin({}, -1)))
        ys = (y.lo_form, y.hi_form or _sub(y.lo_form, _lin({}, -1)))
        for hi, lo in ((xs[1], ys[0]), (ys[1], xs[0])):
            d = _sub(hi, lo)
            if not d[0] and d[1] <= 0:
                return True
        return False

    @staticmethod
    def hi_expr(x: Axis) -> ast.expr:
        return x.hi if x.free else ast.BinOp(x.lo, ast.Add(), ast.Constant(1))

    def bounds_checks(self, v: View) -> list:
        """Slice bounds within the array: 0 <= lo <= hi <= len, except what is known."""
        out = []
        for k, a in enumerate(v.axes):
            which = "" if len(v.axes) == 1 else " (its rows)" if k == 0 else " (its columns)"
            if not a.free:          # an index: 0 <= i < len (the instructions see only
                zero = _lin({}, 0)  # the heap's bounds)
                said = f"the index {ast.unparse(a.lo)} of {v.describe()} is outside " \
                    f"{v.name}{which}"
                for d, test in ((_sub(a.lo_form, zero), _compared(       # as an element
                        a.lo, ast.Constant(0), said, ast.GtE)),         # access checks
                        (_sub(a.dim.form, _sub(a.lo_form, _lin({}, -1))),
                         _compared(a.lo, a.dim.expr, said, ast.Lt))):
                    if d[0] or d[1] < 0:
                        out.append(test)
                continue
            zero = _lin({}, 0)
            pairs = [(ast.Constant(0), zero, a.lo, a.lo_form, f"starts before {v.name}"),
                     (a.lo, a.lo_form, a.hi, a.hi_form, "ends before it starts"),
                     (a.hi, a.hi_form, a.dim.expr, a.dim.form, f"ends past the end of {v.name}")]
            for lo, lf, hi, hf, how in pairs:
                d = _sub(hf, lf)
                if not d[0]:
                    if d[1] < 0:
                        raise self.c.error(v.node, f"the slice {v.describe()} is outside "
                                           f"{v.name} or empty the wrong way round",
                                           "slices are y[a:b] with 0 <= a <= b <= len(y)")
                    continue
                if lf == hf or (not lf[0] and lf[1] == 0 and hf == a.dim.form):
                    continue            # (0 <= a dimension holds)
                out.append(_compared(lo, hi, f"the slice {v.describe()} {how}{which}"))
        return out


# ---------------------------------------------------------------------------- emission
class Emitter:
    """Nested counted loops whose body is one element's scalar statement."""

    def __init__(self, c, an: Arrays, s):
        self.c, self.an, self.s = c, an, s
        self.used: set[str] = set()
        self.vec = Instructions(c, an)

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
            if name in FUNCS:
                self.c.pairwise(e, any(self.an.views(a) for a in e.args))
            if name in FUNCS or name in ("nograd", "len"):
                return ast.copy_location(ast.Call(e.func, [self.elem(a, idx, rank)
                                                           for a in e.args], e.keywords), e)
            raise self.c.error(e, f"{name}() cannot be used in an array expression",
                               "array expressions use + - * / **, exp log sin cos tanh "
                               "sqrt abs atan2 fmod maximum minimum and the integer "
                               "operators")
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
            for n in ast.walk(f.value):         # (np.max(x): say what it is first)
                if isinstance(n, ast.Call) and self.c.callee_name(n.func) in \
                        (*FUNCS, *REDUCTIONS):
                    self.c.pairwise(n)
            raise self.c.error(f.value, f"{ast.unparse(f.value)} is an array; "
                               f"{self.target_name(f)} takes a number",
                               "sum it: s += np.sum(...), or s += x @ y")
        self.an.broadcast(checks, f.value, shape, self.target_name(f))
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, shape)]
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
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, out)]
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
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, eshape, out_axes)]

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
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, f.target.shape)]
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
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, a.shape)]

        def body(idx):
            ea, eb = a.element(idx), b.element(idx)
            return ast.Assign([ast.Tuple([ea, eb], ast.Store())],
                              ast.Tuple([b.element(idx), a.element(idx)], ast.Load()))
        return [self.loops(a.shape, body)]

    def emit_neg(self, f: Form, checks: list) -> list:
        if self.vec.fits(f):
            return [lambda: self.vec.form(f, f.target.shape)]
        return [self.loops(f.target.shape, lambda idx: ast.Expr(ast.Call(
            ast.Name("neg", ast.Load()), [f.target.element(idx)], [])))]


# ---------------------------------------------------------------------------- instructions
CALL_FAMILIES = {name: FUNC_FAMILIES.get(name, name) for name in FUNCS}
OP_FAMILIES = {ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}


@attrs.frozen
class Part:
    """An operand of an array instruction before its registers are known: a view (base
    register; offset and two strides, each an expression, a register, an immediate or an
    int) or a scalar expression."""

    base: Reg | None = None
    off: object = 0
    s0: object = 0
    s1: object = 0
    scalar: ast.expr | None = None


class Instructions:
    """The forms as array instructions over views of the heap (docs/isa.md, Arrays).

    A statement's shape is the instruction's m x n (a 1-D shape is 1 x n, a number 1 x 1);
    each view's strides follow numpy's broadcasting (its axes are the shape's last ones, a
    missing axis has stride 0), and a target that sums has stride 0 along what it sums.
    A compound operand (`a * np.exp(x)`: exp(x)) is computed into a zero ancilla array of
    the shape, used, and uncomputed; a scalar target is exchanged into a one-cell ancilla
    array, accumulated there and exchanged back."""

    def __init__(self, c, an: Arrays):
        self.c, self.an = c, an
        self.temps: dict[str, Part] = {}
        self.cell: Part | None = None       # a scalar target's cell, while it is there

    # ------------------------------------------------------------ which forms
    def fits(self, f: Form) -> bool:
        """Does the form map onto array instructions (else it becomes loops)?"""
        views = ([f.target] if isinstance(f.target, View) else []) + self.an.read_views(f)
        if any(v.dtype != FLOAT for v in views):
            return False            # the instructions work on the heap's float cells
        if not isinstance(f.target, View) and self.c.typeof(f.target) != "float":
            return False
        if f.kind == "accumulate":
            return f.op in ("+=", "-=") and self.elementwise(f.value)
        if f.kind == "sum":
            return self.elementwise(f.value.expr)
        if f.kind == "swap":
            return self.range_apart(f.target, f.value)
        if f.kind == "product" and isinstance(f.target, View):
            # a scaled product into an array stays a loop: as an instruction it needs an
            # ancilla array, and rvm.adjoint refuses programs that allocate
            return not f.value.coeff and all(self.range_apart(f.target, v)
                                             for v in (f.value.a, f.value.b))
        return True

    def elementwise(self, e) -> bool:
        """Is e made of views and scalars with + - * / ** and the function families?"""
        if any(isinstance(n, ast.Call) and self.c.callee_name(n.func) == "nograd" and
               any(self.an.is_view(a) for a in n.args) for n in ast.walk(e)):
            return False            # nograd(x) of a view: element by element
        if self.an.is_view(e) or not self.an.views(e):
            return True             # a view, or a scalar (compiled as scalars are)
        if isinstance(e, ast.BinOp) and type(e.op) in (ast.Add, ast.Sub, *OP_FAMILIES):
            return self.elementwise(e.left) and self.elementwise(e.right)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return self.elementwise(e.operand)
        if isinstance(e, ast.Call) and not e.keywords:
            name = self.c.callee_name(e.func)
            if name in CALL_FAMILIES:
                self.c.pairwise(e, any(self.an.views(a) for a in e.args))
            arity = 2 if CALL_FAMILIES.get(name) in BINARY_FAMILIES else 1
            return name in CALL_FAMILIES and len(e.args) == arity and \
                all(self.elementwise(a) for a in e.args)
        return False

    def range_apart(self, a: View, b: View | None) -> bool:
        """May one instruction write a and read b? It checks their address ranges (lowest
        to highest cell) apart; the analysis has made sure views of one array share no
        element, and for 2-D views that keeps their ranges apart when their rows are
        apart, or both lie in single rows, or both are single columns (which the
        instruction sees on lattices that never meet)."""
        if b is None or a.name != b.name or len(a.axes) == 1:
            return True
        if (not a.axes[0].free and not b.axes[0].free) or \
                (not a.axes[1].free and not b.axes[1].free):
            return True
        return self.an.apart_along(a.axes[0], b.axes[0])

    # ------------------------------------------------------------ one form
    def form(self, f: Form, shape: list[Dim], out_axes: list | None = None) -> None:
        """Emit the form f over `shape` (a sum: its expression's shape, and the axes
        the target keeps)."""
        sign = -1 if f.op == "-=" else 1
        if isinstance(f.target, View):
            return self.body(f, shape, out_axes, sign, f.target, None)
        if self.cell is not None:
            return self.body(f, shape, out_axes, sign, None, self.cell)
        self.through_cell(f.node, f.target, lambda: self.body(f, shape, out_axes, sign, None,
                                                              self.cell))

    def through_cell(self, s, target, body: Callable[[], None]) -> None:
        """A scalar target: exchanged into a one-cell ancilla array (self.cell) for
        body's instructions to accumulate into, exchanged back; the cell is zero again and
        freed."""
        value = s.value.args[0] if isinstance(s, ast.Expr) else s.value
        self.c.no_index_alias([target], "update")
        self.c.no_self_reference(target, value, s, self.an.is_view)

        def action(r: Reg):
            base = self.c.base_reg()
            self.c.emit("ALLOC", base, Imm(1))
            self.c.emit("EXCH", r, Mem(base, 0))
            self.cell = Part(base, 0, 0, 0)
            body()
            self.cell = None
            self.c.emit("EXCH", r, Mem(base, 0))
            self.c.emit("FREE", base, Imm(1))
            self.c.release(base)
        self.c.into(target, action, s)

    def body(self, f: Form, shape: list[Dim], out_axes, sign: int, yv: View | None,
             cell: Part | None) -> None:
        if f.kind == "product":
            return self.product(f, yv, cell, sign)
        dims = [d.expr for d in shape]
        counts = [ast.Constant(1)] * (2 - len(dims)) + dims
        self.c.with_operands(counts, lambda mn: self.shaped(f, tuple(mn), out_axes, sign,
                                                            yv, cell))

    def shaped(self, f: Form, mn: tuple, out_axes, sign: int, yv, cell) -> None:
        if f.kind == "accumulate":
            return self.accumulate(self.fitted(yv), sign, f.value, yv, mn)
        if f.kind == "sum":
            sm: Sum = f.value
            y = cell
            if yv is not None:          # stride 0 along the summed axes
                full: list = [0] * len(self.an.shape_of(sm.expr))
                for k, st in zip(out_axes, yv.layout()[3]):
                    full[k] = st
                y = self.part(yv, [0] * (2 - len(full)) + full)
            return self.accumulate(y, sign, self.located(scaled(sm.coeff, sm.expr), sm.node),
                                   yv, mn)
        if f.kind == "scale":
            return self.emit("VMUL" if f.op == "*=" else "VDIV",
                             [self.fitted(yv), self.scalar(f.value)], mn)
        if f.kind == "swap":
            return self.emit("VSWAP", [self.fitted(yv), self.fitted(f.value)], mn)
        return self.emit("VNEG", [self.fitted(yv)], mn)

    def product(self, f: Form, yv: View | None, cell: Part | None, sign: int) -> None:
        """y (+|-)= a @ b as VMADD / VMSUB over m x k x n (a 1-D operand is a row of a,
        or a column of b); scaled by scalars, through a zero ancilla array."""
        p: Product = f.value
        a, b = p.a, p.b
        sa, sb = a.layout()[3], b.layout()[3]
        pa = self.part(a, sa if a.rank == 2 else [0, sa[0]])
        pb = self.part(b, sb if b.rank == 2 else [sb[0], 0])
        if yv is None:
            y = cell
        else:
            sy = yv.layout()[3]
            y = self.part(yv, sy if yv.rank == 2 else [sy[0], 0] if a.rank == 2 else
                          [0, sy[0]])
        one = ast.Constant(1)
        counts = [a.shape[0].expr if a.rank == 2 else one, a.shape[-1].expr,
                  b.shape[1].expr if b.rank == 2 else one]

        def go(mkn):
            m, k, n = mkn
            if not p.coeff:
                return self.emit("VMADD" if sign > 0 else "VMSUB", [y, pa, pb], (m, k, n))

            def scaled_into(t: Part):
                code, _ = self.c.capture(lambda: self.emit("VMADD", [t, pa, pb], (m, k, n)))
                self.c.code += code
                name = f"_rvm_product_{len(self.temps)}"
                self.temps[name] = t
                term = self.located(scaled(p.coeff, ast.Name(name, ast.Load())), p.node)
                self.accumulate(y, sign, term, yv, (m, n))
                del self.temps[name]
                self.c.code += invert(code, self.c.fresh)
            self.with_temp((m, n), scaled_into)
        self.c.with_operands(counts, go)

    # ------------------------------------------------------------ elementwise
    def accumulate(self, y: Part, sign: int, e, yv: View | None, mn: tuple) -> None:
        """y (+|-)= e element by element over the shape mn: one instruction per term
        (a term f(a, b) of views and scalars), compound operands through ancillas."""
        for sg, t in self.an.terms(e, sign):
            fam, args = self.family(t)
            head = ("VADD" if sg > 0 else "VSUB") + ("." + fam if fam else "")
            self.parts(args, lambda ps, head=head: self.emit(head, [y, *ps], mn), yv, mn)

    def family(self, t) -> tuple[str, list]:
        if self.leaf(t):
            return "", [t]
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Pow) and \
                isinstance(t.right, ast.Constant) and t.right.value == 2 and \
                type(t.right.value) in (int, float):
            return "mul", [t.left, t.left]      # a square, as numpy's `** 2`: a * a
        if isinstance(t, ast.BinOp):
            return OP_FAMILIES[type(t.op)], [t.left, t.right]
        return CALL_FAMILIES[self.c.callee_name(t.func)], list(t.args)

    def leaf(self, e) -> bool:
        return self.placeholder(e) or self.an.is_view(e) or not self.arrayish(e)

    def placeholder(self, e) -> bool:
        return isinstance(e, ast.Name) and e.id in self.temps

    def arrayish(self, e) -> bool:
        return bool(self.an.views(e)) or any(self.placeholder(n) for n in ast.walk(e))

    def parts(self, args: list, use: Callable, yv: View | None, mn: tuple,
              done: tuple = ()) -> None:
        """The operands for args (views as they are, scalars; anything else computed into
        a zero ancilla array first and uncomputed after use)."""
        if len(done) == len(args):
            return use(list(done))
        a = args[len(done)]
        twice = next((p for b, p in zip(args, done) if b is a), None)
        if twice is not None:       # (a square's operand: made once)
            part = twice
        elif self.placeholder(a):
            part = self.temps[a.id]
        elif self.an.is_view(a) and (yv is None or self.range_apart(yv, self.an.view(a))):
            part = self.fitted(self.an.view(a))
        elif not self.arrayish(a):
            part = self.scalar(a)
        else:
            return self.computed(a, mn, lambda t: self.parts(args, use, yv, mn, done + (t,)))
        return self.parts(args, use, yv, mn, done + (part,))

    def computed(self, e, mn: tuple, use: Callable[[Part], None]) -> None:
        """e computed into a zero ancilla array for use(part), then uncomputed; the
        ancillas of e's own operands stay until then, so nothing is computed twice."""
        def inside(t: Part):
            terms = self.an.terms(e, 1)

            def step(k: int):
                if k == len(terms):
                    return use(t)
                sg, term = terms[k]
                fam, args = self.family(term)
                head = ("VADD" if sg > 0 else "VSUB") + ("." + fam if fam else "")

                def with_parts(ps):
                    code, _ = self.c.capture(lambda: self.emit(head, [t, *ps], mn))
                    self.c.code += code
                    step(k + 1)
                    self.c.code += invert(code, self.c.fresh)
                self.parts(args, with_parts, None, mn)
            step(0)
        self.with_temp(mn, inside)

    # ------------------------------------------------------------ operands
    def part(self, v: View, strides: list) -> Part:
        """v's cells with the two strides given (expressions or ints)."""
        return Part(self.c.lookup(v.name).regs[0], v.layout()[1], *strides)

    def fitted(self, v: View) -> Part:
        """v broadcast to the shape: its axes are the last ones, a missing one stride 0."""
        st = v.layout()[3]
        return self.part(v, [0] * (2 - len(st)) + st)

    def scalar(self, e) -> Part:
        v = self.c.constant_or_none(e)
        if isinstance(v, int) and not isinstance(v, bool):
            e = ast.copy_location(ast.Constant(float(v)), e)
        return Part(scalar=e)

    def located(self, e, node):
        _locate(e, node)
        return e

    def with_temp(self, mn: tuple, use: Callable[[Part], None]) -> None:
        """A zero ancilla array of m x n cells (row-major) for use(part), then freed (it
        is zero again: use uncomputes what it put there)."""
        m, n = mn
        base = self.c.base_reg()

        def size():
            if isinstance(m, Imm) and isinstance(n, Imm):
                return Imm(m.value * n.value)
            if m == Imm(1) or n == Imm(1):
                return n if m == Imm(1) else m
            return self.c.size([m, n])
        code, cells = self.c.capture(size)
        self.c.code += code
        self.c.emit("ALLOC", base, cells)
        self.c.code += invert(code, self.c.fresh)
        use(Part(base, 0, n, 1))
        self.c.code += code
        self.c.emit("FREE", base, cells)
        self.c.code += invert(code, self.c.fresh)
        if code:
            self.c.release(cells)
        self.c.release(base)

    def emit(self, op: str, parts: list, counts: tuple) -> None:
        """One instruction: the views' offsets and strides, and the scalars, computed into
        registers (and uncomputed after) where they are expressions."""
        ints = [x for p in parts if p.scalar is None for x in (p.off, p.s0, p.s1)
                if isinstance(x, ast.expr)]
        scalars = [p.scalar for p in parts if p.scalar is not None]

        def with_ints(iops):
            got = dict(zip(map(id, ints), iops))

            def val(x):
                x = got[id(x)] if isinstance(x, ast.expr) else x
                return x.value if isinstance(x, Imm) else x

            def with_scalars(sops):
                it = iter(sops)
                args = [next(it) if p.scalar is not None else
                        ViewOperand(p.base, val(p.off), val(p.s0), val(p.s1)) for p in parts]
                self.c.emit(op, *args, *counts)
            self.c.with_operands(scalars, with_scalars, FLOAT)
        self.c.with_operands(ints, with_ints)


def statement(c, s) -> None:
    """Compile the array statement s (Arrays.handles(s)) with the function compiler c,
    its integer operands computed once each (see Lowering.sharing)."""
    c.sharing(s, lambda: _statement(c, s))


def _statement(c, s) -> None:
    an = Arrays(c)
    forms = an.statement(s)
    em = Emitter(c, an, s)
    checks: list = []
    emitted: list = []
    for f in forms:
        views = [f.target] if isinstance(f.target, View) else []
        views += an.read_views(f)
        for v in views:
            checks += an.bounds_checks(v)
        checks += an.check_overlap(f)
        emitted += getattr(em, "emit_" + f.kind)(f, checks)
    seen: set = set()               # every check once, before the statement changes anything
    checks = [t for t in checks if not (ast.dump(t.test) in seen or seen.add(ast.dump(t.test)))]
    if len(emitted) > 1 and all(map(callable, emitted)) and \
            not isinstance(forms[0].target, View):
        # the terms of a scalar target's statement, all instructions: into one cell
        parts = emitted
        emitted = [lambda: em.vec.through_cell(s, forms[0].target,
                                               lambda: [st() for st in parts])]
    def check() -> None:
        c.line = s.lineno
        for t in checks:
            test = ast.copy_location(t.test, s)
            _locate(test, s)
            c.stmt_Assert(ast.copy_location(ast.Assert(test, None), s),
                          (t.message, t.operands, t.hint, t.shown))
    # the checks before the statement in both directions: after it too, where a run
    # backwards meets them first (an array instruction checks only the heap's bounds:
    # run backwards, a slice past its array's end would change the next array's cells
    # before a check after it failed)
    check()
    for st in emitted:
        c.line = s.lineno
        if callable(st):            # array instructions, emitted straight into the code
            st()
            continue
        ast.copy_location(st, s)
        _locate(st, s)
        c.statement(st)
    if checks:
        check()


def _locate(node, s) -> None:
    """Give the generated nodes the statement's location (user nodes keep theirs)."""
    for n in ast.walk(node):
        if "lineno" in n._attributes and not hasattr(n, "lineno"):
            ast.copy_location(n, s)

