"""An independent check of the backend SQL dpproxy writes: every expression the backend
evaluates on a row of the protected table, or on a group of its rows, must be *total*, unable
to raise on any value of its operands' types (docs/threat-model.md, error oracles).

The rewriter keeps its predicates, keys and aggregates total by allowlists of its own
(:mod:`rewriter.predicates`, :mod:`rewriter.group_keys`, :mod:`rewriter.rewrite` ...). This
module checks what comes out instead of how it was made: it parses the backend SQL with
pglast (PostgreSQL's own parser), finds every expression evaluated per row of the protected
relation or per group of its rows, and accepts a node only when :data:`TOTAL` lists it for its operands' types. Each
entry states why the node cannot raise. Anything else is a :class:`Finding`.

Per row means: the WHERE and GROUP BY of a SELECT reading the protected table (or a
projection of it, as sample and aggregate's ``filtered`` subquery), the whole target list of
such a projection, and in an aggregating SELECT the aggregates' arguments, FILTERs and
ORDER BY. Per group means everything else such a SELECT evaluates: its targets and HAVING over
aggregate results (a partition's mean, its value cast to double precision, a histogram
cell's key of the grouped value), its ORDER BY, LIMIT and OFFSET, and every expression of the
SELECTs above it (the partitions' ``encode(string_agg(float8send(p)))``, the cells' ``k IS NOT
NULL``). An error there is decided by the rows as much as one on a row, so both are checked
alike: an aggregate is a node whose result is known per group (a count's range, a clamped
sum's bounds, NULL where no row has a value) and an expression over it is accepted only with
a reason on the table.

The audit is conservative: facts it tracks (a value's range after a clamp and through a sum,
NaN excluded in a CASE branch that tested for it, a date bounded by constants in the THEN of
its range test, the least nonzero magnitude past an ``abs(x) < c`` test, what makes a value
NULL, how many groups a GROUP BY on bounded integer keys makes) only ever make it accept more
when a reason on the table says why. It reads the SQL and the
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
    """A node evaluated per row or per group that the table of total operations does not list."""

    node: str
    reason: str

    def __str__(self) -> str:
        return f"{self.reason}: {self.node}"


# Why each accepted node cannot raise on a row or a group. The checks below cite these keys; a test pins
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
    "any-equality": "x = ANY (ARRAY[c1, …]) of constants is x = c1 OR …: each equality as one of the comparisons "
                    "here (hashed or not, it compares with the same operator)",
    "collate": "COLLATE \"C\" on a text value changes how it compares, not the value",
    "constant-shift": "a date or time literal of a year up to 10000 plus an interval literal of at most 10^12 "
                      "seconds or one calendar unit stays below the year 42000, inside every date/time type's "
                      "range: it cannot raise, though PostgreSQL evaluates timestamptz + interval (STABLE) per row",
    "time-cast": "a date or time bounded by constants of the years 1..200000 converts to date, timestamp or "
                 "timestamptz (all of them hold those years, in every time zone)",
    "like": "LIKE/ILIKE on a text column with a deterministic collation and a pattern dpproxy validated "
            "(ILIKE lowers the value first: of at most 64 MiB)"
            "(no trailing escape, at most 64 characters after each %; a parameter is checked at Bind) matches or not, it cannot raise",
    "case-fold": "lower()/upper() of text, varchar or char of at most 64 MiB returns text of the same characters' "
                 "cases, at most three times as long (longer, they ask for more than 1 GB: four bytes a character "
                 "where LC_CTYPE is not C)",
    "octet-length": "octet_length() of text or bytea reads its stored size (0 to 1 GB), detoasting nothing",
    "short-text": "CASE WHEN octet_length(x) <= c THEN x END is x of at most c bytes, else NULL",
    "stored-form": "pg_column_size() and pg_column_compression() of a column read its stored form's header (its "
                   "size, 1 B to 1 GB, and its compression method or NULL), detoasting nothing",
    "nondeterministic-group": "GROUP BY a text of a nondeterministic collation of at most 16 MiB: its hash goes "
                              "through an ICU copy of two bytes a character and a sort key of up to ~18 bytes a "
                              "byte, under 1 GB",
    "abs": "abs() of a double precision or numeric cannot overflow",
    "clamp": "int2/int4/int8/float8/numeric larger()/smaller() compare and pick one argument "
             "(NaN sorts above every number)",
    "widen": "int2/int4/int8/real to double precision, integer to numeric, boolean to integer: every value converts",
    "float-to-bigint": "a double precision known to lie inside bigint's range, never NaN, rounds to a bigint",
    "float-multiply": "a double precision known finite-bounded times a constant whose product stays finite, "
                      "and nonzero magnitudes large enough that no product underflows to 0",
    "hash": "the extended hash functions of these types return a value for every value of the type "
            "(NaN, ±Infinity, -0 included) and NULL for NULL",
    "bit-ops": "# and & on bigints, and % of an integer or a bigint by a positive constant, cannot overflow",
    "random": "random() and floor() of its bounded product take no row value",
    "fence": "pg_is_in_recovery() reads no row",
    "width-bucket": "width_bucket() of a value that cannot be NaN, with finite constant bounds and a small "
                    "positive count, returns a bucket number (±Infinity fall outside)",
    "date-trunc": "date_trunc() of a declared unit on a date or time bounded by constants of the years "
                  "1..200000 (in the THEN of its range test) neither overflows nor leaves the type's range",
    "to-char": "to_char() of such a bounded time with a constant format prints it",
    "bounded-shift": "such a bounded time plus an interval literal of at most one calendar unit stays below the "
                     "year 200002, inside every date/time type's range (a Sunday week's day after, per group)",
    "grouping-sets": "GROUPING SETS of keys checked one by one groups by each set in turn; GROUPING() of a key "
                     "names the set a group is of (0 or 1), from no value",
    "extract-epoch": "EXTRACT(EPOCH) of such a bounded time is a numeric; numeric division by a constant "
                     "≥ 1 in magnitude and floor() of a numeric cannot fail",
    "aggregate": "count/sum/min/max over per-row values already checked: count counts, sum of integers "
                 "or numerics accumulates in numeric (int2/int4 in bigint: 2^32 rows to overflow), "
                 "min/max compare values of one built-in type. Per group, what they return is known: a count "
                 "is a bigint in [0, 2^63); a sum of n ≤ 2^63 values in [lo, hi] lies in [n·lo, n·hi] "
                 "(numeric holds 10^131072) and of integers is an integer, so nonzero is at least 1 in "
                 "magnitude; a min/max is one of the values; sum/min/max are NULL exactly where no row of "
                 "the group (under the same FILTER) has a non-NULL argument",
    "numeric-to-double": "a numeric known not NaN, of magnitude at most 1.7976931348623157e308 (the largest "
                         "double) and, when nonzero, at least 2.2250738585072014e-308 (the smallest normal "
                         "one), converts to double precision without overflow or underflow",
    "divide-by-count": "a double precision over count(c) FILTER (WHERE f), where the dividend is NULL whenever "
                       "no row has c non-NULL under f (a strict function of such a sum/min/max): a count of 0 "
                       "meets a NULL dividend, which a strict division never divides; else the count is in "
                       "[1, 2^63), so the quotient is no larger than the dividend (no overflow; ±Infinity and "
                       "NaN divide without error) and, the dividend being 0 or at least s in magnitude (or "
                       "checked ≥ count·s by the CASE it is in), at least s/2^63 or s (no underflow when ≥ 5e-324)",
    "float-send": "float8send() of a double precision returns its 8 bytes, NaN and ±Infinity included",
    "string-agg": "string_agg() of bytea or text values of at most w bytes with a constant delimiter, over a "
                  "relation of at most r rows with w·r below 512 MB, stays under the 1 GB limit",
    "concat-integers": "concat_ws() of a constant separator and integers prints each integer (int2/int4/int8 "
                       "output cannot fail) and returns text of at most the separator's length and 20 bytes an "
                       "integer (a percentile's grid index and count, rewriter.rewrite.collected_counts)",
    "encode-hex": "encode(x, 'hex') of a bytea below 512 MB is text of twice its length, below 1 GB",
    "numeric-arithmetic": "+, − and × of two numerics known not NaN and bounded by finite doubles are exact and "
                          "stay far below numeric's 10^131072 (a product's fraction digits past 16383 are "
                          "rounded, not an error): a variance's centred point and its square "
                          "(rewriter.rewrite.centred_points), a numeric total cut to the digits its grid "
                          "rounding needs (rewriter.rewrite.decided_total)",
    "bounded-number": "in the THEN of col >= c1 AND col <= c2, c1 and c2 number constants cast to double "
                      "precision or numeric, an integer, float or numeric column lies in [c1, c2] and is not "
                      "NaN (NaN sorts above every number, so col <= c2 is false for it)",
    "bounded-difference": "an integer, float or numeric known to lie in [lo, hi] (not NaN) minus a number "
                          "constant c lies in [lo − c, hi − c]: accepted where that stays inside the result type "
                          "(an integer's, or a double's finite range): Metabase's binning, rewriter.floor_bins",
    "divide-by-constant": "such a bounded value over a positive constant w: an integer's quotient is smaller; a "
                          "numeric's is rounded to at most 1,000 fraction digits; a double's stays finite where "
                          "max(|lo|, |hi|) / w does, and is no underflow where w <= 1 or the value's nonzero "
                          "magnitude is at least w·2^-1022 (past a CASE's abs(x) < w·2^-1022)",
    "floor-integer": "floor() of an integer is its value as a double precision, exactly",
    "numeric-to-bigint": "a numeric known not NaN and inside bigint's range rounds to a bigint",
    "integer-groups": "a GROUP BY on integer-valued keys bounded to [lo, hi] (a partition number "
                      "(h & mask) % m in [0, m), or floor(random() * m) in [0, m]) makes at most "
                      "∏(hi − lo + 2) groups, NULL included",
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
    "int8range": 3926, "tsrange": 3908, "tstzrange": 3910,
}
_UNKNOWN = 705  # an untyped literal or parameter: coerced to the other side's type
_NULL = -1
_OPAQUE = -2  # the value of a node that is a finding: nothing is known of it
_MIN_SUBNORMAL = 5e-324
_SMALLEST_NORMAL = 2.2250738585072014e-308
_MAX_FLOAT8 = 1.7976931348623157e308
_ROWS = 2.0**63  # no relation has more rows (a count is a bigint)
_BYTEA = 17
_MAX_BYTES = 2**29  # below bytea's 1 GB limit, with room for encode()'s hex doubling
_CASE_FOLD_BYTES = 2**26  # lower()/upper() ask for four bytes a character: 1 GB at 256 MiB
_SHORT_TEXT = 2**24  # a nondeterministic collation's hash: see "nondeterministic-group"
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
_AGGREGATES = {"count", "sum", "min", "max", "string_agg"}
_COMPARISONS = {"=", "<>", "<", "<=", ">", ">="}
_LIKES = {"~~", "~~*", "!~~", "!~~*"}
_LIKE_PART = 64  # the matcher compares that part at every position of a value: its time on one long value
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
    integral: bool = False  # a float or numeric known to hold whole numbers (floor's)
    column: AuditColumn | None = None
    # What makes the value NULL: a column's name (NULL there makes it NULL), or for an aggregate
    # of such a value "empty:<column>|<filter>" (NULL where no row has that column non-NULL).
    null_with: frozenset[str] = frozenset()
    counts: str | None = None  # a count(column)'s "<column>|<filter>"
    per: tuple[ast.Node, float] | None = None  # (a divisor, the least nonzero |value| / divisor)


@dataclass(frozen=True)
class _Relation:
    """What a SELECT's FROM gives its expressions: its columns' values, and at most how many
    rows it holds (a GROUP BY on bounded integer keys has at most so many groups)."""

    columns: Mapping[str, _Value]
    rows: float = math.inf


@dataclass
class _Context:
    """The relation read, and facts that hold in the CASE branch being checked."""

    columns: Mapping[str, _Value]
    rows: float = math.inf
    facts: list[tuple[ast.Node, _Value]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


def audit_backend_sql(sql: str, table: tuple[str, str], columns: Mapping[str, AuditColumn]) -> list[Finding]:
    """The nodes of ``sql`` evaluated per row or per group that :data:`TOTAL` does not list.

    ``table`` is the protected relation as (schema, name), ``columns`` its columns by name.
    A statement that does not parse, or reads the table in a shape this audit does not know
    (a join, a set operation), is itself a finding.
    """
    try:
        statements = parse_sql(sql)
    except Exception as exc:  # pglast raises its own ParseError; anything else is as bad
        return [Finding(sql[:200], f"does not parse: {exc}")]
    values = {name: _column_value(name, column) for name, column in columns.items()}
    findings: list[Finding] = []
    for raw in statements:
        if isinstance(raw.stmt, ast.SelectStmt):
            if _select(raw.stmt, table, values, findings) is None and not findings and _reads(raw.stmt, table):
                findings.append(Finding(_sql(raw.stmt), "the protected table read where the audit does not follow "
                                                        "it (a CTE, a subquery in an expression)"))
        else:
            findings.append(Finding(_sql(raw.stmt), "not a SELECT"))
    return findings


def _column_value(name: str, column: AuditColumn) -> _Value:
    nan = column.type_oid in _FLOATS or column.type_oid == _NUMERIC
    smallest = 1.0 if column.type_oid in _INTEGERS else 0.0 if column.type_oid == _NUMERIC else _MIN_SUBNORMAL
    return _Value(column.type_oid, nan=nan, smallest=smallest, column=column, null_with=frozenset((name,)))


def _select(node: ast.SelectStmt, table: tuple[str, str], columns: Mapping[str, _Value],
            findings: list[Finding]) -> _Relation | None:
    """Check one SELECT that reads the protected table, directly or through SELECTs in its FROM;
    return its output columns' values (so a SELECT over it is checked too), else None.

    Every expression such a SELECT evaluates is checked: per row (WHERE, GROUP BY, a
    projection's targets, aggregates' arguments and FILTERs) or per group of rows (targets and
    HAVING over aggregate results, ORDER BY, LIMIT), and in every SELECT above it, whose
    "rows" are groups: an error there is decided by the rows as much as one on a row."""
    if node.op is not None and node.op.name != "SETOP_NONE":
        for side in (node.larg, node.rarg):
            if side is not None and _reads(side, table):
                findings.append(Finding(_sql(node), "a set operation over the protected table"))
        return None
    if node.withClause is not None and _reads(node.withClause, table):
        findings.append(Finding(_sql(node), "the protected table read in a WITH query"))
        return None
    sources = list(node.fromClause or ())
    rows: _Relation | None = None
    for source in sources:
        if isinstance(source, ast.RangeVar) and (source.schemaname, source.relname) == table:
            rows = _Relation(columns)
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
    context = _Context(rows.columns, rows.rows)
    if node.whereClause is not None:
        _check(node.whereClause, context)
    keys = [_compared(item, _check(item, context), context, "GROUP BY") for item in _grouped_by(node.groupClause)]
    outputs: dict[str, _Value] = {}
    plain_distinct = node.distinctClause is not None and all(item is None for item in node.distinctClause)
    for target in node.targetList or ():
        value = _check(target.val, context)
        if plain_distinct:  # DISTINCT tells the whole output rows apart
            _compared(target.val, value, context, "DISTINCT")
        name = target.name or _output_name(target.val)
        if name is not None:  # NULL-ness is named afresh at each level: by the output's own name
            outputs[name] = replace(value, null_with=frozenset((name,)), counts=None, per=None)
    for clause in (node.havingClause, node.limitCount, node.limitOffset):
        if clause is not None:
            _check(clause, context)
    for item in [*(node.sortClause or ()), *(node.distinctClause or ())]:
        sorted_by = item.node if isinstance(item, ast.SortBy) else item
        if isinstance(sorted_by, ast.ColumnRef) and _column_name(sorted_by) in outputs:
            # An output column's name: its value, checked above, now compared with the others'.
            _compared(sorted_by, outputs[_column_name(sorted_by)], context, "ORDER BY or DISTINCT")
            continue
        if sorted_by is not None:
            _compared(sorted_by, _check(sorted_by, context), context, "ORDER BY or DISTINCT")
    findings.extend(context.findings)
    if keys:
        return _Relation(outputs, _groups(keys))
    if any(_has_aggregate(t.val) for t in node.targetList or ()):
        return _Relation(outputs, 1)
    return _Relation(outputs, rows.rows)


def _grouped_by(clause: Iterable[ast.Node] | None) -> list[ast.Node]:
    """The keys of a GROUP BY, each once: those of its GROUPING SETS too ("grouping-sets")."""
    keys: list[ast.Node] = []
    for item in clause or ():
        for key in (item.content or ()) if isinstance(item, ast.GroupingSet) else (item,):
            for each in (key.args or ()) if isinstance(key, ast.RowExpr) else (key,):
                if each not in keys:
                    keys.append(each)
    return keys


def _groups(keys: list[_Value]) -> float:
    """At most how many groups a GROUP BY on ``keys`` makes: the product of each key's number of
    integer values in its bounds and NULL ("integer-groups"); unbounded otherwise."""
    groups = 1.0
    for value in keys:
        integral = value.type_oid in _INTEGERS or value.integral and not value.nan
        if not (integral and math.isfinite(value.low) and math.isfinite(value.high)):
            return math.inf
        groups *= math.floor(value.high) - math.ceil(value.low) + 2
    return groups  # "integer-groups"


def _check(node: ast.Node, context: _Context) -> _Value:
    """Check ``node`` evaluated per row or per group; return what is known of its value."""
    value = _checked(node, context)
    for known, fact in context.facts:  # pglast compares nodes by their fields, locations aside
        if known != node:
            continue
        value = replace(value, nan=value.nan and fact.nan, low=max(value.low, fact.low), high=min(value.high, fact.high),
                        smallest=max(value.smallest, fact.smallest), bounded=value.bounded or fact.bounded,
                        per=fact.per or value.per)
    return value


def _compared(node: ast.Node, value: _Value, context: _Context, clause: str) -> _Value:
    """``value`` that ``clause`` sorts, groups or tells apart from the others of its column: a
    finding when it is a column of a type not built in ("compare-own-type" holds of built-in types
    only), whose comparison, equality and hash are the type's own code."""
    if value.column is not None and value.type_oid >= _FIRST_USER_OID and not value.column.enum:
        return _finding(node, context, f"{clause} by the comparison of type {value.type_oid}, not built in")
    if clause == "GROUP BY" and value.column is not None and not value.column.deterministic_collation \
            and value.type_oid in _TEXT_TYPES and value.high > _SHORT_TEXT:
        return _finding(node, context, "GROUP BY a text of a nondeterministic collation of unbounded length")
    return value  # "nondeterministic-group" where it is one


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
        null_with = frozenset.intersection(*(v.null_with for v in values))
        return replace(values[0], constant=False, text=None, null_with=null_with, counts=None)  # "coalesce"
    if isinstance(node, ast.CollateClause):
        value = _check(node.arg, context)
        if value.type_oid in _TEXT_TYPES:
            return value  # "collate"
        return _finding(node, context, "COLLATE on a value that is not text")
    if isinstance(node, ast.A_Expr):
        return _operator(node, context)
    if isinstance(node, ast.FuncCall):
        return _function(node, context)
    if isinstance(node, ast.GroupingFunc) and all(isinstance(arg, ast.ColumnRef) for arg in node.args or ()):
        return _Value(_INT4, nan=False, low=0.0, high=1.0, smallest=1.0)  # "grouping-sets"
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
        return _Value(_INT4, constant=True, text=str(value.ival), nan=False, low=value.ival, high=value.ival)
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
        number = _number(text) if target in _FLOATS or target == _NUMERIC or target in _INTEGERS else None
        if number is not None and not math.isnan(number):
            low, high = (number, number) if target != _NUMERIC else (_outward(number, -1), _outward(number, 1))
            return _Value(target, constant=True, text=text, nan=False, low=low, high=high,
                          smallest=min(abs(low), abs(high)) if low * high > 0 else math.inf)
        return _Value(target, constant=True, text=text)
    value = _check(node.arg, context)
    strict = value.null_with
    if value.type_oid == target:
        return value
    if target == _FLOAT8 and (value.type_oid in _INTEGERS or value.type_oid in _FLOATS):
        return replace(value, type_oid=_FLOAT8, nan=value.nan and value.type_oid in _FLOATS)  # "widen"
    if target == _NUMERIC and value.type_oid in _INTEGERS:
        return replace(value, type_oid=_NUMERIC, nan=False, column=None)  # "widen"
    if target == _INT4 and value.type_oid == _BOOL:
        return _Value(_INT4, nan=False, low=0, high=1, smallest=1, null_with=strict)  # "widen"
    if target in _TIME_TYPES and value.type_oid in _TIME_TYPES and value.bounded:
        return _Value(target, bounded=True, null_with=strict)  # "time-cast"
    if target == _INT8 and value.type_oid in (_FLOAT8, _NUMERIC) and not value.nan and -2.0**63 < value.low \
            and value.high < 2.0**63:
        return _Value(_INT8, nan=False, low=math.floor(value.low), high=math.ceil(value.high), smallest=1,
                      null_with=strict)  # "float-to-bigint" # "numeric-to-bigint"
    if target == _FLOAT8 and value.type_oid == _NUMERIC and not value.nan and -_MAX_FLOAT8 <= value.low \
            and value.high <= _MAX_FLOAT8 and value.smallest >= _SMALLEST_NORMAL:
        return replace(value, type_oid=_FLOAT8, column=None)  # "numeric-to-double"
    return _finding(node, context, f"a cast from type {value.type_oid} to {target} that may fail")


def _outward(number: float, direction: int) -> float:
    """A numeric literal's value read as a double, moved one step outward: the double nearest a
    long decimal may lie inside it."""
    return math.nextafter(number, direction * math.inf)


def _case(node: ast.CaseExpr, context: _Context) -> _Value:
    if node.arg is not None:
        return _finding(node, context, "CASE x WHEN ... (the audit reads only searched CASE)")
    results: list[_Value] = []
    # A branch is taken only where its WHEN holds, so not where a NULL makes that WHEN NULL.
    nulls: list[frozenset[str]] = []
    saved = list(context.facts)
    for when in node.args:
        condition = _check(when.expr, context)
        context.facts += _facts_if_true(when.expr)
        results.append(_check(when.result, context))
        nulls.append(condition.null_with | results[-1].null_with)
        context.facts = saved + _facts_if_false_all(node.args[: node.args.index(when) + 1])
    if node.defresult is not None:
        results.append(_check(node.defresult, context))
        nulls.append(results[-1].null_with)
    context.facts = saved
    typed = [r for r in results if r.type_oid != _NULL]
    if not typed:
        return _Value(_NULL)
    first = typed[0]
    types = {r.type_oid for r in typed}
    if _FLOAT8 in types and types <= {*_INTEGERS, *_FLOATS}:  # PostgreSQL resolves such a CASE to double precision
        first = replace(first, type_oid=_FLOAT8)
    # Without an ELSE, and in a branch of NULL, the CASE is NULL whatever is NULL.
    sets = [n for n, r in zip(nulls, results) if r.type_oid != _NULL]
    null_with = frozenset.intersection(*sets) if sets else frozenset()
    return replace(first, constant=False, text=None, nan=any(r.nan for r in typed),
                   low=min(r.low for r in typed), high=max(r.high for r in typed),
                   smallest=min(r.smallest for r in typed), bounded=all(r.bounded for r in typed),
                   null_with=null_with, counts=None, per=None)


def _facts_if_true(condition: ast.Node) -> list[tuple[ast.Node, _Value]]:
    """What holds in a THEN: a date/time column between constants of safe years, a text of at
    most so many bytes."""
    terms = condition.args if isinstance(condition, ast.BoolExpr) and condition.boolop == BoolExprType.AND_EXPR else [condition]
    lower: dict[str, ast.Node] = {}
    upper: dict[str, ast.Node] = {}
    short: list[tuple[ast.Node, _Value]] = []
    low: dict[str, tuple[ast.Node, float]] = {}
    high: dict[str, float] = {}
    for term in terms:
        if (isinstance(term, ast.A_Expr) and term.kind == A_Expr_Kind.AEXPR_OP and isinstance(term.lexpr, ast.ColumnRef)
                and isinstance(term.rexpr, ast.TypeCast) and _type_oid(term.rexpr.typeName) in (_FLOAT8, _NUMERIC)):
            number = _number(_constant_text(term.rexpr))
            if number is not None and math.isfinite(number) and _operator_name(term) in (">=", "<="):
                if _operator_name(term) == ">=":
                    low[_column_name(term.lexpr)] = (term.lexpr, _outward(number, -1))
                else:
                    high[_column_name(term.lexpr)] = _outward(number, 1)
                continue
        if (isinstance(term, ast.A_Expr) and term.kind == A_Expr_Kind.AEXPR_OP and _operator_name(term) == "<="
                and isinstance(term.lexpr, ast.FuncCall) and _function_name(term.lexpr) == "octet_length"
                and len(term.lexpr.args or ()) == 1 and _number(_constant_text(term.rexpr)) is not None):
            short.append((term.lexpr.args[0], _Value(0, high=float(_constant_text(term.rexpr) or 0))))  # "short-text"
            continue
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
        key = _column_name(term.lexpr)
        if symbol in (">=", ">"):
            lower[key] = term.lexpr
        elif symbol in ("<", "<="):
            upper[key] = term.lexpr
    numbers = [(column, _Value(0, nan=False, low=bound, high=high[key]))
               for key, (column, bound) in low.items() if key in high]  # "bounded-number"
    return short + numbers + [(column, _Value(0, bounded=True)) for key, column in lower.items() if key in upper]


def _facts_if_false_all(whens: Iterable[ast.CaseWhen]) -> list[tuple[ast.Node, _Value]]:
    """What holds past WHENs that did not hold: ``x = 'NaN'`` false leaves x not NaN, and
    ``abs(x) < c`` false leaves x of magnitude ≥ c (or NaN)."""
    facts: list[tuple[ast.Node, _Value]] = []
    for when in whens:
        condition = when.expr
        if not (isinstance(condition, ast.A_Expr) and condition.kind == A_Expr_Kind.AEXPR_OP):
            continue
        symbol = _operator_name(condition)
        if symbol == "=" and _constant_text(condition.rexpr) == "NaN":
            facts.append((condition.lexpr, _Value(0, nan=False)))
        if (symbol == "<" and isinstance(condition.lexpr, ast.FuncCall) and _function_name(condition.lexpr) == "abs"):
            bound = _number(_constant_text(condition.rexpr))
            if bound is not None and bound > 0:
                facts.append((condition.lexpr.args[0], _Value(0, smallest=bound)))
            per = _per_count(condition.rexpr)
            if per is not None:
                facts.append((condition.lexpr.args[0], _Value(0, per=per)))
    return facts


def _per_count(node: ast.Node) -> tuple[ast.Node, float] | None:
    """``CAST(n AS double precision) * c`` as (n, c): ``abs(x) < n·c`` false leaves
    |x| ≥ n·c, so x / n, where n > 0, is at least c in magnitude ("divide-by-count")."""
    if not (isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP and _operator_name(node) == "*"
            and isinstance(node.lexpr, ast.TypeCast) and _type_oid(node.lexpr.typeName) == _FLOAT8):
        return None
    bound = _number(_constant_text(node.rexpr))
    return (node.lexpr.arg, bound) if bound is not None and bound > 0 else None


def _operator(node: ast.A_Expr, context: _Context) -> _Value:
    if node.kind == A_Expr_Kind.AEXPR_OP_ANY:
        return _any_equality(node, context)
    if node.kind != A_Expr_Kind.AEXPR_OP:
        return _finding(node, context, f"{node.kind.name} is not on the table of total operations")
    symbol = _operator_name(node)
    if node.lexpr is None:
        if symbol == "-" and isinstance(node.rexpr, ast.A_Const):
            value = _constant(node.rexpr)
            return replace(value, text=f"-{value.text}" if value.text is not None else None, low=-value.high,
                           high=-value.low)
        return _finding(node, context, f"prefix operator {symbol}")
    left, right = _check(node.lexpr, context), _check(node.rexpr, context)
    value = _binary(node, symbol, left, right, context)
    return replace(value, null_with=value.null_with | left.null_with | right.null_with)  # these operators are strict


def _any_equality(node: ast.A_Expr, context: _Context) -> _Value:
    """``x = ANY (ARRAY[c1, …])`` of constants: ``x = c1 OR …``, each comparison judged as one
    ("any-equality"; the hashed raw conjunct of rewriter/raw_equality.py)."""
    elements = node.rexpr.elements if isinstance(node.rexpr, ast.A_ArrayExpr) else None
    if _operator_name(node) != "=" or not elements:
        return _finding(node, context, "a comparison with ANY other than = with an array of constants")
    left = _check(node.lexpr, context)
    for element in elements:
        value = _check(element, context)
        if not value.constant:
            return _finding(node, context, "= ANY of an array of values that are not constants")
        if _comparison(node, left, value, context).type_oid != _BOOL:
            return _Value(_OPAQUE)
    return _Value(_BOOL, null_with=left.null_with)  # "any-equality"


def _binary(node: ast.A_Expr, symbol: str, left: _Value, right: _Value, context: _Context) -> _Value:
    if symbol == "+" and left.constant and right.constant:
        return _shift(node, left, right, context)
    if symbol == "+" and left.type_oid in _TIME_TYPES and left.bounded and right.constant and right.type_oid == 1186 \
            and (_interval_years(right.text) or 2.0) <= 1.0:
        return _Value(1114 if left.type_oid == 1082 else left.type_oid, bounded=True)  # "bounded-shift"
    if symbol in _COMPARISONS:
        return _comparison(node, left, right, context)
    if symbol in _LIKES:
        return _like(node, left, right, context)
    if symbol == "#" and left.type_oid == right.type_oid == _INT8:
        return _Value(_INT8)  # "bit-ops"
    if symbol == "&" and left.type_oid == _INT8 and (right.type_oid == _INT8 or right.constant):
        mask = _number(right.text) if right.constant else None
        return _Value(_INT8, low=0, high=mask) if mask is not None and mask >= 0 else _Value(_INT8)  # "bit-ops"
    if symbol == "%" and left.type_oid in (_INT4, _INT8) and right.constant and (_number(right.text) or 0) > 0:
        modulus = (_number(right.text) or 1) - 1
        return _Value(left.type_oid, low=0 if left.low >= 0 else -modulus, high=modulus)  # "bit-ops"
    if symbol == "*" and left.type_oid == _FLOAT8 and right.constant and right.type_oid == _FLOAT8:
        return _float_product(node, left, right, context)
    if symbol == "*" and _is_random(node.lexpr) and right.constant:
        return _Value(_FLOAT8, nan=False, low=0.0, high=abs(_number(right.text) or math.inf))  # "random"
    if symbol in ("-", "/") and right.constant and not left.constant and not left.nan \
            and math.isfinite(left.low) and math.isfinite(left.high):
        bounded = _bounded_arithmetic(symbol, left, right)
        if bounded is not None:
            return bounded
    if symbol == "/" and left.type_oid == _NUMERIC and right.constant and abs(_number(right.text) or 0) >= 1:
        return _Value(_NUMERIC, nan=left.nan)  # "extract-epoch"
    if symbol in ("+", "-", "*") and left.type_oid == right.type_oid == _NUMERIC and not (left.nan or right.nan) \
            and all(math.isfinite(bound) for bound in (left.low, left.high, right.low, right.high)):
        return _numeric_arithmetic(symbol, left, right)
    if symbol == "/" and left.type_oid == _FLOAT8 and not left.constant and right.counts is not None:
        return _mean(node, left, right, context)
    return _finding(node, context, f"operator {symbol} on types {left.type_oid}, {right.type_oid}")


def _bounded_arithmetic(symbol: str, left: _Value, right: _Value) -> _Value | None:
    """``left - c`` or ``left / c`` of a bounded number, not NaN, and a number constant c (c > 0 for
    ``/``), with the result's bounds; None where it may fail ("bounded-difference",
    "divide-by-constant")."""
    number = _number(right.text)
    if number is None or not math.isfinite(number) or (symbol == "/" and number <= 0):
        return None
    if left.type_oid in _FLOATS:
        if symbol == "-":
            low, high = _outward(left.low - number, -1), _outward(left.high - number, 1)
            smallest = _MIN_SUBNORMAL
        else:
            if number > 1 and left.smallest < number * _SMALLEST_NORMAL:
                return None  # a nonzero magnitude so small the quotient would underflow
            low, high = left.low / number, left.high / number
            smallest = left.smallest / number if number <= 1 else _SMALLEST_NORMAL
        if max(abs(low), abs(high)) >= _MAX_FLOAT8:
            return None
        return _Value(_FLOAT8, nan=False, low=low, high=high, smallest=smallest)  # "bounded-difference"
    integer = left.type_oid in _INTEGERS and right.type_oid in _INTEGERS
    if integer:
        result = _INT8 if _INT8 in (left.type_oid, right.type_oid) else _INT4
        if symbol == "/":
            return _Value(result, nan=False, low=min(left.low, 0.0), high=max(left.high, 0.0))  # "divide-by-constant"
        low, high = left.low - number, left.high - number
        limit = 2.0**63 if result == _INT8 else 2.0**31
        return _Value(result, nan=False, low=low, high=high) if -limit < low and high < limit else None
    if left.type_oid in (*_INTEGERS, _NUMERIC) and right.type_oid in (*_INTEGERS, _NUMERIC):
        if symbol == "-":
            return _Value(_NUMERIC, nan=False, low=left.low - number, high=left.high - number, smallest=0.0)
        bounds = (left.low / number, left.high / number)
        return _Value(_NUMERIC, nan=False, low=_outward(bounds[0], -1), high=_outward(bounds[1], 1), smallest=0.0)
    return None


def _numeric_arithmetic(symbol: str, left: _Value, right: _Value) -> _Value:
    """The exact sum, difference or product of two bounded numerics, with its bounds."""
    if symbol == "+":
        low, high = left.low + right.low, left.high + right.high
    elif symbol == "-":
        low, high = left.low - right.high, left.high - right.low
    else:
        corners = [a * b for a in (left.low, left.high) for b in (right.low, right.high)]
        low, high = min(corners), max(corners)
    return _Value(_NUMERIC, nan=False, low=low, high=high, smallest=0.0)  # "numeric-arithmetic"


def _mean(node: ast.A_Expr, total: _Value, count: _Value, context: _Context) -> _Value:
    """A double precision over count(c) FILTER (WHERE f) of the rows it aggregates (a partition's mean)."""
    if count.low < 1 and f"empty:{count.counts}" not in total.null_with:
        return _finding(node, context, "a division by a count that may be 0 while the dividend is not NULL")
    if total.per is not None and total.per[0] == node.rexpr and total.per[1] >= _SMALLEST_NORMAL:
        smallest = total.per[1]
    elif total.smallest / count.high >= _MIN_SUBNORMAL:
        smallest = total.smallest / count.high
    else:
        return _finding(node, context, "a division that may underflow to 0 from a nonzero dividend")
    return replace(total, low=min(total.low, 0.0), high=max(total.high, 0.0), smallest=smallest, column=None,
                   counts=None, per=None)  # "divide-by-count"


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
    if _operator_name(node).endswith("~~*") and left.high > _CASE_FOLD_BYTES:
        return _finding(node, context, "ILIKE on a text of unbounded length (it lowers the value first)")
    pattern = node.rexpr
    if isinstance(pattern, ast.TypeCast) and isinstance(pattern.arg, ast.ParamRef):
        return _Value(_BOOL)  # "like": a bound pattern is checked at Bind
    if not (isinstance(pattern, ast.A_Const) and isinstance(pattern.val, ast.String)):
        return _finding(node, context, "LIKE with a pattern that is not a literal or a parameter")
    trailing = len(pattern.val.sval) - len(pattern.val.sval.rstrip("\\"))
    if trailing % 2:
        return _finding(node, context, "LIKE pattern ending in an escape, which PostgreSQL rejects on a row it reaches")
    if _longest_part_after_percent(pattern.val.sval) > _LIKE_PART:
        return _finding(node, context, "LIKE pattern with a long part after a %, compared at every position of a value")
    return _Value(_BOOL)  # "like"


def _longest_part_after_percent(pattern: str) -> int:
    """The most characters a pattern holds after a wildcard %, up to the next one or its end, read
    as PostgreSQL's matcher reads it (an escape character and the one after it are one character)."""
    longest, run, after, escaped = 0, 0, False, False
    for char in pattern:
        if escaped or char not in "%\\":
            run, escaped = run + 1, False
        elif char == "\\":
            escaped = True
        else:
            longest, run, after = max(longest, run) if after else longest, 0, True
    return max(longest, run) if after else longest


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
            _compared(item.node, _check(item.node, context), context, f"{name}(... ORDER BY)")
        if node.agg_distinct:
            args = [_compared(arg, value, context, f"{name}(DISTINCT)") for arg, value in zip(node.args or (), args)]
        return _aggregate(node, name, args, context)
    if node.agg_filter is not None or node.agg_distinct or node.agg_star:
        return _finding(node, context, f"{name}() used as an aggregate")
    value = _scalar(node, name, args, context)
    return replace(value, null_with=value.null_with.union(*(a.null_with for a in args)))  # these functions are strict


def _scalar(node: ast.FuncCall, name: str, args: list[_Value], context: _Context) -> _Value:
    if name in _HASHES and len(args) == 2 and args[0].type_oid in _HASHES[name] and args[1].constant:
        return _Value(_INT8)  # "hash"
    if name == "hashtidextended" and len(args) == 2 and args[0].type_oid == 27 and args[1].constant:
        return _Value(_INT8)  # "hash"
    if name in _CLAMPS and len(args) == 2 and args[0].type_oid == args[1].type_oid == _CLAMPS[name] and args[1].constant:
        return _clamp(name, args[0], args[1])
    if name in ("lower", "upper") and len(args) == 1 and args[0].type_oid in _TEXT_TYPES \
            and args[0].high <= _CASE_FOLD_BYTES:
        return _Value(_TEXT, high=3 * args[0].high, column=args[0].column)  # "case-fold"
    if name == "octet_length" and len(args) == 1 and (args[0].type_oid in _TEXT_TYPES or args[0].type_oid == _BYTEA):
        return _Value(_INT4, nan=False, low=0.0, high=2.0**30, smallest=1.0)  # "octet-length"
    if name == "pg_column_size" and len(args) == 1 and args[0].column is not None:
        return _Value(_INT4, nan=False, low=1.0, high=2.0**30, smallest=1.0)  # "stored-form"
    if name == "pg_column_compression" and len(args) == 1 and args[0].column is not None:
        return _Value(_TEXT)  # "stored-form"
    if name == "abs" and len(args) == 1 and args[0].type_oid in (_FLOAT8, _NUMERIC):
        return replace(args[0], low=0.0, high=max(abs(args[0].low), abs(args[0].high)))  # "abs"
    if name == "random" and not args:
        return _Value(_FLOAT8, nan=False, low=0.0, high=1.0)  # "random"
    if name == "floor" and len(args) == 1 and args[0].type_oid in _INTEGERS:
        return replace(args[0], type_oid=_FLOAT8, constant=False, nan=False, integral=True)  # "floor-integer"
    if name == "floor" and len(args) == 1 and args[0].type_oid in (_FLOAT8, _NUMERIC):
        return replace(args[0], constant=False, integral=True)  # "extract-epoch", and "random"'s floor
    if name == "pg_is_in_recovery" and not args:
        return _Value(_BOOL)  # "fence"
    if name == "float8send" and len(args) == 1 and args[0].type_oid == _FLOAT8:
        return _Value(_BYTEA, low=8.0, high=8.0)  # "float-send"
    if name == "encode" and len(args) == 2 and args[0].type_oid == _BYTEA and args[0].high <= _MAX_BYTES \
            and args[1].constant and args[1].text == "hex":
        return _Value(_TEXT)  # "encode-hex"
    if name == "width_bucket":
        return _width_bucket(node, args, context)
    if name == "concat_ws" and len(args) >= 2 and args[0].constant and args[0].text is not None \
            and all(a.type_oid in _INTEGERS for a in args[1:]):
        return _Value(_TEXT, low=0.0, high=len(args[0].text.encode()) * (len(args) - 2) + 20.0 * (len(args) - 1))
        # "concat-integers"
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
    """An aggregate call over values already checked, and what is known of its result per group
    ("aggregate-bounds"): each is NULL where no row of the group has its argument non-NULL."""
    where = _sql(node.agg_filter) if node.agg_filter is not None else ""
    if name == "count":
        counted = node.args[0] if len(node.args or ()) == 1 else None
        counts = f"{_column_name(counted)}|{where}" if isinstance(counted, ast.ColumnRef) else None
        return _Value(_INT8, nan=False, low=0.0, high=_ROWS, smallest=1.0, counts=counts)  # "aggregate"
    if len(args) != 1 and name != "string_agg":
        return _finding(node, context, f"{name}() of {len(args)} arguments")
    value = args[0]
    empty = frozenset(f"empty:{c}|{where}" for c in value.null_with if not c.startswith("empty:"))
    if name == "sum" and (value.type_oid in _INTEGERS or value.type_oid == _NUMERIC):
        # n ≤ 2^63 values in [lo, hi] add up to a value in [n·lo, n·hi]
        low, high = min(value.low, value.low * _ROWS), max(value.high, value.high * _ROWS)
        numeric = value.type_oid in (_INT8, _NUMERIC)
        return _Value(_NUMERIC if numeric else _INT8, nan=value.nan or math.isinf(low) and math.isinf(high),
                      low=low, high=high, smallest=0.0 if value.type_oid == _NUMERIC else 1.0,
                      null_with=empty)  # "aggregate"
    if name in ("min", "max") and 0 < value.type_oid < _FIRST_USER_OID and not (value.column and value.column.container):
        return replace(value, constant=False, text=None, column=None, null_with=empty, counts=None,
                       per=None)  # "aggregate"
    if name == "string_agg" and len(args) == 2 and value.type_oid in (_BYTEA, _TEXT) and args[1].constant \
            and (value.high + len((args[1].text or "").encode())) * context.rows <= _MAX_BYTES:
        return _Value(value.type_oid, low=0.0, high=value.high * context.rows)  # "string-agg"
    return _finding(node, context, f"{name}() of type {value.type_oid}, which may overflow or fail to compare")


def _clamp(name: str, value: _Value, bound: _Value) -> _Value:
    smallest = min(value.smallest, abs(bound.low) or math.inf, abs(bound.high) or math.inf)
    if name.endswith("larger"):  # NaN stays NaN (it sorts above every number)
        return replace(value, constant=False, low=max(value.low, bound.low), high=max(value.high, bound.low),
                       smallest=smallest, column=None)  # "clamp"
    return replace(value, constant=False, nan=False, low=min(value.low, bound.high), high=min(value.high, bound.high),
                   smallest=smallest, column=None)


def _width_bucket(node: ast.FuncCall, args: list[_Value], context: _Context) -> _Value:
    if len(args) != 4 or args[0].constant or not all(a.constant for a in args[1:]):
        return _finding(node, context, "width_bucket() of other than a value, two constant bounds and a count")
    if args[0].nan or args[0].type_oid not in (_FLOAT8, _NUMERIC):
        return _finding(node, context, "width_bucket() of a value that may be NaN")
    bounds = [_number(a.text) for a in args[1:3]]
    count = _number(args[3].text)
    if any(b is None or not math.isfinite(b) for b in bounds) or count is None or not 0 < count < 2**30:
        return _finding(node, context, "width_bucket() with bounds that are not finite or a count out of range")
    return _Value(_INT4, nan=False, low=0.0, high=count + 1.0)  # "width-bucket": a bucket in 0 … count + 1


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


def _reads(node: ast.Node, table: tuple[str, str]) -> bool:
    return any(isinstance(n, ast.RangeVar) and (n.schemaname, n.relname) == table for n in _walk(node, lambda _: False))


def _column_name(node: ast.ColumnRef) -> str:
    return ".".join(f.sval for f in node.fields if isinstance(f, ast.String))


def _output_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.ColumnRef) and isinstance(node.fields[-1], ast.String):
        return str(node.fields[-1].sval)
    return None


def _sql(node: ast.Node) -> str:
    try:
        return str(RawStream()(node))
    except Exception:
        return repr(node)[:300]
