"""The elementary functions of the array instructions' element loops, one implementation
for every engine: glibc's vector math library (libmvec) where this machine has it, libm
where not (a part of the back end, rvm.engines.llvm, that rvm.engines.arrays also uses).

An array instruction's element loop in native code (rvm.engines.arraylowering) calls exp,
log, sin, cos, tanh, pow and atan2 as rvm_vmath_<name>, a scalar function of a small
module compiled once per process (`kernels`). For exp, log, sin, cos and tanh it runs
libmvec's vector function for this CPU (AVX-512: 8 lanes, else AVX2: 4) with the value in
its first lane, and is declared with that vector function in LLVM's vector-function ABI
attribute, so that LLVM's loop vectoriser calls the vector function on 4 or 8 elements at
once and the scalar function on the elements left over. A lane's result depends on its
own value only, so every element gets the same value whichever path it takes. pow and
atan2 (and all seven without libmvec) are libm's. The interpreter and the python engine
evaluate the same functions on whole arrays through the same module's array kernels: the
engines agree to the bit, so an ancilla one engine computed, another takes back exactly
(the machine hands a failing native run to the interpreter midway). Scalar instructions
call libm on every engine, as before.

libmvec's functions are accurate to a few units in the last place, not correctly rounded:
an array instruction's elementwise values may differ from numpy's and libm's there. Where
llvmlite is not installed (no native engine), arrays.py uses numpy's functions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import sys
import threading

import numpy as np

PREFIX = "rvm_vmath_"
ARITY = {"exp": 1, "log": 1, "sin": 1, "cos": 1, "tanh": 1, "pow": 2, "atan2": 2}
# the ones run by libmvec where there is one: its pow and atan2 cost more than libm's on
# small arrays (each element left over a whole vector call: 49 ns for pow), and with a
# negative base pow hands every lane to libm anyway; they stay libm's, called through the
# kernels so that LLVM cannot simplify them in one engine and not in another
VECTORISED = ("exp", "log", "sin", "cos", "tanh")
LOCK = threading.Lock()     # LLVM's global context: one thread at a time (rvm.engines.llvm)
# (ISA letter of the x86-64 vector ABI, lanes, the CPU feature it needs), widest first
_VARIANTS = (("e", 8, "avx512f"), ("d", 4, "avx2"))


def _vector(name: str, isa: str, lanes: int) -> str:
    return f"_ZGV{isa}N{lanes}{'v' * ARITY[name]}_{name}"


@functools.cache
def variant() -> tuple | None:
    """(ISA letter, lanes) of the libmvec functions this machine runs, or None (not glibc
    on x86-64, no libmvec, or a CPU without AVX2). Loads libmvec on first call."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    import llvmlite.binding as ll
    features = ll.get_host_cpu_features()
    found = next(((isa, lanes) for isa, lanes, need in _VARIANTS if features.get(need)),
                 None)
    if found is None:
        return None
    path = ctypes.util.find_library("mvec") or "libmvec.so.1"
    try:
        mvec = ctypes.CDLL(path)
        if not all(hasattr(mvec, _vector(name, *found)) for name in VECTORISED):
            return None
        ll.load_library_permanently(path)
    except OSError:
        return None
    return found


def _kernels_ir(found: tuple | None) -> str:
    """rvm_vmath_<name>(args) and rvm_vmath_<name>_array(args..., out, n) for each
    function: libmvec's vector function (found) with the value in its first lane, or
    libm's function; the array kernel runs the vector function on full groups of lanes
    and the scalar one on the rest."""
    out = []
    for name, k in ARITY.items():
        lanes = found[1] if found is not None and name in VECTORISED else 1
        vt = f"<{lanes} x double>"
        vec = _vector(name, found[0], lanes) if lanes > 1 else None
        params = ", ".join(f"double %a{i}" for i in range(k))
        out.append(f"define double @{PREFIX}{name}({params}) {{")
        if vec is None and name == "pow":    # (a square as a product: exact, and as
            # fast as the x * x LLVM makes of pow(x, 2.0) where it sees the constant)
            out.append("  %sq = fcmp oeq double %a1, 2.0\n  br i1 %sq, label %square, "
                       "label %general\nsquare:\n  %m = fmul double %a0, %a0\n"
                       "  ret double %m\ngeneral:\n  %r = call double @pow(double %a0, "
                       "double %a1)\n  ret double %r\n}")
            out.append("declare double @pow(double, double)")
        elif vec is None:
            out.append(f"  %r = call double @{name}({params})\n  ret double %r\n}}")
            out.append(f"declare double @{name}({', '.join(['double'] * k)})")
        else:
            ones = "<" + ", ".join(["double 1.0"] * lanes) + ">"
            for i in range(k):      # (1.0 in the other lanes: no function's special case,
                # which libmvec hands to libm lane by lane: a splat of a negative base
                # made pow call libm's pow on every lane)
                out.append(f"  %v{i} = insertelement {vt} {ones}, double %a{i}, i32 0")
            args = ", ".join(f"{vt} %v{i}" for i in range(k))
            out.append(f"  %r = call {vt} @{vec}({args})\n"
                       f"  %e = extractelement {vt} %r, i32 0\n  ret double %e\n}}")
            out.append(f"declare {vt} @{vec}({', '.join([vt] * k)})")
        ptrs = ", ".join(f"ptr %p{i}" for i in range(k))
        loads = "\n".join(f"  %q{i} = getelementptr double, ptr %p{i}, i64 %i\n"
                          f"  %x{i} = load double, ptr %q{i}" for i in range(k))
        xs = ", ".join(f"double %x{i}" for i in range(k))
        # the whole groups of lanes, then one element at a time
        vector_part = ""
        if vec is not None:
            vloads = "\n".join(f"  %g{i} = getelementptr double, ptr %p{i}, i64 %j\n"
                               f"  %w{i} = load {vt}, ptr %g{i}, align 8" for i in range(k))
            vargs = ", ".join(f"{vt} %w{i}" for i in range(k))
            vector_part = f"""
  %full = and i64 %n, -{lanes}
  br label %vhead
vhead:
  %j = phi i64 [0, %entry], [%j1, %vbody]
  %vmore = icmp slt i64 %j, %full
  br i1 %vmore, label %vbody, label %tail
vbody:
{vloads}
  %vr = call {vt} @{vec}({vargs})
  %vo = getelementptr double, ptr %out, i64 %j
  store {vt} %vr, ptr %vo, align 8
  %j1 = add i64 %j, {lanes}
  br label %vhead
tail:"""
        start = "%full" if vec is not None else "0"
        came = "%tail" if vec is not None else "%entry"
        out.append(f"""define void @{PREFIX}{name}_array({ptrs}, ptr %out, i64 %n) {{
entry:{vector_part}
  br label %head
head:
  %i = phi i64 [{start}, {came}], [%i1, %body]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
{loads}
  %y = call double @{PREFIX}{name}({xs})
  %o = getelementptr double, ptr %out, i64 %i
  store double %y, ptr %o
  %i1 = add i64 %i, 1
  br label %head
done:
  ret void
}}""")
    return "\n".join(out) + "\n"


_MADE: list = []                # [the kernels' engine, or None], once made
_MAKING = threading.Lock()      # (one thread makes them; the others wait for it)


def kernels():
    """The compiled kernels (an execution engine), with rvm_vmath_<name> bound for native
    modules to call; None without llvmlite (or one too old for the native engine). Made
    once per process (threads asking at once wait for the first: an engine made twice
    freed the code the first one's callers held)."""
    if not _MADE:
        with _MAKING:
            if not _MADE:
                _MADE.append(_make_kernels())
    return _MADE[0]


def _make_kernels():
    try:
        import llvmlite.binding as ll
    except ImportError:     # (no native engine: numpy's functions)
        return None
    if not hasattr(ll, "create_pass_builder"):
        return None
    try:
        ll.initialize_native_target()
        ll.initialize_native_asmprinter()
        with LOCK:
            tm = ll.Target.from_default_triple().create_target_machine(
                cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(),
                opt=2, codemodel="jitdefault")
            mod = ll.parse_assembly(_kernels_ir(variant()))
            mod.verify()
            engine = ll.create_mcjit_compiler(mod, tm)
            engine.finalize_object()
    except Exception as exc:    # (a fault of this module's: said, and numpy's functions)
        import warnings
        warnings.warn(f"rvm could not compile its vector math kernels ({exc}); array "
                      "instructions use numpy's functions and libm's", stacklevel=2)
        return None
    for name in ARITY:
        ll.add_symbol(PREFIX + name, engine.get_function_address(PREFIX + name))
    return engine


@functools.cache
def array_function(name: str):
    """The function `name` of ARITY over numpy arrays (broadcast against each other) as
    native code computes it element by element, or None without the kernels."""
    engine = kernels()
    if engine is None:
        return None
    k = ARITY[name]
    kernel = ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * (k + 1), ctypes.c_int64)(
        engine.get_function_address(f"{PREFIX}{name}_array"))

    def run(*args):
        args = [a if type(a) is np.ndarray else np.asarray(a, dtype=np.float64)
                for a in args]
        shape = args[0].shape
        if k == 2 and args[1].shape != shape:
            shape = args[1].shape if not shape else \
                shape if not args[1].shape else np.broadcast_shapes(shape, args[1].shape)
        flat = []           # (contiguous float64 arrays of the shape, a scalar filled in,
        for a in args:      # each held here until the kernel has read it)
            if a.shape != shape:
                a = np.full(shape, a, dtype=np.float64) if a.ndim == 0 else \
                    np.broadcast_to(a, shape)
            if a.dtype != np.float64 or not a.flags.c_contiguous:
                a = np.ascontiguousarray(a, dtype=np.float64)
            flat.append(a)
        out = np.empty(shape)
        kernel(*(a.__array_interface__["data"][0] for a in flat),
               out.__array_interface__["data"][0], out.size)
        return out if out.ndim else out[()]
    run.__name__, run.engine = name, engine     # (the code lives as long as the function)
    return run


def prelude(text: str) -> str | None:
    """A module declaring the rvm_vmath_ functions `text` (a module's IR) calls, pure, the
    vectorised ones with their vector variant, to link that module into; None if it calls
    none."""
    found = variant()
    names = [n for n in ARITY if f"{PREFIX}{n}" in text]
    if not names:
        return None
    out, used = [], []
    for k, name in enumerate(names):
        attrs = "nounwind willreturn memory(none)"
        if found is not None and name in VECTORISED:
            vt, vector = f"<{found[1]} x double>", _vector(name, *found)
            attrs += (f' "vector-function-abi-variant"="_ZGV_LLVM_N{found[1]}v_{PREFIX}{name}'
                      f'({vector})"')
            out.append(f"declare {vt} @{vector}({vt})")
            used.append(f"ptr @{vector}")
        out.append(f"declare double @{PREFIX}{name}({', '.join(['double'] * ARITY[name])}) "
                   f"#{k}")
        out.append(f"attributes #{k} = {{ {attrs} }}")
    if used:
        out.append(f"@llvm.compiler.used = appending global [{len(used)} x ptr] "
                   f"[{', '.join(used)}], section \"llvm.metadata\"")
    return "\n".join(out) + "\n"


def require() -> None:
    """For native element loops, which call the rvm_vmath_ functions (the kernels' own,
    the ones of VECTORISED vectorised where there is libmvec): the kernels made. Where
    they cannot be, native code cannot be made of an element loop that needs them (a
    RuntimeError: the machine runs the program on the python engine, which, like the
    interpreter, then uses numpy's functions)."""
    if kernels() is None:
        raise RuntimeError("rvm's vector math kernels could not be made")
