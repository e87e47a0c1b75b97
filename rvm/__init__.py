"""rvm: a reversible virtual machine. Programs run forwards and backwards, and their
gradients come from running backwards with every float instruction switched to its adjoint."""

from .api import FunctionHandle, load, save
from .assembler import assemble, disassemble
from .bytecode import dumps, loads
from .errors import (
                     AsmError,
                     CompileError,
                     FormatError,
                     InvertibilityError,
                     MachineError,
                     RvmError,
                     VerifyError,
)
from .gradient import grad, jacobian, value_and_grad
from .lang import Array, ancilla, compute, inverse, irot, neg, reversible, rot, zeros
from .machine import Machine
from .program import Program

__all__ = [
    "Array", "AsmError", "CompileError", "FormatError", "FunctionHandle",
    "InvertibilityError", "Machine", "MachineError", "Program", "RvmError", "VerifyError",
    "ancilla", "assemble", "compute", "disassemble", "dumps", "grad", "inverse", "irot",
    "jacobian", "load", "loads", "neg", "reversible", "rot", "save", "value_and_grad", "zeros",
]
__version__ = "0.1.0"
