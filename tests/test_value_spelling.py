"""The spelling rules the neighbour checks compare numbers by (tests/value_spelling.py).

PostgreSQL's own output functions are the reference: each text they print must follow its rule,
or the checks would call a correct answer a leak; and the forms a leak takes (a trailing zero, a
scale of its own) must set a column apart, or the checks would be blind to them.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.conftest import TestDatabase
from tests.value_spelling import rules, spelled_apart

_FLOATS = ("0", "-0", "1", "-1.5", "0.1", "0.0001", "0.00001", "123456", "1234567", "1e15", "1e14",
           "999999999999999", "1.7976931348623157e308", "5e-324", "3.4e38", "1e-45", "6.522604", "100", "0.30000000000000004")


_OUTSIDE_FLOAT4 = ("1.7976931348623157e308", "5e-324")


@pytest.mark.parametrize("type_name, rule", [("float8", "float8out"), ("float4", "float4out")])
def test_every_float_postgresql_prints_follows_its_output_rule(test_db: TestDatabase, type_name: str, rule: str) -> None:
    values = [v for v in _FLOATS if type_name == "float8" or v not in _OUTSIDE_FLOAT4]
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        texts = [row[0] for row in conn.execute(
            f"SELECT CAST(CAST(x AS {type_name}) AS text) FROM unnest(%s::text[]) AS x", (values,))]
    assert [text for text in texts if rule not in (rules(text) or ())] == []


def test_every_numeric_postgresql_prints_at_a_declared_scale_follows_that_scale(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        texts = [row[0] for row in conn.execute(
            "SELECT CAST(CAST(x AS numeric(20, 2)) AS text) FROM unnest(ARRAY['2.5', '2.55', '0', '-7', '10']) AS x")]
    assert texts == ["2.50", "2.55", "0.00", "-7.00", "10.00"]
    assert not spelled_apart([[text] for text in texts])


@pytest.mark.parametrize("base, neighbour", [
    ("1.50", "12.3456"),  # a trailing zero on one table
    ("10.0", "10.00"),  # a scale of its own
    ("0.125000", "7.402702259529889"),  # the exact total's scale
    ("1.5e+00", "2.5"),  # an exponent PostgreSQL would not print
    ("012", "12"),  # a leading zero
])
def test_a_spelling_the_rows_decided_sets_the_column_apart(base: str, neighbour: str) -> None:
    assert spelled_apart([[base]], [[neighbour]]) == [(0, (base, neighbour))]


@pytest.mark.parametrize("base, neighbour", [
    ("2.50", "2.55"),  # numeric(p, 2)
    ("10.0", "1.7930378313321667"),  # a numeric printed from a double
    ("6.522604", "1e+16"),  # float8out, fixed and exponent form
    ("NaN", "1.50"),  # NaN is spelled one way whatever the rule
    ("-98", "40"),  # an integer
    ("0.20000000000000000000", "0.000010000000000000000000"),  # shares of two counts (rewriter/shares.py)
])
def test_spellings_the_noise_decides_keep_the_column_together(base: str, neighbour: str) -> None:
    assert spelled_apart([[base, "Male"]], [[neighbour, None]]) == []


def test_a_release_divided_by_a_constant_keeps_its_column_together_whatever_the_noise(test_db: TestDatabase) -> None:
    """``SUM(n) / 7``: PostgreSQL gives a numeric quotient 16 significant digits, so its scale
    follows the noised dividend's magnitude (a column of such quotients failed the check once)."""
    dividends = ["-3", "0", "12", "950", "4321", "-12345", "987654", "123456789", "0.5", "-0.004"]
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        texts = [row[0] for row in conn.execute(
            "SELECT CAST(CAST(x AS numeric) / 7 AS text) FROM unnest(%s::text[]) AS x", (dividends,))]
    assert len({len(text.partition(".")[2]) for text in texts}) > 2  # scales of their own
    assert [text for text in texts if "quotient" not in (rules(text) or ())] == []
    assert spelled_apart([[text] for text in texts[:5]], [[text] for text in texts[5:]]) == []
