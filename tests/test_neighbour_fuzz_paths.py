"""The neighbour fuzzer on the paths its plain statements do not walk: one row must change nothing there either.

``tests/test_neighbour_fuzz.py`` runs each generated DP statement once on a base table and on a
neighbour with one adversarial row more. Here the same cases (``tests/neighbour_cases.py``), run
by the same ``Client`` and compared as its ``Outcome``, go through

* SQL cursors: ``DECLARE c [SCROLL] [BINARY] CURSOR [WITH HOLD] FOR <case>`` and a drawn run of
  FETCH/MOVE/CLOSE, compared step by step;
* the shared repeat store of ``listen.workers: 2``: each case asked again in its session, in
  another session and in a session of the other process, and literals and parameters that differ
  only in representation (``40``, ``40.0``, ``'40'``, ``$1`` as int, float, numeric or text); the
  outcome and the ε charged at each ask must be the same on every neighbour;
* CancelRequests sent at a drawn delay into each case: whether it is cancelled may depend on
  timing, so only invariants are compared: a cancelled statement is charged nothing or its ε
  and never more than it would have been, an answered one exactly as without the cancel, and the
  session afterwards answers as on the neighbour (same outcome, same charge, no block left);
* the statement limits (nesting, parentheses, AND/OR chains, operator runs, parse-tree size
  and ``max_statement_bytes``): statements drawn just within and just past each limit must have
  the same outcome on every neighbour, and a 54000/54001 refusal charges nothing;
* catalog statements that name the protected table (``\\d``'s queries, ``pg_class`` and
  ``pg_attribute`` on it, ``to_regclass``, ``format_type``, statistics, sizes, whole catalog
  rows): their answers must be byte for byte the same, after masking the table's name and the
  numbers that differ between two tables by construction (see ``_CatalogMask``).

The tables here are ANALYZEd (statistics and sizes that differ with one row) and one family has
a 25 ms ``answer_quantum_ms``, besides the 1 ms one of the "empty" family: cancels during its
computation and its wait are put off to the boundary (``Executor.cancel``).

``DPPROXY_FUZZ_PATHS_CASES`` scales every test's number of cases (default 1: ~15 s each),
``DPPROXY_FUZZ_SEED`` picks the seed as for the fuzzer.
"""

from __future__ import annotations

import math
import os
import random
import re
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import TypeVar

import psycopg
import pytest

from proxy.serving.workers import worker_of
from rewriter.limits import MAX_BOOLEAN_TERMS, MAX_NESTING, MAX_OPERATOR_RUN, MAX_PARENTHESES
from tests.conftest import TEST_DATABASE, RunningProxy, TestDatabase
from tests.neighbour_cases import COLUMNS, Case, _Builder, generate_case
from tests.test_neighbour_fuzz import (
    BASES, FAMILY_POLICY, NEIGHBOURS, REPORTED, SEED, Client, Outcome, _broken, _fuzz_proxy, _policy_text, _table_names,
    draw_tables,
)
from tests.test_workers import Group
from tests.wire import Wire, cstr, data_row_values, error_fields, message

SCALE = float(os.environ.get("DPPROXY_FUZZ_PATHS_CASES", "1"))
_T = TypeVar("_T")
# A quantum long enough that cancels land in the computation and in the wait.
PATHS_FAMILY_POLICY = {**FAMILY_POLICY, "twice": "partitioning: auto, answer_quantum_ms: 25"}


def _cases(default: int) -> int:
    return max(1, round(default * SCALE))


@pytest.fixture(scope="module")
def paths_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The fuzzer's tables, ANALYZEd, behind an in-process dpproxy."""
    for running in _fuzz_proxy(test_db, tmp_path_factory, PATHS_FAMILY_POLICY):
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            for name in _table_names():
                conn.execute(f"ANALYZE {name}")
        yield running


@dataclass
class _GroupAddress:
    """What ``Client`` needs of a proxy, for a ``dpproxy serve`` with two workers."""

    host: str
    port: int

    def dsn(self, user: str = "analyst", password: str = "analyst", database: str = TEST_DATABASE) -> str:
        return f"host={self.host} port={self.port} dbname={database} user={user} password={password}"


@pytest.fixture(scope="module")
def workers_group(paths_proxy: RunningProxy, test_db: TestDatabase,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[_GroupAddress]:
    """The same tables (made by ``paths_proxy``) and policy served by ``dpproxy serve`` with
    ``listen.workers: 2``: its workers share the repeat store (a SQLite file) and the ledger."""
    directory = tmp_path_factory.mktemp("fuzz-workers")
    # Every charge written to the ledger (reserve 1): a worker's SHOW dpproxy.budget counts the
    # other worker's unused reservation as spent, and so moved when that one reserved or gave back.
    text = _policy_text(PATHS_FAMILY_POLICY).replace(
        "listen: {{host: 127.0.0.1, port: 0}}", "listen: {{host: 127.0.0.1, port: 0, workers: 2}}").replace(
        'ledger: {{url: "sqlite:///{ledger}"}}', 'ledger: {{url: "sqlite:///{ledger}", reserve: 1}}')
    assert "workers: 2" in text and "reserve: 1" in text
    config = directory / "policy.yaml"
    config.write_text(text.format(dsn=test_db.service_dsn, ledger=directory / "ledger.sqlite3"))
    group = Group(config)
    try:
        yield _GroupAddress("127.0.0.1", group.port)
    finally:
        group.stop()


def _drawn_case(rng: random.Random, accept: Callable[[Case], bool] = lambda case: True) -> Case:
    """A generated case that ``accept`` takes, as a plain statement (no repeat, no raw row limit)."""
    while True:
        case = replace(generate_case(rng), repeat=False, row_limit=0)
        if accept(case):
            return case


def _spent(client: Client) -> float:
    """The analyst's spent ε (``SHOW dpproxy.budget``), asked again if a stray cancel hit it."""
    for _ in range(3):
        try:
            row = client.conn.execute("SHOW dpproxy.budget").fetchone()
            assert row is not None
            return float(row[1])
        except psycopg.errors.QueryCanceled:
            continue
    raise AssertionError("SHOW dpproxy.budget cancelled three times")


def _charged(client: Client, run: Callable[[], Outcome]) -> tuple[Outcome, float]:
    """``run``'s outcome and the ε it charged."""
    before = _spent(client)
    outcome = run()
    return outcome, round(_spent(client) - before, 9)


def _report(what: str, failures: list[str], ran: int) -> str:
    return (f"seed {SEED} (DPPROXY_FUZZ_SEED): {len(failures)} of {ran} {what} depend on one row, or break "
            f"dpproxy; the first {min(len(failures), REPORTED)}:\n" + "\n".join(failures[:REPORTED]))


def _failure(index: int, case: Case, neighbour: str, on_base: object, on_neighbour: object) -> str:
    return (f"case {index}: {case.sql[:2000]}\n    params: {case.params!r}, binary: {case.binary}, "
            f"TimeZone: {case.timezone}, encoding: {case.encoding}\n    neighbour: {neighbour}\n"
            f"    base:      {on_base}\n    neighbour: {on_neighbour}")


def _any_broken(outcomes: object) -> bool:
    if isinstance(outcomes, Outcome):
        return _broken(outcomes)
    if isinstance(outcomes, (tuple, list)):
        return any(_any_broken(item) for item in outcomes)
    return False


def _on_neighbours(client: Client, salt: int, count: int, draw: Callable[[random.Random], tuple[Case, _T]],
                   run: Callable[[_T, str], object]) -> Iterator[tuple[int, Case, str, list[object]]]:
    """``count`` (scaled) cases drawn by ``draw`` (a case, and what to run of it) from the seed
    and ``salt``, each run by ``run`` on a base table and on one of its neighbours: their index,
    case, neighbour and two runs. The client is closed at the end."""
    rng = random.Random(SEED * 7919 + salt)
    try:
        for index in range(_cases(count)):
            case, what = draw(rng)
            base, neighbour = draw_tables(rng, client, case)
            yield index, case, neighbour, [run(what, table) for table in (f"nbf_{base}", neighbour)]
    finally:
        client.conn.close()


# ------------------------------------------------------------------ cursors

_FETCHES = (
    "FETCH NEXT FROM c", "FETCH c", "FETCH 2 FROM c", "FETCH ALL FROM c", "FETCH FORWARD 0 FROM c", "FETCH PRIOR FROM c",
    "FETCH FIRST FROM c", "FETCH LAST FROM c", "FETCH ABSOLUTE 2 FROM c", "FETCH ABSOLUTE -1 FROM c",
    "FETCH RELATIVE -1 FROM c", "FETCH RELATIVE 0 FROM c", "FETCH BACKWARD ALL FROM c", "FETCH BACKWARD 1 FROM c",
    "MOVE 1 IN c", "MOVE LAST IN c", "MOVE ABSOLUTE 0 IN c", "MOVE BACKWARD ALL IN c", "MOVE FORWARD ALL IN c",
    "CLOSE c", "FETCH 1 FROM d",
)


def _cursor_steps(rng: random.Random, case: Case) -> list[Case]:
    """``case`` as a DECLARE in a block, a drawn run of FETCH/MOVE/CLOSE and the block's end."""
    scroll = rng.choice(["", "SCROLL ", "NO SCROLL "])
    binary = "BINARY " if rng.random() < 0.15 else ""
    hold = rng.choice(["", "", " WITH HOLD", " WITHOUT HOLD"])
    declare = replace(case, sql=f"DECLARE c {binary}{scroll}CURSOR{hold} FOR {case.sql}", prepared=False)
    step = replace(case, sql="", params=(), prepared=False, binary=rng.random() < 0.2)
    fetches = [replace(step, sql=rng.choice(_FETCHES)) for _ in range(rng.randint(1, 6))]
    end = rng.choice(["COMMIT", "ROLLBACK", "END"])
    after = [replace(step, sql="FETCH ALL FROM c"), replace(step, sql="CLOSE c")] if hold and "WITH " in hold else []
    return [replace(step, sql="BEGIN"), declare, *fetches, replace(step, sql=end), *after]


def test_a_cursor_over_a_dp_statement_fetches_the_same_on_every_neighbour(paths_proxy: RunningProxy) -> None:
    client = Client(paths_proxy)

    def draw(rng: random.Random) -> tuple[Case, list[Case]]:
        case = _drawn_case(rng, lambda case: not case.sql.startswith("COPY"))
        return case, _cursor_steps(rng, case)

    def run(steps: list[Case], table: str) -> tuple[tuple[Outcome, ...], float]:
        try:
            return _charged(client, lambda: tuple(client.run(step, table) for step in steps))
        finally:
            client.conn.execute("ROLLBACK")  # (a warning outside a block)
            client.conn.execute("CLOSE ALL")

    failures: list[str] = []
    answered = cases = 0
    for index, case, neighbour, runs in _on_neighbours(client, 11, 150, draw, run):
        cases += 1
        answered += runs[0][0][1].kind == "answer"  # type: ignore[index]
        if runs[0] != runs[1] or _any_broken(runs):
            failures.append(_failure(index, case, neighbour, *runs))
    assert not failures, _report("cursor runs", failures, cases)
    assert answered >= cases // 5, f"too few DECLAREs answered: {answered} of {cases}"



def test_a_binary_cursor_over_date_and_timestamp_keys_fetches_the_same_on_every_neighbour(paths_proxy: RunningProxy) -> None:
    """A BINARY cursor's keys are sent in their binary form, turned from the text dpproxy holds
    (proxy/wire/binary.py): drawn for 15 % of the cursors, so pinned here for both key types."""
    client = Client(paths_proxy)
    statements = ("SELECT CAST(date_trunc('month', d) AS date), COUNT(*) FROM {table} GROUP BY 1",
                  "SELECT date_trunc('quarter', ts), SUM(i2) FROM {table} GROUP BY 1")
    failures: list[str] = []
    try:
        for sql in statements:
            case = Case(sql, (), keys=1)
            steps = [replace(case, sql=step) for step in ("BEGIN", f"DECLARE c BINARY CURSOR FOR {sql}", "FETCH ALL FROM c", "COMMIT")]
            client.epsilon = f"0.{600000 + statements.index(sql)}"  # no other draw's: never a repeat of one
            runs = {table: tuple(client.run(step, table) for step in steps)
                    for table in ("nbf_base", *(f"nbf_base_{k}" for k in range(NEIGHBOURS)))}
            on_base = runs["nbf_base"]
            assert on_base[2].kind == "answer", on_base
            failures += [f"{sql} on {table}:\n    base:      {on_base}\n    neighbour: {outcomes}"
                         for table, outcomes in runs.items() if outcomes != on_base or _any_broken(outcomes)]
    finally:
        client.conn.close()
    assert not failures, "\n".join(failures[:REPORTED])


# ------------------------------------------------------------------ the shared repeat store

def _client_on(group: _GroupAddress, worker: int) -> Client:
    """A fuzz ``Client`` whose session the kernel gave to ``worker``."""
    for _ in range(200):
        client = Client(group)  # type: ignore[arg-type]  # (Client needs host, port and dsn())
        if worker_of(client.conn.info.backend_pid) == worker:
            return client
        client.conn.close()
    raise AssertionError(f"200 connections and none reached worker {worker}")


# A number's spellings in a statement, and as a bound parameter: the same value to PostgreSQL.
_SPELLINGS = ("{v}", "{v}.0", "'{v}'", "CAST('{v}' AS numeric)", "{v}::int8", "+{v}", "({v})")
_NUMBERS = ("40", "5", "0", "1", "7", "100", "32768")
_NUMERIC = tuple(c for c in COLUMNS if c.numeric)


def _spelled(rng: random.Random) -> list[Case]:
    """One aggregate over a comparison of a numeric column with one number, spelled each way."""
    builder = _Builder(rng)
    aggregate, _ = builder.aggregate()
    column = rng.choice(_NUMERIC).name
    op = rng.choice(["=", "<", ">=", "<>"])
    value = rng.choice(_NUMBERS)
    sql = f"SELECT {aggregate} FROM {{table}} WHERE {column} {op} "
    literal = [Case(sql + spelling.format(v=value), tuple(builder.params)) for spelling in _SPELLINGS]
    number = len(builder.params) + 1
    bound = [Case(sql + f"${number}", (*builder.params, param), binary=binary)
             for param in (int(value), float(value), Decimal(value), Decimal(f"{value}.00"), value)
             for binary in (False, True)]
    return [*literal, *bound]


def test_a_repeat_across_sessions_and_workers_is_decided_by_the_statement_alone(workers_group: _GroupAddress) -> None:
    """Each case asked in a session, again in it, in another session of the same worker and in
    one of the other worker; then a number spelled each way, one after the other. Whether an ask
    is a repeat, what it charges and its outcome must be the same on the base table and on the
    neighbour (the store is keyed by the statement: the table's name tells them apart)."""
    rng = random.Random(SEED * 7919 + 13)
    first, same_worker, other_worker = (_client_on(workers_group, w) for w in (0, 0, 1))
    clients = (first, same_worker, other_worker)
    failures: list[str] = []
    repeats = cases = 0
    try:
        for index in range(_cases(40)):
            spelled = rng.random() < 0.3
            cases_now = _spelled(rng) if spelled else [_drawn_case(rng)]
            base, neighbour = draw_tables(rng, first, *cases_now)
            for other in clients:
                other.epsilon = first.epsilon
            asks = [(first, case) for case in cases_now] if spelled else [
                (client, cases_now[0]) for client in (first, first, same_worker, other_worker)]
            runs = [tuple(_charged(client, lambda: client.run(case, table)) for client, case in asks)
                    for table in (f"nbf_{base}", neighbour)]
            cases += 1
            repeats += sum(1 for outcome, charge in runs[0] if outcome.kind == "answer" and charge == 0)
            if runs[0] != runs[1] or _any_broken(runs):
                failures.append(_failure(index, cases_now[0], neighbour, *runs))
    finally:
        for client in clients:
            client.conn.close()
    assert not failures, _report("asks", failures, cases)
    assert repeats >= cases // 3, f"too few repeats answered from the store: {repeats} in {cases} cases"


# ------------------------------------------------------------------ cancels

_DELAYS_S = (0.0, 0.0005, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05)
_LOCKED_DELAYS_S = (0.05, 0.1, 0.3)
_LONG_IN_LIST = f"i4 IN ({', '.join(map(str, range(3100)))})"  # just over 16 KiB


@dataclass(frozen=True)
class _CancelRun:
    """What a cancel into a statement left that may not depend on the rows."""

    reference: tuple[Outcome, float]  # the statement without a cancel, and its charge
    after: tuple[Outcome, float]  # the statement asked again (fresh) after the cancelled one
    idle: bool  # the session was outside a block afterwards


def _cancelled(client: Client, case: Case, table: str, delay_s: float,
               locker: psycopg.Connection | None) -> tuple[Outcome, float]:
    """``case`` on ``table`` with a CancelRequest sent ``delay_s`` after it began (waited for
    before returning, so that it cannot reach a later statement through this client). With
    ``locker``, another session holds the table locked meanwhile: what reads its rows waits
    for the lock, so the cancel finds the answer under way on the backend, after its charge
    (one sent before then is lost, as PostgreSQL's: the backend's statement_timeout ends the wait)."""
    if locker is not None:
        locker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    timer = threading.Timer(delay_s, client.conn.cancel_safe)
    try:
        before = _spent(client)
        timer.start()
        try:
            outcome = client.run(case, table)
        finally:
            timer.cancel()  # not sent if the statement is over first
            timer.join()
    finally:
        if locker is not None:
            locker.rollback()
    return outcome, round(_spent(client) - before, 9)


def _is_cancel(outcome: Outcome) -> bool:
    return outcome.kind in ("error", "dropped") and outcome.detail[0] == "57014"


def _after_cancel(client: Client, case: Case, table: str) -> tuple[Outcome, float]:
    """``case`` asked again; a late CancelRequest (PostgreSQL's own race) may hit one ask."""
    for _ in range(3):
        outcome, charge = _charged(client, lambda: client.run(case, table))
        if not _is_cancel(outcome):
            return outcome, charge
    raise AssertionError("asked three times after a cancel, cancelled every time")


def _cancel_run(client: Client, case: Case, table: str, delay_s: float, epsilons: tuple[str, ...],
                locker: psycopg.Connection | None) -> tuple[_CancelRun, list[str], bool]:
    """The statement's reference run, a cancelled run and a run after it, each under its own ε
    (never a repeat of another); what the cancelled run broke of the invariants, and whether it
    was cancelled."""
    problems = []
    client.epsilon = epsilons[0]
    reference = _charged(client, lambda: client.run(case, table))
    client.epsilon = epsilons[1]
    outcome, charge = _cancelled(client, case, table, delay_s, locker)
    expected = float(epsilons[1]) if reference[1] > 0 else 0.0
    if _is_cancel(outcome):
        if charge not in (0.0, expected) and not math.isclose(charge, expected, rel_tol=1e-9):
            problems.append(f"cancelled and charged {charge} (0 or {expected} expected)")
    else:
        if outcome != reference[0] and outcome.kind != reference[0].kind:
            problems.append(f"answered after a cancel as {outcome}, without one as {reference[0]}")
        if not math.isclose(charge, expected, rel_tol=1e-9, abs_tol=1e-12):
            problems.append(f"not cancelled, charged {charge} ({expected} expected)")
    client.epsilon = epsilons[2]
    after = _after_cancel(client, case, table)
    idle = client.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    return _CancelRun(reference, after, idle), problems, _is_cancel(outcome)


def test_a_cancel_into_a_dp_statement_leaves_a_charge_and_a_session_the_rows_do_not_decide(
    paths_proxy: RunningProxy, test_db: TestDatabase,
) -> None:
    client = Client(paths_proxy)
    locker = psycopg.connect(test_db.admin_dsn)
    failures: list[str] = []
    cancelled = 0
    asked = iter(range(10**6))

    def draw(rng: random.Random) -> tuple[Case, tuple[Case, float, bool, tuple[str, ...]]]:
        # (A prepared case's Describe would take the cancel, and its Execute then wait for the lock.)
        case = _drawn_case(rng, lambda case: not case.prepared)
        if " WHERE " in case.sql and rng.random() < 0.06:
            # Longer than _ANALYSED_IN_THREAD_BYTES: a cancel during its analysis ends the wait for it.
            case = replace(case, sql=case.sql.replace(" WHERE ", f" WHERE {_LONG_IN_LIST} OR ", 1))
        locked = rng.random() < 0.5
        index = next(asked)
        epsilons = tuple(f"0.{500000 + 3 * index + k}" for k in range(3))  # each ask's own: never a repeat
        return case, (case, rng.choice(_LOCKED_DELAYS_S if locked else _DELAYS_S), locked, epsilons)

    def run(what: tuple[Case, float, bool, tuple[str, ...]], table: str) -> _CancelRun:
        nonlocal cancelled
        case, delay_s, locked, epsilons = what
        outcome, problems, stopped = _cancel_run(client, case, table, delay_s, epsilons, locker if locked else None)
        cancelled += stopped
        failures.extend(f"{case.sql}\n    on {table}, cancelled after {delay_s} s: {problem}" for problem in problems)
        return outcome

    cases = 0
    try:
        for index, case, neighbour, runs in _on_neighbours(client, 17, 50, draw, run):
            cases += 1
            reached = [r.reference[0] for r in runs] + [r.after[0] for r in runs]  # type: ignore[attr-defined]
            if runs[0] != runs[1] or _any_broken(reached):
                failures.append(_failure(index, case, neighbour, *runs))
    finally:
        locker.close()
    assert not failures, _report("cancelled statements", failures, cases)
    # A locked table keeps an answer on the backend until the cancel (or the statement timeout) ends it.
    assert cancelled >= cases // 10, f"too few statements cancelled: {cancelled} of {2 * cases}"


# ------------------------------------------------------------------ statement limits

_MAX_STATEMENT_BYTES = 1024 * 1024  # listen.max_statement_bytes's default, the fuzz policy's
_TREE_IN_LIST = 75_000  # about the IN list that MAX_TREE_BYTES admits (rewriter/limits.py)


def _stressor(rng: random.Random, builder: _Builder) -> str:
    """A WHERE condition just within or just past one of the statement limits."""
    kind = rng.choice(["parentheses", "parentheses", "not", "not", "and", "or", "functions", "operators", "in",
                       "tree", "bytes"])
    atom = builder.atom()
    if kind == "parentheses":
        n = MAX_PARENTHESES + rng.randint(-3, 3)
        return "(" * n + atom + ")" * n
    if kind == "not":
        return "NOT " * (MAX_NESTING + rng.randint(-4, 4)) + atom
    if kind in ("and", "or"):
        terms = [builder.atom() for _ in range(MAX_BOOLEAN_TERMS + rng.randint(-3, 3))]
        return "(" + f" {kind.upper()} ".join(terms) + ")"
    if kind == "functions":
        n = MAX_PARENTHESES + rng.randint(-3, 3)
        return "abs(" * n + "i4" + ")" * n + " > 0"
    if kind == "operators":
        return f"{atom} -- " + "=" * (MAX_OPERATOR_RUN + rng.randint(-2, 2)) + "\n"
    if kind == "in":
        return f"i4 IN ({', '.join(str(k % 101) for k in range(rng.choice([2999, 3000, 3001])))})"
    if kind == "tree":  # past MAX_TREE_BYTES, below max_statement_bytes; just within it in larger runs
        # (analysing an IN list just within takes seconds: as long as the rest of the default run)
        count = 2 * _TREE_IN_LIST if SCALE <= 1 or rng.random() < 0.5 else _TREE_IN_LIST * 9 // 10
        return f"i2 IN ({','.join(str(k % 7) for k in range(count))})"
    # a literal that takes the statement just below or above max_statement_bytes
    return "t = '" + "x" * (_MAX_STATEMENT_BYTES + rng.choice([-600, 600])) + "'"


def _masked_numbers(outcome: Outcome) -> Outcome:
    """A refusal of a statement's size names its bytes, which the table's name adds to."""
    if outcome.kind != "error":
        return outcome
    sqlstate, *texts = outcome.detail
    return Outcome(outcome.kind, (sqlstate, *(re.sub(r"\d+", "#", str(text)) for text in texts)))


def test_a_statement_near_or_past_a_limit_is_decided_by_its_text(paths_proxy: RunningProxy) -> None:
    client = Client(paths_proxy)

    def draw(rng: random.Random) -> tuple[Case, Case]:
        case = _drawn_case(rng, lambda case: not case.prepared)
        stressor = _stressor(rng, _Builder(rng))
        if " WHERE " in case.sql:
            case = replace(case, sql=case.sql.replace(" WHERE ", f" WHERE {stressor} AND ", 1))
        else:
            case = Case(f"SELECT COUNT(*) FROM {{table}} WHERE {stressor}", (), timezone=case.timezone)
        return case, case

    failures: list[str] = []
    refused = cases = 0
    for index, case, neighbour, runs in _on_neighbours(
            client, 19, 40, draw, lambda case, table: _charged(client, lambda: _masked_numbers(client.run(case, table)))):
        cases += 1
        limited = [outcome.kind == "error" and outcome.detail[0] in ("54000", "54001")
                   for outcome, _ in runs]  # type: ignore[misc]
        refused += limited[0]
        charged = any(limit and charge for limit, (_, charge) in zip(limited, runs))  # type: ignore[misc]
        if runs[0] != runs[1] or _any_broken(runs) or charged:
            failures.append(_failure(index, replace(case, sql=case.sql[:300] + " ..."), neighbour, *runs))
    assert not failures, _report("statements near a limit", failures, cases)
    assert refused >= cases // 5, f"too few statements refused by a limit: {refused} of {cases}"


# ------------------------------------------------------------------ catalog statements (passthrough)

# How a statement names the protected relation.
_RELATION = ("'{table}'::regclass", "'public.{table}'::regclass", "to_regclass('{table}')",
             "'\"{table}\"'::regclass", "(SELECT oid FROM pg_catalog.pg_class WHERE relname = '{table}')",
             "'{table}'::regclass::oid", "'{table}'::pg_catalog.regclass")
_PG_CLASS_COLUMNS = ("relname", "relkind", "relpages", "reltuples", "relallvisible", "relhasindex", "relnatts",
                     "relchecks", "relpersistence", "reltoastrelid", "relfrozenxid", "reloptions", "relacl",
                     "oid", "reltype", "relfilenode", "relhasrules", "relispartition", "relam", "c.*", "c",
                     "row_to_json(c)", "to_jsonb(c)->>'reltuples'", "c.xmin")
_CATALOG = (
    # psql's \d (PostgreSQL 16), on the table's OID
    "SELECT c.relchecks, c.relkind, c.relhasindex, c.relhasrules, c.relhastriggers, c.relrowsecurity, "
    "c.relforcerowsecurity, false AS relhasoids, c.relispartition, '', c.reltablespace, CASE WHEN c.reloftype = 0 "
    "THEN '' ELSE c.reloftype::pg_catalog.regtype::pg_catalog.text END, c.relpersistence, c.relreplident, am.amname "
    "FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_class tc ON (c.reltoastrelid = tc.oid) "
    "LEFT JOIN pg_catalog.pg_am am ON (c.relam = am.oid) WHERE c.oid = {rel}",
    "SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), (SELECT pg_catalog.pg_get_expr(d.adbin, "
    "d.adrelid, true) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND "
    "a.atthasdef), a.attnotnull, a.attidentity, a.attgenerated, a.attstorage, "
    "CASE WHEN a.attstattarget=-1 THEN NULL ELSE a.attstattarget END AS attstattarget "
    "FROM pg_catalog.pg_attribute a WHERE a.attrelid = {rel} AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
    "SELECT c.oid, n.nspname, c.relname FROM pg_catalog.pg_class c LEFT JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE c.relname OPERATOR(pg_catalog.~) '^({table})$' COLLATE pg_catalog.default "
    "AND pg_catalog.pg_table_is_visible(c.oid) ORDER BY 2, 3",
    # psql's \dt+ and \d+ : sizes and statistics
    "SELECT n.nspname, c.relname, pg_catalog.pg_size_pretty(pg_catalog.pg_table_size(c.oid)) AS size, "
    "pg_catalog.obj_description(c.oid, 'pg_class') FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
    "ON n.oid = c.relnamespace WHERE c.oid = {rel}",
    "SELECT * FROM pg_attribute WHERE attrelid = {rel} ORDER BY attnum",
    "SELECT attname, pg_catalog.format_type(atttypid, atttypmod), attlen, attndims, attbyval, attalign "
    "FROM pg_attribute WHERE attrelid = {rel} AND attnum > 0 ORDER BY attnum",
    "SELECT to_regclass('{table}') IS NOT NULL, to_regclass('public.{table}')::text, {rel}::text",
    "SELECT pg_catalog.format_type(a.atttypid, a.atttypmod), t.typname, t.typlen FROM pg_attribute a "
    "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = {rel} ORDER BY a.attnum",
    "SELECT t.* FROM pg_type t WHERE t.typrelid = {rel}",
    "SELECT pg_relation_size({rel}), pg_total_relation_size({rel}), pg_table_size({rel}), pg_indexes_size({rel})",
    "SELECT pg_stat_get_live_tuples({rel}), pg_stat_get_tuples_inserted({rel}), pg_stat_get_numscans({rel})",
    "SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, seq_scan, last_analyze IS NULL FROM pg_stat_user_tables "
    "WHERE relid = {rel}",
    "SELECT * FROM pg_stat_all_tables WHERE relname = '{table}'",
    "SELECT * FROM pg_statio_user_tables WHERE relid = {rel}",
    "SELECT attname, null_frac, avg_width, n_distinct, most_common_vals::text, histogram_bounds::text "
    "FROM pg_stats WHERE tablename = '{table}' ORDER BY attname",
    "SELECT * FROM pg_statistic WHERE starelid = {rel}",
    "SELECT s.* FROM pg_stats s JOIN pg_class c ON c.relname = s.tablename WHERE c.oid = {rel}",
    "SELECT pg_catalog.col_description({rel}, 1), has_table_privilege({rel}, 'SELECT'), "
    "has_column_privilege({rel}, 'i4', 'SELECT')",
    "SELECT pg_catalog.pg_get_indexdef(i.indexrelid) FROM pg_index i WHERE i.indrelid = {rel}",
    "SELECT c.reltuples::bigint, s.n_live_tup FROM pg_class c LEFT JOIN pg_stat_all_tables s ON s.relid = c.oid "
    "WHERE c.oid = {rel}",
    "SELECT (SELECT reltuples FROM pg_class WHERE oid = {rel}) > 3",
    "SELECT count(*) FROM pg_class WHERE oid = {rel} AND reltuples > 3",
    "SELECT pg_relation_filepath({rel}), pg_relation_filenode({rel})",
    "EXPLAIN SELECT COUNT(*) FROM {table}",
    "EXPLAIN (FORMAT JSON) SELECT * FROM {table} WHERE i4 > 0",
    "SELECT pg_catalog.pg_get_viewdef({rel})",
    "SELECT c.relname, t.relname AS toast FROM pg_class c JOIN pg_class t ON t.oid = c.reltoastrelid WHERE c.oid = {rel}",
    "SELECT stxname FROM pg_statistic_ext WHERE stxrelid = {rel}",
    "TABLE {table}",
)


def _catalog_statement(rng: random.Random) -> str:
    """A catalog statement naming the table (``{table}``) one of the ways a client does."""
    if rng.random() < 0.3:
        columns = ", ".join(rng.sample(_PG_CLASS_COLUMNS, rng.randint(1, 4)))
        sql = f"SELECT {columns} FROM pg_catalog.pg_class c WHERE c.oid = {{rel}}"
    else:
        sql = rng.choice(_CATALOG)
    return sql.replace("{rel}", rng.choice(_RELATION))


class _CatalogMask:
    """What differs between two tables' catalog answers by construction, not by their rows: the
    table's name, and the numbers the catalog gives it when it is created (its OID, relfilenode,
    row and array type OIDs, its TOAST table's and index's, the creating transaction's xid in
    xmin and relfrozenxid). Only numbers that differ between the two tables are masked, as whole
    digit runs; a row count, a size or a statistic that differed would stay unmasked."""

    _QUERY = """
        SELECT c.oid, c.relfilenode, c.reltype, t.typarray, c.reltoastrelid, c.xmin::text::bigint,
               c.relfrozenxid::text::bigint, t.xmin::text::bigint, tc.relfilenode, tc.reltype, ti.indexrelid
        FROM pg_class c JOIN pg_type t ON t.oid = c.reltype
        LEFT JOIN pg_class tc ON tc.oid = c.reltoastrelid LEFT JOIN pg_index ti ON ti.indrelid = c.reltoastrelid
        WHERE c.oid = %s::regclass"""

    def __init__(self, admin: psycopg.Connection, tables: tuple[str, str]):
        first, second = (admin.execute(self._QUERY, (table,)).fetchone() or () for table in tables)
        self.tables = tables
        # One mask for both sides: a number is masked wherever it is either table's own, so a
        # constant that happens to equal one neighbour's transaction id (timestamp's type OID
        # 1114 as that table's xmin) is masked on both sides, not on one.
        self.masks = {str(value): f"<{k}>" for k, pair in enumerate(zip(first, second)) if pair[0] != pair[1]
                      for value in pair}

    def __call__(self, which: int, text: str) -> str:
        table, masks = self.tables[which], self.masks
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(table)}(?![A-Za-z0-9_])", "T", text)
        return re.sub(r"\d+", lambda m: masks.get(m.group(0), m.group(0)), text)


def _catalog_answer(wire: Wire, sql: str, mask: Callable[[str], str]) -> tuple[object, ...]:
    """Every message of ``sql``'s answer in the simple protocol, its text masked; a row
    description's table OIDs masked (each neighbour is a table of its own)."""
    wire.send(message(b"Q", cstr(sql)))
    answer: list[object] = []
    for kind, body in wire.read_until(b"Z"):
        if kind == b"D":
            answer.append((kind, tuple(None if v is None else mask(v.decode()) for v in data_row_values(body))))
        elif kind == b"T":
            (count,), pos, fields = struct.unpack_from("!h", body), 2, []
            for _ in range(count):
                end = body.index(b"\0", pos)
                table_oid, *rest = struct.unpack_from("!IhIhih", body, end + 1)
                fields.append((mask(body[pos:end].decode()), mask(str(table_oid)), *rest))
                pos = end + 1 + 18
            answer.append((kind, tuple(fields)))
        elif kind in (b"E", b"N"):
            fields = error_fields(body)
            answer.append((kind, *(mask((fields.get(f) or b"").decode()) for f in (b"S", b"C", b"M", b"D", b"H"))))
        else:
            answer.append((kind, mask(body.decode(errors="replace"))))
    return tuple(answer)


def test_a_catalog_statement_naming_the_protected_table_answers_the_same_on_every_neighbour(
    paths_proxy: RunningProxy, test_db: TestDatabase,
) -> None:
    rng = random.Random(SEED * 7919 + 23)
    failures: list[str] = []
    answered = cases = 0
    wire = Wire(paths_proxy.host, paths_proxy.port, database=TEST_DATABASE)
    try:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            for index in range(_cases(120)):
                sql = _catalog_statement(rng)
                base = rng.choice(list(BASES))
                tables = (f"nbf_{base}", f"nbf_{base}_{rng.randrange(NEIGHBOURS)}")
                mask = _CatalogMask(admin, tables)
                runs = [_catalog_answer(wire, sql.replace("{table}", table), lambda text, w=which: mask(w, text))
                        for which, table in enumerate(tables)]
                cases += 1
                answered += not any(kind == b"E" for kind, *_ in runs[0])  # type: ignore[misc]
                broken = any(kind == b"E" and fields[1] == "XX000" for run in runs for kind, *fields in run)  # type: ignore[misc]
                if runs[0] != runs[1] or broken:
                    failures.append(_failure(index, Case(sql, ()), tables[1], *runs))
    finally:
        wire.close()
    assert not failures, _report("catalog statements", failures, cases)
    assert answered >= cases // 3, f"too few catalog statements answered: {answered} of {cases}"
