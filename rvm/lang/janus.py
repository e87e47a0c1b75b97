"""Janus, the classic reversible language (Lutz & Derby 1982; Yokoyama & Glück 2007), on rvm.

A small recursive-descent parser reads a `.ja` file into the syntax trees of rvm's Python
subset, every node placed at its Janus line and column, and the Python subset's compiler
does the rest: a Janus procedure becomes the same bytecode as the Python function written
by hand, and errors point into the `.ja` file. The dialect is jana's (see docs/janus.md):

    procedure main()        main's variables are the program's state: they are the
        int n               parameters of the compiled `main`, start at zero (or at
        int a[6]            their initialisers) and are printed, sorted by name, when
        stack s             `rvm run prog.ja` ends
        ...

A stack is an int64 array: element 0 holds the size, elements 1.. the values, bottom
first, and every cell above the top is zero (so push and pop are exchanges).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
from typing import NamedTuple

import attrs
import numpy as np

from ..core.errors import CompileError
from ..core.program import Imm, Program, Reg
from ..engines import explain as _explain
from ..engines.explain import names_at

INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1
STACK_CAPACITY = 1 << 16    # elements of a stack made by main or by `local stack s = nil`
KEYWORDS = {"procedure", "int", "stack", "bool", "true", "false", "if", "then", "else", "fi",
            "from", "do", "loop", "until", "push", "pop", "local", "delocal", "call",
            "uncall", "error", "skip", "empty", "top", "size", "show", "print", "printf",
            "nil", "iterate", "struct", "constant"}
# the fork's sized integers: (bits, signed); a variable of one wraps as the fork's do
SIZED = {f"{k}{n}": (n, k == "i") for k in "iu" for n in (8, 16, 32, 64)}
SIZED["char"] = (8, False)      # PyJanus's char: an unsigned byte
UNSUPPORTED = {"string": "the string type"}
_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\n]+) | (?P<comment>//[^\n]*|/\*.*?\*/) | (?P<open>/\*)
  | (?P<number>0[xX][0-9a-fA-F]+|0[bB][01]+|\d+) | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<define>\#define\b)
  | (?P<op><=>|<<|>>|\+=|-=|\^=|<=|>=|!=|&&|\|\||[-+*/%&|^<>=!()\[\]{},?:.])
""", re.S | re.X)
# binary operators by precedence level, loosest first (jana's table: note that & | ^ bind
# more loosely than comparisons; the fork's << and >> bind between comparisons and + -)
_LEVELS = [("&&", "||"), ("&", "|", "^"), ("<=", "<", ">=", ">", "=", "!="), ("<<", ">>"),
           ("+", "-"), ("*", "/", "%")]
_BINOPS = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.FloorDiv, "%": ast.Mod,
           "&": ast.BitAnd, "|": ast.BitOr, "^": ast.BitXor}
_COMPARE = {"<=": ast.LtE, "<": ast.Lt, ">=": ast.GtE, ">": ast.Gt, "=": ast.Eq,
            "!=": ast.NotEq}
_MODOPS = {"+=": ast.Add, "-=": ast.Sub, "^=": ast.BitXor}


class Token(NamedTuple):
    kind: str
    text: str
    line: int
    col: int            # 0-based, as in Python's ast


@dataclasses.dataclass(eq=False)
class Decl:
    """A declared variable: type "int", "array" or "stack"; dims of an array (None where
    the size is not given); an initial value in main (an int or a list), else None;
    `flexible` for a parameter `int a[]`, which takes the dimensions it is given (the
    fork passes a two-dimensional array to one) and `indexed`, the number of indices
    the body used on it; `width` a sized integer's (bits, signed), else None. A variable
    of a struct type (PyJanus), or an array of them, has type "struct"; it stands for one
    variable per field, named `p.x` (an int, or an array), `a.x` for an array `a` of
    structs (an array of the field's values, one dimension more for an array field)."""
    name: str
    type: str
    dims: tuple = ()
    init: object = None
    token: Token | None = None
    flexible: bool = False
    indexed: int = 0
    width: tuple | None = None
    written: bool = False               # changed by an update, swap, push/pop or call
    struct: str | None = None           # a struct's type name (type "struct")
    constant: bool = False              # the fork's `constant`: never changed
    char: bool = False                  # PyJanus's char (a u8 that printf's %s shows)


def tokenize(text: str, path: str) -> list[Token]:
    lines = text.splitlines()
    out, pos, line, start = [], 0, 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup == "open":
            what = "an unterminated /* comment" if m else f"unexpected character " \
                f"{text[pos]!r}"
            raise CompileError(what, path, line, pos - start + 1, _line(lines, line))
        if m.lastgroup not in ("space", "comment"):
            out.append(Token(m.lastgroup, m.group(), line, pos - start))
        for k in range(m.start(), m.end()):
            if text[k] == "\n":
                line, start = line + 1, k + 1
        pos = m.end()
    out.append(Token("end", "", line, pos - start))
    return out


def _macros(toks: list[Token], path: str, lines: list[str]) -> list[Token]:
    """PyJanus's `#define NAME tokens` (to the end of the line): a later NAME stands for
    the tokens (`#define code int`, `#define codes code[]`), expanded where it is used.
    A define of one number (`#define N 10`, `#define M -1`) stays for the parser, which
    reads it as a constant."""
    macros: dict[str, list[Token]] = {}
    out: list[Token] = []
    k = 0

    def expand(t: Token, depth: int, root: str = "") -> list[Token]:
        if t.kind != "name" or t.text not in macros:
            return [t]
        if depth > 50:
            raise CompileError(f"#define {root} expands without end", path, t.line,
                               t.col + 1, _line(lines, t.line))
        return [x for b in macros[t.text] for x in expand(
            Token(b.kind, b.text, t.line, t.col), depth + 1, root or t.text)]
    while k < len(toks):
        t = toks[k]
        if t.kind == "define" and k + 1 < len(toks) and toks[k + 1].kind == "name":
            name, j = toks[k + 1], k + 2
            while toks[j].kind != "end" and toks[j].line == t.line:
                j += 1
            body = toks[k + 2:j]
            number = [b.kind for b in body] == ["number"] or (
                [b.text for b in body[:1]] == ["-"] and [b.kind for b in body] == ["op",
                                                                                 "number"])
            if body and not number:
                macros[name.text] = body
                k = j
                continue
            macros.pop(name.text, None)
        out += expand(t, 0)
        k += 1
    return out


def _boolean(e) -> bool:
    """Is e one of Janus's boolean expressions?"""
    return isinstance(e, (ast.Compare, ast.BoolOp)) or getattr(e, "janus_bool", False) or \
        (isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.Not))


def _number(text: str) -> int:
    """A number token: decimal, or the fork's hexadecimal 0xFF and binary 0b101."""
    return int(text, 0) if text[:2].lower() in ("0x", "0b") else int(text)


def _line(lines: list[str], n: int) -> str:
    return lines[n - 1] if 0 < n <= len(lines) else ""


def _at(node, tok: Token):
    node.lineno, node.col_offset = tok.line, tok.col
    node.end_lineno, node.end_col_offset = tok.line, tok.col + max(len(tok.text), 1)
    return node


def _name(name: str, tok: Token) -> ast.Name:
    return _at(ast.Name(name, ast.Load()), tok)


def _call(name: str, args: list, tok: Token, keywords=()) -> ast.Call:
    return _at(ast.Call(_name(name, tok), args, list(keywords)), tok)


def _stmt(node, tok: Token):
    return _at(node, tok)


class Parser:
    """Janus source -> Python-subset syntax trees (one FunctionDef per procedure)."""

    def __init__(self, text: str, path: str, modular: int | None = None,
                 checked: bool = True, stack_capacity: int = STACK_CAPACITY):
        self.path, self.lines = path, text.splitlines()
        self.capacity = stack_capacity  # of main's stacks and local ones
        self.checked = checked          # overflow checks on unbounded ints (jana's)
        self.toks, self.k = _macros(tokenize(text, path), path, self.lines), 0
        self.toks += [self.toks[-1]] * 3        # lookahead past the end sees the end
        self.modular = (modular, True) if modular else None    # -m N: every int N bits
        self.words = {t.text for t in self.toks}
        # the procedures the program defines (a call to any other is an error when it runs)
        self.defined = {b.text for a, b in zip(self.toks, self.toks[1:])
                        if a.kind == "name" and a.text == "procedure" and b.kind == "name"}
        self.called = {b.text for a, b in zip(self.toks, self.toks[1:])
                       if a.kind == "name" and a.text in ("call", "uncall")}
        self.fresh = 0
        self.defines: dict[str, int] = {}
        self.scopes: list[dict[str, Decl]] = []
        self.procedures: dict[str, list[Decl]] = {}
        self.main: list[Decl] | None = None
        self.notes: dict[int, list[tuple]] = {}     # line -> what its statements check
        self.calls: list[tuple[Token, list[tuple[Token, str]]]] = []    # checked at the end
        # (callee, the variable each argument passes by reference, else None)
        self.passes: list[tuple[Token, list]] = []
        # an int variable passed twice to one call: (callee, variable, positions)
        self.twice: list[tuple[Token, Token, int, int]] = []
        self.arg_decls: dict[Token, Decl] = {}
        self.structs: dict[str, list[tuple]] = {}    # name -> [(field, dims, width, token)]
        self.lv_decl: Decl | None = None            # the variable the last lvalue names
        self.expanded: dict[Decl, list[Decl]] = {}
        self.nested: dict[tuple[str, str], str] = {}     # (struct, field) -> its struct
        self.substructs: dict[str, Decl] = {}           # `d.entries`: a struct field
        self.stops: list[tuple] = []                # the enclosing blocks' end words
        self.hoisted: list | None = None            # ancillas of an update's shifts
        # a constant passed to a call by reference: (callee, argument, position)
        self.constants: list[tuple[Token, Token, int]] = []

    def note(self, tok: Token, *what) -> None:
        self.notes.setdefault(tok.line, []).append(what)

    def text(self, start: int) -> str:
        """The source text of tokens start..k-1 (an expression, for messages)."""
        first, last = self.toks[start], self.toks[self.k - 1]
        if first.line == last.line:
            return _line(self.lines, first.line)[first.col:last.col + len(last.text)]
        return " ".join(t.text for t in self.toks[start:self.k])

    # ------------------------------------------------------------------ tokens
    @property
    def tok(self) -> Token:
        return self.toks[self.k]

    def error(self, message: str, tok: Token | None = None, hint: str = "") -> CompileError:
        tok = tok or self.tok
        return CompileError(message, self.path, tok.line, tok.col + 1,
                            _line(self.lines, tok.line), hint)

    def at(self, *texts: str) -> bool:
        t = self.tok
        return t.kind in ("op", "name") and t.text in texts

    def take(self, text: str | None = None, kind: str | None = None) -> Token:
        t = self.tok
        if (text is not None and (t.text != text or t.kind not in ("op", "name"))) or \
                (kind is not None and t.kind != kind):
            want = repr(text) if text else {"name": "a name", "number": "a number",
                                             "string": "a string"}.get(kind, kind)
            got = "the end of the file" if t.kind == "end" else repr(t.text)
            raise self.error(f"expected {want}, found {got}")
        self.k += 1
        return t

    def identifier(self) -> Token:
        t = self.tok
        if t.kind == "name" and t.text in UNSUPPORTED:
            raise self.error(f"{UNSUPPORTED[t.text]} not supported", t,
                             "see docs/janus.md for the supported language")
        if t.kind != "name" or t.text in KEYWORDS:
            got = "the end of the file" if t.kind == "end" else repr(t.text)
            raise self.error(f"expected a name, found {got}")
        self.k += 1
        return t

    # ------------------------------------------------------------------ declarations
    def program(self) -> list[ast.FunctionDef]:
        functions = []
        while self.tok.kind != "end":
            if self.tok.kind == "define":
                self.define()
                continue
            if self.at("struct"):
                self.struct_def()
                continue
            if self.at(*UNSUPPORTED):
                raise self.error(f"{UNSUPPORTED[self.tok.text]} not supported",
                                 hint="see docs/janus.md for the supported language")
            start = self.take("procedure")
            name = self.identifier()
            if name.text in ("rot", "irot", "neg"):
                raise self.error(f"a procedure may not be named {name.text}: it is a built-in "
                                 "statement of rvm's Python subset, which Janus compiles to",
                                 name, "rename the procedure")
            if name.text in self.procedures or (name.text == "main" and self.main is not None):
                raise self.error(f"procedure {name.text!r} is defined twice", name)
            try:
                functions.append(self.procedure(start, name))
            except CompileError as e:
                functions.append(self.uncalled(start, name, e))
        if self.main is None:
            raise CompileError("no procedure main() in the program", self.path, 1, 1,
                               _line(self.lines, 1), "a Janus program runs procedure main()")
        self.check_calls()
        self.check_twice()
        for fn in functions:            # dimensions are known now (see check_calls)
            params = self.main if fn.name == "main" else self.procedures[fn.name]
            for a, d in zip(fn.args.args, self.flat(params)):
                a.annotation = self.annotation(d)
        return functions

    # ------------------------------------------------------------------ structs
    def struct_def(self) -> None:
        """`struct name { int x, int a[3], u8 c }` (PyJanus): fields of int type, or
        one-dimensional int arrays of a constant size."""
        self.take("struct")
        name = self.identifier()
        if name.text in self.structs:
            raise self.error(f"struct {name.text!r} is defined twice", name)
        self.take("{")
        fields: list[tuple] = []
        while True:
            t = self.tok
            nested = t.kind == "name" and t.text in self.structs    # (PyJanus)
            if not (nested or self.at("int") or (t.kind == "name" and t.text in SIZED)):
                raise self.error(f"a struct field is an int or an int array, not "
                                 f"{t.text!r}", t)
            width = None if nested else SIZED.get(t.text)
            self.take()
            f = self.take(kind="name")
            dims = []
            while self.at("["):
                self.take("[")
                dims.append(self.size())
                self.take("]")
            if len(dims) > 1:
                raise self.error("an array of structs has one dimension" if nested else
                                 "a struct's array field has one dimension", f)
            if any(f.text == g[0] for g in fields):
                raise self.error(f"field {f.text!r} is declared twice", f)
            fields.append((f.text, tuple(dims), width, f))
            if nested:
                self.nested[(name.text, f.text)] = t.text
            if not self.at(","):
                break
            self.take(",")
        self.take("}")
        self.structs[name.text] = fields

    def fields(self, d: Decl) -> list[Decl]:
        """The variables a struct variable (or array of structs) stands for."""
        if d in self.expanded:
            return self.expanded[d]
        out = self.expanded[d] = []
        for f, fdims, width, ftok in self.structs[d.struct]:
            dims = d.dims + fdims
            inner = self.nested.get((d.struct, f))
            if inner is not None:           # a struct field: its fields, one level down
                if d.init is not None:
                    raise self.error(f"an initialiser of {d.name}, whose {d.struct} has a "
                                     "struct field, is not supported: update its fields",
                                     d.token)
                sub = Decl(f"{d.name}.{f}", "struct", dims, None, d.token,
                           flexible=d.flexible, struct=inner)
                self.substructs[sub.name] = sub
                out += self.fields(sub)
                continue
            if len(dims) > 2:
                raise self.error(f"{d.name}.{f} would have {len(dims)} dimensions: arrays "
                                 "have one or two", ftok)
            init = None
            if isinstance(d.init, dict):
                init = d.init[f]
            elif isinstance(d.init, list):
                init = [e[f] for e in d.init]
            out.append(Decl(f"{d.name}.{f}", "array" if dims else "int", dims, init,
                            d.token, flexible=d.flexible, width=width))
        return out

    def flat(self, decls: list[Decl]) -> list[Decl]:
        """Declarations with each struct variable replaced by its fields' variables."""
        out = []
        for d in decls:
            out += self.fields(d) if d.type == "struct" else [d]
        return out

    def scope_of(self, decls: list[Decl]) -> dict[str, Decl]:
        return {d.name: d for d in decls + [f for d in decls if d.type == "struct"
                                            for f in self.fields(d)]}

    def struct_value(self, tree, d: str, name: Token, what: str):
        """An initialiser of one struct: {x, {a0, a1}, ...}, padded with zeros."""
        fields = self.structs[d]
        if not isinstance(tree, list):
            raise self.error(f"{what} is a struct: give {{...}} with its fields", name)
        if len(tree) > len(fields):
            raise self.error(f"{len(tree)} values for the {len(fields)} fields of {d}", name)
        out = {}
        for k, (f, fdims, width, _) in enumerate(fields):
            v = tree[k] if k < len(tree) else _zeros(list(fdims))
            if fdims:
                _, v = self.fit(v, list(fdims), name)
            elif isinstance(v, list):
                raise self.error(f"field {f} of {d} is an int, given {{...}}", name)
            out[f] = _wrap_values(v, width) if width else v
        return out

    def member(self, name: Token, decl: Decl):
        """After a struct variable's name: `.f`, `.f[j]`, and for an array of structs
        `[i].f`, `[i].f[j]`. Returns (the node, the field's variable)."""
        idx = []
        if decl.dims:
            if not self.at("["):
                raise self.error(f"{name.text} is an array of {decl.struct}: index it "
                                 f"({name.text}[i].field)", name)
            self.take("[")
            idx.append(self.expression())
            self.take("]")
        if not self.at("."):
            raise self.error(f"{name.text}{'[...]' if idx else ''} is a struct: name a "
                             f"field ({name.text}{'[i]' if idx else ''}.field)", name)
        self.take(".")
        f = self.take(kind="name")
        path, struct = name.text, decl.struct
        while (struct, f.text) in self.nested:  # d.entries[i].k: a struct field's field
            sub = self.substructs[f"{path}.{f.text}"]
            path, struct = sub.name, sub.struct
            if len(sub.dims) > len(decl.dims):
                if not self.at("["):
                    raise self.error(f"{path} is an array of {struct}: index it "
                                     f"({path}[i].field)", f)
                self.take("[")
                idx.append(self.expression())
                self.take("]")
            if not self.at("."):
                raise self.error(f"{path} is a {struct}: name a field ({path}.field)", f)
            self.take(".")
            f = self.take(kind="name")
        field = self.lookup(Token("name", f"{path}.{f.text}", f.line, f.col)) if any(
            f.text == g[0] for g in self.structs[struct]) else None
        if field is None:
            raise self.error(f"struct {struct} has no field {f.text!r}", f)
        while self.at("["):
            self.take("[")
            idx.append(self.expression())
            self.take("]")
        node = _name(field.name, name)
        if not idx:
            return node, field
        if len(idx) != len(field.dims):
            raise self.error(f"{path}.{f.text} has {len(field.dims)} "
                             f"dimension{'s' if len(field.dims) > 1 else ''}, indexed with "
                             f"{len(idx)}" if not decl.dims else
                             f"{f.text} of {name.text}[i] is an array: index it "
                             f"({name.text}[i].{f.text}[j])", f)
        field.indexed = len(idx)
        index = idx[0] if len(idx) == 1 else _at(ast.Tuple(idx, ast.Load()), name)
        return _at(ast.Subscript(node, index, ast.Load()), name), field

    def check_calls(self) -> None:
        """Every call names a procedure and passes what its parameters declare. A
        parameter `int a[]` takes a two-dimensional array (as the fork's does) when its
        body indexes it with two indices or a call passes it one; that spreads along
        calls that pass it on, so this runs until nothing changes."""
        changed = True
        while changed:
            changed = False
            for name, args in self.calls:
                params = self.procedures.get(name.text)
                if params is None:
                    raise self.error(f"procedure {name.text!r} is not defined", name)
                if len(args) != len(params):
                    raise self.error(f"{name.text} takes {len(params)} argument"
                                     f"{'s' if len(params) != 1 else ''}, given {len(args)}",
                                     name)
                for (tok, typ), p in zip(args, params):
                    if typ in ("struct", "element") or p.type == "struct":
                        a = self.lookup_any(tok)
                        if p.type == "struct" and typ in ("struct", "element") and \
                                a.struct == p.struct and len(p.dims) == (
                                    0 if typ == "element" else len(a.dims)):
                            continue
                        got = f"{tok.text}[i], a {a.struct}" if typ == "element" else \
                            _a(typ) if typ != "struct" else _struct(a)
                        raise self.error(f"argument {p.name} of {name.text} is "
                                         f"{_struct(p) if p.type == 'struct' else _a(p.type)}"
                                         f", but {tok.text} is {got}", tok)
                    if typ == p.type == "array":
                        a = self.lookup_any(tok)
                        if len(a.dims) == len(p.dims):
                            continue
                        for x, y in ((p, a), (a, p)):
                            if x.flexible and not x.indexed and len(y.dims) == 2:
                                x.dims, changed = (None, None), True
                        if len(a.dims) == len(p.dims):
                            continue
                    elif typ == p.type:
                        continue
                    want = "a 2-D array" if p.type == "array" and len(p.dims) == 2 \
                        else _a(p.type)
                    got = "a 2-D array" if typ == "array" and \
                        len(self.lookup_any(tok).dims) == 2 else _a(typ)
                    raise self.error(f"argument {p.name} of {name.text} is {want}, but "
                                     f"{tok.text} is {got}", tok)

    def check_twice(self) -> None:
        """An int variable passed for two parameters of one call (the fork's generated
        object code passes `heap_counter` as both the heap's counter and `this`): jana
        binds both to the variable and refuses, when it runs, a statement that changes
        one of them while reading the other. rvm passes the second in a fresh variable
        holding its value, checked unchanged after the call, and refuses the call here
        unless the procedure (and whatever it passes them to) changes neither."""
        changed = True
        while changed:                  # a parameter passed on to one that is changed
            changed = False
            for name, refs in self.passes:
                for d, p in zip(refs, self.procedures.get(name.text, ())):
                    if d is not None and p.written and not d.written:
                        d.written = changed = True
        for name, a, i in self.constants:
            p = self.procedures[name.text][i] if name.text in self.procedures else None
            if p is not None and p.written:
                raise self.error(f"{a.text} is a constant, passed to {name.text}, which "
                                 f"changes its parameter {p.name}", a)
        for name, a, i, j in self.twice:
            params = self.procedures[name.text]
            for p in (params[i], params[j]):
                if p.written:
                    raise self.alias(_name(a.text, a), a.text, f"{a.text} is passed twice "
                                     f"to {name.text}, which changes its parameter "
                                     f"{p.name}", "pass distinct variables, or a copy")

    def lookup_any(self, tok: Token) -> Decl:
        return self.arg_decls[tok]

    def define(self) -> None:
        self.take(kind="define")
        name = self.identifier()
        neg = self.tok.text == "-" and self.take("-") is not None
        value = _number(self.take(kind="number").text)
        self.defines[name.text] = -value if neg else value

    def procedure(self, start: Token, name: Token) -> ast.FunctionDef:
        self.take("(")
        params: list[Decl] = []
        is_main = name.text == "main"
        if not self.at(")"):
            if is_main:
                raise self.error("main takes no parameters; declare its variables in its "
                                 "body")
            params.append(self.declaration(param=True))
            while self.at(","):
                self.take(",")
                params.append(self.declaration(param=True))
        self.take(")")
        if is_main:
            self.scopes = [{}]              # a size or initial value may use earlier ones
            while self.at_declaration():
                params.append(self.declaration(param=False))
                self.scopes[0].update(self.scope_of(params[-1:]))
            self.main = params
        else:
            self.procedures[name.text] = params
        seen: set[str] = set()
        for d in params:
            if d.name in seen:
                raise self.error(f"{d.name!r} is declared twice", d.token)
            seen.add(d.name)
        self.scopes = [self.scope_of(params)]
        body = self.size_checks(self.flat(params)) + \
            self.statements(("procedure", "#define"))
        args = [_at(ast.arg(d.name, None), d.token) for d in self.flat(params)]
        fn = ast.FunctionDef(name=name.text, args=ast.arguments(
            posonlyargs=[], args=args, vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
            defaults=[]), body=body or [_stmt(ast.Pass(), name)], decorator_list=[],
            returns=None, type_comment=None)
        _at(fn, start)
        last = self.toks[self.k - 1]
        fn.end_lineno = last.line
        return fn

    def uncalled(self, start: Token, name: Token, e: CompileError) -> ast.FunctionDef:
        """A procedure that reads a variable it does not declare, and that no call names
        (the fork's matrixmult.ja keeps such a one): jana, the fork and PyJanus look a
        variable up when the statement runs, so they run the program. rvm keeps the
        procedure (for --entry) with a body that is that error when it runs; anywhere
        else the error is reported when compiling."""
        if name.text in self.called or name.text == "main" or \
                not re.match(r"variable '.*' is not declared$", e.message):
            raise e
        self.note(start, "undeclared", name.text, e.message, e.line)
        while not (self.at("procedure", "struct") or self.tok.kind in ("end", "define")):
            self.k += 1
        params = self.procedures[name.text]
        args = [_at(ast.arg(d.name, None), d.token) for d in self.flat(params)]
        fn = ast.FunctionDef(name=name.text, args=ast.arguments(
            posonlyargs=[], args=args, vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None,
            defaults=[]), body=[_stmt(ast.Assert(_at(ast.Constant(False), start)), start)],
            decorator_list=[], returns=None, type_comment=None)
        return _at(fn, start)

    def size_checks(self, params: list[Decl]) -> list:
        """`int x[3]` as a parameter: the array passed must have 3 elements (jana's check,
        made when the procedure starts, and when it ends if it is uncalled)."""
        out = []
        for d in params:
            if d.type == "array" and d.dims[0] is not None:
                t = d.token
                self.note(t, "size", d.name, d.dims[0])
                test = _at(ast.Compare(_call("len", [_name(d.name, t)], t), [ast.Eq()],
                                       [_at(ast.Constant(d.dims[0]), t)]), t)
                out.append(_stmt(ast.Assert(test), t))
        return out

    def annotation(self, d: Decl):
        text = "int" if d.type == "int" else "Array[int, 2]" if len(d.dims) == 2 \
            else "Array[int]"
        return _at(ast.Constant(text), d.token)

    def at_declaration(self) -> bool:
        """At `int`, `stack`, or a sized integer type (u8 .. i64) followed by a name (or
        by `[]` and a name)."""
        t = self.tok
        if self.at("constant"):
            return True
        if t.kind == "end":
            return False
        j = self.k + 1
        while self.toks[j].text == "[" and self.toks[j + 1].text == "]":
            j += 2
        return self.at("int", "stack") or (t.kind == "name" and (
            t.text in SIZED or t.text in self.structs) and self.toks[j].kind == "name")

    def declaration(self, param: bool) -> Decl:
        t = self.tok
        if not self.at_declaration():
            raise self.error("expected a declaration: int x, int a[n] or stack s")
        constant = self.at("constant") and self.take() is not None
        if constant and not (self.at("int") or self.tok.text in SIZED):
            raise self.error("a constant is an int or an int array: constant int x = 1")
        kind = self.take().text
        typed = 0           # `int[] a` (PyJanus: `#define codes int[]`, `codes a`)
        while kind != "stack" and self.at("[") and self.toks[self.k + 1].text == "]":
            self.k += 2
            typed += 1
        name = self.identifier()
        if kind in self.structs:
            return self.struct_declaration(kind, name, t, param)
        dims: list = []
        while kind != "stack" and self.at("["):
            self.take("[")
            dims.append(None if self.at("]") else self.size(param))
            self.take("]")
        dims = dims or [None] * typed
        if len(dims) > 2:
            raise self.error("arrays have one or two dimensions", name)
        init = None
        if not param and self.at("="):           # main's initialisers (an extension)
            self.take("=")
            if dims:
                dims, init = self.fit(self.tree(kind, len(dims)), dims, name)
            else:
                init = self.main_value()
        if not param and any(d is None for d in dims):
            raise self.error(f"give the size of {name.text}: int {name.text}[n]", name)
        typ = "stack" if kind == "stack" else "array" if dims else "int"
        width = SIZED.get(kind) or (self.modular if kind == "int" else None)
        if init is not None and width:
            init = _wrap_values(init, width)
        return Decl(name.text, typ, tuple(dims), init, t if param else name,
                    flexible=param and bool(dims) and all(d is None for d in dims),
                    width=SIZED.get(kind), constant=constant, char=kind == "char")

    def struct_declaration(self, kind: str, name: Token, t: Token, param: bool) -> Decl:
        """`pair p`, `node pool[5]`, `node pool[]` (a parameter), `pair p = {1, 2}`,
        `node pool[] = {{1, 2}, {3, 4}}` (main)."""
        dims: list = []
        while self.at("["):
            self.take("[")
            dims.append(None if self.at("]") else self.size(param))
            self.take("]")
        if len(dims) > 1:
            raise self.error("an array of structs has one dimension", name)
        init = None
        if not param and self.at("="):
            self.take("=")
            tree = self.tree()
            if dims:
                if not isinstance(tree, list):
                    raise self.error(f"{name.text} is an array: give {{...}}", name)
                n = len(tree) if dims[0] is None else dims[0]
                if len(tree) > n:
                    raise self.error(f"{len(tree)} values for {n} elements", name)
                dims = [n]
                init = [self.struct_value(e, kind, name, f"{name.text}[{k}]")
                        for k, e in enumerate(tree + [[]] * (n - len(tree)))]
            else:
                init = self.struct_value(tree, kind, name, name.text)
        if not param and any(d is None for d in dims):
            raise self.error(f"give the size of {name.text}: {kind} {name.text}[n]", name)
        return Decl(name.text, "struct", tuple(dims), init, t if param else name,
                    flexible=param and bool(dims) and dims[0] is None, struct=kind)

    def main_value(self) -> int:
        """A value in main's declarations: an expression of constants and the variables
        declared before it, computed here (they hold their initial values)."""
        t = self.tok
        e = self.expression()
        env = {d.name: d.init if d.init is not None else _zeros(d.dims) if d.type == "array"
               else [] if d.type == "stack" else 0 for d in self.scopes[0].values()}
        try:
            return _evaluate(e, env)
        except (ZeroDivisionError, IndexError, TypeError, KeyError):
            raise self.error("this value of main's declarations cannot be computed from "
                             "the constants and variables declared before it", t) from None

    def size(self, param: bool = True) -> int:
        t = self.tok
        if not param and not (self.toks[self.k + 1].text == "]" and (
                t.kind == "number" or t.text in self.defines)):
            value = self.main_value()
        elif t.kind == "name" and t.text in self.defines:
            self.k += 1
            value = self.defines[t.text]
        else:
            value = _number(self.take(kind="number").text)
        if value < 1:
            raise self.error("an array has at least one element", t)
        return value

    def tree(self, kind: str = "int", ndims: int = 0):
        """An initialiser: a constant or {tree, tree, ...} (as nested lists); for a
        one-dimensional char array, a string (its bytes and a 0, as PyJanus's)."""
        if self.tok.kind == "string":
            t = self.take()
            if kind != "char" or ndims != 1:
                raise self.error("a string initialises a one-dimensional char array", t)
            text = _unquote(t.text)
            if any(ord(c) > 255 for c in text):
                raise self.error("a char holds a byte: this string has a character "
                                 "beyond 255", t)
            return [ord(c) for c in text] + [0]
        if not self.at("{"):
            neg = self.at("-") and self.take("-") is not None
            return self.constant_value() * (-1 if neg else 1)
        self.take("{")
        items = [self.tree()]
        while self.at(","):
            self.take(",")
            items.append(self.tree())
        self.take("}")
        return items

    def fit(self, tree, dims: list, name: Token) -> tuple[list, list]:
        """The dimensions (a size not given is the initialiser's) and the values, padded
        with zeros where the initialiser has fewer (as the fork does)."""
        shape, t = [], tree
        for d in dims:
            if not isinstance(t, list):
                raise self.error(f"{name.text} has {len(dims)} dimension"
                                 f"{'s' if len(dims) > 1 else ''}: give {{...}} for each",
                                 name)
            shape.append(len(t) if d is None else d)
            t = t[0]

        def pad(t, dims):
            if not dims:
                if isinstance(t, list):
                    raise self.error(f"the initialiser of {name.text} has more levels of "
                                     "{...} than it has dimensions", name)
                return t
            if not isinstance(t, list):
                raise self.error(f"{name.text} has {len(shape)} dimensions: give {{...}} "
                                 "for each", name)
            if len(t) > dims[0]:
                raise self.error(f"{len(t)} values for {dims[0]} elements", name)
            return [pad(x, dims[1:]) for x in t] + [_zeros(dims[1:])] * (dims[0] - len(t))
        return shape, pad(tree, shape)

    def constant_value(self) -> int:
        t = self.tok
        if t.kind == "name" and t.text in self.defines:
            self.k += 1
            return self.defines[t.text]
        return _number(self.take(kind="number").text)

    # ------------------------------------------------------------------ statements
    def lookup(self, tok: Token) -> Decl:
        for scope in reversed(self.scopes):
            if tok.text in scope:
                return scope[tok.text]
        raise self.error(f"variable {tok.text!r} is not declared", tok)

    def statements(self, stop: tuple) -> list:
        out = []
        self.stops.append(stop)
        while not self.at(*stop) and self.tok.kind not in ("end", "define"):
            out += self.statement()
        self.stops.pop()
        return out

    def statement(self) -> list:
        t = self.tok
        if t.kind != "name":
            raise self.error(f"expected a statement, found {t.text!r}")
        method = getattr(self, "stmt_" + t.text, None) if t.text in KEYWORDS else None
        if method is not None:
            return method()
        if t.text in UNSUPPORTED:
            raise self.error(f"{UNSUPPORTED[t.text]} not supported", t,
                             "see docs/janus.md for the supported language")
        if t.text in KEYWORDS:
            raise self.error(f"expected a statement, found {t.text!r}")
        target = self.lvalue()
        decl = self.lv_decl
        decl.written = True
        op = self.tok
        if op.text == "<=>" and decl.type == "struct":
            return self.struct_swap(t, decl, op)
        if op.text == "<=>":
            self.take()
            t2 = self.tok
            other = self.lvalue()
            self.lv_decl.written = True
            for side, tok, d in ((target, t, decl), (other, t2, self.lv_decl)):
                if isinstance(side, ast.Name) and d.type != "int":
                    raise self.error(f"swapping {d.type}s is not supported", tok,
                                     "swap their elements" if d.type != "struct" else
                                     "swap their fields")
            self.aliases(op, [target, other])
            swap = ast.Assign([_at(ast.Tuple([target, other], ast.Store()), t)],
                              _at(ast.Tuple([other, target], ast.Load()), t))
            return [_stmt(swap, op)]
        if op.text not in _MODOPS:
            raise self.error(f"expected +=, -=, ^= or <=>, found {op.text!r}", op,
                             "Janus updates a variable with +=, -= or ^=, or swaps with <=>")
        self.take()
        k = self.k
        self.hoisted = []
        try:
            value = self.expression()
            hoisted = self.hoisted
        finally:
            self.hoisted = None
        reads = self.aliases(op, [target], value)
        if reads:           # a[i][j] += ... a[k][l] ...: the element written is not one read
            out = self.checked_2d(op, target, value, reads, decl, self.text(k))
        else:
            out = self.update(op, target, value, decl, self.text(k))
        for name, init, at in reversed(hoisted):
            block = _call("ancilla", [], at, [ast.keyword(name, init)])
            out = [_stmt(ast.With([ast.withitem(block, None)], out), op)]
        return out

    def update(self, op: Token, target, value, decl: Decl, text: str) -> list:
        width = decl.width or self.modular
        if width is not None and width[0] < 64:
            return self.wrapped(op, target, value, width)
        if width is None and self.checked and op.text != "^=":
            return self.checked_update(op, target, value, text)
        return [_stmt(ast.AugAssign(target, _MODOPS[op.text](), value), op)]

    def checked_2d(self, op: Token, target, value, reads: list, decl: Decl,
                   text: str) -> list:
        """An update of an element of a two-dimensional array whose expression reads
        other elements of it (LDU[i][j] -= LDU[i][k] * LDU[k][j]), as jana's fork and
        PyJanus run it: refused at run time, in either direction, when the element
        written is one read. A check that the indices differ (`i != i or j != k`, the
        fork's comparison of the index lists) comes first; the expression is computed
        once into an ancilla, which the update adds (undone at the block's end, where the
        expression has its first value again since it does not read the element)."""
        out = []
        for read in reads:
            differ = [_at(ast.Compare(copy.deepcopy(a), [ast.NotEq()], [copy.deepcopy(b)]),
                          op) for a, b in zip(target.slice.elts, read.slice.elts)]
            test = differ[0] if len(differ) == 1 else _at(ast.BoolOp(ast.Or(), differ), op)
            out.append(_stmt(ast.Assert(test), op))
        holder = self.temporary("alias")
        body = self.update(op, target, _name(holder, op), decl, text)
        block = _call("ancilla", [], op, [ast.keyword(holder, value)])
        return out + [_stmt(ast.With([ast.withitem(block, None)], body), op)]

    def checked_update(self, op: Token, target, value, text: str) -> list:
        """x += e (or -=) on jana's unbounded integers, held in int64: the update stops
        with an overflow error where its result would leave int64, in either direction.
        A check before it (`(x + e > x) = (e > 0)`, written so that nothing in it can
        overflow unnoticed: int64's wrap-around makes x + e smaller than x exactly when
        it overflows upwards) stops a forward overflow before it happens; one after it
        (`(x - e < x) = (e > 0)`) stops the inverse, x -= e, run backwards. With a
        constant e each is one comparison (`x <= MAX - e`). A compound e is computed
        once into an ancilla."""
        sign = 1 if op.text == "+=" else -1

        def num(v):
            return _at(ast.Constant(v), op)

        def here():
            node = copy.deepcopy(target)
            node.ctx = ast.Load()
            return node

        def check(test):
            return _stmt(ast.Assert(_at(test, op)), op)

        def compare(a, cmp, b):
            return _at(ast.Compare(a, [cmp()], [b]), op)
        update = _stmt(ast.AugAssign(target, _MODOPS[op.text](), value), op)
        c = _constant(value)
        if c is not None:
            if c == 0 or not INT_MIN < c <= INT_MAX:
                return [update]             # (an out-of-range constant is refused later)
            self.note(op, "overflow", _janus(target), text, op.text, c)
            c *= sign
            if c > 0:       # before: x <= MAX - c; after: MIN + c <= x (the constant first)
                pre = compare(here(), ast.LtE, num(INT_MAX - c))
                post = compare(num(INT_MIN + c), ast.LtE, here())
            else:
                pre = compare(here(), ast.GtE, num(INT_MIN - c))
                post = compare(num(INT_MAX + c), ast.GtE, here())
            return [check(pre), update, check(post)]
        # e itself where it is a name, or where it reads the target's array (a[i] += a[j]:
        # the update keeps its check that i != j), else an ancilla holding e
        direct = isinstance(value, ast.Name) or _base(target) in {n.id for n in
                                                                  _reads(value)}
        holder = value.id if isinstance(value, ast.Name) else None if direct else \
            self.temporary("overflow")
        self.note(op, "overflow", _janus(target), text, op.text, holder)

        def v():
            return copy.deepcopy(value) if holder is None or direct else _name(holder, op)
        grow, shrink = (ast.Add, ast.Sub) if sign > 0 else (ast.Sub, ast.Add)
        up, down = (ast.Gt, ast.Lt) if sign > 0 else (ast.Lt, ast.Gt)
        # before, (x + v > x) = (v > 0); after, ((x - v < x) ^ (v > 0)) = 0 (so explain
        # tells them apart: ASSERT.EQ of two registers, of a register and 0)
        pre = compare(compare(_at(ast.BinOp(here(), grow(), v()), op), up, here()), ast.Eq,
                      compare(v(), ast.Gt, num(0)))
        post = compare(_at(ast.BinOp(compare(_at(ast.BinOp(here(), shrink(), v()), op), down,
                                             here()), ast.BitXor(),
                                     compare(v(), ast.Gt, num(0))), op), ast.Eq, num(0))
        if direct:
            return [check(pre), update, check(post)]
        body = [check(pre), _stmt(ast.AugAssign(copy.deepcopy(target), _MODOPS[op.text](),
                                                v()), op), check(post)]
        block = _call("ancilla", [], op, [ast.keyword(holder, value)])
        return [_stmt(ast.With([ast.withitem(block, None)], body), op)]

    def struct_swap(self, t: Token, decl: Decl, op: Token) -> list:
        """p <=> q of two structs of one type: their int fields swapped."""
        self.take("<=>")
        t2 = self.identifier()
        other = self.lookup(t2)
        if other.type != "struct" or other.struct != decl.struct or other.dims:
            raise self.error(f"{t.text} is a {decl.struct}: swap it with another "
                             f"{decl.struct}", t2)
        if other is decl:
            raise self.alias(_name(t.text, t2), t.text, f"{t.text} is swapped with itself")
        out = []
        for a, b in zip(self.fields(decl), self.fields(other)):
            a.written = b.written = True
            if a.type != "int":
                raise self.error(f"swapping structs with an array field ({a.name}) is not "
                                 "supported", t, "swap their elements")
            swap = ast.Assign([_at(ast.Tuple([_at(ast.Name(a.name, ast.Store()), t),
                                              _at(ast.Name(b.name, ast.Store()), t2)],
                                             ast.Store()), t)],
                              _at(ast.Tuple([_name(b.name, t2), _name(a.name, t)],
                                            ast.Load()), t))
            out.append(_stmt(swap, op))
        return out

    def temporary(self, prefix: str) -> str:
        """A name no token of the program uses."""
        while True:
            self.fresh += 1
            name = f"{prefix}{self.fresh}"
            if name not in self.words:
                return name

    def wrapped(self, op: Token, target, value, width: tuple) -> list:
        """An update of a sized integer (or of any int with -m N): the result wraps to
        the type's range as the fork's do, reversibly. With M = 2^bits and lo the least
        value, x += e is: d = e mod M (an ancilla); if x - lo >= M - d then x -= M - d
        else x += d fi x - lo < d. x -= e is x += -e; x ^= e xors e's low bits (sign-
        extended for a signed type)."""
        bits, signed = width
        M, lo = 1 << bits, -(1 << (bits - 1)) if signed else 0

        def num(v):
            return _at(ast.Constant(v), op)

        def binop(a, o, b):
            return _at(ast.BinOp(a, o(), b), op)

        def here(ctx):
            node = copy.deepcopy(target)
            node.ctx = ctx
            return node
        if op.text == "^=":
            low = binop(value, ast.BitAnd, num(M - 1))
            if signed:
                low = binop(binop(low, ast.BitXor, num(M >> 1)), ast.Sub, num(M >> 1))
            return [_stmt(ast.AugAssign(target, ast.BitXor(), low), op)]
        if op.text == "-=":
            value = _at(ast.UnaryOp(ast.USub(), value), op)
        d = self.temporary("wrap")

        def mod():
            return binop(copy.deepcopy(value), ast.Mod, num(M))

        def offset():
            return binop(here(ast.Load()), ast.Sub, num(lo)) if lo else here(ast.Load())
        entry = _at(ast.Compare(offset(), [ast.GtE()], [binop(num(M), ast.Sub,
                                                               _name(d, op))]), op)
        exit_ = _at(ast.Compare(offset(), [ast.Lt()], [_name(d, op)]), op)
        down = _stmt(ast.AugAssign(here(ast.Store()), ast.Sub(),
                                   binop(num(M), ast.Sub, _name(d, op))), op)
        up = _stmt(ast.AugAssign(here(ast.Store()), ast.Add(), _name(d, op)), op)
        test = _at(ast.Tuple([entry, exit_], ast.Load()), op)
        body = [_stmt(ast.If(test, [down], [up]), op),
                _stmt(ast.Expr(_call("delocal", [], op, [ast.keyword(d, mod())])), op)]
        block = _call("ancilla", [], op, [ast.keyword(d, mod())])
        return [_stmt(ast.With([ast.withitem(block, None)], body), op)]

    def aliases(self, op: Token, targets: list, value=None) -> list:
        """jana's alias rule: an update (value given) or a swap may not read what it
        changes, neither in an index nor in the update's expression; undoing it needs
        both unchanged. Refused here when it shows in the text; where it depends on the
        values (`a[i] <=> a[j]`, `a[i] += a[j]`: are i and j equal?) the compiled check
        fails at run time and `explain` words it as jana does. Returns the reads of other
        elements by an update of a two-dimensional array's element, which the caller
        checks (checked_2d)."""
        what = "update" if value is not None else "swap"
        changed = {_base(t) for t in targets}
        for t in targets:
            for n in _reads(t.slice) if isinstance(t, ast.Subscript) else ():
                if n.id in changed:
                    raise self.alias(n, n.id, f"the index of {_janus(t)} reads {n.id}, "
                                     f"which the {what} changes")
        if value is None:
            a, b = targets
            if ast.dump(a) == ast.dump(b):
                raise self.alias(b, _base(a), f"{_janus(a)} is swapped with itself")
            if isinstance(a, ast.Subscript) and isinstance(b, ast.Subscript) and \
                    _base(a) == _base(b):
                self.note(op, "alias", _base(a), _janus(a), [_janus(b)])
            return []
        t, name = targets[0], _base(targets[0])
        reads = []
        for n in _reads(value):
            if n.id != name:
                continue
            if isinstance(t, ast.Name):
                raise self.alias(n, name, f"the expression of the update reads {name}, "
                                 "which the update changes")
            read = getattr(n, "parent", n)
            if not isinstance(read, ast.Subscript) or read.value is not n:
                raise self.alias(n, name, f"the index {_janus(read)} in the expression "
                                 f"reads {name}, whose element the update changes")
            inner = next((m for m in _reads(read.slice) if m.id == name), None)
            if inner is not None:
                raise self.alias(inner, name, f"the index of {_janus(read)} in the "
                                 f"expression reads {name}, whose element the update "
                                 "changes")
            if ast.dump(read.slice) == ast.dump(t.slice):
                raise self.alias(n, name, f"{_janus(read)} is the element the update "
                                 "changes")
            reads.append(read)
        if reads:
            self.note(op, "alias", name, _janus(t), [_janus(r) for r in reads])
        # two-dimensional: the frontend checks the indices (the Python subset checks
        # those of a one-dimensional array itself)
        return reads if isinstance(getattr(t, "slice", None), ast.Tuple) else []

    def alias(self, node, name: str, why: str, hint: str = "") -> CompileError:
        tok = Token("name", name, node.lineno, node.col_offset)
        return self.error(f"identifiers {name} and {name} are aliases: {why}", tok, hint or
                          "an update or a swap may not read what it changes: undoing it "
                          "needs its indices and expression unchanged (jana refuses this "
                          "too)")

    def lvalue(self):
        name = self.identifier()
        decl = self.lv_decl = self.lookup(name)
        if decl.constant:
            raise self.error(f"{name.text} is a constant; it cannot be changed", name)
        if decl.type == "struct" and not (self.at("<=>") and not decl.dims):
            node, field = self.member(name, decl)
            self.lv_decl = field
            if isinstance(node, ast.Name) and field.type != "int":
                raise self.error(f"{field.name} is an array; update its elements", name)
            node.ctx = ast.Store()
            return node
        if self.at("["):
            if decl.type != "array":
                raise self.error(f"{name.text} is {_a(decl.type)}, not an array", name)
            index = self.indices(name, decl)
            return _at(ast.Subscript(_name(name.text, name), index, ast.Store()), name)
        if decl.type != "int" and not self.at("<=>"):
            raise self.error(f"{name.text} is {_a(decl.type)}; update "
                             f"{'its elements' if decl.type == 'array' else 'it with push/pop'}",
                             name)
        return _at(ast.Name(name.text, ast.Store()), name)

    def indices(self, name: Token, decl: Decl):
        idx = []
        while self.at("["):
            self.take("[")
            idx.append(self.expression())
            self.take("]")
        if decl.flexible and not decl.indexed and len(idx) == 2 and len(decl.dims) == 1:
            decl.dims = (None, None)            # int a[] given a 2-D array (the fork's)
        if len(idx) != len(decl.dims):
            raise self.error(f"{name.text} has {len(decl.dims)} dimension"
                             f"{'s' if len(decl.dims) > 1 else ''}, indexed with {len(idx)}",
                             name)
        decl.indexed = len(idx)
        return idx[0] if len(idx) == 1 else _at(ast.Tuple(idx, ast.Load()), name)

    def stmt_skip(self) -> list:
        self.take("skip")
        return []

    def stmt_if(self) -> list:
        t = self.take("if")
        k = self.k
        entry = self.expression()
        entry_text = self.text(k)
        self.take("then")
        body = self.statements(("else", "fi"))
        orelse = []
        if self.at("else"):
            self.take("else")
            orelse = self.statements(("fi",))
        fi = self.take("fi")
        k = self.k
        exit_ = self.expression()
        self.note(t, "if", entry_text, self.text(k), fi.line)
        test = _at(ast.Tuple([entry, exit_], ast.Load()), t)
        return [_stmt(ast.If(test, body or [_stmt(ast.Pass(), t)], orelse), t)]

    def stmt_from(self) -> list:
        t = self.take("from")
        k = self.k
        entry = self.expression()
        entry_text = self.text(k)
        first, then = [], []
        if self.at("do"):
            self.take("do")
            first = self.statements(("loop", "until"))
        if self.at("loop"):
            cut = self.take("loop")
            then = [_stmt(ast.Expr(_call("loop", [], cut)), cut)] + \
                self.statements(("until",))
        until = self.take("until")
        k = self.k
        exit_ = self.expression()
        self.note(t, "from", entry_text, self.text(k), until.line)
        if until.line != t.line:
            self.note(until, "from", entry_text, self.text(k), until.line)
        block = _call("from_", [entry], t, [ast.keyword("until", exit_)])
        return [_stmt(ast.With([ast.withitem(block, None)], first + then or
                               [_stmt(ast.Pass(), t)]), t)]

    def stmt_iterate(self) -> list:
        """PyJanus's `iterate int i = a by s to b ... end` (`by s` optional, 1): i is a
        local taking a, a + s, ... up to b, the body run for each (none where a = b + s);
        a, s and b are computed once, and must have the same values at the end (the
        loop runs backwards from b to a). It is Janus's
            local int i = a  from i = a loop body; i += s  until i = b + s  delocal ...
        with a check on each pass that i has not stepped past b (a range b - a that s
        does not divide, or s = 0, would loop forever)."""
        t = self.take("iterate")
        if not self.at_declaration() or self.at("stack"):
            raise self.error("expected int after iterate: iterate int i = a to b ... end")
        self.take()
        name = self.identifier()
        if any(name.text in sc for sc in self.scopes):
            raise self.error(f"{name.text!r} is already declared here", name)
        self.take("=")
        texts, bounds = [], []

        def bound():
            k = self.k
            bounds.append(self.expression())
            texts.append(self.text(k))
        bound()
        if self.at("by"):
            self.take("by")
            bound()
        else:
            bounds.append(_at(ast.Constant(1), t))
            texts.append("1")
        self.take("to")
        bound()
        self.scopes.append({name.text: Decl(name.text, "int", token=name)})
        body = self.statements(("end",))
        self.scopes.pop()
        self.take("end")
        self.note(t, "iterate", name.text, *texts)

        holders, held = [], []
        for role, e in zip(("start", "step", "end"), bounds):
            if _constant(e) is not None:
                held.append(e)
                continue
            h = self.temporary(f"{name.text}_{role}")
            holders.append((h, e))
            held.append(h)

        def val(x):
            return _name(x, t) if isinstance(x, str) else copy.deepcopy(x)

        def i():
            return _name(name.text, t)

        def cmp(a, op, b):
            return _at(ast.Compare(a, [op()], [b]), t)
        stop = _at(ast.BinOp(val(held[2]), ast.Add(), val(held[1])), t)
        ahead = _at(ast.BoolOp(ast.And(), [cmp(val(held[1]), ast.Gt, _at(ast.Constant(0), t)),
                                           cmp(i(), ast.LtE, val(held[2]))]), t)
        behind = _at(ast.BoolOp(ast.And(), [cmp(val(held[1]), ast.Lt, _at(ast.Constant(0), t)),
                                            cmp(i(), ast.GtE, val(held[2]))]), t)
        guard = _stmt(ast.Assert(_at(ast.BoolOp(ast.Or(), [ahead, behind]), t)), t)
        advance = _stmt(ast.AugAssign(_at(ast.Name(name.text, ast.Store()), t), ast.Add(),
                                      val(held[1])), t)
        loop = _call("from_", [cmp(i(), ast.Eq, val(held[0]))], t,
                     [ast.keyword("until", cmp(i(), ast.Eq, stop))])
        inner = [_stmt(ast.Expr(_call("loop", [], t)), t), guard] + body + [advance]
        out = [_stmt(ast.With([ast.withitem(loop, None)], inner), t),
               _stmt(ast.Expr(_call("delocal", [], t, [ast.keyword(
                   name.text, copy.deepcopy(stop))])), t)]
        out = [_stmt(ast.With([ast.withitem(_call("ancilla", [], t, [ast.keyword(
            name.text, val(held[0]))]), None)], out), t)]
        if holders:
            marks = [_stmt(ast.Expr(_call("delocal", [], t, [ast.keyword(
                h, copy.deepcopy(e)) for h, e in holders])), t)]
            out = [_stmt(ast.With([ast.withitem(_call("ancilla", [], t, [
                ast.keyword(h, e) for h, e in holders]), None)], out + marks), t)]
        return out

    def local_decl(self, keyword: str) -> tuple:
        """After `local` or `delocal`: `int x = e`, `stack s = nil`, or an array `int
        a[e1][e2] = {...}` (sizes any expressions, the initialiser optional and padded
        with zeros; a sized integer type in place of int). Returns (type token, name
        token, size expressions, value: an expression, an initialiser tree or None,
        the value's text)."""
        if not self.at_declaration():
            raise self.error(f"expected int or stack after {keyword}")
        if self.tok.text in self.structs:
            raise self.error(f"a local struct is not supported: declare {self.tok.text} "
                             "variables in main and pass them")
        kind, name = self.take(), self.identifier()
        dims: list = []
        while kind.text != "stack" and self.at("["):
            self.take("[")
            dims.append(None if self.at("]") else self.expression())
            self.take("]")
        if len(dims) > 2:
            raise self.error("arrays have one or two dimensions", name)
        value, k = None, self.k
        if kind.text == "stack":
            self.take("=")
            self.take("nil")
        elif dims:
            if self.at("="):
                self.take("=")
                k = self.k
                value = self.tree(kind.text, len(dims))
            if None in dims:
                if value is None:
                    raise self.error(f"give the size of {name.text}: {kind.text} "
                                     f"{name.text}[n]", name)
                shape, _ = self.fit(value, [None] * len(dims), name)
                dims = [d if d is not None else _at(ast.Constant(n), name)
                        for d, n in zip(dims, shape)]
        else:
            self.take("=")
            k = self.k
            value = self.expression()
        return kind, name, dims, value, self.text(k) if self.k > k else ""

    def stmt_local(self) -> list:
        """`local d1, d2, ... s delocal d1', d2', ...`: nested blocks, d1 outermost (the
        fork's rule), each delocal matched to its local in order."""
        t = self.take("local")
        locs = []
        while True:
            kind, name, dims, value, text = self.local_decl("local")
            if any(name.text in s for s in self.scopes):
                raise self.error(f"{name.text!r} is already declared here", name)
            typ = "stack" if kind.text == "stack" else "array" if dims else "int"
            decl = Decl(name.text, typ, tuple([None] * len(dims)), token=name,
                        width=SIZED.get(kind.text), char=kind.text == "char")
            self.scopes.append({name.text: decl})
            locs.append((kind, name, dims, value, decl))
            if not self.at(","):
                break
            self.take(",")
        body = self.statements(("delocal",))
        end = self.take("delocal")
        dels = []
        for i, (kind, name, dims, _, _) in enumerate(locs):
            if i:
                self.take(",")
            kind2, name2, dims2, final, text = self.local_decl("delocal")
            if name2.text != name.text:
                raise self.error(f"delocal {name2.text} does not match local {name.text} "
                                 f"(line {name.line})", name2)
            if kind2.text != kind.text or len(dims2) != len(dims):
                what = f"{kind.text}{'[]' * len(dims)}"
                raise self.error(f"delocal {kind2.text}{'[]' * len(dims2)} {name2.text}: "
                                 f"{name.text} was declared {what} (line {name.line})", kind2)
            dels.append((final, text))
        for _ in locs:
            self.scopes.pop()
        return self.blocks(t, end, locs, dels, body)

    def stmt_constant(self) -> list:
        """The fork's `constant int c = e` (or an array, `constant int a[2] = {1, 2}`)
        among statements: c holds e's value for the statements that follow it in the
        enclosing block, which may not change it. The fork drops c at the block's end;
        rvm, to undo the block, clears it by computing e again there (an error if the
        block changed what e reads)."""
        t = self.take("constant")
        kind, name, dims, value, text = self.local_decl("constant")
        if kind.text == "stack":
            raise self.error("a constant is an int or an int array", kind)
        if any(name.text in s for s in self.scopes):
            raise self.error(f"{name.text!r} is already declared here", name)
        decl = Decl(name.text, "array" if dims else "int", tuple([None] * len(dims)),
                    token=name, width=SIZED.get(kind.text), constant=True,
                    char=kind.text == "char")
        self.scopes.append({name.text: decl})
        body = self.statements(self.stops[-1])
        self.scopes.pop()
        if decl.type == "int":
            self.note(t, "constant", name.text, text)
        return self.blocks(t, t, [(kind, name, dims, value, decl)],
                           [(copy.deepcopy(value), text)], body, note=decl.type != "int")

    def blocks(self, t: Token, end: Token, locs: list, dels: list, body: list,
               note: bool = True) -> list:
        """Nested ancilla blocks for local (or constant) declarations around body."""
        for (_, name, dims, value, decl), (final, text) in reversed(list(zip(locs, dels))):
            start, finish = [], []
            if decl.type == "stack":
                init = _call("zeros", [_at(ast.Constant(self.capacity + 1), name),
                                       _name("int", name)], name)
                self.note(end, "delocal", name.text, "nil")
            elif decl.type == "array":
                shape = dims[0] if len(dims) == 1 else _at(ast.Tuple(dims, ast.Load()), name)
                init = _call("zeros", [shape, _name("int", name)], name)
                start = self.elements(name, value, ast.Add)
                finish = self.elements(name, final, ast.Sub)
                for where in (t, end):          # the block's FREE is at the local
                    self.note(where, "delocal-array", name.text, text or "{0}")
            else:
                init = value
                if note:
                    self.note(end, "delocal", name.text, text)
                finish = [_stmt(ast.Expr(_call("delocal", [], end,
                                                [ast.keyword(name.text, final)])), end)]
            block = _call("ancilla", [], t, [ast.keyword(name.text, init)])
            body = [_stmt(ast.With([ast.withitem(block, None)], start + body + finish or
                                   [_stmt(ast.Pass(), t)]), t)]
        return body

    def elements(self, name: Token, tree, op) -> list:
        """`a[i] += v` (or -=) for each non-zero value of an initialiser tree."""
        out = []

        def walk(t, idx):
            if isinstance(t, list):
                for k, x in enumerate(t):
                    walk(x, idx + [k])
            elif t:
                index = [_at(ast.Constant(i), name) for i in idx]
                sub = index[0] if len(index) == 1 else _at(ast.Tuple(index, ast.Load()), name)
                target = _at(ast.Subscript(_name(name.text, name), sub, ast.Store()), name)
                out.append(_stmt(ast.AugAssign(target, op(), _at(ast.Constant(t), name)),
                                 name))
        if tree is not None:
            walk(tree, [])
        return out

    def _call_stmt(self, inverse: bool) -> list:
        t = self.take()
        name = self.identifier()
        if name.text == "main":
            raise self.error("main cannot be called", name)
        self.take("(")
        args, typed, values = [], [], []
        refs: list = []
        rows: list = []             # rows of 2-D arrays passed: (variable, array, index)
        while not self.at(")"):
            if args:
                self.take(",")
            k = self.k
            if self.tok.kind == "name" and any(self.tok.text in s for s in self.scopes):
                a = self.identifier()
                decl = self.lookup(a)
                self.arg_decls[a] = decl
                if decl.type == "struct":
                    passed = self.struct_argument(a, decl)
                    if passed is not None:
                        args += passed[0]
                        typed.append((a, passed[1]))
                        refs.append(self.arg_decls[a])
                        continue
                    self.k = k
                elif self.at("[") and decl.type == "array" and len(decl.dims) == 2 and \
                        self.row_argument():
                    self.take("[")
                    index = self.expression()
                    self.take("]")
                    tmp = self.temporary("row")
                    rows.append((tmp, a, index))
                    args.append(_name(tmp, a))
                    self.arg_decls[a] = Decl(tmp, "array", (None,), token=a)
                    typed.append((a, "array"))
                    refs.append(decl)
                    continue
                elif self.at("["):
                    arg = _at(ast.Subscript(_name(a.text, a), self.indices(a, decl),
                                            ast.Load()), a)
                    typ = "int"
                else:
                    arg, typ = _name(a.text, a), decl.type
                if self.at(",", ")") and isinstance(arg, ast.Name) and typ == "int" and \
                        decl in refs:
                    # passed again: by value, in a fresh variable (see check_twice)
                    self.twice.append((name, a, refs.index(decl), len(refs)))
                    tmp = self.temporary("arg")
                    values.append((tmp, arg, a.text))
                    args.append(_name(tmp, a))
                    typed.append((a, typ))
                    refs.append(None)
                    continue
                if self.at(",", ")"):           # a variable or an element: by reference
                    if decl.constant:
                        self.constants.append((name, a, len(refs)))
                    args.append(arg)
                    typed.append((a, typ))
                    refs.append(decl)
                    continue
                self.k = k
            a = self.tok                        # any other expression: by value (the fork)
            value = self.expression()
            tmp = self.temporary("arg")
            values.append((tmp, value, self.text(k)))
            args.append(_name(tmp, a))
            typed.append((a, "int"))
            refs.append(None)
        self.take(")")
        if name.text not in self.defined:
            # jana, its fork and PyJanus look a procedure up when the call runs: a call
            # to one the program does not define is an error only if it is reached
            self.note(t, "undefined", name.text)
            return [_stmt(ast.Assert(_at(ast.Constant(False), name)), t)]
        self.calls.append((name, typed))
        self.passes.append((name, refs))
        self.call_aliases(t, args)
        call = _call(name.text, args, name)
        if inverse:
            call = _at(ast.UnaryOp(ast.Invert(), call), t)
        body = [_stmt(ast.Expr(call), t)]
        for tmp, a, index in reversed(rows):
            body = self.row_block(t, tmp, a, index, args, body)
        for tmp, value, text in reversed(values):
            # passed in a fresh variable that the call must give back unchanged
            self.note(t, "argument", tmp, text, name.text)
            check = _stmt(ast.Expr(_call("delocal", [], t, [ast.keyword(
                tmp, copy.deepcopy(value))])), t)
            block = _call("ancilla", [], t, [ast.keyword(tmp, value)])
            body = [_stmt(ast.With([ast.withitem(block, None)], body + [check]), t)]
        return body

    def row_argument(self) -> bool:
        """At `[e]` after a 2-D array's name, followed by `,` or `)`: a row passed."""
        depth, j = 0, self.k
        while True:
            t = self.toks[j]
            if t.kind == "end":
                return False
            depth += t.text == "[" and t.kind == "op"
            depth -= t.text == "]" and t.kind == "op"
            j += 1
            if depth == 0:
                break
        return self.toks[j].text in (",", ")")

    def row_block(self, t: Token, tmp: str, a: Token, index, args: list, body: list):
        """A row a[i] of a 2-D array passed to an `int x[]` parameter (the fork passes
        the row by reference): its elements are exchanged into a fresh array for the
        call and back after it, so i may not read what the call changes, and another
        argument a[j][k] must be in another row (checked while running)."""
        passed = {_base(x) for x in args if isinstance(x, ast.Name | ast.Subscript)}
        for n in _reads(index):
            if n.id in passed:
                raise self.alias(n, n.id, f"the index of the row {a.text}[{_janus(index)}] "
                                 f"reads {n.id}, which the call is given",
                                 "a row passed is put back by its index after the call")
        checks = []
        for x in args:
            if isinstance(x, ast.Name) and x.id == a.text:
                raise self.alias(x, a.text, f"{a.text} is passed beside its row "
                                 f"{a.text}[{_janus(index)}]")
            if isinstance(x, ast.Subscript) and _base(x) == a.text:
                first = x.slice.elts[0] if isinstance(x.slice, ast.Tuple) else x.slice
                self.note(t, "alias", a.text, f"{a.text}[{_janus(index)}]",
                          [_janus(x)])
                checks.append(_stmt(ast.Assert(_at(ast.Compare(
                    copy.deepcopy(index), [ast.NotEq()], [copy.deepcopy(first)]), t)), t))
        k = self.temporary("col")
        cols = _at(ast.Subscript(_at(ast.Attribute(_name(a.text, a), "shape", ast.Load()),
                                     a), _at(ast.Constant(1), a), ast.Load()), a)

        def exchange():
            cell = _at(ast.Subscript(_name(a.text, a), _at(ast.Tuple(
                [copy.deepcopy(index), _name(k, a)], ast.Load()), a), ast.Store()), a)
            mine = _at(ast.Subscript(_name(tmp, a), _name(k, a), ast.Store()), a)
            swap = _stmt(ast.Assign([_at(ast.Tuple([mine, cell], ast.Store()), t)],
                                    _at(ast.Tuple([copy.deepcopy(cell), copy.deepcopy(mine)],
                                                  ast.Load()), t)), t)
            loop = ast.For(_at(ast.Name(k, ast.Store()), t), _call(
                "range", [copy.deepcopy(cols)], t), [swap], [], None)
            return _stmt(loop, t)
        block = _call("ancilla", [], t, [ast.keyword(tmp, _call(
            "zeros", [copy.deepcopy(cols), _name("int", t)], t))])
        return checks + [_stmt(ast.With([ast.withitem(block, None)],
                                        [exchange()] + body + [exchange()]), t)]

    def struct_argument(self, a: Token, decl: Decl):
        """A struct variable passed by reference: the whole of it (its fields' variables),
        an element of an array of structs (its fields' elements), or one field. Returns
        (the arguments, the type for check_calls), or None for an expression."""
        fields = self.fields(decl)
        if self.at(",", ")"):
            return [_name(f.name, a) for f in fields], "struct"
        k = self.k
        if decl.dims and self.at("["):
            self.take("[")
            index = self.expression()
            self.take("]")
            if self.at(",", ")"):
                if any(len(f.dims) > 1 for f in fields):
                    raise self.error(f"{a.text}[i] has an array field: pass the fields "
                                     "one by one", a)
                return [_at(ast.Subscript(_name(f.name, a), copy.deepcopy(index),
                                          ast.Load()), a) for f in fields], "element"
            self.k = k
        node, field = self.member(a, decl)
        if not self.at(",", ")"):
            return None
        self.arg_decls[a] = field
        return [node], field.type if isinstance(node, ast.Name) else "int"

    def call_aliases(self, t: Token, args: list) -> None:
        """An element passed to a call is exchanged in and back out by its index, which
        may not read what the call passes (by reference); an array may not be passed
        beside its element; two elements of one array are checked to differ."""
        passed = {_base(a) for a in args}
        whole = {a.id for a in args if isinstance(a, ast.Name)}
        hint = ("arguments are passed by reference, and an element passed is put back by "
                "its index after the call: pass distinct variables")
        first: dict[str, ast.Subscript] = {}
        for a in args:
            if not isinstance(a, ast.Subscript):
                continue
            name = _base(a)
            for n in _reads(a.slice):
                if n.id in passed:
                    raise self.alias(n, n.id, f"the index of {_janus(a)} reads {n.id}, "
                                     "which the call is given", hint)
            if name in whole:
                raise self.alias(a.value, name, f"{name} is passed beside its element "
                                 f"{_janus(a)}", hint)
            if name in first and ast.dump(first[name].slice) == ast.dump(a.slice):
                raise self.alias(a.value, name, f"{_janus(a)} is passed twice", hint)
            if name in first:
                self.note(t, "alias", name, _janus(first[name]), [_janus(a)])
            first.setdefault(name, a)

    def stmt_call(self) -> list:
        return self._call_stmt(False)

    def stmt_uncall(self) -> list:
        return self._call_stmt(True)

    def _stack_args(self) -> tuple[Token, Token]:
        self.take("(")
        x = self.identifier()
        if self.lookup(x).type != "int":
            raise self.error(f"{x.text} is {_a(self.lookup(x).type)}; push and pop move an "
                             "int", x)
        self.take(",")
        s = self.identifier()
        if self.lookup(s).type != "stack":
            raise self.error(f"{s.text} is {_a(self.lookup(s).type)}, not a stack", s)
        self.take(")")
        for v in (x, s):
            if self.lookup(v).constant:
                raise self.error(f"{v.text} is a constant; it cannot be changed", v)
        self.lookup(x).written = self.lookup(s).written = True
        return x, s

    def stmt_push(self) -> list:
        t = self.take("push")
        x, s = self._stack_args()
        self.note(t, "push", x.text, s.text)
        return _stack_moves(t, x, s, push=True)

    def stmt_pop(self) -> list:
        t = self.take("pop")
        x, s = self._stack_args()
        self.note(t, "pop", x.text, s.text)
        return _stack_moves(t, x, s, push=False)

    def stmt_error(self) -> list:
        t = self.take("error")
        self.take("(")
        self.note(t, "error", _unquote(self.take(kind="string").text))
        self.take(")")
        return [_stmt(ast.Assert(_at(ast.Constant(False), t)), t)]

    def stmt_print(self) -> list:
        t = self.take("print")
        self.take("(")
        text = _unquote(self.take(kind="string").text)
        self.take(")")
        return [self.output(t, [text])]

    def stmt_printf(self) -> list:
        t = self.take("printf")
        self.take("(")
        fmt = self.take(kind="string")
        names = []
        while self.at(","):
            self.take(",")
            names.append(self.identifier())
        self.take(")")
        parts, text, k = [], _unquote(fmt.text), 0
        pieces = re.split(r"(%.)", text)
        for piece in pieces:
            if piece == "%%":
                parts.append("%")
            elif len(piece) == 2 and piece[0] == "%":
                want = {"d": "int", "a": "array", "t": "stack", "s": "array"}.get(piece[1])
                if want is None:
                    raise self.error(f"printf: unknown format {piece!r} (use %d, %a, %t, "
                                     "%s, %%)", fmt)
                if k >= len(names):
                    raise self.error("printf: more formats than variables", fmt)
                decl = self.lookup(names[k])
                if decl.type != want:
                    raise self.error(f"printf: {piece} wants {_a(want)}, but "
                                     f"{names[k].text} is {_a(decl.type)}", names[k])
                if piece == "%s" and (not decl.char or len(decl.dims) != 1):
                    what = ("a char" if decl.char else "an int") + \
                        ("" if len(decl.dims) == 1 else " 2-D")
                    raise self.error(f"printf: %s prints a one-dimensional char array as "
                                     f"text, but {names[k].text} is {what} array", names[k],
                                     "print it with %a")
                parts.append(_call("chars", [_name(names[k].text, names[k])], names[k])
                             if piece == "%s" else _shown(names[k], decl))
                k += 1
            elif piece:
                parts.append(piece)
        if k < len(names):
            raise self.error("printf: more variables than formats", names[k])
        return [self.output(t, parts)]

    def stmt_show(self) -> list:
        t = self.take("show")
        self.take("(")
        parts: list = []
        held: list = []             # elements of arrays of structs, shown from ancillas
        while True:
            name = self.identifier()
            decl = self.lookup(name)
            if parts:
                parts.append(", ")
            if decl.type == "struct":
                parts += self.struct_parts(name, decl, held)
            elif decl.type == "array":
                parts += [f"{name.text}[", _call("size", [_name(name.text, name)], name),
                          "] = "]
            else:
                parts.append(f"{name.text} = ")
            if decl.type != "struct":
                parts.append(_shown(name, decl))
            if not self.at(","):
                break
            self.take(",")
        self.take(")")
        if held:
            block = _call("ancilla", [], t, [ast.keyword(h, e) for h, e in held])
            return [_stmt(ast.With([ast.withitem(block, None)], [self.output(t, parts)]),
                          t)]
        return [self.output(t, parts)]

    def struct_parts(self, name: Token, decl: Decl, held: list) -> list:
        """show(p): `p = {x = 1, a = {1, 2}}`; show(pool), an array of structs of a known
        size with int fields: `pool[2] = {{val = 1, next = 0}, {...}}`, its elements read
        into ancillas around the output."""
        fields = self.fields(decl)
        names = [f[0] for f in self.structs[decl.struct]]
        if len(names) != len(fields) or any(f.type == "struct" for f in fields) or any(
                (decl.struct, n) in self.nested for n in names):
            raise self.error(f"show({name.text}): a struct with a struct field is shown by "
                             "its fields", name)

        def one(values):
            out = ["{"]
            for k, (f, v) in enumerate(zip(names, values)):
                out += [", " * (k > 0) + f"{f} = ", v]
            return out + ["}"]
        if not decl.dims:
            return [f"{name.text} = "] + one([_shown(_token(f.name, name), f) for f in fields])
        n = decl.dims[0]
        if n is None or any(len(f.dims) > 1 for f in fields) or n * len(fields) > 1024:
            raise self.error(f"show({name.text}): an array of structs is shown when its "
                             "size is known and its fields are ints; show its fields", name)
        out = [f"{name.text}[{n}] = {{"]
        for k in range(n):
            values = []
            for f in fields:
                h = self.temporary("shown")
                held.append((h, _at(ast.Subscript(_name(f.name, name),
                                                  _at(ast.Constant(k), name), ast.Load()),
                                    name)))
                values.append(_name(h, name))
            out += [", "] * (k > 0) + one(values)
        return out + ["}"]

    def output(self, t: Token, parts: list):
        args = [p if isinstance(p, ast.AST) else _at(ast.Constant(p), t) for p in parts]
        return _stmt(ast.Expr(_call("print", args, t, [ast.keyword(
            "sep", _at(ast.Constant(""), t))])), t)

    # ------------------------------------------------------------------ expressions
    def expression(self):
        """An expression; `c ? a : b` (PyJanus) is b + (c != 0) * (a - b): exact in
        int64's wrap-around, but both a and b are evaluated."""
        cond = self.binary(0)
        if not self.at("?"):
            return cond
        q = self.take("?")
        a = self.expression()
        self.take(":")
        b = self.expression()

        def at(node):
            node = _at(node, q)
            node.lineno, node.col_offset = cond.lineno, cond.col_offset
            return node
        test = at(ast.Compare(cond, [ast.NotEq()], [_at(ast.Constant(0), q)]))
        diff = at(ast.BinOp(a, ast.Sub(), copy.deepcopy(b)))
        return at(ast.BinOp(b, ast.Add(), at(ast.BinOp(test, ast.Mult(), diff))))

    def binary(self, level: int = 0):
        if level == len(_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.tok.kind == "op" and self.tok.text in _LEVELS[level]:
            op = self.take()
            right = self.binary(level + 1)
            if op.text in ("<<", ">>"):
                left = self.shift(op, left, right)
                continue
            if op.text in ("&&", "||"):
                node = ast.BoolOp(ast.And() if op.text == "&&" else ast.Or(), [left, right])
            elif op.text in _COMPARE:
                node = ast.Compare(left, [_COMPARE[op.text]()], [right])
            else:
                node = ast.BinOp(left, _BINOPS[op.text](), right)
            left = _at(node, op)
            left.lineno, left.col_offset = left_pos(node)
        return left

    def cast(self):
        """`(u16) e`, `(int) e` (the fork's and PyJanus's casts): e's value in the type's
        range, wrapped as the type wraps (PyJanus's rule; the fork allows only a cast to
        the type of the variable updated, where it is the same). `(int) e` is e itself
        (N-bit with -m N)."""
        t = self.take("(")
        typ = self.take()
        self.take(")")
        e = self.unary()
        width = SIZED.get(typ.text) or self.modular
        if width is None or width[0] >= 64:
            return e
        bits, signed = width
        node = _at(ast.BinOp(e, ast.BitAnd(), _at(ast.Constant((1 << bits) - 1), t)), t)
        if signed:
            half = _at(ast.Constant(1 << (bits - 1)), t)
            node = _at(ast.BinOp(_at(ast.BinOp(node, ast.BitXor(), half), t), ast.Sub(),
                                 copy.deepcopy(half)), t)
        return node

    def shift(self, op: Token, left, right):
        """x << n and x >> n (the fork's and PyJanus's shifts), in int64 (a sized type's
        update wraps the result). A constant n from 0 to 62 is one instruction; any other
        n is x * 2^n or x // 2^n, 2^n the product over n's six low bits b of
        1 + bit_b(n) * (2^(2^b) - 1): n = 63 shifts into the sign bit, n >= 64 gives 0
        (x << n) or the sign (x >> n), as on a 64-bit integer. A negative n gives 0 (the
        references differ: the fork shifts the other way, PyJanus stops). A variable n is
        allowed in an update's expression: the powers of two are ancillas computed before
        the update and cleared after it (one product each; as one expression the product
        would be recomputed at every level of its nesting)."""
        def num(v):
            return _at(ast.Constant(v), op)

        def bin_(a, o, b):
            node = _at(ast.BinOp(a, o(), b), op)
            node.lineno, node.col_offset = left_pos(node)
            return node

        def cmp(a, o, b):
            return _at(ast.Compare(a, [o()], [b]), op)

        def n():
            return copy.deepcopy(right)
        c = _constant(right)
        kind = ast.LShift if op.text == "<<" else ast.RShift
        if c is not None:
            if c < 0:
                raise self.error(f"a shift by a negative amount ({c})", op)
            if c <= 62:
                return bin_(left, kind, num(c))
            if kind is ast.LShift:
                return bin_(left, ast.Mult, num(_wrap(1 << c, (64, True)) if c < 64 else 0))
            return bin_(bin_(left, ast.RShift, num(62)), ast.RShift, num(1))

        if self.hoisted is None:
            raise self.error(f"a shift by a variable amount ({_janus(right)}) is "
                             "supported in the expression of an update (x += y << n)", op,
                             "shift by a constant here, or compute the value in a local")

        def hoist(init):
            name = self.temporary("pow")
            self.hoisted.append((name, init, op))
            return lambda: _name(name, op)

        def pow2(m):
            out = None
            for b in range(6):
                bit = bin_(bin_(m(), ast.RShift, num(b)), ast.BitAnd, num(1))
                factor = bin_(num(1), ast.Add, bin_(bit, ast.Mult, num((1 << (1 << b)) - 1)))
                out = hoist(factor if out is None else bin_(out(), ast.Mult, factor))
            return out()
        valid = bin_(cmp(n(), ast.GtE, num(0)), ast.Mult, cmp(n(), ast.Lt, num(64)))
        if kind is ast.LShift:
            return bin_(left, ast.Mult, hoist(bin_(valid, ast.Mult, pow2(n)))())

        def clamped():              # min(n, 62): only used where n <= 62 or to stay defined
            return bin_(n(), ast.Sub, bin_(cmp(n(), ast.Gt, num(62)), ast.Mult,
                                           bin_(n(), ast.Sub, num(62))))
        low = bin_(bin_(cmp(n(), ast.GtE, num(0)), ast.Mult, cmp(n(), ast.LtE, num(62))),
                   ast.Mult, bin_(copy.deepcopy(left), ast.FloorDiv, pow2(clamped)))
        high = bin_(cmp(n(), ast.Gt, num(62)), ast.Mult, cmp(left, ast.Lt, num(0)))
        return bin_(low, ast.Sub, high)

    def unary(self):
        t = self.tok
        if self.at("!"):
            self.take()
            operand = self.unary()
            if not _boolean(operand):       # (jana: "Couldn't match expected type bool")
                raise self.error("! takes a boolean (a comparison, &&, ||, !, true, false "
                                 "or empty(s)), not an int", t,
                                 "compare the int: !(x = 0), or x != 0")
            return _at(ast.UnaryOp(ast.Not(), operand), t)
        if self.at("-"):
            self.take()
            return _at(ast.UnaryOp(ast.USub(), self.unary()), t)
        if self.at("(") and (self.toks[self.k + 1].text == "int" or self.toks[
                self.k + 1].text in SIZED) and self.toks[self.k + 2].text == ")":
            return self.cast()
        if self.at("("):
            self.take("(")
            e = self.expression()
            self.take(")")
            return e
        if t.kind == "number":
            self.k += 1
            return _at(ast.Constant(_number(t.text)), t)
        if self.at("true", "false"):
            self.k += 1
            node = _at(ast.Constant(int(t.text == "true")), t)
            node.janus_bool = True
            return node
        if self.at("nil"):
            raise self.error("nil is only the value of an empty stack in local/delocal "
                             "stack s = nil; test a stack with empty(s)")
        if self.at("empty", "top", "size"):
            self.k += 1
            self.take("(")
            name = self.identifier()
            decl = self.lookup(name)
            self.take(")")
            s = _name(name.text, name)
            if t.text == "size" and decl.type == "struct" and decl.dims:
                return _call("len", [_name(self.fields(decl)[0].name, name)], t)
            if t.text == "size":
                if decl.type in ("int", "struct"):
                    raise self.error(f"{name.text} is an int; size() takes an array or a "
                                     "stack", name)
                if decl.type == "stack":
                    return _at(ast.Subscript(s, _at(ast.Constant(0), name), ast.Load()), t)
                return _call("len", [s], t)
            if decl.type != "stack":
                raise self.error(f"{name.text} is {_a(decl.type)}, not a stack", name)
            size = _at(ast.Subscript(s, _at(ast.Constant(0), name), ast.Load()), t)
            if t.text == "empty":
                return _at(ast.Compare(size, [ast.Eq()], [_at(ast.Constant(0), t)]), t)
            # (of an empty stack, index -1: refused as outside the stack, as jana refuses
            # nil where a number is used; s[0] itself, its size, is not an element)
            empty = _at(ast.Compare(size, [ast.Eq()], [_at(ast.Constant(0), t)]), t)
            index = _at(ast.BinOp(size, ast.Sub(), empty), t)
            self.note(t, "top", name.text)
            return _at(ast.Subscript(_name(name.text, name), index, ast.Load()), t)
        if t.kind == "name" and t.text in self.defines and t.text not in \
                {n for s in self.scopes for n in s}:
            self.k += 1
            return _at(ast.Constant(self.defines[t.text]), t)
        name = self.identifier()
        decl = self.lookup(name)
        if decl.type == "struct":
            node, field = self.member(name, decl)
            if field.type != "int" and isinstance(node, ast.Name):
                raise self.error(f"{field.name} is an array; an expression needs an int",
                                 name, "index it")
            return node
        if self.at("["):
            if decl.type != "array":
                raise self.error(f"{name.text} is {_a(decl.type)}, not an array", name)
            return _at(ast.Subscript(_name(name.text, name), self.indices(name, decl),
                                     ast.Load()), name)
        if decl.type != "int":
            raise self.error(f"{name.text} is {_a(decl.type)}; an expression needs an int",
                             name, "index an array (a[i]); use top(s), size(s), empty(s)")
        return _name(name.text, name)


def explain(fn, ins, line: int, path: str, R: list, message: str) -> str | None:
    """A run-time failure in Janus terms: the statement at the line, what it checks, the
    values involved (registered with the machine's error explanations for .ja files).
    Run backwards, a line's index checks come after its reads: a read outside an array
    goes on to fail an overflow check, or a plain assertion, first; where one of the
    line's index checks fails with the values at the failure, that is the error."""
    said = _explained(fn, ins, line, path, R, message)
    if said is not None and not said.startswith("integer overflow"):
        return said
    value = lambda arg: arg.value if not isinstance(arg, Reg) else R[fn.slot(arg)]
    for x in fn.code:
        if x.line == line and x.op in ("ASSERT.LT", "ASSERT.GE") and x is not ins and \
                _explain.bounds_check(fn, x, line) is not None and not (
                    value(x.args[0]) < value(x.args[1]) if x.op == "ASSERT.LT"
                    else value(x.args[0]) >= value(x.args[1])):
            return _explained(fn, x, line, path, R, message) or said
    return said


def _explained(fn, ins, line: int, path: str, R: list, message: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            parser = Parser(f.read(), path)
        parser.program()
    except (OSError, UnicodeDecodeError, CompileError, RecursionError):
        return None
    names = names_at(fn, line)
    values = {name: R[fn.slot(r)] for r, name in names.items()}

    def value(arg):
        return arg.value if not isinstance(arg, Reg) else R[fn.slot(arg)]

    def shown(text: str) -> str:
        used = [n for n in re.findall(r"[A-Za-z_]\w*", text) if n in values]
        return "" if not used else " (" + ", ".join(
            f"{n} = {values[n]}" for n in dict.fromkeys(used)) + ")"

    if ins.op in ("ASSERT.LT", "ASSERT.GE"):
        bounds = _bounds(fn, ins, line, R, value)
        tops = [what[1] for what in parser.notes.get(line, []) if what[0] == "top"]
        if bounds is not None and ": array index -1 " in bounds and \
                bounds.split(":")[0] in tops:   # (top of an empty stack: index -1)
            s = bounds.split(":")[0]
            return f"top({s}): the stack {s} is empty (it has no top; jana's is nil)"
        if bounds is not None:
            return bounds
    arrived = "arrived by its jump" in message
    label = ins.args[-1].name if ins.args and hasattr(ins.args[-1], "name") else ""
    for what in parser.notes.get(line, []):
        if what[0] == "alias" and ins.op == "ASSERT.NE":     # two indices found equal
            _, name, target, reads = what
            other = reads[0] if len(reads) == 1 else "one of " + ", ".join(reads)
            return (f"identifiers {name} and {name} are aliases: {target} and {other} are "
                    f"the same element{shown(' '.join([target, *reads]))}")
    for what in parser.notes.get(line, []):
        if what[0] == "overflow" and ins.op in ("ASSERT.EQ", "ASSERT.LE", "ASSERT.GE"):
            return _overflow(what, ins, values)
        if what[0] == "iterate" and ins.op.startswith("ASSERT"):
            _, i, start, step, end = what
            head = f"iterate int {i} = {start}" + (f" by {step}" if step != "1" else "") + \
                f" to {end}"
            if ins.op == "ASSERT.EQ":       # a bound changed by the body (a delocal)
                return (f"{head}: the body changed the value of a bound ({start}, {step} "
                        f"or {end}); they must be the same when the loop ends"
                        f"{shown(' '.join((start, step, end)))}")
            return (f"{head}: {i} = {values.get(i)} has stepped past {end} without "
                    f"reaching it (the step must be non-zero and divide {end} - {start})"
                    f"{shown(' '.join((step, end)))}")
    for what in parser.notes.get(line, []):
        kind = what[0]
        if kind == "error" and ins.op.startswith("ASSERT"):
            return f"error: {what[1]}"
        if kind == "undeclared" and ins.op.startswith("ASSERT"):
            return f"procedure {what[1]}: {what[2]} (line {what[3]})"
        if kind == "undefined" and ins.op.startswith("ASSERT"):
            return f"procedure {what[1]!r} is not defined (the program calls it here)"
        if kind in ("push", "pop") and ins.op.startswith("ASSERT"):
            x, s = what[1], what[2]
            if ins.op == "ASSERT.EQ":
                return f"{kind}({x}, {s}): {x} = {values.get(x)}; pop needs {x} = 0"
            if ins.op == "ASSERT.GT":
                return f"{kind}({x}, {s}): pop from the empty stack {s}"
            return full_message(kind, x, s, value(ins.args[1]))
        if kind == "size" and ins.op == "ASSERT.EQ":
            return (f"argument {what[1]} of {fn.name} has {value(ins.args[0])} elements; "
                    f"{fn.name} expects an array of size {what[2]} (int {what[1]}[{what[2]}])")
        if kind == "argument" and ins.op.startswith("ASSERT") and \
                names.get(ins.args[0]) == what[1]:
            return (f"call {what[3]}: the argument {what[2]} is passed by value in a fresh "
                    f"variable, which {what[3]} must give back unchanged: it is "
                    f"{value(ins.args[0])} after the call, not {value(ins.args[1])}")
        if kind == "constant" and ins.op.startswith("ASSERT"):
            return (f"constant {what[1]} = {what[2]}: its block changed what the value "
                    f"reads (rvm clears {what[1]} at the block's end by computing "
                    f"{what[2]} again): it is {value(ins.args[1])} there, not "
                    f"{value(ins.args[0])}")
        if kind == "delocal-array" and ins.op == "FREE":
            return f"delocal {what[1]} = {what[2]}: {what[1]} does not hold these values"
        if kind == "delocal" and isinstance(ins.args[0], Reg) and \
                names.get(ins.args[0], what[1]) != what[1]:
            continue            # several locals end on this line: another one's
        if kind == "delocal" and (ins.op.startswith("ASSERT") or ins.op == "FREE"):
            if what[2] == "nil":
                return f"delocal stack {what[1]} = nil: {what[1]} is not empty"
            return (f"delocal int {what[1]} = {what[2]}: {what[1]} is "
                    f"{value(ins.args[0])}, not {value(ins.args[1])}")
        if kind == "if" and label.startswith("then"):
            branch, truth = ("then", "false") if arrived else ("else", "true")
            return (f"the fi assertion `{what[2]}` (line {what[3]}) is {truth} after the "
                    f"{branch}-branch of the if at line {line}{shown(what[2])}")
        if kind == "if":
            return (f"running backwards, the if's condition `{what[1]}` (line {line}) does "
                    f"not match the branch that ran{shown(what[1])}")
        if kind == "from" and label.startswith("back"):
            when = "is true on a later iteration" if arrived else "is false on entry"
            return (f"the from assertion `{what[1]}` of the loop at line {line} {when}; it "
                    f"must hold on entry and never after{shown(what[1])}")
        if kind == "from":
            return (f"running backwards, the until condition `{what[2]}` (line {what[3]}) "
                    f"does not match{shown(what[2])}")
    return None


def _overflow(what: tuple, ins, values: dict) -> str:
    """An update whose result would leave int64 (jana's integers are unbounded). The
    check before the update fails forwards, the one after it backwards (see
    Parser.checked_update): the one after compares a constant first, or a register with
    0."""
    _, target, text, op, held = what
    backwards = isinstance(ins.args[0], Imm) or (ins.op == "ASSERT.EQ" and
                                                  isinstance(ins.args[1], Imm))
    sign = (1 if op == "+=" else -1) * (-1 if backwards else 1)
    x = values.get(target)
    e = held if isinstance(held, int) else values.get(held) if held else None
    undo = "-=" if op == "+=" else "+="
    doing = f"{target} {op} {text}" if not backwards else \
        f"running backwards, {target} {op} {text} is undone as {target} {undo} {text}, which"
    result = f" = {x + sign * e}," if x is not None and e is not None else ""
    known = [f"{target} = {x}"] * (x is not None) + \
        [f"{text} = {e}"] * (e is not None and text != str(e))
    shown = f" ({', '.join(known)})" if known else ""
    effect = f"make {target}{result}" if result else f"take {target}"
    return (f"integer overflow: {doing} would {effect} beyond the 64-bit "
            f"integers (-2^63 .. 2^63 - 1){shown}; jana's integers are unbounded, rvm's "
            "are int64")


def _bounds(fn, ins, line: int, R: list, value) -> str | None:
    """An array index out of bounds, in jana's words, naming the array: the compiled
    check is `index >= 0` then `index < length`, the length a register of the array's."""
    found = _explain.bounds_check(fn, ins, line)
    if found is None:
        return None
    index, length, (name, k, regs) = found
    shape = "".join(f"[{R[fn.slot(r)]}]" for r in regs)
    which = "" if len(regs) == 1 else ("first " if k == 0 else "second ")
    return (f"{name}: array {which}index {value(index)} was out of bounds (array size was "
            f"{value(length)}; {name}{shape})")


def _base(node) -> str:
    """The variable an lvalue or an element read names."""
    return node.id if isinstance(node, ast.Name) else node.value.id


def _reads(e):
    """The Name nodes of expression e whose values it reads (size(a) reads only a's fixed
    length), each given its parent node as `.parent`."""
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len":
        return
    if isinstance(e, ast.Name):
        yield e
    for c in ast.iter_child_nodes(e):
        c.parent = e
        yield from _reads(c)


_TEXT = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "/", ast.Mod: "%",
         ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.And: "&&",
         ast.LShift: "<<", ast.RShift: ">>", ast.Or: "||",
         ast.Not: "!", ast.USub: "-", **{v: k for k, v in _COMPARE.items()}}


def _janus(e) -> str:
    """An expression of the parser's trees as Janus text (for messages)."""
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Constant):
        return str(e.value)
    if isinstance(e, ast.Subscript):
        idx = e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]
        return _janus(e.value) + "".join(f"[{_janus(i)}]" for i in idx)
    if isinstance(e, ast.BinOp):
        return f"{_janus(e.left)} {_TEXT[type(e.op)]} {_janus(e.right)}"
    if isinstance(e, ast.Compare):
        return f"{_janus(e.left)} {_TEXT[type(e.ops[0])]} {_janus(e.comparators[0])}"
    if isinstance(e, ast.BoolOp):
        return f" {_TEXT[type(e.op)]} ".join(_janus(v) for v in e.values)
    if isinstance(e, ast.UnaryOp):
        return _TEXT[type(e.op)] + _janus(e.operand)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len":
        return f"size({_janus(e.args[0])})"
    return ast.unparse(e)


def _evaluate(e, env: dict) -> int:
    """An expression of the parser's trees on known values (main's declarations)."""
    if isinstance(e, ast.Constant):
        return e.value
    if isinstance(e, ast.Name):
        v = env[e.id]
        if not isinstance(v, int):
            raise TypeError
        return v
    if isinstance(e, ast.Subscript):
        v = env[e.value.id]
        for i in (e.slice.elts if isinstance(e.slice, ast.Tuple) else [e.slice]):
            k = _evaluate(i, env)
            if k < 0:
                raise IndexError
            v = v[k]
        return v
    if isinstance(e, ast.Call):             # len: size(a) of an array, first dimension
        return len(env[e.args[0].id])
    if isinstance(e, ast.UnaryOp):
        v = _evaluate(e.operand, env)
        return -v if isinstance(e.op, ast.USub) else int(not v)
    if isinstance(e, ast.BinOp):
        a, b = _evaluate(e.left, env), _evaluate(e.right, env)
        if isinstance(e.op, ast.LShift | ast.RShift):
            if b < 0:
                raise TypeError
            return _wrap(a << min(b, 64), (64, True)) if isinstance(e.op, ast.LShift) \
                else a >> min(b, 64)
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.BitAnd: a & b,
                ast.BitOr: a | b, ast.BitXor: a ^ b}.get(type(e.op)) if not isinstance(
            e.op, ast.FloorDiv | ast.Mod) else a // b if isinstance(e.op, ast.FloorDiv) \
            else a % b
    if isinstance(e, ast.Compare):
        a, b = _evaluate(e.left, env), _evaluate(e.comparators[0], env)
        return int({ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b, ast.GtE: a >= b,
                    ast.Eq: a == b, ast.NotEq: a != b}[type(e.ops[0])])
    if isinstance(e, ast.BoolOp):
        vals = [_evaluate(v, env) for v in e.values]
        return int(all(vals) if isinstance(e.op, ast.And) else any(vals))
    raise TypeError


def _constant(e) -> int | None:
    """The value of an expression of constants only, else None."""
    if any(isinstance(n, ast.Name) for n in ast.walk(e)):
        return None
    try:
        v = _evaluate(e, {})
    except (ZeroDivisionError, TypeError, KeyError, IndexError):
        return None
    return v if isinstance(v, int) else None


def _zeros(dims: list):
    return 0 if not dims else [_zeros(dims[1:]) for _ in range(dims[0])]


def _wrap(v: int, width: tuple) -> int:
    """v in a sized integer's range: bits, signed (the fork's wrap-around)."""
    bits, signed = width
    v %= 1 << bits
    return v - (1 << bits) if signed and v >> (bits - 1) else v


def _wrap_values(tree, width: tuple):
    if isinstance(tree, list):
        return [_wrap_values(t, width) for t in tree]
    return _wrap(tree, (64, True) if width[0] == 64 else width)


def left_pos(node) -> tuple[int, int]:
    """Where a binary expression starts: at its left operand (errors point there)."""
    first = node.values[0] if isinstance(node, ast.BoolOp) else node.left
    return first.lineno, first.col_offset


def _token(text: str, at: Token) -> Token:
    return Token("name", text, at.line, at.col)


def _struct(d: Decl) -> str:
    return f"an array of {d.struct}" if d.dims else f"a {d.struct}"


def _a(typ: str) -> str:
    return {"int": "an int", "array": "an array", "stack": "a stack"}.get(typ, typ)


def _unquote(text: str) -> str:
    return ast.literal_eval(text)


def _shown(tok: Token, decl: Decl):
    """A value to print, Janus-style: ints as they are, arrays {1, 2}, stacks <2, 1]."""
    name = _name(tok.text, tok)
    if decl.type == "int":
        return name
    return _call("janus" if decl.type == "array" else "stack", [name], tok)


def _stack_moves(t: Token, x: Token, s: Token, push: bool) -> list:
    """push(x, s) / pop(x, s) on the stack layout (size in s[0], values from s[1]; cells
    above the top are zero). Every check holds trivially in one direction and is the
    other operation's check in the other, so uncalling a push is a checked pop."""
    def name(tok):
        return _name(tok.text, tok)

    def num(v):
        return _at(ast.Constant(v), t)

    def size():
        return _at(ast.Subscript(name(s), num(0), ast.Load()), t)

    def cell():
        index = _at(ast.BinOp(size(), ast.Add(), num(1)), t)
        return _at(ast.Subscript(name(s), index, ast.Store()), t)

    def check(left, op, right):
        return _stmt(ast.Assert(_at(ast.Compare(left, [op], [right]), t)), t)

    not_full = check(size(), ast.Lt(), _at(ast.BinOp(_call("len", [name(s)], t), ast.Sub(),
                                                     num(1)), t))
    x_zero = check(name(x), ast.Eq(), num(0))
    not_empty = check(size(), ast.Gt(), num(0))
    exchange = _stmt(ast.Assign([_at(ast.Tuple([name(x), cell()], ast.Store()), t)],
                                _at(ast.Tuple([cell(), name(x)], ast.Load()), t)), t)
    # the cell's index reads s[0], never the cell itself (the index is at least 1): exempt
    # from the rule that a swap's index may not read the array it changes
    exchange.index_reads_checked = True
    grow = _stmt(ast.AugAssign(_at(ast.Subscript(name(s), num(0), ast.Store()), t),
                               ast.Add() if push else ast.Sub(), num(1)), t)
    if push:
        return [not_full, exchange, grow, not_empty, x_zero]
    return [x_zero, not_empty, grow, exchange, not_full]


# ---------------------------------------------------------------------- programs


def compile_janus(path: str, text: str | None = None, modular: int | None = None,
                  checked: bool = True, stack_capacity: int | None = None) -> Program:
    """Compile a Janus file: one rvm function per procedure (main's variables are its
    parameters); the program remembers main's declarations (program.cache["janus"]).
    `modular` = N: every int is an N-bit signed integer that wraps (jana's -m).
    `checked=False` leaves out the overflow checks of int updates (they wrap instead).
    `stack_capacity`: the elements a stack of main's or a local stack holds."""
    from . import ReversibleFunction, Session
    from .expressions import Source
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    if modular is not None and not 1 < modular <= 64:
        raise CompileError(f"-m{modular}: modular integers have 2 to 64 bits", path, 1, 1)
    capacity = STACK_CAPACITY if stack_capacity is None else stack_capacity
    if not 1 <= capacity <= MAX_CAPACITY:
        raise CompileError(f"a stack capacity of {capacity}: give 1 to 2^40 elements",
                           path, 1, 1)
    parser = Parser(text, path, modular, checked, capacity)
    try:
        functions = parser.program()
    except RecursionError:
        raise CompileError("expression too deeply nested to parse", path, 1, 1) from None
    source = Source(path, text.splitlines(keepends=True))
    env: dict = {}
    session = Session()
    for node in functions:
        rf = ReversibleFunction(node=node, source=source, env=env)
        env[node.name] = rf
    for node in functions:
        sig = tuple(env[node.name].annotations())
        session.request(env[node.name], sig)
    program = session.run(path)
    program.cache["janus"] = {
        "main": parser.flat(parser.main), "stack_capacity": capacity,
        "source": (path, text, modular, checked),   # (compiled again with larger stacks)
        "procedures": {k: parser.flat(v) for k, v in parser.procedures.items()},
        "structs": {d.name: (d, parser.structs[d.struct]) for d in parser.main
                    if d.type == "struct"},
        "struct_types": parser.structs, "nested": parser.nested}
    return program


def load_modular(path: str, bits: int | None, stack_capacity: int | None = None,
                 checked: bool = True) -> Program:
    """`rvm run -m[N] prog.ja`: a Janus program whose ints are N-bit modular (bits None:
    unbounded, as usual); `--stack-capacity N`: its stacks hold N elements;
    `--no-overflow-checks` (checked False): its int updates wrap."""
    from ..core.errors import RvmError
    if not path.endswith((".ja", ".janus")):
        what = "-m (modular integers)" if bits is not None else "--stack-capacity" if \
            stack_capacity is not None else "--no-overflow-checks"
        raise RvmError(f"{what} is for Janus programs (.ja, .janus), not {path}")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RvmError(f"{path}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise RvmError(f"{path}: not a UTF-8 text file") from None
    return compile_janus(path, text, modular=bits, stack_capacity=stack_capacity,
                         checked=checked)


def main_arguments(program: Program) -> list:
    """main's variables at the start: zero, empty, or their initialisers."""
    out = []
    for d in program.cache["janus"]["main"]:
        if d.type == "int":
            out.append(int(d.init or 0))
        elif d.type == "stack":
            try:
                out.append(np.zeros(_capacity(program) + 1, np.int64))
            except MemoryError:
                from ..core.errors import MachineError
                raise MachineError(f"stack {d.name}: {_capacity(program)} elements do not "
                                   "fit in this computer's memory; give a smaller "
                                   "--stack-capacity (stacks grow as they fill)") from None
        else:
            out.append(np.array(d.init, np.int64) if d.init is not None
                       else np.zeros(d.dims, np.int64))
    return out


def to_machine(program: Program, name: str, args: tuple) -> tuple:
    """Python arguments for a Janus procedure: stacks given as lists (top last, as pushed)
    become the stack layout."""
    decls = _decls(program, name)
    if decls is None:
        return args
    from ..core.errors import UsageError
    out = []
    for d, a in zip(decls, args):
        if d.type == "stack" and isinstance(a, list | tuple):
            for v in a:
                if isinstance(v, bool) or not isinstance(v, int | np.integer) or \
                        not -2 ** 63 <= v < 2 ** 63:
                    raise UsageError(f"stack {d.name}: its elements are integers (int64), "
                                     f"bottom first; got {v!r}")
            buf = np.zeros(max(_capacity(program), 2 * len(a)) + 1, np.int64)
            buf[0], buf[1:len(a) + 1] = len(a), a
            a = buf
        elif d.type == "stack" and isinstance(a, np.ndarray) and a.ndim == 1 and \
                a.dtype.kind in "iu" and len(a) <= _capacity(program):
            if len(a) == 0 or not 0 <= a[0] < len(a) or np.any(a[a[0] + 1:]):
                raise UsageError(
                    f"stack {d.name}: an array given for a stack holds its size, then its "
                    f"elements bottom first, then zeros; {[int(v) for v in a[:8]]}"
                    f"{' ...' if len(a) > 8 else ''} is not one (or give a list)")
            buf = np.zeros(_capacity(program) + 1, np.int64)   # (the program's stacks
            buf[:len(a)] = a                                     # grew: see growing)
            a = buf
        elif d.type == "stack" and not (isinstance(a, np.ndarray) and a.ndim == 1 and
                                        a.dtype.kind in "iu"):  # (a grown stack's layout)
            raise UsageError(f"stack {d.name}: give its elements as a list of integers, "
                             f"bottom first (or its int64 layout as an array); got "
                             f"{type(a).__name__} {a!r}"[:300])
        out.append(a)
    return tuple(out) + tuple(args[len(out):])


def listed(program: Program, name: str, args: list) -> list:
    """Arguments from the command line: a stack's given as its elements (`[1, 2]`, bottom
    first), as lists are from Python."""
    decls = _decls(program, name) or []
    return [a.tolist() if d.type == "stack" and isinstance(a, np.ndarray) and a.ndim == 1
            else a for d, a in zip(decls, args)] + list(args[len(decls):])


def from_machine(program: Program, name: str, results: tuple) -> tuple:
    """Results of a Janus procedure with stacks as lists (bottom first, top last)."""
    decls = _decls(program, name)
    if decls is None:
        return results
    return tuple([int(v) for v in r[1:r[0] + 1]] if d.type == "stack" else r
                 for d, r in zip(decls, results))


def _capacity(program: Program) -> int:
    return program.cache["janus"].get("stack_capacity", STACK_CAPACITY)


# ---------------------------------------------------------------------- growing stacks


def full_message(kind: str, x: str, s: str, capacity) -> str:
    return (f"{kind}({x}, {s}): the stack {s} is full ({capacity} elements, its capacity; "
            "rvm run and calls from Python grow stacks, the debugger and rvm run --trace "
            "do not: start them with larger ones, --stack-capacity N)")


_FULL = re.compile(r"(push|pop)\((\w+), (\w+)\): the stack \3 is full \((\d+) elements")


def grown(program: Program, factor: float = 2) -> Program | None:
    """The program compiled again with stacks `factor` times as large (main's, and local
    ones), or None where its source is not at hand (a .rvmb file) or no other size is
    left."""
    info = program.cache["janus"]
    capacity = max(1, min(int(_capacity(program) * factor), MAX_CAPACITY))
    if info.get("source") is None or capacity == _capacity(program):
        return None
    sized = info.setdefault("sized", {})
    if capacity not in sized:
        path, text, modular, checked = info["source"]
        other = compile_janus(path, text, modular, checked, capacity)
        if program.engine is not None:      # (rvm.load(path, engine=...))
            other = attrs.evolve(other, engine=program.engine)
        sized[capacity] = other
    return sized[capacity]


def growing(program: Program, run, out=None):
    """run(program, out) -> results, run again from the start on the program with every
    stack twice as large while a stack it pushes onto is full, up to the machine's
    memory limit (jana's stacks have no bound; rvm's are blocks of the machine's heap,
    whose LIFO blocks cannot move while running); starting stacks that do not fit the
    limit start an eighth as large (and so on) first. Runs are deterministic, so the
    output a stopped run printed is printed again by the next: the next run's first
    characters are not printed twice. (program, results) of the run that succeeded."""
    import sys

    from ..core.errors import RvmError
    printed, full = 0, None
    while True:
        stream = _Skipping(out or sys.stdout, printed)
        try:
            return program, run(program, stream)
        except RvmError as e:
            if _stacks_past_memory(program, e):
                if full is not None:        # (grown stacks that do not fit)
                    raise _outgrown(full, e) from None
                # the starting stacks do not fit the memory limit: start smaller
                smaller = grown(program, 1 / 8)
                if smaller is None:
                    raise
                printed, program = max(printed, stream.seen), smaller
                continue
            found = _FULL.search(str(e)) if _at_push(program, e) else None
            bigger = grown(program) if found else None
            if bigger is None:
                raise
            full = (e, *found.groups())
            printed, program = max(printed, stream.seen), bigger


_MEMORY = re.compile(r"(?:heap|memory) limit of (\d+) cells")
MAX_CAPACITY = 1 << 40


def _instruction(program: Program, e):
    fn = program.functions.get(getattr(e, "function", "") or "")
    i = getattr(e, "index", None)
    return fn.code[i] if fn is not None and i is not None and 0 <= i < len(fn.code) else None


def _at_push(program: Program, e) -> bool:
    """Did the run stop at a push's (or an uncalled pop's) test that its stack is not
    full (not at a user's error() that says so)?"""
    ins = _instruction(program, e)
    return "janus" in program.cache and ins is not None and ins.op == "ASSERT.LT"


def _stacks_past_memory(program: Program, e) -> bool:
    """Is this error the memory limit refusing stacks (main's, given when the run starts,
    or a local stack's block at its `local`)? Another memory error is reported as it is."""
    if not (getattr(e, "limit", False) and _MEMORY.search(str(e))):
        return False
    ins = _instruction(program, e)
    if ins is None:                 # main's variables, placed before the first instruction
        return getattr(e, "index", None) is None
    source = program.cache["janus"].get("source")
    if source is None:
        return False
    text = source[1].splitlines()
    line = getattr(e, "line", 0)
    return ins.op == "ALLOC" and 0 < line <= len(text) and \
        re.search(r"\blocal\s+stack\b", text[line - 1]) is not None


def _outgrown(full: tuple, e: Exception) -> Exception:
    """The error of a full stack that stacks twice as large do not fit the memory limit."""
    from ..core.errors import MachineError
    err, kind, x, s, n = full
    limit = _MEMORY.search(str(e)).group(1)
    out = MachineError(f"{kind}({x}, {s}): the stack {s} is full ({n} elements), and "
                       f"stacks twice as large do not fit the machine's memory limit of "
                       f"{limit} cells (heap and registers); raise it with --heap-limit N "
                       "(heap_limit in Python)", err.function, err.index, err.line,
                       err.file)
    out.limit = True
    return out


class _Skipping:
    """An output stream that passes on what is written after its first `skip` characters
    (printed already by an earlier run) and counts what is written."""

    def __init__(self, out, skip: int):
        self.out, self.skip, self.seen = out, skip, 0
        self.encoding = getattr(out, "encoding", None)

    def write(self, text: str) -> int:
        start = max(self.skip - self.seen, 0)
        self.seen += len(text)
        if start < len(text):
            self.out.write(text[start:])
        return len(text)

    def flush(self) -> None:
        self.out.flush()


def _decls(program: Program, name: str):
    info = program.cache.get("janus")
    if info is None:
        return None
    return info["main"] if name == "main" else info["procedures"].get(name)


def show_store(program: Program, values: tuple) -> str:
    """main's final state as jana prints it: `name = value` sorted by name; arrays
    `a[3] = {1, 2, 3}`; stacks `s = <3, 2, 1]` (top first) or `s = nil`. Stacks may be
    given in the machine's layout or as lists (bottom first, as prog.call returns them)."""
    lines, structs = [], program.cache["janus"].get("structs", {})
    grouped: dict[str, dict] = {}
    for d, v in zip(program.cache["janus"]["main"], values):
        head, dot, field = d.name.partition(".")
        if dot and head in structs:
            grouped.setdefault(head, {})[field] = (d, v)
    leaves = {d.name: (d, v) for d, v in zip(program.cache["janus"]["main"], values)}
    types = program.cache["janus"].get("struct_types", {})
    nested = program.cache["janus"].get("nested", {})
    for name in grouped:
        decl, _ = structs[name]
        if not decl.dims:
            shown = _struct_shown(decl.struct, name, [], leaves, types, nested)
            lines.append((name, f"{name} = {shown}"))
            continue
        items = [_struct_shown(decl.struct, name, [k], leaves, types, nested)
                 for k in range(decl.dims[0])]
        lines.append((name, f"{name}[{decl.dims[0]}] = {{{', '.join(items)}}}"))
    for d, v in sorted(zip(program.cache["janus"]["main"], values), key=lambda p: p[0].name):
        if "." in d.name:
            continue
        if d.type == "int":
            lines.append((d.name, f"{d.name} = {_shown_int(v, d)}"))
        elif d.type == "stack":
            items = [int(x) for x in (v if isinstance(v, list) else v[1:v[0] + 1])][::-1]
            lines.append((d.name, f"{d.name} = " + ("<" + ", ".join(map(str, items)) + "]"
                                                    if items else "nil")))
        else:       # every dimension, as the fork and PyJanus print them
            shape = "".join(f"[{n}]" for n in np.shape(v))
            lines.append((d.name, f"{d.name}{shape} = {_braces(v, d)}"))
    return "\n".join(text for _, text in sorted(lines))


def _struct_shown(struct: str, path: str, ks: list, leaves: dict, types: dict,
                  nested: dict) -> str:
    """A struct's value as PyJanus prints it: {x = 1, a = {1, 2}}, a struct field's as
    {...} inside it; ks: the element of each array of structs on the way."""
    out = []
    for f, fdims, _, _ in types[struct]:
        inner = nested.get((struct, f))
        if inner is not None:
            if fdims:
                items = [_struct_shown(inner, f"{path}.{f}", ks + [j], leaves, types, nested)
                         for j in range(fdims[0])]
                out.append(f"{f} = {{{', '.join(items)}}}")
            else:
                shown = _struct_shown(inner, f"{path}.{f}", ks, leaves, types, nested)
                out.append(f"{f} = {shown}")
            continue
        d, v = leaves[f"{path}.{f}"]
        for k in ks:
            v = v[k]
        out.append(f"{f} = {_braces(v, d) if np.ndim(v) else _shown_int(v, d)}")
    return "{" + ", ".join(out) + "}"


def _shown_int(v, d: Decl) -> int:
    return int(v) % (1 << 64) if d.width == (64, False) else int(v)


def _braces(v, d: Decl | None = None) -> str:
    if getattr(v, "ndim", 1) == 2:
        return "{" + ", ".join(_braces(row, d) for row in v) + "}"
    return "{" + ", ".join(str(_shown_int(x, d) if d else int(x)) for x in v) + "}"


__all__ = ["compile_janus", "from_machine", "main_arguments", "show_store",
           "to_machine"]

_explain.EXPLAINERS[".ja"] = _explain.EXPLAINERS[".janus"] = explain
