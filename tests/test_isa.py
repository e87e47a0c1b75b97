"""The instruction table: every row is complete and consistent."""

import pathlib
import subprocess
import sys

from rvm.core import isa

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_opcode_has_an_inverse_that_inverts_back():
    for spec in isa.TABLE:
        inv = isa.OPS.get(spec.inverse)
        assert inv is not None, f"{spec.name}: inverse {spec.inverse} is not in the table"
        assert inv.inverse == spec.name, f"{spec.name} <-> {inv.name} is not an involution"
        assert inv.kinds == spec.kinds, f"{spec.name} and its inverse differ in operands"


def test_every_float_opcode_has_an_adjoint():
    for spec in isa.TABLE:
        if isa.FLOAT in spec.forward:
            assert spec.adjoint is not None, f"{spec.name} has a float form but no adjoint"


def test_required_opcodes_present():
    required = ["ADD", "SUB", "XOR", "XOR.and", "NEG", "INC", "DEC", "SWAP", "ROT", "IROT",
                "MUL", "DIV", "EXCH", "ALLOC", "FREE", "PUSH", "POP", "JMP", "CF", "CALL",
                "UNCALL", "NOP"]
    required += [f"{h}.{f}" for h in ("ADD", "SUB") for f in
                 ["mul", "div", "pow", "exp", "log", "sin", "cos", "tanh", "sqrt", "abs", "atan2"]]
    required += [f"{h}.{cc}" for h in ("BR", "CF") for cc in ["EQ", "NE", "LT", "LE", "GT", "GE"]]
    missing = [name for name in required if name not in isa.OPS]
    assert not missing


def test_int_mul_family_exists():
    assert isa.INT in isa.OPS["ADD.mul"].forward and isa.INT in isa.OPS["SUB.mul"].forward


def test_lookup_is_case_insensitive_on_suffixes():
    assert isa.lookup("add.MUL").name == "ADD.mul"
    assert isa.lookup("br.eq").name == "BR.EQ"
    assert isa.lookup("FROB") is None


def test_docs_isa_md_is_up_to_date():
    generated = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_isa_doc.py"),
                                "--stdout"], capture_output=True, text=True, check=True).stdout
    on_disk = (ROOT / "docs" / "isa.md").read_text()
    assert on_disk == generated, "docs/isa.md is stale: run python tools/gen_isa_doc.py"


def test_every_temporary_of_the_templates_is_declared():
    """Generated code declares each local's type, the templates' temporaries (`let NAME
    = ...`) from isa.TEMPORARIES: one used and not listed would have no type."""
    import re
    lets = set()
    for spec in isa.TABLE:
        for template in [*spec.forward.values(), spec.adjoint or ""]:
            lets |= set(re.findall(r"^let (\w+) =", template, re.M))
    assert lets and lets <= set(isa.TEMPORARIES)
    assert set(isa.TEMPORARIES.values()) <= {isa.INT, isa.FLOAT}


def test_families_added_later_go_last_so_older_bytecode_still_reads():
    """max and min came after bytecode files existed: their rows are the table's last, so
    every earlier opcode keeps its number and a file written with the table before them
    (its header names that table) reads as the same program."""
    import struct
    import zlib

    import rvm
    from rvm.formats import bytecode
    added = [f"{h}.{f}" for h in ("ADD", "SUB", "VADD", "VSUB") for f in isa.ADDED_FAMILIES]
    first = min(isa.OPCODES[name] for name in added)
    assert {s.name for s in isa.TABLE[first:]} == set(added)
    p = rvm.assemble(".func f(f0, f1)\n    ADD.exp f0, f1\n    VNEG [r0 : 1, 0], 1, 1\n.end\n")
    data = bytearray(bytecode.dumps(p))
    old = zlib.crc32("\n".join(s.name for s in isa.TABLE[:first]).encode())
    struct.pack_into("<I", data, 6, old)            # the header's isa-id
    assert bytecode.loads(bytes(data)).functions["f"].code == p.functions["f"].code
