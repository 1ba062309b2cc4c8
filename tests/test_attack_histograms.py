"""Histograms (GROUP BY over declared keys) must show nothing of one row beyond the noise.

Found by attacking GROUP BY answers on neighbouring tables (``hn0``, and ``hn1``: the same rows
and one adversarial row more); each test pins one behaviour.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.neighbour_outcome import create_neighbours, masked_outcome
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy

_DDL = "(id int, x int, f float8, r real, n numeric, t text, d date, ts timestamp, tz timestamptz)"
_BASE_ROWS = (
    "SELECT i, i % 10, (i % 10)::float8, (i % 10)::real, (i % 10)::numeric, (ARRAY['a', 'b', 'c'])[1 + i % 3], "
    "DATE '2020-01-01' + (i % 300), TIMESTAMP '2020-01-01' + (i % 300) * interval '1 day', "
    "TIMESTAMPTZ '2020-01-01 12:00+00' + (i % 300) * interval '1 day' FROM generate_series(1, 60) i"
)
# Each neighbour's one row more than hn0: values between the integers, NaN and infinities, the
# types' limits, NULLs and BC, and the edges of the declared ranges.
_NEIGHBOURS = {
    "hn1": "(1000, 5, 2.5, 2.5, 2.5, 'zz', '2020-03-29', '2020-03-29 02:30', '2020-03-29 02:30+00')",
    "hn2": "(1001, 2147483647, 'NaN', 'NaN', 'NaN', '', 'infinity', 'infinity', 'infinity')",
    "hn3": "(1002, -2147483648, '-Infinity', 'Infinity', '-Infinity', NULL, '5874897-12-31', "
           "'294276-12-31 23:59:59', '294276-12-31 23:59:59+00')",
    "hn4": "(1003, NULL, 1e308, 3.4e38, 1e1000, E'\\\\', '4713-01-01 BC', '4713-01-01 00:00 BC', '4713-01-01 00:00+00 BC')",
    "hn5": "(1004, 9, 9, 9, 9.000001, 'b', '2020-12-31', '2020-12-31 23:59:59.999999', '2020-12-31 23:59:59.999999+14')",
}

_POLICY = ATTACK_POLICY_HEAD + """
  public.hn0: &H
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      x: {{bounds: [0, 9], group_by: true}}
      f: {{bounds: [0, 9], group_by: true}}
      r: {{bounds: [0, 9], group_by: true, avg: sample_aggregate}}
      n: {{bounds: [0, 9], group_by: true}}
      t: {{categories: [a, b], group_by: true, other: zz}}
      d: {{bounds: [2020-01-01, 2020-12-31], group_by: true}}
      ts: {{bounds: [2020-01-01, 2020-12-31], group_by: true}}
      tz: {{bounds: [2020-01-01, 2020-12-31], group_by: true}}
  public.hn1: *H
  public.hn2: *H
  public.hn3: *H
  public.hn4: *H
  public.hn5: *H
"""


@pytest.fixture(scope="module")
def hist_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "hn0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(proxy: RunningProxy, sql: str) -> tuple[object, ...]:
    """The outcome of ``sql`` on hn0, after checking that every neighbour shows the same."""
    with proxy.connect() as conn:
        base = masked_outcome(conn, sql, "hn0")
        for name in _NEIGHBOURS:
            assert masked_outcome(conn, sql, name) == base, name
    return base


@pytest.mark.parametrize("column", ["f", "r", "n"])
def test_group_by_a_non_integer_column_with_integer_bounds_is_refused_from_the_text(
    hist_proxy: RunningProxy, column: str
) -> None:
    # Grouped by its own values, a float or numeric column reports 2.5 (or numeric 2.0) for a
    # group: no integer cell's key. Answered, that failed with XX000 and ended the session
    # only on a table holding such a row.
    outcome = _same_on_neighbours(hist_proxy, f"SELECT {column}, count(*) FROM {{t}} GROUP BY {column}")
    assert outcome[:2] == ("error", "DP001")
    with hist_proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"SELECT count(*) FROM hn1 GROUP BY {column}")
        assert f"width_bucket({column}" in (refused.value.diag.message_hint or "")
        assert f"and {column}" not in (refused.value.diag.message_hint or "")
        rows = conn.execute(f"SELECT width_bucket({column}, 0, 9, 9) AS b, count(*) FROM hn1 GROUP BY 1").fetchall()
        assert [b for b, _ in rows] == list(range(11))


def test_group_by_an_integer_column_is_still_one_cell_per_integer(hist_proxy: RunningProxy) -> None:
    outcome = _same_on_neighbours(hist_proxy, "SELECT x, count(*) FROM {t} GROUP BY x")
    assert outcome[0] == "answer" and outcome[2] == 10


# Histogram statements that held: what they show besides the noised values is the same on hn0
# and on every neighbour, whatever the session's time zone (DST gaps and repeated hours in
# 2020: Beirut and Havana at midnight, Santiago, Kiritimati at +14).
_HELD = [
    ("", "SELECT t, count(*), sum(x), avg(f), mode() WITHIN GROUP (ORDER BY t) FROM {t} GROUP BY t"),
    ("", "SELECT x, t, count(*) FROM {t} WHERE x > 2 GROUP BY x, t HAVING count(*) > 1 ORDER BY count(*) DESC, 1 LIMIT 7"),
    ("", "SELECT t FROM (SELECT t, count(*) AS c FROM {t} GROUP BY t) AS s WHERE c > 10 ORDER BY c DESC"),
    ("", "SELECT width_bucket(f, 0, 9, 3) AS b, count(*), avg(f) FROM {t} GROUP BY 1"),
    ("", "SELECT width_bucket(r, 1e300, -1e300, 7) AS b, sum(r) FROM {t} GROUP BY 1"),
    ("", "SELECT width_bucket(n, 0.000000000000000000000000000001, 9, 4) AS b, avg(n) FROM {t} GROUP BY 1"),
    ("", "SELECT width_bucket(x, 9223372036854775807, 0, 3) AS b, width_bucket(x, 0.5, 9, 2), count(*) FROM {t} GROUP BY 1, 2"),
    ("", "SELECT date_trunc('quarter', ts) AS q, count(*) FROM {t} WHERE ts > '4713-01-01 BC' AND ts < '294276-12-31' GROUP BY 1"),
    ("", "SELECT date_trunc('day', d) AS k, count(*) FROM {t} WHERE d >= 'infinity' OR d IS NULL GROUP BY 1"),
    ("", "SELECT date_trunc('day', ts) AS k, count(*) FROM {t} WHERE ts >= '2020-12-31 23:59:59.999999' GROUP BY 1"),
    ("SET TimeZone = 'Asia/Beirut'", "SELECT date_trunc('day', d) AS k, count(*) FROM {t} WHERE d >= '2020-03-27' AND d < '2020-04-01' GROUP BY 1"),
    ("SET TimeZone = 'Asia/Beirut'", "SELECT date_trunc('day', tz) AS k, count(*) FROM {t} WHERE tz BETWEEN '2020-03-28' AND '2020-03-30' GROUP BY 1"),
    ("SET TimeZone = 'America/Havana'", "SELECT date_trunc('week', tz)::date AS k, count(*) FROM {t} WHERE tz >= '2020-10-25' GROUP BY 1"),
    ("SET TimeZone = 'America/Santiago'", "SELECT date_trunc('month', d) AS k, sum(x) FROM {t} GROUP BY 1 ORDER BY 2 DESC LIMIT 3"),
    ("SET TimeZone = 'Pacific/Kiritimati'", "SELECT date_trunc('day', tz) AS k, count(*) FROM {t} WHERE tz >= now() - interval '7 years' GROUP BY 1"),
    # date_trunc of the column cast to another time type (Tableau's), read in the session's time zone
    ("SET TimeZone = 'America/Havana'", "SELECT CAST(date_trunc('week', CAST(tz AS date)) AS date) AS k, count(*) FROM {t} WHERE tz >= '2020-10-25' GROUP BY 1"),
    ("SET TimeZone = 'Asia/Beirut'", "SELECT date_trunc('day', CAST(tz AS timestamp)) AS k, count(*) FROM {t} WHERE tz BETWEEN '2020-03-28' AND '2020-03-30' GROUP BY 1"),
    ("SET TimeZone = 'Asia/Beirut'", "SELECT date_trunc('day', d::timestamp) AS k, count(*) FROM {t} WHERE d >= '2020-03-27' AND d < '2020-04-01' GROUP BY 1"),
    ("SET TimeZone = 'America/Santiago'", "SELECT date_trunc('month', ts::timestamptz) AS k, sum(x) FROM {t} GROUP BY 1 ORDER BY 2 DESC LIMIT 3"),
    ("", "SELECT date_trunc('day', d) AS k, count(*) FROM {t} WHERE d >= '5874897-01-01'::date OR d < '-infinity' GROUP BY 1"),
]


# width_bucket arguments PostgreSQL rejects only when a row reaches them ("count must be greater
# than zero", "lower bound cannot equal upper bound"): WHERE id >= 1000 holds the neighbour's one
# row and none of hn0's, so answered, they would fail on the neighbours alone. Bounds beyond 1e300
# are refused with them, from the text.
_BINS_REFUSED = [
    "SELECT width_bucket(f, 0, 9, 0) AS b, count(*) FROM {t} WHERE id >= 1000 GROUP BY 1",
    "SELECT width_bucket(x, 5, 5, 3) AS b, count(*) FROM {t} WHERE id >= 1000 GROUP BY 1",
    "SELECT width_bucket(f, -1e301, 1e301, 3) AS b, count(*) FROM {t} WHERE id >= 1000 GROUP BY 1",
]


@pytest.mark.parametrize("sql", _BINS_REFUSED)
def test_width_bucket_arguments_postgresql_rejects_per_row_are_refused_from_the_text(
    hist_proxy: RunningProxy, sql: str
) -> None:
    assert _same_on_neighbours(hist_proxy, sql)[:2] == ("error", "DP001")


@pytest.mark.parametrize("seconds", [43200, 129600], ids=["12h", "36h"])
def test_an_epoch_bucket_of_no_whole_number_of_days_is_refused_where_its_cells_would_fit(
    hist_proxy: RunningProxy, seconds: int
) -> None:
    # tz opts 'day' in over 2020: 12-hour buckets are 732 cells and 36-hour ones 244, both
    # within max_cells (1000), so only the whole-days check stands between them and an answer
    # finer than (or straddling) the days the policy declares.
    sql = f"SELECT floor(extract(epoch from tz)/{seconds})*{seconds} AS k, count(*) FROM {{t}} GROUP BY 1"
    with hist_proxy.connect() as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
    outcome = _same_on_neighbours(hist_proxy, sql)
    with hist_proxy.connect() as conn:
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert outcome[:2] == ("error", "DP001") and "not a whole number of days" in str(outcome[2]), outcome
    assert "(rule: no-group-by)" in str(outcome[2]) and "1d or more" in str(outcome[3])
    assert before == after


@pytest.mark.parametrize(("setup", "sql"), _HELD)
def test_a_histogram_shows_the_same_on_neighbours_in_any_time_zone(hist_proxy: RunningProxy, setup: str, sql: str) -> None:
    with hist_proxy.connect() as conn:
        if setup:
            conn.execute(setup)
        base = masked_outcome(conn, sql, "hn0")
        for name in _NEIGHBOURS:
            assert masked_outcome(conn, sql, name) == base, name
    assert base[0] == "answer"


def test_a_histogram_charges_the_querys_epsilon_once_and_no_delta(hist_proxy: RunningProxy) -> None:
    # Three columns share ε = 1 (1/3 each, in every cell); AVG of r, set to sample and
    # aggregate, is a noisy sum over a noisy count per cell: no δ.
    notices: list[str] = []
    with hist_proxy.connect() as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        before = conn.execute("SHOW dpproxy.budget").fetchone()
        rows = conn.execute("SELECT t, count(*), sum(x), avg(r) FROM hn1 GROUP BY t").fetchall()
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert before is not None and after is not None and len(rows) == 3
    assert after[1] - before[1] == pytest.approx(1.0) and after[3] == before[3]
    assert "ε charged 1, δ 0 for 3 groups" in notices[0] and "count(*): laplace scale 3 " in notices[0]
    assert "sum(x): laplace scale 27 " in notices[0]
