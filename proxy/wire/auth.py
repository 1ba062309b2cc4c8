"""Client authentication against the policy's users: SCRAM-SHA-256, md5 or cleartext.

The password exchange happens between the client and dpproxy only; the backend is reached
with the service role's own credentials. Each user's method comes from the policy
(default SCRAM-SHA-256); md5 and cleartext are used only where a user's entry asks for
them. An unknown user goes through the same exchange as a known one (SCRAM with a salt
derived from the name, as PostgreSQL's mock authentication does) and gets the same error
as a wrong password, so the proxy does not reveal which login names exist.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import struct

from policies.errors import SQLSTATE, Refusal
from policies.model import UserPolicy

from . import protocol
from .scram import AuthInfo, ScramExchange, ScramFailure

__all__ = ["authenticate"]

_OK, _CLEARTEXT, _MD5, _SASL, _SASL_CONTINUE, _SASL_FINAL = 0, 3, 5, 10, 11, 12
_SCRAM = "SCRAM-SHA-256"
_MOCK_SECRET = secrets.token_bytes(32)  # per process: mock salts are stable while it runs
_PASSWORD_MESSAGE_BYTES = 65536  # before authentication, no client makes dpproxy hold more
# The same for every failed login, a user the policy names or not: it says where logins come from
# (newcomers try a PostgreSQL role) and nothing about which users exist.
_LOGIN_HINT = ("Logins are the users of dpproxy's policy, not the backend's PostgreSQL roles: "
               "check the user name and password with the policy's owner.")


async def authenticate(
    messages: protocol.MessageReader,
    writer: asyncio.StreamWriter,
    user_name: str,
    user: UserPolicy | None,
) -> bytes:
    """Run the user's password exchange, reading the client's messages from ``messages`` (no
    longer than _PASSWORD_MESSAGE_BYTES), and return the messages that close it (SASLFinal,
    AuthenticationOk), which the caller sends with the session's first ParameterStatus and
    ReadyForQuery, in one packet as PostgreSQL does; raise Refusal (28P01) on failure."""
    method = user.auth if user is not None else "scram-sha-256"
    exchange = _Exchange(messages, writer)
    limit = messages.max_bytes
    messages.max_bytes = min(limit, _PASSWORD_MESSAGE_BYTES)
    try:
        if method == "scram-sha-256":
            ok, closing = await exchange.scram(_auth_info(user_name, user))
        elif method == "md5":
            assert user is not None and user.password is not None
            ok, closing = await exchange.md5(user_name, user.password), b""
        else:
            assert user is not None and user.password is not None
            ok, closing = await exchange.cleartext(user.password), b""
    finally:
        messages.max_bytes = limit
    if not ok or user is None:
        raise Refusal(SQLSTATE.INVALID_PASSWORD, f'password authentication failed for user "{user_name}"', _LOGIN_HINT)
    return closing + protocol.authentication(_OK)


class _Exchange:
    """The message-level steps of each method."""

    def __init__(self, messages: protocol.MessageReader, writer: asyncio.StreamWriter):
        self.messages, self.writer = messages, writer

    async def _ask(self, code: int, extra: bytes = b"") -> bytes:
        self.writer.write(protocol.authentication(code, extra))
        await self.writer.drain()
        kind, payload = await self.messages.next()
        if kind != b"p":
            raise protocol.ProtocolError(f"expected a password message, got {kind!r}")
        return payload

    async def cleartext(self, password: str) -> bool:
        supplied = protocol.decode_cstring(await self._ask(_CLEARTEXT), "password")
        return hmac.compare_digest(supplied.encode(), password.encode())

    async def md5(self, user_name: str, password: str) -> bool:
        salt = secrets.token_bytes(4)
        supplied = protocol.decode_cstring(await self._ask(_MD5, salt), "password")
        inner = hashlib.md5((password + user_name).encode()).hexdigest().encode()
        expected = "md5" + hashlib.md5(inner + salt).hexdigest()
        return hmac.compare_digest(supplied.encode(), expected.encode())

    async def scram(self, info: AuthInfo) -> tuple[bool, bytes]:
        """Whether the client proved the password, and on success the SASLFinal to send."""
        exchange = ScramExchange(info)
        payload = await self._ask(_SASL, _SCRAM.encode() + b"\0\0")
        mechanism, rest = _split_cstring(payload)
        if mechanism != _SCRAM or len(rest) < 4:
            raise protocol.ProtocolError("client selected an invalid SASL authentication mechanism")
        (size,) = struct.unpack("!i", rest[:4])
        try:
            # Inside the try: a client-first message that is not UTF-8 is a malformed SASL
            # message (08P01, as PostgreSQL says), not an internal error.
            client_first = rest[4:].decode("utf-8") if size >= 0 else ""
            server_first = exchange.server_first(client_first)
            client_final = (await self._ask(_SASL_CONTINUE, server_first.encode())).decode("utf-8")
            server_final = exchange.server_final(client_final)
        except ScramFailure:
            return False, b""
        except UnicodeDecodeError as exc:
            raise protocol.ProtocolError("SASL message is not valid UTF-8") from exc
        return True, protocol.authentication(_SASL_FINAL, server_final.encode())


def _split_cstring(payload: bytes) -> tuple[str, bytes]:
    end = payload.find(b"\0")
    if end < 0:
        raise protocol.ProtocolError("malformed SASLInitialResponse message")
    return payload[:end].decode("utf-8", "replace"), payload[end + 1 :]


def _auth_info(user_name: str, user: UserPolicy | None) -> AuthInfo:
    return _mock_info(user_name) if user is None else user.scram_keys


def _mock_info(user_name: str) -> AuthInfo:
    salt = hmac.new(_MOCK_SECRET, user_name.encode(), hashlib.sha256).digest()[:16]
    return salt, secrets.token_bytes(32), secrets.token_bytes(32), 4096
