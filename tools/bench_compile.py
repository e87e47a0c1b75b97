"""Where a first native compile's time goes, for programs tools/bench_coldstart.py times.

    python tools/bench_compile.py [PROGRAM ...]     # bessel, gmm, gmm_arrays (default: all)

Each program's first native gradient runs in a fresh process with an empty cache; its
LLVM IR module is kept as it goes to LLVM. The table gives the first call's time, the
front half's (bytecode to LLVM IR text: the first call less LLVM's part), LLVM's part of
the first call (for a large module, the quick code's: the optimised code is made on a
thread meanwhile, rvm.engines.llvm: Tier), the module's size (lines of IR, functions
defined) and the optimised code's LLVM time taken apart, on the same module again:
parsing the text, the optimisation passes, code generation; then LLVM's whole
time for the module without the bodies of the array instructions' helpers
(`rvm_array_*`, `rvm.gemm`, left as declarations), which gives their share. One core
(the process is pinned to the first core it may run on, where the system allows it).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GMM_FILE = ROOT.parent / "shared" / "data" / "adbench" / "gmm" / "1k" / "gmm_d10_K25.txt"
PROGRAMS = {
    "bessel": ("Bessel J_2, gradient", "import rvm\nfrom besselj import besselj\n"
               "rvm.grad(besselj, loss='out', engine='native')(0.0, 2, 1.0)"),
    "gmm": ("GMM example (scalar loops), gradient, 1k points, D = 10, K = 25",
            f"import gmm\ngmm.gradient(gmm.load({str(GMM_FILE)!r}), engine='native', "
            "threads=1)"),
    "gmm_arrays": ("GMM with array statements, gradient, the same input",
                   f"import gmm, gmm_arrays\ngmm_arrays.gradient(gmm.load({str(GMM_FILE)!r}), "
                   "engine='native')"),
}
HELPER = re.compile(r'^define internal [^@]*@"(rvm_array_\w+|rvm\.gemm)"', re.M)


def measure(body: str) -> dict:
    """In this process: the first call's figures (see the module's docstring)."""
    from rvm.engines import llvm
    modules, spent = [], []
    compile_ir = llvm._compile_ir

    def kept(text: str, quick: bool = False) -> bytes:
        t = time.perf_counter()
        out = compile_ir(text, quick)
        if quick or len(text) <= llvm.TIER_CHARS:   # (the first call's compile, not
            modules.append(text)                    # the optimised code a large
            spent.append(time.perf_counter() - t)   # module's Tier makes on a thread)
        return out
    llvm._compile_ir = kept
    t = time.perf_counter()
    exec(body, {})
    first = time.perf_counter() - t
    for tier in llvm._TIERS:        # (the optimised code, before LLVM is timed again)
        tier.done.wait()
    llvm._compile_ir = compile_ir
    ll, _, tm = llvm._llvm()
    parse = optimise = emit = 0.0
    for text in modules:        # (without the vector math prelude _compile_ir links in)
        t0 = time.perf_counter()
        mod = ll.parse_assembly(text)
        t1 = time.perf_counter()
        options = ll.create_pipeline_tuning_options(speed_level=2)
        options.slp_vectorization = True
        passes = ll.create_pass_builder(tm, options)
        passes.getModulePassManager().run(mod, passes)
        t2 = time.perf_counter()
        tm.emit_object(mod)
        parse, optimise, emit = (parse + t1 - t0, optimise + t2 - t1,
                                 emit + time.perf_counter() - t2)
    without = 0.0
    for text in modules:
        t = time.perf_counter()
        compile_ir(strip_helpers(text))
        without += time.perf_counter() - t
    return {"first": first, "llvm": sum(spent), "lines": sum(m.count("\n") for m in modules),
            "tiered": any(len(m) > llvm.TIER_CHARS for m in modules),
            "functions": sum(m.count("\ndefine ") for m in modules), "parse": parse,
            "optimise": optimise, "emit": emit, "without_helpers": without,
            "helpers": sum(len(HELPER.findall(m)) for m in modules)}


def strip_helpers(text: str) -> str:
    """The module with the array helpers' bodies taken out (each left declared)."""
    out, skipping = [], False
    for line in text.split("\n"):
        if skipping:
            skipping = line != "}"
        elif HELPER.match(line):
            out.append("declare" + line[len("define internal"):])
            skipping = True
        else:
            out.append(line)
    return "\n".join(out)


def run(name: str) -> dict:
    """measure() of a program in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, RVM_CACHE_DIR=cache,
                   PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples")]))
        command = [sys.executable, __file__, "--one", name]
        if hasattr(os, "sched_getaffinity") and shutil.which("taskset"):
            command = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *command]
        r = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
        return json.loads(r.stdout.splitlines()[-1])


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        import rvm  # noqa: F401     (the first call's time leaves importing rvm out)
        print(json.dumps(measure(PROGRAMS[sys.argv[2]][1])))
        return
    names = sys.argv[1:] or list(PROGRAMS)
    print("| program | first call, s | front half, s | LLVM, s | IR lines (functions) | "
          "optimised code, LLVM: parse / optimise / code, s | LLVM without the array "
          "helpers, s |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        if name.startswith("gmm") and not GMM_FILE.exists():
            continue
        f = run(name)
        helpers = f"{f['without_helpers']:.2f} ({f['helpers']} helpers)" if f["helpers"] \
            else "(none)"
        llvm = f"{f['llvm']:.2f}" + (" (quick code)" if f["tiered"] else "")
        print(f"| {PROGRAMS[name][0]} | {f['first']:.2f} | {f['first'] - f['llvm']:.2f} | "
              f"{llvm} | {f['lines']:,} ({f['functions']}) | {f['parse']:.2f} / "
              f"{f['optimise']:.2f} / {f['emit']:.2f} | {helpers} |")


if __name__ == "__main__":
    main()
