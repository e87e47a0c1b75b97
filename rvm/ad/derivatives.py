"""Derivatives as functions: `rvm.tangent(f)` and `rvm.adjoint(f)` are reversible functions
like f (callable, invertible with `~`, differentiable again), and `jvp`, `hvp`, `hessian`
are built on them. The programs come from rvm.ad.transforms."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ..core import isa
from ..core.errors import MachineError, UsageError
from ..core.program import Program
from ..engines.arguments import Binding
from ..engines.machine import machine_for
from . import transforms
from .gradient import find_argument, target, with_inverse

KINDS = {"tangent": (transforms.tangent, "dot"), "adjoint": (transforms.adjoint, "bar")}


def arity(fn, args) -> int:
    """How many of `args` are f's own arguments (the rest: tangents or shadows)."""
    if isinstance(fn, Transformed):
        n = arity(fn.inner, args)
        program, name, _ = target(fn.inner, args[:n])
        return n + sum(p.cls == isa.FLOAT for p in program.functions[name].params)
    node = getattr(fn, "node", None)
    if node is not None:
        return len(node.args.args)
    program, name = getattr(fn, "program", None), getattr(fn, "name", None)
    if program is None or name not in getattr(program, "functions", {}):
        raise TypeError(f"expected a reversible function or prog['name'], got {fn!r}")
    return len(program.functions[name].params)


class Transformed:
    """A derivative of a function, as a reversible function of its own: `rvm.tangent(f)`
    takes f's arguments then one tangent per float parameter; `rvm.adjoint(f)` f's
    arguments then one shadow (cotangent) per float parameter. Calling it returns every
    argument's final value; `~t` is its inverse; it can be transformed again."""

    def __init__(self, kind: str, inner, backward: bool = False, engine: str | None = None):
        if kind not in KINDS:
            raise UsageError(f"unknown transform {kind!r}")
        if not isinstance(inner, Transformed):
            arity(inner, ())        # fail early on something that is not a function
        self.kind, self.inner, self.backward, self.engine = kind, inner, backward, engine
        self.name = f"{kind}({getattr(inner, 'name', '?')})"

    def specialize(self, args) -> tuple[Program, str, list[str] | None]:
        """(program, entry, parameter names) of the derivative program for these arguments."""
        args = tuple(args)
        n = arity(self.inner, args)
        program, name, names = target(self.inner, args[:n])
        key = (self.kind, name)
        if key not in program.cache:
            build, suffix = KINDS[self.kind]
            derived, entry = build(program, name)
            if self.engine is not None:
                from ..engines.machine import resolve_engine
                derived = Program(derived.functions, derived.source,
                                  engine=resolve_engine(self.engine))
            fn = program.functions[name]
            inner_names = list(names) if names else [str(p) for p in fn.params]
            extra = [f"{n_}_{suffix}" for n_, p in zip(inner_names, fn.params)
                     if p.cls == isa.FLOAT]
            program.cache[key] = (derived, entry, inner_names + extra)
        return program.cache[key]

    def lower(self, sig: tuple) -> tuple[Program, str]:
        """(program, entry) for a call from reversible code with this signature."""
        if any(s[0] not in ("int", "float") for s in sig):
            raise transforms.TransformError(f"{self.name} takes scalar arguments only when "
                                            "called from reversible code")
        program, name, _ = self.specialize(tuple(0 if s[0] == "int" else 0.0 for s in sig))
        if self.backward:
            program, name = with_inverse(program, name)
        return program, name

    def __call__(self, *args, **options):
        program, name, names = self.specialize(args)
        m = machine_for(program, **options)
        m.enter(name, *args, backward=self.backward, names=names)
        return m.finish()

    def __invert__(self) -> Transformed:
        return Transformed(self.kind, self.inner, not self.backward, self.engine)

    def __repr__(self) -> str:
        return f"<{'~' if self.backward else ''}{self.name}>"


def tangent(f, engine: str | None = None) -> Transformed:
    """The forward-mode derivative of f as a reversible function:
    (x..., xdot...) -> (F(x)..., J xdot...), one tangent per float parameter."""
    return Transformed("tangent", f, engine=engine)


def adjoint(f, engine: str | None = None) -> Transformed:
    """The reverse-mode derivative of f as a reversible function:
    (x..., ybar...) -> (x..., J^T ybar...), one shadow per float parameter."""
    return Transformed("adjoint", f, engine=engine)


def _floats(f, primals) -> tuple[list[int], int]:
    program, name, _ = target(f, tuple(primals))
    params = program.functions[name].params
    if len(params) != len(primals):
        raise MachineError(f"{name} takes {len(params)} arguments, got {len(primals)}", name)
    return [k for k, p in enumerate(params) if p.cls == isa.FLOAT], len(params)


def _checked_tangents(tangents, floats: list[int], n: int, what: str) -> list[float]:
    if len(tangents) != n:
        raise UsageError(f"{what}: {len(tangents)} tangents for {n} arguments")
    for k, t in enumerate(tangents):
        if k not in floats and t is not None and t != 0:
            raise UsageError(f"{what}: argument {k} is an integer; its tangent must be None")
    return [float(tangents[k]) if tangents[k] is not None else 0.0 for k in floats]


def _spread(values, floats: list[int], n: int) -> tuple:
    out: list = [None] * n
    for k, v in zip(floats, values):
        out[k] = v
    return tuple(out)


def jvp(f, primals: Sequence, tangents: Sequence, **options) -> tuple[tuple, tuple]:
    """(values, tangents_out): f's final values and J @ tangents, by running f's tangent
    program. One entry per argument, None as the tangent of an integer (JAX's jvp)."""
    primals = tuple(primals)
    floats, n = _floats(f, primals)
    dots = _checked_tangents(tuple(tangents), floats, n, "jvp")
    out = tangent(f)(*primals, *dots, **options)
    return tuple(out[:n]), _spread(out[n:], floats, n)


def _seed(f, primals, loss, floats: list[int], n: int) -> list[float]:
    """The cotangent that picks out the loss: 1 for its parameter, 0 for the others."""
    program, name, names = target(f, tuple(primals))
    fn = program.functions[name]
    bindings = [Binding((k,), (names[k] if names else str(p)), p.cls)
                for k, p in enumerate(fn.params)]
    b, _ = find_argument(bindings, fn, loss, "loss")
    return [1.0 if k == b.params[0] else 0.0 for k in floats]


def hvp(f, primals: Sequence, tangents: Sequence, loss=0, **options) -> tuple:
    """The Hessian of `loss` (a float argument's final value) times `tangents`, by
    forward-over-reverse: the tangent of f's adjoint program (O(1) extra memory). One entry
    per argument, None for integers."""
    primals = tuple(primals)
    floats, n = _floats(f, primals)
    dots = _checked_tangents(tuple(tangents), floats, n, "hvp")
    seed = _seed(f, primals, loss, floats, n)
    a = adjoint(f)
    _, out = jvp(a, primals + tuple(seed), _spread(dots, floats, n) + (0.0,) * len(floats),
                 **options)
    return _spread(out[n:], floats, n)     # the tangents of the shadows: H @ tangents


def hessian(f, loss=0, wrt: Sequence | None = None, **options) -> Callable[..., np.ndarray]:
    """A function returning the Hessian of `loss` with respect to the float arguments named
    by `wrt` (indices or names; default: all float arguments) as a 2-D array, one
    Hessian-vector product per column."""
    def run(*args) -> np.ndarray:
        floats, n = _floats(f, args)
        cols = floats if wrt is None else [_position(f, args, w) for w in wrt]
        for c in cols:
            if c not in floats:
                raise UsageError(f"hessian: argument {c} is not a float argument")
        out = np.empty((len(cols), len(cols)))
        for j, c in enumerate(cols):
            v = [0.0 if k in floats else None for k in range(n)]
            v[c] = 1.0
            h = hvp(f, args, v, loss=loss, **options)
            out[:, j] = [h[r] for r in cols]
        return out
    return run


def _position(f, args, which) -> int:
    if isinstance(which, (int, np.integer)) and not isinstance(which, bool):
        return int(which)
    program, name, names = target(f, tuple(args))
    fn = program.functions[name]
    labels = list(names) if names else [str(p) for p in fn.params]
    if which in labels:
        return labels.index(which)
    raise UsageError(f"unknown argument {which!r}: the arguments are {', '.join(labels)}")
