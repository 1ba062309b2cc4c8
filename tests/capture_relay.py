"""A TCP relay in front of dpproxy that records every statement a client sent and its outcome.

Used to record what a real BI tool (Superset) sends: each simple Query, and each extended
protocol Parse up to its Sync, with the outcome dpproxy gave it: ``ok``, or the SQLSTATE of
the first ErrorResponse before the ReadyForQuery that closed it. The relay forwards bytes
unchanged; it only reads them. A connection that negotiates TLS is relayed without being
recorded (clients here are told ``sslmode=disable``).
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field

__all__ = ["CapturingRelay", "Recorded"]

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


@dataclass(frozen=True)
class Recorded:
    """One statement as the client sent it, and what dpproxy answered."""

    phase: str  # what the client was doing, as the test labelled it (CapturingRelay.phase)
    protocol: str  # "Q": simple Query; "P": extended protocol (Parse)
    sql: str
    outcome: str  # "ok", or the SQLSTATE of the error


@dataclass
class _Connection:
    """What is in flight on one relayed connection: statements awaiting their ReadyForQuery."""

    pending: deque[list[str]] = field(default_factory=deque)  # per Q or Sync: its statements
    errors: deque[str | None] = field(default_factory=deque)
    open_batch: list[tuple[str, str]] = field(default_factory=list)
    negotiation_bytes: int = 0  # single-byte answers to SSLRequest/GSSENCRequest still due
    opaque: bool = False  # TLS was negotiated: relay only
    lock: threading.Lock = field(default_factory=threading.Lock)


class CapturingRelay:
    """Listens on 127.0.0.1:<free port> and relays every connection to ``(host, port)``."""

    def __init__(self, host: str, port: int):
        self.target = (host, port)
        self.recorded: list[Recorded] = []
        self.phase = "connect"  # set by the test before each step; recorded with each statement
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name="capture-relay", daemon=True).start()

    def statements(self) -> list[Recorded]:
        with self._lock:
            return list(self.recorded)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._sockets += [client, server]
            state = _Connection()
            threading.Thread(target=self._pump_frontend, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._pump_backend, args=(server, client, state), daemon=True).start()

    def _pump_frontend(self, source: socket.socket, sink: socket.socket, state: _Connection) -> None:
        buffer = b""
        started = False
        try:
            while chunk := source.recv(65536):
                buffer += chunk
                while not state.opaque:
                    if not started:
                        if len(buffer) < 8:
                            break
                        length, code = struct.unpack("!ii", buffer[:8])
                        if len(buffer) < length:
                            break
                        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                            with state.lock:
                                state.negotiation_bytes += 1
                        elif code != _CANCEL_REQUEST:
                            started = True
                        sink.sendall(buffer[:length])
                        buffer = buffer[length:]
                        continue
                    size = _typed_message_size(buffer)
                    if size is None:
                        break
                    self._frontend_message(buffer[:1], buffer[5:size], state)
                    sink.sendall(buffer[:size])
                    buffer = buffer[size:]
                if state.opaque and buffer:
                    sink.sendall(buffer)
                    buffer = b""
        except OSError:
            pass
        finally:
            _shutdown(sink)

    def _pump_backend(self, source: socket.socket, sink: socket.socket, state: _Connection) -> None:
        buffer = b""
        try:
            while chunk := source.recv(65536):
                if state.opaque:
                    sink.sendall(chunk)
                    continue
                # Read before the client gets it: once it has a ReadyForQuery it may send the next
                # statement, which must not be recorded while this answer still pends (a loaded
                # machine once let the startup's ReadyForQuery close the client's first Query).
                buffer += chunk
                while buffer:
                    with state.lock:
                        answer_byte = state.negotiation_bytes > 0
                        if answer_byte:
                            state.negotiation_bytes -= 1
                    if answer_byte:
                        if buffer[:1] in (b"S", b"G"):
                            state.opaque = True
                            break
                        buffer = buffer[1:]
                        continue
                    size = _typed_message_size(buffer)
                    if size is None:
                        break
                    self._backend_message(buffer[:1], buffer[5:size], state)
                    buffer = buffer[size:]
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            _shutdown(sink)

    def _frontend_message(self, kind: bytes, body: bytes, state: _Connection) -> None:
        with state.lock:
            if kind == b"Q":
                text = body.rstrip(b"\0").decode(errors="replace")
                state.pending.append(["\0".join((self.phase, "Q", text))])
                state.errors.append(None)
            elif kind == b"P":
                sql = body.split(b"\0", 2)[1].decode(errors="replace")
                state.open_batch.append((self.phase, sql))
            elif kind == b"S":
                state.pending.append(["\0".join((phase, "P", sql)) for phase, sql in state.open_batch])
                state.errors.append(None)
                state.open_batch = []

    def _backend_message(self, kind: bytes, body: bytes, state: _Connection) -> None:
        with state.lock:
            if kind == b"E" and state.errors and state.errors[0] is None:
                fields = {f[:1]: f[1:] for f in body.split(b"\0") if f}
                state.errors[0] = fields.get(b"C", b"?????").decode()
            if kind != b"Z" or not state.pending:
                return
            statements = state.pending.popleft()
            outcome = state.errors.popleft() or "ok"
        with self._lock:
            for item in statements:
                phase, protocol, sql = item.split("\0", 2)
                self.recorded.append(Recorded(phase, protocol, sql, outcome))


def _typed_message_size(buffer: bytes) -> int | None:
    """The size of the whole message (type byte, length, body) at the start of ``buffer``, or
    None while it has not all arrived."""
    if len(buffer) < 5:
        return None
    size = 1 + struct.unpack("!i", buffer[1:5])[0]
    return size if len(buffer) >= size else None


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
