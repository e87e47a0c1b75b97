"""The cost of crossing into rvm from JAX and PyTorch: per call, rvm.to_jax under jax.jit
and rvm.to_torch in eager mode, against the rvm call each makes (the same program,
called directly); and batches under jax.vmap / torch.func.vmap against rvm.vmap.

    taskset -c 1 python tools/bench/interop.py [--quick] [--rounds R] [--budget S]
                                               [--limit US]

Each row alternates the bridge and the direct call over R rounds (the order reversed
each round), each round timing a batch of calls sized to take about S seconds of the
process's CPU time (so that other processes on a shared core are not counted); the time
per call is the minimum over the rounds and the overhead is the bridge's minimum less the
direct call's, also given per crossing (a call and its backward() cross twice). Every
bridge's result is checked against the direct call's. The function is a small scalar one
(out += 2x^2 + 3xy + 4y^2) on the default engine, warmed up first so both sides run
native code.

Beside each row, "no-op" is the same bridge with rvm's call replaced by one returning its
arguments: what the crossing costs without rvm. The "floor" rows are the host framework
alone: a jitted jax.pure_callback of a no-op numpy function of the same shapes, JAX's
host callback as the bridge emits it with a no-op, and a PyTorch autograd.Function whose
forward (and backward) only makes tensors of the same shapes. A batch row checks that
the whole batch was one rvm call (a gradient under torch.func.vmap: two, the forward and
the backward batch) and ran as one native batch (no row run by itself).

The last line of output is the rows as JSON; with --limit, the exit code is 1 when an
overhead per crossing exceeds it (microseconds), or a batch is not one native batch.
"""

import argparse
import json
import sys
import time

import numpy as np

import rvm
from rvm.interop._common import Fn

# the process's CPU time: with the benchmark pinned to one core (taskset -c 1), its wall
# time less what other processes on the core take from it
CLOCK = time.process_time


@rvm.reversible
def quad(out: float, x: float, y: float):
    out += 2 * x * x + 3 * x * y + 4 * y * y


def calibrate(run, budget: float) -> int:
    n = 1
    while True:
        start = CLOCK()
        for _ in range(n):
            run()
        if CLOCK() - start > budget / 4 or n >= 1 << 20:
            return n
        n *= 4


def timed(run, n: int) -> float:
    start = CLOCK()
    for _ in range(n):
        run()
    return (CLOCK() - start) / n


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
    """How many host calls (rvm calls) the bridges make, and how many batch rows run one
    by one rather than in a native batch loop. With noop=True, rvm's call itself is
    replaced by one returning its arguments (results of the right shapes and dtypes)."""

    def __init__(self, noop: bool = False):
        self.calls = self.rows = 0
        self.noop = noop
        self._host, self._scalars, self._runner = Fn.host, Fn.scalars, Fn.runner

    def __enter__(self):
        count = self

        def host(fn, *args):
            count.calls += 1
            return count._host(fn, *args)

        def scalars(fn, *args):
            count.calls += 1
            return count._scalars(fn, *args)

        def runner(fn, kinds):
            run = count._runner(fn, kinds)
            if count.noop:
                return lambda *values: values

            def one(*values):
                count.rows += 1
                return run(*values)
            return one
        Fn.host, Fn.scalars, Fn.runner = host, scalars, runner
        self._batch = Fn.batch

        def batch(fn, args, axes, size):
            call = fn.call_fn

            def row(*values):
                count.rows += 1
                return call(*values)
            fn.call_fn = row
            try:
                return count._batch(fn, args, axes, size)
            finally:
                fn.call_fn = call
        Fn.batch = batch
        return self

    def __exit__(self, *exc):
        Fn.host, Fn.scalars, Fn.runner = self._host, self._scalars, self._runner
        Fn.batch = self._batch


def alone(run, rounds: int, budget: float) -> float:
    """The minimum seconds per call of run over the rounds."""
    for _ in range(50):
        run()
    n = calibrate(run, budget)
    return min(timed(run, n) for _ in range(rounds))


def jax_rows(rounds, budget, rows_n) -> list:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    J = rvm.to_jax(quad)
    adj = rvm.adjoint(quad)
    x, y = jnp.float64(0.3), jnp.float64(-1.2)

    def loss(x, y):
        return J(0.0, x, y)[0]
    call = jax.jit(loss)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    out = []
    b, d = duel(lambda: call(x, y).block_until_ready(), lambda: quad(0.0, 0.3, -1.2),
                rounds, budget)
    assert float(call(x, y)) == quad(0.0, 0.3, -1.2)[0]
    with Count(noop=True):
        noop = alone(lambda: call(x, y).block_until_ready(), rounds, budget)
    out.append(row("JAX jit: call", b, d, "f", noop=noop))
    b, d = duel(lambda: grad(x, y)[1].block_until_ready(),
                lambda: adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0), rounds, budget)
    assert [float(g) for g in grad(x, y)] == list(adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)[4:])
    with Count(noop=True):
        noop = alone(lambda: grad(x, y)[1].block_until_ready(), rounds, budget)
    out.append(row("JAX jit: grad", b, d, "rvm.adjoint(f)", noop=noop))
    xs, ys = np.linspace(-1, 1, rows_n), np.linspace(2, 3, rows_n)
    batch, direct = jax.jit(jax.vmap(loss)), rvm.vmap(quad, in_axes=[None, 0, 0])
    b, d = duel(lambda: batch(xs, ys).block_until_ready(), lambda: direct(0.0, xs, ys),
                rounds, budget)
    with Count() as c:
        assert np.allclose(batch(xs, ys), direct(0.0, xs, ys)[0])
    out.append(row(f"JAX jit(vmap): {rows_n} rows", b, d, "rvm.vmap(f)", c))
    gbatch = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1))))
    gdirect = rvm.vmap(adj, in_axes=[None, 0, 0, None, None, None])
    b, d = duel(lambda: gbatch(xs, ys)[1].block_until_ready(),
                lambda: gdirect(0.0, xs, ys, 1.0, 0.0, 0.0), rounds, budget)
    with Count() as c:
        assert np.allclose(gbatch(xs, ys)[1], gdirect(0.0, xs, ys, 1.0, 0.0, 0.0)[5])
    out.append(row(f"JAX jit(vmap(grad)): {rows_n} rows", b, d, "rvm.vmap(rvm.adjoint(f))",
                   c))
    out += jax_floors(rounds, budget)
    return out


def jax_floors(rounds, budget) -> list:
    """JAX alone: a jitted no-op host call with quad's shapes (3 float64 scalars in, 1
    out), through jax.pure_callback and through the host callback the bridge emits."""
    import jax
    import jax.numpy as jnp
    from jax.extend.core import Primitive
    from jax.interpreters import mlir
    x, y = jnp.float64(0.3), jnp.float64(-1.2)
    scalar = jax.ShapeDtypeStruct((), jnp.float64)

    def noop(out, x, y):
        return out

    public = jax.jit(lambda x, y: jax.pure_callback(noop, scalar, 0.0, x, y))
    out = [row("floor: JAX jit, pure_callback no-op",
               alone(lambda: public(x, y).block_until_ready(), rounds, budget))]
    try:
        from rvm.interop._jax import _raw
        if _raw is None:
            return out
    except ImportError:                                   # pragma: no cover
        return out
    p = Primitive("noop_callback")
    p.multiple_results = True
    p.def_abstract_eval(lambda *avals: [jax.core.ShapedArray((), jnp.float64)])

    def lowering(ctx, *args):
        ctx.module_context.add_host_callback(lambda *arrays: (arrays[0],))
        index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
        return _raw(ctx, *args, index=index)
    mlir.register_lowering(p, lowering, cacheable=False)
    raw = jax.jit(lambda x, y: p.bind(jnp.float64(0.0), x, y)[0])
    out.append(row("floor: JAX jit, host callback no-op",
                   alone(lambda: raw(x, y).block_until_ready(), rounds, budget)))
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
    with Count(noop=True):
        noop = alone(lambda: Q(0.0, x, y), rounds, budget)
    out.append(row("PyTorch eager: call", b, d, "f", noop=noop))

    def backward():
        xg.grad = None
        Q(0.0, xg, y)[0].backward()

    def direct():
        quad(0.0, 0.3, -1.2)
        adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)
    b, d = duel(backward, direct, rounds, budget)
    assert float(xg.grad) == adj(0.0, 0.3, -1.2, 1.0, 0.0, 0.0)[4]
    with Count(noop=True):
        noop = alone(backward, rounds, budget)
    out.append(row("PyTorch eager: call + backward", b, d, "f, then rvm.adjoint(f)",
                   crossings=2, noop=noop))
    xs = torch.linspace(-1, 1, rows_n, dtype=torch.float64)
    ys = torch.linspace(2, 3, rows_n, dtype=torch.float64)
    batch = torch.func.vmap(lambda x, y: Q(0.0, x, y)[0])
    vm = rvm.vmap(quad, in_axes=[None, 0, 0])
    xn, yn = xs.numpy(), ys.numpy()
    b, d = duel(lambda: batch(xs, ys), lambda: vm(0.0, xn, yn), rounds, budget)
    with Count() as c:
        assert np.allclose(batch(xs, ys).numpy(), vm(0.0, xn, yn)[0])
    out.append(row(f"torch.func.vmap: {rows_n} rows", b, d, "rvm.vmap(f)", c))
    gbatch = torch.func.vmap(torch.func.grad(lambda x, y: Q(0.0, x, y)[0], argnums=(0, 1)))
    gdirect = rvm.vmap(adj, in_axes=[None, 0, 0, None, None, None])

    def both():
        vm(0.0, xn, yn)
        gdirect(0.0, xn, yn, 1.0, 0.0, 0.0)
    b, d = duel(lambda: gbatch(xs, ys), both, rounds, budget)
    with Count() as c:
        assert np.allclose(gbatch(xs, ys)[1].numpy(), gdirect(0.0, xn, yn, 1.0, 0.0, 0.0)[5])
    out.append(row(f"torch.func.vmap(grad): {rows_n} rows", b, d,
                   "rvm.vmap(f), then rvm.vmap(rvm.adjoint(f))", c, crossings=2))
    return out + torch_floors(rounds, budget, xs, ys)


def torch_floors(rounds, budget, xs, ys) -> list:
    """PyTorch alone: an autograd.Function with quad's shapes whose forward makes three
    float64 scalar tensors and whose backward one (called as the bridge calls it), and
    the same under torch.func.vmap (its vmap rule one call on the rows)."""
    import torch

    class Noop(torch.autograd.Function):
        generate_vmap_rule = False

        @staticmethod
        def forward(*args):
            return tuple(torch.from_numpy(np.array(a.numpy())) for a in args)

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(*inputs)

        @staticmethod
        def backward(ctx, *cts):
            return None, torch.from_numpy(np.array(cts[0].item())), None

        @staticmethod
        def vmap(info, in_dims, *args):
            args = [a.expand(info.batch_size) if d is None else a
                    for a, d in zip(args, in_dims)]
            return Noop.apply(*args), (0,) * len(args)
    apply = super(torch.autograd.Function, Noop).apply
    zero = torch.tensor(0.0, dtype=torch.float64)
    x = torch.tensor(0.3, dtype=torch.float64)
    y = torch.tensor(-1.2, dtype=torch.float64)
    xg = x.clone().requires_grad_()

    def backward():
        xg.grad = None
        apply(zero, xg, y)[0].backward()
    batch = torch.func.vmap(lambda x, y: Noop.apply(zero, x, y)[0])
    return [row("floor: PyTorch autograd.Function no-op",
                alone(lambda: apply(zero, x, y), rounds, budget)),
            row("floor: PyTorch no-op, call + backward", alone(backward, rounds, budget)),
            row(f"floor: torch.func.vmap no-op, {len(xs)} rows",
                alone(lambda: batch(xs, ys), rounds, budget))]


def row(what, bridge, direct=None, runs=None, count=None, crossings=1, noop=None) -> dict:
    """One row; `direct` None for a floor row (the host framework alone)."""
    us = None if direct is None else (bridge - direct) * 1e6
    return {"case": what, "bridge_us": bridge * 1e6,
            "rvm_us": None if direct is None else direct * 1e6, "overhead_us": us,
            "per_crossing_us": None if us is None else us / crossings,
            "noop_us": None if noop is None else noop * 1e6, "rvm_call": runs,
            "crossings": crossings,
            "host_calls": None if count is None else count.calls,
            "rows_one_by_one": None if count is None else count.rows}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few tiny rounds (a check)")
    # many short rounds: on a shared machine, the minimum of short windows finds the
    # times the benchmark had the core to itself
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--budget", type=float, default=0.02)
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
    def cell(v, width):
        return f"{'':>{width}}" if v is None else f"{v:{width}.1f}"
    print(f"| {'case':42} | bridge (us) | rvm alone (us) | overhead (us) | per crossing "
          f"| no-op (us) | rvm calls |")
    print(f"|{'-' * 44}|------------:|---------------:|--------------:|-------------:"
          f"|-----------:|----------:|")
    for r in rows:
        calls = "" if r["host_calls"] is None else str(r["host_calls"])
        print(f"| {r['case']:42} | {cell(r['bridge_us'], 11)} | {cell(r['rvm_us'], 14)} | "
              f"{cell(r['overhead_us'], 13)} | {cell(r['per_crossing_us'], 12)} | "
              f"{cell(r['noop_us'], 10)} | {calls:>9} |")
    print(json.dumps(rows))
    over = [r for r in rows if r["host_calls"] is None and args.limit is not None
            and r["per_crossing_us"] is not None and r["per_crossing_us"] > args.limit]
    batches = [r for r in rows if r["host_calls"] is not None and
               (r["host_calls"] != r["crossings"] or r["rows_one_by_one"])]
    for r in over:
        print(f"interop.py: {r['case']}: {r['per_crossing_us']:.1f} us over the rvm call "
              f"per crossing (limit {args.limit} us)", file=sys.stderr)
    for r in batches:
        print(f"interop.py: {r['case']}: {r['host_calls']} rvm calls for "
              f"{r['crossings']} batch(es), "
              f"{r['rows_one_by_one']} rows run one by one", file=sys.stderr)
    return 1 if over or batches else 0


if __name__ == "__main__":
    sys.exit(main())
