"""The bidirectional step debugger: the core (state, moves in both directions, breakpoints,
watches), its commands, the panes that show it, and `--trace` output. Commands and views
stand on the core; the core imports neither."""

from . import commands  # noqa: F401  (fills the core's command table)
from .core import Breakpoint, CommandError, Debugger, Watch, debugger_for
from .views import repl

__all__ = ["Breakpoint", "CommandError", "Debugger", "Watch", "debugger_for", "repl"]
