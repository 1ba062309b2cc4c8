"""The spelling rules the neighbour checks compare numbers by (tests/value_spelling.py).

PostgreSQL's own output functions are the reference: each text they print must follow its rule,
or the checks would call a correct answer a leak; and the forms a leak takes (a trailing zero, a
scale of its own) must set a column apart, or the checks would be blind to them.
"""

from __future__ import annotations

import struct

import psycopg
import pytest

from tests.conftest import TestDatabase
from tests.value_spelling import canonical_binary, keep_number_texts, misencoded, rules, shape, spelled_apart, spelling

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


_SENT = (
    ("int2", ["0", "-7", "32767", "-32768"]),
    ("int4", ["0", "12", "-2147483648"]),
    ("int8", ["0", "-1", "9223372036854775807"]),
    ("float4", [v for v in _FLOATS if v not in _OUTSIDE_FLOAT4] + ["NaN", "Infinity", "-Infinity", "1.1"]),
    ("float8", [*_FLOATS, "NaN", "Infinity", "-Infinity", "2.5000000000000004"]),
    ("numeric", ["0", "0.00", "-0.000", "-0.5", "12.50", "10000", "123456789.000100", "0.00001", "1e-20", "NaN",
                 "Infinity", "-Infinity", "99999999.99999999", "-1234.5678", "0.20000000000000000000"]),
    ("float8[]", ["{1.5,NULL}", "{}", "[0:1]={2,3}", "{-0,1e+300,NaN}", "{NULL}"]),
    ("numeric[]", ["{1.50,NULL,-3}", "{0.0001}"]),
    ("int4[]", ["{3,7}", "[2:3]={1,2}"]),
    ("int8[]", ["{3,-7}"]),
    ("float4[]", ["{0.1,2.5}"]),
    ("bool", ["t", "f"]),
    ("text", ["Male", "Ünï cödé", ""]),
)


@pytest.mark.parametrize("type_name, values", _SENT, ids=[name for name, _ in _SENT])
def test_the_binary_form_modelled_is_postgresqls_send_of_the_text_it_prints(test_db: TestDatabase, type_name: str,
                                                                            values: list[str]) -> None:
    raw = []
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for binary in (False, True):
            with conn.cursor(binary=binary) as cursor:
                cursor.execute(f"SELECT CAST(x AS {type_name}) FROM unnest(CAST(%s AS text[])) AS x", (values,))
                result = cursor.pgresult
                assert result is not None and result.ntuples == len(values)
                type_oid = result.ftype(0)
                raw.append([result.get_value(r, 0) for r in range(result.ntuples)])
    printed, sent = raw
    assert [(text, value) for text, value in zip(printed, sent)
            if canonical_binary(type_oid, bytes(text or b"")) != value] == []


@pytest.mark.parametrize("type_oid, text, sent", [
    (701, b"2.5", struct.pack("!q", struct.unpack("!q", struct.pack("!d", 2.5))[0] | 1)),  # a low mantissa bit
    (1700, b"12.5", struct.pack("!hhHhHH", 2, 0, 0, 2, 12, 5000)),  # a dscale of its own
    (1700, b"12.5", struct.pack("!hhHhHHH", 3, 0, 0, 1, 12, 5000, 0)),  # a trailing zero digit
    (1022, b"{2.5}", struct.pack("!iiiiii", 1, 0, 701, 1, 0, 8) + struct.pack("!d", 2.5)),  # a lower bound of 0
    (20, b"7", None),  # NULL for a value
])
def test_a_binary_form_the_rows_decided_is_told_from_the_text_of_the_same_release(type_oid: int, text: bytes,
                                                                               sent: bytes | None) -> None:
    assert misencoded([type_oid], [[sent]], [[text]]) == [(0, 0)]
    assert misencoded([type_oid], [[canonical_binary(type_oid, text)]], [[text]]) == []


def test_an_arrays_lower_bound_and_elements_are_read_with_its_text(test_db: TestDatabase) -> None:
    """psycopg's own loader drops a ``[l:u]=`` prefix: the arrays' shapes differ only through
    the text kept, and each element position is spelled as a column."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn, conn.cursor() as cursor:
        keep_number_texts(cursor.adapters)
        cursor.execute("SELECT CAST('[0:1]={1.5,2}' AS float8[]), CAST('{1.50,NULL}' AS numeric[]), "
                       "CAST('{2.5,2}' AS float8[])")
        shifted, scaled, plain = cursor.fetchone() or ()
    assert (shape(shifted), shape(scaled), shape(plain)) == ("[0:1]={#,#}", "{#,NULL}", "{#,#}")
    assert spelled_apart([[spelling(plain)]], [[spelling(shifted)]]) == []
    assert spelled_apart([[spelling(plain)]], [[spelling(scaled)]]) == [(0, ("2.5", "1.50"))]


def test_every_quotient_postgresql_prints_follows_select_div_scale(test_db: TestDatabase) -> None:
    """Shares of two counts (n ≤ d and n > d, across base-10000 digits, first digits equal or
    not) and releases divided by constants: each scale is 16 − 4·w or 20 − 4·w of the quotient's
    weight w (or 24 − 4·w where it rounded up to a power of 10000)."""
    counts = ["0", "1", "2", "9", "10", "99", "100", "1234", "9999", "10000", "10001", "12345", "99999999",
              "100000000", "123456789", "-3", "-10000"]
    others = ["0.5", "-0.004", "12.25", "950.125", "0.0001", "99999999999999999999", "1e-8"]
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        texts = [row[0] for row in conn.execute(
            "SELECT CAST(CAST(n AS numeric) / CAST(d AS numeric) AS text) "
            "FROM unnest(CAST(%s AS text[])) AS n, unnest(CAST(%s AS text[])) AS d WHERE CAST(d AS numeric) <> 0",
            (counts + others, counts + ["7", "3", "9999.9999"]))]
    assert len(texts) > 400
    assert [text for text in texts if "quotient" not in (rules(text) or ())] == []


@pytest.mark.parametrize("base, neighbour", [
    ("0.20000000000000000000", "0.2000000000000000"),  # 16 digits: no estimate of 0.2's weight gives them
    ("3.3333333333333333", "3.333333333333"),  # 12 digits for a quotient of weight 0
])
def test_a_quotients_scale_select_div_scale_never_gives_sets_the_column_apart(base: str, neighbour: str) -> None:
    assert spelled_apart([[base]], [[neighbour]]) == [(0, (base, neighbour))]
