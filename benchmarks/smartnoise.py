"""SmartNoise SQL on the same tables and queries: the DP SQL library issue 7 measures against.

SmartNoise SQL (``snsql``) runs inside the analyst's Python: it parses the query, rewrites it,
runs the rewritten SQL on PostgreSQL through psycopg2 and adds noise. Its pinned dependencies
(an older OpenDP among them) cannot share dpproxy's environment, so it gets a virtual
environment of its own (``default_venv()``; created by a full benchmark run when missing,
``pip install`` of :data:`REQUIREMENTS`), and ``smartnoise_worker.py`` runs there, timing
``reader.execute`` per statement. :class:`SmartNoiseTimer` drives that worker over pipes, so
``benchmarks.latency.measure`` interleaves it with direct PostgreSQL like any other client.

SmartNoise is given what dpproxy's policy says about the table: the same column bounds, one
row per individual, the table's ε and δ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from policies.model import Policy
from proxy.demo.data import ADULT_COLUMNS

from .environment import note
from .postgres import Endpoint

__all__ = ["REQUIREMENTS", "SmartNoiseError", "SmartNoiseTimer", "default_venv", "find_smartnoise",
           "install_smartnoise", "metadata"]

# The versions the committed results were measured with.
REQUIREMENTS = ("smartnoise-sql==1.0.10", "psycopg2-binary==2.9.13")
WORKER = Path(__file__).with_name("smartnoise_worker.py")
_SQL_TYPES = {"integer": "int", "bigint": "int", "double precision": "float", "text": "string", "date": "datetime"}


class SmartNoiseError(RuntimeError):
    """SmartNoise refused or failed a statement (e.g. MIN and MAX, which it cannot rewrite)."""


def default_venv() -> Path:
    """Where the benchmark keeps SmartNoise's virtual environment between runs."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dpproxy-bench" / "smartnoise-sql"


def find_smartnoise(venv: Path) -> Path | None:
    """The venv's Python when it can import SmartNoise SQL and psycopg2, else None."""
    python = venv / "bin" / "python"
    if not python.exists():
        return None
    check = subprocess.run([str(python), "-c", "import snsql, psycopg2"], capture_output=True, timeout=120)
    return python if check.returncode == 0 else None


def install_smartnoise(venv: Path) -> Path | None:
    """Create ``venv`` with :data:`REQUIREMENTS` (needs the package index); its Python, or None."""
    note(f"SmartNoise SQL: installing {', '.join(REQUIREMENTS)} into {venv}")
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, capture_output=True,
                       timeout=300)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *REQUIREMENTS], check=True,
                       capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        note(f"SmartNoise SQL could not be installed: {str(detail).strip()[-500:]}")
        return None
    return find_smartnoise(venv)


def metadata(policy: Policy, tables: dict[int, str], database: str) -> dict[str, Any]:
    """SmartNoise's metadata for the benchmark tables (in schema public), from dpproxy's policy."""
    sql_types = {name: _SQL_TYPES[sql_type.removesuffix(" NOT NULL")] for name, sql_type in ADULT_COLUMNS}
    described: dict[str, Any] = {}
    for table in tables.values():
        rules = policy.tables[f"public.{table}"]
        columns: dict[str, Any] = {"row_privacy": True}
        for name, column in rules.columns.items():
            if column.bounds is not None:
                lower, upper = column.bounds
                kind = sql_types[name]
                cast = int if kind == "int" else float
                columns[name] = {"type": kind, "lower": cast(lower), "upper": cast(upper)}
            else:
                columns[name] = {"type": "string"}
        described[table] = columns
    return {database: {"public": described}}


class SmartNoiseTimer:
    """A SmartNoise SQL reader on ``endpoint``, in a worker process; a ``benchmarks.latency.Timer``."""

    def __init__(self, python: Path, endpoint: Endpoint, described: dict[str, Any], epsilon: float, delta: float):
        connect = {"host": endpoint.host, "port": endpoint.port, "user": endpoint.user, "dbname": endpoint.dbname}
        if endpoint.password is not None:
            connect["password"] = endpoint.password
        config = {"connect": connect, "metadata": described, "epsilon": epsilon, "delta": delta}
        # A file, not a pipe, for stderr: warnings nobody reads must not fill a pipe and stall the worker.
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._process = subprocess.Popen(
            [str(python), str(WORKER), json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
        )
        try:
            if "ready" not in self._answer():
                raise SmartNoiseError("the SmartNoise worker did not start")
        except BaseException:
            self.close()
            raise

    def time_ms(self, sql: str) -> float:
        """Run ``sql`` through SmartNoise once; its time in ms, as the worker measured it."""
        assert self._process.stdin is not None
        self._process.stdin.write(" ".join(sql.split()) + "\n")
        self._process.stdin.flush()
        answer = self._answer()
        if "error" in answer:
            raise SmartNoiseError(answer["error"])
        return float(answer["ms"])

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._stderr.close()

    def _answer(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._process.wait(timeout=30)
            self._stderr.seek(0)
            error = self._stderr.read()
            raise SmartNoiseError(f"the SmartNoise worker exited: {error.strip()[-500:]}")
        return json.loads(line)
