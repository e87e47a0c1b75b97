"""The inverse of a straight piece of bytecode: reverse it, replace each instruction by its
inverse, and let branches and comefroms swap roles (a comefrom, read backwards, is a branch).

Code here is a list of (label or None, Instruction). Labels are renamed so the inverse can
sit next to the original in one function.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import isa
from ..program import Instruction, Label

Code = list[tuple[str | None, Instruction]]


def invert(code: Code, fresh: Callable[[str], str]) -> Code:
    rename = {label: fresh(label) for label, _ in code if label}
    out: Code = []
    for label, ins in reversed(code):
        args = tuple(Label(rename[a.name]) if isinstance(a, Label) else a for a in ins.args)
        out.append((rename.get(label) if label else None,
                    Instruction(isa.OPS[ins.op].inverse, args, ins.line)))
    return out


def relabel(code: Code, fresh: Callable[[str], str]) -> Code:
    """The same code with fresh labels (to emit a second copy of it)."""
    rename = {label: fresh(label) for label, _ in code if label}
    return [(rename.get(label) if label else None,
             Instruction(ins.op, tuple(Label(rename[a.name]) if isinstance(a, Label) else a
                                       for a in ins.args), ins.line)) for label, ins in code]
