"""Stop 41: the lock step's SQL against what the run plans, and the planner's statistics.

The DP statements run on a base table and on neighbours that each add one adversarial row (a
numeric of 1e400 and of 1e-400, NaN, ±Infinity, dates and timestamps at infinity and at their
types' limits, integers at their limits, a text of 300 bytes and one of multibyte characters,
NULLs); what the analyst sees but the noised values must be the same on all, and a refusal
costs nothing. Real dpproxy, real PostgreSQL. The tables are analysed, so the planner's
statistics (the histogram's bounds, the most common values) hold the adversarial row.

Found and fixed, pinned here:

* A constant PostgreSQL's planner folds and fails on (``CAST(5000000000 AS int)``, ``CAST(1e400
  AS float8)``, ``CAST(40000 AS int2)``) inside an IN list, an OR or a BETWEEN of a FILTER
  (``count(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int)))``) passed the lock step and failed
  the run after the charge, with DP004, on every table: charged for a statement that fails
  whatever the rows. dpproxy's own folding takes a FILTER's computed values, not such a literal
  cast beside others; in WHERE the lock step's planning raised it before the charge, but the step
  (``SELECT 1 FROM (<backend SQL>) AS locked LIMIT 0``) left the backend SQL's output columns,
  where a FILTER stands, unreferenced, and PostgreSQL replaces an unreferenced output of a
  subquery with a NULL before planning it, so the FILTER was never folded. The step selects the
  whole row now (``SELECT locked FROM …``), which plans every output column.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

_DDL = "(id int, i int, b bigint, f float8, n numeric, d date, ts timestamptz, t text)"
_BASE_ROWS = ("SELECT g, g % 10, g, g, g % 100, '2020-01-01'::date + g, '2020-01-01'::timestamptz + g * interval '1 hour', "
              "'v' || (g % 7) FROM generate_series(1, 500) g")
# One adversarial row each (columns as _DDL).
_ROWS = {
    "1": "(1001, 2147483647, 9223372036854775807, 1e308, CAST('1e400' AS numeric), '5874897-12-31', "
         "'294276-12-31 23:59:59+00', repeat('x', 300))",
    "2": "(1002, -2147483648, -9223372036854775808, 'NaN', CAST('1e-400' AS numeric), '4713-01-01 BC', "
         "'4713-01-01 00:00+00 BC', repeat('é', 200))",
    "3": "(1003, 0, 0, 'Infinity', 'NaN', 'infinity', '-infinity', '')",
    "4": "(1004, 0, 0, '-Infinity', '-Infinity', '-infinity', 'infinity', 'v1' || repeat(' ', 250))",
    "5": "(1005, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
}
_TABLE = """
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      i: {{bounds: [0, 100]}}
      n: {{bounds: [0, 100]}}
      f: {{bounds: [0, 100]}}
"""
# Each set: a base table and its neighbours; "q" has an answer quantum, under which text equality
# and a numeric's comparisons read the raw column (rewriter/raw_equality.py), whose statistics the
# planner reads.
_SETS = {"s41": "", "s41q": "    answer_quantum_ms: 20\n"}
_NAMES = {prefix: (f"{prefix}_0", *(f"{prefix}_{k}" for k in _ROWS)) for prefix in _SETS}
_POLICY = ATTACK_POLICY_HEAD + "".join(
    f"  public.{name}:" + _TABLE + quantum for prefix, quantum in _SETS.items() for name in _NAMES[prefix])


@pytest.fixture(scope="module")
def stop41_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    for prefix in _SETS:
        create_neighbours(test_db.admin_dsn, f"{prefix}_0", {f"{prefix}_{k}": row for k, row in _ROWS.items()},
                          _DDL, _BASE_ROWS)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for names in _NAMES.values():
            for name in names:
                admin.execute(f"ANALYZE {name}")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _outcome(proxy: RunningProxy, sql: str, prefix: str = "s41") -> tuple[object, ...]:
    """``sql``'s masked outcome, the same on every table of the set ``prefix``, an error charged nothing."""
    with proxy.connect() as conn:
        return same_on_neighbours(conn, sql, _NAMES[prefix], spent_epsilon)


@pytest.mark.parametrize("statement", [
    "SELECT count(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int))) FROM {t}",
    "SELECT count(*) FILTER (WHERE i > 10 OR i > CAST(5000000000 AS int)) FROM {t}",
    "SELECT count(*) FILTER (WHERE i BETWEEN 1 AND CAST(5000000000 AS int)) FROM {t}",
    "SELECT count(*) FILTER (WHERE f IN (1, CAST(1e400 AS float8))) FROM {t}",
    "SELECT sum(i) FILTER (WHERE i IN (1, CAST(40000 AS int2))), count(*) FROM {t}",
    "SELECT count(*), avg(n) FILTER (WHERE b IN (1, CAST(1e20 AS bigint))) FROM {t} WHERE i > 3",
])
@pytest.mark.parametrize("prefix", list(_SETS))
def test_a_constant_the_planner_fails_to_fold_in_a_filter_fails_before_the_charge(
        stop41_proxy: RunningProxy, statement: str, prefix: str) -> None:
    """The planner's folding fails whatever the rows: before the charge, on every table."""
    outcome = _outcome(stop41_proxy, statement, prefix)
    assert outcome[:2] == ("error", "22003"), outcome
