"""GROUP BY over declared keys through dpproxy: noised histograms and time series (policy opt-in).

A table whose policy opts columns in (``group_by``) answers GROUP BY over their declared
domains: every declared key comes back, whatever the rows hold, each cell noised with the
column's whole share of ε (the cells are disjoint). Without the opt-in GROUP BY is refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from proxy.demo import SERVICE_ROLE

POLICY = TEST_POLICY + """\
  public.visits:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    max_cells: 400
    columns:
      sex: {{categories: [Male, Female], group_by: true}}
      race: {{categories: [White, Black], group_by: true, other: Other}}
      device: {{categories: [phone, laptop]}}
      age: {{bounds: [17, 90], group_by: true}}
      income: {{bounds: [0, 1000]}}
      score: {{bounds: [0, 1], group_by: true}}
      visited_on: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, quarter, week]}}
      visited_at: {{bounds: [2023-01-01, 2023-12-31], group_by: true}}
      logged_at: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, day]}}
"""

VISITS = """
DROP TABLE IF EXISTS visits;
CREATE TABLE visits (sex text, race varchar(20), device text, age integer, income numeric, score double precision,
                     visited_on date, visited_at timestamp, logged_at timestamptz);
INSERT INTO visits
SELECT CASE WHEN i % 3 = 0 THEN 'Female' WHEN i % 97 = 0 THEN 'Unknown' ELSE 'Male' END,
       CASE WHEN i % 5 = 0 THEN 'Black' WHEN i % 7 = 0 THEN 'Asian' WHEN i % 11 = 0 THEN NULL ELSE 'White' END,
       CASE WHEN i % 2 = 0 THEN 'phone' ELSE 'laptop' END,
       18 + i % 60, (i * 37) % 1000, (i % 100) / 100.0,
       DATE '2023-01-01' + (i % 365), TIMESTAMP '2023-01-01' + (i % 365) * INTERVAL '1 day',
       TIMESTAMPTZ '2023-01-01 12:00+00' + (i % 365) * INTERVAL '1 day'
FROM generate_series(1, 3000) AS i;
INSERT INTO visits (sex, visited_on, score) VALUES ('Male', '5000000-01-01', 'NaN'), ('Male', 'infinity', 'Infinity');
"""


@pytest.fixture(scope="module")
def hproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(VISITS)
        conn.execute(f"GRANT SELECT ON visits TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _rows(proxy: RunningProxy, sql: str) -> tuple[list[str], list[tuple]]:
    with proxy.connect() as conn:
        cursor = conn.execute(sql)
        assert cursor.description is not None
        return [c.name for c in cursor.description], cursor.fetchall()


def test_group_by_a_category_answers_every_declared_key_in_declared_order(hproxy, admin):
    names, rows = _rows(hproxy, "SELECT sex, COUNT(*) FROM visits GROUP BY sex")
    assert names == ["sex", "count"]
    assert [r[0] for r in rows] == ["Male", "Female"]
    exact = dict(admin.execute("SELECT sex, count(*) FROM visits GROUP BY sex").fetchall())
    for sex, count in rows:
        assert abs(count - exact[sex]) < 30


def test_superset_pie_shape_is_answered_with_order_and_limit(hproxy):
    names, rows = _rows(hproxy, "SELECT sex AS sex, COUNT(*) AS count FROM public.visits GROUP BY sex "
                                "ORDER BY count DESC LIMIT 100")
    assert names == ["sex", "count"]
    assert [r[0] for r in rows] == ["Male", "Female"]  # ~2,000 against ~1,000


def test_superset_monthly_line_shape_is_answered(hproxy, admin):
    names, rows = _rows(hproxy, "SELECT DATE_TRUNC('MONTH', visited_at) AS visited_at, COUNT(*) AS count "
                                "FROM public.visits GROUP BY DATE_TRUNC('MONTH', visited_at) "
                                "ORDER BY visited_at LIMIT 10000")
    assert names == ["visited_at", "count"]
    assert [r[0] for r in rows] == [datetime(2023, m, 1) for m in range(1, 13)]


def test_date_column_buckets_are_timestamptz_and_far_dates_fall_in_no_cell(hproxy):
    names, rows = _rows(hproxy, "SELECT date_trunc('quarter', visited_on), count(*) FROM visits GROUP BY 1")
    assert [r[0].date() for r in rows] == [date(2023, m, 1) for m in (1, 4, 7, 10)]
    assert all(r[0].tzinfo is not None for r in rows)


def test_other_key_catches_null_and_undeclared_values(hproxy, admin):
    _, rows = _rows(hproxy, "SELECT race, count(*) FROM visits GROUP BY race")
    assert [r[0] for r in rows] == ["White", "Black", "Other"]
    (exact_other,) = admin.execute(
        "SELECT count(*) FROM visits WHERE race IS NULL OR race NOT IN ('White', 'Black')").fetchone()
    assert abs(rows[2][1] - exact_other) < 30


def test_several_keys_give_the_cross_product(hproxy):
    _, rows = _rows(hproxy, "SELECT sex, race, count(*), sum(income), avg(age) FROM visits GROUP BY sex, race")
    assert [(r[0], r[1]) for r in rows] == [(s, r) for s in ("Male", "Female") for r in ("White", "Black", "Other")]


def test_width_bucket_bins_answer_every_bin(hproxy):
    _, rows = _rows(hproxy, "SELECT width_bucket(score, 0, 1, 4) AS bin, count(*) FROM visits GROUP BY 1 ORDER BY 1")
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4, 5]


def test_integer_column_with_bounds_groups_by_each_value(hproxy):
    _, rows = _rows(hproxy, "SELECT age, count(*) FROM visits GROUP BY age")
    assert [r[0] for r in rows] == list(range(17, 91))


def test_count_distinct_per_group(hproxy, admin):
    _, rows = _rows(hproxy, "SELECT sex, count(DISTINCT age) FROM visits GROUP BY sex")
    exact = dict(admin.execute("SELECT sex, count(DISTINCT age) FROM visits GROUP BY sex").fetchall())
    assert all(abs(n - exact[sex]) < 30 for sex, n in rows)


def test_group_by_without_opt_in_is_refused_with_a_hint(hproxy):
    with hproxy.connect() as conn:
        with pytest.raises(psycopg.Error) as error:
            conn.execute("SELECT device, count(*) FROM visits GROUP BY device")
    assert error.value.sqlstate == "DP001" and "rule: no-group-by" in str(error.value)
    assert "sex" in error.value.diag.message_hint


def test_histogram_notice_says_cells_share_epsilon(hproxy):
    with hproxy.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        before = spent_epsilon(conn)
        conn.execute("SELECT sex, count(*), avg(age) FROM visits GROUP BY sex").fetchall()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    (notice,) = notices
    assert "for 2 groups" in notice and "per group" in notice, notice
