"""Whether the service role may read the policy's protected tables.

A DP query is charged before the backend runs it, so a protected table the service role
cannot read would charge every query on it and then fail with ``permission denied``: budget
spent on answers that were never given, for a reason no row decides. ``serve``, a reload and
``check-config`` refuse such a policy instead, naming the GRANT that is missing. A role reads
a relation when it has SELECT on it, or on every one of its columns (column privileges).

A privilege revoked while dpproxy runs is found by the periodic re-check (``unreadable``, from
``proxy.serving.server``): statements on such a table are refused before the charge until a
re-check finds the privilege back.
"""

from __future__ import annotations

from typing import Mapping

from policies.tables import Relation, quote_identifier

from .fetches import Fetches

__all__ = ["schemas_without_usage", "unreadable", "unreadable_protected"]

# has_table_privilege and has_column_privilege as the session's role (the service role).
_UNREADABLE_SQL = """
SELECT c.oid, CURRENT_USER::pg_catalog.text FROM pg_catalog.pg_class c
WHERE c.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
  AND NOT pg_catalog.has_table_privilege(c.oid, 'SELECT')
  AND EXISTS (SELECT FROM pg_catalog.pg_attribute a
              WHERE a.attrelid OPERATOR(pg_catalog.=) c.oid AND a.attnum OPERATOR(pg_catalog.>) 0
                AND NOT a.attisdropped
                AND NOT pg_catalog.has_column_privilege(c.oid, a.attnum, 'SELECT'))
ORDER BY c.oid
"""


# A schema the role has no USAGE on: PostgreSQL refuses to look a qualified name up in it
# ("permission denied for schema"), for every table of it, before any SELECT privilege counts.
_NO_USAGE_SQL = """
SELECT n.nspname::pg_catalog.text, CURRENT_USER::pg_catalog.text FROM pg_catalog.pg_namespace n
WHERE n.nspname OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.text[])
  AND NOT pg_catalog.has_schema_privilege(n.oid, 'USAGE')
"""


async def schemas_without_usage(session: Fetches, tables: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """(policy table name, problem) for each of ``tables`` (policy name: its schema, None when
    unqualified) in a schema the session's role has no USAGE on, with the GRANT that is missing.
    Those names cannot even be resolved: the caller leaves them out of the resolution."""
    schemas = sorted({schema for schema in tables.values() if schema is not None})
    if not schemas:
        return []
    blocked = {str(schema): str(role) for schema, role in await session.fetch_all(_NO_USAGE_SQL, (schemas,))}
    return [
        (name, f"tables.{name}: the service role cannot use the schema {quote_identifier(schema)} on the backend, "
               f"so it can read no table in it; GRANT USAGE ON SCHEMA {quote_identifier(schema)} "
               f"TO {quote_identifier(blocked[schema])}")
        for name, schema in tables.items() if schema in blocked
    ]


async def unreadable(session: Fetches, relations: Mapping[int, Relation]) -> dict[int, str]:
    """The protected relations of ``relations`` the session's role has no SELECT on, by OID,
    each with that role's name (the one a GRANT must name)."""
    protected = [oid for oid, relation in relations.items() if relation.access == "protected"]
    if not protected:
        return {}
    return {int(oid): str(role) for oid, role in await session.fetch_all(_UNREADABLE_SQL, (protected,))}


async def unreadable_protected(session: Fetches, relations: Mapping[int, Relation],
                               names: Mapping[int, str]) -> list[str]:
    """A problem (``tables.<name>: ...``) for each protected relation of ``relations`` the
    session's role has no SELECT on; ``names`` gives each as the policy writes it."""
    return [
        f"tables.{names[oid]}: the service role cannot read {relations[oid].qualified_name} "
        f"on the backend, so every DP query on it would be charged and then fail; "
        f"GRANT SELECT ON {relations[oid].qualified_name} TO {quote_identifier(role)}"
        for oid, role in (await unreadable(session, relations)).items()
    ]
