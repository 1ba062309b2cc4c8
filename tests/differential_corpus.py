"""The statements the parse differential reads (tests/parse_differential.py): the suite's
corpora of DP statements, and lexical variants of them.

The corpora are the neighbour fuzzer's generator (tests/neighbour_cases.py) with a fixed seed,
every recorded client statement that reads a protected table (:func:`recorded_statements`),
every SQL string literal on the ``adult`` table in the refusal and parsing test files,
:data:`CONSTANT_STATEMENTS` and :data:`RELEASE_STATEMENTS`. Many are refused; the differential
reads only those dpproxy answers.

A variant respells one token of a statement (a constant, a keyword, a name, the space between
two tokens) in a form PostgreSQL may read the same or differently: each variant is kept as it
is, and the differential compares what PostgreSQL reads in it with what dpproxy runs for it.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path
from typing import Callable, Iterator

from pglast import split
from pglast.parser import ParseError, scan

from tests.bi_statements import PGADMIN_RECORD_FILE, RECORD_FILE
from tests.captured import CAPTURE_FILE, sql_blocks

__all__ = ["ATTACK_FILES", "CONSTANT_STATEMENTS", "RELEASE_STATEMENTS", "adult_statements", "recorded_statements",
           "variants"]

_TESTS = Path(__file__).parent
ATTACK_FILES = ("test_refusals.py", "test_attack_parsing.py", "test_attacks.py", "test_query_shapes.py",
                "test_dp_count_sum.py", "test_dp_avg_min_max_mode.py", "test_predicate_terms.py",
                "test_conditional_aggregates.py")
_ON_ADULT = re.compile(r"^\s*SELECT\b.*\bFROM\s+adult\b", re.IGNORECASE | re.DOTALL)


def recorded_statements() -> list[str]:
    """Every statement recorded from a client (psql, JDBC, ODBC, drivers: tests/captured.py; pgAdmin
    and Superset: tests/bi_statements.py) that reads a protected table, each statement of a
    multi-statement text on its own, in file order."""
    found: dict[str, None] = {}
    for path in (CAPTURE_FILE, PGADMIN_RECORD_FILE, RECORD_FILE):
        for _, block in sql_blocks(path):
            try:
                statements = split(block)
            except ParseError:
                continue
            found.update((statement, None) for statement in statements if _PROTECTED.search(statement))
    return list(found)


_PROTECTED = re.compile(r"\bFROM\s+(public\.|\"public\"\.)?\"?(people|adult)\b", re.IGNORECASE)


def adult_statements() -> list[str]:
    """Every string literal of :data:`ATTACK_FILES` that is a SELECT on ``adult``, in file order."""
    found: dict[str, None] = {}
    for name in ATTACK_FILES:
        for node in ast.walk(ast.parse((_TESTS / name).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _ON_ADULT.match(node.value):
                found.setdefault(node.value, None)
    return list(found)


# Constant expressions whose value PostgreSQL's reading decides: precedence (unary minus binds before
# ^, ^ is left-associative, OPERATOR() forms have one precedence), integer division, casts that round
# or fail, date and interval arithmetic, time zones, the session's DateStyle and IntervalStyle.
CONSTANT_STATEMENTS = tuple(f"SELECT count(*) FROM {table} WHERE {column} {condition}" for table, column, condition in [
    ("adult", "age", "> -2^2 + 30"), ("adult", "age", "> 2^3^2 / 16"), ("adult", "age", "> 10 % 3 * 2 + 30"),
    ("adult", "age", "> 40 + 7 % 3"), ("adult", "age", "> 10 - 3 * 2 + 30"), ("adult", "age", "> 100 / 10 / 2 + 30"),
    ("adult", "age", "> -(1 + 2) * -13"), ("adult", "age", "> 5 - - 35"), ("adult", "age", "> 81 / 2"),
    ("adult", "age", "> 81 / 2.0"), ("adult", "age", "> CAST('1e3' AS int)"), ("adult", "age", "> TRUE::int + 39"),
    ("adult", "age", "> 40.5::int"), ("adult", "age", "> mod(-7, 3) + 40"), ("adult", "age", "> round(40.5)"),
    ("adult", "age", "> trunc(40.57, 1)"), ("adult", "age", "> 0.1::float4 * 400"),
    ("adult", "hours_per_week", "> 10::float8 / 3"), ("adult", "age", "> '40'::int + '2'"),
    ("adult", "sex", "= 'Ma' || 'le'"), ("adult", "age", "> 1e400 - 1e400"),
    ("people", "signed_up", "> interval(3) '1' + date '2024-01-01'"),
    ("people", "signed_up", "> now() - '1 day'::interval * 2"), ("people", "signed_up", "> date '2024-01-01' + 1"),
    ("people", "signed_up", "> timestamptz '2024-06-01 00:00:00+05:30'"),
    ("people", "signed_up", "> timestamp '2024-06-01 00:00:00+05:30'"),
    ("people", "signed_up", "> '2024-01-01 10:00' AT TIME ZONE 'UTC'"),
    ("people", "signed_up", "> now() AT TIME ZONE 'Asia/Kolkata' - interval '500 days'"),
    ("people", "signed_up", "> date '01/02/2024' + 0"), ("people", "signed_up", "> '01/02/2024'::date - 1"),
    ("people", "signed_up", "> timestamp '2024-01-01' - interval '-1 2:00:00'"),
    ("people", "signed_up", "> now() - interval '1:30' hour to minute"),
    ("people", "signed_up", "> localtimestamp - interval 'P1Y2M'"),
    ("people", "signed_up", "> timestamp 'epoch' + 1700000000 * interval '1 second'"),
    ("people", "signed_up", "> date_trunc('month', now()) - interval '13 months'"),
    ("people", "signed_up", "> make_date(2024, 1, 1) - 30"),
    ("people", "signed_up", "< to_timestamp('2024-01-01', 'YYYY-MM-DD')"),
    ("people", "signed_up", "> interval '1 day' + '2023-06-01'::date"),
    ("people", "signed_up", "< interval '1 day' + '5' * 2"),
    ("people", "signed_up", "> extract(epoch from now()) * interval '0 s' + '2024-01-01'::date"),
    ("people", "signed_up", "> now() - interval '1 day' + 1"),
    ("people", "signed_up", "> timestamp '2024-06-01' + interval '400 days ago'"),
    ("people", "signed_up", "> timestamp '2024-06-01' - interval '1 day 10:00'"),
    ("people", "signed_up", "> timestamp '2024-06-01' - interval '1.5' year"),
    ("people", "signed_up", "> timestamp '2024-06-01' - interval 'P1M'"), ("adult", "age", "!=-1"),
    ("adult", "age", "> 50 %-7"), ("adult", "age", "> numeric '40.5'::int"),
    ("people", "signed_up", "> timestamptz '2024-06-01 00:00:00+05:30'::text"),
])


# Histograms over public keys, conditional aggregates and post-processing of the release
# (tests/release_differential.py): each key kind of rewriter/group_keys.py, floor_bins.py and
# date_parts.py, each CASE form of rewriter/conditional.py, arithmetic, ROUND, casts, CASE, HAVING,
# ORDER BY and LIMIT over released aggregates; the levels BI tools write (derived tables, enclosing
# queries, CTEs), shares and percentiles.
RELEASE_STATEMENTS = (
    "SELECT sex, count(*) FROM people GROUP BY sex",
    "SELECT sex, count(*) AS n FROM people WHERE age > 30 GROUP BY 1 ORDER BY n DESC LIMIT 1",
    "SELECT age, count(*) FROM people GROUP BY age ORDER BY age LIMIT 10 OFFSET 5",
    "SELECT date_trunc('month', signed_up) AS m, avg(income) FROM people GROUP BY m ORDER BY m",
    "SELECT date_trunc('MONTH', signed_up), count(*) FROM people GROUP BY 1 ORDER BY 1 DESC LIMIT 3",
    "SELECT date_trunc('week', signed_up) AS w, sum(income) FROM people GROUP BY w",
    "SELECT date_trunc('quarter', signed_up), date_trunc('year', signed_up), count(*) FROM people GROUP BY 1, 2",
    "SELECT EXTRACT(year FROM signed_up) AS y, count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(month FROM signed_up) AS mo, EXTRACT(year FROM signed_up) AS y, count(*) FROM people GROUP BY 1, 2",
    "SELECT EXTRACT(dow FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT date_part('dow', signed_up) + 1 AS d, count(*) FROM people GROUP BY d",
    "SELECT EXTRACT(isodow FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(quarter FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(week FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(doy FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(day FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT EXTRACT(isoyear FROM signed_up), count(*) FROM people GROUP BY 1",
    "SELECT date_part('year', signed_up), count(*) FROM people GROUP BY 1",
    "SELECT to_char(signed_up, 'YYYY-MM'), count(*) FROM people GROUP BY 1",
    "SELECT width_bucket(age, 0, 100, 10) AS b, count(*) FROM people GROUP BY b ORDER BY b",
    "SELECT width_bucket(age, 20.5, 80, 6), avg(income) FROM people GROUP BY 1",
    "SELECT floor(age / 10) * 10 AS b, count(*) FROM people GROUP BY b",
    "SELECT floor(age / 10.0) * 10 AS b, count(*) FROM people GROUP BY 1",
    "SELECT floor((age - 15) / 5) * 5 + 15 AS b, count(*) FROM people GROUP BY 1",
    "SELECT (age / 10) * 10 AS b, count(*) FROM people GROUP BY 1",
    "SELECT sex, date_trunc('year', signed_up), count(*), sum(income) FROM people GROUP BY 1, 2 ORDER BY 3 DESC",
    "SELECT sex, count(*) FROM people GROUP BY sex HAVING count(*) > 100",
    "SELECT sex, round(avg(income), 1) AS a, count(*) FROM people WHERE age > 20 GROUP BY sex "
    "HAVING count(*) > 10 ORDER BY a DESC LIMIT 1",
    "SELECT sex, count(*) FILTER (WHERE age > 40) AS older, count(*) - count(*) FILTER (WHERE age > 40) FROM people "
    "GROUP BY sex",
    "SELECT round(avg(age)::numeric, 2) + 1, count(*) * 2 FROM adult",
    "SELECT count(*)::float / 2, CAST(sum(age) AS numeric) / 3, -count(*) FROM adult",
    "SELECT CASE WHEN count(*) > 10 THEN 'many' ELSE 'few' END, coalesce(sum(capital_gain), 0) FROM adult",
    "SELECT round(sum(age) / count(*), 3), abs(sum(capital_gain) - 5), count(*) % 7 FROM adult",
    "SELECT count(*) AS n, 'total' AS label FROM adult ORDER BY n LIMIT 1",
    "SELECT sum(CASE WHEN sex = 'Male' THEN age ELSE 0 END), count(*) FILTER (WHERE age > 30) FROM adult",
    "SELECT sum(CASE WHEN sex = 'Male' THEN age ELSE 0 END) / 2, count(CASE WHEN age > 30 THEN 1 END) + 1 FROM adult",
    "SELECT count(CASE WHEN age > 30 THEN 1 ELSE NULL END), sum(CASE WHEN age <= 30 THEN 1 ELSE 0 END) FROM adult",
    "SELECT sum((age > 40)::int), sum(CAST(sex = 'Female' AS integer)) FROM adult",
    "SELECT avg(CASE WHEN sex = 'Male' THEN age END), max(CASE WHEN age < 50 THEN hours_per_week END) FROM adult",
    "SELECT count(CASE WHEN age > 50 THEN 1 END) FILTER (WHERE sex = 'Male') FROM adult",
    "SELECT sum(CASE WHEN age > 30 THEN capital_gain WHEN NOT age > 30 THEN 0 ELSE NULL END) FROM adult",
    "SELECT mode() WITHIN GROUP (ORDER BY CASE WHEN age > 30 THEN sex END) FROM adult",
    "SELECT sex, sum(CASE WHEN age > 30 THEN income ELSE 0 END) FROM people GROUP BY sex",
    "SELECT date_trunc('month', signed_up), count(*) FILTER (WHERE sex = 'Male') AS males FROM people GROUP BY 1 "
    "ORDER BY males DESC",
    "SELECT stddev(age), variance(age) * 2 FROM adult",
    "SELECT EXTRACT(year FROM signed_up) AS y, count(*) FROM people GROUP BY +1",
    "SELECT sex, count(*) FROM people GROUP BY 1 ORDER BY +2 DESC LIMIT 1",
    # Levels: Superset's virtual_table, Metabase's "source", Tableau's forms, enclosing queries and CTEs
    "SELECT sex AS sex, count(*) AS count FROM (SELECT * FROM people) AS virtual_table GROUP BY sex "
    "ORDER BY count DESC LIMIT 10000",
    "SELECT date_trunc('month', signed_up) AS __timestamp, avg(income) AS \"AVG(income)\" FROM (SELECT * FROM people "
    "WHERE age > 18) AS virtual_table GROUP BY date_trunc('month', signed_up) LIMIT 50000",
    'SELECT "source"."k0" AS "k0", count(*) AS "count" FROM (SELECT date_trunc(\'month\', "public"."people"."signed_up") '
    'AS "k0", "public"."people"."sex" AS "sex" FROM "public"."people") AS "source" GROUP BY "source"."k0" '
    'ORDER BY "source"."k0" ASC',
    'SELECT "source"."sex" AS "sex", sum("source"."income") AS "sum" FROM (SELECT "public"."people"."sex" AS "sex", '
    '"public"."people"."income" AS "income" FROM "public"."people" WHERE "public"."people"."age" > 30) AS "source" '
    'GROUP BY "source"."sex" ORDER BY "sum" DESC',
    'SELECT avg(CASE WHEN "public"."people"."age" > 40 THEN 1 ELSE 0.0 END) AS "share" FROM "public"."people"',
    'SELECT AVG((CASE WHEN ("people"."age" > 40) THEN 1 WHEN NOT ("people"."age" > 40) THEN 0 ELSE NULL END)) '
    'AS "usr:Calculation:ok" FROM "public"."people" "people" HAVING (COUNT(1) > 0)',
    "SELECT n * 100.0 / total AS pct FROM (SELECT count(*) FILTER (WHERE sex = 'Male') AS n, count(*) AS total "
    "FROM people) AS q",
    "WITH c AS (SELECT sex, count(*) AS n FROM people GROUP BY sex) SELECT sex, n * 2 AS twice FROM c ORDER BY n DESC LIMIT 1",
    "SELECT * FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t ORDER BY n DESC LIMIT 1",
    "SELECT sex, n FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t WHERE n > 10",
    "WITH base AS (SELECT * FROM people WHERE income > 1000) SELECT sex, avg(age) AS a FROM base GROUP BY sex",
    "SELECT upper(sex) AS s, c FROM (SELECT sex, count(*) AS c FROM people GROUP BY sex) AS q",
    "COPY (SELECT sex, count(*) FROM people GROUP BY sex) TO STDOUT",
    "SELECT * FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex HAVING count(*) > 5) AS t WHERE sex = 'Male'",
    "WITH a AS (SELECT date_trunc('year', signed_up) AS y, sum(income) AS s FROM people GROUP BY 1) "
    "SELECT y, s FROM a ORDER BY s DESC LIMIT 1",
    "SELECT count FROM (SELECT count(*) FROM people) AS q",
    'SELECT "count" * 2 FROM (SELECT count(*) FROM people WHERE age > 20) AS "q"',
    "SELECT max(n) FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t",
    "SELECT max(n) FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t WHERE n > 3",
    "SELECT sex, share FROM (SELECT sex, avg(CASE WHEN income > 50000 THEN 1 ELSE 0 END) AS share FROM people "
    "GROUP BY sex) AS s ORDER BY share DESC",
    # Shares, percent of total, percentiles
    "SELECT sex, avg(CASE WHEN age > 40 THEN 1 ELSE 0 END) AS share FROM people GROUP BY sex",
    "SELECT sex, avg((age > 40)::int) FILTER (WHERE income > 1000) FROM people GROUP BY 1 ORDER BY 2 DESC",
    "SELECT round(avg(CASE WHEN sex = 'Male' THEN 1.0 ELSE 0 END) * 100, 1) AS pct_male FROM adult",
    "SELECT sex, count(*) * 100.0 / sum(count(*)) OVER () FROM people GROUP BY sex",
    "SELECT count(*) FILTER (WHERE age > 40) * 100.0 / count(*) AS pct FROM adult",
    "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY age)::numeric, 1) AS median, "
    "percentile_disc(0.9) WITHIN GROUP (ORDER BY age DESC) FROM adult",
    "SELECT percentile_cont(0.25) WITHIN GROUP (ORDER BY age DESC) FILTER (WHERE sex = 'Male') FROM adult",
    "SELECT percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY age) FROM adult",
    "SELECT sex, percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY income) FROM people GROUP BY sex",
    "SELECT sex, percentile_disc(0.5) WITHIN GROUP (ORDER BY income) AS median FROM people GROUP BY sex ORDER BY median",
    "SELECT count(DISTINCT age), count(age) FROM adult",
    # Labels as PostgreSQL prints them (tests/labelled_data.py: a char(6), a boolean and a date declared otherwise)
    "SELECT mode() WITHIN GROUP (ORDER BY code) FROM labelled",
    "SELECT mode() WITHIN GROUP (ORDER BY flag), mode() WITHIN GROUP (ORDER BY day) FILTER (WHERE code = 'Male') "
    "FROM labelled",
    "SELECT code, flag, count(*) FROM labelled GROUP BY code, flag ORDER BY code DESC NULLS LAST, flag",
    "SELECT day, mode() WITHIN GROUP (ORDER BY code) AS m FROM labelled GROUP BY day HAVING count(*) > 10 ORDER BY m",
    "SELECT DISTINCT day FROM labelled ORDER BY 1 DESC",
    # SELECT DISTINCT over keys, with and without GROUP BY
    "SELECT DISTINCT sex FROM people ORDER BY sex DESC",
    "SELECT DISTINCT sex, date_trunc('year', signed_up) AS y FROM people WHERE age > 30 ORDER BY 2, 1 LIMIT 3",
    "SELECT DISTINCT sex FROM people GROUP BY sex, age",
    "SELECT DISTINCT sex, age FROM people GROUP BY sex, age ORDER BY age NULLS FIRST LIMIT 5 OFFSET 2",
    # ORDER BY over released rows: NULLS FIRST/LAST, COLLATE, LIMIT/OFFSET; an answer of one row under LIMIT/OFFSET
    "SELECT sex, count(*) AS n FROM people GROUP BY sex ORDER BY n DESC NULLS FIRST, sex COLLATE \"C\" LIMIT 1 OFFSET 1",
    "SELECT sex, sum(income) AS s FROM people GROUP BY sex HAVING sum(income) > 10 ORDER BY sex COLLATE \"POSIX\" DESC",
    "SELECT age, count(*) FROM people GROUP BY age ORDER BY age DESC NULLS LAST FETCH FIRST 3 ROWS ONLY",
    "SELECT age, count(*) AS n FROM people GROUP BY age ORDER BY n NULLS FIRST, age ASC NULLS LAST LIMIT 4 OFFSET 3",
    "SELECT count(*) FROM adult LIMIT 0", "SELECT count(*) FROM adult OFFSET 1", "SELECT count(*) FROM adult LIMIT ALL",
    "SELECT count(*), sum(age) FROM adult LIMIT 1 OFFSET 0", "SELECT avg(age) FROM adult LIMIT NULL OFFSET 0",
    # Superset's series limit: a WHERE at each level, each read in its own statement
    "SELECT DATE_TRUNC('MONTH', signed_up) AS signed_up, sex AS sex, COUNT(*) AS count FROM public.people "
    "JOIN (SELECT sex AS sex__, COUNT(*) AS mme_inner__ FROM public.people WHERE age > 30 GROUP BY sex "
    "ORDER BY mme_inner__ DESC LIMIT 5) AS series_limit ON sex = sex__ WHERE income < 50000 "
    "GROUP BY DATE_TRUNC('MONTH', signed_up), sex ORDER BY count DESC LIMIT 10000",
    "SELECT sex, age, SUM(income) AS s FROM people JOIN (SELECT sex AS sex__, SUM(income) AS m FROM people "
    "WHERE signed_up >= '2023-06-01' GROUP BY sex HAVING SUM(income) > 0 ORDER BY m ASC NULLS LAST LIMIT 1 OFFSET 0) "
    "AS series_limit ON people.sex = series_limit.sex__ WHERE age < 60 GROUP BY sex, age ORDER BY s DESC LIMIT 50",
)


def _integer(text: str, rng: random.Random) -> str:
    if not text.isdigit():  # 0x28, 1_000: respelled already
        return text
    value = int(text)
    return rng.choice([f"{value}.", f"{value}.0", f"{value}e0", f"0{value}", f"+{value}", f"{value}::int",
                       hex(value), f"{bin(value)}", f"{oct(value)}",
                       f"{value // 10 or ''}_{value % 10}" if value >= 10 else f"{value}", f"'{value}'",
                       f"({value})", f"int '{value}'", f"{value}::numeric", f"-(-{value})", f"{value} "])


def _float(text: str, rng: random.Random) -> str:
    return rng.choice([f"{text}0", f"{text}e0", f"0{text}", f"+{text}", f"({text})", f"'{text}'",
                       f"{text}::numeric", f"{text}::float8", f"{text}E+00"])


def _string(text: str, rng: random.Random) -> str:
    body = text[1:-1] if text.startswith("'") else None
    if body is None or "\\" in body:
        return text
    value = body.replace("''", "'")
    escaped = "".join(f"\\x{ord(c):02x}" if c.isascii() else c for c in value)
    unicode = "".join(f"\\{ord(c):04x}" for c in value)
    choices = [f"E'{escaped}'", f"U&'{unicode}'", f"U&'{unicode.replace(chr(92), '!')}' UESCAPE '!'",
               f"$${value}$$" if "$" not in value else text, f"$q${value}$q$" if "$" not in value else text,
               f"E'{body}'", f"'{body}'::text", f"text '{body}'", f"'{body}' ", f"'{body}'\n''",
               f"'{body[:1]}'\n'{body[1:]}'", f"'{body[:1]}' '{body[1:]}'", f"B'{body}'", f"'{body}' COLLATE \"C\""]
    return rng.choice(choices)


def _identifier(text: str, rng: random.Random) -> str:
    if text.startswith('"') or not text.isidentifier():
        return text
    unicode = "".join(f"\\{ord(c):04x}" for c in text.lower())
    return rng.choice([f'"{text.lower()}"', text.upper(), f'U&"{unicode}"', f'"{text}"',
                       f"adult.{text}" if text.lower() not in ("adult", "count", "sum", "avg") else text])


_GAPS = [" /* a */ ", " /* /* nested */ */ ", " -- c\n", "\n", "\t", "  "]
_RESPELLED: dict[str, Callable[[str, random.Random], str]] = {
    "ICONST": _integer, "FCONST": _float, "SCONST": _string, "IDENT": _identifier,
}
_OPERATORS = {"=": ["OPERATOR(pg_catalog.=)", "==", "= ="], "<>": ["!=", "OPERATOR(pg_catalog.<>)"],
              "!=": ["<>", "! ="], ">": ["OPERATOR(pg_catalog.>)", "> "], ">=": ["> =", "=>"],
              "<=": ["< =", "=<"], "<": ["OPERATOR(pg_catalog.<)"]}
_KEYWORDS = {"AND": ["&&", "and"], "OR": ["||", "or"], "NOT": ["!", "not"], "LIKE": ["~~", "like"],
             "ILIKE": ["~~*"], "IS": ["is"], "BETWEEN": ["BETWEEN SYMMETRIC"], "IN": ["= ANY"],
             "NULL": ["null", "NULL::text", "UNKNOWN"], "TRUE": ["'t'", "true", "UNKNOWN"], "FALSE": ["'f'", "UNKNOWN"],
             "INTERVAL": ["INTERVAL(6)", "interval"], "CURRENT_TIMESTAMP": ["CURRENT_TIMESTAMP(6)", "now()"],
             "LOCALTIMESTAMP": ["LOCALTIMESTAMP(6)"], "CURRENT_DATE": ["current_date"]}


def _respelled(sql: str, start: int, end: int, name: str, rng: random.Random) -> str | None:
    text = sql[start:end]
    if name in _RESPELLED:
        return _RESPELLED[name](text, rng)
    if text in _OPERATORS:
        return rng.choice(_OPERATORS[text])
    if text.upper() in _KEYWORDS:
        return rng.choice(_KEYWORDS[text.upper()])
    return None


def variants(sql: str, rng: random.Random, count: int) -> Iterator[str]:
    """Up to ``count`` variants of ``sql``, each with one token respelled or one gap widened."""
    try:
        tokens = [(token.start, token.end + 1, token.name) for token in scan(sql)]
    except ParseError:
        return
    if not tokens:
        return
    seen = {sql}
    for _ in range(count * 3):
        start, end, name = rng.choice(tokens)
        if rng.random() < 0.2:
            variant = sql[:end] + rng.choice(_GAPS) + sql[end:].lstrip()
        else:
            spelled = _respelled(sql, start, end, name, rng)
            if spelled is None:
                continue
            variant = sql[:start] + spelled + sql[end:]
        if variant not in seen:
            seen.add(variant)
            yield variant
            if len(seen) > count:
                return
