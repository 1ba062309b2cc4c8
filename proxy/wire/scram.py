"""The server side of SCRAM-SHA-256 (RFC 5802, RFC 7677), as PostgreSQL runs it: no channel
binding (only ``SCRAM-SHA-256`` is offered, so a client's gs2 flag is ``n`` or ``y``), no
authorization identity, the user name of the client-first message ignored (the startup
packet's is the one authenticated), extensions after the nonce ignored.

The exchange is two steps: ``server_first(client_first)`` and ``server_final(client_final)``.
Any message that does not follow the grammar, and a proof that does not match, raise
``ScramFailure``; the caller answers both as a failed password. The proof is checked in
constant time (``hmac.compare_digest``) and costs the same whether it matches or not.

The keys (salt, StoredKey, ServerKey, iterations) are derived from the password once, when the
policy loads (``policies.credentials``, with scramp); a login only computes the HMACs of the
exchange. This module replaces scramp's ``ScramServer`` for the login itself: that one
validates every message through per-character Python loops and per-attribute objects, which
was ~40 % of dpproxy's Python per client connection (benchmarks/profile.md, "Connection cost").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets

__all__ = ["AuthInfo", "ScramExchange", "ScramFailure"]

AuthInfo = tuple[bytes, bytes, bytes, int]
"""salt, StoredKey, ServerKey, iterations."""

# client-first-message = gs2-header client-first-message-bare; gs2-header = ("n" / "y") "," ","
# (an empty authzid: PostgreSQL supports none). client-first-message-bare = "n=" saslname ","
# "r=" c-nonce *("," extension); a leading "m=" (a mandatory extension) matches nothing here.
# An extension repeats none of its message's attributes.
_CLIENT_FIRST = re.compile(r"([ny]),,(n=[^,\x00]*,r=([\x21-\x2b\x2d-\x7e]+)(?:,(?![mnr]=)[A-Za-z]=[^,\x00]*)*)")
# client-final-message-without-proof = "c=" base64 "," "r=" nonce *("," extension)
_CLIENT_FINAL = re.compile(r"c=([A-Za-z0-9+/=]+),r=([\x21-\x2b\x2d-\x7e]+)(?:,(?![cpr]=)[A-Za-z]=[^,\x00]*)*")
_PROOF = ",p="
_KEY_BYTES = hashlib.sha256().digest_size


class ScramFailure(Exception):
    """The client's message is malformed, or its proof does not match the password."""


class ScramExchange:
    """One login's SCRAM-SHA-256 exchange against ``info`` (see the module docstring).

    ``server_nonce``: the server's part of the nonce, for tests against published vectors;
    by default 18 random bytes in base64, as PostgreSQL makes it.
    """

    __slots__ = ("_info", "_server_nonce", "_cbind", "_nonce", "_client_first_bare", "_server_first")

    def __init__(self, info: AuthInfo, server_nonce: str | None = None):
        self._info = info
        self._server_nonce = server_nonce or base64.b64encode(secrets.token_bytes(18)).decode("ascii")
        self._cbind = self._nonce = self._client_first_bare = self._server_first = ""

    def server_first(self, client_first: str) -> str:
        """The server-first message answering ``client_first``; ScramFailure if it is malformed."""
        found = _CLIENT_FIRST.fullmatch(client_first)
        if found is None:
            raise ScramFailure("malformed client-first message")
        flag, self._client_first_bare, client_nonce = found.groups()
        # c= of the final message is the gs2 header in base64: "n,," is "biws", "y,," is "eSws".
        self._cbind = "biws" if flag == "n" else "eSws"
        self._nonce = client_nonce + self._server_nonce
        salt, _, _, iterations = self._info
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode('ascii')},i={iterations}"
        return self._server_first

    def server_final(self, client_final: str) -> str:
        """The server-final message (``v=`` ServerSignature) if ``client_final`` proves the
        password; ScramFailure if it is malformed or its proof does not match."""
        if not self._server_first:
            raise ScramFailure("client-final message before the client-first message")
        without_proof, separator, proof_text = client_final.rpartition(_PROOF)
        found = _CLIENT_FINAL.fullmatch(without_proof) if separator else None
        if found is None:
            raise ScramFailure("malformed client-final message")
        cbind, nonce = found.groups()
        try:
            proof = binascii.a2b_base64(proof_text, strict_mode=True)
        except binascii.Error:
            raise ScramFailure("malformed proof in the client-final message") from None
        if cbind != self._cbind or nonce != self._nonce or len(proof) != _KEY_BYTES:
            raise ScramFailure("the client-final message does not continue this exchange")
        _, stored_key, server_key, _ = self._info
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.digest(stored_key, auth_message, "sha256")
        client_key = (int.from_bytes(proof) ^ int.from_bytes(client_signature)).to_bytes(_KEY_BYTES)
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), stored_key):
            raise ScramFailure("the proof does not match")
        return "v=" + base64.b64encode(hmac.digest(server_key, auth_message, "sha256")).decode("ascii")
