"""A libpq result's rows, read into Python lists only when asked.

Reading a result row by row (one ``get_value`` call per value) holds the interpreter for
about a microsecond a value: the backend's counts of a percentile over a grid of 100,000 in
each cell of a histogram are hundreds of thousands of rows, and on the event loop their
reading held every other session of the process for half a second. An ``UnreadRows`` is read
where its caller chooses (a release thread, ``proxy.serving.executor._noised``), in the same
order and with the same values as on the loop.

libpq's result lives apart from its connection once it has been received, so it may be read
from any one thread while the connection carries the session's next request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from psycopg.pq.abc import PGresult

__all__ = ["UnreadRows", "text_rows"]


def text_rows(result: PGresult) -> list[list[bytes | None]]:
    """Every row of ``result``, each as its values' bytes (None for NULL), in order."""
    nfields = result.nfields
    get: Callable[[int, int], bytes | None] = result.get_value
    return [[get(r, c) for c in range(nfields)] for r in range(result.ntuples)]


@dataclass(frozen=True)
class UnreadRows:
    """The rows of a statement's text result, not yet read (``BackendSession.unread``)."""

    result: PGresult

    @property
    def type_oids(self) -> list[int]:
        """Each column's type OID, in order."""
        return [self.result.ftype(c) for c in range(self.result.nfields)]

    def read(self) -> list[list[bytes | None]]:
        """The rows as :func:`text_rows` gives them; the result is unchanged, and may be read again."""
        return text_rows(self.result)
