"""PostgreSQL protocol 3.0, server side: framing, decoding of frontend messages, and
encoding of backend messages. Pure functions over bytes; no policy, no I/O decisions.

Reference: https://www.postgresql.org/docs/current/protocol-message-formats.html
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "CANCEL_REQUEST",
    "GSSENC_REQUEST",
    "PROTOCOL_3_0",
    "SSL_REQUEST",
    "Field",
    "ProtocolError",
    "Startup",
    "read_message",
    "read_startup",
]

PROTOCOL_3_0 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102

_I32 = struct.Struct("!i")
_I16 = struct.Struct("!h")
_HEADER = struct.Struct("!ci")
_FIELD = struct.Struct("!ihihih")


class ProtocolError(Exception):
    """The peer broke the protocol; the connection is answered with an error and closed."""

    def __init__(self, message: str, sqlstate: str = "08P01"):
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


@dataclass(frozen=True)
class Startup:
    """The first packet of a connection: a StartupMessage, or one of the special requests."""

    code: int
    parameters: dict[str, str]
    cancel_pid: int = 0
    cancel_secret: int = 0


# ---------------------------------------------------------------- reading frontend messages


async def read_startup(reader: asyncio.StreamReader, max_bytes: int) -> Startup:
    """Read one untyped startup packet (StartupMessage, SSLRequest, GSSENCRequest, CancelRequest)."""
    (length,) = _I32.unpack(await reader.readexactly(4))
    if length < 8 or length > min(max_bytes, 10_000):
        raise ProtocolError(f"invalid startup packet length {length}")
    body = await reader.readexactly(length - 4)
    (code,) = _I32.unpack_from(body)
    if code == CANCEL_REQUEST:
        if length != 16:
            raise ProtocolError("invalid CancelRequest length")
        pid, secret = struct.unpack_from("!ii", body, 4)
        return Startup(code, {}, pid, secret)
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        if length != 8:
            raise ProtocolError("invalid SSL/GSSENC request length")
        return Startup(code, {})
    if code >> 16 != 3:
        raise ProtocolError(
            f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}: server supports 3.0",
            sqlstate="0A000",
        )
    return Startup(code, _decode_parameters(body[4:]))


def _decode_parameters(data: bytes) -> dict[str, str]:
    parts = data.split(b"\0")
    if len(parts) < 2 or parts[-1] != b"" or parts[-2] != b"":
        raise ProtocolError("startup packet parameters are not NUL-terminated")
    items = parts[:-2]
    if len(items) % 2:
        raise ProtocolError("startup packet has a parameter name without a value")
    try:
        decoded = [item.decode("utf-8") for item in items]
    except UnicodeDecodeError as exc:
        raise ProtocolError("startup packet is not valid UTF-8") from exc
    return dict(zip(decoded[::2], decoded[1::2]))


async def read_message(reader: asyncio.StreamReader, max_bytes: int) -> tuple[bytes, bytes]:
    """Read one typed frontend message; return (type byte, payload without the length)."""
    header = await reader.readexactly(5)
    kind, length = _HEADER.unpack(header)
    if length < 4:
        raise ProtocolError(f"invalid message length {length}")
    if length > max_bytes:
        raise ProtocolError(
            f"message of {length} bytes exceeds the limit of {max_bytes}", sqlstate="54000"
        )
    payload = await reader.readexactly(length - 4) if length > 4 else b""
    return kind, payload


def decode_cstring(payload: bytes, what: str) -> str:
    """Decode a payload that is exactly one NUL-terminated UTF-8 string (Query, PasswordMessage)."""
    if not payload.endswith(b"\0") or b"\0" in payload[:-1]:
        raise ProtocolError(f"malformed {what} message")
    try:
        return payload[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"{what} message is not valid UTF-8", sqlstate="22021") from exc


# ---------------------------------------------------------------- encoding backend messages


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + _I32.pack(len(payload) + 4) + payload


def _cstr(text: str) -> bytes:
    return text.encode("utf-8") + b"\0"


def authentication(code: int, extra: bytes = b"") -> bytes:
    """AuthenticationOk (0), CleartextPassword (3), MD5Password (5), SASL (10/11/12)."""
    return message(b"R", _I32.pack(code) + extra)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", _cstr(name) + _cstr(value))


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, secret))


def ready_for_query(status: bytes) -> bytes:
    """status: b'I' idle, b'T' in a transaction block, b'E' in a failed transaction block."""
    return message(b"Z", status)


@dataclass(frozen=True)
class Field:
    """One column of a RowDescription."""

    name: str
    type_oid: int
    type_size: int = -1
    type_modifier: int = -1
    table_oid: int = 0
    column_number: int = 0
    format: int = 0


def row_description(fields: Sequence[Field]) -> bytes:
    parts = [_I16.pack(len(fields))]
    for f in fields:
        parts.append(_cstr(f.name))
        parts.append(
            _FIELD.pack(f.table_oid, f.column_number, f.type_oid, f.type_size, f.type_modifier, f.format)
        )
    return message(b"T", b"".join(parts))


def data_row(values: Sequence[bytes | None]) -> bytes:
    parts = [_I16.pack(len(values))]
    for value in values:
        if value is None:
            parts.append(b"\xff\xff\xff\xff")
        else:
            parts.append(_I32.pack(len(value)))
            parts.append(value)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", _cstr(tag))


def empty_query_response() -> bytes:
    return message(b"I")


def _fields(severity: str, sqlstate: str, text: str, extra: Iterable[tuple[bytes, str]]) -> bytes:
    parts = [b"S", _cstr(severity), b"V", _cstr(severity), b"C", _cstr(sqlstate), b"M", _cstr(text)]
    for code, value in extra:
        parts.append(code)
        parts.append(_cstr(value))
    parts.append(b"\0")
    return b"".join(parts)


def error_response(
    sqlstate: str, text: str, hint: str | None = None, detail: str | None = None, severity: str = "ERROR"
) -> bytes:
    extra = [(b"D", detail)] if detail else []
    if hint:
        extra.append((b"H", hint))
    return message(b"E", _fields(severity, sqlstate, text, extra))


def notice_response(text: str, detail: str | None = None, severity: str = "NOTICE") -> bytes:
    return message(b"N", _fields(severity, "00000", text, [(b"D", detail)] if detail else []))


SSL_NOT_SUPPORTED = b"N"
