"""The `rvm` command: asm | dis | run | grad.

Exit codes: 0 success, 1 a user error (message on stderr, no traceback), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import isa
from .api import load, save
from .assembler import disassemble
from .errors import RvmError
from .machine import Machine
from .program import Program


def _entry(program: Program, name: str | None) -> str:
    if name is not None:
        if name not in program.functions:
            raise RvmError(f"no function {name!r} in {program.source} (it has: "
                           f"{', '.join(program.functions)})")
        return name
    if len(program.functions) == 1:
        return next(iter(program.functions))
    if "main" in program.functions:
        return "main"
    raise RvmError(f"{program.source} has several functions; choose one with --entry "
                   f"({', '.join(program.functions)})")


def _arguments(program: Program, entry: str, texts: list[str]) -> list:
    params = program.functions[entry].params
    if len(texts) != len(params):
        raise RvmError(f"{entry} takes {len(params)} arguments "
                       f"({', '.join(map(str, params))}), got {len(texts)} from --args")
    values = []
    for reg, text in zip(params, texts):
        try:
            values.append(int(text, 0) if reg.cls == isa.INT else float(text))
        except ValueError:
            kind = "an integer" if reg.cls == isa.INT else "a number"
            raise RvmError(f"argument for {reg} must be {kind}, got {text!r}") from None
    return values


def _machine(program: Program, args, **extra) -> Machine:
    return Machine(program, max_steps=args.max_steps, heap_limit=args.heap_limit, **extra)


def _print_values(names: list[str], values, as_json: bool) -> None:
    if as_json:
        print(json.dumps(dict(zip(names, values))))
    else:
        for name, v in zip(names, values):
            print(f"{name} = {v!r}")


def cmd_asm(args) -> None:
    program = load(args.file)
    out = args.output or os.path.splitext(args.file)[0] + ".rvmb"
    save(program, out)
    print(f"wrote {out} ({len(program.functions)} functions, "
          f"{sum(len(f.code) for f in program.functions.values())} instructions)")


def cmd_dis(args) -> None:
    print(disassemble(load(args.file), annotate=not args.plain), end="")


def cmd_run(args) -> None:
    program = load(args.file)
    entry = _entry(program, args.entry)
    values = _arguments(program, entry, args.args)
    m = _machine(program, args)
    m.enter(entry, *values, backward=args.backward)
    if args.trace:
        from .trace import traced_run
        # the root frame of an uncall runs backwards while the machine moves forwards
        traced_run(m, 1, sys.stdout)
        m.check_locals(m.stack[0])
        results = m.results()
    else:
        results = m.finish()
    _print_values([str(p) for p in program.functions[entry].params], results, args.json)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rvm", description="A reversible virtual machine: "
                                "run programs forwards and backwards, and differentiate them.")
    p.add_argument("--version", action="version", version="rvm 0.1.0")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    a = sub.add_parser("asm", help="assemble FILE.rasm into bytecode (.rvmb)")
    a.add_argument("file")
    a.add_argument("-o", "--output", help="output file (default: FILE.rvmb)")
    a.set_defaults(run=cmd_asm)

    d = sub.add_parser("dis", help="disassemble a .rasm or .rvmb file")
    d.add_argument("file")
    d.add_argument("--plain", action="store_true", help="no index/line comments")
    d.set_defaults(run=cmd_dis)

    def runner(name: str, help: str):
        r = sub.add_parser(name, help=help)
        r.add_argument("file", help=".rasm or .rvmb")
        r.add_argument("--entry", help="function to run (default: the only one, or main)")
        r.add_argument("--args", nargs="*", default=[], metavar="V",
                       help="parameter values, in order")
        r.add_argument("--json", action="store_true", help="print one JSON object")
        r.add_argument("--max-steps", type=int, default=100_000_000, metavar="N",
                       help="step budget (default 1e8)")
        r.add_argument("--heap-limit", type=int, default=1 << 24, metavar="CELLS",
                       help="heap size limit in cells (default 2^24)")
        return r

    r = runner("run", "run a function forwards (or backwards) and print its parameters")
    r.add_argument("--backward", action="store_true", help="uncall: run it backwards")
    r.add_argument("--trace", action="store_true",
                   help="print every executed instruction with the registers it changed")
    r.set_defaults(run=cmd_run)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except RvmError as e:
        print(f"rvm: {e}" if not str(e).startswith(("rvm:",)) else str(e), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rvm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
