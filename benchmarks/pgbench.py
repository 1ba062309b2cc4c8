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

__all__ = ["PgbenchResult", "find_pgbench", "run_pgbench", "write_script"]

SCRIPT = """\\set a random(25, 60)
\\set h random(20, 60)
SELECT COUNT(*) FROM {table} WHERE age > :a AND sex = 'Female';
SELECT SUM(hours_per_week) FROM {table} WHERE hours_per_week > :h;
"""


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
