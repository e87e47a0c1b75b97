"""ADBench bundle adjustment: reprojection and weight residuals, and their sparse Jacobian,
from one small reversible function per observation (after the NiLang paper's ADBench
experiment, Liu & Zhao).

`residual` takes one observation's camera (rotation r, centre C, focal length f,
principal point x0, radial distortion k), its point X, weight w and feature, all scalars,
and accumulates the two reprojection residuals w (projection - feature) into e0, e1.
rvm.jacobian gives the two Jacobian rows of each observation (one forward run, then one
gradient pass per residual), and rvm.vmap runs it over all observations as one native
loop; the weight rows are -2 w. The rows
are assembled into ADBench's CSR layout: two rows per observation, then one per weight;
columns cameras (11 each), points (3 each), weights.

    python examples/ba.py [FILE]      # default: ba1 (49 cameras, 7776 points, 31843 obs.)
"""

import functools
import sys
from pathlib import Path

import numpy as np

import rvm
from rvm import ancilla, compute

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "adbench"
CAMERA = 11


@rvm.reversible
def residual(e0: float, e1: float, r0: float, r1: float, r2: float, c0: float, c1: float,
             c2: float, f: float, u0: float, v0: float, k0: float, k1: float, x0: float,
             x1: float, x2: float, w: float, m0: float, m1: float):
    """e += w (projection of X by the camera - the feature (m0, m1))."""
    with ancilla(d0=0.0, d1=0.0, d2=0.0, y0=0.0, y1=0.0, y2=0.0, t2=0.0, theta=0.0,
                 ct=0.0, st=0.0, wd=0.0, p0=0.0, p1=0.0, s=0.0, g=0.0):
        with compute() as project:
            d0 += x0 - c0
            d1 += x1 - c1
            d2 += x2 - c2
            t2 += r0 * r0 + r1 * r1 + r2 * r2
            if t2 != 0.0:           # Rodrigues: d cos t + (w x d) sin t + w (w.d)(1 - cos t)
                theta += sqrt(t2)   # (not at 0, where its derivative is infinite)
                ct += cos(theta)
                st += sin(theta) / theta
                wd += (r0 * d0 + r1 * d1 + r2 * d2) * (1.0 - ct) / (theta * theta)
                y0 += d0 * ct + (r1 * d2 - r2 * d1) * st + r0 * wd
                y1 += d1 * ct + (r2 * d0 - r0 * d2) * st + r1 * wd
                y2 += d2 * ct + (r0 * d1 - r1 * d0) * st + r2 * wd
            else:                   # theta = 0: d + r x d
                y0 += d0 + r1 * d2 - r2 * d1
                y1 += d1 + r2 * d0 - r0 * d2
                y2 += d2 + r0 * d1 - r1 * d0
            p0 += y0 / y2
            p1 += y1 / y2
            s += p0 * p0 + p1 * p1
            g += f * (1.0 + k0 * s + k1 * s * s)
        e0 += w * (p0 * g + u0 - m0)
        e1 += w * (p1 * g + v0 - m1)
        ~project


def load(path) -> dict:
    """An ADBench BA file, replicated as ADBench does: n cameras, m points, p
    observations (observation i: camera i mod n, point i mod m)."""
    words = Path(path).read_text().split()
    n, m, p = (int(v) for v in words[:3])
    nums = np.array(words[3:3 + CAMERA + 3 + 1 + 2], dtype=np.float64)
    cam, x, w, feat = nums[:11], nums[11:14], nums[14], nums[15:17]
    obs = np.arange(p)
    return dict(cams=np.tile(cam, (n, 1)), x=np.tile(x, (m, 1)), w=np.full(p, w),
                feats=np.tile(feat, (p, 1)), obs=np.stack([obs % n, obs % m], axis=1))


def _rows(data: dict) -> list[np.ndarray]:
    """residual's 19 arguments, one row per observation."""
    cams = np.ascontiguousarray(data["cams"][data["obs"][:, 0]].T)    # one row per parameter
    xs = np.ascontiguousarray(data["x"][data["obs"][:, 1]].T)
    feats = np.ascontiguousarray(data["feats"].T)
    p = len(data["w"])
    return [np.zeros(p), np.zeros(p), *cams, *xs, np.ascontiguousarray(data["w"]), *feats]


def residuals(data: dict, engine=None) -> tuple[np.ndarray, np.ndarray]:
    """(reproj_err, 2 per observation, in order; w_err, 1 - w^2 per observation)."""
    out = rvm.vmap(functools.partial(residual, engine=engine))(*_rows(data))
    return np.stack([out[0], out[1]], axis=1).ravel(), 1.0 - data["w"] ** 2


def jacobian(data: dict, engine=None) -> dict:
    """The Jacobian of all residuals in ADBench's CSR layout (nrows, ncols, rows = the
    row pointer, cols, vals), with the residuals (reproj_err, w_err)."""
    jac = rvm.vmap(rvm.jacobian(residual, outputs=["e0", "e1"], wrt=list(range(2, 17)),
                                has_aux=True, engine=engine))
    J, values = jac(*_rows(data))       # J: observations x 2 residuals x 15 parameters
    return assemble(data, J, np.stack([values[0], values[1]], axis=1).ravel())


def assemble(data: dict, blocks: np.ndarray, reproj: np.ndarray) -> dict:
    """ADBench's output from the per-observation Jacobian blocks (observations x 2 x 15:
    11 camera, 3 point and 1 weight columns) and the reprojection residuals in order."""
    n, m, p = len(data["cams"]), len(data["x"]), len(data["w"])
    cam, pt = data["obs"][:, 0], data["obs"][:, 1]
    weights = n * CAMERA + 3 * m + np.arange(p)          # the weight columns
    cols = np.empty((p, 2, CAMERA + 4), np.int64)       # both rows of an observation
    cols[:, :, :CAMERA] = (cam * CAMERA)[:, None, None] + np.arange(CAMERA)
    cols[:, :, CAMERA:CAMERA + 3] = (n * CAMERA + 3 * pt)[:, None, None] + np.arange(3)
    cols[:, :, CAMERA + 3] = weights[:, None]
    cols = np.concatenate([cols.reshape(-1), weights])
    vals = np.concatenate([blocks.reshape(-1), -2.0 * data["w"]])
    indptr = np.concatenate([np.arange(0, 30 * p + 1, 15), 30 * p + 1 + np.arange(p)])
    return {"reproj_err": reproj, "w_err": 1.0 - data["w"] ** 2,
            "J": {"nrows": 3 * p, "ncols": CAMERA * n + 3 * m + p, "rows": indptr,
                  "cols": cols, "vals": vals}}


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else next((DATA / "ba").glob("ba1_*.txt"))
    data = load(path)
    out = jacobian(data)
    print(f"{Path(path).name}: {len(data['w'])} observations, Jacobian "
          f"{out['J']['nrows']} x {out['J']['ncols']} with {len(out['J']['vals'])} "
          f"non-zeros; |reproj_err| = {np.linalg.norm(out['reproj_err']):.6g}")
