"""Corruption fuzzing of the PostgreSQL sequencer's rows, in the style of
:mod:`tests.faults.corruption`.

The subject is an object log on ``file://`` sequenced by PostgreSQL in a schema of its
own (:func:`build_postgres`, filled as :func:`~tests.faults.corruption.build_objects`
fills every object log). Its rows are what is damaged: for every table of the schema
(:data:`TABLES`: a table no entry names fails the run, so a new table cannot escape),
every column a read trusts gets values damaged the ways a file's bytes are, adapted to
values (:func:`damage_value`), on sampled rows; and sampled rows are deleted, or
duplicated where the schema's constraints let a duplicate in. Each damaged version of
the rows is one damaged copy of kind ``postgres-row``, observed on a fresh handle with
the same observations and model as the other object logs; then the pristine rows are
put back from a copy of every table in a schema beside it (:class:`Rows`), in one
transaction, with the identity sequences where they were, so every copy starts from the
same state and answers the same new offsets and ids.
"""

from __future__ import annotations

import random
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
from psycopg import sql

from .corruption import Pristine, Subject, build_objects, run_observations, worst
from .rule import Ledger

KIND = "postgres-row"
"""The catalogue kind every damaged version of the rows counts under."""

TABLES: dict[str, str] = {
    "streams": "every call: a stream's extent, config, time-index state and tail gap",
    "batches": "reads and offset_for_time: where each batch is, its offsets and times",
    "objects": "reads (a batch names its object by key), garbage collection, live counts",
    "time_index": "offset_for_time: the entry below a timestamp",
    "producer_streams": "a producer's commits: its sequence state on a stream",
    "producers": "writers: a named producer's epoch (fencing)",
    "group_offsets": "committed_offsets: one row per group and stream",
    "groups": "committed_offsets: how many offset rows a group has",
    "stream_count": "every call that finds no stream, and create_stream: how many there are",
    "transactions": "commit_transaction: a committed id and its ranges",
    "leases": "lease calls: a lease's holder, fencing token and serial",
    "lease_count": "a lease call that finds no row: how many leases were taken",
    "schema_version": "opening: which migrations the schema has had",
}
"""Every table of the sequencer's schema, and what trusts it."""

UNREAD = {
    ("schema_version", "description"): "written for people, never read",
    ("schema_version", "applied_at"): "written for people, never read",
}
"""Columns no call reads: not damaged."""

VALUE_DAMAGES = ("bitflip", "zero", "truncate", "garbage", "null")
ROW_DAMAGES = ("delete", "duplicate")

_BITS = {"bigint": 64, "integer": 32}

VACUUM_EVERY = 20
"""Restores between two VACUUMs of the schema's tables, which each restore fills with
dead rows."""


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # information_schema's data_type: bigint, integer, text, double precision
    nullable: bool  # else the "null" damage is skipped: NOT NULL refuses it
    identity: bool


def damage_value(value: Any, column: Column, how: str, rng: random.Random) -> Any:
    """``value`` damaged as file bytes are, in the terms of its column's type.

    ``bitflip`` flips 1-3 bits of an integer's two's complement (of the column's width),
    of a float's IEEE-754 bytes, or of a text's UTF-8 (keeping text PostgreSQL can store:
    valid UTF-8 without NUL); ``zero`` is the type's zero (``0``, ``0.0``, ``''``);
    ``truncate`` cuts the value's text (an integer's decimal digits, a float's
    ``repr``, a text's bytes) short; ``garbage`` appends 1-3 decimal digits to a number
    (wrapped to the column's width) or 1-16 characters to a text; ``null`` is SQL NULL.
    A NULL damaged otherwise starts from the type's zero: a lost null bit."""
    if how == "null":
        return None
    if value is None:
        value = _zero(column)
    if how == "zero":
        return _zero(column)
    if column.type in _BITS:
        return _damage_int(int(value), _BITS[column.type], how, rng)
    if column.type == "double precision":
        return _damage_float(float(value), how, rng)
    if column.type == "text":
        return _damage_text(str(value), how, rng)
    raise AssertionError(f"no damage for a {column.type} column ({column.name}): add one")


def _zero(column: Column) -> Any:
    if column.type in _BITS:
        return 0
    return 0.0 if column.type == "double precision" else ""


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _damage_int(value: int, bits: int, how: str, rng: random.Random) -> int:
    if how == "bitflip":
        for _ in range(rng.randint(1, 3)):
            value ^= 1 << rng.randrange(bits)
        return _signed(value, bits)
    digits = str(abs(value))
    sign = -1 if value < 0 else 1
    if how == "truncate":
        return sign * int(digits[: rng.randrange(len(digits))] or "0")
    extra = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3)))
    return _signed(sign * int(digits + extra), bits)


def _damage_float(value: float, how: str, rng: random.Random) -> float:
    if how == "bitflip":
        (bits,) = struct.unpack(">q", struct.pack(">d", value))
        (flipped,) = struct.unpack(">d", struct.pack(">q", _damage_int(bits, 64, how, rng)))
        return float(flipped)
    text = repr(value)
    if how == "truncate":
        try:
            return float(text[: rng.randrange(len(text))] or "0")
        except ValueError:  # cut inside "inf", "nan" or an exponent
            return 0.0
    try:
        return float(text + "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 3))))
    except ValueError:  # "nan7": not a number, flip a bit of it instead
        return _damage_float(value, "bitflip", rng)


def _damage_text(value: str, how: str, rng: random.Random) -> str:
    data = value.encode("utf-8")
    if how == "truncate":
        return data[: rng.randrange(len(data))].decode("utf-8", "ignore") if data else ""
    if how == "garbage":
        alphabet = [chr(c) for c in (*range(0x20, 0x7F), 0x7B, 0x7D, 0xE9, 0x3A9, 0x263A)]
        return value + "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
    for _ in range(64):  # bitflip: until the result is text PostgreSQL stores
        out = bytearray(data or b"\x00")
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        try:
            text = bytes(out).decode("utf-8")
        except UnicodeDecodeError:
            continue
        if "\x00" not in text and text != value:
            return text
    raise AssertionError(f"no storable bit flip of {value!r}")


# ------------------------------------------------------------------ the rows


class Rows:
    """A sequencer's schema on a server, with a pristine copy of every table in the
    schema ``<schema>_pristine`` (:meth:`save`) to put back (:meth:`restore`): all
    tables emptied and refilled, identity sequences reset, in one transaction."""

    def __init__(self, server: str, schema: str) -> None:
        self.schema = schema
        self.copy = f"{schema}_pristine"
        self.conn = psycopg.connect(server, autocommit=True)
        # a leftover transaction of a damaged copy would make restore wait: fail instead
        self.conn.execute("SET lock_timeout = '20s'")
        self.columns: dict[str, list[Column]] = {}
        self._restore: sql.Composed | None = None
        self._restores = 0

    def close(self) -> None:
        with self.conn:
            self.conn.execute(
                sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(self.copy))
            )

    def save(self) -> None:
        """Copy every table as it is now; later :meth:`restore` calls go back to it."""
        s, p = sql.Identifier(self.schema), sql.Identifier(self.copy)
        found = self.conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable = 'YES',"
            " is_identity = 'YES' FROM information_schema.columns WHERE table_schema = %s"
            " ORDER BY table_name, ordinal_position",
            (self.schema,),
        ).fetchall()
        self.columns = {}
        for table, *described in found:
            self.columns.setdefault(table, []).append(Column(*described))
        # DELETE, not TRUNCATE: about 2 ms a restore instead of 50 on tables this small
        # (TRUNCATE makes new files for every table and index); restore() vacuums
        statements = [sql.SQL("DELETE FROM {}").format(t) for t in self._tables()]
        self.conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(p))
        self.conn.execute(sql.SQL("CREATE SCHEMA {}").format(p))
        for table, columns in sorted(self.columns.items()):
            t = sql.Identifier(table)
            self.conn.execute(sql.SQL("CREATE TABLE {}.{} AS TABLE {}.{}").format(p, t, s, t))
            names = sql.SQL(", ").join(sql.Identifier(c.name) for c in columns)
            statements.append(
                sql.SQL(
                    "INSERT INTO {}.{} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM {}.{}"
                ).format(s, t, names, names, p, t)
            )
            for column in columns:
                if column.identity:
                    statements.append(self._sequence_reset(table, column.name))
        self._restore = sql.SQL("; ").join(statements)

    def _tables(self) -> list[sql.Composed]:
        schema = sql.Identifier(self.schema)
        return [sql.SQL("{}.{}").format(schema, sql.Identifier(t)) for t in sorted(self.columns)]

    def _sequence_reset(self, table: str, column: str) -> sql.Composed:
        """The statement that puts the identity sequence of ``table.column`` back where
        it is now (``setval``), so each copy's new rows get the same ids."""
        name = self.conn.execute(
            "SELECT pg_get_serial_sequence(format('%%I.%%I', %s::text, %s::text), %s)",
            (self.schema, table, column),
        ).fetchone()
        assert name is not None and name[0], f"no sequence for {table}.{column}"
        (last, called) = self.conn.execute(
            sql.SQL("SELECT last_value, is_called FROM {}").format(sql.SQL(name[0]))
        ).fetchone() or (1, False)
        return sql.SQL("SELECT setval({}, {}, {})").format(
            sql.Literal(name[0]), sql.Literal(last), sql.Literal(called)
        )

    def restore(self) -> None:
        assert self._restore is not None, "save() first"
        with self.conn.transaction():
            self.conn.execute(self._restore)
        self._restores += 1
        if self._restores % VACUUM_EVERY == 0:  # else every scan reads more dead rows
            self.conn.execute(sql.SQL("VACUUM {}").format(sql.SQL(", ").join(self._tables())))

    def ctids(self, table: str) -> list[str]:
        """The places of the rows of ``table``, ordered by their values (every table has
        a primary key: no two rows are equal), so a seed picks the same row whatever
        place :meth:`restore` gave it."""
        query = sql.SQL("SELECT r.ctid::text FROM {}.{} AS r ORDER BY r")
        rows = self.conn.execute(query.format(*self._names(table))).fetchall()
        return [row[0] for row in rows]

    def _names(self, table: str) -> tuple[sql.Identifier, sql.Identifier]:
        return sql.Identifier(self.schema), sql.Identifier(table)

    def value(self, table: str, column: str, ctid: str) -> Any:
        query = sql.SQL("SELECT {} FROM {}.{} WHERE ctid = %s::tid")
        row = self.conn.execute(
            query.format(sql.Identifier(column), *self._names(table)), (ctid,)
        ).fetchone()
        assert row is not None
        return row[0]

    def apply(self, statement: sql.Composed, params: tuple[Any, ...]) -> bool:
        """Run one damaging statement; False when the schema refuses it (a constraint,
        a value out of the column's range): no damaged copy then."""
        try:
            cursor = self.conn.execute(statement, params)
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
            return False
        return bool(cursor.rowcount == 1)

    def update(self, table: str, column: Column, ctid: str, value: Any) -> bool:
        s, t = self._names(table)
        if not column.identity:
            query = sql.SQL("UPDATE {}.{} SET {} = %s WHERE ctid = %s::tid")
            return self.apply(query.format(s, t, sql.Identifier(column.name)), (value, ctid))
        # An id the database assigns cannot be UPDATEd (GENERATED ALWAYS): the row is
        # replaced by one with the damaged id instead.
        every = self.columns[table]
        names = [sql.Identifier(c.name) for c in every]
        values = [sql.SQL("%s") if c == column else sql.Identifier(c.name) for c in every]
        query = sql.SQL(
            "WITH d AS (DELETE FROM {}.{} WHERE ctid = %s::tid RETURNING *)"
            " INSERT INTO {}.{} ({}) OVERRIDING SYSTEM VALUE SELECT {} FROM d"
        )
        return self.apply(
            query.format(s, t, s, t, sql.SQL(", ").join(names), sql.SQL(", ").join(values)),
            (ctid, value),
        )

    def delete(self, table: str, ctid: str) -> bool:
        query = sql.SQL("DELETE FROM {}.{} WHERE ctid = %s::tid")
        return self.apply(query.format(*self._names(table)), (ctid,))

    def duplicate(self, table: str, ctid: str) -> bool:
        """A second row with the same values, but the ids the database assigns (a copy
        with the same id is refused by its primary key)."""
        names = sql.SQL(", ").join(
            sql.Identifier(c.name) for c in self.columns[table] if not c.identity
        )
        query = sql.SQL("INSERT INTO {}.{} ({}) SELECT {} FROM {}.{} WHERE ctid = %s::tid")
        s, t = self._names(table)
        return self.apply(query.format(s, t, names, names, s, t), (ctid,))


@contextmanager
def build_postgres(root: Path, server: str, schema: str) -> Iterator[tuple[Subject, Rows]]:
    """The object log on ``file://`` with the PostgreSQL sequencer in ``schema`` (which
    the caller drops), and its rows; the pristine copy schema is dropped on exit. Six
    more commits per stream than the other object logs: 17 in all, so every stream has
    a ``time_index`` row."""
    subject = build_objects(root, "postgres", f"{server}?schema={schema}", more_rounds=6)
    rows = Rows(server, schema)
    try:
        yield subject, rows
    finally:
        rows.close()


# ------------------------------------------------------------------ fuzzing


class Damage(NamedTuple):
    """One damage of a run: a value of ``column`` (or, with none, a whole row) of a row
    of ``table`` that ``rng`` picks, damaged ``how``."""

    table: str
    column: Column | None
    how: str
    rng: random.Random
    description: str


def damages(rows: Rows, *, per_column: int, per_table: int, seed: int) -> Iterator[Damage]:
    """Every damage of a run, in order: per trusted column ``per_column`` values damaged
    (the kinds in turn, carried on from column to column; ``null`` only where the column
    allows it), then per table ``per_table`` rows deleted and as many duplicated."""
    turn = 0
    for table in sorted(rows.columns):
        columns = [c for c in rows.columns[table] if (table, c.name) not in UNREAD]
        for column in columns:
            kinds = VALUE_DAMAGES if column.nullable else VALUE_DAMAGES[:-1]  # no "null"
            for i in range(per_column):
                how = kinds[turn % len(kinds)]
                turn += 1
                rng = random.Random(zlib.crc32(f"{seed}:{table}:{column.name}:{i}".encode()))
                yield Damage(table, column, how, rng, f"{table}.{column.name} {how} #{i}")
        for i in range(per_table):
            for how in ROW_DAMAGES:
                rng = random.Random(zlib.crc32(f"{seed}:{table}:{how}:{i}".encode()))
                yield Damage(table, None, how, rng, f"{table} row {how} #{i}")


def _apply(rows: Rows, damage: Damage) -> str | None:
    """Apply one damage to the pristine rows; the place of the row it hit, or None if
    nothing was damaged (an empty table, a value the damage leaves as it was, a change
    the schema refuses)."""
    table, column, how, rng, _ = damage
    places = rows.ctids(table)
    if not places:
        return None
    place = rng.choice(places)
    if column is None:
        done = rows.delete(table, place) if how == "delete" else rows.duplicate(table, place)
        return place if done else None
    old = rows.value(table, column.name, place)
    new = damage_value(old, column, how, rng)
    if new == old and type(new) is type(old):
        return None
    return place if rows.update(table, column, place, new) else None


def fuzz_rows(
    subject: Subject,
    pristine: Path,
    rows: Rows,
    ledger: Ledger,
    *,
    per_column: int,
    per_table: int,
    seed: int = 0,
) -> int:
    """Every damage of :func:`damages`, each observed on a fresh handle and classified
    under :data:`KIND`, then the rows and the files put back. Returns the copies made."""
    unknown = set(rows.columns) - set(TABLES)
    assert not unknown, f"uncatalogued tables {sorted(unknown)}: add them to TABLES"
    absent = set(TABLES) - set(rows.columns)
    assert not absent, f"TABLES names tables the schema lacks: {sorted(absent)}"
    files = Pristine(subject, pristine)
    files.restore()
    rows.restore()
    made = 0
    for damage in damages(rows, per_column=per_column, per_table=per_table, seed=seed):
        place = _apply(rows, damage)
        if place is None:
            ledger.figures[f"undamaged.{KIND}"] += 1
            continue
        per_copy = Ledger(ledger.campaign)
        run_observations(subject, per_copy, KIND)
        outcome = worst(per_copy)
        detail = f"{damage.description} at {place}: " + "; ".join(per_copy.violations()[:3])
        ledger.add(KIND, outcome, detail)
        ledger.figures[f"copies.{KIND}"] += 1
        ledger.figures[f"copies.{KIND}.{damage.table}"] += 1
        ledger.figures[f"copies.{KIND}.{damage.how}"] += 1
        ledger.figures[f"{outcome}.{KIND}.{damage.table}"] += 1
        ledger.figures[f"observations.{outcome}"] += per_copy.total()
        made += 1
        rows.restore()
        files.restore()
    ledger.figures["copies"] += made
    return made


__all__ = [
    "KIND",
    "ROW_DAMAGES",
    "TABLES",
    "UNREAD",
    "VALUE_DAMAGES",
    "Damage",
    "Rows",
    "build_postgres",
    "damage_value",
    "damages",
    "fuzz_rows",
]
