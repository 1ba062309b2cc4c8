"""The backend database's encoding: dpproxy reads names as PostgreSQL does only in UTF8.

dpproxy judges a statement by the relations and columns its names denote, folding an unquoted
name and truncating a long one to 63 bytes as PostgreSQL does in a UTF8 database
(``rewriter.identifiers``): only ASCII letters are lowered. In a single-byte database encoding
(LATIN1, WIN1252, SQL_ASCII …) PostgreSQL also lowers the non-ASCII letters its locale knows
(``downcase_identifier``), and its 63 bytes are another number of characters, so a name dpproxy
judged as one column or relation could denote another. ``serve``, a reload and ``check-config``
therefore refuse a database whose encoding is not UTF8.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

__all__ = ["database_encoding_problems"]


class _Fetches(Protocol):
    async def fetch_row(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]: ...


async def database_encoding_problems(session: _Fetches) -> list[str]:
    """A problem if the database's encoding is not UTF8, else none."""
    (encoding,) = await session.fetch_row("SELECT pg_catalog.current_setting('server_encoding')")
    if encoding == "UTF8":
        return []
    return [f"backend.dsn: the database's encoding is {encoding}, and dpproxy reads names as PostgreSQL does "
            "only in a UTF8 database (in a single-byte encoding PostgreSQL also lowers the non-ASCII letters of an "
            "unquoted name, so a name dpproxy judged could denote another column or relation); use a database "
            "created with ENCODING 'UTF8'"]
