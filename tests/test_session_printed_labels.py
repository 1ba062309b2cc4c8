"""A MODE over a column whose values PostgreSQL prints by the session's settings (a date in its
DateStyle, a timestamptz in its TimeZone, an interval in its IntervalStyle) answers its category as
the session prints it, as PostgreSQL's own MODE would and a GROUP BY's keys already were: the
categories are printed once at load under the service's settings (``ColumnInfo.printed_labels``),
and such a MODE is answered through the outer statement over its release, in the session
(rewriter/dp_query.py, ``_mode_printed_by_the_session``).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.string import TextLoader

from tests.conftest import RunningProxy, TestDatabase, proxy_over_table

_TABLE = "printed_labels"
_SETTINGS = ("SET DateStyle = 'SQL, DMY'", "SET TimeZone = 'Asia/Tokyo'", "SET IntervalStyle = 'sql_standard'")


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``printed_labels`` (i int4, d date, tz timestamptz, iv interval), 60 rows."""
    with proxy_over_table(test_db, tmp_path_factory, _TABLE, "i int4, d date, tz timestamptz, iv interval",
                          "SELECT g, date '2000-05-01' + g % 2, '2000-05-01 12:00+00', interval '-3 hours' "
                          "FROM generate_series(1, 60) g",
                          "{i: {bounds: [0, 100]}, d: {categories: ['2000-05-01', '2000-5-2']}, "
                          "tz: {categories: ['2000-05-01 12:00+00']}, iv: {categories: ['1 day 02:00', '-3 hours']}}"
                          ) as running:
        yield running


def _session(dsn: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=None)
    for setting in _SETTINGS:
        conn.execute(setting)
    return conn


@pytest.mark.parametrize(("column", "categories"), [
    ("d", ("date '2000-05-01'", "date '2000-05-02'")),
    ("tz", ("timestamptz '2000-05-01 12:00+00'",)),
    ("iv", ("interval '1 day 02:00'", "interval '-3 hours'")),
])
def test_a_mode_answers_its_category_as_the_session_prints_it(
        test_db: TestDatabase, proxy: RunningProxy, column: str, categories: tuple[str, ...]) -> None:
    with _session(test_db.admin_dsn) as direct:
        printed = {direct.execute(f"SELECT ({category})::text").fetchone()[0] for category in categories}
    assert not any(text[:1] == "2" for text in printed)  # (none in ISO style: the settings took)
    with _session(proxy.dsn()) as conn:
        for type_name in ("date", "timestamptz", "interval"):
            conn.adapters.register_loader(type_name, TextLoader)
        for sql in (f"SELECT mode() WITHIN GROUP (ORDER BY {column}) FROM {_TABLE}",
                    f"SELECT mode() WITHIN GROUP (ORDER BY {column}) AS m, count(*) FROM {_TABLE} WHERE i > 5"):
            (answer, *_) = conn.execute(sql).fetchone()
            assert answer in printed, (sql, answer, printed)


def test_psycopg_reads_a_modes_date_under_a_dmy_datestyle(proxy: RunningProxy) -> None:
    # psycopg parses a date as the session's DateStyle says: the ISO text failed it (DataError).
    with _session(proxy.dsn()) as conn:
        (answer,) = conn.execute(f"SELECT mode() WITHIN GROUP (ORDER BY d) FROM {_TABLE}").fetchone()
    assert answer in (datetime.date(2000, 5, 1), datetime.date(2000, 5, 2))
