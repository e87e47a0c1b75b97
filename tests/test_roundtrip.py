"""For every opcode and form: random operands, one step forwards then one step back restores
the whole machine state (integers and exchanges exactly, floats within 1e-12 relative)."""

import math
import random

import pytest
from conftest import states_close

import rvm
from rvm.core import isa

EXACT = {"SWAP", "NEG", "EXCH", "PUSH", "POP", "NOP", "ALLOC", "FREE", "XOR", "XOR.and",
         "XOR.or", "INC", "DEC"}
POSITIVE_FIRST = {"log", "sqrt", "pow"}
NONZERO_LAST = {"div", "mod", "MUL", "DIV"}

CASES = [(s.name, cls) for s in isa.TABLE if s.group not in ("control", "call", "array")
         for cls in sorted(s.forward)]      # (arrays: tests/test_array_instructions.py)


def build(spec, cls, rng):
    """Assembly for a one-instruction function, its argument values, and heap setup."""
    regs, values, args = [], [], []
    n_of = {"i": 0, "f": 0}

    def fresh(c, value):
        r = f"{'r' if c == 'i' else 'f'}{n_of[c]}"
        n_of[c] += 1
        regs.append(r)
        values.append(value)
        return r

    def rnd(c):
        return rng.randint(-10**6, 10**6) if c == "i" else rng.uniform(-3, 3)

    family = spec.name.partition(".")[2]
    for k, (name, kind) in enumerate(zip(spec.names, spec.kinds)):
        last = k == len(spec.kinds) - 1
        if kind in "DX":
            v = rnd(cls)
            if spec.name in ("ALLOC", "POP", "FREE", "ZERO"):
                v = 0 if cls == "i" else 0.0
            args.append(fresh(cls, v))
        elif kind in "SV":
            src = rng.choice(["reg", "imm", "int"] if cls == "f" or kind == "V"
                             else ["reg", "imm"])
            # int sources of float forms stay small: 2.7 + 485409 - 485409 is only 1e-11-close
            v = rng.randint(-4, 4) if src == "int" else rnd(cls)
            if (family in POSITIVE_FIRST and name == "a") or spec.name in ("ROT", "IROT"):
                v = abs(v) + 0.5
            if (family in NONZERO_LAST or spec.name in NONZERO_LAST) and last:
                v = math.copysign(abs(v) + 0.5, v)   # keep quotients of ordinary size
            if family == "pow" and name == "b":
                v = rng.uniform(-2, 2)
            if src == "int" or cls == "i":
                v = int(v) or (2 if (family in POSITIVE_FIRST | NONZERO_LAST
                                     or spec.name in NONZERO_LAST) else 0)
            if src == "imm":
                args.append(repr(v))
            else:
                args.append(fresh("i" if src == "int" else cls, v))
        elif kind == "C":
            args.append("4")
        elif kind == "M":
            base = fresh("i", 0)
            args.append(f"[{base} + 2]")
    text = f".func t({', '.join(regs)})\n        {spec.name} {', '.join(args)}\n.end\n"
    return text, values


@pytest.mark.parametrize("op,cls", CASES, ids=[f"{o}-{c}" for o, c in CASES])
def test_step_then_back_restores_state(op, cls):
    spec, rng = isa.OPS[op], random.Random(hash(op) & 0xFFFF)
    for _ in range(25):
        text, values = build(spec, cls, rng)
        if op.startswith("ASSERT."):     # operands that make the asserted condition hold
            a = rng.uniform(-3, 3)
            b = {"EQ": a, "NE": a + 1, "LT": a + 1, "LE": a, "GT": a - 1, "GE": a}[op[7:]]
            text, values = f".func t(f0, f1)\n        {op} f0, f1\n.end\n", [a, b]
        program = rvm.assemble(text)
        m = rvm.Machine(program)
        m.enter("t", *values)
        if op != "ALLOC":          # a 4-cell block of random data on the heap
            m.top = 0
            m.alloc(4)
            for c in range(4):
                if cls == "f":
                    m.hf[c] = rng.uniform(-5, 5)
                else:
                    m.hi[c] = rng.randint(-100, 100)
            if op == "FREE":
                for c in range(4):
                    m.hi[c] = 0
        before = m.snapshot()
        assert m.step(), text
        after = m.snapshot()
        if op == "NOP" or op.startswith("ASSERT.") or op == "ZERO":
            assert after[0][0][3] == before[0][0][3], f"{text} changed a register"
        else:
            assert after != before, f"{text} changed nothing"
        assert m.back()
        restored = m.snapshot()
        if op in EXACT or cls == "i":
            assert restored == before, text
        else:
            assert states_close(restored, before, 1e-12), (text, before, restored)


def test_int_arithmetic_wraps_around_and_back():
    prog = rvm.assemble(".func t(r0, r1)\n ADD r0, r1\n ADD.mul r0, r1, r1\n NEG r1\n.end")
    big = (1 << 63) - 1
    m = rvm.Machine(prog)
    m.enter("t", big, big)
    start = m.snapshot()
    m.run()
    r0, r1 = m.results()
    assert r1 == -big
    assert -(1 << 63) <= r0 < (1 << 63)
    mask = (1 << 64) - 1
    assert r0 & mask == (big + big + big * big) & mask
    m.run(-1)
    assert m.snapshot() == start


def test_neg_of_int64_min_wraps_to_itself():
    prog = rvm.assemble(".func t(r0)\n NEG r0\n.end")
    assert prog.call("t", -(1 << 63)) == (-(1 << 63),)


def test_float_families_compute_their_functions():
    prog = rvm.assemble("""
.func t(f0, f1, f2)
    ADD.exp f0, f1
    ADD.atan2 f2, f1, 2.0
.end""")
    f0, f1, f2 = prog.call("t", 1.0, 0.5, 0.0)
    assert f1 == 0.5
    assert f0 == 1.0 + math.exp(0.5) and f2 == math.atan2(0.5, 2.0)
