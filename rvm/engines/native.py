"""The native engine: the compiled engine's generated functions, compiled to machine code
(an optional extra: pip install 'rvm[fast]', which brings numba and its llvmlite).

The source is the compiled engine's, rewritten for native code: the heap becomes numpy
arrays (int64 and float64 views of one buffer, gradient shadows, and a two-element array
holding the top of the heap and the run's remaining step budget); int64 arithmetic wraps
natively; checks are folded into one flag (defer_checks); failed checks raise a constant
message, and the machine then re-runs the pass on the interpreter to report the exact
instruction (as for the compiled engine). rvm.engines.llvm lowers that source to LLVM IR
itself (the default: Functions); this module also compiles it with numba (RVM_LLVM=0),
and holds what both share: the rewrite, the heap helpers' reference source, the batch
threading and the compile status line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
import sys

from .templates import Fault, dpow_db, sign, straighten

# the native engine is optional; numba is imported only when a program is compiled
available = importlib.util.find_spec("numba") is not None

_REWRITES = [
    (re.compile(r"(\S+) = _v if -9223372036854775808 <= _v <= 9223372036854775807 "
                r"else wrap\(_v\)"), r"\1 = _v"),
    (re.compile(r"raise Fault\(f?(['\"]).*\1\)$"), "raise Fault('invertibility check failed')"),
    (re.compile(r"raise Limit\((['\"]).*\1\)$"), "raise Fault('step budget exhausted')"),
    (re.compile(r"M\.alloc\("), "alloc(HI, TOP, "),
    (re.compile(r"M\.free\("), "free(HI, HF, HG, TOP, "),
    (re.compile(r"M\.push\((f\w*)\)"), r"push(HF, TOP, \1)"),
    (re.compile(r"M\.push\((r\w*)\)"), r"push(HI, TOP, \1)"),
    (re.compile(r"M\.pop\(True\)"), "pop(HF, HI, TOP)"),
    (re.compile(r"M\.pop\(False\)"), "pop(HI, HI, TOP)"),
    (re.compile(r"M\.gpush\("), "gpush(HF, HG, TOP, "),
    (re.compile(r"M\.gpop\(True\)"), "gpop(HI, HF, HG, TOP)"),
    (re.compile(r"M\.hf\b"), "HF"), (re.compile(r"M\.hi\b"), "HI"),
    (re.compile(r"M\.hg\b"), "HG"), (re.compile(r"M\.top\b"), "T0"),
    (re.compile(r"M\.budget\b"), "TOP[1]"), (re.compile(r"M\.tol\b"), "TOL"),
    (re.compile(r"zero\("), "zero(TOL, "),
    (re.compile(r"\(M, "), "(HI, HF, HG, TOP, "),
    (re.compile(r"math\.fmod\("), "np.fmod("),          # numba has no math.fmod
]


def rewrite(line: str) -> str:
    for pattern, repl in _REWRITES:
        line = pattern.sub(repl, line)
    return line


_FAULT = re.compile(r"^(\s*)if (not \((.*)\)|(.*)): raise Fault\('invertibility check "
                    r"failed'\)$")
_LEAVES = ("if ", "while ", "_b = ", "break", "return", "TOP[1] = ")
# a call that is passed the heap top may move it (ALLOC, FREE, PUSH, POP, a call): the
# top of the heap, read by every address check, is kept in the local T0 and read again
# only after those (an array store could alias TOP, so numba would reload it every time)
_MOVES_TOP = re.compile(r"\w\(.*\bTOP[,)]")


def _bitwise(cond: str) -> str:
    """A condition without short-circuit jumps: `and`/`or` and chained comparisons become
    `&`/`|` of the parts (all side-effect free register arithmetic)."""
    import ast

    class Flat(ast.NodeTransformer):
        def visit_BoolOp(self, node):
            self.generic_visit(node)
            op = ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr()
            out = node.values[0]
            for v in node.values[1:]:
                out = ast.BinOp(out, op, v)
            return out

        def visit_Compare(self, node):
            self.generic_visit(node)
            if len(node.ops) == 1:
                return node
            lefts = [node.left, *node.comparators]
            parts = [ast.Compare(a, [o], [b]) for a, o, b in zip(lefts, node.ops, lefts[1:])]
            out = parts[0]
            for part in parts[1:]:
                out = ast.BinOp(out, ast.BitAnd(), part)
            return out
    return ast.unparse(Flat().visit(ast.parse(cond, mode="eval")))


def defer_checks(source: str) -> str:
    """The generated functions with their invertibility checks folded into one flag.

    Each check (`if not (c): raise Fault(...)`) becomes `_ok &= c`, with no branch, and
    the flag is tested once before control leaves a straight run of code (a branch, a
    block change, a call, a return). A memory access whose address check fails reads
    and writes cell 0 instead (the address is multiplied by the check), so nothing
    outside the heap is touched. A failed check only ever ends the run in an error,
    which the machine answers by re-running the pass on the interpreter from the saved
    state, so the checks may be late. numba's analyses are quadratic in a function's
    basic blocks, and every check was two of them: this makes large programs compile
    several times faster.
    """
    out: list[str] = []
    lines = straighten(source.split("\n"))
    dirty = mask = False
    for k, line in enumerate(lines):
        stripped = line.lstrip()
        ind = line[:len(line) - len(stripped)]
        m = _FAULT.match(line)
        if m:
            cond = _bitwise(m.group(3)) if m.group(3) is not None \
                else f"not ({_bitwise(m.group(4))})"
            if not re.search(r"[A-Za-z_]", cond.replace("not", "")) and \
                    eval(cond, {"__builtins__": {}}):   # holds on constants: nothing to do
                continue
            if k + 1 < len(lines) and lines[k + 1].lstrip().startswith("_a = "):
                out.append(f"{ind}_m = {cond}")
                out.append(f"{ind}_ok &= _m")
                mask = True
            else:
                out.append(f"{ind}_ok &= {cond}")
            dirty = True
            continue
        if stripped == "_m = True":     # checked on a counted loop's entry
            out.append(line)
            mask = True
            continue
        if stripped.startswith("_a = "):
            if not mask:        # never: an unmasked address could reach outside the heap
                raise AssertionError(f"heap address without its check: {stripped}")
            line = f"{ind}_a = ({stripped[5:]}) * _m"
        elif dirty and (stripped.startswith(_LEAVES) or re.match(r"[\w, ]+= F\d+_", stripped)):
            out.append(f"{ind}if not _ok: raise Fault('invertibility check failed')")
            dirty = False
        mask = False
        if stripped.startswith("def "):
            out += [line, f"{ind}    _ok = True", f"{ind}    _m = True",
                    f"{ind}    T0 = TOP[0]"]
            dirty = False
            continue
        out.append(line)
        if _MOVES_TOP.search(stripped):
            out.append(f"{ind}T0 = TOP[0]")
    return "\n".join(out)


# Heap helpers, mirroring rvm.engines.machine.Machine (capacity is the arrays' length).
# They are source for the generated module, compiled with the program's functions (TOL is
# the module's tolerance).
def alloc(HI, TOP, n):
    base = TOP[0]
    if n < 0 or n > HI.shape[0] - base:          # (base + n could overflow)
        raise Fault("heap capacity exceeded")
    TOP[0] = base + n
    return base


def free(HI, HF, HG, TOP, d, n):
    if n < 0 or d != TOP[0] - n:
        raise Fault("FREE of a block that is not the top block")
    for c in range(d, TOP[0]):
        if HI[c] != 0 and not (2.2250738585072014e-308 <= abs(HF[c]) <= TOL):  # noqa: F821
            raise Fault("FREE of a cell that is not zero")
    for c in range(d, TOP[0]):
        HI[c] = 0
        HG[c] = 0.0
    TOP[0] = d


def push(view, TOP, v):
    """Push v onto the heap top through view (the int64 or the float64 view)."""
    if TOP[0] >= view.shape[0]:
        raise Fault("heap capacity exceeded")
    view[TOP[0]] = v
    TOP[0] += 1


def pop(view, HI, TOP):
    """Pop the heap top through view, leaving the cell zero."""
    if TOP[0] == 0:
        raise Fault("POP from an empty heap")
    TOP[0] -= 1
    v = view[TOP[0]]
    HI[TOP[0]] = 0
    return v


def gpush(HF, HG, TOP, v, g):
    push(HF, TOP, v)
    HG[TOP[0] - 1] = g


def gpop(HI, HF, HG, TOP):
    g = HG[TOP[0] - 1] if TOP[0] > 0 else 0.0
    v = pop(HF, HI, TOP)
    HG[TOP[0]] = 0.0
    return v, g


def zero(tol, v):
    return abs(v) <= tol


def wrap(v):
    return v


HELPERS = (alloc, free, push, pop, gpush, gpop, zero, wrap, sign, dpow_db)
PRELUDE = """\
# generated by rvm: one program's native functions (numba), cached by rvm.engines.cache
import math

import numba
import numpy as np

from rvm.engines.templates import Fault

TOL = {tol!r}
_jit = numba.njit(cache={cache})
_jit_nogil = numba.njit(cache={cache}, nogil=True)     # batch loops, run on several threads

"""


@contextlib.contextmanager
def compiling(what: str, dispatcher):
    """Around a call that may compile `dispatcher` (its first call): if that takes over a
    second, say so on stderr (a terminal only), so a long compile is never a silent stall."""
    if id(dispatcher) in _COMPILED or getattr(dispatcher, "signatures", True):
        yield
        return
    try:
        with announced(what):
            yield
    finally:
        _COMPILED.add(id(dispatcher))


@contextlib.contextmanager
def announced(what: str):
    """Around a compile of `what`: a status line on stderr (a terminal only) once it has
    taken a second."""
    if not sys.stderr.isatty():
        yield
        return
    status = []

    def show():
        from rich.console import Console
        s = Console(stderr=True).status(f"compiling {what} to native code "
                                        "(once per machine: it is cached)")
        s.start()
        status.append(s)
    import threading
    timer = threading.Timer(1.0, show)
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        for s in status:
            s.stop()


_COMPILED: set[int] = set()          # dispatchers past their first call


THREAD_ROWS = 4096      # rows per thread, at least, before a batch is split across cores


@functools.cache
def _cores() -> int:
    import os
    return os.cpu_count() or 1      # (about 6 us a call on some systems: asked once)


def on_threads(loop, n: int, head: tuple, inputs: list, middle: tuple, outputs: list):
    """Run a native batch loop (compiled without the GIL) over rows 0..n-1, split into
    contiguous slices, one per core: this thread takes the first, worker threads (started
    once) the others; rows are independent, and each slice writes only its own rows of
    the outputs (an output may be None: not wanted). A numba loop not compiled yet runs
    whole on this thread (its first call compiles it)."""
    from . import llvm
    llvm.interrupts()           # Ctrl-C stops the loop (all its slices)
    llvm.clear_interrupt()
    threads = 0 if n < 2 * THREAD_ROWS else min(_cores(), n // THREAD_ROWS)
    if threads < 2 or not getattr(loop, "signatures", None):
        loop(*head, *inputs, *middle, *outputs)
        return
    cuts = [n * k // threads for k in range(threads + 1)]

    def part(k):
        a, b = cuts[k], cuts[k + 1]
        loop(*head, *(x[a:b] for x in inputs), *middle,
             *(None if y is None else y[a:b] for y in outputs))
    futures = [_pool().submit(part, k) for k in range(1, threads)]
    try:
        part(0)               # this thread takes the first slice
    finally:
        for f in futures:
            f.result()        # re-raises a slice's error


@functools.cache
def _pool():
    """Worker threads for on_threads, started once (starting them per batch cost about
    a millisecond)."""
    from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor(max(1, _cores() - 1), thread_name_prefix="rvm-batch")


@functools.cache
def helpers_source() -> str:
    """The helpers' source text (read from this file once, when first needed)."""
    import inspect
    return "\n\n".join(inspect.getsource(f) for f in HELPERS)


def module_source(functions_source: str, names: list[str], tol: float, cache: bool) -> str:
    """The text of a module defining the helpers and the generated functions, each
    wrapped by numba.njit (compiled lazily, on a function's first call)."""
    helpers = helpers_source()
    # numba runs every loop by its general code: a counted loop's entry test would be in
    # wrapping int64 arithmetic here (rvm.engines.lowering.counted makes it exact)
    functions_source = re.sub(r"\bif _exact\(.*\):$", "if False:", functions_source,
                              flags=re.M)
    functions_source = re.sub(r"\b_finite_after\((range\(.*\))\):$", r"\1:",
                              functions_source, flags=re.M)
    jits = "\n".join(f"{f.__name__} = _jit({f.__name__})" for f in HELPERS)
    tail = "\n".join(f"{name} = _jit{'_nogil' if name.endswith('sb') else ''}({name})"
                     for name in names)
    return (PRELUDE.format(tol=tol, cache=cache) + helpers + "\n\n" + jits + "\n\n" +
            functions_source + "\n" + tail + "\n")


class Functions(dict):
    """A program's native functions by name: its run modes and fused gradients from the
    LLVM back end, compiled at once (rvm.engines.llvm: a fraction of numba's compile
    time), its batch loops likewise on the first that is asked for; with RVM_LLVM=0
    numba's, the module built on first need."""

    def __init__(self, compiled, tol: float):
        super().__init__()
        self.compiled, self.tol, self.numba, self.batches = compiled, tol, None, {}
        from . import llvm
        if llvm.usable():
            names = [(compiled.name(f, "fw"), compiled.name(f, "gbw"), f)
                     for f in compiled.program.functions]
            # a compute-copy-uncompute function: forward to the copy, gradient pass from
            # there (rvm.engines.compiled.split_point)
            splits = {f: ((compiled.name(f, "fws"), compiled.name(f, "gbws"))
                          if f in compiled.splits else (fw, gbw), compiled.splits.get(f, 0))
                      for fw, gbw, f in names}
            fused = {compiled.name(f, "vg"): (*splits[f][0], False, splits[f][1])
                     for _, _, f in names}
            if not compiled.uses_heap:
                for fw, gbw, f in names:
                    (fws, gbws), split = splits[f]
                    fused[compiled.name(f, "vgs")] = (fws, gbws, True, split)
                    bw = compiled.name(f, "bw")
                    self.batches.update({compiled.name(f, "csb"): ("csb", fw, gbw, 0),
                                         compiled.name(f, "usb"): ("usb", bw, gbw, 0),
                                         compiled.name(f, "vgsb"): ("vgsb", fws, gbws, split),
                                         compiled.name(f, "jsb"): ("jsb", fws, gbws, split)})
            self.llvm(fused, {})

    def llvm(self, fused: dict, batches: dict) -> None:
        """Add the LLVM back end's entries: the run modes and `fused` when `batches` is
        empty, else only those batch loops (each compiled on the first rvm.vmap that runs
        it: a call or a gradient does not wait for them)."""
        from . import llvm
        # (never with the llvmlite that numba installs: then numba's path)
        failed = (llvm.Unsupported, ImportError, AttributeError, RuntimeError)
        with announced(self.compiled.program.source or "a program"), \
                contextlib.suppress(*failed):
            # keyed by the program and the code generator: a program found in the cache
            # is never written out as source (seconds for a large one)
            comp = self.compiled
            self.update(llvm.functions(lambda: comp.native_bodies, fused, batches, self.tol,
                                       runs=not batches, key=comp.key,
                                       names=comp.body_names(), kinds=comp.param_kinds()))

    def __missing__(self, name: str):
        if name in self.batches:        # only the loop asked for (rows in lockstep make
            self.llvm({}, {name: self.batches.pop(name)})   # each a second's compile)
            if name in self:
                return self[name]
        if self.numba is None:
            from .llvm import safe_codegen
            with contextlib.suppress(ImportError, AttributeError):
                safe_codegen()          # numba's LLVM is ours (see there)
            self.numba = build(*self.compiled.native_source(), self.tol)
        return self.numba[name]


def build(functions_source: str, names: list[str], tol: float) -> dict:
    """numba dispatchers, by name, for generated functions (module-level defs): from a
    module in the on-disk cache, whose machine code numba keeps beside it, so a program
    compiles once per machine; in memory when the cache directory is not writable."""
    if not available:
        raise ImportError("numba is not installed")
    from . import cache
    module = cache.load(lambda cached: module_source(functions_source, names, tol, cached))
    return {name: getattr(module, name) for name in names}
