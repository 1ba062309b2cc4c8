"""Instructions per statement: dpproxy under callgrind with a fixed workload.

    python -m benchmarks.instructions                                  # ~6 minutes on 2 cores
    python -m benchmarks.instructions --baseline-source ../base        # this tree and another, one run
    python -m benchmarks.instructions --statements 300 --keep cg/      # quicker; keep the profiles

Throughput on a shared 2-core machine moves by ±5 % between runs, more than most single
changes do. The number of instructions a process executes for a fixed workload does not
depend on what else the machine is doing, so this measures dpproxy by that count:

1. PostgreSQL with the 1,000-row Adult table and the benchmark policy (benchmarks/servers.py;
   AVG by the policy default, the noisy sum over a noisy count; reservations never handed back
   for idleness) as in the other benchmarks.
2. dpproxy runs under ``valgrind --tool=callgrind --separate-threads=yes`` (``PYTHONHASHSEED=0``,
   so that set and dict orders, and so the instructions, are the same every run). With
   ``--uninstrumented-start`` it starts without instrumentation (``--instr-atstart=no``, about
   5× quicker: instrumenting the imports is most of a short run) and instrumentation is switched
   on once it listens, before the warm-up. The counts then differ from a default run's (by up to
   40 % for the first workload at 100 statements; why is not known): compare only runs made
   the same way. Its periodic
   work runs on the wall clock, which callgrind slows ~50×: the function-name refresh (a
   catalog read every 10 s) and the result waiters' watchdog are pushed out of the run, and
   the audit writer's and the metrics thread's 20 ms batching is stretched to 1 s so that a
   batch holds about as many lines or observations as it does at full speed.
3. One libpq client (psycopg's ``pq`` layer, C) sends each workload: DP ``COUNT``, ``SUM`` and
   ``AVG`` with a two-column or one-column WHERE, and the eight statements of the catalog mix
   (benchmarks/pgbench.py), each by the simple protocol (the parameter inlined, as ``pgbench -M
   simple``) and the extended one (``PQsendQueryParams``: Parse, Bind, Describe, Execute, Sync
   in one packet, as ``pgbench -M extended``). The parameter cycles through a fixed range.
   With ``--connections N``, N client connections one after another as well, each a libpq
   connect (startup, SCRAM-SHA-256 with dpproxy), ``SELECT 1`` and close: the figures for
   those are per connection (``--workloads ''`` measures connections alone).
4. After a warm-up of every workload, for each workload: callgrind's counters are zeroed
   (``callgrind_control -z``), ``--statements`` statements run, and the profile is dumped
   (``callgrind_control -d``). Instructions per statement = the dump's total ÷ statements, for
   the event-loop thread (callgrind's thread 1) and for all threads (noise pool, audit writer,
   ledger workers as well).

The figures are repeatable to ~0.5 % (noise samplers loop a random number of times; the audit
writer's batches follow the wall clock); see benchmarks/profile.md, "Instructions per
statement". ``--keep DIR`` keeps the callgrind files (``callgrind_annotate --inclusive=yes
FILE`` shows where the instructions go, by C function: CPython's interpreter, libpq, OpenDP,
_decimal, uvloop, the kernel's share is not counted); ``--top N`` prints each workload's N
costliest C functions of the event-loop thread (self instructions).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from psycopg import pq

from proxy.demo.embedded import SERVICE_ROLE

from .environment import DATABASE, note
from .pgbench import CATALOG_SCRIPT
from .postgres import BenchPostgres, Endpoint, free_port
from .servers import ANALYST, ServerProcess, commit_of, write_policy
from .tables import prepare_database, table_name

__all__ = ["CONNECTIONS", "PROTOCOLS", "ROWS", "WORKLOADS", "Client", "Workload", "benchmark_policy", "chosen_workloads", "connect_cycles",
           "main"]

ROWS = 1000

# Run by the valgrind'ed interpreter in the source tree measured (an older one too): stretches
# what runs on the wall clock (see the module's docstring), then serves. An older tree may lack
# a name; it is then left alone.
_LAUNCH = """
import sys
from importlib import import_module
for module, name, value in (("proxy.serving.server", "FUNCTION_NAMES_REFRESH_S", 1e9),
                            ("proxy.backend.result_waiter", "RECHECK_S", 1e9),
                            ("proxy.ops.audit", "BATCH_S", 1.0),
                            ("proxy.ops.metrics", "BATCH_S", 1.0)):
    try:
        target = import_module(module)
    except ImportError:
        continue
    if hasattr(target, name):
        setattr(target, name, value)
from proxy.cli.main import main
sys.exit(main(["serve", "-c", sys.argv[1]]))
"""


@dataclass(frozen=True)
class Workload:
    """Statements of one kind: the ``i``-th as text with its parameter inlined (simple protocol),
    and as text with ``$1`` plus the parameter values (extended protocol)."""

    name: str
    simple: Callable[[int], str]
    extended: Callable[[int], tuple[str, list[bytes]]]


def _dp(name: str, template: str, low: int, span: int) -> Workload:
    """A DP aggregate whose WHERE compares with ``low + i mod span`` (as pgbench's ``random``)."""
    table = table_name(ROWS)
    return Workload(
        name,
        lambda i: template.format(table=table, p=low + i % span),
        lambda i: (template.format(table=table, p="$1"), [str(low + i % span).encode()]),
    )


_CATALOG = [s.strip() for s in CATALOG_SCRIPT.format(table=table_name(ROWS)).split(";\n") if s.strip()]

WORKLOADS: tuple[Workload, ...] = (
    _dp("COUNT", "SELECT COUNT(*) FROM {table} WHERE age > {p} AND sex = 'Female'", 25, 36),
    _dp("SUM", "SELECT SUM(hours_per_week) FROM {table} WHERE hours_per_week > {p}", 20, 41),
    _dp("AVG", "SELECT AVG(hours_per_week) FROM {table} WHERE age > {p}", 25, 36),
    # AVG of the one column the policy answers by sample and aggregate (benchmark_policy)
    _dp("AVG_SA", "SELECT AVG(education_num) FROM {table} WHERE age > {p}", 25, 36),
    _dp("MINMAX", "SELECT MIN(age), MAX(age) FROM {table} WHERE hours_per_week > {p}", 20, 41),
    # the latency benchmark's "3 columns": three released columns of one backend row
    _dp("THREE", "SELECT COUNT(*), SUM(hours_per_week), SUM(capital_gain) FROM {table} WHERE age > {p} AND sex = 'Male'",
        25, 36),
    Workload("catalog", lambda i: _CATALOG[i % len(_CATALOG)], lambda i: (_CATALOG[i % len(_CATALOG)], [])),
)
PROTOCOLS = ("simple", "extended")
CONNECTIONS = ("connection", "connect, SELECT 1, close")
"""The key of the per-connection count among a target's results (workload, protocol)."""


@dataclass(frozen=True)
class Count:
    """Instructions per statement of one workload: the event-loop thread's and all threads'."""

    loop: float
    total: float


class CallgrindServer:
    """dpproxy from ``source`` (None: this tree) under callgrind, its profiles dumped in ``out``."""

    def __init__(self, policy: Path, port: int, source: Path | None, out: Path, name: str,
                 uninstrumented_start: bool = False):
        self.out = out
        self.name = name
        out.mkdir(parents=True, exist_ok=True)
        valgrind = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no",
                    f"--instr-atstart={'no' if uninstrumented_start else 'yes'}",
                    f"--callgrind-out-file={out}/callgrind.out.%p"]
        os.environ["PYTHONHASHSEED"] = "0"  # inherited by the server; restored in main
        self.process = ServerProcess(valgrind + [sys.executable, "-c", _LAUNCH, str(policy)], port,
                                     out / "dpproxy.log", cwd=source, startup_timeout=900)
        user, password = ANALYST
        self.endpoint = Endpoint(name, "127.0.0.1", port, user, DATABASE, password)
        self._dumps = 0
        if uninstrumented_start:
            self.control("--instr=on")  # listening: the start is over

    def control(self, option: str) -> None:
        subprocess.run(["callgrind_control", option, str(self.process.pid)], check=True, capture_output=True,
                       timeout=600)

    def measure(self, run: Callable[[], int]) -> Count:
        """Zero the counters, ``run`` (returns the statements sent), dump: instructions per statement."""
        self.control("-z")
        statements = run()
        self.control("-d")
        self._dumps += 1
        files = sorted(self.out.glob(f"callgrind.out.{self.process.pid}.{self._dumps}-*"))
        if not files:
            raise RuntimeError(f"callgrind wrote no profile for dump {self._dumps} in {self.out}")
        totals = {f.name.rsplit("-", 1)[1]: _total(f) for f in files}
        return Count(totals.get("01", 0) / statements, sum(totals.values()) / statements)

    def stop(self) -> None:
        self.process.stop()


def _total(path: Path) -> int:
    """The instruction total of one callgrind file (``totals:`` or ``summary:`` line)."""
    for line in reversed(path.read_text(errors="replace").splitlines()):
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


class Client:
    """One libpq connection sending statements one at a time and reading each answer whole."""

    def __init__(self, endpoint: Endpoint):
        self.conn = pq.PGconn.connect(endpoint.conninfo().encode())
        if self.conn.status != pq.ConnStatus.OK:
            raise RuntimeError(f"cannot connect to {endpoint.name}: {self.conn.get_error_message()!r}")

    def run(self, workload: Workload, protocol: str, start: int, count: int) -> int:
        for i in range(start, start + count):
            if protocol == "simple":
                result = self.conn.exec_(workload.simple(i).encode())
            else:
                text, params = workload.extended(i)
                result = self.conn.exec_params(text.encode(), params)
            if result.status != pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"{workload.name} ({protocol}) failed: {result.error_message!r}")
        return count

    def close(self) -> None:
        self.conn.finish()


def connect_cycles(endpoint: Endpoint, count: int) -> int:
    """``count`` client connections one after another, each: connect and authenticate, ``SELECT 1``,
    close (libpq's Terminate). Returns ``count``; raises RuntimeError if one fails."""
    conninfo = endpoint.conninfo().encode()
    for _ in range(count):
        conn = pq.PGconn.connect(conninfo)
        try:
            if conn.status != pq.ConnStatus.OK:
                raise RuntimeError(f"cannot connect to {endpoint.name}: {conn.get_error_message()!r}")
            result = conn.exec_(b"SELECT 1")
            if result.status != pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"SELECT 1 failed on {endpoint.name}: {result.error_message!r}")
        finally:
            conn.finish()
    return count


def measure(
    server: CallgrindServer, workloads: list[Workload], warmup: int, statements: int, connections: int = 0
) -> dict[tuple[str, str], Count]:
    """Warm every workload up, then count each one's instructions per statement (and, with
    ``connections``, per connection under the key ``CONNECTIONS``)."""
    counts: dict[tuple[str, str], Count] = {}
    if connections:
        connect_cycles(server.endpoint, warmup)
        counts[CONNECTIONS] = server.measure(lambda: connect_cycles(server.endpoint, connections))
        note(f"{server.name}: {counts[CONNECTIONS].total:,.0f} instructions per connection")
    client = Client(server.endpoint)
    try:
        for workload in workloads:
            for protocol in PROTOCOLS:
                client.run(workload, protocol, 0, warmup)
        for workload in workloads:
            for protocol in PROTOCOLS:
                def run(w: Workload = workload, p: str = protocol) -> int:
                    return client.run(w, p, warmup, statements)

                counts[(workload.name, protocol)] = server.measure(run)
                note(f"{server.name}: {workload.name} {protocol}: {counts[(workload.name, protocol)].total:,.0f} "
                     "instructions per statement")
    finally:
        client.close()
    return counts


def render(results: dict[str, dict[tuple[str, str], Count]], workloads: list[Workload], statements: int,
           connections: int = 0) -> str:
    """Markdown: instructions per statement (per connection) of each target, and the change against the first."""
    names = list(results)
    head = "| workload | protocol | " + " | ".join(f"{n}: all threads (event loop)" for n in names)
    rule = "|---|---|" + "---:|" * len(names)
    if len(names) > 1:
        head += f" | {names[0]} vs {names[1]} |"
        rule += "---:|"
    said = [f"per statement, {statements:,} statements per workload, 1,000-row table"] if workloads else []
    said += [f"per connection, {connections:,} connections"] if connections else []
    lines = [f"Instructions {'; '.join(said)}.", "", head, rule]
    keys = [CONNECTIONS] if connections else []
    keys += [(workload.name, protocol) for workload in workloads for protocol in PROTOCOLS]
    for key in keys:
        cells = [f"{results[n][key].total:,.0f} ({results[n][key].loop:,.0f})" for n in names]
        row = f"| {key[0]} | {key[1]} | " + " | ".join(cells)
        if len(names) > 1:
            row += f" | {results[names[0]][key].total / results[names[1]][key].total - 1:+.1%} |"
        lines.append(row)
    return "\n".join(lines)


def top_functions(out: Path, pid: int, dump: int, count: int) -> str:
    """The event-loop thread's ``count`` costliest C functions (self) in one dump."""
    path = out / f"callgrind.out.{pid}.{dump}-01"
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--auto=no", str(path)],
                          capture_output=True, text=True, check=True).stdout
    rows = [line for line in text.splitlines() if re.match(r"^\s*[\d,]+ \(", line)]
    return "\n".join(rows[1:count + 1])  # the first row is the program total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--statements", type=int, default=1000, help="statements per workload and protocol")
    parser.add_argument("--warmup", type=int, default=150, help="statements per workload and protocol first")
    parser.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS),
                        help="which of them, comma-separated (default: all)")
    parser.add_argument("--connections", type=int, default=0,
                        help="also count N client connections (connect with SCRAM, SELECT 1, close), per connection")
    parser.add_argument("--baseline-source", type=Path, help="also measure dpproxy from this source tree")
    parser.add_argument("--keep", type=Path, help="keep the callgrind files (and dpproxy's logs) here")
    parser.add_argument("--top", type=int, default=0, help="print each workload's N costliest C functions")
    parser.add_argument("--uninstrumented-start", action="store_true",
                        help="start dpproxy uninstrumented, ~5x quicker; counts comparable only with runs made so")
    args = parser.parse_args(argv)
    workloads = chosen_workloads(parser, args.workloads)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        note("valgrind is not installed (apt install valgrind)")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="dpproxy-instructions-"))
    keep = args.keep or workdir
    hash_seed = os.environ.get("PYTHONHASHSEED")
    servers: list[CallgrindServer] = []
    postgres = None
    try:
        postgres = BenchPostgres(workdir / "pgdata", 100)
        prepare_database(postgres, DATABASE, [ROWS])
        backend = postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False)
        targets = [("dpproxy", None)]
        if args.baseline_source is not None:
            targets.append((f"dpproxy-base ({commit_of(args.baseline_source)})", args.baseline_source.resolve()))
        for index, (name, source) in enumerate(targets):
            port = free_port()
            policy = benchmark_policy(workdir / f"target{index}", backend, port, portable=source is not None)
            servers.append(CallgrindServer(policy, port, source, keep / f"target{index}", name,
                                           args.uninstrumented_start))
            note(f"{name} under callgrind on port {port}")
        results = {server.name: measure(server, workloads, args.warmup, args.statements, args.connections)
                   for server in servers}
        print(render(results, workloads, args.statements, args.connections))
        if args.top:
            dumps = [CONNECTIONS] if args.connections else []
            dumps += [(w.name, p) for w in workloads for p in PROTOCOLS]
            for server in servers:
                for dump, (workload, protocol) in enumerate(dumps, start=1):
                    count = args.connections if (workload, protocol) == CONNECTIONS else args.statements
                    print(f"\n{server.name}, {workload} {protocol}, event loop, self instructions "
                          f"({count:,} of them):\n")
                    print(top_functions(server.out, server.process.pid, dump, args.top))
    finally:
        for server in servers:
            server.stop()
        if postgres is not None:
            postgres.stop()
        if hash_seed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = hash_seed
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def chosen_workloads(parser: argparse.ArgumentParser, names: str) -> list[Workload]:
    """The WORKLOADS named in ``names`` (comma-separated, any case; empty: none); a parser error for others."""
    by_name = {w.name.lower(): w for w in WORKLOADS}
    chosen = [n for n in names.split(",") if n]
    unknown = [n for n in chosen if n.lower() not in by_name]
    if unknown:
        parser.error(f"no workload {', '.join(unknown)} (there are {', '.join(w.name for w in WORKLOADS)})")
    return [by_name[n.lower()] for n in chosen]


def benchmark_policy(directory: Path, backend: Endpoint, port: int, portable: bool) -> Path:
    """The benchmark policy, with AVG by the policy's default (but ``education_num``'s by sample and
    aggregate, for the ``AVG_SA`` workload) and reservations kept while idle."""
    directory.mkdir(parents=True)
    path = write_policy(directory / "policy.yaml", backend, port, {ROWS: table_name(ROWS)}, portable=portable)
    policy = yaml.safe_load(path.read_text(encoding="utf-8"))
    for table in policy["tables"].values():
        table.pop("avg", None)
        table["columns"]["education_num"]["avg"] = "sample_aggregate"  # the AVG_SA workload's column
    policy["ledger"]["release_idle_s"] = 3600
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


if __name__ == "__main__":
    sys.exit(main())
