"""A loop-heavy Janus program on rvm's engines: the classic permutation-to-code
(examples/janus/perm_to_code.ja, n(n-1)/2 inner iterations), forwards and uncalled,
beside the same loop hand-written in Python and compiled by numba (the fair reference).
No Janus interpreter is installable here (jana needs a Haskell toolchain; PyJanus is not
packaged), so the interpreter row stands in for an interpreting Janus implementation.

    python tools/bench_janus.py [--n 10000] [--small 300]
"""

import argparse
import time
from pathlib import Path

import numpy as np

import rvm

ROOT = Path(__file__).resolve().parent.parent


def perm_to_code_py(x):
    """The same algorithm as the .ja file, in plain Python (not reversible)."""
    for k in range(len(x) - 1, -1, -1):
        for j in range(k):
            if x[j] > x[k]:
                x[j] -= 1
    return x


def timed(fn, arg, repeat=3):
    best = float("inf")
    for _ in range(repeat):
        x = arg.copy()                 # the hand-written versions work in place
        t = time.perf_counter()
        out = fn(x)
        best = min(best, time.perf_counter() - t)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000, help="size for the compiled rows")
    ap.add_argument("--small", type=int, default=300, help="size for the interpreter rows")
    args = ap.parse_args()
    prog = rvm.load(ROOT / "examples" / "janus" / "perm_to_code.ja")
    rng = np.random.default_rng(0)
    rows = []

    def row(what, n, fn, perm):
        seconds, out = timed(fn, perm, repeat=1 if n > 1000 else 3)
        inner = n * (n - 1) / 2
        rows.append((what, n, seconds, seconds / inner * 1e9))
        return out

    import numba
    ref = numba.njit(cache=False)(perm_to_code_py)
    for n in (args.small, args.n):
        perm = rng.permutation(n).astype(np.int64)
        ref(perm.copy())                              # compile
        code = row("numba, hand-written (not reversible)", n, ref, perm)
        for engine in ("native", "python", "interp"):
            if engine != "native" and n > args.small:
                continue
            prog.call("perm_to_code", perm[:3].copy(), engine=engine)    # compile
            got = row(f"rvm {engine}, forwards", n, lambda p, e=engine: prog.call(
                "perm_to_code", p, engine=e, max_steps=10**13)[0], perm)
            assert np.array_equal(got, code)
            back = row(f"rvm {engine}, uncall", n, lambda c, e=engine: prog.uncall(
                "perm_to_code", c, engine=e, max_steps=10**13)[0], code)
            assert np.array_equal(back, perm)
        if n <= args.small:
            row("plain Python, hand-written", n, perm_to_code_py, perm)
    m = rvm.Machine(prog, engine="interp")
    m.enter("perm_to_code", rng.permutation(args.small).astype(np.int64))
    m.run()
    print(f"{m.steps / (args.small * (args.small - 1) / 2):.1f} machine instructions per "
          "inner iteration (counted by the interpreter)\n")
    ref_ns = {n: ns for what, n, _, ns in rows if what.startswith("numba")}
    print("| run | n | seconds | ns per inner iteration | x hand-written numba |")
    print("|---|---|---|---|---|")
    for what, n, seconds, ns in rows:
        print(f"| {what} | {n} | {seconds:.4f} | {ns:.2f} | {ns / ref_ns[n]:.1f} |")


if __name__ == "__main__":
    main()
