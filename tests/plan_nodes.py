"""The node types of a statement's plan, for tests that pin which scans PostgreSQL chooses."""

from __future__ import annotations

import json
from collections.abc import Sequence

import psycopg

__all__ = ["plan_node_types"]


def plan_node_types(conn: psycopg.Connection, sql: str, params: Sequence[object] | None = None) -> set[str]:
    """Every node type of ``sql``'s plan (``EXPLAIN``, not run) on ``conn``: "Seq Scan", "Bitmap Heap Scan" ...
    With ``params``, ``sql``'s ``$1``… are bound to them through the extended protocol (a custom plan)."""
    if params is None:
        row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()
    else:
        row = psycopg.RawCursor(conn).execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    found: set[str] = set()

    def walk(node: dict[str, object]) -> None:
        found.add(str(node["Node Type"]))
        for child in node.get("Plans", ()):  # type: ignore[attr-defined]
            walk(child)

    walk(plan[0]["Plan"])
    return found
