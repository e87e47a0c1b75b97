"""The Python API: load or assemble programs, call and uncall their functions.

`Program` is data (rvm.core); this module attaches the conveniences that run it
(`prog.call`, `prog.uncall`, `prog["name"]`), so the core never imports an engine."""

from __future__ import annotations

import functools
import os

import attrs
import numpy as np

from .ad.derivatives import Transformed, adjoint, float_arguments, tangent
from .ad.gradient import parameter_names, positional
from .core.errors import RvmError, UsageError, user_facing
from .core.program import Program
from .engines.arguments import with_options
from .engines.machine import machine_for, resolve_engine
from .formats.assembly import assemble
from .formats.bytecode import dumps, loads
from .lang import ReversibleFunction, compile_file, janus


@user_facing
def load(path: str | os.PathLike, engine: str | None = None) -> Program:
    """Load a program from assembly (.rasm), bytecode (.rvmb), a Python file of
    @rvm.reversible functions (.py, compiled without running it) or a Janus program
    (.ja or .janus, one function per procedure); verified on load.
    `engine` ('interp', 'python'; None = fastest) is the default for its calls."""
    program = _load(os.fspath(path))
    if engine is not None:
        program = attrs.evolve(program, engine=resolve_engine(engine))
    return program


def _load(path: str) -> Program:
    try:
        if path.endswith(".py"):
            return compile_file(path, {"adjoint": adjoint, "tangent": tangent})
        if path.endswith((".ja", ".janus")):
            return janus.compile_janus(path)
        if path.endswith(".rvmb"):
            with open(path, "rb") as f:
                return loads(f.read(), path)
        with open(path, encoding="utf-8") as f:
            return assemble(f.read(), path)
    except OSError as e:
        raise RvmError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RvmError(f"{path}: not a UTF-8 text file (bytecode files end in .rvmb)") from None


def save(program: Program, path: str | os.PathLike) -> None:
    """Write a program as .rvmb bytecode."""
    try:
        with open(path, "wb") as f:
            f.write(dumps(program))
    except OSError as e:
        raise RvmError(f"{os.fspath(path)}: cannot write: {e.strerror or e}") from None


@attrs.frozen
class FunctionHandle:
    """One function of a loaded program: `prog["fib"]`. Callable forwards; `~h` is its
    inverse."""

    program: Program
    name: str
    backward: bool = False

    @property
    def function(self):
        return self.program.functions[self.name]

    def __call__(self, *args, **options):
        """Run on the arguments (positional, or by parameter name: the source's names, or
        the registers'); the other keywords are machine options, as for prog.call."""
        if options:     # (nothing to sort out on a plain call)
            args, options = with_options(parameter_names(self) or [], args, options,
                                         self.name)
        run = self.program.uncall if self.backward else self.program.call
        return run(self.name, *args, **options)

    def __invert__(self) -> FunctionHandle:
        return attrs.evolve(self, backward=not self.backward)

    def batch(self, columns: list, **options) -> tuple | None:
        """rvm.vmap's fast path: calls on rows of scalar arguments in one native loop, or
        None (the caller loops over the rows)."""
        if self.program.cache.get("janus") is not None:     # stacks convert per call
            return None
        return machine_for(self.program, **options).batch(self.name, columns, self.backward)


def _getitem(self: Program, name: str) -> FunctionHandle:
    if name not in self.functions:
        raise KeyError(f"no function {name!r} in the program "
                       f"(it has: {', '.join(self.functions) or 'none'})")
    return FunctionHandle(self, name)


@user_facing
def _call(self: Program, name: str, *args, **options):
    """Run `name` forwards on the arguments; return the parameters' final values.
    Options (engine, checks, max_steps, heap_limit, tol) go to the machine."""
    return _run(self, name, args, options, False)


@user_facing
def _uncall(self: Program, name: str, *args, **options):
    """Run `name` backwards on the arguments; return the parameters' final values."""
    return _run(self, name, args, options, True)


def _run(program: Program, name: str, args: tuple, options: dict, backward: bool):
    """A call or uncall; of a Janus procedure, run again with other stacks where they are
    full or do not fit (janus.growing), its stacks given and returned as lists."""
    if "janus" not in program.cache:
        m = machine_for(program, **options)
        return (m.uncall if backward else m.call)(name, *args)

    def run(p, out):
        m = machine_for(p, **options)
        saved, m.out = m.out, out
        try:
            go = m.uncall if backward else m.call
            return go(name, *janus.to_machine(p, name, args))
        finally:
            m.out = saved
    info = program.cache["janus"]
    # (later calls start with the stacks the last one grew to)
    info["latest"], results = janus.growing(info.get("latest", program), run)
    return janus.from_machine(info["latest"], name, results)


Program.__getitem__, Program.call, Program.uncall = _getitem, _call, _uncall

__all__ = ["FunctionHandle", "assemble", "dumps", "load", "loads", "save", "vmap"]


def vmap(fn, in_axes=0, out_axes=0, backend: str | None = None):
    """Batch a function over rows: `vmap(f)(xs, ys)` calls f(xs[i], ys[i]) for every i and
    stacks each output. `fn` is a function of a loaded program, a reversible function, or
    a gradient function (rvm.grad / value_and_grad / jacobian of one). `in_axes` is 0 (every
    argument batched along its first axis) or a sequence with 0 or None (None: the same
    value for every row). The machine and its compiled code are reused from row to row, so
    per-call set-up is paid once. An empty batch gives an empty array per output
    (shaped and typed as a batch of rows would give it).

    backend="dask": the batched arguments may be dask arrays (numpy arrays are split into
    chunks); each chunk is one batch on a dask worker (a compiled batch where the function
    allows), and the results are dask arrays, computed when you ask (`.compute()`), on
    whatever scheduler or cluster is active. Needs the dask extra."""
    if backend not in (None, "dask"):
        raise UsageError(f"unknown backend {backend!r}; choose None or 'dask'")

    if not (_is_zero(out_axes) or (isinstance(out_axes, (list, tuple)) and
                                   all(_is_zero(a) for a in out_axes))):
        raise UsageError(f"out_axes must be 0 (results are stacked along a new first axis), "
                         f"got {out_axes!r}")
    if not (in_axes is None or _is_zero(in_axes) or (
            isinstance(in_axes, (list, tuple)) and
            all(a is None or _is_zero(a) for a in in_axes))):
        raise UsageError(f"in_axes must be 0, None, or a list of 0 and None (one per "
                         f"argument; rvm batches along the first axis only), got {in_axes!r}")

    def run(*args, **kwargs):
        args = positional(fn, args, kwargs, _parameter_names)   # (by name, as a call)
        axes = [in_axes] * len(args) if not isinstance(in_axes, (list, tuple)) \
            else list(in_axes)
        if backend == "dask":
            return _dask_map(fn, args, axes)
        n = _batch_length(fn, args, axes)
        if n == 0:                    # nothing to call: empty outputs, typed as rows' are
            return _empty_batch(fn, args, axes, np.empty)
        batch, options = getattr(fn, "batch", None), {}
        if isinstance(fn, functools.partial) and not fn.args and \
                isinstance(fn.func, (FunctionHandle, ReversibleFunction, Transformed)):
            batch, options = fn.func.batch, fn.keywords      # machine options, as in a call
        if batch is not None and all(np.ndim(a) == (1 if ax is not None else 0)
                                     for a, ax in zip(args, axes)):
            columns = [np.asarray(a) if ax is not None else np.broadcast_to(a, (n,))
                       for a, ax in zip(args, axes)]   # (a view: no copies)
            done = batch(columns, **options)    # one native call for the whole batch, if it can
            if done is not None:
                return done
        rows = []
        for i in range(n):
            row = [a[i] if ax == 0 else a for a, ax in zip(args, axes)]
            row = [v.item() if isinstance(v, np.generic) else v for v in row]
            rows.append(fn(*row))
        return _stack(rows)

    return run


def _dask_map(fn, args: tuple, axes: list):
    """vmap over chunks of dask arrays: one delayed batch per chunk, results assembled as
    dask arrays (None stays None)."""
    import operator

    import dask
    import dask.array as da
    n = _batch_length(fn, args, axes)
    if n == 0:                      # nothing to compute: empty outputs, typed as rows' are
        return _empty_batch(fn, args, axes, lambda shape, dtype: da.from_array(
            np.empty(shape, dtype)))
    batched = [k for k, ax in enumerate(axes) if ax is not None]
    arrays = {k: args[k] if isinstance(args[k], da.Array) else da.from_array(
        np.asarray(args[k]), chunks=max(1, len(args[k]) // 4)) for k in batched}
    chunks = arrays[batched[0]].chunks[0]
    arrays = {k: a.rechunk({0: chunks}) for k, a in arrays.items()}
    # the shape of the results, from one row computed here
    row = [a if k not in arrays else np.asarray(arrays[k][0])
           for k, a in enumerate(args)]
    row = [r.item() if isinstance(r, np.ndarray) and r.ndim == 0 else r for r in row]
    sample = fn(*row)
    tasks = []
    for i, n in enumerate(chunks):
        parts = [arrays[k].blocks[i] if k in arrays else a for k, a in enumerate(args)]
        tasks.append((dask.delayed(_batch)(fn, axes, *parts), n))
    single = not isinstance(sample, tuple)
    out = []
    for k, v in enumerate([sample] if single else sample):
        if v is None:
            out.append(None)
            continue
        v = np.asarray(v)
        pick = (lambda t: t) if single else (lambda t, k=k: dask.delayed(operator.getitem)(t, k))
        out.append(da.concatenate([da.from_delayed(pick(t), shape=(n, *v.shape),
                                                   dtype=v.dtype) for t, n in tasks]))
    return out[0] if single else tuple(out)


def _batch_length(fn, args: tuple, axes: list) -> int:
    """The number of rows, after checking that every batched argument is an array of rows
    (not a scalar) and all have as many; a mistake names the argument."""
    if len(axes) != len(args):
        raise UsageError(f"in_axes has {len(axes)} entries for {len(args)} arguments")

    def which(k: int) -> str:         # (names looked up only for a message)
        names = _parameter_names(fn)
        return f"argument {k}" + (f" ({names[k]})" if names and k < len(names) else "")
    batched = [k for k, ax in enumerate(axes) if ax is not None]
    if not batched:
        raise UsageError("vmap needs at least one batched argument (in_axes 0)")
    for k in batched:
        if np.ndim(args[k]) == 0:
            raise UsageError(f"{which(k)} is batched (in_axes 0) but is a scalar; give it "
                             "in_axes None or pass an array of rows")
    lengths = [(k, np.shape(args[k])[0] if hasattr(args[k], "shape") else len(args[k]))
               for k in batched]
    known = [(k, n) for k, n in lengths if n == n]   # (nan: a dask array's, until computed)
    for k, n in known[1:]:
        if n != known[0][1]:
            raise UsageError(f"batched arguments must have the same length: {which(k)} has "
                             f"{n} rows, {which(known[0][0])} has {known[0][1]}")
    return lengths[0][1]


def _parameter_names(fn) -> list[str] | None:
    """The names of fn's parameters, where it has them (a program's function, a
    reversible function, a gradient function of one, with machine options bound)."""
    while True:
        if isinstance(fn, functools.partial) and not fn.args:
            fn = fn.func
        elif getattr(fn, "differentiated", None) is not None:
            fn = fn.differentiated
        else:
            return parameter_names(fn)


def _empty_batch(fn, args: tuple, axes: list, empty):
    """An empty batch's outputs: each an empty array (`empty(shape, dtype)`) shaped and
    typed as a batch of rows would give it, None where rows give None. The shapes come
    from one call on a row of ones (of zeros if that fails) of the batched arguments'
    dtype and row shape."""
    error = None
    for fill in (1, 0):
        row = []
        for a, ax in zip(args, axes):
            if ax is not None:
                dtype = a.dtype if hasattr(a, "dtype") else np.asarray(a).dtype
                a = np.full(np.shape(a)[1:], fill, dtype)
                a = a.item() if a.ndim == 0 else a
            row.append(a.item() if isinstance(a, np.generic) else a)
        try:
            sample = fn(*row)
        except Exception as e:        # reported below if the other fill fails too
            error = error or e
            continue

        def like(v):
            if isinstance(v, tuple):
                return tuple(like(x) for x in v)
            if v is None:
                return None
            v = np.asarray(v)
            return empty((0, *v.shape), v.dtype)
        return like(sample)
    raise UsageError(f"an empty batch: the shapes of its outputs come from a call on a row "
                     f"of ones (and of zeros), which failed: {error}") from None


def _batch(fn, axes, *args):
    """One chunk on a worker: an ordinary (compiled where it can be) batch."""
    return vmap(fn, in_axes=axes)(*args)


@user_facing
def draw(fn, *args, view: str = "circuit", depth: int = 0, inverse: bool = False,
         collapse: int = 0):
    """A picture of a function: `view="circuit"` (wires and gates) or `"cfg"` (basic
    blocks and paired branch/comefrom edges). `fn` is prog["name"], a reversible function
    (compiled from its annotations, or for `args`), or a transformed one (for `args`).
    `depth` expands calls, `inverse` draws the inverse, `collapse=N` draws runs of more
    than N straight-line instructions as one box.
    The result renders inline in Jupyter; `.save("f.svg")` writes it."""
    from .ad.gradient import target, with_inverse
    from .drawing import draw as picture
    if hasattr(fn, "compile") and not args and not getattr(fn, "backward", False):
        program = fn.compile()
        name = next(iter(program.functions))
    elif isinstance(fn, Transformed):   # (target refuses its arrays: that is for grad)
        program, name, _ = fn.specialize(args or _stand_ins(fn, fn))
        if fn.backward:
            program, name = with_inverse(program, name)
    else:
        program, name, _ = target(fn, args or _stand_ins(fn, fn))
    return picture(program, name, view, depth, inverse, collapse)


def _stand_ins(fn, drawn) -> tuple:
    """Zeros of the kinds a function takes, for drawing it without arguments (the program
    depends on their kinds only): from the annotations of the reversible function a
    transformed one derives from, or a loaded function's parameters; then a zero tangent
    or shadow per float argument for each transform."""
    if isinstance(fn, Transformed):
        inner = _stand_ins(fn.inner, drawn)
        floats = float_arguments(fn.inner, inner)
        return inner + tuple(inner[i] * 0 for i in floats)
    if isinstance(fn, ReversibleFunction):
        kinds = fn.annotations()
        params = [a.arg for a in fn.node.args.args]
        missing = [p for p, k in zip(params, kinds) if k is None]
        if missing:
            raise UsageError(f"rvm.draw({getattr(drawn, 'name', fn.name)}) without arguments "
                             f"needs {fn.name}'s parameters annotated: annotate "
                             f"{', '.join(missing)} (float, int, Array[float], ...) or pass "
                             "arguments, rvm.draw(f, 1.0, 2)")
        dtypes = {"f": float, "c": complex}
        return tuple(np.zeros((1,) * k[2], dtypes.get(k[1], np.int64)) if k[0] == "array"
                     else {"float": 0.0, "int": 0, "complex": 0j}[k[0]] for k in kinds)
    program, name = getattr(fn, "program", None), getattr(fn, "name", None)
    if program is None or name not in getattr(program, "functions", {}):
        return ()                      # (target says what it takes)
    return tuple(0.0 if p.cls == "f" else 0 for p in program.functions[name].params)


def _is_zero(axis) -> bool:
    return isinstance(axis, int) and not isinstance(axis, bool) and axis == 0


def _stack(rows):
    import numpy as np
    first = rows[0]
    if isinstance(first, tuple):
        return tuple(_stack([r[k] for r in rows]) for k in range(len(first)))
    if first is None:
        return None
    return np.stack([np.asarray(r) for r in rows])
