"""The benchmark runner (tools/bench/run.py --quick): it runs every comparison on tiny
inputs, and every peer's result agrees with rvm's in the same run. A peer whose library
is not installed is skipped here by name; rvm's own rows are checked regardless."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN = ROOT / "tools" / "bench" / "run.py"
# which library each peer needs, by the start of its name
SLOW = bool(os.environ.get("RVM_SLOW"))
LIBRARIES = {"JAX": "jax", "PyTorch": "torch", "torch.compile": "torch", "numba": "numba"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if importlib.util.find_spec("numba") is None:
        pytest.skip("rvm's native engine needs numba's llvmlite: pip install '.[test]'")
    out = tmp_path_factory.mktemp("bench")
    # --jobs 2: the one-core and the default-cores processes at once (most of each is
    # compiling, not timing: 35-45 s where one after the other took 58-63 s); torch.compile
    # (about 15 s more) with RVM_SLOW=1
    r = subprocess.run([sys.executable, str(RUN), "--quick", *(["--compile"] if SLOW else []),
                        "--jobs", "2", "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
    return json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


def library(peer: str) -> str | None:
    return next((lib for start, lib in LIBRARIES.items() if peer.startswith(start)), None)


def test_quick_bench_covers_every_comparison_with_rvm_first(quick):
    result, md = quick
    cases = {t["case"] for t in result["tables"]}
    assert cases == {"gmm", "bessel-batch", "bessel-call", "ba", "leapfrog", "embedding"}
    for t in result["tables"]:
        rvm = t["rows"][0]
        assert rvm["peer"].startswith("rvm") and "skip" not in rvm, t["title"]
        assert rvm["min_s"] > 0 and rvm["median_s"] >= rvm["min_s"]
        for r in t["rows"]:
            if r["peer"].startswith("rvm") or "skip" not in r:
                assert "skip" not in r and r["rounds"] >= 2, (t["title"], r["peer"])
            assert r["peer"].startswith("rvm") or library(r["peer"]), r["peer"]
    # one core each first for every comparison; multi-core rvm rows beside numba prange
    ones = [t["title"] for t in result["tables"] if t["cores"] == 1]
    assert len(ones) >= 6
    for t in result["tables"]:
        if t["cores"] != 1 and t["case"] in ("bessel-batch", "ba"):
            assert any("prange" in r["peer"] for r in t["rows"])
    assert "### Summary" in md and "rvm ÷ peer" in md


@pytest.mark.parametrize("lib", ["numba", "jax", "torch"])
def test_every_peer_agrees_with_rvm(quick, lib):
    if importlib.util.find_spec(lib) is None:
        pytest.skip(f"{lib} is not installed, so its peers were not run "
                    "(pip install '.[bench]')")
    result, _ = quick
    seen = 0
    for t in result["tables"]:
        for r in t["rows"]:
            if library(r["peer"]) != lib:
                continue
            if "skip" in r and r["peer"].startswith("torch.compile") and \
                    r["skip"].startswith("does not run: "):     # a data-dependent loop
                assert "stopping rule" in r["peer"], (t["title"], r["peer"], r["skip"])
                continue
            assert "skip" not in r, (t["title"], r["peer"], r.get("skip"))
            assert r["agrees"], (t["title"], r["peer"], r["max_abs_diff"])
            seen += 1
    assert seen >= 2
    if lib == "torch":      # PyTorch beside rvm in every comparison; torch.compile checked
        for t in result["tables"]:                          # where it compiles
            assert any(library(r["peer"]) == "torch" and "skip" not in r
                       for r in t["rows"]), t["title"]
        compiled = {t["case"] for t in result["tables"] for r in t["rows"]
                    if r["peer"].startswith("torch.compile") and "skip" not in r}
        assert {"gmm", "bessel-batch"} <= compiled or not SLOW, compiled
    if lib == "jax":        # one-input problems meet JAX's forward mode too
        for t in result["tables"]:
            if t["case"] in ("bessel-call", "leapfrog"):
                assert any("jvp" in r["peer"] for r in t["rows"] if "skip" not in r)
    if lib == "numba":      # BA's hand-written Jacobian: serial on one core, prange beside
        for t in result["tables"]:      # rvm's multi-core row
            if t["case"] == "ba":
                names = [r["peer"] for r in t["rows"] if library(r["peer"]) == "numba"]
                assert any("serial" in n for n in names), (t["title"], t["cores"], names)
                assert t["cores"] == 1 or any("prange" in n for n in names), names
        for t in result["tables"]:      # numba's prange on the layer measure.pin chose
            for r in t["rows"]:
                if "prange" in r["peer"] and "NUMBA_THREADING_LAYER" not in os.environ:
                    assert r["threading_layer"] == "workqueue", (t["title"], r["peer"])


def test_the_performance_page_is_a_page():
    """docs/performance.md stays a page a user reads (the history lives in
    performance-notes.md), and the quick run needs no input from outside the repo."""
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) <= 250
    assert "performance-notes.md" in page
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    import peers
    assert peers.quick_gmm_input().read_text().startswith("2 5 200\n")


# ---------------------------------------------------------------- run.py's own behaviour
def _bench_module(name: str):
    """tools/bench/<name>.py as a module (run.py is a script, peers.py imports rvm)."""
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    spec = importlib.util.spec_from_file_location(f"bench_{name}",
                                                  ROOT / "tools" / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _result(agrees_fast: bool) -> dict:
    """A run's result: rvm, a fast peer (agreeing or not) and a slower one that agrees."""
    row = dict(mode="reverse", median_s=1.0, rounds=2, calls_per_round=1, max_abs_diff=0.0)
    rows = [dict(row, peer="rvm", agrees=True, min_s=1.0),
            dict(row, peer="JAX fast", agrees=agrees_fast, min_s=0.1, max_abs_diff=0.5),
            dict(row, peer="numba slower", agrees=True, min_s=0.5)]
    return {"size": "quick", "rounds": 2, "budget_s": 0.01, "seconds": 1.0, "memory": {},
            "machine": {"cpu": "cpu", "cores": 2, "python": "3", "numpy": "1",
                        "numba": "1", "jax": "1", "torch": "1"},
            "tables": [{"case": "gmm", "title": "GMM", "cores": 1, "cores_available": 2,
                        "rows": rows}]}


def test_a_disagreeing_peer_does_not_write_the_page_and_is_never_the_fastest(
        tmp_path, monkeypatch, capsys):
    import argparse
    run = _bench_module("run")
    page = tmp_path / "performance.md"
    before = f"# page\n{run.START}\nold table\n{run.END}\nprose\n"
    page.write_text(before)
    monkeypatch.setattr(run, "DOC", page)
    monkeypatch.setattr(run, "FAILED", [])
    args = argparse.Namespace(out=str(tmp_path / "out"), doc=True)
    with pytest.raises(SystemExit) as e:
        run.publish(_result(agrees_fast=False), args)
    assert page.read_text() == before            # the page keeps its old table
    assert "JAX fast" in str(e.value) and "not written" in str(e.value)
    summary = "\n".join(run.summary(_result(agrees_fast=False)["tables"]))
    assert "numba slower" in summary and "JAX fast" not in summary
    run.publish(_result(agrees_fast=True), args)  # every peer agrees: the page is written
    assert "| GMM | 1 s | JAX fast |" in page.read_text()
    assert page.read_text().endswith(f"{run.END}\nprose\n")


def test_a_comparison_that_times_out_is_reported_and_the_run_goes_on(monkeypatch):
    import subprocess as sp
    run = _bench_module("run")
    monkeypatch.setattr(run, "FAILED", [])

    def slow(cmd, **kw):
        raise sp.TimeoutExpired(cmd, kw.get("timeout"))
    monkeypatch.setattr(run.subprocess, "run", slow)
    assert run.measure("ba", "quick", 1, 2, 0.01, timeout=5) == []
    assert run.FAILED == ["ba (cores 1): timed out after 5 s"]
    assert run.peak("JAX jit(grad)", 1000).startswith("timed out")


def test_an_import_error_inside_a_peer_fails_and_a_missing_library_is_a_skip(monkeypatch):
    peers = _bench_module("peers")

    def broken():       # the peer's own code imports something that is not there
        import rvm_bench_no_such_helper  # noqa: F401
    with pytest.raises(ImportError):
        peers._try("JAX broken", "reverse", broken)

    def bad_name():     # an installed library without the name the peer wants
        from numpy import no_such_function_in_numpy  # noqa: F401
    with pytest.raises(ImportError):
        peers._try("JAX broken", "reverse", bad_name)

    def no_torch():
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == "torch" else real(n, *a))
    p = peers._try("PyTorch eager", "reverse", no_torch)
    assert p.skip == "not installed (torch)" and p.run is None
    monkeypatch.setattr(importlib.util, "find_spec", real)   # torch there, import broken
    if real("torch") is not None:
        with pytest.raises(ImportError):
            peers._try("PyTorch eager", "reverse", no_torch)


def test_the_bessel_check_fails_a_peer_that_sums_too_few_terms():
    """Honest peers differ from rvm's besselj by up to 2.9e-8; one summing 7 terms where
    the points up to z = 3 need 9 differs by 7.6e-8 and must not agree."""
    import numpy as np

    import rvm
    peers = _bench_module("peers")          # (puts examples/ on the path)
    measure = _bench_module("measure")
    besselj = importlib.import_module("besselj").besselj
    zs = np.linspace(0.5, 3.0, 1000)
    batch = rvm.vmap(rvm.grad(besselj, loss="out", engine="native"), in_axes=(None, None, 0))
    ref = batch(0.0, 2, zs)[2]

    def summed(count):          # dJ2/dz summing `count` terms after the first
        h = zs / 2
        term, dterm = h ** 2 / 2, h / 2
        total = dterm.copy()
        for k in range(1, count + 1):
            ratio, dratio = -h * h / (k * (k + 2)), -h / (k * (k + 2))
            term, dterm = term * ratio, dterm * ratio + term * dratio
            total += dterm
        return total
    assert measure.compare(summed(9), ref, peers.BESSEL_TOL)[0]
    assert measure.compare(summed(20), ref, peers.BESSEL_TOL)[0]
    assert not measure.compare(summed(7), ref, peers.BESSEL_TOL)[0]


def test_pinning_sets_only_real_xla_flags_and_the_default_run_numbas_threading_layer():
    code = ("import os, sys; sys.path.insert(0, sys.argv[1]); import measure; "
            "measure.pin(int(sys.argv[2])); print(os.environ.get('XLA_FLAGS', ''), '|', "
            "os.environ.get('NUMBA_THREADING_LAYER', ''))")
    env = {k: v for k, v in os.environ.items()
           if k not in ("XLA_FLAGS", "NUMBA_THREADING_LAYER")}
    out = {}
    for cores in (1, 0):
        r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tools" / "bench"),
                            str(cores)], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        out[cores] = [part.split() for part in r.stdout.split("|")]
    xla, _ = out[1]
    assert xla and all(tok.startswith("--xla_") for tok in xla), xla   # none XLA ignores
    assert out[0] == [[], ["workqueue"]]      # prange peers off numba's spinning omp layer


def test_the_compile_breakdown_takes_a_first_compile_apart():
    """tools/bench_compile.py: the first native gradient of the Bessel function in a fresh
    process, its IR module, and LLVM's part of it taken apart; the helpers' bodies are
    taken out of a module that has them (each left declared, so LLVM still takes it)."""
    pytest.importorskip("llvmlite")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import bench_compile
    finally:
        sys.path.remove(str(ROOT / "tools"))
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_compile.py"), "bessel"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    row = r.stdout.splitlines()[-1].strip("|").split("|")
    first, front, llvm = (float(x.split()[0]) for x in row[1:4])    # ("0.1 (quick code)")
    assert row[0].strip().startswith("Bessel") and first >= llvm > 0 and front >= 0
    assert int(row[4].split("(")[0].replace(",", "")) > 1000 and row[6].strip() == "(none)"
    parse, optimise, code = (float(x) for x in row[5].split("/"))
    assert parse >= 0 and optimise > 0 and code > 0
    text = ('define internal double @"rvm_array_vacc_1"(double %".1")\n{\nentry:\n'
            '  ret double %".1"\n}\n'
            'define double @"F0_fw_"(double %".2")\n{\nentry:\n'
            '  %".3" = call double @"rvm_array_vacc_1"(double %".2")\n  ret double %".3"\n}\n')
    stripped = bench_compile.strip_helpers(text)
    assert 'declare double @"rvm_array_vacc_1"(double %".1")' in stripped
    assert stripped.count("ret double") == 1 and 'define double @"F0_fw_"' in stripped
    import llvmlite.binding as ll

    from rvm.engines import llvm as back_end
    back_end._llvm()
    ll.parse_assembly(stripped).verify()
