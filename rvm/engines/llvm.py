"""The native engine's back end: LLVM IR written straight from the generated functions.

The functions rvm generates need no general compiler's front end (type inference): every
local is declared with its type (`r3: int` an int64, `f3: float` and `gf3: float` a
float64, `_ok: bool` a flag: rvm.engines.compiled.TYPES), and the statements are a small
fixed subset of Python (assignments, if/while/break/continue, heap cells and helpers,
calls of other generated functions, `raise Fault`). rvm.engines.lowering lowers that
subset to LLVM IR with llvmlite (rvm.engines.lanes: for rows in lockstep); this module
adds the entries, optimises the module with LLVM's -O2 pipeline and keeps the machine
code in the on-disk cache as an object file. Entries (made in groups, each on first
need: rvm.engines.native.Functions): the run modes of the generated functions, the fused
value-and-gradient calls (vg; vgs for programs without heap) and the batch loops of
rvm.vmap (csb, usb, vgsb, jsb), each a CPython builtin that unboxes its arguments and
boxes its results itself.

Semantics (the functions as rvm.engines.native prepares them): int64 arithmetic wraps; a
failed check, a non-finite float result, an exhausted step budget, an integer division
by zero sets a fault code and returns, and the machine re-runs
the pass on the interpreter to report it ("heap capacity exceeded" grows the heap first).
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import ctypes
import functools
import importlib.util
import os
import pathlib
import re
import sys
import threading

import numpy as np

from . import blas, vectormath
from .arraylowering import BLAS_DOT, BLAS_GEMM
from .lowering import (
    AT_END,
    BUDGET,
    CHECKPOINT,
    FAULT,
    FORWARD_CELLS,
    FRAME_REGISTER,
    FULL,
    INTERRUPT,
    INTERRUPT_CELL,
    MESSAGES,
    POW,
    RECORD,
    SNAP_ROOM,
    SNAP_SPACING,
    Lowering,
    Types,
    Unsupported,
    assigned_by,
    budget_test,
    callees,
    declared,
    end_shadows,
    guard,
    loop_over,
    name_id,
    native_tree,
    reaching,
    returns_of,
    running_out,
    snapshot_cells,
    writes_heap,
)
from .templates import (
    LAST,
    LEFT,
    NO_STOP,
    NOW,
    ROOT,
    SHADOWS,
    SHADOWS_BAD,
    SNAP,
    STATE,
    STOP,
    Fault,
)

available = importlib.util.find_spec("llvmlite") is not None


def usable() -> bool:
    """Is llvmlite installed, and recent enough (LLVM's new pass manager)?"""
    return available and _recent()


@functools.cache
def _recent() -> bool:
    try:
        import llvmlite.binding as ll
    except ImportError:
        return False
    with contextlib.suppress(RuntimeError):     # older llvmlite must be initialised
        ll.initialize()
    return hasattr(ll, "create_pass_builder")




IRTEXT = os.environ.get("RVM_IRTEXT", "1") != "0"     # 0: llvmlite.ir (to compare)


@functools.cache
def _llvm():
    """llvmlite, initialised once, and a target machine for this CPU."""
    import llvmlite.binding as ll
    if IRTEXT:      # LLVM IR written as text (rvm.engines.irtext), not llvmlite.ir's objects
        from . import irtext as ir
    else:
        import llvmlite.ir as ir
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    safe_codegen()
    # native loops poll this cell (rvm.engines.lowering: poll); SIGINT sets it (interrupts)
    ll.add_symbol(INTERRUPT_CELL, ctypes.addressof(_INTERRUPTED))
    ll.add_symbol(POW, ctypes.cast(_libm().pow, ctypes.c_void_p).value)    # x ** y
    ll.add_symbol(BLAS_GEMM, blas.gemm_address())   # the array instructions' products
    ll.add_symbol(BLAS_DOT, blas.dot_address())
    return ll, ir, _target_machine()


def _libm():
    """The C library's math functions, as Python's math module calls them."""
    import ctypes.util
    return ctypes.CDLL(ctypes.util.find_library("m") or None)


_SIGNALS = sys.platform.startswith(("linux", "darwin"))    # (native code's SIGINT handler)
_INTERRUPTED = ctypes.c_int64(0)        # set by the SIGINT handler below; cleared by entries
_CHAINED = ctypes.c_void_p(0)           # the C handler it replaced (Python's), called after
_RESTORE: list = []                     # (puts that handler back at exit)
_HANDLER_IR = f"""
@{INTERRUPT_CELL} = external global i64
@rvm_chained = external global void (i32)*
define void @rvm_on_sigint(i32 %sig) {{
  store atomic i64 1, i64* @{INTERRUPT_CELL} monotonic, align 8
  %next = load void (i32)*, void (i32)** @rvm_chained
  %at = ptrtoint void (i32)* %next to i64
  %real = icmp ugt i64 %at, 1
  br i1 %real, label %chain, label %done
chain:
  call void %next(i32 %sig)
  br label %done
done:
  ret void
}}
"""


@functools.cache
def _handler() -> tuple:
    """The C-level SIGINT handler (compiled once): it sets the interrupt cell, then calls
    the handler it replaced (Python's, which raises KeyboardInterrupt once the native call
    is back); with libc's sigaction."""
    ll = _llvm()[0]
    ll.add_symbol("rvm_chained", ctypes.addressof(_CHAINED))
    with _LLVM_LOCK:
        engine = ll.create_mcjit_compiler(ll.parse_assembly(_HANDLER_IR), _target_machine())
        engine.finalize_object()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sigaction.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    return engine, engine.get_function_address("rvm_on_sigint"), libc.sigaction


def clear_interrupt() -> None:
    """Forget a SIGINT that came before (before the slices of a batch start, which do not
    clear it themselves: one starting late would miss a SIGINT the others stopped for)."""
    _INTERRUPTED.value = 0


def interrupts() -> None:
    """Let SIGINT (Ctrl-C) stop native code: where Python's own handler is in place
    (KeyboardInterrupt), put a C handler before it that also sets the cell native loops
    poll (a native run holds no GIL, so Python's handler alone runs only after it). The
    run then ends with the INTERRUPT code, and KeyboardInterrupt is raised. Checked before
    each native run (Python's signal.signal puts its own handler back in place of ours:
    then the program's handler is left alone). Linux and macOS: elsewhere, nothing."""
    import signal
    if not _SIGNALS or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    with contextlib.suppress(Exception):
        _, ours, sigaction = _handler()
        old = ctypes.create_string_buffer(256)     # a struct sigaction: the handler first
        if sigaction(signal.SIGINT, None, old) != 0:
            return
        handler = ctypes.c_void_p.from_buffer(old).value or 0
        if handler == ours or handler <= 1:         # ours already, or SIG_DFL / SIG_IGN
            return
        _CHAINED.value = handler
        new = ctypes.create_string_buffer(old.raw, 256)    # the same flags and mask
        ctypes.c_void_p.from_buffer(new).value = ours
        if sigaction(signal.SIGINT, new, None) == 0 and not _RESTORE:
            import atexit

            def restore():      # Python's own back before the handler's code is freed
                now = ctypes.create_string_buffer(256)
                if sigaction(signal.SIGINT, None, now) == 0 and \
                        ctypes.c_void_p.from_buffer(now).value == ours:
                    ctypes.c_void_p.from_buffer(now).value = _CHAINED.value
                    sigaction(signal.SIGINT, now, None)
            _RESTORE.append(restore)
            atexit.register(restore)


@functools.cache
def safe_codegen() -> None:
    """Turn off LLVM's early (before register allocation) tail duplication, for every
    compile in this process (and any other user of llvmlite's LLVM in it). In the LLVM
    that llvmlite ships (up to 22.1) it can miscompile a loop whose phis take each
    other's values (two registers swapped on a back edge): the swap's copies were made
    twice on one path,
    and a random program gave wrong results (LLVM's fix: "[TailDuplicator] Fix
    miss-compile with PHI referencing each other in TailBB"). The later tail duplication,
    after register allocation, still runs."""
    import llvmlite.binding as ll
    ll.set_option("rvm", "-disable-early-taildup")


def _target_machine(opt: int = 2):
    """A target machine for this CPU (an execution engine owns, and frees, its own)."""
    import llvmlite.binding as ll
    return ll.Target.from_default_triple().create_target_machine(
        cpu=ll.get_host_cpu_name(), features=ll.get_host_cpu_features().flatten(), opt=opt,
        codemodel="jitdefault")


def _signature(ir, t: Types, node: ast.FunctionDef):
    params = [a.arg for a in node.args.args[4:]]        # after HI, HF, HG, TOP
    returns = returns_of(node)
    types = declared(node)
    for name in params + returns:
        if t.of(types.get(name)) is None:
            raise Unsupported(f"a parameter of undeclared type: {name}")
    # (a gradient function's float locals' shadows after its results: end_shadows)
    ret = ir.LiteralStructType([t.of(types[n]) for n in returns + end_shadows(node)])
    heap = [t.ptr, t.ptr, t.ptr, t.fptr, t.i64]     # state, fault flag, HI, HG, capacity
    return ir.FunctionType(ret, heap + [t.of(types[n]) for n in params]), params, returns


def _py_function(ir, t: Types, module, name: str):
    """`rvm_py_<name>`, a CPython function (METH_FASTCALL: self, argument vector, argument
    count) and a builder at its entry; with `api` (CPython's functions), `address(k, ty)`
    (argument k, a Python int, as a pointer of type ty) and `checked()`, which returns
    NULL from the function where converting the arguments raised a Python error."""
    o = ir.IntType(8).as_pointer()
    api = functools.partial(_api, ir, t, module)
    fn = ir.Function(module, ir.FunctionType(o, [o, o.as_pointer(), t.i64]), f"rvm_py_{name}")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    if INTERRUPT_CELL not in module.globals:
        ir.GlobalVariable(module, t.i64, INTERRUPT_CELL)
    argv = fn.args[1]
    item = lambda k: b.load(b.gep(argv, [t.i64(k)]))
    address = lambda k, ty: b.bitcast(b.call(api("PyLong_AsVoidPtr"), [item(k)]), ty)

    def checked():
        null = fn.append_basic_block("null")
        with b.goto_block(null):
            b.ret(ir.Constant(o, None))
        guard(b, b.icmp_unsigned("!=", b.call(api("PyErr_Occurred"), []),
                                  ir.Constant(o, None)), null)
    return fn, b, api, item, address, checked


def _entry(ir, t: Types, module, name: str, inner, returns: list[str], fused=None,
           shadows: list[str] = ()):
    """`rvm_py_<name>`, a CPython function (METH_FASTCALL) that runs `inner`: its arguments
    are the addresses of the state array, the heap's cells and their shadows, the heap's
    capacity in cells, [the budget,] the scalars [and the seeds]; its result the results
    as a tuple, or the fault code (the caller raises Fault). A wrong number of arguments
    is a fault too; a wrong type raises Python's own error (TypeError, OverflowError).

    `fused` = (the forward function, its result names, budget?, split, tail):
    run it first, then `inner` (the gradient pass) from its results and the seeds, and
    return the pair (values, gradient pass results); the heap top must be back where it
    was (after the forward run; after a split one's gradient pass), and the step budget
    is set afresh for each pass: from the budget argument, on
    an empty heap (vgs), or as found in the state array (vg). A split forward run (to
    the copy of a compute-copy-uncompute function) that took S steps fails with the
    budget's code where 2 S + tail (the whole run's bound: rvm.ad.gradient.whole_run_fits)
    passes the budget, so that the caller's general path decides. `shadows`: the names of
    what `inner` returns after its results (a gradient function's float locals' shadows,
    for the record at the end: _end_checkpoint)."""
    fn, b, api, item, address, checked = _py_function(ir, t, module, name)
    # a SIGINT from now on stops it (a batch's slices: see rvm.engines.native.on_threads)
    b.store_atomic(t.i64(0), module.globals[INTERRUPT_CELL], "monotonic", 8)
    first = fused[0] if fused else inner
    nparams = len(first.function_type.args) - 5
    split = fused[3] if fused else 0    # the forward run returns this many registers
    # the seeds: one per float parameter
    extra = sum(ty == t.f64 for ty in first.function_type.args[5:]) if fused else 0
    lead = [t.i64] if fused and fused[2] else []
    types = lead + list(first.function_type.args[5:]) + [t.f64] * extra
    code = b.alloca(t.i64, name="fault")
    b.store(t.i64(FAULT), code)
    fault = fn.append_basic_block("fault")
    with b.goto_block(fault):
        b.ret(b.call(api("PyLong_FromLongLong"), [b.load(code)]))
    guard(b, b.icmp_signed("!=", fn.args[2], t.i64(4 + len(types))), fault)
    S, H, G = address(0, t.ptr), address(1, t.ptr), address(2, t.fptr)
    cap = b.call(api("PyLong_AsLongLong"), [item(3)])
    rest = [b.call(api("PyFloat_AsDouble" if ty == t.f64 else "PyLong_AsLongLong"),
                   [item(k + 4)]) for k, ty in enumerate(types)]
    checked()
    state = lambda k: b.gep(S, [t.i64(k)])

    def run(f, values, at_end=False):
        b.store(t.i64(0), code)
        # without the GIL: the generated code touches only the machine's buffers, so
        # other Python threads (another machine's run, say) go on meanwhile
        saved = b.call(api("PyEval_SaveThread"), [])
        out = b.call(f, [S, code, H, G, cap] + values)
        b.call(api("PyEval_RestoreThread"), [saved])
        guard(b, b.icmp_signed("!=", b.load(code), t.i64(0)), fault)
        over = fault
        if at_end:      # the run's end state, for the machine to step back from
            over = fn.append_basic_block()
            with b.goto_block(over):
                _end_checkpoint(b, t, name, S, H, cap, out, [*returns, *shadows])
                b.branch(fault)
        over_budget(b, t, state(1), code, over)
        return out

    def boxed(out, names, at=None):
        return [b.call(api("PyFloat_FromDouble" if out.type.elements[k] == t.f64 else
                           "PyLong_FromLongLong"), [b.extract_value(out, k)])
                for k in (range(len(names)) if at is None else at)]

    def pack(items):
        tup = b.call(api("PyTuple_New"), [t.i64(len(items))])
        for k, v in enumerate(items):
            b.call(api("PyTuple_SetItem"), [tup, t.i64(k), v])
        return tup

    if fused:
        if fused[2]:
            budget = rest.pop(0)
            b.store(t.i64(0), state(0))
            b.store(budget, state(1))
        else:
            budget = b.load(state(1))
        top = b.load(state(0))

        def left_allocated():       # a heap block left allocated
            moved = b.icmp_signed("!=", b.load(state(0)), top)
            b.store(t.i64(FAULT), code)
            guard(b, moved, fault)

        forward = run(first, rest[:nparams])
        if not split:       # (a split forward run leaves its ancilla arrays allocated)
            left_allocated()
            _forward_end(b, t, S, H, budget)
        else:
            whole_run_fits(b, t, budget, b.load(state(1)), fused[4], code, fault)
        b.store(budget, state(1))
        values = [b.extract_value(forward, k) for k in range(split or nparams)] + \
            rest[nparams:] + _local_shadows(t, inner, split, extra)
        b.store(t.i64(-1), state(SHADOWS))      # (the gradient pass's own looks)
        b.store(t.i64(0), state(SHADOWS_BAD))
        back = run(inner, values)
        if split:
            left_allocated()
        b.store(budget, state(1))
        keep = None if not split else [*range(nparams), *range(split, split + extra)]
        out = pack([pack(boxed(forward, fused[1], range(nparams))),
                    pack(boxed(back, returns, keep))])
    else:
        out = pack(boxed(run(inner, rest, at_end=True), returns))
    o = ir.IntType(8).as_pointer()
    failed = fn.append_basic_block()     # out of memory: an item is missing
    ok = fn.append_basic_block()
    b.cbranch(b.icmp_unsigned("!=", b.call(api("PyErr_Occurred"), []), ir.Constant(o, None)),
              failed, ok)
    b.position_at_end(failed)
    b.call(api("Py_DecRef"), [out])
    b.ret(ir.Constant(o, None))
    b.position_at_end(ok)
    b.ret(out)


_CAPI = {   # the CPython functions the entries call: (result, arguments); o = PyObject *
    "PyLong_AsVoidPtr": ("o", "o"), "PyLong_AsLongLong": ("l", "o"),
    "PyFloat_AsDouble": ("d", "o"), "PyErr_Occurred": ("o", ""),
    "PyTuple_New": ("o", "l"), "PyTuple_SetItem": ("i", "olo"),
    "PyFloat_FromDouble": ("o", "d"), "PyLong_FromLongLong": ("o", "l"),
    "Py_DecRef": ("v", "o"), "PyEval_SaveThread": ("o", ""),
    "PyEval_RestoreThread": ("v", "o"),
}


def _api(ir, t: Types, module, fname: str):
    """The CPython function `fname`, declared in module."""
    f = module.globals.get(fname)
    if f is None:
        o = ir.IntType(8).as_pointer()
        kinds = {"o": o, "l": t.i64, "d": t.f64, "i": ir.IntType(32), "v": ir.VoidType()}
        res, args = _CAPI[fname]
        f = ir.Function(module, ir.FunctionType(kinds[res], [kinds[a] for a in args]), fname)
    return f


def _local_shadows(t: Types, gbw, split: int, seeds: int, lead: int = 5) -> list:
    """A split function's gradient pass takes, after its `lead` arguments (the heap's;
    a lane function's also its mask), every register the forward run returned (`split`
    of them), then the shadows of the float ones: the parameters' are the seeds, the
    locals' start at zero."""
    if not split:
        return []
    return [t.f64(0.0)] * (len(gbw.function_type.args) - lead - split - seeds)


def _batch_entry(ir, t: Types, module, name: str, mode: str, fw, gbw, split: int = 0,
                 lanes: tuple | None = None, tail: int = 0):
    """`rvm_py_<name>`, a native loop over rows of scalar arguments (rvm.vmap), as a CPython
    function (METH_FASTCALL) that runs without the GIL: mode "csb" calls fw on each row,
    "usb" calls fw (there the function's inverse), "vgsb" a value and gradient (fw then
    gbw from its results and the seeds), "jsb" fw then gbw once per row of seeds.
    Arguments: the budget, the row count n, the argument columns that hold one value for
    every row (bit j: column j), [for jsb the seed rows,] the addresses of
    the argument columns, [vgsb: the seeds; jsb: the seed array's address,] the
    addresses of the result columns (0: not wanted) [vgsb: and of the gradient columns;
    jsb: of the gradient array (rows x seed rows x float parameters)]. The result: 0, or the
    first fault's code (the caller runs the rows one by one to report it).

    lanes = (their types, fw's and gbw's lane versions): the rows in groups of
    rvm.engines.lanes.LANES through those, the rest through fw and gbw."""
    fn, b, api, item, pointer, checked = _py_function(ir, t, module, name)
    ptypes = list(fw.function_type.args[5:])
    k = len(ptypes)
    floats = [j for j, ty in enumerate(ptypes) if ty == t.f64]
    head = 4 if mode == "jsb" else 3
    seeds = len(floats) if mode == "vgsb" else (1 if mode == "jsb" else 0)
    outs = k + (len(floats) if mode == "vgsb" else (1 if mode == "jsb" else 0))
    count = head + k + seeds + outs
    wrong = fn.append_basic_block()
    with b.goto_block(wrong):
        b.ret(b.call(api("PyLong_FromLongLong"), [t.i64(FAULT)]))
    guard(b, b.icmp_signed("!=", fn.args[2], t.i64(count)), wrong)
    integer = lambda j: b.call(api("PyLong_AsLongLong"), [item(j)])
    address = lambda j, ty: pointer(j, ty.as_pointer())
    budget, n = integer(0), integer(1)
    spread = integer(2)
    nseeds = integer(3) if mode == "jsb" else None
    cols = [address(head + j, ty) for j, ty in enumerate(ptypes)]
    # an argument column whose bit is set in `spread` is one value for every row
    steps = [b.select(b.trunc(b.lshr(spread, t.i64(j)), t.i1), t.i64(0), t.i64(1))
             for j in range(k)]
    at = head + k
    if mode == "vgsb":
        seed = [b.call(api("PyFloat_AsDouble"), [item(at + j)]) for j in range(len(floats))]
    elif mode == "jsb":
        seed = address(at, t.f64)
    else:
        seed = []
    at += seeds
    results = [address(at + j, ty) for j, ty in enumerate(ptypes)]
    wanted = [b.icmp_unsigned("!=", b.ptrtoint(c, t.i64), t.i64(0)) for c in results]
    grads = [address(at + k + j, t.f64) for j in range(outs - k)]
    checked()
    with b.goto_block(fn.entry_basic_block):     # fixed stack slots: with a dynamic
        # alloca, LLVM sets up each call's frame below it and can lose the alignment that
        # vectors passed in memory need (the lane functions': rvm.engines.lanes)
        S, flag, code = b.alloca(t.i64, t.i64(STATE)), b.alloca(t.i64), b.alloca(t.i64)
    b.store(t.i64(0), code)
    b.store(t.i64(-1), b.gep(S, [t.i64(ROOT)]))     # (no frame is a root: no snapshots)
    b.store(t.i64(0), b.gep(S, [t.i64(SNAP)]))
    saved = b.call(api("PyEval_SaveThread"), [])
    done = fn.append_basic_block()

    def poll():         # each row (or group of rows): stop if a SIGINT came
        flag = b.load_atomic(module.globals[INTERRUPT_CELL], "monotonic", 8)
        stop = fn.append_basic_block()
        with b.goto_block(stop):
            b.store(t.i64(INTERRUPT), code)
            b.branch(done)
        guard(b, b.icmp_signed("!=", flag, t.i64(0)), stop)
    heap = [ir.Constant(t.ptr, None), ir.Constant(t.fptr, None), t.i64(0)]

    def run(f, values):
        b.store(budget, b.gep(S, [t.i64(1)]))
        out = _call_or_leave(b, t, f, [S, flag, *heap, *values], code, done)
        over_budget(b, t, b.gep(S, [t.i64(1)]), code, done)
        return out

    def one(row):
        poll()
        b.store(t.i64(0), b.gep(S, [t.i64(0)]))
        out = run(fw, [b.load(b.gep(c, [b.mul(row, step)])) for c, step in zip(cols, steps)])
        if split:
            whole_run_fits(b, t, budget, b.load(b.gep(S, [t.i64(1)])), tail, code, done)
        values = [b.extract_value(out, j) for j in range(split or k)]
        for j, c in enumerate(results):
            with b.if_then(wanted[j]):
                b.store(values[j], b.gep(c, [row]))
        zeros = _local_shadows(t, gbw, split, len(floats))
        if mode == "vgsb":
            back = run(gbw, values + seed + zeros)
            for j, g in enumerate(grads):
                b.store(b.extract_value(back, (split or k) + j), b.gep(g, [row]))
        elif mode == "jsb":
            width = t.i64(len(floats))

            def pass_(s):
                back = run(gbw, values + [b.load(b.gep(seed, [b.add(b.mul(s, width),
                                                                     t.i64(j))]))
                                          for j in range(len(floats))] + zeros)
                base = b.mul(b.add(b.mul(row, nseeds), s), width)
                for j in range(len(floats)):
                    b.store(b.extract_value(back, (split or k) + j),
                            b.gep(grads[0], [b.add(base, t.i64(j))]))
            loop_over(b, t.i64(0), nseeds, pass_)
    start = t.i64(0)
    if lanes:
        start = _groups(b, t, lanes, mode, (cols, steps, results, wanted, grads), seed,
                        split, budget, n, nseeds, code, done, poll, tail)
    loop_over(b, start, n, one, done)
    b.call(api("PyEval_RestoreThread"), [saved])
    b.ret(b.call(api("PyLong_FromLongLong"), [b.load(code)]))


def whole_run_fits(b, t: Types, budget, left, tail, code, done) -> None:
    """Leave to `done` with the budget's code where a split forward run (to the copy of a
    compute-copy-uncompute function) that left `left` of `budget` steps could, with the
    uncompute it skips and the `tail` instructions from there, pass the budget: used +
    tail > left, i.e. 2 used + tail > budget (rvm.ad.gradient.whole_run_fits); the
    caller's general path then decides, as the interpreter counts. Rows in lockstep:
    vectors of each, left where any row's test fails."""
    tail = t.i64(tail) if isinstance(tail, int) else tail
    over = b.icmp_signed(">", b.sub(budget, left), b.sub(left, tail))
    lanes = getattr(over.type, "count", None)
    if lanes is not None:           # (a row's or another's: the mask as one integer)
        mask = _llvm()[1].IntType(lanes)
        over = b.icmp_unsigned("!=", b.bitcast(over, mask), mask(0))
    leave = b.function.append_basic_block()
    with b.goto_block(leave):
        b.store(t.i64(BUDGET), code)
        b.branch(done)
    guard(b, over, leave)


def _forward_end(b, t: Types, S, H, budget) -> None:
    """In a value-and-gradient call given a snapshot buffer (the state's SNAP, as the
    direct calls with arrays give one: rvm.ad.gradient, _Direct.make_arrays), the heap
    where the forward run ended, if the buffer holds it (its room, SNAP_ROOM) and the
    copy is cheap beside the run (at most FORWARD_CELLS cells, or SNAP_SPACING steps per
    cell): marked -2 in SNAP_AT, the top in SNAP_TOP and the forward run's steps in
    SNAP_NAME's cell. Where the gradient then comes out not finite, the search for where
    it stopped being finite starts there (rvm.ad.gradient.not_finite), not with the
    forward run again."""
    fn = b.function
    snap_at = b.load(b.gep(S, [t.i64(SNAP)]))
    given, copy, after = (fn.append_basic_block() for _ in range(3))
    b.cbranch(b.icmp_signed("!=", snap_at, t.i64(0)), given, after)
    b.position_at_end(given)
    snap = b.inttoptr(snap_at, t.ptr)
    top = b.load(b.gep(S, [t.i64(0)]))
    steps = b.sub(budget, b.load(b.gep(S, [t.i64(1)])))
    cheap = b.or_(b.icmp_signed("<=", top, t.i64(FORWARD_CELLS)),
                  b.icmp_signed("<=", b.mul(top, t.i64(SNAP_SPACING)), steps))
    fits = b.icmp_signed("<=", top, b.load(b.gep(snap, [t.i64(SNAP_ROOM)])))
    b.cbranch(b.and_(fits, cheap), copy, after)
    b.position_at_end(copy)
    snapshot_cells(b, t, snap, (t.i64(-2), top, steps), H, top)
    b.branch(after)
    b.position_at_end(after)


def _end_checkpoint(b, t: Types, function: str, S, H, cap, out, names: list[str]) -> None:
    """A function that ran to its end past its step budget: its results in the heap
    cells above the top, as a checkpoint record at the end (AT_END; see
    rvm.engines.lowering.Lowering.record), when they fit."""
    if not all(FRAME_REGISTER.fullmatch(n) for n in names):
        return
    size = RECORD + 2 * len(names)
    top = b.load(b.gep(S, [t.i64(0)]))
    write, done = b.function.append_basic_block(), b.function.append_basic_block()
    b.cbranch(b.and_(b.icmp_signed(">=", b.sub(cap, top), t.i64(size)),
                     b.icmp_unsigned("!=", b.ptrtoint(H, t.i64), t.i64(0))), write, done)
    b.position_at_end(write)
    cell = lambda k: b.gep(H, [b.add(top, t.i64(k))])
    for k, v in enumerate([CHECKPOINT, name_id(function), AT_END, -1]):
        b.store(t.i64(v), cell(k))
    b.store(b.load(b.gep(S, [t.i64(1)])), cell(4))
    b.store(t.i64(len(names)), cell(5))
    for k, name in enumerate(names):
        v = b.extract_value(out, k)
        b.store(t.i64(name_id(name)), cell(RECORD + 2 * k))
        b.store(b.bitcast(v, t.i64) if v.type == t.f64 else v, cell(RECORD + 1 + 2 * k))
    b.branch(done)
    b.position_at_end(done)


def over_budget(b, t: Types, left, code, leave) -> None:
    """After a generated function returned: its step budget's test at its end (which it
    leaves to its caller: rvm.engines.lowering), the BUDGET code and `leave` if it
    failed."""
    failed = b.function.append_basic_block()
    with b.goto_block(failed):
        b.store(t.i64(BUDGET), code)
        b.branch(leave)
    guard(b, b.icmp_signed("<", b.load(left), t.i64(0)), failed)


def _call_or_leave(b, t: Types, f, args: list, code, done):
    """Call f (its second argument the fault flag, cleared first); where it faults, its
    code goes to `code` and control to `done`."""
    flag = args[1]
    b.store(t.i64(0), flag)
    out = b.call(f, args)
    failed, ok = b.function.append_basic_block(), b.function.append_basic_block()
    b.cbranch(b.icmp_signed("!=", b.load(flag), t.i64(0)), failed, ok)
    with b.goto_block(failed):
        b.store(b.load(flag), code)
        b.branch(done)
    b.position_at_end(ok)
    return out


def _groups(b, t: Types, lanes: tuple, mode: str, columns: tuple, seed, split: int,
            budget, n, nseeds, code, done, poll, tail: int = 0):
    """The batch loop over whole groups of rows in lockstep (see _batch_entry): each
    group's columns (arguments, results, gradients) loaded as vectors, run through the
    lane functions, stored back. Returns the first row left over."""
    from .lanes import splat
    vt, fw, gbw = lanes
    cols, steps, results, wanted, grads = columns
    width = t.i64(vt.lanes)
    ptypes = list(fw.function_type.args[6:])      # vectors
    k = len(ptypes)
    with b.goto_block(b.function.entry_basic_block):   # fixed stack slots
        S, flag = b.alloca(vt.i64, t.i64(STATE)), b.alloca(t.i64)
    budgets = splat(b, vt, budget)
    nf = sum(ty == vt.f64 for ty in ptypes)            # float parameters
    seeds = [splat(b, vt, s) for s in seed] if mode == "vgsb" else []
    zeros = _local_shadows(vt, gbw, split, nf, lead=6)
    heap = [b.inttoptr(t.i64(0), t.ptr), b.inttoptr(t.i64(0), t.fptr), t.i64(0)]

    def rows(column, ty, base):
        return b.bitcast(b.gep(column, [base]), ty.as_pointer())

    def run(f, values):
        b.store(vt.i64(0), b.gep(S, [t.i64(0)]))
        b.store(budgets, b.gep(S, [t.i64(1)]))
        return _call_or_leave(b, t, f, [S, flag, *heap, vt.i1(1), *values], code, done)

    sources = []        # a column of one value: LANES copies of it, read every time
    for c, step, ty in zip(cols, steps, ptypes):
        with b.goto_block(b.function.entry_basic_block):
            copies = b.alloca(ty)
        b.store(splat(b, vt, b.load(c)), copies)        # (the caller: n >= 1)
        sources.append(b.select(b.icmp_signed("==", step, t.i64(0)),
                                b.bitcast(copies, c.type), c))

    def group(g):
        poll()
        base = b.mul(g, width)
        out = run(fw, [b.load(rows(c, ty, b.mul(base, step)), align=8)
                       for c, step, ty in zip(sources, steps, ptypes)])
        if split:       # (each row's test, as one mask)
            whole_run_fits(b, t, budgets, b.load(b.gep(S, [t.i64(1)])),
                           splat(b, vt, t.i64(tail)), code, done)
        values = [b.extract_value(out, j) for j in range(split or k)]
        for j, c in enumerate(results):
            with b.if_then(wanted[j]):
                b.store(values[j], rows(c, ptypes[j], base), align=8)
        if mode == "vgsb":
            back = run(gbw, values + seeds + zeros)
            for j, column in enumerate(grads):
                b.store(b.extract_value(back, (split or k) + j), rows(column, vt.f64, base),
                        align=8)
        elif mode == "jsb":         # a gradient pass per seed row, for the whole group

            def pass_(s):
                at = lambda j: b.add(b.mul(s, t.i64(nf)), t.i64(j))
                back = run(gbw, values + [splat(b, vt, b.load(b.gep(seed, [at(j)])))
                                          for j in range(nf)] + zeros)
                for j in range(nf):
                    g = b.extract_value(back, (split or k) + j)
                    for lane in range(vt.lanes):    # G[row, s, j]: rows apart
                        row = b.add(base, t.i64(lane))
                        cell = b.add(b.mul(b.add(b.mul(row, nseeds), s), t.i64(nf)),
                                     t.i64(j))
                        b.store(b.extract_element(g, t.i64(lane)),
                                b.gep(grads[0], [cell]))
            loop_over(b, t.i64(0), nseeds, pass_)
    groups = b.sdiv(n, width)
    loop_over(b, t.i64(0), groups, group)
    return b.mul(groups, width)


def ir_module(source: str, tol: float, fused: dict, batches: dict, runs=None,
              looks: bool | str = False, resume: bool = False) -> str:
    """LLVM IR for the generated functions in `source` (the native engine's text) that the
    entries run: an entry `rvm_py_<name>` for each of `runs` (names of generated
    functions; None: all of them), for each of `fused` ({name: (forward, gradient pass,
    budget argument?, split)}) and for each of `batches` ({name: (mode, forward, gradient
    pass, split)}), the batches with rows in lockstep where the functions allow it
    (rvm.engines.lanes). looks: a gradient pass looks at its shadows where any function
    returns, not only one with loops, and before a shadow is dropped (see
    Lowering.note_shadows). resume: the root frame of a function that takes snapshots
    may start at a look (Lowering.resume)."""
    from . import lanes
    src = _Source(source)
    if runs is None:
        runs = list(src.texts)
    if batches and lanes.enabled:
        with contextlib.suppress(Unsupported):
            return _module(src, tol, fused, batches, runs, True, looks, resume)
    return _module(src, tol, fused, batches, runs, False, looks, resume)


_CALLS = re.compile(r"\b([A-Za-z_]\w*)\(")


class _Source:
    """The generated functions' text, read one function at a time: a first pass keeps
    each function's calls, step-budget tests and signature (a stub of its declarations,
    parameters and return); in a large program a function's whole syntax tree is made
    again while it is lowered, and dropped, so memory holds one function's tree at a
    time (a program's trees took 5 GB at 10^6 instructions)."""

    KEEP = 4_000_000        # characters of text under which the trees are kept instead
    # (parsing a function twice costs about 10% of a compile's Python side)

    def __init__(self, source: str):
        self.texts, self.kept = {}, {}
        for chunk in re.split(r"(?m)^(?=def )", source):
            m = re.match(r"def (\w+)\(", chunk)
            if m:
                self.texts[m.group(1)] = chunk
        self.calls, self.stubs, tests, writing = {}, {}, {}, set()
        for name in self.texts:
            node = self.node(name)
            if len(source) < self.KEEP:
                self.kept[name] = node
            # the names it calls (from its text: only generated functions' are used),
            # its budget tests, its first return, the shadows it assigns or declares
            # (see end_shadows): one walk over its statements, in ast.walk's order
            calls = set(_CALLS.findall(self.texts[name], self.texts[name].find("\n")))
            count, ret, shadows = 0, None, set()
            level = list(node.body)
            while level:
                below = []
                for n in level:
                    if isinstance(n, ast.If):
                        count += budget_test(n)
                    elif isinstance(n, ast.Return) and ret is None:
                        ret = n
                    shadows.update(x for x in assigned_by(n) if x.startswith("gf"))
                    below += getattr(n, "body", ()) + getattr(n, "orelse", ())
                level = below
            self.calls[name], tests[name] = calls, count
            if writes_heap(node, self.texts):
                writing.add(name)
            kept = [ast.Assign([ast.Name(n, ast.Store())], ast.Constant(0.0), lineno=0)
                    for n in sorted(shadows)]
            types = [s for s in node.body if isinstance(s, ast.AnnAssign)]  # (declared)
            self.stubs[name] = ast.FunctionDef(name=name, args=node.args,
                                               body=types + kept + ([ret] if ret else []),
                                               decorator_list=[])
        self.run_out = running_out(tests, self.calls)
        # the functions with loops whose runs, their callees' included, write no heap
        # cell (a look keeps a copy of their registers: rvm.engines.lowering,
        # Lowering.keep)
        looping = frozenset(name for name, n in tests.items() if n > 1)
        self.quiet = looping - reaching(self.calls, writing)
        # the others with loops that no function calls, in the modes a machine starts a
        # run in (a value-and-gradient call's split runs never take one): a look in the
        # root frame keeps a copy of the registers with a snapshot of a small heap
        # (Lowering.snapshot; in every function with loops, the GMM example's first
        # gradient compiled in 10 s instead of 7)
        called = {c for name in self.calls for c in self.calls[name]}
        self.snapping = frozenset(
            name for name in looping - self.quiet - called
            if name.rsplit("_", 1)[-1] in ("fw", "bw", "gfw", "gbw"))

    def node(self, name: str) -> ast.FunctionDef:
        """A generated function's tree as native code runs it (rvm.engines.lowering:
        MachineOperations)."""
        node = self.kept.get(name)
        return node if node is not None else native_tree(ast.parse(self.texts[name]).body[0])


def _module(src: _Source, tol: float, fused: dict, batches: dict, runs,
            lockstep: bool, looks: bool | str = False, resume: bool = False) -> str:
    """The module's IR: the generated functions the entries run, and the entries."""
    _, ir, _ = _llvm()
    t = Types(ir)
    module = ir.Module(name="rvm")
    module.triple = _triple()

    def declare(types, signature, suffix: str, wanted) -> dict:
        functions: dict = {"TOL": tol, "RUN_OUT": src.run_out, "CALLS": src.calls,
                           "LOOKS": looks, "QUIET": src.quiet,
                           "SNAP": src.snapping, "RESUME": resume}
        for name in src.texts:
            if name in wanted:
                ftype, params, returns = signature(ir, types, src.stubs[name])
                f = ir.Function(module, ftype, f"{name}_{suffix}")
                # (not internal: LLVM would inline every function called once into its
                # caller, one huge function out of a call chain)
                for arg in f.args[:4]:  # state, fault flag, cells, shadows: four buffers
                    arg.add_attribute("noalias")
                functions[name] = (f, params, returns)
        return functions
    calls = src.calls
    needed = callees(calls, {*runs, *(
        f for entry in (*fused.values(), *batches.values()) for f in entry
        if isinstance(f, str) and f in calls)})
    functions = declare(t, _signature, "", needed)
    for name in src.texts:
        if name in needed:
            Lowering(ir, t, functions, src.node(name))
    lanes: dict = {}
    if lockstep:
        from .lanes import Lanes, LaneTypes, inlined, signature
        vt = LaneTypes(ir)
        roots = {f for mode, fw, gbw, *_ in batches.values()
                 for f in ((fw, gbw) if mode in ("vgsb", "jsb") else (fw,))}
        wanted = callees(calls, roots)
        lanes = declare(vt, signature, "lanes", wanted)
        for name in inlined(calls, wanted):
            lanes[name][0].attributes.add("alwaysinline")
        for name in src.texts:
            if name in lanes:
                Lanes(ir, vt, lanes, src.node(name))
    for name in runs:
        f, _, returns = functions[name]
        _entry(ir, t, module, name, f, returns, shadows=end_shadows(src.stubs[name]))
    for name, (fw, gbw, budget, split, tail) in fused.items():
        _entry(ir, t, module, name, functions[gbw][0], functions[gbw][2],
               fused=(functions[fw][0], functions[fw][2], budget, split, tail))
    for name, (mode, fw, gbw, split, *tail) in batches.items():
        group = (vt, lanes[fw][0], lanes.get(gbw, (None,))[0]) if fw in lanes else None
        _batch_entry(ir, t, module, name, mode, functions[fw][0], functions[gbw][0], split,
                     group, tail[0] if tail else 0)
    return str(module)


_LLVM_LOCK = vectormath.LOCK        # LLVM's global context: one thread at a time


def compile_ir(text: str, quick: bool = False) -> bytes:
    """Optimised machine code (an object file) for LLVM IR text (quick: code made with
    no optimisation, see Tier). From the main thread, LLVM works on a second one, so
    that Ctrl-C stops the wait at once (KeyboardInterrupt; the abandoned compile ends on
    its own, and the next waits for it)."""
    if threading.current_thread() is not threading.main_thread():
        with _LLVM_LOCK:
            return _compile_ir(text, quick)
    box: dict = {}

    def work():
        try:
            with _LLVM_LOCK:
                box["out"] = _compile_ir(text, quick)
        except BaseException as exc:    # (passed on to the caller)
            box["error"] = exc
    thread = threading.Thread(target=work, daemon=True, name="rvm-compile")
    thread.start()
    thread.join()                       # (a signal interrupts it)
    if "error" in box:
        raise box["error"]
    return box["out"]


def _compile_ir(text: str, quick: bool = False) -> bytes:
    ll, _, tm = _llvm()
    mod = ll.parse_assembly(text)
    mod.verify()
    prelude = vectormath.prelude(text)
    if prelude is not None:     # (its declarations, with their vector variants, prevail)
        into = ll.parse_assembly(prelude)
        into.triple, into.data_layout = mod.triple, mod.data_layout
        into.link_in(mod)
        mod = into
    if quick:           # (no passes but on the array instructions' helpers, whose loops
        # run each instruction's elements; the code generator's fastest level)
        passes = ll.create_pass_builder(tm, ll.create_pipeline_tuning_options(speed_level=1))
        helpers = passes.getFunctionPassManager()
        for f in mod.functions:
            if not f.is_declaration and f.name.startswith(_HELPERS):
                helpers.run(f, passes)
        return _target_machine(0).emit_object(mod)
    pto = ll.create_pipeline_tuning_options(speed_level=2)
    pto.slp_vectorization = True
    pb = ll.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return tm.emit_object(mod)


class Library:
    """Machine code loaded for calling: entry addresses by name."""

    def __init__(self, *objects: bytes):
        ll = _llvm()[0]
        if any(vectormath.PREFIX.encode() in obj for obj in objects):
            vectormath.kernels()        # (the element loops' functions it calls: bound)
        with _LLVM_LOCK:
            self.engine = ll.create_mcjit_compiler(ll.parse_assembly(""), _target_machine())
            for obj in objects:
                self.engine.add_object_file(ll.ObjectFileRef.from_data(obj))
            self.engine.finalize_object()

    def address(self, name: str) -> int:
        return self.engine.get_function_address(f"rvm_{name}")


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p),
                ("ml_flags", ctypes.c_int), ("ml_doc", ctypes.c_char_p)]


_METH_FASTCALL = 0x80


def _builtin(library: Library, name: str):
    """The entry rvm_py_<name> as a Python builtin function. The function's `self` (which
    the entry ignores) holds its method table entry and the library with its code, so
    both live as long as the function does, in whatever order the garbage collector
    frees what refers to them (CPython reads the method table when it traverses or frees
    the function: freed first, at interpreter exit, it crashed the process)."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.py_object,
                                                   ctypes.py_object]
    table = _MethodDef(name.encode(), library.address(f"py_{name}"), _METH_FASTCALL, None)
    return new(ctypes.addressof(table), (table, library), None)


class _Call:
    """An entry called from Python with the addresses of the state array (heap top, step
    budget), the heap's cells and their shadows, and the heap's capacity, then the
    scalar arguments; a fault code back (an int) instead of the results' tuple."""

    tier = None     # the optimised code on its way, while this calls the quick code (Tier)

    def __init__(self, library: Library, name: str):
        self.library, self.name = library, name     # (the code lives as its callers do)
        self.call = _builtin(library, name)
        self.arrays = (None, None, None, ())

    def promote(self, library: Library) -> None:
        """Call `library`'s code from now on (the optimised: Tier)."""
        self.call, self.library = _builtin(library, self.name), library

    def addresses(self, HI, HG, TOP) -> tuple:
        """(state, cells, shadows, capacity) for these arrays, checked as native code needs
        them (remembered for the same arrays, as a machine passes its own every time)."""
        cached = self.arrays
        if cached[0] is not HI or cached[1] is not HG or cached[2] is not TOP:
            # (native code writes every cell of the state array: templates.STATE; a
            # shorter one had a return write past its end, into the process's memory)
            ok = TOP.dtype == "int64" and TOP.size >= STATE and TOP.flags.c_contiguous
            if HI is None:          # a program without heap (rvm.engines.native: vgs)
                heap = (0, 0, 0)
            else:
                ok = ok and HI.dtype == "int64" and HG.dtype == "float64" and \
                    1 <= HI.size <= HG.size and HI.flags.c_contiguous and \
                    HG.flags.c_contiguous
                heap = (HI.ctypes.data, HG.ctypes.data, HI.size)
            if not ok:
                raise TypeError("native code needs contiguous int64 state and heap arrays "
                                "and float64 shadows at least as long")
            cached = self.arrays = (HI, HG, TOP, (TOP.ctypes.data, *heap))
        return cached[3]


def _check(out):
    if type(out) is not tuple:
        _fault(out)
    return out


def _fault(code: int):
    if code == INTERRUPT:      # (Python's handler has mostly raised it already)
        raise KeyboardInterrupt
    fault = Fault(MESSAGES[code])
    fault.code = code               # (FULL: the cells wanted are in the state's heap top)
    raise fault


class Run(_Call):
    """One run mode of one function, called as (HI, HF, HG, TOP,
    *arguments) -> results, the heap top and the step budget kept in TOP. (Also a fused
    value and gradient on a heap, vg: arguments, then seeds.)"""

    def __call__(self, HI, HF, HG, TOP, *args):
        if self.tier is not None:
            def run(budget):
                TOP[LEFT] = budget
                return self.run(HI, HG, TOP, args)

            def restore():
                if HI is not None:
                    HI[:], HG[:] = cells

            budget, large = int(TOP[LEFT]), HI is not None and HI.size > QUICK_CELLS
            cells = None if HI is None or large or budget <= QUICK_STEPS else \
                (HI.copy(), HG.copy())
            return self.tier.call(self, TOP, budget, run, restore, bounded=not large)
        return self.run(HI, HG, TOP, args)

    def run(self, HI, HG, TOP, args):
        try:
            return _check(self.call(*self.addresses(HI, HG, TOP), *args))
        except KeyboardInterrupt:
            # stopped midway: the heap's cells and shadows zero again, as a heap is
            # between runs (a machine puts back its own from its copy)
            if HI is not None:
                HI[:] = 0
                HG[:] = 0
            raise


class Fused(_Call):
    """A whole value and gradient of a program without heap, called as the
    engine's vgs: (T, H, budget, *arguments, *seeds) -> (values, the gradient pass's
    results)."""

    def __call__(self, T, H, budget, *args):
        if self.tier is not None:
            return self.tier.call(self, T, budget, lambda b: _check(
                self.call(*self.addresses(None, None, T), b, *args)), lambda: None)
        return _check(self.call(*self.addresses(None, None, T), budget, *args))


class Batch:
    """A batch loop called as rvm.engines.native.on_threads calls it:
    (budget, argument columns..., [seeds... | S], result columns..., [gradient columns...
    | G]), numpy arrays checked here and passed by address; the loop runs without the
    GIL. Raises Fault if a row fails (the caller runs the rows one by one). An argument
    column may be a view with stride 0 (np.broadcast_to: one value for every row); a
    result column may be None (not wanted)."""

    spreads = True          # takes stride-0 argument columns

    tier = None     # the optimised code on its way (see meanwhile)

    def __init__(self, library: Library, name: str, mode: str, kinds: list[str]):
        self.library, self.mode, self.kinds, self.name = library, mode, kinds, name
        self.call = _builtin(library, name)

    promote = _Call.promote

    def __call__(self, budget, *arrays):
        tier = self.tier
        if tier is not None:
            if id(self) in tier.served:     # (as a later call of a Run: Tier.call)
                tier.done.wait()
            else:           # (the first batch's slices on threads, each: on_threads)
                self.meanwhile(tier, budget, arrays)
                tier.served.add(id(self))
                return None
        return self.rows(budget, arrays)

    def meanwhile(self, tier, budget, arrays) -> None:
        """The first batch while the optimised code is being made: its rows in chunks,
        CHUNK_ROWS rows and then twice as many each time, each on the code there is when
        it starts (the quick code, then the optimised); the rest at once when that is
        made. No row runs twice, and the quick code runs at most about as long again
        as the optimised code took to come."""
        k = len(self.kinds)
        fixed = set(range(k, k + self.kinds.count("float64"))) if self.mode == "vgsb" \
            else {k} if self.mode == "jsb" else set()       # (the seeds: not rows)
        n = arrays[0].shape[0] if k else 0
        if n == 0:
            return self.rows(budget, arrays)
        start, size = 0, CHUNK_ROWS
        while start < n:
            stop = n if tier.done.is_set() else min(n, start + size)
            self.rows(budget, [a if j in fixed or a is None else a[start:stop]
                               for j, a in enumerate(arrays)])
            start, size = stop, 2 * size
        return None

    def rows(self, budget, arrays) -> None:
        k, mode = len(self.kinds), self.mode
        nf = self.kinds.count("float64")
        cols, rest = arrays[:k], arrays[k:]
        n = cols[0].shape[0] if cols else 0
        # an argument column may be one value for every row: a view with stride 0
        spread = [isinstance(a, np.ndarray) and a.ndim == 1 and a.strides == (0,)
                  for a in cols]
        lead: list = [int(budget), n, sum(1 << j for j, x in enumerate(spread) if x)]
        if mode == "vgsb":
            seeds, outs, grads = [float(x) for x in rest[:nf]], rest[nf:nf + k], rest[nf + k:]
        elif mode == "jsb":
            S, outs, grads = np.asarray(rest[0]), rest[1:1 + k], rest[1 + k:]
            lead.append(S.shape[0])
            if S.shape != (S.shape[0], nf) or S.dtype != np.float64:
                raise TypeError("seed rows must be float64, one column per float parameter")
            seeds = [S]
        else:
            seeds, outs, grads = [], rest, ()
        wanted = [*self.kinds, *(["float64"] if mode == "jsb" else []), *self.kinds,
                  *["float64"] * len(grads)]
        given = [*cols, *(seeds if mode == "jsb" else []), *outs, *grads]
        if len(given) != len(wanted) or len(cols) != k:
            raise TypeError(f"{self.mode} takes {k} argument and result columns")
        for j, (a, kind) in enumerate(zip(given, wanted)):
            rows = 0 if mode == "jsb" and j == k else n        # (S: any number of rows)
            if a is None and j >= len(given) - len(outs) - len(grads) and \
                    j < len(given) - len(grads):
                continue        # a result column not wanted
            if not (isinstance(a, np.ndarray) and a.dtype == kind and a.ndim >= 1 and
                    (a.flags.c_contiguous or (j < k and spread[j])) and a.shape[0] >= rows):
                raise TypeError("batch columns must be contiguous arrays of the right "
                                "dtype, one row per argument row")
        if mode == "jsb" and grads[0].shape[1:] != (S.shape[0], nf):
            raise TypeError("the gradient array must be rows x seed rows x float parameters")
        addresses = [0 if a is None else a.ctypes.data for a in given]
        if mode == "vgsb":
            addresses[k:k] = seeds
        if n == 0:          # (the entry reads a spread column's value before its loop)
            return
        code = self.call(*lead, *addresses)
        if code:
            _fault(code)


def _kinds(source: str) -> dict:
    """{generated function: its parameters' dtypes}, as its def line declares them."""
    out = {}
    dtypes = {"int": "int64", "float": "float64"}
    for line in re.findall(r"^def \w+\(M, .*\):", source, re.M):
        node = ast.parse(line + " pass").body[0]
        out[node.name] = [dtypes[a.annotation.id] for a in node.args.args[1:]]
    return out


@functools.cache
def _lowering_digest() -> str:
    """A digest of the back end's text (this module, rvm.engines.lowering, arraylowering,
    lanes, vectormath and irtext, and rvm.engines.native, templates and arrays, which
    prepare the generated functions for it: the lowering and the code generator's
    options)."""
    from .cache import text_digest
    here = pathlib.Path(__file__)
    return text_digest(here.with_name(f) for f in (
        "llvm.py", "lowering.py", "arraylowering.py", "lanes.py", "vectormath.py",
        "native.py", "templates.py", "arrays.py", "irtext.py")) + ("" if IRTEXT else "|ir")


@functools.cache
def _host() -> str:
    """LLVM's version, the target and the CPU, for the cache's key (asked of LLVM once:
    a call into LLVM waits while a Tier's optimised code is being made)."""
    ll = _llvm()[0]
    return f"{ll.llvm_version_info}|{_triple()}|{ll.get_host_cpu_name()}|" \
        f"{ll.get_host_cpu_features().flatten()}"


@functools.cache
def _triple() -> str:
    return _llvm()[2].triple


def functions(source, fused: dict, batches: dict, tol: float, runs=None,
              key: str | None = None, kinds: dict | None = None,
              looks: bool | str = False, resume: bool = False) -> dict:
    """Callables for generated functions: a Run for each of `runs` (names of generated
    functions; None: every function in `source`), one for each of `fused` ({name:
    (forward, gradient pass, budget argument?, split)}: a Fused with the budget argument,
    a Run without), a Batch for each of `batches` ({name: (mode, forward, gradient pass,
    split)}). Only the generated functions these entries run are compiled. The machine
    code comes from the on-disk cache, or is compiled and put there. `source` is the
    generated functions' text, or a function that makes the text of the generated
    functions some names run (rvm.engines.compiled.Compiled.native_text), with `key`
    (text that determines it) and `kinds` (as _kinds gives them): it is then made only if
    the machine code is not in the cache (making it takes longer than loading the code:
    seconds for a large program). looks, resume: see ir_module."""
    from . import cache, lanes
    _llvm()
    if key is None:
        text_ = source
        key, kinds = source, _kinds(source)
        source = lambda roots: text_
    if runs is None:
        runs = tuple(re.findall(r"^def (\w+)\(", source(()), re.M))
    runs = tuple(sorted(runs))
    stamp = f"{_lowering_digest()}|{_host()}|{sys.version}|" \
        f"{tol!r}|{lanes.enabled and lanes.LANES}|{vectormath.variant()}|" \
        f"{sorted(fused.items())}|{sorted(batches.items())}|{runs}|{looks}|{resume}"
    text = stamp + key

    obj, module = cache.cached_object(text), None
    if obj is None:
        roots = {*runs, *(f for entry in (*fused.values(), *batches.values())
                          for f in entry if isinstance(f, str) and f.startswith("F"))}
        module = ir_module(source(sorted(roots)), tol, fused, batches, runs, looks, resume)
        if len(module) <= TIER_CHARS:
            obj, module = compile_ir(module), None
            cache.store_object(text, obj)
        else:
            obj = compile_ir(module, quick=True)
    lib = Library(obj)
    out: dict = {name: Run(lib, name) for name in runs}
    out.update({name: (Fused if budget else Run)(lib, name)
                for name, (_, _, budget, _, _) in fused.items()})
    if batches:
        out.update({name: Batch(lib, name, mode, kinds[fw]) for name, (mode, fw, *_) in
                    batches.items()})
    if module is not None:
        Tier(text, module, list(out.values()))
    return out


# A module of more than TIER_CHARS characters of IR (the GMM example's gradient: 3 MB) is
# compiled twice: at once with no optimisation (a tenth of the time; its code runs 5x to
# 35x slower), which each entry's first call in a thread runs, and optimised on a thread
# meanwhile, which later calls wait for (Tier). A first call with a step budget above
# QUICK_STEPS runs the quick code with QUICK_STEPS; one that needs more (or fails) is run
# again, whole, on the optimised code, once it is made (steps bound its time only
# roughly: an array instruction is one step), and a failure is reported by the code that
# would have run it anyway.
TIER_CHARS = 200_000
QUICK_STEPS = 1_000_000_000
QUICK_CELLS = 1 << 20   # a heap of more cells is not copied for a run again: a first call
#                         with a budget above QUICK_STEPS waits for the optimised code
CHUNK_ROWS = 64         # a first batch's first chunk of rows (Batch.meanwhile)
_HELPERS = ("rvm_array_", "rvm.gemm", vectormath.PREFIX)    # (optimised in quick code too)


class Tier:
    """A module's optimised machine code on its way (see TIER_CHARS): it is compiled on a
    thread of its own, put in the cache, and given to the module's entries, which ran
    the quick code till then. The thread holds LLVM's lock while LLVM works (other
    compiles wait for it) and not the GIL (native code, the quick code's too, runs
    meanwhile). A process that ends waits for it (at exit), so that the next finds the
    optimised code in the cache."""

    def __init__(self, text: str, module: str, entries: list):
        self.entries, self.done = entries, threading.Event()
        self.served: set = set()    # (entry, thread) whose first call ran (ids)
        for e in entries:
            e.tier = self
        if _SIGNALS:                            # (its code made first: a run compiles
            with contextlib.suppress(Exception):    # it, and would wait for the thread:
                _handler()                          # interrupts)
        thread = threading.Thread(target=self._work, args=(text, module), daemon=True,
                                  name="rvm-optimise")
        with _TIERS_LOCK:
            _TIERS[:] = [t for t in _TIERS if not t.done.is_set()] + [self]
            thread.start()

    def _work(self, text: str, module: str) -> None:
        from . import cache
        try:
            with _LLVM_LOCK:
                obj = _compile_ir(module)
            cache.store_object(text, obj)
            lib = Library(obj)
            for e in self.entries:      # (a call under way goes on with the quick code)
                e.promote(lib)
        except Exception:               # (the quick code stays: the same answers)
            pass
        finally:
            for e in self.entries:
                e.tier = None
            self.done.set()

    def call(self, entry, state: np.ndarray, budget: int, run, restore,
             bounded: bool = True) -> object:
        """entry called by run(b) with step budget b. Its first call that succeeds runs
        the quick code, with QUICK_STEPS where `budget` is larger (then the budget left,
        and every other budget the state array notes, are put as if the run had had
        `budget`: the same run, which did not run out); where that fails, restore() puts
        back what it changed and the call waits for the optimised code, as every later
        call does (calls after the first run at full speed, as before the two tiers).
        bounded=False (nothing to put back: QUICK_CELLS): with a budget above
        QUICK_STEPS, the optimised code."""
        key = (id(entry), threading.get_ident())    # (each thread's first call: a
        if key in self.served:                      # pool's threads start together)
            self.done.wait()
            return run(budget)
        if not bounded and budget > QUICK_STEPS:    # (nothing to put back, no bound)
            self.done.wait()
            return run(budget)
        if budget <= QUICK_STEPS:
            out = run(budget)
            self.served.add(key)
            return out
        saved = state.copy()
        try:
            out = run(QUICK_STEPS)
        except Fault as e:
            if getattr(e, "code", None) == FULL:    # (the heap too small: the caller
                _shift(state, saved, budget)        # grows it and calls again)
                raise
            state[:] = saved
            restore()
            self.done.wait()
            return run(budget)
        _shift(state, saved, budget)
        self.served.add(key)
        return out


def _shift(state: np.ndarray, saved: np.ndarray, budget: int) -> None:
    """The budgets a run with QUICK_STEPS steps noted in the state array, as the same
    run with `budget` steps notes them (each the budget left somewhere: -1 where none)."""
    more = budget - QUICK_STEPS
    for k in (LEFT, LAST, NOW, SHADOWS):
        if state[k] >= 0 and (k == LEFT or state[k] != saved[k]):
            state[k] += more
    if state[STOP] != NO_STOP and state[STOP] != saved[STOP]:
        state[STOP] += more


_TIERS: list[Tier] = []     # (their `done`, not their threads: a join that Ctrl-C
_TIERS_LOCK = threading.Lock()  # stops marks the thread stopped, though it runs on)


def _wait_for_tiers() -> None:
    """Until no optimised code is being made (no thread of LLVM's at work)."""
    with _TIERS_LOCK:
        tiers = list(_TIERS)
    for tier in tiers:
        tier.done.wait()


_STOPPED = [False]      # a Ctrl-C came (see interrupted)


def interrupted() -> None:
    """Note a Ctrl-C (KeyboardInterrupt) that stops the program (rvm's command line: a
    script's uncaught one is sys.last_type): at exit, the process does not wait for
    optimised code being made (see _finish_tiers). A KeyboardInterrupt the program
    catches is not one."""
    _STOPPED[0] = True


@atexit.register
def _finish_tiers() -> None:
    """At exit: wait for the optimised code being made (it goes into the cache). After
    a Ctrl-C (during that wait, or one that stopped the program: interrupted, or an
    uncaught KeyboardInterrupt) the process ends at once, exit code 130, without it: the
    interpreter's shutdown would free what LLVM, still at work on its thread, uses (the
    process crashed)."""
    try:
        if _STOPPED[0] or (getattr(sys, "last_type", None) is KeyboardInterrupt and
                           not hasattr(sys, "ps1")):    # (not a prompt's, interactive)
            raise KeyboardInterrupt
        _wait_for_tiers()
    except KeyboardInterrupt:
        with _TIERS_LOCK:
            if all(t.done.is_set() for t in _TIERS):
                return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(130)


if hasattr(os, "register_at_fork"):     # (a child has no thread of LLVM's, and LLVM's
    os.register_at_fork(before=_wait_for_tiers)     # locks as the fork found them)
