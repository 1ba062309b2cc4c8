"""Rule ``round-cast`` (rewriter.misreadings) against PostgreSQL's own function resolution.

PostgreSQL has ``round(numeric, integer)`` only, so ``round(x, n)`` of a double precision ``x`` fails
(42883) whatever the rows, where dpproxy's DP planner writes ``ROUND(CAST(x AS DECIMAL), n)`` and
would answer. The rule reads the kind of number ``x`` is (rewriter.number_kinds): each case below is
run on PostgreSQL over a table of the same column types, so a case the rule refuses is one
PostgreSQL fails, and one it answers is one PostgreSQL answers.
"""

from __future__ import annotations

import json

import psycopg
import pytest
from pglast.parser import parse_sql_json

from policies.errors import Refusal
from policies.model import TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.misreadings import refuse_round_casts
from tests.conftest import TestDatabase

_COLUMNS = (ColumnInfo("i", 23, -1, 1, None), ColumnInfo("n", 1700, -1, 2, None), ColumnInfo("f", 701, -1, 3, None),
            ColumnInfo("r", 700, -1, 4, None), ColumnInfo("t", 25, -1, 5, None))
_RELATION = Relation(1, "public", "kinds", TablePolicy(epsilon=1.0), {column.name: column for column in _COLUMNS})
_DDL = "CREATE TEMPORARY TABLE kinds (i int4, n numeric, f float8, r float4, t text)"

# round(x, 1) of these PostgreSQL answers (x integer, numeric or untyped: round(numeric, integer))
ANSWERED = ["45.5", "'45.5'", "45", "-5", "45.5 * 2 / 3", "5 / 2", "(5)", "ceil(45.5)", "abs(-5)", "mod(5.5, 2)",
            "CAST(ceil('45.5') AS numeric)", "'5'::int2", "'5'::numeric(4,1)", "5::pg_catalog.int4", "trunc(5.5, 1)",
            "trunc(5, 1)", "round(5, 1)", "i", "n", "i * 2", "n / 3", "abs(i)",
            # an untyped string where PostgreSQL resolves it to an integer or numeric
            "mod(5, '2')", "trunc('5', 1)", "round('5', 1)"]
# round(x, 1) of these PostgreSQL fails with 42883 (x double precision or real)
FAILING = ["ceil('4.5')", "floor(5)", "round(5)", "CAST(45.5 AS float8)", "5::real", "'5'::float4", "abs('4.5')",
           "ceil(5.5) + ceil('2')", "f", "r", "i * 1.5::float4", "abs(f)", "floor(i)", "2 ^ 3", "date_part('day', now())",
           "5::text", "t", "pi()", "pi() * 2"]
# Of those, the constants dpproxy knows to be double precision or real: refused with PostgreSQL's own 42883
CERTAIN = ["ceil('4.5')", "floor(5)", "round(5)", "CAST(45.5 AS float8)", "5::real", "'5'::float4",
           "ceil(5.5) + ceil('2')", "date_part('day', now())", "pi()", "pi() * 2"]


def _refusal(x: str) -> Refusal | None:
    """Rule round-cast's refusal of ``round(x, 1)`` in a condition on the table (None: let through)."""
    node = json.loads(parse_sql_json(f"SELECT count(*) FROM kinds WHERE i > round({x}, 1)"))
    try:
        refuse_round_casts(node, _RELATION)
    except Refusal as refusal:
        assert refusal.rule == "round-cast"
        return refusal
    return None


def _refused(x: str) -> bool:
    return _refusal(x) is not None


def _postgresql_state(admin: psycopg.Connection, x: str) -> str | None:
    """PostgreSQL's SQLSTATE for ``round(x, 1)`` over the table (None: answered)."""
    try:
        with admin.transaction():
            admin.execute(f"SELECT count(*) FROM kinds WHERE i > round({x}, 1)").fetchone()
    except psycopg.Error as error:
        return error.sqlstate
    return None


@pytest.fixture(scope="module")
def admin(test_db: TestDatabase):  # type: ignore[no-untyped-def]
    with psycopg.connect(test_db.admin_dsn) as conn:
        conn.execute(_DDL)
        yield conn


@pytest.mark.parametrize("x", ANSWERED)
def test_round_of_an_integer_numeric_or_untyped_value_is_answered_as_postgresql_answers_it(
        admin: psycopg.Connection, x: str) -> None:
    assert (_postgresql_state(admin, x), _refused(x)) == (None, False)


@pytest.mark.parametrize("x", FAILING)
def test_round_of_a_double_precision_or_unknown_kind_is_refused_where_postgresql_fails(
        admin: psycopg.Connection, x: str) -> None:
    assert (_postgresql_state(admin, x), _refused(x)) == ("42883", True)


@pytest.mark.parametrize("x", FAILING)
def test_round_of_a_constant_known_double_precision_fails_with_postgresql_s_own_sqlstate(x: str) -> None:
    # Told from the text alone; of a column (maybe another level's name), of no known kind, or of a
    # parameter (whose declared type decides), refused as a misreading (0A000).
    refusal = _refusal(x)
    assert refusal is not None and refusal.sqlstate == ("42883" if x in CERTAIN else "0A000"), refusal
