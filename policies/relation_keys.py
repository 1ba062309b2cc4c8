"""The relation a key of the policy's ``tables`` names, and the key that names a relation.

A key is the relation's name as stored in the catalog (case kept, nothing folded): ``adult``,
resolved with the service role's ``search_path``, or ``schema.table``, split at its last dot.
A schema or table whose name holds a dot (``"Sales"."Order.Items"``) or a double quote cannot
be told apart so; its key is written with each part in double quotes, as SQL writes it, a
doubled ``""`` standing for a quote inside one. In such a key every part is quoted, so that
no part is read by a rule other than the one written: ``"Sales"."Order.Items"`` or
``"Order.Items"``, never ``Sales."Order.Items"``.
"""

from __future__ import annotations

import re

from .sql_names import quote_identifier

__all__ = ["QUOTED_FORM", "key_parts", "policy_key"]

QUOTED_FORM = 'each part in double quotes, as SQL writes it: \'"Sales"."Order.Items"\' (a "" for a quote inside one)'

_QUOTED_PART = r'"((?:[^"]|"")+)"'
_QUOTED = re.compile(rf"{_QUOTED_PART}(?:\.{_QUOTED_PART})?")


def key_parts(key: str) -> tuple[str | None, str]:
    """(schema, table) of the relation ``key`` names, the schema None for an unqualified one.

    Raises ValueError, saying how to write it, for a key that holds a double quote and is not
    one or two quoted parts joined by a dot."""
    if '"' not in key:
        schema, _, table = key.rpartition(".")
        return schema or None, table
    quoted = _QUOTED.fullmatch(key)
    if quoted is None:
        raise ValueError(f"not a relation's name: a key with a double quote in it has {QUOTED_FORM}")
    first, second = (part.replace('""', '"') if part is not None else None for part in quoted.groups())
    assert first is not None
    return (first, second) if second is not None else (None, first)


def policy_key(schema: str, table: str) -> str:
    """The key naming ``schema.table``: plain where a dot or quote in it cannot mislead, else quoted."""
    if not any(mark in part for part in (schema, table) for mark in '."'):
        return f"{schema}.{table}"
    return ".".join(quote_identifier(part) for part in (schema, table))
