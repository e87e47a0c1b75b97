"""The lowering of generated functions to LLVM IR (rvm.engines.llvm): each local's type
as the function declares it (rvm.engines.compiled.TYPES), each statement of the small
subset of Python that rvm.engines.compiled writes as LLVM instructions, with the same
checks and faults. rvm.engines.lanes lowers the same functions with every local a vector
of rows."""

from __future__ import annotations

import ast
import functools
import hashlib
import re

from ..core.isa import MIN_NORMAL
from . import vectormath
from .arraylowering import HELPERS as ARRAY_HELPERS
from .arraylowering import ArrayLowering
from .templates import LAST, NOW, RESUME, ROOT, SHADOWS, SHADOWS_BAD, SNAP, STOP, wrap

_REGISTER = re.compile(r"f\d+")     # a float register's value (not its shadow)
# functions that raise in Python where machine code returns inf or nan: those whose
# domain is a half line, and the others (sin and cos raise only on inf, which no finite
# register holds; tanh and atan2 never do)
_DOMAIN = {"math.sqrt": "<", "math.log": "<="}
_MATH_ERRORS = {"math.exp", "math.pow", "math.fmod", "np.fmod", "dpow_db"}
# fault codes: a failed check (or a limit); the heap is full (the cells wanted are left in
# the state array's heap top); the step budget ran out; the run was interrupted (SIGINT);
# the output buffer is full (see Lowering.said); a check failed and left a record of the
# registers at the last look before it (LOOKED: see Lowering.from_kept); a look of the
# build that searches a gradient pass found a shadow not finite first and left the last
# look's record (SHADOWED: see Lowering.keep)
FAULT, FULL, BUDGET, INTERRUPT, SAID, LOOKED, SHADOWED = 1, 2, 3, 4, 5, 6, 7
MESSAGES = {FAULT: "invertibility check failed", FULL: "heap capacity exceeded",
            BUDGET: "step budget exhausted", INTERRUPT: "interrupted",
            SAID: "output buffer full", LOOKED: "a float result not finite",
            SHADOWED: "a shadow not finite"}
# the process-wide cell a SIGINT sets (rvm.engines.llvm: interrupts): native loops poll it
INTERRUPT_CELL = "rvm_interrupt"
POLL_EVERY = 1 << 16    # passes of a counted loop between two polls of the interrupt cell
# steps between two tests of every float register at a back edge (see Lowering.clean); in
# the build that searches a gradient pass for a shadow that stopped being finite, fewer
CLEAN_EVERY, SEARCH_EVERY = 1 << 8, 1 << 6
# steps of a counted loop's passes between two looks at its floats (see Lowering.look)
LOOK_EVERY = 1 << 10
# the machine's snapshot buffer (see Lowering.snapshot): a header of SNAP_HEAD cells (the
# budget left at the look, -1 where none was taken, SNAP_AT; the heap top, SNAP_TOP; the
# function's name id, SNAP_NAME; the room, SNAP_ROOM: cells it holds, as large as the
# heap, at most SNAP_CELLS), then the cells of a heap of up to that many cells and their
# shadows; a snapshot is taken at a look when SNAP_SPACING steps per heap cell have
# passed since the last (its copy costs well under a step per SNAP_SPACING steps). (Up to
# 2^20 cells, with the first deferred in a large heap, cost a loop with a counted inner
# loop 5-15% in every way tried: the look's code shapes the loop's.)
SNAP_AT, SNAP_TOP, SNAP_NAME, SNAP_ROOM, SNAP_HEAD = range(5)
SNAP_CELLS, SNAP_SPACING = 1 << 16, 64
# where a value-and-gradient call's forward run ends, the heap is copied into the buffer
# its caller gives (rvm.engines.llvm: _forward_end) where it has at most FORWARD_CELLS
# cells, or SNAP_SPACING steps of that run per cell; callers give at most FORWARD_ROOM
FORWARD_CELLS, FORWARD_ROOM = 1 << 10, 1 << 22
# in the build that searches a gradient pass: a step per heap cell, for heaps of at most
# SEARCH_CELLS cells (the interpreter then steps at most about that far from a snapshot)
SEARCH_CELLS = 1 << 12
CELL_LOOKS = "cells"    # the build that searches a pass over a larger heap (shadow_made)
# x ** y: the C library's pow under a name LLVM does not know (rvm.engines.llvm binds it),
# as the interpreter calls it (rvm.engines.templates.power: a square is a product).
# LLVM's own pow, where it sees a constant, is exp2 (2.0 ** x) or a square root
# (x ** 0.5): a last bit apart from pow's, and made so only by optimised code, not by
# the quick code (rvm.engines.llvm: Tier).
POW = "rvm_pow"


_FOLDED = frozenset({"fadd", "fsub", "fmul", "add", "sub", "mul"})


def pure_function(fn):
    """fn (a C library function's declaration) marked as one that reads and writes no
    memory (errno aside, which nothing reads), so LLVM may move or merge its calls."""
    if not fn.blocks and "nounwind" not in fn.attributes:
        for attribute in ("nounwind", "readnone", "willreturn"):
            fn.attributes.add(attribute)
    return fn


class Types:
    def __init__(self, ir):
        self.i64, self.f64, self.i1 = ir.IntType(64), ir.DoubleType(), ir.IntType(1)
        self.s64 = self.i64         # scalar int64 (also where the locals are vectors)
        self.ptr = self.i64.as_pointer()
        self.fptr = self.f64.as_pointer()

    def of(self, kind: str | None):
        """The type of a local declared `kind` (int, float, bool), or None."""
        return {"int": self.i64, "float": self.f64, "bool": self.i1}.get(kind)


def declared(node: ast.FunctionDef) -> dict[str, str]:
    """{local: its declared type}: the parameters' annotations and the declarations
    (`f3: float`) at the top of the function's body (rvm.engines.compiled.TYPES)."""
    out = {a.arg: a.annotation.id for a in node.args.args if a.annotation is not None}
    for s in node.body:
        if isinstance(s, ast.AnnAssign) and s.value is None:
            out[s.target.id] = s.annotation.id
    return out


_HEAP = ("HI", "HF", "HG", "TOP")      # native code's heap: cells as ints, as floats,
# their shadows, and the state array (the heap's top, the step budget: templates.STATE)
_VIEWS = {"hi": "HI", "hf": "HF", "hg": "HG"}
# the machine's operations in generated code (M.alloc(n), ...) as native code's helpers
# take them (rvm.engines.lowering: Lowering.helper; arraylowering): heap arrays first
_OPERATIONS = {"alloc": ("HI", "TOP"), "free": _HEAP, "gpush": ("HF", "HG", "TOP"),
               "said": ()}


def _loaded(*names) -> list:
    return [ast.Name(n, ast.Load()) for n in names]


class MachineOperations:
    """A generated function (parsed) as native code runs it: the machine's operations and
    fields (`M.alloc(n)`, `M.hf[a]`, `M.top`, `M.budget`, `M.tol`) become native code's
    helpers and locals over the heap arrays (`alloc(HI, TOP, n)`, `HF[a]`, the heap top's
    local `T0`, the state array's budget cell `TOP[1]`, the constant `TOL`), a function
    takes the heap arrays where it took the machine, a folded check's condition is made
    branch-free, and a failed check raises a constant Fault (the machine runs the pass
    again on the interpreter to say which check failed). Native code keeps no derivative
    magnitudes: `M.dscale` is 0.0. The tree is changed in place, in one walk (an
    ast.NodeTransformer would copy every list of every node)."""

    def __init__(self, types: dict):
        self.types = types      # the function's declared locals (compiled.TYPES)

    def run(self, fn: ast.FunctionDef) -> ast.FunctionDef:
        if fn.args.args and fn.args.args[0].arg == "M":
            fn.args.args[0:1] = [ast.arg(h) for h in _HEAP]
        native, changed, leaves = self.native, _CHANGED, _LEAVES
        work: list = [fn]
        while work:
            node = work.pop()
            for field in node._fields:
                value = getattr(node, field, None)
                if type(value) is list:
                    for k, item in enumerate(value):
                        kind = type(item)
                        if kind in leaves or not isinstance(item, ast.AST):
                            continue
                        if kind in changed:
                            new = native(item)
                            if new is not None:
                                value[k] = item = new
                        work.append(item)
                elif isinstance(value, ast.AST) and type(value) not in leaves:
                    if type(value) in changed:
                        new = native(value)
                        if new is not None:
                            setattr(node, field, new)
                            value = new
                    work.append(value)
        return fn

    def native(self, node):
        """node's native form (its parts are walked after), or None: node as it is, or
        changed in place."""
        if isinstance(node, ast.Attribute):
            if not _named(node.value, "M"):
                return None
            if node.attr in _VIEWS:
                return ast.Name(_VIEWS[node.attr], ast.Load())
            if node.attr == "top":
                return ast.Name("T0", node.ctx)
            if node.attr == "budget":
                return ast.Subscript(ast.Name("TOP", ast.Load()), ast.Constant(1), node.ctx)
            if node.attr == "tol":
                return ast.Name("TOL", ast.Load())
            if node.attr == "dscale":
                return ast.Constant(0.0)
            return None
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Raise):
            exc = node.exc
            if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and \
                    exc.func.id in ("Fault", "Limit"):
                what = "invertibility check failed" if exc.func.id == "Fault" else \
                    "step budget exhausted"
                return ast.Raise(ast.Call(ast.Name("Fault", ast.Load()),
                                          [ast.Constant(what)], []), None)
            return None
        if (isinstance(node, ast.AugAssign) and _named(node.target, "_ok")) or \
                (isinstance(node, ast.Assign) and len(node.targets) == 1 and
                 _named(node.targets[0], "_m")):
            # a folded check (native.defer_checks), or an address's check (its mask)
            node.value = _BRANCH_FREE.visit(node.value)
        return None

    def call(self, node: ast.Call):
        f, args = node.func, node.args
        if isinstance(f, ast.Attribute) and _named(f.value, "M"):
            name = f.attr
            if name in _OPERATIONS:
                head = _OPERATIONS[name]
            elif name == "push":        # into the heap's int or float view
                kind = self.types.get(args[0].id) if isinstance(args[0], ast.Name) else None
                head = ("HF" if kind == "float" else "HI", "TOP")
            elif name == "pop":         # pop(True): a float's cell
                floats = isinstance(args[0], ast.Constant) and args[0].value is True
                head, args = ("HF" if floats else "HI", "HI", "TOP"), []
            elif name == "gpop":
                head, args = _HEAP, []
            elif name.startswith("v"):  # the array instructions
                head = _HEAP
            else:
                return None
            return ast.Call(ast.Name(name, ast.Load()), _loaded(*head) + args, [])
        if _named(f, "zero"):
            args.insert(0, ast.Name("TOL", ast.Load()))
        elif args and _named(args[0], "M"):     # a generated function's call
            args[0:1] = _loaded(*_HEAP)
        return None


# the nodes MachineOperations.native changes (others it walks through), and those it
# neither changes nor walks into (names, constants, operators, a name's context)
_CHANGED = frozenset({ast.Attribute, ast.Call, ast.Raise, ast.AugAssign, ast.Assign})
_LEAVES = frozenset({ast.Name, ast.Constant, ast.Load, ast.Store, ast.Del,
                     *(c for base in (ast.operator, ast.unaryop, ast.cmpop, ast.boolop)
                       for c in base.__subclasses__())})


class _BranchFree(ast.NodeTransformer):
    """`and`/`or` and chained comparisons as `&`/`|` of the parts (all side-effect free
    register arithmetic): a condition without short-circuit jumps."""

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        op = ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr()
        out = node.values[0]
        for v in node.values[1:]:
            out = ast.BinOp(out, op, v)
        return out

    def visit_Compare(self, node):
        self.generic_visit(node)
        if len(node.ops) == 1:
            return node
        lefts = [node.left, *node.comparators]
        parts = [ast.Compare(a, [o], [b]) for a, o, b in zip(lefts, node.ops, lefts[1:])]
        out = parts[0]
        for part in parts[1:]:
            out = ast.BinOp(out, ast.BitAnd(), part)
        return out


_BRANCH_FREE = _BranchFree()


def native_tree(node: ast.FunctionDef) -> ast.FunctionDef:
    """A generated function's tree (its text as rvm.engines.native.defer_checks leaves
    it) as native code runs it (MachineOperations)."""
    return MachineOperations(declared(node)).run(node)


_FLOAT_OPS = {ast.Add: "fadd", ast.Sub: "fsub", ast.Mult: "fmul", ast.Div: "fdiv"}
_INT_OPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul"}
_CHECKED = {ast.Add: "sadd", ast.Sub: "ssub", ast.Mult: "smul"}


def loop_over(b, lo, hi, body, after=None) -> None:
    """body(i) for i in range(lo, hi), leaving to `after` (a new block if None), where the
    builder ends up. The counter lives in the entry block (in the loop, it would take a
    new stack slot every time round)."""
    fn = b.function
    with b.goto_block(fn.entry_basic_block):
        i = b.alloca(lo.type)
    b.store(lo, i)
    head, loop = fn.append_basic_block(), fn.append_basic_block()
    after = after or fn.append_basic_block()
    b.branch(head)
    b.position_at_end(head)
    b.cbranch(b.icmp_signed("<", b.load(i), hi), loop, after)
    b.position_at_end(loop)
    body(b.load(i))
    b.store(b.add(b.load(i), lo.type(1)), i)
    b.branch(head)
    b.position_at_end(after)


def snapshot_cells(b, t: Types, snap, header: tuple, H, top, shadows=None) -> None:
    """Into a snapshot buffer (see Lowering.snapshot): its header cells from cell 0, the
    heap's cells 0..top from SNAP_HEAD on and, given shadows = (their view, the
    buffer's room), their shadows after the room: one loop, which LLVM makes memcpys
    of (also where a value-and-gradient call's forward run ended: rvm.engines.llvm)."""
    for k, v in enumerate(header):
        b.store(v, b.gep(snap, [t.i64(k)]))
    at = None if shadows is None else b.add(shadows[1], t.i64(SNAP_HEAD))

    def cell(i):
        b.store(b.load(b.gep(H, [i])), b.gep(snap, [b.add(i, t.i64(SNAP_HEAD))]))
        if shadows is not None:
            b.store(b.load(b.gep(shadows[0], [i])),
                    b.gep(b.bitcast(snap, t.fptr), [b.add(i, at)]))
    loop_over(b, t.i64(0), top, cell)


def guard(b, bad, block) -> None:
    """Leave through `block` where `bad` holds; go on where it does not."""
    ok = b.function.append_basic_block()
    b.cbranch(bad, block, ok)
    b.position_at_end(ok)


class Unsupported(Exception):
    """Source outside the subset this back end lowers (the machine falls back to the
    python engine, with a warning)."""


class Lowering(ArrayLowering):
    """One generated function (an ast.FunctionDef) as an LLVM function."""

    loop_over = staticmethod(loop_over)
    FAULT = FAULT

    def __init__(self, ir, t: Types, functions: dict, node: ast.FunctionDef):
        self.ir, self.t, self.functions, self.node = ir, t, functions, node
        self.fn = functions[node.name][0]
        self.params = functions[node.name][1]
        entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.S, self.flag, self.H, self.G, self.cap = self.fn.args[:5]
        self.vars: dict = {}
        types = declared(node)
        self.assigned = _assigned(node)
        for name in [*self.params, *sorted(self.assigned - set(self.params))]:
            ty = t.of(types.get(name))
            if ty is None:
                raise Unsupported(f"a local of undeclared type: {name}")
            self.vars[name] = self.b.alloca(ty, name=name)
        self.prologue()
        self.loops: list = []       # (continue block, break block)
        self.cases: dict | None = None    # the dispatch loop's blocks (see dispatch)
        self.checking = False       # lowering a check (its failure is a fault anyway)
        self.adjoint = False        # lowering a shadow's update (see python_error)
        self.elementwise = False    # lowering an array instruction's element (vectormath)
        self.later = None           # a counted loop's flag: a float was not finite (for_)
        self.counting = 0           # lowering a counted loop's passes
        self.case = 0               # the block lowered (a function of one block: 0)
        self.sites: dict = {}       # (block, callee) -> its calls lowered with a record
        # the budget left at the last back edge this frame passed where every float
        # register was finite (-1: none yet; see clean), left in the state array's budget
        # cell where a run fails (Machine._replay), and the budget at the next such test
        # (and, in a counted loop's chunk, the budget the general loop would have left at
        # its end: a failure's, where it fails in the chunk; -1 elsewhere: see for_)
        self.last = self.mark = self.chunk_end = None
        self.record_slots = None    # (names, values, count) of its records (see record)
        # the registers as the last look that found them finite saw them, with the block
        # and the budget left there (-1: none yet): a function whose run, its callees'
        # included, writes no heap cell keeps them (see keep), and one that writes the
        # heap and no function calls, in the root frame, with a snapshot (see snapshot)
        self.kept_at = self.kept = self.kept_write = None
        self.root = None            # is this frame the run's root (a function that writes
        # the heap keeps copies only there, with a snapshot of the heap: see snapshot)
        self.records: dict = {}     # where a record goes next -> its shared block (shared)
        self.before = None          # the budget test before the next call (stop_at)
        self.looked = False         # a look at its float registers made (note_shadows)
        self.dropped = None         # with LOOKS: a dropped shadow was not finite (drop_look)
        self.heap_bad = None        # with LOOKS = CELL_LOOKS: a cell's shadow was made not
        # finite (shadow_made)
        self.zeroed: set = set()    # shadows set to 0.0 so far (with LOOKS: see statement)
        self.checked = None         # (base, offset, sum) of the last address check
        self.worked_out: dict = {}  # a counted loop's entry test's values (exact), by
        self.shapes: dict = {}      # shape: the numbers of its expressions' structures
        self.numbers: dict = {}
        if type(self) is Lowering:
            with self.b.goto_block(self.fn.entry_basic_block):
                self.last = self.b.alloca(t.i64, name="last")
                self.mark = self.b.alloca(t.i64, name="mark")
                self.chunk_end = self.b.alloca(t.i64, name="chunk_end")
            self.b.store(t.i64(-1), self.last)
            self.b.store(t.i64(-1), self.chunk_end)
            snaps = node.name in functions.get("SNAP", ())
            if node.name in functions.get("QUIET", ()) or snaps:
                with self.b.goto_block(self.fn.entry_basic_block):
                    self.kept_at = self.b.alloca(t.i64, size=t.i64(2), name="kept_at")
                self.b.store(t.i64(-1), self.b.gep(self.kept_at, [t.i64(1)]))
            if snaps:
                self.claim()
            self.b.store(self.next_look(self.b.load(self.slot(1))), self.mark)
            if functions.get("LOOKS"):
                with self.b.goto_block(self.fn.entry_basic_block):
                    self.dropped = self.b.alloca(t.i1, name="dropped")
                self.b.store(t.i1(0), self.dropped)
            if functions.get("LOOKS") == CELL_LOOKS:
                with self.b.goto_block(self.fn.entry_basic_block):
                    self.heap_bad = self.b.alloca(t.i1, name="heap_bad")
                self.b.store(t.i1(0), self.heap_bad)
        self.fault_block, self.full_block = self.exit(FAULT), self.exit(FULL)
        self.budget_block, self.interrupt_block = self.exit(BUDGET), self.exit(INTERRUPT)
        self.passed = self.exit(None)          # a callee's fault: return, its code kept
        self.callee_failed = self.passed
        if self.kept_at is not None:    # (a failed check, or a callee's, from a copy)
            self.kept = self.b.alloca(t.i64, size=t.i64(max(len(self.frame_registers()), 1)),
                                      name="kept")
            self.fault_block = self.from_kept(self.fault_block, callee=False)
            self.callee_failed = self.from_kept(self.passed, callee=True)
        self.body(node.body)
        if not self.b.block.is_terminated:
            self.b.unreachable()

    def prologue(self) -> None:
        """The parameters into their locals (after the five heap arguments)."""
        for name, arg in zip(self.params, self.fn.args[5:]):
            self.b.store(arg, self.vars[name])

    def exit(self, code: int | None, callee: bool = False):
        """A block that sets the fault flag to `code` (if any) and returns (callee: after
        a callee's failed check, whose places it keeps, as code None does)."""
        block = self.fn.append_basic_block(f"fault{code or ''}")
        with self.b.goto_block(block):
            if code is not None:
                self.b.store(self.t.s64(code), self.flag)
            if self.dropped is not None:    # (what drop_look found, for the machine)
                seen = self.shadows_seen()
                if self.heap_bad is not None:
                    seen = self.b.or_(seen, self.b.load(self.heap_bad))
                self.b.store(self.b.zext(seen, self.t.i64), self.slot(SHADOWS_BAD))
            own = code is not None and not callee
            if self.last is not None and code in (FAULT, BUDGET, LOOKED, None):
                # where the run failed: the budget left at this frame's last budget test
                # (a callee's fault: the callee's, or this frame's if it passed none)
                last = self.b.load(self.last)
                if not own:
                    last = self.b.select(self.b.icmp_signed("<", self.b.load(self.slot(1)),
                                                            self.t.i64(0)),
                                         last, self.b.load(self.slot(1)))
                self.b.store(last, self.slot(1))
            if self.last is not None and code in (FAULT, LOOKED, None):  # (Machine._general)
                # where it failed: the budget left here, or in a counted loop's chunk (a
                # callee's too: it counts from the budget left after the loop's charge
                # for every pass) the budget the general loop would leave at its end
                end = self.b.load(self.chunk_end)
                n = self.b.load(self.vars["_n"] if own else self.slot(NOW))
                self.b.store(self.b.select(self.b.icmp_signed("<", end, self.t.i64(0)), n, end),
                             self.slot(NOW))
            self.b.ret(self.ir.Constant(self.fn.return_value.type, None))
        return block

    @functools.cached_property
    def end_shadows(self) -> list[str]:
        return end_shadows(self.node, self.assigned)

    def slot(self, k: int):
        return self.b.gep(self.S, [self.t.i64(k)])

    def cell(self, view: str, index):
        """A pointer to heap cell `index` of view HI, HF (HI's cells as floats) or HG."""
        b, t = self.b, self.t
        index = self.coerce(index, t.i64)
        if view == "HI":
            return b.gep(self.H, [index])
        if view == "HF":
            return b.gep(b.bitcast(self.H, t.fptr), [index])
        if view == "HG":
            return b.gep(self.G, [index])
        raise Unsupported(f"heap view {view}")

    def guard(self, bad, block) -> None:
        guard(self.b, bad, block)

    def new_flag(self):
        """A fresh flag (false here), for failures a loop tests once, after it."""
        b = self.b
        with b.goto_block(self.fn.entry_basic_block):
            ptr = b.alloca(self.t.i1)
        b.store(self.t.i1(0), ptr)
        return ptr

    def raise_flag(self, ptr, bad) -> None:
        self.b.store(self.b.or_(self.b.load(ptr), bad), ptr)

    def helper(self, name: str, args: list):
        """The heap helpers of rvm.engines.native (alloc, free, push, pop, gpush, gpop),
        inline, with the same checks: the value (or values) they return, or None."""
        b, t = self.b, self.t
        top = lambda: b.load(self.slot(0))
        value = lambda k: self.expr(args[k])
        if name == "alloc":                     # alloc(HI, TOP, n)
            n, base = self.coerce(value(2), t.i64), top()
            self.guard(b.icmp_signed("<", n, t.i64(0)), self.fault_block)
            over = b.icmp_signed(">", n, b.sub(self.cap, base))
            # the cells wanted (saturated) in the heap top: the machine sizes the heap to
            # them, or refuses them, without growing the heap step by step
            need = b.select(b.icmp_signed(">", n, b.sub(t.i64(2**63 - 1), base)),
                            t.i64(2**63 - 1), b.add(base, n))
            b.store(need, self.slot(0))
            self.guard(over, self.full_block)
            return base
        if name == "free":                      # free(HI, HF, HG, TOP, d, n)
            d, n = self.coerce(value(4), t.i64), self.coerce(value(5), t.i64)
            end = top()
            self.guard(b.or_(b.icmp_signed("<", n, t.i64(0)),
                             b.icmp_signed("!=", d, b.sub(end, n))), self.fault_block)

            # the cells' test is one flag for the block, tested after it (no branch per
            # cell: LLVM vectorises the scan)
            any_bad = self.new_flag()

            def zero(c):
                x = self.intrinsic("fabs", b.load(self.cell("HF", c)))
                small = b.and_(b.fcmp_ordered("<=", t.f64(MIN_NORMAL), x),
                               b.fcmp_ordered("<=", x, t.f64(self.functions["TOL"])))
                bad = b.and_(b.icmp_signed("!=", b.load(self.cell("HI", c)), t.i64(0)),
                             b.not_(small))
                self.raise_flag(any_bad, bad)

            def clear(c):
                b.store(t.i64(0), self.cell("HI", c))
                b.store(t.f64(0.0), self.cell("HG", c))
            loop_over(b, d, end, zero)
            self.guard(b.load(any_bad), self.fault_block)
            self.dropping(d, end)
            loop_over(b, d, end, clear)
            b.store(d, self.slot(0))
            return None
        if name in ("push", "gpush"):           # push(view, TOP, v); gpush(HF, HG, TOP, v, g)
            view, v = args[0].id, value(2 if name == "push" else 3)
            at = top()
            full = b.icmp_signed(">=", at, self.cap)
            b.store(b.select(full, b.add(at, t.i64(1)), at), self.slot(0))   # (see alloc)
            self.guard(full, self.full_block)
            ptr = self.cell(view, at)
            if v.type == t.f64:
                self.finite(v)
            b.store(self.coerce(v, ptr.type.pointee), ptr)
            b.store(b.add(at, t.i64(1)), self.slot(0))
            if name == "gpush":
                g = self.coerce(value(4), t.f64)
                self.shadow_made(g)
                b.store(g, self.cell("HG", at))
            return None
        if name == "said":                      # said(k, values...): an output record
            self.said(args)
            return None
        if name in ("pop", "gpop"):             # pop(view, HI, TOP); gpop(HI, HF, HG, TOP)
            view = args[0].id if name == "pop" else "HF"
            at = top()
            self.guard(b.icmp_signed("==", at, t.i64(0)), self.fault_block)
            at = b.sub(at, t.i64(1))
            b.store(at, self.slot(0))
            v = b.load(self.cell(view, at))
            b.store(t.i64(0), self.cell("HI", at))
            if name == "pop":
                return v
            g = b.load(self.cell("HG", at))
            b.store(t.f64(0.0), self.cell("HG", at))
            return v, g
        raise Unsupported(name)

    def said(self, args) -> None:
        """An output statement (rvm.engines.compiled: said_text): a record appended to the
        output buffer, the state array's cells from OUT0 (S[2]: where the next record goes,
        S[3]: the array's length): the statement's number, the record's length in cells,
        each value's registers (bits), then each array's cells (a value written as a list:
        its base and dimensions) as they are now. The machine shows the records when the
        run has succeeded (a failed run's are dropped: the interpreter's run of the pass
        prints). A record
        that does not fit leaves with SAID (the machine runs the pass again with a larger
        buffer); an array outside the heap, or a float not finite, with FAULT."""
        b, t = self.b, self.t
        values, arrays = [], []         # registers' values; (base, cells) per array
        for a in args[1:]:
            regs = [self.expr(r) for r in (a.elts if isinstance(a, (ast.Tuple, ast.List))
                                            else [a])]
            values += regs
            if isinstance(a, ast.List):
                base = self.coerce(regs[0], t.i64)
                n, bad = t.i64(1), b.icmp_signed("<", base, t.i64(0))
                for d in regs[1:]:      # each dimension and the count within the heap
                    d = self.coerce(d, t.i64)
                    bad = b.or_(bad, b.icmp_unsigned(">", d, self.cap))
                    n = b.mul(n, b.select(bad, t.i64(0), d))
                    bad = b.or_(bad, b.icmp_unsigned(">", n, self.cap))
                top = b.load(self.slot(0))
                bad = b.or_(bad, b.icmp_signed(">", n, b.sub(top, base)))
                self.guard(bad, self.fault_block)
                arrays.append((base, n))
        self.finite(*(v for v in values if v.type == t.f64))
        size = t.i64(2 + len(values))
        for _, n in arrays:
            size = b.add(size, n)
        at = b.load(self.slot(2))
        if getattr(self, "said_block", None) is None:
            self.said_block = self.exit(SAID)
        self.guard(b.icmp_signed(">", size, b.sub(b.load(self.slot(3)), at)), self.said_block)
        put = lambda k, v: b.store(v, b.gep(self.S, [b.add(at, k)]))
        put(t.i64(0), t.i64(args[0].value))
        put(t.i64(1), size)
        for k, v in enumerate(values):
            put(t.i64(2 + k), b.bitcast(v, t.i64) if v.type == t.f64 else
                self.coerce(v, t.i64))
        pos = t.i64(2 + len(values))
        for base, n in arrays:
            start = pos
            loop_over(b, t.i64(0), n, lambda j, base=base, start=start: put(
                b.add(start, j), b.load(self.cell("HI", b.add(base, j)))))
            pos = b.add(pos, n)
        b.store(b.add(at, size), self.slot(2))

    # ------------------------------------------------------------ statements
    def body(self, stmts) -> None:
        stmts = [s for s in stmts if not (isinstance(s, ast.AnnAssign) and s.value is None)]
        for k, s in enumerate(stmts):       # (declarations: see declared)
            if self.b.block.is_terminated:
                return
            self.following = stmts[k + 1] if k + 1 < len(stmts) else None
            self.stmt(s)

    def stmt(self, s) -> None:
        outer = self.adjoint
        self.adjoint = outer or _writes_shadow(s)
        try:
            self.statement(s)
        finally:
            self.adjoint = outer

    def statement(self, s) -> None:
        b, ir = self.b, self.ir
        checked, self.checked = self.checked, None
        if isinstance(s, ast.Assign) and len(s.targets) == 1:
            target = s.targets[0]
            if _named(target, "_a") and isinstance(s.value, ast.BinOp) and \
                    isinstance(s.value.op, ast.Mult) and _named(s.value.right, "_m"):
                # a heap address `(a) * _m`: here its check has passed (each check is a
                # branch to the fault exit, see _ok below), so it is `a`, and the sum of
                # a register offset is the one its check made
                a = s.value.left
                same = checked is not None and isinstance(a, ast.BinOp) and \
                    isinstance(a.op, ast.Add) and _named(a.left, checked[0]) and \
                    _named(a.right, checked[1])
                self.store(target, checked[2] if same else self.expr(a))
            elif isinstance(target, ast.Tuple) and isinstance(s.value, ast.Call) and \
                    isinstance(s.value.func, ast.Name) and s.value.func.id in self.functions:
                self.call(target, s.value)
            elif isinstance(target, ast.Tuple) and isinstance(s.value, ast.Call):
                for t_, v in zip(target.elts, self.expr(s.value)):    # gpop
                    self.store(t_, v)
            elif isinstance(target, ast.Tuple):
                values = [self.expr(v) for v in s.value.elts]
                for t_, v in zip(target.elts, values):
                    self.store(t_, v)
            elif self.cases is not None and _named(target, "_b") and \
                    isinstance(s.value, (ast.Constant, ast.UnaryOp)):
                self.jump(ast.literal_eval(s.value))
            elif isinstance(target, ast.Name) and target.id == "_m" and \
                    (terms := _address_terms(s.value)):
                self.store(target, self.in_heap(*terms))
            else:
                if self.functions.get("LOOKS") and isinstance(target, ast.Name) and \
                        GRAD_REGISTER.fullmatch(target.id) and "_n" in self.vars and \
                        isinstance(s.value, ast.Constant) and s.value.value == 0.0:
                    # (a shadow dropped, an ancilla's at the end of its block: with
                    # LOOKS, a look first at what it held; not where a local's shadow
                    # is first set, which the look would read unset)
                    if target.id in self.zeroed or target.id in self.params:
                        self.drop_look(target.id)
                    self.zeroed.add(target.id)
                self.store(target, self.expr(s.value))
        elif isinstance(s, ast.AugAssign) and _named(s.target, "_ok"):
            # a check: rvm.engines.native.defer_checks folds them into a flag tested when
            # control leaves a straight run of code (fewer blocks); here each is
            # its own branch to the fault exit, so `_ok` stays true (its tests are
            # dropped) and an address `(a) * _m` comes after its check has passed
            self.checking = True        # its comparisons fail alike on nan: no finite()
            self.guard(self.b.not_(self.truth(self.expr(s.value))), self.fault_block)
            self.checking = False
            self.checked = checked      # (an address check's sum, for its address)
        elif isinstance(s, ast.AugAssign) and _named(s.target, "_fin"):
            pass                        # finiteness: see finite() and clean()
        elif isinstance(s, ast.AugAssign) and _named(s.target, "_lost"):
            # a value accumulated into a register known to hold 0.0, whose `e - e` is
            # taken as 0.0 later (rvm.engines.compiled: _exact): tested, as when returned
            self.finite(self.expr(s.value))
        elif isinstance(s, ast.AugAssign):
            self.store(s.target, self.binop(s.op, self.expr(s.target), self.expr(s.value)))
        elif isinstance(s, ast.If) and is_exact(s.test):
            self.counted(s)
        elif isinstance(s, ast.If) and stops(s):
            self.stop_at(s)
        elif isinstance(s, ast.If):
            if is_raise(s.body) and isinstance(s.test, ast.UnaryOp) and \
                    _named(s.test.operand, "_ok"):
                return
            if is_raise(s.body):
                budget = _raises_budget(s.body)
                nxt = getattr(self, "following", None)
                if budget and type(self) is Lowering and isinstance(nxt, ast.Assign) and \
                        state_index(nxt.targets[0]) == 1:
                    # the budget's test at the end of the function: left to the caller,
                    # which reads the budget back (a callee's steps are then reported
                    # from the caller's next back edge: see checkpoint) or, for an entry,
                    # tests it after the call (rvm.engines.llvm)
                    return
                if budget and self.last is not None:
                    self.clean()        # the budget's test, and now and then a look
                    self.poll()
                    return
                self.checking = True
                self.guard(self.truth(self.expr(s.test)),
                           self.checkpoint() if budget else self.fault_block)
                self.checking = False
                if budget:          # a back edge (or the end): stop here if interrupted
                    self.poll()
                return
            then, other = (self.fn.append_basic_block() for _ in range(2))
            b.cbranch(self.truth(self.expr(s.test)), then, other)
            self.arms(((then, s.body), (other, s.orelse)))
        elif isinstance(s, ast.For):
            self.for_(s)
        elif isinstance(s, ast.While) and (cases := block_cases(s)) is not None:
            self.dispatch(cases)
        elif isinstance(s, ast.While):
            head, loop, after = (self.fn.append_basic_block() for _ in range(3))
            b.branch(head)
            b.position_at_end(head)
            b.cbranch(self.truth(self.expr(s.test)), loop, after)
            b.position_at_end(loop)
            self.loops.append((head, after))
            self.body(s.body)
            self.loops.pop()
            if not b.block.is_terminated:
                b.branch(head)
            b.position_at_end(after)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call) and \
                isinstance(s.value.func, ast.Name) and s.value.func.id in self.functions:
            self.call(ast.Tuple([], ast.Store()), s.value)      # (a function of no
            # parameters: nothing comes back)
        elif isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            self.expr(s.value)
        elif isinstance(s, ast.Break):
            b.branch(self.loops[-1][1])
        elif isinstance(s, ast.Continue):
            b.branch(self.loops[-1][0])
        elif isinstance(s, ast.Pass):
            pass
        elif isinstance(s, ast.Raise):
            b.branch(self.fault_block)
        elif isinstance(s, ast.Return):
            self.finite(*(b.load(self.vars[name]) for name in sorted(self.vars)
                          if _REGISTER.fullmatch(name)))
            self.leaving()
            if self.last is not None:
                b.store(b.load(self.last), self.slot(LAST))
            # (a look on leaving a function that looks; with LOOKS, every function)
            if (self.looked and self.last is not None) or \
                    (self.functions.get("LOOKS") and "_n" in self.vars):
                self.stop_if_shadowed()
                self.note_shadows(b.load(self.vars["_n"]), leaving=True)
            elts = s.value.elts if isinstance(s.value, ast.Tuple) else [s.value]
            out = ir.Constant(self.fn.return_value.type, None)
            # after the results, a gradient function's float locals' shadows (end_shadows)
            extra = [ast.Name(n, ast.Load()) for n in self.end_shadows]
            for k, e in enumerate([*elts, *extra][:len(self.fn.return_value.type.elements)]):
                v = self.expr(e)
                out = b.insert_value(out, self.coerce(v, self.fn.return_value.type.elements[k]),
                                     k)
            b.ret(out)
        else:
            raise Unsupported(ast.unparse(s))

    def counted(self, s: ast.If) -> None:
        """`if _exact(c): <a counted loop> else: <the general loop>` (rvm.engines.compiled:
        counted loops): c is the loop's entry test, over ints, in Python's unbounded
        arithmetic; here each +, - and * is checked for overflow, and one that overflows
        makes c false (the general loop then runs, which checks every pass). A loop that
        calls a function whose budget can run out midway is the general loop alone: the
        counted loop charges every pass up front, so such a callee would run out early,
        and with no record of the pass (see call); beside the call, a pass's tests cost
        little."""
        run_out = self.functions.get("RUN_OUT", frozenset()) & \
            self.functions.get("CALLS", {}).get(self.node.name, frozenset())
        if type(self) is Lowering and run_out and any(
                isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and
                c.func.id in run_out for c in ast.walk(s)):
            self.body(s.orelse)
            return
        b = self.b
        then, other = (self.fn.append_basic_block() for _ in range(2))
        test = s.test.args[0]
        # its parts in turn, each a branch (the first, that the loop is long enough, is
        # often false: then the rest is not worked out)
        parts = test.values if isinstance(test, ast.BoolOp) and \
            isinstance(test.op, ast.And) else [test]
        self.worked_out, self.shapes, self.numbers = {}, {}, {}   # (see exact)
        parts = list({self.shape(p): p for p in parts}.values())     # (each once)
        for k, part in enumerate(parts):
            overflow = [self.t.i1(0)]
            ok = b.and_(self.truth(self.exact(part, overflow)), b.not_(overflow[0]))
            if k + 1 < len(parts):
                guard(b, b.not_(ok), other)
            else:
                b.cbranch(ok, then, other)
        self.arms(((then, s.body), (other, s.orelse)))

    def arms(self, arms) -> None:
        """Each (block, statements) lowered from its block, all meeting after."""
        b = self.b
        after = self.fn.append_basic_block()
        for block, stmts in arms:
            b.position_at_end(block)
            self.body(stmts)
            if not b.block.is_terminated:
                b.branch(after)
        b.position_at_end(after)

    def exact(self, e, overflow: list):
        """An int condition or value of a counted loop's entry test, its overflows or-ed
        into overflow[0]. A subexpression the test has worked out already is that value
        again (its overflow is in overflow[0] already, or an earlier part of the test,
        which branches away on one, had it): the tests repeat their bounds' sums."""
        if isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp, ast.UnaryOp)):
            key = self.shape(e)
            done = self.worked_out.get(key)
            if done is None:
                done = self.worked_out[key] = self._exact(e, overflow)
            return done
        return self._exact(e, overflow)

    def shape(self, e) -> int:
        """A number for e's structure within a counted loop's entry test (see exact):
        the same for equal expressions, made from its parts' numbers."""
        known = self.shapes.get(id(e))     # (number, e): e kept, so its id is not reused
        if known is not None:
            return known[0]
        if isinstance(e, ast.Name):
            key = ("name", e.id)
        elif isinstance(e, ast.Constant):
            key = ("constant", repr(e.value))
        elif isinstance(e, ast.BinOp):
            key = (type(e.op).__name__, self.shape(e.left), self.shape(e.right))
        elif isinstance(e, ast.UnaryOp):
            key = (type(e.op).__name__, self.shape(e.operand))
        elif isinstance(e, ast.Compare):
            key = ("compare", *(type(o).__name__ for o in e.ops),
                   *(self.shape(x) for x in (e.left, *e.comparators)))
        elif isinstance(e, ast.BoolOp):
            key = (type(e.op).__name__, *(self.shape(v) for v in e.values))
        else:
            key = ("other", ast.dump(e))
        number = self.numbers.setdefault(key, len(self.numbers))
        self.shapes[id(e)] = number, e
        return number

    def _exact(self, e, overflow: list):
        b, t = self.b, self.t
        if isinstance(e, ast.BinOp) and type(e.op) in _CHECKED:
            a, c = (self.coerce(self.exact(x, overflow), t.i64) for x in (e.left, e.right))
            fn = self.declare(f"llvm.{_CHECKED[type(e.op)]}.with.overflow.i64",
                              self.ir.LiteralStructType([t.i64, t.i1]), [t.i64, t.i64])
            out = b.call(fn, [a, c])
            overflow[0] = b.or_(overflow[0], b.extract_value(out, 1))
            return b.extract_value(out, 0)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            if isinstance(e.operand, ast.Constant):     # -2 ** 63 is a constant here
                return t.i64(-e.operand.value)
            return self.exact(ast.BinOp(ast.Constant(0), ast.Sub(), e.operand), overflow)
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not):
            return b.not_(self.truth(self.exact(e.operand, overflow)))
        if isinstance(e, ast.BoolOp):
            values = [self.truth(self.exact(v, overflow)) for v in e.values]
            return functools.reduce(b.and_ if isinstance(e.op, ast.And) else b.or_, values)
        if isinstance(e, ast.Compare):
            terms = [self.exact(x, overflow) for x in (e.left, *e.comparators)]
            return functools.reduce(b.and_, [
                self.compare(op, x, y) for op, x, y in zip(e.ops, terms, terms[1:])])
        if isinstance(e, ast.Call) and _named(e.func, "_plus"):     # not -0.0
            x = b.bitcast(self.coerce(self.expr(e.args[0]), t.f64), t.i64)
            return b.icmp_signed("!=", x, t.i64(-2 ** 63))
        if isinstance(e, (ast.Constant, ast.Name)):
            return self.expr(e)
        raise Unsupported(ast.unparse(e))

    def for_(self, s: ast.For) -> None:
        """`for x in range(a, b[, -1]):` or `for _ in range(n):` (a counted loop's passes,
        rvm.engines.compiled); x keeps its last value, as in Python. In `for x in
        _finite_after(range(...))`, floats on their way to the heap are tested after the
        loop (one flag, no branch in it: LLVM may vectorise it), which the writer allows
        where no float becomes an int in the loop: a nan then never reaches an address or
        a branch, and a run that made one still fails (later, with the same error, found
        by the interpreter's run)."""
        b, t = self.b, self.t
        call, charge = s.iter, None
        later = isinstance(call, ast.Call) and _named(call.func, "_finite_after")
        kept = None         # the registers at a chunk's end as a look keeps them (keep)
        if later or (isinstance(call, ast.Call) and _named(call.func, "_passes")):
            hint = call.args[4]
            call, charge = call.args[0], [a.value for a in call.args[1:4]]
            if isinstance(hint, ast.Tuple):
                kept = hint.elts and (hint.elts[0].value, self.coerce(self.expr(hint.elts[1]),
                                                                      t.i64),
                                      ast.literal_eval(hint.elts[2]))
        if not (isinstance(call, ast.Call) and _named(call.func, "range") and
                1 <= len(call.args) <= 3 and not s.orelse and
                isinstance(s.target, ast.Name)):
            raise Unsupported(ast.unparse(s))
        args = [self.coerce(self.expr(a), t.i64) for a in call.args]
        lo, hi = (t.i64(0), args[0]) if len(args) == 1 else args[:2]
        down = len(call.args) == 3
        if down and ast.dump(call.args[2]) != ast.dump(ast.UnaryOp(ast.USub(), ast.Constant(1))):
            raise Unsupported(ast.unparse(s))
        if later:
            self.later = self.new_flag()

        def pass_(j):           # (counting down: x = a - j, j = 0 .. a - b - 1)
            if s.target.id != "_":
                b.store(b.sub(lo, j) if down else j, self.vars[s.target.id])
            self.counting += 1  # (the budget was charged for every pass: no records)
            self.body(s.body)
            self.counting -= 1
        first, end = (t.i64(0), b.sub(lo, hi)) if down else (lo, hi)
        looks = charge is not None and self.last is not None
        # (chunks of LOOK_EVERY steps, callees' included: a failure in a chunk is placed
        # at its end, at most that far off)
        span = SEARCH_EVERY if self.searching() else LOOK_EVERY
        every = min(POLL_EVERY, max(1, span // (charge[0] + charge[2]))) if looks \
            else POLL_EVERY

        def chunk(c):           # `every` passes, then a poll of the interrupt cell
            start = b.add(first, b.mul(c, t.i64(every)))
            stop = b.add(start, t.i64(every))
            stop = b.select(b.icmp_signed("<", stop, end), stop, end)
            if looks:           # (a check that fails in the chunk fails this far in)
                b.store(self.budget_at(stop, end, *charge[:2]), self.chunk_end)
            loop_over(b, start, stop, pass_)
            if looks:
                self.look(stop, end, *charge[:2], kept)
            self.poll()
        chunks = b.sdiv(b.add(b.sub(end, first), t.i64(every - 1)), t.i64(every))
        loop_over(b, t.i64(0), chunks, chunk)
        if looks:
            b.store(t.i64(-1), self.chunk_end)
        if later:
            flag, self.later = self.later, None
            self.guard(b.load(flag), self.fault_block)

    def look(self, stop, end, charge: int, passed: int, kept) -> None:
        """After a chunk of a counted loop's passes that is not its last: fault unless
        every float register (and every float the chunk stored) is finite, else note the
        budget the general loop would have left at the back edge after this pass (`last`,
        see clean): the loop charged its own steps for every pass on entry, (passes to go)
        x `charge` - `passed` more than it has used, and its callees charge theirs as
        they run (the budget left now). A value made not finite in the loop is then found
        within a chunk (about LOOK_EVERY steps, its callees' included) of it, and the
        replay stops at the chunk before (not the whole loop run, then a build without
        counted loops); in a function that keeps copies of its registers, the copy
        (kept: see for_) is made here."""
        b, t = self.b, self.t
        body, after = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(b.icmp_signed("<", stop, end), body, after)
        b.position_at_end(body)
        here = self.budget_at(stop, end, charge, passed)
        bad = self.registers_not_finite()
        if self.later is not None:
            flag = b.load(self.later)
            bad = flag if bad is None else b.or_(bad, flag)
        if bad is not None:     # (the fault's place: the chunk's end, see exit)
            self.guard(bad, self.fault_block)
        b.store(here, self.last)
        if kept is not None and self.cases is not None:
            # (a counted loop is a block that loops to itself: its back edge goes to it;
            # a counter that steps only after the loop is `end` less the passes to go)
            fix = kept and (kept[0], b.sub(kept[1], b.mul(b.sub(end, stop), t.i64(kept[2]))))
            self.keep(self.case, here, fix or None)
        self.note_shadows(here)
        b.branch(after)
        b.position_at_end(after)

    def budget_at(self, stop, end, charge: int, passed: int):
        """The budget the general loop would have left at the back edge after pass `stop`
        of a counted loop that ends at `end` (see look), from the budget left now."""
        b, t = self.b, self.t
        return b.sub(b.add(b.load(self.vars["_n"]), b.mul(b.sub(end, stop), t.i64(charge))),
                     t.i64(passed))

    def stop_at(self, s: ast.If) -> None:
        """`if <budget> < <need>: _stop_at(k, <budget>)`, a budget test after a call
        (rvm.engines.compiled: Compiled.tested): short of the steps to the next test,
        the run stops before instruction k, leaving its registers and the budget left
        there in a record (AT_SITE); or `_stop_before(<budget>)`, the test before a
        call, made with the call (see call). Rows in lockstep test at each function's
        end."""
        if type(self) is not Lowering:
            return
        if _named(s.body[0].value.func, "_stop_before"):
            self.before = s
            return
        site = self.fn.append_basic_block()
        self.guard(self.truth(self.expr(s.test)), site)
        call = s.body[0].value
        with self.b.goto_block(site):       # (the function's one record block: shared)
            self.shared(AT_SITE, call.args[0].value, self.expr(call.args[1]),
                        self.budget_block)

    def checkpoint(self):
        """The exit for the step budget's test at a back edge: it leaves the registers,
        and the block the edge goes to, in the heap cells above the top (when they fit),
        so that the machine can report the instruction where the budget ran out without
        re-running the whole pass (rvm.engines.machine: Machine._exhausted); each caller
        adds its own registers, and the block of its call, after it (see call)."""
        block = self.edge()
        if block is None:
            return self.budget_block
        site = self.fn.append_basic_block()
        with self.b.goto_block(site):
            self.shared(AT_BACK_EDGE, block, self.b.load(self.vars["_n"]), self.budget_block)
        return site

    def edge(self) -> int | None:
        """The block the back edge being lowered goes to (None: rows in lockstep, no
        block loop, or not known here)."""
        nxt = getattr(self, "following", None)
        if type(self) is not Lowering or self.cases is None:
            return None
        if isinstance(nxt, ast.Continue):
            return self.case
        if isinstance(nxt, ast.Assign) and _named(nxt.targets[0], "_b") and \
                isinstance(nxt.value, ast.Constant) and nxt.value.value >= 0:
            return nxt.value.value
        return None

    def keep(self, block: int | None, n, fix: tuple | None = None) -> None:
        """At a look that found every float register finite, at the back edge to `block`
        with n steps of budget left: a copy of the registers (see from_kept), and in a
        gradient pass of their shadows, kept where those are finite too; fix: (a
        register, its value there) where the register does not hold it yet. In the
        build that searches a gradient pass (LOOKS), the first look that finds a shadow
        not finite leaves the copy of the look before as a record (AT_LOOK) and stops the
        pass (SHADOWED): the interpreter steps from there, a few steps, to the shadow
        that stopped being finite (rvm.ad.gradient.not_finite)."""
        if self.kept_at is None or block is None:
            return
        b = self.b
        skip = None
        bad = self.registers_not_finite(GRAD_REGISTER)
        if self.root is not None:       # (a function that writes the heap: see snapshot)
            if bad is not None:         # (registers at every look, cells with a snapshot)
                self.stop_if_shadowed(bad, cells=False)
            take, skip = self.fn.append_basic_block(), self.fn.append_basic_block()
            b.cbranch(self.snapshot_due(n), take, skip)
            b.position_at_end(take)
        if bad is not None or self.root is not None:
            copy, after = self.fn.append_basic_block(), self.fn.append_basic_block()
            self.stop_if_shadowed(bad)
            b.cbranch(bad if bad is not None else self.t.i1(0), after, copy)
            b.position_at_end(copy)
            self.copy(block, n, fix)
            b.branch(after)
            b.position_at_end(after)
        else:
            self.copy(block, n, fix)
        if skip is not None:
            b.branch(skip)
            b.position_at_end(skip)

    def claim(self) -> None:
        """On entry to a function with loops whose run writes the heap: is this frame the
        run's root (the state array names its function, ROOT, and the machine gave a
        snapshot buffer, SNAP)? The first such frame takes the name (-1), so a recursive
        call of the root's function is not the root."""
        b, t = self.b, self.t
        with b.goto_block(self.fn.entry_basic_block):
            self.root = b.alloca(t.i1, name="root")
            self.room = b.alloca(t.i64, name="room")
            self.snap_top = b.alloca(t.i64, name="snap_top")
        named = b.load(self.slot(ROOT))
        mine = b.and_(b.icmp_signed("==", named, t.i64(name_id(self.node.name))),
                      b.icmp_signed("!=", b.load(self.slot(SNAP)), t.i64(0)))
        b.store(mine, self.root)
        b.store(b.select(mine, t.i64(-1), named), self.slot(ROOT))
        b.store(t.i64(-1), self.room)       # (the snapshot's room, read where there is one)
        b.store(t.i64(0), self.snap_top)    # (the heap top at the last snapshot)
        claimed, after = self.fn.append_basic_block(), self.fn.append_basic_block()
        b.cbranch(mine, claimed, after)
        b.position_at_end(claimed)
        b.store(b.load(b.gep(b.inttoptr(b.load(self.slot(SNAP)), t.ptr), [t.i64(SNAP_ROOM)])),
                self.room)
        b.branch(after)
        b.position_at_end(after)

    def heap_shadows_not_finite(self, lo=None, hi=None):
        """A flag: some heap cell's shadow from lo to hi is inf or nan (one scan, no
        branch per cell); by default, in the root frame (see claim), the cells below the
        top."""
        b, t = self.b, self.t
        if lo is None:
            lo, hi = t.i64(0), b.select(b.load(self.root), b.load(self.slot(0)), t.i64(0))
        flag = self.new_flag()

        def test(c):
            g = b.load(self.cell("HG", c))
            self.raise_flag(flag, b.fcmp_unordered("uno", b.fsub(g, g), t.f64(0.0)))
        loop_over(b, lo, hi, test)
        return b.load(flag)

    def dropping(self, d, end) -> None:
        """In the build that searches a gradient pass (LOOKS): before heap cells d to end
        drop their shadows (a FREE), a look at them: where one is not finite, the
        search stops here if a look would (stop_if_shadowed), and it is noted
        (as drop_look notes a register's), so that no later look stops the search past
        it (rvm.ad.gradient.not_finite)."""
        if self.dropped is None:
            return
        bad = self.heap_shadows_not_finite(d, end)
        regs = self.registers_not_finite(GRAD_REGISTER)
        self.stop_if_shadowed(bad if regs is None else self.b.or_(bad, regs))
        self.raise_flag(self.dropped, bad)

    def snapshot_due(self, n):
        """At a look with n steps of budget left, in a function that writes the heap (see
        snapshot): is this the root frame, its heap small enough (the snapshot's room),
        and either no copy kept yet or SNAP_SPACING steps per cell of the last snapshot's
        heap (at least CLEAN_EVERY) gone since it? (Per cell of the last: a heap that
        grows faster than a cell per SNAP_SPACING steps still gets snapshots.) In the
        build that searches a gradient pass, a step per cell (at least SEARCH_EVERY), for
        heaps of at most SEARCH_CELLS cells: the interpreter steps from the snapshot to
        the place."""
        b, t = self.b, self.t
        top, last = b.load(self.slot(0)), b.load(b.gep(self.kept_at, [t.i64(1)]))
        search = self.searching()
        least = SEARCH_EVERY if search else CLEAN_EVERY
        spacing = b.mul(b.load(self.snap_top), t.i64(1 if search else SNAP_SPACING))
        spacing = b.select(b.icmp_signed("<", spacing, t.i64(least)), t.i64(least), spacing)
        due = b.or_(b.icmp_signed("<", last, t.i64(0)),
                    b.icmp_signed(">=", b.sub(last, n), spacing))
        room = b.load(self.room)
        if search:
            room = b.select(b.icmp_signed("<", room, t.i64(SEARCH_CELLS)), room,
                            t.i64(SEARCH_CELLS))
        return b.and_(b.and_(b.load(self.root), b.icmp_signed("<=", top, room)), due)

    def snapshot(self, n) -> None:
        """With the copy of the registers a look keeps (keep) in the root frame of a
        function that writes the heap: the heap's cells (and in a gradient pass their
        shadows) into the machine's snapshot buffer (SNAP), with the budget left here,
        the heap top and the function's name id before them, so that a failure after it
        puts the machine there, the heap as it was (rvm.engines.machine: Machine._exhausted),
        and the interpreter steps on to the failing instruction: one native run, not a
        second to the last look (the copy costs under a step per SNAP_SPACING steps)."""
        b, t = self.b, self.t
        top = b.load(self.slot(0))
        b.store(top, self.snap_top)
        grad = self.node.name.rsplit("_", 1)[-1].startswith("g")     # (a gradient pass)
        snapshot_cells(b, t, b.inttoptr(b.load(self.slot(SNAP)), t.ptr),
                       (n, top, t.i64(name_id(self.node.name))), self.H, top,
                       (self.G, b.load(self.room)) if grad else None)

    def searching(self) -> bool:
        """Is this the build that searches a gradient pass (LOOKS), in a function that
        keeps copies of its registers (keep)? Its looks come every SEARCH_EVERY steps."""
        return bool(self.functions.get("LOOKS")) and self.kept_at is not None

    def stop_if_shadowed(self, bad=None, cells: bool = True) -> None:
        """In the build that searches a gradient pass (LOOKS), in a function that keeps
        copies: where a look finds a shadow not finite (bad), the first in the pass, and
        a copy is kept, leave that copy as a record and stop (SHADOWED; see keep)."""
        if not self.searching():
            return
        b, t = self.b, self.t
        bad = self.registers_not_finite(GRAD_REGISTER) if bad is None else bad
        if self.root is not None and cells:     # (and in the root frame of one that
            heap = self.heap_shadows_not_finite()   # writes the heap, a cell's: snapshot)
            bad = heap if bad is None else b.or_(bad, heap)
        if bad is None:
            return
        first = b.and_(bad, b.not_(self.shadows_seen()))
        kept = b.icmp_signed(">=", b.load(b.gep(self.kept_at, [t.i64(1)])), t.i64(0))
        stop = self.fn.append_basic_block()
        self.guard(b.and_(first, kept), stop)
        with b.goto_block(stop):
            self.write_kept()
            b.branch(self.exit(SHADOWED))

    def copy(self, block: int, n, fix: tuple | None) -> None:
        """The registers (and shadows) into the kept copy (see keep)."""
        b, t = self.b, self.t
        for k, name in enumerate(self.frame_registers()):
            v = fix[1] if fix and fix[0] == name else b.load(self.vars[name])
            b.store(b.bitcast(v, t.i64) if v.type == t.f64 else v, b.gep(self.kept, [t.i64(k)]))
        b.store(t.i64(block), self.kept_at)
        b.store(n, b.gep(self.kept_at, [t.i64(1)]))
        if self.root is not None:
            self.snapshot(n)

    def from_kept(self, otherwise, callee: bool):
        """The exit of a failed check (a float found not finite at a look, a check
        where the value is used; callee: a callee's failed check) in a function whose
        run, its callees' included, writes no heap cell (or in the root frame of one
        that writes the heap, whose copies come with snapshots): with a copy of the registers
        from the last look (keep), a record of them (AT_LOOK: the block its back edge
        went to, the budget left there) above the heap top and the LOOKED code (callers
        add their records, as at the step budget's end), so that the interpreter steps
        from that look to the failing instruction (rvm.engines.machine:
        Machine._from_look) instead of native code running the pass again to that look;
        without a copy yet (or, from a callee, another failure than a check's),
        `otherwise`. The heap is what it was at that look, since nothing wrote it (or
        the machine puts back the snapshot taken with the copy)."""
        b, t = self.b, self.t
        block = self.fn.append_basic_block("from_kept")
        write = self.kept_write
        if write is None:       # (one record writer for both: see shared)
            write = self.kept_write = self.fn.append_basic_block()
            with b.goto_block(write):
                self.write_kept()
                b.cbranch(b.icmp_signed("==", b.load(self.flag), t.i64(FAULT)),
                          self.exit(LOOKED, callee=True), self.exit(LOOKED))
        with b.goto_block(block):
            none = b.icmp_signed("<", b.load(b.gep(self.kept_at, [t.i64(1)])), t.i64(0))
            if callee:
                none = b.or_(none, b.icmp_signed("!=", b.load(self.flag), t.i64(FAULT)))
            b.cbranch(none, otherwise, write)
        return block

    def write_kept(self) -> None:
        """The kept copy (keep) as a record above the heap top (AT_LOOK)."""
        b, t = self.b, self.t
        regs = self.frame_registers()
        b.call(_record_function(self.ir, t, b.module),
               [self.H, self.cap, b.load(self.slot(0)), t.i64(name_id(self.node.name)),
                t.i64(AT_LOOK), b.load(self.kept_at), b.load(b.gep(self.kept_at, [t.i64(1)])),
                t.i64(len(regs)), b.bitcast(_names(self.ir, t, b.module, regs), t.ptr),
                self.kept])

    def frame_registers(self) -> list[str]:
        """The names of what a record of this frame keeps (registers, their shadows)."""
        return sorted(n for n in self.vars if FRAME_REGISTER.fullmatch(n))

    def shared(self, kind: int, block, arg, then) -> None:
        """Branch to the function's one block that writes a record (see record) and goes
        on to `then`, with the record's kind, block and argument in three cells: the
        registers are written once per function, not at every site (a function with many
        calls and back edges made most of its code of record writes)."""
        b, t = self.b, self.t
        if not self.records:
            with b.goto_block(self.fn.entry_basic_block):
                self.record_cells = tuple(b.alloca(t.i64, name=f"record_{x}")
                                          for x in ("kind", "block", "arg"))
        cells = self.record_cells
        target = self.records.get(then)
        if target is None:
            target = self.records[then] = self.fn.append_basic_block("record")
            with b.goto_block(target):
                self.record(*(b.load(c) for c in cells))
                b.branch(then)
        for cell, v in zip(cells, (kind, block, arg)):
            b.store(t.i64(v) if isinstance(v, int) else v, cell)
        b.branch(target)

    def record(self, kind: int, block, arg) -> None:
        """Append a checkpoint record to the chain above the heap top (when it fits):
        CHECKPOINT, crc32 of the function's name, the kind (AT_BACK_EDGE: the block the
        edge goes to and the budget left, < 0; AT_CALL: the block of the call, and crc32
        of the callee's name plus 2^32 times the number of the block's calls of it
        before this one; AT_SITE: the instruction before which a budget test at a call
        stopped the run, and the budget left there), the number of registers, then
        (crc32 of its name, its bits) for each register (and, in a gradient mode, each
        float register's shadow). The site only lists its registers; the module's one
        `rvm_record` writes them (the walk past a callee's records, the room tests: a few
        instructions per site, not a loop in every function)."""
        b, t = self.b, self.t
        regs = self.frame_registers()
        if self.record_slots is None:   # the function's: its registers' names (a constant
            with b.goto_block(self.fn.entry_basic_block):    # of the module), their values
                values = b.alloca(t.i64, size=t.i64(max(len(regs), 1)))
            self.record_slots = (_names(self.ir, t, b.module, regs), values, len(regs))
        names, values, count = self.record_slots
        if count != len(regs):          # (never: a function's registers are all known
            raise Unsupported("registers added after a record")     # when it starts)
        for k, name in enumerate(regs):
            v = b.load(self.vars[name])
            b.store(b.bitcast(v, t.i64) if v.type == t.f64 else v, b.gep(values, [t.i64(k)]))
        b.call(_record_function(self.ir, t, b.module),
               [self.H, self.cap, b.load(self.slot(0)), t.i64(name_id(self.node.name)),
                t.i64(kind) if isinstance(kind, int) else kind,
                t.i64(block) if isinstance(block, int) else block, arg,
                t.i64(count), b.bitcast(names, t.ptr),
                values])

    def poll(self) -> None:
        """Leave with the INTERRUPT code if the process-wide interrupt cell is set (a SIGINT
        arrived: rvm.engines.llvm.interrupts); a load and a predicted branch."""
        b, ir = self.b, self.ir
        module = self.fn.module
        cell = module.globals.get(INTERRUPT_CELL)
        if cell is None:
            cell = ir.GlobalVariable(module, ir.IntType(64), INTERRUPT_CELL)
        flag = b.load_atomic(cell, "monotonic", 8)
        guard(b, b.icmp_signed("!=", flag, ir.IntType(64)(0)), self.interrupt_block)

    def leaving(self) -> None:
        """Control leaves the function (rvm.engines.lanes acts on its rows' failed checks
        here, the last of them the finiteness of the registers returned)."""

    def finite(self, *values) -> None:
        """Fault unless every value is finite. The python engine tests each float
        result (`_fin += x - x`, once per straight run) at the next back edge; native
        code every float register at back edges now and then (see clean), and at once
        where a non-finite value could stop showing: in a comparison (it would steer
        control flow), on its way to the heap, and in every float register when the
        function returns. Elsewhere a register's value only changes by arithmetic that
        keeps inf and nan (d += ..., x *= y, x /= y, rotations, swaps), so a value that
        stops being finite is still caught before it is seen, and a failed run goes to
        the interpreter, which reports where it happened (from the back edge before it:
        rvm.engines.machine, Machine._replay). Shadows are not tested here: a
        shadow may overflow where the loss does not depend on it (a constant's), and a
        test per store of a shadow keeps LLVM from vectorising gradient loops; the
        gradients a pass returns are tested (rvm.ad.gradient.finite)."""
        bad = self.non_finite(values)
        if bad is not None and self.later is not None:     # tested after the loop
            self.raise_flag(self.later, bad)
        elif bad is not None:
            self.guard(bad, self.fault_block)

    def clean(self) -> None:
        """A back edge's test of the step budget (`_n < 0`: to the checkpoint) and, once
        CLEAN_EVERY steps have gone since the last time, a look at every float register:
        fault unless each is finite, else note the budget left here (`last`, where
        Machine._replay starts again). One comparison a pass (`_n <= mark`, mark never
        below -1) makes both. A value that stops being finite stays so in its register
        until it is compared, stored or returned (tested at once: see finite), so a run
        that made one stops within CLEAN_EVERY steps and a pass of it, and the replay
        starts before it; a test of each result (as the python engine makes) cost tight
        float loops 20-50% of their time. Rows in lockstep have no replay (a batch with
        a failing row runs again row by row)."""
        b, t = self.b, self.t
        n = b.load(self.vars["_n"])
        slow, after = self.fn.append_basic_block(), self.fn.append_basic_block()
        due = b.icmp_signed("<=", n, b.load(self.mark))
        b.cbranch(self.rarely(due), slow, after)
        b.position_at_end(slow)
        self.guard(b.icmp_signed("<", n, t.i64(0)), self.checkpoint())
        bad = self.registers_not_finite()
        if bad is not None:
            self.guard(bad, self.fault_block)
        b.store(n, self.last)
        self.keep(self.edge(), n)
        self.note_shadows(n)
        b.store(self.next_look(n), self.mark)
        b.branch(after)
        b.position_at_end(after)

    def note_shadows(self, n, placed: bool = True, leaving: bool = False) -> None:
        """At a look in a gradient pass: until a look finds a float register's shadow
        that is not finite, the budget left here (n) in the state array (SHADOWS; and
        SHADOWS_BAD once one did). Shadows are not tested as they are made (a shadow
        that overflows where the loss does not depend on it is no error, and a test per
        store of a shadow cost 20% of a GMM gradient); when the gradients a pass
        returns are not finite, this is where the search for the first shadow that
        stopped being finite starts (rvm.ad.gradient.not_finite). placed=False: a look
        inside a block, where n (charged when the block began) is not the budget left
        here: it notes a shadow not finite, not the budget (and drop_look's). leaving:
        the look where the frame returns."""
        b, t = self.b, self.t
        bad = self.registers_not_finite(GRAD_REGISTER)
        self.looked = True
        # (a cell's shadow made not finite, shadow_made: no later look is noted; it is
        # told the machine where the frame leaves, not at every look, so that a look of
        # the root frame that tests the cells' shadows still stops the search there)
        heap = None if self.heap_bad is None else b.load(self.heap_bad)
        if bad is None and heap is None:
            return
        seen = self.shadows_seen()
        said = seen if bad is None else b.or_(seen, bad)
        if placed:
            fine = b.not_(said if heap is None else b.or_(said, heap))
            b.store(b.select(fine, n, b.load(self.slot(SHADOWS))), self.slot(SHADOWS))
        if leaving and heap is not None:
            said = b.or_(said, heap)
        b.store(b.zext(said, t.i64), self.slot(SHADOWS_BAD))

    def drop_look(self, name: str) -> None:
        """With LOOKS, before a shadow is dropped (set to 0.0: an ancilla's at the end
        of its block, a temporary's): whether it was not finite, in a flag of the frame
        (no store to the state array in a loop: LLVM keeps it in a register) that the
        looks, the function's exits and the search's stops read with SHADOWS_BAD
        (shadows_seen). Only the dropped shadow: the others are seen at the next look,
        or where they are dropped."""
        self.looked = True
        bad = self.non_finite([self.b.load(self.vars[name])])
        if bad is not None and self.dropped is not None:
            self.raise_flag(self.dropped, bad)

    def shadows_seen(self):
        """A flag: a look (or a dropped shadow) found a shadow not finite (SHADOWS_BAD)."""
        b, t = self.b, self.t
        seen = b.icmp_signed("!=", b.load(self.slot(SHADOWS_BAD)), t.i64(0))
        return seen if self.dropped is None else b.or_(seen, b.load(self.dropped))

    def registers_not_finite(self, names=_REGISTER):
        """A flag: some float register (or, names=GRAD_REGISTER, some float register's
        shadow) holds inf or nan (None: it has none)."""
        return self.non_finite([self.b.load(self.vars[name]) for name in sorted(self.vars)
                                if names.fullmatch(name)])

    def next_look(self, n):
        """The budget left at the next look (see clean), never below -1 (the budget's own
        test)."""
        b, t = self.b, self.t
        at = b.sub(n, t.i64(SEARCH_EVERY if self.searching() else CLEAN_EVERY))
        return b.select(b.icmp_signed("<", at, t.i64(-1)), t.i64(-1), at)

    def non_finite(self, values):
        """A flag: some value is inf or nan (x - x is nan then, 0 otherwise); None when
        all are constants."""
        b = self.b
        terms = [b.fsub(v, v) for v in values if not isinstance(v, self.ir.Constant)]
        if not terms:
            return None
        total = functools.reduce(b.fadd, terms)
        return b.fcmp_unordered("uno", total, total)

    def dispatch(self, cases: dict) -> None:
        """The generated code's loop over basic blocks (`while _b >= 0:` `if _b == 0: ...`
        `elif _b == 1: ...`) as the blocks themselves: each `_b = k` is a branch to case
        k (k < 0: out of the loop), so LLVM sees the program's own control flow instead of
        every transfer meeting at one switch."""
        b = self.b
        head, after = self.fn.append_basic_block(), self.fn.append_basic_block()
        blocks = {k: self.fn.append_basic_block() for k in cases}
        outer, self.cases = self.cases, (head, after, blocks)
        if outer is None and self.root is not None and self.functions.get("RESUME"):
            self.resume(head)
        b.branch(head)
        b.position_at_end(head)
        at = b.load(self.vars["_b"])
        switch = b.switch(at, after)
        for k, block in blocks.items():
            switch.add_case(self.t.i64(k), block)
        for k, stmts in cases.items():
            b.position_at_end(blocks[k])
            self.case = k
            self.body(stmts)
            if not b.block.is_terminated:
                b.branch(head)           # no transfer: the same case again, as in Python
        self.cases = outer
        b.position_at_end(after)

    def resume(self, head) -> None:
        """Before the block loop of a frame that may claim the root (claim): where the
        state array gives the address of a look's record (RESUME: the block its back edge
        went to, the number of registers, then their bits in the order of
        frame_registers, as from_kept left them), the root frame starts there instead of
        at its entry, the heap as the snapshot taken with that look put it back
        (rvm.engines.machine: Machine._resume): a failure far from the last snapshot
        costs a native run from there, not a second run of the whole pass. Only in the
        build that resumes (RESUME: rvm.engines.compiled, Compiled.resume): the loop
        head's second way in costs LLVM what it knew of the registers on entry (a loop
        of the usual build was 4-5% slower where it was there)."""
        b, t = self.b, self.t
        at = b.load(self.slot(RESUME))
        go, stay = self.fn.append_basic_block("resume"), self.fn.append_basic_block()
        wanted = b.and_(b.load(self.root), b.icmp_signed("!=", at, t.i64(0)))
        b.cbranch(self.rarely(wanted), go, stay)
        b.position_at_end(go)
        b.store(t.i64(0), self.slot(RESUME))
        record = b.inttoptr(at, t.ptr)
        for k, name in enumerate(self.frame_registers()):
            bits = b.load(b.gep(record, [t.i64(2 + k)]))
            var = self.vars[name]
            b.store(b.bitcast(bits, t.f64) if var.type.pointee == t.f64 else bits, var)
        b.store(b.load(record), self.vars["_b"])
        b.branch(head)
        b.position_at_end(stay)

    def rarely(self, flag):
        """flag, for a branch on it that is rarely taken (llvm.expect: LLVM lays the
        code out for the other way)."""
        t = self.t
        expect = self.b.module.declare_intrinsic("llvm.expect", [t.i1],
                                                 self.ir.FunctionType(t.i1, [t.i1, t.i1]))
        return self.b.call(expect, [flag, t.i1(0)])

    def jump(self, k: int) -> None:
        head, after, blocks = self.cases
        self.b.store(self.t.i64(k), self.vars["_b"])
        self.b.branch(after if k < 0 else blocks.get(k, head))

    def in_heap(self, base: str, off: str):
        """The address check of a register offset (rvm.engines.templates.address_check:
        base + off in 0 .. T0 - 1, with two negative terms refused) as one overflow test and
        one unsigned comparison: the true sum lies in the heap iff int64 addition does not
        overflow and the sum is below T0 unsigned."""
        b, t = self.b, self.t
        fn = self.declare("llvm.sadd.with.overflow.i64",
                          self.ir.LiteralStructType([t.i64, t.i1]), [t.i64, t.i64])
        out = b.call(fn, [b.load(self.vars[base]), b.load(self.vars[off])])
        self.checked = base, off, b.extract_value(out, 0)    # (the address: statement)
        inside = b.icmp_unsigned("<", self.checked[2], b.load(self.vars["T0"]))
        return b.and_(inside, b.not_(b.extract_value(out, 1)))

    def call(self, target: ast.Tuple, value: ast.Call) -> None:
        callee = self.functions[value.func.id][0]
        args = [self.S, self.flag, self.H, self.G, self.cap] + [
            self.coerce(self.expr(a), ty)
            for a, ty in zip(value.args[4:], callee.function_type.args[5:])]
        before, self.before = self.before, None
        if self.heap_bad is not None:   # (a cell's shadow made not finite here: the
            b = self.b                  # callee's looks are after it, as this frame's)
            seen = b.icmp_signed("!=", b.load(self.slot(SHADOWS_BAD)), self.t.i64(0))
            b.store(b.zext(b.or_(seen, b.load(self.heap_bad)), self.t.i64),
                    self.slot(SHADOWS_BAD))
        if type(self) is Lowering and not self.counting:
            # the callee ran out of steps: this frame, at the call, joins its checkpoint
            # (the registers still hold what they held before the call); so does a
            # budget test before the call that stops the run there (see stop_at), with
            # the budget left in the state array (STOP)
            b, t = self.b, self.t
            site, other = self.fn.append_basic_block(), self.fn.append_basic_block()
            if before is not None:
                stop = self.fn.append_basic_block()
                self.guard(self.truth(self.expr(before.test)), stop)
                with b.goto_block(stop):
                    b.store(self.expr(before.body[0].value.args[0]), self.slot(STOP))
                    b.store(t.s64(BUDGET), self.flag)
                    b.branch(site)
            out = b.call(callee, args)
            failed = b.icmp_signed("!=", b.load(self.flag), t.i64(0))
            self.guard(failed, other)
            with b.goto_block(other):
                code = b.load(self.flag)    # (a look's record: joined the same way)
                budget = b.or_(b.or_(b.icmp_signed("==", code, t.i64(BUDGET)),
                                     b.icmp_signed("==", code, t.i64(LOOKED))),
                               b.icmp_signed("==", code, t.i64(SHADOWED)))
                b.cbranch(budget, site, self.callee_failed)
            # which of the block's calls of this callee (in the order of the code: a
            # counted loop's copy of its block records nothing), in the bits above the
            # callee's crc32
            nth = self.sites.get((self.case, value.func.id), 0)
            self.sites[self.case, value.func.id] = nth + 1
            with b.goto_block(site):
                self.shared(AT_CALL, self.case, t.i64(name_id(value.func.id) | nth << 32),
                            self.passed)
        else:
            out = self.b.call(callee, args)     # (a counted loop's: from its copy)
            self.guard(self.b.icmp_signed("!=", self.b.load(self.flag), self.t.i64(0)),
                       self.callee_failed)
        for k, t_ in enumerate(target.elts):
            self.store(t_, self.b.extract_value(out, k))

    def store(self, target, value) -> None:
        if isinstance(target, ast.Name):
            ptr = self.vars[target.id]
        elif isinstance(target, ast.Subscript) and state_index(target) is not None:
            ptr = self.slot(state_index(target))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            ptr = self.cell(target.value.id, self.expr(target.slice))
        else:
            raise Unsupported(ast.unparse(target))
        if value.type == self.t.f64 and isinstance(target, ast.Subscript) and \
                state_index(target) is None:
            if target.value.id != "HG":
                self.finite(value)      # a value leaving the registers for the heap
            else:
                self.shadow_made(value)
        self.b.store(self.coerce(value, ptr.type.pointee), ptr)

    def shadow_made(self, value) -> None:
        """In the build that searches a gradient pass over a large heap (LOOKS =
        CELL_LOOKS): a cell's shadow written here, noted in a flag of the frame
        (heap_bad) where it is not finite, so that no later look counts as one before
        the first shadow that stopped being finite (see note_shadows): the looks test
        the registers' shadows, not the heap's (a large heap's scan at every look would
        cost more than the pass). Over a small heap the root frame's snapshots test the
        cells (the test at every store costs a short loop's pass 15%)."""
        bad = None if self.heap_bad is None else self.non_finite([value])
        if bad is not None:         # (a branch, rarely taken: a flag or-ed in at every
            b, t = self.b, self.t   # store, or a sum, made each pass of a short loop
            made, after = self.fn.append_basic_block(), self.fn.append_basic_block()
            b.cbranch(self.rarely(bad), made, after)    # wait for the last: the search's
            b.position_at_end(made)                     # pass +25%)
            b.store(t.i1(1), self.heap_bad)
            b.branch(after)
            b.position_at_end(after)

    # ----------------------------------------------------------- expressions
    def coerce(self, v, ty):
        t, b = self.t, self.b
        if v.type == ty:
            return v
        if ty == t.f64:
            if v.type == t.i64 and type(getattr(v, "constant", None)) is int:
                return ty(float(v.constant))    # (a constant: x ** 2 is seen as a square)
            return b.uitofp(v, ty) if v.type == t.i1 else b.sitofp(v, ty)
        if ty == t.i64 and v.type == t.i1:
            return b.zext(v, ty)
        if ty == t.i1:
            return self.truth(v)
        raise Unsupported(f"a float value where an int is wanted: {ty}")

    def truth(self, v):
        t, b = self.t, self.b
        if v.type == t.i1:
            return v
        if v.type == t.i64:
            return b.icmp_signed("!=", v, t.i64(0))
        return b.fcmp_unordered("!=", v, t.f64(0.0))

    def expr(self, e):
        t, b = self.t, self.b
        if isinstance(e, ast.Constant):
            if isinstance(e.value, bool):
                return t.i1(int(e.value))
            if isinstance(e.value, int):
                return t.i64(e.value)
            if isinstance(e.value, float):
                return t.f64(e.value)
        elif isinstance(e, ast.Name):
            if e.id in self.vars:
                return b.load(self.vars[e.id])
            if e.id == "TOL":
                return t.f64(self.functions["TOL"])
        elif isinstance(e, ast.Subscript) and state_index(e) is not None:
            return b.load(self.slot(state_index(e)))
        elif isinstance(e, ast.Subscript) and isinstance(e.value, ast.Name):
            return b.load(self.cell(e.value.id, self.expr(e.slice)))
        elif isinstance(e, ast.BinOp):
            return self.binop(e.op, self.expr(e.left), self.expr(e.right))
        elif isinstance(e, ast.UnaryOp):
            v = self.expr(e.operand)
            if isinstance(e.op, ast.USub):
                return b.fneg(v) if v.type == t.f64 else b.neg(self.coerce(v, t.i64))
            if isinstance(e.op, ast.UAdd):
                return v
            if isinstance(e.op, ast.Not):
                return b.not_(self.truth(v))
            if isinstance(e.op, ast.Invert) and v.type != t.f64:
                return b.not_(v)
        elif isinstance(e, ast.Compare) and len(e.ops) == 1:
            return self.compare(e.ops[0], self.expr(e.left), self.expr(e.comparators[0]))
        elif isinstance(e, ast.BoolOp):
            values = [self.truth(self.expr(v)) for v in e.values]
            out = values[0]
            for v in values[1:]:
                out = b.and_(out, v) if isinstance(e.op, ast.And) else b.or_(out, v)
            return out
        elif isinstance(e, ast.Call):
            return self.function(e)
        elif isinstance(e, ast.IfExp):
            return self.select(self.truth(self.expr(e.test)), self.expr(e.body),
                               self.expr(e.orelse))
        raise Unsupported(ast.unparse(e))

    def select(self, cond, a, b_):
        if a.type != b_.type:
            a, b_ = self.coerce(a, self.t.f64), self.coerce(b_, self.t.f64)
        return self.b.select(cond, a, b_)

    def compare(self, op, a, c):
        t, b = self.t, self.b
        sym = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">",
               ast.GtE: ">="}[type(op)]
        if t.f64 in (a.type, c.type):
            a, c = self.coerce(a, t.f64), self.coerce(c, t.f64)
            # no float steers control flow unless finite; an array instruction's element
            # (max, min) only picks a value, from heap cells (finite) and scalar operands
            # whose registers stay as they are, to be looked at where the caller looks
            if not (self.checking or self.elementwise):
                self.finite(a, c)
            if sym == "!=":             # as Python: nan != anything
                return b.fcmp_unordered(sym, a, c)
            return b.fcmp_ordered(sym, a, c)
        a, c = self.coerce(a, t.i64), self.coerce(c, t.i64)
        return b.icmp_signed(sym, a, c)

    def binop(self, op, a, c):
        t, b = self.t, self.b
        if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            if a.type == t.i1 and c.type == t.i1:
                ty = t.i1
            else:
                ty = t.i64
                a, c = self.coerce(a, ty), self.coerce(c, ty)
            return {ast.BitAnd: b.and_, ast.BitOr: b.or_, ast.BitXor: b.xor}[type(op)](a, c)
        if isinstance(op, (ast.Div, ast.Pow)) or t.f64 in (a.type, c.type):
            a, c = self.coerce(a, t.f64), self.coerce(c, t.f64)
            if isinstance(op, ast.Pow):
                return self.intrinsic("pow", a, c)
            name = _FLOAT_OPS.get(type(op))
        else:
            a, c = self.coerce(a, t.i64), self.coerce(c, t.i64)
            if isinstance(op, (ast.FloorDiv, ast.Mod)):
                return self.floor_div_mod(a, c, isinstance(op, ast.Mod))
            name = _INT_OPS.get(type(op))
        if name is None:
            raise Unsupported(f"{a.type} {type(op).__name__}")
        kind = type(getattr(a, "constant", None))
        if name in _FOLDED and kind in (int, float) and \
                type(getattr(c, "constant", None)) is kind:
            # (two constants: `b - 1` of a power's derivative, b = 2: a power seen as
            # a square or as its base; int64 arithmetic wraps)
            x, y = a.constant, c.constant
            out = x + y if name[-3:] == "add" else x - y if name[-3:] == "sub" else x * y
            return t.f64(out) if kind is float else t.i64(wrap(out))
        if name == "fdiv" and self.adjoint:     # Python stops on a division by zero
            self.guard(b.fcmp_ordered("==", c, t.f64(0.0)), self.fault_block)
        if self.adjoint and name[0] == "f":     # (a shadow's zero may lose its sign)
            return getattr(b, name)(a, c, flags=("nsz",))
        return getattr(b, name)(a, c)

    def floor_div_mod(self, a, c, mod: bool):
        """Python's a // c or a % c on int64 (wrapping): c = 0 faults, and
        c = -1 is taken apart (the hardware traps on INT64_MIN / -1)."""
        t, b = self.t, self.b
        self.guard(b.icmp_signed("==", c, t.i64(0)), self.fault_block)
        minus_one = b.icmp_signed("==", c, t.i64(-1))
        # (c = 0 too: rows in lockstep, rvm.engines.lanes, divide where a row is idle)
        safe = b.select(b.or_(minus_one, b.icmp_signed("==", c, t.i64(0))), t.i64(1), c)
        q, r = b.sdiv(a, safe), b.srem(a, safe)
        # floor: step down where the remainder is non-zero and its sign differs from c's
        adjust = b.and_(b.icmp_signed("!=", r, t.i64(0)),
                        b.icmp_signed("<", b.xor(r, safe), t.i64(0)))
        if mod:
            r = b.select(adjust, b.add(r, safe), r)
            return b.select(minus_one, t.i64(0), r)
        q = b.select(adjust, b.sub(q, t.i64(1)), q)
        return b.select(minus_one, b.neg(a), q)

    def intrinsic(self, name: str, *args):
        if name == "pow":       # (libm's, as the interpreter's math.pow: see POW)
            a, c = args         # (a square is a product: rvm.engines.templates.power)
            exponent = getattr(c, "constant", None)
            if exponent == 2.0:
                return self.b.fmul(a, a)
            if exponent == 1.0:         # (exact, as pow(x, 1.0) is: nan, -0.0 and inf too)
                return a
            if exponent is not None:
                return self.libm(POW, *args)
            b, f64 = self.b, self.t.f64
            return b.select(b.fcmp_ordered("==", c, f64(2.0)), b.fmul(a, a),
                            self.libm(POW, *args))
        f64 = self.t.f64
        fn = self.b.module.declare_intrinsic(f"llvm.{name}", [f64])
        return self.b.call(fn, list(args))

    def declare(self, name: str, result, args: list):
        """The module's function `name` (result and argument types as given), declared
        on first use."""
        module = self.b.module
        fn = module.globals.get(name)
        if fn is None:
            fn = self.ir.Function(module, self.ir.FunctionType(result, args), name)
        return fn

    def libm(self, name: str, *args):
        f64 = self.t.f64
        return self.b.call(pure_function(self.declare(name, f64, [f64] * len(args))),
                           list(args))

    def pure(self, name: str, args: list):
        value = self.math(name, args)
        if not self.adjoint:
            return value
        if name in _DOMAIN:             # sqrt of a negative, log of zero or less
            x = self.coerce(args[0], self.t.f64)
            self.guard(self.b.fcmp_ordered(_DOMAIN[name], x, self.t.f64(0.0)),
                       self.fault_block)
        elif name in _MATH_ERRORS:
            self.python_error(value, [self.coerce(a, self.t.f64) for a in args])
        return value

    def python_error(self, value, args) -> None:
        """Fault where Python's math module would raise: a non-finite result from
        finite arguments (an overflow, or a domain error such as log 0 or sqrt -1). The
        interpreter then reports it, as the Python engines do. Made (with the test of a
        division's divisor) in the updates of gradient shadows only, which are never
        tested for finiteness and may be dead (the derivative of sqrt at 0 for a local
        nothing reads: LLVM may drop the computation, but not this test); a value's own
        computation leaves a non-finite value in a register, which finite() catches."""
        bad, given = self.non_finite([value]), self.non_finite(args)
        if given is not None:
            bad = self.b.and_(bad, self.b.not_(given))
        self.guard(bad, self.fault_block)

    def math(self, name: str, args: list):
        t, b = self.t, self.b
        if self.elementwise and name[5:] in vectormath.ARITY:
            vectormath.require()
            return self.libm(vectormath.PREFIX + name[5:],
                             *(self.coerce(a, t.f64) for a in args))
        if name in ("math.sin", "math.cos", "math.exp", "math.log", "math.sqrt"):
            return self.intrinsic(name[5:], self.coerce(args[0], t.f64))
        if name in ("math.pow",):
            return self.intrinsic("pow", *(self.coerce(a, t.f64) for a in args))
        if name in ("math.tanh", "math.atan2"):
            return self.libm(name[5:], *(self.coerce(a, t.f64) for a in args))
        if name in ("np.fmod", "math.fmod"):
            return b.frem(self.coerce(args[0], t.f64), self.coerce(args[1], t.f64))
        if name == "math.trunc":
            return self.intrinsic("trunc", self.coerce(args[0], t.f64))
        if name == "abs":
            v = args[0]
            if v.type == t.f64:
                return self.intrinsic("fabs", v)
            v = self.coerce(v, t.i64)
            return b.select(b.icmp_signed("<", v, t.i64(0)), b.neg(v), v)
        if name == "sign":
            v = self.coerce(args[0], t.f64)
            pos = b.uitofp(b.fcmp_ordered(">", v, t.f64(0.0)), t.f64)
            neg = b.uitofp(b.fcmp_ordered("<", v, t.f64(0.0)), t.f64)
            return b.fsub(pos, neg)
        if name == "dpow_db":
            x, y = (self.coerce(a, t.f64) for a in args)
            value = b.fmul(self.math("math.pow", [x, y]), self.math("math.log", [x]))
            return b.select(b.fcmp_ordered(">", x, t.f64(0.0)), value, t.f64(0.0))
        if name == "zero":
            return b.fcmp_ordered("<=", self.intrinsic("fabs", self.coerce(args[1], t.f64)),
                                  args[0])
        if name == "float":
            return self.coerce(args[0], t.f64)
        if name == "int":
            if args[0].type == t.f64:
                raise Unsupported("int() of a float")
            return self.coerce(args[0], t.i64)
        if name == "wrap":
            return args[0]
        raise Unsupported(name)

    def function(self, e: ast.Call):
        name = ast.unparse(e.func)
        if name in ("alloc", "free", "push", "pop", "gpush", "gpop", "said"):
            return self.helper(name, e.args)
        if name in ARRAY_HELPERS:
            return self.array_helper(name, e.args)
        return self.pure(name, [self.expr(a) for a in e.args])


_ADDRESS = ast.parse("((A >= 0) | (B >= 0)) & ((0 <= A + B) & (A + B < T0))",
                     mode="eval").body


def _address_terms(e) -> tuple[str, str] | None:
    """(base, offset) if e is the native text of a register-offset address check (the
    shape of _ADDRESS, with two registers for A and B)."""
    try:
        a = e.left.left.left.id
        c = e.left.right.left.id
    except AttributeError:
        return None
    return (a, c) if _same(e, _ADDRESS, {"A": a, "B": c}) else None


def _same(e, pattern, names: dict) -> bool:
    """Is e the expression `pattern`, its names renamed by `names`?"""
    if type(e) is not type(pattern):
        return False
    if isinstance(pattern, ast.Name):
        return e.id == names.get(pattern.id, pattern.id)
    if isinstance(pattern, ast.Constant):
        return e.value == pattern.value and type(e.value) is type(pattern.value)
    if isinstance(pattern, ast.BinOp):
        return type(e.op) is type(pattern.op) and _same(e.left, pattern.left, names) and \
            _same(e.right, pattern.right, names)
    if isinstance(pattern, ast.Compare):
        return len(e.ops) == len(pattern.ops) and \
            all(type(x) is type(y) for x, y in zip(e.ops, pattern.ops)) and \
            _same(e.left, pattern.left, names) and \
            all(_same(x, y, names) for x, y in zip(e.comparators, pattern.comparators))
    return False


def _named(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def state_index(node) -> int | None:
    """k for TOP[k] (the state array), else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            node.value.id == "TOP" and isinstance(node.slice, ast.Constant):
        return node.slice.value
    return None


def _writes_shadow(s) -> bool:
    """Does this statement update a gradient shadow (gfK, or a cell of HG)?"""
    if isinstance(s, ast.Assign):
        targets = [e for t in s.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    elif isinstance(s, ast.AugAssign):
        targets = [s.target]
    else:
        return False
    return any((isinstance(t, ast.Name) and t.id.startswith("gf")) or
               (isinstance(t, ast.Subscript) and _named(t.value, "HG")) for t in targets)


def block_cases(loop: ast.While) -> dict | None:
    """{k: statements} of the generated code's block loop (`while _b >= 0:` with one
    if/elif chain on `_b == k`), or None for any other loop."""
    test = loop.test
    if not (isinstance(test, ast.Compare) and _named(test.left, "_b") and
            isinstance(test.ops[0], ast.GtE) and len(loop.body) == 1 and
            ast.dump(test.comparators[0]) == ast.dump(ast.Constant(0))):
        return None
    cases, s = {}, loop.body[0]
    while isinstance(s, ast.If):
        t = s.test
        if not (isinstance(t, ast.Compare) and _named(t.left, "_b") and
                isinstance(t.ops[0], ast.Eq) and isinstance(t.comparators[0], ast.Constant)):
            return None
        cases[t.comparators[0].value] = s.body
        if not s.orelse:
            return cases
        if len(s.orelse) != 1:
            return None
        s = s.orelse[0]
    return None


def is_exact(test) -> bool:
    """A counted loop's entry test, `_exact(c)` (see Lowering.counted)."""
    return isinstance(test, ast.Call) and _named(test.func, "_exact") and len(test.args) == 1


CHECKPOINT = 0x52564D434B505431     # "RVMCKPT1": the first cell of a checkpoint record
AT_BACK_EDGE, AT_END, AT_CALL, AT_SITE, AT_LOOK = 0, 1, 2, 3, 4    # its kinds
RECORD = 6                          # its cells before the registers
FRAME_REGISTER = re.compile(r"(?:[rf]|gf)\d+")    # what a record keeps: registers, shadows
GRAD_REGISTER = re.compile(r"gf\d+")              # a float register's shadow


def name_id(name: str) -> int:
    """A generated function's or register's name as the number a checkpoint record holds."""
    import zlib
    return zlib.crc32(name.encode())


def _names(ir, t, module, regs: list):
    """A constant of the module: the crc32 of each of these registers' names."""
    ids = [name_id(n) for n in regs] or [0]
    key = "rvm_names_" + hashlib.sha256(repr(ids).encode()).hexdigest()[:16]
    g = module.globals.get(key)
    if g is None:
        ty = ir.LiteralStructType([t.i64] * len(ids))
        g = ir.GlobalVariable(module, ty, key)
        g.initializer, g.global_constant, g.linkage = ir.Constant(ty, ids), True, "internal"
    return g


def _record_function(ir, t, module):
    """The module's writer of checkpoint records (see Lowering.record):
    rvm_record(cells, capacity, heap top, name, kind, block, arg, count, names, values):
    past the records already above the top (a callee's), the record, if it fits."""
    f = module.globals.get("rvm_record")
    if f is not None:
        return f
    i64, ptr = t.i64, t.ptr
    f = ir.Function(module, ir.FunctionType(ir.VoidType(), [ptr, i64, i64, i64, i64, i64,
                                                            i64, i64, ptr, ptr]), "rvm_record")
    f.linkage = "internal"
    f.attributes.add("noinline")
    f.attributes.add("cold")
    H, cap, top, name, kind, block, arg, count, names, values = f.args
    b = ir.IRBuilder(f.append_basic_block("entry"))
    at = b.alloca(i64)
    b.store(top, at)
    head, walk, write, store, done = (f.append_basic_block() for _ in range(5))
    b.branch(head)
    b.position_at_end(head)             # past the records already there (a callee's)
    pos = b.load(at)
    room = b.sub(cap, pos)
    cell = lambda k: b.gep(H, [b.add(b.load(at), i64(k))])
    more = f.append_basic_block()
    b.cbranch(b.icmp_signed(">=", room, i64(RECORD)), more, done)
    b.position_at_end(more)
    b.cbranch(b.icmp_signed("==", b.load(cell(0)), i64(CHECKPOINT)), walk, write)
    b.position_at_end(walk)
    b.store(b.add(pos, b.add(i64(RECORD), b.mul(i64(2), b.load(cell(5))))), at)
    b.branch(head)
    b.position_at_end(write)
    size = b.add(i64(RECORD), b.mul(i64(2), count))
    b.cbranch(b.icmp_signed(">=", room, size), store, done)
    b.position_at_end(store)
    for k, v in enumerate([i64(CHECKPOINT), name, kind, block, arg, count]):
        b.store(v, cell(k))

    def copy(j):
        at2 = b.add(b.load(at), b.add(i64(RECORD), b.mul(i64(2), j)))
        b.store(b.load(b.gep(names, [j])), b.gep(H, [at2]))
        b.store(b.load(b.gep(values, [j])), b.gep(H, [b.add(at2, i64(1))]))
    loop_over(b, i64(0), count, copy)
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()
    return f


def _raises_budget(stmts) -> bool:
    """Is this the step budget's test (`raise Fault('step budget exhausted')`: the
    compiled engine's Limit, as MachineOperations makes it)?"""
    s = stmts[0]
    return isinstance(s.exc, ast.Call) and bool(s.exc.args) and \
        isinstance(s.exc.args[0], ast.Constant) and s.exc.args[0].value == MESSAGES[BUDGET]


def is_raise(stmts) -> bool:
    return len(stmts) == 1 and isinstance(stmts[0], ast.Raise)


def assigned_by(s) -> list[str]:
    """The names statement s assigns (not its parts'): its targets, a tuple's each."""
    if isinstance(s, ast.Assign):
        targets = list(s.targets)
    elif isinstance(s, (ast.AugAssign, ast.AnnAssign, ast.For)):
        targets = [s.target]
    else:
        return []
    out = []
    while targets:
        t = targets.pop()
        if isinstance(t, ast.Name):
            out.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            targets += t.elts
        elif isinstance(t, ast.Starred):
            targets.append(t.value)
    return out


def _assigned(node) -> set[str]:
    """The names a function assigns (not those it only declares): the targets of its
    statements (the generated code assigns nowhere else). (Kept on the tree, the sets
    held a chain of 1,000 functions' compile 34 MB higher: not cached.)"""
    out: set[str] = set()
    work = [(s, True) for s in node.body]       # (statement, at the function's top level)
    while work:
        s, top = work.pop()
        if not (top and isinstance(s, ast.AnnAssign)):      # (top: declarations)
            out.update(n for n in assigned_by(s) if n != "_")
        if isinstance(s, _NESTING):
            work += [(c, False) for c in s.body]
            work += [(c, False) for c in getattr(s, "orelse", ())]
    return out


_NESTING = (ast.If, ast.While, ast.For, ast.With, ast.Try)    # (statements in them)


def end_shadows(node: ast.FunctionDef, assigned: set[str] | None = None) -> list[str]:
    """A gradient function's float locals' shadows (the `gf<k>` it assigns, neither
    parameters nor results): a native function returns them after its results, so that
    the record at the end of a run past its budget holds them (rvm.engines.llvm:
    _end_checkpoint; Machine._exhausted). Callers take only the results."""
    params = {a.arg for a in node.args.args}
    results = set(returns_of(node))
    return sorted((n for n in (_assigned(node) if assigned is None else assigned)
                   if GRAD_REGISTER.fullmatch(n) and
                   n not in params and n not in results), key=lambda n: int(n[2:]))


def returns_of(node: ast.FunctionDef) -> list[str]:
    level = list(node.body)         # (statements only, level by level: ast.walk's
    while level:                    # order, without the expressions)
        for n in level:
            if isinstance(n, ast.Return):
                return [e.id for e in n.value.elts]
        level = [c for n in level if isinstance(n, _NESTING)
                 for c in (*n.body, *getattr(n, "orelse", ()))]
    raise Unsupported(f"{node.name} returns nothing")


def budget_test(s: ast.If) -> bool:
    """Is this `if` a step-budget test (a generated function makes one at its end, more
    at back edges and, without loops, at calls: see stops)?"""
    return (is_raise(s.body) and _raises_budget(s.body)) or stops(s)


def stops(s: ast.If) -> bool:
    """Is this `if` a budget test at a call (`if ...: _stop_at(k, budget)` or
    `_stop_before(budget)`)?"""
    return len(s.body) == 1 and isinstance(s.body[0], ast.Expr) and \
        isinstance(s.body[0].value, ast.Call) and \
        (_named(s.body[0].value.func, "_stop_at") or _named(s.body[0].value.func, "_stop_before"))


def callees(calls: dict, roots) -> set:
    """The generated functions that `roots` run, themselves included (calls: {generated
    function: the names it calls})."""
    seen, work = set(), list(roots)
    while work:
        name = work.pop()
        if name in calls and name not in seen:
            seen.add(name)
            work += calls[name]
    return seen


def running_out(tests: dict, calls: dict) -> frozenset:
    """The generated functions whose step budget can run out midway: those with a budget
    test at a back edge (beside the one at their end; tests: {function: budget_tests}),
    and their callers."""
    return reaching(calls, {name for name, n in tests.items() if n > 1})


def reaching(calls: dict, roots) -> frozenset:
    """The generated functions that run one of `roots`, themselves included (one walk
    back from them over the calls, not one walk down from each function: a chain of n
    is n steps)."""
    callers: dict = {name: [] for name in calls}
    for name in calls:
        for callee in calls[name]:
            if callee in callers:
                callers[callee].append(name)
    return frozenset(callees(callers, roots))


def writes_heap(node: ast.FunctionDef, generated) -> bool:
    """Does this native tree write a heap cell itself (a store into HI, HF or HG, or a
    machine operation: alloc, free, push, pop, an array instruction)? Calls of the
    `generated` functions are not counted (see reaching)."""
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AugAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(x, ast.Subscript) and isinstance(x.value, ast.Name) and
                   x.value.id in ("HI", "HF", "HG") for t in targets for x in ast.walk(t)):
                return True
        elif isinstance(n, ast.Call) and not (isinstance(n.func, ast.Name) and
                                              n.func.id in generated) and \
                ((isinstance(n.func, ast.Attribute) and _named(n.func.value, "M")) or
                 any(isinstance(a, ast.Name) and a.id in _HEAP for a in n.args)):
            return True
    return False
