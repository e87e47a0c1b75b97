"""What the run-time checks cost: the leapfrog benchmark program with and without them.

    python tools/bench_checks.py [STEPS]
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
from programs import leapfrog

from rvm.engines import native


def best(f, repeat: int = 5) -> float:
    f()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    engines = ["python"] + (["native"] if native.available else [])
    print(f"leapfrog, {n} steps, best of 5")
    print("| engine | checks (ms) | --no-checks (ms) | ratio |")
    print("|---|---|---|---|")
    for engine in engines:
        on, off = (best(lambda c=c, e=engine: leapfrog(1.0, 0.0, n, 0.01, engine=e, checks=c))
                   for c in (True, False))
        print(f"| {engine} | {on * 1e3:.1f} | {off * 1e3:.1f} | {on / off:.2f} |")
