"""Automatic differentiation: gradient mode (run forwards, seed the loss, run backwards with
every float instruction switched to its adjoint) and the gradient API built on it."""
