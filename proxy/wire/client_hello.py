"""A TLS ClientHello read off the stream before the handshake, and the ALPN protocols it offers.

PostgreSQL 17 refuses a TLS client that offers ALPN without ``postgresql`` (with the fatal alert
``no_application_protocol``), after an SSLRequest as with direct TLS. Python's ``ssl`` module
cannot: a server context whose ALPN protocols the client's do not meet completes the handshake
without ALPN, as if the client had offered none (which older clients, rightly, do). So the
session reads the ClientHello itself, checks it here, and hands its bytes to the TLS protocol
(``proxy.serving.tls_handshake``). Reference: RFC 8446 §4.1.2 and §4.2, RFC 7301 §3.1.
"""

from __future__ import annotations

import asyncio
import struct
from typing import NamedTuple

from .protocol import ProtocolError

__all__ = ["NO_APPLICATION_PROTOCOL_ALERT", "ClientHello", "offered_alpn", "read_client_hello"]

_HANDSHAKE_RECORD = 0x16
_CLIENT_HELLO = 1
_ALPN_EXTENSION = 16
_MAX_RECORD = 2**14 + 2048  # a TLSCiphertext's largest fragment; a plaintext one's is 2^14
_MAX_HELLO = 65536  # a ClientHello longer than this is no client's

NO_APPLICATION_PROTOCOL_ALERT = bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 120])
"""A TLS record with the fatal alert no_application_protocol (RFC 7301 §3.2), as OpenSSL sends it."""


class ClientHello(NamedTuple):
    """The records that carried a ClientHello (to be handed to the TLS protocol as they came) and
    the ALPN protocol names it offers (None: no ALPN extension, or one that could not be read,
    left to the TLS library to judge)."""

    records: bytes
    alpn: list[bytes] | None


async def read_client_hello(reader: asyncio.StreamReader, head: bytes = b"") -> ClientHello:
    """Read the TLS records of one ClientHello from ``reader`` (``head``: its first bytes, read
    already), and not a byte more. Raises ProtocolError when the bytes are no TLS handshake
    record or the ClientHello is longer than 64 KiB, IncompleteReadError at end of stream."""
    records = bytearray()
    message = bytearray()
    needed = 4  # the handshake header, then the whole message
    while len(message) < needed:
        header = head + await reader.readexactly(5 - len(head))
        head = b""
        kind, _version, length = struct.unpack("!BHH", header)
        if kind != _HANDSHAKE_RECORD or not 0 < length <= _MAX_RECORD:
            raise ProtocolError("expected a TLS handshake record")
        fragment = await reader.readexactly(length)
        records += header + fragment
        message += fragment
        if len(message) >= 4:
            needed = 4 + int.from_bytes(message[1:4], "big")
        if needed > _MAX_HELLO:
            raise ProtocolError("TLS ClientHello too long")
    return ClientHello(bytes(records), offered_alpn(bytes(message[:needed])))


def offered_alpn(message: bytes) -> list[bytes] | None:
    """The protocol names of a ClientHello handshake message's ALPN extension; None when it has
    none, or when ``message`` is not a well-formed ClientHello."""
    try:
        return _alpn(message)
    except (IndexError, struct.error, ValueError):
        return None


def _alpn(message: bytes) -> list[bytes] | None:
    if message[0] != _CLIENT_HELLO:
        raise ValueError("not a ClientHello")
    pos = 4 + 2 + 32  # header, legacy_version, random
    pos += 1 + message[pos]  # legacy_session_id
    pos += 2 + struct.unpack_from("!H", message, pos)[0]  # cipher_suites
    pos += 1 + message[pos]  # legacy_compression_methods
    if pos == len(message):
        return None  # no extensions
    (end,) = struct.unpack_from("!H", message, pos)
    pos += 2
    end += pos
    while pos < end:
        kind, length = struct.unpack_from("!HH", message, pos)
        pos += 4
        if kind == _ALPN_EXTENSION:
            (list_length,) = struct.unpack_from("!H", message, pos)
            names, at, stop = [], pos + 2, pos + 2 + list_length
            while at < stop:
                size = message[at]
                names.append(bytes(message[at + 1:at + 1 + size]))
                at += 1 + size
            if at != stop or stop > pos + length:
                raise ValueError("malformed ALPN extension")
            return names
        pos += length
    return None
