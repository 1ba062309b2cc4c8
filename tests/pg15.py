"""A second real backend for the privacy checks: Debian's PostgreSQL 15, which is built with ICU.

pgserver's PostgreSQL (16, what ``test_db`` runs on) has no ICU, so a check of an ICU or
nondeterministic collation, or of what another major version does with dpproxy's own SQL, needs
this one. It is started once per session, and only when a test asks for it (``pg15_db``): tests
that do are marked ``pg15``, which belongs to the clients run (``-m "not clients"`` needs only
Python). Without the binaries such a test fails, never skips: ``./run-tests`` installs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PG15_BIN = Path(os.environ.get("DPPROXY_TEST_PG15_BIN", "/usr/lib/postgresql/15/bin"))
"""Where ``initdb``, ``pg_ctl`` and ``postgres`` of PostgreSQL 15 are (Debian's ``postgresql-15``)."""

# Only a unix socket of its own directory (so the default port's name is free), and no durability.
_SERVER_OPTIONS = ("-c listen_addresses='' -c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                   "-c shared_buffers=32MB -c max_connections=100")


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` OS user when this is root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@contextmanager
def postgresql_15() -> Iterator[str]:
    """A PostgreSQL 15 in a fresh data directory (``postgresql_server``).

    Raises RuntimeError naming the package when the binaries are not there.
    """
    if not ((PG15_BIN / "initdb").is_file() and (PG15_BIN / "pg_ctl").is_file()):
        raise RuntimeError(f"PostgreSQL 15 is required by the pg15 tests and is not in {PG15_BIN}: "
                           "install Debian's postgresql-15 (./run-tests does), or set DPPROXY_TEST_PG15_BIN")
    with postgresql_server(PG15_BIN, "pg15") as dsn:
        yield dsn


@contextmanager
def postgresql_server(bin_dir: Path, label: str) -> Iterator[str]:
    """A PostgreSQL from ``bin_dir`` (``initdb``, ``pg_ctl``, ``postgres``) in a fresh data directory,
    trust authentication on its unix socket; yields a superuser libpq URI (user ``postgres``) and
    stops it, and removes it, on exit. ``label`` names its temporary directory and its errors.

    Raises RuntimeError with the server's log when it does not start.
    """
    initdb, pg_ctl = bin_dir / "initdb", bin_dir / "pg_ctl"
    # Not under tmp_path_factory: pytest keeps its base directory 0700 to root, which would lock
    # the postgres OS user out of a data directory below it (see conftest.pg_admin_dsn).
    top = Path(tempfile.mkdtemp(prefix=f"dpproxy-test-{label}-"))
    data, sockets = top / "data", top / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(sockets, "postgres")
    try:
        subprocess.run(_as_server_user([str(initdb), "-D", str(data), "-U", "postgres", "--auth=trust",
                                        "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"]),
                       check=True, capture_output=True, timeout=120)
        subprocess.run(_as_server_user([str(pg_ctl), "-D", str(data), "-l", str(top / "log"), "-w", "-t", "60",
                                        "-o", f"-k {sockets} {_SERVER_OPTIONS}", "start"]),
                       check=True, capture_output=True, timeout=120)
    except subprocess.CalledProcessError as exc:
        log = top / "log"
        why = exc.stderr.decode(errors="replace") + (log.read_text(errors="replace") if log.exists() else "")
        shutil.rmtree(top, ignore_errors=True)
        raise RuntimeError(f"PostgreSQL ({label}) did not start: {why}") from exc
    try:
        yield f"postgresql://postgres@/postgres?host={sockets}"
    finally:
        subprocess.run(_as_server_user([str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)
