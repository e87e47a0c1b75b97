"""rvm.to_jax and rvm.to_torch: rvm functions inside JAX and PyTorch, differentiated by
rvm's own programs (the adjoint for reverse mode, the tangent for forward mode, the
second-order programs for Hessians), batched by rvm.vmap, on every engine; checked
against closed forms and rvm's own transforms."""

import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import rvm
from rvm.core.errors import InvertibilityError, UsageError
from rvm.engines import native
from rvm.interop._common import Fn

jax = pytest.importorskip("jax")
torch = pytest.importorskip("torch")
jnp = jax.numpy

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from besselj import besselj_inplace  # noqa: E402

ENGINES = ["interp", "python"] + (["native"] if native.available else [])
# second-order programs compile natively in about 10-20 s from a cold cache (so do the
# gradient programs of the heap-ancilla functions, and 200 Adam steps of the Bessel layer
# take about 6 s there): those tests' native runs are marked slow
SLOW_NATIVE = ["interp", "python"] + ([pytest.param("native", marks=pytest.mark.slow)]
                                      if native.available else [])
F64 = torch.float64


@rvm.reversible
def quad(out: float, x: float, y: float):
    """out += 2x^2 + 3xy + 4y^2: gradient (4x + 3y, 3x + 8y), Hessian [[4, 3], [3, 8]]."""
    out += 2 * x * x + 3 * x * y + 4 * y * y


@rvm.reversible
def powsum(out: float, x: float, n: int):
    """out += x^n by n multiplications: an integer argument (a loop bound)."""
    with rvm.ancilla(p=1.0):
        with rvm.compute() as c:
            for i in range(n):  # noqa: B007
                p *= x  # noqa: F821 (frontend syntax)
        out += p
        ~c  # noqa: B018


@rvm.reversible
def leaks(x: float, y: float):
    """Fails its invertibility check: the ancilla is not restored."""
    with rvm.ancilla(a=0.0):
        a += x  # noqa: F821 (frontend syntax)
        y += a


DOT = rvm.load(str(ROOT / "asm" / "arrays.rasm"))["dot"]     # (x, y, out): out += x . y


@pytest.fixture(scope="module", autouse=True)
def x64():
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.fixture
def calls(monkeypatch):
    """Which rvm programs ran: (kind, batched) per host call, kind as 'f',
    'tangent(f)', 'adjoint(f)', 'tangent(adjoint(f))', ..."""
    seen = []
    host, scalars = Fn.host, Fn.scalars

    def note(fn, batched):
        kinds = []
        while fn.kind is not None:
            kinds.append(fn.kind)
            fn = fn.base
        seen.append(("".join(k + "(" for k in kinds) + "f" + ")" * len(kinds), batched))

    def spy_host(self, plan, *arrays):
        note(self, plan.batched is not None)
        return host(self, plan, *arrays)

    def spy_scalars(self, kinds, *values):
        note(self, False)
        return scalars(self, kinds, *values)

    monkeypatch.setattr(Fn, "host", spy_host)
    monkeypatch.setattr(Fn, "scalars", spy_scalars)
    return seen


@pytest.fixture
def alone(monkeypatch):
    """How many rows of batches ran one by one (a call per row, the adjoint's gradient-mode
    fallback included) rather than in one native batch loop: a list of one count."""
    count = [0]
    batch = Fn.batch

    def counted(call):
        def row(*values):
            count[0] += 1
            return call(*values)
        return row

    def spy(self, args, axes, size):
        call, fallback = self.call_fn, self.fallback
        self.call_fn = counted(call)
        self.fallback = lambda kinds: (lambda f: f and counted(f))(fallback(kinds))
        try:
            return batch(self, args, axes, size)
        finally:
            self.call_fn = call
            del self.fallback
    monkeypatch.setattr(Fn, "batch", spy)
    return count


def grad_quad(x, y):
    return 4 * x + 3 * y, 3 * x + 8 * y


# ---------------------------------------------------------------------------- JAX

@pytest.fixture(scope="module")
def jquad():
    """quad on each engine, and its jitted derivatives (compiled once for the module)."""
    out = {}
    for engine in ENGINES:
        F = rvm.to_jax(quad, engine=engine)

        def loss(x, y, F=F):
            return F(0.0, x, y)[0]
        out[engine] = dict(F=F, loss=loss, grad=jax.jit(jax.grad(loss, argnums=(0, 1))),
                           hess=jax.jit(jax.hessian(loss, argnums=(0, 1))))
    return out


def test_import_rvm_imports_neither_jax_nor_torch():
    code = "import sys, rvm; rvm.to_jax; print('jax' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_reverse_mode_runs_the_adjoint_program(engine, jquad, calls):
    F, loss = jquad[engine]["F"], jquad[engine]["loss"]
    values = F(0.0, 3.0, 4.0)
    assert [float(v) for v in values] == [118.0, 3.0, 4.0]
    calls.clear()
    v, g = jax.value_and_grad(loss, argnums=(0, 1))(3.0, 4.0)
    assert float(v) == 118.0 and [float(a) for a in g] == list(grad_quad(3.0, 4.0))
    assert ("adjoint(f)", False) in calls and not any("tangent" in k for k, _ in calls)
    _, vjp = jax.vjp(lambda x, y: F(0.0, x, y), 3.0, 4.0)
    assert [float(a) for a in vjp((1.0, 0.0, 0.0))] == [24.0, 41.0]
    assert [float(a) for a in vjp((0.0, 1.0, 0.0))] == [1.0, 0.0]     # x's own final value
    assert np.allclose(jax.jacrev(lambda v: jnp.stack(F(0.0, v[0], v[1])))(
        jnp.array([3.0, 4.0])), [[24.0, 41.0], [1.0, 0.0], [0.0, 1.0]])
    # the same numbers as rvm's own gradient
    assert rvm.grad(quad, loss="out", engine=engine)(0.0, 3.0, 4.0)[1:] == (24.0, 41.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_forward_mode_runs_the_tangent_program(engine, jquad, calls):
    loss = jquad[engine]["loss"]
    calls.clear()
    v, t = jax.jvp(loss, (3.0, 4.0), (1.0, 2.0))
    assert float(v) == 118.0 and float(t) == 24.0 + 2 * 41.0
    assert calls == [("f", False), ("tangent(f)", False)]
    assert [float(a) for a in jax.jacfwd(loss, argnums=(0, 1))(3.0, 4.0)] == [24.0, 41.0]
    assert all(k != "adjoint(f)" for k, _ in calls)
    assert rvm.jvp(quad, (0.0, 3.0, 4.0), (0.0, 1.0, 2.0))[1][0] == float(t)


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_jax_second_derivatives_run_the_second_order_programs(engine, jquad, calls):
    calls.clear()
    H = np.array(jquad[engine]["hess"](3.0, 4.0))
    assert np.array_equal(H, [[4.0, 3.0], [3.0, 8.0]])
    assert ("tangent(adjoint(f))", True) in calls          # jacfwd of jacrev, one batch
    loss = jquad[engine]["loss"]
    calls.clear()
    assert float(jax.grad(lambda x: jax.grad(loss)(x, 4.0))(3.0)) == 4.0   # grad of grad
    assert ("adjoint(tangent(adjoint(f)))", False) in calls or \
        ("adjoint(adjoint(f))", False) in calls
    # J_2'' at 1, as rvm.hvp gives it (exact-inverse Bessel function, an integer order)
    J = rvm.to_jax(besselj_inplace, engine=engine)
    h = jax.hessian(lambda z: J(0.0, 2, z)[0])(1.0)
    assert float(h) == pytest.approx(
        rvm.hvp(besselj_inplace, (0.0, 2, 1.0), (0.0, None, 1.0), loss=0)[2], abs=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_jit_and_vmap_as_one_rvm_batch(engine, jquad, calls, alone):
    g = jquad[engine]["grad"]
    assert [float(a) for a in g(3.0, 4.0)] == [24.0, 41.0]
    assert [float(a) for a in g(1.0, -1.0)] == list(grad_quad(1.0, -1.0))
    xs, ys = np.linspace(-1, 1, 5), np.linspace(2, 3, 5)
    calls.clear()
    gx, gy = jax.jit(jax.vmap(jax.grad(jquad[engine]["loss"], argnums=(0, 1))))(xs, ys)
    assert np.allclose(gx, 4 * xs + 3 * ys) and np.allclose(gy, 3 * xs + 8 * ys)
    assert calls == [("adjoint(f)", True)]    # one batch, no loop (the values: not used)
    # natively, one batch loop: no row runs by itself (other engines loop, as rvm.vmap)
    assert alone == [0 if engine == "native" else 5]
    calls.clear()
    vs = jax.vmap(jax.vmap(jquad[engine]["loss"]))(xs.reshape(5, 1) + ys, np.ones((5, 5)))
    assert vs.shape == (5, 5) and len(calls) == 1           # nested vmaps: one batch
    ref = rvm.vmap(quad, in_axes=[None, 0, 0])(0.0, xs, ys)[0]
    assert np.allclose(jax.vmap(jquad[engine]["loss"])(xs, ys), ref)
    # a parameter shared by the rows gets the sum of their gradients
    s = jax.grad(lambda x: jax.vmap(jquad[engine]["loss"], (None, 0))(x, ys).sum())(2.0)
    assert float(s) == pytest.approx(np.sum(4 * 2.0 + 3 * ys))


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_integers_are_not_differentiated(engine):
    P = rvm.to_jax(powsum, engine=engine)
    # a traced loop bound is fine: the host callback sees concrete values
    f = jax.jit(lambda x, n: P(0.0, x, n)[0])
    assert float(f(2.0, 5)) == 32.0 and float(f(2.0, 3)) == 8.0
    _, vjp = jax.vjp(lambda x, n: P(0.0, x, n), 2.0, 5)
    gx, gn = vjp((1.0, 0.0, np.zeros((), jax.dtypes.float0)))
    assert float(gx) == 5 * 2.0 ** 4 and gn.dtype == jax.dtypes.float0
    (_, _, n_out), (_, _, n_dot) = jax.jvp(lambda x: P(0.0, x, 5), (2.0,), (1.0,))
    assert int(n_out) == 5 and n_dot.dtype == jax.dtypes.float0


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_float32_rule(engine):
    """float32 in: rvm computes in float64, results and gradients come back float32."""
    F = rvm.to_jax(quad, engine=engine)
    x, y = np.float32(0.1), np.float32(0.7)
    out = F(np.float32(0.0), x, y)
    assert all(o.dtype == jnp.float32 for o in out)
    exact = 2 * float(x) ** 2 + 3 * float(x) * float(y) + 4 * float(y) ** 2
    assert float(out[0]) == float(np.float32(exact))
    g = jax.grad(lambda x: F(np.float32(0.0), x, y)[0])(x)
    assert g.dtype == jnp.float32 and float(g) == float(np.float32(4 * float(x) + 3 * float(y)))
    # under jit too (XLA's host callback copies out exactly the bytes of each result)
    out = jax.jit(F)(np.float32(0.0), x, y)
    assert [o.dtype for o in out] == [jnp.float32] * 3 and float(out[0]) == float(np.float32(exact))
    P = jax.jit(rvm.to_jax(powsum, engine=engine))
    out = P(np.float32(0.5), np.float32(2.0), np.int32(3))
    assert (out[0].dtype, out[2].dtype) == (jnp.float32, jnp.int32)
    assert (float(out[0]), int(out[2])) == (8.5, 3)
    # bfloat16 (ml_dtypes' type, numpy kind 'V') converts to float64 as float32 does
    b = jnp.bfloat16(0.5)
    out = F(jnp.bfloat16(0.0), b, jnp.bfloat16(1.0))
    assert [o.dtype for o in out] == [jnp.bfloat16] * 3 and float(out[0]) == 6.0
    assert float(jax.grad(lambda x: F(0.0, x, 1.0)[0])(b)) == 5.0
    assert jax.jit(jax.vmap(lambda x: F(0.0, x, 1.0)[0]))(jnp.ones(3, jnp.bfloat16)).tolist() \
        == [9.0] * 3


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_arrays(engine):
    D = rvm.to_jax(DOT, engine=engine)
    x, y = jnp.array([1.0, 2.0, 3.0]), jnp.array([4.0, 5.0, -6.0])
    assert float(D(x, y, 0.5)[2]) == 0.5 + 4 + 10 - 18
    gx, gy = jax.jit(jax.grad(lambda x, y: D(x, y, 0.5)[2], argnums=(0, 1)))(x, y)
    assert np.array_equal(gx, y) and np.array_equal(gy, x)
    jx = jax.jacfwd(lambda x: D(x, y, 0.5)[2])(x)
    assert np.array_equal(jx, y)
    rows = jax.vmap(lambda x: D(x, y, 0.0)[2])(jnp.eye(3))
    assert np.array_equal(rows, y)


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_bad_input_is_named(engine):
    Q = rvm.to_jax(quad, engine=engine)
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) holds booleans"):
        Q(0.0, True, 1.0)
    with pytest.raises(UsageError, match=r"argument 2 \(`y`\) holds complex"):
        Q(0.0, 1.0, 1j)
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) has shape \(2, 2, 2\)"):
        Q(0.0, np.zeros((2, 2, 2)), 1.0)
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) is str"):
        Q(0.0, "x", 1.0)
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) is NoneType, not a number"):
        Q(0.0, None, 1.0)
    with pytest.raises(UsageError, match=r"argument 2 \(`y`\) is object, not a number"):
        Q(0.0, 1.0, object())
    # an integer array where the function takes an array of floats (and the reverse)
    S = rvm.to_jax(sin_squares, engine=engine)
    for ints in (np.arange(3), jnp.arange(3, dtype=jnp.int32)):
        with pytest.raises(UsageError, match=r"to_jax\(sin_squares\): argument 1 \(`x`\) is "
                           r"an array of floats; got int(64|32)"):
            S(0.0, ints)
    with pytest.raises(rvm.RvmError, match=r"argument x of isum is declared Array\[int"):
        rvm.to_jax(isum, engine=engine)(0, np.ones(3))
    with pytest.raises(rvm.RvmError, match="argument n of powsum is declared int, got float"):
        rvm.to_jax(powsum, engine=engine)(0.0, 2.0, 3.0)
    with pytest.raises(UsageError, match=r"to_jax\(dot\): argument 2 is a float parameter; got "
                                         "int64"):
        rvm.to_jax(DOT, engine=engine)(np.ones(2), np.ones(2), 1)
    # found while tracing, before anything runs
    with pytest.raises(rvm.RvmError, match="argument n"):
        jax.jit(lambda y: rvm.to_jax(powsum, engine=engine)(0.0, 2.0, y))(3.0)
    # an invertibility failure inside jit: JAX's error carries rvm's, naming the ancilla
    f = jax.jit(lambda x: rvm.to_jax(leaks, engine=engine)(x, 0.0)[1])
    with pytest.raises(Exception, match=r"InvertibilityError: in leaks.*ancilla `a` is 1.0"):
        f(1.0).block_until_ready()
    with pytest.raises(InvertibilityError, match="ancilla `a`"):        # outside jit: itself
        rvm.to_jax(leaks, engine=engine)(1.0, 0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_transformed_and_loaded_functions_cross_too(engine):
    """~f, rvm.adjoint(f) and a loaded program's function, in both bridges."""
    inv = rvm.to_jax(~quad, engine=engine)
    assert [float(v) for v in inv(118.0, 3.0, 4.0)] == [0.0, 3.0, 4.0]
    assert float(jax.grad(lambda y: inv(118.0, 3.0, y)[0])(4.0)) == -41.0
    adj = rvm.to_jax(rvm.adjoint(quad), engine=engine)
    assert [float(v) for v in adj(0.0, 3.0, 4.0, 1.0, 0.0, 0.0)[4:]] == [24.0, 41.0]
    # d/dx of x's shadow (4x + 3y) is 4: the Hessian's row, by rvm.adjoint(rvm.adjoint(f))
    assert float(jax.grad(lambda x: adj(0.0, x, 4.0, 1.0, 0.0, 0.0)[4])(3.0)) == 4.0
    x = t64(3.0)[0]
    rvm.to_torch(rvm.adjoint(quad), engine=engine)(0.0, x, 4.0, 1.0, 0.0, 0.0)[5].backward()
    assert float(x.grad) == 3.0
    J = rvm.to_jax(rvm.load(str(ROOT / "asm" / "besselj.rasm"))["besselj"], engine=engine)
    assert float(jax.grad(lambda z: J(0.0, 2, z)[0])(1.0)) == pytest.approx(0.2102436159, 1e-9)


@rvm.reversible
def sin_squares(out: float, x: rvm.Array[float]):
    """out += sum_i sin(x_i) x_i^2."""
    for i in range(len(x)):
        out += sin(x[i]) * x[i] * x[i]  # noqa: F821 (frontend syntax)


@rvm.reversible
def isum(out: int, x: rvm.Array[int]):
    """out += sum_i x_i: an array of integers."""
    for i in range(len(x)):
        out += x[i]


@rvm.reversible
def weighted_cubes(out: float, x: rvm.Array[float], w: rvm.Array[float]):
    """out += sum_i w_i x_i^3."""
    for i in range(len(x)):
        out += w[i] * x[i] * x[i] * x[i]


XS, WS = np.array([0.3, -1.2, 2.0]), np.array([1.5, -0.5, 2.0])


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_jax_second_derivatives_of_array_functions(engine, calls):
    """jax.hessian (forward over reverse: rvm.tangent(rvm.adjoint(f))) and grad of grad
    (rvm.adjoint(rvm.adjoint(f))) of functions of arrays, under jit too: as JAX's own of
    the same functions in jax.numpy, and rvm.hessian."""
    S = rvm.to_jax(sin_squares, engine=engine)
    s_rvm, s_jax = (lambda x: S(0.0, x)[0]), (lambda x: jnp.sum(jnp.sin(x) * x * x))
    want = jax.hessian(s_jax)(XS)
    calls.clear()
    for run in (jax.hessian(s_rvm), jax.jit(jax.hessian(s_rvm))):
        assert np.allclose(run(XS), want, rtol=1e-13, atol=1e-13)
    assert ("tangent(adjoint(f))", True) in calls
    H = rvm.hessian(sin_squares, loss="out", wrt=["x"], engine=engine)(0.0, XS)
    assert np.allclose(want, H, rtol=1e-13, atol=1e-13)
    calls.clear()
    norm = lambda g: lambda x: jnp.sum(jax.grad(g)(x) ** 2)     # grad of grad
    for run in (jax.grad(norm(s_rvm)), jax.jit(jax.grad(norm(s_rvm)))):
        assert np.allclose(run(XS), jax.grad(norm(s_jax))(XS), rtol=1e-13, atol=1e-13)
    assert ("adjoint(adjoint(f))", False) in calls


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_jax_second_derivatives_of_a_dot_product_with_weights(engine):
    """The same for out += sum w x^3: the mixed blocks of the Hessian in (x, w), and grad
    of grad with respect to the weights."""
    C = rvm.to_jax(weighted_cubes, engine=engine)
    c_rvm, c_jax = (lambda x, w: C(0.0, x, w)[0]), (lambda x, w: jnp.sum(w * x ** 3))
    both = jax.hessian(c_rvm, argnums=(0, 1))(XS, WS)
    for i in range(2):
        for j in range(2):
            assert np.allclose(both[i][j], jax.hessian(c_jax, argnums=(0, 1))(XS, WS)[i][j],
                               rtol=1e-13, atol=1e-13)
    gx = jax.grad(lambda w: jnp.sum(jax.grad(c_rvm)(XS, w) * XS))(WS)
    assert np.allclose(gx, jax.grad(lambda w: jnp.sum(jax.grad(c_jax)(XS, w) * XS))(WS),
                       rtol=1e-13)


@rvm.reversible
def centred_powers(out: float, y: rvm.Array[float], x: rvm.Array[float]):
    """out += sum_i d_i^4 + m sin(x_i), y_i += d_i^3, where m = mean(x) and d = x - m is
    held in a heap ancilla (`zeros(n)`), which the adjoint program's sweep leaves for its
    clean-up."""
    with rvm.ancilla(d=rvm.zeros(len(x)), m=0.0):
        with rvm.compute() as c:
            for i in range(len(x)):
                m += x[i] / len(x)  # noqa: F821 (frontend syntax)
            for i in range(len(x)):
                d[i] += x[i] - m  # noqa: F821
        for i in range(len(x)):
            out += d[i] * d[i] * d[i] * d[i] + sin(x[i]) * m  # noqa: F821
            y[i] += d[i] * d[i] * d[i]  # noqa: F821
        ~c  # noqa: B018


def centred_powers_jnp(out, y, x):
    d = x - jnp.mean(x)
    return out + jnp.sum(d ** 4 + jnp.sin(x) * jnp.mean(x)), y + d ** 3, x


YS = np.array([0.5, -0.25, 1.0])


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_jax_derivatives_of_a_heap_ancilla_function(engine, calls):
    """jax.grad, jax.hessian (under jit too) and jax.jacfwd(jax.grad) of a function with
    a heap ancilla (a `zeros(n)` ancilla): adjoint(f) and tangent(adjoint(f)); as JAX's
    own of the same function in jax.numpy, and rvm.hessian."""
    P = rvm.to_jax(centred_powers, engine=engine)
    p_rvm, p_jax = (lambda x: P(0.0, YS, x)[0]), (lambda x: centred_powers_jnp(0.0, YS, x)[0])
    calls.clear()
    assert np.allclose(jax.grad(p_rvm)(XS), jax.grad(p_jax)(XS), rtol=1e-13, atol=1e-13)
    assert ("adjoint(f)", False) in calls
    want = jax.hessian(p_jax)(XS)
    for run in (jax.hessian(p_rvm), jax.jit(jax.hessian(p_rvm)), jax.jacfwd(jax.grad(p_rvm))):
        assert np.allclose(run(XS), want, rtol=1e-13, atol=1e-13)
    assert ("tangent(adjoint(f))", True) in calls
    H = rvm.hessian(centred_powers, loss="out", wrt=["x"], engine=engine)(0.0, YS, XS)
    assert np.allclose(H, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_grad_of_grad_of_a_heap_ancilla_function(engine, calls):
    """Grad of grad (reverse over reverse: adjoint(adjoint(f))), under jit too, as JAX's
    own."""
    P = rvm.to_jax(centred_powers, engine=engine)
    p_rvm, p_jax = (lambda x: P(0.0, YS, x)[0]), (lambda x: centred_powers_jnp(0.0, YS, x)[0])
    norm = lambda g: lambda x: jnp.sum(jax.grad(g)(x) ** 2)
    for run in (jax.grad(norm(p_rvm)), jax.jit(jax.grad(norm(p_rvm)))):
        assert np.allclose(run(XS), jax.grad(norm(p_jax))(XS), rtol=1e-13, atol=1e-13)
    assert ("adjoint(adjoint(f))", False) in calls


@pytest.mark.parametrize("engine", ENGINES)
def test_jax_hessian_of_a_heap_ancilla_function_with_an_array_output(engine):
    """Cotangents on an array's elements (y's final value, y + d^3) and on a scalar at
    once, in (y, x) jointly: one gradient pass per nonzero entry; jax.jacrev(jax.jacfwd)
    runs adjoint(tangent(f)) the same way."""
    P = rvm.to_jax(centred_powers, engine=engine)

    def mixed(P):
        def loss(y, x):
            out, y2, _ = P(0.0, y, x)
            return out + jnp.sum(y2 ** 2)
        return loss
    want = jax.hessian(mixed(centred_powers_jnp), argnums=(0, 1))(YS, XS)
    got = jax.jit(jax.hessian(mixed(P), argnums=(0, 1)))(YS, XS)
    for i in range(2):
        for j in range(2):
            assert np.allclose(got[i][j], want[i][j], rtol=1e-13, atol=1e-13)
    rf = jax.jacrev(jax.jacfwd(mixed(P), argnums=1), argnums=1)(YS, XS)
    assert np.allclose(rf, want[1][1], rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_jax_and_torch_hessians_of_the_graph_embedding_loss(engine):
    """The graph-embedding example's loss (heap ancillas d1 = zeros(len(l1)), ...), for a
    pentagon in the plane (edges: its sides; other pairs: its diagonals) to keep the test
    short: jax.hessian, under jit too, as rvm.hessian and as JAX's own of the loss written
    in jax.numpy; PyTorch's functional.hessian likewise."""
    from graph_embedding import embedding_loss
    l1 = np.array([(i, (i + 1) % 5) for i in range(5)], dtype=np.int64)
    l2 = np.array([(i, (i + 2) % 5) for i in range(5)], dtype=np.int64)
    x = np.random.default_rng(0).normal(size=(5, 2))

    def loss_jnp(x):
        def mean_var(d):
            return jnp.mean(d), jnp.mean((d - jnp.mean(d)) ** 2)
        (m1, v1), (m2, v2) = (mean_var(jnp.sqrt(jnp.sum((x[p[:, 0]] - x[p[:, 1]]) ** 2, 1)))
                              for p in (l1, l2))
        gap = m1 - m2 + 0.1
        return v1 + v2 + jnp.where(gap > 0, jnp.exp(gap) - 1.0, 0.0)
    E = rvm.to_jax(embedding_loss, engine=engine)
    H = jax.hessian(lambda x: E(0.0, x, l1, l2)[0])(x)
    assert H.shape == (5, 2, 5, 2)
    assert np.allclose(H, jax.jit(jax.hessian(loss_jnp))(x), rtol=1e-12, atol=1e-13)
    assert np.allclose(H.reshape(10, 10), rvm.hessian(embedding_loss, loss="out", wrt=["x"],
                       engine=engine)(0.0, x, l1, l2), rtol=1e-13, atol=1e-14)
    assert np.array_equal(jax.jit(jax.hessian(lambda x: E(0.0, x, l1, l2)[0]))(x), H)
    T = rvm.to_torch(embedding_loss, engine=engine)
    Ht = torch.autograd.functional.hessian(lambda x: T(0.0, x, l1, l2)[0], torch.tensor(x))
    assert np.allclose(Ht.numpy(), H, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("engine", ENGINES)
def test_derivatives_of_a_scalar_function_on_the_stack(engine, tmp_path, alone):
    """A loaded program's function of scalars that uses the stack (PUSH/POP: no adjoint
    program) has reverse mode and second derivatives in both bridges, the calls on
    numbers included: out += x^3."""
    (tmp_path / "cube.rasm").write_text(
        ".func cube(f0, f1)\n ADD.mul f2, f1, f1\n PUSH f2\n POP f3\n ADD.mul f0, f3, f1\n"
        " PUSH f3\n POP f2\n SUB.mul f2, f1, f1\n.end\n")
    cube = rvm.load(str(tmp_path / "cube.rasm"))["cube"]
    with pytest.raises(rvm.RvmError, match="cube uses PUSH"):
        rvm.adjoint(cube)(0.0, 2.0, 1.0, 0.0)
    C = rvm.to_jax(cube, engine=engine)
    loss = lambda x: C(0.0, x)[0]
    assert float(jax.grad(loss)(2.0)) == 12.0 and float(jax.hessian(loss)(2.0)) == 12.0
    assert float(jax.jit(jax.grad(jax.grad(loss)))(2.0)) == 12.0
    # a batch of its gradients: one host call whose rows run one by one (gradient mode)
    alone[0] = 0
    xs = np.array([0.5, 1.0, 2.0])
    assert np.allclose(jax.jit(jax.vmap(jax.grad(loss)))(xs), 3 * xs ** 2)
    assert alone == [3]
    T = rvm.to_torch(cube, engine=engine)
    x = t64(2.0)[0]
    g, = torch.autograd.grad(T(0.0, x)[0], x, create_graph=True)
    assert g.item() == 12.0 and torch.autograd.grad(g, x)[0].item() == 12.0
    T(0.0, x)[0].backward()
    assert float(x.grad) == 12.0
    assert torch.autograd.gradgradcheck(lambda x: T(0.0, x)[0], (t64(0.7)[0],))


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_third_derivatives_of_a_heap_ancilla_function(engine):
    """A function with a heap ancilla has an adjoint program, so forward over forward
    over reverse (rvm.tangent(rvm.tangent(rvm.adjoint(f)))) gives JAX its third
    derivatives (refused before); PyTorch's third backward needs the adjoint of
    rvm.adjoint(rvm.adjoint(f)), which is not one program: refused naming the nesting."""
    P = rvm.to_jax(centred_powers, engine=engine)
    third = lambda p: jax.jacfwd(jax.hessian(lambda x: p(0.0, YS, x)[0]))(XS)
    assert np.allclose(third(P), third(centred_powers_jnp), rtol=1e-12, atol=1e-12)
    T = rvm.to_torch(centred_powers, engine=engine)
    x = torch.tensor(XS, requires_grad=True)
    g, = torch.autograd.grad(T(0.0, torch.tensor(YS), x)[0], x, create_graph=True)
    h, = torch.autograd.grad(g.sum(), x, create_graph=True)
    with pytest.raises(rvm.RvmError, match=r"adjoint\(adjoint\(centred_powers\)\) of a "
                       r"function of arrays runs as two tangent programs"):
        h.sum().backward()


def test_first_and_second_derivatives_of_a_heap_ancilla_function_take_gradient_mode(
        monkeypatch):
    """Its adjoint program's clean-up runs the sweep three times: the bridges' reverse
    mode and Hessians come from gradient mode (2x faster on the graph-embedding
    Hessian), third derivatives from the adjoint program."""
    from rvm.interop._common import HeapDerivative
    ran = []
    call = HeapDerivative.__call__
    monkeypatch.setattr(HeapDerivative, "__call__",
                        lambda self, *a: ran.append(self.path) or call(self, *a))
    P = rvm.to_jax(centred_powers, engine="interp")
    loss = lambda x: P(0.0, YS, x)[0]
    jax.grad(loss)(XS)
    jax.hessian(loss)(XS)
    assert ("adjoint",) in ran and ("adjoint", "tangent") in ran      # (innermost first)
    ran.clear()
    jax.jacfwd(jax.hessian(loss))(XS)
    assert ("adjoint", "tangent", "tangent") not in ran


# ---------------------------------------------------------------------------- PyTorch

def t64(*values):
    return [torch.tensor(v, dtype=F64, requires_grad=True) for v in values]


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_backward_runs_the_adjoint_program(engine, calls):
    Q = rvm.to_torch(quad, engine=engine)
    x, y = t64(3.0, 4.0)
    out = Q(0.0, x, y)
    assert [float(o.detach()) for o in out] == [118.0, 3.0, 4.0]
    out[0].backward()
    assert (float(x.grad), float(y.grad)) == (24.0, 41.0)
    assert calls == [("f", False), ("adjoint(f)", False)]
    gx, = torch.autograd.grad(Q(0.0, x, y)[0] + Q(0.0, x, y)[1], (x,))
    assert float(gx) == 25.0
    # requires_grad per argument: only y's gradient is asked of the adjoint
    x2, y2 = torch.tensor(3.0, dtype=F64), t64(4.0)[0]
    Q(0.0, x2, y2)[0].backward()
    assert x2.grad is None and float(y2.grad) == 41.0


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_gradcheck(engine):
    Q = rvm.to_torch(quad, engine=engine)
    x, y = t64(0.3, -1.2)
    assert torch.autograd.gradcheck(lambda x, y: Q(0.0, x, y), (x, y))
    if engine != "native":          # (its native adjoint takes 10 s to compile)
        J = rvm.to_torch(besselj_inplace, engine=engine)
        assert torch.autograd.gradcheck(lambda z: J(0.0, 2, z)[2], (t64(1.3)[0],))


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_torch_gradgradcheck_runs_the_second_order_programs(engine, calls):
    Q = rvm.to_torch(quad, engine=engine)
    x, y = t64(0.3, -1.2)
    calls.clear()
    assert torch.autograd.gradgradcheck(lambda x, y: Q(0.0, x, y)[0], (x, y))
    assert ("adjoint(adjoint(f))", False) in calls       # double backward: rvm's program
    J = rvm.to_torch(besselj_inplace, engine=engine)
    assert torch.autograd.gradgradcheck(lambda z: J(0.0, 2, z)[0], (t64(1.3)[0],))
    H = torch.autograd.functional.hessian(lambda x, y: Q(0.0, x, y)[0],
                                          (x.detach(), y.detach()))
    assert [[float(h) for h in row] for row in H] == [[4.0, 3.0], [3.0, 8.0]]


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_forward_mode_runs_the_tangent_program(engine, calls):
    Q = rvm.to_torch(quad, engine=engine)
    x, y = torch.tensor(3.0, dtype=F64), torch.tensor(4.0, dtype=F64)
    calls.clear()
    v, t = torch.func.jvp(lambda x, y: Q(0.0, x, y)[0], (x, y),
                          (torch.tensor(1.0, dtype=F64), torch.tensor(2.0, dtype=F64)))
    assert (float(v), float(t)) == (118.0, 24.0 + 82.0)
    assert ("tangent(f)", False) in calls and all("adjoint" not in k for k, _ in calls)
    import torch.autograd.forward_ad as fwAD
    with fwAD.dual_level():
        out = Q(0.0, fwAD.make_dual(x, torch.tensor(1.0, dtype=F64)), y)[0]
        assert float(fwAD.unpack_dual(out).tangent) == 24.0


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_vmap_is_one_rvm_batch(engine, calls, alone):
    Q = rvm.to_torch(quad, engine=engine)
    xs, ys = torch.linspace(-1, 1, 5, dtype=F64), torch.linspace(2, 3, 5, dtype=F64)
    loss = lambda x, y: Q(0.0, x, y)[0]
    calls.clear()
    gx, gy = torch.func.vmap(torch.func.grad(loss, argnums=(0, 1)))(xs, ys)
    assert torch.allclose(gx, 4 * xs + 3 * ys) and torch.allclose(gy, 3 * xs + 8 * ys)
    assert calls == [("f", True), ("adjoint(f)", True)]
    assert alone == [0 if engine == "native" else 10]     # natively: two native batches
    calls.clear()
    vs = torch.func.vmap(torch.func.vmap(loss))(xs[:, None] + ys, torch.ones(5, 5, dtype=F64))
    assert vs.shape == (5, 5) and len(calls) == 1
    # a parameter shared by the rows: gradient summed over them
    w = t64(2.0)[0]
    torch.func.vmap(loss, in_dims=(None, 0))(w, ys).sum().backward()
    assert float(w.grad) == pytest.approx(float((4 * 2.0 + 3 * ys).sum()))


@pytest.mark.skipif(not native.available, reason="no native engine")
def test_vmap_of_derivatives_is_one_native_batch(alone):
    """The adjoint program of a scalar function pushes residues on the stack, so it has no
    native batch loop of its own: a batch of it runs the function's Jacobian loop (one
    gradient pass per row seeded with the rows' cotangent, or per cotangent nonzero in
    some row). jax.vmap of jax.grad, jax.vjp (cotangents per row), jax.jvp, and
    torch.func.vmap of torch.func.grad: no row runs by itself."""
    Q, T = rvm.to_jax(quad, engine="native"), rvm.to_torch(quad, engine="native")
    xs, ys = np.linspace(-1, 1, 64), np.linspace(2, 3, 64)
    gx, gy = jax.jit(jax.vmap(jax.grad(lambda x, y: Q(0.0, x, y)[0], (0, 1))))(xs, ys)
    assert np.allclose(gx, 4 * xs + 3 * ys) and np.allclose(gy, 3 * xs + 8 * ys)
    # cotangents that differ per row, on two of the three outputs
    bx, by = jax.vmap(lambda x, y: jax.vjp(lambda a, b: Q(a, a, b), x, y)[1](
        (x, 2 * y, 3.0)))(xs, ys)
    assert np.allclose(bx, xs * (1 + 4 * xs + 3 * ys) + 2 * ys)
    assert np.allclose(by, xs * (3 * xs + 8 * ys) + 3.0)
    _, t = jax.vmap(lambda x, y: jax.jvp(lambda a, b: Q(0.0, a, b)[0], (x, y),
                                         (1.0, 2.0)))(xs, ys)
    assert np.allclose(t, 4 * xs + 3 * ys + 2 * (3 * xs + 8 * ys))
    tx, ty = torch.from_numpy(xs), torch.from_numpy(ys)
    gx, gy = torch.func.vmap(torch.func.grad(lambda x, y: T(0.0, x, y)[0], (0, 1)))(tx, ty)
    assert torch.allclose(gx, 4 * tx + 3 * ty) and torch.allclose(gy, 3 * tx + 8 * ty)
    # an integer argument shared by the rows
    P = rvm.to_jax(powsum, engine="native")
    g = jax.vmap(jax.grad(lambda x: P(0.0, x, 3)[0]))(xs)
    assert np.allclose(g, 3 * xs ** 2)
    assert alone == [0]
    # rvm.vmap of rvm.adjoint(f) takes the same loop
    a = rvm.adjoint(quad, engine="native")
    out = rvm.vmap(a)(np.zeros(64), xs, ys, np.ones(64), np.zeros(64), xs)
    assert np.allclose(out[4], 4 * xs + 3 * ys) and np.allclose(out[5], 3 * xs + 8 * ys + xs)
    assert a.batch([np.zeros(3), xs[:3], ys[:3], np.ones(3), np.zeros(3), np.zeros(3)]) \
        is not None


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_torch_module_and_optimizer_loop(engine):
    """A layer whose forward is J_2(z) (rvm's Bessel function), fitted by Adam to a target
    value; its parameter moves to where J_2 takes that value."""
    J = rvm.to_torch(besselj_inplace, engine=engine)

    class Bessel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.z = torch.nn.Parameter(torch.tensor(1.0, dtype=F64))

        def forward(self):
            return J(0.0, 2, self.z)[0]

    model = Bessel()
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(200):
        opt.zero_grad()
        loss = (model() - 0.3) ** 2
        loss.backward()
        opt.step()
    assert float(model()) == pytest.approx(0.3, abs=1e-4)
    opt.zero_grad()
    ((model() - 0.3) ** 2).backward()
    z = float(model.z)
    dj = rvm.grad(besselj_inplace, loss=0, engine=engine)(0.0, 2, z)[2]
    assert float(model.z.grad) == pytest.approx(2 * (besselj_inplace(0.0, 2, z)[0] - 0.3) * dj,
                                                rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_dtypes_devices_and_layouts(engine):
    Q = rvm.to_torch(quad, engine=engine)
    x = torch.tensor(0.1, dtype=torch.float32, requires_grad=True)
    out = Q(0.0, x, torch.tensor(0.7, dtype=torch.float32))
    assert out[1].dtype == torch.float32 and out[0].dtype == F64   # each argument's dtype
    out[0].backward()
    assert x.grad.dtype == torch.float32
    assert float(x.grad) == float(np.float32(4 * float(x) + 3 * float(np.float32(0.7))))
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) is on device meta"):
        Q(0.0, torch.empty((), device="meta"), 1.0)
    with pytest.raises(UsageError, match=r"argument 2 \(`y`\) is a complex tensor"):
        Q(0.0, 1.0, torch.tensor(1j))
    with pytest.raises(rvm.RvmError, match="argument x of quad is declared float, got Array"):
        Q(0.0, torch.ones(3, dtype=F64), 1.0)                 # a shape the function refuses
    with pytest.raises(rvm.RvmError, match="argument n of powsum is declared int, got float"):
        rvm.to_torch(powsum, engine=engine)(0.0, 2.0, torch.tensor(3.0))
    # a non-contiguous tensor is read as its values (a copy), not its storage
    D = rvm.to_torch(DOT, engine=engine)
    col = torch.arange(9.0, dtype=F64).reshape(3, 3)[:, 1]      # a column: strided
    assert not col.is_contiguous()
    assert float(D(col, torch.ones(3, dtype=F64), 0.0)[2]) == 1.0 + 4.0 + 7.0
    with pytest.raises(InvertibilityError, match="ancilla `a`"):
        rvm.to_torch(leaks, engine=engine)(1.0, 0.0)
    # bfloat16 and float16 in: float64 inside, the argument's dtype out
    for dt in (torch.bfloat16, torch.float16):
        out = Q(0.0, torch.tensor(0.5, dtype=dt), torch.tensor(1.0, dtype=dt))
        assert (out[1].dtype, float(out[0])) == (dt, 6.0)
    # bad input, named: not a number, a sparse tensor, integers for an array of floats
    with pytest.raises(UsageError, match=r"argument 1 \(`x`\) is NoneType, not a number"):
        Q(0.0, None, 1.0)
    with pytest.raises(UsageError, match=r"argument 2 \(`y`\) is object, not a number"):
        Q(0.0, 1.0, object())
    S = rvm.to_torch(sin_squares, engine=engine)
    with pytest.raises(UsageError, match=r"to_torch\(sin_squares\): argument 1 \(`x`\) is a "
                       r"sparse_coo tensor; rvm takes dense tensors"):
        S(0.0, torch.ones(3, dtype=F64).to_sparse())
    for ints in (torch.arange(3), torch.arange(3, dtype=torch.int32)):
        with pytest.raises(UsageError, match=r"argument 1 \(`x`\) is an array of floats; "
                           r"got int(64|32)"):
            S(0.0, ints)
    with pytest.raises(rvm.RvmError, match=r"argument x of isum is declared Array\[int"):
        rvm.to_torch(isum, engine=engine)(0, torch.ones(3, dtype=F64))


@pytest.mark.parametrize("engine", ENGINES)
def test_torch_integers_and_arrays(engine):
    P = rvm.to_torch(powsum, engine=engine)
    x = t64(2.0)[0]
    out = P(0.0, x, 5)
    assert out[2].dtype == torch.int64 and not out[2].requires_grad
    out[0].backward()
    assert float(x.grad) == 80.0
    D = rvm.to_torch(DOT, engine=engine)
    a, b = torch.tensor([1.0, 2.0, 3.0], dtype=F64, requires_grad=True), \
        torch.tensor([4.0, 5.0, -6.0], dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: D(a, b, 0.5)[2], (a, b))


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_torch_second_derivatives_of_array_functions(engine, calls):
    """gradgradcheck and torch.autograd.functional.hessian of functions of tensors (double
    backward: rvm.adjoint(rvm.adjoint(f))), as PyTorch's own of the same functions and
    rvm.hessian."""
    S, C = rvm.to_torch(sin_squares, engine=engine), rvm.to_torch(weighted_cubes,
                                                                    engine=engine)
    x, w = (torch.tensor(v, dtype=F64, requires_grad=True) for v in (XS, WS))
    calls.clear()
    assert torch.autograd.gradgradcheck(lambda x: S(0.0, x)[0], (x,))
    assert ("adjoint(adjoint(f))", False) in calls
    assert torch.autograd.gradgradcheck(lambda x, w: C(0.0, x, w)[0], (x, w))
    H = torch.autograd.functional.hessian(lambda x: S(0.0, x)[0], x.detach())
    want = torch.autograd.functional.hessian(lambda x: (torch.sin(x) * x * x).sum(),
                                             x.detach())
    assert torch.allclose(H, want, rtol=1e-13, atol=1e-13)
    assert np.allclose(H.numpy(), rvm.hessian(sin_squares, loss="out", wrt=["x"],
                                              engine=engine)(0.0, XS), rtol=1e-13)
    H = torch.autograd.functional.hessian(lambda x, w: C(0.0, x, w)[0],
                                          (x.detach(), w.detach()))
    want = torch.autograd.functional.hessian(lambda x, w: (w * x ** 3).sum(),
                                             (x.detach(), w.detach()))
    assert all(torch.allclose(H[i][j], want[i][j], rtol=1e-13, atol=1e-13)
               for i in range(2) for j in range(2))


@pytest.mark.parametrize("engine", SLOW_NATIVE)
def test_torch_second_derivatives_of_a_heap_ancilla_function(engine, calls):
    """backward, gradgradcheck, double backward and torch.autograd.functional.hessian of a
    function with a heap ancilla (a `zeros(n)` ancilla): as PyTorch's own of the same
    function and rvm.hessian."""
    T = rvm.to_torch(centred_powers, engine=engine)
    y, x = (torch.tensor(v, dtype=F64, requires_grad=True) for v in (YS, XS))

    def ref(y, x):
        d = x - x.mean()
        return (d ** 4 + torch.sin(x) * x.mean()).sum(), y + d ** 3
    calls.clear()
    T(0.0, y, x)[0].backward()
    assert torch.allclose(x.grad, torch.autograd.grad(ref(y, x)[0], x)[0], rtol=1e-13)
    assert ("adjoint(f)", False) in calls
    calls.clear()
    assert torch.autograd.gradgradcheck(lambda x: T(0.0, y, x)[0], (x,))
    assert ("adjoint(adjoint(f))", False) in calls
    assert torch.autograd.gradgradcheck(lambda y, x: (T(0.0, y, x)[1] ** 2).sum(), (y, x))
    H = torch.autograd.functional.hessian(lambda x: T(0.0, y, x)[0], x.detach())
    want = torch.autograd.functional.hessian(lambda x: ref(y, x)[0], x.detach())
    assert torch.allclose(H, want, rtol=1e-13, atol=1e-13)
    assert np.allclose(H.numpy(), rvm.hessian(centred_powers, loss="out", wrt=["x"],
                                              engine=engine)(0.0, YS, XS), rtol=1e-13)


# ---------------------------------------------------------------------------- costs

def test_a_signature_is_planned_once(monkeypatch):
    """The cost of a crossing: each signature's program (and derivative program) is found
    once; later calls, under jax.jit and in PyTorch eager mode, forward and backward, go
    straight to the machine, which still converts and checks every call's values."""
    from rvm.ad.derivatives import Transformed
    found = []
    for cls in (type(quad), Transformed):
        def spy(self, args, specialize=cls.specialize):
            found.append(self)
            return specialize(self, args)
        monkeypatch.setattr(cls, "specialize", spy)
    F, T = rvm.to_jax(quad, engine="python"), rvm.to_torch(quad, engine="python")

    def loss(x, y):
        return F(0.0, x, y)[0]
    value, grad = jax.jit(loss), jax.jit(jax.grad(loss, argnums=(0, 1)))
    y = torch.tensor(4.0, dtype=F64)

    def run(x):
        assert float(value(x, 4.0)) == quad(0.0, x, 4.0)[0]
        assert tuple(float(g) for g in grad(x, 4.0)) == grad_quad(x, 4.0)
        xt = torch.tensor(x, dtype=F64, requires_grad=True)
        out = T(0.0, xt, y)[0]
        out.backward()
        assert (out.item(), xt.grad.item()) == (quad(0.0, x, 4.0)[0], grad_quad(x, 4.0)[0])
    run(1.0)
    before = len(found)
    for x in (2.0, -3.0, 0.5):
        run(x)
    # (quad's own calls above find quad's program, one each)
    assert len(found) - before == 6
    # a planned call that fails is told as a plain call tells it
    L, J = rvm.to_torch(leaks, engine="python"), jax.jit(rvm.to_jax(leaks, engine="python"))
    assert [v.item() for v in L(0.0, 1.0)] == [0.0, 1.0]
    assert [float(v) for v in J(0.0, 1.0)] == [0.0, 1.0]
    with pytest.raises(InvertibilityError, match="ancilla `a`"):
        L(1.0, 0.0)
    with pytest.raises(Exception, match=r"InvertibilityError: in leaks.*ancilla `a` is 1.0"):
        J(1.0, 0.0)[0].block_until_ready()


@pytest.mark.slow
def test_interop_benchmark_runs_batches_as_one_native_batch():
    """tools/bench/interop.py --quick: every row measured, the floors beside them, and
    each vmap batch one rvm call that ran as one native batch (no row by itself)."""
    import json
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "interop.py"),
                           "--quick"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {r["case"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])}
    assert {"JAX jit: call", "JAX jit: grad", "PyTorch eager: call",
            "PyTorch eager: call + backward", "floor: JAX jit, pure_callback no-op",
            "floor: PyTorch autograd.Function no-op"} <= set(rows)
    batches = [r for r in rows.values() if r["host_calls"] is not None]
    assert len(batches) == 4 and all(r["host_calls"] == r["crossings"] and r["rows_one_by_one"] == 0
                                     for r in batches)
    assert rows["PyTorch eager: call + backward"]["per_crossing_us"] == pytest.approx(
        rows["PyTorch eager: call + backward"]["overhead_us"] / 2)


# ---------------------------------------------------------------------------- examples

def test_torch_training_example_memory_stays_flat_and_gradients_agree(capsys):
    """examples/torch_training.py, small: what autograd keeps for the backward pass stays
    the same with ten times the steps through the rvm layer, and grows tenfold through
    plain PyTorch; the gradients agree."""
    import torch_training
    torch_training.main(["--steps", "300", "--epochs", "3", "--compare", "40,400",
                         "--engine", "python"])
    out = capsys.readouterr().out
    saved = {(int(n), who): int(b.replace(",", "")) for n, who, b in
             re.findall(r"^\s+(\d+)  (rvm|PyTorch)\s+\S+ MiB\s+([\d,]+) B", out, re.M)}
    assert saved[(40, "rvm")] == saved[(400, "rvm")] < 200
    assert saved[(400, "PyTorch")] > 9 * saved[(40, "PyTorch")]
    diffs = [float(d) for d in re.findall(r"relative difference (\S+)", out)]
    assert len(diffs) == 2 and max(diffs) < 1e-12


def test_jax_bessel_example_fits():
    import jax_bessel
    a, b = jax_bessel.main(steps=120, points=16, engine="python")
    assert abs(float(a) - 1.5) < 5e-3 and abs(float(b) - 2.0) < 5e-3
