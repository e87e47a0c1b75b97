"""One benchmark measurement in this process; prints one JSON line.

    python tools/bench/worker.py WORKLOAD TOOL [PARAM]

Workloads: bessel (us per gradient of J2 at 1.0), leapfrog N (time and peak memory of
d q_N / d q_0), embedding K (us per gradient of the Petersen graph embedding loss in
dimension K), sparse (forward and gradient of a 1000 x 1000 sparse dot product).
"""

import json
import math
import pathlib
import resource
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "tools" / "bench")]


def best_of(f, repeat: int = 3, warm: bool = False) -> float:
    """The best of `repeat` timed calls of f, in seconds (after one untimed call if warm)."""
    if warm:
        f()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t)
    return best


def per_call(f, budget=1.0):
    """Seconds per call: best of 5 batches sized to take about budget/5 seconds."""
    f()
    n, t = 1, 0.0
    while t < budget / 20:
        n *= 2
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        t = time.perf_counter() - t0
    best = t / n
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


# ---------------------------------------------------------------- Bessel J2'(1.0)
def j_series(nu, z, atol=1e-17):
    term = (z / 2) ** nu / math.factorial(nu)
    total, k = term, 0
    while abs(term) > atol:
        k += 1
        term = term * -(z / 2) ** 2 / (k * (k + nu))
        total += term
    return total


def bessel(tool):
    if tool.startswith("rvm-"):
        from besselj import besselj_inplace

        import rvm
        g = rvm.grad(besselj_inplace, loss="out", engine=tool[4:])
        return g(0.0, 2, 1.0)[2], per_call(lambda: g(0.0, 2, 1.0))
    if tool == "python-forward":
        return j_series(2, 1.0), per_call(lambda: j_series(2, 1.0))
    if tool == "numba-hand":
        import numba
        jit = numba.njit(cache=False)

        @jit
        def jn(nu, z):
            term = (z / 2) ** nu
            for i in range(1, nu + 1):
                term /= i
            total, k = term, 0
            while abs(term) > 1e-17:
                k += 1
                term = term * -(z / 2) ** 2 / (k * (k + nu))
                total += term
            return total

        @jit
        def djn(nu, z):           # J_nu' = (J_{nu-1} - J_{nu+1}) / 2, by hand
            return (jn(nu - 1, z) - jn(nu + 1, z)) / 2
        return djn(2, 1.0), per_call(lambda: djn(2, 1.0))
    if tool == "autograd":
        import autograd
        import autograd.numpy as anp

        def f(z):
            term = (z / 2) ** 2 / 2.0
            total, k = term, 0
            while anp.abs(term) > 1e-17:
                k += 1
                term = term * -(z / 2) ** 2 / (k * (k + 2))
                total = total + term
            return total
        g = autograd.grad(f)
        return float(g(1.0)), per_call(lambda: g(1.0))
    if tool == "torch":
        import torch

        def g():
            z = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
            bessel_torch(z).backward()
            return z.grad.item()
        return g(), per_call(g)
    if tool == "jax":
        import jax
        import jax.numpy as jnp
        g = jax.jit(jax.grad(bessel_jax()))
        z = jnp.float64(1.0)
        return float(g(z)), per_call(lambda: g(z).block_until_ready())
    raise SystemExit(f"unknown tool {tool}")


def bessel_jax():
    """J_2 in JAX (64-bit): a fixed trip count of 20 terms, as JAX's loops need."""
    import jax
    jax.config.update("jax_enable_x64", True)

    def f(z):
        def body(k, carry):
            term, total = carry
            term = term * -(z / 2) ** 2 / (k * (k + 2))
            return term, total + term
        term = (z / 2) ** 2 / 2.0
        return jax.lax.fori_loop(1, 21, body, (term, term))[1]
    return f


def bessel_torch(z):
    """J_2 of the tensor z in PyTorch: terms until one falls below 1e-17."""
    term = (z / 2) ** 2 / 2.0
    total, k = term, 0
    while abs(term.item()) > 1e-17:
        k += 1
        term = term * -(z / 2) ** 2 / (k * (k + 2))
        total = total + term
    return total


# ---------------------------------------------------------------- leapfrog
def leapfrog(tool, n):
    dt, q0 = 1e-3, 1.0
    if tool.startswith("rvm-"):
        from programs import leapfrog as lf

        import rvm
        g = rvm.grad(lf, loss="q", engine=tool[4:])
        g(q0, 0.0, 10, dt)              # compile outside the measurement
        return lambda: g(q0, 0.0, n, dt)[0]
    if tool == "autograd":
        import autograd
        import autograd.numpy as anp

        def f(q):
            p = 0.0
            for _ in range(n):
                p = p - dt * anp.sin(q)
                q = q + dt * p
            return q
        g = autograd.grad(f)
        return lambda: float(g(q0))
    if tool == "torch":
        import torch

        def run():
            q = torch.tensor(q0, dtype=torch.float64, requires_grad=True)
            leapfrog_torch(q, n, dt).backward()
            return q.grad.item()
        return run
    if tool == "jax":
        import jax
        g = jax.jit(jax.grad(leapfrog_jax(n, dt)))   # compiled for this n on the first call
        return lambda: float(g(q0))
    raise SystemExit(f"unknown tool {tool}")


def leapfrog_jax(n, dt):
    """q_N as a function of q_0 in JAX (64-bit)."""
    import jax
    jax.config.update("jax_enable_x64", True)

    def f(q):
        def body(_, c):
            q, p = c
            p = p - dt * jax.numpy.sin(q)
            return q + dt * p, p
        return jax.lax.fori_loop(0, n, body, (q, 0.0))[0]
    return f


def leapfrog_torch(q, n, dt):
    """q_N from the tensor q_0 in PyTorch (the graph records every step)."""
    import torch
    x, p = q, torch.tensor(0.0, dtype=torch.float64)
    for _ in range(n):
        p = p - dt * torch.sin(x)
        x = x + dt * p
    return x


# ---------------------------------------------------------------- graph embedding
def petersen():
    outer = [(i, (i + 1) % 5) for i in range(5)]
    spokes = [(i, i + 5) for i in range(5)]
    inner = [(5 + i, 5 + (i + 2) % 5) for i in range(5)]
    edges = {tuple(sorted(e)) for e in outer + spokes + inner}
    pairs = [(i, j) for i in range(10) for j in range(i + 1, 10)]
    l1 = np.array(sorted(edges), dtype=np.int64)
    l2 = np.array([p for p in pairs if p not in edges], dtype=np.int64)
    return l1, l2


def embedding_numpy(np_, x, l1, l2):
    def stats(pairs):
        d = np_.sqrt(np_.sum((x[pairs[:, 0]] - x[pairs[:, 1]]) ** 2, axis=1))
        m = np_.mean(d)
        return m, np_.mean((d - m) ** 2)
    m1, v1 = stats(l1)
    m2, v2 = stats(l2)
    return v1 + v2 + np_.exp(np_.maximum(m1 - m2 + 0.1, 0.0)) - 1.0


def embedding(tool, k):
    l1, l2 = petersen()
    x = np.random.default_rng(k).normal(size=(10, k))
    if tool.startswith("rvm-"):
        from programs import embedding_loss

        import rvm
        g = rvm.grad(embedding_loss, loss="out", engine=tool[4:])
        return g(0.0, x, l1, l2)[1], lambda: g(0.0, x, l1, l2)
    if tool == "autograd":
        import autograd
        import autograd.numpy as anp
        g = autograd.grad(lambda x: embedding_numpy(anp, x, l1, l2))
        return g(x), lambda: g(x)
    if tool == "torch":
        import torch
        a, b = torch.tensor(l1), torch.tensor(l2)

        def run():
            t = torch.tensor(x, requires_grad=True)
            embedding_numpy(_TorchNp(torch), t, a, b).backward()
            return t.grad.numpy()
        return run(), run
    if tool == "jax":
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp
        g = jax.jit(jax.grad(lambda x: embedding_numpy(jnp, x, l1, l2)))
        return np.asarray(g(x)), lambda: g(x).block_until_ready()
    raise SystemExit(f"unknown tool {tool}")


class _TorchNp:
    def __init__(self, torch):
        self.t = torch

    def sqrt(self, v):
        return self.t.sqrt(v)

    def sum(self, v, axis):
        return self.t.sum(v, dim=axis)

    def mean(self, v):
        return self.t.mean(v)

    def exp(self, v):
        return self.t.exp(v)

    def maximum(self, v, c):
        return self.t.clamp(v, min=c)


# ---------------------------------------------------------------- sparse dot
def sparse(tool):
    from sparse_dot import random_csc
    rng = np.random.default_rng(7)
    A, ap, ar, av = random_csc(rng, 1000, 1000, 0.05)
    B, bp, br, bv = random_csc(rng, 1000, 1000, 0.05)
    args = (0.0, ap, ar, av, bp, br, bv, 1000)
    if tool.startswith("rvm-"):
        from sparse_dot import sparse_dot

        import rvm
        eng = tool[4:]
        f = lambda: sparse_dot(*args, engine=eng)
        g = rvm.grad(sparse_dot, loss="out", engine=eng)
        return per_call(f, 2.0), per_call(lambda: g(*args), 2.0), float(f()[0])
    if tool == "scipy":
        import scipy.sparse as sp
        sa, sb = sp.csc_matrix(A), sp.csc_matrix(B)
        f = lambda: sa.multiply(sb).sum()
        return per_call(f), per_call(lambda: (sb.multiply(sa != 0), sa.multiply(sb != 0))), \
            float(f())
    raise SystemExit(f"unknown tool {tool}")


def main():
    workload, tool, *param = sys.argv[1:]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"workload": workload, "tool": tool}
    if workload == "bessel":
        value, t = bessel(tool)
        out.update(value=value, us=t * 1e6)
    elif workload == "leapfrog":
        # peak memory: from before the first full-size call (for JAX that call also
        # compiles); time: a second call
        n = int(param[0])
        run = leapfrog(tool, n)
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        value = run()
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
        t0 = time.perf_counter()
        run()
        out.update(n=n, value=value, seconds=time.perf_counter() - t0, peak_mb=peak)
    elif workload == "embedding":
        k = int(param[0])
        value, run = embedding(tool, k)
        out.update(k=k, us=per_call(run) * 1e6, norm=float(np.linalg.norm(value)))
    elif workload == "sparse":
        fwd, grad, value = sparse(tool)
        out.update(forward_ms=fwd * 1e3, gradient_ms=grad * 1e3, value=value)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
