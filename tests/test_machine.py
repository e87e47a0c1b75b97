"""Machine semantics: frames, calls both ways, heap, checks, limits, errors."""

import pathlib

import pytest

import rvm
from rvm import InvertibilityError, MachineError


def asm(text):
    return rvm.assemble(text, "t.rasm")


def test_step_and_back_move_one_instruction_and_into_calls():
    p = asm("""
.func sq(r0, r1)
    ADD.mul r1, r0, r0
.end
.func main(r0, r1)
    INC r0
    CALL sq, r0, r1
    UNCALL sq, r0, r1
    CALL sq, r0, r1
.end""")
    m = rvm.Machine(p)
    m.enter("main", 2, 0)
    states = [m.snapshot()]
    while m.step():
        states.append(m.snapshot())
        assert len(m.stack) <= 2
    assert m.at_end and m.results() == (3, 9)
    # 1 INC + 3 calls x (enter, body, leave)
    assert len(states) - 1 == 1 + 3 * 3 and m.steps == 10
    for s in reversed(states[:-1]):
        assert m.back()
        assert m.snapshot() == s
    assert m.at_start and not m.back() and m.steps == 0


def test_uncall_runs_the_callee_backwards_and_frames_record_direction():
    p = asm(".func f(r0, r1)\n ADD r1, r0\n INC r0\n.end\n"
            ".func main(r0, r1)\n UNCALL f, r0, r1\n.end")
    m = rvm.Machine(p)
    m.enter("main", 5, 5)
    m.step()
    assert [fr.dir for fr in m.stack] == [1, -1]
    m.run()
    assert m.results() == (4, 1)


def test_call_and_uncall_api():
    p = asm(".func f(r0, r1)\n ADD r1, r0\n INC r0\n.end")
    assert p.call("f", 5, 1) == (6, 6)
    assert p.uncall("f", 6, 6) == (5, 1)
    h = p["f"]
    assert h(5, 1) == (6, 6) and (~h)(6, 6) == (5, 1)


def test_recursion():
    # asm/fact.rasm: r1 += n! by recursion, uncomputing each level's local with an UNCALL
    p = rvm.load(pathlib.Path(__file__).parent.parent / "asm" / "fact.rasm")
    assert p.call("fact", 10, 0) == (10, 3628800)
    assert p.uncall("fact", 10, 3628800) == (10, 0)


def test_locals_must_be_zero_on_exit():
    p = asm(".func f(r0)\n ADD r1, r0\n.end")
    with pytest.raises(InvertibilityError) as err:
        p.call("f", 3)
    e = err.value
    assert e.function == "f" and e.values == {"r1": 3} and e.line == 3
    assert "not restored" in str(e)


def test_locals_checked_when_callee_frame_is_left_and_state_kept():
    p = asm(".func g(r0)\n ADD r1, r0\n.end\n.func main(r0)\n CALL g, r0\n.end")
    m = rvm.Machine(p)
    m.enter("main", 4)
    m.step()
    m.step()
    before = m.snapshot()
    with pytest.raises(InvertibilityError, match="r1 not restored"):
        m.step()
    assert m.snapshot() == before          # nothing was lost: still inside g
    assert m.back() and m.back() and m.at_start


def test_float_locals_accept_and_clear_residue():
    p = asm(".func f(f0)\n ADD f1, f0\n SUB f1, f0\n ADD f1, 1e-10\n.end")
    assert p.call("f", 0.1) == (0.1,)
    with pytest.raises(InvertibilityError):
        rvm.Machine(p, tol=1e-12).call("f", 0.1)


def test_comefrom_assertion_fails_forwards_with_values():
    # entered by fall-through at function entry, but the condition says "by the jump"
    p = asm(".func f(r0)\ntop: CF.EQ r0, 0, b\n INC r0\nb: BR.LT r0, 3, top\n.end")
    with pytest.raises(InvertibilityError) as err:
        p.call("f", 0)
    e = err.value
    assert e.index == 0 and e.function == "f" and e.line == 2
    assert "entered by fall-through" in str(e) and "r0 == 0" in str(e) and "r0 = 0" in str(e)


def test_comefrom_assertion_fails_when_arriving_by_jump():
    p = asm(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 1, b\n.end")
    with pytest.raises(InvertibilityError, match="arrived by its jump, but r0 == 1"):
        p.call("f", 0)


def test_branch_assertion_fails_backwards():
    p = asm(".func f(r0)\nb: BR.EQ r0, 0, c\n INC r0\nc: CF.EQ r0, 0, b\n.end")
    assert p.call("f", 0) == (0,) and p.call("f", 4) == (5,)
    # backwards from r0 = 1 the comefrom decides "fell through", INC is undone (r0 = 0), and
    # then the branch, undone by fall-through, finds its condition r0 == 0 true
    with pytest.raises(InvertibilityError, match="reached by fall-through going backwards"):
        p.uncall("f", 1)


def test_mul_by_zero_refused():
    p = asm(".func f(f0, f1)\n MUL f0, f1\n.end")
    with pytest.raises(InvertibilityError, match="f1 is zero"):
        p.call("f", 2.0, 0.0)


def test_heap_alloc_exch_free():
    p = asm("""
.func f(r0, f0)
    ALLOC r1, 3
    EXCH f0, [r1 + 2]
    ADD.mul f1, f0, f0
    EXCH f0, [r1 + 2]
    EXCH f0, [r1 + 2]
    SUB.mul f1, f0, f0
    EXCH f0, [r1 + 2]
    FREE r1, 3
.end""")
    assert p.call("f", 0, 1.5) == (0, 1.5)


def test_free_of_nonzero_cell_refused():
    p = asm(".func f(r0, r1)\n ALLOC r1, 2\n EXCH r0, [r1 + 1]\n FREE r1, 2\n.end")
    m = rvm.Machine(p)
    m.enter("f", 7, 0)
    with pytest.raises(InvertibilityError, match=r"heap\[1\] = 7"):
        m.run()
    assert m.stack[0].index(1) == 2 and m.top == 2


def test_free_must_be_lifo():
    p = asm(".func f(r0, r1)\n ALLOC r0, 1\n ALLOC r1, 1\n FREE r0, 1\n.end")
    with pytest.raises(InvertibilityError, match="LIFO"):
        p.call("f", 0, 0)


def test_alloc_requires_zero_register():
    p = asm(".func f(r0)\n ALLOC r0, 1\n.end")
    with pytest.raises(InvertibilityError, match="must be 0 before ALLOC"):
        p.call("f", 9)


def test_push_pop():
    p = asm(".func f(r0, f0)\n PUSH r0\n PUSH f0\n POP f1\n POP r1\n SWAP r0, r1\n"
            " SWAP f0, f1\n.end")
    assert p.call("f", 3, 2.5) == (3, 2.5)
    with pytest.raises(InvertibilityError, match="must be 0 before POP"):
        asm(".func f(r0, r1)\n PUSH r0\n POP r1\n.end").call("f", 1, 5)
    with pytest.raises(InvertibilityError, match="empty heap"):
        asm(".func f(r0)\n POP r0\n.end").call("f", 0)


def test_memory_bounds_checked():
    p = asm(".func f(r0, r1)\n EXCH r1, [r0 + 5]\n.end")
    with pytest.raises(InvertibilityError, match="outside the heap"):
        p.call("f", 0, 1)


def test_heap_limit():
    p = asm(".func f(r0, r1)\n ALLOC r1, r0\n.end")
    with pytest.raises(MachineError, match="heap limit of 100 cells"):
        rvm.Machine(p, heap_limit=100).call("f", 1000, 0)


def test_step_budget_stops_endless_loop():
    p = rvm.load(__file__.replace("tests/test_machine.py", "asm/fib.rasm"))
    with pytest.raises(MachineError, match="step budget of 5000"):
        rvm.Machine(p, max_steps=5000).call("fib", 0, 0, 0)   # n = 0 never ends


def test_call_depth_limit():
    p = asm(".func f(r0)\n CALL f, r0\n.end")
    with pytest.raises(MachineError, match="call depth limit"):
        rvm.Machine(p, max_depth=50).call("f", 0)


def test_arithmetic_domain_error_is_located():
    p = asm(".func f(f0, f1)\n ADD.log f0, f1\n.end")
    with pytest.raises(MachineError, match="math domain error") as err:
        p.call("f", 0.0, -1.0)
    assert err.value.index == 0 and err.value.line == 2


def test_overflow_to_infinity_refused():
    p = asm(".func f(f0, f1)\n ADD.exp f0, f1\n.end")
    with pytest.raises(MachineError):
        p.call("f", 0.0, 1000.0)
    p = asm(".func f(f0, f1)\n ADD.mul f0, f1, f1\n.end")
    with pytest.raises(InvertibilityError, match="not finite"):
        p.call("f", 0.0, 1e200)


def test_bad_arguments():
    p = asm(".func f(r0, f0)\n.end")
    with pytest.raises(MachineError, match="takes 2 parameter registers"):
        p.call("f", 1)
    with pytest.raises(MachineError, match="must be an integer"):
        p.call("f", 1.5, 0.0)
    with pytest.raises(MachineError, match="must be a number"):
        p.call("f", 1, "x")
    with pytest.raises(MachineError, match="no function 'g'"):
        p.call("g")
    with pytest.raises(MachineError, match="int64"):
        p.call("f", 1 << 70, 0.0)


def _engines():
    from rvm.engines import llvm, native
    return ["interp", "python"] + (["native"] if native.available and llvm.usable() else [])


# main (3 registers) calls mid (2), which calls leaf (3) twice: 3 frames and
# 8 registers at most; leaf allocates r0 heap cells and frees them
CHAIN = """
.func leaf(r0, r1)
    ALLOC  r1, r0
    ADD    r2, r1
    SUB    r2, r1
    FREE   r1, r0
.end
.func mid(r0, r1)
    CALL   leaf, r0, r1
    CALL   leaf, r0, r1
.end
.func main(r0, r1, r2)
    CALL   mid, r0, r1
.end
"""


def _outcome(p, engine, *args, **limits):
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = rvm.Machine(p, engine=engine, **limits)
            return [m.call(list(p.functions)[-1], *args) for _ in range(3)]
    except MachineError as e:
        return str(e).splitlines()[0]


@pytest.mark.parametrize("engine", _engines())
def test_frames_count_against_the_limits_on_every_engine_at_their_edges(engine):
    """Compiled code keeps no frames, yet refuses what the interpreter refuses: a chain of
    calls past max_depth, registers of the live frames plus heap cells past heap_limit
    (exactly at the limits each passes)."""
    p = asm(CHAIN)
    for limits in ({"max_depth": 3}, {"max_depth": 2}, {"heap_limit": 8},
                   {"heap_limit": 7}, {"heap_limit": 12}, {"heap_limit": 11}):
        for n in (0, 1, 4):     # (n = 1 at heap_limit = 8: no cell left for it)
            assert _outcome(p, engine, n, 0, 0, **limits) == \
                _outcome(p, "interp", n, 0, 0, **limits), (limits, n)
    assert isinstance(_outcome(p, engine, 4, 0, 0, heap_limit=12), list)
    assert "memory limit of 11" in _outcome(p, engine, 4, 0, 0, heap_limit=11) or \
        "heap limit of 11" in _outcome(p, engine, 4, 0, 0, heap_limit=11)
    assert "call depth limit of 2" in _outcome(p, engine, 0, 0, 0, max_depth=2)


@pytest.mark.parametrize("engine", _engines())
def test_a_recursive_program_counts_its_frames_on_every_engine(engine):
    p = rvm.load(pathlib.Path(__file__).parents[1] / "asm" / "fact.rasm")
    for limits in ({"max_depth": 8}, {"max_depth": 12}, {"heap_limit": 30},
                   {"heap_limit": 36}):
        assert _outcome(p, engine, 12, 0, **limits) == _outcome(p, "interp", 12, 0, **limits)
    assert "call depth limit of 8" in _outcome(p, engine, 12, 0, max_depth=8)


def test_a_large_frame_past_the_limit_in_a_callee_whose_run_exhausts_its_budget():
    """A callee's frame the limit refuses, in a run the budget also stops: an rvm error
    (it was a traceback from reading native code's record of the run)."""
    text = (pathlib.Path(__file__).parents[1] / "asm" / "iexp.rasm").read_text()
    p = asm(text.replace("        ADD     f3, f2 ", "        ADD f1540, 0.0\n"
                         "        SUB f1540, 0.0\n        ADD     f3, f2 "))
    for engine in _engines():
        for steps in (30, 5000):
            with pytest.raises(MachineError, match="memory limit of 1200 cells"):
                p.call("iexp", 0.0, 0.5, engine=engine, max_steps=steps, heap_limit=1200)


def test_argument_arrays_past_the_heap_limit_are_an_rvm_error():
    import numpy as np
    p = asm(".func f(r0, r1)\n.end")
    with pytest.raises(MachineError, match="heap limit of 100 cells exceeded"):
        p.call("f", np.zeros(1000, np.int64), 0, heap_limit=100)


def test_threads_starting_on_a_fresh_program_see_its_whole_call_analysis():
    """The chains of calls under each function are computed once and published whole: a
    thread never reads them half made (it took main for recursive, and its compiled code
    ran past max_depth)."""
    import sys
    import threading
    text = ".func leaf(r0, r1)\n    ADD r1, r0\n.end\n.func mid(r0, r1)\n" \
        "    CALL leaf, r0, r1\n.end\n" + "".join(
            f".func pad{i}(r0, r1)\n    ADD r1, r0\n.end\n" for i in range(1000)) + \
        ".func main(r0, r1)\n    CALL mid, r0, r1\n.end\n"
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for _ in range(3):
            p, results = asm(text), []

            def go(p=p, results=results):
                try:
                    results.append(p.call("main", 1, 0, engine="python", max_depth=2))
                except MachineError as e:
                    results.append(str(e))
            threads = [threading.Thread(target=go) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 8 and all("call depth limit of 2" in r for r in results)
    finally:
        sys.setswitchinterval(interval)
