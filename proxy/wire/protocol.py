"""PostgreSQL protocol 3.0, server side: framing, decoding of frontend messages, and
encoding of backend messages. Pure functions over bytes; no policy, no I/O decisions.

Reference: https://www.postgresql.org/docs/current/protocol-message-formats.html
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple, Sequence

from .encodings import client_encoding

__all__ = [
    "CANCEL_REQUEST",
    "GSSENC_REQUEST",
    "PROTOCOL_3_0",
    "SSL_REQUEST",
    "TLS_ALPN",
    "TLS_HANDSHAKE",
    "Field",
    "InvalidText",
    "MessageReader",
    "Notice",
    "ProtocolError",
    "Startup",
    "read_message",
    "read_startup",
]

PROTOCOL_3_0 = 196608
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
TLS_HANDSHAKE = b"\x16"
"""The first byte of a TLS handshake record: a client starting TLS directly (libpq 17's
``sslnegotiation=direct``) sends it where a startup packet's length would begin (a length
starting with it would be hundreds of megabytes, never a startup packet)."""
TLS_ALPN = "postgresql"
"""The ALPN protocol name of PostgreSQL's protocol (PostgreSQL 17 requires it of direct TLS)."""

_I32 = struct.Struct("!i")
_I16 = struct.Struct("!h")
_U32 = struct.Struct("!I")
_HEADER = struct.Struct("!ci")
_FIELD = struct.Struct("!ihihih")


class ProtocolError(Exception):
    """The peer broke the protocol; the connection is answered with an error and closed."""

    def __init__(self, message: str, sqlstate: str = "08P01"):
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate


class InvalidText(ProtocolError):
    """A string of a well-formed message is not text in the session's client_encoding (22021):
    where the message is a statement (Query, Parse, Bind, Describe …), the statement fails and
    the session goes on, as on PostgreSQL; elsewhere (authentication) it ends the connection
    like any ProtocolError."""

    def __init__(self, what: str, data: bytes, exc: UnicodeDecodeError, encoding: str = "UTF8"):
        shown = " ".join(f"0x{b:02x}" for b in data[exc.start:min(exc.end, exc.start + 2)])
        super().__init__(f'invalid byte sequence for encoding "{encoding}": {shown} (in the {what} message)', "22021")
        self.hint = (f"dpproxy reads this session's statements in its client_encoding, {encoding}: set the "
                     "client's encoding to the one its text is in (client_encoding, PGCLIENTENCODING, or the "
                     "driver's character set setting).")


class Startup(NamedTuple):
    """The first packet of a connection: a StartupMessage, or one of the special requests (a
    NamedTuple: built a couple of times per connection, where a frozen dataclass's ``__init__``
    cost five times as much)."""

    code: int
    parameters: dict[str, str]
    cancel_pid: int = 0
    cancel_secret: int = 0


# ---------------------------------------------------------------- reading frontend messages


async def read_startup(reader: asyncio.StreamReader, max_bytes: int, head: bytes = b"") -> Startup:
    """Read one untyped startup packet (StartupMessage, SSLRequest, GSSENCRequest, CancelRequest);
    ``head``: its first bytes (at most 4), already read from ``reader``."""
    (length,) = _I32.unpack(head + await reader.readexactly(4 - len(head)))
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
    _check_length(length, max_bytes)
    payload = await reader.readexactly(length - 4) if length > 4 else b""
    return kind, payload


class MessageReader:
    """Typed frontend messages framed from whatever the socket delivered, in order.

    A client often sends several messages in one packet (Parse, Bind, Describe, Execute and
    Sync together); one read takes them all and the next ones are handed out from the
    buffer, where ``read_message`` would wait on the stream twice per message. Raises like
    ``read_message``: ProtocolError for a bad length, IncompleteReadError at end of stream.
    """

    _CHUNK = 65536
    _WATCH_BYTES = 4 * _CHUNK

    def __init__(self, reader: asyncio.StreamReader, max_bytes: int):
        self._reader = reader
        self.max_bytes = max_bytes
        """The largest message ``next`` takes (longer: ProtocolError 54000); may be changed between messages."""
        self._buffer = b""
        self._pos = 0  # start of the next message in _buffer

    async def next(self) -> tuple[bytes, bytes]:
        """The next message: (type byte, payload without the length)."""
        while len(self._buffer) - self._pos < 5:
            await self._fill()
        buffer, pos = self._buffer, self._pos
        kind, length = _HEADER.unpack_from(buffer, pos)
        _check_length(length, self.max_bytes)
        end = pos + 1 + length
        if end > len(buffer):  # the rest of a long message: read exactly that, not chunk by chunk
            payload = buffer[pos + 5 :] + await self._reader.readexactly(end - len(buffer))
            self._buffer, self._pos = b"", 0
            return kind, payload
        if end == len(buffer):  # all handed out: an idle session keeps no buffer
            self._buffer, self._pos = b"", 0
        else:
            self._pos = end
        return kind, buffer[pos + 5 : end]

    def has_message(self) -> bool:
        """Whether a whole message is buffered already: ``next`` returns it without waiting
        (False may still find one in the stream's own buffer)."""
        available = len(self._buffer) - self._pos
        if available < 5:
            return False
        _, length = _HEADER.unpack_from(self._buffer, self._pos)
        return available >= 1 + length

    async def closed(self) -> None:
        """Return when the client's stream ends (end of file, or the connection reset), keeping
        what arrives meanwhile for ``next``; for a session that reads no message meanwhile (a
        statement waiting for a pooled backend connection). Once ``_WATCH_BYTES`` are held it
        reads no more and waits until cancelled: a client sending that much has not gone, and
        what it sends must wait in the socket, not in memory.

        An end of file counts as gone even if the client only shut down its sending side:
        clients of the protocol do not half-close, and PostgreSQL's own check for a closed
        client (``client_connection_check_interval``) reads it so too.
        """
        while len(self._buffer) - self._pos < self._WATCH_BYTES:
            try:
                chunk = await self._reader.read(self._CHUNK)
            except (ConnectionError, OSError):
                return  # ``next`` raises it again
            if not chunk:
                return
            self._buffer = self._buffer[self._pos :] + chunk
            self._pos = 0
        await asyncio.get_running_loop().create_future()

    async def _fill(self) -> None:
        chunk = await self._reader.read(self._CHUNK)
        if not chunk:
            raise asyncio.IncompleteReadError(self._buffer[self._pos :], None)
        self._buffer = self._buffer[self._pos :] + chunk
        self._pos = 0


def _check_length(length: int, max_bytes: int) -> None:
    if length < 4:
        raise ProtocolError(f"invalid message length {length}")
    if length > max_bytes:
        raise ProtocolError(f"message of {length} bytes exceeds the limit of {max_bytes}", sqlstate="54000")


def decode_cstring(payload: bytes, what: str) -> str:
    """Decode a payload that is exactly one NUL-terminated string (Query, PasswordMessage), in
    the session's client_encoding (UTF-8 before the session has one: during authentication)."""
    # find, not ``b"\0" in``: bytes' "in" first tries its operand as an integer, which raises
    # and clears a TypeError on every call.
    if not payload.endswith(b"\0") or payload.find(b"\0") != len(payload) - 1:
        raise ProtocolError(f"malformed {what} message")
    return _decoded(payload[:-1], what)


def _decoded(data: bytes, what: str) -> str:
    encoding = client_encoding.get()
    try:
        return data.decode(encoding.codec)
    except UnicodeDecodeError as exc:
        raise InvalidText(what, data, exc, encoding.name) from exc


class _Cursor:
    """Sequential reads from one message payload; any overrun is a protocol violation."""

    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str):
        self.data, self.pos, self.what = data, 0, what

    def cstring(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError(f"malformed {self.what} message: unterminated string")
        if end == self.pos:  # the unnamed statement or portal: "" in every encoding
            self.pos = end + 1
            return ""
        text = _decoded(self.data[self.pos : end], self.what)
        self.pos = end + 1
        return text

    def int16(self) -> int:
        return self._unpack(_I16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def uint32(self) -> int:
        return self._unpack(_U32)

    def byte(self) -> bytes:
        if self.pos >= len(self.data):
            raise ProtocolError(f"malformed {self.what} message: too short")
        value = self.data[self.pos : self.pos + 1]
        self.pos += 1
        return value

    def take(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ProtocolError(f"malformed {self.what} message: value overruns the message")
        value = self.data[self.pos : self.pos + size]
        self.pos += size
        return value

    def count(self, limit: int = 65535) -> int:
        value = self.int16()
        if value < 0 or value > limit:
            raise ProtocolError(f"malformed {self.what} message: invalid count {value}")
        return value

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"malformed {self.what} message: trailing bytes")

    def _unpack(self, fmt: struct.Struct) -> int:
        if self.pos + fmt.size > len(self.data):
            raise ProtocolError(f"malformed {self.what} message: too short")
        (value,) = fmt.unpack_from(self.data, self.pos)
        self.pos += fmt.size
        return value


# The decoded messages are NamedTuples, immutable as frozen dataclasses are but built in one
# call: a frozen dataclass sets each field through object.__setattr__, twelve calls for the
# Parse, Bind, Describe and Execute of every extended-protocol statement.
class Parse(NamedTuple):
    statement: str
    query: str
    param_types: tuple[int, ...]


class Bind(NamedTuple):
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


class Describe(NamedTuple):
    kind: bytes  # b"S" statement, b"P" portal
    name: str


class Execute(NamedTuple):
    portal: str
    max_rows: int


class Close(NamedTuple):
    kind: bytes
    name: str


def decode_parse(payload: bytes) -> Parse:
    cur = _Cursor(payload, "Parse")
    name, query = cur.cstring(), cur.cstring()
    types = tuple(cur.uint32() for _ in range(cur.count()))
    cur.end()
    return Parse(name, query, types)


def decode_bind(payload: bytes) -> Bind:
    cur = _Cursor(payload, "Bind")
    portal, statement = cur.cstring(), cur.cstring()
    formats = tuple(cur.int16() for _ in range(cur.count()))
    values: list[bytes | None] = []
    for _ in range(cur.count()):
        size = cur.int32()
        values.append(None if size == -1 else cur.take(size))
    results = tuple(cur.int16() for _ in range(cur.count()))
    cur.end()
    if any(f not in (0, 1) for f in formats + results):
        raise ProtocolError("invalid format code in Bind message")
    return Bind(portal, statement, formats, tuple(values), results)


def _target(payload: bytes, what: str) -> tuple[bytes, str]:
    """The (b"S" statement | b"P" portal, name) that Describe and Close address."""
    cur = _Cursor(payload, what)
    kind, name = cur.byte(), cur.cstring()
    cur.end()
    if kind not in (b"S", b"P"):
        raise ProtocolError(f"invalid {what} target {kind!r}")
    return kind, name


def decode_describe(payload: bytes) -> Describe:
    return Describe(*_target(payload, "Describe"))


def decode_execute(payload: bytes) -> Execute:
    cur = _Cursor(payload, "Execute")
    portal, max_rows = cur.cstring(), cur.int32()
    cur.end()
    return Execute(portal, max(0, max_rows))


def decode_close(payload: bytes) -> Close:
    return Close(*_target(payload, "Close"))


def formats_for(codes: Sequence[int], count: int) -> tuple[int, ...]:
    """Expand a Bind format-code list (none = all text, one = all, else one per item)."""
    if not codes:
        return (0,) * count
    if len(codes) == 1:
        return (codes[0],) * count
    if len(codes) != count:
        raise ProtocolError(f"format codes given for {len(codes)} items, but there are {count}")
    return tuple(codes)


# ---------------------------------------------------------------- encoding backend messages


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + _I32.pack(len(payload) + 4) + payload


def _cstr(text: str) -> bytes:
    # In the session's client_encoding; a character it lacks is written as "?": these are
    # names, tags and messages, never released values (labels are checked before any charge).
    return text.encode(client_encoding.get().codec, "replace") + b"\0"


def authentication(code: int, extra: bytes = b"") -> bytes:
    """AuthenticationOk (0), CleartextPassword (3), MD5Password (5), SASL (10/11/12)."""
    return message(b"R", _I32.pack(code) + extra)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", _cstr(name) + _cstr(value))


_STATUS_BLOCKS: dict[tuple[object, ...], bytes] = {}
_STATUS_BLOCKS_KEPT = 256


def parameter_statuses(values: Mapping[str, str]) -> bytes:
    """A ParameterStatus for each of ``values``, in their order, as one buffer (a session's
    startup reply), in the client_encoding in force.

    The last _STATUS_BLOCKS_KEPT distinct sets are kept encoded: sessions of one user and
    client report the same values (session_authorization is the user), and encoding a dozen
    messages one by one was a tenth of a connection's Python. A set is only ever answered
    with its own encoding, so a session cannot tell what other users' sessions reported.
    """
    key = (client_encoding.get().codec, *values.items())
    block = _STATUS_BLOCKS.get(key)
    if block is None:
        block = b"".join([parameter_status(name, value) for name, value in values.items()])
        if len(_STATUS_BLOCKS) >= _STATUS_BLOCKS_KEPT:
            del _STATUS_BLOCKS[next(iter(_STATUS_BLOCKS))]
        _STATUS_BLOCKS[key] = block
    return block


def backend_key_data(pid: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!ii", pid, secret))


def negotiate_protocol_version(startup: Startup) -> bytes | None:
    """NegotiateProtocolVersion for a StartupMessage asking for more than dpproxy speaks (a
    minor version above 3.0, or ``_pq_.`` protocol options); None when it asks for nothing more.

    As PostgreSQL answers it: the version served (3.0, as the whole version code, which is
    what PostgreSQL sends and libpq reads) and the options not recognised (all of them).
    """
    options = [name for name in startup.parameters if name.startswith("_pq_.")]
    if startup.code & 0xFFFF == 0 and not options:
        return None
    body = struct.pack("!ii", PROTOCOL_3_0, len(options)) + b"".join(name.encode("utf-8") + b"\0" for name in options)
    return message(b"v", body)


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


class Notice(str):
    """A notice's text, with the severity and SQLSTATE it is sent with (a plain str: NOTICE, 00000)."""

    severity: str
    sqlstate: str

    def __new__(cls, text: str, severity: str = "NOTICE", sqlstate: str = "00000") -> Notice:
        notice = super().__new__(cls, text)
        notice.severity = severity
        notice.sqlstate = sqlstate
        return notice


def notice_response(text: str, detail: str | None = None) -> bytes:
    """A NoticeResponse for ``text``; a ``Notice`` keeps its severity (WARNING …) and SQLSTATE."""
    severity, sqlstate = (text.severity, text.sqlstate) if isinstance(text, Notice) else ("NOTICE", "00000")
    return message(b"N", _fields(severity, sqlstate, text, [(b"D", detail)] if detail else []))


def parameter_description(type_oids: Sequence[int]) -> bytes:
    return message(b"t", _I16.pack(len(type_oids)) + b"".join(_U32.pack(oid) for oid in type_oids))


def copy_out_response(columns: int, binary: bool = False) -> bytes:
    """CopyOutResponse for a COPY TO STDOUT of ``columns`` columns, text (and csv) or binary."""
    form = int(binary)
    return message(b"H", bytes([form]) + _I16.pack(columns) + _I16.pack(form) * columns)


def copy_data(data: bytes) -> bytes:
    return message(b"d", data)


COPY_DONE = message(b"c")
PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
PORTAL_SUSPENDED = message(b"s")
SSL_NOT_SUPPORTED = b"N"
