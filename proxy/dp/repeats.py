"""Repeated DP queries get their earlier noisy answer back, at no cost.

Averaging many noisy answers to the same query would shrink the noise; answering a repeat
with the stored answer defeats that and saves budget. A repeat is the same user, the same
rewritten backend SQL (sqlglot's normal form, so spacing and case do not matter), the same
parameter values and the same ε, within the TTL. The store is per proxy process: replicas
do not share it, which costs budget but never privacy (every fresh answer is charged).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

__all__ = ["RepeatCache"]

V = TypeVar("V")


class RepeatCache(Generic[V]):
    """A bounded, time-limited map from a query's identity to its released answer."""

    def __init__(self, ttl_s: float, max_entries: int, enabled: bool = True):
        self.enabled = enabled
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()

    def get(self, key: Hashable) -> V | None:
        if not self.enabled:
            return None
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
        self._entries[key] = (time.monotonic(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
