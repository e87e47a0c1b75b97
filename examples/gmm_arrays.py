"""The ADBench Gaussian mixture model (see examples/gmm.py) written with array statements.

The same algorithm as gmm.py: the quadratic form is expanded, so that every exponent is
the dot product of a component's weights with a point's monomials x_r x_c (r <= c), x_r
and 1, and all of them are one matrix product `E += W @ P` (on BLAS in native code).
Each point's log-sum-exp over the components is shifted by its maximum, kept as running
maxima, one array statement per component (np.maximum, elementwise). Every intermediate
is an ancilla array computed in one compute block and uncomputed at the end, so rvm.grad
starts the gradient pass from the copy.

Q_k's columns are kept stacked: T[c K + k, :] is column c of Q_k (for every k at once),
so icf's column-by-column factor fills a K x (D - 1 - c) block of T per column, and
A_k = Q_k^T Q_k and Q_k mu_k are sums along rows.

    python examples/gmm_arrays.py [FILE]      # default: the D = 2, K = 5, n = 1000 input
"""

import sys
from pathlib import Path

import numpy as np

import rvm
from rvm import Array, ancilla, compute, zeros

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gmm  # (the loading and argument helpers)


@rvm.reversible
def weights(W: Array[float, 2], alphas: Array[float, 2], means: Array[float, 2],
            icf: Array[float, 2], lin: int):
    """W[k] = component k's weights on the monomials (see gmm.weights), W zero on entry
    (the x_r^2 columns are halved in place): with A_k = Q_k^T Q_k and u_k = Q_k mu_k,
    -A_k[r, c] on x_r x_c (halved on r = c), A_k mu_k on x_r and alpha_k + sum_j q_kj -
    |u_k|^2 / 2 on 1 (alphas: one column)."""
    with ancilla(K=len(alphas), d=means.shape[1]):  # noqa: SIM117 (T's shape needs them)
        with ancilla(T=zeros((K * d, d)), u=zeros((K, d)), e=0):
            with compute() as fill:
                for c in range(d):      # T[cK + k] = column c of Q_k; L_k's column c
                    T[c * K:(c + 1) * K, c] += np.exp(icf[:, c])    # is in icf from d + e
                    T[c * K:(c + 1) * K, c + 1:d] += icf[:, d + e:d + e + d - 1 - c]
                    e += d - 1 - c
                e -= d * (d - 1) // 2
                for c in range(d):
                    u.T += T[c * K:(c + 1) * K, :].T * means[:, c]
            for r in range(d):
                for c in range(r, d):
                    W[:, e] -= np.sum(T[r * K:(r + 1) * K, :] * T[c * K:(c + 1) * K, :], axis=1)
                    e += 1
                W[:, e - d + r] *= 0.5
                W[:, lin + r] += np.sum(T[r * K:(r + 1) * K, :] * u, axis=1)
            e -= lin
            W[:, lin + d] += alphas[:, 0]
            W[:, lin + d] += np.sum(icf[:, 0:d], axis=1)
            W[:, lin + d] -= np.sum(u * u, axis=1) / 2
            ~fill


@rvm.reversible
def monomials(P: Array[float, 2], X: Array[float, 2], lin: int):
    """P[:, i] += point i's monomials x_r x_c (r <= c, row by row), x_r and 1: one row of
    P per monomial, the points along it (X: the points transposed, one coordinate a row)."""
    with ancilla(d=X.shape[0], e=0):
        for r in range(d):
            P[e:e + d - r, :] += X[r:d, :] * X[r, :]
            e += d - r
        e -= lin
        P[lin:lin + d, :] += X
        P[lin + d, :] += 1.0


@rvm.reversible
def maxima(top: Array[float, 2], E: Array[float, 2]):
    """top[k] += the running maxima of E's rows 0 .. k, point by point."""
    top[0, :] += E[0, :]
    for k in range(1, E.shape[0]):
        top[k, :] += np.maximum(top[k - 1, :], E[k, :])


@rvm.reversible
def gmm_prior(out: float, icf: Array[float, 2], d: int, gamma: float, m: float):
    """out += the Wishart prior: sum_k (gamma^2 / 2 (|exp(q_k)|^2 + |l_k|^2) - m sum_j q_kj)
    (|l_k|^2 as |icf_k|^2 - |q_k|^2)."""
    with ancilla(c=0.0):
        c += gamma ** 2 / 2
        out += c * np.sum(np.exp(2.0 * icf[:, 0:d]))
        out += c * np.sum(icf * icf)
        out -= c * np.sum(icf[:, 0:d] * icf[:, 0:d])
        out -= m * np.sum(icf[:, 0:d])
        c -= gamma ** 2 / 2


@rvm.reversible
def points(total: float, s: Array[float], E: Array[float, 2], top: Array[float, 2],
           last: int):
    """total += each point's log-sum-exp of its exponents E[:, i], shifted by their maximum
    top[last, i] (s: the shifted sums; E shifted in place and back)."""
    E -= top[last, :]
    s += np.sum(np.exp(E), axis=0)
    E += top[last, :]
    total += np.sum(np.log(s))
    total += np.sum(top[last, :])


@rvm.reversible
def copy_in(a: Array[float, 2], mu: Array[float, 2], q: Array[float, 2],
            X: Array[float, 2], alphas: Array[float], means: Array[float, 2],
            icf: Array[float, 2], x: Array[float, 2]):
    """The parameters into a (one column), mu and q, the points transposed into X."""
    a[:, 0] += alphas
    mu += means
    q += icf
    X += x.T


@rvm.reversible
def gmm_objective(out: float, alphas: Array[float], means: Array[float, 2],
                  icf: Array[float, 2], x: Array[float, 2], gamma: float, m: float,
                  const: float, lin: int, width: int, whole: int):
    """out += the GMM objective (the arguments as gmm.gmm_objective's: with whole = 0 only
    the points' part). The whole of it is computed into `total` in one compute block and
    copied into out, so that the gradient pass starts from the copy. The array statements
    read copies of the arguments made by copy_in: alphas as one column, the points
    transposed (four array statements). The gradient asks for the parameters' gradients
    only (argnums), so the pullbacks into the points, their copy and their monomials are
    left out (docs/gradients.md)."""
    with ancilla(K=len(alphas), d=means.shape[1], n=x.shape[0]):  # noqa: SIM117
        with ancilla(a=zeros((K, 1)), mu=zeros((K, d)), q=zeros((K, icf.shape[1])),
                     X=zeros((d, n)), W=zeros((K, width)), P=zeros((width, n)),
                     E=zeros((K, n)), top=zeros((K, n)), s=zeros(n), top_a=zeros((K, 1)),
                     s_a=zeros(1), lse=0.0, total=0.0):
            with compute() as pre:
                copy_in(a, mu, q, X, alphas, means, icf, x)
                weights(W, a, mu, q, lin)
                monomials(P, X, lin)
                E += W @ P                  # every exponent at every point
                maxima(top, E)
                points(total, s, E, top, K - 1)
                maxima(top_a, a)            # logsumexp(alpha): alpha as one point
                points(lse, s_a, a, top_a, K - 1)
                total -= n * lse
                if (whole != 0, whole != 0):
                    gmm_prior(total, q, d, gamma, m)
                    total += const
            out += total
            ~pre


GRADIENTS: dict = {}


def objective(data: dict, engine=None, threads: int = 1) -> float:
    """The objective; the points split across `threads` as gmm.objective does (one by
    default: the products run on BLAS, which uses every core itself; two threads of
    BLAS's own threads each were slower than one, 25.6 against 19.4 ms for
    10k/gmm_d10_K50's gradient on 2 cores)."""
    return sum(gmm.over_points(lambda args: gmm_objective(*args, engine=engine,
                                                          max_steps=gmm.STEPS)[0],
                               data, gmm.cores(data, threads)))


def gradient(data: dict, engine=None, threads: int = 1) -> tuple[float, np.ndarray]:
    """(objective, gradient ordered alpha, mu row by row, icf row by row), as gmm.gradient
    (threads: see objective)."""
    if engine not in GRADIENTS:
        GRADIENTS[engine] = rvm.value_and_grad(gmm_objective, loss="out", argnums=(1, 2, 3),
                                               engine=engine, max_steps=gmm.STEPS)
    run = GRADIENTS[engine]
    parts = gmm.over_points(lambda args: run(*args), data, gmm.cores(data, threads))
    grads = [sum(g[j] for _, g in parts) for j in range(3)]
    return sum(v[0] for v, _ in parts), np.concatenate([g.ravel() for g in grads])


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else gmm.DATA / "gmm" / "1k" / "gmm_d2_K5.txt"
    data = gmm.load(path)
    value, g = gradient(data)
    print(f"{Path(path).name}: objective {value:.10g}, gradient of {g.size} numbers, "
          f"|gradient| = {np.linalg.norm(g):.6g}")
