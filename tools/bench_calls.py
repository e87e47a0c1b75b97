"""Per-call costs from Python on the native engine (after a first call has compiled):
a small forward call, a Bessel gradient, and rvm.vmap of the Bessel gradient per point.

    python tools/bench_calls.py
"""

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from besselj import besselj

import rvm


def per_call(f, n: int) -> float:
    f()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t) / n)
    return best


if __name__ == "__main__":
    poly = rvm.load(ROOT / "asm" / "poly.rasm", engine="native")
    grad = rvm.grad(besselj, loss="out", engine="native")
    zs = np.linspace(0.5, 3.0, 100_000)
    batch = rvm.vmap(grad, in_axes=(None, None, 0))
    batch(0.0, 2, zs[:10])
    t = min(per_call(lambda: batch(0.0, 2, zs), 1) for _ in range(3))
    print("| call (native engine, compiled) | us |")
    print("|---|---|")
    print(f"| prog.call of asm/poly.rasm (3 scalars) | "
          f"{per_call(lambda: poly.call('f', 0.0, 1.0, 3.0), 20000) * 1e6:.2f} |")
    print(f"| rvm.grad of J_2 at one point | "
          f"{per_call(lambda: grad(0.0, 2, 1.0), 20000) * 1e6:.2f} |")
    print(f"| rvm.vmap of that gradient, per point (10^5 points) | {t / len(zs) * 1e6:.2f} |")
