"""rvm.to_jax: an rvm function as a JAX function.

One JAX primitive, `rvm_call`, runs an rvm function (or a derived one) on the host and
returns the final values it is asked for. Its rules are rvm's programs:

- jvp: the tangent program, `rvm.tangent(f)`, whose tangent outputs are linear in its
  tangent inputs;
- transpose (what jax.grad, jax.vjp and jax.jacrev need of that linear map): the adjoint
  program, `rvm.adjoint(f)`; and the transpose of an adjoint's linear map is the tangent
  program again;
- batching: one `rvm.vmap` batch (nested vmaps are merged into one batch);
- lowering under jax.jit: `jax.pure_callback` with the result shapes declared (every
  result has its argument's shape and dtype).

Derived functions are rvm functions like any other, so each rule applies to them too:
second derivatives (jax.hessian, grad of grad) run rvm's second-order programs
(`rvm.tangent(rvm.adjoint(f))`, `rvm.adjoint(rvm.adjoint(f))`, ...). A function without
an adjoint program (one that allocates heap arrays or uses the stack) has its derivatives
with an adjoint in them computed from gradient mode instead (rvm.interop._common.
HeapDerivative): the same primitive and rules, another host computation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..core.errors import UsageError
from ._common import Fn

rvm_call_p = Primitive("rvm_call")
rvm_call_p.multiple_results = True


def _sizes(shapes, batched):
    size = None if batched is None else next(
        s[0] for s, ax in zip(shapes, batched) if ax == 0)
    return size


def _out_shapes(args, outs, batched):
    """(shape, dtype) of each result: its argument's, with the batch axis first."""
    shapes = [np.shape(a) if not hasattr(a, "aval") else a.aval.shape for a in args]
    size = _sizes(shapes, batched)
    out = []
    for o in outs:
        shape = tuple(shapes[o])
        if batched is not None and batched[o] is None:
            shape = (size,) + shape
        out.append((shape, args[o].dtype if not hasattr(args[o], "aval")
                    else args[o].aval.dtype))
    return out


def _kinds(avals) -> tuple:
    return tuple((tuple(a.shape), np.dtype(a.dtype)) for a in avals)


@rvm_call_p.def_impl
def _impl(*args, fn, outs, batched):
    arrays = [np.asarray(a) for a in args]
    plan = fn.plan(outs, batched, _kinds(arrays))
    return [jnp.asarray(r) for r in fn.host(plan, *arrays)]


@rvm_call_p.def_abstract_eval
def _abstract(*avals, fn, outs, batched):
    return [jax.core.ShapedArray(shape, dtype)
            for shape, dtype in _out_shapes(avals, outs, batched)]


def _callback(*args, fn, outs, batched):
    shapes = [jax.ShapeDtypeStruct(s, d) for s, d in _out_shapes(args, outs, batched)]
    plan = fn.plan(outs, batched, _kinds([a.aval for a in args]))
    return jax.pure_callback(functools.partial(fn.host, plan), shapes, *args)


def _lowering(ctx, *args, fn, outs, batched):
    """Under jit: XLA's host callback on the CPU, calling fn.host with a plan made here
    for these shapes and dtypes, on numpy views of XLA's buffers. Neither
    jax.pure_callback's wrapper (which puts every argument on a device as a JAX array,
    about 100 us a call, only for the callback to read it back) nor the checking wrapper
    of JAX's callback lowering (about 1.5 us a result) is on the way: the plan makes each
    result an array of exactly its declared dtype and shape."""
    plan = fn.plan(outs, batched, _kinds(ctx.avals_in))

    def host(*arrays):
        return tuple(fn.host(plan, *arrays))
    platforms = ctx.module_context.platforms
    if _raw is None or list(platforms) != ["cpu"]:
        result, _, _ = emit_python_callback(
            ctx, host, None, list(args), ctx.avals_in, ctx.avals_out,
            has_side_effect=False, returns_token=False)
        return result
    ctx.module_context.add_host_callback(host)
    index = np.uint64(len(ctx.module_context.host_callbacks) - 1)
    return _raw(ctx, *args, index=index)


def _dce(used, eqn):
    """Under jit, results nobody reads are not converted and returned."""
    if not any(used):
        return [False] * len(eqn.invars), None
    params = dict(eqn.params, outs=tuple(o for o, u in zip(eqn.params["outs"], used) if u))
    return [True] * len(eqn.invars), new_jaxpr_eqn(
        eqn.invars, [v for v, u in zip(eqn.outvars, used) if u], eqn.primitive, params,
        eqn.effects, eqn.source_info, eqn.ctx)


try:          # (JAX-internal functions; without them, jax.pure_callback's public path)
    from jax._src.callback import emit_python_callback
    mlir.register_lowering(rvm_call_p, _lowering, cacheable=False)
except ImportError:                                   # pragma: no cover
    mlir.register_lowering(rvm_call_p, mlir.lower_fun(_callback, multiple_results=True))
try:          # XLA's CPU target for Python callbacks (what emit_python_callback emits)
    _raw = jax.ffi.ffi_lowering("xla_ffi_python_cpu_callback", has_side_effect=False)
except AttributeError:                                # pragma: no cover
    _raw = None
try:
    from jax._src.core import new_jaxpr_eqn
    from jax._src.interpreters.partial_eval import dce_rules
    dce_rules[rvm_call_p] = _dce
except ImportError:                                   # pragma: no cover
    pass


def _is_float(x) -> bool:
    aval = x.aval if isinstance(x, ad.UndefinedPrimal) else jax.typeof(x)
    return jnp.issubdtype(aval.dtype, jnp.floating)


def _zero(aval):
    return ad.Zero(aval.to_tangent_aval())


def _jvp(primals, tangents, *, fn, outs, batched):
    """Forward mode: rvm's tangent program (x, xdot) -> (F(x), J xdot)."""
    out = rvm_call_p.bind(*primals, fn=fn, outs=outs, batched=batched)
    floats = [k for k, p in enumerate(primals) if _is_float(p)]
    if all(type(tangents[k]) is ad.Zero for k in floats):
        return out, [_zero(jax.typeof(o)) for o in out]
    dots = [ad.instantiate_zeros(tangents[k]) for k in floats]
    n = len(primals)
    picked = [o for o in outs if o in floats]
    t_batched = None if batched is None else batched + tuple(batched[k] for k in floats)
    t_out = rvm_call_p.bind(*primals, *dots, fn=fn.tangent,
                            outs=tuple(n + floats.index(o) for o in picked),
                            batched=t_batched)
    t_out = iter(t_out)
    return out, [next(t_out) if o in floats else _zero(jax.typeof(v))
                 for o, v in zip(outs, out)]


ad.primitive_jvps[rvm_call_p] = _jvp


def _transpose(cts, *args, fn, outs, batched):
    """Reverse mode. The linear maps JAX transposes are a tangent program's (the tangents
    out in terms of the tangents in, J xdot), whose transpose is the adjoint program
    (J^T ybar), and an adjoint program's, whose transpose is the tangent program."""
    if fn.kind is None:
        raise NotImplementedError(f"rvm_call of {fn.name} is not linear")
    base = fn.base
    n = _base_arity(args)
    x, lin = args[:n], args[n:]
    if any(ad.is_undefined_primal(a) for a in x):
        raise NotImplementedError(f"rvm_call of {fn.name}: transposed in its primal "
                                  "arguments")
    shapes = [a.aval.shape if ad.is_undefined_primal(a) else jnp.shape(a) for a in args]
    size = _sizes(shapes, batched)
    full = []
    for j, a in enumerate(lin):
        aval = a.aval if ad.is_undefined_primal(a) else jax.typeof(a)
        shape = aval.shape
        if batched is not None and batched[n + j] is None:
            shape = (size,) + tuple(shape)
        full.append(jnp.zeros(shape, aval.dtype))
    for o, ct in zip(outs, cts):
        if type(ct) is not ad.Zero:
            full[o - n] = full[o - n] + ct
    other = base.adjoint if fn.kind == "tangent" else base.tangent
    want = [n + j for j, a in enumerate(lin) if ad.is_undefined_primal(a)]
    o_batched = None if batched is None else batched[:n] + (0,) * len(lin)
    res = iter(rvm_call_p.bind(*x, *full, fn=other, outs=tuple(want), batched=o_batched))
    out = [None] * len(args)
    for k in want:
        r = next(res)
        if batched is not None and batched[k] is None:
            r = r.sum(axis=0)          # an argument shared by the rows: the rows' sum
        out[k] = r
    return out


def _base_arity(args) -> int:
    """How many of a derived function's arguments are its base's: it adds one per float
    argument of the base (n + floats(args[:n]) grows strictly with n, so n is unique)."""
    floats = 0
    for n, a in enumerate(args):
        if n + floats == len(args):
            return n
        floats += _is_float(a)
    raise NotImplementedError("rvm_call: cannot split a derived function's arguments")


ad.primitive_transposes[rvm_call_p] = _transpose


def _batch(args, dims, *, fn, outs, batched):
    """jax.vmap: one rvm.vmap batch. A batch of batches (nested vmaps) is one batch of
    their product."""
    args = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    if batched is None:
        axes = tuple(None if d is None else 0 for d in dims)
        out = rvm_call_p.bind(*args, fn=fn, outs=outs, batched=axes)
        return out, [0] * len(out)
    size = next(a.shape[0] for a, d in zip(args, dims) if d is not None)
    inner = next(a.shape[1 if d is not None else 0] for a, d, ax in zip(args, dims, batched)
                 if ax == 0)
    merged, axes = [], []
    for a, d, ax in zip(args, dims, batched):
        if d is None and ax is None:
            merged.append(a)
            axes.append(None)
            continue
        if d is None:                    # (inner, ...) -> (size, inner, ...)
            a = jnp.broadcast_to(a, (size,) + a.shape)
        elif ax is None:                 # (size, ...) -> (size, inner, ...)
            a = jnp.broadcast_to(a[:, None], (size, inner) + a.shape[1:])
        merged.append(a.reshape((size * inner,) + a.shape[2:]))
        axes.append(0)
    out = rvm_call_p.bind(*merged, fn=fn, outs=outs, batched=tuple(axes))
    return [o.reshape((size, inner) + o.shape[1:]) for o in out], [0] * len(out)


batching.primitive_batchers[rvm_call_p] = _batch


def to_jax(f, **options):
    """`f` (a reversible function, a loaded program's function, or a transformed one) as a
    JAX function: same arguments (JAX arrays, numpy arrays or Python numbers), returning
    every argument's final value as a JAX array. jax.grad/vjp/jacrev run rvm's adjoint
    program, jax.jvp/jacfwd its tangent program, second derivatives its second-order
    programs; jax.jit runs it through a host callback; jax.vmap is one rvm.vmap batch.
    `options` are machine options (engine, checks, max_steps, tol, ...)."""
    from ..ad.gradient import check_options, positional
    check_options(options)
    fn = Fn(f, options, "rvm.to_jax")

    def run(*args, **kwargs):
        args = positional(f, args, kwargs)
        names = fn.names(len(args))
        arrays = []
        for k, a in enumerate(args):
            if isinstance(a, (str, bytes)) or (callable(a) and not hasattr(a, "shape")):
                raise UsageError(f"rvm.to_jax({fn.name}): {names[k]} is {type(a).__name__}; "
                                 "pass numbers or arrays")
            if not isinstance(a, jax.Array):
                try:
                    a = jnp.asarray(a)
                except (TypeError, ValueError, OverflowError):
                    raise UsageError(f"rvm.to_jax({fn.name}): {names[k]} is "
                                     f"{type(a).__name__}, not a number or an array") from None
            arrays.append(a)
        fn.check(tuple((tuple(a.shape), np.dtype(a.dtype)) for a in arrays))
        return tuple(rvm_call_p.bind(*arrays, fn=fn, outs=tuple(range(len(arrays))),
                                     batched=None))

    run.__name__ = f"to_jax_{fn.name}"
    run.__doc__ = getattr(f, "__doc__", None)
    run.rvm_function = f
    return run
