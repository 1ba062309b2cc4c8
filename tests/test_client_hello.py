"""proxy.wire.client_hello: the ALPN protocols of ClientHellos made by Python's ssl (OpenSSL)."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from proxy.wire.client_hello import ClientHello, offered_alpn, read_client_hello
from proxy.wire.protocol import ProtocolError


def _client_hello(alpn: list[str] | None) -> bytes:
    """The records of the ClientHello OpenSSL sends first, offering ``alpn``."""
    context = ssl.create_default_context()
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    outgoing = ssl.MemoryBIO()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _read(data: bytes, head: bytes = b"") -> tuple[ClientHello, bytes]:
    """What read_client_hello reads from a stream of ``data``, and what it leaves there."""
    async def read() -> tuple[ClientHello, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        return await read_client_hello(reader, head), await reader.read()
    return asyncio.run(read())


@pytest.mark.parametrize("alpn", [None, ["postgresql"], ["http/1.1", "h2"], ["h2", "postgresql"]])
def test_the_offered_alpn_protocols_are_read_and_the_records_kept_whole(alpn: list[str] | None):
    records = _client_hello(alpn)
    hello, rest = _read(records + b"after")
    assert hello.records == records and rest == b"after"  # not a byte past the ClientHello
    assert hello.alpn == (None if alpn is None else [name.encode() for name in alpn])
    assert _read(records[1:], head=records[:1])[0] == hello  # the first byte read already


def test_a_client_hello_split_over_two_records_is_read_whole():
    records = _client_hello(["postgresql"])
    body = records[5:]
    split = records[:3] + (40).to_bytes(2, "big") + body[:40] + records[:3] + (len(body) - 40).to_bytes(2, "big") + body[40:]
    hello, _ = _read(split)
    assert hello.records == split and hello.alpn == [b"postgresql"]


def test_what_is_no_tls_handshake_record_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        _read(b"\x00\x00\x00\x08\x04\xd2\x16\x2f")  # an SSLRequest
    with pytest.raises(ProtocolError):
        _read(b"\x16\x03\x01\xff\xff" + b"\x00" * 10)  # a record longer than TLS allows


def test_a_malformed_client_hello_offers_nothing_and_is_left_to_the_tls_library():
    message = _client_hello(["postgresql"])[5:]
    assert offered_alpn(message) == [b"postgresql"]
    assert offered_alpn(message[:60]) is None
    assert offered_alpn(b"\x02" + message[1:]) is None  # a ServerHello's type
