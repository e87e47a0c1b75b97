"""A Kepler orbit with the standard library's leapfrog integrator: the force is a
reversible function passed to `leapfrog`; the orbit runs backwards with `~leapfrog` and is
differentiated with respect to the initial velocity and the gravitational parameter.

    python examples/lib_leapfrog.py
"""

import numpy as np

import rvm
from rvm import Array
from rvm.lib import leapfrog


@rvm.reversible
def gravity(a: Array[float], x: Array[float], gm: float):
    """a += -gm x / |x|^3 (a planet around a fixed sun, in the plane)."""
    a[0] -= gm * x[0] / (x[0] * x[0] + x[1] * x[1]) ** 1.5
    a[1] -= gm * x[1] / (x[0] * x[0] + x[1] * x[1]) ** 1.5


def energy(x, v, gm):
    return 0.5 * v @ v - gm / np.linalg.norm(x)


def main():
    x0, v0, gm = np.array([1.0, 0.0]), np.array([0.0, 1.2]), 1.0
    dt, n = 0.01, 1000
    (_, x, v, *_), g = rvm.value_and_grad(leapfrog, loss=(1, 0))(gravity, x0, v0, gm, dt, n)
    print(f"after t = {dt * n}: x = {x}, energy {energy(x, v, gm):.6f} "
          f"(start {energy(x0, v0, gm):.6f})")
    back = (~leapfrog)(gravity, x, v, gm, dt, n)
    print(f"integrated back: x = {back[1]}, v = {back[2]}")
    print(f"d x[0] / d v0 = {g[2]}, d x[0] / d gm = {g[3]:.6f}")


if __name__ == "__main__":
    main()
