"""dpproxy's binary encoders agree byte for byte with PostgreSQL's own *_send functions."""

from __future__ import annotations

import pytest

from proxy.wire.binary import UnsupportedBinaryType, binary_from_text, binary_from_value

CASES = [
    ("int8", ["0", "-1", "9223372036854775807", "48842"]),
    ("int4", ["0", "-2147483648", "17"]),
    ("int2", ["0", "-32768", "99"]),
    ("oid", ["0", "4294967295", "1259"]),
    ("float8", ["0", "-0", "1.5", "1e-300", "NaN", "Infinity", "-Infinity", "0.1"]),
    ("float4", ["0", "1.5", "3.4e38", "NaN"]),
    ("numeric", ["0", "1", "-1", "123.4500", "0.0001", "10000", "99999999.99999999",
                 "-0.5", "1e-20", "123456789012345678901234567890", "NaN", "0.00", "100.10",
                 "Infinity", "-Infinity"]),
    ("bool", ["t", "f"]),
    ("text", ["", "héllo", "a\tb"]),
    ("name", ["pg_class"]),
    ("bytea", ["\\x", "\\x00ff10"]),
    ("uuid", ["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]),
    ("date", ["2000-01-01", "1970-01-01", "2026-11-21", "infinity"]),
    ("timestamp", ["2000-01-01 00:00:00", "2026-11-21 21:03:04.123456", "1969-07-20 20:17:40"]),
    ("timestamptz", ["2000-01-01 00:00:00+00", "2026-11-21 21:03:04.5+02", "1999-12-31 23:59:59-05:30"]),
]


@pytest.mark.parametrize("type_name,values", CASES, ids=[c[0] for c in CASES])
def test_text_to_binary_matches_postgres_send(admin, type_name: str, values: list[str]):
    admin.execute("SET TimeZone = 'UTC'")
    _assert_sent_as(admin, type_name, values, _send(type_name))


def _assert_sent_as(admin, type_name: str, values: list[str], send: str) -> None:
    """Each value's text as PostgreSQL prints it, converted by dpproxy, is what ``send`` gives."""
    for text in values:
        oid, out_text, sent = admin.execute(
            f"SELECT pg_typeof(%s::{type_name})::oid, (%s::{type_name})::text, {send}(%s::{type_name})",
            (text, text, text),
        ).fetchone()
        assert binary_from_text(out_text.encode(), oid) == bytes(sent), (type_name, text)


def _send(type_name: str) -> str:
    return {"int8": "int8send", "int4": "int4send", "int2": "int2send", "oid": "oidsend",
            "float8": "float8send", "float4": "float4send", "numeric": "numeric_send",
            "bool": "boolsend", "text": "textsend", "name": "namesend", "bytea": "byteasend",
            "uuid": "uuid_send", "date": "date_send", "timestamp": "timestamp_send",
            "timestamptz": "timestamptz_send"}[type_name]


def test_python_values_encode_like_postgres(admin):
    from decimal import Decimal

    for value, oid, sql in [(48842, 20, "int8send(48842)"), (2.5, 701, "float8send(2.5)"),
                            (Decimal("-12.340"), 1700, "numeric_send(-12.340)"), ("Male", 25, "textsend('Male')")]:
        assert binary_from_value(value, oid) == bytes(admin.execute(f"SELECT {sql}").fetchone()[0])


ARRAY_CASES = [
    ("int2[]", ["{17,-32768,99}", "{}", "{NULL,1}"]),
    ("int4[]", ["{28,37,48}", "{-2147483648}", "{1,NULL,3}"]),
    ("int8[]", ["{48842,9223372036854775807}"]),
    ("float4[]", ["{0.25,1.5,3.4e38,NaN}"]),
    ("float8[]", ["{28.5,37,48.25}", "{1e-300,-0,Infinity,-Infinity,NaN}", "{0.1}"]),
    ("numeric[]", ["{17,37.5,48.00}", "{0.0001,-12.340,NaN}", "{123456789012345678901234567890}"]),
    ("numeric(10,2)[]", ["{17,37.5,48}"]),
]


@pytest.mark.parametrize("type_name,values", ARRAY_CASES, ids=[c[0] for c in ARRAY_CASES])
def test_number_arrays_to_binary_match_postgres_array_send(admin, type_name: str, values: list[str]):
    """What percentile_cont(ARRAY[…]) and percentile_disc(ARRAY[…]) answer, in array_send's bytes:
    ndim, has-null flag, element type, length, lower bound 1, each element's length and value."""
    _assert_sent_as(admin, type_name, values, "array_send")


@pytest.mark.parametrize(("text", "oid"), [
    (b"{{1,2},{3,4}}", 1007),  # two dimensions
    (b"[0:1]={1,2}", 1007),  # a lower bound other than 1
    (b'{"a b",c}', 1009),  # text[]: not a number array
])
def test_unknown_type_or_array_shape_is_refused_not_guessed(text: bytes, oid: int):
    with pytest.raises(UnsupportedBinaryType):
        binary_from_text(text, oid)
