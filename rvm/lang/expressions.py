"""The expression half of the frontend compiler: registers and temporaries, expressions,
conditions, array addresses, names, constants and types. `FunctionCompiler` (statements)
builds on it."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from typing import Any

import attrs

from ..core import isa
from ..core.errors import CompileError
from ..core.inverse import Code, invert
from ..core.program import Imm, Instruction, Label, Mem, Reg, Symbol

INT, FLOAT = isa.INT, isa.FLOAT
MAX_INT_POWER = 64     # (x ** k is a balanced tree of products, each operand through a
                       # temporary made and taken back: about k^2 instructions)
BINOPS = {ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "div", ast.Mod: "mod", ast.Pow: "pow"}
FUNCS = {"exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "atan2", "arctan2", "fmod", "max",
         "min", "maximum", "minimum"}
# the families of the functions whose names differ from theirs (numpy's names)
FUNC_FAMILIES = {"fmod": "mod", "arctan2": "atan2", "maximum": "max", "minimum": "min"}
BINARY_FAMILIES = ("atan2", "mod", "max", "min")     # (the others take one argument)
REDUCTIONS = ("max", "min", "amax", "amin")     # (numpy's np.max ...: refused, see pairwise)
BITOPS = {ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<",
          ast.RShift: ">>"}
# an update or swap may not read what it changes, in its index or its expression
ALIAS_HINT = ("undoing the statement needs its index and expression unchanged; read them "
              "from other variables, or go through a temporary")
COMPARE = {ast.Eq: "EQ", ast.NotEq: "NE", ast.Lt: "LT", ast.LtE: "LE", ast.Gt: "GT",
           ast.GtE: "GE"}


@attrs.frozen
class Source:
    """Where a function's text came from, to locate errors."""

    file: str
    lines: list
    first: int = 1          # file line of the parsed text's line 1
    indent: int = 0         # columns removed by dedenting

    def error(self, node, message: str, hint: str = "") -> CompileError:
        line = getattr(node, "lineno", 1) + self.first - 1
        col = getattr(node, "col_offset", 0) + self.indent + 1
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return CompileError(message, self.file, line, col, text.rstrip("\n"), hint)


@attrs.define
class Var:
    name: str
    kind: str                   # "int" | "float" | "complex" | "array"
    regs: tuple                 # scalar: (reg,); complex: (re, im); array: (base, n) or
                                # (base, rows, cols)
    dtype: str = ""             # arrays: INT or FLOAT
    complex: bool = False       # a complex array: n x 2 floats (see complexes.py)

    @property
    def reg(self) -> Reg:
        return self.regs[0]

    @property
    def cls(self) -> str:
        return INT if self.kind == "int" else self.dtype if self.kind == "array" else FLOAT

    @property
    def sig(self) -> tuple:
        if self.kind != "array":
            return (self.kind,)
        return ("array", "c", 1) if self.complex else ("array", self.dtype, len(self.regs) - 1)


class Lowering:
    """Registers, temporaries and expressions of one function being compiled."""


    def __init__(self, session, node: ast.FunctionDef, source: Source, env, name: str,
                 sig: tuple):
        self.session, self.node, self.src, self.env, self.name = session, node, source, env, name
        self.sig = sig
        self.function_args: dict = {}     # parameter name -> the function passed
        self.regions: list = []           # (block, "compute" | "uncompute", start, end)
        self.outputs: list = []           # (line, parts) per output statement
        self.checks: list = []            # Function.checks
        self.code: Code = []
        self.scopes: list[dict[str, Var]] = [{}]
        self.count = {INT: 0, FLOAT: 0}
        self.free: dict[str, list[int]] = {INT: [], FLOAT: []}
        self.bases: set[Reg] = set()        # heap blocks' bases (see base_reg)
        self.free_bases: list[Reg] = []
        self.labels = 0
        self.routines: dict[str, Code] = {}
        self.in_range: dict[Reg, Reg] = {}  # loop counter -> an array dimension it stays below
        # register -> the array dimension register it equals while both live: dimensions
        # of ancilla arrays made from len(A) / A.shape[k], and int ancillas holding one
        # that nothing changes (so loops over them and indices into them need no checks)
        self.dims: dict[Reg, Reg] = {}
        # the temporaries of A[i, j] addresses (computed indices, the cell's offset) not
        # yet taken back to zero (see addresses_done)
        self.address_temps: list[Reg] = []
        self.symbols: list[Symbol] = []
        self.line = node.lineno
        # while an array statement is compiled: its integer operands computed once each
        # (expression -> register; see sharing), the code computing them, the variables
        # they may read; registers that held them, zero again, for the next statement's
        self.shared: dict[str, Reg] | None = None
        self.shared_code: Code = []
        self.shared_vars: dict[str, Var] = {}
        self.shared_pool: list[Reg] = []

    # ------------------------------------------------------------------ basics
    def error(self, node, message: str, hint: str = "") -> CompileError:
        return self.src.error(node, message, hint)

    def fresh(self, stem: str = "L") -> str:
        self.labels += 1
        return f"{stem.split('_')[0]}_{self.labels}"

    def emit(self, op: str, *args, label: str | None = None) -> None:
        if label is None and self.no_op(op, args):
            return
        self.code.append((label, Instruction(op, tuple(args), self.lineno)))

    @staticmethod
    def no_op(op: str, args: tuple) -> bool:
        """Adding zero, and a check of two constants that holds: nothing to run (array
        accesses and loops produce them: A[i, 0], range(0, n))."""
        imms = [a.value for a in args if isinstance(a, Imm)]
        if op in ("ADD", "SUB", "XOR") and len(args) == 2 and imms == [0] and \
                isinstance(args[1], Imm) and not isinstance(args[1].value, bool):
            return True
        if op.startswith("ASSERT.") and len(imms) == 2:
            a, b = imms
            return {"EQ": a == b, "NE": a != b, "LT": a < b, "LE": a <= b, "GT": a > b,
                    "GE": a >= b}[op.split(".")[1]]
        return False

    @property
    def lineno(self) -> int:
        return self.line + self.src.first - 1

    def reg(self, cls: str) -> Reg:
        return Reg(cls, self.free[cls].pop()) if self.free[cls] else self.new_reg(cls)

    def new_reg(self, cls: str) -> Reg:
        """A register the function has not used yet."""
        self.count[cls] += 1
        return Reg(cls, self.count[cls] - 1)

    def base_reg(self) -> Reg:
        """A register for a heap block's base. Such registers are written by ALLOC and
        FREE only, never lent out as temporaries, so that native code sees the block as the
        function's own (rvm.engines.compiled._own_blocks: what lets a compute-copy-uncompute
        function's gradient start from the copy)."""
        if self.free_bases:
            return self.free_bases.pop()
        r = self.new_reg(INT)
        self.bases.add(r)
        return r

    def release(self, *regs: Reg) -> None:
        for r in regs:
            if r in self.bases:
                self.free_bases.append(r)
            else:
                self.free[r.cls].append(r.n)

    def addresses_done(self, mark: int) -> None:
        """Release the address temporaries made since `mark` (a length of
        address_temps), once the code that made them has been undone: then each is zero
        again, so the next statement's addresses reuse the same registers (in the same
        order: the same element's address is the same computation each time, which the
        native back end then sees as one address)."""
        temps = self.address_temps[mark:]
        del self.address_temps[mark:]
        self.release(*reversed(temps))

    def capture(self, fn: Callable[[], Any]) -> tuple[Code, Any]:
        """Run fn, returning the code it emitted (removed from the stream) and its result."""
        saved, self.code = self.code, []
        try:
            result = fn()
            return self.code, result
        finally:
            self.code = saved

    def lookup(self, name: str) -> Var | None:
        for scope in reversed(self.scopes):
            if name in scope:
                return scope[name]
        return None

    def declare(self, node, name: str, var: Var) -> None:
        if self.lookup(name) is not None:
            raise self.error(node, f"{name!r} is already a variable here",
                             "choose another name for the ancilla")
        for v in self.entries(var).values():
            self.scopes[-1][v.name] = v
            self.record(v, self.node)

    @staticmethod
    def entries(var: Var) -> dict[str, Var]:
        """A variable's scope entries: itself, and a complex scalar's two parts."""
        if var.kind != "complex":
            return {var.name: var}
        return {var.name: var, **{f"{var.name}.{p}": Var(f"{var.name}.{p}", "float", (r,))
                                  for p, r in zip(("real", "imag"), var.regs)}}

    def record(self, var: Var, scope_node) -> None:
        """Debug info: var's registers, in scope over scope_node's lines (a complex
        scalar is shown as its two parts)."""
        if var.kind == "complex":
            return
        first = scope_node.lineno + self.src.first - 1
        last = getattr(scope_node, "end_lineno", scope_node.lineno) + self.src.first - 1
        self.symbols.append(Symbol(var.name, var.regs, first, last, var.dtype))

    def address(self, sub) -> tuple[Var, Mem]:
        """Bounds-checked memory operand for A[i] or A[i, j] (may emit address code)."""
        if not isinstance(sub.value, ast.Name):
            raise self.error(sub, "index an array variable directly: A[i] or A[i, j]")
        var = self.variable(sub.value)
        if var.kind != "array":
            raise self.error(sub, f"{var.name} is not an array")
        idx = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
        if len(idx) != len(var.regs) - 1:
            raise self.error(sub, f"{var.name} has {len(var.regs) - 1} dimension(s), "
                             f"indexed with {len(idx)}")
        ops = []
        for e, dim in zip(idx, var.regs[1:]):
            if isinstance(e, ast.Slice) or self.typeof(e) != "int":
                raise self.error(e, "array indices must be integers (no slices)")
            op = self.operand(e, INT)
            if isinstance(op, Reg) and self.is_temp(e):     # a computed index
                self.address_temps.append(op)
            # (a loop over range(len(A)), or over a dimension equal to A's, needs none)
            bound = self.in_range.get(op)
            if bound is None or bound not in (dim, self.dims.get(dim)):
                self.emit("ASSERT.GE", op, Imm(0))
                self.emit("ASSERT.LT", op, dim)
            ops.append(op)
        if len(ops) == 1:
            off = ops[0]
            return var, Mem(var.regs[0], off.value if isinstance(off, Imm) else off)
        t = self.reg(INT)
        self.address_temps.append(t)
        self.emit("ADD.mul", t, ops[0], var.regs[2])
        self.emit("ADD", t, ops[1])
        return var, Mem(var.regs[0], t)

    # ------------------------------------------------------------------ expressions
    def accumulate(self, target: Reg, sign: int, e, node) -> None:
        """target += e (sign 1) or target -= e (sign -1)."""
        kind = self.typeof(e)
        if target.cls == INT and kind == "float":
            for n in ast.walk(e):       # (an int power of an exponent that is not a
                self.int_power(n, refuse=True)      # constant: refused, saying so)
            raise self.error(e, "an integer target cannot absorb a float expression",
                             "use a float variable, or // for integer division")
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            self.accumulate(target, sign, e.left, node)
            self.accumulate(target, sign * (1 if isinstance(e.op, ast.Add) else -1), e.right,
                            node)
            return
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            return self.accumulate(target, -sign if isinstance(e.op, ast.USub) else sign,
                                   e.operand, node)
        family, args = self.operation(e, target.cls)
        element, read = self.read_of(args[0]) if not family else (None, "M")
        if not family and self.element_of(element, target.cls):    # += A[i]: in place
            mark = len(self.address_temps)
            code, (var, mem) = self.capture(lambda: self.address(element))
            self.code += code
            if target not in mem.regs:
                self.emit(("ADD" if sign > 0 else "SUB") + read, target, mem)
            else:               # the target is in the address: through a temporary
                x = self.reg(var.dtype)
                self.emit("ADD" + read, x, mem)
                self.emit("ADD" if sign > 0 else "SUB", target, x)
                self.emit("SUB" + read, x, mem)
                self.release(x)
            self.code += invert(code, self.fresh)
            self.addresses_done(mark)
            return
        head = "ADD" if sign > 0 else "SUB"
        self.with_operands(args, lambda ops: self.emit(
            head + ("." + family if family else ""), target, *ops),
            cls=target.cls if family in ("", "abs") else None)

    def int_power(self, e, refuse: bool = False):
        """`x ** k` of an int x and a constant k from 0 to MAX_INT_POWER as what Python's
        int power is, a product (x * x * ..., 1 for k = 0; in int64, wrapping as `*`
        does), or None: x or k a float, k a negative constant (a float in Python), or
        (refused if `refuse`: into an integer) any other int exponent (a float power
        into a float)."""
        if not (isinstance(e, ast.BinOp) and isinstance(e.op, ast.Pow)):
            return None
        kinds = self.typeof(e.left), self.typeof(e.right)
        k = self.constant_or_none(e.right)
        if kinds != ("int", "int") or (k is not None and k < 0):
            return None
        if k is None or k > MAX_INT_POWER:
            if not refuse:
                return None
            raise self.error(e, f"an integer ** needs a constant exponent from 0 to "
                             f"{MAX_INT_POWER}", "write the product as a loop, or use floats")
        def power(j):       # a balanced tree of products (int64 products associate)
            if j == 1:
                return e.left
            return ast.copy_location(ast.BinOp(power(j // 2), ast.Mult(), power(j - j // 2)),
                                     e)
        return ast.copy_location(ast.Constant(1), e) if k == 0 else power(k)

    def read_of(self, e) -> tuple:
        """(the element, "K") for `nograd(A[i])`, an element read as a constant (no gradient
        flows back into A; ADDK/SUBK), else (e, "M")."""
        if not (isinstance(e, ast.Call) and self.callee_name(e.func) == "nograd"):
            return e, "M"
        if len(e.args) != 1 or e.keywords or not self.element_of(e.args[0], FLOAT):
            raise self.error(e, "nograd takes one element of a float array, e.g. nograd(x[i])",
                             "it reads the element as a constant: no gradient flows into x")
        return e.args[0], "K"

    def element_of(self, e, cls: str) -> bool:
        """Is e an element of a real array of class cls (readable straight into cls)?"""
        if not (isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name)):
            return False
        var = self.lookup(e.value.id)
        return var is not None and var.kind == "array" and var.dtype == cls and \
            not var.complex

    def operation(self, e, cls: str) -> tuple[str, list]:
        """(family, argument expressions) of an expression's outermost operation."""
        if isinstance(e, ast.BinOp) and type(e.op) in BINOPS:
            family = BINOPS[type(e.op)]
            kinds = {self.typeof(e.left), self.typeof(e.right)}
            if isinstance(e.op, ast.FloorDiv) and (cls == FLOAT or "float" in kinds):
                raise self.error(e, "// is integer division; use / for floats")
            if isinstance(e.op, ast.Mod) and (cls == FLOAT or "float" in kinds):
                raise self.error(e, "% on floats is not supported (Python's % and fmod "
                                 "differ for negatives)", "use fmod(a, b)")
            if isinstance(e.op, ast.Div) and cls == INT:
                raise self.error(e, "/ gives a float", "use // for integer division")
            if family == "pow" and cls == INT:
                product = self.int_power(e, refuse=True)
                if product is None:
                    raise self.error(e, "** of a float gives a float; the target is an "
                                     "integer", "use a float target")
                return self.operation(product, cls)
            return family, [e.left, e.right]
        if isinstance(e, ast.Call):
            name = self.callee_name(e.func)
            if name in FUNCS:
                self.pairwise(e)
                family = FUNC_FAMILIES.get(name, name)
                arity = 2 if family in BINARY_FAMILIES else 1
                if len(e.args) != arity or e.keywords:
                    raise self.error(e, f"{name} takes {arity} argument(s)")
                if cls == INT and family not in ("abs", "max", "min"):
                    raise self.error(e, f"{name} gives a float; the target is an integer")
                return family, list(e.args)
            if name in ("len", "nograd"):
                return "", [e]
            self.pairwise(e)        # (np.amax: numpy's reduction)
            raise self.error(e, f"{name}() cannot be used in an expression",
                             "expressions may use + - * / // % **, exp log sin cos tanh "
                             "sqrt abs atan2 fmod max min, len(A); call reversible functions as "
                             "statements")
        return "", [e]

    def pairwise(self, e: ast.Call, arrays: bool = False) -> None:
        """max(a, b) and min(a, b) are Python's, of two numbers; np.maximum(x, y) and
        np.minimum(x, y) numpy's, element by element: numpy's np.max and np.min (the
        largest element) are neither, and Python's max of arrays is an error in Python."""
        f, name = e.func, self.callee_name(e.func)
        if name in REDUCTIONS and (name in ("amax", "amin") or not isinstance(f, ast.Name)):
            name = name.removeprefix("a")
            what = "numpy's reduction (the largest element)" if name == "max" else \
                "numpy's reduction (the smallest element)"
            if not (isinstance(f, ast.Attribute) and ast.unparse(f.value) in ("np", "numpy")):
                what = "not a function of two numbers"
            raise self.error(e, f"{ast.unparse(f)} is {what}; not supported",
                             f"{name}(a, b) and np.{name}imum(x, y) compare two values; "
                             f"for the {name}imum of an array, keep running {name}ima "
                             f"(y[k] += np.{name}imum(y[k - 1], x[k]))")
        if name in ("max", "min") and arrays:
            raise self.error(e, f"{name}() of arrays is an error in Python",
                             f"np.{name}imum(x, y), element by element")

    def with_operands(self, args: list, use: Callable[[list], None],
                      cls: str | None = None) -> None:
        """Operands for args (temporaries where needed), use them, uncompute the temps.
        An array element is read in place: ADDM into a zeroed register, SUBM after the use
        (the cell keeps its value, so an element may be read any number of times)."""
        start, mark = len(self.code), len(self.address_temps)
        starts, ops = [], []
        for a in args:
            starts.append(len(self.code) - start)
            ops.append(self.operand(a, cls))
        compute = self.code[start:]
        # every float temporary is cleared just before its compute (ZERO: within the
        # tolerance, then exactly 0.0, its shadow too): a gradient pass, which runs the
        # statements backwards, meets it last, where its adjoint clears the temporary's
        # shadow, which the code before would otherwise take on (a small term added to
        # the stale shadow and taken back out lost its bits; an operand before it that
        # used the register for its own temporary pulled the shadow out and back in, with
        # the rounding of both). One summed from several terms is cleared just after its
        # uncompute too: taken apart again it may keep a rounding residue (1 + a + b -
        # b - a - 1 need not be 0) that would pass into the register's next use (the
        # uncompute of an operand before it may use the register for its own temporary),
        # where a small value beside it or a small divisor makes it large, whichever way
        # the program runs
        temps = [op for op, a in zip(ops, args) if isinstance(op, Reg) and
                 self.is_temp(a) and op.cls == isa.FLOAT]
        parts = [compute[at:end] for at, end in zip(starts, starts[1:] + [len(compute)])]
        summed = [op for op, part in zip(ops, parts)
                  if op in temps and sum(ins.args[:1] == (op,) for _, ins in part) > 1]
        for at, op in reversed([(at, op) for at, op in zip(starts, ops) if op in temps]):
            self.code[start + at:start + at] = [(None, Instruction("ZERO", (op,),
                                                                   self.lineno))]
        use(ops)
        for op, part in reversed(list(zip(ops, parts))):
            self.code += invert(part, self.fresh)
            if op in summed:
                self.emit("ZERO", op)
        self.addresses_done(mark)
        for op, a in reversed(list(zip(ops, args))):     # (the next statement's operands
            if isinstance(op, Reg) and self.is_temp(a):     # get the same registers)
                self.release(op)

    def is_temp(self, e) -> bool:
        """Did operand(e) compute e into a fresh temporary?"""
        if isinstance(e, ast.Name) or self.constant_or_none(e) is not None:
            return False
        if self.shared is not None and ast.dump(e) in self.shared:
            return False                # (computed once for the statement: see sharing)
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return False
        return not (isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute)
                    and e.value.attr == "shape")

    def operand(self, e, cls: str | None = None):
        """A register or immediate holding e's value (computed into a temp if compound)."""
        value = self.constant_or_none(e)
        if value is not None:
            if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
                raise self.error(e, f"the integer {value} does not fit in int64")
            return Imm(float(value) if cls == FLOAT and isinstance(value, bool) else value)
        if isinstance(e, ast.Name):
            return self.scalar(e).reg
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return self.length(e)
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            raise self.error(e, "use A.shape[k] or len(A)")
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and \
                e.value.attr == "shape":
            return self.shape(e)
        element, read = self.read_of(e)
        if isinstance(element, ast.Subscript):
            var, mem = self.address(element)
            x = self.reg(var.dtype)
            self.emit("ADD" + read, x, mem)     # taken back out by the caller's uncompute
            return x
        if self.shareable(e):
            return self.share(e)
        t = self.reg(INT if self.typeof(e) == "int" else FLOAT)
        if self.integer_valued(e, t):
            return t
        if not (isinstance(e, (ast.BinOp, ast.UnaryOp)) or (
                isinstance(e, ast.Call) and self.callee_name(e.func) in FUNCS)):
            raise self.error(e, f"{type(e).__name__} is not supported in expressions")
        self.accumulate(t, 1, e, e)
        return t

    def sharing(self, s, body: Callable[[], None]) -> None:
        """Compile one array statement (body) with its integer operands shared: each
        compound integer expression of variables the statement does not change (a slice's
        bounds, a view's offset or stride, a shape) is computed once, before the statement's
        code, and uncomputed after it, however many of its checks and instructions read it
        (computed at each use, GMM's weights took 858 instructions; see tests/test_arrays.py).
        The registers come from a pool only shared operands use, so each is zero wherever
        the statement's code starts."""
        start = len(self.code)
        changed = self.written([s])
        self.shared_vars = {name: var for scope in self.scopes for name, var in scope.items()
                            if name not in changed}
        self.shared, self.shared_code = {}, []
        try:
            body()
            code, regs = self.shared_code, list(self.shared.values())
        finally:
            self.shared, self.shared_code, self.shared_vars = None, [], {}
        self.code[start:start] = code
        self.code += invert(code, self.fresh)
        self.shared_pool += reversed(regs)

    def shareable(self, e) -> bool:
        """May operand(e) be shared (see sharing): a compound integer expression of the
        statement's unchanged variables, constants, len(A) and A.shape[k] that cannot
        fail (no // or %, whose divisor may be zero): computed earlier than its use, and
        even where a loop of the statement makes no pass, it changes nothing but steps."""
        if self.shared is None or not isinstance(e, (ast.BinOp, ast.UnaryOp)) or \
                self.typeof(e) != "int":
            return False
        for n in ast.walk(e):
            if isinstance(n, ast.Name):
                if self.lookup(n.id) is not self.shared_vars.get(n.id):
                    return False        # declared in the statement (a loop's counter)
            elif isinstance(n, ast.Subscript):
                if not (isinstance(n.value, ast.Attribute) and n.value.attr == "shape"):
                    return False        # an element: read where it is used
            elif isinstance(n, ast.Call):
                if self.callee_name(n.func) != "len":
                    return False
            elif isinstance(n, (ast.FloorDiv, ast.Mod)):
                return False            # (may fail: only where and when it is used)
            elif not isinstance(n, (ast.BinOp, ast.UnaryOp, ast.Constant, ast.Attribute,
                                    ast.operator, ast.unaryop, ast.expr_context)):
                return False
        return True

    def share(self, e) -> Reg:
        """The register holding e for the statement being compiled (see sharing)."""
        key = ast.dump(e)
        r = self.shared.get(key)
        if r is None:
            r = self.shared_pool.pop() if self.shared_pool else self.new_reg(INT)
            code, _ = self.capture(lambda: self.integer_valued(e, r) or
                                   self.accumulate(r, 1, e, e))
            self.shared_code += code
            self.shared[key] = r
        return r

    def integer_valued(self, e, t: Reg) -> bool:
        """Compute a comparison, and/or/not, or a bit operation into the zeroed integer
        register t; False for anything else. Comparisons are 0 or 1 (as in Janus);
        & | ^ and shifts by a constant are two's complement on int64 (<< wraps, >>
        rounds toward minus infinity, as in Python)."""
        if isinstance(e, (ast.Compare, ast.BoolOp)) or (
                isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not)):
            self.boolean(t, e)
            return True
        if not (isinstance(e, ast.BinOp) and type(e.op) in BITOPS):
            return False
        if isinstance(e.op, (ast.LShift, ast.RShift)):
            k = self.constant_or_none(e.right)
            if not isinstance(k, int) or not 0 <= k <= 62:
                raise self.error(e.right, "shift by a constant from 0 to 62",
                                 "write x * 2**k or x // 2**k for other amounts")
            op = "ADD.mul" if isinstance(e.op, ast.LShift) else "ADD.div"
            self.with_operands([e.left], lambda ops: self.emit(op, t, ops[0], Imm(1 << k)),
                               INT)
        elif isinstance(e.op, ast.BitXor):
            self.with_operands([e.left, e.right], lambda ops: (
                self.emit("XOR", t, ops[0]), self.emit("XOR", t, ops[1])), INT)
        else:
            op = "XOR.and" if isinstance(e.op, ast.BitAnd) else "XOR.or"
            self.with_operands([e.left, e.right], lambda ops: self.emit(op, t, *ops), INT)
        return True

    def length(self, e) -> Reg:
        if len(e.args) != 1 or not isinstance(e.args[0], ast.Name):
            raise self.error(e, "len takes one array variable")
        var = self.variable(e.args[0])
        if var.kind != "array":
            raise self.error(e, f"{var.name} is not an array")
        return var.regs[1]

    def shape(self, e) -> Reg:
        var = self.variable(e.value.value) if isinstance(e.value.value, ast.Name) else None
        k = self.constant_or_none(e.slice)
        if var is None or var.kind != "array" or not isinstance(k, int) or \
                not 0 <= k < len(var.regs) - 1:
            raise self.error(e, "A.shape[k] needs an array A and a constant k within its "
                             "dimensions")
        return var.regs[1 + k]

    def xor(self, target: Reg, e, node) -> None:
        if target.cls != INT:
            raise self.error(node, "^= needs an integer target")
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.BitAnd, ast.BitOr)):
            op = "XOR.and" if isinstance(e.op, ast.BitAnd) else "XOR.or"
            return self.with_operands([e.left, e.right], lambda ops: self.emit(op, target, *ops),
                                      INT)
        if isinstance(e, (ast.Compare, ast.BoolOp)) or (
                isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not)):
            return self.boolean(target, e)
        if self.typeof(e) != "int":
            raise self.error(e, "^= needs an integer expression")
        self.with_operands([e], lambda ops: self.emit("XOR", target, ops[0]), INT)

    # ------------------------------------------------------------------ conditions
    def pre_post(self, test, node, allow_single: bool):
        if isinstance(test, ast.Tuple):
            if len(test.elts) != 2:
                raise self.error(test, "write (precondition, postcondition)")
            return test.elts
        if not allow_single:
            raise self.error(node, "a reversible while needs (precondition, postcondition)",
                             "while (pre, post): the post-condition is false on entry and "
                             "true after every pass")
        return test, test

    def condition(self, e) -> tuple[str, Any, Any]:
        """A branch condition (cc, a, b); may emit code computing temporaries."""
        if isinstance(e, ast.Compare) and len(e.ops) == 1 and type(e.ops[0]) in COMPARE:
            a = self.operand(e.left)
            b = self.operand(e.comparators[0])
            return COMPARE[type(e.ops[0])], a, b
        if not isinstance(e, (ast.Compare, ast.BoolOp, ast.UnaryOp)) and \
                self.typeof(e) == "int":
            return "NE", self.operand(e), Imm(0)
        t = self.reg(INT)
        self.boolean(t, e)
        return "NE", t, Imm(0)

    def boolean(self, t: Reg, e) -> None:
        """t ^= bool(e)."""
        if isinstance(e, ast.Compare):
            pairs = list(zip([e.left, *e.comparators], e.comparators))
            if len(pairs) == 1:
                cc = COMPARE.get(type(e.ops[0]))
                if cc is None:
                    raise self.error(e, "only == != < <= > >= comparisons are supported")
                return self.with_operands(list(pairs[0]), lambda ops: self.emit(
                    f"XOR.{cc.lower()}", t, *ops))
            parts = [ast.Compare(left=a, ops=[op], comparators=[b])
                     for (a, b), op in zip(pairs, e.ops)]
            return self.boolean(t, ast.copy_location(ast.BoolOp(op=ast.And(), values=parts), e))
        if isinstance(e, ast.BoolOp):
            # short-circuit, as in Python and Janus: the right side is evaluated only when
            # the left does not decide (so `n == 0 or A[n - 1] != 5` never reads A[-1])
            first, rest = e.values[0], e.values[1:]
            right = rest[0] if len(rest) == 1 else ast.copy_location(
                ast.BoolOp(op=e.op, values=rest), e)
            a = self.reg(INT)
            code, _ = self.capture(lambda: self.boolean(a, first))
            self.code += code
            if isinstance(e.op, ast.Or):
                self.emit("XOR", t, a)                  # t ^= a | b: b only when a == 0
            self.guarded(a, "EQ" if isinstance(e.op, ast.Or) else "NE",
                         lambda: self.boolean(t, right))
            self.code += invert(code, self.fresh)
            self.release(a)
            return None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            self.boolean(t, e.operand)
            self.emit("XOR", t, Imm(1))
            return None
        if self.typeof(e) == "int":
            return self.with_operands([e], lambda ops: self.emit("XOR.ne", t, ops[0], Imm(0)))
        raise self.error(e, "a condition must be a comparison, and/or/not, or an integer")

    def guarded(self, r: Reg, cc: str, body: Callable[[], None]) -> None:
        """Run body only when `r cc 0`; body must not change r (a reversible if with an
        empty else, its comefrom asserting the same condition)."""
        i, j, skip, end = (self.fresh(x) for x in ("if", "then", "else", "fi"))
        self.emit(f"BR.{isa.NEGATED[cc]}", r, Imm(0), Label(skip), label=i)
        body()
        self.emit("JMP", Label(end), label=j)
        self.emit("CF", Label(i), label=skip)
        self.emit(f"CF.{cc}", r, Imm(0), Label(j), label=end)

    # ------------------------------------------------------------------ names and types
    def variable(self, e) -> Var:
        if not isinstance(e, ast.Name):
            raise self.error(e, "expected a variable name")
        var = self.lookup(e.id)
        if var is None:
            hint = "declare it with: with ancilla(" + e.id + "=0.0):" \
                if self.env(e.id) is None else f"{e.id} is a constant here; it cannot change"
            raise self.error(e, f"unknown variable {e.id!r}", hint)
        return var

    def scalar(self, e) -> Var:
        """The variable a name used as a real scalar stands for."""
        var = self.variable(e)
        if var.kind == "array":
            raise self.error(e, f"{var.name} is an array; use an element {var.name}[i]")
        if var.kind == "complex":
            raise self.error(e, f"{var.name} is complex here",
                             f"take {var.name}.real, {var.name}.imag or abs({var.name}), or "
                             "accumulate into a complex variable")
        return var

    def constant(self, e):
        value = self.constant_or_none(e)
        if value is None:
            raise self.error(e, "expected a constant")
        return value

    def constant_or_none(self, e):
        """The numeric value of a literal or of a constant from the enclosing scope."""
        if isinstance(e, ast.Constant) and isinstance(e.value, (int, float)):
            return e.value
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            v = self.constant_or_none(e.operand)
            return None if v is None else -v
        if isinstance(e, (ast.Name, ast.Attribute)):
            if isinstance(e, ast.Name) and self.lookup(e.id) is not None:
                return None
            value = self.env(ast.unparse(e))
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if isinstance(value, float) and not math.isfinite(value):
                    raise self.error(e, f"constant {ast.unparse(e)} is not finite")
                return value
            if hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
                return value.item()
        return None

    def typeof(self, e) -> str:
        value = self.constant_or_none(e)
        if value is not None:
            return "int" if isinstance(value, int) else "float"
        if isinstance(e, ast.Name):
            return self.scalar(e).kind
        if isinstance(e, ast.Subscript):
            if isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
                return "int"
            var = self.variable(e.value) if isinstance(e.value, ast.Name) else None
            if var is None or var.kind != "array":
                raise self.error(e, "only array variables can be indexed")
            if var.complex and not isinstance(e.slice, ast.Tuple):
                raise self.error(e, f"{ast.unparse(e)} is complex here",
                                 "take .real, .imag or abs(...), or accumulate into a "
                                 "complex variable")
            return "int" if var.dtype == INT else "float"
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.Pow) and self.int_power(e) is not None:
                return "int"
            if isinstance(e.op, (ast.Div, ast.Pow)):
                self.typeof(e.left), self.typeof(e.right)
                return "float"
            kinds = {self.typeof(e.left), self.typeof(e.right)}
            if type(e.op) in BITOPS:
                if "float" in kinds:
                    raise self.error(e, f"{BITOPS[type(e.op)]} needs integer operands")
                return "int"
            if type(e.op) not in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod):
                raise self.error(e, f"operator {type(e.op).__name__} is not supported")
            return "float" if "float" in kinds else "int"
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            return self.typeof(e.operand)
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "nograd":
            return self.typeof(self.read_of(e)[0])
        if isinstance(e, ast.Call):
            name = self.callee_name(e.func)
            if name == "len":
                return "int"
            if name == "abs" and len(e.args) == 1:
                return self.typeof(e.args[0])
            if FUNC_FAMILIES.get(name, name) in ("max", "min") and len(e.args) == 2:
                kinds = {self.typeof(a) for a in e.args}
                return "float" if "float" in kinds else "int"
            if name in FUNCS:
                for a in e.args:
                    self.typeof(a)
                return "float"
            raise self.error(e, f"{name}() cannot be used in an expression",
                             "call reversible functions as statements: f(x, y)")
        if isinstance(e, (ast.Compare, ast.BoolOp)) or (
                isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not)):
            return "int"
        raise self.error(e, f"{type(e).__name__} is not supported in expressions")

    def is_zero(self, e) -> bool:
        v = self.constant_or_none(e)
        return v is not None and v == 0

    def names(self, e) -> set[str]:
        return {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}

    def value_names(self, e) -> set[str]:
        """Names whose *values* e reads (len(A) and A.shape read only A's fixed size)."""
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return set()
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            return set()
        if isinstance(e, ast.Name):
            return {e.id}
        return set().union(set(), *(self.value_names(c) for c in ast.iter_child_nodes(e)))

    def dimension_of(self, e) -> Reg | None:
        """The array dimension register e equals, if it is len(A), A.shape[k] with a
        constant k, or an int variable known to hold a dimension (see self.dims)."""
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len" and \
                len(e.args) == 1 and isinstance(e.args[0], ast.Name):
            var = self.lookup(e.args[0].id)
            return self.dims.get(var.regs[1], var.regs[1]) if var is not None and \
                var.kind == "array" else None
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and \
                e.value.attr == "shape" and isinstance(e.value.value, ast.Name):
            var, k = self.lookup(e.value.value.id), self.constant_or_none(e.slice)
            if var is not None and var.kind == "array" and isinstance(k, int) and \
                    0 <= k < len(var.regs) - 1:
                return self.dims.get(var.regs[1 + k], var.regs[1 + k])
        if isinstance(e, ast.Name):
            var = self.lookup(e.id)
            return self.dims.get(var.reg) if var is not None and var.kind == "int" else None
        return None

    def passed(self, stmts: list, name: str) -> bool:
        """Is `name` an argument of a call statement in stmts (f(x), ~f(x), neg(x), push(x,
        s), ...), which may change it by reference? (Calls inside expressions and
        headers, range(n), exp(x), ancilla(k=n), only read their arguments.)"""
        for s in stmts:
            for n in ast.walk(s):
                call = n.value if isinstance(n, ast.Expr) else None
                if isinstance(call, ast.UnaryOp) and isinstance(call.op, ast.Invert):
                    call = call.operand
                if isinstance(call, ast.Call) and any(
                        isinstance(a, ast.Name) and a.id == name for a in call.args):
                    return True
        return False

    def written(self, stmts: list) -> set[str]:
        """Names a block changes directly (targets, swaps, neg/rot). Arguments of calls are
        not counted: where bounds are concerned they are copied (see stmt_For)."""
        out: set[str] = set()
        for s in stmts:
            for n in ast.walk(s):
                if isinstance(n, ast.AugAssign):
                    out |= self.base_names(n.target)
                elif isinstance(n, ast.Assign):
                    for t in n.targets:
                        out |= self.base_names(t)
                elif isinstance(n, ast.Call) and self.callee_name(n.func) in ("neg", "rot",
                                                                              "irot"):
                    for a in n.args[:2]:
                        out |= self.base_names(a)
                elif isinstance(n, ast.For) and isinstance(n.target, ast.Name):
                    out.add(n.target.id)
        return out

    def base_names(self, t) -> set[str]:
        if isinstance(t, ast.Name):
            return {t.id}
        if isinstance(t, ast.Subscript):
            return self.base_names(t.value)
        if isinstance(t, ast.Tuple):
            return set().union(*(self.base_names(x) for x in t.elts))
        return set()

    def no_self_reference(self, target, value, node, apart=lambda e: False) -> None:
        """The target may not be read by its own update. An array target may read other
        elements of its array: a run-time check then makes sure the indices differ. Reads
        for which `apart` holds the caller checks apart from the target itself (an array
        statement's views: Arrays.check_overlap)."""
        name = next(iter(self.base_names(target)), None)
        if name is None or name not in self.value_names(value):
            return
        reads = [n for n in ast.walk(value) if isinstance(n, ast.Subscript)
                 and isinstance(n.value, ast.Name) and n.value.id == name]
        whole = self.value_names(value) - {name} | (
            {name} if any(isinstance(n, ast.Name) and n.id == name for n in
                          self.outside_subscripts(value, name)) else set())
        if name not in whole and reads:
            reads = [r for r in reads if not apart(r)]
            if not reads:
                return
        if isinstance(target, ast.Subscript) and name not in whole and reads and \
                not isinstance(target.slice, ast.Tuple):
            for r in reads:
                if isinstance(r.slice, ast.Tuple):
                    break
                if ast.dump(r.slice) == ast.dump(target.slice):   # always the same element
                    raise self.error(r, f"{ast.unparse(r)} is the element the update "
                                     "changes: it occurs on both sides", ALIAS_HINT)
                self.with_operands([target.slice, r.slice],
                                   lambda ops: self.emit("ASSERT.NE", *ops), INT)
            else:
                return
        raise self.error(node, f"{name} occurs on both sides", "the target of an "
                         "accumulation may not be read by it: use a temporary "
                         "(with ancilla(t=0.0): t += ...; y += ... t ...; t -= ...)")

    def index_reads(self, e):
        """The Name nodes whose values the index expression e reads (not len(A) or
        A.shape, which read only a fixed size)."""
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            return
        if isinstance(e, ast.Name):
            yield e
        for c in ast.iter_child_nodes(e):
            yield from self.index_reads(c)

    def no_index_alias(self, targets: list, what: str) -> None:
        """The index of a target may not read a variable the statement changes: an
        element is addressed once to change it and again to put it back (or to undo the
        statement), and the two addresses must agree. So `x[x[0]] ^= 1`, `a[i], i = i,
        a[i]` and `v[0], v[v[0]] = v[v[0]], v[0]` are refused."""
        changed = set().union(*(self.base_names(t) for t in targets))
        for t in targets:
            if isinstance(t, ast.Subscript):
                for n in self.index_reads(t.slice):
                    if n.id in changed:
                        raise self.error(n, f"the index of {ast.unparse(t)} reads {n.id}, "
                                         f"which the {what} changes", ALIAS_HINT)

    def outside_subscripts(self, e, name: str):
        """Nodes of e that are not inside a subscript of `name` (or len/shape of it)."""
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and \
                e.value.id == name:
            yield from (n for n in ast.walk(e.slice))
            return
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return
        yield e
        for c in ast.iter_child_nodes(e):
            yield from self.outside_subscripts(c, name)
