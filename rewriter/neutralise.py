"""Rewrite catalog statements so that pg_class never reveals row counts or sizes.

Every reference to pg_catalog.pg_class becomes a subquery with the same columns in which
``reltuples``, ``relpages`` and ``relallvisible`` are constants (-1 is what PostgreSQL
itself reports for a table never analysed). Clients that read them (pgjdbc's
getIndexInfo CARDINALITY) keep working and learn nothing.

A subquery can be named only by an unqualified alias, so column references qualified by
schema (``pg_catalog.pg_class.relname``, as SQLAlchemy writes them) lose the schema.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from pglast import parser

from .catalog import NEUTRALISED_PG_CLASS_COLUMNS

__all__ = ["neutralise_pg_class"]


def neutralise_pg_class(sql: str, pg_class_columns: tuple[str, ...], is_pg_class: Any) -> str:
    """Replace each RangeVar for which ``is_pg_class(schema, name)`` holds by a safe subquery."""
    encoded = sql.encode("utf-8")
    tree = json.loads(parser.parse_sql_json(sql))
    targets = [
        node for node in _nodes(tree, "RangeVar") if is_pg_class(node.get("schemaname"), node["relname"])
    ]
    if not targets:
        return sql
    tokens = parser.scan(sql)
    replacement = _subquery(pg_class_columns).encode("utf-8")
    edits: list[tuple[int, int, bytes]] = []  # (start, end, replacement) byte ranges
    for node in targets:
        start, end = _name_extent(tokens, node["location"])
        if not node.get("inh", True):
            start = _only_keyword_start(tokens, start)
        edits.append((start, end, replacement if "alias" in node else replacement + b" AS pg_class"))
    for ref in _nodes(tree, "ColumnRef"):
        prefix = _schema_prefix(tokens, ref)
        if prefix is not None:
            edits.append((*prefix, b""))
    pieces: list[bytes] = []
    cursor = 0
    for start, end, text in sorted(edits):
        pieces += [encoded[cursor:start], text]
        cursor = end
    pieces.append(encoded[cursor:])
    return b"".join(pieces).decode("utf-8")


def _schema_prefix(tokens: list[Any], ref: dict[str, Any]) -> tuple[int, int] | None:
    """Byte range of ``[db.]pg_catalog.`` in a column reference ``[db.]pg_catalog.pg_class.col``."""
    names = [field.get("String", {}).get("sval") for field in ref["fields"]]
    if len(names) < 3 or names[-3:-1] != ["pg_catalog", "pg_class"]:
        return None
    index = next(i for i, token in enumerate(tokens) if token.start == ref["location"])
    return ref["location"], tokens[index + 2 * (len(names) - 2)].start


def _subquery(columns: tuple[str, ...]) -> str:
    items = [
        f"{NEUTRALISED_PG_CLASS_COLUMNS[c]} AS {c}" if c in NEUTRALISED_PG_CLASS_COLUMNS else c
        for c in columns
    ]
    return f"(SELECT {', '.join(items)} FROM pg_catalog.pg_class)"


def _nodes(node: Any, kind: str) -> Iterator[dict[str, Any]]:
    """Every node of ``kind`` in a pglast JSON parse tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == kind:
                yield value
            yield from _nodes(value, kind)
    elif isinstance(node, list):
        for item in node:
            yield from _nodes(item, kind)


def _name_extent(tokens: list[Any], location: int) -> tuple[int, int]:
    """Byte range of the (possibly schema-qualified) name that starts at ``location``."""
    index = next(i for i, token in enumerate(tokens) if token.start == location)
    end = tokens[index].end + 1
    while index + 2 < len(tokens) and tokens[index + 1].name == "ASCII_46":
        index += 2
        end = tokens[index].end + 1
    return location, end


def _only_keyword_start(tokens: list[Any], start: int) -> int:
    index = next(i for i, token in enumerate(tokens) if token.start == start)
    if index > 0 and tokens[index - 1].name == "ONLY":
        return tokens[index - 1].start
    return start
