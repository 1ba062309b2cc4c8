"""Random conditions with bound parameters over the round-trip table, for the round-trip check of
the extended protocol (tests/round_trip_parameters.py, docs/threat-model.md, "The round-trip check").

Each case is a statement whose condition compares a column with ``$k`` (bare, cast, in arithmetic,
in an IN list or BETWEEN, beside a literal, used twice), the type each parameter is declared with
at Parse (unspecified, unknown, text, varchar, the integer, numeric and float types, date, time
stamps with and without a time zone, interval, bool) and the text each is bound to, drawn mostly
from values of the column's kind, some of them adversarial (blanks around a number, an exponent,
``NaN``, ``infinity``, ``epoch``, ``now``, a value past the type's range, an empty string, NULL),
and some from another kind's pool.

The generator is a pure function of its :class:`random.Random`: a seed names its output.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass

from tests.expression_generator import COLUMNS

__all__ = ["ParameterCase", "parameter_cases"]

# Type OIDs a client declares at Parse, by the kind of column they fit (0: unspecified).
_TYPES: dict[str, tuple[int, ...]] = {
    "int": (23, 20, 21, 1700), "num": (1700, 701, 20), "float": (701, 700, 1700), "text": (25, 1043, 1042),
    "date": (1082, 1114, 1184), "ts": (1114, 1184, 1082), "tz": (1184, 1114), "interval": (1186,), "bool": (16,),
}
_ANY_TYPES = (0, 0, 0, 705, 25, 23, 20, 1700, 701, 1082, 1184, 16, 1043, 1114, 21, 700, 1186)
# Bound values (text format) by kind, with edge spellings PostgreSQL's input functions accept or reject.
_VALUES: dict[str, tuple[bytes | None, ...]] = {
    "int": (b"5", b"0", b"100", b"-5", b" 5", b"5 ", b"-0", b"42", b"2147483647", b"2147483648", b"1e1", b"5.5",
            b"0x1F", b"1_000", b"007", b"abc", b"", b"99999999999999999999", None),
    "num": (b"4.5", b"0", b"-0.005", b"NaN", b"1e3", b"Infinity", b"12.25", b" 4.5 ", b"1000.5", b".5", b"5.",
            b"99999999.995", b"-Infinity", None),
    "float": (b"0.5", b"-0.25", b"NaN", b"Infinity", b"-Infinity", b"1e-3", b"-0", b"1e308", b"5e-324", b"0.1",
              b"1e400", None),
    "text": (b"a", b"b", b"ab", b"ab ", b"", b"A", b"a%", b"a_", b"\\", b"O'Brien", b"abcdefghi", b"abc",
             "Ω".encode(), None),
    "date": (b"2000-05-01", b"2000-05-02", b"infinity", b"-infinity", b"epoch", b"today", b"2000-05-01 12:00",
             b"20000501", b"May 1, 2000", b"2000-05-01 BC", b"01/05/2000", b"J2451666", None),
    "ts": (b"2000-05-01 12:00", b"2000-05-01 11:59:59.999999", b"2000-05-01", b"infinity", b"now",
           b"2000-05-01 12:00+02", b"allballs", b"2000-05-01T12:00:00", None),
    "tz": (b"2000-05-01 12:00+00", b"2000-05-01 12:00+14", b"2000-05-01 12:00", b"2000-05-01 12:00 PST",
           b"-infinity", b"now", b"2000-05-01", None),
    "interval": (b"1 day", b"2 hours", b"-1 day", b"P1D", b"1:30", b"1 day ago", b"1 mon", None),
    "bool": (b"t", b"f", b"yes", b"on", b"1", b"0", b"maybe", b"TRUE ", None),
}
# Where a parameter stands, by the kind of its column (``{c}``: the column; ``{p}``, ``{q}``: a parameter).
_FORMS: dict[str, tuple[str, ...]] = {
    "any": ("{c} = {p}", "{c} <> {p}", "{c} < {p}", "{c} >= {p}", "{p} = {c}", "{p} < {c}", "{c} IS DISTINCT FROM {p}",
            "{c} IS NOT DISTINCT FROM {p}", "{c} IN ({p}, {q})", "{c} IN ({q}, {p})", "{c} IN ({p}, {q}, {lit})", "{c} IN ({p})", "{c} NOT IN ({p}, {q})",
            "{c} BETWEEN {p} AND {q}", "{c} NOT BETWEEN {p} AND {q}", "{c} = {p} AND {c} <> {q}",
            "({c} = {p} OR {c} = {q})", "NOT ({c} = {p})", "{c} = COALESCE({p}, {q})", "{c} = NULLIF({p}, {q})",
            "{c} = CASE WHEN {p} IS NULL THEN {q} ELSE {p} END", "{c} IN ({p}, {lit})", "{c} = ANY(ARRAY[{p}, {q}])",
            "{p} IS NULL", "{c} = {p} OR {p} IS NULL", "{c} >= {p} AND {c} < {q}"),
    "int": ("{c} = {p} + 1", "{c} < {p} * 2", "{c} = -{p}", "{c} = {p} - {q}", "{c} = {p}::int", "{c} = CAST({p} AS bigint)",
            "{c} = {p}::numeric", "{c} > {p} / 2", "{c} = abs({p})", "{c} = {p} % 7", "{c} = round({p})", "{c} + 0 = {p}"),
    "num": ("{c} = {p} + 0.5", "{c} < {p}::numeric(10,2)", "{c} = round({p}, 1)", "{c} = {p}::float8", "{c} > -{p}"),
    "float": ("{c} = {p}::float8", "{c} < {p} * 2", "{c} > {p}::real"),
    "text": ("{c} LIKE {p}", "{c} ILIKE {p}", "lower({c}) = {p}", "{c} = {p} || 'b'", "{c} = {p}::text",
             "{c} = CAST({p} AS varchar(2))", "{c} = {p}::char(3)", "{c} = lower({p})", "{c} = trim({p})",
             "{c} COLLATE \"C\" = {p}", "{c} = {p} COLLATE \"C\"", "{c} NOT LIKE {p}"),
    "date": ("{c} = {p}::date", "{c} < {p} + 1", "{c} >= {p} - 7", "{c} > {p} - interval '1 day'",
             "{c} = date_trunc('month', {p})", "{c} = CAST({p} AS date)", "{c} < {p}::timestamp", "{c} >= {p}::timestamptz"),
    "ts": ("{c} = {p}::timestamp", "{c} < {p} + interval '1 hour'", "{c} >= {p}::date", "{c} = date_trunc('day', {p})",
           "{c} > {p}::timestamptz", "{c} < {p} AT TIME ZONE 'UTC'"),
    "tz": ("{c} = {p}::timestamptz", "{c} < {p} - interval '1 hour'", "{c} >= {p}::date", "{c} > {p}::timestamp",
           "{c} < {p} AT TIME ZONE 'UTC'"),
    "interval": ("{c} = {p}::interval", "{c} < {p} * 2"),
    "bool": ("{c} = {p}::bool", "{c} AND {p}", "({p})::bool", "{c} IS DISTINCT FROM {p}::boolean"),
}
_LITERALS = {"int": "5", "num": "4.5", "float": "0.5", "text": "'a'", "date": "'2000-05-01'", "ts": "'2000-05-01 12:00'",
             "tz": "'2000-05-01 12:00+00'", "interval": "'1 day'", "bool": "TRUE"}
_SHAPES = ("SELECT count(*) FROM rt WHERE {}", "SELECT sum(i) FROM rt WHERE {}", "SELECT count(*) FILTER (WHERE {}) FROM rt",
           "SELECT count(*) FROM rt WHERE i >= 0 AND ({})", "SELECT avg(CASE WHEN {} THEN n END) FROM rt")


@dataclass(frozen=True)
class ParameterCase:
    """A statement with parameters, their types as declared at Parse and their values as bound (text)."""

    statement: str
    condition: str  # the condition choosing the rows the statement's aggregate reads
    types: tuple[int, ...]
    values: tuple[bytes | None, ...]


def _condition(rng: random.Random) -> tuple[str, list[str]]:
    """A condition over one column with ``$1``, ``$2`` (or one parameter twice), maybe beside one on
    another column with a parameter of its own, and the kind each parameter's value is drawn for."""
    kind = rng.choice(tuple(COLUMNS))
    form = rng.choice(_FORMS["any"] + _FORMS[kind] * 2)
    second = "$2" if rng.random() < 0.85 else "$1"
    text = form.format(c=rng.choice(COLUMNS[kind]), p="$1", q=second, lit=_LITERALS[kind])
    kinds = {"$1": kind, "$2": kind}
    if rng.random() < 0.15:  # beside a condition on another column, with its own parameter
        other = rng.choice(tuple(COLUMNS))
        again = rng.choice(_FORMS[other]).format(c=rng.choice(COLUMNS[other]), p="$3", q="$3", lit=_LITERALS[other])
        text, kinds["$3"] = f"{text} {rng.choice(('AND', 'OR'))} {again}", other
    used = [name for name in ("$1", "$2", "$3") if re.search(re.escape(name) + r"(?!\d)", text)]
    for number, name in enumerate(used, start=1):  # numbered from $1 without a gap
        text = re.sub(re.escape(name) + r"(?!\d)", f"${number}", text)
    return text, [kinds[name] for name in used]


def _declared(kind: str, rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.4:
        return 0 if roll < 0.28 else 705
    if roll < 0.75:
        return rng.choice(_TYPES[kind])
    return rng.choice(_ANY_TYPES)


def _bound(kind: str, rng: random.Random) -> bytes | None:
    pool = _VALUES[kind] if rng.random() < 0.85 else _VALUES[rng.choice(tuple(_VALUES))]
    return rng.choice(pool)


def parameter_cases(rng: random.Random, count: int) -> Iterator[ParameterCase]:
    """``count`` cases: a condition with parameters in one of the accepted shapes, typed and bound."""
    for _ in range(count):
        text, kinds = _condition(rng)
        shape = rng.choice(_SHAPES)
        rows = f"i >= 0 AND ({text})" if "i >= 0 AND" in shape else text
        yield ParameterCase(shape.format(text), rows, tuple(_declared(kind, rng) for kind in kinds),
                            tuple(_bound(kind, rng) for kind in kinds))
