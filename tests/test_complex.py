"""Complex numbers in the Python subset: each operation against Python's complex
arithmetic, inverses restore the inputs, gradients (dL/dRe + i dL/dIm) against finite
differences in both real directions on every engine, the errors, the CLI, the examples."""

import cmath
import json
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest

import rvm
from rvm import Array, ancilla, zeros

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from complex_numbers import cdot, complex_log, random_csc, spmv, spmv_loss  # noqa: E402

from rvm.engines import native  # noqa: E402

ENGINES = ["interp", "python"] + (["native"] if native.available else [])


@rvm.reversible
def mac(y: complex, a: complex, b: complex):
    y += a * b - conj(a) / b


@rvm.reversible
def elementary(y: complex, x: complex, t: float):
    y -= exp(x) + log(x) * 2.0 + complex(t, -t) + 1j * t


@rvm.reversible
def scale(z: complex, w: complex):
    z *= w


@rvm.reversible
def unscale(z: complex, w: complex):
    z /= w


@rvm.reversible
def phase(z: complex, t: float):
    z *= exp(1j * t)


@rvm.reversible
def parts(x: float, z: complex, a: Array[complex]):
    x += z.real * a[0].imag + abs(a[1]) + abs(z) - np.imag(z) + abs(a[0].real)


@rvm.reversible
def shuffle(z: complex, w: complex, a: Array[complex]):
    z, w = w, z
    a[0], z = z, a[0]
    neg(w)
    a[1] *= 2.0


@rvm.reversible
def through_ancillas(z: complex, a: Array[complex]):
    with ancilla(t=1 + 2j, b=zeros(len(a), complex)):
        for i in range(len(a)):
            b[i] += a[i] * 2j
        for i in range(len(a)):
            z += b[i] * t
        for i in range(len(a)):
            b[i] -= a[i] * 2j


@rvm.reversible
def called(z: complex, w: complex):
    scale(z, w)
    mac(w, z, 1j)


@rvm.reversible
def loss_of(out: float, z: complex, w: complex, t: float):
    with ancilla(p=0j):
        p += z * w + exp(1j * t) * conj(z)
        p *= w
        out += abs(p) + p.real * t
        p /= w
        p -= z * w + exp(1j * t) * conj(z)


def loss_py(z, w, t):
    p = (z * w + cmath.exp(1j * t) * z.conjugate()) * w
    return abs(p) + p.real * t


Z, W = 0.7 - 1.3j, -1.1 + 0.4j


def test_arithmetic_matches_python():
    y, a, b = mac(1 + 1j, Z, W)
    assert y == pytest.approx(1 + 1j + Z * W - Z.conjugate() / W, abs=1e-14)
    assert (a, b) == (Z, W)
    y = elementary(0.5j, Z, 0.3)[0]
    want = 0.5j - (cmath.exp(Z) + cmath.log(Z) * 2 + complex(0.3, -0.3) + 0.3j)
    assert y == pytest.approx(want, abs=1e-14)
    assert scale(Z, W)[0] == pytest.approx(Z * W, abs=1e-14)
    assert unscale(Z, W)[0] == pytest.approx(Z / W, abs=1e-14)
    assert phase(Z, 0.4)[0] == pytest.approx(Z * cmath.exp(0.4j), abs=1e-15)
    a = np.array([1 - 2j, 3 + 4j])
    assert parts(0.0, Z, a)[0] == pytest.approx(
        Z.real * a[0].imag + 5 + abs(Z) - Z.imag + 1, abs=1e-14)
    z, w, b = shuffle(Z, W, a)
    assert (z, w) == (a[0], -Z)
    np.testing.assert_allclose(b, [W, 2 * a[1]])
    assert through_ancillas(0j, a)[0] == pytest.approx(a.sum() * 2j * (1 + 2j), abs=1e-13)
    zw = Z * W          # then w += zw * 1j - conj(zw) / 1j = w + 2j Re(zw)
    assert called(Z, W)[:2] == pytest.approx((zw, W + 2j * zw.real), abs=1e-14)


def test_numpy_complex_in_and_out():
    a = np.array([1 + 2j, 3 - 1j], dtype=np.complex64)
    out, a2, _ = cdot(np.complex128(0), a, np.array([2 - 1j, 1 + 1j]))
    assert out == pytest.approx(np.vdot(a, [2 - 1j, 1 + 1j]))
    assert isinstance(out, complex) and a2.dtype == np.complex128 and a2.shape == (2,)
    np.testing.assert_array_equal(a2, a)


@pytest.mark.parametrize("f,args", [
    (mac, (1 + 1j, Z, W)), (elementary, (0.5j, Z, 0.3)), (scale, (Z, W)),
    (unscale, (Z, W)), (phase, (Z, 0.4)), (called, (Z, W)),
    (through_ancillas, (0.5j, np.array([1 - 2j, 3 + 4j])))])
def test_inverse_restores(f, args):
    back = (~f)(*f(*args))
    for x, y in zip(back, args):
        np.testing.assert_allclose(x, y, atol=1e-13)


def fd(f, args, k, h=1e-6):
    """d f / d Re(args[k]) + i d f / d Im(args[k]) by central differences."""
    def at(d):
        a = list(args)
        a[k] = a[k] + d
        return f(*a)
    return ((at(h) - at(-h)) + 1j * (at(1j * h) - at(-1j * h))) / (2 * h)


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_convention_against_finite_differences(engine):
    args = (0.0, Z, W, 0.3)
    g = rvm.grad(loss_of, loss="out", engine=engine)(*args)
    assert g[0] == 1.0
    assert g[1] == pytest.approx(fd(loss_py, (Z, W, 0.3), 0), abs=1e-7)
    assert g[2] == pytest.approx(fd(loss_py, (Z, W, 0.3), 1), abs=1e-7)
    h = 1e-6
    assert g[3] == pytest.approx((loss_py(Z, W, 0.3 + h) - loss_py(Z, W, 0.3 - h)) / (2 * h),
                                 abs=1e-7)
    assert isinstance(g[1], complex) and isinstance(g[3], float)


@pytest.mark.parametrize("engine", ENGINES)
def test_sparse_product_and_its_gradient(engine):
    rng = np.random.default_rng(3)
    dense, colptr, rowval, nzval = random_csc(rng, 7, 6, 0.4)
    x = rng.normal(size=6) + 1j * rng.normal(size=6)
    alpha = 0.5 - 0.25j
    y0 = np.zeros(7, complex)
    y = spmv(y0, colptr, rowval, nzval, x, alpha, engine=engine)[0]
    np.testing.assert_allclose(y, alpha * dense @ x, atol=1e-13)
    g = rvm.grad(spmv_loss, loss="loss", engine=engine)(0.0, y0, colptr, rowval, nzval, x,
                                                        alpha)
    # L = |alpha A x|^2: dL/dx = 2 conj(alpha) A^H y, dL/dA_jk = 2 y_j conj(alpha x_k)
    np.testing.assert_allclose(g[5], 2 * np.conj(alpha) * dense.conj().T @ y, atol=1e-12)
    cols = np.repeat(np.arange(6), np.diff(colptr))
    np.testing.assert_allclose(g[4], 2 * y[rowval] * np.conj(alpha * x[cols]), atol=1e-12)

    def loss(a):
        return float(np.sum(np.abs(a * dense @ x) ** 2))
    assert g[6] == pytest.approx(fd(loss, (alpha,), 0), abs=1e-6)
    assert g[2] is None and g[3] is None


def test_complex_log_example():
    for x in (1 + 2j, -3 + 0.5j, 0.2 - 4j):
        y, _ = complex_log(0.25j, x)
        assert y == pytest.approx(0.25j + cmath.log(x), abs=1e-14)
        assert (~complex_log)(y, x)[0] == pytest.approx(0.25j, abs=1e-14)
    g = rvm.grad(lambda_loss, loss="out")(0.0, 1 + 2j)[1]
    # d|log x|^2: by finite differences in both directions
    assert g == pytest.approx(fd(lambda x: abs(cmath.log(x)) ** 2, (1 + 2j,), 0), abs=1e-7)


@rvm.reversible
def lambda_loss(out: float, x: complex):
    with ancilla(y=0j):
        complex_log(y, x)
        out += y.real * y.real + y.imag * y.imag
        ~complex_log(y, x)


def test_dot_with_conjugation_gradient():
    a, b = np.array([1 + 2j, 3 - 1j]), np.array([2 - 1j, 1 + 1j])
    g = rvm.grad(dot_loss, loss="out")(0.0, a, b)
    # L = Re(a^H b): dL/da = b, dL/db = a (in dL/dRe + i dL/dIm)
    np.testing.assert_allclose(g[1], b)
    np.testing.assert_allclose(g[2], a)


@rvm.reversible
def dot_loss(out: float, a: Array[complex], b: Array[complex]):
    with ancilla(d=0j):
        cdot(d, a, b)
        out += d.real
        ~cdot(d, a, b)


BAD = {
    "z += z * w": "z occurs on both sides",
    "x += z": "a real target cannot absorb a complex value",
    "x += a[0] * 2.0": "a real target cannot absorb a complex value",
    "rot(z, w, x)": "rot rotates two real values",
    "z += w ** 2": "** is not supported on complex values",
    "z += sin(w)": "sin of a complex value is not supported",
    "z ^= w": "^= does not apply to complex values",
    "if z > 0:\n        x += 1.0": "z is complex here",
    "g(a)": "declared complex",
    "z += w / 0j": "division by zero",
    "x, z = z, x": "swap needs two values of the same type",
}


@pytest.mark.parametrize("line", BAD)
def test_errors_name_the_line(tmp_path, line):
    path = tmp_path / "bad.py"
    path.write_text("import rvm\nfrom rvm import *\n\n@rvm.reversible\n"
                    "def g(z: complex):\n    z += 1j\n\n@rvm.reversible\n"
                    "def f(x: float, z: complex, w: complex, a: Array[complex]):\n"
                    f"    {line}\n")
    with pytest.raises(rvm.CompileError) as e:
        rvm.load(path)
    assert BAD[line] in str(e.value)
    assert "bad.py:10:" in str(e.value)


def test_two_dimensional_complex_arrays_are_refused():
    with pytest.raises(rvm.RvmError, match="complex arrays must be 1-D"):
        cdot(0j, np.ones((2, 2), complex), np.ones((2, 2), complex))


def test_complex_loss_is_refused():
    with pytest.raises(rvm.RvmError, match="must be real"):
        rvm.grad(mac, loss="y")(0j, Z, W)


def test_cli_takes_and_prints_complex(tmp_path):
    src = ROOT / "examples" / "complex_numbers.py"
    run = subprocess.run(["rvm", "run", str(src), "--entry", "complex_log", "--args", "0j",
                          "1+2j", "--json"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["y"] == pytest.approx([cmath.log(1 + 2j).real, cmath.log(1 + 2j).imag])
    assert out["x"] == [1.0, 2.0]
    bad = subprocess.run(["rvm", "run", str(src), "--entry", "complex_log", "--args", "0",
                          "1+2j"], capture_output=True, text=True)
    assert bad.returncode == 1 and "2+0j" in bad.stderr and "Traceback" not in bad.stderr


def test_debugger_shows_complex_variables_and_their_parts(tmp_path):
    script = tmp_path / "cmds.txt"
    script.write_text("n\np x.real\np y\ninfo registers\n")
    run = subprocess.run(["rvm", "debug", str(ROOT / "examples" / "complex_numbers.py"),
                          "--entry", "complex_log", "--args", "0j", "1+2j", "--batch",
                          str(script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "x.real = 1.0" in run.stdout
    assert f"y = {cmath.log(1 + 2j)!r}" in run.stdout
    assert "f1 y.imag" in run.stdout


@pytest.mark.parametrize("engine", ENGINES)
def test_jvp_and_adjoint_take_complex_scalars(engine):
    args, dots = (0.0, Z, W, 0.3), (0.0, 0.2 - 0.7j, 1.1 + 0.3j, -0.4)
    values, tangents = rvm.jvp(loss_of, args, dots, engine=engine)
    assert values[0] == pytest.approx(loss_py(Z, W, 0.3), abs=1e-13)
    h = 1e-6

    def along(e):
        return loss_py(Z + e * dots[1], W + e * dots[2], 0.3 + e * dots[3])
    assert tangents[0] == pytest.approx((along(h) - along(-h)) / (2 * h), abs=1e-7)
    assert isinstance(tangents[1], complex) and tangents[1] == dots[1]
    # the adjoint seeded with 1 on out: its shadows are the gradient, same convention
    out = rvm.adjoint(loss_of, engine=engine)(*args, 1.0, 0j, 0j, 0.0)
    g = rvm.grad(loss_of, loss="out")(*args)
    assert out[:4] == pytest.approx(args, abs=1e-13)
    assert out[4:] == pytest.approx(g, abs=1e-12)


def test_second_derivative_helpers_refuse_complex_clearly():
    with pytest.raises(rvm.RvmError, match="takes real arguments"):
        rvm.hvp(loss_of, (0.0, Z, W, 0.3), (0.0, 1j, 0j, 0.0), loss="out")
    with pytest.raises(rvm.RvmError, match="takes real arguments"):
        rvm.hessian(loss_of, loss="out")(0.0, Z, W, 0.3)
    with pytest.raises(rvm.RvmError, match="complex array"):
        rvm.jvp(cdot, (0j, np.ones(2, complex), np.ones(2, complex)), (0j, None, None))


def test_a_loaded_program_takes_complex_or_register_values():
    prog = rvm.load(ROOT / "examples" / "complex_numbers.py")
    y, x = prog.call("complex_log", 0j, 1 + 2j)
    assert y == pytest.approx(cmath.log(1 + 2j)) and x == 1 + 2j
    # one float per register (real, imaginary, real, imaginary) works too
    out = prog.call("complex_log", 0.0, 0.0, 1.0, 2.0)
    assert out == pytest.approx((cmath.log(1 + 2j).real, cmath.log(1 + 2j).imag, 1.0, 2.0))


def random_expression(rng, depth: int) -> str:
    """A random complex expression over a, b (complex) and t (real)."""
    if depth == 0 or rng.random() < 0.2:
        return rng.choice(["a", "b", "t", "(0.5 - 1.5j)", "2j", "1.25", "a.real", "abs(b)"])
    kind = rng.randrange(6)
    x, y = random_expression(rng, depth - 1), random_expression(rng, depth - 1)
    if kind == 0:
        return f"({x} {rng.choice('+-*')} {y})"
    if kind == 1:
        return f"({x} / (1.5 + 0.5j + {y} * 0.1))"
    if kind == 2:
        return f"conj({x})"
    if kind == 3:
        return f"exp({x} * 0.1)"
    if kind == 4:
        return f"log(2.0 + {x} * 0.1)"
    return f"-{x}"


# The default run checks the expressions whose function is under BIG instructions (22
# of the 24, every operation among them); RVM_SLOW=1 the others too: the two nested
# divisions of 4754 and 5766 instructions took 19 of the test's 20 s (the interpreter
# prepares 2.5 s of Python for each direction of each).
BIG = 2000


@pytest.mark.parametrize("big", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_random_complex_expressions_match_python_and_finite_differences(tmp_path, big):
    rng = random.Random(7)
    lines, exprs = ["import rvm", "from rvm import *", ""], []
    for k in range(24):
        e = random_expression(rng, 3)
        exprs.append(e)
        lines += ["@rvm.reversible",
                  f"def f{k}(y: complex, a: complex, b: complex, t: float):",
                  f"    y += {e}", ""]
        for part in ("real", "imag"):       # a real loss: one part of the result
            lines += ["@rvm.reversible",
                      f"def g{k}_{part}(out: float, a: complex, b: complex, t: float):",
                      "    with ancilla(y=0j):",
                      f"        f{k}(y, a, b, t)",
                      f"        out += y.{part}",
                      f"        ~f{k}(y, a, b, t)", ""]
    path = tmp_path / "exprs.py"
    path.write_text("\n".join(lines))
    prog = rvm.load(path)
    env = {"conj": np.conj, "exp": cmath.exp, "log": cmath.log, "abs": abs}
    a, b, t = 0.3 - 0.8j, -1.1 + 0.6j, 0.7
    chosen = [(k, e) for k, e in enumerate(exprs)
              if (len(prog.functions[f"f{k}"].code) >= BIG) == big]
    assert chosen
    if not big:         # most of them, meeting every operation and constant
        assert len(chosen) >= 20 and all(any(op in e for _, e in chosen) for op in (
            " + ", " - ", " * ", " / (", "conj(", "exp(", "log(", "-(", "-b", "a.real",
            "abs(b)", "t", "2j", "1.25", "(0.5 - 1.5j)")), [e for _, e in chosen]
    for k, e in chosen:
        want = complex(eval(e, env, {"a": a, "b": b, "t": t}))
        y, *_ = prog.call(f"f{k}", 0.25j, a, b, t, engine="interp")
        assert y == pytest.approx(0.25j + want, rel=1e-12, abs=1e-12), e
        back = prog.uncall(f"f{k}", y, a, b, t, engine="interp")
        assert back[0] == pytest.approx(0.25j, abs=1e-12), e
        # the gradient of Re(y) and of Im(y) with respect to a, against central differences
        for part in ("real", "imag"):
            g = rvm.grad(prog[f"g{k}_{part}"], loss=0, engine="interp")(0.0, a, b, t)

            def f(a, b, t, e=e, part=part):
                return getattr(complex(eval(e, env, {"a": a, "b": b, "t": t})), part)
            for j in (1, 2):
                assert g[j] == pytest.approx(fd(f, (a, b, t), j - 1), rel=1e-6, abs=1e-6), \
                    (e, part, j)
            h = 1e-6
            assert g[3] == pytest.approx((f(a, b, t + h) - f(a, b, t - h)) / (2 * h),
                                         rel=1e-6, abs=1e-6), (e, part)
