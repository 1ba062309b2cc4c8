"""answer_quantum_ms: a table's DP answers leave only at whole multiples of a fixed time."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Callable

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, make_policy
from tests.answer_clock import AnswerClock
from policies.loader import PolicyError, parse_policy
from proxy.dp.answer_time import on_the_quantum, quantum_deadline
from proxy.serving.event_loop import new_event_loop

QUANTUM_S = 0.4
QUANTISED = TEST_POLICY.replace(
    "  public.adult:\n    access: protected\n    epsilon: 1.0\n",
    f"  public.adult:\n    access: protected\n    epsilon: 1.0\n    answer_quantum_ms: {int(QUANTUM_S * 1000)}\n",
)


@pytest.fixture(scope="module")
def quantised(test_db, tmp_path_factory: pytest.TempPathFactory):
    assert QUANTISED != TEST_POLICY
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("q") / "l.sqlite3", QUANTISED))
    proxy.answer_once()
    yield proxy
    proxy.stop()


def _seconds(run: Callable[[], object]) -> float:
    started = time.monotonic()
    run()
    return time.monotonic() - started


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE age > 200",             # the index finds no row
    "SELECT COUNT(*) FROM adult",                             # every row read
    "SELECT SUM(capital_gain), AVG(age) FROM adult WHERE sex = 'Male'",
])
def test_a_dp_answer_ready_within_the_quantum_arrives_at_the_quantum(
    quantised: RunningProxy, sql: str, answer_clock: AnswerClock
):
    """At the quantum when computed within it (on an idle machine every one of these is); at
    the multiple it needed when a loaded machine made it slower."""
    with quantised.connect() as conn:
        conn.execute(sql).fetchall()
        arrived = time.monotonic()
    answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last())


def test_an_error_while_answering_is_held_to_the_quantum_too(quantised: RunningProxy, answer_clock: AnswerClock):
    with quantised.connect() as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):  # post-processing of the released count
            conn.execute("SELECT COUNT(*) / 0 FROM adult").fetchall()
        arrived = time.monotonic()
    answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last())


def test_other_tables_and_passthrough_statements_are_not_held(quantised: RunningProxy, answer_clock: AnswerClock):
    """Not held: dpproxy's clock of quantised answers (tests/answer_clock.py) saw none of them,
    whatever a loaded machine made their round trips take (a DP answer on clamp_test commits
    its charge to the ledger, a synced write)."""
    with quantised.connect() as conn:
        conn.execute("SELECT 1").fetchall()
        conn.execute("SELECT COUNT(*) FROM clamp_test").fetchall()
        conn.execute("SELECT COUNT(*) FROM lookup").fetchall()
        # Refused from the text, before dpproxy begins answering: nothing of the rows to hide.
        with pytest.raises(psycopg.Error, match="no-row-access"):
            conn.execute("SELECT * FROM adult").fetchall()
        assert answer_clock.answers == []
        conn.execute("SELECT COUNT(*) FROM adult").fetchall()
        assert len(answer_clock.answers) == 1  # and the clock does see a quantised answer


def test_a_waiting_answer_keeps_its_backend_connection_until_its_boundary(
    test_db, tmp_path_factory: pytest.TempPathFactory, answer_clock: AnswerClock
):
    """Given back when the rows were computed, the connection would tell a session waiting for
    it when that was (tests/test_attack_workers.py): with one connection, three clients' answers
    come one quantum after another, each computed (its wait for the connection included) only
    after the one before had left."""
    text = QUANTISED.replace("statement_timeout_ms: 20000\n", "statement_timeout_ms: 20000\n  pool: {{size: 1}}\n")
    assert "pool: {size: 1}" in text.format(dsn="", ledger="")
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("q1") / "l.sqlite3", text))
    try:
        proxy.answer_once()
        took: list[float] = []
        arrived: list[float] = []
        connected = threading.Barrier(3)

        def client(age: int) -> None:
            with proxy.connect() as conn:
                conn.execute("SELECT 1").fetchall()
                connected.wait(timeout=10)  # all three ask at once
                took.append(_seconds(lambda: conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {age}").fetchall()))
                arrived.append(time.monotonic())

        threads = [threading.Thread(target=client, args=(age,)) for age in (30, 40, 50)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        assert len(took) == 3, took
        held = sorted(answer_clock.answers[1:], key=lambda answer: answer.computed)  # after answer_once's
        assert len(held) == 3, held
        for before, after in zip(held, held[1:]):
            assert after.computed >= before.started + before.quanta * QUANTUM_S, held
        for quanta, seconds in enumerate(sorted(took), start=1):
            assert quanta * QUANTUM_S <= seconds, took
        for when, answer in zip(sorted(arrived), held):
            answer_clock.assert_left_at_its_multiple(when, answer, held)
    finally:
        proxy.stop()


def test_a_slower_answer_leaves_at_the_next_multiple_of_the_quantum():
    """Held to k·q with k the multiple the work needed (measured: a loaded machine can
    oversleep the simulated work into the next quantum), and let go before the next one."""
    async def held(work_s: float, quantum_ms: int) -> tuple[int, float]:
        started = time.monotonic()
        async with on_the_quantum(quantum_ms):
            await asyncio.sleep(work_s)
            worked = time.monotonic() - started
        return math.ceil(worked / max(quantum_ms / 1000, 1e-9)), time.monotonic() - started

    for work_s, at_least in ((0.01, 1), (0.13, 2)):
        quanta, took = asyncio.run(held(work_s, 100))
        assert quanta >= at_least and quanta * 0.1 <= took < (quanta + 1) * 0.1, (work_s, quanta, took)
    assert asyncio.run(held(0.01, 0))[1] < 0.05  # 0: off
    assert quantum_deadline(10.0, 10.0, 0.5) == 10.5  # even an answer that took no time waits one quantum
    assert quantum_deadline(10.0, 11.0, 0.5) == 11.0
    assert quantum_deadline(10.0, 11.01, 0.5) == 11.5


def test_an_answer_never_leaves_before_its_boundary_on_dpproxys_event_loop():
    """uvloop's timers count from the loop's clock as its iteration began, so after a release
    computed on the loop the wait ended up to a millisecond early (70 of these 200), by an
    amount that depended on when the computation ended: it now sleeps again for the rest."""
    async def early_leaves() -> int:
        early = 0
        for i in range(200):
            async with on_the_quantum(3) as started:
                computed = time.monotonic() + i * 0.00001
                while time.monotonic() < computed:  # computing on the loop, at every phase of its clock
                    pass
            early += time.monotonic() < quantum_deadline(started, started, 0.003)
        return early

    loop = new_event_loop()
    try:
        assert loop.run_until_complete(early_leaves()) == 0
    finally:
        loop.close()


def test_a_cancelled_answer_is_not_held():
    async def cancelled() -> float:
        async def answer() -> None:
            async with on_the_quantum(5000):
                await asyncio.sleep(10)

        task = asyncio.ensure_future(answer())
        await asyncio.sleep(0.05)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(cancelled()) < 0.5


def test_a_negative_quantum_is_refused_at_load(test_db, tmp_path):
    text = QUANTISED.replace("answer_quantum_ms: 400", "answer_quantum_ms: -1")
    with pytest.raises(PolicyError, match="answer_quantum_ms"):
        parse_policy(text.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3"), "p.yaml")


@pytest.mark.parametrize("sql", [
    "SELECT MODE() WITHIN GROUP (ORDER BY sex) FROM adult",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM adult",
])
def test_the_exponential_mechanisms_draw_is_padded_only_where_no_quantum_hides_its_time(
        sql: str, quantised: RunningProxy, proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch):
    """Without a quantum each draw is followed by its padding draw (two of OpenDP's draws per
    release, mechanisms.samplers.gumbel_argmax); on a table with ``answer_quantum_ms`` the quantum
    hides the draw's time, and the padding (K + 1 trials on average) is skipped."""
    from mechanisms import samplers

    draws: list[int] = []
    noisy_max = samplers._gumbel_noisy_max

    def counted(scale: float):  # type: ignore[no-untyped-def]
        draw = noisy_max(scale)
        return lambda scores: (draws.append(len(scores)), draw(scores))[1]

    monkeypatch.setattr(samplers, "_gumbel_noisy_max", counted)
    made = {}
    for name, running in (("plain", proxy), ("quantised", quantised)):
        draws.clear()
        with psycopg.connect(running.dsn(), autocommit=True) as conn:
            conn.execute(sql).fetchall()
        made[name] = len(draws)
    assert made == {"plain": 2, "quantised": 1}
