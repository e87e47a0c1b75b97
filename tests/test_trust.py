"""No silent wrong answers: arguments are converted and checked the same way on every
path (a warm direct call, a gradient plan, a batch, a fresh call), a gradient that stops
being finite is an error, a deep chain of calls needs no recursion, and a number too large
for its register is an rvm error."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rvm
from rvm.engines import native
from rvm.engines.machine import NATIVE_AFTER

ENGINES = ["interp", "python", "auto"] + (["native"] if native.available else [])

ADD = """
.func f(r0, r1)
        ADD     r1, r0
.end
.func h(f0, f1)
        ADD.mul f1, f0, f0
.end
"""

GRAD = '''
from rvm import reversible


@reversible
def g(n: int, x: float, out: float):
    for i in range(n):
        out += x * x
'''

INVERSE = '''
from rvm import reversible


@reversible
def f(x: float, y: float, out: float):
    out += x / y
'''


def outcome(call, *args):
    """A call's result, or its error as (type, message): what two calls must agree on."""
    try:
        return ("ok", call(*args))
    except rvm.RvmError as e:
        return (type(e).__name__, str(e))


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] != "ok":
        return a[1] == b[1]
    return all(x == y or (isinstance(x, float) and math.isnan(x) and math.isnan(y))
               for x, y in zip(a[1], b[1]))


ARGUMENTS = st.one_of(
    st.integers(-(1 << 70), 1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 5).map(float),
    st.booleans(),
    st.integers(-5, 5).map(np.int64),
    st.floats(-5, 5).map(np.float64),
    st.floats(-5, 5).map(np.float32),
    st.lists(st.integers(-3, 3), max_size=2),
)


def warmed(engine: str):
    """f and h of one program after many calls with integral floats (a direct-call plan
    for float arguments on native code), and a program never called before."""
    prog = rvm.assemble(ADD)
    for _ in range(200):
        prog.call("f", 3.0, 0, engine=engine)
        prog.call("h", 3.0, 0.0, engine=engine)
    return prog


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=ARGUMENTS, b=ARGUMENTS)
def test_first_and_thousandth_call_take_and_refuse_the_same_arguments(engine, a, b):
    prog = warmed(engine)
    fresh = rvm.assemble(ADD)
    for name in ("f", "h"):
        first = outcome(lambda *v, n=name: fresh.call(n, *v, engine="interp"), a, b)
        later = outcome(lambda *v, n=name: prog.call(n, *v, engine=engine), a, b)
        assert same(first, later), (name, a, b, first, later)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_non_integral_float_for_an_integer_parameter_is_refused_after_warm_up(engine):
    prog = warmed(engine)
    for v in (2.5, -0.7, float("nan"), True):
        with pytest.raises(rvm.MachineError, match="must be an integer"):
            prog.call("f", v, 0, engine=engine)
    assert prog.call("f", 2.0, 0, engine=engine) == (2, 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_plans_refuse_what_a_first_call_refuses(engine, tmp_path):
    (tmp_path / "g.py").write_text(GRAD)
    g = rvm.load(tmp_path / "g.py")["g"]
    grad = rvm.grad(g, loss="out", engine=engine)
    for _ in range(NATIVE_AFTER + 50):
        assert grad(3.0, 2.0, 0.0)[1] == 12.0
    with pytest.raises(rvm.MachineError, match="must be an integer"):
        grad(2.5, 2.0, 0.0)
    assert grad(np.int64(2), 2.0, 0.0)[1] == 8.0


@pytest.mark.parametrize("engine", ENGINES)
def test_vmap_rows_are_checked_like_calls(engine, tmp_path):
    prog = warmed(engine)
    f = prog["f"]
    out = rvm.vmap(lambda a, b: f(a, b, engine=engine))
    with pytest.raises(rvm.MachineError, match=r"got 2\.7"):
        rvm.vmap(f)(np.array([3.0, 2.7, -0.5]), np.zeros(3, np.int64))
    with pytest.raises(rvm.MachineError, match="must be an integer"):
        rvm.vmap(f)(np.array([True, False]), np.zeros(2, np.int64))
    assert [list(c) for c in out(np.array([3.0, 2.0]), np.zeros(2, np.int64))] == \
        [[3, 2], [3, 2]]
    huge = np.array([1 << 63, 1], np.uint64)
    with pytest.raises(rvm.MachineError, match="does not fit in int64"):
        rvm.vmap(f)(huge, np.zeros(2, np.int64))
    (tmp_path / "g.py").write_text(GRAD)
    grad = rvm.grad(rvm.load(tmp_path / "g.py")["g"], loss="out", engine=engine)
    with pytest.raises(rvm.MachineError, match="must be an integer"):
        rvm.vmap(grad)(np.array([3.0, 2.5]), np.array([1.0, 1.0]), np.zeros(2))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gradient_that_stops_being_finite_is_an_error(engine, tmp_path):
    (tmp_path / "f.py").write_text(INVERSE)
    f = rvm.load(tmp_path / "f.py")["f"]
    grad = rvm.grad(f, loss="out", engine=engine)
    for _ in range(NATIVE_AFTER + 2):
        assert grad(1.0, 2.0, 0.0) == (0.5, -0.25, 1.0)
        with pytest.raises(rvm.InvertibilityError,
                           match=r"f.py:7.*gradient of the loss with respect to `x` is "
                                 r"inf: not finite.*ADD.div"):
            grad(0.0, 5e-324, 0.0)


def test_the_cli_never_prints_a_non_finite_gradient(tmp_path):
    (tmp_path / "f.py").write_text(INVERSE)
    for engine in ENGINES:
        r = subprocess.run([sys.executable, "-m", "rvm.cli", "grad", str(tmp_path / "f.py"),
                            "--loss", "out", "--args", "0.0", "5e-324", "0.0", "--json",
                            "--engine", engine], capture_output=True, text=True)
        assert r.returncode == 1, (engine, r.stdout, r.stderr)
        assert "Infinity" not in r.stdout and "Traceback" not in r.stderr
        assert "with respect to `x` is inf" in r.stderr
        ok = subprocess.run([sys.executable, "-m", "rvm.cli", "grad", str(tmp_path / "f.py"),
                             "--loss", "out", "--args", "1.0", "2.0", "0.0", "--json",
                             "--engine", engine], capture_output=True, text=True)
        assert json.loads(ok.stdout) == {"x": 0.5, "y": -0.25, "out": 1.0}


def chain(n: int) -> str:
    """g0 calls g1 ... calls g(n-1), which adds f0 into f1."""
    lines = []
    for k in range(n):
        body = f"CALL    g{k + 1}, f0, f1" if k < n - 1 else "ADD     f1, f0"
        lines += [f".func g{k}(f0, f1)", f"        {body}", ".end"]
    return "\n".join(lines) + "\n"


def test_a_chain_of_a_thousand_calls_needs_no_recursion():
    prog = rvm.assemble(chain(1000))
    assert prog.call_order() == ([f"g{k}" for k in reversed(range(1000))], False)
    for engine in ("interp", "python"):
        for _ in range(NATIVE_AFTER + 2):
            assert prog.call("g0", 1.5, 0.0, engine=engine) == (1.5, 1.5)
    grad = rvm.grad(prog["g0"], loss=1, engine="python")
    assert grad(1.5, 0.0) == (1.0, 1.0)
    cyclic = rvm.assemble(chain(1000).replace("ADD     f1, f0", "UNCALL  g0, f0, f1"))
    assert cyclic.call_order()[1] is True


@pytest.mark.skipif(not native.available, reason="needs the native engine")
def test_the_call_graph_walks_of_the_native_engine_are_iterative():
    # the analyses native code is made from, on a chain as deep as Python's recursion limit
    from rvm.engines.compiled import _summaries
    prog = rvm.assemble(chain(sys.getrecursionlimit() + 100))
    memo = _summaries(prog)
    assert memo["g0"] == {prog.functions["g0"].params[1]}
    assert rvm.engines.machine.recursive(prog) is False


@pytest.mark.parametrize("engine", ENGINES)
def test_a_huge_integer_for_a_float_parameter_is_an_rvm_error(engine):
    prog = rvm.assemble(ADD)
    with pytest.raises(rvm.MachineError, match="too large for a float64"):
        prog.call("h", 2 ** 1024, 0.0, engine=engine)
    with pytest.raises(rvm.MachineError, match="does not fit in int64"):
        prog.call("f", 2 ** 64, 0, engine=engine)


def test_the_cli_reports_a_huge_integer_argument(tmp_path):
    src = tmp_path / "h.rasm"
    src.write_text(ADD)
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(src), "--entry", "h",
                        "--args", str(2 ** 1024), "0.0"], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "too large for a float64" in r.stderr


HEAP_SHADOW = '''
from rvm import Array, reversible


@reversible
def h(x: Array[float], out: float):
    out += x[0] * 1e308
    out += x[0] * 1e308
'''


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gradient_that_overflows_in_a_heap_cell_is_an_error(engine, tmp_path):
    # two finite pullbacks of 1e308 into one cell's shadow: the gradients a pass returns
    # are tested, arrays included
    (tmp_path / "h.py").write_text(HEAP_SHADOW)
    grad = rvm.grad(rvm.load(tmp_path / "h.py")["h"], loss="out", engine=engine)
    for _ in range(NATIVE_AFTER + 2):
        with pytest.raises(rvm.InvertibilityError,
                           match="`x` has inf or nan elements: not finite"):
            grad(np.array([1e-300]), 0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_gradient_batches_with_a_non_finite_row_report_it(engine, tmp_path):
    (tmp_path / "f.py").write_text(INVERSE)
    grad = rvm.grad(rvm.load(tmp_path / "f.py")["f"], loss="out", engine=engine)
    x, y = np.array([1.0, 0.0, 2.0]), np.array([2.0, 5e-324, 4.0])
    good = rvm.vmap(grad)(x[::2], y[::2], np.zeros(2))
    np.testing.assert_array_equal(good[0], [0.5, 0.25])
    with pytest.raises(rvm.InvertibilityError, match="`x` is inf: not finite"):
        rvm.vmap(grad)(x, y, np.zeros(3))


@pytest.mark.parametrize("engine", ENGINES)
def test_derived_programs_and_uncalls_refuse_after_warm_up(engine, tmp_path):
    (tmp_path / "g.py").write_text(GRAD)
    g = rvm.load(tmp_path / "g.py")["g"]
    t, a = rvm.tangent(g), rvm.adjoint(g)
    for _ in range(NATIVE_AFTER + 20):
        assert rvm.jvp(g, (3.0, 2.0, 0.0), (None, 1.0, 0.0), engine=engine)[1][2] == 12.0
        t(3.0, 2.0, 0.0, 1.0, 0.0)
        a(3.0, 2.0, 0.0, 0.0, 1.0)
        (~g)(3.0, 2.0, 12.0)
    for run in (lambda: rvm.jvp(g, (2.5, 2.0, 0.0), (None, 1.0, 0.0), engine=engine),
                lambda: t(2.5, 2.0, 0.0, 1.0, 0.0), lambda: a(2.5, 2.0, 0.0, 0.0, 1.0),
                lambda: (~g)(2.5, 2.0, 12.0), lambda: g(2.5, 2.0, 0.0)):
        with pytest.raises(rvm.MachineError, match=r"got 2\.5"):
            run()
