"""MkDocs hook: the site's home page is README.md, read at build time.

The README lives at the repository root (where GitHub and PyPI show it), outside the
docs directory, so it cannot be a page as it is. Rather than keep a copy in sync by
hand, this hook hands MkDocs the README as ``index.md``, with its links rewritten for
the site: ``docs/x.md`` becomes ``x.md`` (a page of the site) and a link to any other
file of the repository (``examples/...``) points at that file on GitHub.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\((?!https?://|#|mailto:)([^)\s]+)\)")


def _site_link(match: re.Match[str], repository: str) -> str:
    target = match.group(1)
    if target.startswith("docs/"):
        return f"]({target.removeprefix('docs/')})"
    return f"]({repository}/blob/main/{target})"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the README as the home page (``index.md``)."""
    repository = str(config.repo_url).rstrip("/")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = LINK.sub(lambda match: _site_link(match, repository), text)
    files.append(File.generated(config, "index.md", content=text))
    return files


def on_pre_page(page: Page, config: MkDocsConfig, files: Files) -> Page:
    """Point the home page's "Edit on GitHub" link at README.md, its source."""
    if page.file.src_uri == "index.md":
        page.edit_url = f"{str(config.repo_url).rstrip('/')}/blob/main/README.md"
    return page
