"""Attacks on a session's state across the pool, cancels and disconnects, and what stops them.

With ``backend.pool.size: 1`` every session waits for, and runs on, the one backend connection.
Pinned here: a CancelRequest ends a statement that is waiting for a pooled connection (57014,
at once, as PostgreSQL ends a statement waiting for a lock), and a DP statement cancelled so
is not charged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, running_proxy, spent_epsilon

_ONE_SLOW_CHECKOUT = TEST_POLICY.replace(
    "  statement_timeout_ms: 20000\n",
    "  statement_timeout_ms: 20000\n  pool: {{size: 1, checkout_timeout_s: 20}}\n",
)


@pytest.fixture(scope="module")
def one(test_db, tmp_path_factory) -> Iterator[RunningProxy]:
    """One backend connection; a checkout waits up to 20 s for it."""
    with running_proxy(test_db, tmp_path_factory, _ONE_SLOW_CHECKOUT) as running:
        yield running


@pytest.mark.parametrize("sql", ["SELECT 1", "SELECT COUNT(*) FROM adult WHERE age > 50"])
def test_a_cancel_ends_a_statement_waiting_for_a_pooled_connection(one: RunningProxy, sql: str):
    with one.connect() as holder, one.connect() as waiting:
        spent = spent_epsilon(waiting)
        holder.execute("BEGIN")
        holder.execute("SELECT 1")  # holds the pool's one connection until COMMIT
        outcome: dict[str, Any] = {}

        def run() -> None:
            started = time.monotonic()
            try:
                waiting.execute(sql)
            except psycopg.Error as exc:
                outcome["error"] = exc
            outcome["took"] = time.monotonic() - started

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        time.sleep(0.5)  # waiting for the connection
        waiting.cancel_safe()
        worker.join(25)
        assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled), outcome
        assert outcome["took"] < 5, "the cancel was ignored until the checkout timed out"
        holder.execute("COMMIT")
        assert spent_epsilon(waiting) == pytest.approx(spent)  # nothing was computed, nothing charged
        assert waiting.execute("SELECT 2").fetchone() == (2,)  # the session goes on


def test_a_query_string_that_gets_no_connection_fails_and_the_session_goes_on(one: RunningProxy):
    # Its implicit BEGIN is where it first needs a connection: a 57014 (or 53300) there ended
    # the session with FATAL, where a single statement's is an ERROR.
    with one.connect() as holder, one.connect() as waiting:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                waiting.execute("SELECT 1; SELECT 2")
            except psycopg.Error as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        time.sleep(0.5)
        waiting.cancel_safe()
        worker.join(25)
        assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled), outcome
        holder.execute("COMMIT")
        assert waiting.execute("SELECT 3").fetchone() == (3,)
