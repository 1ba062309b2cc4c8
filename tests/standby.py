"""A primary and a streaming hot standby (read replica) for the tests of dpproxy in front of one.

Analysts' read-only tools are often pointed at a replica, and dpproxy only reads from its backend,
so operators do the same. A hot standby behaves differently from a primary: it refuses
SERIALIZABLE, temporary objects and writes, cancels queries that conflict with the WAL it
replays (40001, "conflict with recovery"), and its tables change as the primary's writes arrive.

Both servers run pgserver's PostgreSQL 16 binaries (what ``test_db`` runs on, so no ``clients``
marker), each with a unix socket of its own directory and no TCP. The standby is made with
``pg_basebackup -R`` from the primary and streams from it. The pair is started once per session,
and only when a test asks for it (``conftest.standby_pair``); without the binaries such a test
fails, never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

_SERVER_OPTIONS = ("-c listen_addresses='' -c fsync=off -c synchronous_commit=off -c full_page_writes=on "
                   "-c shared_buffers=32MB -c max_connections=100 -c hot_standby=on -c wal_level=replica "
                   "-c max_wal_senders=5")
_STANDBY_SETTINGS = "dpproxy_test_standby.conf"
"""The standby's file of settings a test changes (``StandbyPair.configure_standby``), included
by its postgresql.conf."""
_REPLAY_WAIT_S = 120.0


def pgserver_bin() -> Path:
    """Where pgserver's PostgreSQL 16 binaries are (``initdb``, ``pg_ctl``, ``pg_basebackup``)."""
    from pgserver._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` OS user when this is root (initdb and postgres refuse root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@dataclass(frozen=True)
class StandbyPair:
    """A running primary and its hot standby: superuser libpq URIs (user ``postgres``, database
    ``postgres``), and the standby's data directory (for its settings)."""

    primary_dsn: str
    standby_dsn: str
    standby_data: Path

    def wait_for_replay(self, database: str = "postgres") -> None:
        """Return once the standby has replayed everything the primary has written so far."""
        with psycopg.connect(_in_database(self.primary_dsn, database), autocommit=True) as primary:
            # Where the last record was inserted: with synchronous_commit off, the last commit
            # may not be written yet, so pg_current_wal_lsn() (written up to) can be before it.
            row = primary.execute("SELECT pg_catalog.pg_current_wal_insert_lsn()::text").fetchone()
            # ... and flushed, hence streamed: a transaction left open (an operator's REINDEX) is
            # otherwise flushed only by the next commit or the bgwriter's snapshot, ~15 s later.
            primary.execute("SET synchronous_commit = on")
            primary.execute("SELECT pg_catalog.txid_current()")
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + _REPLAY_WAIT_S
        # Polled in the standby's postgres database: replay is cluster-wide, and ``database`` may
        # not exist there until its CREATE DATABASE is replayed (under load, "does not exist").
        with psycopg.connect(self.standby_dsn, autocommit=True) as standby:
            while True:
                done = standby.execute("SELECT pg_catalog.pg_last_wal_replay_lsn() >= %s::pg_lsn",
                                       (target,)).fetchone()
                if done is not None and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby did not replay up to {target} in {_REPLAY_WAIT_S:.0f} s")
                time.sleep(0.05)

    def on_standby(self, dsn: str) -> str:
        """``dsn``, a URI of the primary's socket, pointed at the standby's."""
        primary, standby = (_socket_directory(uri) for uri in (self.primary_dsn, self.standby_dsn))
        assert f"host={primary}" in dsn, dsn
        return dsn.replace(f"host={primary}", f"host={standby}")

    def configure_standby(self, **settings: str) -> None:
        """Set the standby's ``settings`` (replacing those of an earlier call) and reload it;
        return once it runs with them."""
        path = self.standby_data / _STANDBY_SETTINGS
        path.write_text("".join(f"{name} = '{value}'\n" for name, value in settings.items()))
        path.chmod(0o644)
        with psycopg.connect(self.standby_dsn, autocommit=True) as standby:
            standby.execute("SELECT pg_catalog.pg_reload_conf()")
            deadline = time.monotonic() + _REPLAY_WAIT_S
            for name, value in settings.items():
                while True:
                    # A new connection reads the reloaded file; this one may not have yet.
                    with psycopg.connect(self.standby_dsn, autocommit=True) as fresh:
                        row = fresh.execute("SELECT setting, unit FROM pg_catalog.pg_settings WHERE name = %s",
                                            (name,)).fetchone()
                    assert row is not None, name
                    if _same_setting(row[0], row[1], value):
                        break
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the standby did not take {name} = {value} (it has {row[0]})")
                    time.sleep(0.05)


def _same_setting(setting: str, unit: str | None, value: str) -> bool:
    """Whether pg_settings' ``setting`` (in ``unit``) is ``value`` as a test writes it (``0``,
    ``on``, ``30s``)."""
    if setting == value:
        return True
    if unit == "ms" and value.endswith("s") and value[:-1].isdigit():
        return setting == str(int(value[:-1]) * 1000)
    return False


def _socket_directory(dsn: str) -> str:
    return dsn.rpartition("host=")[2]


def _in_database(dsn: str, database: str) -> str:
    return dsn.replace("@/postgres?", f"@/{database}?")


def _run(argv: list[str], log: Path | None = None) -> None:
    try:
        subprocess.run(_as_server_user(argv), check=True, capture_output=True, timeout=180)
    except subprocess.CalledProcessError as exc:
        why = exc.stderr.decode(errors="replace")
        if log is not None and log.exists():
            why += log.read_text(errors="replace")
        raise RuntimeError(f"{Path(argv[0]).name} failed: {why}") from exc


@contextmanager
def primary_and_standby() -> Iterator[StandbyPair]:
    """A primary and a streaming hot standby of it, trust authentication on their unix sockets;
    stopped, and removed, on exit.

    The standby starts with ``hot_standby_feedback = on`` (what docs/deployment.md tells operators
    to use); a test changes its settings with ``StandbyPair.configure_standby``. Raises
    RuntimeError naming what is missing when the binaries are not there.
    """
    binaries = pgserver_bin()
    initdb, pg_ctl, basebackup = (binaries / name for name in ("initdb", "pg_ctl", "pg_basebackup"))
    if not all(path.is_file() for path in (initdb, pg_ctl, basebackup)):
        raise RuntimeError(f"the standby tests need initdb, pg_ctl and pg_basebackup in {binaries} "
                           "(pgserver's PostgreSQL, a dependency: pip install -e '.[test]')")
    # Not under tmp_path_factory: pytest keeps its base directory 0700 to root (see tests/pg15.py).
    top = Path(tempfile.mkdtemp(prefix="dpproxy-test-standby-"))
    primary, standby = top / "primary", top / "standby"
    primary_sockets, standby_sockets = top / "primary-sockets", top / "standby-sockets"
    for directory in (primary_sockets, standby_sockets):
        directory.mkdir()
    if os.geteuid() == 0:
        for path in (top, primary_sockets, standby_sockets):
            shutil.chown(path, "postgres")
    started: list[Path] = []
    try:
        _run([str(initdb), "-D", str(primary), "-U", "postgres", "--auth=trust",
              "--encoding=UTF8", "--locale=C.UTF-8", "--no-sync"])
        _run([str(pg_ctl), "-D", str(primary), "-l", str(top / "primary.log"), "-w", "-t", "60",
              "-o", f"-k {primary_sockets} {_SERVER_OPTIONS}", "start"], top / "primary.log")
        started.append(primary)
        _run([str(basebackup), "-D", str(standby), "-h", str(primary_sockets), "-U", "postgres",
              "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"])
        with (standby / "postgresql.conf").open("a") as conf:
            conf.write(f"\ninclude_if_exists = '{_STANDBY_SETTINGS}'\n")
        settings = standby / _STANDBY_SETTINGS
        settings.write_text("hot_standby_feedback = 'on'\n")
        settings.chmod(0o644)
        _run([str(pg_ctl), "-D", str(standby), "-l", str(top / "standby.log"), "-w", "-t", "60",
              "-o", f"-k {standby_sockets} {_SERVER_OPTIONS}", "start"], top / "standby.log")
        started.append(standby)
        pair = StandbyPair(f"postgresql://postgres@/postgres?host={primary_sockets}",
                           f"postgresql://postgres@/postgres?host={standby_sockets}", standby)
        with psycopg.connect(pair.standby_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone()
        if row is None or row[0] is not True:
            raise RuntimeError("the standby is not in recovery")
        pair.wait_for_replay()
        yield pair
    finally:
        for data in reversed(started):
            subprocess.run(_as_server_user([str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)
