"""Generate docs/isa.md from the instruction table (rvm/core/isa.py).

    python tools/gen_isa_doc.py            # rewrite docs/isa.md
    python tools/gen_isa_doc.py --stdout   # print it (the test compares the two)
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rvm.core import isa

KIND = {"D": "dst", "X": "reg", "S": "src", "V": "value", "C": "count", "M": "[mem]", "L": "label",
        "F": "func, regs..."}
ADJOINT_NOTE = {  # rows with no float form: what gradient mode does for them
    "arith": "no gradient (integers): the inverse",
    "memory": "the inverse; a freed cell's gradient shadow is dropped",
    "control": "no gradient: same as plain mode",
    "call": "the callee runs backwards (CALL) or forwards (UNCALL) in gradient mode",
}
GROUPS = [("arith", "Arithmetic"), ("family", "Function families (d op= f(args))"),
          ("memory", "Memory"), ("control", "Control flow"), ("call", "Calls")]


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>")


def render() -> str:
    out = ["# Instruction set", "",
           "Generated from `rvm/core/isa.py` by `python tools/gen_isa_doc.py`; do not edit.", "",
           "Operands: `dst` an accumulated destination register (its class picks the integer "
           "or float form), `reg` a register changed in place, `src` a register or an "
           "immediate (float forms also read integer registers), `count` an integer "
           "register or non-negative immediate, `[mem]` a heap cell `[rB]`, `[rB + 3]`, "
           "`[rB + rK]`, `label` a label, `func` a function name. A destination may not "
           "also be an operand of the same instruction.", "",
           "Forms: `i` integer registers (int64, wrap-around), `f` float registers "
           "(float64). The forward and adjoint columns are the exact templates the "
           "interpreter is generated from (see the template language in `rvm/core/isa.py`).", ""]
    for group, title in GROUPS:
        out += [f"## {title}", "",
                "| mnemonic | operands | inverse | forms | meaning | forward | adjoint |",
                "|---|---|---|---|---|---|---|"]
        for s in isa.TABLE:
            if s.group != group:
                continue
            ops = ", ".join(f"{n}:{KIND[k]}" for n, k in zip(s.names, s.kinds))
            forms = " ".join(sorted(s.forward)) or "-"
            fwd = "<br>".join(f"{c}: `{cell(t)}`" for c, t in sorted(s.forward.items()) if t)
            adj = f"`{cell(s.adjoint)}`" if s.adjoint else ADJOINT_NOTE[s.group]
            out.append(f"| `{s.name}` | {ops} | `{s.inverse}` | {forms} | {cell(s.doc)} "
                       f"| {fwd or '-'} | {adj} |")
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
