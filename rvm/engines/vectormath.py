"""Vectorised elementary functions for the array instructions' element loops (a part of
rvm.engines.llvm's back end): glibc's libmvec, where this machine has it.

An array instruction's element loop (rvm.engines.arraylowering) calls exp, log, sin, cos,
tanh, pow and atan2 as rvm_vmath_<name>, a scalar function that is libm's own (the symbol
is bound to libm's address), declared with the vector variants libmvec has for this CPU
(AVX-512: 8 lanes, AVX2: 4) in LLVM's vector-function ABI attribute. LLVM's loop
vectoriser then calls libmvec on 4 or 8 elements at once and libm on the elements left
over; code that is not an array instruction's element loop (every scalar instruction)
keeps calling libm, so scalar results are the same on every engine, bit for bit.

libmvec's functions are accurate to a few units in the last place, not correctly rounded:
an array instruction's elementwise values may round differently from the interpreter's
(numpy's) and from libm's, as numpy's already may (docs/engines.md). A loop makes the same
choice of function for an element each time it runs on the same views, so a value added
by an array instruction is taken back out exactly by its inverse.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import sys

PREFIX = "rvm_vmath_"
ARITY = {"exp": 1, "log": 1, "sin": 1, "cos": 1, "tanh": 1, "pow": 2, "atan2": 2}
# (ISA letter of the x86-64 vector ABI, lanes, the CPU feature it needs)
_VARIANTS = (("e", 8, "avx512f"), ("d", 4, "avx2"))


@functools.cache
def variants() -> tuple:
    """((ISA letter, lanes), ...) libmvec serves on this machine, widest first; () where
    there is none (not glibc on x86-64, no libmvec, or a CPU without AVX2). Loads libmvec
    and binds the scalar names on first call."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return ()
    import llvmlite.binding as ll
    features = ll.get_host_cpu_features()
    found = [(isa, lanes) for isa, lanes, need in _VARIANTS if features.get(need)]
    if not found:
        return ()
    path = ctypes.util.find_library("mvec") or "libmvec.so.1"
    try:
        mvec, libm = ctypes.CDLL(path), ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        if not all(hasattr(mvec, _vector(name, isa, lanes)) for name in ARITY
                   for isa, lanes in found):
            return ()
        ll.load_library_permanently(path)
    except OSError:
        return ()
    for name in ARITY:
        ll.add_symbol(PREFIX + name, ctypes.cast(getattr(libm, name), ctypes.c_void_p).value)
    return tuple(found)


def _vector(name: str, isa: str, lanes: int) -> str:
    return f"_ZGV{isa}N{lanes}{'v' * ARITY[name]}_{name}"


def prelude(text: str) -> str | None:
    """A module declaring the rvm_vmath_ functions `text` (a module's IR) calls, with their
    vector variants, to link that module into; None if it calls none."""
    names = [n for n in ARITY if f"{PREFIX}{n}" in text]
    if not names:
        return None
    out, used = [], []
    for k, name in enumerate(names):
        args = ", ".join(["double"] * ARITY[name])
        abi = ",".join(f"_ZGV_LLVM_N{lanes}{'v' * ARITY[name]}_{PREFIX}{name}"
                       f"({_vector(name, isa, lanes)})" for isa, lanes in variants())
        out.append(f'declare double @{PREFIX}{name}({args}) #{k}')
        out.append(f'attributes #{k} = {{ nounwind willreturn memory(none) '
                   f'"vector-function-abi-variant"="{abi}" }}')
        for isa, lanes in variants():
            vector = _vector(name, isa, lanes)
            vt = f"<{lanes} x double>"
            out.append(f"declare {vt} @{vector}({', '.join([vt] * ARITY[name])})")
            used.append(f"ptr @{vector}")
    out.append(f"@llvm.compiler.used = appending global [{len(used)} x ptr] "
               f"[{', '.join(used)}], section \"llvm.metadata\"")
    return "\n".join(out) + "\n"
