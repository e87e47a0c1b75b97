"""The frontend examples: forward results against independent computations, the inverse
restores the inputs, gradients against finite differences, and the seeds' figures."""

import math
import pathlib
import sys

import numpy as np
import pytest

import rvm

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))

from bennett import bennett
from besselj import besselj, besselj_inplace
from complex_log import complex_log
from fib import rrfib
from iexp import iexp
from sparse_dot import random_csc, sparse_dot
from unitary import givens


def fd_grad(f, args, k, loss=0, h=1e-6):
    """Central finite difference of result[loss] with respect to scalar argument k."""
    up, down = list(args), list(args)
    up[k] += h
    down[k] -= h
    return (f(*up)[loss] - f(*down)[loss]) / (2 * h)


def series_j(nu, z, terms=40):
    return sum((-1) ** k * (z / 2) ** (2 * k + nu) / (math.factorial(k) * math.factorial(k + nu))
               for k in range(terms))


def test_fib():
    a, b = 1, 1
    for n in range(12):
        assert rrfib(0, n) == (a, n)
        assert (~rrfib)(a, n) == (0, n)
        a, b = b, a + b


@pytest.mark.parametrize("f", [besselj, besselj_inplace])
def test_bessel(f):
    for nu, z in [(2, 1.0), (0, 2.0), (3, 1.5), (1, -0.7)]:
        out = f(0.0, nu, z)
        assert out[0] == pytest.approx(series_j(nu, z), abs=1e-10)
        assert (~f)(*out) == pytest.approx((0.0, nu, z), abs=1e-14)
        g = rvm.grad(f, loss="out")(0.0, nu, z)
        assert g[0] == 1.0 and g[1] is None
        assert g[2] == pytest.approx(fd_grad(f, (0.0, nu, z), 2), abs=1e-7)
    assert abs(rvm.grad(f, loss="out")(0.0, 2, 1.0)[2] - 0.2102436) < 1e-7


def test_bessel_inplace_to_full_precision():
    g = rvm.grad(besselj_inplace, loss=0)(0.0, 5, 7.0)[2]
    # J5'(7) = (J4(7) - J6(7)) / 2
    assert g == pytest.approx((series_j(4, 7.0, 60) - series_j(6, 7.0, 60)) / 2, abs=1e-13)


def test_iexp():
    for x in (-2.0, 0.3, 1.6):
        out = iexp(0.0, x)
        assert out[0] == pytest.approx(math.exp(x), rel=1e-14)
        assert (~iexp)(*out) == pytest.approx((0.0, x), abs=1e-15)
    g = rvm.grad(iexp, loss="out")(0.0, 1.6)
    assert abs(g[1] - math.exp(1.6)) < 1e-8
    assert g[1] == pytest.approx(fd_grad(iexp, (0.0, 1.6), 1), rel=1e-7)


def test_complex_log():
    y = complex_log(0.5, -0.25, -1.5, 2.0)
    want = complex(0.5, -0.25) + np.log(complex(-1.5, 2.0))
    assert (y[0], y[1]) == pytest.approx((want.real, want.imag), rel=1e-14)
    assert (~complex_log)(*y) == pytest.approx((0.5, -0.25, -1.5, 2.0), rel=1e-14)
    args = (0.0, 0.0, -1.5, 2.0)
    for loss in (0, 1):
        g = rvm.grad(complex_log, loss=loss)(*args)
        for k in (2, 3):
            assert g[k] == pytest.approx(fd_grad(complex_log, args, k, loss), abs=1e-7)


def givens_reference(v, thetas):
    v, k = v.copy(), 0
    for i in range(len(v)):
        for j in range(i + 1, len(v)):
            c, s = math.cos(thetas[k]), math.sin(thetas[k])
            v[i], v[j] = v[i] * c - v[j] * s, v[i] * s + v[j] * c
            k += 1
    return v


def test_unitary_givens():
    rng = np.random.default_rng(3)
    v, th = rng.normal(size=5), rng.uniform(-3, 3, size=10)
    out, th2 = givens(v, th)
    assert np.allclose(out, givens_reference(v, th), rtol=1e-13)
    assert np.linalg.norm(out) == pytest.approx(np.linalg.norm(v), rel=1e-14)
    assert np.array_equal(th2, th)
    back, _ = (~givens)(out, th)
    assert np.allclose(back, v, rtol=1e-13)
    # d out[2] / d thetas against finite differences
    jac = rvm.jacobian(givens, outputs=[(0, 2)], wrt=[1])(v, th)[0]
    h = 1e-6
    for k in range(10):
        e = np.zeros(10)
        e[k] = h
        fd = (givens_reference(v, th + e)[2] - givens_reference(v, th - e)[2]) / (2 * h)
        assert jac[k] == pytest.approx(fd, abs=1e-7)


def test_bennett_time_space_tradeoff():
    k, n = 4, 4
    N = k ** n
    state = np.zeros(N + 1)
    state[0] = 1.0
    program, name, names = bennett.specialize((state, k, 0, N))
    fn = program.functions[name]
    unit = next(i for i, ins in enumerate(fn.code)
                if ins.op == "ADD.mul" and rvm.core.program.Imm(2.0) in ins.args)
    m = rvm.Machine(program)
    m.enter(name, state, k, 0, N, names=names)
    units, peak = 0, 0
    while True:
        fr = m.stack[-1]
        if fr.fn is fn and fr.index(fr.dir) == unit and fr.state % 2 == 0 and \
                fr.state // 2 < len(fn.code):
            units += 1
        if not m.step():
            break
        live = np.count_nonzero(np.frombuffer(m.read_cells(0, N + 1), dtype=np.float64))
        peak = max(peak, live)
    final = m.finish()[0]
    assert final[N] == 2.0 ** N and np.count_nonzero(final) == 2
    assert peak == n * (k - 1) + 2
    assert units == (2 * k - 1) ** n
    back = (~bennett)(final, k, 0, N)[0]
    assert np.array_equal(back, state)
    # d state[N] / d state[i] = 2^(N - i), through every recursive call and uncall
    g = rvm.grad(bennett, loss=(0, N))(state, k, 0, N)[0]
    assert np.array_equal(g, 2.0 ** (N - np.arange(N + 1)))


def test_sparse_dot_1000_by_1000():
    rng = np.random.default_rng(7)
    A, ap, ar, av = random_csc(rng, 1000, 1000, 0.05)
    B, bp, br, bv = random_csc(rng, 1000, 1000, 0.05)
    args = (0.25, ap, ar, av, bp, br, bv, 1000)
    values, grads = rvm.value_and_grad(sparse_dot, loss="out")(*args)
    assert values[0] == pytest.approx(0.25 + np.sum(A * B), rel=1e-12)
    assert all(np.array_equal(x, y) for x, y in zip(values[1:7], args[1:7]))
    cols_a = np.repeat(np.arange(1000), np.diff(ap))
    cols_b = np.repeat(np.arange(1000), np.diff(bp))
    assert np.allclose(grads[3], B[ar, cols_a]) and np.allclose(grads[6], A[br, cols_b])
    assert grads[1] is None and grads[0] == 1.0
    back = (~sparse_dot)(*values)
    assert back[0] == pytest.approx(0.25, abs=1e-9)


def test_graph_embedding_by_adam_across_dimensions():
    """Adam on rvm.grad: the loss stays far above zero below k = 5 and reaches zero at
    k = 5, with non-edges sqrt(2) times as long as edges."""
    pytest.importorskip("llvmlite")
    from graph_embedding import sweep
    (k3, loss3, _), (k5, loss5, ratio5) = sweep(ks=(3, 5), engine="native")
    assert (k3, k5) == (3, 5)
    assert loss3 > 0.05
    assert loss5 < 1e-10 and abs(ratio5 - math.sqrt(2)) < 1e-6
