"""``RowStream``: the rows of a passthrough statement handed out in order, once each, whatever
the chunks they came in, the limits they are taken with, and the rests held between takes.

The stream is driven here by a pull of its own (the chunks libpq would give, then the tag or an
error), so that every boundary can be placed: tests/test_passthrough_streaming.py drives it
through a real PostgreSQL and clients.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from benchmarks.row_stream import drain_cpu_s
from proxy.backend import row_stream
from proxy.backend.errors import BackendError
from proxy.backend.row_stream import RowStream

BATCH = 1024  # the rows take hands out at a time (row_stream._BATCH_ROWS)


def _pull(chunks: list[list[bytes]], error: BaseException | None = None):
    """libpq's chunks one by one, the tag ``DONE`` with the last (or, with ``error``, that error after it)."""
    left = iter(range(len(chunks)))

    async def pull() -> tuple[list[bytes], str | None]:
        index = next(left, None)
        if index is None:
            assert error is not None, "pulled past the end"
            raise error
        last = index == len(chunks) - 1 and error is None
        return list(chunks[index]), ("DONE" if last else None)

    return pull


def _rows(count: int, start: int = 0) -> list[bytes]:
    return [b"row %d" % number for number in range(start, start + count)]


def _chunked(sizes: list[int]) -> Iterator[list[bytes]]:
    start = 0
    for size in sizes:
        yield _rows(size, start)
        start += size


async def _take(stream: RowStream, limit: int | None, into: list[bytes]) -> None:
    """Append to ``into`` what ``take(limit)`` yields (before an error it raises)."""
    async for batch in stream.take(limit):
        assert 0 < len(batch) <= BATCH
        into += batch


# Chunks on both sides of a batch, and rests held between takes that end mid-batch.
SIZES = [1, BATCH - 1, BATCH, BATCH + 1, 3 * BATCH + 7, 0, 2, 5000]
LIMITS = [1, BATCH - 1, BATCH, BATCH + 1, 2 * BATCH, 3, 4000, 7, None]


@pytest.mark.parametrize("hold_between", [False, True], ids=["taken-as-they-come", "held-between-takes"])
def test_the_rows_come_out_in_order_once_each_across_chunk_and_batch_boundaries(hold_between: bool) -> None:
    chunks = list(_chunked(SIZES))
    expected = [row for chunk in chunks for row in chunk]

    async def run() -> tuple[list[bytes], RowStream]:
        stream = RowStream(_pull(chunks[1:]), list(chunks[0]), b"I")
        got: list[bytes] = []
        for limit in LIMITS:
            await _take(stream, limit, got)
            assert stream.handed_out == len(got)
            if hold_between:
                await stream.hold()
                assert stream.held_bytes == sum(map(len, expected[len(got):]))
        return got, stream

    got, stream = asyncio.run(run())
    assert got == expected
    assert stream.exhausted and stream.tag == "DONE"


def test_a_held_rest_is_handed_out_whole_before_the_error_that_ended_it() -> None:
    chunks = list(_chunked([BATCH + 5, 2 * BATCH, 17]))
    expected = [row for chunk in chunks for row in chunk]
    failure = BackendError("22012", "division by zero")
    ended: list[tuple[str | None, int]] = []

    async def run() -> list[bytes]:
        stream = RowStream(_pull(chunks[1:], failure), list(chunks[0]), b"I")
        stream.when_ended(lambda sqlstate, rows: ended.append((sqlstate, rows)))
        got: list[bytes] = []
        await _take(stream, BATCH + 1, got)
        await stream.hold()  # reads the rest and meets the error
        with pytest.raises(BackendError) as raised:
            await _take(stream, None, got)
        assert raised.value is failure
        return got

    got = asyncio.run(run())
    assert got == expected
    assert ended == [("22012", len(got))]


def _drain_cpu_s(count: int) -> float:
    """The CPU time of handing out ``count`` held rows to their end (the best of five)."""
    return min(drain_cpu_s(row_stream, count) for _ in range(5))


def test_handing_out_held_rows_takes_time_linear_in_their_number() -> None:
    # Cutting each batch off the front of the held list moved every row behind it: 4,000,000
    # held rows (64 MB of 16-byte rows, the cap) took ~2.4 s of CPU against ~20 ms now (benchmarks/row_stream.py). Eight
    # times the rows take ~10 times the CPU (the larger list leaves the caches), quadratic
    # ~140 times. Both sizes are measured in CPU time in the same run: load does not skew them.
    small, large = _drain_cpu_s(500_000), _drain_cpu_s(4_000_000)
    assert large < 40 * small, f"500,000 rows: {small * 1000:.1f} ms, 4,000,000: {large * 1000:.1f} ms"
