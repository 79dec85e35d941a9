"""Fault campaigns (:mod:`tests.faults.campaign`) against every sequencer.

Each target is a log on ``faulty://`` storage: the object backend with the memory,
SQLite, object-store (on memory and on local files) and PostgreSQL sequencers, and a
local segments log tiering to ``faulty://``. The sequencers that keep their state
outside the object store (memory, SQLite, PostgreSQL) see faults on the data path
only; the object-store sequencer sees them on its entries and checkpoints too.

The fast variant runs one seed per target with every kind of fault at once; the slow
one two more seeds, each kind of fault alone and all together, for more rounds.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import disklesslog
from disklesslog import AbstractLog
from disklesslog.sequencers.memory import MemorySequencer

from .campaign import faulty_fs, open_faulty, run_campaign
from .rule import Ledger

MIXED = {"fail": 0.04, "lost": 0.03, "timeout": 0.01, "corrupt": 0.03}
"""Every kind of fault at once, per call: about one call in nine goes wrong."""
ALONE = [
    {"fail": 0.12},
    {"lost": 0.1},
    {"timeout": 0.08},
    {"corrupt": 0.1},
]


def _options(target: str, seed: int, rates: dict[str, float]) -> dict[str, Any]:
    return {"target_protocol": target, "seed": seed, "timeout_seconds": 0.001, **rates}


def _memory_url() -> str:
    return f"faulty://faults-{uuid.uuid4().hex[:12]}/log"


OpenLog = Callable[[], AbstractLog]
Made = tuple[OpenLog, dict[str, Any]]
"""How to open the target's log, and the storage options of its faulty filesystem."""


def memory_sequencer(path: Path, options: dict[str, Any], request: Any) -> Made:
    sequencer = MemorySequencer()  # kept across reopens, as the process-wide one is
    return open_faulty(_memory_url(), options, sequencer=sequencer), options


def sqlite_sequencer(path: Path, options: dict[str, Any], request: Any) -> Made:
    return open_faulty(_memory_url(), options, sequencer=f"sqlite://{path}/meta.db"), options


def objectstore_memory(path: Path, options: dict[str, Any], request: Any) -> Made:
    return open_faulty(_memory_url(), options), options


def objectstore_file(path: Path, options: dict[str, Any], request: Any) -> Made:
    options = {**options, "target_protocol": "file", "target_options": {"auto_mkdir": True}}
    return open_faulty(f"faulty://{path}/log", options), options


def postgres_sequencer(path: Path, options: dict[str, Any], request: Any) -> Made:
    from disklesslog.testing.servers.postgres import drop_schema

    server = request.getfixturevalue("postgres_server")
    schema = f"faults_{uuid.uuid4().hex[:12]}"
    request.addfinalizer(lambda: drop_schema(server, schema))
    return open_faulty(_memory_url(), options, sequencer=f"{server}?schema={schema}"), options


def segments_tier(path: Path, options: dict[str, Any], request: Any) -> Made:
    tier_url = f"faulty://tier-{uuid.uuid4().hex[:12]}/t"

    def open_log() -> AbstractLog:
        return disklesslog.open(
            path / "local",
            fsync="never",
            tier_url=tier_url,
            tier_storage_options=options,
            local_retention_bytes=1,
        )

    return open_log, options


TARGETS = [
    pytest.param(memory_sequencer, id="memory"),
    pytest.param(sqlite_sequencer, id="sqlite"),
    pytest.param(objectstore_memory, id="objectstore-memory"),
    pytest.param(objectstore_file, id="objectstore-file"),
    pytest.param(postgres_sequencer, id="postgres", marks=pytest.mark.postgres),
    pytest.param(segments_tier, id="segments-tier"),
]


def _run(
    target: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    ledger: Ledger,
    *,
    seed: int,
    rates: dict[str, float],
    rounds: int,
    per_round: int,
) -> None:
    path = tmp_path / f"run-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    open_log, options = target(path, _options("memory", seed, rates), request)
    run_campaign(
        ledger,
        open_log,
        faulty_fs(options),
        rounds=rounds,
        per_round=per_round,
        objects=target is not segments_tier,
        tier=target is segments_tier,
    )


@pytest.mark.parametrize("target", TARGETS)
def test_fault_campaign(target: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    ledger = Ledger(f"campaign:{request.node.callspec.id}")
    _run(target, tmp_path, request, ledger, seed=1, rates=MIXED, rounds=4, per_round=40)
    assert ledger.figures["injected"] > 0, "the campaign injected no fault"
    ledger.check()


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_fault_campaign_long(target: Any, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    ledger = Ledger(f"campaign-long:{request.node.callspec.id}")
    for seed in range(2, 4):
        for rates in [MIXED, *ALONE]:
            _run(target, tmp_path, request, ledger, seed=seed, rates=rates, rounds=6, per_round=60)
    ledger.check()
