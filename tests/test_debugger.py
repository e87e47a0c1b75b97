"""The bidirectional debugger: stepping both ways restores state exactly, breakpoints and
watches in both directions, flat memory, errors, batch mode, and the terminal UI."""

import json
import pathlib
import re
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
        for _ in range(200):    # (written as the shell ends: the file may exist first)
            if history.exists() and "p r0 + 1" in history.read_text():
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

    from rvm.formats import bytecode
    saved, bytecode.VERSION = bytecode.VERSION, 2          # the layout of versions 1, 2
    try:
        data = rvm.dumps(attrs.evolve(program, source=""))     # no name, no digest
    finally:
        bytecode.VERSION = saved
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


# ---------------------------------------------------------------------- gdb's habits
LOOP_FIRST = """\
.func main(r0, r1)
        CALL    loop, r0, r1
        CALL    loop, r0, r1
.end

.func loop(r0, r1)           ; r1 += r0 (r0 >= 1), counting: the first instruction is a loop head
.alias n r0
.alias k r1
top:    CF.NE   k, 0, again
        INC     k
again:  BR.LT   k, n, top
        SUB     k, n
.end
"""


@pytest.fixture
def loop_first(tmp_path):
    path = tmp_path / "loop.rasm"
    path.write_text(LOOP_FIRST)
    return Debugger(rvm.load(path), "main", (3, 0))


def test_break_function_stops_once_per_call_at_entry_both_ways(loop_first):
    dbg = loop_first
    assert "loop instruction 0 (its entry, once a call)" in dbg.execute("b loop")
    stops = []
    while dbg.execute("c").startswith("breakpoint 1"):
        stops.append(dbg.m.steps)
    assert stops == [1, 13] and dbg.m.at_end          # two calls, two stops (not 6)
    back = []
    while dbg.execute("rc").startswith("breakpoint 1"):
        back.append(dbg.m.steps)
    assert back == [13, 1] and dbg.m.at_start
    assert "hits: 4" in dbg.execute("info breakpoints")


def test_finish_reverse_finish_and_goto_do_not_stop_where_they_started(loop_first):
    dbg = loop_first
    dbg.execute("b loop:*0")                  # the loop head: every pass stops here
    assert dbg.execute("c").startswith("breakpoint 1") and dbg.m.steps == 1
    assert dbg.execute("c").startswith("breakpoint 1") and dbg.m.steps == 4
    out = dbg.execute("finish")               # not the next pass at the loop head
    assert not out.startswith("breakpoint") and dbg.frame().fn.name == "main"
    assert dbg.m.steps == 12
    dbg.execute("rc")                         # back to the last pass at the loop head
    assert dbg.frame().fn.name == "loop" and dbg.m.steps == 7
    out = dbg.execute("reverse-finish")       # back to the call, past the earlier passes
    assert not out.startswith("breakpoint") and dbg.frame().fn.name == "main"
    assert dbg.m.steps == 0
    assert dbg.execute("goto 4").startswith("breakpoint 1") and dbg.m.steps == 1
    dbg.execute("goto 4")                     # from the breakpoint: on to step 4
    assert dbg.m.steps == 4
    out = dbg.execute("goto 11")              # passes the loop head at step 7: no stop
    assert not out.startswith("breakpoint") and dbg.m.steps == 11
    out = dbg.execute("goto 15")              # from elsewhere, other places still stop
    assert out.startswith("breakpoint 1") and dbg.m.steps == 13


def test_until_advance_and_frame():
    dbg = debugger_for(besselj_inplace, (0.0, 1, 0.5))
    lines = (ROOT / "examples" / "besselj.py").read_text().splitlines()
    start = next(n for n, t in enumerate(lines, 1) if "def besselj_inplace" in t)
    last = next(n for n, t in enumerate(lines, 1) if n > start and t.strip() == "sum_ += term"
                and t.startswith(" " * 16))                 # the loop body's last line
    after = next(n for n, t in enumerate(lines, 1) if n > start and "out += sum_" in t)
    dbg.execute(f"tbreak {last}")
    assert dbg.execute("c").startswith("breakpoint 1") and dbg.evaluate("k") == 1
    assert not dbg.breakpoints                                 # tbreak: used once
    dbg.execute("until")                      # next would go back into the loop
    assert dbg.line(dbg.frame()) == after and dbg.evaluate("k") > 2
    dbg.execute("set exec-direction reverse")
    dbg.execute("until")                      # backwards: to the loop's test (its last
    loop_test = dbg.line(dbg.frame())         # line going back), then out of the loop
    assert loop_test < last and dbg.evaluate("k") > 2
    dbg.execute("until")
    assert dbg.line(dbg.frame()) < loop_test and dbg.evaluate("k") == 0
    dbg.execute("set exec-direction forward")
    dbg.execute("run")
    out = dbg.execute(f"advance {after}")
    assert dbg.line(dbg.frame()) == after and "advance" not in out
    dbg.execute("run")
    dbg.execute("advance first_term")         # into a call
    assert dbg.frame().fn.name == "first_term" and len(dbg.m.stack) == 2
    assert dbg.execute("frame 1").startswith("#1  besselj_inplace")
    assert dbg.selected == 1 and "nu = 1" in dbg.execute("info args")
    assert "no frame #2" in dbg.execute("frame 2")
    assert dbg.execute("frame").startswith("#1")
    dbg.execute("frame 0")
    assert dbg.selected == 0
    dbg.execute("run")
    dbg.execute("until first_term")           # until LOCATION: not in a deeper call
    assert dbg.m.at_end


def test_info_locals_and_args_name_the_source_variables():
    dbg = debugger_for(besselj_inplace, (0.0, 1, 0.5))
    args = dbg.execute("info args")
    assert args.splitlines() == ["out = 0.0", "nu = 1", "z = 0.5"]
    locals_ = dbg.execute("info locals")
    assert "k = 0" in locals_ and "term = 0.0" in locals_ and "nu" not in locals_
    asm = Debugger(rvm.load(ROOT / "asm" / "isqrt.rasm"), "isqrt", (30, 0))
    asm.execute("s")
    assert asm.execute("info args").splitlines() == ["n = 30", "k = 0"]    # .alias names
    assert asm.execute("info locals").splitlines() == ["sq = 0"]


def test_breakpoint_management_like_gdb():
    dbg = Debugger(rvm.load(ROOT / "asm" / "isqrt.rasm"), "isqrt", (30, 0))
    dbg.execute("b count:*6")                    # BR.LE sq, n, top: once a pass
    dbg.execute("b isqrt:*1")
    dbg.execute("disable")                       # no numbers: all of them
    assert "reached the end" in dbg.execute("c")
    dbg.execute("run")
    dbg.execute("enable 1")
    assert "ignore next 2 crossings" in dbg.execute("ignore 1 2")
    assert "(ignore next 2)" in dbg.execute("info breakpoints")
    assert dbg.execute("c").startswith("breakpoint 1") and dbg.evaluate("k") == 3
    dbg.execute("condition 1 k == 5")
    assert dbg.execute("c").startswith("breakpoint 1") and dbg.evaluate("k") == 5
    info = dbg.execute("info breakpoints")
    assert "1  breakpoint at count:*6" in info and "if k == 5" in info and "(disabled)" in info
    assert dbg.execute("clear count:*6") == "deleted breakpoint 1"
    assert "no breakpoint at" in dbg.execute("clear count:*6")
    dbg.execute("b count")
    assert dbg.execute("clear count") == "deleted breakpoint 3"
    dbg.execute("enable 2")
    assert dbg.execute("c").startswith("breakpoint 2")
    assert dbg.execute("clear") == "deleted breakpoint 2"       # where the frame is
    assert "usage: ignore" in dbg.execute("ignore 9 1")


def test_display_after_every_stop_both_directions():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (6, 0, 0))
    assert dbg.execute("display r1 + r2") == "1: r1 + r2 = 0"
    dbg.execute("display r3")
    for command in ("s", "n", "si", "c", "rs", "rn", "rsi", "rc", "goto 5", "run"):
        out = dbg.execute(command)
        assert f"1: r1 + r2 = {dbg.evaluate('r1 + r2')}" in out, command
        assert f"2: r3 = {dbg.evaluate('r3')}" in out, command
    assert dbg.execute("undisplay 1") == "deleted display 1"
    assert "r1 + r2 =" not in dbg.execute("s") and "1: r3 =" in dbg.execute("s")


def test_run_with_arguments_restarts_with_them():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (3, 0, 0))
    dbg.execute("b fib:*4")
    out = dbg.execute("run 6 0 0")
    assert "restarted with arguments 6 0 0" in out and dbg.m.steps == 0
    dbg.execute("delete")
    dbg.execute("c")
    assert (dbg.evaluate("r1"), dbg.evaluate("r2")) == (8, 13)         # fib 6, not fib 3
    dbg.execute("run")                                                 # the new arguments kept
    dbg.execute("c")
    assert dbg.evaluate("r1") == 8
    out = dbg.execute("run 6 0")
    assert "fib takes 3" in out and "previous arguments" in out and dbg.args == (6, 0, 0)
    assert "is not a number" in dbg.execute("run 6 x 0") and dbg.args == (6, 0, 0)
    py = debugger_for(iexp, (0.0, 0.5))
    py.execute("run 0.0 1.0")
    py.execute("c")
    assert py.evaluate("out") == pytest.approx(2.718281828459045)


def test_set_var_is_refused_with_the_reason():
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (3, 0, 0))
    dbg.execute("s")
    before = dbg.m.snapshot()
    for command in ("set var r1 = 5", "set variable r1=5", "set r1 = 5"):
        out = dbg.execute(command)
        assert out.startswith("set var: refused") and "reversib" in out and "run ARGS" in out
    assert dbg.m.snapshot() == before


def test_tab_completion_offers_what_fits_the_position():
    import io

    from rvm.debugger.views import Shell
    dbg = Debugger(rvm.load(ROOT / "asm" / "isqrt.rasm"), "isqrt", (30, 0))
    dbg.execute("s")                                     # in count: n, k, sq
    dbg.execute("b count:*6")
    shell = Shell(dbg, io.StringIO())

    def complete(line):
        before, _, text = line.rpartition(" ")
        return shell.completedefault(text, line, len(before) + 1, len(line))
    assert complete("p ") == ["grad[", "heap[", "k", "n", "r0", "r1", "r2", "sq"]
    assert complete("print s") == ["sq"] and complete("display k + ") == complete("p ")
    assert complete("b co")[:2] == ["count", "count:*0"] and "k" not in complete("b ")
    assert complete("info ") == ["args", "breakpoints", "display", "frame", "locals",
                                 "registers", "watchpoints"]
    assert complete("info registers ") == ["all"] and complete("regs ") == ["all"]
    assert complete("grad ") == ["off", "on"]
    assert complete("set exec-direction ") == ["forward", "reverse"]
    assert complete("delete ") == ["1"] and complete("condition 1 ") == complete("p ")
    assert complete("s ") == [] and complete("q ") == []
    for line in ("p ", "print ", "display ", "watch "):
        assert not {"breakpoints", "on", "off", "registers"} & set(complete(line))


def test_cli_debug_run_and_draw_take_a_transform(tmp_path):
    script = tmp_path / "cmds"
    script.write_text("c\ninfo args\nq\n")
    py = str(ROOT / "examples" / "besselj.py")
    values = ["0.0", "1", "0.5", "1.0", "0.0"]          # f's arguments, then out_bar, z_bar
    for how in (["--entry", "besselj_inplace", "--transform", "adjoint"],
                ["--entry", "besselj_inplace.adj"], ["--entry", "adjoint(besselj_inplace)"]):
        r = subprocess.run([sys.executable, "-m", "rvm.cli", "debug", py, *how, "--args",
                            *values, "--batch", str(script)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        assert "rvm debugger: besselj_inplace.adjoint" in r.stdout, how
        assert "z_bar = 0.4539328918910" in r.stdout                # dJ1(z)/dz at 0.5
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(ROOT / "asm/fib.rasm"),
                        "--entry", "fib", "--transform", "inverse", "--args", "6", "8", "13"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "r1 = 0\nr2 = 0" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "run", str(ROOT / "asm/fib.rasm"),
                        "--entry", "fib.adj", "--transform", "tangent", "--args", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "fib.adj is the adjoint of fib" in r.stderr
    pictures = []
    for how in (["--transform", "tangent"], ["--entry", "fib.tan"], ["--tangent", "fib"]):
        out = tmp_path / f"{len(pictures)}.svg"
        r = subprocess.run([sys.executable, "-m", "rvm.cli", "draw", str(ROOT / "asm/fib.rasm"),
                            *how, "-o", str(out)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        pictures.append(out.read_bytes())
    assert pictures[0] == pictures[1] == pictures[2]


def test_cli_run_and_debug_take_the_derivatives_of_a_function_of_arrays(tmp_path):
    """`--transform tangent|adjoint` of a function given arrays: --args are its arguments,
    then one tangent (or shadow) per float argument, an array's an array of its shape,
    as rvm.tangent and rvm.adjoint take them, and run prints the values and tangents
    under the arguments' names (the program had been given each array without its
    tangents: it read x[1] as x[0]'s tangent, and printed out_dot = 31 for 1)."""
    (tmp_path / "f.py").write_text("from rvm import Array, reversible\n\n@reversible\n"
                                   "def main(out: float, x: Array[float]):\n"
                                   "    out += x[0] * x[0]\n")
    cli = [sys.executable, "-m", "rvm.cli"]
    x = "[3.0,5.0,7.0,9.0]"
    for transform, args, want in [
            ("tangent", ["0.0", x, "1.0", "[0,0,0,0]"],
             {"out": 9.0, "out_dot": 1.0, "x_dot": [0.0] * 4}),
            ("tangent", ["0.0", x, "0.0", "[1,0,0,0]"], {"out_dot": 6.0}),
            ("adjoint", ["0.0", x, "1.0", "[0,0,0,0]"],
             {"out_bar": 1.0, "x_bar": [6.0, 0.0, 0.0, 0.0]})]:
        r = subprocess.run([*cli, "run", str(tmp_path / "f.py"), "--transform", transform,
                            "--args", *args, "--json"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["x"] == [3.0, 5.0, 7.0, 9.0] and {k: got[k] for k in want} == want, got
    r = subprocess.run([*cli, "run", str(ROOT / "asm/arrays.rasm"), "--entry", "dot.tan",
                        "--args", "[1.0,2,3]", "[4.0,5,-6]", "0.5", "[1,0,0]", "[0,0,0]", "0",
                        "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and json.loads(r.stdout)["f0_dot"] == 4.0, r.stdout + r.stderr
    r = subprocess.run([*cli, "run", str(tmp_path / "f.py"), "--transform", "tangent",
                        "--args", "0.0", x, "1.0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == (
        "rvm: usage error: the tangent of main takes 4 arguments (out, x, out_dot, x_dot); "
        "--args gives 3"), r.stderr
    for given, want in ((["1.0", "[0,0,0,0]"], 0), (["[1.0]", "[0,0,0,0]"], 2)):
        # (whole numbers for the floats, as a call converts them; a scalar's shadow that
        # is not a number: a usage error)
        r = subprocess.run([*cli, "run", str(tmp_path / "f.py"), "--transform", "adjoint",
                            "--args", "0.0", "[3,5,7,9]", *given, "--json"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == want, r.stdout + r.stderr
        if want == 0:
            assert json.loads(r.stdout)["x_bar"] == [6.0, 0.0, 0.0, 0.0], r.stdout
        else:
            assert "must be a real number" in r.stderr and "Traceback" not in r.stderr, \
                r.stderr
    script = tmp_path / "cmds"
    script.write_text("c\ninfo args\nq\n")     # (the derivative's registers: f3 out_dot)
    r = subprocess.run([*cli, "debug", str(tmp_path / "f.py"), "--transform", "tangent",
                        "--args", "0.0", x, "0.0", "[1,0,0,0]", "--batch", str(script)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "f0 = 9.0" in r.stdout and " = 6.0" in r.stdout, \
        r.stdout + r.stderr


def test_cli_run_args_in_a_janus_program_converts_as_args_does(tmp_path):
    script = tmp_path / "cmds"
    script.write_text("run 0 0 10\nc\nq\n")        # main's x1, x2, n; main adds 4 to n
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "debug",
                        str(ROOT / "examples/janus/fib.ja"), "--batch", str(script)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "restarted with arguments 0 0 10" in r.stdout and "x1 = 610, x2 = 987" in r.stdout


def test_a_watch_on_an_element_stops_only_where_the_program_changes_it(tmp_path):
    """An element's update exchanges the element into a register and back, so its cell
    holds 0 in between: a watch compared after every instruction stopped there twice
    (1 -> 0, 0 -> 1) on an update that changes nothing, and `print` showed a state the
    program never has. Watches are compared where a source line (or a frame) is
    entered; an element shows as a number, not np.float64(...)."""
    (tmp_path / "d.py").write_text('''from rvm import Array, reversible

@reversible
def inner(s: float, v: Array[float], k: int):
    for i in range(len(v)):
        s += v[i] * k
    v[0] += s * 0.5

@reversible
def outer(out: float, v: Array[float], n: int):
    for j in range(n):
        inner(out, v, j)
''')
    out = batch(tmp_path / "d.py", ["--entry", "outer", "--args", "0.0", "[1.0,2.0,3.0]", "2"],
                "watch v[0]\nc\np v\nc\nrc\np v\nquit\n")
    # (j = 0: s = 0, v[0] unchanged; j = 1: s = 6, v[0] = 1 + 3)
    assert "watchpoint 1: v[0] = 1.0" in out
    assert out.count("old value") == 2, out     # the one change, forwards and back
    assert "old value = 1.0\n  new value = 4.0" in out
    assert "old value = 4.0\n  new value = 1.0" in out
    assert "v = [4., 2., 3.]" in out and "v = [1., 2., 3.]" in out


def test_watches_compare_between_statements_both_ways(tmp_path):
    """Backwards too: a watch compares where a line's first instruction is about to run
    (the line wholly undone), so reverse-continue reports a line's change at its start,
    not the half-undone state inside it (s = 9.0, which the program never holds), and a
    change in the first line is seen reaching the start and again going forwards."""
    (tmp_path / "w.py").write_text('''from rvm import reversible

@reversible
def f(s: float, t: float):
    s += t * t + t * 2.0
    t += 1.0
''')
    out = batch(tmp_path / "w.py", ["--args", "0.0", "3.0"], "watch s\nc\nc\nrc\nrc\nc\nquit\n")
    changes = re.findall(r"old value = (\S+)\n  new value = (\S+)", out)
    assert changes == [("0.0", "15.0"), ("15.0", "0.0"), ("0.0", "15.0")], out
    assert "9.0" not in out and "reached the start of f" in out


def test_watches_that_change_together_are_told_together(tmp_path):
    """Two watches changed by one statement (s and s * 2.0): both are told at that stop
    and both take their new values (only the first was told, and the other's change was
    lost, in either direction)."""
    (tmp_path / "w.py").write_text('''from rvm import reversible

@reversible
def f(s: float, t: float):
    s += 1.0
    t += 2.0
''')
    out = batch(tmp_path / "w.py", ["--args", "0.0", "0.0"],
                "watch s\nwatch s * 2.0\nc\nc\nc\nrc\nrc\nquit\n")
    changes = re.findall(r"watchpoint (\d): \S+(?: \* 2\.0)?\n  old value = (\S+)\n"
                         r"  new value = (\S+)", out)
    assert changes == [("1", "0.0", "1.0"), ("2", "0.0", "2.0"),
                       ("1", "1.0", "0.0"), ("2", "2.0", "0.0")], out


CALLS = """from rvm import reversible

@reversible
def inner(a: float, b: float):
    b += a * 2.0
    b += a

@reversible
def outer(x: float, y: float, s: float):
    inner(x, y)
    s += y
    inner(x, s)
"""


def test_a_watch_is_evaluated_in_the_frame_it_was_set_in(tmp_path):
    """A watch on the caller's y, set in the caller: inside the callee (whose locals are
    a and b) it is still the caller's y, so it stops where the callee changes it (its
    register is the callee's b), not where the callee is entered ("<unavailable>") and
    left again, as it did when watches were evaluated in the innermost frame."""
    (tmp_path / "p.py").write_text(CALLS)
    out = batch(tmp_path / "p.py", ["--entry", "outer", "--args", "1.0", "0.0", "0.0"],
                "watch y\nc\nc\nc\ninfo watchpoints\nquit\n")
    changes = re.findall(r"old value = (\S+)\n  new value = (\S+)", out)
    assert changes == [("0.0", "2.0"), ("2.0", "3.0")], out
    assert "unavailable" not in out and "1  watchpoint y (in outer)" in out, out


def test_a_watch_set_in_a_callee_is_deleted_when_its_frame_returns(tmp_path):
    """gdb's rule for a watch on a local: set in the callee, it stops at the callee's
    changes, then is deleted (and says so, stopping there) where the callee returns;
    the callee's second call does not find it. Going back into the call, nothing of it
    is left either."""
    (tmp_path / "p.py").write_text(CALLS)
    out = batch(tmp_path / "p.py", ["--entry", "outer", "--args", "1.0", "0.0", "0.0"],
                "break inner\nc\nwatch b\nc\nc\nc\nc\ninfo watchpoints\nrc\nrc\nquit\n")
    changes = re.findall(r"old value = (\S+)\n  new value = (\S+)", out)
    assert changes == [("0.0", "2.0"), ("2.0", "3.0")], out
    assert "watchpoint 2 deleted: the program left inner, where `b` is watched\n" \
        "[step 4] outer" in out, out
    assert out.count("watchpoint 2") == 4 and "watchpoint b" not in out, out


LOOPED_CALLS = """from rvm import Array, reversible

@reversible
def inner(a: float, b: float):
    b += a * 2.0

@reversible
def loop1(x: float, y: float, A: Array[float]):
    for i in range(3): inner(x, y)
    A[0] += x
"""


def test_a_watch_is_of_one_call_of_a_function_and_a_cells_watch_of_none(tmp_path):
    """Three calls of inner on one line: a watch on b set in the first call is that
    call's (a frame is told by its identity, not its function and depth: it stopped at
    the second and third calls' changes, which are other frames'); a watch on heap[0]
    names no variable, so it belongs to no frame and sees the caller's A[0] += x (it
    was deleted with the callee's frame). `run` deletes a callee frame's watch, saying
    so, and keeps the entry function's, as the new run's."""
    (tmp_path / "q.py").write_text(LOOPED_CALLS)
    args = ["--entry", "loop1", "--args", "1.0", "0.0", "[5.0]"]
    out = batch(tmp_path / "q.py", args, "break inner\nc\nwatch b\nwatch heap[0]\n"
                "c\nc\nc\nc\nc\ninfo watchpoints\nquit\n")
    assert re.findall(r"watchpoint 2: b\n  old value = (\S+)\n  new value = (\S+)", out) \
        == [("0.0", "2.0")], out
    assert "watchpoint 2 deleted: the program left inner" in out
    assert "watchpoint 3: heap[0]\n  old value = 4617315517961601024" in out, out
    assert "3  watchpoint heap[0]\n" in out and "(in " not in out.split("info")[-1], out
    out = batch(tmp_path / "q.py", args, "break inner\nc\nwatch b\nup\nwatch y\nrun\n"
                "info watchpoints\nc\nquit\n")
    assert "watchpoint 2 deleted: inner's frame, where `b` was watched, is not running\n" \
        "restarted" in out, out
    tail = out.split("restarted")[1]
    assert "3  watchpoint y (in loop1)" in tail and "watchpoint 2" not in tail, out


def batch(path, args: list, commands: str) -> str:
    """What `rvm debug PATH ARGS --batch` prints for these commands (checked to exit 0)."""
    script = path.parent / "cmds"
    script.write_text(commands)
    r = subprocess.run([sys.executable, "-m", "rvm.cli", "debug", str(path), *args,
                        "--batch", str(script)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_list_of_a_line_outside_the_source_says_so():
    """`list 9999` said "no source available" of a program whose source is there; a word
    for the line is a usage message."""
    out = batch(ROOT / "asm" / "fib.rasm", ["--args", "10", "0", "0"],
                "list 9999\nlist abc\nlist 3\nquit\n")
    lines = len((ROOT / "asm" / "fib.rasm").read_text().splitlines())
    assert f"line 9999 is outside the source ({lines} lines)" in out
    assert "usage: list [LINE]" in out and ".func fib" in out
