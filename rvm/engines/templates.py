"""Instruction templates (rvm.core.isa) rendered as Python statements, and the run-time
helpers the rendered code calls. Shared by every engine that generates code: the stepping
interpreter's closures (rvm.engines.closures) and the compiled engines (rvm.engines.compiled,
rvm.engines.native), so an instruction's semantics are turned into code in one place.
"""

from __future__ import annotations

import math
import re
import types

from ..core import isa
from ..core.program import Function, Imm, Mem, Reg, View

_INT_BOUNDS = f"{-(1 << 63)} <= _v <= {(1 << 63) - 1}"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def esc(text: str) -> str:
    """Literal text for inside an f-string: braces doubled (the whole string is repr'd)."""
    return str(text).replace("{", "{{").replace("}", "}}")


def fault(text: str) -> str:
    """`raise Fault(f'...')` for a message whose {expr} parts are generated expressions."""
    return f"raise Fault(f{text!r})"


# native code's state array S: the heap top, the step budget left, the output buffer's next
# record and its length (rvm.engines.compiled: OUT0), the budget left at the last budget
# test of the function that returned last (LAST: where Machine._replay starts when a run
# went past its budget after its last back edge), the budget left where a check failed
# (NOW: Machine._general), and the budget left where a budget test before a call stopped
# the run (STOP, NO_STOP if none: rvm.engines.lowering, Lowering.call), and in a gradient
# pass the budget left at the last look (Lowering.clean) before the first that found a
# float register's shadow not finite (SHADOWS, -1 if none), and whether one did
# (SHADOWS_BAD: rvm.ad.gradient.not_finite), the root function's name id until the root
# frame claims it (ROOT, -1 then and where no frame may) and the address of the machine's
# snapshot buffer (SNAP, 0 if none: rvm.engines.lowering, Lowering.snapshot), and the
# address of a look's registers the root frame starts from instead of its entry (RESUME, 0
# if none: Lowering.resume); every S holds at least STATE cells
LEFT, LAST, NOW, STOP, SHADOWS, SHADOWS_BAD, ROOT, SNAP, RESUME, STATE = \
    1, 4, 5, 6, 7, 8, 9, 10, 11, 12
NO_STOP = -(1 << 63)


class Fault(Exception):
    """Raised by generated code when a reversibility check fails (wrapped by the machine)."""


class Limit(Fault):
    """A resource limit (heap, call depth, step budget) hit inside an instruction."""


def wrap(v: int) -> int:
    """Wrap a Python int to int64 (two's complement)."""
    return ((v + (1 << 63)) & ((1 << 64) - 1)) - (1 << 63)


def show_value(kind: str, values: list, cells: list | None) -> str:
    """One value of an output statement as the interpreter shows it: `values` are its
    registers' (an array's: its base and dimensions), `cells` an array's cells."""
    if kind in ("int", "float"):
        return repr(values[0])
    if kind == "complex":
        return repr(complex(values[0], values[1]))
    dims = values[1:]
    if kind == "size":
        return "][".join(map(str, dims))
    if kind == "chars":            # text: each cell a byte (its low 8 bits) up to a 0
        text = []
        for c in cells:
            if c % 256 == 0:
                break
            text.append(chr(c % 256))
        return "".join(text)
    if kind == "stack":            # element 0 is the size, then bottom to top
        return "nil" if cells[0] == 0 else \
            "<" + ", ".join(map(str, reversed(cells[1:cells[0] + 1]))) + "]"
    rows = [cells[k:k + dims[-1]] for k in range(0, len(cells), dims[-1])] \
        if len(dims) == 2 else [cells]
    if kind == "janus":
        shown = ["{" + ", ".join(map(str, r)) + "}" for r in rows]
        return shown[0] if len(dims) == 1 else "{" + ", ".join(shown) + "}"
    return repr(rows[0] if len(dims) == 1 else rows)


def sign(v: float) -> float:
    return 1.0 if v > 0 else -1.0 if v < 0 else 0.0


def power(a: float, b: float) -> float:
    """a ** b as the table's templates mean `math.pow(a, b)` (every engine): the C
    library's pow, but a square is a product (exact: pow(a, 2.0) is a last bit off for
    about 1 in 1,200 values; native code, numpy and the array instructions' element
    loops all square by a product)."""
    return a * a if b == 2.0 else math.pow(a, b)


# the `math` the templates are given: Python's, with pow as power (attributes, not a
# __getattr__: the interpreter reads them at every step)
MATH = types.SimpleNamespace(**{name: getattr(math, name) for name in dir(math)
                                if not name.startswith("_")})
MATH.pow = power


def dpow_db(a: float, b: float) -> float:
    """d(a**b)/db, taken as 0 where a <= 0 (a**b is then not differentiable in b)."""
    return power(a, b) * math.log(a) if a > 0 else 0.0


class Operands:
    """How each operand of one instruction reads in generated code."""

    def __init__(self, fn: Function, ins, layout: dict, local=None):
        """layout maps registers to frame slots (R[k]); `local`, if given, maps a register
        to the name of a local variable instead (the compiled engine)."""
        self.value, self.shadow, self.src, self.prelude = {}, {}, {}, []
        spec = ins.spec
        self.cls = ins.cls
        self.arithmetic = spec.group in ("arith", "family") or spec.name in isa.READS
        self.value["pull"] = str(ins.pull)     # (the array pullbacks' operands: a mask)
        # an integer (register or constant) read by a float instruction's arithmetic, or
        # compared with a float, is converted to a float first, as native code does: Python's
        # exact integer arithmetic and comparisons (n * n, n / 3, abs(n), n > x) would
        # give another answer past 2**53, and native code's int64 arithmetic wraps
        classes = {n: getattr(a, "cls", None) for n, a in zip(spec.names, ins.args)}
        if self.cls == isa.FLOAT and spec.group in ("arith", "family"):
            widened = set(spec.names[1:])
        elif isa.FLOAT in (classes.get("a"), classes.get("b")) and (
                isa.condition(spec.name) or spec.name.startswith(("XOR.", "ASSERT."))):
            widened = {"a", "b"}
        else:
            widened = set()
        for name, a in zip(spec.names, ins.args):
            self.src[name] = str(a)
            if isinstance(a, Reg):
                value, shadow = (f"R[{layout[a]}]", f"G[{layout[a]}]") if local is None \
                    else local(a)
                if name in widened and a.cls == isa.INT:
                    value = f"float({value})"
                self.value[name] = value
                self.shadow[name] = shadow if a.cls == isa.FLOAT else None
            elif isinstance(a, Imm):
                v = float(a.value) if name in widened and a.cls == isa.INT else a.value
                self.value[name] = f"({v!r})" if v < 0 else repr(v)
                self.shadow[name] = None
            elif isinstance(a, View):    # (start, row stride, column stride): the
                reg = (lambda r: f"R[{layout[r]}]") if local is None else \
                    (lambda r: local(r)[0])     # array helpers check it
                parts = [offset(x, reg) for x in (a.off, a.s0, a.s1)]
                self.value[name] = f"({reg(a.base)} + {parts[0]}, {parts[1]}, {parts[2]})"
                self.shadow[name] = None
            elif isinstance(a, Mem):
                reg = (lambda r: f"R[{layout[r]}]") if local is None else \
                    (lambda r: local(r)[0])
                view = "hf" if self.cls == isa.FLOAT else "hi"
                base, off = reg(a.base), offset(a.off, reg)
                self.prelude += [
                    f"if not ({address_check(base, a.off, reg)}): " + fault(
                        f"heap address {esc(a)} = {{{base} + {off}}} is outside the heap "
                        "({M.top} cells in use)"),
                    f"_a = {base} + {off}",
                ]
                self.value[name] = f"M.{view}[_a]"
                self.shadow[name] = "M.hg[_a]" if self.cls == isa.FLOAT else None

    def expr(self, text: str) -> str:
        def sub(m):
            key = m.group(1)
            if key.endswith("_src"):
                return self.src[key[:-4]]
            if key.startswith("g") and key[1:] in self.shadow:
                return self.shadow[key[1:]]
            return self.value[key]
        return _PLACEHOLDER.sub(sub, text)

    def message(self, text: str) -> str:
        """An f-string literal: {x} shows x's value, {x_src} its assembly text."""
        def sub(m):
            key = m.group(1)
            if key.endswith("_src"):
                return esc(self.src[key[:-4]])
            return "{" + self.value[key] + "!r}"
        parts = _PLACEHOLDER.split(text)   # literal, key, literal, key, ...
        out = "".join(esc(p) if k % 2 == 0 else sub(_Key(p)) for k, p in enumerate(parts))
        return "f" + repr(out)

    def has_missing_shadow(self, line: str) -> bool:
        return any(k.startswith("g") and k[1:] in self.shadow and self.shadow[k[1:]] is None
                   for k in _PLACEHOLDER.findall(line))


def offset(off, reg) -> str:
    return reg(off) if isinstance(off, Reg) else f"({off!r})" if off < 0 else repr(off)


def address_check(base: str, off, reg) -> str:
    """A condition true iff base + off lies in 0..M.top - 1, in unbounded (Python) and in
    wrapping (native) int64 arithmetic alike: a sum with one term not negative cannot fall
    below int64's range, and one past its top wraps to a negative number, which fails
    `0 <=`. (Two negative terms could wrap into the heap: they are refused first.)"""
    if isinstance(off, Reg):
        o = reg(off)
        return f"({base} >= 0 or {o} >= 0) and 0 <= {base} + {o} < M.top"
    if off >= 0:
        return f"{-off} <= {base} < M.top - {off}"
    return f"0 <= {base} and 0 <= {base} + ({off}) < M.top"


class _Key:
    """Stands in for a regex match in Operands.message."""

    def __init__(self, key: str):
        self.key = key

    def group(self, _):
        return self.key


def render(template: str, ops: Operands, deferred: bool = False,
           wraps: bool = True) -> list[str]:
    """Python statements for one template (see the template language in rvm.core.isa).
    deferred: instead of testing each float result for inf/nan, fold it into `_fin`
    (which stays 0.0 while every result is finite), for a caller that tests `_fin` at loop
    back edges and at its exit (the compiled engines: a failure re-runs the pass on the
    interpreter, which finds the instruction). wraps: an int result wrapped to int64 in
    Python's arithmetic (native code's int64 arithmetic wraps by itself)."""
    out = list(ops.prelude) if template.strip() else []
    for line in template.splitlines():
        if not line.strip() or ops.has_missing_shadow(line):
            continue
        if line.startswith("check "):
            cond, msg = line[6:].split(" : ", 1)
            out.append(f"if not ({ops.expr(cond)}): raise Fault({ops.message(msg)})")
        elif line.startswith(("let ", "do ")):
            out.append(ops.expr(line.split(" ", 1)[1]))
        else:
            lhs, op, rhs = line.partition(" = ")
            target = _PLACEHOLDER.fullmatch(lhs.strip())
            if op and target and not target.group(1).startswith("g"):
                out.append(f"_v = {ops.expr(rhs)}")
                if ops.cls == isa.INT:
                    out.append(f"{ops.expr(lhs)} = _v if {_INT_BOUNDS} else wrap(_v)"
                               if wraps else f"{ops.expr(lhs)} = _v")
                    continue
                if ops.arithmetic and deferred:
                    out.append("_fin += _v - _v")
                elif ops.arithmetic:   # inf or nan could not be subtracted back out
                    out.append("if _v - _v != 0.0: " + fault(
                        f"{esc(ops.src[target.group(1)])} would become {{_v}}: not finite"))
                out.append(f"{ops.expr(lhs)} = _v")
            elif (guard := _pullback_guard(line)) is not None:
                out.append(f"if {ops.expr(guard)} != 0.0: {ops.expr(line)}")
            else:
                out.append(ops.expr(line))
    return out


_PULLBACK = re.compile(r"(\{g\w+\}) [-+]?= (.*)")
_ADDED = re.compile(r"\{g(\w+)\} [-+]= ")     # a pullback added into an operand's shadow


def pulled(template: str, ins) -> str:
    """A scalar instruction's gradient template without the pullbacks its pull mask
    leaves out: those added into the shadow of an operand k after the target whose bit
    k is clear (rvm.ad.activity found it never holds a value that a gradient asked for
    depends on). An array instruction's helpers read the mask themselves ({pull})."""
    if ins.pull == -1 or ins.spec.group == "array":
        return template
    out = set(n for k, n in enumerate(ins.spec.names[1:]) if not ins.pull >> k & 1)
    return "\n".join(line for line in template.split("\n")
                     if not ((m := _ADDED.match(line)) and m.group(1) in out))
# partials that can fail where their instruction's value did not (cos, exp... cannot)
_PARTIAL_FAILS = re.compile(r"/|%|\*\*|\b(?:pow|log|sqrt|fmod|dpow_db)\(")


def _pullback_guard(line: str) -> str | None:
    """For a shadow update that could fail (a partial derivative with a division or a
    call, like sqrt's at 0): the shadow it pulls back, so it runs only when that shadow
    is not zero. A zero shadow carries no
    gradient, and reverse mode does not evaluate the partials of what the loss does not
    depend on (as PyTorch and JAX skip those nodes): the pass that recomputes an
    uncomputed block runs with zero shadows and no divisions of its own."""
    m = _PULLBACK.fullmatch(line.strip())
    if m is None or not _PARTIAL_FAILS.search(m.group(2)):
        return None
    shadows = re.findall(r"\{g\w+\}", m.group(2))
    return shadows[0] if shadows else None


def condition(ops: Operands, cc: str) -> str:
    return f"{ops.value['a']} {isa.CONDITIONS[cc]} {ops.value['b']}"


def shows(ops: Operands, cc: str) -> str:
    """Message text showing a condition and the values it compared (f-string ready)."""
    a, b = esc(ops.src["a"]), esc(ops.src["b"])
    vals = ", ".join(f"{s} = {{{ops.value[n]}!r}}" for n, s in (("a", a), ("b", b))
                     if not s[0].isdigit() and not s.startswith("-"))
    return f"{a} {isa.CONDITIONS[cc]} {b}" + (f" ({vals})" if vals else "")




# Straight runs of generated code. A float register's non-finite value sticks through the
# arithmetic that updates it (x = x + ..., x * y, ...), so within a straight run of
# register arithmetic one finiteness check per register, after its last update, sees
# what a check after every update would; the pending checks are added before anything
# else (stores, calls, control flow, the test of _fin itself; a read in place, x = x + cell,
# is register arithmetic: it leaves the cell alone). An address check and the
# address it guards (`_a = ...`) stay next to each other: native code masks the one by
# the other.
_FIN = re.compile(r"_fin \+= (g?f\d+) - \1")
_PURE = re.compile(r"g?[rf]\d+ = [^\[]*|_a = [^\[]*|_n -= \d+|_ok &= [^\[]*|_m = [^\[]*"
                   r"|if [^\[]*: raise \w+\(.*"
                   r"|([rf]\d+) = \1 [+-] (?:M\.h[fi]|H[FI])\[_a\]"   # a read in place
                   r"|[rf]\d+ = (?:0\.0 [+-] )?\((?:M\.h[fi]|H[FI])\[_a\]\)"   # into a zero,
                   r"(?: - \((?:M\.h[fi]|H[FI])\[_a\]\))?")                  # or back out


def straighten(lines: list[str]) -> list[str]:
    """Generated code with `_v = e` [`_fin += _v - _v`] `x = _v` written `x = e`, and the
    finiteness of each float register added once per straight run (see above)."""
    direct: list[str] = []
    k = 0
    while k < len(lines):
        line = lines[k]
        stripped = line.lstrip()
        ind = line[:len(line) - len(stripped)]
        if stripped.startswith("_v = ") and "_v" not in stripped[5:] and k + 1 < len(lines):
            fin = lines[k + 1].strip() == "_fin += _v - _v"
            nxt = lines[k + 2].strip() if fin and k + 2 < len(lines) else \
                lines[k + 1].strip()
            m = re.fullmatch(r"([rf]\d+) = _v", nxt)
            if m:
                direct.append(f"{ind}{m.group(1)} = {stripped[5:]}")
                if fin:
                    direct.append(f"{ind}_fin += {m.group(1)} - {m.group(1)}")
                k += 3 if fin else 2
                continue
        direct.append(line)
        k += 1
    out: list[str] = []
    pending: dict[str, None] = {}
    pending_ind = ""
    for line in direct:
        stripped = line.lstrip()
        ind = line[:len(line) - len(stripped)]
        fin = _FIN.fullmatch(stripped)
        pure = _PURE.fullmatch(stripped) and "_fin" not in stripped
        if pending and (ind != pending_ind or not (pure or fin)):
            out.append(pending_ind + "_fin += " + " + ".join(f"({x} - {x})" for x in pending))
            pending = {}
        if fin:
            pending.pop(fin.group(1), None)
            pending[fin.group(1)] = None
            pending_ind = ind
            continue
        out.append(line)
    return out


# Three more passes over one generated Python function (the python engine's; native code
# leaves these to LLVM).
_TARGETS = re.compile(r"(\w+(?:, \w+)*),? (?:=|\+=|-=) ")
_ACCUMULATE = re.compile(r"(g[rf]\d+) (?:\+=|-=|=) (.*)")
_PURE_CALL = re.compile(r"\b(?:math\.\w+|sign|dpow_db)\([\w. +\-*/]*\)")
_NAME = re.compile(r"[A-Za-z_]\w*")


_MAY_FAIL = re.compile(r"/|%|\*\*|\w\(")    # Python float arithmetic that can raise


def dead_shadows(lines: list[str]) -> list[str]:
    """Drop the updates of gradient shadows that nothing reads (a local's shadow the
    gradient pass accumulates but never passes on, like that of a constant step size):
    a shadow is dead when every line naming it only adds into it, with arithmetic that
    cannot fail (a division or a call, like the derivative of sqrt at 0, would stop the
    interpreter, so the line stays)."""
    lines = list(lines)
    while True:
        uses: dict[str, list[int]] = {}
        for k, line in enumerate(lines):
            for name in set(re.findall(r"\bg[rf]\d+\b", line)):
                uses.setdefault(name, []).append(k)
        dead = set()
        for name, where in uses.items():
            for k in where:
                m = _ACCUMULATE.fullmatch(lines[k].strip())
                if not m or m.group(1) != name or re.search(rf"\b{name}\b", m.group(2)) \
                        or _MAY_FAIL.search(m.group(2)):
                    break
            else:
                dead.update(where)
        if not dead:
            break
        lines = [line for k, line in enumerate(lines) if k not in dead]
    out = []
    for k, line in enumerate(lines):        # a block left empty gets a `pass`
        out.append(line)
        if line.rstrip().endswith(":"):
            ind = len(line) - len(line.lstrip())
            nxt = lines[k + 1] if k + 1 < len(lines) else ""
            if len(nxt) - len(nxt.lstrip()) <= ind:
                out.append(" " * (ind + 4) + "pass")
    return out


def common_calls(lines: list[str]) -> list[str]:
    """Within a straight run, a pure function called again on arguments nothing has
    changed since (sin q when a step adds it and a later one takes it back out) is
    computed once, into a temporary."""
    out: list[str] = []
    before: dict[int, list[str]] = {}
    seen: dict[str, list] = {}          # call -> [index in out, temporary or None]
    ind = None
    temps = 0
    for line in lines:
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        targets = _TARGETS.match(stripped)
        simple = (targets is not None and not stripped.startswith(("if ", "for ", "while "))) \
            or (stripped.startswith("if ") and ": raise " in stripped)
        if not simple or indent != ind:
            seen = {}
        ind = indent
        if simple:
            for call in dict.fromkeys(_PURE_CALL.findall(stripped)):
                entry = seen.get(call)
                if entry is None:
                    seen[call] = [len(out), None]
                    continue
                if entry[1] is None:
                    temps += 1
                    entry[1] = f"_c{temps}"
                    before.setdefault(entry[0], []).append(f"{indent}{entry[1]} = {call}")
                    out[entry[0]] = out[entry[0]].replace(call, entry[1])
                stripped = stripped.replace(call, entry[1])
        out.append(indent + stripped)
        if targets is not None:
            changed = set(targets.group(1).split(", "))
            for call in [c for c in seen if changed & set(_NAME.findall(c))]:
                del seen[call]
    return [x for k, line in enumerate(out) for x in before.get(k, []) + [line]]


_SUM = re.compile(r"_v = -?(?:[rf]\d+|\(-?\d+\)|\d+)(?: [+-] (?:[rf]\d+|\(-?\d+\)|\d+))?")
_WRAPPED = f"_v if {_INT_BOUNDS} else wrap(_v)"


def wrap_once(lines: list[str]) -> list[str]:
    """The int64 wrap of a sum, difference or negation of int64 values, which is off the
    range by at most 2^64, written as one correction instead of a call of wrap."""
    out = list(lines)
    for k in range(1, len(out)):
        if out[k].endswith(" = " + _WRAPPED) and _SUM.fullmatch(out[k - 1].strip()):
            out[k] = out[k][:-len("wrap(_v)")] + \
                f"_v - {1 << 64} if _v > 0 else _v + {1 << 64}"
    return out
