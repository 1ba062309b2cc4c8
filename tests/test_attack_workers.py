"""Attack review of several serving processes, answer timing, timeouts, cancel, reload and shutdown.

The analyst holds a valid login and a budget, opens as many connections as they like (landing
on any worker of ``listen.workers``), times every answer, sends CancelRequests whenever they
choose and sets whatever session settings dpproxy lets through. Each hole found is pinned
here with the probe that found it; the probes that held stay as regression tests.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, make_policy, spent_epsilon
from proxy.demo.embedded import SERVICE_ROLE
from tests.answer_clock import AnswerClock
from post_charge_wait import create_gated, hold_gate, waiting_at_gate, with_toasted
from test_workers import Group, _write_policy

QUANTUM_S = 0.4
# ``waits``: a view behind a gate of its own (tests/post_charge_wait.py), where a DP statement on
# it waits after its charge while the gate is held; a lock on the table is waited for before the charge.
WAITS_GATE = "waits_gate"
QUANTISED = with_toasted(TEST_POLICY.replace(
    "  public.adult:\n    access: protected\n    epsilon: 1.0\n",
    f"  public.adult:\n    access: protected\n    epsilon: 1.0\n    answer_quantum_ms: {int(QUANTUM_S * 1000)}\n",
), "public.waits", f"    answer_quantum_ms: {int(QUANTUM_S * 1000)}\n")
WAITS_SQL = "SELECT COUNT(*) FROM waits WHERE amount > {n}"


@pytest.fixture(scope="module", autouse=True)
def waits_table(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        create_gated(admin, "waits", gate=WAITS_GATE)


@pytest.fixture(scope="module")
def quantised(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    assert QUANTISED != TEST_POLICY
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("quantised") / "l.sqlite3", QUANTISED))
    proxy.answer_once()
    yield proxy
    proxy.stop()


# ------------------------------------------------------------------ timeouts as an oracle


@pytest.mark.parametrize("statement", [
    "SET idle_in_transaction_session_timeout = '50ms'",
    "SET LOCAL idle_in_transaction_session_timeout = 50",
    "SELECT set_config('idle_in_transaction_session_timeout', '50', false)",
])
def test_the_backends_idle_in_transaction_timeout_cannot_be_set(quantised: RunningProxy, statement: str):
    """The backend's idle-in-transaction timer runs while a quantised DP answer waits for its
    boundary inside a block, for q minus the time the rows took: with it at T, whether the
    connection (and the block) survived said whether the backend needed less than q − T."""
    with quantised.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idle_in_transaction_session_timeout"):
            conn.execute(statement)


@pytest.mark.parametrize("statement", [
    "SET statement_timeout = 1", "SET LOCAL statement_timeout = '5ms'",
    "SELECT set_config('statement_timeout', '1', false)", "SET idle_session_timeout = 1",
    "SET transaction_timeout = 1", "SET SESSION statement_timeout TO 1",
])
def test_no_other_timeout_of_the_backend_can_be_set(quantised: RunningProxy, statement: str):
    """A statement timeout of the analyst's choosing would turn the time the rows take into an
    answer or an error inside one quantum (held: these were refused already)."""
    with quantised.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="safe-settings"):
            conn.execute(statement)


@pytest.fixture
def role_idle_timeout(test_db: TestDatabase) -> Iterator[None]:
    """The service role with an idle_in_transaction_session_timeout of 100 ms in the test
    database, as an operator's ALTER ROLE (or postgresql.conf) would give it."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        role, database = sql.Identifier(SERVICE_ROLE), sql.Identifier(TEST_DATABASE)
        admin.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET idle_in_transaction_session_timeout = '100ms'")
                      .format(role, database))
        try:
            yield
        finally:
            admin.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} RESET idle_in_transaction_session_timeout")
                          .format(role, database))


def test_a_quantised_answer_in_a_block_keeps_its_backend_whatever_the_backends_idle_timeout(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, role_idle_timeout: None
):
    """A fast answer leaves the backend idle in its transaction for most of the quantum. Were the
    backend's own timeout (100 ms here) to end the connection then, the block would end with it
    — or not, when the rows had kept the backend busy past q − 100 ms."""
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("idle") / "l.sqlite3", QUANTISED))
    try:
        with proxy.connect() as conn:
            conn.execute("BEGIN")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()  # the index finds nothing
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            assert conn.execute("SELECT pg_backend_pid()").fetchone() == pid
            conn.execute("COMMIT")
    finally:
        proxy.stop()


# ------------------------------------------------------------------ cancel requests


class _SlowToCancel:
    """A session whose cancel is not done until the test says so (a backend's cancel round trip
    of any length)."""

    def __init__(self, pid: int, secret: int):
        self.pid, self.secret = pid, secret
        self.may_finish = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def cancel(self) -> None:
        await self.may_finish.wait()
        self.cancelled.set()


@pytest.mark.parametrize("secret", [4242, 4243], ids=["right secret", "wrong secret"])
def test_a_cancel_request_is_done_with_at_once_whatever_the_key_finds(secret: int):
    """Sending a cancel on to the backend takes a round trip when the session's connection is
    held (inside a block, while a quantised answer waits) and none while the cancel is put off
    to the quantum's boundary (while the backend computes): had the CancelRequest's connection
    stayed open until it was done, its closing time would tell which, as it told a right secret
    from a wrong one."""
    from proxy.serving.session import SessionTable

    async def probe() -> tuple[bool, bool]:
        table = SessionTable()
        session = _SlowToCancel(1234, 4242)
        table._by_pid[session.pid] = session  # type: ignore[assignment]
        # Done with while the session's cancel is still under way (a wait, not a time: on a
        # loaded machine a bound of 50 ms is a stall away from failing).
        await asyncio.wait_for(table.cancel(1234, secret), 30)
        done_before_the_cancel = not session.cancelled.is_set()
        session.may_finish.set()
        try:
            await asyncio.wait_for(session.cancelled.wait(), 5 if secret == 4242 else 0.5)
        except TimeoutError:
            pass
        return done_before_the_cancel, session.cancelled.is_set()

    done_before_the_cancel, cancelled = asyncio.run(probe())
    assert done_before_the_cancel
    assert cancelled == (secret == 4242)


def test_the_backends_statement_timeout_during_a_quantised_answer_comes_at_the_boundary_and_stays_charged(
    test_db: TestDatabase, tmp_path: Path, answer_clock: AnswerClock
):
    """backend.statement_timeout_ms below the quantum: the 57014 (a DP query that ran long,
    as documented) leaves at the quantum like an answer would, and is charged: whether it
    times out can depend on the rows."""
    text = QUANTISED.replace("statement_timeout_ms: 20000\n", "statement_timeout_ms: 150\n")
    assert text != QUANTISED
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", text))
    try:
        with proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            before = spent_epsilon(conn)
            hold_gate(admin, WAITS_GATE)  # the DP query waits past its timeout, after its charge
            try:
                with pytest.raises(psycopg.Error) as failed:
                    conn.execute(WAITS_SQL.format(n=0)).fetchall()
                arrived = time.monotonic()
            finally:
                admin.execute("ROLLBACK")
            assert failed.value.sqlstate in ("57014", "DP004"), failed.value
            answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last())
            assert spent_epsilon(conn) == before + 1
    finally:
        proxy.stop()


def test_a_pipeline_of_quantised_answers_in_a_block_leaves_each_on_its_own_boundary(
    quantised: RunningProxy, answer_clock: AnswerClock
):
    """Extended protocol, two Executes before one Sync, inside BEGIN: each answer is held to its
    own quantum (two in all), and the block goes on."""
    with quantised.connect() as conn:
        conn.execute("BEGIN")
        started = time.monotonic()
        with conn.pipeline():
            first = conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200")
            second = conn.execute("SELECT SUM(capital_gain) FROM adult WHERE sex = 'Female'")
        assert first.fetchall() and second.fetchall()
        arrived = time.monotonic()
        assert 2 * QUANTUM_S <= arrived - started
        held = answer_clock.answers
        assert len(held) == 2 and held[1].started >= held[0].started + held[0].quanta * QUANTUM_S, held
        answer_clock.assert_left_at_its_multiple(arrived, held[1])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.execute("COMMIT")


def test_a_backend_lost_mid_computation_ends_the_session_at_the_quantum_and_stays_charged(
    quantised: RunningProxy, test_db: TestDatabase, answer_clock: AnswerClock
):
    """A backend failure is an outcome like the others: its FATAL leaves at the boundary."""
    with quantised.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        with quantised.connect() as witness:
            before = spent_epsilon(witness)
        hold_gate(admin, WAITS_GATE)  # the DP query waits for it, after its charge
        try:
            def terminate() -> None:
                with psycopg.connect(test_db.admin_dsn, autocommit=True) as killer:
                    killer.execute("SELECT pg_terminate_backend(%s)", (_wait_for_a_lock_wait(test_db),))

            thread = _after(0, terminate)
            with pytest.raises(psycopg.OperationalError):
                conn.execute(WAITS_SQL.format(n=0)).fetchall()
            arrived = time.monotonic()
            thread.join()
        finally:
            admin.execute("ROLLBACK")
        answer_clock.assert_left_at_its_multiple(arrived, answer_clock.last())
        with quantised.connect() as witness:
            assert spent_epsilon(witness) == before + 1


def test_a_shutdown_lets_a_quantised_answer_leave_at_its_boundary(
    test_db: TestDatabase, tmp_path: Path, answer_clock: AnswerClock
):
    """SIGTERM while an answer waits for its boundary: answered there (not cut short, which
    would tell when the rows were computed), then the session ends with 57P01."""
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", QUANTISED))
    stopping: threading.Thread | None = None
    try:
        with proxy.connect() as conn:
            conn.execute("SELECT 1")
            stopping = _once(lambda: bool(answer_clock.answers), lambda: proxy._call(proxy.server.close(grace_s=5)))
            assert conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()
            answer_clock.assert_left_at_its_multiple(time.monotonic(), answer_clock.last())
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
    finally:
        if stopping is None:
            proxy.stop()
        else:
            stopping.join()
            proxy.loop.call_soon_threadsafe(proxy.loop.stop)


# ------------------------------------------------------------------ a backend lost while an answer waits


def test_a_block_whose_backend_is_lost_while_an_answer_waits_is_not_reported_idle(
    quantised: RunningProxy, test_db: TestDatabase, answer_clock: AnswerClock
):
    """A connection lost inside a block ends the session (docs/deployment.md). Lost while a
    quantised answer waited for its boundary, libpq's status of the dead connection (unknown)
    was read as idle: the answer came with ReadyForQuery 'I' and the next statements ran on a
    new connection, outside the block the client had opened."""
    with quantised.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        conn.execute("BEGIN")
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()

        # Once the answer is computed: it waits for its boundary.
        killer = _once(lambda: bool(answer_clock.answers), lambda: admin.execute("SELECT pg_terminate_backend(%s)", pid))
        try:
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()
        except psycopg.OperationalError:
            return  # the session ended with the block: as documented
        finally:
            killer.join()
        assert conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")


# ------------------------------------------------------------------ what other sessions see of an answer's computation


def _after(delay_s: float, run: Callable[[], object]) -> threading.Thread:
    def later() -> None:
        time.sleep(delay_s)
        run()

    thread = threading.Thread(target=later)
    thread.start()
    return thread


def _until(observed: Callable[[], bool], what: str, give_up_s: float = 30) -> None:
    """Poll until ``observed()`` holds; fail, saying ``what`` was expected, if it never does."""
    give_up = time.monotonic() + give_up_s
    while not observed():
        assert time.monotonic() < give_up, f"never observed: {what}"
        time.sleep(0.002)


def _once(observed: Callable[[], bool], run: Callable[[], object], give_up_s: float = 30) -> threading.Thread:
    """A thread that runs ``run`` as soon as ``observed()`` holds (polled), rather than after a
    sleep that a loaded machine can make too short or too long; it fails if it never holds."""
    def when_observed() -> None:
        _until(observed, "the state to act in", give_up_s)
        run()

    thread = threading.Thread(target=when_observed)
    thread.start()
    return thread


@pytest.fixture(scope="module")
def one_connection(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The quantised policy with a pool of one backend connection."""
    text = QUANTISED.replace("statement_timeout_ms: 20000\n", "statement_timeout_ms: 20000\n  pool: {{size: 1}}\n")
    assert "pool: {size: 1}" in text.format(dsn="", ledger="")
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("one") / "l.sqlite3", text))
    yield proxy
    proxy.stop()


@pytest.fixture(scope="module")
def repeating(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The quantised policy with repeats on."""
    text = QUANTISED.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")
    assert text != QUANTISED
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("repeating") / "l.sqlite3", text))
    yield proxy
    proxy.stop()


def test_another_session_waiting_for_the_connection_gets_it_only_at_the_answers_boundary(
    one_connection: RunningProxy, answer_clock: AnswerClock
):
    """With every pooled connection taken (one here; an analyst can pin them all with BEGIN),
    another session's statement waits for the quantised answer's connection. Given back when
    the backend was done, it told that session when the rows were computed, to the millisecond."""
    with one_connection.connect() as answering, one_connection.connect() as waiting:
        answering.execute("SELECT 1")
        waiting.execute("SELECT 1")
        asked: list[float] = []
        served: list[float] = []

        def wait_for_the_connection() -> None:
            asked.append(time.monotonic())
            waiting.execute("SELECT 1").fetchall()
            served.append(time.monotonic())

        # Asked once the answer is computed (in a few ms), while it waits for its boundary.
        thread = _once(lambda: bool(answer_clock.answers), wait_for_the_connection)
        answering.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()
        thread.join()
    answer = answer_clock.last()
    boundary = answer.started + answer.quanta * QUANTUM_S
    assert asked and asked[0] < boundary, (asked, answer)  # it did wait
    assert served and served[0] >= boundary, (served, answer)


def test_a_repeat_is_not_answered_from_an_answer_before_its_boundary(repeating: RunningProxy, answer_clock: AnswerClock):
    """A second session asking the same statement τ after the first found it stored (a free
    repeat) exactly when the first's rows had been computed before τ: stored at the boundary,
    the repeat says nothing the first answer's arrival does not."""
    sql = "SELECT COUNT(*) FROM adult WHERE age > 77 AND capital_gain < 99999"
    with repeating.connect() as first, repeating.connect() as second:
        first.execute("SELECT 1")
        second.execute("SELECT 1")
        notices: list[str] = []
        second.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        asked: list[float] = []

        def ask_the_same() -> None:
            asked.append(time.monotonic())
            second.execute(sql).fetchall()

        thread = _once(lambda: bool(answer_clock.answers), ask_the_same)  # the first is computed, not sent
        first.execute(sql).fetchall()
        thread.join()
    first_answer = answer_clock.answers[0]
    assert asked and asked[0] < first_answer.started + first_answer.quanta * QUANTUM_S, (asked, first_answer)
    assert notices and "a repeat" not in notices[0], notices


def _cancel(proxy: RunningProxy, conn: psycopg.Connection) -> None:
    """Send ``conn``'s CancelRequest, its key as the session has it."""
    pid = conn.info.backend_pid
    secret = next(session.secret for session in proxy.server.sessions if session.pid == pid)
    with socket.create_connection((proxy.host, proxy.port), timeout=5) as sock:
        sock.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
        sock.recv(1)  # closed once the request is read


def test_a_cancel_while_an_answer_waits_for_its_boundary_changes_nothing_the_client_can_see(
    one_connection: RunningProxy, answer_clock: AnswerClock
):
    """Sent at once while the answer waited (and put off to the boundary while the backend
    computed), a cancel marked the connection to be closed rather than pooled only when the rows
    had been computed before it came: the session's next statement then ran on a new backend."""
    with one_connection.connect() as conn:
        before = conn.execute("SELECT pg_backend_pid()").fetchone()
        cancelled: list[float] = []

        def cancel() -> None:
            _cancel(one_connection, conn)
            cancelled.append(time.monotonic())

        thread = _once(lambda: bool(answer_clock.answers), cancel)  # computed in a few ms, waiting
        assert conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()
        answer_clock.assert_left_at_its_multiple(time.monotonic(), answer_clock.last())
        thread.join()
        answer = answer_clock.last()
        assert cancelled and cancelled[0] < answer.started + answer.quanta * QUANTUM_S  # sent during the wait
        assert conn.execute("SELECT pg_backend_pid()").fetchone() == before


# ------------------------------------------------------------------ reload


def test_a_statement_under_way_when_a_reload_drops_its_user_ends_with_57p01_not_an_internal_error(
    test_db: TestDatabase, tmp_path: Path
):
    """The statement read the user's limits from the policy in force after waiting (for a pooled
    connection here) and found none: XX000. Their session is to end after the statement, with
    nothing charged for it."""
    text = TEST_POLICY.replace("statement_timeout_ms: 20000\n", "statement_timeout_ms: 20000\n  pool: {{size: 1}}\n")
    plain = ("  plain:\n    password: plain\n    auth: cleartext       # for the raw-protocol tests, which speak "
             "only cleartext\n    budget: {{epsilon: 1000000, delta: 0.5}}\n")
    assert plain in text
    ledger = tmp_path / "l.sqlite3"
    proxy = RunningProxy(make_policy(test_db, ledger, text))
    try:
        reloaded = tmp_path / "policy.yaml"
        reloaded.write_text(text.replace(plain, "").format(dsn=test_db.service_dsn, ledger=ledger))
        with proxy.connect() as holder, psycopg.connect(proxy.dsn("plain", "plain"), autocommit=True) as conn:
            holder.execute("BEGIN")
            holder.execute("SELECT 1")  # the one connection, until COMMIT
            outcome: list[BaseException | None] = []

            def ask() -> None:
                try:
                    conn.execute("SELECT COUNT(*) FROM adult WHERE sex = 'Male'").fetchall()
                    outcome.append(None)
                except psycopg.Error as exc:
                    outcome.append(exc)

            thread = _after(0, ask)
            _until(lambda: proxy.server.pool.waiting == 1, "the statement waits for the connection")
            assert proxy._call(proxy.server.reload(reloaded))
            holder.execute("COMMIT")
            thread.join(timeout=10)
        assert len(outcome) == 1 and isinstance(outcome[0], psycopg.errors.AdminShutdown), outcome
    finally:
        proxy.stop()


# ------------------------------------------------------------------ several workers


@pytest.fixture(scope="module")
def group(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """``listen.workers: 2`` (tests/test_workers.py's policy: ledger reserve 1, repeats on), with
    users of their own: ``racer`` (ε 4) and ``crashed``."""
    yield from _group_of(test_db, tmp_path_factory, {"racer": 4, "reloaded": 1000, "crashed": 100},
                         lambda text: with_toasted(text, "public.waits", braces=1))


def _group_of(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, budgets: dict[str, float],
              edit: Callable[[str], str] = lambda text: text) -> Iterator[Group]:
    """A two-worker group under tests/test_workers.py's policy, ``edit``-ed, with users ``budgets``
    (name: ε, password the name), stopped after its tests."""
    config = tmp_path_factory.mktemp("workers") / "policy.yaml"
    _write_policy(config, test_db)
    text = edit(config.read_text())
    users = "users:\n" + "".join(f"  {name}:\n    password: {name}\n    budget: {{epsilon: {eps}, delta: 0.001}}\n"
                                 for name, eps in budgets.items())
    config.write_text(text.replace("users:\n", users, 1))
    running = Group(config)
    try:
        yield running
    finally:
        running.stop()


def test_charges_racing_on_both_workers_never_pass_the_budget(group: Group):
    """Eight statements at once, four on each worker, for a budget of four: the ledger's
    conditional charge lets four through whichever worker asks, never more."""
    conns = [group.connect_to(i % 2, "racer") for i in range(8)]
    start = threading.Barrier(len(conns))
    outcomes: list[str] = []

    def ask(conn: psycopg.Connection, i: int) -> None:
        start.wait(timeout=10)
        try:
            conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {30 + i}").fetchall()
            outcomes.append("answered")
        except psycopg.Error as exc:
            outcomes.append(exc.sqlstate or "")

    try:
        threads = [_after(0, lambda c=conn, i=i: ask(c, i)) for i, conn in enumerate(conns)]  # type: ignore[misc]
        for thread in threads:
            thread.join(timeout=30)
        assert sorted(outcomes) == ["DP002"] * 4 + ["answered"] * 4, outcomes
        assert spent_epsilon(conns[0]) == spent_epsilon(conns[1]) == 4
    finally:
        for conn in conns:
            conn.close()


def test_one_statement_asked_at_once_on_both_workers_is_charged_for_every_fresh_answer(group: Group):
    """Both workers may miss the shared repeat store at once and answer afresh: then both
    answers are charged. No fresh noise is handed out for nothing."""
    sql = "SELECT COUNT(*) FROM adult WHERE age > 41 AND hours_per_week < 37"
    conns = [group.connect_to(worker) for worker in (0, 1, 0, 1)]
    start = threading.Barrier(len(conns))
    answers: list[tuple[float, str]] = []

    def ask(conn: psycopg.Connection) -> None:
        notices: list[str] = []
        conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        start.wait(timeout=10)
        row = conn.execute(sql).fetchone()
        assert row is not None
        answers.append((row[0], notices[0]))

    try:
        threads = [_after(0, lambda c=conn: ask(c)) for conn in conns]  # type: ignore[misc]
        for thread in threads:
            thread.join(timeout=30)
    finally:
        for conn in conns:
            conn.close()
    assert len(answers) == 4
    charged = {value for value, notice in answers if "ε charged 1" in notice}
    repeated = {value for value, notice in answers if "a repeat" in notice}
    assert charged and repeated <= charged, answers


def test_a_cancel_request_naming_no_worker_is_ignored(group: Group):
    """The pid's top bits name the worker a CancelRequest is passed on to; one naming a worker
    the group does not have (63 of 2) finds no socket, closes like any other and cancels nothing."""
    with group.connect_to(0) as conn:
        for pid in (63 << 24 | conn.info.backend_pid & 0xFFFFFF, 2**31 - 1, 0):
            with socket.create_connection(("127.0.0.1", group.port), timeout=5) as bogus:
                bogus.sendall(struct.pack("!iiii", 16, 80877102, pid, 12345))
                assert bogus.recv(1) == b""
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert "Traceback" not in group.output()


def test_answers_while_every_worker_reloads_are_noised_at_the_epsilon_they_are_charged(group: Group):
    """SIGHUP halving the table's ε and back while both workers answer: a statement planned under
    one policy and charged under the other would be noised for one ε and charged another. Each
    answer's notice pairs its charge with its noise (a COUNT's Laplace scale is 1/ε), and the
    spend adds up to the charges."""
    conns = [group.connect_to(worker, "reloaded") for worker in (0, 1)]
    before = spent_epsilon(conns[0])
    notices: list[str] = []
    stop = threading.Event()

    def ask(conn: psycopg.Connection, worker: int) -> None:
        conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
        for i in range(10_000):
            if stop.is_set():
                return
            # Never the same statement twice: a repeat is charged 0 and noised as its first answer was.
            conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {i % 70} AND hours_per_week > {worker + 2 * (i // 70)}"
                         ).fetchall()

    text = group.config.read_text()
    threads = [_after(0, lambda c=conn, w=worker: ask(c, w)) for worker, conn in enumerate(conns)]  # type: ignore[misc]
    try:
        for epsilon in ("0.5", "1.0"):
            group.config.write_text(text.replace("epsilon: 1.0\n    delta: 1.0e-6", f"epsilon: {epsilon}\n    delta: 1.0e-6"))
            reloaded = group.count("reloaded:")
            group.process.send_signal(signal.SIGHUP)
            group.wait_for("reloaded:", reloaded + 2)
            answered = len(notices)  # then answers under the new policy (not a sleep: a loaded machine answers few)
            _until(lambda: _charged_at(notices[answered:], float(epsilon)) >= 2, f"answers charged {epsilon}")
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        group.config.write_text(text)
    pairs = [re.search(r"ε charged ([0-9.]+), .*laplace scale ([0-9.]+)", notice) for notice in notices]
    assert all(pairs), notices
    charged = [(float(m.group(1)), float(m.group(2))) for m in pairs if m is not None]
    assert {epsilon for epsilon, _ in charged} == {0.5, 1.0}, "answers under both policies"
    assert all(scale == pytest.approx(1 / epsilon) for epsilon, scale in charged), charged
    assert spent_epsilon(conns[0]) == pytest.approx(before + sum(epsilon for epsilon, _ in charged))
    for conn in conns:
        conn.close()


def _charged_at(notices: list[str], epsilon: float) -> int:
    """How many of the answer ``notices`` charged ``epsilon``."""
    charged = (re.search(r"ε charged ([0-9.]+),", notice) for notice in notices)
    return sum(1 for found in charged if found and float(found.group(1)) == epsilon)


def _wait_for_a_lock_wait(test_db: TestDatabase) -> int:
    """Until a service backend waits at the gate of waits; its pid."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as observer:
        for _ in range(200):
            waiting = waiting_at_gate(observer, WAITS_GATE, SERVICE_ROLE)
            if waiting:
                return waiting[0][0]
            time.sleep(0.05)
    raise AssertionError("no statement waited at the gate of waits")


def test_a_worker_killed_during_a_charged_statement_keeps_that_charge_once(group: Group, test_db: TestDatabase):
    """kill -9 of the worker while its DP statement waits on the backend (after the charge):
    the statement stays charged, once; the other worker sees exactly that spend."""
    with group.connect_to(0, "crashed") as witness:
        before = spent_epsilon(witness)
    victim_conn = group.connect_to(1, "crashed")
    victim = next(p for p in group.workers() if p.cmdline()[p.cmdline().index("--index") + 1] == "1")
    serving_again = group.count("is serving again")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        hold_gate(admin, WAITS_GATE)  # the DP query waits for it, after its charge
        outcome: list[BaseException | None] = []

        def ask() -> None:
            try:
                victim_conn.execute(WAITS_SQL.format(n=1)).fetchall()
                outcome.append(None)
            except psycopg.Error as exc:
                outcome.append(exc)

        thread = _after(0, ask)
        _wait_for_a_lock_wait(test_db)  # charged, and sent: it waits for the lock
        victim.kill()
        thread.join(timeout=10)
        admin.execute("ROLLBACK")
    victim_conn.close()
    assert len(outcome) == 1 and isinstance(outcome[0], psycopg.OperationalError), outcome
    with group.connect_to(0, "crashed") as witness:
        assert spent_epsilon(witness) == before + 1
    group.wait_for("is serving again", serving_again + 1, timeout=60)


def test_a_passthrough_waiting_for_a_connection_when_a_reload_protects_its_table_is_judged_again(
    test_db: TestDatabase, tmp_path: Path
):
    """Judged under the policy in force when it arrived (lookup public), the statement then
    waited for a pooled connection (an analyst can pin them all with BEGIN) while a reload made
    lookup protected, and passed its rows through under the new policy."""
    text = TEST_POLICY.replace("statement_timeout_ms: 20000\n", "statement_timeout_ms: 20000\n  pool: {{size: 1}}\n")
    protected = text.replace("  public.lookup:\n    access: public\n",
                             "  public.lookup:\n    access: protected\n    epsilon: 1.0\n"
                             "    columns:\n      code: {{categories: [M, F]}}\n")
    assert protected != text
    ledger = tmp_path / "l.sqlite3"
    proxy = RunningProxy(make_policy(test_db, ledger, text))
    try:
        reloaded = tmp_path / "policy.yaml"
        reloaded.write_text(protected.format(dsn=test_db.service_dsn, ledger=ledger))
        with proxy.connect() as conn, proxy.connect() as holder:
            assert conn.execute("SELECT * FROM lookup").fetchall()  # public: its rows, as they are
            holder.execute("BEGIN")
            holder.execute("SELECT 1")  # the one connection, until COMMIT
            outcome: list[object] = []

            def ask() -> None:
                try:
                    outcome.append(conn.execute("SELECT * FROM lookup").fetchall())
                except psycopg.Error as exc:
                    outcome.append(exc.sqlstate)

            thread = _after(0, ask)
            _until(lambda: proxy.server.pool.waiting == 1, "the statement waits for the connection")
            assert proxy._call(proxy.server.reload(reloaded))
            holder.execute("COMMIT")
            thread.join(timeout=10)
        assert outcome == ["DP001"], outcome
    finally:
        proxy.stop()


_WATCHED_POLICY = TEST_POLICY.replace("  public.lookup:\n    access: public\n", """  public.lookup:
    access: public
  public.kw_secret: {{access: protected, epsilon: 1.0, columns: {{v: {{bounds: [0, 100]}}}}}}
  public.kw_view: {{access: public}}
""")


def test_a_statement_prepared_before_a_public_view_starts_reading_a_protected_table_is_refused_too(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The check run every few seconds takes a public view that DDL made read a protected table
    out of the registry; a statement prepared before kept its plan (a passthrough of the view)
    and passed the protected row (42) on at every Execute, until a reload."""
    monkeypatch.setattr("proxy.serving.server.FUNCTION_NAMES_REFRESH_S", 0.2)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS kw_secret CASCADE")
        admin.execute("DROP VIEW IF EXISTS kw_view")
        admin.execute("CREATE TABLE kw_secret (v int); INSERT INTO kw_secret VALUES (42)")
        admin.execute("CREATE VIEW kw_view AS SELECT 1 AS v")
        admin.execute(f"GRANT SELECT ON kw_secret, kw_view TO {SERVICE_ROLE}")
        proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", _WATCHED_POLICY))
        try:
            with proxy.connect() as conn:
                pgconn = conn.pgconn  # Parse once, then Bind/Execute only, as drivers do
                assert pgconn.prepare(b"s1", b"SELECT v FROM kw_view").status == psycopg.pq.ExecStatus.COMMAND_OK
                assert pgconn.exec_prepared(b"s1", []).get_value(0, 0) == b"1"
                admin.execute("CREATE OR REPLACE VIEW kw_view AS SELECT v FROM kw_secret")
                deadline = time.monotonic() + 10
                while True:  # until the check has found it
                    try:
                        with proxy.connect() as other:
                            other.execute("SELECT v FROM kw_view").fetchall()
                    except psycopg.errors.InsufficientPrivilege:
                        break
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                result = pgconn.exec_prepared(b"s1", [])
                assert result.status == psycopg.pq.ExecStatus.FATAL_ERROR, result.get_value(0, 0)
                assert b"default-deny" in (result.error_message or b"")
        finally:
            proxy.stop()
            admin.execute("DROP VIEW IF EXISTS kw_view")
            admin.execute("DROP TABLE IF EXISTS kw_secret")


@pytest.fixture(scope="module")
def reserving(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    """``listen.workers: 2`` with ``ledger.reserve: 10``: each worker reserves ten answers' worth
    of ε in the shared ledger and spends it from memory; user ``shower`` has ε 100."""
    def reserving_ten(text: str) -> str:
        assert "reserve: 1}" in text
        return text.replace("reserve: 1}", "reserve: 10, release_idle_s: 3600}")

    yield from _group_of(test_db, tmp_path_factory, {"shower": 100}, reserving_ten)


def _budget_row(conn: psycopg.Connection) -> dict[str, object]:
    cursor = conn.execute("SHOW dpproxy.budget")
    row = cursor.fetchone()
    assert row is not None and cursor.description is not None
    return dict(zip([d.name for d in cursor.description], row))


def test_show_budget_on_one_worker_counts_only_what_was_spent_not_the_others_reservation(reserving: Group):
    """One answer on worker 0 reserves ten answers' worth of ε in the ledger. SHOW dpproxy.budget
    on worker 1 said 10 spent, 90 left: the other worker's unused reservation counted as spent,
    as if nine ε were lost. It has the other worker give the reservation back first, so it says
    what was spent and what either worker can still spend; worker 0 then reserves afresh."""
    with reserving.connect_to(0, "shower") as first, reserving.connect_to(1, "shower") as second:
        first.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchall()
        shown = _budget_row(second)
        assert (float(shown["spent_epsilon"]), float(shown["remaining_epsilon"])) == (1.0, 99.0), shown
        assert float(_budget_row(first)["spent_epsilon"]) == 1.0
        first.execute("SELECT COUNT(*) FROM adult WHERE age > 31").fetchall()  # reserves again
        second.execute("SELECT COUNT(*) FROM adult WHERE age > 32").fetchall()
        for conn in (first, second):
            shown = _budget_row(conn)
            assert (float(shown["spent_epsilon"]), float(shown["remaining_epsilon"])) == (3.0, 97.0), shown
    assert "Traceback" not in reserving.output()
