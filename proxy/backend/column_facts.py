"""What the catalog says of protected tables' columns: the facts dpproxy judges statements by.

The rewriter keeps every accepted statement total on the strength of these facts: LIKE is refused
on a column of a nondeterministic collation, comparisons of arrays, composites and types not built
in are refused, the type decides which comparisons, bounds and clamps are written. They are read
when the policy is loaded (``build_registry`` makes each ``ColumnInfo`` of them, and the registry
keeps them as read) and again by the periodic re-check (``proxy.serving.server``): a table altered
since (``ALTER TABLE ... ALTER COLUMN ... TYPE``, another collation, a column dropped and added
again, ``ALTER DOMAIN ... ADD CONSTRAINT``, ``ALTER TYPE`` of a composite or an enum it holds, the table
dropped) would be judged by facts that are no longer true, and a statement accepted so could fail
on the backend after its charge, on some rows only: LIKE on a column made nondeterministic fails
exactly when a row reaches it. So the re-check resolves the policy in force again when a table's
facts differ (``Server._resolve_again``): the new definition is in force if the policy fits it, and
the table's statements are refused before the charge if not, until a reload of a policy that fits
(or a re-check finds it back as loaded).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from policies.tables import ColumnFacts, Definition

from .fetches import Fetches
from .type_support import type_parts

__all__ = ["BYTE_ORDER_LOCALES", "column_facts", "definition_change", "redefined"]

BYTE_ORDER_LOCALES = ("C", "POSIX", "C.UTF-8", "C.utf8")
"""libc locales whose collation orders text by its bytes: ``strcoll`` under ``C.UTF-8`` measured as
cheap a byte as ``memcmp`` (benchmarks/collation_cost.py, glibc 2.36)."""

# One round trip for all relations. The collation and the type are the column's own; the parts
# (type_parts) and their domains' constraints are what its type holds, gathered once per type.
_FACTS_SQL = "WITH RECURSIVE columns AS (" + """
    -- A relation without columns is a row of NULLs: it exists.
    SELECT r.oid AS relation, a.attname, a.atttypid, a.atttypmod, a.attnum, a.attcollation FROM pg_catalog.pg_class r
    LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) r.oid AND a.attnum OPERATOR(pg_catalog.>) 0
      AND NOT a.attisdropped
    WHERE r.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
), """ + type_parts("SELECT DISTINCT atttypid FROM columns WHERE atttypid IS NOT NULL") + """, held AS (
    SELECT p.root, pg_catalog.array_agg(DISTINCT p.part ORDER BY p.part) AS parts,
           pg_catalog.array_agg(DISTINCT k.oid ORDER BY k.oid) FILTER (WHERE k.oid IS NOT NULL) AS checks
    FROM parts p LEFT JOIN pg_catalog.pg_constraint k ON k.contypid OPERATOR(pg_catalog.=) p.part
    GROUP BY p.root
)
SELECT a.relation, a.attname::pg_catalog.text, a.atttypid, a.atttypmod, a.attnum, COALESCE(c.collisdeterministic, true),
       COALESCE(t.typarray, 0),
       -- Arrays and composites, and domains over them (a domain has its base type's category).
       COALESCE(t.typcategory OPERATOR(pg_catalog.=) 'A' OR t.typcategory OPERATOR(pg_catalog.=) 'C', false),
       COALESCE(t.typcategory OPERATOR(pg_catalog.=) 'E', false),
       COALESCE(h.parts, '{}'::pg_catalog.oid[]), COALESCE(h.checks, '{}'::pg_catalog.oid[]),
       COALESCE((SELECT pg_catalog.array_agg(e.enumlabel::pg_catalog.text ORDER BY e.enumtypid, e.enumsortorder)
                 FROM pg_catalog.pg_enum e WHERE e.enumtypid OPERATOR(pg_catalog.=) ANY(h.parts)),
                '{}'::pg_catalog.text[]),
       -- Whether the collation orders by bytes (ColumnInfo.byte_order): none, libc's C, POSIX and C.UTF-8, the
       -- builtin provider's (PostgreSQL 17), the database's default when it is one of them; not ICU's.
       COALESCE(CASE WHEN c.oid IS NULL THEN true
           WHEN c.collprovider OPERATOR(pg_catalog.=) 'd' THEN (
               SELECT d.datlocprovider OPERATOR(pg_catalog.=) 'b' OR (d.datlocprovider OPERATOR(pg_catalog.=) 'c'
                      AND d.datcollate OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.text[]))
               FROM pg_catalog.pg_database d WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
           WHEN c.collprovider OPERATOR(pg_catalog.=) 'c' THEN c.collcollate OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.text[])
           ELSE c.collprovider OPERATOR(pg_catalog.=) 'b' END, false),
       -- The column's own collation unless it is the database's default (provider 'd'): ColumnInfo.collation.
       CASE WHEN c.collprovider OPERATOR(pg_catalog.<>) 'd'
            THEN ARRAY[n.nspname::pg_catalog.text, c.collname::pg_catalog.text] END
FROM columns a
LEFT JOIN pg_catalog.pg_collation c ON c.oid OPERATOR(pg_catalog.=) a.attcollation
LEFT JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.collnamespace
LEFT JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
LEFT JOIN held h ON h.root OPERATOR(pg_catalog.=) a.atttypid
ORDER BY a.relation, a.attnum
"""


async def column_facts(session: Fetches, oids: Sequence[int]) -> dict[int, Definition]:
    """Each relation of ``oids`` the catalog holds (one that was dropped is absent), with its
    columns' facts in column order (none for a relation without columns)."""
    if not oids:
        return {}
    found: dict[int, list[ColumnFacts]] = {}
    # psycopg gives each value as the Python type ColumnFacts holds (oid, int2, int4: int).
    for relation, name, typ, mod, num, deterministic, array, container, enum, parts, checks, labels, byte_order, \
            collation in await session.fetch_all(_FACTS_SQL, (list(oids), list(BYTE_ORDER_LOCALES),
                                                              list(BYTE_ORDER_LOCALES))):
        columns = found.setdefault(relation, [])
        if name is not None:  # else a relation without columns
            columns.append(ColumnFacts(name, typ, mod, num, deterministic, array, container, enum, tuple(parts),
                                       tuple(checks), tuple(labels), byte_order,
                                       (collation[0], collation[1]) if collation is not None else None))
    return {oid: tuple(columns) for oid, columns in found.items()}


def definition_change(loaded: Definition, current: Definition | None) -> str | None:
    """What differs between a relation's definition as loaded and as it is now (None: nothing),
    naming the first column that differs. Any difference counts, a widening one (``integer`` to
    ``bigint``) too: none is judged harmless by itself; each is taken in only through the checks
    of a resolution of the policy (``Server._resolve_again``), as a reload would."""
    if current is None:
        return "it was dropped (a table created under its name since is another relation)"
    now = {column.name: column for column in current}
    for column in loaded:
        other = now.get(column.name)
        if other is None:
            return f"column {column.name} was dropped or renamed"
        if other != column:
            return f"column {column.name} was altered ({_what_changed(column, other)})"
    then = {column.name for column in loaded}
    added = [column.name for column in current if column.name not in then]
    return f"column {added[0]} was added" if added else None


def _what_changed(loaded: ColumnFacts, current: ColumnFacts) -> str:
    if (loaded.type_oid, loaded.type_modifier) != (current.type_oid, current.type_modifier):
        return "its type"
    if (loaded.deterministic_collation, loaded.byte_order, loaded.collation) \
            != (current.deterministic_collation, current.byte_order, current.collation):
        return "its collation"
    if loaded.attnum != current.attnum:
        return "dropped and added again"
    if loaded.domain_constraints != current.domain_constraints:
        return "a constraint of its domain"
    if loaded.enum_labels != current.enum_labels:
        return "the labels of its enum"
    return "the types its values hold"


async def redefined(session: Fetches, definitions: Mapping[int, Definition]) -> dict[int, str]:
    """The relations of ``definitions`` (OID: definition as loaded) whose definition differs now,
    by OID, each with what changed (the periodic re-check's question)."""
    current = await column_facts(session, list(definitions))
    changes = {oid: definition_change(loaded, current.get(oid)) for oid, loaded in definitions.items()}
    return {oid: change for oid, change in changes.items() if change is not None}
