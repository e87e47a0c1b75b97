"""Compile the reversible Python subset (docs/language.md) to rvm bytecode.

One `FunctionCompiler` per function and argument signature. Statements lower to
instructions directly; structured control flow becomes paired branches and comefroms;
compound expressions go through temporaries that are computed, used, and uncomputed by
emitting the inverse of the code that computed them. Every instruction carries the Python
line it came from (the source map).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from typing import Any

import attrs

from .. import isa
from ..errors import CompileError
from ..program import FuncRef, Function, Imm, Instruction, Label, Mem, Reg, Symbol
from .invert import Code, invert, relabel

INT, FLOAT = isa.INT, isa.FLOAT
BINOPS = {ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "div", ast.Mod: "mod", ast.Pow: "pow"}
FUNCS = {"exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "atan2", "fmod"}
COMPARE = {ast.Eq: "EQ", ast.NotEq: "NE", ast.Lt: "LT", ast.LtE: "LE", ast.Gt: "GT",
           ast.GtE: "GE"}
MARKERS = {"ancilla", "compute", "inverse", "neg", "rot", "irot", "zeros", "len"}


@attrs.define
class Var:
    name: str
    kind: str                   # "int" | "float" | "array"
    regs: tuple                 # scalar: (reg,); array: (base, n) or (base, rows, cols)
    dtype: str = ""             # arrays: INT or FLOAT

    @property
    def reg(self) -> Reg:
        return self.regs[0]

    @property
    def cls(self) -> str:
        return INT if self.kind == "int" else FLOAT if self.kind == "float" else self.dtype

    @property
    def sig(self) -> tuple:
        return ("array", self.dtype, len(self.regs) - 1) if self.kind == "array" else (self.kind,)


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


def sig_of(value) -> tuple:
    """The argument signature of a Python value."""
    import numpy as np
    if isinstance(value, np.ndarray):
        return ("array", FLOAT if value.dtype.kind == "f" else INT, value.ndim)
    if isinstance(value, (bool, np.bool_)):
        return ("int",)
    if isinstance(value, (int, np.integer)):
        return ("int",)
    return ("float",)


def parse_annotation(ann, env: Callable[[str], Any]) -> tuple | None:
    """float / int / Array[float] / Array[int, 2] -> a signature, or None (infer)."""
    if ann is None:
        return None
    text = ast.unparse(ann).replace(" ", "")
    base = text.split(".")[-1]
    if base in ("float", "int"):
        return (base,)
    if "Array[" in text:
        inner = text[text.index("[") + 1:-1].split(",")
        dtype = FLOAT if inner[0].split(".")[-1] == "float" else INT
        return ("array", dtype, int(inner[1]) if len(inner) > 1 else 1)
    return None


class FunctionCompiler:
    """Compiles one Python function (an ast.FunctionDef) for one argument signature."""

    def __init__(self, session, node: ast.FunctionDef, source: Source, env, name: str,
                 sig: tuple):
        self.session, self.node, self.src, self.env, self.name = session, node, source, env, name
        self.sig = sig
        self.code: Code = []
        self.scopes: list[dict[str, Var]] = [{}]
        self.count = {INT: 0, FLOAT: 0}
        self.free: dict[str, list[int]] = {INT: [], FLOAT: []}
        self.labels = 0
        self.routines: dict[str, Code] = {}
        self.symbols: list[Symbol] = []
        self.line = node.lineno

    # ------------------------------------------------------------------ basics
    def error(self, node, message: str, hint: str = "") -> CompileError:
        return self.src.error(node, message, hint)

    def fresh(self, stem: str = "L") -> str:
        self.labels += 1
        return f"{stem.split('_')[0]}_{self.labels}"

    def emit(self, op: str, *args, label: str | None = None) -> None:
        self.code.append((label, Instruction(op, tuple(args), self.lineno)))

    @property
    def lineno(self) -> int:
        return self.line + self.src.first - 1

    def reg(self, cls: str) -> Reg:
        if self.free[cls]:
            return Reg(cls, self.free[cls].pop())
        self.count[cls] += 1
        return Reg(cls, self.count[cls] - 1)

    def release(self, *regs: Reg) -> None:
        for r in regs:
            self.free[r.cls].append(r.n)

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
        self.scopes[-1][name] = var
        self.record(var, self.node)

    def record(self, var: Var, scope_node) -> None:
        """Debug info: var's registers, in scope over scope_node's lines."""
        first = scope_node.lineno + self.src.first - 1
        last = getattr(scope_node, "end_lineno", scope_node.lineno) + self.src.first - 1
        self.symbols.append(Symbol(var.name, var.regs, first, last, var.dtype))

    # ------------------------------------------------------------------ entry
    def compile(self) -> tuple[Function, list[str]]:
        params, names = [], []
        args = self.node.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
            raise self.error(self.node, "reversible functions take plain positional "
                             "parameters only (no *args, **kwargs, defaults)")
        for arg, sig in zip(args.args, self.sig):
            if sig[0] == "array":
                regs = (self.reg(INT),) + tuple(self.reg(INT) for _ in range(sig[2]))
                var = Var(arg.arg, "array", regs, sig[1])
            else:
                var = Var(arg.arg, sig[0], (self.reg(INT if sig[0] == "int" else FLOAT),))
            self.declare(arg, arg.arg, var)
            params += var.regs
            names.append(arg.arg)
        self.body(self.node.body)
        labels, code = {}, []
        for label, ins in self.code:
            if label:
                labels[label] = len(code)
            code.append(ins)
        end = getattr(self.node, "end_lineno", self.node.lineno) + self.src.first - 1
        fn = Function(self.name, tuple(params), tuple(code), labels, self.node.lineno +
                      self.src.first - 1, end, tuple(names), tuple(self.symbols))
        return fn, names

    # ------------------------------------------------------------------ statements
    def body(self, stmts: list) -> None:
        for s in stmts:
            self.line = s.lineno
            self.statement(s)

    def statement(self, s) -> None:
        method = getattr(self, "stmt_" + type(s).__name__, None)
        if method is None:
            what = {"Return": "return", "Break": "break", "Continue": "continue",
                    "Raise": "raise", "Try": "try", "Delete": "del", "Import": "import",
                    "AnnAssign": "an annotated assignment"}.get(type(s).__name__,
                                                               type(s).__name__)
            raise self.error(s, f"{what} is not reversible and not supported here",
                             "a reversible function ends by falling off its end; see "
                             "docs/language.md")
        method(s)

    def stmt_Pass(self, s) -> None:
        pass

    def stmt_Assign(self, s) -> None:
        t = s.targets[0]
        if (len(s.targets) == 1 and isinstance(t, ast.Tuple) and isinstance(s.value, ast.Tuple)
                and len(t.elts) == 2 and len(s.value.elts) == 2
                and ast.unparse(t.elts[0]) == ast.unparse(s.value.elts[1])
                and ast.unparse(t.elts[1]) == ast.unparse(s.value.elts[0])):
            return self.swap(s, t.elts[0], t.elts[1])
        raise self.error(s, "plain assignment overwrites its target, which is not reversible",
                         "accumulate instead (x += ...), into a zero ancilla if needed: "
                         "with ancilla(x=0.0): ...")

    def stmt_AugAssign(self, s) -> None:
        op = type(s.op)
        target = s.target
        if op in (ast.Add, ast.Sub, ast.BitXor):
            self.no_self_reference(target, s.value, s)
        if op in (ast.Add, ast.Sub):
            sign = 1 if op is ast.Add else -1
            return self.into(target, lambda r: self.accumulate(r, sign, s.value, s), s)
        if op is ast.BitXor:
            return self.into(target, lambda r: self.xor(r, s.value, s), s)
        if op in (ast.Mult, ast.Div):
            self.no_self_reference(target, s.value, s)
            name = "MUL" if op is ast.Mult else "DIV"

            def scale(r):
                if r.cls != FLOAT:
                    raise self.error(s, f"{'*=' if name == 'MUL' else '/='} needs a float "
                                     "target", "integers can only be accumulated (+=, -=, ^=)")
                self.with_operands([s.value], lambda ops: self.emit(name, r, ops[0]))
            return self.into(target, scale, s)
        raise self.error(s, f"{type(s.op).__name__} assignment is not reversible",
                         "use +=, -=, ^=, *= or /=")

    def stmt_Expr(self, s) -> None:
        e = s.value
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return None     # a docstring
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Invert):
            if isinstance(e.operand, ast.Name) and e.operand.id in self.routines:
                self.code += invert(self.routines[e.operand.id], self.fresh)
                return
            if isinstance(e.operand, ast.Call):
                return self.call(e.operand, inverse=True)
            raise self.error(e, "~ applies to a call, or to the name of a compute block",
                             "write ~f(x, y), (~f)(x, y), or ~r after 'with compute() as r:'")
        if isinstance(e, ast.Call):
            fname = self.callee_name(e.func)
            if fname in ("neg", "rot", "irot"):
                return self.builtin(e, fname)
            return self.call(e)
        raise self.error(s, "this expression does nothing; statements must change state",
                         "use +=, -=, a call, or a control structure")

    def stmt_If(self, s) -> None:
        pre, post = self.pre_post(s.test, s, allow_single=True)
        pre_code, (cc, a, b) = self.capture(lambda: self.condition(pre))
        self.code += pre_code
        i, j, other, end = (self.fresh(x) for x in ("if", "then", "else", "fi"))
        self.emit(f"BR.{isa.NEGATED[cc]}", a, b, Label(other), label=i)
        self.code += invert(pre_code, self.fresh)
        self.scoped(s.body)
        self.line = s.lineno
        post_code, (pcc, pa, pb) = self.capture(lambda: self.condition(post))
        self.code += post_code
        self.emit("JMP", Label(end), label=j)
        self.emit("CF", Label(i), label=other)
        self.code += invert(relabel(pre_code, self.fresh), self.fresh)
        self.scoped(s.orelse)
        self.line = s.lineno
        self.code += relabel(post_code, self.fresh)
        self.emit(f"CF.{pcc}", pa, pb, Label(j), label=end)
        self.code += invert(post_code, self.fresh)

    def stmt_While(self, s) -> None:
        if s.orelse:
            raise self.error(s, "while ... else is not supported")
        pre, post = self.pre_post(s.test, s, allow_single=False)
        post_code, (pcc, pa, pb) = self.capture(lambda: self.condition(post))
        top, ex, back, done = (self.fresh(x) for x in ("loop", "exit", "back", "done"))
        self.code += post_code
        self.emit(f"CF.{pcc}", pa, pb, Label(back), label=top)
        self.code += invert(post_code, self.fresh)
        pre_code, (cc, a, b) = self.capture(lambda: self.condition(pre))
        self.code += pre_code
        self.emit(f"BR.{isa.NEGATED[cc]}", a, b, Label(done), label=ex)
        self.code += invert(pre_code, self.fresh)
        self.scoped(s.body)
        self.line = s.lineno
        self.code += relabel(post_code, self.fresh)
        self.emit("JMP", Label(top), label=back)
        self.emit("CF", Label(ex), label=done)
        self.code += invert(relabel(pre_code, self.fresh), self.fresh)

    def stmt_For(self, s) -> None:
        it = s.iter
        if (s.orelse or not isinstance(s.target, ast.Name) or not isinstance(it, ast.Call)
                or self.callee_name(it.func) != "range" or not 1 <= len(it.args) <= 3):
            raise self.error(s, "only 'for NAME in range(a, b, step):' is supported")
        args = list(it.args)
        start, stop = (args[0], args[1]) if len(args) > 1 else (ast.Constant(0), args[0])
        step = 1
        if len(args) == 3:
            step = self.constant(args[2])
            if not isinstance(step, int) or step == 0:
                raise self.error(args[2], "the step of range must be a nonzero integer "
                                 "constant")
        written = self.written(s.body)
        for bound in (start, stop):
            for name in self.value_names(bound):
                if name in written:
                    raise self.error(bound, f"the loop bound uses {name!r}, which the body "
                                     "changes", "bounds must not change inside the loop")
        if s.target.id in written:
            raise self.error(s.target, f"the loop variable {s.target.id!r} is changed in "
                             "the body")
        for e in (start, stop):
            if self.typeof(e) != "int":
                raise self.error(e, "range bounds must be integers")
        up = step > 0
        # bounds are copied: a callee given a bound variable by reference cannot move them
        bounds_code, (a, b) = self.capture(lambda: (self.copy(start), self.copy(stop)))
        self.code += bounds_code
        i = self.reg(INT)
        g, top, again, skip = (self.fresh(x) for x in ("for", "top", "again", "skip"))
        self.emit("ADD", i, a)
        self.emit("BR.GE" if up else "BR.LE", a, b, Label(skip), label=g)
        self.emit("CF.NE", i, a, Label(again), label=top)
        self.scopes.append({s.target.id: Var(s.target.id, "int", (i,))})
        self.record(self.scopes[-1][s.target.id], s)
        self.body(s.body)
        self.scopes.pop()
        self.line = s.lineno
        self.emit("ADD", i, Imm(step))
        self.emit("BR.LT" if up else "BR.GT", i, b, Label(top), label=again)
        # i = a + n * step now, with n = ceil((b - a) / step) trips: take n * step back out
        n_code, n = self.capture(lambda: self.trips(a, b, step))
        self.code += n_code
        self.emit("SUB.mul", i, n, Imm(step))
        self.code += invert(n_code, self.fresh)
        self.release(n)
        self.emit("CF.GE" if up else "CF.LE", a, b, Label(g), label=skip)
        self.emit("SUB", i, a)
        self.release(i)
        self.code += invert(bounds_code, self.fresh)
        for bound in (a, b):
            if isinstance(bound, Reg):
                self.emit("ZERO", bound)    # fails if the body changed a bound variable
                self.release(bound)

    def copy(self, e):
        """A constant, or a fresh temporary holding e's value."""
        value = self.constant_or_none(e)
        if value is not None:
            return Imm(value)
        t = self.reg(INT)
        self.accumulate(t, 1, e, e)
        return t

    def trips(self, a, b, step: int) -> Reg:
        t, n = self.reg(INT), self.reg(INT)
        code, _ = self.capture(lambda: (self.emit("ADD", t, b), self.emit("SUB", t, a),
                                        self.emit("ADD", t, Imm(step - 1 if step > 0
                                                                else step + 1))))
        self.code += code
        self.emit("ADD.div", n, t, Imm(step))
        self.code += invert(code, self.fresh)
        self.release(t)
        return n

    def stmt_With(self, s) -> None:
        if len(s.items) != 1 or not isinstance(s.items[0].context_expr, ast.Call):
            raise self.error(s, "use one of: with ancilla(...), with compute() as r, "
                             "with inverse()")
        item = s.items[0]
        kind = self.callee_name(item.context_expr.func)
        if kind == "ancilla":
            return self.ancilla(s, item.context_expr)
        if kind == "compute":
            if not isinstance(item.optional_vars, ast.Name):
                raise self.error(s, "name the block: with compute() as r: ... then ~r",
                                 "~r inserts the inverse of the block (uncompute)")
            code, _ = self.capture(lambda: self.scoped(s.body))
            self.code += code
            self.routines[item.optional_vars.id] = code
            return None
        if kind == "inverse":
            code, _ = self.capture(lambda: self.scoped(s.body))
            self.code += invert(code, self.fresh)
            return None
        raise self.error(item.context_expr, f"unknown block {kind!r}",
                         "use ancilla(...), compute() or inverse()")

    def ancilla(self, s, call) -> None:
        if call.args:
            raise self.error(call, "ancilla takes keyword arguments: ancilla(k=0, t=0.0)")
        scope: dict[str, Var] = {}
        undo: list[Callable[[], None]] = []
        for kw in call.keywords:
            value = kw.value
            self.line = s.lineno
            if isinstance(value, ast.Call) and self.callee_name(value.func) == "zeros":
                var, free = self.new_array(kw.arg, value)
            else:
                kind = self.typeof(value)
                var = Var(kw.arg, kind, (self.reg(INT if kind == "int" else FLOAT),))
                init = None if self.is_zero(value) else value
                if init is not None:
                    self.accumulate(var.reg, 1, init, value)

                def free(var=var, init=init, node=value):
                    if init is not None:
                        self.accumulate(var.reg, -1, init, node)
                    self.emit("ZERO", var.reg)
                    self.release(var.reg)
            if kw.arg in scope or self.lookup(kw.arg):
                raise self.error(value, f"{kw.arg!r} is already a variable here")
            scope[kw.arg] = var
            self.record(var, s)
            undo.append(free)
        self.scopes.append(scope)
        self.body(s.body)
        self.scopes.pop()
        self.line = s.lineno
        for free in reversed(undo):
            free()

    def new_array(self, name: str, call) -> tuple[Var, Callable[[], None]]:
        dims = call.args[0] if call.args else None
        dims = list(dims.elts) if isinstance(dims, ast.Tuple) else [dims]
        dtype = FLOAT
        for extra in list(call.args[1:]) + [k.value for k in call.keywords]:
            dtype = INT if ast.unparse(extra).split(".")[-1] in ("int", "int64") else FLOAT
        if not 1 <= len(dims) <= 2 or dims[0] is None:
            raise self.error(call, "zeros(n) or zeros((rows, cols)) makes a 1-D or 2-D array")
        base = self.reg(INT)
        regs = [self.reg(INT) for _ in dims]
        dim_code, _ = self.capture(lambda: [self.accumulate(r, 1, d, d)
                                            for r, d in zip(regs, dims)])
        self.code += dim_code
        size_code, size = self.capture(lambda: self.size(regs))
        self.code += size_code
        self.emit("ALLOC", base, size)
        self.code += invert(size_code, self.fresh)

        def free():
            code, size = self.capture(lambda: self.size(regs))
            self.code += code
            self.emit("FREE", base, size)
            self.code += invert(code, self.fresh)
            if isinstance(size, Reg) and size not in regs:
                self.release(size)
            self.code += invert(dim_code, self.fresh)
            self.release(base, *regs)
        return Var(name, "array", (base, *regs), dtype), free

    def size(self, dims: list[Reg]):
        if len(dims) == 1:
            return dims[0]
        t = self.reg(INT)
        self.emit("ADD.mul", t, dims[0], dims[1])
        return t

    def scoped(self, stmts: list) -> None:
        self.scopes.append({})
        self.body(stmts)
        self.scopes.pop()

    # ------------------------------------------------------------------ targets
    def into(self, target, action: Callable[[Reg], None], node) -> None:
        """Run action on a register holding the target (an element is exchanged out)."""
        if isinstance(target, ast.Name):
            var = self.variable(target)
            if var.kind == "array":
                raise self.error(target, f"{var.name} is an array; update its elements, "
                                 f"e.g. {var.name}[i] += ...")
            return action(var.reg)
        if isinstance(target, ast.Subscript):
            addr_code, (var, mem) = self.capture(lambda: self.address(target))
            self.code += addr_code
            x = self.reg(var.dtype)
            self.emit("EXCH", x, mem)
            action(x)
            self.emit("EXCH", x, mem)
            self.release(x)
            self.code += invert(addr_code, self.fresh)
            return None
        raise self.error(target, "the target must be a variable or an array element")

    def swap(self, node, a, b) -> None:
        kinds = [isinstance(x, ast.Subscript) for x in (a, b)]
        if not any(kinds):
            va, vb = self.variable(a), self.variable(b)
            if va.kind != vb.kind or va.kind == "array":
                raise self.error(node, "swap needs two scalar variables of the same type")
            return self.emit("SWAP", va.reg, vb.reg)
        if not all(kinds):
            scalar, element = (b, a) if kinds[0] else (a, b)
            var = self.variable(scalar)
            return self.into(element, lambda r: self.emit("SWAP", var.reg, r), node)
        # two elements: exchange through one temporary; same array needs distinct indices
        code_a, (va, ma) = self.capture(lambda: self.address(a))
        code_b, (vb, mb) = self.capture(lambda: self.address(b))
        self.code += code_a + code_b
        if va.name == vb.name:
            self.emit("ASSERT.NE", ma.off if isinstance(ma.off, Reg) else Imm(ma.off),
                      mb.off if isinstance(mb.off, Reg) else Imm(mb.off))
        x = self.reg(va.dtype)
        self.emit("EXCH", x, ma)
        self.emit("EXCH", x, mb)
        self.emit("EXCH", x, ma)
        self.release(x)
        self.code += invert(code_a + code_b, self.fresh)

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
            self.emit("ASSERT.GE", op, Imm(0))
            self.emit("ASSERT.LT", op, dim)
            ops.append(op)
        if len(ops) == 1:
            off = ops[0]
            return var, Mem(var.regs[0], off.value if isinstance(off, Imm) else off)
        t = self.reg(INT)
        self.emit("ADD.mul", t, ops[0], var.regs[2])
        self.emit("ADD", t, ops[1])
        return var, Mem(var.regs[0], t)

    # ------------------------------------------------------------------ expressions
    def accumulate(self, target: Reg, sign: int, e, node) -> None:
        """target += e (sign 1) or target -= e (sign -1)."""
        kind = self.typeof(e)
        if target.cls == INT and kind == "float":
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
        head = "ADD" if sign > 0 else "SUB"
        self.with_operands(args, lambda ops: self.emit(
            head + ("." + family if family else ""), target, *ops),
            cls=target.cls if family in ("", "abs") else None)

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
                raise self.error(e, "integer ** is not supported", "use a float target")
            return family, [e.left, e.right]
        if isinstance(e, ast.Call):
            name = self.callee_name(e.func)
            if name in FUNCS:
                family = "mod" if name == "fmod" else name
                arity = 2 if family in ("atan2", "mod") else 1
                if len(e.args) != arity or e.keywords:
                    raise self.error(e, f"{name} takes {arity} argument(s)")
                if cls == INT and family not in ("abs",):
                    raise self.error(e, f"{name} gives a float; the target is an integer")
                return family, list(e.args)
            if name == "len":
                return "", [e]
            raise self.error(e, f"{name}() cannot be used in an expression",
                             "expressions may use + - * / // % **, exp log sin cos tanh "
                             "sqrt abs atan2 fmod, len(A); call reversible functions as "
                             "statements")
        return "", [e]

    def with_operands(self, args: list, use: Callable[[list], None],
                      cls: str | None = None) -> None:
        """Operands for args (temporaries where needed), use them, uncompute the temps."""
        start = len(self.code)
        ops = [self.operand(a, cls) for a in args]
        compute = self.code[start:]
        use(ops)
        self.code += invert(compute, self.fresh)
        for op, a in zip(ops, args):
            if isinstance(op, Reg) and self.is_temp(a):
                self.release(op)

    def is_temp(self, e) -> bool:
        """Did operand(e) compute e into a fresh temporary?"""
        if isinstance(e, ast.Name) or self.constant_or_none(e) is not None:
            return False
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return False
        return not (isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute)
                    and e.value.attr == "shape")

    def operand(self, e, cls: str | None = None):
        """A register or immediate holding e's value (computed into a temp if compound)."""
        value = self.constant_or_none(e)
        if value is not None:
            return Imm(float(value) if cls == FLOAT and isinstance(value, bool) else value)
        if isinstance(e, ast.Name):
            var = self.variable(e)
            if var.kind == "array":
                raise self.error(e, f"{var.name} is an array; use an element {var.name}[i]")
            return var.reg
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "len":
            return self.length(e)
        if isinstance(e, ast.Attribute) and e.attr == "shape":
            raise self.error(e, "use A.shape[k] or len(A)")
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and \
                e.value.attr == "shape":
            return self.shape(e)
        kind = self.typeof(e)
        t = self.reg(INT if kind == "int" else FLOAT)
        if isinstance(e, ast.Subscript):
            var, mem = self.address(e)
            x = self.reg(var.dtype)
            self.emit("EXCH", x, mem)
            self.emit("ADD", t, x)
            self.emit("EXCH", x, mem)
            self.release(x)
            if isinstance(mem.off, Reg) and len(var.regs) == 3:
                pass   # the address temp is uncomputed with the rest of the operand code
            return t
        self.accumulate(t, 1, e, e)
        return t

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
            op = "XOR.and" if isinstance(e.op, ast.And) else "XOR.or"
            first, rest = e.values[0], e.values[1:]
            right = rest[0] if len(rest) == 1 else ast.copy_location(
                ast.BoolOp(op=e.op, values=rest), e)
            a, b = self.reg(INT), self.reg(INT)
            code, _ = self.capture(lambda: (self.boolean(a, first), self.boolean(b, right)))
            self.code += code
            self.emit(op, t, a, b)
            self.code += invert(code, self.fresh)
            self.release(a, b)
            return None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            self.boolean(t, e.operand)
            self.emit("XOR", t, Imm(1))
            return None
        if self.typeof(e) == "int":
            return self.with_operands([e], lambda ops: self.emit("XOR.ne", t, ops[0], Imm(0)))
        raise self.error(e, "a condition must be a comparison, and/or/not, or an integer")

    # ------------------------------------------------------------------ calls
    def callee_name(self, f) -> str:
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute):
            return f.attr
        return ""

    def builtin(self, e, name: str) -> None:
        want = 1 if name == "neg" else 3
        if len(e.args) != want:
            raise self.error(e, f"{name} takes {want} argument(s)")
        if name == "neg":
            return self.into(e.args[0], lambda r: self.emit("NEG", r), e)
        x, y, angle = e.args
        if ast.unparse(x) == ast.unparse(y):
            raise self.error(e, f"{name} rotates two distinct values")
        if self.typeof(x) != "float" or self.typeof(y) != "float":
            raise self.error(e, f"{name} rotates two float values")
        for n in self.value_names(angle):
            if n in self.base_names(x) | self.base_names(y):
                raise self.error(angle, "the angle may not use the rotated values")
        if self.base_names(x) == self.base_names(y) and isinstance(x, ast.Subscript) and \
                not isinstance(x.slice, ast.Tuple) and isinstance(y, ast.Subscript):
            self.with_operands([x.slice, y.slice], lambda ops: self.emit("ASSERT.NE", *ops),
                               INT)
        self.into(x, lambda a: self.into(y, lambda b: self.with_operands(
            [angle], lambda ops: self.emit(name.upper(), a, b, ops[0]), FLOAT), e), e)

    def call(self, e, inverse: bool = False) -> None:
        f = e.func
        if isinstance(f, ast.UnaryOp) and isinstance(f.op, ast.Invert):
            f, inverse = f.operand, not inverse
        target = self.resolve_function(f)
        if e.keywords:
            raise self.error(e, "reversible calls take positional arguments only")
        seen: dict[str, Any] = {}
        regs, sig, after = [], [], []
        for a in e.args:
            if isinstance(a, ast.Name) and self.lookup(a.id):
                var = self.variable(a)
                if a.id in seen:
                    raise self.error(a, f"{a.id} is passed twice",
                                     "arguments are passed by reference; pass distinct "
                                     "variables")
                seen[a.id] = a
                regs += var.regs
                sig.append(var.sig)
            elif isinstance(a, ast.Subscript):
                code, (var, mem) = self.capture(lambda a=a: self.address(a))
                self.code += code
                x = self.reg(var.dtype)
                self.emit("EXCH", x, mem)
                regs.append(x)
                sig.append(("int" if var.dtype == INT else "float",))
                after.append((x, mem, code))
            else:   # an expression, passed through a temporary
                code, t = self.capture(lambda a=a: self.operand(a))
                if isinstance(t, Imm):
                    t = self.reg(INT if isinstance(t.value, int) else FLOAT)
                    code2, _ = self.capture(lambda t=t, a=a: self.accumulate(t, 1, a, a))
                    code = code + code2
                self.code += code
                regs.append(t)
                sig.append(("int" if t.cls == INT else "float",))
                after.append((t, None, code))
        name = self.session.request(target, tuple(sig), e, self.src)
        self.emit("UNCALL" if inverse else "CALL", FuncRef(name), *regs)
        for x, mem, code in reversed(after):
            if mem is not None:
                self.emit("EXCH", x, mem)
            self.code += invert(code, self.fresh)
            self.release(x)

    def resolve_function(self, f):
        name = self.callee_name(f)
        value = self.env(ast.unparse(f))
        if value is None or not hasattr(value, "pyfunc"):
            kind = "an unknown name" if value is None else "an ordinary Python function"
            raise self.error(f, f"{ast.unparse(f)!r} is {kind}, not a reversible function",
                             f"decorate {name} with @rvm.reversible")
        return value

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
            var = self.variable(e)
            if var.kind == "array":
                raise self.error(e, f"{var.name} is an array; use an element {var.name}[i]")
            return var.kind
        if isinstance(e, ast.Subscript):
            if isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
                return "int"
            var = self.variable(e.value) if isinstance(e.value, ast.Name) else None
            if var is None or var.kind != "array":
                raise self.error(e, "only array variables can be indexed")
            return "int" if var.dtype == INT else "float"
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, (ast.Div, ast.Pow)):
                self.typeof(e.left), self.typeof(e.right)
                return "float"
            kinds = {self.typeof(e.left), self.typeof(e.right)}
            if type(e.op) not in (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod,
                                  ast.BitAnd, ast.BitOr):
                raise self.error(e, f"operator {type(e.op).__name__} is not supported")
            return "float" if "float" in kinds else "int"
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            return self.typeof(e.operand)
        if isinstance(e, ast.Call):
            name = self.callee_name(e.func)
            if name == "len":
                return "int"
            if name == "abs" and len(e.args) == 1:
                return self.typeof(e.args[0])
            if name in FUNCS:
                for a in e.args:
                    self.typeof(a)
                return "float"
            raise self.error(e, f"{name}() cannot be used in an expression",
                             "call reversible functions as statements: f(x, y)")
        if isinstance(e, (ast.Compare, ast.BoolOp)):
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

    def no_self_reference(self, target, value, node) -> None:
        """The target may not be read by its own update. An array target may read other
        elements of its array: a run-time check then makes sure the indices differ."""
        name = next(iter(self.base_names(target)), None)
        if name is None or name not in self.value_names(value):
            return
        reads = [n for n in ast.walk(value) if isinstance(n, ast.Subscript)
                 and isinstance(n.value, ast.Name) and n.value.id == name]
        whole = self.value_names(value) - {name} | (
            {name} if any(isinstance(n, ast.Name) and n.id == name for n in
                          self.outside_subscripts(value, name)) else set())
        if isinstance(target, ast.Subscript) and name not in whole and reads and \
                not isinstance(target.slice, ast.Tuple):
            for r in reads:
                if isinstance(r.slice, ast.Tuple):
                    break
                self.with_operands([target.slice, r.slice],
                                   lambda ops: self.emit("ASSERT.NE", *ops), INT)
            else:
                return
        raise self.error(node, f"{name} occurs on both sides", "the target of an "
                         "accumulation may not be read by it: use a temporary "
                         "(with ancilla(t=0.0): t += ...; y += ... t ...; t -= ...)")

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
