"""The README's startup code runs again on the next start: its Maintenance section
creates streams and alters one, as an application's startup does on every run, so it
must not fail the second time against the same log."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"

PROGRAM = """\
import json
import sys

import disklesslog

with disklesslog.open(sys.argv[1], **json.loads(sys.argv[2])) as log:
{code}
"""
"""A README block uses ``log`` as the log the reader opened: this opens it."""


def section_code(heading: str) -> str:
    """The Python code blocks of the README section titled ``heading``, joined."""
    text = README.read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1]
    section = re.split(r"\n#{1,3} ", section, maxsplit=1)[0]
    return "\n".join(re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M))


def test_the_maintenance_section_has_code_that_alters_a_stream() -> None:
    code = section_code("### Maintenance")
    assert "create_stream" in code and "alter_stream" in code, code


@pytest.mark.parametrize(
    ("location", "options"),
    [("log", "{}"), ("objects", '{"backend": "objects"}')],
    ids=["segments", "objects"],
)
def test_maintenance_section_runs_twice(tmp_path: Path, location: str, options: str) -> None:
    program = PROGRAM.format(code=textwrap.indent(section_code("### Maintenance"), "    "))
    url = (tmp_path / location).as_uri()
    for run in ("first", "second"):
        result = subprocess.run(
            [sys.executable, "-c", program, url, options],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, f"{run} run:\n{result.stdout}{result.stderr}"
