"""The README's quickstart commands are the ones CI runs."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = "pip install '.[test]' && python -m pytest -q"
    assert f"\n{command}\n" in readme and f"\n{command}\n" in ci
