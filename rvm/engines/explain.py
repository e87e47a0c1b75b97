"""Run-time errors in the user's terms, for programs compiled from source.

A failed check names registers and internal labels (`f2 = 2.0, must be 0 here`,
`comefrom at then_2`). For a function with debug symbols (the Python frontend's), this
module says the same thing with the source's names and constructs: "ancilla `t` is 2.0
when its block ends at line 12; it must be back to 0.0", "the `if` at line 8: its
post-condition `x < 1.0` is false after the then-branch, with x = 2.0". Assembly programs
keep the register-level message, which is also kept as the error's `detail`.
"""

from __future__ import annotations

import ast
import re

from ..core import isa
from ..core.program import Function, Reg
from ..formats.bytecode import source_line


def names_at(fn: Function, line: int) -> dict[Reg, str]:
    """Registers holding a source variable at `line` (innermost scope last wins)."""
    out = {}
    for s in fn.symbols:
        if len(s.regs) == 1 and s.first <= line <= s.last:
            out[s.regs[0]] = s.name
    return out


def shown_names(fn: Function, line: int) -> dict[str, str]:
    """What views print for a register at `line` (the trace, the control-flow view): its
    source or `.alias` name, an array's base its name and its dimensions `len(a)` (1-D)
    or `a.shape[0]`, `a.shape[1]`; registers with no name are not in it."""
    out = {}
    for s in fn.symbols:
        if not s.first <= line <= s.last or not s.regs:
            continue
        if len(s.regs) == 1:
            out[str(s.regs[0])] = s.name
        else:
            out[str(s.regs[0])] = s.name
            dims = s.regs[1:]
            for k, r in enumerate(dims):
                out[str(r)] = f"len({s.name})" if len(dims) == 1 else f"{s.name}.shape[{k}]"
    return out


_REGISTER = re.compile(r"(?<![\w.])[rf]\d+(?![\w.])")


def with_names(fn: Function, text: str, line: int) -> str:
    """Assembly text with the registers that have a name at `line` written by it."""
    names = shown_names(fn, line)
    if not names:
        return text
    return _REGISTER.sub(lambda m: names.get(m.group(0), m.group(0)), text)


def _statement(path: str, line: int) -> ast.stmt | None:
    text = source_line(path, line).strip() if path else ""
    if not text.endswith(":"):
        return None
    try:
        return ast.parse(text + " pass").body[0]
    except SyntaxError:
        return None


def _values(expr: ast.expr, values: dict[str, object]) -> str:
    shown = [f"{n} = {values[n]!r}" for n in dict.fromkeys(
        x.id for x in ast.walk(expr) if isinstance(x, ast.Name)) if n in values]
    return ", with " + ", ".join(shown) if shown else ""


_NOT_FINITE = re.compile(r"([rf]\d+) would become (.*): not finite$")

# Python's math module's errors, raised by a function family's value (ADD.exp, SUB.log, ...)
_MATH_ERRORS = {"math range error": "overflows", "math domain error": "is undefined"}


def _family_error(fn: Function, ins, line: int, path: str, R: list, message: str,
                  names: dict) -> str:
    """`total += math.exp(x)` at line 5: exp(1000.0) overflows (math range error)."""
    op, family = ins.op.split(".", 1)
    dest, *args = ins.args
    text = source_line(path, line).strip() if path else ""
    if not text:
        said = lambda a: names.get(a) or str(a)
        text = f"{said(dest)} {'+' if op == 'ADD' else '-'}= " \
            f"{family}({', '.join(map(said, args))})"
    shown = [repr(R[fn.slot(a)]) if isinstance(a, Reg) else str(a) for a in args]
    return (f"`{text}` at line {line}: {family}({', '.join(shown)}) "
            f"{_MATH_ERRORS[message]} ({message})")


# other frontends' explainers by file suffix (the Janus frontend adds ".ja" when loaded)
EXPLAINERS: dict = {}


def explain(fn: Function, ins, line: int, path: str, R: list, message: str) -> str | None:
    """The message in source terms, or None when there is nothing better to say."""
    if ins is None:
        return None
    for suffix, other in EXPLAINERS.items():     # (a frontend's own: a Janus `error(...)`
        if path.endswith(suffix):                 # speaks even where no variable exists)
            return other(fn, ins, line, path, R, message)
    if not fn.symbols:
        return None
    if ins.op in ("ASSERT.LT", "ASSERT.GE"):
        bounds = _bounds(fn, ins, line, path, R)
        if bounds is not None:
            return bounds
    if ins.op.startswith("ASSERT"):
        return _assertion(fn, line, path, R) or _made_check(fn, ins, line, path, R) or \
            _requirement(fn, ins, line, path, R)
    if ins.spec.group == "array":
        return _cells_named(fn, line, R, message)
    names = names_at(fn, line)
    values = {name: R[fn.slot(r)] for r, name in names.items()}
    if message in _MATH_ERRORS and ins.spec.group == "family":
        return _family_error(fn, ins, line, path, R, message, names)
    nonfinite = _NOT_FINITE.match(message)
    if nonfinite:
        reg = nonfinite.group(1)
        named = {str(r): n for r, n in names.items()}.get(reg)
        named = f"`{named}`" if named else f"an intermediate value of line {line} ({reg})"
        return f"{named} would become {nonfinite.group(2)} at line {line}: not finite"
    if ins.op == "ZERO" and ins.args[0] in names:
        name = names[ins.args[0]]
        zero = 0.0 if ins.args[0].cls == "f" else 0
        return (f"ancilla `{name}` is {values[name]!r} when its block ends at line {line}; "
                f"it must be back to {zero!r}")
    label = ins.args[-1].name if ins.args and hasattr(ins.args[-1], "name") else ""
    stmt = _statement(path, line)
    if stmt is None or not label:
        return None
    kind = "if" if isinstance(stmt, ast.If) else "while" if isinstance(stmt, ast.While) \
        else None
    if kind is None:
        return None
    test = stmt.test
    pre, post = (test.elts[0], test.elts[1]) if isinstance(test, ast.Tuple) and \
        len(test.elts) == 2 else (test, test)
    arrived = "arrived by its jump" in message
    if kind == "if" and label.startswith("then"):
        branch = "then" if arrived else "else"
        truth = "false" if arrived else "true"
        return (f"the `if` at line {line}: its post-condition `{ast.unparse(post)}` is "
                f"{truth} after the {branch}-branch{_values(post, values)}")
    if kind == "while" and label.startswith("back"):
        when = "after a pass" if arrived else "on entry"
        truth = "false" if arrived else "true"
        return (f"the `while` at line {line}: its post-condition `{ast.unparse(post)}` is "
                f"{truth} {when}; it must be false on entry and true after every pass"
                f"{_values(post, values)}")
    if label.startswith(("if", "exit")):      # running backwards: the pre-condition
        return (f"the `{kind}` at line {line}, run backwards: its condition "
                f"`{ast.unparse(pre)}` does not match the way it was entered"
                f"{_values(pre, values)}")
    return None


def _assertion(fn: Function, line: int, path: str, R: list) -> str | None:
    text = source_line(path, line).strip() if path else ""
    try:
        stmt = ast.parse(text).body[0]
    except (SyntaxError, IndexError):
        return None
    if not isinstance(stmt, ast.Assert):
        return None
    values = {name: R[fn.slot(r)] for r, name in names_at(fn, line).items()}
    said = f": {ast.literal_eval(stmt.msg)}" if isinstance(stmt.msg, ast.Constant) else ""
    return (f"assertion `{ast.unparse(stmt.test)}` failed at line {line}{said}"
            f"{_values(stmt.test, values)}")


_CELL = re.compile(r"heap cell (\d+)")


def _cells_named(fn: Function, line: int, R: list, message: str) -> str | None:
    """An array instruction's message with each heap cell it names written as the
    element of the source's array that holds it (`y[1]`, `A[0, 2]`), at its line."""
    arrays = []
    for s in fn.symbols:
        if len(s.regs) > 1 and s.first <= line <= s.last:
            base, dims = R[fn.slot(s.regs[0])], [R[fn.slot(r)] for r in s.regs[1:]]
            arrays.append((s.name, base, dims))

    def element(m):
        c = int(m.group(1))
        for name, base, dims in arrays:
            size = dims[0] * (dims[1] if len(dims) > 1 else 1)
            if base <= c < base + size:
                at = (c - base,) if len(dims) == 1 else divmod(c - base, dims[1])
                return f"{name}[{', '.join(map(str, at))}]"
        return m.group(0)
    named = _CELL.sub(element, message)
    return None if named == message else f"{named} (line {line})"


def _where(path: str, line: int) -> str:
    """`line 7 (`y += x`)`: the line, and its source text where there is one."""
    text = source_line(path, line).strip() if path else ""
    return f"line {line}" + (f" (`{text}`)" if text else "")


def _made_check(fn: Function, ins, line: int, path: str, R: list) -> str | None:
    """A check the compiler made for a statement (Function.checks: a slice's bounds, an
    overlap), in the source's terms: "line 7 (`y[a:a + n] += x`): the slice y[a:a + n]
    ends past the end of y: it needs a + n <= len(y), with a + n = 7, len(y) = 6"."""
    made = next((c for c in fn.checks if c[:3] == (ins.line, ins.op, ins.args)), None)
    if made is None or made[3] is None:     # (None: two checks alike, see made_check)
        return None
    _, op, args, message, operands, hint, shown = made
    if operands:
        sides = [f"{o} = {R[fn.slot(a)]!r}" for o, a in zip(operands, args)
                 if isinstance(a, Reg)]
        said = f": it needs {operands[0]} {isa.CONDITIONS[op.partition('.')[2]]} " \
            f"{operands[1]}" + (f", with {', '.join(sides)}" if sides else "")
    else:
        try:
            tree = ast.parse(shown)
        except SyntaxError:
            tree = None
        values = {name: R[fn.slot(r)] for r, name in names_at(fn, line).items()}
        said = _values(tree, values) if tree is not None else ""
    return f"{_where(path, line)}: {message}{said}" + (f"; {hint}" if hint else "")


def _requirement(fn: Function, ins, line: int, path: str, R: list) -> str | None:
    """A check the compiler made for a statement that is not an `assert` (an array
    statement's shapes, a slice's bounds), with the source's names: "line 6 (`y += x`)
    needs len(x) == len(y): len(x) = 4, len(y) = 3"."""
    names = shown_names(fn, line)
    parts, shown = [], []
    for a in ins.args[:2]:
        if isinstance(a, Reg):
            name = names.get(str(a))
            if name is None:
                return None             # a value the source does not name
            parts.append(name)
            shown.append(f"{name} = {R[fn.slot(a)]!r}")
        else:
            parts.append(repr(getattr(a, "value", a)))
    return (f"{_where(path, line)} needs {parts[0]} "
            f"{isa.CONDITIONS[ins.op.partition('.')[2]]} {parts[1]}: {', '.join(shown)}")


def explain_locals(fn: Function, line: int, bad: dict) -> str | None:
    """Ancillas not restored when a frame is left, by their source names."""
    if not fn.symbols:
        return None
    named = {}
    for s in fn.symbols:
        if len(s.regs) == 1 and str(s.regs[0]) in bad:
            named[s.name] = bad[str(s.regs[0])]
    if len(named) != len(bad):
        return None
    listing = ", ".join(f"`{n}` = {v!r}" for n, v in named.items())
    return (f"{'ancillas' if len(named) > 1 else 'ancilla'} {listing} not back to zero when "
            f"{fn.name} is left at line {line}; the values would be lost")


def array_dims(fn: Function, line: int) -> dict:
    """Registers holding an array's dimensions at `line`: register -> (array name, which
    dimension, the dimension registers) (arrays' symbols are (base, dims...))."""
    dims = {}
    for s in fn.symbols:
        if len(s.regs) > 1 and s.first <= line <= s.last:
            for k, r in enumerate(s.regs[1:]):
                dims[r] = (s.name, k, s.regs[1:])
    return dims


def bounds_check(fn: Function, ins, line: int):
    """(index register or constant, dimension register, (array, dimension, dims)) of the
    failed check `index >= 0` / `index < length` that guards an array access, or None."""
    dims = array_dims(fn, line)
    index, length = ins.args[0], ins.args[1]
    if ins.op == "ASSERT.GE":          # index >= 0: its length is the next check's
        if isinstance(length, Reg) or getattr(length, "value", None) != 0:
            return None
        at = next((j for j, x in enumerate(fn.code) if x is ins), None)
        length = next((x.args[1] for x in fn.code[at + 1:at + 4] if x.op == "ASSERT.LT"
                       and x.args[0] == index), None) if at is not None else None
    if not isinstance(length, Reg) or length not in dims:
        return None
    return index, length, dims[length]


def _bounds(fn: Function, ins, line: int, path: str, R: list) -> str | None:
    """An array index out of bounds in source terms: `a[i]: i = 2 is outside a (length
    2)`, the access as the source line writes it."""
    found = bounds_check(fn, ins, line)
    if found is None:
        return None
    index, length, (name, k, regs) = found
    value = R[fn.slot(index)] if isinstance(index, Reg) else getattr(index, "value", index)
    text = source_line(path, line).strip() if path else ""
    access, expr = f"{name}[...]", None
    try:
        tree = ast.parse(text if not text.endswith(":") else text + " pass")
    except SyntaxError:
        tree = None
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                node.value.id == name:
            access = ast.unparse(node)
            parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if k < len(parts):
                expr = ast.unparse(parts[k])
            break
    named = names_at(fn, line).get(index) if isinstance(index, Reg) else None
    shown = f"{named} = {value!r}" if named and expr in (None, named) else \
        f"the index {expr} = {value!r}" if expr and expr != repr(value) else \
        f"the index {value!r}"
    if len(regs) == 1:
        where = f"{name} (length {R[fn.slot(length)]})"
    else:
        which = "rows" if k == 0 else "columns"
        where = f"the {which} of {name} ({R[fn.slot(length)]} {which}; {name} is " \
            f"{' x '.join(str(R[fn.slot(r)]) for r in regs)})"
    return f"{access}: {shown} is outside {where}"
