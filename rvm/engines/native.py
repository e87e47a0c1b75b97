"""The native engine's front half: the compiled engine's generated functions, prepared
for native code, and the host side of running them (an optional extra:
pip install 'rvm[fast]', which brings llvmlite).

The source is the compiled engine's (written for native code: typed, its int arithmetic
left to wrap as int64 does), with its checks folded into one flag (defer_checks);
parsed, the machine's operations become native code's helpers over the heap as numpy
arrays (int64 and float64 views of one buffer, gradient shadows, and the state array
holding the top of the heap, the run's remaining step budget and where a run failed:
rvm.engines.templates.STATE), and failed checks raise a constant message
(rvm.engines.lowering: MachineOperations): the machine then re-runs the pass on the
interpreter to report the exact instruction (as for the compiled engine).
rvm.engines.llvm lowers that source to LLVM IR and machine code; Functions asks it for
each group of entries on first need. This module also holds the batch threading and the
compile status line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import re
import sys
import threading

from .templates import straighten

# the native engine is optional (llvmlite, imported only when a program is compiled)
available = importlib.util.find_spec("llvmlite") is not None

_FAULT = re.compile(r"^(\s*)if (not \((.*)\)|(.*)): raise Fault\(f?(['\"]).*\5\)$")
_LEAVES = ("if ", "while ", "_b = ", "break", "return", "M.budget = ", "M.said(")
# a call that is passed the heap may move its top (ALLOC, FREE, PUSH, POP, the array
# instructions, a call): the top of the heap, read by every address check, is kept in
# the local T0 and read again only after those (a store to a heap cell could alias the
# state array, so LLVM would load it again after every store)
_MOVES_TOP = re.compile(r"\bM\.(?:alloc|free|push|pop|gpush|gpop|v\w+)\(|\w\(M, ")
_WORDS = re.compile(r"\b(?:and|or|not)\b")     # (a condition's own words)


def defer_checks(source: str) -> str:
    """The generated functions with their invertibility checks folded into one flag.

    Each check (`if not (c): raise Fault(...)`) becomes `_ok &= c`, with no branch, and
    the flag is tested once before control leaves a straight run of code (a branch, a
    block change, a call, a return). A memory access whose address check fails reads
    and writes cell 0 instead (the address is multiplied by the check), so nothing
    outside the heap is touched. A failed check only ever ends the run in an error,
    which the machine answers by re-running the pass on the interpreter from the saved
    state, so the checks may be late. Every check as a branch was two basic blocks, and
    a compiler's analyses grow faster than a function's blocks: folded, large programs
    compiled several times faster.
    """
    out: list[str] = []
    lines = straighten(source.split("\n"))
    dirty = mask = False
    for k, line in enumerate(lines):
        stripped = line.lstrip()
        ind = line[:len(line) - len(stripped)]
        m = _FAULT.match(line)
        if m:       # (made branch-free once parsed: rvm.engines.lowering.MachineOperations)
            cond = m.group(3) if m.group(3) is not None else f"not ({m.group(4)})"
            if not re.search(r"[A-Za-z_]", _WORDS.sub("", cond)) and \
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
            # (the fault flags and the heap top's local, declared: see compiled.TYPES)
            out += [line, f"{ind}    _ok: bool", f"{ind}    _m: bool", f"{ind}    T0: int",
                    f"{ind}    _ok = True", f"{ind}    _m = True", f"{ind}    T0 = TOP[0]"]
            dirty = False
            continue
        out.append(line)
        if _MOVES_TOP.search(stripped):
            out.append(f"{ind}T0 = TOP[0]")
    return "\n".join(out)


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


THREAD_ROWS = 4096      # rows per thread, at least, before a batch is split across cores


@functools.cache
def _cores() -> int:
    import os
    if hasattr(os, "sched_getaffinity"):    # the cores this process may run on (taskset,
        return len(os.sched_getaffinity(0)) or 1    # a container's CPU set)
    return os.cpu_count() or 1      # (about 6 us a call on some systems: asked once)


def on_threads(loop, n: int, head: tuple, inputs: list, middle: tuple, outputs: list):
    """Run a native batch loop (compiled without the GIL) over rows 0..n-1, split into
    contiguous slices, one per core: this thread takes the first, worker threads (started
    once) the others; rows are independent, and each slice writes only its own rows of
    the outputs (an output may be None: not wanted)."""
    from . import llvm
    llvm.interrupts()           # Ctrl-C stops the loop (all its slices)
    llvm.clear_interrupt()
    threads = 0 if n < 2 * THREAD_ROWS else min(_cores(), n // THREAD_ROWS)
    if threads < 2:
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


class Functions(dict):
    """A program's native functions by name, each compiled by the LLVM back end
    (rvm.engines.llvm) on the first call that asks for it, with those like it: a run mode
    of one function (`F3_fw`, `F3_bw`, `F3_gfw`) alone; a function's gradient group (see
    gradient) together; one batch loop alone. Each group is made of only the generated
    functions its entries run (a call never waits for the gradient's code, nor a gradient
    for the uncall's) and cached on disk on its own."""

    def __init__(self, compiled, tol: float):
        super().__init__()
        self.compiled, self.tol = compiled, tol
        self.fused, self.batches, self.lock = {}, {}, threading.RLock()
        names = [(compiled.name(f, "fw"), compiled.name(f, "gbw"), f)
                 for f in compiled.program.functions]
        # a compute-copy-uncompute function: forward to the copy, gradient pass from
        # there (rvm.engines.compiled.split_point)
        splits = {f: ((compiled.name(f, "fws"), compiled.name(f, "gbws"))
                      if f in compiled.splits else (fw, gbw), compiled.splits.get(f, 0))
                  for fw, gbw, f in names}
        tails = {f: compiled.tails.get(f, 0) for _, _, f in names}   # (budget tests)
        self.fused = {compiled.name(f, "vg"): (*splits[f][0], False, splits[f][1], tails[f])
                      for _, _, f in names}
        if not compiled.uses_heap and not compiled.statements:   # (output: the machine's
            for fw, gbw, f in names:                                # state array holds it)
                (fws, gbws), split = splits[f]
                self.fused[compiled.name(f, "vgs")] = (fws, gbws, True, split, tails[f])
                bw = compiled.name(f, "bw")
                self.batches.update({compiled.name(f, "csb"): ("csb", fw, gbw, 0),
                                     compiled.name(f, "usb"): ("usb", bw, gbw, 0),
                                     compiled.name(f, "vgsb"): ("vgsb", fws, gbws, split,
                                                                tails[f]),
                                     compiled.name(f, "jsb"): ("jsb", fws, gbws, split,
                                                               tails[f])})

    def llvm(self, runs: tuple, fused: dict, batches: dict) -> None:
        """Compile and add the LLVM back end's entries: Run entries for the generated
        functions `runs`, `fused` and the batch loops `batches`."""
        from . import llvm
        with announced(self.compiled.program.source or "a program"), \
                contextlib.suppress(llvm.Unsupported):
            # keyed by the program and the code generator: a program found in the cache
            # is never written out (seconds for a large one)
            comp = self.compiled
            # (the build that searches looks at the shadows where any function returns
            # and before one is dropped: see rvm.ad.gradient.not_finite)
            self.update(llvm.functions(comp.native_text, fused, batches, self.tol,
                                       runs=runs, key=comp.key, kinds=comp.param_kinds(),
                                       looks=comp.looks, resume=comp.resume))

    def gradient(self, fname: str, forward: bool = True) -> None:
        """Compile function fname's gradient group, if not made yet: what a gradient's
        direct calls run, with the forward run the gradient's first, general call makes
        on the machine (`forward`: a forward run asks; the plan of scalars only makes
        none, rvm.ad.gradient: _Direct.fused). Scalars only: one fused call forwards and
        back (vgs). With the heap (or output statements): the passes the direct calls
        with arrays make (forwards, or to the copy of a compute-copy-uncompute function,
        then the gradient pass from there), and both in one fused call (vg). Anything
        else is compiled when asked for."""
        comp = self.compiled
        if comp.name(fname, "vgs") in self.fused:     # (see __init__: which programs)
            modes, fused = ("fw",) if forward else (), {comp.name(fname, "vgs")}
        else:
            modes = (("fw",) if forward else ()) + ("fws", "gbws") \
                if fname in comp.splits else ("fw", "gbw")
            fused = {comp.name(fname, "vg")}
        with self.lock:
            if not all(n in self for n in fused):
                self.llvm(tuple(comp.name(fname, m) for m in modes),
                          {n: self.fused[n] for n in fused}, {})

    def __missing__(self, name: str):
        with self.lock:             # (threads asking at once share one compile)
            if name not in self:
                comp = self.compiled
                head, _, mode = name.partition("_")
                fname = comp._by_id.get(head)
                if name in self.batches:        # (kept until made: a compile stopped by
                    self.llvm((), {}, {name: self.batches[name]})    # Ctrl-C is redone)
                    del self.batches[name]
                elif fname is not None and mode in ("fw", "bw"):
                    self.llvm((name,), {}, {})
                elif fname is not None and (mode in ("fws", "gbws") or name in self.fused
                                            or (mode == "gbw" and fname not in comp.splits)):
                    self.gradient(fname, forward=False)
                    if name not in self:        # not among the gradient group's
                        self.llvm(() if name in self.fused else (name,),
                                  {name: self.fused[name]} if name in self.fused else {},
                                  {})
                elif fname is not None and mode in ("gfw", "gbw"):
                    self.llvm((name,), {}, {})
            if name not in self:       # (dict's [] would come back here)
                raise KeyError(name)
            return self.get(name)
