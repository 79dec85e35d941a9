"""The package's modules keep to their boundaries: none imports another module's
underscore names, and none reaches into another object's underscore attributes.

What one module needs of another gets a public name; where users are not meant to call
it, its docstring says it is for the package's own modules and why (for example
``SegmentLog.with_store``). An underscore name stays the business of its class and of
the module that defines that class. The few exceptions are listed in :data:`ALLOWED`,
each with its reason.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "disklesslog"

NAMEDTUPLE_API = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})
"""A named tuple's own public API, anywhere: its names start with an underscore only so
that they cannot clash with field names."""

ALLOWED: dict[str, str] = {
    # The expression as written (so a file may move): why it uses a library's internals.
    "future._state": "Future internals: _BatchFuture (writer.py) settles a batch's futures at once",
    "future._result": "Future internals: the offset, set as set_result() would",
    "future._exception": "Future internals: the error, set as set_exception() would",
    "future._waiters": "Future internals: the wait()/as_completed() waiters to wake",
    "future._done_callbacks": "Future internals: callbacks, run after the batch settled",
    "future._invoke_callbacks": "Future internals: run them as set_result() would",
    "lock._at_fork_reinit": "the standard library's way to free a lock in a fork child "
    "(threading, logging and concurrent.futures use it): forks.fork_safe_lock",
    "os._exit": "a crash test's child process exits at once, running no cleanup",
    "self.fs._strip_protocol": "fsspec's path normalisation, by which find() keys its answers",
    "fs._strip_protocol": "fsspec's path normalisation, by which cat() keys its answers",
}
"""The accesses to underscore attributes of other objects that are on purpose: internals
of the standard library or of fsspec, used for speed or for want of a public name."""


@dataclass(frozen=True)
class Access:
    """One use of an underscore name of something other than ``self``/``cls``/``super()``."""

    path: str
    line: int
    name: str
    text: str
    owner: ast.ClassDef | None
    """The class the access is written in (``None``: a module-level function)."""

    def __str__(self) -> str:
        return f"disklesslog/{self.path}:{self.line}: {self.text} (attribute {self.name})"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_self(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super"
    return False


Modules = tuple[tuple[str, ast.Module], ...]
"""Parsed modules, by path under ``disklesslog/``."""


@functools.cache
def _package() -> Modules:
    """Every module of the package, parsed (once for all the tests)."""
    modules = tuple(
        (path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    )
    assert len(modules) > 50, f"the package's modules were not found under {PACKAGE}"
    return modules


def _own_names(cls: ast.ClassDef) -> set[str]:
    """What a class defines: its body's functions and assignments, and the attributes its
    methods use on ``self``/``cls`` (its own state, inherited included)."""
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for inner in ast.walk(cls):
        if isinstance(inner, ast.Attribute) and _is_self(inner.value):
            names.add(inner.attr)
    return names


class _Finder(ast.NodeVisitor):
    """Every ``obj._name`` (and ``getattr(obj, "_name")``) where ``obj`` is not
    ``self``, ``cls`` or ``super()``, with the class it is written in."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.classes: list[ast.ClassDef] = []
        self.found: list[Access] = []

    def _add(self, node: ast.expr, name: str) -> None:
        owner = self.classes[-1] if self.classes else None
        self.found.append(Access(self.path, node.lineno, name, ast.unparse(node), owner))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node)
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if _private(node.attr) and not _is_self(node.value):
            self._add(node, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func, args = node.func, node.args
        if (
            isinstance(func, ast.Name)
            and func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(args) >= 2
            and isinstance(args[1], ast.Constant)
            and isinstance(args[1].value, str)
            and _private(args[1].value)
            and not _is_self(args[0])
        ):
            self._add(node, args[1].value)
        self.generic_visit(node)


def _underscore_imports(modules: Modules) -> list[str]:
    """Every ``from M import _name``, as ``file:line: the import``."""
    return [
        f"disklesslog/{path}:{node.lineno}: from {'.' * node.level}{node.module or ''} "
        f"import {alias.name}"
        for path, tree in modules
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if _private(alias.name)
    ]


def _accesses(modules: Modules) -> Iterator[tuple[Access, set[str]]]:
    """Each access, with the underscore names the classes of its module define."""
    for path, tree in modules:
        module_names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                module_names |= _own_names(node)
        finder = _Finder(path)
        finder.visit(tree)
        for access in finder.found:
            yield access, module_names


@functools.cache
def _judge(modules: Modules) -> tuple[list[Access], set[str]]:
    """The accesses no rule allows, and the entries of :data:`ALLOWED` that were used."""
    bad: list[Access] = []
    used: set[str] = set()
    own: dict[int, set[str]] = {}
    for access, module_names in _accesses(modules):
        if access.name in NAMEDTUPLE_API:
            continue
        if access.text in ALLOWED:
            used.add(access.text)
            continue
        if access.owner is None:
            # A module-level function on an object of a class of its own module (a
            # fork handler resetting its module's instances).
            if access.name in module_names:
                continue
        else:
            # A class on another instance of itself (a classmethod filling a new one).
            names = own.setdefault(id(access.owner), _own_names(access.owner))
            if access.name in names:
                continue
        bad.append(access)
    return bad, used


SAMPLE = """
from .writer import Writer, _Flush


class Log:
    def __init__(self) -> None:
        self._stores = {}

    def merged(self, other: Log) -> dict:
        return {**self._stores, **other._stores}


class Stream:
    def append(self) -> None:
        self._log._with_store(super()._name, cls._kind)
        getattr(self._log, "_stores")


def after_fork(log: Log, row: Row) -> None:
    log._stores.clear()
    row._replace(a=1)
    os._exit(0)
"""


def test_the_checks_find_what_they_look_for() -> None:
    """On a sample: a class's own state, used by the class or its module, a named tuple's
    API and an allowed internal pass; another class's private state does not."""
    modules = (("sample.py", ast.parse(SAMPLE)),)
    assert _underscore_imports(modules) == ["disklesslog/sample.py:2: from .writer import _Flush"]
    bad, used = _judge(modules)
    assert [str(access) for access in bad] == [
        "disklesslog/sample.py:15: self._log._with_store (attribute _with_store)",
        "disklesslog/sample.py:16: getattr(self._log, '_stores') (attribute _stores)",
    ]
    assert used == {"os._exit"}


def test_no_module_imports_underscore_names() -> None:
    found = _underscore_imports(_package())
    assert not found, (
        "modules import other modules' underscore names; give the name a public one "
        "(documented as for the package's own modules) instead:\n" + "\n".join(found)
    )


def test_no_module_reaches_into_other_objects_private_attributes() -> None:
    bad, _ = _judge(_package())
    assert not bad, (
        "underscore attributes used on objects other than self/cls/super(), outside the "
        "class (or module) that defines them; give the owner a public method or attribute "
        "documented as for the package's own modules, or pass what is needed explicitly "
        "(library internals used on purpose go in ALLOWED, with the reason):\n"
        + "\n".join(map(str, bad))
    )


def test_every_allowed_exception_is_still_needed() -> None:
    _, used = _judge(_package())
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"entries of ALLOWED that no code uses any more: {stale}"
