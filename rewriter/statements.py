"""Split a query string into statements with PostgreSQL's own grammar (pglast).

What PostgreSQL's parser cannot parse is refused here with the parser's own message, so
nothing reaches the backend unparsed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from pglast import parser
from pglast.parser import ParseError

from policies.errors import SQLSTATE, Refusal

from .references import References, collect_references

__all__ = ["Statement", "split_statements"]


@dataclass(frozen=True)
class Statement:
    """One statement of a query string: its own text, its node kind and its parse tree."""

    text: str
    kind: str
    node: dict[str, Any] = field(repr=False, compare=False)
    references: References = field(repr=False, compare=False)


def split_statements(sql: str) -> tuple[Statement, ...]:
    """Parse ``sql`` (one or more statements); an empty string gives no statement."""
    return _split(sql)


@lru_cache(maxsize=4096)
def _split(sql: str) -> tuple[Statement, ...]:
    try:
        tree = json.loads(parser.parse_sql_json(sql))
    except ParseError as exc:
        raise Refusal(SQLSTATE.SYNTAX_ERROR, str(exc.args[0]), rule="syntax") from exc
    encoded = sql.encode("utf-8")
    statements = []
    for raw in tree.get("stmts", []):
        # Locations are byte offsets into the UTF-8 text.
        start = raw.get("stmt_location", 0)
        length = raw.get("stmt_len", 0) or len(encoded) - start
        text = encoded[start : start + length].decode("utf-8").strip()
        ((kind, node),) = raw["stmt"].items()
        statements.append(Statement(text, kind, node, collect_references(node)))
    return tuple(statements)
