"""Run every comparison of rvm with its peers and write the table as markdown and JSON.

    pip install -e '.[bench]'          # numba, JAX, PyTorch (a peer not installed is skipped)
    python tools/bench/run.py [--quick] [--out DIR] [--cases gmm ba ...] [--doc]

Each comparison runs in a fresh process, every peer in it alternating with the others
over several rounds (the order reversed each round); a round times a batch of calls
sized to take about --budget seconds, and the table gives the minimum and the median
over the rounds. Every peer's result is checked against rvm's in the same process.
Each comparison runs first pinned to one core (every tool told to use one thread), then,
where rvm uses more than one core by default, as every tool runs by default. --quick
runs tiny inputs (under a minute; tests/test_bench.py runs it). --doc also puts the
tables into docs/performance.md between its bench markers, only when every comparison
ran and every peer agreed with rvm (else the command exits 1 and the page is unchanged).
"""

import argparse
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEASURE = ROOT / "tools" / "bench" / "measure.py"
DOC = ROOT / "docs" / "performance.md"
START, END = "<!-- bench:start -->", "<!-- bench:end -->"
CASES = ["gmm", "bessel-batch", "bessel-call", "ba", "leapfrog", "embedding"]
MULTICORE = {"gmm", "bessel-batch", "ba"}       # rvm uses every core by default
FAILED: list[str] = []
MEMORY_PEERS = ["rvm (rvm.grad)", "rvm (rvm.tangent)", "JAX jit(grad)", "JAX jit(jvp)",
                "numba tangent loop by hand"]


def measure(case, size, cores, rounds, budget, timeout=1800) -> list:
    cmd = [sys.executable, str(MEASURE), case, "--size", size, "--cores", str(cores),
           "--rounds", str(rounds), "--budget", str(budget)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        FAILED.append(f"{case} (cores {cores}): timed out after {timeout} s")
        print(f"run.py: {case} (cores {cores}) timed out after {timeout} s", flush=True)
        return []
    if r.returncode != 0:
        FAILED.append(f"{case} (cores {cores}): " + (r.stderr.strip().splitlines() or
                                                     ["failed"])[-1])
        print(f"run.py: {case} (cores {cores}) failed:\n{r.stderr[-3000:]}", flush=True)
        return []
    return json.loads(r.stdout.strip().splitlines()[-1])


def peak(peer, n) -> float | str:
    try:
        r = subprocess.run([sys.executable, str(MEASURE), "--memory", peer, str(n)],
                           capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        return "timed out (1800 s)"
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["failed"])[-1]
        if "step budget" in last:
            return "stopped: default step budget (10^8 steps)"
        return "not installed" if any(f"No module named '{lib}" in last for lib in
                                      ("numba", "jax", "torch")) else last[:60]
    return json.loads(r.stdout.strip().splitlines()[-1])["peak_mb"]


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for pkg in ("numpy", "numba", "jax", "torch"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            **versions}


def fmt_time(s: float) -> str:
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale or unit == "us":
            return f"{s / scale:.3g} {unit}"
    return str(s)


def cores_used(row: dict, table: dict) -> str:
    """The cores a peer used in this table's run."""
    if table["cores"] == 1:
        return "1"
    name = row["peer"]
    if "serial" in name or ("by hand" in name and "prange" not in name):
        return "1"
    if "threads" in row:
        return str(row["threads"])
    return f"default ({table['cores_available']})"


def markdown_table(tables: list) -> list[str]:
    """One comparison: its one-core run and (where rvm uses more cores by default) its
    default run side by side, a row per peer."""
    one = next(t for t in tables if t["cores"] == 1)
    dflt = next((t for t in tables if t["cores"] != 1), None)
    head = "| peer | mode | one core: min (median) | rvm ÷ peer |"
    if dflt:
        head += f" default ({dflt['cores_available']} cores): cores used | min (median) | " \
                "rvm ÷ peer |"
    head += " agrees with rvm |"
    out = [head, "|---" * head.count(" | ") + "|---|"]
    names = [r["peer"] for r in one["rows"]] + \
        [r["peer"] for r in (dflt["rows"] if dflt else []) if r["peer"] not in
         {q["peer"] for q in one["rows"]}]
    for name in names:
        cells, agrees = [name, ""], []
        for t in ([one, dflt] if dflt else [one]):
            r = next((q for q in t["rows"] if q["peer"] == name), None)
            ref = t["rows"][0]
            if t is dflt:
                cells.append(cores_used(r, t) if r else "")
            if r is None:
                cells += ["", ""]
                continue
            cells[1] = r["mode"]
            if "skip" in r:
                cells += [r["skip"], ""]
                continue
            cells += [f"{fmt_time(r['min_s'])} ({fmt_time(r['median_s'])})",
                      "1" if r is ref else f"{ref['min_s'] / r['min_s']:.2f}"]
            agrees.append("reference" if r is ref else "yes" if r["agrees"] else
                          f"**no** (max diff {r['max_abs_diff']:.2g})")
        cells.append(agrees[0] if agrees and all(a == agrees[0] for a in agrees) else
                     ", ".join(agrees))
        out.append("| " + " | ".join(cells) + " |")
    return out


def summary(tables: list) -> list[str]:
    """One line per comparison, one core each: rvm against its fastest peer."""
    out = ["| comparison (one core each) | rvm | fastest peer | its time | rvm ÷ fastest |",
           "|---|---|---|---|---|"]
    for t in tables:
        if t["cores"] != 1:
            continue
        ref = t["rows"][0]
        peers = [r for r in t["rows"] if "skip" not in r and r["agrees"] and
                 not r["peer"].startswith("rvm")]         # (one that disagrees: not a peer)
        if not peers:
            continue
        best = min(peers, key=lambda r: r["min_s"])
        out.append(f"| {t['title']} | {fmt_time(ref['min_s'])} | {best['peer']} | "
                   f"{fmt_time(best['min_s'])} | {ref['min_s'] / best['min_s']:.2f} |")
    return out


def merge_note(merged: dict | None) -> str:
    """Which comparisons came from which --merge run (the latest first, then the earlier
    merges its input came from), and that the others are from a full run."""
    chain = []
    while merged:
        chain.append(merged["cases"])
        merged = merged.get("earlier")
    if not chain:
        return ""
    seen, parts = set(), []
    for i, cases in enumerate(chain):
        new = [c for c in cases if c not in seen]
        seen |= set(cases)
        if new and i == 0:
            parts.append(f"The {', '.join(new)} comparisons are from that command with "
                         f"`--cases {' '.join(cases)} --merge`")
        elif new:
            parts.append(f"the {', '.join(new)} ones from an earlier "
                         f"`--cases {' '.join(cases)} --merge`")
    parts.append("the others from a full run just before it" if len(chain) == 1 else
                 "the others from a full run before those")
    return " " + ", ".join(parts) + "."


def render(result: dict) -> str:
    m = result["machine"]
    cmd = "python tools/bench/run.py" + (" --quick" if result["size"] == "quick" else "")
    out = [f"Measured with `{cmd}` on {m['cpu']} ({m['cores']} cores; Python {m['python']}, "
           f"numpy {m['numpy']}, numba {m['numba']}, JAX {m['jax']}, PyTorch {m['torch']}), "
           f"{result['rounds']} rounds, alternating tools; {result['seconds']:.0f} s in all."
           + merge_note(result.get("merged")),
           "**rvm ÷ peer** is rvm's time over the peer's (minimum over the rounds): below 1, "
           "rvm is faster.", "", "### Summary", ""] + summary(result["tables"]) + [""]
    titles = list(dict.fromkeys(t["title"] for t in result["tables"]))
    for title in titles:
        out += [f"### {title}", ""] + markdown_table(
            [t for t in result["tables"] if t["title"] == title]) + [""]
    if result.get("memory"):
        ns = sorted({n for row in result["memory"].values() for n in row})
        out += ["### Leapfrog: peak memory of one call (MB above the process's peak before "
                "it)", "",
                "| peer | " + " | ".join(f"N = {n:,}" for n in ns) + " |",
                "|---" * (len(ns) + 1) + "|"]
        for peer, row in result["memory"].items():
            out.append(f"| {peer} | " + " | ".join(
                f"{row[n]:.1f}" if isinstance(row.get(n), float) else str(row.get(n, ""))
                for n in ns) + " |")
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny inputs, one round")
    ap.add_argument("--compile", action="store_true",
                    help="with --quick: also torch.compile (about 15 s more)")
    ap.add_argument("--rounds", type=int, help="rounds per comparison (default 5; quick 2)")
    ap.add_argument("--budget", type=float, help="seconds per timed batch")
    ap.add_argument("--cases", nargs="*", choices=CASES, default=CASES)
    ap.add_argument("--out", default="bench-results", help="directory for results.md/json")
    ap.add_argument("--doc", action="store_true", help="also write docs/performance.md")
    ap.add_argument("--render", metavar="JSON", help="no runs: the tables of a results.json")
    ap.add_argument("--merge", metavar="JSON", help="keep this earlier results.json's tables "
                    "of the comparisons not run now (--cases)")
    ap.add_argument("--jobs", type=int, default=1, help="comparison processes run at once "
                    "(default 1: more disturb each other's timings; tests/test_bench.py "
                    "runs --quick with 2)")
    args = ap.parse_args()
    if args.render:
        result = json.loads(pathlib.Path(args.render).read_text())
        result["memory"] = {p: {int(n): v for n, v in row.items()}
                            for p, row in result.get("memory", {}).items()}
        return publish(result, args)
    size = "quick" if args.quick else "full"
    numba_cache = None          # the serial numba peers compiled once a run (peers.py)
    if "NUMBA_CACHE_DIR" not in os.environ:
        numba_cache = tempfile.TemporaryDirectory(prefix="rvm_bench_numba_")
        os.environ["NUMBA_CACHE_DIR"] = numba_cache.name
    if args.compile:
        os.environ["RVM_BENCH_COMPILE"] = "1"     # (read where the peers are made)
    rounds = args.rounds or (2 if args.quick else 5)
    budget = args.budget or (0.003 if args.quick else 0.3)   # quick: compiling is most of it
    t0 = time.perf_counter()
    tables = []
    runs = [(case, cores) for case in args.cases
            for cores in ([1, 0] if case in MULTICORE else [1])]
    if args.quick:          # tiny inputs: one process per core setting, to start faster
        runs = [(",".join(c for c in args.cases if k == 1 or c in MULTICORE), k)
                for k in (1, 0)]
    runs = [(case, cores) for case, cores in runs if case]

    def one(run):
        return measure(run[0], size, run[1], rounds, budget)
    got_all = map(one, runs)        # one at a time, each printed as it ends
    if args.jobs > 1:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(args.jobs) as pool:
            got_all = list(pool.map(one, runs))
    for (_, cores), got in zip(runs, got_all):
        for t in got:
            print(f"{t['title']} ({'1 core' if cores == 1 else 'default'}): " + ", ".join(
                f"{r['peer']} {r.get('skip') or fmt_time(r['min_s'])}"
                for r in t["rows"]), flush=True)
        tables += got
    mem = {}
    if args.merge:
        old = json.loads(pathlib.Path(args.merge).read_text())
        tables = [t for t in old["tables"] if t["case"] not in args.cases] + tables
        tables.sort(key=lambda t: CASES.index(t["case"]))
        if "leapfrog" not in args.cases:
            mem = {p: {int(n): v for n, v in row.items()} for p, row in old["memory"].items()}
    if not args.quick and "leapfrog" in args.cases:
        for peer in MEMORY_PEERS:
            mem[peer] = {n: peak(peer, n) for n in (10**5, 10**6, 10**7)}
            print(peer, mem[peer], flush=True)
    result = {"size": size, "rounds": rounds, "budget_s": budget, "machine": machine(),
              "seconds": time.perf_counter() - t0, "tables": tables, "memory": mem}
    if args.merge:
        result["merged"] = {"cases": args.cases, "from": args.merge,
                            "earlier": old.get("merged")}
    if numba_cache:
        numba_cache.cleanup()
    publish(result, args)


def publish(result: dict, args) -> None:
    tables = result["tables"]
    text = render(result)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(text + "\n")
    print(text)
    bad = [(t["title"], r["peer"]) for t in tables for r in t["rows"]
           if "skip" not in r and not r["agrees"]]
    if bad or FAILED:       # the page only from a run where every peer ran and agreed
        raise SystemExit(f"run.py: peers disagree with rvm: {bad}; failed: {FAILED}" +
                         (f"; {DOC.name} not written" if args.doc else ""))
    if args.doc:
        doc = DOC.read_text()
        if START in doc and END in doc:
            doc = doc[:doc.index(START) + len(START)] + "\n\n" + text + "\n" + \
                doc[doc.index(END):]
            DOC.write_text(doc)


if __name__ == "__main__":
    main()
