"""The native engine: the compiled engine's generated functions, compiled to machine code
with numba (an optional extra: pip install 'rvm[fast]').

The source is the compiled engine's, rewritten for numba: the heap becomes numpy arrays
(int64 and float64 views of one buffer, gradient shadows, and a two-element array holding
the top of the heap and the run's remaining step budget); int64 arithmetic wraps natively;
failed checks raise a constant message, and the machine then re-runs the pass on the
interpreter to report the exact instruction (as for the compiled engine).
"""

from __future__ import annotations

import math
import re

import numpy as np

from .templates import Fault, dpow_db, sign

try:
    import numba
except ImportError:        # the native engine is optional
    numba = None

available = numba is not None

_REWRITES = [
    (re.compile(r"(\S+) = _v if -9223372036854775808 <= _v <= 9223372036854775807 "
                r"else wrap\(_v\)"), r"\1 = _v"),
    (re.compile(r"raise Fault\(f?(['\"]).*\1\)$"), "raise Fault('invertibility check failed')"),
    (re.compile(r"raise Limit\((['\"]).*\1\)$"), "raise Fault('step budget exhausted')"),
    (re.compile(r"M\.alloc\("), "alloc(HI, TOP, "),
    (re.compile(r"M\.free\("), "free(HI, HF, HG, TOP, "),
    (re.compile(r"M\.push\((f\w*)\)"), r"push(HF, TOP, \1)"),
    (re.compile(r"M\.push\((r\w*)\)"), r"push(HI, TOP, \1)"),
    (re.compile(r"M\.pop\(True\)"), "pop(HF, HI, TOP)"),
    (re.compile(r"M\.pop\(False\)"), "pop(HI, HI, TOP)"),
    (re.compile(r"M\.gpush\("), "gpush(HF, HG, TOP, "),
    (re.compile(r"M\.gpop\(True\)"), "gpop(HI, HF, HG, TOP)"),
    (re.compile(r"M\.hf\b"), "HF"), (re.compile(r"M\.hi\b"), "HI"),
    (re.compile(r"M\.hg\b"), "HG"), (re.compile(r"M\.top\b"), "TOP[0]"),
    (re.compile(r"M\.budget\b"), "TOP[1]"), (re.compile(r"M\.tol\b"), "TOL"),
    (re.compile(r"zero\("), "zero(TOL, "),
    (re.compile(r"\(M, "), "(HI, HF, HG, TOP, "),
    (re.compile(r"math\.fmod\("), "np.fmod("),          # numba has no math.fmod
]


def rewrite(line: str) -> str:
    for pattern, repl in _REWRITES:
        line = pattern.sub(repl, line)
    return line


# heap helpers, mirroring rvm.engines.machine.Machine (capacity is the arrays' length)
def _alloc(HI, TOP, n):
    base = TOP[0]
    if n < 0 or n > HI.shape[0] - base:          # (base + n could overflow)
        raise Fault("heap capacity exceeded")
    TOP[0] = base + n
    return base


def _free(HI, HF, HG, TOP, d, n):
    if n < 0 or d != TOP[0] - n:
        raise Fault("FREE of a block that is not the top block")
    for c in range(d, TOP[0]):
        if HI[c] != 0 and not (2.2250738585072014e-308 <= abs(HF[c]) <= 1e-8):
            raise Fault("FREE of a cell that is not zero")
    for c in range(d, TOP[0]):
        HI[c] = 0
        HG[c] = 0.0
    TOP[0] = d


def _push(view, TOP, v):
    """Push v onto the heap top through view (the int64 or the float64 view)."""
    if TOP[0] >= view.shape[0]:
        raise Fault("heap capacity exceeded")
    view[TOP[0]] = v
    TOP[0] += 1


def _pop(view, HI, TOP):
    """Pop the heap top through view, leaving the cell zero."""
    if TOP[0] == 0:
        raise Fault("POP from an empty heap")
    TOP[0] -= 1
    v = view[TOP[0]]
    HI[TOP[0]] = 0
    return v


def _gpush(HF, HG, TOP, v, g):
    _push(HF, TOP, v)
    HG[TOP[0] - 1] = g


def _gpop(HI, HF, HG, TOP):
    g = HG[TOP[0] - 1] if TOP[0] > 0 else 0.0
    v = _pop(HF, HI, TOP)
    HG[TOP[0]] = 0.0
    return v, g


def _zero(tol, v):
    return abs(v) <= tol


def _wrap(v):
    return v


if numba is not None:      # compile the helpers once, callees before their callers
    _jit = numba.njit(cache=False)
    _alloc, _free, _push, _pop = (_jit(f) for f in (_alloc, _free, _push, _pop))
    _gpush, _gpop, _zero, _wrap = (_jit(f) for f in (_gpush, _gpop, _zero, _wrap))
    sign, dpow_db = _jit(sign), _jit(dpow_db)

HELPERS = {"alloc": _alloc, "free": _free, "push": _push, "pop": _pop,
           "gpush": _gpush, "gpop": _gpop, "zero": _zero,
           "sign": sign, "dpow_db": dpow_db, "wrap": _wrap}


def build(functions_source: str, names: list[str], tol: float) -> dict:
    """numba-compile generated functions (module-level defs) into dispatchers by name."""
    if numba is None:
        raise ImportError("numba is not installed")
    jit = numba.njit(cache=False)
    namespace: dict = {"math": math, "np": np, "Fault": Fault, "TOL": tol,
                       **HELPERS,
                       # a program that never touches the heap gets these (never used)
                       "NO_HI": np.zeros(1, np.int64), "NO_HF": np.zeros(1),
                       "NO_HG": np.zeros(1), "NO_TOP": np.zeros(1, np.int64)}
    exec(compile(functions_source, "<rvm native>", "exec"), namespace)
    for name in names:
        namespace[name] = jit(namespace[name])   # compiled lazily, on the first call
    return {name: namespace[name] for name in names}
