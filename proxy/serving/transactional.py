"""A setting dpproxy keeps itself, with the transaction semantics of a PostgreSQL setting.

PostgreSQL undoes a SET made in a transaction block that is rolled back (or in a savepoint
rolled back to), keeps SET LOCAL until the end of the transaction, and at commit keeps the
last session-level SET of the block (SET LOCAL after it, or before it, does not change that).
``TransactionalValue`` follows those rules for a value held in dpproxy rather than on the
backend; its owner tells it of each transaction event once the backend has carried it out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["TransactionalValue"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class _Frame(Generic[_T]):
    """What the value was when a transaction (``name`` None) or a savepoint began."""

    name: str | None
    session: _T
    local: tuple[_T] | None


class TransactionalValue(Generic[_T]):
    """A session setting's value: ``session`` (what a commit keeps) and a SET LOCAL over it."""

    def __init__(self, default: _T):
        self._session = default
        self._local: tuple[_T] | None = None  # a SET LOCAL's value, until the transaction ends
        self._frames: list[_Frame[_T]] = []  # the transaction's start, then each open savepoint

    @property
    def value(self) -> _T:
        """The value in force: the transaction's SET LOCAL, else the session's."""
        return self._local[0] if self._local is not None else self._session

    @property
    def in_block(self) -> bool:
        return bool(self._frames)

    @property
    def savepoints(self) -> int:
        """How many savepoints of the transaction are open (each keeps a frame)."""
        return max(0, len(self._frames) - 1)

    def set(self, value: _T, local: bool = False) -> bool:
        """SET (or SET LOCAL) the value; False for a SET LOCAL outside a transaction, which
        changes nothing (PostgreSQL warns)."""
        if local:
            if not self._frames:
                return False
            self._local = (value,)
        else:
            self._session = value
            self._local = None
        return True

    def begin(self) -> None:
        """A transaction block began (nothing if one is open already)."""
        if not self._frames:
            self._frames.append(_Frame(None, self._session, None))

    def commit(self) -> None:
        self._frames.clear()
        self._local = None

    def rollback(self) -> None:
        if self._frames:
            self._session = self._frames[0].session
        self.commit()

    def savepoint(self, name: str) -> None:
        if self._frames:
            self._frames.append(_Frame(name, self._session, self._local))

    def release(self, name: str) -> None:
        """RELEASE SAVEPOINT ``name``: it and every savepoint after it end, their changes kept."""
        index = self._savepoint(name)
        if index is not None:
            del self._frames[index:]

    def rollback_to(self, name: str) -> None:
        """ROLLBACK TO SAVEPOINT ``name``: the value it had then; the savepoint stays."""
        index = self._savepoint(name)
        if index is not None:
            frame = self._frames[index]
            self._session, self._local = frame.session, frame.local
            del self._frames[index + 1:]

    def _savepoint(self, name: str) -> int | None:
        """The newest savepoint of that name (PostgreSQL's choice among namesakes)."""
        for index in range(len(self._frames) - 1, 0, -1):
            if self._frames[index].name == name:
                return index
        return None
