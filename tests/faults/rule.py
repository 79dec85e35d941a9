"""The rule the fault suite checks, written once (docs/architecture.md, "No silent loss").

No damage to anything the project writes, and no fault of the storage under it, leads to
silently wrong or missing data: every observation either equals the model (the damage
did not matter, or was repaired) or raises a :class:`~disklesslog.DisklessLogError`
subclass. Any other exception escaping a public call breaks the rule too.

:func:`classify` turns what an observation did into one outcome:

``intact``        equal to the model, nothing logged
``repaired``      equal to the model, and the library logged a warning about it
``typed``         raised a ``DisklessLogError`` (an honest "this is damaged / failed")
``untyped-oserror`` raised a plain ``OSError`` that is not a ``DisklessLogError``: the
                  known gap the ``StorageError(DisklessLogError, OSError)`` fix closes;
                  still a violation of the rule, reported apart so it is recognisable
``VIOLATION``     a wrong answer (different from the model), or any other exception

:class:`Ledger` counts outcomes per kind and keeps a few examples of each violation;
with ``DL_FAULTS_REPORT=path`` every ledger is appended to that file as a JSON line, the
figures docs/faults.md records (``tests/faults/report.py`` sums them).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from disklesslog import DisklessLogError

INTACT = "intact"
REPAIRED = "repaired"
TYPED = "typed"
UNTYPED_OSERROR = "untyped-oserror"
VIOLATION = "VIOLATION"
BAD = (UNTYPED_OSERROR, VIOLATION)
"""Outcomes that break the rule."""

_MISSING = object()


def where(exc: BaseException) -> str:
    """The innermost frame of disklesslog's own code the exception passed through
    (``module.py:line in function``): where a fix belongs."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [
        f for f in frames if "/disklesslog/" in f.filename and "testing/faults" not in f.filename
    ]
    frame = (ours or frames or [None])[-1]
    if frame is None:
        return "?"
    path = frame.filename.split("/disklesslog/", 1)[-1]
    return f"disklesslog/{path}:{frame.lineno} in {frame.name}"


def describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {str(exc)[:200]} [{where(exc)}]"


def exception_outcome(exc: BaseException) -> str:
    if isinstance(exc, DisklessLogError):
        return TYPED
    if isinstance(exc, OSError):
        return UNTYPED_OSERROR
    return VIOLATION


class _Warnings(logging.Handler):
    """Counts warnings (and worse) disklesslog logs: a repair must be logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage()[:200])


@contextmanager
def watching_logs() -> Iterator[_Warnings]:
    handler = _Warnings()
    logger = logging.getLogger("disklesslog")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


@dataclass
class Ledger:
    """Outcomes per kind (a file kind, a fault campaign) for one test."""

    campaign: str
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    figures: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.counts[(kind, outcome)] += 1
            if outcome in BAD:
                found = self.examples.setdefault((kind, outcome), [])
                if len(found) < 5 and detail not in found:
                    found.append(detail)

    def exception(self, kind: str, exc: BaseException, context: str = "") -> str:
        outcome = exception_outcome(exc)
        self.add(kind, outcome, f"{context}: {describe(exc)}" if context else describe(exc))
        return outcome

    def observe(
        self,
        kind: str,
        name: str,
        expected: Any,
        call: Callable[[], Any],
        context: str = "",
    ) -> str:
        """Run one observation and classify it against the expected value."""
        with watching_logs() as warned:
            try:
                got = call()
            except BaseException as exc:
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                return self.exception(kind, exc, f"{context} {name}")
        if got == expected:
            outcome = REPAIRED if warned.messages else INTACT
            self.add(kind, outcome)
            return outcome
        self.add(kind, VIOLATION, f"{context} {name}: got {short(got)}, expected {short(expected)}")
        return VIOLATION

    def violations(self) -> list[str]:
        lines = []
        for (kind, outcome), found in sorted(self.examples.items()):
            lines.append(f"{kind} -> {outcome} x{self.counts[(kind, outcome)]}")
            lines.extend(f"    {e}" for e in found)
        return lines

    def total(self, outcome: str | None = None) -> int:
        return sum(n for (_, o), n in self.counts.items() if outcome is None or o == outcome)

    def save(self) -> None:
        path = os.environ.get("DL_FAULTS_REPORT")
        if not path:
            return
        line = json.dumps(
            {
                "campaign": self.campaign,
                "counts": [[k, o, n] for (k, o), n in sorted(self.counts.items())],
                "figures": dict(self.figures),
                "examples": {f"{k}|{o}": e for (k, o), e in sorted(self.examples.items())},
            }
        )
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    def check(self) -> None:
        """Save the figures, then fail with every violation found."""
        self.save()
        bad = self.violations()
        assert not bad, "the rule is broken:\n" + "\n".join(bad)


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 160 else text[:160] + "..."
