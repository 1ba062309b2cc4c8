"""Which relations' pages bound a protected view's rows, for the memory its sorts may take
(rewriter/sort_memory.py).

A table's rows are bounded by its pages, and so are the bytes of the values it holds; a view's
are not: a join, a set-returning function or a UNION makes more rows than its relations hold,
and an expression (``repeat(t, 8)``, a product of ``numeric`` values) makes wider values than
they store. Both let a sort outgrow any bound read from the view's pages (it has none) and spill
at a filter the analyst chooses. PostgreSQL itself knows a shape that can do neither: an
automatically updatable view (one relation, or one such view, in its FROM; no join, DISTINCT,
GROUP BY, set operation, LIMIT, set-returning function in its output, aggregate or window) each
of whose columns is updatable (a column of that relation, never an expression):
``pg_relation_is_updatable`` and ``pg_column_is_updatable``. Each of its rows is a row of that
relation, with that row's values, so the relation's bound is the view's. An unconditional
``INSTEAD`` rule makes PostgreSQL call a view updatable whatever its shape, so a view with a rule
besides its ``_RETURN`` is not one. The relations its query reads (``pg_depend`` of its
``_RETURN`` rule) include those of a WHERE's subqueries, which only filter: all are taken (their
pages added up), each table, partitioned table or materialized view by its pages and each view
again by its own (a view over a view), so a view whose every view is such is bounded by the sum
of the relations' pages at the end; any other (a view of another shape, a foreign table) leaves
the view without a bound (None)."""

from __future__ import annotations

from .fetches import Fetches

__all__ = ["view_row_bases"]

_SHAPE = (
    "SELECT CAST(c.relkind AS pg_catalog.text), "
    # A view PostgreSQL can update automatically (DELETE: every such view), with no rule of its own.
    "c.relkind OPERATOR(pg_catalog.=) 'v' "
    "AND (pg_catalog.pg_relation_is_updatable(c.oid, false) OPERATOR(pg_catalog.&) 16) OPERATOR(pg_catalog.=) 16 "
    "AND NOT EXISTS (SELECT FROM pg_catalog.pg_rewrite r WHERE r.ev_class OPERATOR(pg_catalog.=) c.oid "
    "AND r.rulename OPERATOR(pg_catalog.<>) '_RETURN') "
    "AND NOT EXISTS (SELECT FROM pg_catalog.pg_attribute a WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid "
    "AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped "
    "AND NOT pg_catalog.pg_column_is_updatable(c.oid, a.attnum, false)), "
    "ARRAY(SELECT DISTINCT d.refobjid FROM pg_catalog.pg_rewrite r JOIN pg_catalog.pg_depend d "
    "ON d.classid OPERATOR(pg_catalog.=) CAST('pg_catalog.pg_rewrite' AS pg_catalog.regclass) "
    "AND d.objid OPERATOR(pg_catalog.=) r.oid "
    "AND d.refclassid OPERATOR(pg_catalog.=) CAST('pg_catalog.pg_class' AS pg_catalog.regclass) "
    "WHERE r.ev_class OPERATOR(pg_catalog.=) c.oid AND r.rulename OPERATOR(pg_catalog.=) '_RETURN' "
    "AND d.refobjid OPERATOR(pg_catalog.<>) c.oid ORDER BY d.refobjid) "
    "FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) CAST(%s AS pg_catalog.oid)"
)
_PAGED = frozenset({"r", "p", "m"})  # a table, a partitioned table, a materialized view: rows in pages
_MAX_VIEWS = 64  # views read through, in all, before the view is taken as unbounded


async def view_row_bases(session: Fetches, oid: int) -> tuple[int, ...] | None:
    """The relations whose pages bound the rows of relation ``oid`` (module docstring): () for a
    relation that stores its rows (its own pages), the relations at the end of a simple view's
    reads, or None when no pages bound them."""
    bases: list[int] = []
    pending, seen = [oid], {oid}
    while pending:
        current = pending.pop()
        rows = await session.fetch_all(_SHAPE, (current,))
        if not rows:
            return None  # dropped meanwhile: no bound known
        relkind, simple, reads = rows[0]
        if relkind in _PAGED:
            if current == oid:
                return ()
            bases.append(current)
            continue
        if not simple or len(seen) + len(reads) > _MAX_VIEWS:
            return None
        for read in map(int, reads):
            if read not in seen:
                seen.add(read)
                pending.append(read)
    return tuple(sorted(bases))
