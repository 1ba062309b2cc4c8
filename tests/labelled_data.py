"""``labelled``: a protected table whose categories a policy declares in another form than
PostgreSQL prints the column's values (a ``char(6)``'s without its blanks, a boolean's as
``yes``/``no``, a date's as ``2024-1-1``), for the checks that dpproxy releases them as PostgreSQL
prints them (tests/test_attack_stop45_differential.py, tests/test_parse_differential.py)."""

from __future__ import annotations

import psycopg

from tests.conftest import TestDatabase

__all__ = ["LABELLED_ROWS", "LABELLED_TABLE", "create_labelled"]

LABELLED_ROWS = 3000

LABELLED_TABLE = """\
  public.labelled:
    access: protected
    epsilon: 100.0
    delta: 1.0e-6
    columns:
      code: {{categories: [Male, Female], group_by: true}}
      flag: {{categories: ['yes', 'no'], group_by: true}}
      day: {{categories: ['2024-1-1', '2024-01-02'], other: '2024-1-3', group_by: true}}
"""
"""``labelled``'s entry under a policy's ``tables:`` (a format string: its braces doubled)."""


def create_labelled(test_db: TestDatabase) -> None:
    """(Re)create ``labelled``: two thirds of its rows Male, no and 2024-01-01, the rest Female, yes
    and 2024-01-02; dpproxy's service role may read it."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS labelled")
        conn.execute("CREATE TABLE labelled (code char(6), flag boolean, day date)")
        conn.execute("INSERT INTO labelled SELECT CASE WHEN i % 3 = 0 THEN 'Female' ELSE 'Male' END, i % 3 = 0, "
                     f"date '2024-01-01' + (i % 3 = 0)::int FROM generate_series(1, {LABELLED_ROWS}) AS i")
        conn.execute("GRANT SELECT ON labelled TO dpproxy_service")
