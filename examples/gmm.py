"""The ADBench Gaussian mixture model: its log-likelihood with a Wishart prior, and the
gradient with respect to every parameter, from a reversible program (after the NiLang
paper's ADBench experiment, Liu & Zhao).

The objective is the one defined with the ADBench data (Srajer, Fitzgibbon and Kukelova,
2018; see also `tools/adbench.py`): for weights alpha (K), means mu (K x D) and inverse
covariance factors icf (K x (D + D(D-1)/2); Q_k = diag(exp(q_k)) + L_k, L_k strictly lower
triangular filled column by column),

    sum_i logsumexp_k(alpha_k + sum_j q_kj - |Q_k (x_i - mu_k)|^2 / 2) - n logsumexp(alpha)
    + sum_k (gamma^2 / 2 (|exp(q_k)|^2 + |l_k|^2) - m sum_j q_kj) + constant.

Every intermediate (the centred point, Q times it, the per-component terms, the running
maxima of the log-sum-exp) lives in an ancilla that is uncomputed before its block ends,
so the program is reversible and rvm.grad differentiates it with no tape.

    python examples/gmm.py [FILE]      # default: the D = 2, K = 5, n = 1000 input
"""

import math
import sys
from pathlib import Path

import numpy as np

import rvm
from rvm import Array, ancilla, compute, zeros

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "adbench"


@rvm.reversible
def logsumexp(out: float, v: Array[float]):
    """out += log(sum_k exp(v_k)), shifted by the maximum (kept in running maxima)."""
    with ancilla(top=zeros(len(v)), s=0.0):
        with compute() as sums:
            top[0] += v[0]
            for k in range(1, len(v)):
                if (v[k] > top[k - 1], v[k] > top[k - 1]):
                    top[k] += v[k]
                else:
                    top[k] += top[k - 1]
            for k in range(len(v)):
                s += exp(v[k] - top[len(v) - 1])
        out += log(s) + top[len(v) - 1]
        ~sums


@rvm.reversible
def point_term(out: float, i: int, alphas: Array[float], means: Array[float, 2],
               expq: Array[float, 2], icf: Array[float, 2], x: Array[float, 2],
               sum_q: Array[float]):
    """out += logsumexp_k(alpha_k + sum_j q_kj - |Q_k (x_i - mu_k)|^2 / 2).

    The products Q_k (x_i - mu_k) are kept for every k (an ancilla matrix) until the
    log-sum-exp has read the terms, then uncomputed together: the matrix-vector products
    run twice per point and component, not four times. Q_k is applied column by column
    (the layout of L in icf), each entry of the centred point worked out once per column
    in a register; row c of the product is complete after column c, so its square goes
    into the component's term there."""
    with ancilla(d=means.shape[1], main=zeros(len(alphas)),
                 qxc=zeros((len(alphas), means.shape[1]))):
        with compute() as terms:
            for k in range(len(alphas)):
                with ancilla(e=d):              # L's entries follow q_k in icf's row k
                    for c in range(d):          # L's column c holds rows c+1 .. d-1
                        with ancilla(t=0.0):    # x_ic - mu_kc
                            t += x[i, c] - means[k, c]
                            qxc[k, c] += expq[k, c] * t
                            for r in range(c + 1, d):
                                qxc[k, r] += icf[k, e] * t
                                e += 1
                            t -= x[i, c] - means[k, c]
                        main[k] -= 0.5 * qxc[k, c] ** 2
                    e -= d * (d - 1) // 2
                main[k] += alphas[k] + sum_q[k]
        logsumexp(out, main)
        ~terms


@rvm.reversible
def gmm_objective(out: float, alphas: Array[float], means: Array[float, 2],
                  icf: Array[float, 2], x: Array[float, 2], gamma: float, m: float,
                  const: float):
    """out += the GMM objective (const: the terms that depend on no parameter)."""
    with ancilla(d=means.shape[1], sum_q=zeros(len(alphas)),
                 expq=zeros((len(alphas), means.shape[1])), lse=0.0):
        with compute() as pre:                  # what every point reads: once, not n times
            for k in range(len(alphas)):
                for j in range(d):
                    sum_q[k] += icf[k, j]
                    expq[k, j] += exp(icf[k, j])
            logsumexp(lse, alphas)
        for i in range(x.shape[0]):
            point_term(out, i, alphas, means, expq, icf, x, sum_q)
        out -= x.shape[0] * lse
        for k in range(len(alphas)):
            for j in range(d):
                out += 0.5 * gamma ** 2 * expq[k, j] ** 2
                out -= m * icf[k, j]
            for j in range(d, icf.shape[1]):
                out += 0.5 * gamma ** 2 * icf[k, j] ** 2
        out += const
        ~pre


def load(path) -> dict:
    """An ADBench GMM input file as arrays (alphas, means, icf, x, gamma, m)."""
    words = Path(path).read_text().split()
    d, k, n = (int(w) for w in words[:3])
    nums = np.array(words[3:], dtype=np.float64)
    icf_len = d + d * (d - 1) // 2
    sizes = [k, k * d, k * icf_len, n * d]
    alphas, means, icf, x = np.split(nums[:sum(sizes)], np.cumsum(sizes)[:-1])
    gamma, m = nums[sum(sizes):sum(sizes) + 2]
    return dict(alphas=alphas, means=means.reshape(k, d), icf=icf.reshape(k, icf_len),
                x=x.reshape(n, d), gamma=float(gamma), m=float(m))


def constant(d: int, k: int, n: int, gamma: float, m: float) -> float:
    """-(n D / 2) log(2 pi) - K (N D log(gamma / sqrt 2) - log Gamma_D(N / 2)), N = D+m+1."""
    big_n = d + m + 1
    multigammaln = d * (d - 1) / 4 * math.log(math.pi) + sum(
        math.lgamma(big_n / 2 + (1 - j) / 2) for j in range(1, d + 1))
    return -(n * d / 2) * math.log(2 * math.pi) - k * (
        big_n * d * math.log(gamma / math.sqrt(2)) - multigammaln)


def arguments(data: dict) -> tuple:
    k, d = data["means"].shape
    c = constant(d, k, len(data["x"]), data["gamma"], data["m"])
    return (0.0, data["alphas"], data["means"], data["icf"], data["x"], data["gamma"],
            data["m"], c)


STEPS = 10 ** 13       # the machine's step budget: the full-size inputs run 10^9 and more


def objective(data: dict, engine=None) -> float:
    return gmm_objective(*arguments(data), engine=engine, max_steps=STEPS)[0]


def gradient(data: dict, engine=None) -> tuple[float, np.ndarray]:
    """(objective, gradient ordered alpha, mu row by row, icf row by row)."""
    value, grads = rvm.value_and_grad(gmm_objective, loss="out", argnums=(1, 2, 3),
                                      engine=engine, max_steps=STEPS)(*arguments(data))
    return value[0], np.concatenate([g.ravel() for g in grads])


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else DATA / "gmm" / "1k" / "gmm_d2_K5.txt"
    data = load(path)
    value, g = gradient(data)
    print(f"{Path(path).name}: objective {value:.10g}, gradient of {g.size} numbers, "
          f"|gradient| = {np.linalg.norm(g):.6g}")
