"""Derivatives as functions: `rvm.tangent(f)` and `rvm.adjoint(f)` are reversible functions
like f (callable, invertible with `~`, differentiable again), and `jvp`, `hvp`, `hessian`
are built on them. The programs come from rvm.ad.transforms.

Arrays: the tangent program of a function with array arguments works on the interleaved
heap (each cell followed by its tangent); calls pack each array with its tangent along the
last axis and unpack the results, so users pass and get arrays of f's shapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from ..core import isa
from ..core.errors import InvertibilityError, MachineError, UsageError, user_facing
from ..core.program import Function, Program
from ..engines.arguments import (
    call_kind,
    convert,
    declared_float_arrays,
    first_row,
    place_keywords,
    plural,
)
from ..engines.machine import PerThread, machine_for
from . import transforms
from .gradient import loss_index, parameter_names, positional, target, with_inverse

KINDS = {"tangent": (transforms.tangent, "dot"), "adjoint": (transforms.adjoint, "bar")}


def program_of(fn, args):
    program, name, _ = target(fn, tuple(args))
    return program.functions[name]


def arity(fn, args) -> int:
    """How many of `args` are f's own arguments (the rest: tangents or shadows)."""
    if isinstance(fn, Transformed):
        n = arity(fn.inner, args)
        return n + len(float_arguments(fn.inner, args[:n]))
    node = getattr(fn, "node", None)
    if node is not None:
        return len(node.args.args)
    program, name = getattr(fn, "program", None), getattr(fn, "name", None)
    if program is None or name not in getattr(program, "functions", {}):
        raise TypeError(f"expected a reversible function or prog['name'], got {fn!r}")
    if program.functions[name].names:          # one name per argument
        return len(program.functions[name].names)
    params, k, count = program.functions[name].params, 0, 0
    for a in args:                   # an array fills 1 + ndim parameters
        if k >= len(params):
            break
        k += 1 + (a.ndim if isinstance(a, np.ndarray) else 0)
        count += 1
    return count if args else len(params)


def derived_names(fn: Function, suffix: str) -> tuple:
    """The argument names of fn's tangent (suffix "dot") or adjoint ("bar") program: fn's
    own, then `x_dot` / `x_bar` for each float scalar argument x (a complex one: one name
    for its two registers), as the transforms name their debug symbols; () when fn's
    arguments have no source names (assembly) or they do not match its registers."""
    if not fn.names:
        return ()
    params, k, extra = fn.params, 0, []
    for name in fn.names:
        if k >= len(params):
            return ()
        s = next((s for s in fn.symbols if s.regs and s.regs[0] == params[k] and
                  s.name in (name, f"{name}.real")), None)
        width = 2 if s is not None and s.name.endswith(".real") else \
            len(s.regs) if s is not None else 1
        if width <= 2 and all(p.cls == isa.FLOAT for p in params[k:k + width]):
            extra.append(f"{name}_{suffix}")
        k += width
    return tuple(fn.names) + tuple(extra) if k == len(params) else ()


def named(derived: Program, entry: str, primal: Function, kind: str) -> Program:
    """The tangent or adjoint program `derived` of `primal` with its entry's arguments
    named after primal's (derived_names), so that its messages, results and debugger
    speak the source's names. Unchanged when they are unknown."""
    return _with_names(derived, entry, derived_names(primal, KINDS[kind][1]))


def _with_names(program: Program, entry: str, names) -> Program:
    """The program with its entry's arguments named so (unchanged where names is empty)."""
    fn = program.functions[entry]
    if not names or fn.names == tuple(names):
        return program
    kept = {k: v for k, v in program.cache.items() if isinstance(k, str)}
    return Program({**program.functions, entry: attrs.evolve(fn, names=tuple(names))},
                   program.source, kept, program.engine)


def as_bound(f, args) -> tuple:
    """f's arguments as a call binds them (rvm.engines.arguments): lists as arrays, numpy
    scalars as scalars, and an integer array where f declares floats as a float array."""
    name = getattr(f, "name", "f")
    args = tuple(convert(a, n, name) for n, a in enumerate(args))
    if isinstance(f, Transformed) or not any(
            isinstance(a, np.ndarray) and a.dtype.kind in "iu" for a in args):
        return args
    return declared_float_arrays(program_of(f, args), args)


def float_arguments(fn, args) -> list[int]:
    """Indices of the float arguments (float scalars and float arrays) among args. Of a
    derivative: its function's, then every tangent or shadow (each is a float)."""
    if isinstance(fn, Transformed):
        n = arity(fn.inner, args)
        return float_arguments(fn.inner, args[:n]) + list(range(n, len(args)))
    return _param_floats(program_of(fn, args).params, args)


def _param_floats(params, args) -> list[int]:
    """Indices of the float arguments among args (a program's arguments, arrays as
    arrays), the scalars' told by the parameters they fill."""
    k, out = 0, []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            if a.dtype.kind == "c":
                raise UsageError(f"argument {i} is a complex array; the derivative "
                                 "transforms take real arrays and complex scalars (rvm.grad "
                                 "takes complex arrays)")
            if a.dtype.kind == "f":
                out.append(i)
            k += 1 + a.ndim
        elif isinstance(a, complex):        # two float parameters, one complex tangent
            out.append(i)
            k += 2
        else:
            if k < len(params) and params[k].cls == isa.FLOAT:
                out.append(i)
            k += 1
    return out


def _base_signature(f) -> tuple[list[str], list[bool] | None] | None:
    """(argument names, which are float) of a function, as Transformed.signature."""
    if isinstance(f, Transformed):
        return f.signature()
    node = getattr(f, "node", None)
    if node is not None:
        names = [a.arg for a in node.args.args]
        try:
            anns = f.annotations()
        except Exception:                  # said when it is compiled
            return names, None
        if any(a is None for a in anns):
            return names, None
        return names, [a[0] in ("float", "complex") or (a[0] == "array" and a[1] != isa.INT)
                       for a in anns]
    program, name = getattr(f, "program", None), getattr(f, "name", None)
    fn = getattr(program, "functions", {}).get(name)
    if fn is None or not fn.names:
        return None
    flags, k = [], 0
    for x in fn.names:
        s = next((s for s in fn.symbols if s.regs and k < len(fn.params) and
                  s.regs[0] == fn.params[k] and s.name in (x, f"{x}.real")), None)
        if s is None:
            return None
        if s.name.endswith(".real"):
            flags.append(True)
            k += 2
        else:
            flags.append((len(s.regs) == 1 and fn.params[k].cls == isa.FLOAT) or
                         (len(s.regs) > 1 and s.dtype not in ("", isa.INT)))
            k += len(s.regs)
    return (list(fn.names), flags) if k == len(fn.params) else None


def _registers(fn: Function, args) -> list[str]:
    """Each argument's registers (`f0`, `r0:r1` for an array), as results are named."""
    out, k = [], 0
    for a in args:
        width = 1 + a.ndim if isinstance(a, np.ndarray) else 2 if isinstance(a, complex) \
            else 1
        out.append(":".join(map(str, fn.params[k:k + width])) or "?")
        k += width
    return out


def _converted(args) -> bool:
    """Would a call convert some of these arguments (a list, an integer array), so that
    a derivative must bind them first (Transformed.bound)?"""
    return any(isinstance(a, list | tuple) or (isinstance(a, np.ndarray) and
                                                a.dtype.kind in "iu") for a in args)


def scalar_tangents(inner, floats: list[int], extra, strict: bool = True) -> list:
    """The tangents (or shadows) `extra` of f's float arguments, each of a scalar a number
    of its kind (a 0-d array: its number), refused with a UsageError otherwise (not
    strict: only a complex one of a real argument; the call's binding names the others)."""
    out = []
    for i, t in zip(floats, extra):
        if isinstance(t, np.ndarray) and t.ndim == 0:
            t = t.item()
        if not isinstance(inner[i], np.ndarray) and (strict or (
                isinstance(t, complex | np.complexfloating) and
                not isinstance(inner[i], complex))):
            complex_ = isinstance(inner[i], complex)
            kinds = (int, float, complex, np.number) if complex_ else \
                (int, float, np.integer, np.floating)
            if not isinstance(t, kinds) or isinstance(t, bool):
                raise UsageError(f"the tangent (or shadow) of argument {i} must be "
                                 f"{'a number' if complex_ else 'a real number'}, as the "
                                 f"argument is; got {t!r}")
        out.append(t)
    return out


def pack_tangents(inner, floats: list[int], extra) -> list:
    """f's arguments `inner` with one tangent (or shadow) per float argument in `extra`,
    as its derivative program takes them: arrays interleaved with theirs, then the
    scalars' ones."""
    tangent = dict(zip(floats, scalar_tangents(inner, floats, extra)))
    packed = [_interleave(a, tangent.get(i)) if isinstance(a, np.ndarray) else a
              for i, a in enumerate(inner)]
    return packed + [tangent[i] for i in floats if not isinstance(inner[i], np.ndarray)]


def _nested_error(fn, message: str) -> transforms.TransformError:
    """A derivative of a derivative the transforms refuse, told with its name
    (`tangent(adjoint(f))`) before the reason (`told`: the reason alone)."""
    if ".adj" in message and "PUSH" in message:      # an adjoint's own sweep
        message += (" (that is the sweep of an adjoint program, which keeps the shadows "
                    "it would drop on the stack: it has no adjoint program, so "
                    "derivatives that need one, third derivatives in reverse mode among "
                    "them, are not available)")
    out = transforms.TransformError(f"{'~' if fn.backward else ''}{fn.name}: {message}")
    out.told = message
    return out


def _packed(fn, args) -> list:
    """fn's arguments as its program takes them (a derivative's: packed)."""
    return fn.pack(list(args)) if isinstance(fn, Transformed) else list(args)


def _inner_target(fn, args) -> tuple:
    """(program, entry, parameter names) of fn for these arguments, as `target`, also
    for a derivative of arrays (whose program takes them packed)."""
    if not isinstance(fn, Transformed):
        return target(fn, tuple(args))
    program, name, names = fn.specialize(tuple(args))
    if fn.backward:
        program, name = with_inverse(program, name)
    return program, name, names


def _tangents(args, floats: list[int], extra) -> list:
    """A tangent (or shadow) for every one of args, of its kind: `extra` for the float
    ones, zeros for the others (so that they pack as the arguments do)."""
    given = dict(zip(floats, extra))
    out = []
    for k, a in enumerate(args):
        if k not in given:
            out.append(np.zeros_like(a) if isinstance(a, np.ndarray) else 0)
        elif isinstance(a, np.ndarray):
            t = np.asarray(given[k], dtype=a.dtype)
            if t.shape != a.shape:
                raise UsageError(f"a tangent of shape {t.shape} for an array of shape "
                                 f"{a.shape}")
            out.append(t)
        else:
            t = given[k]
            out.append(complex(t) if isinstance(a, complex) or isinstance(t, complex)
                       else float(t))
    return out


def _user_labels(fn, n: int) -> list[str]:
    sig = _base_signature(fn)
    return list(sig[0]) if sig is not None and len(sig[0]) == n else \
        [f"argument {k}" for k in range(n)]


def _interleave(a: np.ndarray, t) -> np.ndarray:
    out = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), dtype=a.dtype)
    out[..., 0::2] = a
    if t is not None:
        t = np.asarray(t, dtype=a.dtype)
        if t.shape != a.shape:
            raise UsageError(f"a tangent of shape {t.shape} for an array of shape {a.shape}")
        out[..., 1::2] = t
    return out


class Transformed:
    """A derivative of a function, as a reversible function of its own: `rvm.tangent(f)`
    takes f's arguments then one tangent per float argument; `rvm.adjoint(f)` f's
    arguments then one shadow (cotangent) per float argument. Calling it returns every
    argument's final value; `~t` is its inverse; it can be transformed again."""

    def __init__(self, kind: str, inner, backward: bool = False, engine: str | None = None,
                 **options):
        if kind not in KINDS:
            raise UsageError(f"unknown transform {kind!r}")
        if not isinstance(inner, Transformed):
            arity(inner, ())        # fail early on something that is not a function
        from .gradient import check_options
        check_options(options)
        self.kind, self.inner, self.backward, self.engine = kind, inner, backward, engine
        self.options = options      # machine options for every call (max_steps, ...)
        self.name = f"{kind}({getattr(inner, 'name', '?')})"

    def _arrays(self, inner_args) -> dict:
        """Base parameter index -> rank, for each array argument."""
        arrays, k = {}, 0
        for a in inner_args:
            if isinstance(a, np.ndarray):
                arrays[k] = a.ndim
                k += 1 + a.ndim
            else:
                k += 1
        return arrays

    def signature(self) -> tuple[list[str], list[bool] | None] | None:
        """(names, which are float) of this derivative's arguments as a call takes them:
        the function's, then one tangent or shadow per float argument (`x_dot`, `x_bar`;
        an array's too), known before any call from the annotations or the debug names;
        the flags are None where the annotations are incomplete, None for assembly."""
        inner = _base_signature(self.inner)
        if inner is None or inner[1] is None:
            return inner
        names, flags = inner
        extra = [f"{x}_{KINDS[self.kind][1]}" for x, fl in zip(names, flags) if fl]
        return names + extra, flags + [True] * len(extra)

    def _count_error(self, args, names: list[str], flags) -> MachineError:
        word = _KIND[KINDS[self.kind][1]]
        if flags is None:
            return MachineError(f"{self.name} takes the {plural(len(names), 'argument')} of "
                                f"{getattr(self.inner, 'name', '?')} ({', '.join(names)}), "
                                f"then one {word} per float argument; got {len(args)}",
                                self.name)
        return MachineError(f"{self.name} takes {plural(len(names), 'argument')} "
                            f"({', '.join(names)}), got {len(args)}", self.name)

    def specialize(self, args) -> tuple[Program, str, list[str] | None]:
        """(program, entry, parameter names) of the derivative program for these arguments
        (for arrays: the program takes them packed, see `pack`)."""
        return self._specialized(self.bound(args))

    def _specialized(self, args: tuple) -> tuple[Program, str, list[str] | None]:
        """specialize of arguments already bound (Transformed.bound)."""
        try:
            return self._specialize(args)
        except transforms.TransformError as e:
            if not isinstance(self.inner, Transformed) or hasattr(e, "told"):
                raise
            raise _nested_error(self, str(e)) from None

    def _specialize(self, args: tuple) -> tuple[Program, str, list[str] | None]:
        if self._twice_adjoint(args):
            e = transforms.TransformError(
                f"{self.name} of a function of arrays runs as two tangent programs (see "
                "docs/gradients.md, derivatives of derivatives), not as a program of its "
                "own: it is not differentiated again, drawn or called from reversible "
                "code; rvm.tangent(rvm.adjoint(f)) is one program, and rvm.hvp and "
                "rvm.hessian give second derivatives")
            e.told = e.twice = str(e)
            raise e
        sig = self.signature()
        if sig is not None:                  # a wrong count, said in the user's names
            names, flags = sig
            if (flags is not None and len(args) != len(names)) or (len(args) < len(names) \
                    and flags is None and not isinstance(self.inner, Transformed)):
                raise self._count_error(args, names, flags)
        n = arity(self.inner, args)
        inner_args = args[:n]
        packed = _packed(self.inner, inner_args)      # as the inner program takes them
        arrays = self._arrays(packed)
        program, name, names = _inner_target(self.inner, inner_args)
        key = (self.kind, name, tuple(arrays.items()))
        fn = program.functions[name]
        floats = float_arguments(self.inner, inner_args)
        suffix = KINDS[self.kind][1]
        labels = list(names) if names else list(fn.names) or _registers(fn, packed)
        user = labels if len(packed) == n else _user_labels(self.inner, n)
        if len(args) != n + len(floats):
            raise self._count_error(args, user[:n] + [f"{user[k]}_{suffix}"
                                                      for k in floats], [])
        if key not in program.cache:
            build = KINDS[self.kind][0]
            derived, entry = build(program, name, arrays) if arrays else build(program, name)
            derived = named(derived, entry, fn, self.kind)
            if self.engine is not None:
                from ..engines.machine import resolve_engine
                derived = Program(derived.functions, derived.source,
                                  {k: v for k, v in derived.cache.items()
                                   if isinstance(k, str)},     # (what it was derived from)
                                  engine=resolve_engine(self.engine))
            pfloats = _param_floats(fn.params, packed)
            extra = [f"{labels[k]}_{suffix}" for k in pfloats
                     if not isinstance(packed[k], np.ndarray)]
            program.cache[key] = (derived, entry, labels[:len(packed)] + extra)
        return program.cache[key]

    def pack(self, args) -> list:
        """The program's arguments for a call: arrays interleaved with their tangents
        (or shadows), then the scalars' tangents. Of a derivative of a derivative: the
        inner derivative's arguments packed as it packs them, each interleaved array with
        the tangents of what it interleaves, packed the same way."""
        return self._pack(self.bound(args))

    def _pack(self, args: tuple) -> list:
        n = arity(self.inner, args)
        inner, extra = list(args[:n]), list(args[n:])
        floats = float_arguments(self.inner, inner)
        if len(extra) != len(floats):
            raise UsageError(f"{self.name} takes {n} arguments and {len(floats)} "
                             f"{KINDS[self.kind][1]}s, got {len(args)} in all")
        if not isinstance(self.inner, Transformed):
            return pack_tangents(inner, floats, extra)
        packed = self.inner.pack(inner)
        dots = self.inner.pack(_tangents(inner, floats, extra))
        pfloats = self._packed_floats(inner, packed)
        return pack_tangents(packed, pfloats, [dots[k] for k in pfloats])

    def _packed_floats(self, inner, packed) -> list[int]:
        """The float arguments among the inner derivative's packed arguments."""
        program, name, _ = _inner_target(self.inner, inner)
        return _param_floats(program.functions[name].params, packed)

    def bound(self, args) -> tuple:
        """The arguments with the function's own converted as a call of it converts them
        (as_bound: an integer array it declares as floats is a float array, whose
        tangent follows)."""
        args = tuple(args)
        if not _converted(args):
            return args         # (nothing to convert: the usual call, no work)
        n = arity(self.inner, args)
        return (*as_bound(self.inner, args[:n]), *args[n:])

    def unpack(self, args, results) -> tuple:
        return self._unpack(self.bound(args), results)

    def _unpack(self, args: tuple, results) -> tuple:
        n = arity(self.inner, args)
        floats = float_arguments(self.inner, args[:n])
        if not isinstance(self.inner, Transformed):
            values = [r[..., 0::2] if isinstance(a, np.ndarray) else r
                      for a, r in zip(args[:n], results)]
            scalar = iter(results[n:])
            dots = [results[i][..., 1::2] if isinstance(args[i], np.ndarray)
                    else next(scalar) for i in floats]
            return tuple(values) + tuple(dots)
        packed = self.inner.pack(list(args[:n]))
        pfloats = self._packed_floats(args[:n], packed)
        values = [r[..., 0::2] if isinstance(a, np.ndarray) else r
                  for a, r in zip(packed, results)]
        scalar = iter(results[len(packed):])
        dots = [r[..., 1::2] if isinstance(a, np.ndarray) else next(scalar) if k in pfloats
                else 0 for k, (a, r) in enumerate(zip(packed, results))]
        tangents = self.inner.unpack(args[:n], dots)
        return self.inner.unpack(args[:n], values) + tuple(tangents[k] for k in floats)

    @user_facing
    def __call__(self, *args, **options):
        sig = self.signature() if options else None
        by_name = {k: options.pop(k) for k in list(options)
                   if sig is not None and k in sig[0]}
        if by_name:     # (by parameter name: the function's, then `x_dot` / `x_bar`)
            args = place_keywords(sig[0], args, by_name, self.name)
        if self._twice_adjoint(args):
            return self._adjoint_of_adjoint(args, options)
        if _converted(args):
            args = self.bound(args)
        arrays = any(isinstance(a, np.ndarray) for a in args)
        program, name, _ = self._specialized(args)  # (the arguments' count and kinds)
        m = machine_for(program, **{**self.options, **options})
        try:
            if not arrays:   # the machine's call: straight to native code once it has run
                try:
                    return (m.uncall if self.backward else m.call)(name, *args)
                except MachineError:
                    self._scalar_tangents(args)     # (said in the arguments' terms)
                    raise
            packed = self._pack(args)
            return self._unpack(args, (m.uncall if self.backward else m.call)(name, *packed))
        except InvertibilityError as e:
            raise derived_failure(e, f"rvm.{self.kind}" if not isinstance(
                self.inner, Transformed) else repr(self).strip("<>")) from None

    def _scalar_tangents(self, args: tuple) -> None:
        """After a call of a scalar program failed: a UsageError where a tangent is complex
        for a real argument (the program's binding said it in its registers' terms); the
        check costs the usual call nothing."""
        if not isinstance(self.inner, Transformed):
            n = arity(self.inner, args)
            scalar_tangents(args[:n], float_arguments(self.inner, args[:n]), args[n:],
                            strict=False)

    def _twice_adjoint(self, args) -> bool:
        """rvm.adjoint(rvm.adjoint(g)) called on arrays (see _adjoint_of_adjoint)?"""
        return self.kind == "adjoint" and isinstance(self.inner, Transformed) and \
            self.inner.kind == "adjoint" and not self.inner.backward and \
            any(isinstance(a, np.ndarray) for a in args)

    def _adjoint_of_adjoint(self, args, options: dict) -> tuple:
        """rvm.adjoint(rvm.adjoint(g)) called on arrays, from tangent programs. A =
        adjoint(g) is linear in its shadows, (x, s) -> (x, J(x)^T s), so its adjoint is
        (x, s, xb, sb) -> (x, s, xb + H_s sb, J sb), H_s the Hessian of <s, g(x)>
        (symmetric): H_s sb is the tangent of A along the x-tangent sb (its shadows'
        tangents), J sb the tangent of g along sb. The inverse: sb = J^-1 sb' by the
        inverse of g's tangent program at g(x), then xb = xb' - H_s sb. (The adjoint
        program of A itself would sweep the heap blocks of A's clean-up, which adjoint
        programs do not take: see rvm.ad.transforms.)"""
        a, g = self.inner, self.inner.inner
        n, m = arity(a, args), arity(g, args)
        x, s = list(args[:m]), list(args[m:n])
        floats = float_arguments(g, x)
        k = len(floats)
        if len(args) != n + 2 * k:
            raise UsageError(f"{self.name} takes {n} arguments and {2 * k} shadows, got "
                             f"{len(args)} in all")
        xb = _tangents(x, floats, args[n:n + k])
        xb = [xb[i] for i in floats]
        sb = _tangents(x, floats, args[n + k:])
        sb = [sb[i] for i in floats]
        zeros = [t * 0 for t in sb]
        ta, tg = Transformed("tangent", a, engine=self.engine, **self.options), \
            Transformed("tangent", g, engine=self.engine, **self.options)
        try:
            if self.backward:               # sb' -> J^-1 sb' at y = g(x), then xb
                y = tg(*x, *zeros, **options)[:m]
                sb = list((~tg)(*y, *sb, **options)[m:])
            h = ta(*x, *s, *sb, *zeros, **options)[n:][k:]       # H_s sb
            if not self.backward:
                sb = list(tg(*x, *sb, **options)[m:])           # J sb
        except InvertibilityError as e:
            raise derived_failure(e, repr(self).strip("<>")) from None
        except transforms.TransformError as e:
            if hasattr(e, "twice"):         # (a derivative of one of these: said so)
                raise
            raise _nested_error(self, getattr(e, "told", str(e))) from None
        sign = -1.0 if self.backward else 1.0
        xb = [b + sign * d for b, d in zip(xb, h)]
        same = [np.array(v) if isinstance(v, np.ndarray) else v for v in x + s]
        return tuple(same) + tuple(xb) + tuple(sb)

    def batch(self, columns: list, **options) -> tuple | None:
        """rvm.vmap's fast path: calls on rows of scalar arguments (one array per
        argument, tangents included) in one native loop, or None (the caller loops)."""
        if self.kind == "adjoint" and not self.backward:
            done = self._adjoint_batch(columns, {**self.options, **options})
            if done is not None:
                return done
        program, name, _ = self.specialize(first_row(columns))
        return machine_for(program, **{**self.options, **options}).batch(
            name, columns, self.backward)

    def _adjoint_batch(self, columns: list, options: dict) -> tuple | None:
        """Rows of adjoint(g) on scalars as one native loop, for a g whose program runs
        natively without heap (the adjoint program itself pushes its residues on the
        stack, which the batch loops do not take): adjoint(g)(x, c) = (x, J(x)^T c), so
        the rows run g's Jacobian loop (rvm.jacobian's batch), one gradient pass per row
        seeded with c where the cotangents are the same in every row (jax.vmap of
        jax.grad), else one per cotangent that is nonzero in some row. None where there
        is no such loop, or a row fails or has a non-finite result (the caller's row by
        row path reports it)."""
        from .gradient import Pass, jacobian_plan
        plans = self.__dict__.setdefault("_jacobians", {})
        first = first_row(columns)
        key = (call_kind(first), tuple(sorted(options.items(), key=lambda kv: kv[0])))
        plan = plans.get(key, False)
        if plan is False:
            plan = None
            try:
                n = arity(self.inner, first)
                floats = float_arguments(self.inner, first[:n])
                if len(columns) == n + len(floats) and floats:
                    found = jacobian_plan(Pass(self.inner, options), first[:n],
                                           floats, floats)
                    plan = None if found is None else (found, n, floats)
            except Exception:           # (the general path reports it)
                plan = None
            if len(plans) >= 64:
                plans.clear()
            plans[key] = plan
        if plan is None:
            return None
        (loop, budget, params, _, _), n, floats = plan
        from ..engines.arguments import batch_columns, exact_columns
        from ..engines.native import on_threads
        x, cts = columns[:n], columns[n:]
        if not exact_columns(x, params) or \
                any(np.asarray(c).dtype.kind not in "iuf" for c in cts):
            return None
        size = len(columns[0])
        cot = np.stack([np.asarray(c, np.float64) for c in cts], axis=1)    # rows x floats
        shared = bool((cot == cot[:1]).all())
        used = np.flatnonzero((cot != 0).any(axis=0))
        S = cot[:1] if shared else np.eye(len(floats))[used]
        cols = batch_columns(x, params, loop)
        G = np.zeros((size, len(S), len(floats)))
        if len(S):
            try:
                on_threads(loop, size, (budget,), cols, (S,),
                           [np.empty(size, c.dtype) for c in cols] + [G])
            except Exception:   # a row failed: the row-by-row path finds and reports it
                return None
        bars = G[:, 0, :] if shared else np.einsum("ns,nsj->nj", cot[:, used], G)
        if not np.isfinite(bars).all():
            return None
        return tuple(np.array(c, dtype=np.asarray(c).dtype) for c in x) + \
            tuple(np.ascontiguousarray(bars[:, j]) for j in range(len(floats)))

    def lower(self, sig: tuple) -> tuple[Program, str]:
        """(program, entry) for a call from reversible code with this signature."""
        if any(s[0] not in ("int", "float") for s in sig):
            raise transforms.TransformError(f"{self.name} takes scalar arguments only when "
                                            "called from reversible code")
        program, name, _ = self.specialize(tuple(0 if s[0] == "int" else 0.0 for s in sig))
        if self.backward:
            program, name = with_inverse(program, name)
        return program, name

    def __invert__(self) -> Transformed:
        return Transformed(self.kind, self.inner, not self.backward, self.engine,
                           **self.options)

    def __repr__(self) -> str:
        return f"<{'~' if self.backward else ''}{self.name}>"


def tangent(f, engine: str | None = None, **options) -> Transformed:
    """The forward-mode derivative of f as a reversible function:
    (x..., xdot...) -> (F(x)..., J xdot...), one tangent per float argument. `options`
    are machine options for every call (max_steps, tol, heap_limit, checks), as for
    rvm.grad; a call may also pass its own."""
    return Transformed("tangent", f, engine=engine, **options)


def adjoint(f, engine: str | None = None, **options) -> Transformed:
    """The reverse-mode derivative of f as a reversible function:
    (x..., ybar...) -> (x..., J^T ybar...), one shadow per float argument. `options` as
    for rvm.tangent."""
    return Transformed("adjoint", f, engine=engine, **options)


def packed_call(fn, kind: str, values: list) -> tuple[Transformed, Program, str, list]:
    """For a call of fn's tangent or adjoint program (kind) with `values`: fn's arguments,
    then one tangent (or shadow) per float argument, an array's an array of its shape.
    The derivative as rvm.tangent and rvm.adjoint make it, its program and entry, and
    the values as that program takes them (each array interleaved with its tangents:
    Transformed.unpack gives its results back as fn's values, then the tangents). The
    debugger and the command line run derivatives of functions of arrays so."""
    n = arity(fn, values)
    floats = float_arguments(fn, values[:n])
    t = Transformed(kind, fn)
    if len(values) != n + len(floats):
        raise UsageError(f"{t.name} takes the {plural(n, 'argument')} of "
                         f"{getattr(fn, 'name', '?')}, then one {_KIND[KINDS[kind][1]]} per "
                         f"float argument ({len(floats)}): {n + len(floats)} in all, "
                         f"got {len(values)}")
    program, name, names = t.specialize(values)
    return t, _with_names(program, name, names), name, t.pack(values)


def _checked_tangents(tangents, primals, floats: list[int], what: str) -> list:
    """The float arguments' tangents as numbers or float arrays (None: zero, of the
    argument's shape), refused with a UsageError where they cannot be its tangent."""
    n = len(primals)
    if len(tangents) != n:
        raise UsageError(f"{what}: {len(tangents)} tangents for {n} arguments")
    out = []
    for k, t in enumerate(tangents):
        if k not in floats:
            if t is not None and not (np.ndim(t) == 0 and t == 0):
                raise UsageError(f"{what}: argument {k} is an integer; its tangent must "
                                 "be None")
            continue
        p = primals[k]
        if t is None:                       # no tangent: zero
            t = np.zeros(np.shape(p)) if isinstance(p, np.ndarray) else 0.0
        try:
            if isinstance(t, (list, tuple)):        # as numpy converts it
                t = np.asarray(t)
                t = t if t.dtype.kind == "c" else t.astype(np.float64)
            if not isinstance(t, (np.ndarray, complex)):
                t = float(t)
        except (TypeError, ValueError):
            raise UsageError(f"{what}: the tangent of argument {k} is "
                             f"{type(t).__name__} {t!r:.40}; it must be a number or an "
                             "array of floats") from None
        if np.iscomplexobj(t) and not np.iscomplexobj(p):
            raise UsageError(f"{what}: the tangent of argument {k} is complex, but the "
                             "argument is real")
        out.append(t)
    return out


def _real_only(primals, what: str) -> None:
    if any(isinstance(a, complex) or (isinstance(a, np.ndarray) and a.dtype.kind == "c")
           for a in primals):
        raise UsageError(f"{what} takes real arguments: pass a complex value as two floats "
                         "(its real and imaginary parts)")


def _spread(values, floats: list[int], n: int) -> tuple:
    out: list = [None] * n
    for k, v in zip(floats, values):
        out[k] = v
    return tuple(out)


@user_facing
def jvp(f, primals: Sequence, tangents: Sequence, **options) -> tuple[tuple, tuple]:
    """(values, tangents_out): f's final values and J @ tangents, by running f's tangent
    program. One entry per argument, None as the tangent of an integer (JAX's jvp);
    arrays as arrays."""
    primals = as_bound(f, primals)
    floats, n = float_arguments(f, primals), len(primals)
    dots = _checked_tangents(tuple(tangents), primals, floats, "jvp")
    dots = [complex(t) if isinstance(primals[k], complex) else t for k, t in zip(floats, dots)]
    out = tangent(f)(*primals, *dots, **options)
    return tuple(out[:n]), _spread(out[n:], floats, n)


@user_facing
def hvp(f, primals: Sequence, tangents: Sequence, loss=0, **options) -> tuple:
    """The Hessian of `loss` (a float scalar argument's final value) times `tangents`. One
    entry per argument, None for integers, arrays as arrays. O(1) extra memory: forward
    over reverse (the tangent of the adjoint program) for register code; for programs
    with arrays or that allocate heap arrays (`zeros(n)` ancillas) or use the stack,
    reverse over forward (gradient mode on the tangent program)."""
    try:
        return _hvp(f, primals, tangents, loss, options)
    except InvertibilityError as e:
        raise derived_failure(e, "rvm.hvp") from None


def _hvp(f, primals: Sequence, tangents: Sequence, loss, options: dict) -> tuple:
    primals, tangents = as_bound(f, primals), tuple(tangents)
    _real_only(primals, "hvp")
    try:          # a plan for these argument types: the machine and entry of an earlier call
        key = (_identity(f), call_kind(primals), tuple(t is None for t in tangents), loss,
               tuple(sorted(options.items())))
        plan = _HVP_PLANS.plans.get(key)
    except TypeError:                         # something unhashable: no plan
        key = plan = None
    if plan is not None and plan[0] == "arrays":
        _, floats, g, _ = plan
        return _hvp_packed(g, primals, _checked_tangents(tangents, primals, floats,
                                                         "hvp"), floats)
    if plan is not None and all(type(t) in (float, int) for t in tangents if t is not None):
        m, name, floats, n, seed, _ = plan
        out = m.call(name, *primals, *seed, *[tangents[k] or 0.0 for k in floats],
                     *[0.0] * len(floats))
        return _spread(out[n + 2 * len(floats):], floats, n)
    floats, n = float_arguments(f, primals), len(primals)
    dots = _checked_tangents(tangents, primals, floats, "hvp")
    which, element = loss_index(f, primals, loss)
    if element is not None:
        raise UsageError("hvp: the loss must be a float scalar argument, not an element")
    if any(isinstance(a, np.ndarray) for a in primals) or allocates(f, primals):
        g = _hvp_gradient(f, primals, dots, floats, which, options)
        if key is not None:
            _HVP_PLANS.plans[key] = ("arrays", floats, g, f)
        return _hvp_packed(g, primals, dots, floats)
    seed = [1.0 if k == which else 0.0 for k in floats]
    inner = tangent(adjoint(f))
    args = primals + tuple(seed) + _spread(dots, floats, n) + (0.0,) * len(floats)
    args = tuple(a for a in args if a is not None)
    out = inner(*args, **options)
    if key is not None:
        program, name, _ = inner.specialize(args)
        _HVP_PLANS.plans[key] = (machine_for(program, **options), name, floats, n, seed, f)
    # the tangent program's results: the adjoint's arguments (n primals, then the shadows),
    # then one tangent per float among them; the shadows' tangents are H @ tangents
    return _spread(out[n + 2 * len(floats):], floats, n)


# (f, argument kinds, ...) -> (machine, entry, floats, n, seed, f) for register code,
# ("arrays", floats, the tangent program's gradient, f) for programs with arrays
_HVP_PLANS = PerThread(plans=dict)     # per thread: a plan's machine serves one call at a time


def _identity(f):
    """f as a plan's key: itself, or, for a function of a loaded program (whose dicts are
    not hashable), the program's identity and the function's name. Each plan keeps f, so
    the program lives, and its identity stays its own, while the plan does."""
    try:
        hash(f)
        return f
    except TypeError:
        return (id(getattr(f, "program", f)), getattr(f, "name", None),
                getattr(f, "backward", False))


def allocates(f, primals) -> bool:
    """Does f (or anything it calls) allocate, free, push or pop? It has no adjoint
    program (the stack), or one that holds every block until its sweep ends and runs
    the sweep three times (docs/gradients.md, Heap ancillas): its Hessian-vector
    products are taken reverse over forward (rvm.grad of the tangent program), as for
    arrays, and the bridges take its first and second derivatives from gradient mode."""
    program, name, _ = target(f, tuple(primals))
    return any(ins.spec.group == "memory" and ins.op != "EXCH" and ins.op not in isa.READS
               for g in transforms.reachable(program, name)
               for ins in program.functions[g].code)


def _hvp_gradient(f, primals, dots, floats, which, options):
    """For programs with arrays, reverse over forward: rvm.grad of f's tangent program
    (arrays interleaved with their tangents) seeded on the loss's tangent, whose shadows
    of the values are H @ tangents. A gradient like any other, so repeated calls take its
    direct path into native code; it is kept with the tangent program."""
    program, name, _ = tangent(f).specialize(tuple(primals) + tuple(dots))
    scalars = [k for k in floats if not isinstance(primals[k], np.ndarray)]
    loss = len(primals) + scalars.index(which)       # the loss's tangent, after f's own
    key = ("hvp", name, loss, tuple(sorted(options.items())))
    if key not in program.cache:
        from .gradient import grad
        program.cache[key] = grad(program[name], loss=loss, **options)
    return program.cache[key]


def _hvp_packed(g, primals, dots, floats) -> tuple:
    """H @ dots from the gradient of the tangent program (see _hvp_gradient)."""
    grads = g(*pack_tangents(primals, floats, dots))
    out: list = [None] * len(primals)
    for k in floats:
        out[k] = grads[k][..., 0::2].copy() if isinstance(primals[k], np.ndarray) \
            else grads[k]
    return tuple(out)


def hessian(f, loss=0, wrt: Sequence | None = None, **options) -> Callable[..., np.ndarray]:
    """A function returning the Hessian of `loss` with respect to the float arguments named
    by `wrt` (indices or names; default: all float arguments; an array contributes all its
    elements in order) as a 2-D array, one Hessian-vector product per column."""
    def run(*args, **kwargs) -> np.ndarray:
        args = as_bound(f, positional(f, args, kwargs))
        _real_only(args, "hessian")
        floats, n = float_arguments(f, args), len(args)
        cols = floats if wrt is None else [_position(f, args, w) for w in wrt]
        for c in cols:
            if c not in floats:
                raise UsageError(f"hessian: argument {c} is not a float argument")
        sizes = [np.size(args[c]) for c in cols]
        out = np.empty((sum(sizes), sum(sizes)))
        j = 0
        for c, size in zip(cols, sizes):
            for e in range(size):
                v = [None if k not in floats else np.zeros_like(args[k])
                     if isinstance(args[k], np.ndarray) else 0.0 for k in range(n)]
                if isinstance(args[c], np.ndarray):
                    v[c].flat[e] = 1.0
                else:
                    v[c] = 1.0
                try:
                    h = _hvp(f, args, v, loss, options)
                except InvertibilityError as e:
                    raise derived_failure(e, "rvm.hessian") from None
                out[:, j] = np.concatenate([np.ravel(h[r]) for r in cols])
                j += 1
        return out
    return run


def _position(f, args, which) -> int:
    if isinstance(which, (int, np.integer)) and not isinstance(which, bool):
        if not -len(args) <= which < len(args):
            raise UsageError(f"hessian: wrt names argument {which}, but the function takes "
                             f"{len(args)} arguments")
        return int(which) % len(args)
    program, name, names = target(f, tuple(args))
    fn = program.functions[name]
    # (a loaded program's function knows its source's names: parameter_names)
    labels = list(names) if names else parameter_names(f) or [str(p) for p in fn.params]
    if which in labels:
        return labels.index(which)
    raise UsageError(f"unknown argument {which!r}: the arguments are {', '.join(labels)}")


_KIND = {"bar": "shadow", "dot": "tangent"}


def derived_failure(e: InvertibilityError, what: str) -> InvertibilityError:
    """A failed zero test in a derivative program, told in the user's terms when it is one
    of a derived register (`x_bar`, `x_dot`, `x_bar_dot`: the shadow or tangent of the
    variable x): which variable, which transform, and how to loosen `tol`. Such a residue
    is the rounding of the derivatives that flow through an ancilla restored only
    approximately (within `tol`, as a dirty ancilla is): they can be far larger than the
    variable's own values, and the test accepts tol times the largest magnitude a
    derivative has held in the run (rvm.engines.compiled.derived_registers), at least tol."""
    e = getattr(e, "original", e)          # told again by the outer call (rvm.hvp)
    names = re.findall(r"`(\w+?)((?:_(?:bar|dot))+)`", e.message)
    if not names or not re.search(r"zero|must be (back to )?0", e.message):
        return e
    where = e.function.split(".")[0] if e.function else "?"
    said = []
    for base, suffix in dict.fromkeys(names):
        kinds = [_KIND[k] for k in suffix.strip("_").split("_")]
        said.append(f"`{base}{suffix}` is the " + " of the ".join(reversed(kinds)) +
                    f" of `{base}`")
    worst = max((abs(v) for v in e.values.values() if isinstance(v, float)), default=0.0)
    loose = 10.0 ** min(-1, math.ceil(math.log10(worst)) + 2) if worst > 0 else 1e-5
    hint = (f"; {', '.join(said)} (in {where}), in the derivative program of {what}. Its "
            "source is restored only approximately, and its derivatives carry the rounding "
            "of their intermediate values, which can be far larger than the variable's own "
            "(the test accepts tol times the largest magnitude a derivative has held so far, "
            f"at least tol). To accept the residue, pass a larger tol to {what}, e.g. "
            f"tol={loose:g} (the default is 1e-8)")
    out = InvertibilityError(e.message + hint, e.function, e.index, e.line, e.file, e.values)
    out.detail, out.original = getattr(e, "detail", ""), e
    return out
