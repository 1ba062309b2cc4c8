"""The round-trip check of GROUP BY keys (tests/round_trip_keys.py): every row of ``gk`` that dpproxy
counts lands in the cell of the key PostgreSQL gives it, and every grouped statement's answer, with
its HAVING, ORDER BY, LIMIT and the derived tables and CTEs BI tools wrap it in, is PostgreSQL's
with the noise off.

``DPPROXY_FUZZ_SEED`` picks the seed (printed on failure) and ``DPPROXY_KEY_CASES`` the number of
statements of each shape; the default run is sized for the suite, a larger one is run by hand (with
``-s`` to see its sizes).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry
from tests.key_data import KEY_POLICY, KEY_TABLE_DDL, key_rows_sql
from tests.key_generator import answer_statements, cell_statements
from tests.round_trip import RoundTrip
from tests.round_trip_keys import KeyRoundTrip

SEED = int(os.environ.get("DPPROXY_FUZZ_SEED", "134"))
CASES = int(os.environ.get("DPPROXY_KEY_CASES", "300"))


@pytest.fixture(scope="module")
def key_trip(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyRoundTrip]:
    """``gk`` filled with its edge rows, protected by a policy that opts each column in as a key."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS gk")
        conn.execute(f"CREATE TABLE gk ({KEY_TABLE_DDL})")
        conn.execute(key_rows_sql())
        conn.execute("GRANT SELECT ON gk TO dpproxy_service")
    ledger: Path = tmp_path_factory.mktemp("key-ledger") / "ledger.sqlite3"
    policy = make_policy(test_db, ledger, TEST_POLICY + KEY_POLICY.replace("{", "{{").replace("}", "}}"))
    trip = RoundTrip(policy_registry(policy), test_db.admin_dsn)
    checker = KeyRoundTrip(trip, test_db.admin_dsn)
    yield checker
    checker.close()
    trip.close()


def test_every_row_lands_in_the_cell_of_the_key_postgresql_gives_it(key_trip: KeyRoundTrip) -> None:
    checked = key_trip.cells(cell_statements(random.Random(SEED), CASES))
    print(f"DPPROXY_FUZZ_SEED={SEED}: {checked.generated} generated, {checked.planned} planned {checked.kinds}, "
          f"{checked.compared} compared, {checked.rows} rows, {checked.dropped} dropped, {len(checked.mismatches)} mismatches")
    assert not checked.mismatches, f"DPPROXY_FUZZ_SEED={SEED}\n" + "\n".join(map(str, checked.mismatches[:40]))


def test_every_grouped_answer_is_postgresqls_with_the_noise_off(key_trip: KeyRoundTrip) -> None:
    checked = key_trip.answers(answer_statements(random.Random(SEED), CASES))
    print(f"DPPROXY_FUZZ_SEED={SEED}: {checked.generated} generated, {checked.planned} planned {checked.kinds}, "
          f"{checked.compared} compared, {len(checked.mismatches)} mismatches")
    assert not checked.mismatches, f"DPPROXY_FUZZ_SEED={SEED}\n" + "\n".join(map(str, checked.mismatches[:40]))
