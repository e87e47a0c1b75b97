"""The benchmark runner (tools/bench/run.py --quick): it runs every comparison on tiny
inputs, and every peer's result agrees with rvm's in the same run. A peer whose library
is not installed is skipped here by name; rvm's own rows are checked regardless."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
RUN = ROOT / "tools" / "bench" / "run.py"
# which library each peer needs, by the start of its name
LIBRARIES = {"JAX": "jax", "PyTorch": "torch", "torch.compile": "torch", "numba": "numba"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    if importlib.util.find_spec("numba") is None:
        pytest.skip("rvm's native engine needs numba's llvmlite: pip install '.[test]'")
    out = tmp_path_factory.mktemp("bench")
    r = subprocess.run([sys.executable, str(RUN), "--quick", "--compile", "--out", str(out)],
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
        assert {"gmm", "bessel-batch"} <= compiled, compiled
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


def test_the_performance_page_is_a_page():
    """docs/performance.md stays a page a user reads (the history lives in
    performance-notes.md), and the quick run needs no input from outside the repo."""
    page = (ROOT / "docs" / "performance.md").read_text()
    assert len(page.splitlines()) <= 250
    assert "performance-notes.md" in page
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    import peers
    assert peers.quick_gmm_input().read_text().startswith("2 5 200\n")
