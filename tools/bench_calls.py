"""Per-call costs from Python on the native engine (after a first call has compiled):
a small forward call, a Bessel gradient, and rvm.vmap of the Bessel gradient per point.

    python tools/bench_calls.py
"""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tools" / "bench")]

from besselj import besselj
from worker import per_call  # the benchmarks' timing: best of 5 sized batches

import rvm

if __name__ == "__main__":
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
    print(f"| rvm.grad of J_2 at one point | "
          f"{per_call(lambda: grad(0.0, 2, 1.0)) * 1e6:.2f} |")
    print(f"| rvm.vmap of that gradient, per point (10^5 points) | {t / len(zs) * 1e6:.2f} |")
