"""The supervisor of a ``listen.workers`` group: starts the workers, keeps them running, stops them.

Each worker is ``python -m proxy.cli.worker``, a whole dpproxy ``Server`` on the policy's
port with SO_REUSEPORT (``proxy.serving.workers``). The supervisor:

* checks the port is free (no other program, and no other dpproxy, listens there), then
  holds it with a socket bound but never listening, so a port 0 is chosen once for all
  workers and no other program takes the port while a worker restarts;
* starts worker 0 and waits until it listens, so a policy, backend, ledger or TLS problem
  is told once, in the worker's one line, and ends the command with its exit status; then
  the others;
* passes SIGHUP (reload) and SIGTERM (graceful stop; a second one cuts the grace short)
  on to every worker; the workers run in their own session, so a Ctrl-C at a terminal
  reaches only the supervisor, which turns it into one SIGTERM each;
* starts a worker that exits while serving again, with the same number (its cancel
  socket), waiting longer each time one fails soon after starting;
* serves ``/metrics`` for the group when the policy asks for it, summing what each worker
  writes to the group's directory;
* writes ``--port-file`` once every worker listens, and removes it first when stopping.

Each worker holds the read end of a socket pair whose other end only the supervisor holds:
when the supervisor dies, even by SIGKILL, the workers see it close and stop gracefully.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from policies.model import Policy
from proxy.ops import metrics

from . import startup
from .bound_port import PortFile
from .workers import READY

__all__ = ["Supervisor", "cores_warning"]

log = logging.getLogger("dpproxy.supervisor")

_QUICK_EXIT_S: Final = 10.0  # a worker that exits sooner than this after starting is failing
_MAX_BACKOFF_S: Final = 30.0


@dataclass
class _Worker:
    process: asyncio.subprocess.Process
    link: socket.socket
    started: float


class Supervisor:
    """``listen.workers`` dpproxy processes on one port, kept running until ``stop``."""

    def __init__(self, policy: Policy, config: Path, host: str | None, port: int | None, verbose: bool = False,
                 port_file: PortFile | None = None):
        self.policy = policy
        self.config = config
        self.host = host or policy.listen.host
        self.port = policy.listen.port if port is None else port
        self.verbose = verbose
        self.port_file = port_file
        self.count = policy.listen.workers
        self.database = ""
        self.directory = Path(tempfile.mkdtemp(prefix="dpproxy-workers-"))
        self._host_option, self._port_option = host is not None, port is not None
        self._holder: socket.socket | None = None
        self._metrics: metrics.MetricsEndpoint | None = None
        self._workers: dict[int, _Worker] = {}
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = False

    async def start(self) -> int:
        """Hold the port, start every worker; 0 once all listen, else the exit status to return.

        Raises StartupError when the port or the metrics address cannot be bound, or the port
        file cannot be written.
        """
        (self.directory / "metrics").mkdir()
        beyond = cores_warning(self.count, _usable_cores())
        if beyond:
            log.warning("%s", beyond)
        self._hold_port()
        if self.policy.metrics is not None:
            where = self.policy.metrics
            try:
                self._metrics = metrics.MetricsEndpoint(where.host, where.port, self.directory / "metrics",
                                                        self._processes)
            except OSError as exc:
                raise startup.metrics_failure(where.host, where.port, exc) from exc
        failed = await self._launch(0)
        if failed is None:
            others = await asyncio.gather(*(self._launch(i) for i in range(1, self.count)))
            failed = next((code for code in others if code is not None), None)
        if failed is not None:
            await self.stop()
            return failed
        self._keepers = [asyncio.create_task(self._keep(i)) for i in range(self.count)]
        log.info("dpproxy listening on %s:%s for database %s with %d workers (pids %s)", self.host, self.port,
                 self.database, self.count, ", ".join(str(w.process.pid) for w in self._workers.values()))
        if self.port_file is not None:
            self.port_file.write(self.port)
        return 0

    def _processes(self) -> dict[str, int]:
        """The supervisor's pid and each live worker's, by their metrics label."""
        workers = dict(self._workers)  # a copy: this runs on the metrics endpoint's thread
        running = {str(index): worker.process.pid for index, worker in sorted(workers.items())
                   if worker.process.returncode is None}
        return {"supervisor": os.getpid(), **running}

    def signal_all(self, sig: signal.Signals) -> None:
        """Send ``sig`` to every running worker."""
        for worker in self._workers.values():
            if worker.process.returncode is None:
                worker.process.send_signal(sig)

    async def stop(self) -> None:
        """Stop every worker (SIGTERM: each has ``listen.shutdown_grace_s``), then free the
        port, the metrics endpoint and the group's directory. ``signal_all(SIGTERM)`` again
        while this runs cuts the grace short."""
        self._stopping = True
        if self.port_file is not None:
            self.port_file.remove()
        for keeper in self._keepers:
            keeper.cancel()
        self.signal_all(signal.SIGTERM)
        await asyncio.gather(*(w.process.wait() for w in self._workers.values()))
        for worker in self._workers.values():
            worker.link.close()
        if self._metrics is not None:
            self._metrics.close()
        if self._holder is not None:
            self._holder.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _hold_port(self) -> None:
        """Fail now if anything listens on the port; else bind a placeholder there with SO_REUSEPORT."""
        if not hasattr(socket, "SO_REUSEPORT"):
            raise startup.StartupError("listen.workers > 1 needs SO_REUSEPORT, which this platform does not have",
                                       ("listen", "workers"))
        try:
            # "" is every interface, as asyncio binds it; the placeholder takes the first family.
            family, kind, proto, _, address = socket.getaddrinfo(
                self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
            with socket.socket(family, kind, proto) as probe:  # as a lone server would bind
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
                address = probe.getsockname()  # port 0: the one chosen for every worker
            holder = socket.socket(family, kind, proto)
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            holder.bind(address)
        except OSError as exc:
            raise startup.listen_failure(self.host, self.port, exc, self._host_option, self._port_option) from exc
        self._holder = holder
        self.port = holder.getsockname()[1]

    async def _launch(self, index: int) -> int | None:
        """Start worker ``index`` and wait until it listens: None, or its exit status if it ended first."""
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        environment = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(self.directory / "metrics"))
        # The workers run this same source, wherever the supervisor's came from.
        source = str(Path(__file__).resolve().parents[2])
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "proxy.cli.worker", "--config", str(self.config), "--host", self.host,
                   "--port", str(self.port), "--index", str(index), "--directory", str(self.directory),
                   "--link-fd", str(theirs.fileno())]
        if self.verbose:
            command.append("--verbose")
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL, env=environment, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        finally:
            theirs.close()
        self._workers[index] = _Worker(process, ours, time.monotonic())
        message = await _read_line(ours)
        if message.startswith(READY):
            self.database = message[len(READY):].decode("utf-8", "replace").strip()
            return None
        code = await process.wait()
        return code or 1

    async def _keep(self, index: int) -> None:
        """Start worker ``index`` again whenever it exits, until the group stops."""
        backoff = 1.0
        while True:
            worker = self._workers[index]
            code = await worker.process.wait()
            worker.link.close()
            metrics.worker_gone(worker.process.pid, self.directory / "metrics")
            if self._stopping:
                return
            quick = time.monotonic() - worker.started < _QUICK_EXIT_S
            backoff = min(backoff * 2, _MAX_BACKOFF_S) if quick else 1.0
            log.error("worker %d (pid %d) exited with status %s; starting it again in %gs",
                      index, worker.process.pid, code, backoff)
            await asyncio.sleep(backoff)
            failed = await self._launch(index)
            if failed is None:
                log.info("worker %d is serving again (pid %d)", index, self._workers[index].process.pid)


def cores_warning(workers: int, cores: int) -> str | None:
    """What to tell an operator who asks for more workers than dpproxy has cores, or None."""
    if workers <= cores:
        return None
    return (f"listen.workers is {workers} but dpproxy may use {cores} cores here: the workers beyond "
            f"{cores} share cores and add no throughput (benchmarks/profile.md, \"Several cores\")")


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


async def _read_line(sock: socket.socket) -> bytes:
    """What the worker at the other end of ``sock`` wrote, up to its newline; b"" if it closed first."""
    loop = asyncio.get_running_loop()
    data = b""
    while not data.endswith(b"\n"):
        chunk = await loop.sock_recv(sock, 256)
        if not chunk:
            return b""
        data += chunk
    return data
