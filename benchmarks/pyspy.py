"""Where dpproxy's time per query goes: py-spy on the real server while pgbench drives it.

    pip install py-spy
    python -m benchmarks.pyspy --mode simple       # or extended; prints µs per query by function

Starts the benchmark environment (benchmarks/environment.py) with one table, runs pgbench
(one client, one DP COUNT per transaction) against dpproxy and samples the dpproxy process
with ``py-spy record --format raw --function --nonblocking`` for the same seconds. Samples
of idle threads (waiting in the event loop's select) are not taken, so the samples are
dpproxy's CPU time; divided by the queries pgbench completed they give µs per query,
inclusive (the function and everything it calls) and self (the function's own code).
``--svg`` also writes a flame graph.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import psutil

from .environment import environment, note
from .latency import QUERIES
from .pgbench import CATALOG_SCRIPT, CATALOG_STATEMENTS, find_pgbench, run_pgbench, write_script

COUNT_SCRIPT = """\\set a random(25, 60)
SELECT COUNT(*) FROM {table} WHERE age > :a AND sex = 'Female';
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pyspy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("simple", "extended", "prepared"), default="simple")
    parser.add_argument("--query", choices=sorted(QUERIES), help="profile this fixed query of benchmarks/latency.py "
                        "instead of the COUNT with a pgbench-drawn literal")
    parser.add_argument("--catalog", action="store_true", help="profile the catalog mix of benchmarks/pgbench.py "
                        "(passthrough statements; µs are per statement)")
    parser.add_argument("--rows", type=int, default=1000, help="table size (default 1000)")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rate", type=int, default=400, help="samples per second")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--svg", type=Path, help="also write a flame graph here")
    parser.add_argument("--gil", action="store_true", help="only samples holding the GIL (Python CPU)")
    parser.add_argument("--raw", type=Path, help="also keep py-spy's raw (collapsed stacks) output here")
    args = parser.parse_args(argv)
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

    with environment([args.rows], None, 100) as env:
        template = CATALOG_SCRIPT if args.catalog else QUERIES[args.query] + ";\n" if args.query else COUNT_SCRIPT
        script = write_script(env.workdir, env.tables[args.rows], template, "profile")
        raw = env.workdir / "profile.txt"
        record = [pyspy, "record", "--pid", str(env.proxy.pid), "--rate", str(args.rate), "--function",
                  "--nonblocking", "--duration", str(args.seconds)] + (["--gil"] if args.gil else [])
        spy = subprocess.Popen(record + ["--format", "raw", "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        flame = subprocess.Popen(record + ["-o", str(args.svg)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL) if args.svg else None
        before = _thread_cpu(env.proxy.pid)
        result = run_pgbench(find_pgbench(env.postgres.bin_dir), env.dpproxy, script, args.clients, args.mode,
                             args.seconds)
        after = _thread_cpu(env.proxy.pid)
        _, errors = spy.communicate(timeout=args.seconds + 60)
        if flame is not None:
            flame.wait(timeout=args.seconds + 60)
        if result.error or not raw.exists():
            note(f"pgbench: {result.error}; py-spy: {errors.strip()}")
            return 1
        stacks = _read_raw(raw)
        if args.raw:
            shutil.copyfile(raw, args.raw)
    cpu = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    statements = result.transactions * (CATALOG_STATEMENTS if args.catalog else 1)
    print(_render(stacks, statements, cpu, env.proxy.pid, args))
    return 0


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by each thread of ``pid``."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}


def _read_raw(path: Path) -> Counter[tuple[str, ...]]:
    """py-spy's raw (collapsed) format: ``frame;frame;…;frame count`` per line, root first."""
    stacks: Counter[tuple[str, ...]] = Counter()
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks[tuple(frames.split(";"))] += int(count)
    return stacks


def _render(
    stacks: Counter[tuple[str, ...]], queries: int, cpu: dict[int, float], pid: int, args: argparse.Namespace
) -> str:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for frames, count in stacks.items():
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    total = sum(stacks.values())
    per_query = 1e6 / args.rate / max(1, queries)  # µs of CPU per sample, per query

    def table(counter: Counter[str], title: str) -> list[str]:
        lines = [f"### {title}", "", "| µs/query | % of CPU | function |", "|---:|---:|---|"]
        for frame, count in counter.most_common(args.top):
            lines.append(f"| {count * per_query:,.0f} | {100 * count / total:.1f} | `{frame}` |")
        return lines + [""]

    head = [
        f"## py-spy: dpproxy, pgbench -M {args.mode}, {args.clients} client(s), {args.rows:,} rows, "
        + ("the catalog mix (passthrough)" if args.catalog else f"one DP {args.query or 'COUNT'} per transaction"),
        "",
        f"{queries:,} queries in {args.seconds} s; {total:,} busy samples at {args.rate}/s → "
        f"{total * per_query:,.0f} µs per query in sampled stacks.",
        "",
        f"Measured CPU time of the dpproxy process (psutil, user + system) during the run: "
        f"**{sum(cpu.values()) * 1e6 / max(1, queries):,.0f} µs per query**, of which the event-loop thread "
        f"{cpu.get(pid, 0.0) * 1e6 / max(1, queries):,.0f} µs and other threads (ledger worker threads, audit "
        f"writer) {(sum(cpu.values()) - cpu.get(pid, 0.0)) * 1e6 / max(1, queries):,.0f} µs.",
        "",
    ]
    return "\n".join(head + table(inclusive, "Inclusive (function and its callees)") + table(own, "Self"))


if __name__ == "__main__":
    sys.exit(main())
