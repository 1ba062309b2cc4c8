"""Names as PostgreSQL's ``quote_ident`` writes them: bare where SQL reads them back as they are.

A name is left bare when it is lowercase ASCII letters, digits and underscores, not starting with
a digit, and not a keyword SQL reserves in any position a name can take (PostgreSQL's reserved,
``col_name`` and ``type_func_name`` keywords); anything else is written in double quotes, a
double quote inside doubled. ``Order.Items`` in schema ``Sales`` is shown as
``"Sales"."Order.Items"``, not ``Sales.Order.Items``, which reads as another relation.

The keywords are those of PostgreSQL 13 to 17 together: a name that is a keyword of a newer
release only is quoted too, which every release reads back as the same name.
"""

from __future__ import annotations

import re

__all__ = ["QUOTED_KEYWORDS", "quote_ident", "quote_identifier"]

# PostgreSQL's src/include/parser/kwlist.h: every keyword not marked UNRESERVED_KEYWORD.
QUOTED_KEYWORDS = frozenset("""
all analyse analyze and any array as asc asymmetric authorization between bigint binary bit boolean both
case cast char character check coalesce collate collation column concurrently constraint create cross
current_catalog current_date current_role current_schema current_time current_timestamp current_user
dec decimal default deferrable desc distinct do else end except exists extract false fetch float for
foreign freeze from full grant greatest group grouping having ilike in initially inner inout int integer
intersect interval into is isnull join json_array json_arrayagg json_exists json_object json_objectagg
json_query json_scalar json_serialize json_table json_value lateral leading least left like limit
localtime localtimestamp merge_action national natural nchar none normalize not notnull null nullif
numeric offset on only or order out outer overlaps overlay placing position precision primary real
references returning right row select session_user setof similar smallint some substring symmetric
system_user table tablesample then time timestamp to trailing treat trim true union unique user using
values varchar variadic verbose when where window with xmlattributes xmlconcat xmlelement xmlexists
xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable
""".split())

_BARE = re.compile(r"[a-z_][a-z0-9_]*")


def quote_ident(name: str) -> str:
    """``name`` as ``quote_ident(name)`` returns it: bare if SQL reads it back unchanged, else quoted."""
    if _BARE.fullmatch(name) and name not in QUOTED_KEYWORDS:
        return name
    return quote_identifier(name)


def quote_identifier(identifier: str) -> str:
    """``identifier`` as a quoted SQL name: case and any character kept exactly."""
    return '"' + identifier.replace('"', '""') + '"'
