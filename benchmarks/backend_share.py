"""The backend's share of a DP statement: PostgreSQL's own CPU for pgbench's two statements, sent
directly and as dpproxy sends them (the lock step and the run in one pipeline), interleaved.

Not a timed test: a measuring tool for benchmarks/profile.md ("The backend's share"). For each
table size it plans the two statements of pgbench's transaction (benchmarks/pgbench.py) as dpproxy
does, with the parameter left as ``$1`` as ``-M extended`` sends it, takes the backend SQL dpproxy
sends (:func:`rewriter.rewrite.backend_sql`) and its lock step
(:func:`proxy.serving.relation_locks.lock_step_sql`), and sends, on one backend connection with
dpproxy's pinned settings (``proxy.backend.pool.PINNED_SETTINGS``), in turn:

* ``direct``: pgbench's statement as it is;
* ``run``: dpproxy's backend SQL alone;
* ``step + run``: the lock step and the run in one pipeline with one Sync, as dpproxy sends them.

Each with a fresh draw of pgbench's parameter (as text of no stated type, as pgbench sends it),
``--block`` statements of one variant, then the next, ``--statements`` in all per variant. The
time is the backend process's own time on a CPU (``/proc/<pid>/schedstat``, Linux), which other
processes' load does not add to, as a wall clock's would (caches and frequency still move it);
the report gives the median over blocks, per statement, and each variant's ratio to ``direct``.

Run from the repository root::

    python -m benchmarks.backend_share --rows 1000,48842 --out /tmp/backend_share.md

It starts pgserver's PostgreSQL with the benchmark's tables (``--data-dir`` keeps them) and stops
it at the end.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from proxy.backend.pool import PINNED_SETTINGS
from proxy.demo.embedded import SERVICE_ROLE
from proxy.serving.relation_locks import lock_step_sql

from .plans import DATABASE, backend_sqls

__all__ = ["STATEMENTS", "backend_cpu_ns", "main"]

STATEMENTS = {  # pgbench's transaction (benchmarks/pgbench.py SCRIPT), its draw of the parameter
    "COUNT": ("SELECT COUNT(*) FROM {table} WHERE age > $1 AND sex = 'Female'", (25, 60)),
    "SUM": ("SELECT SUM(hours_per_week) FROM {table} WHERE hours_per_week > $1", (20, 60)),
}


def backend_cpu_ns(pid: int) -> int:
    """Nanoseconds process ``pid`` has spent on a CPU (its first schedstat field)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


def _options() -> str:
    """dpproxy's pinned settings as libpq startup options (a space escaped)."""
    return " ".join(f"-c {name}={value.replace(' ', chr(92) + ' ')}" for name, value in PINNED_SETTINGS.items()
                    if value != "")


def _variants(direct: str, run: str) -> dict[str, list[str]]:
    return {"direct": [direct], "run": [run], "step + run": [lock_step_sql(run), run]}


def _measure(conn: psycopg.Connection, variants: dict[str, list[str]], draw: tuple[int, int],
             statements: int, block: int) -> dict[str, float]:
    """Median backend CPU µs per statement of each variant, over blocks of ``block`` interleaved."""
    pid = conn.info.backend_pid
    blocks: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(max(1, statements // block)):
        for name, sqls in variants.items():
            values = [str(random.randint(*draw)) for _ in range(block)]
            before = backend_cpu_ns(pid)
            for value in values:
                with conn.pipeline():
                    cursors = [conn.execute(_psycopg(sql), (value,)) for sql in sqls]
                cursors[-1].fetchall()
            blocks[name].append((backend_cpu_ns(pid) - before) / block / 1000)
    return {name: statistics.median(times) for name, times in blocks.items()}


def _psycopg(sql: str) -> str:
    """``sql``'s ``$1`` as psycopg's placeholder (a literal ``%`` doubled)."""
    return sql.replace("%", "%%").replace("$1", "%s")


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend_share", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000,48842", help="table sizes (default 1000,48842)")
    parser.add_argument("--statements", type=int, default=300, help="statements per variant and table")
    parser.add_argument("--block", type=int, default=10, help="statements of one variant in a row")
    parser.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here and reuse loaded tables")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.rows.split(",")]
    statements = {name: text for name, (text, _) in STATEMENTS.items()}
    with backend_sqls(sizes, args.data_dir, lambda table: {n: t.format(table=table) for n, t in statements.items()}) \
            as (postgres, texts):
        out("| rows | statement | direct µs | run µs (ratio) | step + run µs (ratio) |")
        out("|---:|---|---:|---:|---:|")
        backend = postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False)
        with psycopg.connect(backend.conninfo(), options=_options(), autocommit=True) as conn:
            for (rows, name), (direct, run) in texts.items():
                times = _measure(conn, _variants(direct, run), STATEMENTS[name][1], args.statements, args.block)
                base = times["direct"]
                out(f"| {rows:,} | {name} | {base:,.1f} | {times['run']:,.1f} ({times['run'] / base:.2f}) "
                    f"| {times['step + run']:,.1f} ({times['step + run'] / base:.2f}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
