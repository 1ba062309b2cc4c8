"""Comparisons, sorts and hashes through a collation's code are weighed at what they cost a byte.

Found: the work limit (rewriter/text_bounds.py) weighed every comparison at ``memcmp``'s cost, 1
unit a byte, and ``COUNT(DISTINCT)`` and a categorical key at what they cost under libc's ``C``
collations. Measured with benchmarks/collation_cost.py on PostgreSQL 15 (benchmarks/results.md,
"Comparisons, sorts and hashes under ICU collations"): ``<`` under ICU's ``und-x-icu`` costs 16.5
units a byte of a value that differs from the literal only in case (ICU compares level by level and
reads the whole value at the first), ``=`` under a nondeterministic collation 24, ``COUNT(DISTINCT)``
71–104 (weighed 50) and a categorical key under a nondeterministic collation 164–289 (weighed 50: its
hash is of the ICU sort key). So 46 ``u < '…'`` terms on such a column, weighed as 46 × 256 units,
took as long as 800 comparisons of bytes. A column now carries whether its collation orders by bytes
(``ColumnInfo.byte_order``, read from the catalog with the database's default resolved), and the
weights follow it (``comparison_work``, ``COLLATED_DISTINCT_WORK``, ``COLLATED_KEY_WORK``).
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from policies.errors import Refusal
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from rewriter.single_reads import COLLATED_DISTINCT_WORK, COLLATED_KEY_WORK, DISTINCT_WORK, KEY_WORK
from rewriter.text_bounds import COLLATED_COMPARISON_WORK, COLLATED_ORDERING_WORK, COMPARISON_WORK, MAX_TEXT_WORK
from tests.conftest import ATTACK_POLICY_HEAD, TestDatabase, make_policy, policy_registry

BOUND = 256
CATEGORIES = ("a", "b", "c")
_COLUMNS = (
    ColumnInfo("id", 23, -1, 1, None),
    ColumnInfo("b", 25, -1, 2, ColumnPolicy(categories=CATEGORIES, group_by=True)),  # C: by bytes
    ColumnInfo("u", 25, -1, 3, ColumnPolicy(categories=CATEGORIES, group_by=True), byte_order=False),  # und-x-icu
    ColumnInfo("ci", 25, -1, 4, ColumnPolicy(categories=CATEGORIES, group_by=True), deterministic_collation=False,
               byte_order=False),  # a nondeterministic ICU collation
)
# As many terms as the limit allows through a collation's code at the default bound: one more is refused.
_MOST = MAX_TEXT_WORK // (BOUND * COLLATED_COMPARISON_WORK)


def _relation(max_text_bytes: int = BOUND) -> Relation:
    policy = TablePolicy(epsilon=1.0, max_text_bytes=max_text_bytes)
    return Relation(1, "public", "cw", policy, {column.name: column for column in _COLUMNS}, "random")


def _terms(column: str, symbol: str, count: int) -> str:
    return f"SELECT count(*) FROM cw WHERE {' OR '.join(f'{column} {symbol} {chr(39)}x{i}{chr(39)}' for i in range(count))}"


def _refused(sql: str, relation: Relation) -> Refusal:
    with pytest.raises(Refusal) as refused:
        plan_aggregate_query(sql, relation)
    assert refused.value.sqlstate == "DP001" and refused.value.rule == "safe-predicate", refused.value
    return refused.value


@pytest.mark.parametrize("column, symbol, work", [
    ("u", "<", COLLATED_ORDERING_WORK), ("u", ">=", COLLATED_ORDERING_WORK), ("ci", "=", COLLATED_COMPARISON_WORK),
    ("ci", "<>", COLLATED_COMPARISON_WORK), ("ci", "<", COLLATED_ORDERING_WORK),
])
def test_a_comparison_through_a_collations_code_weighs_what_it_costs_a_byte(column: str, symbol: str, work: int) -> None:
    most = MAX_TEXT_WORK // (BOUND * work)
    assert plan_aggregate_query(_terms(column, symbol, most), _relation()).text_work == most * BOUND * work
    refusal = _refused(_terms(column, symbol, most + 1), _relation())
    assert f"work of {(most + 1) * BOUND * work:,} units" in refusal.message, refusal.message


@pytest.mark.parametrize("symbol", ["<", ">", "<=", ">="])
def test_an_ordering_comparison_under_a_libc_locale_is_weighed_at_strcolls_cost(symbol: str) -> None:
    """glibc's ``strcoll`` under ``en_US.UTF-8`` cost an ordering comparison 105–128 units a byte
    (benchmarks/profile.md, h144), above the 50 ICU's 16.5 had set: ten such terms on a 256-byte
    column took ~330,000 units but weighed 128,000, and 46 were answered. Now weighed 260 a byte,
    ``COLLATED_ORDERING_WORK``: nine are answered, ten refused before any charge."""
    assert COLLATED_ORDERING_WORK >= 2 * 128
    assert plan_aggregate_query(_terms("u", symbol, 9), _relation()).text_work == 9 * BOUND * COLLATED_ORDERING_WORK
    _refused(_terms("u", symbol, 10), _relation())


@pytest.mark.parametrize("column, symbol", [("b", "<"), ("b", "="), ("u", "="), ("u", "<>")])
def test_a_comparison_of_bytes_weighs_one_unit_a_byte(column: str, symbol: str) -> None:
    """``=`` and ``<>`` under a deterministic collation compare bytes whatever its provider, and
    every comparison under a collation ordering by bytes does."""
    assert plan_aggregate_query(_terms(column, symbol, _MOST + 1), _relation()).text_work == \
        (_MOST + 1) * BOUND * COMPARISON_WORK


def test_count_distinct_through_a_collations_code_is_weighed_at_its_sorts_cost() -> None:
    raised = 4_000
    assert plan_aggregate_query("SELECT count(DISTINCT b) FROM cw", _relation(raised)).text_work == raised * DISTINCT_WORK
    for column in ("ci",):
        assert plan_aggregate_query(f"SELECT count(DISTINCT {column}) FROM cw", _relation()).text_work == \
            BOUND * COLLATED_DISTINCT_WORK
        refusal = _refused(f"SELECT count(DISTINCT {column}) FROM cw", _relation(raised))
        assert f"COUNT(DISTINCT {column}) weighs {raised * COLLATED_DISTINCT_WORK:,}" in refusal.message, refusal.message


def test_a_key_under_a_nondeterministic_collation_is_weighed_at_its_sort_keys_hash() -> None:
    """Its hash is of the ICU sort key, and each comparison with a category goes through ICU and may
    read the whole value; under a deterministic ICU collation the hash and ``=`` read bytes."""
    raised = 1_000
    assert plan_aggregate_query("SELECT u, count(*) FROM cw GROUP BY u", _relation(raised)).text_work == \
        raised * KEY_WORK + len("".join(CATEGORIES)) * COMPARISON_WORK
    work = BOUND * COLLATED_KEY_WORK + len(CATEGORIES) * BOUND * COLLATED_COMPARISON_WORK
    assert plan_aggregate_query("SELECT ci, count(*) FROM cw GROUP BY ci", _relation()).text_work == work
    refusal = _refused("SELECT ci, count(*) FROM cw GROUP BY ci", _relation(raised))
    assert f"GROUP BY ci weighs {raised * COLLATED_KEY_WORK + 3 * raised * COLLATED_COMPARISON_WORK:,}" in \
        refusal.message, refusal.message
    assert plan_aggregate_query("SELECT mode() WITHIN GROUP (ORDER BY ci) FROM cw", _relation()).text_work == \
        len(CATEGORIES) * BOUND * COLLATED_COMPARISON_WORK


_POLICY = ATTACK_POLICY_HEAD + """\
  public.cw_rows:
    access: protected
    epsilon: 1.0
    columns:
      id: {{bounds: [0, 1000]}}
"""


@pytest.mark.pg15
def test_the_catalog_tells_which_collations_order_by_bytes(pg15_db: TestDatabase, tmp_path: Path) -> None:
    """PostgreSQL 15 with ICU, a database of libc's ``C.UTF-8``: its default, ``C`` and ``POSIX``
    order by bytes; ICU's collations, deterministic or not, do not."""
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute("CREATE COLLATION IF NOT EXISTS cw_ci (provider = icu, locale = 'und-u-ks-level2', "
                      "deterministic = false)")
        admin.execute('CREATE TABLE cw_rows (id integer, d text, c text COLLATE "C", p varchar(9) COLLATE "POSIX", '
                      'u text COLLATE "und-x-icu", ci text COLLATE cw_ci, n numeric)')
        admin.execute("GRANT SELECT ON cw_rows TO dpproxy_service")
        try:
            registry = policy_registry(make_policy(pg15_db, tmp_path / "ledger.sqlite3", _POLICY))
        finally:
            admin.execute("DROP TABLE cw_rows")
            admin.execute("DROP COLLATION cw_ci")
    (relation,) = registry.by_oid.values()
    assert {name: column.byte_order for name, column in relation.columns.items()} == \
        {"id": True, "d": True, "c": True, "p": True, "u": False, "ci": False, "n": True}


def test_count_distinct_under_a_deterministic_collation_counts_by_bytes() -> None:
    """Under a deterministic collation that does not order by bytes (ICU's ``und-x-icu``, a libc
    locale), values are equal exactly where their bytes are, so ``COUNT(DISTINCT)`` counts them
    under ``COLLATE "C"``, sorted by bytes, and is weighed as under ``C``. Before, its sort went
    through the collation's code: glibc's ``strcoll`` under ``en_US.UTF-8`` cost it 1,270–1,360
    units a byte (benchmarks/profile.md, h144), weighed 300. A nondeterministic collation keeps its
    own classes, and its weight."""
    raised = 4_000
    plan = plan_aggregate_query("SELECT count(DISTINCT u) FROM cw", _relation(raised))
    assert plan.text_work == raised * DISTINCT_WORK
    assert 'count(DISTINCT "u" COLLATE pg_catalog."C")' in backend_sql(plan, seed=0)
    nondeterministic = plan_aggregate_query("SELECT count(DISTINCT ci) FROM cw", _relation())
    assert "COLLATE" not in backend_sql(nondeterministic, seed=0)
