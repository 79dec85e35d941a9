"""Corruption fuzzing (:mod:`tests.faults.corruption`): damaged copies of every kind of
file and object the project writes, each observed against the undamaged model.

The default run damages every file of four subjects (a local log with its tier, object
logs with the SQLite and the object-store sequencer, a disk cache) a few times each,
over 1,000 copies in all, and the rows of an object log's PostgreSQL sequencer
(:mod:`tests.faults.rows`); the slow run more times with other seeds."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from .rows import KIND, TABLES, Rows, build_postgres, fuzz_rows
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
    kinds = {KIND}  # rows, not files: test_damaged_postgres_rows checks their tables
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


ROW_COPIES = {"per_column": 1, "per_table": 1}
"""Damaged values per trusted column, and rows deleted (and as many duplicated) per
table, in the default run: about 55 copies in 5 s (each costs new connections and the
observations' round trips to the server); the slow run, 8 and 6 times as many (about
380 copies, 20 to 40 s)."""


@contextmanager
def _postgres_subject(scratch: Path, server: str) -> Iterator[tuple[Subject, Path, Rows]]:
    """The PostgreSQL subject, its files' pristine copy, its rows saved; the model taken
    with both put back after. Its schema (and the rows' copy) are dropped on exit."""
    from disklesslog.testing.servers.postgres import drop_schema

    schema = f"faults_{uuid.uuid4().hex[:16]}"
    work = scratch / "work"
    work.mkdir(parents=True)
    try:
        with build_postgres(work, server, schema) as (subject, rows):
            pristine = scratch / "pristine"
            shutil.copytree(work, pristine)
            rows.save()
            subject.models = [run_observations(subject, None, "pristine")]
            rows.restore()
            yield subject, pristine, rows
    finally:
        drop_schema(server, schema)


@pytest.mark.postgres
def test_damaged_postgres_rows(scratch: Path, postgres_server: str) -> None:
    with _postgres_subject(scratch, postgres_server) as (subject, pristine, rows):
        ledger = Ledger("corruption:objects-postgres")
        made = fuzz_rows(subject, pristine, rows, ledger, **ROW_COPIES)
    assert made >= 40
    damaged = {t for t in TABLES if ledger.figures[f"copies.{KIND}.{t}"]}
    assert damaged == set(TABLES), f"no damaged copy of {sorted(set(TABLES) - damaged)}"
    ledger.check()


@pytest.mark.slow
@pytest.mark.postgres
def test_damaged_postgres_rows_long(scratch: Path, postgres_server: str) -> None:
    with _postgres_subject(scratch, postgres_server) as (subject, pristine, rows):
        ledger = Ledger("corruption-long:objects-postgres")
        fuzz_rows(
            subject,
            pristine,
            rows,
            ledger,
            per_column=8 * ROW_COPIES["per_column"],
            per_table=6 * ROW_COPIES["per_table"],
            seed=1,
        )
    ledger.check()
