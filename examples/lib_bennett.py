"""Bennett's time-space trade-off from the standard library: `bennett(step, out, x, k, n)`
runs k^n steps of a reversible step function with at most n(k - 1) + 2 states live, and
(2k - 1)^n step runs (forwards or backwards), measured here by `pebble_counts`.

    python examples/lib_bennett.py
"""

import numpy as np

import rvm
from rvm import Array
from rvm.lib import bennett, pebble_counts


@rvm.reversible
def rotate(y: Array[float], s: Array[float]):
    """One step: y += s turned by 0.1 rad and shrunk by 0.99 (y is zero on entry)."""
    y[0] += 0.99 * (cos(0.1) * s[0] - sin(0.1) * s[1])
    y[1] += 0.99 * (sin(0.1) * s[0] + cos(0.1) * s[1])


def main():
    x = np.array([1.0, 0.0])
    out = bennett(rotate, np.zeros(2), x, 3, 3)[1]
    angle = 0.1 * 27
    print(f"27 steps: {out}, closed form {0.99 ** 27 * np.array([np.cos(angle), np.sin(angle)])}")
    print(" k  n   steps  (2k-1)^n   peak  n(k-1)+2")
    for k, n in [(2, 3), (3, 3), (4, 2), (27, 1)]:
        steps, peak = pebble_counts(rotate, np.zeros(2), x, k, n)
        print(f"{k:2d} {n:2d} {steps:7d} {(2 * k - 1) ** n:9d} {peak:6d} {n * (k - 1) + 2:9d}")
    g = rvm.grad(bennett, loss=(1, 0))(rotate, np.zeros(2), x, 3, 3)[2]
    print(f"d out[0] / d x = {g}")


if __name__ == "__main__":
    main()
