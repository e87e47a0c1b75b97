"""Complex numbers in the reversible Python subset, as pairs of float registers.

A complex scalar is two float registers, its real and its imaginary part; a complex array
of length n is an n x 2 float array on the heap (numpy's complex128 layout). Nothing new
runs on the machine: each statement that involves complex values is rewritten into real
statements over the parts, which the rest of the compiler lowers as usual.

    z += w * x         z.real += w.real * x.real - w.imag * x.imag
                       z.imag += w.real * x.imag + w.imag * x.real
    z *= exp(1j * t)   rot(z.real, z.imag, t)                       (a phase: ROT)
    z *= w             z.real *= |w|; z.imag *= |w|; rot(z.real, z.imag, arg w)
                       (|w| and arg w in ancillas, computed and uncomputed around it)

The parts of a scalar z are the variables "z.real" and "z.imag" (not identifiers, so they
cannot clash with a user's names); those of A[i] are A[i, 0] and A[i, 1]. In a real
expression, `z.real`, `z.imag`, `abs(z)`, `np.real(z)` and `np.imag(z)` are real.
"""

from __future__ import annotations

import ast

import numpy as np

from .expressions import FLOAT, Var

PARTS = ("real", "imag")
CONJ = ("conj", "conjugate")
ELEMENTARY = ("exp", "log")
OWN = {ast.AugAssign: ("target", "value"), ast.Assign: ("targets", "value"),   # a statement's
       ast.Expr: ("value",), ast.If: ("test",), ast.While: ("test",),          # expressions
       ast.For: ("iter",), ast.Assert: ("test",)}


# ---------------------------------------------------------------- building real trees
def _num(v: float) -> ast.Constant:
    return ast.Constant(float(v))


def _is_num(e, v: float) -> bool:
    return isinstance(e, ast.Constant) and not isinstance(e.value, bool) and e.value == v


def add(a, b):
    if a is None:
        return b
    return a if b is None else ast.BinOp(a, ast.Add(), b)


def sub(a, b):
    if b is None:
        return a
    return neg(b) if a is None else ast.BinOp(a, ast.Sub(), b)


def neg(a):
    return None if a is None else ast.UnaryOp(ast.USub(), a)


def mul(a, b):
    if a is None or b is None:
        return None
    for x, y in ((a, b), (b, a)):
        if _is_num(x, 1.0):
            return y
        if _is_num(x, -1.0):
            return neg(y)
    return ast.BinOp(a, ast.Mult(), b)


def div(a, b):
    return None if a is None else ast.BinOp(a, ast.Div(), b)


def call(name: str, *args):
    return ast.Call(ast.Name(name, ast.Load()), list(args), [])


def norm2(re, im):
    """re * re + im * im (either may be None, meaning zero)."""
    return add(mul(re, re), mul(im, im)) or _num(0.0)


def located(tree, at):
    """tree with at's position on every node that has none (errors point at the source)."""
    if tree is None:
        return None
    for n in ast.walk(tree):
        if isinstance(n, (ast.expr, ast.stmt)) and not hasattr(n, "lineno"):
            ast.copy_location(n, at)
            n.end_lineno, n.end_col_offset = getattr(at, "end_lineno", None), \
                getattr(at, "end_col_offset", None)
    return tree


class Complexes:
    """The complex half of the statement compiler (mixed into FunctionCompiler)."""

    # ------------------------------------------------------------ what is complex
    def complex_constant(self, e):
        """The value of a complex literal or constant from the enclosing scope, or None."""
        if isinstance(e, ast.Constant) and isinstance(e.value, complex):
            return e.value
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            v = self.complex_constant(e.operand)
            return None if v is None else (-v if isinstance(e.op, ast.USub) else v)
        if isinstance(e, (ast.Name, ast.Attribute)):
            if isinstance(e, ast.Name) and self.lookup(e.id) is not None:
                return None
            value = self.env(ast.unparse(e))
            if isinstance(value, (complex, np.complexfloating)):
                return complex(value)
        return None

    def complex_array(self, e) -> Var | None:
        """The array of A[i], for A a complex array indexed by one index; else None."""
        if isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name) and \
                not isinstance(e.slice, ast.Tuple):
            var = self.lookup(e.value.id)
            if var is not None and var.complex:
                return var
        return None

    def is_complex(self, e) -> bool:
        if self.complex_constant(e) is not None:
            return True
        if isinstance(e, ast.Name):
            var = self.lookup(e.id)
            return var is not None and var.kind == "complex"
        if isinstance(e, ast.Subscript):
            return self.complex_array(e) is not None
        if isinstance(e, ast.BinOp):
            return self.is_complex(e.left) or self.is_complex(e.right)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            return self.is_complex(e.operand)
        if isinstance(e, ast.Call):
            name = self.callee_name(e.func)
            if name in ("complex",) + CONJ:
                return True
            if name in ELEMENTARY + ("sqrt", "sin", "cos", "tanh"):
                return any(self.is_complex(a) for a in e.args)
        return False

    def mentions_complex(self, e) -> bool:
        """Does e contain a complex value anywhere (also under .real, abs, ...)?"""
        return any(self.is_complex(n) for n in ast.walk(e) if isinstance(n, ast.expr))

    # ------------------------------------------------------------ splitting
    def parts(self, e) -> tuple:
        """(real part, imaginary part) of a complex expression as real expression trees;
        None stands for an exact zero."""
        return tuple(located(p, e) for p in self._parts(e))

    def _parts(self, e) -> tuple:
        c = self.complex_constant(e)
        if c is not None:
            return (_num(c.real) if c.real else None, _num(c.imag) if c.imag else None)
        if not self.is_complex(e):
            return self.real(e), None
        if isinstance(e, ast.Name):
            return tuple(ast.Name(f"{e.id}.{p}", ast.Load()) for p in PARTS)
        if isinstance(e, ast.Subscript):
            return tuple(ast.Subscript(e.value, ast.Tuple([e.slice, ast.Constant(k)],
                                                          ast.Load()), ast.Load())
                         for k in (0, 1))
        if isinstance(e, ast.UnaryOp):
            a, b = self.parts(e.operand)
            return (neg(a), neg(b)) if isinstance(e.op, ast.USub) else (a, b)
        if isinstance(e, ast.BinOp):
            (a, b), (c, d) = self.parts(e.left), self.parts(e.right)
            if isinstance(e.op, ast.Add):
                return add(a, c), add(b, d)
            if isinstance(e.op, ast.Sub):
                return sub(a, c), sub(b, d)
            if isinstance(e.op, ast.Mult):
                return sub(mul(a, c), mul(b, d)), add(mul(a, d), mul(b, c))
            if isinstance(e.op, ast.Div):
                if c is None and d is None:
                    raise self.error(e.right, "division by zero")
                if d is None:
                    return div(a, c), div(b, c)
                den = norm2(c, d)
                return div(add(mul(a, c), mul(b, d)), den), div(sub(mul(b, c), mul(a, d)), den)
            op = {ast.Pow: "**", ast.FloorDiv: "//", ast.Mod: "%"}.get(type(e.op),
                                                                     type(e.op).__name__)
            raise self.error(e, f"{op} is not supported on complex values",
                             "complex expressions use + - * /, conj, exp, log, abs, .real "
                             "and .imag; write z * z for a square")
        name = self.callee_name(e.func)
        args = [e.func.value] if name == "conjugate" and isinstance(e.func, ast.Attribute) \
            else list(e.args)
        if name == "complex":
            if not 1 <= len(args) <= 2 or e.keywords:
                raise self.error(e, "complex(re, im) takes one or two real arguments")
            for a in args:
                if self.is_complex(a):
                    raise self.error(a, "complex(re, im) takes real arguments")
            return self.real(args[0]), self.real(args[1]) if len(args) == 2 else None
        if len(args) != 1 or e.keywords:
            raise self.error(e, f"{name} takes one argument")
        a, b = self.parts(args[0])
        if name in CONJ:
            return a, neg(b)
        if name == "exp":       # e^a (cos b + i sin b)
            if b is None:
                return call("exp", a or _num(0.0)), None
            r = call("exp", a) if a is not None else None
            cos, sin = call("cos", b), call("sin", b)
            return (mul(r, cos) if r is not None else cos), (mul(r, sin) if r is not None
                                                             else sin)
        if name == "log":       # log |z| + i arg z
            return (call("log", call("sqrt", norm2(a, b))),
                    call("atan2", b or _num(0.0), a or _num(0.0)))
        raise self.error(e, f"{name} of a complex value is not supported",
                         "complex expressions use + - * /, conj, exp, log, abs, .real and "
                         ".imag")

    def real(self, e):
        """A real expression with its complex projections (z.real, z.imag, abs(z),
        np.real(z), np.imag(z)) replaced by real expressions over the parts."""
        if isinstance(e, ast.Attribute) and e.attr in PARTS and self.is_complex(e.value):
            return self.parts(e.value)[PARTS.index(e.attr)] or located(_num(0.0), e)
        if isinstance(e, ast.Call) and len(e.args) == 1 and self.is_complex(e.args[0]):
            name = self.callee_name(e.func)
            if name in PARTS:
                return self.parts(e.args[0])[PARTS.index(name)] or located(_num(0.0), e)
            if name == "abs":
                a, b = self.parts(e.args[0])
                if b is None:
                    return located(call("abs", a or _num(0.0)), e)
                return located(call("sqrt", norm2(a, b)), e)
        if not isinstance(e, ast.AST) or isinstance(e, (ast.Name, ast.Constant)):
            return e
        out = type(e)(**{f: ([self.real(x) for x in v] if isinstance(v, list)
                             else self.real(v)) for f, v in ast.iter_fields(e)})
        return ast.copy_location(out, e) if hasattr(e, "lineno") else out

    # ------------------------------------------------------------ statements
    def complex_statement(self, s):
        """s with its complex parts rewritten into real statements: the statement to
        compile, or None when the complex code has been emitted here."""
        fields = OWN.get(type(s))
        if fields is None:
            return s
        own = [getattr(s, f) for f in fields]
        own = [x for v in own for x in (v if isinstance(v, list) else [v])]
        if not any(self.mentions_complex(x) for x in own):
            return s
        if isinstance(s, ast.AugAssign):
            if self.is_complex(s.target):
                return self.complex_update(s)
            if self.is_complex(s.value):
                raise self.error(s.value, "a real target cannot absorb a complex value",
                                 "accumulate into a complex variable, or take .real, .imag "
                                 "or abs(...)")
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Tuple) and \
                any(self.is_complex(t) for t in s.targets[0].elts):
            return self.complex_swap(s)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            name = self.callee_name(s.value.func)
            if name == "neg" and len(s.value.args) == 1 and self.is_complex(s.value.args[0]):
                for p in self.target_parts(s.value.args[0]):
                    self.statement(located(ast.Expr(call("neg", p)), s))
                return None
            if name in ("rot", "irot") and any(map(self.is_complex, s.value.args)):
                raise self.error(s.value, f"{name} rotates two real values",
                                 "rotate a complex z by an angle t with z *= exp(1j * t)")
            if name not in ("neg", "rot", "irot", "print"):
                return s            # a call passes complex variables as they are
        out = type(s)(**{f: v for f, v in ast.iter_fields(s)})
        for f in fields:
            v = getattr(s, f)
            setattr(out, f, [self.real(x) for x in v] if isinstance(v, list) else self.real(v))
        return ast.copy_location(out, s)

    def target_parts(self, t) -> tuple:
        if not (isinstance(t, ast.Name) or self.complex_array(t) is not None):
            raise self.error(t, "the target must be a complex variable or an element of a "
                             "complex array")
        return self.parts(t)

    def complex_update(self, s) -> None:
        """z += e, z -= e, z *= e, z /= e on a complex target."""
        zr, zi = self.target_parts(s.target)
        name = next(iter(self.base_names(s.target)))
        if name in self.value_names(s.value):
            raise self.error(s, f"{name} occurs on both sides",
                             "the two halves of a complex update read each other's parts: "
                             "use a complex temporary (with ancilla(t=0j): ...)")
        if isinstance(s.op, (ast.Add, ast.Sub)):
            for t, v in zip((zr, zi), self.parts(s.value)):
                if v is not None:
                    self.statement(located(ast.AugAssign(t, s.op, v), s))
            return
        if not isinstance(s.op, (ast.Mult, ast.Div)):
            op = {ast.BitXor: "^=", ast.Pow: "**=", ast.FloorDiv: "//=", ast.Mod: "%="}.get(
                type(s.op), type(s.op).__name__)
            raise self.error(s, f"{op} does not apply to complex values",
                             "use +=, -=, *= or /=")
        if not self.is_complex(s.value):                  # a real factor
            v = self.real(s.value)
            for t in (zr, zi):
                self.statement(located(ast.AugAssign(t, s.op, v), s))
            return
        rotate = "rot" if isinstance(s.op, ast.Mult) else "irot"
        e = s.value
        if isinstance(e, ast.Call) and self.callee_name(e.func) == "exp" and \
                len(e.args) == 1:
            a, b = self.parts(e.args[0])
            if a is None:                                 # exp(i t): a phase, exactly
                self.statement(located(ast.Expr(call(rotate, zr, zi, b or _num(0.0))), s))
                return
        a, b = self.parts(e)      # |w| and arg w in ancillas around a scale and a rotation
        r, t = self.fresh("cmul") + ".modulus", self.fresh("cmul") + ".angle"
        modulus, angle = call("sqrt", norm2(a, b)), call("atan2", b or _num(0.0),
                                                        a or _num(0.0))
        body = [ast.AugAssign(ast.Name(r, ast.Store()), ast.Add(), modulus),
                ast.AugAssign(ast.Name(t, ast.Store()), ast.Add(), angle),
                ast.AugAssign(zr, s.op, ast.Name(r, ast.Load())),
                ast.AugAssign(zi, s.op, ast.Name(r, ast.Load())),
                ast.Expr(call(rotate, zr, zi, ast.Name(t, ast.Load()))),
                ast.AugAssign(ast.Name(t, ast.Store()), ast.Sub(), angle),
                ast.AugAssign(ast.Name(r, ast.Store()), ast.Sub(), modulus)]
        block = ast.With([ast.withitem(ast.Call(ast.Name("ancilla", ast.Load()), [], [
            ast.keyword(r, _num(0.0)), ast.keyword(t, _num(0.0))]))], body)
        self.statement(located(block, s))

    def complex_swap(self, s) -> None:
        a, b = s.targets[0].elts
        if not (self.is_complex(a) and self.is_complex(b)):
            raise self.error(s, "swap needs two values of the same type (both complex)")
        for pa, pb in zip(self.target_parts(a), self.target_parts(b)):
            self.statement(located(ast.Assign([ast.Tuple([pa, pb], ast.Store())],
                                              ast.Tuple([pb, pa], ast.Load())), s))

    # ------------------------------------------------------------ declarations
    def complex_ancilla(self, name: str, value) -> tuple[Var, object]:
        """A complex ancilla initialised to a complex value: the variable, and the code
        that clears it at the end of its block."""
        var = Var(name, "complex", (self.reg(FLOAT), self.reg(FLOAT)))
        init = self.parts(value)
        for r, p in zip(var.regs, init):
            self.emit("ZERO", r)        # (its shadow cleared where a gradient pass leaves)
            if p is not None:
                self.accumulate(r, 1, p, value)

        def free():
            for r, p in zip(var.regs, init):
                if p is not None:
                    self.accumulate(r, -1, p, value)
                self.emit("ZERO", r)
            self.release(*var.regs)
        return var, free
