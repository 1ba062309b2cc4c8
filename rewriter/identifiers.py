"""Names in sqlglot trees, read as PostgreSQL reads them."""

from __future__ import annotations

from sqlglot import exp

__all__ = ["fold", "identifier"]

# PostgreSQL's downcase_identifier (scansup.c) lowers only the ASCII letters of an unquoted
# name on a multibyte server encoding (UTF8): ÉX is "Éx", never Python's "éx".
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def fold(name: str) -> str:
    """An unquoted name as PostgreSQL stores it: ASCII letters lowered, every other character kept."""
    return name.translate(_ASCII_LOWER)


def identifier(node: exp.Expression) -> str:
    """An identifier as PostgreSQL stores it: unquoted names fold to lower case (ASCII only)."""
    if isinstance(node, exp.TableAlias):
        node = node.this
    if isinstance(node, exp.Identifier):
        return node.this if node.quoted else fold(node.this)
    return fold(node.name)
