"""Run rvm on a local corpus of Janus programs and compare with reference interpreters.

    python tools/janus_corpus.py DIR [DIR ...] [--reference NAME=COMMAND ...]
                                 [--engine native] [--timeout 20] [--list]

Every `.ja` and `.janus` file under the directories is run with `rvm run FILE`. A file
whose path has a directory named like `errors` or `fixtures_errors` is an error program:
rvm must refuse it with exit status 1, a `file:line` location and no traceback. Any other
file is a valid program: each reference (`--reference jana=/path/to/jana`, `--reference
"pyjanus=python3 -m jana_py.cli"`; the command gets the file as its last argument) runs
it too, and so does an expected-output file beside it (`FILE.out`, `FILE.output`,
`FILE.expected`). rvm's output is compared with each reference that runs the program
(exit 0), blank lines and trailing spaces ignored; it counts as `same` when it equals
one of them, `layout` when only spacing and line order differ.

The script fetches nothing: bring the corpora onto the machine first. It prints one line
per file with --list, then the counts.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from collections import Counter

SUFFIXES = (".ja", ".janus")


def programs(dirs: list[str]) -> list[str]:
    out = []
    for d in dirs:
        if os.path.isfile(d):
            out.append(d)
            continue
        for root, _, files in os.walk(d):
            out += [os.path.join(root, f) for f in files if f.endswith(SUFFIXES)]
    return sorted(out)


def is_error_program(path: str) -> bool:
    return any("error" in part for part in os.path.dirname(path).split(os.sep))


def run(cmd: list[str], timeout: float) -> tuple[int | None, str, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           errors="replace", stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, "", "timeout"
    return p.returncode, p.stdout, p.stderr


def normal(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def layout(text: str) -> list[str]:
    return sorted("".join(line.split()) for line in normal(text))


def expected_files(path: str) -> dict[str, str]:
    out = {}
    for ext in (".out", ".output", ".expected"):
        for candidate in (path + ext, os.path.splitext(path)[0] + ext):
            if os.path.isfile(candidate):
                with open(candidate, encoding="utf-8", errors="replace") as f:
                    out["file"] = f.read()
    return out


def classify_valid(path: str, refs: dict[str, list[str]], rvm: list[str],
                   timeout: float) -> tuple[str, str]:
    outputs = expected_files(path)
    for name, cmd in refs.items():
        rc, out, _ = run(cmd + [path], timeout)
        if rc == 0:
            outputs[name] = out
    rc, out, err = run(rvm + [path], timeout)
    if rc is None:
        verdict = "rvm timeout"
    elif "Traceback" in err:
        verdict = "rvm traceback"
    elif rc != 0:
        verdict = "rvm refuses"
    elif not outputs:
        return "no reference runs it", "rvm runs it" if rc == 0 else ""
    elif any(normal(out) == normal(o) for o in outputs.values()):
        return "same output", ", ".join(n for n, o in outputs.items()
                                        if normal(out) == normal(o))
    elif any(layout(out) == layout(o) for o in outputs.values()):
        return "same store, another layout", ""
    else:
        return "DIFFERENT output", ", ".join(outputs)
    first = next((x for x in err.splitlines() if x.startswith("rvm")),
                 (err.strip().splitlines() or [""])[-1])[:200]
    if not outputs:
        return "no reference runs it", verdict + ": " + first
    return verdict, first


def classify_error(path: str, rvm: list[str], timeout: float) -> tuple[str, str]:
    rc, out, err = run(rvm + [path], timeout)
    text = (err.strip().splitlines() or [""])[0][:160]
    if rc is None:
        return "timeout", ""
    if "Traceback" in err:
        return "traceback", (err.strip().splitlines() or [""])[-1][:160]
    if rc == 0:
        return "accepted", out.strip().replace("\n", "; ")[:160]
    if rc != 1:
        return f"exit {rc}", text
    if os.path.basename(path) not in err or not any(f":{n}" in err for n in range(1, 10000)):
        return "refused, no location", text
    return "refused with a location", text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", help="directories (or files) of .ja/.janus programs")
    p.add_argument("--reference", action="append", default=[], metavar="NAME=COMMAND",
                   help="a reference interpreter; the file is appended to COMMAND")
    p.add_argument("--engine", help="rvm's engine (default: rvm's)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per run")
    p.add_argument("--list", action="store_true", help="one line per program")
    args = p.parse_args(argv)
    refs = {}
    for spec in args.reference:
        name, _, cmd = spec.partition("=")
        refs[name] = shlex.split(cmd)
    rvm = [sys.executable, "-c", "import sys; from rvm.cli import main; sys.exit(main())",
           "run"] + (["--engine", args.engine] if args.engine else [])
    counts: dict[str, Counter] = {"valid": Counter(), "error": Counter()}
    for path in programs(args.dirs):
        kind = "error" if is_error_program(path) else "valid"
        verdict, detail = (classify_error(path, rvm, args.timeout) if kind == "error"
                           else classify_valid(path, refs, rvm, args.timeout))
        counts[kind][verdict] += 1
        if args.list:
            print(f"{kind:5}  {verdict:28} {path}" + (f"  [{detail}]" if detail else ""),
                  flush=True)
    for kind, c in counts.items():
        print(f"{kind} programs: {sum(c.values())}")
        for verdict, n in c.most_common():
            print(f"  {n:4}  {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
