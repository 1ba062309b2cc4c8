"""Stored password verifiers: PostgreSQL's SCRAM-SHA-256 format, as in pg_authid.rolpassword."""

from __future__ import annotations

import base64
import binascii

__all__ = ["ScramVerifier", "parse_scram_verifier"]

ScramVerifier = tuple[bytes, bytes, bytes, int]  # salt, StoredKey, ServerKey, iterations


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
