"""The Python API: load or assemble programs, call and uncall their functions."""

from __future__ import annotations

import os

import attrs

from .assembler import assemble
from .bytecode import dumps, loads
from .errors import RvmError
from .program import Program


def load(path: str | os.PathLike, engine: str | None = None) -> Program:
    """Load a program from assembly (.rasm), bytecode (.rvmb), or a Python file of
    @rvm.reversible functions (.py, compiled without running it); verified on load.
    `engine` ('interp', 'python'; None = fastest) is the default for its calls."""
    program = _load(os.fspath(path))
    if engine is not None:
        from .machine import resolve_engine
        program = attrs.evolve(program, engine=resolve_engine(engine))
    return program


def _load(path: str) -> Program:
    try:
        if path.endswith(".py"):
            from .lang import compile_file
            return compile_file(path)
        if path.endswith(".rvmb"):
            with open(path, "rb") as f:
                return loads(f.read(), path)
        with open(path, encoding="utf-8") as f:
            return assemble(f.read(), path)
    except OSError as e:
        raise RvmError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RvmError(f"{path}: not a UTF-8 text file (bytecode files end in .rvmb)") from None


def save(program: Program, path: str | os.PathLike) -> None:
    """Write a program as .rvmb bytecode."""
    with open(path, "wb") as f:
        f.write(dumps(program))


@attrs.frozen
class FunctionHandle:
    """One function of a loaded program: `prog["fib"]`. Callable forwards; `~h` is its
    inverse."""

    program: Program
    name: str
    backward: bool = False

    @property
    def function(self):
        return self.program.functions[self.name]

    def __call__(self, *args, **options):
        run = self.program.uncall if self.backward else self.program.call
        return run(self.name, *args, **options)

    def __invert__(self) -> FunctionHandle:
        return attrs.evolve(self, backward=not self.backward)


__all__ = ["FunctionHandle", "assemble", "dumps", "load", "loads", "save"]
