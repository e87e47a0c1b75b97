"""The Janus frontend: jana's language, output format and errors, on rvm's engines."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rvm
from rvm.lang.janus import compile_janus, main_arguments, show_store

ROOT = Path(__file__).resolve().parent.parent


def janus(tmp_path, text: str, name: str = "prog.ja"):
    path = tmp_path / name
    path.write_text(text)
    return rvm.load(path), path


def run_main(prog):
    return show_store(prog, prog.call("main", *main_arguments(prog)))


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rvm.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd)


FIB = """
// Fibonacci pairs by recursion
procedure fib(int x1, int x2, int n)
    if n = 0 then
        x1 += 1
        x2 += 1
    else
        n -= 1
        call fib(x1, x2, n)
        x1 += x2
        x1 <=> x2
    fi x1 = x2

procedure main()
    int x1
    int x2
    int n
    n += 4
    call fib(x1, x2, n)
"""


def test_fib_prints_the_store_sorted_like_jana(tmp_path):
    prog, path = janus(tmp_path, FIB)
    assert run_main(prog) == "n = 0\nx1 = 5\nx2 = 8"
    out = cli("run", path)
    assert out.returncode == 0 and out.stdout == "n = 0\nx1 = 5\nx2 = 8\n"


def test_procedures_from_python_call_and_uncall(tmp_path):
    prog, _ = janus(tmp_path, FIB)
    assert prog.call("fib", 0, 0, 10) == (89, 144, 0)
    assert prog.uncall("fib", 89, 144, 0) == (0, 0, 10)


def test_agrees_with_the_hand_written_python_subset(tmp_path):
    prog, _ = janus(tmp_path, FIB)

    @rvm.reversible
    def fib(x1: int, x2: int, n: int):
        if (n == 0, x1 == x2):
            x1 += 1
            x2 += 1
        else:
            n -= 1
            fib(x1, x2, n)
            x1 += x2
            x1, x2 = x2, x1
    for n in range(8):
        assert prog.call("fib", 0, 0, n) == fib(0, 0, n)


PERM = (ROOT / "examples/janus/perm_to_code.ja").read_text()


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_perm_to_code_on_every_engine(engine):
    pytest.importorskip("llvmlite") if engine == "native" else None
    prog = rvm.load(ROOT / "examples/janus/perm_to_code.ja")
    (code,) = prog.call("perm_to_code", np.array([2, 0, 3, 1, 5, 4]), engine=engine)
    assert code.tolist() == [0, 0, 2, 1, 4, 4]
    (back,) = prog.uncall("perm_to_code", code, engine=engine)
    assert back.tolist() == [2, 0, 3, 1, 5, 4]


def test_loops_with_every_combination_of_do_and_loop_parts(tmp_path):
    prog, _ = janus(tmp_path, """
procedure both(int i, int s)        // from e1 do s1 loop s2 until e2
    from i = 0 do
        i += 1
    loop
        s += i
    until i = 5
procedure doonly(int i, int s)
    from i = 0 do
        i += 1
        s += i
    until i = 5
procedure looponly(int i, int s)
    from i = 0 loop
        i += 1
        s += i
    until i = 5
procedure neither(int i)
    from i = 0 until i = 0
procedure main()
    int i
    skip
""")
    assert prog.call("both", 0, 0) == (5, 1 + 2 + 3 + 4)     # s2 runs only when going on
    assert prog.call("doonly", 0, 0) == (5, 15)
    assert prog.call("looponly", 0, 0) == (5, 15)
    assert prog.call("neither", 0) == (0,)
    for name, args in (("both", (5, 10)), ("doonly", (5, 15)), ("looponly", (5, 15))):
        assert prog.uncall(name, *args) == (0, 0)


OPERATORS = """
#define K 7
procedure ops(int a, int b, int r[])
    r[0] += a + b * 2 - 1
    r[1] += a / b           // jana: division rounds toward minus infinity
    r[2] += a % b           // and the remainder has the sign of b
    r[3] += (a & b) + (a | b) * 10 + (a ^ b) * 100
    r[4] += (a < b) + (a <= b) * 2 + (a > b) * 4 + (a >= b) * 8 + (a = b) * 16 + (a != b) * 32
    r[5] += !(a = 0) && b != 0 || 0
    r[6] += -a + K
    r[7] ^= 5
procedure main()
    int r[8]
    skip
"""


@pytest.mark.parametrize("a,b", [(7, 3), (-7, 3), (7, -3), (-7, -3), (5, 5), (0, 4)])
def test_integer_operators_have_janus_semantics(tmp_path, a, b):
    prog, _ = janus(tmp_path, OPERATORS)
    _, _, r = prog.call("ops", a, b, np.zeros(8, np.int64))
    want = [a + 2 * b - 1, a // b, a % b, (a & b) + (a | b) * 10 + (a ^ b) * 100,
            (a < b) + (a <= b) * 2 + (a > b) * 4 + (a >= b) * 8 + (a == b) * 16 +
            (a != b) * 32, int(a != 0 and b != 0), -a + 7, 5]
    assert r.tolist() == want
    assert prog.uncall("ops", a, b, r)[2].tolist() == [0] * 8


def test_short_circuit_guards_an_out_of_bounds_read(tmp_path):
    prog, _ = janus(tmp_path, """
procedure f(int n, int a[], int hits)
    if n != 0 && a[n - 1] = 5 then
        hits += 1
    fi hits = 1
procedure main()
    int a[3]
    skip
""")
    assert prog.call("f", 0, np.array([5, 0, 0]), 0)[2] == 0     # a[-1] never read
    assert prog.call("f", 1, np.array([5, 0, 0]), 0)[2] == 1


STACKS = """
procedure move(stack src, stack dst, int n)
    local int m = 0
    from m = 0 loop
        local int x = 0
        pop(x, src)
        push(x, dst)
        delocal int x = 0
        m += 1
    until m = n
    delocal int m = n

procedure reverse(stack s)
    if !empty(s) then
        local int x = 0
        local int n = size(s) - 1
        pop(x, s)
        call reverse(s)
        local stack t = nil
        call move(s, t, n)
        push(x, s)
        call move(t, s, n)
        delocal stack t = nil
        delocal int n = size(s) - 1
        delocal int x = 0
    fi !empty(s)

procedure main()
    stack s
    int x
    int t
    x += 1
    push(x, s)
    x += 2
    push(x, s)
    x += 3
    push(x, s)
    t += top(s)
    call reverse(s)
"""


def test_stacks_push_pop_top_size_empty_and_nil(tmp_path):
    prog, _ = janus(tmp_path, STACKS)
    assert run_main(prog) == "s = <1, 2, 3]\nt = 3\nx = 0"
    assert prog.call("reverse", [1, 2, 3, 4]) == ([4, 3, 2, 1],)     # lists, top last
    assert prog.uncall("reverse", [4, 3, 2, 1]) == ([1, 2, 3, 4],)
    assert prog.call("move", [1, 2, 3], [], 2) == ([1], [3, 2], 2)
    empty = janus(tmp_path, "procedure main()\n    stack s\n    skip\n", "e.ja")[0]
    assert run_main(empty) == "s = nil"


def test_main_initialisers_arrays_2d_and_show(tmp_path, capsys):
    prog, _ = janus(tmp_path, """
#define N 3
procedure main()
    int a[N] = {4, 5, 6}
    int m[2][2] = {{1, 2}, {3, 4}}
    int k = -2
    stack s
    a[1] += m[1][0] * k
    m[0][1] <=> m[1][0]
    push(k, s)
    show(a, k, s)
    printf("m is %a, a[1] is %d%%", m, k)
    print("done")
""")
    assert run_main(prog) == "a[3] = {4, -1, 6}\nk = 0\nm[2][2] = {{1, 3}, {2, 4}}\ns = <-2]"
    assert capsys.readouterr().out.splitlines() == [
        "a[3] = {4, -1, 6}, k = 0, s = <-2]", "m is {{1, 3}, {2, 4}}, a[1] is 0%", "done"]


def test_output_statements_print_in_both_directions(tmp_path, capsys):
    prog, _ = janus(tmp_path, """
procedure f(int x)
    x += 1
    show(x)
procedure main()
    int x
    call f(x)
""")
    prog.call("f", 1)
    prog.uncall("f", 2)
    assert capsys.readouterr().out == "x = 2\nx = 2\n"
    prog.call("f", 1, engine="python")          # every engine prints them
    assert capsys.readouterr().out == "x = 2\n"


def test_output_statements_on_the_cli_every_engine_and_in_rvmb(tmp_path, capsys):
    (tmp_path / "prog.ja").write_text("""
procedure f(int x, int a[])
    x += 1
    a[x] += x
    printf("x is %d, a is %a", x, a)
procedure main()
    int x
    int a[3]
    stack s
    print("start")
    call f(x, a)
    push(x, s)
    show(x, a, s)
    uncall f(x, a)
""")
    want = cli("run", "prog.ja", "--engine", "interp", cwd=tmp_path)
    assert want.returncode == 0 and want.stdout.startswith(
        "start\nx is 1, a is {0, 1, 0}\nx = 0, a[3] = {0, 1, 0}, s = <1]\n"), want.stderr
    for engine in ("python", "native"):
        out = cli("run", "prog.ja", "--engine", engine, cwd=tmp_path)
        assert (out.returncode, out.stdout) == (0, want.stdout), (engine, out.stderr)
    # a .rvmb file keeps them: it prints what its source prints
    assert cli("compile", "prog.ja", "-o", "prog.rvmb", cwd=tmp_path).returncode == 0
    loaded = rvm.load(tmp_path / "prog.rvmb")
    assert loaded.functions["f"].outputs == rvm.load(tmp_path / "prog.ja").functions["f"].outputs
    from rvm.engines.machine import Machine
    for engine in ("interp", "python", "native"):
        assert Machine(loaded, engine=engine).call("f", 1, np.zeros(3, np.int64))[0] == 2
        assert capsys.readouterr().out == "x is 2, a is {0, 0, 2}\n", engine


def test_error_messages_name_the_janus_line_and_values(tmp_path):
    cases = {
        "fi": ("procedure main()\n    int x\n    if x = 0 then\n        x += 1\n    fi x = 5\n",
               "prog.ja:3: the fi assertion `x = 5` (line 5) is false after the then-branch "
               "of the if at line 3 (x = 1)"),
        "from": ("procedure main()\n    int i\n    from i = 0 loop\n        i -= 1\n"
                 "        i += 1\n    until i = 3\n",
                 "the from assertion `i = 0` of the loop at line 3 is true on a later "
                 "iteration"),
        "delocal": ("procedure main()\n    int y\n    local int x = 2\n        y += x\n"
                    "    delocal int x = 3\n", "prog.ja:5: delocal int x = 3: x is 2, not 3"),
        "pop": ("procedure main()\n    int x\n    stack s\n    push(x, s)\n    x += 5\n"
                "    pop(x, s)\n", "prog.ja:6: pop(x, s): x = 5; pop needs x = 0"),
        "empty": ("procedure main()\n    int x\n    stack s\n    pop(x, s)\n",
                  "pop(x, s): pop from the empty stack s"),
        "error": ("procedure main()\n    int x\n    error(\"no way back\")\n",
                  "prog.ja:3: error: no way back"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / "prog.ja").write_text(text)
        out = cli("run", "prog.ja", cwd=tmp_path)
        assert out.returncode == 1, name
        assert message in out.stderr, (name, out.stderr)
        assert "Traceback" not in out.stderr


@pytest.mark.parametrize("text,message", [
    ("procedure main()\n    int x\n    x += y\n", "3:10: error: variable 'y' is not declared"),
    ("procedure main()\n    if !5 then\n        skip\n    fi false\n",
     "2:8: error: ! takes a boolean"),
    ("procedure main()\n    int x\n    if !x then\n        skip\n    fi true\n",
     "3:8: error: ! takes a boolean"),
    ("procedure main()\n    int x\n    x = 1\n", "3:7: error: expected +=, -=, ^= or <=>"),
    ("procedure f(int x)\n    x += 1\n", "no procedure main()"),
    ("procedure main()\n    int x\n    local int t = 0\n        x += t\n    delocal int u = 0\n",
     "delocal u does not match local t"),
    ("procedure main()\n    int x\n    /* open\n", "unterminated /* comment"),
    ("procedure main()\n    int a[2]\n    a += 1\n", "a is an array; update its elements"),
    ("procedure main()\n    int x\n    iterate int i = 0 3\n    end\n", "3:23: error: "
     "expected 'to', found '3'"),
    ("struct p { int x }\nprocedure main()\n    p v\n    v.y += 1\n",
     "4:7: error: struct p has no field 'y'"),
    ("struct p { int x }\nprocedure main()\n    p v\n    v += 1\n",
     "4:5: error: v is a struct: name a field (v.field)"),
    ("procedure main(int x)\n    skip\n", "main takes no parameters"),
    ("procedure main()\n    int x\n    x += x + 1\n", "3:"),
    ("procedure main()\n    int a[2]\n    stack s\n    push(a, s)\n",
     "4:10: error: a is an array; push and pop move an int"),
    ("procedure f(int a[])\n    a[0] += 1\nprocedure main()\n    int x\n    call f(x)\n",
     "5:12: error: argument a of f is an array, but x is an int"),
    ("procedure f(int a)\n    a += 1\nprocedure main()\n    int x\n    call f(x, x)\n",
     "f takes 1 argument, given 2"),
    ("procedure main()\n    int x\n    local int t = 0\n        x += t\n"
     "    delocal stack t = nil\n", "delocal stack t: t was declared int"),
    ("procedure main()\n    stack s\n    int x\n    x += s\n",
     "s is a stack; an expression needs an int"),
])
def test_compile_errors_have_file_line_col_and_caret(tmp_path, text, message):
    (tmp_path / "prog.ja").write_text(text)
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1
    assert message in out.stderr and "prog.ja:" in out.stderr and "^" in out.stderr \
        and "Traceback" not in out.stderr, out.stderr


def test_compile_dis_and_debugger(tmp_path):
    path = tmp_path / "fib.ja"
    path.write_text(FIB)
    out = cli("compile", path, "--emit", "asm")
    assert out.returncode == 0 and "call fib(x1, x2, n)" in out.stdout
    assert cli("dis", path).returncode == 0
    out = cli("compile", path, "-o", tmp_path / "fib.rvmb")
    assert out.returncode == 0
    assert rvm.load(tmp_path / "fib.rvmb").call("fib", 0, 0, 4) == (5, 8, 0)
    transcript = rvm.debug(rvm.load(path)["fib"], 0, 0, 2,
                           commands=["break 11", "continue", "info locals", "back", "where"])
    assert "fib.ja:11" in transcript and "x1" in transcript


def test_python_subset_do_loop_delocal_assert_and_print(capsys):
    @rvm.reversible
    def tri(n: int, s: int):
        with rvm.ancilla(i=0):
            with rvm.from_(i == 0, until=i == n):
                i += 1
                rvm.loop()
                s += i
            rvm.delocal(i=n)
        assert s >= 0
        print("s is", s)

    assert tri(4, 0) == (4, 6)
    assert (~tri)(4, 6) == (4, 0)
    assert capsys.readouterr().out == "s is 6\ns is 6\n"
    with pytest.raises(rvm.InvertibilityError, match="assertion `s >= 0` failed"):
        tri(4, -20)


def test_compile_janus_is_the_loader():
    prog = compile_janus(str(ROOT / "examples/janus/perm_to_code.ja"))
    assert "perm_to_code" in prog.functions and "main" in prog.functions


def test_same_bytecode_as_the_python_subset(tmp_path):
    """A Janus procedure and the same procedure in the Python subset compile alike (with
    the overflow checks of the int updates left out)."""
    (tmp_path / "prog.ja").write_text(PERM)
    prog = compile_janus(str(tmp_path / "prog.ja"), checked=False)
    path = tmp_path / "perm.py"
    path.write_text('''
import rvm
from rvm import ancilla, delocal, from_, loop, Array

@rvm.reversible
def perm_to_code(x: Array[int]):
    with ancilla(k=len(x)):
        with from_(k == len(x), until=k == 0):
            loop()
            k -= 1
            with ancilla(j=0):
                with from_(j == 0, until=j == k):
                    loop()
                    if (x[j] > x[k], x[j] >= x[k]):
                        x[j] -= 1
                    j += 1
                delocal(j=k)
        delocal(k=0)
''')
    py = rvm.load(path)

    def ops(p):
        return [(i.op, i.args) for i in p.functions["perm_to_code"].code]
    assert ops(prog) == ops(py)


# jana's alias rule: an update or a swap may not read what it changes (its index, or the
# update's expression); where the text shows it, refused when compiling, as jana does
# whenever the statement runs ("Identifiers `v' and `v' are aliases")
ALIASES = {
    "swap index": ("int v[3] = {1, 2, 0}\n    v[0] <=> v[v[0]]\n    v[0] <=> v[v[0]]\n",
                   "3:16: error: identifiers v and v are aliases: the index of v[v[0]] "
                   "reads v, which the swap changes"),
    "update index": ("int x[3] = {1, 2, 0}\n    x[x[0]] ^= 1\n",
                     "3:7: error: identifiers x and x are aliases: the index of x[x[0]] "
                     "reads x, which the update changes"),
    "update reads itself": ("int x = 3\n    x += x\n",
                            "3:10: error: identifiers x and x are aliases: the expression "
                            "of the update reads x"),
    "swap with itself": ("int x = 3\n    x <=> x\n",
                         "3:11: error: identifiers x and x are aliases: x is swapped with "
                         "itself"),
    "element with itself": ("int v[3]\n    v[1] <=> v[1]\n",
                            "3:14: error: identifiers v and v are aliases: v[1] is swapped "
                            "with itself"),
    "index reads the other side": ("int v[3]\n    int k\n    v[k] <=> k\n",
                                   "4:7: error: identifiers k and k are aliases: the index "
                                   "of v[k] reads k, which the swap changes"),
    "same element read": ("int x[3]\n    int y[3]\n    int i\n    x[i] += y[x[i]]\n",
                          "5:15: error: identifiers x and x are aliases: x[i] is the "
                          "element the update changes"),
    "read through an index": ("int x[3]\n    x[0] += x[x[1]]\n",
                              "3:15: error: identifiers x and x are aliases: the index of "
                              "x[x[1]] in the expression reads x"),
}


@pytest.mark.parametrize("case", list(ALIASES))
def test_aliases_are_refused_when_compiling(tmp_path, case):
    body, message = ALIASES[case]
    path = tmp_path / "prog.ja"
    path.write_text(f"procedure main()\n    {body}")
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1 and out.stdout == ""
    assert f"prog.ja:{message}" in out.stderr and "^" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "register" not in out.stderr
    with pytest.raises(rvm.CompileError, match=r"identifiers . and . are aliases"):
        rvm.load(path)


SWAPS = """
procedure f(int v[], int i, int j)
    v[i] <=> v[j]
    v[i] += v[j] + v[2]

procedure main()
    int v[3] = {1, 2, 0}
    int i = 1
    int j = 1
    call f(v, i, j)
"""


def test_elements_that_are_equal_only_while_running_are_refused_then(tmp_path):
    """v[i] <=> v[j] and v[i] += v[j] are aliases when i = j: checked when the statement
    runs (in either direction), reported in Janus terms as jana does."""
    prog, path = janus(tmp_path, SWAPS)
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:3: identifiers v and v are aliases: v[i] and v[j] are the same element " \
        "(i = 1, j = 1)" in out.stderr, out.stderr
    with pytest.raises(rvm.InvertibilityError, match=r"prog.ja:4: identifiers v and v are "
                       r"aliases: v\[i\] and one of v\[j\], v\[2\] are the same element "
                       r"\(i = 2, j = 0\)"):
        prog.call("f", np.array([1, 2, 0]), 2, 0)
    with pytest.raises(rvm.InvertibilityError, match="v and v are aliases"):
        prog.uncall("f", np.array([1, 2, 0]), 1, 1)
    # distinct elements are fine, and uncalling undoes the call
    v, i, j = prog.call("f", np.array([1, 2, 0]), 0, 1)
    assert v.tolist() == [2 + 1 + 0, 1, 0]
    assert prog.uncall("f", v, i, j)[0].tolist() == [1, 2, 0]


CALLS = """
procedure g(int a, int b)
    a += 5
    b += 7

procedure main()
    int v[3] = {0, 2, 0}
    int i = 1
    int j = 2
    call g(v[i], v[j])
"""


@pytest.mark.parametrize("call,message", [
    ("call g(v[v[0]], i)", "10:14: error: identifiers v and v are aliases: the index of "
     "v[v[0]] reads v, which the call is given"),
    ("call g(v[i], i)", "10:14: error: identifiers i and i are aliases: the index of v[i] "
     "reads i"),
    ("call g(v[1], v[1])", "10:18: error: identifiers v and v are aliases: v[1] is passed "
     "twice"),
    ("call g(v, v[1])", "10:15: error: identifiers v and v are aliases: v is passed beside "
     "its element v[1]"),
])
def test_elements_passed_to_a_call_may_not_alias(tmp_path, call, message):
    """An element passed is exchanged in and, after the call, back out by its index."""
    path = tmp_path / "prog.ja"
    path.write_text(CALLS.replace("call g(v[i], v[j])", call))
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1 and f"prog.ja:{message}" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and "register" not in out.stderr
    with pytest.raises(rvm.CompileError, match="are aliases"):
        rvm.load(path)


def test_two_elements_passed_are_checked_to_differ(tmp_path):
    prog, path = janus(tmp_path, CALLS)
    assert run_main(prog) == "i = 1\nj = 2\nv[3] = {0, 7, 7}"
    path.write_text(CALLS.replace("int j = 2", "int j = 1"))
    out = cli("run", path)
    assert out.returncode == 1 and "prog.ja:10: identifiers v and v are aliases: v[i] and " \
        "v[j] are the same element (i = 1, j = 1)" in out.stderr, out.stderr


# an update of an element of a two-dimensional array may read other elements of it (the
# fork's and PyJanus's LU decomposition): checked while running, as they check it
MATRIX = """
procedure elim(int m[][], int i, int k)
    m[i][0] -= m[i][k] * m[k][0]

procedure main()
    int m[3][3] = {{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
    int i = 1
    int k = 2
    call elim(m, i, k)
    m[k][i] += m[i][k] + m[0][0]
"""


def test_a_2d_update_reading_its_own_array_is_checked_while_running(tmp_path):
    prog, path = janus(tmp_path, MATRIX)
    # the fork and PyJanus print this: 4 - 6 * 7 = -38; then 8 + 6 + 1 = 15
    want = "i = 1\nk = 2\nm[3][3] = {{1, 2, 3}, {-38, 5, 6}, {7, 15, 9}}"
    assert run_main(prog) == want
    out = cli("run", path, "--engine", "native")
    assert out.returncode == 0 and out.stdout == want + "\n", out.stderr
    m = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert prog.uncall("elim", *prog.call("elim", m.copy(), 2, 1))[0].tolist() == m.tolist()
    # the element written is one read: an error naming the array, the indices and the
    # line, forwards (m[1][0] and m[1][0] when k = 0) and backwards
    message = (r"prog.ja:3: identifiers m and m are aliases: m\[i\]\[0\] and one of "
               r"m\[i\]\[k\], m\[k\]\[0\] are the same element \(i = 1, k = 0\)")
    with pytest.raises(rvm.InvertibilityError, match=message):
        prog.call("elim", m.copy(), 1, 0)
    with pytest.raises(rvm.InvertibilityError, match=message):
        prog.uncall("elim", m.copy(), 1, 0)
    with pytest.raises(rvm.InvertibilityError, match=r"m\[k\]\[0\] are the same element "
                       r"\(i = 0, k = 0\)"):
        prog.call("elim", m.copy(), 0, 0)
    path.write_text(MATRIX.replace("int k = 2", "int k = 1").replace(
        "    call elim(m, i, k)\n", ""))
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:9: identifiers m and m are aliases: m[k][i] and one of m[i][k], " \
        "m[0][0] are the same element (k = 1, i = 1)" in out.stderr, out.stderr


def test_a_2d_update_of_the_element_it_reads_is_refused_when_compiling(tmp_path):
    path = tmp_path / "prog.ja"
    path.write_text("procedure main()\n    int m[2][2]\n    int i\n    m[i][0] += m[i][0] * 2\n")
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1 and "prog.ja:4:16: error: identifiers m and m are aliases: " \
        "m[i][0] is the element the update changes" in out.stderr, out.stderr


# the fork's generated object code: a dispatch procedure calls a method of every class,
# the abstract ones included, and passes the heap counter both as itself and as `this`
OBJECTS = """
procedure dispatch(int heap[][], int counter, int this, int x)
    if heap[this][0] = 1 then
        call Shape_area(heap, counter, this, x)
    else
        call Square_area(heap, counter, this, x)
    fi heap[this][0] = 1

procedure Square_area(int heap[][], int counter, int this, int x)
    x += heap[this][1] * heap[this][1]

procedure construct(int heap[][], int counter, int this, int side)
    heap[this][0] += 2
    heap[this][1] += side

procedure main()
    int heap[4][2]
    int counter = 1
    int x
    call construct(heap, counter, counter, 3)
    call dispatch(heap, counter, counter, x)
"""


def test_a_call_to_an_undefined_procedure_is_an_error_only_when_it_runs(tmp_path):
    """jana, the fork and PyJanus look a procedure up when the call runs."""
    prog, path = janus(tmp_path, OBJECTS)
    assert run_main(prog) == "counter = 1\nheap[4][2] = {{0, 0}, {2, 3}, {0, 0}, {0, 0}}" \
        "\nx = 9"
    path.write_text(OBJECTS.replace("heap[this][0] += 2", "heap[this][0] += 1"))
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:4: procedure 'Shape_area' is not defined" in out.stderr, out.stderr
    out = cli("run", path, "--engine", "native")
    assert out.returncode == 1 and "procedure 'Shape_area' is not defined" in out.stderr, \
        out.stderr


def test_an_int_passed_twice_is_refused_only_where_the_procedure_changes_it(tmp_path):
    prog, path = janus(tmp_path, OBJECTS.replace("call Shape_area", "call Square_area"))
    assert run_main(prog).endswith("x = 9")
    # construct changes `this` through a procedure it passes it to: jana's alias error
    changed = OBJECTS.replace("heap[this][1] += side", "call bump(this)") + \
        "\nprocedure bump(int y)\n    y += 1\n"
    path.write_text(changed)
    out = cli("run", path)
    assert out.returncode == 1 and "prog.ja:20:35: error: identifiers counter and counter " \
        "are aliases: counter is passed twice to construct, which changes its parameter " \
        "this" in out.stderr, out.stderr


UNUSED = """
procedure unused(int m)
    m += n

procedure main()
    int x
    x += 1
"""


def test_an_undeclared_variable_in_a_procedure_no_call_names_is_an_error_when_it_runs(
        tmp_path):
    """The references look a variable up when the statement runs (the fork's
    matrixmult.ja keeps a procedure that is never called and reads an undeclared n)."""
    prog, path = janus(tmp_path, UNUSED)
    assert run_main(prog) == "x = 1"
    out = cli("run", path, "--entry", "unused", "--args", "1")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:2: procedure unused: variable 'n' is not declared (line 3)" in \
        out.stderr, out.stderr
    path.write_text(UNUSED + "    call unused(x)\n")       # called: refused when compiling
    out = cli("run", path)
    assert out.returncode == 1 and "prog.ja:3:10: error: variable 'n' is not declared" in \
        out.stderr, out.stderr


def test_hexadecimal_and_binary_literals(tmp_path):
    prog, _ = janus(tmp_path, "procedure main()\n    int x = 0x1F\n    int y\n"
                    "    y += 0b101 + 0XA\n")
    assert run_main(prog) == "x = 31\ny = 15"


# ---------------------------------------------------------------------- the corpus's dialects

NO_PARAMS = """\
procedure nothing()
    skip

procedure main()
    int a[2]
    stack s
    int x
    call nothing()
    uncall nothing()
    x += 2
    push(x, s)
"""


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_a_procedure_without_parameters_runs_on_every_engine(tmp_path, engine):
    """The compiled engines generated `, = F(M, )` for a call of one (a traceback)."""
    path = tmp_path / "prog.ja"
    path.write_text(NO_PARAMS)
    out = cli("run", path, "--engine", engine)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "a[2] = {0, 0}\ns = <2]\nx = 0\n"


def test_infinite_recursion_is_a_clear_error(tmp_path):
    path = tmp_path / "prog.ja"
    path.write_text("procedure test()\n    call test()\n\nprocedure main()\n    call test()\n")
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:2: call depth limit" in out.stderr and "recursion" in out.stderr


def test_janus_files_are_janus_and_the_forks_constructs_run(tmp_path):
    """tests/data/janus/edges.janus: a .janus file; a 2-D array given to `int e[]`
    (indexed with two indices); several locals in one local; a local array sized by an
    expression; an array sized by its initialiser and by an expression over main's
    earlier variables; c ? a : b; a u8 that wraps. Every engine, forwards and back."""
    path = ROOT / "tests/data/janus/edges.janus"
    want = "edges[4][2] = {{0, 1}, {0, 2}, {1, 2}, {2, 0}}\nnodes = 3\nout[3] = {20, 1, " \
        "1}\nsmall = 235\n"
    for engine in ("interp", "python", "native"):
        out = cli("run", path, "--engine", engine)
        assert out.returncode == 0 and out.stdout == want, (engine, out.stderr)
    prog = rvm.load(path)
    final = prog.call("main", *main_arguments(prog))
    start = prog.uncall("main", *final)
    assert [np.asarray(v).tolist() for v in start] == \
        [np.asarray(v).tolist() for v in main_arguments(prog)]


ARGS = """\
procedure add(int x, int y)
    x += y

procedure main()
    int q
    int r = 4
    call add(q, 5)
    call add(q, r + 1)
    uncall add(q, 2)
"""


def test_literal_and_expression_arguments_are_passed_by_value(tmp_path):
    prog, path = janus(tmp_path, ARGS)
    assert run_main(prog) == "q = 8\nr = 4"
    path.write_text(ARGS.replace("    x += y", "    y += 1"))
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:7: call add: the argument 5 is passed by value" in out.stderr, out.stderr


def test_two_dimensional_arrays_print_every_dimension(tmp_path):
    prog, _ = janus(tmp_path, "procedure main()\n    int m[2][3] = {{1}, {4, 5}}\n"
                    "    m[1][2] += 6\n")
    assert run_main(prog) == "m[2][3] = {{1, 0, 0}, {4, 5, 6}}"


def test_a_flexible_parameter_takes_one_shape_only(tmp_path):
    text = ("procedure f(int a[])\n    a[0][1] += 1\n\nprocedure main()\n    int v[3]\n"
            "    call f(v)\n")
    with pytest.raises(rvm.CompileError, match="argument a of f is a 2-D array, but v is "
                       "an array"):
        janus(tmp_path, text)


SIZED_INTS = """\
procedure main()
    u8 b
    i8 s
    u16 w
    int n
    b -= 3
    s += 120
    s += 10
    w ^= 65537
    n += 2147483648
    n += 10
"""


def test_sized_integers_wrap_as_the_forks_do(tmp_path):
    prog, path = janus(tmp_path, SIZED_INTS)
    assert run_main(prog) == "b = 253\nn = 2147483658\ns = -126\nw = 1"
    final = prog.call("main", *main_arguments(prog))
    assert list(prog.uncall("main", *final)) == [0, 0, 0, 0]
    out = cli("run", "-m32", path)             # -m: every int is a 32-bit one
    assert out.returncode == 0 and "n = -2147483638" in out.stdout, out.stderr
    out = cli("run", path, "-m", "8")
    assert out.returncode == 0 and "n = 10" in out.stdout, out.stderr


def test_an_index_out_of_bounds_names_the_array_index_and_size(tmp_path):
    path = tmp_path / "prog.ja"
    path.write_text("procedure f(int x[], int i)\n    x[i] += 1\n\nprocedure main()\n"
                    "    int x[3]\n    int m[2][3]\n    int i\n    m[1][i + 3] += 1\n")
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:8: m: array second index 3 was out of bounds (array size was 3; " \
        "m[2][3])" in out.stderr, out.stderr
    assert "assertion" not in out.stderr
    path.write_text(path.read_text().replace("m[1][i + 3] += 1", "i -= 1\n    call f(x, i)"))
    out = cli("run", path)
    assert out.returncode == 1 and "prog.ja:2: x: array index -1 was out of bounds (array " \
        "size was 3; x[3])" in out.stderr, out.stderr


def test_an_array_parameter_of_a_given_size_checks_the_size(tmp_path):
    path = tmp_path / "prog.ja"
    path.write_text("procedure foo(int x[3])\n    skip\n\nprocedure main()\n    int x[4]\n"
                    "    call foo(x)\n")
    out = cli("run", path)
    assert out.returncode == 1 and "prog.ja:1: argument x of foo has 4 elements; foo " \
        "expects an array of size 3" in out.stderr, out.stderr


def test_a_local_array_must_end_as_declared(tmp_path):
    path = tmp_path / "prog.ja"
    path.write_text("procedure main()\n    int x\n    local int a[2] = {1, 2}, int k = 1\n"
                    "        x += a[k]\n        a[0] += 1\n    delocal int a[2] = {1, 2}, "
                    "int k = 1\n")
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "delocal a = {1, 2}: a does not hold these values" in out.stderr, out.stderr
    path.write_text(path.read_text().replace("        a[0] += 1\n", ""))
    assert cli("run", path).stdout == "x = 2\n"


# jana's integers are unbounded, rvm's int64: an update that would leave int64 stops
# with an overflow error naming the variable (the check before it forwards, the one
# after it backwards), where it used to wrap silently
OVERFLOW = """\
procedure grow(int x, int n)
    x += n * 2

procedure step(int x, int a[])
    x -= 1
    a[1] += a[0]

procedure main()
    int x = 9223372036854774800
    int n = 499
    call grow(x, n)
    n += 1
    call grow(x, n)
"""


def test_an_update_leaving_int64_is_an_overflow_error(tmp_path):
    prog, path = janus(tmp_path, OVERFLOW)
    top = 2 ** 63 - 1
    assert prog.call("grow", top - 998, 499) == (top, 499)      # up to the edge: fine
    out = cli("run", path, "--no-overflow-checks")       # asked for: wraps, as before
    assert out.returncode == 0 and "x = -9223372036854774818" in out.stdout
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:2: integer overflow: x += n * 2 would make x = 9223372036854776798" \
        in out.stderr and "(x = 9223372036854775798, n * 2 = 1000)" in out.stderr
    for engine in ("interp", "python"):
        with pytest.raises(rvm.InvertibilityError, match="x -= 1 would make x = "
                           "-9223372036854775809"):
            prog.call("step", -top - 1, np.zeros(2, np.int64), engine=engine)
        with pytest.raises(rvm.InvertibilityError, match=r"a\[1\] \+= a\[0\] would take "
                           r"a\[1\] beyond the 64-bit integers"):
            prog.call("step", 0, np.array([5, top - 4]), engine=engine)


def test_an_overflow_running_backwards_is_reported_before_it_wraps(tmp_path):
    prog, _ = janus(tmp_path, OVERFLOW)
    bottom = -2 ** 63
    assert prog.uncall("grow", bottom + 998, 499) == (bottom, 499)
    with pytest.raises(rvm.InvertibilityError, match="running backwards, x \\+= n \\* 2 is "
                       "undone as x -= n \\* 2, which would make x = -9223372036854775810"):
        prog.uncall("grow", bottom + 998, 500)
    with pytest.raises(rvm.InvertibilityError, match="running backwards, x -= 1 is undone "
                       "as x \\+= 1, which would make x = 9223372036854775808"):
        prog.uncall("step", 2 ** 63 - 1, np.zeros(2, np.int64))


def test_sized_and_modular_integers_still_wrap(tmp_path):
    prog, _ = janus(tmp_path, "procedure main()\n    i64 x = 9223372036854775807\n"
                    "    int y\n    x += 1\n    y += 2147483647\n    y += 1\n")
    assert run_main(prog) == "x = -9223372036854775808\ny = 2147483648"
    modular = compile_janus(str(tmp_path / "prog.ja"), modular=32)
    assert run_main(modular) == "x = -9223372036854775808\ny = -2147483648"


# stacks hold 65536 elements at first (jana's are unbounded; rvm's were full at 1024), and
# grow: a run that fills one starts again with stacks twice as large (main's and local
# ones), up to the memory limit, which is a clear error naming the stack
DEEP_STACK = """\
procedure fill(stack s, int n)
    local int i = 0
    from i = 0 loop
        local int x = i
        push(x, s)
        delocal int x = 0
        i += 1
        if i % 500 = 0 then
            printf("%d pushed", i)
        fi i % 500 = 0
    until i = n
    delocal int i = n

procedure main()
    stack s
    int n = 1500
    int m
    call fill(s, n)
    local stack t = nil
        call fill(t, n)
        m += size(t)
        uncall fill(t, n)
    delocal stack t = nil
"""
PRINTED = "500 pushed\n1000 pushed\n1500 pushed\n"


def test_stacks_grow_up_to_the_memory_limit(tmp_path):
    prog, path = janus(tmp_path, DEEP_STACK)
    store = run_main(prog).splitlines()
    assert store[1] == "n = 1500" and store[2].startswith("s = <1499, 1498, 1497, ")
    assert store[2].endswith(", 1, 0]") and store[0] == "m = 1500"
    for engine in ("interp", "python", "native"):
        # main's stack and the local one fill at 100 elements, 200, ... 800: each run
        # starts again with both twice as large; what a stopped run printed is not
        # printed again (uncalling fill prints backwards: the lines in reverse)
        small = cli("run", path, "--stack-capacity", "100", "--engine", engine)
        assert small.returncode == 0, small.stderr
        lines = small.stdout.splitlines()
        assert lines[:9] == PRINTED.splitlines() * 2 + PRINTED.splitlines()[::-1], lines
        assert lines[9:] == store
    back = cli("run", path, "--stack-capacity", "100", "--backward", "--engine", "native")
    assert back.returncode == 1 and "Traceback" not in back.stderr     # (n = 0 backwards)
    # from Python: a stack given as a list, a procedure's local stack
    small = compile_janus(str(path), stack_capacity=8)
    assert small.call("fill", [7, 8], 300)[0] == [7, 8, *range(300)]
    assert small.uncall("fill", [7, 8, *range(300)], 300)[0] == [7, 8]
    assert run_main(small).splitlines() == store
    # past the memory: the full stack, and the limit, named (the old message's option)
    tight = cli("run", path, "--stack-capacity", "100", "--heap-limit", "2000")
    assert tight.returncode == 1 and "Traceback" not in tight.stderr
    assert "prog.ja:5: push(x, s): the stack s is full (800 elements), and stacks twice " \
        "as large do not fit the machine's memory limit of 2000 cells" in tight.stderr, \
        tight.stderr
    # a memory limit the starting stacks do not fit: they start smaller, and grow
    roomy = cli("run", path, "--heap-limit", "20000")
    assert roomy.returncode == 0 and roomy.stdout.splitlines()[-3:] == store, roomy.stderr
    assert roomy.stdout.splitlines()[:3] == PRINTED.splitlines()
    huge = cli("run", path, "--stack-capacity", 1 << 25)     # past the heap: smaller
    assert huge.returncode == 0 and huge.stdout.splitlines()[-3:] == store, huge.stderr
    huge = cli("run", path, "--stack-capacity", 1 << 38)     # past the computer's memory
    assert huge.returncode == 1 and "Traceback" not in huge.stderr
    # the debugger keeps the capacity it starts with, and says how to start larger
    (tmp_path / "cmds").write_text("continue\nquit\n")
    dbg = cli("debug", path, "--stack-capacity", "100", "--batch", tmp_path / "cmds")
    assert "push(x, s): the stack s is full (100 elements, its capacity" in dbg.stdout + \
        dbg.stderr and "the debugger and rvm run --trace do not: start them with larger " \
        "ones, --stack-capacity N" in dbg.stdout + dbg.stderr


def test_only_a_full_stack_grows_and_only_stacks_past_memory_are_blamed_on_it(tmp_path):
    """An error() whose text reads like a full stack does not grow the stacks; a memory
    error that is not the stacks' (a local array, after the stacks grew) is reported as
    it is; a stack array whose size cell does not fit it is refused (it was padded and
    read as garbage); a stack on the command line is its elements; the program's
    default engine stays after a growth; later calls start with the grown stacks."""
    _, path = janus(tmp_path, """\
procedure main()
    stack s
    int t
    int i
    from i = 0 loop
        t += i
        push(t, s)
        i += 1
    until i = 3
    local int a[500]
    delocal int a[500]
""")
    out = cli("run", path, "--stack-capacity", "2", "--heap-limit", "300")
    assert out.returncode == 1 and "is full" not in out.stderr
    assert "prog.ja:10: heap limit of 300 cells exceeded" in out.stderr, out.stderr
    _, lpath = janus(tmp_path, 'procedure main()\n    int x\n'
                         '    error("push(x, s): the stack s is full (3 elements")\n',
                         "lying.ja")
    out = cli("run", lpath)
    assert out.returncode == 1 and out.stderr.count("error: push(x, s)") == 1
    assert "capacity" not in out.stderr and "Traceback" not in out.stderr
    fill, fpath = janus(tmp_path, DEEP_STACK, "fill.ja")
    with pytest.raises(rvm.UsageError, match="stack s: an array given for a stack"):
        fill.call("fill", np.array([5, 6]), 2)
    assert fill.call("fill", np.array([1, 6, 0]), 2)[0] == [6, 0, 1]
    out = cli("run", fpath, "--entry", "fill", "--args", "[7,8]", "2", "--json",
              "--stack-capacity", "1")
    assert out.returncode == 0 and '"s": [7, 8, 0, 1]' in out.stdout, out.stderr
    small = compile_janus(str(fpath), stack_capacity=2)
    import attrs
    small = attrs.evolve(small, engine="interp")
    assert small.call("fill", [], 40)[0] == list(range(40))
    latest = small.cache["janus"]["latest"]
    assert latest.engine == "interp" and latest.cache["janus"]["stack_capacity"] == 64
    assert small.call("fill", [], 3)[0] == [0, 1, 2]
    assert small.cache["janus"]["latest"] is latest


# PyJanus's iterate: i takes a, a + s, ... b (none where a = b + s); the bounds are
# computed once and must be unchanged at the end; the loop runs backwards from b to a
ITERATE = """\
procedure sum(int a[], int total)
    iterate int i = 0 to size(a) - 1
        total += a[i] * (i + 1)
    end

procedure main()
    int a[4] = {1, 2, 3, 4}
    int total
    int evens
    int n = 10
    int none
    call sum(a, total)
    iterate int k = n by -2 to 2
        evens += k
    end
    iterate int k = 1 to 0
        none += 1
    end
"""


def test_iterate_counts_from_a_to_b_and_uncalls(tmp_path):
    prog, path = janus(tmp_path, ITERATE)
    out = cli("run", path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "a[4] = {1, 2, 3, 4}\nevens = 30\nn = 10\nnone = 0\ntotal = 30\n"
    assert prog.call("sum", np.array([5, 1]), 0)[1] == 7
    assert prog.uncall("sum", np.array([5, 1]), 7)[1] == 0
    assert prog.call("sum", np.array([5, 1]), 0, engine="python")[1] == 7


@pytest.mark.parametrize("loop,message", [
    ("iterate int i = 0 by 2 to n\n        x += i\n    end",
     "prog.ja:4: iterate int i = 0 by 2 to n: i = 6 has stepped past n without reaching it"),
    ("iterate int i = 1 to n\n        n += 1\n    end",
     "prog.ja:4: iterate int i = 1 to n: the body changed the value of a bound"),
])
def test_iterate_that_cannot_end_is_an_error_not_a_hang(tmp_path, loop, message):
    path = tmp_path / "prog.ja"
    path.write_text(f"procedure main()\n    int x\n    int n = 5\n    {loop}\n")
    out = cli("run", path)
    assert out.returncode == 1 and message in out.stderr and "Traceback" not in out.stderr


# PyJanus's structs: int and int-array fields, variables and arrays of them in main and
# as parameters, p.x, a[i].f, a[i].f[j], passed whole, by element or by field
STRUCTS = """\
struct pair { int x, int y }
struct node {
    int val,
    int next,
    u8 tag,
    int hist[3]
}

procedure bump(pair p, int d)
    p.x += d
    p.y -= p.x

procedure link(node pool[], int i, int head)
    pool[i].next ^= head
    head <=> i
    pool[head].tag -= 1
    pool[head].hist[1] += pool[head].val

procedure twist(int a, int b)
    a <=> b

procedure main()
    pair p = {3, 4}
    pair q
    pair ps[2] = {{1, 2}}
    node pool[3] = {{0}, {10}, {20, 0, 0, {1, 2, 3}}}
    int head
    int i = 2
    call bump(p, i)
    call twist(p.x, p.y)
    call link(pool, i, head)
    q.x += size(pool)
    q.y += pool[2].hist[2]
    call bump(q, p.y)
    call bump(ps[1], q.x)
    show(p, ps)
    p <=> q
"""


def test_structs_fields_arrays_of_structs_and_calls(tmp_path):
    prog, path = janus(tmp_path, STRUCTS)
    out = cli("run", path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (
        "p = {x = -1, y = 5}, ps[2] = {{x = 1, y = 2}, {x = 8, y = -8}}\n"
        "head = 2\ni = 0\np = {x = 8, y = -5}\n"
        "pool[3] = {{val = 0, next = 0, tag = 0, hist = {0, 0, 0}}, {val = 10, next = 0, "
        "tag = 0, hist = {0, 0, 0}}, {val = 20, next = 0, tag = 255, hist = {1, 22, 3}}}\n"
        "ps[2] = {{x = 1, y = 2}, {x = 8, y = -8}}\nq = {x = -1, y = 5}\n")
    start = main_arguments(prog)
    final = prog.call("main", *start)
    again = prog.uncall("main", *final)         # back to the initial store
    assert show_store(prog, again) == show_store(prog, start)
    # from Python, a struct parameter is its fields: pool.val, pool.next, ... in order
    val, nxt, tag, hist = (np.array([0, 7]), np.zeros(2, np.int64), np.zeros(2, np.int64),
                           np.zeros((2, 3), np.int64))
    res = prog.call("link", val, nxt, tag, hist, 1, 0)
    assert res[2].tolist() == [0, 255] and res[3][1].tolist() == [0, 7, 0]
    assert prog.uncall("link", *res)[2].tolist() == [0, 0]


def test_struct_errors_name_the_struct(tmp_path):
    head = "struct pair { int x, int y }\nprocedure g(pair a)\n    a.x += 1\n" \
        "procedure main()\n    pair ps[2]\n    int i = 2\n"
    for body, message in [
        ("    call g(ps)", "7:12: error: argument a of g is a pair, but ps is an array of "
                           "pair"),
        ("    local pair r = {1, 2}\n    delocal pair r = {1, 2}", "7:11: error: a local "
                                                                     "struct is not supported"),
    ]:
        (tmp_path / "prog.ja").write_text(head + body + "\n")
        out = cli("run", "prog.ja", cwd=tmp_path)
        assert out.returncode == 1 and message in out.stderr, out.stderr
    (tmp_path / "prog.ja").write_text(head + "    ps[i].x += 1\n")
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1 and "prog.ja:7: ps.x: array index 2 was out of bounds " \
        "(array size was 2; ps.x[2])" in out.stderr


def test_not_takes_booleans(tmp_path):
    """`!` of a comparison, of && / ||, of true/false and of empty(s) runs as in jana."""
    text = ("procedure main()\n    int x\n    stack s\n"
            "    if !(x = 0) || !true || !empty(s) || !(x > 1 && x < 0) then\n"
            "        x += 1\n    fi x = 1\n")
    path = tmp_path / "prog.ja"
    path.write_text(text)
    out = cli("run", path)
    assert out.returncode == 0 and out.stdout.startswith("s = nil\nx = 1"), out


@pytest.mark.parametrize("text,message", [
    ('procedure main()\n    error("stop here")\n', "prog.ja:2: error: stop here"),
    ("procedure f()\n    call g()\n\nprocedure main()\n    call f()\n",
     "prog.ja:2: procedure 'g' is not defined"),
])
def test_janus_messages_where_no_variable_exists(tmp_path, text, message):
    """A Janus error in a procedure with no variables speaks Janus, not of the machine's
    assertion (the explainer was asked only where a function had symbols)."""
    (tmp_path / "prog.ja").write_text(text)
    out = cli("run", "prog.ja", cwd=tmp_path)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert "ASSERT" not in out.stderr and "Traceback" not in out.stderr


STACK_AND_INT = """procedure p(stack s, int x)
    push(x, s)
    x += 3

procedure main()
    stack s
    int x = 5
    call p(s, x)
"""


@pytest.mark.parametrize("stack, message", [
    ([1.5], "its elements are integers (int64), bottom first; got 1.5"),   # (taken as 1)
    ([2 ** 70], "its elements are integers (int64)"),       # (an OverflowError traceback)
    (["a"], "its elements are integers (int64)"),           # (a bare ValueError)
    (np.array([1.5, 2.7]), "give its elements as a list of integers"),  # (read as a layout)
    (3, "give its elements as a list of integers")])
def test_a_stack_argument_that_is_not_a_list_of_integers_is_refused(tmp_path, stack, message):
    (tmp_path / "p.ja").write_text(STACK_AND_INT)
    p = rvm.load(str(tmp_path / "p.ja"))
    with pytest.raises(rvm.UsageError, match=re.escape(message)):
        p.call("p", stack, 2)
    assert p.call("p", [7, 1], 2) == ([7, 1, 2], 3)        # (push moves x: then 0 + 3)


def test_floats_for_an_integer_array_are_refused_not_taken_as_bits(tmp_path):
    """A float array for a Janus `int x[]` ran on the floats' 64-bit patterns, on every
    engine and the CLI (exit 0, the input back unchanged)."""
    path = ROOT / "examples" / "janus" / "perm_to_code.ja"
    for engine in ("interp", "python", "native"):
        p = rvm.load(str(path), engine=engine)
        assert p.call("perm_to_code", np.array([2, 0, 3, 1, 5, 4]))[0].tolist() == \
            [0, 0, 2, 1, 4, 4]
        with pytest.raises(rvm.MachineError, match="declared an integer array, got floats"):
            p.call("perm_to_code", [2.0, 0.0, 3.0, 1.0, 5.0, 4.0])
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(path), "--entry",
                        "perm_to_code", "--args", "[2.0,0.0,3.0,1.0,5.0,4.0]"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "declared an integer array" in r.stderr, r.stderr
    (tmp_path / "p.ja").write_text(STACK_AND_INT)
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(tmp_path / "p.ja"),
                        "--entry", "p", "--args", "[1e30]", "2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "int64" in r.stderr, r.stderr


def test_the_top_of_an_empty_stack_is_an_error(tmp_path):
    """top(s) of an empty stack read the size cell, 0, silently; jana's is nil, which used
    as a number is an error. Every engine refuses it, naming the stack; a stack with
    elements gives its top as before."""
    (tmp_path / "t.ja").write_text("procedure main()\n    int x\n    int y\n    stack s\n"
                                   "    y += 5\n    x += top(s) + 7\n")
    for engine in ("interp", "python", "native"):
        with pytest.raises(rvm.InvertibilityError,
                           match=r"t.ja:6: top\(s\): the stack s is empty"):
            rvm.load(str(tmp_path / "t.ja"), engine=engine).call("main", 0, 0, [])
    (tmp_path / "u.ja").write_text("procedure main()\n    int x\n    int y\n    stack s\n"
                                   "    y += 5\n    push(y, s)\n    x += top(s) + 7\n")
    assert rvm.load(str(tmp_path / "u.ja")).call("main", 0, 0, [])[0] == 12


def test_an_index_out_of_bounds_run_backwards_is_named_as_such(tmp_path):
    """Run backwards, a line's index checks come after its reads: the read of a cell
    outside the array went on to fail an overflow check, and that was the message
    (`integer overflow: t += a[i] would make t = 0`); the index's check that fails is
    the error, as forwards, and so is the top of an empty stack."""
    (tmp_path / "b.ja").write_text("procedure p(int a[], int i, int t)\n    t += a[i]\n\n"
                                   "procedure q(stack s, int t)\n    t ^= top(s) * 2\n\n"
                                   "procedure main()\n    int a[2]\n    int i\n    int t\n"
                                   "    call p(a, i, t)\n")
    for engine in ("interp", "native"):
        prog = rvm.load(str(tmp_path / "b.ja"), engine=engine)
        for how in ("call", "uncall"):
            with pytest.raises(rvm.InvertibilityError, match="a: array index -1 was out of "
                                                             "bounds"):
                getattr(prog, how)("p", np.array([1, 2]), -1, 0)
            with pytest.raises(rvm.InvertibilityError, match=r"top\(s\): the stack s is "
                                                             "empty"):
                getattr(prog, how)("q", [], 0)


def test_an_array_for_a_struct_parameter_is_refused(tmp_path):
    """A struct parameter takes its fields one argument each; an array given for it
    filled the fields' registers with its address and length, and the procedure ran on
    those (returning the array unchanged, no error)."""
    (tmp_path / "s.ja").write_text("struct pair { int x, int y }\n\nprocedure incp(pair p)\n"
                                   "    p.x += 1\n\nprocedure main()\n    int z\n    z += 1\n")
    p = rvm.load(str(tmp_path / "s.ja"))
    assert p.call("incp", 1, 2) == (2, 2)
    for bad in (np.array([1.5, 2.5]), np.array([1, 2])):
        with pytest.raises(rvm.MachineError, match=r"is an array, where the source declares "
                                                   r"p\.x, a number"):
            p.call("incp", bad)



def test_an_index_check_that_did_not_fail_is_not_blamed(tmp_path):
    """The index checks of a failing line are looked at only where the failure is an
    overflow or an assertion of its own: a fi assertion that fails after the index
    changed later on the line, or with a read in the branch that did not run, is that
    assertion's error (they were reported as an index out of bounds)."""
    (tmp_path / "f.ja").write_text(
        "procedure main()\n    int a[3]\n    int i\n    if a[i] = 0 then\n"
        "        i += 10\n    fi i = 99\n")
    (tmp_path / "u.ja").write_text(
        "procedure main()\n    int a[3]\n    int i\n    int c\n    int x\n    i += 10\n"
        "    if c = 1 then x += a[i] else c += 2 fi c = 2\n")
    for engine in ("interp", "native"):
        with pytest.raises(rvm.InvertibilityError, match=r"the fi assertion `i = 99` \(line 6\)"
                                                         " is false after the then-branch"):
            rvm.load(str(tmp_path / "f.ja"), engine=engine).call("main", np.zeros(3, int), 0)
        with pytest.raises(rvm.InvertibilityError, match=r"the fi assertion `c = 2`"):
            rvm.load(str(tmp_path / "u.ja"), engine=engine).call(
                "main", np.zeros(3, int), 0, 0, 0)
