"""The `rvm` command end to end, through subprocess: outputs, exit codes, messages."""

import json
import pathlib
import subprocess
import sys

import pytest

ASM = pathlib.Path(__file__).resolve().parent.parent / "asm"


def rvm(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "rvm.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_run_json():
    r = rvm("run", ASM / "fib.rasm", "--entry", "fib", "--args", "5", "0", "0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"r0": 5, "r1": 5, "r2": 8}


def test_run_plain_and_backward():
    r = rvm("run", ASM / "fib.rasm", "--args", "10", "55", "89", "--backward")
    assert r.returncode == 0 and r.stdout.split("\n")[:3] == ["r0 = 10", "r1 = 0", "r2 = 0"]


def test_run_floats():
    r = rvm("run", ASM / "iexp.rasm", "--entry", "iexp", "--args", "0", "1.6", "--json")
    assert json.loads(r.stdout)["f0"] == 4.953032424395115


def test_trace_shows_instructions_and_changes_both_ways():
    r = rvm("run", ASM / "fib.rasm", "--args", "2", "0", "0", "--trace")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert "ADD      r2, 1" in lines[0] and "r2: 0 -> 1" in lines[0]
    assert any("SWAP" in ln and "r1: 1 -> 1" not in ln for ln in lines)
    assert lines[-3:] == ["r0 = 2", "r1 = 1", "r2 = 2"]
    b = rvm("run", ASM / "fib.rasm", "--args", "2", "1", "2", "--trace", "--backward")
    assert b.returncode == 0
    first = b.stdout.splitlines()[0]
    assert "SUB      r3, r0" in first and "r3: 0 -> 2" in first
    assert b.stdout.splitlines()[-3:] == ["r0 = 2", "r1 = 0", "r2 = 0"]
    calls = rvm("run", ASM / "isqrt.rasm", "--entry", "isqrt", "--args", "5", "0", "--trace")
    assert "enter count (forwards)" in calls.stdout and "enter count (backwards)" in calls.stdout
    assert "leave count" in calls.stdout


def test_asm_then_run_and_dis_bytecode(tmp_path):
    out = tmp_path / "isqrt.rvmb"
    r = rvm("asm", ASM / "isqrt.rasm", "-o", out)
    assert r.returncode == 0 and out.exists()
    r = rvm("run", out, "--entry", "isqrt", "--args", "50", "0", "--json")
    assert json.loads(r.stdout) == {"r0": 50, "r1": 7}
    d = rvm("dis", out)
    assert d.returncode == 0 and ".func isqrt(r0, r1)" in d.stdout and "UNCALL" in d.stdout
    src = tmp_path / "again.rasm"
    src.write_text(d.stdout)
    assert rvm("run", src, "--entry", "isqrt", "--args", "50", "0", "--json").stdout == r.stdout


def test_asm_default_output_name(tmp_path):
    src = tmp_path / "p.rasm"
    src.write_text((ASM / "fib.rasm").read_text())
    assert rvm("asm", src).returncode == 0 and (tmp_path / "p.rvmb").exists()


def test_assembly_error_exit_1_with_location_no_traceback(tmp_path):
    src = tmp_path / "bad.rasm"
    src.write_text(".func f(r0)\n    ADD.mul r0, r0, r0\n.end\n")
    r = rvm("run", src, "--args", "1")
    assert r.returncode == 1
    assert f"{src}:2:5: error:" in r.stderr and "^" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_runtime_error_exit_1():
    r = rvm("run", ASM / "fib.rasm", "--args", "0", "0", "0", "--max-steps", "1000")
    assert r.returncode == 1 and "step budget" in r.stderr and "Traceback" not in r.stderr


def test_invertibility_error_names_function_instruction_line(tmp_path):
    src = tmp_path / "leak.rasm"
    src.write_text(".func f(r0)\n  ADD r1, r0\n.end\n")
    r = rvm("run", src, "--args", "3")
    assert r.returncode == 1
    assert "InvertibilityError" in r.stderr and "in f" in r.stderr and "r1 = 3" in r.stderr


def test_bad_arguments_and_entry():
    assert rvm("run", ASM / "fib.rasm", "--args", "x", "0", "0").returncode == 1
    r = rvm("run", ASM / "reverse.rasm", "--entry", "nope", "--args")
    assert r.returncode == 1 and "no function 'nope'" in r.stderr
    r = rvm("run", ASM / "fib.rasm", "--args", "1")        # a wrong count is bad usage
    assert r.returncode == 2 and "takes 3 parameter registers" in r.stderr


def test_missing_and_corrupt_files(tmp_path):
    r = rvm("run", tmp_path / "none.rasm")
    assert r.returncode == 1 and "cannot read" in r.stderr
    bad = tmp_path / "bad.rvmb"
    bad.write_bytes(b"RVMB\x01\x00garbage")
    r = rvm("dis", bad)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_usage_errors_exit_2():
    assert rvm().returncode == 2
    assert rvm("frobnicate").returncode == 2
    assert rvm("run").returncode == 2


def test_console_script_installed():
    import shutil
    exe = shutil.which("rvm")
    if exe is None:
        import pytest
        pytest.skip("console script not on PATH")
    r = subprocess.run([exe, "run", str(ASM / "fib.rasm"), "--args", "3", "0", "0", "--json"],
                       capture_output=True, text=True)
    assert json.loads(r.stdout) == {"r0": 3, "r1": 2, "r2": 3}


def test_grad_json_and_plain():
    r = rvm("grad", ASM / "besselj.rasm", "--entry", "besselj", "--loss", "f0",
            "--args", "0", "2", "1.0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["r0"] is None and abs(out["f1"] - 0.2102436) < 1e-7 and out["f0"] == 1.0
    r = rvm("grad", ASM / "poly.rasm", "--entry", "f", "--loss", "0", "--args", "0", "1", "3")
    assert r.stdout.splitlines() == ["d0/df0 = 1.0", "d0/df1 = 660.0", "d0/df2 = 528.0"]


def test_entry_rule_main_or_the_only_function_else_exit_2():
    r = rvm("grad", ASM / "poly.rasm", "--loss", "0", "--args", "0", "1", "3")
    assert r.returncode == 2 and "choose one with --entry (f, inner)" in r.stderr
    assert "Traceback" not in r.stderr
    r = rvm("run", ASM / "fib.rasm", "--args", "10", "0", "0", "--json")     # the only one
    assert json.loads(r.stdout) == {"r0": 10, "r1": 55, "r2": 89}


def test_jvp_and_hessian_commands():
    r = rvm("jvp", ASM / "poly.rasm", "--entry", "f", "--args", "0.0", "1.0", "3.0",
            "--tangents", "0", "1", "0", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["values"]["f0"] == 484.0 and out["tangents"]["f0"] == 660.0
    r = rvm("hessian", ASM / "poly.rasm", "--entry", "f", "--loss", "f0", "--args", "0.0",
            "1.0", "3.0", "--wrt", "f1", "f2", "--json")
    assert r.returncode == 0, r.stderr
    # ((x+1)(2x+y^2))^2 at (1, 3): d2/dx2 = 2(4x+2+y^2)^2 + 8(x+1)(2x+y^2) ...
    h = json.loads(r.stdout)
    x, y = 1.0, 3.0
    u, ux, uy = (x + 1) * (2 * x + y * y), 4 * x + 2 + y * y, 2 * y * (x + 1)
    uxx, uxy, uyy = 4.0, 2 * y, 2 * (x + 1)
    expect = [[2 * (ux * ux + u * uxx), 2 * (ux * uy + u * uxy)],
              [2 * (ux * uy + u * uxy), 2 * (uy * uy + u * uyy)]]
    assert h == expect


def test_negative_numbers_in_any_notation_and_no_abbreviations():
    r = rvm("run", ASM / "iexp.rasm", "--entry", "iexp", "--args", "0.0", "-2.5e0", "--json")
    assert r.returncode == 0, r.stderr
    assert abs(json.loads(r.stdout)["f0"] - 0.0820849986238988) < 1e-12
    r = rvm("run", ASM / "fib.rasm", "--arg", "10", "0", "0")
    assert r.returncode == 2 and "unrecognized arguments: --arg" in r.stderr


def test_grad_with_arrays_and_errors():
    r = rvm("grad", ASM / "arrays.rasm", "--entry", "dot", "--loss", "f0",
            "--args", "[1.0,2.0]", "[3.0,4.0]", "0", "--json")
    assert json.loads(r.stdout) == {"r0:r1": [3.0, 4.0], "r2:r3": [1.0, 2.0], "f0": 1.0}
    r = rvm("grad", ASM / "besselj.rasm", "--entry", "besselj", "--loss", "r0", "--args", "0", "2",
            "1.0")
    assert r.returncode == 1 and "integer parameter" in r.stderr
    r = rvm("grad", ASM / "besselj.rasm", "--entry", "besselj", "--loss", "f7", "--args", "0", "2",
            "1.0")
    assert r.returncode == 1 and "unknown loss 'f7'" in r.stderr
    assert rvm("grad", ASM / "besselj.rasm", "--args", "0", "2", "1").returncode == 2


EXAMPLES = ASM.parent / "examples"


def test_compile_python_file_to_bytecode_and_assembly(tmp_path):
    out = tmp_path / "fib.rvmb"
    r = rvm("compile", EXAMPLES / "fib.py", "-o", out)
    assert r.returncode == 0, r.stderr
    r = rvm("run", out, "--entry", "rrfib", "--args", "0", "10", "--json")
    assert json.loads(r.stdout) == {"r0": 89, "r1": 10}
    r = rvm("compile", EXAMPLES / "complex_log.py", "--emit", "asm")
    assert r.returncode == 0
    assert "|         y_re += log(n)" in r.stdout and "ADD.log  f0, f4" in r.stdout


def test_run_and_grad_python_files_use_source_names():
    r = rvm("run", EXAMPLES / "besselj.py", "--entry", "besselj_inplace", "--args", "0", "2",
            "1.0", "--json")
    assert json.loads(r.stdout)["out"] == 0.11490348493190047
    r = rvm("grad", EXAMPLES / "besselj.py", "--entry", "besselj", "--loss", "out",
            "--args", "0", "2", "1.0", "--json")
    assert abs(json.loads(r.stdout)["z"] - 0.2102436) < 1e-7


def test_compile_error_exit_1(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import rvm\n\n@rvm.reversible\ndef f(x: float):\n    x = 1.0\n")
    r = rvm("compile", bad)
    assert r.returncode == 1 and f"{bad}:5:5: error: plain assignment" in r.stderr
    assert "Traceback" not in r.stderr


def test_unannotated_functions_take_their_types_from_the_arguments(tmp_path):
    path = tmp_path / "un.py"
    path.write_text("import rvm\n\n@rvm.reversible\ndef main(out, x):\n    out += x * x\n")
    r = rvm("run", path, "--args", "0.0", "3.0", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"out": 9.0, "x": 3.0}
    r = rvm("grad", path, "--loss", "out", "--args", "0.0", "3.0", "--json")
    assert json.loads(r.stdout)["x"] == 6.0


@pytest.mark.parametrize("command", ["asm", "compile", "dis", "run", "grad", "jvp",
                                     "hessian", "debug", "cache"])
def test_every_command_help_has_an_example(command):
    r = rvm(command, "--help")
    assert r.returncode == 0 and f"example:\n  rvm {command}" in r.stdout


def test_quoted_and_future_annotations_read_the_same(tmp_path):
    for head in ("", "from __future__ import annotations\n"):
        path = tmp_path / "q.py"
        path.write_text(head + "import rvm\nfrom rvm import Array\n\n@rvm.reversible\n"
                        "def main(out: 'float', x: \"Array[float]\"):\n"
                        "    for i in range(len(x)):\n        out += x[i]\n")
        r = rvm("run", path, "--args", "0.0", "[1.0,2.5]", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["out"] == 3.5


def test_derivative_programs_on_the_command_line(tmp_path):
    r = rvm("dis", ASM / "poly.rasm", "--adjoint", "f", "--plain")
    assert r.returncode == 0 and ".func f.adjoint(f0, f1, f2, f4, f5, f6)" in r.stdout
    r = rvm("compile", EXAMPLES / "iexp.py", "--tangent", "iexp", "--emit", "asm")
    assert r.returncode == 0 and ".func iexp.tan(" in r.stdout
    out = tmp_path / "af.rvmb"
    assert rvm("compile", EXAMPLES / "hvp.py", "--adjoint", "f", "-o", out).returncode == 0
    r = rvm("run", out, "--entry", "f.adjoint", "--args", "0.0", "3.0", "4.0", "1.0", "0.0",
            "0.0", "--json")
    assert json.loads(r.stdout) == {"f0": 0.0, "f1": 3.0, "f2": 4.0, "f4": 1.0, "f5": 24.0,
                                    "f6": 41.0}
    # a file that calls an adjoint inside compiles without being run; reverse over reverse
    r = rvm("grad", EXAMPLES / "hvp.py", "--entry", "v_dot_grad", "--loss", "s", "--args",
            "0.0", "0.0", "3.0", "4.0", "1.0", "0.0", "0.0", "7.0", "8.0", "--json")
    assert r.returncode == 0, r.stderr
    g = json.loads(r.stdout)
    assert (g["x"], g["y"]) == (52.0, 85.0)


def test_long_stepped_runs_show_progress_on_a_terminal_only():
    args = [str(ASM / "fib.rasm"), "--engine", "interp", "--args", "1000000000", "0", "0",
            "--max-steps", "25000000"]
    # not a terminal: no progress line (run beside the terminal's run below: 3 s each)
    piped = subprocess.Popen([sys.executable, "-m", "rvm.cli", "run", *args],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        terminal = _terminal_run_shows_progress(args)
        _, err = piped.communicate(timeout=120)
    finally:
        piped.kill()
        piped.wait()
    assert piped.returncode == 1 and "step budget of 25000000" in err and "running" not in err
    if not terminal:
        pytest.skip("tmux is not installed")


def _terminal_run_shows_progress(args) -> bool:
    """A run in a tmux pane shows its progress line (False: no tmux here)."""
    import shutil
    import time
    if shutil.which("tmux") is None:
        return False
    session = f"rvmprog{time.time_ns() % 10**8}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "12",
                    f"{sys.executable} -m rvm.cli run {' '.join(args)}; sleep 30"], check=True)
    try:
        seen = ""
        for _ in range(300):
            seen += subprocess.run(["tmux", "capture-pane", "-t", session, "-p"],
                                   capture_output=True, text=True).stdout
            if "step budget of 25000000" in seen:
                break
            time.sleep(0.05)
        assert "running forwards:" in seen and "steps (" in seen and "/s)" in seen
        assert "step budget of 25000000" in seen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    return True


def test_an_array_of_the_wrong_dimension_is_named_in_the_sources_terms(tmp_path):
    """A 2-D array for a 1-D parameter (and a 1-D one for a 2-D parameter) is refused
    with the argument's name and both shapes, not with the registers it would fill."""
    (tmp_path / "f.py").write_text(
        "from rvm import Array, reversible\n\n@reversible\n"
        "def f(x: Array[float], out: float):\n    for i in range(len(x)):\n"
        "        out += x[i] * x[i]\n\n@reversible\n"
        "def g(y: Array[float, 2], out: float):\n    out += y[0, 0]\n")
    r = rvm("run", tmp_path / "f.py", "--entry", "f", "--args", "[[1,2],[3,4]]", "0.0")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "argument x of f is declared a 1-D array, got a 2-D array of shape (2, 2)" \
        in r.stderr, r.stderr
    r = rvm("run", tmp_path / "f.py", "--entry", "g", "--args", "[1,2]", "0.0")
    assert r.returncode == 1 and "argument y of g is declared a 2-D array, got a 1-D " \
        "array of shape (2,)" in r.stderr, r.stderr
    import numpy as np

    import rvm as api
    for how in (lambda f: f, lambda f: api.grad(f, loss="out")):
        with pytest.raises(api.MachineError, match="x of f is declared a 1-D array"):
            how(api.load(tmp_path / "f.py")["f"])(np.ones((2, 2)), 0.0)
