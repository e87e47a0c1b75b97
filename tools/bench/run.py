"""Run every benchmark side by side, each measurement in a fresh process, and write the
tables into docs/performance.md (between the bench markers).

    pip install -e '.[bench]'        # numba, autograd, jax, torch (all optional)
    python tools/bench/run.py [--quick] [--no-write]

A tool that is not installed is listed as such; a run over the time limit as a timeout.
"""

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER = ROOT / "tools" / "bench" / "worker.py"
DOC = ROOT / "docs" / "performance.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
RVM = ["rvm-interp", "rvm-python", "rvm-native"]


def measure(workload, tool, param=None, timeout=300):
    cmd = [sys.executable, str(WORKER), workload, tool] + ([str(param)] if param else [])
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"tool": tool, "error": f"timeout ({timeout} s)"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["failed"])[-1]
        if "ModuleNotFoundError" in last or "needs numba" in last:
            last = "not installed"
        return {"tool": tool, "error": last[:80]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def fmt(v, unit=""):
    return f"{v:,.3g}{unit}" if isinstance(v, float) else str(v)


def bessel_table(quick):
    tools = RVM + ["python-forward", "numba-hand", "autograd", "torch", "jax"]
    rows = ["| tool | us per call | value |", "|---|---|---|"]
    for t in tools:
        if quick and t == "rvm-interp":
            continue
        r = measure("bessel", t)
        print(r, flush=True)
        rows.append(f"| {t} | {r.get('error') or fmt(r['us'])} | {r.get('value', '')} |")
    return rows


LEAPFROG: list[dict] = []


def leapfrog_table(quick):
    sizes = [10**4, 10**5] if quick else [10**4, 10**5, 10**6, 10**7]
    rows = ["| tool | N | seconds | peak memory growth (MB) |", "|---|---|---|---|"]
    for t in ["rvm-native", "rvm-python", "jax", "torch", "autograd"]:
        for n in sizes:
            if n > 10**6 and t in ("torch", "autograd"):     # minutes and tens of GB
                continue
            r = measure("leapfrog", t, n, timeout=300)
            print(r, flush=True)
            if "error" in r:
                rows.append(f"| {t} | {n:,} | {r['error']} | |")
            else:
                LEAPFROG.append(r)
                rows.append(f"| {t} | {n:,} | {fmt(r['seconds'])} | {r['peak_mb']:.1f} |")
    if plot_leapfrog(LEAPFROG):
        rows += ["", "![leapfrog time and memory](leapfrog.png)"]
    return rows


def plot_leapfrog(results, path=ROOT / "docs" / "leapfrog.png") -> bool:
    """Time and peak memory against N, one line per tool (if matplotlib is installed)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for tool in sorted({r["tool"] for r in results}):
        rs = sorted((r for r in results if r["tool"] == tool), key=lambda r: r["n"])
        ax1.plot([r["n"] for r in rs], [r["seconds"] for r in rs], "o-", label=tool)
        ax2.plot([r["n"] for r in rs], [max(r["peak_mb"], 0.1) for r in rs], "o-", label=tool)
    for ax, label in ((ax1, "seconds"), (ax2, "peak memory growth (MB; 0 drawn at 0.1)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("leapfrog steps N")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend()
    fig.suptitle("d q_N / d q_0 of a pendulum leapfrog integrator")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def embedding_table(quick):
    ks = [2, 6, 10] if quick else [2, 4, 6, 8, 10]
    rows = ["| tool | " + " | ".join(f"k={k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks)]
    for t in ["rvm-native", "rvm-python", "jax", "torch", "autograd"]:
        cells = []
        for k in ks:
            r = measure("embedding", t, k)
            print(r, flush=True)
            cells.append(r.get("error") or fmt(r["us"], " us"))
        rows.append(f"| {t} | " + " | ".join(cells) + " |")
    return rows


def sparse_table(quick):
    rows = ["| tool | forward (ms) | gradient (ms) | gradient / forward |", "|---|---|---|---|"]
    for t in ["rvm-native", "rvm-python", "scipy"]:
        r = measure("sparse", t)
        print(r, flush=True)
        if "error" in r:
            rows.append(f"| {t} | {r['error']} | | |")
        else:
            rows.append(f"| {t} | {fmt(r['forward_ms'])} | {fmt(r['gradient_ms'])} | "
                        f"{r['gradient_ms'] / r['forward_ms']:.2f} |")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer sizes, no interpreter")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    sections = [
        ("Bessel d/dz J2(z) at z = 1.0 (one gradient per call from Python)", bessel_table),
        ("Pendulum leapfrog, d q_N / d q_0 (each run in a fresh process)", leapfrog_table),
        ("Petersen graph embedding loss, gradient per call", embedding_table),
        ("Sparse dot product of two 1000 x 1000 matrices, density 0.05", sparse_table),
    ]
    out = [START, "", f"Generated by `python tools/bench/run.py{' --quick' if args.quick else ''}`"
           " (each measurement in a fresh process).", ""]
    for title, table in sections:
        out += [f"### {title}", ""] + table(args.quick) + [""]
    out.append(END)
    text = "\n".join(out)
    print(text)
    if not args.no_write:
        doc = DOC.read_text()
        if START in doc:
            doc = doc[:doc.index(START)] + text + doc[doc.index(END) + len(END):]
        else:
            doc += "\n## Side by side with other tools\n\n" + text + "\n"
        DOC.write_text(doc)


if __name__ == "__main__":
    main()
