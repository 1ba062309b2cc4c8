"""``gk``: a protected table of edge values for every kind of GROUP BY key a policy can declare,
for the round-trip check of GROUP BY keys (tests/round_trip_keys.py, tests/key_generator.py).

Each column opts in one kind of key: categories of ``text`` (fewer than nine, grouped by the
row's cell; nine or more, by a hashed ``= ANY``, without ``other`` and with it), ``varchar``,
``char(4)``, ``boolean`` and ``date`` columns, a domain over text, an enum (its ``other`` one of its
labels) and a domain over int (an integer column takes bounds, not categories; a domain over one
categories, not bounds: the policy refuses the others), labels that need quoting, case and
trailing-space variants, ``other``;
integer keys of ``int4``, ``int8`` and ``int2``; ``double precision`` and ``numeric`` columns for
``width_bucket`` and floor bins; ``date``, ``timestamp`` and ``timestamptz`` time ranges, one by
``day`` (every unit), one by ``month`` only. The rows hold values at and beyond each domain's edges:
NULL, NaN, ±infinity, values just outside the bounds, times at bucket boundaries, DST days (Berlin's,
São Paulo's at midnight),
timestamptz instants near midnight in several zones.
"""

from __future__ import annotations

import psycopg

from tests.conftest import TestDatabase

__all__ = ["KEY_COLUMNS", "KEY_POLICY", "KEY_ROWS", "KEY_TABLE_DDL", "create_key_table", "key_rows_sql"]

KEY_TABLE_DDL = ("id int, t text, h text, ho text, v varchar(8), c char(4), b bool, dc date, i int4, big int8, s int2, "
                 "f float8, n numeric, d date, ts timestamp, tz timestamptz, w date, dt gk_text, en gk_mood, di gk_int, iv interval")
# A domain over text, an enum (whose other is one of its labels) and a domain over int: declared as categories.
KEY_TYPES_DDL = ("CREATE DOMAIN gk_text AS text CHECK (VALUE <> 'zz'); CREATE DOMAIN gk_int AS int CHECK (VALUE > -100); "
                 "CREATE TYPE gk_mood AS ENUM ('sad', 'ok', 'happy', 'meh', 'Ok')")

# The policy's entry for gk under ``tables:`` (plain YAML: callers double its braces for a format string).
KEY_POLICY = """\
  public.gk:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      t: {categories: [a, A, 'a ', "O'Brien", "Ω"], other: Other, group_by: true}
      h: {categories: [a, b, c, d, e, f, g, "O'Brien", 'x y', 'A'], group_by: true}
      ho: {categories: [a, b, c, d, e, f, g, "O'Brien", 'x y', 'A'], other: Other, group_by: true}
      v: {categories: [a, 'ab ', B], other: Other, group_by: true}
      c: {categories: [ab, x], other: Other, group_by: true}
      b: {categories: ['true', 'false'], group_by: true}
      dc: {categories: ['2000-01-01', '2000-1-2'], other: '2000-01-03', group_by: true}
      i: {bounds: [0, 20], group_by: true}
      big: {bounds: [-5, 5], group_by: true}
      s: {bounds: [0, 3], group_by: true}
      f: {bounds: [0, 10], group_by: true}
      n: {bounds: [0, 10], group_by: true}
      d: {bounds: [2000-01-01, 2000-12-31], group_by: [day]}
      ts: {bounds: [2000-01-01, 2000-12-31], group_by: [day]}
      tz: {bounds: [2000-01-01, 2000-12-31], group_by: [day]}
      w: {bounds: [2000-01-01, 2003-12-31], group_by: [month]}
      dt: {categories: [a, b, A, 'a '], other: Other, group_by: true}
      en: {categories: [sad, ok, happy], other: meh, group_by: true}
      di: {categories: ['0', '1', '2'], other: '-1', group_by: true}
"""

# Edge values per column; row k takes each column's value k modulo its count (NULL every 11th row).
_VALUES: dict[str, tuple[str, ...]] = {
    "t": ("'a'", "'A'", "'a '", "'O''Brien'", "'Ω'", "'b'", "''", "'Other'", "' a'", "'a  '", "'o''brien'"),
    "h": ("'a'", "'b'", "'x y'", "'O''Brien'", "'A'", "'g'", "'z'", "''", "'a '", "'X Y'", "'c'", "'e'"),
    "ho": ("'a'", "'z'", "'b'", "'x y'", "'Other'", "'A'", "'y'", "'a '", "'c'", "'z'", "''", "'X Y'", "'g'"),
    "v": ("'a'", "'ab '", "'ab'", "'B'", "'b'", "'Other'", "''", "'a '"),
    "c": ("'ab'", "'ab  '", "'x'", "'AB'", "' ab'", "''", "'Othe'"),
    "b": ("true", "false"),
    "dc": ("'2000-01-01'", "'2000-01-02'", "'2000-01-03'", "'infinity'", "'1999-12-31'"),
    "i": ("0", "20", "-1", "21", "10", "5", "2147483647", "-2147483648", "19", "1"),
    "big": ("-5", "5", "-6", "6", "0", "9223372036854775807", "-9223372036854775808", "4"),
    "s": ("0", "3", "-1", "4", "32767", "-32768", "2"),
    "f": ("0", "10", "'NaN'", "'Infinity'", "'-Infinity'", "-0.0", "9.999999999999998", "10.000000000000002",
          "2.5", "5e-324", "-5e-324", "5", "7.5", "1e308", "0.1", "3"),
    "n": ("0", "10", "'NaN'", "'Infinity'", "'-Infinity'", "9.99999999999999999999", "10.00000000000000000001", "2.5",
          "5.000", "-0.0000000000000000001", "7.5", "0.1", "3", "1e100"),
    "d": ("'2000-01-01'", "'2000-12-31'", "'1999-12-31'", "'2001-01-01'", "'infinity'", "'-infinity'", "'2000-03-31'",
          "'2000-04-01'", "'2000-02-29'", "'2000-01-02'", "'2000-01-03'", "'2000-03-26'", "'2000-10-29'", "'2000-06-30'",
          "'2000-07-01'", "'4713-01-01 BC'", "'294276-12-31'", "'5874897-12-31'", "'2000-12-25'", "'2000-01-09'"),
    "ts": ("'2000-01-01 00:00'", "'1999-12-31 23:59:59.999999'", "'2000-12-31 23:59:59.999999'", "'2001-01-01 00:00'",
           "'infinity'", "'-infinity'", "'2000-03-26 02:30'", "'2000-10-29 02:30'", "'2000-03-31 23:59:59.999999'",
           "'2000-04-01 00:00'", "'2000-01-02 12:00'", "'2000-01-03 00:00'", "'2000-02-29 12:00'",
           "'294276-12-31 23:59:59'", "'2000-06-30 23:00'"),
    "tz": ("'2000-01-01 00:00+00'", "'1999-12-31 23:30+00'", "'2000-01-01 02:00+00'", "'2000-12-31 23:59:59.999999+00'",
           "'2001-01-01 00:00+00'", "'2001-01-01 03:00+00'", "'infinity'", "'-infinity'", "'2000-03-26 01:30+00'",
           "'2000-03-26 00:30+00'", "'2000-10-29 00:30+00'", "'2000-10-29 01:30+00'", "'2000-04-02 06:30+00'",
           "'2000-10-29 05:30+00'", "'2000-03-31 23:00+00'", "'2000-04-01 02:00+00'", "'2000-06-30 22:00-05'",
           "'2000-01-02 23:30+00'", "'2000-01-03 01:00+00'", "'294276-12-31 23:59:59+00'", "'2000-10-08 02:30+00'",
           "'2000-10-08 03:30+00'", "'2000-02-27 01:30+00'", "'2000-02-27 02:30+00'"),
    "w": ("'2000-01-01'", "'2003-12-31'", "'1999-12-31'", "'2004-01-01'", "'infinity'", "'2001-03-31'",
          "'2001-04-01'", "'2002-12-29'", "'2003-01-01'", "'2000-02-29'"),
    "dt": ("'a'", "'b'", "'x'", "'A'", "'a '", "''", "'Other'", "' a'", "'B'"),
    "en": ("'sad'", "'ok'", "'happy'", "'meh'", "'Ok'", "'sad'"),
    "di": ("0", "1", "2", "-1", "3", "-99", "2147483647", "1"),
    "iv": ("'1 day'", "'2 hours'", "'-1 day'", "'1 mon'", "'24 hours'"),  # no policy: read by conditions only
}
KEY_COLUMNS = tuple(_VALUES)
KEY_ROWS = 60


def key_rows_sql() -> str:
    """The INSERT of ``gk``'s :data:`KEY_ROWS` rows: row k holds each column's value k modulo its
    count, NULL every 11th row (but ``b``'s, every 13th) and in the last."""
    rows = []
    for k in range(KEY_ROWS):
        values = [str(k)] + [("NULL" if k % (13 if name == "b" else 11) == 10 or k == KEY_ROWS - 1 else pool[k % len(pool)])
                             for name, pool in _VALUES.items()]
        rows.append("(" + ", ".join(values) + ")")
    return "INSERT INTO gk VALUES " + ", ".join(rows)


def create_key_table(test_db: TestDatabase) -> None:
    """(Re)create ``gk`` with its :data:`KEY_ROWS` rows; dpproxy's service role may read it."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS gk; DROP DOMAIN IF EXISTS gk_text, gk_int; DROP TYPE IF EXISTS gk_mood")
        conn.execute(KEY_TYPES_DDL)
        conn.execute(f"CREATE TABLE gk ({KEY_TABLE_DDL})")
        conn.execute(key_rows_sql())
        conn.execute("GRANT SELECT ON gk TO dpproxy_service")
