"""The neighbour fuzzer with the backend failing in the middle of an answer.

An operator's action or a fault ends the backend connection or the statement while a DP answer
is computed: ``pg_terminate_backend`` of the service backend, ``pg_cancel_backend``, the backend
process killed (SIGKILL: PostgreSQL restarts every backend), the backend's
``statement_timeout``. The fault is decided by the operator, not by the rows, so what the
analyst then sees must be the same on a base table and on a neighbour with one row more: the
same SQLSTATE and text, the same charge (docs/threat-model.md: a statement the backend was
running stays charged, one never sent is given back), the session left usable or closed alike
and in the same transaction state, and the same statement asked again afterwards (same ε)
answered and charged alike, and charged in full: a sample released on the retry is charged
by it or by the failed run, never by neither.

The point of failure is made deterministic, not timed: an administrator's session holds
something the statement's backend waits for, the case runs in a thread until that backend waits
(or ends without waiting), and only then is the fault applied to that backend. Two points:

* the table, held in ACCESS EXCLUSIVE mode: a DP statement takes its locks in a lock step sent
  before its run, whose failure gives the charge back (``proxy/serving/relation_locks.py``), so
  the fault meets that lock step, uncharged;
* the gate (``tests/post_charge_wait.py``): the statement runs on a view of the table behind it,
  and its run waits there after its charge, whatever the statement reads; the budget keeper is
  read while it waits, to see the charge made.

The ``timeout`` fault runs the case through a dpproxy whose statement_timeout ends the wait.
Everything runs on a PostgreSQL of this module's own (a killed backend restarts the whole server).

``DPPROXY_FUZZ_FAULT_CASES`` sets the number of statements faulted at the lock step (default 16,
~10 s), ``DPPROXY_FUZZ_GATE_CASES`` at the gate (default 8, ~10 s), ``DPPROXY_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import math
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import psycopg
import pytest

from proxy.serving.relation_locks import lock_step_sql
from tests.conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, make_policy, running_proxy
from tests.neighbour_cases import Case
from tests.own_postgres import own_postgres
from tests.post_charge_wait import create_gate, gated, hold_gate, waiting_at_gate
from tests.reconcile import spend_while_running
from tests.test_neighbour_fuzz import SEED, Client, Outcome, _policy_text, _table_names, create_tables, draw_tables
from tests.test_neighbour_fuzz_paths import _charged, _drawn_case, _failure, _report, _spent

CASES = int(os.environ.get("DPPROXY_FUZZ_FAULT_CASES", "16"))
GATE_CASES = int(os.environ.get("DPPROXY_FUZZ_GATE_CASES", "8"))
BOUND_S = 30.0  # no statement, wait or recovery may take longer
SHORT_TIMEOUT_MS = 1500  # the ``timeout`` fault's dpproxy: a wait for the held lock outlasts it
# What a fault ends a statement with: cancelled or timed out, the backend terminated, the connection lost.
_FAULTS = ("57014", "57P01", "08006")
FAULTS = ("terminate", "cancel", "kill", "timeout")  # in turn


@dataclass(frozen=True)
class _Server:
    """This module's PostgreSQL: the fuzz tables and the service role, and how to reach it."""

    db: TestDatabase

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.db.admin_dsn, autocommit=True, connect_timeout=10)

    def wait_until_up(self) -> None:
        """Until the server accepts connections again (after a crash restart)."""
        deadline = time.monotonic() + BOUND_S
        while True:
            try:
                with self.admin() as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.fixture(scope="module")
def fault_pg() -> Iterator[_Server]:
    with own_postgres(TEST_DATABASE, "dpproxy-fuzz-faults-pg-") as server:
        db = TestDatabase(server.admin_dsn, server.service_dsn)
        create_tables(db)
        with psycopg.connect(db.admin_dsn, autocommit=True) as admin:
            create_gate(admin)
            for table in _table_names():
                gated(admin, _gated(table), table)
        yield _Server(db)


def _gated(table: str) -> str:
    """The gated view of a fuzz table (tests/post_charge_wait.py): ``nbf_base_3`` → ``nbg_base_3``."""
    return table.replace("nbf_", "nbg_", 1)


def _with_gated_views(text: str) -> str:
    """The fuzz policy ``text`` with each table's gated view protected as the table is (ctid_hash,
    which a view has no ctid for, is random on it)."""
    tables = [line for line in text.splitlines(keepends=True) if line.startswith("  public.nbf_")]
    assert len(tables) == len(_table_names())
    return text + "".join(_gated(line).replace("partitioning: ctid_hash", "partitioning: random") for line in tables)


def _proxy(server: _Server, tmp_path_factory: pytest.TempPathFactory, timeout_ms: int) -> Iterator[RunningProxy]:
    text = _with_gated_views(_policy_text()).replace("statement_timeout_ms: 5000", f"statement_timeout_ms: {timeout_ms}")
    assert f"statement_timeout_ms: {timeout_ms}" in text
    running = RunningProxy(make_policy(server.db, tmp_path_factory.mktemp("fault-ledger") / "ledger.sqlite3", text))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def fault_proxy(fault_pg: _Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The fuzz tables behind a dpproxy whose statements wait for a held lock until the fault."""
    yield from _proxy(fault_pg, tmp_path_factory, 60_000)


@pytest.fixture(scope="module")
def timeout_proxy(fault_pg: _Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The same, with a statement_timeout that a wait for the held lock runs into."""
    yield from _proxy(fault_pg, tmp_path_factory, SHORT_TIMEOUT_MS)


class _FaultClient(Client):
    """The fuzz client, reconnecting once the backend is back if a fault dropped its session
    while PostgreSQL restarts (a new session's first statement needs the backend)."""

    def _connect(self) -> psycopg.Connection:
        deadline = time.monotonic() + BOUND_S
        while True:
            try:
                return super()._connect()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def _in_thread(call: Callable[[], Any]) -> Callable[[float], tuple[bool, Any]]:
    """``call`` started in a thread; the function returned waits up to its argument in seconds
    and gives (done, result)."""
    outcome: list[Any] = []
    thread = threading.Thread(target=lambda: outcome.append(call()), daemon=True)
    thread.start()

    def result(timeout_s: float) -> tuple[bool, Any]:
        thread.join(timeout_s)
        return (bool(outcome), outcome[0] if outcome else None)

    return result


def _waiting_backend(admin: psycopg.Connection[Any], table: str) -> tuple[int, str] | None:
    """The pid and statement of a backend waiting for a lock on ``table``, or None.

    ``admin`` holds the lock in its transaction, where PostgreSQL keeps the pg_stat_activity it
    read first (pg_locks it reads afresh): without the snapshot cleared, the statement named was
    the one the waiting backend ran at the first look, often a short one of dpproxy's before it.
    """
    waiting = "SELECT l.pid FROM pg_catalog.pg_locks l WHERE l.relation = %s::regclass AND NOT l.granted LIMIT 1"
    row = admin.execute(waiting, (table,)).fetchone()
    if row is None:
        return None
    # The activity is read after the wait was seen, so after the waiting statement reported itself
    # (at its Parse, before it asked for the lock): one query reading both may read the activity
    # first, and name the statement the backend ran before.
    admin.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
    query = admin.execute("SELECT query FROM pg_catalog.pg_stat_activity WHERE pid = %s", (row[0],)).fetchone()
    return None if query is None else (int(row[0]), str(query[0]))


_LOCK_STEP = lock_step_sql("\0").partition("\0")[0]  # how the lock step's text begins


def _met(statement: str, table: str) -> str:
    """What a waiting backend statement is: dpproxy's "check", the lock step that takes a DP
    statement's locks (and checks its values) before its run (``/* dpproxy lock step */ ... LIMIT
    0``, proxy/serving/relation_locks.py), the DP statement's "read" of the rows (it names the table, or is longer than the 1 kB of it that
    pg_stat_activity keeps), else the statement itself, which the test reports: only those two
    read the table. (A short statement naming no table, "unplaced" here before, was the stale
    text ``_waiting_backend`` read before it cleared the activity snapshot.)"""
    if statement.startswith((_LOCK_STEP, f"BEGIN; {_LOCK_STEP}")):
        return "check"
    return "read" if len(statement.encode()) >= 1000 or table in statement else statement


def _values_checked(case: Case) -> bool:
    """Whether dpproxy checks ``case``'s values on the backend before the charge (a parameter or a
    quoted literal; read broadly: a quote anywhere). The check runs again under each ε."""
    return bool(case.params) or "'" in case.sql


@dataclass(frozen=True)
class _FaultRun:
    """What the analyst saw of a statement faulted on one table, and of it asked again."""

    faulted: tuple[Outcome, float]
    waited: str | None  # what the fault met (``_met``), or None; the test's observation, not the analyst's
    idle_after: bool  # the session (or its successor) outside a transaction block afterwards
    retry: tuple[Outcome, float]
    # At the gate: the charge the budget keeper showed while the backend waited, and the session's
    # transaction status right after the fault (``_Faulted``); None at the lock step.
    charged_while_waiting: float | None = None
    state: str | None = None


def _settle(client: Client, case: Case) -> None:
    """The session settings ``client.run`` would set for ``case``, set now."""
    for setting, value, attribute in (("TimeZone", case.timezone, "timezone"), ("client_encoding", case.encoding, "encoding"),
                                      ("dpproxy.epsilon", client.epsilon, "session_epsilon")):
        if value is not None and getattr(client, attribute) != value:
            client.conn.execute(f"SET {setting} = '{value}'" if attribute != "session_epsilon" else f"SET {setting} = {value}")
            setattr(client, attribute, value)


@dataclass(frozen=True)
class _Point:
    """Where a fault is placed: what an administrator holds (in a transaction of ``hold``'s), how a
    backend waiting for it is found (``find``: its pid and statement, or None), and what that
    backend met (``met``: from its statement)."""

    hold: Callable[[psycopg.Connection[Any]], None]
    find: Callable[[psycopg.Connection[Any]], tuple[int, str] | None]
    met: Callable[[str], str]


def _table_lock(table: str) -> _Point:
    """The table held in ACCESS EXCLUSIVE mode: a DP statement waits for it in its lock step,
    before the charge."""
    return _Point(lambda admin: admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
                  lambda admin: _waiting_backend(admin, table), lambda statement: _met(statement, table))


def _gate() -> _Point:
    """The gate held (tests/post_charge_wait.py): a DP statement on a gated view waits for it in
    its run, after the charge; "gate" for a run met there, else its statement, reported."""
    def find(admin: psycopg.Connection[Any]) -> tuple[int, str] | None:
        waiting = waiting_at_gate(admin)
        return waiting[0] if waiting else None

    return _Point(hold_gate, find, lambda statement: "check" if _met(statement, "") == "check" else "gate")


@dataclass(frozen=True)
class _Faulted:
    """A statement faulted once it waited at a point (``_Point``): its outcome and the ε it
    charged, what the fault met (``_Point.met``, None if it waited for nothing), the ε the budget
    keeper showed charged while it waited, and its session's transaction status right after
    (``closed`` for a session the fault ended)."""

    outcome: tuple[Outcome, float]
    waited: str | None
    charged_while_waiting: float | None
    state: str


def _faulted(server: _Server, client: Client, case: Case, table: str, fault: str, block: bool,
             point: _Point, keeper: Callable[[], float] | None = None) -> _Faulted:
    """``case`` on ``table`` (inside a transaction block if ``block``), its backend faulted once it
    waits at ``point``, which an administrator holds; with ``keeper`` (the analyst's spend as the
    budget keeper has it), the spend read while the backend waits."""
    admin = server.admin()
    admin.execute("BEGIN")
    point.hold(admin)
    before = _spent(client)
    spent_before = keeper() if keeper is not None else 0.0
    if block:
        _settle(client, case)  # outside the block: a ROLLBACK would undo the settings set in it
        client.conn.execute("BEGIN")
    result = _in_thread(lambda: client.run(case, table))
    while_waiting = None
    try:
        deadline = time.monotonic() + BOUND_S
        waiting = None
        # A timeout's wait is looked for until the statement ends: seen or not, it ends it.
        while waiting is None and not result(0.02)[0]:
            waiting = point.find(admin)
            assert time.monotonic() < deadline, "the statement neither waited nor ended"
        if waiting is not None and keeper is not None:
            while_waiting = round(keeper() - spent_before, 9)
        pid = waiting[0] if waiting is not None else None
        if pid is not None and fault == "terminate":
            admin.execute("SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))
        elif pid is not None and fault == "cancel":
            admin.execute("SELECT pg_catalog.pg_cancel_backend(%s)", (pid,))
        elif pid is not None and fault == "kill":
            os.kill(pid, signal.SIGKILL)  # the postmaster ends every backend, the admin's too, and restarts
        done, outcome = result(BOUND_S)
        assert done, f"the statement hung after the fault {fault}"
    finally:
        try:
            admin.close()
        except psycopg.Error:
            pass
    if fault == "kill":
        server.wait_until_up()
    closed = client.conn.closed or client.conn.broken
    state = "closed" if closed else client.conn.info.transaction_status.name
    if block and not closed:
        client.conn.execute("ROLLBACK")
    waited = None if waiting is None else point.met(waiting[1])
    return _Faulted((outcome, round(_spent(client) - before, 9)), waited, while_waiting, state)


def _at_lock(server: _Server, client: Client, case: Case, table: str, fault: str, block: bool,
             keeper: Callable[[], float]) -> tuple[tuple[Outcome, float], str | None]:
    """``case`` faulted at the lock of ``table`` (``_faulted``): its outcome and charge, and what
    the fault met. A wait in the statement's own backend SQL with nothing charged yet is a
    "check": the SQL parsed before the charge (a parameter's type described for the time-key
    narrowing, proxy/dp/narrowing.py) waits for the table there, as the lock step does after it."""
    faulted = _faulted(server, client, case, table, fault, block, _table_lock(table), keeper)
    if faulted.waited == "read" and faulted.charged_while_waiting == 0:
        return faulted.outcome, "check"
    return faulted.outcome, faulted.waited


def _every_point_met(met: set[tuple[str, str]]) -> bool:
    """Each fault met a DP statement's lock step before its charge (a timeout's point, if seen in
    time, is the same): with the table held, no DP statement reaches the read of its rows."""
    return set(FAULTS) - {"timeout"} <= {fault for fault, point in met if point == "check"}


def test_a_backend_failure_mid_answer_leaves_what_the_rows_do_not_decide(
    fault_pg: _Server, fault_proxy: RunningProxy, timeout_proxy: RunningProxy,
) -> None:
    clients = {"main": _FaultClient(fault_proxy), "timeout": _FaultClient(timeout_proxy)}
    proxies = {"main": fault_proxy, "timeout": timeout_proxy}
    rng = random.Random(SEED * 7919 + 37)
    failures: list[str] = []
    drawn: set[tuple[str, str]] = set()
    met: set[tuple[str, str]] = set()
    cases = 0
    try:
        index = -1
        # At least CASES cases, and more (up to four times as many) until the faults have met every
        # point: many drawn statements are refused, and which depends on the generator.
        while (index := index + 1) < CASES or (not _every_point_met(met) and index < 4 * CASES):
            # Every other round the fault comes first, into a statement whose values dpproxy
            # checks (a quoted literal or a parameter). In the others it comes into a statement
            # with no values to check, after a run of its own. Either way it meets the lock step
            # (or, before the charge, the statement's parse for a parameter's type).
            first = (index // len(FAULTS)) % 2 == 1
            case = _drawn_case(rng, lambda case: not case.prepared and _values_checked(case) == first)
            fault = FAULTS[index % len(FAULTS)]
            block = fault != "kill" and rng.random() < 0.2 and not case.row_limit
            which = "timeout" if fault == "timeout" else "main"
            client, proxy = clients[which], proxies[which]
            keeper = lambda: spend_while_running(proxy, "analyst").keeper  # noqa: E731
            base, neighbour = draw_tables(rng, client, drawn, case)
            runs = []
            for table in (f"nbf_{base}", neighbour):
                if first:
                    client.epsilon = f"0.{700001 + 2 * index}"
                    faulted, waited = _at_lock(fault_pg, client, case, table, fault, block, keeper)
                client.epsilon = f"0.{700000 + 2 * index}"  # this case's own: never a repeat of another
                reference = _charged(client, lambda: client.run(case, table))
                client.epsilon = f"0.{700001 + 2 * index}"
                if not first:
                    faulted, waited = _at_lock(fault_pg, client, case, table, fault, block, keeper)
                idle = client.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                retry = _charged(client, lambda: client.run(case, table))  # the same ε: a repeat if one was stored
                runs.append(_FaultRun(faulted, waited, idle, retry))
                # What is promised (docs/threat-model.md): a DP statement that failed while the
                # backend ran it stays charged, in full; one faulted in a check before the charge costs nothing.
                expected = reference[1] * float(client.epsilon) / float(f"0.{700000 + 2 * index}")
                if (waited in ("check", "read") and faulted[0].kind in ("error", "dropped") and faulted[0].detail[0] in _FAULTS
                        and not math.isclose(faulted[1], 0.0 if waited == "check" else expected, abs_tol=1e-6)):
                    failures.append(f"{case.sql}\n    on {table}, fault {fault} met the {waited}: charged "
                                    f"{faulted[1]}, {0.0 if waited == 'check' else expected} promised")
                # A sample is released at most once per charge: the retry's answer is the failed
                # run's stored one (charged then) or its own (charged now).
                if retry[0].kind == "answer" and reference[1] > 0 and faulted[1] + retry[1] < reference[1] - 1e-9:
                    failures.append(f"{case.sql}\n    on {table}, fault {fault}: the retry's answer was charged "
                                    f"{retry[1]} after a failed run charged {faulted[1]} ({reference[1]} per answer)")
            for run, table in zip(runs, (f"nbf_{base}", neighbour)):
                if run.waited not in (None, "check", "read"):
                    failures.append(f"{case.sql}\n    on {table}, fault {fault} met a statement that is "
                                    f"neither a check nor a read: {run.waited!r}")
            cases += 1
            if runs[0].waited in ("check", "read") and runs[0].faulted[0].kind != "answer":
                met.add((fault, runs[0].waited))
            internal = any(run.faulted[0].kind == "error" and run.faulted[0].detail[0] == "XX000" for run in runs)
            # Compared as the analyst sees them: where the fault met the statement is timing.
            if replace(runs[0], waited=None) != replace(runs[1], waited=None) or internal:
                failures.append(_failure(index, replace(case, sql=f"[{fault}{' in a block' if block else ''}] {case.sql}"),
                                         neighbour, *runs))
    finally:
        for client in clients.values():
            client.conn.close()
    assert not failures, _report("statements faulted mid-answer", failures, cases)
    assert _every_point_met(met), f"faults met only {met}"


def _gate_rules(fault: str, run: _FaultRun, expected: float) -> list[str]:
    """What a DP statement faulted at the gate, after its charge, must show whatever the rows
    (docs/threat-model.md): the budget keeper shows the charge while the backend waits; a fault
    that ended the statement leaves it charged in full; and the same statement asked again (at the
    same ε: the failed run released nothing) is charged in full too. Each broken rule, said."""
    broken = []
    outcome, charged = run.faulted
    if run.waited != "gate":
        return [f"fault {fault} met {run.waited!r}, not the gate"] if run.waited is not None else []
    if run.charged_while_waiting is None or not math.isclose(run.charged_while_waiting, expected, abs_tol=1e-6):
        broken.append(f"while its backend waited at the gate the keeper showed {run.charged_while_waiting} charged, "
                      f"{expected} promised")
    if outcome.kind not in ("error", "dropped") or outcome.detail[0] not in _FAULTS:
        broken.append(f"fault {fault} at the gate ended in {outcome}, not a fault's error")
    elif not math.isclose(charged, expected, abs_tol=1e-6):
        broken.append(f"fault {fault} at the gate: charged {charged}, {expected} promised")
    if run.retry[0].kind == "answer" and not math.isclose(run.retry[1], expected, abs_tol=1e-6):
        broken.append(f"fault {fault} at the gate: the retry's answer was charged {run.retry[1]}, {expected} promised")
    return broken


def test_a_backend_failure_after_the_charge_leaves_what_the_rows_do_not_decide(
    fault_pg: _Server, fault_proxy: RunningProxy, timeout_proxy: RunningProxy,
) -> None:
    """The faults met after the charge, at the gate (tests/post_charge_wait.py): each drawn
    statement runs on the gated views of a base table and of a neighbour with one adversarial row,
    is answered once (its charge per answer), then faulted while its run waits at the held gate,
    then asked again at the faulted run's ε. Both tables must show the same SQLSTATE and text,
    charge, session state and retry; every rule of ``_gate_rules`` must hold on each; and every
    fault must meet the gate at least once (``DPPROXY_FUZZ_GATE_CASES`` statements, default 8,
    more until then)."""
    clients = {"main": _FaultClient(fault_proxy), "timeout": _FaultClient(timeout_proxy)}
    proxies = {"main": fault_proxy, "timeout": timeout_proxy}
    rng = random.Random(SEED * 7919 + 41)
    failures: list[str] = []
    drawn: set[tuple[str, str]] = set()
    met: set[str] = set()
    cases = 0
    try:
        index = -1
        while (index := index + 1) < GATE_CASES or (met != set(FAULTS) and index < 6 * GATE_CASES):
            case = _drawn_case(rng, lambda case: not case.prepared)
            fault = FAULTS[index % len(FAULTS)]
            block = fault != "kill" and rng.random() < 0.2 and not case.row_limit
            which = "timeout" if fault == "timeout" else "main"
            client, proxy = clients[which], proxies[which]
            base, neighbour = draw_tables(rng, client, drawn, case)
            reference_epsilon, epsilon = f"0.{600000 + 2 * index}", f"0.{600001 + 2 * index}"
            runs, broken = [], []
            for view in (_gated(f"nbf_{base}"), _gated(neighbour)):
                client.epsilon = reference_epsilon  # this case's own: never a repeat of another
                reference = _charged(client, lambda: client.run(case, view))
                client.epsilon = epsilon
                at_gate = _faulted(fault_pg, client, case, view, fault, block, _gate(),
                                   lambda: spend_while_running(proxy, "analyst").keeper)
                retry = _charged(client, lambda: client.run(case, view))  # the same ε: a repeat if one was stored
                run = _FaultRun(at_gate.outcome, at_gate.waited, at_gate.state == "IDLE", retry,
                                at_gate.charged_while_waiting, at_gate.state)
                runs.append(run)
                expected = reference[1] * float(epsilon) / float(reference_epsilon)
                broken += [f"\n    on {view}: {rule}" for rule in _gate_rules(fault, run, expected)]
            if broken:
                failures.append(f"case {index}: {case.sql}{''.join(broken)}")
            cases += 1
            if runs[0].waited == "gate" and runs[0].faulted[0].kind != "answer":
                met.add(fault)
            # Whether a statement reached its run is the statement's, not the rows'; whether a
            # timeout was seen waiting before it fired is timing.
            seen = (lambda run: replace(run, waited=None, charged_while_waiting=None)) if fault == "timeout" \
                else (lambda run: run)
            internal = any(run.faulted[0].kind == "error" and run.faulted[0].detail[0] == "XX000" for run in runs)
            if seen(runs[0]) != seen(runs[1]) or internal:
                failures.append(_failure(index, replace(case, sql=f"[{fault} at the gate{' in a block' if block else ''}] "
                                                                  f"{case.sql}"), _gated(neighbour), *runs))
    finally:
        for client in clients.values():
            client.conn.close()
    assert not failures, _report("statements faulted after the charge", failures, cases)
    assert met == set(FAULTS), f"only these faults met the gate: {met}"



def test_the_fault_is_placed_by_the_statement_waiting_not_by_what_its_backend_ran_before(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # One pooled connection: the DP count waits on the backend that ran the SELECT 1 before it,
    # while the administrator's first look (in the transaction holding the lock) saw it idle.
    policy = TEST_POLICY.replace("  statement_timeout_ms: 20000\n",
                                 "  statement_timeout_ms: 20000\n  pool: {{size: 1}}\n")
    with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
        conn.execute("SELECT 1")
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            admin.execute("BEGIN")
            admin.execute("LOCK TABLE adult IN ACCESS EXCLUSIVE MODE")
            assert _waiting_backend(admin, "adult") is None
            result = _in_thread(lambda: conn.execute("SELECT COUNT(*) FROM adult").fetchone())
            deadline = time.monotonic() + BOUND_S
            while (waiting := _waiting_backend(admin, "adult")) is None:
                assert time.monotonic() < deadline, "the DP count never waited for the lock"
            assert _met(waiting[1], "adult") == "check", waiting  # the lock step, before the charge
            admin.execute("ROLLBACK")
        done, row = result(BOUND_S)
        assert done and row[0] > 40000
