"""Every code block in README.md and docs/*.md runs, and shows what it says.

Python blocks run in order, one namespace per file, from the repository root. A statement
`expression  # value` must evaluate to that value (floats within 1e-12, relative). Shell
blocks: each `$ rvm ...` line is run and its output compared with the lines under it."""

import ast
import io
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tokenize

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
VALUES = {"array": np.array, "nan": math.nan, "inf": math.inf}


def blocks(path: pathlib.Path, lang: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(path.read_text()) if m.group(1) == lang]


def comments(source: str) -> dict[int, str]:
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string[1:].strip()
    return out


def expected(text: str):
    try:
        return True, eval(text, dict(VALUES))      # a value written in the docs
    except Exception:
        return False, None


def same(a, b) -> bool:
    if isinstance(b, (tuple, list)) and not isinstance(a, np.ndarray):
        return isinstance(a, (tuple, list)) and len(a) == len(b) and \
            all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                           rtol=1e-12, atol=1e-300)
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12,
                                                                 abs_tol=1e-300)
    return a == b


PY_CASES = [pytest.param(p, id=p.name) for p in FILES if blocks(p, "python")]


@pytest.mark.parametrize("path", PY_CASES)
def test_python_blocks_run_and_show_their_values(path, monkeypatch):
    monkeypatch.chdir(ROOT)
    namespace: dict = {"__name__": "__docs__"}
    for k, block in enumerate(blocks(path, "python")):
        file = ROOT / f".docs_{path.stem}_{k}.py"      # @rvm.reversible reads the source
        file.write_text(block)
        try:
            tree = ast.parse(block)
            notes = comments(block)
            checked = 0
            for stmt in tree.body:
                note = notes.get(stmt.end_lineno, "")
                has, value = expected(note) if isinstance(stmt, ast.Expr) else (False, None)
                code = compile(ast.Module([stmt], []), str(file), "exec")
                if has:
                    got = eval(compile(ast.Expression(stmt.value), str(file), "eval"),
                               namespace)
                    assert same(got, value), f"{path.name} block {k}, line " \
                        f"{stmt.lineno}: {ast.unparse(stmt)} gives {got!r}, docs say {note}"
                    checked += 1
                else:
                    exec(code, namespace)
        finally:
            file.unlink()


SHELL_CASES = [pytest.param(p, id=p.name) for p in FILES
               if any("$ rvm " in b for b in blocks(p, ""))]


@pytest.mark.parametrize("path", SHELL_CASES)
def test_shell_blocks_print_what_they_show(path):
    env = dict(os.environ, COLUMNS="100")
    for block in blocks(path, ""):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ rvm "):
                continue
            want = []
            for nxt in lines[i + 1:]:
                if nxt.startswith("$ "):
                    break
                want.append(nxt)
            argv = shlex.split(line[2:])
            r = subprocess.run([sys.executable, "-m", "rvm.cli", *argv[1:]], cwd=ROOT,
                               capture_output=True, text=True, env=env, timeout=300)
            assert r.stdout.splitlines() == want, f"{path.name}: {line}\n{r.stderr}"
