"""LLVM IR written as text, directly: the subset of llvmlite.ir that rvm's back end uses
(rvm.engines.llvm, lowering, lanes), with the same interface and the same printed
instructions, at a fraction of the cost.

llvmlite.ir makes an object per instruction (with its operands, a name registered in a
scope, and a string cache) and prints the module by formatting each of them again; for a
large program that was a quarter of a first compile (the GMM example's gradient: 5.6 s of
CPU to write its two modules, 1.6 s with this module, most of which is now the parsing
and walking of the generated Python; LLVM's -O2 takes 13.5 s). Here each builder call
appends its instruction's line of text to its basic block at once: a value is its type
and its textual name, types are interned objects that know their text, and constants
print themselves when made. A phi and a switch, which gain incoming values and cases after
they are made, stay objects until the module is printed.

The text is llvmlite's (typed pointers, the same instruction syntax and operands, the
same order of globals and blocks), so LLVM parses it to the same module, up to the names
of values and blocks: the machine code is the same (tests/test_irtext.py compares them).
rvm.engines.llvm uses this module unless RVM_IRTEXT=0 (llvmlite.ir, to compare).
"""

from __future__ import annotations

import itertools
import re
import struct

_DOUBLE = struct.Struct("<d")
_CMP = {">": "gt", "<": "lt", "==": "eq", "!=": "ne", ">=": "ge", "<=": "le"}
_ICMP_S = {k: ("s" + v if k not in ("==", "!=") else v) for k, v in _CMP.items()}
_ICMP_U = {k: ("u" + v if k not in ("==", "!=") else v) for k, v in _CMP.items()}
_FCMP_O = {k: "o" + v for k, v in _CMP.items()}
_FCMP_U = {k: "u" + v for k, v in _CMP.items()}


def _quote(name: str) -> str:
    return '"' + name.replace("\\", "\\5c").replace('"', "\\22") + '"'


# ------------------------------------------------------------------------------ types
class Type:
    """An LLVM type (interned: equal types are the same object, so == is identity)."""

    __slots__ = ("__weakref__", "_pointer", "text")
    null = "zeroinitializer"
    is_pointer = False

    def __str__(self):
        return self.text

    def __repr__(self):
        return f"<irtext type {self.text}>"

    def as_pointer(self, addrspace: int = 0):
        if addrspace:
            raise NotImplementedError("address spaces")
        p = self._pointer
        if p is None:
            p = self._pointer = PointerType(self)
        return p

    def __call__(self, value):
        return Constant(self, value)

    def format_constant(self, value) -> str:
        return str(value)


class _IntType(Type):
    __slots__ = ("width",)
    null = "0"

    def format_constant(self, value) -> str:
        if value is True or value is False:
            return "true" if value else "false"
        return str(int(value))

    @property
    def intrinsic_name(self) -> str:
        return self.text


_INTS: dict = {}


def IntType(bits: int):     # (llvmlite's names, for its interface)
    t = _INTS.get(bits)
    if t is None:
        t = _INTS[bits] = object.__new__(_IntType)
        t.text, t._pointer, t.width = f"i{bits}", None, bits
    return t


class _DoubleType(Type):
    __slots__ = ()
    null = "0.0"
    intrinsic_name = "f64"

    def format_constant(self, value) -> str:
        return f"0x{int.from_bytes(_DOUBLE.pack(value), 'little'):016x}"


_DOUBLE_TYPE = object.__new__(_DoubleType)
_DOUBLE_TYPE.text, _DOUBLE_TYPE._pointer = "double", None


def DoubleType():
    return _DOUBLE_TYPE


class _VoidType(Type):
    __slots__ = ()


_VOID = object.__new__(_VoidType)
_VOID.text, _VOID._pointer = "void", None


def VoidType():
    return _VOID


class PointerType(Type):
    """A typed pointer (printed `T*`, as llvmlite prints them)."""

    __slots__ = ("pointee",)
    null = "null"
    is_pointer = True
    is_opaque = False

    def __init__(self, pointee):
        self.pointee, self._pointer = pointee, None
        self.text = f"{pointee.text}*"

    @property
    def intrinsic_name(self) -> str:
        return f"p0{self.pointee.intrinsic_name}"


_VECTORS: dict = {}


class _VectorType(Type):
    __slots__ = ("count", "element")

    @property
    def elements(self):
        return (self.element,) * self.count

    def __len__(self):
        return self.count

    @property
    def intrinsic_name(self) -> str:
        return f"v{self.count}{self.element.intrinsic_name}"

    def format_constant(self, value) -> str:
        if not isinstance(value, (list, tuple)):
            value = (value,) * self.count
        elif len(value) != self.count:
            raise ValueError(f"wrong constant size for {self.text}: got {len(value)}")
        e = self.element
        return "<" + ", ".join(
            f"{v.type.text} {v.ref}" if isinstance(v, Value) else
            f"{e.text} {e.null if v is None else e.format_constant(v)}"
            for v in value) + ">"


def VectorType(element, count: int):
    key = (element, count)
    t = _VECTORS.get(key)
    if t is None:
        t = _VECTORS[key] = object.__new__(_VectorType)
        t.text, t._pointer = f"<{count} x {element.text}>", None
        t.element, t.count = element, count
    return t


_STRUCTS: dict = {}


class _StructType(Type):
    __slots__ = ("elements",)

    def __len__(self):
        return len(self.elements)

    def __iter__(self):
        return iter(self.elements)

    def format_constant(self, value) -> str:
        if len(value) != len(self.elements):
            raise ValueError(f"wrong constant size for {self.text}: got {len(value)}")
        return "{" + ", ".join(
            f"{v.type.text} {v.ref}" if isinstance(v, Value) else
            f"{e.text} {e.null if v is None else e.format_constant(v)}"
            for e, v in zip(self.elements, value)) + "}"


def LiteralStructType(elements, packed: bool = False):
    if packed:
        raise NotImplementedError("packed structs")
    key = tuple(elements)
    t = _STRUCTS.get(key)
    if t is None:
        t = _STRUCTS[key] = object.__new__(_StructType)
        t.text, t._pointer = "{" + ", ".join(e.text for e in key) + "}", None
        t.elements = key
    return t


_FUNCTION_TYPES: dict = {}


class _FunctionType(Type):
    __slots__ = ("args", "return_type", "var_arg")


def FunctionType(return_type, args, var_arg: bool = False):
    if var_arg:
        raise NotImplementedError("variadic functions")
    key = (return_type, tuple(args))
    t = _FUNCTION_TYPES.get(key)
    if t is None:
        t = _FUNCTION_TYPES[key] = object.__new__(_FunctionType)
        t.return_type, t.args, t.var_arg, t._pointer = return_type, key[1], False, None
        t.text = f"{return_type.text} ({', '.join(a.text for a in key[1])})"
    return t


# ----------------------------------------------------------------------------- values
class Value:
    """A value: its type and its text as an operand (`%".12"`, `@"f"`, `1`)."""

    __slots__ = ("ref", "type")

    def __init__(self, type_, ref: str):
        self.type, self.ref = type_, ref

    def get_reference(self) -> str:
        return self.ref

    def __str__(self):
        return f"{self.type.text} {self.ref}"

    def __repr__(self):
        return f"<irtext {self.type.text} {self.ref}>"


class Constant(Value):
    """A constant: `Constant(type, None)` is the type's zero (llvmlite's meaning)."""

    __slots__ = ("constant",)

    def __init__(self, type_, value):
        self.type, self.constant = type_, value
        self.ref = type_.null if value is None else type_.format_constant(value)


class _Attributes(set):
    """A function's or an argument's attributes (printed sorted, as llvmlite does)."""

    __slots__ = ()


class Argument(Value):
    __slots__ = ("attributes",)

    def __init__(self, type_, ref: str):
        self.type, self.ref, self.attributes = type_, ref, _Attributes()

    def add_attribute(self, attr: str) -> None:
        self.attributes.add(attr)

    def declaration(self) -> str:
        if self.attributes:
            return f"{self.type.text} {' '.join(sorted(self.attributes))} {self.ref}"
        return f"{self.type.text} {self.ref}"


class _ReturnValue:
    __slots__ = ("type",)

    def __init__(self, type_):
        self.type = type_


class Block:
    """A basic block: its label and its instructions' lines."""

    __slots__ = ("function", "is_terminated", "lines", "name", "ref", "terminator")

    def __init__(self, function, name: str):
        self.function, self.name, self.ref = function, name, f'%"{name}"'
        self.lines: list = []
        self.is_terminated = False
        self.terminator = None

    @property
    def parent(self):
        return self.function

    @property
    def module(self):
        return self.function.module

    @property
    def instructions(self):
        return self.lines


class GlobalVariable(Value):
    __slots__ = ("align", "global_constant", "initializer", "linkage", "module", "name",
                 "value_type")

    def __init__(self, module, type_, name: str, addrspace: int = 0):
        if addrspace:
            raise NotImplementedError("address spaces")
        self.module, self.name, self.value_type = module, name, type_
        self.type, self.ref = type_.as_pointer(), "@" + _quote(name)
        self.initializer, self.linkage, self.global_constant, self.align = \
            None, "", False, None
        module._add(self)

    def __str__(self):
        linkage = self.linkage or ("external" if self.initializer is None else "")
        out = [linkage + " " if linkage else "",
               "constant " if self.global_constant else "global ", self.value_type.text]
        if self.initializer is not None:
            if self.initializer.type is not self.value_type:
                raise TypeError(f"got initializer of type {self.initializer.type} for "
                                f"global value type {self.value_type}")
            out.append(" " + self.initializer.ref)
        elif linkage not in ("external", "extern_weak"):
            out.append(" undef")
        if self.align is not None:
            out.append(f", align {self.align}")
        return f"{self.ref} = {''.join(out)}\n"


class Function(Value):
    """A function: declared, or defined once it has a block."""

    __slots__ = ("_names", "args", "attributes", "blocks", "calling_convention", "ftype",
                 "linkage", "module", "name", "return_value")

    def __init__(self, module, ftype, name: str):
        self.module, self.name, self.ftype = module, name, ftype
        self.type, self.ref = ftype.as_pointer(), "@" + _quote(name)
        new = module._next
        self.args = tuple(Argument(t, f'%".{new()}"') for t in ftype.args)
        self.blocks: list = []
        self.linkage, self.calling_convention = "", ""
        self.attributes = _Attributes()
        self.return_value = _ReturnValue(ftype.return_type)
        self._names: dict = {}
        module._add(self)

    @property
    def function_type(self):
        return self.ftype

    @property
    def parent(self):
        return self.module

    @property
    def entry_basic_block(self):
        return self.blocks[0]

    @property
    def basic_blocks(self):
        return self.blocks

    @property
    def is_declaration(self) -> bool:
        return not self.blocks

    def _name(self, name: str) -> str:
        """A local name from `name` (made unique in the function, as llvmlite makes it:
        name, name.1, name.2, ...), or a fresh one."""
        if not name:
            return f".{self.module._next()}"
        if '"' in name or "\\" in name:
            name = name.replace("\\", "\\5c").replace('"', "\\22")
        n = self._names.get(name)
        if n is None:
            self._names[name] = 0
            return name
        while True:
            n += 1
            self._names[name] = n
            out = f"{name}.{n}"
            if out not in self._names:
                self._names[out] = 0
                return out

    def append_basic_block(self, name: str = ""):
        block = Block(self, self._name(name))
        self.blocks.append(block)
        return block

    def __str__(self):
        ret = self.ftype.return_type.text
        linkage = self.linkage + " " if self.linkage else ""
        attrs = " " + " ".join(sorted(self.attributes)) if self.attributes else ""
        if not self.blocks:
            args = ", ".join(a.type.text for a in self.args)
            return f"declare {linkage}{ret} {self.ref}({args}){attrs}\n"
        args = ", ".join(a.declaration() for a in self.args)
        out = [f"define {linkage}{ret} {self.ref}({args}){attrs}\n{{\n"]
        for block in self.blocks:
            name = block.name
            out.append(f"{name}:\n" if _simple(name) else f'"{name}":\n')
            if block.lines:
                out.append("  " + "\n  ".join(map(str, block.lines)) + "\n")
        out.append("}\n")
        return "".join(out)


_simple = re.compile(r"[-a-zA-Z$._][-a-zA-Z$._0-9]*$").match   # (a label unquoted)


class Module:
    """A module: its globals (functions and variables) in the order they were made."""

    def __init__(self, name: str = ""):
        self.name = name
        self.triple = "unknown-unknown-unknown"
        self.data_layout = ""
        self.globals: dict = {}
        self._next = itertools.count(1).__next__

    def _add(self, value) -> None:
        if value.name in self.globals:
            raise NameError(f"duplicate global {value.name!r}")
        self.globals[value.name] = value

    def get_global(self, name: str):
        return self.globals[name]

    def declare_intrinsic(self, intrinsic: str, tys=(), fnty=None):
        """llvmlite's declare_intrinsic, for the one-type intrinsics rvm declares."""
        if fnty is None:
            if len(tys) != 1:
                raise NotImplementedError(f"{intrinsic} of {len(tys)} types")
            ty = tys[0]
            fnty = FunctionType(ty, [ty, ty] if intrinsic == "llvm.pow" else [ty])
        name = ".".join([intrinsic] + [t.intrinsic_name for t in tys])
        fn = self.globals.get(name)
        return fn if fn is not None else Function(self, fnty, name)

    def __str__(self):
        head = f'; ModuleID = "{self.name}"\ntarget triple = "{self.triple}"\n' \
            f'target datalayout = "{self.data_layout}"\n\n'
        return head + "\n".join(map(str, self.globals.values()))

    __repr__ = __str__


# ------------------------------------------------------------- lines made later on
class _Phi(Value):
    __slots__ = ("incomings",)

    def add_incoming(self, value, block) -> None:
        self.incomings.append((value, block))

    def __str__(self):
        incoming = ", ".join(f"[{v.ref}, {b.ref}]" for v, b in self.incomings)
        return f"{self.ref} = phi {self.type.text} {incoming}"


class _Switch:
    __slots__ = ("cases", "default", "value")

    def add_case(self, value, block) -> None:
        if not isinstance(value, Value):
            value = Constant(self.value.type, value)
        self.cases.append((value, block))

    def __str__(self):
        cases = " ".join(f"{v.type.text} {v.ref}, label {b.ref}" for v, b in self.cases)
        return f"switch {self.value.type.text} {self.value.ref}, label " \
            f"{self.default.ref} [{cases}]"


# ---------------------------------------------------------------------------- builder
class _Goto:
    __slots__ = ("block", "builder", "old")

    def __init__(self, builder, block):
        self.builder, self.block = builder, block

    def __enter__(self):
        b = self.builder
        self.old = b.block
        if self.block.is_terminated:        # before its terminator
            b.block = self.block
            b._at(len(self.block.lines) - 1)
        else:
            b.position_at_end(self.block)

    def __exit__(self, *exc):
        self.builder.position_at_end(self.old)


class _IfThen:
    __slots__ = ("builder", "end", "pred")

    def __init__(self, builder, pred):
        self.builder, self.pred = builder, pred

    def __enter__(self):
        b = self.builder
        fn = b.block.function
        then, self.end = fn.append_basic_block(), fn.append_basic_block()
        b.cbranch(self.pred, then, self.end)
        b.position_at_end(then)
        return self.end

    def __exit__(self, *exc):
        b = self.builder
        if not b.block.is_terminated:
            b.branch(self.end)
        b.position_at_end(self.end)


def _binop(op: str):
    def method(self, lhs, rhs, name="", flags=()):
        ref = self._ref(name)
        ty = lhs.type
        if rhs.type is not ty:
            raise ValueError(f"Operands must be the same type, got ({ty}, {rhs.type})")
        head = op if not flags else op + " " + " ".join(flags)
        self._emit(f"{ref} = {head} {ty.text} {lhs.ref}, {rhs.ref}")
        return Value(ty, ref)
    method.__name__ = op
    return method


def _cast(op: str):
    def method(self, value, typ, name=""):
        if value.type is typ:
            return value
        ref = self._ref(name)
        self._emit(f"{ref} = {op} {value.type.text} {value.ref} to {typ.text}")
        return Value(typ, ref)
    method.__name__ = op
    return method


def _compare(kind: str, table: dict):
    def method(self, cmpop, lhs, rhs, name="", flags=()):
        op = table.get(cmpop, cmpop)
        ty = lhs.type
        if rhs.type is not ty:
            raise ValueError(f"Operands must be the same type, got ({ty}, {rhs.type})")
        out = VectorType(IntType(1), ty.count) if isinstance(ty, _VectorType) else _I1
        ref = self._ref(name)
        head = kind if not flags else kind + " " + " ".join(flags)
        self._emit(f"{ref} = {head} {op} {ty.text} {lhs.ref}, {rhs.ref}")
        return Value(out, ref)
    return method


_I1 = IntType(1)
_I32 = IntType(32)


class IRBuilder:
    """llvmlite's IRBuilder, writing each instruction's text into its block."""

    def __init__(self, block=None):
        self.block = None
        self._next = None
        self._emit = None
        if block is not None:
            self.position_at_end(block)

    # ---------------------------------------------------------------- position
    @property
    def basic_block(self):
        return self.block

    @property
    def function(self):
        return self.block.function

    @property
    def module(self):
        return self.block.function.module

    def position_at_end(self, block) -> None:
        self.block = block
        self._next = block.function.module._next
        self._emit = block.lines.append

    def _at(self, index: int) -> None:
        """Insert from lines[index] on (goto_block on a terminated block)."""
        lines = self.block.lines
        self._next = self.block.function.module._next
        at = [index]

        def emit(text):
            lines.insert(at[0], text)
            at[0] += 1
        self._emit = emit

    def position_at_start(self, block) -> None:
        self.block = block
        self._at(0)

    def goto_block(self, block):
        return _Goto(self, block)

    def goto_entry_block(self):
        return _Goto(self, self.block.function.entry_basic_block)

    def append_basic_block(self, name: str = ""):
        return self.block.function.append_basic_block(name)

    def if_then(self, pred, likely=None):
        if likely is not None:
            raise NotImplementedError("branch weights")
        return _IfThen(self, pred)

    def _ref(self, name: str) -> str:
        if name:
            return f'%"{self.block.function._name(name)}"'
        return f'%".{self._next()}"'

    def _terminate(self, text) -> None:
        block = self.block
        if block.is_terminated:
            raise AssertionError("the block is terminated already")
        self._emit(text)
        block.is_terminated = True
        block.terminator = text

    # --------------------------------------------------------------- arithmetic
    add, sub, mul = _binop("add"), _binop("sub"), _binop("mul")
    sdiv, srem, udiv, urem = _binop("sdiv"), _binop("srem"), _binop("udiv"), _binop("urem")
    fadd, fsub, fmul = _binop("fadd"), _binop("fsub"), _binop("fmul")
    fdiv, frem = _binop("fdiv"), _binop("frem")
    and_, or_, xor = _binop("and"), _binop("or"), _binop("xor")
    shl, lshr, ashr = _binop("shl"), _binop("lshr"), _binop("ashr")

    def not_(self, value, name=""):
        return self.xor(value, Constant(value.type, -1), name=name)

    def neg(self, value, name=""):
        return self.sub(Constant(value.type, 0), value, name=name)

    def fneg(self, arg, name="", flags=()):
        ref = self._ref(name)
        head = "fneg" if not flags else "fneg " + " ".join(flags)
        self._emit(f"{ref} = {head} {arg.type.text} {arg.ref}")
        return Value(arg.type, ref)

    icmp_signed = _compare("icmp", _ICMP_S)
    icmp_unsigned = _compare("icmp", _ICMP_U)
    fcmp_ordered = _compare("fcmp", _FCMP_O)
    fcmp_unordered = _compare("fcmp", _FCMP_U)

    def select(self, cond, lhs, rhs, name="", flags=()):
        ty = lhs.type
        if rhs.type is not ty:
            raise ValueError(f"select of ({ty}, {rhs.type})")
        ref = self._ref(name)
        head = "select" if not flags else "select " + " ".join(flags)
        self._emit(f"{ref} = {head} {cond.type.text} {cond.ref}, {ty.text} {lhs.ref}, "
                   f"{ty.text} {rhs.ref}")
        return Value(ty, ref)

    trunc, zext, sext = _cast("trunc"), _cast("zext"), _cast("sext")
    fptrunc, fpext, bitcast = _cast("fptrunc"), _cast("fpext"), _cast("bitcast")
    fptoui, uitofp = _cast("fptoui"), _cast("uitofp")
    fptosi, sitofp = _cast("fptosi"), _cast("sitofp")
    ptrtoint, inttoptr = _cast("ptrtoint"), _cast("inttoptr")

    # ------------------------------------------------------------------- memory
    def alloca(self, typ, size=None, name=""):
        ref = self._ref(name)
        if size is None:
            self._emit(f"{ref} = alloca {typ.text}")
        else:
            if not isinstance(size, Value):
                size = Constant(_I32, size)
            self._emit(f"{ref} = alloca {typ.text}, {size.type.text} {size.ref}")
        return Value(typ.as_pointer(), ref)

    def load(self, ptr, name="", align=None, typ=None):
        ty = ptr.type.pointee if typ is None else typ
        ref = self._ref(name)
        if align is None:
            self._emit(f"{ref} = load {ty.text}, {ptr.type.text} {ptr.ref}")
        else:
            self._emit(f"{ref} = load {ty.text}, {ptr.type.text} {ptr.ref}, align {align}")
        return Value(ty, ref)

    def store(self, value, ptr, align=None):
        pt = ptr.type
        if pt.pointee is not value.type:
            raise TypeError(f"cannot store {value.type} to {pt}: mismatching types")
        if align is None:
            self._emit(f"store {value.type.text} {value.ref}, {pt.text} {ptr.ref}")
        else:
            self._emit(f"store {value.type.text} {value.ref}, {pt.text} {ptr.ref}, "
                       f"align {align}")

    def load_atomic(self, ptr, ordering, align, name="", typ=None):
        ty = ptr.type.pointee if typ is None else typ
        ref = self._ref(name)
        self._emit(f"{ref} = load atomic {ty.text}, {ptr.type.text} {ptr.ref} {ordering}, "
                   f"align {align}")
        return Value(ty, ref)

    def store_atomic(self, value, ptr, ordering, align):
        if ptr.type.pointee is not value.type:
            raise TypeError(f"cannot store {value.type} to {ptr.type}: mismatching types")
        self._emit(f"store atomic {value.type.text} {value.ref}, {ptr.type.text} "
                   f"{ptr.ref} {ordering}, align {align}")

    def gep(self, ptr, indices, inbounds=False, name="", source_etype=None):
        source = ptr.type.pointee if source_etype is None else source_etype
        ty = source
        for i in indices[1:]:
            ty = ty.elements[i.constant] if isinstance(ty, _StructType) else ty.element
        out = ty.as_pointer()
        ref = self._ref(name)
        op = "getelementptr inbounds" if inbounds else "getelementptr"
        idx = ", ".join(f"{i.type.text} {i.ref}" for i in indices)
        self._emit(f"{ref} = {op} {source.text}, {ptr.type.text} {ptr.ref}, {idx}")
        return Value(out, ref)

    # ---------------------------------------------------------------- aggregates
    def extract_value(self, agg, idx, name=""):
        idx = idx if isinstance(idx, (tuple, list)) else (idx,)
        ty = agg.type
        for i in idx:
            ty = ty.elements[i]
        ref = self._ref(name)
        self._emit(f"{ref} = extractvalue {agg.type.text} {agg.ref}, "
                   f"{', '.join(map(str, idx))}")
        return Value(ty, ref)

    def insert_value(self, agg, value, idx, name=""):
        idx = idx if isinstance(idx, (tuple, list)) else (idx,)
        ty = agg.type
        for i in idx:
            ty = ty.elements[i]
        if value.type is not ty:
            raise TypeError(f"Can only insert {ty} at {list(idx)} in {agg.type}: "
                            f"got {value.type}")
        ref = self._ref(name)
        self._emit(f"{ref} = insertvalue {agg.type.text} {agg.ref}, {ty.text} {value.ref}, "
                   f"{', '.join(map(str, idx))}")
        return Value(agg.type, ref)

    def extract_element(self, vector, idx, name=""):
        ref = self._ref(name)
        self._emit(f"{ref} = extractelement {vector.type.text} {vector.ref}, "
                   f"{idx.type.text} {idx.ref}")
        return Value(vector.type.element, ref)

    def insert_element(self, vector, value, idx, name=""):
        if value.type is not vector.type.element:
            raise TypeError(f"value needs to be of type {vector.type.element} "
                            f"not {value.type}.")
        ref = self._ref(name)
        self._emit(f"{ref} = insertelement {vector.type.text} {vector.ref}, "
                   f"{value.type.text} {value.ref}, {idx.type.text} {idx.ref}")
        return Value(vector.type, ref)

    def phi(self, typ, name="", flags=()):
        if flags:
            raise NotImplementedError("phi flags")
        phi = _Phi(typ, self._ref(name))
        phi.incomings = []
        self._emit(phi)
        return phi

    # ------------------------------------------------------------ control flow
    def branch(self, target):
        self._terminate(f"br label {target.ref}")

    def cbranch(self, cond, truebr, falsebr):
        self._terminate(f"br {cond.type.text} {cond.ref}, label {truebr.ref}, "
                        f"label {falsebr.ref}")

    def switch(self, value, default):
        s = _Switch()
        s.value, s.default, s.cases = value, default, []
        self._terminate(s)
        return s

    def ret(self, value):
        self._terminate(f"ret {value.type.text} {value.ref}")

    def ret_void(self):
        self._terminate("ret void")

    def unreachable(self):
        self._terminate("unreachable")

    def call(self, fn, args, name="", cconv=None, tail=False, fastmath=(), attrs=(),
             arg_attrs=None):
        if cconv or tail or fastmath or attrs or arg_attrs:
            raise NotImplementedError("call options")
        fnty = fn.function_type
        params = fnty.args
        if len(args) != len(params):
            raise TypeError(f"{fn.ref} takes {len(params)} arguments, got {len(args)}")
        for k, (a, ty) in enumerate(zip(args, params)):
            if a.type is not ty:
                raise TypeError(f"Type of #{k + 1} arg mismatch: {ty} != {a.type}")
        ret = fnty.return_type
        text = f"call {ret.text} {fn.ref}({', '.join(f'{a.type.text} {a.ref}' for a in args)})"
        if ret is _VOID:
            self._emit(text)
            return Value(ret, "")
        ref = self._ref(name)
        self._emit(f"{ref} = {text}")
        return Value(ret, ref)
