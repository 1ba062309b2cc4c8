"""``dpproxy demo``: an embedded PostgreSQL with the Adult table, a demo policy, and dpproxy.

The demo's contract (scripts and docs rely on it): login ``analyst``, password
``analyst``, database ``demo``, table ``adult``, per-query ε = 1, and a budget of 1,000 ε
(at least 500 such queries). Everything lives in one data directory, so a second run
reuses it, and a run after a crash picks up the orphaned PostgreSQL and carries on.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psycopg
from psycopg import sql

from proxy.serving.startup import StartupError

from .data import load_adult

__all__ = ["DEMO_POLICY", "EmbeddedPostgres", "default_data_dir", "prepare_demo_database", "write_demo_policy"]

log = logging.getLogger("dpproxy.demo")
# pgserver logs every pg_ctl call at INFO; a demo user needs none of it.
logging.getLogger("pgserver").setLevel(logging.WARNING)

SERVICE_ROLE = "dpproxy_service"

DEMO_POLICY = """\
# dpproxy demo policy (written by `dpproxy demo`; see docs/policy.md for every key)
backend:
  dsn: "{dsn}"
  statement_timeout_ms: 30000
listen:
  host: 127.0.0.1
  port: {port}
ledger:
  url: "sqlite:///{ledger}"
users:
  analyst:
    password: analyst
    budget:
      epsilon: 1000       # 1,000 queries at the table's ε = 1
      delta: 0.01
tables:
  public.adult:
    access: protected
    epsilon: 1.0          # per query, split evenly over its aggregate columns
    delta: 1.0e-6         # per MIN/MAX column (sample and aggregate)
    partitions: 1024      # ~48 of the 48,842 rows per partition; see docs/mechanisms.md
    avg: sum_count        # the default: noisy clamped SUM / noisy COUNT, pure ε; or sample_aggregate (δ)
    columns:
      age:            {{bounds: [17, 90]}}
      fnlwgt:         {{bounds: [0, 1500000]}}
      education_num:  {{bounds: [1, 16]}}
      capital_gain:   {{bounds: [0, 100000]}}
      capital_loss:   {{bounds: [0, 4500]}}
      hours_per_week: {{bounds: [1, 99]}}
      # group_by: true answers GROUP BY over these keys as a noised histogram (docs/policy.md)
      sex:            {{categories: [Male, Female], group_by: true}}
      race:           {{categories: [White, Black, Asian-Pac-Islander, Amer-Indian-Eskimo, Other], group_by: true}}
      workclass:      {{categories: [Private, Self-emp-not-inc, Self-emp-inc, Federal-gov, Local-gov, State-gov, Without-pay, Never-worked], group_by: true}}
      interview_date: {{bounds: [2021-01-01, 2024-12-31], group_by: [month, quarter, year]}}
"""


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "dpproxy" / "demo"


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir`` run by pgserver (no system installation needed)."""

    def __init__(self, data_dir: Path):
        """Start it (or take over one left running); StartupError if it does not start."""
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); pgserver
            # falls back to /tmp correctly, so the warning only alarms demo users.
            warnings.simplefilter("ignore")
            import pgserver  # imported here: only the demo and the tests need it

            data_dir.mkdir(parents=True, exist_ok=True)
            _forget_dead_handles(data_dir)
            try:
                self._server = pgserver.get_server(str(data_dir), cleanup_mode="stop")
            except (subprocess.SubprocessError, RuntimeError) as exc:
                log_file = data_dir / "log"
                raise StartupError(f"the embedded PostgreSQL in {data_dir} did not start: {_why_not(log_file)}",
                                   hint=f"see its log {log_file}, or choose another --data-dir") from exc

    def uri(self, database: str = "postgres", user: str | None = None) -> str:
        """A libpq URI for ``database`` over the server's unix socket."""
        uri = self._server.get_uri(database)
        if user is None:
            return uri
        parsed = urlparse(uri)
        host = parse_qs(parsed.query)["host"][0]
        return f"postgresql://{user}@/{database}?host={host}"

    def stop(self) -> None:
        self._server.cleanup()


def _why_not(log_file: Path) -> str:
    """The last complaint in a PostgreSQL server log (the reason it did not start)."""
    try:
        lines = log_file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "pg_ctl failed and left no log"
    complaints = [line.strip() for line in lines if any(word in line for word in ("FATAL", "PANIC", "could not"))]
    return complaints[-1] if complaints else "pg_ctl failed"


def _forget_dead_handles(data_dir: Path) -> None:
    """Drop PIDs of crashed processes from pgserver's handle list.

    pgserver stops PostgreSQL when its last handle goes, and records handles as PIDs in
    ``.handle_pids.json``; a demo killed with -9 never removes its PID, so every later
    demo would leave PostgreSQL running at exit.
    """
    import psutil  # a pgserver dependency

    handles = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def prepare_demo_database(admin_uri: str, database: str = "demo") -> str:
    """Create the demo database, the Adult table and a SELECT-only service role; return its DSN."""
    with psycopg.connect(admin_uri, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (SERVICE_ROLE,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(SERVICE_ROLE)))
    parsed = urlparse(admin_uri)
    demo_uri = parsed._replace(path=f"/{database}").geturl()
    if load_adult(demo_uri):
        log.info("loaded the adult table into %s", database)
    with psycopg.connect(demo_uri, autocommit=True) as conn:
        role = sql.Identifier(SERVICE_ROLE)
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
        conn.execute(sql.SQL("GRANT SELECT ON public.adult TO {}").format(role))
    host = parse_qs(parsed.query).get("host", [""])[0]
    return f"postgresql://{SERVICE_ROLE}@/{database}?host={host}"


def write_demo_policy(path: Path, dsn: str, port: int, ledger: Path) -> Path:
    """The demo policy at ``path``; its audit log goes next to the ledger (``audit.jsonl``)."""
    audit = ledger.parent / "audit.jsonl"
    text = DEMO_POLICY.format(dsn=dsn, port=port, ledger=ledger).replace(
        "\nusers:\n", f'\naudit:\n  path: "{audit}"   # one JSON line per statement, kept out of the terminal\nusers:\n', 1)
    path.write_text(text, encoding="utf-8")
    return path
