"""What a serving process knows of its siblings when ``listen.workers`` > 1.

``dpproxy serve`` with ``listen.workers: N`` runs a supervisor (``proxy.serving.supervisor``)
and N worker processes, each a whole dpproxy ``Server`` listening on the same port with
SO_REUSEPORT, so that the kernel spreads new connections over them. Each worker has its own
event loop, backend pool and budget reservations; they share, through the group's private
directory (mode 0700, made by the supervisor):

* the ledger, as replicas do (``ledger.url``; docs/deployment.md, "Replicas sharing the ledger");
* the repeat store, a SQLite file (``proxy.dp.repeats.SharedRepeatCache``), so a repeat is
  answered alike whichever worker serves it;
* CancelRequests: a session's BackendKeyData pid carries its worker's number in its top bits
  (``session_pid``), and a worker that gets a CancelRequest for another worker's session
  passes the (pid, secret) pair to that worker's unix socket (``CancelRelay``), where the
  secret is checked as for its own clients;
* budget reservations: ``SHOW dpproxy.budget`` on one worker asks the others, through their
  unix sockets (``ReservationRelay``), to give their unused reservation of the user back to the
  ledger first, so that what it shows as spent was spent;
* Prometheus metrics, written by each worker to files in the directory and served by the
  supervisor (prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket
import struct
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Final

__all__ = ["CancelRelay", "MAX_WORKERS", "READY", "ReservationRelay", "SupervisorLink", "WorkerRole", "session_pid", "worker_of"]

log = logging.getLogger("dpproxy.workers")

MAX_WORKERS: Final = 64  # listen.workers' upper bound: the worker number takes 6 of the pid's 31 bits
_LOCAL_BITS: Final = 24
_CANCEL: Final = struct.Struct("!ii")
READY: Final = b"ready "  # a worker's first words to its supervisor, then its database's name


@dataclass(frozen=True)
class WorkerRole:
    """Worker ``index`` (0 to N-1) of a group whose shared files are in ``directory``."""

    index: int
    directory: Path

    def cancel_socket(self, index: int | None = None) -> Path:
        """The unix socket where worker ``index`` (default: this one) takes forwarded cancels."""
        return self.directory / f"cancel-{self.index if index is None else index}.sock"

    def reservation_socket(self, index: int | None = None) -> Path:
        """The unix socket where worker ``index`` (default: this one) gives reservations back."""
        return self.directory / f"budget-{self.index if index is None else index}.sock"

    def sibling_reservation_sockets(self) -> list[Path]:
        """The reservation sockets of the other workers running now."""
        own = self.reservation_socket()
        return sorted(path for path in self.directory.glob("budget-*.sock") if path != own)

    @property
    def repeats_path(self) -> Path:
        return self.directory / "repeats.sqlite3"

    @property
    def metrics_directory(self) -> Path:
        return self.directory / "metrics"


def session_pid(worker: int | None) -> int:
    """A fresh BackendKeyData pid: 31 random bits alone, or a worker's number and 24 random bits.

    The pid only routes a CancelRequest; the 31-bit secret beside it is what authorises one.
    """
    if worker is None:
        return secrets.randbelow(2**31 - 1) + 1
    return (worker << _LOCAL_BITS) | (secrets.randbelow(2**_LOCAL_BITS - 1) + 1)


def worker_of(pid: int) -> int:
    """The worker whose session has BackendKeyData ``pid`` (made by ``session_pid``)."""
    return pid >> _LOCAL_BITS


class _WorkerSocket(ABC):
    """A unix socket of this worker's where its siblings connect, each connection handled by
    the subclass's ``_receive``; removed on ``close``."""

    def __init__(self, path: Path):
        self._path = path
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._path.unlink(missing_ok=True)  # left by a crashed predecessor with this index
        self._server = await asyncio.start_unix_server(self._receive, path=str(self._path))

    @abstractmethod
    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Handle one sibling's connection, and close it."""

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._path.unlink(missing_ok=True)


class CancelRelay(_WorkerSocket):
    """A worker's unix socket for cancels forwarded by its siblings, and the way to forward one.

    Like PostgreSQL's own CancelRequest, nothing is answered: the sender learns nothing of
    whether the key named a session or the secret matched.
    """

    def __init__(self, role: WorkerRole, cancel_here: Callable[[int, int], Awaitable[None]]):
        super().__init__(role.cancel_socket())
        self.role = role
        self._cancel_here = cancel_here

    async def forward(self, pid: int, secret: int) -> None:
        """Pass a CancelRequest to the worker that owns ``pid`` (if there is such a worker)."""
        owner = worker_of(pid)
        if owner == self.role.index:
            return
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.role.cancel_socket(owner)))
        except OSError:
            return  # no such worker (a forged pid), or it is restarting: the session is gone too
        try:
            writer.write(_CANCEL.pack(pid, secret))
            await writer.drain()
            log.info("cancel request passed on to worker %d, which serves that session", owner)
        except OSError:
            pass
        finally:
            writer.close()

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            pid, secret = _CANCEL.unpack(await reader.readexactly(_CANCEL.size))
            await self._cancel_here(pid, secret)
        except (asyncio.IncompleteReadError, OSError):
            pass
        finally:
            writer.close()


_NAME_LENGTH: Final = struct.Struct("!H")
_GIVEN_BACK: Final = b"\x01"
SIBLING_WAIT_S: Final = 5.0
"""How long ``ReservationRelay.settle_siblings`` waits for each sibling; one that does not answer
in time keeps its reservation, which the ledger then still counts as spent."""


class ReservationRelay(_WorkerSocket):
    """A worker's unix socket where its siblings ask it to give a user's unused budget
    reservation back to the ledger, and the way to ask them.

    Each worker spends reservations charged to the shared ledger from memory; the ledger counts
    them as spent until they are given back. Before ``SHOW dpproxy.budget`` reads the ledger, the
    worker answering it asks every sibling to give the user's reservation back and waits for
    each to say it did (or for ``SIBLING_WAIT_S``), so the spend it reports is the real one. A
    sibling's next answer for that user reserves afresh.
    """

    def __init__(self, role: WorkerRole, give_back: Callable[[str], Awaitable[None]]):
        super().__init__(role.reservation_socket())
        self.role = role
        self._give_back = give_back

    async def settle_siblings(self, user: str) -> None:
        """Have every other worker give ``user``'s unused reservation back (at most
        ``SIBLING_WAIT_S`` each, all at once)."""
        siblings = self.role.sibling_reservation_sockets()
        if siblings:
            await asyncio.gather(*(self._ask(path, user) for path in siblings))

    async def _ask(self, path: Path, user: str) -> None:
        name = user.encode("utf-8")
        try:
            async with asyncio.timeout(SIBLING_WAIT_S):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    writer.write(_NAME_LENGTH.pack(len(name)) + name)
                    await writer.drain()
                    await reader.readexactly(len(_GIVEN_BACK))
                finally:
                    writer.close()
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.warning("worker socket %s did not give back %s's reservation (%s): it stays counted as spent",
                        path.name, user, exc or type(exc).__name__)

    async def _receive(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            (length,) = _NAME_LENGTH.unpack(await reader.readexactly(_NAME_LENGTH.size))
            user = (await reader.readexactly(length)).decode("utf-8")
            await self._give_back(user)
            writer.write(_GIVEN_BACK)
            await writer.drain()
        except (asyncio.IncompleteReadError, OSError, UnicodeDecodeError):
            pass
        finally:
            writer.close()


class SupervisorLink:
    """A worker's end of the socket pair its supervisor made (``--link-fd``).

    The worker says when it listens (``ready``); the supervisor never writes, so the end
    becoming readable means it closed: the supervisor is gone and the worker should stop.
    """

    def __init__(self, fd: int):
        self._sock = socket.socket(fileno=fd)

    def ready(self, database: str) -> None:
        self._sock.sendall(READY + database.encode("utf-8") + b"\n")

    def watch(self, loop: asyncio.AbstractEventLoop, gone: Callable[[], None]) -> None:
        """Call ``gone`` (once) when the supervisor's end closes."""

        def readable() -> None:
            loop.remove_reader(self._sock.fileno())
            log.warning("the supervisor is gone: stopping")
            gone()

        loop.add_reader(self._sock.fileno(), readable)
