"""PostgreSQL binary send format for the types dpproxy has to produce itself.

Two uses: DP answers requested in binary (int8, float8, numeric, text …), and catalog
results whose client asked for binary in some columns and text in others (libpq can only
fetch one format for a whole result, so dpproxy fetches text and converts those columns).
Types outside this table are refused with a clear error rather than guessed. Arrays of the
number types (what ``percentile_cont(ARRAY[…])`` answers) are sent as ``array_send`` sends
them, when one-dimensional with lower bound 1 (what ``array_out`` prints without a ``[l:u]=``
prefix); any other shape is refused as an unsupported type is.
"""

from __future__ import annotations

import re
import struct
import uuid
from decimal import Decimal, InvalidOperation

from rewriter.types import ARRAY_ELEMENTS, NUMBER_ARRAY_NAMES

__all__ = ["BINARY_TYPES", "DATE_TIME_TYPES", "NOT_ISO", "NUMBER_ARRAYS", "UnsupportedBinaryType", "binary_from_text", "binary_from_value"]

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
XID, FLOAT4, FLOAT8, BPCHAR, VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID = (
    28, 700, 701, 1042, 1043, 1082, 1114, 1184, 1700, 2950,
)
UNKNOWN = 705
NUMBER_ARRAYS = {array: ARRAY_ELEMENTS[array] for array in NUMBER_ARRAY_NAMES}
"""The array types dpproxy sends in binary, each with its element type."""
DATE_TIME_TYPES = frozenset({DATE, TIMESTAMP, TIMESTAMPTZ})
"""Converted to binary from their text only as DateStyle ISO prints them."""
NOT_ISO = " from text in a DateStyle other than ISO"

_TEXT_LIKE = {TEXT, NAME, BPCHAR, VARCHAR, CHAR, UNKNOWN}


class UnsupportedBinaryType(Exception):
    """The client asked for binary output of a type dpproxy cannot encode."""

    def __init__(self, type_oid: int, reason: str = ""):
        super().__init__(f"binary output of type oid {type_oid} is not supported by dpproxy{reason}")
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
        return bytes.fromhex(s[2:]) if s.startswith("\\x") else _bytea_from_escape(s)
    if type_oid == UUID:
        return uuid.UUID(s).bytes
    if type_oid in DATE_TIME_TYPES:
        try:
            return _date(s) if type_oid == DATE else _timestamp(s, tz=type_oid == TIMESTAMPTZ)
        except ValueError:
            raise UnsupportedBinaryType(type_oid, NOT_ISO) from None
    if type_oid in NUMBER_ARRAYS:
        return _number_array(s, type_oid)
    raise UnsupportedBinaryType(type_oid)


_BYTEA_ESCAPE = re.compile(r"\\([0-3][0-7]{2}|\\)")


def _bytea_from_escape(text: str) -> bytes:
    """The bytes of a bytea as ``bytea_output = escape`` prints it: a byte outside printable ASCII
    as a backslash and three octal digits, a backslash doubled, any other byte as itself. The
    session sets bytea_output and PostgreSQL does not report it, so a released bytea (a MODE's or
    a key's, printed over the release in the session) must convert from either form: a failure
    here would come after the charge."""
    return _BYTEA_ESCAPE.sub(lambda match: "\\" if match.group(1) == "\\" else chr(int(match.group(1), 8)),
                             text).encode("latin-1")


_ARRAY_HEAD = struct.Struct("!iiiii")  # ndim, has-null flag, element type, then per dimension: length, lower bound


def _number_array(s: str, type_oid: int) -> bytes:
    """array_send of a one-dimensional array of numbers from array_out's text (``{17,37.5,NULL}``):
    ndim 1 (0 for ``{}``), whether an element is NULL, the element type, the length and lower
    bound 1, then each element's length (-1 for NULL) and its binary form."""
    element = NUMBER_ARRAYS[type_oid]
    if not (s.startswith("{") and s.endswith("}")) or any(c in s[1:-1] for c in '{}"\\'):
        # [l:u]={...}, several dimensions, quoted elements: no number array dpproxy sends
        raise UnsupportedBinaryType(type_oid, " other than a one-dimensional array from 1")
    if s == "{}":
        return struct.pack("!iii", 0, 0, element)
    texts = s[1:-1].split(",")
    values = [None if text == "NULL" else binary_from_text(text.encode("ascii"), element) for text in texts]
    parts = [_ARRAY_HEAD.pack(1, int(None in values), element, len(values), 1)]
    for value in values:
        parts.append(b"\xff\xff\xff\xff" if value is None else struct.pack("!i", len(value)) + value)
    return b"".join(parts)


def _numeric(value: Decimal) -> bytes:
    """numeric_send: ndigits, weight, sign, dscale, then base-10000 digits."""
    if value.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if value.is_infinite():
        # PostgreSQL reads a special value's header as a short numeric's, whose dscale bits say 32
        return struct.pack("!hhHh", 0, 0, 0xD000 if value > 0 else 0xF000, 32)
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


# PostgreSQL's ISO (DateStyle ISO) output of a date, timestamp or timestamptz: a year of four
# digits or more, " BC" for the years before 1 (year 1 BC is year 0), an offset of hours,
# minutes and seconds (a zone's local mean time before its standard time).
_ISO_MOMENT = re.compile(
    r"(\d{4,})-(\d\d)-(\d\d)"
    r"(?: (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?)?"
    r"(?:([+-])(\d\d)(?::(\d\d))?(?::(\d\d))?)?"
    r"( BC)?"
)
_DAY_US = 86_400_000_000


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a proleptic Gregorian date (astronomical year: 0 is 1 BC)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


_EPOCH_DAYS = _days_from_civil(2000, 1, 1)


def _moment(s: str, with_time: bool) -> tuple[int, int]:
    """(days since 2000-01-01, microseconds since midnight UTC-adjusted) of an ISO value;
    ValueError for any other text (DateStyle other than ISO)."""
    match = _ISO_MOMENT.fullmatch(s)
    if match is None or (match[4] is None) == with_time:
        raise ValueError(f"not a DateStyle ISO value: {s!r}")
    year, month, day = int(match[1]), int(match[2]), int(match[3])
    if match[12]:
        year = 1 - year
    days = _days_from_civil(year, month, day) - _EPOCH_DAYS
    micros = 0
    if match[4] is not None:
        micros = ((int(match[4]) * 60 + int(match[5])) * 60 + int(match[6])) * 1_000_000
        micros += int((match[7] or "").ljust(6, "0") or 0)
    if match[8]:
        offset = ((int(match[9]) * 60 + int(match[10] or 0)) * 60 + int(match[11] or 0)) * 1_000_000
        micros -= offset if match[8] == "+" else -offset
    return days, micros


def _date(s: str) -> bytes:
    if s in ("infinity", "-infinity"):
        return struct.pack("!i", 0x7FFFFFFF if s == "infinity" else -0x80000000)
    days, _ = _moment(s, with_time=False)
    return struct.pack("!i", days)


def _timestamp(s: str, tz: bool) -> bytes:
    if s in ("infinity", "-infinity"):
        return struct.pack("!q", 0x7FFFFFFFFFFFFFFF if s == "infinity" else -0x8000000000000000)
    days, micros = _moment(s, with_time=True)
    return struct.pack("!q", days * _DAY_US + micros)


BINARY_TYPES = frozenset(
    {BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, XID, FLOAT4, FLOAT8, BPCHAR,
     VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, NUMERIC, UUID, UNKNOWN, *NUMBER_ARRAYS}
)
