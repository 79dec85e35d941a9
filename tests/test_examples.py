"""The examples run as a newcomer would run them, so they never rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
SPARK_MARKS = (pytest.mark.spark, pytest.mark.slow)  # a JVM of its own: ~40 s


MANY_PROCESSES = {"many_processes.py", "multi_writer.py", "serverless_sequencer.py"}
"""Examples that start several interpreters (about two seconds each): run under slow."""


def _param(example: Path) -> object:
    if example.name.startswith("spark_"):
        marks: tuple[pytest.MarkDecorator, ...] = SPARK_MARKS
    elif example.name in MANY_PROCESSES:
        marks = (pytest.mark.slow,)
    else:
        marks = ()
    return pytest.param(example, id=example.name, marks=marks)


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"quickstart.py", "many_processes.py", "multi_writer.py"}


@pytest.mark.parametrize("example", [_param(p) for p in EXAMPLES])
def test_example_runs(example: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=300 if example.name.startswith("spark_") else 120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip(), "an example should say what it did"
    assert "Traceback" not in result.stderr
