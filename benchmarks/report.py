"""The benchmark's report: Markdown tables of ratios, latencies and memory, and the machine."""

from __future__ import annotations

import math
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .avg import AvgComparison
from .connections import ConnectionCost, Served
from .environment import VARIANTS
from .histogram import HistogramComparison
from .idle import IdleResult
from .large_result import LargeResult, query
from .latency import Latency, added_latency
from .pgbench import CATALOG_STATEMENTS, PgbenchResult
from .servers import commit_of
from .stats import median

__all__ = ["Results", "machine", "render"]

PROXY, DIRECT, UNIX, RELAY, BOUNCER = "dpproxy", "direct-tcp", "direct-unix", "relay", "pgbouncer"
_MB = 1024 * 1024


@dataclass
class Results:
    settings: dict[str, str]
    machine: dict[str, str]
    # (rows, clients, mode, endpoint) → one result per round
    pgbench: dict[tuple[int, int, str, str], list[PgbenchResult]] = field(default_factory=dict)
    # rows → query → endpoint → latency
    latency: dict[int, dict[str, dict[str, Latency]]] = field(default_factory=dict)
    avg: AvgComparison | None = None
    histogram: HistogramComparison | None = None
    idle: IdleResult | None = None
    idle_max_connections: int = 0
    # rows → query → {"smartnoise": …, "direct-tcp": …}, or why SmartNoise could not run it
    smartnoise: dict[int, dict[str, dict[str, Latency] | str]] = field(default_factory=dict)
    connection_cost: list[ConnectionCost] = field(default_factory=list)
    served: Served | None = None
    served_max_connections: int = 0
    # (0, clients, mode, endpoint) → one result per round of the catalog script
    catalog: dict[tuple[int, int, str, str], list[PgbenchResult]] = field(default_factory=dict)
    large: LargeResult | None = None
    pool_size: int | None = None
    dpproxy_source: str | None = None  # the tree dpproxy ran from, when not this one
    # endpoint → its name in the report, where that is not the endpoint's name (dpproxy-base's commit)
    labels: dict[str, str] = field(default_factory=dict)

    def label(self, endpoint: str) -> str:
        return self.labels.get(endpoint, endpoint)


def machine(server_version: str, pgbench: str) -> dict[str, str]:
    """What the figures were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = subprocess.run([pgbench, "--version"], capture_output=True, text=True).stdout.strip()
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "CPU": f"{os.cpu_count()} × {model or platform.processor() or 'unknown'} (nproc {len(os.sched_getaffinity(0))})",
        "RAM": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "OS": f"{platform.system()} {platform.release()}",
        "PostgreSQL": f"{server_version} (pgserver's build, default settings but listen/port/max_connections)",
        "pgbench": version,
        "Python": platform.python_version(),
        "dpproxy commit": commit_of(Path(__file__).resolve().parent.parent),
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        # Other tenants of a shared machine do not show in our process list, but in this.
        "CPU busy before the run (all processes)": f"{psutil.cpu_percent(interval=2):.0f}%",
    }


def render(results: Results) -> str:
    out = ["# dpproxy benchmark", ""]
    out += [f"- **{key}**: {value}" for key, value in results.machine.items()]
    out += [f"- **{key}**: {value}" for key, value in results.settings.items()]
    out += [""]
    for section in (_targets, _pgbench, _catalog, _latency, _smartnoise, _avg, _histogram, _idle, _connections,
                    _large):
        lines = section(results)
        if lines:
            out += lines + [""]
    return "\n".join(out)


# ------------------------------------------------------------------ sections


def _pgbench_median(
    results: Results, rows: int, clients: int, mode: str, endpoint: str,
    runs_by_key: dict[tuple[int, int, str, str], list[PgbenchResult]] | None = None,
) -> PgbenchResult | None:
    source = results.pgbench if runs_by_key is None else runs_by_key
    runs = [r for r in source.get((rows, clients, mode, endpoint), []) if r.error is None]
    if not runs:
        return None
    return PgbenchResult(
        median([r.tps for r in runs]), median([r.p50_ms for r in runs]), median([r.p99_ms for r in runs]),
        sum(r.transactions for r in runs), sum(r.failed for r in runs),
    )


def _ratio(
    results: Results, rows: int, clients: int, mode: str, endpoint: str = PROXY, baseline: str = DIRECT,
    runs_by_key: dict[tuple[int, int, str, str], list[PgbenchResult]] | None = None,
) -> float:
    proxied = _pgbench_median(results, rows, clients, mode, endpoint, runs_by_key)
    direct = _pgbench_median(results, rows, clients, mode, baseline, runs_by_key)
    if proxied is None or direct is None or direct.tps == 0:
        return math.nan
    return proxied.tps / direct.tps


def _extra_cells(
    results: Results, runs_by_key: dict[tuple[int, int, str, str], list[PgbenchResult]],
    rows: int, clients: int, mode: str, extra: list[str],
) -> str:
    """One ``tps (ratio to direct-tcp)`` cell per endpoint of ``extra``, ``not run`` where it was not."""
    cells = ""
    for name in extra:
        if (rows, clients, mode, name) not in runs_by_key:
            cells += " not run |"
            continue
        other = _pgbench_median(results, rows, clients, mode, name, runs_by_key)
        cells += f" {_tps(other)} ({_num(_ratio(results, rows, clients, mode, name, DIRECT, runs_by_key))}) |"
    return cells


def _extra_endpoints(runs_by_key: dict[tuple[int, int, str, str], list[PgbenchResult]]) -> list[str]:
    """The endpoints besides dpproxy and direct-tcp that ran, in the report's column order."""
    return [name for name in (*VARIANTS, BOUNCER, RELAY, UNIX) if any(key[3] == name for key in runs_by_key)]


def _pgbench(results: Results) -> list[str]:
    if not results.pgbench:
        return []
    configs = sorted({key[:3] for key in results.pgbench}, key=lambda k: (k[0], k[1], k[2] != "simple"))
    extra = _extra_endpoints(results.pgbench)
    lines = [
        "## pgbench: throughput ratio dpproxy / direct PostgreSQL",
        "",
        "Script per transaction: a COUNT with a two-column WHERE and a SUM with a WHERE (see",
        "benchmarks/pgbench.py). tps, p50 and p99 are medians over rounds; latency is per",
        "transaction (2 statements), its percentiles over all transactions of a round.",
        "Ratio = dpproxy tps / direct tps, both over TCP 127.0.0.1 (dpproxy reaches PostgreSQL",
        "over its unix socket). " + _EXTRA_NOTE if extra else "over its unix socket).",
        "",
        "| rows | clients | mode | dpproxy tps | direct tps | **ratio** | dpproxy p50 / p99 ms | direct p50 / p99 ms |"
        + "".join(f" {results.label(name)} tps (ratio) |" for name in extra),
        "|---:|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(extra),
    ]
    for rows, clients, mode in configs:
        proxied = _pgbench_median(results, rows, clients, mode, PROXY)
        direct = _pgbench_median(results, rows, clients, mode, DIRECT)
        row = (f"| {rows:,} | {clients} | {mode} | {_tps(proxied)} | {_tps(direct)} | "
               f"**{_num(_ratio(results, rows, clients, mode))}** | {_p50_p99(proxied)} | {_p50_p99(direct)} |")
        lines.append(row + _extra_cells(results, results.pgbench, rows, clients, mode, extra))
    errors = sorted({f"{key}: {r.error}" for key, runs in results.pgbench.items() for r in runs if r.error})
    failed = sum(r.failed for runs in results.pgbench.values() for r in runs)
    if errors or failed:
        lines += ["", f"Failed transactions: {failed}. Errors:", ""] + [f"- {e}" for e in errors]
    return lines


def _catalog(results: Results) -> list[str]:
    if not results.catalog:
        return []
    configs = sorted({key[1:3] for key in results.catalog}, key=lambda k: (k[0], k[1] != "simple"))
    extra = _extra_endpoints(results.catalog)
    lines = [
        "## Catalog statements: throughput ratio dpproxy / direct PostgreSQL",
        "",
        f"Script per transaction: {CATALOG_STATEMENTS} catalog and session statements Superset and psql send",
        "(benchmarks/pgbench.py, `CATALOG_SCRIPT`), all passed through to PostgreSQL. tps, p50 and",
        "p99 are medians over rounds. Goal (issue 21): ratio ≥ 0.8 at 8 clients."
        + (" In parentheses, each other dpproxy's tps / direct-tcp tps." if extra else ""),
        "",
        "| clients | mode | dpproxy tps | direct tps | **ratio** | dpproxy p50 / p99 ms | direct p50 / p99 ms |"
        + "".join(f" {results.label(name)} tps (ratio) |" for name in extra),
        "|---:|---|---:|---:|---:|---:|---:|" + "---:|" * len(extra),
    ]
    for clients, mode in configs:
        proxied = _pgbench_median(results, 0, clients, mode, PROXY, results.catalog)
        direct = _pgbench_median(results, 0, clients, mode, DIRECT, results.catalog)
        ratio = _ratio(results, 0, clients, mode, runs_by_key=results.catalog)
        lines.append(f"| {clients} | {mode} | {_tps(proxied)} | {_tps(direct)} | **{_num(ratio)}** | "
                     f"{_p50_p99(proxied)} | {_p50_p99(direct)} |"
                     + _extra_cells(results, results.catalog, 0, clients, mode, extra))
    errors = sorted({f"{key}: {r.error}" for key, runs in results.catalog.items() for r in runs if r.error})
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors]
    return lines


_EXTRA_NOTE = (
    "In parentheses, each extra endpoint's tps / direct-tcp tps: dpproxy-base is dpproxy run from "
    "another source tree (`--baseline-source`, its commit in the heading); dpproxy-2w is this "
    "dpproxy with `listen.workers: 2`; relay is a do-nothing asyncio "
    "byte relay (benchmarks/relay.py), the floor of an asyncio proxy's cost; pgbouncer is "
    "pgbouncer in transaction mode (the same service role and unix socket); direct-unix is "
    "PostgreSQL over its unix socket."
)


def _latency(results: Results) -> list[str]:
    if not results.latency:
        return []
    lines = [
        "## Per-query latency, one client (simple protocol, TCP), dpproxy vs direct",
        "",
        "Added = dpproxy's percentile − PostgreSQL's. Queries in benchmarks/latency.py; AVG, MIN",
        "and MAX are answered by sample and aggregate, whose backend SQL differs from the",
        "exact query, so their added time includes extra work inside PostgreSQL; \"AVG, sum_count\"",
        "is AVG by the policy default, a noisy sum over a noisy count (one clamped SUM and COUNT). Other dpproxy",
        "targets of the run (a baseline, two workers) have rows of their own, timed in the same",
        "rotation of probes.",
        "",
        "| rows | query | dpproxy p50 / p99 ms | direct p50 / p99 ms | **added p50** ms | added p99 ms |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for rows, queries in sorted(results.latency.items()):
        for name, by_endpoint in queries.items():
            direct = by_endpoint[DIRECT]
            for endpoint, proxied in by_endpoint.items():
                if endpoint == DIRECT:
                    continue
                added = added_latency(proxied, direct)
                query = name if endpoint == PROXY else f"{name}, {results.label(endpoint)}"
                lines.append(
                    f"| {rows:,} | {query} | {_ms(proxied.p50_ms)} / {_ms(proxied.p99_ms)} | "
                    f"{_ms(direct.p50_ms)} / {_ms(direct.p99_ms)} | **{_ms(added.p50_ms)}** | {_ms(added.p99_ms)} |"
                )
    return lines


def _smartnoise(results: Results) -> list[str]:
    if not results.smartnoise:
        return []
    lines = [
        "## SmartNoise SQL on the same queries, one client, vs direct",
        "",
        "SmartNoise SQL (benchmarks/smartnoise.py) in its own venv, given the policy's bounds, ε and δ,",
        "reading PostgreSQL over TCP with psycopg2; its added p50 next to dpproxy's from the table above.",
        "",
        "| rows | query | SmartNoise p50 / p99 ms | direct p50 ms | **SmartNoise added p50** ms "
        "| dpproxy added p50 ms | SmartNoise / dpproxy, added p50 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for rows, queries in sorted(results.smartnoise.items()):
        for name, measured in queries.items():
            if isinstance(measured, str):
                lines.append(f"| {rows:,} | {name} | not supported: {measured.splitlines()[0][:120]} | | | | |")
                continue
            smartnoise, direct = measured["smartnoise"], measured[DIRECT]
            added = added_latency(smartnoise, direct).p50_ms
            ours = results.latency.get(rows, {}).get(name)
            ours_added = added_latency(ours[PROXY], ours[DIRECT]).p50_ms if ours else math.nan
            times = added / ours_added if ours_added > 0 else math.nan
            lines.append(
                f"| {rows:,} | {name} | {_ms(smartnoise.p50_ms)} / {_ms(smartnoise.p99_ms)} | {_ms(direct.p50_ms)} | "
                f"**{_ms(added)}** | {_ms(ours_added)} | {'–' if math.isnan(times) else f'{times:,.0f}×'} |"
            )
    return lines


def _avg(results: Results) -> list[str]:
    avg = results.avg
    if avg is None:
        return []
    names = list(avg.direct)
    head = " | ".join(f"{name} p50 ms | p99 ms | p50 / direct" for name in names)

    def row(label: str, latencies: dict[str, Latency], bold: bool = False) -> str:
        cells = []
        for name in names:
            ratio = _num(latencies[name].p50_ms / avg.direct[name].p50_ms)
            cells.append(f"{_ms(latencies[name].p50_ms)} | {_ms(latencies[name].p99_ms)} | {f'**{ratio}**' if bold else ratio}")
        return f"| {label} | {' | '.join(cells)} |"

    hashed = ", ".join(avg.hashed_columns) or "none"
    lines = [
        f"## AVG, MIN and MAX by sample and aggregate vs the direct aggregate on {avg.rows:,} rows",
        "",
        "Queries in benchmarks/avg.py; each probe on its own connection, all interleaved. The backend",
        "SQL dpproxy writes is run directly under each partitioning; `row_hash` hashes every",
        f"hashable column of this key-less table ({len(avg.hashed_columns)}: {hashed}); the one-column",
        "variant costs what the default (`auto`) gives a table with a one-column integer primary key.",
        "",
        f"| | {head} |",
        "|---|" + "---:|---:|---:|" * len(names),
        row("direct aggregate", avg.direct),
    ]
    for label in next(iter(avg.rewritten.values())):
        shown = "`row_hash` over one integer column" if label.startswith("row_hash,") else f"`{label}`"
        lines.append(row(f"backend SQL, {shown}, run directly", {name: avg.rewritten[name][label] for name in names}))
    lines += [
        row(f"DP query through dpproxy (`{avg.dpproxy_partitioning}`, the policy's default here)", avg.dpproxy, bold=True),
        "",
        "Backend SQL of the AVG (`row_hash`):",
        "",
        "```sql",
        avg.backend_sql["row_hash"],
        "```",
    ]
    return lines


def _histogram(results: Results) -> list[str]:
    hist = results.histogram
    if hist is None:
        return []
    return [
        f"## A {hist.cells:,}-cell DP histogram vs the plain GROUP BY on {hist.rows:,} rows",
        "",
        "| | p50 ms | p99 ms | p50 / plain GROUP BY | sequential scans per query |",
        "|---|---:|---:|---:|---:|",
        f"| plain `GROUP BY width_bucket(...)`, direct | {_ms(hist.direct.p50_ms)} | {_ms(hist.direct.p99_ms)} | 1 | "
        f"{hist.seq_scans_direct} |",
        f"| dpproxy's backend SQL, run directly | {_ms(hist.rewritten.p50_ms)} | {_ms(hist.rewritten.p99_ms)} | "
        f"**{_num(hist.rewritten.p50_ms / hist.direct.p50_ms)}** | |",
        f"| DP histogram through dpproxy | {_ms(hist.dpproxy.p50_ms)} | {_ms(hist.dpproxy.p99_ms)} | "
        f"{_num(hist.dpproxy.p50_ms / hist.direct.p50_ms)} | {hist.seq_scans_dpproxy} |",
        "",
        "Scans counted from `pg_stat_user_tables.seq_scan` (one per parallel participant). Backend SQL:",
        "",
        "```sql",
        hist.backend_sql,
        "```",
    ]


def _idle(results: Results) -> list[str]:
    idle = results.idle
    if idle is None:
        return []
    lines = [
        "## Idle client connections",
        "",
        f"Clients log in (SCRAM) and stay idle. PostgreSQL max_connections = {results.idle_max_connections}.",
        f"dpproxy RSS before the first client: {idle.baseline_rss / _MB:.1f} MB; "
        f"after all clients closed: {idle.rss_after_close / _MB:.1f} MB.",
        "",
        "| clients attempted | open | dpproxy RSS MB | per open client KB | backend sessions | backends' USS MB |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for step in idle.steps:
        per = (step.proxy_rss - idle.baseline_rss) / step.open / 1024 if step.open else math.nan
        lines.append(
            f"| {step.attempted:,} | {step.open:,} | {step.proxy_rss / _MB:.1f} | {_num(per, 1)} | "
            f"{step.backends:,} | {step.backend_uss / _MB:.0f} |"
        )
    if idle.errors:
        lines += ["", "Clients refused:", ""] + [f"- {n} × `{text}`" for text, n in idle.errors.most_common()]
    return lines


def _connections(results: Results) -> list[str]:
    if not results.connection_cost and results.served is None:
        return []
    lines = ["## Client connections", ""]
    if results.connection_cost:
        lines += [
            "A client connects (dpproxy: SCRAM), runs `SELECT 1` and closes, one after another on each of 1 or 8",
            "threads; p50 (p99) of the whole cycle in ms, endpoints alternating by round. direct-tcp trusts its",
            "user; direct-scram is PostgreSQL with the same SCRAM-SHA-256 handshake dpproxy asks for.",
            "",
            "| at once | endpoint | cycles | p50 ms | p99 ms | ratio p50 to direct-tcp | to direct-scram | errors |",
            "|---:|---|---:|---:|---:|---:|---:|---:|",
        ]

        def p50s(name: str) -> dict[int, float]:
            return {c.concurrency: c.p50_ms for c in results.connection_cost if c.endpoint == name}

        direct, scram = p50s(DIRECT), p50s("direct-scram")
        for cost in results.connection_cost:
            ratios = [_num(cost.p50_ms / base[cost.concurrency]) if base.get(cost.concurrency) else "—"
                      for base in (direct, scram)]
            lines.append(f"| {cost.concurrency} | {results.label(cost.endpoint)} | {cost.cycles:,} | {_num(cost.p50_ms)} | "
                         f"{_num(cost.p99_ms)} | {' | '.join(ratios)} | {cost.errors} |")
        lines.append("")
    served = results.served
    if served is not None:
        pool = f"backend.pool.size {results.pool_size}" if results.pool_size else "the policy's default pool"
        if results.dpproxy_source:
            pool = f"dpproxy run from {results.dpproxy_source}"
        lines += [
            f"{served.clients} clients connect to dpproxy at once, each runs one DP COUNT and stays open until all",
            f"have tried; PostgreSQL max_connections = {results.served_max_connections}, {pool}: "
            f"**{served.answered} of {served.clients} answered** in {served.seconds:.1f} s.",
        ]
        if served.errors:
            lines += ["", "Clients not answered:", ""] + [f"- {n} × `{text}`" for text, n in served.errors.most_common()]
    return lines


def _large(results: Results) -> list[str]:
    large = results.large
    if large is None:
        return []
    proxied, direct = large.endpoint_names
    shown_sql = query(large.rows).replace("x" * 100, "x…x")
    lines = [
        f"## A large passthrough result: {large.rows:,} rows through dpproxy vs direct",
        "",
        f"`{shown_sql}` (a 100-character literal; no table, so dpproxy forwards it unchanged):",
        f"{large.wire_bytes / _MB:,.1f} MB of DataRows on the wire. A libpq client (psycopg's `pgconn`, chunked rows",
        "mode, 1,024 rows a chunk) reads every row and discards it, endpoints alternating by round; seconds from",
        "sending to the end of the result. dpproxy's RSS before its reads and its peak during them",
        f"({large.peak_method}); before results were streamed, dpproxy held one whole and its peak grew with it.",
        "Then a slow client: it reads nothing for the pause, then everything. Since results are streamed, a client",
        "that stops reading has at most 64 MB of its result held by dpproxy (past a second), and gets 54000 after",
        "those rows when the rest is more.",
        "",
        "| endpoint | rows read per round | p50 s | min / max s | p50 / direct |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in (proxied, direct):
        reads = large.reads[name]
        seconds = [r.seconds for r in reads]
        got = sorted({r.rows for r in reads})
        ratio = large.p50(name) / large.p50(direct)
        lines.append(f"| {results.label(name)} | {', '.join(f'{n:,}' for n in got)} | {_s(large.p50(name))} | "
                     f"{_s(min(seconds))} / {_s(max(seconds))} | {f'**{_num(ratio)}**' if name == proxied else '1'} |")
    lines += [
        "",
        "| dpproxy RSS MB: before the reads | peak during them | after | result on the wire MB |",
        "|---:|---:|---:|---:|",
        f"| {large.rss_before / _MB:,.0f} | **{large.peak_rss / _MB:,.0f}** | {large.rss_after / _MB:,.0f} | "
        f"{large.wire_bytes / _MB:,.0f} |",
    ]
    if large.incomplete():
        lines += ["", "Reads that did not end with every row and the command tag:", ""]
        lines += [f"- {text}" for text in large.incomplete()]
    slow = large.slow
    if slow is not None:
        lines += [
            "",
            "| slow client: pause s | dpproxy RSS MB before | peak during the pause | peak to the end | rows the client "
            "got | SQLSTATE | s to read after the pause |",
            "|---:|---:|---:|---:|---:|---|---:|",
            f"| {slow.pause_s:g} | {slow.rss_before / _MB:,.0f} | **{slow.peak_during_pause / _MB:,.0f}** | "
            f"{slow.peak_while_reading / _MB:,.0f} | {slow.read.rows:,} of {large.rows:,} | "
            f"{slow.read.sqlstate or 'none'} | {_s(slow.read.seconds)} |",
        ]
    return lines


def _targets(results: Results) -> list[str]:
    """Issue 7's goals next to the measured figures (reported, never asserted)."""
    rows_present = {key[0] for key in results.pgbench}
    goals: list[tuple[str, str, float, bool]] = []
    for rows, clients, floor in ((1_000_000, 8, 0.95), (48_842, 8, 0.85), (1_000, 8, 0.5), (1_000, 1, 0.7)):
        if rows in rows_present:
            for mode in ("simple", "extended"):
                ratio = _ratio(results, rows, clients, mode)
                if not math.isnan(ratio):
                    goals.append((f"throughput ratio, {rows:,} rows, {clients} clients, -M {mode}", f"≥ {floor}",
                                  ratio, ratio >= floor))
    for rows, queries in sorted(results.latency.items()):
        worst = max(queries, key=lambda q: added_latency(queries[q][PROXY], queries[q][DIRECT]).p50_ms)
        added = added_latency(queries[worst][PROXY], queries[worst][DIRECT]).p50_ms
        goals.append((f"added p50 latency, worst query ({worst}), {rows:,} rows", "≤ 0.5 ms", added, added <= 0.5))
    if results.avg is not None:
        for name in results.avg.direct:
            ratio = results.avg.dpproxy[name].p50_ms / results.avg.direct[name].p50_ms
            goals.append((f"S&A {name} / direct {name}, p50, {results.avg.rows:,} rows", "≤ 1.3", ratio, ratio <= 1.3))
    if results.histogram is not None:
        hist = results.histogram
        ratio = hist.rewritten.p50_ms / hist.direct.p50_ms
        goals.append((f"{hist.cells:,}-cell histogram's backend SQL / plain GROUP BY, p50, {hist.rows:,} rows",
                      "≤ 1.1 (issue 19)", ratio, ratio <= 1.1 and hist.seq_scans_dpproxy == hist.seq_scans_direct))
    if results.idle is not None and results.idle.steps:
        last = results.idle.steps[-1]
        goals.append((f"dpproxy RSS with {last.open:,} idle clients open (of {last.attempted:,})", "< 200 MB",
                      last.proxy_rss / _MB, last.proxy_rss < 200 * _MB and last.open == last.attempted))
    if not goals:
        return []
    lines = ["## Summary against the goals (issue 7; the histogram: issue 19)", "", "| measure | goal | measured | met |", "|---|---|---:|:---:|"]
    lines += [f"| {name} | {goal} | {_num(value)} | {'yes' if met else '**no**'} |" for name, goal, value, met in goals]
    return lines


# ------------------------------------------------------------------ formatting


def _num(value: float, digits: int = 2) -> str:
    return "–" if math.isnan(value) else f"{value:,.{digits}f}"


def _ms(value: float) -> str:
    return "–" if math.isnan(value) else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")


def _s(value: float) -> str:
    return "–" if math.isnan(value) else (f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}")


def _tps(result: PgbenchResult | None) -> str:
    return "failed" if result is None else f"{result.tps:,.0f}"


def _p50_p99(result: PgbenchResult | None) -> str:
    return "–" if result is None else f"{_ms(result.p50_ms)} / {_ms(result.p99_ms)}"
