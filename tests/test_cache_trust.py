"""The on-disk native-code cache as a trust boundary: loading native code means running
it, so nothing is loaded that this user did not write for this very program
(ownership and permissions, keys, special files, settings, stray
temporary files)."""

import os
import pathlib
import subprocess
import sys
import threading
import time
import warnings

import pytest

import rvm
from rvm.engines import cache, llvm, native
from rvm.engines.compiled import compiled

ROOT = pathlib.Path(__file__).resolve().parent.parent
ELF = cache._OBJECT_MAGIC.get(sys.platform, (b"\x7fELF",))[0] + bytes(100)   # (looks
# like an object file: enough for the cache, never loaded by these tests)
needs_llvm = pytest.mark.skipif(not (native.available and llvm.usable()),
                                reason="llvmlite is not installed")
posix = pytest.mark.skipif(not hasattr(os, "getuid"), reason="owners and modes are POSIX's")


@pytest.fixture(autouse=True)
def private_cache(monkeypatch, tmp_path):
    """Each test its own cache directory (mode 0o700, as tmp_path is) and fresh warnings."""
    where = tmp_path / "cache"
    where.mkdir(mode=0o700)
    monkeypatch.setenv("RVM_CACHE_DIR", str(where))
    monkeypatch.delenv("RVM_CACHE_MAX", raising=False)
    monkeypatch.setattr(cache, "_warned", set())
    return where


def _entry(where, text="program A", obj=ELF):
    cache.store_object(text, obj)
    return where / cache._object_name(text)


@posix
def test_a_cache_directory_others_can_write_is_not_used(private_cache, capsys):
    """A directory writable by its group or others (mode 0o777): nothing is loaded from
    it nor written to it, and a CacheWarning says so once."""
    path = _entry(private_cache)
    assert cache.cached_object("program A") == ELF
    private_cache.chmod(0o777)
    with pytest.warns(cache.CacheWarning, match="writable by other users"):
        assert cache.cached_object("program A") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # (once)
        cache.store_object("program B", ELF)
        assert cache.cached_object("program A") is None
    assert not (private_cache / cache._object_name("program B")).exists()
    assert cache.load_object("program C", lambda: ELF) == ELF       # made in memory
    assert not (private_cache / cache._object_name("program C")).exists()
    from rvm.cli import main
    assert main(["cache", "info"]) == 0
    assert "not used: the cache directory" in capsys.readouterr().out
    private_cache.chmod(0o700)
    assert cache.cached_object("program A") == ELF and path.exists()


@posix
def test_a_cache_file_others_can_write_is_not_loaded_but_replaced(private_cache):
    path = _entry(private_cache)
    path.chmod(0o666)
    with pytest.warns(cache.CacheWarning, match="writable by other users"):
        assert cache.cached_object("program A") is None
    cache.store_object("program A", ELF)        # (compiled again: replaced, this user's)
    assert path.stat().st_mode & 0o777 == 0o600 and cache.cached_object("program A") == ELF


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="chown needs root")
def test_cache_entries_and_directories_of_another_user_are_not_used(private_cache, tmp_path):
    path = _entry(private_cache)
    os.chown(path, 12345, 12345)
    with pytest.warns(cache.CacheWarning, match="another user"):
        assert cache.cached_object("program A") is None
    path.unlink()
    path = _entry(private_cache)
    os.chown(private_cache, 12345, 12345)
    with pytest.warns(cache.CacheWarning, match="another user"):
        assert cache.cached_object("program A") is None


@posix
def test_the_cache_directory_is_made_private(monkeypatch, tmp_path):
    where = tmp_path / "new" / "rvm"
    monkeypatch.setenv("RVM_CACHE_DIR", str(where))
    old = os.umask(0o022)
    try:
        cache.store_object("program A", ELF)
    finally:
        os.umask(old)
    assert where.stat().st_mode & 0o777 == 0o700
    assert cache.cached_object("program A") == ELF


# ------------------------------------------------------------------ keys and special files

def test_an_entry_names_its_own_key(private_cache):
    """Another program's object file copied over an entry (valid, digest and all) is not
    loaded: the header names the full key of the program it was made for."""
    a = _entry(private_cache, "program A", ELF + b"A")
    b = _entry(private_cache, "program B", ELF + b"B")
    b.write_bytes(a.read_bytes())
    assert cache.cached_object("program A") == ELF + b"A"
    assert cache.cached_object("program B") is None
    data = bytearray(a.read_bytes())
    data[len(cache._MAGIC)] ^= 1                        # another format's version
    a.write_bytes(bytes(data))
    assert cache.cached_object("program A") is None


@needs_llvm
def test_a_swapped_entry_runs_its_own_program(private_cache):
    """Copying add's object file over sub's entry once made sub print add's result."""
    add = ".func main(f0, f1)\n    ADD f0, f1\n.end\n"
    sub = add.replace("ADD", "SUB")
    assert rvm.assemble(add).call("main", 1.0, 2.0, engine="native") == (3.0, 2.0)
    [a] = private_cache.glob("rvm_llvm_*.o")
    p = rvm.assemble(sub)
    assert p.call("main", 1.0, 2.0, engine="native") == (-1.0, 2.0)
    [b] = set(private_cache.glob("rvm_llvm_*.o")) - {a}
    b.write_bytes(a.read_bytes())
    p = rvm.assemble(sub)
    assert p.call("main", 1.0, 2.0, engine="native") == (-1.0, 2.0)
    funcs = compiled(p, True, native=True)._native
    assert all(isinstance(f["F0_fw"], llvm.Run) for f in funcs.values())     # natively


def _in_time(call, seconds=10.0):
    out = []
    t = threading.Thread(target=lambda: out.append(call()), daemon=True)
    t.start()
    t.join(seconds)
    assert out, "did not return"
    return out[0]


@posix
@pytest.mark.parametrize("special", ["fifo", "symlink to /dev/zero", "symlink to an entry",
                                     "directory", "too large"])
def test_only_regular_files_of_bounded_size_are_read(special, private_cache, monkeypatch):
    """A FIFO under an entry's name once hung rvm, a symbolic link to /dev/zero read
    until memory ran out: only regular files (links not followed) of at most LIMIT bytes
    are read; the entry is compiled again and replaced."""
    path = private_cache / cache._object_name("program A")
    good = _entry(private_cache, "program B")
    if special == "fifo":
        os.mkfifo(path)
    elif special == "directory":
        path.mkdir()
    elif special == "too large":
        _entry(private_cache, "program A")
        monkeypatch.setattr(cache, "LIMIT", 64)
    else:
        path.symlink_to("/dev/zero" if special.endswith("zero") else good)
    with pytest.warns(cache.CacheWarning, match="not a regular file|symbolic link|larger"):
        assert _in_time(lambda: cache.cached_object("program A")) is None
    if special != "directory":
        monkeypatch.setattr(cache, "LIMIT", 1 << 20)
        cache.store_object("program A", ELF)
        assert path.is_file() and not path.is_symlink()
        assert cache.cached_object("program A") == ELF


# ------------------------------------------------------------------ numba's modules

@pytest.mark.parametrize("setting", [("RVM_CACHE_DIR", "~nouser_rvm_test/x"),
                                     ("RVM_CACHE_MAX", "abc"), ("RVM_CACHE_MAX", "1e3"),
                                     ("RVM_CACHE_MAX", "-5")])
def test_a_bad_setting_is_one_clear_message(setting, monkeypatch, capsys, private_cache):
    """`rvm cache info|clear` say what is wrong with the setting and exit 1 (no traceback);
    a run warns once and goes on (a bad directory: compiled in memory; a bad number: the
    default 500 kept), the native engine still on."""
    from rvm.cli import main
    name, value = setting
    monkeypatch.setenv(name, value)
    for action in ("info", "clear"):
        assert main(["cache", action]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"rvm: {name}={value!r}") and "Traceback" not in err
        assert err.count("\n") == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.store_object("program A", ELF)
        cache.store_object("program B", ELF)
        stored = cache.cached_object("program A")
    assert [str(w.message).split(":")[0] for w in caught] == \
        [f"{name}={value!r} " + ("names no directory (no such user's home); set it to a "
                                 "directory, or to nothing to turn the native code cache off"
                                 if name == "RVM_CACHE_DIR" else
                                 "is not a whole number of programs to keep (such as 500, "
                                 "the default)")]
    assert all(w.category is cache.CacheWarning for w in caught)
    assert stored == (None if name == "RVM_CACHE_DIR" else ELF)


@needs_llvm
def test_a_bad_cache_max_never_turns_the_native_engine_off(monkeypatch, private_cache):
    monkeypatch.setenv("RVM_CACHE_MAX", "abc")
    p = rvm.assemble(".func main(f0, f1)\n    ADD f0, f1\n.end\n")
    with pytest.warns(cache.CacheWarning):
        assert p.call("main", 1.0, 2.0, engine="native") == (3.0, 2.0)
    funcs = compiled(p, True, native=True)._native
    assert all(isinstance(f["F0_fw"], llvm.Run) for f in funcs.values())


def test_a_bad_cache_dir_compiles_in_memory(monkeypatch):
    monkeypatch.setenv("RVM_CACHE_DIR", "~nouser_rvm_test/x")
    with pytest.raises(cache.CacheSettingError):
        cache.directory()
    with pytest.warns(cache.CacheWarning):
        assert cache.load_object("program", lambda: b"made") == b"made"


def test_stray_temporary_files_are_removed(private_cache, monkeypatch):
    """A write that fails (a full disk) leaves no temporary file; those left by a process
    that died go at the next eviction once a minute old (a younger one may be another
    process's, being written), and all of them with `rvm cache clear`."""
    real = os.replace

    def full(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cache.os, "replace", full)
    cache.store_object("program A", ELF)
    assert list(private_cache.iterdir()) == []
    monkeypatch.setattr(cache.os, "replace", real)
    old, young = private_cache / "tmpold.tmp", private_cache / "rvm_young.tmp"
    for p in (old, young):
        p.write_bytes(b"half an object")
    os.utime(old, (time.time() - 2 * cache.STALE,) * 2)
    cache.store_object("program A", ELF)
    assert not old.exists() and young.exists()
    assert cache.clear() == 1 and list(private_cache.iterdir()) == []


@needs_llvm
def test_processes_racing_on_an_empty_cache_all_get_their_program(private_cache):
    """Three processes started at once on an empty cache compile the same program and
    write it: each computes the right result, one whole entry is left, and no temporary
    file."""
    script = ("import rvm; p = rvm.assemble('.func main(f0, f1)\\n    ADD.mul f0, f1, f1\\n"
              ".end\\n'); print(p.call('main', 0.5, 3.0, engine='native'))")
    env = dict(os.environ, RVM_CACHE_DIR=str(private_cache))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert [o for o, _ in outs] == ["(9.5, 3.0)\n"] * 3
    [entry] = private_cache.iterdir()
    assert entry.name.startswith("rvm_llvm_") and entry.suffix == ".o"
    text = entry.read_bytes()
    assert text.startswith(cache._MAGIC + cache.VERSION.encode())
