"""rvm.lib, the standard library written in reversible Python: values against numpy
closed forms, the inverse restores the inputs, gradients against closed forms and finite
differences, Bennett's pebble counts measured on the machine, one native run per piece."""

import math
import pathlib
import sys
import warnings

import numpy as np
import pytest

import rvm
from rvm import Array, ancilla, compute, zeros
from rvm.lib import (
    argsort,
    bennett,
    csr_dot,
    csr_matmat,
    csr_matvec,
    csr_rmatvec,
    leapfrog,
    logsumexp,
    norm,
    pebble_counts,
    sort,
)

ROOT = pathlib.Path(__file__).resolve().parent.parent
sp = pytest.importorskip("scipy.sparse")


def fd(f, x, h=1e-6):
    """Central differences of the scalar f at the array x, one per element."""
    out = np.zeros(len(x))
    for i in range(len(x)):
        e = np.zeros(len(x))
        e[i] = h
        out[i] = (f(x + e) - f(x - e)) / (2 * h)
    return out


# ------------------------------------------------------------------ Bennett

@rvm.reversible
def double(y: Array[float], s: Array[float]):
    for i in range(len(s)):
        y[i] += 2.0 * s[i]


@rvm.reversible
def swirl(y: Array[float], s: Array[float]):
    """A nonlinear step on 2-vectors: y += (s0 + 0.1 sin s1, s1 + 0.1 cos s0)."""
    y[0] += s[0] + 0.1 * sin(s[1])
    y[1] += s[1] + 0.1 * cos(s[0])


def swirl_np(s, times):
    for _ in range(times):
        s = np.array([s[0] + 0.1 * math.sin(s[1]), s[1] + 0.1 * math.cos(s[0])])
    return s


def test_bennett_runs_the_step_k_to_the_n_times():
    x = np.array([0.3, -0.7])
    for k, n in [(2, 3), (3, 2), (4, 1), (2, 0)]:
        out, back = bennett(swirl, np.zeros(2), x, k, n)[1:3]
        assert np.allclose(out, swirl_np(x, k ** n), rtol=1e-13)
        assert np.array_equal(back, x)
        again = (~bennett)(swirl, out, x, k, n)
        assert np.allclose(again[1], 0.0, atol=1e-15) and np.array_equal(again[2], x)
    y = bennett(double, np.zeros(3), np.array([1.0, -0.5, 0.25]), 4, 4)[1]
    assert np.array_equal(y, 2.0 ** 256 * np.array([1.0, -0.5, 0.25]))


@pytest.mark.parametrize("k,n", [(2, 1), (2, 4), (3, 3), (4, 4), (5, 2)])
def test_bennett_pebble_game_counts_measured_on_the_machine(k, n):
    """The step runs (2k - 1)^n times, forwards or backwards, and at most n(k - 1) + 2
    states are live at once: measured by stepping the machine (step frames entered;
    state-sized blocks on the heap), not computed from the formula."""
    steps, peak = pebble_counts(double, np.zeros(2), np.array([1.0, 2.0]), k, n)
    assert steps == (2 * k - 1) ** n
    assert peak == n * (k - 1) + 2


def test_bennett_pebble_counts_see_a_naive_schedule():
    """The measurement is not the formula: the same counter on k^n steps run one after
    another (k = k^n sectors of one step, n = 1) sees 2 k^n - 1 steps and k^n + 1 states."""
    steps, peak = pebble_counts(double, np.zeros(1), np.array([1.0]), 9, 1)
    assert (steps, peak) == (17, 10)


def test_bennett_gradient_against_finite_differences():
    x = np.array([0.3, -0.7])
    g = rvm.grad(bennett, loss=(1, 0))(swirl, np.zeros(2), x, 2, 3)
    assert g[0] is None and g[3] is None
    want = fd(lambda z: bennett(swirl, np.zeros(2), z, 2, 3)[1][0], x)
    assert np.allclose(g[2], want, atol=1e-8)
    g = rvm.grad(bennett, loss=(1, 1))(double, np.zeros(2), x, 3, 2)
    assert np.array_equal(g[2], [0.0, 2.0 ** 9])


def test_bennett_refuses_too_few_sectors():
    with pytest.raises(rvm.RvmError, match="k >= 2"):
        bennett(double, np.zeros(1), np.array([1.0]), 1, 3)
    with pytest.raises(rvm.RvmError, match="len\\(out\\) == len\\(x\\)"):
        bennett(double, np.zeros(2), np.array([1.0]), 2, 3)


# ------------------------------------------------------------------ leapfrog

@rvm.reversible
def spring(a: Array[float], x: Array[float], w2: float):
    for i in range(len(x)):
        a[i] -= w2 * x[i]


@rvm.reversible
def pendulum(a: Array[float], x: Array[float], g: Array[float]):
    a[0] -= g[0] * sin(x[0])


def verlet_np(accel, x, v, dt, nsteps):
    x, v = x.copy(), v.copy()
    for _ in range(nsteps):
        v = v + 0.5 * dt * accel(x)
        x = x + dt * v
        v = v + 0.5 * dt * accel(x)
    return x, v


def test_leapfrog_values_and_uncall():
    x0, v0, w2, dt, n = np.array([1.0, 0.0]), np.array([0.0, 1.0]), 4.0, 0.01, 300
    _, x, v, p, dt2, n2 = leapfrog(spring, x0, v0, w2, dt, n)
    assert (p, dt2, n2) == (w2, dt, n)
    rx, rv = verlet_np(lambda z: -w2 * z, x0, v0, dt, n)
    assert np.allclose(x, rx, rtol=1e-12, atol=1e-14) and np.allclose(v, rv, rtol=1e-12)
    # against the harmonic oscillator's exact solution, to the method's O(dt^2)
    t, w = dt * n, 2.0
    exact = np.array([math.cos(w * t), math.sin(w * t) / w])
    assert np.allclose(x, exact, atol=2 * dt ** 2)
    back = (~leapfrog)(spring, x, v, w2, dt, n)
    assert np.allclose(back[1], x0, atol=1e-13) and np.allclose(back[2], v0, atol=1e-13)
    same = leapfrog(spring, x0, v0, w2, dt, 0)
    assert np.array_equal(same[1], x0) and np.array_equal(same[2], v0)


def test_leapfrog_gradients_against_finite_differences():
    x0, v0, g, dt, n = np.array([1.2]), np.array([0.3]), np.array([9.81]), 0.02, 50

    def final_x(x, v, gg, h):
        return leapfrog(pendulum, x, v, gg, h, n)[1][0]

    grads = rvm.grad(leapfrog, loss=(1, 0))(pendulum, x0, v0, g, dt, n)
    assert grads[0] is None and grads[5] is None
    assert np.allclose(grads[1], fd(lambda z: final_x(z, v0, g, dt), x0), atol=1e-7)
    assert np.allclose(grads[2], fd(lambda z: final_x(x0, z, g, dt), v0), atol=1e-7)
    assert np.allclose(grads[3], fd(lambda z: final_x(x0, v0, z, dt), g), atol=1e-7)
    h = 1e-7
    want = (final_x(x0, v0, g, dt + h) - final_x(x0, v0, g, dt - h)) / (2 * h)
    assert grads[4] == pytest.approx(want, abs=1e-6)


# ------------------------------------------------------------------ logsumexp, norm

def test_logsumexp_values_uncall_gradient():
    rng = np.random.default_rng(1)
    for x in [rng.normal(size=7), np.array([2.5]), np.array([1.0, 800.0, 799.0, -3.0]),
              np.array([0.5, 0.5, 0.5])]:
        m = x.max()
        want = m + math.log(np.sum(np.exp(x - m)))
        out, back = logsumexp(0.25, x)
        assert out == pytest.approx(0.25 + want, rel=1e-14) and np.array_equal(back, x)
        assert (~logsumexp)(out, x)[0] == pytest.approx(0.25, abs=1e-12)
        g = rvm.grad(logsumexp, loss="out")(0.0, x)[1]
        assert np.allclose(g, np.exp(x - m) / np.sum(np.exp(x - m)), rtol=1e-12,
                           atol=1e-15)
    x = rng.normal(size=5)
    assert np.allclose(rvm.grad(logsumexp, loss="out")(0.0, x)[1],
                       fd(lambda z: logsumexp(0.0, z)[0], x), atol=1e-8)
    with pytest.raises(rvm.RvmError, match="len\\(x\\) > 0"):
        logsumexp(0.0, np.zeros(0))


def test_norm_values_uncall_gradient():
    rng = np.random.default_rng(2)
    x = rng.normal(size=6)
    out, back = norm(1.0, x)
    assert out == pytest.approx(1.0 + np.linalg.norm(x), rel=1e-14)
    assert np.array_equal(back, x)
    assert (~norm)(out, x)[0] == pytest.approx(1.0, rel=1e-14)
    g = rvm.grad(norm, loss="out")(0.0, x)[1]
    assert np.allclose(g, x / np.linalg.norm(x), rtol=1e-13)
    assert np.allclose(g, fd(lambda z: norm(0.0, z)[0], x), atol=1e-8)
    assert norm(0.0, np.array([3.0, 4.0]))[0] == 5.0


# ------------------------------------------------------------------ sorting

def test_sort_and_argsort_against_numpy():
    rng = np.random.default_rng(3)
    for n in list(range(1, 18)) + [31, 64]:
        x = rng.integers(0, 4, n).astype(float)          # with ties
        out, back = sort(np.zeros(n), x, engine="python")
        assert np.array_equal(out, np.sort(x)) and np.array_equal(back, x)
        perm = argsort(np.zeros(n, np.int64), x, engine="python")[0]
        assert np.array_equal(perm, np.argsort(x, kind="stable"))
    x = rng.normal(size=9)
    assert np.allclose((~sort)(np.sort(x) + 1.0, x)[0], np.ones(9), rtol=1e-15)


def test_sort_is_a_sorting_network_zero_one_principle():
    """Every 0-1 input of length 7 comes out sorted: then every input does (Knuth's 0-1
    principle for comparator networks)."""
    n = 7
    for bits in range(2 ** n):
        x = np.array([(bits >> i) & 1 for i in range(n)], dtype=float)
        assert np.array_equal(sort(np.zeros(n), x, engine="python")[0], np.sort(x))


@rvm.reversible
def weighted_sorted(out: float, w: Array[float], x: Array[float]):
    with ancilla(s=zeros(len(x))):
        with compute() as r:
            sort(s, x)
        for i in range(len(x)):
            out += w[i] * s[i] * s[i]
        ~r


def test_sort_gradient():
    rng = np.random.default_rng(4)
    x, w = rng.normal(size=10), rng.normal(size=10)
    g = rvm.grad(weighted_sorted, loss="out")(0.0, w, x)[2]     # (the default engine)
    rank = np.argsort(np.argsort(x))
    assert np.allclose(g, 2 * w[rank] * x, rtol=1e-13)
    assert np.allclose(g, fd(lambda z: weighted_sorted(0.0, w, z, engine="python")[0], x),
                       atol=1e-7)
    jac = rvm.jacobian(sort, outputs=[(0, i) for i in range(10)], wrt=[1],
                       engine="python")(np.zeros(10), x)
    assert np.array_equal(jac, np.eye(10)[np.argsort(x)])


# ------------------------------------------------------------------ sparse

def csr(m, n, density, seed):
    A = sp.random(m, n, density=density, format="csr", random_state=seed)
    return A, (A.data, A.indices.astype(np.int64), A.indptr.astype(np.int64))


def test_csr_products_against_scipy():
    rng = np.random.default_rng(5)
    A, a = csr(40, 30, 0.1, 1)
    x, z, B = rng.normal(size=30), rng.normal(size=40), rng.normal(size=(30, 3))
    y0 = rng.normal(size=40)
    out = csr_matvec(y0, *a, x)
    assert np.allclose(out[0], y0 + A @ x, rtol=1e-13)
    assert all(np.array_equal(u, v) for u, v in zip(out[1:], (*a, x)))
    assert np.allclose((~csr_matvec)(*out)[0], y0, atol=1e-14)
    assert np.allclose(csr_rmatvec(np.zeros(30), *a, z)[0], A.T @ z, rtol=1e-13)
    C = csr_matmat(np.zeros((40, 3)), *a, B)[0]
    assert np.allclose(C, A @ B, rtol=1e-13)
    assert np.allclose((~csr_matmat)(C, *a, B)[0], 0.0, atol=1e-14)
    Bs, b = csr(40, 30, 0.1, 2)
    d = csr_dot(0.5, *a, *b, 30)[0]
    assert d == pytest.approx(0.5 + A.multiply(Bs).sum(), rel=1e-13)


def test_csr_gradients():
    rng = np.random.default_rng(6)
    A, (data, indices, indptr) = csr(6, 5, 0.4, 3)
    x = rng.normal(size=5)
    rows = np.repeat(np.arange(6), np.diff(indptr))
    jac = rvm.jacobian(csr_matvec, outputs=[(0, i) for i in range(6)], wrt=[1, 4])(
        np.zeros(6), data, indices, indptr, x)
    d_data = np.zeros((6, len(data)))
    d_data[rows, np.arange(len(data))] = x[indices]
    assert np.allclose(jac[:, :len(data)], d_data) and np.allclose(jac[:, len(data):],
                                                                   A.toarray())
    # the NiLang paper's sparse dot: d/dA_values = B at A's places, and the other way round
    Bs, (bd, bi, bp) = csr(6, 5, 0.5, 4)
    g = rvm.grad(csr_dot, loss="out")(0.0, data, indices, indptr, bd, bi, bp, 5)
    assert np.allclose(g[1], Bs.toarray()[rows, indices])
    assert np.allclose(g[4], A.toarray()[np.repeat(np.arange(6), np.diff(bp)), bi])
    assert np.allclose(g[1], fd(lambda v: csr_dot(0.0, v, indices, indptr, bd, bi, bp,
                                                  5)[0], data), atol=1e-8)


def test_csr_dot_1000_by_1000_at_density_0_05():
    """The NiLang paper's benchmark size: value and both gradients against scipy."""
    A, a = csr(1000, 1000, 0.05, 7)
    B, b = csr(1000, 1000, 0.05, 8)
    values, g = rvm.value_and_grad(csr_dot, loss="out")(0.0, *a, *b, 1000)
    assert values[0] == pytest.approx(A.multiply(B).sum(), rel=1e-12)
    rows_a = np.repeat(np.arange(1000), np.diff(a[2]))
    rows_b = np.repeat(np.arange(1000), np.diff(b[2]))
    assert np.allclose(g[1], B[rows_a, a[1]].A1) and np.allclose(g[4], A[rows_b, b[1]].A1)


# ------------------------------------------------------------------ native code

def test_the_library_on_native_code():
    pytest.importorskip("llvmlite")
    rng = np.random.default_rng(9)
    x = rng.normal(size=9)
    A, a = csr(8, 9, 0.3, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # no fallback to another engine
        assert logsumexp(0.0, x, engine="native")[0] == pytest.approx(
            np.log(np.sum(np.exp(x))), rel=1e-14)
        assert norm(0.0, x, engine="native")[0] == pytest.approx(np.linalg.norm(x))
        assert np.array_equal(sort(np.zeros(9), x, engine="native")[0], np.sort(x))
        assert np.allclose(csr_matvec(np.zeros(8), *a, x, engine="native")[0], A @ x)
        lf = leapfrog(spring, np.array([1.0]), np.array([0.0]), 1.0, 0.1, 10,
                      engine="native")
        assert np.allclose(lf[1], verlet_np(lambda z: -z, np.array([1.0]),
                                            np.array([0.0]), 0.1, 10)[0], rtol=1e-13)
        g = rvm.grad(logsumexp, loss="out", engine="native")(0.0, x)[1]
        assert np.allclose(g, np.exp(x) / np.sum(np.exp(x)), rtol=1e-12)


# ------------------------------------------------------------------ the frontend

@rvm.reversible
def grow(n: int):
    n += 1


@rvm.reversible
def takes_a_length(out: float, x: Array[float]):
    grow(len(x))


@rvm.reversible
def length_then_ancilla(out: float, x: Array[float]):
    with ancilla(k=0):
        with compute() as r:
            takes_len(k, len(x))
        with ancilla(w=zeros(len(x))):
            for i in range(len(x)):
                out += w[i] + x[i] * k
        ~r


@rvm.reversible
def takes_len(k: int, n: int):
    k += n


def test_len_passed_to_a_call_is_a_copy():
    """len(x) passed to a call goes through a temporary, like any expression: before, the
    callee got x's own length register (and could change it), and the register was
    then handed out again as a free temporary (an ALLOC into x's length)."""
    out = length_then_ancilla(0.0, np.array([1.0, 2.0, 3.0]))
    assert out[0] == pytest.approx(18.0) and np.array_equal(out[1], [1.0, 2.0, 3.0])
    with pytest.raises(rvm.RvmError):
        takes_a_length(0.0, np.array([1.0, 2.0]))


def test_files_that_use_the_library_compile_without_running(tmp_path):
    path = tmp_path / "uses_lib.py"
    path.write_text("import rvm\nfrom rvm import Array\nfrom rvm.lib import norm\n\n"
                    "@rvm.reversible\ndef f(out: float, x: Array[float]):\n"
                    "    norm(out, x)\n")
    program = rvm.load(path)
    assert {"f", "norm"} <= set(program.functions)
    m = rvm.Machine(program)
    assert m.call("f", 0.0, np.array([3.0, 4.0]))[0] == 5.0
    bad = tmp_path / "bad.py"
    bad.write_text("import rvm\nfrom rvm.nothing import f\n\n@rvm.reversible\n"
                   "def g(x: float):\n    x += 1.0\n")
    with pytest.raises(rvm.CompileError, match=r"no module rvm\.nothing"):
        rvm.load(bad)


# ------------------------------------------------------------------ examples

@pytest.mark.parametrize("name", ["lib_bennett", "lib_leapfrog", "lib_reductions",
                                  "lib_sorting", "lib_sparse"])
def test_examples_run(name):
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        module = __import__(name)
        module.main()
    finally:
        sys.path.remove(str(ROOT / "examples"))
