"""Program / Function / Instruction: bytecode as plain data.

A Program knows nothing about running itself; `rvm.api` attaches the conveniences
`prog.call`, `prog.uncall` and `prog["name"]` on top of the engines, so the core imports
no other part of rvm. The verifier (rvm.core.verify) decides whether a Program may run.
"""

from __future__ import annotations

import functools
import re

import attrs

from . import isa

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
MAX_REGISTER = 0xFFFF


@attrs.frozen
class Reg:
    cls: str   # isa.INT ("i", written r0, r1, ...) or isa.FLOAT ("f", written f0, f1, ...)
    n: int

    def __str__(self) -> str:
        return ("r" if self.cls == isa.INT else "f") + str(self.n)


@attrs.frozen
class Imm:
    value: int | float

    @property
    def cls(self) -> str:
        return isa.FLOAT if isinstance(self.value, float) else isa.INT

    def __str__(self) -> str:
        return repr(self.value)


@attrs.frozen
class Mem:
    base: Reg
    off: Reg | int = 0

    def __str__(self) -> str:
        if isinstance(self.off, Reg):
            return f"[{self.base} + {self.off}]"
        if self.off == 0:
            return f"[{self.base}]"
        return f"[{self.base} {'-' if self.off < 0 else '+'} {abs(self.off)}]"

    @property
    def regs(self) -> tuple[Reg, ...]:
        return (self.base, self.off) if isinstance(self.off, Reg) else (self.base,)


@attrs.frozen
class View(Mem):
    """A strided 2-D view of heap cells for the array instructions, `[rB + off : s0, s1]`:
    element (i, j) is the cell at base + off + i * s0 + j * s1 (the shape is the
    instruction's). A stride of 0 repeats a cell: a scalar broadcast, or a sum into it."""

    s0: Reg | int = 0
    s1: Reg | int = 1

    def __str__(self) -> str:
        return f"{Mem.__str__(self)[:-1]} : {self.s0}, {self.s1}]"

    @property
    def regs(self) -> tuple[Reg, ...]:
        return Mem.regs.fget(self) + tuple(s for s in (self.s0, self.s1) if isinstance(s, Reg))


@attrs.frozen
class Label:
    name: str

    def __str__(self) -> str:
        return self.name


@attrs.frozen
class FuncRef:
    name: str

    def __str__(self) -> str:
        return self.name


Operand = Reg | Imm | Mem | View | Label | FuncRef


@attrs.frozen
class Instruction:
    op: str                        # mnemonic, a key of isa.OPS
    args: tuple = ()               # operands
    line: int = 0                  # source line (the source map); 0 if unknown
    # an array instruction's gradient: the view operands it pulls back into, bit k for
    # the operand k after the target (all of them, -1, but where rvm.ad.activity finds
    # that an operand's cells never hold a value that depends on a differentiated input)
    pull: int = -1

    @property
    def spec(self) -> isa.OpSpec:
        return isa.OPS[self.op]

    @property
    def written(self) -> tuple:
        """The operands the instruction writes (kinds D and X; a call's registers are all
        passed by reference and are not listed here)."""
        return tuple(a for a, k in zip(self.args, self.spec.kinds) if k in "DX")

    @property
    def cls(self) -> str:
        """The register class it computes in: its first written register's (the array
        instructions: float, the heap's float view), else int."""
        written = self.written
        return written[0].cls if written else isa.FLOAT if self.spec.group == "array" \
            else isa.INT

    def __str__(self) -> str:
        return f"{self.op:<8} {', '.join(map(str, self.args))}".rstrip()


@attrs.frozen
class Symbol:
    """A source name for registers, in scope on lines first..last (debug info)."""

    name: str
    regs: tuple                    # one register, or an array's (base, dims...)
    first: int
    last: int
    dtype: str = ""                # arrays: element class


@attrs.frozen
class Function:
    name: str
    params: tuple[Reg, ...]
    code: tuple[Instruction, ...]
    labels: dict = attrs.field(factory=dict, eq=True)   # label -> instruction index
    line: int = 0                  # line of the .func directive
    end_line: int = 0              # line of the .end directive
    # debug info, not part of a program's identity (and not kept in .rvmb files):
    names: tuple = attrs.field(default=(), eq=False)     # source names of the arguments
    symbols: tuple = attrs.field(default=(), eq=False)   # Symbol per source variable
    # (block name, "compute" | "uncompute", first index, end index) per compute block
    regions: tuple = attrs.field(default=(), eq=False)
    # (line, parts) per output statement: the NOP instructions of that source line print
    # the parts when they run, in either direction (see Machine.output)
    outputs: tuple = attrs.field(default=(), eq=False)
    # (line, op, args, message, operands, hint, shown) per check the compiler made for a
    # statement that is not an `assert` (a slice's bounds, an overlap): what its failure
    # means in the source's terms (rvm.engines.explain); operands: the source text of the
    # ASSERT's two operands, or (): then the values of the variables in `shown` are shown
    checks: tuple = attrs.field(default=(), eq=False)
    # for the entry of an adjoint program (rvm.adjoint(g)): g's name, so that transforms
    # of a caller can treat it as one operation with a known derivative
    adjoint_of: str = attrs.field(default="", eq=False)

    @functools.cached_property
    def registers(self) -> list[Reg]:
        """Every register the function mentions (params first), without repeats."""
        seen: dict[Reg, None] = dict.fromkeys(self.params)
        for ins in self.code:
            for a in ins.args:
                for r in (a,) if isinstance(a, Reg) else a.regs if isinstance(a, Mem) else ():
                    seen.setdefault(r)
        return list(seen)

    @functools.cached_property
    def n_int(self) -> int:
        return 1 + max((r.n for r in self.registers if r.cls == isa.INT), default=-1)

    @functools.cached_property
    def n_float(self) -> int:
        return 1 + max((r.n for r in self.registers if r.cls == isa.FLOAT), default=-1)

    def slot(self, reg: Reg) -> int:
        """Index of a register in the frame's register list: ints first, then floats."""
        return reg.n if reg.cls == isa.INT else self.n_int + reg.n

    @functools.cached_property
    def locals(self) -> list[Reg]:
        params = set(self.params)
        return [r for r in self.registers if r not in params]

    @functools.cached_property
    def param_slots(self) -> list[int]:
        return [self.slot(p) for p in self.params]

    @functools.cached_property
    def local_slots(self) -> list[tuple[Reg, int]]:
        return [(r, self.slot(r)) for r in self.locals]

    def labels_at(self, index: int) -> list[str]:
        """Every label of the instruction at index (an instruction may have several)."""
        return [name for name, i in self.labels.items() if i == index]


@attrs.frozen
class Program:
    """Functions by name (in source order), the file they came from, and a cache the
    engines keep compiled code in."""

    functions: dict = attrs.field(factory=dict)   # name -> Function, in source order
    source: str = ""                               # file the program came from
    cache: dict = attrs.field(factory=dict, eq=False, repr=False)  # compiled code
    engine: str | None = attrs.field(default=None, eq=False)       # default engine

    def __reduce__(self):
        """Pickled (to a dask worker, say) without what this process made for it: the
        cache's entries under tuple keys are derived on need (generated and native code,
        derived programs, plans holding native function pointers, none of which pickle)
        and are left out, to be found again from the on-disk code cache or compiled where
        the program is unpickled; entries under string keys are its data and counters
        (e.g. runs so far, so the default engine goes native there as it did here)."""
        kept = {k: v for k, v in self.cache.items() if isinstance(k, str)}
        return Program, (self.functions, self.source, kept, self.engine)

    def calls(self) -> dict[str, list[str]]:
        """The functions each function calls or uncalls, in order, without repeats."""
        return {name: list(dict.fromkeys(ins.args[0].name for ins in fn.code
                                         if ins.op in isa.CALLS))
                for name, fn in self.functions.items()}

    def call_order(self) -> tuple[list[str], bool]:
        """(every function, each after the functions it calls where the call graph
        allows; whether the graph has a cycle). A depth-first walk with its own stack, so
        a chain of thousands of calls needs no Python recursion. In a post-order, a
        function's callee that comes later lies on a cycle with it."""
        if "call_order" not in self.cache:
            calls, order, state = self.calls(), [], {}   # state 1: on the path, 2: done
            cyclic = False
            for root in calls:
                if root in state:
                    continue
                state[root] = 1
                stack = [(root, iter(calls[root]))]
                while stack:
                    name, todo = stack[-1]
                    for callee in todo:
                        if callee not in calls:
                            continue
                        if state.get(callee) == 1:
                            cyclic = True
                        elif callee not in state:
                            state[callee] = 1
                            stack.append((callee, iter(calls[callee])))
                            break
                    else:
                        stack.pop()
                        state[name] = 2
                        order.append(name)
            self.cache["call_order"] = (order, cyclic)
        return self.cache["call_order"]

    def deepest(self, name: str) -> tuple[int, int] | None:
        """The most frames, and the most registers, that the calls under function `name`
        (itself included) can hold live at once, taken over every chain of calls it could
        make; None where the calls can recurse. The compiled engines, which keep no
        frames of their own, run a function only where these fit the machine's limits."""
        deepest = self.cache.get("deepest")
        if deepest is None:
            order, cyclic = self.call_order()
            deepest = {}        # (filled, then published: threads may ask at once)
            if not cyclic:
                calls = self.calls()
                for f in order:          # callees first
                    fn = self.functions[f]
                    below = [deepest[g] for g in calls[f] if g in deepest]
                    deepest[f] = (1 + max((d for d, _ in below), default=0),
                                  fn.n_int + fn.n_float + max((c for _, c in below), default=0))
            self.cache["deepest"] = deepest
        return deepest.get(name)
