"""A BI tool's web server as a test runs it, and its JSON API: what Superset's and pgAdmin's
harnesses (tests/superset_harness.py, tests/pgadmin_harness.py) share.

``WebAppProcess`` starts a server from its own venv in a session of its own, its output in a
log file, on a port found free, waits until a URL of it answers 200, and always stops the
whole session. Neither server can be told to bind port 0 and tell the port it got, so the
port is found free first, and another process of a parallel suite can take it before the
server binds it: the server then exits (or never listens) and, worse, the URL may answer 200
from the other process. So the server is ready only once a process of its own session listens
on the port (read from /proc), and a start that lost the port is made again on another one.
``send_json`` sends one request through a cookie-keeping opener and decodes the answer.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PORT_ATTEMPTS", "WebAppProcess", "free_port", "listening_sessions", "send_json"]

PORT_ATTEMPTS = 5
"""How many ports a start tries: each is lost only to a process that binds it meanwhile."""

Command = Callable[[int], tuple[list[str], dict[str, str]]]
"""The argv and environment that start the server on a given port."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _PortLost(Exception):
    """Another process listens on the port the server was given."""


class WebAppProcess:
    """``command(port)`` run in ``cwd`` on a free port, its output in ``log_path``; ready once
    ``http://127.0.0.1:<port><ready_path>`` answers 200 (within ``timeout_s``) from a process
    of its own, else stopped and failed with its log. ``port`` and ``url`` are where it serves."""

    def __init__(self, name: str, command: Command, cwd: Path, log_path: Path, ready_path: str, timeout_s: float):
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            argv, env = command(self.port)
            self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
            try:
                self._wait_ready(self.url + ready_path, timeout_s)
                return
            except _PortLost:
                self._end_process()
                self._log.write(f"\n[web_app] port {self.port} was taken by another process; "
                                f"start {attempt} of {PORT_ATTEMPTS} given up\n".encode())
                self._log.flush()
            except BaseException:
                self.stop()
                raise
        self.stop()
        raise RuntimeError(f"{name}: every one of {PORT_ATTEMPTS} free ports was taken before it listened: "
                           f"{self.log_tail()}")

    def _wait_ready(self, url: str, timeout_s: float) -> None:
        """Return once ``url`` answers 200 and the port is this server's; _PortLost if another
        process listens on it, RuntimeError if the server exits or is not ready in time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._raise_if_lost()
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_tail()}")
            self._raise_if_lost()
            if self.process.pid in listening_sessions(self.port):
                try:
                    with urllib.request.urlopen(url, timeout=2) as reply:
                        if reply.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout_s:.0f} s: {self.log_tail()}")

    def _raise_if_lost(self) -> None:
        """_PortLost when a process of another session listens on the port."""
        if listening_sessions(self.port) - {self.process.pid}:
            raise _PortLost(self.port)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _end_process(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)

    def stop(self) -> None:
        self._end_process()
        self._log.close()


def listening_sessions(port: int) -> set[int]:
    """The session ids of the processes listening on TCP ``port`` (IPv4 or IPv6), of those whose
    descriptors this user may read; -1 for a listening socket of no such process."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return set()
    sessions = set()
    found = set()
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            links = {os.readlink(descriptor) for descriptor in (process / "fd").iterdir()}
            if links & inodes:
                sessions.add(os.getsid(int(process.name)))
                found |= links & inodes
        except OSError:  # gone, or another user's
            continue
    return sessions | ({-1} if inodes - found else set())


def send_json(opener: urllib.request.OpenerDirector, url: str, method: str, data: bytes | None,
              headers: dict[str, str], timeout_s: float) -> tuple[int, Any]:
    """The HTTP status and the decoded JSON body (the raw text when it is not JSON)."""
    req = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with opener.open(req, timeout=timeout_s) as reply:
            status, raw = reply.status, reply.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")
