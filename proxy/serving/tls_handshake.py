"""TLS over a ClientHello the session has read itself: a client's that starts TLS at once
(libpq 17's ``sslnegotiation=direct``), and one's after an SSLRequest, read to check its ALPN.

Bytes read from the stream are where the TLS protocol that ``StreamWriter.start_tls`` puts
under the stream would never see them. ``start_tls_after`` stops reading from the socket,
starts TLS and hands the ClientHello's bytes to the TLS protocol before any more come from
the socket.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import cast

from proxy.wire.protocol import ProtocolError

__all__ = ["refuse_buffered", "start_tls_after"]


async def start_tls_after(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, context: ssl.SSLContext,
                          received: bytes) -> str | None:
    """Do the server's side of a TLS handshake whose first bytes, ``received``, were read from
    ``reader`` already (a ClientHello, ``proxy.wire.client_hello``); return the ALPN protocol
    agreed on (None: the client offered none that ``context`` names). From then on ``reader``
    and ``writer`` carry the decrypted stream.

    Raises ssl.SSLError if the handshake fails, ProtocolError if the client sent more than its
    ClientHello before the server's answer (those bytes would otherwise be read as if they had
    come through TLS), ConnectionError if it goes away.
    """
    transport = cast(asyncio.Transport, writer.transport)  # a socket's: it reads too
    # No await since ``received`` was read: nothing more has reached the stream's buffer, and
    # from here on the socket's bytes wait in the socket until the TLS protocol reads them.
    transport.pause_reading()
    refuse_buffered(reader, "received more than a TLS ClientHello before the server's answer")
    stream_protocol = transport.get_protocol()
    handshake = asyncio.ensure_future(writer.start_tls(context))
    # start_tls puts its TLS protocol under the transport, schedules that protocol's
    # connection_made and the transport's resume_reading, then waits for the handshake; the
    # bytes read already are handed to it right after those two, before the socket is read again.
    while transport.get_protocol() is stream_protocol and not handshake.done():
        await asyncio.sleep(0)
    if not handshake.done():
        asyncio.get_running_loop().call_soon(_receive, transport.get_protocol(), received)
    await handshake
    ssl_object = writer.get_extra_info("ssl_object")
    return ssl_object.selected_alpn_protocol() if ssl_object is not None else None


def refuse_buffered(reader: asyncio.StreamReader, message: str) -> None:
    """Raise ProtocolError(``message``) if ``reader`` holds bytes not handed out yet: read
    before TLS starts, they would be taken for bytes that came through it."""
    # StreamReader keeps what it has read but not handed out in _buffer (no public accessor).
    if len(getattr(reader, "_buffer", b"")):
        raise ProtocolError(message)


def _receive(tls_protocol: asyncio.BaseProtocol, data: bytes) -> None:
    """Hand ``data`` to ``tls_protocol`` as its transport would have: asyncio's and uvloop's TLS
    protocols are buffered protocols (``get_buffer``, ``buffer_updated``)."""
    buffered = cast(asyncio.BufferedProtocol, tls_protocol)
    view = memoryview(data)
    while view:
        buffer = memoryview(buffered.get_buffer(len(view)))
        size = min(len(buffer), len(view))
        buffer[:size] = view[:size]
        buffered.buffer_updated(size)
        view = view[size:]
