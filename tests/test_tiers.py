"""A large module is compiled twice (rvm.engines.llvm: Tier): quick code with no
optimisation, which the first calls run, and the optimised code, made on a thread, which
takes over. Both give the interpreter's answers, its errors and its step counts; a long
run never stays on the quick code; the optimised code reaches the cache even where the
process ends first. (The modules here are small: TIER_CHARS is set to 0.)"""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from test_native_limits import SPIN as COUNT  # (f0 counted up to f1)

import rvm
from rvm.engines import llvm, native
from rvm.engines.compiled import compiled
from rvm.engines.machine import Machine
from rvm.engines.templates import LEFT

pytestmark = pytest.mark.skipif(not (native.available and llvm.usable()),
                                reason="llvmlite is not installed")

# f2 += exp(f0 - 700) for f0 = 1, 2, ... up to f1: 9 steps a pass; from f0 = 1410 on the
# sum is inf (a float result not finite)
SPIN = """\
.func spin(f0, f1, f2, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        ADD    f3, f0
        SUB    f3, 700.0
        ADD.exp f2, f3
        SUB    f3, f0
        ADD    f3, 700.0
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""
HEAPED = """\
from rvm import Array, reversible

@reversible
def f(x: Array[float], n: int, out: float):
    for i in range(n):
        out += x[i % 3] * x[(i + 1) % 3]
"""


@pytest.fixture
def tiers(monkeypatch, tmp_path):
    """Every module tiered; the optimised compile held until `release` is set (each
    tier's thread waits for it before it compiles); the tiers made are listed."""
    monkeypatch.setenv("RVM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(llvm, "TIER_CHARS", 0)
    release, made = threading.Event(), []
    work = llvm.Tier._work

    def held(self, *args):
        made.append(self)
        release.wait(60)
        work(self, *args)
    monkeypatch.setattr(llvm.Tier, "_work", held)
    yield release, made, tmp_path
    release.set()
    for t in made:
        t.done.wait(60)


def ran(program, engine, *args) -> tuple:
    """spin's final registers and the steps it took, on a machine (native code's: the
    budget it left, as a gradient's search reads it)."""
    m = Machine(program, engine=engine)
    m.enter("spin", *args)
    m.run()
    state = m._native_state()
    return m.results(), m.steps if state is None else m.max_steps - int(state[LEFT])


def interpreted(program, name, *args):
    return ran(program, "interp", *args)


def test_a_first_call_runs_quick_code_and_the_next_waits_for_the_optimised(tiers):
    release, made, cache = tiers
    p = rvm.assemble(SPIN, "spin.rasm")
    want, steps = interpreted(p, "spin", 0.0, 600.0, 0.0, 0)
    assert ran(p, "native", 0.0, 600.0, 0.0, 0) == (want, steps)
    (tier,) = made
    (funcs,) = compiled(p, True, native=True)._native.values()
    run = funcs["F0_fw"]
    quick = run.library
    assert run.tier is tier and not tier.done.is_set()
    assert not list(cache.glob("rvm_llvm_*.o"))        # (the quick code is not kept)
    threading.Timer(0.2, release.set).start()
    assert ran(p, "native", 0.0, 600.0, 0.0, 0) == (want, steps)
    assert tier.done.is_set()           # (the second call waited for it)
    assert run.tier is None and run.library is not quick
    assert len(list(cache.glob("rvm_llvm_*.o"))) == 1
    assert ran(p, "native", 0.0, 600.0, 0.0, 0) == (want, steps)


def test_a_first_run_longer_than_the_quick_budget_runs_again_on_the_optimised_code(
        tiers, monkeypatch):
    """With QUICK_STEPS steps the quick code does not finish: the call waits for the
    optimised code and runs there, whole, with the caller's budget: the same answer and
    steps."""
    release, made, _ = tiers
    monkeypatch.setattr(llvm, "QUICK_STEPS", 1000)
    p = rvm.assemble(SPIN, "spin.rasm")
    want, steps = interpreted(p, "spin", 0.0, 600.0, 0.0, 0)
    threading.Timer(0.2, release.set).start()
    assert ran(p, "native", 0.0, 600.0, 0.0, 0) == (want, steps) and steps > 1000
    assert made[0].done.is_set()            # (it waited for the optimised code)


def test_a_short_first_run_with_a_larger_budget_counts_its_steps_as_that_budget(
        tiers, monkeypatch):
    """A run within QUICK_STEPS, with a larger budget, runs the quick code and reports
    the budget it left as the run with that budget does."""
    _, made, _ = tiers
    monkeypatch.setattr(llvm, "QUICK_STEPS", 1000)
    p = rvm.assemble(SPIN, "spin.rasm")
    want, steps = interpreted(p, "spin", 0.0, 50.0, 0.0, 0)
    assert ran(p, "native", 0.0, 50.0, 0.0, 0) == (want, steps) and steps < 1000
    assert not made[0].done.is_set()        # (the quick code ran it)


@pytest.mark.parametrize("quick_steps", [1000, 10**9])
def test_a_failing_run_on_quick_code_fails_as_the_interpreter_does(tiers, monkeypatch,
                                                                   quick_steps):
    """A value not finite at pass 1410: the same error at the same step, whether the quick
    code reports it (a budget within QUICK_STEPS) or the optimised code runs again."""
    release, _, _ = tiers
    monkeypatch.setattr(llvm, "QUICK_STEPS", quick_steps)
    p = rvm.assemble(SPIN, "spin.rasm")
    errors = []
    for engine in ("interp", "native"):
        m = Machine(p, engine=engine)
        if engine == "native":
            threading.Timer(0.2, release.set).start()
        m.enter("spin", 0.0, 1500.0, 0.0, 0)
        with pytest.raises(rvm.RvmError) as e:
            m.run()
        errors.append((str(e.value), m.steps))
    assert errors[0] == errors[1]


def test_gradients_and_batches_of_a_tiered_module_agree(tiers, tmp_path):
    """A gradient with arrays (a heap) on the quick code; a first rvm.vmap batch of 3,000
    rows runs in chunks (64 rows, then twice as many each time) on the quick code without
    waiting, a second waits for the optimised code: each row as the interpreter gives
    it."""
    release, made, _ = tiers
    (tmp_path / "f.py").write_text(HEAPED)
    f = rvm.load(tmp_path / "f.py")["f"]
    x = np.array([0.5, -1.5, 2.0])
    want = rvm.grad(f, loss="out", engine="interp")(x, 40, 0.0)
    got = rvm.grad(f, loss="out", engine="native")(x, 40, 0.0)
    assert made and not made[0].done.is_set()
    assert np.array_equal(got[0], want[0])
    p = rvm.assemble(SPIN, "spin.rasm")
    g = rvm.grad(p["spin"], loss=2, engine="native")
    ends = np.arange(3000) % 50 + 1.0
    batch = rvm.vmap(g, in_axes=(None, 0, None, None))
    heaped = len(made)          # (the tiers before are the gradient's with arrays)
    rows = batch(0.0, ends, 0.0, 0)
    assert not any(t.done.is_set() for t in made)      # (the first batch did not wait)
    every = {end: rvm.grad(p["spin"], loss=2, engine="interp")(0.0, end, 0.0, 0)
             for end in np.unique(ends)}
    for k in (0, 63, 64, 191, 192, 1983, 1984, 2999):
        assert [np.ravel(r)[k] if r is not None else None for r in rows] == \
            list(every[ends[k]])
    threading.Timer(0.2, release.set).start()
    again = batch(0.0, ends, 0.0, 0)
    # (the second waited for its own program's tier; the other one's, released at the
    # same time, may still be at work)
    assert made[heaped:] and all(t.done.is_set() for t in made[heaped:])
    for r, a in zip(rows, again):
        assert (r is None and a is None) or np.array_equal(r, a)


def test_a_process_that_ends_first_leaves_the_optimised_code_in_the_cache(tmp_path):
    """The process waits for the optimised code at exit (no crash, exit code 0), so the
    next process loads it and compiles nothing."""
    env = dict(os.environ, RVM_CACHE_DIR=str(tmp_path))
    first = ("import rvm\nfrom rvm.engines import llvm\nllvm.TIER_CHARS = 0\n"
             f"p = rvm.assemble({SPIN!r})\n"
             "print(p.call('spin', 0.0, 600.0, 0.0, 0, engine='native'))\n")
    r = subprocess.run([sys.executable, "-c", first], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(list(tmp_path.glob("rvm_llvm_*.o"))) == 1
    second = first.replace("llvm.TIER_CHARS = 0\n", "llvm.TIER_CHARS = 0\n"
                           "llvm._compile_ir = None\n")     # (compiling would fail)
    again = subprocess.run([sys.executable, "-c", second], env=env, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0 and again.stdout == r.stdout, again.stderr


def test_powers_agree_to_the_bit_on_both_tiers_and_the_interpreter(tiers):
    """2.0 ** x and x ** 0.5 call the C library's pow on every engine (optimised LLVM
    made them exp2 and a square root, a last bit apart where the quick code, and the
    interpreter's math.pow, were not); x ** 2 and x ** 1 stay a product and x."""
    release, made, _ = tiers
    p = rvm.assemble(".func f(f0, f1)\n    ADD.pow f1, 2.0, f0\n.end\n"
                     ".func g(f0, f1)\n    ADD.pow f1, f0, 0.5\n    ADD.pow f1, f0, 1\n.end\n")
    cases = [("f", 27.511442341849275), ("g", 631806.3216105042)]
    want = [p.call(name, x, 0.0, engine="interp") for name, x in cases]
    first = [p.call(name, x, 0.0, engine="native") for name, x in cases]
    release.set()
    for t in made:
        assert t.done.wait(60)
    assert first == want == [p.call(name, x, 0.0, engine="native") for name, x in cases]


SLOW_OPTIMISED = """\
import time
import rvm
from rvm.engines import llvm
llvm.TIER_CHARS = 0
real = llvm._compile_ir

def slow(text, quick=False):       # (the optimised code takes {seconds} s more, as
    if not quick:                   # LLVM would: its thread goes on after a SIGINT)
        for _ in range(10 * {seconds}):
            time.sleep(0.1)
    return real(text, quick)
llvm._compile_ir = slow
p = rvm.assemble({spin!r})
print(p.call("spin", 0.0, 600.0, 0.0, 0, engine="native"), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")
def test_a_fork_while_the_optimised_code_is_made_waits_for_it(tmp_path):
    """A child forked then has no thread of LLVM's (and LLVM's locks as the fork found
    them): the fork waits for the optimised code, and the child computes at once."""
    script = SLOW_OPTIMISED.format(seconds=1, spin=SPIN) + (
        "import os\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    out = p.call('spin', 0.0, 600.0, 0.0, 0, engine='native')\n"
        "    q = rvm.assemble(" + repr(SPIN.replace("700.0", "600.0")) + ")\n"
        "    out2 = q.call('spin', 0.0, 60.0, 0.0, 0, engine='native')\n"
        "    os._exit(0 if out[0] == 600.0 and out2[0] == 60.0 else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, RVM_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "child 0", r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_while_the_process_waits_at_exit_ends_it_at_once(tmp_path):
    """SIGINT while the process waits for the optimised code at exit: exit code 130 at
    once (the interpreter's shutdown while LLVM works on its thread crashed it)."""
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-c",
                             SLOW_OPTIMISED.format(seconds=30, spin=SPIN)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, RVM_CACHE_DIR=str(tmp_path)))
    first = proc.stdout.readline()          # (the first call's answer: then it ends)
    assert first.startswith("(600.0"), proc.stderr.read()
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    t = time.perf_counter()
    rc = proc.wait(timeout=20)
    assert rc == 130 and time.perf_counter() - t < 5


def test_each_threads_first_call_runs_the_quick_code(tiers):
    """A pool's threads start together: each one's first call runs the quick code (the
    second thread did not wait for the optimised code because the first had called)."""
    _, made, _ = tiers
    p = rvm.assemble(SPIN, "spin.rasm")
    want = p.call("spin", 0.0, 600.0, 0.0, 0, engine="interp")
    assert p.call("spin", 0.0, 600.0, 0.0, 0, engine="native") == want
    got: list = []
    thread = threading.Thread(target=lambda: got.append(
        p.call("spin", 0.0, 600.0, 0.0, 0, engine="native")))
    thread.start()
    thread.join(30)
    assert got == [want] and not made[0].done.is_set()


def test_a_program_stopped_by_ctrl_c_does_not_wait_at_exit(tmp_path):
    """A KeyboardInterrupt that stops the program while the optimised code is being made:
    the process ends at once (exit code 130), not when that code is made."""
    import time
    script = SLOW_OPTIMISED.format(seconds=30, spin=SPIN) + "raise KeyboardInterrupt\n"
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, RVM_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 130 and time.perf_counter() - t < 20, r.stderr


def test_a_ctrl_c_the_program_catches_does_not_end_it_at_exit(tmp_path):
    """A SIGINT that stops a first call on the quick code, caught by the program, which
    goes on to another program: at exit the process waits for that one's optimised code
    as usual (exit code 0, the code cached), not as if the Ctrl-C had stopped it."""
    script = SLOW_OPTIMISED.format(seconds=0, spin=SPIN) + (
        "import os, signal, threading, time\n"
        "q = rvm.assemble(" + repr(COUNT) + ")\n"
        "threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    q.call('spin', 0.0, 3e9, 0, engine='native', max_steps=10**11)\n"
        "except KeyboardInterrupt:\n"
        "    print('caught', flush=True)\n"
        "def slower(text, quick=False):\n"
        "    if not quick:\n"
        "        for _ in range(20):\n"
        "            time.sleep(0.1)\n"
        "    return real(text, quick)\n"
        "llvm._compile_ir = slower\n"
        "r = rvm.assemble(" + repr(SPIN.replace("700.0", "701.0")) + ")\n"
        "print(r.call('spin', 0.0, 10.0, 0.0, 0, engine='native')[0], flush=True)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, RVM_CACHE_DIR=str(tmp_path)))
    assert r.returncode == 0 and r.stdout.splitlines()[-2:] == ["caught", "10.0"], r.stderr
    assert len(list(tmp_path.glob("rvm_llvm_*.o"))) == 3        # (r's too)
