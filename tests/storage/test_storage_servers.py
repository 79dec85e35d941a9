"""Typed storage errors against real servers and clients (moto S3 through s3fs, Azurite
through adlfs, fake-gcs-server through gcsfs), and through the fault-injecting
filesystem: a missing bucket or container is StorageNotFound at once, refused
credentials StoragePermissionError, an unreachable endpoint StorageUnavailable within
the retry deadline, throttling StorageThrottled after longer backoffs. No public call
lets a client's own exception escape.

Credentials: moto accepts any key (only a missing one fails, in botocore) and
fake-gcs-server checks none, so a wrong key is tested on Azurite only."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

import disklesslog
from disklesslog import (
    DisklessLogError,
    StorageNotFound,
    StoragePermissionError,
    StorageThrottled,
    StorageUnavailable,
)
from disklesslog.objects.log import ObjectLog
from disklesslog.testing import create_bucket, s3_storage_options
from disklesslog.testing.faults import FaultyFileSystem
from disklesslog.testing.servers.azurite import AZURITE_KEY, azure_storage_options
from disklesslog.testing.servers.gcs import gcs_storage_options

QUICK = 10.0
"""Seconds within which a failure that no retry cures must be reported (the old policy
spent five attempts and their backoffs, and the clients' own retries, on it: far
longer). Not 5: a clean-clone run on a loaded machine once took longer than that to
open a GCS client against the emulator and be refused."""


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _missing() -> str:
    return f"missing-{uuid.uuid4().hex[:16]}"


def _opens_with(error: type[DisklessLogError], url: str, **options: Any) -> DisklessLogError:
    """Open ``url``: it must fail with ``error`` within :data:`QUICK` seconds."""
    started = time.monotonic()
    with pytest.raises(error) as caught:
        disklesslog.open(url, **options)
    assert time.monotonic() - started < QUICK
    assert caught.value.__cause__ is not None  # the client's exception, kept
    return caught.value


# ----------------------------------------------------- missing bucket/container


@pytest.mark.s3
@pytest.mark.parametrize("create", [True, False])
def test_s3_missing_bucket_is_storage_not_found(s3_server: str, create: bool) -> None:
    bucket = _missing()
    error = _opens_with(
        StorageNotFound,
        f"s3://{bucket}/log",
        storage_options=s3_storage_options(s3_server),
        create=create,
    )
    assert error.url == f"s3://{bucket}/log" and not error.retriable
    assert bucket in str(error) and "does not exist" in str(error)


@pytest.mark.azure
def test_azure_missing_container_is_storage_not_found(azure_server: str) -> None:
    container = _missing()
    error = _opens_with(
        StorageNotFound,
        f"az://{container}/log",
        storage_options=azure_storage_options(azure_server),
    )
    assert container in str(error)


@pytest.mark.gcs
def test_gcs_missing_bucket_is_storage_not_found(gcs_server: str) -> None:
    # gcsfs reports a missing bucket as a missing object; the first write tells them apart
    bucket = _missing()
    error = _opens_with(
        StorageNotFound, f"gs://{bucket}/log", storage_options=gcs_storage_options(gcs_server)
    )
    assert bucket in str(error) and error.operation in ("put", "create")


# ------------------------------------------------------------------ credentials


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """botocore finds no credentials anywhere (nor asks the instance metadata service)."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.mark.s3
@pytest.mark.usefixtures("no_aws_credentials")
def test_s3_missing_credentials_are_a_permission_error(s3_server: str) -> None:
    bucket = create_bucket("s3", s3_storage_options(s3_server))
    options = {"client_kwargs": {"endpoint_url": s3_server}, "skip_instance_cache": True}
    error = _opens_with(StoragePermissionError, f"s3://{bucket}/log", storage_options=options)
    assert "credentials" in str(error) and not error.retriable


@pytest.mark.azure
def test_azure_wrong_key_is_a_permission_error(azure_server: str) -> None:
    good = azure_storage_options(azure_server)
    container = create_bucket("az", good)
    wrong = dict(good)  # a key of the right shape, not the account's
    wrong["connection_string"] = good["connection_string"].replace(
        AZURITE_KEY, "AAAA" + AZURITE_KEY[4:]
    )
    error = _opens_with(StoragePermissionError, f"az://{container}/log", storage_options=wrong)
    assert "403" in str(error) or "authenticate" in str(error)


@pytest.mark.gcs
def test_credentials_refused_when_the_filesystem_is_made_are_a_permission_error(
    gcs_server: str,
) -> None:
    malformed = {"type": "service_account", "client_email": "nobody@example.com"}
    options = {**gcs_storage_options(gcs_server), "token": malformed}
    error = _opens_with(StoragePermissionError, "gs://bucket/log", storage_options=options)
    assert error.operation == "open" and error.url == "gs://bucket/log"


# --------------------------------------------------------- unreachable endpoint


def _unreachable_s3() -> dict[str, Any]:
    """s3fs options for an endpoint nobody listens on, with botocore's own retries off:
    the client would otherwise spend about 10 s retrying inside one call, which no
    deadline of this library can shorten (see disklesslog.retries)."""
    return {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{_unused_port()}"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }


@pytest.mark.s3
def test_an_unreachable_endpoint_is_unavailable_within_the_deadline() -> None:
    deadline = 1.5
    with pytest.raises(StorageUnavailable):  # untimed: the first one imports s3fs and
        disklesslog.open(  # aiobotocore and sets a client up, seconds on a loaded machine
            "s3://bucket/log",
            storage_options=_unreachable_s3(),
            retry_deadline_ms=round(deadline * 1000),
        )
    started = time.monotonic()
    with pytest.raises(StorageUnavailable) as caught:
        disklesslog.open(
            "s3://bucket/log",
            storage_options=_unreachable_s3(),
            retry_deadline_ms=round(deadline * 1000),
        )
    took = time.monotonic() - started
    # No retry starts after the deadline; the last attempt may take one call's time.
    assert took < deadline + 3.0
    assert caught.value.retriable and "unreachable" in str(caught.value)


# ------------------------------------------------------------------ throttling


def _faulty(**faults: Any) -> tuple[str, dict[str, Any]]:
    options = {"target_protocol": "memory", "seed": 3, **faults}
    return f"faulty://throttle-{uuid.uuid4().hex[:12]}/log", options


def _fast(log: disklesslog.Log) -> ObjectLog:
    assert isinstance(log, ObjectLog)
    log.storage.retry_delay = 0.001
    return log


def test_throttled_requests_are_retried_then_succeed() -> None:
    url, options = _faulty(throttle=0.1)
    with _fast(disklesslog.open(url, storage_options=options, sequencer="objectstore://")) as log:
        offsets = [log.stream("s").append(f"r{i}".encode()) for i in range(20)]
        assert offsets == list(range(20))
        assert [r.value for r in log.stream("s").read()] == [f"r{i}".encode() for i in range(20)]
        injected = fsspec.filesystem("faulty", **options).stats()
        assert injected["injected"] > 0
        assert injected["injected"] == sum(
            n for k, n in injected.items() if k.startswith("throttle.")
        )


def test_throttling_that_does_not_stop_is_storage_throttled() -> None:
    url, options = _faulty()
    log = _fast(disklesslog.open(url, storage_options=options, sequencer="objectstore://"))
    with log:
        log.stream("s").append(b"first")
        fs = fsspec.filesystem("faulty", **options)
        fs.rates["throttle"] = 1.0
        try:
            with pytest.raises(StorageThrottled) as caught:
                log.stream("s").append(b"second")
            assert caught.value.retriable and "after 5 attempts" in str(caught.value)
            assert type(caught.value.__cause__).__name__ == "InjectedThrottling"
        finally:
            fs.rates["throttle"] = 0.0
        assert [r.value for r in log.stream("s").read()] == [b"first"]


# ------------------------------------------------- nothing raw escapes a call


class Broken(FaultyFileSystem):
    """Every request (after :attr:`armed` is set) raises what ``failure()`` makes."""

    protocol = ("broken",)
    failure: Callable[[], BaseException] = staticmethod(lambda: ConnectionError("down"))
    armed = False

    def _call(self, operation: str, path: Any, call: Any) -> Any:
        if type(self).armed:
            raise type(self).failure()
        return call()


fsspec.register_implementation("broken", Broken, clobber=True)


def _boto(code: str, status: int) -> BaseException:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


FAILURES: dict[str, Callable[[], BaseException]] = {
    "no-such-bucket": lambda: _boto("NoSuchBucket", 404),
    "access-denied": lambda: _boto("AccessDenied", 403),
    "slow-down": lambda: _boto("SlowDown", 503),
    "server-error": lambda: _boto("InternalError", 500),
    "refused": lambda: ConnectionRefusedError(111, "Connection refused"),
    "timeout": lambda: TimeoutError("timed out"),
    "unknown": lambda: RuntimeError("a client's own error"),
    "rejected": lambda: TypeError("unexpected keyword argument"),
}


@pytest.fixture
def broken() -> Iterator[type[Broken]]:
    yield Broken
    Broken.armed = False


def _public_calls(log: ObjectLog) -> list[Callable[[], object]]:
    stream = log.stream("s")
    return [
        lambda: stream.append(b"more"),
        lambda: list(stream.read()),
        stream.info,
        log.streams,
        lambda: log.create_stream("t"),
        lambda: log.collect_garbage(grace_seconds=0),
    ]


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_no_client_exception_escapes_a_public_call(broken: type[Broken], failure: str) -> None:
    url = f"broken://escape-{uuid.uuid4().hex[:12]}/log"
    options = {"storage_options": {"target_protocol": "memory"}, "sequencer": "objectstore://"}
    log = _fast(disklesslog.open(url, retry_deadline_ms=200, **options))
    log.stream("s").append(b"first")
    broken.failure = staticmethod(FAILURES[failure])
    broken.armed = True
    raised: list[BaseException] = []
    try:
        for call in [
            *_public_calls(log),
            lambda: disklesslog.open(url, retry_deadline_ms=200, **options),
        ]:
            try:
                call()
            except Exception as exc:  # anything else than a DisklessLogError fails below
                raised.append(exc)
    finally:
        broken.armed = False
        log.close()
    assert raised  # at least the append and the open needed the storage
    assert [e for e in raised if not isinstance(e, DisklessLogError)] == []


def test_the_deadline_option_reaches_the_storage_and_the_sequencer(broken: type[Broken]) -> None:
    url = f"broken://deadline-{uuid.uuid4().hex[:12]}/log"
    options = {"storage_options": {"target_protocol": "memory"}, "sequencer": "objectstore://"}
    with _fast(disklesslog.open(url, retry_deadline_ms=1, **options)) as log:
        assert log.storage.retry_deadline == 0.001
        log.stream("s").append(b"first")
        broken.failure = staticmethod(lambda: ConnectionResetError("reset"))
        broken.armed = True
        # a 1 ms deadline leaves no time for the 5 attempts a request gets by default
        with pytest.raises(StorageUnavailable) as from_sequencer:
            log.sequencer.create_stream("t", {})
        with pytest.raises(StorageUnavailable) as from_storage:
            log.storage.put(log.storage.new_key(), b"data")
        broken.armed = False
    assert "after 5 attempts" not in str(from_sequencer.value)
    assert "after 5 attempts" not in str(from_storage.value)


def test_the_deadline_option_reaches_a_local_logs_tier(
    broken: type[Broken], tmp_path: Path
) -> None:
    tier_url = f"broken://tier-deadline-{uuid.uuid4().hex[:12]}/tier"
    with disklesslog.open(
        tmp_path / "log",
        fsync="never",
        tier_url=tier_url,
        tier_storage_options={"target_protocol": "memory"},
        retry_deadline_ms=1,
        segment_bytes=1024,
    ) as log:
        stream = log.stream("s")
        for _ in range(40):  # several closed segments
            stream.append(b"x" * 100)
        broken.failure = staticmethod(lambda: ConnectionResetError("reset"))
        broken.armed = True
        started = time.monotonic()
        # a 1 ms deadline leaves no time for the 5 attempts a request gets by default
        with pytest.raises(StorageUnavailable) as caught:
            log.tier()
        broken.armed = False
    assert time.monotonic() - started < 5
    assert "after 5 attempts" not in str(caught.value)
    assert tier_url in str(caught.value)
