"""Run one statement for a session: resolve, classify, then answer it (DP, passthrough, command).

Shared by the simple and the extended query protocol, so a statement is judged the same way
whichever protocol carries it. Relations are resolved when a statement is planned; a plan
made before a change that can move ``search_path`` (SET, RESET, DISCARD, transaction end,
set_config) is planned again before it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Hashable, Protocol, Sequence, TypeVar

from sqlglot.errors import SqlglotError

from policies.errors import SQLSTATE, Refusal
from policies.model import Policy
from policies.tables import TableRegistry, quote_identifier
from proxy.backend.cancellable import CancellableWait
from proxy.backend.connection import BackendError, BackendLost, BackendSession, BackendUnavailable, BoundParams, ClientGone, ResultSet
from proxy.backend.errors import StepFailed
from proxy.backend.row_stream import RowStream
from proxy.backend.unread_rows import UnreadRows
from proxy.dp.answer import (
    DPAnswer, declared_keys, kept_series, numeric_scale, query_delta, ranking_params, release_cells, release_params,
    release_row, released_labels, result_fields, selection_candidates, series_release, trial_params, witness_params,
)
from proxy.dp.answer_size import answer_bytes, measuring_sql, too_large_for_the_release, too_large_from_the_text
from proxy.dp.answer_time import on_the_quantum, quantum_deadline
from proxy.dp.budget import BudgetKeeper
from proxy.dp.folding import bind_constants
from proxy.dp.narrowing import narrow_keys
from proxy.dp.percentile_params import bind_fractions, fraction_param_types
from proxy.dp.parameter_types import check_listed_parameters, check_numeric_parameters, check_parameter_types, settled_lists
from proxy.dp.release_units import release_count, release_units
from proxy.dp.repeats import RepeatStore
from proxy.ops.audit import AuditEntry, AuditLog
from proxy.ops.audit import fingerprint as audit_fingerprint
from proxy.ops.metrics import observe_statement
from proxy.wire.binary import BINARY_TYPES, DATE_TIME_TYPES, NOT_ISO, UnsupportedBinaryType, binary_from_text
from proxy.wire.encodings import untranslatable
from proxy.wire.protocol import Field, ProtocolError, formats_for
from proxy.wire.values import load_text
from rewriter.classify import (
    CloseCursor,
    ColumnsOnly,
    CopyOut,
    Deallocate,
    DeclareCursor,
    Decision,
    DpproxyCommand,
    DPQuery,
    FetchCursor,
    Passthrough,
    ResolvedRelation,
    classify,
)
from rewriter.dp_query import AggregateQuery, too_many_cells
from rewriter.limits import MAX_NESTING, MAX_OPERATOR_RUN, longest_operator_run, too_complex
from rewriter.references import RelationRef
from rewriter.rewrite import backend_sql, partition_seed, seeded, too_many_columns
from rewriter.sized_cache import sized_cache
from rewriter.sort_memory import memory_steps
from rewriter.statements import Statement, split_statements

from .copy_out import copy_messages
from .backend_portals import BackendPortal, portal_cursor_name
from .cursors import BackendCursor, Cursors, KeptCursor
from .implicit_block import (
    changes_settings, changes_transaction, ending_warning, outside_a_block_warning, refused_in_implicit,
)
from .relation_locks import RECOVERY_CONFLICTS, LocksNotTaken, with_locks
from .safe_snapshot import begins_serializable, in_safe_snapshot, take_snapshot
from .settings import SessionSettings

__all__ = ["Executor", "Plan", "StatementHost"]

_T = TypeVar("_T")
# A statement that fails on any backend, read-only, in any block, by itself: it fails the
# backend's block after a refusal (fail_block). Its text says why in the server's log.
_FAIL_BLOCK = "SELECT 1/0 AS dpproxy_refused_a_statement_of_this_block"

log = logging.getLogger("dpproxy.executor")

_NO_PARAMS = BoundParams((), (), ())
# A statement longer than this, or with a parse tree larger, is parsed and analysed in an
# analysis thread, not on the event loop that serves every session: analysing takes up to
# ~3 µs per byte of parse tree (pinning names to pg_catalog builds and prints pglast's tree
# in Python), so 16 KiB hold the loop for ~50 ms at most; 4 MiB, the limit, took 10 s.
_ANALYSED_IN_THREAD_BYTES = 16 * 1024
# Two threads at most, however many sessions send long statements: while they hold the
# interpreter, the loop waits for it behind two others at most (sys.getswitchinterval()
# each). pglast's parser and scanner let go of it while they run.
_ANALYSIS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpproxy-analysis")
# A release whose exponential mechanisms draw over this many candidates (answer.selection_candidates:
# a MODE or a percentile in each of many cells; ~1.4 ms per 1,000) runs in a thread of its own,
# where OpenDP samples outside the GIL: on the event loop, a percentile per day of a year over a
# grid of 100,000 held every other session of the process for about a minute (365 × ~0.16 s).
# The backend's exact counts are read and loaded in that thread too (_cells_released): a percentile
# per sex over 400,000 rows and such a grid came as ~200,000 rows (one per cell and grid index),
# whose reading held the loop ~0.5 s.
_OFF_LOOP_CANDIDATES = 20_000
_RELEASES = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dpproxy-release")
_AUDITED_PREFIX = 64 * 1024  # an unparsed string is audited by its beginning, not its megabytes
# How many relation names a session's resolutions remember (Executor._resolve): a statement
# may name 10,000 relations (~2 MB remembered), so the 1,024 statements' worth was gigabytes.
_RESOLVED_STATEMENTS = 1024
_RESOLVED_NAMES = 16 * 1024


@dataclass(frozen=True)
class Cost:
    """What a DP answer was charged, and what the user has left (None when not known)."""

    epsilon: float
    delta: float
    remaining_epsilon: float | None
    remaining_delta: float | None
    mechanisms: tuple[str, ...] | None = None  # released_mechanisms, for the audit line


@dataclass(frozen=True)
class Plan:
    """A statement and its decision, valid while the session's ``generation`` is unchanged.

    ``fingerprint`` is the statement's audit fingerprint, made with its analysis (in an
    analysis thread for a long one: scanning 1 MB of text takes up to half a second).
    """

    statement: Statement | None  # None: the empty query
    decision: Decision | None
    generation: int
    fingerprint: str


class StatementHost(Protocol):
    """What running a statement reads from the server, afresh for each one (a reload swaps them)."""

    policy: Policy
    registry: TableRegistry
    budget: BudgetKeeper
    audit: AuditLog
    repeats: RepeatStore[DPAnswer]


class Executor:
    """Statement execution for one client session on its backend connection."""

    def __init__(self, server: StatementHost, backend: BackendSession, user: str, client: str = ""):
        self.server = server
        self.backend = backend
        self.user = user
        self.client = client
        self.settings = SessionSettings(user)
        # Set by the session: drops client prepared statements (None: all); False if unknown.
        self.deallocate: Callable[[str | None], bool] = lambda name: name is None
        # Set by the session: whether the client has an extended-protocol portal of this name.
        self.portal_exists: Callable[[str], bool] = lambda name: False
        self.generation = 0  # bumped by anything that may change search_path
        self._resolved: dict[tuple[RelationRef, ...], dict[RelationRef, ResolvedRelation | None]] = {}
        self._resolved_names = 0  # in all of _resolved's keys
        self._resolved_generation = 0
        self._charged: Cost | None = None  # what the statement running now was charged so far
        # The quantised DP answer being computed or waiting for its boundary now: (its number,
        # when its quantum began, q in s); and the number of the DP answer being computed.
        self._quantised: tuple[int, float, float] | None = None
        self._computing: int | None = None
        self._answers = 0
        self._deferred: set[asyncio.Task[None]] = set()
        self._unstored: tuple[Hashable, DPAnswer] | None = None  # a fresh answer not sent yet
        self._analysis = CancellableWait()  # a long statement's analysis, until a CancelRequest
        self._streams: set[RowStream | BackendPortal] = set()  # results passed on as they arrive, not ended yet
        self._portals = 0  # backend portals declared (backend_portals.py), which name each one
        self._open_portals: set[BackendPortal] = set()  # those whose client portal is not gone yet
        self.cursors = Cursors()  # the session's SQL cursors (DECLARE ... CURSOR)
        self._serializable_block = False  # the transaction block open now began SERIALIZABLE
        self.implicit = False
        """An implicit transaction is open (``begin_implicit``): a simple Query's of several
        statements, or an extended-protocol pipeline's, until the session ends it; on the backend
        unless the pipeline has set only ``dpproxy.*`` so far."""
        self._pipeline_block = False  # the implicit transaction open is a pipeline's
        self._implicit_on_backend = False  # it is a BEGIN block on the backend (not dpproxy.* alone)

    def transaction_status(self) -> bytes:
        return self.backend.transaction_status

    # ------------------------------------------------------------ implicit transactions

    async def begin_implicit(self, pipeline: bool = False, on_backend: bool = True) -> None:
        """Open the implicit transaction PostgreSQL runs a query string of several statements
        in, or an extended-protocol pipeline up to its Sync (``implicit_block``); the session
        ends it with ``end_implicit``. A BEGIN inside turns it into a regular block, and a
        COMMIT or ROLLBACK inside ends it, as in PostgreSQL. ``pipeline``: a pipeline's.
        ``on_backend`` False: in dpproxy alone, for a ``SET dpproxy.*`` that needs no backend
        connection; opened on the backend too (called again) once a statement there needs it."""
        if on_backend and not self._implicit_on_backend:
            await self.backend.execute("BEGIN")
            self._implicit_on_backend = True
        if not self.implicit:
            self.settings.implicit_block(None)
        self.implicit = True
        self._pipeline_block = pipeline

    async def end_implicit(self, committed: bool) -> None:
        """Commit the implicit transaction, or roll it back (an error came before its end):
        the settings changed in it are undone, on the backend and in dpproxy, as PostgreSQL
        undoes them. Nothing if none is open. A DP answer given in it stays charged."""
        if not self.implicit:
            return
        self.implicit = False
        on_backend, self._implicit_on_backend = self._implicit_on_backend, False
        try:
            if on_backend:
                await self.backend.execute("COMMIT" if committed else "ROLLBACK")
        except BackendError:
            committed = False  # a COMMIT that fails rolls back
            raise
        finally:
            self.settings.implicit_block(committed)
            self.cursors.transaction_ended(committed)
            self.backend.pinned = self.cursors.pins_backend
            if not committed:
                self.generation += 1  # the rollback undid any SET in it

    async def fail_block(self) -> None:
        """After an error dpproxy sent itself (a refusal) in a transaction block the backend did
        not see fail: fail the block there too, as any error fails one on PostgreSQL. From here
        the backend refuses every statement but ROLLBACK, COMMIT (answered ROLLBACK) and
        ROLLBACK TO SAVEPOINT (25P02), the ReadyForQuery status is 'E', and dpproxy's own
        statements (DP answers, ``dpproxy.*``, cursors) are refused as in any failed block,
        before a charge. Nothing outside a block (an implicit transaction is rolled back at its
        end instead) or in one already failed (a backend error)."""
        if self.implicit or self.backend.transaction_status != b"T":
            return
        try:
            await self.backend.execute(_FAIL_BLOCK)
        except BackendLost:
            raise
        except BackendError:
            pass  # the failure asked for

    # ------------------------------------------------------------ planning

    async def split(self, sql: str) -> tuple[Statement, ...]:
        """The statements of a query string; a refusal of the whole string is audited.

        A string longer than ``listen.max_statement_bytes`` is refused (54000) unparsed; a long
        one is parsed in a worker thread (pglast releases the GIL), so other sessions keep running.
        """
        started = time.perf_counter()
        try:
            size = len(sql.encode("utf-8"))
            limit = self.server.policy.listen.max_statement_bytes
            if size > limit:
                raise Refusal(
                    SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
                    f"statement too long: {size} bytes (rule: statement-limits)",
                    f"dpproxy accepts statements of at most {limit} bytes (listen.max_statement_bytes).",
                    "statement-limits",
                )
            if size > _ANALYSED_IN_THREAD_BYTES:
                await self._give_back()  # no backend connection is held while the analysis waits its turn
                return await self._analysed(_split_and_fingerprint, sql)
            return split_statements(sql)
        except Refusal as exc:
            # Made in the analysis thread already when the string was long: taken from the cache.
            self._audit_soon(_fingerprint(sql[:_AUDITED_PREFIX]), "refused", exc.rule, None, started)
            raise

    async def prepare(self, text: str) -> Plan:
        """Plan the one statement of an extended-protocol Parse."""
        statements = await self.split(text)
        if len(statements) > 1:
            raise Refusal(SQLSTATE.SYNTAX_ERROR, "cannot insert multiple commands into a prepared statement")
        if not statements:
            return Plan(None, None, self.generation, _fingerprint(""))
        return await self.plan(statements[0])

    def parameter_count(self, plan: Plan) -> int:
        return plan.statement.references.params if plan.statement is not None else 0

    def plan_bytes(self, plan: Plan) -> int:
        """About the memory ``plan`` keeps: its statement's text and parse tree, which takes
        some ten times its JSON as Python objects (a 120 KB IN list's, 36 MB)."""
        statement = plan.statement
        return 0 if statement is None else len(statement.text) + 10 * statement.tree_bytes

    async def plan(self, statement: Statement) -> Plan:
        started = time.perf_counter()
        long = max(len(statement.text), statement.tree_bytes) > _ANALYSED_IN_THREAD_BYTES
        if long:
            await self._give_back()  # no backend connection is held while the analysis waits its turn
            fingerprint = await self._analysed(_fingerprint, statement.text)
        else:
            fingerprint = _fingerprint(statement.text)
        try:
            resolved = await self._resolve(statement.references.relations)
        except (BackendError, ClientGone) as exc:  # ClientGone: its checkout waited, the client went
            self._audit_soon(fingerprint, "error", exc.sqlstate, None, started)
            raise
        try:
            try:
                if long:
                    # Resolving the relations took a backend connection: it serves other
                    # sessions while this analysis takes seconds, or waits for a thread.
                    await self._give_back()
                    decision = await self._analysed(classify, statement, resolved, self.server.registry, self.user)
                else:
                    decision = classify(statement, resolved, self.server.registry, self.user)
            except RecursionError:
                # A combination of nesting within every single limit can still be too deep.
                raise too_complex("too deeply nested to analyse", MAX_NESTING, "levels of nesting") from None
            except SqlglotError as exc:
                # PostgreSQL parsed it but the DP-query analyser cannot (a form sqlglot cannot read;
                # parameters reach it as placeholders, rewriter/sqlglot_parse.py): refused from the text alone.
                raise Refusal(
                    SQLSTATE.DP_QUERY_SHAPE,
                    "cannot analyse this statement (rule: unparsed)",
                    "Rewrite the statement, e.g. put literals in place of parameters.",
                    "unparsed",
                ) from exc
        except Refusal as exc:
            self._audit_soon(fingerprint, "refused", exc.rule, None, started)
            raise
        return Plan(statement, decision, self.generation, fingerprint)

    async def _resolve(self, refs: tuple[RelationRef, ...]) -> dict[RelationRef, ResolvedRelation | None]:
        """Relation names to backend identities, remembered until search_path may have moved.

        Only dpproxy's own sessions could move it, and every such statement bumps the
        generation; relations created or dropped meanwhile by an administrator are seen
        after the next generation change (a reload is one; analysts cannot create
        relations). Until then a passthrough statement still reads the relations it was
        judged by: it names each with the schema it was resolved in (rewriter.qualify).
        """
        if not refs:
            return {}
        if self._resolved_generation != self.generation:
            self._resolved.clear()
            self._resolved_names = 0
            self._resolved_generation = self.generation
        resolved = self._resolved.get(refs)
        if resolved is None:
            if self.backend.transaction_status != b"I" and self._may_serialize():
                # The first read of a serializable block waits for its snapshot: say so if it fails.
                await take_snapshot(self.backend)
            resolved = await self.backend.resolve(refs)
            if len(self._resolved) >= _RESOLVED_STATEMENTS or self._resolved_names + len(refs) > _RESOLVED_NAMES:
                self._resolved.clear()
                self._resolved_names = 0
            self._resolved[refs] = resolved
            self._resolved_names += len(refs)
        return resolved

    async def _current(self, plan: Plan) -> Plan:
        if plan.statement is None or plan.generation == self.generation:
            return plan
        return await self.plan(plan.statement)

    # ------------------------------------------------------------ describing

    async def describe(self, plan: Plan, param_types: tuple[int, ...]) -> tuple[list[int], list[Field] | None]:
        """Parameter types and columns of a prepared statement, without running it."""
        plan = await self._current(plan)
        decision = plan.decision
        if decision is None:
            return [], None
        if isinstance(decision, DPQuery):
            if self.backend.transaction_status != b"I" and self._may_serialize():
                await take_snapshot(self.backend)  # the parse takes the block's first snapshot
            described = settled_lists(decision.plan, param_types)
            params, _ = await self.backend.describe(backend_sql(described, seed=0),
                                                    fraction_param_types(described, param_types))
            return params, await self._dp_fields(decision.plan)
        if isinstance(decision, ColumnsOnly):
            params, fields = await self.backend.describe(decision.sql, param_types)
            return params, fields
        if isinstance(decision, DpproxyCommand):
            return [], self.settings.fields(decision)
        if isinstance(decision, (Deallocate, CopyOut, CloseCursor)):
            return [], None  # COPY returns no row description, as in PostgreSQL
        if isinstance(decision, DeclareCursor):
            params, _ = await self.describe(replace(plan, decision=decision.inner), param_types)
            return params, None  # DECLARE returns no rows; its cursor's are described by name
        if isinstance(decision, FetchCursor):
            return [], None if decision.fetch.move else await self.cursor_fields(decision.fetch.name)
        assert isinstance(decision, Passthrough)
        params, fields = await self.backend.describe(decision.sql, param_types)
        return params, fields or None

    async def _dp_fields(self, plan: AggregateQuery) -> list[Field]:
        """A DP answer's columns; a post-processed one's from describing its outer statement
        (over the released values only, never the table)."""
        if plan.post is None:
            return result_fields(plan)
        _, fields = await self.backend.describe(plan.post.sql, release_params(plan, None).types)
        return fields

    async def cursor_fields(self, name: str) -> list[Field] | None:
        """The columns of SQL cursor ``name`` (None: no such cursor), as a Describe of the
        portal of that name gives them in PostgreSQL, where cursors are portals."""
        cursor = self.cursors.find(name)
        if isinstance(cursor, KeptCursor):
            return cursor.result.fields
        if isinstance(cursor, BackendCursor):
            return await self.backend.describe_portal(name)
        return None

    def has_cursor(self, name: str) -> bool:
        """Whether the session has SQL cursor ``name``, a portal's name in PostgreSQL too."""
        return self.cursors.find(name) is not None

    async def known_fields(self, plan: Plan, result_formats: tuple[int, ...]) -> list[Field] | None:
        if isinstance(plan.decision, (CopyOut, DeclareCursor, CloseCursor)):
            # NoData, as PostgreSQL describes a COPY or a DECLARE: run here, a DP one was charged
            # at Describe, for an answer a Close could then throw away.
            return []
        fetch = plan.decision.fetch if isinstance(plan.decision, FetchCursor) else None
        if fetch is not None and fetch.move:
            return []
        if fetch is not None and isinstance(self.cursors.find(fetch.name), KeptCursor):
            fields = await self.cursor_fields(fetch.name) or []
        elif isinstance(plan.decision, DPQuery):
            fields = await self._dp_fields(plan.decision.plan)
        elif isinstance(plan.decision, DpproxyCommand):
            fields = self.settings.fields(plan.decision) or []
        else:
            return None
        try:
            formats = formats_for(result_formats, len(fields))
        except ProtocolError as exc:  # the statement fails, as at Execute; the session goes on
            raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, exc.message) from None
        return [f if f.format == fmt else replace(f, format=fmt) for f, fmt in zip(fields, formats)]

    # ------------------------------------------------------------ running

    async def run(
        self, plan: Plan, params: BoundParams = _NO_PARAMS, result_formats: tuple[int, ...] = (), simple: bool = False
    ) -> tuple[ResultSet, list[str]]:
        """Run a planned statement; return its result in the requested formats and its notices.

        ``simple``: it came in a simple Query, where a FETCH from a BINARY cursor is binary.

        The statement's audit line and metrics are recorded just after the session has
        written the answer (on the event loop's next turn), not in its latency. Every
        outcome leaves one line carrying what the statement was charged: a DP query charged
        and then failed, cancelled or cut off by the session's end is an ``error`` line
        with its ε, so that the audit log and ``dpproxy_epsilon_charged_total`` add up to
        what the budget keeper spent.
        """
        started = time.perf_counter()
        plan = await self._current(plan)
        if _reads_backend_rows(plan.decision) and not self.backend.holds_connection:
            # Its rows come as they are: judged again if a reload (or the registry's own check)
            # came while it waited for a pooled connection, which an analyst can make it do
            # for as long as they like by holding every connection in a transaction block.
            try:
                await self.backend.connection()
            except (BackendError, ClientGone) as exc:  # ClientGone: dropped while it waited, uncharged
                self._audit_soon(plan.fingerprint, "error", exc.sqlstate, None, started)
                raise
            plan = await self._current(plan)
        fingerprint = plan.fingerprint
        on_backend = not isinstance(plan.decision, DpproxyCommand)
        if (not simple and self.transaction_status() == b"I" and (not self.implicit or on_backend)
                and (changes_settings(plan.statement, plan.decision) or changes_transaction(plan.decision))):
            # Its change lasts until the Sync, or is undone if a later message of the pipeline
            # fails before it, as in PostgreSQL (implicit_block.py).
            try:
                await self.begin_implicit(pipeline=True, on_backend=on_backend)
            except (BackendError, ClientGone) as exc:
                self._audit_soon(fingerprint, "error", exc.sqlstate, None, started)
                raise
        self._charged = None
        try:
            result, notices, cost = await self._run(plan, params, result_formats, simple=simple)
        except Refusal as exc:
            if self._charged is not None:
                self._audit_soon(fingerprint, "error", exc.sqlstate, self._charged, started)
            else:
                self._audit_soon(fingerprint, "refused", exc.rule, None, started)
            raise
        except (BackendError, ClientGone) as exc:  # ClientGone: a second checkout waited, the client went
            self._audit_soon(fingerprint, "error", exc.sqlstate, self._charged, started)
            raise
        except asyncio.CancelledError:  # the session is being ended (shutdown) mid-statement
            self._audit(fingerprint, "error", SQLSTATE.ADMIN_SHUTDOWN, self._charged, time.perf_counter() - started)
            raise
        except Exception:  # a bug: the session ends with XX000, but the charge is still accounted for
            self._audit_soon(fingerprint, "error", SQLSTATE.INTERNAL_ERROR, self._charged, started)
            raise
        if self.implicit and self._pipeline_block and plan.statement is not None:
            warning = outside_a_block_warning(plan.statement, plan.decision)
            if warning is not None:
                notices = [*notices, warning]
        decision = plan.decision.inner if isinstance(plan.decision, (CopyOut, DeclareCursor)) else plan.decision
        kind = "dp" if isinstance(decision, (DPQuery, ColumnsOnly)) else "command" if isinstance(decision, DpproxyCommand) else "passthrough"
        if isinstance(decision, (FetchCursor, CloseCursor)) and result.relayed is None and result.stream is None:
            kind = "command"  # a DP cursor's kept rows, or a CLOSE: nothing read on the backend
        if result.stream is not None:
            self._audit_at_end(result.stream, fingerprint, started)
        else:
            self._audit_soon(fingerprint, kind, None, cost, started, _rows(result) if kind == "passthrough" else None)
        return result, notices

    def _audit_at_end(self, stream: RowStream | BackendPortal, fingerprint: str, started: float) -> None:
        """A result passed on as it arrives is audited when it ends for the client, with its
        outcome and its rows: an error part-way through is the statement's outcome."""
        self._streams.add(stream)

        def ended(sqlstate: str | None, rows: int) -> None:
            self._streams.discard(stream)
            decision = "passthrough" if sqlstate is None else "error"
            self._audit_soon(fingerprint, decision, sqlstate, None, started, rows)

        stream.when_ended(ended)

    def close(self, sqlstate: str | None) -> None:
        """The session ends: results still being passed on are audited as they were left,
        with ``sqlstate`` (None: the client said Terminate, closing its portals as it may)."""
        for stream in list(self._streams):
            stream.cut_off(sqlstate)

    async def _run(
        self, plan: Plan, params: BoundParams, result_formats: tuple[int, ...], relay: bool = True,
        simple: bool = False,
    ) -> tuple[ResultSet, list[str], Cost | None]:
        """``relay``: a passthrough result may stay as DataRow messages (``ResultSet.relayed``);
        False where dpproxy reads its rows (COPY writes them in its own framing)."""
        decision = plan.decision
        if decision is None:
            return ResultSet([], [], ""), [], None
        if self._implicit_on_backend and plan.statement is not None:
            refusal = refused_in_implicit(plan.statement, decision, self._pipeline_block)
            if refusal is not None:
                raise refusal
        if isinstance(decision, (DeclareCursor, FetchCursor, CloseCursor)):
            return await self._cursor_statement(plan, decision, params, result_formats, simple)
        if isinstance(decision, DPQuery):
            assert plan.statement is not None
            quantum_ms = decision.plan.table.policy.answer_quantum_ms
            # What other sessions can see of this answer changes only at its boundary: its
            # backend connection is kept through the wait (another session waiting for it would
            # otherwise learn when the rows were computed) and a fresh answer is stored for
            # repeats then (a repeat found before would tell the same).
            self._answers += 1
            answer = self._answers
            try:
                async with on_the_quantum(quantum_ms) as started:
                    self._quantised = (answer, started, quantum_ms / 1000) if quantum_ms > 0 else None
                    self._computing = answer
                    try:
                        result, notices, cost = await self._answer_dp(decision, params, plan.fingerprint,
                                                                      result_formats)
                    finally:
                        self._computing = None
            finally:
                self._quantised = None  # through the wait: a cancel then is put off to the boundary too
                self._store_for_repeats()
            # Notes from the statement and the policy alone (rewriter/category_notes.py), whatever
            # the answer was (fresh, a repeat, no row): they are not part of the release.
            return _apply_formats(result, result_formats), [*decision.plan.notes, *notices], cost
        if isinstance(decision, DpproxyCommand):
            result, notices = await self.settings.run(
                decision, self.server.policy, self.server.budget, self.server.registry, self.backend.transaction_status
            )
            return _apply_formats(result, result_formats), notices, None
        if isinstance(decision, CopyOut):
            return await self._copy_out(plan, decision, params)
        if isinstance(decision, ColumnsOnly):
            # Parse and Describe only: the table is never read, so nothing is charged.
            _, fields = await self.backend.describe(decision.sql, params.types)
            return _apply_formats(ResultSet(fields, [], "SELECT 0"), result_formats), [], None
        if isinstance(decision, Deallocate):
            if self.backend.transaction_status == b"E":
                raise Refusal(SQLSTATE.IN_FAILED_TRANSACTION,  # as PostgreSQL: the statements stay
                              "current transaction is aborted, commands ignored until end of transaction block")
            if not self.deallocate(decision.name):
                raise Refusal("26000", f'prepared statement "{decision.name}" does not exist')
            return ResultSet([], [], "DEALLOCATE" if decision.name else "DEALLOCATE ALL"), [], None
        assert isinstance(decision, Passthrough) and plan.statement is not None
        converts = self._implicit_on_backend and _begins(plan.statement)
        if converts:
            # BEGIN turns the implicit transaction into a regular block, as in PostgreSQL. Its
            # options (an isolation level, READ ONLY, DEFERRABLE) still apply to the block: sent
            # to the backend, already in a block, whose warning that one is open is dropped.
            self.implicit = self._implicit_on_backend = False
            self._serializable_block = begins_serializable(plan.statement.node)
            if not plan.statement.node.get("options"):
                return ResultSet([], [], "BEGIN"), [], None
        if plan.statement.kind == "DiscardStmt" and plan.statement.node.get("target") == "DISCARD_ALL":
            self.deallocate(None)
        if _may_move_search_path(plan.statement):
            self.generation += 1
        if _may_change_settings(plan.statement):
            self.backend.state_may_change()  # read back at release, restored at the next checkout
        uniform = result_formats[0] if len(result_formats) == 1 else 0
        with_params = params if params.values or uniform else None
        status = self.backend.transaction_status
        if plan.statement.kind == "TransactionStmt" and plan.statement.node.get("kind") == "TRANS_STMT_SAVEPOINT":
            self.settings.savepoint_room()
        # As one statement (the extended protocol): PostgreSQL refuses a text that holds more,
        # so that nothing dpproxy did not split and classify itself can run, whatever reader
        # might one day see the text otherwise (a client encoding once made a SET's value
        # end early for PostgreSQL and hid a SELECT of a protected table after it).
        if relay:
            # The fast path: classify has said Passthrough and decision.sql is already the
            # rewritten SQL (neutralised columns, qualified names); its result needs no change,
            # so its rows go out as the DataRows libpq's values make, never decoded, and a
            # large one as it arrives (proxy/backend/row_stream.py).
            try:
                result = await self.backend.relay(decision.sql, with_params, result_formats, one_statement=True)
            except ProtocolError as exc:
                raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, exc.message) from None
        else:
            result = await self.backend.execute(decision.sql, with_params, uniform, one_statement=True)
            result = _apply_formats(result, result_formats)
        if converts:
            return result, [n for n in result.notices if getattr(n, "sqlstate", None) != _ALREADY_IN_PROGRESS], None
        if plan.statement.kind == "TransactionStmt" and self.implicit and self.backend.transaction_status == b"I":
            # A COMMIT or ROLLBACK ended the implicit transaction (refused above WITH CHAIN); what
            # follows it in the pipeline or query string runs in a new one (session.py).
            ended = ending_warning(plan.statement) if status != b"I" else None  # else the backend's own
            committed = status != b"E" and plan.statement.node.get("kind") == "TRANS_STMT_COMMIT"
            self.implicit = self._implicit_on_backend = False
            self.settings.implicit_block(committed)
            self.cursors.transaction_ended(committed)
            self.backend.pinned = self.cursors.pins_backend
            return result, [*result.notices, ended] if ended is not None else result.notices, None
        if plan.statement.kind == "TransactionStmt":
            self.settings.transaction_statement(plan.statement.node, status, self.backend.transaction_status)
            self.cursors.transaction_statement(plan.statement.node, status)
            self.backend.pinned = self.cursors.pins_backend
            if status == b"I" and _begins(plan.statement):
                self._serializable_block = begins_serializable(plan.statement.node)
                self.implicit = False  # one in dpproxy alone is now the block's start (its SET included)
        if plan.statement.kind == "DiscardStmt" and plan.statement.node.get("target") == "DISCARD_ALL":
            self.cursors.discard_all()  # PostgreSQL's DISCARD ALL closes every cursor
            self.backend.pinned = False
        resets, name = _resets(plan.statement)
        if resets:
            await self.backend.restore_startup(name)
            if name is None:
                self.settings.reset_all()  # RESET ALL and DISCARD ALL reset dpproxy.* too, as PostgreSQL's custom settings
        return result, result.notices, None

    # ------------------------------------------------------------ portals run in pieces

    async def open_portal(
        self, plan: Plan, params: BoundParams, result_formats: tuple[int, ...]
    ) -> BackendPortal | None:
        """A portal of ``plan`` run in row-limited pieces as a backend cursor of its own
        (backend_portals.py), declared now; None where it runs as any statement: outside a
        transaction block on the backend (PostgreSQL drops the portal at Sync; ended early, its
        statement is cancelled), for anything but a passthrough SELECT (a DP answer is one
        released row; SHOW, EXPLAIN and the like are no cursor's query), and for a SELECT that
        may change settings (set_config). Its audit line is written when it ends for the client.
        """
        started = time.perf_counter()
        try:
            plan = await self._current(plan)
        except Refusal as exc:  # refused under a policy reloaded since its Parse, as ``run`` audits it
            self._audit_soon(plan.fingerprint, "refused", exc.rule, None, started)
            raise
        decision, statement = plan.decision, plan.statement
        if not isinstance(decision, Passthrough) or statement is None or statement.kind != "SelectStmt" \
                or _may_change_settings(statement) or _may_move_search_path(statement) \
                or self.backend.transaction_status != b"T":
            return None
        self._portals += 1
        while self.cursors.find(portal_cursor_name(self._portals)) is not None:  # a client's SQL cursor's name
            self._portals += 1
        name = portal_cursor_name(self._portals)
        try:
            resolved = await self._resolve(statement.references.relations)
            fields = await self.backend.declare_portal(name, decision.sql, params if params.values else None)
            try:
                formats = formats_for(result_formats, len(fields))
            except ProtocolError as exc:  # the statement fails, as at Execute; the session goes on
                self.backend.drop_portal(name)
                raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, exc.message) from None
        except (BackendError, Refusal) as exc:
            self._audit_soon(plan.fingerprint, "error", exc.sqlstate, None, started)
            raise
        fields = [f if f.format == fmt else replace(f, format=fmt) for f, fmt in zip(fields, formats)]
        portal = BackendPortal(name, fields, statement, resolved, self.server.registry)
        self._audit_at_end(portal, plan.fingerprint, started)
        self._open_portals.add(portal)
        return portal

    async def fetch_portal(
        self, portal: BackendPortal, limit: int, result_formats: tuple[int, ...]
    ) -> tuple[ResultSet, list[str]]:
        """One Execute's rows of ``portal`` (at most ``limit``, 0: the rest), as the backend
        sends them, in the client's formats; its error as the statement's, the portal then
        ended. After a reload its query is judged again first (``_judge_again``)."""
        if portal.complete:  # as PostgreSQL's portal run to its end: no row, nothing asked of the backend
            return ResultSet(portal.fields, [], "SELECT 0", relayed=[]), []
        try:
            self._judge_again(portal)
            # Its text is dpproxy's own, one statement: a simple Query where it may be (text results).
            result = await self.backend.relay(portal.fetch_sql(limit), None, result_formats)
        except BackendError as exc:
            portal.failed(exc.sqlstate)
            raise
        return result, result.notices

    def drop_portal(self, portal: BackendPortal) -> None:
        """The client's portal is gone (Close, a new Bind of its name, its transaction's end):
        its backend cursor is closed before the next request, and its audit line written."""
        self._open_portals.discard(portal)
        self.backend.drop_portal(portal.name)
        portal.cut_off(None)

    async def _analysed(self, function: Callable[..., _T], *args: Any) -> _T:
        """``function(*args)`` run in an analysis thread (see ``_ANALYSIS``). A CancelRequest
        ends the wait with 57014, as PostgreSQL's ends a statement's parse: the statement was
        not sent, and an analysis still queued for a thread never runs."""
        return await self._analysis.wait(
            asyncio.get_running_loop().run_in_executor(_ANALYSIS, partial(function, *args)),
            lambda: Refusal(SQLSTATE.QUERY_CANCELED, "canceling statement due to user request"))

    async def cancel(self) -> None:
        """A CancelRequest for this session: a long statement's analysis stops being waited for;
        else what runs on its backend connection is cancelled now or, while a quantised DP
        answer is being computed, at its next quantum boundary.

        Whether a cancel sent t into a DP answer stops it says whether the backend was still
        computing at t, which the rows decide: sent at once, a cancel 50 ms in would fail an
        answer that needed 60 ms and not one that needed 40, both arriving at one quantum.
        Deferred to the boundary, it says only which multiple of the quantum the answer needed,
        what its arrival says already. A cancel that comes after the computation (during the
        wait) is put off alike and then finds nothing to cancel, as in PostgreSQL: sent at once,
        it would have marked the connection to be closed rather than pooled, which the
        session's next statement sees (another backend), only when the rows had been computed
        before it came.
        """
        if self._analysis.cancel():  # nothing was sent yet: the wait just ends
            return
        quantised = self._quantised
        if quantised is None:
            await self.backend.cancel()
            return
        answer, started, quantum_s = quantised
        deadline = quantum_deadline(started, time.monotonic(), quantum_s)

        async def at_the_boundary() -> None:
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            if self._computing == answer:
                await self.backend.cancel()

        task = asyncio.ensure_future(at_the_boundary())
        self._deferred.add(task)  # a reference, until it is done
        task.add_done_callback(self._deferred.discard)

    def _store_for_repeats(self) -> None:
        """Store the fresh answer just sent (or failed after its charge) for its repeats."""
        if self._unstored is not None:
            key, answer = self._unstored
            self._unstored = None
            self.server.repeats.put(key, answer)

    async def _give_back(self) -> None:
        """While a long statement waits for its analysis, the backend connection serves other
        sessions (outside a transaction block; inside one the session keeps it). Not while a
        DP answer waits for its quantum: given back then, it would tell a session waiting for
        it when the rows had been computed."""
        try:
            await self.backend.release()
        except BackendError:
            pass  # given back, or found lost, when the client is answered ReadyForQuery

    async def _copy_out(
        self, plan: Plan, decision: CopyOut, params: BoundParams
    ) -> tuple[ResultSet, list[str], Cost | None]:
        """The same release as the SELECT (same ε, repeat key, notice), in COPY's framing.

        A binary COPY asks the inner statement for binary columns, as a Bind would: a DP
        answer with a column dpproxy cannot send in binary is refused before its charge."""
        # The statement stays the COPY: the ledger's charge carries the audit line's fingerprint.
        formats = (1,) if decision.options.binary else ()
        result, notices, cost = await self._run(replace(plan, decision=decision.inner), params, formats, relay=False)
        copied = ResultSet([], [], f"COPY {len(result.rows)}", result.notices, copy=copy_messages(result, decision.options))
        return copied, notices, cost

    async def _cursor_statement(
        self, plan: Plan, decision: DeclareCursor | FetchCursor | CloseCursor, params: BoundParams,
        result_formats: tuple[int, ...], simple: bool,
    ) -> tuple[ResultSet, list[str], Cost | None]:
        """DECLARE, FETCH/MOVE or CLOSE, where the cursor lives (proxy/serving/cursors.py)."""
        status = self.backend.transaction_status
        if status == b"E":
            # As PostgreSQL, before anything else (a DP DECLARE would be charged for nothing).
            raise Refusal(SQLSTATE.IN_FAILED_TRANSACTION,
                          "current transaction is aborted, commands ignored until end of transaction block")
        if status == b"I":
            self.cursors.outside_block()
        try:
            if isinstance(decision, DeclareCursor):
                return await self._declare(plan, decision, params, in_block=status != b"I")
            if isinstance(decision, FetchCursor):
                return await self._fetch(decision, result_formats, simple)
            if decision.name is None:  # CLOSE ALL
                # Portals run in pieces too, whose cursors are their portals: PostgreSQL's CLOSE
                # ALL drops protocol portals with the cursors.
                if self.cursors.on_backend or self._open_portals:
                    await self.backend.execute("CLOSE ALL")
                self.cursors.close(None)
                return ResultSet([], [], "CLOSE CURSOR ALL"), [], None
            cursor = self.cursors.get(decision.name)
            try:
                if isinstance(cursor, BackendCursor):
                    await self.backend.execute(f"CLOSE {quote_identifier(decision.name)}")
            finally:
                self.cursors.close(decision.name)
            return ResultSet([], [], "CLOSE CURSOR"), [], None
        finally:
            self.backend.pinned = self.cursors.pins_backend

    async def _declare(
        self, plan: Plan, decision: DeclareCursor, params: BoundParams, in_block: bool
    ) -> tuple[ResultSet, list[str], Cost | None]:
        """A DP cursor's answer is the query's, released now (same ε, repeat key, notice, audit
        line) and kept; a passthrough one is declared on the backend."""
        self.cursors.check_new(decision.name, self.portal_exists(decision.name))
        inner = decision.inner
        if isinstance(inner, Passthrough):
            assert plan.statement is not None
            # The resolutions it was judged by (planned in this generation: taken from memory).
            resolved = await self._resolve(plan.statement.references.relations)
            result = await self.backend.execute(inner.sql, params if params.values else None, one_statement=True)
            self.cursors.keep_backend(decision.name, decision.options, in_block, plan.statement, resolved,
                                      self.server.registry)
            return result, result.notices, None
        if not decision.options.hold and not in_block:
            raise Refusal("25P01", "DECLARE CURSOR can only be used in transaction blocks",
                          "Run BEGIN first, or declare the cursor WITH HOLD.")
        if decision.options.binary and isinstance(inner, DPQuery):
            # Kept as text and sent as binary by each FETCH, which must not fail after the charge.
            await self._check_result_formats(inner.plan, (1,), converted=True)
        result, notices, cost = await self._run(replace(plan, decision=inner), params, (), relay=False)
        self.cursors.keep_rows(decision.name, decision.options, in_block, result)
        return ResultSet([], [], "DECLARE CURSOR", result.notices), notices, cost

    async def _fetch(
        self, decision: FetchCursor, result_formats: tuple[int, ...], simple: bool
    ) -> tuple[ResultSet, list[str], Cost | None]:
        """FETCH or MOVE: a DP cursor's kept rows, or the backend's cursor. In a simple Query a
        FETCH from a BINARY cursor is binary, as PostgreSQL's; else the client's formats."""
        fetch = decision.fetch
        cursor = self.cursors.get(fetch.name)
        formats = (1,) if simple and cursor.options.binary else result_formats
        if isinstance(cursor, BackendCursor):
            self._judge_again(cursor, fetch.name)
            result = await self.backend.relay(fetch.sql, None, () if fetch.move else formats, one_statement=True)
            return result, result.notices, None
        rows = cursor.fetch(fetch)
        if isinstance(rows, int):
            return ResultSet([], [], f"MOVE {rows}"), [], None
        try:
            return _apply_formats(ResultSet(cursor.result.fields, rows, f"FETCH {len(rows)}"), formats), [], None
        except UnsupportedBinaryType as exc:  # the released text of a type dpproxy cannot send as binary
            raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED, str(exc), "Request text format for this column.") from None

    def _judge_again(self, cursor: BackendCursor | BackendPortal, name: str | None = None) -> None:
        """After a reload (or the registry's own check) since its DECLARE, a passthrough cursor's
        query (``name``), or a portal's run in pieces, is judged again under the registry in
        force, by the relations it reads: a table protected since is not read on through it.
        Raises the refusal; the cursor or portal stays open."""
        registry = self.server.registry
        if cursor.registry is registry:
            return
        reason = "it reads a table the policy protects now"
        try:
            decision: Decision | None = classify(cursor.statement, cursor.resolved, registry, self.user)
        except Refusal as refusal:
            decision, reason = None, refusal.message
        except (SqlglotError, RecursionError):
            decision = None  # not a passthrough query any more: a DP one dpproxy cannot analyse
        if isinstance(decision, DeclareCursor):
            decision = decision.inner
        if not isinstance(decision, Passthrough):
            what = f'cursor "{name}" was declared' if name is not None else "this portal was bound"
            raise Refusal(
                SQLSTATE.OBJECT_NOT_IN_PREREQUISITE_STATE,
                f"{what} under an earlier policy, and its query is not passed through under "
                f"the policy in force: {reason} (rule: policy-changed)",
                "Close it (CLOSE name); declared again, its query is judged under the policy in force."
                if name is not None else "Close it; bound again, its query is judged under the policy in force.",
                "policy-changed",
            )
        cursor.registry = registry

    def _audit_soon(
        self, fingerprint: str, decision: str, reason: str | None, cost: Cost | None, started: float,
        rows: int | None = None,
    ) -> None:
        latency_s = time.perf_counter() - started
        asyncio.get_running_loop().call_soon(self._audit, fingerprint, decision, reason, cost, latency_s, rows)

    def _audit(
        self, fingerprint: str, decision: str, reason: str | None, cost: Cost | None, latency_s: float,
        rows: int | None = None,
    ) -> None:
        observe_statement(decision, reason, self.user, cost.epsilon if cost else 0.0, cost.delta if cost else 0.0, latency_s)
        self.server.audit.record(
            AuditEntry(
                at=time.time(),
                user=self.user,
                client=self.client,
                fingerprint=fingerprint,
                decision=decision,  # type: ignore[arg-type]
                reason=reason,
                epsilon=cost.epsilon if cost else None,
                delta=cost.delta if cost else None,
                remaining_epsilon=cost.remaining_epsilon if cost else None,
                remaining_delta=cost.remaining_delta if cost else None,
                latency_ms=round(latency_s * 1000, 3),
                rows=rows,
                mechanisms=cost.mechanisms if cost else None,
            )
        )

    def _may_serialize(self) -> bool:
        """Whether the session's transaction (in a block) or the next one may be SERIALIZABLE."""
        if self.backend.transaction_status == b"I":
            return self.backend.may_serialize
        return self._serializable_block or self.backend.may_serialize

    async def _answer_dp(
        self, decision: DPQuery, params: BoundParams, fingerprint: str, result_formats: tuple[int, ...] = ()
    ) -> tuple[ResultSet, list[str], Cost]:
        """Charge, compute exactly on the backend, noise; or replay the answer to a repeat. A
        serializable transaction's snapshot is taken first (``safe_snapshot``), and the locks of
        what the statement reads are waited for just before the charge (``relation_locks``)."""
        status = self.backend.transaction_status
        if status == b"E":
            # PostgreSQL runs nothing in a failed transaction block; charged, the query would
            # cost ε for a 25P02 that depends on nothing but the session.
            raise Refusal(SQLSTATE.IN_FAILED_TRANSACTION,
                          "current transaction is aborted, commands ignored until end of transaction block")
        if not (self.backend.may_serialize or (status != b"I" and self._serializable_block)):
            return await self._answer(decision.plan, params, fingerprint, result_formats)  # no wait
        async with in_safe_snapshot(self.backend):
            return await self._answer(decision.plan, params, fingerprint, result_formats)

    async def _answer(
        self, plan: AggregateQuery, params: BoundParams, fingerprint: str, result_formats: tuple[int, ...]
    ) -> tuple[ResultSet, list[str], Cost]:
        await self._check_result_formats(plan, result_formats)
        # A percentile's fraction, from its parameter: first, so that a fraction parameter of a
        # type it cannot have (a list bound as float8[]) is refused as a fraction, not a predicate.
        plan, params = bind_fractions(plan, params)
        check_parameter_types(plan, params)
        check_numeric_parameters(plan, params)
        check_listed_parameters(plan, params)
        plan = settled_lists(plan, params.types)  # a list's raw conjunct holds for some types only
        # The plan's WHERE is made final here, before the charge (and before the repeat key).
        epsilon = self.settings.query_epsilon(self.server.policy, plan.table)
        if plan.limit_zero:
            # No row of the answer is left: nothing is released, from the statement alone.
            if plan.post is None:
                return release_row(plan, (), epsilon).result, [], Cost(0.0, 0.0, None, None)
            return await self._post_processed(plan, None, result_formats), [], Cost(0.0, 0.0, None, None)
        plan, params = await bind_constants(plan, params, self.backend)  # before the repeat lookup and the charge
        plan, params = await narrow_keys(plan, params, self.backend)
        plan = await self._bound_ranking(plan, params)
        for grouped in (plan, plan.series.ranking if plan.series is not None else None):
            refusal = (too_many_cells(grouped) or too_many_columns(grouped)) if grouped is not None else None
            if refusal is not None:
                raise refusal
        if plan.limit_zero:  # the WHERE leaves no time bucket: nothing to release
            return await self._post_processed(plan, None, result_formats), [], Cost(0.0, 0.0, None, None)
        sql = backend_sql(plan, seed=0)  # names the query; the SQL run gets a fresh seed below
        ranking = plan.series.ranking if plan.series is not None else None
        encoding = self.backend.client_encoding
        if encoding.codec != "utf-8":
            # A name or label the session's encoding lacks would fail the answer after its charge.
            texts = [sql, plan.post.sql if plan.post is not None else "", *released_labels(plan)]
            if ranking is not None:
                texts += [backend_sql(ranking, seed=0), ranking.post.sql if ranking.post is not None else "",
                          *released_labels(ranking)]
            problem = untranslatable("\n".join(texts), encoding)
            if problem is not None:
                raise problem
        if not plan.aggregates and (ranking is None or not ranking.aggregates):
            # A GROUP BY without aggregates (a BI filter's list of values): the declared keys,
            # from the policy and the statement alone. The WHERE never runs on the rows, so
            # nothing is released and nothing is charged.
            keys = await self._release(plan, "", params, 0.0, encoding.codec)
            balance = await self.server.budget.balance(self.user)
            notice = f"{keys.notice()}; remaining ε {balance.remaining_epsilon:g}, δ {balance.remaining_delta:g}"
            keys = await self._kept_series(plan, keys, encoding.codec, notice, kept=False)
            return await self._post_processed(plan, keys, result_formats, notice), [notice], Cost(0.0, 0.0, None, None, ())
        # The aggregates too: different ones can share the backend SQL (sum_count AVG is a
        # clamped SUM and a COUNT, so ``sum(x), avg(x)`` runs what ``sum(x), sum(x), count(x)``
        # runs), and a repeat must be the same release, not another's values under these columns.
        released = _released_aggregates(plan)
        # And the settings a plain date, time or interval literal is read under (DateStyle,
        # TimeZone, IntervalStyle): the same text can ask another question under others.
        # (Folded values are in ``sql`` already, by value.)
        settings = self.backend.literal_settings
        # A series limit's answer keeps the cells its ranking keeps: the ranking is part of it.
        ranked_by = None if ranking is None or plan.series is None else (
            backend_sql(ranking, seed=0), _released_aggregates(ranking), _key_domains(ranking), ranking.post,
            plan.series.pairs)
        # And the keys' cells: date parts of one bucket (month of year, day of month, day of week)
        # group the backend's rows by the same date_trunc, but into other cells.
        repeat_key = (self.user, sql, released, _key_domains(plan), settings, tuple(params.values),
                      tuple(params.formats), epsilon, ranked_by)
        earlier = self.server.repeats.get(repeat_key)
        if earlier is not None:
            if plan.post is not None:
                # As for a fresh answer: whether post-processing fails on some label or key, and with
                # which message, must not depend on whether another statement released these values.
                await self._try_post_processing(plan, encoding.codec, (*settings, self.server.registry))
            if ranking is not None and ranking.post is not None:
                await self._try_post_processing(ranking, encoding.codec, (*settings, self.server.registry), ranking=True)
            # Only the released values are shared: names come from the statement asked now.
            repeat = earlier.named_for(plan)
            balance = await self.server.budget.balance(self.user)
            notice = (f"{repeat.notice(repeat=True)}; "
                      f"remaining ε {balance.remaining_epsilon:g}, δ {balance.remaining_delta:g}")
            cost = Cost(0.0, 0.0, None, None, released_mechanisms(plan, ranking))
            # A series limit's ranking runs over the stored release again: it keeps the same cells,
            # or fails as the first answer did, and draws nothing.
            kept = self.server.repeats.enabled
            repeat = await self._kept_series(plan, repeat, encoding.codec, notice, kept)
            return await self._post_processed(plan, repeat, result_formats, notice, kept=kept), [notice], cost
        delta = query_delta(plan) + (query_delta(ranking) if ranking is not None else 0.0)
        # A connection already known lost (or one that cannot be opened) fails the query
        # before it costs anything.
        await self.backend.usable()
        # A check passed is remembered under these settings and the table registry in force:
        # after a reload the same text can read a column of another type.
        checked_under = (*settings, self.server.registry)
        if plan.post is not None:
            await self._try_post_processing(plan, encoding.codec, checked_under)
        if ranking is not None and ranking.post is not None:
            await self._try_post_processing(ranking, encoding.codec, checked_under, ranking=True)
        # The locks the run takes are taken by a step sent with the run, after the charge, which
        # goes back when the step fails: the run never executed (relation_locks). The same step
        # raises the errors of values the column types cannot read.
        steps = [(sql, plan.table)] + ([(backend_sql(ranking, seed=0), ranking.table)] if ranking is not None else [])
        # The ledger's history carries the audit log's fingerprint, so the two can be joined.
        balance = await self.server.budget.charge(self.user, epsilon, delta, fingerprint)
        cost = self._charged = Cost(epsilon, delta, balance.remaining_epsilon, balance.remaining_delta,
                                    released_mechanisms(plan, ranking))
        try:
            run = backend_sql(plan, seed=partition_seed()) if seeded(plan) else sql
            answer = await with_locks(self.backend, steps, lambda sent: self._release_past_a_conflict(
                plan, run, params, epsilon, encoding.codec, sent))
        except LocksNotTaken as exc:
            # A lock step failed, so the run never executed: nothing was read, the charge goes back.
            self.server.budget.refund(self.user, epsilon, delta, balance)
            self._charged = None
            raise exc.error from None
        except BackendUnavailable:
            # No connection could be had (pool exhausted, backend refusing): never sent, so
            # its failure cannot depend on the data and the charge goes back.
            self.server.budget.refund(self.user, epsilon, delta, balance)
            self._charged = None
            raise
        except BackendLost as exc:
            if not exc.reached:
                # Never sent, or lost before its lock step's end arrived (so before the run
                # began): its failure cannot depend on the data, and the charge goes back.
                self.server.budget.refund(self.user, epsilon, delta, balance)
                self._charged = None
            raise
        except BackendError as exc:
            raise _sanitised(exc) from None
        # What was released is stored (when it is sent, _store_for_repeats) before anything runs
        # over it: whatever fails after the charge from here is the release's, and its repeats read it.
        self._unstored = (repeat_key, answer)
        notice = f"{answer.notice()}; remaining ε {cost.remaining_epsilon:g}, δ {cost.remaining_delta:g}"
        kept = self.server.repeats.enabled
        answer = await self._kept_series(plan, answer, encoding.codec, notice, kept)
        result = await self._post_processed(plan, answer, result_formats, notice, kept=kept)
        return result, [notice], cost

    async def _bound_ranking(self, plan: AggregateQuery, params: BoundParams) -> AggregateQuery:
        """``plan`` with its series limit's ranking made final as the plan's own WHERE is (folded,
        time keys narrowed); a ranking left with no cell leaves no series, as the plan left with
        none leaves no cell: no row either way, nothing released."""
        if plan.series is None:
            return plan
        ranking, _ = bind_fractions(plan.series.ranking, params)
        ranking, _ = await bind_constants(ranking, params, self.backend)
        ranking, _ = await narrow_keys(ranking, params, self.backend)
        return replace(plan, series=replace(plan.series, ranking=ranking),
                       limit_zero=plan.limit_zero or ranking.limit_zero)

    async def _release_past_a_conflict(self, plan: AggregateQuery, sql: str, params: BoundParams, epsilon: float,
                                       codec: str, steps: tuple[str, ...]) -> DPAnswer:
        """``_release`` after the lock ``steps`` (in the pipeline of its first run), run once more,
        alone, under the same charge when a hot standby cancelled it for a conflict with the WAL
        it replays (40001 or 40P01 outside a transaction block): a step sent again could fail
        after a run that executed, and its refund would follow a failure the rows may have timed.

        Such a conflict is decided by the operator's writes on the primary (a VACUUM, a lock, a
        DDL) and by whether the statement was still running, or holding a page, when they
        arrived: the rows can have a say only through how long they take, the timing channel
        that keeps a timed-out statement charged. So the charge stands whatever happens, and a
        conflict the operator caused costs no answer unless it strikes twice. Noise is drawn
        only for values the backend returned, so a retry releases one answer, never two. In a
        transaction block the conflict aborted the block: nothing can run again there.
        """
        try:
            return await self._release(plan, sql, params, epsilon, codec, steps)
        except BackendError as exc:
            if (exc.sqlstate not in RECOVERY_CONFLICTS or isinstance(exc, BackendLost)
                    or self.backend.transaction_status != b"I"):
                raise
            log.info("a DP statement was cancelled by the backend (%s: %s); run once more under its charge",
                     exc.sqlstate, exc.message)
        return await self._release(plan, sql, params, epsilon, codec)

    async def _release(self, plan: AggregateQuery, sql: str, params: BoundParams, epsilon: float, codec: str,
                       steps: tuple[str, ...] = ()) -> DPAnswer:
        """The release of ``plan`` (``sql``: its backend SQL, run after ``steps`` in one pipeline);
        with a series limit, of the plan and its ranking, ε split evenly over the releases of both
        (``proxy.dp.release_units``), all the plan's cells beside the ranking's (``series_release``:
        :meth:`_kept_series` keeps some). The plan's run follows the steps; the ranking's runs after
        it, alone."""
        if plan.series is None:
            return await self._released(plan, sql, params, epsilon, codec, steps)
        ranking = plan.series.ranking
        share = epsilon / max(1, release_count(plan) + release_count(ranking))
        # A plan of declared keys alone runs nothing: the steps go with the ranking's run then.
        plan_steps, ranking_steps = ((), steps) if plan.keys_only else (steps, ())
        answer = await self._released(plan, sql, params, share * release_count(plan), codec, plan_steps)
        ranking_sql = backend_sql(ranking, seed=partition_seed() if seeded(ranking) else 0)
        ranked = await self._released(ranking, ranking_sql, params, share * release_count(ranking), codec,
                                      ranking_steps)
        return series_release(answer, ranked)

    async def _kept_series(self, plan: AggregateQuery, answer: DPAnswer, codec: str, charged: str,
                           kept: bool) -> DPAnswer:
        """``answer`` with, for a series limit (``answer.ranked``), the plan's cells kept where its
        ranking's outer statement, run on the backend over the ranking's released values only, keeps
        theirs; any other answer as it is.

        Its errors are post-processing errors, as :meth:`_post_processed`'s are: decided by the
        release and the text alone (those the text and keys decide were raised before the charge,
        over :func:`trial_params`), so the charge stands, they reach the client as PostgreSQL
        raised them, ``charged`` (the notice's text) as their DETAIL, and with ``kept`` (the release
        stored for its repeats) a HINT that the same statement asked again is answered from the
        release at no charge, and fails the same way. The outer statement is measured first: past
        ``listen.max_answer_bytes`` it is never asked for (only dpproxy reads it, but whole)."""
        if answer.ranked is None:
            return answer
        assert plan.series is not None and plan.series.ranking.post is not None
        sql = plan.series.ranking.post.sql
        values = ranking_params(plan.series.ranking, answer.ranked)
        limit = self.server.policy.listen.max_answer_bytes
        try:
            size = await self._answer_size(sql, values)
            if size > limit:
                raise too_large_for_the_release(size, limit)
            rows = (await self.backend.execute(sql, values)).rows
        except BackendLost:
            raise
        except BackendError as exc:
            _charged_failure(exc, charged, _KEPT_RANKING if kept else None)
            raise
        return kept_series(plan, answer, [int(row[-1]) for row in rows if row[-1] is not None], codec)

    async def _check_result_formats(self, plan: AggregateQuery, result_formats: tuple[int, ...],
                                    converted: bool = False) -> None:
        """Refuse, before anything is charged, result format codes the answer cannot be sent in:
        not one per column (08P01, as PostgreSQL's Bind), or binary for a column dpproxy would
        have to convert and cannot (0A000). The statement decides both, never the rows.
        ``converted``: dpproxy converts every column (a BINARY cursor's kept rows), also those
        of an outer statement the backend would otherwise give in the format asked."""
        if not result_formats or (plan.post is not None and len(result_formats) == 1 and not converted):
            return  # all text, or one format for all that the backend itself produces
        fields = await self._dp_fields(plan)
        try:
            formats = formats_for(result_formats, len(fields))
        except ProtocolError as exc:
            raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, exc.message) from None
        # dpproxy converts a date or time from its text only as DateStyle ISO prints it: under
        # another DateStyle the conversion would fail after the charge, ending the session.
        iso = (self.backend.literal_settings[0] or "ISO").upper().startswith("ISO")
        for column, fmt in zip(fields, formats):
            if fmt != 1 or column.format != 0:
                continue
            if column.type_oid not in BINARY_TYPES:
                raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED, str(UnsupportedBinaryType(column.type_oid)),
                              "Request text format for this column.")
            if column.type_oid in DATE_TIME_TYPES and not iso:
                raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED, str(UnsupportedBinaryType(column.type_oid, NOT_ISO)),
                              "Request text format for this column (or binary for every column), or SET "
                              "DateStyle = ISO.")

    async def _try_post_processing(self, plan: AggregateQuery, codec: str, settings: tuple[object, ...],
                                   ranking: bool = False) -> None:
        """Run the plan's outer statement, as written and without its limits and the filters that read
        aggregates, over its keys and NULL aggregates (and each label a MODE may name), reading
        nothing of the table: an error it
        raises there is decided by the statement alone (a key's label cast to a type that cannot
        hold it, 1/0), returned before any charge. An outer statement that fails on every
        release (``plan.post.certain``: ``stddev(x) / 0``, ``1 / (count(*) - count(*))``, which
        NULL aggregates let pass) is run as written over one fixed release as well
        (:func:`witness_params`), and its error there is returned before the charge too.

        What is tried, and so what is refused, is decided by the statement's text, its keys,
        the release's types, the session's settings and the policy: never by a row or a
        released value, so the refusal is the same on neighbouring tables. Each error carries
        a hint that nothing was charged. Passed once under the same settings, the trial is not
        run again for the same user (a trial skipped for another analyst's statement would tell,
        by its time, what that analyst asked). ``ranking``: ``plan`` is a series limit's ranking,
        whose outer statement also reads its cells' numbers.

        Each run is measured on the backend (``proxy.dp.answer_size``), never received: an
        answer as written over the trial's values longer than ``listen.max_answer_bytes`` is
        refused (54000, ``answer-size``), its size being decided by the same fixed values."""
        assert plan.post is not None
        # The trial's values are the cells' keys: named by the keys' domains, not built to be
        # hashed (a histogram's labels, on every answer).
        passed = _digest(self.user, plan.post.sql, _key_domains(plan), _released_aggregates(plan), ranking, settings)
        if passed in _PASSED:
            return
        limit = self.server.policy.listen.max_answer_bytes
        try:
            for params in trial_params(plan, codec, ranking):
                # As written (its filters may fail on a key themselves), then without them; only the
                # former's size is the answer's (the latter drops its LIMIT).
                for sql in dict.fromkeys((plan.post.sql, plan.post.trial_sql)):
                    size = await self._answer_size(sql, params)
                    if sql == plan.post.sql and size > limit:
                        raise too_large_from_the_text(size, limit, _UNCHARGED)
            if plan.post.certain:
                await self.backend.execute(measuring_sql(plan.post.sql), witness_params(plan, codec, ranking))
        except BackendLost:
            raise
        except BackendError as exc:
            if exc.sqlstate[:2] not in _NOT_DECIDED_BY_THE_TEXT and not isinstance(exc, BackendUnavailable):
                exc.hint = f"{exc.hint}\n{_UNCHARGED}" if exc.hint else _UNCHARGED
            raise
        _PASSED.add(passed)

    async def _answer_size(self, sql: str, params: BoundParams) -> int:
        """The bytes of text the outer statement ``sql`` answers over ``params``, counted on the
        backend (``proxy.dp.answer_size``): its rows never reach dpproxy. Fails as ``sql`` fails."""
        return answer_bytes(await self.backend.execute(measuring_sql(sql), params))

    async def _released(self, plan: AggregateQuery, sql: str, params: BoundParams, epsilon: float, codec: str,
                        steps: tuple[str, ...] = ()) -> DPAnswer:
        """Run the plan's exact aggregates on the backend (after ``steps``, in one pipeline) and
        noise them: one row, or one per cell. A GROUP BY without aggregates is its declared
        keys: nothing runs."""
        if plan.keys_only:
            return declared_keys(plan, codec)
        bound = params if params.values else None
        # Its sorts and hash tables held in memory, whatever rows the filter reaches (rewriter/sort_memory.py).
        memory = memory_steps(plan, in_block=self.backend.transaction_status != b"I")
        try:
            if not plan.groups:
                values, type_oids = await self.backend.first_row(sql, bound, steps, memory)
                return await _noised(plan, partial(_row_released, plan, values, type_oids, epsilon, codec))
            unread = await self.backend.unread(sql, bound, steps, memory)
        except StepFailed as failed:
            if steps:
                raise  # with_locks's: the run never executed, its charge goes back
            # The setting of a run sent without lock steps (a series limit's ranking, a retry):
            # the charge stands, as for the run's own failure.
            raise failed.error from None
        return await _noised(plan, partial(_cells_released, plan, unread, epsilon, codec))

    async def _post_processed(
        self, plan: AggregateQuery, answer: DPAnswer | None, result_formats: tuple[int, ...] = (),
        charged: str | None = None, kept: bool = False,
    ) -> ResultSet:
        """The answer the statement asks for, from the released values only (None: none released).

        The plain shape is the released row itself; otherwise the plan's outer statement runs
        on the backend over the released values (rewriter/post_process.py), in the client's
        result format when it asked for one for all columns. Its errors depend on those values
        alone and reach the client as PostgreSQL raised them (``1/count(*)`` over a noisy count
        of 0 is 22012); the charge stands (those its keys and text decide were raised before
        the charge, over :func:`trial_params`): the error is itself a function of the release,
        and a refund would make it a free oracle of the noised values (docs/threat-model.md).
        An error would leave the client without the notice of that charge: ``charged``, the
        notice's text, becomes its DETAIL instead; with ``kept`` (repeats on: the release is
        stored for its repeats) its HINT says how to read the values paid for again, uncharged.

        The answer is measured on the backend first (``proxy.dp.answer_size``): one longer than
        ``listen.max_answer_bytes`` is never asked for. Past the trial, only the released values
        can have made it so: an error the release decides, like any other here. With nothing
        released (``answer`` None, or the declared keys alone) it is a refusal, uncharged.
        """
        if plan.post is None:
            assert answer is not None
            return answer.result
        uniform = result_formats[0] if len(result_formats) == 1 else 0
        params = release_params(plan, answer)
        limit = self.server.policy.listen.max_answer_bytes
        try:
            size = await self._answer_size(plan.post.sql, params)
            if size > limit:
                if answer is None or not answer.releases:
                    raise too_large_from_the_text(size, limit, _UNCHARGED)
                raise too_large_for_the_release(size, limit)
            return await self.backend.execute(plan.post.sql, params, uniform)
        except BackendLost:
            raise
        except BackendError as exc:
            _charged_failure(exc, charged, _KEPT if kept else None)
            raise


def _charged_failure(exc: BackendError, charged: str | None, hint: str | None) -> None:
    """Tell ``exc``, a post-processing error the release decided, what was charged (``charged``,
    the notice's text, as its DETAIL) and ``hint`` (how to read the values paid for again)."""
    if charged is not None:
        exc.detail = f"{exc.detail}\n{charged}" if exc.detail else charged
    if hint is not None:
        exc.hint = f"{exc.hint}\n{hint}" if exc.hint else hint


_KEPT = ("The noised values were charged and are kept: the same aggregates over the same WHERE at the same ε, "
         "asked without the expression that failed on them, are answered from them at no charge while repeats "
         "are kept.")
# A series limit's ranking is part of its repeat key: only the same ranking reads the kept release.
_KEPT_RANKING = ("The noised values were charged and are kept: this statement asked again is answered from them "
                 "at no charge while repeats are kept, and its series ranking fails on them the same way.")
_UNCHARGED = ("Nothing was charged: the error was found before anything was released, from the statement's "
              "text and keys alone (not the rows).")
# A trial cancelled, timed out or short of resources failed for a reason of its own, not the text's.
_NOT_DECIDED_BY_THE_TEXT = frozenset({"08", "53", "57"})


class _Passed:
    """Hashes of the statement checks that passed (at most ``size``; the oldest forgotten
    first): one that passed under the same settings passes again, so it is not asked twice.

    Python's hash (SipHash, seeded per process) keeps the memory small and costs a few µs
    less than a digest; two checks sharing a hash would at worst skip one, leaving an error
    its text decides to come after the charge, as before these checks."""

    def __init__(self, size: int) -> None:
        self._hashes: dict[int, None] = {}
        self._size = size

    def __contains__(self, key: int) -> bool:
        return key in self._hashes

    def add(self, key: int) -> None:
        self._hashes[key] = None
        if len(self._hashes) > self._size:
            del self._hashes[next(iter(self._hashes))]


_PASSED = _Passed(16_384)


async def _noised(plan: AggregateQuery, release: Callable[[], DPAnswer]) -> DPAnswer:
    """``release()``, on the event loop, or in a release thread when it draws over many
    candidates (``_OFF_LOOP_CANDIDATES``): the same answer either way, the loop free meanwhile.
    ``release`` reads the backend's exact values itself, so that their reading, which grows
    with the candidates, goes to the thread with the draws."""
    if selection_candidates(plan) < _OFF_LOOP_CANDIDATES:
        return release()
    return await asyncio.get_running_loop().run_in_executor(_RELEASES, release)


def _row_released(plan: AggregateQuery, values: Sequence[bytes | None], type_oids: Sequence[int], epsilon: float,
                  codec: str) -> DPAnswer:
    """:func:`release_row` of the backend's text row ``values``, loaded here, where :func:`_noised`
    runs the release: a percentile's collected counts are a text that grows with its grid."""
    return release_row(plan, tuple(load_text(v, t) for v, t in zip(values, type_oids)), epsilon, codec)


def _cells_released(plan: AggregateQuery, unread: UnreadRows, epsilon: float, codec: str) -> DPAnswer:
    """:func:`release_cells` of the grouped backend query's rows, read and loaded here, where
    :func:`_noised` runs the release: a percentile's rows (one per cell and grid index reached)
    and a MODE's counts (one per cell and category) grow with the same candidates it counts."""
    keys = len(plan.groups)
    types = unread.type_oids[keys:]
    rows = [[*row[:keys], *(load_text(v, t) for v, t in zip(row[keys:], types))] for row in unread.read()]
    return release_cells(plan, rows, epsilon, codec)


def _digest(*parts: Hashable) -> int:
    return hash(parts)


def released_mechanisms(plan: AggregateQuery, ranking: AggregateQuery | None) -> tuple[str, ...]:
    """The mechanism releasing each aggregate of ``plan`` (then of a series limit's ``ranking``),
    as the audit line names them: ``laplace`` (COUNT, SUM), ``sum_count`` (AVG as noisy sum /
    noisy count), ``sample_aggregate`` (AVG, MIN, MAX by sample and aggregate), ``exponential``
    (MODE), ``quantile`` (percentiles), ``moments`` (variances, standard deviations, and an AVG
    read from their moments: ``proxy.dp.release_units``); ``histogram_`` before it when noised per
    cell of a GROUP BY, ``ranking_histogram_`` for the ranking that keeps a series limit's cells."""
    def names(query: AggregateQuery, prefix: str) -> tuple[str, ...]:
        cells = "histogram_" if query.groups else ""
        units = release_units(query.aggregates)
        if not units:
            return tuple(f"{prefix}{cells}{agg.mechanism}" for agg in query.aggregates)
        moments = {unit for agg, unit in zip(query.aggregates, units) if agg.mechanism == "moments"}
        return tuple(f"{prefix}{cells}{'moments' if unit in moments else agg.mechanism}"
                     for agg, unit in zip(query.aggregates, units))
    return names(plan, "") + (names(ranking, "ranking_") if ranking is not None else ())


def _key_domains(plan: AggregateQuery) -> tuple[tuple[object, ...], ...]:
    """What decides the plan's cells and their keys: each key's identity and buckets."""
    return tuple((*key.identity, key.first, key.count) for key in plan.groups)


def _released_aggregates(plan: AggregateQuery) -> tuple[tuple[object, ...], ...]:
    """What tells the plan's released aggregates apart, for the repeat key (more than their SQL).

    The numeric scale too: a release is stored as text, printed with the fraction digits the
    statement's constants give it (``ELSE 0.0`` or ``THEN 1.00``), which a repeat must not borrow."""
    return tuple((a.kind, a.column.name if a.column else None, a.mechanism, a.distinct, a.result_type_oid,
                  a.filter_sql, numeric_scale(a), a.fraction, a.fractions) for a in plan.aggregates)




def _split_and_fingerprint(sql: str) -> tuple[Statement, ...]:
    """``split_statements(sql)``, with the fingerprint of a refused string's audit line made
    too (by the same thread: scanning a long text is as slow as parsing it)."""
    try:
        return split_statements(sql)
    except Refusal:
        _fingerprint(sql[:_AUDITED_PREFIX])
        raise


@sized_cache(4096, 4 * 1024 * 1024, lambda _, text: len(text))
def _fingerprint(text: str) -> str:
    return audit_fingerprint(text, scannable=longest_operator_run(text) <= MAX_OPERATOR_RUN)


def _may_move_search_path(statement: Statement) -> bool:
    """Whether ``statement`` may change search_path or a reported setting (it bumps the
    session's generation: plans and relation lookups are made again, ParameterStatus is
    checked). SHOW and BEGIN cannot, and BI tools send them before every query."""
    if statement.kind == "VariableShowStmt" or _begins(statement):
        return False
    if statement.kind not in ("SelectStmt", "CopyStmt"):
        return True  # SET, RESET, DISCARD, and transaction ends that undo SET LOCAL
    return any(name.endswith("set_config") for name in statement.references.functions)


def _begins(statement: Statement) -> bool:
    return statement.kind == "TransactionStmt" and statement.node.get("kind") in ("TRANS_STMT_BEGIN", "TRANS_STMT_START")


_ALREADY_IN_PROGRESS = "25001"  # the WARNING of a BEGIN inside a block ("already a transaction in progress")

_SETTING_STATEMENTS = frozenset({"VariableSetStmt", "DiscardStmt"})


def _may_change_settings(statement: Statement) -> bool:
    """SET/RESET, DISCARD, or a SELECT calling set_config: the session's backend settings may
    differ afterwards. (A transaction's end only undoes changes made in it, which were marked.)"""
    if statement.kind in _SETTING_STATEMENTS:
        return True
    return statement.kind in ("SelectStmt", "CopyStmt") and any(
        name.endswith("set_config") for name in statement.references.functions
    )


def _resets(statement: Statement) -> tuple[bool, str | None]:
    """Whether a statement resets settings to their defaults, and which (None: all)."""
    node = statement.node
    if statement.kind == "DiscardStmt":
        return node.get("target") == "DISCARD_ALL", None
    if statement.kind == "VariableSetStmt":
        kind = node.get("kind")
        if kind == "VAR_RESET_ALL":
            return True, None
        if kind in ("VAR_RESET", "VAR_SET_DEFAULT"):
            return True, str(node.get("name") or "")
    return False, None


def _reads_backend_rows(decision: Decision | None) -> bool:
    """Whether the statement's rows come from the backend as they are (judged again if a
    reload came while it waited for a connection)."""
    if isinstance(decision, DeclareCursor):
        return isinstance(decision.inner, Passthrough)
    return isinstance(decision, (Passthrough, CopyOut))


def _rows(result: ResultSet) -> int:
    """How many rows a result hands the client (a COPY's, from its tag)."""
    if result.copy is not None:
        return int(result.tag.rpartition(" ")[2] or 0)
    return result.row_count


def _apply_formats(result: ResultSet, result_formats: tuple[int, ...]) -> ResultSet:
    """Convert text columns to binary where the client asked for binary (others stay text)."""
    if not result.fields or not any(result_formats):
        return result
    try:
        formats = formats_for(result_formats, len(result.fields))
    except ProtocolError as exc:
        raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, exc.message) from None
    convert = [i for i, (f, fmt) in enumerate(zip(result.fields, formats)) if fmt == 1 and f.format == 0]
    if not convert:
        return result
    rows = []
    for row in result.rows:
        row = list(row)
        for i in convert:
            text = row[i]
            if text is not None:
                row[i] = binary_from_text(text, result.fields[i].type_oid)
        rows.append(row)
    fields = [replace(f, format=fmt) for f, fmt in zip(result.fields, formats)]
    return ResultSet(fields, rows, result.tag, result.notices)


def _sanitised(exc: BackendError) -> Refusal:
    """A backend failure during a DP query, without any detail that could depend on the data."""
    if exc.sqlstate == SQLSTATE.QUERY_CANCELED:
        return Refusal(SQLSTATE.QUERY_CANCELED, "canceling statement due to user request or statement timeout")
    if exc.sqlstate.startswith("42"):
        # Errors found while planning (unknown column, type mismatch) depend on the schema
        # and the statement only, never on the rows.
        return Refusal(exc.sqlstate, exc.message, exc.hint)
    return Refusal(
        SQLSTATE.DP_BACKEND_FAILURE,
        "the backend failed to compute this DP aggregate",
        "The error's details are withheld because they could depend on protected rows.",
    )
