"""Finding the real clients the suite drives, and what every client test checks.

A client that is missing is a test failure that says how to install it (``./run-tests``
installs all of them on a fresh machine), never a skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psycopg
from conftest import TEST_POLICY

__all__ = ["HISTOGRAM_POLICY", "exact_count", "pgjdbc_jar", "psqlodbc_driver", "require_tool"]

HISTOGRAM_POLICY = TEST_POLICY.replace("sex: {{categories: [Male, Female]}}",
                                      "sex: {{categories: [Male, Female], group_by: true}}")
"""The suite's policy with adult's sex opted in as a GROUP BY key, for the clients' histograms."""
assert HISTOGRAM_POLICY != TEST_POLICY

# The pgjdbc jar: the one the captured behaviour came from (Maven's local repository),
# else Debian's libpostgresql-jdbc-java.
_PGJDBC_JARS = (
    Path.home() / ".m2/repository/org/postgresql/postgresql/42.7.13/postgresql-42.7.13.jar",
    Path("/usr/share/java/postgresql.jar"),
)
# Debian's odbc-postgresql (the Unicode driver).
_PSQLODBC = (
    Path("/usr/lib/x86_64-linux-gnu/odbc/psqlodbcw.so"),
    Path("/usr/lib/aarch64-linux-gnu/odbc/psqlodbcw.so"),
)


def require_tool(name: str, package: str) -> str:
    """The path of executable ``name``; fail with how to get it when it is missing."""
    path = shutil.which(name)
    if path is None:
        raise AssertionError(f"{name} is required by the test suite: apt-get install {package} (./run-tests does)")
    return path


def _first_existing(candidates: tuple[Path, ...], what: str, package: str) -> Path:
    for path in candidates:
        if path.is_file():
            return path
    raise AssertionError(
        f"{what} is required by the test suite: apt-get install {package} (./run-tests does); "
        f"looked for {', '.join(map(str, candidates))}"
    )


def pgjdbc_jar() -> Path:
    return _first_existing(_PGJDBC_JARS, "the PostgreSQL JDBC driver", "libpostgresql-jdbc-java")


def psqlodbc_driver() -> Path:
    return _first_existing(_PSQLODBC, "the psqlODBC driver", "odbc-postgresql unixodbc")


def exact_count(admin: psycopg.Connection, where: str = "") -> int:
    """adult's exact row count (under ``where``), read directly from PostgreSQL."""
    query = "SELECT COUNT(*) FROM adult" + (f" WHERE {where}" if where else "")
    (count,) = admin.execute(query).fetchone()  # type: ignore[misc]
    return int(count)
