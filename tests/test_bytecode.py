"""The .rvmb format: round trips, and clean one-line errors for any malformed file."""

import os
import pathlib
import random
import struct
import sys
import zlib

import pytest

import rvm
from rvm.core.errors import FormatError, RvmError
from rvm.formats import bytecode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tools"))
from fuzz import mutate_bytes, mutate_chars

ASM = pathlib.Path(__file__).resolve().parent.parent / "asm"
SAMPLES = sorted(ASM.glob("*.rasm"))
FUZZ_ROUNDS = int(os.environ.get("RVM_FUZZ", "300"))


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_round_trip(path, tmp_path):
    p = rvm.load(path)
    data = rvm.dumps(p)
    q = rvm.loads(data)
    assert q.functions == p.functions and q.source == p.source
    out = tmp_path / "x.rvmb"
    rvm.save(p, out)
    assert rvm.load(out).functions == p.functions
    assert rvm.dumps(q) == data


def test_loaded_bytecode_runs_like_source():
    p = rvm.loads(rvm.dumps(rvm.load(ASM / "isqrt.rasm")))
    assert p.call("isqrt", 99, 0) == (99, 9)


@pytest.mark.parametrize("data,msg", [
    (b"", "too short"),
    (b"XXXX" + bytes(20), "bad magic"),
    (struct.pack("<4sHII", b"RVMB", 99, bytecode.ISA_ID, 0), "version 99"),
    (struct.pack("<4sHII", b"RVMB", 1, 12345, 0), "different instruction set"),
    (struct.pack("<4sHII", b"RVMB", 1, bytecode.ISA_ID, 0) + b"\x00", "checksum"),
])
def test_malformed_headers(data, msg):
    with pytest.raises(FormatError, match=msg) as err:
        rvm.loads(data, "f.rvmb")
    assert "\n" not in str(err.value) and str(err.value).startswith("f.rvmb: ")


def with_crc(data: bytes) -> bytes:
    """Recompute the checksum so the fuzzer reaches the parser and the verifier."""
    body = data[bytecode._HEADER.size:]
    magic, version, isa_id, _ = bytecode._HEADER.unpack_from(data)
    return bytecode._HEADER.pack(magic, version, isa_id, zlib.crc32(body)) + body


def test_truncated_files_are_refused():
    data = rvm.dumps(rvm.load(ASM / "reverse.rasm"))
    for n in range(bytecode._HEADER.size, len(data)):
        with pytest.raises(FormatError):
            rvm.loads(with_crc(data[:n]))


def test_a_program_failing_verification_is_refused():
    p = rvm.load(ASM / "fib.rasm")
    fn = p.functions["fib"]
    broken = fn.code[:7] + fn.code[8:]           # drop the comefrom at `done`
    bad = rvm.Program({"fib": type(fn)(fn.name, fn.params, broken, {"top": 1, "exitbr": 5,
                                                                     "back": 6, "done": 7})})
    data = bytecode.dumps(bad)
    with pytest.raises(FormatError, match="fails verification"):
        rvm.loads(data)


def run_briefly(p: rvm.Program) -> None:
    """A mutated program that still verifies must run or fail cleanly, within a budget."""
    for fn in p.functions.values():
        args = [0 if r.cls == "i" else 0.5 for r in fn.params]
        try:
            rvm.Machine(p, max_steps=2000, heap_limit=1000).call(fn.name, *args)
        except RvmError:
            pass


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_fuzz_bytecode_mutations_give_clean_errors(path):
    rng = random.Random(path.name)
    data = rvm.dumps(rvm.load(path))
    for _ in range(FUZZ_ROUNDS):
        m = mutate_bytes(data, rng)
        for candidate in (m, with_crc(m) if len(m) >= bytecode._HEADER.size else m):
            try:
                p = rvm.loads(candidate)
            except FormatError as e:
                assert "\n" not in str(e)
                continue
            run_briefly(p)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_fuzz_assembly_mutations_give_clean_errors(path):
    rng = random.Random(path.name)
    text = path.read_text()
    for _ in range(FUZZ_ROUNDS):
        try:
            p = rvm.assemble(mutate_chars(text, rng), "m.rasm")
        except rvm.AsmError as e:
            assert str(e).startswith("m.rasm:")
            continue
        run_briefly(p)


@pytest.mark.slow
def test_fuzz_long():
    rng = random.Random(1)
    datas = [rvm.dumps(rvm.load(p)) for p in SAMPLES]
    for _ in range(20000):
        m = mutate_bytes(rng.choice(datas), rng)
        try:
            run_briefly(rvm.loads(with_crc(m) if len(m) >= 14 else m))
        except FormatError:
            pass


def test_names_that_are_not_identifiers_are_refused():
    # names reach generated code and messages: quotes or braces must never get through
    p = rvm.load(ASM / "fib.rasm")
    fn = p.functions["fib"]
    labels = {("top'{__import__('os')}" if k == "top" else k): v for k, v in fn.labels.items()}
    code = tuple(i if i.args[-1:] != (rvm.core.program.Label("top"),) else
                 rvm.core.program.Instruction(i.op, i.args[:-1] + (rvm.core.program.Label(
                     "top'{__import__('os')}"),), i.line) for i in fn.code)
    bad = rvm.Program({"fib": type(fn)(fn.name, fn.params, code, labels)})
    with pytest.raises(FormatError, match="not a valid name"):
        rvm.loads(bytecode.dumps(bad))


def test_the_source_digest_is_recorded_and_checked(tmp_path):
    import hashlib
    src = tmp_path / "isqrt.rasm"
    src.write_bytes((ASM / "isqrt.rasm").read_bytes())
    data = rvm.dumps(rvm.load(src))
    q = rvm.loads(data)
    assert q.source == str(src)
    assert q.source.digest == hashlib.sha256(src.read_bytes()).hexdigest()
    lines, why = bytecode.source_lines(q.source)
    assert lines == src.read_text().splitlines() and why == ""
    assert rvm.dumps(q) == data              # the recorded digest, not the file's now
    src.write_text(src.read_text() + "; changed\n")
    assert rvm.dumps(q) == data
    lines, why = bytecode.source_lines(rvm.loads(data).source)
    assert lines is None and "does not match the sha256 digest" in why


def test_version_1_files_load_without_a_digest_and_show_no_source(monkeypatch):
    monkeypatch.setattr(bytecode, "VERSION", 2)         # (no output statements)
    data = rvm.dumps(rvm.load(ASM / "isqrt.rasm"))
    monkeypatch.undo()
    body = data[bytecode._HEADER.size:]
    n = struct.unpack_from("<I", body)[0]
    assert body[4 + n] == 32                           # version 2: u8 length + digest
    old = body[:4 + n] + body[4 + n + 33:]
    magic, _, isa_id, _ = bytecode._HEADER.unpack_from(data)
    v1 = bytecode._HEADER.pack(magic, 1, isa_id, zlib.crc32(old)) + old
    p = rvm.loads(v1)
    assert p.functions == rvm.loads(data).functions and p.source.digest == ""
    lines, why = bytecode.source_lines(p.source)
    assert lines is None and "records no digest" in why
    bad = body[:4 + n] + b"\x07" + body[4 + n + 33:]
    with pytest.raises(FormatError, match="bad source digest length 7"):
        rvm.loads(bytecode._HEADER.pack(magic, 2, isa_id, zlib.crc32(bad)) + bad)


def test_control_characters_in_the_source_name_are_escaped_on_reading():
    import attrs
    p = attrs.evolve(rvm.load(ASM / "isqrt.rasm"), source="a\x1b[2J\u202e\x9b.rasm")
    assert rvm.loads(rvm.dumps(p)).source == "a\\x1b[2J\\u202e\\x9b.rasm"


def test_read_source_refuses_what_is_not_a_small_regular_file(tmp_path, monkeypatch):
    assert "not a regular file" in bytecode.read_source(str(tmp_path))[1]
    assert "cannot open" in bytecode.read_source(str(tmp_path / "missing"))[1]
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        assert "not a regular file" in bytecode.read_source(str(tmp_path / "fifo"))[1]
    big = tmp_path / "big.rasm"
    big.write_bytes(b"x" * 101)
    monkeypatch.setattr(bytecode, "SOURCE_LIMIT", 100)
    assert "larger than" in bytecode.read_source(str(big))[1]
