"""Pictures of programs: the structure of the SVG (wires, gates, paired edges), the same
bytes every time, a PNG render that is not blank, and the pictures in the docs current."""

import pathlib
import re
import subprocess
import sys

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
