"""The `rvm` command: asm | dis | run | grad.

Exit codes: 0 success, 1 a user error (message on stderr, no traceback), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import numpy as np

from .api import load, save
from .core.errors import MachineError, RvmError, UsageError
from .core.program import Program
from .engines.arguments import plural
from .engines.machine import Machine
from .formats.assembly import disassemble


def _entry(names: list[str], source: str, name: str | None) -> str:
    """The function to run: --entry, else main, else the only function (exit 2 if there is
    a choice to make)."""
    if name is not None:
        if name not in names:
            raise RvmError(f"no function {name!r} in {source} (it has: {', '.join(names)})")
        return name
    if "main" in names:
        return "main"
    if not names:
        raise RvmError(f"{source} defines no function")
    if len(names) == 1:
        return names[0]
    raise UsageError(f"{source} has several functions and no main: choose one with "
                     f"--entry ({', '.join(names)})")


def _value(text: str):
    """A CLI argument: an integer, a float, a complex number like 1+2j, or an array literal
    like [1.0,2.5] (float64; [1,2] is int64)."""
    try:
        if text.startswith("["):
            items = json.loads(text)
            floats = any(isinstance(v, float) for v in items) or "." in text
            return np.array(items, dtype=np.float64 if floats else np.int64)
        return int(text, 0)
    except (ValueError, TypeError, json.JSONDecodeError):
        pass
    try:
        return float(text) if not text.rstrip().endswith("j") else complex(text)
    except ValueError:
        raise RvmError(f"argument {text!r} is not a number or an array like [1.0,2.0]") from None


def _arguments(texts: list[str], name_of=None) -> list:
    """The values of --args; a bad one is named by its parameter: name_of(k, the values
    before it), if given."""
    out = []
    for k, t in enumerate(texts):
        try:
            out.append(_value(t))
        except RvmError as e:
            try:
                name = name_of(k, out) if name_of is not None else None
            except (RvmError, LookupError):
                name = None
            if name:
                raise RvmError(str(e).replace("argument ", f"argument {name}: ", 1)) \
                    from None
            raise
    return out


def _argument_name(program: Program, functions: list[str], args, k: int, before: list):
    """The name of the entry's k-th argument (after the values `before` it): its source
    name, its derived name (x_bar) or, in assembly, its register."""
    name, kind = _derivation(functions, args.entry, getattr(args, "transform", None))
    entry = _entry(functions, program.source, name)
    rf = program.cache.get("unannotated", {}).get(entry)
    if rf is not None:
        names = [a.arg for a in rf.node.args.args]
        return names[k] if k < len(names) else None
    fn = program.functions[entry]
    if kind in ("tangent", "adjoint"):
        from .ad.derivatives import derived_names
        names = derived_names(fn, "dot" if kind == "tangent" else "bar")
    else:
        names = fn.names
    if names:
        return names[k] if k < len(names) else None
    at = sum(1 + np.ndim(v) if isinstance(v, np.ndarray) else 2 if isinstance(v, complex)
             else 1 for v in before)
    return str(fn.params[at]) if kind is None and at < len(fn.params) else None


def _jsonable(v):
    """JSON for a result; a complex number is the pair [real, imag]."""
    if isinstance(v, np.ndarray) and v.dtype.kind == "c":
        v = v.view(np.float64).reshape(*v.shape, 2)
    if isinstance(v, complex):
        return [v.real, v.imag]
    return v.tolist() if isinstance(v, np.ndarray) else v


def _machine(program: Program, args, **extra) -> Machine:
    return Machine(program, max_steps=args.max_steps, heap_limit=args.heap_limit,
                   engine=args.engine, checks=not args.no_checks, **extra)


def _print_values(names: list[str], values, as_json: bool, prefix: str = "") -> None:
    if as_json:
        print(json.dumps({n: _jsonable(v) for n, v in zip(names, values)}))
    else:
        for name, v in zip(names, values):
            shown = np.array2string(v, separator=", ") if isinstance(v, np.ndarray) else repr(v)
            print(f"{prefix}{name} = {shown}")


def cmd_asm(args) -> None:
    program = load(args.file)
    out = args.output or os.path.splitext(args.file)[0] + ".rvmb"
    save(program, out)
    print(f"wrote {out} ({len(program.functions)} functions, "
          f"{sum(len(f.code) for f in program.functions.values())} instructions)")


def _transformed(args) -> Program:
    """The file's program, or with --tangent/--adjoint NAME the derivative program of
    function NAME (and what it calls)."""
    program = load(args.file)
    kind = "tangent" if args.tangent else "adjoint" if args.adjoint else None
    if kind is None:
        return program
    from .ad import transforms
    name = _entry(list(program.functions), program.source, args.tangent or args.adjoint)
    derived, _ = getattr(transforms, kind)(program, name)
    return derived


def cmd_compile(args) -> None:
    program = _transformed(args)
    left = {name: rf for name, rf in program.cache.get("unannotated", {}).items()
            if name not in program.functions}
    if left and not program.functions:    # typed only by a call's arguments: nothing to write
        listing = "; ".join(f"{name}: " + ", ".join(
            a.arg for a in rf.node.args.args if a.annotation is None) for name, rf in left.items())
        raise RvmError(f"{args.file}: nothing to compile: parameters without annotations "
                       f"({listing}). Annotate each (x: float, n: int, a: Array[float]) to "
                       "compile it; `rvm run` and `rvm grad` take it as it is, typed by --args")
    if args.emit == "asm":
        text = disassemble(program, annotate=True, source=True)
        if args.output:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        else:
            print(text, end="")
        return
    out = args.output or os.path.splitext(args.file)[0] + ".rvmb"
    save(program, out)
    print(f"wrote {out} ({', '.join(program.functions)})")


def cmd_dis(args) -> None:
    print(disassemble(_transformed(args), annotate=not args.plain), end="")


TRANSFORMS = {"inverse": "inverse", "inv": "inverse", "adjoint": "adjoint", "adj": "adjoint",
              "tangent": "tangent", "tan": "tangent"}


def _derivation(names: list[str], entry: str | None, transform: str | None):
    """(function, transform) from --entry and --transform. An entry that names a derived
    program, as the API and the disassembly name them (`f.adj`, `f.adjoint`,
    `adjoint(f)`; `f.tan`, `tangent(f)`; `f.inv`, `f.inverse`, `inverse(f)`), is that
    transform of f, unless the program has a function of that very name (a compiled
    derivative)."""
    if entry is None or entry in names:
        return entry, transform
    m = re.fullmatch(r"(inverse|adjoint|tangent)\((.+)\)", entry)
    base, kind = (m.group(2), m.group(1)) if m else (entry.rpartition(".")[0],
                                                     TRANSFORMS.get(entry.rpartition(".")[2]))
    if not base or kind is None:
        return entry, transform
    if transform is not None and transform != kind:
        raise UsageError(f"--entry {entry} is the {kind} of {base}, but --transform is "
                         f"{transform}")
    return base, kind


def _derive(program: Program, names: list[str], args, values) -> tuple[Program, str]:
    """The entry to run, and the program holding it: with --transform (or an entry like
    f.adj) the inverse, adjoint or tangent program of the function (the debugger's and
    the editor's `transform`: rvm.debugger.dap.derived)."""
    name, kind = _derivation(names, args.entry, getattr(args, "transform", None))
    entry = _entry(names, program.source, name)
    if kind is None:
        return program, entry
    from .debugger.dap import derived
    from .lang import specialized
    rf = program.cache.get("unannotated", {}).get(entry)
    if rf is not None:          # typed by its own arguments: the first values
        program, entry = specialized(program, entry, values[:len(rf.node.args.args)])
    if kind in ("tangent", "adjoint") and any(isinstance(v, np.ndarray) for v in values):
        return _derived_of_arrays(program, entry, kind, args, values)
    out, name = derived(program, entry, kind)
    if kind in ("tangent", "adjoint"):      # its arguments named n, x, x_bar...
        from .ad.derivatives import named
        out = named(out, name, program.functions[entry], kind)
    return out, name


def _derived_of_arrays(program: Program, entry: str, kind: str, args, values: list):
    """The tangent or adjoint program of a function given arrays, as rvm.tangent and
    rvm.adjoint make and call it: --args are the function's arguments, then one tangent
    (or shadow) per float argument, an array's an array of its shape; the program takes
    each array interleaved with its tangents (values are packed so in place), and
    args.unpack gives a run's results back as the function's values, then the
    tangents, named after its arguments (x, x_dot)."""
    from .ad.derivatives import KINDS, arity, as_bound, float_arguments, packed_call
    fn, given = program[entry], list(values)
    n = arity(fn, given)
    given[:n] = as_bound(fn, given[:n])     # (an int array declared as floats: floats)
    labels = _labels(program, entry, given[:n])
    names = [x[0] for x in labels] + [f"{labels[k][0]}_{KINDS[kind][1]}"
                                      for k in float_arguments(fn, given[:n])]
    if len(given) != len(names):
        raise UsageError(f"the {kind} of {entry} takes {plural(len(names), 'argument')} "
                         f"({', '.join(names)}); --args gives {len(given)}")
    t, out, name, values[:] = packed_call(fn, kind, given)
    args.unpack = lambda results: (names, t.unpack(given, results))
    return out, name


def _program(args) -> tuple[Program, str, list]:
    """The program, entry and argument values a command runs on (a .py function without
    annotations is compiled for the arguments' types)."""
    from .lang import specialized
    if getattr(args, "modular", None) is not None or getattr(
            args, "stack_capacity", None) is not None or getattr(args, "unchecked", False):
        # Janus: -m[N], stacks, overflow checks
        from .lang import janus
        program = janus.load_modular(args.file, getattr(args, "modular", None),
                                     getattr(args, "stack_capacity", None),
                                     not getattr(args, "unchecked", False))
    else:
        program = load(args.file)
    names = list(program.functions) + list(program.cache.get("unannotated", {}))
    values = _arguments(args.args, lambda k, before: _argument_name(program, names, args,
                                                                     k, before))
    program, entry = _derive(program, names, args, values)     # (packs values it must)
    if "janus" in program.cache:
        from .lang import janus
        if entry == "main" and not values:        # main's variables, as declared
            values = janus.main_arguments(program)
        else:
            values = janus.listed(program, entry, values)
        values = list(janus.to_machine(program, entry, values))
    if getattr(args, "count", True):   # (rvm dap derives its `transform` after loading)
        _count(program, entry, values)
    program, entry = specialized(program, entry, values)
    return program, entry, values


def _count(program: Program, entry: str, values: list) -> None:
    """A wrong number of --args is bad usage (exit 2), said before anything runs."""
    rf = program.cache.get("unannotated", {}).get(entry)
    fn = program.functions.get(entry)
    names = [a.arg for a in rf.node.args.args] if rf is not None else \
        list(fn.names) if fn is not None and fn.names else None
    if names is not None:
        if len(values) != len(names):
            raise UsageError(f"{entry} takes {plural(len(names), 'argument')} "
                             f"({', '.join(names)}); --args gives {len(values)}")
        return
    if fn is None:
        return
    fill = sum(1 + np.ndim(v) if isinstance(v, np.ndarray) and v.dtype.kind != "c" else
               2 if isinstance(v, (complex, np.ndarray)) else 1 for v in values)
    if fill != len(fn.params):
        raise UsageError(f"{entry} takes {plural(len(fn.params), 'parameter register')} "
                         f"({', '.join(map(str, fn.params))}); the "
                         f"{plural(len(values), 'value')} of --args "
                         f"fill{'s' if len(values) == 1 else ''} {fill} (an array fills "
                         "1 + ndim integer registers, a complex number two float ones)")


def cmd_run(args) -> None:
    program, entry, values = _program(args)
    if "janus" in program.cache and not args.trace:
        from .lang import janus

        def run(p, out):        # (again with other stacks where one is full, or too large)
            m = _machine(p, args)
            m.out = out
            go = m.uncall if args.backward else m.call
            given = janus.main_arguments(p) if entry == "main" and not args.args else values
            return m, go(entry, *janus.to_machine(p, entry, given))
        program, (m, results) = janus.growing(program, run)
        if entry == "main" and not args.json:
            print(janus.show_store(program, results))
            return
        results = janus.from_machine(program, entry, results)
        _print_values([b.name for b in m.bindings], results, args.json)
        return
    m = _machine(program, args)
    m.enter(entry, *values, backward=args.backward)
    if args.trace:
        m.engine = "interp"         # a trace steps one instruction at a time
        from .debugger.trace import traced_run
        # the root frame of an uncall runs backwards while the machine moves forwards
        traced_run(m, 1, sys.stdout)
        m.check_locals(m.stack[0])
        results = m.results()
    else:
        results = m.finish()
    if "janus" in program.cache:
        from .lang import janus
        if entry == "main" and not args.json:
            print(janus.show_store(program, results))
            return
        results = janus.from_machine(program, entry, results)
    names = [b.name for b in m.bindings]
    if getattr(args, "unpack", None) is not None:   # (a derivative of arrays: _derive)
        names, results = args.unpack(results)
    _print_values(names, results, args.json)


def cmd_grad(args) -> None:
    from .ad.gradient import grad
    program, entry, values = _program(args)
    labels = _labels(program, entry, values)
    loss = _loss(args.loss, labels, values)
    wrt = args.wrt or [names[0] for names in labels]   # each under the name it was given
    keep = [_which(w, labels, "--wrt") for w in wrt]
    grads = grad(program[entry], loss=loss, argnums=tuple(keep), **_options(args))(*values)
    _print_values([w if w in labels[k] else labels[k][0] for w, k in zip(wrt, keep)],
                  list(grads), args.json, prefix=f"d{args.loss}/d")


def _labels(program: Program, entry: str, values) -> list[list[str]]:
    """Every name of each argument, the first the one results are printed under: its
    source name (.py, .ja) or registers, then its registers and `.alias` names."""
    m = Machine(program, engine="interp")
    m.enter(entry, *values)
    fn = program.functions[entry]
    out = []
    for b in m.bindings:
        regs = [fn.params[k] for k in b.params]
        names = [b.name, ":".join(map(str, regs)), *map(str, regs)]
        names += [s.name for s in fn.symbols if s.regs and s.regs[0] in regs]
        out.append(list(dict.fromkeys(names)))
    return out


def _loss(text: str, labels: list[list[str]], values: list):
    """What --loss names: an argument (as _which takes it), or an element of an array
    argument as an index says it in Python, W[3] or W[1, 2] (rvm.grad's (argument,
    element))."""
    text = text.strip()
    m = re.fullmatch(r"(.+?)\[\s*(\d+(?:\s*,\s*\d+)*)\s*\]", text)
    k = _which(m.group(1) if m else text, labels, "--loss")
    if m:
        index = tuple(int(i) for i in m.group(2).split(","))
        return k, index[0] if len(index) == 1 and not isinstance(k, str) and \
            np.ndim(values[k]) == 1 else index
    if isinstance(k, int) and isinstance(values[k], np.ndarray):
        raise UsageError(f"--loss {text}: {labels[k][0]} is an array; name one element, "
                         f"as --loss '{labels[k][0]}[0]'")
    return k


def _which(text: str, labels: list[list[str]], option: str) -> int | str:
    """The argument index a --loss/--wrt names: an index, or any of its names (a --loss
    named otherwise is left to rvm.grad, which says what it takes)."""
    text = text.strip()
    if text.isdigit() and int(text) < len(labels):
        return int(text)
    for k, names in enumerate(labels):
        if text in names:
            return k
    if option == "--loss":
        return int(text) if text.isdigit() else text
    raise UsageError(f"{option} {text}: no such argument (the arguments are "
                     f"{', '.join(names[0] for names in labels)}; or an index 0.."
                     f"{len(labels) - 1})")


def _options(args) -> dict:
    return dict(max_steps=args.max_steps, heap_limit=args.heap_limit, engine=args.engine,
                checks=not args.no_checks)


def cmd_jvp(args) -> None:
    from .ad.derivatives import float_arguments, jvp
    program, entry, values = _program(args)
    labels = _labels(program, entry, values)
    names = [n[0] for n in labels]
    if args.wrt:          # tangent 1 (every element of an array) for these, 0 elsewhere
        if args.tangents:
            raise UsageError("give --tangents or --wrt, not both")
        floats = float_arguments(program[entry], values)
        wrt = [_which(w, labels, "--wrt") for w in args.wrt]
        for w, k in zip(args.wrt, wrt):
            if k not in floats:
                raise UsageError(f"--wrt {w}: {names[k]} is not a float argument (the "
                                 f"float arguments are "
                                 f"{', '.join(names[f] for f in floats) or 'none'})")
        tangents = [None if k not in floats else np.ones(np.shape(v)) if k in wrt and
                    np.ndim(v) else 1.0 if k in wrt else np.zeros(np.shape(v)) if
                    np.ndim(v) else 0.0 for k, v in enumerate(values)]
    else:
        tangents = [None if t.lower() == "none" else _value(t) for t in args.tangents]
        if len(tangents) != len(values):
            raise UsageError(f"--tangents gives {plural(len(tangents), 'tangent')} for "
                             f"{plural(len(values), 'argument')} ({', '.join(names)}): one "
                             "per argument, None for integers (or --wrt NAME...)")
    outs, dots = jvp(program[entry], values, tangents, **_options(args))
    if args.loss is not None:          # the loss's value and tangent only
        k = _which(args.loss, labels, "--loss")
        if not isinstance(k, int) or not 0 <= k < len(labels):
            raise UsageError(f"--loss {args.loss}: no such argument (the arguments are "
                             f"{', '.join(names)}; or an index 0..{len(labels) - 1})")
        names, outs, dots = [names[k]], [outs[k]], [dots[k]]
    if args.json:
        print(json.dumps({"values": dict(zip(names, map(_jsonable, outs))),
                          "tangents": dict(zip(names, map(_jsonable, dots)))}))
    else:
        _print_values(names, outs, False)
        _print_values(names, dots, False, prefix="tangent ")


def cmd_hessian(args) -> None:
    from .ad.derivatives import float_arguments, hessian
    program, entry, values = _program(args)
    labels = _labels(program, entry, values)
    loss = _which(args.loss, labels, "--loss")
    wrt = [_which(w, labels, "--wrt") for w in args.wrt] if args.wrt else \
        float_arguments(program[entry], values)
    h = hessian(program[entry], loss=loss, wrt=wrt, **_options(args))(*values)
    if args.json:
        print(json.dumps(h.tolist()))
        return
    rows = []           # one label per row and column: an array's elements a[0], a[1]...
    for k in wrt:
        v, name = values[k], labels[k][0]
        rows += [f"{name}[{', '.join(map(str, e))}]" if np.ndim(v) > 1 else f"{name}[{e[0]}]"
                 for e in np.ndindex(np.shape(v))] if np.ndim(v) else [name]
    cells = [[f"{x:.17g}" for x in row] for row in h.tolist()]
    width = max([len(t) for t in rows] + [len(c) for row in cells for c in row])
    first = max(len(t) for t in rows)
    print(f"the Hessian of {args.loss}:")
    print(" " * first + "  " + "  ".join(t.rjust(width) for t in rows))
    for t, row in zip(rows, cells):
        print(t.ljust(first) + "  " + "  ".join(c.rjust(width) for c in row))


def cmd_draw(args) -> None:
    from .drawing import draw
    program = load(args.file)
    names = list(program.functions)
    # --tangent NAME / --adjoint NAME are --entry NAME with --transform tangent / adjoint
    given = args.tangent or args.adjoint or args.entry
    transform = "tangent" if args.tangent else "adjoint" if args.adjoint else args.transform
    name, kind = _derivation(names, given, transform)
    entry = _entry(names, program.source, name)
    inverse = args.inverse or kind == "inverse"
    if kind in ("tangent", "adjoint"):      # the forward-mode program, the gradient pass
        from .ad import transforms
        program, _ = getattr(transforms, kind)(program, entry)
        entry = f"{entry}.{kind[:3]}"
    picture = draw(program, entry, args.view, args.depth, inverse, args.collapse)
    out = args.output or f"{os.path.splitext(os.path.basename(args.file))[0]}.{entry}." \
        f"{args.view}.svg"
    picture.save(out)
    print(f"wrote {out}")


def cmd_cache(args) -> None:
    from .engines import cache
    keep = cache.keep()     # (a bad RVM_CACHE_MAX or RVM_CACHE_DIR: CacheSettingError, exit 1)
    if args.action == "clear":
        print(f"removed {cache.clear()} cached module(s)")
        return
    where, programs, size = cache.info()
    if where is None:
        print("the native code cache is off (RVM_CACHE_DIR is empty)")
    else:
        print(f"{where}: {programs} module(s), {size / 1e6:.1f} MB (keeps the {keep} most "
              "recently compiled)")
        if cache.problem(where):
            print(f"not used: {cache.problem(where)}")


def cmd_debug(args) -> None:
    from .debugger import Debugger, repl
    program, entry, values = _program(args)
    dbg = Debugger(program, entry, tuple(values), max_steps=args.max_steps)
    dbg.m.heap_limit = args.heap_limit
    dbg.convert = _arguments            # `run ARGS`: written as --args takes them
    if "janus" in program.cache:        # Janus values (stacks, arrays) as the machine's
        from .lang import janus
        dbg.convert = lambda texts: list(janus.to_machine(program, entry, _arguments(texts)))
    batch = None
    if args.batch:
        try:
            with open(args.batch, encoding="utf-8") as f:
                batch = f.read().splitlines()
        except OSError as e:
            raise RvmError(f"{args.batch}: cannot read: {e.strerror}") from None
    repl(dbg, batch=batch)


def cmd_dap(args) -> None:
    from .debugger import dap
    if args.port is not None and not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: a port is 0..65535")
    def load(path: str, entry, texts: list):
        return _program(argparse.Namespace(file=path, entry=entry, args=texts, count=False))
    if args.port is None:
        dap.serve_stdio(load)
    else:
        dap.serve_tcp(args.port, load, once=args.once)


EXAMPLES = {
    "asm": "rvm asm asm/fib.rasm -o fib.rvmb",
    "compile": "rvm compile examples/besselj.py --emit asm",
    "dis": "rvm dis asm/fib.rasm",
    "run": "rvm run asm/fib.rasm --args 10 0 0 --json\n"
           "  rvm run asm/fib.rasm --args 10 55 89 --backward",
    "grad": "rvm grad asm/besselj.rasm --entry besselj --loss f0 --args 0 2 1.0",
    "jvp": "rvm jvp asm/poly.rasm --entry f --args 0.0 1.0 3.0 --tangents 0 1 0",
    "hessian": "rvm hessian asm/poly.rasm --entry f --loss f0 --args 0.0 1.0 3.0",
    "debug": "rvm debug asm/fib.rasm --args 10 0 0",
    "dap": "rvm dap              (an editor starts it; see docs/debugger.md)\n"
           "  rvm dap --port 4711  (serve on 127.0.0.1:4711)",
    "cache": "rvm cache info",
    "draw": "rvm draw asm/fib.rasm -o fib.svg\n  rvm draw asm/fib.rasm --view cfg -o fib-cfg.svg",
}


def _help(command: str) -> dict:
    """Options every subcommand parser gets: no abbreviations, and an example."""
    values = "Negative numbers are values (--args 0.0 -1e-8); " \
        if "--args" in EXAMPLES[command] else ""     # (only where --args is taken: not draw)
    return dict(allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog=f"example:\n  {EXAMPLES[command]}\n\n{values}exit codes: 0 ok, 1 "
                       "an error in the program or its input, 2 bad usage.")


NAMES = "by its source name (.py, .ja), its register or .alias name (.rasm: f0, out), " \
    "or its index (0, 1, ...)"


def _derivatives(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tangent", metavar="NAME",
                   help="the tangent program of function NAME instead (forward mode)")
    g.add_argument("--adjoint", metavar="NAME",
                   help="the adjoint program of function NAME instead (reverse mode)")


def _transform(p: argparse.ArgumentParser) -> None:
    p.add_argument("--transform", choices=["inverse", "adjoint", "tangent"],
                   help="the entry's inverse, adjoint or tangent program instead, as "
                   "rvm.inverse/adjoint/tangent make it (--entry f.adj, f.tan, f.inv say "
                   "the same); --args are then that program's arguments: the entry's, "
                   "then one tangent (or shadow) per float argument, an array's an array")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rvm", allow_abbrev=False, description=(
        "A reversible virtual machine: run programs forwards and backwards, and "
        "differentiate them."))
    p.add_argument("--version", action="version", version="rvm 0.1.0")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    a = sub.add_parser("asm", **_help("asm"), help="assemble FILE.rasm into bytecode (.rvmb)")
    a.add_argument("file")
    a.add_argument("-o", "--output", help="output file (default: FILE.rvmb)")
    a.set_defaults(run=cmd_asm)

    c = sub.add_parser("compile", **_help("compile"),
                       help="compile a .py file (its @rvm.reversible functions) or a .ja file")
    c.add_argument("file")
    c.add_argument("-o", "--output", help="output file (default: FILE.rvmb)")
    c.add_argument("--emit", choices=["rvmb", "asm"], default="rvmb",
                   help="bytecode (default), or readable assembly with the source lines")
    _derivatives(c)
    c.set_defaults(run=cmd_compile)

    d = sub.add_parser("dis", **_help("dis"), help="disassemble a .rasm, .rvmb, .py or .ja file")
    d.add_argument("file")
    d.add_argument("--plain", action="store_true", help="no index/line comments")
    _derivatives(d)
    d.set_defaults(run=cmd_dis)

    def runner(name: str, help: str):
        r = sub.add_parser(name, help=help, **_help(name))
        r.add_argument("file", help=".rasm, .rvmb, .py (@rvm.reversible functions) "
                       "or .ja/.janus (Janus)")
        r.add_argument("--entry", help="function to run (default: main, or the only one)")
        r.add_argument("--args", nargs="*", default=[], metavar="V",
                       help="parameter values, in order")
        r.add_argument("--json", action="store_true", help="print one JSON object")
        r.add_argument("--max-steps", type=int, default=100_000_000, metavar="N",
                       help="step budget (default 1e8)")
        r.add_argument("--heap-limit", type=int, default=1 << 24, metavar="CELLS",
                       help="heap size limit in cells (default 2^24)")
        r.add_argument("--engine", choices=["interp", "python", "native", "auto"],
                       default=None, help="execution engine (default: auto)")
        r.add_argument("--no-checks", action="store_true",
                       help="skip invertibility checks (for trusted programs)")
        r.add_argument("--verbose", action="store_true",
                       help="with an error in a compiled program, also the registers and "
                       "instruction involved")
        return r

    r = runner("run", "run a function forwards (or backwards) and print its parameters")
    r.add_argument("--backward", action="store_true", help="uncall: run it backwards")
    r.add_argument("-m", dest="modular", nargs="?", type=int, const=32, metavar="N",
                   help="Janus: N-bit modular integers (default 32), as jana's -m; write "
                   "-m32 before the file or -m after it")
    r.add_argument("--stack-capacity", type=int, metavar="N",
                   help="Janus: the elements each stack of main's and each local stack "
                   "holds at first (default 65536; a full stack grows: the run starts "
                   "again with stacks twice as large, up to --heap-limit; stacks that do "
                   "not fit it start smaller)")
    r.add_argument("--no-overflow-checks", dest="unchecked", action="store_true",
                   help="Janus: int updates wrap around int64 instead of stopping with an "
                   "overflow error (faster on the interpreter)")
    r.add_argument("--trace", action="store_true",
                   help="print every executed instruction with the registers it changed")
    _transform(r)
    r.set_defaults(run=cmd_run)

    g = runner("grad", "gradient of one float argument's final value (the loss) w.r.t. "
               "every argument's initial value")
    g.add_argument("--loss", required=True, metavar="NAME",
                   help=f"the loss: a float argument, {NAMES}")
    g.add_argument("--wrt", nargs="+", metavar="NAME",
                   help="print only these arguments' gradients (default: all), named as "
                   "--loss is")
    g.set_defaults(run=cmd_grad)

    j = runner("jvp", "forward mode: the values and J @ tangents (the tangent program)")
    j.add_argument("--tangents", nargs="*", default=[], metavar="T",
                   help="one tangent per argument (None for integers; an array's is an "
                   "array)")
    j.add_argument("--wrt", nargs="+", metavar="NAME",
                   help="instead of --tangents: tangent 1 for these float arguments (every "
                   "element of an array), 0 for the others; named as --loss is")
    j.add_argument("--loss", metavar="NAME",
                   help=f"print only this argument's value and tangent: {NAMES}")
    j.set_defaults(run=cmd_jvp)

    h = runner("hessian", "Hessian of one float parameter (the loss), forward over reverse")
    h.add_argument("--loss", required=True, metavar="NAME",
                   help=f"the loss: a float argument, {NAMES}")
    h.add_argument("--wrt", nargs="*", metavar="NAME",
                   help="the float arguments (default: all), named as --loss is")
    h.set_defaults(run=cmd_hessian)

    w = sub.add_parser("draw", **_help("draw"),
                       help="a function as a reversible circuit or a control-flow graph (SVG)")
    w.add_argument("file")
    w.add_argument("--entry", help="the function (default: main, or the only one)")
    w.add_argument("-o", "--output", help="OUT.svg (or .png / .pdf with cairosvg)")
    w.add_argument("--view", choices=["circuit", "cfg"], default="circuit")
    w.add_argument("--depth", type=int, default=0, help="expand calls N levels deep")
    w.add_argument("--inverse", action="store_true", help="the inverse program (the mirror)")
    w.add_argument("--collapse", type=int, default=0, metavar="N",
                   help="draw runs of more than N straight-line instructions as one box")
    w.add_argument("--transform", choices=["inverse", "adjoint", "tangent"],
                   help="draw the entry's inverse (as --inverse), its gradient pass (NAME.adj) "
                   "or its forward-mode program (NAME.tan); --entry f.adj says the same")
    _derivatives(w)
    w.set_defaults(run=cmd_draw)

    k = sub.add_parser("cache", **_help("cache"),
                       help="the on-disk cache of native code: where, how big; or clear it")
    k.add_argument("action", choices=["info", "clear"])
    k.set_defaults(run=cmd_cache)

    b = runner("debug", "step through a function forwards and backwards (gdb-like)")
    b.add_argument("--batch", metavar="FILE", help="run the commands in FILE, one per line")
    b.add_argument("--stack-capacity", type=int, metavar="N",
                   help="Janus: the elements each stack holds (default 65536; stacks do not "
                   "grow in the debugger)")
    _transform(b)
    b.set_defaults(run=cmd_debug)

    a = sub.add_parser("dap", **_help("dap"), help="the debugger for editors: a Debug Adapter "
                       "Protocol server (stdio, or --port) with step back")
    a.add_argument("--port", type=int, metavar="N",
                   help="serve on TCP port N of 127.0.0.1 (0: any free port) instead of stdio")
    a.add_argument("--once", action="store_true", help="with --port: end after one session")
    a.set_defaults(run=cmd_dap)
    return p


NEGATIVE = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-(inf|nan)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # argparse takes "-1e-8" for an option; a leading space makes it a value (and int() and
    # float() ignore the space)
    argv = [" " + a if NEGATIVE.fullmatch(a) else a for a in argv]
    args = parser().parse_args(argv)
    progress = None
    if sys.stderr.isatty() and args.command not in ("debug", "dap"):
        from rich.console import Console

        from .debugger.views import ProgressLine
        progress = ProgressLine(Console(stderr=True))
    Machine.default_progress = progress  # long stepped runs show where they are
    try:
        args.run(args)
    except UsageError as e:
        print(f"rvm: usage error: {e}", file=sys.stderr)
        return 2
    except RvmError as e:
        kind = f"{type(e).__name__}: " if isinstance(e, MachineError) else ""
        print(f"rvm: {kind}{e}", file=sys.stderr)
        if getattr(args, "verbose", False) and getattr(e, "detail", "") and \
                e.detail != getattr(e, "message", None):        # (not the same words twice)
            print(f"  register-level detail: {e.detail}", file=sys.stderr)
        return 1
    except OSError as e:                # output the user pointed at (stdout, a file)
        print(f"rvm: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rvm: interrupted", file=sys.stderr)
        back_end = sys.modules.get("rvm.engines.llvm")
        if back_end is not None:    # (no wait at exit for optimised code being made)
            back_end.interrupted()
        return 130
    except BrokenPipeError:
        return 0
    finally:
        if progress is not None:
            progress.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
