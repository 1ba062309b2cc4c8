"""The servers a benchmark puts between its clients and PostgreSQL, each in its own process.

* dpproxy: ``python -m proxy.cli serve -c policy.yaml``, the real server, in its own process
  so that its CPU is not shared with the client side of the benchmark and its memory (RSS)
  can be read. The policy protects every benchmark table with the demo's column bounds, ε
  and partitions, and the default ``partitioning: auto`` (``random`` on these key-less
  tables; benchmarks/avg.py runs the other partitionings' SQL directly); AVG is answered by
  sample and aggregate (``avg: sample_aggregate``), as the report names it, but for
  ``education_num``, whose AVG keeps the default noisy sum over a noisy count (``avg: sum_count``);
  the analyst's budget is the largest a policy allows (renewed before each pgbench run
  with ``renew_budget``, as many rounds can spend more than that), answers to repeated
  queries are recomputed (``repeats: {enabled: false}``, else the benchmark would measure
  the repeat cache), and the audit log goes to a file.
* relay: ``python -m benchmarks.relay``, an asyncio byte relay that does nothing but copy
  bytes between client and PostgreSQL: the floor of any asyncio proxy's cost.
* pgbouncer, when installed (``apt install pgbouncer``): the connection pooler in
  transaction mode, the league issue 7 measures dpproxy against. It logs in to PostgreSQL
  as the same service role over the same unix socket, and runs as PostgreSQL's own system
  user when the benchmark runs as root (pgbouncer refuses to run as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from policies.ledger import Budget, Ledger
from policies.loader import load_policy, parse_policy
from policies.model import MAX_BUDGET_EPSILON
from proxy.demo.embedded import DEMO_POLICY

from .postgres import Endpoint

__all__ = [
    "ANALYST", "ServerProcess", "commit_of", "find_pgbouncer", "renew_budget", "start_dpproxy", "start_pgbouncer", "start_relay",
    "write_policy",
]

ANALYST = ("analyst", "analyst")  # login and password (SCRAM-SHA-256)
_ROOT = Path(__file__).resolve().parent.parent


def write_policy(
    path: Path, backend: Endpoint, port: int, tables: dict[int, str], pool_size: int | None = None,
    *, workers: int | None = None, portable: bool = False,
) -> Path:
    """Write the benchmark policy for ``tables`` (rows → name, in schema public) to ``path``;
    its ledger and audit file go next to it.

    ``pool_size``: ``backend.pool.size``; None leaves the key out, as a dpproxy from before the
    pool needs (see ``--dpproxy-source``). ``workers``: ``listen.workers``, the serving
    processes on the one port; None leaves the key out (one process). ``portable``: each
    table's rules state only what differs from this tree's defaults, for a dpproxy from an
    older source tree whose policy model rejects keys it does not know (``partitioning:
    auto`` before row-hash partitions); on these key-less tables every such default means
    what the older one did (``auto`` partitions a table without a key by ``random()``).
    """
    demo = parse_policy(DEMO_POLICY.format(dsn=backend.uri(), port=port, ledger="-"), "demo-policy")
    table = demo.tables["public.adult"].model_dump(mode="json", by_alias=True, exclude_none=True,
                                                   exclude_defaults=portable)
    table["columns"]["age"]["group_by"] = True  # the histogram benchmark's width_bucket(age, ...) key
    # AVG by sample and aggregate, which the latency and AVG sections measure and name (the
    # default noisy SUM / noisy COUNT is one clamped SUM and COUNT, like the SUM probe).
    table["avg"] = "sample_aggregate"
    # ... but for one column, which keeps the default (benchmarks/latency.py, "AVG, sum_count")
    table["columns"]["education_num"]["avg"] = "sum_count"
    if not portable:
        # The 1,000,000-row table's sorts may need ~1.3 GB (rewriter/sort_memory.py), above the default
        # ceiling of 256 MB, which would refuse its AVG, MIN/MAX and histograms: an operator with the
        # memory raises it. (An older tree does not know the key.)
        table["max_sort_memory_mb"] = 16_384
    user, password = ANALYST
    policy = {
        "backend": {"dsn": backend.uri(), "statement_timeout_ms": 600_000},
        "listen": {"host": "127.0.0.1", "port": port},
        "ledger": {"url": f"sqlite:///{path.parent / 'ledger.sqlite3'}"},
        "audit": {"path": str(path.parent / "audit.jsonl")},
        "repeats": {"enabled": False},
        "users": {user: {"password": password, "budget": {"epsilon": MAX_BUDGET_EPSILON, "delta": 0.999}}},
        "tables": {
            f"public.{name}": table for name in tables.values()
        },
    }
    if pool_size is not None:
        policy["backend"]["pool"] = {"size": pool_size}  # type: ignore[index]
    if workers is not None:
        policy["listen"]["workers"] = workers  # type: ignore[index]
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


def renew_budget(policy_path: Path) -> None:
    """Set the benchmark analyst's spend in the ledger back to zero (a pgbench run at
    thousands of DP statements per second may spend a good part of the largest budget)."""
    policy = load_policy(policy_path)
    user = ANALYST[0]
    config = policy.users[user].budget
    with Ledger.from_url(policy.ledger.url, policy.ledger.schema_name) as ledger:
        ledger.reset(user, Budget(config.epsilon, config.delta, config.period))


def start_dpproxy(
    policy_path: Path, port: int, dbname: str, source: Path | None = None, name: str = "dpproxy", workers: int = 1
) -> tuple["ServerProcess", Endpoint]:
    """``source``: the source tree to run dpproxy from (``python -m`` imports its working
    directory first); None: this one. ``name``: the endpoint's (the target's) name; the log
    goes next to the policy. ``workers``: the policy's ``listen.workers``, all of which listen
    before this returns."""
    user, password = ANALYST
    command = [sys.executable, "-m", "proxy.cli", "serve", "-c", str(policy_path)]
    process = ServerProcess(command, port, policy_path.parent / "dpproxy.log", cwd=source, listeners=workers)
    return process, Endpoint(name, "127.0.0.1", port, user, dbname, password)


def start_relay(backend: Endpoint, port: int, log_dir: Path) -> tuple["ServerProcess", Endpoint]:
    command = [sys.executable, "-m", "benchmarks.relay", str(port), backend.host, str(backend.port)]
    process = ServerProcess(command, port, log_dir / "relay.log")
    return process, Endpoint("relay", "127.0.0.1", port, backend.user, backend.dbname, backend.password)


def commit_of(tree: Path) -> str:
    """The short git commit checked out in ``tree`` (`` with uncommitted changes`` when its
    tracked files differ from it); ``unknown`` outside a git checkout or without git."""
    git = ["git", "-C", str(tree)]
    try:
        commit = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        if commit and subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True).stdout.strip():
            commit += " with uncommitted changes"
    except FileNotFoundError:  # no git on this machine (a copy of the tree, not a clone)
        commit = ""
    return commit or "unknown"


def find_pgbouncer() -> str | None:
    """pgbouncer's executable (Debian installs it in /usr/sbin), or None when it is not installed."""
    return shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")


def start_pgbouncer(
    executable: str, backend: Endpoint, port: int, log_dir: Path, system_user: str | None
) -> tuple["ServerProcess", Endpoint]:
    """pgbouncer in transaction mode on 127.0.0.1:``port`` in front of ``backend`` (a unix socket).

    Clients log in as anyone without a password (``auth_type = any``); pgbouncer logs in to
    PostgreSQL as ``backend.user``, as the relay and direct endpoints do.
    """
    config_dir = log_dir / "pgbouncer"
    config_dir.mkdir(exist_ok=True)
    config = config_dir / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"{backend.dbname} = host={backend.host} port={backend.port} dbname={backend.dbname} user={backend.user}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        "auth_type = any\npool_mode = transaction\nmax_client_conn = 200\ndefault_pool_size = 20\n"
        "ignore_startup_parameters = extra_float_digits,options\n",
        encoding="utf-8",
    )
    if system_user is not None:
        os.chmod(log_dir, 0o755)  # mkdtemp's 0700 would keep the unprivileged user out
        os.chmod(config_dir, 0o755)
    process = ServerProcess([executable, str(config)], port, log_dir / "pgbouncer.log", user=system_user)
    return process, Endpoint("pgbouncer", "127.0.0.1", port, backend.user, backend.dbname)


class ServerProcess:
    """A server subprocess listening on 127.0.0.1:``port`` until ``stop``; output to ``log_path``.

    ``user`` runs it as that system user (the caller must be root). ``listeners``: how many
    processes of its tree listen on the port once it has started (a ``listen.workers`` group's
    workers, which start one after another); the constructor waits for them all, at most
    ``startup_timeout`` seconds.
    """

    def __init__(
        self, command: list[str], port: int, log_path: Path, user: str | None = None, cwd: Path | None = None,
        listeners: int = 1, startup_timeout: float = 60,
    ):
        self.port = port
        self.log_path = log_path
        self.listeners = listeners
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, cwd=cwd or _ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, user=user
            )
        self._wait_listening(timeout=startup_timeout)

    @property
    def pid(self) -> int:
        return self._process.pid

    def rss(self) -> int:
        """Resident memory of the process, in bytes."""
        return psutil.Process(self.pid).memory_info().rss

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"{self.log_path.stem} exited with {self._process.returncode}:\n{self.log_tail()}")
            if self._listening():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.log_path.stem} did not listen on port {self.port} "
                           f"({self.listeners} process(es)) in {timeout:g}s:\n{self.log_tail()}")

    def _listening(self) -> bool:
        """Whether it has started: a connection is accepted, or ``listeners`` > 1 processes listen."""
        if self.listeners > 1:  # counted without connecting, which each worker would log
            return self._listening_processes() >= self.listeners
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def _listening_processes(self) -> int:
        """How many processes of this one's tree have a socket listening on its port."""
        try:
            tree = [psutil.Process(self.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        count = 0
        for process in tree:
            try:
                sockets = process.net_connections(kind="tcp")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            count += any(s.status == psutil.CONN_LISTEN and s.laddr.port == self.port for s in sockets)
        return count

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
