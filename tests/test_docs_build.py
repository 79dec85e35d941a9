"""The API reference builds: ``mkdocs build --strict`` turns every warning (a
``::: disklesslog...`` directive naming something that no longer exists, a broken link
between pages, a docstring the renderer cannot parse) into a failure, here as in
``./dev docs``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_in_strict_mode(tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    reference = (site / "reference" / "open" / "index.html").read_text(encoding="utf-8")
    assert "retry_deadline_ms" in reference  # rendered from disklesslog.open's docstring
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "disklesslog.open" in home  # README.md became the home page
    assert 'href="docs/' not in home  # its links to docs/*.md point at the site's pages
