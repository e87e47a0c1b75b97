"""A leapfrog (velocity Verlet) integrator that takes the force as a function.

`leapfrog(force, x, v, p, dt, nsteps)` advances positions x and velocities v by nsteps
steps of dt in place. `force(a, x, p)` adds the acceleration at positions x to a zero
array a; p is passed through unchanged (masses, spring constants: a float or an array),
so the orbit can be differentiated with respect to it. Each kick computes the
acceleration into an ancilla, adds it to v and uncomputes it, so nothing is stored per
step: memory is constant in nsteps, and `~leapfrog` integrates backwards in time.
"""

from __future__ import annotations

from ..lang import Array, ancilla, reversible, zeros


@reversible
def kick(force, x: Array[float], v: Array[float], p, h: float):
    """v += h * a(x): the acceleration computed, added, uncomputed."""
    with ancilla(a=zeros(len(x))):
        force(a, x, p)
        for i in range(len(v)):
            v[i] += h * a[i]
        ~force(a, x, p)


@reversible
def drift(x: Array[float], v: Array[float], h: float):
    """x += h * v."""
    for i in range(len(x)):
        x[i] += h * v[i]


@reversible
def leapfrog(force, x: Array[float], v: Array[float], p, dt: float, nsteps: int):
    """nsteps velocity Verlet steps of dt: half kick, drift, half kick, with the
    half kicks of neighbouring steps merged (nsteps + 1 kicks, one acceleration each)."""
    assert len(v) == len(x)
    assert nsteps >= 0
    if nsteps > 0:
        kick(force, x, v, p, 0.5 * dt)
        for _step in range(nsteps - 1):
            drift(x, v, dt)
            kick(force, x, v, p, dt)
        drift(x, v, dt)
        kick(force, x, v, p, 0.5 * dt)
