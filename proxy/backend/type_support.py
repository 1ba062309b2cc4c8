"""What PostgreSQL can do with a column's type, asked of the backend over no row at all.

Some of a DP query's backend SQL needs operators of the column's type that PostgreSQL looks up
while it parses the statement: ``count(DISTINCT col)`` sorts by the type's ordering, MODE
compares the column with each category (``col = 'label'``), a category GROUP BY groups by the
column. On a type without them (``json``, ``point``, ``box``, ``xid``; an array or composite of
such a type) every such statement fails, whatever the rows, but only on the backend: after its
charge. So they are asked here, when the policy is loaded, by parsing each shape over a typed
NULL that reads no table; the answers depend on the schema alone.

A type that is not built into PostgreSQL (an extension's, such as pgvector's ``vector``, or a
user's base, range or composite type) is another matter: its comparison, equality and hash
functions are arbitrary code that parses and runs on a NULL and may still raise on some pairs of
values (``vector``'s on two of different dimensions). :func:`builtin_types` tells the columns whose
values reach such a type, through domains, array elements, composite fields and range subtypes;
they are counted and tested for NULL, nothing else (``ColumnInfo.builtin``).
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Protocol, Sequence

from rewriter.sql_text import literal, operator

from .errors import BackendError, BackendLost, BackendUnavailable

__all__ = ["ValueType", "builtin_types", "distinct_countable", "label_comparison_problem", "type_names", "type_parts",
           "value_types"]


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


def type_parts(roots: str) -> str:
    """A recursive CTE ``parts(root, part)`` (for a ``WITH RECURSIVE``): each type of ``roots`` (a
    query of one column of type OIDs) with every type its values hold, recursively and itself
    included: a domain's base type, an array's element, a composite's fields, a range's subtype, a
    multirange's range."""
    return f"""parts(root, part) AS (
    SELECT t, t FROM ({roots}) AS roots(t)
    UNION
    SELECT p.root, c.child FROM parts p JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) p.part
    CROSS JOIN LATERAL (
        SELECT t.typbasetype WHERE t.typtype OPERATOR(pg_catalog.=) 'd'
        UNION ALL SELECT e.oid FROM pg_catalog.pg_type e WHERE e.typarray OPERATOR(pg_catalog.=) t.oid
        UNION ALL SELECT a.atttypid FROM pg_catalog.pg_attribute a
            WHERE t.typtype OPERATOR(pg_catalog.=) 'c' AND a.attrelid OPERATOR(pg_catalog.=) t.typrelid
            AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
        UNION ALL SELECT r.rngsubtype FROM pg_catalog.pg_range r WHERE r.rngtypid OPERATOR(pg_catalog.=) t.oid
        UNION ALL SELECT r.rngtypid FROM pg_catalog.pg_range r WHERE r.rngmultitypid OPERATOR(pg_catalog.=) t.oid
    ) AS c(child)
)"""


# Each type whose parts (type_parts) hold a foreign one: a part whose OID is not initdb's
# (FirstNormalObjectId, 16384), whatever its schema (an extension created in pg_catalog has its
# operators found by OPERATOR(pg_catalog.=)), and that is neither a domain (its base type is a
# part of its own), an enum (compared by its labels' built-in sort order) nor an array (its
# element is).
_FOREIGN = "WITH RECURSIVE " + type_parts("SELECT pg_catalog.unnest(%s::pg_catalog.oid[])") + """
SELECT p.root FROM parts p JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) p.part
WHERE p.part OPERATOR(pg_catalog.>=) 16384 AND t.typtype OPERATOR(pg_catalog.<>) ALL ('{d,e}'::pg_catalog."char"[])
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_type e WHERE e.typarray OPERATOR(pg_catalog.=) t.oid)
"""


async def builtin_types(session: _Session, type_oids: Iterable[int]) -> frozenset[int]:
    """The types of ``type_oids`` whose values are built into PostgreSQL through and through: no
    part of them (``_FOREIGN``) is an extension's or a user's type. A type the catalog lacks is not."""
    oids = sorted(set(type_oids))
    foreign = {int(oid) for (oid,) in await session.fetch_all(_FOREIGN, (oids,))}
    known = {int(oid) for (oid,) in await session.fetch_all(
        "SELECT oid FROM pg_catalog.pg_type WHERE oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])", (oids,))}
    return frozenset(known - foreign)


class ValueType(NamedTuple):
    """What a column type's values are read as (:func:`value_types`): a domain's base type and the
    modifier its chain declares (0, -1 for a type that is no domain), and whether one value can be
    of any length with no header telling its size without reading it (``ColumnInfo.unbounded_length``)."""

    base_type_oid: int
    base_type_modifier: int
    unbounded_length: bool


# text, varchar, char (bpchar), bytea: octet_length reads a value's size from its header
# (rewriter/text_bounds.py); a numeric of no declared precision is read only when stored in the row
# uncompressed in at most 127 bytes (pg_column_size, pg_column_compression: the header; rewriter/text_bounds.py);
# inet and cidr hold at most 22 bytes.
_BOUNDED_VARLENA = frozenset({25, 1043, 1042, 17, 1700, 869, 650})
_BIT = 1560  # bit(n): exactly n bits, bounded as text is at the default max_text_bytes (256 bytes)
_MAX_BITS = 8 * 256
# Each type, resolved through its domains to its base type (the modifier a domain in the chain
# declares), with that base type's length: -1 is a varlena of any length, but a range of a
# fixed-length subtype (int4range, daterange, tstzrange …) holds two bounds at most.
_VALUE_TYPES = """WITH RECURSIVE chain(root, oid, modifier) AS (
    SELECT t.oid, t.oid, t.typtypmod FROM pg_catalog.pg_type t WHERE t.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
    UNION ALL
    SELECT c.root, t.typbasetype, GREATEST(c.modifier, t.typtypmod) FROM chain c
    JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) c.oid WHERE t.typtype OPERATOR(pg_catalog.=) 'd'
)
SELECT c.root, c.oid, c.modifier, b.typlen OPERATOR(pg_catalog.=) -1 AND NOT EXISTS (
    SELECT FROM pg_catalog.pg_range r JOIN pg_catalog.pg_type s ON s.oid OPERATOR(pg_catalog.=) r.rngsubtype
    WHERE r.rngtypid OPERATOR(pg_catalog.=) b.oid AND s.typlen OPERATOR(pg_catalog.>) 0)
FROM chain c JOIN pg_catalog.pg_type b ON b.oid OPERATOR(pg_catalog.=) c.oid
WHERE b.typtype OPERATOR(pg_catalog.<>) 'd'
"""


async def value_types(session: _Session, types: Iterable[tuple[int, int]]) -> dict[tuple[int, int], ValueType]:
    """Each (type OID, modifier) of ``types`` whose type the catalog holds, as its values are read
    (:class:`ValueType`). A ``bit(n)`` of at most 2,048 bits is of bounded length; a longer one is not."""
    wanted = set(types)
    chains = {int(root): (int(base), int(modifier), bool(varlena)) for root, base, modifier, varlena
              in await session.fetch_all(_VALUE_TYPES, (sorted({oid for oid, _ in wanted}),))}
    found = {}
    for type_oid, type_modifier in wanted:
        if type_oid not in chains:
            continue
        base, chain_modifier, varlena = chains[type_oid]
        domain = base != type_oid
        modifier = chain_modifier if domain else type_modifier
        bounded = base in _BOUNDED_VARLENA or (base == _BIT and 0 < modifier <= _MAX_BITS)
        found[type_oid, type_modifier] = ValueType(base if domain else 0, modifier if domain else -1,
                                                   varlena and not bounded)
    return found


async def type_names(session: _Session, types: Iterable[tuple[int, int]]) -> dict[tuple[int, int], str]:
    """Each (type OID, modifier) of ``types`` as ``format_type`` writes it (what psql's ``\\d`` shows),
    in one round trip. Catalog only: nothing of any row."""
    wanted = sorted(set(types))
    if not wanted:
        return {}
    rows = await session.fetch_all(
        "SELECT t, m, pg_catalog.format_type(t, m) "
        "FROM ROWS FROM (pg_catalog.unnest(%s::pg_catalog.oid[]), pg_catalog.unnest(%s::pg_catalog.int4[])) AS u(t, m)",
        ([oid for oid, _ in wanted], [modifier for _, modifier in wanted]))
    return {(int(oid), int(modifier)): name for oid, modifier, name in rows}
