"""Forms of a statement on a protected table that dpproxy's DP planner (sqlglot) reads otherwise
than PostgreSQL does, found by the parse differential (tests/test_parse_differential.py) and
refused before any charge.

Numbers: PostgreSQL 16 reads ``0x1F``, ``0o17``, ``0b101`` and ``1_000`` as the integers 31, 15, 5 and
1000; PostgreSQL 15 reads ``0x1F`` as ``0`` followed by the name ``x1F`` (a column alias in a
select list, a syntax error in a WHERE), and sqlglot, which plans a DP query, reads ``0x1F`` as
the bit string ``x'1F'`` (rendered ``CAST(x'1F' AS numeric)``) and ``0b101`` as ``b'101'``. The
backend would then run a comparison PostgreSQL does not mean, and the analyst reasons about
PostgreSQL's reading. The forms are found by PostgreSQL's own scanner (pglast), never in a string
or a comment, and a statement on a protected table that has one is refused before any charge,
with the number in decimal in the hint.

``interval(p) 'v'``: sqlglot reads it as ``interval 'p' + interval 'v'`` (``now() - interval(3) '1'``
was answered as ``now() - interval '3' + interval '1'``), where PostgreSQL reads the interval 'v'
at precision p. It is found by the scanner too (``INTERVAL`` then ``(``) and refused.

``interval '...'``'s value: sqlglot rewrites a string holding one number and unit as ``'<number>
<UNIT>'`` and drops the rest (``interval '1 day ago'`` was answered as ``interval '1 DAY'``, its sign
lost; ``'1 day 1:30'`` as ``'1 DAY'``; ``'.5 day'`` as ``'5 DAY'``; ``'P2M'``, two months, as two
minutes), and folds a single field after the string into it (``interval '1.5' hour`` as ``'1.5
HOUR'``, where PostgreSQL keeps whole hours only: one hour), and writes a number of quarters (``'3
quarters'``, ``'3 q'``), a unit PostgreSQL does not have (22007), as three times as many months; it
keeps the escapes of a ``U&'...'`` string as written (``interval U&'1 d\\0061y'``, a day, ran as
``'1 d\\0061y'``, which PostgreSQL reads as 61 years and a day). A literal it keeps as PostgreSQL
reads it is let through (:func:`_interval_read_alike`); any other is refused, found by the scanner.
A comment between tokens is a space to PostgreSQL, and to these checks (:func:`_tokens`).

``x IS [NOT] UNKNOWN``: sqlglot reads it as ``x IS [NOT] NULL``. That is PostgreSQL's meaning for a
boolean ``x``; for any other, PostgreSQL fails the statement (42804) whatever the rows, and dpproxy
answered it. It is let through on a boolean column of the table only.

``interval 'a' + 'b'::t``: sqlglot reads the string after ``+`` as one more interval, and what binds
tighter after it (a cast, ``*``) as applying to the sum: ``interval '1 day' + '2023-01-01'::date`` was
run as ``CAST(interval '1 day' + interval '2023-01-01' AS date)``, which fails (22007) where PostgreSQL
adds a day to a date, and ``interval '1 day' + '5' * 2`` as ``interval '1 day' + interval '5' * 2``,
answered where PostgreSQL fails (42883). Found by the scanner and refused (a bare string after the
``+`` PostgreSQL reads as an interval too, and a number is refused as ``interval-form``).

A unary ``+``: sqlglot drops it wherever it stands. PostgreSQL has a prefix ``+`` for the number
types only, so ``+sex = 'Male'`` fails there (42883) and was answered as ``sex = 'Male'``, and it
reads ``+'39.5'`` and ``+$1`` as double precision (``age > +'39.5'`` counts ages above 39.5; dpproxy's
``age > '39.5'`` failed). Refused but before a number literal, where the ``+`` changes nothing.

``U&"..."``, a quoted name with Unicode escapes: sqlglot reads ``U&"\\006e"`` as ``U & "\\006e"``,
the bitwise AND of two columns. Where a level has both (``SELECT U&"e" FROM (SELECT count(*) AS u,
sum(age) AS "e" ...)``) it was answered with ``u & e`` where PostgreSQL answers the column ``e``;
elsewhere it failed with another error than PostgreSQL's answer. Found by the scanner and refused.

A prefix operator but ``-`` and ``+`` (found by the round-trip check, tests/round_trip.py): sqlglot
reads ``@ x``, PostgreSQL's absolute value, as the parameter ``$x`` (``age = @ 42`` ran as ``age =
$42``, bound to the analyst's 42nd parameter where there is one, else failing after the plan was
made; ``@ 1e1`` as ``$1 AS e1``, no SQL at all), and ``-mod(a, b)`` as ``-a % b``, which PostgreSQL
reads as ``(-a) % b`` (``-mod('5', 2)`` fails there, 42725, where PostgreSQL answers). Refused but
``-`` before anything else and ``+`` (:func:`refuse_unary_plus`); so is an operator PostgreSQL's
scanner ends with ``@`` (``i>=@5`` is the operator ``>=@``, which PostgreSQL does not have; sqlglot
read ``i >= $5``). (``!! b``, which sqlglot reads as ``NOT NOT b``, is refused as an
``undefined-operator`` before, in rewriter/classify.py.)

``x COLLATE "C"::t`` (found by the round-trip check of GROUP BY keys, tests/round_trip_keys.py):
PostgreSQL casts the collated value, as ``(x COLLATE "C")::t``; sqlglot reads the cast as one of the
collation's name, a column ``"C"``, and the statement was refused with 42703 (column "C" does not
exist) where PostgreSQL answers it. Found by the scanner (``COLLATE``, a name, ``::``) and refused.

An IN list with a value of another written type than its column (found by the round-trip check): dpproxy
writes ``x IN (a, b)`` as ``x = a OR x = b``, and PostgreSQL resolves each ``=`` on its own there, but
the list to one common type first: ``v IN ('ab'::char(3), 'a'::text)`` compares ``v`` as text (where
``'ab '`` is not ``'ab'``), its ``v = 'ab'::char(3)`` as char (where it is). Refused when a typed value
is of another type than the compared column's (a list of one such type too), but for pairs both
readings compare alike (:func:`refuse_in_list_types`); a list typed as its column, beside untyped
strings and numbers, is answered (``d IN (date '2024-01-01', '2024-02-01')``).

``round(x, n)`` of a value of no known number type (found by the round-trip check): PostgreSQL has
``round(numeric, integer)`` only, so ``round(ceil('4.5'), 1)`` (``ceil`` of an untyped string is
double precision), ``round(floor(5), 1)`` (so is ``floor`` of an integer), ``round(2 ^ 3, 1)`` or
``round(date_part('day', now()), 1)`` fails (42883, whatever the rows); sqlglot writes
``ROUND(CAST(x AS DECIMAL), n)`` and dpproxy answered. ``x`` must be an integer, a numeric or an
untyped value to PostgreSQL, as :func:`rewriter.number_kinds.number_kind` reads it from number
literals, casts, columns, ``+ - * / %`` and the number functions, or be cast:
``round(CAST(x AS numeric), n)``. (Of a released aggregate, post-processing, it is not judged here.)

``CURRENT_TIMESTAMP(n)``: sqlglot keeps the precision but writes the call back as
``CURRENT_TIMESTAMP``, so ``ts > CURRENT_TIMESTAMP(0)`` was answered as ``ts > CURRENT_TIMESTAMP``,
which selects other rows whenever the clock is not on a whole second.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Sequence

from pglast.parser import ParseError, parse_sql_json, scan
from sqlglot import exp
from sqlglot.errors import ErrorLevel

from policies.errors import SQLSTATE, Refusal
from policies.tables import Relation

from .function_check import nodes_of
from .number_kinds import number_kind
from .sqlglot_parse import ISO_ONE_DESIGNATOR, iso_kept_as_written
from .types import BOOL, BUILTIN_TYPE_OIDS

__all__ = ["refuse_constant_positions", "refuse_dropped_precision", "refuse_in_list_types", "refuse_is_unknown",
           "refuse_misread_tokens", "refuse_misreadings", "refuse_prefix_operators",
           "refuse_collation_casts", "refuse_round_casts", "refuse_typed_literal_casts", "refuse_unary_plus"]

_NOT_DECIMAL = re.compile(r"0[xXoObB]|.*_")


def _decimal(text: str) -> str:
    """``text`` (a number PostgreSQL 16 reads) written in decimal."""
    digits = text.replace("_", "")
    try:
        return str(int(digits, 0))
    except ValueError:
        try:
            return str(Decimal(digits))
        except InvalidOperation:  # pragma: no cover - the scanner read it as a number
            return digits


_COMMENTS = frozenset({"C_COMMENT", "SQL_COMMENT"})
_INTERVAL_FIELDS = frozenset({"YEAR_P", "MONTH_P", "DAY_P", "HOUR_P", "MINUTE_P", "SECOND_P"})
_STRINGS = frozenset({"SCONST", "USCONST"})
_WHOLE_NUMBER = re.compile(r"\s*[+-]?[0-9]+\s*")
# PostgreSQL's verbose form: a noise '@' before the fields (sqlglot drops it, as PostgreSQL ignores it).
_VERBOSE_AT = re.compile(r"\s*@")


def _tokens(sql: str) -> list[Any]:
    """``sql``'s tokens as PostgreSQL's scanner reads them, without its comments, which PostgreSQL
    reads as a space (``interval /* c */ (3) '1'`` is ``interval(3) '1'``, ``numeric '40.5' /* c */
    ::int`` is ``numeric '40.5'::int``)."""
    return [token for token in scan(sql) if token.name not in _COMMENTS]


def _string_value(text: str) -> str | None:
    """The value of ``text``, a string constant as written ('...', E'...', U&'...', $$...$$), as
    PostgreSQL's parser reads it; None when it reads no string there."""
    try:
        tree = json.loads(parse_sql_json(f"SELECT {text}"))
        value = tree["stmts"][0]["stmt"]["SelectStmt"]["targetList"][0]["ResTarget"]["val"]["A_Const"]["sval"]
    except (ParseError, KeyError, IndexError, TypeError):
        return None
    return str(value.get("sval", ""))


def _interval_read_alike(value: str | None, field: str | None, after: str | None) -> bool:
    """Whether sqlglot renders ``interval '<value>' [<field> [<after> ...]]`` as PostgreSQL reads it
    (``field``, ``after``: the names of the two tokens after the string, when the first is a field).

    Without a field, sqlglot rewrites a value in which it finds exactly one ``<number> <unit>``
    (``exp.INTERVAL_STRING_RE``) as that pair alone: alike when that pair is the whole value, after
    PostgreSQL's noise ``@`` too (``'@ 1 day'``; not ``'@ 1 day ago'``, where the pair is not the
    whole value), or when the value is one ISO 8601 designator other than a month (``'P1D'``,
    ``'P0.5W'``, ``'PT1.5H'``, ``'PT2M'``: :data:`rewriter.sqlglot_parse.ISO_ONE_DESIGNATOR`); any
    other ISO 8601 value with one such pair dpproxy's reading keeps as written (``'P1DT'``, a day,
    sqlglot's ``'1 DT'``; ``'P2M'``, two months, sqlglot's two minutes:
    :func:`rewriter.sqlglot_parse.iso_kept_as_written`). The pair's unit may be one of PostgreSQL's
    abbreviations sqlglot writes out in full (``'@ 1 m'``, a minute: ``'1 MINUTE'``; :func:`_written_back`).
    With ``<field> TO <field>`` it keeps the value as written when it finds no such pair; with a
    single field it appends the field to the value, alike only for a whole number (PostgreSQL keeps
    only whole units of the field: ``interval '1.5' hour`` is one hour)."""
    if value is None:
        return False
    pairs = exp.INTERVAL_STRING_RE.findall(value)
    if field is None:
        whole = exp.INTERVAL_STRING_RE.fullmatch(value)
        verbose = _VERBOSE_AT.match(value)
        after_at = exp.INTERVAL_STRING_RE.fullmatch(value[verbose.end():]) if verbose is not None else None
        return (len(pairs) != 1 or (whole is not None and _written_back(*whole.groups()))
                or ISO_ONE_DESIGNATOR.fullmatch(value) is not None or iso_kept_as_written(value)
                or (after_at is not None and _written_back(*after_at.groups())))
    if after == "TO":
        return not pairs
    return after != "ASCII_40" and _WHOLE_NUMBER.fullmatch(value) is not None


def _written_back(number: str, unit: str) -> bool:
    """Whether sqlglot writes the interval ``'<number> <unit>'`` back with that number and unit, or
    with the unit PostgreSQL reads the abbreviation as (:data:`_ABBREVIATIONS`): not a quarter (``q``,
    ``quarters``), which PostgreSQL does not know (22007) and sqlglot writes as three times as many
    months, nor ``ns``, which PostgreSQL does not know either."""
    written = exp.Interval(this=exp.Literal.string(number), unit=exp.var(unit.upper())).sql(
        "postgres", unsupported_level=ErrorLevel.IGNORE)  # '1.5 quarters' is written as it is, unlogged
    return written in {f"INTERVAL '{number} {unit.upper()}'", f"INTERVAL '{number} {_ABBREVIATIONS.get(unit.lower())}'"}


# PostgreSQL's one- and two-letter interval units (its deltatktbl, matched lower-cased) that sqlglot
# writes out in full, each as the unit PostgreSQL reads it as: '1 m' is a minute to both
_ABBREVIATIONS = {"d": "DAY", "h": "HOUR", "m": "MINUTE", "s": "SECOND", "ms": "MILLISECOND", "us": "MICROSECOND",
                  "w": "WEEK", "y": "YEAR"}


def _after_fields(tokens: list[Any], at: int) -> int:
    """The index of the first token from ``at`` past an interval literal's fields: ``DAY``, ``DAY TO
    SECOND``, ``SECOND(3)``."""
    while at < len(tokens):
        if tokens[at].name in _INTERVAL_FIELDS or (tokens[at].name == "TO" and tokens[at - 1].name in _INTERVAL_FIELDS):
            at += 1
        elif (tokens[at - 1].name in _INTERVAL_FIELDS and [token.name for token in tokens[at : at + 3]]
              == ["ASCII_40", "ICONST", "ASCII_41"]):
            at += 3
        else:
            break
    return at


def _misread_interval(sql: str, tokens: list[Any], index: int) -> int | None:
    """Where an ``interval '...'`` literal opened by the ``INTERVAL`` at ``tokens[index]`` that sqlglot
    reads otherwise than PostgreSQL (:func:`_interval_read_alike`) ends (the index of its last
    token), or None when it reads it alike. sqlglot also reads a constant after the literal's ``+``
    as one more interval literal (its ``INTERVAL 'v1' u1 + 'v2' u2``): a number there is an error to
    PostgreSQL (``interval + integer`` has no operator), and a string an interval literal, judged
    as one (PostgreSQL reads no field after it in a condition: ``+ '2' hour`` is a syntax error)."""
    at = index + 1
    if at >= len(tokens) or tokens[at].name not in _STRINGS:
        return None
    while True:
        if tokens[at].name == "USCONST" and at + 2 < len(tokens) and tokens[at + 1].name == "UESCAPE":
            return at + 2  # sqlglot keeps the escapes of U&'...' UESCAPE '!' as written
        if tokens[at].name == "USCONST" and "\\" in sql[tokens[at].start : tokens[at].end + 1]:
            # ... and of U&'...' too: U&'1 d\0061y', a day, ran as '1 d\0061y', 61 years and a day
            return _after_fields(tokens, at + 1) - 1
        end = _after_fields(tokens, at + 1)
        names = [token.name for token in tokens[at + 1 : at + 3]]
        field = names[0] if names and names[0] in _INTERVAL_FIELDS else None
        after = names[1] if field is not None and len(names) > 1 else None
        if not _interval_read_alike(_string_value(sql[tokens[at].start : tokens[at].end + 1]), field, after):
            return end - 1
        if end + 1 >= len(tokens) or tokens[end].name != "ASCII_43":
            return None
        if tokens[end + 1].name in ("ICONST", "FCONST"):
            return end + 1
        if tokens[end + 1].name not in _STRINGS:
            return None
        at = end + 1


def refuse_misreadings(sql: str, node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, before any charge) every form of ``sql`` (``node``: its pglast JSON), a
    statement on protected ``relation``, that sqlglot reads otherwise than PostgreSQL: each rule of
    this module in turn, the first that finds one deciding the message. A new rule is added here."""
    refuse_misread_tokens(sql, relation)
    refuse_is_unknown(node, relation)
    refuse_dropped_precision(node, relation)
    refuse_constant_positions(node, relation)
    refuse_unary_plus(node, relation)
    refuse_prefix_operators(sql, node, relation)
    refuse_in_list_types(node, relation)
    refuse_round_casts(node, relation)
    refuse_typed_literal_casts(sql, node, relation)
    refuse_collation_casts(sql, node, relation)


def refuse_misread_tokens(sql: str, relation: Relation) -> None:
    """Refuse a number of ``sql`` written with a ``0x``/``0o``/``0b`` prefix or a ``_`` between digits
    (0A000, rule ``number-form``), ``interval(p) '...'`` (0A000, rule ``interval-precision``), an
    ``interval '...'`` literal sqlglot reads otherwise (0A000, rule ``interval-form``) and
    ``interval '...' + '...'::type`` (0A000, rule ``interval-sum``) and a name written ``U&"..."``
    (0A000, rule ``unicode-name``); ``relation`` is the protected table it reads."""
    try:
        tokens = _tokens(sql)
    except ParseError:  # pragma: no cover - the statement was parsed already
        return
    for index, token in enumerate(tokens):
        if token.name in ("ICONST", "FCONST"):
            text = sql[token.start : token.end + 1]
            if _NOT_DECIMAL.match(text):
                raise Refusal(
                    SQLSTATE.FEATURE_NOT_SUPPORTED,
                    f"the number {text}, which PostgreSQL 15 does not read as a number and dpproxy's DP planner "
                    f"reads otherwise, is not supported on protected table {relation.display_name} (rule: number-form)",
                    f"Write it in decimal: {_decimal(text)}.",
                    "number-form",
                )
        elif token.name == "UIDENT":
            written = sql[token.start : token.end + 1]
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"the name {written}, which dpproxy's DP planner reads as U & \"...\", is not supported on "
                f"protected table {relation.display_name} (rule: unicode-name)",
                "Write the name with its characters, in double quotes where it needs them: \"Ünï cödé\", not "
                "U&\"\\00dcn\\00ef c\\00f6d\\00e9\".",
                "unicode-name",
            )
        elif token.name == "INTERVAL" and index + 1 < len(tokens) and sql[tokens[index + 1].start] == "(":
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"interval(p) '...' is not supported on protected table {relation.display_name} "
                "(rule: interval-precision)",
                "dpproxy's DP planner reads interval(p) 'v' as interval 'p' + interval 'v'; write interval 'v'.",
                "interval-precision",
            )
        elif token.name == "INTERVAL" and (end := _misread_interval(sql, tokens, index)) is not None:
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"the interval literal {sql[token.start : tokens[end].end + 1]}, which dpproxy's DP planner "
                f"reads otherwise than PostgreSQL, is not supported on protected table {relation.display_name} "
                "(rule: interval-form)",
                "Write one number and unit per interval and add them, as interval '1 day' + interval '90 minutes', "
                "with a minus sign before a negative number ('-1 day', not '1 day ago'), in months where you meant "
                "quarters (PostgreSQL has no quarter unit), without U&'...' escapes; a field after the string "
                "takes a whole number only (interval '2' hour), or write CAST('1:30' AS interval hour); add an "
                "interval, not a number, to an interval (interval '1 day' + interval '5 seconds').",
                "interval-form",
            )
        elif token.name == "INTERVAL" and _string_taken_further(tokens, index + 1):
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"interval '...' + '...'::type is not supported on protected table {relation.display_name} "
                "(rule: interval-sum)",
                "dpproxy's DP planner reads interval 'a' + 'b'::t (or * 2) as (interval 'a' + interval 'b')::t; "
                "write the type before the value: interval '1 day' + date '2023-01-01'.",
                "interval-sum",
            )


# Tokens that bind tighter than + (a cast, * / % ^, COLLATE, AT TIME ZONE, a subscript)
_TIGHTER = frozenset({"TYPECAST", "ASCII_42", "ASCII_47", "ASCII_37", "ASCII_94", "COLLATE", "AT", "ASCII_91"})


def _string_taken_further(tokens: list[Any], at: int) -> bool:
    """Whether the interval literal whose string is ``tokens[at]`` is followed, after a ``+``, by a
    string that something after it binds tighter than the ``+`` (``+ '2023-01-01'::date``, ``+ '5' *
    2``): PostgreSQL applies that to the string, sqlglot to the sum of intervals it reads."""
    first = at
    while at < len(tokens) and tokens[at].name in _STRINGS:
        end = _after_fields(tokens, at + 1)
        if at != first and end < len(tokens) and tokens[end].name in _TIGHTER:
            return True
        if end + 1 >= len(tokens) or tokens[end].name != "ASCII_43":
            return False
        at = end + 1  # the string after this +
    return False


def refuse_is_unknown(node: dict[str, Any], relation: Relation) -> None:
    """Refuse ``x IS [NOT] UNKNOWN`` in ``node`` (pglast JSON) unless ``x`` is a boolean column of
    ``relation``: 42804, as PostgreSQL, on a column of another type; 0A000 on anything else."""
    for test in nodes_of(node, "BooleanTest"):
        if test.get("booltesttype") in ("IS_UNKNOWN", "IS_NOT_UNKNOWN"):
            _check_unknown_test(test, relation)


def _check_unknown_test(test: dict[str, Any], relation: Relation) -> None:
    written = "IS NOT UNKNOWN" if test["booltesttype"] == "IS_NOT_UNKNOWN" else "IS UNKNOWN"
    fields = test["arg"].get("ColumnRef", {}).get("fields", [])
    column = relation.columns.get(fields[-1]["String"]["sval"]) if fields and "String" in fields[-1] else None
    if column is not None and BOOL in (column.type_oid, column.base_type_oid):
        return
    hint = (f"dpproxy's DP planner reads x {written} as x {written.replace('UNKNOWN', 'NULL')}, PostgreSQL only "
            f"for a boolean x; write {written.replace('UNKNOWN', 'NULL')}.")
    if column is not None:
        raise Refusal("42804", f"argument of {written} must be type boolean, not the type of column {column.name} "
                      "(rule: is-unknown)", hint, "is-unknown")
    raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED, f"{written} of anything but a boolean column is not supported on "
                  f"protected table {relation.display_name} (rule: is-unknown)", hint, "is-unknown")


def refuse_dropped_precision(node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``timestamp-precision``) a ``CURRENT_TIMESTAMP(n)`` in ``node`` (pglast JSON)."""
    if any(call.get("op") == "SVFOP_CURRENT_TIMESTAMP_N" for call in nodes_of(node, "SQLValueFunction")):
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            f"CURRENT_TIMESTAMP(n) is not supported on protected table {relation.display_name} "
            "(rule: timestamp-precision)",
            "dpproxy's DP planner would compare with CURRENT_TIMESTAMP, its precision dropped; write CURRENT_TIMESTAMP "
            "or now(), or LOCALTIMESTAMP(n), which keeps its precision.",
            "timestamp-precision",
        )


def refuse_constant_positions(node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``constant-position``) a GROUP BY or ORDER BY item of ``node`` (pglast JSON)
    that is a constant under a unary ``+`` (``+1``, ``+ +2``, ``+(1)``).

    PostgreSQL reads a bare number as an output's position and ``+1`` as a value by which it
    neither groups nor orders: ``GROUP BY +1`` beside an ungrouped column fails (42803), ``ORDER BY
    +2 DESC LIMIT 1`` returns any row. sqlglot drops the ``+`` and reads the position. (Any other
    constant expression, ``1 / 0`` or ``2 + 0``, sqlglot keeps as PostgreSQL does.)"""
    selects = ([node] if "targetList" in node else []) + nodes_of(node, "SelectStmt")  # the statement's own, then any below
    for select in selects:
        for clause, items in (("GROUP BY", select.get("groupClause", [])),
                              ("ORDER BY", [item["SortBy"]["node"] for item in select.get("sortClause", [])])):
            if any(_plus_constant(item) for item in items):
                raise Refusal(
                    SQLSTATE.FEATURE_NOT_SUPPORTED,
                    f"a constant expression in {clause} is not supported on protected table "
                    f"{relation.display_name} (rule: constant-position)",
                    "PostgreSQL reads a bare number (GROUP BY 1) as an output's position and +1 as a value it "
                    "neither groups nor orders by; dpproxy's DP planner reads +1 as the position 1. Write the "
                    "position as a bare number.",
                    "constant-position",
                )


def refuse_unary_plus(node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``unary-plus``) a unary ``+`` in ``node`` (pglast JSON) before anything
    but a number literal.

    sqlglot drops a unary ``+`` wherever it stands, and PostgreSQL reads one: it has a prefix ``+``
    for the number types only, so ``+sex = 'Male'``, ``+interval '1 day'`` and ``ts > +$1`` fail
    (42883, whatever the rows) and were answered and charged as ``sex = 'Male'``…; and it types
    ``+'39.5'`` and ``+$1`` as double precision, so ``age > +'39.5'`` counts ages above 39.5 where
    dpproxy's ``age > '39.5'`` failed (22P02). Before a number the ``+`` changes neither its value
    nor its type: ``+5``, ``+40.5``, ``+-5`` are answered (``GROUP BY +1``: rule ``constant-position``).
    Each unary ``+`` of a chain is judged by what the chain holds (:func:`_under_plus`)."""
    for expression in nodes_of(node, "A_Expr"):
        under = _under_plus({"A_Expr": expression})
        if under is not None and not ("A_Const" in under and {"ival", "fval"} & under["A_Const"].keys()):
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"a unary + before anything but a number is not supported on protected table "
                f"{relation.display_name} (rule: unary-plus)",
                "dpproxy's DP planner drops the +, which PostgreSQL reads: it has + for numbers only (+sex, "
                "+interval '1 day' fail) and reads +'39.5' or +$1 as double precision. Leave the + out, or "
                "write CAST(x AS double precision).",
                "unary-plus",
            )


def _under_plus(item: dict[str, Any]) -> dict[str, Any] | None:
    """What ``item`` (pglast JSON) holds under one or more unary ``+`` (``+5``, ``+ +x``, ``+(1)``: the
    5, the x, the 1), or None when it is no unary ``+``."""
    under = None
    while "A_Expr" in item and "lexpr" not in item["A_Expr"] and [
            part.get("String", {}).get("sval") for part in item["A_Expr"].get("name", [])] == ["+"]:
        item = under = item["A_Expr"].get("rexpr", {})
    return under


def _plus_constant(item: dict[str, Any]) -> bool:
    """Whether ``item`` is a literal under one or more unary ``+``."""
    under = _under_plus(item)
    return under is not None and "A_Const" in under


def refuse_typed_literal_casts(sql: str, node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``typed-literal-cast``) a typed literal of ``sql`` cast again with ``::``
    (``numeric '40.5'::int``); ``node`` is its pglast JSON.

    PostgreSQL reads it as ``(numeric '40.5')::int`` (41); sqlglot as ``CAST(CAST('40.5' AS int) AS
    numeric)``, which fails (22P02) where PostgreSQL answers, and ``timestamptz '...'::text`` as a
    timestamptz, answered where PostgreSQL fails (42883). In parentheses, or an interval, it reads
    them as PostgreSQL does."""
    starts = {cast["arg"]["A_Const"]["location"]: _name_of(cast) for cast in nodes_of(node, "TypeCast")
              if cast.get("location", -1) == -1 and "sval" in cast.get("arg", {}).get("A_Const", {})
              and _name_of(cast) != "interval"}
    if not starts:
        return
    tokens = _tokens(sql)
    for token, after in zip(tokens, tokens[1:]):
        if token.start in starts and after.name == "TYPECAST":
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"{starts[token.start]} '...'::type is not supported on protected table {relation.display_name} "
                "(rule: typed-literal-cast)",
                f"dpproxy's DP planner reads {starts[token.start]} 'v'::t as CAST(CAST('v' AS t) AS "
                f"{starts[token.start]}); write ({starts[token.start]} 'v')::t or CAST('v' AS t).",
                "typed-literal-cast",
            )


def refuse_collation_casts(sql: str, node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``collation-cast``) a ``COLLATE`` clause of ``sql`` whose collation's name is
    followed by ``::`` (``t COLLATE "C"::text``); ``node`` is its pglast JSON.

    PostgreSQL reads it as ``(t COLLATE "C")::text`` (the name is no expression); sqlglot as ``t COLLATE
    CAST("C" AS text)``, a cast of the column "C", refused as 42703 (column "C" does not exist) where
    PostgreSQL answers (found by the round-trip check of GROUP BY keys, tests/round_trip_keys.py). In
    parentheses it reads it as PostgreSQL does."""
    if not nodes_of(node, "CollateClause"):
        return
    tokens = _tokens(sql)
    for at, token in enumerate(tokens):
        if token.name != "COLLATE":
            continue
        end = at + 2  # past COLLATE and the name's first part; then .part for a qualified name
        while end + 1 < len(tokens) and tokens[end].name == "ASCII_46":
            end += 2
        if end < len(tokens) and tokens[end].name == "TYPECAST":
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"COLLATE name::type is not supported on protected table {relation.display_name} (rule: collation-cast)",
                "dpproxy's DP planner reads x COLLATE \"C\"::t as a cast of a column named C; write "
                "(x COLLATE \"C\")::t or CAST(x COLLATE \"C\" AS t).",
                "collation-cast",
            )


def _name_of(cast: dict[str, Any]) -> str:
    """The type name of a TypeCast (pglast JSON), without its schema."""
    return str(cast["typeName"]["names"][-1]["String"]["sval"])


# Operators ending in @ that sqlglot reads as PostgreSQL does (containment, text search match)
_AT_OPERATORS = frozenset({"<@", "@@"})


def refuse_prefix_operators(sql: str, node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``prefix-operator``) a prefix operator of ``sql`` (``node``: its pglast JSON)
    other than ``-`` and ``+`` (``@ x``, ``~ x``, ``|/ x``), an operator ending in ``@`` but ``<@`` and
    ``@@`` (PostgreSQL's scanner reads ``i>=@5`` as the operator ``>=@``, which it does not have;
    sqlglot as ``i >= $5``), and a ``-`` directly before ``mod(...)``: sqlglot reads ``@ x`` as the
    parameter ``$x`` and ``-mod(a, b)`` as ``(-a) % b``. ``-(mod(a, b))``,
    whose parentheses sqlglot keeps, is answered (the tree has no parentheses: the token after the
    ``-`` tells)."""
    minus_mods = []
    for expression in nodes_of(node, "A_Expr"):
        symbol = expression["name"][-1]["String"]["sval"] if isinstance(expression.get("name"), list) else ""
        if len(symbol) > 1 and symbol.endswith("@") and symbol not in _AT_OPERATORS:
            _refuse_prefix(f"the operator {symbol}", relation)
        if expression.get("kind") != "AEXPR_OP" or "lexpr" in expression:
            continue
        call = expression.get("rexpr", {}).get("FuncCall", {})
        if symbol == "-" and [part["String"]["sval"] for part in call.get("funcname", [])][-1:] == ["mod"]:
            minus_mods.append(expression.get("location", -1))
        elif symbol not in ("-", "+"):
            _refuse_prefix(f"the prefix operator {symbol}", relation)
    if minus_mods:
        tokens = _tokens(sql)
        if any(token.start in minus_mods and after.name != "ASCII_40" for token, after in zip(tokens, tokens[1:])):
            _refuse_prefix("-mod(...)", relation)


def _refuse_prefix(written: str, relation: Relation) -> None:
    raise Refusal(
        SQLSTATE.FEATURE_NOT_SUPPORTED,
        f"{written} is not supported on protected table {relation.display_name} (rule: prefix-operator)",
        "dpproxy's DP planner reads @ x as the parameter $x and -mod(a, b) as (-a) % b; write abs(x) or "
        "-(mod(a, b)), or compute the value outside the statement.",
        "prefix-operator",
    )


def refuse_in_list_types(node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``in-list-types``) an IN list of ``node`` (pglast JSON) with a typed value
    (a cast) of any other type than what the list is compared with: a column of ``relation``, or
    ``lower()``/``upper()`` of one (text). dpproxy writes the list as ``x = a OR x = b``, each ``=``
    resolved alone, where PostgreSQL compares ``x`` with every value in their common type.

    Where every typed value has ``x``'s own type (a domain's base type: PostgreSQL compares a domain
    as its base type in both), the two agree: PostgreSQL's common type (``select_common_type`` over
    ``x`` and the values, untyped strings skipped) is ``x``'s type, to which it converts each untyped
    string (``d IN (date '2024-01-01', '2024-02-01')`` compares dates), and each ``x = 'v'`` alone
    resolves its untyped string to the other side's type too, so ``=`` is that type's own in both.
    Of another type it may not be: ``v IN ('ab'::char(3), 'a'::char(3))`` on a varchar column is
    compared as varchar (the common type, the column's: the values' trailing blanks dropped), its
    ``v = 'ab'::char(3)`` as char, where trailing blanks do not count; ``i IN (16777217.0000000001::numeric,
    5::float8)`` on an integer as double precision, its ``i = 16777217.0000000001::numeric`` as numeric. Such a
    list is refused, but for the string types :data:`_TEXT_COMPARED` pairs and integers and numeric
    (:data:`_EXACT_NUMBERS`), which both readings compare alike (SQLAlchemy writes ``x IN
    ($1::VARCHAR)``). Numbers and expressions, which carry no written type, are left alone."""
    for expression in nodes_of(node, "A_Expr"):
        if expression.get("kind") != "AEXPR_IN" or "List" not in expression.get("rexpr", {}):
            continue
        compared = _compared_type(expression.get("lexpr", {}), relation)
        others = sorted({written for item in expression["rexpr"]["List"].get("items", [])
                         if (written := _written_type(item)) not in (None, "unknown")
                         and not _compares_alike(compared, BUILTIN_TYPE_OIDS.get(written))})
        if others and not _floats_compared_alike(compared, expression["rexpr"]["List"].get("items", [])):
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"an IN list holding a value of type {', '.join(others)}, not the compared column's own type, is not "
                f"supported on protected table {relation.display_name} (rule: in-list-types)",
                "PostgreSQL compares x IN (a, b) in the values' common type, dpproxy as x = a OR x = b, each in its "
                "own; write the values untyped (x IN ('a', 'b')) or cast each to the column's own type, or write "
                "x = a OR x = b.",
                "in-list-types",
            )


_TEXT, _VARCHAR, _BPCHAR = BUILTIN_TYPE_OIDS["text"], BUILTIN_TYPE_OIDS["varchar"], BUILTIN_TYPE_OIDS["bpchar"]
# Typed values of another string type than the compared column's that PostgreSQL compares alike in
# the list and alone. A text column: the common type is text (the preferred string type, kept once
# met), and text = varchar or text = char resolves to text's own = (an exact match on one side and
# the preferred type). A varchar column: text values make the common type text, and varchar = text
# is text's = too. A char column: varchar values leave the common type char (each converts to the
# other implicitly: the first stays), and char = varchar is char's own =. (A varchar column with a
# char value is compared as varchar in the list, as char alone; a char column with text and varchar
# values as text in the list.)
_TEXT_COMPARED = {_TEXT: frozenset({_VARCHAR, _BPCHAR}), _VARCHAR: frozenset({_TEXT}), _BPCHAR: frozenset({_VARCHAR})}
# Integers and numeric: whatever the common type, each value converts to it exactly, and an integer
# compared with a numeric or another integer compares exact values alone too (i IN (1, 40000::int2)).
_EXACT_NUMBERS = frozenset(BUILTIN_TYPE_OIDS[name] for name in ("int2", "int4", "int8", "numeric"))


def _compares_alike(compared: int | None, typed: int | None) -> bool:
    """Whether a value cast to ``typed`` (a type OID; None: not built in) in an IN list on a value of
    type ``compared`` (None: not known) is compared alike in the list and in ``x = value``."""
    return compared is not None and typed is not None and (
        typed == compared or typed in _TEXT_COMPARED.get(compared, frozenset())
        or {compared, typed} <= _EXACT_NUMBERS)


# Columns a list of real and double precision values is compared with alike in the list and alone:
# PostgreSQL converts the column to double precision either way (int4 = real is float84eq after the
# int4's conversion, as int4 IN (real, real) is float8 = ANY (real[])), and each value exactly.
_FLOAT_COMPARED = frozenset(BUILTIN_TYPE_OIDS[name] for name in ("int2", "int4", "int8", "float4", "float8"))
_FLOATS = frozenset({"float4", "float8"})


def _floats_compared_alike(compared: int | None, items: list[dict[str, Any]]) -> bool:
    """Whether an IN list of ``items`` (pglast JSON) on a value of type ``compared`` (an integer or
    double precision or real column) holds values cast to real or double precision only: the list's
    common type is then real or double precision, to which each value converts exactly, and the column
    is compared as double precision in the list and in each ``x = value`` alike (``i IN (1::float4,
    2::float4)``). A number or a string beside them would be converted to real in the list (16777217
    to 16777216) and compared as an integer alone; a numeric column's raw conjunct
    (rewriter/raw_equality.py) casts a real value to numeric (16777216 to 16777200): refused."""
    return compared in _FLOAT_COMPARED and all(_written_type(item) in _FLOATS for item in items)


def _compared_type(lexpr: dict[str, Any], relation: Relation) -> int | None:
    """The type OID of an IN list's left side (pglast JSON) when it is a column of ``relation`` (a
    domain's base type) or ``lower()``/``upper()`` of one (text); None for anything else."""
    call = lexpr.get("FuncCall")
    if call is not None:
        name = [part["String"]["sval"] for part in call["funcname"]]
        arguments = call.get("args", [])
        if name[-1] in ("lower", "upper") and name[:-1] in ([], ["pg_catalog"]) and len(arguments) == 1 \
                and _compared_type(arguments[0], relation) is not None:
            return BUILTIN_TYPE_OIDS["text"]
        return None
    fields = lexpr.get("ColumnRef", {}).get("fields", [])
    column = relation.columns.get(str(fields[-1]["String"]["sval"])) if fields and "String" in fields[-1] else None
    return column.value_type[0] if column is not None else None


def _written_type(item: dict[str, Any]) -> str | None:
    """The type an IN list's value is written with: a cast's type name (schema-qualified but for
    ``pg_catalog``, ``[]`` after an array's), ``unknown`` for an untyped string, None for anything
    else (a number, an expression), whose common type is left alone."""
    if "TypeCast" in item:
        type_name = item["TypeCast"]["typeName"]
        names = [part["String"]["sval"] for part in type_name["names"]]
        written = ".".join(names[1:] if names[0] == "pg_catalog" else names)
        return written + "[]" * len(type_name.get("arrayBounds", []))
    if "sval" in item.get("A_Const", {}):
        return "unknown"
    return None


# The kinds of number (rewriter.number_kinds) PostgreSQL's round(numeric, integer) takes: an integer
# converts to numeric implicitly, an untyped string or a parameter takes numeric from round itself
_ROUNDED_AS_NUMERIC = frozenset({"int", "numeric", "unknown"})


def refuse_round_casts(node: dict[str, Any], relation: Relation) -> None:
    """Refuse (0A000, rule ``round-cast``) ``round(x, n)`` in ``node`` (pglast JSON) of an ``x`` that
    is not an integer, a numeric or an untyped value to PostgreSQL
    (:func:`rewriter.number_kinds.number_kind`: double precision, or no number it knows), which has
    ``round(numeric, integer)`` only and fails (42883) whatever the rows, where sqlglot writes
    ``ROUND(CAST(x AS DECIMAL), n)``. Of a constant (``round(ceil('4.5'), 1)``, ``round(2 ^ 3, 1)``:
    found by the round-trip check) or a column (``round(floor(5), 1)``: ``floor`` of an integer is
    double precision; found by the round-trip check of outputs, tests/round_trip_outputs.py).
    A constant PostgreSQL certainly makes double precision (``round(pi(), 2)``) fails as PostgreSQL
    fails it, 42883 (:func:`_undefined_round`).
    ``round`` of a released aggregate (``round(sum(f)::float8, 2)``) is left to post-processing,
    which writes it as the analyst did, so that it fails with PostgreSQL's own 42883 before the
    charge (rewriter/post_process.py)."""
    for call in nodes_of(node, "FuncCall"):
        arguments = call.get("args", [])
        if (call["funcname"][-1]["String"]["sval"] == "round" and len(arguments) == 2
                and not _releases(arguments[0])
                and (kind := number_kind(arguments[0], relation.columns)) not in _ROUNDED_AS_NUMERIC):
            if kind == "float" and not nodes_of(arguments[0], "ColumnRef") and not nodes_of(arguments[0], "ParamRef"):
                raise _undefined_round(relation)
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"round(x, n) of a value that may be double precision is not supported on protected table "
                f"{relation.display_name} (rule: round-cast)",
                "PostgreSQL has round(numeric, integer) only, and fails round of a double precision (round(5), "
                "ceil(count(*)) and avg of a float column are double precision); dpproxy's DP planner casts it to "
                "numeric first. Cast it yourself: round(CAST(x AS numeric), n).",
                "round-cast",
            )


def _undefined_round(relation: Relation) -> Refusal:
    """PostgreSQL's own error (42883) for ``round(x, n)`` of a constant ``x`` that is double precision
    or real to it (``round(pi(), 2)``, ``round(floor(5), 1)``): it has no such function and fails the
    statement at parse analysis, whatever the rows, where it stands. Told from the text alone, before
    any charge. (Of a column, a name may be another level's; of a parameter, its declared type
    decides: refused as ``round-cast`` above.)"""
    return Refusal(
        "42883",
        "function round(x, n) of a double precision or real x does not exist (rule: round-cast)",
        f"On protected table {relation.display_name}, as in PostgreSQL: no function matches the given name and "
        "argument types. PostgreSQL has round(numeric, integer) only: write round(CAST(x AS numeric), n).",
        "round-cast",
    )


# The aggregates dpproxy releases: round() of one is post-processing, left to its own checks
_RELEASED = frozenset({"count", "sum", "avg", "min", "max", "mode", "percentile_cont", "percentile_disc", "stddev",
                       "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop"})


def _releases(item: dict[str, Any]) -> bool:
    """Whether ``item`` (pglast JSON) calls an aggregate dpproxy releases (``count(*)``, ``avg(x)``)."""
    return any(call["funcname"][-1]["String"]["sval"] in _RELEASED for call in nodes_of(item, "FuncCall"))
