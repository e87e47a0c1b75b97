"""The bundle-adjustment Jacobian in numba, forward mode by hand: jacfwd's algorithm.

For each observation the residual (examples/ba.py's `residual`: Rodrigues rotation,
projection, radial distortion, times the weight) runs once on the values, then carries
one tangent per input direction through the same operations: 15 directions (the
camera's 11 parameters, the point's 3, the weight), each seeded with 1 in its own input,
as jacfwd pushes the 15 columns of the identity through the function. The result is the
per-observation blocks (observations x 2 residuals x 15 parameters: camera, point,
weight, ADBench's column order within a row) and the reprojection residuals, which
examples/ba.py's `assemble` turns into ADBench's CSR layout, as it does for rvm and JAX.

`blocks_kernel(parallel)` compiles the loop over the observations serial (`@njit`) or
with `prange` (`@njit(parallel=True)`). Plain float64 arrays in and out; no Python objects.
"""

import math

import numpy as np

NDIR = 15           # camera 11 (r 0-2, C 3-5, f 6, x0 7-8, k 9-10), point 11-13, weight 14


def observation(i, cams, xs, obs, w, feats, blocks, reproj):
    """blocks[i, a, j] = d e_a / d (parameter j) of observation i; reproj[2 i + a] = e_a.
    cams (n x 11), xs (m x 3), obs (p x 2: camera, point), w (p), feats (p x 2)."""
    cam = obs[i, 0]
    pt = obs[i, 1]
    r0, r1, r2 = cams[cam, 0], cams[cam, 1], cams[cam, 2]
    f, u0, v0, k0, k1 = cams[cam, 6], cams[cam, 7], cams[cam, 8], cams[cam, 9], \
        cams[cam, 10]
    wi = w[i]
    # values
    d0 = xs[pt, 0] - cams[cam, 3]
    d1 = xs[pt, 1] - cams[cam, 4]
    d2 = xs[pt, 2] - cams[cam, 5]
    theta = math.sqrt(r0 * r0 + r1 * r1 + r2 * r2)
    rot = theta != 0.0
    ct = sn = st = a = rd = wd = 0.0
    if rot:             # y = d cos t + (r x d) sin t / t + r (r.d)(1 - cos t) / t^2
        ct = math.cos(theta)
        sn = math.sin(theta)
        st = sn / theta
        a = (1.0 - ct) / (theta * theta)
        rd = r0 * d0 + r1 * d1 + r2 * d2
        wd = rd * a
        x0c, x1c, x2c = r1 * d2 - r2 * d1, r2 * d0 - r0 * d2, r0 * d1 - r1 * d0
        y0 = d0 * ct + x0c * st + r0 * wd
        y1 = d1 * ct + x1c * st + r1 * wd
        y2 = d2 * ct + x2c * st + r2 * wd
    else:               # theta = 0: y = d + r x d
        x0c, x1c, x2c = r1 * d2 - r2 * d1, r2 * d0 - r0 * d2, r0 * d1 - r1 * d0
        y0 = d0 + x0c
        y1 = d1 + x1c
        y2 = d2 + x2c
    p0 = y0 / y2
    p1 = y1 / y2
    s = p0 * p0 + p1 * p1
    h = 1.0 + k0 * s + k1 * s * s
    g = f * h
    q0 = p0 * g + u0 - feats[i, 0]
    q1 = p1 * g + v0 - feats[i, 1]
    reproj[2 * i] = wi * q0
    reproj[2 * i + 1] = wi * q1
    # tangents: direction j is the j-th column of the 15 x 15 identity
    for j in range(NDIR):
        tr0 = 1.0 if j == 0 else 0.0
        tr1 = 1.0 if j == 1 else 0.0
        tr2 = 1.0 if j == 2 else 0.0
        tf = 1.0 if j == 6 else 0.0
        tu0 = 1.0 if j == 7 else 0.0
        tv0 = 1.0 if j == 8 else 0.0
        tk0 = 1.0 if j == 9 else 0.0
        tk1 = 1.0 if j == 10 else 0.0
        tw = 1.0 if j == 14 else 0.0
        td0 = (1.0 if j == 11 else 0.0) - (1.0 if j == 3 else 0.0)
        td1 = (1.0 if j == 12 else 0.0) - (1.0 if j == 4 else 0.0)
        td2 = (1.0 if j == 13 else 0.0) - (1.0 if j == 5 else 0.0)
        tx0c = tr1 * d2 + r1 * td2 - tr2 * d1 - r2 * td1
        tx1c = tr2 * d0 + r2 * td0 - tr0 * d2 - r0 * td2
        tx2c = tr0 * d1 + r0 * td1 - tr1 * d0 - r1 * td0
        if rot:
            tth = (r0 * tr0 + r1 * tr1 + r2 * tr2) / theta
            tct = -sn * tth
            tst = (ct - st) / theta * tth
            ta = (st - 2.0 * a) / theta * tth
            trd = tr0 * d0 + r0 * td0 + tr1 * d1 + r1 * td1 + tr2 * d2 + r2 * td2
            twd = trd * a + rd * ta
            ty0 = td0 * ct + d0 * tct + tx0c * st + x0c * tst + tr0 * wd + r0 * twd
            ty1 = td1 * ct + d1 * tct + tx1c * st + x1c * tst + tr1 * wd + r1 * twd
            ty2 = td2 * ct + d2 * tct + tx2c * st + x2c * tst + tr2 * wd + r2 * twd
        else:
            ty0 = td0 + tx0c
            ty1 = td1 + tx1c
            ty2 = td2 + tx2c
        tp0 = (ty0 - p0 * ty2) / y2
        tp1 = (ty1 - p1 * ty2) / y2
        ts = 2.0 * (p0 * tp0 + p1 * tp1)
        th = tk0 * s + k0 * ts + tk1 * s * s + 2.0 * k1 * s * ts
        tg = tf * h + f * th
        blocks[i, 0, j] = tw * q0 + wi * (tp0 * g + p0 * tg + tu0)
        blocks[i, 1, j] = tw * q1 + wi * (tp1 * g + p1 * tg + tv0)


_KERNELS = {}
_one = None         # `observation` compiled (a global, not a closure: numba's cache keys a
#                     closure's cells, a dispatcher differently in each process)


def blocks_kernel(parallel: bool):
    """The loop over the observations compiled by numba: serial (`@njit`), or with
    `prange` (`@njit(parallel=True)`); each iteration is `observation`, inlined."""
    if parallel not in _KERNELS:
        import numba
        global _one
        opts = {"error_model": "numpy"}     # IEEE division, as JAX: no zero-division checks
        if _one is None:
            _one = numba.njit(inline="always", **opts)(observation)

        def serial(cams, xs, obs, w, feats, blocks, reproj):
            for i in range(obs.shape[0]):
                _one(i, cams, xs, obs, w, feats, blocks, reproj)

        def threads(cams, xs, obs, w, feats, blocks, reproj):
            for i in numba.prange(obs.shape[0]):
                _one(i, cams, xs, obs, w, feats, blocks, reproj)
        _KERNELS[parallel] = numba.njit(parallel=True, **opts)(threads) if parallel else \
            numba.njit(cache=True, **opts)(serial)      # (see peers.py: prange)
    return _KERNELS[parallel]


def jacobian(data: dict, parallel: bool = False) -> dict:
    """The Jacobian of examples/ba.py's residuals in ADBench's CSR layout (as
    ba.jacobian), its blocks from the numba kernel."""
    import ba
    kernel = blocks_kernel(parallel)
    p = len(data["w"])
    blocks = np.empty((p, 2, NDIR))
    reproj = np.empty(2 * p)
    kernel(data["cams"], data["x"], data["obs"], data["w"], data["feats"], blocks, reproj)
    return ba.assemble(data, blocks, reproj)
