"""What one row can add to dpproxy's own work on a DP statement: the timing channel after the backend answers.

Not a timed test: a measuring tool for docs/threat-model.md's Timing section, the proxy-side
counterpart of :mod:`benchmarks.row_cost` (which times the backend). It uses row_cost's tables
(``rc_base``, and ``rc_plus``: the same rows and one adversarial row), policy and row builder.
For each construct of :data:`CONSTRUCTS` it plans the statement as dpproxy does (one partition
seed for both tables), runs the backend SQL once on each table, keeps PostgreSQL's text result
(a libpq ``PGresult``, as dpproxy's backend session holds it), and then replays that result
through the executor's release path (``proxy.serving.executor._row_released`` for one aggregate
row, ``_cells_released`` for a GROUP BY: reading the backend's values, splitting them into each
aggregate's parts, the mechanisms, and encoding the answer's text) ``--repeats`` times per
table, alternating base and neighbour. Each run is timed as CPU time of the thread
(``time.thread_time_ns``) and as wall time (``time.perf_counter_ns``); the report gives the
medians, the difference (what the row buys) and the base's interquartile range (the jitter a
difference must clear). The noise differs on every run, as it does between statements: what is
compared is the distribution of the work, not one run's.

The ``mechanism:`` constructs call a mechanism directly on neighbouring inputs that the rc tables
do not produce: partition values of sample-and-aggregate with most partitions at a bound, where
one row moves one partition across it; and the exponential mechanism's draw (percentile, MODE)
on neighbouring counts, whose unpadded trial count K/Z the line's name gives.

Run from the repository root::

    python -m benchmarks.proxy_cost --out /tmp/proxy_cost.md   # ~2 minutes on an idle machine

It starts Debian's PostgreSQL 15 (``tests/pg15.py``) in a temporary directory and stops it at
the end, or uses ``--dsn``. ``--only NAME`` (repeatable) runs the constructs whose name contains
NAME. The figures of a run are in benchmarks/results.md ("What one row adds to dpproxy's own
work").
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from mechanisms.exponential import release_mode
from mechanisms.quantile import QuantileGrid, release_quantile
from mechanisms.smooth_median import (
    prepare_partition_values, release_sample_and_aggregate, smooth_sensitivity_median, smoothing_beta,
)
from policies.loader import load_policy
from proxy.backend.connection import build_registry, connect
from proxy.backend.unread_rows import UnreadRows, text_rows
from proxy.serving.executor import _cells_released, _row_released
from rewriter.classify import DPQuery, classify
from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql, partition_seed
from rewriter.statements import split_statements

from .row_cost import (
    _FINE_NUMERIC, _RANDOM_TEXT, _WIDE_NUMERIC, Construct, _set_row, load_tables, on_server, policy_file, print_report,
)

__all__ = ["CONSTRUCTS", "MECHANISM_CONSTRUCTS", "SELECTION_CONSTRUCTS", "Timed", "measure", "report"]

EPSILON = 1.0  # the statement's ε; the mechanisms' work does not depend on it beyond the smoothing β
_FAR = "1e9"

CONSTRUCTS: tuple[Construct, ...] = (
    Construct("COUNT(*), ordinary row", "SELECT COUNT(*) FROM {table}"),
    Construct("SUM(age), at the bound (100)", "SELECT SUM(age) FROM {table}", {"age": "100"}),
    Construct("SUM(age), 2147483647", "SELECT SUM(age) FROM {table}", {"age": "2147483647"}),
    Construct("SUM(n), 131,072-digit numeric", "SELECT SUM(n) FROM {table}", {"n": _WIDE_NUMERIC}),
    Construct("SUM(n), 16,383 fraction digits", "SELECT SUM(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("SUM(n), NaN", "SELECT SUM(n) FROM {table}", {"n": "'NaN'"}),
    Construct("SUM(n), Infinity", "SELECT SUM(n) FROM {table}", {"n": "'Infinity'"}),
    Construct("SUM(f), -Infinity", "SELECT SUM(f) FROM {table}", {"f": "'-Infinity'"}),
    Construct("SUM(f), NaN", "SELECT SUM(f) FROM {table}", {"f": "'NaN'"}),
    Construct("AVG(n) (noisy sum / count), 16,383 fraction digits", "SELECT AVG(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("AVG(n) (noisy sum / count), NaN", "SELECT AVG(n) FROM {table}", {"n": "'NaN'"}),
    Construct("AVG(f) sample-and-aggregate, 1e308", "SELECT AVG(f) FROM {table}", {"f": "1e308"}),
    Construct("AVG(f) sample-and-aggregate, NaN", "SELECT AVG(f) FROM {table}", {"f": "'NaN'"}),
    Construct("AVG(f) sample-and-aggregate, -Infinity", "SELECT AVG(f) FROM {table}", {"f": "'-Infinity'"}),
    Construct("AVG(f) sample-and-aggregate, at the lower bound (0)", "SELECT AVG(f) FROM {table}", {"f": "0"}),
    Construct("MAX(n) sample-and-aggregate, 131,072-digit numeric", "SELECT MAX(n) FROM {table}", {"n": _WIDE_NUMERIC}),
    Construct("MIN(n) sample-and-aggregate, -1e9", "SELECT MIN(n) FROM {table}", {"n": "-" + _FAR}),
    Construct("MIN(age) sample-and-aggregate, 0", "SELECT MIN(age) FROM {table}", {"age": "0"}),
    Construct("percentile_cont(0.5) of n, 16,383 fraction digits",
              "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("percentile_cont(0.5) of n, NaN", "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table}",
              {"n": "'NaN'"}),
    Construct("percentile_disc(0.9) of age, 2147483647",
              "SELECT percentile_disc(0.9) WITHIN GROUP (ORDER BY age) FROM {table}", {"age": "2147483647"}),
    Construct("VARIANCE(n), 16,383 fraction digits", "SELECT VARIANCE(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("VARIANCE(n), NaN", "SELECT VARIANCE(n) FROM {table}", {"n": "'NaN'"}),
    Construct("STDDEV(f), Infinity", "SELECT STDDEV(f) FROM {table}", {"f": "'Infinity'"}),
    Construct("MODE() of cat, a new category", "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM {table}", {"cat": "'zz'"}),
    Construct("MODE() of cat, 3 MB random text", "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM {table}", {"cat": _RANDOM_TEXT}),
    Construct("COUNT(DISTINCT cat), a new category", "SELECT COUNT(DISTINCT cat) FROM {table}", {"cat": "'zz'"}),
    Construct("GROUP BY cat (categories, other), a new category", "SELECT cat, COUNT(*) FROM {table} GROUP BY cat", {"cat": "'zz'"}),
    Construct("GROUP BY cat (categories, other), 3 MB random text", "SELECT cat, COUNT(*) FROM {table} GROUP BY cat",
              {"cat": _RANDOM_TEXT}),
    Construct("GROUP BY cat, AVG(f) per cell (sample-and-aggregate), 1e308",
              "SELECT cat, AVG(f) FROM {table} GROUP BY cat", {"f": "1e308"}),
    Construct("GROUP BY cat, SUM(n), 16,383 fraction digits", "SELECT cat, SUM(n) FROM {table} GROUP BY cat",
              {"n": _FINE_NUMERIC}),
    Construct("GROUP BY cat, SUM(n), 16,383 fraction digits in the other cell",
              "SELECT cat, SUM(n) FROM {table} GROUP BY cat", {"cat": "'zz'", "n": _FINE_NUMERIC}),
    Construct("GROUP BY cat, AVG(n) (noisy sum / count), 16,383 fraction digits",
              "SELECT cat, AVG(n) FROM {table} GROUP BY cat", {"n": _FINE_NUMERIC}),
    Construct("GROUP BY cat, SUM(n), percentile_cont(0.5) of n, 16,383 fraction digits",
              "SELECT cat, SUM(n), percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table} GROUP BY cat",
              {"n": _FINE_NUMERIC}),
    Construct("GROUP BY date_trunc('month', ts), SUM(n), 16,383 fraction digits",
              "SELECT date_trunc('month', ts) AS m, SUM(n) FROM {table} GROUP BY 1", {"n": _FINE_NUMERIC}),
    Construct("GROUP BY EXTRACT(MONTH FROM ts), SUM(n), 16,383 fraction digits",
              "SELECT EXTRACT(MONTH FROM ts) AS m, SUM(n) FROM {table} GROUP BY 1", {"n": _FINE_NUMERIC}),
    Construct("SUM(n), percentile_cont(0.5) of n, 16,383 fraction digits",
              "SELECT SUM(n), percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("GROUP BY cat, VARIANCE(n), 16,383 fraction digits", "SELECT cat, VARIANCE(n) FROM {table} GROUP BY cat",
              {"n": _FINE_NUMERIC}),
    Construct("GROUP BY cat, percentile_cont(0.5) of n, NaN",
              "SELECT cat, percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table} GROUP BY cat", {"n": "'NaN'"}),
    Construct("GROUP BY width_bucket(n, 0, 100, 10), NaN",
              "SELECT width_bucket(n, 0, 100, 10) AS b, COUNT(*) FROM {table} GROUP BY 1", {"n": "'NaN'"}),
    Construct("GROUP BY width_bucket(n, 0, 100, 10), 1e9",
              "SELECT width_bucket(n, 0, 100, 10) AS b, COUNT(*) FROM {table} GROUP BY 1", {"n": _FAR}),
    Construct("GROUP BY date_trunc('month', ts), infinity", "SELECT date_trunc('month', ts) AS m, COUNT(*) FROM {table} GROUP BY 1",
              {"ts": "'infinity'"}),
    Construct("GROUP BY date_trunc('month', ts), 294276 AD",
              "SELECT date_trunc('month', ts) AS m, COUNT(*) FROM {table} GROUP BY 1", {"ts": "'294276-12-31 23:59:59+00'"}),
)


def _partitions_at_hi(at_hi: int, m: int = 256) -> list[float | None]:
    """m partition values in [0, 100]: ``at_hi`` of them at 100, the rest spread below it."""
    return [*[100.0] * at_hi, *(10.0 + 80.0 * i / m for i in range(m - at_hi))]


# (name, base's partition values, neighbour's): sample-and-aggregate of m = 256 on [0, 100], ε 1, δ 1e-6.
MECHANISM_CONSTRUCTS: tuple[tuple[str, list[float | None], list[float | None]], ...] = (
    ("mechanism: S&A median, 225 → 226 of 256 partitions at the upper bound", _partitions_at_hi(225), _partitions_at_hi(226)),
    ("mechanism: S&A median, 128 → 129 of 256 partitions at the upper bound", _partitions_at_hi(128), _partitions_at_hi(129)),
    ("mechanism: S&A median, spread, one partition moved to the upper bound", _partitions_at_hi(0), _partitions_at_hi(1)),
    ("mechanism: S&A median, all at 50, one moved to the upper bound", [50.0] * 256, [*[50.0] * 255, 100.0]),
)


_GRID = QuantileGrid.for_bounds(0.0, 100.0, False, 1000)
_EVEN = [10] * 1000  # row_cost's n: 10,000 values, 10 in each of the 1,000 cells of [0, 100]

# (name, base release, neighbour's): the exponential mechanism alone on neighbouring counts, ε 1.
SELECTION_CONSTRUCTS: tuple[tuple[str, Callable[[], object], Callable[[], object]], ...] = (
    ("mechanism: median over 1,000 cells, 10 rows each; one more in the top cell (K/Z 500 → 622 unpadded)",
     partial(release_quantile, _GRID, _EVEN, Fraction(1, 2), EPSILON),
     partial(release_quantile, _GRID, [*_EVEN[:-1], 11], Fraction(1, 2), EPSILON)),
    ("mechanism: median over 1,000 cells, all 10,000 rows in one cell; one more in another (K/Z 1,000 → 1,000)",
     partial(release_quantile, _GRID, [0] * 500 + [10_000] + [0] * 499, Fraction(1, 2), EPSILON),
     partial(release_quantile, _GRID, [0] * 500 + [10_000] + [1] + [0] * 498, Fraction(1, 2), EPSILON)),
    ("mechanism: MODE of 3 categories, counts 40/40/20; one more in the first (K/Z 1.5 → 1.9 unpadded)",
     partial(release_mode, ("a", "b", "c"), (40, 40, 20), EPSILON),
     partial(release_mode, ("a", "b", "c"), (41, 40, 20), EPSILON)),
)


@dataclass(frozen=True)
class Timed:
    """A construct's outcome: refused (the refusal's text) or both tables' runs, CPU and wall, in ns."""

    name: str
    refused: str | None = None
    base_cpu: tuple[int, ...] = ()
    plus_cpu: tuple[int, ...] = ()
    base_wall: tuple[int, ...] = ()
    plus_wall: tuple[int, ...] = ()
    rows: tuple[int, int] = (0, 0)  # backend rows dpproxy reads, base and neighbour

    def figures(self) -> tuple[float, float, float, float, float]:
        """CPU µs: base median, neighbour median, difference, base IQR; and the wall difference."""
        base, plus = statistics.median(self.base_cpu) / 1000, statistics.median(self.plus_cpu) / 1000
        quartiles = statistics.quantiles(self.base_cpu, n=4)
        wall = (statistics.median(self.plus_wall) - statistics.median(self.base_wall)) / 1000
        return base, plus, plus - base, (quartiles[2] - quartiles[0]) / 1000, wall


async def _plans(policy_path: Path, constructs: Sequence[Construct]) -> list[tuple[AggregateQuery, AggregateQuery] | str]:
    """Per construct: the (base, neighbour) plans with one partition seed, or why it is refused."""
    policy = load_policy(policy_path)
    backend = await connect(policy)
    out: list[tuple[AggregateQuery, AggregateQuery] | str] = []
    try:
        registry = await build_registry(backend, policy)
        for construct in constructs:
            plans = []
            for table in ("rc_base", "rc_plus"):
                statement = split_statements(construct.sql.format(table=table))[0]
                try:
                    decision = classify(statement, await backend.resolve(statement.references.relations), registry)
                except Exception as refusal:  # a Refusal: reported as the construct's answer
                    out.append(f"refused: {refusal}")
                    break
                if not isinstance(decision, DPQuery):
                    out.append(f"not a DP query: {type(decision).__name__}")
                    break
                plans.append(decision.plan)
            else:
                out.append((plans[0], plans[1]))
    finally:
        await backend.close()
    return out


def _replay(plan: AggregateQuery, conn: psycopg.Connection[Any], seed: int) -> tuple[Callable[[], object], int]:
    """The release path of ``plan`` over the backend's result (run once here), and its row count."""
    result = conn.pgconn.exec_(backend_sql(plan, seed=seed).encode())
    if result.error_message:
        raise RuntimeError(result.error_message.decode())
    unread = UnreadRows(result)
    if plan.groups:
        return (lambda: _cells_released(plan, unread, EPSILON, "utf-8")), result.ntuples
    row, types = text_rows(result)[0], unread.type_oids
    return (lambda: _row_released(plan, row, types, EPSILON, "utf-8")), result.ntuples


def _alternate(base: Callable[[], object], plus: Callable[[], object], repeats: int, name: str,
               rows: tuple[int, int] = (0, 0)) -> Timed:
    """Both runs ``repeats`` times each, alternating, after a warm-up of each."""
    times: dict[str, list[int]] = {"base_cpu": [], "plus_cpu": [], "base_wall": [], "plus_wall": []}
    base()
    plus()
    for _ in range(repeats):
        for which, run in (("base", base), ("plus", plus)):
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            run()
            times[f"{which}_cpu"].append(time.thread_time_ns() - cpu)
            times[f"{which}_wall"].append(time.perf_counter_ns() - wall)
    return Timed(name, None, tuple(times["base_cpu"]), tuple(times["plus_cpu"]), tuple(times["base_wall"]),
                 tuple(times["plus_wall"]), rows)


def measure(dsn: str, policy_path: Path, constructs: Sequence[Construct], rows: int, repeats: int) -> Iterator[Timed]:
    """Each construct measured as the module docstring says, in the order given."""
    plans = asyncio.run(_plans(policy_path, constructs))
    for construct, plan in zip(constructs, plans):
        if isinstance(plan, str):
            yield Timed(construct.name, refused=plan)
            continue
        _set_row(dsn, construct, rows)
        seed = partition_seed()
        with psycopg.connect(dsn, autocommit=True) as conn:
            base, base_rows = _replay(plan[0], conn, seed)
            plus, plus_rows = _replay(plan[1], conn, seed)
        yield _alternate(base, plus, repeats, construct.name, (base_rows, plus_rows))


def measure_mechanisms(repeats: int) -> Iterator[Timed]:
    """The ``mechanism:`` constructs: the exponential mechanism on neighbouring counts; each
    sample-and-aggregate release called directly on the two partition vectors, then its search for
    S* alone (the release's Laplace draw varies by more than the search)."""
    for name, base_release, plus_release in SELECTION_CONSTRUCTS:
        yield _alternate(base_release, plus_release, repeats, name)
    beta = smoothing_beta(EPSILON, 1e-6)
    for name, base, plus in MECHANISM_CONSTRUCTS:
        yield _alternate(partial(release_sample_and_aggregate, base, 0.0, 100.0, EPSILON, 1e-6),
                         partial(release_sample_and_aggregate, plus, 0.0, 100.0, EPSILON, 1e-6), repeats, name)
        sorted_base, sorted_plus = (prepare_partition_values(values, 0.0, 100.0) for values in (base, plus))
        yield _alternate(partial(smooth_sensitivity_median, sorted_base, 0.0, 100.0, beta),
                         partial(smooth_sensitivity_median, sorted_plus, 0.0, 100.0, beta), repeats, f"{name}: S* search alone")


def report(results: Sequence[Timed], rows: int, repeats: int, seconds: float) -> str:
    """The Markdown table of ``results``."""
    lines = [
        f"Base table: {rows:,} rows; neighbour: the same and one adversarial row. dpproxy's release path over the "
        f"backend's recorded result (reading it, the mechanisms, the answer's text), CPU time of the thread, median of "
        f"{repeats} runs each, alternating, after one warm-up; jitter is the base's interquartile range. "
        f"{seconds:.0f} s in all.",
        "",
        "| construct | backend rows read | base CPU µs | neighbour CPU µs | one row adds (µs) | jitter (µs) | wall difference (µs) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for item in results:
        if item.refused is not None:
            lines.append(f"| {item.name} | {item.refused} | | | | | |")
            continue
        base, plus, extra, jitter, wall = item.figures()
        read = f"{item.rows[0]} / {item.rows[1]}" if item.rows != (0, 0) else "–"
        lines.append(f"| {item.name} | {read} | {base:.1f} | {plus:.1f} | {extra:+.1f} | {jitter:.1f} | {wall:+.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--only", action="append", default=[], help="constructs whose name contains this")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--dsn", help="a superuser DSN (default: start Debian's PostgreSQL 15)")
    args = parser.parse_args(argv)
    chosen = [c for c in CONSTRUCTS if not args.only or any(word in c.name for word in args.only)]
    started = time.monotonic()

    def run(dsn: str) -> list[Timed]:
        load_tables(dsn, args.rows)
        results = []
        with tempfile.TemporaryDirectory(prefix="dpproxy-proxy-cost-") as directory:
            policy_path = policy_file(dsn, Path(directory))
            for item in measure(dsn, policy_path, chosen, args.rows, args.repeats):
                print(report([item], args.rows, args.repeats, 0).splitlines()[-1], flush=True)
                results.append(item)
        if not args.only or any("mechanism" in word for word in args.only):
            for item in measure_mechanisms(args.repeats):
                print(report([item], args.rows, args.repeats, 0).splitlines()[-1], flush=True)
                results.append(item)
        return results

    results = on_server(args.dsn, 15, "proxy-cost", run)
    return print_report(report(results, args.rows, args.repeats, time.monotonic() - started), args.out)


if __name__ == "__main__":
    sys.exit(main())
