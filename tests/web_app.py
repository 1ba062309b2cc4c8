"""A BI tool's web server as a test runs it, and its JSON API: what Superset's and pgAdmin's
harnesses (tests/superset_harness.py, tests/pgadmin_harness.py) share.

``WebAppProcess`` starts a server from its own venv in a session of its own, its output in a
log file, waits until a URL of it answers 200, and always stops the whole session.
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
from pathlib import Path
from typing import Any

__all__ = ["WebAppProcess", "free_port", "send_json"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WebAppProcess:
    """``argv`` run in ``cwd`` with ``env``, its output in ``log_path``; ready once
    ``ready_url`` answers 200 (within ``timeout_s``), else stopped and failed with its log."""

    def __init__(self, name: str, argv: list[str], cwd: Path, env: dict[str, str], log_path: Path, ready_url: str,
                 timeout_s: float):
        self.name = name
        self.log_path = log_path
        self._log = log_path.open("ab")
        self.process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        try:
            self._wait_ready(ready_url, timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, url: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"{self.name} did not answer {url} within {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self._log.close()


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
