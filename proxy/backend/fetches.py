"""What the load-time catalog checks need of a backend session: its rows for a query.

``BackendSession`` has it; the checks (grants, relation_reads, row_failures) take this Protocol so
that they depend on nothing else of a session and can be run on any session alike.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["Fetches"]


class Fetches(Protocol):
    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
