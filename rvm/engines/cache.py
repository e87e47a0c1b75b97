"""The on-disk cache of native code.

A program's machine code from rvm's LLVM back end is kept as an object file named by a
hash of its generated code (so of the program's bytecode), the tolerance and the LLVM,
Python and CPU it was made for, with a digest of its contents (a damaged file is made
again, never loaded). On numba's path (RVM_LLVM=0) a program's native functions are
written as a Python module named by a hash of its text and of the versions of rvm, numba
and Python; numba compiles each function on its first call and, the module being a real
file, keeps the machine code beside it (`njit(cache=True)`). Either way a program
compiles once per machine instead of once per process.

Where: `$RVM_CACHE_DIR`, else `$XDG_CACHE_HOME/rvm`, else `~/.cache/rvm`. Files are
written to a temporary name and renamed into place, so processes sharing the directory
never see half a file (two that race write the same bytes). It keeps the 500 most
recently compiled programs (`$RVM_CACHE_MAX`). `RVM_CACHE_DIR=` (empty) turns the cache
off; so does a directory that cannot be written: code is then compiled in memory, as
before. `rvm cache info` and `rvm cache clear` show and empty it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable

VERSION = "2"          # bump when the generated code, or how it is compiled, changes
#                        (2: LLVM early tail duplication off, see llvm.safe_codegen)


def text_digest(files) -> str:
    """A digest of these source files' text, for cache keys: code cached by one version of
    them is never loaded by another (an editable install changes without a version
    number). Where the text cannot be read (a frozen install), VERSION stands in."""
    import hashlib
    try:
        return hashlib.sha256(b"".join(pathlib.Path(f).read_bytes() for f in files)) \
            .hexdigest()[:16]
    except OSError:
        return VERSION


def directory() -> pathlib.Path | None:
    """The cache directory, or None when the cache is turned off."""
    configured = os.environ.get("RVM_CACHE_DIR")
    if configured is not None:
        return pathlib.Path(configured).expanduser() if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "rvm"


def _key(text: str) -> str:
    import hashlib

    import numba
    stamp = f"{VERSION}|{numba.__version__}|{sys.version}|{sys.platform}\n"
    return hashlib.sha256((stamp + text).encode()).hexdigest()[:32]


def load(source: Callable[[bool], str]):
    """The module for `source(cached)` (its text, told whether it lives in a file): from
    the cache directory, written there first if new; in memory if there is no cache."""
    where = directory()
    if where is not None:
        try:
            return _from_file(where, source)
        except OSError:          # not writable: compile in memory instead
            pass
    module = type(sys)("rvm_native")
    exec(compile(source(False), "<rvm native>", "exec"), module.__dict__)
    return module


def _from_file(where: pathlib.Path, source: Callable[[bool], str]):
    text = source(True)
    name = f"rvm_native_{_key(text)}"
    path = where / f"{name}.py"
    if not path.exists():
        where.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        _evict(where)
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module


def load_object(text: str, make: Callable[[], bytes]) -> bytes:
    """Machine code for `text` (everything it depends on, LLVM's version and the CPU
    included): read from the cache directory, or made by `make` and written there."""
    obj = cached_object(text)
    if obj is None:
        obj = make()
        store_object(text, obj)
    return obj


def _object_name(text: str) -> str:
    import hashlib
    return "rvm_llvm_" + hashlib.sha256(f"{VERSION}\n{text}".encode()).hexdigest()[:32] + ".o"


def cached_object(text: str) -> bytes | None:
    """The cached machine code for `text`, or None. The file holds a digest of its
    contents: one that does not match (damaged, or not written by rvm) is never loaded
    (machine code that is not what LLVM wrote would crash the process)."""
    import hashlib
    where = directory()
    if where is not None:
        with contextlib.suppress(OSError):
            data = (where / _object_name(text)).read_bytes()
            head, obj = data[:len(_MAGIC) + 32], data[len(_MAGIC) + 32:]
            if head == _MAGIC + hashlib.sha256(obj).digest():
                return obj
    return None


def store_object(text: str, obj: bytes) -> None:
    """Keep the machine code for `text` in the cache directory (if there is one)."""
    import hashlib
    where = directory()
    if where is not None:
        with contextlib.suppress(OSError):
            where.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=where, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(obj).digest() + obj)
            os.replace(tmp, where / _object_name(text))
            _evict(where)


_MAGIC = b"rvm object\n"


def _evict(where: pathlib.Path) -> None:
    """Keep at most $RVM_CACHE_MAX programs (default 500): the least recently written go."""
    limit = int(os.environ.get("RVM_CACHE_MAX", "500"))
    programs = sorted(_programs(where), key=lambda p: p.stat().st_mtime)
    for old in programs[:max(0, len(programs) - limit)]:
        for p in [old, *(where / "__pycache__").glob(f"{old.stem}.*")]:
            with contextlib.suppress(OSError):
                p.unlink()


def info() -> tuple[pathlib.Path | None, int, int]:
    """(directory, number of cached modules (LLVM object files and numba modules), bytes
    on disk)."""
    where = directory()
    if where is None or not where.is_dir():
        return where, 0, 0
    files = [p for p in where.rglob("*") if p.is_file()]
    programs = len(_programs(where))
    return where, programs, sum(p.stat().st_size for p in files)


def _programs(where: pathlib.Path) -> list[pathlib.Path]:
    """The cached programs: numba modules and LLVM object files."""
    return [*where.glob("rvm_native_*.py"), *where.glob("rvm_llvm_*.o")]


def clear() -> int:
    """Remove every cached module; the number removed."""
    where, programs, _ = info()
    if where is not None and where.is_dir():
        for p in where.iterdir():
            if p.name.startswith(("rvm_native_", "rvm_llvm_")) or p.name == "__pycache__":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    return programs
