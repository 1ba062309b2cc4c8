"""Seeded generator of DP statements and adversarial rows for the neighbouring-database fuzzer.

``Schema`` is the protected table every neighbour shares; ``adversarial_rows`` are the rows that
one neighbour has and the base table has not; ``Case`` is one statement drawn from the whole DP
query language (rewriter/dp_query.py, rewriter/predicates.py), with adversarial literals and
extended-protocol parameters. Everything is a pure function of a ``random.Random``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

__all__ = ["COLUMNS", "DOMAINS", "PINNED", "domain_ddl", "Case", "Column", "adversarial_rows", "generate_case", "policy_columns", "TABLE_DDL"]


@dataclass(frozen=True)
class Column:
    """A column of the fuzzed table: its SQL type, its policy (bounds/categories) and its value pool.

    ``policy`` is extra policy YAML for the column (a time range, a GROUP BY opt-in).
    """

    name: str
    sql_type: str
    numeric: bool
    bounds: tuple[float, float] | None
    categories: tuple[str, ...] | None
    values: tuple[str, ...]  # SQL literals a row or a predicate may hold
    policy: str = ""


_TEXTS = (
    "''", "'\\'", "'abc\\'", "'\\\\'", "'%'", "'_'", "'a%\\'", "'O''Brien'", "'Ünïcödé ß'", "'İı'",
    "'😀'", "' '", "'Male'", "'MALE'", "'male'", "'a'", "'z'", "'\t'", "'" + "x" * 300 + "'",
    "E'\\\\'", "'NaN'", "'1e400'", "'-0'",
    # ~4.5 kB of CJK that compresses poorly: stored out of line (TOAST), read back per compared row
    "'" + "".join(chr(0x4E00 + (k * 7919) % 20000) for k in range(1500)) + "'",
)
COLUMNS: tuple[Column, ...] = (
    # "Ω" has no LATIN1 form: under that client encoding a release that names it is refused
    Column("t", "text", False, None, ("Male", "Female", "", "\\", "Ω"), _TEXTS, "group_by: true"),
    Column("v", "varchar(8)", False, None, ("a", "b"), tuple(v for v in _TEXTS if len(v) <= 10),
           "group_by: true, other: zz"),
    Column("i2", "int2", True, (-5, 5), None,
           ("-32768", "32767", "0", "-5", "5", "6", "-6", "1"), "group_by: true"),
    Column("i4", "int4", True, (0, 100), None,
           ("-2147483648", "2147483647", "0", "100", "101", "-1", "42"),
           "avg: sample_aggregate"),  # an integer column's per-partition mean (rewriter/rewrite.py)
    Column("i8", "int8", True, (-9.2e18, 9.2e18), None,
           ("-9223372036854775808", "9223372036854775807", "0", "9200000000000000000", "-1")),
    Column("f4", "float4", True, (-1.0, 1.0), None,  # integer bounds, but no integer key: GROUP BY f4 is refused
           ("'NaN'", "'Infinity'", "'-Infinity'", "3.4e38", "1e-45", "-0.0", "1.0", "1.0000001", "-1"), "group_by: true"),
    Column("f8", "float8", True, (-1e280, 1e280), None,  # the largest bounds a float8 column may have
           ("'NaN'", "'Infinity'", "'-Infinity'", "1.7976931348623157e308", "5e-324", "1e300", "1e280", "-1e301", "0"),
           "group_by: true, avg: sample_aggregate"),  # a subnormal partition sum over 2 rows underflows a division
    # Subnormal, asymmetric bounds: every value's exact-sum grid point is 0 (mechanisms/fixed_point.py)
    Column("fz", "float8", True, (-1e-310, 3e-310), None,
           ("'NaN'", "'-Infinity'", "5e-324", "-5e-324", "-0.0", "2.2250738585072014e-308", "1e308", "3e-310")),
    Column("n", "numeric", True, (0, 1e20), None,
           # 1e-400: closer to 0 than double precision reaches, where a cast to it fails
           ("'NaN'", "'Infinity'", "1e-400", "'-Infinity'", "1e100", "-1e100", "0.000000000000000000001", "1e20",
            "100000000000000000001", "7",
            # 1,000 digits: above the bounds, and within them with a fraction no double holds
            "1" + "0" * 999, "0." + "3" * 998 + "7"),
           "group_by: true, avg: sample_aggregate"),
    Column("b", "bool", False, None, None, ("true", "false")),
    Column("d", "date", False, None, None,
           ("'-infinity'", "'infinity'", "'4713-01-01 BC'", "'5874897-12-31'", "'2000-02-29'", "'1970-01-01'",
            "'2000-12-31'", "'2001-01-01'", "'2000-06-15'"), "bounds: [2000-01-01, 2000-12-31], group_by: [month, week]"),
    Column("ts", "timestamp", False, None, None,
           ("'-infinity'", "'infinity'", "'4713-01-01 00:00 BC'", "'294276-12-31 23:59:59'", "'2000-02-29 12:00'",
            "'1970-01-01'", "'1999-06-01 00:00'", "'2001-05-31 23:59:59.999999'", "'2000-07-04 08:00'"),
           "bounds: [1999-06-01, 2001-05-31], group_by: true"),
    # An instant: its day and year buckets move with the session's TimeZone, epoch buckets do not.
    Column("tz", "timestamptz", False, None, None,
           ("'-infinity'", "'infinity'", "'4713-01-01 00:00+00 BC'", "'294276-12-31 23:59:59+00'",
            "'2000-02-29 23:59:59.999999+14'", "'1999-06-01 00:00+00'", "'1999-05-31 23:59:59.999999+00'",
            "'2001-05-31 23:00-12'", "'2000-03-26 01:30+00'", "'1970-01-01 00:00+00'", "'2000-10-29 01:30+00'"),
           "bounds: [1999-06-01, 2001-05-31], group_by: [day, month, year]"),
    # Arrays compare element by element, looking up the elements' equality only when two
    # arrays of one shape meet (point has none): a comparison must not depend on the rows.
    Column("pa", "point[]", False, None, None, ("""'{"(0,0)"}'""", "'{}'", """'{"(1,2)","(3,4)"}'""", "'{NULL}'")),
    # A declared scale: its SUM, MIN and MAX print two fraction digits whatever the rows (proxy/dp/answer.py)
    Column("nm", "numeric(8,2)", True, (-1000, 1000), None,
           ("'NaN'", "999999.99", "-0.005", "0.01", "1000", "12.345", "-1000.004"), "group_by: true"),
    # A domain over numeric (DOMAINS), compared as its base type is: never converted to a float per
    # row, where 1e400 and 1e-400 fail (it was judged by the domain's OID). Not aggregated: no bounds.
    Column("dn", "nbf_numeric_domain", False, None, None,
           ("1e400", "1e-400", "'NaN'", "'-Infinity'", "0", "1.5", "CAST(1.5 AS double precision)", "CAST(2 AS real)",
            "-1e100")),
)
DOMAINS = {"nbf_numeric_domain": "numeric"}
"""The domains COLUMNS' types name, each over its base type: :func:`domain_ddl` creates them."""


def domain_ddl() -> list[str]:
    """The statements that create :data:`DOMAINS` where they do not exist yet: run before TABLE_DDL."""
    return [f"DO $$ BEGIN CREATE DOMAIN {name} AS {base}; EXCEPTION WHEN duplicate_object THEN NULL; END $$"
            for name, base in DOMAINS.items()]
_BY_NAME = {c.name: c for c in COLUMNS}
TABLE_DDL = ", ".join(f"{c.name} {c.sql_type}" for c in COLUMNS)
# Literals that fit no column or sit at type limits; used against any column.
_WILD = (
    "NULL", "''", "'\\'", "'NaN'", "'Infinity'", "'-Infinity'", "1e400", "-1e400", "1e-400", "99999999999999999999",
    "32768", "2147483648", "9223372036854775808", "-9223372036854775809", "3.5e38", "'abc'", "'2000-13-45'",
    "0.5", "-0", "'😀'", "TRUE", "FALSE", "'t'",
)


# Row-independent expressions that dpproxy folds before the query runs (rewriter/constants.py), by
# the kind of column they are compared with; some fail (a date out of range, a division by zero),
# which must fail the same way whatever the rows. "$" is replaced by a fresh parameter.
_FOLDED_NUMBERS = ("1 + 1", "0.5 * 3", "10 / 3.0", "1 / 0", "1 / 3.0", "CAST(NULL AS integer) + 1", "2147483647 + 1", "1e300 * 1e300", "- 5 + 0",
                   "round(2.5)", "abs(-3)", "$ + 1", "CAST($ AS numeric) * 2", "mod(7, 3)")
_FOLDED_TIMES = (
    "now()", "now() - interval '1 year'", "current_date - 30", "DATE '2000-02-29' + 1", "date_trunc('month', now())",
    "TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')", "to_date('2000-13-45', 'YYYY-MM-DD')",
    "TIMESTAMP '294276-12-31' + interval '1 day'", "DATE '5874897-12-31' + 0", "to_timestamp(0)",
    "CAST('infinity' AS timestamptz) - interval '1 day'", "localtimestamp", "to_timestamp($, 'YYYY-MM-DD')",
    "CAST($ AS date) + 1", "make_date(2000, 2, 30)",
)
_FOLDED_PARAMS = ("2000-02-29", "2000-13-45", "1", "-1", "abc", None)
# A percentile's bound fraction: a double, a numeric, an unknown-typed text, integers; and refused ones.
# (A str is bound as text, the others in binary: both readings, proxy/dp/percentile_params.py.)
_FRACTION_PARAMS: tuple[object, ...] = (0.5, Decimal("0.25"), "0.9", 0, 1, 1.5, None, float("nan"), "abc", " 0.1 ", "-Infinity")


def policy_columns() -> str:
    """The ``columns:`` mapping of the test policy, as YAML flow text."""
    parts = []
    for column in COLUMNS:
        extra = [column.policy] if column.policy else []
        if column.bounds is not None:
            parts.append(f"{column.name}: {{{', '.join([f'bounds: [{column.bounds[0]!r}, {column.bounds[1]!r}]', *extra])}}}")
        elif column.categories is not None:
            quoted = ", ".join('"' + c.replace("\\", "\\\\") + '"' for c in column.categories)
            parts.append(f"{column.name}: {{{', '.join([f'categories: [{quoted}]', *extra])}}}")
        elif extra:
            parts.append(f"{column.name}: {{{extra[0]}}}")
    return "{" + ", ".join(parts) + "}"


def adversarial_rows(rng: random.Random, count: int) -> list[str]:
    """``count`` rows as VALUES tuples; the first ones push every column to an extreme at once."""
    rows = []
    for index in range(count):
        values = []
        for column in COLUMNS:
            if index < 3:
                value = column.values[index % len(column.values)]
            else:
                value = "NULL" if rng.random() < 0.15 else rng.choice(column.values)
            values.append(f"({value})::{column.sql_type}" if value != "NULL" else "NULL")
        rows.append("(" + ", ".join(values) + ")")
    return rows


@dataclass(frozen=True)
class Case:
    """One statement over the table ``{table}``; ``params`` are bound as $1.. when not empty."""

    sql: str
    params: tuple[object, ...]
    binary: bool = False  # extended protocol and binary results even without parameters
    # Per output column: is its numeric scale fixed by the data (SUM), not by the noise?
    fixed_scale: tuple[bool, ...] = ()
    # Leading output columns that are GROUP BY keys: compared by value (keys are never noised).
    keys: int = 0
    # The session's TimeZone for the statement (day and year keys of an instant move with it).
    timezone: str = "UTC"
    # The session's client_encoding: a release whose labels the encoding lacks is refused.
    encoding: str = "UTF8"
    # Parsed as a named statement and described (ParameterDescription, RowDescription) first.
    prepared: bool = False
    # > 0: sent as raw extended-protocol messages, each Execute fetching at most this many rows.
    row_limit: int = 0
    # Run twice on each table: the second is a repeat, answered from the store (proxy/dp/repeats.py).
    repeat: bool = False


_ALIASES = (" AS a", ' AS "Ünï cödé"', " x", ' AS "a""b"')


def _unaliased(output: str) -> str:
    """``output`` (an aggregate, maybe with one of :data:`_ALIASES` or named by :func:`_named`) without its name."""
    for alias in (*_ALIASES, " AS a2"):
        output = output.removesuffix(alias)
    return output


def _named(output: str, name: str = "a") -> str:
    """``output`` (an aggregate, maybe with one of :data:`_ALIASES`) named ``name``."""
    return f"{_unaliased(output)} AS {name}"


_PARAM_VALUES: tuple[object, ...] = (
    "\\", "abc\\", "", "%", "NaN", "Infinity", "-Infinity", 0, -1, 32768, 2**31, 2**63 - 1, -(2**63), 10**30,
    float("nan"), float("inf"), float("-inf"), 1e-320, 1.5, "😀", "Male", "2000-02-29", True, None,
    # each type psycopg binds: numeric, date, timestamp, timestamptz, interval, bytea, an array
    Decimal("12.345"), Decimal("NaN"), date(2000, 2, 29), datetime(2000, 7, 4, 8), datetime(2000, 7, 4, 8, tzinfo=UTC),
    timedelta(days=1), b"ab", [1, 2],
)


class _Builder:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.params: list[object] = []

    def literal(self, column: Column | None) -> str:
        rng = self.rng
        roll = rng.random()
        if roll < 0.12:
            self.params.append(rng.choice(_PARAM_VALUES))
            return f"${len(self.params)}"
        if roll < 0.2:
            return self.folded(column)
        if column is None or roll < 0.3:
            return rng.choice(_WILD)
        value = rng.choice(column.values)
        if rng.random() < 0.2:
            value = f"{value}::{column.sql_type}" if rng.random() < 0.5 else f"({value})"
        return value

    def folded(self, column: Column | None) -> str:
        """A foldable expression for ``column``'s kind (any kind for a text or bool column: refused)."""
        pool = _FOLDED_NUMBERS if column is not None and column.numeric else _FOLDED_TIMES
        if self.rng.random() < 0.15:
            pool = _FOLDED_NUMBERS + _FOLDED_TIMES
        text = self.rng.choice(pool)
        if "$" in text:  # one parameter at most
            self.params.append(self.rng.choice(_FOLDED_PARAMS))
            text = text.replace("$", f"${len(self.params)}")
        return text

    def fraction_parameter(self) -> str:
        """A percentile's fraction as a fresh parameter (proxy/dp/percentile_params.py): answered,
        or refused before the charge (outside [0, 1], NULL, NaN, not a number)."""
        self.params.append(self.rng.choice(_FRACTION_PARAMS))
        return f"${len(self.params)}"

    def column_side(self) -> tuple[str, Column]:
        column = self.rng.choice(COLUMNS)
        name = column.name if self.rng.random() < 0.85 else f"{{table}}.{column.name}"
        if not column.numeric and self.rng.random() < 0.25:
            name = f"{self.rng.choice(['lower', 'upper'])}({name})"
        return name, column

    def pattern(self) -> str:
        rng = self.rng
        if rng.random() < 0.1:
            # a NULL pattern, and one of a type LIKE does not take (proxy/dp/folding.py)
            self.params.append(rng.choice(["\\", "a%\\", "%", "_", "", None, 5]))
            return f"${len(self.params)}"
        body = rng.choice(["", "a", "%", "_", "Ma%", "%le", "\\%", "\\_", "ß", "İ", "%Ü%", "O''B%", "\\\\"])
        tail = rng.choice(["", "", "\\", "%\\", "%"])
        return f"'{body}{tail}'"

    def atom(self) -> str:
        rng = self.rng
        left, column = self.column_side()
        form = rng.randrange(9)
        if form <= 2:
            op = rng.choice(["=", "<>", "!=", "<", "<=", ">", ">="])
            if rng.random() < 0.15:
                other, _ = self.column_side()
                return f"{left} {op} {other}"
            if rng.random() < 0.1:
                return f"{self.literal(column)} {op} {left}"
            return f"{left} {op} {self.literal(column)}"
        if form == 3:
            neg = rng.choice(["", "NOT "])
            return f"{left} {neg}BETWEEN {self.literal(column)} AND {self.literal(column)}"
        if form == 4:
            items = ", ".join(self.literal(column) for _ in range(rng.randint(1, 4)))
            return f"{left} {rng.choice(['', 'NOT '])}IN ({items})"
        if form == 5:
            return f"{left} IS {rng.choice(['', 'NOT '])}NULL"
        if form in (6, 7):
            if rng.random() < 0.8:
                left = rng.choice(["t", "v", "lower(t)", "upper(v)", "{table}.t"])
            op = rng.choice(["LIKE", "NOT LIKE", "ILIKE", "NOT ILIKE"])
            return f"{left} {op} {self.pattern()}"
        if rng.random() < 0.1:  # forms outside the language: refused from the text alone
            return rng.choice([f"{left} SIMILAR TO {self.pattern()}", f"{left} ~ {self.pattern()}",
                               f"{left} COLLATE \"C\" < 'b'", f"{left} < 'b' COLLATE \"POSIX\"",
                               f"{left} LIKE {self.pattern()} ESCAPE ''", f"{left} + 1 > 0",
                               f"{left}::text = ''", f"length({left}) > 1"])
        if rng.random() < 0.5:  # a boolean column as a condition; another column is refused from the text
            return rng.choice(["b", "NOT b", "{table}.b", "b IS TRUE", "b IS NOT TRUE", "b IS FALSE", "NOT b IS NOT FALSE",
                               "(i4 > 0) IS TRUE", "i4", "t IS TRUE"])
        return rng.choice(["TRUE", "FALSE"])

    def predicate(self, depth: int) -> str:
        rng = self.rng
        if depth <= 0 or rng.random() < 0.35:
            return self.atom()
        shape = rng.randrange(4)
        if shape == 0:
            return f"NOT ({self.predicate(depth - 1)})"
        if shape == 1:
            return f"({self.predicate(depth - 1)})"
        joiner = " AND " if shape == 2 else " OR "
        return joiner.join(self.predicate(depth - 1) for _ in range(rng.randint(2, 3)))

    def aggregate(self) -> tuple[str, bool]:
        """An output column, and whether its scale is fixed by the data (SUM) rather than the noise."""
        rng = self.rng
        if rng.random() < 0.25:
            expression, fixed = self.conditional()
        else:
            expression, fixed = self._plain_aggregate()
        if rng.random() < 0.3:
            expression += rng.choice(_ALIASES)
        return expression, fixed

    def conditional(self) -> tuple[str, bool]:
        """A conditional aggregate (rewriter/conditional.py): a FILTER, one of the CASE forms BI
        tools send, or a near miss that is refused from the text alone; and whether its scale is fixed."""
        rng = self.rng
        p = self.predicate(rng.randint(0, 2))
        numeric = rng.choice([c for c in COLUMNS if c.numeric]).name
        zero, one = rng.choice(["0", "0.0"]), rng.choice(["1", "1.0"])
        forms = [
            (f"COUNT(CASE WHEN {p} THEN {rng.choice(['1', chr(39) + 'x' + chr(39), 'TRUE'])} END)", False),
            (f"COUNT(CASE WHEN {p} THEN 1 ELSE NULL END)", False),
            (f"COUNT({rng.choice(['', 'DISTINCT '])}CASE WHEN {p} THEN {rng.choice(COLUMNS).name} END)", False),
            # a numeric count prints the fraction digits of its constants, whatever the rows
            (f"SUM(CASE WHEN {p} THEN {one} ELSE {zero} END)", True),
            (f"SUM(CASE WHEN {p} THEN {one} END)", True),
            (f"SUM(CASE WHEN {p} THEN {numeric} ELSE {zero} END)", numeric != "n"),
            (f"{rng.choice(['SUM', 'AVG', 'MIN', 'MAX', *_VARIANCES])}(CASE WHEN {p} THEN {numeric} END)", False),
            (f"MODE() WITHIN GROUP (ORDER BY CASE WHEN {p} THEN {rng.choice(['t', 'v'])} END)", False),
            # Tableau's IIF(p, v, e): CASE WHEN p THEN v WHEN NOT p THEN e ELSE NULL END
            (f"SUM((CASE WHEN ({p}) THEN {rng.choice([one, numeric])} WHEN NOT ({p}) THEN {zero} ELSE NULL END))", False),
            (f"COUNT((CASE WHEN ({p}) THEN 1 WHEN NOT ({p}) THEN NULL ELSE NULL END))", False),
            # indicator sums and shares (Superset, Metabase, Looker): SUM(CAST(p AS INT)), AVG(CASE ... 1 ELSE 0)
            (f"SUM({rng.choice([f'CAST(({p}) AS INT)', f'({p})::int', f'({p})::integer', 'b::int', 'CAST(b AS int4)'])})",
             False),
            (f"AVG(CASE WHEN {p} THEN {one} ELSE {zero} END)", False),
            (f"AVG({rng.choice([f'CAST(({p}) AS INT)', f'({p})::int', 'b::int'])})", False),
            (f"AVG((CASE WHEN ({p}) THEN {one} WHEN NOT ({p}) THEN {zero} ELSE NULL END))", False),
            (rng.choice([f"SUM(CAST(({p}) AS BIGINT))", f"SUM(({p})::numeric)", f"MAX(({p})::int)", "COUNT(DISTINCT b::int)",
                         f"AVG(CASE WHEN {p} THEN 1 END)", f"AVG(CASE WHEN {p} THEN 0 ELSE 1 END)"]), False),
            # near misses: other THEN/ELSE values, several WHENs, arithmetic
            (rng.choice([f"SUM(CASE WHEN {p} THEN 2 ELSE 0 END)", f"COUNT(CASE WHEN {p} THEN 1 ELSE 0 END)",
                         f"SUM(CASE WHEN {p} THEN {numeric} + 1 END)", f"AVG(CASE WHEN {p} THEN {numeric} ELSE 0 END)",
                         f"SUM(CASE WHEN {p} THEN 1 WHEN {numeric} > 0 THEN 2 END)",
                         f"COUNT(CASE {numeric} WHEN 1 THEN 1 END)"]), False),
        ]
        if rng.random() < 0.4:
            expression, fixed = self._plain_aggregate()
            return f"{expression} FILTER (WHERE {p})", fixed
        expression, fixed = rng.choice(forms)
        if rng.random() < 0.15:  # a CASE form FILTERed as well: a share's two conditions (conditional.py)
            expression += f" FILTER (WHERE {self.predicate(0)})"
        return expression, fixed

    def _plain_aggregate(self) -> tuple[str, bool]:
        rng = self.rng
        kind = rng.randrange(8)
        numeric = [c for c in COLUMNS if c.numeric]
        if kind == 0:
            expression = "COUNT(*)"
        elif kind == 1:
            expression = f"COUNT({rng.choice(COLUMNS).name})"
            if rng.random() < 0.2:  # a count of a cast: answered where the cast keeps every non-NULL value
                expression = f"COUNT(CAST({rng.choice(numeric).name} AS {rng.choice(_CASTS)}))"
        elif kind == 6 and rng.random() < 0.4:
            expression = _percentile(rng, rng.choice(numeric).name, self.fraction_parameter)
        elif kind == 6:
            categorical = [c for c in COLUMNS if c.categories]
            expression = f"MODE() WITHIN GROUP (ORDER BY {rng.choice(categorical).name})"
        elif kind == 7:
            expression = _variance(rng, rng.choice(numeric).name)
        else:
            function = ("SUM", "AVG", "MIN", "MAX", "SUM")[kind - 2]
            column = rng.choice(numeric).name
            if rng.random() < 0.2:  # Tableau's casts: answered where they change no value, refused otherwise
                column = f"CAST({column} AS {rng.choice(_CASTS)})"
            expression = f"{function}({column})"
        return expression, _fixed_scale(expression)


_INTEGER_SUM = re.compile(r"^(SUM|AVG|MIN|MAX)\((i2|i4|i8)\)")
_COUNT_FILTERED = re.compile(r"^COUNT\(\*\) FILTER \(WHERE (.*)\)$")
_FRACTION = re.compile(r"^(PERCENTILE_(?:CONT|DISC)\()0(\.\d+)\)")


def _respelled(output: str) -> str:
    """``output`` spelled as another aggregate with the same release (proxy/dp/release_units.py),
    where it has such a spelling: COUNT(1) for COUNT(*), a CASE for a counted FILTER, a widening
    cast of an integer column, a fraction without its leading zero; else ``output`` itself. A pure
    function of the text: the generator's random stream is the same with or without it."""
    for alias in _ALIASES:
        output = output.removesuffix(alias)
    for pattern, spelling in ((_COUNT_FILTERED, r"COUNT(CASE WHEN \1 THEN 1 END)"),
                              (_INTEGER_SUM, r"\1(CAST(\2 AS numeric))"), (_FRACTION, r"\1\2)")):
        if pattern.search(output):
            return pattern.sub(spelling, output, count=1)
    return output.replace("COUNT(*)", "COUNT(1)", 1) if output.startswith("COUNT(*)") else output


_VARIANCES = ("STDDEV", "STDDEV_SAMP", "STDDEV_POP", "VARIANCE", "VAR_SAMP", "VAR_POP")


def _variance(rng: random.Random, column: str) -> str:
    """A variance or standard deviation of ``column`` (mechanisms/variance.py), sometimes a form
    refused from the text alone (DISTINCT, a text column, two arguments, an expression), sometimes
    an expression over two of its family or one and the column's AVG (one release of the moments,
    proxy/dp/release_units.py; a FILTER the caller adds restricts the second alone, which makes it a
    release of its own)."""
    function = rng.choice(_VARIANCES)
    if rng.random() < 0.15:
        return rng.choice([f"{function}(DISTINCT {column})", f"{function}(t)", f"{function}({column}, {column})",
                           f"{function}({column} * 2)", f"{function}(b)"])
    if rng.random() < 0.2:  # or an AVG of the column, read from the same moments when the statement is small
        return f"{function}({column}) - {rng.choice((*_VARIANCES, 'AVG'))}({column})"
    return f"{function}({column})"


def _percentile(rng: random.Random, column: str, parameter: Callable[[], str] | None = None) -> str:
    """PERCENTILE_CONT/PERCENTILE_DISC of ``column`` (mechanisms/quantile.py), maybe DESC, with a
    fraction that is answered or one refused from the text alone (outside [0, 1], NULL), or an
    array of fractions (answered, also per cell; refused when empty or with a NULL element), or,
    where ``parameter`` gives one, sometimes a bound parameter."""
    fraction = rng.choice(["0.5", "0.5", "0.1", "0.9", "0", "1", "0.25", "1.5", "-0.1", "NULL", "ARRAY[0.5]",
                           "ARRAY[0.25, 0.5, 0.75]", "'{0, 0.9, 1}'::float8[]", "ARRAY[0.5, NULL]",
                           "ARRAY[]::float8[]", "CAST(0.5 AS double precision)", "(0.9)", "0.5::numeric",
                           "0.333333333333333333", "0.00000000000000000001"])  # b = 10^18, 10^20 in the scores
    if parameter is not None and rng.random() < 0.35:
        fraction = parameter()
    order = rng.choice(["", "", " DESC", " ASC NULLS FIRST"])
    return f"PERCENTILE_{rng.choice(['CONT', 'DISC'])}({fraction}) WITHIN GROUP (ORDER BY {column}{order})"


def _fixed_scale(expression: str) -> bool:
    """Whether the schema fixes the numeric scale of an output: SUM of an integer column, SUM,
    MIN or MAX of ``nm`` (numeric(8,2)). ``n`` is numeric without a declared scale, so its noised
    SUM prints as many digits as the value needs (repr of a float: a fraction digit once the
    noise lands below 1e16)."""
    if expression.startswith(("SUM(nm)", "MIN(nm)", "MAX(nm)")):
        return True
    return expression.startswith("SUM") and not expression.startswith(("SUM(n)", "SUM(CAST(n ")) and " THEN n " not in expression


_CASTS = ("numeric", "double precision", "bigint", "real", "integer", "numeric(6, 1)")


# GROUP BY keys the fuzz policy opts in, and forms it does not (refused from the text alone).
_KEYS = ("t", "v", "i2", "date_trunc('month', d)", "date_trunc('week', d)", "date_trunc('quarter', ts)",
         "date_trunc('month', ts)", "width_bucket(f8, -1, 1, 5)", "width_bucket(n, 0, 100, 3)",
         "width_bucket(f4, 0, 1, 2)", "width_bucket(i8, -10, 10, 4)", "width_bucket(i4, 100, 0, 3)",
         "width_bucket(nm, -1000, 1000, 4)", "width_bucket(nm, 0.5, -0.5, 2)",
         # bins of an integer column that opts in (group_keys.py: no NaN guard on an integer)
         "width_bucket(i2, -5, 5, 2)", "width_bucket(i2, 5, -5, 3)",
         "CAST(date_trunc('month', d) AS date)", "CAST(t AS text)", "v::varchar",
         "EXTRACT(YEAR FROM ts)", "CAST(EXTRACT(YEAR FROM ts) AS integer)",
         # Grafana's $__timeGroup: epoch buckets of whole days (ts opts day in)
         "floor(extract(epoch from ts)/604800)*604800", "floor(extract(epoch from ts)/2592000)*2592000",
         # Tableau's truncated casts and YEAR(date); date_part's double precision year
         "date_trunc('month', CAST(ts AS date))", "CAST(date_trunc('week', CAST(d AS timestamp)) AS date)",
         "date_trunc('quarter', ts::timestamptz)", "date_part('year', ts)", "CAST(TRUNC(EXTRACT(YEAR FROM ts)) AS integer)",
         # ... on an instant (read in UTC whatever the TimeZone), and the day and year keys of one
         "floor(extract(epoch from tz)/86400)*86400", "floor(extract(epoch from tz)/172800)*172800",
         "(floor((extract(epoch from tz)/(86400)))*(86400))", "date_trunc('day', tz)", "EXTRACT(YEAR FROM tz)",
         "date_trunc('year', tz)::date", "floor(extract(epoch from ts)/31536000000)*31536000000",
         # date keys that are functions of an opted-in bucket (rewriter/date_parts.py), alone or
         # beside another key over the same column (their cells are the tuples the range gives)
         "EXTRACT(MONTH FROM ts)", "date_part('quarter', ts)", "CAST(extract(dow from ts) AS integer) + 1",
         "EXTRACT(ISODOW FROM tz)", "date_part('quarter', tz)", "EXTRACT(DOY FROM tz)", "EXTRACT(DAY FROM tz)",
         "EXTRACT(WEEK FROM d)", "CAST(TRUNC(EXTRACT(MONTH FROM d)) AS INTEGER)", "EXTRACT(QUARTER FROM d)",
         "CAST(extract(month from CAST(d AS timestamp)) AS integer)", "EXTRACT(WEEK FROM tz)",
         "(date_trunc('week', (ts + INTERVAL '1 day')) + INTERVAL '-1 day')",
         "CAST((DATE_TRUNC('day', CAST(tz AS DATE)) + (-EXTRACT(DOW FROM tz) * INTERVAL '1 DAY')) AS DATE)",
         "CAST(tz AS date)", "CAST(ts AS date)", "EXTRACT(YEAR FROM d)",
         "CASE WHEN mod(((CAST(extract(dow from tz) AS integer) + 1) + 6), 7) = 0 THEN 7 "
         "ELSE mod(((CAST(extract(dow from tz) AS integer) + 1) + 6), 7) END",
         # units nested in a listed one (d lists month and week: year; tz day and month: week, quarter)
         "date_trunc('year', d)", "date_trunc('quarter', d)", "date_trunc('year', CAST(d AS timestamp))",
         "CAST(date_trunc('quarter', d) AS date)", "date_trunc('week', tz)", "date_trunc('quarter', tz)",
         "DATE_TRUNC('QUARTER', CAST(tz AS DATE))",
         # Metabase's numeric binning (rewriter/floor_bins.py): numeric, integer-division, float4 and
         # double precision arithmetic; W > 1 over f8's subnormal values (an underflow in PostgreSQL)
         "((floor(((i2 - -5.0) / 2.5)) * 2.5) + -5.0)", "floor((i2 - 1) / 3) * 3 + 1", "floor(i2)",
         "(floor((f4 / 0.25)) * 0.25)", "((floor(((f4 - 0.1) / 0.3)) * 0.3) + 0.1)",
         "(floor((f8 / 1e279)) * 1e279)", "((floor(((f8 - 5e278) / 2e279)) * 2e279) + 5e278)",
         "(floor((n / 1e19)) * 1e19)", "((floor(((nm - 12.5) / 250.0)) * 250.0) + 12.5)")
# Several DATE_TRUNC keys over one column: one joint factor, the tuples the range gives.
_JOINT_KEYS = (("date_trunc('year', d)", "date_trunc('month', d)"), ("date_trunc('month', d)", "date_trunc('week', d)"),
               ("EXTRACT(YEAR FROM ts)", "date_trunc('month', ts)"), ("date_trunc('quarter', ts)", "date_trunc('week', ts)"),
               ("date_trunc('year', tz)", "date_trunc('quarter', tz)", "date_trunc('week', tz)"),
               ("date_trunc('month', tz)", "date_trunc('day', tz)"))
_REFUSED_KEYS = ("b", "date_trunc('hour', ts)", "width_bucket(f8, 1, 1, 5)", "i4 + 1", "lower(t)",
                 "date_trunc('day', d)", "f8", "date_trunc('day', ts)", "f4",
                 "floor(extract(epoch from ts)/3600)*3600", "floor(extract(epoch from d)/86400)*86400",
                 "CAST(i4 AS text)", "CAST(t AS varchar(1))", "EXTRACT(DAY FROM d)",
                 "date_trunc('month', CAST(ts AS timestamp(0)))", "date_trunc('day', CAST(d AS timestamp))",
                 "(date_trunc('week', (d + INTERVAL '1 day')) + INTERVAL '-1 day')", "EXTRACT(HOUR FROM tz)",
                 "ts", "d", "EXTRACT(DOW FROM d) + 1", "date_trunc('week', ts + INTERVAL '2 day') - INTERVAL '2 day'",
                 "floor(date_part('epoch', ts)/604800)*604800",
                 "floor(extract(epoch from tz)/3600)*3600", "floor(extract(epoch from tz)/864000000000)*864000000000",
                 "date_trunc('hour', tz)", "floor(extract(epoch from tz)/86400)",
                 "date_trunc('day', tz, 'UTC')", "extract(epoch from tz)",
                 # binning with W ≤ 0, a non-literal W, over a column not opted in, past max_cells
                 "(floor((f8 / 0)) * 0)", "(floor((f8 / i2)) * i2)", "(floor((i4 / 10)) * 10)",
                 "(floor((n / 1e10)) * 1e10)")


def _grouped_case(builder: _Builder) -> Case:
    """A GROUP BY over declared keys (issue 19): keys first, then aggregates per cell; or keys only
    (a filter's list of values), maybe as SELECT DISTINCT."""
    rng = builder.rng
    keys = list(rng.choice(_JOINT_KEYS)) if rng.random() < 0.08 else rng.sample(_KEYS, rng.choice([1, 1, 2]))
    if rng.random() < 0.08:
        keys[0] = rng.choice(_REFUSED_KEYS)
    numeric = [c.name for c in COLUMNS if c.numeric]
    aggregates = []
    # A filter's list of values: keys without aggregates (answered with the declared keys, ε 0),
    # also as SELECT DISTINCT of them.
    keys_only = rng.random() < 0.2
    for _ in range(0 if keys_only else rng.randint(1, 3)):
        kind = rng.randrange(9)
        aggregates.append(
            ["COUNT(*)", f"COUNT({rng.choice(COLUMNS).name})", f"COUNT(DISTINCT {rng.choice(COLUMNS).name})",
             f"SUM({rng.choice(numeric)})", f"AVG({rng.choice(numeric)})", f"SUM({rng.choice(numeric)})",
             f"MODE() WITHIN GROUP (ORDER BY {rng.choice(['t', 'v'])})", f"MIN({rng.choice(numeric)})",
             "SUM(1)" if rng.random() < 0.5 else f"AVG(CAST({rng.choice(numeric)} AS {rng.choice(_CASTS)}))"][kind])
        if kind == 6 and rng.random() < 0.4:  # a percentile per cell, of a bounded numeric column
            aggregates[-1] = _percentile(rng, rng.choice(numeric))
        elif kind in (3, 4) and rng.random() < 0.3:  # a variance per cell
            aggregates[-1] = _variance(rng, rng.choice(numeric))
        if rng.random() < 0.2:  # a conditional metric per cell (rewriter/conditional.py)
            aggregates[-1] = (f"{aggregates[-1]} FILTER (WHERE {builder.predicate(rng.randint(0, 1))})"
                              if rng.random() < 0.5 else builder.conditional()[0])
    if aggregates and rng.random() < 0.1:  # a metric asked twice per cell: one release (answer.py's notice says so)
        aggregates.append(rng.choice(aggregates))
    positional = rng.random() < 0.4
    distinct = keys_only and rng.random() < 0.4
    if not distinct and rng.random() < 0.25:
        # Metabase's "source" wrapper: the keys computed inside it (a WHERE there too), grouped above
        inner = f" WHERE {builder.predicate(rng.randint(0, 2))}" if rng.random() < 0.5 else ""
        computed = ", ".join(f'{key} AS "k{i}"' for i, key in enumerate(keys))
        outputs = [f'"source"."k{i}" AS "k{i}"' for i in range(len(keys))]
        sql = f'SELECT {", ".join(outputs + aggregates)} FROM (SELECT {computed}, * FROM {{table}}{inner}) AS "source"'
        if rng.random() < 0.5:
            sql += " WHERE " + builder.predicate(rng.randint(0, 2)).replace("{table}.", '"source".')
        sql += " GROUP BY " + ", ".join(str(i + 1) if positional else f'"source"."k{i}"' for i in range(len(keys)))
    else:
        aliased = [rng.random() < 0.4 for _ in keys]
        named = [f"{key} AS k{i}" if alias else key for i, (key, alias) in enumerate(zip(keys, aliased))]
        sql = f"SELECT {'DISTINCT ' if distinct else ''}{', '.join(named + aggregates)} FROM {{table}}"
        narrowing = _narrowing(builder, keys)
        if narrowing:
            sql += f" WHERE {narrowing}"
        elif rng.random() < 0.7:
            sql += f" WHERE {builder.predicate(rng.randint(0, 2))}"
        if not distinct:
            by_alias = rng.random() < 0.3  # GROUP BY an output's name (dp_query.py)
            sql += " GROUP BY " + ", ".join(
                str(i + 1) if positional else f"k{i}" if by_alias and alias else key
                for i, (key, alias) in enumerate(zip(keys, aliased)))
    if not distinct and rng.random() < 0.1:
        sql += " HAVING COUNT(*) IS NOT NULL"
    elif not distinct and '"source"' not in sql and rng.random() < 0.1:
        # post-processing over the keys only (a date part computed from its cells' representatives)
        sql += f" HAVING {rng.choice(keys)} IS NOT NULL"
    if rng.random() < 0.3:
        sql += " ORDER BY 1" + rng.choice(["", " DESC"])
    elif not distinct and '"source"' not in sql and rng.random() < 0.1:
        sql += f" ORDER BY {rng.choice(keys)} DESC"
    if rng.random() < 0.15:
        sql += rng.choice([" LIMIT 0", " LIMIT 3", " LIMIT 1 OFFSET 2", " OFFSET 1"])
    fixed = tuple([False] * len(keys) + [_fixed_scale(a) for a in aggregates])
    return Case(sql, tuple(builder.params), rng.random() < 0.2, fixed, keys=len(keys), timezone=rng.choice(_ZONES))


# Times inside the columns' declared ranges, and folded ones: a WHERE of them on a time key's
# column narrows its cells to the buckets the range touches (proxy/dp/narrowing.py).
_IN_RANGE = {
    "d": ("'2000-03-15'", "DATE '2000-07-01'", "'2000-12-31'", "'2000-01-01 12:00'", "now() - interval '30 years'", "'1999-01-01'"),
    "ts": ("'2000-02-29 12:00'", "TIMESTAMP '2000-07-04 08:00'", "'2001-05-31'", "'1999-05-01'", "to_timestamp(0)",
           "'infinity'"),
    "tz": ("'2000-02-29 23:00+14'", "TIMESTAMPTZ '2000-10-29 01:30+00'", "'1999-06-01 00:00-12'", "'2001-05-31 23:59+00'",
           "make_date(2000, 3, 26)", "'-infinity'"),
}


def _narrowing(builder: _Builder, keys: list[str]) -> str:
    """Sometimes a range on the column of the first time key among ``keys``: ``col >= a AND col < b``,
    maybe with another condition, a parameter, or one side only; "" when there is none."""
    rng = builder.rng
    columns = [name for key in keys for name in _IN_RANGE if re.search(rf"\b{name}\b", key)]
    if not columns or rng.random() < 0.5:
        return ""
    column = columns[0]
    lo, hi = rng.choice(_IN_RANGE[column]), rng.choice(_IN_RANGE[column])
    if rng.random() < 0.15:
        builder.params.append(rng.choice([date(2000, 6, 1), datetime(2000, 7, 4, 8), datetime(2000, 7, 4, 8, tzinfo=UTC),
                                          "2000-06-01", None]))
        lo = f"${len(builder.params)}"
    parts = rng.choice([[f"{column} >= {lo}", f"{column} < {hi}"], [f"{column} > {lo}"], [f"{column} <= {hi}"],
                        [f"{column} BETWEEN {lo} AND {hi}"], [f"{column} >= {lo}", f"{column} <= {hi}", f"{column} < {hi}"]])
    if rng.random() < 0.3:
        parts.append(builder.predicate(0))
    rng.shuffle(parts)
    return " AND ".join(parts)


# UTC+14 and -12, a DST gap at midnight (Havana, Beirut), a half-hour offset, a POSIX offset
_ZONES = ("UTC", "UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/Havana", "Asia/Beirut", "Asia/Kathmandu", "<+0530>-05:30")


def _series_case(builder: _Builder) -> Case:
    """A GROUP BY joined to a subquery that ranks its series (Superset's *Series limit*): two
    releases and a restriction of the first by the second. The ranking keeps series by their keys,
    or all of them, so which cells come back is the same on every table (a ranking by noised values
    would make it differ by chance, not by the row)."""
    rng = builder.rng
    key = rng.choice(["t", "v", "i2"])
    # The other key may be a date part (rewriter/date_parts.py): its cells are the values the range gives.
    keys = [key, *([rng.choice(["date_trunc('month', d)", "width_bucket(f8, -1, 1, 5)", "EXTRACT(MONTH FROM ts)",
                                "EXTRACT(ISODOW FROM tz)", "EXTRACT(QUARTER FROM d)"])] if rng.random() < 0.6 else [])]
    rng.shuffle(keys)
    # Either side may ask for keys only (a value list joined to a ranking, or a ranking by keys).
    metrics = [] if rng.random() < 0.15 else [rng.choice(["COUNT(*)", "SUM(i4)", "AVG(i2)", "COUNT(DISTINCT t)", "SUM(n)",
                                                          "SUM(f8)", "AVG(f4)", "AVG(fz)"])]
    ranking = "" if rng.random() < 0.15 else f", {rng.choice(['COUNT(*)', 'SUM(i2)', 'AVG(n)'])} AS m"
    orders = [f"{key} DESC LIMIT 2", key, "1 LIMIT 1", "1/0", f"{key}__::int"] + (["m DESC LIMIT 50", "m"] if ranking else [])
    order = rng.choice(orders)
    # a HAVING the keys decide (always true; or failing on every label, whatever the rows)
    having = rng.choice(["", "", "", f" HAVING {key} IS NOT NULL", f" HAVING CAST({key} AS text)::int > 0"])
    inner = f" WHERE {builder.predicate(rng.randint(0, 2))}" if rng.random() < 0.5 else ""
    where = f" WHERE {builder.predicate(rng.randint(0, 2))}" if rng.random() < 0.5 else ""
    outputs = [*keys, *(f"{metric} AS metric" for metric in metrics)]
    # the join's sides maybe qualified, either way round (rewriter/series_limit.py)
    on = rng.choice([f"{key} = {key}__", f"{{table}}.{key} = series_limit.{key}__", f"series_limit.{key}__ = {key}",
                     f"({key} = {key}__)", f"{key} = series_limit.{key}", f"{key} = {key}__ AND {key}__ = {key}"])
    sql = (f"SELECT {', '.join(outputs)} FROM {{table}} JOIN (SELECT {key} AS {key}__{ranking} "
           f"FROM {{table}}{inner} GROUP BY {key}{having} ORDER BY {order}) AS series_limit ON {on}{where} "
           f"GROUP BY {', '.join(keys)}")
    if rng.random() < 0.3:
        sql += " ORDER BY 1 LIMIT 10000"  # by a key: an order by noised values would differ by chance
    fixed = tuple([False] * len(keys) + [_fixed_scale(metric) for metric in metrics])
    return Case(sql, tuple(builder.params), False, fixed, keys=len(keys), timezone=rng.choice(_ZONES))


# COPY (query) TO STDOUT options: the clause, and how its output reads (csv or text, the
# delimiter, the NULL string; binary is read apart); the last ones are refused from the text alone (rewriter/copy.py).
COPY_OPTIONS: dict[str, tuple[bool, str, str]] = {
    "": (False, "\t", "\\N"),
    " WITH (FORMAT csv, HEADER)": (True, ",", ""),
    " (DELIMITER ';', NULL 'none')": (False, ";", "none"),
    " (FORMAT csv, HEADER true, DELIMITER '|')": (True, "|", ""),
    " (FORMAT 'csv', HEADER 1, NULL 'n/a', FORCE_QUOTE *)": (True, ",", "n/a"),
    # (NULL '' would read a MODE's noised pick of the category '' as NULL)
    " (FORMAT text, HEADER false, NULL '-')": (False, "\t", "-"),
    " WITH CSV HEADER": (True, ",", ""),
    " CSV DELIMITER ','": (True, ",", ""),
    " (FORMAT binary)": (False, "", ""),  # read by neighbour_outcome.binary_copy_cells
    " (HEADER 'match')": (False, "", ""),
    " (FORMAT csv, DELIMITER '\"')": (True, "", ""),
    " (DELIMITER 'ab')": (False, "", ""),
    " (HEADER, HEADER)": (False, "", ""),
    " (FORMAT csv, NULL 'a\"b')": (True, "", ""),
    " (HEADER 2)": (False, "", ""),
}

# Post-processing of the released row by an outer query (rewriter/post_process.py): the row's
# first column is named "a"; each form with its number of output columns. None overflows on a
# value of the released type (a * 2 of a noised bigint MAX near its bounds would fail by the
# noise, which the comparison cannot tell from the row); a cast of a MODE's label fails on
# every label, before the charge.
_OUTER = (("*", 0), ("a", 1), ("a * 1", 1), ("CAST(a AS float8)", 1), ("CASE WHEN a IS NULL THEN 0 ELSE 1 END", 1),
          ("round(a)", 1), ("a, a", 2), ("COALESCE(a, 0)", 1), ("a::text", 1), ("released.a", 1),
          ("a - 0 AS b, 'label'", 2), ("upper('x')", 1), ("a, $1::int", 2))


def generate_case(rng: random.Random) -> Case:
    """One statement of the DP language with a WHERE clause that usually reaches the neighbour row.

    Besides the plain shape (issue 18): a wrapper subquery that only projects and filters
    (flattened), post-processing of the released row (a constant label, an expression over an
    aggregate, an always-true HAVING, ORDER BY, an outer query over the aggregate query) and
    LIMIT/OFFSET/FETCH FIRST on the one row; each maybe prepared and described first, under a
    client encoding other than UTF8, in COPY's framing, run twice (a repeat) or through raw
    extended-protocol messages with a row limit.
    """
    case = _statement(_Builder(rng))
    if rng.random() < 0.08 and not case.sql.startswith("COPY"):
        case = replace(case, prepared=True)
    if rng.random() < 0.05:
        case = replace(case, encoding=rng.choice(["LATIN1", "WIN1252", "SQL_ASCII", "WIN1251"]))
    if rng.random() < 0.05:
        case = replace(case, repeat=True)
    elif (not case.params and not case.prepared and case.timezone == "UTC" and case.encoding == "UTF8"
          and rng.random() < 0.06):
        # Execute with a row limit (PortalSuspended), COPY in the extended protocol
        case = replace(case, row_limit=rng.choice([1, 2]))
    return case


def _statement(builder: _Builder) -> Case:
    rng = builder.rng
    if rng.random() < 0.04:
        return _series_case(builder)
    if rng.random() < 0.25:
        grouped = _grouped_case(builder)
        if not grouped.params and not grouped.binary and rng.random() < 0.1:
            return _copy(grouped, rng)
        return grouped
    if rng.random() < 0.03:
        return _columns_only(builder)
    outputs = [builder.aggregate() for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.1:  # a repeated metric (a measure on two shelves): one release, both columns equal
        text, flag = rng.choice(outputs)
        outputs.append((_named(_respelled(text), "dup"), flag))
    if rng.random() < 0.2:
        outputs.append(rng.choice([("'total' AS label", False), ("COUNT(*) * 1.0 AS scaled", False),
                                   ("COALESCE(COUNT(*), 0) AS c", False), ("COUNT(1) AS one", False)]))
    outer = rng.random() < 0.12  # an outer query over the one released row, maybe through a CTE
    if outer:
        outputs = [(_named(text) if i == 0 else text.replace(" AS a", " AS a2"), flag) for i, (text, flag) in enumerate(outputs)]
    items = ", ".join(text for text, _ in outputs)
    shape = rng.random()
    with_ = ""
    if shape < 0.7:
        source, qualifier = "{table}", None
    elif shape < 0.8:
        source, qualifier = "{table} AS q", "q."
    else:
        inner = f" WHERE {builder.predicate(rng.randint(0, 2))}" if rng.random() < 0.6 else ""
        # the wrapped table maybe aliased, or wrapped twice (rewriter/flatten.py)
        read = rng.choice(["{table}", "{table}", "{table}", "{table} AS x", "(SELECT * FROM {table}) AS v"])
        if read != "{table}":
            inner = inner.replace("{table}.", "x." if "x" in read else "v.")
        # the wrapper's columns maybe listed (in another order, or each renamed to itself): mapped one by one
        listed = rng.choice(["*"] * 6 + [_LISTED, _RENAMED])
        source, qualifier = f"(SELECT {listed} FROM {read}{inner}) AS w", "w."
        if rng.random() < 0.3:  # the same wrapper as a CTE read once (dbt, custom SQL)
            with_, source = f"WITH w AS (SELECT {listed} FROM {read}{inner}) ", "w"
    if qualifier is not None:
        items = items.replace("{table}.", qualifier)
    sql = f"{with_}SELECT {items} FROM {source}"
    if rng.random() < 0.9:
        where = builder.predicate(rng.randint(0, 3))
        if rng.random() < 0.005:  # a statement long enough to be analysed in a worker thread: answered
            # (one long literal), or refused for its 3,000 values (rewriter/predicate_terms.py); chosen
            # without another draw, so that the seeded cases stay those they were
            long = f"t = '{'x' * 17_000}'" if len(where) % 2 else f"i4 IN ({', '.join(map(str, range(3000)))})"
            where = f"{long} OR ({where})"
        if qualifier is not None:
            where = where.replace("{table}.", qualifier)
        sql += f" WHERE {where}"
    if rng.random() < 0.1:
        sql += " HAVING COUNT(*) IS NOT NULL"
    if rng.random() < 0.1:
        # by position, by a selected aggregate (released anyway), or by one not selected (refused)
        first = _unaliased(outputs[0][0]).replace("{table}.", qualifier or "{table}.")
        sql += rng.choice([" ORDER BY 1", " ORDER BY 1", f" ORDER BY {first} DESC", " ORDER BY COUNT(*)"])
    if rng.random() < 0.15:
        sql += " " + rng.choice(["LIMIT 0", "LIMIT 1", "LIMIT 5", "LIMIT ALL", "OFFSET 0", "OFFSET 1",
                                 "FETCH FIRST ROW ONLY", "LIMIT 1 OFFSET 0"])
    fixed = tuple(flag for _, flag in outputs)
    if outer:
        projection, width = rng.choice(_OUTER)
        if "$1" in projection:
            builder.params.insert(0, rng.choice([1, None, "x"]))
            sql = re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + 1}", sql)
        if width:
            fixed = (fixed[0],) * width if projection.startswith(("a,", "a ")) else (False,) * width
        sql = rng.choice([f"SELECT {projection} FROM ({sql}) AS released",
                          f"WITH released AS ({sql}) SELECT {projection} FROM released"])
    case = Case(sql, tuple(builder.params), rng.random() < 0.2, fixed)
    if not case.params and not case.binary and rng.random() < 0.1:
        return _copy(case, rng)  # the same release in COPY's framing (psql's \copy (SELECT ...) TO 'file')
    if rng.random() < 0.03:
        # Sizes reveal row counts: a catalog query answers NULL for them (psql's \dt+).
        function = rng.choice(["pg_table_size", "pg_relation_size", "pg_total_relation_size", "pg_indexes_size"])
        return Case(f"SELECT pg_size_pretty({function}('{{table}}')), {function}('{{table}}'::regclass) AS s", (),
                    fixed_scale=(False, False))
    return case


_LISTED = ", ".join(c.name for c in reversed(COLUMNS))
_RENAMED = ", ".join(f'{c.name} AS "{c.name}"' for c in COLUMNS)


def _copy(case: Case, rng: random.Random) -> Case:
    """``case`` (without parameters) as COPY (query) TO STDOUT with one of :data:`COPY_OPTIONS`."""
    options = " (FORMAT binary)" if rng.random() < 0.15 else rng.choice(list(COPY_OPTIONS))
    return replace(case, sql=f"COPY ({case.sql}) TO STDOUT{options}", binary=False)


def _columns_only(builder: _Builder) -> Case:
    """A SELECT of columns whose own LIMIT leaves no row (a BI tool reading a table's columns):
    answered with the columns and no row, nothing charged (rewriter/classify.py's ColumnsOnly)."""
    rng = builder.rng
    columns = rng.choice(["*", "t, i4", "{table}.*", "d, ts, tz AS instant", "nm, pa"])
    sql = f"SELECT {columns} FROM {{table}}"
    if rng.random() < 0.5:
        sql += f" WHERE {builder.predicate(rng.randint(0, 1))}"
    sql += " " + rng.choice(["LIMIT 0", "LIMIT 0 OFFSET 5", "FETCH FIRST 0 ROWS ONLY", "LIMIT 0 -- probe"])
    return Case(sql, tuple(builder.params), rng.random() < 0.2)


# Accepted forms that other tests answer and that a default run of the generator draws too
# rarely to reach every time (tests/tools/neighbour_coverage.py lists them): each is run on every
# neighbour of the "base" family, whatever the random stream draws.
PINNED: tuple[Case, ...] = (
    # Metabase's numeric binning: f8's subnormal rows divided by W > 1 (an underflow in PostgreSQL),
    # integer division over i2, numeric(8,2) with an offset not aligned with the bounds
    Case("SELECT (floor((f8 / 1e279)) * 1e279) AS k, COUNT(*), SUM(i2) FROM {table} GROUP BY 1 ORDER BY 1", (), keys=1),
    Case("SELECT floor((i2 - 1) / 3) * 3 + 1, COUNT(*) FROM {table} GROUP BY floor((i2 - 1) / 3) * 3 + 1", (), keys=1),
    Case('SELECT ((floor(((nm - 12.5) / 250.0)) * 250.0) + 12.5) AS "nm", AVG(f4) FROM {table} GROUP BY 1', (), keys=1),
    # v's "other" cell holds two of base's groups ('c', 'd'): their parts and grid counts add up
    Case("SELECT v, PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY i4), COUNT(*) FROM {table} GROUP BY v", (), keys=1),
    Case("SELECT v, SUM(i4), AVG(n), COUNT(i2) FROM {table} GROUP BY v", (), fixed_scale=(False, True, False, False), keys=1),
    # a fraction bound as text, read as PostgreSQL reads it; and one it refuses
    Case("SELECT PERCENTILE_DISC($1) WITHIN GROUP (ORDER BY nm) FROM {table}", (" 0.25 ",)),
    Case("SELECT PERCENTILE_CONT($1) WITHIN GROUP (ORDER BY f8) FROM {table}", ("-Infinity",)),
    # arrays of fractions in binary: a float8[] per cell, an integer column's rounded picks
    Case("SELECT t, PERCENTILE_CONT(ARRAY[0.25, 0.5]) WITHIN GROUP (ORDER BY f8) FROM {table} GROUP BY t", (), True, keys=1),
    Case("SELECT PERCENTILE_DISC(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY i4) FROM {table}", (), True),
    Case("SELECT (PERCENTILE_CONT(ARRAY[0.5]) WITHIN GROUP (ORDER BY i4))[1] FROM {table}", ()),
    Case("COPY (SELECT t, COUNT(*), AVG(f4) FROM {table} GROUP BY t) TO STDOUT (FORMAT binary)", ()),
    Case(f"SELECT SUM(i4), MAX(n), MODE() WITHIN GROUP (ORDER BY t) FROM (SELECT {_RENAMED} FROM {{table}}) AS w WHERE i2 > 0", (),
         fixed_scale=(True,)),
    Case("SELECT width_bucket(i2, -5, 5, 2), COUNT(*), SUM(i2) FROM {table} GROUP BY 1", (), keys=1),
    Case("SELECT COUNT(*), SUM(i4) FROM {table} ORDER BY SUM(i4) DESC", (), fixed_scale=(False, True)),
    Case("SELECT COUNT(*) FROM {table} ORDER BY AVG(i4)", ()),
    Case("SELECT AVG(CASE WHEN i4 > 10 THEN 1 ELSE 0 END) FILTER (WHERE t = 'Male') FROM {table}", ()),
    # the same release twice per cell, and a variance with its AVG from the same moments
    Case("SELECT t, VARIANCE(nm), AVG(nm), COUNT(*), COUNT(*) FROM {table} GROUP BY t", (), keys=1),
    # Execute with a row limit (PortalSuspended) in text and in binary results; a percentile
    # array in text (its shape and each element's spelling); a binary COPY of numerics and a float8
    Case("SELECT COUNT(*), AVG(f8), SUM(n) FROM {table}", (), row_limit=1),
    Case("SELECT COUNT(*), AVG(i4), SUM(n), AVG(f8) FROM {table}", (), True, row_limit=1),
    Case("SELECT PERCENTILE_CONT(ARRAY[0.25, 0.5]) WITHIN GROUP (ORDER BY f8), COUNT(*) FROM {table}", ()),
    Case("COPY (SELECT COUNT(*), AVG(i4), SUM(n), AVG(f8) FROM {table}) TO STDOUT (FORMAT binary)", ()),
    # a COPY released fresh (the one above repeats the release of the SELECT before it), whose one
    # count differs by one row on every neighbour: what its tag says is compared
    Case("COPY (SELECT COUNT(*) FROM {table} WHERE i2 IS NULL OR i2 IS NOT NULL) TO STDOUT", ()),
    # date and timestamp keys in binary results of the extended protocol
    Case("SELECT date_trunc('month', d), COUNT(*) FROM {table} GROUP BY 1", (), True, keys=1),
    Case("SELECT CAST(date_trunc('month', d) AS date), date_trunc('quarter', ts), SUM(i2) FROM {table} GROUP BY 1, 2",
         (), True, keys=2),
)
