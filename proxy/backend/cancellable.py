"""A wait that a CancelRequest may end, as PostgreSQL ends a statement waiting for a lock."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, TypeVar

from .errors import ClientGone

__all__ = ["CancellableWait"]

_T = TypeVar("_T")


class CancellableWait:
    """One wait at a time (a pool checkout, a long statement's analysis) before anything of the
    statement reached the backend: ``cancel`` ends it, and the waiter raises ``error()``
    (57014). A task cancelled itself (its session ending) is cancelled as always.

    What the wait produced but its waiter never takes (the waiter was cancelled just as it came,
    or the client went away) is handed to ``give_back``: a pooled connection checked out for a
    session being ended goes back to the pool instead of staying counted in use for good.
    """

    def __init__(self) -> None:
        self._wait: asyncio.Future[Any] | None = None
        self._cancelled = False

    async def wait(self, awaitable: Awaitable[_T], error: Callable[[], Exception], *,
                   give_back: Callable[[_T], None] | None = None,
                   client_gone: Callable[[], Awaitable[None]] | None = None) -> _T:
        """``awaitable``'s result. With ``client_gone`` (it returns when the client's connection
        ends) the wait also ends when the client goes away first, with ``ClientGone``."""
        wait = self._wait = asyncio.ensure_future(awaitable)
        watch = asyncio.ensure_future(client_gone()) if client_gone is not None else None
        taken = False
        try:
            if watch is not None:
                await asyncio.wait((wait, watch), return_when=asyncio.FIRST_COMPLETED)
                if watch.done() and not watch.cancelled() and watch.exception() is None:
                    # Gone, even if a result came in the same turn: nobody would read the answer.
                    raise ClientGone("the client closed its connection while its statement waited")
            result = await wait
            taken = True
            return result
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not self._cancelled or (current is not None and current.cancelling()):
                raise  # the session itself is being ended
            raise error() from None
        finally:
            if not taken:
                _orphan(wait, give_back)
            self._wait = None
            self._cancelled = False
            if watch is not None and not watch.done():
                # Ended before the session reads on: a read of the client still pending when
                # the session reads its next message is an error of the stream's.
                watch.cancel()
                await asyncio.wait((watch,))

    def cancel(self) -> bool:
        """End the wait under way, if any; False when there is none to end."""
        wait = self._wait
        if wait is not None and wait.cancel():
            self._cancelled = True
            return True
        return False


def _orphan(wait: asyncio.Future[_T], give_back: Callable[[_T], None] | None) -> None:
    """See that a result of ``wait`` its waiter will not take reaches ``give_back``: ``wait`` is
    cancelled if it still runs, and a result it has already (or ends with in spite of the
    cancel) is given back."""
    def settle(done: asyncio.Future[_T]) -> None:
        if done.cancelled() or done.exception() is not None:
            return  # exception() also marks a failure as seen: nobody is left to raise it to
        if give_back is not None:
            give_back(done.result())

    if wait.done():
        settle(wait)
    else:
        wait.cancel()
        wait.add_done_callback(settle)
