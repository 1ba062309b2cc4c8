"""Is a dpproxy listening and answering? The container's HEALTHCHECK asks this.

``probe`` opens a TCP connection and sends an SSLRequest, the first packet every
PostgreSQL client may send. A live dpproxy answers with one byte: ``N`` (no TLS
configured), or ``S`` followed by a TLS handshake, which the probe completes so that a
broken certificate shows up as unhealthy. The probe then hangs up before the startup
packet: no session, no backend connection, no audit line.
"""

from __future__ import annotations

import socket
import ssl
import struct

from proxy.wire.protocol import SSL_REQUEST

__all__ = ["HealthError", "probe"]


class HealthError(Exception):
    """The listener did not answer like a PostgreSQL server."""


def probe(host: str, port: int, timeout_s: float = 5.0) -> str:
    """Complete an SSLRequest round trip with ``host:port``; return ``"tls"`` or ``"plain"``.

    Raises OSError when nothing answers in time and HealthError on an unexpected reply.
    """
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(struct.pack("!ii", 8, SSL_REQUEST))
        reply = sock.recv(1)
        if reply == b"N":
            return "plain"
        if reply != b"S":
            raise HealthError(f"unexpected reply to SSLRequest: {reply!r}")
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # liveness, not identity: the server's own certificate
        with context.wrap_socket(sock, server_hostname=host) as tls:
            tls.unwrap()  # close_notify both ways, so the server sees a clean end of TLS
            return "tls"
