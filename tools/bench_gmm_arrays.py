"""The ADBench GMM with array statements (examples/gmm_arrays.py) beside examples/gmm.py
and JAX's jit of the same algorithm and of its other formulations (tools/bench/peers.py):
the first gradient (compiling included, an empty native-code cache), then the objective
and the gradient per call, one core, every gradient checked against the array version's.

    RVM_CACHE_DIR=$(mktemp -d) taskset -c 1 python tools/bench_gmm_arrays.py [FILE]
        [--no-jax] [--no-gmm]
"""
import os
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [f"{HERE}/examples", f"{HERE}/tools", f"{HERE}/tools/bench", HERE]
assert os.environ.get("RVM_CACHE_DIR"), "set a private RVM_CACHE_DIR"

import gmm
import gmm_arrays
import numpy as np

import rvm
from rvm.engines import native

native.THREAD_ROWS = 10 ** 12       # one thread (as tools/bench/peers.py's one-core runs)
path = next((a for a in sys.argv[1:] if not a.startswith("--")),
            os.path.join(os.path.dirname(HERE), "shared", "data", "adbench", "gmm", "1k",
                         "gmm_d10_K25.txt"))
data = gmm.load(path)
args = gmm.arguments(data)


def per_call(run, least=0.5, rounds=5):
    """The best of `rounds` rounds' mean time per call, each round >= `least` s."""
    run()
    t = time.perf_counter()
    run()
    once = max(time.perf_counter() - t, 1e-6)
    n = max(1, int(least / once))
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            run()
        best = min(best, (time.perf_counter() - t) / n)
    return best


def first(run):
    t = time.perf_counter()
    out = run()
    return time.perf_counter() - t, out


rows = []
vg = rvm.value_and_grad(gmm_arrays.gmm_objective, loss="out", argnums=(1, 2, 3),
                        engine="native", max_steps=gmm.STEPS)
t_first, (v_a, g_a) = first(lambda: vg(*args))
g_a = np.concatenate([g.ravel() for g in g_a])
t_obj_first, _ = first(lambda: gmm_arrays.gmm_objective(*args, engine="native",
                                                        max_steps=gmm.STEPS))
rows.append(("rvm gmm_arrays (native)", t_first, t_obj_first,
             per_call(lambda: gmm_arrays.gmm_objective(*args, engine="native",
                                                       max_steps=gmm.STEPS)),
             per_call(lambda: vg(*args))))
print(rows[-1], flush=True)
if "--no-gmm" not in sys.argv:
    t_first, (v_g, g_g) = first(lambda: gmm.gradient(data, engine="native", threads=1))
    t_obj_first, _ = first(lambda: gmm.objective(data, engine="native", threads=1))
    rows.append(("rvm gmm.py (native)", t_first, t_obj_first,
                 per_call(lambda: gmm.objective(data, engine="native", threads=1)),
                 per_call(lambda: gmm.gradient(data, engine="native", threads=1))))
    print(rows[-1], "max |g - g_arrays|", np.abs(g_g - g_a).max(), flush=True)
if "--no-jax" not in sys.argv:
    import jax
    import peers
    peers._jax()
    o = peers._Ops("jax")
    for form in ("expanded", "gemm", "direct"):
        t_first, (run, flat) = first(lambda form=form: peers.gmm_jax(data, form))
        consts = peers._gmm_consts(o, data, jax.device_put)
        x = jax.device_put(data["x"])
        f = jax.jit(lambda a, mu, icf, form=form, consts=consts, x=x:
                    peers.gmm_objective(o, form, consts, a, mu, icf, x))
        jargs = [jax.device_put(data[k]) for k in ("alphas", "means", "icf")]
        t_obj_first, _ = first(lambda f=f, a=jargs: jax.block_until_ready(f(*a)))
        rows.append((f"JAX jit {form}", t_first, t_obj_first,
                     per_call(lambda f=f, a=jargs: jax.block_until_ready(f(*a))), per_call(run)))
        print(rows[-1], "max |g - g_arrays|", np.abs(flat[1:] - g_a).max(), flush=True)

print(f"\n{os.path.basename(path)}, one core\n")
print("| | first gradient call (compile incl.) | first objective call | objective / call "
      "| gradient / call | gradient / objective |")
print("|---|---|---|---|---|---|")
for name, tf, tof, to, tg in rows:
    print(f"| {name} | {tf:.2f} s | {tof:.2f} s | {to * 1e6:.0f} us | {tg * 1e6:.0f} us "
          f"| {tg / to:.2f} |")
