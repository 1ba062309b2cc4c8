"""Finding the real clients the suite drives, and what every client test checks.

A client that is missing is a test failure that says how to install it (``./run-tests``
installs all of them on a fresh machine), never a skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import psycopg

__all__ = ["exact_count", "node_script", "pgjdbc_jar", "psqlodbc_driver", "require_tool"]

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


_NODE_DIR = Path(__file__).parent / "node"


def node_script(script: str, workdir: Path, *args: str) -> Any:
    """Run tests/node/``script`` with ``args`` and return the JSON it printed; the first call for a
    ``workdir`` installs tests/node's lockfile there with ``npm ci``."""
    node = require_tool("node", "nodejs")
    if not (workdir / "node_modules").is_dir():
        npm = require_tool("npm", "npm")
        for name in ("package.json", "package-lock.json"):
            shutil.copy(_NODE_DIR / name, workdir / name)
        install = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline"], cwd=workdir,
                                 capture_output=True, text=True, timeout=300)
        assert install.returncode == 0, f"npm ci failed:\n{install.stderr}"
    shutil.copy(_NODE_DIR / script, workdir / script)
    result = subprocess.run([node, script, *args], cwd=workdir, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
