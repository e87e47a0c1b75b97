"""The array instructions (VADD/VSUB and their families, VMADD/VMSUB, VMUL/VDIV, VSWAP,
VNEG): values against numpy, the inverse, gradients against closed forms and finite
differences, every engine, the assembly and bytecode round trips, and the checks made
once per instruction (shape, bounds, overlap, repeated cells)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import rvm
from rvm.core import isa
from rvm.formats import bytecode

QUADRATIC = """
.func q(f0, r2, r3, r4, r5, r6)         ; f0 += x . (M x), through a block t = M x
  ALLOC r7, r6
  ALLOC r8, 1
  VMADD [r7 : 1, 0], [r2 : r4, 1], [r5 : 1, 0], r3, r4, 1
  VMADD [r8 : 0, 0], [r5 : 0, 1], [r7 : 1, 0], 1, r6, 1
  ADDM f0, [r8]
  VMSUB [r8 : 0, 0], [r5 : 0, 1], [r7 : 1, 0], 1, r6, 1
  VMSUB [r7 : 1, 0], [r2 : r4, 1], [r5 : 1, 0], r3, r4, 1
  FREE r8, 1
  FREE r7, r6
.end
.func th(f0, r5, r6)                    ; f0 += sum(tanh(x))
  ALLOC r8, 1
  VADD.tanh [r8 : 0, 0], [r5 : 0, 1], 1, r6
  ADDM f0, [r8]
  VSUB.tanh [r8 : 0, 0], [r5 : 0, 1], 1, r6
  FREE r8, 1
.end
"""

ENGINES = ["interp", "python", "native"]
rng = np.random.default_rng(7)


def program(body: str) -> rvm.Program:
    """f(Y, A, B, f0): Y, A and B 2-D arrays (base, rows, columns)."""
    return rvm.assemble(f".func f(r0, r1, r2, r3, r4, r5, r6, r7, r8, f0)\n{body}\n.end\n")


def run(p, engine, Y, A, B, c=0.5, backward=False):
    m = rvm.Machine(p, engine=engine)
    go = m.uncall if backward else m.call
    out = go("f", Y, A, B, c)
    return [np.asarray(x) for x in out[:3]] + [out[3]]


# y (r0, 3 x 4), a (r3), b (r6); row-major views: [base : columns, 1]
FAMILY_CASES = [
    ("VADD [r0 : r2, 1], [r3 : r5, 1], r1, r2", lambda Y, A, B, c: Y + A),
    ("VSUB.mul [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], r1, r2", lambda Y, A, B, c: Y - A * B),
    ("VADD.mul [r0 : r2, 1], f0, [r3 : r5, 1], r1, r2", lambda Y, A, B, c: Y + c * A),
    ("VADD.exp [r0 : r2, 1], [r3 : r5, 1], r1, r2", lambda Y, A, B, c: Y + np.exp(A)),
    ("VADD.div [r0 : r2, 1], 1.0, [r6 : r8, 1], r1, r2", lambda Y, A, B, c: Y + 1.0 / B),
    ("VADD.pow [r0 : r2, 1], [r6 : r8, 1], 2.5, r1, r2", lambda Y, A, B, c: Y + B ** 2.5),
    # broadcasting: row 0 of a against every row (a row stride of 0), and a sum
    ("VADD.sin [r0 : r2, 1], [r3 : 0, 1], r1, r2", lambda Y, A, B, c: Y + np.sin(A[0])),
    ("VADD.tanh [r0 : 0, 0], [r3 : r5, 1], r1, r2",
     lambda Y, A, B, c: Y + np.where(np.arange(Y.size).reshape(Y.shape) == 0,
                                     np.tanh(A).sum(), 0.0)),
    # the transpose of a 4 x 3 block of b (3 x 4 read with strides 1, r8)
    ("VADD.atan2 [r0 : r2, 1], [r3 : r5, 1], [r6 : 1, r8], 3, 3",
     lambda Y, A, B, c: Y + np.pad(np.arctan2(A[:3, :3], B[:3, :3].T), ((0, 0), (0, 1)))),
    # Python's max and min, element by element (no ties in these data)
    ("VADD.max [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], r1, r2",
     lambda Y, A, B, c: Y + np.maximum(A, B)),
    ("VSUB.min [r0 : r2, 1], [r3 : r5, 1], 0.5, r1, r2", lambda Y, A, B, c: Y - np.minimum(A, 0.5)),
]


def data():
    Y = rng.normal(size=(3, 4))
    A = rng.normal(size=(3, 4))
    B = rng.uniform(0.5, 2.0, size=(3, 4))
    return Y, A, B


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body,want", FAMILY_CASES, ids=[c[0].split()[0] + str(k)
                                                          for k, c in enumerate(FAMILY_CASES)])
def test_accumulations_match_numpy_and_invert(body, want, engine):
    p = program(body)
    Y, A, B = data()
    out = run(p, engine, Y, A, B)
    assert np.allclose(out[0], want(Y, A, B, 0.5), rtol=1e-13, atol=1e-13)
    assert np.array_equal(out[1], A) and np.array_equal(out[2], B)
    back = run(p, engine, out[0], A, B, backward=True)
    assert np.allclose(back[0], Y, rtol=1e-13, atol=1e-13)


PRODUCTS = [
    # y (3 x 4) += a (3 x 3 block) @ b (3 x 4)
    ("VMADD [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], 3, 3, 4",
     lambda Y, A, B: Y + A[:, :3] @ B),
    # y (3 x 3 block) -= a @ b.T: b (3 x 4) read as 4 x 3
    ("VMSUB [r0 : r2, 1], [r3 : r5, 1], [r6 : 1, r8], 3, 4, 3",
     lambda Y, A, B: Y - np.pad(A @ B.T, ((0, 0), (0, 1)))),
    # a dot product into y[0, 0]: row 0 of a with row 1 of b
    ("VMADD [r0 : 0, 0], [r3 : 0, 1], [r6 + r8 : 1, 0], 1, 4, 1",
     lambda Y, A, B: Y + np.where(np.arange(12).reshape(3, 4) == 0, A[0] @ B[1], 0.0)),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body,want", PRODUCTS, ids=["gemm", "gemm_t", "dot"])
def test_products_match_numpy_and_invert(body, want, engine):
    p = program(body)
    Y, A, B = data()
    out = run(p, engine, Y, A, B)
    assert np.allclose(out[0], want(Y, A, B), rtol=1e-13, atol=1e-13)
    back = run(p, engine, out[0], A, B, backward=True)
    assert np.allclose(back[0], Y, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_scale_swap_and_negate(engine):
    p = program("VMUL [r0 : r2, 1], f0, r1, r2\nVDIV [r3 : r5, 1], 4.0, r4, r5\n"
                "VSWAP [r0 : r2, 1], [r6 : r8, 1], 2, 4\nVNEG [r6 : r8, 1], r7, r8")
    Y, A, B = data()
    out = run(p, engine, Y, A, B, c=-3.0)
    Y2, B2 = Y * -3.0, B.copy()
    Y2[:2], B2[:2] = B[:2], Y2[:2].copy()
    assert np.allclose(out[0], Y2) and np.allclose(out[1], A / 4.0) and np.allclose(out[2], -B2)
    back = run(p, engine, *out[:3], c=-3.0, backward=True)
    assert np.allclose(back[0], Y) and np.allclose(back[1], A) and np.allclose(back[2], B)


def fd_gradient(p, loss_at, args, k, h=1e-6):
    """d loss / d args[k] by central differences (loss: Y[loss_at] after f)."""
    x = np.array(args[k], dtype=float)
    g = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        vals = []
        for step in (h, -h):
            moved = list(args)
            xk = x.copy()
            if xk.shape:
                xk[idx] += step
            else:
                xk = xk + step
            moved[k] = xk if xk.shape else float(xk)
            vals.append(run(p, "interp", *moved)[0][loss_at])
        g[idx] = (vals[0] - vals[1]) / (2 * h)
    return g


GRADIENT_CASES = [FAMILY_CASES[2], FAMILY_CASES[3], FAMILY_CASES[4], FAMILY_CASES[5],
                  FAMILY_CASES[7], FAMILY_CASES[8], *FAMILY_CASES[-2:], PRODUCTS[0], PRODUCTS[1],
                  ("VMUL [r0 : r2, 1], f0, r1, r2", None), ("VDIV [r0 : r2, 1], f0, r1, r2", None),
                  ("VMADD [r0 : r2, 1], [r3 : r5, 1], [r6 : r8, 1], 3, 3, 4\n"
                   "VSWAP [r0 : r2, 1], [r6 : r8, 1], 3, 4\nVNEG [r3 : r5, 1], 3, 4", None)]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body", [c[0] for c in GRADIENT_CASES],
                         ids=[c[0].split()[0] + str(k) for k, c in enumerate(GRADIENT_CASES)])
def test_gradients_match_finite_differences(body, engine):
    p = program(body)
    Y, A, B = data()
    args = [Y, A, B, 0.7]
    loss = (0, 5)                           # Y[1, 1] (flat index 5)
    grads = rvm.grad(p["f"], loss=loss, engine=engine)(*args)
    for k in range(4):
        want = fd_gradient(p, (1, 1), args, k)
        assert np.allclose(grads[k], want, rtol=1e-5, atol=1e-6), (k, grads[k], want)


def test_gemv_gradient_is_the_closed_form():
    # y (3) += A (3 x 4) @ x (4): dy[i]/dA = x in row i, dy[i]/dx = A[i]
    p = rvm.assemble(".func f(r0, r1, r2, r3, r4, r5, r6)\n"
                     "VMADD [r0 : 1, 0], [r2 : r4, 1], [r5 : 1, 0], r3, r4, 1\n.end\n")
    A, x = rng.normal(size=(3, 4)), rng.normal(size=4)
    gy, gA, gx = rvm.grad(p["f"], loss=(0, 2))(np.zeros(3), A, x)
    assert np.allclose(gA, np.outer([0, 0, 1], x)) and np.allclose(gx, A[2])
    assert np.array_equal(gy, [0, 0, 1])


def test_assembly_and_bytecode_round_trips():
    text = ".func f(r0, r1, r2, r3)\n    VADD.mul [r0 + r1 : r2, -1], f1, [r3 + 4 : 0, r2], " \
           "r2, 3\n    ADD f1, 2.0\n    SUB f1, 2.0\n.end\n"
    p = rvm.assemble(text)
    view = p.functions["f"].code[0].args[0]
    assert str(view) == "[r0 + r1 : r2, -1]"
    again = rvm.assemble(rvm.disassemble(p))
    assert again.functions["f"].code == p.functions["f"].code
    assert bytecode.loads(bytecode.dumps(p)).functions["f"].code == p.functions["f"].code


def test_bytecode_of_the_table_before_the_array_instructions_still_reads():
    import struct
    import zlib
    p = rvm.assemble(".func f(f0)\n    ADD f0, 1.0\n.end\n")
    data = bytearray(bytecode.dumps(p))
    first = next(k for k, s in enumerate(isa.TABLE) if s.group == "array")
    old = zlib.crc32("\n".join(s.name for s in isa.TABLE[:first]).encode())
    struct.pack_into("<I", data, 6, old)            # the header's isa-id
    assert bytecode.loads(bytes(data)).functions["f"].code == p.functions["f"].code


@pytest.mark.parametrize("text,message", [
    ("VADD [r0], f0, 1, 1", "must be a view"),
    ("VADD [r0 : f1, 1], f0, 1, 1", "integer registers"),
    ("ADD f0, [r0 : 1, 1]", "must be a register or an immediate"),
    ("EXCH f0, [r0 : 1, 1]", "array instructions only"),
    ("VMADD [r0 : 1, 0], f0, [r1 : 1, 0], 1, 1, 1", "must be a view"),
    ("VADD [r0 : 1, 0], f0, -1, 1", "negative"),
])
def test_bad_views_are_refused_when_assembling(text, message):
    with pytest.raises(rvm.RvmError, match=message):
        rvm.assemble(f".func f(r0, r1, f0)\n    {text}\n.end\n")


def test_a_view_without_its_second_stride_is_a_located_syntax_error():
    with pytest.raises(rvm.AsmError) as e:
        rvm.assemble(".func f(r0)\n    VNEG [r0 : 1], 1, 1\n.end\n")
    assert e.value.line == 2 and "stride" in str(e.value)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("body,message", [
    ("VADD [r0 : r2, 1], [r0 + 1 : r2, 1], r1, r2", "overlaps"),       # y[.., 1:] += y[..]
    ("VMADD [r0 : r2, 1], [r0 : r2, 1], [r6 : r8, 1], 3, 3, 4", "overlaps"),
    ("VADD [r6 : r8, 1], [r3 : r5, 1], 4, r2", "outside the heap"),     # 4 rows of 3
    ("VADD [r6 + 8 : 1, 1], [r3 : r5, 1], 1, 5", "outside the heap"),
    ("VNEG [r0 : 0, 1], 2, 2", "names a cell twice"),
    ("VMUL [r0 : r2, 1], 0.0, r1, r2", "scaled by 0"),
    ("VADD.log [r0 : r2, 1], [r3 : r5, 1], r1, r2", "not finite"),      # log of negatives
    ("SUB r9, 1\nVADD [r0 : r2, 1], 1.0, r9, 2\nADD r9, 1", "negative"),
])
def test_bad_views_are_refused_when_running_and_change_nothing(body, message, engine):
    p = program(body)
    Y, A, B = data()
    A[0, 0] = -1.0
    m = rvm.Machine(p, engine=engine)
    with pytest.raises(rvm.RvmError, match=message) as e:
        m.call("f", Y, A, B, 0.5)
    assert "f" in str(e.value)


@pytest.mark.parametrize("engine", ENGINES)
def test_views_whose_cells_interleave_do_not_overlap(engine):
    # column 0 += column 1 of a 3 x 4 matrix: the ranges meet, the cells never do
    p = program("VADD.mul [r0 : r2, 0], f0, [r0 + 1 : r2, 0], r1, 1\n"
                "VADD [r3 : 2, 0], [r3 + 1 : 2, 0], 6, 1")          # even cells += odd
    Y, A, B = data()
    out = run(p, engine, Y, A, B, c=2.0)
    Y2 = Y.copy()
    Y2[:, 0] += 2.0 * Y[:, 1]
    A2 = A.copy().ravel()
    A2[0::2] += A.ravel()[1::2]
    assert np.allclose(out[0], Y2) and np.allclose(out[1].ravel(), A2)
    bad = program("VADD [r3 : 2, 0], [r3 + 2 : 2, 0], 5, 1")     # even += even: shared
    with pytest.raises(rvm.RvmError, match="overlaps"):
        rvm.Machine(bad, engine=engine).call("f", Y, A, B, 1.0)


@pytest.mark.parametrize("target", ["[r0 : 0, 0]", "[r0 : 1, 0]", "[r0 : 0, 1]"])
def test_sums_into_repeated_cells_agree_to_the_bit_and_cancel_exactly(target):
    # a product is rounded alike everywhere: the sums, from 0 in element order, too
    body = f"VADD.mul {target}, [r3 : r5, 1], [r6 : r8, 1], 3, 4"
    Y, A, B = data()
    outs = [run(program(body), e, Y, A, B)[0] for e in ENGINES]
    assert all(np.array_equal(o, outs[0]) for o in outs)
    back = program(body + "\n" + body.replace("VADD", "VSUB"))
    for e in ENGINES:       # from zero: exactly zero again, not nearly
        assert np.array_equal(run(back, e, np.zeros_like(Y), A, B)[0], np.zeros_like(Y))


@pytest.mark.parametrize("body", [c[0] for c in GRADIENT_CASES],
                         ids=[c[0].split()[0] + str(k) for k, c in enumerate(GRADIENT_CASES)])
def test_tangent_programs_match_finite_differences(body):
    # rvm.jvp runs the tangent program: each instruction on the interleaved heap, then
    # its rule (partials lowered into array instructions on temporary blocks)
    p = program(body)
    Y, A, B = data()
    tY, tA, tB = (rng.normal(size=x.shape) for x in (Y, A, B))
    _, tans = rvm.jvp(p["f"], (Y, A, B, 0.7), (tY, tA, tB, 0.3))
    h = 1e-6
    ups = run(p, "interp", Y + h * tY, A + h * tA, B + h * tB, 0.7 + h * 0.3)
    downs = run(p, "interp", Y - h * tY, A - h * tA, B - h * tB, 0.7 - h * 0.3)
    for k in range(3):
        assert np.allclose(tans[k], (ups[k] - downs[k]) / (2 * h), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("body", [c[0] for c in GRADIENT_CASES],
                         ids=[c[0].split()[0] + str(k) for k, c in enumerate(GRADIENT_CASES)])
def test_adjoint_programs_match_the_gradient(body):
    # a scalar operand's shadow takes its sum through a one-cell block
    p = program(body)
    Y, A, B = data()
    ybar = np.zeros_like(Y)
    ybar[1, 1] = 1.0
    out = rvm.adjoint(p["f"])(Y, A, B, 0.7, ybar, np.zeros_like(A), np.zeros_like(B), 0.0)
    grads = rvm.grad(p["f"], loss=(0, 5))(Y, A, B, 0.7)
    for k in range(4):
        assert np.allclose(out[4 + k], grads[k], rtol=1e-9, atol=1e-12)
    assert np.allclose(out[0], Y) and np.array_equal(out[1], A)      # x comes back


@pytest.mark.parametrize("engine", ENGINES)
def test_hessian_vector_products_and_hessians(engine):
    # second order: the tangent of the adjoint program, every rule from the table
    p = rvm.assemble(QUADRATIC)
    M, x, d = rng.normal(size=(4, 4)), rng.normal(size=4), rng.normal(size=4)
    hv = rvm.hvp(p["q"], (0.0, M, x), (0.0, np.zeros((4, 4)), d), loss=0, engine=engine)
    assert np.allclose(hv[2], (M + M.T) @ d)
    H = rvm.hessian(p["th"], loss=0, wrt=[1], engine=engine)(0.0, x)
    t = np.tanh(x)
    assert np.allclose(H, np.diag(-2 * t * (1 - t * t)))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("layout", ["plain", "a transposed", "b transposed"])
@pytest.mark.parametrize("shape", [(40, 50, 30), (9000, 4, 2)], ids=["wide", "narrow"])
def test_large_products_go_through_blas_and_agree(layout, engine, shape):
    # past the size from which native code calls BLAS's dgemm: into C (40 x 50 @ 50 x 30)
    # or, for rows narrower than 8, into blocks of 4,096 rows of its own, then added to C
    # (9000 x 4 @ 4 x 2: three blocks); a transposed operand is a view BLAS reads with
    # its transpose flag
    m, k, n = shape
    A = rng.normal(size=(m, k) if layout != "a transposed" else (k, m))
    B = rng.normal(size=(k, n) if layout != "b transposed" else (n, k))
    a = "[r3 : r5, 1]" if layout != "a transposed" else "[r3 : 1, r5]"
    b = "[r6 : r8, 1]" if layout != "b transposed" else "[r6 : 1, r8]"
    p = program(f"VMADD [r0 : r2, 1], {a}, {b}, {m}, {k}, {n}")
    Y = rng.normal(size=(m, n))
    At = A if layout != "a transposed" else A.T
    Bt = B if layout != "b transposed" else B.T
    out = run(p, engine, Y, A, B)
    assert np.allclose(out[0], Y + At @ Bt, rtol=1e-12, atol=1e-12)
    W = rng.normal(size=(m, n))                # the gradient of sum(W * Y') by adjoints
    seed = rvm.adjoint(p["f"], engine=engine)
    g = seed(Y, A, B, 0.0, W, np.zeros_like(A), np.zeros_like(B), 0.0)
    gA, gB = W @ Bt.T, At.T @ W
    assert np.allclose(g[5], gA if layout != "a transposed" else gA.T)
    assert np.allclose(g[6], gB if layout != "b transposed" else gB.T)
    back = run(p, engine, out[0], A, B, backward=True)
    assert np.allclose(back[0], Y, rtol=1e-12, atol=1e-12)


PRODUCTS = {       # (C's, A's, B's shape), a way native code takes: every engine takes it
    "loops, small": ((3, 3), (3, 5), (5, 3)),
    "a dot product (ddot)": ((1, 1), (1, 20_000), (20_000, 1)),
    "dgemm adding into C": ((32, 40), (32, 16), (16, 40)),
    "dgemm through a block (narrow rows)": ((5000, 3), (5000, 4), (4, 3)),
    "loops, deep but small": ((1, 2), (1, 4000), (4000, 2)),
    "wide and deep, 32 x 32 by 32 x 16": ((32, 16), (32, 32), (32, 16)),
}


@pytest.mark.parametrize("case", PRODUCTS)
def test_products_and_their_gradients_agree_to_the_bit_on_every_engine(case):
    """C += A @ B rounds alike on every engine: the interpreter and the python engine
    call the BLAS routines native code calls, on the same cells, or sum in the same order
    (they had taken numpy's product: 48 of 100 random dot products of 7 elements
    differed in the last place between engines, and a branch on one went the other way
    once the default engine moved to native code). The gradient's two products too, and
    with A transposed."""
    c, a, b = PRODUCTS[case]
    r = np.random.default_rng(7)
    f = rvm.reversible.source("def f(C: Array[float, 2], A: Array[float, 2], "
                              "B: Array[float, 2]):\n    C += A @ B\n", {"Array": rvm.Array})
    g = rvm.reversible.source("def g(C: Array[float, 2], A: Array[float, 2], "
                              "B: Array[float, 2]):\n    C += A.T @ B\n", {"Array": rvm.Array})
    h = rvm.reversible.source("def h(C: Array[float, 2], A: Array[float, 2], "
                              "B: Array[float, 2]):\n    C.T += A @ B\n", {"Array": rvm.Array})
    A, B, C = r.normal(size=a), r.normal(size=b), r.normal(size=c)
    At = np.ascontiguousarray(A.T)
    outs, grads = [], []
    for engine in ENGINES:       # (a transposed target, or operand: a path of their own)
        outs.append((f(C.copy(), A, B, engine=engine)[0], g(C.copy(), At, B, engine=engine)[0],
                     h(np.ascontiguousarray(C.T), A, B, engine=engine)[0]))
        grads.append([rvm.grad(fn, loss=(0, 0), engine=engine)(x, y, B)
                      for fn, x, y in ((f, C.copy(), A), (g, C.copy(), At),
                                       (h, np.ascontiguousarray(C.T), A))])
    for o in outs[1:]:
        assert all(np.array_equal(x, y) for x, y in zip(o, outs[0])), case
    assert np.allclose(outs[0][0], C + A @ B, rtol=1e-12, atol=1e-12)
    for gr in grads[1:]:
        for mine, first in zip(gr, grads[0]):
            assert all(np.array_equal(x, y) for x, y in zip(mine, first)), case


def test_the_stand_in_gemm_matches_numpy():
    # used by every engine where no BLAS with 64-bit integers is found
    import ctypes

    from rvm.engines import blas
    A, B = rng.normal(size=(5, 4)), rng.normal(size=(3, 4))      # C += 2 A @ B.T
    C = rng.normal(size=(5, 3))
    want = C + 2.0 * A @ B.T
    ptr = lambda x: x.ctypes.data_as(ctypes.c_void_p)
    blas.FALLBACK_GEMM(101, 111, 112, 5, 3, 4, 2.0, ptr(A), 4, ptr(B), 4, 1.0, ptr(C), 3)
    assert np.allclose(C, want)
    C[...] = np.nan          # beta 0: C is written, not read
    blas.FALLBACK_GEMM(101, 111, 112, 5, 3, 4, 2.0, ptr(A), 4, ptr(B), 4, 0.0, ptr(C), 3)
    assert np.allclose(C, 2.0 * A @ B.T)


def test_the_stand_in_ddot_matches_numpy():
    import ctypes

    from rvm.engines import blas
    x, y = rng.normal(size=12), rng.normal(size=12)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)
    assert blas.FALLBACK_DOT(4, ptr(x), 3, ptr(y), 2) == pytest.approx(x[::3] @ y[:8:2])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("steps", [(1, 1), (2, 3)])
def test_a_long_dot_product_goes_through_blas_and_agrees(steps, engine, monkeypatch):
    """s += x @ y (a 1 x k by k x 1 product, k past the size from which native code
    calls BLAS): its value, its inverse and its gradient, with its elements next to
    each other or a few cells apart; native code calls ddot for it (dgemm takes 2.3x as
    long), once forwards and once in the gradient pass's undoing."""
    from rvm.engines import llvm
    calls, real = [], llvm.compile_ir
    monkeypatch.setattr(llvm, "compile_ir",
                        lambda text, **kw: (calls.append(text), real(text, **kw))[1])
    k, (sx, sy) = 20_000, steps
    x, y = rng.normal(size=k * sx), rng.normal(size=k * sy)
    p = rvm.assemble(f".func d(r0, r1, r2, r3, r4, r5)\n"
                     f"  VMADD [r0 : 0, 0], [r2 : 0, {sx}], [r4 : {sy}, 0], 1, {k}, 1\n.end\n")
    want = 0.25 + x[::sx] @ y[::sy]
    m = rvm.Machine(p, engine=engine)
    out = m.call("d", np.array([0.25]), x, y)
    assert out[0][0] == pytest.approx(want, rel=1e-12)
    assert m.uncall("d", *out)[0][0] == pytest.approx(0.25, rel=1e-9)
    g = rvm.grad(p["d"], loss=(0, 0), engine=engine)(np.array([0.25]), x, y)
    gx, gy = np.zeros_like(x), np.zeros_like(y)
    gx[::sx], gy[::sy] = y[::sy], x[::sx]
    assert np.array_equal(g[1], gx) and np.array_equal(g[2], gy)
    if engine == "native":
        assert any(f"@\"{llvm.BLAS_DOT}\"(" in text for text in calls)


@pytest.mark.filterwarnings("error")       # (and no overflow warning on the way)
@pytest.mark.parametrize("engine", ENGINES)
def test_array_gradients_too_large_to_square_are_finite_and_one_past_them_is_not(engine):
    # s += x @ w twice: x's gradient is 2 w. The test that gradients are finite squares
    # them first (a dot product): w = 1e160 overflows there and still counts as finite;
    # w = 1e308 makes a gradient that is not (2e308), and x @ w stays finite (w x = 1)
    p = rvm.assemble(".func d(r0, r1, r2, r3, r4, r5)\n"
                     "  VMADD [r0 : 0, 0], [r2 : 0, 1], [r4 : 1, 0], 1, r3, 1\n"
                     "  VMADD [r0 : 0, 0], [r2 : 0, 1], [r4 : 1, 0], 1, r3, 1\n.end\n")
    g = rvm.grad(p["d"], loss=(0, 0), engine=engine)
    k = 5000                                # (past FINITE_BY_DOT: the dot product is tried)
    x, w = np.full(k, 1e-160), np.full(k, 1e160)
    assert np.array_equal(g(np.zeros(1), x, w)[1], 2 * w)
    x[7], w[7] = 1e-308, 1e308
    with pytest.raises(rvm.RvmError, match="not finite"):
        g(np.zeros(1), x, w)


def test_native_code_makes_one_function_per_kind_of_array_instruction(monkeypatch):
    # each array instruction is a call of a function made once per (helper, family,
    # sign, constants): three alike use one, so the IR does not grow by a loop nest per use
    from rvm.engines import llvm
    texts = []
    real = llvm.compile_ir
    monkeypatch.setattr(llvm, "compile_ir",
                        lambda text, **kw: (texts.append(text), real(text, **kw))[1])
    # (+= and -= share one: the sign is a value it is given, as is a constant scalar)
    p = program("VADD.mul [r0 : r2, 1], f0, [r3 : r5, 1], r1, r2\n"
                "VADD.mul [r0 : r2, 1], f0, [r6 : r8, 1], r1, r2\n"
                "VADD.mul [r6 : r8, 1], f0, [r3 : r5, 1], r1, r2\n"
                "VSUB.mul [r0 : r2, 1], 2.0, [r3 : r5, 1], r1, r2\n"
                "VADD.exp [r0 : r2, 1], [r3 : r5, 1], r1, r2")
    Y, A, B = data()
    out = run(p, "native", Y, A, B, 0.5)
    assert np.allclose(out[0], Y + 0.5 * A + 0.5 * B - 2.0 * A + np.exp(A))
    text = "".join(texts)
    helpers = re.findall(r'define internal double @"?(rvm_array_vacc_\w+)', text)
    assert len(helpers) == 2 and text.count(f"@{helpers[0]}(") + \
        text.count(f'@"{helpers[0]}"(') >= 4
    assert np.allclose(run(p, "native", *out[:3], 0.5, backward=True)[0], Y)


@pytest.mark.parametrize("text", ["VNEG [r0 : 1e3, 1], 1, 1", "VNEG [r0 : 1, 2.0], 1, 1",
                                  "EXCH f0, [r0 + 1e3]", "EXCH f0, [r0 - 2.5]"])
def test_a_float_for_an_offset_or_a_stride_is_a_located_syntax_error(text):
    # (1e3 was taken as the float 1000.0)
    with pytest.raises(rvm.AsmError) as e:
        rvm.assemble(f".func f(r0, f0)\n    {text}\n.end\n")
    assert e.value.line == 2 and ("offset" in str(e.value) or "stride" in str(e.value))


@pytest.mark.parametrize("shape", [(1, 1), (3, 63), (5, 64), (7, 130), (2, 257)])
def test_a_sum_per_column_is_each_columns_sum_in_row_order_on_every_engine(shape):
    # native code sums 64 columns at a time, a vector lane a column: each column's sum is
    # still taken from 0 in the order of the rows (magnitudes far apart: order shows)
    m, n = shape
    A = rng.normal(size=(m, n)) * 10.0 ** rng.uniform(-8, 8, size=(m, n))
    Y = rng.normal(size=(1, n))
    want = Y.copy()
    for j in range(n):
        acc = 0.0
        for i in range(m):
            acc += A[i, j]
        want[0, j] += acc
    p = program("VADD [r0 : 0, 1], [r3 : r5, 1], r4, r5")
    for e in ENGINES:
        assert np.array_equal(run(p, e, Y, A, np.zeros((1, 1)))[0], want), e


def test_an_array_exp_runs_the_vector_math_library_and_is_taken_back_exactly(monkeypatch):
    # an element loop's exp is libmvec's, 8 or 4 elements at a time (one at a time on the
    # rest, the same function): within a few units in the last place of libm's, and its
    # inverse takes back exactly what it added, a sum per column and element by element
    from rvm.engines import llvm, vectormath
    if not (llvm.usable() and vectormath.variant()):
        pytest.skip("needs the native engine and glibc's libmvec")
    objects = []
    real = llvm._compile_ir
    monkeypatch.setattr(llvm, "_compile_ir", lambda text, quick=False:
                        objects.append(real(text, quick)) or objects[-1])
    p = program("VADD.exp [r0 : 0, 1], [r3 : r5, 1], r4, r5\n"
                "VADD.exp [r6 : r8, 1], [r3 : r5, 1], r4, r5")
    A = rng.uniform(-30.0, 30.0, size=(7, 130))
    Y, B = rng.normal(size=(1, 130)), rng.normal(size=(7, 130))
    out = run(p, "native", Y, A, B)
    assert any(re.search(rb"_ZGV[de]N[48]v_exp", o) for o in objects)
    libm = np.vectorize(__import__("math").exp)(A)
    # (within a few units in the last place of the terms: a sum may cancel)
    assert np.all(abs(out[2] - (B + libm)) <= 1e-14 * (abs(B) + libm))
    assert np.all(abs(out[0] - (Y + libm.sum(axis=0))) <= 1e-14 * (abs(Y) + libm.sum(axis=0)))
    zero = run(p, "native", np.zeros_like(Y), A, np.zeros_like(B))
    back = run(p, "native", *zero[:3], backward=True)
    assert np.array_equal(back[0], 0 * Y) and np.array_equal(back[2], 0 * B)


UNARY = ["exp", "log", "sin", "cos", "tanh"]


@pytest.mark.parametrize("fam", UNARY + ["pow", "atan2", "max", "min"])
def test_elementwise_functions_agree_to_the_bit_on_every_engine(fam):
    # one implementation of exp, log, sin, cos, tanh, pow and atan2 for the element loops
    # of every engine (rvm.engines.vectormath), whichever lanes an element falls in: the
    # values, and the gradients' partial derivatives, agree to the bit
    ops = "[r3 : r5, 1]" if fam in UNARY else "[r3 : r5, 1], [r6 : r8, 1]"
    for n in (1, 3, 7, 8, 9, 17, 130):
        p = program(f"VADD.{fam} [r0 : r2, 1], {ops}, r1, r2")
        A = rng.uniform(0.1, 30.0, size=(3, n))
        B = rng.uniform(0.5, 3.0, size=(3, n))
        outs = [run(p, e, np.zeros((3, n)), A, B)[0] for e in ENGINES]
        assert all(np.array_equal(o, outs[0]) for o in outs), (fam, n)
        W = rng.normal(size=(3, n))
        grads = [rvm.adjoint(p["f"], engine=e)(outs[0], A, B, 0.0, W, np.zeros_like(A),
                                               np.zeros_like(B), 0.0) for e in ENGINES]
        for k in (5, 6):
            assert all(np.array_equal(g[k], grads[0][k]) for g in grads), (fam, n, k)


def test_an_ancilla_native_code_made_is_taken_back_exactly_by_the_interpreter():
    # a failed check: native code stops and the interpreter replays from a back edge,
    # uncomputing the array an exp filled natively; it finds the ancilla exactly zero and
    # reports the assertion, as the interpreter's own run does (it found the ancilla not
    # zero where the two computed exp differently: 16 of 40 such inputs)
    p = rvm.assemble("""
.func f(f0, f1, r0, r1, r2, r3)
        ALLOC  r4, r3
        VADD.exp [r4 : 0, 1], [r1 : 0, 1], 1, r3
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
        VSUB.exp [r4 : 0, 1], [r1 : 0, 1], 1, r3
        FREE   r4, r3
        ASSERT.lt f0, 0.0
.end
""")
    draw = np.random.default_rng(0)
    for _ in range(40):
        x = draw.uniform(18.0, 30.0, size=(1, 8))
        for engine in ENGINES:
            m = rvm.Machine(p, engine=engine)
            m.enter("f", 0.0, 100.0, 0, x)
            with pytest.raises(rvm.RvmError, match=r"assertion f0 < 0\.0 failed"):
                m.run()


@pytest.mark.parametrize("shape", [(3, 5, 130), (2000, 3, 2), (1000, 5, 1), (500, 10, 3)],
                         ids=["small", "narrow rows", "a column", "narrow rows, deeper"])
@pytest.mark.parametrize("layout", ["plain", "b transposed"])
@pytest.mark.parametrize("sign", ["VMADD", "VMSUB"])
def test_a_product_below_blas_is_each_elements_sum_in_order_in_native_code(layout, sign,
                                                                          shape):
    # a product under 16,384 multiply-adds goes to loops, 64 elements of a row at a time
    # (a vector lane an element), with rows narrower than 8 64 elements of a column at a
    # time, or one element at a time from an inner dimension of 8: each element's sum is
    # still taken from 0 in the order of the inner index, then added once (magnitudes
    # far apart: order shows)
    m, k, n = shape
    A = rng.normal(size=(m, k)) * 10.0 ** rng.uniform(-8, 8, size=(m, k))
    B = rng.normal(size=(k, n) if layout == "plain" else (n, k))
    Bt = B if layout == "plain" else B.T
    b = "[r6 : r8, 1]" if layout == "plain" else "[r6 : 1, r8]"
    p = program(f"{sign} [r0 : r2, 1], [r3 : r5, 1], {b}, {m}, {k}, {n}")
    Y = rng.normal(size=(m, n))
    acc = np.zeros((m, n))          # (numpy's elementwise operations: the same roundings
    for l_ in range(k):             # as a scalar loop over l, element by element)
        acc += A[:, l_, None] * Bt[None, l_, :]
    want = Y + acc if sign == "VMADD" else Y - acc
    assert np.array_equal(run(p, "native", Y, A, B)[0], want)


def test_cached_native_code_with_array_exp_runs_in_a_fresh_process(tmp_path):
    # native code that calls the element loops' functions, loaded from the on-disk cache
    # by a process that compiled nothing (their symbols are bound before it is loaded)
    from rvm.engines import llvm
    if not llvm.usable():
        pytest.skip("needs the native engine")
    script = ("import numpy as np, rvm\n"
              "from rvm.engines import llvm\n"
              "made, real = [], llvm._compile_ir\n"
              "llvm._compile_ir = lambda text, quick=False: made.append(1) or real(text, quick)\n"
              "p = rvm.assemble('.func g(r0, r1, r2, r3, r4, r5)\\n"
              "  VADD.exp [r0 : 0, 1], [r3 : 0, 1], 1, r5\\n.end\\n')\n"
              "x = np.linspace(-3.0, 3.0, 13).reshape(1, 13)\n"
              "out = rvm.Machine(p, engine='native').call('g', np.zeros((1, 13)), x)[0]\n"
              "ref = rvm.Machine(p, engine='interp').call('g', np.zeros((1, 13)), x)[0]\n"
              "print(np.array_equal(out, ref), len(made))\n")
    runs = [_fresh_process(script, tmp_path) for _ in range(2)]
    assert [r.stdout.split() for r in runs] == [["True", "1"], ["True", "0"]], \
        [r.stderr[-2000:] for r in runs]


def _fresh_process(script: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, RVM_CACHE_DIR=str(tmp_path))
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=120)


def test_threads_first_needing_the_element_functions_at_once_share_one_build(tmp_path):
    # two threads' first array exp and tanh at once on the interpreter: the kernels are
    # made once (made twice, the first build's code was freed under its callers: a crash)
    script = ("import threading, numpy as np, rvm\n"
              "p = rvm.assemble('.func g(r0, r1, r2, r3, r4, r5)\\n"
              "  VADD.exp [r0 : r2, 1], [r3 : r5, 1], r1, r2\\n"
              "  VADD.tanh [r0 : r2, 1], [r3 : r5, 1], r1, r2\\n.end\\n')\n"
              "x = np.linspace(-3.0, 3.0, 1001).reshape(1, -1)\n"
              "bar, out = threading.Barrier(2), []\n"
              "def work():\n"
              "    bar.wait()\n"
              "    for _ in range(3):\n"
              "        y = rvm.Machine(p, engine='interp').call('g', np.zeros_like(x), x)[0]\n"
              "    out.append(bool(np.allclose(y, np.exp(x) + np.tanh(x), rtol=1e-14)))\n"
              "ts = [threading.Thread(target=work) for _ in range(2)]\n"
              "[t.start() for t in ts]; [t.join() for t in ts]\n"
              "print(out)\n")
    for _ in range(2):
        r = _fresh_process(script, tmp_path)
        assert r.returncode == 0 and r.stdout.split() == ["[True,", "True]"], r.stderr[-2000:]


def test_without_the_element_functions_kernels_native_code_goes_to_the_python_engine(
        tmp_path):
    # where the kernels cannot be made (a fault of rvm's, said in a warning) no native code
    # of an element loop that needs them is made (none is cached under the key that says
    # libmvec): the program runs on the python engine, and every engine uses numpy's exp
    from rvm.engines import llvm, vectormath
    if not (llvm.usable() and vectormath.variant()):
        pytest.skip("needs the native engine and glibc's libmvec")
    script = ("import warnings, numpy as np, rvm\n"
              "from rvm.engines import vectormath\n"
              "vectormath._make_kernels = lambda: None\n"
              "p = rvm.assemble('.func g(r0, r1, r2, r3, r4, r5)\\n"
              "  VADD.exp [r0 : r2, 1], [r3 : r5, 1], r1, r2\\n.end\\n')\n"
              "x = np.linspace(-30.0, 30.0, 1001).reshape(1, -1)\n"
              "with warnings.catch_warnings(record=True) as said:\n"
              "    warnings.simplefilter('always')\n"
              "    ys = [rvm.Machine(p, engine=e).call('g', np.zeros_like(x), x)[0]\n"
              "          for e in ('interp', 'python', 'native')]\n"
              "print(all(np.array_equal(y, np.exp(x)) for y in ys),\n"
              "      any('python engine' in str(w.message) for w in said))\n")
    r = _fresh_process(script, tmp_path)
    assert r.stdout.split() == ["True", "True"], r.stderr[-2000:]
    assert not list(tmp_path.glob("rvm_llvm_*.o"))


@pytest.mark.parametrize("scalar", ["nan", "inf"])
def test_a_scalar_operand_not_finite_that_max_would_drop_still_stops_native_code(scalar):
    # an element's max picks a value without looking at it (no branch per element: the
    # loop vectorises); the register that holds the nan or inf keeps it, and native code
    # stops where the interpreter does, at the instruction that made it
    made = "ADD.exp f1, f0\nSUB.exp f1, f0" if scalar == "nan" else "ADD.exp f1, f0"
    p = program(f"ADD f0, 1000.0\n{made}\nVADD.max [r0 : r2, 1], [r3 : r5, 1], f1, r1, r2\n"
                "VSUB.min [r6 : r8, 1], [r3 : r5, 1], f1, r1, r2")
    Y, A, B = data()
    errors = []
    for engine in ENGINES:
        with pytest.raises(rvm.RvmError) as e:
            run(p, engine, Y, A, B, 0.0)
        errors.append(str(e.value).splitlines()[0])
    assert "instruction 1" in errors[0] and "math range error" in errors[0], errors[0]
    assert errors == [errors[0]] * len(ENGINES), errors
