"""Compile the reversible Python subset (docs/language.md) to rvm bytecode.

One `FunctionCompiler` per function and argument signature. Statements lower to
instructions directly; structured control flow becomes paired branches and comefroms;
compound expressions go through temporaries that are computed, used, and uncomputed by
emitting the inverse of the code that computed them. Every instruction carries the Python
line it came from (the source map).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from ..core import isa
from ..core.inverse import invert, relabel
from ..core.program import FuncRef, Function, Imm, Label, Reg
from ..engines.arguments import convert
from .arrays import Arrays
from .arrays import statement as array_statement
from .complexes import Complexes
from .expressions import COMPARE, FLOAT, INT, Lowering, Var


def is_function(value) -> bool:
    """A reversible function, or a transformed one (rvm.adjoint / rvm.tangent)?"""
    return hasattr(value, "specialize") or (hasattr(value, "lower") and   # (a str has one)
                                            not isinstance(value, (str, bytes)))


_PLAIN = {float: ("float",), int: ("int",)}


def sig_of(value, n: int | str = 0, fname: str = "") -> tuple:
    """The argument signature of a Python value (argument n of fname, for a refusal); a
    function argument is part of the signature itself (one compiled copy per function
    passed); ("other",) for a value that is none of rvm's kinds."""
    kind = _PLAIN.get(type(value))
    if kind is not None:                    # (the common case, first)
        return kind
    import numpy as np
    if is_function(value):
        return ("function", value)
    value = convert(value, n, fname)        # lists, 0-d arrays, other dtypes as rvm takes them
    if isinstance(value, np.ndarray):
        kind = value.dtype.kind
        return ("array", FLOAT if kind == "f" else "c" if kind == "c" else INT, value.ndim)
    if isinstance(value, complex):
        return ("complex",)
    if isinstance(value, (bool, np.bool_)):
        return ("int",)
    if isinstance(value, (int, np.integer)):
        return ("int",)
    if isinstance(value, (float, np.floating)):
        return ("float",)
    return ("other",)


def parse_annotation(ann, env: Callable[[str], Any]) -> tuple | None:
    """float / int / Array[float] / Array[int, 2] (also quoted) -> a signature, or None
    (infer from the arguments); ValueError for an annotation that is none of these."""
    if ann is None:
        return None
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):   # "Array[float]"
        try:
            ann = ast.parse(ann.value, mode="eval").body
        except SyntaxError:
            raise ValueError(f"cannot read the annotation {ann.value!r}") from None
    text = ast.unparse(ann).replace(" ", "")
    base = text.split(".")[-1]
    if base in ("float", "int", "complex"):
        return (base,)
    if "Array[" in text:
        inner = text[text.index("[") + 1:-1].split(",")
        dtype = inner[0].split(".")[-1]
        rank = inner[1] if len(inner) > 1 else "1"
        if dtype not in ("float", "int", "complex") or rank not in ("1", "2") or \
                len(inner) > 2 or (dtype == "complex" and rank != "1"):
            raise ValueError(f"{text} is not an array type: write Array[float], "
                             "Array[int], Array[float, 2], Array[int, 2] or Array[complex]")
        return ("array", {"float": FLOAT, "int": INT, "complex": "c"}[dtype], int(rank))
    return None


class FunctionCompiler(Complexes, Lowering):
    """Compiles one Python function (an ast.FunctionDef) for one argument signature."""

    # ------------------------------------------------------------------ entry
    def compile(self) -> tuple[Function, list[str]]:
        params, names = [], []
        args = self.node.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.defaults:
            raise self.error(self.node, "reversible functions take plain positional "
                             "parameters only (no *args, **kwargs, defaults)")
        for arg, sig in zip(args.args, self.sig):
            if sig[0] == "function":          # bound at compile time: no register
                self.function_args[arg.arg] = sig[1]
                continue
            if sig == ("array", "c", 1):       # n x 2 floats
                var = Var(arg.arg, "array", tuple(self.reg(INT) for _ in range(3)), FLOAT,
                          complex=True)
            elif sig[0] == "array":
                if sig[1] == "c":
                    raise self.error(arg, f"{arg.arg} is a {sig[2]}-D complex array; complex "
                                     "arrays must be 1-D")
                regs = (self.reg(INT),) + tuple(self.reg(INT) for _ in range(sig[2]))
                var = Var(arg.arg, "array", regs, sig[1])
            elif sig[0] == "complex":
                var = Var(arg.arg, "complex", (self.reg(FLOAT), self.reg(FLOAT)))
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
                      self.src.first - 1, end, tuple(names), tuple(self.symbols),
                      tuple(self.regions), tuple(self.outputs), tuple(self.checks))
        return fn, names

    # ------------------------------------------------------------------ statements
    def body(self, stmts: list) -> None:
        for s in stmts:
            self.line = s.lineno
            self.statement(s)

    def statement(self, s) -> None:
        s = self.complex_statement(s)       # complex values become their real parts
        if s is None:
            return
        if isinstance(s, (ast.AugAssign, ast.Assign, ast.Expr)):
            s = Arrays(self).untransposed(s)    # A.T[i, j:k] as A[j:k, i]
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
        if Arrays(self).handles(s):         # x, y = y, x of arrays; y = e is refused
            return array_statement(self, s)
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
        if Arrays(self).handles(s):         # whole arrays and slices (arrays.py)
            return array_statement(self, s)
        op = type(s.op)
        target = s.target
        self.no_index_alias([target], "update")
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
                start = len(self.code)
                self.code += invert(self.routines[e.operand.id], self.fresh)
                self.regions.append((e.operand.id, "uncompute", start, len(self.code)))
                return
            if isinstance(e.operand, ast.Call):
                return self.call(e.operand, inverse=True)
            raise self.error(e, "~ applies to a call, or to the name of a compute block",
                             "write ~f(x, y), (~f)(x, y), or ~r after 'with compute() as r:'")
        if isinstance(e, ast.Call):
            fname = self.callee_name(e.func)
            if fname in ("neg", "rot", "irot"):
                if Arrays(self).handles(s):
                    return array_statement(self, s)
                return self.builtin(e, fname)
            if fname == "print":
                return self.output(e)
            if fname in ("loop", "delocal"):
                block = "with from_(...)" if fname == "loop" else "with ancilla(...)"
                raise self.error(e, f"{fname}() belongs at the end of a {block} block")
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
        # while (pre, post): body  is Janus's  from not post loop body until not pre
        self.loop(s, post, [], s.body, pre, negated=True)

    def loop(self, s, entry, first: list, then: list, until, negated: bool = False) -> None:
        """Janus's loop, `from entry do first loop then until until`: entry holds on entry
        and never after a pass; first runs; the loop ends when until holds, else then runs
        and the loop goes round. `negated`: entry and until are given negated."""
        flip = (lambda cc: isa.NEGATED[cc]) if negated else (lambda cc: cc)
        self.line = entry.lineno
        entry_code, (ecc, ea, eb) = self.capture(lambda: self.condition(entry))
        top, ex, back, done = (self.fresh(x) for x in ("loop", "exit", "back", "done"))
        self.code += entry_code
        # entered by the back jump exactly when entry does not hold
        self.emit(f"CF.{isa.NEGATED[flip(ecc)]}", ea, eb, Label(back), label=top)
        self.code += invert(entry_code, self.fresh)
        self.scoped(first)
        self.line = until.lineno
        until_code, (ucc, ua, ub) = self.capture(lambda: self.condition(until))
        self.code += until_code
        self.emit(f"BR.{flip(ucc)}", ua, ub, Label(done), label=ex)
        self.code += invert(until_code, self.fresh)
        self.scoped(then)
        self.line = entry.lineno
        self.code += relabel(entry_code, self.fresh)
        self.emit("JMP", Label(top), label=back)
        self.line = until.lineno
        self.emit("CF", Label(ex), label=done)
        self.code += invert(relabel(until_code, self.fresh), self.fresh)

    def from_loop(self, s, call) -> None:
        """with from_(entry, until=exit): first; loop(); then  (Janus's from-do-loop)."""
        until = [k.value for k in call.keywords if k.arg == "until"]
        if len(call.args) != 1 or len(until) != 1 or len(call.keywords) != 1:
            raise self.error(call, "write with from_(entry, until=exit): ...",
                             "the entry condition holds on entry and never after a pass; "
                             "the loop ends when exit holds")
        cut = [k for k, st in enumerate(s.body) if self.is_marker(st, "loop")]
        if len(cut) > 1:
            raise self.error(s.body[cut[1]], "one loop() per from_ block")
        first, then = (s.body[:cut[0]], s.body[cut[0] + 1:]) if cut else (s.body, [])
        self.loop(s, call.args[0], first, then, until[0])

    def is_marker(self, st, name: str) -> bool:
        return isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and \
            self.callee_name(st.value.func) == name

    def stmt_Assert(self, s, said: tuple | None = None) -> None:
        """assert cond: checked whenever the statement runs, in either direction. said: a
        check the compiler made for a statement, (message, the text of the two sides,
        hint, shown): kept with the function to explain its failure (made_check)."""
        if isinstance(s.test, ast.Constant):
            if s.test.value:
                return
            t = self.reg(INT)                  # assert False: an error when reached
            self.emit("ASSERT.NE", t, Imm(0))
            self.release(t)
            return
        code, (cc, a, b) = self.capture(lambda: self.condition(s.test))
        self.code += code
        before = len(self.code)
        self.emit(f"ASSERT.{cc}", a, b)
        if said is not None and len(self.code) > before:   # (not a check that holds)
            self.made_check(s.test, cc, self.code[-1][1], *said)
        self.code += invert(code, self.fresh)

    def made_check(self, test, cc: str, ins, message: str, operands: tuple, hint: str,
                   shown: str) -> None:
        """Keep what a check the compiler made means (Function.checks), by its line,
        operation and operands: two checks alike on one line (two statements whose
        temporaries are the same registers) that mean different things are kept as one
        whose meaning is not known (no message rather than the other statement's)."""
        compared = type(test.ops[0]) if isinstance(test, ast.Compare) else None
        if COMPARE.get(compared) != cc:         # (the sides as the ASSERT has them)
            operands = ()
        made = (ins.line, ins.op, ins.args, message, operands, hint, shown)
        for k, other in enumerate(self.checks):
            if other[:3] == made[:3]:
                if other != made:
                    self.checks[k] = (*made[:3], None, (), "", "")
                return
        self.checks.append(made)

    def output(self, e) -> None:
        """print(...): text and variables, printed whenever the statement runs (in either
        direction; on the interpreter). Keyword sep as in Python."""
        sep = " "
        for k in e.keywords:
            if k.arg != "sep" or not isinstance(k.value, ast.Constant) or \
                    not isinstance(k.value.value, str):
                raise self.error(k.value, "print takes text, variables and sep='...'")
            sep = k.value.value
        parts: list = []
        for a in e.args:
            if parts and sep:
                parts.append(sep)
            if isinstance(a, ast.Constant) and isinstance(a.value, str | int | float):
                parts.append(str(a.value))
                continue
            style = None
            if isinstance(a, ast.Call) and len(a.args) == 1 and \
                    self.callee_name(a.func) in ("janus", "stack", "size", "chars"):
                style, a = self.callee_name(a.func), a.args[0]
            var = self.variable(a)
            if var.kind == "array":
                kind = style or ("floats" if var.dtype == FLOAT else "ints")
                if kind == "chars" and var.dtype == FLOAT:
                    raise self.error(a, "chars(...) shows an int array's cells as text")
                if var.complex:
                    raise self.error(a, "print shows real values; print the parts of a "
                                     "complex array's elements")
            else:
                kind = var.kind
            parts.append((kind, var.regs))
        if self.lineno in dict(self.outputs):
            raise self.error(e, "one output statement per line",
                             "put the second print on a line of its own")
        self.outputs.append((self.lineno, tuple(parts)))
        self.emit("NOP")

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
        dim = self.dimension_bound(s, start, stop, step)
        if dim is not None:
            self.in_range[i] = dim
        self.body(s.body)
        self.in_range.pop(i, None)
        self.scopes.pop()
        self.line = s.lineno
        self.emit("ADD", i, Imm(step))
        self.emit("BR.LT" if up else "BR.GT", i, b, Label(top), label=again)
        # i = a + n * step now, with n = ceil((b - a) / step) trips: take n * step back out
        # (a step of 1 or -1 ends exactly on b: i - b + a)
        if abs(step) == 1:
            self.emit("SUB", i, b)
            self.emit("ADD", i, a)
        else:
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

    def dimension_bound(self, s, start, stop, step: int) -> Reg | None:
        """The array dimension register a loop counter stays within, if the loop is
        `for i in range(c, len(A))` or `range(c, A.shape[k])` (or up to a variable equal
        to a dimension, see self.dims) with c >= 0 (see non_negative) and a positive step, and
        nothing in the body can change i (it is not passed to a call): A[i] then needs no
        bounds check."""
        if step < 0 or not self.non_negative(start) or self.passed(s.body, s.target.id):
            return None
        return self.dimension_of(stop)

    def non_negative(self, e) -> bool:
        """Is e provably >= 0: a constant, the counter of an enclosing loop that stays
        within a dimension, or a sum of those?"""
        c = self.constant_or_none(e)
        if c is not None:
            return isinstance(c, int) and c >= 0
        if isinstance(e, ast.Name):
            var = self.lookup(e.id)
            return var is not None and var.kind == "int" and var.reg in self.in_range
        return isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add) and \
            self.non_negative(e.left) and self.non_negative(e.right)

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
        if kind == "from_":
            return self.from_loop(s, item.context_expr)
        if kind == "compute":
            if not isinstance(item.optional_vars, ast.Name):
                raise self.error(s, "name the block: with compute() as r: ... then ~r",
                                 "~r inserts the inverse of the block (uncompute)")
            code, _ = self.capture(lambda: self.scoped(s.body))
            start = len(self.code)
            self.code += code
            self.routines[item.optional_vars.id] = code
            self.regions.append((item.optional_vars.id, "compute", start, len(self.code)))
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
        body, final = list(s.body), {}
        while body and self.is_marker(body[-1], "delocal"):     # the values at the end
            mark = body.pop().value
            for k in mark.keywords:
                final[k.arg] = (k.value, mark)
        names = {kw.arg for kw in call.keywords}
        for name, (_, mark) in final.items():
            if name not in names:
                raise self.error(mark, f"delocal names {name!r}, which this block does not "
                                 f"declare (it declares {', '.join(sorted(names))})")
        for kw in call.keywords:
            value = kw.value
            self.line = s.lineno
            if isinstance(value, ast.Call) and self.callee_name(value.func) == "zeros":
                if kw.arg in final:
                    raise self.error(final[kw.arg][1], "an ancilla array ends all zero; "
                                     "delocal(...) gives the final value of a scalar")
                var, free = self.new_array(kw.arg, value)
            elif self.is_complex(value):
                if kw.arg in final:
                    raise self.error(final[kw.arg][1], "delocal(...) takes real variables; "
                                     "end a complex ancilla at its initial value")
                var, free = self.complex_ancilla(kw.arg, value)
            else:
                kind = self.typeof(value)
                var = Var(kw.arg, kind, (self.reg(INT if kind == "int" else FLOAT),))
                if kind != "int":   # (0.0 already: ZERO's adjoint clears its shadow where a
                    # gradient pass leaves the block, which the code before would take on
                    # where it uses the register)
                    self.emit("ZERO", var.reg)
                init = None if self.is_zero(value) else value
                if init is not None:
                    self.accumulate(var.reg, 1, init, value)
                    same = self.dimension_of(init) if kind == "int" else None
                    if same is not None and kw.arg not in self.written(body) and \
                            not self.passed(body, kw.arg):
                        self.dims[var.reg] = same

                end = final.get(kw.arg)

                def free(var=var, init=init, node=value, end=end):
                    if end is not None:        # delocal(name=value): checked, then cleared
                        self.line = end[1].lineno
                        check = ast.Compare(left=ast.Name(var.name, ast.Load()),
                                            ops=[ast.Eq()], comparators=[end[0]])
                        self.stmt_Assert(ast.copy_location(ast.Assert(
                            ast.copy_location(check, end[0])), end[1]))
                        init, node = (None if self.is_zero(end[0]) else end[0]), end[0]
                    self.dims.pop(var.reg, None)
                    if init is not None:
                        self.accumulate(var.reg, -1, init, node)
                    self.emit("ZERO", var.reg)
                    self.release(var.reg)
            if kw.arg in scope or self.lookup(kw.arg):
                raise self.error(value, f"{kw.arg!r} is already a variable here")
            for v in self.entries(var).values():
                scope[v.name] = v
                self.record(v, s)
            undo.append(free)
        self.scopes.append(scope)
        self.body(body)
        self.line = s.lineno
        for free in reversed(undo):
            free()
        self.scopes.pop()

    def new_array(self, name: str, call) -> tuple[Var, Callable[[], None]]:
        dims = call.args[0] if call.args else None
        dims = list(dims.elts) if isinstance(dims, ast.Tuple) else [dims]
        dtype = FLOAT
        for extra in list(call.args[1:]) + [k.value for k in call.keywords]:
            word = ast.unparse(extra).split(".")[-1]
            dtype = INT if word in ("int", "int64") else "c" if word in (
                "complex", "complex128") else FLOAT
        if not 1 <= len(dims) <= 2 or dims[0] is None:
            raise self.error(call, "zeros(n) or zeros((rows, cols)) makes a 1-D or 2-D array")
        if dtype == "c":                    # n x 2 floats
            if len(dims) != 1:
                raise self.error(call, "complex arrays are 1-D: zeros(n, complex)")
            dims.append(ast.copy_location(ast.Constant(2), call))
        base = self.base_reg()
        regs = [self.reg(INT) for _ in dims]
        dim_code, _ = self.capture(lambda: [self.accumulate(r, 1, d, d)
                                            for r, d in zip(regs, dims)])
        self.code += dim_code
        for r, d in zip(regs, dims):
            same = self.dimension_of(d)
            if same is not None:
                self.dims[r] = same
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
            for r in regs:
                self.dims.pop(r, None)
            self.release(base, *regs)
        if dtype == "c":
            return Var(name, "array", (base, *regs), FLOAT, complex=True), free
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
            mark = len(self.address_temps)
            addr_code, (var, mem) = self.capture(lambda: self.address(target))
            self.code += addr_code
            x = self.reg(var.dtype)
            self.emit("EXCH", x, mem)
            action(x)
            self.emit("EXCH", x, mem)
            self.release(x)
            self.code += invert(addr_code, self.fresh)
            self.addresses_done(mark)
            return None
        raise self.error(target, "the target must be a variable or an array element")

    def swap(self, node, a, b) -> None:
        if not getattr(node, "index_reads_checked", False):     # (a Janus stack's push)
            self.no_index_alias([a, b], "swap")
        if ast.dump(a) == ast.dump(b):
            raise self.error(b, f"{ast.unparse(a)} is swapped with itself",
                             "a swap exchanges two different variables or elements")
        kinds = [isinstance(x, ast.Subscript) for x in (a, b)]
        if not any(kinds):
            va, vb = self.variable(a), self.variable(b)
            if va.kind != vb.kind or va.kind == "array":
                raise self.error(node, "swap needs two scalar variables of the same type")
            return self.emit("SWAP", va.reg, vb.reg)
        if not all(kinds):
            scalar, element = (b, a) if kinds[0] else (a, b)
            var = self.variable(scalar)
            array = self.lookup(element.value.id) if isinstance(element.value, ast.Name) \
                else None
            if var.kind in ("int", "float") and array is not None and \
                    array.kind == "array" and not array.complex and array.dtype == var.cls:
                # an element of the scalar's own type: one exchange
                mark = len(self.address_temps)
                addr_code, (_, mem) = self.capture(lambda: self.address(element))
                self.code += addr_code
                self.emit("EXCH", var.reg, mem)
                self.code += invert(addr_code, self.fresh)
                self.addresses_done(mark)
                return None
            return self.into(element, lambda r: self.emit("SWAP", var.reg, r), node)
        # two elements: exchange through one temporary; same array needs distinct indices
        mark = len(self.address_temps)
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
        self.addresses_done(mark)

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
        self.no_index_alias(e.args[:min(want, 2)], name)
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
        mark = len(self.address_temps)
        self.no_call_alias(e.args)
        elements: list = []         # (array, node, offset) of the elements passed so far
        for a in e.args:
            value = self.function_value(a)
            if value is not None:             # a function argument: part of the signature
                sig.append(("function", value))
                continue
            if isinstance(a, ast.Name) and self.lookup(a.id):
                var = self.variable(a)
                if a.id in seen:
                    raise self.error(a, f"{a.id} is passed twice",
                                     "arguments are passed by reference; pass distinct "
                                     "variables")
                seen[a.id] = a
                regs += var.regs
                sig.append(var.sig)
            elif self.is_complex(a):        # an element or an expression: two floats
                for p in self.parts(a) if self.complex_array(a) else ():
                    code, (var, mem) = self.capture(lambda p=p: self.address(p))
                    self.code += code
                    x = self.reg(FLOAT)
                    self.emit("EXCH", x, mem)
                    regs.append(x)
                    after.append((x, mem, code))
                if not self.complex_array(a):
                    ts = (self.reg(FLOAT), self.reg(FLOAT))
                    code, _ = self.capture(lambda a=a, ts=ts: [
                        self.accumulate(t, 1, p, a) for t, p in zip(ts, self.parts(a))
                        if p is not None])
                    for t in ts:
                        self.emit("ZERO", t)    # (its shadow: see the float temporaries')
                    self.code += code
                    regs += ts
                    after += [(ts[0], None, []), (ts[1], None, code)]
                sig.append(("complex",))
            elif isinstance(a, ast.Subscript):
                code, (var, mem) = self.capture(lambda a=a: self.address(a))
                self.code += code
                off = mem.off if isinstance(mem.off, Reg) else Imm(mem.off)
                for array, other, other_off in elements:    # two elements of one array
                    if array == var.name:
                        if ast.dump(other.slice) == ast.dump(a.slice):
                            raise self.error(a, f"{ast.unparse(a)} is passed twice",
                                             "arguments are passed by reference; pass "
                                             "distinct variables")
                        self.emit("ASSERT.NE", other_off, off)
                elements.append((var.name, a, off))
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
                elif not self.is_temp(a):   # len(A), A.shape[k]: A's own register, copied
                    size, t = t, self.reg(t.cls)
                    code2, _ = self.capture(lambda t=t, size=size: self.emit("ADD", t, size))
                    code = code + code2
                if t.cls == FLOAT:
                    # a float temporary passed to a call takes a shadow from the callee's
                    # gradient; cleared before its compute (ZERO, whose adjoint clears the
                    # shadow where a gradient pass leaves the call) and after its uncompute
                    # (a sum's rounding residue), it does not reach the register's earlier
                    # or later uses (1.0 passed beside 1e17 left a shadow of 1e17 that took
                    # an earlier use's gradient of 1.0 with it)
                    self.emit("ZERO", t)
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
            if mem is None and x.cls == FLOAT:
                self.emit("ZERO", x)
            self.release(x)
        self.addresses_done(mark)

    def no_call_alias(self, args: list) -> None:
        """Arguments pass by reference and the callee may change each: an element's index
        may not read a variable passed (it is read again to put the element back), and
        an array may not be passed beside one of its elements."""
        passed = [a for a in args if isinstance(a, ast.Subscript) or (
            isinstance(a, ast.Name) and self.lookup(a.id) is not None)]
        self.no_index_alias(passed, "call")
        whole = {a.id for a in passed if isinstance(a, ast.Name)}
        for a in passed:
            if isinstance(a, ast.Subscript) and isinstance(a.value, ast.Name) and \
                    a.value.id in whole:
                raise self.error(a, f"{a.value.id} is passed beside its element "
                                 f"{ast.unparse(a)}", "arguments are passed by reference; "
                                 "pass distinct variables")

    def function_value(self, e):
        """The function a name stands for (a function parameter or one in scope), or None."""
        if not isinstance(e, (ast.Name, ast.Attribute)) or (
                isinstance(e, ast.Name) and self.lookup(e.id)):
            return None
        if isinstance(e, ast.Name) and e.id in self.function_args:
            return self.function_args[e.id]
        value = self.env(ast.unparse(e))
        return value if is_function(value) else None

    def resolve_function(self, f):
        name = self.callee_name(f)
        if isinstance(f, ast.Name) and f.id in self.function_args:
            return self.function_args[f.id]
        value = self.env(ast.unparse(f))
        if value is None or not (hasattr(value, "pyfunc") or hasattr(value, "lower")):
            kind = "an unknown name" if value is None else "an ordinary Python function"
            raise self.error(f, f"{ast.unparse(f)!r} is {kind}, not a reversible function",
                             f"decorate {name} with @rvm.reversible")
        return value

