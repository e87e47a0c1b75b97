"""The ADBench GMM written with array statements (examples/gmm_arrays.py): its objective
against examples/gmm.py's and an independent numpy/scipy one, its gradient against
gmm.py's and finite differences, its uncall, on the default and the native engine (native
with no fallback: a UserWarning is an error)."""

import sys
from pathlib import Path

import numpy as np
import pytest

import rvm

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "examples"), str(ROOT / "tests")]

import adbench  # noqa: E402
import gmm  # noqa: E402
import gmm_arrays  # noqa: E402
from test_adbench import flat_objective, gmm_file  # noqa: E402

NO_FALLBACK = pytest.mark.filterwarnings("error::UserWarning")
ENGINES = ["interp", pytest.param("native", marks=NO_FALLBACK)]
# The native gradient's code (compiled first, below) serves native calls too; a native
# uncall is compiled apart (some 10-20 s on a cold cache): a slow test.
ENGINES_SLOW_NATIVE = ["interp", pytest.param("native", marks=[NO_FALLBACK, pytest.mark.slow])]


def engine_ok(engine):
    if engine == "native":
        pytest.importorskip("llvmlite")


def numpy_objective(data) -> float:
    return adbench.gmm_objective_numpy(*(data[k] for k in ("alphas", "means", "icf", "x",
                                                            "gamma", "m")))


def value_and_grad(engine):
    return rvm.value_and_grad(gmm_arrays.gmm_objective, loss="out", argnums=(1, 2, 3),
                              engine=engine, max_steps=gmm.STEPS)


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_equals_gmm_py_and_finite_differences(tmp_path, engine):
    engine_ok(engine)
    data = gmm.load(gmm_file(tmp_path, 3, 4, 12))
    args = gmm.arguments(data)
    run = value_and_grad(engine)
    for _ in range(2):      # (native: the second call runs forwards and back in one)
        value, grads = run(*args)
        flat = np.concatenate([g.ravel() for g in grads])
        value_py, g_py = gmm.gradient(data, engine="python", threads=1)
        assert value[0] == pytest.approx(value_py, rel=1e-12)
        assert value[0] == pytest.approx(numpy_objective(data), rel=1e-12)
        np.testing.assert_allclose(flat, g_py, rtol=1e-10, atol=1e-12)
    f, theta = flat_objective(data)
    h = 1e-6
    fd = np.array([(f(theta + h * e) - f(theta - h * e)) / (2 * h)
                   for e in np.eye(len(theta))])
    np.testing.assert_allclose(flat, fd, rtol=1e-6, atol=1e-6 * np.abs(fd).max())


@pytest.mark.parametrize("engine", ENGINES)
def test_objective_equals_gmm_py_and_numpy(tmp_path, engine):
    engine_ok(engine)
    for d, k, n in ((3, 4, 12), (1, 1, 5), (2, 5, 9)):
        data = gmm.load(gmm_file(tmp_path, d, k, n, seed=d + k))
        args = gmm.arguments(data)
        value = gmm_arrays.gmm_objective(*args, engine=engine, max_steps=gmm.STEPS)[0]
        assert value == pytest.approx(gmm.gmm_objective(*args, engine="python")[0], rel=1e-12)
        assert value == pytest.approx(numpy_objective(data), rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_far_points_need_the_running_maxima(tmp_path, engine):
    """Points far from every mean: each exponent is about -10^5, so exp underflows to 0 for
    every component unless each point's log-sum-exp is shifted by its maximum over the
    components (kept as running maxima, np.maximum row by row); components 1 and 2
    equal, so two exponents tie at every point (the partials of max split a tie)."""
    engine_ok(engine)
    data = gmm.load(gmm_file(tmp_path, 3, 4, 10, seed=3))
    data["x"] = data["x"] * 300.0
    for key in ("alphas", "means", "icf"):
        data[key][2] = data[key][1]
    args = gmm.arguments(data)
    want = numpy_objective(data)
    assert want < -1e5
    value, grads = value_and_grad(engine)(*args)
    assert value[0] == pytest.approx(want, rel=1e-12)
    assert np.all(np.isfinite(np.concatenate([g.ravel() for g in grads])))
    _, g_py = gmm.gradient(data, engine="python", threads=1)
    np.testing.assert_allclose(np.concatenate([g.ravel() for g in grads]), g_py,
                               rtol=1e-9, atol=1e-9 * np.abs(g_py).max())


@pytest.mark.parametrize("engine", ENGINES_SLOW_NATIVE)
def test_uncall_restores_the_inputs(tmp_path, engine):
    engine_ok(engine)
    data = gmm.load(gmm_file(tmp_path, 3, 4, 12))
    args = gmm.arguments(data)
    after = gmm_arrays.gmm_objective(*args, engine=engine, max_steps=gmm.STEPS)
    assert after[0] != 0.0
    back = (~gmm_arrays.gmm_objective)(*after, engine=engine, max_steps=gmm.STEPS)
    assert back[0] == pytest.approx(0.0, abs=1e-12)
    for got, want in zip(back[1:], args[1:]):
        np.testing.assert_array_equal(got, want)


def test_one_matrix_product_and_the_gradient_starts_from_the_copy(tmp_path):
    """The exponents are one VMADD (E += W @ P), and the objective's intermediates live in
    one compute block, so the gradient pass starts from the copy (no recompute)."""
    from rvm.engines.compiled import split_point
    args = gmm.arguments(gmm.load(gmm_file(tmp_path, 3, 4, 12)))
    program, name, _ = gmm_arrays.gmm_objective.specialize(args)
    ops = [str(ins).split()[0] for f in program.functions.values() for ins in f.code]
    assert ops.count("VMADD") == 1
    assert split_point(program, program.functions[name]) is not None


def test_points_split_across_threads_as_gmm_py(tmp_path):
    """objective and gradient split the points across threads as gmm.py's do (the prior
    once, with the first slice): the same value and gradient as one run of the whole."""
    data = gmm.load(gmm_file(tmp_path, 2, 3, 11))
    value, grad = gmm_arrays.gradient(data, engine="interp", threads=1)
    assert value == pytest.approx(numpy_objective(data), rel=1e-12)
    v, g = gmm_arrays.gradient(data, engine="interp", threads=3)
    assert v == pytest.approx(value, rel=1e-13)
    np.testing.assert_allclose(g, grad, rtol=1e-12, atol=1e-12)
    assert gmm_arrays.objective(data, engine="interp", threads=2) == pytest.approx(value,
                                                                                   rel=1e-13)


def test_heap_block_bases_are_written_by_alloc_and_free_alone(tmp_path):
    """A register holding an ancilla array's base (or a statement's temporary array's) is
    never lent out as another temporary, so native code sees the block as the function's
    own: what lets the gradient start from the copy (a base register reused as a loop's
    bound made `weights` look as if it stored through a register it did not own)."""
    args = gmm.arguments(gmm.load(gmm_file(tmp_path, 3, 4, 12)))
    for module, f in ((gmm_arrays, gmm_arrays.gmm_objective), (gmm, gmm.gmm_objective)):
        program, _, _ = f.specialize(args if module is gmm_arrays else
                                     gmm.arguments(gmm.load(gmm_file(tmp_path, 3, 4, 12))))
        for fn in program.functions.values():
            bases = {ins.args[0] for ins in fn.code if ins.op in ("ALLOC", "FREE")}
            for ins in fn.code:
                if ins.op not in ("ALLOC", "FREE"):
                    assert not set(ins.written) & bases, (fn.name, str(ins))


def test_array_statements_compute_their_integers_once(tmp_path):
    """weights' slices (`T[c * K:(c + 1) * K, c]`) need the same few integers for their
    views and their bounds' checks: each is computed once per statement (the function
    took 858 instructions when each check computed its own; 491 with the checks on both
    sides of each statement)."""
    args = gmm.arguments(gmm.load(gmm_file(tmp_path, 3, 4, 12)))
    program, _, _ = gmm_arrays.gmm_objective.specialize(args)
    assert len(program.functions["weights"].code) < 520
