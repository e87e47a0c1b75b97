"""Gradient time / forward time on the interpreter.

    python tools/bench_grad.py [--engine interp|python|native]

For each program: the forward call (`prog.call`) and the gradient call (`rvm.grad(...)`,
which runs forwards, then backwards in gradient mode) are timed end to end from Python,
best of 5 batches; and the machine passes alone (forward run vs backward adjoint run on a
reused machine), which leaves out per-call setup.
"""

import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import rvm


def best(fn, repeat=5, number=20):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t) / number)
    return min(times)


def passes(program, name, args, loss_slot, engine):
    m = rvm.Machine(program, engine=engine)

    def forward():
        m.set_grad(False)
        m.enter(name, *args)
        m.run(1)

    def backward():
        m.set_grad(True)
        m.clear_shadows()
        m.stack[0].G[loss_slot] = 1.0
        m.run(-1)

    fwd, bwd = best(forward), float("inf")
    for _ in range(20):
        forward()
        t = time.perf_counter()
        backward()
        bwd = min(bwd, time.perf_counter() - t)
    return fwd, bwd


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="interp", choices=["interp", "python", "native"])
    engine = ap.parse_args().engine
    print(f"engine: {engine}")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=1000), rng.normal(size=1000)
    cases = [
        ("bessel J2(1.0)", rvm.load(ROOT / "asm/besselj.rasm"), "besselj", (0.0, 2, 1.0), 0),
        ("iexp(1.6)", rvm.load(ROOT / "asm/iexp.rasm"), "iexp", (0.0, 1.6), 0),
        ("dot, n = 1000", rvm.load(ROOT / "asm/arrays.rasm"), "dot", (x, y, 0.0), 2),
    ]
    print(f"{'program':<16} {'forward':>10} {'gradient':>10} {'ratio':>6}   "
          f"{'fwd pass':>10} {'adj pass':>10} {'ratio':>6}")
    for label, program, name, args, loss in cases:
        g = rvm.grad(program[name], loss=loss, engine=engine)
        tf = best(lambda p=program, n=name, a=args: p.call(n, *a, engine=engine))
        tg = best(lambda g=g, a=args: g(*a))
        fn = program.functions[name]
        slot = fn.slot(fn.params[loss if name != "dot" else 4])
        pf, pb = passes(program, name, args, slot, engine)
        print(f"{label:<16} {tf * 1e6:>8.1f}us {tg * 1e6:>8.1f}us {tg / tf:>6.2f}   "
              f"{pf * 1e6:>8.1f}us {pb * 1e6:>8.1f}us {pb / pf:>6.2f}")


if __name__ == "__main__":
    main()
