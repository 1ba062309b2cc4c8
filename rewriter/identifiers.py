"""Names in sqlglot trees, read as PostgreSQL reads them."""

from __future__ import annotations

from sqlglot import exp

__all__ = ["NAME_BYTES", "fold", "identifier", "truncated"]

# PostgreSQL's downcase_identifier (scansup.c) lowers only the ASCII letters of an unquoted
# name on a multibyte server encoding (UTF8): ÉX is "Éx", never Python's "éx".
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


# NAMEDATALEN - 1: PostgreSQL truncates a longer name, quoted or not, to this many bytes of
# the server encoding (UTF8), cutting at a character boundary (truncate_identifier).
NAME_BYTES = 63


def fold(name: str) -> str:
    """An unquoted name as PostgreSQL stores it: ASCII letters lowered, every other character
    kept, truncated as :func:`truncated`."""
    return truncated(name.translate(_ASCII_LOWER))


def truncated(name: str) -> str:
    """``name`` cut to its first 63 UTF-8 bytes, at a character boundary, as PostgreSQL stores it."""
    encoded = name.encode("utf-8", "surrogatepass")
    if len(encoded) <= NAME_BYTES:
        return name
    return encoded[:NAME_BYTES].decode("utf-8", "ignore")


def identifier(node: exp.Expression) -> str:
    """An identifier as PostgreSQL stores it: unquoted names fold to lower case (ASCII only);
    both are truncated to 63 bytes."""
    if isinstance(node, exp.TableAlias):
        node = node.this
    if isinstance(node, exp.Identifier):
        return truncated(node.this) if node.quoted else fold(node.this)
    return fold(node.name)
