"""The policy: who may connect, what they may spend, and how each table is protected.

A policy is plain data, validated once on load (see ``policies.loader``); the rest of
dpproxy only reads it. Field names are the YAML keys documented in docs/policy.md.
"""

from __future__ import annotations

import math
import os
from datetime import date, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from mechanisms.breach import epsilon_from_breach
from mechanisms.fixed_point import Grid
from mechanisms.quantile import QuantileGrid
from mechanisms.sum_count import centre
from mechanisms.variance import MomentGrid

from .credentials import ScramVerifier, derive_scram_verifier, parse_scram_verifier
from .dsn import check_dsn
from .errors import SQLSTATE, Refusal
from .relation_keys import key_parts
from .time_buckets import TIME_UNITS, TimeUnit, answered_units, bucket_count

__all__ = [
    "Access",
    "AuditConfig",
    "BackendConfig",
    "BudgetConfig",
    "ColumnPolicy",
    "LedgerConfig",
    "ListenConfig",
    "MAX_BUDGET_EPSILON",
    "MIN_EPSILON",
    "MetricsConfig",
    "Policy",
    "PoolConfig",
    "QuantileGrid",
    "RepeatConfig",
    "TablePolicy",
    "TLSConfig",
    "UserPolicy",
    "WITHOUT_SECRETS",
]

#: The largest budget ε a policy may give: the ledger counts in integer units of 1e-12 ε
#: and caps a limit at about 1.15e6 ε (policies.ledger), so anything above could not be
#: represented exactly and would silently be capped. δ is below 1 anyway.
MAX_BUDGET_EPSILON: Final = 1_000_000.0

Access = Literal["protected", "public"]
# How AVG is answered: a noisy clamped sum over a noisy count (pure ε, the default), or sample
# and aggregate with a smooth-sensitivity median ((ε, δ), chosen per table or column).
AvgMethod = Literal["sample_aggregate", "sum_count"]

#: The smallest ε of one query (a table's epsilon, max_query_epsilon, SET dpproxy.epsilon).
#: Below it noise scales overflow to infinity for wide bounds and the ledger's units (1e-12 ε)
#: would round a charge away; at it every mechanism still answers (tests/test_statement_limits.py).
MIN_EPSILON = 1e-6


def _at_least_min_epsilon(value: float | None, what: str) -> float | None:
    if value is not None and value < MIN_EPSILON:
        raise ValueError(f"{what} {value:g} is below the minimum ε {MIN_EPSILON:g}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


#: The validation context that loads a policy without its secrets (``parse_policy(...,
#: secrets=False)``): environment variables named by ``*_env`` are not read and users' SCRAM
#: keys not derived, for commands that never connect to the backend nor authenticate anyone.
WITHOUT_SECRETS: Final = {"secrets": False}


def _reads_secrets(info: ValidationInfo) -> bool:
    return not (isinstance(info.context, dict) and info.context.get("secrets") is False)


def _from_env(value: str | None, env: str | None, what: str, info: ValidationInfo) -> str | None:
    if env is None:
        return value
    if value is not None:
        raise ValueError(f"give either {what} or {what}_env, not both")
    if not _reads_secrets(info):
        return None
    if env not in os.environ:
        raise ValueError(f"environment variable {env} (named by {what}_env) is not set")
    if not os.environ[env]:
        raise ValueError(f"environment variable {env} (named by {what}_env) is empty")
    return os.environ[env]


class PoolConfig(_Strict):
    """The backend connection pool every client session borrows from (proxy/backend/pool.py)."""

    # Most backend connections open at once, in use and idle together.
    size: int = Field(20, ge=1, le=10_000)
    # How long a statement waits for a connection when all ``size`` are in use (then 53300).
    checkout_timeout_s: float = Field(30.0, gt=0, le=3600)
    # An idle connection unused this long is closed (0: never).
    idle_timeout_s: float = Field(300.0, ge=0)


class BackendConfig(_Strict):
    """The PostgreSQL that holds the data, reached as one service role."""

    dsn: str | None = None
    dsn_env: str | None = None
    statement_timeout_ms: int = Field(30_000, gt=0)
    connect_timeout_s: float = Field(10.0, gt=0)
    pool: PoolConfig = PoolConfig()

    @field_validator("dsn")
    @classmethod
    def _dsn_parses(cls, dsn: str | None) -> str | None:
        if dsn:  # libpq's syntax only: whether it connects is for check-config and serve
            check_dsn(dsn)
        return dsn

    @model_validator(mode="after")
    def _resolve_dsn(self, info: ValidationInfo) -> "BackendConfig":
        dsn = _from_env(self.dsn, self.dsn_env, "dsn", info)
        if not dsn and not (self.dsn_env and not _reads_secrets(info)):
            raise ValueError("backend needs dsn or dsn_env")
        if not dsn:
            return self  # loaded without secrets: dsn_env is not read
        if self.dsn_env is not None:
            try:
                check_dsn(dsn)
            except ValueError as exc:
                raise ValueError(f"environment variable {self.dsn_env} (named by dsn_env): {exc}") from None
        object.__setattr__(self, "dsn", dsn)
        return self


class TLSConfig(_Strict):
    """TLS for client connections: a certificate chain and its key (PEM files)."""

    cert: str
    key: str
    required: bool = False


class ListenConfig(_Strict):
    """Where dpproxy accepts clients."""

    host: str = "127.0.0.1"
    port: int = Field(6432, ge=0, le=65535)
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    # A longer query string is refused (54000) before it is parsed (docs/policy.md).
    max_statement_bytes: int = Field(1024 * 1024, ge=1024)
    # A post-processed DP answer's text, measured on the backend before it is sent (54000 past it).
    max_answer_bytes: int = Field(64 * 1024 * 1024, ge=1024)
    tls: TLSConfig | None = None
    startup_timeout_s: float = Field(10.0, gt=0)
    idle_timeout_s: float = Field(0.0, ge=0)
    idle_in_transaction_timeout_s: float = Field(0.0, ge=0)
    # On SIGTERM: how long running statements may take to finish before their sessions are cut.
    shutdown_grace_s: float = Field(30.0, ge=0)
    # Serving processes sharing the port (SO_REUSEPORT), the ledger and the repeat store.
    workers: int = Field(1, ge=1, le=64)
    # Client connections one serving process keeps open at once, in any phase (53300 past it).
    max_connections: int = Field(10_000, ge=1)


class MetricsConfig(_Strict):
    """Where the Prometheus metrics endpoint listens (``metrics: null``, the default: no endpoint)."""

    host: str = "127.0.0.1"
    port: int = Field(9187, ge=0, le=65535)


class LedgerConfig(_Strict):
    """Where the budget ledger lives (a SQLAlchemy URL)."""

    url: str = "sqlite:///dpproxy-ledger.sqlite3"
    # Queries' worth of budget one ledger write reserves (1: every answer writes the ledger).
    reserve: int = Field(10, ge=1, le=1000)
    # Seconds after which an unused reservation goes back to the ledger, for other replicas.
    release_idle_s: float = Field(1.0, gt=0, le=3600)
    schema_name: str | None = Field(None, alias="schema")


class RepeatConfig(_Strict):
    """Answering a repeated DP query with its earlier noisy answer, at no cost."""

    enabled: bool = True
    ttl_s: float = Field(86_400.0, gt=0)
    max_entries: int = Field(10_000, ge=1)


class AuditConfig(_Strict):
    """Where the audit log goes: a file appended to, or (None) the ``dpproxy.audit`` logger."""

    path: str | None = Field(None, min_length=1)


class BudgetConfig(_Strict):
    """A user's total privacy budget, optionally renewed every period."""

    epsilon: float = Field(gt=0, le=MAX_BUDGET_EPSILON)
    delta: float = Field(0.0, ge=0, lt=1)
    period: Literal["day", "week", "month"] | None = None


class UserPolicy(_Strict):
    """An analyst: how they authenticate and what they may spend."""

    password: str | None = None
    password_env: str | None = None
    scram_verifier: str | None = None
    auth: Literal["scram-sha-256", "md5", "cleartext"] = "scram-sha-256"
    budget: BudgetConfig
    max_query_epsilon: float | None = Field(None, gt=0)
    # Sessions this user may have open at once in one serving process (None: no limit).
    max_sessions: int | None = Field(None, ge=1)
    _scram: ScramVerifier | None = PrivateAttr(None)

    @property
    def scram_keys(self) -> ScramVerifier:
        """The SCRAM-SHA-256 salt, StoredKey, ServerKey and rounds a login is checked against."""
        # Read from pydantic's store of private values: ``self._scram`` goes through
        # BaseModel.__getattr__, whose descriptor probe raises and catches an AttributeError,
        # at every login.
        keys: ScramVerifier | None = (self.__pydantic_private__ or {}).get("_scram")
        assert keys is not None, "only users with auth: scram-sha-256 have SCRAM keys"
        return keys

    @field_validator("max_query_epsilon")
    @classmethod
    def _query_epsilon_minimum(cls, value: float | None) -> float | None:
        return _at_least_min_epsilon(value, "max_query_epsilon")

    @model_validator(mode="after")
    def _resolve_password(self, info: ValidationInfo) -> "UserPolicy":
        password = _from_env(self.password, self.password_env, "password", info)
        object.__setattr__(self, "password", password or None)
        if not _reads_secrets(info):
            if self.password is None and self.password_env is None and self.scram_verifier is None:
                raise ValueError("a user needs password, password_env or scram_verifier")
            return self  # no keys: nobody authenticates against a policy loaded without secrets
        if self.scram_verifier is not None:
            if self.auth != "scram-sha-256":
                raise ValueError(f"scram_verifier only works with auth: scram-sha-256, not {self.auth}")
            if password:
                raise ValueError("give either a password or a scram_verifier, not both")
            self._scram = parse_scram_verifier(self.scram_verifier)
        elif not password:
            raise ValueError("a user needs password, password_env or scram_verifier")
        elif self.auth == "scram-sha-256":
            self._scram = derive_scram_verifier(password)  # once per policy load, not per login
        return self


class ColumnPolicy(_Strict):
    """What is known in advance about a column: numeric bounds, a time range or a category list.

    ``bounds: [lo, hi]`` of numbers bound a numeric column; of dates or timestamps
    (``[2021-01-01, 2024-12-31]``) they declare a date/timestamp column's time range, read
    into ``time_bounds`` (wall-clock times). ``group_by`` opts the column in as a GROUP BY key
    over its declared domain (docs/policy.md): ``true`` for categories (every declared category
    is a key, plus ``other`` if named: the key of every row whose value is not declared) and
    for an integer column's bounds (every integer in them, and ``width_bucket`` bins of any
    bounded column); for a time range, the finest ``DATE_TRUNC`` units it may be grouped by
    (``[month]``; ``true`` for all of them): the coarser units nested in a listed one follow
    (``policies.time_buckets.answered_units``: quarter and year from month, every unit from day). ``avg`` overrides the table's AVG method for
    this column (None: the table's).
    """

    bounds: tuple[float, float] | None = None
    time_bounds: tuple[datetime, datetime] | None = None
    categories: tuple[str, ...] | None = None
    group_by: bool | tuple[TimeUnit, ...] = False
    other: str | None = None
    avg: AvgMethod | None = None

    @model_validator(mode="before")
    @classmethod
    def _time_range(cls, data: Any) -> Any:
        """``bounds`` of dates or timestamps are a time range: moved to ``time_bounds``."""
        if isinstance(data, dict) and isinstance(data.get("bounds"), (list, tuple)):
            values = list(data["bounds"])
            times = [_is_time(value) for value in values]
            if any(times) and not all(times):
                raise ValueError("a time range needs two dates or timestamps, e.g. bounds: [2021-01-01, 2024-12-31]")
            if values and all(times):
                data = {**data, "time_bounds": tuple(_as_datetime(value) for value in values)}
                del data["bounds"]
        return data

    @field_validator("group_by", mode="before")
    @classmethod
    def _group_by_form(cls, value: Any) -> Any:
        """One clear error for a wrong group_by, rather than one per member of its union type."""
        if isinstance(value, bool):
            return value
        if not isinstance(value, (list, tuple)):
            raise ValueError("give true, false or a list of time units, the finest to answer, e.g. group_by: [month] "
                             "(month, and quarter and year nested in it)")
        unknown = [unit for unit in value if unit not in TIME_UNITS]
        if unknown:
            raise ValueError(f"unknown time unit {unknown[0]!r} (one of {', '.join(TIME_UNITS)}; a day is the finest: "
                             "list day to answer every unit)")
        return tuple(value)

    @model_validator(mode="after")
    def _one_kind(self) -> "ColumnPolicy":
        kinds = [self.bounds, self.time_bounds, self.categories]
        if sum(kind is not None for kind in kinds) != 1:
            if self.group_by and not any(kind is not None for kind in kinds):
                raise ValueError("group_by needs a declared domain: categories: [...], bounds: [lo, hi] or "
                                 "a time range (bounds of dates)")
            raise ValueError("a column needs exactly one of bounds: [lo, hi] or categories: [...]")
        if self.bounds is not None:
            lo, hi = self.bounds
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                raise ValueError(f"bounds must be finite with lo <= hi, got [{lo}, {hi}]")
        if self.time_bounds is not None and self.time_bounds[0] > self.time_bounds[1]:
            lo_t, hi_t = self.time_bounds
            raise ValueError(f"time bounds must have lo <= hi, got [{lo_t}, {hi_t}]")
        if self.categories is not None and (
            not self.categories or len(set(self.categories)) != len(self.categories)
        ):
            raise ValueError("categories must be a non-empty list without repeats")
        if self.avg is not None and self.bounds is None:
            raise ValueError("avg is how AVG of a numeric column is answered: it needs bounds: [lo, hi] of numbers")
        self._check_group_by()
        return self

    def _check_group_by(self) -> None:
        if isinstance(self.group_by, tuple):
            if self.time_bounds is None:
                raise ValueError("group_by: [units] is for a time range (bounds of dates); "
                                 "use group_by: true for categories or numeric bounds")
            if not self.group_by or len(set(self.group_by)) != len(self.group_by):
                raise ValueError("group_by needs at least one time unit, without repeats")
        if self.other is not None:
            if self.categories is None or self.group_by is not True:
                raise ValueError("other names the GROUP BY key of undeclared values: it needs categories "
                                 "and group_by: true")
            if self.other in self.categories:
                raise ValueError(f"other ({self.other!r}) must not be one of the declared categories")

    @property
    def sensitivity(self) -> float:
        """L1 sensitivity of a clamped SUM: the largest magnitude one row can contribute."""
        assert self.bounds is not None
        return max(abs(self.bounds[0]), abs(self.bounds[1]))

    @property
    def sum_grid(self) -> Grid:
        """The fixed-point grid a float column's clamped values are summed on
        (``mechanisms.fixed_point``): the backend adds rint(x·2^k), exactly."""
        assert self.bounds is not None
        return Grid.for_bounds(*self.bounds)

    @property
    def total_digits(self) -> int:
        """The fraction digits a numeric column's exact clamped sum is sent with
        (``Grid.deciding_digits``): enough to decide its rounding onto the sum grid, for SUM
        and for a ``sum_count`` AVG centred on the bounds' midpoint."""
        assert self.bounds is not None
        return self.sum_grid.deciding_digits(centre(*self.bounds))

    def moment_grid(self, integer_column: bool) -> MomentGrid:
        """The grid a VARIANCE or STDDEV of this column counts its centred values on
        (``mechanisms.variance``): step 1/2 for an integer column, else the sum grid."""
        assert self.bounds is not None
        return MomentGrid.for_bounds(*self.bounds, integer=integer_column)

    def quantile_grid(self, integer_column: bool, cells: int) -> QuantileGrid:
        """The candidates of a percentile of this column (``mechanisms.quantile``): from its bounds
        and the table's ``quantile_cells`` alone, never from the rows."""
        assert self.bounds is not None
        return QuantileGrid.for_bounds(*self.bounds, integer_column, cells)

    @property
    def time_units(self) -> tuple[TimeUnit, ...]:
        """The DATE_TRUNC units this column may be grouped by, finest first: the units listed and
        the coarser ones nested in them (none unless opted in)."""
        return answered_units(self.listed_units)

    @property
    def listed_units(self) -> tuple[TimeUnit, ...]:
        """The time units ``group_by`` lists (all of them for ``true``; none unless opted in)."""
        if self.time_bounds is None or self.group_by is False:
            return ()
        return TIME_UNITS if self.group_by is True else self.group_by

    def bucket_count(self, unit: TimeUnit) -> int:
        """How many ``unit`` buckets the time range spans (the keys of a DATE_TRUNC group)."""
        assert self.time_bounds is not None
        return bucket_count(unit, *self.time_bounds)

    @property
    def key_count(self) -> int | None:
        """The cells of ``GROUP BY column`` (declared categories and ``other``, or the integers in
        the bounds), or None if the column is not opted in as such a key."""
        if self.group_by is not True:
            return None
        if self.categories is not None:
            return len(self.categories) + (self.other is not None)
        if self.bounds is not None and all(float(bound).is_integer() for bound in self.bounds):
            return int(self.bounds[1]) - int(self.bounds[0]) + 1
        return None


def _is_time(value: Any) -> bool:
    if isinstance(value, (date, datetime)):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            try:
                datetime.fromisoformat(value)
            except ValueError:
                return False
            return True
    return False


def _as_datetime(value: date | datetime | str) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise ValueError("time bounds are wall-clock times without a time zone offset")
        return value
    return datetime(value.year, value.month, value.day)


class TablePolicy(_Strict):
    """How one table is exposed: passed through (public) or answered only with DP aggregates."""

    access: Access = "protected"
    epsilon: float | None = Field(None, gt=0)
    prior: float | None = Field(None, gt=0, lt=1)
    posterior: float | None = Field(None, gt=0, lt=1)
    delta: float = Field(1e-6, ge=0, lt=1)
    # m for sample and aggregate; how to choose it: docs/mechanisms.md. 512 keeps the median's
    # range term near 1% of the bounds down to ε/k ≈ 0.5 at δ = 1e-6 (mechanisms.smooth_median
    # .recommended_partitions) and needs ≈ 15,000 filtered rows for 30 rows per partition.
    partitions: int = Field(512, ge=3, le=10_000)
    # AVG's default is the noisy sum over a noisy count: pure ε, and on the demo table two orders
    # of magnitude more accurate than sample and aggregate (docs/accuracy.md). Columns may
    # override it (``columns.NAME.avg``).
    avg: AvgMethod = "sum_count"
    # How sample and aggregate assigns rows to partitions (docs/mechanisms.md): row_hash, a
    # keyed hash of the row's values, is exact under any neighbouring tables and runs in
    # parallel; random() is exact too but serial, and splits duplicate rows; ctid_hash runs
    # in parallel and assumes that other rows keep their place when one is added or removed.
    # auto: row_hash over the primary key when the table has one (fast, no row shares a
    # partition by being equal to another), else random.
    partitioning: Literal["auto", "row_hash", "random", "ctid_hash"] = "auto"
    # The most cells (the product of the keys' domains) one GROUP BY may answer.
    max_cells: int = Field(1000, ge=1, le=100_000)
    # The candidates of PERCENTILE_CONT/PERCENTILE_DISC (mechanisms.quantile): an integer column
    # whose bounds hold at most this many integers has each integer; any other, this many equal
    # cells of its bounds. More cells: a finer answer and a slightly larger rank error, ln(20·K).
    quantile_cells: int = Field(1000, ge=1, le=100_000)
    # Every DP answer on the table leaves at a whole multiple of this after it began
    # (proxy/dp/answer_time.py), so that its arrival shows no more of the rows' timing.
    answer_quantum_ms: int = Field(0, ge=0, le=3_600_000)
    # The most bytes of a text value a DP statement reads: a longer value reads as NULL in every
    # construct (rewriter/text_bounds.py), so what one row's text adds to a statement's time is
    # bounded by this, not by what someone stored. 1 GB is PostgreSQL's own limit on a value.
    max_text_bytes: int = Field(256, ge=1, le=1_073_741_823)
    # The most memory, in MB, one sort or hash table of a DP statement on the table may be granted:
    # statements that sort or group rows run with work_mem at what every row the table can hold
    # would take, so that no filter tips one into spilling (rewriter/sort_memory.py); on a table
    # whose bound is above this, without answer_quantum_ms, they are refused (54000, sort-memory).
    max_sort_memory_mb: int = Field(256, ge=1, le=2_097_151)
    columns: dict[str, ColumnPolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _categories_within_text_bound(self) -> "TablePolicy":
        """A declared category longer than ``max_text_bytes`` could never be matched: its rows read as NULL."""
        for name, column in self.columns.items():
            longest = max((len(category.encode("utf-8")) for category in column.categories or ()), default=0)
            if longest > self.max_text_bytes:
                raise ValueError(f"columns.{name}: a category of {longest} bytes is longer than the table's "
                                 f"max_text_bytes {self.max_text_bytes}, beyond which a value reads as NULL; "
                                 "raise max_text_bytes or shorten the category")
        return self

    @model_validator(mode="after")
    def _cells_within_cap(self) -> "TablePolicy":
        """A declared GROUP BY domain of more cells than ``max_cells`` could never be answered."""
        for name, column in self.columns.items():
            # A nested unit has no more buckets than the listed unit it is nested in.
            over = [f"{unit} ({column.bucket_count(unit)})" for unit in column.listed_units
                    if column.bucket_count(unit) > self.max_cells]
            coarser = " or list a coarser unit (a listed unit answers the units nested in it too)" if over else ""
            if column.categories is not None and (column.key_count or 0) > self.max_cells:
                over.append(f"categories ({column.key_count})")
            if over:
                raise ValueError(f"columns.{name}: group_by has more cells than max_cells {self.max_cells}: "
                                 f"{', '.join(over)}; raise max_cells or narrow the domain{coarser}")
        return self

    @model_validator(mode="after")
    def _sampled_avg_has_delta(self) -> "TablePolicy":
        """A column set to ``avg: sample_aggregate`` on a table without δ could never be answered."""
        if self.access == "protected" and self.delta <= 0:
            for name, column in self.columns.items():
                if column.avg == "sample_aggregate":
                    raise ValueError(f"columns.{name}: avg: sample_aggregate is (ε, δ)-DP and needs the table's "
                                     "delta > 0; give the table a delta such as 1e-6, or use avg: sum_count")
        return self

    def avg_method(self, column: str) -> AvgMethod:
        """How AVG(column) is answered outside GROUP BY: the column's ``avg``, else the table's."""
        policy = self.columns.get(column)
        return policy.avg if policy is not None and policy.avg is not None else self.avg

    @field_validator("epsilon")
    @classmethod
    def _epsilon_minimum(cls, value: float | None) -> float | None:
        return _at_least_min_epsilon(value, "epsilon")

    @model_validator(mode="after")
    def _derive_epsilon(self) -> "TablePolicy":
        if self.access == "public":
            return self
        has_breach = self.prior is not None or self.posterior is not None
        if has_breach and self.epsilon is not None:
            raise ValueError("give either epsilon or prior/posterior, not both")
        if has_breach:
            if self.prior is None or self.posterior is None:
                raise ValueError("prior and posterior go together")
            object.__setattr__(self, "epsilon", epsilon_from_breach(self.prior, self.posterior))
        if self.epsilon is None:
            raise ValueError("a protected table needs epsilon (or prior and posterior)")
        _at_least_min_epsilon(self.epsilon, "epsilon derived from prior and posterior")
        return self


def _relation_key(key: str) -> str:
    key_parts(key)  # raises ValueError for a quoted key written otherwise than "schema"."table"
    return key


RelationKey = Annotated[str, AfterValidator(_relation_key)]
"""A key of ``tables``: a relation's name (``policies.relation_keys``)."""


class Policy(_Strict):
    """The whole configuration file."""

    backend: BackendConfig
    listen: ListenConfig = ListenConfig()
    ledger: LedgerConfig = LedgerConfig()
    audit: AuditConfig = AuditConfig()
    repeats: RepeatConfig = RepeatConfig()
    metrics: MetricsConfig | None = None
    users: dict[str, UserPolicy]
    tables: dict[RelationKey, TablePolicy]

    def user(self, name: str) -> UserPolicy:
        """The user ``name``; Refusal 57P01 when this policy does not list them: a reload
        dropped them while a statement of theirs was under way (their session ends after it)."""
        account = self.users.get(name)
        if account is None:
            raise Refusal(SQLSTATE.ADMIN_SHUTDOWN,
                          f'terminating connection: the policy reloaded no longer lists user "{name}"',
                          "An administrator removed this login from the policy.")
        return account

    @field_validator("users")
    @classmethod
    def _some_user(cls, users: dict[str, UserPolicy]) -> dict[str, UserPolicy]:
        if not users:
            raise ValueError("at least one user is needed")
        return users
