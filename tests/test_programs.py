"""Runs every program in asm/ on the cases in its `; expect:` comments, forwards, then
backwards from the results, which must give the inputs back."""

import math
import pathlib
import re

import numpy as np
import pytest

import rvm

ASM = pathlib.Path(__file__).resolve().parent.parent / "asm"
EXPECT = re.compile(r";\s*(expect|grad):\s*(\w+)\s*(.*?)\s*=>\s*(.*)")
CHECK = re.compile(r"\s*([\w:]+)\s*([=~])\s*(\[[^\]]*\]|[^,\s]+)")


def parse_value(text):
    """An int, a float, or [a,b,...] (an int64 numpy array if every item is an integer,
    else float64)."""
    if text.startswith("["):
        items = [parse_value(v.strip()) for v in text[1:-1].split(",")]
        return np.array(items, dtype=np.int64 if all(isinstance(v, int) for v in items)
                        else np.float64)
    return float(text) if any(c in text for c in ".eE") and not text.startswith("0x") \
        else int(text, 0)


def check(got, op, want, what):
    if op == "=":
        assert np.array_equal(got, want), f"{what} = {got!r}, expected {want!r}"
    else:
        assert np.allclose(got, want, rtol=1e-9, atol=1e-12), f"{what} = {got!r}, not ~ {want!r}"


def cases():
    for path in sorted(ASM.glob("*.rasm")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = EXPECT.match(line)
            if m:
                yield pytest.param(path, m, id=f"{path.name}:{n}")


def test_every_sample_has_expectations():
    files = {p.name for p in ASM.glob("*.rasm")}
    with_cases = {c.values[0].name for c in cases() if c.values[1].group(1) == "expect"}
    assert files and files == with_cases


@pytest.mark.parametrize("path,m", list(cases()))
def test_expectations(path, m):
    program = rvm.load(path)
    kind, name = m.group(1), m.group(2)
    given, _, loss = m.group(3).partition(" loss ")
    args = [parse_value(a) for a in given.split()]
    if kind == "grad":
        results = rvm.grad(program[name], loss=loss.strip())(*args)
    else:
        results = program.call(name, *args)
    machine = rvm.Machine(program)
    machine.call(name, *[a.copy() if isinstance(a, np.ndarray) else a for a in args])
    names = [b.name for b in machine.bindings]
    for c in CHECK.finditer(m.group(4)):
        reg, op, value = c.groups()
        check(results[names.index(reg)], op, parse_value(value), reg)
    if kind == "expect":     # backwards from the results gives the arguments back
        back = program.uncall(name, *results)
        for a, b in zip(back, args):
            check(a, "=" if isinstance(b, int) else "~", b, "uncall")


def test_givens_rotations_preserve_the_norm_and_match_numpy():
    np = pytest.importorskip("numpy")
    program = rvm.load(ASM / "givens.rasm")
    v = np.array([0.3, -1.2, 2.5, 0.7])
    out = np.array(program.call("givens", *v))
    assert np.isclose(np.linalg.norm(out), np.linalg.norm(v), rtol=1e-14)
    ref = v.copy()
    for line in (ASM / "givens.rasm").read_text().splitlines():
        m = re.match(r"\s*ROT\s+f(\d), f(\d), (\S+)", line)
        if m:
            i, j, t = int(m.group(1)), int(m.group(2)), float(m.group(3))
            a, b = ref[i], ref[j]
            ref[i], ref[j] = a * np.cos(t) - b * np.sin(t), a * np.sin(t) + b * np.cos(t)
    assert np.allclose(out, ref, rtol=1e-13)


def test_iexp_matches_math_exp_over_a_range():
    program = rvm.load(ASM / "iexp.rasm")
    for x in [-1.0, -0.01, 0.3, 1.6, 4.0]:
        assert math.isclose(program.call("iexp", 0.0, x)[0], math.exp(x), rel_tol=1e-14)
    # an alternating series loses digits to cancellation: sum of |terms| is e^5, result e^-5
    assert math.isclose(program.call("iexp", 0.0, -5.0)[0], math.exp(-5.0), rel_tol=1e-11)


def test_isqrt_matches_math_isqrt():
    program = rvm.load(ASM / "isqrt.rasm")
    for n in [0, 1, 2, 3, 4, 8, 9, 10, 99, 100, 101, 12345]:
        assert program.call("isqrt", n, 0) == (n, math.isqrt(n))


def test_fib_matches_reference():
    program = rvm.load(ASM / "fib.rasm")
    a, b = 0, 1
    for n in range(1, 30):
        a, b = b, a + b
        assert program.call("fib", n, 0, 0) == (n, a, b)
