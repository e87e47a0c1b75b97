"""The comparisons of tools/bench/run.py: for each problem, rvm and every peer at its
best, each as a callable to time and a result to check against rvm's.

A case is a function case(size, cores) -> list of Peer, rvm's first. size is "quick"
(tiny inputs, for the test) or "full"; cores is 1 (this process pinned to one core, every
tool told to use one thread) or 0 (every tool as it runs by default on this machine).
A peer whose library is missing is a Peer with `skip` set.
"""

import math
import pathlib
import sys
from dataclasses import dataclass, field

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
for _p in (ROOT / "tools" / "bench", ROOT / "tools", ROOT / "examples", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import rvm


@dataclass
class Peer:
    name: str                       # "rvm", "JAX grad, fixed 20 terms", ...
    run: object = None              # the call to time
    result: object = None           # what it computes, to compare with rvm's
    mode: str = ""                  # reverse / forward / by hand
    skip: str = ""                  # why this peer did not run
    tol: tuple = (1e-9, 1e-12)      # rtol, atol against rvm's result (see measure.compare)
    parts: tuple = ()               # where to split the results into separately scaled parts
    extra: dict = field(default_factory=dict)


def _flat(*parts) -> np.ndarray:
    return np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in parts])


LIBRARIES = {"numba", "jax", "jaxlib", "torch"}     # a peer's library that may be missing


def missing_library(e: ImportError) -> str | None:
    """The peer library whose absence raised `e`, or None: an ImportError from inside
    an installed library or the peer's own code is a failure, not a skip."""
    import importlib.util
    top = (getattr(e, "name", None) or "").split(".")[0]
    if not isinstance(e, ModuleNotFoundError) or top not in LIBRARIES:
        return None
    try:
        return top if importlib.util.find_spec(top) is None else None
    except (ImportError, ValueError):
        return None


def _try(name, mode, make, tol=(1e-9, 1e-12), fails=()):
    """Peer(name) from make() -> (run, result); a missing library (numba, JAX, PyTorch)
    is a skip, and so is an exception of `fails` (a peer that does not run on this
    problem: torch.compile on a data-dependent loop), with its reason. Any other
    exception, an ImportError inside the peer's code included, fails the comparison."""
    try:
        run, result = make()
    except ImportError as e:
        if missing_library(e) is None:
            raise
        return Peer(name, mode=mode, skip=f"not installed ({missing_library(e)})")
    except fails as e:
        text = " ".join(str(e).split())
        why = ("could not guard on a data-dependent expression (a loop on data)"
               if "data-dependent" in text else text[:80])
        return Peer(name, mode=mode, skip=f"does not run: {type(e).__name__}: {why}")
    return Peer(name, run, result, mode, tol=tol)


def _compile_fails():
    """What torch.compile raises when it cannot compile a function whole (fullgraph)."""
    try:
        import torch._dynamo.exc as exc
    except ImportError:
        return ()
    return (exc.Unsupported, exc.UserError, exc.TorchRuntimeError)


def _jax():
    import jax
    jax.config.update("jax_enable_x64", True)
    return jax


def _torch(cores):
    import torch
    if cores == 1:
        torch.set_num_threads(1)
    return torch


def _numba():
    import numba
    global prange
    prange = numba.prange
    return numba


def _parallel(peer: Peer) -> Peer:
    """A numba prange peer, with the threading layer it ran on (measure.pin chooses it)."""
    if not peer.skip:
        peer.extra["threading_layer"] = _numba().threading_layer()
    return peer


prange = range      # numba.prange once numba is loaded (a serial compile reads it as range)
# The serial numba peers are compiled with cache=True: run.py gives each run a fresh
# NUMBA_CACHE_DIR, so the default-cores process loads what the one-core one compiled
# (a prange compile is never cached: numba's cache does not tell it from the serial one).


def one_thread_vmap(cores):
    """rvm.vmap splits a batch across os.cpu_count() threads; pinned to one core it must
    run on one thread."""
    from rvm.engines import native
    if cores == 1:
        native.THREAD_ROWS = 10 ** 12


# ====================================================================== GMM gradient
GMM_FILES = {"quick": ["gmm_d2_K5.txt"],
             "full": ["1k/gmm_d2_K5.txt", "1k/gmm_d10_K25.txt", "1k/gmm_d20_K50.txt",
                      "10k/gmm_d10_K50.txt"]}


def gmm_parts(d: int):
    """Index maps: icf row -> Q (k, d, d) by gathering, and rvm's monomials (upper
    triangle r <= c of x_r x_c)."""
    rows, cols = np.tril_indices(d, -1)
    order = np.lexsort((rows, cols))            # L filled column by column
    gather = np.zeros(d * d, np.int64)          # 0: zero; 1 + j: icf[:, d + j]
    gather[rows[order] * d + cols[order]] = 1 + np.arange(len(rows))
    ur, uc = np.triu_indices(d)
    return gather, ur, uc


class _Ops:
    """The few array operations the GMM objective needs, for JAX or PyTorch."""

    def __init__(self, lib):
        self.lib = lib
        if lib == "jax":
            import jax.numpy as jnp
            from jax.scipy.special import logsumexp
            self.m, self.lse = jnp, lambda v, a: logsumexp(v, axis=a)
            self.cat = lambda vs, a: jnp.concatenate(vs, axis=a)
            self.T = lambda v: jnp.swapaxes(v, -1, -2)
            self.s01 = lambda v: jnp.swapaxes(v, 0, 1)
        else:
            import torch
            self.m, self.lse = torch, lambda v, a: torch.logsumexp(v, a)
            self.cat = lambda vs, a: torch.cat(vs, a)
            self.T = lambda v: v.transpose(-1, -2)
            self.s01 = lambda v: v.transpose(0, 1)


def gmm_objective(o: _Ops, form: str, consts: dict, alphas, means, icf, x):
    """The ADBench GMM objective in one of three forms: "direct" (x - mu_k for every point
    and component, then Q_k times it: the einsum of the published comparison), "gemm"
    (x Q_k^T for all k in one matrix product, minus Q_k mu_k) and "expanded" (rvm's
    algorithm: each exponent a dot product of the component's weights with the point's
    monomials, all of them one matrix product)."""
    m = o.m
    d, n, k = consts["d"], consts["n"], alphas.shape[0]
    q = icf[:, :d]
    lower = o.cat([m.zeros_like(icf[:, :1]), icf[:, d:]], 1)[:, consts["gather"]]
    Q = lower.reshape(k, d, d) + m.exp(q)[:, :, None] * consts["eye"]
    base = alphas + q.sum(1)
    if form == "direct":
        diff = x[:, None, :] - means[None]
        qx = m.einsum("krc,nkc->nkr", Q, diff)
        main = base[None] - 0.5 * (qx ** 2).sum(-1)
    elif form == "gemm":
        qm = (Q @ means[:, :, None])[..., 0]                     # k x d
        qx = (x @ o.s01(o.T(Q)).reshape(d, k * d)).reshape(n, k, d) - qm[None]
        main = base[None] - 0.5 * (qx ** 2).sum(-1)
    else:                                                        # expanded
        A = o.T(Q) @ Q                                          # k x d x d
        ur, uc = consts["ur"], consts["uc"]
        quad = -A[:, ur, uc] * consts["wscale"]                  # k x d(d+1)/2
        lin = (A @ means[:, :, None])[..., 0]                    # k x d
        qm = (Q @ means[:, :, None])[..., 0]
        const = base - 0.5 * (qm ** 2).sum(1)
        W = o.cat([quad, lin, const[:, None]], 1)                # k x M
        main = consts["P"] @ o.T(W)                              # (n x M)(M x k)
    prior = 0.5 * consts["gamma"] ** 2 * ((m.exp(q) ** 2).sum() + (icf[:, d:] ** 2).sum()) \
        - consts["m"] * q.sum()
    return o.lse(main, 1).sum() - n * o.lse(alphas, 0) + prior + consts["c"]


def _gmm_consts(o: _Ops, data, to):
    import gmm
    x = data["x"]
    n, d = x.shape
    gather, ur, uc = gmm_parts(d)
    P = np.concatenate([x[:, ur] * x[:, uc], x, np.ones((n, 1))], 1)     # n x M
    return {"d": d, "n": n, "gather": to(gather), "ur": to(ur), "uc": to(uc),
            "eye": to(np.eye(d)), "wscale": to(np.where(ur == uc, 0.5, 1.0)),
            "P": to(P), "gamma": data["gamma"], "m": data["m"],
            "c": gmm.constant(d, len(data["alphas"]), n, data["gamma"], data["m"])}


def gmm_jax(data, form):
    jax = _jax()
    import jax.numpy as jnp
    o = _Ops("jax")
    consts = _gmm_consts(o, data, jax.device_put)
    x = jax.device_put(data["x"])
    if form == "expanded":
        def f(a, mu, icf):         # the monomials from the points, inside the call as rvm
            c = dict(consts)
            xs = x
            c["P"] = jnp.concatenate([xs[:, consts["ur"]] * xs[:, consts["uc"]], xs,
                                      jnp.ones((xs.shape[0], 1))], 1)
            return gmm_objective(o, form, c, a, mu, icf, xs)
    else:
        def f(a, mu, icf):
            return gmm_objective(o, form, consts, a, mu, icf, x)
    g = jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))
    args = [jax.device_put(data[k]) for k in ("alphas", "means", "icf")]
    run = lambda: jax.block_until_ready(g(*args))
    v, gr = run()
    return run, _flat(v, *gr)


def gmm_torch(data, form, cores, compiled=False):
    torch = _torch(cores)
    o = _Ops("torch")
    consts = _gmm_consts(o, data, torch.from_numpy)
    x = torch.from_numpy(data["x"])
    ur, uc = consts["ur"], consts["uc"]

    def f(a, mu, icf):
        c = consts
        if form == "expanded":
            c = dict(consts)
            c["P"] = torch.cat([x[:, ur] * x[:, uc], x, torch.ones(x.shape[0], 1,
                                                                   dtype=x.dtype)], 1)
        return gmm_objective(o, form, c, a, mu, icf, x)
    if compiled:
        f = torch.compile(f)
    args = [torch.tensor(data[k], requires_grad=True) for k in ("alphas", "means", "icf")]

    def run():
        for a in args:
            a.grad = None
        v = f(*args)
        v.backward()
        return v
    v = run()
    return run, _flat(v.item(), *(a.grad.numpy() for a in args))


def _gmm_points(parallel):
    """The loop over the points of a hand-written GMM gradient (rvm's algorithm: each
    exponent is W[k] . p_i for the point's monomials p_i): the sum of the points'
    log-sum-exps and its gradient with respect to W, the points split into one chunk
    per thread (prange) or one chunk."""
    numba = _numba()

    def points(W, x, ur, uc, chunks):
        k, m = W.shape
        n, d = x.shape
        gw = np.zeros((chunks, k, m))
        tot = np.zeros(chunks)
        for t in prange(chunks):
            p = np.empty(m)
            e = np.empty(k)
            for i in range(n * t // chunks, n * (t + 1) // chunks):
                for j in range(len(ur)):
                    p[j] = x[i, ur[j]] * x[i, uc[j]]
                for j in range(d):
                    p[len(ur) + j] = x[i, j]
                p[m - 1] = 1.0
                top = -np.inf
                for c in range(k):
                    s = 0.0
                    for j in range(m):
                        s += W[c, j] * p[j]
                    e[c] = s
                    top = max(top, s)
                s = 0.0
                for c in range(k):
                    e[c] = math.exp(e[c] - top)
                    s += e[c]
                tot[t] += top + math.log(s)
                for c in range(k):
                    w = e[c] / s
                    for j in range(m):
                        gw[t, c, j] += w * p[j]
        return tot.sum(), gw.sum(0)
    return numba.njit(parallel=parallel, fastmath=False, cache=not parallel)(points)


def gmm_numba(data, parallel):
    """The GMM objective and gradient by hand, rvm's algorithm: the weights W from the
    parameters (numpy), the points in a numba loop (serial, or prange across the cores),
    then W's gradient back to alphas, means and icf by hand (numpy)."""
    import gmm
    points = _gmm_points(parallel)
    numba = _numba()
    x = data["x"]
    n, d = x.shape
    gather, ur, uc = gmm_parts(d)
    scale = np.where(ur == uc, 0.5, 1.0)
    low = gather > 0
    c0 = gmm.constant(d, len(data["alphas"]), n, data["gamma"], data["m"])
    gamma, wm = data["gamma"], data["m"]
    chunks = numba.get_num_threads() if parallel else 1

    def run():
        alphas, means, icf = data["alphas"], data["means"], data["icf"]
        k = len(alphas)
        q, l_ = icf[:, :d], icf[:, d:]
        eq = np.exp(q)
        Q = np.zeros((k, d * d))
        Q[:, low] = l_[:, gather[low] - 1]
        Q = Q.reshape(k, d, d) + eq[:, :, None] * np.eye(d)
        A = np.swapaxes(Q, 1, 2) @ Q
        lin = (A @ means[:, :, None])[..., 0]
        qm = (Q @ means[:, :, None])[..., 0]
        const = alphas + q.sum(1) - 0.5 * (qm ** 2).sum(1)
        W = np.concatenate([-A[:, ur, uc] * scale, lin, const[:, None]], 1)
        total, gw = points(W, x, ur, uc, chunks)
        nq = len(ur)
        gq, gl, gc = gw[:, :nq], gw[:, nq:nq + d], gw[:, -1]
        dA = np.zeros((k, d, d))
        dA[:, ur, uc] = -gq * scale
        dA += gl[:, :, None] * means[:, None, :]                  # lin = A mu
        dmu = (np.swapaxes(A, 1, 2) @ gl[:, :, None])[..., 0]
        dqm = -gc[:, None] * qm                                  # const: -|Q mu|^2 / 2
        dQ = Q @ (dA + np.swapaxes(dA, 1, 2)) + dqm[:, :, None] * means[:, None, :]
        dmu += (np.swapaxes(Q, 1, 2) @ dqm[:, :, None])[..., 0]
        mx = alphas.max()
        lse_a = mx + math.log(np.exp(alphas - mx).sum())
        dalpha = gc - n * np.exp(alphas - lse_a)
        dq = np.diagonal(dQ, axis1=1, axis2=2) * eq + gc[:, None] + gamma ** 2 * eq ** 2 - wm
        dl = np.zeros_like(l_)
        dl[:, gather[low] - 1] = dQ.reshape(k, d * d)[:, low]
        dl += gamma ** 2 * l_
        prior = 0.5 * gamma ** 2 * ((eq ** 2).sum() + (l_ ** 2).sum()) - wm * q.sum()
        return total - n * lse_a + prior + c0, _flat(dalpha, dmu, np.concatenate([dq, dl], 1))
    v, g = run()
    return run, _flat(v, g)


def quick_gmm_input(d: int = 2, k: int = 5, n: int = 200) -> pathlib.Path:
    """A small GMM input in ADBench's layout, made here (seeded), so that --quick runs on
    a clone without the ADBench files."""
    import tempfile
    rng = np.random.default_rng(7)
    rows = [f"{d} {k} {n}", *map(str, rng.normal(size=k))]
    rows += [" ".join(map(str, r)) for r in rng.normal(size=(k, d))]
    rows += [" ".join(map(str, r)) for r in rng.normal(scale=0.3, size=(k, d * (d + 1) // 2))]
    rows += [" ".join(map(str, r)) for r in rng.normal(size=(n, d))]
    rows.append("1.0 0")
    folder = tempfile.mkdtemp(prefix="rvm_bench_")
    import atexit
    import shutil
    atexit.register(shutil.rmtree, folder, True)    # (gone with the process that made it)
    path = pathlib.Path(folder) / f"gmm_d{d}_K{k}.txt"
    path.write_text("\n".join(rows) + "\n")
    return path


def adbench_file(path: pathlib.Path) -> pathlib.Path:
    """An ADBench input of the full run, or a clear exit naming where it should be."""
    if path is None or not path.is_file():
        sys.exit(f"bench: the ADBench input {path} is not there; the full run reads "
                 "ADBench's GMM and BA files from that folder (--quick needs none)")
    return path


def compiling() -> int:
    """1 when a --quick run also checks torch.compile (run.py --compile: about 15 s of
    compiling), else 0."""
    import os
    return int(os.environ.get("RVM_BENCH_COMPILE") == "1")


def case_gmm(size, cores):
    import gmm
    import gmm_arrays
    out = []
    for name in GMM_FILES[size]:
        data = gmm.load(quick_gmm_input() if size == "quick" else
                        adbench_file(gmm.DATA / "gmm" / name))
        label = name.removesuffix(".txt")
        threads = 1 if cores == 1 else None

        def rvm_run(data=data):     # (one thread of its own: see gmm_arrays.objective)
            return gmm_arrays.gradient(data, engine="native")

        def rvm_loops(data=data, threads=threads):
            return gmm.gradient(data, engine="native", threads=threads)
        v, g = rvm_run()
        extra = {"threads": "1 (BLAS: default)"}
        tol = (1e-9, 1e-9)
        # (rvm's algorithm with array statements, examples/gmm_arrays.py; the same with
        # scalar loops, examples/gmm.py, beside it)
        peers = [Peer("rvm (array statements)", rvm_run, _flat(v, g), "reverse, expanded",
                      extra=extra, parts=(1,)),     # the objective, then the gradient
                 _try("rvm (scalar loops)", "reverse, expanded",
                      lambda run=rvm_loops: (run, _flat(*run())), tol)]
        peers.append(_try("numba by hand (rvm's algorithm), serial", "reverse, by hand",
                          lambda data=data: gmm_numba(data, False), tol))
        if cores != 1:
            peers.append(_parallel(_try("numba by hand (rvm's algorithm), prange",
                                        "reverse, by hand",
                                        lambda data=data: gmm_numba(data, True), tol)))
        for form, what in (("expanded", "rvm's algorithm"), ("direct", "direct, published"),
                           ("gemm", "GEMM")):
            peers.append(_try(f"JAX ({what})", "reverse",
                              lambda form=form, data=data: gmm_jax(data, form), tol))
        for form, what in (("expanded", "rvm's algorithm"), ("direct", "direct"),
                           ("gemm", "GEMM")):
            peers.append(_try(f"PyTorch eager ({what})", "reverse",
                              lambda form=form, data=data: gmm_torch(data, form, cores), tol))
        for form, what in (("expanded", "rvm's algorithm"), ("gemm", "GEMM"))[
                :2 if size == "full" else compiling()]:    # quick: one, to check agreement
            peers.append(_try(f"torch.compile ({what})", "reverse",
                              lambda form=form, data=data: gmm_torch(data, form, cores,
                                                                     True), tol))
        out.append((f"GMM gradient, {label}", peers))
    return out


# ====================================================================== Bessel
BESSEL_ATOL = 1e-8          # examples/besselj.py's besselj: terms while |term| > 1e-8
BESSEL_TOL = (0, 5e-8)      # rtol, atol: besselj multiplies approximately, and honest
# peers differ from it by up to 2.9e-8; one summing 7 terms where a point needs 9, 8.6e-8


def bessel_terms(nu, z, atol=BESSEL_ATOL) -> int:
    """How many terms after the first the example's loop adds at z."""
    h2 = (z / 2) ** 2
    term, k = (z / 2) ** nu / math.factorial(nu), 0
    while abs(term) > atol:
        k += 1
        term *= -h2 / (k * (k + nu))
    return k


def bessel_by_hand(nu, zs, grads, atol):
    """dJ_nu/dz at every z by hand: the example's series and its derivative, forward
    mode, no reversibility, no checks (compiled with numba: serial, or parallel=True for
    prange over the points)."""
    for i in prange(zs.shape[0]):
        h = zs[i] / 2
        fact = 1.0
        for j in range(1, nu + 1):
            fact *= j
        term = h ** nu / fact
        dterm = nu * h ** (nu - 1) / (2 * fact)
        ds, k = dterm, 0
        while abs(term) > atol:
            k += 1
            ratio, dratio = -h * h / (k * (k + nu)), -h / (k * (k + nu))
            term, dterm = term * ratio, dterm * ratio + term * dratio
            ds += dterm
        grads[i] = ds


def bessel_jax_fixed(count):
    """J_2(z) summed over a fixed `count` terms after the first (fori_loop)."""
    jax = _jax()

    def f(z):
        def body(k, c):
            term, total = c
            term = term * -(z / 2) ** 2 / (k * (k + 2))
            return term, total + term
        term = (z / 2) ** 2 / 2.0
        return jax.lax.fori_loop(1, count + 1, body, (term, term))[1]
    return f


def bessel_jax_while(atol=BESSEL_ATOL):
    """J_2(z) with the example's stopping rule (while_loop: forward mode only)."""
    jax = _jax()

    def f(z):
        def cond(c):
            return abs(c[1]) > atol

        def body(c):
            k, term, total = c
            k = k + 1
            term = term * -(z / 2) ** 2 / (k * (k + 2))
            return k, term, total + term
        term = (z / 2) ** 2 / 2.0
        return jax.lax.while_loop(cond, body, (0, term, term))[2]
    return f


def case_bessel_batch(size, cores):
    from besselj import besselj
    one_thread_vmap(cores)
    npts = 1000 if size == "quick" else 100_000
    zs = np.linspace(0.5, 3.0, npts)
    most = max(bessel_terms(2, z) for z in zs)
    batch = rvm.vmap(rvm.grad(besselj, loss="out", engine="native"), in_axes=(None, None, 0))
    ref = batch(0.0, 2, zs)[2]
    tol = BESSEL_TOL
    peers = [Peer("rvm (rvm.vmap of rvm.grad)", lambda: batch(0.0, 2, zs), ref, "reverse",
                  extra={"points": npts, "terms": f"{min(bessel_terms(2, z) for z in zs)}-"
                                                  f"{most}"})]

    def numba_loop(parallel):
        numba = _numba()
        if parallel:
            f = numba.njit(parallel=True)(bessel_by_hand)
        else:
            f = numba.njit(cache=True)(bessel_by_hand)
        out = np.empty_like(zs)
        f(2, zs, out, BESSEL_ATOL)
        return (lambda: f(2, zs, out, BESSEL_ATOL)), out.copy()
    peers.append(_try("numba by hand, serial loop", "forward, by hand",
                      lambda: numba_loop(False), tol))
    if cores != 1:
        peers.append(_parallel(_try("numba by hand, prange", "forward, by hand",
                                    lambda: numba_loop(True), tol)))

    def jax_peer(kind):
        jax = _jax()
        zj = jax.device_put(zs)
        if kind == "fixed20":
            g = jax.jit(jax.vmap(jax.grad(bessel_jax_fixed(20))))
        elif kind == "fixed":
            g = jax.jit(jax.vmap(jax.grad(bessel_jax_fixed(most))))
        else:
            g = jax.jit(jax.vmap(jax.jacfwd(bessel_jax_while())))
        run = lambda: g(zj).block_until_ready()
        return run, np.asarray(run())
    peers.append(_try("JAX jit(vmap(grad)), fixed 20 terms (published)", "reverse",
                      lambda: jax_peer("fixed20"), tol))
    peers.append(_try(f"JAX jit(vmap(grad)), fixed {most} terms (rvm's largest)", "reverse",
                      lambda: jax_peer("fixed"), tol))
    peers.append(_try("JAX jit(vmap(jacfwd)), while_loop, rvm's stopping rule", "forward",
                      lambda: jax_peer("while"), tol))

    def torch_peer():
        torch = _torch(cores)
        z = torch.from_numpy(zs.copy()).requires_grad_(True)

        def run():
            z.grad = None
            h2 = (z / 2) ** 2
            term = h2 / 2.0
            total, k = term, 0
            while bool((term.abs() > BESSEL_ATOL).any()):   # every row until the last stops
                k += 1
                term = term * -h2 / (k * (k + 2))
                total = total + term
            total.sum().backward()
            return z.grad
        return run, run().numpy().copy()
    peers.append(_try("PyTorch eager, batched, rvm's stopping rule", "reverse",
                      torch_peer, tol))

    def compiled_peer(terms):
        """torch.compile whole (fullgraph): with rvm's stopping rule (a loop on data) or
        summing a fixed number of terms."""
        torch = _torch(cores)
        z = torch.from_numpy(zs.copy()).requires_grad_(True)

        def f(z):
            h2 = (z / 2) ** 2
            term = h2 / 2.0
            total, k = term, 0
            while (k < terms) if terms else bool((term.abs() > BESSEL_ATOL).any()):
                k += 1
                term = term * -h2 / (k * (k + 2))
                total = total + term
            return total.sum()
        f = torch.compile(f, fullgraph=True)

        def run():
            z.grad = None
            f(z).backward()
            return z.grad
        return run, run().numpy().copy()
    if size == "full" or compiling():
        peers.append(_try("torch.compile, batched, rvm's stopping rule", "reverse",
                          lambda: compiled_peer(0), tol, _compile_fails()))
        peers.append(_try(f"torch.compile, batched, fixed {most} terms (rvm's largest)",
                          "reverse", lambda: compiled_peer(most), tol, _compile_fails()))
    return [(f"Bessel dJ2/dz over {npts:,} points (a batch)", peers)]


def case_bessel_call(size, cores):
    """One gradient at z = 1.0, called from Python."""
    from besselj import besselj
    g = rvm.grad(besselj, loss="out", engine="native")
    terms = bessel_terms(2, 1.0)
    tol = BESSEL_TOL
    peers = [Peer("rvm (rvm.grad)", lambda: g(0.0, 2, 1.0), np.array([g(0.0, 2, 1.0)[2]]),
                  "reverse", extra={"terms": terms})]

    def jax_peer():
        jax = _jax()
        f = jax.jit(jax.grad(bessel_jax_fixed(terms)))
        z = jax.device_put(1.0)
        run = lambda: f(z).block_until_ready()
        return run, np.array([float(run())])
    peers.append(_try(f"JAX jit(grad), fixed {terms} terms, device scalar", "reverse",
                      jax_peer, tol))

    def jax_jvp():
        jax = _jax()
        f = bessel_jax_fixed(terms)
        g = jax.jit(lambda z: jax.jvp(f, (z,), (1.0,))[1])
        z = jax.device_put(1.0)
        run = lambda: g(z).block_until_ready()
        return run, np.array([float(run())])
    peers.append(_try(f"JAX jit(jvp), fixed {terms} terms, device scalar", "forward",
                      jax_jvp, tol))

    def torch_peer():
        torch = _torch(cores)
        z = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)

        def run():
            z.grad = None
            h2 = (z / 2) ** 2
            term = h2 / 2.0
            total, k = term, 0
            while abs(term.item()) > BESSEL_ATOL:       # rvm's stopping rule
                k += 1
                term = term * -h2 / (k * (k + 2))
                total = total + term
            total.backward()
            return z.grad
        return run, np.array([float(run())])
    peers.append(_try("PyTorch eager, rvm's stopping rule", "reverse", torch_peer, tol))

    def numba_peer():
        numba = _numba()

        @numba.njit
        def one(z):
            out = np.empty(1)
            bessel_hand_nb(2, np.array([z]), out, BESSEL_ATOL)
            return out[0]
        bessel_hand_nb = numba.njit(cache=True)(bessel_by_hand)
        return (lambda: one(1.0)), np.array([one(1.0)])
    peers.append(_try("numba by hand", "forward, by hand", numba_peer, tol))
    return [("Bessel dJ2/dz at z = 1.0, one call from Python", peers)]


# ====================================================================== BA Jacobian
BA_FILES = {"quick": ["ba1"], "full": ["ba1", "ba3"]}


def ba_jax(data, how):
    jax = _jax()
    import ba
    import jax.numpy as jnp

    def residual(cam, x, w, feat):
        r, d = cam[:3], x - cam[3:6]
        theta = jnp.sqrt(r @ r)
        safe = jnp.where(theta == 0, 1.0, theta)
        u = r / safe
        rot = d * jnp.cos(theta) + jnp.cross(u, d) * jnp.sin(theta) + u * (u @ d) * (
            1 - jnp.cos(theta))
        y = jnp.where(theta == 0, d + jnp.cross(r, d), rot)
        p = y[:2] / y[2]
        s = p @ p
        return w * (cam[6] * p * (1 + cam[9] * s + cam[10] * s * s) + cam[7:9] - feat)
    jacobian = jax.jacfwd if how == "jacfwd" else jax.jacrev
    both = jacobian(lambda *a: (residual(*a),) * 2, argnums=(0, 1, 2), has_aux=True)
    jac = jax.jit(jax.vmap(both))
    cams = jax.device_put(data["cams"][data["obs"][:, 0]])
    xs = jax.device_put(data["x"][data["obs"][:, 1]])
    w, feats = jax.device_put(data["w"]), jax.device_put(data["feats"])

    def run():       # to ADBench's output, as ba.jacobian does for rvm
        (jc, jx, jw), e = jac(cams, xs, w, feats)
        blocks = np.concatenate([np.asarray(jc), np.asarray(jx), np.asarray(jw)[..., None]],
                                axis=2)
        return ba.assemble(data, blocks, np.asarray(e).ravel())
    r = run()
    return run, _flat(r["reproj_err"], r["J"]["vals"])


def ba_torch(data, how, cores, compiled=False):
    """As ba_jax in PyTorch eager: torch.func's jacfwd or jacrev of one observation's
    residual, vmapped over the observations; or that vmap under torch.compile."""
    torch = _torch(cores)
    import ba
    from torch.func import jacfwd, jacrev, vmap

    def residual(cam, x, w, feat):
        r, d = cam[:3], x - cam[3:6]
        theta = torch.sqrt(r @ r)
        safe = torch.where(theta == 0, torch.ones_like(theta), theta)
        u = r / safe
        rot = d * torch.cos(theta) + torch.linalg.cross(u, d) * torch.sin(theta) + \
            u * (u @ d) * (1 - torch.cos(theta))
        y = torch.where(theta == 0, d + torch.linalg.cross(r, d), rot)
        p = y[:2] / y[2]
        s = p @ p
        out = w * (cam[6] * p * (1 + cam[9] * s + cam[10] * s * s) + cam[7:9] - feat)
        return out, out
    jacobian = jacfwd if how == "jacfwd" else jacrev
    jac = vmap(jacobian(residual, argnums=(0, 1, 2), has_aux=True))
    if compiled:
        jac = torch.compile(jac)
    cams = torch.from_numpy(data["cams"][data["obs"][:, 0]])
    xs = torch.from_numpy(data["x"][data["obs"][:, 1]])
    w, feats = torch.from_numpy(data["w"]), torch.from_numpy(data["feats"])

    def run():       # to ADBench's output, as ba.jacobian does for rvm
        with torch.no_grad():
            (jc, jx, jw), e = jac(cams, xs, w, feats)
        blocks = np.concatenate([jc.numpy(), jx.numpy(), jw.numpy()[..., None]], axis=2)
        return ba.assemble(data, blocks, e.numpy().ravel())
    r = run()
    return run, _flat(r["reproj_err"], r["J"]["vals"])


def ba_numba(data, parallel):
    """The Jacobian by hand in numba, forward mode as jacfwd (tools/bench/ba_numba.py):
    serial, or prange over the observations; assembled as rvm's and JAX's."""
    _numba()
    import ba_numba as bn
    run = lambda: bn.jacobian(data, parallel)
    r = run()
    return run, _flat(r["reproj_err"], r["J"]["vals"])


def case_ba(size, cores):
    import ba
    from bench_adbench import ba_input
    one_thread_vmap(cores)
    out = []
    for stem in BA_FILES[size]:
        # quick: ADBench's ba1 cut to 3 cameras, 4 points, 7 observations (in the repo)
        data = ba.load(ROOT / "tests" / "data" / "ba_small.txt" if size == "quick" else
                       adbench_file(ba_input(stem)))
        r = ba.jacobian(data, engine="native")
        peers = [Peer("rvm (rvm.vmap of rvm.jacobian)",
                      lambda data=data: ba.jacobian(data, engine="native"),
                      _flat(r["reproj_err"], r["J"]["vals"]), "reverse",   # a gradient
                      extra={"observations": len(data["w"])})]          # pass per residual
        tol = (1e-9, 1e-12)
        peers.append(_try("numba forward mode by hand (jacfwd's algorithm), serial",
                          "forward, by hand", lambda data=data: ba_numba(data, False), tol))
        if cores != 1:
            peers.append(_parallel(_try(
                "numba forward mode by hand (jacfwd's algorithm), prange", "forward, by hand",
                lambda data=data: ba_numba(data, True), tol)))
        peers.append(_try("JAX jit(vmap(jacfwd)) (published)", "forward",
                          lambda data=data: ba_jax(data, "jacfwd"), tol))
        peers.append(_try("JAX jit(vmap(jacrev))", "reverse",
                          lambda data=data: ba_jax(data, "jacrev"), tol))
        peers.append(_try("PyTorch eager vmap(jacfwd)", "forward",
                          lambda data=data: ba_torch(data, "jacfwd", cores), tol))
        peers.append(_try("PyTorch eager vmap(jacrev)", "reverse",
                          lambda data=data: ba_torch(data, "jacrev", cores), tol))
        for how in ("jacrev", "jacfwd")[:2 if size == "full" else compiling()]:
            peers.append(_try(f"torch.compile(vmap({how}))", "reverse" if how == "jacrev"
                              else "forward", lambda data=data, how=how:
                              ba_torch(data, how, cores, True), tol, _compile_fails()))
        out.append((f"Bundle-adjustment Jacobian, {stem} "
                    f"({len(data['w']):,} observations)", peers))
    return out


# ====================================================================== leapfrog
def leapfrog_tangent_by_hand(q, dq, n, dt):
    """q_N and d q_N / d q_0 of the pendulum: the loop and its tangent by hand."""
    p, dp = 0.0, 0.0
    for _ in range(n):
        p -= dt * math.sin(q)
        dp -= dt * math.cos(q) * dq
        q += dt * p
        dq += dt * dp
    return q, dq


def leapfrog_peers(n, cores, which=None):
    """The leapfrog peers: name -> make() -> (run, d q_N / d q_0)."""
    from programs import leapfrog
    dt, q0 = 1e-3, 1.0

    def rvm_grad():
        g = rvm.grad(leapfrog, loss="q", engine="native")
        return (lambda: g(q0, 0.0, n, dt)), np.array([g(q0, 0.0, n, dt)[0]])

    def rvm_tangent():
        t = rvm.tangent(leapfrog, engine="native", max_steps=10 ** 12)
        return (lambda: t(q0, 0.0, n, dt, 1.0, 0.0, 0.0)), \
            np.array([t(q0, 0.0, n, dt, 1.0, 0.0, 0.0)[4]])

    def jax_f():
        jax = _jax()

        def f(q):
            def body(_, c):
                q, p = c
                p = p - dt * jax.numpy.sin(q)
                return q + dt * p, p
            return jax.lax.fori_loop(0, n, body, (q, 0.0))[0]
        return jax, f

    def jax_grad():
        jax, f = jax_f()
        g, z = jax.jit(jax.grad(f)), jax.device_put(q0)
        run = lambda: g(z).block_until_ready()
        return run, np.array([float(run())])

    def jax_jvp():
        jax, f = jax_f()
        g = jax.jit(lambda q: jax.jvp(f, (q,), (1.0,))[1])
        z = jax.device_put(q0)
        run = lambda: g(z).block_until_ready()
        return run, np.array([float(run())])

    def torch_f(q):         # alpha=dt: `dt * tensor` is ~30x slower in forward mode
        p = q * 0.0
        for _ in range(n):
            p = p.sub(q.sin(), alpha=dt)
            q = q.add(p, alpha=dt)
        return q

    def torch_jvp():
        torch = _torch(cores)
        z, one = (torch.tensor(v, dtype=torch.float64) for v in (q0, 1.0))
        run = lambda: torch.func.jvp(torch_f, (z,), (one,))[1]
        return run, np.array([float(run())])

    def torch_dual():
        torch = _torch(cores)
        import torch.autograd.forward_ad as fw
        z, one = (torch.tensor(v, dtype=torch.float64) for v in (q0, 1.0))

        def run():
            with fw.dual_level():
                return fw.unpack_dual(torch_f(fw.make_dual(z, one))).tangent
        return run, np.array([float(run())])

    def torch_grad():
        torch = _torch(cores)
        z = torch.tensor(q0, dtype=torch.float64, requires_grad=True)

        def run():
            z.grad = None
            torch_f(z).backward()
            return z.grad
        return run, np.array([float(run())])

    def numba_tangent():
        f = _numba().njit(leapfrog_tangent_by_hand)
        return (lambda: f(q0, 1.0, n, dt)), np.array([f(q0, 1.0, n, dt)[1]])
    table = {"rvm (rvm.grad)": ("reverse", rvm_grad),
             "rvm (rvm.tangent)": ("forward", rvm_tangent),
             "JAX jit(grad)": ("reverse", jax_grad),
             "JAX jit(jvp)": ("forward", jax_jvp),
             "numba tangent loop by hand": ("forward, by hand", numba_tangent),
             "PyTorch eager torch.func.jvp": ("forward", torch_jvp),
             "PyTorch eager forward AD (dual tensors)": ("forward", torch_dual),
             "PyTorch eager autograd": ("reverse", torch_grad)}
    return {k: v for k, v in table.items() if which is None or k == which}


def case_leapfrog(size, cores):
    n = 300 if size == "quick" else 100_000
    peers = [_try(name, mode, make, (1e-9, 1e-12))
             for name, (mode, make) in leapfrog_peers(n, cores).items()]
    peers[0].extra = {"steps": n}
    return [(f"Pendulum leapfrog d q_N / d q_0, N = {n:,} (one input)", peers)]


# ====================================================================== graph embedding
def case_embedding(size, cores):
    from programs import embedding_loss
    from worker import _TorchNp, embedding_numpy, petersen
    out = []
    l1, l2 = petersen()
    for k in ([2] if size == "quick" else [2, 10]):
        x = np.random.default_rng(k).normal(size=(10, k))
        g = rvm.grad(embedding_loss, loss="out", engine="native")
        peers = [Peer("rvm (rvm.grad)", lambda g=g, x=x: g(0.0, x, l1, l2),
                      np.asarray(g(0.0, x, l1, l2)[1]), "reverse")]

        def jax_peer(x=x):
            jax = _jax()
            import jax.numpy as jnp
            f = jax.jit(jax.grad(lambda x: embedding_numpy(jnp, x, l1, l2)))
            xd = jax.device_put(x)
            run = lambda: f(xd).block_until_ready()
            return run, np.asarray(run())

        def torch_peer(x=x, compiled=False):
            torch = _torch(cores)
            a, b = torch.tensor(l1), torch.tensor(l2)
            t = torch.tensor(x, requires_grad=True)
            f = lambda t: embedding_numpy(_TorchNp(torch), t, a, b)
            if compiled:
                f = torch.compile(f)

            def run():
                t.grad = None
                f(t).backward()
                return t.grad
            return run, run().numpy().copy()
        tol = (1e-9, 1e-12)
        peers.append(_try("JAX jit(grad), device array", "reverse", jax_peer, tol))
        peers.append(_try("PyTorch eager", "reverse", torch_peer, tol))
        if size == "full":
            peers.append(_try("torch.compile", "reverse",
                              lambda x=x: torch_peer(x, True), tol))
        out.append((f"Petersen graph embedding gradient, dimension {k}", peers))
    return out


CASES = {"gmm": case_gmm, "bessel-batch": case_bessel_batch, "bessel-call": case_bessel_call,
         "ba": case_ba, "leapfrog": case_leapfrog, "embedding": case_embedding}
# the cases whose rvm side uses more than one core by default (the others are one input,
# one thread: measured on one core only)
MULTICORE = {"gmm", "bessel-batch", "ba"}

