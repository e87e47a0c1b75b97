"""The binary format (.rvmb): a verified program, its symbols and its source map.

Layout (little-endian):

    magic    b"RVMB"            version  u16          isa-id  u32 (crc32 of the mnemonics)
    crc32    u32 of the payload, then the payload:
      source file name                                      (string)
      source digest  u8 length (0, or 32: the sha256 of the source file's bytes when the
                     bytecode was written; version 2 on, absent in version 1)
      constants   u32 count, each: u8 tag (0 int64, 1 float64) + 8 bytes
      strings     u32 count, each: u32 length + UTF-8       (function names, labels)
      functions   u32 count, each:
         name (u32 string index), line u32, end line u32
         params     u16 count, each a register (u8 class 0=r 1=f, u16 number)
         labels     u32 count, each: u32 string index, u32 instruction index
         code       u32 count, each: u16 opcode, u32 source line, u8 operand count, operands
         outputs    (version 3 on) u32 count of output statements, each: u32 source line
                    (its NOP instructions print), u16 part count, each part: u8 0 + u32
                    string (text) | u8 1 + u32 string (the value's kind) + u8 register
                    count, registers
      operand: u8 tag, then  0 register | 1 u32 constant index | 2 register + u8 kind
               (0: u32 constant index, 1: register) | 3 label (u32 string) | 4 function (u32)

Reading executes nothing (no pickle, no eval): every field is bounds-checked, and the
result goes through the same verifier as assembly. Any malformed file is one FormatError.

The source file name and digest are debug info, not a licence to read files: a program read
from bytecode has a `SourceName` as its source, and `source_lines` shows its lines only when
the file on disk is a regular file whose sha256 is the one recorded (a changed file, another
file, a FIFO or a device is never shown). Control characters in the name are escaped on
reading, so the name is safe to print.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import re
import stat
import struct
import zlib

from ..core import isa
from ..core.errors import FormatError, VerifyError
from ..core.program import FuncRef, Function, Imm, Instruction, Label, Mem, Program, Reg, View
from ..core.verify import verify

MAGIC, VERSION = b"RVMB", 3
READS = (1, 2, 3)       # versions this rvm reads (version 1 has no source digest, versions
# 1 and 2 no output statements)
# the kinds of an output statement's values (Machine.output), and their registers: the
# class of each (one or two scalars), or an array's base and dimensions (all int)
OUTPUT_KINDS = {"int": "i", "float": "f", "complex": "ff", "size": "ii+", "floats": "ii+",
                "ints": "ii+", "janus": "ii+", "stack": "ii+", "chars": "ii+"}
SOURCE_LIMIT = 16 << 20  # the largest source file the debug info digests or shows (bytes)
ISA_ID = zlib.crc32("\n".join(s.name for s in isa.TABLE).encode())
# rows are only ever added at the end, so bytecode of an older table (a prefix) still reads
_ISA_IDS = {zlib.crc32("\n".join(s.name for s in isa.TABLE[:k]).encode())
            for k in range(1, len(isa.TABLE) + 1)}
_HEADER = struct.Struct("<4sHII")
REG, IMM, MEM, LABEL, FUNC, VIEW = range(6)


# C0 and C1 control characters (tab and newline stay), line separators and the bidi
# overrides: what must not reach a terminal raw from a name or a file read on its behalf
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """text with control characters escaped as Python writes them ('\\x1b'), so that a
    name or a line taken from a file cannot move the cursor, clear the screen or retitle a
    terminal. Tabs and newlines are kept."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)


class SourceName(str):
    """A program's source file name as debug info from bytecode: the name, with the sha256
    (hex) of the file's bytes recorded when the bytecode was written ("" if none was).
    It is the program's `source`, so programs derived from it (transforms pass the source
    on) keep the digest. A plain str source names a file compiled in this process."""

    digest: str

    def __new__(cls, name: str, digest: str = ""):
        self = super().__new__(cls, name)
        self.digest = digest
        return self

    def __reduce__(self):
        return SourceName, (str(self), self.digest)


def read_source(path: str) -> tuple[bytes | None, str]:
    """The bytes of the file at path if it is a regular file of at most SOURCE_LIMIT bytes,
    else (None, why not). Never blocks and never opens a FIFO, a device, a socket or a
    directory for reading (stat first, then open non-blocking and check again)."""
    if not path:
        return None, "the program names no source file"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None, f"{path} is not a regular file"
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) |
                     getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0))
    except (OSError, ValueError) as e:
        return None, f"cannot open {path}: {getattr(e, 'strerror', None) or e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):        # replaced between the stat and the open
            return None, f"{path} is not a regular file"
        chunks, size = [], 0
        while size <= SOURCE_LIMIT:
            chunk = os.read(fd, min(1 << 20, SOURCE_LIMIT + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > SOURCE_LIMIT:
            return None, f"{path} is larger than {SOURCE_LIMIT:,} bytes"
        return b"".join(chunks), ""
    except OSError as e:
        return None, f"cannot read {path}: {e.strerror or e}"
    finally:
        os.close(fd)


def source_digest(source: str) -> str:
    """The digest bytecode records for a program's source: the one it was read with
    (a SourceName), else the sha256 of the file as it is now ("" if it cannot be read)."""
    if isinstance(source, SourceName):
        return source.digest
    data, _ = read_source(source)
    return hashlib.sha256(data).hexdigest() if data is not None else ""


def source_lines(source: str) -> tuple[list[str] | None, str]:
    """The lines of a program's source file to show beside its code, or (None, why not).
    A source named by bytecode (a SourceName) is shown only if the file's sha256 is the
    digest recorded in the bytecode."""
    data, why = read_source(source)
    if data is None:
        return None, why
    digest = getattr(source, "digest", None)
    if digest == "":
        return None, (f"the bytecode records no digest of {source} (an older rvm wrote it), "
                      "so it cannot tell that the file is the program's source; reassemble it")
    if digest is not None and hashlib.sha256(data).hexdigest() != digest:
        return None, (f"{source} does not match the sha256 digest recorded in the bytecode "
                      "(the file changed after the program was compiled, or is another file)")
    return data.decode("utf-8", errors="replace").splitlines(), ""


def source_line(source: str, n: int) -> str:
    """Line n of a program's source for messages and listings ("" if it may not be shown):
    a source named by bytecode through source_lines (a regular file matching the recorded
    digest); one compiled in this process through linecache, as before."""
    if isinstance(source, SourceName):
        lines, _ = source_lines(source)
        return lines[n - 1] if lines and 0 < n <= len(lines) else ""
    return linecache.getline(source, n) if source else ""


def shown_source(source: str) -> list[str]:
    """All the lines source_line would show, as a list."""
    if isinstance(source, SourceName):
        return source_lines(source)[0] or []
    return linecache.getlines(source) if source else []


class _Writer:
    def __init__(self):
        self.out = bytearray()
        self.consts: dict = {}
        self.strings: dict = {}

    def put(self, fmt: str, *values) -> None:
        self.out += struct.pack("<" + fmt, *values)

    def const(self, v) -> int:
        key = (type(v), struct.pack("<d", v) if isinstance(v, float) else v)
        return self.consts.setdefault(key, len(self.consts))

    def string(self, s: str) -> int:
        return self.strings.setdefault(s, len(self.strings))

    def reg(self, r: Reg) -> None:
        self.put("BH", r.cls == isa.FLOAT, r.n)

    def operand(self, a) -> None:
        if isinstance(a, Reg):
            self.put("B", REG)
            self.reg(a)
        elif isinstance(a, Imm):
            self.put("BI", IMM, self.const(a.value))
        elif isinstance(a, Mem):
            self.put("B", VIEW if isinstance(a, View) else MEM)
            self.reg(a.base)
            for part in (a.off, a.s0, a.s1) if isinstance(a, View) else (a.off,):
                if isinstance(part, Reg):
                    self.put("B", 1)
                    self.reg(part)
                else:
                    self.put("BI", 0, self.const(part))
        else:
            self.put("BI", LABEL if isinstance(a, Label) else FUNC, self.string(a.name))


def dumps(program: Program) -> bytes:
    """Program -> .rvmb bytes."""
    w = _Writer()
    for fn in program.functions.values():
        w.put("III", w.string(fn.name), fn.line, fn.end_line)
        w.put("H", len(fn.params))
        for p in fn.params:
            w.reg(p)
        w.put("I", len(fn.labels))
        for name, index in fn.labels.items():
            w.put("II", w.string(name), index)
        w.put("I", len(fn.code))
        for ins in fn.code:
            w.put("HIB", isa.OPCODES[ins.op], ins.line, len(ins.args))
            for a in ins.args:
                w.operand(a)
        if VERSION < 3:         # (tests write older versions)
            continue
        w.put("I", len(fn.outputs))
        for line, parts in fn.outputs:
            w.put("IH", line, len(parts))
            for part in parts:
                if isinstance(part, str):
                    w.put("BI", 0, w.string(part))
                else:
                    w.put("BIB", 1, w.string(part[0]), len(part[1]))
                    for r in part[1]:
                        w.reg(r)
    body = bytearray()
    src = program.source.encode()
    body += struct.pack("<I", len(src)) + src
    digest = bytes.fromhex(source_digest(program.source))
    body += struct.pack("<B", len(digest)) + digest
    body += struct.pack("<I", len(w.consts))
    for (kind, v) in w.consts:
        body += struct.pack("<B", kind is float) + (v if kind is float else struct.pack("<q", v))
    body += struct.pack("<I", len(w.strings))
    for s in w.strings:
        b = s.encode()
        body += struct.pack("<I", len(b)) + b
    body += struct.pack("<I", len(program.functions)) + w.out
    return _HEADER.pack(MAGIC, VERSION, ISA_ID, zlib.crc32(body)) + bytes(body)


class _Reader:
    def __init__(self, data: bytes, version: int = VERSION):
        self.data, self.pos, self.version = data, 0, version
        self.consts: list = []
        self.strings: list[str] = []

    def fail(self, why: str):
        raise FormatError(f"malformed bytecode: {why} (at byte {self.pos})")

    def get(self, fmt: str):
        s = struct.Struct("<" + fmt)
        if self.pos + s.size > len(self.data):
            self.fail("unexpected end of file")
        values = s.unpack_from(self.data, self.pos)
        self.pos += s.size
        return values if len(values) > 1 else values[0]

    def count(self, fmt: str, min_size: int) -> int:
        n = self.get(fmt)
        if n * min_size > len(self.data) - self.pos:
            self.fail(f"count {n} is larger than the rest of the file")
        return n

    def text(self) -> str:
        n = self.count("I", 1)
        raw = self.data[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode()
        except UnicodeDecodeError:
            self.fail("a string is not valid UTF-8")

    def index(self, table: list, what: str):
        i = self.get("I")
        if i >= len(table):
            self.fail(f"{what} index {i} out of range")
        return table[i]

    def reg(self) -> Reg:
        cls, n = self.get("BH")
        if cls > 1:
            self.fail(f"bad register class {cls}")
        return Reg(isa.FLOAT if cls else isa.INT, n)

    def part(self):
        """A memory operand's offset, or a view's stride: a register or an int."""
        kind = self.get("B")
        if kind == 1:
            return self.reg()
        v = self.index(self.consts, "constant")
        if kind != 0 or type(v) is not int:
            self.fail("bad memory operand offset")
        return v

    def operand(self):
        tag = self.get("B")
        if tag == REG:
            return self.reg()
        if tag == IMM:
            return Imm(self.index(self.consts, "constant"))
        if tag in (MEM, VIEW):
            base = self.reg()
            parts = [self.part() for _ in range(3 if tag == VIEW else 1)]
            return View(base, *parts) if tag == VIEW else Mem(base, *parts)
        if tag in (LABEL, FUNC):
            name = self.index(self.strings, "string")
            return Label(name) if tag == LABEL else FuncRef(name)
        self.fail(f"unknown operand tag {tag}")

    def outputs(self, fn: Function) -> tuple:
        """A function's output statements: (line, parts), each value's kind known and its
        registers the function's own, of the classes the kind wants."""
        out: dict[int, tuple] = {}
        mentioned = set(fn.registers)
        for _ in range(self.count("I", 6)):
            line, n = self.get("IH")
            parts: list = []
            for _ in range(n):
                tag = self.get("B")
                if tag == 0:
                    parts.append(self.index(self.strings, "string"))
                    continue
                if tag != 1:
                    self.fail(f"unknown output part tag {tag}")
                kind = self.index(self.strings, "string")
                regs = tuple(self.reg() for _ in range(self.count("B", 3)))
                want = OUTPUT_KINDS.get(kind)
                if want is None:
                    self.fail(f"unknown output value kind {kind!r}")
                classes = "".join("f" if r.cls == isa.FLOAT else "i" for r in regs)
                if not re.fullmatch(want, classes) or not set(regs) <= mentioned:
                    self.fail(f"bad registers for an output value of kind {kind!r}")
                parts.append((kind, regs))
            if line in out:
                self.fail(f"two output statements at line {line}")
            out[line] = tuple(parts)
        return tuple(out.items())

    def program(self) -> Program:
        source = self.text()
        digest = ""
        if self.version >= 2:
            n = self.get("B")
            if n not in (0, 32) or self.pos + n > len(self.data):
                self.fail(f"bad source digest length {n}")
            digest = self.data[self.pos:self.pos + n].hex()
            self.pos += n
        for _ in range(self.count("I", 9)):
            tag, raw = self.get("B"), self.get("8s")
            if tag > 1:
                self.fail(f"bad constant tag {tag}")
            self.consts.append(struct.unpack("<d" if tag else "<q", raw)[0])
        self.strings = [self.text() for _ in range(self.count("I", 4))]
        functions: dict[str, Function] = {}
        for _ in range(self.count("I", 12)):
            name = self.index(self.strings, "string")
            line, end_line = self.get("II")
            params = tuple(self.reg() for _ in range(self.count("H", 3)))
            labels = {}
            for _ in range(self.count("I", 8)):
                label = self.index(self.strings, "string")
                labels[label] = self.get("I")
            code = []
            for _ in range(self.count("I", 7)):
                opcode, ins_line, nargs = self.get("HIB")
                if opcode >= len(isa.TABLE):
                    self.fail(f"unknown opcode {opcode}")
                args = tuple(self.operand() for _ in range(nargs))
                code.append(Instruction(isa.TABLE[opcode].name, args, ins_line))
            if name in functions:
                self.fail(f"function {name!r} defined twice")
            fn = Function(name, params, tuple(code), labels, line, end_line)
            if self.version >= 3:
                fn = Function(name, params, tuple(code), labels, line, end_line,
                              outputs=self.outputs(fn))
            functions[name] = fn
        if self.pos != len(self.data):
            self.fail("trailing bytes after the last function")
        return Program(functions, SourceName(printable(source), digest))


def loads(data: bytes, name: str = "<bytes>", check_crc: bool = True) -> Program:
    """.rvmb bytes -> verified Program. Raises FormatError (one line) on any defect."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"rvm.loads takes .rvmb bytes, got {type(data).__name__}"
                        + ("; assembly text is read by rvm.assemble"
                           if isinstance(data, str) else ""))
    data = bytes(data)
    try:
        if len(data) < _HEADER.size:
            raise FormatError("malformed bytecode: file too short for the header")
        magic, version, isa_id, crc = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise FormatError("not an rvm bytecode file (bad magic number)")
        if version not in READS:
            raise FormatError(f"bytecode version {version} is not supported (this rvm reads "
                              f"versions {READS[0]} to {READS[-1]}); reassemble the source")
        if isa_id not in _ISA_IDS:
            raise FormatError("bytecode was built for a different instruction set; "
                              "reassemble the source")
        body = data[_HEADER.size:]
        if check_crc and zlib.crc32(body) != crc:
            raise FormatError("malformed bytecode: checksum mismatch (the file is corrupted)")
        program = _Reader(body, version).program()
        return verify(program)
    except FormatError as e:
        raise FormatError(f"{name}: {e}") from None
    except VerifyError as e:
        one_line = str(e).splitlines()[0].replace("error: ", "")
        raise FormatError(f"{name}: bytecode fails verification: {one_line}") from None
