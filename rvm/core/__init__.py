"""The core: the instruction table, bytecode as data (Program / Function / Instruction), the
verifier, the bytecode inverse and the error types. It imports nothing else of rvm; every
other stage reads it."""
