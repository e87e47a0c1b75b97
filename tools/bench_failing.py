"""What a failing native run costs against a succeeding run of the same length.

    python tools/bench_failing.py [PASSES]

A loop of PASSES passes counts f0 up by 1 and, in each pass, adds exp(f0 - PASSES) to a
parameter f2 that nothing compares, so the sum overflows (a value that is not finite)
about 710 passes before the end: no check sees it in the pass that made it, and the
error must still be the interpreter's, at the pass that made it. The succeeding run stops
10 passes short of the overflow. The same loop counted by an integer (a counted loop,
which native code runs without a budget test per pass and looks at the floats of after
chunks of about 1,024 steps) is the second row; the third, the general loop adding f0
into a heap cell and taking it out again in each pass (a function that writes the
heap: its looks keep a snapshot of a small heap), the fourth that loop with 4,096 cells
allocated (snapshots every 262,144 steps), and the fifth with 131,072 (more than a
snapshot holds: native code runs again to the look before the failure). The sixth is a
gradient (rvm.grad) of
a loop of PASSES / 50 passes whose gradient comes out inf from a product made before the
loop: the error says where in the gradient pass a shadow stopped being finite, which
native code does not test for (a bisection of native runs with step budgets finds it);
the seventh, the same with x an array (a program with a heap), the eighth with x an
array of 10^5 cells (too large for the snapshots of the search's build).
Times are the best of 3 in one process (native code compiled before timing).
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import rvm
from rvm.engines import native
from rvm.engines.machine import Machine

LOOP = """\
.func spin(f0, f1, f2, r0)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        INC    r0
        ADD    f3, f0
        SUB    f3, {k}
        ADD.exp f2, f3
        SUB    f3, f0
        ADD    f3, {k}
exitbr: BR.GE  f0, f1, done
back:   JMP    top
done:   CF     exitbr
.end
"""
COUNTED = """\
.func spin(f0, f1, f2, r0, r1)
top:    CF.NE  r0, 0, back
        ADD    f0, 1.0
        ADD    f3, f0
        SUB    f3, {k}
        ADD.exp f2, f3
        SUB    f3, f0
        ADD    f3, {k}
        INC    r0
exitbr: BR.EQ  r0, r1, done
back:   JMP    top
done:   CF     exitbr
        SUB    r0, r1
.end
"""
# the general loop writing the heap: f0 added into cell r1 + 1 and taken out again in
# each pass (so the cells are zero where the run ends: FREE), {cells} cells
HEAP = LOOP.replace(".func spin(f0, f1, f2, r0)\n", ".func spin(f0, f1, f2, r0)\n"
                    "        ALLOC  r1, {cells}\n").replace(
    "        INC    r0\n", "        INC    r0\n        EXCH   f4, [r1 + 1]\n"
    "        ADD    f4, f0\n        EXCH   f4, [r1 + 1]\n").replace(
    "exitbr:", "        EXCH   f4, [r1 + 1]\n        SUB    f4, f0\n"
    "        EXCH   f4, [r1 + 1]\nexitbr:").replace(
    "done:   CF     exitbr\n", "done:   CF     exitbr\n        FREE   r1, {cells}\n")


GRADIENT = """\
from rvm import reversible

@reversible
def f(x: float, c: float, n: int, out: float):
    out += x * c
    out += x * c
    for i in range(n):
        out += x * 0.5
"""


def gradient_row(passes: int, heap: int = 0) -> None:
    """The succeeding and the failing gradient (c = 1e308: two products of 1e308 add up
    to inf in x's shadow at the end of the gradient pass); heap: x an array of that
    many cells whose first element the products read (a program with a heap: its
    search runs a build that looks at the shadows)."""
    text, x, row = GRADIENT, 1e-300, "gradient"
    if heap:
        text = text.replace("import reversible", "import Array, reversible").replace(
            "x: float", "x: Array[float]").replace("x * ", "x[0] * ")
        x, row = np.zeros(heap), "gradient, an array" + (f" of {heap:,} cells" if heap > 1
                                                         else "")
        x[0] = 1e-300
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "f.py").write_text(text)
        g = rvm.grad(rvm.load(Path(tmp) / "f.py")["f"], loss="out", engine="native")
        times = {}
        for c in (1.0, 1e308, 1.0, 1e308):        # (each compiled before timing)
            best, what = float("inf"), "succeeds"
            for _ in range(3):
                t = time.perf_counter()
                try:
                    g(x, c, passes, 0.0)
                except rvm.RvmError as e:
                    what = str(e).split(";")[0]
                best = min(best, time.perf_counter() - t)
            times[c] = best, what
    (ok, _), (bad, what) = times[1.0], times[1e308]
    print(f"| {row} | succeeding | {ok:.4f} | 1.0 |")
    print(f"| {row} | failing (a gradient not finite) | {bad:.4f} | {bad / ok:.1f} |")
    print(f"|  | {what} | | |")


def timed(p, engine: str, end: float) -> tuple[float, str]:
    best, outcome = float("inf"), ""
    for _ in range(3):
        m = Machine(p, engine=engine, max_steps=10**10)
        m._grow(1 << 18)        # (room for the large heap: no native run to find it)
        counted = len(p.functions["spin"].params) == 5
        m.enter("spin", 0.0, end, 0.0, 0, *((int(end),) if counted else ()))
        t = time.perf_counter()
        try:
            m.run()
            outcome = "succeeds"
        except rvm.RvmError as e:
            outcome = f"fails at step {m.steps}: {e.message}"
        best = min(best, time.perf_counter() - t)
    return best, outcome


if __name__ == "__main__":
    if not native.available:
        sys.exit("needs the native engine (pip install 'rvm[fast]')")
    k = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000_000
    print(f"{k} passes, best of 3, native engine")
    print("| loop | run | seconds | ratio |\n|---|---|---|---|")
    for name, text in (("general", LOOP), ("counted", COUNTED),
                       ("general, a heap cell written", HEAP.replace("{cells}", "3")),
                       ("general, 4,096 cells", HEAP.replace("{cells}", "4096")),
                       ("general, 131,072 cells", HEAP.replace("{cells}", "131072"))):
        p = rvm.assemble(text.format(k=float(k)), "spin.rasm")
        timed(p, "native", 10.0)                # compiled before timing
        ok, _ = timed(p, "native", k + 700.0)
        bad, what = timed(p, "native", k + 800.0)
        print(f"| {name} | succeeding | {ok:.3f} | 1.0 |")
        print(f"| {name} | failing (a value not finite, seen late) | {bad:.3f} | "
              f"{bad / ok:.2f} |")
        print(f"|  | {what.splitlines()[0]} | | |")
    gradient_row(k // 50)
    gradient_row(k // 50, heap=1)
    gradient_row(k // 50, heap=100_000)
