"""A GROUP BY over declared keys grouped by the row's cell, against grouping by the raw value first.

Not a timed test: a measuring tool for rewriter/sort_memory.py's hashed groups. For each statement
it times, interleaved on one connection as dpproxy's service role, inside a transaction whose
setting step runs first (untimed), the backend SQL this tree sends (each row mapped to its
category's number, then hashed; ``work_mem`` at the cells' bound, ``enable_sort`` off) and the
backend SQL of ``--baseline-source`` (a checkout of the code before: grouped by the raw value,
then mapped per group, under the table's ``work_mem`` bound), and the statement itself sent
straight to PostgreSQL; it prints the medians and their ratios to the direct statement's. The
policy is the benchmark's (benchmarks/servers.py) with ``native_country`` declared too: its 41
countries with ``United-States``, nine rows in ten, last, so that most rows run every comparison
of the CASE (the costliest order), and ``other``.

Run from the repository root, with a checkout of the code to compare with::

    git archive main | tar -x -C /tmp/base
    python -m benchmarks.grouped_by_cell --baseline-source /tmp/base --rows 48842,1000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import yaml

from proxy.demo.embedded import SERVICE_ROLE

from .plans import DATABASE
from .postgres import BenchPostgres, Endpoint, free_port
from .servers import write_policy
from .tables import prepare_database, table_name

COUNTRIES = [
    "Mexico", "Philippines", "Germany", "Puerto-Rico", "Canada", "El-Salvador", "India", "Cuba", "England", "China",
    "South", "Jamaica", "Italy", "Dominican-Republic", "Japan", "Guatemala", "Poland", "Vietnam", "Columbia", "Haiti",
    "Portugal", "Taiwan", "Iran", "Greece", "Nicaragua", "Peru", "Ecuador", "France", "Ireland", "Hong", "Thailand",
    "Cambodia", "Trinadad&Tobago", "Laos", "Yugoslavia", "Outlying-US(Guam-USVI-etc)", "Scotland", "Honduras",
    "Hungary", "Holand-Netherlands", "United-States",
]
STATEMENTS = {
    "sex, COUNT": "SELECT sex, COUNT(*) FROM {table} GROUP BY sex",
    "race, COUNT, SUM": "SELECT race, COUNT(*), SUM(hours_per_week) FROM {table} GROUP BY race",
    "sex × race, COUNT": "SELECT sex, race, COUNT(*) FROM {table} GROUP BY sex, race",
    "native_country (41, other), COUNT": "SELECT native_country, COUNT(*) FROM {table} GROUP BY native_country",
    "month, COUNT": "SELECT date_trunc('month', interview_date) AS m, COUNT(*) FROM {table} GROUP BY 1",
}
# Printed by the baseline's interpreter: each statement's backend SQL and setting step (or none).
_SENT = """
import json, sys
from benchmarks.plans import plan_of
from rewriter.rewrite import backend_sql, partition_seed
from rewriter.sort_memory import memory_steps
out = {}
for name, sql in json.loads(sys.argv[2]).items():
    plan = plan_of(sys.argv[1], sql)
    steps = memory_steps(plan, in_block=False)
    out[name] = [backend_sql(plan, seed=partition_seed()), steps.setting if steps else None]
print(json.dumps(out))
"""


def sent(source: Path, policy: Path, statements: dict[str, str]) -> dict[str, tuple[str, str | None]]:
    """What the code in ``source`` sends the backend for each statement: its SQL and setting step."""
    done = subprocess.run([sys.executable, "-c", _SENT, str(policy), json.dumps(statements)], cwd=source,
                          capture_output=True, text=True, check=True)
    return {name: (sql, setting) for name, (sql, setting) in json.loads(done.stdout.splitlines()[-1]).items()}


def _timed(conn: psycopg.Connection, sql: str, setting: str | None) -> float:
    with conn.transaction():
        if setting is not None:
            conn.execute(setting)
        start = time.perf_counter()
        conn.execute(sql).fetchall()
        return (time.perf_counter() - start) * 1000


def measure(uri: str, probes: dict[str, tuple[str, str | None]], iterations: int) -> dict[str, float]:
    """The median ms of each probe, run ``iterations`` times interleaved (after two warm-ups)."""
    samples: dict[str, list[float]] = {label: [] for label in probes}
    labels = list(probes)
    with psycopg.connect(uri) as conn:
        for i in range(iterations + 2):
            for k in range(len(labels)):
                label = labels[(i + k) % len(labels)]
                elapsed = _timed(conn, *probes[label])
                if i >= 2:
                    samples[label].append(elapsed)
    return {label: statistics.median(values) for label, values in samples.items()}


def _policy(path: Path, backend: Endpoint, tables: dict[int, str]) -> Path:
    """The benchmark's policy for ``tables``, with ``native_country``'s categories declared."""
    write_policy(path, backend, free_port(), tables)
    policy = yaml.safe_load(path.read_text(encoding="utf-8"))
    for table in policy["tables"].values():
        table["columns"]["native_country"] = {"categories": COUNTRIES, "other": "other", "group_by": True}
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline-source", type=Path, required=True, help="a checkout of the code to compare with")
    parser.add_argument("--rows", default="48842,1000000", help="table sizes, comma-separated")
    parser.add_argument("--iterations", type=int, default=21)
    parser.add_argument("--data-dir", type=Path, help="a PostgreSQL data directory to keep (default: a temporary one)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.rows.split(",")]
    postgres = BenchPostgres(args.data_dir or Path(tempfile.mkdtemp(prefix="dpproxy-grouped-")) / "pgdata", 20)
    try:
        prepare_database(postgres, DATABASE, sizes)
        tables = {rows: table_name(rows) for rows in sizes}
        service = postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False)
        policy = _policy(Path(tempfile.mkdtemp(prefix="dpproxy-grouped-")) / "policy.yaml", service, tables)
        print("| rows | statement | direct (ms) | raw value first (ms) | by cell (ms) | raw ÷ direct | cell ÷ direct "
              "| cell ÷ raw |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for rows, table in tables.items():
            statements = {name: sql.format(table=table) for name, sql in STATEMENTS.items()}
            before = sent(args.baseline_source.resolve(), policy, statements)
            after = sent(Path(__file__).resolve().parent.parent, policy, statements)
            for name, direct in statements.items():
                times = measure(service.uri(), {"direct": (direct, None), "raw": before[name], "cell": after[name]},
                                args.iterations)
                d, r, c = times["direct"], times["raw"], times["cell"]
                print(f"| {rows:,} | {name} | {d:.1f} | {r:.1f} | {c:.1f} | {r / d:.2f} | {c / d:.2f} | {c / r:.2f} |",
                      flush=True)
    finally:
        postgres.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
