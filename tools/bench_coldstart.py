"""Cold start: what a user meets first on the native engine, each in a fresh process,
with an empty native-code cache and then with the cache warm, beside a peer in the same
run:

- the first native gradient of the Bessel function (J_2 at one point), beside JAX's
  first jit(grad) of the series at one point (JAX compiles in every process);
- the first rvm.vmap of it over 10^5 points, beside JAX's first jit(vmap(grad));
- the GMM example's first gradient (1k points, D = 10, K = 25), beside JAX's first
  jit(value_and_grad) of the same algorithm (rvm's expanded quadratic form);
- the first gradient of the Petersen graph-embedding loss (k = 5);
- chains of 100 and 1,000 small functions (g0 calls g1 ... calls g(n-1)): the first
  native call, with the process's peak memory, beside the interpreter running it;
- compile time against program size: one chain of functions of 1,000 straight-line
  instructions each, 10^3 to 10^6 instructions in all (--sizes), the first native call.

Python's compiled bytecode is kept, as on a user's machine, even where
PYTHONDONTWRITEBYTECODE is set. Times include starting Python and importing rvm (about
0.3 s), as a user's first call does.

    python tools/bench_coldstart.py [--sizes 1000 10000 100000 1000000] [--skip-jax]
"""

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PATHS = f"{ROOT / 'examples'}{os.pathsep}{ROOT / 'tools' / 'bench'}"
GMM_FILE = ROOT.parent / "shared" / "data" / "adbench" / "gmm" / "1k" / "gmm_d10_K25.txt"

TIMED = """
import resource, sys, time
t0 = time.perf_counter()
{body}
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""
BESSEL = """
import rvm
from besselj import besselj
rvm.grad(besselj, loss="out", engine="native")(0.0, 2, 1.0)
"""
BESSEL_JAX = """
import jax
from worker import bessel_jax
jax.jit(jax.grad(bessel_jax()))(1.0).block_until_ready()
"""
BATCH = """
import numpy as np
import rvm
from besselj import besselj
g = rvm.grad(besselj, loss="out", engine="native")
rvm.vmap(g, in_axes=(None, None, 0))(0.0, 2, np.linspace(0.5, 3.0, 100_000))
"""
BATCH_JAX = """
import jax
import numpy as np
from worker import bessel_jax
jax.jit(jax.vmap(jax.grad(bessel_jax())))(np.linspace(0.5, 3.0, 100_000)).block_until_ready()
"""
GMM = """
import gmm
gmm.gradient(gmm.load({path!r}), engine="native", threads=1)
"""
GMM_JAX = """
import gmm
from peers import gmm_jax
gmm_jax(gmm.load({path!r}), "expanded")
"""
EMBEDDING = """
import numpy as np
import rvm
from graph_embedding import embedding_loss, petersen
l1, l2 = petersen()
g = rvm.grad(embedding_loss, loss="out", engine="native")
g(0.0, np.random.default_rng(0).normal(size=(10, 5)), l1, l2)
"""
CHAIN = """
import rvm
lines = []
for k in range({n}):
    lines.append(f".func g{{k}}(f0, f1)")
    lines += ["        ADD.mul f1, f0, f0", "        ADD.sin f1, f0",
              "        SUB.mul f1, f0, f0"] * ({body} // 3)
    if k + 1 < {n}:
        lines.append(f"        CALL g{{k + 1}}, f0, f1")
    lines.append(".end")
p = rvm.assemble("\\n".join(lines) + "\\n")
p.call("g0", 0.5, 0.0, engine={engine!r}, max_steps=10 ** 12)
"""


def first_call(cache: str, body: str) -> tuple[float, float, float]:
    """(seconds, peak memory in MB, the whole process's seconds) of a fresh process
    running body: the body's time, from the process's start (imports included) to its
    end; the whole process's includes its end, where it waits for the optimised code of
    a large program the first calls ran unoptimised (rvm.engines.llvm: Tier)."""
    env = dict(os.environ, RVM_CACHE_DIR=cache, PYTHONPATH=PATHS)
    # as on a user's machine, Python keeps the compiled bytecode (.pyc) of rvm's modules:
    # an environment with PYTHONDONTWRITEBYTECODE set would compile their source again in
    # every process (about 0.1 s more per start)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", TIMED.format(body=body)], env=env,
                       capture_output=True, text=True, check=True)
    whole = time.perf_counter() - t
    seconds, mb = r.stdout.split()[-2:]
    return float(seconds), float(mb), whole


def cold_and_warm(body: str) -> tuple[float, float, float, float]:
    """(empty cache s, warm cache s (best of 3), peak MB of the cold run, the cold
    process's whole time)."""
    with tempfile.TemporaryDirectory() as cache:
        cold, mb, whole = first_call(cache, body)
        warm = min(first_call(cache, body)[0] for _ in range(3))
    return cold, warm, mb, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1000, 10_000, 100_000],
                    help="instructions in all, for the compile-time table (1000 each "
                    "function); 1000000 takes minutes")
    ap.add_argument("--skip-jax", action="store_true")
    args = ap.parse_args()
    jax = not args.skip_jax
    if jax:
        try:
            import jax as _  # noqa: F401
        except ImportError:
            jax = False
    rows = [("Bessel J_2(1.0), gradient", BESSEL, BESSEL_JAX, "jit(grad)"),
            ("rvm.vmap of it over 10^5 points", BATCH, BATCH_JAX, "jit(vmap(grad))"),
            ("GMM example, gradient (1k points, D = 10, K = 25)",
             GMM.format(path=str(GMM_FILE)), GMM_JAX.format(path=str(GMM_FILE)),
             "jit(value_and_grad), the same algorithm"),
            ("graph-embedding loss (k = 5), gradient", EMBEDDING, None, None)]
    print("| first native call, fresh process | empty cache, s | warm cache, s | peak MB | "
          "whole process, s | peer | peer, s | rvm / peer |")
    print("|---|---|---|---|---|---|---|---|")
    for what, body, peer, name in rows:
        if what.startswith("GMM") and not GMM_FILE.exists():
            continue
        cold, warm, mb, whole = cold_and_warm(body)
        line = f"| {what} | {cold:.2f} | {warm:.2f} | {mb:.0f} | {whole:.2f} |"
        if peer is not None and jax:
            with tempfile.TemporaryDirectory() as cache:
                p = min(first_call(cache, peer)[0] for _ in range(2))
            line += f" JAX {name} | {p:.2f} | {cold / p:.2f} |"
        else:
            line += " | | |"
        print(line, flush=True)
    for n in (100, 1000):
        cold, warm, mb, whole = cold_and_warm(CHAIN.format(n=n, body=3, engine="native"))
        with tempfile.TemporaryDirectory() as cache:
            p = first_call(cache, CHAIN.format(n=n, body=3, engine="interp"))[0]
        print(f"| a chain of {n:,} small functions, a call | {cold:.2f} | {warm:.2f} | "
              f"{mb:.0f} | {whole:.2f} | the interpreter | {p:.2f} | {cold / p:.2f} |",
              flush=True)
    print()
    print("| instructions | functions | empty cache, s | per 1,000 instructions, ms | "
          "peak MB | whole process, s |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        n = max(1, size // 1000)
        with tempfile.TemporaryDirectory() as cache:
            cold, mb, whole = first_call(cache, CHAIN.format(n=n, body=min(size, 1000),
                                                             engine="native"))
        print(f"| {size:,} | {n:,} | {cold:.2f} | {1e6 * cold / size:.0f} | {mb:.0f} | "
              f"{whole:.2f} |", flush=True)


if __name__ == "__main__":
    main()
