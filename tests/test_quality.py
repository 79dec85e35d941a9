"""The code stays ruff-clean, type-checked and layered: CI runs these with the tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail(f"{name} is not installed; install the dev extras (./dev test does)")
    return found


def _run(*command: str) -> None:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_check() -> None:
    _run(_tool("ruff"), "check", ".")


def test_ruff_format() -> None:
    _run(_tool("ruff"), "format", "--check", ".")


def test_mypy_strict_on_the_package() -> None:
    _run(_tool("mypy"))


def test_imports_only_point_down_the_layers() -> None:
    """The import-linter contracts in pyproject.toml: front ends (cli, spark, testing) over
    the backends (segments, objects: never each other) over the sequencers (no backend, no
    log API) over the storage layer over the core, which imports none of them. A
    back-arrow, lazy imports included, fails with the chain of imports that makes it."""
    _run(_tool("lint-imports"), "--no-cache")
