"""The binary format (.rvmb): a verified program, its symbols and its source map.

Layout (little-endian):

    magic    b"RVMB"            version  u16          isa-id  u32 (crc32 of the mnemonics)
    crc32    u32 of the payload, then the payload:
      source file name                                      (string)
      constants   u32 count, each: u8 tag (0 int64, 1 float64) + 8 bytes
      strings     u32 count, each: u32 length + UTF-8       (function names, labels)
      functions   u32 count, each:
         name (u32 string index), line u32, end line u32
         params     u16 count, each a register (u8 class 0=r 1=f, u16 number)
         labels     u32 count, each: u32 string index, u32 instruction index
         code       u32 count, each: u16 opcode, u32 source line, u8 operand count, operands
      operand: u8 tag, then  0 register | 1 u32 constant index | 2 register + u8 kind
               (0: u32 constant index, 1: register) | 3 label (u32 string) | 4 function (u32)

Reading executes nothing (no pickle, no eval): every field is bounds-checked, and the
result goes through the same verifier as assembly. Any malformed file is one FormatError.
"""

from __future__ import annotations

import struct
import zlib

from ..core import isa
from ..core.errors import FormatError, VerifyError
from ..core.program import FuncRef, Function, Imm, Instruction, Label, Mem, Program, Reg
from ..core.verify import verify

MAGIC, VERSION = b"RVMB", 1
ISA_ID = zlib.crc32("\n".join(s.name for s in isa.TABLE).encode())
_HEADER = struct.Struct("<4sHII")
REG, IMM, MEM, LABEL, FUNC = range(5)


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
            self.put("B", MEM)
            self.reg(a.base)
            if isinstance(a.off, Reg):
                self.put("B", 1)
                self.reg(a.off)
            else:
                self.put("BI", 0, self.const(a.off))
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
    body = bytearray()
    src = program.source.encode()
    body += struct.pack("<I", len(src)) + src
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
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0
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

    def operand(self):
        tag = self.get("B")
        if tag == REG:
            return self.reg()
        if tag == IMM:
            return Imm(self.index(self.consts, "constant"))
        if tag == MEM:
            base = self.reg()
            kind = self.get("B")
            if kind == 1:
                return Mem(base, self.reg())
            off = self.index(self.consts, "constant")
            if kind != 0 or not isinstance(off, int):
                self.fail("bad memory operand offset")
            return Mem(base, off)
        if tag in (LABEL, FUNC):
            name = self.index(self.strings, "string")
            return Label(name) if tag == LABEL else FuncRef(name)
        self.fail(f"unknown operand tag {tag}")

    def program(self) -> Program:
        source = self.text()
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
            functions[name] = Function(name, params, tuple(code), labels, line, end_line)
        if self.pos != len(self.data):
            self.fail("trailing bytes after the last function")
        return Program(functions, source)


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
        if version != VERSION:
            raise FormatError(f"bytecode version {version} is not supported (this rvm reads "
                              f"version {VERSION}); reassemble the source")
        if isa_id != ISA_ID:
            raise FormatError("bytecode was built for a different instruction set; "
                              "reassemble the source")
        body = data[_HEADER.size:]
        if check_crc and zlib.crc32(body) != crc:
            raise FormatError("malformed bytecode: checksum mismatch (the file is corrupted)")
        program = _Reader(body).program()
        return verify(program)
    except FormatError as e:
        raise FormatError(f"{name}: {e}") from None
    except VerifyError as e:
        one_line = str(e).splitlines()[0].replace("error: ", "")
        raise FormatError(f"{name}: bytecode fails verification: {one_line}") from None
