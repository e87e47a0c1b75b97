"""Native loops against the same loops hand-written in numba: the fair reference for the
native engine's code.

    python tools/bench_loops.py [--n 1000000]

Three loops, each forwards through `prog.call` / a frontend function on the native engine
(after a first, compiling call) and as a plain numba function: the pendulum leapfrog
(scalar floats), Fibonacci (int64, wrapping), and the dot product of two float arrays
(every element an exchange with the machine's heap; the rvm time includes copying the
arrays onto the heap and back, which the call needs). Best of 5, nanoseconds per loop
iteration, and the ratio rvm / numba.
"""

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

import numba
from programs import leapfrog
from worker import best_of

import rvm
from rvm import Array


@rvm.reversible
def dot(out: float, a: Array[float], b: Array[float]):
    for i in range(len(a)):
        out += a[i] * b[i]


@numba.njit
def leapfrog_numba(q, p, n, dt):
    for _ in range(n):
        p -= dt * np.sin(q)
        q += dt * p
    return q, p


@numba.njit
def fib_numba(n, a, b):
    b += 1
    for _ in range(n):
        a += b
        a, b = b, a
    return a, b


@numba.njit
def dot_numba(a, b):
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000, help="loop trip count")
    n = ap.parse_args().n
    fib = rvm.load(ROOT / "asm" / "fib.rasm")
    a, b = np.random.default_rng(0).random(n), np.random.default_rng(1).random(n)
    steps = 10 ** 15
    cases = [
        ("leapfrog (floats)",
         lambda: leapfrog(1.0, 0.0, n, 0.001, engine="native", max_steps=steps),
         lambda: leapfrog_numba(1.0, 0.0, n, 0.001)),
        ("fib (int64)",
         lambda: fib.call("fib", n, 0, 0, engine="native", max_steps=steps),
         lambda: fib_numba(n, 0, 0)),
        ("dot of two arrays",
         lambda: dot(0.0, a, b, engine="native", max_steps=steps),
         lambda: dot_numba(a, b)),
    ]
    # the same results, or the comparison means nothing
    assert np.allclose(cases[0][1]()[:2], cases[0][2](), rtol=1e-12)
    assert tuple(cases[1][1]()[1:]) == tuple(int(v) for v in cases[1][2]())
    assert np.isclose(cases[2][1]()[0], cases[2][2](), rtol=1e-12)
    print("| loop | rvm native ns/iteration | numba ns/iteration | rvm / numba |")
    print("|---|---|---|---|")
    for label, ours, theirs in cases:
        r, h = (best_of(f, 5, warm=True) / n * 1e9 for f in (ours, theirs))
        print(f"| {label} | {r:.2f} | {h:.2f} | {r / h:.1f} |")


if __name__ == "__main__":
    main()
