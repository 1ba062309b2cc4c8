"""How many shared buffers a statement reads: the attack tests' measure of the work one row adds,
which load on the machine cannot move as it moves a timing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import psycopg

__all__ = ["buffer_hits"]


def buffer_hits(admin: psycopg.Connection[Any], sql: str, params: Sequence[object] | None = None) -> int:
    """The shared buffers ``sql`` reads (hit or read), run once under ``EXPLAIN (ANALYZE, BUFFERS)``;
    with ``params``, its ``$1``… bound to them through the extended protocol."""
    explain = f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}"
    row = (admin.execute(explain) if params is None else psycopg.RawCursor(admin).execute(explain, params)).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Shared Hit Blocks"]) + int(plan[0]["Plan"]["Shared Read Blocks"])
