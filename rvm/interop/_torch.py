"""rvm.to_torch: an rvm function as a PyTorch function.

One autograd.Function, `_Call`, runs an rvm function (or a derived one) on CPU tensors
and returns the final values it is asked for:

- backward: the adjoint program, `rvm.adjoint(f)`, called through `_Call` again, so the
  backward pass is itself differentiable (double backward runs
  `rvm.adjoint(rvm.adjoint(f))`: gradgradcheck);
- jvp (torch.func.jvp, torch.autograd.forward_ad): the tangent program, `rvm.tangent(f)`;
- vmap (torch.func.vmap): one `rvm.vmap` batch (nested vmaps merged into one batch).

A function without an adjoint program (one that allocates heap arrays or uses the stack)
has its backward and double backward computed from gradient mode instead
(rvm.interop._common.HeapDerivative).
"""

from __future__ import annotations

import numpy as np
import torch

from ..core.errors import UsageError
from ._common import Fn


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.to(torch.float64)
    return t.numpy()


_SCALARS = frozenset({torch.float64, torch.float32, torch.int64})


class _Node:
    """What one _Call runs: fn, the results wanted (`outs`) and the batch axes (0 or None
    per argument; None: one call). A node made for a signature is kept with it, and so
    are the nodes of its derivatives, so that what they work out is worked out once."""

    __slots__ = ("batched", "derived", "floats", "fn", "ints", "kinds", "made", "outs",
                 "scalar")

    def __init__(self, fn: Fn, outs: tuple, batched: tuple | None = None,
                 scalar: bool = False):
        self.fn, self.outs, self.batched = fn, outs, batched
        self.scalar = scalar          # every argument a float64, float32 or int64 scalar
        # (scalars, once known) the arguments' kinds, the indices of the float ones, the
        # numpy dtype of each result; the positions of the integer results
        self.kinds = self.floats = self.made = self.ints = None
        self.derived: dict = {}       # the nodes of backward and jvp, by what they want

    def scalars(self, args) -> tuple:
        """The call on scalar tensors: the results picked by outs, each a tensor of its
        argument's dtype."""
        if self.kinds is None:
            self.kinds = tuple(((), "f" if a.is_floating_point() else "i") for a in args)
            self.floats = [k for k, (_, kind) in enumerate(self.kinds) if kind == "f"]
            self.made = [_NUMPY[args[o].dtype] for o in self.outs]
        return self.numbers([a.item() for a in args])

    def numbers(self, values: list) -> tuple:
        """The call on Python numbers of the node's kinds."""
        res = self.fn.scalars(self.kinds, *values)
        return tuple(_from_numpy(np.array(res[o], dtype))
                     for o, dtype in zip(self.outs, self.made))

    def arrays(self, args) -> tuple:
        """The call (or batch) on tensors through numpy: the results picked by outs."""
        arrays = [_numpy(a) for a in args]
        plan = self.fn.plan(self.outs, self.batched,
                            tuple((a.shape, a.dtype) for a in arrays))
        res = self.fn.host(plan, *arrays)
        out = []
        for o, r in zip(self.outs, res):
            t = torch.as_tensor(r)
            out.append(t.to(args[o].dtype) if t.dtype != args[o].dtype else t)
        return tuple(out)


_NUMPY = {torch.float64: np.float64, torch.float32: np.float32, torch.int64: np.int64}
_from_numpy = torch.from_numpy


def _scalar_backward(node: _Node, args, cts, floats: list, want: list,
                     grads: list) -> tuple:
    """backward() of a call on scalars (not itself differentiated): the adjoint program
    called on Python numbers, its gradients made tensors."""
    adjoint = node.derived.get(("adjoint numbers", tuple(want)))
    if adjoint is None:
        adjoint = node.derived["adjoint numbers", tuple(want)] = _Node(
            node.fn.adjoint, tuple(len(args) + floats.index(k) for k in want), None, True)
        adjoint.kinds = node.kinds + (((), "f"),) * len(floats)
        adjoint.made = [_NUMPY[args[k].dtype] for k in want]
    ybar = dict.fromkeys(floats, 0.0)
    for o, ct in zip(node.outs, cts):
        if ct is not None and o in ybar:
            ybar[o] += ct.item()
    res = adjoint.numbers([a.item() for a in args] + list(ybar.values()))
    for k, r in zip(want, res):
        grads[1 + k] = r
    return tuple(grads)


def _row_shape(t: torch.Tensor, axis) -> tuple:
    return tuple(t.shape[1:]) if axis == 0 else tuple(t.shape)


class _Call(torch.autograd.Function):
    generate_vmap_rule = False

    @staticmethod
    def forward(node, *args):
        return node.scalars(args) if node.scalar else node.arrays(args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        node, *args = inputs
        ctx.node = node
        ctx.save_for_backward(*args)
        ctx.save_for_forward(*args)
        ctx.set_materialize_grads(False)      # (an unused result's cotangent: None)
        if node.ints is None:
            node.ints = [i for i, o in enumerate(output) if not o.is_floating_point()]
        if node.ints:
            ctx.mark_non_differentiable(*[output[i] for i in node.ints])

    @staticmethod
    def backward(ctx, *cts):
        """Reverse mode: the adjoint program (x, ybar) -> (x, J^T ybar), through _Call."""
        node, args = ctx.node, ctx.saved_tensors
        floats = node.floats or [k for k, a in enumerate(args) if a.is_floating_point()]
        needs = ctx.needs_input_grad
        want = [k for k in floats if needs[1 + k]]
        grads: list = [None] * (1 + len(args))
        if not want:
            return tuple(grads)
        if node.scalar and not torch.is_grad_enabled():
            return _scalar_backward(node, args, cts, floats, want, grads)
        n, b = len(args), node.batched
        size = None if b is None else next(a.shape[0] for a, ax in zip(args, b) if ax == 0)
        ybar: dict = {}
        for o, ct in zip(node.outs, cts):
            if ct is not None and args[o].is_floating_point():
                ybar[o] = ct if o not in ybar else ybar[o] + ct
        for k in floats:
            if k not in ybar:
                shape = tuple(args[k].shape) if b is None else \
                    (size,) + _row_shape(args[k], b[k])
                ybar[k] = torch.zeros(shape, dtype=args[k].dtype)
        adjoint = node.derived.get(("adjoint", tuple(want)))
        if adjoint is None:
            a_batched = None if b is None else b + (0,) * len(floats)
            adjoint = node.derived["adjoint", tuple(want)] = _Node(
                node.fn.adjoint, tuple(n + floats.index(k) for k in want), a_batched,
                node.scalar)
        ybars = [ybar[k] for k in floats]
        if torch.is_grad_enabled():      # create_graph: the backward pass differentiable
            res = _apply(adjoint, *args, *ybars)
        else:
            res = _Call.forward(adjoint, *args, *ybars)
        for k, r in zip(want, res):
            grads[1 + k] = r.sum(0) if b is not None and b[k] is None else r
        return tuple(grads)

    @staticmethod
    def jvp(ctx, *tangents):
        """Forward mode: the tangent program (x, xdot) -> (F(x), J xdot)."""
        node, args = ctx.node, ctx.saved_tensors
        tangents = tangents[1:]
        floats = [k for k, a in enumerate(args) if a.is_floating_point()]
        dots = [torch.zeros_like(args[k]) if tangents[k] is None else tangents[k]
                for k in floats]
        b = node.batched
        t_batched = None if b is None else b + tuple(b[k] for k in floats)
        picked = [o for o in node.outs if o in floats]
        scalar = node.scalar and all(d.dim() == 0 and d.dtype in _SCALARS for d in dots)
        key = ("tangent", scalar, tuple(d.dtype for d in dots))
        tangent = node.derived.get(key)
        if tangent is None:
            tangent = node.derived[key] = _Node(
                node.fn.tangent, tuple(len(args) + floats.index(o) for o in picked),
                t_batched, scalar)
        res = iter(_apply(tangent, *args, *dots))
        return tuple(next(res) if o in floats else None for o in node.outs)

    @staticmethod
    def vmap(info, in_dims, node, *args):
        """torch.func.vmap: one rvm.vmap batch; a batch of batches is one batch of their
        product."""
        dims = in_dims[1:]
        args = [a if d is None else a.movedim(d, 0) for a, d in zip(args, dims)]
        b = node.batched
        if b is None:
            out = _apply(_Node(node.fn, node.outs,
                               tuple(None if d is None else 0 for d in dims)), *args)
            return out, (0,) * len(out)
        size = info.batch_size
        inner = next(a.shape[1 if d is not None else 0]
                     for a, d, ax in zip(args, dims, b) if ax == 0)
        merged, axes = [], []
        for a, d, ax in zip(args, dims, b):
            if d is None and ax is None:
                merged.append(a)
                axes.append(None)
                continue
            if d is None:
                a = a.expand((size,) + tuple(a.shape))
            elif ax is None:
                a = a[:, None].expand((size, inner) + tuple(a.shape[1:]))
            merged.append(a.reshape((size * inner,) + tuple(a.shape[2:])))
            axes.append(0)
        out = _apply(_Node(node.fn, node.outs, tuple(axes)), *merged)
        return tuple(o.reshape((size, inner) + tuple(o.shape[1:])) for o in out), \
            (0,) * len(out)


def _tensor(a, k: int, fn: Fn, n: int) -> torch.Tensor:
    if type(a) is torch.Tensor and a.device.type == "cpu" and not a.is_complex() and \
            a.layout is torch.strided:
        return a                                               # (the common case, quickly)
    if type(a) is float:
        return _float(a)
    label, who = fn.names(n)[k], f"rvm.to_torch({fn.name})"
    if isinstance(a, torch.Tensor):
        if a.device.type != "cpu":
            raise UsageError(f"{who}: {label} is on device {a.device}; rvm runs on the CPU "
                             "(move it with .cpu())")
        if a.is_complex():
            raise UsageError(f"{who}: {label} is a complex tensor; pass a complex number as "
                             "two float tensors")
        if a.layout is not torch.strided:
            layout = str(a.layout).removeprefix("torch.")
            raise UsageError(f"{who}: {label} is a {layout} tensor; rvm takes dense tensors "
                             "(convert it with .to_dense())")
        return a
    if isinstance(a, (bool, str, bytes)) or callable(a):
        raise UsageError(f"{who}: {label} is {type(a).__name__}; pass tensors or numbers")
    if isinstance(a, float):
        return _float(a)
    if isinstance(a, int):
        return _int(a)
    try:
        array = np.asarray(a)
        if array.dtype == object:
            raise TypeError
        return torch.as_tensor(array)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise UsageError(f"{who}: {label} is {type(a).__name__}, not a number or an "
                         "array") from None


def _float(a: float) -> torch.Tensor:
    return _from_numpy(np.array(float(a)))        # (twice as fast as torch.scalar_tensor)


def _int(a: int) -> torch.Tensor:
    return torch.tensor(a, dtype=torch.int64)


def to_torch(f, **options):
    """`f` (a reversible function, a loaded program's function, or a transformed one) as a
    PyTorch function: same arguments (CPU tensors, numpy arrays or Python numbers; a Python
    float becomes a float64 tensor), returning every argument's final value as a tensor.
    backward() and torch.autograd.grad run rvm's adjoint program (differentiable again:
    double backward), torch.func.jvp and forward_ad its tangent program, torch.func.vmap
    one rvm.vmap batch. `options` are machine options (engine, checks, tol, ...)."""
    from ..ad.gradient import check_options, positional
    check_options(options)
    fn = Fn(f, options, "rvm.to_torch")
    seen: dict = {}          # the kinds of arguments of earlier calls -> their _Node

    def run(*args, **kwargs):
        if kwargs:
            args = positional(f, args, kwargs)
        key = tuple([(a.dtype, a.shape, a.is_cpu) if type(a) is torch.Tensor else type(a)
                     for a in args])
        known = seen.get(key)
        if known is not None:         # checked before: only Python numbers to convert
            node, numbers = known
            if numbers:
                args = list(args)
                for k, make in numbers:
                    args[k] = make(args[k])
            return _apply(node, *args)
        n = len(args)
        tensors = [_tensor(a, k, fn, n) for k, a in enumerate(args)]
        fn.check(tuple((tuple(t.shape), _dtype(t.dtype)) for t in tensors))
        scalar = all(t.dim() == 0 and t.dtype in _SCALARS for t in tensors)
        node = _Node(fn, tuple(range(n)), scalar=scalar)
        if all(type(a) in (torch.Tensor, float, int) for a in args):
            seen[key] = node, [(k, _float if type(a) is float else _int)
                               for k, a in enumerate(args) if type(a) is not torch.Tensor]
        return _apply(node, *tensors)

    run.__name__ = f"to_torch_{fn.name}"
    run.__doc__ = getattr(f, "__doc__", None)
    run.rvm_function = f
    return run


_DTYPES: dict = {}


def _dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype a tensor of this dtype is read as (float16 and bfloat16: float64)."""
    if dtype not in _DTYPES:
        if dtype in (torch.bfloat16, torch.float16):
            _DTYPES[dtype] = np.dtype(np.float64)
        else:
            _DTYPES[dtype] = np.dtype(str(dtype).removeprefix("torch."))
    return _DTYPES[dtype]


def _apply(node: _Node, *tensors):
    """_Call.apply without its binding of default arguments (inspect.signature on every
    call, 15 us; forward has none): autograd's apply outside torch.func transforms, and
    functorch's call of a custom function inside them."""
    if _functorch_active():
        return _FUNCTORCH_CALL(_Call, node, *tensors)
    return _BASE_APPLY(node, *tensors)


try:                  # (PyTorch internals; without them, _Call.apply every time)
    _functorch_active = torch._C._are_functorch_transforms_active
    _BASE_APPLY = super(torch.autograd.Function, _Call).apply
except AttributeError:                                 # pragma: no cover
    def _functorch_active():
        return True
try:
    from torch._functorch.autograd_function import custom_function_call as _FUNCTORCH_CALL
except ImportError:                                    # pragma: no cover
    def _FUNCTORCH_CALL(cls, *args):
        return cls.apply(*args)
