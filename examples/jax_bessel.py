"""A JAX model with a Bessel-function layer: y = a J_1(b x), fitted by gradient descent
under jax.jit and jax.grad, with the layer rvm's reversible J_nu (examples/besselj.py's
besselj_inplace, after NiLang's ibesselj with exact in-place multiplication).

    python examples/jax_bessel.py

`rvm.to_jax(besselj_inplace)` is a JAX function: jax.vmap over the data points is one rvm.vmap
batch, jax.grad runs rvm's adjoint program (a batch too), and jax.jit compiles the whole
step around a host callback. The data come from a = 1.5, b = 2.0 with a little noise;
Adam (written out in a few lines) recovers them, and the fitted curve is checked against
scipy's Bessel function when scipy is installed.
"""

import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import rvm

jax.config.update("jax_enable_x64", True)
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from besselj import besselj_inplace  # noqa: E402

NU = 1
J = rvm.to_jax(besselj_inplace)


def model(params, x):
    a, b = params
    return a * jax.vmap(lambda z: J(0.0, NU, z)[0])(b * x)


def loss(params, x, y):
    return jnp.mean((model(params, x) - y) ** 2)


@jax.jit
def adam_step(params, m, v, k, x, y, lr=0.02, beta1=0.9, beta2=0.999):
    value, g = jax.value_and_grad(loss)(params, x, y)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    mhat, vhat = m / (1 - beta1 ** k), v / (1 - beta2 ** k)
    return params - lr * mhat / (jnp.sqrt(vhat) + 1e-12), m, v, value


def main(steps: int = 400, points: int = 64, engine: str | None = None):
    global J
    if engine is not None:              # (before adam_step is first traced)
        J = rvm.to_jax(besselj_inplace, engine=engine)
    rng = np.random.default_rng(0)
    x = np.linspace(0.25, 5.0, points)
    truth = jnp.array([1.5, 2.0])
    y = model(truth, x) + 1e-3 * rng.standard_normal(points)
    params, m, v = jnp.array([1.0, 1.7]), jnp.zeros(2), jnp.zeros(2)
    start = time.perf_counter()
    for k in range(1, steps + 1):
        params, m, v, value = adam_step(params, m, v, k, x, y)
        if k % 100 == 0 or k == 1:
            print(f"step {k:4d}  loss {float(value):.3e}  a = {float(params[0]):.6f}  "
                  f"b = {float(params[1]):.6f}")
    print(f"{steps} jitted steps of {points} Bessel functions and their gradients: "
          f"{time.perf_counter() - start:.2f} s")
    try:
        from scipy.special import jv
        worst = float(np.max(np.abs(model(params, x) - params[0] * jv(NU, params[1] * x))))
        print(f"fitted curve against scipy.special.jv: largest difference {worst:.1e}")
    except ImportError:
        pass
    return params


if __name__ == "__main__":
    main()
