"""Pictures of programs: the structure of the SVG (wires, gates, paired edges), the same
bytes every time, a PNG render that is not blank, and the pictures in the docs current."""

import itertools
import pathlib
import re
import subprocess
import sys
import traceback

import pytest

import rvm

ROOT = pathlib.Path(__file__).resolve().parent.parent
PICTURES = [("fib.svg", ["asm/fib.rasm"]), ("fib-cfg.svg", ["asm/fib.rasm", "--view", "cfg"]),
            ("besselj.svg", ["examples/besselj.py", "--entry", "besselj"])]


def count(svg: str, cls: str) -> int:
    return len(re.findall(f'class="{cls}"', svg))


def test_circuit_has_a_wire_per_register_and_a_gate_per_instruction():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    svg = rvm.draw(p["fib"]).svg
    fn = p.functions["fib"]
    assert count(svg, "wire") == len(fn.registers)                 # r0..r3, no heap
    control = sum(ins.spec.group == "control" for ins in fn.code)
    assert count(svg, "control") == control == 4
    assert count(svg, "gate") == 4 and count(svg, "cross") == 4   # ADD ADD INC SUB; SWAP
    assert ">r3<" in svg and "+= r2" in svg
    arrays = rvm.load(ROOT / "asm" / "arrays.rasm")
    assert ">heap<" in rvm.draw(arrays["dot"]).svg              # memory gets a heap wire


def test_source_names_calls_and_the_inverse_mirror():
    sys.path.insert(0, str(ROOT / "examples"))
    from besselj import besselj
    svg = rvm.draw(besselj, 0.0, 2, 1.0).svg
    assert ">term<" in svg and ">halfz_2<" in svg and "imul" in svg
    assert count(svg, "call") >= 1 and count(svg, "uncall") >= 1 and "imul⁻¹" in svg
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    forward = re.findall(r'class="gate-label"[^>]*>([^<]*)<', rvm.draw(p["fib"]).svg)
    backward = re.findall(r'class="gate-label"[^>]*>([^<]*)<',
                          rvm.draw(p["fib"], inverse=True).svg)
    flip = {"+=": "-=", "-=": "+=", "+1": "-1", "-1": "+1"}
    assert backward == [flip.get(t[:2], t) + t[2:] if t[:2] in flip else flip.get(t, t)
                        for t in reversed(forward)]
    expanded = rvm.draw(besselj, 0.0, 2, 1.0, depth=1).svg
    assert count(expanded, "call") == 0 and count(expanded, "gate") > count(svg, "gate")


def test_cfg_pairs_every_branch_with_its_comefrom():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    svg = rvm.draw(p["fib"], view="cfg").svg
    fn = p.functions["fib"]
    branches = sum(ins.op in rvm.isa.BRANCHES for ins in fn.code)
    assert count(svg, "pair") == count(svg, "pair-end") == branches == 2
    assert "if r3 == r0" in svg and "comefrom: iff r3 != 0" in svg
    assert "comefrom: only by this jump" in svg and count(svg, "block") == 4


def test_pictures_are_deterministic():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    for view in ("circuit", "cfg"):
        assert rvm.draw(p["fib"], view=view).svg == rvm.draw(p["fib"], view=view).svg
        first = rvm.draw(rvm.load(ROOT / "asm" / "fib.rasm")["fib"], view=view).svg
        second = rvm.draw(rvm.load(ROOT / "asm" / "fib.rasm")["fib"], view=view).svg
        assert first == second


@pytest.mark.parametrize("name,args", PICTURES, ids=[n for n, _ in PICTURES])
def test_the_pictures_in_the_docs_are_current(tmp_path, name, args):
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "draw", *args, "-o", str(out)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert out.read_text() == (ROOT / "docs" / "pictures" / name).read_text(), \
        f"regenerate: rvm draw {' '.join(args)} -o docs/pictures/{name}"


def test_a_png_render_is_not_blank(tmp_path):
    try:
        import cairosvg  # noqa: F401
    except (ImportError, OSError):         # the package, or the cairo library, is missing
        pytest.skip("cairosvg (and the cairo library) are needed for PNG output")
    import numpy as np
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    out = tmp_path / "fib.png"
    rvm.draw(p["fib"]).save(out)
    from PIL import Image
    pixels = np.asarray(Image.open(out).convert("L"))
    assert pixels.shape[0] > 50 and pixels.shape[1] > 200
    assert (pixels < 128).mean() > 0.005 and (pixels > 200).mean() > 0.5   # ink on paper


def test_draw_errors():
    p = rvm.load(ROOT / "asm" / "fib.rasm")
    with pytest.raises(rvm.UsageError, match="unknown view"):
        rvm.draw(p["fib"], view="tree")
    with pytest.raises(rvm.UsageError, match=r"\.svg, \.png or \.pdf"):
        rvm.draw(p["fib"]).save("x.gif")


def test_compute_and_uncompute_blocks_are_shaded_pairs():
    sys.path.insert(0, str(ROOT / "examples"))
    from iexp import iexp
    svg = rvm.draw(iexp, 0.0, 1.5).svg
    assert count(svg, "compute") > 0 and count(svg, "compute") == count(svg, "uncompute")
    shade = r'class="{}"[^>]*fill="(#[0-9a-f]+)"'
    computed = set(re.findall(shade.format("compute"), svg))
    assert computed and computed == set(re.findall(shade.format("uncompute"), svg))
    back = rvm.draw(iexp, 0.0, 1.5, inverse=True).svg     # the mirror keeps the pairs
    assert count(back, "compute") == count(svg, "uncompute")


def test_long_straight_runs_collapse_on_request():
    sys.path.insert(0, str(ROOT / "examples"))
    from besselj import besselj
    full = rvm.draw(besselj, 0.0, 2, 1.0).svg
    short = rvm.draw(besselj, 0.0, 2, 1.0, collapse=4).svg
    assert count(full, "collapsed") == 0 and count(short, "collapsed") >= 2
    assert count(short, "gate") < count(full, "gate")
    assert count(short, "control") == count(full, "control")     # control flow stays
    boxes = [int(n) for n in re.findall(r'class="collapsed-label"[^>]*>(\d+) ins<', short)]
    assert all(n > 4 for n in boxes)


# ------------------------------------------------------------------ legibility
# Every picture of every example (its functions, their inverses and adjoints, both views)
# is checked for overlaps, with the text extents the renderer assumes (0.62 em per
# character, 0.8 em above the baseline and 0.2 em below): no two labels intersect, no label
# crosses a wire, an edge or a box border (unless an opaque box drawn over that line holds
# the label: a gate's label hides the wire under its gate), and every label is on the page.

SVG = "{http://www.w3.org/2000/svg}"


def _bezier(p, steps=32):
    out = []
    for k in range(steps + 1):
        t = k / steps
        w = ((1 - t) ** 3, 3 * (1 - t) ** 2 * t, 3 * (1 - t) * t * t, t ** 3)
        out.append((sum(c * q[0] for c, q in zip(w, p)), sum(c * q[1] for c, q in zip(w, p))))
    return out


def _shapes(svg: str):
    """(texts, segments, rects, width, height) of a picture: texts as (box, text, order),
    segments of lines, paths and box borders as ((x1, y1, x2, y2), order), opaque rects
    as (box, order)."""
    from xml.etree import ElementTree
    root = ElementTree.fromstring(svg)
    texts, segments, opaque = [], [], []
    for order, el in enumerate(root.iter()):
        tag, get = el.tag.replace(SVG, ""), el.get
        if tag == "text":
            x, y, size = float(get("x")), float(get("y")), float(get("font-size"))
            w = len(el.text or "") * size * 0.62
            x0 = {"start": x, "middle": x - w / 2, "end": x - w}[get("text-anchor")]
            texts.append(((x0, y - 0.8 * size, x0 + w, y + 0.2 * size), el.text, order))
        elif tag == "line":
            segments.append((tuple(float(get(k)) for k in ("x1", "y1", "x2", "y2")), order))
        elif tag == "path":
            d = get("d")
            v = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", d)]
            points = list(zip(v[0::2], v[1::2]))
            if " C " in d:
                points = _bezier(points[:4])
            segments += [((*a, *b), order) for a, b in itertools.pairwise(points)]
        elif tag == "rect" and get("x") is not None:
            x, y, w, h = (float(get(k)) for k in ("x", "y", "width", "height"))
            if get("fill") != "none":
                opaque.append(((x, y, x + w, y + h), order))
            if get("stroke") not in (None, "none", get("fill")):    # shading has no border
                corners = [(x, y), (x + w, y), (x + w, y + h), (x, y + h), (x, y)]
                segments += [((*a, *b), order) for a, b in itertools.pairwise(corners)]
    return texts, segments, opaque, float(root.get("width")), float(root.get("height"))


def _clip(seg, box):
    """The part of a segment inside a box, or None (Liang-Barsky)."""
    (x1, y1, x2, y2), (bx0, by0, bx1, by1) = seg, box
    t0, t1, dx, dy = 0.0, 1.0, x2 - x1, y2 - y1
    for p, q in ((-dx, x1 - bx0), (dx, bx1 - x1), (-dy, y1 - by0), (dy, by1 - y1)):
        if p == 0:
            if q < 0:
                return None
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
        if t0 > t1:
            return None
    return (x1 + t0 * dx, y1 + t0 * dy, x1 + t1 * dx, y1 + t1 * dy)


def _inside(point, box, slack=0.6):
    return box[0] - slack <= point[0] <= box[2] + slack and \
        box[1] - slack <= point[1] <= box[3] + slack


class _Grid:
    """Boxes by the 64-pixel cells they touch, to look up what is near a label quickly."""

    def __init__(self, items, box):
        self.cells: dict = {}
        for item in items:
            for cell in self._cells(box(item)):
                self.cells.setdefault(cell, []).append(item)

    @staticmethod
    def _cells(b):
        return [(i, j) for i in range(int(b[0] // 64), int(b[2] // 64) + 1)
                for j in range(int(b[1] // 64), int(b[3] // 64) + 1)]

    def near(self, b) -> list:
        seen = {}
        for cell in self._cells(b):
            for item in self.cells.get(cell, ()):
                seen[id(item)] = item
        return list(seen.values())


def _bounds(seg):
    return (min(seg[0], seg[2]), min(seg[1], seg[3]), max(seg[0], seg[2]), max(seg[1], seg[3]))


def overlaps(svg: str) -> list[str]:
    """What a reader would see drawn over a label, one line each (empty: legible)."""
    texts, segments, opaque, width, height = _shapes(svg)
    found = []
    shrink = [((b[0] + 0.5, b[1] + 0.5, b[2] - 0.5, b[3] - 0.5), s, o) for b, s, o in texts]
    labels = _Grid(shrink, lambda t: t[0])
    lines = _Grid(segments, lambda t: _bounds(t[0]))
    boxes = _Grid(opaque, lambda t: t[0])
    for a, s, order in shrink:
        if a[0] < 0 or a[1] < 0 or a[2] > width or a[3] > height:
            found.append(f"{s!r} is off the page")
        for b, t, other in labels.near(a):
            if other > order and a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]:
                found.append(f"{s!r} overlaps {t!r}")
        for seg, at in lines.near(a):
            part = _clip(seg, a)
            if part is None:
                continue
            if not any(o > at and _inside(part[:2], r) and _inside(part[2:], r)
                       for r, o in boxes.near(a)):
                found.append(f"{s!r} is crossed by a line {seg}")
                break
    return found


def _every_program():
    """(title, program, function name) for every example: the functions of examples/*.py,
    asm/*.rasm and the Janus examples, and the adjoint of each that has one."""
    from rvm.ad import transforms
    files = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "asm").glob("*.rasm")) \
        + sorted((ROOT / "examples" / "janus").glob("*.ja"))
    for path in files:
        if path.suffix == ".py" and "@rvm.reversible" not in path.read_text():
            continue                        # (an example of rvm inside JAX, say)
        program = rvm.load(path)
        for name in list(program.functions):
            yield f"{path.name}:{name}", program, name
            try:
                derived, entry = transforms.adjoint(program, name)
            except rvm.RvmError:            # nothing to differentiate
                continue
            yield f"{path.name}:{entry}", derived, entry


def test_no_label_overlaps_another_label_or_a_wire():
    from rvm.drawing import draw
    bad = []
    for title, program, name in _every_program():
        for view, inverse in (("circuit", False), ("circuit", True), ("cfg", False)):
            found = overlaps(draw(program, name, view, inverse=inverse).svg)
            bad += [f"{title} {view}{' inverse' if inverse else ''}: {f}" for f in found]
    assert not bad, f"{len(bad)} overlaps:\n" + "\n".join(bad[:40])


def test_the_legibility_check_sees_what_a_reader_would():
    from rvm.drawing.svg import Canvas
    c = Canvas()
    c.line(0, 50, 300, 50, cls="wire")
    c.rect(100, 41, 60, 18, cls="gate")                # the wire hides under a gate box
    c.text(130, 54, "+= x", size=9)
    assert overlaps(c.render()) == []
    c.text(20, 54, "a label on a wire", size=9, anchor="start")
    c.text(230, 30, "one", size=9)
    c.text(236, 32, "two", size=9)
    found = overlaps(c.render())
    assert len(found) == 2 and "crossed by a line" in found[0] and "overlaps" in found[1]


def test_calls_expanded_and_collapsed_runs_are_legible_too():
    sys.path.insert(0, str(ROOT / "examples"))
    from besselj import besselj
    from fib import rrfib
    for fn, args in ((besselj, (0.0, 2, 1.0)), (rrfib, (0, 5))):
        for options in (dict(depth=1), dict(depth=2, inverse=True), dict(collapse=4)):
            assert overlaps(rvm.draw(fn, *args, **options).svg) == [], (fn, options)


@rvm.reversible
def _unannotated(x, y: float, z):
    x += y * z


def test_a_derived_function_draws_without_arguments():
    sys.path.insert(0, str(ROOT / "examples"))
    from besselj import besselj
    # besselj(out: float, nu: int, z: float): stand-ins of these kinds, the same picture
    for view in ("circuit", "cfg"):
        assert rvm.draw(rvm.adjoint(besselj), view=view).svg == \
            rvm.draw(rvm.adjoint(besselj), 0.0, 2, 1.0, 0.0, 0.0, view=view).svg
    assert rvm.draw(rvm.tangent(besselj)).svg == \
        rvm.draw(rvm.tangent(besselj), 0.0, 2, 1.0, 0.0, 0.0).svg
    assert rvm.draw(~besselj).svg == rvm.draw(~besselj, 0.0, 2, 1.0).svg   # the inverse
    twice = rvm.tangent(rvm.adjoint(besselj))
    assert rvm.draw(twice).svg == \
        rvm.draw(twice, 0.0, 2, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0).svg
    from gmm import gmm_prior
    # of arrays: drawn with stand-in arrays of their ranks (with arrays, failed before)
    assert count(rvm.draw(rvm.adjoint(gmm_prior)).svg, "gate") > 0
    handle = rvm.load(ROOT / "asm" / "poly.rasm")["f"]
    assert rvm.draw(rvm.adjoint(handle)).svg == \
        rvm.draw(rvm.adjoint(handle), 0.0, 1.0, 3.0, 0.0, 0.0, 0.0).svg
    with pytest.raises(rvm.UsageError) as e:
        rvm.draw(rvm.adjoint(_unannotated))
    assert "\n" not in str(e.value) and "x, z" in str(e.value) and "annotate" in str(e.value)
    frames = [f.filename for f in traceback.extract_tb(e.tb)]
    assert not any("/rvm/ad/" in f or "/rvm/lang/" in f for f in frames)   # the user's frame


def test_draw_help_mentions_no_arguments_it_does_not_take():
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "draw", "--help"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "--adjoint" in r.stdout and "--args" not in r.stdout
