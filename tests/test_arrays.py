"""Array statements of reversible Python (docs/language.md, Arrays): each form against
numpy's closed forms, the inverse restores the inputs, gradients against closed forms and
finite differences, transforms, engines, and every refusal with its file:line:col."""
# ruff: noqa: F821, B018

import math
import re
import warnings

import numpy as np
import pytest

import rvm
from rvm import Array, ancilla, compute, neg, zeros
from rvm.core.errors import CompileError, MachineError

ENGINES = [None, "python"]
EVERY_ENGINE = ["interp", "python", "native"]
rng = np.random.default_rng(37)
X, Y = rng.normal(size=4), rng.normal(size=4)
A, B = rng.normal(size=(3, 4)), rng.normal(size=(5, 4))


@rvm.reversible
def axpy(y: Array[float], x: Array[float], a: float):
    y += a * x + np.exp(x) - np.sin(x) * np.tanh(x) + abs(x) ** 2 / 4.0 - 1.0
    y -= 0.5 * np.sqrt(np.log(2.0 + x * x))


def axpy_np(y, x, a):
    return y + a * x + np.exp(x) - np.sin(x) * np.tanh(x) + abs(x) ** 2 / 4.0 - 1.0 - \
        0.5 * np.sqrt(np.log(2.0 + x * x))


@rvm.reversible
def matvec(y: Array[float], A: Array[float, 2], x: Array[float], z: Array[float]):
    y += A @ x
    x -= 2.0 * (A.T @ z)


@rvm.reversible
def matmat(C: Array[float, 2], A: Array[float, 2], B: Array[float, 2], D: Array[float, 2]):
    C += A @ B.T
    D -= A.T @ C


@rvm.reversible
def reductions(s: float, t: Array[float], u: Array[float], x: Array[float],
               y: Array[float], A: Array[float, 2]):
    s += x @ y + np.dot(x, y) + 3.0 * np.sum(np.sin(x)) - np.sum(y * y) / 4.0
    t += np.sum(A * A, axis=1)
    u += np.sum(A, axis=0)


@rvm.reversible
def broadcast(C: Array[float, 2], x: Array[float], A: Array[float, 2], i: int):
    C += x * A[0, :] + 2.0          # a 1-D operand broadcasts along the rows
    C[i, :] += x
    C[:, 0] -= A[:, 1]
    C[1:3, 2:4] += A[0:2, 0:2].T


@rvm.reversible
def moves(x: Array[float], y: Array[float], c: float):
    x *= c
    y /= c
    x, y = y, x
    neg(x)
    y[1:3] += x[0:2]
    x[2:] -= x[:2]                  # disjoint parts of one array


@rvm.reversible
def integers(y: Array[int], x: Array[int], k: int):
    y ^= (x & 3) | 8
    y += x // 2 + (x << 1) - k


@rvm.reversible
def energy(e: float, x: Array[float]):
    with ancilla(t=zeros(len(x))):
        with compute() as r:
            t += x * x + 1.0
        e += np.sum(np.log(t))
        ~r


@rvm.reversible
def quad(out: float, A: Array[float, 2], x: Array[float]):
    """out = x . (A x), through an ancilla: gradient A x + A^T x."""
    with ancilla(t=zeros(A.shape[0])):
        t += A @ x
        out += x @ t
        t -= A @ x


@pytest.mark.parametrize("engine", ENGINES)
def test_elementwise_forms(engine):
    y = rng.normal(size=4)
    out = axpy(y, X, 1.5, engine=engine)
    assert np.allclose(out[0], axpy_np(y, X, 1.5), rtol=1e-13)
    back = (~axpy)(*out, engine=engine)
    assert np.allclose(back[0], y, atol=1e-13) and np.array_equal(back[1], X)
    C = rng.normal(size=(3, 4))
    want = C.copy()
    want += X * A[0, :] + 2.0
    want[2, :] += X
    want[:, 0] -= A[:, 1]
    want[1:3, 2:4] += A[0:2, 0:2].T
    got = broadcast(C, X, A, 2, engine=engine)
    assert np.allclose(got[0], want)
    assert np.allclose((~broadcast)(*got, engine=engine)[0], C)


@pytest.mark.parametrize("engine", ENGINES)
def test_products_and_sums(engine):
    z = rng.normal(size=3)
    y, _, x, _ = matvec(np.zeros(3), A, X, z, engine=engine)
    assert np.allclose(y, A @ X) and np.allclose(x, X - 2.0 * A.T @ z)
    back = (~matvec)(y, A, x, z, engine=engine)
    assert np.allclose(back[0], 0.0, atol=1e-13) and np.allclose(back[2], X)
    C, _, _, D = matmat(np.zeros((3, 5)), A, B, np.ones((4, 5)), engine=engine)
    assert np.allclose(C, A @ B.T) and np.allclose(D, 1.0 - A.T @ (A @ B.T))
    assert np.allclose((~matmat)(C, A, B, D, engine=engine)[0], 0.0, atol=1e-12)
    s, t, u = reductions(0.5, np.zeros(3), np.zeros(4), X, Y, A, engine=engine)[:3]
    assert s == pytest.approx(0.5 + 2 * X @ Y + 3 * np.sum(np.sin(X)) - Y @ Y / 4,
                             rel=1e-13)
    assert np.allclose(t, (A * A).sum(axis=1)) and np.allclose(u, A.sum(axis=0))


@pytest.mark.parametrize("engine", ENGINES)
def test_scale_swap_neg_and_integers(engine):
    x, y = X.copy(), Y.copy()
    out = moves(x, y, 3.0, engine=engine)
    xx, yy = -(y / 3.0), x * 3.0
    yy[1:3] += xx[0:2]
    xx[2:] -= xx[:2]
    assert np.allclose(out[0], xx) and np.allclose(out[1], yy)
    back = (~moves)(*out, engine=engine)
    assert np.allclose(back[0], x) and np.allclose(back[1], y)
    xi, yi = np.arange(5), np.arange(5) * 7
    got = integers(yi, xi, 4, engine=engine)[0]
    assert np.array_equal(got, (yi ^ ((xi & 3) | 8)) + xi // 2 + (xi << 1) - 4)
    assert np.array_equal((~integers)(got, xi, 4, engine=engine)[0], yi)


def test_zero_factor_is_refused_when_running():
    with pytest.raises(MachineError):
        moves(X.copy(), Y.copy(), 0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_ancillas_compute_uncompute_and_gradients(engine):
    e = energy(0.0, X, engine=engine)[0]
    assert e == pytest.approx(np.sum(np.log(X * X + 1.0)), rel=1e-13)
    g = rvm.grad(energy, loss="e", engine=engine)(0.0, X)[1]
    assert np.allclose(g, 2 * X / (X * X + 1.0), rtol=1e-12)
    M = rng.normal(size=(4, 4))
    g = rvm.grad(quad, loss="out", engine=engine)(0.0, M, X)
    assert np.allclose(g[2], M @ X + M.T @ X) and np.allclose(g[1], np.outer(X, X))
    h = 1e-6
    fd = [(quad(0.0, M, X + h * d)[0] - quad(0.0, M, X - h * d)[0]) / (2 * h)
          for d in np.eye(4)]
    assert np.allclose(g[2], fd, rtol=1e-6)


def test_gradients_of_products_against_finite_differences():
    z = rng.normal(size=3)

    def loss(x):
        return reductions(0.0, np.zeros(3), np.zeros(4), x, Y, A)[0]
    g = rvm.grad(reductions, loss="s")(0.0, np.zeros(3), np.zeros(4), X, Y, A)
    assert np.allclose(g[3], 2 * Y + 3 * np.cos(X)) and np.allclose(g[4], 2 * X - Y / 2)
    h = 1e-6
    fd = [(loss(X + h * d) - loss(X - h * d)) / (2 * h) for d in np.eye(4)]
    assert np.allclose(g[3], fd, rtol=1e-6)
    # the adjoint of y += A @ x: xbar = A^T ybar, Abar = ybar x^T
    ybar = rng.normal(size=3)
    out = rvm.adjoint(matvec)(np.zeros(3), A, X, z, ybar, np.zeros((3, 4)), np.zeros(4),
                              np.zeros(3))
    assert np.allclose(out[4], ybar) and np.allclose(out[6], A.T @ ybar)
    assert np.allclose(out[5], np.outer(ybar, X)) and np.allclose(out[7], 0.0)


@pytest.mark.parametrize("bad", ["a", ["a", "b"], [[1.0], 2.0]])
def test_a_tangent_that_is_not_numbers_is_a_usage_error(bad):
    with pytest.raises(rvm.UsageError, match=r"the tangent of argument 2 is .*; it must be a "
                       r"number or an array of floats"):
        rvm.jvp(quad, (0.0, np.eye(4), X), (0.0, np.zeros((4, 4)), bad))


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_the_adjoint_program_of_array_statements_with_ancilla_arrays(engine):
    # `np.sin(x) * z` and the sum go through ancilla arrays (ALLOC'd): rvm.adjoint
    # refused the program before; its sweep now leaves each block for the clean-up
    f = rvm.reversible.source("def f(s: float, y: Array[float], x: Array[float], "
                              "z: Array[float]):\n"
                              "    y += np.sin(x) * z\n"
                              "    s += np.sum(y * x)\n", {"Array": Array, "np": np})
    x, z, yb = rng.normal(size=5), rng.normal(size=5), rng.normal(size=5)
    a = rvm.adjoint(f)
    out = a(0.0, np.zeros(5), x, z, 1.5, yb, np.zeros(5), np.zeros(5), engine=engine)
    y = np.sin(x) * z               # s = sum(y x): cotangents 1.5 on s, yb on y
    assert np.allclose(out[6], 1.5 * (y + x * np.cos(x) * z) + yb * np.cos(x) * z,
                       rtol=1e-13)
    assert np.allclose(out[7], (1.5 * x + yb) * np.sin(x), rtol=1e-13)
    assert np.allclose(out[5], yb + 1.5 * x, rtol=1e-13) and out[4] == 1.5
    back = (~a)(*out, engine=engine)
    assert np.allclose(back[5], yb, rtol=1e-13) and np.allclose(back[6], 0.0, atol=1e-13)
    assert np.array_equal(back[1], np.zeros(5)) and back[0] == 0.0


def test_a_complex_tangent_of_a_real_argument_is_a_usage_error():
    # (it was cast to real, with numpy's ComplexWarning, the imaginary part dropped)
    for tangent in (np.ones(4) * 1j, 1j * X.tolist()[0]):
        dots = (0.0, np.zeros((4, 4)), tangent) if np.ndim(tangent) else \
            (tangent, np.zeros((4, 4)), np.zeros(4))
        for run in (rvm.jvp, lambda *a: rvm.hvp(*a, loss="out")):
            with pytest.raises(rvm.UsageError, match=r"the tangent of argument \d is "
                               "complex, but the argument is real"):
                run(quad, (0.0, np.eye(4), X), dots)


def test_none_is_a_zero_tangent_for_an_array_as_for_a_number():
    d = rng.normal(size=4)
    M = rng.normal(size=(4, 4))
    _, with_none = rvm.jvp(quad, (0.0, M, X), (None, None, d))
    _, with_zeros = rvm.jvp(quad, (0.0, M, X), (0.0, np.zeros((4, 4)), d))
    assert with_none[0] == with_zeros[0] == pytest.approx(d @ (M + M.T) @ X, rel=1e-12)
    assert np.array_equal(with_none[1], np.zeros((4, 4)))
    for _ in range(2):          # (the second call takes the plan the first made)
        hv = rvm.hvp(quad, (0.0, M, X), (None, None, d), loss="out")
        assert np.allclose(hv[2], (M + M.T) @ d)


def test_hvp_of_scalars_takes_none_as_a_zero_tangent_on_every_call():
    # the second call, through the first's plan, passed None on to the machine
    @rvm.reversible
    def cubic(out: float, x: float, y: float):
        out += x * x * y
    for _ in range(3):
        assert rvm.hvp(cubic, (0.0, 2.0, 3.0), (0.0, None, 1.0), loss="out") == \
            (0.0, 4.0, 0.0)


def test_hessian_of_an_argument_out_of_range_says_so():
    with pytest.raises(rvm.UsageError, match="hessian: wrt names argument 7, but the "
                       "function takes 2 arguments"):
        rvm.hessian(energy, loss="e", wrt=[7])(0.0, X)
    H = rvm.hessian(energy, loss="e", wrt=[-1])(0.0, X)      # the last, as in Python
    assert np.allclose(np.diag(H), 2 * (1 - X * X) / (X * X + 1.0) ** 2)


def test_transforms():
    M = rng.normal(size=(4, 4))
    # jvp of out = x . (M x) along d: d . (M + M^T) x
    d = rng.normal(size=4)
    _, tans = rvm.jvp(quad, (0.0, M, X), (0.0, np.zeros((4, 4)), d))
    assert tans[0] == pytest.approx(d @ (M + M.T) @ X, rel=1e-12)
    t_out = rvm.tangent(quad)(0.0, M, X, 0.0, np.zeros((4, 4)), d)
    assert t_out[3] == pytest.approx(d @ (M + M.T) @ X, rel=1e-12)
    hv = rvm.hvp(quad, (0.0, M, X), (0.0, np.zeros((4, 4)), d), loss="out")
    assert np.allclose(hv[2], (M + M.T) @ d)
    H = rvm.hessian(energy, loss="e", wrt=[1])(0.0, X)
    assert np.allclose(np.diag(H), 2 * (1 - X * X) / (X * X + 1.0) ** 2)
    J = rvm.jacobian(matvec, [("y", 0), ("y", 1), ("y", 2)], ["x"])(np.zeros(3), A, X,
                                                                      np.zeros(3))
    assert np.allclose(J, A)
    xs = rng.normal(size=(6, 4))
    vals = rvm.vmap(energy, in_axes=(None, 0))(0.0, xs)[0]
    assert np.allclose(vals, np.sum(np.log(xs * xs + 1.0), axis=1))
    v, g = rvm.value_and_grad(energy, loss="e")(0.0, X)
    assert v[0] == pytest.approx(np.sum(np.log(X * X + 1.0)))
    assert np.allclose(g[1], 2 * X / (X * X + 1.0))


def test_native_code():
    pytest.importorskip("llvmlite")
    M = rng.normal(size=(4, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no fallback to another engine
        C = matmat(np.zeros((3, 5)), A, B, np.ones((4, 5)), engine="native")[0]
        assert np.allclose(C, A @ B.T)
        g = rvm.grad(quad, loss="out", engine="native")(0.0, M, X)
        assert np.allclose(g[2], M @ X + M.T @ X)


# ------------------------------------------------------------------ refusals

def compiled(text: str, *args):
    f = rvm.reversible.source(text, {"Array": Array, "np": np})
    return f(*args)


def refused(text: str, *args) -> str:
    with pytest.raises(CompileError) as e:
        compiled(text, *args)
    return str(e.value)


V, M34 = np.arange(4.0), np.ones((3, 4))


@pytest.mark.parametrize("body, args, where, message", [
    ("y[1:] += 0.5 * y[:-1]", (V,), "2:20", "y[1:] reads y[:-1], which overlaps it"),
    ("y += A @ y", (V, np.ones((4, 4))), "2:14", "y reads y, which overlaps it"),
    ("y += y[0]", (V, M34), "2:10", "y reads y[0], which overlaps it"),
    ("y[0:2], y[1:3] = y[1:3], y[0:2]", (V,), "2:13", "y[0:2] is swapped with y[1:3]"),
    ("y = A[0, :] * 2.0", (V, M34), "2:5", "y = ... overwrites the array"),
    ("y[:] = A[0, :]", (V, M34), "2:5", "y[:] = ... overwrites the array"),
    ("y[0:3] += A[0, 0:2]", (V, M34), "2:15", "shape mismatch: A[0, 0:2] has shape (2,), "
     "y[0:3] has shape (3,)"),
    ("y += A", (V, M34), "2:10", "A has 2 axes, more than y (1)"),
    ("y[0:3] += A @ (y[0:3] * 2.0)", (V, M34), "2:20", "the operand y[0:3] * 2.0 of a "
     "matrix product is not an array, a slice or a transpose"),
    ("y += 2.0 * np.exp(A.T @ y)", (V, M34), "2:23", "A.T @ y is used inside an expression"),
    ("y[::2] += 1.0", (V, M34), "2:7", "slices with a step are not supported"),
    ("y += np.exp(A[0:4, 0:1].T).T[0, :]", (V, M34), "2:10", "np.exp(A[0:4, 0:1].T).T "
     "transposes an expression"),
])
def test_refusals_name_the_place(body, args, where, message):
    params = "y: Array[float]" + (", A: Array[float, 2]" if len(args) > 1 else "")
    text = refused(f"def f({params}):\n    {body}\n", *args)
    assert re.search(f":{where}: error: ", text), text
    assert message in text, text
    if "overlaps" in message:
        assert "hint: a whole-array update may not read its own target; write the loop" \
            in text
    if "overwrites" in message:
        assert "hint: accumulate instead" in text


def test_a_scalar_target_takes_a_sum():
    text = refused("def f(s: float, x: Array[float]):\n    s += x * 2.0\n", 0.0, V)
    assert ":2:10: error: x * 2.0 is an array; the scalar target s takes a number" in text


def test_shapes_known_only_when_running_are_checked_then():
    f = rvm.reversible.source("def f(y: Array[float], x: Array[float]):\n    y += x\n",
                              {"Array": Array})
    assert np.array_equal(f(np.zeros(3), np.ones(3))[0], np.ones(3))
    # in the source's terms: the statement, the lengths by name, their values
    with pytest.raises(MachineError, match=r":2: line 2 \(`y \+= x`\): shape mismatch: it "
                       r"needs len\(x\) == len\(y\), with len\(x\) = 3, len\(y\) = 4"):
        f(np.zeros(4), np.ones(3))
    g = rvm.reversible.source("def g(y: Array[float], n: int):\n    y[0:n] += 1.0\n",
                              {"Array": Array})
    assert np.array_equal(g(np.zeros(3), 2)[0], [1.0, 1.0, 0.0])
    with pytest.raises(MachineError, match=r"the slice y\[0:n\] ends past the end of y: it "
                       r"needs n <= len\(y\), with n = 5, len\(y\) = 3"):
        g(np.zeros(3), 5)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_overlap_known_only_when_running_is_checked_then(engine):
    f = rvm.reversible.source("def f(y: Array[float], a: int, b: int):\n"
                              "    y[a:a + 2] += y[b:b + 2]\n", {"Array": Array})
    assert np.array_equal(f(np.arange(6.0), 0, 2, engine=engine)[0],
                          [2.0, 4.0, 2.0, 3.0, 4.0, 5.0])
    # named as the source names it, with the values that made the views overlap
    with pytest.raises(MachineError, match=r":2: line 2 \(`y\[a:a \+ 2\] \+= y\[b:b \+ 2\]`\): "
                       r"y\[a:a \+ 2\] overlaps y\[b:b \+ 2\], which the statement reads, "
                       r"with a = 0, b = 1; a whole-array update may not read its own "
                       r"target; write the loop"):
        f(np.arange(6.0), 0, 1, engine=engine)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_an_element_may_take_the_sum_of_a_slice_of_its_own_array_apart_from_it(engine):
    # (refused with "Slice is not supported in expressions": the element's check
    # against other elements of its array read the slice as an index)
    f = rvm.reversible.source("def f(s: float, x: Array[float], i: int, j: int):\n"
                              "    x[i] += np.sum(x[j:] * x[j:])\n"
                              "    x[0] += x[1:3] @ x[2:4]\n"
                              "    s += x[i] * x[i]\n", {"Array": Array, "np": np})
    x = np.array([0.5, 1.0, 2.0, 3.0])
    # x[3] is in x[0:]: the run-time check refuses it, naming the values
    with pytest.raises(MachineError, match=r"x\[i\] overlaps x\[j:\], which the statement "
                       r"reads, with i = 3, j = 0"):
        f(0.0, x, 3, 0, engine=engine)
    out = f(0.0, x, 0, 1, engine=engine)
    v = x[0] + np.sum(x[1:] ** 2)
    assert out[1][0] == v + x[1] * x[2] + x[2] * x[3] and out[0] == out[1][0] ** 2
    assert np.array_equal((~f)(*out, engine=engine)[1], x)
    g = rvm.grad(f, loss="s", engine=engine)(0.0, x, 0, 1)[1]
    h = 1e-6
    fd = [(f(0.0, x + h * d, 0, 1)[0] - f(0.0, x - h * d, 0, 1)[0]) / (2 * h)
          for d in np.eye(4)]
    assert np.allclose(g, fd, rtol=1e-7)


def test_an_element_may_take_the_sum_of_a_row_of_its_own_array():
    # (a row view without a slice, A[1], was refused as "A occurs on both sides")
    f = rvm.reversible.source("def f(A: Array[float, 2]):\n    A[0, 0] += np.sum(A[1])\n",
                              {"Array": Array, "np": np})
    A = np.arange(9.0).reshape(3, 3)
    assert f(A)[0][0, 0] == 12.0
    assert refused("def f(A: Array[float, 2]):\n    A[1, 0] += np.sum(A[1])\n", A) \
        .count("A[1, 0] reads A[1], which overlaps it") == 1


@pytest.mark.parametrize("body", ["x[0] += np.sum(x)", "A[1, 1] += np.sum(A[1:, :])"])
def test_an_element_that_a_sum_of_its_array_always_reads_is_refused(body):
    text = refused(f"def f(x: Array[float], A: Array[float, 2]):\n    {body}\n",
                   np.ones(3), np.ones((3, 3)))
    assert re.search(r":2:\d+: error: .* reads .*, which overlaps it", text), text


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_an_index_of_a_transpose_is_its_arrays_index_swapped(engine):
    # (A.T[0:2, 2:4] as a target was "the scalar target ... takes a number", and as an
    # operand "index an array variable directly")
    f = rvm.reversible.source(
        "def f(A: Array[float, 2], B: Array[float, 2], x: Array[float], y: Array[float], "
        "s: float):\n"
        "    A.T[0:2, 2:4] += B\n"
        "    x += A.T[1]\n"
        "    x[0:2] += A.T[1, 2:4] + A.T[1:3, 0]\n"
        "    B += A.T[1:3, 0:2] * 2.0\n"
        "    y += A.T[0:2] @ x\n"
        "    s += A.T[3, 0] * y[1]\n", {"Array": Array, "np": np})
    A, B = rng.normal(size=(4, 4)), rng.normal(size=(2, 2))
    x, y = rng.normal(size=4), np.zeros(2)
    out = f(A, B, x, y, 0.0, engine=engine)
    A2, B2, x2, y2 = A.copy(), B.copy(), x.copy(), y.copy()
    A2.T[0:2, 2:4] += B2
    x2 += A2.T[1]
    x2[0:2] += A2.T[1, 2:4] + A2.T[1:3, 0]
    B2 += A2.T[1:3, 0:2] * 2.0
    y2 += A2.T[0:2] @ x2
    for got, want in zip(out, (A2, B2, x2, y2, A2.T[3, 0] * y2[1])):
        assert np.allclose(got, want, rtol=1e-13)
    back = (~f)(*out, engine=engine)
    assert all(np.allclose(a, b, rtol=1e-12) for a, b in zip(back, (A, B, x, y, 0.0)))


@pytest.mark.parametrize("engine", EVERY_ENGINE)
@pytest.mark.parametrize("args, message", [
    ((4, 0, 3), r"the slice y\[a:a \+ n\] ends past the end of y: it needs a \+ n <= len\(y\), "
                r"with a \+ n = 7, len\(y\) = 6"),
    ((-1, 3, 3), r"the slice y\[a:a \+ n\] starts before y: it needs 0 <= a, with a = -1"),
    ((2, 0, -1), r"the slice y\[a:a \+ n\] ends before it starts: it needs a <= a \+ n, with "
                 r"a = 2, a \+ n = 1"),
])
def test_a_slices_bounds_checked_when_running_say_which_bound_by_the_sources_names(
        engine, args, message):
    f = rvm.reversible.source("def f(y: Array[float], a: int, b: int, n: int):\n"
                              "    y[a:a + n] += 0.5 * y[b:b + n]\n", {"Array": Array})
    y = np.arange(6.0)
    with pytest.raises(MachineError, match=r":2: line 2 \(`y\[a:a \+ n\] \+= 0\.5 \* "
                       r"y\[b:b \+ n\]`\): " + message):
        f(y, *args, engine=engine)
    assert np.array_equal(y, np.arange(6.0))        # (the caller's array untouched)


def test_a_matrix_slices_bounds_name_the_axis():
    f = rvm.reversible.source("def f(A: Array[float, 2], x: Array[float], i: int, j: int):\n"
                              "    A[i, j:j + 3] += x\n", {"Array": Array})
    with pytest.raises(MachineError, match=r"the slice A\[i, j:j \+ 3\] ends past the end of "
                       r"A \(its columns\): it needs j \+ 3 <= A\.shape\[1\], with "
                       r"j \+ 3 = 4, A\.shape\[1\] = 3"):
        f(np.zeros((2, 3)), np.ones(3), 1, 1)


# ------------------------------------------------------------------ array instructions

def ops_of(f, *args) -> list[str]:
    """The instructions f compiles to (for these arguments' types)."""
    program, name, _ = f.specialize(args)
    return [ins.op for ins in program.functions[name].code]


def views_of(f, *args) -> list[str]:
    program, name, _ = f.specialize(args)
    return [str(ins) for ins in program.functions[name].code if ins.op.startswith("V")]


LOOP_OPS = ("JMP", "BR.", "CF")


def no_loop(ops: list[str]) -> bool:
    return not any(op.startswith(LOOP_OPS) for op in ops)


@rvm.reversible
def gemv(y: Array[float], A: Array[float, 2], x: Array[float]):
    y += A @ x


def test_a_matrix_vector_product_is_one_instruction():
    ops = ops_of(gemv, np.zeros(3), A, X)
    assert [op for op in ops if op.startswith("V")] == ["VMADD"] and no_loop(ops), ops
    # y (3 x 1) += A (3 x 4) @ x (4 x 1): y and x as columns, A row-major
    (ins,) = views_of(gemv, np.zeros(3), A, X)
    assert re.fullmatch(r"VMADD +\[r0 : 1, 0\], \[r2 : r4, 1\], \[r5 : 1, 0\], r3, r4, 1",
                        ins), ins


@pytest.mark.parametrize("body, want", [
    ("y += a * x", ["VADD.mul"]),
    ("y -= x", ["VSUB"]),
    ("y += 2.0", ["VADD"]),
    ("y[1:3] += np.exp(x[0:2])", ["VADD.exp"]),
    ("y += A.T @ z", ["VMADD"]),
    ("s += x @ y", ["VMADD"]),
    ("s += np.dot(x, y) - np.sum(np.exp(x))", ["VMADD", "VSUB.exp"]),
    ("s += np.sum(x) / len(x)", ["VADD.div"]),
    ("z += np.sum(A * A, axis=1)", ["VADD.mul"]),
    ("y *= a", ["VMUL"]),
    ("y /= a", ["VDIV"]),
    ("x, y = y, x", ["VSWAP"]),
    ("neg(y)", ["VNEG"]),
    ("B += A", ["VADD"]),
    ("B[0, :] += A[1, :] * A[2, :]", ["VADD.mul"]),
    # compound operands go through zero ancilla arrays: computed, used, uncomputed
    ("y += a * np.exp(x) + 1.0", ["VADD.mul", "VADD.exp", "VSUB.exp", "VADD"]),
    # a square is a product of the operand with itself (as numpy's ** 2: x * x), a
    # compound operand computed once; other powers are pow
    ("y += x ** 2", ["VADD.mul"]),
    ("y += (x - z[0]) ** 2.0", ["VADD.mul", "VADD", "VSUB", "VSUB", "VADD"]),
    ("y += x ** 3", ["VADD.pow"]),
])
def test_statements_compile_to_array_instructions(body, want):
    f = rvm.reversible.source(
        "def f(s: float, y: Array[float], x: Array[float], z: Array[float], "
        f"A: Array[float, 2], B: Array[float, 2], a: float):\n    {body}\n",
        {"Array": Array, "np": np, "neg": neg})
    ops = ops_of(f, 0.0, Y, X, np.ones(3), A, np.ones((3, 4)), 2.0)
    vops = [op for op in ops if op.startswith("V")]
    assert sorted(vops) == sorted(want) and no_loop(ops), ops
    assert ("ALLOC" in ops) == (len(want) > 2 or body.startswith("s ")), ops


def test_sums_and_scalar_targets_through_one_cell():
    f = rvm.reversible.source("def f(s: float, x: Array[float], A: Array[float, 2], "
                              "t: Array[float]):\n"
                              "    s += x @ x + np.sum(np.exp(x))\n"
                              "    t += np.sum(A, axis=0)\n", {"Array": Array, "np": np})
    vs = views_of(f, 0.0, X, A, np.zeros(4))
    # s: a one-cell ancilla ([r : 0, 0]) summed into; t: a stride 0 along the rows
    assert re.fullmatch(r"VMADD +\[(r\d+) : 0, 0\], \[r0 : 0, 1\], \[r0 : 1, 0\], 1, r1, 1",
                        vs[0]), vs
    assert vs[1].startswith("VADD.exp") and ": 0, 0]" in vs[1], vs
    assert re.fullmatch(r"VADD +\[r5 : 0, 1\], \[r2 : r4, 1\], r3, r4", vs[2]), vs
    ops = ops_of(f, 0.0, X, A, np.zeros(4))
    assert ops.count("ALLOC") == 1 and ops.count("EXCH") == 2     # one cell for s's terms
    s, _, _, t = f(0.5, X, A, np.zeros(4))
    assert s == pytest.approx(0.5 + X @ X + np.sum(np.exp(X)), rel=1e-13)
    assert np.allclose(t, A.sum(axis=0))


@pytest.mark.parametrize("body", [
    "yi += xi * 2",                     # integer arrays: the heap's float cells only
    "y += np.exp(nograd(x))",           # nograd of a view
    "y += x * (x > 0.0)",               # comparisons
    "B[:, 0:2], B[:, 2:4] = B[:, 2:4], B[:, 0:2]",     # 2-D swap in one array: ranges meet
    "y[0:3] += 2.0 * (A @ x)",          # a scaled product into an array
])
def test_what_stays_a_loop(body):
    f = rvm.reversible.source(
        "def f(y: Array[float], x: Array[float], yi: Array[int], xi: Array[int], "
        f"A: Array[float, 2], B: Array[float, 2]):\n    {body}\n",
        {"Array": Array, "np": np, "nograd": rvm.nograd})
    ops = ops_of(f, Y, X, np.arange(4), np.arange(4), A, np.ones((3, 4)))
    assert not no_loop(ops) and not any(op.startswith("V") for op in ops), ops


@pytest.mark.parametrize("engine", [None, "python", "native"])
def test_views_of_one_array_whose_ranges_meet(engine):
    # columns 0:2 and 2:4 share no element, but their address ranges meet: the operand
    # is copied into an ancilla array (the instruction checks ranges)
    f = rvm.reversible.source("def f(B: Array[float, 2]):\n"
                              "    B[:, 0:2] += np.exp(B[:, 2:4])\n"
                              "    B[:, 0:2] -= B[:, 2:4]\n"
                              "    B[0:2, :] += B[2:4, :]\n", {"Array": Array, "np": np})
    B0 = rng.normal(size=(4, 4))
    want = B0.copy()
    want[:, 0:2] += np.exp(B0[:, 2:4])
    want[:, 0:2] -= want[:, 2:4]
    want[0:2, :] += want[2:4, :]
    got = f(B0, engine=engine)[0]
    assert np.allclose(got, want, rtol=1e-13)
    assert np.allclose((~f)(got, engine=engine)[0], B0, rtol=1e-12)
    assert no_loop(ops_of(f, B0))


@pytest.mark.parametrize("engine", [None, "python", "native"])
def test_a_row_index_is_checked_against_the_rows(engine):
    # the instruction knows only the heap's bounds: C[3, :] of a 3 x 4 C would write the
    # next array's cells; the frontend checks 0 <= i < rows
    C = np.zeros((3, 4))
    with pytest.raises(MachineError, match=r"test_arrays.py:\d+: C\[i, :\]: i = 3 is outside "
                       "the rows of C"):
        broadcast(C, X, A, 3, engine=engine)
    with pytest.raises(MachineError, match=r"C\[i, :\]: i = -1 is outside the rows of C"):
        broadcast(C, X, A, -1, engine=engine)


def test_native_runs_the_instructions_without_falling_back():
    pytest.importorskip("llvmlite")
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no fallback to another engine
        y = rng.normal(size=4)
        assert np.allclose(axpy(y, X, 1.5, engine="native")[0], axpy_np(y, X, 1.5))
        s = reductions(0.5, np.zeros(3), np.zeros(4), X, Y, A, engine="native")[0]
        assert s == pytest.approx(0.5 + 2 * X @ Y + 3 * np.sum(np.sin(X)) - Y @ Y / 4,
                                  rel=1e-12)
        g = rvm.grad(reductions, loss="s", engine="native")(0.0, np.zeros(3), np.zeros(4),
                                                            X, Y, A)
        assert np.allclose(g[3], 2 * Y + 3 * np.cos(X)) and np.allclose(g[4], 2 * X - Y / 2)
        g = rvm.grad(gemv, loss=("y", 1), engine="native")(np.zeros(3), A, X)
        assert np.allclose(g[1], np.outer([0, 1, 0], X)) and np.allclose(g[2], A[1])
        g = rvm.grad(energy, loss="e", engine="native")(0.0, X)[1]
        assert np.allclose(g, 2 * X / (X * X + 1.0), rtol=1e-12)
        out = moves(X.copy(), Y.copy(), 3.0, engine="native")
        assert np.allclose((~moves)(*out, engine="native")[0], X)
    assert no_loop(ops_of(gemv, np.zeros(3), A, X))


@pytest.mark.parametrize("engine", [None, "native"])
def test_an_array_instruction_fault_names_the_element(engine):
    # exp overflows in one element: the message names it, not a heap cell
    f = rvm.reversible.source("def f(y: Array[float], x: Array[float]):\n"
                              "    y += np.exp(x)\n", {"Array": Array, "np": np})
    with pytest.raises(MachineError, match=r"y\[1\] would become inf: not finite"):
        rvm.grad(f, loss=("y", 0), engine=engine)(np.zeros(3), np.array([1.0, 800.0, 2.0]))


def test_a_gradient_starts_from_the_copy_when_array_statements_read_the_arguments():
    # the compute block reads the argument x through array instructions: only a view an
    # instruction writes counts as stored into, so the gradient may start from the copy
    f = rvm.reversible.source(
        "def f(out: float, x: Array[float]):\n"
        "    with ancilla(t=zeros(len(x)), s=0.0):\n"
        "        with compute() as c:\n"
        "            t += np.exp(x)\n"
        "            s += np.sum(t * x)\n"
        "        out += s\n"
        "        ~c\n", {"Array": Array, "np": np, "ancilla": rvm.ancilla, "zeros": rvm.zeros,
                        "compute": rvm.compute})
    x = np.array([0.5, -1.0, 2.0])
    p, name, _ = f.specialize((0.0, x))
    from rvm.engines.compiled import compiled
    assert name in compiled(p, native=True).splits
    g = rvm.grad(f, loss="out")(0.0, x)[1]
    assert np.allclose(g, np.exp(x) * (1 + x))


def test_a_statements_integers_are_computed_once_each():
    # the view T[c * K:(c + 1) * K, c] and its bounds' checks read c * K and (c + 1) * K:
    # each is computed once before the statement's instruction and taken back after it
    f = rvm.reversible.source(
        "def f(T: Array[float, 2], q: Array[float, 2], K: int, c: int):\n"
        "    T[c * K:(c + 1) * K, c] += np.exp(q[:, c])\n", {"Array": Array, "np": np})
    T, q = rng.normal(size=(6, 3)), rng.normal(size=(2, 3))
    p, name, _ = f.specialize((T, q, 2, 1))
    code = [str(ins) for ins in p.functions[name].code]
    # c * K, c + 1 and (c + 1) * K once each, the view's offset, its length (c + 1) * K -
    # c * K, the seven checks on both sides of the instruction (a run backwards meets the
    # second seven first) and their undoing: 31 instructions (71 when each check computed
    # its own operands)
    assert len(code) <= 31 and code.count(code[0]) == 1, code
    checks = [ins for ins in code if ins.startswith("ASSERT")]
    at = code.index(next(ins for ins in code if ins.startswith("VADD")))
    assert len(checks) == 14 and code[at - 9:at - 2] == code[at + 3:at + 10] == checks[:7]
    for engine in ("interp", "python", "native"):
        if engine == "native":
            pytest.importorskip("llvmlite")
        out = f(T, q, 2, 1, engine=engine)
        want = T.copy()
        want[2:4, 1] += np.exp(q[:, 1])    # (numpy's exp: rvm's may differ by a unit in
        np.testing.assert_allclose(out[0], want, rtol=1e-15, atol=1e-15)   # the last place)
        back = (~f)(*out, engine=engine)
        np.testing.assert_allclose(back[0], T, rtol=1e-15, atol=1e-15)
    g = rvm.grad(f, loss=(0, 2 * 3 + 1))(T, q, 2, 1)     # T[2, 1]
    want = np.zeros_like(q)
    want[0, 1] = np.exp(q[0, 1])
    np.testing.assert_allclose(g[1], want, rtol=1e-14)


def test_a_loop_around_an_array_instruction_is_not_a_counted_loop():
    # a pass costs the instruction's call and checks; a counted twin of the loop (its entry
    # test over every check it hoists) would be most of the function's code
    from rvm.engines.compiled import compiled
    f = rvm.reversible.source(
        "def f(C: Array[float, 2], x: Array[float]):\n"
        "    for i in range(C.shape[0]):\n"
        "        C[i, :] += np.exp(x)\n", {"Array": Array, "np": np})
    C, x = rng.normal(size=(3, 4)), rng.normal(size=4)
    p, _, _ = f.specialize((C, x))
    assert "_exact(" not in compiled(p, True, native=True).native_bodies
    pytest.importorskip("llvmlite")
    # (to rounding: numpy's exp of a whole array and of one element can differ in the last
    # bit, and C + exp(x) may cancel; rvm's engines agree to the bit)
    out = f(C, x, engine="native")[0]
    assert np.array_equal(out, f(C, x, engine="interp")[0])
    np.testing.assert_allclose(out, C + np.exp(x), rtol=0, atol=1e-15 * np.exp(x).max())


def on(engine: str, text: str):
    """A reversible function of arrays from source, for a test on `engine`."""
    if engine == "native":
        pytest.importorskip("llvmlite")
    return rvm.reversible.source(text, {"Array": Array})


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_an_integer_that_may_fail_is_worked_out_where_it_is_used(engine):
    # k // d is not computed before the statement's checks, nor where its loop makes no
    # pass: with n = 0 nothing happens; with n past the end the bounds check speaks first
    f = on(engine, "def f(I: Array[int], J: Array[int], k: int, d: int, n: int):\n"
                   "    I[0:n] += J[0:n] * (k // d)\n")
    out = f(np.arange(4), np.arange(4), 7, 0, 0, engine=engine)
    assert np.array_equal(out[0], np.arange(4))
    with pytest.raises(MachineError, match=r"needs n <= len\(I\), with n = 9"):
        f(np.arange(4), np.arange(4), 7, 0, 9, engine=engine)
    assert np.array_equal(f(np.arange(4), np.arange(4), 7, 2, 4, engine=engine)[0],
                          np.arange(4) * 4)


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_an_element_added_to_once_keeps_the_sign_of_zero(engine):
    # -0.0 - 0.0 is -0.0 (IEEE): a view that names no cell twice adds each value into its
    # own cell, on native code too (a sum from +0.0 is for a cell named twice)
    f = on(engine, "def f(y: Array[float], x: Array[float], C: Array[float, 2]):\n"
                   "    y -= x\n"
                   "    y -= 4.0 * x\n"
                   "    C[:, 0] -= x[0:2]\n")
    y, C = np.array([-0.0, -0.0, -0.0]), np.full((2, 2), -0.0)
    out = f(y, np.zeros(3), C, engine=engine)
    assert np.signbit(out[0]).all() and np.signbit(out[2]).all(), out


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_a_square_is_numpys_square_and_its_gradient_twice_the_operand(engine):
    f = rvm.reversible.source("def sq(s: float, y: Array[float], x: Array[float]):\n"
                              "    y += x ** 2\n"
                              "    s += np.sum((x - 1.5) ** 2)\n", {"Array": Array, "np": np})
    x = rng.normal(size=37) * 10.0 ** rng.uniform(-150, 150, size=37)
    _, y, _ = f(0.0, np.zeros(37), x, engine=engine)
    assert np.array_equal(y, x * x)
    g = rvm.grad(f, loss="s", engine=engine)(0.0, np.zeros(5), x[:5] / 1e150)[2]
    assert np.allclose(g, 2.0 * (x[:5] / 1e150 - 1.5), rtol=1e-14)


@pytest.mark.parametrize("engine", ["interp", "native"])
def test_numpys_arctan2_is_atan2_in_array_and_scalar_expressions(engine):
    f = rvm.reversible.source("def at(s: float, y: Array[float], x: Array[float], "
                              "w: Array[float]):\n"
                              "    y += np.arctan2(x, w)\n"
                              "    s += np.arctan2(x[0], w[0])\n", {"Array": Array, "np": np})
    x, w = rng.normal(size=9), rng.uniform(0.5, 2.0, size=9)
    s, y, _, _ = f(0.0, np.zeros(9), x, w, engine=engine)
    assert np.allclose(y, np.arctan2(x, w), rtol=1e-14) and s == math.atan2(x[0], w[0])
    assert "VADD.atan2" in ops_of(f, 0.0, np.zeros(9), x, w)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_a_statement_run_backwards_is_checked_before_it_changes_anything(engine):
    # an array instruction checks only the heap's bounds: run backwards, a slice past
    # y's end would subtract from z's cells (the next array) before a check after the
    # statement failed; the checks stand on both sides of it
    f = rvm.reversible.source("def f(y: Array[float], z: Array[float], x: Array[float], "
                              "a: int, n: int):\n    y[a:a + n] += x * 2.0\n",
                              {"Array": Array})
    program, name, _ = f.specialize((np.zeros(4), np.zeros(4), np.ones(3), 2, 3))
    m = rvm.Machine(program, engine=engine)
    with pytest.raises(MachineError, match=r"the slice y\[a:a \+ n\] ends past the end of y: "
                       r"it needs a \+ n <= len\(y\), with a \+ n = 5, len\(y\) = 4"):
        m.uncall(name, np.zeros(4), np.zeros(4), np.ones(3), 2, 3)
    z = next(b for b in m.bindings if b.name == "z")
    assert list(m.hf[z.base:z.base + 4]) == [0.0] * 4


def test_two_statements_on_a_line_whose_checks_look_alike_are_not_misnamed():
    # their temporaries are the same registers: a message could be the other statement's
    f = rvm.reversible.source("def f(y: Array[float], x: Array[float], a: int, b: int, "
                              "n: int):\n    y[a:a + n] += x; y[b:b + n] += x\n",
                              {"Array": Array})
    with pytest.raises(MachineError) as e:
        f(np.arange(6.0), np.ones(3), 0, 4, 3)
    assert "a + n" not in str(e.value) and "7" in str(e.value)


@pytest.mark.parametrize("body, where, message", [
    ("y += np.max(x, 0)", "2:10", "np.max is numpy's reduction (the largest element)"),
    ("s += np.min(x)", "2:10", "np.min is numpy's reduction (the smallest element)"),
    ("y += max(x, 0.5)", "2:10", "max() of arrays is an error in Python"),
    ("s += math.max(x[0], 1.0)", "2:10", "math.max is not a function of two numbers"),
    ("s += np.amax(x)", "2:10", "np.amax is numpy's reduction (the largest element)"),
])
def test_max_and_min_are_pythons_and_maximum_and_minimum_numpys(body, where, message):
    text = refused(f"def f(y: Array[float], x: Array[float], s: float):\n    {body}\n",
                   V, V, 0.0)
    assert re.search(f":{where}: error: ", text) and message in text, text


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_maximum_and_minimum_of_arrays_and_max_of_numbers(engine):
    f = rvm.reversible.source(
        "def f(y: Array[float], x: Array[float], z: Array[float], s: float, k: int, j: int):\n"
        "    y += np.maximum(x, z) - 2.0 * np.minimum(x, 0.5)\n"
        "    s += max(x[0], x[1]) + min(k, 3)\n"
        "    k += max(j, 7)\n", {"Array": Array, "np": np})
    x, z = np.array([0.1, 2.0, -3.0, 0.7]), np.array([0.5, -1.0, -2.0, 0.7])
    y, _, _, s, k, _ = f(np.zeros(4), x, z, 0.0, 2, 5, engine=engine)
    np.testing.assert_array_equal(y, np.maximum(x, z) - 2.0 * np.minimum(x, 0.5))
    assert s == 2.0 + 2 and k == 9
    back = (~f)(y, x, z, s, k, 5, engine=engine)
    assert np.array_equal(back[0], np.zeros(4)) and back[3:] == (0.0, 2, 5)
    g = rvm.grad(f, loss=(0, 3), engine=engine)(np.zeros(4), x, z, 0.0, 2, 5)
    # the tie at element 3 (x = z = 0.7) splits evenly
    assert g[1][3] == 0.5 and g[2][3] == 0.5


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_an_ancillas_tangent_summed_from_several_terms_is_freed_at_large_magnitudes(engine):
    """`y += x * z * x` goes through an ancilla block t = x * z; t's tangent is the sum of
    two terms (x' z + x z'), taken back out one at a time, which leaves a residue of
    their rounding (1.5e-8 at operands of 1e4, against a tol of 1e-8): a tangent cell's
    zero test when freed scales with the derivatives' magnitudes, as a derived
    register's does. (Refused with "FREE of a cell that is not zero" in 7 of 20 runs at
    1e4, 19 of 20 at 1e5.)"""
    f = rvm.reversible.source("def f(s: float, y: Array[float], x: Array[float], "
                              "z: Array[float]):\n"
                              "    y += x * z * x\n"
                              "    s += np.sum(y * z)\n", {"Array": Array, "np": np})
    for scale in (1e4, 1e5) * 5:
        x, z, dx, dz = (rng.normal(size=5) * scale for _ in range(4))
        args, dots = (0.0, np.zeros(5), x, z), (0.0, np.zeros(5), dx, dz)
        _, out = rvm.jvp(f, args, dots, engine=engine)
        assert np.allclose(out[1], 2 * x * z * dx + x * x * dz, rtol=1e-12, atol=0)
        hv = rvm.hvp(f, args, dots, loss="s", engine=engine)       # s = sum(x^2 z^2)
        assert np.allclose(hv[2], 2 * z * z * dx + 4 * x * z * dz, rtol=1e-9, atol=0)
        assert np.allclose(hv[3], 4 * x * z * dx + 2 * x * x * dz, rtol=1e-9, atol=0)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_a_tangent_of_a_tangent_frees_the_inner_tangents_cells_at_large_magnitudes(engine):
    """In a tangent of a tangent program the inner tangent's cells lie at 4a + 2 (the
    heap interleaved twice): they are derivatives too, tested as derived registers are
    (a skeptic found them refused, 10 of 10 runs at 1e5, with only odd cells scaled)."""
    f = rvm.reversible.source("def f(s: float, y: Array[float], x: Array[float], "
                              "z: Array[float]):\n"
                              "    y += x * z * x\n", {"Array": Array, "np": np})
    for scale in (1e5,) * 4:
        x, z, dx, dz = (rng.normal(size=5) * scale for _ in range(4))
        args = (0.0, np.zeros(5), x, z, 0.0, np.zeros(5), dx, dz)
        dots = (0.0, np.zeros(5), dz, dx, 0.0, np.zeros(5), dz, dx)
        _, out = rvm.jvp(rvm.tangent(f, engine=engine), args, dots, engine=engine)
        # y' = 2 x z dx + x^2 dz; its tangent along (dz, dx) for (x, z) and (dz, dx) for
        # (dx, dz): 2 (dz z + x dx) dx + 2 x z dz + 2 x dz dz + x^2 dx
        want = 2 * (dz * z + x * dx) * dx + 2 * x * z * dz + 2 * x * dz * dz + x * x * dx
        assert np.allclose(out[5], want, rtol=1e-9, atol=0)


@pytest.mark.parametrize("engine", EVERY_ENGINE)
def test_a_tangent_cell_left_far_from_zero_is_still_refused(engine):
    """The scaled zero test of a freed tangent cell accepts rounding, not a tangent the
    program failed to take back: an ancilla computed as x * x and uncomputed as x * z
    comes back to zero where z = x, its tangent along x (2x, then less x) does not."""
    f = rvm.reversible.source("def f(y: Array[float], x: Array[float], z: Array[float]):\n"
                              "    with ancilla(t=zeros(len(x))):\n"
                              "        t += x * x\n"
                              "        y += t\n"
                              "        t -= x * z\n",
                              {"Array": Array, "np": np, "ancilla": ancilla,
                               "zeros": zeros})
    x = np.array([1e4, 2e4, -3e4])
    f(np.zeros(3), x, x.copy(), engine=engine)          # z = x: the values come back
    with pytest.raises(MachineError, match="FREE of a cell that is not zero"):
        rvm.jvp(f, (np.zeros(3), x, x.copy()), (np.zeros(3), np.ones(3), np.zeros(3)),
                engine=engine)


@pytest.mark.parametrize("engine", ["interp", "native"])
def test_derived_programs_of_array_atan2_take_large_operands(engine):
    """atan2's partials divide by a*a + b*b: built as two accumulations into one
    temporary block, taken apart, a residue of the squares' rounding stayed (about 1e-8
    at operands of 1e4) and freeing the block failed ("FREE of a cell that is not
    zero") in the tangent, the adjoint and the Hessian-vector product; the sum is one
    instruction (the plus family), taken back exactly."""
    f = rvm.reversible.source("def at(s: float, y: Array[float], x: Array[float], "
                              "w: Array[float]):\n"
                              "    y += np.arctan2(x, w)\n"
                              "    s += np.sum(y * y)\n", {"Array": Array, "np": np})
    for scale in (1.0, 1e4, 1e8):
        x, w = rng.normal(size=6) * scale, rng.uniform(0.5, 2.0, size=6) * scale
        dx, dw = rng.normal(size=6), rng.normal(size=6)
        args, dots = (0.0, np.zeros(6), x, w), (0.0, np.zeros(6), dx, dw)
        r2 = x * x + w * w
        da, db = w / r2, -x / r2
        _, out = rvm.jvp(f, args, dots, engine=engine)
        assert np.allclose(out[1], da * dx + db * dw, rtol=1e-12, atol=0)
        grads = rvm.grad(f, loss="s", engine=engine)(*args)
        y = np.arctan2(x, w)
        assert np.allclose(grads[2], 2 * y * da, rtol=1e-12, atol=0)
        hv = rvm.hvp(f, args, dots, loss="s", engine=engine)
        yd = da * dx + db * dw      # d(2 y da)/dx . dx + ... by the product rule
        d2a_dx = -2 * x * w / r2 ** 2
        d2a_dw = (x * x - w * w) / r2 ** 2
        assert np.allclose(hv[2], 2 * yd * da + 2 * y * (d2a_dx * dx + d2a_dw * dw),
                           rtol=1e-9, atol=0)


def test_a_scalar_operands_gradient_sums_alike_on_every_engine():
    """The gradient a scalar operand of an array statement gets (c in `y += c * x`, and
    a scale's factor in `x *= c`) is a sum over the elements: the interpreter and the
    python engine took numpy's pairwise sum, native code a loop's, a last bit apart in
    about 1 of 100 cases. Every engine now adds the terms in turn, row by row."""
    from rvm.engines import native
    src = {"rvm": rvm, "np": np}
    k = rvm.reversible.source("def k(x: rvm.Array[float], c: float, y: rvm.Array[float], "
                              "s: float):\n    y += c * x\n    s += np.sum(y)\n", src)
    m = rvm.reversible.source("def m(x: rvm.Array[float], c: float, s: float):\n"
                              "    x *= c\n    s += np.sum(x)\n    x /= c\n", src)
    engines = ["interp", "python"] + (["native"] if native.available else [])
    rng = np.random.default_rng(0)
    for _ in range(150):
        x = rng.uniform(-3, 3, int(rng.integers(1, 40)))
        got = {(rvm.grad(k, loss="s", engine=e)(x, 1.15, np.zeros(len(x)), 0.0)[1],
                rvm.grad(m, loss="s", engine=e)(x, 1.15, 0.0)[1]) for e in engines}
        assert len(got) == 1, (x, got)
