"""Where a backend SQL compares a column's raw value, not its bound (rewriter/raw_equality.py).

The level that reads the table reads a bounded column through its bound (rewriter/text_bounds.py
``read_table``): written in place (``CASE WHEN <header test> THEN "t" END``) where the column is read
once, so that a raw comparison has the quoted column itself beside the operator (``("t"
OPERATOR(pg_catalog.=) 'x')``, ``("v" OPERATOR(pg_catalog.=) ANY (ARRAY[…]))``, ``($1
OPERATOR(pg_catalog.=) "c")``); else through a projection (``CASE … END AS "t"``), whose raw outputs
(``"t" AS "raw 2"``) the comparisons name instead, ``"t"`` being the bounded value there.
"""

from __future__ import annotations

import re

__all__ = ["projected", "raw_reads"]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def projected(sql: str, column: str) -> bool:
    """Whether ``sql`` reads ``column`` through a projection of its bounded value."""
    return f"THEN {_quoted(column)} END AS {_quoted(column)}" in sql


def raw_reads(sql: str, column: str) -> int:
    """How many comparisons of ``column``'s raw value ``sql`` holds."""
    quoted = _quoted(column)
    names = re.findall(rf'{re.escape(quoted)} AS ("_*raw \d+")', sql) if projected(sql, column) else [quoted]
    return sum(sql.count(f"({name} OPERATOR(pg_catalog.") + sql.count(f"OPERATOR(pg_catalog.=) {name})") for name in names)
