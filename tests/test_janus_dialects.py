"""Janus: the fork's casts, `constant`, shifts and rows passed; PyJanus's chars, strings
and #define macros (own programs in the corpus's style)."""

import subprocess
import sys

import numpy as np
import pytest

import rvm
from rvm import Array
from rvm.core.errors import CompileError
from rvm.lang.janus import main_arguments, show_store


def janus(tmp_path, text: str, name: str = "prog.ja"):
    path = tmp_path / name
    path.write_text(text)
    return rvm.load(path), path


def store(prog) -> dict:
    text = show_store(prog, prog.call("main", *main_arguments(prog)))
    return dict(line.split(" = ", 1) for line in text.splitlines())


def cli(*args):
    return subprocess.run([sys.executable, "-m", "rvm.cli", *map(str, args)],
                          capture_output=True, text=True)


def refused(tmp_path, text: str) -> str:
    with pytest.raises(CompileError) as e:
        janus(tmp_path, text)
    return str(e.value)


def _i64(v: int) -> int:
    v %= 1 << 64
    return v - (1 << 64) if v >> 63 else v


SHIFTS = """
procedure shifts(int x, int n, int l, int r)
    l += x << n
    r += x >> n

procedure main()
    int x = {x}
    int n = {n}
    int l
    int r
    int c
    c += x << {n} + 1 - 1
    call shifts(x, n, l, r)
"""


@pytest.mark.parametrize("x,n", [(-1000, 5), (1, 62), (-7, 63), (5, 64), (-5, 70)])
def test_shifts_by_constants_and_variables_are_64_bit_shifts(tmp_path, x, n):
    prog, _ = janus(tmp_path, SHIFTS.format(x=x, n=n))
    got = store(prog)
    want_l = _i64(x << n) if n < 64 else 0
    want_r = x >> min(n, 63)
    assert (int(got["l"]), int(got["r"]), int(got["c"])) == (want_l, want_r, want_l)
    # and back: uncalling shifts restores l and r
    args = [x, n, want_l, want_r]
    assert [int(v) for v in prog.uncall("shifts", *args)] == [x, n, 0, 0]


def test_shift_binds_between_comparison_and_addition(tmp_path):
    prog, _ = janus(tmp_path, """
procedure main()
    int a
    int b
    a += 1 << 2 + 1
    if 1 << 3 = 8 then b += 1 fi b = 1
""")
    assert store(prog) == {"a": "8", "b": "1"}


def test_a_shift_of_a_sized_integer_wraps_as_the_forks(tmp_path):
    prog, _ = janus(tmp_path, """
procedure main()
    u32 w = 0xFFFF0000
    u32 v
    int r = 8
    v += w << (r + 1)
""")
    assert store(prog)["v"] == str((0xFFFF0000 << 9) % (1 << 32))


def test_a_negative_constant_shift_is_refused(tmp_path):
    assert "a shift by a negative amount (-1)" in refused(tmp_path, """
procedure main()
    int a
    a += 4 << -1
""")


def test_casts_wrap_to_the_type_and_bind_tighter_than_operators(tmp_path):
    prog, _ = janus(tmp_path, """
procedure main()
    int a = 300
    int b
    int c
    int d
    int e
    b += (u8) a + 1
    c += (i8) 200
    d += (int) a * 2
    e += (u16) (0 - 1)
""")
    assert store(prog) == {"a": "300", "b": "45", "c": "-56", "d": "600", "e": "65535"}


CONSTANTS = """
procedure scale(int v[], u8 k)
    v[0] += k
    v[1] += k * 2

procedure main()
    constant u8 k = -1
    int v[2][2]
    int w
    call scale(v[1], k)
    w += k
"""


def test_main_constants_wrap_print_and_are_read_by_calls(tmp_path):
    prog, path = janus(tmp_path, CONSTANTS)
    assert store(prog) == {"k": "255", "v[2][2]": "{{0, 0}, {255, 510}}", "w": "255"}
    out = cli("run", path)
    assert out.returncode == 0 and "k = 255" in out.stdout


@pytest.mark.parametrize("stmt,message", [
    ("k += 1", "k is a constant; it cannot be changed"),
    ("k <=> w", "k is a constant; it cannot be changed"),
    ("call bump(k)", "k is a constant, passed to bump, which changes its parameter x"),
])
def test_a_constant_is_never_changed(tmp_path, stmt, message):
    text = f"""
procedure bump(int x)
    x += 1

procedure main()
    constant int k = 3
    int w
    {stmt}
"""
    assert message in refused(tmp_path, text)


def test_a_constant_statement_holds_for_the_rest_of_its_block(tmp_path):
    prog, _ = janus(tmp_path, """
procedure f(int a, int b)
    if a > 0 then
        constant int twice = a * 2
        b += twice
        b += twice
    fi a > 0
    b += 1

procedure main()
    int a = 5
    int b
    call f(a, b)
""")
    assert store(prog) == {"a": "5", "b": "21"}
    assert [int(v) for v in prog.uncall("f", 5, 21)] == [5, 0]


def test_a_constant_statement_whose_value_changes_is_a_clear_error(tmp_path):
    _, path = janus(tmp_path, """
procedure f(int a)
    constant int c = a + 1
    a += c

procedure main()
    int a = 5
    call f(a)
""")
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "prog.ja:3" in out.stderr and "constant c = a + 1" in out.stderr


def test_a_row_of_a_2d_array_is_passed_by_reference(tmp_path):
    prog, _ = janus(tmp_path, """
procedure add(int x[], int y)
    x[0] += y
    x[1] += y * 10

procedure main()
    int m[3][2] = {{1, 2}, {3, 4}, {5, 6}}
    int i = 2
    call add(m[i], m[0][1])
    uncall add(m[1], m[2][0])
""")
    assert store(prog)["m[3][2]"] == "{{1, 2}, {-4, -66}, {7, 26}}"


def test_a_row_passed_beside_an_element_of_it_is_an_alias_error(tmp_path):
    _, path = janus(tmp_path, """
procedure add(int x[], int y)
    x[0] += y

procedure main()
    int m[2][2] = {{1, 2}, {3, 4}}
    int i = 1
    call add(m[i], m[1][0])
""")
    out = cli("run", path)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "aliases" in out.stderr and "m[i]" in out.stderr


def test_chars_are_bytes_and_strings_initialise_char_arrays(tmp_path):
    prog, _ = janus(tmp_path, """
procedure caesar(char s[], int k)
    iterate int i = 0 to size(s) - 2
        s[i] += k
    end

procedure main()
    char s[6] = "abc"
    char t[] = "hi"
    char c = 250
    call caesar(s, 2)
    c += 10
""")
    assert store(prog) == {"c": "4", "s[6]": "{99, 100, 101, 2, 2, 0}",
                           "t[3]": "{104, 105, 0}"}


CHARS = """
procedure shift(char s[], int k)
    printf("in %s", s)
    iterate int i = 0 to 2
        s[i] += k
    end
    printf("out %s (k = %d)", s, k)

procedure main()
    char s[6] = "ab"
    char full[2] = {200, 66}
    int k = 1
    s[4] += 120
    printf("%s|%s|%%s", s, full)
    call shift(s, k)
"""
# %s: the bytes up to the first 0 (s[4] is past it), each a character (200 is U+00C8, as
# PyJanus's chr), the whole array if it holds no 0
CHARS_OUT = ["ab|\u00c8B|%s", "in ab", "out bc\x01 (k = 1)"]


def test_printf_s_prints_a_char_array_as_text_on_every_engine(tmp_path):
    _, path = janus(tmp_path, CHARS)
    for engine in ("interp", "python", "native"):
        out = subprocess.run([sys.executable, "-m", "rvm.cli", "run", path, "--engine",
                              engine], capture_output=True, encoding="utf-8")
        assert out.returncode == 0 and "warn" not in out.stderr.lower(), (engine, out.stderr)
        assert out.stdout.splitlines()[:3] == CHARS_OUT, engine


def test_printf_s_on_an_ascii_stdout_escapes_bytes_past_127(tmp_path):
    """A character the output stream cannot encode is written as an escape: not an
    encoding error (natively: a run undone, its output lost, a warning)."""
    import os
    _, path = janus(tmp_path, CHARS)
    for engine in ("interp", "native"):
        out = subprocess.run([sys.executable, "-m", "rvm.cli", "run", path, "--engine",
                              engine], capture_output=True, encoding="ascii",
                             env={**os.environ, "PYTHONIOENCODING": "ascii"})
        assert (out.returncode, out.stderr) == (0, ""), engine
        assert out.stdout.splitlines() == ["ab|\\xc8B|%s", "in ab", "out bc\x01 (k = 1)",
                                           "full[2] = {200, 66}", "k = 1",
                                           "s[6] = {98, 99, 1, 0, 120, 0}"], engine


def test_printf_s_prints_forwards_backwards_and_after_an_rvmb_round_trip(tmp_path, capsys):
    from rvm.engines.machine import Machine
    prog, path = janus(tmp_path, CHARS)
    rvm.save(prog, tmp_path / "saved.rvmb")
    assert cli("compile", path, "-o", tmp_path / "cli.rvmb").returncode == 0
    s = np.array([97, 98, 0, 0, 120, 0])
    shifted = np.array([98, 99, 1, 0, 120, 0])
    saved = rvm.load(tmp_path / "saved.rvmb")
    assert saved.functions["shift"].outputs == prog.functions["shift"].outputs
    for p in (prog, rvm.load(tmp_path / "cli.rvmb")):
        assert p.functions["shift"].outputs == prog.functions["shift"].outputs
        for engine in ("interp", "python", "native"):
            m = Machine(p, engine=engine)
            m.enter("shift", s.copy(), 1)
            steps = m.run(1)                # 0: compiled, not the interpreter's fallback
            got = m.results()
            m.enter("shift", *got, backward=True)     # the uncall prints in reverse order
            steps += m.run(1)
            assert (steps == 0) == (engine != "interp"), engine
            assert m._compiled is None or m._compiled.native == (engine == "native")
            assert list(got[0]) == list(shifted) and list(m.results()[0]) == list(s)
            assert capsys.readouterr().out.splitlines() == [
                "in ab", "out bc\x01 (k = 1)", "out bc\x01 (k = 1)", "in ab"], engine


@pytest.mark.parametrize("text,message", [
    ('procedure main()\n    int s[3] = "ab"\n', "a string initialises a one-dimensional char"),
    ('procedure main()\n    int s[4]\n    printf("%s", s)\n',
     "printf: %s prints a one-dimensional char array as text, but s is an int array"),
    ('procedure main()\n    char s[2][2]\n    printf("s: %s", s)\n',
     "printf: %s prints a one-dimensional char array as text, but s is a char 2-D array"),
    ('procedure main()\n    char c\n    printf("%s", c)\n', "printf: %s wants an array, but c"),
    ("struct p {\n    int x[2]\n}\nstruct q {\n    p inner[3]\n}\nprocedure main()\n"
     "    q all[4]\n", "all.inner.x would have 3 dimensions: arrays have one or two"),
    ("struct p {\n    int x\n}\nstruct q {\n    p inner\n}\nprocedure main()\n"
     "    q a\n    show(a)\n", "show(a): a struct with a struct field is shown by its"),
    ("#define loop1 loop2\n#define loop2 loop1\nprocedure main()\n    int loop1\n",
     "#define loop1 expands without end"),
])
def test_pyjanus_constructs_out_of_reach_are_refused_clearly(tmp_path, text, message):
    assert message in refused(tmp_path, text)


def test_define_macros_stand_for_types_and_tokens(tmp_path):
    prog, _ = janus(tmp_path, """
#define N 3
#define word u8
#define cells word a[N]
procedure main()
    cells
    word w = 300
    a[1] += w
""")
    assert store(prog) == {"a[3]": "{0, 44, 0}", "w": "44"}


def test_a_shift_by_a_variable_outside_an_update_is_refused(tmp_path):
    assert "a shift by a variable amount (n) is supported in the expression of an update" \
        in refused(tmp_path, """
procedure main()
    int a
    int n = 2
    if (1 << n) = 4 then a += 1 fi a = 1
""")


def test_a_procedure_named_like_a_builtin_statement_is_refused_clearly(tmp_path):
    # (was "rot takes 3 argument(s)" at the call: the Python subset's rotation)
    assert "a procedure may not be named rot" in refused(tmp_path, """
procedure rot(int a[], int k)
    a[0] += k

procedure main()
    int a[2]
    call rot(a, 2)
""")


NESTED = """
#define coords int[]
struct point {
    int x,
    u8 tag
}
struct shape {
    int n,
    point pts[3],
    point centre
}

procedure add_point(shape s, int x, coords extra)
    s.pts[s.n].x += x
    s.pts[s.n].tag ^= 255 + extra[0]
    s.centre.x += x
    s.n += 1

procedure move(shape ss[], int i, int dx)
    iterate int j = 0 to ss[i].n - 1
        ss[i].pts[j].x += dx
    end

procedure main()
    shape one
    shape many[2]
    int e[1] = {2}
    int x = 7
    call add_point(one, x, e)
    call add_point(one, x, e)
    uncall add_point(one, x, e)
    many[1].n += 2
    call move(many, 1, 5)
"""


def test_nested_structs_and_array_types_from_defines(tmp_path):
    prog, _ = janus(tmp_path, NESTED)
    got = store(prog)
    assert got["one"] == ("{n = 1, pts = {{x = 7, tag = 1}, {x = 0, tag = 0}, {x = 0, tag = 0}}"
                          ", centre = {x = 7, tag = 0}}")
    assert got["many[2]"] == (
        "{{n = 0, pts = {{x = 0, tag = 0}, {x = 0, tag = 0}, {x = 0, tag = 0}}, centre = "
        "{x = 0, tag = 0}}, {n = 2, pts = {{x = 5, tag = 0}, {x = 5, tag = 0}, {x = 0, "
        "tag = 0}}, centre = {x = 0, tag = 0}}}")


@pytest.mark.parametrize("text", ["procedure main()\n    int b[",
                                  "procedure main()\n    u8 x\n    x += (u8",
                                  "procedure p(int[] a", "procedure main()\n    constant "])
def test_a_program_cut_short_is_a_compile_error(tmp_path, text):
    # (`int b[` at the end of the file was an IndexError in the parser's lookahead)
    assert "prog.ja:" in refused(tmp_path, text)


def test_python_frontend_prints_an_int_array_as_text_with_chars(capsys):
    @rvm.reversible
    def f(a: Array[int]):
        a[0] += 1
        print("a:", chars(a))  # noqa: F821 (a form of print, not a function)

    a = np.array([71, 111, 0, 33])
    for engine in ("interp", "python"):
        assert list(f(a, engine=engine)[0]) == [72, 111, 0, 33]
        assert capsys.readouterr().out == "a: Ho\n", engine

    with pytest.raises(CompileError, match=r"chars\(...\) shows an int array's cells"):
        @rvm.reversible
        def g(v: Array[float]):
            v[0] += 1.0
            print(chars(v))  # noqa: F821
        g(np.zeros(2))
