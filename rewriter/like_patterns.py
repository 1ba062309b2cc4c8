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

A pattern is also a timing lever (:func:`costly_pattern_reason`). At a ``%`` the matcher tries
each position of the value in turn and compares the pattern's next part (up to the following
``%`` or its end) there until a character differs; what follows a later ``%`` is tried once
its part has matched, and its answer is final. So one value of n characters costs at most
n × (the longest part after a ``%``) comparisons: ``'%' + 'a' * 2000 + 'b'`` took PostgreSQL
10 s on one 3 MB value of ``a``, ILIKE 17 s, against a millisecond for the table without it
(benchmarks/row_cost.py). Parts after a ``%`` are limited to :data:`MAX_PART_AFTER_PERCENT`
characters, which any search term fits in.

ILIKE costs each row it reaches its pattern's length too: in a database of a multibyte
encoding (UTF-8) PostgreSQL lowers the pattern, not only the value, on every call, about
27 ns a character, so ``id = 42 AND name ILIKE '<500,000 x>%'`` took 13.5 ms longer when row
42 was there, whatever its value. The ILIKE patterns of one statement (literals and bound
parameters together, and both queries of a series limit, which a row reaches both of) may hold
:data:`MAX_CASE_FOLDED_PATTERNS` bytes in all, counted in UTF-8 (:func:`case_folded_bytes`,
:func:`case_folded_refusal`). PostgreSQL lowers by the byte: counted by the character, 4,096
four-byte characters cost about 3.5 times as many ASCII ones (0.07 ms a row on 15 and 16,
benchmarks/results.md); counted by the byte, no character costs more at the limit than ASCII does.
"""

from __future__ import annotations

import re

__all__ = ["COSTLY_PATTERN_HINT", "ESCAPE", "INVALID_PATTERN_HINT", "MAX_CASE_FOLDED_PATTERNS", "MAX_PART_AFTER_PERCENT",
           "case_folded_bytes", "case_folded_refusal", "costly_pattern_reason", "invalid_pattern_reason", "longest_part_after_percent",
           "pattern_refusal"]

ESCAPE = "\\"
MAX_PART_AFTER_PERCENT = 64
"""The most characters (``_`` and an escaped character one each) a LIKE/ILIKE pattern may hold
after a ``%``, up to the next ``%`` or its end."""
MAX_CASE_FOLDED_PATTERNS = 4096
"""The most bytes (UTF-8) the ILIKE patterns of one statement may hold together (~0.1 ms a row)."""
COSTLY_PATTERN_HINT = (
    f"After each %, a pattern may hold at most {MAX_PART_AFTER_PERCENT} characters up to the next % or its "
    "end: PostgreSQL compares that part at every position of a value, so a long part makes one long value "
    "take measurably longer, which would tell whether a row is there. Match a shorter part of the text."
)
_LONG_PART = re.compile(f"%[^%]{{{MAX_PART_AFTER_PERCENT + 1}}}")

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


def costly_pattern_reason(pattern: str) -> str | None:
    """Why ``pattern`` is refused for its matching cost (see the module docstring), or None.

    Each escaped character is one literal character (an escaped ``%`` is no wildcard); the part
    before the first ``%`` is compared once, at the value's start, and is not limited. Escape
    characters pair from the left of each run of them, as the matcher reads them; so replacing
    the pairs first, then an escaped ``%``, leaves escape characters that each take the plain
    character after them, which stays. Done with ``str.replace`` and ``str.split``, linear and in
    C (a search, not a split: ``'%a' * 7_500_000`` would be 7.5 million strings): a pattern
    parameter can be 16 MiB, and this runs on the event loop.
    """
    if "%" not in pattern:
        return None
    if ESCAPE in pattern:
        pattern = pattern.replace(ESCAPE * 2, "x").replace(ESCAPE + "%", "x").replace(ESCAPE, "")
    found = _LONG_PART.search(pattern)
    if found is None:
        return None
    end = pattern.find("%", found.end())
    length = (len(pattern) if end < 0 else end) - found.start() - 1
    return (f"a LIKE/ILIKE pattern with {length} characters after a % (at most {MAX_PART_AFTER_PERCENT} "
            "up to the next % or its end)")


def longest_part_after_percent(pattern: str) -> int:
    """The characters of ``pattern``'s longest part after a ``%`` (up to the next ``%`` or its end),
    at most :data:`MAX_PART_AFTER_PERCENT` + 1; 0 without a ``%``. Escapes are read as in
    :func:`costly_pattern_reason`. A binary search of regular-expression searches, each linear and
    in C, rather than a split into the parts: a pattern can be 1 MiB of ``%a``."""
    if "%" not in pattern:
        return 0
    if ESCAPE in pattern:
        pattern = pattern.replace(ESCAPE * 2, "x").replace(ESCAPE + "%", "x").replace(ESCAPE, "")
    low, high = 0, MAX_PART_AFTER_PERCENT + 1  # a part of low characters exists; none longer than high
    while low < high:
        middle = (low + high + 1) // 2
        if re.search(f"%[^%]{{{middle}}}", pattern):
            low = middle
        else:
            high = middle - 1
    return low


def pattern_refusal(pattern: str) -> tuple[str, str] | None:
    """Why ``pattern`` is refused, and the hint to give, or None: PostgreSQL could reject it
    (:func:`invalid_pattern_reason`) or its matching could be slow on one long value
    (:func:`costly_pattern_reason`). The rule for a literal and for a bound parameter alike."""
    reason = invalid_pattern_reason(pattern)
    if reason is not None:
        return reason, INVALID_PATTERN_HINT
    reason = costly_pattern_reason(pattern)
    return None if reason is None else (reason, COSTLY_PATTERN_HINT)


def case_folded_bytes(pattern: str) -> int:
    """What an ILIKE pattern counts towards :data:`MAX_CASE_FOLDED_PATTERNS`: its bytes in UTF-8."""
    return len(pattern.encode("utf-8", "surrogatepass"))


def case_folded_refusal(pattern_bytes: int) -> tuple[str, str] | None:
    """Why ILIKE patterns of ``pattern_bytes`` bytes in all are refused, and the hint, or None."""
    if pattern_bytes <= MAX_CASE_FOLDED_PATTERNS:
        return None
    return (f"ILIKE patterns of {pattern_bytes} bytes in all (at most {MAX_CASE_FOLDED_PATTERNS} in one statement, "
            "counted in UTF-8)",
            "PostgreSQL lowers an ILIKE pattern again for each row it compares, so a long one makes each row that "
            "reaches it take measurably longer, which would tell whether a row passed the rest of the condition. "
            "Shorten the patterns, or use LIKE on lower(col) with a lower-case pattern.")
