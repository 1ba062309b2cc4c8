"""Python bytecodes per statement, by function: which Python code dpproxy's instructions run.

    python -m benchmarks.bytecodes                       # every workload, top 25 functions
    python -m benchmarks.bytecodes --workloads COUNT --top 60
    python -m benchmarks.bytecodes --workloads '' --connections 200   # per client connection alone

callgrind (benchmarks/instructions.py) counts machine instructions by C function, and ~94 %
of a statement's are CPython's interpreter running Python code, which it cannot tell apart.
This runs the same workloads against dpproxy (without valgrind) with a trace function on the
event-loop thread that counts the bytecodes each Python function executes itself (``sys.settrace``
with ``f_trace_opcodes``; switched on after the warm-up, off after the workload, by
signals). Bytecodes are not instructions (a ``CALL`` of a C function or a ``BINARY_OP`` on
decimals is one bytecode and many instructions), but their count is exact and repeatable,
and it names the Python function: find a candidate here, measure it with
``benchmarks.instructions``. The trace slows the server ~20×; the counts do not change.
``--connections N`` counts N client connections as well (libpq: connect, SCRAM-SHA-256,
``SELECT 1``, close, one after another), per connection.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from proxy.demo.embedded import SERVICE_ROLE

from .environment import DATABASE, note
from .instructions import (PROTOCOLS, ROWS, WORKLOADS, Client, Workload, benchmark_policy, chosen_workloads,
                           connect_cycles)
from .postgres import BenchPostgres, Endpoint, free_port
from .servers import ANALYST, ServerProcess
from .tables import prepare_database

__all__ = ["main"]

# SIGUSR1 starts counting (and writes OUT.on), SIGUSR2 stops and writes the counts to OUT as
# JSON: [[function, bytecodes], ...], the function as "path:qualified name".
_LAUNCH = """
import json, os, signal, sys, sysconfig
from collections import Counter
counts = Counter()
out = sys.argv[2]
prefixes = (os.getcwd() + "/", sysconfig.get_paths()["stdlib"] + "/")
def where(path):
    path = path.rsplit("site-packages/", 1)[-1]
    for prefix in prefixes:
        if path.startswith(prefix):
            return path[len(prefix):]
    return path
def trace(frame, event, arg):
    frame.f_trace_opcodes = True
    code = frame.f_code
    name = where(code.co_filename) + ":" + code.co_qualname
    if code.co_filename == "<string>" and code.co_varnames[:1] == ("self",):  # a dataclass's generated method
        name += " of " + type(frame.f_locals["self"]).__qualname__
    def opcode(frame, event, arg):
        if event == "opcode":
            counts[name] += 1
        return opcode
    return opcode
def start(*_):
    counts.clear()
    sys.settrace(trace)
    open(out + ".on", "w").close()
def stop(*_):
    sys.settrace(None)
    with open(out + ".part", "w") as f:
        json.dump(counts.most_common(), f)
    os.replace(out + ".part", out)
signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
from proxy.cli.main import main
sys.exit(main(["serve", "-c", sys.argv[1]]))
"""


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the traced dpproxy wrote no {path.name} in {timeout:g}s")
        time.sleep(0.05)


def counted(process: ServerProcess, run: Callable[[], object], out: Path) -> Counter[str]:
    """Bytecodes per function while ``run`` runs (totals, not per statement)."""
    for stale in (out, out.with_name(out.name + ".on")):
        stale.unlink(missing_ok=True)
    os.kill(process.pid, signal.SIGUSR1)
    _wait_for(out.with_name(out.name + ".on"))
    run()
    os.kill(process.pid, signal.SIGUSR2)
    _wait_for(out)
    return Counter(dict(json.loads(out.read_text())))


def render(name: str, counts: Counter[str], statements: int, top: int, unit: str = "statement") -> str:
    total = sum(counts.values())
    modules: Counter[str] = Counter()
    for function, n in counts.items():
        modules[function.split(":", 1)[0]] += n
    lines = [f"### {name}: {total / statements:,.0f} bytecodes per {unit}", "",
             "| bytecodes | module |", "|---:|---|"]
    lines += [f"| {n / statements:,.0f} | `{module}` |" for module, n in modules.most_common(top // 2)]
    lines += ["", "| bytecodes | function (self) |", "|---:|---|"]
    lines += [f"| {n / statements:,.0f} | `{function}` |" for function, n in counts.most_common(top)]
    return "\n".join(lines + [""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bytecodes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS),
                        help="which of benchmarks.instructions' workloads, comma-separated (default: all)")
    parser.add_argument("--statements", type=int, default=300, help="statements per workload and protocol")
    parser.add_argument("--warmup", type=int, default=150, help="statements per workload and protocol first")
    parser.add_argument("--top", type=int, default=25, help="functions listed per workload")
    parser.add_argument("--connections", type=int, default=0,
                        help="also count N client connections (connect with SCRAM, SELECT 1, close), per connection")
    args = parser.parse_args(argv)
    workloads = chosen_workloads(parser, args.workloads)
    workdir = Path(tempfile.mkdtemp(prefix="dpproxy-bytecodes-"))
    postgres = process = None
    try:
        postgres = BenchPostgres(workdir / "pgdata", 100)
        prepare_database(postgres, DATABASE, [ROWS])
        port = free_port()
        policy = benchmark_policy(workdir / "dpproxy", postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False), port,
                                  portable=False)
        out = workdir / "bytecodes.json"
        process = ServerProcess([sys.executable, "-c", _LAUNCH, str(policy), str(out)], port, workdir / "dpproxy.log")
        user, password = ANALYST
        endpoint = Endpoint("dpproxy", "127.0.0.1", port, user, DATABASE, password)
        if args.connections:
            connect_cycles(endpoint, args.warmup)
            counts = counted(process, lambda: connect_cycles(endpoint, args.connections), out)
            print(render("connection", counts, args.connections, args.top, "connection"), flush=True)
            note("connections counted")
        client = Client(endpoint)
        try:
            for workload in workloads:
                for protocol in PROTOCOLS:
                    client.run(workload, protocol, 0, args.warmup)
            for workload in workloads:
                for protocol in PROTOCOLS:
                    def run(w: Workload = workload, p: str = protocol) -> int:
                        return client.run(w, p, args.warmup, args.statements)

                    counts = counted(process, run, out)
                    print(render(f"{workload.name} {protocol}", counts, args.statements, args.top), flush=True)
                    note(f"{workload.name} {protocol} counted")
        finally:
            client.close()
    finally:
        if process is not None:
            process.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
