"""Date-part keys, exact float sums, public relations and refusal hints, attacked.

Found and fixed, each pinned here with the probe that found it: a repeat keyed on the backend
SQL alone answered one date part with another's release over the same ``date_trunc`` buckets;
COUNT(DISTINCT) per date part added up per-bucket distinct counts; a float AVG whose bounds are
subnormal (every grid point 0) was noised at scale 0, an internal error after its charge; a
public view redefined, or a public table made a protected one's inheritance parent, after start
passed the protected rows until a reload; a public table whose row-level security policy reads
a protected one passed its values (which rows come back).

Probes that held (regression tests): date parts on ``kn0`` and neighbours that each hold one
adversarial row (the declared range's edges in UTC+14 and -12, the types' limits, BC, NULL,
NaN, ±Infinity, subnormals) give the same outcome, keys, types and notices in odd TimeZones;
post-processing that the labels decide fails before the charge; refusal hints read the policy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from policies.loader import PolicyError
from proxy.serving.server import Server
from tests.neighbour_outcome import create_neighbours, masked_outcome
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, running_proxy, spent_epsilon

_DDL = "(id int, c text, d date, ts timestamp, tz timestamptz, f float8, r real, z float8)"
_BASE_ROWS = (
    "SELECT i, (ARRAY['a', 'b'])[1 + i % 2], DATE '2020-01-01' + (i % 366), "
    "TIMESTAMP '2020-01-01 06:00' + (i % 366) * interval '1 day', "
    "TIMESTAMPTZ '2020-01-01 12:00+00' + (i % 366) * interval '1 day', (i % 10)::float8, (i % 10)::real, "
    "(i % 3) * 5e-311 FROM generate_series(1, 400) i"
)
_NEIGHBOURS = {
    "kn1": "(1001, 'a', '2020-12-31', '2020-12-31 23:59:59.999999', '2020-12-31 23:59:59.999999+14', 9.999999999, 9.99, 1e-310)",
    "kn2": "(1002, 'b', '2020-01-01', '2020-01-01 00:00', '2020-01-01 00:00-12', -0.0, -0.0, -0.0)",
    "kn3": "(1003, NULL, 'infinity', 'infinity', 'infinity', 'NaN', 'NaN', 'NaN')",
    "kn4": "(1004, 'zz', '-infinity', '-infinity', '-infinity', 'Infinity', '-Infinity', '-Infinity')",
    "kn5": "(1005, 'a', '5874897-12-31', '294276-12-31 23:59:59', '294276-12-31 23:59:59+00', 1e308, 3.4e38, 1e308)",
    "kn6": "(1006, 'b', '4713-01-01 BC', '4713-01-01 00:00 BC', '4713-01-01 00:00+00 BC', 5e-324, 1e-45, 5e-324)",
    "kn7": "(1007, 'a', '2019-12-31', '2019-12-31 23:59:59.999999', '2019-12-31 10:00:00-12', -1e308, -3.4e38, -5e-324)",
    "kn8": "(1008, 'a', '2021-01-01', '2021-01-01 00:00', '2021-01-01 00:00+14', 2.2250738585072014e-308, 1.2e-38, 2.2250738585072014e-308)",
    "kn9": "(1009, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
}

_POLICY = ATTACK_POLICY_HEAD + """
  public.kn0: &K
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    max_cells: 2000
    columns:
      c: {{categories: [a, b], group_by: true}}
      d: {{bounds: [2020-01-01, 2020-12-31], group_by: [day, week, month, quarter, year]}}
      ts: {{bounds: [2020-01-01, 2020-12-31], group_by: [day, week, month, quarter]}}
      tz: {{bounds: [2020-01-01, 2020-12-31], group_by: [day, month]}}
      f: {{bounds: [-5, 10]}}
      r: {{bounds: [0.001, 10]}}
      z: {{bounds: [0, 1.0e-310]}}
""" + "".join(f"  public.{name}: *K\n" for name in _NEIGHBOURS)


@pytest.fixture(scope="module")
def keys_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "kn0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(proxy: RunningProxy, sql: str, keys: int = 0, setup: tuple[str, ...] = ()) -> tuple[object, ...]:
    with proxy.connect() as conn:
        for statement in setup:
            conn.execute(statement)
        base = masked_outcome(conn, sql, "kn0", keys=keys)
        for name in _NEIGHBOURS:
            assert masked_outcome(conn, sql, name, keys=keys) == base, (name, sql, setup)
    return base


# ---------------------------------------------------------------- repeats of date parts


def test_a_date_part_is_not_answered_with_another_parts_release_over_the_same_buckets(keys_proxy: RunningProxy) -> None:
    # The day of month and the day of week both group the backend's rows by date_trunc('day', d):
    # the same backend SQL. The repeat store keyed on it answered the day of month with the day
    # of week's seven stored cells (labels 5, 6, 7, 1, 2, 3, 4), uncharged.
    with keys_proxy.connect() as conn:
        conn.execute("SELECT EXTRACT(DOW FROM d) AS k, count(*) FROM kn0 GROUP BY 1").fetchall()
        days = conn.execute("SELECT EXTRACT(DAY FROM d) AS k, count(*) FROM kn0 GROUP BY 1").fetchall()
        months = conn.execute("SELECT EXTRACT(MONTH FROM d) AS k, count(*) FROM kn0 GROUP BY 1").fetchall()
        quarters = conn.execute("SELECT EXTRACT(QUARTER FROM d) AS k, count(*) FROM kn0 GROUP BY 1").fetchall()
    assert [int(k) for k, _ in days] == list(range(1, 32))
    assert [int(k) for k, _ in months] == list(range(1, 13))
    assert [int(k) for k, _ in quarters] == [1, 2, 3, 4]


def test_a_repeat_of_a_date_part_is_still_the_stored_release(keys_proxy: RunningProxy) -> None:
    sql = "SELECT EXTRACT(ISODOW FROM ts) AS k, count(*) FROM kn0 GROUP BY 1"
    with keys_proxy.connect() as conn:
        first = conn.execute(sql).fetchall()
        assert conn.execute(sql).fetchall() == first


# ---------------------------------------------------------------- COUNT(DISTINCT) per date part


def _error(proxy: RunningProxy, sql: str) -> psycopg.Error:
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    return caught.value


@pytest.mark.parametrize("key", ["EXTRACT(QUARTER FROM tz)", "EXTRACT(MONTH FROM d)", "EXTRACT(DOW FROM tz)",
                                 "date_trunc('week', ts + INTERVAL '1 day') + INTERVAL '-1 day'"])
def test_count_distinct_per_date_part_is_refused_for_its_cells_add_up_buckets(keys_proxy: RunningProxy, key: str) -> None:
    # The year of ts when it was a part of ts' quarters collected four quarter buckets; the
    # backend counted c's 2 distinct values in each and dpproxy added them up: ~8, not 2. (The
    # year is nested in the quarter now: its own DATE_TRUNC key, one bucket per cell.)
    error = _error(keys_proxy, f"SELECT {key} AS k, count(DISTINCT c) FROM kn0 GROUP BY 1")
    assert error.sqlstate == "DP001" and "aggregate-combination" in str(error)
    assert "DATE_TRUNC" in (error.diag.message_hint or "")


@pytest.mark.parametrize("key", ["CAST(ts AS DATE)", "d", "date_trunc('quarter', ts)", "EXTRACT(YEAR FROM ts)",
                                 "date_trunc('week', tz)"])
def test_count_distinct_per_one_bucket_cell_is_answered(keys_proxy: RunningProxy, key: str) -> None:
    with keys_proxy.connect() as conn:
        rows = conn.execute(f"SELECT {key} AS k, count(DISTINCT c) FROM kn0 GROUP BY 1").fetchall()
    assert rows


# ---------------------------------------------------------------- exact float sums on the grid


def test_avg_of_a_float_column_with_subnormal_bounds_is_answered(keys_proxy: RunningProxy) -> None:
    # z's bounds [0, 1e-310] put every value on grid point 0 (the grid's 2^1023 is the finest a
    # double holds): the centred sum's sensitivity is 0 points, and noise of scale 0 raised
    # after the charge, an internal error that closed the session.
    with keys_proxy.connect() as conn:
        (mean,) = conn.execute("SELECT avg(z) FROM kn0").fetchone()
        assert 0.0 <= mean <= 1e-310
        rows = conn.execute("SELECT EXTRACT(MONTH FROM d) AS m, avg(z), sum(z) FROM kn0 GROUP BY 1").fetchall()
        assert len(rows) == 12


# ---------------------------------------------------------------- public relations that start reading protected rows

_PASS_POLICY = ATTACK_POLICY_HEAD + """
  public.kp_secret: {{access: protected, epsilon: 1.0, columns: {{v: {{bounds: [0, 100]}}}}}}
  public.kp_pub: {{access: public}}
  public.kp_view: {{access: public}}
  public.kp_parent: {{access: public}}
"""


@pytest.fixture
def watched_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningProxy]:
    monkeypatch.setattr("proxy.serving.server.FUNCTION_NAMES_REFRESH_S", 0.2)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS kp_secret, kp_pub, kp_parent CASCADE")
        conn.execute("CREATE TABLE kp_secret (v int); INSERT INTO kp_secret VALUES (42)")
        conn.execute("CREATE TABLE kp_pub (v int); INSERT INTO kp_pub VALUES (1)")
        conn.execute("CREATE TABLE kp_parent (v int)")
        conn.execute("CREATE VIEW kp_view AS SELECT v FROM kp_pub")
        conn.execute("GRANT SELECT ON kp_secret, kp_pub, kp_parent, kp_view TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _PASS_POLICY) as running:
        yield running


def _refused_within(proxy: RunningProxy, sql: str, seconds: float = 10.0) -> psycopg.Error:
    deadline = time.monotonic() + seconds
    with proxy.connect() as conn:
        while True:
            try:
                rows = conn.execute(sql).fetchall()
            except psycopg.Error as exc:
                return exc
            assert (42,) not in rows or time.monotonic() < deadline, f"{sql} still passes protected rows: {rows}"
            time.sleep(0.1)


@pytest.mark.parametrize("ddl", ["CREATE OR REPLACE VIEW kp_view AS SELECT v FROM kp_secret",
                                 "ALTER TABLE kp_secret INHERIT kp_parent"])
def test_a_public_relation_that_starts_reading_a_protected_table_is_refused(
        watched_proxy: RunningProxy, test_db: TestDatabase, ddl: str) -> None:
    # A view redefined after start, or a protected table made an inheritance child of a public
    # one, passed the protected rows (42) through exactly until the next reload.
    relation = "kp_view" if "VIEW" in ddl else "kp_parent"
    with watched_proxy.connect() as conn:
        assert (42,) not in conn.execute(f"SELECT * FROM {relation}").fetchall()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(ddl)
    try:
        error = _refused_within(watched_proxy, f"SELECT * FROM {relation}")
        assert error.sqlstate == "42501" and "default-deny" in str(error)
        with watched_proxy.connect() as conn:  # the other public relation still answers
            assert conn.execute("SELECT * FROM kp_pub").fetchall() == [(1,)]
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE kp_secret NO INHERIT kp_parent" if "INHERIT" in ddl
                         else "CREATE OR REPLACE VIEW kp_view AS SELECT v FROM kp_pub")


# ---------------------------------------------------------------- probes that held: date parts on neighbours

_ZONES = ("UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/Havana", "<+14>-14", "America/Santiago")
_PART_KEYS = (
    "EXTRACT(MONTH FROM {c})", "date_part('quarter', {c})", "EXTRACT(DAY FROM {c})", "EXTRACT(DOW FROM {c})",
    "EXTRACT(ISODOW FROM {c})", "EXTRACT(DOY FROM {c})", "EXTRACT(WEEK FROM {c})", "CAST({c} AS DATE)",
    "CAST(extract(dow from {c}) AS integer) + 1",
    "CASE WHEN mod(CAST(extract(dow from {c}) AS integer) + 1 + 5, 7) = 0 THEN 7 "
    "ELSE mod(CAST(extract(dow from {c}) AS integer) + 1 + 5, 7) END",
    "date_trunc('week', {c} + INTERVAL '1 day') + INTERVAL '-1 day'",
    "DATE_TRUNC('day', CAST({c} AS DATE)) + (-EXTRACT(DOW FROM {c}) * INTERVAL '1 DAY')",
    "EXTRACT(DOW FROM CAST({c} AS timestamptz))", "EXTRACT(DAY FROM CAST({c} AS date))",
    "{c}",  # a date column by itself is its day's bucket; a timestamp's raw values are refused
)
_SHAPES = (  # each with its number of leading key columns (compared value for value)
    ("SELECT {k} AS k, count(*), sum(f), avg(r) FROM {t} GROUP BY 1", 1),
    ("SELECT {k} AS k FROM {t} GROUP BY 1 ORDER BY 1 DESC", 1),
    ("SELECT {k} AS k, c, count(*) FROM {t} WHERE {c} >= '2020-02-27' AND {c} < '2020-03-02 12:00' GROUP BY 1, 2", 2),
    ('SELECT "source"."k" AS "k", count(*) AS "count" FROM (SELECT {k} AS "k" FROM {t}) AS "source" '
     'GROUP BY "source"."k" ORDER BY "source"."k" ASC', 1),
    ("SELECT {k} AS k, c, count(*) FROM {t} JOIN (SELECT c AS c__ FROM {t} GROUP BY c ORDER BY c LIMIT 1) "
     "AS series_limit ON c = c__ GROUP BY 1, 2", 0),
    ("SELECT {k} AS k, EXTRACT(YEAR FROM {c}), EXTRACT(MONTH FROM {c}), count(*) FROM {t} GROUP BY 1, 2, 3 "
     "HAVING {k} IS NOT NULL ORDER BY 1, 2, 3 LIMIT 40", 3),
)


@pytest.mark.parametrize("shape", _SHAPES)
@pytest.mark.parametrize("key", _PART_KEYS)
def test_a_date_parts_outcome_keys_and_notices_are_the_same_on_neighbouring_tables(
        keys_proxy: RunningProxy, key: str, shape: tuple[str, int]) -> None:
    # Rows at the declared range's edges in UTC+14 and -12, at the types' limits, BC, NULL;
    # a different column and TimeZone per case (all would take minutes).
    index = _PART_KEYS.index(key) + _SHAPES.index(shape)
    column, zone = ("d", "ts", "tz")[index % 3], _ZONES[index % len(_ZONES)]
    sql = shape[0].replace("{k}", key).replace("{c}", column)
    _same_on_neighbours(keys_proxy, sql, shape[1], (f"SET TimeZone = '{zone}'",))


# Units nested in a listed one (tz lists day and month, ts day … quarter), and DATE_TRUNC keys
# over one column taken together: each with its number of leading key columns.
_NESTED_KEYS = (
    ("date_trunc('week', tz)", 1), ("date_trunc('quarter', tz)", 1), ("CAST(date_trunc('year', tz) AS date)", 1),
    ("DATE_TRUNC('QUARTER', CAST(tz AS DATE))", 1), ("date_trunc('year', ts)", 1), ("EXTRACT(YEAR FROM tz)", 1),
    ("date_trunc('year', {c}), date_trunc('month', {c})", 2), ("date_trunc('month', {c}), date_trunc('week', {c})", 2),
    ("EXTRACT(YEAR FROM {c}), date_trunc('quarter', {c}), EXTRACT(MONTH FROM {c})", 3),
    ("date_trunc('week', {c}), date_trunc('day', {c})", 2),
)


@pytest.mark.parametrize("keys", _NESTED_KEYS)
@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/Havana"])
def test_nested_units_and_date_trunc_pairs_are_the_same_on_neighbouring_tables(
        keys_proxy: RunningProxy, keys: tuple[str, int], zone: str) -> None:
    # Rows at the range's edges in UTC+14 and -12, past timestamp's range (5874897), BC, NULL.
    column = ("d", "ts", "tz")[(_NESTED_KEYS.index(keys) + len(zone)) % 3]
    listed, count = keys[0].replace("{c}", column), keys[1]
    positions = ", ".join(str(i + 1) for i in range(count))
    sql = f"SELECT {listed}, count(*), sum(f) FROM {{t}} GROUP BY {positions} ORDER BY {positions}"
    outcome = _same_on_neighbours(keys_proxy, sql, count, (f"SET TimeZone = '{zone}'",))
    assert outcome[0] == "answer", outcome


@pytest.mark.parametrize("sql, sqlstate", [
    ("SELECT CAST(EXTRACT(DOY FROM ts) AS numeric(2, 0)) AS k, count(*) FROM kn0 GROUP BY EXTRACT(DOY FROM ts)", "22003"),
    ("SELECT 100 / (EXTRACT(DOW FROM tz) - 3) AS k, count(*) FROM kn0 GROUP BY EXTRACT(DOW FROM tz)", "22012"),
    ("SELECT CAST(date_trunc('week', d + INTERVAL '1 day') + INTERVAL '-1 day' AS date) - DATE '2020-01-05' + 1 / 0 "
     "AS k, count(*) FROM kn0 GROUP BY date_trunc('week', d + INTERVAL '1 day') + INTERVAL '-1 day'", "22012"),
])
def test_post_processing_a_date_parts_labels_cannot_do_fails_before_the_charge(
        keys_proxy: RunningProxy, sql: str, sqlstate: str) -> None:
    error = _error(keys_proxy, sql)
    assert error.sqlstate == sqlstate


@pytest.mark.parametrize("sql", [
    "SELECT sum(f), avg(f), sum(r), avg(r), sum(z), avg(z) FROM {t}",
    "SELECT EXTRACT(MONTH FROM d) AS m, sum(f), avg(r), sum(z) FROM {t} GROUP BY 1",
    "SELECT c, sum(f), avg(r) FROM {t} WHERE f <> 3 GROUP BY c",
    "SELECT date_trunc('month', ts) AS m, c, sum(f) AS s FROM {t} JOIN (SELECT c AS c__, avg(r) AS mme FROM {t} "
    "GROUP BY c ORDER BY c LIMIT 1) AS series_limit ON c = c__ GROUP BY 1, 2",
    "SELECT round(CAST(sum(f) AS numeric), 2), pg_typeof(sum(r)), pg_typeof(avg(r)) FROM {t}",
])
def test_a_float_sums_outcome_and_type_are_the_same_on_neighbouring_tables(keys_proxy: RunningProxy, sql: str) -> None:
    # NaN, ±Infinity, ±1e308, ±3.4e38 in a real, subnormals, -0.0: summed exactly on the grid.
    _same_on_neighbours(keys_proxy, sql)


@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Etc/GMT+12"])
def test_a_refusal_hint_is_the_same_on_neighbouring_tables(keys_proxy: RunningProxy, zone: str) -> None:
    for sql in ("SELECT ts, count(*) FROM {t} GROUP BY ts", "SELECT d FROM {t}", "SELECT c FROM {t}",
                "SELECT EXTRACT(HOUR FROM tz), count(*) FROM {t} GROUP BY 1",
                "SELECT date_trunc('hour', tz), count(*) FROM {t} GROUP BY 1",
                "SELECT date_trunc('decade', tz), count(*) FROM {t} GROUP BY 1"):
        outcome = _same_on_neighbours(keys_proxy, sql, 0, (f"SET TimeZone = '{zone}'",))
        assert outcome[0] == "error" and outcome[3], sql


def test_a_policy_whose_public_table_has_a_row_security_policy_reading_a_protected_one_is_refused(
        test_db: TestDatabase, tmp_path: Path) -> None:
    # Passed through before: SELECT * FROM kr_pub answered [(42,)], the one value of kr_secret
    # among 0 … 100 (the policy's USING keeps the rows whose v is in kr_secret).
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS kr_secret, kr_pub CASCADE")
        conn.execute("CREATE TABLE kr_secret (v int); INSERT INTO kr_secret VALUES (42)")
        conn.execute("CREATE TABLE kr_pub (v int); INSERT INTO kr_pub SELECT generate_series(0, 100)")
        conn.execute("GRANT SELECT ON kr_secret, kr_pub TO dpproxy_service")
        conn.execute("ALTER TABLE kr_pub ENABLE ROW LEVEL SECURITY")
        conn.execute("CREATE POLICY leak ON kr_pub FOR SELECT USING (v IN (SELECT v FROM kr_secret))")
    text = ATTACK_POLICY_HEAD + """
  public.kr_secret: {{access: protected, epsilon: 1.0, columns: {{v: {{bounds: [0, 100]}}}}}}
  public.kr_pub: {{access: public}}
"""
    with pytest.raises(PolicyError) as refused:
        asyncio.run(Server.create(make_policy(test_db, tmp_path / "ledger.sqlite3", text)))
    (problem,) = refused.value.problems
    assert problem.startswith("tables.public.kr_pub: a public relation that reads protected table public.kr_secret")
