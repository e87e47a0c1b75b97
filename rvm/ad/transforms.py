"""Derivatives as programs: `tangent` and `adjoint` turn a Program into a Program.

Both are built from the instruction table alone. A family row lists its partial derivatives
as expressions (`math.cos({a})`, `-{a} / ({b} * {b})`); this module lowers each partial into
ordinary family instructions on zeroed ancilla registers, uses it, and uncomputes it. So a
derivative program is made of the same instructions as any other, and is differentiated,
inverted, stepped, disassembled and run on every engine like any other program — including
again by these transforms (the partials of the partials come from the same rows).

tangent(f): (x..., xdot...) -> (F(x)..., J xdot...). Each float register gets a tangent
register; each float instruction is followed by its tangent rule. The rules are linear in
the tangents and invertible, so the inverse of the tangent program is the tangent of the
inverse, and it runs backwards like any program.

adjoint(f): (x..., ybar...) -> (x..., J^T ybar...). f runs forwards, then a *sweep* runs
f's bytecode inverse with each float instruction replaced by its adjoint: undo the value
change, then pull the shadows back. Where gradient mode drops a shadow (an ancilla's shadow
when its frame is entered), the sweep cannot: it would not be invertible. It pushes the
shadow onto the heap stack instead (the garbage), and the adjoint cleans up after
Bennett: sweep, copy the result, unsweep; then compute ybar back from the copy by the sweep
of f's inverse (J^-T), cancel ybar with it, and unsweep that. Six passes instead of two,
with garbage bounded by the drops of one sweep (one cell per float ancilla per call);
functions without float ancillas anywhere below them get the two-pass adjoint.

A call of an adjoint program inside f (rvm.adjoint(g) called from reversible code) is not
swept instruction by instruction: its garbage stack would share the heap top with f's.
The adjoint is linear in its shadows, so its own adjoint comes from tangent programs
(`_adjoint_sweeps`).

Arrays: both transforms run on an interleaved heap (each cell of f followed by its tangent
or its shadow); the adjoint's clean-up copies array shadows into private heap blocks. An
array instruction's views become views of every second cell (the values) and of the cells
between (the derivatives), and its rule is the scalar one on views (`_array_rule`).
f's blocks are doubled too; the adjoint's sweep leaves each where f allocated it, its
shadows holding the gradient of its initial value, for the clean-up (`_left`). Refused
with a clear error (TransformError): the stack (PUSH, POP) in an adjoint's input outside
calls of adjoints, which the sweep's garbage shares.
"""

from __future__ import annotations

import ast
import functools

import attrs

from ..core import isa
from ..core.errors import RvmError
from ..core.inverse import inverse_function
from ..core.program import FuncRef, Function, Imm, Instruction, Label, Mem, Program, Reg, View
from ..core.verify import verify
from ..engines.arrays import INTERLEAVED
from ..engines.compiled import DERIVED


class TransformError(RvmError):
    """A program a transform cannot (yet) turn into its derivative."""


# ------------------------------------------------------------------ partials as expressions

_FUNCTIONS = {"math.exp": "exp", "math.log": "log", "math.sin": "sin", "math.cos": "cos",
              "math.tanh": "tanh", "math.sqrt": "sqrt", "abs": "abs", "math.pow": "pow",
              "math.atan2": "atan2", "math.fmod": "mod", "sign": "sign",
              "math.trunc": "trunc"}
_BINARY = {ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow", ast.Mod: "mod"}


@functools.cache
def partials(family: str) -> tuple[ast.expr, ...]:
    """The family's partial derivatives (one per argument) as expressions over its argument
    names, read from the instruction table."""
    _, _, parts = isa.family(family)
    out = []
    for p in parts:
        text = p.replace("{", "").replace("}", "")
        # d(a**b)/db = a**b log a (the table's dpow_db also gives 0 where a <= 0)
        text = text.replace("dpow_db(a, b)", "math.pow(a, b) * math.log(a)")
        out.append(ast.parse(text, mode="eval").body)
    return tuple(out)


def _compared(e: ast.expr) -> tuple | None:
    """(a, b) of `(1.0 if a > b else 0.0)`, the gt family's value, else None."""
    if isinstance(e, ast.IfExp) and isinstance(e.test, ast.Compare) and \
            len(e.test.ops) == 1 and isinstance(e.test.ops[0], ast.Gt) and \
            ast.unparse(e.body) == "1.0" and ast.unparse(e.orelse) == "0.0":
        return e.test.left, e.test.comparators[0]
    return None


class _Code:
    """Instructions being emitted for one function, with labels and fresh registers."""

    def __init__(self, first_free_float: int, first_free_int: int = 0):
        self.out: list[tuple[list[str], Instruction]] = []
        self.pending: list[str] = []
        self.first_free = self.free = first_free_float
        self.high = first_free_float
        self.ints = first_free_int

    def emit(self, op: str, *args, line: int = 0) -> None:
        self.out.append((self.pending, Instruction(op, tuple(args), line)))
        self.pending = []

    def temp(self) -> Reg:
        r = Reg(isa.FLOAT, self.free)
        self.free += 1
        self.high = max(self.high, self.free)
        return r

    def int_temps(self, k: int) -> list[Reg]:
        """k integer registers that are zero around each use (the same ones every time)."""
        return [Reg(isa.INT, self.ints + j) for j in range(k)]

    def function(self, name: str, params: tuple) -> Function:
        labels = {label: i for i, (names, _) in enumerate(self.out) for label in names}
        return Function(name, params, tuple(ins for _, ins in self.out), labels)


class _Lowering:
    """Emit `acc (+|-)= factor * expression` with ordinary instructions: the expression is
    computed into zeroed temporaries, used, and uncomputed. (_ArrayLowering: the same
    with array instructions, `head` "V" and their shape after the operands.)"""

    head, shape = "", ()

    def __init__(self, code: _Code, env: dict, line: int):
        self.code, self.env, self.line = code, env, line
        self.compute: list[Instruction] = []

    def emit(self, op: str, *args) -> None:
        self.compute.append(Instruction(op, tuple(args), self.line))

    def temp(self):
        return self.code.temp()

    def atom(self, e: ast.expr):
        folded = self.constant(e)
        if folded is not None:
            return Imm(folded)
        if isinstance(e, ast.Name):
            return self.env[e.id]
        t = self.temp()
        self.into(t, e, 1)
        return t

    def constant(self, e: ast.expr):
        """e's value where it is made of constants and immediate operands (pow's `b - 1`
        for `x ** 2`), else None: a constant in a register would be an operand of the
        instruction that uses it, and a derivative of the derivative program would take
        a partial in it (pow's in its exponent is a^b log a: undefined for a < 0)."""
        if isinstance(e, ast.Constant) and type(e.value) in (int, float):
            return e.value
        if isinstance(e, ast.Name):
            v = self.env.get(e.id)
            return v.value if isinstance(v, Imm) else None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            v = self.constant(e.operand)
            return None if v is None else -v
        if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            a, b = self.constant(e.left), self.constant(e.right)
            if a is None or b is None:
                return None
            return a + b if isinstance(e.op, ast.Add) else a + -b   # (as the plus family)
        return None

    def into(self, t, e: ast.expr, sign: int) -> None:
        """t (+|-)= e."""
        add = self.head + ("ADD" if sign > 0 else "SUB")
        if isinstance(e, (ast.Name, ast.Constant)):
            self.emit(add, t, self.atom(e), *self.shape)
        elif isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            self.into(t, e.operand, -sign)
        elif isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
            # one instruction (the plus family), whose undo takes back exactly what it
            # added: two accumulations into t, taken apart, could leave a residue (a*a +
            # b*b - b*b - a*a), which the next use, or freeing t's block, would meet
            right = e.right if isinstance(e.op, ast.Add) else ast.UnaryOp(ast.USub(), e.right)
            self.emit(f"{add}.plus", t, self.atom(e.left), self.atom(right), *self.shape)
        elif isinstance(e, ast.BinOp) and type(e.op) in _BINARY:
            self.emit(f"{add}.{_BINARY[type(e.op)]}", t, self.atom(e.left), self.atom(e.right),
                      *self.shape)
        elif isinstance(e, ast.Call) and ast.unparse(e.func) in _FUNCTIONS:
            self.emit(f"{add}.{_FUNCTIONS[ast.unparse(e.func)]}", t,
                      *(self.atom(a) for a in e.args), *self.shape)
        elif (pair := _compared(e)) is not None:   # (1.0 if a > b else 0.0): gt's value
            self.emit(f"{add}.gt", t, *(self.atom(a) for a in pair), *self.shape)
        else:   # the table's partials use only the forms above
            raise TransformError(f"cannot lower the partial derivative {ast.unparse(e)!r}")

    def accumulate(self, acc: Reg, sign: int, factor: Reg, e: ast.expr) -> None:
        """acc (+|-)= factor * e, then uncompute e's temporaries."""
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return self.accumulate(acc, -sign, factor, e.operand)
        add = "ADD" if sign > 0 else "SUB"
        if isinstance(e, ast.Constant) and e.value == 0.0:
            return
        if isinstance(e, ast.Constant) and e.value == 1.0:
            self.emit(add, acc, factor)
        else:
            self.emit(f"{add}.mul", acc, factor, self.atom(e))
        done = self.compute
        self.compute = []
        # (each temporary takes one instruction, so its undo leaves exactly 0.0: see into)
        for ins in done:
            self.code.emit(ins.op, *ins.args, line=ins.line)
        # uncompute the temporaries: every instruction but the accumulations into acc
        for ins in reversed(done):
            if ins.args[0] != acc:
                self.code.emit(isa.OPS[ins.op].inverse, *ins.args, line=ins.line)
        self.code.free = self.code.first_free


# ------------------------------------------------------------------ the rules


def _family(op: str) -> tuple[int, str | None]:
    """(sign, family) of an accumulate instruction ADD / SUB / ADD.f / SUB.f."""
    head, _, fam = op.partition(".")
    return (1 if head == "ADD" else -1), (fam or None)


def _is_float(ins: Instruction) -> bool:
    written = ins.written
    return bool(written) and written[0].cls == isa.FLOAT


def _heap_free(program: Program, name: str, functions: list[str]) -> None:
    """Refuse the stack (PUSH, POP) in `functions` (those the adjoint of `name` sweeps):
    the sweep's own garbage shares the heap top with it."""
    for fname in functions:
        for i, ins in enumerate(program.functions[fname].code):
            if ins.op in ("PUSH", "POP"):
                raise TransformError(
                    f"adjoint of {name}: {fname} uses {ins.op} (instruction {i}); adjoint "
                    "programs do not use the stack, which their sweep's garbage shares: "
                    "rvm.grad, rvm.jacobian, rvm.hvp and rvm.hessian support the whole heap")


def reachable(program: Program, name: str, leaf=lambda f: False) -> list[str]:
    """name and every function it calls or uncalls, transitively, in a stable order (not
    looking inside the functions for which `leaf` holds)."""
    seen, todo = [name], [name]
    while todo:
        f = todo.pop()
        if leaf(f):
            continue
        for ins in program.functions[f].code:
            if ins.op in isa.CALLS and ins.args[0].name not in seen:
                seen.append(ins.args[0].name)
                todo.append(ins.args[0].name)
    return seen


def _shadow_map(fn: Function) -> tuple[dict, int]:
    """Each float register's shadow (or tangent) register: f(k + n_float)."""
    n = fn.n_float
    return {Reg(isa.FLOAT, k): Reg(isa.FLOAT, k + n) for k in range(n)}, 2 * n


def _named(fn: Function, derivative: dict, suffix: str) -> tuple:
    """The function's debug names, and `x_dot` / `x_bar` for each float variable's
    derivative register (so the debugger and pictures speak in the source's names)."""
    extra = tuple(attrs.evolve(s, name=f"{s.name}_{suffix}", regs=(derivative[s.regs[0]],))
                  for s in fn.symbols if len(s.regs) == 1 and s.regs[0] in derivative)
    return tuple(fn.symbols) + extra


def _float_params(fn: Function) -> list[Reg]:
    return [p for p in fn.params if p.cls == isa.FLOAT]


# ------------------------------------------------------------------ tangent


def _partials(code: _Code, ins: Instruction, acc_factor) -> None:
    """For `d (+|-)= F(args)`: for each argument x, acc (+|-)= factor * dF/dx, where
    (acc, factor) = acc_factor(x), or nothing where it gives None (no derivative)."""
    a = ins.args
    sign, fam = _family(ins.op)
    low = _Lowering(code, {}, ins.line)
    if fam is None:
        pairs = [(a[1], ast.Constant(1.0))]
    else:
        low.env = dict(zip(isa.FAMILIES[fam][0], a[1:]))
        pairs = list(zip(a[1:], partials(fam)))
    for x, partial in pairs:
        roles = acc_factor(x)
        if roles is not None:
            low.accumulate(roles[0], sign, roles[1], partial)


def _tangent_rule(code: _Code, ins: Instruction, tan: dict) -> None:
    """Emit ins and its tangent rule (tan maps float registers to tangent registers)."""
    op, a, line = ins.op, ins.args, ins.line
    t = lambda x: tan.get(x) if isinstance(x, Reg) else None
    if ins.spec.group in ("arith", "family") and op.split(".")[0] in ("ADD", "SUB"):
        code.emit(op, *a, line=line)             # d' (+|-)= x' * dF/dx
        _partials(code, ins, lambda x: (t(a[0]), t(x)) if t(x) is not None else None)
    elif op == "NEG":
        code.emit(op, *a, line=line)
        code.emit("NEG", t(a[0]), line=line)
    elif op == "SWAP":
        code.emit(op, *a, line=line)
        code.emit("SWAP", t(a[0]), t(a[1]), line=line)
    elif op in ("ROT", "IROT"):
        x, y, angle = a
        code.emit(op, *a, line=line)
        code.emit(op, t(x), t(y), angle, line=line)
        if t(angle) is not None:       # d/dt rotates by a right angle: (-y', x') or (y', -x')
            s = 1 if op == "ROT" else -1
            code.emit("SUB.mul" if s > 0 else "ADD.mul", t(x), t(angle), y, line=line)
            code.emit("ADD.mul" if s > 0 else "SUB.mul", t(y), t(angle), x, line=line)
    elif op == "MUL":                  # x' = x y: xdot' = xdot y + x ydot
        x, y = a
        code.emit("MUL", t(x), y, line=line)
        if t(y) is not None:
            code.emit("ADD.mul", t(x), x, t(y), line=line)
        code.emit(op, *a, line=line)
    elif op == "DIV":                  # x' = x / y: xdot' = (xdot - x' ydot) / y
        x, y = a
        code.emit(op, *a, line=line)
        if t(y) is not None:
            code.emit("SUB.mul", t(x), x, t(y), line=line)
        code.emit("DIV", t(x), y, line=line)
    elif op == "ZERO":
        code.emit(op, *a, line=line)
        code.emit("ZERO", t(a[0]), line=line)
    elif op == "PUSH":
        code.emit(op, *a, line=line)
        code.emit("PUSH", t(a[0]), line=line)
    elif op == "POP":
        code.emit("POP", t(a[0]), line=line)
        code.emit(op, *a, line=line)
    else:
        raise TransformError(f"no tangent rule for {op}")


# ------------------------------------------------------------------ memory, interleaved
# In a derivative program that uses the heap, heap cell c of f is cell 2c (its value) and
# cell 2c + 1 (its tangent). Integer registers keep f's addresses; each access computes
# the doubled address in zeroed integer temporaries, after asserting that f's address
# lies in 0 .. 2^62 - 1 (so doubling cannot wrap: an address f would refuse is refused).
LIMIT = 1 << 62
HALF = 1 << 61


def _address(code: _Code, mem, line: int) -> tuple[Reg, list[Instruction]]:
    """Emit the computation of 2 * (f's address of mem); (register, its uncompute)."""
    a, a2 = code.int_temps(2)
    steps = _doubling(mem, a, a2, line)
    for ins in steps:
        code.emit(ins.op, *ins.args, line=line)
    undo = [Instruction(isa.OPS[i.op].inverse, i.args, line) for i in reversed(steps)
            if not i.op.startswith("ASSERT")]
    return a2, undo


def _doubling(mem, a: Reg, a2: Reg, line: int) -> list[Instruction]:
    """The instructions that make a = f's address of mem (base + offset, checked to lie
    in 0 .. 2^62 - 1) and a2 = 2a, from zeroed a and a2."""
    off = mem.off
    steps = []
    if isinstance(off, Reg):
        steps += [Instruction(f"ASSERT.{cc}", (r, Imm(v)), line) for r in (mem.base, off)
                  for cc, v in (("GE", -HALF), ("LE", HALF))]
        steps += [Instruction("ADD", (a, mem.base), line), Instruction("ADD", (a, off), line)]
    else:
        if abs(off) > HALF:
            raise TransformError(f"heap offset {off} is too large for a derivative program "
                                 f"(at most 2^61)")
        steps += [Instruction("ASSERT.GE", (mem.base, Imm(-off)), line),
                  Instruction("ASSERT.LE", (mem.base, Imm(LIMIT - 1 - off)), line),
                  Instruction("ADD", (a, mem.base), line)]
        if off:
            steps.append(Instruction("ADD", (a, Imm(off)), line))
    return steps + [Instruction("ASSERT.GE", (a, Imm(0)), line),
                    Instruction("ASSERT.LT", (a, Imm(LIMIT)), line),
                    Instruction("ADD.mul", (a2, a, Imm(2)), line)]


def _memory_rule(code: _Code, ins: Instruction, tan: dict) -> None:
    """A heap instruction of f on the interleaved heap."""
    op, a, line = ins.op, ins.args, ins.line
    if op == "EXCH":
        x, mem = a
        addr, undo = _address(code, mem, line)
        code.emit("EXCH", x, Mem(addr), line=line)
        if x.cls == isa.FLOAT:
            code.emit("EXCH", tan[x], Mem(addr, 1), line=line)
        for u in undo:
            code.emit(u.op, *u.args, line=line)
    elif op in isa.READS:                  # the value cell, then the tangent cell
        x, mem = a
        addr, undo = _address(code, mem, line)
        code.emit(op, x, Mem(addr), line=line)
        if x.cls == isa.FLOAT and op not in isa.CONSTANT_READS:
            code.emit(op, tan[x], Mem(addr, 1), line=line)
        for u in undo:
            code.emit(u.op, *u.args, line=line)
    elif op in ("ALLOC", "FREE"):
        d, n = a
        t, n2 = code.int_temps(2)
        size = Imm(2 * n.value) if isinstance(n, Imm) else n2
        if isinstance(n, Reg):
            code.emit("ASSERT.LE", n, Imm(HALF), line=line)
            code.emit("ADD.mul", n2, n, Imm(2), line=line)
        if op == "ALLOC":                  # 2n cells
            _allocated(code, d, t, size, line)
        else:
            _addressed(code, d, t, line)
            code.emit("FREE", t, size, line=line)
        if isinstance(n, Reg):
            code.emit("SUB.mul", n2, n, Imm(2), line=line)
    elif op in ("PUSH", "POP"):            # a value cell, then its tangent cell
        x = a[0]
        partner = tan[x] if x.cls == isa.FLOAT else code.int_temps(1)[0]
        pair = [("PUSH", x), ("PUSH", partner)] if op == "PUSH" else \
            [("POP", partner), ("POP", x)]
        for o, r in pair:
            code.emit(o, r, line=line)
    else:
        raise TransformError(f"no memory rule for {op}")


def _allocated(code: _Code, d: Reg, t: Reg, cells, line: int) -> None:
    """A block of `cells` cells of the interleaved heap (its base into t, zero again
    after), f's address of it, base / 2, into d (zero before)."""
    code.emit("ASSERT.EQ", d, Imm(0), line=line)
    code.emit("ALLOC", t, cells, line=line)
    code.emit("ADD.div", d, t, Imm(2), line=line)
    code.emit("SUB.mul", t, d, Imm(2), line=line)


def _addressed(code: _Code, d: Reg, t: Reg, line: int) -> None:
    """The interleaved heap's address of f's block at d into t (zero before), d zero
    after: _allocated's address taken back."""
    code.emit("ADD.mul", t, d, Imm(2), line=line)
    code.emit("SUB.div", d, t, Imm(2), line=line)


def _read_adjoint(code: _Code, ins: Instruction, sh: dict) -> None:
    """The sweep's step for `ins`, the inverse of a read `x (+|-)= [m]` of f: undo the
    read, then the shadow cell (+|-)= x's shadow (through a zeroed temporary)."""
    x, mem = ins.args
    addr, undo = _address(code, mem, ins.line)
    code.emit(ins.op, x, Mem(addr), line=ins.line)
    if x.cls == isa.FLOAT and ins.op not in isa.CONSTANT_READS:
        t = code.temp()
        cell = Mem(addr, 1)
        for op in ("EXCH", isa.OPS[ins.op].inverse[:3], "EXCH"):
            code.emit(op, t, sh[x] if op != "EXCH" else cell, line=ins.line)
        code.free -= 1
    for u in undo:
        code.emit(u.op, *u.args, line=ins.line)


# ------------------------------------------------------------------ arrays
# An array instruction's views on the interleaved heap: f's view [a : s0, s1] holds its
# values in [2a : 2 s0, 2 s1] and their derivatives in [2a + 1 : 2 s0, 2 s1] (the two
# lattices never meet, so an update of one reading the other is not an overlap). The
# rules are the scalar ones, with views for registers; a partial derivative is lowered into
# array instructions on zeroed temporary blocks (ALLOC'd, used, uncomputed, freed), and a
# scalar's shadow takes a sum through a one-cell block (summed from zero and taken back
# out: exactly zero again).


def _doubled(code: _Code, ins: Instruction) -> tuple[dict, list[Instruction], int]:
    """{operand index: (value view, derivative view)} for ins's views, computed into
    integer temporaries (the next free one returned), and their uncompute."""
    line, steps, out = ins.line, [], {}
    at = [k for k, a in enumerate(ins.args) if isinstance(a, View)]
    regs = code.int_temps(4 * len(at))
    for j, k in enumerate(at):
        v = ins.args[k]
        a, a2, r0, r1 = regs[4 * j:4 * j + 4]
        steps += _doubling(v, a, a2, line)         # the start, as a cell's address
        strides = []
        for stride, r in ((v.s0, r0), (v.s1, r1)):
            if isinstance(stride, Reg):
                steps += [Instruction("ASSERT.GE", (stride, Imm(-HALF)), line),
                          Instruction("ASSERT.LE", (stride, Imm(HALF)), line),
                          Instruction("ADD.mul", (r, stride, Imm(2)), line)]
                strides.append(r)
            elif abs(stride) > HALF:
                raise TransformError(f"view stride {stride} is too large for a derivative "
                                     "program (at most 2^61)")
            else:
                strides.append(2 * stride)
        out[k] = (View(a2, 0, *strides), View(a2, 1, *strides))
    for step in steps:
        code.emit(step.op, *step.args, line=line)
    undo = [Instruction(isa.OPS[i.op].inverse, i.args, line) for i in reversed(steps)
            if not i.op.startswith("ASSERT")]
    return out, undo, code.ints + 4 * len(at)


def _transposed(v: View) -> View:
    return View(v.base, v.off, v.s1, v.s0)


class _ArrayLowering(_Lowering):
    """`acc (+|-)= factor * expression` element by element over an m x n shape, with
    array instructions: the expression into zeroed temporary blocks, used, uncomputed."""

    head = "V"

    def __init__(self, code: _Code, env: dict, shape: tuple, line: int, first_int: int):
        super().__init__(code, env, line)
        self.shape = self.m, self.n = shape
        self.ints = self.first = first_int
        self.size = None

    def int_reg(self) -> Reg:
        self.ints += 1
        return Reg(isa.INT, self.ints - 1)

    def block(self, cells) -> Reg:
        base = self.int_reg()
        self.emit("ALLOC", base, cells)
        return base

    def temp(self) -> View:
        """A zeroed m x n block, row-major."""
        m, n = self.m, self.n
        if self.size is None:
            if isinstance(m, Imm) and isinstance(n, Imm):
                self.size = Imm(m.value * n.value)
            else:
                self.size = self.int_reg()
                self.emit("ADD.mul", self.size, *((m, n) if isinstance(m, Reg) else (n, m)))
        return View(self.block(self.size), 0, n.value if isinstance(n, Imm) else n, 1)

    def accumulate(self, acc, sign: int, factor, e: ast.expr) -> None:
        """acc (+|-)= factor * e (acc a view, or a float register: the sum of the
        elements, through a one-cell block), then the temporaries uncomputed."""
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return self.accumulate(acc, -sign, factor, e.operand)
        if isinstance(e, ast.Constant) and e.value == 0.0:
            return
        into = acc
        if isinstance(acc, Reg):                    # a scalar's shadow: a sum
            into = View(self.block(Imm(1)), 0, 0, 0)
        add, shape = "VADD" if sign > 0 else "VSUB", (self.m, self.n)
        if isinstance(e, ast.Constant) and e.value == 1.0:
            last = Instruction(add, (into, factor, *shape), self.line)
        else:
            last = Instruction(f"{add}.mul", (into, factor, self.atom(e), *shape), self.line)
        done, self.compute = self.compute, []
        for ins in done + [last]:
            self.code.emit(ins.op, *ins.args, line=ins.line)
        if isinstance(acc, Reg):                    # acc += the cell; the cell back to 0
            self.code.emit("ADDM", acc, Mem(into.base), line=self.line)
            inverse = isa.OPS[last.op].inverse
            self.code.emit(inverse, *last.args, line=self.line)
        for ins in reversed(done):              # (the cell's block among them: freed)
            if ins.args[0] != into:
                self.code.emit(isa.OPS[ins.op].inverse, *ins.args, line=ins.line)
        self.size, self.ints = None, self.first     # all back to zero: reused


def _array_operands(ins: Instruction, views: dict, derivative: dict):
    """value(k) and derivative(k) of operand k: a view's halves on the interleaved heap;
    a register and its tangent (or shadow), None where it has none."""
    def value(k):
        return views[k][0] if k in views else ins.args[k]

    def of(k):
        a = ins.args[k]
        if k in views:
            return views[k][1]
        return derivative.get(a) if isinstance(a, Reg) and a.cls == isa.FLOAT else None
    return value, of


def _array_rule(code: _Code, ins: Instruction, derivative: dict, adjoint: bool) -> None:
    """An array instruction of f with its tangent rule (adjoint: its undo with the adjoint
    on the shadows, for the sweep), on the interleaved heap."""
    op, a, line = ins.op, ins.args, ins.line
    views, undo, first = _doubled(code, ins)
    value, of = _array_operands(ins, views, derivative)
    head, _, fam = op.partition(".")
    emit = lambda o, *args: code.emit(o, *args, line=line)
    inverse = isa.OPS[op].inverse
    if head in ("VADD", "VSUB"):
        sign, ops, shape = (1 if head == "VADD" else -1), range(1, len(a) - 2), a[-2:]
        names, parts = isa.family(fam)[0], partials(fam)
        low = _ArrayLowering(code, dict(zip(names, map(value, ops))), shape, line, first)
        emit(inverse if adjoint else op, *map(value, range(len(a) - 2)), *shape)
        for k, part in zip(ops, parts):
            if of(k) is None:
                continue
            if adjoint:                     # x_bar (+|-)= y_bar * dF/dx
                low.accumulate(of(k), sign, of(0), part)
            else:                           # y' (+|-)= x' * dF/dx
                low.accumulate(of(0), sign, of(k), part)
    elif head in ("VMADD", "VMSUB"):
        m, k, n = a[3:]
        if adjoint:                         # a_bar (+|-)= y_bar b^T; b_bar (+|-)= a^T y_bar
            emit(inverse, *map(value, range(3)), m, k, n)
            if of(1) is not None:
                emit(op, of(1), of(0), _transposed(value(2)), m, n, k)
            if of(2) is not None:
                emit(op, of(2), _transposed(value(1)), of(0), k, m, n)
        else:                               # y' (+|-)= a' b + a b'
            emit(op, *map(value, range(3)), m, k, n)
            if of(1) is not None:
                emit(op, of(0), of(1), value(2), m, k, n)
            if of(2) is not None:
                emit(op, of(0), value(1), of(2), m, k, n)
    elif op in ("VMUL", "VDIV"):
        x, c, shape = value(0), a[1], a[2:]
        low = _ArrayLowering(code, {"x": x}, shape, line, first)
        product = ast.Name("x", ast.Load())
        mul = op == "VMUL"
        if adjoint:     # undo x *= c: x /= c; c_bar += sum(x_bar x); x_bar *= c (and for /)
            emit("VDIV", *((x, c) if mul else (of(0), c)), *shape)
            if of(1) is not None:
                low.accumulate(of(1), 1 if mul else -1, of(0), product)
            emit("VMUL", *((of(0), c) if mul else (x, c)), *shape)
        else:           # x' = x' c + x c' (x before); x / c: (x' - x c') / c (x after)
            emit(op, *((of(0), c) if mul else (x, c)), *shape)
            if of(1) is not None:
                low.accumulate(of(0), 1 if mul else -1, of(1), product)
            emit(op, *((x, c) if mul else (of(0), c)), *shape)
    elif op in ("VSWAP", "VNEG"):
        n_views = 2 if op == "VSWAP" else 1
        emit(op, *map(value, range(n_views)), *a[n_views:])
        emit(op, *map(of, range(n_views)), *a[n_views:])
    else:
        raise TransformError(f"no derivative rule for {op}")
    for u in undo:
        code.emit(u.op, *u.args, line=line)


def _heap_access(ins: Instruction) -> bool:
    return ins.op == "EXCH" or ins.op in isa.READS


def uses_heap(program: Program, name: str) -> bool:
    return any(_heap_access(ins) or ins.op in ("ALLOC", "FREE") or ins.op in isa.ARRAYS
               for f in reachable(program, name) for ins in program.functions[f].code)


def _varied(fn: Function) -> set:
    """The float registers whose tangent can be non-zero (activity analysis, as in
    Tapenade or JAX's symbolic zeros): the float parameters, everything a call, the heap
    or the stack touches, and what an instruction computes from a varied register. The
    others' tangents stay zero, so the terms they would add are left out: the tangent
    of `d -= k * (k + nu)` then costs nothing downstream, where `0 * x` would otherwise
    be computed (and be nan where x is infinite)."""
    floats = lambda args: {r for r in args if isinstance(r, Reg) and r.cls == isa.FLOAT}
    varied = set(_float_params(fn))
    flows = []                          # (sources, destinations): one per instruction
    for ins in fn.code:
        regs, op = floats(ins.args), ins.op
        if not regs:
            continue
        if op in isa.CALLS or ins.spec.group in ("memory", "array"):
            varied |= regs
        elif not _is_float(ins) or op in ("NEG", "ZERO"):
            continue
        elif op in ("SWAP", "ROT", "IROT"):
            flows.append((regs, floats(ins.args[:2])))
        else:                           # d (+|-)= F(args); x *= y, x /= y
            flows.append((floats(ins.args[1:]), floats(ins.args[:1])))
    changed = True
    while changed:
        changed = False
        for sources, targets in flows:
            if sources & varied and not targets <= varied:
                varied |= targets
                changed = True
    return varied


def tangent_function(program: Program, fn: Function, names: dict,
                     interleaved: bool = False) -> Function:
    tan, first_free = _shadow_map(fn)
    varied = _varied(fn)
    active = {r: d for r, d in tan.items() if r in varied}
    code = _Code(first_free, fn.n_int)
    at = {i: fn.labels_at(i) for i in range(len(fn.code))}
    for i, ins in enumerate(fn.code):
        code.pending = at[i]
        if ins.op in isa.CALLS:
            callee = program.functions[ins.args[0].name]
            regs = list(ins.args[1:])
            extra = [tan[r] for r, p in zip(regs, callee.params) if p.cls == isa.FLOAT]
            code.emit(ins.op, FuncRef(names[callee.name]), *regs, *extra, line=ins.line)
        elif interleaved and ins.spec.group == "memory":
            _memory_rule(code, ins, tan)
        elif ins.spec.group == "array":
            _array_rule(code, ins, active, adjoint=False)
        elif _is_float(ins) and ins.written[0] not in varied:
            code.emit(ins.op, *ins.args, line=ins.line)      # its tangent stays zero
        elif _is_float(ins):
            _tangent_rule(code, ins, active)
        else:
            code.emit(ins.op, *ins.args, line=ins.line)
    params = fn.params + tuple(tan[p] for p in _float_params(fn))
    out = code.function(names[fn.name], params)
    return Function(out.name, out.params, out.code, out.labels, fn.line, fn.end_line,
                    symbols=_named(fn, tan, "dot"), checks=fn.checks)


def tangent(program: Program, name: str, arrays: dict | None = None) -> tuple[Program, str]:
    """The tangent program of `name` (and of everything it calls): (program, entry).

    A program that uses the heap gets the interleaved heap (each cell followed by its
    tangent); `arrays` maps the parameter index of each array argument's base to its rank,
    and the entry then takes each array interleaved along its last axis (its base and
    last dimension in cells of the interleaved heap) and passes f's units on."""
    todo = reachable(program, name)
    interleaved = uses_heap(program, name)
    names = {f: f"{f}.tan" for f in todo}
    funcs = {names[f]: tangent_function(program, program.functions[f], names, interleaved)
             for f in todo}
    entry = names[name]
    if arrays:
        funcs[f"{entry}.entry"] = _array_entry(funcs[entry], arrays)
        entry = f"{entry}.entry"
    return _derived(verify(Program(funcs, program.source)), program, names,
                    interleaved), entry


def _derived(out: Program, program: Program, names: dict, interleaved: bool) -> Program:
    """out, a program derived from `program` (names: each source function's key -> the
    name of a function derived from it, the key a name or (name, flag)), with the float
    registers of each derived function's source noted (rvm.engines.compiled: DERIVED): its
    registers from there on are derivatives, whose ancillas' zero tests scale with the
    largest magnitude a derivative has held (rvm.engines.compiled.derived_registers); on
    the interleaved heap, its cells off the source's lattice likewise (INTERLEAVED)."""
    known = program.cache.get(DERIVED, {})
    if interleaved:
        out.cache[INTERLEAVED] = program.cache.get(INTERLEAVED, 0) + 1
    out.cache[DERIVED] = {
        made: known.get(source, program.functions[source].n_float)
        for key, made in names.items()
        for source in [key[0] if isinstance(key, tuple) else key]
        if made in out.functions and source in program.functions}
    return out


def _array_entry(fn: Function, arrays: dict) -> Function:
    """A function taking each array's base and last dimension in interleaved cells and
    calling fn with them halved (f's units), the other parameters passed through."""
    code = _Code(0, 1 + max(r.n for r in fn.params if r.cls == isa.INT))
    halves: dict = {}
    for base, rank in arrays.items():
        for k in (base, base + rank):            # the base and the last dimension
            halves[k] = None
    for j, k in enumerate(halves):
        halves[k] = code.int_temps(len(halves))[j]
    for k, t in halves.items():
        code.emit("ADD.div", t, fn.params[k], Imm(2))
    args = [halves.get(k, p) for k, p in enumerate(fn.params)]
    code.emit("CALL", FuncRef(fn.name), *args)
    for k, t in reversed(list(halves.items())):
        code.emit("SUB.div", t, fn.params[k], Imm(2))
    out = code.function(f"{fn.name}.entry", fn.params)
    return attrs.evolve(out, line=fn.line, end_line=fn.end_line)


# ------------------------------------------------------------------ adjoint


def _adjoint_rule(code: _Code, ins: Instruction, sh: dict) -> None:
    """Emit the undo of float instruction `ins` (of f) with its adjoint on the shadows."""
    op, a, line = ins.op, ins.args, ins.line
    g = lambda x: sh.get(x) if isinstance(x, Reg) else None
    inv = isa.OPS[op].inverse
    if ins.spec.group in ("arith", "family") and op.split(".")[0] in ("ADD", "SUB"):
        code.emit(inv, *a, line=line)            # x_bar (+|-)= d_bar * dF/dx
        _partials(code, ins, lambda x: (g(x), g(a[0])) if g(x) is not None else None)
    elif op in ("NEG", "SWAP"):
        code.emit(op, *a, line=line)
        code.emit(op, *(g(x) for x in a), line=line)
    elif op in ("ROT", "IROT"):       # t's shadow from the rotated values, then rotate back
        x, y, angle = a
        s = 1 if op == "ROT" else -1
        if g(angle) is not None:
            code.emit("ADD.mul" if s > 0 else "SUB.mul", g(angle), g(y), x, line=line)
            code.emit("SUB.mul" if s > 0 else "ADD.mul", g(angle), g(x), y, line=line)
        code.emit(inv, *a, line=line)
        code.emit(inv, g(x), g(y), angle, line=line)
    elif op == "MUL":                 # undo x *= y: x /= y; gy += gx x; gx *= y
        x, y = a
        code.emit("DIV", x, y, line=line)
        if g(y) is not None:
            code.emit("ADD.mul", g(y), g(x), x, line=line)
        code.emit("MUL", g(x), y, line=line)
    elif op == "DIV":                 # undo x /= y: gx /= y; gy -= gx x; x *= y
        x, y = a
        code.emit("DIV", g(x), y, line=line)
        if g(y) is not None:
            code.emit("SUB.mul", g(y), g(x), x, line=line)
        code.emit("MUL", x, y, line=line)
    elif op == "ZERO":
        # Gradient mode drops x's shadow here. The sweep keeps it: x is zero whatever the
        # inputs, so what the shadow pulls back through x's history cancels exactly (up to
        # rounding), and keeping it needs no garbage.
        code.emit("ZERO", *a, line=line)
    else:
        raise TransformError(f"no adjoint rule for {op}")


def interleaved_function(fn: Function, name: str, names: dict) -> Function:
    """fn itself on the interleaved heap: exchanges at doubled addresses (the shadow
    cells stay where they are), calls to the interleaved versions (names[(g, None)])."""
    code = _Code(fn.n_float, fn.n_int)
    at = {i: fn.labels_at(i) for i in range(len(fn.code))}
    for i, ins in enumerate(fn.code):
        code.pending = at[i]
        if _heap_access(ins):
            x, mem = ins.args
            addr, undo = _address(code, mem, ins.line)
            code.emit(ins.op, x, Mem(addr), line=ins.line)
            for u in undo:
                code.emit(u.op, *u.args, line=ins.line)
        elif ins.op in ("ALLOC", "FREE"):               # a block with room for shadows
            _memory_rule(code, ins, {})
        elif ins.op in isa.CALLS:
            code.emit(ins.op, FuncRef(names[(ins.args[0].name, None)]), *ins.args[1:],
                      line=ins.line)
        elif ins.op in isa.ARRAYS:                      # on the value views
            views, undo, _ = _doubled(code, ins)
            code.emit(ins.op, *(views[k][0] if k in views else x
                                for k, x in enumerate(ins.args)), line=ins.line)
            for u in undo:
                code.emit(u.op, *u.args, line=ins.line)
        else:
            code.emit(ins.op, *ins.args, line=ins.line)
    out = code.function(name, fn.params)
    return attrs.evolve(out, line=fn.line, end_line=fn.end_line, symbols=fn.symbols,
                        checks=fn.checks)


def _drops(program: Program, swept: list[str]) -> bool:
    """Would the sweep drop a shadow (a float ancilla's, at its frame's entry, or an
    ancilla block's, where f allocated it: _left)?"""
    return any(r.cls == isa.FLOAT for f in swept for r in program.functions[f].locals) or \
        any(ins.op == "ALLOC" for f in swept for ins in program.functions[f].code)


def _sweep_alloc(code: _Code, ins: Instruction, align: int) -> None:
    """The sweep reaching f's `FREE d, n`: the block again (zero), with room for its
    shadows. For f a program interleaved k times, whose own blocks (of its source's
    cells) start at a multiple of align = 2^k of f's cells, each block the sweep makes
    and each record it pushes (_left) take a multiple of `align` of f's cells, so that
    f's top stays there: n + pad cells, pad = -n % align."""
    d, n = ins.args
    if align == 1:
        return _memory_rule(code, ins, {})
    line = ins.line
    t, q, size, cells = code.int_temps(4)
    steps = []                      # size = n + pad, f's cells; cells: twice that
    if isinstance(n, Imm):
        cells = Imm(2 * (n.value + -n.value % align))
    else:
        code.emit("ASSERT.LE", n, Imm(HALF), line=line)
        steps = [("ADD", size, n), ("ADD", size, Imm(align - 1)), ("ADD.mod", q, size,
                 Imm(align)), ("SUB", size, q), ("ADD.mul", cells, size, Imm(2))]
    for op, *args in steps:
        code.emit(op, *args, line=line)
    _allocated(code, d, t, cells, line)
    for op, *args in reversed(steps):
        code.emit(isa.OPS[op].inverse, *args, line=line)


def _left(code: _Code, ins: Instruction, align: int) -> None:
    """The sweep reaching the ALLOC of f's block `FREE d, n` (f's address d): the
    values are zero again, but the shadows hold the gradient of the block's initial
    value, which freeing would drop. So the block stays where it is, garbage that the
    entry's clean-up takes back (as the pushed shadows of float locals), and d's
    address goes onto the heap above it, in a record of `align` of f's cells (twice as
    many cells of the interleaved heap: see _sweep_alloc)."""
    d, _ = ins.args
    t, zero = code.int_temps(2)
    _addressed(code, d, t, ins.line)
    code.emit("PUSH", t, line=ins.line)
    for _ in range(2 * align - 1):
        code.emit("PUSH", zero, line=ins.line)


def _adjoint_sweeps(program: Program, a: str, names: dict) -> dict[str, Function]:
    """The sweeps across a call and an uncall of A = adjoint(g), which is linear in its
    shadows: (x, s) -> (x, J(x)^T s), J the Jacobian of g. Pulling shadows (xb, sb) back
    across it needs no shadows of A's own code (whose garbage stack would share the heap
    top with the caller's sweep), only tangent programs, which drop nothing:

        UNCALL A (x, s)                        s back to its value before the call
        xb += H_s sb                           the tangent of A along x-tangent sb,
                                               H_s the Hessian of <s, g(x)> (symmetric)
        sb = J sb                              the tangent of g, then g uncalled

    The sweep across an uncall of A is the inverse of this (xb -= ..., sb = J^-1 sb)."""
    fa = program.functions[a]
    g = program.functions[fa.adjoint_of]
    t_prog, t_entry = tangent(program, a)
    g_prog, g_entry = tangent(program, g.name)
    params = fa.params
    s = params[len(g.params):]                      # the shadows of g's float parameters
    first = 1 + max((r.n for r in params if r.cls == isa.FLOAT), default=-1)
    fresh = [Reg(isa.FLOAT, first + k) for k in range(3 * len(s))]
    xbar, sbar, tmp = fresh[:len(s)], fresh[len(s):2 * len(s)], fresh[2 * len(s):]
    line = fa.line
    code = _Code(first + 3 * len(s), fa.n_int)
    code.emit("UNCALL", FuncRef(a), *params, line=line)
    code.emit("CALL", FuncRef(t_entry), *params, *sbar, *tmp, line=line)
    for xb, t in zip(xbar, tmp):
        code.emit("ADD", xb, t, line=line)
    code.emit("UNCALL", FuncRef(t_entry), *params, *sbar, *tmp, line=line)
    code.emit("CALL", FuncRef(g_entry), *g.params, *sbar, line=line)
    code.emit("UNCALL", FuncRef(g.name), *g.params, line=line)
    sweep = code.function(names[(a, False)], params + tuple(xbar) + tuple(sbar))
    sweep = attrs.evolve(sweep, line=line, end_line=fa.end_line)
    back = inverse_function(sweep)
    out = {**t_prog.functions, **g_prog.functions, sweep.name: sweep}
    out[names[(a, True)]] = Function(names[(a, True)], back.params, back.code, back.labels,
                                     line, fa.end_line)
    return out


def sweep_function(program: Program, fn: Function, names: dict, name: str,
                   interleaved: bool = False) -> Function:
    """The reverse sweep of fn: its bytecode inverse with every float instruction replaced
    by its adjoint; params: fn's, then a shadow per float parameter. Shadows of float
    locals, which gradient mode drops when the sweep reaches fn's entry, are pushed.
    names[(g, uncalled)] is the sweep to call for a call of g in fn (of g's inverse when
    fn uncalls g). On the interleaved heap (each cell followed by its shadow) an exchange
    moves the shadow with the value."""
    sh, first_free = _shadow_map(fn)
    code = _Code(first_free, fn.n_int)
    inv = inverse_function(fn)
    align = 1 << program.cache.get(INTERLEAVED, 0)     # (see _sweep_alloc)
    for i, ins in enumerate(inv.code):
        code.pending = inv.labels_at(i)
        if ins.op in isa.CALLS:
            callee = program.functions[ins.args[0].name]
            target = names[(callee.name, isa.OPS[ins.op].inverse == "UNCALL")]
            regs = list(ins.args[1:])
            extra = [sh[r] for r, p in zip(regs, callee.params) if p.cls == isa.FLOAT]
            code.emit("CALL", FuncRef(target), *regs, *extra, line=ins.line)
        elif ins.op == "EXCH" and interleaved:          # the value and its shadow
            _memory_rule(code, ins, sh)
        elif ins.op == "ALLOC" and interleaved:         # f's FREE undone: zero again
            _sweep_alloc(code, ins, align)
        elif ins.op == "FREE" and interleaved:          # f's ALLOC undone: see _left
            _left(code, ins, align)
        elif ins.op in isa.READS and interleaved:
            _read_adjoint(code, ins, sh)
        elif ins.spec.group == "array":
            _array_rule(code, Instruction(isa.OPS[ins.op].inverse, ins.args, ins.line), sh,
                        adjoint=True)
        elif _is_float(ins):
            _adjoint_rule(code, Instruction(isa.OPS[ins.op].inverse, ins.args, ins.line), sh)
        else:
            code.emit(ins.op, *ins.args, line=ins.line)
    code.pending = []
    pushed = [sh[r] for r in fn.locals if r.cls == isa.FLOAT]
    for r in pushed:
        code.emit("PUSH", r, line=fn.line)
        if interleaved:             # (a pair: one of f's cells, see _sweep_alloc)
            code.emit("PUSH", code.int_temps(1)[0], line=fn.line)
    for _ in range(-len(pushed) % align if interleaved and pushed else 0):
        for _ in range(2):
            code.emit("PUSH", code.int_temps(1)[0], line=fn.line)
    params = fn.params + tuple(sh[p] for p in _float_params(fn))
    out = code.function(name, params)
    return Function(name, out.params, out.code, out.labels, fn.line, fn.end_line,
                    symbols=_named(fn, sh, "bar"), checks=fn.checks)


def adjoint(program: Program, name: str, arrays: dict | None = None) -> tuple[Program, str]:
    """The adjoint program of `name`: (program, entry). Adjoint programs called inside
    (rvm.adjoint(g) called from reversible code) are not swept instruction by instruction
    but as one operation (`_adjoint_sweeps`)."""
    primitive = lambda f: bool(program.functions[f].adjoint_of)
    base = reachable(program, name, primitive)
    swept = [f for f in base if not primitive(f)]
    _heap_free(program, name, swept)
    names = {(f, uncalled): f"{f}{'.inv' if uncalled else ''}.adj"
             for f in base for uncalled in (False, True)}
    interleaved = any(_heap_access(ins) or ins.op in isa.ARRAYS
                      for f in swept for ins in program.functions[f].code)
    if interleaved and any(primitive(f) for f in base):
        raise TransformError(f"adjoint of {name}: a program with arrays that calls an "
                             "adjoint program is not supported; use rvm.grad")
    funcs: dict[str, Function] = dict(program.functions)   # the entry runs f forwards
    for f in base:
        fn = program.functions[f]
        if primitive(f):
            funcs.update(_adjoint_sweeps(program, f, names))
            continue
        funcs[names[(f, False)]] = sweep_function(program, fn, names, names[(f, False)],
                                                  interleaved)
        funcs[names[(f, True)]] = sweep_function(program, inverse_function(fn), names,
                                                 names[(f, True)], interleaved)
        if interleaved:
            names[(f, None)] = f"{f}.heap2"
    forward = name
    if interleaved:                          # f itself, on the interleaved heap
        for f in swept:
            funcs[names[(f, None)]] = interleaved_function(program.functions[f],
                                                           names[(f, None)], names)
        forward = names[(name, None)]
    entry = f"{name}.adjoint"
    funcs[entry] = attrs.evolve(_entry(program.functions[name], names,
                                       _drops(program, swept), forward, arrays,
                                       1 << program.cache.get(INTERLEAVED, 0)),
                                adjoint_of="" if interleaved else name)
    if arrays:
        funcs[f"{entry}.entry"] = _array_entry(funcs[entry], arrays)
        entry = f"{entry}.entry"
    used = reachable(Program(funcs), entry)
    sweeps = {k: v for k, v in names.items() if k[1] is not None and k[0] in swept}
    return _derived(verify(Program({f: funcs[f] for f in used}, program.source)), program,
                    {**sweeps, name: f"{name}.adjoint"}, interleaved), entry


class _Cells:
    """Loops over the cells of the arrays an adjoint's entry is given, on the interleaved
    heap: each array's shadows (cell 2 (base + i) + 1) against a private block."""

    def __init__(self, code: _Code, fn: Function, arrays: dict, first_int: int, t, u,
                 align: int = 1):
        self.code, self.line, self.t, self.u, self.align = code, fn.line, t, u, align
        self.arrays = [(fn.params[b], fn.params[b + 1:b + 1 + rank])
                       for b, rank in sorted(arrays.items())]
        k = first_int
        self.blocks = [Reg(isa.INT, k + j) for j in range(len(self.arrays))]
        k += len(self.arrays)
        self.sizes = [dims[0] if len(dims) == 1 else Reg(isa.INT, k + j)
                      for j, (_, dims) in enumerate(self.arrays)]
        k += len(self.arrays)
        # (each block twice its array's size, its copies in the odd cells: they are
        # derivatives, as those of the interleaved heap, whose blocks the sweep allocates
        # above these at even cells, and f's at a multiple of `align` of f's cells
        # (_sweep_alloc): so `align` times that; a copy left at -0.0 is a zero when freed)
        self.doubled = [Reg(isa.INT, k + j) for j in range(len(self.arrays))]
        k += len(self.arrays)
        self.i, self.a, self.a2 = Reg(isa.INT, k), Reg(isa.INT, k + 1), Reg(isa.INT, k + 2)
        self.b2 = Reg(isa.INT, k + 3)
        self.labels = 0

    def _sizes(self, sign: int) -> None:
        steps = []
        for size, twice, (_, dims) in zip(self.sizes, self.doubled, self.arrays):
            if len(dims) == 2:
                steps.append(("ADD.mul", size, *dims))
            steps.append(("ADD.mul", twice, size, Imm(2 * self.align)))
        for op, *args in steps if sign > 0 else reversed(steps):
            self.code.emit(op if sign > 0 else "SUB" + op[3:], *args, line=self.line)

    def alloc(self) -> None:
        self._sizes(1)
        for block, twice in zip(self.blocks, self.doubled):
            self.code.emit("ALLOC", block, twice, line=self.line)

    def free(self) -> None:
        for block, twice in reversed(list(zip(self.blocks, self.doubled))):
            self.code.emit("FREE", block, twice, line=self.line)
        self._sizes(-1)

    def each(self, body) -> None:
        """body(shadow cell, its copy's cell) for every cell of every array."""
        code, i, a, a2, line = self.code, self.i, self.a, self.a2, self.line
        for (base, _), block, size in zip(self.arrays, self.blocks, self.sizes):
            self.labels += 1
            e, top, again, skip = (f"cells{self.labels}_{x}" for x in "etas")
            code.pending = [e]
            code.emit("BR.EQ", size, Imm(0), Label(skip), line=line)
            code.pending = [top]
            code.emit("CF.NE", i, Imm(0), Label(again), line=line)
            code.emit("ADD", a, base, line=line)            # a2 = 2 (base + i)
            code.emit("ADD", a, i, line=line)
            code.emit("ADD.mul", a2, a, Imm(2), line=line)
            code.emit("ADD.mul", self.b2, i, Imm(2), line=line)     # b2 = block + 2i
            code.emit("ADD", self.b2, block, line=line)
            body(Mem(a2, 1), Mem(self.b2, 1))
            code.emit("SUB", self.b2, block, line=line)
            code.emit("SUB.mul", self.b2, i, Imm(2), line=line)
            code.emit("SUB.mul", a2, a, Imm(2), line=line)
            code.emit("SUB", a, i, line=line)
            code.emit("SUB", a, base, line=line)
            code.emit("ADD", i, Imm(1), line=line)
            code.pending = [again]
            code.emit("BR.NE", i, size, Label(top), line=line)
            code.emit("SUB", i, size, line=line)
            code.pending = [skip]
            code.emit("CF.EQ", size, Imm(0), Label(e), line=line)


def _entry(fn: Function, names: dict, drops: bool, forward: str,
           arrays: dict | None = None, align: int = 1) -> Function:
    """adjoint(f)(x, ybar): f forwards (the function `forward`), then its sweep; with
    dropped shadows, Bennett's clean-up leaves only J^T ybar in the shadows (see the
    module docstring). The shadows of arrays (`arrays`: base parameter -> rank) are the
    odd cells of the interleaved heap, copied to and from private blocks."""
    n = fn.n_float
    params = fn.params + tuple(Reg(isa.FLOAT, p.n + n) for p in _float_params(fn))
    shadows = list(params[len(fn.params):])
    code = _Code(2 * n)
    sweep, cosweep = FuncRef(names[(fn.name, False)]), FuncRef(names[(fn.name, True)])
    code.emit("CALL", FuncRef(forward), *fn.params, line=fn.line)

    def done() -> Function:
        out = code.function(f"{fn.name}.adjoint", params)
        return attrs.evolve(out, line=fn.line, end_line=fn.end_line,
                            symbols=_named(fn, _shadow_map(fn)[0], "bar"))
    if not drops:
        code.emit("CALL", sweep, *params, line=fn.line)
        return done()
    copies = [Reg(isa.FLOAT, 2 * n + k) for k in range(len(shadows))]
    t, u = Reg(isa.FLOAT, 2 * n + len(shadows)), Reg(isa.FLOAT, 2 * n + len(shadows) + 1)
    cells = _Cells(code, fn, arrays or {}, fn.n_int, t, u, align)
    line = fn.line

    def add_into(into):                 # into(block cell) += shadow cell
        def body(slot, cell, sign=into):
            for op in (("EXCH", t, slot), ("EXCH", u, cell), (sign, u, t),
                       ("EXCH", u, cell), ("EXCH", t, slot)):
                code.emit(*op, line=line)
        return body
    cells.alloc()
    code.emit("CALL", sweep, *params, line=line)               # (y, ybar) -> (x, xbar) + G
    for c, s in zip(copies, shadows):
        code.emit("ADD", c, s, line=line)                       # c = xbar
    cells.each(add_into("ADD"))
    code.emit("UNCALL", sweep, *params, line=line)             # back to (y, ybar)
    code.emit("UNCALL", FuncRef(forward), *fn.params, line=line)   # values x
    cells.each(lambda slot, cell: [code.emit("EXCH", t, x, line=line)   # array shadows
                                   for x in (slot, cell, slot)])        # = xbar, blocks ybar
    # the sweep of f's inverse maps (x, c = xbar) to (y, J^-T xbar = ybar)
    code.emit("CALL", cosweep, *fn.params, *copies, line=line)
    for c, s in zip(copies, shadows):
        code.emit("SUB", s, c, line=line)                       # ybar = 0 (up to rounding)
    cells.each(add_into("SUB"))
    code.emit("UNCALL", cosweep, *fn.params, *copies, line=line)   # (x, c = xbar)
    for c, s in zip(copies, shadows):
        code.emit("SWAP", s, c, line=line)                      # shadows = xbar, c ~ 0
    cells.free()                                                # blocks ~ 0
    return done()
