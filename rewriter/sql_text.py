"""SQL text that dpproxy writes itself: string constants and pg_catalog operators."""

from __future__ import annotations

__all__ = ["SHORT_TEXT_BYTES", "literal", "operator", "short_text"]


def literal(text: str) -> str:
    """A string constant that reads the same whatever standard_conforming_strings is."""
    escaped = text.replace("'", "''")
    if "\\" in escaped:
        return "E'" + escaped.replace("\\", "\\\\") + "'"
    return f"'{escaped}'"


def operator(left: str, symbol: str, right: str) -> str:
    """``(left symbol right)`` with PostgreSQL's own operator, whatever the session's search_path.

    ``OPERATOR(pg_catalog.op)`` looks the operator up in pg_catalog only, so an operator of
    the same name in another schema (even an exact-type overload) is never chosen.
    """
    return f"({left} OPERATOR(pg_catalog.{symbol}) {right})"


SHORT_TEXT_BYTES = 16 * 1024 * 1024
"""The longest text value (in bytes) that lower(), upper(), ILIKE and a nondeterministic
collation's hash are given: well below what makes them fail (an ICU sort key takes ~18 bytes
for each byte of U+FDFA)."""


def short_text(sql: str) -> str:
    """``sql``, a text value, where it is at most :data:`SHORT_TEXT_BYTES` bytes long, else NULL.

    Some of PostgreSQL's text functions allocate a multiple of their argument's length and fail
    beyond 1 GB (``invalid memory alloc request size``): lower() and upper() four bytes a
    character in a database whose LC_CTYPE is not C (a 256 MB value), two under ICU; ILIKE
    lowers the value first; a nondeterministic ICU collation hashes (GROUP BY) through a copy of
    two bytes a character (a 512 MB value) and a sort key of up to ~18 bytes a byte. Such a value
    failed the statement only on a table that held it. ``octet_length`` reads the stored size, detoasting nothing; a longer value is
    NULL there (in no LIKE's match, a key's NULL cell), the same for every row of its length.
    """
    return f"CASE WHEN {operator(f'pg_catalog.octet_length({sql})', '<=', str(SHORT_TEXT_BYTES))} THEN {sql} END"
