"""A wait that a CancelRequest may end, as PostgreSQL ends a statement waiting for a lock."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

__all__ = ["CancellableWait"]

_T = TypeVar("_T")


class CancellableWait:
    """One wait at a time (a pool checkout, a long statement's analysis) before anything of the
    statement reached the backend: ``cancel`` ends it, and the waiter raises ``error()``
    (57014). A task cancelled itself (its session ending) is cancelled as always."""

    def __init__(self) -> None:
        self._wait: asyncio.Future[Any] | None = None
        self._cancelled = False

    async def wait(self, awaitable: Awaitable[_T], error: Callable[[], Exception]) -> _T:
        wait = self._wait = asyncio.ensure_future(awaitable)
        try:
            return await wait
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._cancelled or (current is not None and current.cancelling()):
                raise  # the session itself is being ended
            raise error() from None
        finally:
            self._wait = None
            self._cancelled = False

    def cancel(self) -> bool:
        """End the wait under way, if any; False when there is none to end."""
        wait = self._wait
        if wait is not None and wait.cancel():
            self._cancelled = True
            return True
        return False
