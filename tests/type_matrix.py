"""The type × role matrix: every column type a protected table may have, every role a column of
it can play in a statement dpproxy accepts, and neighbouring tables that differ by one row
holding an extreme value of that type (tests/test_type_matrix.py runs it).

Generated, not listed case by case, so that a type or a construct dpproxy starts to accept
joins the check by itself:

* **types** are :data:`CURATED` (the types past holes came from, with their extreme values;
  among them the extensions' and users' types the backend can create, pgvector's with values of
  mixed dimensions) plus every other base type of the backend's ``pg_catalog`` whose input
  function reads one of :data:`GENERIC_LITERALS` (:func:`catalog_types`);
* **policies**: each type gets a column per policy variant (:data:`VARIANTS`: bounds with
  GROUP BY and sample and aggregate, categories with GROUP BY, a declared time range with every
  unit); the variants the policy loader refuses are the type/role pairs dpproxy declares unsafe;
* **roles** are statement templates over a column (:func:`roles`): every aggregate, every GROUP
  BY key form, every WHERE form with literals of every extreme, typed constants of every
  built-in type, parameters of every Python type psycopg sends, folded constants and other
  columns; the ones dpproxy's planner accepts (:func:`rewriter.dp_query.plan_aggregate_query`)
  are run, the others are refused from the text alone and cannot depend on the rows.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from decimal import Decimal

__all__ = ["CURATED", "GENERIC_LITERALS", "Probe", "TypeCase", "VARIANTS", "catalog_types_sql", "column_name",
           "roles", "where_roles"]


@dataclass(frozen=True)
class TypeCase:
    """A column type: its SQL, extreme values and two ordinary ones, as input text of the type."""

    sql_type: str
    extremes: tuple[str, ...]
    ordinary: tuple[str, str]
    key: str = ""  # a short name for column names; the type's own when empty
    setup: str = ""  # DDL the type needs (an enum, a domain, a collation)
    collation: str = ""  # the column's COLLATE clause, if any

    @property
    def column_type(self) -> str:
        """The type as a column definition writes it, collation included."""
        return f"{self.sql_type} {self.collation}".strip()

    @property
    def name(self) -> str:
        return self.key or "".join(ch if ch.isalnum() else "_" for ch in self.sql_type)


_LONG = "x" * 3000
_VECTOR = "CREATE EXTENSION IF NOT EXISTS vector"
_TEXTS = ("", "\\", _LONG, "😀", "İı ß", "O'Brien", "a\\%_", " ")
CURATED: tuple[TypeCase, ...] = (
    TypeCase("smallint", ("-32768", "32767", "0", "-1"), ("3", "7")),
    TypeCase("integer", ("-2147483648", "2147483647", "0"), ("3", "7")),
    TypeCase("bigint", ("-9223372036854775808", "9223372036854775807", "0"), ("3", "7")),
    TypeCase("numeric", ("NaN", "Infinity", "-Infinity", "1e-400", "1e1000", "-1e1000", "0.000000000000000000001"),
             ("3", "7.5")),
    TypeCase("numeric(12,2)", ("NaN", "9999999999.99", "-9999999999.99", "0.01"), ("3", "7.5"), key="numeric12_2"),
    TypeCase("real", ("NaN", "Infinity", "-Infinity", "-0", "1e-45", "3.4028235e38", "-3.4028235e38"), ("3", "7.5")),
    TypeCase("double precision", ("NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e308",
                                  "-1.7976931348623157e308", "2.2250738585072014e-308"), ("3", "7.5"), key="float8"),
    TypeCase("money", ("92233720368547758.07", "-92233720368547758.08", "0"), ("3", "7.5")),
    TypeCase("boolean", ("true", "false"), ("true", "false"), key="bool"),
    TypeCase("text", _TEXTS, ("Male", "Female")),
    TypeCase("text", _TEXTS, ("Male", "Female"), key="text_c", collation='COLLATE "C"'),
    TypeCase("text", _TEXTS, ("Male", "Female"), key="text_icu", collation='COLLATE "und-x-icu"',
             setup='SELECT \'x\' COLLATE "und-x-icu"'),
    TypeCase("text", _TEXTS, ("Male", "Female"), key="text_nd", collation="COLLATE tm_nocase",
             setup="CREATE COLLATION IF NOT EXISTS tm_nocase (provider = icu, locale = 'und-u-ks-level2', "
                   "deterministic = false)"),
    TypeCase("varchar(8)", ("", "\\", "😀😀😀😀😀😀😀😀", "%"), ("Male", "Female"), key="varchar8"),
    TypeCase("char(4)", ("", "\\", "😀😀😀😀", "a   "), ("Male", "Fem"), key="char4"),
    TypeCase("bytea", ("\\x", "\\x00ff", "\\x5c", "\\x" + "ff" * 2000), ("\\x01", "\\x02")),
    TypeCase("date", ("infinity", "-infinity", "4713-01-01 BC", "5874897-12-31", "2000-02-29"), ("2000-03-01", "2000-07-01")),
    TypeCase("timestamp", ("infinity", "-infinity", "4713-01-01 00:00 BC", "294276-12-31 23:59:59.999999",
                           "2000-12-31 23:59:59.999999"), ("2000-03-01 12:00", "2000-07-01")),
    TypeCase("timestamptz", ("infinity", "-infinity", "4713-01-01 00:00+00 BC", "294276-12-31 23:59:59.999999+00",
                             "2000-12-31 23:59:59.999999-15:59"), ("2000-03-01 12:00+00", "2000-07-01+00")),
    TypeCase("time", ("00:00", "24:00", "23:59:59.999999"), ("12:00", "13:00")),
    TypeCase("timetz", ("00:00+15:59", "24:00-15:59", "12:00+00"), ("12:00+00", "13:00+00")),
    TypeCase("interval", ("178000000 years", "-178000000 years", "2147483647 days 2562047788:00:54.775807",
                          "-2147483648 months -2147483648 days -2562047788:00:54.775808"), ("1 day", "2 days")),
    TypeCase("uuid", ("00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff"),
             ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
    TypeCase("inet", ("0.0.0.0/0", "::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "255.255.255.255"),
             ("10.0.0.1", "10.0.0.2")),
    TypeCase("cidr", ("0.0.0.0/0", "::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"), ("10.0.0.0/8", "10.1.0.0/16")),
    TypeCase("macaddr", ("00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff"), ("08:00:2b:01:02:03", "08:00:2b:01:02:04")),
    TypeCase("tm_mood", ("sad", "late"), ("ok", "happy"), key="enum",
             setup="DO $$ BEGIN CREATE TYPE tm_mood AS ENUM ('sad', 'ok', 'happy'); "
                   "EXCEPTION WHEN duplicate_object THEN NULL; END $$; ALTER TYPE tm_mood ADD VALUE IF NOT EXISTS 'late'"),
    TypeCase("tm_positive", ("1", "2147483647"), ("3", "7"), key="domain",
             setup="DO $$ BEGIN CREATE DOMAIN tm_positive AS integer CHECK (VALUE > 0); "
                   "EXCEPTION WHEN duplicate_object THEN NULL; END $$"),
    TypeCase("bit(3)", ("000", "111"), ("010", "011"), key="bit3"),
    TypeCase("varbit", ("", "1" * 1000), ("01", "011")),
    TypeCase("json", ("{}", "[]", "null", '"\\u0000x"', "1e400"), ('"Male"', '"Female"')),
    TypeCase("jsonb", ("{}", "[]", "null", '{"a": 1e400}', '"x"'), ('"Male"', '"Female"')),
    TypeCase("integer[]", ("{}", "{NULL}", "{{1},{2}}", "[-5:-5]={1}"), ("{1}", "{2}"), key="int4_array"),
    TypeCase("point[]", ("{}", '{"(0,0)"}', '{"(1e308,NaN)"}'), ('{"(1,1)"}', '{"(2,2)"}'), key="point_array"),
    TypeCase("int4range", ("empty", "(,)", "[-2147483648,2147483647)"), ("[1,2)", "[2,3)")),
    TypeCase("numrange", ("empty", "(,)", "[1e1000,1e1001)", "[-1e1000,0]", "(-Infinity,Infinity)"), ("[1,2)", "[2,3)")),
    TypeCase("tstzrange", ("empty", "[-infinity,infinity]", "[4713-01-01 BC,294276-12-31)"),
             ("[2000-01-01,2000-02-01)", "[2000-02-01,2000-03-01)")),
    TypeCase("tm_pair", ("(,)", '(2147483647,"(1e308,NaN)")'), ('(1,"(1,1)")', '(2,"(2,2)")'), key="composite",
             setup="DO $$ BEGIN CREATE TYPE tm_pair AS (n integer, p point); "
                   "EXCEPTION WHEN duplicate_object THEN NULL; END $$"),
    # Types not built in: pgvector's (those of its version on the server; a type it lacks reads no
    # value and is left out), whose comparisons raise on two values of different dimensions, and
    # a user's range types. Each one's values mix dimensions.
    TypeCase("vector", ("[1,2]", "[1,2,3,4]", "[0]", "[3e38,-3e38,0]"), ("[1,2,3]", "[1,2,4]"), setup=_VECTOR),
    TypeCase("vector[]", ('{"[1,2]"}', '{"[1,2,3]","[1]"}', "{}"), ('{"[1,2,3]"}', '{"[1,2,4]"}'), key="vector_array",
             setup=_VECTOR),
    TypeCase("halfvec", ("[1,2]", "[1,2,3,4]", "[65504,-65504,0]"), ("[1,2,3]", "[1,2,4]"), setup=_VECTOR),
    TypeCase("sparsevec", ("{1:1}/2", "{1:1,4:2}/4", "{}/1"), ("{1:1}/3", "{2:1}/3"), setup=_VECTOR),
    TypeCase("tm_vrange", ('["[1,2]","[1,3]"]', '["[1,2,3,4]","[1,2,3,5]"]', "empty"),
             ('["[1,2,3]","[1,2,4]"]', '["[0,0,0]","[1,2,3]"]'), key="vector_range",
             setup=_VECTOR + "; DO $$ BEGIN CREATE TYPE tm_vrange AS RANGE (subtype = vector); "
                             "EXCEPTION WHEN duplicate_object THEN NULL; END $$"),
    TypeCase("tm_irange", ("empty", "(,)", "[-2147483648,2147483647)"), ("[1,2)", "[2,3)"), key="user_range",
             setup="DO $$ BEGIN CREATE TYPE tm_irange AS RANGE (subtype = integer); "
                   "EXCEPTION WHEN duplicate_object THEN NULL; END $$"),
)

# Input texts tried on every other base type of the catalog: those its input function reads
# become the type's values (the first two its ordinary ones, all of them its extremes).
GENERIC_LITERALS = (
    "0", "1", "-1", "2147483647", "-2147483648", "9223372036854775807", "1e308", "NaN", "infinity", "-infinity",
    "", "x", "\\", "true", "{}", "[]", "(0,0)", "((0,0),(1,1))", "<(0,0),1>", "(1e308,1e308)", "0/0",
    "FFFFFFFF/FFFFFFFF", "00:00", "24:00", "2000-01-01", "'a' & 'b'", "a:1", "1:1:", "{1,2}", "08:00:2b:01:02:03:04:05",
)

# Policy variants, as YAML flow text per column; ``{a}``/``{b}`` are the type's ordinary values.
VARIANTS: dict[str, str] = {
    "plain": "",
    "bounds": "bounds: [-10, 10], group_by: true, avg: sample_aggregate",
    "categories": "categories: [{a}, {b}], group_by: true",
    "time": "bounds: [2000-01-01, 2000-03-31], group_by: [day, week, month, quarter, year]",
}


def column_name(case: TypeCase, variant: str) -> str:
    return f"{case.name}_{variant}"[:60]


def catalog_types_sql(known: list[str]) -> str:
    """The base types of pg_catalog that are not :data:`CURATED`'s, by name (format_type)."""
    names = ", ".join("'" + name.replace("'", "''") + "'" for name in known)
    return (
        "SELECT pg_catalog.format_type(t.oid, NULL) FROM pg_catalog.pg_type t "
        "WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.typtype = 'b' AND t.typisdefined "
        "AND t.typcategory NOT IN ('A', 'P', 'X') AND t.typname NOT LIKE 'pg\\_%' "
        "AND t.typname NOT IN ('cstring', 'unknown', 'aclitem', 'refcursor', 'gtsvector', 'int2vector', 'oidvector') "
        f"AND pg_catalog.format_type(t.oid, NULL) NOT IN ({names}) ORDER BY 1"
    )


@dataclass(frozen=True)
class Probe:
    """One statement over ``{t}``; its first ``keys`` output columns are GROUP BY keys (never noised)."""

    sql: str
    params: tuple[object, ...] = ()
    keys: int = 0
    role: str = ""
    rowwise: bool = field(default=False, compare=False)  # a WHERE form: one row alone can trip it
    # The SQL dpproxy sends its backend for it, ``{t}`` for the table, when nothing is folded or
    # bound first: a WHERE form's row dependence is then the backend's, checked without the proxy.
    backend: str | None = field(default=None, compare=False)
    case: TypeCase | None = field(default=None, compare=False)  # the type of the column it probes


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


# Typed constants of every built-in type a literal may be cast to, at that type's edges.
_TYPED_CONSTANTS = (
    "CAST('1e400' AS numeric)", "CAST('NaN' AS double precision)", "CAST('1.5' AS real)",
    "CAST('-9223372036854775808' AS bigint)", "CAST('32767' AS smallint)", "CAST('0' AS integer)",
    "CAST('x' AS text)", "CAST('x' AS varchar)", "CAST('x' AS char(2))", "CAST('true' AS boolean)",
    "CAST('00000000-0000-0000-0000-000000000000' AS uuid)", "CAST('\\x00' AS bytea)", "CAST('infinity' AS date)",
    "CAST('-infinity' AS timestamp)", "CAST('2000-01-01 00:00-15' AS timestamptz)", "CAST('24:00' AS time)",
    "CAST('1e-400' AS numeric)", "1e400", "-1e400", "99999999999999999999", "0.5", "(-0)",
)
_PARAMETERS: tuple[object, ...] = (
    0, 2**63 - 1, float("nan"), float("inf"), 1e-320, Decimal("1e400"), Decimal("NaN"), "x", "\\", True,
    dt.date(9999, 12, 31), dt.datetime(2000, 1, 1), dt.datetime(2000, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=-15))),
    dt.time(23, 59), dt.timedelta(days=999999999), uuid.UUID(int=0), b"\\", None,
)
_FOLDED = ("now()", "1 + 1", "current_date - 1", "10 / 4.0", "now() - interval '1 year'", "1e300 * 10")
_OPS = ("=", "<>", "<", "<=", ">", ">=", "BETWEEN", "IN")
# Other columns a column is compared with: one of each family of built-in types.
_PARTNERS = ("integer", "numeric", "float8", "real", "date", "timestamp", "timestamptz", "text", "money", "interval",
             "time", "int4range")


def _compare(column: str, op: str, value: str) -> str:
    if op == "BETWEEN":
        return f"{column} BETWEEN {value} AND {value}"
    if op == "IN":
        return f"{column} IN ({value}, {value})"
    return f"{column} {op} {value}"


def where_roles(case: TypeCase, column: str, partners: dict[str, str], full: bool = True) -> list[Probe]:
    """Every WHERE form on ``column`` (a column of ``case``'s type): literals of its values, and
    when ``full`` typed constants of every built-in type, parameters of every type, folded
    constants and other columns of every family (a catalog type gets the forms on its own values)."""
    probes: list[Probe] = []

    def add(predicate: str, role: str, params: tuple[object, ...] = ()) -> None:
        probes.append(Probe(f"SELECT COUNT(*) FROM {{t}} WHERE {predicate}", params, role=role, rowwise=True))

    for index, value in enumerate([*case.extremes, *case.ordinary]):
        add(_compare(column, _OPS[index % len(_OPS)], _quote(value)), f"{_OPS[index % len(_OPS)]} literal")
    add(f"{column} IS NULL", "IS NULL")
    add(f"lower({column}) = 'x'", "lower() =")
    add(f"{column} = $1", "= parameter str", ("x",))
    if not full:
        return probes
    for index, constant in enumerate(_TYPED_CONSTANTS):
        add(_compare(column, _OPS[index % len(_OPS)], constant), "typed constant")
    for function in ("lower", "upper"):
        add(f"{function}({column}) < CAST('1.5' AS double precision)", f"{function}() < float8")
        add(f"{function}({column}) > CAST('-infinity' AS timestamptz)", f"{function}() > timestamptz")
        add(f"{function}({column}) LIKE 'a%'", f"{function}() LIKE")
    for op in ("LIKE", "NOT ILIKE"):
        add(f"{column} {op} '%a\\%'", op)
    add(f"{column} LIKE $1", "LIKE parameter", ("%a",))
    for index, parameter in enumerate(_PARAMETERS):
        op = "=<"[index % 2]
        add(f"{column} {op} $1", f"{op} parameter {type(parameter).__name__}", (parameter,))
    for folded in _FOLDED:
        add(f"{column} >= {folded}", "folded constant")
    for partner_type, partner in partners.items():
        if partner != column:
            add(f"{column} < {partner}", f"< {partner_type} column")
    return probes


_AGGREGATES = ("COUNT({c})", "COUNT(DISTINCT {c})", "SUM({c})", "AVG({c})", "MIN({c})", "MAX({c})",
               "MODE() WITHIN GROUP (ORDER BY {c})", "SUM(CAST({c} AS double precision))", "AVG(CAST({c} AS numeric))")
_KEYS = ("{c}", "date_trunc('{u}', {c})", "CAST(date_trunc('{u}', {c}) AS date)", "EXTRACT(YEAR FROM {c})",
         "EXTRACT(MONTH FROM {c})", "EXTRACT(DOW FROM {c})", "EXTRACT(WEEK FROM {c})", "CAST({c} AS date)",
         "width_bucket({c}, -10, 10, 4)", "width_bucket({c}, 0.5, 2.5, 3)", "floor(extract(epoch from {c})/86400)*86400",
         "(date_trunc('week', ({c} + INTERVAL '1 day')) + INTERVAL '-1 day')")
_UNITS = ("day", "week", "month", "quarter", "year")


def roles(column: str, key_column: str, full: bool = True) -> list[list[Probe]]:
    """Every aggregate of ``column``, alone and per cell of a GROUP BY over ``key_column`` (a
    declared category key), and every GROUP BY key form over ``column``: in groups whose first
    probe, refused, refuses the rest (an aggregate refused alone is refused per cell; a key
    refused with COUNT is refused with any aggregate and alone). Without ``full`` (a catalog
    type, which takes no bounds or time range) only the roles a text-like column can play:
    COUNT, COUNT(DISTINCT), MODE and GROUP BY the column."""
    groups = []
    for template in _AGGREGATES if full else _AGGREGATES[:2] + _AGGREGATES[6:7]:
        aggregate = template.format(c=column)
        groups.append([Probe(f"SELECT {aggregate} FROM {{t}}", role=template),
                       Probe(f"SELECT {key_column}, {aggregate} FROM {{t}} GROUP BY 1", keys=1, role=f"per cell {template}")])
    for template in _KEYS if full else _KEYS[:1]:
        for unit in _UNITS if "{u}" in template else ("",):
            key = template.format(c=column, u=unit)
            role = template.replace("{u}", unit)
            groups.append([
                Probe(f"SELECT {key} AS k, COUNT(*), COUNT({column}) FROM {{t}} GROUP BY 1", keys=1, role=f"key {role}"),
                Probe(f"SELECT {key} AS k, SUM({column}), AVG({column}) FROM {{t}} GROUP BY 1", keys=1, role=f"key {role} sums"),
                Probe(f"SELECT DISTINCT {key} FROM {{t}}", keys=1, role=f"distinct {role}"),
            ])
    return groups
