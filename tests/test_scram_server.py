"""dpproxy's SCRAM-SHA-256 server (proxy.wire.scram) against RFC 7677's vector, scramp's client,
and the messages it must refuse. The clients the suite drives (libpq through psql and psycopg,
asyncpg, pgjdbc, node-postgres, pg8000) log in through it in their own tests."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from scramp import ScramClient, ScramMechanism

from proxy.wire.scram import AuthInfo, ScramExchange, ScramFailure

# RFC 7677, section 3: user "user", password "pencil".
SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
NONCE = CLIENT_NONCE + SERVER_NONCE


def _info(password: str = "pencil", salt: bytes = SALT) -> AuthInfo:
    return ScramMechanism("SCRAM-SHA-256").make_auth_info(password, 4096, salt)


def _client_final(password: str, client_first_bare: str, server_first: str, without_proof: str) -> str:
    """What a client that knows ``password`` sends (RFC 5802, section 3)."""
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), SALT, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
    signature = hmac.digest(hashlib.sha256(client_key).digest(), auth_message, "sha256")
    proof = bytes(a ^ b for a, b in zip(client_key, signature))
    return f"{without_proof},p={base64.b64encode(proof).decode()}"


def test_rfc_7677_vector_is_answered_as_published():
    exchange = ScramExchange(_info(), SERVER_NONCE)
    assert exchange.server_first(f"n,,n=user,r={CLIENT_NONCE}") == (
        f"r={NONCE},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    final = f"c=biws,r={NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    assert exchange.server_final(final) == "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scramp_client_logs_in_and_verifies_the_server_signature():
    client = ScramClient(["SCRAM-SHA-256"], "user", "pencil")
    exchange = ScramExchange(_info())
    client.set_server_first(exchange.server_first(client.get_client_first()))
    client.set_server_final(exchange.server_final(client.get_client_final()))  # raises if v= is wrong


def test_wrong_password_fails():
    client = ScramClient(["SCRAM-SHA-256"], "user", "not-pencil")
    exchange = ScramExchange(_info())
    client.set_server_first(exchange.server_first(client.get_client_first()))
    with pytest.raises(ScramFailure):
        exchange.server_final(client.get_client_final())


@pytest.mark.parametrize("first, cbind", [
    ("n,,n=,r=abc", "biws"),  # libpq: the name is the startup packet's
    ("y,,n=*,r=abc", "eSws"),  # the client supports channel binding; dpproxy offers none
    ("n,,n=user,r=abc,x=ext", "biws"),  # an extension is ignored, and signed like the rest
])
def test_client_first_forms_postgresql_accepts_log_in(first: str, cbind: str):
    exchange = ScramExchange(_info(), "srv")
    server_first = exchange.server_first(first)
    bare = first.split(",", 2)[2]
    final = _client_final("pencil", bare, server_first, f"c={cbind},r=abcsrv")
    assert exchange.server_final(final).startswith("v=")


def test_client_final_extension_is_signed_and_accepted():
    exchange = ScramExchange(_info(), "srv")
    server_first = exchange.server_first("n,,n=,r=abc")
    assert exchange.server_final(_client_final("pencil", "n=,r=abc", server_first, "c=biws,r=abcsrv,x=1"))


@pytest.mark.parametrize("first", [
    "p=tls-server-end-point,,n=,r=abc",  # channel binding: not offered
    "n,a=other,n=,r=abc",  # an authorization identity: not supported
    "n,,m=ext,n=,r=abc",  # a mandatory extension
    "n,,n=,r=",  # an empty nonce
    "n,,n=,r=a b",  # a nonce that is not printable
    "n,,r=abc",  # no name attribute
    "n,,n=,r=abc,r=def",  # the nonce twice
    "x,,n=,r=abc",
    "n,,n=\x00,r=abc",
    "",
])
def test_malformed_client_first_fails(first: str):
    with pytest.raises(ScramFailure):
        ScramExchange(_info()).server_first(first)


@pytest.mark.parametrize("without_proof", [
    "c=eSws,r=abcsrv",  # the gs2 flag was n
    "c=biws,r=abcother",  # another exchange's nonce
    "c=biws,r=abc",  # the client's part alone
    "c=biws,r=abcsrv,p=AAAA",  # the proof twice
    "r=abcsrv,c=biws",
])
def test_client_final_that_does_not_continue_the_exchange_fails(without_proof: str):
    exchange = ScramExchange(_info(), "srv")
    server_first = exchange.server_first("n,,n=,r=abc")
    with pytest.raises(ScramFailure):
        exchange.server_final(_client_final("pencil", "n=,r=abc", server_first, without_proof))


@pytest.mark.parametrize("final", [
    "c=biws,r=abcsrv",  # no proof
    "c=biws,r=abcsrv,p=",
    "c=biws,r=abcsrv,p=AAAA",  # 3 bytes, not 32
    "c=biws,r=abcsrv,p=not base64!",
    "c=biws,r=abcsrv,p=" + base64.b64encode(bytes(32)).decode() + "x",
])
def test_malformed_proof_fails(final: str):
    exchange = ScramExchange(_info(), "srv")
    exchange.server_first("n,,n=,r=abc")
    with pytest.raises(ScramFailure):
        exchange.server_final(final)


def test_client_final_before_client_first_fails():
    with pytest.raises(ScramFailure):
        ScramExchange(_info(), "srv").server_final("c=biws,r=srv,p=" + base64.b64encode(bytes(32)).decode())


def test_server_nonce_is_fresh_and_printable():
    nonces = {ScramExchange(_info()).server_first("n,,n=,r=abc").split(",")[0] for _ in range(50)}
    assert len(nonces) == 50
    for nonce in nonces:
        assert all(0x21 <= ord(c) <= 0x7E and c != "," for c in nonce) and len(nonce) > len("r=abc") + 16
