"""A throwaway PostgreSQL server for tests and benchmarks.

:func:`postgres_server` runs Debian's PostgreSQL binaries (``/usr/lib/postgresql/N/bin``,
the newest ``N`` installed) on a fresh data directory in a temporary directory, listening
on a free port of 127.0.0.1 with trust authentication for the superuser ``app``, and
yields ``postgresql://app@127.0.0.1:PORT/postgres``. It is stopped and its directory
removed however the block is left.

This is a *test* server: it runs with ``fsync=off`` (a crash of the machine may corrupt
it; nothing in it is meant to survive), which makes schema creation and commits several
times faster on slow disks. Every other setting is PostgreSQL's default, so locking,
isolation and WAL behave as in production.

``initdb`` and ``pg_ctl`` refuse to run as root. When this process is root they run as
the ``postgres`` user (``runuser -u postgres --``, the account Debian's package
creates), with the temporary directory handed to that user; otherwise they run as the
current user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._process import free_port

__all__ = ["drop_schema", "find_postgres_bin", "postgres_server"]

_INSTALL_HINT = "install Debian's postgresql package; ./dev test does this"
_SERVER_USER = "postgres"


def find_postgres_bin() -> Path:
    """The ``bin`` directory of the newest PostgreSQL under ``/usr/lib/postgresql``."""
    found: list[tuple[tuple[int, ...], Path]] = []
    for initdb in glob.glob("/usr/lib/postgresql/*/bin/initdb"):
        directory = Path(initdb).parent
        version = directory.parent.name
        if re.fullmatch(r"\d+(\.\d+)*", version) and (directory / "pg_ctl").exists():
            found.append((tuple(int(part) for part in version.split(".")), directory))
    if not found:
        raise RuntimeError(
            f"no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: {_INSTALL_HINT}"
        )
    return max(found)[1]


def _as_server_user(command: list[str]) -> list[str]:
    """Run as ``postgres`` when root (initdb/pg_ctl refuse root), else unchanged."""
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser") is None:
        raise RuntimeError("running as root needs runuser (util-linux) to start PostgreSQL")
    return ["runuser", "-u", _SERVER_USER, "--", *command]


def _run(command: list[str], cwd: Path, what: str, log: Path | None = None) -> None:
    result = subprocess.run(
        _as_server_user(command),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        detail = (result.stdout + result.stderr).strip()
        if log is not None and log.exists():
            detail += "\n--- server log ---\n" + log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"PostgreSQL {what} failed (exit {result.returncode}):\n{detail}")


@contextlib.contextmanager
def postgres_server(start_timeout: float = 60) -> Iterator[str]:
    """Start a PostgreSQL server in a temporary directory; yield its URL
    (``postgresql://app@127.0.0.1:PORT/postgres``); stop it (``pg_ctl stop -m fast``)
    and remove the directory however the block is left."""
    bin_dir = find_postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="disklesslog-postgres-"))
    data, sockets, log = root / "data", root / "sockets", root / "server.log"
    started = False
    try:
        sockets.mkdir()
        if os.geteuid() == 0:
            # The server user must own its data directory (initdb creates it 0700) and
            # be able to reach it: hand over the whole temporary directory.
            for path in (root, sockets):
                shutil.chown(path, _SERVER_USER, _SERVER_USER)
        _run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-A",
                "trust",
                "-U",
                "app",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",  # a test server: skip initdb's fsyncs
                "--no-instructions",
            ],
            root,
            "initdb",
        )
        port = free_port()
        options = f"-k {sockets} -h 127.0.0.1 -p {port} -c fsync=off"
        started = True  # from here on a stop is attempted, even if start half-worked
        _run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                str(max(1, int(start_timeout))),
                "start",
            ],
            root,
            "start",
            log,
        )
        yield f"postgresql://app@127.0.0.1:{port}/postgres"
    finally:
        try:
            if started and (data / "postmaster.pid").exists():
                _stop(bin_dir, data, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _stop(bin_dir: Path, data: Path, root: Path) -> None:
    """``pg_ctl stop -m fast`` (disconnects clients, clean shutdown); if that fails,
    ``-m immediate`` so no server outlives the block."""
    try:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], root, "stop")
    except RuntimeError:
        _run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            root,
            "stop",
        )


def drop_schema(url: str, schema: str) -> None:
    """Drop ``schema`` and everything in it from the server at ``url`` (tests give each
    sequencer a schema of its own and drop it afterwards, keeping one server small)."""
    import psycopg  # noqa: PLC0415 - only for tests that use PostgreSQL
    from psycopg import sql  # noqa: PLC0415 - as above

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
