"""Rewrite catalog statements so that pg_class never reveals row counts or sizes.

Every reference to pg_catalog.pg_class becomes a subquery with the same columns in which
``reltuples``, ``relpages`` and ``relallvisible`` are constants (-1 is what PostgreSQL
itself reports for a table never analysed). Clients that read them (pgjdbc's
getIndexInfo CARDINALITY) keep working and learn nothing.
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
    targets = sorted(
        (node["location"], node)
        for node in _range_vars(tree)
        if is_pg_class(node.get("schemaname"), node["relname"])
    )
    if not targets:
        return sql
    tokens = parser.scan(sql)
    replacement = _subquery(pg_class_columns).encode("utf-8")
    pieces: list[bytes] = []
    cursor = 0
    for location, node in targets:
        start, end = _name_extent(tokens, location)
        if not node.get("inh", True):
            start = _only_keyword_start(tokens, start)
        pieces.append(encoded[cursor:start])
        pieces.append(replacement)
        if "alias" not in node:
            pieces.append(b" AS pg_class")
        cursor = end
    pieces.append(encoded[cursor:])
    return b"".join(pieces).decode("utf-8")


def _subquery(columns: tuple[str, ...]) -> str:
    items = [
        f"{NEUTRALISED_PG_CLASS_COLUMNS[c]} AS {c}" if c in NEUTRALISED_PG_CLASS_COLUMNS else c
        for c in columns
    ]
    return f"(SELECT {', '.join(items)} FROM pg_catalog.pg_class)"


def _range_vars(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "RangeVar":
                yield value
            yield from _range_vars(value)
    elif isinstance(node, list):
        for item in node:
            yield from _range_vars(item)


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
