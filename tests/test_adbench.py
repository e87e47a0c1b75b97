"""ADBench GMM and bundle adjustment (examples/gmm.py, examples/ba.py, tools/adbench.py):
against independent numpy/scipy implementations of the data README's definitions, against
finite differences, and reversed."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rvm

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "examples")]

import adbench  # noqa: E402
import ba  # noqa: E402
import gmm  # noqa: E402


def gmm_file(tmp_path, d=3, k=4, n=12, seed=0) -> Path:
    """A small input in ADBench's GMM layout."""
    rng = np.random.default_rng(seed)
    icf = rng.normal(scale=0.3, size=(k, d + d * (d - 1) // 2))
    lines = [f"{d} {k} {n}", *map(str, rng.normal(size=k))]
    lines += [" ".join(map(str, row)) for row in rng.normal(size=(k, d))]
    lines += [" ".join(map(str, row)) for row in icf]
    lines += [" ".join(map(str, row)) for row in rng.normal(size=(n, d))]
    lines.append("1.0 0")
    path = tmp_path / f"gmm_d{d}_K{k}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def flat_objective(data):
    k, d = data["means"].shape

    def f(theta):
        return adbench.gmm_objective_numpy(
            theta[:k], theta[k:k + k * d].reshape(k, d), theta[k + k * d:].reshape(k, -1),
            data["x"], data["gamma"], data["m"])
    return f, np.concatenate([data["alphas"], data["means"].ravel(), data["icf"].ravel()])


def central(f, theta, eps=1e-6):
    return np.array([(f(theta + eps * e) - f(theta - eps * e)) / (2 * eps)
                     for e in np.eye(len(theta))])


@pytest.mark.parametrize("d,k", [(1, 2), (3, 4)])
def test_gmm_objective_and_gradient(tmp_path, d, k):
    path = gmm_file(tmp_path, d, k)
    out = json.loads(subprocess.run(
        [sys.executable, str(ROOT / "tools/adbench.py"), "gmm", str(path), "--json",
         "--engine", "python"], capture_output=True, text=True, check=True).stdout)
    data = gmm.load(path)
    f, theta = flat_objective(data)
    assert out["objective"] == pytest.approx(f(theta), rel=1e-12)
    assert len(out["gradient"]) == k + k * d + k * (d + d * (d - 1) // 2)
    np.testing.assert_allclose(out["gradient"], central(f, theta), rtol=1e-6, atol=1e-6)


def test_gmm_on_the_adbench_layout_and_reversed(tmp_path):
    data = gmm.load(gmm_file(tmp_path))
    args = gmm.arguments(data)
    final = gmm.gmm_objective(*args, engine="python")
    assert final[0] == pytest.approx(adbench.gmm_objective_numpy(
        data["alphas"], data["means"], data["icf"], data["x"], data["gamma"], data["m"]))
    back = (~gmm.gmm_objective)(*final, engine="python")
    assert back[0] == pytest.approx(0.0, abs=1e-9)
    for a, b in zip(back[1:5], args[1:5]):
        np.testing.assert_array_equal(a, b)


def test_gmm_gradient_starts_from_the_copy(tmp_path):
    """The objective keeps its intermediates in ancilla arrays of one compute block so
    that its gradient skips the uncompute and the recompute (the example's speed rests
    on it): the split is found, and gives the interpreter's gradient."""
    from rvm.engines.compiled import split_point
    data = gmm.load(gmm_file(tmp_path, 3, 4, n=9))
    args = gmm.arguments(data)
    p, name, _ = gmm.gmm_objective.specialize(args)
    assert split_point(p, p.functions[name]) is not None
    want = rvm.value_and_grad(gmm.gmm_objective, loss="out", argnums=(1, 2, 3),
                              engine="interp")(*args)
    run = rvm.value_and_grad(gmm.gmm_objective, loss="out", argnums=(1, 2, 3),
                             engine="native", max_steps=gmm.STEPS)
    for _ in range(2):
        value, grads = run(*args)
        assert value[0] == pytest.approx(want[0][0], rel=1e-13)
        for g, w in zip(grads, want[1]):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_gmm_split_across_threads_is_the_same_objective_and_gradient(tmp_path):
    """The points split across threads (each slice's points term a run of its own, the
    prior once): the objective and gradient of the whole, up to the order of the sums."""
    data = gmm.load(gmm_file(tmp_path, 3, 4, n=13))
    value, grad = gmm.gradient(data, engine="python", threads=1)
    assert gmm.cores(data) == 1                 # too small to gain from a second thread
    for threads in (2, 3):
        v, g = gmm.gradient(data, engine="python", threads=threads)
        assert v == pytest.approx(value, rel=1e-13)
        np.testing.assert_allclose(g, grad, rtol=1e-12, atol=1e-12)
        assert gmm.objective(data, engine="python", threads=threads) == pytest.approx(
            value, rel=1e-13)


JAX_GMM = """
import json, sys
import numpy as np
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
from jax.scipy.special import logsumexp
sys.path.insert(0, sys.argv[2])
import gmm
data = gmm.load(sys.argv[1])
d = data["means"].shape[1]
rows, cols = np.tril_indices(d, -1)
order = np.lexsort((rows, cols))

def objective(alphas, means, icf):
    q = icf[:, :d]
    Q = jnp.zeros((len(alphas), d, d)).at[:, np.arange(d), np.arange(d)].set(jnp.exp(q))
    Q = Q.at[:, rows[order], cols[order]].set(icf[:, d:])
    qx = jnp.einsum("krc,nkc->nkr", Q, data["x"][:, None, :] - means[None])
    main = alphas[None] + q.sum(1)[None] - 0.5 * (qx ** 2).sum(-1)
    return logsumexp(main, axis=1).sum() - len(data["x"]) * logsumexp(alphas) + (
        0.5 * data["gamma"] ** 2 * ((jnp.exp(q) ** 2).sum() + (icf[:, d:] ** 2).sum())
        - data["m"] * q.sum())
g = jax.grad(objective, argnums=(0, 1, 2))(data["alphas"], data["means"], data["icf"])
print(json.dumps(np.concatenate([np.ravel(w) for w in g]).tolist()))
"""


def test_gmm_matches_jax_where_installed(tmp_path):
    """Against jax.grad (in a child process: JAX's threads and the fuzz tests' fork()
    do not mix)."""
    pytest.importorskip("jax")
    path = gmm_file(tmp_path, 3, 4)
    child = subprocess.Popen([sys.executable, "-c", JAX_GMM, str(path), str(ROOT / "examples")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:        # rvm's gradient while JAX starts in the child
        _, got = gmm.gradient(gmm.load(path), engine="python")
        out, err = child.communicate(timeout=300)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    np.testing.assert_allclose(got, json.loads(out), rtol=1e-9, atol=1e-9)


def ba_instance(n=3, m=4, p=7, seed=0) -> dict:
    data = ba.load(next((ROOT / "tests" / "data").glob("ba_small.txt")))
    rng = np.random.default_rng(seed)
    obs = np.arange(p)
    return dict(cams=np.tile(data["cams"][0], (n, 1)) + rng.normal(scale=0.01, size=(n, 11)),
                x=np.tile(data["x"][0], (m, 1)) + rng.normal(scale=0.1, size=(m, 3)),
                w=rng.uniform(0.5, 1.5, p), feats=np.tile(data["feats"][0], (p, 1)),
                obs=np.stack([obs % n, obs % m], axis=1))


@pytest.mark.parametrize("engine", ["python", "native"])
def test_ba_residuals_and_sparse_jacobian(engine):
    if engine == "native":
        pytest.importorskip("llvmlite")
    data = ba_instance()
    out = ba.jacobian(data, engine=engine)
    reproj, werr = adbench.ba_residuals_numpy(data)
    np.testing.assert_allclose(out["reproj_err"], reproj, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(out["w_err"], werr)
    J = out["J"]
    n, m, p = 3, 4, 7
    assert (J["nrows"], J["ncols"]) == (3 * p, 11 * n + 3 * m + p)
    assert len(J["rows"]) == 3 * p + 1 and np.all(np.diff(J["rows"])[:2 * p] == 15)
    assert np.all(np.diff(J["rows"])[2 * p:] == 1)
    for r in range(3 * p):           # columns ascending within each row
        c = J["cols"][J["rows"][r]:J["rows"][r + 1]]
        assert np.all(np.diff(c) > 0)
    dense = np.zeros((J["nrows"], J["ncols"]))
    for r in range(J["nrows"]):
        span = slice(J["rows"][r], J["rows"][r + 1])
        dense[r, J["cols"][span]] = J["vals"][span]

    def residuals(theta):
        trial = dict(data, cams=theta[:11 * n].reshape(n, 11),
                     x=theta[11 * n:11 * n + 3 * m].reshape(m, 3), w=theta[11 * n + 3 * m:])
        return np.concatenate(adbench.ba_residuals_numpy(trial))
    theta = np.concatenate([data["cams"].ravel(), data["x"].ravel(), data["w"]])
    fd = np.stack([(residuals(theta + 1e-6 * e) - residuals(theta - 1e-6 * e)) / 2e-6
                   for e in np.eye(len(theta))], axis=1)
    np.testing.assert_allclose(dense, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())


def test_ba_residual_at_zero_rotation_and_reversed():
    args = [0.0, 0.0, 0.0, 0.0, 0.0, 0.1, -0.2, 0.3, 2.0, 0.5, -0.5, 0.01, 0.001, 1.0, 2.0,
            5.0, 0.8, 0.3, 0.4]
    final = ba.residual(*args, engine="python")
    cam = np.array(args[2:13])
    want = adbench.ba_residual_numpy(cam, np.array(args[13:16]), 0.8, np.array(args[17:19]))
    np.testing.assert_allclose(final[:2], want, rtol=1e-12)
    np.testing.assert_allclose((~ba.residual)(*final, engine="python"), args, atol=1e-12)


@pytest.mark.parametrize("engine", ["python", "native"])
def test_ba_jacobian_at_zero_rotation(engine):
    """A camera with no rotation (r = 0): the Jacobian is the first-order Rodrigues
    formula's, where differentiating sqrt(|r|^2) at 0 stopped with a domain error."""
    if engine == "native":
        pytest.importorskip("llvmlite")
    data = ba_instance(n=1, m=2, p=2)
    data["cams"][:, :3] = 0.0
    J = ba.jacobian(data, engine=engine)["J"]
    eps, args = 1e-6, ba._rows(data)
    x = np.array([a[0] for a in args])

    def e(v):
        return np.array(ba.residual(*v, engine="python")[:2])
    fd = np.stack([(e(x + eps * d) - e(x - eps * d)) / (2 * eps)
                   for d in np.eye(len(x))[2:17]], axis=1)
    np.testing.assert_allclose(J["vals"][:30].reshape(2, 15), fd, rtol=1e-5, atol=1e-6)


def test_adbench_command_ba_json_and_errors(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools/adbench.py"), "ba",
                          str(ROOT / "tests/data/ba_small.txt"), "--json", "--engine",
                          "python", "--observations", "5"], capture_output=True, text=True,
                         check=True)
    J = json.loads(out.stdout)["J"]
    assert J["nrows"] == 15 and len(J["vals"]) == 5 * 30 + 5
    bad = subprocess.run([sys.executable, str(ROOT / "tools/adbench.py"), "gmm",
                          str(tmp_path / "missing.txt")], capture_output=True, text=True)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr


@pytest.mark.parametrize("problem,name,says", [("gmm", "1k/gmm_d2_K5", "no GMM input"),
                                               ("ba", "ba99", "no bundle-adjustment input")])
def test_benchmark_names_an_input_it_cannot_find(problem, name, says):
    bad = subprocess.run([sys.executable, str(ROOT / "tools/bench_adbench.py"), problem,
                          "--files", name], capture_output=True, text=True)
    assert bad.returncode == 1 and says in bad.stderr and name in bad.stderr
    assert "Traceback" not in bad.stderr
