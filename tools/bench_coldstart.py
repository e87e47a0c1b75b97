"""Cold start: the first native gradient of the Bessel function, the first rvm.vmap of it
over 10^5 points, and the first gradient of the Petersen graph-embedding loss (k = 5), in
a fresh process, with an empty native-code cache and then with the cache warm (each in
its own process), beside JAX's first jit(vmap(grad)) of the series (JAX compiles in every
process) and
the floor numba itself sets: the first call of a trivial cached numba function in a
fresh process (numba's import and its lazy start-up on first call). Python's compiled
bytecode is kept, as on a user's machine, even where PYTHONDONTWRITEBYTECODE is set.

    python tools/bench_coldstart.py
"""

import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = """
import time
t0 = time.perf_counter()
import rvm
from besselj import besselj
g = rvm.grad(besselj, loss="out", engine="native")
g(0.0, 2, 1.0)
print(time.perf_counter() - t0)
"""
BATCH = """
import time
t0 = time.perf_counter()
import numpy as np
import rvm
from besselj import besselj
g = rvm.grad(besselj, loss="out", engine="native")
rvm.vmap(g, in_axes=(None, None, 0))(0.0, 2, np.linspace(0.5, 3.0, 100_000))
print(time.perf_counter() - t0)
"""
JAX = """
import time
t0 = time.perf_counter()
import jax
import numpy as np
from worker import bessel_jax
jax.jit(jax.vmap(jax.grad(bessel_jax())))(np.linspace(0.5, 3.0, 100_000)).block_until_ready()
print(time.perf_counter() - t0)
"""
EMBEDDING = """
import time
t0 = time.perf_counter()
import numpy as np
import rvm
from graph_embedding import embedding_loss, petersen
l1, l2 = petersen()
g = rvm.grad(embedding_loss, loss="out", engine="native")
g(0.0, np.random.default_rng(0).normal(size=(10, 5)), l1, l2)
print(time.perf_counter() - t0)
"""
FLOOR = """
import time
t0 = time.perf_counter()
import numpy
import trivial
trivial.f(1.0)
print(time.perf_counter() - t0)
"""
TRIVIAL = """
import numba


@numba.njit(cache=True)
def f(x):
    return x + 1.0
"""


def first_call(cache: str, script: str = SCRIPT, path: str = str(ROOT / "examples")) -> float:
    env = dict(os.environ, RVM_CACHE_DIR=cache, PYTHONPATH=path)
    # as on a user's machine, Python keeps the compiled bytecode (.pyc) of rvm's modules
    # and of the cached native module: an environment with PYTHONDONTWRITEBYTECODE set
    # would compile their source again in every process (about 0.1 s more per start)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                       text=True, check=True)
    return float(r.stdout.split()[-1])


if __name__ == "__main__":
    rows = []
    for what, script in (("J_2(1.0)", SCRIPT),
                         ("rvm.vmap of it over 10^5 points (both compiles)", BATCH),
                         ("the graph-embedding loss, k = 5", EMBEDDING)):
        with tempfile.TemporaryDirectory() as cache:      # each row from an empty cache
            cold = first_call(cache, script)
            warm = min(first_call(cache, script) for _ in range(3))
        rows.append((what, cold, warm))
    with tempfile.TemporaryDirectory() as cache:
        try:
            import jax  # noqa: F401
            path = f"{ROOT / 'tools' / 'bench'}{os.pathsep}{ROOT / 'examples'}"
            times = [first_call(cache, JAX, path) for _ in range(3)]
            rows.append(("JAX: jit(vmap(grad)) of J_2 over 10^5 points (compiles each "
                         "time)", times[0], min(times)))
        except ImportError:
            pass
        pathlib.Path(cache, "trivial.py").write_text(TRIVIAL)
        first_call(cache, FLOOR, cache)             # compiles and caches it
        floor = min(first_call(cache, FLOOR, cache) for _ in range(3))
    print("| first native gradient, fresh process | empty cache (compiles), s | "
          "warm cache (best of 3), s |")
    print("|---|---|---|")
    for what, cold, warm in rows:
        print(f"| {what} | {cold:.2f} | {warm:.2f} |")
    print(f"| numba's floor: a trivial cached function | | {floor:.2f} |")
