"""Split a query string into statements with PostgreSQL's own grammar (pglast).

What PostgreSQL's parser cannot parse is refused here with the parser's own message, so
nothing reaches the backend unparsed; what is too complex to analyse safely is refused here
too (54001, rewriter/limits.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pglast import parser
from pglast.parser import ParseError

from policies.errors import SQLSTATE, Refusal

from .limits import MAX_NESTING, MAX_TREE_BYTES, check_complexity, check_text, too_complex
from .references import References, collect_references
from .sized_cache import sized_cache

__all__ = ["Statement", "split_statements"]


@dataclass(frozen=True)
class Statement:
    """One statement of a query string: its own text, its node kind and its parse tree.

    ``tree_bytes``: the size of pglast's JSON parse tree of the whole query string it came
    from, an upper bound of its own tree's, which is what analysing it costs.
    """

    text: str
    kind: str
    node: dict[str, Any] = field(repr=False, compare=False)
    references: References = field(repr=False, compare=False)
    tree_bytes: int = field(default=0, repr=False, compare=False)


def split_statements(sql: str) -> tuple[Statement, ...]:
    """Parse ``sql`` (one or more statements); an empty string gives no statement."""
    return _split(sql)


# Bytes of text and parse tree (JSON) kept; the Python trees take about ten times that, and
# a full garbage collection walks them: ~100 ms with 8 MiB, ~15 ms with 2 MiB.
@sized_cache(4096, 2 * 1024 * 1024, lambda statements, sql: len(sql) + sum(s.tree_bytes for s in statements[:1]))
def _split(sql: str) -> tuple[Statement, ...]:
    check_text(sql)
    try:
        tree_json = parser.parse_sql_json(sql)
    except ParseError as exc:
        raise Refusal(SQLSTATE.SYNTAX_ERROR, str(exc.args[0]), rule="syntax") from exc
    if len(tree_json) > MAX_TREE_BYTES:
        # Decoding the tree holds the GIL (about 0.1 s per MB): bounded so no session stalls the others.
        raise too_complex(f"its parse tree has {len(tree_json) // 1024} KiB", MAX_TREE_BYTES // 1024, "KiB of parse tree")
    try:
        tree = json.loads(tree_json)
    except RecursionError as exc:
        raise too_complex("expressions nested too deep", MAX_NESTING, "levels of nesting") from exc
    encoded = sql.encode("utf-8")
    statements = []
    for raw in tree.get("stmts", []):
        # Locations are byte offsets into the UTF-8 text.
        start = raw.get("stmt_location", 0)
        length = raw.get("stmt_len", 0) or len(encoded) - start
        text = encoded[start : start + length].decode("utf-8").strip()
        ((kind, node),) = raw["stmt"].items()
        check_complexity(text, node)
        statements.append(Statement(text, kind, node, collect_references(node), len(tree_json)))
    return tuple(statements)
