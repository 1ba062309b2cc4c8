"""dpproxy against PostgreSQL, measured in one run: throughput, latency, AVG, idle memory.

    python -m benchmarks.run                  # full run (~25 minutes), report on stdout
    python -m benchmarks.run --out benchmarks/results.md
    python -m benchmarks.run --quick          # ~20 seconds on a 1,000-row table (CI smoke run)

Starts PostgreSQL (pgserver's binaries, on TCP and a unix socket), loads Adult-shaped tables
of ``--rows`` sizes, starts ``dpproxy serve`` as a subprocess with a policy over them, then:

1. pgbench (benchmarks/pgbench.py) for every table × clients × mode, alternating dpproxy and
   direct PostgreSQL run by run, ``--rounds`` times;
2. per-query latency (benchmarks/latency.py) of COUNT, SUM, AVG, MIN/MAX and a 3-column query;
3. sample-and-aggregate AVG vs a direct AVG() on the largest table (benchmarks/avg.py);
4. dpproxy's RSS with ``--idle`` idle clients (benchmarks/idle.py);
5. SmartNoise SQL on the same queries against direct PostgreSQL (benchmarks/smartnoise.py);
6. what a connection costs (connect, SELECT 1, close) and how many of ``--served-clients``
   clients running a DP query at once are answered (benchmarks/connections.py);
7. pgbench with a script of catalog statements BI tools and psql send (``CATALOG_SCRIPT``),
   dpproxy against direct PostgreSQL over TCP: the passthrough path's cost;
8. a large passthrough result (``--large-rows`` generated rows) read through dpproxy and
   directly, dpproxy's peak memory meanwhile, and a client that pauses before reading
   (benchmarks/large_result.py).

and prints the ratios as Markdown. Nothing here asserts a timing.

Old beside new: ``--baseline-source DIR`` (a worktree of an older commit) adds the target
``dpproxy-base``, and ``--targets ...,dpproxy-2w`` a dpproxy with ``listen.workers: 2``; both
run in the same interleaved rounds as dpproxy in the pgbench, catalog and connections sections.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from functools import partial
from pathlib import Path

import psycopg

from policies.loader import load_policy

from .avg import compare_avg
from .connections import clients_served, connection_cost
from .histogram import compare_histogram
from .environment import BASELINE, DATABASE, TWO_WORKERS, VARIANTS, Environment, environment, note
from .idle import idle_connections
from .large_result import large_result
from .latency import QUERIES, Probe, measure
from .pgbench import CATALOG_SCRIPT, find_pgbench, run_pgbench, write_script
from .postgres import ADMIN
from .report import Results, machine, render
from .servers import commit_of, renew_budget
from .smartnoise import SmartNoiseError, SmartNoiseTimer, default_venv, find_smartnoise, install_smartnoise, metadata

SECTIONS = ("pgbench", "latency", "avg", "histogram", "idle", "smartnoise", "connections", "catalog", "large")
BIG_TABLE = 1_000_000
BIG_DURATION_FACTOR = 2.5


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    chosen_targets = args.targets is not None
    if args.quick:
        args.rows = args.rows or [1000]
        args.duration = args.duration or 1.0
        args.rounds = args.rounds or 1
        args.latency_iterations = args.latency_iterations or 20
        args.idle = args.idle or 50
        args.smartnoise_iterations = args.smartnoise_iterations or 3
        args.targets = args.targets or ["dpproxy", "direct-tcp", "pgbouncer"]
        args.large_rows = args.large_rows or 20_000
    args.rows = args.rows or [1_000, 48_842, 1_000_000]
    args.duration = args.duration or 8.0
    args.rounds = args.rounds or 3
    args.latency_iterations = args.latency_iterations or 300
    args.idle = args.idle or 1000
    args.smartnoise_iterations = args.smartnoise_iterations or 30
    args.large_rows = args.large_rows or 1_000_000
    args.targets = args.targets or ["dpproxy", "direct-tcp", "direct-unix", "relay", "pgbouncer"]
    if args.baseline_source is None and BASELINE in args.targets:
        _parser().error(f"--targets {BASELINE} needs --baseline-source DIR (a source tree of the older dpproxy)")
    if args.baseline_source is not None and not chosen_targets:
        args.targets.append(BASELINE)  # the default targets, and the baseline asked for
    baseline = args.baseline_source.resolve() if args.baseline_source and BASELINE in args.targets else None
    args.connection_cycles = args.connection_cycles or (20 if args.quick else 100)
    args.served_clients = args.served_clients or (20 if args.quick else 150)
    logging.basicConfig(level=logging.WARNING)
    if args.dpproxy_source is not None:
        args.dpproxy_source = args.dpproxy_source.resolve()
        note(f"dpproxy runs from {args.dpproxy_source}")

    started = time.monotonic()
    with environment(args.rows, args.data_dir, args.max_connections, args.pool_size, args.dpproxy_source,
                     baseline, TWO_WORKERS in args.targets) as env:
        if "pgbouncer" in args.targets and env.pgbouncer is None:
            note("pgbouncer is not installed (apt install pgbouncer): not compared")
        args.targets = env.available(args.targets)
        results = Results(settings=_settings(args, env), machine={}, labels=env.labels())
        pgbench = find_pgbench(env.postgres.bin_dir)
        with psycopg.connect(env.direct_tcp.conninfo()) as conn:
            results.machine = machine(str(conn.info.parameter_status("server_version")), pgbench)
        _warm_up(env)
        if "pgbench" in args.only:
            _run_pgbench(env, results, pgbench, args)
        if "catalog" in args.only:
            _run_catalog(env, results, pgbench, args)
        env.stop_pgbouncer()  # only pgbench uses it
        if "latency" in args.only:
            _run_latency(env, results, args)
        if "avg" in args.only:
            rows = max(env.tables)
            note(f"AVG: sample and aggregate vs AVG() on {rows:,} rows")
            results.avg = compare_avg(env.workdir / "policy.yaml", env.dpproxy, env.direct_tcp, env.tables[rows],
                                      rows, _iterations(args.latency_iterations, rows))
        if "histogram" in args.only:
            rows = max(env.tables)
            note(f"histogram: 1,000 cells vs the plain GROUP BY on {rows:,} rows")
            results.histogram = compare_histogram(env.workdir / "policy.yaml", env.dpproxy, env.direct_tcp,
                                                  env.tables[rows], rows, _iterations(args.latency_iterations, rows))
        if "idle" in args.only:
            checkpoints = sorted({n for n in (1, 100, 250, 500, args.idle) if n <= args.idle})
            note(f"idle: up to {args.idle} idle clients (max_connections {args.max_connections})")
            results.idle = idle_connections(env.proxy, env.dpproxy, env.postgres.endpoint(ADMIN, "postgres", tcp=False),
                                            checkpoints)
            results.idle_max_connections = args.max_connections
        if "smartnoise" in args.only:
            _run_smartnoise(env, results, args)
        if "connections" in args.only:
            _run_connections(env, results, args)
        if "large" in args.only:  # last: a dpproxy that held a result whole may keep its memory
            note(f"large: {args.large_rows:,} generated rows × {args.rounds} through dpproxy and direct-tcp")
            results.large = large_result(env.proxy, env.dpproxy, env.direct_tcp, args.large_rows, args.rounds)
    report = render(results)
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
        note(f"wrote {args.out}")
    note(f"done in {time.monotonic() - started:.0f}s")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    numbers = lambda text: [int(x.replace("_", "")) for x in text.split(",")]  # noqa: E731
    names = lambda text: text.split(",")  # noqa: E731
    parser.add_argument("--quick", action="store_true", help="seconds-long smoke run on a 1,000-row table")
    parser.add_argument("--rows", type=numbers, help="table sizes (default 1000,48842,1000000)")
    parser.add_argument("--clients", type=numbers, default=[1, 8], help="pgbench clients (default 1,8)")
    parser.add_argument("--modes", type=names, default=["simple", "extended"], help="pgbench -M modes")
    parser.add_argument("--targets", type=names,
                        help=f"pgbench endpoints: dpproxy,direct-tcp,direct-unix,relay,pgbouncer (default all "
                             f"this machine has; --quick: dpproxy,direct-tcp,pgbouncer), and the optional "
                             f"dpproxy servers {','.join(VARIANTS)} (also in the catalog and connections sections; "
                             f"{BASELINE} is added by --baseline-source)")
    parser.add_argument("--duration", type=float, help="seconds per pgbench run (default 8; --quick 1)")
    parser.add_argument("--rounds", type=int, help="rounds of pgbench, the catalog script and the large result, medians reported "
                                                     "(default 3; --quick 1)")
    parser.add_argument("--latency-iterations", type=int,
                        help="runs of each query per endpoint (default 300, ÷4 on ≥1M rows; --quick 20)")
    parser.add_argument("--idle", type=int, help="idle clients to open (default 1000; --quick 50)")
    parser.add_argument("--max-connections", type=int, default=1100,
                        help="PostgreSQL max_connections (default 1100: dpproxy holds a backend per client)")
    parser.add_argument("--only", type=names, default=list(SECTIONS), help="sections: " + ",".join(SECTIONS))
    parser.add_argument("--smartnoise-iterations", type=int,
                        help="runs of each query through SmartNoise SQL and directly (default 30; --quick 3)")
    parser.add_argument("--smartnoise-venv", type=Path,
                        help=f"SmartNoise SQL's virtual environment (default {default_venv()}; created with "
                             "pip when missing)")
    parser.add_argument("--connection-cycles", type=int,
                        help="connect/SELECT 1/close cycles per thread and round (default 100; --quick 20)")
    parser.add_argument("--served-clients", type=int,
                        help="clients that run a DP query at once, all staying open (default 150; --quick 20)")
    parser.add_argument("--large-rows", type=int,
                        help="rows of the large passthrough result (default 1000000; --quick 20000)")
    parser.add_argument("--pool-size", type=int, help="dpproxy's backend.pool.size (default: the policy default)")
    parser.add_argument("--dpproxy-source", type=Path,
                        help="run the dpproxy server from this source tree (e.g. a worktree of an older commit)")
    parser.add_argument("--baseline-source", type=Path,
                        help=f"also run the dpproxy server from this source tree as target {BASELINE} (e.g. a "
                             "worktree of an older commit), beside this one in the same rounds")
    parser.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here and reuse loaded tables")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    return parser


def _settings(args: argparse.Namespace, env: Environment) -> dict[str, str]:
    settings = {
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:]),
        "pgbench": f"{args.duration:g} s per run ({args.duration * BIG_DURATION_FACTOR:g} s on ≥ 1M rows, "
                   f"against the dpproxy servers and direct-tcp only), {args.rounds} round(s), clients {args.clients}, "
                   f"modes {args.modes}, -j min(clients, 2), endpoints {args.targets}",
        "latency": f"{args.latency_iterations} runs per query and endpoint (a quarter on ≥ 1M rows)",
        "smartnoise": f"{args.smartnoise_iterations} runs per query, through SmartNoise SQL and directly",
        "large": f"{args.large_rows:,} generated rows, {args.rounds} round(s) per endpoint, then one client pausing 3 s",
    }
    if args.dpproxy_source is not None:
        settings["dpproxy run from"] = f"{args.dpproxy_source} ({commit_of(args.dpproxy_source)})"
    if BASELINE in env.variants:
        settings[env.variants[BASELINE].label] = (f"dpproxy run from {args.baseline_source.resolve()}, its policy "
                                                  "stating only what differs from this tree's defaults, without "
                                                  "backend.pool")
    if TWO_WORKERS in env.variants:
        settings[TWO_WORKERS] = "this dpproxy with listen.workers: 2 (two processes on one port), its own ledger"
    return settings


def _warm_up(env: Environment) -> None:
    """Read every table once through each endpoint, so that no run pays for a cold cache."""
    for endpoint in (*env.proxies(list(env.variants)), env.direct_tcp):
        with psycopg.connect(endpoint.conninfo(), autocommit=True, prepare_threshold=None) as conn:
            for table in env.tables.values():
                conn.execute(QUERIES["COUNT"].format(table=table)).fetchall()


def _run_pgbench(env: Environment, results: Results, pgbench: str, args: argparse.Namespace) -> None:
    scripts = {rows: write_script(env.workdir, table) for rows, table in env.tables.items()}
    for round_ in range(args.rounds):
        for rows in sorted(env.tables):
            # On a big table PostgreSQL's scan is all the time: fewer transactions per second,
            # so longer runs, and only the two endpoints the ratio needs.
            big = rows >= BIG_TABLE
            duration = args.duration * (BIG_DURATION_FACTOR if big else 1)
            endpoints = env.endpoints([t for t in args.targets if not big or t in ("dpproxy", "direct-tcp", *VARIANTS)])
            for clients in args.clients:
                for mode in args.modes:
                    # Alternate who goes first, so that drift does not favour one side.
                    order = endpoints if round_ % 2 == 0 else endpoints[::-1]
                    for endpoint in order:
                        policy = env.policy_of(endpoint)
                        if policy is not None:
                            renew_budget(policy)
                        result = run_pgbench(pgbench, endpoint, scripts[rows], clients, mode, duration)
                        results.pgbench.setdefault((rows, clients, mode, endpoint.name), []).append(result)
                        note(f"pgbench round {round_ + 1}/{args.rounds} {rows:,} rows -c {clients} -M {mode} "
                             f"{endpoint.name}: {result.tps:,.0f} tps" + (f" ERROR {result.error}" if result.error else ""))


def _run_catalog(env: Environment, results: Results, pgbench: str, args: argparse.Namespace) -> None:
    """The catalog script against dpproxy (and the VARIANTS among the targets) and direct-tcp,
    endpoints alternating by round."""
    script = write_script(env.workdir, env.tables[min(env.tables)], CATALOG_SCRIPT, name="catalog")
    endpoints = [*env.proxies(args.targets), env.direct_tcp]
    for round_ in range(args.rounds):
        for clients in args.clients:
            for mode in args.modes:
                for endpoint in endpoints if round_ % 2 == 0 else endpoints[::-1]:
                    result = run_pgbench(pgbench, endpoint, script, clients, mode, args.duration)
                    results.catalog.setdefault((0, clients, mode, endpoint.name), []).append(result)
                    note(f"catalog round {round_ + 1}/{args.rounds} -c {clients} -M {mode} {endpoint.name}: "
                         f"{result.tps:,.0f} tps" + (f" ERROR {result.error}" if result.error else ""))


def _run_latency(env: Environment, results: Results, args: argparse.Namespace) -> None:
    for rows, table in sorted(env.tables.items()):
        iterations = _iterations(args.latency_iterations, rows)
        note(f"latency: {len(QUERIES)} queries × {iterations} on {rows:,} rows")
        results.latency[rows] = {}
        for name, template in QUERIES.items():
            sql = template.format(table=table)
            probes = [Probe.on(e.name, e, sql) for e in (*env.proxies(args.targets), env.direct_tcp)]
            results.latency[rows][name] = measure(probes, iterations)


def _run_smartnoise(env: Environment, results: Results, args: argparse.Namespace) -> None:
    venv = args.smartnoise_venv or default_venv()
    python = find_smartnoise(venv) or install_smartnoise(venv)
    if python is None:
        note(f"SmartNoise SQL is not available in {venv}: not compared")
        return
    policy = load_policy(env.workdir / "policy.yaml")
    described = metadata(policy, env.tables, env.dpproxy.dbname)
    for rows, table in sorted(env.tables.items()):
        note(f"SmartNoise SQL: {len(QUERIES)} queries × {args.smartnoise_iterations} on {rows:,} rows")
        results.smartnoise[rows] = {}
        rules = policy.tables[f"public.{table}"]
        assert rules.epsilon is not None  # the benchmark's tables are protected
        timer = partial(SmartNoiseTimer, python, env.direct_tcp, described, rules.epsilon, rules.delta)
        for name, template in QUERIES.items():
            sql = template.format(table=table)
            probes = [Probe("smartnoise", sql, timer), Probe.on(env.direct_tcp.name, env.direct_tcp, sql)]
            try:
                results.smartnoise[rows][name] = measure(probes, args.smartnoise_iterations, warmup=2)
            except SmartNoiseError as exc:
                results.smartnoise[rows][name] = str(exc)


def _run_connections(env: Environment, results: Results, args: argparse.Namespace) -> None:
    endpoints = [*env.proxies(args.targets), env.direct_tcp, env.postgres.scram_endpoint(DATABASE)]
    for concurrency in (1, 8):
        note(f"connections: connect + SELECT 1 + close, {concurrency} at once, {args.connection_cycles} each")
        results.connection_cost += connection_cost(endpoints, concurrency, args.connection_cycles)
    rows = min(env.tables)
    note(f"connections: {args.served_clients} clients at once, a DP COUNT each (max_connections {args.max_connections})")
    results.served = clients_served(env.dpproxy, args.served_clients, QUERIES["COUNT"].format(table=env.tables[rows]))
    results.served_max_connections = args.max_connections
    results.pool_size = args.pool_size
    results.dpproxy_source = str(args.dpproxy_source) if args.dpproxy_source else None


def _iterations(iterations: int, rows: int) -> int:
    return max(10, iterations // 4) if rows >= BIG_TABLE else iterations


if __name__ == "__main__":
    sys.exit(main())
