"""Per-call costs from Python on the native engine (after a first call has compiled):
a small forward call, a Bessel gradient, and rvm.vmap of the Bessel gradient per point,
beside the same series and its derivative written by hand as one numba loop over the
points (the fair reference for a compiled batch: no reversibility, no checks), for both
versions in examples/besselj.py: `besselj` (NiLang's approximate multiplier, terms down
to 1e-8) and `besselj_inplace` (exact in-place multiplication, terms down to 1e-17); and
JAX's jit(vmap(grad)) of the series over the same points, if JAX is installed; and
rvm.vmap of the forward-mode derivative (rvm.tangent) of each version.

    python tools/bench_calls.py
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tools" / "bench")]

from besselj import besselj, besselj_inplace
from worker import per_call  # the benchmarks' timing: best of 5 sized batches

import rvm
from rvm.engines import native

ATOL = 1e-8       # the examples' stopping rules: add terms while |term| > ATOL
ATOL_INPLACE = 1e-17


def bessel_grad_by_hand(nu: int, zs, values, grads, atol=ATOL):
    """J_nu(z) and dJ_nu/dz at every z, from the series the example sums, each term
    from the previous one (ratio -(z/2)^2 / (k (k + nu))) with its z-derivative."""
    for i in range(zs.shape[0]):
        h = zs[i] / 2
        fact = 1.0
        for j in range(1, nu + 1):
            fact *= j
        term = h ** nu / fact
        dterm = nu * h ** (nu - 1) / (2 * fact) if nu > 0 else 0.0
        s, ds, k = term, dterm, 0
        while abs(term) > atol:
            k += 1
            ratio, dratio = -h * h / (k * (k + nu)), -h / (k * (k + nu))
            term, dterm = term * ratio, dterm * ratio + term * dratio
            s += term
            ds += dterm
        values[i], grads[i] = s, ds


def main():
    poly = rvm.load(ROOT / "asm" / "poly.rasm", engine="native")
    grad = rvm.grad(besselj, loss="out", engine="native")
    zs = np.linspace(0.5, 3.0, 100_000)
    batch = rvm.vmap(grad, in_axes=(None, None, 0))
    batch(0.0, 2, zs[:10])
    t = per_call(lambda: batch(0.0, 2, zs))
    print("| call (native engine, compiled) | us |")
    print("|---|---|")
    print(f"| prog.call of asm/poly.rasm (3 scalars) | "
          f"{per_call(lambda: poly.call('f', 0.0, 1.0, 3.0)) * 1e6:.2f} |")
    auto = rvm.load(ROOT / "asm" / "poly.rasm")       # the default engine: native from
    for _ in range(4):                                  # the fourth run on
        auto.call("f", 0.0, 1.0, 3.0)
    print(f"| the same with the default engine (auto), from the fourth call | "
          f"{per_call(lambda: auto.call('f', 0.0, 1.0, 3.0)) * 1e6:.2f} |")
    print(f"| rvm.grad of J_2 at one point | "
          f"{per_call(lambda: grad(0.0, 2, 1.0)) * 1e6:.2f} |")
    print(f"| rvm.vmap of that gradient, per point (10^5 points) | {t / len(zs) * 1e6:.2f} |")
    if native.available:
        import numba
        hand = numba.njit(bessel_grad_by_hand)
        for f, atol in ((besselj, ATOL), (besselj_inplace, ATOL_INPLACE)):
            against_hand(f, atol, hand, zs)
    try:
        import jax
    except ImportError:
        return
    from worker import bessel_jax  # J_2 summed over a fixed 20 terms
    batch_jax = jax.jit(jax.vmap(jax.grad(bessel_jax())))
    zj = jax.numpy.asarray(zs)
    assert np.allclose(np.asarray(batch_jax(zj)), batch(0.0, 2, zs)[2], atol=1e-7)
    print(f"| jax.jit(jax.vmap(jax.grad)) of J_2, per point (10^5 points) | "
          f"{per_call(lambda: batch_jax(zj).block_until_ready()) / len(zs) * 1e6:.3f} |")


def against_hand(f, atol, hand, zs):
    """rvm.vmap of f's gradient (both cores, then one) against the hand-written loop."""
    batch = rvm.vmap(rvm.grad(f, loss="out", engine="native"), in_axes=(None, None, 0))
    values, grads = np.empty_like(zs), np.empty_like(zs)
    hand(2, zs, values, grads, atol)
    ours = batch(0.0, 2, zs)
    # besselj multiplies approximately (a dirty ancilla): agreement to ~1e-8
    assert np.allclose(grads, ours[2], atol=1e-7), "the references disagree"
    t = per_call(lambda: batch(0.0, 2, zs))
    h = per_call(lambda: hand(2, zs, values, grads, atol))
    native.THREAD_ROWS, rows = 10 ** 12, native.THREAD_ROWS    # rvm on one core too
    t1 = per_call(lambda: batch(0.0, 2, zs))
    native.THREAD_ROWS = rows
    name = f.__name__
    print(f"| {name}: rvm.vmap of the gradient, both cores / one core, per point | "
          f"{t / len(zs) * 1e6:.3f} / {t1 / len(zs) * 1e6:.3f} |")
    print(f"| {name}: a hand-written numba loop (one core), per point | "
          f"{h / len(zs) * 1e6:.3f} |")
    print(f"| {name}: rvm.vmap / hand-written numba: both cores, core for core | "
          f"{t / h:.1f}, {t1 / h:.1f} |")
    tangent = rvm.vmap(rvm.tangent(f, engine="native"), in_axes=(None, None, 0, None, None))
    assert np.allclose(tangent(0.0, 2, zs, 0.0, 1.0)[3], grads, atol=1e-7)
    native.THREAD_ROWS, rows = 10 ** 12, native.THREAD_ROWS
    t1 = per_call(lambda: tangent(0.0, 2, zs, 0.0, 1.0))
    native.THREAD_ROWS = rows
    print(f"| {name}: rvm.vmap of rvm.tangent (forward mode), one core, per point | "
          f"{t1 / len(zs) * 1e6:.3f} |")


if __name__ == "__main__":
    main()
