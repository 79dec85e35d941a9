"""Griffe extension: Sphinx roles in docstrings read as code in the reference.

The docstrings are written for ``help()`` and editors too, in the reST habit of
``:class:`~disklesslog.Stream``` and ````literal````. Markdown renders the double
backticks as code already, but would print a role's ``:class:`` prefix as text. This
extension (loaded by mkdocs.yml's mkdocstrings options) rewrites each role to a code
span of what Sphinx would show: the last component for ``~target``, else the target.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")


def _shown(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx cross-reference roles in every docstring to Markdown code spans."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_shown, obj.docstring.value)
