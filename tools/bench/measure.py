"""One process of tools/bench/run.py: run one comparison (every peer in this process,
alternating over the rounds) and print its tables as one JSON line.

    python tools/bench/measure.py CASE --size quick|full --cores 1|0 [--rounds R]
    python tools/bench/measure.py --memory PEER N       # peak memory of one leapfrog call

--cores 1 pins the process to one core and every tool to one thread before any of them
is imported; --cores 0 leaves every tool as it runs by default.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def calibrate(run, budget: float) -> int:
    """Calls per timed batch: enough that a batch takes about `budget` seconds."""
    run()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            run()
        t = time.perf_counter() - t
        if t >= budget or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * budget / max(t, 1e-9) * 1.1))


def compare(result, ref, tol, parts=()) -> tuple[bool, float]:
    """Does result agree with rvm's (ref): in each part (ref split at `parts`), the
    largest difference at most atol + rtol times the part's largest magnitude (a sum's
    rounding scales with its terms, not with the result: an entry near 0 of a gradient
    summed over 10^4 points may differ from another summation order by more than rtol of
    itself)."""
    import numpy as np
    a, b = np.asarray(result, dtype=float).ravel(), np.asarray(ref, dtype=float).ravel()
    if a.shape != b.shape:
        return False, float("inf")
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    ok = all(np.all(np.isfinite(x)) and
             (not x.size or np.max(np.abs(x - y)) <= tol[1] + tol[0] * np.max(np.abs(y)))
             for x, y in zip(np.split(a, list(parts)), np.split(b, list(parts))))
    return bool(ok), err


def run_case(case: str, size: str, cores: int, rounds: int, budget: float) -> list:
    import peers as P
    tables = []
    for title, peers in P.CASES[case](size, cores):
        ref = peers[0]
        live = [p for p in peers if not p.skip]
        counts = {p.name: calibrate(p.run, budget) for p in live}
        times = {p.name: [] for p in live}
        for r in range(rounds):                  # alternate: every peer once per round,
            order = live if r % 2 == 0 else live[::-1]     # the order reversed each round
            for p in order:
                n = counts[p.name]
                t = time.perf_counter()
                for _ in range(n):
                    p.run()
                times[p.name].append((time.perf_counter() - t) / n)
        rows = []
        for p in peers:
            row = {"peer": p.name, "mode": p.mode, **p.extra}
            if p.skip:
                row["skip"] = p.skip
            else:
                ok, err = compare(p.result, ref.result, p.tol, ref.parts)
                ts = times[p.name]
                row.update(agrees=ok, max_abs_diff=err, min_s=min(ts),
                           median_s=statistics.median(ts), rounds=len(ts),
                           calls_per_round=counts[p.name])
            rows.append(row)
        tables.append({"case": case, "title": title, "cores": cores,
                       "cores_available": len(os.sched_getaffinity(0)), "rows": rows})
    return tables


def memory(peer: str, n: int) -> float:
    """MB by which one leapfrog gradient at N raises this process's peak resident set,
    after a warm-up at N = 1000 (imports, compiled code; JAX compiles again for each N,
    which the figure includes: a few MB)."""
    import peers as P
    _, make = P.leapfrog_peers(1000, 1, peer)[peer]
    make()
    _, make = P.leapfrog_peers(n, 1, peer)[peer]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    make()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024


# numba's prange peers run on the "workqueue" threading layer unless NUMBA_THREADING_LAYER
# says otherwise: numba picks "omp" when it can, and on a shared 2-core machine omp's
# threads spin and wait (measured: Bessel over 10^5 points 5.8-8 ms with omp, 1.1-2.8 ms
# with workqueue; the quick GMM 1.4-27 ms against 250 us; BA ba1 28 against 22 ms).
THREADING_LAYER = "workqueue"


def pin(cores: int) -> None:
    """Pin this process to one core and tell every tool to use one thread (before any of
    them is imported); for the default run, choose numba's threading layer."""
    if cores != 1:
        os.environ.setdefault("NUMBA_THREADING_LAYER", THREADING_LAYER)
        return
    cpu = max(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = "1"
    # XLA: Eigen's operations on one thread. No XLA flag limits XLA's own thread pools
    # (an unknown --xla flag aborts; a bare token is ignored), but the process is pinned
    # to one core above: whatever threads XLA starts share that core.
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_cpu_multi_thread_eigen=false").strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("case", nargs="?", help="a comparison, or several separated by commas")
    ap.add_argument("--size", default="quick", choices=["quick", "full"])
    ap.add_argument("--cores", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", type=float, default=0.2, help="seconds per timed batch")
    ap.add_argument("--memory", nargs=2, metavar=("PEER", "N"))
    args = ap.parse_args()
    pin(1 if args.memory else args.cores)
    if args.memory:
        print(json.dumps({"peer": args.memory[0], "n": int(args.memory[1]),
                          "peak_mb": memory(args.memory[0], int(args.memory[1]))}))
        return
    try:
        out = [t for case in args.case.split(",")
               for t in run_case(case, args.size, args.cores, args.rounds, args.budget)]
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
