"""PostgreSQL's instructions for pgbench's two statements, direct and as dpproxy's run and lock step.

A count, not a timing: what the machine's load cannot move. For each table size it plans the two
statements of pgbench's transaction (benchmarks/pgbench.py, with the literals ``--age`` and
``--hours`` for its draws) as dpproxy does, takes the backend SQL (:func:`rewriter.rewrite.backend_sql`)
and its lock step (:func:`proxy.serving.relation_locks.lock_step_sql`), stops the server, and runs
each text in PostgreSQL's single-user mode (``postgres --single``) under valgrind's callgrind with
dpproxy's pinned settings (``proxy.backend.pool.PINNED_SETTINGS``), counting the instructions of
``exec_simple_query`` and what it calls: once, then ``1 + --repeats`` times, the difference divided
by ``--repeats`` (the first run's cache warming left out). Each statement is then its own
transaction, as a step is not in dpproxy's pipeline; the extended protocol's messages are not
counted. The report gives the total and the planner's share (``pg_plan_queries``).

Run from the repository root (``apt install valgrind``; ~1 minute for the default tables)::

    python -m benchmarks.backend_instructions --rows 1000,48842 --data-dir /tmp/bench-data

Findings: benchmarks/profile.md, "The backend's share of a DP statement on 48,842 rows".
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from proxy.backend.pool import PINNED_SETTINGS
from proxy.serving.relation_locks import lock_step_sql

from .plans import DATABASE, backend_sqls
from .postgres import BenchPostgres

__all__ = ["count_instructions", "main"]

_COUNTED = ("exec_simple_query", "pg_plan_queries")


def _statements(table: str, age: int, hours: int) -> dict[str, str]:
    """pgbench's transaction (benchmarks/pgbench.py SCRIPT) with its draws as literals."""
    return {"COUNT": f"SELECT COUNT(*) FROM {table} WHERE age > {age} AND sex = 'Female'",
            "SUM": f"SELECT SUM(hours_per_week) FROM {table} WHERE hours_per_week > {hours}"}


def _single_user(postgres: BenchPostgres, sql: str, times: int, out: Path) -> dict[str, int]:
    """Instructions of each of _COUNTED (inclusive) over ``times`` runs of ``sql``."""
    settings = [arg for name, value in PINNED_SETTINGS.items() if value != "" for arg in ("-c", f"{name}={value}")]
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--toggle-collect=exec_simple_query",
               str(Path(postgres.bin_dir) / "postgres"), "--single", "-D", str(postgres.data_dir), *settings, DATABASE]
    if postgres.system_user is not None:  # PostgreSQL refuses to run as root
        command = ["runuser", "-u", postgres.system_user, "--", *command]
    done = subprocess.run(command, input=(" ".join(sql.split()) + ";\n") * times, capture_output=True, text=True)
    if done.returncode != 0 or "ERROR:" in done.stdout + done.stderr:
        raise RuntimeError(f"postgres --single failed on {sql[:80]}: {(done.stdout + done.stderr)[-600:]}")
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(out)],
                               capture_output=True, text=True, check=True).stdout
    counts: dict[str, int] = {}
    for line in annotated.splitlines():
        match = re.match(r"\s*([\d,]+) .*?:(\w+) ", line)
        if match and match[2] in _COUNTED:
            counts.setdefault(match[2], int(match[1].replace(",", "")))
    return counts


def count_instructions(postgres: BenchPostgres, sql: str, repeats: int) -> dict[str, float]:
    """Instructions per run of ``sql`` past the first (the server stopped, its data dir given)."""
    with tempfile.TemporaryDirectory(prefix="dpproxy-backend-ir-") as work:
        out = Path(work) / "callgrind.out"
        Path(work).chmod(0o777)  # written by the system user PostgreSQL runs as
        once = _single_user(postgres, sql, 1, out)
        more = _single_user(postgres, sql, 1 + repeats, out)
    return {name: (more.get(name, 0) - once.get(name, 0)) / repeats for name in _COUNTED}


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend_instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000,48842", help="table sizes (default 1000,48842)")
    parser.add_argument("--age", type=int, default=40, help="COUNT's literal (pgbench draws 25-60)")
    parser.add_argument("--hours", type=int, default=30, help="SUM's literal (pgbench draws 20-60)")
    parser.add_argument("--repeats", type=int, default=3, help="runs counted after the first")
    parser.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here and reuse loaded tables")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.rows.split(",")]
    with backend_sqls(sizes, args.data_dir, lambda table: _statements(table, args.age, args.hours)) as (postgres, texts):
        pass  # counted with the server stopped: single-user mode needs its data directory to itself
    out("| rows | statement | direct | run (ratio) | lock step | planning: direct / run / step |")
    out("|---:|---|---:|---:|---:|---:|")
    for (rows, name), (direct, run) in texts.items():
        counted = [count_instructions(postgres, sql, args.repeats) for sql in (direct, run, lock_step_sql(run))]
        total = [c["exec_simple_query"] / 1e6 for c in counted]
        plan = " / ".join(f"{c['pg_plan_queries'] / 1e6:.3f}" for c in counted)
        out(f"| {rows:,} | {name} | {total[0]:.3f} M | {total[1]:.3f} M ({total[1] / total[0]:.3f}) "
            f"| {total[2]:.3f} M | {plan} M |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
