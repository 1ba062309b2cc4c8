"""Which LIKE/ILIKE patterns PostgreSQL rejects, decided from the pattern alone.

PostgreSQL checks a pattern only while it matches it against a value (``like_match.c``,
``MatchText``): a pattern ending in the escape character (backslash by default) fails with
22025 "LIKE pattern must not end with escape character" only when some row, or some value
of the column's statistics while planning, is compared with it. Such a pattern is an error
oracle on the rows, so dpproxy refuses it before it reaches the backend. Every other
pattern matches or does not match without error: ``%`` and ``_`` are wildcards, and the
escape character makes the character after it literal, whatever that character is.

An ``ESCAPE`` clause is not accepted at all (its escape string has rules of its own, and
the default backslash serves every need).
"""

from __future__ import annotations

__all__ = ["ESCAPE", "INVALID_PATTERN_HINT", "invalid_pattern_reason"]

ESCAPE = "\\"
INVALID_PATTERN_HINT = (
    "PostgreSQL rejects this pattern only when it compares a row with it, which would "
    "tell whether any row passed the rest of the WHERE. Escape a literal backslash as \\\\."
)


def invalid_pattern_reason(pattern: str) -> str | None:
    """Why PostgreSQL would reject ``pattern`` with the default escape, or None if it accepts it.

    Read left to right, an escape character takes the character after it. The run of escape
    characters the pattern ends with starts where a character is read afresh (what comes
    before it is not an escape character), so its pairs take each other and an odd run
    leaves the last one with nothing to take. Counted by ``rstrip``, not character by
    character in Python: a pattern parameter can be 16 MiB, and this runs on the event loop.
    """
    if (len(pattern) - len(pattern.rstrip(ESCAPE))) % 2:
        return "a LIKE/ILIKE pattern must not end with the escape character \\"
    return None
