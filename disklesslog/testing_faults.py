"""The first home of :mod:`disklesslog.testing.faults` (``faulty://``), whose names it
re-exports so that code and docs written against ``disklesslog.testing_faults`` keep
working."""

from .testing.faults import (
    FAULTS,
    OPERATIONS,
    FaultyFileSystem,
    InjectedClientError,
    InjectedThrottling,
)

__all__ = [
    "FAULTS",
    "OPERATIONS",
    "FaultyFileSystem",
    "InjectedClientError",
    "InjectedThrottling",
]
