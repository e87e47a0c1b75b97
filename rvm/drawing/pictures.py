"""A function as a reversible circuit, and as a control-flow graph.

Circuit: one horizontal wire per register (named by its source variable where the program
has debug symbols), a heap wire when the function touches memory, and one gate per
instruction in order: the changed wire gets a box with the operation (`+= a*b`, `sin`,
`*= y`), the wires it reads get dots, SWAP and EXCH are crosses joined by a line, ROT a
box over both wires, calls boxes over their argument wires (uncalls dashed, the callee
with a ⁻¹), branches and comefroms thin markers across the wires. `depth` expands calls
into their callees' gates; `inverse` draws the inverse program (the mirror image). Long
functions wrap into rows.

Control-flow graph: basic blocks as boxes of instructions, fall-through edges straight
down, and each branch and the comefrom it is paired with as one curved edge in a lane of
its own, the branch's forward condition in the margin of its line and the comefrom's
assertion in the margin of its own.

No label is drawn over another or over a line: widths come from `text_width`, the
renderer's estimate of a label's extent (tests/test_drawing.py checks every example).
"""

from __future__ import annotations

import attrs

from ..core import isa
from ..core.errors import UsageError
from ..core.inverse import inverse_function
from ..core.program import FuncRef, Function, Mem, Program, Reg
from ..engines.explain import with_names
from .svg import Canvas

COLUMN, WIRE, LEFT, PER_ROW = 46.0, 26.0, 90.0, 28
OPS = {"mul": "*", "div": "/", "mod": "%", "pow": "**"}


@attrs.frozen
class Picture:
    """An SVG picture; shown inline by Jupyter, written by save()."""

    svg: str
    title: str = ""

    def _repr_svg_(self) -> str:
        return self.svg

    def save(self, path: str) -> None:
        """Write .svg (or .png / .pdf with the optional cairosvg package)."""
        path = str(path)
        if path.endswith(".svg"):
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.svg)
            return
        if not path.endswith((".png", ".pdf")):
            raise UsageError(f"{path}: write .svg, .png or .pdf")
        try:
            import cairosvg
        except ImportError:
            raise UsageError("PNG and PDF output need cairosvg (pip install cairosvg); "
                             "SVG output needs nothing") from None
        convert = cairosvg.svg2png if path.endswith(".png") else cairosvg.svg2pdf
        convert(bytestring=self.svg.encode(), write_to=path)


def draw(program: Program, name: str, view: str = "circuit", depth: int = 0,
         inverse: bool = False, collapse: int = 0) -> Picture:
    """The picture of function `name` of a program."""
    if name not in program.functions:
        raise UsageError(f"no function {name!r} (the program has "
                         f"{', '.join(program.functions)})")
    fn = program.functions[name]
    if inverse:
        fn = inverse_function(fn)
    if view == "circuit":
        return Picture(circuit(program, fn, depth, collapse), f"{name} (circuit)")
    if view == "cfg":
        return Picture(cfg(fn), f"{name} (control flow)")
    raise UsageError(f"unknown view {view!r}: circuit or cfg")


# ------------------------------------------------------------------ circuit


def _flatten(program: Program, fn: Function, depth: int, rename: dict, prefix: str):
    """(instruction, register map) for every instruction, calls expanded `depth` deep."""
    out = []
    for ins in fn.code:
        if ins.op in isa.CALLS and depth > 0:
            callee = program.functions[ins.args[0].name]
            body = callee if ins.op == "CALL" else inverse_function(callee)
            inner = {p: rename.get(a, a) for p, a in zip(callee.params, ins.args[1:])}
            for r in callee.locals:
                inner[r] = (f"{prefix}{callee.name}.", r)
            out += _flatten(program, body, depth - 1, inner, f"{prefix}{callee.name}.")
        else:
            out.append((ins, rename))
    return out


def _label(fn: Function, reg: Reg) -> str:
    names = [s.name for s in fn.symbols if s.regs and s.regs[0] == reg and len(s.regs) == 1]
    return names[0] if names else str(reg)


def _gate_text(ins, name) -> str:
    op, a = ins.op, ins.args
    head, _, fam = op.partition(".")
    if op in isa.READS:                      # a heap cell read in place
        return f"{'+=' if op == 'ADDM' else '-='} {a[1]}"
    if head in ("ADD", "SUB") and ins.spec.group in ("arith", "family"):
        sign = "+=" if head == "ADD" else "-="
        if not fam:
            return f"{sign} {name(a[1])}"
        if fam in OPS:
            return f"{sign} {name(a[1])}{OPS[fam]}{name(a[2])}"
        return f"{sign} {fam}"
    return {"XOR": f"^= {name(a[1])}" if a[1:] else "^=", "NEG": "neg", "INC": "+1",
            "DEC": "-1", "MUL": f"*= {name(a[1])}" if a[1:] else "*=",
            "DIV": f"/= {name(a[1])}" if a[1:] else "/=", "ZERO": "=0",
            "ALLOC": "alloc", "FREE": "free", "PUSH": "push", "POP": "pop"}.get(
        head, op.lower())


class Collapsed:
    """A run of straight-line instructions drawn as one box (collapse=N)."""

    def __init__(self, count: int):
        self.count = count


def _collapse(steps: list, longest: int) -> list:
    """Runs of more than `longest` instructions without control flow or calls, as one
    step each (0: nothing collapsed)."""
    if longest <= 0:
        return steps
    out, run = [], []

    def flush():
        out.extend(run if len(run) <= longest else [(Collapsed(len(run)), {})])
        run.clear()
    for step in steps:
        if step[0].spec.group in ("control", "call"):
            flush()
            out.append(step)
        else:
            run.append(step)
    flush()
    return out


def circuit(program: Program, fn: Function, depth: int = 0, collapse: int = 0) -> str:
    steps = _flatten(program, fn, depth, {}, "")
    wires: dict = {}

    def wire(reg, rename):
        key = rename.get(reg, reg)
        if key not in wires:
            wires[key] = len(wires)
        return wires[key]
    for p in fn.params:
        wire(p, {})
    for r in fn.registers:
        wire(r, {})
    for ins, rename in steps:                     # the callees' locals, when expanded
        for a in ins.args:
            for r in (a,) if isinstance(a, Reg) else a.regs if isinstance(a, Mem) else ():
                wire(r, rename)
    shades = _shades(fn, depth or collapse, len(steps))
    steps = _collapse(steps, collapse)
    memory = any(not isinstance(ins, Collapsed) and ins.spec.group == "memory"
                 for ins, _ in steps)
    labels = {}
    for key in wires:
        labels[key] = _label(fn, key) if isinstance(key, Reg) else f"{key[0]}{key[1]}"
    heap_row = len(wires) if memory else None
    nwires = len(wires) + (1 if memory else 0)
    left = max([LEFT] + [text_width(s, 11) + 16 for s in labels.values()])
    widths = [_column_width(ins, rename, labels) for ins, rename in steps]
    rows, start = [], 0                        # wrap at PER_ROW columns or their width
    for k in range(1, len(steps) + 1):
        if k == len(steps) or k - start == PER_ROW or \
                sum(widths[start:k + 1]) > PER_ROW * COLUMN:
            rows.append(range(start, k))
            start = k
    rows = rows or [range(0)]
    c = Canvas()
    row_height = nwires * WIRE + 40
    for r, chunk in enumerate(rows):
        top = 20 + r * row_height
        xs = {}                                   # each column's left edge
        x = left
        for k in chunk:
            xs[k] = x
            x += widths[k]
        for k in chunk:                           # compute/uncompute blocks, shaded pairs
            shade = shades.get(k)
            if shade is not None:
                c.rect(xs[k], top + 8, widths[k], nwires * WIRE + 4, fill=shade[0],
                       stroke=shade[0], cls=shade[1], rx=0)
        y = {k: top + 20 + i * WIRE for k, i in wires.items()}
        if memory:
            y["heap"] = top + 20 + heap_row * WIRE
        right = x + 10
        for key, yy in y.items():
            heap = key == "heap"
            c.line(left - 6, yy, right, yy, stroke="#8a6" if heap else "#999",
                   width=3 if heap else 1, cls="wire")
            c.text(left - 10, yy + 4, "heap" if heap else labels[key], anchor="end",
                   cls="wire-label")
        for k in chunk:
            ins, rename = steps[k]
            _gate(c, ins, rename, xs[k] + widths[k] / 2, y, top, nwires, labels, fn,
                  widths[k])
    return c.render()


def text_width(s: str, size: float) -> float:
    """How wide the renderer takes a label to be (a monospace font: 0.62 em a character),
    the estimate every layout decision here (and the legibility test) uses."""
    return len(s) * size * 0.62


def _column_width(ins, rename, labels) -> float:
    """A column wide enough for its gate's label, with a gap to the next column's."""
    if isinstance(ins, Collapsed):
        text, size = f"{ins.count} ins", 9
    elif ins.spec.group == "control":
        text, size = f"{ins.op} {ins.args[-1]}", 8
    elif ins.spec.group == "call":
        text, size = _callee(ins), 9
    elif ins.op in ("ROT", "IROT", "SWAP", "EXCH"):
        text, size = ins.op.lower(), 9
    else:
        text, size = _gate_text(ins, lambda a: labels.get(rename.get(a, a), str(a))
                                if isinstance(a, Reg) else str(a)), 9
    return max(COLUMN, text_width(text, size) + 14)


def _callee(ins) -> str:
    callee = ins.args[0].name if isinstance(ins.args[0], FuncRef) else "?"
    return callee + ("⁻¹" if ins.op == "UNCALL" else "")


SHADES = ["#e8f4e8", "#e8eef8", "#f8f0e0", "#f4e8f4"]


def _shades(fn: Function, depth: int, n: int) -> dict:
    """Column -> (colour, class) inside compute blocks and their uncomputes (matching
    colours for a pair). Columns only match instructions when calls are not expanded."""
    if depth:
        return {}
    colours, out = {}, {}
    for name, kind, start, end in sorted(fn.regions, key=lambda r: r[2] - r[3]):
        # widest first, so a block nested in another keeps its own colour
        colour = colours.setdefault(name, SHADES[len(colours) % len(SHADES)])
        for i in range(start, min(end, n)):
            out[i] = (colour, kind)
    return out


def _gate(c: Canvas, ins, rename, x, y, top, nwires, labels, fn, column=COLUMN) -> None:
    box = column - 6                          # a gate's box: the column, less a gap
    if isinstance(ins, Collapsed):
        c.rect(x - box / 2, top + 12, box, (nwires - 1) * WIRE + 16, fill="#f4f4f4",
               cls="collapsed")
        c.text(x, top + 20 + (nwires - 1) * WIRE / 2, f"{ins.count} ins", size=9,
               cls="collapsed-label")
        return
    spec = ins.spec

    def at(reg):
        return y[rename.get(reg, reg)]

    def name(a):
        if isinstance(a, Reg):
            return labels.get(rename.get(a, a), str(a))
        return str(a)
    if spec.group == "control":
        c.line(x, top + 8, x, top + 20 + (nwires - 1) * WIRE + 6, stroke="#c55", dash="3,3",
               cls="control")
        c.text(x, top + 6, f"{ins.op} {ins.args[-1]}", size=8, cls="control-label")
        return
    if spec.group == "call":
        regs = [a for a in ins.args[1:] if isinstance(a, Reg)]
        ys = [at(r) for r in regs] or [top + 20]
        dashed = ins.op == "UNCALL"
        c.rect(x - box / 2, min(ys) - 10, box, max(ys) - min(ys) + 20,
               fill="#eef" if not dashed else "#fee", cls="call" if not dashed else "uncall")
        c.text(x, (min(ys) + max(ys)) / 2 + 4, _callee(ins), size=9, cls="call-label")
        return
    written = ins.written
    read = [a for a, k in zip(ins.args, spec.kinds) if k in "SVC" and isinstance(a, Reg)]
    mems = [a for a in ins.args if isinstance(a, Mem)]
    for m in mems:
        read += list(m.regs)
    if ins.op in ("SWAP", "EXCH"):
        ys = [at(written[0]), at(written[1]) if ins.op == "SWAP" else y["heap"]]
        c.line(x, min(ys), x, max(ys), cls="swap")
        for yy in ys:
            c.line(x - 5, yy - 5, x + 5, yy + 5, width=1.6, cls="cross")
            c.line(x - 5, yy + 5, x + 5, yy - 5, width=1.6, cls="cross")
        for reg in read:
            c.circle(x, at(reg), 3, cls="control-dot")
        return
    if ins.op in ("ROT", "IROT"):
        ys = [at(written[0]), at(written[1])]
        c.rect(x - box / 2, min(ys) - 9, box, max(ys) - min(ys) + 18, fill="#ffe", cls="gate")
        c.text(x, (ys[0] + ys[1]) / 2 + 4, ins.op.lower(), size=9, cls="gate-label")
        for reg in read:
            c.circle(x, at(reg), 3, cls="control-dot")
        return
    targets = [at(w) for w in written] or ([y["heap"]] if "heap" in y else [top + 20])
    reads_heap = ins.op in isa.READS and "heap" in y
    if spec.group == "memory" and "heap" in y and not reads_heap:
        targets.append(y["heap"])
    ys = targets + [at(r) for r in read] + ([y["heap"]] if reads_heap else [])
    if reads_heap:                           # the heap is read, not changed: a dot
        c.circle(x, y["heap"], 3, cls="control-dot")
    if len(ys) > 1:
        c.line(x, min(ys), x, max(ys), cls="link")
    for reg in read:
        c.circle(x, at(reg), 3, cls="control-dot")
    text = _gate_text(ins, name)
    width = max(30.0, min(box, text_width(text, 9) + 8))
    for yy in targets:
        c.rect(x - width / 2, yy - 9, width, 18, cls="gate")
        c.text(x, yy + 4, text, size=9, cls="gate-label")


# ------------------------------------------------------------------ control-flow graph


def _condition(ins) -> str:
    cc = isa.condition(ins.op)
    if cc is None:
        return ""
    a, b = ins.args[0], ins.args[1]
    return f"{a} {isa.CONDITIONS[cc]} {b}"


def _named(fn: Function, text: str, line: int) -> str:
    """Assembly text with source and `.alias` names for the registers that have one."""
    return with_names(fn, text, line)


def cfg(fn: Function) -> str:
    """Basic blocks in one column, each instruction a line; a branch's forward condition
    and its comefrom's assertion in a margin column on their own lines (so no label meets
    another or an edge), and each pair's edge out to its own lane on the right."""
    code = fn.code
    n = len(code)
    leaders = sorted({0} | {i for i, ins in enumerate(code) if ins.op in isa.COMEFROMS}
                     | {i + 1 for i, ins in enumerate(code) if ins.op in isa.BRANCHES})
    leaders = [b for b in leaders if b < n] or [0]
    pairs, notes = [], {}                  # (branch, target); instruction -> margin notes
    for i, ins in enumerate(code):
        if ins.op in isa.BRANCHES:
            j = fn.labels[ins.args[-1].name]
            pairs.append((i, j))
            assertion = _named(fn, _condition(code[j]), code[j].line)
            condition = _named(fn, _condition(ins), ins.line)
            notes.setdefault(i, []).append((f"if {condition or 'always'}",
                                            "pair-branch"))
            notes.setdefault(j, []).append((f"comefrom: iff {assertion}" if assertion
                                            else "comefrom: only by this jump",
                                            "pair-comefrom"))
    lines = []
    for i in range(n):
        labels = " ".join(f"{lab}:" for lab in fn.labels_at(i))
        lines.append(f"{i:>3} {labels} {_named(fn, str(code[i]), code[i].line)}".strip())
    c = Canvas()
    x0, line_h, size, note_size = 20.0, 14.0, 10.0, 9.0
    text_w = max([text_width(t, size) for t in lines] or [0.0])
    note_w = max([text_width("; ".join(t for t, _ in v), note_size)
                  for v in notes.values()] or [0.0])
    margin = x0 + 6 + text_w + 14             # where the notes start
    width = max(300.0, margin - x0 + (note_w + 8 if notes else 0.0))
    boxes, yy = {}, 20.0
    for k, start in enumerate(leaders):
        end = leaders[k + 1] if k + 1 < len(leaders) else n
        h = (end - start) * line_h + 10
        boxes[k] = (start, end, yy, h)
        c.rect(x0, yy, width, h, fill="#f7f7ff", cls="block")
        for j, i in enumerate(range(start, end)):
            base = yy + 14 + j * line_h
            c.text(x0 + 6, base, lines[i], size=size, anchor="start", cls="instruction")
            if i in notes:                     # (one note a line but for odd programs)
                c.text(margin, base, "; ".join(t for t, _ in notes[i]), size=note_size,
                       anchor="start", fill="#a33", cls=notes[i][0][1])
        yy += h + 24

    def line_y(i):
        k = max(k for k, (s, _, _, _) in boxes.items() if s <= i)
        return boxes[k][2] + 10 + (i - boxes[k][0]) * line_h
    for k, (_, end, top, h) in boxes.items():          # fall-through edges
        if k + 1 in boxes and code[end - 1].op != "JMP":
            c.line(x0 + width / 2, top + h, x0 + width / 2, boxes[k + 1][2], cls="fall")
    lanes: list[list] = []                 # the spans each lane holds
    lane_of = {}
    for i, j in sorted(pairs, key=lambda p: (abs(p[0] - p[1]), p)):   # inner pairs nearer
        lo, hi = sorted((line_y(i), line_y(j)))
        free = next((k for k, spans in enumerate(lanes)
                     if all(hi + 6 < a or b + 6 < lo for a, b in spans)), len(lanes))
        if free == len(lanes):
            lanes.append([])
        lanes[free].append((lo, hi))
        lane_of[i, j] = free
    right = x0 + width
    for i, j in pairs:                                 # one edge per branch/comefrom pair
        s_y, t_y = line_y(i), line_y(j)
        reach = right + 30 + 26 * lane_of[i, j]
        c.path(f"M {right} {s_y:.1f} C {reach} {s_y:.1f} {reach} {t_y:.1f} "
               f"{right} {t_y:.1f}", stroke="#c55", cls="pair")
        c.circle(right + 2, t_y, 3, fill="#c55", cls="pair-end")
        c.grow(right + 30 + 26 * lane_of[i, j], max(s_y, t_y))
    return c.render()
