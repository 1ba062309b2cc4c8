"""A passthrough portal run in row-limited pieces inside a transaction block, as a backend cursor.

pgjdbc with a fetch size and autocommit off (DBeaver, DataGrip, Tableau, Spark's JDBC source),
asyncpg's ``cursor()`` and other clients bind a named portal in a block and Execute it a few
hundred rows at a time, and may stop early (a LIMIT in the tool, a grid closed). PostgreSQL runs
such a portal only as far as it is read and drops the rest at Close or COMMIT. dpproxy ran the
statement to its end and read its rest for nothing (COMMIT after 3,000,000 rows: 5.5-8 s), and
held rests in memory for portals interleaved with other statements (54000 past the cap).

libpq cannot send an Execute with a row limit, but a SQL cursor is a portal: the portal is
declared as a backend cursor of its own (``BackendSession.declare_portal``), each Execute of n
rows is ``FETCH FORWARD n`` (PortalSuspended when n came, as PostgreSQL's), and a Close, a new
Bind of its name or the block's end closes it there. A DP statement's portal never becomes
one: its result is one released answer, handed out as before.
"""

from __future__ import annotations

from policies.tables import TableRegistry
from proxy.backend.row_stream import Ended
from proxy.wire.protocol import Field
from rewriter.classify import ResolvedRelation
from rewriter.references import RelationRef
from rewriter.statements import Statement

__all__ = ["BackendPortal", "portal_cursor_name"]

_PREFIX = "dpproxy_portal_"


def portal_cursor_name(number: int) -> str:
    """The backend cursor name of a session's ``number``-th such portal: a plain identifier,
    never reused within the session, so a late Close can only find its own cursor or none."""
    return f"{_PREFIX}{number}"


class BackendPortal:
    """A client portal whose rows come from backend cursor ``name``, a FETCH per Execute.

    Contract: ``fields`` are the columns in the client's result formats; ``fetch_sql(limit)``
    is the FETCH one Execute sends; ``handed(rows, limit)`` records what that Execute gave and
    says whether the portal is suspended (the limit reached, as PostgreSQL: even with no row
    left) rather than complete. ``statement``, ``resolved`` and ``registry``: the query as it
    was judged, judged again after a reload before another row is handed out (as a passthrough
    cursor's). ``when_ended`` learns once how the result ended for the client (``Ended``): at
    its end, its error, its drop (Close, a new Bind, the block's end) or the session's end.
    """

    def __init__(self, name: str, fields: list[Field], statement: Statement,
                 resolved: dict[RelationRef, ResolvedRelation | None], registry: TableRegistry):
        self.name = name
        self.fields = fields
        self.statement = statement
        self.resolved = resolved
        self.registry = registry
        self.handed_out = 0
        self.complete = False
        self._ended_for_client: Ended | None = None

    def fetch_sql(self, limit: int) -> str:
        """The FETCH of one Execute of at most ``limit`` rows (0: all that are left)."""
        return f"FETCH {'ALL' if limit <= 0 else f'FORWARD {limit}'} FROM {self.name}"

    def handed(self, rows: int, limit: int) -> bool:
        """An Execute of at most ``limit`` rows (0: all) handed ``rows`` out; True: the portal
        is suspended, False: it has run to completion (and is reported ended)."""
        self.handed_out += rows
        if limit > 0 and rows == limit:
            return True
        self.complete = True
        self._report(None)
        return False

    def when_ended(self, report: Ended) -> None:
        """Call ``report`` once the client has had all it will get of this portal."""
        self._ended_for_client = report

    def failed(self, sqlstate: str) -> None:
        """A FETCH failed with ``sqlstate``: the portal's statement ended in that error."""
        self._report(sqlstate)

    def cut_off(self, sqlstate: str | None) -> None:
        """The portal ends before its result did: dropped (None) or the session's end."""
        self._report(sqlstate)

    def _report(self, sqlstate: str | None) -> None:
        report, self._ended_for_client = self._ended_for_client, None
        if report is not None:
            report(sqlstate, self.handed_out)
