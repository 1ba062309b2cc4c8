"""Random conditions over a protected table's columns, in the spellings PostgreSQL's grammar allows,
for the round-trip check (tests/round_trip.py, docs/threat-model.md, "The round-trip check").

Each condition compares a column of one of the types dpproxy answers (integer, numeric, double
precision, text, varchar, char, date, timestamp, timestamptz, interval, boolean) with a value of
its type written in one of its lexical forms (``E''``, ``U&''``, dollar quotes, bit strings,
numbers with exponents, underscores or a radix prefix, typed literals, ``::`` and ``CAST``), built
up with operators in their spellings (``!=``/``<>``, signs glued to an operator,
``OPERATOR(pg_catalog.=)``), the functions dpproxy folds (rewriter/constants.py), CASE, COALESCE,
NULLIF, and with the predicate forms (BETWEEN [SYMMETRIC], IN, LIKE/ILIKE/SIMILAR with ESCAPE, IS
[NOT] DISTINCT FROM / TRUE / UNKNOWN, COLLATE, AT TIME ZONE, array and row constructors) nested
under AND/OR/NOT; comments and newlines stand between tokens. Most of what it writes dpproxy
refuses; what it answers is what the check compares.

The generator is a pure function of its :class:`random.Random`: a seed names its output.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

__all__ = ["COLUMNS", "aggregate_statements", "condition", "statements"]

# The round-trip table's columns by the kind of value they hold (tests/round_trip.py creates it).
COLUMNS: dict[str, tuple[str, ...]] = {
    "int": ("i",), "num": ("n",), "float": ("f",), "text": ("t", "v", "c"), "date": ("d",), "ts": ("ts",),
    "tz": ("tz",), "interval": ("iv",), "bool": ("b",),
}
_NUMBERS = ("int", "num", "float")

# Literals by kind, each in several lexical forms PostgreSQL reads as one value.
_LITERALS: dict[str, tuple[str, ...]] = {
    "int": ("5", "0", "100", "-5", "42", "007", "1e1", "1E+1", "2147483647", "0x1F", "0o17", "0b101", "1_000",
            "'5'", "E'5'", "$$5$$", "$q$42$q$", "U&'5'", "int '5'", "integer '42'", "'5'::int", "CAST('5' AS integer)",
            "int4 '7'", "5::int8", "'  5  '"),
    "num": ("4.5", ".5", "5.", "1.5e1", "1e-2", "99.99", "-0.005", "'4.5'", "numeric '4.5'", "'4.5'::numeric",
            "CAST(4.5 AS numeric(10,2))", "decimal '1.25'", "'NaN'", "'Infinity'", "1.5e-1", "E'4.5'", "$$0.5$$",
            "numeric '40.5'::int", "1_000.5"),
    "float": ("0.5", "1e-3", "-0.25", "'0.5'", "float8 '0.5'", "double precision '0.25'", "real '0.5'", "'-Infinity'",
              "'NaN'::float8", "CAST('0.75' AS float8)", "0.5::real", "5e-1", "'1e-1'", ".5e0", "'  0.5'", "float '0.5'", "float(53) '0.5'"),
    "text": ("'a'", "'b'", "'ab'", "'ab '", "''", "E'a'", "E'\\x61'", "E'\\141'", "E'a\\nb'", "U&'\\0061'",
             "U&'!0061' UESCAPE '!'", "$$a$$", "$t$b$t$", "'a'\n'b'", "text 'a'", "'a'::text", "varchar 'a'",
             "CAST('abc' AS varchar(2))", "'ab'::char(3)", "'a'::bpchar", "B'101'", "X'1F'", "'O''Brien'", "N'a'",
             "'A'", "E'\\u0061'", "U&'\\+000061'", "'a' COLLATE \"C\"", "'ab'::varchar(1)", "E'ab\\040'", "$$ab $$",
             "'ab'::\"char\"", "'a'::name", "CAST('a' AS character varying)", "character(3) 'ab'", "'ab' || ' '"),
    "date": ("'2000-05-01'", "date '2000-05-01'", "'2000-05-01'::date", "CAST('2000-05-01' AS date)", "current_date",
             "current_date - 30", "date '2000-05-01' + 1", "make_date(2000, 5, 1)", "to_date('2000-05-01', 'YYYY-MM-DD')",
             "'infinity'", "'May 1, 2000'", "'20000501'", "date '2000-05-01' - interval '1 day'", "'epoch'::date",
             "date_trunc('month', date '2000-05-17')", "$$2000-05-01$$", "timestamp '2000-05-01 12:00'::date",
             "'yesterday'::date", "date 'today'", "'2000-05-01'::timestamp::date", "(date '2000-05-01')::text::date",
             "'01/05/2000'", "'2000-05-01 BC'", "E'2000\\05\\01'"),
    "ts": ("'2000-05-01 12:00'", "timestamp '2000-05-01 12:00'", "'2000-05-01 12:00'::timestamp", "localtimestamp",
           "LOCALTIMESTAMP(2)", "now() - interval '1 day'", "now()", "CURRENT_TIMESTAMP(0)", "current_timestamp",
           "to_timestamp('2000-05-01', 'YYYY-MM-DD')", "date_trunc('day', now())", "timestamp '2000-05-01' + interval '1' hour",
           "date '2000-05-01' + time '12:00'", "'-infinity'", "make_timestamp(2000, 5, 1, 12, 0, 0)",
           "timestamp '2000-05-01 12:00' AT TIME ZONE 'UTC'", "'2000-05-01T12:00:00'", "'allballs'::time + date '2000-05-01'",
           "timestamp(0) '2000-05-01 12:00:00.5'", "'now'::timestamp", "'2000-05-01 12:00'::timestamp(0)",
           "timestamp without time zone '2000-05-01 12:00'", "'2000-05-01 12:00:00.5'::timestamptz::timestamp",
           "'J2451666'", "'2000-05-01 12:00' AT TIME ZONE 'UTC'"),
    "tz": ("'2000-05-01 12:00+02'", "timestamptz '2000-05-01 12:00'", "'2000-05-01 12:00 UTC'::timestamptz", "now()",
           "now() - interval '30 days'", "transaction_timestamp()", "CURRENT_TIMESTAMP", "CURRENT_TIMESTAMP(3)",
           "to_timestamp(957182400)", "make_timestamptz(2000, 5, 1, 12, 0, 0, 'UTC')", "'2000-05-01 12:00 PST'",
           "timestamp '2000-05-01 12:00' AT TIME ZONE 'America/St_Johns'", "date_trunc('month', now())",
           "timestamptz '2000-05-01 12:00' - interval '1 day ago'", "timestamp with time zone '2000-05-01 12:00+02'",
           "'2000-05-01 12:00'::timestamp AT TIME ZONE 'UTC'", "timezone('UTC', timestamp '2000-05-01 12:00')",
           "'epoch'::timestamptz + interval '957182400 seconds'"),
    "interval": ("interval '1 day'", "interval '1' day", "interval '1 day ago'", "'1 day'::interval", "interval '1:30'",
                 "interval '2' hour to minute", "interval '1.5' hour", "make_interval(days => 1)", "interval 'P1D'",
                 "interval U&'1 d\\0061y'", "interval '3 quarters'", "'-1 day'", "interval '1 day' + interval '2 hours'",
                 "interval '1 day 1:30'", "interval(3) '1'", "interval '1 year 2 mons'", "INTERVAL '.5 day'",
                 "interval '1' second(3)", "interval '1 day' * 2", "justify_hours(interval '36 hours')",
                 "interval '1 day' + '2 hours'", "interval '1 day' + '2 hours'::interval"),
    "bool": ("TRUE", "FALSE", "'t'", "'yes'::bool", "bool 'f'", "CAST('on' AS boolean)", "NOT FALSE", "'1'"),
}
# Row-independent value expressions of a kind, built from smaller ones (``{0}``, ``{1}``: values).
_COMPOUNDS: dict[str, tuple[str, ...]] = {
    "int": ("{0} + {1}", "{0}-{1}", "{0} * {1}", "{0} / {1}", "{0} % {1}", "abs({0})", "mod({0}, {1})", "-{0}", "- {0}",
            "+{0}", "+ +{0}", "{0}+-{1}", "{0}*-{1}", "{0}--{1}\n", "({0})", "round({0})", "CAST({0} AS numeric)",
            "({0})::int", "{0} OPERATOR(pg_catalog.+) {1}", "COALESCE({0}, {1})", "NULLIF({0}, {1})",
            "CASE WHEN {0} > {1} THEN {0} ELSE {1} END", "CASE {0} WHEN 5 THEN {1} END", "extract(day from date '2000-05-17')",
            "date_part('month', date '2000-05-17')", "|/ {0}", "{0} ^ 2", "@ {0}", "@{0}", "{0}::text::int", "trunc({0})",
            "-mod({0}, {1})", "~ {0}", "||/ {0}", "- {0} ^ 2", "{0} ^ {1} ^ 2", "{0} # {1}", "{0} & {1}", "{0} << 1",
            "position('b' in 'abc')", "extract(epoch from interval '1 day')", "extract(day from timestamp '2000-05-17')",
            "char_length('abc')", "'5'::\"int4\"", "'5'::pg_catalog.int4", "CAST('5' AS \"numeric\")", "99999999999999999999",
            "1e400", "-0", "-0.0", "{0} OPERATOR(pg_catalog.-) {1}", "{0} OPERATOR(pg_catalog.*) -{1}"),
    "num": ("{0} + {1}", "{0} - {1}", "{0} * {1}", "{0} / {1}", "round({0}, 1)", "trunc({0}, 1)", "floor({0})",
            "ceil({0})", "-{0}", "+{0}", "{0}*-{1}", "({0})::numeric(10,2)", "CAST({0} AS numeric)", "({0})",
            "COALESCE({0}, {1})", "NULLIF({0}, {1})", "to_number('12.5', '99.9')"),
    "float": ("{0} * {1}", "{0} / {1}", "-{0}", "+{0}", "({0})::float8", "CAST({0} AS double precision)", "{0} + {1}",
              "({0})", "floor({0})"),
    "text": ("{0} || {1}", "lower({0})", "upper({0})", "({0})", "{0} COLLATE \"C\"", "COALESCE({0}, {1})",
             "NULLIF({0}, {1})", "CASE WHEN TRUE THEN {0} END", "({0})::text", "CAST({0} AS varchar(1))", "{0}::char(3)",
             "trim({0})", "substr({0}, 1, 1)", "replace({0}, 'a', 'b')", "substring('abc' from 1 for 1)",
             "trim(both 'x' from 'xax')", "trim(leading from '  a')", "overlay('xb' placing 'a' from 1 for 1)",
             "{0} COLLATE \"POSIX\"", "{0} COLLATE pg_catalog.\"default\"", "'a' 'b'", "E'a' -- c\n'b'",
             "'\\'", "{0} OPERATOR(pg_catalog.||) {1}"),
    "date": ("{0} + 1", "{0} - 7", "({0})", "CAST({0} AS date)", "({0})::date", "COALESCE({0}, {1})", "+{0}"),
    "ts": ("{0} - interval '1 hour'", "{0} + interval '1' day", "date_trunc('hour', {0})", "({0})::timestamp",
           "({0})", "{0} - '1 day'::interval", "{0} + interval '1 day' * 2", "{0} AT TIME ZONE 'UTC'"),
    "tz": ("{0} - interval '1 hour'", "({0})::timestamptz", "({0})", "{0} + make_interval(hours => 2)",
           "date_trunc('day', {0})", "{0} AT TIME ZONE 'UTC'"),
    "interval": ("{0} + {1}", "{0} * 2", "-{0}", "+{0}", "({0})", "justify_days({0})", "{0} / 2"),
    "bool": ("NOT {0}", "({0})", "{0} AND {1}", "{0} OR {1}", "{0} IS TRUE", "{0} IS NOT FALSE", "{0} IS UNKNOWN",
             "({0})::bool", "COALESCE({0}, FALSE)"),
}
_COMPARISONS = ("=", "<>", "!=", "<", "<=", ">", ">=", "OPERATOR(pg_catalog.=)", "OPERATOR(pg_catalog.<)",
                "OPERATOR(pg_catalog.<>)", "OPERATOR(pg_catalog.!=)", "OPERATOR(\"pg_catalog\".>)", "<> ALL(ARRAY[{1}])",
                "= ANY(VALUES ({1}))", "IN (SELECT {1})",
                "OPERATOR(>=)", "= ANY(ARRAY[{1}])", "IS DISTINCT FROM", "IS NOT DISTINCT FROM")
_PATTERNS = ("'a%'", "'%b'", "'_'", "'a\\%'", "E'a\\\\%'", "'%'", "U&'\\0061%'", "$$a%$$", "'A%'", "'a!%' ESCAPE '!'",
             "'a#_' ESCAPE '#'", "'%' ESCAPE ''", "lower('A%')", "'a' || '%'")
_SEPARATORS = (" ", " ", " ", "\n", "  ", "/*c*/", "/*c*/ ", "\t--c\n", "\t")


def _spaced(text: str, rng: random.Random) -> str:
    """``text`` with some of its spaces outside single quotes replaced by another separator PostgreSQL
    reads as one (a newline, a tab, a comment). (A space in a dollar-quoted string may be replaced
    too: that is another string, which both readings are given alike.)"""
    out, quoted = [], False
    for char in text:
        quoted ^= char == "'"
        out.append(rng.choice(_SEPARATORS) if char == " " and not quoted and rng.random() < 0.2 else char)
    return "".join(out)


def _value(kind: str, rng: random.Random, depth: int) -> str:
    """A row-independent value of ``kind``: a literal, or a compound of smaller values."""
    if depth <= 0 or rng.random() < 0.45:
        return rng.choice(_LITERALS[kind])
    form = rng.choice(_COMPOUNDS[kind])
    return form.format(_value(kind, rng, depth - 1), _value(kind, rng, depth - 1))


def _column(kind: str, rng: random.Random) -> str:
    name = rng.choice(COLUMNS[kind])
    roll = rng.random()
    if kind == "text" and roll < 0.2:
        return f"{rng.choice(('lower', 'upper', 'pg_catalog.lower'))}({name})"
    if roll < 0.05:
        return f"rt.{name}"
    if roll < 0.1:
        return f"({name})"
    if roll < 0.13:
        return f'"{name}"'
    if roll < 0.16 and kind in _NUMBERS:
        return f"+{name}"
    if roll < 0.18 and kind == "text":
        return f'{name} COLLATE "C"'
    if roll < 0.2 and kind == "tz":
        return f"{name} AT TIME ZONE 'UTC'"
    return name


def _comparison(kind: str, rng: random.Random, depth: int) -> str:
    column, value = _column(kind, rng), _value(kind, rng, depth)
    operator = rng.choice(_COMPARISONS)
    if "{1}" in operator:
        return f"{column} {operator.format('', value)}"
    glue = "" if rng.random() < 0.15 else " "
    if rng.random() < 0.2:
        return f"{value}{glue}{operator}{glue}{column}"
    return f"{column}{glue}{operator}{glue}{value}"


def _predicate(rng: random.Random, depth: int) -> str:
    """One predicate on one column (no AND/OR)."""
    kind = rng.choice(tuple(COLUMNS))
    roll = rng.random()
    if kind == "bool":
        return rng.choice(("b", "NOT b", "b IS TRUE", "b IS NOT FALSE", "b IS UNKNOWN", "b IS NOT UNKNOWN", "b = TRUE",
                           "b <> 't'", "b IS NULL", "NOT NOT b", "(b)", "!! b", "@ b", "b IS FALSE", "b IS NOT TRUE", "b ISNULL",
                           "b NOTNULL", "(i > 5) IS TRUE", "(t = 'a') IS NOT FALSE", "(i > 5) = TRUE", "(i > 5) <> b", "b = " + _value("bool", rng, depth)))
    if roll < 0.45:
        return _comparison(kind, rng, depth)
    column = _column(kind, rng)
    if roll < 0.55:
        between = rng.choice(("BETWEEN", "NOT BETWEEN", "BETWEEN SYMMETRIC", "NOT BETWEEN SYMMETRIC"))
        return f"{column} {between} {_value(kind, rng, depth)} AND {_value(kind, rng, depth)}"
    if roll < 0.68:
        items = ", ".join(_value(kind, rng, depth - 1) for _ in range(rng.randint(1, 4)))
        return f"{column} {rng.choice(('IN', 'NOT IN'))} ({items})"
    if roll < 0.8 and kind == "text":
        operator = rng.choice(("LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE", "~~", "!~~", "~~*", "SIMILAR TO", "~"))
        return f"{column} {operator} {rng.choice(_PATTERNS)}"
    if roll < 0.86:
        return f"{column} {rng.choice(('IS NULL', 'IS NOT NULL', 'IS UNKNOWN', 'IS NOT UNKNOWN', 'IS TRUE', 'ISNULL', 'NOTNULL'))}"
    if roll < 0.9:
        other = rng.choice(COLUMNS[kind])
        return f"{column} {rng.choice(('=', '<', '<>'))} {other}"
    if roll < 0.94:
        return rng.choice(("ROW(i, n) = ROW(1, 2)", "(i, d) < (5, date '2000-05-01')", "ARRAY[i] = ARRAY[5]",
                           "i = ANY('{1,2}')", "CASE WHEN i > 5 THEN TRUE ELSE FALSE END", "COALESCE(b, FALSE)",
                           "NULLIF(i, 5) IS NULL", "i + 0 > 5", "t || '' = 'a'", "i::text = '5'", "t IS NFC NORMALIZED",
                           "(d, d) OVERLAPS (date '2000-05-01', date '2000-05-02')", "ts AT TIME ZONE INTERVAL '+02:00' > ts",
                           "i = ANY(ARRAY[1, 5])", "i <> ALL('{1,5}'::int[])", "EXISTS (SELECT 1)", "i IN (SELECT 5)",
                           "t = ANY(ARRAY['a', 'b'])", "i BETWEEN 1 AND 5 IS TRUE", "NOT i > 5 IS NULL"))
    return _comparison(kind, rng, depth)


def condition(rng: random.Random, depth: int = 2) -> str:
    """A condition over the round-trip table: predicates under AND/OR/NOT, spaced as PostgreSQL allows."""
    roll = rng.random()
    if depth <= 0 or roll < 0.55:
        text = _predicate(rng, depth)
    elif roll < 0.75:
        text = f"{condition(rng, depth - 1)} AND {condition(rng, depth - 1)}"
    elif roll < 0.88:
        text = f"({condition(rng, depth - 1)} OR {condition(rng, depth - 1)})"
    else:
        text = f"NOT ({condition(rng, depth - 1)})"
    return _spaced(text, rng)


# The statement shapes a condition is asked in, each with the condition that chooses the rows its
# aggregate reads (``{}``: the generated condition).
_SHAPES = (
    ("SELECT count(*) FROM rt WHERE {}", "{}"),
    ("SELECT count(*) FILTER (WHERE {}) FROM rt", "{}"),
    ("SELECT sum(i) FROM rt WHERE {}", "{}"),
    ("SELECT sum(CASE WHEN {} THEN i ELSE 0 END) FROM rt", "{}"),
    ("SELECT count(*) FROM rt WHERE i >= 0 AND ({})", "i >= 0 AND ({})"),
    ("SELECT count(CASE WHEN {} THEN 1 END) FROM rt", "{}"),
    ("SELECT sum(({})::int) FROM rt", "{}"),
    ("SELECT avg(CASE WHEN {} THEN n END) FROM rt", "{}"),  # the FILTER's rows: AVG skips a NULL n alike
    ("SELECT count(*) FROM (SELECT * FROM rt WHERE {}) AS s", "{}"),
)


def statements(rng: random.Random, count: int) -> Iterator[tuple[str, str]]:
    """``count`` (statement, condition) pairs: a generated condition in one of the accepted shapes,
    with the condition choosing the rows the statement's aggregate reads."""
    for _ in range(count):
        text = condition(rng)
        shape, rows = rng.choice(_SHAPES)
        yield shape.format(text), rows.format(text)


_ARGUMENTS = ("i", "+i", "(i)", "rt.i", "i::numeric", "CAST(i AS int8)", "COALESCE(i, 0)", "i + 0", "n", "(n)",
              "n::numeric(10,2)", "f", "f::float8", "-i", "abs(i)", "CASE WHEN b THEN i END", "CASE WHEN b THEN i ELSE 0 END",
              "(b)::int", "CAST(b AS integer)", "NULLIF(i, 0)", "i * 1", "GREATEST(i, 0)")


def aggregate_statements(rng: random.Random, count: int) -> Iterator[tuple[str, str]]:
    """``count`` (statement, argument) pairs: ``SUM``/``AVG``/``MIN``/``MAX`` of an argument expression."""
    for _ in range(count):
        argument = _spaced(rng.choice(_ARGUMENTS), rng)
        yield f"SELECT {rng.choice(('sum', 'avg', 'SUM'))}({argument}) FROM rt", argument
