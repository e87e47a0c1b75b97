"""ADBench GMM and bundle adjustment, side by side: rvm (native engine) against JAX (jit),
PyTorch and a numpy/scipy objective, on the ADBench input files.

    python tools/bench_adbench.py gmm [--files 1k/gmm_d2_K5.txt ...] [--repeat 3]
    python tools/bench_adbench.py ba [--files ba1 ba2 ...]

Times are the best of --repeat runs after a first (compiling) call, in seconds. rvm's
native code is compiled once per machine and cached; the first call's time is printed
separately. JAX runs with 64-bit floats. rvm's GMM splits the points across the cores
this process may run on where the problem is big enough (examples/gmm.py: cores), as
JAX's and PyTorch's thread pools use them; "rvm grad, 1 thread" is the gradient on the
calling thread alone.

    python tools/bench_adbench.py gmm|ba --memory [--files ...]

prints instead how much one call raises the peak memory (resident set) of a fresh process
per tool, after a warm-up call on the smallest file has loaded and started the tool (for
JAX, compiled for the warm-up's shapes only: its figure includes compiling again).
"""

import argparse
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tools"), str(ROOT / "tools" / "bench")]

import adbench
import ba
import gmm
from worker import best_of

DATA = gmm.DATA


def best(fn, repeat: int) -> float:
    return best_of(fn, repeat)


# ---------------------------------------------------------------------- GMM peers


def _tril(d: int):
    rows, cols = np.tril_indices(d, -1)
    order = np.lexsort((rows, cols))
    return rows[order], cols[order]


def jax_gmm(data: dict):
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp
    jax.config.update("jax_enable_x64", True)
    x, gamma, m = jnp.asarray(data["x"]), data["gamma"], data["m"]
    n, d = data["x"].shape
    rows, cols = _tril(d)
    c = gmm.constant(d, len(data["alphas"]), n, gamma, m)

    def objective(alphas, means, icf):
        q = icf[:, :d]
        Q = jnp.zeros((len(alphas), d, d)).at[:, np.arange(d), np.arange(d)].set(jnp.exp(q))
        Q = Q.at[:, rows, cols].set(icf[:, d:])
        qx = jnp.einsum("krc,nkc->nkr", Q, x[:, None, :] - means[None])
        main = alphas[None] + q.sum(1)[None] - 0.5 * (qx ** 2).sum(-1)
        return (logsumexp(main, axis=1).sum() - n * logsumexp(alphas) +
                (0.5 * gamma ** 2 * ((jnp.exp(q) ** 2).sum() + (icf[:, d:] ** 2).sum())
                 - m * q.sum()) + c)
    f = jax.jit(objective)
    g = jax.jit(jax.grad(objective, argnums=(0, 1, 2)))
    args = tuple(jnp.asarray(data[k]) for k in ("alphas", "means", "icf"))
    return (lambda: f(*args).block_until_ready(),
            lambda: jax.block_until_ready(g(*args)))


def torch_gmm(data: dict):
    import torch
    x = torch.tensor(data["x"])
    n, d = data["x"].shape
    rows, cols = (torch.tensor(v) for v in _tril(d))
    c = gmm.constant(d, len(data["alphas"]), n, data["gamma"], data["m"])
    gamma, m = data["gamma"], data["m"]

    def objective(alphas, means, icf):
        q = icf[:, :d]
        Q = torch.diag_embed(torch.exp(q))
        Q = Q.index_put((torch.arange(len(alphas))[:, None], rows[None], cols[None]),
                        icf[:, d:], accumulate=True)
        qx = torch.einsum("krc,nkc->nkr", Q, x[:, None, :] - means[None])
        main = alphas[None] + q.sum(1)[None] - 0.5 * (qx ** 2).sum(-1)
        return (torch.logsumexp(main, 1).sum() - n * torch.logsumexp(alphas, 0) +
                (0.5 * gamma ** 2 * ((torch.exp(q) ** 2).sum() + (icf[:, d:] ** 2).sum())
                 - m * q.sum()) + c)
    args = [torch.tensor(data[k], requires_grad=True) for k in ("alphas", "means", "icf")]

    def grad():
        for a in args:
            a.grad = None
        objective(*args).backward()
    return (lambda: objective(*args), grad)


def bench_gmm(files: list[str], repeat: int) -> None:
    print("| file | numpy obj | JAX obj | JAX grad | PyTorch grad | rvm obj | rvm grad | "
          "rvm grad/obj | rvm grad / JAX grad | rvm grad / PyTorch grad | rvm first grad | "
          "rvm threads | rvm grad, 1 thread |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in files:
        data = gmm.load(DATA / "gmm" / name)
        args = [data[k] for k in ("alphas", "means", "icf", "x", "gamma", "m")]
        t_np = best(lambda args=args: adbench.gmm_objective_numpy(*args), repeat)
        jf, jg = jax_gmm(data)
        jf(), jg()
        _, tg = torch_gmm(data)
        t_jf, t_jg, t_tg = best(jf, repeat), best(jg, repeat), best(tg, repeat)
        t = time.perf_counter()
        gmm.gradient(data, engine="native")
        first = time.perf_counter() - t
        gmm.objective(data, engine="native")
        t_rf = best(lambda data=data: gmm.objective(data, engine="native"), repeat)
        t_rg = best(lambda data=data: gmm.gradient(data, engine="native"), repeat)
        t_r1 = best(lambda data=data: gmm.gradient(data, engine="native", threads=1), repeat)
        print(f"| {name} | {t_np:.4f} | {t_jf:.5f} | {t_jg:.5f} | {t_tg:.5f} | {t_rf:.4f} | "
              f"{t_rg:.4f} | {t_rg / t_rf:.2f} | {t_rg / t_jg:.1f} | {t_rg / t_tg:.1f} | "
              f"{first:.1f} | {gmm.cores(data)} | {t_r1:.4f} |", flush=True)


PEAK_TOOLS = ("numpy-obj", "jax-grad", "torch-grad", "rvm-obj", "rvm-grad")
BA_PEAK_TOOLS = ("jax-J", "rvm-J")


def _gmm_call(tool: str, data: dict):
    if tool == "numpy-obj":
        args = [data[k] for k in ("alphas", "means", "icf", "x", "gamma", "m")]
        return lambda: adbench.gmm_objective_numpy(*args)
    if tool == "jax-grad":
        return jax_gmm(data)[1]
    if tool == "torch-grad":
        return torch_gmm(data)[1]
    if tool == "rvm-obj":
        return lambda: gmm.objective(data, engine="native")
    return lambda: gmm.gradient(data, engine="native")


def _gmm_warm(tool: str, data: dict):
    """The warm-up call of a tool; rvm's on one thread and on several (the smallest file
    runs on one; the others split their points: each way loads its own native code)."""
    if not tool.startswith("rvm"):
        return _gmm_call(tool, data)
    run = gmm.objective if tool == "rvm-obj" else gmm.gradient
    return lambda: [run(data, engine="native", threads=k) for k in (1, 2)]


def _peak_raise(warm, make) -> float:
    """MB by which one call of make() (made after warm() has run) raises this process's
    peak resident set."""
    warm()
    run = make()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024


def peak_gmm(tool: str, name: str) -> float:
    """One call on `name`, after a warm-up call on the smallest file (imports, start-up,
    rvm's cached native code)."""
    return _peak_raise(_gmm_warm(tool, gmm.load(DATA / "gmm" / "1k" / "gmm_d2_K5.txt")),
                       lambda: _gmm_call(tool, gmm.load(DATA / "gmm" / name)))


def ba_input(stem: str):
    """The bundle-adjustment input file named `stem` (ba1: ba1_n49_m7776_p31843.txt), or
    None."""
    return next((DATA / "ba").glob(f"{stem}_*.txt"), None)


def peak_ba(tool: str, stem: str) -> float:
    """As peak_gmm, for one bundle-adjustment Jacobian (warm-up: ba1)."""
    def call(stem):
        data = ba.load(ba_input(stem))
        return jax_ba(data) if tool == "jax-J" else lambda: ba.jacobian(data, engine="native")
    return _peak_raise(call("ba1"), lambda: call(stem))


def memory(problem: str, files: list[str], tools: tuple) -> None:
    print("| file | " + " | ".join(f"{t} MB" for t in tools) + " |")
    print("|---" * (len(tools) + 1) + "|")
    for name in files:
        row = [subprocess.run([sys.executable, __file__, problem, "--files", name, "--peak",
                               tool], capture_output=True, text=True, check=True).stdout
               for tool in tools]
        print(f"| {name} | " + " | ".join(f"{float(r):.1f}" for r in row) + " |",
              flush=True)


# ---------------------------------------------------------------------- BA peers


def jax_ba(data: dict):
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def residual(cam, x, w, feat):
        r, d = cam[:3], x - cam[3:6]
        theta = jnp.sqrt(r @ r)
        safe = jnp.where(theta == 0, 1.0, theta)
        u = r / safe
        rot = d * jnp.cos(theta) + jnp.cross(u, d) * jnp.sin(theta) + u * (u @ d) * (
            1 - jnp.cos(theta))
        y = jnp.where(theta == 0, d + jnp.cross(r, d), rot)
        p = y[:2] / y[2]
        s = p @ p
        return w * (cam[6] * p * (1 + cam[9] * s + cam[10] * s * s) + cam[7:9] - feat)
    both = jax.jacfwd(lambda *a: (residual(*a),) * 2, argnums=(0, 1, 2), has_aux=True)
    jac = jax.jit(jax.vmap(both))

    def run():       # from the data to ADBench's output, as ba.jacobian does for rvm
        cams = jnp.asarray(data["cams"][data["obs"][:, 0]])
        xs = jnp.asarray(data["x"][data["obs"][:, 1]])
        (jc, jx, jw), e = jac(cams, xs, jnp.asarray(data["w"]), jnp.asarray(data["feats"]))
        blocks = np.concatenate([np.asarray(jc), np.asarray(jx), np.asarray(jw)[..., None]],
                                axis=2)               # p x 2 x 15, then the same CSR
        return ba.assemble(data, blocks, np.asarray(e).ravel())
    return run


def bench_ba(files: list[str], repeat: int) -> None:
    print("| file | observations | rvm residuals | rvm J | rvm J / residuals | rvm first J | "
          "JAX jacfwd+vmap J | rvm / JAX |")
    print("|---|---|---|---|---|---|---|---|")
    for stem in files:
        data = ba.load(ba_input(stem))
        t = time.perf_counter()
        ba.jacobian(data, engine="native")
        first = time.perf_counter() - t
        t_r = best(lambda data=data: ba.jacobian(data, engine="native"), repeat)
        ba.residuals(data, engine="native")
        t_o = best(lambda data=data: ba.residuals(data, engine="native"), repeat)
        jrun = jax_ba(data)
        ours, theirs = ba.jacobian(data, engine="native"), jrun()
        assert np.allclose(ours["J"]["vals"], theirs["J"]["vals"], rtol=1e-9, atol=1e-12)
        assert np.allclose(ours["reproj_err"], theirs["reproj_err"], rtol=1e-12)
        t_j = best(jrun, repeat)
        print(f"| {stem} | {len(data['w'])} | {t_o:.4f} | {t_r:.3f} | {t_r / t_o:.1f} | "
              f"{first:.1f} | {t_j:.3f} | {t_r / t_j:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", choices=["gmm", "ba"])
    ap.add_argument("--files", nargs="*")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--memory", action="store_true", help="peak memory, not times")
    ap.add_argument("--peak", choices=PEAK_TOOLS + BA_PEAK_TOOLS,
                    help=argparse.SUPPRESS)       # one tool on one file, in this process
    args = ap.parse_args()
    if args.peak:
        print((peak_gmm if args.problem == "gmm" else peak_ba)(args.peak, args.files[0]))
    elif args.problem == "gmm":
        files = args.files or [f"{s}/gmm_d{d}_K{k}.txt" for s, ds in (("1k", (2, 10, 20)),
                                                                    ("10k", (2, 10)))
                               for d in ds for k in (5, 10, 25, 50, 100, 200)]
        missing = [f for f in files if not (DATA / "gmm" / f).is_file()]
        if missing:
            sys.exit(f"bench_adbench.py: no GMM input {missing[0]!r} under {DATA / 'gmm'} "
                     "(names like 1k/gmm_d2_K5.txt)")
        if args.memory:
            memory("gmm", files, PEAK_TOOLS)
        else:
            bench_gmm(files, args.repeat)
    else:
        files = args.files or [f"ba{k}" for k in range(1, 6)]
        missing = [f for f in files if ba_input(f) is None]
        if missing:
            sys.exit(f"bench_adbench.py: no bundle-adjustment input {missing[0]!r} under "
                     f"{DATA / 'ba'} (names like ba1)")
        if args.memory:
            memory("ba", files, BA_PEAK_TOOLS)
        else:
            bench_ba(files, args.repeat)


if __name__ == "__main__":
    main()
