"""The reversible Python subset: each statement forwards, backwards, and its errors."""

import math

import numpy as np
import pytest

import rvm
from rvm import Array, ancilla, compute, inverse, irot, neg, nograd, rot, zeros

SCALE = 2.5


@rvm.reversible
def arith(y: float, a: float, b: float, k: int):
    y += a * b + 3.0 * a - b / 2.0
    y -= exp(a) * sin(b)
    y += k * a          # an int in a float expression is promoted
    y += SCALE ** 2     # a constant from the enclosing scope
    k += 7 // 2 - 10 % 4


def test_accumulation_and_promotion():
    a, b = 0.7, -1.3
    y, a2, b2, k = arith(1.0, a, b, 3)
    want = 1.0 + a * b + 3 * a - b / 2 - math.exp(a) * math.sin(b) + 3 * a + SCALE ** 2
    assert y == pytest.approx(want, rel=1e-14) and (a2, b2, k) == (a, b, 4)
    assert (~arith)(y, a, b, 4) == pytest.approx((1.0, a, b, 3), rel=1e-14)


@rvm.reversible
def statements(x: float, y: float, t: float, n: int, m: int):
    x, y = y, x
    neg(t)
    rot(x, y, t)
    x *= 2.0
    y /= -4.0
    n ^= m & 6
    n ^= m > 2
    irot(x, y, 0.5)


def test_swap_neg_rot_mul_xor_roundtrip():
    args = (1.0, 2.0, 0.3, 5, 7)
    out = statements(*args)
    x, y = 2.0, 1.0
    t = -0.3
    x, y = x * math.cos(t) - y * math.sin(t), x * math.sin(t) + y * math.cos(t)
    x, y = 2 * x, y / -4
    x, y = x * math.cos(0.5) + y * math.sin(0.5), -x * math.sin(0.5) + y * math.cos(0.5)
    assert out == pytest.approx((x, y, t, 5 ^ 6 ^ 1, 7), rel=1e-14)
    assert (~statements)(*out) == pytest.approx(args, rel=1e-14)


@rvm.reversible
def weighted(out: float, w: Array[float], x: Array[float]):
    for i in range(len(w)):
        out += w[i] * nograd(x[i])
        out -= nograd(x[i])


def test_nograd_reads_an_element_as_a_constant():
    """nograd(x[i]) has x[i]'s value, but no gradient flows into x (JAX's stop_gradient,
    PyTorch's detach, for an element read)."""
    w, x = np.array([1.0, 2.0]), np.array([3.0, -4.0])
    assert weighted(0.0, w, x)[0] == 3.0 - 8.0 - 3.0 + 4.0
    ops = [ins.op for ins in weighted.compile().functions["weighted"].code]
    assert (ops.count("ADDK"), ops.count("SUBK"), ops.count("ADDM")) == (1, 2, 1)
    gw, gx = rvm.grad(weighted, loss="out", argnums=(1, 2))(0.0, w, x)
    assert list(gw) == [3.0, -4.0] and list(gx) == [0.0, 0.0]
    _, tangents = rvm.jvp(weighted, (0.0, w, x), (0.0, np.zeros(2), np.ones(2)))
    assert tangents[0] == 0.0


@pytest.mark.parametrize("body", ["out += 2.0 * nograd(2.0)", "out += nograd(w[0] * 2.0)",
                                  "out += nograd(w[0], w[1])"])
def test_nograd_takes_one_float_element(tmp_path, body):
    path = tmp_path / "bad_nograd.py"
    path.write_text("import rvm\nfrom rvm import Array, nograd\n\n\n@rvm.reversible\n"
                    f"def f(out: float, w: Array[float]):\n    {body}\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("bad_nograd", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(rvm.CompileError, match="nograd takes one element"):
        module.f.compile()


@rvm.reversible
def swap_element(x: float, n: int, a: Array[float], b: Array[int]):
    a[1], x = x, a[1]
    n, b[0] = b[0], n
    a[0] += 2.0 * x           # x is now a[1]'s old value


def test_swap_of_a_scalar_and_an_element_is_one_exchange():
    prog = swap_element.compile()
    ops = [ins.op for ins in prog.functions["swap_element"].code]
    assert ops.count("EXCH") == 2 + 2 and "SWAP" not in ops     # + a[0]'s update
    a, b = np.array([1.0, 5.0]), np.array([7, 8])
    x, n, a2, b2 = swap_element(3.0, 4, a, b)
    assert (x, n, list(a2), list(b2)) == (5.0, 7, [11.0, 3.0], [4, 8])
    back = (~swap_element)(x, n, a2, b2)
    assert (back[0], back[1], list(back[2]), list(back[3])) == (3.0, 4, [1.0, 5.0], [7, 8])
    g = rvm.grad(swap_element, argnums=(0, 2), loss="x")(3.0, 4, a, b)
    assert g[0] == 0.0 and list(g[1]) == [0.0, 1.0]


@rvm.reversible
def branches(x: float, n: int, flag: int):
    if n > 2 and not flag:
        x += 1.0
    else:
        x -= 1.0
    if (x > 0.0, x > 1.0):      # the post-condition tells the branches apart afterwards
        x += 1.0


def test_if_else_and_pre_post():
    assert branches(0.5, 3, 0) == (2.5, 3, 0)
    assert branches(0.5, 3, 1) == (-0.5, 3, 1)
    assert branches(-3.0, 1, 0) == (-4.0, 1, 0)
    for out in [(2.5, 3, 0), (-0.5, 3, 1), (-4.0, 1, 0)]:
        assert branches(*(~branches)(*out)) == out


@rvm.reversible
def loops(total: int, n: int, s: float, x: float):
    for i in range(n):
        total += i
    for i in range(10, n, -3):
        total += 100 * i
    with ancilla(k=0):
        while (k < n, k != 0):
            k += 1
            s += x
        k -= n


def test_for_and_while():
    assert loops(0, 5, 0.0, 0.5) == (10 + 100 * (10 + 7), 5, 2.5, 0.5)
    assert loops(0, 0, 1.0, 0.5) == (100 * (10 + 7 + 4 + 1), 0, 1.0, 0.5)
    assert (~loops)(1710, 5, 2.5, 0.5) == (0, 5, 0.0, 0.5)


@rvm.reversible
def matvec(y: Array[float], A: Array[float, 2], x: Array[float]):
    for i in range(A.shape[0]):
        for j in range(len(x)):
            y[i] += A[i, j] * x[j]


def test_arrays_2d_and_gradients():
    rng = np.random.default_rng(0)
    A, x = rng.normal(size=(3, 4)), rng.normal(size=4)
    y, A2, x2 = matvec(np.zeros(3), A, x)
    assert np.allclose(y, A @ x) and np.array_equal(A2, A) and np.array_equal(x2, x)
    _, gA, gx = rvm.grad(matvec, loss=(0, 1))(np.zeros(3), A, x)
    assert np.allclose(gx, A[1]) and np.allclose(gA[1], x) and np.allclose(gA[0], 0)
    assert np.allclose((~matvec)(y, A, x)[0], 0, atol=1e-15)


@rvm.reversible
def square(out: float, x: float):
    out += x * x


@rvm.reversible
def calls(out: float, x: float, v: Array[float]):
    square(out, x)
    ~square(out, v[0])
    (~square)(out, v[1])
    square(v[2], x)


def test_calls_uncalls_and_element_arguments():
    v = np.array([1.0, 2.0, 0.0])
    out, x, v2 = calls(10.0, 3.0, v)
    assert out == 10 + 9 - 1 - 4 and np.array_equal(v2, [1.0, 2.0, 9.0])
    back = (~calls)(out, x, v2)
    assert back[0] == 10.0 and np.array_equal(back[2], v)


@rvm.reversible
def blocks(out: float, x: float):
    with ancilla(t=0.0, c=2.0, buf=zeros(3)):
        with compute() as r:
            t += x * c
            buf[1] += t
        out += buf[1] * t
        ~r
        with inverse():
            out += x


def test_compute_uncompute_inverse_block_and_ancilla_init():
    assert blocks(1.0, 3.0) == (1.0 + 36.0 - 3.0, 3.0)
    assert (~blocks)(34.0, 3.0) == (1.0, 3.0)


def test_recursion_and_signature_specialization():
    @rvm.reversible
    def tri(out: int, n: int):
        if n > 0:
            out += n
            with ancilla(m=n - 1):
                tri(out, m)
    assert tri(0, 10) == (55, 10) and (~tri)(55, 10) == (0, 10)

    @rvm.reversible
    def add(y, x):                  # no annotations: compiled per argument types
        y += x
    assert add(1, 2) == (3, 2) and add(1.5, 2) == (3.5, 2)


def test_emitted_assembly_has_source_lines():
    program = square.compile()
    text = rvm.disassemble(program, annotate=True)
    line = square.pyfunc.__code__.co_firstlineno + 2
    assert "ADD.mul  f0, f1, f1" in text and f"line {line}" in text


ERRORS = {   # body, message, hint; the error points at the body's last line but for while

    "plain assignment": ("y = x", "plain assignment overwrites", "accumulate instead"),
    "both sides": ("y += y * x", "y occurs on both sides", "use a temporary"),
    "return": ("return y", "return is not reversible", ""),
    "break": ("while (x > 0, x < 0):\n        break", "break is not reversible", ""),
    "python function": ("input(y)", "'input' is an ordinary Python function", "@rvm.reversible"),
    "unknown name": ("y += zz", "unknown variable 'zz'", "ancilla"),
    "int target float expr": ("n += x", "integer target cannot absorb a float", "//"),
    "while needs pre/post": ("while x > 0:\n        x -= 1.0", "needs (precondition",
                             "post-condition"),
    "float floordiv": ("y += x // 2.0", "// is integer division", ""),
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_compile_errors_are_located(case, tmp_path):
    body, message, hint = ERRORS[case]
    path = tmp_path / "bad.py"
    path.write_text("import rvm\n\n@rvm.reversible\ndef f(y: float, x: float, n: int):\n"
                    f"    {body}\n")
    with pytest.raises(rvm.CompileError) as err:
        rvm.load(path)
    text = str(err.value)
    line = 5 if case.startswith("while") else 4 + body.count("\n") + 1
    assert text.startswith(f"{path}:{line}:") and message in text and hint in text
    assert "\n    " in text and "^" in text


def test_runtime_invertibility_error_names_the_python_line():
    @rvm.reversible
    def bad(x: float):
        if x > 0.0:
            x -= 5.0
    with pytest.raises(rvm.InvertibilityError) as err:
        bad(1.0)
    line = bad.pyfunc.__code__.co_firstlineno + 2
    assert f":{line}" in str(err.value)
    assert f"the `if` at line {line}: its post-condition `x > 0.0` is false after the " \
        "then-branch, with x = -4.0" in str(err.value)
    assert "comefrom" in err.value.detail


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_a_math_error_names_the_python_statement_and_the_value(engine):
    """exp that overflows and log of a negative number (Python's math errors, raised by
    the family's value) are told with the statement's source and the value given to the
    function, not the registers (`ADD.exp f1, f0`), on every engine."""
    @rvm.reversible
    def grow(x: float, total: float):
        total += math.exp(x)

    @rvm.reversible
    def shrink(x: float, total: float):
        total -= math.log(x - 2.0)
    for fn, args, said in [
            (grow, (1000.0, 0.0), "`total += math.exp(x)` at line {}: exp(1000.0) overflows "
                                  "(math range error)"),
            (shrink, (1.0, 0.0), "`total -= math.log(x - 2.0)` at line {}: log(-1.0) is "
                                 "undefined (math domain error)")]:
        with pytest.raises(rvm.MachineError) as err:
            fn(*args, engine=engine)
        line = fn.pyfunc.__code__.co_firstlineno + 2
        assert said.format(line) in str(err.value), str(err.value)
        assert "ADD." in err.value.detail or "SUB." in err.value.detail


def test_argument_type_errors():
    with pytest.raises(rvm.MachineError, match="declared Array"):
        matvec(np.zeros(3), np.zeros(3), np.zeros(3))
    with pytest.raises(rvm.MachineError, match="takes 2 arguments"):
        square(1.0)


def test_markers_outside_reversible_code():
    with pytest.raises(RuntimeError, match="only meaningful inside"):
        ancilla(x=0)
    assert neg and rot and irot and compute and inverse


@rvm.reversible
def sum_own_range(out: float, a: Array[float]):
    for i in range(len(a)):
        out += a[i]


@rvm.reversible
def sum_given_range(out: float, a: Array[float], n: int):
    for i in range(n):
        out += a[i]


@rvm.reversible
def bump(k: int):
    k += 5


@rvm.reversible
def sum_counter_passed(out: float, a: Array[float]):
    for i in range(len(a)):
        bump(i)
        out += a[i]
        ~bump(i)


def _checks(f, *args) -> int:
    program, name, _ = f.specialize(args)
    return sum(ins.op.startswith("ASSERT") for ins in program.functions[name].code)


def test_loops_over_an_arrays_own_range_skip_its_bounds_checks():
    a = np.array([1.0, 2.0, 3.0])
    assert _checks(sum_own_range, 0.0, a) == 0
    assert sum_own_range(0.0, a)[0] == 6.0
    # a bound from elsewhere, or a counter a call could move, keeps the checks
    assert _checks(sum_given_range, 0.0, a, 3) == 4
    with pytest.raises(rvm.RvmError, match=r"a\[i\]: i = 3 is outside a \(length 3\)"):
        sum_given_range(0.0, a, 4)
    assert _checks(sum_counter_passed, 0.0, a) == 4
    with pytest.raises(rvm.RvmError, match="is outside a"):
        sum_counter_passed(0.0, a)


@rvm.reversible
def through_ancillas(out: float, a: Array[float, 2]):
    with ancilla(d=a.shape[1], t=zeros((len(a), a.shape[1]))):
        for i in range(len(a)):
            for j in range(d):
                t[i, j] += a[i, j] * 2.0
                out += t[i, j]
            for j in range(d):
                t[i, j] -= a[i, j] * 2.0


@rvm.reversible
def over_a_copy(out: float, a: Array[float]):
    with ancilla(t=zeros(len(a))):
        for i in range(len(t)):         # t's length is a's: both unchecked
            t[i] += a[i]
        for i in range(len(t)):
            out += t[i]
        for i in range(len(t)):
            t[i] -= a[i]


@rvm.reversible
def below_the_diagonal(out: float, a: Array[float, 2]):
    for c in range(len(a)):
        for r in range(c + 1, a.shape[1]):
            out += a[c, r]


@rvm.reversible
def through_a_changed_ancilla(out: float, a: Array[float]):
    with ancilla(d=len(a)):
        d += 1
        for j in range(d):
            out += a[j]
        d -= 1


def test_dimensions_carried_by_ancillas_skip_their_bounds_checks():
    """An ancilla array sized by A's dimensions, and an int ancilla holding one that
    nothing changes, are known equal to them: loops over them index both unchecked.
    An ancilla the block changes keeps the checks, which catch the overrun."""
    a = np.arange(6.0).reshape(2, 3)
    assert _checks(through_ancillas, 0.0, a) == 0
    assert through_ancillas(0.0, a)[0] == 30.0
    assert _checks(over_a_copy, 0.0, np.ones(4)) == 0
    assert over_a_copy(0.0, np.arange(4.0))[0] == 6.0
    assert _checks(below_the_diagonal, 0.0, a) == 0      # r starts at c + 1 >= 0
    assert below_the_diagonal(0.0, a)[0] == 1.0 + 2.0 + 5.0
    assert _checks(through_a_changed_ancilla, 0.0, np.ones(3)) == 4    # and their mirrors
    with pytest.raises(rvm.RvmError, match="is outside a"):
        through_a_changed_ancilla(0.0, np.ones(3))


@rvm.reversible
def reads_twice(out: float, a: Array[float], idx: Array[int]):
    for k in range(len(idx)):
        out += a[idx[k]] * a[idx[k]] + a[a.shape[0] - 1 - idx[k]] * 2.0


@rvm.reversible
def index_by_itself(out: float, a: Array[int], b: Array[float]):
    for k in range(len(a)):
        out += b[a[a[k]]]


@pytest.mark.parametrize("engine", ["interp", "python"])
def test_array_elements_read_in_place_and_twice(engine):
    """Elements are read in place (ADDM before the use, SUBM after, no exchange), so
    an expression may read one cell twice, or index an array by itself; `+= A[i]`
    accumulates the cell straight into its target."""
    program, name, _ = reads_twice.specialize((0.0, np.ones(3), np.zeros(4, np.int64)))
    ops = [ins.op for ins in program.functions[name].code]
    assert "EXCH" not in ops and ops.count("ADDM") == ops.count("SUBM") == 6
    a, idx = np.array([1.0, 2.0, 3.0]), np.array([0, 2, 1, 1])
    assert reads_twice(0.0, a, idx, engine=engine)[0] == \
        sum(a[i] * a[i] + 2 * a[2 - i] for i in idx)
    g = rvm.grad(reads_twice, loss="out", engine=engine)(0.0, a, idx)[1]
    assert g.tolist() == [4.0, 12.0, 8.0]
    perm, b = np.array([0, 0, 2]), np.array([5.0, 7.0, 9.0])
    assert index_by_itself(0.0, perm, b, engine=engine)[0] == sum(b[perm[perm[k]]]
                                                                 for k in range(3))


@rvm.reversible
def element_twice(s: float, t: float, A: Array[float, 2], i: int, j: int):
    s += A[i + 1, j] * A[i, j]
    t += A[i + 1, j] * A[i, j]
    A[i, j] += s


def test_element_addresses_reuse_their_registers():
    """The registers an element's address is made in (a computed index, the offset) are
    free again once the address is unmade: the next statement makes its addresses in the
    same ones, in the same order, so the same expression is the same code (native code
    then sees one address for an element a loop's statements share, and keeps it in a
    register or vectorises the loop)."""
    fn = element_twice.compile().functions["element_twice"]
    lines = sorted({ins.line for ins in fn.code if ins.line})
    first, second = ([ins for ins in fn.code if ins.line == n] for n in lines[:2])
    s, t = fn.params[:2]
    assert [ins.op for ins in first] == [ins.op for ins in second]
    assert [tuple(t if a == s else a for a in ins.args) for ins in first] == \
        [ins.args for ins in second]
    A = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    out = element_twice(0.5, 0.25, A, 1, 1)
    assert out[:2] == (0.5 + 24.0, 0.25 + 24.0) and out[2][1, 1] == 4.0 + out[0]
    back = (~element_twice)(*out[:3], 1, 1)
    assert back[:2] == (0.5, 0.25) and np.array_equal(back[2], A)
    g, = rvm.grad(element_twice, loss="t", argnums=(2,))(0.5, 0.25, A, 1, 1)
    assert np.array_equal(g, [[0.0, 0.0], [0.0, 6.0], [0.0, 4.0]])


ALIASES = {   # body, column, message: an update or swap may not read what it changes
    "x[x[0]] ^= 1": (7, "the index of x[x[0]] reads x, which the update changes"),
    "neg(x[x[0]])": (11, "the index of x[x[0]] reads x, which the neg changes"),
    "x[0], x[x[0]] = x[x[0]], x[0]": (13, "the index of x[x[0]] reads x, which the swap "
                                          "changes"),
    "x[k], k = k, x[k]": (7, "the index of x[k] reads k, which the swap changes"),
    "k, k = k, k": (8, "k is swapped with itself"),
    "x[1], x[1] = x[1], x[1]": (11, "x[1] is swapped with itself"),
    "x[k] += x[k]": (13, "x[k] is the element the update changes"),
    "x[0] += y[x[0]]": (15, "x[0] is the element the update changes"),
}


@pytest.mark.parametrize("body", list(ALIASES))
def test_updates_and_swaps_may_not_read_what_they_change(body, tmp_path):
    """Refused when compiling, at the user's variable (the index would be read again to
    put the element back or to undo the statement, after the statement changed it)."""
    col, message = ALIASES[body]
    path = tmp_path / "alias.py"
    path.write_text("import rvm\nfrom rvm import Array, neg\n\n@rvm.reversible\n"
                    f"def f(x: Array[int], y: Array[int], k: int):\n    {body}\n")
    with pytest.raises(rvm.CompileError) as err:
        rvm.load(path)
    assert str(err.value).startswith(f"{path}:6:{col}: error: {message}"), str(err.value)


@rvm.reversible
def other_elements(x: Array[int], y: Array[int], k: int):
    x[0], x[1] = x[1], x[0]
    x[0] += y[x[1]]                 # x[1] is not the element changed
    x[len(x) - 1] += len(x)         # the size of x is fixed
    x[k] += x[2 - k]                # checked while running: k != 2 - k
    y[x[1]], y[0] = y[0], y[x[1]]     # indices read x, the swap changes y


def test_reads_of_other_elements_and_other_arrays_still_compile():
    x, y = np.array([1, 2, 0]), np.array([5, 6, 7])
    out = other_elements(x, y, 0)
    assert out[0].tolist() == [2 + 6 + 3, 1, 3] and out[1].tolist() == [6, 5, 7]
    back = (~other_elements)(*out)
    assert back[0].tolist() == [1, 2, 0] and back[1].tolist() == [5, 6, 7]
    with pytest.raises(rvm.InvertibilityError):
        other_elements(x, y, 1)     # x[1] += x[1]


@rvm.reversible
def bump_two(a: int, b: int):
    a += 5
    b += 7


@pytest.mark.parametrize("body,col,message", [
    ("bump_two(x[x[0]], k)", 16, "the index of x[x[0]] reads x, which the call changes"),
    ("bump_two(x[k], k)", 16, "the index of x[k] reads k, which the call changes"),
    ("bump_two(x[1], x[1])", 20, "x[1] is passed twice"),
])
def test_elements_passed_by_reference_may_not_alias(body, col, message, tmp_path):
    path = tmp_path / "calls.py"
    path.write_text("import rvm\nfrom rvm import Array\n\n@rvm.reversible\n"
                    "def bump_two(a: int, b: int):\n    a += 5\n    b += 7\n\n"
                    f"@rvm.reversible\ndef f(x: Array[int], k: int):\n    {body}\n")
    with pytest.raises(rvm.CompileError) as err:
        rvm.load(path)
    assert str(err.value).startswith(f"{path}:11:{col}: error: {message}"), str(err.value)


def test_two_elements_of_one_array_passed_are_checked_to_differ():
    @rvm.reversible
    def f(x: Array[int], i: int, j: int):
        bump_two(x[i], x[j])
    assert f(np.array([1, 2, 3]), 0, 2)[0].tolist() == [6, 2, 10]
    with pytest.raises(rvm.InvertibilityError, match="!="):    # the indices' check
        f(np.array([1, 2, 3]), 1, 1)


@rvm.reversible
def _residue(out: float, k0: float, k1: float, s: float, t: float):
    out += (1.0 + k0 * s + k1 * s * s) * 2.0       # a temporary summed from three terms
    out += sin(t) / t                              # the same register, reused


def test_a_temporary_summed_from_several_terms_is_cleared_before_reuse():
    """1 + a + b - b - a - 1 is not always 0 in floating point: a temporary built from
    several terms keeps a residue after it is taken apart, which its next use (here
    divided by a small t) made large enough to fail an ancilla check. Such temporaries
    are cleared (ZERO) before reuse; a one-term temporary comes back exactly and is not."""
    args = (0.0, 0.07515778528953948, -0.003493744625373522, 0.5095, 1e-6)
    want = (1.0 + args[1] * args[3] + args[2] * args[3] ** 2) * 2.0 + math.sin(1e-6) / 1e-6
    for engine in ("interp", "python"):
        out = _residue(*args, engine=engine)
        assert out[0] == pytest.approx(want, rel=1e-12)
        assert (~_residue)(*out, engine=engine)[0] == pytest.approx(0.0, abs=1e-12)
    text = rvm.disassemble(_residue.specialize(args)[0])
    assert text.count("ZERO") >= 1
