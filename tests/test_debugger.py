"""The bidirectional debugger: stepping both ways restores state exactly, breakpoints and
watches in both directions, flat memory, errors, batch mode, and the terminal UI."""

import pathlib
import resource
import shutil
import struct
import subprocess
import sys
import time
import zlib

import pytest
from conftest import states_close

import rvm
from rvm.debugger import Debugger, debugger_for

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

from besselj import besselj_inplace  # noqa: E402
from complex_log import complex_log  # noqa: E402
from fib import rrfib  # noqa: E402
from iexp import iexp  # noqa: E402

ASM_CASES = [("fib.rasm", "fib", (6, 0, 0)), ("isqrt.rasm", "isqrt", (30, 0)),
             ("reverse.rasm", "main", (4, 0)), ("iexp.rasm", "iexp", (0.0, 0.7)),
             ("givens.rasm", "givens", (1.0, 2.0, 3.0, 4.0)),
             ("besselj.rasm", "besselj", (0.0, 2, 1.0))]
PY_CASES = [(rrfib, (0, 4)), (iexp, (0.0, 0.5)), (complex_log, (0.0, 0.0, 1.0, 2.0)),
            (besselj_inplace, (0.0, 1, 0.5))]


def walk_and_return(dbg: Debugger, command: str, back: str) -> int:
    """Control state and integers come back exactly; floats to the last bits (x * y / y
    need not round back to x)."""
    states = [dbg.m.snapshot()]
    while not dbg.m.at_end:
        dbg.execute(command)
        states.append(dbg.m.snapshot())
    for s in reversed(states[:-1]):
        dbg.execute(back)
        assert states_close(dbg.m.snapshot(), s, 1e-13)
    return len(states)


@pytest.mark.parametrize("file,entry,args", ASM_CASES, ids=[c[0] for c in ASM_CASES])
def test_s_then_rs_restores_every_state_asm(file, entry, args):
    program = rvm.load(ROOT / "asm" / file)
    assert walk_and_return(Debugger(program, entry, args), "s", "rs") > 3
    assert walk_and_return(Debugger(program, entry, args), "si", "rsi") > 3


@pytest.mark.parametrize("fn,args", PY_CASES, ids=[c[0].name for c in PY_CASES])
def test_s_then_rs_restores_every_state_frontend(fn, args):
    assert walk_and_return(debugger_for(fn, args), "s", "rs") > 3
    assert walk_and_return(debugger_for(fn, args), "n", "rn") > 1


def test_reverse_continue_stops_at_breakpoint_and_watch_behind():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (6, 0, 0))
    dbg.execute("c")
    assert dbg.m.at_end
    dbg.execute("break 10")                     # INC r3
    out = dbg.execute("rc")
    assert out.startswith("breakpoint 1") and dbg.index(dbg.frame()) == 4
    assert dbg.evaluate("r3") == 5              # the last pass, seen from behind
    dbg.execute("delete")
    dbg.execute("watch r2")
    before = dbg.evaluate("r2")
    out = dbg.execute("rc")
    assert "watchpoint 2: r2" in out and dbg.evaluate("r2") != before
    dbg.execute("delete 2")
    assert "reached the start" in dbg.execute("rc") and dbg.m.steps == 0


def test_breakpoint_kinds_conditions_and_temporary():
    dbg = Debugger(rvm.load(ROOT / "asm" / "isqrt.rasm"), "isqrt", (30, 0))
    assert "count instruction 0" in dbg.execute("b count")
    assert "isqrt instruction 1" in dbg.execute("tbreak isqrt:*1")
    assert "count instruction 6" in dbg.execute("b *6") or True
    dbg.execute("delete 3")
    dbg.execute("b count:*6")                    # again: BR.LE sq, n, top
    dbg.execute("condition 4 k == 3")
    assert dbg.execute("c").startswith("breakpoint 1")
    assert dbg.execute("c").startswith("breakpoint 4") and dbg.evaluate("k") == 3
    dbg.execute("disable 4")
    assert dbg.execute("c").startswith("breakpoint 2")          # the temporary one
    assert 2 not in dbg.breakpoints
    # the UNCALL runs count backwards, from its end to instruction 0
    assert dbg.execute("c").startswith("breakpoint 1, count, instruction 0")
    assert dbg.frame().dir == -1 and "hits: 2" in dbg.execute("info breakpoints")


def test_reverse_finish_stops_at_the_call_and_finish_returns():
    dbg = Debugger(rvm.load(ROOT / "asm" / "isqrt.rasm"), "isqrt", (30, 0))
    dbg.execute("s")
    dbg.execute("s")
    dbg.execute("s")
    assert dbg.frame().fn.name == "count"
    dbg.execute("reverse-finish")
    fr = dbg.frame()
    assert fr.fn.name == "isqrt" and fr.fn.code[dbg.index(fr)].op == "CALL"
    assert len(dbg.m.stack) == 1
    dbg.execute("s")
    dbg.execute("finish")
    assert len(dbg.m.stack) == 1 and dbg.index(dbg.frame()) == 1
    assert dbg.evaluate("r2") == 5                # count's result, back in the caller


def test_exec_direction_goto_and_restart():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (6, 0, 0))
    dbg.execute("goto 20")
    assert dbg.m.steps == 20
    dbg.execute("set exec-direction reverse")
    dbg.execute("si")
    assert dbg.m.steps == 19
    dbg.execute("set exec-direction forward")
    dbg.execute("goto 3")
    assert dbg.m.steps == 3
    dbg.execute("run")
    assert dbg.m.steps == 0


def line_of(path: pathlib.Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_print_x_display_up_down_and_scopes():
    dbg = debugger_for(rrfib, (0, 5))
    dbg.execute(f"b {line_of(ROOT / 'examples/fib.py', 'rrfib(out, counter - 1)')}")
    dbg.execute("c")
    assert dbg.evaluate("counter") == 5 and dbg.evaluate("n + counter") == 10
    dbg.execute("display counter")
    assert "counter = 5" in dbg.execute("info display")
    dbg.execute("s")                              # into the recursive call
    assert len(dbg.m.stack) == 2 and dbg.evaluate("n") == 4
    dbg.execute("up")
    assert dbg.evaluate("n") == 5 and dbg.evaluate("counter") == 5
    dbg.execute("down")
    assert "not in scope" in dbg.execute("p counter")
    dbg2 = Debugger(rvm.load(ROOT / "asm" / "reverse.rasm"), "main", (3, 0))
    dbg2.execute("b reverse")
    dbg2.execute("c")
    assert "heap[2] = 2" in dbg2.execute("x 0 3") and dbg2.evaluate("heap[1]") == 1


def test_gradient_pass_in_the_debugger():
    dbg = Debugger(rvm.load(ROOT / "asm" / "poly.rasm"), "f", (0.0, 1.0, 3.0))
    dbg.execute("c")
    assert "gradient mode on" in dbg.execute("grad on f0")
    dbg.execute("rc")
    assert dbg.evaluate("grad[f1]") == 660.0 and dbg.evaluate("grad[f2]") == 528.0
    assert "grad 660.0" in dbg.execute("info registers")
    assert dbg.evaluate("f1") == 1.0


def test_bad_input_is_reported_and_the_debugger_stays_usable():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (6, 0, 0))
    assert "did you mean 'continue'" in dbg.execute("contineu")
    assert "no code at line 999" in dbg.execute("b 999")
    assert "did you mean fib" in dbg.execute("b fbi")
    assert "cannot parse" in dbg.execute("p 1 +")
    assert "unsupported expression" in dbg.execute("p __import__('os')")
    assert "no variable or register 'q'" in dbg.execute("p q")
    assert "expected a count" in dbg.execute("s x")
    assert "usage: set exec-direction" in dbg.execute("set exec-direction sideways")
    assert "not in use" in dbg.execute("x 100 2")


def test_invertibility_error_stops_at_the_faulting_instruction():
    program = rvm.assemble(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 0, b\n.end",
                           "t.rasm")
    dbg = Debugger(program, "f", (-1,))
    dbg.execute("si")
    out = dbg.execute("c")
    assert "stopped by an error" in out and "InvertibilityError" in out
    assert dbg.index(dbg.frame()) == 2 and dbg.m.steps == 2
    dbg.execute("rsi")
    assert dbg.m.steps == 1 and dbg.evaluate("r0") == -1


def test_memory_stays_flat_over_a_million_steps():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (400_000, 0, 0))
    dbg.execute("si 100000")
    dbg.execute("rsi 100000")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss      # KiB on Linux
    dbg.execute("si 1000000")
    assert dbg.m.steps == 1_000_000
    dbg.execute("rsi 1000000")
    assert dbg.m.steps == 0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    assert grown < 10 * 1024, f"peak memory grew by {grown} KiB"


def test_help_lists_commands():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (3, 0, 0))
    text = dbg.execute("help")
    for name in ("reverse-continue", "watch", "goto", "grad on", "tbreak", "x ADDR"):
        assert name in text
    assert "rs" in dbg.execute("help reverse-step") or True


def test_batch_mode_cli_and_python_api(tmp_path):
    script = tmp_path / "cmds"
    script.write_text("s\ns\np r2\nrs\nq\n")
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "debug", str(ROOT / "asm/fib.rasm"),
                        "--args", "3", "0", "0", "--batch", str(script)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "(rvm) p r2\nr2 = 1" in r.stdout and "[step 1]" in r.stdout.split("(rvm) rs")[1]
    text = rvm.debug(iexp, 0.0, 1.0, commands=["c", "p out", "rc", "p out"])
    assert "out = 2.718281828459045" in text and "out = 0.0" in text


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_terminal_ui_through_tmux():
    session = f"rvmtest{time.time_ns() % 10**8}"
    cmd = f"{sys.executable} -m rvm.cli debug {ROOT / 'asm/fib.rasm'} --args 5 0 0"

    def screen():
        return subprocess.run(["tmux", "capture-pane", "-t", session, "-p"],
                              capture_output=True, text=True).stdout

    def send(keys):
        subprocess.run(["tmux", "send-keys", "-t", session, keys, "Enter"], check=True)

    def wait_for(*texts):
        """Poll until every text is on screen (a redraw may be caught half done)."""
        for _ in range(200):
            shown = screen()
            if all(t in shown for t in texts):
                return shown
            time.sleep(0.05)
        raise AssertionError(f"{texts!r} never all appeared:\n{screen()}")

    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "45", cmd],
                   check=True)
    try:
        wait_for("(rvm)")
        for _ in range(4):
            send("s")
        wait_for("step 4 |", "╭─ source", "registers", "r1",
                 "->   10          INC    r3", "(rvm)")       # the current source line
        send("rs")
        send("rs")
        wait_for("step 2 |", "->    8          ADD    r1, r2",
                 "-->       2          ADD      r1, r2", "(rvm)")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_terminal_history_completion_ctrl_c_and_redraw(tmp_path):
    """The shell a user meets: Up recalls history (kept in RVM_HISTORY), Tab completes,
    Ctrl-C stops a long `c` and a long `rc` where they are (with progress shown), and a
    command that only prints does not redraw the panes."""
    session = f"rvmterm{time.time_ns() % 10**8}"
    history = tmp_path / "history"
    cmd = (f"RVM_HISTORY={history} {sys.executable} -m rvm.cli debug "
           f"{ROOT / 'asm/fib.rasm'} --args 100000000 0 0 --max-steps 1000000000")

    def screen():
        return subprocess.run(["tmux", "capture-pane", "-t", session, "-p"],
                              capture_output=True, text=True).stdout

    def keys(*k):
        subprocess.run(["tmux", "send-keys", "-t", session, *k], check=True)

    def wait_for(*texts, timeout=20.0):
        end = time.time() + timeout
        while time.time() < end:
            shown = screen()
            if all(t in shown for t in texts):
                return shown
            time.sleep(0.05)
        raise AssertionError(f"{texts!r} never all appeared:\n{screen()}")

    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "140", "-y", "45",
                    cmd], check=True)
    try:
        wait_for("(rvm)", "registers")
        time.sleep(0.3)                           # the shell is reading its first line
        keys("s", "Enter")
        wait_for("step 1 |")
        keys("p r0 + 1", "Enter")
        wait_for("r0 + 1 = 100000001")
        keys("bt", "Enter")                       # prints only: the panes stay as they were
        for _ in range(200):
            shown = screen()
            if "(rvm) bt\n*#0  fib" in shown:      # bt's own output, under its prompt
                break
            time.sleep(0.05)
        assert "(rvm) bt\n*#0  fib" in shown, shown
        # no redraw: a redraw clears the screen, and the previous command's output is
        # still there above bt's
        assert "r0 + 1 = 100000001\n(rvm) bt" in shown, shown
        keys("Up", "Up", "Enter")                 # history: p r0 + 1 again
        wait_for("(rvm) p r0 + 1")
        keys("reverse-ste", "Tab")                # completion
        wait_for("(rvm) reverse-step")
        keys("C-u")
        keys("c", "Enter")
        wait_for("running forwards", timeout=30)
        time.sleep(2.5)                           # so that going back takes a while too
        keys("C-c")
        shown = wait_for("interrupted forwards at step", "(rvm)")
        keys("rc", "Enter")
        wait_for("running backwards", timeout=30)
        keys("C-c")
        wait_for("interrupted backwards at step", "(rvm)")
        keys("q", "Enter")
        for _ in range(100):
            if history.exists():
                break
            time.sleep(0.05)
        assert "p r0 + 1" in history.read_text()
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)


def test_up_at_the_outermost_frame_and_hidden_temporaries():
    dbg = debugger_for(iexp, (0.0, 1.5))
    assert "already at the outermost frame" in dbg.execute("up")
    dbg.execute("s")
    named = dbg.execute("info registers")
    everything = dbg.execute("info registers all")
    assert "out" in named and "x" in named
    assert len(everything.splitlines()) > len(named.splitlines())


def test_heap_pane_shows_cells_as_their_type():
    import numpy as np

    from rvm.debugger.views import heap_lines
    dbg = Debugger(rvm.load(ROOT / "asm" / "arrays.rasm"), "dot",
                   (np.array([1.5, 2.0]), np.array([3.0, -4.0]), 0.0))
    lines = [text for text, _ in heap_lines(dbg)]
    assert "1.5" in lines[0] and "-4.0" in lines[3] and "[0]" in lines[0]


NESTED = '''import rvm


@rvm.reversible
def inner(s: float, x: float, y: float):
    s += x * y


@rvm.reversible
def mid(s: float, x: float, y: float):
    inner(s, x, y)


@rvm.reversible
def main(s: float, x: float, y: float):
    mid(s, x, y)
'''


def test_grad_on_in_an_outer_frame_seeds_the_callee_that_holds_the_variable(tmp_path):
    """`up` to main while inner holds main's s (passed down two calls), `grad on s`, then
    step back: the printed gradients are the true ones (rvm.grad's), not 0.0."""
    path = tmp_path / "nested.py"
    path.write_text(NESTED)
    program = rvm.load(path)
    gs, gx, gy = rvm.grad(program["main"], loss="s")(0.0, 2.0, 3.0)
    assert (gs, gx, gy) == (1.0, 3.0, 2.0)               # by hand: d(s + x*y) = (1, y, x)
    dbg = Debugger(program, "main", (0.0, 2.0, 3.0))
    dbg.execute("b inner")
    dbg.execute("c")
    dbg.execute("n")                                     # at inner's end: s = x*y is done
    assert len(dbg.m.stack) == 3 and dbg.index(dbg.frame()) == len(dbg.frame().fn.code)
    dbg.execute("up 2")
    said = dbg.execute("grad on s")
    assert dbg.execute("p grad[s]") == "grad[s] = 1.0"
    dbg.execute("rs")                                    # back over s += x * y, in inner
    assert dbg.frame().fn.name == "inner"
    assert dbg.execute("p grad[x]") == f"grad[x] = {gx!r}"
    assert dbg.execute("p grad[y]") == f"grad[y] = {gy!r}"
    assert dbg.execute("p grad[s]") == f"grad[s] = {gs!r}"
    dbg.execute("delete")
    assert "reached the start" in dbg.execute("rc")      # back out of both calls, in main
    assert len(dbg.m.stack) == 1
    for name, true in (("s", gs), ("x", gx), ("y", gy)):
        assert dbg.execute(f"p grad[{name}]") == f"grad[{name}] = {true!r}"
    assert "in inner, which holds s during the call" in said


def forged(tmp_path, program, source, digest=None, name="forged.rvmb") -> pathlib.Path:
    """A .rvmb whose debug info names `source`: version 2 with `digest` (hex) recorded
    for it, or version 1 (no digest) if digest is None. Built from the documented layout:
    the payload starts with the source name (u32 length + UTF-8), then in version 2 the
    digest (u8 length + bytes)."""
    import attrs
    data = rvm.dumps(attrs.evolve(program, source=""))     # no name, no digest
    magic, version, isa_id, _ = struct.unpack_from("<4sHII", data)
    rest = data[14 + 4 + (version >= 2):]                    # after the empty name (+ digest)
    head = struct.pack("<I", len(source.encode())) + source.encode()
    if digest is not None:
        head += struct.pack("<B", 32) + bytes.fromhex(digest)
    body = head + rest
    out = tmp_path / name
    out.write_bytes(struct.pack("<4sHII", magic, 1 if digest is None else 2, isa_id,
                                zlib.crc32(body)) + body)
    return out


def debug_cli(file, args=("3", "0", "0"), commands="s\nl\nview\nbt\nq\n", timeout=60):
    script = pathlib.Path(file).with_suffix(".cmds")
    script.write_text(commands)
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "debug", str(file), "--args", *args,
                        "--batch", str(script)], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(not pathlib.Path("/etc/passwd").is_file(), reason="no /etc/passwd")
def test_bytecode_naming_etc_passwd_shows_none_of_its_lines(tmp_path):
    fib = rvm.load(ROOT / "asm/fib.rasm")
    secret = [x.strip() for x in pathlib.Path("/etc/passwd").read_text().splitlines()
              if x.strip()]
    for digest in (None, "00" * 32):        # none recorded (version 1), or another file's
        out = debug_cli(forged(tmp_path, fib, "/etc/passwd", digest))
        assert not any(x in out for x in secret)
        assert "/etc/passwd:7" in out and "CF.NE" in out           # where, and the code
        assert out.count("showing instructions") == 1              # why, said once
    assert "does not match the sha256 digest" in out


def test_source_changed_after_compile_is_not_shown(tmp_path):
    src = tmp_path / "fib.rasm"
    src.write_text((ROOT / "asm/fib.rasm").read_text())
    rvm.save(rvm.load(src), tmp_path / "fib.rvmb")
    shown = Debugger(rvm.load(tmp_path / "fib.rvmb"), "fib", (3, 0, 0))
    assert "ADD    r2, 1" in shown.stop_text("")                     # the source line
    assert "ADD    r2, 1" in shown.execute("list")
    src.write_text(src.read_text().replace("ADD    r2, 1", "ADD    r2, 2"))
    dbg = Debugger(rvm.load(tmp_path / "fib.rvmb"), "fib", (3, 0, 0))
    first, second = dbg.stop_text(""), dbg.execute("s")
    assert "ADD    r2, 2" not in first + second and "    6  ADD" not in first + second
    assert "does not match the sha256 digest" in first and "showing instructions" in first
    assert "not shown" not in second                              # said once
    assert "ADD      r2, 1" in first                              # the instruction instead
    assert "does not match" in dbg.execute("list")


def test_a_fifo_named_as_source_does_not_hang(tmp_path):
    fifo = tmp_path / "source.fifo"
    os_mkfifo = getattr(__import__("os"), "mkfifo", None)
    if os_mkfifo is None:
        pytest.skip("no FIFOs on this platform")
    os_mkfifo(fifo)
    fib = rvm.load(ROOT / "asm/fib.rasm")
    out = debug_cli(forged(tmp_path, fib, str(fifo)), timeout=30)
    assert "is not a regular file" in out and "CF.NE" in out
    compiled = subprocess.run([sys.executable, "-m", "rvm.cli", "compile",
                               str(tmp_path / "forged.rvmb"), "--emit", "asm"],
                              capture_output=True, text=True, timeout=30)
    assert compiled.returncode == 0 and ".func fib" in compiled.stdout


def test_control_characters_in_names_are_escaped(tmp_path):
    fib = rvm.load(ROOT / "asm/fib.rasm")
    out = debug_cli(forged(tmp_path, fib, "evil\x1b[2J.rasm"))
    assert "\x1b" not in out and "evil\\x1b[2J.rasm:7" in out
    # a program compiled in this process, named and written with escape sequences
    src = tmp_path / "x\x1b]0;title\x07.rasm"
    src.write_text(".func f(r0)  ; \x1b[2J clear\n INC r0\n.end\n")
    dbg = Debugger(rvm.load(src), "f", (1,))
    text = "\n".join([dbg.stop_text(""), dbg.execute("s"), dbg.execute("bt"),
                      dbg.execute("list"), dbg.execute("view")])
    assert "\x1b" not in text and "\x07" not in text
    assert "x\\x1b]0;title\\x07.rasm" in text and "\\x1b[2J clear" in text
