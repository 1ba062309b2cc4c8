"""SQL cursors: what a DECLARE, FETCH/MOVE or CLOSE statement says, read from its parse tree.

``DECLARE name [BINARY] [NO] SCROLL CURSOR [WITH|WITHOUT HOLD] FOR query`` is judged as its
query (rewriter.classify); this module gives that query's text and the cursor's options, and
writes the DECLARE sent to the backend for a passthrough query, around the query as judged
(names pinned, columns neutralised). FETCH and MOVE are read into a direction and a count
PostgreSQL's way (``FetchStmt``), and written back for the backend from those alone, so the
backend runs exactly what dpproxy understood.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pglast import parser

from policies.tables import quote_identifier

__all__ = ["FETCH_ALL", "CursorOptions", "Fetch", "declare_query", "declare_sql", "fetch_of"]

FETCH_ALL = 2**63 - 1
"""The count PostgreSQL's grammar gives ALL (FETCH ALL, FORWARD ALL, BACKWARD ALL)."""

# PostgreSQL's CURSOR_OPT_* bits (nodes/parsenodes.h) in DeclareCursorStmt.options.
_BINARY = 0x0001
_SCROLL = 0x0002
_NO_SCROLL = 0x0004
_HOLD = 0x0020

_DIRECTIONS = {"FETCH_FORWARD": "FORWARD", "FETCH_BACKWARD": "BACKWARD",
               "FETCH_ABSOLUTE": "ABSOLUTE", "FETCH_RELATIVE": "RELATIVE"}


@dataclass(frozen=True)
class CursorOptions:
    """A cursor's options as DECLARE gave them. ``scroll``: True for SCROLL, False for
    NO SCROLL, None when the statement says neither."""

    binary: bool = False
    scroll: bool | None = None
    hold: bool = False


@dataclass(frozen=True)
class Fetch:
    """FETCH or MOVE (``move``): PostgreSQL's direction (FETCH_FORWARD, FETCH_BACKWARD,
    FETCH_ABSOLUTE, FETCH_RELATIVE) and count (FETCH_ALL for ALL; NEXT is FORWARD 1, PRIOR
    BACKWARD 1, FIRST ABSOLUTE 1, LAST ABSOLUTE -1)."""

    name: str
    direction: str
    count: int
    move: bool

    @property
    def sql(self) -> str:
        """The statement, written from the fields above only."""
        count = "ALL" if self.count == FETCH_ALL else str(self.count)  # ALL only FORWARD and BACKWARD take
        verb = "MOVE" if self.move else "FETCH"
        return f"{verb} {_DIRECTIONS[self.direction]} {count} FROM {quote_identifier(self.name)}"


def fetch_of(node: dict[str, Any]) -> Fetch:
    """The FETCH or MOVE of a ``FetchStmt`` parse tree (an absent count is 0, as pglast omits it)."""
    return Fetch(str(node.get("portalname", "")), str(node.get("direction", "FETCH_FORWARD")),
                 int(node.get("howMany", 0)), bool(node.get("ismove")))


def declare_query(text: str, node: dict[str, Any]) -> tuple[str, CursorOptions]:
    """The query's text and the cursor's options of ``DECLARE ... CURSOR ... FOR query``.

    The query is the text after the first FOR keyword, which the grammar puts right before it
    (a cursor named "for" is an identifier, not the keyword).
    """
    options = int(node.get("options", 0))
    scroll = True if options & _SCROLL else False if options & _NO_SCROLL else None
    found = CursorOptions(bool(options & _BINARY), scroll, bool(options & _HOLD))
    for token in parser.scan(text):
        if token.name == "FOR":
            return text[token.end + 1 :].strip(), found
    raise AssertionError("DECLARE CURSOR without FOR")  # the parser accepted it


def declare_sql(name: str, options: CursorOptions, query: str) -> str:
    """The DECLARE statement of cursor ``name`` over ``query`` with ``options``."""
    words = ["DECLARE", quote_identifier(name)]
    if options.binary:
        words.append("BINARY")
    if options.scroll is not None:
        words.append("SCROLL" if options.scroll else "NO SCROLL")
    words += ["CURSOR", "WITH HOLD" if options.hold else "WITHOUT HOLD", "FOR", query]
    return " ".join(words)
