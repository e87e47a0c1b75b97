"""Bennett's time-space trade-off for reverse computing, as a function of the step.

`bennett(step, out, x, k, n)` adds F^N(x) to `out`, where F is one step and N = k^n, the
way Bennett (1989) and Levine & Sherman (1990) schedule it: the N steps are split into k
sectors, each run forwards, and every state between the sectors is uncomputed by running
its sector backwards, recursively, until a sector is one step. Only `x` and `out` survive;
at most n(k - 1) + 2 states are live at once and the step runs (2k - 1)^n times, forwards
or backwards. `pebble_counts` measures both by stepping the machine.
"""

from __future__ import annotations

from ..lang import ancilla, reversible, zeros


@reversible
def bennett(step, out, x, k: int, n: int):
    """out += F^(k^n)(x), F one step: `step(y, s)` adds F(s) to a zero state y (1-D float
    arrays of one length). k >= 2 sectors per level, n >= 0 levels."""
    assert k >= 2
    assert n >= 0
    assert len(out) == len(x)
    sectors(step, out, x, k, n)


@reversible
def sectors(step, out, x, k: int, level: int):
    """out += F^(k^level)(x): k sectors of k^(level - 1) steps each."""
    if level == 0:
        step(out, x)
    else:
        with ancilla(j=k):          # (k is passed by reference: a copy)
            chain(step, out, x, k, j, level - 1)


@reversible
def chain(step, out, x, k: int, j: int, level: int):
    """out += (F^(k^level))^j (x): the first sector into a fresh state t, the other
    j - 1 from t into out, then the first sector uncomputed, so t is zero again. Nested,
    this runs the sectors 1..j forwards and j - 1..1 backwards: Bennett's P and Q."""
    if j == 1:
        sectors(step, out, x, k, level)
    else:
        with ancilla(t=zeros(len(x))):
            sectors(step, t, x, k, level)
            chain(step, out, t, k, j - 1, level)
            ~sectors(step, t, x, k, level)


def _callees(program, name: str) -> list[str]:
    """The functions `name` calls or uncalls, in the order of their first call site."""
    out: list[str] = []
    for ins in program.functions[name].code:
        if ins.op in ("CALL", "UNCALL") and ins.args[0].name not in out:
            out.append(ins.args[0].name)
    return out


def pebble_counts(step, out, x, k: int, n: int) -> tuple[int, int]:
    """(steps, peak): how often `bennett(step, out, x, k, n)` runs the step, forwards or
    backwards, and the largest number of states live at once (x, out and the temporary
    states on the heap), measured by stepping the machine through the call. Bennett's
    pebble game gives (2k - 1)^n and n(k - 1) + 2."""
    from ..engines.machine import Machine

    program, entry, names = bennett.specialize((step, out, x, k, n))
    (top,) = _callees(program, entry)                 # sectors
    chain_name, = [f for f in _callees(program, top) if top in _callees(program, f)]
    step_name, = [f for f in _callees(program, top) if f != chain_name]
    ours = {entry, top, chain_name}
    m = Machine(program)
    m.enter(entry, *[a for a in (out, x, k, n)], names=names)
    width = len(x)
    steps, peak, depth = 0, 2, 1
    while m.step():
        stack = m.stack
        if len(stack) > depth and stack[-1].fn.name == step_name and \
                stack[-2].fn.name == top:
            steps += 1
        depth = len(stack)
        if stack[-1].fn.name in ours:
            peak = max(peak, 2 + (m.top - m.entry_top) // max(width, 1))
    m.finish()
    return steps, peak
