"""A memoising cache bounded in the size of what it keeps, not only in its number of entries.

The analysis of a statement is cached by its text, for the BI tools that send the same
statements again and again. ``functools.lru_cache`` bounds entries only: 4,096 parse trees
of 4 MiB statements are gigabytes, which one client could fill with distinct statements
(each kept tree of a 120 KB statement took ~36 MB), and every garbage collection then walks
them all while the event loop waits. :func:`sized_cache` bounds the total ``weight`` (bytes
of text and parse tree) as well, and does not keep an entry heavier than a sixteenth of it:
a long statement is analysed again if it comes again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Callable, Generic, TypeVar

__all__ = ["SizedCache", "sized_cache"]

R = TypeVar("R")


class SizedCache(Generic[R]):
    """``function`` memoised by its positional arguments, least recently used first out.

    At most ``max_entries`` entries of at most ``max_weight`` total weight; ``weight(result,
    *args)`` is an entry's. Exceptions are not cached. Safe to call from several threads
    (long statements are analysed in threads); two threads may compute one entry at once.
    """

    def __init__(
        self,
        function: Callable[..., R],
        max_entries: int,
        max_weight: int,
        weight: Callable[..., int],
    ):
        self._function = function
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._weight_of = weight
        self._entries: OrderedDict[tuple[Hashable, ...], tuple[R, int]] = OrderedDict()
        self._weight = 0
        self._lock = threading.Lock()
        self.__wrapped__ = function
        self.__doc__ = function.__doc__

    def __call__(self, *args: Hashable) -> R:
        with self._lock:
            entry = self._entries.get(args)
            if entry is not None:
                self._entries.move_to_end(args)
                return entry[0]
        result = self._function(*args)
        weight = self._weight_of(result, *args)
        if weight > self._max_weight // 16:
            return result
        with self._lock:
            if args not in self._entries:
                self._entries[args] = (result, weight)
                self._weight += weight
            while len(self._entries) > self._max_entries or self._weight > self._max_weight:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._weight -= dropped
        return result

    @property
    def weight(self) -> int:
        """The total weight of the entries kept now."""
        return self._weight

    def __len__(self) -> int:
        return len(self._entries)

    def cache_clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._weight = 0


def sized_cache(
    max_entries: int, max_weight: int, weight: Callable[..., int]
) -> Callable[[Callable[..., R]], SizedCache[R]]:
    """Decorate a function with a :class:`SizedCache` (positional arguments only)."""

    def decorate(function: Callable[..., R]) -> SizedCache[R]:
        return SizedCache(function, max_entries, max_weight, weight)

    return decorate
