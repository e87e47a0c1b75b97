"""Engines that run a verified Program: the stepping interpreter (rvm.engines.machine, the
reference and the debugger's), generated Python (compiled) and native code (the generated
functions lowered to LLVM IR by llvm, from native's rewrite of them), all rendered from the
instruction table's templates (templates)."""
