"""A local Azure Blob Storage API for tests: Azurite, reached through adlfs.

Azurite is Microsoft's emulator, a Node.js program installed by npm from the project's
``package.json`` (``npm ci``; ``./dev test`` runs it when ``node_modules`` is missing),
so it is found relative to the source checkout, not on ``PATH``. It enforces
``If-None-Match: *``, so ``pipe_file(..., mode="create")`` is a real put-if-absent, as on
Azure. It runs with ``--skipApiVersionCheck`` (the Azure SDK moves faster than the
emulator) and ``--loose`` (it ignores headers it does not implement instead of failing
the request), without telemetry (tests make no outside connections) and without an
access log.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._process import HOST, free_port, run_server

__all__ = [
    "AZURITE_ACCOUNT",
    "AZURITE_KEY",
    "azure_storage_options",
    "azurite_binary",
    "azurite_server",
]

AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""The well-known development account and key every Azurite accepts (not a secret)."""

_RELATIVE_BINARY = Path("node_modules/.bin/azurite-blob")


def azurite_binary() -> Path:
    """``node_modules/.bin/azurite-blob`` of the project: the nearest directory above this
    package (or above the working directory) whose ``package.json`` declares Azurite.

    Raises :class:`FileNotFoundError` saying to run ``npm ci`` (or ``./dev test``) when
    it is not installed, and when Node.js itself is missing.
    """
    here = Path(__file__).resolve()
    cwd = Path.cwd().resolve()
    candidates = [*here.parents, cwd, *cwd.parents]
    project = next((d for d in candidates if _declares_azurite(d / "package.json")), None)
    if project is None:
        raise FileNotFoundError(
            "cannot find a package.json that installs Azurite (looked above "
            f"{here.parent}, and in and above {cwd}): run the tests from disklesslog's "
            "source tree, or from a project whose package.json has azurite in its "
            "devDependencies, after `npm ci`"
        )
    binary = project / _RELATIVE_BINARY
    if not binary.exists():
        raise FileNotFoundError(
            f"Azurite is not installed: {binary} is missing; run `npm ci` in {project} "
            "(or `./dev test`, which does it)"
        )
    if shutil.which("node") is None:
        raise FileNotFoundError("Azurite needs Node.js: no `node` on PATH (apt-get install nodejs)")
    return binary


def _declares_azurite(package_json: Path) -> bool:
    try:
        return '"azurite"' in package_json.read_text(encoding="utf-8")
    except OSError:
        return False


@contextlib.contextmanager
def azurite_server(
    start_timeout: float = 60.0, *, binary: str | Path | None = None
) -> Iterator[str]:
    """Run Azurite's blob service on a free port of 127.0.0.1 with its data in a fresh
    temporary directory; yield the account's blob endpoint
    (``http://127.0.0.1:N/devstoreaccount1``) for :func:`azure_storage_options`; stop it
    and remove the directory however the block is left."""
    executable = Path(binary) if binary is not None else azurite_binary()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="disklesslog-azurite-") as location:
        command = [
            str(executable),
            "--blobHost", HOST,
            "--blobPort", str(port),
            "--location", location,
            "--skipApiVersionCheck",
            "--loose",
            "--disableTelemetry",
            "--silent",
        ]  # fmt: skip
        with run_server(
            command, name="Azurite", port=port, start_timeout=start_timeout, cwd=location
        ):
            yield f"http://{HOST}:{port}/{AZURITE_ACCOUNT}"


def azure_storage_options(endpoint: str) -> dict[str, Any]:
    """adlfs options for the development account at the blob ``endpoint`` that
    :func:`azurite_server` yields (Azurite's documented connection string)."""
    connection_string = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )
    return {"account_name": AZURITE_ACCOUNT, "connection_string": connection_string}
