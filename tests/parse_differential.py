"""A parse differential: what PostgreSQL reads in an accepted DP statement against what it reads
in the backend SQL dpproxy wrote for it (docs/threat-model.md, "The parse differential").

dpproxy classifies a statement by pglast's tree (PostgreSQL's own parser) but plans and renders
its backend SQL from sqlglot's. Where the two parsers read the statement differently, the
analyst is answered for a statement PostgreSQL does not mean. This module reads both texts with
pglast and compares, per statement:

* the columns it names (the last name of each column reference);
* each condition of a WHERE or FILTER, in a canonical form that keeps its boolean structure
  (AND/OR/NOT nesting, IS tests), its operators by name, its functions by name and each
  constant's *value* as PostgreSQL reads it (escapes, dollar quotes, numeric forms, bit
  strings). The match is structural, so polarity counts: each top-level conjunct of the
  statement's WHEREs must be a top-level conjunct of the backend's WHEREs, and each of those
  one of the statement's or one the rewriter adds on purpose, each named (the cells' ``kN IS NOT
  NULL``, a raw equality beside a ``=`` or IN; a raw comparison beside its bounded twin is read
  as the twin). A conditional aggregate's FILTER and CASE are compared as one backend FILTER's
  conjuncts (a MODE's label added). A conjunct negated, put under an OR or added is reported.

The canonical form forgets only what the rewriter adds on purpose and PostgreSQL reads as the
same: ``pg_catalog.`` before a function or operator, ``CAST(c AS numeric)`` around a numeric
constant, and the text bound's ``CASE WHEN <size test> THEN col END`` around a column
(:mod:`rewriter.text_bounds`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Sequence

from pglast.parser import parse_sql_json

from rewriter.function_check import nodes_of
from tests.constant_values import AGGREGATES, is_constant, sql_of

__all__ = ["Canon", "Divergence", "Same", "alike", "canonical", "chosen_rows", "conjuncts", "divergences",
           "read_columns", "tree_of"]

Canon = Any  # a nested tuple of str, int, Decimal and bool
# Whether two constant expressions (their SQL) evaluate alike on PostgreSQL (tests.constant_values)
Same = Callable[[str, str], bool]

# now() and its synonyms, which sqlglot writes as CURRENT_TIMESTAMP
_NOW = {"now", "transaction_timestamp"}
# Functions whose first argument is a field name PostgreSQL reads in any case
_FIELD_FIRST = {"date_trunc", "date_part", "extract"}
# For each date part, the date_trunc units that keep it: part(date_trunc(unit, t)) = part(t) for every t
# (of date_trunc('week', t) the year is not t's: a week starts in the year before)
_KEPT_BY = {
    "year": {"year", "quarter", "month", "day"}, "quarter": {"quarter", "month", "day"},
    "month": {"month", "day"}, "day": {"day"}, "dow": {"day"}, "isodow": {"day"}, "doy": {"day"},
    "week": {"week", "day"}, "isoyear": {"week", "day"}, "decade": {"year", "quarter", "month", "day"},
    "century": {"year", "quarter", "month", "day"}, "millennium": {"year", "quarter", "month", "day"},
}


@dataclass(frozen=True)
class Divergence:
    """Something the statement reads that its backend SQL does not read alike."""

    what: str  # "column" or "condition"
    read: str  # as PostgreSQL reads it in the statement

    def __str__(self) -> str:
        return f"{self.what} {self.read} is not read alike in the backend SQL"


def tree_of(sql: str) -> dict[str, Any]:
    return dict(json.loads(parse_sql_json(sql))["stmts"][0]["stmt"])


def read_columns(tree: dict[str, Any]) -> frozenset[str]:
    """The last name of every column reference of ``tree`` (``*`` left out)."""
    return frozenset(ref["fields"][-1]["String"]["sval"] for ref in nodes_of(tree, "ColumnRef") if "String" in ref["fields"][-1])


def _wheres(tree: dict[str, Any]) -> list[dict[str, Any]]:
    """The WHERE expression of each level of ``tree`` that chooses rows: not of an enclosing query's
    level (:func:`_encloses`), whose WHERE reads released values (``SELECT ... FROM (SELECT count(*)
    AS n ...) q WHERE n > 10``, compared by tests/release_differential.py)."""
    return [select["whereClause"] for select in nodes_of(tree, "SelectStmt")
            if "whereClause" in select and not _encloses(select)]


def _encloses(select: dict[str, Any]) -> bool:
    """Whether ``select`` reads only an aggregate level (its one derived table, or a CTE of its own
    WITH), maybe through enclosing levels: an enclosing query's level."""
    sources = select.get("fromClause", [])
    if len(sources) != 1:
        return False
    ctes = {cte["CommonTableExpr"]["ctename"]: cte["CommonTableExpr"]["ctequery"]
            for cte in select.get("withClause", {}).get("ctes", [])}
    if "RangeSubselect" in sources[0]:
        inner = sources[0]["RangeSubselect"]["subquery"]
    elif "RangeVar" in sources[0] and sources[0]["RangeVar"]["relname"] in ctes:
        inner = ctes[sources[0]["RangeVar"]["relname"]]
    else:
        return False
    return "SelectStmt" in inner and (_aggregates(inner["SelectStmt"]) or _encloses(inner["SelectStmt"]))


def _aggregates(select: dict[str, Any]) -> bool:
    """Whether ``select`` is an aggregate level: it groups, or its outputs or HAVING call an aggregate."""
    calls = nodes_of([select.get("targetList", []), select.get("havingClause", {})], "FuncCall")
    return "groupClause" in select or any(_name(call["funcname"]).lower() in AGGREGATES for call in calls)


def _name(parts: list[dict[str, Any]]) -> str:
    return str(parts[-1]["String"]["sval"])


def _constant(value: dict[str, Any]) -> Canon:
    if value.get("isnull"):
        return ("null",)
    for field in ("ival", "fval"):
        if field in value:
            return ("number", str(Decimal(str(value[field].get(field, 0))).normalize()))
    if "sval" in value:
        return ("string", value["sval"].get("sval", ""))
    if "bsval" in value:
        return ("bits", value["bsval"]["bsval"])
    if "boolval" in value:
        return ("boolean", bool(value["boolval"].get("boolval", False)))
    return ("constant", json.dumps(value, sort_keys=True))


def canonical(node: Any) -> Canon:
    """``node`` (pglast JSON) with locations, ``pg_catalog.`` and the rewriter's own wrappings left out.

    A constant expression (:func:`tests.constant_values.is_constant`) other than a bare literal is
    ``("value", its SQL, its canonical form)``: :func:`alike` evaluates it where the forms differ."""
    if isinstance(node, list):
        return tuple(canonical(item) for item in node)
    if not isinstance(node, dict):
        return node
    if is_constant(node):
        return ("value", sql_of(node), _canonical(node))
    return _canonical(node)


def _canonical(node: dict[str, Any]) -> Canon:
    if len(node) != 1:
        return tuple(sorted((key, canonical(value)) for key, value in node.items() if key != "location"))
    (kind, value), = node.items()
    if kind == "Released":  # a released aggregate or key, already in canonical form (tests/release_differential.py)
        return value
    if kind == "ColumnRef":
        last = value["fields"][-1]
        return ("column", last["String"]["sval"] if "String" in last else "*")
    if kind == "A_Const":
        return _constant(value)
    if kind == "TypeCast":
        cast = ("cast", _name(value["typeName"]["names"]), canonical(value["arg"]))
        if cast[1] == "date" and cast[2][:2] == ("call", "date_trunc") and cast[2][2][1][0] == ("string", "day"):
            return ("cast", "date", cast[2][2][1][1])  # a time's day is the date it falls on
        if cast[1] == "interval" and cast[2][0] == "string":  # PostgreSQL reads '1 day' as '1 DAY'
            return ("cast", "interval", ("string", cast[2][1].lower()))
        return cast
    if kind == "CaseExpr" and "arg" not in value and len(value.get("args", [])) == 1 \
            and value["args"][0]["CaseWhen"]["result"].get("A_Const", {}).get("isnull") and "defresult" in value:
        test = canonical(value["args"][0]["CaseWhen"]["expr"])  # CASE WHEN a = b THEN NULL ELSE a END is nullif(a, b)
        otherwise = canonical(value["defresult"])
        if test[:3] == ("expr", "AEXPR_OP", "=") and test[3] == otherwise:
            return ("expr", "AEXPR_NULLIF", "=", otherwise, test[4])
    if kind == "CaseExpr" and not value.get("defresult") and len(value.get("args", [])) == 1:
        result = value["args"][0]["CaseWhen"]["result"]
        if "ColumnRef" in result:  # the text bound's CASE WHEN <its size is small> THEN col END
            return canonical(result)
        if "CaseExpr" in result and canonical(result)[0] == "column":  # short_text() of the bound in place
            return canonical(result)
    if kind == "A_Expr":
        return _expression(value)
    if kind == "NullTest" and value["nulltesttype"] == "IS_NOT_NULL":  # written NOT (x IS NULL)
        return ("bool", "NOT_EXPR", (("null test", "IS_NULL", canonical(value["arg"])),))
    if kind == "BooleanTest" and value["booltesttype"].startswith("IS_NOT_"):  # written NOT (x IS ...)
        test = value["booltesttype"].replace("IS_NOT_", "IS_")
        return ("bool", "NOT_EXPR", (("boolean test", test, canonical(value["arg"])),))
    if kind == "BooleanTest":
        return ("boolean test", value["booltesttype"], canonical(value["arg"]))
    if kind == "NullTest":
        return ("null test", "IS_NULL", canonical(value["arg"]))
    if kind == "FuncCall":
        if _name(value["funcname"]) in _NOW and not value.get("args"):
            return ("SQLValueFunction", "SVFOP_CURRENT_TIMESTAMP")
        if _name(value["funcname"]) == "mod" and len(value.get("args", [])) == 2:  # mod(a, b) is a % b
            return ("expr", "AEXPR_OP", "%", *(canonical(arg) for arg in value["args"]))
        rest = {key: item for key, item in value.items() if key not in ("funcname", "location", "funcformat")}
        if _name(value["funcname"]) in _FIELD_FIRST and value.get("args") and "sval" in value["args"][0].get("A_Const", {}):
            field = value["args"][0]["A_Const"]["sval"]["sval"].lower()  # date_trunc('MONTH', x) is date_trunc('month', x)
            arguments = [canonical(argument) for argument in value["args"][1:]]
            if _name(value["funcname"]) != "date_trunc" and len(arguments) == 1:
                arguments = [_untruncated(field, arguments[0])]
            return ("call", _name(value["funcname"]), ("args", (("string", field), *arguments)))
        return ("call", _name(value["funcname"]), canonical(rest))
    if kind == "BoolExpr":
        op, args = value["boolop"], [canonical(arg) for arg in value["args"]]
        flat: list[Canon] = []
        for arg in args:  # (a AND b) AND c is a AND b AND c
            flat.extend(arg[2] if op != "NOT_EXPR" and arg[:2] == ("bool", op) else [arg])
        return flat[0] if len(flat) == 1 and op != "NOT_EXPR" else ("bool", op, tuple(flat))
    if kind == "SQLValueFunction":
        return ("SQLValueFunction", value["op"])
    if kind == "CollateClause":  # COLLATE pg_catalog."C" is COLLATE "C"
        names = [part["String"]["sval"] for part in value["collname"]]
        qualified = names[:1] == ["pg_catalog"] and len(names) > 1
        return ("collate", canonical(value["arg"]), tuple(names[1:] if qualified else names))
    if kind == "SortBy":
        return _sort_key(value)
    return (kind, canonical(value))


# The NULLS order PostgreSQL gives each direction unless told: NULL sorts as the largest value
_NULLS = {"SORTBY_DEFAULT": "SORTBY_NULLS_LAST", "SORTBY_ASC": "SORTBY_NULLS_LAST", "SORTBY_DESC": "SORTBY_NULLS_FIRST"}


def _sort_key(value: dict[str, Any]) -> Canon:
    """An ORDER BY item as PostgreSQL orders by it: ASC written or not, and NULLS FIRST/LAST as its
    direction's own (``DESC NULLS FIRST`` is ``DESC``), alike; another operator (``USING``) kept."""
    direction = value.get("sortby_dir", "SORTBY_DEFAULT")
    nulls = value.get("sortby_nulls", "SORTBY_NULLS_DEFAULT")
    ordered = {"SORTBY_DESC": "DESC", "SORTBY_USING": "USING"}.get(direction, "ASC")
    if nulls == "SORTBY_NULLS_DEFAULT" and direction in _NULLS:
        nulls = _NULLS[direction]
    return ("sort", canonical(value["node"]), ordered, nulls, canonical(value.get("useOp")))


# Time types: a cast between them keeps each part of a truncated time the truncation keeps
_TIMES = frozenset({"timestamp", "timestamptz", "date"})


def _untruncated(field: str, time: Canon) -> Canon:
    """``time`` (a date part's argument) without a ``date_trunc`` that keeps the part ``field``, under a
    cast to a time type too (the cast then once: ``CAST(CAST(t AS timestamp) AS timestamp)`` is one)."""
    if time[:2] == ("call", "date_trunc") and time[2][0] == "args" and len(time[2][1]) == 2 \
            and str(time[2][1][0][1]) in _KEPT_BY.get(field, set()):
        return time[2][1][1]
    if time[:1] == ("cast",) and time[1] in _TIMES and time[2][:2] == ("call", "date_trunc"):
        inner = _untruncated(field, time[2])
        if inner != time[2]:
            return inner if inner[:2] == ("cast", time[1]) else ("cast", time[1], inner)
    return time


def _compare(symbol: str, left: Canon, right: Canon) -> Canon:
    return ("expr", "AEXPR_OP", symbol, left, right)


def _expression(value: dict[str, Any]) -> Canon:
    """An ``A_Expr``, with the forms PostgreSQL defines by others written as those:
    ``x BETWEEN a AND b`` is ``x >= a AND x <= b``, ``x IN (a, b)`` is ``x = a OR x = b``,
    ``NOT`` of each is ``NOT`` of that, ``LIKE`` is ``~~``, ``+c`` is ``c`` and ``-c`` the number -c."""
    kind, symbol = value["kind"], _name(value["name"])
    left, right = canonical(value.get("lexpr")), canonical(value.get("rexpr"))
    if isinstance(value.get("rexpr"), dict) and "List" in value["rexpr"]:
        right = tuple(canonical(item) for item in value["rexpr"]["List"]["items"])
    if kind in ("AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN"):
        low, high = right
        between = ("bool", "AND_EXPR", (_compare(">=", left, low), _compare("<=", left, high)))
        return between if kind == "AEXPR_BETWEEN" else ("bool", "NOT_EXPR", (between,))
    if kind == "AEXPR_IN":
        items = tuple(_compare("=", left, item) for item in right)
        within = items[0] if len(items) == 1 else ("bool", "OR_EXPR", items)
        return within if symbol == "=" else ("bool", "NOT_EXPR", (within,))
    if kind in ("AEXPR_LIKE", "AEXPR_ILIKE"):
        kind = "AEXPR_OP"
    operand = right[2] if isinstance(right, tuple) and right[:1] == ("value",) else right  # +40 is a value of its own
    if kind == "AEXPR_OP" and symbol == "+" and left is None and operand[:1] == ("number",):
        return operand
    if kind == "AEXPR_OP" and symbol == "-" and left is None and operand[:1] == ("number",):  # -(+40) is -40
        return ("number", str(-Decimal(operand[1])))
    return ("expr", kind, symbol, left, right)


def _value(item: Canon) -> Decimal | None:
    """A number, or a string PostgreSQL's numeric input reads as one ('Infinity', ' 5 ')."""
    if item[0] == "number":
        return Decimal(item[1])
    try:
        return Decimal(item[1].strip()) if item[0] == "string" else None
    except ArithmeticError:
        return None


# Each comparison and the one PostgreSQL reads with its operands swapped
_COMMUTED = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "=": "=", "<>": "<>"}


def _literal(item: Canon) -> str | None:
    """The SQL of a constant's canonical form: a value's own, a literal's written back, else None."""
    if item[0] == "value":
        return str(item[1])
    if item[0] == "number":
        return str(item[1])
    if item[0] == "string":
        return "'" + str(item[1]).replace("'", "''") + "'"
    if item[0] == "bits":
        return f"{item[1][0].upper()}'{item[1][1:]}'"
    if item[0] == "boolean":
        return "TRUE" if item[1] else "FALSE"
    return "NULL" if item == ("null",) else None


def alike(asked: Canon, ran: Canon, same: Same | None = None) -> bool:
    """Whether ``ran`` (a node of the backend SQL) reads as ``asked`` (one of the statement's).

    A cast in ``ran`` where ``asked`` has none is one the rewriter adds to compare a column with
    a value of its own type (:mod:`rewriter.constants`, :mod:`rewriter.predicates`): the value
    under it must read alike. A number and a string PostgreSQL reads as that number are alike.
    A constant expression on either side is alike where ``same`` evaluates the two alike on
    PostgreSQL, or the expression under the cast the rewriter adds alike (without ``same``, by form).
    """
    if asked == ran:
        return True
    if not (isinstance(asked, tuple) and isinstance(ran, tuple)) or not asked or not ran:
        return False
    if asked[0] == "value" or ran[0] == "value":
        left, right = _literal(asked), _literal(ran)
        if same is not None and left is not None and right is not None:
            if same(left, right):
                return True
            inner = ran[2] if ran[0] == "value" else ran
            outer = asked[2] if asked[0] == "value" else asked
            return inner[0] == "cast" and not (outer[0] == "cast" and outer[1] == inner[1]) and alike(asked, inner[2], same)
        return alike(asked[2] if asked[0] == "value" else asked, ran[2] if ran[0] == "value" else ran, same)
    if ran[0] == "cast" and not (asked[0] == "cast" and asked[1] == ran[1]):
        return alike(asked, ran[2], same)
    if asked[:2] == ("expr", "AEXPR_OP") and asked[2] in _COMMUTED and ran[:3] == ("expr", "AEXPR_OP", _COMMUTED[asked[2]]) \
            and alike(asked[3], ran[4], same) and alike(asked[4], ran[3], same):  # c >= x is x <= c
        return True
    if asked[0] in ("number", "string") and ran[0] in ("number", "string"):
        left_value, right_value = _value(asked), _value(ran)
        return (left_value is not None and right_value is not None
                and (left_value == right_value or (left_value.is_nan() and right_value.is_nan())))
    return len(asked) == len(ran) and all(alike(a, r, same) for a, r in zip(asked, ran))


def _aliases(tree: dict[str, Any]) -> dict[str, str]:
    """Each output name of a derived table or CTE that is a column of the level below, to that
    column (followed down: ``SELECT a FROM (SELECT age AS a ...)`` reads ``age``)."""
    names: dict[str, str] = {}
    for target in nodes_of(tree, "ResTarget"):
        if target.get("name") and "ColumnRef" in target.get("val", {}):
            fields = target["val"]["ColumnRef"]["fields"]
            if "String" in fields[-1] and fields[-1]["String"]["sval"] != target["name"]:
                names[target["name"]] = fields[-1]["String"]["sval"]
    for name in list(names):
        seen = {name}
        while names[name] in names and names[name] not in seen:
            seen.add(names[name])
            names[name] = names[names[name]]
    return names


def _renamed(item: Canon, names: dict[str, str], tests: dict[Canon, Canon]) -> Canon:
    """``item`` with each alias of ``names`` read as its column, then each node of ``tests`` as its value."""
    if isinstance(item, tuple) and len(item) == 2 and item[0] == "column" and item[1] in names:
        return ("column", names[item[1]])
    if not isinstance(item, tuple):
        return item
    renamed = tuple(_renamed(part, names, tests) for part in item)
    return tests.get(renamed, renamed)


def conjuncts(condition: Canon) -> tuple[Canon, ...]:
    """The top-level conjuncts of ``condition`` (a canonical form)."""
    return condition[2] if condition[:2] == ("bool", "AND_EXPR") else (condition,)


def _boolean(node: dict[str, Any], boolean_columns: frozenset[str]) -> bool:
    """Whether ``node`` is a condition: a comparison, AND/OR/NOT, an IS test or a boolean column."""
    if "ColumnRef" in node:
        return read_columns(node) <= boolean_columns
    return bool({"A_Expr", "BoolExpr", "NullTest", "BooleanTest"} & node.keys())


def chosen_rows(call: dict[str, Any], boolean_columns: frozenset[str]) -> list[dict[str, Any]]:
    """The conditions that choose the rows an aggregate ``call`` (pglast JSON) counts: its FILTER,
    and of its argument (or WITHIN GROUP order) a CASE's first WHEN (``SUM(CASE WHEN p THEN x ELSE 0
    END)``) or a condition cast to integer (``SUM((p)::int)``)."""
    chosen = [call["agg_filter"]] if "agg_filter" in call else []
    arguments = call.get("args") or [order["SortBy"]["node"] for order in call.get("agg_order") or []]
    argument = arguments[0] if len(arguments) == 1 else {}
    if "CaseExpr" in argument and "arg" not in argument["CaseExpr"]:
        chosen.append(argument["CaseExpr"]["args"][0]["CaseWhen"]["expr"])
    elif ("TypeCast" in argument and _name(argument["TypeCast"]["typeName"]["names"]) in ("int4", "int")
          and _boolean(argument["TypeCast"]["arg"], boolean_columns)):
        chosen.append(argument["TypeCast"]["arg"])
    return chosen


def _aggregate_conditions(tree: dict[str, Any], boolean_columns: frozenset[str]
                          ) -> list[tuple[str, str | None, list[dict[str, Any]]]]:
    """Each aggregate call of ``tree`` that counts only some rows (any call with a FILTER, and an
    aggregate whose argument chooses rows), by name, with the column it reads (a MODE's categories
    are that column's) and :func:`chosen_rows`."""
    calls = [call for call in nodes_of(tree, "FuncCall")
             if _name(call["funcname"]).lower() in AGGREGATES or "agg_filter" in call]
    found = []
    for call in calls:
        chosen = chosen_rows(call, boolean_columns)
        if chosen:
            orders = [order["SortBy"]["node"] for order in call.get("agg_order") or []]
            argument = orders[0] if len(orders) == 1 else {}
            if "CaseExpr" in argument:
                argument = argument["CaseExpr"]["args"][0]["CaseWhen"]["result"]
            column = sorted(read_columns(argument))[0] if len(read_columns(argument)) == 1 else None
            found.append((_name(call["funcname"]).lower(), column, chosen))
    return found


def _raw_columns(trees: Sequence[dict[str, Any]]) -> dict[str, str]:
    """Each raw value the backend's projection of the table names (``"t" AS "raw 2"``,
    rewriter/raw_equality.py), to its column."""
    return {target["name"]: _name(target["val"]["ColumnRef"]["fields"])
            for tree in trees for target in nodes_of(tree, "ResTarget")
            if _RAW.fullmatch(target.get("name") or "") and "ColumnRef" in target.get("val", {})}


_RAW = re.compile(r"_*raw \d+")


def _on_column(item: Canon, raw: dict[str, str]) -> Canon:
    """``item`` with each raw value of ``raw`` read as its column."""
    if isinstance(item, tuple) and len(item) == 2 and item[0] == "column" and item[1] in raw:
        return ("column", raw[item[1]])
    return tuple(_on_column(part, raw) for part in item) if isinstance(item, tuple) else item


def _without_raw_twins(item: Canon, raw: dict[str, str]) -> Canon:
    """``item`` (a backend condition) with each raw comparison beside its bounded twin,
    ``("raw 2" = 'x' AND "t" = 'x')`` (:func:`rewriter.raw_equality.raw_comparison`), read as the
    twin: the same comparison of the same column, which the rewriter keeps beside it. Where the
    bound is written in place, the raw read is the column itself, and the twins read alike: one is kept."""
    if not raw or not isinstance(item, tuple):
        return item
    item = tuple(_without_raw_twins(part, raw) for part in item)
    if item[:2] != ("bool", "AND_EXPR"):
        return item
    parts = item[2]
    kept = tuple(dict.fromkeys(part for part in parts if _on_column(part, raw) == part or _on_column(part, raw) not in parts))
    return kept[0] if len(kept) == 1 else ("bool", "AND_EXPR", kept)


def _equalities(conjunct: Canon) -> tuple[str, list[Canon]] | None:
    """The column and the values of ``conjunct`` where it is ``c = v`` or ``c = v1 OR c = v2 ...``
    (an IN list), else None."""
    items = conjunct[2] if conjunct[:2] == ("bool", "OR_EXPR") else (conjunct,)
    sides = [item[3:] if item[3][:1] == ("column",) else item[4:2:-1] for item in items
             if item[:3] == ("expr", "AEXPR_OP", "=") and ("column",) in (item[3][:1], item[4][:1])]
    columns = {column for column, _ in sides}
    if len(sides) != len(items) or len(columns) != 1:
        return None
    return str(columns.pop()[1]), [value for _, value in sides]


def _same_values(asked: Sequence[Canon], ran: Sequence[Canon], same: Same | None) -> bool:
    return all(any(alike(a, r, same) for r in ran) for a in asked) and all(any(alike(a, r, same) for a in asked) for r in ran)


def _raw_equality(conjunct: Canon, wanted: Sequence[Canon], raw: dict[str, str], same: Same | None) -> bool:
    """Whether ``conjunct`` (a backend WHERE's) is the raw equality the rewriter ANDs beside a
    statement's top-level ``c = v`` or ``c IN (...)`` of literals (``"raw N" = ANY (ARRAY[...])``,
    each value once or repeated) or of one parameter (``"raw N" = $k``), :mod:`rewriter.raw_equality`:
    its values are exactly that construct's (one left out would drop rows the statement keeps)."""
    if conjunct[:1] != ("expr",) or conjunct[2] != "=" or not all(isinstance(side, tuple) for side in conjunct[3:]):
        return False
    left, value = conjunct[3:] if conjunct[3][:1] == ("column",) else conjunct[4:2:-1]  # $k = "raw N"
    if left[:1] != ("column",) or left[1] not in raw:
        return False
    column = raw[left[1]]
    if conjunct[1] == "AEXPR_OP_ANY":
        array = value[2] if value[:1] == ("value",) else value
        if array[:1] != ("A_ArrayExpr",):
            return False
        values = list(dict(array[1])["elements"])
    elif conjunct[1] == "AEXPR_OP":
        values = [value]
    else:
        return False
    constructs = [found for item in wanted if (found := _equalities(item)) is not None and found[0] == column]
    return any(_same_values(asked, values, same) for _, asked in constructs)


def _cell_in_range(conjunct: Canon, table_columns: frozenset[str]) -> bool:
    """Whether ``conjunct`` is the cells' ``kN IS NOT NULL`` over a grouped key (a key's value
    outside its range is NULL, rewriter/group_keys.py): a test of the backend's own output, no column."""
    return (conjunct[:2] == ("bool", "NOT_EXPR") and len(conjunct[2]) == 1 and conjunct[2][0][:2] == ("null test", "IS_NULL")
            and conjunct[2][0][2][:1] == ("column",) and re.fullmatch(r"k\d+", conjunct[2][0][2][1]) is not None
            and conjunct[2][0][2][1] not in table_columns)


def _mode_label(conjunct: Canon, column: str | None) -> bool:
    """Whether ``conjunct`` is a MODE's count per category, ``column = 'label'`` (rewriter/rewrite.py)."""
    return (column is not None and conjunct[:3] == ("expr", "AEXPR_OP", "=") and conjunct[3] == ("column", column)
            and conjunct[4][:1] in (("string",), ("number",), ("boolean",), ("value",)))


def _filters(tree: dict[str, Any], raw: dict[str, str]) -> list[tuple[Canon, ...]]:
    """The top-level conjuncts of each aggregate FILTER of ``tree`` (the backend SQL)."""
    return [conjuncts(_without_raw_twins(canonical(call["agg_filter"]), raw))
            for call in nodes_of(tree, "FuncCall") if "agg_filter" in call]


def _chooses_alike(asked: Sequence[Canon], ran: Sequence[Canon], same: Same | None, mode: str | None) -> bool:
    """Whether the conjuncts ``ran`` choose the rows ``asked`` do: each of one alike one of the other,
    but for a MODE's label (``mode``: its column), ``col = 'label'``, which its count per category adds."""
    return (all(any(alike(a, r, same) for r in ran) for a in asked)
            and all(any(alike(a, r, same) for a in asked) or _mode_label(r, mode) for r in ran))


def divergences(statement: str, backends: Sequence[str], table_columns: frozenset[str],
                boolean_columns: frozenset[str] = frozenset(), same: Same | None = None) -> list[Divergence]:
    """What ``statement`` reads that ``backends``, the SQL dpproxy wrote for it (a series limit's
    ranking has a statement of its own), do not read alike.

    ``table_columns`` are the protected table's: the backend may read fewer of them than the
    statement names (a projection it does not need), never one the statement does not name. Each
    top-level conjunct of the statement's WHEREs (of every level) must be alike a top-level conjunct
    of the backend's WHEREs, and each of those alike one of the statement's or one the rewriter adds
    on purpose, each named: the cells' ``kN IS NOT NULL`` (:func:`_cell_in_range`) and a raw equality
    (:func:`_raw_equality`); a raw comparison beside its bounded twin is read as the twin. So a
    conjunct negated, put under an OR or added is reported. Each aggregate that counts some rows
    only must have a backend FILTER whose conjuncts are its conditions' (a MODE's label added). Of a
    column of ``boolean_columns``, ``IS UNKNOWN`` is read as ``IS NULL``, which it means. ``same``
    evaluates constant expressions (:class:`tests.constant_values.ConstantEvaluator`)."""
    asked, ran = tree_of(statement), [tree_of(backend) for backend in backends]
    extra = frozenset().union(*(read_columns(tree) for tree in ran)) & table_columns - read_columns(asked)
    found = [Divergence("column", name) for name in sorted(extra)]
    # a column whose bound is written in place is read raw as itself (rewriter/text_bounds.py read_table)
    names, raw = _aliases(asked), {**{name: name for name in table_columns}, **_raw_columns(ran)}
    unknown = {("boolean test", "IS_UNKNOWN", ("column", name)): ("null test", "IS_NULL", ("column", name))
               for name in boolean_columns}
    wanted = [part for where in _wheres(asked) for part in conjuncts(_renamed(canonical(where), names, unknown))]
    tops = [part for tree in ran for where in _wheres(tree) for part in conjuncts(_without_raw_twins(canonical(where), raw))]
    found += [Divergence("condition", repr(part)) for part in wanted if not any(alike(part, top, same) for top in tops)]
    found += [Divergence("backend condition", repr(top)) for top in tops
              if not any(alike(part, top, same) for part in wanted)
              and not _cell_in_range(top, table_columns) and not _raw_equality(top, wanted, raw, same)]
    filters = [conjuncts for tree in ran for conjuncts in _filters(tree, raw)]
    for name, column, chosen in _aggregate_conditions(asked, boolean_columns):
        rows = [part for node in chosen for part in conjuncts(_renamed(canonical(node), names, unknown))]
        if not any(_chooses_alike(rows, conjuncts, same, column if name == "mode" else None) for conjuncts in filters):
            found.append(Divergence("aggregate condition", f"{name}: {rows!r}"))
    return found
