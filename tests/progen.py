"""Random *verified* programs for property tests: straight-line code, reversible if/else,
loops of bounded trip count, heap blocks (cells exchanged in and out, and read in place),
PUSH/POP pairs, and calls/uncalls of a helper."""

import random

INT_DATA, FLOAT_DATA = ["r0", "r1", "r2"], ["f0", "f1", "f2"]


class Gen:
    def __init__(self, rng: random.Random, calls: bool, ints=INT_DATA, floats=FLOAT_DATA,
                 wild: bool = False, heap: bool = True):
        self.rng, self.calls, self.n, self.wild, self.heap = rng, calls, 0, wild, heap
        self.ints, self.floats = ints, floats
        self.lines: list[str] = []

    def fresh(self, prefix="L") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def local(self) -> str:
        self.n += 1
        return f"r{10 + self.n}"

    def op(self, frozen: set) -> None:
        rng = self.rng
        ints = [r for r in self.ints if r not in frozen]
        floats = [f for f in self.floats if f not in frozen]
        choices = []
        if ints:
            choices.append("int")
        if floats:
            choices.append("float")
        if not choices:
            self.lines.append("        NOP")
            return
        if rng.choice(choices) == "int":
            d = rng.choice(ints)
            other = rng.choice([r for r in self.ints if r != d])
            self.lines.append("        " + rng.choice([
                f"ADD {d}, {other}", f"SUB {d}, {rng.randint(-9, 9)}", f"XOR {d}, {other}",
                f"ADD.mul {d}, {other}, {rng.randint(-3, 3)}", f"XOR.and {d}, {other}, 12",
                f"NEG {d}", f"INC {d}", f"DEC {d}",
                f"SWAP {d}, {rng.choice([r for r in ints if r != d])}" if len(ints) > 1
                else f"INC {d}"]))
        else:
            d = rng.choice(floats)
            src = rng.choice([f for f in self.floats if f != d] + self.ints)
            fsrc = rng.choice([f for f in self.floats if f != d])
            other = [f for f in floats if f != d]
            self.lines.append("        " + rng.choice([
                f"ADD {d}, {src}", f"SUB {d}, {rng.uniform(-2, 2)!r}",
                f"ADD.sin {d}, {src}", f"SUB.cos {d}, {fsrc}", f"ADD.tanh {d}, {fsrc}",
                f"ADD.mul {d}, {fsrc}, 0.5", f"NEG {d}",
                f"SUB.mul {d}, {fsrc}, {src}",     # a product of two registers
                f"MUL {d}, {rng.choice(['0.5', '-1.5', '2.0'])}",
                f"ROT {d}, {other[0]}, {rng.uniform(-3, 3)!r}" if other else f"NEG {d}",
                f"SWAP {d}, {other[0]}" if other else f"NEG {d}"]))

    def block(self, frozen: set, depth: int, size: int) -> None:
        for _ in range(size):
            self.statement(frozen, depth)

    def statement(self, frozen: set, depth: int) -> None:
        rng = self.rng
        kind = rng.random()
        if depth <= 0 or kind < 0.45:
            return self.op(frozen)
        if kind < 0.6:
            return self.if_else(frozen, depth)
        if kind < 0.75:
            return self.loop(frozen, depth)
        if not self.heap and (kind < 0.92 or not self.calls):
            return self.if_else(frozen, depth)
        if kind < 0.85:
            return self.heap_block(frozen, depth)
        if kind < 0.92 or not self.calls:
            return self.push_pop(frozen, depth)
        return self.call(frozen)

    def if_else(self, frozen: set, depth: int) -> None:
        rng = self.rng
        cc, neg = rng.choice([("EQ", "NE"), ("NE", "EQ"), ("LT", "GE"), ("GE", "LT"),
                              ("GT", "LE"), ("LE", "GT")])
        # conditions read integers: a float condition can flip when rounding (x - 1 + 1)
        # erases a value tiny next to others, which is floating point, not the machine
        a = rng.choice(self.ints)
        b = rng.choice([x for x in self.ints if x != a] + ["0", "1"])
        inner = frozen | {a, b}
        i, j, e, end = (self.fresh() for _ in range(4))
        self.lines.append(f"{i}: BR.{cc} {a}, {b}, {e}")
        self.block(inner, depth - 1, rng.randint(0, 3))
        self.lines.append(f"{j}: JMP {end}")
        self.lines.append(f"{e}: CF {i}")
        self.block(inner, depth - 1, rng.randint(0, 3))
        self.lines.append(f"{end}: CF.{neg} {a}, {b}, {j}")

    def loop(self, frozen: set, depth: int) -> None:
        rng = self.rng
        k, c = rng.randint(1, 3), self.local()
        top, ex, back, done, alias = (self.fresh() for _ in range(5))
        # sometimes the exit has two labels, and the branch names the second one
        two = rng.random() < 0.3
        # wild: sometimes the body reads a block of cells at the counter (or at a data
        # register, which may leave the heap) and checks the counter, before or after
        # its step, against a constant or a data register (which may fail)
        cells = self.local() if self.wild and rng.random() < 0.4 else None
        second: list = []
        readers = [r for r in self.ints + self.floats if r not in frozen]
        if cells is None or not readers:
            self.lines.append(f"{top}: CF.NE {c}, 0, {back}")
            self.block(frozen | {c}, depth - 1, rng.randint(1, 3))
            self.lines.append(f"        INC {c}")
        else:
            y = rng.choice(readers)
            at = c if rng.random() < 0.8 else rng.choice([r for r in self.ints if r != y])
            check = f"        ASSERT.{rng.choice(['LT', 'LE', 'GE', 'NE'])} {c}, " \
                f"{rng.choice(self.ints + ['3', '0', '13'])}"
            # sometimes the cell's offset is made and unmade around the read, as the
            # frontend makes an element's (a data register, which may be anything,
            # times a constant, plus the counter; or down a column, the counter times
            # a data register), and a second index steps by 2
            idx, made, unmade, fixed = at, [], [], {c, y, at}
            others = [r for r in self.ints if r not in frozen and r not in fixed]
            if others and rng.random() < 0.5:
                idx, d, m = self.local(), rng.choice(others), rng.choice("0124")
                if rng.random() < 0.4:
                    d, m = c, d
                made = [f"        ADD.mul {idx}, {d}, {m}", f"        ADD {idx}, {at}"]
                unmade = [f"        SUB {idx}, {at}", f"        SUB.mul {idx}, {d}, {m}"]
                fixed |= {d, m} - set("0124")
            if rng.random() < 0.5:
                e = self.local()
                second = [f"        ASSERT.{rng.choice(['LT', 'GE'])} {e}, "
                          f"{rng.choice(self.ints + ['5', '0', '30'])}", f"        ADD {e}, 2"]
            k = rng.choice([k, k, rng.randint(8, 12)])     # native: 8 passes or more
            self.lines += [f"        ALLOC {cells}, 12", f"{top}: CF.NE {c}, 0, {back}",
                           check, *made, f"        ADDM {y}, [{cells} + {idx}]"]
            self.block(frozen | fixed, depth - 1, rng.randint(0, 2))
            self.lines += [f"        SUBM {y}, [{cells} + {idx}]", *unmade, *second,
                           f"        INC {c}", check]
        self.lines += [f"{ex}: BR.EQ {c}, {k}, {alias if two else done}",
                       f"{back}: JMP {top}", f"{done}: {alias + ': ' if two else ''}CF {ex}",
                       f"        SUB {c}, {k}"]
        if cells is not None and readers:
            if second:
                self.lines.append(f"        SUB {e}, {2 * k}")
            self.lines.append(f"        FREE {cells}, 12")

    def heap_block(self, frozen: set, depth: int) -> None:
        x = self.rng.choice([r for r in self.ints + self.floats if r not in frozen] or ["NONE"])
        if x == "NONE":
            return self.op(frozen)
        base = self.local()
        # wild: sometimes a register offset, which may leave the block or the heap (then
        # every engine must refuse the access alike)
        offsets = [r for r in self.ints if r not in frozen and r != x] if self.wild else []
        off = self.rng.choice(offsets) if offsets and self.rng.random() < 0.3 else "1"
        self.lines += [f"        ALLOC {base}, 2", f"        EXCH {x}, [{base} + {off}]"]
        # sometimes the cell is read in place around the inner block: y += cell ... y -= cell
        same = self.ints if x in self.ints else self.floats
        readers = [y for y in same if y not in frozen and y not in (x, off)]
        y = self.rng.choice(readers) if readers and self.rng.random() < 0.5 else None
        if y:
            self.lines.append(f"        ADDM {y}, [{base} + {off}]")
        self.block(frozen | {x, base, off}, depth - 1, self.rng.randint(0, 2))
        if y:
            self.lines.append(f"        SUBM {y}, [{base} + {off}]")
        self.lines += [f"        EXCH {x}, [{base} + {off}]", f"        FREE {base}, 2"]

    def push_pop(self, frozen: set, depth: int) -> None:
        x = self.rng.choice([r for r in self.ints + self.floats if r not in frozen] or ["NONE"])
        if x == "NONE":
            return self.op(frozen)
        self.lines.append(f"        PUSH {x}")
        self.block(frozen | {x}, depth - 1, self.rng.randint(0, 2))
        self.lines.append(f"        POP {x}")

    def call(self, frozen: set) -> None:
        ints = [r for r in self.ints if r not in frozen]
        floats = [f for f in self.floats if f not in frozen]
        if len(ints) < 2 or not floats:
            return self.op(frozen)
        a, b = self.rng.sample(ints, 2)
        op = self.rng.choice(["CALL", "UNCALL"])
        if len(floats) < 2:
            return self.op(frozen)
        fa, fb = self.rng.sample(floats, 2)
        self.lines.append(f"        {op} helper, {a}, {b}, {fa}, {fb}")


def program(seed: int, wild: bool = False, heap: bool = True) -> str:
    """A random verified program (wild: heap accesses may also use register offsets, and
    then may fail at run time; heap=False: none at all, no PUSH/POP either)."""
    rng = random.Random(seed)
    helper = Gen(rng, calls=False, ints=["r0", "r1"], floats=["f0", "f1"], wild=wild,
                 heap=heap)
    helper.block(set(), 2, rng.randint(1, 5))
    main = Gen(rng, calls=True, wild=wild, heap=heap)
    main.block(set(), 3, rng.randint(2, 7))
    return (".func helper(r0, r1, f0, f1)\n" + "\n".join(helper.lines) + "\n.end\n\n"
            ".func main(r0, r1, r2, f0, f1, f2)\n" + "\n".join(main.lines) + "\n.end\n")
