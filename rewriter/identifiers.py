"""Names in sqlglot trees, read as PostgreSQL reads them."""

from __future__ import annotations

from sqlglot import exp

__all__ = ["identifier"]


def identifier(node: exp.Expression) -> str:
    """An identifier as PostgreSQL stores it: unquoted names fold to lower case."""
    if isinstance(node, exp.TableAlias):
        node = node.this
    if isinstance(node, exp.Identifier):
        return node.this if node.quoted else node.this.lower()
    return node.name.lower()
