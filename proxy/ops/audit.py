"""The audit log: one JSON line per statement, and nothing a query could leak through it.

Contract
--------
* ``AuditLog.record`` writes one line per ``AuditEntry``: when, who, from where, which
  statement (a fingerprint, never the text), what dpproxy decided and why, what it charged,
  what remains and how long it took. No result, exact value or statement text is ever
  written: an ``AuditEntry`` has no field that could hold one.
* Without a path (``audit.path`` absent from the policy) each line is logged at INFO on
  the ``dpproxy.audit`` logger, which the CLI prints to stderr. With a path, lines are
  appended to that file, line-buffered.
* ``record`` never blocks on I/O and never raises for I/O: lines go through a bounded
  queue to a writer thread, which writes them in batches (a line reaches the file within
  ``BATCH_S``, 20 ms, of its statement); an ``OSError`` while writing or reopening is logged on the
  ``dpproxy`` logger (once per streak of failures) and the statement is unaffected. When
  the queue is full (the disk has stalled) lines are dropped and counted.
* ``reopen`` (for SIGHUP, after logrotate moved the file) makes the writer reopen the
  path; if that fails it keeps writing to the file it had. ``close`` writes what is
  queued and closes the file; call it at shutdown.

Example line::

    {"at":"2024-05-01T12:00:00.123Z","user":"analyst","client":"127.0.0.1:51234",
     "fingerprint":"c070ef2fc9bbfb16","decision":"dp","reason":null,"epsilon":1.0,
     "delta":0.0,"remaining_epsilon":999.0,"remaining_delta":0.5,"latency_ms":12.402,"rows":null,
     "mechanisms":["laplace","sum_count"]}

(on one line). Non-finite amounts (an ``inf`` budget) are written as ``null``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Final, Literal, get_args

from pglast.parser import ParseError, scan

from policies.model import AuditConfig

__all__ = ["AuditDecision", "AuditEntry", "AuditLog", "fingerprint", "timestamp"]

AuditDecision = Literal["dp", "passthrough", "command", "refused", "error"]

AUDIT_LOGGER: Final = "dpproxy.audit"
QUEUE_LINES: Final = 10_000
BATCH_S: Final = 0.02
"""How long the writer lets lines gather after the first one before writing them all."""

_audit = logging.getLogger(AUDIT_LOGGER)
log = logging.getLogger("dpproxy")

_FINGERPRINT_HEX: Final = 16
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_COMMENTS: Final = frozenset({"SQL_COMMENT", "C_COMMENT"})


@dataclass(frozen=True)
class AuditEntry:
    """What the audit log records about one statement, and nothing else.

    ``at`` is when the statement ended, in POSIX seconds (written as UTC ISO 8601 with
    milliseconds: formatting waits for the writer thread). ``reason`` is the refusal rule or
    SQLSTATE (None when the statement was answered).
    The four amounts are None unless the statement was a DP query; ``epsilon``/``delta``
    are what was charged, ``remaining_*`` what the user has left after the charge.
    ``rows`` is how many rows a passthrough statement handed the client (None for others).
    ``mechanisms`` names the mechanism that released each column of a DP answer, in the
    order released (``proxy.serving.executor.released_mechanisms``; None for other statements):
    the names only, never a value. It was added last, so that readers of the older lines'
    fields are unaffected.
    A result passed on as it arrives is recorded when it ends, with its outcome: ``error``
    and the SQLSTATE of an error that ended it part-way (08006: the session ended first).
    """

    at: float
    user: str
    client: str
    fingerprint: str
    decision: AuditDecision
    reason: str | None
    epsilon: float | None
    delta: float | None
    remaining_epsilon: float | None
    remaining_delta: float | None
    latency_ms: float
    rows: int | None = None
    mechanisms: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.decision not in _DECISIONS:
            raise ValueError(f"unknown audit decision {self.decision!r}")

    def to_json(self) -> str:
        """The entry as one compact JSON object, fields in declaration order."""
        values = dict(self.__dict__)  # declaration order
        values["at"] = timestamp(datetime.fromtimestamp(self.at, timezone.utc))
        values["latency_ms"] = round(self.latency_ms, 3)
        for name in _AMOUNTS:
            if values[name] is not None and not math.isfinite(values[name]):
                values[name] = None
        return _ENCODER.encode(values)


_DECISIONS: Final = frozenset(get_args(AuditDecision))
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_AMOUNTS: Final = ("epsilon", "delta", "remaining_epsilon", "remaining_delta", "latency_ms")


def timestamp(when: datetime | None = None) -> str:
    """``when`` (default: now) as a UTC ISO 8601 time with milliseconds, e.g. ``...T12:00:00.123Z``."""
    when = datetime.now(timezone.utc) if when is None else when.astimezone(timezone.utc)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fingerprint(text: str, scannable: bool = True) -> str:
    """A stable 16-hex-digit hash identifying a statement; literals are kept, so
    ``age > 40`` and ``age > 41`` differ.

    The text is split into PostgreSQL tokens (pglast's scanner), then normalised:
    whitespace between tokens and comments are dropped, keywords and unquoted identifiers
    are ASCII-lowercased (as PostgreSQL folds them), and trailing semicolons are dropped.
    String, numeric and bit constants, quoted identifiers and parameters are kept exactly.
    Text the scanner rejects (an unterminated quote), or that the caller says would take too
    long to scan (``scannable`` False: rewriter.limits.check_text refuses it unparsed), is
    hashed with its whitespace runs collapsed instead.
    """
    tokens = None
    if scannable:
        try:
            tokens = scan(text)
        except ParseError:
            pass
    if tokens is None:
        normalised = " ".join(text.split())
    else:
        words = []
        for token in tokens:
            if token.name in _COMMENTS:
                continue
            word = text[token.start : token.end + 1]
            if token.kind != "NO_KEYWORD" or (token.name == "IDENT" and not word.startswith('"')):
                word = word.translate(_ASCII_LOWER)
            words.append(word)
        while words and words[-1] == ";":
            words.pop()
        normalised = " ".join(words)
    return hashlib.sha256(normalised.encode("utf-8")).hexdigest()[:_FINGERPRINT_HEX]


class _Reopen:
    """Queue marker: reopen the file before the next line."""


class AuditLog:
    """Where audit lines go: the ``dpproxy.audit`` logger, or a file appended to by a thread."""

    def __init__(self, path: str | Path | None = None) -> None:
        """Log to ``dpproxy.audit`` (``path`` None) or append to ``path``.

        The file is opened here, so an unusable path raises OSError at startup rather
        than losing lines later.
        """
        self.path = None if path is None else Path(path)
        self.dropped = 0
        self._failing = False
        self._file: IO[bytes] | None = None
        # Entries are serialised by the writer, in batches: the event loop only appends to
        # the deque (atomic) and wakes the writer when it may be asleep.
        self._pending: deque[AuditEntry | _Reopen] = deque()
        self._wake = threading.Event()
        self._closing = False
        self._thread: threading.Thread | None = None
        if self.path is not None:
            self._file = _open(self.path)
            self._thread = threading.Thread(target=self._write_lines, name="dpproxy-audit", daemon=True)
            self._thread.start()

    @classmethod
    def from_config(cls, config: AuditConfig) -> AuditLog:
        """The audit log a policy's ``audit`` section asks for."""
        return cls(config.path)

    def record(self, entry: AuditEntry) -> None:
        """Write ``entry`` as one JSON line; never blocks on I/O, never raises OSError."""
        if self._thread is None:  # no path, or closed: the logger rather than losing the line
            _audit.info(entry.to_json())
            return
        self._put(entry)

    def reopen(self) -> None:
        """Reopen the file at ``path`` before the next line (after log rotation)."""
        if self._thread is not None:
            self._put(_Reopen())

    def close(self) -> None:
        """Write every queued line, then close the file; ``record`` must not follow."""
        if self._thread is None:
            return
        self._closing = True
        self._wake.set()
        self._thread.join()
        self._thread = None

    def _put(self, item: AuditEntry | _Reopen) -> None:
        if len(self._pending) >= QUEUE_LINES:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % QUEUE_LINES == 0:
                log.error("audit log %s is not keeping up: %d lines dropped", self.path, self.dropped)
            return
        self._pending.append(item)
        if not self._wake.is_set():
            self._wake.set()

    def _write_lines(self) -> None:
        while True:
            self._wake.wait()
            if not self._closing:
                # Let a batch gather: one wake-up, GIL hand-off and write per batch, not per statement.
                time.sleep(BATCH_S)
            self._wake.clear()  # before draining, so an entry appended meanwhile wakes us again
            closing = self._closing
            self._drain()
            if closing:
                break
        self._close_file()
        self._file = None

    def _drain(self) -> None:
        """Write every pending entry, one write call per run of lines (one flush each)."""
        lines: list[str] = []
        while self._pending:
            item = self._pending.popleft()
            if isinstance(item, _Reopen):
                self._write(lines)
                lines = []
                self._reopen()
            else:
                lines.append(item.to_json() + "\n")
        self._write(lines)

    def _write(self, lines: list[str]) -> None:
        if not lines or self._file is None:
            return
        try:
            _write_all(self._file, "".join(lines).encode("utf-8"))
        except OSError as exc:
            self._failed(exc)
        else:
            self._recovered()

    def _reopen(self) -> None:
        assert self.path is not None
        try:
            new = _open(self.path)
        except OSError as exc:
            self._failed(exc)
            return
        self._close_file()
        self._file = new
        self._recovered()

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if not self._failing:
            log.error("audit log %s: %s (further errors are not logged until it recovers)", self.path, exc)
        self._failing = True

    def _recovered(self) -> None:
        if self._failing:
            log.warning("audit log %s: writing again", self.path)
        self._failing = False


def _write_all(file: IO[bytes], data: bytes) -> None:
    view = memoryview(data)
    while view:  # a regular file takes it all in one call, or raises (the disk is full)
        written = file.write(view)
        if not written:
            raise OSError(f"wrote nothing of {len(view)} bytes")
        view = view[written:]


def _open(path: Path) -> IO[bytes]:
    # Unbuffered, in append mode: each batch is one write(2) at the end of the file, which
    # the workers of a group (listen.workers) appending to one file cannot interleave.
    return open(path, "ab", buffering=0)
