"""The pytest plugin as a user's project meets it: run in a fresh pytest process in a
directory of its own (pytester), with no configuration but the plugin's, which pytest
loads through the ``pytest11`` entry point.

No server starts here: the skip tests hide the server's package (a conftest that puts
``None`` in ``sys.modules``, so importing it fails as if it were not installed) or its
binary, and the fixture must stop before starting anything."""

from __future__ import annotations

import re

import pytest

from disklesslog.testing import plugin

pytest_plugins = ["pytester"]

# Warnings are errors and unknown marks too, as in a strict CI configuration.
STRICT = ("-W", "error", "--strict-markers", "-p", "no:cacheprovider")

SERVER_MARKERS = ("s3", "azure", "gcs", "postgres", "all_backends")


def test_markers_are_registered_so_strict_runs_accept_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.s3
        @pytest.mark.azure
        @pytest.mark.gcs
        @pytest.mark.postgres
        @pytest.mark.all_backends
        def test_marked():
            pass
        """
    )
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(passed=1)
    assert "warning" not in result.stdout.str().lower()


def test_every_marker_has_a_description(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    described: dict[str, str] = {}
    for line in result.outlines:
        match = re.match(r"@pytest\.mark\.(\w+): (.+)", line)
        if match:
            described[match[1]] = match[2]
    for marker in SERVER_MARKERS:
        assert len(described.get(marker, "")) > 20, (marker, described.get(marker))


def test_every_fixture_has_a_docstring_in_pytest_fixtures(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--fixtures")
    lines = result.outlines
    header = "fixtures defined from disklesslog.testing.plugin"
    start = next(i for i, line in enumerate(lines) if header in line)
    documented: dict[str, list[str]] = {}
    name = None
    for line in lines[start + 1 :]:
        if line.startswith(("-", "=")):
            break  # the next plugin's section
        if line and not line.startswith(" "):
            name = line.split()[0]
            documented[name] = []
        elif name is not None and line.strip():
            documented[name].append(line.strip())
    assert set(documented) == set(plugin.__all__)
    for fixture, text in documented.items():
        assert text, fixture
        assert "no docstring available" not in text, fixture
        assert "scope" in " ".join(text), fixture  # says how long what it yields lives


# Fixtures whose package is hidden, and the reason they must skip with.
HIDDEN_PACKAGES = {
    "s3_log": "s3_server needs moto[server], which is not installed: "
    "pip install 'disklesslog[testing]'",
    "azure_log": "azure_server needs adlfs, which is not installed: "
    "pip install 'disklesslog[azure]'",
    "gcs_log": "gcs_server needs gcsfs, which is not installed: pip install 'disklesslog[gcs]'",
    "postgres_server": "postgres_server needs psycopg and psycopg-pool, which are not installed: "
    "pip install 'disklesslog[postgres]'",
}

HIDING_CONFTEST = """
import sys

for hidden in ("moto", "adlfs", "gcsfs", "psycopg", "psycopg_pool"):
    for name in [n for n in sys.modules if n == hidden or n.startswith(hidden + ".")]:
        sys.modules[name] = None
    sys.modules[hidden] = None
"""


def _one_test_per_fixture(pytester: pytest.Pytester, fixtures: list[str]) -> None:
    pytester.makepyfile(
        test_servers="\n".join(f"def test_{name}({name}):\n    pass\n" for name in fixtures)
    )


def test_fixtures_skip_naming_the_extra_when_their_package_is_missing(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(HIDING_CONFTEST)
    _one_test_per_fixture(pytester, list(HIDDEN_PACKAGES))
    result = pytester.runpytest_subprocess(*STRICT, "-rs")
    result.assert_outcomes(skipped=len(HIDDEN_PACKAGES))
    for reason in HIDDEN_PACKAGES.values():
        assert any(reason in line for line in result.outlines), reason


def test_fixtures_skip_naming_the_missing_server_binary(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``node`` for Azurite (an empty ``PATH``), no PostgreSQL binaries (the lookup
    fails as on a machine without Debian's package)."""
    pytester.makeconftest(
        """
        import disklesslog.testing.servers.postgres as postgres

        def no_binaries():
            raise RuntimeError("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")

        postgres.find_postgres_bin = no_binaries
        """
    )
    _one_test_per_fixture(pytester, ["azure_server", "postgres_server"])
    empty = pytester.mkdir("empty-bin")
    monkeypatch.setenv("PATH", str(empty))
    result = pytester.runpytest_subprocess(*STRICT, "-rs")
    result.assert_outcomes(skipped=2)
    output = result.stdout.str()
    assert "azure_server needs Azurite: " in output
    assert "postgres_server needs PostgreSQL: no PostgreSQL server binaries" in output


def test_required_servers_fail_instead_of_skipping(pytester: pytest.Pytester) -> None:
    """``disklesslog_require_servers = true`` (a CI that must run every server test, such
    as this project's) turns each of those skips into an error with the same reason."""
    pytester.makeconftest(HIDING_CONFTEST)
    pytester.makeini("[pytest]\ndisklesslog_require_servers = true\n")
    _one_test_per_fixture(pytester, ["s3_log"])
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(errors=1)
    assert HIDDEN_PACKAGES["s3_log"] in result.stdout.str()
