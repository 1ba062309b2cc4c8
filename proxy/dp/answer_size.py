"""How long a post-processed DP answer is, measured on the backend, and the limit it is held to.

A post-processed answer (``rewriter.post_process``) is computed by the backend over the released
values, and its size is decided by the statement's text and by how long a released value's text
is (``format('%900000000s', count(*))``, wrappers that each double a value), never by the rows.
dpproxy would receive such an answer whole (libpq reads a DataRow whole before handing it over)
and hold it several times while it is relayed, in the process every session shares. So the outer
statement first runs as :func:`measuring_sql`, which sends back one number, and its answer is
asked for only when that number is within ``listen.max_answer_bytes``.

The size counted is the text PostgreSQL gives each row as a record, ``(v1,v2,…)``: every value
in its text output form, with the quotes a record adds around values holding commas, quotes or
spaces. It is the answer's text, a little more for the quotes, and not the binary form a client
may ask for (within a small factor of it).
"""

from __future__ import annotations

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import ResultSet
from proxy.backend.errors import BackendError

__all__ = ["AnswerTooLarge", "answer_bytes", "measuring_sql", "too_large_for_the_release", "too_large_from_the_text"]

_ALIAS = "dpproxy_answer"  # an outer alias: the measured statement reads no relation, so nothing in it can name it


def measuring_sql(sql: str) -> str:
    """``sql`` (an outer statement over a release) as one row: the bytes of its rows' text, NULL
    for no row. PostgreSQL evaluates every output column of every row as ``sql`` does, so it fails
    where ``sql`` fails, with the same error."""
    return (f"SELECT pg_catalog.sum(pg_catalog.octet_length(({_ALIAS}.*)::pg_catalog.text)) "
            f"FROM ({sql}) AS {_ALIAS}")


def answer_bytes(measured: ResultSet) -> int:
    """The size a :func:`measuring_sql` result gives (0: no row)."""
    value = measured.rows[0][0] if measured.rows else None
    return int(value) if value is not None else 0


def _message(size: int) -> str:
    return f"the answer would be {size} bytes of text, more than dpproxy sends for one DP statement (rule: answer-size)"


def _limit(limit: int) -> str:
    return f"dpproxy answers a DP statement with at most {limit} bytes of text (listen.max_answer_bytes)."


def too_large_from_the_text(size: int, limit: int, uncharged: str) -> Refusal:
    """The refusal of an answer whose text and fixed values (the cells' keys, NULL aggregates, a
    MODE's labels) already make it ``size`` bytes, past ``limit``: before anything is released,
    so ``uncharged`` (the hint's word that nothing was charged) ends the hint."""
    return Refusal(SQLSTATE.PROGRAM_LIMIT_EXCEEDED, _message(size),
                   f"{_limit(limit)} Ask for shorter values, or fewer rows. {uncharged}", "answer-size")


class AnswerTooLarge(BackendError):
    """A post-processed answer the released values made longer than ``listen.max_answer_bytes``:
    a function of the release and the statement's text only, never of a row, so it reaches the
    client as it is, as any post-processing error the release decides."""


def too_large_for_the_release(size: int, limit: int) -> AnswerTooLarge:
    """The error of an answer the released values make ``size`` bytes long, past ``limit``: after
    the charge, which stands, as for any post-processing error the release decides (the caller
    adds the charge as its DETAIL, and whether the release is kept for repeats). A series limit's
    ranking, whose outer statement only dpproxy reads, is held to the limit the same way: its
    release is kept too, and a repeat runs that statement over it again and fails alike."""
    return AnswerTooLarge(SQLSTATE.PROGRAM_LIMIT_EXCEEDED, _message(size),
                          hint=f"{_limit(limit)} The released values made this answer longer than its trial "
                               "before the charge.")
