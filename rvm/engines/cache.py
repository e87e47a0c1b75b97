"""The on-disk cache of native code.

A program's machine code from rvm's LLVM back end is kept as object files (one for each
group of entries compiled together: rvm.engines.native.Functions) named by a hash of its
generated code (so of the program's bytecode and the code generator's text), the
tolerance and the LLVM, Python and CPU it was made for. A program compiles once per
machine instead of once per process.

Where: `$RVM_CACHE_DIR`, else `$XDG_CACHE_HOME/rvm`, else `~/.cache/rvm`. Files are
written to a temporary name and renamed into place, so processes sharing the directory
never see half a file (two that race write the same bytes). It keeps the 500 most
recently compiled programs (`$RVM_CACHE_MAX`). `RVM_CACHE_DIR=` (empty) turns the cache
off; so does a directory that cannot be written: code is then compiled in memory, as
before. `rvm cache info` and `rvm cache clear` show and empty it.

Loading native code from the cache means running it, so what is read is checked first
(see `_read`, `_trusted`): the directory and the file are this user's and writable by
nobody else, the file is a regular file (not a link, a FIFO or a device) of at most
LIMIT bytes, and it names its own key (the full hash of what it was made for) and the
cache format's VERSION, with a digest of its contents (an object file: the header and
the machine code; a numba module: its text, compared whole). Anything else is not
loaded: a damaged or swapped entry is compiled again and replaced; a directory or file
that another user could have written is not used at all (code is compiled in memory)
and a CacheWarning says why, once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import re
import shutil
import stat
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

from ..core.errors import RvmError

VERSION = "4"          # bump when the generated code, how it is compiled, or the files'
#                        format changes (2: LLVM early tail duplication off, see
#                        llvm.safe_codegen; 3: entries name their key, checked on load;
#                        4: an object file per group of entries)
LIMIT = 256 << 20      # bytes: a larger cache file is never read (the largest programs'
#                        object files are a few megabytes)
KEEP = 500             # programs kept unless $RVM_CACHE_MAX says otherwise
STALE = 60.0           # seconds: an older temporary file is a failed write's (eviction
#                        removes it; a younger one may be another process's, being written)
_POSIX = hasattr(os, "getuid")      # (owners and modes are checked where there are some)


class CacheSettingError(RvmError):
    """$RVM_CACHE_DIR or $RVM_CACHE_MAX holds a value rvm cannot use."""


class CacheWarning(UserWarning):
    """The cache is not used, or not as set: a setting that cannot be used, or a directory
    or file that another user could have written (native code is then compiled in
    memory)."""


_warned: set[str] = set()


def _warn(kind: str, message: str) -> None:
    """A CacheWarning, once per process for each kind of problem."""
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, CacheWarning, stacklevel=3)


def text_digest(files) -> str:
    """A digest of these source files' text, for cache keys: code cached by one version of
    them is never loaded by another (an editable install changes without a version
    number). Where the text cannot be read (a frozen install), VERSION stands in."""
    try:
        return hashlib.sha256(b"".join(pathlib.Path(f).read_bytes() for f in files)) \
            .hexdigest()[:16]
    except OSError:
        return VERSION


def directory() -> pathlib.Path | None:
    """The cache directory (absolute), or None when the cache is turned off. Raises
    CacheSettingError for an $RVM_CACHE_DIR that names no directory (`~nouser/x`), or
    when there is no home directory to keep the cache in."""
    configured = os.environ.get("RVM_CACHE_DIR")
    if configured is not None:
        if not configured:
            return None
        path = os.path.expanduser(configured)
        if path.startswith("~") or "\0" in path:
            raise CacheSettingError(
                f"RVM_CACHE_DIR={configured!r} names no directory (no such user's home); "
                "set it to a directory, or to nothing to turn the native code cache off")
        return pathlib.Path(os.path.abspath(path))
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):         # (a relative one is to be ignored: XDG's rule)
        home = os.path.expanduser("~")
        if home.startswith("~"):
            raise CacheSettingError("there is no home directory to keep the native code "
                                    "cache in: set RVM_CACHE_DIR to a directory (or to "
                                    "nothing to turn the cache off)")
        base = os.path.join(home, ".cache")
    return pathlib.Path(base) / "rvm"


def keep() -> int:
    """How many programs the cache keeps: $RVM_CACHE_MAX, a whole number (0: none),
    else KEEP. Raises CacheSettingError for anything else ("abc", "1e3", "-5")."""
    configured = os.environ.get("RVM_CACHE_MAX", "").strip()
    if not configured:
        return KEEP
    if not re.fullmatch(r"[0-9]+", configured):
        raise CacheSettingError(f"RVM_CACHE_MAX={configured!r} is not a whole number of "
                                f"programs to keep (such as {KEEP}, the default)")
    return int(configured)


def _where() -> pathlib.Path | None:
    """directory(), or None (compile in memory) with a warning for a bad setting."""
    try:
        return directory()
    except CacheSettingError as e:
        _warn("setting", f"{e}: native code is compiled in memory, not cached")
        return None


def _keep() -> int:
    try:
        return keep()
    except CacheSettingError as e:
        _warn("keep", f"{e}: keeping {KEEP}")
        return KEEP


def _unsafe(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this status is not to be trusted (another user's,
    or writable by its group or by others), or None."""
    if not _POSIX:
        return None
    if st.st_uid != os.getuid():
        return f"{what} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{what} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def problem(where: pathlib.Path) -> str | None:
    """Why the cache directory is not used (see _trusted), or None."""
    try:
        st = os.stat(where)
    except OSError:
        return None                 # (not there yet: made, this user's, when written)
    if not stat.S_ISDIR(st.st_mode):
        return f"{where} is not a directory"
    return _unsafe(st, f"the cache directory {where}")


def _trusted(where: pathlib.Path) -> bool:
    """May code be loaded from, and written to, the cache directory? Not if another
    user owns it or may write to it (warned once); not if it is not a directory."""
    why = problem(where)
    if why is not None and "not a directory" not in why:
        _warn(f"dir {where}", f"{why}: native code is compiled in memory, not loaded "
              "from there nor written to it (use a directory that only you can write: "
              "chmod go-w it, or set RVM_CACHE_DIR)")
    return why is None


def _read(path: pathlib.Path) -> bytes | None:
    """The bytes of a cache file, or None if there is none or it is not to be trusted: it
    must be a regular file (not a symbolic link, a FIFO or a device: those are not even
    opened for long), this user's, not writable by others, of at most LIMIT bytes. An
    untrusted file warns once (a damaged one is the caller's to find)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | \
        getattr(os, "O_BINARY", 0)
    try:
        if not hasattr(os, "O_NOFOLLOW") and os.path.islink(path):
            raise OSError(f"{path} is a symbolic link")
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError:
        why = f"{path} is a symbolic link or cannot be opened"
    else:
        try:
            st = os.fstat(fd)
            why = None if stat.S_ISREG(st.st_mode) else f"{path} is not a regular file"
            why = why or _unsafe(st, str(path))
            if why is None and st.st_size > LIMIT:
                why = f"{path} is larger than {LIMIT / 2**20:g} MB"
            if why is None:
                data = bytearray()
                while len(data) <= LIMIT:
                    chunk = os.read(fd, min(1 << 20, LIMIT + 1 - len(data)))
                    if not chunk:
                        return bytes(data)
                    data += chunk
                why = f"{path} is larger than {LIMIT / 2**20:g} MB"
        except OSError:
            return None
        finally:
            os.close(fd)
    _warn(f"file {path.parent}", f"cache file {why}: not loaded (compiled again)")
    return None


def _write(where: pathlib.Path, name: str, data: bytes) -> None:
    """Put `data` in the cache directory under `name`, atomically (a temporary file
    renamed into place; removed should the write fail, a full disk)."""
    fd, tmp = tempfile.mkstemp(dir=where, prefix="rvm_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, where / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _ready(where: pathlib.Path) -> bool:
    """Make the cache directory (mode 0o700) if it is not there; is it to be used?"""
    if not where.is_dir():
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
    return _trusted(where)


# ---------------------------------------------------------------- LLVM's object files

def load_object(text: str, make: Callable[[], bytes]) -> bytes:
    """Machine code for `text` (everything it depends on, LLVM's version and the CPU
    included): read from the cache directory, or made by `make` and written there."""
    obj = cached_object(text)
    if obj is None:
        obj = make()
        store_object(text, obj)
    return obj


def _object_key(text: str) -> str:
    return hashlib.sha256(f"{VERSION}\n{text}".encode()).hexdigest()


def _object_name(text: str) -> str:
    return "rvm_llvm_" + _object_key(text)[:32] + ".o"


_MAGIC = b"rvm object "
# an object file's first bytes, by platform (ELF elsewhere): Mach-O (64- and 32-bit),
# COFF (x86-64, arm64, x86, and a big object file's)
_OBJECT_MAGIC = {"darwin": (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe"),
                 "win32": (b"\x64\x86", b"\x64\xaa", b"\x4c\x01", b"\x00\x00\xff\xff")}


def object_file(data: bytes) -> bool:
    """Does `data` begin as an object file of this platform (ELF, Mach-O, COFF)?"""
    return len(data) > 64 and data.startswith(_OBJECT_MAGIC.get(sys.platform, (b"\x7fELF",)))


def _header(text: str) -> bytes:
    """An object file's header in the cache: the format's VERSION and the full key."""
    return _MAGIC + f"{VERSION} {_object_key(text)}\n".encode()


def cached_object(text: str) -> bytes | None:
    """The cached machine code for `text`, or None. The file is checked (see _read), and
    holds a header naming VERSION and the full key of `text`, a digest of the header and
    the code, then an object file of this platform: a file that does not match
    (damaged, another program's, not written by rvm) is never loaded (machine code that
    is not what LLVM wrote for this program would crash the process, or compute
    something else)."""
    where = _where()
    if where is None or not where.is_dir() or not _trusted(where):
        return None
    data = _read(where / _object_name(text))
    if data is None:
        return None
    head = _header(text)
    digest, obj = data[len(head):len(head) + 32], data[len(head) + 32:]
    if data.startswith(head) and digest == hashlib.sha256(head + obj).digest() and \
            object_file(obj):
        return obj
    return None


def store_object(text: str, obj: bytes) -> None:
    """Keep the machine code for `text` in the cache directory (if there is one, and it
    is to be trusted; and if it is an object file)."""
    where = _where()
    if where is not None and object_file(obj) and len(obj) < LIMIT - 4096:
        with contextlib.suppress(OSError):
            if _ready(where):
                head = _header(text)
                _write(where, _object_name(text), head + hashlib.sha256(head + obj).digest()
                       + obj)
                _evict(where)


# ---------------------------------------------------------------- eviction, info, clear

def _evict(where: pathlib.Path) -> None:
    """Keep at most $RVM_CACHE_MAX programs (default 500): the least recently written go.
    Temporary files of failed writes (older than STALE seconds) go too."""
    def written(p: pathlib.Path) -> float:
        try:
            return p.lstat().st_mtime
        except OSError:                 # (removed by another process meanwhile)
            return 0.0
    limit = _keep()
    programs = sorted(_programs(where), key=written)
    for old in programs[:max(0, len(programs) - limit)]:
        for p in [old, *(where / "__pycache__").glob(f"{old.stem}.*")]:
            with contextlib.suppress(OSError):
                p.unlink()
    now = time.time()
    for tmp in where.glob("*.tmp"):
        if now - written(tmp) > STALE:
            with contextlib.suppress(OSError):
                tmp.unlink()


def info() -> tuple[pathlib.Path | None, int, int]:
    """(directory, number of cached object files, bytes on disk). Raises
    CacheSettingError for a setting that cannot be used."""
    where = directory()
    if where is None or not where.is_dir():
        return where, 0, 0
    size = 0
    for p in where.rglob("*"):
        with contextlib.suppress(OSError):
            st = p.lstat()
            size += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return where, len(_programs(where)), size


def _programs(where: pathlib.Path) -> list[pathlib.Path]:
    """The cached object files (and modules of older rvm versions, numba's)."""
    return [*where.glob("rvm_native_*.py"), *where.glob("rvm_llvm_*.o")]


def clear() -> int:
    """Remove every cached object file (and module and __pycache__ of older rvm's numba
    path) and every temporary file; the number of programs removed. Raises
    CacheSettingError for an $RVM_CACHE_DIR that cannot be used."""
    where, programs, _ = info()
    if where is not None and where.is_dir():
        for p in where.iterdir():
            if p.name.startswith(("rvm_native_", "rvm_llvm_")) or p.name == "__pycache__" \
                    or p.name.endswith(".tmp"):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
    return programs
