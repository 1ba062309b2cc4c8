"""dpproxy's own backend SQL on another major version and build: Debian's PostgreSQL 15 (tests/pg15.py).

pgserver's PostgreSQL 16 is built without LLVM; Debian's (as PGDG's and the postgres Docker
images) has JIT on by default. Found there: LLVM's compile of a long expression cannot be
interrupted, so a DP query with a 6,000-value IN list (its rendering is one OR term per value)
held its backend connection for 150 s under a 2 s ``statement_timeout_ms``, 290 s for 8,000:
a few such statements took every pooled connection for minutes. Whether PostgreSQL compiles
at all follows the plan's cost, from the table's statistics. dpproxy's backend connections now
start with ``jit_above_cost`` -1, which clients cannot change (``SET jit = on`` is harmless).
"""

from __future__ import annotations

import time

import psycopg
import pytest

from tests.conftest import LONG_LIST_POLICY, TestDatabase, running_proxy


def test_a_long_in_list_is_never_jit_compiled_past_the_statement_timeout(
        pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    with psycopg.connect(pg15_db.admin_dsn) as admin:
        assert admin.execute("SELECT pg_jit_available()").fetchone() == (True,)  # what makes the test one
    # On a table with a quantum: elsewhere a DP statement may hold 256 values (rewriter/predicate_terms.py).
    policy = LONG_LIST_POLICY.replace("statement_timeout_ms: 20000", "statement_timeout_ms: 2000")
    with running_proxy(pg15_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
        conn.execute("SET jit = on")  # a client's (asyncpg sets it back and forth): harmless
        assert conn.execute("SHOW jit_above_cost").fetchone() == ("-1",)
        started = time.monotonic()
        answer = conn.execute("SELECT COUNT(*) FROM adult WHERE age IN (" + ", ".join(map(str, range(6000))) + ")")
        assert answer.fetchone() is not None
        assert time.monotonic() - started < 30  # without JIT well under a second; with it, 150 s
