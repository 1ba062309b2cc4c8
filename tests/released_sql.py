"""The backend SQL a real dpproxy runs for its DP releases, caught where the executor sends it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from proxy.serving import executor


@contextmanager
def recording_released_sql(record: Callable[[Any, str], None]) -> Iterator[None]:
    """While open, ``record(plan, sql)`` is called for every backend SQL the executor runs for a DP
    release (in this process: the tests' proxies run in it), before it runs."""
    released = executor.Executor._released

    async def recording(self: executor.Executor, plan: Any, sql: str, *args: Any) -> Any:
        if sql:
            record(plan, sql)
        return await released(self, plan, sql, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(executor.Executor, "_released", recording)
        yield
