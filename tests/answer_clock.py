"""The clock of quantised DP answers, read in the test process: when dpproxy began each answer
and when its computation ended, so that a timing test can assert the multiple of the quantum
the answer needed rather than a fixed one.

``answer_quantum_ms`` promises that an answer leaves at q·⌈t/q⌉ after dpproxy began it, t the
time it took (proxy/dp/answer_time.py). On an idle machine a fast statement takes a few ms, so
t < q and the answer leaves at q; on a loaded one (CI: both cores busy, the disk syncing) the
same statement can take longer than q and then rightly leaves at 2q. A test that asserts
``q <= took < 2q`` fails there on a stall, not on dpproxy. Asserting that the client has the
answer between k·q and (k+1)·q after dpproxy began it, with k the multiple the computation
needed, both read from dpproxy's own clock, keeps both halves of what such a test pins: an
answer that left before its multiple (not held) or at a later one (held longer than the rows
needed) still fails it.

The proxies of RunningProxy run in the test process, so their ``time.monotonic()`` is the
test's; answers of other processes (tests/test_workers.py's workers) are not seen.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

import proxy.serving.executor as executor
from proxy.dp.answer_time import on_the_quantum


@dataclass(frozen=True)
class HeldAnswer:
    """One quantised DP outcome (answer or error): when dpproxy began it and when its
    computation ended, on ``time.monotonic()``."""

    started: float
    computed: float
    quantum_s: float

    @property
    def quanta(self) -> int:
        """The multiple of the quantum this outcome must leave at: ⌈t/q⌉, at least 1."""
        return max(1, math.ceil((self.computed - self.started) / self.quantum_s))


class AnswerClock:
    """The quantised outcomes dpproxy held while the clock was on, in the order they began."""

    def __init__(self) -> None:
        self.answers: list[HeldAnswer] = []

    def last(self) -> HeldAnswer:
        assert self.answers, "no quantised DP answer was held"
        return max(self.answers, key=lambda answer: answer.started)

    @staticmethod
    def assert_left_at_its_multiple(arrived: float, answer: HeldAnswer, what: object = None) -> None:
        """The client had ``answer`` at ``arrived`` (``time.monotonic()`` once it was read): at
        least the multiple of the quantum its computation needed after dpproxy began it, and
        before the next one. Held, and held no longer than the rows made necessary."""
        k = answer.quanta
        after = arrived - answer.started
        assert k * answer.quantum_s <= after < (k + 1) * answer.quantum_s, (what, after, k, answer)


@asynccontextmanager
async def _recorded(clock: AnswerClock, quantum_ms: int) -> AsyncIterator[float]:
    async with on_the_quantum(quantum_ms) as started:
        try:
            yield started
        finally:  # the computation's end, answer or error, before the wait for the boundary
            if quantum_ms > 0:
                clock.answers.append(HeldAnswer(started, time.monotonic(), quantum_ms / 1000))


@pytest.fixture
def answer_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[AnswerClock]:
    """An AnswerClock recording every quantised outcome of this process's proxies during the test."""
    clock = AnswerClock()
    monkeypatch.setattr(executor, "on_the_quantum", lambda quantum_ms: _recorded(clock, quantum_ms))
    yield clock
