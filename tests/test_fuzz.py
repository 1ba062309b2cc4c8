"""Fuzzing: the protocol decoder and the SQL classifier fail only in the ways they promise."""

from __future__ import annotations

import asyncio
import os
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.errors import Refusal
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation, TableRegistry
from proxy.wire import protocol
from proxy.wire.protocol import ProtocolError
from rewriter.classify import DPQuery, Passthrough, ResolvedRelation, classify
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements

DECODERS = [protocol.decode_parse, protocol.decode_bind, protocol.decode_describe,
            protocol.decode_execute, protocol.decode_close]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(DECODERS), st.binary(max_size=64))
def test_message_decoders_raise_only_protocol_errors(decoder, payload: bytes):
    try:
        decoder(payload)
    except ProtocolError:
        pass


def test_the_unnamed_statement_and_portal_are_read_without_decoding(monkeypatch):
    """pgbench, libpq and most drivers name neither: five of a Parse-Bind-Describe-Execute's six
    strings are empty, "" in every encoding, so only the others pay for the session's decoder."""
    decoded: list[bytes] = []
    real = protocol._decoded
    monkeypatch.setattr(protocol, "_decoded", lambda data, what: decoded.append(data) or real(data, what))
    parse = protocol.decode_parse(b"\0SELECT 1\0\0\0")
    bind = protocol.decode_bind(b"\0\0" + b"\0\0" * 3)
    execute = protocol.decode_execute(b"\0" + struct.pack("!i", 0))
    assert (parse.statement, parse.query, bind.portal, bind.statement, execute.portal) == ("", "SELECT 1", "", "", "")
    assert decoded == [b"SELECT 1"]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_startup_and_message_readers_raise_only_protocol_or_eof_errors(data: bytes):
    async def read() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        try:
            await protocol.read_startup(reader, 1 << 20)
            while True:
                await protocol.read_message(reader, 1 << 16)
        except (ProtocolError, asyncio.IncompleteReadError):
            pass

    asyncio.run(read())


_MESSAGES = st.lists(st.tuples(st.binary(min_size=1, max_size=1), st.binary(max_size=70)), max_size=6).map(
    lambda messages: b"".join(kind + struct.pack("!i", len(body) + 4) + body for kind, body in messages)
)


@settings(max_examples=300, deadline=None)
@given(_MESSAGES, st.binary(max_size=40), st.lists(st.integers(1, 40), min_size=1, max_size=10))
def test_buffered_message_reader_reads_exactly_what_read_message_reads(messages: bytes, tail: bytes, cuts: list[int]):
    """Whatever the bytes (messages, some over the size limit, then anything) and however the
    network splits them, MessageReader yields the same messages as read_message, then the
    same error (a bad length or the end of the stream)."""
    data = messages + tail

    async def messages(read) -> tuple[list[tuple[bytes, bytes]], type[Exception]]:  # type: ignore[no-untyped-def]
        got = []
        try:
            while True:
                got.append(await read())
        except (ProtocolError, asyncio.IncompleteReadError) as exc:
            return got, type(exc)

    async def both() -> None:
        plain = asyncio.StreamReader()
        plain.feed_data(data)
        plain.feed_eof()
        expected = await messages(lambda: protocol.read_message(plain, 64))

        chunked = asyncio.StreamReader()
        buffered = protocol.MessageReader(chunked, 64)

        async def feed() -> None:
            at = 0
            for cut in cuts * (len(data) // max(1, sum(cuts)) + 1):
                chunked.feed_data(data[at : at + cut])
                at += cut
                await asyncio.sleep(0)
            chunked.feed_eof()

        feeder = asyncio.ensure_future(feed())
        assert await messages(buffered.next) == expected
        await feeder

    asyncio.run(both())


def test_buffered_message_reader_hands_out_a_pipelined_packet_in_order_and_reads_long_messages_whole():
    def message(kind: bytes, payload: bytes) -> bytes:
        return kind + struct.pack("!i", len(payload) + 4) + payload

    async def run() -> None:
        reader = asyncio.StreamReader()
        messages = protocol.MessageReader(reader, 1 << 20)
        long = bytes(range(256)) * 1000  # longer than one read's chunk
        reader.feed_data(message(b"P", b"\0SELECT 1\0\0\0") + message(b"B", b"\0\0" + b"\0" * 6) + message(b"S", b""))
        reader.feed_data(message(b"Q", long)[:1000])
        assert await messages.next() == (b"P", b"\0SELECT 1\0\0\0")
        assert await messages.next() == (b"B", b"\0\0" + b"\0" * 6)
        assert await messages.next() == (b"S", b"")
        reader.feed_data(message(b"Q", long)[1000:])
        assert await messages.next() == (b"Q", long)
        reader.feed_eof()
        with pytest.raises(asyncio.IncompleteReadError):
            await messages.next()

    asyncio.run(run())


ADULT_OID, PG_CLASS_OID = 16384, 1259
_TABLE = TablePolicy(epsilon=1.0, columns={"age": ColumnPolicy(bounds=(17, 90)),
                                            "sex": ColumnPolicy(categories=("Male", "Female"))})
_ADULT = Relation(ADULT_OID, "public", "adult", _TABLE, {
    "age": ColumnInfo("age", 23, -1, 1, _TABLE.columns["age"]),
    "sex": ColumnInfo("sex", 25, -1, 2, _TABLE.columns["sex"]),
    "name": ColumnInfo("name", 25, -1, 3, None),
})
REGISTRY = TableRegistry({ADULT_OID: _ADULT}, ("oid", "relname", "reltuples", "relpages"))

FRAGMENTS = [
    "SELECT", "COUNT(*)", "SUM(age)", "AVG(age)", "MIN(age)", "MAX(name)", "age", "sex", "name", "*",
    "FROM", "adult", "a", "pg_class", "pg_stats", "lookup", "WHERE", "AND", "OR", "NOT", "=", ">", "<",
    "1", "'x'", "$1", "(", ")", ",", ";", "GROUP BY", "JOIN", "ON", "UNION", "WITH", "x AS", "LIMIT",
    "ORDER BY", "lower(sex)", "age/0", "age::text", "pg_sleep(1)", "IN", "IS NULL", "LIKE", "DISTINCT",
    "OVER ()", "FILTER (WHERE age > 1)", "MODE() WITHIN GROUP (ORDER BY sex)", "SET", "x = 1", "BEGIN",
    "COMMIT", "INSERT INTO adult VALUES (1)", "reltuples", "ctid", "LATERAL", "EXISTS", "SELECT 1",
]


def _resolve(statement):
    resolved = {}
    for ref in statement.references.relations:
        if ref.name in ("adult", "a"):
            resolved[ref] = ResolvedRelation(ADULT_OID, "public", "adult")
        elif ref.name == "pg_class":
            resolved[ref] = ResolvedRelation(PG_CLASS_OID, "pg_catalog", "pg_class")
        elif ref.name == "pg_stats":
            resolved[ref] = ResolvedRelation(12000, "pg_catalog", "pg_stats")
        else:
            resolved[ref] = None
    return resolved


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=14) | st.text(max_size=60).map(lambda t: [t]))
def test_classifier_refuses_or_decides_and_never_passes_protected_data_through(parts: list[str]):
    sql = " ".join(parts)
    try:
        statements = split_statements(sql)
    except Refusal:
        return
    for statement in statements:
        resolved = _resolve(statement)
        try:
            decision = classify(statement, resolved, REGISTRY)
        except Refusal as refusal:
            assert refusal.sqlstate and refusal.message
            continue
        touches_adult = any(r is not None and r.oid == ADULT_OID for r in resolved.values())
        if isinstance(decision, Passthrough):
            assert not touches_adult, sql
        if isinstance(decision, DPQuery):
            assert touches_adult
            written = backend_sql(decision.plan, seed=0)
            assert "adult" in written and "pg_sleep" not in written


def test_random_bytes_from_many_connections_do_not_disturb_a_working_session(proxy):
    with proxy.connect() as conn:
        for i in range(60):
            sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
            junk = os.urandom(1 + i * 7)
            if i % 3 == 0:  # a valid startup followed by garbage
                junk = struct.pack("!ii", 8, 80877103) + junk
            try:
                sock.sendall(junk)
                sock.shutdown(socket.SHUT_WR)
                sock.recv(4096)
            except OSError:
                pass
            finally:
                sock.close()
            if i % 10 == 0:
                assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
    with proxy.connect() as again:
        assert again.execute("SELECT 1").fetchone() == (1,)
