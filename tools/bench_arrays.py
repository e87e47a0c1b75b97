"""Array instructions against numpy and JAX, one core each (run it under `taskset -c 1`):
y += A @ x (n = 1000), C += A @ B (256^3) and s += x @ y (n = 10^6), forward and
gradient, on the default and the native engine, beside numpy's forward, numpy's
hand-written gradient (the forward and the vector-Jacobian products: A.T @ ybar and
outer(ybar, x) for GEMV) and JAX's jit(grad) of a loss that reads every output
(sum(w * (A @ x))), so that no peer may skip work rvm does.

    taskset -c 1 python tools/bench_arrays.py [--engines interp,native] [--products]

--products: instead, native code's time per multiply-add for C += A @ B with m = 10^4 rows
and narrow to wide rows (n) and shallow to deep inner dimensions (k), each product run
100 times in one call, beside numpy's `C += A @ B` (where native code calls BLAS and
where it runs its own loops: rvm.engines.arraylowering).
"""

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

from worker import per_call  # the benchmarks' timing: best of 5 sized batches

import rvm

PROGRAMS = rvm.assemble("""
.func gemv(r0, r1, r2, r3, r4, r5, r6)      ; y (m) += A (m x n) @ x (n)
    VMADD [r0 : 1, 0], [r2 : r4, 1], [r5 : 1, 0], r3, r4, 1
.end
.func gemm(r0, r1, r2, r3, r4, r5, r6, r7, r8)   ; C (m x n) += A (m x k) @ B (k x n)
    VMADD [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], r1, r5, r8
.end
.func dot(r0, r1, r2, r3, r4, r5)           ; s (one cell) += x @ y
    VMADD [r0 : 0, 0], [r2 : 0, 1], [r4 : 1, 0], 1, r3, 1
.end
""")


def cases(rng):
    n = 1000
    A, x = rng.normal(size=(n, n)), rng.normal(size=n)
    B, M = rng.normal(size=(256, 256)), rng.normal(size=(256, 256))
    u, v = rng.normal(size=10**6), rng.normal(size=10**6)
    return [
        ("y += A @ x (n = 1000)", "gemv", (np.zeros(n), A, x),
         lambda: A @ x, lambda w: (A @ x, A.T @ w, np.outer(w, x)),
         lambda A_, x_, w: (w * (A_ @ x_)).sum(), (A, x)),
        ("C += A @ B (256^3)", "gemm", (np.zeros((256, 256)), B, M),
         lambda: B @ M, lambda W: (B @ M, W @ M.T, B.T @ W),
         lambda A_, B_, W: (W * (A_ @ B_)).sum(), (B, M)),
        ("s += x @ y (n = 10^6)", "dot", (np.zeros(1), u, v),
         lambda: u @ v, lambda w: (u @ v, w * v, w * u),
         lambda x_, y_, w: w * (x_ @ y_), (u, v)),
    ]


def jax_grad(loss, args, seed):
    try:
        os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                              "intra_op_parallelism_threads=1")
        import jax
        jax.config.update("jax_enable_x64", True)
    except ImportError:
        return None
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    a = [jax.numpy.asarray(x) for x in args]
    w = jax.numpy.asarray(seed)
    return per_call(lambda: jax.block_until_ready(g(*a, w)))


REPEATED = rvm.assemble("""
.func gemm(r0, r1, r2, r3, r4, r5, r6, r7, r8, r9)   ; C += A @ B, r9 times
top:    CF.NE   r10, 0, back
        VMADD [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], r1, r5, r8
        INC     r10
exitbr: BR.GE   r10, r9, done
back:   JMP     top
done:   CF      exitbr
        SUB     r10, r9
.end
""")


def products(rng, m=10_000, reps=100):
    depths, widths = (1, 2, 4, 8, 16, 64), (1, 2, 4, 8, 16, 128)
    machine = rvm.Machine(REPEATED, engine="native", max_steps=10**12)
    print(f"ns per multiply-add of C += A @ B, C {m:,} x n, A {m:,} x k: rvm native / "
          "numpy")
    print("| n \\ k | " + " | ".join(map(str, depths)) + " |")
    print("|---" * (len(depths) + 1) + "|")
    for n in widths:
        cells = []
        for k in depths:
            C, A, B = np.zeros((m, n)), rng.normal(size=(m, k)), rng.normal(size=(k, n))
            once, many = (per_call(lambda r=r, C=C, A=A, B=B: machine.call("gemm", C, A, B, r))
                          for r in (1, 1 + reps))
            ours = (many - once) / reps / (m * k * n) * 1e9
            theirs = per_call(lambda C=C, A=A, B=B: np.add(C, A @ B, out=C)) / (m * k * n) * 1e9
            cells.append(f"{ours:.2f} / {theirs:.2f}")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", default="interp,native")
    ap.add_argument("--products", action="store_true")
    opts = ap.parse_args()
    if opts.products:
        return products(np.random.default_rng(0))
    rng = np.random.default_rng(0)
    print("| operation | numpy forward | numpy gradient by hand | JAX jit(grad) | engine "
          "| rvm forward | rvm gradient | gradient / numpy's by hand |")
    print("|---|---|---|---|---|---|---|---|")
    for title, name, args, np_fwd, np_vjp, jloss, jargs in cases(rng):
        seed = rng.normal(size=np.shape(np_fwd()))
        t_np = per_call(np_fwd)
        t_vjp = per_call(lambda f=np_vjp, w=seed: f(w))
        t_jax = jax_grad(jloss, jargs, seed)
        for engine in opts.engines.split(","):
            m = rvm.Machine(PROGRAMS, engine=engine)
            t_fw = per_call(lambda m=m, f=name, a=args: m.call(f, *a))
            grad = rvm.grad(PROGRAMS[name], loss=(0, 0), engine=engine)
            t_g = per_call(lambda g=grad, a=args: g(*a))
            jax_text = f"{t_jax * 1e3:.2f}" if t_jax is not None else "-"
            print(f"| {title} | {t_np * 1e3:.2f} ms | {t_vjp * 1e3:.2f} ms | {jax_text} ms "
                  f"| {engine} | {t_fw * 1e3:.2f} ms | {t_g * 1e3:.2f} ms | "
                  f"{t_g / t_vjp:.2f} |")


if __name__ == "__main__":
    main()
