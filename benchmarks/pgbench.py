"""pgbench with a DP-shaped custom script: throughput and per-transaction latency percentiles.

One transaction of the script is a COUNT with a two-column WHERE and a SUM with a WHERE,
with pgbench-drawn parameters (inlined into the text with ``-M simple``, sent as Bind
parameters with ``-M extended``). Through dpproxy each answer is a DP release; directly
against PostgreSQL the same text gives the exact values. Latencies come from pgbench's
per-transaction log (``--log``), so p50 and p99 are over every transaction of the run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .postgres import Endpoint
from .stats import percentile

__all__ = ["CATALOG_SCRIPT", "CATALOG_STATEMENTS", "PgbenchResult", "find_pgbench", "run_pgbench", "write_script"]

SCRIPT = """\\set a random(25, 60)
\\set h random(20, 60)
SELECT COUNT(*) FROM {table} WHERE age > :a AND sex = 'Female';
SELECT SUM(hours_per_week) FROM {table} WHERE hours_per_week > :h;
"""

# A BI tool's and a psql user's catalog statements, as recorded in tests/data (Superset's
# connect and introspection, psql's \d): every one passes through dpproxy to PostgreSQL
# and is charged nothing, so throughput is dpproxy's own cost per statement. ``{table}``
# stands for the recorded table's OID (``'public.{table}'::regclass``) and name.
CATALOG_SCRIPT = """\
SELECT t.oid, typarray FROM pg_type t JOIN pg_namespace ns ON typnamespace = ns.oid WHERE typname = 'hstore';
select pg_catalog.version();
select current_schema();
show transaction isolation level;
show standard_conforming_strings;
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind in ('r', 'p');
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
  (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid) FROM pg_catalog.pg_attrdef d
   WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef) AS DEFAULT,
  a.attnotnull, a.attrelid as table_oid, pgd.description as comment, a.attgenerated as generated
FROM pg_catalog.pg_attribute a
LEFT JOIN pg_catalog.pg_description pgd ON (pgd.objoid = a.attrelid AND pgd.objsubid = a.attnum)
WHERE a.attrelid = 'public.{table}'::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum;
SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c
  LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname OPERATOR(pg_catalog.~) '^({table})$' COLLATE pg_catalog.default
  AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3;
"""
CATALOG_STATEMENTS = 8  # statements per transaction of CATALOG_SCRIPT


@dataclass(frozen=True)
class PgbenchResult:
    tps: float
    p50_ms: float
    p99_ms: float
    transactions: int
    failed: int
    error: str | None = None


def find_pgbench(bin_dir: Path) -> str:
    """pgbench from the PostgreSQL that pgserver ships (same version as the server), else PATH."""
    bundled = bin_dir / "pgbench"
    if bundled.exists():
        return str(bundled)
    found = shutil.which("pgbench")
    if found is None:
        raise RuntimeError("pgbench not found (it ships with pgserver and with Debian's postgresql package)")
    return found


def write_script(directory: Path, table: str, template: str = SCRIPT, name: str = "pgbench") -> Path:
    path = directory / f"{name}-{table}.sql"
    path.write_text(template.format(table=table), encoding="utf-8")
    return path


def run_pgbench(
    pgbench: str, endpoint: Endpoint, script: Path, clients: int, mode: str, seconds: float
) -> PgbenchResult:
    """One pgbench run of ``seconds`` against ``endpoint``."""
    with tempfile.TemporaryDirectory(prefix="pgbench-log-") as logs:
        command = [
            pgbench, "-n", "-f", str(script), "-M", mode, "-c", str(clients), "-j", str(min(clients, 2)),
            "-T", str(max(1, round(seconds))), "--log", f"--log-prefix={logs}/tx",
            "-h", endpoint.host, "-p", str(endpoint.port), "-U", endpoint.user, endpoint.dbname,
        ]
        env = {**os.environ, "PGCONNECT_TIMEOUT": "30"}
        if endpoint.password is not None:
            env["PGPASSWORD"] = endpoint.password
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=seconds + 120)
        latencies = sorted(_logged_latencies_ms(Path(logs)))
    output = done.stdout + done.stderr
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", output, re.M)
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    error = None
    if done.returncode != 0 or tps is None or not latencies:
        error = output.strip().splitlines()[-1] if output.strip() else f"pgbench exited {done.returncode}"
    return PgbenchResult(
        tps=float(tps.group(1)) if tps else 0.0,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
        transactions=int(processed.group(1)) if processed else 0,
        failed=int(failed.group(1)) if failed else 0,
        error=error,
    )


def _logged_latencies_ms(directory: Path) -> list[float]:
    """Transaction latencies from pgbench's logs: ``client tx latency_us script epoch us``."""
    latencies = []
    for log in directory.glob("tx.*"):
        for line in log.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and fields[2].isdigit():
                latencies.append(int(fields[2]) / 1000.0)
    return latencies
