"""SCRAM-SHA-256 verifiers: PostgreSQL's stored format (pg_authid.rolpassword), or derived from a password."""

from __future__ import annotations

import base64
import binascii

from scramp import ScramMechanism

__all__ = ["ScramVerifier", "derive_scram_verifier", "format_scram_verifier", "parse_scram_verifier"]

ScramVerifier = tuple[bytes, bytes, bytes, int]  # salt, StoredKey, ServerKey, iterations


def derive_scram_verifier(password: str, iterations: int = 4096) -> ScramVerifier:
    """A verifier of ``password`` with a fresh random salt: what PostgreSQL stores for it.

    PBKDF2 with 4096 rounds (PostgreSQL's default) takes milliseconds, so it is done once
    per user when the policy is loaded, not at each login.
    """
    salt, stored, server, rounds = ScramMechanism("SCRAM-SHA-256").make_auth_info(password, iteration_count=iterations)
    return salt, stored, server, rounds


def parse_scram_verifier(verifier: str) -> ScramVerifier:
    """Read ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (base64 parts)."""
    try:
        method, params, keys = verifier.split("$")
        iterations, salt = params.split(":")
        stored, server = keys.split(":")
        if method != "SCRAM-SHA-256" or int(iterations) < 1:
            raise ValueError(method)
        decoded = [base64.b64decode(part, validate=True) for part in (salt, stored, server)]
    except (ValueError, binascii.Error) as exc:
        raise ValueError("scram_verifier must look like pg_authid.rolpassword: "
                         "SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>") from exc
    if len(decoded[1]) != 32 or len(decoded[2]) != 32:
        raise ValueError("scram_verifier keys must be 32 bytes (SHA-256)")
    return decoded[0], decoded[1], decoded[2], int(iterations)


def format_scram_verifier(verifier: ScramVerifier) -> str:
    """``verifier`` as PostgreSQL stores it, the text ``parse_scram_verifier`` reads back."""
    salt, stored, server, iterations = verifier
    salt_b64, stored_b64, server_b64 = (base64.b64encode(part).decode("ascii") for part in (salt, stored, server))
    return f"SCRAM-SHA-256${iterations}:{salt_b64}${stored_b64}:{server_b64}"
