"""Start a server process on a free local port, wait until it answers, always stop it.

The emulator modules (:mod:`.s3`, :mod:`.gcs`, :mod:`.azurite`) differ only in the
command they run; the lifecycle lives here once: a port chosen by the kernel, the
server's output kept in a temporary file so a failed start can quote it, and a
terminate-then-kill stop that runs however the ``with`` block is left (a failed test,
Ctrl-C), so no emulator outlives the test session.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

__all__ = ["free_port", "run_server"]

HOST = "127.0.0.1"
_OUTPUT_TAIL = 4000  # characters of server output quoted when it fails to start


def free_port(host: str = HOST) -> int:
    """A TCP port of ``host`` that nothing listens on right now (the kernel's pick).

    The port is free when this returns, not reserved: the server started next binds it,
    and the tiny window in between is the price of letting servers choose no port."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def run_server(
    command: Sequence[str],
    *,
    name: str,
    port: int,
    start_timeout: float,
    cwd: str | Path | None = None,
    stop_timeout: float = 10.0,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` (a server that listens on ``127.0.0.1:port``) until the block ends.

    Yields once the port accepts connections. A server that exits or stays silent for
    ``start_timeout`` seconds raises :class:`RuntimeError` quoting the end of its output.
    On exit the process gets SIGTERM, then SIGKILL after ``stop_timeout`` seconds.
    """
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(list(command), stdout=output, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            _wait_until_listening(process, port, start_timeout, name, output)
            yield process
        finally:
            _stop(process, stop_timeout)


def _wait_until_listening(
    process: subprocess.Popen[bytes],
    port: int,
    timeout: float,
    name: str,
    output: IO[bytes],
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((HOST, port), 0.2).close()
            return
        except OSError:
            pass
        if process.poll() is not None:
            reason = f"exited with status {process.returncode}"
        elif time.monotonic() > deadline:
            reason = f"did not listen on {HOST}:{port} within {timeout:g} s"
        else:
            time.sleep(0.05)
            continue
        raise RuntimeError(f"{name} {reason}; its output ends with:\n{_tail(output)}")


def _tail(output: IO[bytes]) -> str:
    """The last few thousand characters a server printed (best effort)."""
    try:
        output.flush()
        output.seek(0)
        text = output.read().decode(errors="replace")
    except (OSError, ValueError):
        return "<output unavailable>"
    return text[-_OUTPUT_TAIL:] or "<no output>"


def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait()
