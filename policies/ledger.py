"""The privacy-budget ledger: per analyst, atomic, durable, shared by proxy replicas.

Contract
--------
* Limits live in the policy and are passed in with every call (``Budget``); the ledger
  stores only what was spent and granted, so a policy change takes effect at once.
* ``charge`` adds a query's (ε, δ) to the user's spend (sequential composition) in one
  transaction whose conditional ``UPDATE ... WHERE spent + charge <= limit + granted``
  either accepts the whole charge or changes nothing. Concurrent charges, from threads or
  from other processes or replicas on the same store, can never overspend: the check and
  the write are one statement on a locked row, not a read followed by a write.
* A refused charge costs nothing. A failure of the store raises (SQLAlchemyError): the
  caller must then refuse the query, never answer it uncharged.

Storage
-------
Amounts are stored as integers: ε in units of 1e-12 and δ in units of 1e-18. Integer sums
are exact and independent of the order in which concurrent charges commit, so "500
charges of 1.0 fit a budget of 500" and "spend equals the sum of the history" hold
exactly, with no tolerance that would let a budget be overspent by a little. A float is
converted from its shortest decimal form (``0.1`` is exactly 0.1, not
0.1000000000000000055...) and rounded against the analyst: charges up, limits down.
Limits, grants and a single charge are capped at 2**60 units (about 1.15e6 ε, 1.15 δ;
``inf`` means the cap), so no sum can overflow a 64-bit integer. A policy therefore
refuses budgets above 1e6 ε (policies.model.MAX_BUDGET_EPSILON): every budget it accepts
is represented exactly.

Grants are a separate column added to the policy limit for the current period, not
negative spend: the spend then always equals the sum of the charges since the last reset.
Periods (``None``, ``'day'``, ``'week'``, ``'month'``, in UTC) key the spend rows, so a
new period starts on a fresh row; nothing has to run at midnight.

Backends
--------
* SQLite file (the default): WAL journal, ``synchronous=NORMAL`` (a committed charge
  survives ``kill -9`` of the proxy; only an OS crash or power loss can lose the last
  commits), a busy timeout so that concurrent processes wait for the lock instead of
  failing, and ``BEGIN IMMEDIATE`` so that every writing transaction takes the write lock
  up front.
* PostgreSQL (for replicas sharing the backing database): tables in their own schema
  (``dpproxy`` by default), READ COMMITTED, where a conditional UPDATE waiting on a row
  lock re-checks its condition against the committed row. It must accept writes: a hot
  standby (a read replica) or a server whose transactions are read-only is refused when the
  ledger is opened (``ReadOnlyLedger``), not at the first charge.

Every accepted charge, grant and reset also appends a row to a history table in the same
transaction, for ``dpproxy budget show`` and for audits.

The common charge (the period's row exists and the charge fits) runs the same two
statements on the driver's own cursor (:mod:`policies.driver`): ~35 µs instead of ~150 µs
of Python through a SQLAlchemy ``Connection``. Everything else, including a charge that
needs a new row or does not fit, takes the general path.

The API is synchronous and thread-safe (a pooled SQLAlchemy Engine; no other shared
state); call it from a worker thread in asyncio code.
"""

from __future__ import annotations

import logging
import math
import numbers
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Sequence

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from .driver import DriverStatement
from .periods import check_period, period_key, period_start, to_utc

log = logging.getLogger("dpproxy.budget")

__all__ = [
    "Balance",
    "Budget",
    "ChargeResult",
    "DEFAULT_PG_SCHEMA",
    "DELTA_SCALE",
    "EPSILON_SCALE",
    "HistoryEntry",
    "Ledger",
    "MAX_CHARGE_DELTA",
    "MAX_CHARGE_EPSILON",
    "ReadOnlyLedger",
    "exact_decimal",
]

#: Stored units per 1 ε and per 1 δ.
EPSILON_SCALE: Final = 10**12
DELTA_SCALE: Final = 10**18
#: Cap on a limit, on a period's grants and on one charge, in units: sums stay below 2**63.
_MAX_UNITS: Final = 2**60
#: The largest ε and δ one charge may be (about 1.15e6 ε and 1.15 δ); limits above are capped.
MAX_CHARGE_EPSILON: Final = _MAX_UNITS / EPSILON_SCALE
MAX_CHARGE_DELTA: Final = _MAX_UNITS / DELTA_SCALE

DEFAULT_PG_SCHEMA: Final = "dpproxy"
SQLITE_BUSY_TIMEOUT_S: Final = 30.0
_MAX_USER_LEN: Final = 255
# pg_advisory_xact_lock key serialising table creation by replicas starting together.
_DDL_LOCK_KEY: Final = 0x64707078_6C656467  # "dppxledg"
# Execution option: begin a plain (deferred) SQLite transaction for read-only work.
_READ_ONLY: Final = "dpproxy_read_only"

# A spend row's amounts in units: spent ε, spent δ, granted ε, granted δ (a Row or a tuple).
Amounts = Sequence[int]


@dataclass(frozen=True)
class Budget:
    """A user's budget from the policy: total ε and δ, per ``period`` if one is given.

    Raises ValueError for negative or NaN amounts or an unknown period; ``inf`` is allowed.
    """

    epsilon: float
    delta: float
    period: str | None = None

    def __post_init__(self) -> None:
        _check_amount("budget epsilon", self.epsilon, allow_inf=True)
        _check_amount("budget delta", self.delta, allow_inf=True)
        check_period(self.period)


@dataclass(frozen=True)
class Balance:
    """A user's spend in the current period against the policy limit plus grants."""

    user: str
    spent_epsilon: float
    spent_delta: float
    #: The policy limit plus this period's grants.
    limit_epsilon: float
    limit_delta: float
    #: UTC start of the current period; None for a budget without period.
    period_start: datetime | None
    granted_epsilon: float = 0.0
    granted_delta: float = 0.0

    @property
    def remaining_epsilon(self) -> float:
        """ε still available, never negative (a lowered limit may sit below the spend)."""
        return _exact_difference(self.limit_epsilon, self.spent_epsilon)

    @property
    def remaining_delta(self) -> float:
        """δ still available, never negative."""
        return _exact_difference(self.limit_delta, self.spent_delta)


@dataclass(frozen=True)
class ChargeResult:
    """Whether the whole charge was accepted; the balance after it (or the current one)."""

    accepted: bool
    balance: Balance


@dataclass(frozen=True)
class HistoryEntry:
    """One accepted ``'charge'``, a ``'grant'``, or a ``'reset'`` (amounts it cleared)."""

    id: int
    at: datetime
    kind: str
    user: str
    period: str
    epsilon: float
    delta: float
    fingerprint: str | None


class ReadOnlyLedger(ValueError):
    """The ledger's PostgreSQL cannot record a charge: it is a hot standby, or its transactions
    are read-only (``default_transaction_read_only`` of the role, the database or the server)."""


class Ledger:
    """The durable, shared budget ledger (see the module docstring for the contract)."""

    def __init__(self, url: str | sa.URL, schema: str | None = None) -> None:
        """Open (creating tables if missing) the ledger at a SQLAlchemy URL.

        ``url`` is ``sqlite:///path`` (a file; in-memory databases are refused: the
        ledger must be durable) or ``postgresql+psycopg://...``. ``schema`` is the
        PostgreSQL schema (default ``dpproxy``); SQLite takes none.
        """
        parsed = sa.make_url(url)
        backend = parsed.get_backend_name()
        if backend == "sqlite":
            if schema is not None:
                raise ValueError("a SQLite ledger takes no schema")
            self._engine = _sqlite_engine(parsed)
            self._insert: Any = sqlite.insert
        elif backend == "postgresql":
            schema = schema or DEFAULT_PG_SCHEMA
            self._engine = _postgres_engine(parsed)
            self._insert = postgresql.insert
        else:
            raise ValueError(f"unsupported ledger database {backend!r}: use sqlite or postgresql")
        self._metadata, self._spend, self._history = _tables(schema)
        self._build_statements()
        try:
            self._create_tables(schema)
        except BaseException:
            self._engine.dispose()
            raise

    @classmethod
    def from_url(cls, url: str, schema: str | None = None) -> Ledger:
        """Open a ledger from a SQLAlchemy URL, a libpq URI or a file path.

        ``postgresql://`` and ``postgres://`` URIs are driven by psycopg 3; a string
        without ``://`` is the path of a SQLite file.
        """
        if "://" not in url:
            return cls(sa.URL.create("sqlite", database=str(Path(url).resolve())), schema)
        scheme, rest = url.split("://", 1)
        if scheme in ("postgresql", "postgres"):
            url = f"postgresql+psycopg://{rest}"
        return cls(url, schema)

    def charge(
        self,
        user: str,
        epsilon: float,
        delta: float,
        budget: Budget,
        now: datetime | None = None,
        fingerprint: str | None = None,
        keep_epsilon: float = 0.0,
        keep_delta: float = 0.0,
    ) -> ChargeResult:
        """Charge (ε, δ) to ``user`` if it fits the budget; all or nothing, committed on return.

        With ``keep_epsilon``/``keep_delta``, the charge is accepted only if at least that
        much is still left after it (a proxy's reservation that would otherwise hold back
        more than the ledger has left). An accepted charge is durable and recorded in the
        history (with the optional statement ``fingerprint``) before this returns. Raises
        ValueError for a negative, NaN or infinite amount, or a charge above the cap.
        """
        _check_user(user)
        eps = _charge_units("epsilon", epsilon, EPSILON_SCALE)
        dlt = _charge_units("delta", delta, DELTA_SCALE)
        _check_amount("keep epsilon", keep_epsilon, allow_inf=False)
        _check_amount("keep delta", keep_delta, allow_inf=False)
        limit_eps, limit_dlt = _limit_units(budget)
        # Capped like a limit, so the difference stays a 64-bit integer.
        limit_eps -= min(_MAX_UNITS, _units(keep_epsilon, EPSILON_SCALE, round_up=True))
        limit_dlt -= min(_MAX_UNITS, _units(keep_delta, DELTA_SCALE, round_up=True))
        now = to_utc(now)
        key = period_key(budget.period, now)
        row = self._charge_on_driver(user, key, now, (eps, limit_eps), (dlt, limit_dlt), fingerprint)
        if row is not None:
            return ChargeResult(True, _balance(user, budget, now, row))
        # The period's row is missing or the charge does not fit: the general path decides.
        with self._engine.begin() as conn:
            row = self._add_within(conn, "spent", user, key, now, (eps, limit_eps), (dlt, limit_dlt))
            accepted = row is not None
            if row is not None:
                self._record(conn, "charge", user, key, now, eps, dlt, fingerprint)
            else:
                row = self._read(conn, user, key)
        return ChargeResult(accepted, _balance(user, budget, now, row))

    def balance(self, user: str, budget: Budget, now: datetime | None = None) -> Balance:
        """The user's balance in the period containing ``now`` (zero spend if never charged)."""
        _check_user(user)
        now = to_utc(now)
        with self._engine.connect().execution_options(**{_READ_ONLY: True}) as conn:
            row = self._read(conn, user, period_key(budget.period, now))
        return _balance(user, budget, now, row)

    def grant(
        self,
        user: str,
        epsilon: float,
        delta: float = 0.0,
        *,
        budget: Budget,
        now: datetime | None = None,
    ) -> Balance:
        """Add (ε, δ) to the user's allowance for the current period only; return the balance.

        Raises ValueError for a negative, NaN or infinite amount, or when the period's
        grants would exceed the cap.
        """
        _check_user(user)
        eps = _charge_units("grant epsilon", epsilon, EPSILON_SCALE)
        dlt = _charge_units("grant delta", delta, DELTA_SCALE)
        now = to_utc(now)
        key = period_key(budget.period, now)
        with self._engine.begin() as conn:
            row = self._add_within(
                conn, "granted", user, key, now, (eps, _MAX_UNITS), (dlt, _MAX_UNITS)
            )
            if row is None:
                raise ValueError(f"grants to {user!r} for this period would exceed the cap")
            self._record(conn, "grant", user, key, now, eps, dlt, None)
        return _balance(user, budget, now, row)

    def reset(self, user: str, budget: Budget, now: datetime | None = None) -> Balance:
        """Set the user's spend in the current period back to zero; grants are kept.

        The history records the reset with the amounts it cleared.
        """
        _check_user(user)
        now = to_utc(now)
        key = period_key(budget.period, now)
        s = self._spend
        with self._engine.begin() as conn:
            self._ensure_row(conn, user, key, now)
            before = self._read(conn, user, key, for_update=True)
            row = conn.execute(
                sa.update(s)
                .where(s.c.user_name == user, s.c.period == key)
                .values(spent_epsilon_units=0, spent_delta_units=0, updated_at=now)
                .returning(*self._amounts())
            ).one()
            self._record(conn, "reset", user, key, now, before[0], before[1], None)
        return _balance(user, budget, now, row)

    def release(
        self, user: str, epsilon: float, delta: float, budget: Budget, now: datetime | None = None
    ) -> Balance:
        """Give back part of an earlier charge that was never used (a proxy's unused reservation).

        Amounts round down (charges round up), and spend never drops below zero, so a release
        can only return what was charged. ``now`` names the period the charge was made in.
        """
        _check_user(user)
        _check_amount("epsilon", epsilon, allow_inf=False)
        _check_amount("delta", delta, allow_inf=False)
        eps = _units(epsilon, EPSILON_SCALE, round_up=False)
        dlt = _units(delta, DELTA_SCALE, round_up=False)
        now = to_utc(now)
        key = period_key(budget.period, now)
        s = self._spend
        with self._engine.begin() as conn:
            self._ensure_row(conn, user, key, now)
            row = conn.execute(
                sa.update(s)
                .where(s.c.user_name == user, s.c.period == key)
                .values(
                    spent_epsilon_units=self._not_below_zero(s.c.spent_epsilon_units - eps),
                    spent_delta_units=self._not_below_zero(s.c.spent_delta_units - dlt),
                    updated_at=now,
                )
                .returning(*self._amounts())
            ).one()
            self._record(conn, "release", user, key, now, eps, dlt, None)
        return _balance(user, budget, now, row)

    def _not_below_zero(self, value: sa.ColumnElement[int]) -> sa.ColumnElement[int]:
        # SQLite spells GREATEST as the two-argument max().
        greatest = sa.func.max if self._engine.dialect.name == "sqlite" else sa.func.greatest
        return greatest(value, 0)

    def users(self) -> list[str]:
        """Every user the ledger has a row for, sorted."""
        s = self._spend
        with self._engine.connect().execution_options(**{_READ_ONLY: True}) as conn:
            rows = conn.execute(sa.select(s.c.user_name).distinct().order_by(s.c.user_name))
            return [r[0] for r in rows]

    def history(self, user: str | None = None, limit: int | None = None) -> list[HistoryEntry]:
        """Charges, grants and resets in commit order; ``limit`` keeps the most recent."""
        h = self._history
        query = sa.select(h).order_by(h.c.id.desc())
        if user is not None:
            query = query.where(h.c.user_name == user)
        if limit is not None:
            query = query.limit(limit)
        with self._engine.connect().execution_options(**{_READ_ONLY: True}) as conn:
            rows = conn.execute(query).all()
        return [
            HistoryEntry(
                id=r.id,
                at=to_utc(r.at),
                kind=r.kind,
                user=r.user_name,
                period=r.period,
                epsilon=r.epsilon_units / EPSILON_SCALE,
                delta=r.delta_units / DELTA_SCALE,
                fingerprint=r.fingerprint,
            )
            for r in reversed(rows)
        ]

    def close(self) -> None:
        """Close all pooled connections; the ledger must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _create_tables(self, schema: str | None) -> None:
        with self._engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                _check_writable(conn)
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_DDL_LOCK_KEY)))
                # Checked first: CREATE SCHEMA IF NOT EXISTS still needs CREATE privilege.
                assert schema is not None  # the PostgreSQL ledger always has one
                if not sa.inspect(conn).has_schema(schema):
                    conn.execute(sa.schema.CreateSchema(schema))
            self._metadata.create_all(conn)

    def _amounts(self) -> tuple[sa.Column[int], ...]:
        s = self._spend
        return (
            s.c.spent_epsilon_units,
            s.c.spent_delta_units,
            s.c.granted_epsilon_units,
            s.c.granted_delta_units,
        )

    def _add_within(
        self,
        conn: Connection,
        target: str,
        user: str,
        key: str,
        now: datetime,
        epsilon: tuple[int, int],
        delta: tuple[int, int],
    ) -> Amounts | None:
        """Add (amount, limit) pairs to the ``target`` ('spent' or 'granted') columns.

        One conditional UPDATE: either both new totals are within their caps (for 'spent',
        the limit plus the period's grants; for 'granted', the limit itself) and both are
        written, or nothing changes and None is returned. Otherwise the amounts after.
        The row usually exists, so it is created only when the UPDATE finds nothing.
        """
        params = {
            "p_user": user, "p_period": key, "p_now": now,
            "p_eps": epsilon[0], "p_eps_limit": epsilon[1], "p_dlt": delta[0], "p_dlt_limit": delta[1],
        }
        statement = self._add_statements[target]
        row = conn.execute(statement, params).one_or_none()
        if row is None:
            self._ensure_row(conn, user, key, now)
            row = conn.execute(statement, params).one_or_none()
        return row

    def _charge_on_driver(
        self,
        user: str,
        key: str,
        now: datetime,
        epsilon: tuple[int, int],
        delta: tuple[int, int],
        fingerprint: str | None,
    ) -> Amounts | None:
        """The common charge, on the driver's cursor: one conditional UPDATE and the history
        row, in one transaction; the amounts after, or None (nothing written) when the
        period's row is missing or the charge does not fit."""
        add, record = self._driver_charge
        raw = self._engine.raw_connection()
        try:
            cursor = raw.cursor()
            try:
                if self._engine.dialect.name == "sqlite":
                    cursor.execute("BEGIN IMMEDIATE")  # see _sqlite_engine
                cursor.execute(add.sql, add.parameters({
                    "p_user": user, "p_period": key, "p_now": now,
                    "p_eps": epsilon[0], "p_eps_limit": epsilon[1], "p_dlt": delta[0], "p_dlt_limit": delta[1],
                }))
                row = cursor.fetchone()
                if row is None:
                    raw.rollback()
                    return None
                cursor.execute(record.sql, record.parameters({
                    "at": now, "kind": "charge", "user_name": user, "period": key,
                    "epsilon_units": epsilon[0], "delta_units": delta[0], "fingerprint": fingerprint,
                }))
                raw.commit()
                return tuple(row)
            except BaseException:
                raw.rollback()
                raise
            finally:
                cursor.close()
        finally:
            raw.close()  # back to the pool

    def _ensure_row(self, conn: Connection, user: str, key: str, now: datetime) -> None:
        conn.execute(self._ensure_statement, {"p_user": user, "p_period": key, "p_now": now})

    def _read(
        self, conn: Connection, user: str, key: str, for_update: bool = False
    ) -> Amounts:
        s = self._spend
        query = sa.select(*self._amounts()).where(s.c.user_name == user, s.c.period == key)
        if for_update:
            query = query.with_for_update()
        row = conn.execute(query).one_or_none()
        return (0, 0, 0, 0) if row is None else row

    def _record(
        self,
        conn: Connection,
        kind: str,
        user: str,
        key: str,
        now: datetime,
        eps: int,
        dlt: int,
        fingerprint: str | None,
    ) -> None:
        conn.execute(
            self._history.insert(),
            {
                "at": now, "kind": kind, "user_name": user, "period": key,
                "epsilon_units": eps, "delta_units": dlt, "fingerprint": fingerprint,
            },
        )

    def _build_statements(self) -> None:
        """The hot statements, built once (SQLAlchemy then reuses their compiled form)."""
        s = self._spend
        user: sa.BindParameter[str] = sa.bindparam("p_user")
        period: sa.BindParameter[str] = sa.bindparam("p_period")
        now: sa.BindParameter[datetime] = sa.bindparam("p_now")
        self._ensure_statement = (
            self._insert(s)
            .values(
                user_name=user, period=period, spent_epsilon_units=0, spent_delta_units=0,
                granted_epsilon_units=0, granted_delta_units=0, updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["user_name", "period"])
        )
        eps, dlt, eps_limit, dlt_limit = (
            sa.bindparam(name, type_=sa.BigInteger) for name in ("p_eps", "p_dlt", "p_eps_limit", "p_dlt_limit")
        )
        caps = {
            "spent": (s.c.granted_epsilon_units + eps_limit, s.c.granted_delta_units + dlt_limit),
            "granted": (eps_limit, dlt_limit),
        }
        self._add_statements = {}
        for target, (eps_cap, dlt_cap) in caps.items():
            eps_col = s.c[f"{target}_epsilon_units"]
            dlt_col = s.c[f"{target}_delta_units"]
            self._add_statements[target] = (
                sa.update(s)
                .where(s.c.user_name == user, s.c.period == period, eps_col + eps <= eps_cap, dlt_col + dlt <= dlt_cap)
                .values({eps_col: eps_col + eps, dlt_col: dlt_col + dlt, s.c.updated_at: now})
                .returning(*self._amounts())
            )
        h = self._history
        record = sa.insert(h).values({c: sa.bindparam(c.name) for c in h.c if c.name != "id"})
        dialect = self._engine.dialect
        self._driver_charge = (
            DriverStatement.compile(self._add_statements["spent"], dialect),
            DriverStatement.compile(record, dialect),
        )


def _tables(schema: str | None) -> tuple[sa.MetaData, sa.Table, sa.Table]:
    metadata = sa.MetaData(schema=schema)
    spend = sa.Table(
        "budget_spend",
        metadata,
        sa.Column("user_name", sa.String(_MAX_USER_LEN), primary_key=True),
        sa.Column("period", sa.String(32), primary_key=True),
        sa.Column("spent_epsilon_units", sa.BigInteger, nullable=False, comment="1e-12 ε"),
        sa.Column("spent_delta_units", sa.BigInteger, nullable=False, comment="1e-18 δ"),
        sa.Column("granted_epsilon_units", sa.BigInteger, nullable=False, comment="1e-12 ε"),
        sa.Column("granted_delta_units", sa.BigInteger, nullable=False, comment="1e-18 δ"),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    history = sa.Table(
        "budget_history",
        metadata,
        # INTEGER PRIMARY KEY on SQLite is the rowid, which autoincrements; BIGINT is not.
        sa.Column(
            "id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True
        ),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("user_name", sa.String(_MAX_USER_LEN), nullable=False),
        sa.Column("period", sa.String(32), nullable=False),
        sa.Column("epsilon_units", sa.BigInteger, nullable=False, comment="1e-12 ε"),
        sa.Column("delta_units", sa.BigInteger, nullable=False, comment="1e-18 δ"),
        sa.Column("fingerprint", sa.Text),
        sa.Index("ix_budget_history_user", "user_name", "id"),
    )
    return metadata, spend, history


def _sqlite_engine(url: sa.URL) -> Engine:
    if url.database in (None, "", ":memory:") or "memory" in str(url.query.get("mode", "")):
        raise ValueError("the ledger must be durable: give sqlite:///path/to/file")
    engine = sa.create_engine(
        url,
        pool_size=5,
        max_overflow=15,
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
    )

    @sa.event.listens_for(engine, "connect")
    def _configure(dbapi_conn: Any, _record: Any) -> None:
        # The driver's own BEGIN handling is off: the "begin" hook below emits BEGIN.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _use_wal(cursor)
        # FULL: each commit syncs the WAL file. NORMAL syncs it only at checkpoints, so a power
        # loss or an OS crash could forget a reservation whose answers were already released.
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # A deferred transaction that reads first cannot later take the write lock once
        # another writer committed (SQLITE_BUSY without waiting); IMMEDIATE waits instead.
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

    return engine


def _use_wal(cursor: Any) -> None:
    """Put the database file in WAL mode (persistent), waiting out concurrent openers.

    Switching the journal mode takes an exclusive lock and SQLite may answer SQLITE_BUSY
    without consulting the busy handler, so several processes opening a fresh ledger at
    once retry here instead of failing.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() == "wal":
                return
            cursor.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _check_writable(conn: Connection) -> None:
    """Raise ReadOnlyLedger when ``conn``'s server cannot write: with the ledger's tables already
    there (replayed from a primary), a standby opened without a word and failed every charge."""
    in_recovery, read_only, fsync = conn.execute(sa.text(
        "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('transaction_read_only'), "
        "pg_catalog.current_setting('fsync')")).one()
    if fsync == "off":
        # No session can turn it back on; a test server may run so, a ledger should not.
        log.warning("the ledger's PostgreSQL runs with fsync = off: a power loss or an OS crash can forget "
                    "charges (answers already released would then be unaccounted for); turn it on there")
    if in_recovery:
        raise ReadOnlyLedger("the server is a hot standby (in recovery), where no charge can be written; "
                             "point ledger.url at the primary, or at another PostgreSQL that accepts writes")
    if read_only == "on":
        raise ReadOnlyLedger("its transactions are read-only (default_transaction_read_only is on for this role, "
                             "database or server), so no charge can be written; give the ledger's role a writable "
                             "default, or point ledger.url at another PostgreSQL")


def _postgres_engine(url: sa.URL) -> Engine:
    engine = sa.create_engine(
        url,
        pool_size=5,
        max_overflow=15,
        pool_pre_ping=True,
        isolation_level="READ COMMITTED",
        connect_args={"application_name": "dpproxy-ledger"},
    )

    @sa.event.listens_for(engine, "connect")
    def _commit_durably(dbapi_conn: Any, _record: Any) -> None:
        # An operator's synchronous_commit = off (or local, remote_write) for the server, the
        # database or the role acknowledges a commit before its WAL is flushed (on the standby
        # too, with synchronous replication): a crash of PostgreSQL, or a failover, then forgets
        # a charge, or a reservation that answers were spent from. A stronger remote_apply stays.
        with dbapi_conn.cursor() as cursor:
            cursor.execute(DURABLE_COMMIT_SQL)
        dbapi_conn.commit()

    return engine


DURABLE_COMMIT_SQL: Final = ("SELECT pg_catalog.set_config('synchronous_commit', 'on', false) "
                             "WHERE pg_catalog.current_setting('synchronous_commit') <> 'remote_apply'")
"""Run by every ledger session of PostgreSQL when it connects (``_postgres_engine``)."""


def _balance(
    user: str, budget: Budget, now: datetime, row: Amounts
) -> Balance:
    spent_eps, spent_dlt, granted_eps, granted_dlt = row
    return Balance(
        user=user,
        spent_epsilon=spent_eps / EPSILON_SCALE,
        spent_delta=spent_dlt / DELTA_SCALE,
        limit_epsilon=float(exact_decimal(budget.epsilon) + Decimal(granted_eps) / EPSILON_SCALE),
        limit_delta=float(exact_decimal(budget.delta) + Decimal(granted_dlt) / DELTA_SCALE),
        period_start=period_start(budget.period, now),
        granted_epsilon=granted_eps / EPSILON_SCALE,
        granted_delta=granted_dlt / DELTA_SCALE,
    )


def _check_user(user: str) -> None:
    if not isinstance(user, str) or not user or len(user) > _MAX_USER_LEN:
        raise ValueError(f"user must be a non-empty string of at most {_MAX_USER_LEN} characters")


def _check_amount(name: str, value: float, *, allow_inf: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value) or value < 0 or (math.isinf(value) and not allow_inf):
        bound = "a number" if allow_inf else "a finite number"
        raise ValueError(f"{name} must be {bound} >= 0, got {value!r}")


@lru_cache(maxsize=1024)
def exact_decimal(value: float) -> Decimal:
    """``value`` as the decimal it was written as: its shortest round-tripping form.

    Remembered by value: a charge reads the same ε, δ and limits on every answer, and
    ``repr`` plus ``Decimal`` cost a few µs each. Only 0.0 and -0.0 are equal floats with
    other forms; their decimals are equal too and no amount here is negative.
    """
    return Decimal(repr(float(value)))


def _exact_difference(limit: float, spent: float) -> float:
    # Decimal, so that 1.0 - 0.7 reads 0.3 and not 0.30000000000000004.
    return max(0.0, float(exact_decimal(limit) - exact_decimal(spent)))


def _units(value: float, scale: int, *, round_up: bool) -> int:
    """``value`` in units of 1/scale, from its shortest decimal form, rounded as asked."""
    exact = exact_decimal(value) * scale
    return math.ceil(exact) if round_up else math.floor(exact)


def _charge_units(name: str, value: float, scale: int) -> int:
    _check_amount(name, value, allow_inf=False)
    units = _units(value, scale, round_up=True)
    if units > _MAX_UNITS:
        raise ValueError(f"{name} {value!r} exceeds the ledger cap of {_MAX_UNITS / scale:g}")
    return units


def _limit_units(budget: Budget) -> tuple[int, int]:
    def one(value: float, scale: int) -> int:
        if math.isinf(value):
            return _MAX_UNITS
        return min(_MAX_UNITS, _units(value, scale, round_up=False))

    return one(budget.epsilon, EPSILON_SCALE), one(budget.delta, DELTA_SCALE)
