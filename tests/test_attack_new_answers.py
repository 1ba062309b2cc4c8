"""The newest answers attacked: keys-only value lists at ε 0, series limits, the pre-charge
checks and client encodings. A statement must not be charged for an error or an empty answer
that its text and the declared keys decide; a check remembered for one analyst must not tell
another what was asked; an encoding dpproxy cannot read is refused, not an internal error."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import wire
from conftest import RunningProxy, TestDatabase, running_proxy, spent_epsilon
from test_histograms import POLICY, _TABLE_SQL, _TABLES

from proxy.demo.embedded import SERVICE_ROLE
from proxy.serving.relation_locks import with_locks


@pytest.fixture(scope="module")
def visits(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over test_histograms' tables (visits: sex, race, age, visited_at … opted in)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLE_SQL)
        conn.execute(f"GRANT SELECT ON {', '.join(_TABLES)} TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _fails_free(proxy: RunningProxy, sql: str) -> psycopg.Error:
    """The error ``sql`` fails with through dpproxy, asserting it charged nothing."""
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql)
        assert spent_epsilon(conn) == before, sql
    return failed.value


_SERIES = ("SELECT sex, count(*) FROM visits JOIN (SELECT sex AS sex__, count(*) AS m FROM visits GROUP BY sex {tail}) "
           "AS s ON sex = sex__ GROUP BY sex")


@pytest.mark.parametrize("tail, sqlstate", [
    # every ranking cell's label cast to integer
    ("HAVING sex::int > 0", "22P02"),
    ("ORDER BY 1/0", "22012"),
    # an output name inside an expression: PostgreSQL's 42703, from the text alone
    ("ORDER BY sex__::int LIMIT 1", "42703"),
])
def test_a_series_rankings_post_processing_error_the_keys_decide_costs_nothing(visits, tail, sqlstate):
    # The ranking's outer statement first ran after the charge: ε 1 spent on an error its text
    # and the declared keys decide, reported as DP004. It is now tried over the keys first.
    error = _fails_free(visits, _SERIES.format(tail=tail))
    assert error.sqlstate == sqlstate, str(error)


def test_a_series_ranking_error_the_noised_values_decide_is_still_charged(visits):
    with visits.connect() as conn:
        before = spent_epsilon(conn)
        # PostgreSQL's own error, as any post-processing's: it reads the released values only.
        with pytest.raises(psycopg.errors.NumericValueOutOfRange) as failed:
            conn.execute(_SERIES.format(tail="ORDER BY count(*)::numeric(1, 0)"))  # ~1000 per cell
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    assert "ε charged 1" in (failed.value.diag.message_detail or ""), failed.value.diag.message_detail


@pytest.mark.parametrize("statement", [
    "SET client_encoding = 'EUC_TW'",
    "SET NAMES 'euc-tw'",
    "SELECT set_config('client_encoding', 'EUC_TW', false)",
])
def test_euc_tw_which_dpproxy_cannot_read_is_refused_and_the_session_goes_on(visits, statement):
    # Taken as ASCII-safe before, EUC_TW ended the session with FATAL XX000: the driver dpproxy
    # reads the backend with has no codec for it (nor has Python), so no text could be read in it.
    with visits.connect() as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute(statement)
        assert "rule: client-encoding" in str(refused.value)
        assert conn.execute("SELECT 1, current_setting('client_encoding')").fetchone() == (1, "UTF8")


def test_euc_tw_in_the_startup_packet_is_refused_with_its_sqlstate(visits):
    error = wire.startup_error(visits.host, visits.port, client_encoding="EUC_TW")
    assert (error[b"S"], error[b"C"]) == (b"FATAL", b"22023"), error


class _InABlock:
    """A backend session in a transaction block, as far as the lock steps look at it."""

    transaction_status = b"T"


def _checks_sent(sql: str) -> int:
    """How many statements a DP statement's lock step (which checks the values of ``sql`` too)
    sends ahead of its run, in the run's pipeline."""
    sent: list[str] = []

    async def run(steps: tuple[str, ...]) -> None:
        sent.extend(steps)

    asyncio.run(with_locks(_InABlock(), [(sql, None)], run))  # type: ignore[arg-type, list-item]
    return len(sent)


def test_a_values_check_one_analyst_passed_is_still_run_for_another():
    # The checks that passed were remembered for every session of the process: whether a
    # statement skipped its LIMIT 0 round trip told an analyst (by its time) that another had
    # sent that exact text and those values before. Remembered per user, it told only their own;
    # now the check is the lock step every DP statement sends with its run, remembered for
    # no one: what it sends never depends on what was asked before.
    sql = f"SELECT count(*) FROM t WHERE name = '{uuid.uuid4()}'"
    assert [_checks_sent(sql) for _ in range(3)] == [1, 1, 1]


@pytest.mark.parametrize("outputs", ["date_trunc('month', visited_at) AS t, sex, count(*)",
                                     "date_trunc('month', visited_at) AS t, sex"])
def test_a_series_limit_whose_own_where_leaves_no_time_bucket_costs_nothing(visits, outputs):
    # The statement's WHERE leaves none of visited_at's declared months (2023): no cell, no row,
    # as a plain GROUP BY answers at ε 0. Its ranking's cells overrode that, so the empty answer
    # was charged ε 1 (notice "ε charged 1, δ 0; ; remaining …").
    sql = (f"SELECT {outputs} FROM visits JOIN (SELECT sex AS sex__, count(*) AS m FROM visits GROUP BY sex "
           "ORDER BY m DESC LIMIT 1) AS s ON sex = sex__ WHERE visited_at >= '2030-01-01' GROUP BY 1, sex")
    with visits.connect() as conn:
        before = spent_epsilon(conn)
        assert conn.execute(sql).fetchall() == []
        assert spent_epsilon(conn) == before
