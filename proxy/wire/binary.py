"""PostgreSQL binary send format for the types dpproxy has to produce itself.

Two uses: DP answers requested in binary (int8, float8, numeric, text …), and catalog
results whose client asked for binary in some columns and text in others (libpq can only
fetch one format for a whole result, so dpproxy fetches text and converts those columns).
Types outside this table are refused with a clear error rather than guessed.
"""

from __future__ import annotations

import struct
import uuid
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation

__all__ = ["BINARY_TYPES", "UnsupportedBinaryType", "binary_from_text", "binary_from_value"]

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
XID, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID = (
    28, 700, 701, 1042, 1043, 1082, 1114, 1184, 1700, 2950,
)
UNKNOWN = 705

_EPOCH_DATE = date(2000, 1, 1)
_EPOCH = datetime(2000, 1, 1)
_EPOCH_TZ = datetime(2000, 1, 1, tzinfo=timezone.utc)
_TEXT_LIKE = {TEXT, NAME, BPCHAR, VARCHAR, CHAR, UNKNOWN}


class UnsupportedBinaryType(Exception):
    """The client asked for binary output of a type dpproxy cannot encode."""

    def __init__(self, type_oid: int):
        super().__init__(f"binary output of type oid {type_oid} is not supported by dpproxy")
        self.type_oid = type_oid


def binary_from_value(value: object, type_oid: int) -> bytes:
    """Encode a Python value (int, float, Decimal, str, bool …) as ``type_oid``'s binary form."""
    if type_oid == INT8:
        return struct.pack("!q", int(value))  # type: ignore[call-overload]
    if type_oid == INT4:
        return struct.pack("!i", int(value))  # type: ignore[call-overload]
    if type_oid == INT2:
        return struct.pack("!h", int(value))  # type: ignore[call-overload]
    if type_oid in (OID, XID):
        return struct.pack("!I", int(value))  # type: ignore[call-overload]
    if type_oid == FLOAT8:
        return struct.pack("!d", float(value))  # type: ignore[arg-type]
    if type_oid == FLOAT4:
        return struct.pack("!f", float(value))  # type: ignore[arg-type]
    if type_oid == NUMERIC:
        return _numeric(value if isinstance(value, Decimal) else Decimal(str(value)))
    if type_oid == BOOL:
        return b"\x01" if value else b"\x00"
    if type_oid in _TEXT_LIKE:
        return str(value).encode("utf-8")
    raise UnsupportedBinaryType(type_oid)


def binary_from_text(text: bytes, type_oid: int) -> bytes:
    """Convert PostgreSQL's text output of a value (DateStyle ISO) to its binary form."""
    if type_oid in _TEXT_LIKE:
        return text
    s = text.decode("utf-8")
    if type_oid in (INT8, INT4, INT2, OID, XID):
        return binary_from_value(int(s), type_oid)
    if type_oid in (FLOAT8, FLOAT4):
        return binary_from_value(float(s), type_oid)
    if type_oid == NUMERIC:
        try:
            return _numeric(Decimal(s))
        except InvalidOperation as exc:  # pragma: no cover - PostgreSQL prints valid numerics
            raise UnsupportedBinaryType(type_oid) from exc
    if type_oid == BOOL:
        return b"\x01" if s in ("t", "true") else b"\x00"
    if type_oid == BYTEA:
        if not s.startswith("\\x"):
            raise UnsupportedBinaryType(type_oid)  # escape format: bytea_output=escape
        return bytes.fromhex(s[2:])
    if type_oid == UUID:
        return uuid.UUID(s).bytes
    if type_oid == DATE:
        return _date(s)
    if type_oid == TIMESTAMP:
        return _timestamp(s, tz=False)
    if type_oid == TIMESTAMPTZ:
        return _timestamp(s, tz=True)
    raise UnsupportedBinaryType(type_oid)


def _numeric(value: Decimal) -> bytes:
    """numeric_send: ndigits, weight, sign, dscale, then base-10000 digits."""
    if value.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if value.is_infinite():
        return struct.pack("!hhHh", 0, 0, 0xD000 if value > 0 else 0xF000, 0)
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    dscale = max(0, -exponent)
    text = "".join(map(str, digits))
    # Pad so that the decimal point falls on a base-10000 boundary.
    int_len = len(text) + exponent  # digits before the decimal point
    front = (-int_len) % 4
    text = "0" * front + text
    int_len += front
    text += "0" * ((-len(text)) % 4)
    groups = [int(text[i : i + 4]) for i in range(0, len(text), 4)]
    weight = int_len // 4 - 1
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    header = struct.pack("!hhHh", len(groups), weight, 0x4000 if sign else 0, dscale)
    return header + b"".join(struct.pack("!H", g) for g in groups)


def _date(s: str) -> bytes:
    if s in ("infinity", "-infinity"):
        return struct.pack("!i", 0x7FFFFFFF if s == "infinity" else -0x80000000)
    return struct.pack("!i", (date.fromisoformat(s) - _EPOCH_DATE).days)


def _timestamp(s: str, tz: bool) -> bytes:
    if s in ("infinity", "-infinity"):
        return struct.pack("!q", 0x7FFFFFFFFFFFFFFF if s == "infinity" else -0x8000000000000000)
    if tz and len(s) >= 3 and s[-3] in "+-" and s[-2:].isdigit():
        s += ":00"  # PostgreSQL prints +02; fromisoformat wants +02:00
    moment = datetime.fromisoformat(s)
    delta: timedelta = moment - (_EPOCH_TZ if tz else _EPOCH)
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return struct.pack("!q", micros)


BINARY_TYPES = frozenset(
    {BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, XID, FLOAT4, FLOAT8, BPCHAR,
     VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, UNKNOWN}
)
