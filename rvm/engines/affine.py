"""Integer registers of a counted loop as affine functions of the pass number.

A counted loop (rvm.engines.compiled.counted) runs its block T times, passes P = 0 .. T-1.
The frontend computes each element's address in a register around the access (`r32 +=
r29 * r22; r32 += r31; ... ; r32 -= r31; r32 -= r29 * r22`), so the address of `x[k, j]`
is not a register the loop leaves alone, yet it is `base + k * n + j` on every pass, with
j the counter (or `base + j * n + k`, its slope n a value the loop leaves alone). This
module works that out: stepping through one pass symbolically, every integer register is
c + sum(coefficient * value on entry) + (p + sum(coefficient * value on entry)) * P where
it can be, with products of registers the loop does not change as single terms. A
register the pass puts back (the address temporaries) has its entry value on every pass;
one the pass moves by a constant (a second index, `e += 1`) is an induction; any other is
unknown.

The values are exact integers, while registers wrap at 64 bits; ADD, SUB, their
multiplication family, INC, DEC, NEG and SWAP commute with the wrap, so a register's
value is its affine value modulo 2**64, and equal to it wherever the affine value lies in
the int64 range (which the callers' tests ensure before relying on it). An affine value
is monotonic in P, so a bound that holds on the first and last passes holds on all.
"""

from __future__ import annotations

from ..core import isa
from ..core.program import Imm, Reg


class Affine:
    """c + sum(k * term) + (p + sum(k * term)) * P, P the pass number; terms are texts of
    entry values, the second sum's (`slope`) of values the loop does not change (a row
    index times a row length the loop leaves alone: `x[j, i]` with j the counter)."""

    __slots__ = ("c", "p", "slope", "terms")

    def __init__(self, c: int = 0, terms: dict | None = None, p: int = 0,
                 slope: dict | None = None):
        self.c, self.p = c, p
        self.terms = {t: k for t, k in (terms or {}).items() if k}
        self.slope = {t: k for t, k in (slope or {}).items() if k}

    def __add__(self, other: Affine) -> Affine:
        return Affine(self.c + other.c, _sum(self.terms, other.terms), self.p + other.p,
                      _sum(self.slope, other.slope))

    def scaled(self, k: int) -> Affine:
        return Affine(self.c * k, {t: v * k for t, v in self.terms.items()}, self.p * k,
                      {t: v * k for t, v in self.slope.items()})

    def __sub__(self, other: Affine) -> Affine:
        return self + other.scaled(-1)

    def __eq__(self, other) -> bool:
        return isinstance(other, Affine) and (self.c, self.terms, self.p, self.slope) == \
            (other.c, other.terms, other.p, other.slope)

    @property
    def fixed(self) -> bool:
        """The same on every pass."""
        return self.p == 0 and not self.slope

    def times(self, other: Affine) -> Affine | None:
        """The product, if affine: a constant times anything, two fixed values (their
        product one term), or a fixed value times one whose slope is a constant."""
        for a, b in ((self, other), (other, self)):
            if a.fixed and not a.terms:
                return b.scaled(a.c)
        if self.fixed and other.fixed:
            return Affine(terms={f"({self.text()}) * ({other.text()})": 1})
        for a, b in ((self, other), (other, self)):
            if a.fixed and not b.slope:
                start = Affine(b.c, b.terms)
                return Affine(terms={f"({a.text()}) * ({start.text()})": 1}
                              if start.terms or start.c else None,
                              p=a.c * b.p, slope={t: k * b.p for t, k in a.terms.items()})
        return None

    def text(self, pass_: str = "0") -> str:
        """The value on pass `pass_` (a Python expression over the entry values)."""
        parts = [f"{k} * {t}" if k != 1 else t for t, k in sorted(self.terms.items())]
        if not self.fixed:
            slope = Affine(self.p, self.slope)
            parts.append(f"{slope.text() if self.slope else self.p} * ({pass_})")
        if self.c or not parts:
            parts.append(str(self.c))
        return "(" + " + ".join(parts) + ")"


def _sum(a: dict, b: dict) -> dict:
    out = dict(a)
    for t, k in b.items():
        out[t] = out.get(t, 0) + k
    return out


def _operand(state: dict, x) -> Affine | None:
    if isinstance(x, Imm):
        return Affine(x.value) if x.cls == isa.INT else None
    if isinstance(x, Reg) and x.cls == isa.INT:
        return state[x] if x in state else Affine(terms={str(x): 1})
    return None


def changes(ins) -> set:
    """The integer registers ins may change (a call: all it passes, by reference)."""
    regs = ins.args[1:] if ins.op in isa.CALLS else ins.written
    return {r for r in regs if isinstance(r, Reg) and r.cls == isa.INT}


def _step(state: dict, ins) -> None:
    """The state after ins: what it does to an integer register, where that keeps the
    value affine; None for any other change."""
    op, args = ins.op, ins.args
    if op == "SWAP" and args[0].cls == isa.INT:
        state[args[0]], state[args[1]] = _operand(state, args[1]), _operand(state, args[0])
        return
    d = args[0] if args else None
    now = _operand(state, d) if isinstance(d, Reg) else None
    new = None
    if now is not None and op in ("ADD", "SUB"):
        s = _operand(state, args[1])
        if s is not None:
            new = now + s if op == "ADD" else now - s
    elif now is not None and op in ("ADD.mul", "SUB.mul"):
        a, b = _operand(state, args[1]), _operand(state, args[2])
        product = a.times(b) if a is not None and b is not None else None
        if product is not None:
            new = now + product if op == "ADD.mul" else now - product
    elif now is not None and op in ("INC", "DEC"):
        new = now + Affine(1 if op == "INC" else -1)
    elif now is not None and op == "NEG":
        new = now.scaled(-1)
    for r in changes(ins):
        state[r] = None
    if new is not None:
        state[d] = new


def passes(body: list, counter: Reg, step: int) -> dict | None:
    """{instruction index: {int register: its Affine value there, or None}} over one pass
    of a counted loop's body ([(index, instruction)], comefroms excluded), the counter
    stepping by `step`; registers not in a state have their entry value."""
    written = set().union(*(changes(ins) for _, ins in body))
    start: dict = {r: Affine(terms={str(r): 1}) for r in written}
    start[counter] = Affine(terms={str(counter): 1}, p=step)
    for _ in range(4):
        state, at = dict(start), {}
        for i, ins in body:
            at[i] = dict(state)
            _step(state, ins)
        changed = False
        for r in written:
            begin, end = start[r], state.get(r, start[r])
            if begin is None:
                continue
            delta = end - begin if end is not None else None
            if delta is None or not delta.fixed or delta.terms:
                new = None
            else:           # moves by a constant each pass: an induction
                new = Affine(begin.c, begin.terms, delta.c)
            if new != begin:
                start[r], changed = new, True
        if not changed:
            return at
    return None
