"""What the JAX and PyTorch bridges share: an rvm function with its derived functions
(tangent, adjoint) made once, the check of a call's arguments against its parameters, and
the host call (one call, or one rvm.vmap batch) with the dtype rule.

The dtype rule: rvm computes in float64 and int64. A float argument of any float dtype
(float16, bfloat16, float32) is converted to float64, and each result comes back in the
dtype of the argument it is the final value (or the derivative) of: float32 in, float32
out, rounded once at the end. Integer arguments of any integer dtype are converted to
int64, and a result that no longer fits its argument's dtype is an error.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.errors import UsageError


class Fn:
    """An rvm function as the bridges see it: a reversible function, a loaded program's
    function, or a transformed one (`~f`, `rvm.adjoint(f)`), with machine options. Its
    tangent and adjoint are made once; `kind` and `base` say what it is derived from
    (the transpose rules need it). Hashed by identity (JAX keeps it as a parameter)."""

    def __init__(self, fn, options: dict, who: str, kind: str | None = None,
                 base: Fn | None = None):
        self.fn, self.options, self.who, self.kind, self.base = fn, options, who, kind, base
        self._derived: dict = {}
        self._checked: dict = {}
        self.call_fn = functools.partial(fn, **options) if options else fn

    @property
    def name(self) -> str:
        return getattr(self.fn, "name", None) or getattr(self.fn, "__name__", "fn")

    def derived(self, kind: str) -> Fn:
        if kind not in self._derived:
            from ..ad.derivatives import adjoint, tangent
            make = tangent if kind == "tangent" else adjoint
            self._derived[kind] = Fn(make(self.fn), self.options, self.who, kind, self)
        return self._derived[kind]

    @property
    def tangent(self) -> Fn:
        return self.derived("tangent")

    @property
    def adjoint(self) -> Fn:
        return self.derived("adjoint")

    def names(self, n: int) -> list[str]:
        from ..ad.gradient import parameter_names
        names = parameter_names(self.fn) if self.base is None else None
        if names is None or len(names) != n:
            return [f"argument {k}" for k in range(n)]
        return [f"argument {k} (`{v}`)" for k, v in enumerate(names)]

    def check(self, kinds: tuple) -> tuple:
        """Check a call's arguments, given as (shape, dtype) pairs (of one row under a
        batch), against the function; the float arguments' indices. The function is
        compiled for this signature here, so a mistake is reported before any run."""
        if kinds in self._checked:
            return self._checked[kinds]
        names = self.names(len(kinds))
        example = []
        for k, (shape, dtype) in enumerate(kinds):
            kind = np.dtype(dtype).kind
            if kind not in "fiu":
                what = {"b": "booleans", "c": "complex numbers"}.get(kind, f"dtype {dtype}")
                raise UsageError(f"{self.who}({self.name}): {names[k]} holds {what}; rvm "
                                 "takes float and integer scalars and arrays (pass a complex "
                                 "number as two floats)")
            if len(shape) > 2:
                raise UsageError(f"{self.who}({self.name}): {names[k]} has shape "
                                 f"{tuple(shape)}; rvm takes scalars and 1-D or 2-D arrays "
                                 "(use jax.vmap / torch.func.vmap for a batch of calls)")
            if any(s == 0 for s in shape):
                raise UsageError(f"{self.who}({self.name}): {names[k]} is empty (shape "
                                 f"{tuple(shape)})")
            if len(shape) == 0:
                example.append(0.0 if kind == "f" else 0)
            else:
                example.append(np.zeros(shape, np.float64 if kind == "f" else np.int64))
        if self.base is None:
            from ..ad.derivatives import float_arguments
            floats = float_arguments(self.fn, tuple(example))     # compiles: reports mistakes
            for k, (shape, dtype) in enumerate(kinds):
                is_float = np.dtype(dtype).kind == "f"
                if len(shape) == 0 and is_float != (k in floats):
                    want = "a float" if k in floats else "an integer"
                    raise UsageError(f"{self.who}({self.name}): {names[k]} is {want} "
                                     f"parameter; got {np.dtype(dtype).name}")
        floats = tuple(k for k, (_, dtype) in enumerate(kinds) if np.dtype(dtype).kind == "f")
        self._checked[kinds] = floats
        return floats

    def batch(self, args: list, axes: tuple, size: int) -> tuple:
        """The calls on rows of `args` (axis 0, or None: the same for every row) as
        rvm.vmap makes them: one native loop through the function's `batch` where it
        can, else a call per row; each result stacked along a new first axis."""
        batch = getattr(self.fn, "batch", None)
        if batch is not None and size and all(
                np.ndim(a) == (1 if ax is not None else 0) for a, ax in zip(args, axes)):
            columns = [a if ax is not None else np.broadcast_to(a, (size,))
                       for a, ax in zip(args, axes)]
            done = batch(columns, **self.options)
            if done is not None:
                return done
        rows = []
        for i in range(size):
            row = [a[i] if ax is not None else a for a, ax in zip(args, axes)]
            rows.append(self.call_fn(*[v.item() if isinstance(v, np.generic) else v
                                       for v in row]))
        if not rows:
            return tuple(np.empty((0,) + np.shape(a)[1 if ax is not None else 0:])
                         for a, ax in zip(args, axes))
        return tuple(np.stack([np.asarray(r[k]) for r in rows]) for k in range(len(args)))

    def scalars(self, *values) -> tuple:
        """One call on Python numbers: every argument's final value."""
        return self.call_fn(*values)

    def host(self, outs: tuple, batched: tuple | None, *arrays) -> list:
        """Run on host (numpy) arrays: one call (batched None) or one rvm.vmap batch
        (batched: 0 or None per argument); the results picked by `outs`, each in the dtype
        and shape of its argument (with the batch axis first)."""
        args = [to_rvm(a) for a in arrays]
        if batched is None:
            results = self.call_fn(*args)
        else:
            results = self.batch(args, batched, batch_size(arrays, batched))
        out = []
        for o in outs:
            a, r = arrays[o], results[o]
            if batched is None and a.ndim == 0 and a.dtype.kind == "f":
                out.append(np.asarray(r, dtype=a.dtype))        # (the common case, quickly)
                continue
            shape = a.shape if batched is None or batched[o] == 0 else \
                (batch_size(arrays, batched),) + a.shape
            out.append(from_rvm(r, a.dtype, shape, self, o, len(arrays)))
        return out


def batch_size(arrays, batched) -> int | None:
    if batched is None:
        return None
    return next(np.shape(a)[0] for a, ax in zip(arrays, batched) if ax == 0)


def to_rvm(a: np.ndarray):
    """A host array as rvm takes it: 0-d as a Python float or int, arrays as contiguous
    float64 or int64."""
    a = np.asarray(a)
    kind = a.dtype.kind
    if a.ndim == 0:
        return float(a) if kind == "f" else int(a)
    return np.ascontiguousarray(a, dtype=np.float64 if kind == "f" else np.int64)


def from_rvm(value, dtype, shape, fn: Fn, k: int, n: int) -> np.ndarray:
    out = np.asarray(value)
    if dtype.kind in "iu" and out.dtype != dtype and out.size:
        info = np.iinfo(dtype)
        if out.min() < info.min or out.max() > info.max:
            raise UsageError(f"{fn.who}({fn.name}): the final value of {fn.names(n)[k]} "
                             f"does not fit in "
                             f"{dtype.name} (pass a wider integer dtype; in JAX, enable "
                             "jax_enable_x64)")
    return out.astype(dtype, copy=False).reshape(shape)
