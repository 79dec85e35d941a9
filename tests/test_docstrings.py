"""The public API documents itself: ``help()`` and the API reference (rendered from the
same docstrings) say what every public name is for.

Checked here: everything in ``disklesslog.__all__``, the public methods and properties
of its classes (inherited ones included), every exception class of
``disklesslog.errors``, each field of the dataclasses and named tuples among them, and
that ``disklesslog.open`` lists every option the code accepts, taken from the backends'
option registry (:func:`disklesslog.urls.log_options`) and :class:`StreamConfig`, so a
new option cannot go undocumented.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import disklesslog
import disklesslog.errors
from disklesslog.urls import log_options

PUBLIC = {name: getattr(disklesslog, name) for name in disklesslog.__all__ if name != "__version__"}
ERRORS = {
    name: value
    for name, value in vars(disklesslog.errors).items()
    if inspect.isclass(value) and issubclass(value, BaseException)
}


def _own_members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties of ``cls`` defined by the package's classes in its
    MRO (not by ``object``, ``Exception`` or ``tuple``)."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("disklesslog"):
            continue
        for name, attribute in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            seen.add(name)
            value = attribute
            if isinstance(attribute, staticmethod | classmethod):
                value = attribute.__func__
            if isinstance(value, property | functools.cached_property) or inspect.isfunction(value):
                yield f"{klass.__name__}.{name}", value


def _documented(value: Any) -> bool:
    doc = value.__doc__
    return isinstance(doc, str) and len(doc.split()) >= 3


def test_every_public_name_has_a_docstring() -> None:
    missing = [name for name, value in PUBLIC.items() if not _documented(value)]
    assert missing == []


@pytest.mark.parametrize("name", sorted(n for n, v in PUBLIC.items() if inspect.isclass(v)))
def test_every_public_method_and_property_has_a_docstring(name: str) -> None:
    missing = [member for member, value in _own_members(PUBLIC[name]) if not _documented(value)]
    assert missing == []


def test_every_exception_class_and_its_methods_have_docstrings() -> None:
    assert set(disklesslog.errors.__all__) <= set(ERRORS)
    missing = [name for name, cls in ERRORS.items() if not _documented(cls)]
    missing += [
        member
        for cls in ERRORS.values()
        for member, value in _own_members(cls)
        if not _documented(value)
    ]
    assert missing == []


def _field_docstrings(cls: type) -> dict[str, str | None]:
    """Each annotated field of ``cls`` and the string literal right after it in the
    source (the attribute docstring the reference renders), or ``None``."""
    source = Path(inspect.getfile(cls)).read_text(encoding="utf-8")
    node = next(
        n
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.ClassDef) and n.name == cls.__name__
    )
    fields: dict[str, str | None] = {}
    for statement, following in zip(node.body, [*node.body[1:], None]):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            doc = None
            if (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                doc = following.value.value
            fields[statement.target.id] = doc
    return fields


FIELD_CLASSES = [disklesslog.StreamConfig, disklesslog.StreamInfo, disklesslog.Record]


@pytest.mark.parametrize("cls", FIELD_CLASSES, ids=lambda cls: cls.__name__)
def test_every_field_has_a_docstring(cls: type) -> None:
    fields = _field_docstrings(cls)
    assert fields, f"no fields found in {cls.__name__}"
    assert [name for name, doc in fields.items() if not doc] == []


def test_stream_config_fields_give_their_unit_and_default() -> None:
    fields = _field_docstrings(disklesslog.StreamConfig)
    assert set(fields) == disklesslog.StreamConfig.field_names()
    for name, doc in fields.items():
        assert doc is not None
        assert "default" in doc.lower(), f"{name}: no default"
        if name.endswith("_ms"):
            assert "milliseconds" in doc, f"{name}: no unit"
        if name.endswith("_bytes"):
            assert "bytes" in doc, f"{name}: no unit"


def _accepted_options() -> set[str]:
    """Every keyword ``disklesslog.open`` accepts on some backend."""
    names = set(disklesslog.StreamConfig.field_names())
    for options in log_options().values():
        names |= options
    return names


def test_open_lists_every_option_the_backends_accept() -> None:
    doc = disklesslog.open.__doc__
    assert doc is not None
    assert {"segments", "objects"} <= set(log_options())
    mentioned = set(re.findall(r"``(\w+)``", doc))
    assert sorted(_accepted_options() - mentioned) == []
