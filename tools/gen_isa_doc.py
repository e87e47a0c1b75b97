"""Generate docs/isa.md from the instruction table (rvm/core/isa.py).

    python tools/gen_isa_doc.py            # rewrite docs/isa.md
    python tools/gen_isa_doc.py --stdout   # print it (the test compares the two)
"""

import ast
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rvm.ad.transforms import partials, tangent_function
from rvm.core import isa
from rvm.core.program import Function, Instruction, Program, Reg

KIND = {"D": "dst", "X": "reg", "S": "src", "V": "value", "C": "count", "M": "[mem]", "L": "label",
        "F": "func, regs...", "W": "[view]", "U": "[view] or src"}
ADJOINT_NOTE = {  # rows with no float form: what gradient mode does for them
    "arith": "no gradient (integers): the inverse",
    "memory": "the inverse; a freed cell's gradient shadow is dropped",
    "control": "no gradient: same as plain mode",
    "call": "the callee runs backwards (CALL) or forwards (UNCALL) in gradient mode",
}
GROUPS = [("arith", "Arithmetic"), ("family", "Function families (d op= f(args))"),
          ("memory", "Memory"), ("control", "Control flow"), ("call", "Calls"),
          ("array", "Arrays (one instruction per array statement)")]


def tangent_rule(s: isa.OpSpec) -> str:
    """The tangent rule as the tangent transform emits it, for one float instruction with
    its operands in registers: x' is the tangent of x, t0, t1, ... zeroed temporaries."""
    if s.name in isa.CONSTANT_READS:             # a constant has no tangent
        return f"`{s.name} x, [2a]` (the value cell only; a the address)"
    if s.name in isa.READS or s.name == "EXCH":   # on the interleaved heap
        return (f"`{s.name} x, [2a]`<br>`{s.name} x', [2a + 1]` (each cell followed by its "
                "tangent; a the address)")
    if s.group == "array":
        return array_rule(s)
    if isa.FLOAT not in s.forward or s.group not in ("arith", "family", "memory") or \
            s.name in ("NOP", "EXCH"):
        return "-"
    regs = [Reg(isa.FLOAT, k) for k in range(len(s.names))]
    n = len(regs)
    ins = Instruction(s.name, tuple(regs))
    fn = Function("t", tuple(regs), (ins,))
    code = tangent_function(Program({"t": fn}), fn, {"t": "t"}).code
    names = {f"f{k}": name for k, name in enumerate(s.names)}
    names.update({f"f{k + n}": f"{name}'" for k, name in enumerate(s.names)})

    def show(r):
        text = str(r)
        return names.get(text, f"t{r.n - 2 * n}" if isinstance(r, Reg) else text)
    return "<br>".join(f"`{i.op} {', '.join(show(a) for a in i.args)}`" for i in code)


def array_rule(s: isa.OpSpec) -> str:
    """An array instruction's tangent rule, in words: on the interleaved heap its views
    are every second cell (values) and the cells between (tangents)."""
    head, _, fam = s.name.partition(".")
    sign = "+" if head.startswith(("VADD", "VMADD")) else "-"
    if head in ("VADD", "VSUB"):
        names = isa.FAMILIES[fam][0] if fam else ("a",)
        parts = [ast.unparse(p) for p in partials(fam)] if fam else ["1.0"]
        terms = " + ".join(f"{a}' * ({p})" if p != "1.0" else f"{a}'"
                           for a, p in zip(names, parts))
        return (f"`{s.name} y, {', '.join(names)}`<br>y' {sign}= {terms} (partials through "
                "temporary blocks)")
    if head in ("VMADD", "VMSUB"):
        return f"`{s.name} y, a, b`<br>`{s.name} y', a', b`<br>`{s.name} y', a, b'`"
    if s.name == "VMUL":
        return "`VMUL x', c`<br>`VADD.mul x', x, c'`<br>`VMUL x, c`"
    if s.name == "VDIV":
        return "`VDIV x, c`<br>`VSUB.mul x', x, c'`<br>`VDIV x', c`"
    return f"`{s.name} x`<br>`{s.name} x'`" if s.name == "VNEG" else \
        f"`{s.name} a, b`<br>`{s.name} a', b'`"


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def render() -> str:
    out = ["# Instruction set", "",
           "Generated from `rvm/core/isa.py` by `python tools/gen_isa_doc.py`; do not edit.", "",
           "Operands: `dst` an accumulated destination register (its class picks the integer "
           "or float form), `reg` a register changed in place, `src` a register or an "
           "immediate (float forms also read integer registers), `count` an integer "
           "register or non-negative immediate, `[mem]` a heap cell `[rB]`, `[rB + 3]`, "
           "`[rB + rK]`, `label` a label, `func` a function name, `[view]` a strided view "
           "of heap cells `[rB + off : s0, s1]` (element (i, j) of the instruction's m x n "
           "shape is cell rB + off + i*s0 + j*s1; a stride of 0 repeats a cell: a "
           "broadcast operand, or a sum into the target). A destination may not "
           "also be an operand of the same instruction; the cells an array instruction "
           "writes may not overlap the cells it reads (their address ranges are checked "
           "to be disjoint, with the shape and the heap's bounds, once per instruction).",
           "",
           "Forms: `i` integer registers (int64, wrap-around), `f` float registers "
           "(float64). The forward and adjoint columns are the exact templates the "
           "interpreter is generated from (see the template language in `rvm/core/isa.py`). "
           "The tangent column is what the tangent transform (`rvm.tangent`) emits for the "
           "instruction (itself included, to show the order), derived from the row's "
           "partial derivatives: `x'` is the tangent of `x`, `t0`, `t1`, ... are zeroed "
           "temporaries it computes and uncomputes. An array instruction's rule runs on the "
           "interleaved heap (each cell of the program followed by its tangent): its views "
           "are every second cell, their tangents the cells between.", ""]
    for group, title in GROUPS:
        out += [f"## {title}", "",
                "| mnemonic | operands | inverse | forms | meaning | forward | adjoint "
                "| tangent |", "|---|---|---|---|---|---|---|---|"]
        for s in isa.TABLE:
            if s.group != group:
                continue
            ops = ", ".join(f"{n}:{KIND[k]}" for n, k in zip(s.names, s.kinds))
            forms = " ".join(sorted(s.forward)) or "-"
            fwd = "<br>".join(f"{c}: `{cell(t)}`" for c, t in sorted(s.forward.items()) if t)
            adj = f"`{cell(s.adjoint)}`" if s.adjoint else ADJOINT_NOTE[s.group]
            out.append(f"| `{s.name}` | {ops} | `{s.inverse}` | {forms} | {cell(s.doc)} "
                       f"| {fwd or '-'} | {adj} | {tangent_rule(s)} |")
        out.append("")
    out += ["## Opcode numbers (bytecode)", "",
            " ".join(f"`{i}` {s.name}" for i, s in enumerate(isa.TABLE)), ""]
    return "\n".join(out)


if __name__ == "__main__":
    text = render()
    if "--stdout" in sys.argv:
        sys.stdout.write(text)
    else:
        (ROOT / "docs" / "isa.md").write_text(text)
        print("wrote docs/isa.md")
