"""Engines that run a verified Program: the stepping interpreter (rvm.engines.machine, the
reference and the debugger's), generated Python (compiled) and numba-native code (native),
all rendered from the instruction table's templates (templates)."""
