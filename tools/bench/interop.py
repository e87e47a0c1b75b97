"""The cost of crossing into rvm from JAX and PyTorch: per call, rvm.to_jax under jax.jit
and rvm.to_torch in eager mode, against the rvm call each makes (the same program,
called directly); and batches under jax.vmap / torch.func.vmap against rvm.vmap.

    python tools/bench/interop.py [--quick] [--rounds R] [--budget S] [--limit US]

Each row alternates the bridge and the direct call over R rounds (the order reversed
each round), each round timing a batch of calls sized to take about S seconds; the time
per call is the minimum over the rounds and the overhead is the bridge's minimum less the
direct call's. Every bridge's result is checked against the direct call's. The function
is a small scalar one (out += 2x^2 + 3xy + 4y^2) on the default engine, warmed up first
so both sides run native code. A batch row also checks that the whole batch was one rvm
call. The last line of output is the rows as JSON (tools/bench/run.py reads it);
with --limit, the exit code is 1 when a per-call overhead exceeds it (microseconds).
"""

import argparse
import json
import sys
import time

import numpy as np

import rvm
from rvm.interop._common import Fn


@rvm.reversible
def quad(out: float, x: float, y: float):
    out += 2 * x * x + 3 * x * y + 4 * y * y


def calibrate(run, budget: float) -> int:
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            run()
        if time.perf_counter() - start > budget / 4 or n >= 1 << 20:
            return n
        n *= 4


def timed(run, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        run()
    return (time.perf_counter() - start) / n


def duel(bridge, direct, rounds: int, budget: float) -> tuple[float, float]:
    """(bridge, direct): the minimum seconds per call over alternating rounds."""
    for run in (bridge, direct):
        for _ in range(50):             # warm: native code, jit caches
            run()
    nb, nd = calibrate(bridge, budget), calibrate(direct, budget)
    tb, td = [], []
    for r in range(rounds):
        order = [(bridge, nb, tb), (direct, nd, td)]
        for run, n, out in (order if r % 2 == 0 else order[::-1]):
            out.append(timed(run, n))
    return min(tb), min(td)


class Count:
    """How many host calls (rvm calls) the bridges make."""

    def __init__(self):
        self.calls, self._host = 0, Fn.host

    def __enter__(self):
        count = self

        def host(fn, *args):
            count.calls += 1
            return count._host(fn, *args)
        Fn.host = host
        self._scalars = Fn.scalars

        def scalars(fn, *values):
            count.calls += 1
            return count._scalars(fn, *values)
        Fn.scalars = scalars
        return self

    def __exit__(self, *exc):
        Fn.host, Fn.scalars = self._host, self._scalars


def jax_rows(rounds, budget, rows_n) -> list:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    J = rvm.to_jax(quad)
    adj = rvm.adjoint(quad)
    x, y = jnp.float64(0.3), jnp.float64(-1.2)
    call = jax.jit(lambda x, y: J(0.0, x, y)[0])
    grad = jax.jit(jax.grad(lambda x, y: J(0.0, x, y)[0], argnums=(0, 1)))
    out = []
    b, d = duel(lambda: call(x, y).block_until_ready(), lambda: quad(0.0, 0.3, -1.2),
                rounds, budget)
    assert float(call(x, y)) == quad(0.0, 0.3, -1.2)[0]
    out.append(row("JAX jit: call", b, d, "f"))
    b, d = duel(lambda: grad(x, y)[1].block_until_ready(),
                lambda: adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0), rounds, budget)
    assert [float(g) for g in grad(x, y)] == list(adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)[4:])
    out.append(row("JAX jit: grad", b, d, "rvm.adjoint(f)"))
    xs, ys = np.linspace(-1, 1, rows_n), np.linspace(2, 3, rows_n)
    def batched():
        return jax.jit(jax.vmap(lambda x, y: J(0.0, x, y)[0]))
    batch, direct = batched(), rvm.vmap(quad, in_axes=[None, 0, 0])
    b, d = duel(lambda: batch(xs, ys).block_until_ready(), lambda: direct(0.0, xs, ys),
                rounds, budget)
    with Count() as c:         # (compiled again here: the callback is bound when compiled)
        assert np.allclose(batched()(xs, ys), direct(0.0, xs, ys)[0])
    out.append(row(f"JAX jit(vmap): {rows_n} rows", b, d, "rvm.vmap(f)", c.calls))
    return out


def torch_rows(rounds, budget, rows_n) -> list:
    import torch
    Q = rvm.to_torch(quad)
    adj = rvm.adjoint(quad)
    x = torch.tensor(0.3, dtype=torch.float64)
    y = torch.tensor(-1.2, dtype=torch.float64)
    xg = x.clone().requires_grad_()
    out = []
    b, d = duel(lambda: Q(0.0, x, y), lambda: quad(0.0, 0.3, -1.2), rounds, budget)
    out.append(row("PyTorch eager: call", b, d, "f"))

    def backward():
        xg.grad = None
        Q(0.0, xg, y)[0].backward()

    def direct():
        quad(0.0, 0.3, -1.2)
        adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)
    b, d = duel(backward, direct, rounds, budget)
    assert float(xg.grad) == adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)[4]
    out.append(row("PyTorch eager: call + backward", b, d, "f, then rvm.adjoint(f)"))
    xs = torch.linspace(-1, 1, rows_n, dtype=torch.float64)
    ys = torch.linspace(2, 3, rows_n, dtype=torch.float64)
    batch = torch.func.vmap(lambda x, y: Q(0.0, x, y)[0])
    vm = rvm.vmap(quad, in_axes=[None, 0, 0])
    xn, yn = xs.numpy(), ys.numpy()
    b, d = duel(lambda: batch(xs, ys), lambda: vm(0.0, xn, yn), rounds, budget)
    with Count() as c:
        assert np.allclose(batch(xs, ys).numpy(), vm(0.0, xn, yn)[0])
    out.append(row(f"torch.func.vmap: {rows_n} rows", b, d, "rvm.vmap(f)", c.calls))
    return out


def row(what, bridge, direct, runs, calls=None) -> dict:
    return {"case": what, "bridge_us": bridge * 1e6, "rvm_us": direct * 1e6,
            "overhead_us": (bridge - direct) * 1e6, "rvm_call": runs, "host_calls": calls}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few tiny rounds (a check)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--limit", type=float, default=None,
                        help="exit 1 if a per-call overhead exceeds this (microseconds)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.budget, args.rows = 2, 0.01, 100
    rows = []
    for make in (jax_rows, torch_rows):
        try:
            rows += make(args.rounds, args.budget, args.rows)
        except ModuleNotFoundError as e:
            print(f"interop.py: {e.name} is not installed; its rows are skipped",
                  file=sys.stderr)
    print(f"| {'case':34} | bridge (us) | rvm alone (us) | overhead (us) | rvm calls |")
    print(f"|{'-' * 36}|------------:|---------------:|--------------:|----------:|")
    for r in rows:
        calls = "" if r["host_calls"] is None else str(r["host_calls"])
        print(f"| {r['case']:34} | {r['bridge_us']:11.1f} | {r['rvm_us']:14.1f} | "
              f"{r['overhead_us']:13.1f} | {calls:>9} |")
    print(json.dumps(rows))
    over = [r for r in rows if r["host_calls"] is None and args.limit is not None
            and r["overhead_us"] > args.limit]
    batches = [r for r in rows if r["host_calls"] not in (None, 1)]
    for r in over:
        print(f"interop.py: {r['case']}: {r['overhead_us']:.1f} us over the rvm call "
              f"(limit {args.limit} us)", file=sys.stderr)
    for r in batches:
        print(f"interop.py: {r['case']}: {r['host_calls']} rvm calls for one batch",
              file=sys.stderr)
    return 1 if over or batches else 0


if __name__ == "__main__":
    sys.exit(main())
