"""rvm: a reversible virtual machine. Programs run forwards and backwards, and their
gradients come from running backwards with every float instruction switched to its adjoint."""

from .ad.derivatives import adjoint, hessian, hvp, jvp, tangent
from .ad.gradient import grad, jacobian, value_and_grad
from .api import FunctionHandle, draw, load, save, vmap
from .core import isa
from .core.errors import (
    AsmError,
    CompileError,
    FormatError,
    InvertibilityError,
    MachineError,
    RvmError,
    UsageError,
    VerifyError,
)
from .core.program import Program
from .engines.machine import Machine
from .formats.assembly import assemble, disassemble
from .formats.bytecode import dumps, loads
from .interop import to_jax, to_torch  # (JAX and PyTorch are imported when first used)
from .lang import (
    Array,
    ancilla,
    compute,
    delocal,
    from_,
    inverse,
    irot,
    loop,
    neg,
    nograd,
    reversible,
    rot,
    zeros,
)

__all__ = [
    "Array", "AsmError", "CompileError", "FormatError", "FunctionHandle",
    "InvertibilityError", "Machine", "MachineError", "Program", "RvmError", "UsageError",
    "VerifyError",
    "adjoint", "ancilla", "assemble", "compute", "delocal", "disassemble", "draw", "dumps",
    "from_", "grad", "hessian", "hvp", "inverse", "irot", "isa", "jacobian", "jvp", "load",
    "loads", "loop", "neg", "nograd", "reversible",
    "rot", "save", "tangent", "value_and_grad",
    "vmap", "zeros",
]
__version__ = "0.1.0"


def debug(fn, *args, commands=None):
    """Debug `fn` (a reversible function, or prog["name"]) on the arguments. Interactive,
    or, with `commands` (a list of debugger commands), scripted: returns the transcript."""
    import io

    from .debugger import debugger_for, repl
    dbg = debugger_for(fn, args)
    if commands is None:
        repl(dbg)
        return None
    out = io.StringIO()
    repl(dbg, stdout=out, batch=list(commands))
    return out.getvalue()


__all__ += ["debug", "to_jax", "to_torch"]
