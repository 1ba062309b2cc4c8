"""Which rows a public relation hands out: a policy must not publish a protected table's rows.

A passthrough statement on a public relation returns its rows as they are. PostgreSQL reads
more than the named relation when it is a view or materialized view (the relations its rules
read), an inheritance or partitioned parent (every child's rows, unless the statement says
``ONLY``) or a table whose row-level security policy reads another (which of its rows come
back says what that one holds). ``serve``, a reload and ``check-config`` refuse a policy in which a relation marked
``public`` reads, so, a protected one: the name would denote the protected rows, exactly. And
one in which a public relation is an inheritance child or partition of a protected one: its
rows are rows of the protected table. (A public table a protected view reads, a lookup table
joined in, stays public: its rows are not the view's.) A function outside pg_catalog that such
a view or policy calls cannot be followed (its body names no dependency), nor can a foreign
table (its rows come from a server, maybe this database through a loopback), so a public
relation that reads through either is refused too, whatever it reads.
"""

from __future__ import annotations

from typing import Any, Mapping

from policies.tables import Relation

from .fetches import Fetches

__all__ = ["public_reads_protected", "public_leaking"]

# Every relation each root reads, transitively: inheritance and partition children, the
# relations a view's or materialized view's rewrite rules depend on, and those a row-level
# security policy's expressions read (its USING decides which rows come back).
def _depends(catalog: str, relation: str) -> str:
    """The (relation, relation it reads) edges of the objects of ``catalog`` (rules, policies):
    what ``pg_depend`` records they refer to, other than their own relation ``relation``."""
    return f"""
    SELECT o.{relation}, d.refobjid
    FROM pg_catalog.{catalog} o
    JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) o.oid
     AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.{catalog}'::pg_catalog.regclass
     AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
     AND d.refobjid OPERATOR(pg_catalog.<>) o.{relation}
    WHERE %s"""


_EDGES = f"""
WITH RECURSIVE edges(parent, child) AS (
    SELECT i.inhparent, i.inhrelid FROM pg_catalog.pg_inherits i
    UNION ALL{_depends("pg_rewrite", "ev_class")}
    UNION ALL{_depends("pg_policy", "polrelid")}
), reads(root, rel) AS (
    SELECT r, r FROM pg_catalog.unnest(%s::pg_catalog.oid[]) AS r
    UNION
    SELECT reads.root, edges.child FROM reads JOIN edges ON edges.parent OPERATOR(pg_catalog.=) reads.rel
)"""

_READS_SQL = _EDGES + """
SELECT root, rel FROM reads WHERE rel OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) ORDER BY root, rel
"""

# What each root reads that dpproxy cannot follow further: a function outside pg_catalog that
# a rule or row-level security policy calls (its body names no dependency), and a foreign table
# (its rows come from a server, maybe this database's protected table through a loopback).
_OPAQUE_SQL = _EDGES + """
SELECT DISTINCT root, what FROM (
    SELECT reads.root, 'function ' OPERATOR(pg_catalog.||) f.oid::pg_catalog.regprocedure::pg_catalog.text AS what
    FROM reads
    JOIN (SELECT ev_class AS rel, oid, 'pg_catalog.pg_rewrite'::pg_catalog.regclass AS catalog FROM pg_catalog.pg_rewrite
          UNION ALL
          SELECT polrelid, oid, 'pg_catalog.pg_policy'::pg_catalog.regclass FROM pg_catalog.pg_policy) o
      ON o.rel OPERATOR(pg_catalog.=) reads.rel
    JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) o.oid AND d.classid OPERATOR(pg_catalog.=) o.catalog
     AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
    JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) d.refobjid
    JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) f.pronamespace
    WHERE n.nspname OPERATOR(pg_catalog.<>) ALL (ARRAY['pg_catalog', 'information_schema']::pg_catalog.name[])
    UNION ALL
    SELECT reads.root, 'foreign table ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text
    FROM reads JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) reads.rel
    WHERE c.relkind OPERATOR(pg_catalog.=) 'f'
) opaque
ORDER BY 1, 2
"""



async def _leaks(session: Fetches, relations: Mapping[int, Relation]
                 ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(public root, protected relation it reads), (protected root, public child) and (public
    root, what it reads that cannot be followed: a function, a foreign table) pairs."""
    public = [oid for oid, relation in relations.items() if relation.access == "public"]
    protected = [oid for oid, relation in relations.items() if relation.access == "protected"]
    if not public or not protected:
        return [], [], []
    reads = await session.fetch_all(_READS_SQL, (True, True, public, protected))
    rows_of = await session.fetch_all(_READS_SQL, (False, False, protected, public))
    opaque = await session.fetch_all(_OPAQUE_SQL, (True, True, public))
    return reads, rows_of, opaque


async def public_leaking(session: Fetches, relations: Mapping[int, Relation]) -> frozenset[int]:
    """The OIDs of the public relations of ``relations`` that now read a protected one or are
    its inheritance child or partition: what :func:`public_reads_protected` refuses at load,
    found again after DDL since (``CREATE OR REPLACE VIEW``, ``ALTER TABLE ... INHERIT``)."""
    reads, rows_of, opaque = await _leaks(session, relations)
    return (frozenset(int(root) for root, _ in reads) | frozenset(int(rel) for _, rel in rows_of)
            | frozenset(int(root) for root, _ in opaque))


async def public_reads_protected(session: Fetches, relations: Mapping[int, Relation],
                                 names: Mapping[int, str]) -> list[str]:
    """A problem for each public relation of ``relations`` that reads a protected one, or is
    its inheritance child or partition.

    ``names`` gives each relation's name as the policy writes it (``tables.<name>``)."""
    reads, rows_of, opaque = await _leaks(session, relations)
    return [
        f"tables.{names[int(root)]}: a public relation that reads protected table {names[int(rel)]} (a view of it, "
        "its inheritance or partition parent, or a table whose row-level security policy reads it) would hand "
        "out its rows exactly; make it protected or remove it"
        for root, rel in reads
    ] + [
        f"tables.{names[int(rel)]}: a public inheritance child or partition of protected table {names[int(root)]} "
        "would hand out rows of that table exactly; make it protected or remove it"
        for root, rel in rows_of
    ] + [
        f"tables.{names[int(root)]}: a public relation that reads through {what}, which dpproxy cannot follow "
        "(a function's body, a foreign table's server), could read a protected table; make it protected or remove it"
        for root, what in opaque
    ]
