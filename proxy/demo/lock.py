"""One ``dpproxy demo`` per data directory.

A second demo on the directory of a running one would rewrite its ``policy.yaml`` (with its
own port) under it and share its PostgreSQL, stopping it on the way out. Each demo holds an
exclusive ``flock`` on ``demo.lock`` in the directory while it runs; the kernel drops the lock
when the process ends however it ends, so a demo killed with -9 leaves no stale lock behind
(the next one takes over its orphaned PostgreSQL, as before).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from proxy.serving.startup import StartupError, os_reason

__all__ = ["DemoLock"]

LOCK_FILE = "demo.lock"


class DemoLock:
    """The exclusive hold of one demo on its data directory, until ``release`` (or exit)."""

    def __init__(self, data_dir: Path):
        """Take the lock; StartupError naming the running demo's PID if another demo holds it."""
        path = data_dir / LOCK_FILE
        try:
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StartupError(f"cannot create the demo's lock file {path}: {os_reason(exc)}",
                               hint="choose another --data-dir") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip()
            os.close(self._fd)
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise StartupError(f"a dpproxy demo is already running on the data directory {data_dir}{who}",
                               hint="stop that demo first, or choose another --data-dir") from exc
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode("ascii"), 0)

    def release(self) -> None:
        """Let the next demo have the directory (closing the file drops the lock)."""
        os.close(self._fd)
