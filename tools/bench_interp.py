"""Engine speed: instructions per second, forwards and backwards.

    python tools/bench_interp.py [--n 200000]

Runs loop-heavy programs (integer Fibonacci from asm/fib.rasm, and a float pendulum
leapfrog loop) to the end forwards, then backwards from the results, and prints the
instruction rates of the stepping interpreter, then the same rates for the compiled
engines (instructions counted by the interpreter, divided by the compiled run's time) and
their speed-up, beside the same loops written by hand in plain Python (the fair reference
for the python engine); then the time of one leapfrog gradient (forwards, then backwards
with adjoints) on each engine and by hand. Each figure is the best of 3 runs.
"""

import argparse
import math
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tools" / "bench")]

from worker import best_of

import rvm

LEAPFROG = """
.func leapfrog(f0, f1, r0)     ; q, p, steps: p -= dt sin q; q += dt p
        ADD     f2, 0.001       ; dt (a local, uncomputed at the end)
top:    CF.NE   r1, 0, back
        ADD.sin f3, f0          ; t = sin q
        SUB.mul f1, f2, f3      ; p -= dt * t
        SUB.sin f3, f0          ; t = 0
        ADD.mul f0, f2, f1      ; q += dt * p
        INC     r1
exit:   BR.EQ   r1, r0, done
back:   JMP     top
done:   CF      exit
        SUB     r1, r0
        SUB     f2, 0.001
.end
"""


# The same loops written by hand in plain Python, as the fair reference for the python
# engine: fib wraps to int64 as the machine does (the values overflow), leapfrog keeps
# its temporary as the program does (t = sin q, then uncomputed).
def fib_by_hand(n, a, b):
    b += 1
    for _ in range(n):
        a = ((a + b + 2 ** 63) & (2 ** 64 - 1)) - 2 ** 63
        a, b = b, a
    return n, a, b


def leapfrog_by_hand(q, p, n):
    dt, t, sin = 0.001, 0.0, math.sin
    for _ in range(n):
        t += sin(q)
        p -= dt * t
        t -= sin(q)
        q += dt * p
    return q, p, n


def leapfrog_gradient_by_hand(q, p, n):
    """d q_n / d (q, p): the loop forwards, then backwards with the adjoints."""
    dt, t, sin, cos = 0.001, 0.0, math.sin, math.cos
    for _ in range(n):
        t += sin(q)
        p -= dt * t
        t -= sin(q)
        q += dt * p
    gq, gp, gt = 1.0, 0.0, 0.0
    for _ in range(n):
        q -= dt * p
        gp += gq * dt
        t += sin(q)
        gq -= gt * cos(q)
        p += dt * t
        gt -= gp * dt
        t -= sin(q)
        gq += gt * cos(q)
    return gq, gp, None


HAND = {"fib": fib_by_hand, "leapfrog": leapfrog_by_hand}


def rate(machine, name, args, direction):
    best = 0.0
    for _ in range(3):
        machine.enter(name, *args, backward=direction < 0)
        t = time.perf_counter()
        steps = machine.run(1)
        best = max(best, steps / (time.perf_counter() - t))
    return steps, best


def pytest_approx(values):
    """Equal up to float rounding (the hand-written loop may round differently)."""
    class Approx(tuple):
        def __eq__(self, other):
            return all(x is y if x is None else math.isclose(x, y, rel_tol=1e-9)
                       for x, y in zip(self, other))
    return Approx(values)


def seconds(f, repeat=3):
    return best_of(f, repeat, warm=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000, help="loop trip count")
    n = ap.parse_args().n
    cases = [("fib (int)", rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (n, 0, 0)),
             ("leapfrog (float)", rvm.assemble(LEAPFROG), "leapfrog", (1.0, 0.0, n))]
    print(f"{'program':<18} {'engine':<8} {'steps':>9} {'forward instr/s':>16} "
          f"{'backward instr/s':>17} {'speed-up':>9}")
    from rvm.engines import native
    for label, program, name, args in cases:
        m = rvm.Machine(program, engine="interp")
        steps, fwd = rate(m, name, args, 1)
        results = m.finish() if not m.at_end else m.results()
        _, bwd = rate(m, name, results, -1)
        print(f"{label:<18} {'interp':<8} {steps:>9} {fwd:>16,.0f} {bwd:>17,.0f} {1:>8.1f}x")
        hand = seconds(lambda f=HAND[name], a=args: f(*a))
        assert program.call(name, *args, engine="python") == \
            pytest_approx(HAND[name](*args)), "the hand-written loop computes something else"
        print(f"{'':<18} {'by hand':<8} {steps:>9} {steps / hand:>16,.0f} {'':>17} "
              f"{steps / hand / fwd:>8.1f}x")
        for engine in ["python"] + (["native"] if native.available else []):
            f = seconds(lambda e=engine, p=program, n=name, a=args: p.call(n, *a, engine=e))
            b = seconds(lambda e=engine, p=program, n=name, r=results:
                        p.uncall(n, *r, engine=e))
            print(f"{'':<18} {engine:<8} {steps:>9} {steps / f:>16,.0f} {steps / b:>17,.0f} "
                  f"{steps / f / fwd:>8.1f}x")
    # the gradient: a forward pass, then the backward pass with adjoints (time per call)
    program = cases[1][1]
    args = (1.0, 0.0, n // 4)
    print(f"\n{'leapfrog gradient':<18} {'engine':<8} {'passes':>9} {'ms per call':>16} "
          f"{'':>17} {'speed-up':>9}")
    times = {}
    for engine in ["interp", "by hand", "python"] + (["native"] if native.available else []):
        if engine == "by hand":
            f = lambda: leapfrog_gradient_by_hand(*args)
        else:
            g = rvm.grad(program["leapfrog"], loss="f0", engine=engine)
            f = lambda g=g: g(*args)
        assert f() == pytest_approx(leapfrog_gradient_by_hand(*args)), engine
        times[engine] = seconds(f)
        print(f"{'':<18} {engine:<8} {n // 4:>9} {1e3 * times[engine]:>16.3f} {'':>17} "
              f"{times['interp'] / times[engine]:>8.1f}x")


if __name__ == "__main__":
    main()
