"""Attacks on the newest code (answer_quantum_ms, repeat keys, one-statement passthrough, session)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, make_policy
from tests.answer_clock import AnswerClock



def _quantised_policy(quantum_s: float) -> str:
    return TEST_POLICY.replace(
        "  public.adult:\n    access: protected\n    epsilon: 1.0\n",
        f"  public.adult:\n    access: protected\n    epsilon: 1.0\n    answer_quantum_ms: {int(quantum_s * 1000)}\n",
    )


QUANTUM_S = 1.0
QUANTISED = _quantised_policy(QUANTUM_S)
# The cancel test's point needs the slow computation below to end within one quantum: it
# takes a few tenths of a second on an idle machine and over a second with both cores busy
# (CI runs two test processes); a cancel at the first boundary then rightly stops it.
LONG_QUANTUM_S = 4.0
# How long the backend computes this depends on how many rows have age > {lo}: with none,
# the index answers in a millisecond; with all of them, every row pays seven ILIKEs.
_COLUMNS = ["native_country", "education", "occupation", "workclass", "marital_status", "relationship", "race"]
ROW_TIMED = "SELECT COUNT(*) FROM adult WHERE age > {lo} AND (" + " OR ".join(
    f"{c} ILIKE '%a%e%i%o%u%a%e%i%o%u%z' OR {c} ILIKE '%u%o%i%e%a%u%o%i%e%a%z'" for c in _COLUMNS) + ")"


@pytest.fixture(scope="module")
def quantised(test_db, tmp_path_factory: pytest.TempPathFactory):
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("qa") / "l.sqlite3", QUANTISED))
    proxy.answer_once()
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def long_quantised(test_db, tmp_path_factory: pytest.TempPathFactory):
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("qa") / "l.sqlite3",
                                     _quantised_policy(LONG_QUANTUM_S)))
    proxy.answer_once()
    yield proxy
    proxy.stop()


def _answer_with_a_cancel_once(proxy: RunningProxy, sql: str, ready: Callable[[], bool]) -> tuple[str, float, float]:
    """Ask ``sql`` and send its CancelRequest (on a new connection) as soon as ``ready()``,
    polled from another thread, holds: a state observed rather than a time guessed, which on a
    loaded machine could come before the statement reached the backend or after it was done.
    The outcome, how long the client waited for it and when it came (``time.monotonic()``)."""
    with proxy.connect() as conn:
        conn.execute("SELECT 1").fetchall()
        seen = threading.Event()

        def cancel_when_ready() -> None:
            give_up = time.monotonic() + 30
            while not ready():
                if time.monotonic() > give_up:
                    return
                time.sleep(0.005)
            seen.set()
            conn.cancel_safe()

        canceller = threading.Thread(target=cancel_when_ready)
        canceller.start()
        started = time.monotonic()
        try:
            conn.execute(sql).fetchall()
            outcome = "answer"
        except psycopg.errors.QueryCanceled:
            outcome = "cancelled"
        arrived = time.monotonic()
        canceller.join()
    assert seen.is_set(), "the state to send the cancel in was never observed"
    return outcome, arrived - started, arrived


def _backend_shows(observer: psycopg.Connection, condition: str) -> Callable[[], bool]:
    """Whether another backend's row of pg_stat_activity meets ``condition``; ``observer`` is an
    autocommit connection of the test's own (a transaction sees pg_stat_activity as it was when
    it first looked)."""

    def shows() -> bool:
        row = observer.execute(f"SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND {condition}"
                               ).fetchone()
        return bool(row and row[0])

    return shows


def test_the_row_timed_query_really_takes_longer_with_more_rows(admin):
    """The backend's own execution time (EXPLAIN ANALYZE), not the round trip: a client's
    wall clock adds whatever a loaded machine stalls it for, which made the fast query look
    slower than 20 ms on a busy machine."""
    def seconds(lo: int) -> float:
        plan = admin.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + ROW_TIMED.format(lo=lo)).fetchone()
        assert plan is not None
        return float(plan[0][0]["Execution Time"]) / 1000

    seconds(0)
    assert seconds(200) < 0.02 and seconds(0) > 0.1


@pytest.mark.parametrize("lo", [200, 0])
def test_a_cancel_within_the_quantum_does_not_tell_how_long_the_backend_computed(
    long_quantised: RunningProxy, lo: int, answer_clock: AnswerClock, test_db
):
    """A CancelRequest 50 ms into a quantised DP answer used to reach the backend at once: it
    stopped an answer the rows made slow (57014) and missed one they made fast, both arriving
    at one quantum, so the outcome said what the quantum hides. Now it waits for the quantum's
    boundary: both answers are ready by then and both are answered. The cancel is sent while
    the backend computes the slow one and once the fast one is computed."""
    def computed() -> bool:  # and waiting for the boundary
        return bool(answer_clock.answers)

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as observer:
        # dpproxy's count, its text cut at track_activity_query_size before the ILIKEs (the text
        # columns are read through their bounded projection first)
        computing = _backend_shows(observer, "state = 'active' AND query LIKE 'SELECT pg_catalog.count(*) FROM%'")
        outcome, _, arrived = _answer_with_a_cancel_once(long_quantised, ROW_TIMED.format(lo=lo),
                                                   computing if lo == 0 else computed)
    assert outcome == "answer", (lo, answer_clock.answers)
    assert answer_clock.last().quanta == 1, answer_clock.answers
    answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last(), lo)


def test_a_cancel_still_stops_a_quantised_answer_that_outlasts_its_quantum(
    quantised: RunningProxy, admin, answer_clock: AnswerClock, test_db
):
    """Deferred, not dropped: a DP answer still computing at the boundary is cancelled there."""
    admin.execute("BEGIN")
    admin.execute("LOCK TABLE adult IN ACCESS EXCLUSIVE MODE")  # the DP query waits for it
    try:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as observer:
            waiting = _backend_shows(observer, "wait_event_type = 'Lock' AND query LIKE '%adult%'")
            outcome, took, arrived = _answer_with_a_cancel_once(quantised, "SELECT COUNT(*) FROM adult", waiting)
    finally:
        admin.execute("ROLLBACK")
    assert outcome == "cancelled"
    assert 2 * QUANTUM_S <= took, took  # cancelled at 1 q, the error held to 2 q
    answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last())


@pytest.mark.parametrize("how", ["copy", "extended", "binary", "limit0"])
def test_every_way_of_asking_a_quantised_dp_answer_is_held(quantised: RunningProxy, how: str, answer_clock: AnswerClock):
    """COPY of a DP query, the extended protocol (text or binary results) and a LIMIT 0 that
    reads nothing all leave at the quantum, a fast or slow computation alike."""
    for lo in (200, 0):
        sql = ROW_TIMED.format(lo=lo)
        with quantised.connect(prepare_threshold=0 if how in ("extended", "binary") else None) as conn:
            conn.execute("SELECT 1").fetchall()
            started = time.monotonic()
            if how == "copy":
                with conn.cursor().copy(f"COPY ({sql}) TO STDOUT") as copy:
                    assert list(copy.rows())
            elif how == "limit0":
                assert conn.execute(sql + " LIMIT 0").fetchall() == []
            else:
                assert conn.cursor(binary=how == "binary").execute(sql).fetchall()
            arrived = time.monotonic()
        assert QUANTUM_S <= arrived - started, (how, lo)
        answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last(), (how, lo))
