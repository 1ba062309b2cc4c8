"""The round-trip check of GROUP BY keys (tests/round_trip_keys.py): every row of ``gk`` that dpproxy
counts lands in the cell of the key PostgreSQL gives it, and every grouped statement's answer, with
its HAVING, ORDER BY, LIMIT and the derived tables and CTEs BI tools wrap it in, is PostgreSQL's
with the noise off.

``DPPROXY_FUZZ_SEED`` picks the seed (printed on failure) and ``DPPROXY_KEY_CASES`` the number of
statements of each shape; the default run is sized for the suite and checks each statement under
two session profiles, a larger one is run by hand (with ``-s`` to see its sizes;
``DPPROXY_KEY_ALL_PROFILES=1``: under every profile).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlglot import exp

import rewriter.classify
import rewriter.flatten
import rewriter.rewrite
from policies.tables import ColumnInfo
from rewriter.group_keys import GroupKey
from rewriter.text_bounds import column_sql

from tests.conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry
from tests.key_data import KEY_POLICY, create_key_table
from tests.key_generator import KeyCase, answer_statements, cell_statements, part_statements
from tests.round_trip import RoundTrip
from tests.round_trip_keys import KeyRoundTrip

SEED = int(os.environ.get("DPPROXY_FUZZ_SEED", "134"))
CASES = int(os.environ.get("DPPROXY_KEY_CASES", "300"))


@pytest.fixture(scope="module")
def key_trip(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KeyRoundTrip]:
    """``gk`` filled with its edge rows, protected by a policy that opts each column in as a key."""
    create_key_table(test_db)
    ledger: Path = tmp_path_factory.mktemp("key-ledger") / "ledger.sqlite3"
    policy = make_policy(test_db, ledger, TEST_POLICY + KEY_POLICY.replace("{", "{{").replace("}", "}}"))
    trip = RoundTrip(policy_registry(policy), test_db.admin_dsn)
    checker = KeyRoundTrip(trip, test_db.admin_dsn, all_profiles=bool(os.environ.get("DPPROXY_KEY_ALL_PROFILES")))
    yield checker
    checker.close()
    trip.close()


def test_every_row_lands_in_the_cell_of_the_key_postgresql_gives_it(key_trip: KeyRoundTrip) -> None:
    checked = key_trip.cells(cell_statements(random.Random(SEED), CASES))
    print(f"DPPROXY_FUZZ_SEED={SEED}: {checked.generated} generated, {checked.planned} planned {checked.kinds}, "
          f"{checked.compared} compared, {checked.rows} rows, {checked.dropped} dropped, {checked.failing} failing, "
          f"{checked.claimed} refused as PostgreSQL's error, {len(checked.mismatches)} mismatches")
    print("\n".join(checked.uncharged[:30]))
    assert not checked.mismatches, f"DPPROXY_FUZZ_SEED={SEED}\n" + "\n".join(map(str, checked.mismatches[:40]))


def test_every_grouped_answer_is_postgresqls_with_the_noise_off(key_trip: KeyRoundTrip) -> None:
    checked = key_trip.answers(answer_statements(random.Random(SEED), CASES))
    print(f"DPPROXY_FUZZ_SEED={SEED}: {checked.generated} generated, {checked.planned} planned {checked.kinds}, "
          f"{checked.compared} compared, {checked.claimed} refused as PostgreSQL's error, {len(checked.mismatches)} mismatches")
    print("\n".join(checked.uncharged[:30]))
    assert not checked.mismatches, f"DPPROXY_FUZZ_SEED={SEED}\n" + "\n".join(map(str, checked.mismatches[:40]))


def test_every_cells_aggregates_are_postgresqls_over_its_rows(key_trip: KeyRoundTrip) -> None:
    checked = key_trip.parts(part_statements(random.Random(SEED), CASES // 3))
    print(f"DPPROXY_FUZZ_SEED={SEED}: {checked.generated} generated, {checked.planned} planned {checked.kinds}, "
          f"{checked.compared} compared, {checked.rows} cells, {len(checked.mismatches)} mismatches")
    assert not checked.mismatches, f"DPPROXY_FUZZ_SEED={SEED}\n" + "\n".join(map(str, checked.mismatches[:40]))


def _raw_integer_groups(original: Callable[[GroupKey], str]) -> Callable[[GroupKey], str]:
    """``GroupKey.group_sql`` as it was before an integer key grouped by its cell: by the raw value."""
    return lambda key: key.row_sql() if key.kind == "integer" else original(key)


def _null_clamped_to_lo(column: ColumnInfo, value: str | None = None) -> str:
    """``rewrite.clamped`` before a NULL stayed NULL: ``LEAST(GREATEST(x, lo), hi)``, which makes it lo."""
    assert column.policy is not None and column.policy.bounds is not None
    lo, hi = column.policy.bounds
    return f"LEAST(GREATEST({column_sql(column) if value is None else value}, {lo:g}), {hi:g})"


def _order_left(column: exp.Column, outputs: set[str], names: dict[str, exp.Expression]) -> bool:
    """``flatten._output_name`` before a qualified ORDER BY name (Metabase's ``"source"."k1"``) was
    mapped to the wrapper's column: every ORDER BY name left as it is."""
    return column.find_ancestor(exp.Order) is not None


@pytest.fixture
def fresh_plans() -> Iterator[None]:
    """Plans are cached by statement: planned afresh under a patch, and dropped after."""
    rewriter.classify._classify.cache_clear()
    yield
    rewriter.classify._classify.cache_clear()


@pytest.mark.parametrize(("check", "target", "name", "off"), [
    # a category released as declared, not as PostgreSQL prints it (char(4)'s 'ab' for 'ab  ', a boolean's 'true')
    ("cells", ColumnInfo, "labels", lambda column: (*column.policy.categories,
                                                    *((column.policy.other,) if column.policy.other else ()))),
    # an integer key grouped by the raw value: -1 read as the last cell (Python's index -1), 21 past the last
    ("cells", GroupKey, "group_sql", _raw_integer_groups(GroupKey.group_sql)),
    # ORDER BY "source"."k1" left unmapped (before it was read as the wrapper's column): 42803 where PostgreSQL answers
    ("answers", rewriter.flatten, "_output_name", _order_left),
    # a NULL clamped to the lower bound: a cell's SUM and AVG total moved by lo for each NULL row (big's -5)
    ("parts", rewriter.rewrite, "clamped", _null_clamped_to_lo),
])
def test_the_key_check_reports_a_known_mistake_when_its_fix_is_switched_off(
        key_trip: KeyRoundTrip, monkeypatch: pytest.MonkeyPatch, fresh_plans: None, check: str, target: object,
        name: str, off: object) -> None:
    monkeypatch.setattr(target, name, off)
    cases = {"cells": cell_statements, "answers": answer_statements, "parts": part_statements}[check]
    checked = getattr(key_trip, check)(cases(random.Random(SEED), 2 * CASES), first=True)
    assert checked.mismatches, (name, checked)


def test_the_parts_check_reports_count_distinct_counted_once_a_raw_value_in_other(
        key_trip: KeyRoundTrip, monkeypatch: pytest.MonkeyPatch, fresh_plans: None) -> None:
    """Before each cell was one backend group (tests/test_count_distinct_other.py), a category key
    grouped the rows by their raw value and each group's cell was added up: a value held by two
    undeclared categories was counted twice in ``other``'s COUNT(DISTINCT), on the CASE path and the
    hashed one alike. Switched back on, the parts check reports it."""
    original = GroupKey.group_sql
    monkeypatch.setattr(GroupKey, "group_sql", lambda key: key.row_sql() if key.kind == "category" else original(key))
    monkeypatch.setattr(GroupKey, "_hashed_category", property(lambda key: True))
    for column in ("t", "ho"):  # fewer than nine categories (a CASE a row), and nine or more (hashed)
        cases = [KeyCase(f"SELECT {column} AS k1, count(DISTINCT i) FROM gk GROUP BY 1", (column,), ("category",))]
        checked = key_trip.parts(cases, first=True)
        assert checked.mismatches, (column, checked)
