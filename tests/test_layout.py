"""The package's architecture stays true: folders follow the data path, a folder imports only
from the folders below it, no module imports another's private names, no import cycles."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "rvm"
# lowest first: source -> Program -> transforms -> engine -> values / gradients / views
LAYERS = ["core", "formats", "engines", "lang", "ad", "debugger", "drawing", "interop", "",
          "lib"]


def module_name(path: pathlib.Path) -> str:
    parts = ("rvm",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def layer(module: str) -> int:
    folder = module.split(".")[1] if module.count(".") >= 2 or \
        module.split(".")[-1] in LAYERS else ""
    return LAYERS.index(folder if folder in LAYERS else "")


def imports(module: str) -> list[tuple[str, list[str]]]:
    """(imported rvm module, names taken from it) for every import statement, at any depth."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] == "rvm"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rvm":
                continue
            names = [a.name for a in node.names]
            for n in names:       # `from . import isa` imports a module
                if f"{target}.{n}" in MODULES:
                    out.append((f"{target}.{n}", []))
            rest = [n for n in names if f"{target}.{n}" not in MODULES]
            if rest or not names:
                out.append((target, rest))
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_is_in_a_known_folder():
    for m in MODULES:
        parts = m.split(".")
        assert len(parts) <= 2 or parts[1] in LAYERS, f"{m} is in no layer folder"


def test_no_import_points_upwards():
    bad = [(m, t) for m, edges in GRAPH.items() for t, _ in edges
           if t in MODULES and layer(t) > layer(m)]
    assert not bad, f"imports pointing up the layering: {bad}"


def test_core_imports_nothing_else_of_rvm():
    for m, edges in GRAPH.items():
        if m.startswith("rvm.core"):
            assert all(t.startswith("rvm.core") for t, _ in edges), (m, edges)


def test_no_private_names_across_modules():
    bad = [(m, t, n) for m, edges in GRAPH.items() for t, names in edges for n in names
           if n.startswith("_") and t != m]
    assert not bad, f"private names imported from another module: {bad}"


def test_no_import_cycles():
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t, _ in GRAPH[m]:
            if t not in MODULES or t == m:
                continue
            assert state.get(t) != 1, f"import cycle: {' -> '.join(path + [m, t])}"
            if t not in state:
                visit(t, path + [m])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [])


def test_the_checks_see_imports():
    """The parser finds real edges (so the tests above cannot pass vacuously)."""
    assert ("rvm.core.isa", []) in GRAPH["rvm.engines.compiled"]
    assert layer("rvm.core.isa") < layer("rvm.engines.machine") < layer("rvm.api")
    assert any(t == "rvm.engines.machine" for t, _ in GRAPH["rvm.lang"])


def test_the_repository_root_holds_only_the_project_files():
    """Nothing stray is committed at the top level (outputs of a run, say): the root
    holds the README, the project file and the folders of the layout."""
    import shutil
    import subprocess
    top = ROOT.parent
    if shutil.which("git") is None or not (top / ".git").exists():
        import pytest
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files"], cwd=top, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    roots = {path.split("/")[0] for path in tracked}
    assert roots <= {".ci", ".gitignore", "README.md", "pyproject.toml", "LICENSE", "asm",
                     "editors",
                     "docs", "examples", "rvm", "tests", "tools"}, sorted(roots)
