"""Hessian-vector products three ways, on Pearlmutter & Siskind's example
f(x, y) = 2x^2 + 3xy + 4y^2: H f at (3, 4) times (7, 8) is (52, 85).

1. rvm.hvp: forward over reverse (the tangent of the adjoint program);
2. rvm.jvp of rvm.adjoint(f) written out;
3. reverse over reverse: a reversible function calls the adjoint program inside and takes
   the dot product of the gradient with v; rvm.grad of that is H v;
4. the same as a program: rvm.adjoint of that function.
"""

import rvm


@rvm.reversible
def f(out: float, x: float, y: float):
    out += 2 * x * x + 3 * x * y + 4 * y * y


adjoint_f = rvm.adjoint(f)      # (out, x, y, out_bar, x_bar, y_bar) -> (..., J^T bar)


@rvm.reversible
def v_dot_grad(s: float, out: float, x: float, y: float, gout: float, gx: float,
               gy: float, v1: float, v2: float):
    """s += v . grad f(x, y), with the gradient from the adjoint program (uncomputed)."""
    adjoint_f(out, x, y, gout, gx, gy)
    s += v1 * gx + v2 * gy
    ~adjoint_f(out, x, y, gout, gx, gy)


def hvp_by_reverse_over_reverse(x: float, y: float, v1: float, v2: float) -> tuple:
    g = rvm.grad(v_dot_grad, loss="s")(0.0, 0.0, x, y, 1.0, 0.0, 0.0, v1, v2)
    return g[2], g[3]


def hvp_by_adjoint_of_adjoint(x: float, y: float, v1: float, v2: float) -> tuple:
    """The adjoint program of v_dot_grad, seeded with 1 on s: x's and y's shadows."""
    out = rvm.adjoint(v_dot_grad)(0.0, 0.0, x, y, 1.0, 0.0, 0.0, v1, v2, 1.0, *[0.0] * 8)
    return out[11], out[12]


if __name__ == "__main__":
    print("hvp:              ", rvm.hvp(f, (0.0, 3.0, 4.0), (0.0, 7.0, 8.0), loss="out")[1:])
    _, dots = rvm.jvp(adjoint_f, (0.0, 3.0, 4.0, 1.0, 0.0, 0.0), (0.0, 7.0, 8.0, 0, 0, 0))
    print("jvp of adjoint:   ", dots[4:])
    print("reverse/reverse:  ", hvp_by_reverse_over_reverse(3.0, 4.0, 7.0, 8.0))
    print("adjoint of it:    ", hvp_by_adjoint_of_adjoint(3.0, 4.0, 7.0, 8.0))
    print("Hessian:          ", rvm.hessian(f, loss="out", wrt=["x", "y"])(0.0, 3.0, 4.0).tolist())
