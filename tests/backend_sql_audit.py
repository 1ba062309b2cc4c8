"""An independent check of the backend SQL dpproxy writes: every expression the backend
evaluates on a row of the protected table must be *total*, unable to raise on any value of
its column's type (docs/threat-model.md, error oracles).

The rewriter keeps its predicates, keys and aggregates total by allowlists of its own
(:mod:`rewriter.predicates`, :mod:`rewriter.group_keys`, :mod:`rewriter.rewrite` ...). This
module checks what comes out instead of how it was made: it parses the backend SQL with
pglast (PostgreSQL's own parser), finds every expression evaluated per row of the protected
relation, and accepts a node only when :data:`TOTAL` lists it for its operands' types. Each
entry states why the node cannot raise. Anything else is a :class:`Finding`.

Per row means: the WHERE and GROUP BY of a SELECT reading the protected table (or a
projection of it, as sample and aggregate's ``filtered`` subquery), the whole target list of
such a projection, and in an aggregating SELECT the aggregates' arguments, FILTERs and
ORDER BY, and every target or HAVING expression that reads a column outside an aggregate (a
grouped key's value is a row's value). Expressions over aggregate results only (the casts of
a partition's value) are per group of rows and out of scope here.

The audit is conservative: facts it tracks (a float's range after a clamp, NaN excluded in a
CASE branch that tested for it, a date bounded by constants in the THEN of its range test)
only ever make it accept more when a reason on the table says why. It reads the SQL and the
column types, not the parameters' types: a ``$n`` is taken as coerced to its column's type,
which holds because a DP statement's parameters are unspecified or of a closed list of built-in
scalar types (``proxy.dp.parameter_types``) and the rewriter casts one beside a numeric column
(``rewriter.predicates._compatible``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping

from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind, BoolExprType
from pglast.stream import RawStream

__all__ = ["AuditColumn", "Finding", "TOTAL", "audit_backend_sql"]


@dataclass(frozen=True)
class AuditColumn:
    """What the audit needs of a column: its type OID (a domain's base type), whether that is an
    enum, an array or composite (``ColumnInfo.container``), and whether its collation is
    deterministic."""

    type_oid: int
    container: bool = False
    deterministic_collation: bool = True
    enum: bool = False


@dataclass(frozen=True)
class Finding:
    """A per-row node the table of total operations does not list."""

    node: str
    reason: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.node}"


# Why each accepted node cannot raise on a row. The checks below cite these keys; a test pins
# that every key is cited and every citation is a key.
TOTAL: dict[str, str] = {
    "column": "reading a column's value never fails; NULL is a value like any other",
    "constant": "a literal, parameter or cast of one is evaluated while planning, on no row: "
                "its error would be the same on every table (and is raised before the charge)",
    "bool": "AND, OR, NOT, IS [NOT] NULL and TRUE/FALSE/NULL tests only combine booleans",
    "case": "CASE evaluates only the branch a row selects; each branch is checked on its own",
    "coalesce": "COALESCE returns its first non-NULL argument; it converts nothing",
    "compare-own-type": "a built-in scalar type's comparison with a constant of its own type (an untyped "
                        "literal or parameter is coerced to it while planning) compares, never converts",
    "compare-integers": "int2/int4/int8 compare across widths with cross-type operators that convert nothing",
    "compare-integer-numeric": "an integer converted to numeric (or to a float) is exact or rounded, never out of range",
    "compare-float": "a real compared with a double precision is widened exactly; a number literal beside a "
                     "float column is converted once, while planning",
    "compare-datetime": "date, timestamp and timestamptz compare across types without error since PostgreSQL 13 "
                        "(the conversion saturates at ±infinity; tests/test_backend_sql_audit.py asks the backend)",
    "compare-text": "text, varchar and char compare as text (char's trailing spaces dropped), converting nothing that can fail",
    "compare-enum": "an enum compares by its labels' sort order; every stored value is a label",
    "collate": "COLLATE \"C\" on a text value changes how it compares, not the value",
    "constant-shift": "a date or time literal of a year up to 10000 plus an interval literal of at most 10^12 "
                      "seconds or one calendar unit stays below the year 42000, inside every date/time type's "
                      "range: it cannot raise, though PostgreSQL evaluates timestamptz + interval (STABLE) per row",
    "time-cast": "a date or time bounded by constants of the years 1..200000 converts to date, timestamp or "
                 "timestamptz (all of them hold those years, in every time zone)",
    "like": "LIKE/ILIKE on a text column with a deterministic collation and a pattern dpproxy validated "
            "(no trailing escape; a parameter is checked at Bind) matches or not, it cannot raise",
    "case-fold": "lower()/upper() of text, varchar or char returns text of the same characters' cases",
    "abs": "abs() of a double precision or numeric cannot overflow",
    "clamp": "int2/int4/int8/float8/numeric larger()/smaller() compare and pick one argument "
             "(NaN sorts above every number)",
    "widen": "int2/int4/int8/real to double precision, integer to numeric, boolean to integer: every value converts",
    "float-to-bigint": "a double precision known to lie inside bigint's range, never NaN, rounds to a bigint",
    "float-multiply": "a double precision known finite-bounded times a constant whose product stays finite, "
                      "and nonzero magnitudes large enough that no product underflows to 0",
    "hash": "the extended hash functions of these types return a value for every value of the type "
            "(NaN, ±Infinity, -0 included) and NULL for NULL",
    "bit-ops": "# and & on bigints, and % by a positive constant, cannot overflow",
    "random": "random() and floor() of its bounded product take no row value",
    "fence": "pg_is_in_recovery() reads no row",
    "width-bucket": "width_bucket() of a value that cannot be NaN, with finite constant bounds and a small "
                    "positive count, returns a bucket number (±Infinity fall outside)",
    "date-trunc": "date_trunc() of a declared unit on a date or time bounded by constants of the years "
                  "1..200000 (in the THEN of its range test) neither overflows nor leaves the type's range",
    "to-char": "to_char() of such a bounded time with a constant format prints it",
    "extract-epoch": "EXTRACT(EPOCH) of such a bounded time is a numeric; numeric division by a constant "
                     "≥ 1 in magnitude and floor() of a numeric cannot fail",
    "aggregate": "count/sum/min/max over per-row values already checked: count counts, sum of integers "
                 "or numerics accumulates in numeric (int2/int4 in bigint: 2^32 rows to overflow), "
                 "min/max compare values of one built-in type",
}

_INTEGERS = {21: "int2", 23: "int4", 20: "int8"}
_FLOATS = {700: "float4", 701: "float8"}
_NUMERIC = 1700
_TEXT_TYPES = {25, 1043, 1042}
_TIME_TYPES = {1082: "date", 1114: "timestamp", 1184: "timestamptz"}
_FIRST_USER_OID = 16384  # FirstNormalObjectId: lower OIDs are built into PostgreSQL
_BOOL, _INT4, _INT8, _FLOAT8, _TEXT = 16, 23, 20, 701, 25
_TYPE_NAMES: dict[str, int] = {
    "int2": 21, "smallint": 21, "int4": 23, "integer": 23, "int": 23, "int8": 20, "bigint": 20,
    "float4": 700, "real": 700, "float8": 701, "double precision": 701, "numeric": 1700, "text": 25,
    "varchar": 1043, "bpchar": 1042, "bool": 16, "boolean": 16, "date": 1082, "timestamp": 1114,
    "timestamptz": 1184, "bytea": 17, "uuid": 2950, "time": 1083, "interval": 1186,
}
_UNKNOWN = 705  # an untyped literal or parameter: coerced to the other side's type
_NULL = -1
_OPAQUE = -2  # an aggregate's result where a per-row value is expected
_MIN_SUBNORMAL = 5e-324
_HASHES = {
    "hashint2extended": {21}, "hashint4extended": {23}, "hashint8extended": {20},
    "hashfloat4extended": {700}, "hashfloat8extended": {701}, "hash_numeric_extended": {1700},
    "hashtextextended": {25, 1043}, "hashbpcharextended": {1042}, "timestamp_hash_extended": {1114},
    "uuid_hash_extended": {2950},
}
_CLAMPS = {
    "int2larger": 21, "int2smaller": 21, "int4larger": 23, "int4smaller": 23, "int8larger": 20,
    "int8smaller": 20, "float8larger": 701, "float8smaller": 701, "numeric_larger": 1700, "numeric_smaller": 1700,
}
_DATE_UNITS = {"year", "quarter", "month", "week", "day", "hour", "minute", "second"}
_AGGREGATES = {"count", "sum", "min", "max"}
_COMPARISONS = {"=", "<>", "<", "<=", ">", ">="}
_LIKES = {"~~", "~~*", "!~~", "!~~*"}
_YEAR = re.compile(r"^\s*(\d{1,7})-")


@dataclass(frozen=True)
class _Value:
    """What the audit knows of a checked expression's value."""

    type_oid: int
    constant: bool = False
    text: str | None = None  # a constant's text, when it is a literal
    nan: bool = True  # may be NaN (float and numeric types only)
    low: float = -math.inf  # bounds of a float's value, NaN aside
    high: float = math.inf
    smallest: float = _MIN_SUBNORMAL  # the smallest magnitude a nonzero value can have
    bounded: bool = False  # a date/time inside constants of safe years
    column: AuditColumn | None = None


@dataclass
class _Context:
    """The relation's columns by name, and facts that hold in the CASE branch being checked."""

    columns: Mapping[str, _Value]
    facts: dict[str, _Value] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


def audit_backend_sql(sql: str, table: tuple[str, str], columns: Mapping[str, AuditColumn]) -> list[Finding]:
    """The per-row nodes of ``sql`` that :data:`TOTAL` does not list.

    ``table`` is the protected relation as (schema, name), ``columns`` its columns by name.
    A statement that does not parse, or reads the table in a shape this audit does not know
    (a join, a set operation), is itself a finding.
    """
    try:
        statements = parse_sql(sql)
    except Exception as exc:  # pglast raises its own ParseError; anything else is as bad
        return [Finding(sql[:200], f"does not parse: {exc}")]
    values = {name: _column_value(column) for name, column in columns.items()}
    findings: list[Finding] = []
    for raw in statements:
        if isinstance(raw.stmt, ast.SelectStmt):
            _select(raw.stmt, table, values, findings)
        else:
            findings.append(Finding(_sql(raw.stmt), "not a SELECT"))
    return findings


def _column_value(column: AuditColumn) -> _Value:
    nan = column.type_oid in _FLOATS or column.type_oid == _NUMERIC
    return _Value(column.type_oid, nan=nan, column=column)


def _select(node: ast.SelectStmt, table: tuple[str, str], columns: Mapping[str, _Value],
            findings: list[Finding]) -> Mapping[str, _Value] | None:
    """Check one SELECT; return its output columns' values when it is a per-row projection
    of the protected table (so a SELECT over it reads rows too), else None."""
    if node.op is not None and node.op.name != "SETOP_NONE":
        for side in (node.larg, node.rarg):
            if side is not None and _reads(side, table):
                findings.append(Finding(_sql(node), "a set operation over the protected table"))
        return None
    sources = list(node.fromClause or ())
    rows: Mapping[str, _Value] | None = None
    for source in sources:
        if isinstance(source, ast.RangeVar) and (source.schemaname, source.relname) == table:
            rows = columns
        elif isinstance(source, ast.RangeSubselect):
            projected = _select(source.subquery, table, columns, findings)
            if projected is not None:
                rows = projected
        elif _reads(source, table):
            findings.append(Finding(_sql(source), "the protected table read through a join"))
    if rows is None:
        return None
    if len(sources) != 1:
        findings.append(Finding(_sql(node), "the protected table read beside another relation"))
        return None
    context = _Context(rows)
    if node.whereClause is not None:
        _check(node.whereClause, context)
    for item in node.groupClause or ():
        _check(item, context)
    aggregating = bool(node.groupClause) or any(_has_aggregate(t.val) for t in node.targetList or ())
    outputs: dict[str, _Value] = {}
    for target in node.targetList or ():
        if aggregating and not _reads_column_outside_aggregates(target.val):
            for aggregate in _aggregates(target.val):
                _check(aggregate, context)
        else:
            value = _check(target.val, context)
            name = target.name or _output_name(target.val)
            if name is not None:
                outputs[name] = value
    if node.havingClause is not None:
        for aggregate in _aggregates(node.havingClause):
            _check(aggregate, context)
    findings.extend(context.findings)
    return None if aggregating else outputs


def _check(node: ast.Node, context: _Context) -> _Value:
    """Check ``node`` evaluated per row; return what is known of its value."""
    fact = context.facts.get(_sql(node)) if context.facts else None  # deparsing is most of the audit's time
    value = _checked(node, context)
    if fact is not None:
        value = replace(value, nan=value.nan and fact.nan, low=max(value.low, fact.low), high=min(value.high, fact.high),
                        smallest=max(value.smallest, fact.smallest), bounded=value.bounded or fact.bounded)
    return value


def _finding(node: ast.Node, context: _Context, reason: str) -> _Value:
    context.findings.append(Finding(_sql(node), reason))
    return _Value(_OPAQUE)


def _checked(node: ast.Node, context: _Context) -> _Value:
    if isinstance(node, ast.ColumnRef):
        return _column(node, context)  # "column"
    if isinstance(node, (ast.A_Const, ast.ParamRef)):
        return _constant(node)  # "constant"
    if isinstance(node, ast.TypeCast):
        return _cast(node, context)
    if isinstance(node, ast.BoolExpr):
        for arg in node.args:
            _check(arg, context)
        return _Value(_BOOL)  # "bool"
    if isinstance(node, (ast.NullTest, ast.BooleanTest)):
        _check(node.arg, context)
        return _Value(_BOOL)  # "bool"
    if isinstance(node, ast.CaseExpr):
        return _case(node, context)  # "case"
    if isinstance(node, ast.CoalesceExpr):
        values = [_check(arg, context) for arg in node.args]
        return replace(values[0], constant=False, text=None)  # "coalesce"
    if isinstance(node, ast.CollateClause):
        value = _check(node.arg, context)
        if value.type_oid in _TEXT_TYPES:
            return value  # "collate"
        return _finding(node, context, "COLLATE on a value that is not text")
    if isinstance(node, ast.A_Expr):
        return _operator(node, context)
    if isinstance(node, ast.FuncCall):
        return _function(node, context)
    return _finding(node, context, f"{type(node).__name__} is not on the table of total operations")


def _column(node: ast.ColumnRef, context: _Context) -> _Value:
    names = [f.sval for f in node.fields if isinstance(f, ast.String)]
    if len(names) == 1 and names[0] in context.columns:
        return context.columns[names[0]]
    if names == ["ctid"]:
        return _Value(27)  # tid
    return _finding(node, context, "a column the audit cannot resolve")


def _constant(node: ast.Node) -> _Value:
    if isinstance(node, ast.ParamRef):
        return _Value(_UNKNOWN, constant=True)
    assert isinstance(node, ast.A_Const)
    if node.isnull:
        return _Value(_NULL, constant=True)
    value = node.val
    if isinstance(value, ast.Integer):
        return _Value(_INT4, constant=True, text=str(value.ival))
    if isinstance(value, ast.Float):
        return _Value(_NUMERIC, constant=True, text=value.fval)
    if isinstance(value, ast.Boolean):
        return _Value(_BOOL, constant=True)
    return _Value(_UNKNOWN, constant=True, text=value.sval if isinstance(value, ast.String) else None)


def _type_oid(type_name: ast.TypeName) -> int | None:
    names = [n.sval for n in type_name.names if isinstance(n, ast.String)]
    if len(names) == 2 and names[0] == "pg_catalog" or len(names) == 1:
        return _TYPE_NAMES.get(names[-1])
    return None


def _cast(node: ast.TypeCast, context: _Context) -> _Value:
    target = _type_oid(node.typeName)
    if target is None:
        return _finding(node, context, "a cast to a type the audit does not know")
    argument, sign = node.arg, ""
    while isinstance(argument, ast.A_Expr) and argument.kind == A_Expr_Kind.AEXPR_OP and argument.lexpr is None \
            and _operator_name(argument) == "-":
        argument, sign = argument.rexpr, "-" if not sign else ""  # a signed constant
    if isinstance(argument, (ast.A_Const, ast.ParamRef)):
        text = _constant(argument).text
        text = sign + text if text is not None else None
        number = _number(text) if target in _FLOATS else None
        if number is not None and not math.isnan(number):
            return _Value(target, constant=True, text=text, nan=False, low=number, high=number)
        return _Value(target, constant=True, text=text)
    value = _check(node.arg, context)
    if value.type_oid == target:
        return value
    if target == _FLOAT8 and (value.type_oid in _INTEGERS or value.type_oid in _FLOATS):
        return replace(value, type_oid=_FLOAT8, nan=value.nan and value.type_oid in _FLOATS)  # "widen"
    if target == _NUMERIC and value.type_oid in _INTEGERS:
        return _Value(_NUMERIC, nan=False)  # "widen"
    if target == _INT4 and value.type_oid == _BOOL:
        return _Value(_INT4)  # "widen"
    if target in _TIME_TYPES and value.type_oid in _TIME_TYPES and value.bounded:
        return _Value(target, bounded=True)  # "time-cast"
    if target == _INT8 and value.type_oid == _FLOAT8 and not value.nan and -2.0**63 < value.low and value.high < 2.0**63:
        return _Value(_INT8)  # "float-to-bigint"
    return _finding(node, context, f"a per-row cast from type {value.type_oid} to {target} that may fail")


def _case(node: ast.CaseExpr, context: _Context) -> _Value:
    if node.arg is not None:
        return _finding(node, context, "CASE x WHEN ... (the audit reads only searched CASE)")
    results: list[_Value] = []
    saved = dict(context.facts)
    for when in node.args:
        _check(when.expr, context)
        context.facts.update(_facts_if_true(when.expr, context))
        results.append(_check(when.result, context))
        context.facts = dict(saved)
        context.facts.update(_facts_if_false_all(node.args[: node.args.index(when) + 1], context))
    if node.defresult is not None:
        results.append(_check(node.defresult, context))
    context.facts = saved
    typed = [r for r in results if r.type_oid != _NULL]
    if not typed:
        return _Value(_NULL)
    first = typed[0]
    return replace(first, constant=False, text=None, nan=any(r.nan for r in typed),
                   low=min(r.low for r in typed), high=max(r.high for r in typed),
                   smallest=min(r.smallest for r in typed), bounded=all(r.bounded for r in typed))


def _facts_if_true(condition: ast.Node, context: _Context) -> dict[str, _Value]:
    """What holds in a THEN: a date/time column between constants of safe years."""
    terms = condition.args if isinstance(condition, ast.BoolExpr) and condition.boolop == BoolExprType.AND_EXPR else [condition]
    lower: dict[str, bool] = {}
    upper: dict[str, bool] = {}
    for term in terms:
        if not (isinstance(term, ast.A_Expr) and term.kind == A_Expr_Kind.AEXPR_OP and isinstance(term.lexpr, ast.ColumnRef)
                and isinstance(term.rexpr, (ast.TypeCast, ast.A_Expr))):
            continue
        symbol = _operator_name(term)
        bound = term.rexpr
        if isinstance(bound, ast.A_Expr):  # a shift: the literal it starts from, checked by _shift
            bound = bound.lexpr if _operator_name(bound) == "+" else None
        year = _year(_constant_text(bound))
        if year is None or not 1 <= year <= 200000:
            continue
        key = _sql(term.lexpr)
        if symbol in (">=", ">"):
            lower[key] = True
        elif symbol in ("<", "<="):
            upper[key] = True
    return {key: _Value(0, bounded=True) for key in lower if key in upper}


def _facts_if_false_all(whens: Iterable[ast.CaseWhen], context: _Context) -> dict[str, _Value]:
    """What holds past WHENs that did not hold: ``x = 'NaN'`` false leaves x not NaN, and
    ``abs(x) < c`` false leaves x of magnitude ≥ c (or NaN)."""
    facts: dict[str, _Value] = {}
    for when in whens:
        condition = when.expr
        if not (isinstance(condition, ast.A_Expr) and condition.kind == A_Expr_Kind.AEXPR_OP):
            continue
        symbol = _operator_name(condition)
        if symbol == "=" and _constant_text(condition.rexpr) == "NaN":
            facts[_sql(condition.lexpr)] = _Value(0, nan=False)
        if (symbol == "<" and isinstance(condition.lexpr, ast.FuncCall) and _function_name(condition.lexpr) == "abs"):
            bound = _number(_constant_text(condition.rexpr))
            if bound is not None and bound > 0:
                facts[_sql(condition.lexpr.args[0])] = _Value(0, smallest=bound)
    return facts


def _operator(node: ast.A_Expr, context: _Context) -> _Value:
    if node.kind != A_Expr_Kind.AEXPR_OP:
        return _finding(node, context, f"{node.kind.name} is not on the table of total operations")
    symbol = _operator_name(node)
    if node.lexpr is None:
        if symbol == "-" and isinstance(node.rexpr, ast.A_Const):
            return _constant(node.rexpr)
        return _finding(node, context, f"prefix operator {symbol}")
    left, right = _check(node.lexpr, context), _check(node.rexpr, context)
    if symbol == "+" and left.constant and right.constant:
        return _shift(node, left, right, context)
    if symbol in _COMPARISONS:
        return _comparison(node, left, right, context)
    if symbol in _LIKES:
        return _like(node, left, right, context)
    if symbol in ("#", "&") and left.type_oid == right.type_oid == _INT8 or (
            symbol == "&" and left.type_oid == _INT8 and right.constant):
        return _Value(_INT8)  # "bit-ops"
    if symbol == "%" and left.type_oid == _INT8 and right.constant and (_number(right.text) or 0) > 0:
        return _Value(_INT8)  # "bit-ops"
    if symbol == "*" and left.type_oid == _FLOAT8 and right.constant and right.type_oid == _FLOAT8:
        return _float_product(node, left, right, context)
    if symbol == "*" and _is_random(node.lexpr) and right.constant:
        return _Value(_FLOAT8, nan=False)  # "random"
    if symbol == "/" and left.type_oid == _NUMERIC and right.constant and abs(_number(right.text) or 0) >= 1:
        return _Value(_NUMERIC, nan=left.nan)  # "extract-epoch"
    return _finding(node, context, f"operator {symbol} on types {left.type_oid}, {right.type_oid}")


def _shift(node: ast.A_Expr, left: _Value, right: _Value, context: _Context) -> _Value:
    year, years = _year(left.text), _interval_years(right.text)
    if left.type_oid in _TIME_TYPES and right.type_oid == 1186 and year is not None and years is not None \
            and year + years < 42000:
        return _Value(1114 if left.type_oid == 1082 else left.type_oid, constant=True,
                      text=f"{year + math.ceil(years)}-")  # "constant-shift"
    return _finding(node, context, "a constant expression that may overflow, evaluated per row when STABLE")


def _interval_years(text: str | None) -> float | None:
    """The length of a one-unit interval literal, or of one of whole seconds, in years (at most)."""
    match = re.fullmatch(r"(\d{1,13}) (seconds|days?|months?|years?)", text or "")
    if match is None:
        return None
    count, unit = int(match.group(1)), match.group(2)
    if unit == "seconds":
        return count / 31_556_952 if count <= 10**12 else None
    return count / {"d": 365, "m": 12, "y": 1}[unit[0]] if count <= 12 else None


def _comparison(node: ast.A_Expr, left: _Value, right: _Value, context: _Context) -> _Value:
    """A comparison with a per-row value on at least one side: total for the type pairs below.
    A constant's type is what PostgreSQL makes of it: an untyped one is coerced to the other side's."""
    if left.constant and right.constant:
        return _finding(node, context, "a comparison of constants only")
    if any(side.column is not None and side.column.container for side in (left, right)):
        return _finding(node, context, "a comparison of an array or composite column")
    if left.constant or right.constant:
        row, other = (left, right) if right.constant else (right, left)
        if other.type_oid in (_UNKNOWN, _NULL):
            other = row
    else:
        row, other = left, right
    pair = {row.type_oid, other.type_oid}
    if len(pair) == 1 and 0 < row.type_oid < _FIRST_USER_OID:
        return _Value(_BOOL)  # "compare-own-type"
    if len(pair) == 1 and row.column is not None and row.column.enum:
        return _Value(_BOOL)  # "compare-enum"
    if pair <= set(_INTEGERS):
        return _Value(_BOOL)  # "compare-integers"
    if pair <= {*_INTEGERS, _NUMERIC}:
        return _Value(_BOOL)  # "compare-integer-numeric"
    numeric_rows = any(side.type_oid == _NUMERIC and not side.constant for side in (left, right))
    if pair & set(_FLOATS) and pair <= {*_INTEGERS, *_FLOATS, _NUMERIC} and not numeric_rows:
        return _Value(_BOOL)  # "compare-float" (a numeric beside a float only as a constant, converted once)
    if pair <= _TEXT_TYPES:
        return _Value(_BOOL)  # "compare-text"
    if pair <= set(_TIME_TYPES):
        return _Value(_BOOL)  # "compare-datetime"
    return _finding(node, context, f"a comparison of types {row.type_oid} and {other.type_oid}")


def _like(node: ast.A_Expr, left: _Value, right: _Value, context: _Context) -> _Value:
    if left.type_oid not in _TEXT_TYPES or left.constant:
        return _finding(node, context, "LIKE on a value that is not text")
    if left.column is not None and not left.column.deterministic_collation:
        return _finding(node, context, "LIKE on a nondeterministic collation")
    pattern = node.rexpr
    if isinstance(pattern, ast.TypeCast) and isinstance(pattern.arg, ast.ParamRef):
        return _Value(_BOOL)  # "like": a bound pattern is checked at Bind
    if not (isinstance(pattern, ast.A_Const) and isinstance(pattern.val, ast.String)):
        return _finding(node, context, "LIKE with a pattern that is not a literal or a parameter")
    trailing = len(pattern.val.sval) - len(pattern.val.sval.rstrip("\\"))
    if trailing % 2:
        return _finding(node, context, "LIKE pattern ending in an escape, which PostgreSQL rejects on a row it reaches")
    return _Value(_BOOL)  # "like"


def _float_product(node: ast.A_Expr, left: _Value, right: _Value, context: _Context) -> _Value:
    factor = right.low
    if math.isinf(factor) or factor == 0:
        return _finding(node, context, "a product with an infinite or zero factor")
    low, high = sorted((left.low * factor, left.high * factor))
    if math.isinf(low) or math.isinf(high):
        return _finding(node, context, "a product of a value not bounded to a finite range")
    if left.smallest * abs(factor) < _MIN_SUBNORMAL:
        return _finding(node, context, "a product that can underflow to 0 from a nonzero value")
    return _Value(_FLOAT8, nan=left.nan, low=low, high=high, smallest=left.smallest * abs(factor))  # "float-multiply"


def _function(node: ast.FuncCall, context: _Context) -> _Value:
    name = _function_name(node)
    if name is None:
        return _finding(node, context, "a function outside pg_catalog")
    if node.over is not None or node.agg_within_group:
        return _finding(node, context, f"{name}() as a window or ordered-set aggregate")
    args = [_check(arg, context) for arg in node.args or ()]
    if name in _AGGREGATES:
        if node.agg_filter is not None:
            _check(node.agg_filter, context)
        for item in node.agg_order or ():
            _check(item.node, context)
        return _aggregate(node, name, args, context)
    if node.agg_filter is not None or node.agg_distinct or node.agg_star:
        return _finding(node, context, f"{name}() used as an aggregate")
    if name in _HASHES and len(args) == 2 and args[0].type_oid in _HASHES[name] and args[1].constant:
        return _Value(_INT8)  # "hash"
    if name == "hashtidextended" and len(args) == 2 and args[0].type_oid == 27 and args[1].constant:
        return _Value(_INT8)  # "hash"
    if name in _CLAMPS and len(args) == 2 and args[0].type_oid == args[1].type_oid == _CLAMPS[name] and args[1].constant:
        return _clamp(name, args[0], args[1])
    if name in ("lower", "upper") and len(args) == 1 and args[0].type_oid in _TEXT_TYPES:
        return _Value(_TEXT)  # "case-fold"
    if name == "abs" and len(args) == 1 and args[0].type_oid in (_FLOAT8, _NUMERIC):
        return replace(args[0], low=0.0, high=max(abs(args[0].low), abs(args[0].high)))  # "abs"
    if name == "random" and not args:
        return _Value(_FLOAT8, nan=False, low=0.0, high=1.0)  # "random"
    if name == "floor" and len(args) == 1 and args[0].type_oid in (_FLOAT8, _NUMERIC):
        return replace(args[0], constant=False)  # "extract-epoch", and "random"'s floor
    if name == "pg_is_in_recovery" and not args:
        return _Value(_BOOL)  # "fence"
    if name == "width_bucket":
        return _width_bucket(node, args, context)
    if name == "date_trunc" and len(args) == 2 and args[0].constant and args[0].text in _DATE_UNITS \
            and args[1].type_oid in _TIME_TYPES and args[1].bounded:
        return _Value(1184 if args[1].type_oid == 1082 else args[1].type_oid, bounded=True)  # "date-trunc"
    if name == "to_char" and len(args) == 2 and args[0].type_oid in _TIME_TYPES and args[0].bounded and args[1].constant:
        return _Value(_TEXT)  # "to-char"
    if name == "extract" and len(args) == 2 and args[0].text == "epoch" and args[1].type_oid in _TIME_TYPES \
            and args[1].bounded:
        return _Value(_NUMERIC, nan=False)  # "extract-epoch"
    types = ", ".join(str(a.type_oid) for a in args)
    return _finding(node, context, f"function {name}({types}) is not on the table of total operations")


def _aggregate(node: ast.FuncCall, name: str, args: list[_Value], context: _Context) -> _Value:
    if name == "count":
        return _Value(_INT8)  # "aggregate"
    if len(args) != 1:
        return _finding(node, context, f"{name}() of {len(args)} arguments")
    value = args[0]
    if name == "sum" and (value.type_oid in _INTEGERS or value.type_oid == _NUMERIC):
        return _Value(_OPAQUE)  # "aggregate"
    if name in ("min", "max") and 0 < value.type_oid < _FIRST_USER_OID and not (value.column and value.column.container):
        return _Value(_OPAQUE)  # "aggregate"
    return _finding(node, context, f"{name}() of type {value.type_oid}, which may overflow or fail to compare")


def _clamp(name: str, value: _Value, bound: _Value) -> _Value:
    if value.type_oid != _FLOAT8:
        return replace(value, constant=False, column=None)  # "clamp"
    if name.endswith("larger"):  # NaN stays NaN (it sorts above every number)
        return replace(value, low=max(value.low, bound.low), high=max(value.high, bound.low), column=None)
    return replace(value, nan=False, low=min(value.low, bound.high), high=min(value.high, bound.high), column=None)


def _width_bucket(node: ast.FuncCall, args: list[_Value], context: _Context) -> _Value:
    if len(args) != 4 or args[0].constant or not all(a.constant for a in args[1:]):
        return _finding(node, context, "width_bucket() of other than a value, two constant bounds and a count")
    if args[0].nan or args[0].type_oid not in (_FLOAT8, _NUMERIC):
        return _finding(node, context, "width_bucket() of a value that may be NaN")
    bounds = [_number(a.text) for a in args[1:3]]
    count = _number(args[3].text)
    if any(b is None or not math.isfinite(b) for b in bounds) or count is None or not 0 < count < 2**30:
        return _finding(node, context, "width_bucket() with bounds that are not finite or a count out of range")
    return _Value(_INT4)  # "width-bucket"


def _operator_name(node: ast.A_Expr) -> str:
    return node.name[-1].sval


def _function_name(node: ast.FuncCall) -> str | None:
    names = [n.sval for n in node.funcname]
    if len(names) == 2 and names[0] == "pg_catalog":
        return names[1]
    return None


def _constant_text(node: ast.Node | None) -> str | None:
    while isinstance(node, ast.TypeCast):
        node = node.arg
    if isinstance(node, ast.A_Const) and not node.isnull:
        value = node.val
        if isinstance(value, ast.String):
            return value.sval
        if isinstance(value, ast.Float):
            return value.fval
        if isinstance(value, ast.Integer):
            return str(value.ival)
    return None


def _number(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _year(text: str | None) -> int | None:
    match = _YEAR.match(text or "")
    if match is None or "BC" in (text or "").upper():
        return None
    return int(match.group(1))


def _is_random(node: ast.Node) -> bool:
    return isinstance(node, ast.FuncCall) and _function_name(node) == "random" and not node.args


def _is_aggregate(node: ast.Node) -> bool:
    return isinstance(node, ast.FuncCall) and (
        _function_name(node) in _AGGREGATES or node.agg_star or node.agg_filter is not None or node.agg_distinct
        or node.agg_within_group or _function_name(node) == "string_agg")


def _walk(node: object, inside: Callable[[ast.Node], bool]) -> Iterable[ast.Node]:
    """The nodes under ``node``, not descending below those ``inside`` stops at (yielded)."""
    if isinstance(node, ast.Node):
        yield node
        if inside(node):
            return
        for name in node:
            yield from _walk(getattr(node, name), inside)
    elif isinstance(node, (tuple, list)):
        for item in node:
            yield from _walk(item, inside)


def _has_aggregate(node: ast.Node) -> bool:
    return any(_is_aggregate(n) for n in _walk(node, _is_aggregate))


def _aggregates(node: ast.Node) -> list[ast.Node]:
    return [n for n in _walk(node, _is_aggregate) if _is_aggregate(n)]


def _reads_column_outside_aggregates(node: ast.Node) -> bool:
    return any(isinstance(n, ast.ColumnRef) for n in _walk(node, _is_aggregate))


def _reads(node: ast.Node, table: tuple[str, str]) -> bool:
    return any(isinstance(n, ast.RangeVar) and (n.schemaname, n.relname) == table for n in _walk(node, lambda _: False))


def _output_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.ColumnRef) and isinstance(node.fields[-1], ast.String):
        return str(node.fields[-1].sval)
    return None


def _sql(node: ast.Node) -> str:
    try:
        return str(RawStream()(node))
    except Exception:
        return repr(node)[:300]
