"""Notes on literals compared with a categorical column that are not among its declared categories.

A column's ``categories`` are public (the policy, ``SHOW dpproxy.columns``), so saying that a
literal of the statement is not one of them costs no privacy: the note is computed from the
policy and the statement's text alone, never from rows, and it changes neither the statement's
plan, its charge, its repeat key nor its answer (:attr:`rewriter.dp_query.AggregateQuery.notes`,
sent as NOTICEs before the answer's own). The condition still runs as written: the rows may hold
values the policy does not declare, which ``col = 'x'`` matches as PostgreSQL does.

Noted: ``col = 'x'``, ``col <> 'x'`` and each literal of ``col [NOT] IN ('x', ...)``, wherever the
safe predicate language renders them (WHERE, an aggregate's FILTER, the CASE WHEN forms BI tools
send for it), with ``col`` a column as it is, of a text type (text, varchar, char, or a domain over
one) with a deterministic collation, that declares ``categories``, and ``'x'`` a string literal
uncast. A literal that is a declared category is not noted; nor, on ``char(n)``, one that differs
from a category only by trailing spaces (one value of the type). A literal that differs from
categories only in case or surrounding spaces names them (``did you mean 'Male'?``); any other
names the declared categories (up to :data:`_LISTED`). The ``other`` label is noted for what it is
in a condition: the rows holding that text, not the rows its GROUP BY key collects.

Not noted: a parameter (its value is not in the text), a cast literal, ``lower(col)``/``upper(col)``,
LIKE, ordering comparisons and BETWEEN, a column under a nondeterministic collation (where
``'male' = 'Male'`` may hold), and columns of other types (an enum rejects an unknown label itself,
a boolean reads ``'yes'`` as true).
"""

from __future__ import annotations

from policies.tables import ColumnInfo

__all__ = ["MAX_NOTES", "category_note", "more_notes"]

MAX_NOTES = 5  # per statement: a long IN list of misspellings gets a count for the rest
_LISTED = 10  # declared categories named in a note, at most
_TEXT_TYPES = frozenset({25, 1043, 1042})  # text, varchar, bpchar
_BPCHAR = 1042


def category_note(column: ColumnInfo, value: str) -> str | None:
    """The note for ``column = 'value'`` (module docstring), or None when there is nothing to say."""
    policy = column.policy
    if (policy is None or policy.categories is None or column.enum or not column.deterministic_collation
            or column.value_type[0] not in _TEXT_TYPES):
        return None
    padded = column.value_type[0] == _BPCHAR

    def same(one: str, other: str) -> bool:  # one value of the column's type
        return one.rstrip(" ") == other.rstrip(" ") if padded else one == other

    if any(same(value, category) for category in policy.categories):
        return None
    quoted = _quoted(value)
    if policy.other is not None and same(value, policy.other):
        return (f"dpproxy: {quoted} is the 'other' key of {column.name}, not one of its declared categories: "
                f"a condition matches the rows holding {quoted} itself, not the NULL and undeclared values "
                "its GROUP BY key collects")
    near = [category for category in policy.categories if category.strip().casefold() == value.strip().casefold()]
    if near:
        return (f"dpproxy: {quoted} is not one of the declared categories of {column.name}; did you mean "
                f"{' or '.join(_quoted(category) for category in near)}?")
    declared = policy.categories
    named = ", ".join(_quoted(category) for category in declared[:_LISTED])
    if len(declared) > _LISTED:
        named += f" and {len(declared) - _LISTED} more (SHOW dpproxy.columns lists them)"
    return (f"dpproxy: {quoted} is not one of the declared categories of {column.name} ({named}); "
            "the condition is applied as written")


def more_notes(count: int) -> str:
    """The note standing for ``count`` notes past :data:`MAX_NOTES`."""
    return f"dpproxy: {count} more literal{'' if count == 1 else 's'} not among declared categories"


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
