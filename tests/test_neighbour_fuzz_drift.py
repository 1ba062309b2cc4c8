"""The neighbour fuzzer on tables altered after dpproxy loaded its policy (schema drift).

The periodic re-check (proxy.serving.server, proxy.backend.column_facts) finds a protected
table's columns changed: where the policy in force still fits, the new definition is in force at
once; where it does not, the table's statements are refused before the charge (``55000``, rule
``schema-changed``) until it is back as loaded. Neither may depend on the rows: here a family of
the fuzzer's tables (the base table and every neighbour alike) is altered one way at a time,
dpproxy's registry is waited for (a condition on it, not a time), and generated statements run
on the base table and on a neighbour must have the same outcome (a refusal's message, DETAIL and
HINT whole but for the table's name) and the same charge, none for a refusal; then the change is
undone and the registry waited for again.

``DPPROXY_FUZZ_DRIFT_CASES`` sets the statements per change (default 12, ~20 s in all),
``DPPROXY_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

import psycopg
import pytest

from policies.tables import TableRegistry
from tests.conftest import RunningProxy, TestDatabase, make_policy
from tests.test_neighbour_fuzz import NEIGHBOURS, SEED, Client, _policy_text, create_tables
from tests.test_neighbour_fuzz_paths import _any_broken, _charged, _drawn_case, _failure, _report

CASES = int(os.environ.get("DPPROXY_FUZZ_DRIFT_CASES", "12"))
FAMILY = "base"
TABLES = [f"nbf_{FAMILY}"] + [f"nbf_{FAMILY}_{k}" for k in range(NEIGHBOURS)]
BOUND_S = 60.0
# Each change (ALTER TABLE's action) and what undoes it; the first leaves the policy fitting (the
# new definition is in force), the others do not (bounds on a text column: refused before the charge).
CHANGES = (
    # Through text: float8's own cast to numeric keeps 15 digits, so the largest double comes back
    # as a number above it and the undo fails (with DPPROXY_FUZZ_SEED=31337); its text form is exact.
    ("ALTER COLUMN f8 TYPE numeric USING f8::text::numeric", "ALTER COLUMN f8 TYPE float8"),
    ("ALTER COLUMN i4 TYPE text", "ALTER COLUMN i4 TYPE int4 USING i4::int4"),
    ("ALTER COLUMN n TYPE text", "ALTER COLUMN n TYPE numeric USING n::numeric"),
)


@pytest.fixture(scope="module")
def drift_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The fuzzer's tables behind a dpproxy that protects one family of them (fewer to resolve at
    each look) and looks at the backend's definitions every 0.2 s."""
    create_tables(test_db)
    text = "".join(line for line in _policy_text().splitlines(keepends=True)
                   if "public.nbf_" not in line or f"public.nbf_{FAMILY}" in line)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("proxy.serving.server.FUNCTION_NAMES_REFRESH_S", 0.2)
        running = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("drift-ledger") / "ledger.sqlite3", text))
        try:
            yield running
        finally:
            running.stop()


def _oids(admin: psycopg.Connection) -> list[int]:
    return [int(admin.execute("SELECT %s::regclass::oid", (table,)).fetchone()[0]) for table in TABLES]  # type: ignore[index]


def _wait_for(proxy: RunningProxy, seen: Callable[[TableRegistry], bool], what: str) -> None:
    """Until ``seen`` holds of the registry in force (the re-check runs every 0.2 s)."""
    deadline = time.monotonic() + BOUND_S
    while not seen(proxy.server.registry):
        assert time.monotonic() < deadline, f"dpproxy did not take in {what} within {BOUND_S} s"
        time.sleep(0.05)


def test_a_table_altered_since_the_policy_was_loaded_answers_or_refuses_alike_on_every_neighbour(
    drift_proxy: RunningProxy, test_db: TestDatabase,
) -> None:
    client = Client(drift_proxy)
    rng = random.Random(SEED * 7919 + 41)
    failures: list[str] = []
    refused = cases = 0
    drawn: set[tuple[str, str]] = set()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        oids = _oids(admin)
        loaded = {oid: drift_proxy.server.registry.definitions[oid] for oid in oids}
        try:
            for change, undo in CHANGES:
                with admin.transaction():
                    for table in TABLES:
                        admin.execute(f"ALTER TABLE {table} {change}")
                _wait_for(drift_proxy, lambda registry: all(
                    oid in registry.redefined or registry.definitions.get(oid) != loaded[oid] for oid in oids), change)
                for _ in range(CASES):
                    case = _drawn_case(rng)
                    neighbour = f"nbf_{FAMILY}_{rng.randrange(NEIGHBOURS)}"
                    identity = {(case.sql, repr(case.params))}
                    if identity & drawn:  # asked before (under another definition): a fresh ε
                        client.epsilon = f"0.{800000 + len(drawn)}"
                    drawn |= identity
                    runs = [_charged(client, lambda table=table: client.run(case, table))
                            for table in (f"nbf_{FAMILY}", neighbour)]
                    cases += 1
                    (outcome, _), _ = runs
                    redefined = outcome.kind == "error" and "(rule: schema-changed)" in str(outcome.detail[1])
                    refused += redefined
                    charged = any(o.kind == "error" and o.detail[0] == "55000" and c for o, c in runs)  # type: ignore[attr-defined]
                    if runs[0] != runs[1] or _any_broken(runs) or charged:
                        failures.append(_failure(cases, replace(case, sql=f"[{change}] {case.sql}"), neighbour, *runs))
                with admin.transaction():
                    for table in TABLES:
                        admin.execute(f"ALTER TABLE {table} {undo}")
                _wait_for(drift_proxy, lambda registry: all(
                    oid not in registry.redefined and registry.definitions.get(oid) == loaded[oid] for oid in oids),
                    f"the undoing of {change}")
        finally:
            client.conn.close()
    assert not failures, _report("statements on altered tables", failures, cases)
    assert refused >= cases // 5, f"too few statements refused as schema-changed: {refused} of {cases}"

