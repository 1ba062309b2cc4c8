"""What a read of a protected view's column may carry into a hash aggregate's input, as the planner
estimates it, for a view that computes its columns (rewriter/sort_memory.py, ``_input_bytes``).

A hash aggregate admits ``work_mem`` × ``hash_mem_multiplier`` over its planner's estimate of a
group's entry groups before it spills, and that estimate counts the width of every value its input
carries. PostgreSQL flattens a view into the statement and computes an aggregate's arguments and
FILTERs above the scan, so the scan carries the columns of the relations beneath that a view's
column is computed from, at their statistics' widths, not the computed value: ``octet_length(u)``
is an integer that carries u, 7,000 bytes a row (tests/test_attack_stop46_hash.py), and ``a || b``
carries both. A table's column, or a simple view's (each column one of its relation's,
proxy/backend/view_rows.py), carries itself.

So for any other view, each of its columns is asked of PostgreSQL at load: ``EXPLAIN (VERBOSE)`` of
a count of it shows the values its aggregate's input carries (the outputs of the node below the
lowest aggregate). Each weighs the most any column of the relations the view reads (through views,
``pg_depend`` of each ``_RETURN`` rule, which a view calling only built-in functions reads all of)
may be estimated at (``rewriter.sort_memory.column_input_bytes``). A whole row, estimated at the
sum of its columns, is never carried: a view's column computed from one is refused at load
(proxy/backend/row_failures.py: a row is a value of any length)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from policies.sql_names import quote_identifier
from rewriter.sort_memory import column_input_bytes

from .fetches import Fetches

__all__ = ["view_input_bytes"]

_READ_COLUMNS = (
    "WITH RECURSIVE reads(relid) AS (SELECT CAST(%s AS pg_catalog.oid) UNION "
    "SELECT d.refobjid FROM reads JOIN pg_catalog.pg_rewrite r ON r.ev_class OPERATOR(pg_catalog.=) reads.relid "
    "AND r.rulename OPERATOR(pg_catalog.=) '_RETURN' JOIN pg_catalog.pg_depend d "
    "ON d.classid OPERATOR(pg_catalog.=) CAST('pg_catalog.pg_rewrite' AS pg_catalog.regclass) "
    "AND d.objid OPERATOR(pg_catalog.=) r.oid "
    "AND d.refclassid OPERATOR(pg_catalog.=) CAST('pg_catalog.pg_class' AS pg_catalog.regclass) "
    "AND d.refobjid OPERATOR(pg_catalog.<>) r.ev_class) "
    # A domain's base type and modifier (a char(n)'s n is the domain's), as the planner estimates it.
    "SELECT CAST(CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' THEN t.typbasetype ELSE a.atttypid END AS pg_catalog.int8), "
    "CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' THEN t.typtypmod ELSE a.atttypmod END "
    "FROM reads JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) reads.relid "
    "AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped "
    "JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid"
)


async def view_input_bytes(session: Fetches, oid: int, relation_sql: str, columns: Iterable[str]) -> dict[str, int]:
    """The most the planner may estimate a read of each of ``columns`` of view ``oid`` (written
    ``relation_sql``) to carry into an aggregate's input, in bytes (module docstring)."""
    widest = max((column_input_bytes(int(type_oid), int(modifier))
                  for type_oid, modifier in await session.fetch_all(_READ_COLUMNS, (oid,))), default=0)
    weights: dict[str, int] = {}
    for name in columns:
        ((explained,),) = await session.fetch_all(
            f"EXPLAIN (VERBOSE, FORMAT JSON) SELECT pg_catalog.count({quote_identifier(name)}) FROM {relation_sql}")
        weights[name] = max(1, len(_carried(explained))) * widest
    return weights


def _carried(explained: Any) -> list[str]:
    """The values the input of the lowest aggregate of an ``EXPLAIN (VERBOSE, FORMAT JSON)`` carries."""
    plan = (json.loads(explained) if isinstance(explained, str) else explained)[0]["Plan"]
    aggregates = [node for node in _nodes(plan) if node["Node Type"] == "Aggregate"]
    below = aggregates[-1].get("Plans", []) if aggregates else []
    return [str(value) for node in below for value in node.get("Output", [])]


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)
