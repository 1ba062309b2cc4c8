"""Parse one PostgreSQL statement with sqlglot, parameters included.

sqlglot's tokenizer reads ``$`` as the start of a dollar-quoted string and, looking for its
tag, scans the rest of the statement; with a ``''`` after a ``$1`` it fails (``a > $1 AND s =
''``) or mis-tokenizes. PostgreSQL's own scanner (pglast) finds the parameters exactly (never
inside a string or a comment); each is handed to sqlglot as a named placeholder and turned
back into ``$n`` in the tree, so the DP-query analyser sees what PostgreSQL would.
"""

from __future__ import annotations

import sqlglot
from pglast.parser import ParseError, scan
from sqlglot import exp

__all__ = ["parse_postgres"]

_PLACEHOLDER = "dpproxy_param_"


def parse_postgres(sql: str) -> exp.Expr:
    """The sqlglot tree of ``sql`` (one statement); raises sqlglot's ParseError/TokenError."""
    if "$" not in sql or _PLACEHOLDER in sql:
        return sqlglot.parse_one(sql, read="postgres")
    try:
        tokens = scan(sql)
    except ParseError:
        return sqlglot.parse_one(sql, read="postgres")
    pieces, position = [], 0
    for token in tokens:
        if token.name == "PARAM":  # start and end are the offsets of its first and last character
            pieces += [sql[position : token.start], f":{_PLACEHOLDER}{sql[token.start + 1 : token.end + 1]}"]
            position = token.end + 1
    if not pieces:
        return sqlglot.parse_one(sql, read="postgres")
    pieces.append(sql[position:])
    tree = sqlglot.parse_one("".join(pieces), read="postgres")
    return tree.transform(_parameter)


def _parameter(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Placeholder) and str(node.name).startswith(_PLACEHOLDER):
        return exp.Parameter(this=exp.Literal.number(node.name[len(_PLACEHOLDER):]))
    return node
