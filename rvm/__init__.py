"""rvm: a reversible virtual machine. Programs run forwards and backwards, and their
gradients come from running backwards with every float instruction switched to its adjoint."""

from .api import FunctionHandle, load, save
from .assembler import assemble, disassemble
from .bytecode import dumps, loads
from .errors import AsmError, FormatError, InvertibilityError, MachineError, RvmError, VerifyError
from .machine import Machine
from .program import Program

__all__ = [
                     "AsmError",
                     "FormatError",
                     "FunctionHandle",
                     "InvertibilityError",
                     "Machine",
                     "MachineError",
                     "Program",
                     "RvmError",
                     "VerifyError",
                     "assemble",
                     "disassemble",
                     "dumps",
                     "load",
                     "loads",
                     "save",
]
__version__ = "0.1.0"

from .gradient import grad, jacobian, value_and_grad

__all__ += ["grad", "jacobian", "value_and_grad"]
