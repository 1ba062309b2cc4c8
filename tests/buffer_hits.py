"""How many shared buffers a statement reads: the attack tests' measure of the work one row adds,
which load on the machine cannot move as it moves a timing."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

__all__ = ["LONG_ROW", "buffer_hits", "with_and_without_a_long_row"]

LONG_ROW = "repeat(md5('x'), 100000)"
"""The SQL of a 3.2 MB text, stored apart uncompressed in a ``STORAGE EXTERNAL`` column."""


def buffer_hits(admin: psycopg.Connection[Any], sql: str, params: Sequence[object] | None = None) -> int:
    """The shared buffers ``sql`` reads (hit or read), run once under ``EXPLAIN (ANALYZE, BUFFERS)``;
    with ``params``, its ``$1``… bound to them through the extended protocol."""
    explain = f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}"
    row = (admin.execute(explain) if params is None else psycopg.RawCursor(admin).execute(explain, params)).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Shared Hit Blocks"]) + int(plan[0]["Plan"]["Shared Read Blocks"])


@contextmanager
def with_and_without_a_long_row(admin: psycopg.Connection[Any], prefix: str, note: str = LONG_ROW) -> Iterator[None]:
    """Tables ``<prefix>_short`` and ``<prefix>_long`` (``id int, note text``, the note stored apart
    uncompressed from ~2 kB: ``STORAGE EXTERNAL``) of 1,000 rows ``(g, g::text)``, the long one with
    one row more, ``(500, <note>)`` (an id an analyst's ``id > 5`` keeps); dropped, with what
    depends on them, on exit."""
    admin.execute("SET jit = off")
    for kind in ("short", "long"):
        admin.execute(f"DROP TABLE IF EXISTS {prefix}_{kind} CASCADE")
        admin.execute(f"CREATE TABLE {prefix}_{kind} (id int, note text)")
        admin.execute(f"ALTER TABLE {prefix}_{kind} ALTER COLUMN note SET STORAGE EXTERNAL")
        admin.execute(f"INSERT INTO {prefix}_{kind} SELECT g, g::text FROM generate_series(1, 1000) g")
    admin.execute(f"INSERT INTO {prefix}_long SELECT 500, {note}")
    try:
        yield
    finally:
        for kind in ("short", "long"):
            admin.execute(f"DROP TABLE {prefix}_{kind} CASCADE")
