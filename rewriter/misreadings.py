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

``x IS [NOT] UNKNOWN``: sqlglot reads it as ``x IS [NOT] NULL``. That is PostgreSQL's meaning for a
boolean ``x``; for any other, PostgreSQL fails the statement (42804) whatever the rows, and dpproxy
answered it. It is let through on a boolean column of the table only.

``interval 'a' + 'b'``: sqlglot reads the string after ``+`` as one more interval, and a cast after it
as a cast of the sum: ``interval '1 day' + '2023-01-01'::date`` was run as ``CAST(interval '1 day' +
interval '2023-01-01' AS date)``, which fails (22007) where PostgreSQL adds a day to a date, and
``interval '1 day' + '5' * 2`` as ``interval '1 day' + interval '5' * 2``, answered where PostgreSQL
fails (42883). It is found by the scanner (``INTERVAL``, its value and fields, ``+``, a string) and refused.

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
from sqlglot.expressions import INTERVAL_STRING_RE

from policies.errors import SQLSTATE, Refusal
from policies.tables import Relation

from .function_check import nodes_of
from .types import BOOL

__all__ = ["refuse_constant_positions", "refuse_dropped_precision", "refuse_is_unknown", "refuse_misread_tokens",
           "refuse_typed_literal_casts"]

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


def refuse_misread_tokens(sql: str, relation: Relation) -> None:
    """Refuse a number of ``sql`` written with a ``0x``/``0o``/``0b`` prefix or a ``_`` between digits
    (0A000, rule ``number-form``), ``interval(p) '...'`` (0A000, rule ``interval-precision``) and
    ``interval '...' + '...'`` (0A000, rule ``interval-sum``);
    ``relation`` is the protected table it reads."""
    try:
        tokens = scan(sql)
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
        elif token.name == "INTERVAL" and _literal_added(sql, tokens, index + 1):
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"interval '...' + a literal is not supported on protected table {relation.display_name} "
                "(rule: interval-sum)",
                "dpproxy's DP planner reads interval 'a' + 'b' (or + 2) as interval 'a' + interval 'b', also where 'b' "
                "is cast to another type after; write the type before the value: interval '1 day' + date '2023-01-01'.",
                "interval-sum",
            )
        elif token.name == "INTERVAL" and (value := _misread_interval(sql, tokens, index + 1)) is not None:
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"the interval literal {value!r} is not supported on protected table {relation.display_name} "
                "(rule: interval-form)",
                "dpproxy's DP planner reads an interval literal with one number and unit in it as that number and unit "
                "alone (interval '1 day ago' as interval '1 day'), and interval 'v' <field> as interval 'v <field>'; "
                "write '...'::interval (or interval '-1 day'; interval '2' day with a whole number).",
                "interval-form",
            )
        elif token.name == "INTERVAL" and index + 1 < len(tokens) and sql[tokens[index + 1].start] == "(":
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"interval(p) '...' is not supported on protected table {relation.display_name} "
                "(rule: interval-precision)",
                "dpproxy's DP planner reads interval(p) 'v' as interval 'p' + interval 'v'; write interval 'v'.",
                "interval-precision",
            )


# The units an interval literal's value may be followed by (interval '1' day to second(3))
_UNITS = frozenset({"YEAR_P", "MONTH_P", "DAY_P", "HOUR_P", "MINUTE_P", "SECOND_P"})


def _fields_end(tokens: Sequence[Any], index: int) -> int:
    """The index past the fields (``day``, ``hour to minute``, ``second(3)``) at ``tokens[index:]``."""
    while index < len(tokens) and tokens[index].name in _UNITS:
        index += 1
        if tokens[index - 1].name == "SECOND_P" and index < len(tokens) and tokens[index].name == "ASCII_40":
            index += 3  # second(p)
        if index < len(tokens) and tokens[index].name == "TO":
            index += 1
    return min(index, len(tokens))


def _literal_added(sql: str, tokens: Sequence[Any], index: int) -> bool:
    """Whether ``tokens[index:]`` is an interval literal's value (and fields) followed by ``+`` (or by
    nothing) and a string or a number, which sqlglot reads as one more interval."""
    if index >= len(tokens) or tokens[index].name not in ("SCONST", "USCONST"):
        return False
    index = _fields_end(tokens, index + 1)
    if index < len(tokens) and sql[tokens[index].start : tokens[index].end + 1] == "+":
        index += 1
    return index < len(tokens) and tokens[index].name in ("SCONST", "USCONST", "ICONST", "FCONST")


def _misread_interval(sql: str, tokens: Sequence[Any], index: int) -> str | None:
    """The value of the interval literal whose string is ``tokens[index]`` where sqlglot reads it
    otherwise than PostgreSQL, else None.

    sqlglot finds the number-unit pairs of the string (:data:`sqlglot.exp.INTERVAL_STRING_RE`); where it
    finds one, it keeps that pair alone ('1 day ago' is '1 day', '1 day 10:00' is '1 day'). Fields after
    the string restrict PostgreSQL's value to them (interval '1.5' day is 1 day) and are moved into the
    string by sqlglot (interval '1.5 day', a day and a half): only a whole number before one field is
    alike; a span (``hour to minute``) sqlglot keeps as written, unless the string has a unit of its own.
    """
    if index >= len(tokens) or tokens[index].name not in ("SCONST", "USCONST"):
        return None
    end = _fields_end(tokens, index + 1)
    text = sql[tokens[index].start : tokens[index].end + 1]
    value = _string_value(text)
    if value is None:  # U&'...' UESCAPE '!': not read here, refused
        return text
    pairs = INTERVAL_STRING_RE.findall(value)
    fields = tokens[index + 1 : end]
    if not fields:
        return value if len(pairs) == 1 and INTERVAL_STRING_RE.fullmatch(value) is None else None
    if pairs or any(token.name == "ASCII_40" for token in fields):  # a unit in the string, a precision
        return value
    if any(token.name == "TO" for token in fields):  # kept as written: interval '1:30' hour to minute
        return None
    return None if re.fullmatch(r"\s*[-+]?[0-9]+\s*", value) else value


def _string_value(text: str) -> str | None:
    """The value of the string constant ``text`` (quoted, E'', U&'', dollar-quoted) as PostgreSQL reads it."""
    try:
        tree = json.loads(parse_sql_json(f"SELECT {text}"))
        value = tree["stmts"][0]["stmt"]["SelectStmt"]["targetList"][0]["ResTarget"]["val"]["A_Const"]["sval"]
    except (ParseError, KeyError, IndexError):
        return None
    return str(value.get("sval", ""))


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


def _plus_constant(item: dict[str, Any]) -> bool:
    """Whether ``item`` is a literal under one or more unary ``+``."""
    while "A_Expr" in item and "lexpr" not in item["A_Expr"] and [part.get("String", {}).get("sval")
                                                                  for part in item["A_Expr"]["name"]] == ["+"]:
        item = item["A_Expr"]["rexpr"]
        if "A_Const" in item:
            return True
    return False


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
    tokens = scan(sql)
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


def _name_of(cast: dict[str, Any]) -> str:
    """The type name of a TypeCast (pglast JSON), without its schema."""
    return str(cast["typeName"]["names"][-1]["String"]["sval"])
