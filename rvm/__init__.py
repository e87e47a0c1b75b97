"""rvm: a reversible virtual machine. Programs run forwards and backwards, and their
gradients come from running backwards with every float instruction switched to its adjoint."""

from .assembler import assemble, disassemble
from .errors import (AsmError, FormatError, InvertibilityError, MachineError, RvmError,
                     VerifyError)
from .machine import Machine
from .program import Program

__all__ = ["assemble", "disassemble", "Machine", "Program", "RvmError", "AsmError",
           "VerifyError", "FormatError", "MachineError", "InvertibilityError"]
__version__ = "0.1.0"
