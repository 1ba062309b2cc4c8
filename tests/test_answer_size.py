"""A DP answer is at most ``listen.max_answer_bytes`` of text, measured on the backend before it is sent.

A post-processed answer's size is decided by the statement's text (``format('%900000000s',
count(*))``, wrappers that each double a value) and by how long a released value's text is,
never by how many rows the table holds. Unbounded, one analyst's statement made dpproxy hold
hundreds of megabytes, several times over, in the process every session shares. The outer
statement now runs first as a measure, ``sum(octet_length(row::text))`` over its rows, so that
PostgreSQL computes the size and dpproxy receives one number: a trial over the keys and NULL
aggregates past the limit is refused before the charge (54000, rule ``answer-size``); a real
answer past it, which only the release can make so, is refused after it, the charge standing and
the release kept for its repeats (docs/threat-model.md, as for any error the release decides).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.test_attack_new_answers import visits
from tests.conftest import (HISTOGRAM_POLICY, RunningProxy, TestDatabase, failed_twice, make_policy, memory_kb,
                            reset_peak_memory, running_proxy, spent_epsilon)

__all__ = ["visits"]  # the fixture, used here as it is there

_SMALL_LIMIT = 4096
_SMALL_POLICY = (HISTOGRAM_POLICY.replace("listen: {{host: 127.0.0.1, port: 0}}",
                                     f"listen: {{{{host: 127.0.0.1, port: 0, max_answer_bytes: {_SMALL_LIMIT}}}}}")
                 .replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}"))
assert _SMALL_POLICY.count(str(_SMALL_LIMIT)) == 1 and "repeats: {{enabled: true}}" in _SMALL_POLICY


@pytest.fixture(scope="module")
def small_limit_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, _SMALL_POLICY) as running:
        yield running


def _refused_uncharged(conn: psycopg.Connection, sql: str, limit: str) -> psycopg.Error:
    """The error ``sql`` gets on ``conn``: 54000, rule answer-size, a hint naming the setting and
    its limit and saying nothing was charged; the budget unchanged."""
    before = spent_epsilon(conn)
    with pytest.raises(psycopg.Error) as refused:
        conn.execute(sql)
    error = refused.value
    assert error.sqlstate == "54000", (error.sqlstate, str(error))
    assert "(rule: answer-size)" in str(error)
    hint = error.diag.message_hint or ""
    assert "listen.max_answer_bytes" in hint and limit in hint and "Nothing was charged" in hint, hint
    assert spent_epsilon(conn) == before
    return error


def test_a_huge_answer_is_refused_before_the_charge_and_every_session_goes_on(proxy: RunningProxy) -> None:
    with proxy.connect() as conn, proxy.connect() as other:
        conn.autocommit = other.autocommit = True
        error = _refused_uncharged(conn, "SELECT format('%100000000s', count(*)) FROM adult", "67108864")
        assert "100000" in str(error)  # the size it measured
        # Nested wrappers that each double a value: the same, from the text alone.
        _refused_uncharged(conn, _doubled("format('%3000000s', count(*))", 5), "67108864")
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("SELECT format('%10s', count(*)) FROM adult").fetchone()[0].startswith(" ")
        assert other.execute("SELECT round(avg(age)) > 0 FROM adult").fetchone() == (True,)


def _doubled(value: str, times: int) -> str:
    """A statement whose answer is ``value``'s text doubled ``times`` times, each by a wrapper query."""
    sql = f"SELECT {value} AS v FROM adult"
    for _ in range(times):
        sql = f"SELECT v || v AS v FROM ({sql}) AS t"
    return sql


def test_the_refused_answer_never_reaches_dpproxys_memory(proxy: RunningProxy) -> None:
    """A 200 MB answer, refused: the process (proxy and client both run in it) grows by far less."""
    with proxy.connect() as conn:
        conn.execute("SELECT 1")
        gc.collect()
        reset_peak_memory()
        before = memory_kb("VmRSS")
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT format('%200000000s', count(*)) FROM adult")
        grown_mb = (memory_kb("VmHWM") - before) / 1024
    assert refused.value.sqlstate == "54000"
    assert grown_mb < 40, f"the process grew by {grown_mb:.0f} MB over a refused 200 MB answer"


def test_a_small_limit_refuses_an_ordinary_answer_and_answers_a_smaller_one(small_limit_proxy: RunningProxy) -> None:
    with small_limit_proxy.connect() as conn:
        _refused_uncharged(conn, "SELECT format('%5000s', count(*)) FROM adult", str(_SMALL_LIMIT))
        # A histogram's keys count too: the trial's rows are every cell's.
        _refused_uncharged(conn, "SELECT sex, format('%3000s', count(*)) FROM adult GROUP BY sex",
                           str(_SMALL_LIMIT))
        before = spent_epsilon(conn)
        (value,) = conn.execute("SELECT format('%3000s', count(*)) FROM adult").fetchone()
        assert len(value) == 3000 and spent_epsilon(conn) > before


def test_an_answer_the_release_makes_too_large_is_charged_and_kept_for_repeats(
        small_limit_proxy: RunningProxy) -> None:
    """Over NULL aggregates the HAVING keeps no row, so the trial is small; the released count
    keeps the row, and the answer is past the limit: refused after the charge, which stands, and
    the release answers its repeats uncharged."""
    sql = "SELECT format('%5000s', count(*)) FROM adult WHERE age > 20 HAVING count(*) > 0"
    with small_limit_proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        error = refused.value
        assert error.sqlstate == "54000" and "(rule: answer-size)" in str(error), str(error)
        assert "ε charged 1" in (error.diag.message_detail or ""), error.diag.message_detail
        assert "are kept" in (error.diag.message_hint or "") and "listen.max_answer_bytes" in (
            error.diag.message_hint or "")
        charged = spent_epsilon(conn)
        assert charged == pytest.approx(before + 1.0)
        (count,) = conn.execute("SELECT count(*) FROM adult WHERE age > 20").fetchone()
        assert count > 0 and spent_epsilon(conn) == charged  # the stored release, uncharged
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("sql, expected", [
    # Names the measure's record must not mix up: twice the same, and the measure's own alias.
    ("SELECT count(*) > 0 AS a, count(*) > 0 AS a FROM adult", (True, True)),
    ("SELECT count(*) > 0 AS dpproxy_answer FROM adult", (True,)),
    ("WITH w AS (SELECT count(*) AS n FROM adult) SELECT n > 0, 'total' FROM w", (True, "total")),
    ("SELECT count(*) > 0 AS a FROM adult ORDER BY a LIMIT 1", (True,)),
])
def test_the_measure_answers_what_the_statement_answers(proxy: RunningProxy, sql: str,
                                                        expected: tuple[object, ...]) -> None:
    with proxy.connect() as conn:
        assert conn.execute(sql).fetchone() == expected


def test_a_series_limits_ranking_the_release_makes_too_large_is_charged_once_and_kept_for_repeats(
        small_limit_proxy: RunningProxy) -> None:
    """The ranking's outer statement past the limit over its release (its trial, over NULL
    aggregates, keeps no row) fails after the charge, as any answer the release makes too large;
    the two releases are kept, so the statement asked again fails alike, uncharged."""
    sql = ("SELECT sex, count(*) FROM adult JOIN (SELECT sex AS sex__, format('%5000s', count(*)) AS m "
           "FROM adult GROUP BY sex HAVING count(*) > 0 ORDER BY count(*) DESC LIMIT 1) AS s ON sex = sex__ "
           "GROUP BY sex")
    with small_limit_proxy.connect() as conn:
        first, repeat = failed_twice(conn, sql, 1.0)
    assert first.sqlstate == repeat.sqlstate == "54000" and "(rule: answer-size)" in str(repeat), str(repeat)
    assert "ε charged 1" in (first.diag.message_detail or ""), first.diag.message_detail
    assert "a repeat of an earlier answer" in (repeat.diag.message_detail or ""), repeat.diag.message_detail
    assert "asked again" in (first.diag.message_hint or "") and repeat.diag.message_hint == first.diag.message_hint


def test_a_reload_that_lowers_the_limit_refuses_before_the_charge_what_passed_before(
        test_db: TestDatabase, tmp_path: Path) -> None:
    """A trial that passed is not run again for the same user under the same settings and table
    registry (``_PASSED``); a reload makes a registry of its own, so the trial runs again under
    the lower limit and refuses before the charge what the higher one answered."""
    ledger = tmp_path / "l.sqlite3"
    lowered = tmp_path / "policy.yaml"
    lowered.write_text(_SMALL_POLICY.format(dsn=test_db.service_dsn, ledger=ledger))
    proxy = RunningProxy(make_policy(test_db, ledger, _SMALL_POLICY.replace(
        f"max_answer_bytes: {_SMALL_LIMIT}", f"max_answer_bytes: {_SMALL_LIMIT * 4}")))
    try:
        with proxy.connect() as conn:
            sql = "SELECT format('%5000s', count(*)) FROM adult WHERE age > 40"
            assert len(conn.execute(sql).fetchone()[0]) == 5000
            assert proxy._call(proxy.server.reload(lowered))
            _refused_uncharged(conn, sql, str(_SMALL_LIMIT))
    finally:
        proxy.stop()


def test_a_series_limits_ranking_the_release_makes_too_large_never_reaches_dpproxy(visits: RunningProxy) -> None:
    """A series limit's ranking (``rewriter.series_limit``) is post-processed after the charge and
    read by dpproxy alone: over NULL aggregates its HAVING keeps no row, so its trial is small;
    over the release it was a 200 MB row received whole (the process grew by ~570 MB)."""
    sql = ("SELECT sex, count(*) FROM visits JOIN (SELECT sex AS sex__, format('%200000000s', count(*)) AS m "
           "FROM visits GROUP BY sex HAVING count(*) > 0 ORDER BY count(*) DESC LIMIT 1) AS s ON sex = sex__ "
           "GROUP BY sex")
    with visits.connect() as conn:
        before = spent_epsilon(conn)
        gc.collect()
        reset_peak_memory()
        rss = memory_kb("VmRSS")
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        grown_mb = (memory_kb("VmHWM") - rss) / 1024
        error = refused.value
        assert error.sqlstate == "54000" and "(rule: answer-size)" in str(error), str(error)
        assert "ε charged" in (error.diag.message_detail or "")  # the release decided it: charged
        assert "kept" not in (error.diag.message_hint or "")  # visits keeps no repeats
        assert spent_epsilon(conn) > before
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert grown_mb < 40, f"the process grew by {grown_mb:.0f} MB over a refused 200 MB ranking"
