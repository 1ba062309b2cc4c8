"""What PostgreSQL can do with a column's type, asked of the backend over no row at all.

Some of a DP query's backend SQL needs operators of the column's type that PostgreSQL looks up
while it parses the statement: ``count(DISTINCT col)`` sorts by the type's ordering, MODE
compares the column with each category (``col = 'label'``), a category GROUP BY groups by the
column. On a type without them (``json``, ``point``, ``box``, ``xid``; an array or composite of
such a type) every such statement fails, whatever the rows, but only on the backend: after its
charge. So they are asked here, when the policy is loaded, by parsing each shape over a typed
NULL that reads no table; the answers depend on the schema alone.
"""

from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence

from rewriter.sql_text import literal, operator

from .errors import BackendError, BackendLost, BackendUnavailable

__all__ = ["distinct_countable", "label_comparison_problem"]


class _Session(Protocol):
    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


async def _parses(session: _Session, sql: str) -> str | None:
    """None when ``sql`` runs, else PostgreSQL's message; a lost backend is raised, not an answer."""
    try:
        await session.fetch_all(sql)
        return None
    except (BackendUnavailable, BackendLost):
        raise
    except BackendError as exc:
        return exc.message


async def distinct_countable(session: _Session, types: Iterable[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    """The (type OID, typmod) pairs whose values ``count(DISTINCT ...)`` can count."""
    countable = set()
    for type_oid, modifier in set(types):
        (type_name,) = (await session.fetch_all("SELECT pg_catalog.format_type(%s, %s)", (type_oid, modifier)))[0]
        sql = f"SELECT pg_catalog.count(DISTINCT x) FROM (SELECT CAST(NULL AS {type_name}) AS x) AS s"
        if await _parses(session, sql) is None:
            countable.add((type_oid, modifier))
    return frozenset(countable)


async def label_comparison_problem(session: _Session, type_name: str, label: str, grouped: bool) -> str | None:
    """Why a column of ``type_name`` cannot be compared with the category ``label`` as MODE and a
    category key compare it (``col = 'label'``), or grouped by when ``grouped``; None if it can."""
    comparison = operator("x", "=", literal(label))
    group = " GROUP BY x" if grouped else ""
    return await _parses(session, f"SELECT 1 FROM (SELECT CAST(NULL AS {type_name}) AS x) AS s WHERE {comparison}{group}")
