"""The BI tools' keys and wrappers (Grafana's epoch buckets, Tableau's YEAR and casts, Metabase's
"source" subquery) attacked on neighbouring tables: one row must change nothing but the noise.

The neighbours are test_attack_histograms' (``hn0`` and ``hn1`` … ``hn5``, each one adversarial
row more: DST-gap instants, NaN and infinities, the types' limits, BC, the declared ranges' edges).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy
from tests.neighbour_outcome import masked_outcome
from tests.test_attack_histograms import _NEIGHBOURS, hist_proxy

__all__ = ["hist_proxy"]  # the fixture, used here as it is there

# What each statement shows besides the noised values must be the same on hn0 and every
# neighbour, in every session time zone (UTC+14, a DST gap at midnight, a half-hour offset).
_ZONES = ["UTC", "Pacific/Kiritimati", "Asia/Beirut", "Asia/Kathmandu", "America/Havana"]
_HELD = [
    # Grafana's $__timeGroupAlias on a date, a timestamp and an instant, with $__timeFilter
    "SELECT floor(extract(epoch from d)/86400)*86400 AS \"time\", count(*) FROM {t} "
    "WHERE d BETWEEN '2020-03-27T00:00:00Z' AND '2020-04-02T00:00:00Z' GROUP BY 1 ORDER BY 1",
    "SELECT floor(extract(epoch from ts)/604800)*604800 AS \"time\", sum(x), avg(f) FROM {t} GROUP BY 1",
    "SELECT floor(extract(epoch from tz)/604800)*604800 AS \"time\", t AS metric, count(*) FROM {t} "
    "WHERE tz BETWEEN '2020-03-28T00:00:00Z' AND '2020-03-30T23:59:59Z' GROUP BY 1, 2 ORDER BY 1",
    "SELECT floor(extract(epoch from tz)/31536000000)*31536000000 AS \"time\", count(*) FROM {t} GROUP BY 1",
    "SELECT floor(extract(epoch from tz)/86400)*86400, count(*) FROM {t} WHERE tz >= 'infinity' GROUP BY 1",
    "SELECT floor(extract(epoch from tz)/86400)*86400, count(*) FROM {t} WHERE tz < now() - interval '100 years' GROUP BY 1",
    # Tableau's YEAR(date) dimension and its casts, date_part's spelling of it
    "SELECT CAST(EXTRACT(YEAR FROM tz) AS INTEGER) AS y, SUM(1) FROM {t} GROUP BY 1",
    "SELECT EXTRACT(YEAR FROM d), count(*), avg(CAST(x AS DOUBLE PRECISION)) FROM {t} GROUP BY 1",
    "SELECT CAST(t AS TEXT) AS t, SUM(CAST(x AS BIGINT)), SUM(1) FROM {t} GROUP BY 1 ORDER BY 2 DESC",
    # Metabase's "source" wrapper, a key computed inside it, a WHERE inside it
    'SELECT "source"."m" AS "m", count(*) AS "count" FROM (SELECT date_trunc(\'month\', tz) AS "m", "x" '
    'FROM {t} WHERE x > 2) AS "source" GROUP BY "source"."m" ORDER BY "source"."m" ASC',
    'SELECT "source"."b", sum("source"."x") FROM (SELECT width_bucket(f, 0, 9, 3) AS "b", * FROM {t}) "source" '
    'GROUP BY 1 HAVING sum("source"."x") IS NOT NULL',
    'SELECT s.k, count(*) FROM (SELECT floor(extract(epoch from ts)/172800)*172800 AS k, ts FROM {t} '
    "ORDER BY ts) s WHERE s.ts >= '2020-12-01' GROUP BY 1",
    # post-processing over released cells
    "SELECT max(c), count(*) FROM (SELECT floor(extract(epoch from tz)/86400)*86400 AS k, count(*) AS c "
    "FROM {t} GROUP BY 1) AS cells WHERE c > 0",
]


@pytest.mark.parametrize("zone", _ZONES)
@pytest.mark.parametrize("sql", _HELD)
def test_bi_keys_show_the_same_on_neighbours_in_any_time_zone(hist_proxy: RunningProxy, sql: str, zone: str) -> None:
    with hist_proxy.connect() as conn:
        conn.execute(f"SET TimeZone = '{zone}'")
        base = masked_outcome(conn, sql, "hn0")
        for name in _NEIGHBOURS:
            assert masked_outcome(conn, sql, name) == base, name
    assert base[0] == "answer", base


# ---------------------------------------------------------------- buckets beyond datetime's years

_FAR_POLICY = ATTACK_POLICY_HEAD + """
  public.hn0:
    access: protected
    epsilon: 1.0
    columns:
      ts: {{bounds: [9999-01-01, 9999-12-31], group_by: true}}
      tz: {{bounds: [2020-01-01, 2020-12-31], group_by: true}}
"""


@pytest.fixture(scope="module")
def far_proxy(hist_proxy: RunningProxy, test_db: TestDatabase,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """hn0 under a policy whose ts range ends on the last day ``datetime`` holds."""
    with running_proxy(test_db, tmp_path_factory, _FAR_POLICY) as running:
        yield running


@pytest.mark.parametrize("sql, proxy", [
    # Grafana's bucket of 10^7 days (27,000 years): its end is no datetime
    ("SELECT floor(extract(epoch from tz)/864000000000)*864000000000, count(*) FROM hn0 GROUP BY 1", "hist"),
    ("SELECT floor(extract(epoch from tz)/345600000000)*345600000000 AS t, count(*) FROM hn0 GROUP BY 1", "hist"),
    # a range up to 9999-12-31: its last day's, week's or year's bucket ends in the year 10000
    ("SELECT date_trunc('day', ts), count(*) FROM hn0 GROUP BY 1", "far"),
    ("SELECT EXTRACT(YEAR FROM ts), count(*) FROM hn0 GROUP BY 1", "far"),
    ("SELECT floor(extract(epoch from ts)/86400)*86400, count(*) FROM hn0 GROUP BY 1", "far"),
])
def test_time_buckets_reaching_past_the_year_9999_are_answered_and_the_session_goes_on(
    hist_proxy: RunningProxy, far_proxy: RunningProxy, sql: str, proxy: str
) -> None:
    # They failed with XX000 (an OverflowError writing the last bucket's end) and the session
    # was ended: from the statement and the policy alone, but an internal error all the same.
    # The last bucket's end is now written as its start plus its width, for PostgreSQL to add.
    with (hist_proxy if proxy == "hist" else far_proxy).connect() as conn:
        assert conn.execute(sql).fetchall()
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert len(conn.execute("SELECT date_trunc('month', tz), count(*) FROM hn0 GROUP BY 1").fetchall()) == 12


# ---------------------------------------------------------------- errors the keys decide, before the charge


@pytest.mark.parametrize("sql, sqlstate", [
    # Tableau's YEAR cast to a type too narrow for the year: every cell's key fails, whatever the rows
    ("SELECT CAST(EXTRACT(YEAR FROM ts) AS integer) * 2000000, count(*) FROM hn0 GROUP BY EXTRACT(YEAR FROM ts)", "22003"),
    # a category's label cast to integer
    ("SELECT t::int, SUM(1) FROM hn0 GROUP BY t", "22P02"),
    ("SELECT date_trunc('month', d)::date + 2147483647, count(*) FROM hn0 GROUP BY date_trunc('month', d)", "22008"),
    ("SELECT 1/0 AS x, count(*) FROM hn0", "22012"),
])
def test_a_post_processing_error_the_keys_decide_costs_nothing(hist_proxy: RunningProxy, sql: str, sqlstate: str) -> None:
    # The outer statement's errors were raised after the charge: ε spent on an error that the
    # statement's text and the declared keys decided. It now runs once over the keys and NULL
    # aggregates before the charge.
    with hist_proxy.connect() as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql)
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert failed.value.sqlstate == sqlstate, str(failed.value)
    assert before is not None and after == before


def test_a_post_processing_error_the_noised_values_decide_is_still_charged(hist_proxy: RunningProxy) -> None:
    with hist_proxy.connect() as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute("SELECT count(*)::numeric(1, 0) FROM hn0 WHERE x IS NOT NULL")  # 60 rows: never below 10
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert before is not None and after is not None and after[1] - before[1] == pytest.approx(1.0)
