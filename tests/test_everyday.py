"""Everyday use: the user's names in messages and on the command line, argument counts,
numpy-style argument conversion, `rvm compile` of unannotated functions."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rvm
from rvm.cli import main

ROOT = Path(__file__).resolve().parent.parent
ASM = ROOT / "asm"

PROGRAM = '''
import rvm
from rvm import Array

@rvm.reversible
def f(out: float, x: float, y: float):
    out += x * x * y

@rvm.reversible
def g(out: float, a: Array[float], i: int):
    out += a[i]

@rvm.reversible
def g1(out: float, a: Array[float], i: int):
    out += a[i + 1]

@rvm.reversible
def m2(out: float, a: Array[float, 2], i: int, j: int):
    out += a[i, j]

@rvm.reversible
def u(out, x):
    out += x * x

@rvm.reversible
def one(x: float):
    x += 1.0
'''


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    path = tmp_path_factory.mktemp("everyday") / "prog.py"
    path.write_text(PROGRAM)
    namespace: dict = {}
    exec(compile(PROGRAM, str(path), "exec"), namespace)
    return path, namespace


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# 4. --loss and --wrt in one namespace: source names, registers, .alias names


def test_hessian_wrt_takes_source_names_and_prints_a_labelled_table(prog, capsys):
    path, _ = prog
    code, out, err = cli(capsys, "hessian", path, "--entry", "f", "--loss", "out",
                         "--wrt", "x", "y", "--args", "0", "2", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "the Hessian of out:"
    assert lines[1].split() == ["x", "y"]
    assert lines[2].split() == ["x", "6", "4"] and lines[3].split() == ["y", "4", "0"]
    # registers and indices name the same arguments; --json is the bare matrix
    code, out, err = cli(capsys, "hessian", path, "--entry", "f", "--loss", "f0",
                         "--wrt", "f1", "2", "--args", "0", "2", "3", "--json")
    assert code == 0, err
    assert json.loads(out) == [[6.0, 4.0], [4.0, 0.0]]


def test_hessian_wrt_unknown_name_lists_the_arguments(prog, capsys):
    path, _ = prog
    code, _, err = cli(capsys, "hessian", path, "--entry", "f", "--loss", "out",
                       "--wrt", "z", "--args", "0", "2", "3")
    assert code == 2 and "--wrt z: no such argument (the arguments are out, x, y" in err


def test_every_transform_takes_source_names_of_a_loaded_programs_function(prog):
    """rvm.load(path)["f"] knows its arguments' source names: rvm.hessian's wrt took
    only register names there ("unknown argument 'x': the arguments are f0, f1, f2"),
    where grad, jacobian and the CLI took x."""
    path, _ = prog
    f = rvm.load(path)["f"]
    args = (0.0, 2.0, 3.0)
    H = rvm.hessian(f, loss="out", wrt=["x", "y"])(*args)
    assert H.tolist() == [[6.0, 4.0], [4.0, 0.0]]
    assert rvm.hessian(f, loss="out", wrt="y")(*args).tolist() == [[0.0]]
    assert rvm.grad(f, loss="out", wrt=["x"])(*args)[0] == 12.0
    assert rvm.jacobian(f, outputs=["out"], wrt=["x"])(*args).tolist() == [[12.0]]
    with pytest.raises(rvm.UsageError, match="'z': the arguments are out, x, y"):
        rvm.hessian(f, loss="out", wrt=["z"])(*args)


def test_every_function_rvm_makes_takes_arguments_by_parameter_name(prog):
    """A loaded program's function, its inverse, hessian, jacobian and vmap (of it, and of
    its gradient) took positional arguments only ("unknown option 'x'", or a TypeError
    from inside rvm), where a reversible function, grad and value_and_grad took names."""
    import numpy as np
    path, ns = prog
    f = rvm.load(path)["f"]
    assert f(y=3.0, x=2.0, out=0.0) == f(0.0, 2.0, 3.0) == (12.0, 2.0, 3.0)
    assert f(0.0, y=3.0, x=2.0, engine="python") == (12.0, 2.0, 3.0)
    assert (~f)(out=12.0, x=2.0, y=3.0) == (0.0, 2.0, 3.0)
    assert rvm.hessian(f, loss="out", wrt=["x"])(y=3.0, x=2.0, out=0.0).tolist() == [[6.0]]
    assert rvm.jacobian(f, outputs=["out"], wrt=["y"])(0.0, y=3.0, x=2.0).tolist() == [[4.0]]
    xs = np.array([1.0, 2.0])
    outs = rvm.vmap(f)(out=np.zeros(2), y=np.ones(2), x=xs)[0]
    assert outs.tolist() == [1.0, 4.0]
    g = rvm.vmap(rvm.grad(f, loss="out", wrt="x"))(out=np.zeros(2), y=np.ones(2), x=xs)
    assert g.tolist() == [2.0, 4.0]
    with pytest.raises(TypeError, match="'x' given by position and by name"):
        f(0.0, 2.0, 3.0, x=1.0)
    with pytest.raises(TypeError, match="unknown argument 'z': the arguments of f are out"):
        f(out=0.0, x=2.0, z=3.0)
    with pytest.raises(TypeError, match="unknown argument 'z': the arguments of f are out"):
        ns["f"](0.0, 2.0, 3.0, z=1.0)      # (the reversible function itself)
    # derivatives take their own names too: the function's, then x_dot / x_bar
    t, a = rvm.tangent(f), rvm.adjoint(f)
    assert t(out=0.0, x=2.0, y=3.0, out_dot=0.0, x_dot=1.0, y_dot=0.0) == \
        t(0.0, 2.0, 3.0, 0.0, 1.0, 0.0) == (12.0, 2.0, 3.0, 12.0, 1.0, 0.0)
    assert (~t)(out=12.0, x=2.0, y=3.0, out_dot=12.0, x_dot=1.0, y_dot=0.0) == \
        (0.0, 2.0, 3.0, 0.0, 1.0, 0.0)
    assert a(0.0, 2.0, 3.0, out_bar=1.0, x_bar=0.0, y_bar=0.0) == \
        (0.0, 2.0, 3.0, 1.0, 12.0, 4.0)
    assert rvm.grad(t, loss="out_dot")(out=0.0, x=2.0, y=3.0, out_dot=0.0, x_dot=1.0,
                                       y_dot=0.0)[1:3] == (6.0, 4.0)
    dots = rvm.vmap(t)(out=np.zeros(2), x=xs, y=np.ones(2), out_dot=np.zeros(2),
                       x_dot=np.ones(2), y_dot=np.zeros(2))[3]
    assert dots.tolist() == [2.0, 4.0]


def test_grad_and_hessian_take_alias_names(tmp_path, capsys):
    src = tmp_path / "sq.rasm"
    src.write_text(textwrap.dedent("""\
        .func sq(f0, f1)
        .alias out f0
        .alias x f1
                ADD.mul out, x, x
        .end
        """))
    code, out, err = cli(capsys, "hessian", src, "--loss", "out", "--wrt", "x",
                         "--args", "0.0", "3.0", "--json")
    assert code == 0, err
    assert json.loads(out) == [[2.0]]
    code, out, err = cli(capsys, "grad", src, "--loss", "out", "--args", "0.0", "3.0",
                         "--json")
    assert code == 0, err
    assert json.loads(out)["f1"] == 6.0


def test_grad_wrt_prints_only_those_gradients_in_the_names_given(prog, tmp_path, capsys):
    path, _ = prog
    code, out, err = cli(capsys, "grad", path, "--entry", "f", "--loss", "out",
                         "--wrt", "x", "y", "--args", "0", "2", "3")
    assert code == 0, err
    assert out.splitlines() == ["dout/dx = 12.0", "dout/dy = 4.0"]
    src = tmp_path / "sq.rasm"
    src.write_text(SQ)
    code, out, err = cli(capsys, "grad", src, "--loss", "out", "--wrt", "x", "--args",
                         "0.0", "3.0", "--json")
    assert code == 0, err
    assert json.loads(out) == {"x": 6.0}
    code, _, err = cli(capsys, "grad", path, "--entry", "f", "--loss", "out", "--wrt", "z",
                       "--args", "0", "2", "3")
    assert code == 2 and "--wrt z: no such argument (the arguments are out, x, y" in err
    from rvm.cli import parser
    text = parser()._subparsers._group_actions[0].choices["grad"].format_help()
    assert "parameter register (f0)" not in text and "source name" in text


def test_jvp_wrt_seeds_tangents_and_loss_picks_the_output(prog, capsys):
    path, _ = prog
    code, out, err = cli(capsys, "jvp", path, "--entry", "f", "--wrt", "x", "--loss", "out",
                         "--args", "0", "2", "3", "--json")
    assert code == 0, err
    assert json.loads(out) == {"values": {"out": 12.0}, "tangents": {"out": 12.0}}
    code, out, err = cli(capsys, "jvp", path, "--entry", "f", "--wrt", "x", "y",
                         "--args", "0", "2", "3")
    assert code == 0, err
    assert "tangent out = 16.0" in out and "tangent x = 1.0" in out
    code, _, err = cli(capsys, "jvp", path, "--entry", "g", "--wrt", "i",
                       "--args", "0", "[1.0,2.0]", "1")
    assert code == 2 and "--wrt i: i is not a float argument (the float arguments are " \
        "out, a)" in err


# 5. run-time messages in the user's names


@pytest.mark.parametrize("engine", ["interp", "python", "native"])
def test_index_out_of_bounds_names_the_array(prog, engine):
    _, ns = prog
    with pytest.raises(rvm.InvertibilityError, match=r"a\[i\]: i = 2 is outside a "
                       r"\(length 2\)"):
        ns["g"](0.0, np.array([1.0, 2.0]), 2, engine=engine)
    with pytest.raises(rvm.InvertibilityError, match=r"a\[i \+ 1\]: the index i \+ 1 = 2 "
                       r"is outside a \(length 2\)"):
        ns["g1"](0.0, np.array([1.0, 2.0]), 1, engine=engine)
    with pytest.raises(rvm.InvertibilityError, match=r"a\[i, j\]: j = 3 is outside the "
                       r"columns of a \(3 columns; a is 2 x 3\)"):
        ns["m2"](0.0, np.ones((2, 3)), 1, 3, engine=engine)
    with pytest.raises(rvm.InvertibilityError, match=r"a\[i\]: i = -1 is outside a"):
        ns["g"](0.0, np.array([1.0, 2.0]), -1, engine=engine)


def test_cli_bounds_message_and_verbose_says_it_once(prog, capsys, tmp_path):
    path, _ = prog
    code, _, err = cli(capsys, "run", path, "--entry", "g", "--args", "0", "[1.0,2.0]",
                       "2", "--verbose")
    assert code == 1 and "a[i]: i = 2 is outside a (length 2)" in err
    assert err.count("assertion r2 < r1 failed") == 1      # the detail, once
    # without a source-level account, --verbose does not repeat the message
    src = tmp_path / "z.rasm"
    src.write_text(".func z(r0, r1)\n        ASSERT.LT r0, r1\n.end\n")
    code, _, err = cli(capsys, "run", src, "--args", "3", "2", "--verbose")
    assert code == 1 and err.count("assertion r0 < r1 failed") == 1
    assert "register-level detail" not in err


def test_wrong_kind_of_argument_names_parameter_and_type(prog):
    _, ns = prog
    with pytest.raises(rvm.MachineError, match=r"argument out of f is declared float, got "
                       r"str 'a'"):
        ns["f"]("a", 1.0, 2.0)
    with pytest.raises(rvm.MachineError, match=r"argument out must be a number, got str "
                       r"'a'"):
        ns["u"]("a", 1.0)
    with pytest.raises(rvm.MachineError, match=r"argument out of f is declared float, got "
                       r"NoneType None"):
        ns["f"](None, 1.0, 2.0)


LOOP = '''
import rvm

@rvm.reversible
def f(n: int, x: float, acc: float):
    for i in range(n):
        acc += x * x
'''


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    path = tmp_path_factory.mktemp("everyday") / "loop.py"
    path.write_text(LOOP)
    return path, rvm.load(str(path))["f"], rvm.reversible.source(LOOP.split("\n", 3)[3])


def test_derived_programs_name_their_arguments_after_the_source(loop):
    _, handle, f = loop
    for g in (handle, f):
        # (the function's declaration where the call sees it, else the program's kind)
        said = "argument x (of f is declared float|must be a number), got str"
        with pytest.raises(rvm.MachineError, match=said):
            rvm.tangent(g)(3, "a", 1.0, 0.0, 0.0)
        with pytest.raises(rvm.MachineError, match=said):
            rvm.adjoint(g)(3, "a", 1.0, 0.0, 0.0)
        with pytest.raises(rvm.MachineError, match="argument acc_bar must be a number"):
            rvm.adjoint(g)(3, 2.0, 1.0, 0.0, "b")
        with pytest.raises(rvm.MachineError, match="argument x_bar_dot must be a number"):
            rvm.tangent(rvm.adjoint(g))(3, 2.0, 1.0, 0.0, 1.0, 0.0, 0.0, "c", 0.0)
        assert rvm.adjoint(g)(3, 2.0, 1.0, 0.0, 1.0) == (3, 2.0, 1.0, 12.0, 1.0)


def test_derived_argument_counts_name_the_arguments(loop):
    _, handle, f = loop
    for g in (handle, f):
        for args in [(3,), (3, 2.0, 1.0), (3, 2.0, 1.0, 0.0, 1.0, 7)]:
            with pytest.raises(rvm.MachineError, match=r"adjoint\(f\) takes 5 arguments "
                               rf"\(n, x, acc, x_bar, acc_bar\), got {len(args)}$"):
                rvm.adjoint(g)(*args)
        with pytest.raises(rvm.MachineError, match=r"tangent\(f\) takes 5 arguments "
                           r"\(n, x, acc, x_dot, acc_dot\), got 4"):
            rvm.tangent(g)(3, 2.0, 1.0, 0.0)
        with pytest.raises(rvm.MachineError, match=r"takes 9 arguments \(n, x, acc, x_bar, "
                           r"acc_bar, x_dot, acc_dot, x_bar_dot, acc_bar_dot\), got 5"):
            rvm.tangent(rvm.adjoint(g))(3, 2.0, 1.0, 0.0, 1.0)
    # unannotated: counted once typed by its arguments
    u = rvm.reversible.source("def u(out, x):\n    out += x * x\n")
    with pytest.raises(rvm.MachineError, match=r"takes the 2 arguments of u \(out, x\), then "
                       "one shadow per float argument; got 1"):
        rvm.adjoint(u)(0.0)
    with pytest.raises(rvm.MachineError, match=r"takes 4 arguments \(out, x, out_bar, "
                       r"x_bar\), got 3"):
        rvm.adjoint(u)(0.0, 1.0, 1.0)
    # a loaded program's function called with too few: its arguments by name
    with pytest.raises(rvm.MachineError, match=r"f takes 3 arguments \(n, x, acc\), got 1"):
        handle(3)


def test_cli_names_derived_arguments_and_bad_values(loop, capsys):
    path, _, _ = loop
    code, out, err = cli(capsys, "run", path, "--entry", "f.adj", "--args", "3", "2.0",
                         "1.0", "0.0", "1.0")
    assert code == 0, err
    assert out.split()[-3:] == ["acc_bar", "=", "1.0"] and "x_bar = 12.0" in out
    code, _, err = cli(capsys, "run", path, "--entry", "f", "--transform", "adjoint",
                       "--args", "3", "2.0", "1.0")
    assert code == 2 and "f.adjoint takes 5 arguments (n, x, acc, x_bar, acc_bar); " \
        "--args gives 3" in err
    code, _, err = cli(capsys, "run", path, "--args", "3", "a", "1.0")
    assert code == 1 and "argument x: 'a' is not a number" in err
    code, _, err = cli(capsys, "run", path, "--entry", "f.tan", "--args", "3", "2.0", "1.0",
                       "0.0", "b")
    assert code == 1 and "argument acc_dot: 'b' is not a number" in err
    code, _, err = cli(capsys, "run", ASM / "fib.rasm", "--args", "3", "x", "1")
    assert code == 1 and "argument r1: 'x' is not a number" in err


# 7. rvm compile of unannotated functions


def test_compile_unannotated_is_an_error_naming_them(tmp_path, capsys):
    src = tmp_path / "h.py"
    src.write_text("import rvm\n\n@rvm.reversible\ndef h(out, x: float):\n"
                   "    out += x * x\n")
    out = tmp_path / "h.rvmb"
    code, _, err = cli(capsys, "compile", src, "-o", out)
    assert code == 1 and not out.exists()
    assert "parameters without annotations (h: out)" in err and "Annotate" in err


# 8. argument counts


def test_wrong_argument_count_is_bad_usage(prog, capsys):
    path, _ = prog
    code, _, err = cli(capsys, "run", path, "--entry", "f", "--args", "1")
    assert code == 2 and "f takes 3 arguments (out, x, y); --args gives 1" in err
    code, _, err = cli(capsys, "run", path, "--entry", "u", "--args", "1", "2", "3")
    assert code == 2 and "u takes 2 arguments (out, x); --args gives 3" in err
    code, _, err = cli(capsys, "grad", ASM / "fib.rasm", "--loss", "0", "--args", "1")
    assert code == 2 and "the 1 value of --args fills 1" in err


def test_argument_count_messages_say_1_argument(prog):
    _, ns = prog
    with pytest.raises(rvm.MachineError, match="the 1 argument given fills 1"):
        rvm.load(str(ASM / "fib.rasm"))["fib"](1)
    with pytest.raises(rvm.MachineError, match=r"one takes 1 argument \(x\), got 2"):
        ns["one"](1.0, 2.0)


# 12. numpy-style conversion


def test_lists_and_int_arrays_convert_for_array_float(prog):
    _, ns = prog
    g = ns["g"]
    for a in ([1, 2], np.array([1, 2]), [1.0, 2.0]):
        out = g(0.0, a, 1)
        assert out[0] == 2.0 and out[1].dtype == np.float64
        assert np.array_equal(out[1], [1.0, 2.0])
    grads = rvm.grad(g)(0.0, [1, 2], 1)
    assert np.array_equal(grads[1], [0.0, 1.0])
    with pytest.raises(rvm.MachineError, match=r"declared Array\[float, 1\], got "
                       r"Array\[int, 2\]"):
        g(0.0, [[1, 2]], 0)


def test_derivatives_convert_lists_and_int_arrays_as_calls_do(tmp_path):
    (tmp_path / "sq.py").write_text(textwrap.dedent("""
        from rvm import Array, reversible


        @reversible
        def sq(out: float, a: Array[float]):
            for i in range(len(a)):
                out += a[i] * a[i]
    """))
    f = rvm.load(tmp_path / "sq.py")["sq"]
    for a in ([1, 2], np.array([1, 2]), [1.0, 2.0]):
        values, dots = rvm.jvp(f, (0.0, a), (0.0, [1.0, 0.0]))
        assert values[0] == 5.0 and dots[0] == 2.0
        np.testing.assert_array_equal(rvm.hessian(f)(0.0, a), np.diag([0.0, 2.0, 2.0]))
        np.testing.assert_array_equal(rvm.hvp(f, (0.0, a), (1.0, [1.0, 0.0]))[1], [2.0, 0.0])


# 6. the trace and the control-flow view in source and .alias names

SQ = ".func sq(f0, f1)\n.alias out f0\n.alias x f1\n        ADD.mul out, x, x\n.end\n"


def test_trace_uses_source_and_alias_names(prog, tmp_path, capsys):
    path, _ = prog
    code, out, err = cli(capsys, "run", path, "--entry", "m2", "--args", "0",
                         "[[1.0,2.0]]", "0", "1", "--trace")
    assert code == 0, err
    assert "ASSERT.LT i, a.shape[0]" in out and "ADDM     out, [a + r5]" in out
    assert "out: 0.0 -> 2.0" in out
    src = tmp_path / "sq.rasm"
    src.write_text(SQ)
    code, out, err = cli(capsys, "run", src, "--args", "0.0", "3.0", "--trace")
    assert code == 0, err
    assert "ADD.mul  out, x, x" in out and "out: 0.0 -> 9.0" in out


def test_control_flow_view_uses_alias_names():
    from rvm.drawing import draw
    svg = draw(rvm.load(str(ASM / "isqrt.rasm")), "count", "cfg")._repr_svg_()
    assert "BR.GT    sq, n, skip" in svg and "if sq &gt; n" in svg
    assert "comefrom: iff k != 0" in svg and "r2" not in svg


# 11. reversible functions where Python keeps no source


def test_python_c_says_how_and_reversible_source_works():
    import subprocess
    import sys
    decorated = ("import rvm\n@rvm.reversible\ndef f(out: float, x: float):\n"
                 "    out += x\nf(0.0, 1.0)\n")
    r = subprocess.run([sys.executable, "-c", decorated], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "cannot read the source of f" in r.stderr
    assert 'f = rvm.reversible.source("""def f(...): ...""")' in r.stderr
    given = ("import rvm, math\nK = 3.0\n"
             "sq = rvm.reversible.source('''\ndef sq(out: float, x: float):\n"
             "    out += K * math.cos(x) * x\n''')\nprint(sq(0.0, 0.0), (~sq)(3.0, 0.0))\n")
    r = subprocess.run([sys.executable, "-c", given], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["(0.0,", "0.0)", "(3.0,", "0.0)"]


def test_reversible_source_functions_call_each_other_and_locate_errors():
    inner, outer = rvm.reversible.source('''
        @rvm.reversible
        def inner(out: float, a: Array[float], i: int):
            out += a[i] * 2.0

        def outer(out: float, a: Array[float], i: int):
            inner(out, a, i)
        ''', {"rvm": rvm, "Array": rvm.Array})
    assert outer(0.0, [1.0, 4.0], 1)[0] == 8.0
    assert np.array_equal(rvm.grad(outer)(0.0, [1.0, 4.0], 1)[1], [0.0, 2.0])
    with pytest.raises(rvm.InvertibilityError,
                       match=r"<rvm.reversible.source \d+>:4: a\[i\]: i = 5 is outside a"):
        inner(0.0, [1.0], 5)
    with pytest.raises(rvm.CompileError, match="defines no function"):
        rvm.reversible.source("x = 1")


# 12, 13. what the docs say about lists, tol and rvm.adjoint, and that it holds


def test_docs_say_one_thing_about_lists_and_explain_tol():
    text = (ROOT / "docs" / "gradients.md").read_text()
    assert "Python lists are refused" not in text and "lists are refused" not in text
    assert "np.asarray(x, float)" in text
    assert "**The tolerance, `tol`.**" in text and "loosens only these zero checks" in text
    assert "Pass the arguments' **initial** values" in text


def test_tol_loosens_zero_checks_only_and_adjoint_takes_initial_values():
    # an ancilla that comes back to -1e-7, not 0: refused at the default tol (1e-8)
    f = rvm.reversible.source('''
        def f(out: float, x: float):
            with ancilla(t=0.0):
                t += x * 1e-7
                out += t
                t -= x * 1e-7 * 2.0
        ''', {"ancilla": rvm.ancilla})
    with pytest.raises(rvm.InvertibilityError, match="ancilla `t`"):
        f(0.0, 1.0)
    assert f(0.0, 1.0, tol=1e-6)[0] == pytest.approx(1e-7)
    # rvm.adjoint of out += x*x*y at the initial values (0, 2, 3): J^T ybar, inputs back
    h = rvm.reversible.source('''
        def h(out: float, x: float, y: float):
            out += x * x * y
        ''', {})
    back = rvm.adjoint(h)(0.0, 2.0, 3.0, 1.0, 0.0, 0.0)
    assert back[:3] == (0.0, 2.0, 3.0) and back[3:] == (1.0, 12.0, 4.0)
