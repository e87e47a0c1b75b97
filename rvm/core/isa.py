"""THE instruction table. Every other part of rvm reads it.

Each row (`OpSpec`) says, for one mnemonic: its operands, its inverse, a doc line, its forward
semantics and its adjoint (the gradient rule). Semantics are written as small statement
templates over the operands (`{d} = {d} + {a} * {b}`); `rvm.engines.templates` turns them
into Python, so the interpreter, gradient mode, docs and compiled engines share one definition.

Template language, one statement per line:

    {x} = EXPR            assign; int destinations wrap to int64, float ones must stay finite
    {x}, {y} = E1, E2     simultaneous assignment (no wrap; used for exchanges)
    {gx} ...              a statement on x's gradient shadow; dropped when x has none
                          (an immediate or an integer register)
    check COND : MESSAGE  an invertibility check made before anything changes
    let NAME = EXPR       a temporary (one of TEMPORARIES, which gives its class)
    do EXPR               an expression run for its effect (heap management)

Operand kinds: D accumulated destination (its register class picks the int or the float
form); X a register changed in place; S a source (register or immediate; float forms accept
int registers, converted); C a count (int register or non-negative int immediate); M a memory
operand ``[rB + off]``; L a label; F a function name followed by registers; V a value of
either class (register or immediate) that an integer form may read (comparisons); W a
strided view of heap cells ``[rB + off : s0, s1]`` (the array instructions: element (i, j)
is the cell at rB + off + i*s0 + j*s1, over the instruction's shape); U a view or a scalar
(a register or an immediate, the same for every element).

The array instructions (group "array") run on the heap's float cells through the
machine's array helpers (`M.vacc(...)` and the like: rvm.engines.arrays, and their native
lowering), which check the shape and the bounds of every view, and that the cells written
do not overlap the cells read, once per instruction.
"""

from __future__ import annotations

import attrs

INT, FLOAT = "i", "f"
# the templates' temporaries (`let NAME = EXPR`) and their classes: generated code
# declares them with these types (rvm.engines.compiled)
TEMPORARIES = {"p": "f", "c": "f", "s": "f"}
CONDITIONS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
NEGATED = {"EQ": "NE", "NE": "EQ", "LT": "GE", "GE": "LT", "GT": "LE", "LE": "GT"}


@attrs.frozen
class OpSpec:
    """One row of the instruction table."""

    name: str                      # mnemonic as written in assembly, e.g. "ADD.mul"
    operands: tuple[str, ...]      # "name:KIND" for each operand, e.g. ("d:D", "a:S")
    inverse: str                   # mnemonic of the inverse instruction
    doc: str                       # one line for docs/isa.md
    forward: dict = attrs.field(factory=dict)   # register class -> statement template
    adjoint: str | None = None     # float form: undo the value change and pull back shadows
    group: str = "arith"           # arith | family | memory | control | call | array
    # the operands' names and kinds, split once (code generation asks for them per operand)
    names: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)
    kinds: tuple[str, ...] = attrs.field(init=False, eq=False, repr=False)

    @names.default
    def _names(self) -> tuple[str, ...]:
        return tuple(o.split(":")[0] for o in self.operands)

    @kinds.default
    def _kinds(self) -> tuple[str, ...]:
        return tuple(o.split(":")[1] for o in self.operands)

    @property
    def variadic(self) -> bool:
        return self.kinds[-1:] == ("F",)


# ---------------------------------------------------------------- function families
# name -> (operand names, float value, float partial derivatives, int value or None).
# `ADD.name d, args` is d += f(args); `SUB.name` is d -= f(args). Any pure f is reversible
# this way as long as d is not among its arguments, which the verifier enforces.
_GT = "(1.0 if {x} > {y} else 0.0)"       # (the gt family's value)
FAMILIES: dict[str, tuple[tuple[str, ...], str, tuple[str, ...], str | None]] = {
    "mul": (("a", "b"), "{a} * {b}", ("{b}", "{a}"), "{a} * {b}"),
    "div": (("a", "b"), "{a} / {b}", ("1.0 / {b}", "-({a} / {b}) * (1.0 / {b})"), "{a} // {b}"),
    "mod": (("a", "b"), "math.fmod({a}, {b})", ("1.0", "-math.trunc({a} / {b})"),
            "{a} % {b}"),
    "pow": (("a", "b"), "math.pow({a}, {b})",
            ("{b} * math.pow({a}, {b} - 1)", "dpow_db({a}, {b})"), None),
    "exp": (("a",), "math.exp({a})", ("math.exp({a})",), None),
    "log": (("a",), "math.log({a})", ("1.0 / {a}",), None),
    "sin": (("a",), "math.sin({a})", ("math.cos({a})",), None),
    "cos": (("a",), "math.cos({a})", ("-math.sin({a})",), None),
    "tanh": (("a",), "math.tanh({a})", ("1.0 - math.pow(math.tanh({a}), 2)",), None),
    "sqrt": (("a",), "math.sqrt({a})", ("0.5 / math.sqrt({a})",), None),
    "abs": (("a",), "abs({a})", ("sign({a})",), "abs({a})"),
    "atan2": (("a", "b"), "math.atan2({a}, {b})",
              ("{b} / ({a} * {a} + {b} * {b})", "-{a} / ({a} * {a} + {b} * {b})"), None),
    # piecewise constant: the partials of abs, mod, max and min use them
    "sign": (("a",), "sign({a})", ("0.0",), None),
    "trunc": (("a",), "float(math.trunc({a}))", ("0.0",), None),
    # Python's max and min (a unless b is greater, or less): the partials split a tie
    # evenly, as JAX's and PyTorch's maximum and minimum do, from comparisons (gt), which
    # the derived programs compute and take back exactly (b - a would round, or overflow)
    "max": (("a", "b"), "({b} if {b} > {a} else {a})",
            (f"0.5 + 0.5 * {_GT.format(x='{a}', y='{b}')} - 0.5 * {_GT.format(x='{b}', y='{a}')}",
             f"0.5 + 0.5 * {_GT.format(x='{b}', y='{a}')} - 0.5 * {_GT.format(x='{a}', y='{b}')}"),
            "({b} if {b} > {a} else {a})"),
    "min": (("a", "b"), "({b} if {b} < {a} else {a})",
            (f"0.5 + 0.5 * {_GT.format(x='{b}', y='{a}')} - 0.5 * {_GT.format(x='{a}', y='{b}')}",
             f"0.5 + 0.5 * {_GT.format(x='{a}', y='{b}')} - 0.5 * {_GT.format(x='{b}', y='{a}')}"),
            "({b} if {b} < {a} else {a})"),
    # 1 where a > b, else 0: the partials of max and min use it
    "gt": (("a", "b"), _GT.format(x="{a}", y="{b}"), ("0.0", "0.0"), "(1 if {a} > {b} else 0)"),
    # a + b, one rounding: the derived programs' sums (a sum made by two accumulations
    # into one temporary need not come back to zero when taken apart: a*a + b*b - b*b -
    # a*a; one instruction is taken back exactly)
    "plus": (("a", "b"), "({a} + {b})", ("1.0", "1.0"), None),
}
# families added after the first bytecode release, in the order they came: their rows go
# at the table's end (each batch's scalar forms, then its array forms), so that every
# earlier opcode keeps its number
ADDED = (("max", "min"), ("gt",), ("plus",))
ADDED_FAMILIES = tuple(f for batch in ADDED for f in batch)
def family(name: str | None) -> tuple[tuple[str, ...], str, tuple[str, ...]]:
    """(operand names, float value, partial derivatives) of a function family by name, or
    of the plain accumulation d += a (no name, or "id": the array instructions' VADD)."""
    if not name or name == "id":
        return ("a",), "{a}", ("1.0",)
    args, value, partials, _ = FAMILIES[name]
    return args, value, partials


FAMILY_DOC = {
    "mul": "a * b", "div": "a / b (floor division on ints)", "mod": "a mod b (fmod on floats)",
    "pow": "a ** b", "exp": "exp(a)", "log": "log(a)", "sin": "sin(a)", "cos": "cos(a)",
    "tanh": "tanh(a)", "sqrt": "sqrt(a)", "abs": "abs(a)", "atan2": "atan2(a, b)",
    "max": "max(a, b): a unless b > a", "min": "min(a, b): a unless b < a",
    "gt": "1 where a > b, else 0", "plus": "a + b (the derived programs' sums)",
    "sign": "sign(a): -1, 0 or 1", "trunc": "a rounded toward zero",
}


def _accumulate(sign: str, name: str, family: str | None = None) -> OpSpec:
    """ADD/SUB and their function families: d (+|-)= f(args)."""
    other = "SUB" if sign == "+" else "ADD"
    if family is None:
        args, value, partials, ivalue = ("s",), "{s}", ("1.0",), "{s}"
        mnemonic, inv, doc = name, other, f"d {sign}= s"
    else:
        args, value, partials, ivalue = FAMILIES[family]
        mnemonic, inv = f"{name}.{family}", f"{other}.{family}"
        doc = f"d {sign}= {FAMILY_DOC[family]}"
    undo = "-" if sign == "+" else "+"
    forward = {FLOAT: f"{{d}} = {{d}} {sign} {value}"}
    if ivalue is not None:
        forward[INT] = f"{{d}} = {{d}} {sign} {ivalue}"
    adjoint = [f"{{d}} = {{d}} {undo} {value}"]
    adjoint += [f"{{g{a}}} {sign}= {{gd}}" + ("" if p == "1.0" else f" * ({p})")
                for a, p in zip(args, partials)]
    return OpSpec(mnemonic, ("d:D",) + tuple(f"{a}:S" for a in args), inv, doc,
                  forward, "\n".join(adjoint), "arith" if family is None else "family")


def _read(sign: str, name: str, constant: bool = False) -> OpSpec:
    """ADDM/SUBM: d (+|-)= a heap cell, read in place (the cell is not moved). A read is
    a pair, ADDM into a zeroed register and SUBM after the use: no store, where a read by
    exchange stores twice (the cell's value out and back). ADDK/SUBK read the cell as a
    constant: no gradient flows back into it, and no tangent out of it."""
    undo = "-" if sign == "+" else "+"
    inverse = ("SUB" if sign == "+" else "ADD") + name[3:]
    doc = f"d {sign}= heap cell m (read in place; the cell keeps its value)"
    if constant:
        doc = f"d {sign}= heap cell m, as a constant (no gradient flows into the cell)"
    return OpSpec(name, ("d:D", "m:M"), inverse, doc,
                  {FLOAT: f"{{d}} = {{d}} {sign} {{m}}", INT: f"{{d}} = {{d}} {sign} {{m}}"},
                  f"{{d}} = {{d}} {undo} {{m}}" + ("" if constant else
                                                   f"\n{{gm}} {sign}= {{gd}}"), "memory")


_ROT = ("let c = math.cos({t})\nlet s = math.sin({t})\n"
        "{a}, {b} = {a} * c - {b} * s, {a} * s + {b} * c")
_IROT = ("let c = math.cos({t})\nlet s = math.sin({t})\n"
         "{a}, {b} = {a} * c + {b} * s, -{a} * s + {b} * c")
_NONZERO = "check {y} != 0 : {y_src} is zero: {x_src} cannot be scaled by 0 reversibly"
MIN_NORMAL, MAX_FLOAT = 2.2250738585072014e-308, 1.7976931348623157e308


def _scaled(op: str) -> str:
    """x op y into the temporary p, refused where it would lose x: a result that underflows
    to zero or a subnormal, or overflows (a zero x scales to zero, exactly, both ways)."""
    return (f"let p = {{x}} {op} {{y}}\n"
            f"check {{x}} == 0.0 or {MIN_NORMAL!r} <= abs({{x}}) and "
            f"{MIN_NORMAL!r} <= abs(p) <= {MAX_FLOAT!r} : {{x_src}} {op}= {{y_src}}: "
            f"{{x}} {op} {{y}} would leave the normal float range (to zero, a subnormal or "
            "infinity) and could not be undone")

def _views(args) -> str:
    return ", ".join(f"{{{a}}}" for a in args)


def _vaccumulate(sign: str, name: str, family: str | None = None) -> OpSpec:
    """VADD/VSUB and their function families: y (+|-)= f(a, b) element by element."""
    other = "VSUB" if sign == "+" else "VADD"
    args = ("a",) if family is None else FAMILIES[family][0]
    fam = family or "id"
    s = 1 if sign == "+" else -1
    ops = _views(("y", *args)) + ", {m}, {n}"
    adjoint = [f"do M.vacc({fam!r}, {-s}, {ops})"]
    adjoint += [f"{{g{a}}} += M.vgrad({fam!r}, {s}, {k}, {ops})" for k, a in enumerate(args)]
    adjoint += [f"do M.vpull({fam!r}, {s}, {{pull}}, {ops})"]
    what = "a" if family is None else FAMILY_DOC[family].split(" (")[0]
    return OpSpec(name if family is None else f"{name}.{family}",
                  ("y:W",) + tuple(f"{a}:U" for a in args) + ("m:C", "n:C"),
                  other if family is None else f"{other}.{family}",
                  f"y {sign}= {what} element by element over an m x n shape ("
                  + ("a" if len(args) == 1 else "a and b each") + " a view or a scalar)",
                  {FLOAT: f"do M.vacc({fam!r}, {s}, {ops})"},
                  "\n".join(adjoint), "array")


def _vmatmul(sign: str, name: str) -> OpSpec:
    s = 1 if sign == "+" else -1
    ops = "{y}, {a}, {b}, {m}, {k}, {n}"
    return OpSpec(name, ("y:W", "a:W", "b:W", "m:C", "k:C", "n:C"),
                  "VMSUB" if sign == "+" else "VMADD",
                  f"y {sign}= a @ b: y m x n, a m x k, b k x n (BLAS's GEMM, GEMV, DOT)",
                  {FLOAT: f"do M.vmm({s}, {ops})"},
                  f"do M.vmm({-s}, {ops})\ndo M.vmm_pull({s}, {{pull}}, {ops})", "array")


def _vscale(op: str, name: str) -> OpSpec:
    """VMUL/VDIV: x (*|/)= c, refused for c = 0 and for results that leave the normal
    range (as MUL and DIV are)."""
    undo = "/" if op == "*" else "*"
    ops = "{x}, {c}, {m}, {n}"
    if op == "*":       # undo x *= c, then c's shadow gets sum(gx * x), x's is scaled
        adjoint = (f"do M.vscale({undo!r}, {ops}, 0)\n{{gc}} += M.vdotg({{x}}, {{m}}, {{n}})\n"
                   f"do M.vscale({op!r}, {ops}, 1)")
    else:               # (x / c)' = -x / c**2: with x still divided
        adjoint = (f"{{gc}} -= M.vdotg({{x}}, {{m}}, {{n}}) / {{c}}\n"
                   f"do M.vscale({undo!r}, {ops}, 0)\ndo M.vscale({op!r}, {ops}, 1)")
    return OpSpec(name, ("x:W", "c:S", "m:C", "n:C"), "VDIV" if op == "*" else "VMUL",
                  f"x {op}= c element by element (c = 0, and results that underflow or "
                  "overflow, are refused)", {FLOAT: f"do M.vscale({op!r}, {ops}, 0)"},
                  adjoint, "array")


TABLE: list[OpSpec] = [
    OpSpec("NOP", (), "NOP", "do nothing", {INT: "", FLOAT: ""}, "", "arith"),
    _accumulate("+", "ADD"),
    _accumulate("-", "SUB"),
    *(_accumulate(sign, name, fam) for fam in FAMILIES if fam not in ADDED_FAMILIES
      for sign, name in (("+", "ADD"), ("-", "SUB"))),
    OpSpec("XOR", ("d:D", "s:S"), "XOR", "d ^= s (ints)", {INT: "{d} = {d} ^ {s}"}),
    OpSpec("XOR.and", ("d:D", "a:S", "b:S"), "XOR.and", "d ^= a & b (ints)",
           {INT: "{d} = {d} ^ ({a} & {b})"}),
    OpSpec("XOR.or", ("d:D", "a:S", "b:S"), "XOR.or", "d ^= a | b (ints)",
           {INT: "{d} = {d} ^ ({a} | {b})"}),
    *(OpSpec(f"XOR.{cc.lower()}", ("d:D", "a:V", "b:V"), f"XOR.{cc.lower()}",
             f"d ^= (a {op} b) as 0 or 1 (d an integer; a, b any class)",
             {INT: f"{{d}} = {{d}} ^ int({{a}} {op} {{b}})"}) for cc, op in CONDITIONS.items()),
    *(OpSpec(f"ASSERT.{cc}", ("a:V", "b:V"), f"ASSERT.{cc}",
             f"stop with an error unless a {op} b (both directions)",
             {INT: f"check {{a}} {op} {{b}} : assertion {{a_src}} {op} {{b_src}} failed "
                   f"({{a_src}} = {{a}}, {{b_src}} = {{b}})"}) for cc, op in CONDITIONS.items()),
    OpSpec("ZERO", ("x:X",), "ZERO",
           "x must be zero here (floats within the tolerance; the residue is cleared)",
           {INT: "check {x} == 0 : {x_src} = {x}, must be 0 here",
            FLOAT: "check zero({x}) : {x_src} = {x}, must be 0 here\n{x} = 0.0"},
           "check zero({x}) : {x_src} = {x}, must be 0 here\n{x} = 0.0\n{gx} = 0.0"),
    OpSpec("NEG", ("x:X",), "NEG", "x = -x", {INT: "{x} = -{x}", FLOAT: "{x} = -{x}"},
           "{x} = -{x}\n{gx} = -{gx}"),
    OpSpec("INC", ("x:X",), "DEC", "x += 1 (ints)", {INT: "{x} = {x} + 1"}),
    OpSpec("DEC", ("x:X",), "INC", "x -= 1 (ints)", {INT: "{x} = {x} - 1"}),
    OpSpec("SWAP", ("a:X", "b:X"), "SWAP", "exchange a and b (same class)",
           {INT: "{a}, {b} = {b}, {a}", FLOAT: "{a}, {b} = {b}, {a}"},
           "{a}, {b} = {b}, {a}\n{ga}, {gb} = {gb}, {ga}"),
    OpSpec("ROT", ("a:X", "b:X", "t:S"), "IROT",
           "rotate (a, b) by angle t: (a cos t - b sin t, a sin t + b cos t)", {FLOAT: _ROT},
           "{gt} += {gb} * {a} - {ga} * {b}\n" + _IROT
           + "\n{ga}, {gb} = {ga} * c + {gb} * s, -{ga} * s + {gb} * c"),
    OpSpec("IROT", ("a:X", "b:X", "t:S"), "ROT", "rotate (a, b) by angle -t", {FLOAT: _IROT},
           "{gt} += {ga} * {b} - {gb} * {a}\n" + _ROT
           + "\n{ga}, {gb} = {ga} * c - {gb} * s, {ga} * s + {gb} * c"),
    OpSpec("MUL", ("x:X", "y:S"), "DIV",
           "x *= y (floats; y = 0, and results that underflow or overflow, are refused)",
           {FLOAT: f"{_NONZERO}\n{_scaled('*')}\n{{x}} = p"},
           f"{_NONZERO}\n{_scaled('/')}\n{{x}} = p\n{{gy}} += {{gx}} * {{x}}\n"
           "{gx} = {gx} * {y}"),
    OpSpec("DIV", ("x:X", "y:S"), "MUL",
           "x /= y (floats; y = 0, and results that underflow or overflow, are refused)",
           {FLOAT: f"{_NONZERO}\n{_scaled('/')}\n{{x}} = p"},
           f"{_NONZERO}\n{{gy}} -= {{gx}} * {{x}} / {{y}}\n{_scaled('*')}\n{{x}} = p\n"
           "{gx} = {gx} / {y}"),
    # memory: stores are exchanges, reads accumulate; allocation is LIFO so ALLOC/FREE invert
    OpSpec("EXCH", ("x:X", "m:M"), "EXCH", "exchange register x with heap cell m",
           {INT: "{x}, {m} = {m}, {x}", FLOAT: "{x}, {m} = {m}, {x}"},
           "{x}, {m} = {m}, {x}\n{gx}, {gm} = {gm}, {gx}", "memory"),
    OpSpec("ALLOC", ("d:X", "n:C"), "FREE",
           "d = address of n fresh zero cells on top of the heap (d must be 0)",
           {INT: "check {d} == 0 : {d_src} = {d}, must be 0 before ALLOC\n"
                 "{d} = M.alloc({n})"}, group="memory"),
    OpSpec("FREE", ("d:X", "n:C"), "ALLOC",
           "release the top n cells at d (all must be zero); d = 0",
           {INT: "do M.free({d}, {n})\n{d} = 0"}, group="memory"),
    OpSpec("PUSH", ("x:X",), "POP", "push x onto the heap top; x = 0",
           {INT: "do M.push({x})\n{x} = 0", FLOAT: "do M.push({x})\n{x} = 0.0"},
           "check zero({x}) : {x_src} = {x}, must be 0 to undo PUSH\n"
           "{x}, {gx} = M.gpop(True)", "memory"),
    OpSpec("POP", ("x:X",), "PUSH", "pop the heap top into x (x must be 0)",
           {INT: "check {x} == 0 : {x_src} = {x}, must be 0 before POP\n{x} = M.pop(False)",
            FLOAT: "check zero({x}) : {x_src} = {x}, must be 0 before POP\n{x} = M.pop(True)"},
           "do M.gpush({x}, {gx})\n{x} = 0.0\n{gx} = 0.0", "memory"),
    # control flow: branches and comefroms pair up; the engines implement them
    OpSpec("JMP", ("target:L",), "CF", "jump to target (a CF naming this jump)",
           group="control"),
    *(OpSpec(f"BR.{cc}", ("a:S", "b:S", "target:L"), f"CF.{cc}",
             f"jump to target if a {op} b, else fall through", group="control")
      for cc, op in CONDITIONS.items()),
    OpSpec("CF", ("source:L",), "JMP",
           "comefrom: entered only by the jump at source (never by fall-through)",
           group="control"),
    *(OpSpec(f"CF.{cc}", ("a:S", "b:S", "source:L"), f"BR.{cc}",
             f"comefrom: entered by the jump at source iff a {op} b, else by fall-through",
             group="control")
      for cc, op in CONDITIONS.items()),
    OpSpec("CALL", ("f:F",), "UNCALL",
           "run function f on the registers (by reference), forwards", group="call"),
    OpSpec("UNCALL", ("f:F",), "CALL",
           "run function f on the registers (by reference), backwards", group="call"),
    # added after the first bytecode release: new rows go last, so opcode numbers stay
    *(_read(sign, name) for sign, name in (("+", "ADDM"), ("-", "SUBM"))),
    *(_read(sign, name, True) for sign, name in (("+", "ADDK"), ("-", "SUBK"))),
    # arrays: one instruction per array statement (see the module docstring)
    _vaccumulate("+", "VADD"),
    _vaccumulate("-", "VSUB"),
    *(_vaccumulate(sign, name, fam) for fam in FAMILIES if fam not in ADDED_FAMILIES
      for sign, name in (("+", "VADD"), ("-", "VSUB"))),
    _vmatmul("+", "VMADD"),
    _vmatmul("-", "VMSUB"),
    _vscale("*", "VMUL"),
    _vscale("/", "VDIV"),
    OpSpec("VSWAP", ("a:W", "b:W", "m:C", "n:C"), "VSWAP",
           "exchange two m x n views (which may not overlap)",
           {FLOAT: "do M.vswap({a}, {b}, {m}, {n}, 0)"},
           "do M.vswap({a}, {b}, {m}, {n}, 0)\ndo M.vswap({a}, {b}, {m}, {n}, 1)", "array"),
    OpSpec("VNEG", ("x:W", "m:C", "n:C"), "VNEG", "x = -x element by element",
           {FLOAT: "do M.vneg({x}, {m}, {n}, 0)"},
           "do M.vneg({x}, {m}, {n}, 0)\ndo M.vneg({x}, {m}, {n}, 1)", "array"),
    *(row for batch in ADDED for row in (
        *(_accumulate(sign, name, fam) for fam in batch
          for sign, name in (("+", "ADD"), ("-", "SUB"))),
        *(_vaccumulate(sign, name, fam) for fam in batch
          for sign, name in (("+", "VADD"), ("-", "VSUB"))))),
]

OPS: dict[str, OpSpec] = {spec.name: spec for spec in TABLE}
OPCODES: dict[str, int] = {spec.name: i for i, spec in enumerate(TABLE)}
# derived sets, like CPython's opcode.hasjump
BRANCHES = frozenset(n for n in OPS if n == "JMP" or n.startswith("BR."))
COMEFROMS = frozenset(n for n in OPS if n == "CF" or n.startswith("CF."))
CALLS = frozenset({"CALL", "UNCALL"})
READS = frozenset({"ADDM", "SUBM", "ADDK", "SUBK"})  # heap reads in place: d (+|-)= [m]
CONSTANT_READS = frozenset({"ADDK", "SUBK"})   # ... that pass no gradient to the cell
ARRAYS = frozenset(n for n, s in OPS.items() if s.group == "array")
# float instructions whose inverse gives every bit back (moves and a sign): the machine
# may step back over them to take a state native code stopped a few steps past; float
# arithmetic rounds, so x + y - y need not be x (rvm.engines.machine: Machine._exhausted)
MOVES = frozenset({"NOP", "NEG", "SWAP", "EXCH", "PUSH"})


def condition(mnemonic: str) -> str | None:
    """The condition code of a BR.cc / CF.cc mnemonic, or None."""
    head, _, cc = mnemonic.partition(".")
    return cc if head in ("BR", "CF") and cc else None


def lookup(mnemonic: str) -> OpSpec | None:
    """The row for a mnemonic; the suffix of families and conditions is case-insensitive."""
    head, dot, tail = mnemonic.partition(".")
    head = head.upper()
    if dot and head in ("BR", "CF", "ASSERT"):
        tail = tail.upper()
    elif dot:
        tail = tail.lower()
    return OPS.get(head + dot + tail)
