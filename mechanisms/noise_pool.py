"""Discrete Laplace noise drawn ahead, in batches, off the query path.

One OpenDP call costs ~60 µs of Python and FFI overhead whatever it samples through OpenDP's
wrapper (~20 µs through ``mechanisms.opendp_calls``), against ~5 µs for the sampling itself, so
drawing one value per answer spends most of the time on the call. A :class:`NoisePool` keeps a queue of values already drawn by OpenDP's discrete
Laplace sampler (a vector of zeros noised in one call) and refills it in a background
thread when it runs low; the event loop only takes a value off the queue.

Guarantee: each value is an independent draw from the same secure sampler and is handed
out at most once (``deque.popleft`` is atomic), so ``value + pool.take()`` has exactly the
distribution of OpenDP's ``make_laplace`` on ``value``. Drawn values are kept only in
this process's memory, which already holds the exact answers they protect. When the queue
is empty a value is drawn on the spot, so an answer never waits for, or reuses, a batch.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import opendp.prelude as dp

from .opendp_calls import invoke_int

dp.enable_features("contrib")

__all__ = ["NoisePool", "pool_for"]

BATCH = 256
"""Values per OpenDP call when refilling (~1.3 ms of sampling, outside the GIL)."""

MAX_POOLS = 64
"""Scales with a pool at once; the least recently used pool is dropped beyond this."""

# One thread refills every pool: refills are rare and short, and one thread keeps them
# from competing with each other for the cores the queries need.
_refiller = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpproxy-noise")


@lru_cache(maxsize=MAX_POOLS)
def _one(scale: float) -> Any:
    return dp.m.make_laplace(dp.atom_domain(T="i64"), dp.absolute_distance(T="i64"), scale=scale)


@lru_cache(maxsize=MAX_POOLS)
def _batch(scale: float) -> Any:
    return dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"), scale=scale)


class NoisePool:
    """Independent discrete Laplace draws of one ``scale``: P(k) ∝ exp(-|k|/scale)."""

    def __init__(self, scale: float, batch: int = BATCH) -> None:
        self.scale = scale
        self.batch = batch
        self._values: deque[int] = deque()
        self._refill_pending = False

    def take(self) -> int:
        """One draw, never handed out before; starts a background refill when running low."""
        if not self._refill_pending and len(self._values) <= self.batch // 2:
            self._refill_pending = True
            _refiller.submit(self._refill)
        try:
            return self._values.popleft()
        except IndexError:
            return invoke_int(_one(self.scale), 0)

    def _refill(self) -> None:
        try:
            self._values.extend(int(v) for v in _batch(self.scale)([0] * self.batch))
        finally:
            self._refill_pending = False


_pools: OrderedDict[float, NoisePool] = OrderedDict()
_pools_lock = threading.Lock()


def pool_for(scale: float) -> NoisePool:
    """The pool of draws at ``scale`` (a positive, finite float), created on first use."""
    with _pools_lock:
        pool = _pools.get(scale)
        if pool is None:
            pool = _pools[scale] = NoisePool(scale)
            if len(_pools) > MAX_POOLS:
                _pools.popitem(last=False)
        else:
            _pools.move_to_end(scale)
        return pool
