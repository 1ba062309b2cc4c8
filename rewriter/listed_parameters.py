"""IN lists holding parameters, whose reading as ``x = a OR x = b`` holds only for some declared types.

dpproxy writes ``x IN (a, b)`` as ``x = a OR x = b`` (rewriter.predicates), each ``=`` resolved
alone. PostgreSQL resolves the list as one: it converts ``x`` and every value to their common type
(``transformAExprIn``), and an unspecified parameter gets that type. Where a parameter's type is
only known at Bind, the two readings can differ by the declared types alone, whatever the rows:
``d IN ($1, $2)`` on a date column with ``$1`` unspecified and ``$2`` declared ``timestamp`` reads
``$1`` as a timestamp to PostgreSQL (``'2000-05-01 11:59:59'`` is no date's midnight) and as a date
to dpproxy's ``d = $1`` (``2000-05-01``); found by the round-trip check of parameters
(tests/round_trip_parameters.py). :class:`ListedParameters` records such a list at planning and
:meth:`ListedParameters.one_reading` says, from the declared types, whether the two readings are
one (proxy.dp.parameter_types refuses the statement before any charge where they are not).

Rule ``in-list-types`` (rewriter.misreadings) judges the written types of a list's values; this
one, the types its parameters are declared with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .types import FLOAT8, INTEGER_TYPES, NUMERIC

__all__ = ["INFERRED", "ListedParameters"]

INFERRED = frozenset({0, 705})
"""Declared types that leave a parameter's type to PostgreSQL: unspecified, unknown. (A statement
that leaves such a parameter out, its value folded, fails with 42P18 unless its type is given: the
backend SQL's are described first, proxy.dp.folding, proxy.dp.narrowing.)"""


# A text or varchar column compares alike, as text, with a value of any of these types or of none.
_TEXT_COLUMNS = frozenset({25, 1043})
_TEXT_VALUES = frozenset({18, 19, 25, 1043}) | INFERRED
_BPCHAR = 1042


def _family(type_oid: int) -> int:
    """``type_oid`` with the integer types as one: their comparisons with each other, and with an
    integer column, are exact in any of them, so a list of all three reads as one type."""
    return 20 if type_oid in INTEGER_TYPES else type_oid


@dataclass(frozen=True)
class ListedParameters:
    """An IN list (rendered as ORs) holding bare parameters: their numbers, the type of the column
    it compares, and what else it holds: ``"none"``, ``"untyped"`` (string and number literals
    only, whose type PostgreSQL also takes from the others) or ``"typed"`` (anything else: a cast, a
    typed literal, a folded expression)."""

    column_type: int
    numbers: tuple[int, ...]
    others: str

    def one_reading(self, types: Sequence[int]) -> bool:
        """Whether, with the parameters declared ``types`` (a Parse's, 0 past its end), PostgreSQL's
        common-type reading of the list and dpproxy's ORs compare the same values the same way:
        every parameter unspecified (each then gets the column's type in its own ``=``, and the
        common type is the column's) beside no typed value; or every one declared of one type
        (integer types as one), beside nothing else or, when that type is the column's, beside
        untyped literals only, but for ``bpchar`` beside another string type (``c IN ($1, $2)`` on a
        ``char(3)`` column, both declared text, compares as text, trailing blanks and all, where each
        ``c = $k`` compares as bpchar, without them); or, on a text or varchar column, every one
        declared of a type compared as text (``text``, ``varchar``, ``name``, ``"char"``) or
        unspecified, beside no typed value. Beside a numeric column (whose parameters are each cast
        to numeric), any types but double precision beside a numeric, ``unknown`` or unspecified one."""
        declared = {types[number - 1] if number <= len(types) else 0 for number in self.numbers}
        if self.column_type == NUMERIC:
            # Each is cast to numeric (rewriter.predicates); so is PostgreSQL's list, unless one is
            # double precision: then the list is, and a numeric or unspecified one bound to
            # 4.5000000000000001 is 4.5 to PostgreSQL (exact only for the integer types).
            return FLOAT8 not in declared or declared <= {FLOAT8} | INTEGER_TYPES
        if declared <= INFERRED or (self.column_type in _TEXT_COLUMNS and declared <= _TEXT_VALUES):
            return self.others != "typed"
        families = {_family(type_oid) for type_oid in declared}
        if len(families) > 1 or declared & INFERRED:
            return False
        if _BPCHAR in declared | {self.column_type} and declared | {self.column_type} != {_BPCHAR}:
            return False  # bpchar beside another string type: each = compares as bpchar, the list as text
        return self.others == "none" or (self.others == "untyped" and families == {_family(self.column_type)})
