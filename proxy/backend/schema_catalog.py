"""The tables of a schema as the catalog describes them, for ``dpproxy draft-policy``.

Every query here reads ``pg_catalog`` only (relations, columns, types, primary keys, enum labels,
CHECK constraints of tables and domains): no row of a user's table is read, so the role that runs
them needs no ``SELECT`` on any table, and a bound or category it reports comes from what the
schema declares, never from the data (docs/threat-model.md, "Assumptions" 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Sequence

from rewriter.group_keys import DATE, TIME_TYPES
from rewriter.types import BOOL, INTEGER_TYPES, NUMERIC_TYPES

from .check_domains import Declared, declared_by_checks
from .type_support import builtin_types, value_types

__all__ = ["CatalogColumn", "CatalogTable", "ColumnKind", "NoSuchTable", "read_tables", "views_in"]



class _Session(Protocol):
    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


class NoSuchTable(LookupError):
    """A table named on the command line that the catalog does not hold (or cannot be a policy's);
    ``meant`` is the names of the relations a name differing only in case or quoting would have
    named, as SQL writes them (of a schema: as stored): what the user may have meant."""

    def __init__(self, message: str, meant: Sequence[str] = ()):
        super().__init__(message)
        self.meant = tuple(meant)


@dataclass
class CatalogColumn:
    """One column: its name, type as PostgreSQL prints it (``character varying(20)``), its
    :data:`ColumnKind`, its domain's name if it is of one, whether it is NOT NULL or in the
    primary key, an enum's labels in their sort order, and what the schema's CHECK constraints
    (the table's and its domain's) declare of its values."""

    name: str
    type_name: str
    kind: ColumnKind
    domain: str | None
    not_null: bool
    primary_key: bool
    enum_labels: tuple[str, ...] | None
    declared: Declared = field(default_factory=Declared)


@dataclass
class CatalogTable:
    schema: str
    name: str
    kind: str  # table, partitioned table, view, materialized view, foreign table
    columns: list[CatalogColumn]


ColumnKind = Literal["integer", "number", "date", "timestamp", "boolean", "enum", "text", "counted", "other"]
"""What a policy can declare of a column, by the type its values are read as (a domain's base
type): ``integer`` and ``number`` bounds, ``date`` and ``timestamp`` a time range, ``boolean``,
``enum`` and ``text`` categories; ``counted`` is a column only counted and tested for NULL (a type
not built in, or of unbounded length: ``ColumnInfo.unbounded_length``), ``other`` any other type
(``uuid``, ``bytea``, ``interval`` …), which a draft leaves to COUNT."""

_TEXT = frozenset({25, 1043, 1042})  # text, varchar, char

_KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table"}

# Each name read as SQL reads it (parse_ident: quotes kept, other letters folded to lower case),
# an unqualified one in the schema given, and looked up in the catalog itself: unlike
# to_regclass, which needs USAGE on the schema, this needs only the catalog, as the rest does.
_NAMED = """
SELECT r.name, c.oid, n.nspname, c.relname, c.relkind
FROM pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS r(name, i)
CROSS JOIN LATERAL pg_catalog.parse_ident(r.name) AS p(parts)
LEFT JOIN pg_catalog.pg_namespace n
       ON pg_catalog.cardinality(p.parts) OPERATOR(pg_catalog.<=) 2
      AND n.nspname OPERATOR(pg_catalog.=) CASE WHEN pg_catalog.cardinality(p.parts) OPERATOR(pg_catalog.=) 1
                                                THEN %s ELSE p.parts[1] END
LEFT JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid
      AND c.relname OPERATOR(pg_catalog.=) p.parts[pg_catalog.cardinality(p.parts)]
ORDER BY r.i
"""

# A name as SQL writes one: parts joined by dots, each quoted ("" for a quote) or an identifier
# (a letter, _ or a non-ASCII character, then those, digits and $). parse_ident raises on anything else.
_PART = r'(?:"(?:[^"]|"")+"|[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*)'
_SQL_NAME = re.compile(rf"{_PART}(?:\.{_PART})*")


# Tables, partitioned tables and materialized views of a schema; a partition is protected
# through its parent, so it is not listed on its own.
_IN_SCHEMA = """
SELECT c.oid, n.nspname, c.relname, c.relkind
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) %s AND c.relkind OPERATOR(pg_catalog.=) ANY('{r,p,m}'::pg_catalog."char"[])
  AND NOT c.relispartition
ORDER BY c.relname
"""

# The views and foreign tables of a schema, which a draft of the whole schema leaves to be named.
_VIEWS_IN_SCHEMA = """
SELECT c.relname
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE n.nspname OPERATOR(pg_catalog.=) %s AND c.relkind OPERATOR(pg_catalog.=) ANY('{v,f}'::pg_catalog."char"[])
ORDER BY c.relname
"""

_COLUMNS = """
SELECT a.attrelid, a.attname, a.atttypid, a.atttypmod, pg_catalog.format_type(a.atttypid, a.atttypmod),
       a.attnotnull, COALESCE(a.attnum OPERATOR(pg_catalog.=) ANY(i.indkey::pg_catalog.int2[]), false),
       CASE WHEN t.typtype OPERATOR(pg_catalog.=) 'd' THEN pg_catalog.format_type(t.oid, NULL) END
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid
LEFT JOIN pg_catalog.pg_index i ON i.indrelid OPERATOR(pg_catalog.=) a.attrelid AND i.indisprimary
WHERE a.attrelid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) AND a.attnum OPERATOR(pg_catalog.>) 0
  AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""

# Validated CHECK constraints of the tables (by relation) and of the domains their columns are
# of, through domains over domains (by the column's type OID).
_TABLE_CHECKS = """
SELECT conrelid, conname, pg_catalog.pg_get_constraintdef(oid) FROM pg_catalog.pg_constraint
WHERE contype OPERATOR(pg_catalog.=) 'c' AND convalidated AND conrelid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
ORDER BY conrelid, conname
"""
_DOMAIN_CHECKS = """
WITH RECURSIVE chain(root, oid) AS (
    SELECT t.oid, t.oid FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
    UNION ALL
    SELECT c.root, t.typbasetype FROM chain c JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.oid
    WHERE t.typtype OPERATOR(pg_catalog.=) 'd'
)
SELECT c.root, k.conname, pg_catalog.pg_get_constraintdef(k.oid)
FROM chain c JOIN pg_catalog.pg_constraint k ON k.contypid OPERATOR(pg_catalog.=) c.oid
WHERE k.contype OPERATOR(pg_catalog.=) 'c' AND k.convalidated
ORDER BY c.root, k.conname
"""
_ENUM_LABELS = """
SELECT e.enumtypid, pg_catalog.array_agg(e.enumlabel::pg_catalog.text ORDER BY e.enumsortorder)
FROM pg_catalog.pg_enum e WHERE e.enumtypid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) GROUP BY e.enumtypid
"""


# The relations, or schemas, a name not found would have named but for the case of its letters or
# its quotes: ``Sales.plain`` (which SQL reads as sales.plain) for "Sales".plain, ``Order.Items``
# for "Order.Items" of the schema given. Catalog names only.
_TABLES_MEANT = """
SELECT pg_catalog.format('%%I.%%I', n.nspname, c.relname)
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
WHERE c.relkind OPERATOR(pg_catalog.=) ANY('{r,p,v,m,f}'::pg_catalog."char"[]) AND NOT c.relispartition
  AND (pg_catalog.lower(n.nspname OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) c.relname)
           OPERATOR(pg_catalog.=) pg_catalog.lower(%s)
       OR (n.nspname OPERATOR(pg_catalog.=) %s AND pg_catalog.lower(c.relname) OPERATOR(pg_catalog.=) pg_catalog.lower(%s)))
ORDER BY 1 LIMIT 3
"""
_SCHEMAS_MEANT = """
SELECT nspname FROM pg_catalog.pg_namespace
WHERE pg_catalog.lower(nspname) OPERATOR(pg_catalog.=) pg_catalog.lower(%s) ORDER BY 1 LIMIT 3
"""


async def _tables_meant(session: _Session, given: str, schema: str) -> list[str]:
    bare = given.replace('"', "")
    return [str(name) for name, in await session.fetch_all(_TABLES_MEANT, (bare, schema, bare))]


async def read_tables(session: _Session, schema: str, names: Sequence[str]) -> list[CatalogTable]:
    """The tables ``names`` (each as SQL names it: ``orders``, ``sales.orders``, ``"Orders"``; an
    unqualified one in ``schema``), or, with no names, every table of ``schema``; each with its
    columns in order. Raises :class:`NoSuchTable` for a name (or, without names, a schema) the
    catalog does not hold."""
    if names:
        malformed = next((name for name in names if _SQL_NAME.fullmatch(name) is None), None)
        if malformed is not None:
            raise NoSuchTable(f"no table {malformed} on the backend", await _tables_meant(session, malformed, schema))
        relations = []
        rows = await session.fetch_all(_NAMED, (list(names), schema))
        for given, (_, oid, nspname, relname, relkind) in zip(names, rows):
            if oid is None:
                raise NoSuchTable(f"no table {given} on the backend", await _tables_meant(session, given, schema))
            if relkind not in _KINDS:
                raise NoSuchTable(f"{given} is not a table, view or materialized view (relkind {relkind})")
            relations.append((int(oid), str(nspname), str(relname), str(relkind)))
    else:
        if not await session.fetch_all("SELECT FROM pg_catalog.pg_namespace WHERE nspname OPERATOR(pg_catalog.=) %s",
                                       (schema,)):
            meant = await session.fetch_all(_SCHEMAS_MEANT, (schema,))
            raise NoSuchTable(f"there is no schema {schema} on the backend", [str(name) for name, in meant])
        relations = [(int(oid), str(n), str(r), str(k)) for oid, n, r, k in await session.fetch_all(_IN_SCHEMA, (schema,))]
    oids = [oid for oid, *_ in relations]
    rows = await session.fetch_all(_COLUMNS, (oids,))
    types = {(int(row[2]), int(row[3])) for row in rows}
    read_as = await value_types(session, types)
    builtin = await builtin_types(session, {oid for oid, _ in types})
    enum_types = {read_as[t].base_type_oid or t[0] for t in types if t in read_as}
    labels = {int(oid): tuple(values) for oid, values in await session.fetch_all(_ENUM_LABELS, (sorted(enum_types),))}
    table_checks: dict[int, list[tuple[str, str]]] = {}
    for relid, name, definition in await session.fetch_all(_TABLE_CHECKS, (oids,)):
        table_checks.setdefault(int(relid), []).append((str(name), str(definition)))
    domain_checks: dict[int, list[tuple[str, str]]] = {}
    for root, name, definition in await session.fetch_all(_DOMAIN_CHECKS, (sorted(t for t, _ in types),)):
        domain_checks.setdefault(int(root), []).append((str(name), str(definition)))

    columns: dict[int, list[CatalogColumn]] = {}
    for relid, name, type_oid, modifier, type_name, not_null, primary_key, domain in rows:
        value = read_as.get((int(type_oid), int(modifier)))
        base = (value.base_type_oid or int(type_oid)) if value is not None else int(type_oid)
        counted = value is None or value.unbounded_length or int(type_oid) not in builtin
        kind = "counted" if counted else _kind(base, base in labels)
        column = CatalogColumn(str(name), str(type_name), kind, domain, bool(not_null), bool(primary_key),
                               labels.get(base))
        column.declared = _declared(column.name, table_checks.get(int(relid), []), domain_checks.get(int(type_oid), []))
        columns.setdefault(int(relid), []).append(column)
    return [CatalogTable(nspname, relname, _KINDS[relkind], columns.get(oid, []))
            for oid, nspname, relname, relkind in relations]


async def views_in(session: _Session, schema: str) -> list[str]:
    """The names of the views and foreign tables of ``schema``: ``read_tables`` without names
    leaves them out, since a view is protected only if it computes nothing that can fail on a
    row (docs/policy.md, ``tables``), which its author knows and the catalog does not say."""
    return [str(name) for name, in await session.fetch_all(_VIEWS_IN_SCHEMA, (schema,))]


def _kind(base_type: int, enum: bool) -> ColumnKind:
    if base_type in INTEGER_TYPES:
        return "integer"
    if base_type in NUMERIC_TYPES:
        return "number"
    if base_type == DATE:
        return "date"
    if base_type in TIME_TYPES:
        return "timestamp"
    if base_type == BOOL:
        return "boolean"
    if enum:
        return "enum"
    return "text" if base_type in _TEXT else "other"


def _declared(column: str, table_checks: list[tuple[str, str]], domain_checks: list[tuple[str, str]]) -> Declared:
    """What the table's and the column's domain's CHECK constraints together declare of ``column``."""
    merged = Declared()
    for found in (declared_by_checks(table_checks).get(column), declared_by_checks(domain_checks, column).get(column)):
        if found is None:
            continue
        if found.lower is not None:
            merged.narrow_lower(found.lower, found.lower_strict)
        if found.upper is not None:
            merged.narrow_upper(found.upper, found.upper_strict)
        if found.values is not None:
            merged.narrow_values(found.values)
        for source in found.sources:
            merged.add_source(source)
    return merged
