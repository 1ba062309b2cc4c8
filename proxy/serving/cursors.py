"""A session's SQL cursors: where each one lives, and how long.

A cursor over a DP answer (or a protected table's columns) is a ``KeptCursor``: the answer's
rows, released once at DECLARE, kept here (at most a DP answer's cells) and handed out by
FETCH and MOVE as PostgreSQL's portal would hand out a materialised result, position for
position (``KeptCursor.fetch`` follows PortalRunFetch). A cursor over a passthrough query is a
``BackendCursor``: it lives on the session's backend connection, and FETCH, MOVE and CLOSE
go there; dpproxy only knows its name, so that a name it does not know is never sent.

Lifetimes follow PostgreSQL: a cursor WITHOUT HOLD ends with its transaction; one declared
WITH HOLD lives on after COMMIT until CLOSE or the session's end, and one declared in a
transaction that rolls back (or in a savepoint rolled back to) goes with it. A backend
cursor WITH HOLD outliving its transaction pins the backend connection to the session
(``pins_backend``) until it is closed: given back to the pool, another session's connection
would hold it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from policies.errors import SQLSTATE, Refusal
from policies.tables import TableRegistry
from proxy.backend.connection import ResultSet
from rewriter.classify import ResolvedRelation
from rewriter.cursors import FETCH_ALL, CursorOptions, Fetch
from rewriter.references import RelationRef
from rewriter.statements import Statement

__all__ = ["MAX_CURSORS", "MAX_KEPT_BYTES", "BackendCursor", "Cursors", "KeptCursor", "no_such_cursor"]

# What one session may keep open: each DP cursor holds up to a histogram's cells in the process
# every session shares, and a repeat declares another for nothing (ε 0).
MAX_CURSORS = 1_000
MAX_KEPT_BYTES = 64 * 1024 * 1024


def no_such_cursor(name: str) -> Refusal:
    return Refusal("34000", f'cursor "{name}" does not exist')


@dataclass
class BackendCursor:
    """A cursor declared on the backend connection (its query a passthrough one).

    ``statement``, ``resolved`` and ``registry``: its DECLARE, the relations it was judged to
    read and the table registry it was judged under; after a reload its query is judged again,
    by the same relations, before it hands out another row.
    """

    options: CursorOptions
    created: int
    in_block: bool  # declared in the transaction still open (ends with it on a rollback)
    statement: Statement
    resolved: dict[RelationRef, ResolvedRelation | None]
    registry: TableRegistry


@dataclass
class KeptCursor:
    """A DP answer's released rows and PostgreSQL's portal state over them.

    ``position``: 0 before the first row, ``len(rows) + 1`` after the last, else the row the
    executor last returned (a tuplestore's read pointer); ``at_start``, ``at_end`` and
    ``portal_pos`` are the portal's own fields, which decide the results as they do in
    PostgreSQL's DoPortalRunFetch.
    """

    options: CursorOptions
    created: int
    in_block: bool
    result: ResultSet
    size: int = 0  # about the memory the kept rows take (their values, and some 64 bytes per value)
    position: int = 0
    at_start: bool = True
    at_end: bool = False
    portal_pos: int = 0
    _out: list[list[bytes | None]] = field(default_factory=list)

    def fetch(self, fetch: Fetch) -> list[list[bytes | None]] | int:
        """FETCH's rows, or MOVE's count, as PostgreSQL's PortalRunFetch gives them."""
        self._out = []
        emit = not fetch.move
        count = self._run_fetch(fetch.direction, fetch.count, emit)
        return self._out if emit else count

    def _run_fetch(self, direction: str, count: int, emit: bool) -> int:
        if direction == "FETCH_FORWARD" and count < 0:
            direction, count = "FETCH_BACKWARD", -count
        elif direction == "FETCH_BACKWARD" and count < 0:
            direction, count = "FETCH_FORWARD", -count
        elif direction == "FETCH_ABSOLUTE":
            if count > 0:
                if self.portal_pos == FETCH_ALL or count - 1 < self.portal_pos // 2:
                    self._rewind()
                    if count > 1:
                        self._select(True, count - 1, False)
                else:
                    pos = self.portal_pos + (1 if self.at_end else 0)
                    if count <= pos:
                        self._select(False, pos - count + 1, False)
                    elif count > pos + 1:
                        self._select(True, count - pos - 1, False)
                return self._select(True, 1, emit)
            if count < 0:
                self._select(True, FETCH_ALL, False)
                if count < -1:
                    self._select(False, -count - 1, False)
                return self._select(False, 1, emit)
            self._rewind()
            return self._select(True, 0, emit)
        elif direction == "FETCH_RELATIVE":
            if count > 0:
                if count > 1:
                    self._select(True, count - 1, False)
                return self._select(True, 1, emit)
            if count < 0:
                if count < -1:
                    self._select(False, -count - 1, False)
                return self._select(False, 1, emit)
            direction = "FETCH_FORWARD"
        forward = direction == "FETCH_FORWARD"
        if count == 0:
            on_row = not self.at_start and not self.at_end
            if not emit:
                return 1 if on_row else 0
            if on_row:
                self._select(False, 1, False)
                count, forward = 1, True
        if not forward and count == FETCH_ALL and not emit:
            moved = self.portal_pos
            if moved > 0 and not self.at_end:
                moved -= 1
            self._rewind()
            return moved
        return self._select(forward, count, emit)

    def _select(self, forward: bool, count: int, emit: bool) -> int:
        """PortalRunSelect over the kept rows: at most ``count`` rows (FETCH_ALL: all) one way."""
        if not forward:
            self._check_scroll()
        if (self.at_end if forward else self.at_start) or count <= 0:
            return 0
        rows = self.result.rows
        moved = 0
        while count == FETCH_ALL or moved < count:
            step = self.position + (1 if forward else -1)
            if not 1 <= step <= len(rows):
                self.position = len(rows) + 1 if forward else 0
                break
            self.position = step
            moved += 1
            if emit:
                self._out.append(rows[step - 1])
        ran_out = count == FETCH_ALL or moved < count
        if forward:
            if moved:
                self.at_start = False
            if ran_out:
                self.at_end = True
            self.portal_pos += moved
        else:
            if moved and self.at_end:
                self.at_end = False
                self.portal_pos += 1
            if ran_out:
                self.at_start = True
                self.portal_pos = 0
            else:
                self.portal_pos -= moved
        return moved

    def _rewind(self) -> None:
        if self.at_start and not self.at_end:
            return  # not moved yet: no NO SCROLL error, as in PostgreSQL
        self._check_scroll()
        self.position = self.portal_pos = 0
        self.at_start, self.at_end = True, False

    def _check_scroll(self) -> None:
        # A cursor declared without SCROLL or NO SCROLL scrolls: its rows are kept (PostgreSQL
        # decides from the plan, and would decide NO SCROLL for an aggregate's).
        if self.options.scroll is False:
            raise Refusal(SQLSTATE.OBJECT_NOT_IN_PREREQUISITE_STATE, "cursor can only scan forward",
                          "Declare it with SCROLL option to enable backward scan.")


Cursor = KeptCursor | BackendCursor


class Cursors:
    """The cursors of one session, by name, and the transaction events that end them."""

    def __init__(self) -> None:
        self._open: dict[str, Cursor] = {}
        self._created = 0
        self._savepoints: list[tuple[str, int]] = []  # open savepoints, and the count of cursors made before each

    def find(self, name: str) -> Cursor | None:
        return self._open.get(name)

    def get(self, name: str) -> Cursor:
        """Cursor ``name``; 34000 if there is none."""
        cursor = self._open.get(name)
        if cursor is None:
            raise no_such_cursor(name)
        return cursor

    def check_new(self, name: str, portal_named: bool = False) -> None:
        """Refuse declaring a cursor under a name in use (42P03): a cursor's, or with
        ``portal_named`` an extended-protocol portal's (a cursor is a portal in PostgreSQL); or
        beyond ``MAX_CURSORS`` open or ``MAX_KEPT_BYTES`` of DP cursors' rows (54000), before
        anything runs."""
        if portal_named or name in self._open:
            raise Refusal("42P03", f'cursor "{name}" already exists')
        kept = sum(c.size for c in self._open.values() if isinstance(c, KeptCursor))
        if len(self._open) >= MAX_CURSORS or kept >= MAX_KEPT_BYTES:
            raise Refusal(
                SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
                f"too many open cursors in this session: at most {MAX_CURSORS}, keeping at most "
                f"{MAX_KEPT_BYTES // (1024 * 1024)} MiB of DP answers' rows",
                "Close the cursors no longer needed (CLOSE name, CLOSE ALL).",
            )

    def keep_rows(self, name: str, options: CursorOptions, in_block: bool, result: ResultSet) -> None:
        """A DP cursor just declared, with its released ``result``."""
        self._created += 1
        size = sum(len(value or b"") + 64 for row in result.rows for value in row)
        self._open[name] = KeptCursor(options, self._created, in_block, result, size)

    def keep_backend(self, name: str, options: CursorOptions, in_block: bool, statement: Statement,
                     resolved: dict[RelationRef, ResolvedRelation | None], registry: TableRegistry) -> None:
        """A cursor just declared on the backend, by ``statement`` as judged (``BackendCursor``)."""
        self._created += 1
        self._open[name] = BackendCursor(options, self._created, in_block, statement, resolved, registry)

    def close(self, name: str | None) -> None:
        if name is None:
            self._open.clear()
        elif self._open.pop(name, None) is None:
            raise no_such_cursor(name)

    @property
    def on_backend(self) -> bool:
        """Whether a cursor lives on the backend connection (CLOSE ALL must reach it)."""
        return any(isinstance(c, BackendCursor) for c in self._open.values())

    @property
    def pins_backend(self) -> bool:
        """Whether a backend cursor outlives its transaction (WITH HOLD, committed or outside a
        block): the session's backend connection must not go back to the pool."""
        return any(isinstance(c, BackendCursor) and c.options.hold for c in self._open.values())

    def transaction_statement(self, node: dict[str, object], before: bytes) -> None:
        """A transaction statement (its parse tree ``node``) ran on the backend, which was in
        transaction status ``before``: the cursors it ended go."""
        kind = node.get("kind")
        name = str(node.get("savepoint_name"))
        if kind in ("TRANS_STMT_COMMIT", "TRANS_STMT_ROLLBACK") and before != b"I":
            # COMMIT of a failed block rolls back (PostgreSQL answers it ROLLBACK).
            self.transaction_ended(kind == "TRANS_STMT_COMMIT" and before == b"T")
        elif kind == "TRANS_STMT_SAVEPOINT":
            self._savepoints.append((name, self._created))
        elif kind in ("TRANS_STMT_RELEASE", "TRANS_STMT_ROLLBACK_TO"):
            index = next((i for i in range(len(self._savepoints) - 1, -1, -1) if self._savepoints[i][0] == name), None)
            if index is None:
                return
            made_before = self._savepoints[index][1]
            if kind == "TRANS_STMT_RELEASE":
                del self._savepoints[index:]
                return
            del self._savepoints[index + 1 :]
            self._drop(lambda c: c.in_block and c.created > made_before)

    def transaction_ended(self, committed: bool) -> None:
        """The transaction block ended: its cursors WITHOUT HOLD go, and on a rollback those
        declared in it WITH HOLD too; the others are no longer part of a block."""
        self._savepoints.clear()
        self._drop(lambda c: c.in_block and (not committed or not c.options.hold))
        for cursor in self._open.values():
            cursor.in_block = False

    def outside_block(self) -> None:
        """The backend is idle (no block): a cursor WITHOUT HOLD cannot be open. A block that
        ended unseen is taken as committed, which keeps a backend cursor WITH HOLD pinned."""
        if any(c.in_block for c in self._open.values()):
            self.transaction_ended(committed=True)

    def discard_all(self) -> None:
        """DISCARD ALL closed every cursor."""
        self._open.clear()
        self._savepoints.clear()

    def _drop(self, ends: Callable[[Cursor], bool]) -> None:
        for name in [name for name, cursor in self._open.items() if ends(cursor)]:
            del self._open[name]
