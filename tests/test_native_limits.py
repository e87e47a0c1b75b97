"""Limits that hold on native code: Ctrl-C (SIGINT) stops a native run, a native batch
and a compile within half a second, and the machine works afterwards; a refused huge
ALLOC costs no memory; a run that exhausts its step budget costs about what a
succeeding one does, and reports what the interpreter reports."""

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import REUSED

import rvm
from rvm.engines import llvm, native
from rvm.engines.compiled import Compiled
from rvm.engines.lowering import CLEAN_EVERY
from rvm.engines.machine import Machine

pytestmark = pytest.mark.skipif(not (native.available and llvm.usable()),
                                reason="llvmlite is not installed")

# counts f0 up by 1.0 until it reaches f1 (r0 counts the passes): not a counted loop
SPIN = """\
.func spin(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""
# the same with a call and the heap in every pass (r1: a cell the callee adds r0 into)
SPIN_CALLS = """\
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
"""
FIB = """\
.func fib(r0, r1, r2)
        ADD    r2, 1
top:    CF.NE  r3, 0, back
        ADD    r1, r2
        SWAP   r1, r2
        INC    r3
exitbr: BR.EQ  r3, r0, done
back:   JMP    top
done:   CF     exitbr
        SUB    r3, r0
.end
"""
ALLOC = """\
.func big(r0, r1)
        ALLOC  r1, r0
        FREE   r1, r0
.end
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path / "cache"))


def interrupted(call, after: float = 0.3) -> float:
    """Run call(), sending this process SIGINT `after` seconds in: the seconds from the
    signal to the KeyboardInterrupt (which it must raise)."""
    sent = []

    def fire():
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)
    timer = threading.Timer(after, fire)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
            time.sleep(after + 5)       # (finished before the signal: fail, not hang)
    finally:
        timer.cancel()
    return time.monotonic() - sent[0]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals go to the main thread")
@pytest.mark.parametrize("text,args", [(SPIN, (0.0, 4e9, 0)), (FIB, (2 * 10**10, 0, 0)),
                                       (SPIN_CALLS, (0.0, 5e9, 0))],
                         ids=["loop", "counted-loop", "calls-and-heap"])
def test_sigint_stops_a_native_run_and_the_machine_works_after(text, args):
    p = rvm.assemble(text)
    name = "spin" if text is not FIB else "fib"
    small = (0.0, 10.0, 0) if text is not FIB else (10, 0, 0)
    options = dict(engine="native", max_steps=10**12)    # (runs of about 6 s)
    expected = p.call(name, *small, **options)
    assert interrupted(lambda: p.call(name, *args, **options)) < 0.5
    assert p.call(name, *small, **options) == expected       # the same machine, again
    for _ in range(4):                  # the direct way in (no machine frame)
        assert p.call(name, *small, **options) == expected
    assert interrupted(lambda: p.call(name, *args, **options)) < 0.5
    assert p.call(name, *small, **options) == expected


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signals go to the main thread")
@pytest.mark.parametrize("n,passes", [(200, 2e7), (2 * native.THREAD_ROWS, 1e6)],
                         ids=["one-thread", "threads"])
def test_sigint_stops_a_native_batch(n, passes):
    v = rvm.vmap(rvm.assemble(SPIN)["spin"])
    xs, zs = np.zeros(n), np.zeros(n, np.int64)      # (batches of about 6 s)
    assert list(v(xs, np.full(n, 10.0), zs)[2][:2]) == [10, 10]
    assert interrupted(lambda: v(xs, np.full(n, passes), zs)) < 0.5
    assert list(v(xs, np.full(n, 10.0), zs)[2][:2]) == [10, 10]


CLI = "import sys; from rvm.cli import main; sys.exit(main(sys.argv[1:]))"


def run_cli(tmp_path, text: str, *args: str, interrupt: float | None = None):
    """`rvm run` on text in a subprocess: (exit code, stderr, seconds from the SIGINT to
    the exit)."""
    source = tmp_path / "prog.rasm"
    source.write_text(text)
    env = dict(os.environ, RVM_CACHE_DIR=str(tmp_path / "cache"))
    p = subprocess.Popen([sys.executable, "-c", CLI, "run", str(source), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if interrupt is None:
        err = p.communicate(timeout=120)[1]
        return p.returncode, err, None
    time.sleep(interrupt)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=60)[1]
    return p.returncode, err, time.monotonic() - sent


def test_sigint_stops_the_cli_on_native_code_with_exit_130(tmp_path):
    # compiled first (the cache), so that the signal finds the native loop running
    assert run_cli(tmp_path, SPIN, "--engine", "native", "--args", "0.0", "10.0", "0")[0] == 0
    code, err, after = run_cli(tmp_path, SPIN, "--engine", "native", "--max-steps",
                               str(10**12), "--args", "0.0", "4e9", "0", interrupt=1.5)
    assert code == 130 and after < 0.5
    assert err.strip() == "rvm: interrupted"        # one line, no traceback


def test_sigint_stops_a_compile(monkeypatch, tmp_path):
    """An LLVM compile runs on a second thread: the main thread's wait is what Ctrl-C
    stops (here a compile made to take seconds; an empty cache, so it compiles)."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    slow = llvm._compile_ir

    def compile_slowly(text, quick=False):
        time.sleep(3)
        return slow(text, quick)
    monkeypatch.setattr(llvm, "_compile_ir", compile_slowly)
    p = rvm.assemble(SPIN)
    assert interrupted(lambda: p.call("spin", 0.0, 10.0, 0, engine="native")) < 0.5
    monkeypatch.setattr(llvm, "_compile_ir", slow)
    assert p.call("spin", 0.0, 10.0, 0, engine="native") == (10.0, 10.0, 10)


def peak_rss_mb(code: str) -> float:
    """The peak resident memory (MB) of a Python process running code, over that of one
    that only imports rvm and compiles nothing."""
    script = textwrap.dedent("""
        import resource, sys
        import rvm
        from rvm.engines import llvm
        llvm._llvm()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        exec(sys.argv[1])
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script, code], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


@pytest.mark.parametrize("limit", [1 << 24, 1 << 28])
def test_a_refused_huge_alloc_costs_no_memory_on_native(limit):
    code = textwrap.dedent(f"""
        p = rvm.assemble({ALLOC!r})
        p.call("big", 10, 0, engine="native")
        try:
            p.call("big", 1 << 40, 0, engine="native", heap_limit={limit})
        except rvm.MachineError as e:
            assert "heap limit of {limit} cells exceeded" in str(e), e
            assert e.function == "big" and e.index == 0, (e.function, e.index)
        else:
            raise AssertionError("not refused")
    """)
    assert peak_rss_mb(code) < 150


def test_alloc_within_the_limit_sizes_the_heap_at_once(monkeypatch):
    grown = []
    real = Machine._grow
    monkeypatch.setattr(Machine, "_grow", lambda m, need: grown.append(need) or real(m, need))
    p = rvm.assemble(ALLOC)
    assert p.call("big", 1_000_000, 0, engine="native") == (1_000_000, 0)
    assert len(grown) == 2 and grown[-1] >= 1_000_000      # the first heap, then one


def test_out_of_memory_is_an_rvm_error(tmp_path):
    # a heap limit the machine could never hold: the allocation fails, and says so
    code, err, _ = run_cli(tmp_path, ALLOC, "--engine", "native", "--heap-limit",
                           str(1 << 50), "--args", str(1 << 49), "0")
    assert code == 1 and "out of memory" in err and "Traceback" not in err, err


# the interpreter's steps in a replay: from the last back edge where native code found every
# float register finite (at most CLEAN_EVERY steps and a pass of these loops before)
REPLAY = CLEAN_EVERY + 150


def steps_stepped(monkeypatch) -> list:
    """Records the steps each interpreter move takes (Machine._move, and Machine.walk's
    whole walk), also one that raises (a failure it reports)."""
    taken: list = []
    real, real_walk, walking = Machine._move, Machine.walk, []

    def move(m, D, limit):
        before = m.steps
        try:
            return real(m, D, limit)
        finally:
            if not walking:
                taken.append(abs(m.steps - before))

    def walk(m, D, limit, bad):
        before = m.steps
        walking.append(True)
        try:
            return real_walk(m, D, limit, bad)
        finally:
            walking.pop()
            taken.append(abs(m.steps - before))
    monkeypatch.setattr(Machine, "_move", move)
    monkeypatch.setattr(Machine, "walk", walk)
    return taken


@pytest.mark.parametrize("text,args", [(SPIN, (0.0, 1e15, 0)), (FIB, (10**15, 0, 0)),
                                       (SPIN_CALLS, (0.0, 1e15, 0))],
                         ids=["loop", "counted-loop", "calls-and-heap"])
def test_an_exhausted_budget_on_native_is_reported_as_the_interpreter_does(
        text, args, monkeypatch):
    p = rvm.assemble(text)
    name = "spin" if text is not FIB else "fib"
    for budget in (1_000, 1_001, 1_002, 1_003, 1_004, 1_005, 1_006, 2_000_003):
        errors = []
        for engine in ("interp", "native"):
            with pytest.raises(rvm.MachineError) as e:
                p.call(name, *args, engine=engine, max_steps=budget)
            errors.append((str(e.value), e.value.function, e.value.index))
        assert errors[0] == errors[1], budget
        assert "step budget of" in errors[1][0]
    # the interpreter stepped only over the few steps past the budget (not all of them)
    taken = steps_stepped(monkeypatch)
    m = Machine(p, engine="native", max_steps=2_000_003)
    m.enter(name, *args)
    with pytest.raises(rvm.MachineError, match="step budget"):
        m.run()
    assert m.steps == 2_000_003 and 0 < sum(taken) < REPLAY, taken


def test_an_exhausted_budget_costs_about_a_succeeding_run():
    p = rvm.assemble(SPIN)
    p.call("spin", 0.0, 10.0, 0, engine="native")       # (compiled)
    start = time.perf_counter()         # 20 million passes of 5 steps
    p.call("spin", 0.0, 2e7, 0, engine="native", max_steps=10**8 + 10)
    ok = time.perf_counter() - start
    start = time.perf_counter()
    with pytest.raises(rvm.MachineError, match="step budget"):
        p.call("spin", 0.0, 1e15, 0, engine="native", max_steps=10**8)
    failed = time.perf_counter() - start
    assert failed < 3 * ok + 0.05, (failed, ok)


@pytest.mark.parametrize("path,name,args,budget", [
    ("asm/isqrt.rasm", "isqrt", (10**12, 7), 3_000_008),       # in a callee's loop
    ("asm/isqrt.rasm", "isqrt", (10**6, 7), 4_007),            # the root, after the call
    ("asm/arrays.rasm", "dot", (np.arange(300.0), np.arange(300.0), 0.0), 1_000),  # heap
], ids=["callee-loop", "after-call", "full-heap"])
def test_an_exhausted_budget_in_a_callee_or_a_full_heap_is_reported_from_native_code(
        path, name, args, budget, monkeypatch):
    p = rvm.load(path)
    errors = []
    for engine in ("interp", "native"):
        with pytest.raises(rvm.MachineError) as e:
            p.call(name, *args, engine=engine, max_steps=budget)
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "step budget of" in errors[0][0]
    taken = steps_stepped(monkeypatch)
    m = Machine(p, engine="native", max_steps=budget)
    m.enter(name, *args)
    with pytest.raises(rvm.MachineError, match="step budget"):
        m.run()
    assert m.steps == budget and sum(taken) < REPLAY, taken     # (not the whole run again)


# a loop whose float arithmetic rounds (x + 0.1 - 0.1 need not be x): stepping back over
# it does not give the interpreter's registers back
ROUNDING = """\
.func spin(f0, f1, f2, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        ADD    f2, 0.1
        ADD.sin f2, f0
        ROT    f2, f1, 0.3
exitbr: BR.GE  f0, 300.0, done
back:   JMP    top
done:   CF     exitbr
.end
"""


@pytest.mark.parametrize("how", ["forward", "back", "grad"])
def test_registers_after_an_exhausted_budget_are_the_interpreters_to_the_bit(how):
    """Native code stops at the first back edge past the budget; the machine may step
    back over the steps past it only where their inverses give every bit back (moves,
    integers, control): over rounding float arithmetic it runs natively again to the back
    edge before and steps forwards, so every register (and shadow) is the interpreter's.
    (Stepping back left a unit in the last place in most budgets here.)"""
    p = rvm.assemble(ROUNDING)
    for budget in range(1_000, 1_040):
        outcomes = []
        for engine in ("interp", "native"):
            m = Machine(p, engine=engine, max_steps=budget)
            m.enter("spin", 0.0, 0.7, 0.3, 0)
            direction = 1
            if how != "forward":    # (300 passes, on native code for both: the same
                m.engine, m.max_steps = "native", 10**6     # steps counted)
                m.run(1)
                m.engine, m.max_steps, direction = engine, budget, -1
                if how == "grad":
                    m.set_grad(True)
                    m.clear_shadows()
                    m.stack[0].G[m.stack[0].fn.n_int + 2] = 1.0
            with pytest.raises(rvm.MachineError, match="step budget"):
                m.run(direction)
            outcomes.append((m.steps, [(f.state, list(f.R), f.G and list(f.G))
                                       for f in m.stack]))
        assert outcomes[0] == outcomes[1], (budget, outcomes)


@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_random_programs_report_an_exhausted_budget_as_the_interpreter_does(seed):
    import random

    from progen import program
    p = rvm.assemble(program(seed))
    args = (3, -2, 5, 0.5, -1.25, 2.0)
    m = Machine(p, engine="interp")
    m.enter("main", *args)
    total = m.run()
    rng = random.Random(seed)
    for budget in {rng.randint(1, max(total - 1, 1)) for _ in range(4)}:
        errors = []
        for engine in ("interp", "native"):
            try:
                errors.append(p.call("main", *args, engine=engine, max_steps=budget))
            except rvm.RvmError as e:
                errors.append((type(e).__name__, str(e), e.function, e.index))
        assert errors[0] == errors[1], (seed, budget)


# spin run backwards by a caller: the budget runs out in a function called by UNCALL
SPIN_UNCALLED = SPIN + """
.func unspin(f0, f1, r0)
        UNCALL spin, f0, f1, r0
.end
"""
PASSES = 3_000_000


def states(text: str) -> tuple:
    """(program, function, its arguments at the start and at the end of a run of PASSES
    passes)."""
    p, n = rvm.assemble(text), float(PASSES)
    if text is FIB:
        start = (PASSES, 0, 0)
        return p, "fib", start, p.call("fib", *start, engine="native", max_steps=10**9)
    if text is SPIN_UNCALLED:
        return p, "unspin", (n, n, PASSES), (0.0, n, 0)
    return p, "spin", (0.0, n, 0), (n, n, PASSES)


def run_out(text: str, engine: str, budget: int, how: str) -> tuple:
    """Run a program backwards from the end of a run of PASSES passes with this step
    budget, which must run out: the error (message, function, instruction), the steps
    counted, and each frame's function, state, registers and shadows. how: "uncall"
    (p.uncall, rvm run --backward: the root frame reversed, run to its end), "forward"
    (from the start: the budget of unspin runs out in the spin it uncalls), "back"
    (run(-1) after a forward run) or "grad" (rvm.grad's gradient pass: run(-1) in
    gradient mode, the first float parameter's shadow seeded with 1)."""
    p, name, start, end = states(text)
    if how in ("uncall", "forward"):
        m = Machine(p, engine=engine, max_steps=budget)
        m.enter(name, *(end if how == "uncall" else start), backward=how == "uncall")
        direction = 1
    else:           # forwards first, on native code (the same end state, quickly)
        m = Machine(p, engine="native", max_steps=10**9)
        m.enter(name, *start)
        m.run(1)
        assert m.results() == tuple(end)
        m.engine, m.max_steps, direction = engine, budget, -1
        if how == "grad":
            m.set_grad(True)
            m.clear_shadows()
            fr = m.stack[0]
            if fr.fn.n_float:       # (fib has no float: its shadows stay zero)
                fr.G[fr.fn.n_int] = 1.0
    with pytest.raises(rvm.MachineError) as e:
        m.run(direction)
    return ((str(e.value), e.value.function, e.value.index), m.steps,
            [(f.fn.name, f.state, f.R, f.G) for f in m.stack])


@pytest.mark.parametrize("text,how", [
    (text, how) for text in (SPIN, FIB, SPIN_CALLS, SPIN_UNCALLED)
    for how in ("uncall", "back", "grad")] + [(SPIN_UNCALLED, "forward")],
    ids=[f"{text}-{how}" for text in ("loop", "counted-loop", "calls-and-heap", "uncalled")
         for how in ("uncall", "back", "grad")] + ["uncalled-forward"])
def test_an_exhausted_budget_backwards_or_in_a_gradient_pass_is_reported_from_native_code(
        text, how, monkeypatch):
    """Backward runs and gradient passes (shadows included) stop where the interpreter
    does, reported from native code's checkpoint: the same error, steps, frames,
    registers and shadows, the interpreter stepping over only the few steps past the
    budget."""
    for budget in (1_000, 1_001, 1_002, 1_003, 1_004, 1_005, 1_006, 200_003):
        expected = run_out(text, "interp", budget, how)
        taken = steps_stepped(monkeypatch)
        got = run_out(text, "native", budget, how)
        monkeypatch.undo()
        assert got == expected, (budget, got, expected)
        assert "step budget of" in got[0][0] and sum(taken) < REPLAY, (budget, taken)


@pytest.mark.parametrize("how", ["back", "grad"])
@pytest.mark.parametrize("seed", range(0, 40, 4))
def test_random_programs_report_an_exhausted_budget_backwards_as_the_interpreter_does(
        seed, how):
    """Random programs (loops, heap blocks, calls and uncalls of a helper) run backwards,
    plain or in gradient mode, with budgets that run out anywhere: the error, the steps
    counted and where each frame stands are the interpreter's."""
    import random

    from progen import program
    p = rvm.assemble(program(seed))
    args = (3, -2, 5, 0.5, -1.25, 2.0)
    m = Machine(p, engine="interp")
    m.enter("main", *args)
    total = m.run()
    rng = random.Random(seed)
    for budget in sorted({rng.randint(1, max(total - 1, 1)) for _ in range(4)}):
        outcomes = []
        for engine in ("interp", "native"):
            m = Machine(p, engine="interp")
            m.enter("main", *args)
            m.run(1)                # (the same end state for both)
            m.engine, m.max_steps = engine, budget
            if how == "grad":
                m.set_grad(True)
                m.clear_shadows()
                m.stack[0].G[-1] = 1.0
            try:
                m.run(-1)
                outcomes.append(m.results())
            except rvm.RvmError as e:
                outcomes.append((type(e).__name__, str(e), e.function, e.index, m.steps,
                                 [(f.fn.name, f.state) for f in m.stack]))
        assert outcomes[0] == outcomes[1], (seed, budget)


# a loop whose block calls spin twice and uncalls it twice (its own loops of 10 passes)
SPIN_TWICE = SPIN + """
.func twice(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        ADD    f3, 10.0
        CALL   spin, f2, f3, r2
        ADD    f5, 10.0
        CALL   spin, f4, f5, r4
        UNCALL spin, f4, f5, r4
        SUB    f5, 10.0
        UNCALL spin, f2, f3, r2
        SUB    f3, 10.0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "uncall"])
def test_an_exhausted_budget_in_one_of_a_blocks_calls_of_a_function_is_reported_from_native_code(
        backward, monkeypatch):
    p = rvm.assemble(SPIN_TWICE)
    args = (1e6, 1e6, 10**6) if backward else (0.0, 1e6, 0)
    for budget in range(1_000, 1_300, 7):     # (in each of the four calls, and between)
        errors = []
        for engine in ("interp", "native"):
            taken = steps_stepped(monkeypatch)
            m = Machine(p, engine=engine, max_steps=budget)
            m.enter("twice", *args, backward=backward)
            with pytest.raises(rvm.MachineError) as e:
                m.run()
            monkeypatch.undo()
            errors.append((str(e.value), e.value.function, e.value.index, m.steps,
                           [(f.fn.name, f.state, f.R) for f in m.stack]))
        assert errors[0] == errors[1], budget
        # (stepping back, or forwards from the last back edge before, where float
        # arithmetic rounds: at most a pass of the block and its calls, not the run)
        assert "step budget of" in errors[1][0] and sum(taken) < REPLAY, (budget, taken)


# a counted loop (r3 up to r0) whose passes call and uncall spin (a loop of 10 passes)
COUNTED_CALLS = SPIN + """
.func outer(r0, f0)
top:    CF.NE  r3, 0, back
        ADD    f3, 10.0
        CALL   spin, f2, f3, r2
        ADD    f0, f2
        UNCALL spin, f2, f3, r2
        SUB    f3, 10.0
        INC    r3
exitbr: BR.EQ  r3, r0, done
back:   JMP    top
done:   CF     exitbr
        SUB    r3, r0
.end
"""


@pytest.mark.parametrize("how", ["forward", "uncall", "grad"])
def test_an_exhausted_budget_in_a_counted_loops_callee_is_reported_from_native_code(
        how, monkeypatch):
    """A counted loop charges all its passes up front, so native code runs a loop that
    calls a function whose budget can run out midway as the general loop: the callee
    runs out where the interpreter's run does, and the loop's frame joins its record."""
    p = rvm.assemble(COUNTED_CALLS)
    # 100 passes of about 110 steps: the loop's own 800 fit every budget here, and it is
    # a counted loop in the machine code unless it calls such a function
    args = (100, 0.0) if how == "forward" else (100, 1000.0)
    for budget in [*range(1_000, 1_400, 7), 5_003]:
        errors = []
        for engine in ("interp", "native"):
            taken = steps_stepped(monkeypatch)
            m = Machine(p, engine=engine, max_steps=budget)
            m.enter("outer", *args, backward=how != "forward")
            if how == "grad":       # (f0's shadow seeded)
                m.set_grad(True)
                fn = m.stack[0].fn
                m.stack[0].G[fn.slot(fn.params[1])] = 1.0
            with pytest.raises(rvm.MachineError) as e:
                m.run()
            monkeypatch.undo()
            errors.append((str(e.value), e.value.function, e.value.index, m.steps,
                           [(f.fn.name, f.state, f.R, f.G) for f in m.stack]))
        assert errors[0] == errors[1], budget
        # (stepping back, or forwards from the back edge before where float arithmetic
        # rounds: at most a pass of the loop with its calls, about 110 steps)
        assert "step budget of" in errors[1][0] and sum(taken) < REPLAY, (budget, taken)


# a loop with float locals: f2 takes f0 in and out in every pass, f3 holds -0.0 throughout
SPIN_LOCALS = """\
.func spin(f0, f1, r0)
        NEG    f3
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        ADD    f2, f0
        MUL    f2, 2.0
        DIV    f2, 2.0
        SUB    f2, f0
        INC    r0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
        NEG    f3
.end
"""


def signed(values) -> list:
    """Values as text: -0.0 and 0.0 told apart."""
    return None if values is None else [repr(v) for v in values]


@pytest.mark.parametrize("how", ["forward", "grad"])
def test_an_exhausted_budget_with_float_locals_or_minus_zero_is_reported_from_native_code(
        how, monkeypatch):
    """A gradient pass of a function with float locals that runs out of steps after its
    last back edge (native code's record at the end holds the locals' shadows too), and
    a run out of steps where a register holds -0.0 (NEG of 0.0: the interpreter's value
    as well), are reported from native code's record, the interpreter stepping over only
    the steps past the budget; error, steps, registers (signs of zeros included) and
    shadows (a zero shadow's sign may differ: docs/engines.md) are the interpreter's."""
    p, n = rvm.assemble(SPIN_LOCALS), 100
    total = 9 * n + 2               # the steps of a whole pass either way
    for budget in [*range(total - 8, total), 500, 501, 502, 503, 504]:
        outcomes = []
        for engine in ("interp", "native"):
            m = Machine(p, engine="native", max_steps=10**9)
            m.enter("spin", 0.0, float(n), 0)
            if how == "grad":       # from the end state, backwards, f0's shadow seeded
                m.run(1)
                m.set_grad(True)
                m.clear_shadows()
                m.stack[0].G[m.stack[0].fn.n_int] = 1.0
            m.engine, m.max_steps = engine, budget
            taken = steps_stepped(monkeypatch)
            with pytest.raises(rvm.MachineError) as e:
                m.run(-1 if how == "grad" else 1)
            monkeypatch.undo()
            outcomes.append((str(e.value), e.value.function, e.value.index, m.steps,
                             [(f.fn.name, f.state, signed(f.R), f.G) for f in m.stack]))
        assert outcomes[0] == outcomes[1], budget
        assert "step budget of" in outcomes[1][0] and sum(taken) < REPLAY, (budget, taken)


# r1's cell holds -0.0, which f2 reads (ADDM) into a zero register: native code holds the
# cell as read (-0.0), the interpreter 0.0 + -0.0 = 0.0 (rvm.engines.compiled: _Known)
RAW_MINUS_ZERO = """\
.func spinz(f0, f1, r0)
        ADD    r4, 1
        ALLOC  r1, r4
        NEG    f5
        EXCH   f5, [r1]
        ADDM   f2, [r1]
        NEG    f3
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
        NEG    f3
        SUBM   f2, [r1]
        EXCH   f5, [r1]
        NEG    f5
        FREE   r1, r4
        SUB    r4, 1
.end
"""


def test_a_register_native_code_read_raw_from_a_minus_zero_cell_is_reported_from_its_record(
        monkeypatch):
    """Native code may hold a heap cell's -0.0 as it read it (the interpreter holds 0.0 +
    cell = 0.0): it makes such a register what the interpreter holds before a back edge,
    so a run out of steps is reported from its record (the interpreter stepping over
    only the steps past the budget), with the interpreter's registers, signs of zeros
    included."""
    p = rvm.assemble(RAW_MINUS_ZERO)
    # (budgets whose steps past them are INC, BR.GE, JMP: undone exactly, unlike ADD)
    for budget in (98, 99, 100, 103):
        outcomes = []
        for engine in ("interp", "native"):
            m = Machine(p, engine=engine, max_steps=budget)
            m.enter("spinz", 0.0, 1e6, 0)
            taken = steps_stepped(monkeypatch)
            with pytest.raises(rvm.MachineError) as e:
                m.run()
            monkeypatch.undo()
            outcomes.append((str(e.value), e.value.index, m.steps, signed(m.stack[0].R)))
        assert outcomes[0] == outcomes[1], budget
        assert outcomes[1][3][7] == "0.0"       # f2 (and f3 holds -0.0)
        assert sum(taken) < 20, (budget, taken)     # native: from the record


# failures that are not an exhausted budget, after many passes of a loop: a failed
# assertion after the loop or in a pass (forwards, backwards), a callee's failed check, a
# value not finite (a sum of exp(f0) past the largest float) that a comparison sees in
# the pass that made it
GROW = """\
.func grow(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 0.01
        INC    r0
        ADD.exp f2, f0
exitbr: BR.GE  f2, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""
FAILING = {
    "assert-after-loop": (SPIN.replace("done:   CF     exitbr",
                                       "done:   CF     exitbr\n        ASSERT.lt f0, 1e4"),
                          "spin", (0.0, 3e4, 0), False),
    "assert-in-a-pass": (SPIN.replace("        INC    r0", "        INC    r0\n"
                                      "        ASSERT.lt f0, 20000.5"), "spin",
                         (0.0, 3e4, 0), False),
    "assert-in-a-pass-backwards": (SPIN.replace("        INC    r0", "        INC    r0\n"
                                                "        ASSERT.gt f0, 10000.5"), "spin",
                                   (3e4, 3e4, 30000), True),
    "callee-check": (SPIN_CALLS.replace("        SUB    r2, r0\n",
                                        "        SUB    r2, r0\n        ASSERT.lt r0, 20001\n"),
                     "spin", (0.0, 3e4, 0), False),
    "not-finite": (GROW, "grow", (0.0, 1.7976931348623157e308, 0), False),
}


@pytest.mark.parametrize("case", list(FAILING))
def test_a_native_run_that_fails_is_replayed_from_its_last_back_edge(case, monkeypatch):
    """A native run that fails a check, or makes a value that is not finite, far into
    its run is reported as the interpreter reports it (error, instruction, steps,
    registers), the interpreter stepping only from the last back edge before the failure
    (native code runs again to stop there), not over the whole run."""
    text, name, args, backward = FAILING[case]
    p = rvm.assemble(text)
    outcomes = []
    for engine in ("interp", "native"):
        taken = steps_stepped(monkeypatch)
        m = Machine(p, engine=engine, max_steps=10**8)
        m.enter(name, *args, backward=backward)
        with pytest.raises(rvm.RvmError) as e:
            m.run()
        monkeypatch.undo()
        outcomes.append((type(e.value).__name__, str(e.value), e.value.function,
                         e.value.index, m.steps, [(f.fn.name, f.state, f.R) for f in m.stack]))
    assert outcomes[0] == outcomes[1]
    assert abs(outcomes[1][4]) > 10_000 and "step budget" not in outcomes[1][1]
    assert sum(taken) < REPLAY, taken


def test_a_value_not_finite_native_code_sees_passes_later_is_reported_as_the_interpreter_does(
        monkeypatch):
    """exp past 709 cancelled in the same pass (f2 holds nan until the function returns,
    where native code tests it at once): native code tests every float a pass wrote at the
    next back edge, so the run stops at the back edge after the value was made and leaves
    the registers of the look before it (a function that writes no heap cell keeps them),
    and the interpreter steps from there: one native run (no second run, no second
    build), not the whole run on the interpreter."""
    p = rvm.assemble(SPIN.replace("        INC    r0", "        INC    r0\n"
                                  "        ADD.exp f2, f0\n        SUB.exp f2, f0"))
    with pytest.MonkeyPatch.context() as mp:    # (reports undoes monkeypatch's)
        runs = builds_run(mp)
        outcomes, taken = reports(p, "spin", (0.0, 800.0, 0), monkeypatch)
    assert outcomes[0] == outcomes[1] and outcomes[1][3] == 7 * 709 + 3
    assert sum(taken) < REPLAY, taken
    assert runs == [False], runs


def reports(p, name: str, args: tuple, monkeypatch) -> tuple[list, list]:
    """A failing run's report (error, message, instruction, steps, every frame) on the
    interpreter and on native code, and the steps the interpreter took for the latter."""
    outcomes = []
    for engine in ("interp", "native"):
        taken = steps_stepped(monkeypatch)
        m = roomy(Machine(p, engine=engine, max_steps=10**9))
        m.enter(name, *args)
        with pytest.raises(rvm.RvmError) as e:
            m.run()
        monkeypatch.undo()
        outcomes.append((type(e.value).__name__, str(e.value), e.value.index, m.steps,
                         [(f.fn.name, f.state, f.R) for f in m.stack]))
    return outcomes, taken


def roomy(m: Machine) -> Machine:
    """m with a heap of room for a large KEPT case's cells (see writing: no native run
    that only finds the heap too small, then grows it)."""
    from rvm.engines.lowering import SNAP_CELLS
    m._grow(4 * SNAP_CELLS)
    return m


def each_run(mp, what) -> list:
    """Records what(build, machine) for each native run, through the monkeypatch context
    mp."""
    from rvm.engines.compiled import Compiled
    runs, real = [], Compiled.run

    def run(self, machine, direction):
        runs.append(what(self, machine))
        return real(self, machine, direction)
    mp.setattr(Compiled, "run", run)
    return runs


def builds_run(mp) -> list:
    """Records, for each native run, whether it was the build without counted loops
    (Compiled.strict), through the monkeypatch context mp."""
    return each_run(mp, lambda build, m: build.strict)


def writing(text: str, name: str, large: bool = False) -> str:
    """text with function `name` writing the heap (a PUSH and a POP of a zero register on
    entry): a function whose run writes a heap cell keeps a copy of its registers at its
    looks only in the root frame, with a snapshot of the heap (rvm.engines.lowering:
    Lowering.snapshot), where the heap has at most SNAP_CELLS cells; large: with twice
    that many allocated, it keeps none, and a failure in it is found by running native
    code again to the look before it."""
    from rvm.engines.lowering import SNAP_CELLS
    head = re.search(rf"(?m)^\.func {name}\(.*\n", text).group(0)
    body = head + "        PUSH   r15\n        POP    r15\n"
    if not large:
        return text.replace(head, body)
    n = 2 * SNAP_CELLS
    start = text.index(head)
    end = text.index(".end", start)
    return (text[:start] + body + f"        ALLOC  r14, {n}\n" + text[start + len(head):end] +
            f"        FREE   r14, {n}\n" + text[end:])


def variant(text: str, name: str, kept: str) -> str:
    """The program of a KEPT case: as it is (a function that writes no heap cell), or
    writing the heap (see writing)."""
    return text if kept == "kept" else writing(text, name, large=kept == "heap-large")


def runs_wanted(kept: str) -> list:
    """The native runs a failure of a KEPT case takes: one where the root frame keeps a
    copy of its registers (and of a small heap) at its looks, two where it does not."""
    return [False] if kept != "heap-large" else [False, False]


KEPT = pytest.mark.parametrize("kept", ["kept", "heap-written", "heap-large"])


def native_runs(p, name: str, args: tuple, max_steps: int) -> tuple[list, list, list]:
    """A failing run's report (message, instruction, steps, every frame's state and
    registers) on the interpreter and on native code, which native builds ran for the
    latter (True: the build without counted loops), and the steps the interpreter took."""
    runs, outcomes, taken = [], [], []
    for engine in ("interp", "native"):
        with pytest.MonkeyPatch.context() as mp:
            runs = builds_run(mp)
            taken = steps_stepped(mp)
            m = roomy(Machine(p, engine=engine, max_steps=max_steps))
            m.enter(name, *args)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        outcomes.append((str(e.value), e.value.index, m.steps,
                         [(f.fn.name, f.state, list(f.R)) for f in m.stack]))
    return outcomes, runs, taken


def test_a_batch_loop_whose_compile_was_interrupted_is_compiled_again(monkeypatch):
    # Ctrl-C during the batch loop's compile (here: the back end raising it once) must not
    # lose the loop: the next batch compiles it (it was dropped, and a KeyError traceback
    # followed)
    import attrs

    from rvm.engines.native import Functions
    v = rvm.vmap(attrs.evolve(rvm.assemble(SPIN), engine="native")["spin"])
    n = 4
    xs, zs = np.zeros(n), np.zeros(n, np.int64)
    real, hits = Functions.llvm, []

    def once(self, runs, fused, batches):
        if batches:
            hits.append(sorted(batches))
            if len(hits) == 1:
                raise KeyboardInterrupt
        return real(self, runs, fused, batches)
    monkeypatch.setattr(Functions, "llvm", once)
    with pytest.raises(KeyboardInterrupt):
        v(xs, np.full(n, 10.0), zs)
    assert list(v(xs, np.full(n, 10.0), zs)[2]) == [10] * n
    assert len(hits) == 2 and hits[0] == hits[1]        # the same loop, compiled again


# a counted loop (r3 up to r0) whose exp overflows (f2 = inf at pass ~709,800): native
# code tests a counted loop's floats after its last pass; with `head`, a loop with back
# edges runs first (10 passes), so a replay from its last back edge is millions of steps
# from the failure
COUNTED_EXP = FIB.replace(".func fib(r0, r1, r2)\n        ADD    r2, 1\n",
                          ".func cnt(r0, f0, f1)\n{head}\n").replace(
    "        ADD    r1, r2\n        SWAP   r1, r2\n",
    "        ADD    f0, 0.001\n        ADD.exp f2, f0\n")
HEAD = """\
h:      CF.NE  r4, 0, hb
        ADD    f1, 1.0
        INC    r4
hx:     BR.GE  f1, 10.0, hd
hb:     JMP    h
hd:     CF     hx
        SUB    f1, 10.0
        SUB    r4, 10"""


@KEPT
@pytest.mark.parametrize("head", ["", HEAD], ids=["alone", "after-a-loop"])
def test_a_failure_deep_in_a_counted_loop_is_replayed_near_it(head, kept, monkeypatch):
    """Native code runs a counted loop's passes in chunks of about 1,024 steps and looks
    at its floats after each: a value made not finite in the pass is found within a chunk
    of it, native code runs again to the look before it (the loop, short of budget for
    all its passes, runs as the general loop), and the interpreter steps from there: two
    native runs (it was the interpreter through the whole loop, millions of steps; then
    a build without counted loops, Compiled.strict; or, with no look before the loop,
    still that build)."""
    from rvm.engines.lowering import LOOK_EVERY
    text = COUNTED_EXP.format(head=head)
    p = rvm.assemble(variant(text, "cnt", kept))
    with pytest.MonkeyPatch.context() as mp:    # (reports undoes monkeypatch's)
        runs = builds_run(mp)
        outcomes, taken = reports(p, "cnt", (2_000_000, 0.0, 0.0), monkeypatch)
    assert outcomes[0] == outcomes[1] and outcomes[1][3] > 3_000_000
    assert runs == runs_wanted(kept), runs
    assert sum(taken) < 2 * LOOK_EVERY, taken


def test_a_far_failure_whose_general_run_fails_first_is_three_native_runs(
        monkeypatch, tmp_path):
    """Looks at a counted loop's floats far apart (about 390,000 steps here): the failure
    is far from the last look, native code runs again with a budget that ends just
    before it, the loop runs as the general loop and finds the value at its own look
    first, and native code runs a third time, to that look (whose budget left, counted
    from the second run's shorter budget, is the whole run's plus what was cut off: it
    was taken as the whole run's, and a build without counted loops ran instead)."""
    from rvm.engines import lowering
    # (a program of its own: no other test's code for it, on disk or in this process)
    p = rvm.assemble(COUNTED_EXP.format(head=HEAD.replace("10", "11")))
    with pytest.MonkeyPatch.context() as mp:    # (reports undoes monkeypatch's)
        mp.setenv("RVM_CACHE_DIR", str(tmp_path))
        mp.setattr(lowering, "LOOK_EVERY", 1 << 62)
        runs = builds_run(mp)
        outcomes, taken = reports(p, "cnt", (2_000_000, 0.0, 0.0), monkeypatch)
    assert outcomes[0] == outcomes[1] and outcomes[1][3] > 3_000_000
    assert runs == [False, False, False], runs
    assert sum(taken) < 2 * lowering.CLEAN_EVERY, taken


# counted loops that call a function without loops (which charges its own steps as it
# runs), or fail a check midway: {body} is the loop's, {callee} the function's
LOOP_CALLS = ".func g(f0, f1, r1)\n{callee}\n.end\n" + FIB.replace(
    ".func fib(r0, r1, r2)\n        ADD    r2, 1\n", ".func cnt(r0, r3, f0, f1, f2)\n").replace(
    "        ADD    r1, r2\n        SWAP   r1, r2\n", "        ADD    f0, 0.01\n{body}\n")
CALLS_CASES = {      # (loop body, callee, the budget or None, where the run fails)
    "nan made beside a call": ("        ADD.exp f2, f0\n        SUB.exp f2, f0\n"
                               "        CALL   g, f1, f2, r4", "        INC r1\n        DEC r1",
                               None, "math range error"),
    "exp overflows in the callee": ("        CALL   g, f0, f1, r4",
                                    "        ADD.exp f1, f0\n        SUB.exp f1, f0",
                                    None, "math range error"),
    "a check fails midway": ("        ASSERT.lt f0, 500.0\n        ADD.sin f2, f0", "",
                             None, "assertion"),
    "a check fails in a long callee": ("        CALL   g, f0, f1, r4", "\n".join(
        ["        ADD    f1, 1.0\n        ASSERT.lt f1, 300000.0"] * 64), None, "assertion"),
    "the budget runs out in a callee": ("        ADD.sin f2, f0\n        CALL   g, f1, f2, r4",
                                        "        INC r1\n        DEC r1", 600_000,
                                        "step budget"),
}


@KEPT
@pytest.mark.parametrize("case", CALLS_CASES)
def test_counted_loops_with_calls_or_checks_fail_in_one_or_two_native_runs(case, kept,
                                                                         monkeypatch):
    """A counted loop charges its own steps for every pass on entry, its callees charge
    theirs as they run: the look after a chunk of passes, and a failure's place in a
    chunk (in the loop or in a callee), are counted as the general loop counts them, and
    a budget too short for every pass and its callees' most steps runs the general loop.
    Each failure is then one native run where the function writes no heap cell or a
    small heap (the interpreter steps from the copy of the registers the last look kept,
    and of the heap) and two where its heap is large, or where the budget runs out (they
    were the whole pass on the interpreter, the build without counted loops, or three
    runs), and the report is the interpreter's."""
    from rvm.engines.lowering import LOOK_EVERY
    body, callee, budget, message = CALLS_CASES[case]
    text = LOOP_CALLS.format(body=body, callee=callee)
    p = rvm.assemble(variant(text, "cnt", kept))
    # (with a budget: passes whose own steps fit it, 8 each, and not with the callee's 2)
    n = 70_000 if budget else 2_000_000
    outcomes, runs, taken = native_runs(p, "cnt", (n, 0, 0.0, 0.0, 0.0), budget or 10**12)
    assert outcomes[0] == outcomes[1] and message in outcomes[1][0]
    assert outcomes[1][2] > 300_000
    if budget:      # (one run where the record tells the place, else two)
        assert runs in ([False], [False, False]), runs
    else:
        assert runs == runs_wanted(kept), runs
    assert sum(taken) < 4 * LOOK_EVERY, taken


def test_whether_native_code_has_counted_loops_is_known_without_writing_it():
    """The machine's way back to a failure depends on it; it was set while the code was
    written, so code found in the disk cache (a user's second process) had none."""
    from rvm.engines.compiled import compiled
    body, callee = CALLS_CASES["a check fails midway"][:2]
    c = compiled(rvm.assemble(LOOP_CALLS.format(body=body, callee=callee)), True,
                 native=True)
    assert c.counted and not c._bodies
    assert not compiled(rvm.assemble(SPIN), True, native=True).counted


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_run_given_a_value_that_is_not_finite_does_not_go_to_the_interpreter(
        value, monkeypatch):
    """Native code refuses a value that is not finite where it is compared or returned
    (it cannot tell one the program made from one it was given); a run given one, which
    the interpreter allows while nothing makes a new one from it, runs on the python
    engine (it was the whole run on the interpreter, after native code had failed)."""
    p = rvm.assemble(SPIN.replace(".func spin(f0, f1, r0)", ".func spin(f0, f1, r0, f2)"))
    outcomes = []
    for engine in ("interp", "native"):
        taken = steps_stepped(monkeypatch)
        m = Machine(p, engine=engine, max_steps=10**8)
        m.enter("spin", 0.0, 5e4, 0, value)
        m.run()
        monkeypatch.undo()
        outcomes.append([repr(v) for v in m.stack[0].R])
    assert outcomes[0] == outcomes[1] and outcomes[1][3] == repr(value)
    assert sum(taken) == 0, taken


# a counted loop, then float arithmetic after its last pass (no back edge after it)
TAIL = """\
.func cnt(r0, f2, f3, f4)
top:    CF.NE  r6, 0, back
        ADD    f2, 0.1
        ADD.sin f3, f2
        INC    r6
exitbr: BR.EQ  r6, r0, done
back:   JMP    top
done:   CF     exitbr
        SUB    r6, r0
        ADD    f4, 0.1
        NEG    f4
.end
"""


def test_a_budget_that_runs_out_after_a_counted_loop_past_rounding_steps_is_replayed_near_it(
        monkeypatch):
    """The budget runs out after the counted loop's last pass, past `ADD f4, 0.1`, which
    cannot be stepped back over exactly: native code replays from the last place where it
    found every float finite, which the function handed back on return (it was the whole
    run on the interpreter: 6 million steps)."""
    p = rvm.assemble(TAIL)
    n = 10**6
    m = Machine(p, engine="native", max_steps=10**9)
    m.enter("cnt", n, 0.0, 0.3, 0.0)
    m.run()
    total = 6 * n + 3              # (the interpreter takes 603 steps for n = 100)
    for budget in (total - 1, total - 2):
        outcomes = []
        for engine in ("interp", "native"):
            m = Machine(p, engine=engine, max_steps=budget)
            m.enter("cnt", n, 0.0, 0.3, 0.0)
            taken = steps_stepped(monkeypatch)
            with pytest.raises(rvm.MachineError) as e:
                m.run()
            monkeypatch.undo()
            outcomes.append((str(e.value), e.value.index, m.steps,
                             [(f.state, [float.hex(float(v)) if isinstance(v, float) else v
                                         for v in f.R]) for f in m.stack]))
        assert outcomes[0] == outcomes[1], budget
        assert "step budget" in outcomes[1][0] and sum(taken) < 100_000, (budget, taken)


# an array argument (the heap just large enough for it, before) and a sum of exp that
# overflows in a later pass
ARRAY_EXP = """\
.func k(r0, r1, r2, f0, f2, f3)
top:    CF.NE  r3, 0, back
        ADD    f1, f0
        SUB    f1, 2000.0
        ADD.exp f2, f1
        SUB    f1, f0
        ADD    f1, 2000.0
        ADD    f0, 1.0
        ADDM   r2, [r0 + r3]
        INC    r3
exitbr: BR.GE  f0, f3, done
back:   JMP    top
done:   CF     exitbr
.end
"""


@KEPT
def test_a_failing_run_with_array_arguments_is_one_or_two_native_runs(kept, monkeypatch):
    """The heap grows a little past the cells asked for, so native code's checkpoint
    records fit above a call's arrays: a run that fails leaves the copy of the registers
    its last look kept (the function only reads the heap), or, where it writes the
    heap, is run natively once more, to the back edge before the failure (it was twice
    more, the first to make room): a heap of 5,000 cells has a snapshot every 320,000
    steps, and the interpreter's steps from there would cost more than that run."""
    p = rvm.assemble(variant(ARRAY_EXP, "k", kept))
    a = np.arange(5000, dtype=np.int64)
    outcomes, runs = [], []
    for engine in ("interp", "native"):
        with pytest.MonkeyPatch.context() as mp:
            runs = builds_run(mp)
            m = roomy(Machine(p, engine=engine, max_steps=10**8))
            m.enter("k", a, 0, 0.0, 0.0, 3000.0)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        outcomes.append((str(e.value), e.value.index, m.steps))
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[1][0]
    assert runs == ([False] if kept == "kept" else [False, False]), runs


# each pass of a general loop runs a counted loop of 10,000 passes (40,000 steps, more
# than the replay's FAR), then adds exp(100 (f0 - 10)) to f2, which overflows in pass 18
INNER_COUNTED = """\
.func k(r1, r2, f0, f2, f3)
top:    CF.NE  r3, 0, back
        ADD    f0, 1.0
in:     CF.NE  r4, 0, inb
        ADD    r2, r4
        INC    r4
inx:    BR.EQ  r4, r1, ind
inb:    JMP    in
ind:    CF     inx
        SUB    r4, r1
        ADD    f1, f0
        SUB    f1, 10.0
        ADD.mul f5, f1, 100.0
        ADD.exp f2, f5
        SUB.mul f5, f1, 100.0
        ADD    f1, 10.0
        SUB    f1, f0
        INC    r3
exitbr: BR.GE  f0, f3, done
back:   JMP    top
done:   CF     exitbr
.end
"""


@KEPT
def test_a_failure_a_counted_loop_away_from_the_last_look_is_one_or_two_native_runs(
        kept, monkeypatch):
    """The last look at the float registers before the failure is a whole counted loop
    (40,000 steps) back: native code runs again with a budget that ends just before the
    failure, so that the counted loop, short of budget, runs as the general loop and
    stops there, and the interpreter steps the rest: two native runs, no second build
    (it was the interpreter over 65,536 steps, then the build without counted loops
    twice). Where the function writes no heap cell, or a small heap, the counted loop's
    looks keep a copy of the registers (and of the heap), the last in its last chunk,
    and the interpreter steps from it: one native run."""
    from rvm.engines.machine import GENERAL
    p = rvm.assemble(variant(INNER_COUNTED, "k", kept))
    outcomes, runs, taken = native_runs(p, "k", (10_000, 0, 0.0, 0.0, 100.0), 10**8)
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[1][0]
    assert outcomes[1][2] > 17 * 40_000
    assert runs == runs_wanted(kept), runs
    assert sum(taken) < GENERAL + 100, taken


# a loop that keeps a running sum of f0 in a heap cell (and, in `moving`, an ALLOC and
# FREE each pass, so the top moves too) and adds exp(f0 - 3000) to f2, which overflows
# 709 passes before the end; or that loop in a callee of a root without loops
HEAP_SUM = """\
.func {name}(f0, f1, f2, r0)
        ALLOC  r1, {cells}
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
{moving}        EXCH   f4, [r1 + 1]
        ADD    f4, f0
        EXCH   f4, [r1 + 1]
        ADD    f3, f0
        SUB    f3, {shift}
        ADD.exp f2, f3
        SUB    f3, f0
        ADD    f3, {shift}
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
        FREE   r1, {cells}
.end
"""
MOVING = "        ALLOC  r5, 2\n        EXCH   f0, [r5]\n        EXCH   f0, [r5]\n" \
    "        FREE   r5, 2\n"
CALLER = ".func sum(f0, f1, f2, r0)\n        CALL   inner, f0, f1, f2, r0\n.end\n"


@pytest.mark.parametrize("case", ["a cell", "a cell and the top", "a callee's cell"])
def test_a_failure_after_heap_writes_is_placed_with_the_heap_of_the_look_before(
        case, monkeypatch):
    """A function that writes the heap keeps, at the looks of the run's root frame, a copy
    of its registers and a snapshot of a small heap: a failure 709 passes on (every
    pass has changed a cell since, and moved the top) puts the machine at the last look
    with the heap as it was there, and the interpreter steps to the failure: one native
    run, and the interpreter's report (message, instruction, steps, every frame, the
    heap's top and cells). A looping function called from a root without loops is not
    the root: native code runs again to the look before the failure."""
    text = HEAP_SUM.format(name="inner" if "callee" in case else "sum",
                           moving=MOVING if "top" in case else "", cells=3, shift=3000.0)
    if "callee" in case:
        text = CALLER + text
    p = rvm.assemble(text)
    outcomes, runs, taken = [], [], []
    for engine in ("interp", "native"):
        with pytest.MonkeyPatch.context() as mp:
            runs = builds_run(mp)
            taken = steps_stepped(mp)
            m = Machine(p, engine=engine, max_steps=10**8)
            m.enter("sum", 0.0, 5000.0, 0.0, 0)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        outcomes.append((str(e.value), e.value.index, m.steps, m.snapshot()))
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[1][0]
    heap = np.frombuffer(outcomes[1][3][2], np.float64)
    assert heap[1] == sum(range(1, 3711)), heap       # (the sum to the failing pass)
    assert runs == ([False, False] if "callee" in case else [False]), runs
    assert sum(taken) < 4 * CLEAN_EVERY, taken


def budgets_run(mp) -> list:
    """Records, through the monkeypatch context mp, each native run's step budget."""
    return each_run(mp, lambda build, m: m.max_steps)


@pytest.mark.parametrize("grad", [False, True])
def test_a_failure_far_from_the_last_snapshot_resumes_native_code_from_it(grad,
                                                                          monkeypatch):
    """Snapshots of 1,024 cells come every 65,536 steps; the failure comes some 400,000
    steps in, further from the last than the interpreter steps: native code starts again
    from that look (its registers, its block, the heap of its snapshot), with a budget
    that ends just before the failure, and the interpreter steps the rest: the
    interpreter's report (message, instruction, steps, frames, heap), in plain and in
    gradient mode, from a second native run of at most a snapshot's spacing, not a
    second run of the whole pass from the start."""
    from rvm.engines import machine
    from rvm.engines.lowering import SNAP_SPACING
    p = rvm.assemble(HEAP_SUM.format(name="sum", moving="", cells=1024, shift=30000.0))
    outcomes = []
    for engine in ("interp", "native"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(machine, "RESUME_STEPS", 0)      # (a short run resumes too)
            budgets = budgets_run(mp)
            taken = steps_stepped(mp)
            m = Machine(p, engine=engine, max_steps=10**8, grad=grad)
            m.enter("sum", 0.0, 40000.0, 0.0, 0)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        outcomes.append((str(e.value), e.value.index, m.steps, m.snapshot()))
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[1][0]
    assert outcomes[1][2] > 390_000
    assert len(budgets) == 2 and budgets[0] == 10**8, budgets
    assert budgets[1] <= SNAP_SPACING * 1024 + 4 * CLEAN_EVERY, budgets
    assert sum(taken) < 4 * CLEAN_EVERY, taken


LOOP_FIRST = """\
.func sum(r1, r2, f0, f1, f2, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        EXCH   f4, [r1 + 1]
        ADD    f4, f0
        EXCH   f4, [r1 + 1]
        ADD    f3, f0
        SUB    f3, 30000.0
        ADD.exp f2, f3
        SUB    f3, f0
        ADD    f3, 30000.0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""


@pytest.mark.parametrize("resumed", ["resumed", "a resume that fails"])
def test_a_root_that_starts_with_its_loop_resumes_from_its_look(resumed, monkeypatch):
    """A root function whose first instruction is its loop's conditional come-from (a
    Python `while` at the top of a function), writing an array argument's cells: native
    code started again at the look must not test that come-from on the look's
    registers (they make it true: the resumed run failed at once, and the pass went to
    the interpreter, 1,000 times as long); it is entered with the registers of the
    failed run's entry. A resume that fails leaves the failed run's state for the way
    taken then (a second native run to the last back edge): in neither case does the
    interpreter step more than a few hundred steps."""
    from rvm.engines import machine
    p = rvm.assemble(LOOP_FIRST)
    outcomes = []
    for engine in ("interp", "native"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(machine, "RESUME_STEPS", 0)      # (a short run resumes too)
            if resumed != "resumed":        # (a block that is none: the resumed run
                def failing(m, record, now, direction, real=Machine._resumable):
                    out = real(m, record, now, direction)       # (fails at its end)
                    if out is not None:
                        out[1][0] = 10**6
                    return out
                mp.setattr(Machine, "_resumable", failing)
            budgets = budgets_run(mp)
            taken = steps_stepped(mp)
            m = Machine(p, engine=engine, max_steps=10**8)
            m.enter("sum", np.zeros(1000), 0.0, 40000.0, 0.0, 0)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        outcomes.append((str(e.value), e.value.index, m.steps, m.snapshot()))
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[1][0]
    assert sum(taken) < 4 * CLEAN_EVERY, taken
    if resumed == "resumed":
        assert len(budgets) == 2 and budgets[1] < 10**6, budgets
    else:
        assert len(budgets) == 3 and budgets[2] > 3 * 10**5, budgets


def test_only_a_long_failing_run_makes_the_build_that_resumes(monkeypatch):
    """The usual native code has no second way into the root's block loop (it cost a
    loop 4-5%): native code that starts at a look is a build of its own, compiled where
    a failed run took RESUME_STEPS steps or more (a shorter run's second run costs less
    than a compile), and used from then on. Both report what native code running the
    pass again reports (the interpreter's report: see above)."""
    from rvm.engines import machine

    def made(p) -> bool:        # (native code of the build that resumes)
        build = p.cache.get(("compiled", True, True, "resume"))
        return build is not None and any(map(len, build._native.values()))

    def report(p, shift, resume=True):
        with pytest.MonkeyPatch.context() as mp:
            if not resume:
                mp.setattr(Machine, "_resumable", lambda m, record, now, direction: None)
            builds = each_run(mp, lambda build, m: build.resume)
            m = Machine(p, engine="native", max_steps=10**10)
            m.enter("sum", 0.0, 2 * shift, 0.0, 0)
            with pytest.raises(rvm.RvmError) as e:
                m.run()
        return (str(e.value), e.value.index, m.steps, m.snapshot()), builds

    short = rvm.assemble(HEAP_SUM.format(name="sum", moving="", cells=4096, shift=30000.0))
    outcome, builds = report(short, 30000.0)
    assert builds == [False, False] and not made(short), builds
    assert outcome == report(short, 30000.0, resume=False)[0]
    passes = machine.RESUME_STEPS // 10             # (about 14 steps a pass)
    long = rvm.assemble(HEAP_SUM.format(name="sum", moving="", cells=1024,
                                        shift=float(passes)))
    outcome, builds = report(long, float(passes))
    assert builds == [False, True] and made(long), builds
    assert outcome == report(long, float(passes), resume=False)[0]


def call_tree(depth: int, loop: str = "") -> str:
    """t{depth} calls t{depth-1} twice ... down to t0, which adds and subtracts sin(f0):
    about 3 * 2^depth steps and no loop; `top` calls t{depth} when r0 == 7 (a branch);
    `loop` (if given: "general" or "counted") adds a function `many` that calls top r1
    times in such a loop."""
    text = ".func t0(f0, f1)\n        ADD.sin  f1, f0\n        SUB.sin  f1, f0\n.end\n"
    for k in range(1, depth + 1):
        text += f".func t{k}(f0, f1)\n" + f"        CALL     t{k - 1}, f0, f1\n" * 2 + ".end\n"
    text += textwrap.dedent(f"""\
        .func top(r0, f0, f1)
        if:     BR.NE    r0, 7, else
                CALL     t{depth}, f0, f1
                ADD      f1, f0
        then:   JMP      fi
        else:   CF       if
        fi:     CF.EQ    r0, 7, then
        .end
        """)
    if loop == "counted":
        text += textwrap.dedent("""\
            .func many(r0, r1, f0, f1)
                    ADD      r2, r1
            for:    BR.GE    0, r2, skip
            top:    CF.NE    r3, 0, again
                    CALL     top, r0, f0, f1
                    ADD      r3, 1
            again:  BR.LT    r3, r2, top
                    SUB      r3, r2
            skip:   CF.GE    0, r2, for
                    SUB      r2, r1
            .end
            """)
    elif loop == "general":       # (f2 counts the passes: a float, not a counted loop)
        text += textwrap.dedent("""\
            .func many(r0, r1, f0, f1)
                    ADD      f3, r1
            top:    CF.NE    f2, 0.0, again
                    CALL     top, r0, f0, f1
                    ADD      f2, 1.0
            again:  BR.LT    f2, f3, top
                    SUB      f2, f3
                    SUB      f3, r1
            .end
            """)
    return text


TREE_RUNS = {       # (depth, loop, entry, arguments)
    "alone": (16, "", "top", (7, 0.3, 0.2)),
    "in a loop": (11, "general", "many", (7, 12, 0.3, 0.2)),
    "in a counted loop": (11, "counted", "many", (7, 12, 0.3, 0.2)),
}


@pytest.mark.parametrize("case", TREE_RUNS)
def test_a_tree_of_calls_without_loops_stops_where_its_budget_runs_out(case, monkeypatch):
    """A function without loops tests nothing but the step budget at its end, which
    native code leaves to its caller: a tree of such calls ran whole before its budget
    was looked at (2^40 steps: a hang), and a failure went to the interpreter from the
    start. Native code now tests the budget before its calls, stops a few steps before
    the budget ends and leaves its frames there: one native run, the interpreter's steps
    from that stop, the interpreter's report (and a budget that holds, however close,
    runs to the end)."""
    from rvm.engines.compiled import TESTED_ABOVE
    depth, loop, entry, args = TREE_RUNS[case]
    p = rvm.assemble(call_tree(depth, loop))
    total = Machine(p, engine="interp", max_steps=10**9)
    total.enter(entry, *args)
    length = total.run()
    for budget in (1, 2, 3, 5, 100, 1_000, 4_097, 12_345, 50_001, length // 2 + 1,
                   length - 2, length - 1):
        outcomes, runs, taken = native_runs(p, entry, args, budget)
        assert outcomes[0] == outcomes[1], (budget, outcomes)
        assert runs == [False] and sum(taken) < 2 * TESTED_ABOVE, (budget, runs, taken)
    for budget in (length, length + 1, length + 7):
        assert p.call(entry, *args, engine="native", max_steps=budget) == \
            p.call(entry, *args, engine="interp", max_steps=budget)


@pytest.mark.parametrize("how", ["back", "grad"])
def test_a_tree_of_calls_without_loops_stops_at_its_budget_backwards(how, monkeypatch):
    """The same, run backwards after a forward run, plainly and in a gradient pass: the
    frames, registers and shadows the interpreter stops with, the interpreter stepping
    only from native code's stop."""
    from rvm.engines.compiled import TESTED_ABOVE
    p = rvm.assemble(call_tree(14))
    states = []
    for engine in ("interp", "native"):
        taken = steps_stepped(monkeypatch)
        for budget in (3, 777, 4_097, 30_001):
            m = Machine(p, engine=engine, max_steps=10**9)
            m.enter("top", 7, 0.3, 0.2)
            m.run()
            m.engine, m.max_steps = engine, budget
            if how == "grad":
                m.set_grad(True)
                m.clear_shadows()
                m.stack[0].G[2] = 1.0
            with pytest.raises(rvm.MachineError, match="step budget") as e:
                m.run(-1)
            states.append((budget, str(e.value), [(f.fn.name, f.state, f.R, f.G)
                                                  for f in m.stack]))
        monkeypatch.undo()
    assert states[:4] == states[4:]
    assert sum(taken) < 4 * TESTED_ABOVE, taken


def test_a_tree_of_calls_of_2_to_the_60_steps_stops_at_its_budget():
    """The run that hung: a budget of a million steps in a tree of 2^61 calls stops
    (each engine, the CLI's exit code 1 and its message)."""
    code = textwrap.dedent(f"""\
        import sys, rvm
        p = rvm.assemble({call_tree(60)!r})
        for engine in ("native", "interp"):
            try:
                p.call("top", 7, 0.3, 0.2, engine=engine, max_steps=10**6)
            except rvm.MachineError as e:
                print(engine, e.function, e.index, "step budget" in str(e))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split("\n")
    assert lines[0].split()[1:] == lines[1].split()[1:] and lines[0].endswith("True"), lines


OVERFLOWING_GRADIENT = '''
from rvm import reversible

@reversible
def f(x: float, c: float, d: float, n: int, out: float):
    out += x * c
    out += x * c
    for i in range(n):
        out += x * d
'''


@pytest.mark.parametrize("c,d", [(1e308, 0.5), (1.0, 1e304)], ids=["after", "in-the-loop"])
def test_a_gradient_that_overflows_late_in_a_long_pass_is_found_without_the_interpreter(
        c, d, tmp_path, monkeypatch):
    """Native code does not test shadows inside a gradient pass; where the gradients it
    returns are not finite, the place a shadow stopped being finite was found by the
    interpreter stepping the whole pass again (13 s for a pass native code runs in
    1 ms). Native code notes its last look at a loop's shadows before one found them
    not finite, and a native run to that look puts the machine there: the same error,
    and the interpreter steps only from there."""
    from rvm.engines.lowering import SEARCH_EVERY
    (tmp_path / "f.py").write_text(OVERFLOWING_GRADIENT)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = []
    for engine in ("interp", "native"):
        g = rvm.grad(f, loss="out", engine=engine)
        assert g(1e-300, 1.0, 0.5, 10, 0.0)[0] == 7.0
        taken = steps_stepped(monkeypatch)
        runs: list = []
        monkeypatch.setattr(Compiled, "run", lambda c, m, d, real=Compiled.run, runs=runs:
                            runs.append(d) or real(c, m, d))
        with pytest.raises(rvm.InvertibilityError) as e:
            g(1e-300, c, d, 50_000, 0.0)
        monkeypatch.undo()
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "`x` is inf: not finite" in errors[1][0]
    assert "stopped being finite in the gradient of `x` at ADD.mul" in errors[1][0]
    assert (errors[1][2] == 0) == (c > 1.0)     # (the first product, or in the loop)
    # the search's gradient pass (from the values the failing call's forward pass ended
    # with: not the forward pass again) stops at its first look that finds a shadow not
    # finite, leaving the look before it (every SEARCH_EVERY steps): one native run,
    # and the interpreter's steps from there are a few (they were some 260, from the
    # failing call's own last look, every CLEAN_EVERY steps, or a counted loop's chunk)
    assert sum(taken) < 4 * SEARCH_EVERY, sum(taken)
    assert runs == [-1], runs


def test_the_failing_runs_benchmark_runs(tmp_path):
    """tools/bench_failing.py, on a short loop: every row, each failing run the error."""
    out = subprocess.run([sys.executable, "tools/bench_failing.py", "200000"],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "RVM_CACHE_DIR": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if "failing" in line]
    assert [r.split("|")[1].strip() for r in rows] == [
        "general", "counted", "general, a heap cell written", "general, 4,096 cells",
        "general, 131,072 cells", "gradient", "gradient, an array",
        "gradient, an array of 100,000 cells"]
    assert out.stdout.count("math range error") == 5 and "`x` is inf: not finite" in out.stdout
    assert out.stdout.count("`x` has inf or nan elements: not finite") == 2


@pytest.mark.parametrize("case", CALLS_CASES)
def test_a_failure_in_a_runs_first_steps_builds_no_second_program(case):
    """A budget of a few steps, or a check failing in the first pass, on a program with
    counted loops: no back edge was passed, so the machine took the build without
    counted loops (a second compile, 0.15 s, for a failure the interpreter reaches in a
    few steps); with a budget of at most a few thousand steps the interpreter runs the
    pass."""
    body, callee = CALLS_CASES[case][:2]
    p = rvm.assemble(LOOP_CALLS.format(body=body, callee=callee))
    for n, budget in ((1, 1), (2, 2), (3, 5), (2, 9)):
        args = (n, 0, 600.0 if "check" in case else 0.0, 0.0, 0.0)
        outcomes, runs, taken = native_runs(p, "cnt", args, budget)
        assert outcomes[0] == outcomes[1] and runs == [False], (n, budget, runs)
        assert sum(taken) <= budget + 20, (n, budget, taken)


RESIDUE_ROOT = call_tree(12).split(".func top")[0] + """
.func root(r0, f0, f1)
        ADD      f3, 0.1
        ADD      f3, 0.2
        SUB      f3, 0.3
        CALL     t12, f0, f1
        ADD.sin  f1, f3
        CALL     t12, f0, f1
.end
"""


def test_a_root_locals_residue_is_cleared_at_the_end_so_every_engine_runs_back_alike():
    """0.1 + 0.2 - 0.3 leaves 5.6e-17 in a local (within tol). The interpreter kept it in
    the root frame at the end of a run, where compiled code starts every pass at zero:
    a run back (here stopped by its budget after a few steps, inside the tree) differed
    in that register between engines. It is cleared at the end, as leaving a frame
    clears it."""
    p = rvm.assemble(RESIDUE_ROOT)
    states = []
    for engine in ("interp", "native"):
        for budget in (1, 2, 3, 20, 5_000):
            m = Machine(p, engine="interp", max_steps=10**9)
            m.enter("root", 7, 0.3, 0.2)
            m.run()
            assert m.stack[0].R[m.stack[0].fn.n_int + 3] == 0.0
            m.engine, m.max_steps = engine, budget
            with pytest.raises(rvm.MachineError, match="step budget"):
                m.run(-1)
            states.append([(f.fn.name, f.state, list(f.R)) for f in m.stack])
    assert states[:5] == states[5:]


def test_a_function_of_many_small_calls_tests_its_budget_every_thousand_steps():
    """A function without loops of 2,000 calls of a 2-step function tested the budget
    before every call: a branch and a block each, and LLVM took 14.5 s to compile it
    (4.3 s before the tests). It tests before calls about SPAN steps apart."""
    from rvm.engines.compiled import SPAN, compiled
    k = 2_000
    text = ".func leaf(f0, f1)\n        ADD.mul f1, f0, f0\n        SUB.sin f1, f0\n.end\n"
    text += ".func big(f0, f1)\n" + "        CALL leaf, f0, f1\n        ADD f1, 0.25\n" * k
    text += ".end\n"
    p = rvm.assemble(text)
    c = compiled(p, True, native=True)
    assert c.tested("big")
    tests = c.native_text([c.name("big", "fw")]).count("_stop_before(")
    assert 5 * k // SPAN <= tests <= 2 * 5 * k // SPAN + 2, tests
    for budget in (3, 4_001, 9_999):
        outcomes, runs, taken = native_runs(p, "big", (0.5, 0.0), budget)
        assert outcomes[0] == outcomes[1] and runs == [False], budget
        assert sum(taken) <= SPAN + 10, (budget, taken)


def test_a_loop_whose_pass_is_long_calls_stops_at_the_call_where_its_budget_runs_out():
    """A general loop whose pass calls a function of 1,500 straight steps 20 times tested
    its budget only at its back edge, 30,000 steps on: a budget ending midway went to
    the interpreter for much of a pass (190,000 steps in a reviewer's case). Calls of a
    function without loops that many steps apart are budget tests in a loop too."""
    from rvm.engines.compiled import SPAN
    ops = ["ADD.mul f1, f0, f0", "SUB.sin f1, f0", "ADD f1, 0.25"]
    text = ".func C(f0, f1)\n" + "".join(f"        {ops[k % 3]}\n" for k in range(1500))
    text += ".end\n.func many(f0, f1, f2)\n        ADD f3, f2\ntop:    CF.NE f4, 0.0, again\n"
    text += "        CALL C, f0, f1\n" * 20 + "        ADD f4, 1.0\n"
    text += "again:  BR.LT f4, f3, top\n        SUB f4, f3\n        SUB f3, f2\n.end\n"
    p = rvm.assemble(text)
    for budget in (45_678, 150_001, 200_000):
        outcomes, runs, taken = native_runs(p, "many", (0.5, 0.0, 10.0), budget)
        assert outcomes[0] == outcomes[1] and runs == [False], (budget, runs)
        assert sum(taken) < 1_500 + SPAN + 10, (budget, taken)


ARRAY_GRADIENT = OVERFLOWING_GRADIENT.replace("from rvm import reversible",
                                              "from rvm import Array, reversible").replace(
    "x: float", "x: Array[float]").replace("x * ", "x[0] * ")


def gradient_errors(f, args, engines=("interp", "native")) -> list:
    """The error rvm.grad(f, loss="out") raises for args on each engine: (message,
    function, instruction), each engine given its own copy of the arrays."""
    errors = []
    for engine in engines:
        with pytest.raises(rvm.InvertibilityError) as e:
            rvm.grad(f, loss="out", engine=engine)(
                *[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        errors.append((str(e.value), e.value.function, e.value.index))
    return errors


def test_a_gradient_of_an_array_program_that_overflows_in_a_loop_is_the_interpreters(
        tmp_path):
    """Midway through a gradient pass, native code's shadow of a register that read a
    heap cell may stand apart from the interpreter's (it sets it to zero where the cell
    is read again): a search on the usual build's states named another instruction (a
    reviewer's case). A short pass is searched by the interpreter alone."""
    (tmp_path / "f.py").write_text(ARRAY_GRADIENT)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = gradient_errors(f, (np.array([1e-300, 1e-300]), 1.0, 1.797693e308 / 900,
                                 1000, 0.0), ("interp", "native", "python"))
    assert errors[0] == errors[1] == errors[2], errors
    # (x[0] is read into a temporary whose shadow is cleared before each statement's
    # read, ZERO: the sum that overflows is the cell's, x's gradient)
    assert "in the gradient of a heap cell at ADDM" in errors[0][0]


@pytest.mark.parametrize("c,d", [(1e308, 0.5), (1.0, 1.797693e308 / 19_950)],
                         ids=["after", "in-the-loop"])
def test_a_gradient_of_an_array_program_that_overflows_late_in_a_long_pass_is_found_natively(
        c, d, tmp_path, monkeypatch):
    """A long pass of a program with a heap was searched by the interpreter stepping the
    whole pass (minutes for millions of passes). It is searched on native code that
    looks at the shadows (Compiled.looks): the interpreter's error, and the interpreter
    steps only from the last look before it."""
    from rvm.ad.gradient import INTERPRETED, SEARCHED
    (tmp_path / "f.py").write_text(ARRAY_GRADIENT)
    f = rvm.load(tmp_path / "f.py")["f"]
    x, n = np.array([1e-300, 1e-300]), 20_000
    assert 8 * n > INTERPRETED          # (its passes' steps)
    errors, builds = [], []
    for engine in ("interp", "native"):
        g = rvm.grad(f, loss="out", engine=engine)
        assert g(x, 1.0, 0.5, 10, 0.0)[0][0] == 7.0
        taken = steps_stepped(monkeypatch)
        runs: list = []
        monkeypatch.setattr(Compiled, "run", lambda c, m, d, real=Compiled.run, runs=runs:
                            runs.append(c.looks) or real(c, m, d))
        with pytest.raises(rvm.InvertibilityError) as e:
            g(x, c, d, n, 0.0)
        monkeypatch.undo()
        builds.append(runs)
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1], errors
    assert "`x` has inf or nan elements: not finite" in errors[1][0]
    assert "stopped being finite in the gradient of a heap cell at ADDM" in errors[1][0]
    assert (errors[1][2] == 2) == (c > 1.0)     # (the first product, or in the loop)
    assert sum(taken) < 3 * SEARCHED, sum(taken)    # (not the pass's 160,000 steps)
    assert True in builds[1], builds[1]     # (the looking build's gradient passes)


ARRAY_STATEMENTS_GRADIENT = '''
import numpy as np
from rvm import Array, reversible

@reversible
def f(A: Array[float, 2], x: Array[float], y: Array[float], n: int, s: float, out: float):
    for i in range(n):
        y += A @ x
        s += np.sum(x)
        out += y[0] * 10.0
'''


def test_an_array_instructions_failing_gradient_check_is_found_where_the_interpreter_makes_it(
        tmp_path):
    """An array instruction's gradient that would not be finite is an error the
    interpreter raises where it is made; native code does not test it, and a budgeted
    native run of the search, stopped past it, had the interpreter make the test late, at
    a later instruction, and raised that (a reviewer's case): such a run counts as one
    past the failure, and the walk raises it where the interpreter does."""
    (tmp_path / "f.py").write_text(ARRAY_STATEMENTS_GRADIENT)
    f = rvm.load(tmp_path / "f.py")["f"]
    args = (np.full((2, 3), 2e300), np.full(3, 1e-300), np.zeros(2), 6000, 1.0, 0.0)
    errors = gradient_errors(f, args)
    assert errors[0] == errors[1], errors
    assert "the gradient of x[0] would become inf" in errors[0][0]


def test_a_short_pass_over_a_large_heap_is_searched_without_testing_every_cell_each_step(
        tmp_path, monkeypatch):
    """The interpreter's walk tests the cells a heap instruction may have changed: the
    one its memory operand names where the heap is large (every cell after every step
    took minutes for a heap of millions of cells)."""
    (tmp_path / "f.py").write_text(ARRAY_GRADIENT)
    f = rvm.load(tmp_path / "f.py")["f"]
    x = np.full(100_000, 1e-300)
    errors = []
    for engine in ("interp", "native"):
        tested: list = []
        monkeypatch.setattr(np, "isfinite", lambda a, *r, real=np.isfinite, tested=tested,
                            **k: tested.append(np.size(a)) or real(a, *r, **k))
        with pytest.raises(rvm.InvertibilityError) as e:
            rvm.grad(f, loss="out", engine=engine)(x.copy(), 1e308, 0.5, 2000, 0.0)
        monkeypatch.undo()
        errors.append((str(e.value), e.value.function, e.value.index))
        assert sum(n >= x.size for n in tested) < 10, engine
    assert errors[0] == errors[1], errors
    assert "stopped being finite in the gradient of a heap cell at ADDM" in errors[0][0]


UNCALLED = '''
from rvm import Array, reversible

@reversible
def h(a: float, b: float):
    b += a * 2.0

@reversible
def f(x: Array[float], out: float):
    out += x[0] * 1e308
    out += x[0] * 1e308
    ~h(x[0], out)
'''


@pytest.mark.parametrize("heap", [True, False], ids=["array", "scalar"])
def test_the_search_steps_over_the_end_of_a_function_run_by_uncall(heap, tmp_path):
    """The walk of the search for a shadow that stopped being finite passes the end of a
    function that UNCALL ran, whose frame then stands past its last instruction: an
    IndexError there (a reviewer's case); the same error on every engine."""
    text = UNCALLED if heap else UNCALLED.replace("x: Array[float]", "x: float").replace(
        "x[0]", "x").replace("Array, ", "")
    (tmp_path / "f.py").write_text(text)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = gradient_errors(f, (np.array([1e-300]) if heap else 1e-300, 0.0),
                             ("interp", "python", "native"))
    assert errors[0] == errors[1] == errors[2], errors
    assert "not finite; it stopped being finite in the gradient of" in errors[0][0]


SCALED = '''
from rvm import Array, reversible

@reversible
def f(x: Array[float], c: float, n: int, out: float):
    x *= c
    out += x[0] * 2.0
    for i in range(n):
        out += x[1] * 0.5
'''


def test_a_step_that_fails_midway_is_reported_as_stepping_reports_it(tmp_path):
    """An array instruction's gradient step may change cells before it fails (VMUL's
    scales the array back, then finds its factor's gradient not finite): the search's
    walk ran such a step again to report it, and reported the second run's failure (a
    reviewer's case). Walking and stepping fail alike and leave the same state."""
    (tmp_path / "f.py").write_text(SCALED)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = gradient_errors(f, (np.array([1.5e308, 1.0]), 0.5, 10, 0.0),
                             ("interp", "python", "native"))
    assert errors[0] == errors[1] == errors[2], errors
    assert "the factor's gradient would become inf" in errors[0][0]
    ends = []
    for how in ("walk", "move"):
        m = Machine(f.program, engine="interp")
        m.enter("f", np.array([1.5e308, 1.0]), 0.5, 10, 0.0)
        m.run(1)
        m.set_grad(True)
        m.clear_shadows()
        fr = m.stack[0]
        fr.G[fr.fn.slot(fr.fn.params[-1])] = 1.0
        with pytest.raises(rvm.InvertibilityError) as e:
            if how == "walk":
                m.walk(-1, 10**6, lambda fr, i: False)
            else:
                m._move(-1, 10**6)
        ends.append((str(e.value), m.steps, [(g.state, list(g.R), list(g.G))
                                             for g in m.stack],
                     list(m.hf[:m.top]), list(m.hg[:m.top])))
    assert ends[0] == ends[1]


TRANSIENT = '''
from rvm import Array, reversible, ancilla

@reversible
def g(out: float, big: float):
    with ancilla(t=0.0):
        t += 1e-300
        out += t * big
        out += t * big
        t -= 1e-300

@reversible
def f(x: Array[float], c: float, big: float, n: int, m: int, out: float):
    out += x[0] * c
    out += x[0] * c
    for i in range(n):
        out += x[1] * 0.5
    g(out, big)
    for i in range(m):
        out += x[1] * 0.5
'''


@pytest.mark.parametrize("heap", [True, False], ids=["array", "scalar"])
@pytest.mark.parametrize("call", ["g(out, big)", "~g(out, big)"], ids=["call", "uncall"])
def test_a_shadow_that_overflows_in_a_callee_and_is_dropped_is_found_first(call, heap,
                                                                          tmp_path):
    """A callee's ancilla whose shadow overflows harmlessly is dropped (where its block
    ends, or when the callee returns): the interpreter's walk names it first, and the
    native search, whose looks and bisection saw only the later overflow, named that
    one (reviewers' cases). The build that searches looks at the shadows where one is
    dropped and where a function returns, and a look that found one not finite counts
    from there on."""
    text = TRANSIENT.replace("    g(out, big)", f"    {call}")
    x: tuple = (np.array([1e-300, 1e-300]),)
    if not heap:
        text = text.replace("x: Array[float]", "x0: float, x1: float").replace(
            "x[0]", "x0").replace("x[1]", "x1").replace("Array, ", "")
        x = (1e-300, 1e-300)
    (tmp_path / "f.py").write_text(text)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = gradient_errors(f, (*x, 1e308, 1e308, 20_000, 10, 0.0))
    assert errors[0] == errors[1], errors
    assert errors[0][1] == "g" and "in the gradient of `t`" in errors[0][0]


ANCILLA_READS = '''
from rvm import Array, reversible

@reversible
def f(x: Array[float], c: float, d: float, n: int, out: float):
    out += x[0] * c
    for i in range(n):
        out += x[i % 2] * d
        out += x[1] * x[0]
'''



@pytest.mark.parametrize("which", ["ancilla-reads", "reused-register"])
@pytest.mark.parametrize("looks", [False, True])
def test_a_native_gradient_pass_stops_in_the_interpreters_state(tmp_path, which, looks):
    """Where a budget stops a gradient pass midway, native code (the usual build, and the
    one that looks at shadows, which the search for a shadow that stopped being finite
    runs) leaves every register, shadow and cell as the interpreter does, also the
    shadow of a register that holds zero when a value is put into it (native code once
    set that one to zero; the interpreter pulls it back)."""
    from rvm.engines.compiled import compiled
    if which == "ancilla-reads":
        (tmp_path / "f.py").write_text(ANCILLA_READS)
        p = rvm.load(tmp_path / "f.py")["f"].program
        args, budgets = (np.array([0.3, 0.7]), 1.5, 0.25, 40, 0.0), \
            [*range(1, 60), *range(60, 330, 7)]
    else:
        p, args, budgets = rvm.assemble(REUSED), (1.413, -1.014, 0.0), range(1, 9)

    def stopped(engine: str, budget: int) -> tuple:
        m = Machine(p, engine=engine, max_steps=10**8)
        m.enter("f", *args)
        m.run(1)
        m.set_grad(True)
        m.clear_shadows()
        fr = m.stack[0]
        fr.G[fr.fn.slot(fr.fn.params[-1])] = 1.0
        if engine == "native":
            m._compiled = compiled(p, m.checks, native=True, looks=looks)
            m._compiled_functions = None
        m.max_steps = budget
        with pytest.raises(rvm.MachineError, match="step budget"):
            m.run(-1)
        return ([(f.fn.name, f.state, list(f.R), list(f.G)) for f in m.stack],
                list(m.hf[:m.top]), list(m.hg[:m.top]))
    for budget in budgets:
        assert stopped("native", budget) == stopped("interp", budget), budget


def test_stepping_to_the_end_clears_the_roots_residue_as_running_does():
    p = rvm.assemble(RESIDUE_ROOT)
    ends = []
    for how in ("run", "step"):
        m = Machine(p, engine="interp", max_steps=10**9)
        m.enter("root", 7, 0.3, 0.2)
        if how == "run":
            m.run()
        else:
            while m.step():
                pass
        ends.append(list(m.stack[0].R))
    assert ends[0] == ends[1] and ends[0][m.stack[0].fn.n_int + 3] == 0.0


# exp overflows and is cancelled in the same pair (inf - inf: nan), and the register is
# written again from +0.0 (as native code knows it) before anything looks at it
CANCELS = """\
.func inner(f0, f1, r1)
top:    CF.NE  r2, 0, back
        ADD    f4, f0
        INC    r2
        ADD.exp f3, f4
        SUB.exp f3, f4
exitbr: BR.GE  r2, 100, done
back:   JMP    top
done:   CF     exitbr
        SUB.mul f4, f0, r2
        SUB    r2, 100
.end
"""
LOST = {
    "straight": (".func f(f0)\n    ADD.exp f1, f0\n    SUB.exp f1, f0\n    ADD f1, 1.0\n"
                 "    SUB f1, 1.0\n.end\n", "f", (800.0,), False),
    "a loop run backwards": (CANCELS, "inner", (7.5, 0.0, 0), True),
    "an uncalled callee in a loop": ("""\
.func outer(f0, f1, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 0.5
        INC    r0
        UNCALL inner, f0, f1, r0
exitbr: BR.GE  f0, 1e9, done
back:   JMP    top
done:   CF     exitbr
.end
""" + CANCELS, "outer", (0.0, 0.0, 0), False),
}


@pytest.mark.parametrize("case", LOST)
def test_a_nan_from_a_cancelled_overflow_is_not_overwritten_unseen(case):
    """Native code writes `d = 0.0 + e` where it knows d holds +0.0, and knew so after
    `d = e - e`, which is nan where e overflowed: the nan was overwritten unseen, and a run
    the interpreter refuses (math range error) ended without an error (or, in a loop,
    failed 10^6 steps later, at another pass). Native code now tests such a register
    before writing it; the report is the interpreter's."""
    text, name, args, backward = LOST[case]
    p = rvm.assemble(text)
    outcomes = []
    for engine in ("interp", "native"):
        m = Machine(p, engine=engine, max_steps=10**9)
        m.enter(name, *args, backward=backward)
        with pytest.raises(rvm.RvmError) as e:
            m.run()
        outcomes.append((str(e.value), e.value.index, m.steps,
                         [(f.fn.name, f.state, f.R) for f in m.stack]))
    assert outcomes[0] == outcomes[1] and "math range error" in outcomes[0][0]


# a looping callee (its frame keeps copies and looks every SEARCH_EVERY steps in the
# search's build) whose shadows overflow after a shadow of its caller's, or a cell's, did
LOOPING_G = """
from rvm import Array, reversible

@reversible
def g(y: float, out: float):
    for j in range(40):
        out {op}= y * 1e307
"""
CALLEE_AFTER = {
    "call": (LOOPING_G.format(op="+") + '''
@reversible
def f(x: float, y: float, out: float):
    g(y, out)
    out += x * 1.797e308
    out += x * 1.797e308
''', (1e-300, 1e-300, 0.0)),
    "uncall": (LOOPING_G.format(op="-") + '''
@reversible
def f(x: float, y: float, out: float):
    ~g(y, out)
    out += x * 1.797e308
    out += x * 1.797e308
''', (1e-300, 1e-300, 0.0)),
    "an ancilla in a loop": ('''
from rvm import ancilla, reversible

@reversible
def g(out: float, big: float, m: int):
    with ancilla(t=0.0):
        t += 1e-300
        for j in range(m):
            out += t * big
        t -= 1e-300

@reversible
def f(x: float, big: float, d: float, n: int, k: int, out: float):
    for i in range(n):
        out += x * d
        if i == k:
            g(out, big, 40)
''', (1e-300, 1e307, 1.797e308 * 1.000001, 5, 1, 0.0)),
    "a heap cell": (LOOPING_G.format(op="+") + '''
@reversible
def f(x: Array[float], y: float, n: int, out: float):
    g(y, out)
    out += x[0] * 1.797e308
    out += x[0] * 1.797e308
    for i in range(n):
        out += x[1] * 0.5
''', (np.array([1e-300, 1e-300]), 1e-300, 30000, 0.0)),
}


@pytest.mark.parametrize("case", CALLEE_AFTER)
def test_a_callee_that_stops_the_search_after_its_callers_shadow_overflowed(case, tmp_path):
    """The search's build stops at the first look that finds a shadow not finite and
    leaves the look before it; a callee's look sees its own frame only, so a caller's
    shadow (or a cell's) that overflowed first was missed and native code named the
    callee's later overflow. The machine now takes that look only where every frame's
    shadows and every cell's are finite there, else searches as before: the
    interpreter's place, on native code too."""
    text, args = CALLEE_AFTER[case]
    (tmp_path / "f.py").write_text(text)
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = []
    for engine in ("interp", "native"):
        with pytest.raises(rvm.InvertibilityError) as e:
            rvm.grad(f, loss="out", engine=engine)(*args)
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and errors[1][1] == "f", errors


# gradients of programs with arrays whose shadows stop being finite in a heap cell: after
# the loop (x[0]'s, from two products of 1e308), in it (y[0]'s, 1e305 a pass, after some
# 1,800 passes of the gradient pass; or from y[1], which the forward run sets to 1e305),
# or in an ancilla's cell freed before the pass ends
AFTER_THE_LOOP = '''
@reversible
def f(x: Array[float], c: float, n: int, out: float):
    out += x[0] * c
    out += x[0] * c
    for i in range(n):
        out += x[0] * 0.5
'''
ARRAY_GRADIENTS = {
    "after the loop": ("x", AFTER_THE_LOOP),
    "after the loop, an array of 2,000": ("x", AFTER_THE_LOOP),
    "after the loop, an array of 20,000, a short run": ("x", AFTER_THE_LOOP),
    "in the loop": ("y", '''
@reversible
def f(y: Array[float], c: float, n: int, out: float):
    for i in range(n):
        out += y[0] * c
'''),
    "from a cell the forward run wrote": ("y", '''
@reversible
def f(y: Array[float], c: float, n: int, out: float):
    y[1] += c
    for i in range(n):
        out += y[0] * y[1]
'''),
    "in a freed cell": ("x", '''
@reversible
def f(x: float, c: float, n: int, out: float):
    with ancilla(a=zeros(2)):
        a[0] += x
        out += a[0] * c
        out += a[0] * c
        for i in range(n):
            out += x * 0.5
        a[0] -= x
'''),
}


@pytest.mark.parametrize("case", ARRAY_GRADIENTS)
def test_a_failing_gradient_with_arrays_is_found_from_a_snapshot_of_the_search(
        case, tmp_path, monkeypatch):
    """The search for the place where a gradient stopped being finite, in a program with
    a small heap: the search's build takes snapshots of the heap and its shadows at the
    looks of the root frame, tests the cells' shadows there (and before a FREE drops
    them), and stops at the first that is not finite, leaving the snapshot before; the
    interpreter steps from it to the place. One run of that build and a few hundred
    interpreter steps (it was a bisection of some twenty runs: 43x a succeeding
    gradient), and the interpreter's report; where the call took arrays, the search
    starts where its forward run ended (the call kept the heap there)."""
    from rvm.engines.lowering import SEARCH_EVERY, SNAP_SPACING
    name, body = ARRAY_GRADIENTS[case]
    (tmp_path / "f.py").write_text("from rvm import Array, ancilla, reversible, zeros\n" + body)
    f = rvm.load(tmp_path / "f.py")["f"]
    first = 1e-300 if "freed" in case else np.array([1e-300, 0.0])
    cells = 20_000 if "20,000" in case else 2_000 if "2,000" in case else 0
    if cells:               # (a snapshot of the search's every 2,000 steps: they were
        first = np.zeros(cells)     # 128,000 apart, the place some 94,000 steps past one;
        first[0] = 1e-300           # 20,000 cells: more than a short run's end is kept for)
    passes = 1_000 if "short" in case else 110_000 if cells else 100_000
    c = 1e305 if name == "y" else 1e308
    errors, walked = [], []
    for engine in ("interp", "native"):
        g = rvm.grad(f, loss="out", engine=engine)
        g(first, 1.0, 10, 0.0)
        runs: list = []
        monkeypatch.setattr(Compiled, "run", lambda c, m, d, real=Compiled.run, runs=runs:
                            runs.append(c.looks) or real(c, m, d))
        walked = steps_stepped(monkeypatch)
        with pytest.raises(rvm.InvertibilityError) as e:
            g(first, c, passes, 0.0)
        monkeypatch.undo()
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "not finite" in errors[1][0], errors
    # (and, where the call took arrays, from where its forward run ended: no forward
    # run again, unless the heap was too large to copy there beside a run that short:
    # more than rvm.engines.lowering.FORWARD_CELLS cells, and under SNAP_SPACING steps
    # a cell; a pass that short the interpreter searches alone: rvm.ad.gradient,
    # INTERPRETED)
    assert runs == ([False, True] if "freed" in case else [False] if "short" in case
                    else [True]), runs
    assert sum(walked) < 4 * max(SEARCH_EVERY, 3 * SNAP_SPACING, np.size(first)), walked


def test_a_failing_gradient_with_an_array_nothing_reads_is_the_interpreters(tmp_path):
    """A function with an array argument and no heap instruction: the direct call with
    arrays kept where its forward run ended, which is not the arguments' final values
    a program without a heap starts its search from (they were taken for them: `argument
    1 of f is a 1-D array, which takes 2 integer parameters`)."""
    (tmp_path / "f.py").write_text('''
from rvm import Array, reversible

@reversible
def f(y: Array[float], s: float, out: float):
    out += s * 1e308
    out += s * 1e308
''')
    f = rvm.load(tmp_path / "f.py")["f"]
    errors = []
    for engine in ("interp", "native"):
        with pytest.raises(rvm.InvertibilityError) as e:
            rvm.grad(f, loss="out", engine=engine)(np.zeros(2), 1e-300, 0.0)
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "`s` is inf" in errors[1][0], errors


@pytest.mark.parametrize("case", ["after the loop", "in the loop",
                                  "from a cell the forward run wrote"])
def test_a_failing_gradient_beside_a_large_array_is_found_from_the_look_before(
        case, tmp_path, monkeypatch):
    """The search for the place where a gradient stopped being finite, in a program whose
    heap is too large for the search's snapshots (an array of 8,192 cells): the
    search's build (its variant for large heaps, CELL_LOOKS) notes, in the frame, a
    cell's shadow made not finite, so its looks (every SEARCH_EVERY steps) leave the
    last before it; one native run to that look,
    and the interpreter steps from there to the place: two runs of the search's build
    from where the forward run ended (the call kept the heap there: a run of at least
    SNAP_SPACING steps a cell) and a few hundred interpreter steps (it was a bisection
    of some twenty runs: 34x a succeeding gradient beside 10^5 cells), and the
    interpreter's report."""
    from rvm.engines.lowering import CELL_LOOKS, SEARCH_EVERY
    name, body = ARRAY_GRADIENTS[case]
    (tmp_path / "f.py").write_text("from rvm import Array, ancilla, reversible, zeros\n" + body)
    f = rvm.load(tmp_path / "f.py")["f"]
    first = np.zeros(8_192)
    first[0] = 1e-300
    c = 1e305 if name == "y" else 1e308
    errors, walked, runs = [], [], []
    for engine in ("interp", "native"):
        g = rvm.grad(f, loss="out", engine=engine)
        g(first, 1.0, 10, 0.0)
        runs = []
        monkeypatch.setattr(Compiled, "run", lambda c, m, d, real=Compiled.run, runs=runs:
                            runs.append(c.looks) or real(c, m, d))
        walked = steps_stepped(monkeypatch)
        with pytest.raises(rvm.InvertibilityError) as e:
            g(first, c, 100_000, 0.0)
        monkeypatch.undo()
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "not finite" in errors[1][0], errors
    assert runs == [CELL_LOOKS, CELL_LOOKS], runs
    assert sum(walked) < 8 * SEARCH_EVERY, walked


def searched_beside_an_array(path, warm: tuple, failing: tuple) -> tuple[list, list]:
    """f of the file at path, its first argument an array of 8,192 cells (the first
    1e-300): the error its gradient (loss `out`) raises for the arguments `failing` on
    the interpreter and on native code, after a call with `warm`, and the builds of the
    native runs the latter took (Compiled.looks). Asserts the two errors are equal."""
    f = rvm.load(path)["f"]
    y = np.zeros(8_192)
    y[0] = 1e-300
    errors, runs = [], []
    for engine in ("interp", "native"):
        g = rvm.grad(f, loss="out", engine=engine)
        g(y, *warm)
        with pytest.MonkeyPatch.context() as mp:
            runs = each_run(mp, lambda build, m: build.looks)
            with pytest.raises(rvm.InvertibilityError) as e:
                g(y, *failing)
        errors.append((str(e.value), e.value.function, e.value.index))
    assert errors[0] == errors[1] and "not finite" in errors[1][0], errors
    return errors, runs


@pytest.mark.parametrize("first", ["a register's", "a cell's"])
def test_a_failing_gradient_beside_a_large_array_names_what_stopped_being_finite_first(
        first, tmp_path):
    """Over a heap too large for the search's snapshots, a register's shadow (`s`, in a
    loop) and a cell's (`y[0]`, in a loop before it in the gradient pass, or finite):
    the search's pass notes the last look before the first of them to stop being
    finite, one native run goes there, and the interpreter steps to it: the
    interpreter's report, naming that one."""
    from rvm.engines.lowering import CELL_LOOKS
    d = 1e305 if first == "a cell's" else 1.0
    (tmp_path / "f.py").write_text('''from rvm import Array, reversible

@reversible
def f(y: Array[float], s: float, c: float, d: float, n: int, out: float):
    for i in range(n):
        out += s * c
    for i in range(n):
        out += y[0] * d
''')
    errors, runs = searched_beside_an_array(tmp_path / "f.py", (1e-300, 1.0, 1.0, 10, 0.0),
                                            (1e-300, 1e305, d, 100_000, 0.0))
    assert ("in the gradient of a heap cell" in errors[1][0]) == (first == "a cell's"), errors
    assert runs == [CELL_LOOKS, CELL_LOOKS], runs


def test_a_looping_callee_after_a_cells_shadow_went_bad_does_not_move_the_search_past_it(
        tmp_path):
    """Over a large heap, a cell's shadow of the caller's made not finite (an ancilla's,
    freed again) before a looping callee runs in the gradient pass: the caller tells the
    machine before the call, so the callee's looks do not note a look past the place (a
    bisection of 37 native runs followed; a skeptic's case). The interpreter's report,
    two runs of the search's build."""
    from rvm.engines.lowering import CELL_LOOKS
    (tmp_path / "f.py").write_text('''from rvm import Array, ancilla, reversible, zeros

@reversible
def g(y: Array[float], n: int, out: float):
    for i in range(n):
        out += y[1] * 0.5

@reversible
def f(x: Array[float], c: float, n: int, out: float):
    out += x[0] * c
    out += x[0] * c
    g(x, n, out)
    with ancilla(a=zeros(3)):
        a[0] += 1e-300
        out += a[0] * c
        out += a[0] * c
        a[0] -= 1e-300
    for i in range(n):
        out += x[2] * 0.5
''')
    _, runs = searched_beside_an_array(tmp_path / "f.py", (1.0, 10, 0.0),
                                       (1e308, 30_000, 0.0))
    assert runs == [CELL_LOOKS, CELL_LOOKS], runs
