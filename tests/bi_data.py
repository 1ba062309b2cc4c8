"""The protected table the BI-tool tests draw on: ``people`` with a timestamp, and its policy.

``people`` (2,000 rows, deterministic) has what a BI tool's charts need: numbers to
aggregate (``age``, ``income``), a category (``sex``, opted in to GROUP BY) and a time column
(``signed_up``, one row a day from 2023-01-01, cycling every 730 days; opted in to GROUP BY by
day, week, month, quarter and year) for time ranges and time series. ``age`` is opted in too (its
74 integers, or ``width_bucket`` bins: a numeric axis); ``income`` is not, so a chart grouped by
it stays refused. The recorded
Superset statements (tests/data/superset-statements.md) refer to it by these names.
"""

from __future__ import annotations

import psycopg
from conftest import TEST_POLICY, TestDatabase

from proxy.demo.embedded import SERVICE_ROLE

__all__ = ["PEOPLE_POLICY", "PEOPLE_ROWS", "PEOPLE_TABLE", "create_people"]

PEOPLE_ROWS = 2000

PEOPLE_TABLE = """\
  public.people:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      age: {{bounds: [17, 90], group_by: true}}       # a numeric axis: a bar chart as a histogram
      income: {{bounds: [0, 100000]}}
      sex: {{categories: [Male, Female], group_by: true}}       # pie and bar charts by sex
      signed_up: {{bounds: [2023-01-01, 2024-12-31], group_by: [day, week, month, quarter, year]}}  # time series
"""
"""``people``'s entry under a policy's ``tables:`` (a format string: its braces doubled)."""

# As deployed: repeats on (the default), so a dashboard that refreshes gets its answers back.
PEOPLE_POLICY = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}") + PEOPLE_TABLE


def create_people(test_db: TestDatabase) -> int:
    """(Re)create ``people`` in the test database, let dpproxy's service role read it; its oid."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS people")
        conn.execute("CREATE TABLE people (id integer PRIMARY KEY, age integer, income integer, sex text,"
                     " signed_up timestamp)")
        conn.execute(f"""INSERT INTO people
            SELECT i, 18 + i % 60, (i * 37) % 100000, CASE WHEN i % 3 = 0 THEN 'Female' ELSE 'Male' END,
                   TIMESTAMP '2023-01-01 00:00:00' + (i % 730) * INTERVAL '1 day' + (i % 24) * INTERVAL '1 hour'
            FROM generate_series(1, {PEOPLE_ROWS}) AS i""")
        conn.execute("ANALYZE people")
        conn.execute(f"GRANT SELECT ON people TO {SERVICE_ROLE}")
        return int(conn.execute("SELECT 'public.people'::regclass::oid").fetchone()[0])
