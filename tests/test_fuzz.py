"""The in-tree fuzzers (tools/fuzz.py): every category of hostile input ends in a clean
error or a result, never a traceback, a crash, a hang or a wrong answer. A bounded run in
CI; RVM_SLOW=1 runs many more cases (tools/fuzz.py prints the full table)."""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
import fuzz

SLOW = os.environ.get("RVM_SLOW") == "1"
CASES = {"rasm": 300, "rvmb": 80, "frontend": 300, "janus": 300, "debugger": 200,
         "cli": 300, "programs": 60, "programs-native": 10, "batches": 4, "arguments": 20,
         "cache": 8, "signals": 8, "arrays": 40}
# RVM_SLOW=1 runs 20 times as many, batches 50 times (200 of seed 7, as before: each case
# compiles four native programs, 2.2 s); the default run's 4 batches of seed 76 are one
# with a failing check, one with a huge value, one with both and one with neither, and
# end both "ok" and "clean" (asserted below)
SLOW_TIMES = {"batches": 50}
SEEDS = {"batches": 76}


@pytest.mark.parametrize("category", list(fuzz.CATEGORIES))
def test_fuzz_category_has_no_tracebacks_crashes_hangs_or_wrong_results(category):
    n = CASES[category] * (SLOW_TIMES.get(category, 20) if SLOW else 1)
    details: list = []
    counts = fuzz.run(category, n, seed=7 if SLOW else SEEDS.get(category, 7),
                      details=details)
    assert sum(counts.values()) == n
    bad = {k: counts[k] for k in ("traceback", "crash", "hang", "wrong") if counts[k]}
    assert not bad, f"{category}: {bad}\n" + "\n".join(d[3] or d[2] for d in details[:3])
    native = ("programs-native", "batches", "cache", "signals")
    if category in native and not fuzz.native_available():
        pytest.skip("llvmlite is not installed")
    if category in ("rasm", "rvmb", "frontend", "janus", "batches"):
        assert counts["clean"] and counts["ok"]      # the mutations reach both answers


def test_the_fuzzer_counts_a_crash_and_a_hang(monkeypatch):
    """The harness itself: a case that kills its process is a crash, one that spins
    (`timeout` seconds of its CPU time) or never answers (`wall` seconds) is a hang, one
    that is only slow on the clock (as under a loaded machine) is not, and the run goes
    on after all of them. (Short limits: the hangs cost their `timeout` and `wall`, and
    seed 7 has one case of each kind, each followed by more cases.)"""
    import signal
    import time
    timeout, wall = 0.5, 2.0

    def case(rng):
        k = rng.random()
        if k < 0.15:
            os.kill(os.getpid(), signal.SIGSEGV)
        if k < 0.25:
            time.sleep(60)
        if k < 0.35:
            while True:
                pass
        if k < 0.45:
            time.sleep(2 * timeout)     # over the CPU timeout on the clock, but idle
            return "clean"
        return "ok"
    kinds = [random_kind(7, k) for k in range(16)]
    assert {"crash", "sleep", "spin", "slow"} <= set(kinds[:-1]) and kinds[-1] == "ok"
    monkeypatch.setitem(fuzz.CATEGORIES, "selftest", case)
    counts = fuzz.run("selftest", 16, seed=7, timeout=timeout, wall=wall)
    assert sum(counts.values()) == 16
    assert counts["crash"] == kinds.count("crash")
    assert counts["hang"] == kinds.count("sleep") + kinds.count("spin")
    assert counts["clean"] == kinds.count("slow")
    assert counts["ok"] == kinds.count("ok")


def random_kind(seed: int, k: int) -> str:
    """What the self-test's case k does (the fuzzer seeds case k's generator this way)."""
    x = __import__("random").Random(seed * 1_000_003 + k).random()
    return "crash" if x < 0.15 else "sleep" if x < 0.25 else "spin" if x < 0.35 else \
        "slow" if x < 0.45 else "ok"


def test_native_programs_refuse_to_run_without_llvmlite(monkeypatch, capsys):
    """Without llvmlite no random program would reach the native engine: the category is a
    usage error, not a run of programs counted as passing."""
    monkeypatch.setattr(fuzz, "native_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["fuzz.py", "--programs", "3", "--category",
                                      "programs-native"])
    with pytest.raises(SystemExit) as e:
        fuzz.main()
    assert e.value.code == 2 and "needs llvmlite" in capsys.readouterr().err


def test_cli_cases_write_nothing_where_the_fuzzer_runs(tmp_path, monkeypatch):
    """A random word after -o names a file the CLI writes: each case runs in a directory
    of its own, so a long campaign leaves no stray files behind (in the repository, say)."""
    class Scripted:                    # rvm compile asm/fib.rasm -o fib
        def __init__(self):
            self.picks = ["compile", "asm/fib.rasm", "-o", "fib"]

        def choice(self, seq):
            assert self.picks[0] in seq
            return self.picks.pop(0)

        def randint(self, a, b):
            return 2

        def random(self):
            return 0.5
    monkeypatch.chdir(tmp_path)
    assert fuzz.case_cli(Scripted()) == "ok"
    assert list(tmp_path.iterdir()) == []
