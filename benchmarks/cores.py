"""Where the machine's cores go: CPU per statement of PostgreSQL, dpproxy and pgbench.

    python -m benchmarks.cores                      # 1,000 rows, 1 and 8 clients, simple protocol
    python -m benchmarks.cores --rows 48842 --clients 8 --seconds 15

Runs pgbench's two-aggregate transaction (benchmarks/pgbench.py) against direct PostgreSQL,
dpproxy (one process) and dpproxy with ``listen.workers: 2``, in interleaved rounds, and
charges the CPU time (user + system) each process tree used during the run to it: the
postmaster and its backends (ended backends through the postmaster's reaped-children
times), dpproxy and its workers, and pgbench. Divided by the statements pgbench completed,
that is the scaling model of benchmarks/profile.md: a CPU-bound run on K cores cannot
exceed K / (CPU per statement of all three), and one dpproxy process cannot exceed
1 / (its CPU per statement), since Python runs its event loop on one core at a time.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
from dataclasses import dataclass
from pathlib import Path

import psutil

from .environment import TWO_WORKERS, Environment, environment, note
from .pgbench import SCRIPT, find_pgbench, run_pgbench, write_script
from .postgres import Endpoint

STATEMENTS_PER_TRANSACTION = SCRIPT.count("SELECT")


@dataclass
class Usage:
    """One run: statements per second and µs of CPU per statement by process tree."""

    target: str
    clients: int
    statements_per_s: float
    postgres_us: float
    proxy_us: float
    pgbench_us: float

    @property
    def total_us(self) -> float:
        return self.postgres_us + self.proxy_us + self.pgbench_us


class _Tree:
    """CPU seconds a process and its descendants used, including those that ended (reaped)."""

    def __init__(self, root: psutil.Process):
        self.root = root
        self._start = self._times()
        self._reaped = self._reaped_now()

    def _times(self) -> dict[int, float]:
        times = {}
        for process in [self.root, *self.root.children(recursive=True)]:
            try:
                cpu = process.cpu_times()
                times[process.pid] = cpu.user + cpu.system
            except psutil.NoSuchProcess:
                pass
        return times

    def _reaped_now(self) -> float:
        cpu = self.root.cpu_times()
        return cpu.children_user + cpu.children_system

    def used(self) -> float:
        now = self._times()
        living = sum(seconds - self._start.get(pid, 0.0) for pid, seconds in now.items())
        return living + self._reaped_now() - self._reaped


def _postmaster(data_dir: Path) -> psutil.Process:
    return psutil.Process(int((data_dir / "postmaster.pid").read_text().split()[0]))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(env: Environment, pgbench: str, target: Endpoint, script: Path, clients: int, mode: str,
            seconds: float) -> Usage:
    proxy_pid = {"dpproxy": env.proxy.pid}
    if TWO_WORKERS in env.variants:
        proxy_pid[TWO_WORKERS] = env.variants[TWO_WORKERS].process.pid
    postgres = _Tree(_postmaster(env.postgres.data_dir))
    proxy = _Tree(psutil.Process(proxy_pid[target.name])) if target.name in proxy_pid else None
    pgbench_before = _children_cpu()
    result = run_pgbench(pgbench, target, script, clients, mode, seconds)
    if result.error:
        raise RuntimeError(f"pgbench against {target.name}: {result.error}")
    statements = result.transactions * STATEMENTS_PER_TRANSACTION

    def per_statement(cpu_s: float) -> float:
        return cpu_s / statements * 1e6

    return Usage(target.name, clients, result.tps * STATEMENTS_PER_TRANSACTION, per_statement(postgres.used()),
                 per_statement(proxy.used()) if proxy else 0.0, per_statement(_children_cpu() - pgbench_before))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cores", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--clients", default="1,8", help="pgbench clients (default 1,8)")
    parser.add_argument("--mode", default="simple")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    cores = os.cpu_count() or 1
    with environment([args.rows], None, 200, two_workers=True) as env:
        pgbench = find_pgbench(env.postgres.bin_dir)
        script = write_script(env.workdir, env.tables[args.rows])
        targets = env.endpoints(["direct-tcp", "dpproxy", TWO_WORKERS])
        runs: dict[tuple[str, int], list[Usage]] = {}
        for round_ in range(args.rounds):
            for clients in (int(c) for c in args.clients.split(",")):
                for target in targets:
                    usage = measure(env, pgbench, target, script, clients, args.mode, args.seconds)
                    runs.setdefault((target.name, clients), []).append(usage)
                    note(f"round {round_ + 1}/{args.rounds} {target.name} -c {clients}: "
                         f"{usage.statements_per_s:,.0f} statements/s")
    print(f"## CPU per statement: pgbench -M {args.mode}, {args.rows:,} rows, {cores} cores, "
          f"median of {args.rounds} rounds of {args.seconds:g} s\n")
    print("| target | clients | statements/s | PostgreSQL µs | dpproxy µs | pgbench µs | total µs "
          "| machine CPU busy | ceiling K / total | one process's ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (name, clients), usages in runs.items():
        med = Usage(name, clients, *(statistics.median(getattr(u, f) for u in usages)
                                     for f in ("statements_per_s", "postgres_us", "proxy_us", "pgbench_us")))
        busy = med.statements_per_s * med.total_us / 1e6 / cores
        one = f"{1e6 / med.proxy_us:,.0f}" if med.proxy_us else "—"
        print(f"| {name} | {clients} | {med.statements_per_s:,.0f} | {med.postgres_us:.0f} | {med.proxy_us:.0f} "
              f"| {med.pgbench_us:.0f} | {med.total_us:.0f} | {busy:.0%} | {cores * 1e6 / med.total_us:,.0f} | {one} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
