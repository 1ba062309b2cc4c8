"""Send a DP answer only at a whole multiple of a fixed quantum after dpproxy began answering it.

How long the backend takes to compute an exact aggregate depends on the rows (how many a
filter keeps, which plan runs), and the ε accounting does not cover that. With a table's
``answer_quantum_ms`` set to q, every outcome of a DP statement on it (the answer, a refusal
or an error) leaves after q·⌈t/q⌉, where t is the time it took: an answer within q always
leaves at q, so its arrival says nothing about the rows, and a slower one says only which
multiple of q it needed. This is the padding defence of Haeberlen, Pierce and Narayan,
"Differential Privacy Under Fire" (2011), coarsened to a quantum so that a statement that
runs long is still answered; it narrows the timing channel, it does not close it.
"""

from __future__ import annotations

import asyncio
import math
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

__all__ = ["on_the_quantum", "quantum_deadline"]


def quantum_deadline(started: float, now: float, quantum_s: float) -> float:
    """The first whole multiple of ``quantum_s`` after ``started`` that is not before ``now``
    (at least one quantum), on the same clock."""
    return started + quantum_s * max(1, math.ceil((now - started) / quantum_s))


@asynccontextmanager
async def on_the_quantum(quantum_ms: int) -> AsyncIterator[float]:
    """Hold whatever the block returns or raises until :func:`quantum_deadline` (0: no wait).
    The block gets the time the quantum counts from (``time.monotonic()``).

    What the wait holds stays held: the caller keeps its backend connection and stores its
    answer for repeats only once the wait is over, since another session could see either
    change as soon as it happened, and so when the rows had been computed.

    A cancellation (the session ending) is not held.
    """
    started = time.monotonic()
    if quantum_ms <= 0:
        yield started
        return
    try:
        yield started
    except Exception:
        await _until(quantum_deadline(started, time.monotonic(), quantum_ms / 1000))
        raise
    await _until(quantum_deadline(started, time.monotonic(), quantum_ms / 1000))


async def _until(deadline: float) -> None:
    # The loop's timers may fire up to its clock's resolution early (uvloop's: a millisecond),
    # by an amount that depends on when the rows were computed: sleep again for what is left.
    while (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(left)
