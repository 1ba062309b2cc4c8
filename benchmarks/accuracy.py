"""Measure how far dpproxy's AVG, MIN, MAX, percentile and variance answers fall from the exact values.

Runs a real dpproxy in front of an embedded PostgreSQL (pgserver) holding the demo ``adult``
table, with the demo policy (bounds, δ, partitions m) at ε = 0.1, 1 and 10, once with
``avg: sample_aggregate`` and once with ``avg: sum_count``. Each query has one aggregate
column, so that column gets the whole ε. Every query is sent ``--runs`` times (repeat
answers disabled) and the median absolute error against the exact value, computed directly
on PostgreSQL, goes into a Markdown table. Percentiles are measured too, and again at ε = 1
under several ``quantile_cells``, with the CPU time one release takes in dpproxy.

    python benchmarks/accuracy.py                 # writes docs/accuracy.md (a few minutes)
    python benchmarks/accuracy.py --runs 50 --output -   # quick look, to stdout

``--admin-dsn`` uses an existing PostgreSQL (a superuser libpq URI) instead of pgserver.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fractions import Fraction  # noqa: E402

from mechanisms.quantile import QuantileGrid, quantile_error95, release_quantile  # noqa: E402
from mechanisms.smooth_median import recommended_partitions  # noqa: E402
from policies.loader import parse_policy  # noqa: E402
from policies.model import MAX_BUDGET_EPSILON, BudgetConfig, Policy, RepeatConfig  # noqa: E402
from proxy.demo.data import ADULT_ROWS  # noqa: E402
from proxy.demo.embedded import DEMO_POLICY, EmbeddedPostgres, prepare_demo_database  # noqa: E402
from proxy.serving.server import Server  # noqa: E402

EPSILONS = (0.1, 1.0, 10.0)
TABLE = "public.adult"
COLUMNS = ("age", "hours_per_week")
VARIANCES = ("VAR_POP", "STDDEV")


@dataclass(frozen=True)
class Case:
    """One row of the table: an aggregate query answered by one AVG method."""

    aggregate: str  # AVG, MIN, MAX, PERCENTILE_CONT, VAR_POP, STDDEV
    column: str
    avg_method: str  # the table's `avg` option the proxy runs with
    fraction: str | None = None  # a percentile's p
    cells: int = 1000  # the table's quantile_cells for a percentile

    @property
    def sql(self) -> str:
        if self.fraction is not None:
            return f"SELECT percentile_cont({self.fraction}) WITHIN GROUP (ORDER BY {self.column}) FROM adult"
        return f"SELECT {self.aggregate}({self.column}) FROM adult"

    @property
    def label(self) -> str:
        if self.fraction is not None:
            return f"percentile_cont({self.fraction}) of {self.column}"
        return f"{self.aggregate}({self.column})"

    @property
    def method(self) -> str:
        if self.fraction is not None:
            return "exponential mechanism over the grid"
        if self.aggregate in VARIANCES:
            return "noisy count, centred sum and sum of squares"
        if self.aggregate == "AVG" and self.avg_method == "sum_count":
            return "noisy SUM / noisy COUNT (default)"
        if self.aggregate == "AVG":
            return "sample and aggregate (`avg: sample_aggregate`)"
        return "sample and aggregate"


CASES = tuple(
    [Case("AVG", c, m) for c in COLUMNS for m in ("sample_aggregate", "sum_count")]
    + [Case(agg, c, "sample_aggregate") for agg in ("MIN", "MAX") for c in COLUMNS]
    + [Case("PERCENTILE_CONT", c, "sum_count", p) for c, p in (("age", "0.5"), ("age", "0.9"),
                                                               ("hours_per_week", "0.5"), ("fnlwgt", "0.5"))]
    + [Case(agg, c, "sum_count") for agg in ("VAR_POP", "STDDEV") for c in COLUMNS]
)
# A wide column (fnlwgt, bounds [0, 1500000]: cells of 1,500 at the default 1000) and a skewed
# one (capital_gain, [0, 100000]) under several quantile_cells, at ε = 1.
GRID_CELLS = (100, 1000, 10000)
GRID_CASES = tuple(Case("PERCENTILE_CONT", c, "sum_count", p, k)
                   for c, p in (("fnlwgt", "0.5"), ("capital_gain", "0.95")) for k in GRID_CELLS)
GRID_BOUNDS = {"fnlwgt": (0, 1500000), "capital_gain": (0, 100000)}


def benchmark_policy(service_dsn: str, ledger: Path, epsilon: float, avg_method: str, cells: int = 1000) -> Policy:
    """The demo policy with this ε, AVG method and quantile_cells, the largest budget and no repeat cache."""
    demo = parse_policy(DEMO_POLICY.format(dsn=service_dsn, port=0, ledger=ledger), "demo-policy")
    table = demo.tables[TABLE].model_copy(update={"epsilon": epsilon, "avg": avg_method, "quantile_cells": cells})
    analyst = demo.users["analyst"].model_copy(update={"budget": BudgetConfig(epsilon=MAX_BUDGET_EPSILON, delta=0.9)})
    return demo.model_copy(
        update={"tables": {TABLE: table}, "users": {"analyst": analyst}, "repeats": RepeatConfig(enabled=False)}
    )


async def run_cases(policy: Policy, cases: list[Case], runs: int, concurrency: int) -> dict[Case, list[float]]:
    """Answers to each case through a real dpproxy serving ``policy``."""
    server = await Server.create(policy)
    host, port = await server.start("127.0.0.1", 0)
    dsn = f"host={host} port={port} dbname={server.database} user=analyst password=analyst"
    try:
        answers: dict[Case, list[float]] = {}
        for case in cases:
            per_worker = [runs // concurrency + (i < runs % concurrency) for i in range(concurrency)]
            batches = await asyncio.gather(*(_ask(dsn, case.sql, n) for n in per_worker))
            answers[case] = [a for batch in batches for a in batch]
        return answers
    finally:
        await server.close()


async def _ask(dsn: str, sql: str, n: int) -> list[float]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        answers = []
        for _ in range(n):
            cur = await conn.execute(sql)
            row = await cur.fetchone()
            assert row is not None
            answers.append(float(row[0]))
        return answers


def exact_values(admin_dsn: str) -> dict[Case, float]:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        return {case: float(conn.execute(case.sql).fetchone()[0]) for case in CASES + GRID_CASES}  # type: ignore[index]


def release_cpu_ms(case: Case, padded: bool, repeats: int = 20) -> float:
    """CPU milliseconds one release of ``case``'s percentile takes in dpproxy's mechanism (the
    draw over the grid, ``padded`` to the worst case's trials as on a table without
    ``answer_quantum_ms``, or not), on counts spread over the grid; process time, not wall clock."""
    lo, hi = GRID_BOUNDS[case.column]
    grid = QuantileGrid.for_bounds(lo, hi, True, case.cells)
    counts = [(i * 7919) % 50 for i in range(grid.count)]
    started = time.process_time()
    for _ in range(repeats):
        release_quantile(grid, counts, Fraction(case.fraction or "0.5"), 1.0, padded=padded)
    return (time.process_time() - started) / repeats * 1000


def render(exact: dict[Case, float], errors: dict[tuple[Case, float], list[float]], policy: Policy, runs: int) -> str:
    table = policy.tables[TABLE]
    lines = [
        "# Accuracy of AVG, MIN, MAX, percentiles and variances",
        "",
        "Generated by `python benchmarks/accuracy.py` (do not edit by hand). Each cell is the",
        f"median absolute error of {runs} answers through a real dpproxy, and in parentheses the",
        "90th percentile, against the exact value computed directly on PostgreSQL. Demo table",
        f"`adult` (48,842 rows), demo policy: m = {table.partitions} partitions, δ = {table.delta:g} per",
        "sample-and-aggregate column, bounds age [17, 90] and hours_per_week [1, 99]. One",
        "aggregate per query, so the column gets the whole ε; a query with k columns gives each",
        "ε/k, which for sample and aggregate is much worse than k times the error (see",
        "docs/mechanisms.md).",
        "",
        "| aggregate | exact | method | " + " | ".join(f"ε = {e:g}" for e in EPSILONS) + " |",
        "|---|---:|---|" + "---:|" * len(EPSILONS),
    ]
    for case in CASES:
        cells = []
        for epsilon in EPSILONS:
            errs = sorted(errors[(case, epsilon)])
            p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
            cells.append(f"{_fmt(statistics.median(errs))} ({_fmt(p90)})")
        lines.append(
            f"| {case.label} | {_fmt(exact[case])} | {case.method} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "Reading the table:",
        "",
        "* Sample and aggregate has a noise floor: the median's noise stays near the whole range",
        f"  until m ≥ 1 + 4·ln(2/δ)·ln(100)/ε ({recommended_partitions(0.1, table.delta)} at ε = 0.1). "
        f"With m = {table.partitions} at ε = 0.1",
        "  most answers are clamped to lo or hi, so the error is the distance from the exact value",
        "  to a bound, and a MIN or MAX whose exact value is a bound can score 0 by luck.",
        "* MIN and MAX estimate quantiles, not extremes: the median of the partition minima sits",
        f"  near the 0.69·m/n quantile (about {69 * table.partitions / ADULT_ROWS:.2g}% here) and that of "
        "the maxima near 1 − 0.69·m/n.",
        "  That bias does not shrink with ε; no DP mechanism releases an extreme value accurately.",
        "* AVG's default, `avg: sum_count` (noisy clamped SUM / noisy COUNT, ε/2 each, no δ), is far",
        "  more accurate over many rows: its error is about (hi − lo)/(ε·n). At ε = 1 the mean",
        f"  absolute error of AVG was {_mean_range(errors, 'sum_count', 1.0)} by noisy SUM / noisy COUNT and "
        f"{_mean_range(errors, 'sample_aggregate', 1.0)} by",
        "  sample and aggregate, which a table or column gets only with `avg: sample_aggregate`.",
        "* The rule for m: at least 30 rows per partition in what a typical filter matches (n/m ≥ 30).",
        "  On a 1,000-row table the default m = 512 leaves about 2 rows per partition and MIN, MAX",
        "  (and AVG set to `sample_aggregate`) are noise; `dpproxy check-config` and `serve` warn",
        "  from the backend's row estimate and say which `partitions` fits.",
        "* Percentiles (the exponential mechanism over a grid of the bounds) need no partitions and",
        "  no δ: age and hours_per_week have one candidate per integer, fnlwgt 1000 cells of 1,500.",
        "  Their error is a rank error, max(p, 1 − p)·(2/ε)·ln(20·K) rows at 95% (the notice's bound:",
        f"  {quantile_error95(1.0, 74, Fraction(1, 2)):.3g} rows for age's median at ε = 1), plus half a cell: "
        "tiny against 48,842 rows,",
        "  so the value error is the data's spacing near the percentile, or half a cell.",
        "* VAR_POP and STDDEV (a noisy count, centred sum and centred sum of squares, ε split",
        "  0.279 : 0.443 : 0.279, no δ) err by about (b_Q + 2|μ|·b_S + |σ² − μ²|·b_n)/n, of order",
        "  h²/(ε·n) with h = (hi − lo)/2 and μ the mean's offset from the bounds' midpoint",
        f"  (docs/mechanisms.md). At ε = 1 var_pop(age) was off by {_median(errors, 'VAR_POP', 'age', 1.0)} "
        f"of {_fmt(_exact_of(exact, 'VAR_POP', 'age'))} in the median,",
        f"  stddev(age) by {_median(errors, 'STDDEV', 'age', 1.0)} of {_fmt(_exact_of(exact, 'STDDEV', 'age'))} "
        "(a standard deviation's error is about the variance's over 2σ).",
        "",
        "## Percentiles and the grid",
        "",
        "`quantile_cells` (K) at ε = 1, the same runs: the median absolute error (90th percentile),",
        "the notice's 95% rank bound, and the CPU time of one release's draw in dpproxy, padded to the",
        "worst case's trials as on a table without `answer_quantum_ms` (unpadded, as on a table with one,",
        "in parentheses; process time on the machine that ran this, which was shared: a rough guide,",
        "linear in K; [threat-model.md](threat-model.md#what-is-not-protected) says why it is padded).",
        "The backend's work grows with K too (up to K groups of rows), which this does not time.",
        "",
        "| percentile | exact | K | cell width | error | rank bound (rows) | CPU per release |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for case in GRID_CASES:
        errs = sorted(errors[(case, 1.0)])
        p90 = errs[min(len(errs) - 1, int(0.9 * len(errs)))]
        lo, hi = GRID_BOUNDS[case.column]
        bound = quantile_error95(1.0, case.cells, Fraction(case.fraction or "0.5"))
        lines.append(f"| {case.label} | {_fmt(exact[case])} | {case.cells} | {_fmt((hi - lo) / case.cells)} | "
                     f"{_fmt(statistics.median(errs))} ({_fmt(p90)}) | {bound:.3g} | "
                     f"{release_cpu_ms(case, True):.2g} ms ({release_cpu_ms(case, False):.2g} ms) |")
    lines += [
        "",
        "A finer grid is more accurate until the cell width is below the data's own spread near the",
        "percentile; beyond that the rank bound, ln(20·K), and the work only grow. The default",
        "K = 1000 puts cells at 0.1% of the bounds.",
        "",
        f"Measured {time.strftime('%Y-%m-%d')}.",
        "",
    ]
    return "\n".join(lines)


def _mean_range(errors: dict[tuple[Case, float], list[float]], method: str, epsilon: float) -> str:
    """The mean absolute errors of the AVG cases answered by ``method`` at ``epsilon``, as "a–b"."""
    means = sorted(statistics.fmean(errors[(case, epsilon)]) for case in CASES
                   if case.aggregate == "AVG" and case.avg_method == method)
    return "–".join(dict.fromkeys(_fmt(m) for m in means))


def _median(errors: dict[tuple[Case, float], list[float]], aggregate: str, column: str, epsilon: float) -> str:
    """The median absolute error of ``aggregate(column)`` at ``epsilon``."""
    (case,) = [c for c in CASES if c.aggregate == aggregate and c.column == column]
    return _fmt(statistics.median(errors[(case, epsilon)]))


def _exact_of(exact: dict[Case, float], aggregate: str, column: str) -> float:
    (case,) = [c for c in CASES if c.aggregate == aggregate and c.column == column]
    return exact[case]


def _fmt(x: float) -> str:
    if float(x).is_integer():
        return str(int(x))
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}" if abs(x) < 1 else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="answers per query and ε (default 200)")
    parser.add_argument("--concurrency", type=int, default=4, help="client connections per query")
    parser.add_argument("--admin-dsn", help="superuser URI of an existing PostgreSQL (default: start pgserver)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "accuracy.md"), help="file to write, or - for stdout")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    workdir = Path(tempfile.mkdtemp(prefix="dpproxy-accuracy-"))
    postgres = None if args.admin_dsn else EmbeddedPostgres(workdir / "pgdata")
    try:
        admin = args.admin_dsn or postgres.uri("postgres")  # type: ignore[union-attr]
        service = prepare_demo_database(admin, "demo")
        exact = exact_values(urlparse(admin)._replace(path="/demo").geturl())
        errors: dict[tuple[Case, float], list[float]] = {}
        policy = None
        for epsilon in EPSILONS:
            for method in ("sample_aggregate", "sum_count"):
                cases = [c for c in CASES if c.avg_method == method]
                policy = benchmark_policy(service, workdir / "ledger.sqlite3", epsilon, method)
                started = time.monotonic()
                answers = asyncio.run(run_cases(policy, cases, args.runs, args.concurrency))
                for case, values in answers.items():
                    errors[(case, epsilon)] = [abs(v - exact[case]) for v in values]
                print(f"ε = {epsilon:g}, avg: {method}: {len(cases)} queries × {args.runs} in "
                      f"{time.monotonic() - started:.1f}s", file=sys.stderr)
        for cells in GRID_CELLS:
            policy = benchmark_policy(service, workdir / "ledger.sqlite3", 1.0, "sum_count", cells)
            grid_cases = [c for c in GRID_CASES if c.cells == cells]
            answers = asyncio.run(run_cases(policy, grid_cases, args.runs, args.concurrency))
            for case, values in answers.items():
                errors[(case, 1.0)] = [abs(v - exact[case]) for v in values]
        policy = benchmark_policy(service, workdir / "ledger.sqlite3", 1.0, "sum_count")
        assert policy is not None
        text = render(exact, errors, policy, args.runs)
    finally:
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.output == "-":
        print(text)
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
