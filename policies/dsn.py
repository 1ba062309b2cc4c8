"""Connection strings in a policy: their syntax checked when the policy loads, and their
passwords kept out of every message that quotes them or libpq's words about them.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

__all__ = ["WITHHELD", "check_dsn", "masked_url", "passwords", "without_passwords"]

WITHHELD = "(libpq's message is not shown: it contains the password)"


def check_dsn(dsn: str) -> None:
    """Raise ValueError saying why libpq cannot parse ``dsn`` (never showing its password)."""
    try:
        conninfo_to_dict(dsn)
    except ProgrammingError as exc:
        why = (str(exc).strip().splitlines() or ["unparsable"])[0]
        raise ValueError(f"not a valid connection string: {without_passwords(why, dsn)}") from None


def passwords(dsn: str) -> set[str]:
    """Every form of a password a connection string carries, whether libpq can parse it or not."""
    found: set[str] = set()
    for match in re.finditer(r"://[^:/@?#]*:([^@/?#]*)@", dsn):
        found |= {match[1], unquote(match[1])}
    for match in re.finditer(r"password\s*=\s*('(?:[^'\\]|\\.)*'|[^\s&]+)", dsn):
        found |= {match[1], match[1].strip("'"), unquote(match[1])}
    try:
        password = conninfo_to_dict(dsn).get("password")
    except ProgrammingError:  # unparsable: the patterns above are all there is
        password = None
    if password:
        found.add(str(password))
    return {p for p in found if p}


def without_passwords(text: str, *dsns: str) -> str:
    """``text``, or ``WITHHELD`` when it contains a password of one of ``dsns``."""
    for dsn in dsns:
        if any(secret in text for secret in passwords(dsn)):
            return WITHHELD
    return text


def masked_url(url: str) -> str:
    """A URL as written, with the password of ``user:password@`` replaced by ``***``."""
    return re.sub(r"(://[^:/@?#]*:)([^@/?#]*)(@)", r"\1***\3", url)
