"""The event loop dpproxy runs on: uvloop where it is installed, asyncio's own otherwise.

uvloop runs the loop's scheduling, selector and socket transports in C; measured with
``python -m benchmarks.pyspy`` it serves ~12 % more DP queries per second of CPU than
asyncio's pure-Python loop. It does not exist for Windows, where asyncio's loop is used.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Coroutine, TypeVar

_factory: Callable[[], asyncio.AbstractEventLoop]
try:
    from uvloop import new_event_loop as _factory
except ImportError:  # pragma: no cover - only where uvloop has no build (Windows)
    _factory = asyncio.new_event_loop

__all__ = ["new_event_loop", "run"]

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the kind dpproxy serves on."""
    return _factory()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to completion on a new loop (as ``asyncio.run`` does), then close it."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)
