"""Second derivatives side by side: Hessian-vector products, Hessians and the second
derivative of a long time integration, rvm against JAX and PyTorch.

    python tools/bench_second.py bessel            # HVP of J2 at 1.0 (and HVP / gradient)
    python tools/bench_second.py embedding [K...]  # HVP and Hessian of the graph embedding
    python tools/bench_second.py embedding-times [K...]  # its objective and gradient per k
    python tools/bench_second.py leapfrog [N...]   # d^2 q_N / d q_0^2, time and peak memory

rvm runs on the native engine (forward over reverse for register code; reverse over
forward for array code); JAX is jit-compiled `jvp(grad)` / `hessian`; PyTorch is double
backward. Times are per call (best of several batches, after a first compiling call);
memory is the growth of the process's peak RSS over the first run at that size (for JAX
that run also compiles), each measurement in a fresh process; the time is a second run's.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tools" / "bench")]

from worker import bessel_jax, bessel_torch, per_call

# ---------------------------------------------------------------------- Bessel


def bessel() -> None:
    import jax
    import torch
    from besselj import besselj_inplace

    import rvm
    jax.config.update("jax_enable_x64", True)
    g = rvm.grad(besselj_inplace, loss="out", engine="native")

    def h():
        return rvm.hvp(besselj_inplace, (0.0, 2, 1.0), (0.0, None, 1.0), loss="out",
                       engine="native")[2]
    g(0.0, 2, 1.0)
    value = h()

    jh = jax.jit(lambda z: jax.jvp(jax.grad(bessel_jax()), (z,), (1.0,))[1])
    z = jax.numpy.float64(1.0)

    def th():
        x = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
        (d,) = torch.autograd.grad(bessel_torch(x), x, create_graph=True)
        (d2,) = torch.autograd.grad(d, x)
        return d2.item()
    t_g, t_h = per_call(lambda: g(0.0, 2, 1.0)), per_call(h)
    print("| J2''(1.0) | value | us per call |")
    print("|---|---|---|")
    print(f"| rvm.hvp (native) | {value:.15g} | {t_h * 1e6:.1f} |")
    print(f"| jax.jvp(jax.grad), jit | {float(jh(z)):.15g} | "
          f"{per_call(lambda: jh(z).block_until_ready()) * 1e6:.1f} |")
    print(f"| PyTorch double backward | {th():.15g} | {per_call(th) * 1e6:.1f} |")
    print(f"\nrvm: HVP time / gradient time = {t_h / t_g:.2f} "
          f"(gradient {t_g * 1e6:.1f} us)")


# ---------------------------------------------------------------------- graph embedding


def embedding_peers(l1, l2):
    """The graph-embedding loss in JAX and in PyTorch (the same formula as the example)."""
    import jax
    import jax.numpy as jnp
    import torch
    jax.config.update("jax_enable_x64", True)

    def jloss(x):
        d1 = jnp.sqrt(((x[l1[:, 0]] - x[l1[:, 1]]) ** 2).sum(1))
        d2 = jnp.sqrt(((x[l2[:, 0]] - x[l2[:, 1]]) ** 2).sum(1))
        gap = d1.mean() - d2.mean() + 0.1
        return d1.var() + d2.var() + jnp.where(gap > 0, jnp.exp(gap) - 1, 0.0)
    t1, t2 = torch.tensor(l1), torch.tensor(l2)

    def tloss(x):
        d1 = ((x[t1[:, 0]] - x[t1[:, 1]]) ** 2).sum(1).sqrt()
        d2 = ((x[t2[:, 0]] - x[t2[:, 1]]) ** 2).sum(1).sqrt()
        gap = d1.mean() - d2.mean() + 0.1
        return d1.var(unbiased=False) + d2.var(unbiased=False) + \
            torch.where(gap > 0, torch.exp(gap) - 1, torch.zeros(()))
    return jloss, tloss


def embedding(ks) -> None:
    import jax
    import torch
    from graph_embedding import embedding_loss, petersen

    import rvm
    l1, l2 = petersen()
    jloss, tloss = embedding_peers(l1, l2)
    jhvp = jax.jit(lambda x, v: jax.jvp(jax.grad(jloss), (x,), (v,))[1])
    jhess = jax.jit(jax.hessian(jloss))

    def thvp(x, v):
        x = torch.tensor(x, requires_grad=True)
        (g,) = torch.autograd.grad(tloss(x), x, create_graph=True)
        (h,) = torch.autograd.grad(g, x, torch.tensor(v))
        return h
    grad = rvm.grad(embedding_loss, loss="out", engine="native")
    hess = rvm.hessian(embedding_loss, loss="out", wrt=["x"], engine="native")
    print("| k | rvm grad us | rvm HVP us | HVP / grad | JAX HVP us | PyTorch HVP us | "
          "rvm HVP / JAX | rvm Hessian ms | jax.hessian ms | rvm Hessian / JAX |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in ks:
        rng = np.random.default_rng(k)
        x, v = rng.normal(size=(10, k)), rng.normal(size=(10, k))

        def h(x=x, v=v):
            return rvm.hvp(embedding_loss, (0.0, x, l1, l2), (0.0, v, None, None),
                           loss="out", engine="native")[1]
        got, want = h(), np.asarray(jhvp(x, v))
        assert np.allclose(got, want, rtol=1e-8, atol=1e-10), (k, got, want)
        assert np.allclose(hess(0.0, x, l1, l2), np.asarray(jhess(x)).reshape(10 * k, -1),
                           rtol=1e-8, atol=1e-10)
        t_g = per_call(lambda x=x: grad(0.0, x, l1, l2))
        t_h = per_call(h)
        t_jh = per_call(lambda x=x, v=v: jhvp(x, v).block_until_ready())
        t_th = per_call(lambda x=x, v=v: thvp(x, v))
        t_H = per_call(lambda x=x: hess(0.0, x, l1, l2), budget=2.0)
        t_jH = per_call(lambda x=x: jhess(x).block_until_ready())
        print(f"| {k} | {t_g * 1e6:.0f} | {t_h * 1e6:.0f} | {t_h / t_g:.2f} | "
              f"{t_jh * 1e6:.0f} | {t_th * 1e6:.0f} | {t_h / t_jh:.1f} | {t_H * 1e3:.2f} | "
              f"{t_jH * 1e3:.3f} | {t_H / t_jH:.0f} |", flush=True)


# NiLang paper (Liu & Zhao), Table 3: seconds on the authors' machine, for context only
TABLE3 = {"k": (2, 4, 6, 8, 10),
          "NiLang-O": (7.173e-06, 7.783e-06, 8.558e-06, 9.212e-06, 1.002e-05),
          "NiLang-G": (1.509e-05, 1.690e-05, 1.872e-05, 2.076e-05, 2.266e-05),
          "(NiLang+F)-H": (4.528e-04, 1.025e-03, 1.740e-03, 2.577e-03, 3.558e-03)}


def embedding_times(ks) -> None:
    """Objective and gradient per call for each k: rvm, JAX, PyTorch, and Table 3."""
    import jax
    import torch
    from graph_embedding import embedding_loss, petersen

    import rvm
    l1, l2 = petersen()
    jloss, tloss = embedding_peers(l1, l2)
    jobj, jgrad = jax.jit(jloss), jax.jit(jax.grad(jloss))
    grad = rvm.grad(embedding_loss, loss="out", engine="native")

    def tgrad(x):
        x = torch.tensor(x, requires_grad=True)
        tloss(x).backward()
        return x.grad
    print("| k | rvm objective us | rvm gradient us | G / O | JAX O us | JAX G us | "
          "PyTorch O us | PyTorch G us | NiLang-O us | NiLang-G us | NiLang G / O |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in ks:
        x = np.random.default_rng(k).normal(size=(10, k))
        value = embedding_loss(0.0, x, l1, l2, engine="native")[0]
        assert np.isclose(value, float(jobj(x)), rtol=1e-12), (k, value)
        assert np.allclose(grad(0.0, x, l1, l2)[1], np.asarray(jgrad(x)), rtol=1e-8,
                           atol=1e-12)
        t_o = per_call(lambda x=x: embedding_loss(0.0, x, l1, l2, engine="native"))
        t_g = per_call(lambda x=x: grad(0.0, x, l1, l2))
        t_jo = per_call(lambda x=x: jobj(x).block_until_ready())
        t_jg = per_call(lambda x=x: jgrad(x).block_until_ready())
        xt = torch.tensor(x)
        t_to = per_call(lambda xt=xt: tloss(xt))
        t_tg = per_call(lambda x=x: tgrad(x))
        ctx = "| | |"
        if k in TABLE3["k"]:
            j = TABLE3["k"].index(k)
            o, g = TABLE3["NiLang-O"][j], TABLE3["NiLang-G"][j]
            ctx = f"| {o * 1e6:.1f} | {g * 1e6:.1f} | {g / o:.2f} |"
        print(f"| {k} | {t_o * 1e6:.0f} | {t_g * 1e6:.0f} | {t_g / t_o:.2f} | "
              f"{t_jo * 1e6:.1f} | {t_jg * 1e6:.1f} | {t_to * 1e6:.0f} | {t_tg * 1e6:.0f} "
              + ctx, flush=True)


# ---------------------------------------------------------------------- leapfrog


LEAPFROG = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
tool, n = sys.argv[1], int(sys.argv[2])
dt, q0 = 1e-3, 1.0
if tool == "rvm":
    import rvm
    from programs import leapfrog
    # rounding leaves the second-derivative program's uncomputed ancillas about 1e-6 from
    # zero after 10^5 steps and 3e-3 after 10^6 (values of order 10^3 pass through them):
    # above the default absolute tolerance of 1e-8, so the run allows 0.1
    opts = dict(engine="native", tol=0.1, max_steps=10**13)
    def run():
        return rvm.hvp(leapfrog, (q0, 0.0, n, dt), (1.0, 0.0, None, 0.0), loss="q", **opts)[0]
    rvm.hvp(leapfrog, (q0, 0.0, 10, dt), (1.0, 0.0, None, 0.0), loss="q", **opts)
elif tool == "jax":
    import jax
    from worker import leapfrog_jax
    h = jax.jit(jax.grad(jax.grad(leapfrog_jax(n, dt))))
    run = lambda: float(h(q0))   # compiled for this N on the first (measured) call
else:
    import torch
    from worker import leapfrog_torch
    def run():
        q = torch.tensor(q0, dtype=torch.float64, requires_grad=True)
        x = leapfrog_torch(q, n, dt)
        (d,) = torch.autograd.grad(x, q, create_graph=True)
        (d2,) = torch.autograd.grad(d, q)
        return d2.item()
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
value = run()                  # the first run at this N: its peak memory
grow = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
t = time.perf_counter()
value = run()                  # a second run: its time
seconds = time.perf_counter() - t
print(json.dumps({"value": value, "seconds": seconds, "mb": grow}))
"""


def leapfrog(sizes, tools=("rvm", "jax", "torch")) -> None:
    print("| tool | N | d2 q_N / d q_0^2 | seconds | peak memory growth (MB) |")
    print("|---|---|---|---|---|")
    for tool in tools:
        for n in sizes:
            if tool == "torch" and n > 10 ** 5:
                print(f"| {tool} | {n} | - | - | (skipped: the graph for 10^6 steps "
                      "does not fit comfortably) |")
                continue
            r = subprocess.run([sys.executable, "-c", LEAPFROG, tool, str(n),
                                str(ROOT / "tools" / "bench")], capture_output=True,
                               text=True, timeout=3600)
            if r.returncode:
                print(f"| {tool} | {n} | failed: {r.stderr.strip().splitlines()[-1][:60]} "
                      "| | |")
                continue
            out = json.loads(r.stdout.strip().splitlines()[-1])
            print(f"| {tool} | {n} | {out['value']:.12g} | {out['seconds']:.3f} | "
                  f"{out['mb']:.1f} |", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "bessel"
    rest = [int(a) for a in sys.argv[2:]]
    if what == "bessel":
        bessel()
    elif what == "embedding":
        embedding(rest or range(2, 11))
    elif what == "embedding-times":
        embedding_times(rest or range(1, 11))
    elif what == "leapfrog":
        leapfrog(rest or [10 ** 4, 10 ** 5, 10 ** 6])
    else:
        raise SystemExit(__doc__)
