"""Forms dpproxy refused though its backend SQL reads them as PostgreSQL does, now answered: each
condition's backend SQL chooses, on the round-trip table's edge rows, exactly the rows PostgreSQL's
reading of the statement chooses (tests/round_trip.py), under every session profile.

* An IN list of ``real``/``double precision`` values on an integer or float column (``i IN
  (1::float4, 2::float4)``): PostgreSQL compares the column converted to double precision with each
  value, exactly, in the list (``i::float8 = ANY ('{1,2}'::real[])``) as in dpproxy's ``i = 1::float4
  OR i = 2::float4`` (``float84eq`` each). A number beside them (``i IN (5::float4, 7)``) is converted
  to real in the list only, and stays refused (rule ``in-list-types``).
* ``interval 'P1DT'`` (a day; sqlglot split it as ``'1 DT'``) and ``'P2M'`` (two months; sqlglot's two
  minutes): dpproxy's reading keeps such an ISO 8601 value as written (rewriter/sqlglot_parse.py).
* ``interval '@ 1 m'``, ``'1 m'``: PostgreSQL's abbreviation of a minute, which sqlglot writes
  ``'1 MINUTE'``: the same interval (rule ``interval-form`` compared the unit's spelling).
* ``round(mod(5, '2'), 1)``, ``round(trunc('5', 1), 1)``: an untyped string PostgreSQL resolves to an
  integer or numeric, read so by rewriter.number_kinds (rule ``round-cast``).
"""

from __future__ import annotations

import pytest

from tests.round_trip import RoundTrip
from tests.test_round_trip import round_trip, round_trip_policy  # noqa: F401 - the round-trip table's fixtures

_CONDITIONS = [
    "i IN (1::float4, 2::float4)",
    "i IN (5::real, 7::double precision, 2147483647::float8)",
    "i IN (2147483647::float4, (-2147483648)::float4)",
    "i NOT IN (5::float4, 7::float8)",
    "i IN ('NaN'::float4, 42::float4)",
    "f IN (0.5::float4, 0.1::float8)",
    "f IN (0.1::float4, 1e308::float8, 'Infinity'::float4)",
    "f NOT IN (0.25::real, 0.75::real)",
    "ts > timestamp '2000-05-02' - interval 'P1DT'",
    "d > date '2000-05-02' - interval 'P1DT'",
    "tz >= timestamptz '2000-05-02 12:00+00' - interval 'P1DT'",
    "d >= date '2000-07-01' - interval 'P2M'",
    "ts <= timestamp '2000-07-01 12:00' - interval 'P2M'",
    "ts > timestamp '2000-05-01 12:01' - interval '@ 1 m'",
    "ts >= timestamp '2000-05-01 12:01' - interval '1 m'",
    "ts > timestamp '2000-05-01 12:00' - interval '@ 1.5 h'",
    "i > round(mod(5, '2'), 1)",
    "i > round(trunc('5', 1), 1)",
    "i < round(round('5', 1), 1)",
]


@pytest.mark.parametrize("condition", _CONDITIONS)
@pytest.mark.parametrize("place", ["WHERE", "FILTER"])
def test_a_form_postgresql_reads_alike_is_answered_choosing_postgresql_s_rows(
        round_trip: RoundTrip, condition: str, place: str) -> None:  # noqa: F811 - the fixture
    sql = (f"SELECT count(*) FROM rt WHERE {condition}" if place == "WHERE"
           else f"SELECT count(*) FILTER (WHERE {condition}) FROM rt")
    checked = round_trip.conditions([(sql, condition)])
    assert (checked.planned, checked.mismatches) == (1, []), checked


@pytest.mark.parametrize("condition", ["i IN (5::float4, 7)", "i IN (16777217::float4, '16777217')",
                                       "n IN (4.5::float4, 5::float4)", "i IN (5::float4, 7::int4)"])
def test_a_real_value_beside_a_number_string_or_integer_or_on_a_numeric_column_stays_refused(
        round_trip: RoundTrip, condition: str) -> None:  # noqa: F811 - the fixture
    # In the list 7 and '16777217' become real (16777217 is 16777216 there); alone each is compared as
    # an integer. A numeric column's raw conjunct would cast a real to numeric (16777216 to 16777200).
    assert round_trip.plan(f"SELECT count(*) FROM rt WHERE {condition}") is None
