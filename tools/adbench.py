"""The ADBench problems on rvm: GMM objective and gradient, bundle-adjustment residuals and
sparse Jacobian, in ADBench's output layout; with independent numpy/scipy references
written from the data's README (used by the tests and the benchmarks).

    python tools/adbench.py gmm FILE [--json] [--engine E] [--points N]
    python tools/adbench.py ba FILE [--json] [--engine E] [--observations P]

GMM prints {"objective": float, "gradient": [...]} (alpha, then mu row by row, then icf
row by row); BA prints {"reproj_err": [...], "w_err": [...], "J": {"nrows", "ncols",
"rows", "cols", "vals"}} (CSR: two rows per observation, then one per weight; columns
cameras, points, weights; ascending within a row). --points / --observations keep only
the first N points / P observations (a smaller instance of the same problem).
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import ba
import gmm

# ---------------------------------------------------------------------- references


def gmm_objective_numpy(alphas, means, icf, x, gamma, m) -> float:
    """The GMM objective exactly as the data README defines it (numpy and scipy)."""
    from scipy.special import logsumexp, multigammaln
    n, d = x.shape
    k = len(alphas)
    q, l_ = icf[:, :d], icf[:, d:]
    rows, cols = np.tril_indices(d, -1)
    order = np.lexsort((rows, cols))            # column by column, rows ascending
    Q = np.zeros((k, d, d))
    Q[:, np.arange(d), np.arange(d)] = np.exp(q)
    Q[:, rows[order], cols[order]] = l_
    qx = np.einsum("krc,nkc->nkr", Q, x[:, None, :] - means[None, :, :])
    main = alphas[None, :] + q.sum(1)[None, :] - 0.5 * (qx ** 2).sum(-1)
    big_n = d + m + 1
    prior = (0.5 * gamma ** 2 * ((np.exp(q) ** 2).sum(1) + (l_ ** 2).sum(1))
             - m * q.sum(1)).sum()
    return float(-(n * d / 2) * math.log(2 * math.pi) + logsumexp(main, axis=1).sum()
                 - n * logsumexp(alphas) + prior
                 - k * (big_n * d * math.log(gamma / math.sqrt(2))
                        - multigammaln(big_n / 2, d)))


def ba_residual_numpy(cam, x, w, feat) -> np.ndarray:
    """One observation's two reprojection residuals, as the data README defines them."""
    r, d = cam[:3], x - cam[3:6]
    theta = np.linalg.norm(r)
    if theta == 0:
        y = d + np.cross(r, d)
    else:
        u = r / theta
        y = d * np.cos(theta) + np.cross(u, d) * np.sin(theta) + u * (u @ d) * (
            1 - np.cos(theta))
    p = y[:2] / y[2]
    s = p @ p
    return w * (cam[6] * p * (1 + cam[9] * s + cam[10] * s * s) + cam[7:9] - feat)


def ba_residuals_numpy(data: dict) -> tuple[np.ndarray, np.ndarray]:
    reproj = np.concatenate([ba_residual_numpy(data["cams"][c], data["x"][q], w, f)
                             for (c, q), w, f in zip(data["obs"], data["w"], data["feats"])])
    return reproj, 1.0 - data["w"] ** 2


# ---------------------------------------------------------------------- the command


def gmm_result(path, engine=None, points=None) -> dict:
    data = gmm.load(path)
    if points:
        data["x"] = data["x"][:points]
    value, grad = gmm.gradient(data, engine=engine)
    return {"objective": value, "gradient": grad.tolist()}


def ba_result(path, engine=None, observations=None) -> dict:
    data = ba.load(path)
    if observations:
        data["w"], data["feats"] = data["w"][:observations], data["feats"][:observations]
        data["obs"] = data["obs"][:observations]
    out = ba.jacobian(data, engine=engine)
    J = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in out["J"].items()}
    return {"reproj_err": out["reproj_err"].tolist(), "w_err": out["w_err"].tolist(), "J": J}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", choices=["gmm", "ba"])
    ap.add_argument("file")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--engine", choices=["interp", "python", "native", "auto"])
    ap.add_argument("--points", type=int, help="GMM: the first N points only")
    ap.add_argument("--observations", type=int, help="BA: the first P observations only")
    args = ap.parse_args(argv)
    import rvm
    try:
        if args.problem == "gmm":
            out = gmm_result(args.file, args.engine, args.points)
            summary = (f"objective {out['objective']:.12g}; gradient of "
                       f"{len(out['gradient'])} numbers")
        else:
            out = ba_result(args.file, args.engine, args.observations)
            summary = (f"{len(out['w_err'])} observations; Jacobian {out['J']['nrows']} x "
                       f"{out['J']['ncols']}, {len(out['J']['vals'])} non-zeros")
    except (OSError, ValueError, rvm.RvmError) as e:
        print(f"adbench: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out) if args.json else summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
