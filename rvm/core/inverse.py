"""The bytecode inverse: reverse a piece of code, replace each instruction by its inverse,
and let branches and comefroms swap roles (a comefrom, read backwards, is a branch).

It is a property of bytecode, used alike by the frontends (uncompute blocks, `~f` inside
reversible code) and by the engines (a function's backward run is the forward run of its
inverse). Code here is a list of (label or None, Instruction); labels are renamed so the
inverse can sit next to the original in one function.
"""

from __future__ import annotations

from collections.abc import Callable

from . import isa
from .program import Function, Instruction, Label

Code = list[tuple[str | None, Instruction]]


def _relabelled(ins: Instruction, rename: dict, op: str | None = None) -> Instruction:
    """ins with its labels renamed (and op for its mnemonic), its other fields kept (built
    directly: attrs.evolve took twice as long to invert a program)."""
    return Instruction(op or ins.op, tuple(Label(rename[a.name]) if isinstance(a, Label)
                                           else a for a in ins.args), ins.line, ins.pull)


def invert(code: Code, fresh: Callable[[str], str]) -> Code:
    rename = {label: fresh(label) for label, _ in code if label}
    return [(rename.get(label) if label else None,
             _relabelled(ins, rename, op=isa.OPS[ins.op].inverse))
            for label, ins in reversed(code)]


def relabel(code: Code, fresh: Callable[[str], str]) -> Code:
    """The same code with fresh labels (to emit a second copy of it)."""
    rename = {label: fresh(label) for label, _ in code if label}
    return [(rename.get(label) if label else None, _relabelled(ins, rename))
            for label, ins in code]


def inverse_function(fn: Function) -> Function:
    """The function whose forward run is fn's backward run."""
    at: dict[int, str] = {}            # one label per instruction; the others renamed to it
    for name, i in fn.labels.items():
        at.setdefault(i, name)
    same = {name: at[i] for name, i in fn.labels.items()}
    code = [(at.get(i), _relabelled(ins, same)) for i, ins in enumerate(fn.code)]
    code = invert(code, lambda s: s + "_")
    labels = {label: i for i, (label, _) in enumerate(code) if label}
    return Function(fn.name, fn.params, tuple(ins for _, ins in code), labels, fn.line,
                    fn.end_line, fn.names, fn.symbols, mirrored(fn.regions, len(fn.code)),
                    fn.outputs, checks=fn.checks)


def mirrored(regions: tuple, n: int) -> tuple:
    """Compute/uncompute regions of a function as they sit in its inverse."""
    swap = {"compute": "uncompute", "uncompute": "compute"}
    return tuple((name, swap[kind], n - end, n - start) for name, kind, start, end in regions)
