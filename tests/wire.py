"""A minimal frontend for raw protocol tests: build messages, log in, read replies."""

from __future__ import annotations

import socket
import ssl
import struct


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def startup(**params: str) -> bytes:
    body = struct.pack("!i", 196608) + b"".join(cstr(k) + cstr(v) for k, v in params.items()) + b"\0"
    return struct.pack("!i", len(body) + 4) + body


def parse(name: str, sql: str, types: tuple[int, ...] = ()) -> bytes:
    return message(b"P", cstr(name) + cstr(sql) + struct.pack("!h", len(types)) + b"".join(struct.pack("!I", t) for t in types))


def bind(portal: str, statement: str, params: tuple[bytes | None, ...] = (), param_formats: tuple[int, ...] = (),
         result_formats: tuple[int, ...] = ()) -> bytes:
    body = cstr(portal) + cstr(statement) + struct.pack("!h", len(param_formats))
    body += b"".join(struct.pack("!h", f) for f in param_formats) + struct.pack("!h", len(params))
    for value in params:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    body += struct.pack("!h", len(result_formats)) + b"".join(struct.pack("!h", f) for f in result_formats)
    return message(b"B", body)


def describe(kind: bytes, name: str) -> bytes:
    return message(b"D", kind + cstr(name))


def execute(portal: str, max_rows: int = 0) -> bytes:
    return message(b"E", cstr(portal) + struct.pack("!i", max_rows))


SYNC = message(b"S")
FLUSH = message(b"H")


class Wire:
    """One authenticated raw connection."""

    def __init__(self, host: str, port: int, user: str = "plain", password: str = "plain",
                 database: str = "dpproxy_test", startup_params: dict[str, str] | None = None,
                 direct_tls: ssl.SSLContext | None = None):
        """``direct_tls``: begin with a TLS handshake in this context (``sslnegotiation=direct``)."""
        self.sock = socket.create_connection((host, port), timeout=15)
        if direct_tls is not None:
            self.sock = direct_tls.wrap_socket(self.sock, server_hostname="localhost")
        self.buffer = b""
        self.sock.sendall(startup(user=user, database=database, **(startup_params or {})))
        assert self.read_until(b"R")[-1][0] == b"R"
        self.sock.sendall(message(b"p", cstr(password)))
        self.startup = self.read_until(b"Z")

    @classmethod
    def direct(cls, dsn: str) -> Wire:
        """A raw connection straight to PostgreSQL over the Unix socket of libpq URI ``dsn``
        (pgserver's: trust authentication), to compare replies with dpproxy's in the same run."""
        from urllib.parse import parse_qs, urlparse

        uri = urlparse(dsn)
        host = parse_qs(uri.query)["host"][0]
        conn = cls.__new__(cls)
        conn.sock = socket.socket(socket.AF_UNIX)
        conn.sock.settimeout(15)
        conn.sock.connect(f"{host}/.s.PGSQL.{uri.port or 5432}")
        conn.buffer = b""
        conn.sock.sendall(startup(user=uri.username or "postgres", database=uri.path.lstrip("/")))
        conn.startup = conn.read_until(b"Z")
        assert conn.startup[-1][0] == b"Z", conn.startup
        return conn

    def send(self, *messages: bytes) -> None:
        self.sock.sendall(b"".join(messages))

    def read_until(self, kind: bytes) -> list[tuple[bytes, bytes]]:
        messages = []
        while True:
            while len(self.buffer) >= 5:
                length = struct.unpack("!i", self.buffer[1:5])[0]
                if len(self.buffer) < 1 + length:
                    break
                item = (self.buffer[:1], self.buffer[5 : 1 + length])
                self.buffer = self.buffer[1 + length :]
                messages.append(item)
                if item[0] == kind:
                    return messages
            chunk = self.sock.recv(65536)
            if not chunk:
                return messages
            self.buffer += chunk

    def kinds_until(self, kind: bytes) -> list[bytes]:
        return [k for k, _ in self.read_until(kind)]

    def close(self) -> None:
        self.sock.close()


def startup_error(host: str, port: int, **params: str) -> dict[bytes, bytes]:
    """The error fields of a startup that is refused, before or after the password ("plain")."""
    conn = Wire.__new__(Wire)
    conn.sock = socket.create_connection((host, port), timeout=15)
    conn.buffer = b""
    try:
        conn.sock.sendall(startup(user="plain", database="dpproxy_test", **params))
        replies = conn.read_until(b"R")
        if not [body for kind, body in replies if kind == b"E"]:
            conn.sock.sendall(message(b"p", cstr("plain")))
            replies = conn.read_until(b"E")
        (error,) = [error_fields(body) for kind, body in replies if kind == b"E"]
    finally:
        conn.close()
    return error


def error_fields(body: bytes) -> dict[bytes, bytes]:
    return {f[:1]: f[1:] for f in body.split(b"\0") if f}


def data_row_values(body: bytes) -> list[bytes | None]:
    count = struct.unpack("!h", body[:2])[0]
    pos, values = 2, []
    for _ in range(count):
        size = struct.unpack("!i", body[pos : pos + 4])[0]
        pos += 4
        values.append(None if size == -1 else body[pos : pos + size])
        pos += max(size, 0)
    return values


Reply = tuple[object, ...]


def replies(wire: Wire, *requests: tuple[bytes, ...], row_descriptions: bool = False) -> list[list[Reply]]:
    """Each request's replies up to its ReadyForQuery: errors and notices by SQLSTATE and
    message, rows by their values, command tags, ParameterStatus names, the status byte, and
    with ``row_descriptions`` each RowDescription whole (else they are left out)."""
    answered = []
    for request in requests:
        wire.send(*request)
        got: list[Reply] = []
        for kind, body in wire.read_until(b"Z"):
            if kind in (b"E", b"N"):
                fields = error_fields(body)
                got.append((kind, fields[b"C"], fields[b"M"]))
            elif kind == b"D":
                got.append((kind, *data_row_values(body)))
            elif kind in (b"C", b"Z") or (kind == b"T" and row_descriptions):
                got.append((kind, body.rstrip(b"\0")))
            elif kind == b"S":
                got.append((kind, body.split(b"\0")[0]))
            elif kind != b"T":
                got.append((kind,))
        answered.append(got)
    return answered


def replies_on_both(direct_dsn: str, host: str, port: int, *requests: tuple[bytes, ...],
                    row_descriptions: bool = False) -> tuple[list[list[Reply]], list[list[Reply]]]:
    """The ``replies`` to ``requests`` on a raw connection straight to PostgreSQL (libpq URI
    ``direct_dsn``, ``Wire.direct``), then on one to dpproxy at ``host``:``port``."""
    results = []
    for wire in (Wire.direct(direct_dsn), Wire(host, port)):
        try:
            results.append(replies(wire, *requests, row_descriptions=row_descriptions))
        finally:
            wire.close()
    return results[0], results[1]


def race(dsns: list[str], sqls: list[str]) -> list[str]:
    """Run sqls[i] on its own new connection to dsns[i % len(dsns)], all at once.

    Returns "ok" or the SQLSTATE of each, in order.
    """
    import asyncio

    import psycopg

    async def one(i: int) -> str:
        dsn = dsns[i % len(dsns)]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            try:
                await conn.execute(sqls[i])
                return "ok"
            except psycopg.Error as exc:
                return exc.diag.sqlstate or "?"

    async def main() -> list[str]:
        return await asyncio.gather(*(one(i) for i in range(len(sqls))))

    return asyncio.run(main())


SLOW_CATALOG_QUERY = "SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute c"


def assert_cancel_stops_a_slow_query(conn: object, after_s: float = 0.3) -> None:
    """Cancel (psycopg's ``cancel_safe``: a CancelRequest on a new connection) a slow
    passthrough query ``after_s`` into it: it fails with 57014 well before any timeout, and
    the session goes on."""
    import threading
    import time

    import psycopg
    import pytest

    assert isinstance(conn, psycopg.Connection)
    timer = threading.Timer(after_s, conn.cancel_safe)
    timer.start()
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute(SLOW_CATALOG_QUERY)
    assert time.monotonic() - started < 10  # the cancel, not a statement_timeout
    timer.join()
    assert conn.execute("SELECT 1").fetchone() == (1,)
