"""Repeated DP queries get their earlier noisy answer back, at no cost.

Averaging many noisy answers to the same query would shrink the noise; answering a repeat
with the stored answer defeats that and saves budget. A repeat is the same user, the same
rewritten backend SQL (sqlglot's normal form, so spacing and case do not matter) and
aggregates, the same session settings (a date literal reads differently under another
DateStyle), the same parameter values and the same ε, within the TTL; the executor makes
the key. ``RepeatCache`` keeps them in the
process; ``SharedRepeatCache`` in a SQLite file that the workers of one ``dpproxy serve``
share (``listen.workers``). Replicas do not share a store, which costs budget but never
privacy (every fresh answer is charged).
"""

from __future__ import annotations

import hashlib
import pickle
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from typing import Generic, Hashable, Protocol, TypeVar

__all__ = ["RepeatCache", "RepeatStore", "SharedRepeatCache"]

V = TypeVar("V")


class RepeatStore(Protocol[V]):
    """Where released answers are kept for their repeats; settings may change on reload."""

    enabled: bool
    ttl_s: float
    max_entries: int

    def get(self, key: Hashable) -> V | None: ...

    def put(self, key: Hashable, value: V) -> None: ...

    def close(self) -> None: ...


class RepeatCache(Generic[V]):
    """A bounded, time-limited map from a query's identity to its released answer.

    Keys are kept as their SHA-256 digests (as in ``SharedRepeatCache``): a key holds the
    statement and its parameter values, up to a protocol message each (16 MiB), and
    ``max_entries`` of them kept whole could take more memory than the host has.
    """

    def __init__(self, ttl_s: float, max_entries: int, enabled: bool = True):
        self.enabled = enabled
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, tuple[float, V]] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        if not self.enabled:
            return None
        key = _digest(key)
        entry = self._entries.get(key)
        if entry is None:
            return None
        stored_at, value = entry
        if time.monotonic() - stored_at > self.ttl_s:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: Hashable, value: V) -> None:
        if not self.enabled:
            return
        key = _digest(key)
        self._entries[key] = (time.monotonic(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def close(self) -> None:
        self._entries.clear()


class SharedRepeatCache(Generic[V]):
    """A repeat store in a SQLite file that several processes of one user account share.

    Keys are hashed (SHA-256 of their pickle) and values pickled: the file lives in the
    worker group's private directory (mode 0700) and holds only released answers. It is a
    cache, written without fsync: what a crash loses costs budget, never privacy. When it
    holds more than ``max_entries`` the oldest go first (by when stored, not when last
    read, unlike ``RepeatCache``: a read does not write). Reads and writes run on the caller's
    thread and take tens of microseconds; a write waits up to a second for another
    process's write to finish, and a store that cannot be used answers nothing (a miss).
    """

    _TRIM_EVERY = 64  # puts between two trims to max_entries

    def __init__(self, path: Path, ttl_s: float, max_entries: int, enabled: bool = True):
        self.enabled = enabled
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._db = sqlite3.connect(str(path), timeout=1.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute("CREATE TABLE IF NOT EXISTS repeats (key BLOB PRIMARY KEY, stored REAL NOT NULL, "
                         "value BLOB NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS repeats_stored ON repeats (stored)")
        self._puts = 0

    def get(self, key: Hashable) -> V | None:
        if not self.enabled:
            return None
        try:
            row = self._db.execute("SELECT stored, value FROM repeats WHERE key = ?", (_digest(key),)).fetchone()
        except sqlite3.Error:
            return None
        if row is None or time.monotonic() - row[0] > self.ttl_s:
            return None
        value: V = pickle.loads(row[1])
        return value

    def put(self, key: Hashable, value: V) -> None:
        if not self.enabled:
            return
        try:
            self._db.execute("INSERT OR REPLACE INTO repeats VALUES (?, ?, ?)",
                             (_digest(key), time.monotonic(), pickle.dumps(value, pickle.HIGHEST_PROTOCOL)))
            self._puts += 1
            if self._puts % self._TRIM_EVERY == 0:
                self._trim()
        except sqlite3.Error:
            pass  # not stored: a repeat of it is answered afresh, and charged

    def _trim(self) -> None:
        self._db.execute("DELETE FROM repeats WHERE stored < ?", (time.monotonic() - self.ttl_s,))
        self._db.execute("DELETE FROM repeats WHERE key IN (SELECT key FROM repeats ORDER BY stored DESC "
                         "LIMIT -1 OFFSET ?)", (self.max_entries,))

    def close(self) -> None:
        self._db.close()


def _digest(key: Hashable) -> bytes:
    return hashlib.sha256(pickle.dumps(key, pickle.HIGHEST_PROTOCOL)).digest()
