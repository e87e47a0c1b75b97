"""Bridges into JAX and PyTorch: `rvm.to_jax(f)` and `rvm.to_torch(f)` make an rvm function
a differentiable function of each, with rvm's own derivative programs underneath. Loaded
only when used: `import rvm` imports neither JAX nor PyTorch."""


def to_jax(f, **options):
    from ._jax import to_jax as make
    return make(f, **options)


def to_torch(f, **options):
    from ._torch import to_torch as make
    return make(f, **options)


to_jax.__doc__ = """`f` as a JAX function (see rvm.interop._jax.to_jax and docs/interop.md)."""
to_torch.__doc__ = """`f` as a PyTorch function (see rvm.interop._torch.to_torch and
docs/interop.md)."""

__all__ = ["to_jax", "to_torch"]
