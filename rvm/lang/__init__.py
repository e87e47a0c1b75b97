"""The frontend: a reversible subset of Python (docs/language.md), compiled to rvm bytecode.

    @rvm.reversible
    def f(out: float, x: float):
        out += x * x

    f(0.0, 3.0)          # (9.0, 3.0): every argument's final value
    (~f)(9.0, 3.0)       # (0.0, 3.0): the inverse, for free
    rvm.grad(f, loss="out")(0.0, 3.0)
"""

from __future__ import annotations

import ast
import builtins
import collections
import contextlib
import importlib
import inspect
import itertools
import linecache
import sys
import textwrap
import threading
from typing import Any

import attrs

from ..core import isa
from ..core.errors import CompileError, MachineError, RvmError, user_facing
from ..core.program import FuncRef, Function, Imm, Instruction, Program, Reg
from ..core.verify import verify
from ..engines.arguments import first_row, plural, with_options
from ..engines.arrays import INTERLEAVED
from ..engines.machine import machine_for
from .compiler import FunctionCompiler, is_function, parse_annotation, sig_of
from .expressions import Source


class Array:
    """Annotation for array parameters: Array[float] (1-D), Array[float, 2], Array[int]."""

    def __class_getitem__(cls, item):
        return cls


def _marker(name: str):
    def marker(*args, **kwargs):
        raise RuntimeError(f"{name}() is only meaningful inside an @rvm.reversible function")
    marker.__name__ = name
    return marker


ancilla, compute, inverse = _marker("ancilla"), _marker("compute"), _marker("inverse")
neg, rot, irot, zeros = _marker("neg"), _marker("rot"), _marker("irot"), _marker("zeros")
from_, loop, delocal = _marker("from_"), _marker("loop"), _marker("delocal")

nograd = _marker("nograd")

_SPECIALIZING = threading.RLock()    # (ReversibleFunction.specialize)


MERGED = "merged"       # a program's cache: the functions of derived programs it calls
FRONTEND = "frontend"   # ... and True for a program this process compiled from Python


class Session:
    """Compiles a root function and every reversible function it reaches into one Program."""

    def __init__(self):
        self.functions: dict = {}
        self.names: dict = {}
        self.params: dict = {}
        self.pending: list = []
        self.used: set[str] = set()
        self.merged: set[str] = set()   # functions brought in from derived programs
        self.keep: list = []

    def request(self, rf: ReversibleFunction, sig: tuple, node=None, src=None) -> str:
        if hasattr(rf, "lower"):       # a derivative program (rvm.tangent / rvm.adjoint)
            return self.merge(rf, sig, node, src)
        sig = rf.check_signature(sig, node, src)
        key = (rf.key, sig)
        if key not in self.names:
            name, k = rf.name, 1
            while name in self.used:
                k += 1
                name = f"{rf.name}.{k}"
            self.used.add(name)
            self.names[key] = name
            self.pending.append((rf, sig, name))
        return self.names[key]

    def merge(self, transformed, sig: tuple, node, src) -> str:
        """Bring a transformed function's program in, its functions renamed apart."""
        key = (id(transformed), sig)
        if key not in self.names:
            try:
                program, entry = transformed.lower(sig)
            except RvmError as e:
                raise (src.error(node, str(e)) if node is not None else e) from None
            k = len(self.names)
            rename = {name: f"d{k}.{name}" for name in program.functions}
            for name, fn in program.functions.items():
                code = tuple(Instruction(i.op, (FuncRef(rename[i.args[0].name]),) + i.args[1:],
                                         i.line) if i.op in isa.CALLS else i for i in fn.code)
                self.functions[rename[name]] = attrs.evolve(
                    fn, name=rename[name], code=code,
                    adjoint_of=rename[fn.adjoint_of] if fn.adjoint_of else "")
                self.used.add(rename[name])
                self.merged.add(rename[name])
            entry = rename[entry]
            if INTERLEAVED in program.cache:   # (its heap interleaved: see aligned)
                fn = aligned(self.functions[entry], f"d{k}.aligned",
                             1 << program.cache[INTERLEAVED])
                self.functions[fn.name] = fn
                self.used.add(fn.name)
                self.merged.add(fn.name)
                entry = fn.name
            self.names[key] = entry
            self.params[entry] = None
            self.keep.append(transformed)     # ids stay unique while the session lives
        return self.names[key]

    def run(self, source: str) -> Program:
        while self.pending:
            rf, sig, name = self.pending.pop(0)
            fc = FunctionCompiler(self, rf.node, rf.source, rf.env, name, sig)
            try:
                fn, names = fc.compile()
            except RecursionError:
                raise rf.source.error(rf.node, "expression too deeply nested to compile",
                                      "split it into several statements") from None
            self.functions[name] = fn
            self.params[name] = names
        program = verify(Program(self.functions, source))
        program.cache[FRONTEND] = True
        if self.merged:
            program.cache[MERGED] = frozenset(self.merged)
        return program


def aligned(fn: Function, name: str, cells: int) -> Function:
    """A function calling fn with the heap's top first raised to a multiple of `cells` (a
    block of padding above the caller's): a derivative program on the interleaved heap
    takes each of its blocks' cells two by two (f's address of a block is half its own,
    rvm.ad.transforms), which a caller's blocks of an odd number of cells would put out
    of step."""
    k = 1 + max((r.n for r in fn.params if r.cls == isa.INT), default=-1)
    top, neg, pad = (Reg(isa.INT, k + j) for j in range(3))
    size = [("SUB", neg, top), ("ADD.mod", pad, neg, Imm(cells)), ("ADD", neg, top)]
    code = [("ALLOC", top, Imm(0)), *size, ("ALLOC", neg, pad),
            ("CALL", FuncRef(fn.name), *fn.params),
            ("FREE", neg, pad), *[(isa.OPS[op].inverse, *args) for op, *args in reversed(size)],
            ("FREE", top, Imm(0))]
    return Function(name, fn.params, tuple(Instruction(op, tuple(args), fn.line)
                                           for op, *args in code), {}, fn.line, fn.end_line,
                    fn.names, fn.symbols)


def parse(text: str, path: str, offset: int = 0) -> ast.Module:
    """ast.parse with every failure a CompileError at file:line:col."""
    try:
        return ast.parse(text, path)
    except SyntaxError as e:
        raise CompileError(f"syntax error: {e.msg}", path, (e.lineno or 1) + offset,
                           e.offset or 1, (e.text or "").rstrip("\n")) from None
    except (RecursionError, MemoryError):
        raise CompileError("expression too deeply nested to parse", path, 1 + offset, 1,
                           hint="split it into several statements") from None


class ReversibleFunction:
    """A function of the reversible subset. Calling it runs it on the VM and returns every
    argument's final value; `~f` is its inverse; `rvm.grad(f, loss=...)` differentiates it.
    Compiled on first use for each argument signature (scalar types, array dtype and rank)."""

    def __init__(self, pyfunc=None, *, node=None, source=None, env=None, backward=False,
                 cache=None):
        self.pyfunc, self.backward = pyfunc, backward
        self._node, self._source, self._env = node, source, env
        self._cache = {} if cache is None else cache
        self.key = id(pyfunc) if pyfunc is not None else (source.file, node.name)
        if pyfunc is not None:
            self.__doc__, self.__name__ = pyfunc.__doc__, pyfunc.__name__

    @property
    def name(self) -> str:
        return self.node.name

    def _parse(self) -> None:
        try:
            lines, start = inspect.getsourcelines(self.pyfunc)
        except (OSError, TypeError):
            name = self.pyfunc.__name__
            raise CompileError(f"cannot read the source of {name}: @rvm.reversible reads "
                               "a function's text, which Python keeps for files and "
                               "notebook cells but not for the interactive prompt or "
                               "`python -c`", "<unknown>", 1, 1,
                               hint=f'there, give the text: {name} = rvm.reversible.source('
                               f'"""def {name}(...): ...""")') from None
        file = inspect.getsourcefile(self.pyfunc) or "<string>"
        text = "".join(lines)
        indent = len(text) - len(text.lstrip(" "))
        tree = parse(textwrap.dedent(text), file, start - 1)
        node = next(n for n in tree.body if isinstance(n, ast.FunctionDef))
        all_lines = linecache.getlines(file) or lines
        self._node = node
        self._source = Source(file, all_lines, start, indent)

    @property
    def node(self) -> ast.FunctionDef:
        if self._node is None:
            self._parse()
        return self._node

    @property
    def source(self) -> Source:
        if self._source is None:
            self._parse()
        return self._source

    def env(self, dotted: str) -> Any:
        """The value of a (dotted) name in the function's enclosing Python scope, or None."""
        head, *rest = dotted.split(".")
        if self._env is not None:
            value = self._env.get(head, getattr(builtins, head, None))
        else:
            f = self.pyfunc
            cells = dict(zip(f.__code__.co_freevars, f.__closure__ or ()))
            if head in cells:
                try:
                    value = cells[head].cell_contents
                except ValueError:
                    value = None
            else:
                value = f.__globals__.get(head, getattr(builtins, head, None))
        for attr in rest:
            value = getattr(value, attr, None)
        return value

    def annotations(self) -> list:
        if "annotations" not in self._cache:
            out = []
            for a in self.node.args.args:
                try:
                    out.append(parse_annotation(a.annotation, self.env))
                except ValueError as e:
                    raise self.source.error(a.annotation, str(e)) from None
            self._cache["annotations"] = out
        return self._cache["annotations"]

    def check_signature(self, sig: tuple, node=None, src=None, values=None) -> tuple:
        """The signature to compile for `sig`; `values` (a Python call's arguments) are
        named by their types in a refusal."""
        params = self.node.args.args
        if len(sig) != len(params):
            where = src or self.source
            msg = (f"{self.name} takes {plural(len(params), 'argument')} "
                   f"({', '.join(a.arg for a in params)}), got {len(sig)}")
            if node is not None:
                raise where.error(node, msg)
            raise MachineError(msg, self.name)
        out = []
        for p, s, ann in zip(params, sig, self.annotations()):
            if ann is None:
                out.append(s)
                continue
            # a call converts as numpy does (np.asarray(x, float)): an int for a float, an
            # int array or list for an Array[float] (rvm.engines.arguments.bind)
            ok = ann == s or (node is None and ((ann == ("float",) and s == ("int",)) or
                                                (ann[0] == s[0] == "array" and
                                                 ann[1] == isa.FLOAT and s[1] == isa.INT and
                                                 ann[2:] == s[2:])))
            if not ok:
                got = _show(s) if values is None else _given(values[len(out)], s)
                msg = (f"argument {p.arg} of {self.name} is declared {_show(ann)}, "
                       f"got {got}")
                if node is not None:
                    raise (src or self.source).error(node, msg)
                raise MachineError(msg, self.name)
            out.append(ann)
        return tuple(out)

    def specialize(self, args) -> tuple[Program, str, list[str]]:
        """(program, entry name, parameter names) for these arguments' signature."""
        try:
            sigs = tuple(map(sig_of, args))
        except MachineError:        # (an argument rvm cannot take: said again, named)
            names = [a.arg for a in self.node.args.args]
            sigs = tuple(sig_of(a, names[k] if k < len(names) else k, self.name)
                         for k, a in enumerate(args))
        sig = self.check_signature(sigs, values=args)
        if sig not in self._cache:
            with _SPECIALIZING:     # threads calling at once share one program (and its code)
                if sig not in self._cache:
                    session = Session()
                    name = session.request(self, sig)
                    program = session.run(self.source.file)
                    self._cache[sig] = (program, name, session.params[name])
        return self._cache[sig]

    def compile(self, sig: tuple | None = None) -> Program:
        """The program for a signature (default: from the annotations)."""
        if sig is None:
            sig = tuple(self.annotations())
            if None in sig:
                raise CompileError(f"{self.name}: annotate every parameter (float, int, "
                                   "Array[float], ...) to compile without arguments",
                                   self.source.file, self.node.lineno + self.source.first - 1,
                                   1)
        session = Session()
        session.request(self, sig)
        return session.run(self.source.file)

    @user_facing
    def __call__(self, *args, **kwargs):
        """Run on the arguments (positional, or by parameter name); every argument's final
        value (functions passed as arguments come back as they are). Other keywords are
        machine options (engine, checks, max_steps, heap_limit, tol, max_depth)."""
        args, machine_options = with_options([a.arg for a in self.node.args.args], args,
                                             kwargs, self.name) if kwargs else (args, {})
        program, name, names = self.specialize(args)
        m = machine_for(program, **machine_options)
        functions = [is_function(a) for a in args]
        values = [a for a, f in zip(args, functions) if not f]
        if names == list(program.functions[name].names):    # straight into native code
            out = iter((m.uncall if self.backward else m.call)(name, *values))
        else:
            m.enter(name, *values, backward=self.backward, names=names)
            out = iter(m.finish())
        return tuple(a if f else next(out) for a, f in zip(args, functions))

    def batch(self, columns: list, **options) -> tuple | None:
        """rvm.vmap's fast path: calls on rows of scalar arguments (one array per
        parameter) in one native loop, or None (the caller loops over the rows)."""
        program, name, names = self.specialize(first_row(columns))
        if names != list(program.functions[name].names) or \
                len(names) != len(self.node.args.args):      # functions as arguments
            return None
        return machine_for(program, **options).batch(name, columns, self.backward)

    def __invert__(self) -> ReversibleFunction:
        return ReversibleFunction(self.pyfunc, node=self._node, source=self._source,
                                  env=self._env, backward=not self.backward,
                                  cache=self._cache)

    def __repr__(self) -> str:
        return f"<reversible function {'~' if self.backward else ''}{self.name}>"

    def __reduce__(self):
        """Pickled by reference when it is a global of an importable module (as Python
        pickles functions: unpickling imports the module), else by value: the Python
        function (cloudpickle, which dask uses, sends it by value), its parse and its
        programs, without their native code (see Program.__reduce__: that is found again
        in the on-disk cache, or compiled, where it is unpickled)."""
        f = self.pyfunc
        if f is not None and f.__module__ != "__main__" and "<" not in f.__qualname__:
            found = sys.modules.get(f.__module__)
            for part in f.__qualname__.split("."):
                found = getattr(found, part, None)
            if isinstance(found, ReversibleFunction) and found.pyfunc is f:
                return _by_name, (f.__module__, f.__qualname__, self.backward)
        return _by_value, (f, self._node, self._source, self._env, self.backward,
                           self._cache)


def _by_name(module: str, qualname: str, backward: bool) -> ReversibleFunction:
    found = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return ~found if backward != found.backward else found


def _by_value(pyfunc, node, source, env, backward, cache) -> ReversibleFunction:
    return ReversibleFunction(pyfunc, node=node, source=source, env=env, backward=backward,
                              cache=cache)


def _show(sig: tuple) -> str:
    if sig[0] == "function":
        return "a function"
    if sig[0] == "array":
        return f"Array[{ {'f': 'float', 'c': 'complex'}.get(sig[1], 'int')}, {sig[2]}]"
    return sig[0]


def _given(value, sig: tuple) -> str:
    """An argument that does not fit its declaration, as a message says it: its type and
    value for a non-number (`str 'a'`), else its kind (`Array[int, 1]`)."""
    if sig[0] == "function" and not hasattr(value, "specialize"):
        sig = ("other",)
    if sig[0] in ("function", "array", "float", "int", "complex"):
        return _show(sig)
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def reversible(pyfunc) -> ReversibleFunction:
    """Decorator: compile a function of the reversible Python subset for the rvm VM."""
    return ReversibleFunction(pyfunc)


_TEXTS = itertools.count(1)


def from_source(text: str, env: dict | None = None):
    """`rvm.reversible.source(text)`: the reversible function defined by `text` (a `def`,
    with or without its decorator), or a tuple of them if it defines several, for where
    Python keeps no source to read: the interactive prompt, `python -c`, exec'd strings.
    Names in the text (other reversible functions, constants, math) are looked up in the
    other functions of the text, then `env` (default: the caller's globals)."""
    if not isinstance(text, str):
        raise TypeError(f"rvm.reversible.source takes the text of a function, got "
                        f"{type(text).__name__}")
    text = textwrap.dedent(text)
    file = f"<rvm.reversible.source {next(_TEXTS)}>"
    lines = text.splitlines(keepends=True)
    linecache.cache[file] = (len(text), None, lines, file)    # for messages and listings
    tree = parse(text, file)
    scope = collections.ChainMap({}, sys._getframe(1).f_globals if env is None else env)
    functions = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            rf = ReversibleFunction(node=node, source=Source(file, lines), env=scope)
            scope.maps[0][node.name] = rf
            functions.append(rf)
    if not functions:
        raise CompileError("rvm.reversible.source: the text defines no function", file, 1,
                           1, hint="give the whole `def f(...):` with its body")
    return functions[0] if len(functions) == 1 else tuple(functions)


reversible.source = from_source


def compile_file(path: str, transforms: dict | None = None) -> Program:
    """Compile every @reversible function of a Python file (parameters annotated) without
    running the file: constants come from its literal module-level assignments, functions
    from `from rvm.lib import f` (rvm's own modules are imported), and
    `name = rvm.adjoint(f)` / `rvm.tangent(f)` of a function above is understood (the
    caller passes those transforms in `transforms`, by name)."""
    import math

    import numpy
    with open(path, encoding="utf-8") as f:
        text = f.read()
    tree = parse(text, path)
    env: dict[str, Any] = {"math": math, "np": numpy, "numpy": numpy}
    source = Source(path, text.splitlines(keepends=True))
    functions = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                node.module.split(".")[0] == "rvm":
            # rvm's own functions (`from rvm.lib import logsumexp`): rvm's modules are
            # imported; the file's other imports are not run
            try:
                module = importlib.import_module(node.module)
            except ImportError:
                raise CompileError(f"no module {node.module}", path, node.lineno,
                                   node.col_offset + 1) from None
            for alias in node.names:
                value = getattr(module, alias.name, None)
                if isinstance(value, ReversibleFunction):
                    env[alias.asname or alias.name] = value
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            # only literal constants are read (the file is not run); others are skipped
            with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError,
                                     RecursionError):
                env[node.targets[0].id] = ast.literal_eval(node.value)
            value = node.value
            if isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords \
                    and isinstance(value.args[0], ast.Name) and \
                    ast.unparse(value.func).split(".")[-1] in (transforms or {}) and \
                    isinstance(env.get(value.args[0].id), ReversibleFunction):
                make = transforms[ast.unparse(value.func).split(".")[-1]]
                env[node.targets[0].id] = make(env[value.args[0].id])
        if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).split(".")[-1] == "reversible" for d in node.decorator_list):
            rf = ReversibleFunction(node=node, source=source, env=env)
            env[node.name] = rf
            functions.append(rf)
    if not functions:
        raise CompileError("no @reversible function in the file", path, 1, 1)
    session, unannotated = Session(), {}
    for rf in functions:
        sig = tuple(rf.annotations())
        if None in sig:       # typed by the arguments of a call (see `specialized`)
            unannotated[rf.name] = rf
            continue
        session.request(rf, sig)
    program = session.run(path)
    program.cache["unannotated"] = unannotated
    return program


def specialized(program: Program, name: str, args) -> tuple[Program, str]:
    """The program and entry for calling `name` of a compiled file on these arguments:
    itself, or, for a function whose parameters are not annotated, a program compiled
    for the arguments' types."""
    rf = program.cache.get("unannotated", {}).get(name)
    if rf is None:
        return program, name
    compiled, entry, _ = rf.specialize(args)
    return compiled, entry
