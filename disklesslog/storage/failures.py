"""What a storage client's exception means: the one place that tells a missing bucket
from a refused credential, an unreachable endpoint or a throttled request.

Every storage call of the library (through s3fs, gcsfs, adlfs, local files or memory)
fails with whatever its client raises: botocore's ``ClientError`` and
``EndpointConnectionError``, aiohttp's ``ClientConnectorError``, gcsfs's ``HttpError``,
azure-core's ``HttpResponseError`` family, builtin ``OSError`` subclasses, and client
exceptions wrapped in others (s3fs turns ``NoSuchBucket`` into a ``FileNotFoundError``
chained to it). :func:`classify` reads the exception and its chain and says which
:class:`~disklesslog.StorageError` it is; :func:`storage_error` builds that error,
naming the URL and the operation. :func:`disklesslog.retries.retrying` retries the
retriable kinds and raises the others at once.

No client library is imported: exceptions are recognised by class name and by the
attributes those classes carry (``response``, ``status_code``, ``error_code``,
``code``, ``status``), so the core install, without s3fs, gcsfs or adlfs, imports this
module, and a client's newer versions keep being recognised.

A ``FileNotFoundError`` of a read, a listing or a delete is an answer, not a failure:
the object is not there, and the caller says what that means (:func:`classify` returns
``None``). It is :class:`~disklesslog.StorageNotFound` when the exception shows that
the bucket or container is missing (S3's ``NoSuchBucket``, Azure's
``ContainerNotFound``), and for a write, which never looks for an existing object:
only the bucket or directory it goes into can be missing (gcsfs reports a missing
bucket only this way).
"""

from __future__ import annotations

import email.utils
import errno
import socket
import time
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import (
    DisklessLogError,
    StorageError,
    StorageNotFound,
    StoragePermissionError,
    StorageThrottled,
    StorageUnavailable,
)

__all__ = ["WRITES", "classify", "retry_after", "storage_error"]

WRITES = frozenset({"put", "create", "replace"})
"""Operations that store an object: a ``FileNotFoundError`` from one of them means the
bucket, container or directory is missing."""

_NOT_FOUND_CODES = frozenset({"NoSuchBucket", "ContainerNotFound", "ContainerBeingDeleted"})
_PERMISSION_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "AccountIsDisabled",
        "AuthenticationFailed",
        "AuthorizationFailure",
        "AuthorizationPermissionMismatch",
        "ExpiredToken",
        "InsufficientAccountPermissions",
        "InvalidAccessKeyId",
        "InvalidToken",
        "SignatureDoesNotMatch",
        "TokenRefreshRequired",
    }
)
_THROTTLED_CODES = frozenset(
    {
        "RequestLimitExceeded",
        "RequestThrottled",
        "ServerBusy",
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "TooManyRequests",
        "TooManyRequestsException",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "ConditionalRequestConflict",
        "InternalError",
        "OperationAborted",
        "OperationTimedOut",
        "RequestTimeout",
        "ServiceUnavailable",
    }
)
"""Service codes of requests that a later attempt may not fail, whatever their HTTP
status (S3 answers a timed-out upload with 400 ``RequestTimeout``, and a conflicting
operation in progress with 409 ``OperationAborted``)."""
_TRANSIENT_CLIENT_STATUSES = frozenset({408, 425})
"""4xx answers that a later attempt may not get: a timeout, "too early"."""

_PERMISSION_CLASSES = frozenset(
    {
        "ClientAuthenticationError",  # azure-core
        "CredentialRetrievalError",  # botocore
        "CredentialUnavailableError",  # azure-identity
        "DefaultCredentialsError",  # google-auth
        "NoAuthTokenError",  # botocore
        "NoCredentialsError",  # botocore
        "PartialCredentialsError",  # botocore
        "ProfileNotFound",  # botocore: the named credentials profile is not configured
        "RefreshError",  # google-auth
        "UnauthorizedSSOTokenError",  # botocore
    }
)
_UNAVAILABLE_CLASSES = frozenset(
    {
        "ClientConnectionError",  # aiohttp
        "ClientConnectorError",  # aiohttp
        "ClientOSError",  # aiohttp
        "ClientPayloadError",  # aiohttp
        "ConnectTimeoutError",  # botocore, urllib3
        "ConnectionClosedError",  # botocore
        "EndpointConnectionError",  # botocore
        "IncompleteReadError",  # botocore
        "ProtocolError",  # urllib3
        "ProxyConnectionError",  # botocore
        "ReadTimeoutError",  # botocore, urllib3
        "ResponseStreamingError",  # botocore
        "ServerDisconnectedError",  # aiohttp
        "ServerTimeoutError",  # aiohttp
        "ServiceRequestError",  # azure-core: the request never got an answer
        "ServiceResponseError",  # azure-core: the answer was cut or unreadable
        "TimeoutError",  # asyncio's, a class of its own before Python 3.11
        "TransportError",  # google-auth
    }
)
_UNAVAILABLE_ERRNOS = frozenset(
    {
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EHOSTDOWN,
        errno.EHOSTUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.ENETUNREACH,
        errno.EPIPE,
        errno.ETIMEDOUT,
    }
)
_PERMANENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG})
"""Local failures no retry cures (a full disk or quota, a read-only file system)."""
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})
_MISTAKES = (AttributeError, NotImplementedError, TypeError, ValueError)
"""What a client raises for a request or an option it cannot take (``storage_options``
its session rejects, a path it cannot parse): the same request fails the same way."""

_REASONS: dict[type[StorageError], str] = {
    StorageNotFound: "the bucket or container does not exist",
    StoragePermissionError: "the storage refused the credentials, or found none",
    StorageUnavailable: "the storage is unreachable or failing",
    StorageThrottled: "the storage is throttling requests",
}


def classify(exc: BaseException, operation: str) -> tuple[type[StorageError], bool] | None:
    """What ``exc``, raised by a storage client during ``operation``, means:
    ``(error class, retriable)``, or ``None`` when it is an answer the caller
    interprets (a ``FileNotFoundError`` of a read, listing or delete: the object is
    not there). A failure of no known kind is a plain :class:`StorageError` and counts
    as retriable (clients raise transient errors of their own types), except the local
    failures no retry cures (a full disk, a read-only file system), HTTP 4xx answers,
    which say the request itself is wrong, and a client's ``TypeError``,
    ``ValueError``, ``AttributeError`` or ``NotImplementedError`` (an option or a
    request it cannot take)."""
    chain = list(_chain(exc))
    for link in chain:
        known = _known(link)
        if known is not None:
            return known
    if isinstance(exc, FileNotFoundError):
        return (StorageNotFound, False) if operation in WRITES else None
    for link in chain:
        status = _status(link)
        if status is not None and 400 <= status < 500:
            return StorageError, False
        if isinstance(link, OSError) and link.errno in _PERMANENT_ERRNOS:
            return StorageError, False
    if isinstance(exc, _MISTAKES):
        return StorageError, False
    return StorageError, True


def storage_error(
    exc: BaseException,
    what: str,
    *,
    url: str | None,
    operation: str,
    attempts: int = 1,
) -> StorageError:
    """The typed error for ``exc``, a client's exception that :func:`classify` calls a
    failure: ``"{what}[ after N attempts]: {exc} [{operation}: {reason}]"``, naming
    ``url`` too when ``what`` does not. The caller chains it: ``raise
    storage_error(...) from exc``."""
    known = classify(exc, operation)
    kind, retriable = known if known is not None else (StorageError, False)
    where = what if url is None or url in what else f"{what} ({url})"
    tried = f" after {attempts} attempts" if attempts > 1 else ""
    reason = _REASONS.get(kind)
    said = str(exc).strip() or type(exc).__name__
    note = f"{operation}: {reason}" if reason else operation
    return kind(
        f"{where}{tried}: {said} [{note}]", url=url, operation=operation, retriable=retriable
    )


def retry_after(exc: BaseException) -> float | None:
    """Seconds the storage asked the client to wait before trying again, from a
    ``Retry-After`` header (seconds or an HTTP date) or Azure's ``x-ms-retry-after-ms``
    on the failure or what it wraps: botocore's response metadata, azure-core's
    ``response.headers``, aiohttp's ``headers``. ``None`` when no answer says.

    A store that throttles says how long it needs; waiting less only earns more
    refusals, so :func:`disklesslog.retries.retrying` waits at least this long."""
    for link in _chain(exc):
        headers = _headers(link)
        if headers is None:
            continue
        milliseconds = _header(headers, "x-ms-retry-after-ms")
        if milliseconds is not None:
            try:
                return max(0.0, float(milliseconds) / 1000)
            except ValueError:
                pass
        value = _header(headers, "retry-after")
        if value is None:
            continue
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            continue
        return max(0.0, when.timestamp() - time.time())
    return None


def _headers(exc: BaseException) -> Mapping[str, Any] | None:
    """The response headers a client's exception carries, if any."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata")
        headers = meta.get("HTTPHeaders") if isinstance(meta, dict) else None
        return headers if isinstance(headers, Mapping) else None
    for holder in (response, exc):
        headers = getattr(holder, "headers", None)
        if isinstance(headers, Mapping):
            return headers
    return None


def _header(headers: Mapping[str, Any], name: str) -> str | None:
    """The header ``name`` of ``headers``, whatever case its keys use."""
    for key, value in headers.items():
        if isinstance(key, str) and key.lower() == name and isinstance(value, str):
            return value.strip()
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during (clients wrap theirs), at
    most 8 deep, stopping at this library's own errors."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen and len(seen) < 8:
        if isinstance(link, DisklessLogError):
            return
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def _names(exc: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(exc).__mro__}


def _known(exc: BaseException) -> tuple[type[StorageError], bool] | None:
    """The kind of one exception of the chain when it says so itself, else ``None``."""
    names = _names(exc)
    code = _code(exc)
    status = _status(exc)
    if code in _NOT_FOUND_CODES:
        return StorageNotFound, False
    if code in _PERMISSION_CODES or names & _PERMISSION_CLASSES or status in (401, 403):
        return StoragePermissionError, False
    if code in _THROTTLED_CODES or status == 429:
        return StorageThrottled, True
    if (
        code in _TRANSIENT_CODES
        or names & _UNAVAILABLE_CLASSES
        or (status is not None and (status >= 500 or status in _TRANSIENT_CLIENT_STATUSES))
    ):
        return StorageUnavailable, True
    if isinstance(exc, PermissionError) or (
        isinstance(exc, OSError) and exc.errno in _PERMISSION_ERRNOS
    ):
        return StoragePermissionError, False
    if isinstance(exc, (ConnectionError, TimeoutError, socket.gaierror)) or (
        isinstance(exc, OSError) and exc.errno in _UNAVAILABLE_ERRNOS
    ):
        return StorageUnavailable, True
    return None


def _code(exc: BaseException) -> str | None:
    """The service's error code: botocore's ``response["Error"]["Code"]``, azure-core's
    ``error_code`` (a string enum)."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error")
        if isinstance(error, dict) and isinstance(error.get("Code"), str):
            return str(error["Code"])
    code = getattr(exc, "error_code", None)
    if code is None:
        return None
    value = getattr(code, "value", code)
    return value if isinstance(value, str) else None


def _status(exc: BaseException) -> int | None:
    """The HTTP status of a failed request: botocore's response metadata, azure-core's
    ``status_code``, gcsfs's ``HttpError.code``, aiohttp's ``status``."""
    response: Any = getattr(exc, "response", None)
    if isinstance(response, dict):
        meta = response.get("ResponseMetadata")
        if isinstance(meta, dict) and type(meta.get("HTTPStatusCode")) is int:
            return int(meta["HTTPStatusCode"])
    for attribute in ("status_code", "status", "code"):
        value = getattr(exc, attribute, None)
        if type(value) is int and 100 <= value < 600:
            return value
    return None
