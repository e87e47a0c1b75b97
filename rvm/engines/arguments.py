"""Binding Python arguments to a function's parameter registers.

A scalar binds to one parameter. A numpy array (1-D or 2-D) is copied onto the heap and
binds to 1 + ndim consecutive integer parameters: its base address, then its length (1-D)
or its rows and columns (2-D). After the call its cells are read back. Other float dtypes
are converted to float64 and other integer (and boolean) dtypes to int64, Python lists to
arrays, and 0-d arrays and numpy scalars to scalars; arguments are counted from 0.

A complex number binds to two consecutive float parameters (real part, imaginary part);
a 1-D complex array of length n is placed as an n x 2 float array (each row a real and
an imaginary part, numpy's own complex128 layout) and comes back as complex128.
"""

from __future__ import annotations

import math
import numbers

import attrs
import numpy as np

from ..core import isa
from ..core.errors import MachineError

DTYPES = {np.dtype(np.float64): isa.FLOAT, np.dtype(np.int64): isa.INT}
INT64 = (-(1 << 63), (1 << 63) - 1)


@attrs.frozen
class Binding:
    """Where one Python argument lives: parameter positions, and for arrays the heap block."""

    params: tuple[int, ...]        # indices into the function's parameter list
    name: str                      # e.g. "f0", or "r0:r1" for an array's registers
    cls: str                       # isa.INT / isa.FLOAT (for arrays: the element class)
    base: int = -1                 # heap address of an array's first cell
    shape: tuple[int, ...] = ()    # () for scalars; a complex array's float layout (n, 2)
    complex: bool = False          # a complex scalar (two float parameters) or array

    @property
    def is_array(self) -> bool:
        return self.base >= 0


def coerce(v, reg, fname: str, label: str | None = None):
    """A Python value for a parameter register, or a MachineError naming the problem: the
    parameter by its source name (`label`, else the register) and the value by its type."""
    name = label or str(reg)
    if reg.cls == isa.INT:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            else:
                raise MachineError(f"argument {name} must be an integer, got {_kind(v)}",
                                   fname)
        v = int(v)
        if not INT64[0] <= v <= INT64[1]:
            raise MachineError(f"argument {name} does not fit in int64: {_short(v)}",
                               fname)
        return v
    if not isinstance(v, numbers.Real) or isinstance(v, bool):
        raise MachineError(f"argument {name} must be a number, got {_kind(v)}", fname)
    try:
        return float(v)
    except OverflowError:          # an integer past float64's range
        raise MachineError(f"argument {name} is too large for a float64: "
                           f"{_short(v)}", fname) from None


def _kind(v) -> str:
    """A value for a message: a short repr, after its type unless it is a number
    (`str 'a'`, `NoneType None`, `2.5`)."""
    text = repr(v)
    text = text if len(text) <= 40 else text[:37] + "..."
    return text if isinstance(v, numbers.Number) else f"{type(v).__name__} {text}"


def plural(n: int, word: str) -> str:
    """'1 argument', '2 arguments'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _short(v) -> str:
    """A number for a message: a huge integer as its leading digits and its size."""
    text = str(v)
    return text if len(text) <= 40 else f"{text[:12]}... ({len(text)} digits)"


def coercers(params, fname: str) -> list:
    """One converter per parameter register, each exactly `coerce` (the same values, the
    same errors), with the exact kinds (an int for an integer register, a float for a
    float one) let through at once. Direct-call plans convert through these, so the first
    and the thousandth call of a function take and refuse the same arguments."""
    def one(reg):
        if reg.cls == isa.INT:
            def to_int(v):
                if type(v) is int and INT64[0] <= v <= INT64[1]:
                    return v
                return coerce(v, reg, fname)
            return to_int

        def to_float(v):
            return v if type(v) is float else coerce(v, reg, fname)
        return to_float
    return [one(p) for p in params]


def exact_columns(columns: list, params) -> bool:
    """Do these batch columns (one per parameter) convert to the parameters' int64 or
    float64 exactly as `coerce` converts each row? Integers for an integer register (no
    floats, which would be truncated, no booleans, no uint64 past int64), integers or
    floats for a float one. Anything else goes row by row, where each row is checked."""
    for c, p in zip(columns, params):
        dt = np.asarray(c).dtype
        if p.cls == isa.INT:
            if dt.kind == "u" and dt.itemsize == 8:
                if len(c) and int(np.max(c)) > INT64[1]:
                    return False
            elif dt.kind not in "iu":
                return False
        elif dt.kind not in "iuf":
            return False
    return True


# the machine's options, which every call takes as keywords (Machine, machine_for)
OPTIONS = ("engine", "checks", "max_steps", "heap_limit", "tol", "max_depth")


def with_options(names: list[str], args: tuple, kwargs: dict, fname: str) -> tuple:
    """(args with the keywords that name parameters put in place, the other keywords:
    machine options); TypeError for a keyword that is neither."""
    by_name = {k: v for k, v in kwargs.items() if k in names}
    options = {k: v for k, v in kwargs.items() if k not in by_name}
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise TypeError(f"unknown argument {unknown[0]!r}: the arguments of {fname} are "
                        f"{', '.join(names)}, the options {', '.join(OPTIONS)}")
    return (place_keywords(names, args, by_name, fname) if by_name else args), options


def place_keywords(names: list[str], args: tuple, kwargs: dict, fname: str) -> tuple:
    """args with the keyword arguments put in place by parameter name; TypeError for an
    unknown name, one given twice, or a parameter left without a value."""
    missing_ = object()
    full = list(args) + [missing_] * (len(names) - len(args))
    for key, value in kwargs.items():
        if key not in names:
            raise TypeError(f"unknown argument {key!r}; the arguments of {fname} are "
                            f"{', '.join(names)}")
        k = names.index(key)
        if k < len(args):
            raise TypeError(f"argument {key!r} given by position and by name")
        full[k] = value
    missing = [n for n, v in zip(names, full) if v is missing_]
    if missing:
        raise TypeError(f"{fname}: missing argument(s) {', '.join(missing)}")
    return tuple(full)


def convert(a, n: int, fname: str):
    """A Python argument as rvm takes it: arrays of float64 or int64, scalars as scalars."""
    if isinstance(a, (list, tuple)):
        try:
            a = np.asarray(a)
        except ValueError:
            raise MachineError(f"argument {n} of {fname} is a ragged {type(a).__name__}; "
                               "pass a rectangular numpy array", fname) from None
    if isinstance(a, np.generic):
        a = np.asarray(a)
    if isinstance(a, np.ndarray):
        if a.ndim == 0:
            return a.item()
        if a.dtype.kind == "f":
            return a.astype(np.float64, copy=False)
        if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
            raise MachineError(f"argument {n} of {fname} holds {a.max()}, which does not fit "
                               "in int64 (rvm's integers)", fname)
        if a.dtype.kind in "iub":
            return a.astype(np.int64, copy=False)
        if a.dtype.kind == "c":
            if a.ndim != 1:
                raise MachineError(f"argument {n} of {fname} is a {a.ndim}-D complex array; "
                                   "complex arrays must be 1-D", fname)
            return a.astype(np.complex128, copy=False)
        raise MachineError(f"argument {n} of {fname} has dtype {a.dtype}; arrays must hold "
                           "floats, integers or complex numbers", fname)
    return a


def call_kind(args) -> tuple:
    """What a planned direct call depends on: each argument's type, and for arrays their
    shape and dtype kind."""
    return tuple((a.shape, a.dtype.kind) if type(a) is np.ndarray else type(a) for a in args)


def first_row(columns: list) -> tuple:
    """A batch's first row (one column per parameter) as the plain Python values a single
    call takes: rvm.vmap's native loops run it the general way first, to check and plan."""
    return tuple(c[0].item() if isinstance(c[0], np.generic) else c[0] for c in columns)


def batch_columns(columns: list, params, loop) -> list:
    """The argument columns of a native batch loop: int64 or float64 arrays, one entry per
    row. A column that is one value for every row (rvm.vmap's in_axes None: a view with
    stride 0) stays one value where the loop takes that (rvm.engines.llvm.Batch), so no
    array of copies is made."""
    out = []
    for c, p in zip(columns, params):
        c = np.asarray(c)
        dtype = np.int64 if p.cls == isa.INT else np.float64
        if c.ndim == 1 and c.strides == (0,) and len(c) and getattr(loop, "spreads", False):
            out.append(c if c.dtype == dtype else np.broadcast_to(c[:1].astype(dtype),
                                                                  c.shape))
        else:
            out.append(np.ascontiguousarray(c, dtype=dtype))
    return out


def as_floats(a: np.ndarray) -> np.ndarray:
    """A 1-D complex array as its n x 2 float layout (a copy: the caller's array is
    never written)."""
    return np.ascontiguousarray(a).view(np.float64).reshape(len(a), 2).copy()


def bind(machine, fn, args, names: list[str] | None = None) -> tuple[list, list[Binding]]:
    """Register values for fn's parameters, and one Binding per argument.

    Arrays are placed on the machine's heap (allocated LIFO, in argument order)."""
    params, values, bindings, k = fn.params, [], [], 0
    named = names
    if names is not None and len(names) != len(args):     # register by register
        names = None
    for n, a in enumerate(args):
        a = convert(a, n, fn.name)
        is_complex = isinstance(a, complex) or (isinstance(a, np.ndarray) and
                                                a.dtype.kind == "c")
        if isinstance(a, complex):
            regs = params[k:k + 2]
            if len(regs) < 2 or any(r.cls != isa.FLOAT for r in regs):
                raise MachineError(
                    f"argument {n} of {fn.name} is complex, which takes two float parameters "
                    f"(real, imaginary); the parameters there are "
                    f"{', '.join(map(str, regs)) or 'none'}", fn.name)
            values += [a.real, a.imag]
            bindings.append(Binding((k, k + 1), names[n] if names else f"{regs[0]}:{regs[1]}",
                                    isa.FLOAT, complex=True))
            k += 2
            continue
        if is_complex:
            a = as_floats(a)
        if isinstance(a, np.ndarray) and a.dtype.kind == "i" and \
                declared_class(fn, params[k:k + 1 + a.ndim]) == isa.FLOAT:
            a = a.astype(np.float64)      # as np.asarray(a, float): [1, 2] for Array[float]
        elif isinstance(a, np.ndarray) and a.dtype.kind == "f" and \
                declared_class(fn, params[k:k + 1 + a.ndim]) == isa.INT:
            raise MachineError(          # (its float64 bits would be taken as integers)
                f"argument {names[n] if names else n} of {fn.name} is declared an integer "
                f"array, got floats ({', '.join(map(repr, a.ravel()[:3].tolist()))}"
                f"{', ...' if a.size > 3 else ''}): give integers", fn.name)
        if isinstance(a, np.ndarray):
            dtype = DTYPES[a.dtype]
            if a.ndim not in (1, 2):
                raise MachineError(f"argument {n} of {fn.name} has shape {a.shape}; "
                                   "arrays must be 1-D or 2-D", fn.name)
            regs = params[k:k + 1 + a.ndim]
            # (the source's names do not go one to an argument, as a struct's fields do:
            # is this array where the source declares a number?)
            scalar = None if names or not named else next(
                (sym.name for sym in fn.symbols if regs and sym.regs == (regs[0],)), None)
            if scalar is not None and not any(len(sym.regs) > 1 and sym.regs[0] == regs[0]
                                              for sym in fn.symbols):
                raise MachineError(      # (its address and length would be taken for them)
                    f"argument {n} of {fn.name} is an array, where the source declares "
                    f"{scalar}, a number", fn.name)
            declared = next((sym for sym in fn.symbols if named and regs and
                             len(sym.regs) > 1 and sym.regs[0] == regs[0]), None)
            if declared is not None and len(declared.regs) != 1 + a.ndim:
                raise MachineError(     # (the source's terms: not its registers)
                    f"argument {names[n] if names else declared.name} of {fn.name} is "
                    f"declared a {len(declared.regs) - 1}-D array, got a {a.ndim}-D array "
                    f"of shape {a.shape}", fn.name)
            if len(regs) < 1 + a.ndim or any(r.cls != isa.INT for r in regs):
                dims = "length" if a.ndim == 1 else "rows, cols"
                raise MachineError(
                    f"argument {n} of {fn.name} is a {a.ndim}-D array, which takes "
                    f"{1 + a.ndim} integer parameters (base, {dims}); "
                    f"the parameters there are {', '.join(map(str, regs)) or 'none'}", fn.name)
            base = machine.alloc(a.size)
            machine.cells(base, a.size, "<i8" if dtype == isa.INT else "<f8")[:] = a.ravel()
            values += [base, *a.shape]
            bindings.append(Binding(tuple(range(k, k + 1 + a.ndim)),
                                    names[n] if names else ":".join(map(str, regs)), dtype,
                                    base, a.shape, is_complex))
            k += 1 + a.ndim
        else:
            if k >= len(params):           # too many: count what they would fill
                k += 1
                continue
            values.append(coerce(a, params[k], fn.name, names[n] if names else None))
            bindings.append(Binding((k,), names[n] if names else str(params[k]), params[k].cls))
            k += 1
    if (k != len(params) or len(bindings) != len(args)) and named and \
            len(named) != len(args):         # the source's arguments, by name
        raise MachineError(f"{fn.name} takes {plural(len(named), 'argument')} "
                           f"({', '.join(named)}), got {len(args)}", fn.name)
    if k != len(params) or len(bindings) != len(args):
        raise MachineError(f"{fn.name} takes {len(params)} parameter registers "
                           f"({', '.join(map(str, params))}); the "
                           f"{plural(len(args), 'argument')} given "
                           f"fill{'s' if len(args) == 1 else ''} {k} (an array fills 1 + ndim "
                           "integer parameters, a complex number two float parameters: write "
                           "2+0j for a complex 2)", fn.name)
    return values, bindings


def declared_float_arrays(fn, args) -> tuple:
    """args with each integer array that fn declares as floats converted as
    np.asarray(a, float) converts it (as bind does)."""
    out, k = [], 0
    for a in args:
        if isinstance(a, np.ndarray):
            if a.dtype.kind in "iu" and \
                    declared_class(fn, fn.params[k:k + 1 + a.ndim]) == isa.FLOAT:
                a = a.astype(np.float64)
            k += 1 + a.ndim
        else:
            k += 2 if isinstance(a, complex) else 1
        out.append(a)
    return tuple(out)


def declared_class(fn, regs) -> str:
    """The element class the source declares for an array parameter in these registers
    (its debug symbol's), or "" when none is known (assembly)."""
    regs = tuple(regs)
    for s in fn.symbols:
        if s.regs == regs and s.dtype:
            return s.dtype
    return ""


def read_array(machine, b: Binding, shadows: bool = False) -> np.ndarray:
    """An array argument's cells (or their gradient shadows), as a fresh numpy array."""
    floats = shadows or b.cls == isa.FLOAT
    cells = machine.cells(b.base, math.prod(b.shape), "<f8" if floats else "<i8", shadows)
    out = cells.astype(np.float64 if floats else np.int64).reshape(b.shape)   # a copy
    return out.view(np.complex128).reshape(b.shape[:-1]) if b.complex else out


def scalar(fr, b: Binding, cells: list) -> float | int | complex:
    """A scalar argument's value (or shadow) from the root frame's registers (R or G)."""
    fn = fr.fn
    v = cells[fn.slot(fn.params[b.params[0]])]
    return complex(v, cells[fn.slot(fn.params[b.params[1]])]) if b.complex else v
