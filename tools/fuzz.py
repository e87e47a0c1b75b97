"""Fuzz rvm the way a hostile user would, and print a table of what happened.

    python tools/fuzz.py [--cases N] [--programs M] [--seed S] [--category C ...]

Categories: mutated .rasm text, mutated .rvmb bytes (loaded programs run on the native
engine when llvmlite is installed), random valid programs on the python and the native
engine (agreement with the interpreter, uncall, step/back), mutated frontend sources
(Python and Janus), random debugger command scripts, random CLI arguments, random
programs of array instructions (views that overlap, repeat cells or leave the heap) on
every engine. Every case
ends in one outcome:

    ok         it worked
    clean      it failed with rvm's own error (the expected answer to bad input)
    traceback  any other exception: a bug
    crash      the process died (a signal): a memory-safety bug
    hang       no answer within the time limit
    wrong      an engine disagreed with the interpreter, or a round trip lost state

Each category runs in a child process; a crash or a hang kills only that child, which is
restarted after the case. tests/test_fuzz.py runs a few hundred cases per category;
RVM_SLOW=1 runs more.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import multiprocessing as mp
import os
import pathlib
import random
import sys
import tempfile
import time
import traceback
import zlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))          # the random program generator
OUTCOMES = ("ok", "clean", "traceback", "crash", "hang", "wrong")
TIMEOUT = 60.0                   # seconds of a child's CPU time without progress: a hang
PER_CHILD = 250                                  # cases per child process


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """A few random byte changes, deletions and insertions."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(b))
        r = rng.random()
        if r < 0.6:
            b[pos] = rng.randrange(256)
        elif r < 0.8:
            del b[pos:pos + rng.randint(1, 8)]
        else:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(b)


TOKENS = ["r0", "r9", "f1", "f70000", "[r0 + 1]", "[r1 + r2]", "-1", "9223372036854775807",
          "-9223372036854775808", "1e308", "nan", "0x7f", "top", "done", ",", ":", ";",
          "CALL", "UNCALL", "JMP", "CF", "BR.EQ", "ALLOC", "FREE", "EXCH", "PUSH", "POP",
          "MUL", "DIV", "ADD.exp", "SUB.log", "ROT", ".func", ".end", "(", ")", "\n"]


ALPHABET = "rf0123456789,[]+-:;. \n" + "ADDSUBCFJMPBR.EQNE" + "xyz_()#"


def mutate_chars(text: str, rng: random.Random) -> str:
    """A few characters of assembly's alphabet replaced, deleted or inserted."""
    t = list(text)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(t))
        op = rng.random()
        if op < 0.4:
            t[pos] = rng.choice(ALPHABET)
        elif op < 0.7:
            del t[pos:pos + rng.randint(1, 6)]
        else:
            t.insert(pos, rng.choice(ALPHABET))
    return "".join(t)


def _mutate_text(text: str, rng: random.Random) -> str:
    """A few words replaced by tokens of the language, deleted, inserted or misspelt."""
    words = text.split(" ")
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(words))
        r = rng.random()
        if r < 0.4:
            words[pos] = rng.choice(TOKENS)
        elif r < 0.6:
            del words[pos]
        elif r < 0.8:
            words.insert(pos, rng.choice(TOKENS))
        else:
            w = words[pos]
            if w:
                k = rng.randrange(len(w))
                words[pos] = w[:k] + chr(rng.randrange(32, 127)) + w[k + 1:]
    return " ".join(words)


def native_available() -> bool:
    from rvm.engines import native
    return native.available


def _run_all(p, engine: str, max_steps: int = 5000) -> None:
    import rvm
    for fn in p.functions.values():
        args = [3 if r.cls == "i" else 0.5 for r in fn.params]
        with contextlib.suppress(rvm.RvmError):
            p.call(fn.name, *args, engine=engine, max_steps=max_steps, heap_limit=4096)


# ------------------------------------------------------------------ the categories


def case_rasm(rng: random.Random) -> str:
    import rvm
    path = rng.choice(sorted((ROOT / "asm").glob("*.rasm")))
    mutate = _mutate_text if rng.random() < 0.5 else mutate_chars
    text = mutate(path.read_text(), rng)
    try:
        p = rvm.assemble(text, "fuzz.rasm")
    except rvm.RvmError:
        return "clean"
    _run_all(p, "interp")
    return "ok"


def case_rvmb(rng: random.Random) -> str:
    import rvm
    from rvm.engines import native
    path = rng.choice(sorted((ROOT / "asm").glob("*.rasm")))
    data = bytearray(mutate_bytes(rvm.dumps(rvm.load(path)), rng))
    if len(data) >= 14 and rng.random() < 0.9:      # keep the CRC right, reach the parser
        data[10:14] = zlib.crc32(bytes(data[14:])).to_bytes(4, "little")
    try:
        p = rvm.loads(bytes(data), "fuzz.rvmb")
    except rvm.RvmError:
        return "clean"
    _run_all(p, "native" if native.available else "python")
    return "ok"


def case_program(rng: random.Random, engines=("python",)) -> str:
    """A random valid program on each engine: results agree with the interpreter, the
    uncall restores the inputs, N steps forward then N back restore the state."""
    from progen import program

    import rvm
    from rvm.engines import native
    text = program(rng.randrange(2 ** 32), wild=True)
    args = tuple(rng.randint(-9, 9) for _ in range(3)) + \
        tuple(rng.randint(-16, 16) / 8 * rng.choice((1, -1)) for _ in range(3))   # -0.0 too
    p = rvm.assemble(text, "gen.rasm")
    outcome = "ok"

    def result(engine):
        """The call's results, the uncall of them and a gradient (or the error types)."""
        out = []
        for run in (lambda: p.call("main", *args, engine=engine),
                    lambda: p.uncall("main", *out[0], engine=engine),
                    lambda: rvm.grad(p["main"], loss=3 + len(out[0]) % 3, engine=engine)(
                        *args)):
            try:
                out.append(run())
            except rvm.RvmError as e:
                return out + [type(e).__name__]
        return out
    ref = result("interp")
    for engine in engines:
        if engine == "native" and not native.available:
            continue
        got = result(engine)
        if len(got) != len(ref):
            return "wrong"
        for a, b in zip(ref, got):
            if isinstance(a, str) or isinstance(b, str):
                if a != b:
                    return "wrong"
                outcome = "clean"
            elif not _close(a, b):
                return "wrong"
    ref, back = ref[0], (ref[1:] or [None])[0]
    if isinstance(ref, tuple):
        # float reversibility is exact only up to rounding, which accumulates over a run
        # and grows with the magnitudes it reached (x + 1e16 - 1e16 is not x): integers
        # must come back exactly, floats within 1e-6 of the largest final magnitude (an
        # uncall that failed so, a float overflowing on the way back, failed alike on
        # every engine: compared above)
        scale = max([1.0] + [abs(v) for v in ref if isinstance(v, float)])
        if isinstance(back, tuple) and not _close(back, args, 1e-6 * scale):
            return "wrong"
        m = rvm.Machine(p, engine="interp")
        m.enter("main", *args)
        start = m.snapshot()
        n, scale = 0, 1.0
        while n < 200 and m.step():
            n += 1
            scale = max(scale, _magnitude(m.snapshot()))
        for _ in range(n):
            m.back()
        # the same rounding caveat: MUL by 1.5 backward divides, which rounds, and the
        # error grows with the magnitudes the registers reached on the way
        if not _close(m.snapshot()[0][0][3], start[0][0][3], 1e-6 * scale):
            return "wrong"
    return outcome


def _magnitude(snapshot) -> float:
    """The largest finite float magnitude in any frame's registers of a snapshot."""
    return max([0.0] + [abs(v) for frame in snapshot[0] for v in frame[3]
                        if isinstance(v, float) and math.isfinite(v)])


def _close(a, b, tol: float = 1e-9) -> bool:
    """Integers exactly, floats up to rounding (x - 1 + 1 need not be x)."""
    return len(a) == len(b) and all(
        x == y if x is None or y is None or (isinstance(x, int) and isinstance(y, int))
        else math.isclose(x, y, rel_tol=1e-9, abs_tol=max(tol, 1e-9)) or (x != x and y != y)
        for x, y in zip(a, b))


def case_frontend(rng: random.Random) -> str:
    import rvm
    path = rng.choice(sorted((ROOT / "examples").glob("*.py")))
    text = _mutate_text(path.read_text(), rng).replace("rvm.reversible", "rvm.reversible")
    out = pathlib.Path(f"/tmp/rvm_fuzz_{id(rng)}.py")
    out.write_text(text)
    try:
        rvm.load(out)
    except rvm.RvmError:
        return "clean"
    finally:
        out.unlink()
    return "ok"


def case_janus(rng: random.Random) -> str:
    """A mutated Janus program (examples and the tests' programs): compiled, then main
    run with bounded steps and heap; output statements go nowhere."""
    import rvm
    from rvm.lang import janus
    path = rng.choice(sorted((ROOT / "examples" / "janus").glob("*.ja")))
    mutate = _mutate_text if rng.random() < 0.5 else mutate_chars
    out = pathlib.Path(f"/tmp/rvm_fuzz_{id(rng)}.ja")
    out.write_text(mutate(path.read_text(), rng))
    try:
        p = rvm.load(out)
        with contextlib.redirect_stdout(io.StringIO()):
            p.call("main", *janus.main_arguments(p), max_steps=20_000, heap_limit=1 << 16)
    except rvm.RvmError:
        return "clean"
    finally:
        out.unlink()
    return "ok"


DEBUG_WORDS = ["s", "si", "n", "c", "rs", "rsi", "rn", "rc", "finish", "reverse-finish",
               "b", "tbreak", "delete", "watch", "display", "p", "x/4", "info", "bt", "up",
               "down", "grad on", "grad off", "list", "disas", "run", "goto", "set",
               "condition 1", "disable", "enable", "help", "frobnicate"]
DEBUG_ARGS = ["", "r0", "r1 + 1", "r2 % 0", "2 ** 99999", "heap[3]", "r0[1]", "7", "-3",
              "fib:*2", "12", "r1 > 3", "grad[f0]", "registers", "breakpoints", "1", "(",
              "x = 3", "r1 = 5", "fib", "*5", "999999"]


def case_debugger(rng: random.Random) -> str:
    import rvm
    from rvm.debugger import Debugger
    dbg = Debugger(rvm.load(ROOT / "asm" / "fib.rasm"), "fib", (rng.randint(0, 12), 0, 0),
                   max_steps=100_000)
    for _ in range(rng.randint(1, 12)):
        dbg.execute(f"{rng.choice(DEBUG_WORDS)} {rng.choice(DEBUG_ARGS)}".strip())
        if dbg.done:
            break
    return "ok"


CLI_WORDS = ["run", "grad", "jvp", "hessian", "dis", "asm", "compile", "debug", "--entry",
             "--args", "--loss", "--json", "--backward", "--engine", "interp", "python",
             "--max-steps", "--heap-limit", "0", "-1", "1e9", "-1e-8", "[1.0,2.0]", "[1,",
             "--no-checks", "--trace", "--tangents", "--wrt", "f0", "r0", "fib", "main",
             "--", "-o", "/nonexistent/dir/x.rvmb", "--plain", "--emit", "asm", "nan"]
CLI_FILES = ["asm/fib.rasm", "asm/besselj.rasm", "asm/arrays.rasm", "examples/iexp.py",
             "/nonexistent.rasm", "README.md"]


def case_cli(rng: random.Random) -> str:
    from rvm.cli import main
    argv = [rng.choice(CLI_WORDS[:8]), str(ROOT / rng.choice(CLI_FILES))]
    argv += [rng.choice(CLI_WORDS) for _ in range(rng.randint(0, 8))]
    if rng.random() < 0.2:
        argv += ["-o", rng.choice(["/nonexistent/dir/x.rvmb", "/proc/x.rvmb", "/tmp"])]
    if "debug" in argv:
        argv += ["--batch", "/dev/null"]
    # in a fresh directory: a random word after -o is a file name the CLI may write
    with tempfile.TemporaryDirectory() as where, contextlib.chdir(where), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as e:           # argparse's usage errors
            code = e.code
    return "ok" if code == 0 else "clean"


def case_program_native(rng: random.Random) -> str:
    return case_program(rng, engines=("native",))


def case_batches(rng: random.Random) -> str:
    """rvm.vmap of a random program without heap (a call and a gradient) over 8-30 rows,
    on the native engine, where the rows run in lockstep: the results of a batch are each
    row's alone, to the bit; a row that fails alone fails the batch with the same error
    as the first such row."""
    import functools

    import numpy as np
    from progen import program

    import rvm
    from rvm.engines import native
    if not native.available:
        return "ok"
    text = program(rng.randrange(2 ** 32), heap=False)
    if rng.random() < 0.5:      # a check at main's end that fails where r2 ends as 7
        text = text[:text.rindex(".end")] + "        ASSERT.NE r2, 7\n.end\n"
    p = rvm.assemble(text, "gen.rasm")
    n = rng.randint(8, 30)
    rows = [tuple(rng.randint(-9, 9) for _ in range(3)) +
            tuple(rng.randint(-16, 16) / 8 for _ in range(3)) for _ in range(n)]
    if rng.random() < 0.5:      # a row with a huge value, which may overflow there only
        k = rng.randrange(n)
        rows[k] = rows[k][:3] + tuple(rng.choice((1e300, -1e300, 1e-300, v))
                                      for v in rows[k][3:])
    for k in rng.sample(range(n), 2):
        rows[k] = rows[k][:2] + (7,) + rows[k][3:]
    cols = [np.array([r[k] for r in rows]) for k in range(6)]
    outcome = "ok"
    for f in (functools.partial(p["main"], engine="native"),
              rvm.grad(p["main"], loss=3 + rng.randrange(3), engine="native")):
        alone = []
        for r in rows:
            try:
                alone.append(f(*r))
            except rvm.RvmError as e:
                alone.append(type(e).__name__)
        try:
            together = rvm.vmap(f)(*cols)
        except rvm.RvmError as e:
            failed = [a for a in alone if isinstance(a, str)]
            if not failed or failed[0] != type(e).__name__:
                return "wrong"
            outcome = "clean"
            continue
        if any(isinstance(a, str) for a in alone):
            return "wrong"
        for k, column in enumerate(together):
            want = [a[k] for a in alone]
            if column is None or any(w is None for w in want):
                if column is not None or any(w is not None for w in want):
                    return "wrong"
            elif not np.array_equal(column, np.array(want, dtype=column.dtype),
                                    equal_nan=column.dtype.kind == "f"):
                return "wrong"
    return outcome


CACHE_PROGRAMS = [
    ".func main(f0, f1)\n    ADD f0, f1\n.end\n",
    ".func main(f0, f1)\n    SUB f0, f1\n.end\n",
    ".func main(f0, f1)\n    ADD.mul f0, f1, f1\n.end\n",
    ".func main(f0, f1)\n    ADD.sin f0, f1\n    ADD f1, 1.5\n.end\n",
    ".func main(f0, r0)\n    ADD f0, r0\n    ADD r0, 3\n.end\n",
]


def case_cache(rng: random.Random) -> str:
    """Damage a filled native-code cache at random; the programs' native results must
    still be the interpreter's (see the module's docstring)."""
    import shutil
    import warnings

    import rvm
    from rvm.engines import native
    if not native.available:
        return "ok"
    saved = {k: os.environ.get(k) for k in ("RVM_CACHE_DIR", "RVM_CACHE_MAX")}
    where = pathlib.Path(tempfile.mkdtemp(prefix="rvm_fuzz_cache_"))
    root = os.getuid() == 0 if hasattr(os, "getuid") else False
    try:
        os.environ["RVM_CACHE_DIR"] = str(where)
        os.environ.pop("RVM_CACHE_MAX", None)
        chosen = rng.sample(CACHE_PROGRAMS, rng.randint(2, len(CACHE_PROGRAMS)))
        args = [(rng.randint(-8, 8) / 4, rng.randint(-5, 5) if "r0" in text else
                 rng.randint(-8, 8) / 4) for text in chosen]
        want = [rvm.assemble(t).call("main", *a, engine="interp")
                for t, a in zip(chosen, args)]

        def native_results():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return [rvm.assemble(t).call("main", *a, engine="native")
                        for t, a in zip(chosen, args)]
        if native_results() != want:            # (the cache filled)
            return "wrong"
        entries = [p for p in where.iterdir() if p.name.startswith("rvm_")]
        for _ in range(rng.randint(1, 3)):
            if not entries:
                break
            p = rng.choice(entries)
            damage = rng.choice(["truncate", "flip", "empty", "append", "swap", "owner",
                                 "mode", "dirmode", "fifo", "zero", "link", "directory",
                                 "huge", "tmp", "max"])
            with contextlib.suppress(OSError):
                regular = p.is_file() and not p.is_symlink()
                data = p.read_bytes() if regular else b""
                if damage in ("truncate", "flip") and not data:
                    damage = "append"
                if damage in ("fifo", "zero", "link", "directory", "huge", "swap") or \
                        (damage in ("empty", "append", "owner", "mode") and not regular):
                    if p.is_dir() and not p.is_symlink():
                        shutil.rmtree(p)
                    else:
                        p.unlink()
                if damage == "truncate":
                    p.write_bytes(data[:rng.randrange(len(data) or 1)])
                elif damage == "flip":
                    b = bytearray(data)
                    for _ in range(rng.randint(1, 8)):
                        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                    p.write_bytes(bytes(b))
                elif damage == "empty":
                    p.write_bytes(b"")
                elif damage == "append":
                    p.write_bytes(data + os.urandom(rng.randint(1, 64)))
                elif damage == "swap":
                    other = rng.choice(entries)
                    if other.is_file() and not other.is_symlink():
                        p.write_bytes(other.read_bytes())
                elif damage == "owner" and root:
                    os.chown(p, 12345, 12345)
                elif damage == "mode":
                    p.chmod(rng.choice([0o666, 0o644, 0o620, 0o602, 0o600, 0o777]))
                elif damage == "dirmode":
                    d = rng.choice([where, where / "__pycache__"])
                    d.chmod(rng.choice([0o777, 0o775, 0o757, 0o755, 0o700, 0o1777]))
                elif damage == "fifo":
                    os.mkfifo(p)
                elif damage == "zero":
                    p.symlink_to("/dev/zero")
                elif damage == "link":
                    p.symlink_to(rng.choice(entries))
                elif damage == "directory":
                    p.mkdir()
                elif damage == "huge":
                    with open(p, "wb") as f:
                        f.truncate(300 << 20)           # (sparse: no disk used)
                elif damage == "tmp":
                    (where / f"tmp{rng.randrange(10 ** 6)}.tmp").write_bytes(data[:100])
                elif damage == "max":
                    os.environ["RVM_CACHE_MAX"] = rng.choice(["abc", "1e3", "-5", "0", "1"])
        if native_results() != want:
            return "wrong"
        if native_results() != want:            # (what the second run wrote, if anything)
            return "wrong"
        return "ok"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(OSError):
            where.chmod(0o700)
        shutil.rmtree(where, ignore_errors=True)


SPIN = """\
.func step(r0, r1)
        EXCH   r2, [r1]
        ADD    r2, r0
        SUB    r2, r0
        EXCH   r2, [r1]
.end
.func spin(f0, f1, r0)
        ADD    r4, 1
        ALLOC  r1, r4
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        CALL   step, r0, r1
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
        FREE   r1, r4
        SUB    r4, 1
.end
.func plain(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""


def case_signals(rng: random.Random) -> str:
    """SIGINT at a random moment of a long native run, a native batch or a compile: the
    call stops within half a second of the signal with KeyboardInterrupt (or had
    finished, and is right), and the same function then gives the interpreter's
    results."""
    import signal
    import threading

    import numpy as np
    from progen import program

    import rvm
    if not native_available() or threading.current_thread() is not threading.main_thread():
        return "ok"
    what = rng.choice(["run", "plain", "batch", "compile"])
    if what == "compile":
        p = rvm.assemble(program(rng.randrange(2 ** 32), heap=False), "gen.rasm")
        name, small = "main", (1, 2, 3, 0.5, 0.25, -1.0)
        long = small
    else:
        p = rvm.assemble(SPIN, "spin.rasm")
        name, small = ("spin" if what != "plain" else "plain"), (0.0, 10.0, 0)
        long = (0.0, 1e12, 0)
    want = None
    with contextlib.suppress(rvm.RvmError):
        want = p.call(name, *small, engine="interp")
    f = rvm.vmap(p[name]) if what == "batch" else \
        (lambda *a: p.call(name, *a, engine="native", max_steps=10 ** 13))
    args = [np.zeros(64), np.full(64, 1e9), np.zeros(64, np.int64)] if what == "batch" \
        else long
    sent: list = []
    swallowed: list = []        # KeyboardInterrupts Python discarded (in a finalizer)
    hook = sys.unraisablehook

    def unraisable(info):
        if issubclass(info.exc_type, KeyboardInterrupt):
            swallowed.append(info)
        else:
            hook(info)

    def fire():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    def again():                # as a user presses Ctrl-C again after a lost one
        if swallowed:
            fire()
    sys.unraisablehook = unraisable
    timer = threading.Timer(rng.uniform(0.0, 0.3), fire)
    retry = threading.Timer(1.0, again)
    timer.start()
    retry.start()
    outcome = "ok"
    try:
        with contextlib.suppress(rvm.RvmError):
            f(*args)
        if what != "compile":
            return "wrong"              # a run of minutes finished before the signal
        timer.join()
        time.sleep(0.05)                # (the signal arrives: no KeyboardInterrupt later)
    except KeyboardInterrupt:
        if time.monotonic() - sent[-1] > 0.5:
            return "wrong"              # too slow to stop
        outcome = "clean"
    finally:
        timer.cancel()
        retry.cancel()
        sys.unraisablehook = hook
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(0.01)
    try:
        got = p.call(name, *small, engine="native")
    except rvm.RvmError:
        got = None
    return outcome if got == want else "wrong"


def _argument(rng: random.Random):
    """A random argument of any kind a user might pass for a scalar parameter."""
    import numpy as np
    kind = rng.randrange(10)
    if kind == 0:
        return rng.randint(-9, 9)
    if kind == 1:
        return float(rng.randint(-9, 9))                    # integral float
    if kind == 2:
        return rng.randint(-16, 16) / 8 + 0.0625            # non-integral float
    if kind == 3:
        return rng.choice((True, False))
    if kind == 4:
        return rng.choice((np.int64(3), np.float64(2.0), np.float64(-0.5), np.float32(1.5),
                           np.int32(-2), np.uint64(1 << 63), np.bool_(True)))
    if kind == 5:
        return rng.choice((math.nan, math.inf, -math.inf, -0.0, 5e-324))
    if kind == 6:
        return rng.choice((1 << 63, -(1 << 63) - 1, 1 << 200, 2 ** 1024))
    if kind == 7:
        return rng.choice(([1], [1.5, 2.0], (), "3", None, 1 + 2j))
    return rng.randint(-9, 9) if rng.random() < 0.5 else rng.randint(-16, 16) / 8


def case_arguments(rng: random.Random) -> str:
    """Argument kinds across warm paths: a random program (and its gradient) called many
    times with valid arguments on an engine (direct-call and gradient plans, engine auto
    moving to native code), then with arguments of random kinds; every answer must be
    what a first call on the interpreter gives (the same values or the same error), and
    a batch of such rows must fail or agree row for row."""
    import numpy as np
    from progen import program

    import rvm
    engines = ["python", "auto"] + (["native"] if native_available() else [])
    engine = rng.choice(engines)
    text = program(rng.randrange(2 ** 32), heap=False)
    warm, fresh = rvm.assemble(text, "gen.rasm"), rvm.assemble(text, "gen.rasm")
    loss = 3 + rng.randrange(3)
    valid = (1, 2, 3, 0.5, 0.25, -1.0)
    calls = [lambda *a: warm.call("main", *a, engine=engine),
             rvm.grad(warm["main"], loss=loss, engine=engine)]
    refs = [lambda *a: fresh.call("main", *a, engine="interp"),
            rvm.grad(fresh["main"], loss=loss, engine="interp")]

    def outcome(f, args):
        try:
            return ("ok", f(*args))
        except rvm.RvmError as e:
            return (type(e).__name__, str(e).split(" (compiled engine")[0])

    def same(a, b):
        if a[0] != b[0]:
            return False
        return a[1] == b[1] if a[0] != "ok" else \
            all(x == y or (x != x and y != y) for x, y in zip(a[1], b[1]))
    for f in calls:
        for _ in range(8):
            with contextlib.suppress(rvm.RvmError):
                f(*valid)
    result = "ok"
    for _ in range(4):
        args = [_argument(rng) if rng.random() < 0.15 else v for v in valid]
        for f, ref in zip(calls, refs):
            got, want = outcome(f, args), outcome(ref, args)
            if got[0] != want[0] or (got[0] == "ok" and not same(got, want)):
                return "wrong"
            if got[0] != "ok":
                result = "clean"
    try:
        cols = [np.array([v, _argument(rng) if rng.random() < 0.3 else v]) for v in valid]
        together = rvm.vmap(calls[0])(*cols)
    except (rvm.RvmError, TypeError, ValueError):
        return "clean"
    for k in range(2):
        want = outcome(refs[0], [c[k].item() if hasattr(c[k], "item") else c[k]
                                 for c in cols])
        if want[0] != "ok" or tuple(t[k] for t in together) != want[1]:
            return "wrong"
    return result


def case_arrays(rng: random.Random) -> str:
    """A random program of array instructions over three small arrays and a scalar,
    with views that may reach outside their array or the heap, repeat cells, overlap or
    run backwards: every engine gives the interpreter's results (to rounding) and its
    gradient, or refuses alike; the uncall restores the arrays."""
    import numpy as np

    import rvm
    from rvm.core import isa
    from rvm.engines import native
    lens = [rng.randint(1, 12) for _ in range(3)]

    def view():
        k, off = rng.randrange(3), rng.randint(-2, 13)
        at = f"r{2 * k} + {off}" if off >= 0 else f"r{2 * k} - {-off}"
        return f"[{at} : {rng.choice((0, 1, 2, -1, 3, 5))}, {rng.choice((0, 1, 1, -1, 2))}]"

    def scalar():
        return rng.choice(("f0", "1.5", "-0.5", "2"))
    dim = lambda: str(rng.choice((0, 1, 1, 2, 2, 3, 4)))
    families = sorted(isa.FAMILIES)
    body = []
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.55:
            head = rng.choice(("VADD", "VSUB"))
            fam = rng.choice([None, *families])
            n_ops = 1 if fam is None else len(isa.FAMILIES[fam][0])
            ops = [view() if rng.random() < 0.7 else scalar() for _ in range(n_ops)]
            body.append(f"{head}{'.' + fam if fam else ''} {view()}, {', '.join(ops)}, "
                        f"{dim()}, {dim()}")
        elif kind < 0.75:
            body.append(f"{rng.choice(('VMADD', 'VMSUB'))} {view()}, {view()}, {view()}, "
                        f"{dim()}, {dim()}, {dim()}")
        elif kind < 0.85:
            body.append(f"{rng.choice(('VMUL', 'VDIV'))} {view()}, {scalar()}, {dim()}, {dim()}")
        elif kind < 0.93:
            body.append(f"VSWAP {view()}, {view()}, {dim()}, {dim()}")
        else:
            body.append(f"VNEG {view()}, {dim()}, {dim()}")
    text = ".func f(r0, r1, r2, r3, r4, r5, f0)\n" + "\n".join(body) + "\n.end\n"
    p = rvm.assemble(text, "arrays.rasm")
    nrng = np.random.default_rng(rng.randrange(2 ** 32))
    args = [nrng.uniform(0.5, 2.0, n) * nrng.choice((1, -1), n) for n in lens] + \
        [rng.choice((0.75, -1.25, 3.0))]

    def result(engine):
        out = []
        for run in (lambda: p.call("f", *args, engine=engine),
                    lambda: rvm.grad(p["f"], loss=(0, 0), engine=engine)(*args)):
            try:
                out.append(run())
            except rvm.RvmError as e:
                return out + [type(e).__name__]
        return out

    def same(a, b) -> bool:
        if isinstance(a, str) or isinstance(b, str):
            return a == b
        return len(a) == len(b) and all(
            np.allclose(x, y, rtol=1e-9, atol=1e-9) for x, y in zip(a, b))
    ref = result("interp")
    for engine in ("python", "native") if native.available else ("python",):
        got = result(engine)
        if len(got) != len(ref) or not all(same(a, b) for a, b in zip(ref, got)):
            return "wrong"
    if isinstance(ref[0], str):
        return "clean"
    try:
        back = p.uncall("f", *ref[0], engine="interp")
    except rvm.RvmError:
        return "wrong"              # the inverse of a run that worked must work
    scale = max(1.0, *(float(np.max(np.abs(a))) for a in ref[0][:3]))
    if not all(np.allclose(x, y, rtol=1e-7, atol=1e-7 * scale)
               for x, y in zip(back[:3], args[:3])):
        return "wrong"
    return "ok"


CATEGORIES = {"rasm": case_rasm, "rvmb": case_rvmb, "frontend": case_frontend,
              "janus": case_janus,
              "debugger": case_debugger, "cli": case_cli, "programs": case_program,
              "programs-native": case_program_native, "batches": case_batches,
              "arguments": case_arguments, "cache": case_cache, "signals": case_signals,
              "arrays": case_arrays}


# ------------------------------------------------------------------ running


def _child(category: str, seed: int, start: int, count: int, conn) -> None:
    import os
    import warnings
    warnings.simplefilter("ignore")
    os.environ["RVM_CACHE_DIR"] = ""      # random programs: nothing worth caching on disk
    case = CATEGORIES[category]
    # a fresh child every PER_CHILD cases: natively compiled programs are never freed
    for k in range(start, min(count, start + PER_CHILD)):
        rng = random.Random(seed * 1_000_003 + k)
        try:
            outcome = case(rng)
            detail = ""
        except Exception:
            outcome, detail = "traceback", traceback.format_exc(limit=6)
        conn.send((k, outcome, detail))
    conn.send(None)


def _cpu_seconds(pid: int) -> float | None:
    """CPU time a process has used (Linux /proc), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _answers(recv, pid: int, timeout: float, wall: float) -> bool:
    """Wait for the child's next message: False (a hang) once the child has used
    `timeout` seconds of CPU without answering, or `wall` seconds have passed (a child
    that neither runs nor answers). CPU time, not wall time, so a campaign starved of
    the processor by other work does not count slow cases as hangs."""
    start, waited = _cpu_seconds(pid), 0.0
    step = min(1.0, timeout)
    while not recv.poll(step):
        waited += step
        now = _cpu_seconds(pid)
        used = waited if now is None or start is None else now - start
        if used >= timeout or waited >= wall:
            return False
    return True


def run(category: str, count: int, seed: int = 0, timeout: float = TIMEOUT,
        details: list | None = None, progress=None, wall: float | None = None) -> dict[str, int]:
    """Run `count` cases of a category in child processes; outcome counts. A case is a
    hang after `timeout` seconds of the child's CPU time without an answer, or `wall`
    seconds (default 10 x timeout). `progress` (a file) gets a line with the counts so
    far after each child's batch of cases."""
    wall = 10 * timeout if wall is None else wall
    counts = dict.fromkeys(OUTCOMES, 0)
    ctx = mp.get_context("fork")
    k = 0
    while k < count:
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_child, args=(category, seed, k, count, send))
        child.start()
        send.close()
        while True:
            if not _answers(recv, child.pid, timeout, wall):
                child.kill()
                child.join()
                counts["hang"] += 1
                if details is not None:
                    details.append((category, k, "hang", ""))
                k += 1
                break
            try:
                msg = recv.recv()
            except EOFError:             # the child died: a crash in case k
                child.join()
                counts["crash"] += 1
                if details is not None:
                    details.append((category, k, f"crash (exit {child.exitcode})", ""))
                k += 1
                break
            if msg is None:              # this child is done; the next one goes on
                child.join()
                break
            k, outcome, detail = msg
            counts[outcome] += 1
            if outcome in ("traceback", "wrong") and details is not None:
                details.append((category, k, outcome, detail))
            k += 1
        recv.close()
        if progress is not None:
            print(f"{category}: {k} of {count} cases: {counts}", file=progress, flush=True)
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=1000, help="cases per input category")
    ap.add_argument("--programs", type=int, default=200, help="random programs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--category", nargs="*", choices=list(CATEGORIES))
    args = ap.parse_args()
    names = args.category or list(CATEGORIES)
    if "programs-native" in names and not native_available():
        ap.error("programs-native needs llvmlite (pip install 'rvm[fast]'): without it no "
                 "program would reach the native engine")
    details: list = []
    print(f"| category | cases | {' | '.join(OUTCOMES)} | seconds |")
    print("|---|---|" + "---|" * (len(OUTCOMES) + 1))
    for name in names:
        n = args.programs if name.startswith("programs") else args.cases
        t = time.time()
        counts = run(name, n, args.seed, details=details, progress=sys.stderr)
        print(f"| {name} | {n} | " + " | ".join(str(counts[o]) for o in OUTCOMES) +
              f" | {time.time() - t:.0f} |", flush=True)
    for category, k, outcome, detail in details[:20]:
        print(f"\n{category} case {k}: {outcome}\n{detail}")


if __name__ == "__main__":
    main()
