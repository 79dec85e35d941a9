"""What a storage client's exception means (disklesslog.storage.failures), and the retry
policy that follows from it (disklesslog.retries.retrying): retriable failures are
retried with full-jitter backoff, longer when throttled, under a deadline; the others
are raised at once, typed. Deterministic: sleeping and the random draw are patched."""

from __future__ import annotations

import email.utils
import errno
import logging
import pickle
import socket
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from azure.core.exceptions import (
    ClientAuthenticationError,
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ProfileNotFound,
)
from gcsfs.retry import HttpError

import disklesslog
from disklesslog import (
    ConfigError,
    DisklessLogError,
    StorageError,
    StorageNotFound,
    StoragePermissionError,
    StorageThrottled,
    StorageUnavailable,
    retries,
)
from disklesslog.metrics import Metrics
from disklesslog.retries import backoff, deadline_seconds, retrying
from disklesslog.storage.failures import classify, retry_after, storage_error
from disklesslog.testing.faults import InjectedClientError, InjectedThrottling


def _boto(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def _azure(cls: type[HttpResponseError], status: int | None, code: str | None) -> Exception:
    exc = cls(message=f"azure says {code}")
    exc.status_code = status
    exc.error_code = code
    return exc


def _wrapped(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised from ``inner``, as clients wrap their exceptions."""
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


# ------------------------------------------------------------ classification

CASES: list[tuple[str, Callable[[], BaseException], str, type[StorageError] | None, bool]] = [
    # (id, exception, operation, expected class or None for "an answer", retriable)
    ("s3-no-such-bucket", lambda: _boto("NoSuchBucket", 404), "put", StorageNotFound, False),
    (
        "s3fs-missing-bucket-read",
        lambda: _wrapped(
            FileNotFoundError("The specified bucket does not exist"), _boto("NoSuchBucket", 404)
        ),
        "get",
        StorageNotFound,
        False,
    ),
    ("s3-access-denied", lambda: _boto("AccessDenied", 403), "get", StoragePermissionError, False),
    ("s3-bad-key", lambda: _boto("InvalidAccessKeyId", 403), "put", StoragePermissionError, False),
    ("s3-no-credentials", NoCredentialsError, "get", StoragePermissionError, False),
    ("s3-no-profile", lambda: ProfileNotFound(profile="x"), "get", StoragePermissionError, False),
    ("s3-slowdown", lambda: _boto("SlowDown", 503), "put", StorageThrottled, True),
    ("s3-429", lambda: _boto("TooManyRequests", 429), "put", StorageThrottled, True),
    ("s3-500", lambda: _boto("InternalError", 500), "get", StorageUnavailable, True),
    ("s3-503", lambda: _boto("ServiceUnavailable", 503), "get", StorageUnavailable, True),
    ("s3-400", lambda: _boto("InvalidArgument", 400), "put", StorageError, False),
    ("s3-conflict", lambda: _boto("OperationAborted", 409), "put", StorageUnavailable, True),
    (
        "azure-exists",
        lambda: _azure(HttpResponseError, 409, "BlobAlreadyExists"),
        "put",
        StorageError,
        False,
    ),
    ("s3-request-timeout", lambda: _boto("RequestTimeout", 400), "put", StorageUnavailable, True),
    (
        "s3-unreachable",
        lambda: _wrapped(
            EndpointConnectionError(endpoint_url="http://127.0.0.1:1"),
            ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        ),
        "get",
        StorageUnavailable,
        True,
    ),
    (
        "s3-connect-timeout",
        lambda: ConnectTimeoutError(endpoint_url="http://x"),
        "get",
        StorageUnavailable,
        True,
    ),
    (
        "aiohttp-refused",
        lambda: aiohttp.ClientOSError(errno.ECONNREFUSED, "refused"),
        "get",
        StorageUnavailable,
        True,
    ),
    ("aiohttp-disconnected", aiohttp.ServerDisconnectedError, "get", StorageUnavailable, True),
    (
        "gcs-403",
        lambda: HttpError({"code": 403, "message": "Forbidden"}),
        "get",
        StoragePermissionError,
        False,
    ),
    (
        "gcs-401",
        lambda: HttpError({"code": 401, "message": "Login Required"}),
        "get",
        StoragePermissionError,
        False,
    ),
    ("gcs-429", lambda: HttpError({"code": 429, "message": "rate"}), "put", StorageThrottled, True),
    (
        "gcs-503",
        lambda: HttpError({"code": 503, "message": "backend"}),
        "put",
        StorageUnavailable,
        True,
    ),
    ("gcs-400", lambda: HttpError({"code": 400, "message": "bad"}), "put", StorageError, False),
    (
        "azure-container",
        lambda: _azure(ResourceNotFoundError, 404, "ContainerNotFound"),
        "put",
        StorageNotFound,
        False,
    ),
    (
        "adlfs-missing-container-read",
        lambda: _wrapped(
            FileNotFoundError(errno.ENOENT, "No such file or directory"),
            _azure(ResourceNotFoundError, 404, "ContainerNotFound"),
        ),
        "get",
        StorageNotFound,
        False,
    ),
    (
        "adlfs-missing-blob-read",
        lambda: _wrapped(
            FileNotFoundError(errno.ENOENT, "No such file or directory"),
            _azure(ResourceNotFoundError, 404, "BlobNotFound"),
        ),
        "get",
        None,
        False,
    ),
    (
        "azure-auth",
        lambda: _azure(HttpResponseError, 403, "AuthorizationFailure"),
        "get",
        StoragePermissionError,
        False,
    ),
    (
        "azure-client-auth",
        lambda: ClientAuthenticationError("no token"),
        "get",
        StoragePermissionError,
        False,
    ),
    (
        "azure-busy",
        lambda: _azure(HttpResponseError, 503, "ServerBusy"),
        "put",
        StorageThrottled,
        True,
    ),
    (
        "azure-request",
        lambda: ServiceRequestError("cannot connect"),
        "put",
        StorageUnavailable,
        True,
    ),
    ("azure-response", lambda: ServiceResponseError("cut"), "get", StorageUnavailable, True),
    (
        "permission",
        lambda: PermissionError(errno.EACCES, "denied"),
        "put",
        StoragePermissionError,
        False,
    ),
    ("connection-reset", lambda: ConnectionResetError("reset"), "get", StorageUnavailable, True),
    ("timeout", lambda: TimeoutError("timed out"), "get", StorageUnavailable, True),
    (
        "dns",
        lambda: socket.gaierror(socket.EAI_NONAME, "unknown host"),
        "get",
        StorageUnavailable,
        True,
    ),
    (
        "disk-full",
        lambda: OSError(errno.ENOSPC, "No space left on device"),
        "put",
        StorageError,
        False,
    ),
    ("io-error", lambda: OSError(errno.EIO, "I/O error"), "get", StorageError, True),
    ("unknown-client-error", lambda: InjectedClientError("boom"), "get", StorageError, True),
    (
        "rejected-option",
        lambda: TypeError("unexpected keyword argument"),
        "get",
        StorageError,
        False,
    ),
    ("injected-throttling", lambda: InjectedThrottling("x"), "put", StorageThrottled, True),
    ("missing-object-read", lambda: FileNotFoundError("bucket/key"), "get", None, False),
    ("missing-object-delete", lambda: FileNotFoundError("bucket/key"), "delete", None, False),
    (
        "gcsfs-missing-bucket-write",
        lambda: FileNotFoundError("b/bucket/o"),
        "put",
        StorageNotFound,
        False,
    ),
    (
        "missing-bucket-create",
        lambda: FileNotFoundError("b/bucket/o"),
        "create",
        StorageNotFound,
        False,
    ),
]


@pytest.mark.parametrize(
    ("make", "operation", "expected", "retriable"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_classify(
    make: Callable[[], BaseException],
    operation: str,
    expected: type[StorageError] | None,
    retriable: bool,
) -> None:
    found = classify(make(), operation)
    if expected is None:
        assert found is None
    else:
        assert found == (expected, retriable)


def test_a_typed_error_names_url_operation_and_cause() -> None:
    cause = _boto("NoSuchBucket", 404)
    error = storage_error(cause, "could not store objects/a", url="s3://b/log", operation="put")
    assert type(error) is StorageNotFound
    assert isinstance(error, StorageError) and isinstance(error, OSError)
    assert isinstance(error, DisklessLogError)
    assert error.url == "s3://b/log" and error.operation == "put" and not error.retriable
    assert "s3://b/log" in str(error) and "put" in str(error) and "NoSuchBucket" in str(error)
    assert "does not exist" in str(error)
    copy = pickle.loads(pickle.dumps(error))  # crosses process boundaries (Spark, workers)
    assert type(copy) is StorageNotFound and copy.url == "s3://b/log" and not copy.retriable


def test_the_types_are_exported() -> None:
    for name in (
        "StorageNotFound",
        "StoragePermissionError",
        "StorageUnavailable",
        "StorageThrottled",
    ):
        assert name in disklesslog.__all__
        assert issubclass(getattr(disklesslog, name), StorageError)
    assert StorageError("plain").retriable and StorageError("plain").url is None
    assert StorageError(errno.EIO, "I/O error", "f").errno == errno.EIO  # still an OSError


# --------------------------------------------------------------- the policy


class Clock:
    """Stands in for time.monotonic and time.sleep in disklesslog.retries: sleeping
    advances the clock, nothing waits; ``random.uniform`` returns its upper bound
    (the longest full-jitter wait), so every wait is known."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    # Replace the names retries.py looks up, not the process-wide functions: another
    # thread of the test process (a server, a cache's worker) that sleeps meanwhile
    # must neither be recorded here nor stop waiting.
    fake = Clock()
    monkeypatch.setattr(
        retries, "time", SimpleNamespace(monotonic=fake.monotonic, sleep=fake.sleep)
    )
    monkeypatch.setattr(retries, "random", SimpleNamespace(uniform=lambda low, high: high))
    yield fake


def _failing(*failures: BaseException, result: Any = "done") -> Callable[[], Any]:
    """A call that raises ``failures`` in turn, then returns ``result``."""
    pending = list(failures)

    def call() -> Any:
        if pending:
            raise pending.pop(0)
        return result

    return call


def test_backoff_is_full_jitter_doubling_to_a_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    bounds: list[tuple[float, float]] = []
    monkeypatch.setattr(
        retries, "random", SimpleNamespace(uniform=lambda a, b: bounds.append((a, b)) or b)
    )
    assert [backoff(n, 0.1) for n in (1, 2, 3)] == pytest.approx([0.1, 0.2, 0.4])
    assert backoff(1, 0.1, throttled=True) == pytest.approx(0.1 * retries.THROTTLED_FACTOR)
    assert backoff(30, 0.1) == retries.MAX_DELAY
    assert all(low == 0 for low, _ in bounds)


def test_retriable_failures_are_retried_then_succeed(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    call = _failing(ConnectionResetError("reset"), ServiceRequestError("refused"))
    with caplog.at_level(logging.DEBUG, logger="disklesslog"):
        assert (
            retrying(call, "could not read x", metrics=metrics, counter="get_errors", delay=0.1)
            == "done"
        )
    assert clock.sleeps == pytest.approx([0.1, 0.2])
    assert metrics.snapshot()["get_errors"] == 2
    levels = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "disklesslog"]
    assert [level for level, _ in levels] == [logging.DEBUG, logging.DEBUG, logging.WARNING]
    assert "succeeded at attempt 3" in levels[-1][1]


@pytest.mark.parametrize(
    ("failure", "kind"),
    [
        (_boto("NoSuchBucket", 404), StorageNotFound),
        (NoCredentialsError(), StoragePermissionError),
        (_boto("AccessDenied", 403), StoragePermissionError),
        (OSError(errno.ENOSPC, "No space left on device"), StorageError),
        (FileNotFoundError("b/bucket/o"), StorageNotFound),  # a write: the bucket is missing
    ],
)
def test_a_failure_that_cannot_succeed_is_raised_at_once(
    clock: Clock, failure: BaseException, kind: type[StorageError]
) -> None:
    metrics = Metrics()
    with pytest.raises(kind) as caught:
        retrying(
            _failing(failure),
            "could not store x",
            metrics=metrics,
            counter="put_errors",
            url="s3://b/log",
        )
    assert type(caught.value) is kind and not caught.value.retriable
    assert caught.value.__cause__ is failure
    assert caught.value.operation == "put" and caught.value.url == "s3://b/log"
    assert clock.sleeps == [] and metrics.snapshot()["put_errors"] == 1


def test_a_missing_object_is_an_answer_not_a_failure(clock: Clock) -> None:
    metrics = Metrics()
    missing = FileNotFoundError("b/log/objects/a")
    with pytest.raises(FileNotFoundError) as caught:
        retrying(
            _failing(missing),
            "could not read x",
            metrics=metrics,
            counter="get_errors",
            final=(FileNotFoundError,),
        )
    assert caught.value is missing and clock.sleeps == [] and not metrics.snapshot()


def test_a_missing_bucket_passes_final_typed(clock: Clock) -> None:
    missing = _wrapped(
        FileNotFoundError("The specified bucket does not exist"), _boto("NoSuchBucket", 404)
    )
    with pytest.raises(StorageNotFound):
        retrying(
            _failing(missing), "could not read x", counter="get_errors", final=(FileNotFoundError,)
        )
    assert clock.sleeps == []


def test_giving_up_after_the_attempts_raises_the_typed_last_failure(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    failures = [ConnectionRefusedError(errno.ECONNREFUSED, "refused") for _ in range(5)]
    with (
        caplog.at_level(logging.WARNING, logger="disklesslog"),
        pytest.raises(StorageUnavailable, match="could not read x after 5 attempts: ") as e,
    ):
        retrying(_failing(*failures), "could not read x", counter="get_errors", delay=0.1)
    assert e.value.__cause__ is failures[-1] and e.value.retriable
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8])
    assert "gave up" in caplog.text


def test_the_deadline_stops_retries_before_it_passes(clock: Clock) -> None:
    failures = [TimeoutError("timed out") for _ in range(100)]
    with pytest.raises(StorageUnavailable, match="after 4 attempts"):
        retrying(
            _failing(*failures),
            "could not read x",
            counter="get_errors",
            attempts=100,
            delay=0.1,
            deadline=1.0,
        )
    # waits 0.1 + 0.2 + 0.4 = 0.7 s; the next (0.8 s) would end past the 1 s deadline
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.4])
    assert clock.now - 1000.0 <= 1.0


def test_throttling_backs_off_longer_then_gives_up_as_throttled(clock: Clock) -> None:
    slowdowns = [_boto("SlowDown", 503) for _ in range(3)]
    assert (
        retrying(_failing(*slowdowns), "could not store x", counter="put_errors", delay=0.01)
        == "done"
    )
    factor = retries.THROTTLED_FACTOR
    assert clock.sleeps == pytest.approx([0.01 * factor, 0.02 * factor, 0.04 * factor])
    with pytest.raises(StorageThrottled, match="after 5 attempts") as caught:
        retrying(
            _failing(*[_boto("SlowDown", 503) for _ in range(5)]),
            "could not store x",
            counter="put_errors",
            delay=0.01,
        )
    assert caught.value.retriable and caught.value.operation == "put"


def test_the_deadline_option_is_validated() -> None:
    assert deadline_seconds(2500) == 2.5
    for bad in (0, -1, 1.5, "100", True, None):
        with pytest.raises(ConfigError, match="retry_deadline_ms"):
            deadline_seconds(bad)
    with pytest.raises(ConfigError, match="retry_deadline_ms"):
        disklesslog.open("memory://deadline-option/log", retry_deadline_ms=0)


def _boto_with(code: str, status: int, headers: dict[str, str]) -> ClientError:
    failure = _boto(code, status)
    failure.response["ResponseMetadata"]["HTTPHeaders"] = headers
    return failure


def test_retry_after_is_read_from_every_clients_failure() -> None:
    assert retry_after(_boto_with("SlowDown", 503, {"retry-after": "3"})) == 3.0
    azure = _azure(HttpResponseError, 503, "ServerBusy")
    azure.response = SimpleNamespace(headers={"x-ms-retry-after-ms": "1500", "Retry-After": "9"})
    assert retry_after(azure) == 1.5  # Azure's milliseconds are the more precise
    wrapped = OSError("s3fs wraps it")
    wrapped.__cause__ = _boto_with("SlowDown", 503, {"Retry-After": " 0.25 "})
    assert retry_after(wrapped) == 0.25
    soon = email.utils.formatdate(time.time() + 120, usegmt=True)
    dated = retry_after(_boto_with("SlowDown", 503, {"retry-after": soon}))
    assert dated is not None and 110 < dated <= 121
    for headers in ({}, {"retry-after": "soon"}, {"retry-after": "-5"}):
        said = retry_after(_boto_with("SlowDown", 503, headers))
        assert said in (None, 0.0)
    assert retry_after(ConnectionResetError("reset")) is None


def test_the_wait_is_never_shorter_than_the_storage_asked(clock: Clock) -> None:
    call = _failing(
        _boto_with("SlowDown", 503, {"retry-after": "2"}),
        _boto_with("InternalError", 500, {"retry-after": "0"}),
    )
    assert retrying(call, "could not read x", delay=0.1) == "done"
    # 2 s asked (more than the throttled backoff of 1 s), then the backoff (0.2 s)
    assert clock.sleeps == pytest.approx([2.0, 0.2])


def test_a_retry_after_past_the_deadline_gives_up_at_once(clock: Clock) -> None:
    call = _failing(_boto_with("SlowDown", 503, {"retry-after": "60"}))
    with pytest.raises(StorageThrottled) as caught:
        retrying(call, "could not read x", delay=0.1, deadline=30.0)
    assert clock.sleeps == [] and caught.value.retriable
