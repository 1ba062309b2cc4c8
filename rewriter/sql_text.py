"""SQL text that dpproxy writes itself: string constants and pg_catalog operators."""

from __future__ import annotations

__all__ = ["literal", "operator"]


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
