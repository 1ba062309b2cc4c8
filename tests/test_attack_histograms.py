"""Histograms (GROUP BY over declared keys) must show nothing of one row beyond the noise.

Found by attacking GROUP BY answers on neighbouring tables (``hn0``, and ``hn1``: the same rows
and one adversarial row more); each test pins one behaviour.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import RunningProxy, TestDatabase, running_proxy

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

_POLICY = """
backend: {{dsn: "{dsn}", statement_timeout_ms: 10000}}
listen: {{host: 127.0.0.1, port: 0}}
ledger: {{url: "sqlite:///{ledger}"}}
repeats: {{enabled: true}}
users:
  analyst: {{password: analyst, budget: {{epsilon: 1000000, delta: 0.9}}}}
tables:
  public.hn0: &H
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      x: {{bounds: [0, 9], group_by: true}}
      f: {{bounds: [0, 9], group_by: true}}
      r: {{bounds: [0, 9], group_by: true}}
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
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for name in ("hn0", *_NEIGHBOURS):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} {_DDL}")
            conn.execute(f"INSERT INTO {name} {_BASE_ROWS}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
        for name, row in _NEIGHBOURS.items():
            conn.execute(f"INSERT INTO {name} VALUES {row}")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]?\d+)?", re.IGNORECASE)


def _outcome(conn: psycopg.Connection, sql: str, table: str) -> tuple[object, ...]:
    """What the analyst sees of ``sql`` on ``table`` but the noised values: an error's SQLSTATE and
    message, or the columns, the keys (every column before the first aggregate), the tag and the
    notices with numbers masked."""
    notices: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.replace("{t}", table))
            columns = tuple((c.name, c.type_code) for c in cursor.description or ())
            rows = cursor.fetchall() if cursor.description else []
            return ("answer", columns, len(rows), cursor.statusmessage,
                    tuple(_NUMBER.sub("#", n.replace(table, "T")) for n in notices))
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, (exc.diag.message_primary or "").replace(table, "T"))
    finally:
        conn.remove_notice_handler(handler)


def _same_on_neighbours(proxy: RunningProxy, sql: str) -> tuple[object, ...]:
    """The outcome of ``sql`` on hn0, after checking that every neighbour shows the same."""
    with proxy.connect() as conn:
        base = _outcome(conn, sql, "hn0")
        for name in _NEIGHBOURS:
            assert _outcome(conn, sql, name) == base, name
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
