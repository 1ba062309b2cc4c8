"""Client authentication against the policy's users.

The password exchange happens between the client and dpproxy only; the backend is
reached with the service role's own credentials.
"""

from __future__ import annotations

import asyncio
import hmac

from policies.errors import SQLSTATE, Refusal
from policies.model import UserPolicy

from . import protocol

__all__ = ["authenticate"]

_AUTH_OK = 0
_AUTH_CLEARTEXT = 3


async def authenticate(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    user_name: str,
    user: UserPolicy | None,
    max_bytes: int,
) -> None:
    """Run the password exchange; return on success, raise Refusal (28P01) on failure.

    An unknown user gets the same exchange and the same error as a wrong password, so the
    proxy does not reveal which login names exist.
    """
    writer.write(protocol.authentication(_AUTH_CLEARTEXT))
    await writer.drain()
    kind, payload = await protocol.read_message(reader, max_bytes)
    if kind != b"p":
        raise protocol.ProtocolError(f"expected a password message, got {kind!r}")
    supplied = protocol.decode_cstring(payload, "password")
    expected = user.password if user is not None else None
    if expected is None or not hmac.compare_digest(supplied.encode(), expected.encode()):
        raise Refusal(SQLSTATE.INVALID_PASSWORD, f'password authentication failed for user "{user_name}"')
    writer.write(protocol.authentication(_AUTH_OK))
