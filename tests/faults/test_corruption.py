"""Corruption fuzzing (:mod:`tests.faults.corruption`): damaged copies of every kind of
file and object the project writes, each observed against the undamaged model.

The default run damages every file of four subjects (a local log with its tier, object
logs with the SQLite and the object-store sequencer, a disk cache) a few times each,
over 1,000 copies in all; the slow run more times with other seeds."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from .corruption import (
    REQUIRED,
    Subject,
    build_cache,
    build_local,
    build_objects,
    files_of,
    fuzz,
    kind_of,
    run_observations,
)
from .rule import Ledger

BUILDERS: dict[str, Callable[[Path], Subject]] = {
    "local": build_local,
    "objects-sqlite": lambda root: build_objects(root, "sqlite"),
    "objects-objectstore": lambda root: build_objects(root, "objectstore"),
    "objects-cached": build_cache,
}

COPIES = {"local": 8, "objects-sqlite": 6, "objects-objectstore": 4, "objects-cached": 12}
"""Damaged copies per file in the default run (more where files are few)."""


def _subject(name: str, tmp_path: Path) -> tuple[Subject, Path]:
    work = tmp_path / "work"
    work.mkdir(parents=True)
    subject = BUILDERS[name](work)
    pristine = tmp_path / "pristine"
    shutil.copytree(work, pristine)
    subject.models = [run_observations(subject, None, "pristine")]
    for change in subject.alternatives:
        shutil.rmtree(work)
        shutil.copytree(pristine, work)
        change(work)
        subject.models.append(run_observations(subject, None, "alternative"))
    shutil.rmtree(work)
    shutil.copytree(pristine, work)
    return subject, pristine


def test_the_catalogue_covers_every_kind_the_issue_lists(scratch: Path) -> None:
    kinds = set()
    for name in BUILDERS:
        subject, pristine = _subject(name, scratch / name)
        for relative in files_of(subject, pristine):
            kind = kind_of(relative)
            assert kind is not None, f"{relative} is of no catalogued kind"
            kinds.add(kind)
    missing = REQUIRED - kinds
    assert not missing, f"the subjects write no file of kinds {sorted(missing)}"


@pytest.mark.parametrize("name", list(BUILDERS))
def test_damaged_copies(name: str, scratch: Path) -> None:
    subject, pristine = _subject(name, scratch)
    ledger = Ledger(f"corruption:{name}")
    made = fuzz(subject, pristine, ledger, copies_per_file=COPIES[name])
    assert made >= 100
    ledger.check()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDERS))
def test_damaged_copies_long(name: str, scratch: Path) -> None:
    subject, pristine = _subject(name, scratch)
    ledger = Ledger(f"corruption-long:{name}")
    fuzz(subject, pristine, ledger, copies_per_file=4 * COPIES[name], seed=1)
    ledger.check()
