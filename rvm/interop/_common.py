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
from typing import ClassVar

import numpy as np

from ..core import isa
from ..core.errors import UsageError

PLANS = 512                 # plans kept per function (more shapes: made again)


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
        self._runners: dict = {}        # argument kinds -> the call (see runner)
        self._plans: dict = {}          # (outs, batched, kinds) -> its Plan
        self._heap: dict = {}           # kinds -> the heap fallback (or None), see fallback
        self._refused: dict = {}        # kinds -> why f has no adjoint program (or None)
        self._gradients: dict = {}      # kinds -> the gradient functions HeapDerivative made
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
            kind = kind_of(dtype)
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
            declared = _declared_arrays(self.fn, tuple(example))
            for k, (shape, dtype) in enumerate(kinds):
                is_float = kind_of(dtype) == "f"
                if len(shape) == 0 and is_float != (k in floats):
                    want = "a float" if k in floats else "an integer"
                    raise UsageError(f"{self.who}({self.name}): {names[k]} is {want} "
                                     f"parameter; got {np.dtype(dtype).name}")
                if len(shape) and not is_float and declared.get(k) == "float":
                    raise UsageError(f"{self.who}({self.name}): {names[k]} is an array of "
                                     f"floats; got {np.dtype(dtype).name} (convert it to a "
                                     "float dtype)")
        floats = tuple(k for k, (_, dtype) in enumerate(kinds) if kind_of(dtype) == "f")
        self._checked[kinds] = floats
        return floats

    def batch(self, args: list, axes: tuple, size: int) -> tuple:
        """The calls on rows of `args` (axis 0, or None: the same for every row) as
        rvm.vmap makes them: one native loop through the function's `batch` where it
        can, else a call per row; each result stacked along a new first axis."""
        call = None
        if size and self.kind is not None:
            first = [a[0] if ax is not None else a for a, ax in zip(args, axes)]
            call = self.fallback(tuple((np.shape(a), "f" if np.asarray(a).dtype.kind == "f"
                                        else "i") for a in first))
        batch = getattr(self.fn, "batch", None) if call is None else None
        call = call or self.call_fn
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
            rows.append(call(*[v.item() if isinstance(v, np.generic) else v
                                  for v in row]))
        if not rows:
            return tuple(np.empty((0,) + np.shape(a)[1 if ax is not None else 0:])
                         for a, ax in zip(args, axes))
        return tuple(np.stack([np.asarray(r[k]) for r in rows]) for k in range(len(args)))

    def runner(self, kinds: tuple):
        """The call of the function on arguments of these kinds (each a (shape, 'f' or
        'i') pair, as rvm takes them: Python floats and ints, float64 and int64 arrays),
        planned once: its program and entry found once, each call then straight to the
        machine (native code where it runs natively), which converts and checks the
        values as every call does (rvm.engines.arguments). Anything a plain call of the
        function does besides (functions as arguments, arrays packed with their
        derivatives, Janus stacks) keeps the plain call."""
        run = self._runners.get(kinds)
        if run is None:
            example = _example(kinds)
            if len(self._runners) >= PLANS:
                self._runners.clear()
            run = self._runners[kinds] = self.fallback(kinds) or \
                direct_call(self.fn, example, self.options) or self.call_fn
        return run

    def fallback(self, kinds: tuple):
        """For a derivative with an adjoint in it (adjoint(f), tangent(adjoint(f)),
        adjoint(adjoint(f)), adjoint(tangent(f))) of a function f that has no adjoint
        program (it uses the stack) or allocates heap arrays: the same function computed
        from gradient mode (HeapDerivative), called on arguments of these kinds ((shape,
        'f' or 'i') each); None where the derivative's own program runs (every other
        function, and f's third derivatives where f only allocates: its adjoint program
        holds every block until its clean-up, which runs the sweep three times, so
        gradient mode is faster where it serves: the graph-embedding Hessian 13.6
        against 26.0 ms). Third derivatives of a function on the stack are refused here,
        naming it."""
        if self.kind is None:
            return None
        if kinds in self._heap:
            return self._heap[kinds]
        root, path = self, []
        while root.base is not None:
            path.insert(0, root.kind)
            root = root.base
        out = None
        if "adjoint" in path and not hasattr(root.fn, "pack"):
            from ..ad.derivatives import arity
            example = _example(kinds)
            n = arity(root.fn, example)
            reason = root.heap_refusal(kinds[:n], example[:n])
            if reason == ALLOCATES and tuple(path) not in HeapDerivative.LAYOUTS:
                reason = None                   # (its own adjoint program, then)
            if reason is not None:
                if tuple(path) not in HeapDerivative.LAYOUTS:
                    from ..ad.transforms import TransformError
                    raise TransformError(
                        f"{self.fn.name}: {root.name} has no adjoint program ({reason}); "
                        f"the bridges take its reverse mode and second derivatives from "
                        "gradient mode (rvm.grad, and the gradient of its tangent program "
                        "as rvm.hvp takes it), which gives no third derivatives")
                out = HeapDerivative(root, tuple(path), kinds[:n], example[:n])
        if len(self._heap) >= PLANS:
            self._heap.clear()
        self._heap[kinds] = out
        return out

    def heap_refusal(self, kinds: tuple, example: tuple) -> str | None:
        """Why this (underived) function's derivatives with an adjoint in them come from
        gradient mode for arguments of these kinds: it has no adjoint program (it uses
        the stack: the reason), or it allocates heap arrays (ALLOCATES: see fallback);
        None when its adjoint program serves."""
        if kinds not in self._refused:
            from ..ad.derivatives import allocates, float_arguments
            from ..ad.transforms import TransformError
            try:
                if allocates(self.fn, example):     # (else its adjoint program serves)
                    shadows = tuple(np.zeros_like(example[i]) if isinstance(
                        example[i], np.ndarray) else 0.0
                        for i in float_arguments(self.fn, example))
                    self.adjoint.fn.specialize(example + shadows)
                    self._refused[kinds] = ALLOCATES
                else:
                    self._refused[kinds] = None
            except TransformError as e:
                heap = "do not use the stack" in str(e)
                self._refused[kinds] = str(e).split(";")[0] if heap else None
            except Exception:                   # (the call itself reports it)
                self._refused[kinds] = None
        return self._refused[kinds]

    def scalars(self, kinds: tuple, *values) -> tuple:
        """One call on Python numbers of these kinds (see runner): every argument's final
        value."""
        return self.runner(kinds)(*values)

    def plan(self, outs: tuple, batched: tuple | None, kinds: tuple) -> Plan:
        """The plan of host calls on arguments of these kinds ((shape, numpy dtype) per
        argument, the batch axis included), made once."""
        key = (outs, batched, kinds)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= PLANS:
                self._plans.clear()
            plan = self._plans[key] = Plan(self, outs, batched, kinds)
        return plan

    def host(self, plan: Plan, *arrays) -> list:
        """Run on host (numpy) arrays of the plan's kinds: one call (plan.batched None)
        or one rvm.vmap batch (plan.batched: 0 or None per argument); the results picked
        by plan.outs, each a numpy array in the dtype and shape of its argument (with
        the batch axis first)."""
        return plan(arrays)


class Plan:
    """A host call on arguments of fixed kinds, worked out once: how each argument is
    converted (0-d arrays to Python numbers, other dtypes to float64 or int64; float64
    and int64 arrays are passed as they are, without a copy), which rvm call runs them,
    and how each result is made an array of its argument's dtype and shape."""

    __slots__ = ("batched", "convert", "fn", "kinds", "make", "outs", "rvm_kinds", "size")

    def __init__(self, fn: Fn, outs: tuple, batched: tuple | None, kinds: tuple):
        self.fn, self.outs, self.batched, self.kinds = fn, outs, batched, kinds
        self.size = None if batched is None else next(
            shape[0] for (shape, _), ax in zip(kinds, batched) if ax == 0)
        self.convert = [_converter(shape, dtype) for shape, dtype in kinds]
        self.rvm_kinds = None if batched is not None else tuple(
            (shape, "f" if kind_of(dtype) == "f" else "i") for shape, dtype in kinds)
        if self.rvm_kinds is not None:
            fn.runner(self.rvm_kinds)               # (planned here: mistakes said now)
        self.make = []
        n = len(kinds)
        for o in outs:
            shape, dtype = kinds[o]
            if batched is not None and batched[o] is None:
                shape = (self.size,) + shape
            if dtype == np.float64 and not shape:
                self.make.append(_float64)
            elif kind_of(dtype) == "f":
                self.make.append(functools.partial(_floats, dtype=dtype, shape=shape))
            else:
                self.make.append(functools.partial(_ints, dtype=dtype, shape=shape,
                                                   fn=fn, k=o, n=n))

    def __call__(self, arrays) -> list:
        args = [c(a) for c, a in zip(self.convert, arrays)]
        if self.rvm_kinds is not None:
            results = self.fn.runner(self.rvm_kinds)(*args)
        else:
            results = self.fn.batch(args, self.batched, self.size)
        return [make(results[o]) for o, make in zip(self.outs, self.make)]


def direct_call(fn, example: tuple, options: dict):
    """fn's call on arguments of the kinds of `example` with its program found once:
    each call goes to the machine (which converts and checks the values exactly as a
    call of fn does, and runs native code directly once it has run natively), or None
    where a call of fn does more than that. A call that fails is made again as a call
    of fn, which reports the failure in fn's own terms."""
    from ..ad.derivatives import Transformed
    from ..engines.machine import machine_for
    from ..lang import ReversibleFunction
    if isinstance(fn, ReversibleFunction):
        program, name, names = fn.specialize(example)
        if names != list(program.functions[name].names):
            return None
    elif isinstance(fn, Transformed):
        if any(isinstance(a, np.ndarray) for a in example):
            return None                 # (arrays travel packed with their derivatives)
        program, name, _ = fn.specialize(example)
    else:                               # a loaded program's function (not a Janus one)
        program, name = getattr(fn, "program", None), getattr(fn, "name", None)
        if name not in getattr(program, "functions", {}) or \
                program.cache.get("janus") is not None:
            return None
    backward = bool(getattr(fn, "backward", False))
    general = functools.partial(fn, **options) if options else fn

    def call(*values):
        try:
            m = machine_for(program, **options)
            return (m.uncall if backward else m.call)(name, *values)
        except Exception:               # said exactly by the plain call
            return general(*values)
    return call


def _example(kinds: tuple) -> tuple:
    """Arguments of these kinds ((shape, 'f' or 'i') each): zeros."""
    return tuple((0.0 if k == "f" else 0) if not shape else
                 np.zeros(shape, np.float64 if k == "f" else np.int64) for shape, k in kinds)


# (heap_refusal: a function that allocates heap arrays, whose adjoint program is slower
# than gradient mode where gradient mode serves)
ALLOCATES = "it allocates heap arrays"


class HeapDerivative:
    """A derivative of f, for a function f without an adjoint program (it uses the
    stack), computed from gradient mode, which takes the whole heap. With J the
    Jacobian of f's final values in its float arguments and H_c the Hessian of
    <c, f(x)> (symmetric):

    - adjoint(f): (x, c) -> (x, J^T c), one rvm.grad pass per nonzero entry of c;
    - tangent(adjoint(f)): (x, c, xd, cd) -> (x, J^T c, xd, H_c xd + J^T cd);
    - adjoint(adjoint(f)): (x, s, xb, sb) -> (x, s, xb + H_s sb, J sb);
    - adjoint(tangent(f)): (x, xd, c, cd) -> (x, xd, J^T c + H_cd xd, J^T cd).

    The second-order ones take, per nonzero entry e of the cotangents, one gradient pass
    of f's tangent program along v (as rvm.hvp does for such functions) seeded on the
    tangent of the output entry e: its gradient in the values is H_e v, in the tangents
    the row J_e. The function runs on one row of arguments as rvm takes them."""

    # the derivatives (innermost first) and the groups of k (float count) extra arguments
    LAYOUTS: ClassVar[dict] = {("adjoint",): 1, ("adjoint", "tangent"): 3,
                               ("adjoint", "adjoint"): 3, ("tangent", "adjoint"): 3}

    def __init__(self, root: Fn, path: tuple, kinds: tuple, example: tuple):
        from ..ad.derivatives import float_arguments
        self.root, self.path, self.n = root, path, len(example)
        self.floats = float_arguments(root.fn, example)
        self.scalars = [i for i in self.floats if not isinstance(example[i], np.ndarray)]
        # (kind, loss) -> rvm.grad of f or of its tangent program, shared by f's derivatives
        self._grads: dict = root._gradients.setdefault(kinds, {})

    def __call__(self, *args) -> tuple:
        n, k = self.n, len(self.floats)
        x, rest = list(args[:n]), list(args[n:])
        if len(rest) != k * self.LAYOUTS[self.path]:
            raise UsageError(f"{self.root.who}({self.root.name}): {len(args)} arguments for "
                             f"{'('.join(reversed(self.path))}({self.root.name}"
                             f"{')' * len(self.path)}")
        groups = [rest[g * k:(g + 1) * k] for g in range(self.LAYOUTS[self.path])]
        same = [np.array(a) if isinstance(a, np.ndarray) else a for a in x]
        if self.path == ("adjoint",):
            c, = groups
            jt = self._zeros(x)
            for j, e, w in _entries(c):
                g = self._grad((self.floats[j], e))(*x)
                for m, i in enumerate(self.floats):
                    jt[m] = jt[m] + w * g[i]
            return tuple(same) + tuple(jt)
        if self.path == ("adjoint", "adjoint"):
            s, xb, sb = groups
            hs = self._second(x, sb, s, None)[0]
            jsb = list(self.root.tangent.call_fn(*x, *sb)[n:])
            return tuple(same) + _copies(s) + tuple(b + h for b, h in zip(xb, hs)) + \
                tuple(jsb)
        if self.path == ("adjoint", "tangent"):
            c, xd, cd = groups
            hc, jc, jcd = self._second(x, xd, c, cd)
            return tuple(same) + tuple(jc) + _copies(xd) + tuple(h + j for h, j in
                                                                  zip(hc, jcd))
        xd, c, cd = groups                  # adjoint(tangent(f))
        hcd, jcd, jc = self._second(x, xd, cd, c)
        return tuple(same) + _copies(xd) + tuple(j + h for j, h in zip(jc, hcd)) + \
            tuple(jcd)

    def _zeros(self, x) -> list:
        return [np.zeros_like(x[i], dtype=np.float64) if isinstance(x[i], np.ndarray)
                else 0.0 for i in self.floats]

    def _grad(self, loss):
        """rvm.grad of f (loss: (argument, element or None)), made once."""
        g = self._grads.get(("f", loss))
        if g is None:
            from ..ad.gradient import grad
            i, e = loss
            g = self._grads["f", loss] = grad(self.root.fn, loss=i if e is None else loss,
                                              **self.root.options)
        return g

    def _second(self, x, v, a, b) -> tuple[list, list, list]:
        """(H_a v, J^T a, J^T b) for cotangents a and b (b: None, nothing) of f's float
        arguments: one gradient pass of f's tangent program along v per entry where a
        or b is nonzero."""
        from ..ad.derivatives import pack_tangents, tangent
        from ..ad.gradient import grad
        n, floats = self.n, self.floats
        h, ja, jb = self._zeros(x), self._zeros(x), self._zeros(x)
        weights: dict = {}
        for j, e, w in _entries(a):
            weights[j, e] = [w, 0.0]
        for j, e, w in _entries(b or []):
            weights.setdefault((j, e), [0.0, 0.0])[1] = w
        if not weights:
            return h, ja, jb
        packed = pack_tangents(x, floats, v)
        for (j, e), (wa, wb) in weights.items():
            i = floats[j]
            loss = n + self.scalars.index(i) if e is None else (i, 2 * e + 1)
            g = self._grads.get(("tangent", loss))
            if g is None:
                program, name, _ = tangent(self.root.fn).specialize(tuple(x) + tuple(v))
                g = self._grads["tangent", loss] = grad(program[name], loss=loss,
                                                        **self.root.options)
            grads = g(*packed)
            for m, i2 in enumerate(floats):
                if isinstance(x[i2], np.ndarray):
                    hv, row = grads[i2][..., 0::2], grads[i2][..., 1::2]
                else:
                    hv, row = grads[i2], grads[n + self.scalars.index(i2)]
                if wa:
                    h[m] = h[m] + wa * hv
                    ja[m] = ja[m] + wa * row
                if wb:
                    jb[m] = jb[m] + wb * row
        return h, ja, jb


def _entries(cotangents):
    """(position, element or None, value) of each nonzero entry of the cotangents (one
    per float argument: a number, or an array whose elements are named by flat index)."""
    for j, c in enumerate(cotangents):
        if isinstance(c, np.ndarray):
            flat = c.ravel()
            for e in np.flatnonzero(flat):
                yield j, int(e), float(flat[e])
        elif c:
            yield j, None, float(c)


def _copies(values) -> tuple:
    return tuple(np.array(v) if isinstance(v, np.ndarray) else v for v in values)


def kind_of(dtype) -> str:
    """A dtype's numpy kind, the types of ml_dtypes (JAX's bfloat16 and float8 types, its
    int4; numpy kind 'V') told as floats or integers."""
    dtype = np.dtype(dtype)
    kind = dtype.kind
    if kind == "V" and dtype.names is None and dtype.subdtype is None:
        name = dtype.name
        if name.startswith(("bfloat", "float")):
            return "f"
        if name.startswith(("int", "uint")):
            return "u" if name.startswith("u") else "i"
    return kind


def _declared_arrays(fn, example: tuple) -> dict:
    """Argument index -> "float" or "int" for each array argument whose element type the
    function's source declares (rvm.Array[float], an assembly array's debug type); for a
    transformed function, none."""
    from ..ad.derivatives import Transformed, program_of
    from ..engines.arguments import declared_class
    if isinstance(fn, Transformed):
        return {}
    try:
        prog_fn = program_of(fn, example)
    except Exception:                       # (the call reports it)
        return {}
    out, k = {}, 0
    for i, a in enumerate(example):
        if isinstance(a, np.ndarray):
            cls = declared_class(prog_fn, prog_fn.params[k:k + 1 + a.ndim])
            if cls:
                out[i] = "float" if cls == isa.FLOAT else "int"
            k += 1 + a.ndim
        else:
            k += 1
    return out


def _converter(shape: tuple, dtype: np.dtype):
    """A host array of this shape and dtype as rvm takes it: 0-d as a Python float or
    int, arrays as float64 or int64 (the same array when it is one already)."""
    if not shape:
        return float if kind_of(dtype) == "f" else int
    want = np.float64 if kind_of(dtype) == "f" else np.int64
    if dtype == want:
        return _same
    return functools.partial(np.asarray, dtype=want)


def _same(a):
    return a


def _float64(r):
    return np.asarray(float(r))          # (float: never more than the one value)


def _floats(r, dtype, shape):
    out = np.asarray(r, dtype)
    return out if out.shape == shape else out.reshape(shape)


def _ints(r, dtype, shape, fn, k, n):
    return from_rvm(r, dtype, shape, fn, k, n)


def from_rvm(value, dtype, shape, fn: Fn, k: int, n: int) -> np.ndarray:
    out = np.asarray(value)
    if kind_of(dtype) in "iu" and out.dtype != dtype and out.size:
        info = np.iinfo(dtype)
        if out.min() < info.min or out.max() > info.max:
            raise UsageError(f"{fn.who}({fn.name}): the final value of {fn.names(n)[k]} "
                             f"does not fit in "
                             f"{dtype.name} (pass a wider integer dtype; in JAX, enable "
                             "jax_enable_x64)")
    return out.astype(dtype, copy=False).reshape(shape)
