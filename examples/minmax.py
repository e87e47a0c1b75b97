"""A min-max saddle point, min_x max_y f(x, y), found by gradient steps whose inner
gradient comes from the adjoint program of f, called inside the reversible program, and
whose outer gradient differentiates through those steps (reverse over reverse), after
Pearlmutter & Siskind's saddle-point example.

The inner player takes one ascent step y1 = y0 + eta * df/dy(x, y0), with the gradient
from rvm.adjoint(f) (a function passed as an argument, compiled once per function); the
outer player descends on L(x) = f(x, y1(x)), whose gradient rvm.grad takes through the
inner step.
"""

import rvm
from rvm import ancilla, compute


@rvm.reversible
def bowl(out: float, s: float, t: float, u: float, v: float):
    """s^2 + t^2 - u^2 - v^2: the saddle is at x = (s, t) = 0, y = (u, v) = 0."""
    out += s * s + t * t - u * u - v * v


@rvm.reversible
def coupled(out: float, x: float, y: float):
    """x^2 + 3xy - y^2 + x: max over y at y = 1.5x; min over x of 3.25x^2 + x at
    x = -1/6.5."""
    out += x * x + 3 * x * y - y * y + x


@rvm.reversible
def ascend2(grad_f, u1: float, v1: float, s: float, t: float, u: float, v: float,
            eta: float):
    """(u1, v1) += (u, v) + eta * grad_(u, v) f(s, t, u, v)."""
    with ancilla(out=0.0, gout=1.0, gs=0.0, gt=0.0, gu=0.0, gv=0.0):
        grad_f(out, s, t, u, v, gout, gs, gt, gu, gv)
        u1 += u + eta * gu
        v1 += v + eta * gv
        ~grad_f(out, s, t, u, v, gout, gs, gt, gu, gv)


@rvm.reversible
def ascend1(grad_f, y1: float, x: float, y0: float, eta: float):
    """y1 += y0 + eta * df/dy(x, y0)."""
    with ancilla(out=0.0, gout=1.0, gx=0.0, gy=0.0):
        grad_f(out, x, y0, gout, gx, gy)
        y1 += y0 + eta * gy
        ~grad_f(out, x, y0, gout, gx, gy)


@rvm.reversible
def outer2(f, grad_f, L: float, s: float, t: float, u: float, v: float, eta: float):
    """L += f(x, y1(x)) for the two-by-two game."""
    with ancilla(u1=0.0, v1=0.0):
        with compute() as best:
            ascend2(grad_f, u1, v1, s, t, u, v, eta)
        f(L, s, t, u1, v1)
        ~best


@rvm.reversible
def outer1(f, grad_f, L: float, x: float, y0: float, eta: float):
    """L += f(x, y1(x)) for the scalar game."""
    with ancilla(y1=0.0):
        with compute() as best:
            ascend1(grad_f, y1, x, y0, eta)
        f(L, x, y1)
        ~best


def saddle_bowl(steps: int = 60, lr: float = 0.2, engine=None):
    """Gradient descent of the outer player; returns (x, y)."""
    s, t, u, v = 1.0, -2.0, 0.7, 0.3
    game = (bowl, rvm.adjoint(bowl))
    step = rvm.grad(outer2, loss="L", engine=engine)
    for _ in range(steps):
        g = step(*game, 0.0, s, t, u, v, 0.5)
        s, t = s - lr * g[3], t - lr * g[4]
        _, _, u, v, *_ = ascend2(game[1], 0.0, 0.0, s, t, u, v, 0.5, engine=engine)
    return (s, t), (u, v)


def saddle_coupled(steps: int = 60, lr: float = 0.1, engine=None):
    x, y = 2.0, 0.0
    game = (coupled, rvm.adjoint(coupled))
    step = rvm.grad(outer1, loss="L", engine=engine)
    for _ in range(steps):
        x -= lr * step(*game, 0.0, x, y, 0.5)[3]
    y = ascend1(game[1], 0.0, x, y, 0.5, engine=engine)[1]
    return x, y


if __name__ == "__main__":
    print("bowl:    x, y =", saddle_bowl())
    print("coupled: x, y =", saddle_coupled(), " expected", (-1 / 6.5, -1.5 / 6.5))
