"""The errors rvm raises. Every user mistake is an `RvmError`: the CLI prints its message and
exits 1, never a traceback."""

from __future__ import annotations

import functools


class RvmError(Exception):
    """Base of every error caused by the user's program or input."""


def user_facing(fn):
    """Raise rvm's errors from the API call the user made, not from deep inside the
    compiler or the machine: the traceback shows the user's frame and the message."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except RvmError as e:
            raise e.with_traceback(None) from None
    return call


class SourceError(RvmError):
    """An error located in source text: file:line:col, the line, a caret and a hint."""

    def __init__(self, message: str, file: str, line: int, col: int, text: str = "",
                 hint: str = ""):
        self.message, self.file, self.line, self.col = message, file, line, col
        self.text, self.hint = text, hint
        super().__init__(self.render())

    def render(self) -> str:
        out = f"{self.file}:{self.line}:{self.col}: error: {self.message}"
        if self.text:
            out += f"\n    {self.text}\n    {' ' * (self.col - 1)}^"
        if self.hint:
            out += f"\n  hint: {self.hint}"
        return out


class AsmError(SourceError):
    """A syntax or verification error in assembly text (.rasm)."""


class CompileError(SourceError):
    """A construct of the reversible Python subset that is not reversible or not supported."""


class VerifyError(RvmError):
    """A program the verifier refuses: it could not run backwards, or is malformed."""

    def __init__(self, message: str, function: str = "", index: int | None = None,
                 line: int = 0, file: str = "", hint: str = ""):
        self.message, self.function, self.index = message, function, index
        self.line, self.file, self.hint = line, file, hint
        where = f"{file}:{line}: " if file and line else ""
        at = f"in {function}" if function else ""
        if index is not None:
            at += f", instruction {index}"
        text = f"{where}error: {at + ': ' if at else ''}{message}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


class UsageError(RvmError, ValueError):
    """An invalid option or argument value given to rvm (a limit, an engine name...)."""


class FormatError(RvmError):
    """A malformed .rvmb file (always a one-line message)."""


class MachineError(RvmError):
    """A run-time error: step budget, heap limit, arithmetic domain, bad arguments."""

    def __init__(self, message: str, function: str = "", index: int | None = None,
                 line: int = 0, file: str = "", values: dict | None = None):
        self.message, self.function, self.index = message, function, index
        self.line, self.file, self.values = line, file, dict(values or {})
        self.detail = ""           # register-level detail where the message is in source terms
        parts = []
        if function:
            parts.append(f"in {function}")
        if index is not None:
            parts.append(f"instruction {index}")
        if line:
            parts.append(f"{file or 'line'}:{line}" if file else f"line {line}")
        head = ", ".join(parts)
        text = f"{head + ': ' if head else ''}{message}"
        if self.values:
            text += " (" + ", ".join(f"{k} = {v!r}" for k, v in self.values.items()) + ")"
        super().__init__(text)


class InvertibilityError(MachineError):
    """A reversibility check failed: continuing would lose information."""
