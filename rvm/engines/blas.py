"""The BLAS routines every engine's matrix products call: cblas_dgemm and cblas_ddot of the
OpenBLAS that numpy's wheels ship (scipy-openblas, ILP64: 64-bit integers). Native code
calls them by address (rvm.engines.llvm binds them to the symbols rvm.engines.arraylowering
declares); the interpreter and the python engine call the same ones through ctypes
(rvm.engines.arrays: ArrayOps._gemm), so that a product rounds alike on every engine.
Where no such library is found, a stand-in with numpy takes their place, for every engine
alike.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import numpy as np

# cblas_dgemm(layout, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
GEMM = ctypes.CFUNCTYPE(None, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
                        ctypes.c_int64, ctypes.c_int64, ctypes.c_double, ctypes.c_void_p,
                        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_double,
                        ctypes.c_void_p, ctypes.c_int64)
# cblas_ddot(n, x, incx, y, incy)
DOT = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                       ctypes.c_void_p, ctypes.c_int64)
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


def _find(routine: str, fallback) -> int:
    """The address of cblas_<routine> taking 64-bit integers, else of the stand-in."""
    root = os.path.dirname(os.path.dirname(np.__file__))
    for path in sorted(glob.glob(os.path.join(root, "numpy.libs", "*openblas*")) +
                       glob.glob(os.path.join(root, "scipy_openblas64", "lib", "*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in (f"scipy_cblas_{routine}64_", f"cblas_{routine}64_"):
            if hasattr(lib, name):
                return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
    return ctypes.cast(fallback, ctypes.c_void_p).value


@functools.cache
def gemm_address() -> int:
    return _find("dgemm", FALLBACK_GEMM)


@functools.cache
def dot_address() -> int:
    return _find("ddot", FALLBACK_DOT)


@functools.cache
def gemm():
    """cblas_dgemm as a Python function (ctypes)."""
    return GEMM(gemm_address())


@functools.cache
def dot():
    """cblas_ddot as a Python function (ctypes)."""
    return DOT(dot_address())


def _matrix(address: int, rows: int, cols: int, ld: int, transposed: bool) -> np.ndarray:
    r, c = (cols, rows) if transposed else (rows, cols)
    buf = (ctypes.c_double * ((r - 1) * ld + c)).from_address(address)
    out = np.lib.stride_tricks.as_strided(np.frombuffer(buf), (r, c), (8 * ld, 8))
    return out.T if transposed else out


@GEMM
def FALLBACK_GEMM(layout, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """cblas_dgemm (row major) with numpy, where no BLAS library was found."""
    if not (m and n):
        return
    out = _matrix(c, m, n, ldc, False)
    product = alpha * (_matrix(a, m, k, lda, ta == TRANS) @ _matrix(b, k, n, ldb, tb == TRANS)) \
        if k else np.zeros((m, n))
    if beta == 0.0:
        out[...] = product
    else:
        out *= beta
        out += product


@DOT
def FALLBACK_DOT(n, x, incx, y, incy):
    """cblas_ddot with numpy, where no BLAS library was found."""
    if n <= 0:
        return 0.0

    def vector(address, inc):
        buf = (ctypes.c_double * ((n - 1) * inc + 1)).from_address(address)
        return np.frombuffer(buf)[::inc]
    return float(vector(x, incx) @ vector(y, incy))
