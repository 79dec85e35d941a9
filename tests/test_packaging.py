"""What the distribution carries besides code: the license text and the project's
links, as the installed metadata shows them (``./dev test`` reinstalls the project
whenever pyproject.toml changes, so this is what a wheel built now holds)."""

from __future__ import annotations

import hashlib
from importlib.metadata import distribution
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

APACHE_2_0_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"
"""The MD5 of the Apache License 2.0 text as the ASF publishes it
(https://www.apache.org/licenses/LICENSE-2.0.txt, also Debian's
/usr/share/common-licenses/Apache-2.0): the LICENSE file is that text, unmodified."""


def test_license_is_the_unmodified_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.md5(text, usedforsecurity=False).hexdigest() == APACHE_2_0_MD5


def test_the_distribution_ships_the_license_and_the_project_urls() -> None:
    dist = distribution("disklesslog")
    assert dist.metadata["License-Expression"] == "Apache-2.0"
    assert dist.metadata.get_all("License-File") == ["LICENSE"]
    shipped = [path for path in dist.files or () if path.name == "LICENSE"]
    assert len(shipped) == 1
    assert Path(str(shipped[0].locate())).read_bytes() == (ROOT / "LICENSE").read_bytes()
    urls = dict(entry.split(", ", 1) for entry in dist.metadata.get_all("Project-URL") or ())
    assert set(urls) == {"Homepage", "Documentation", "Source", "Issues", "Changelog"}
