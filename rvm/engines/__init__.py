"""Engines that run a verified Program: the stepping interpreter (rvm.engines.machine, the
reference and the debugger's), generated Python (compiled) and native code (the generated
functions lowered to LLVM IR by llvm, as native prepares them), all rendered from the
instruction table's templates (templates)."""
