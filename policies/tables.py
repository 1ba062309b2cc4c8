"""The policy's tables as they exist on the backend: resolved to OIDs, with column types.

Built once when dpproxy connects to its backend (and again on reload); the rewriter and
the mechanisms read it. Relations are matched by OID, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, NamedTuple

from .model import Access, ColumnPolicy, TablePolicy
from .sql_names import quote_ident, quote_identifier

__all__ = ["ColumnFacts", "ColumnInfo", "Definition", "Relation", "TableRegistry", "quote_identifier"]


class ColumnFacts(NamedTuple):
    """What the catalog says of a column, as dpproxy judges statements by it (the facts a
    ``ColumnInfo`` is made of, read by proxy.backend.column_facts).

    ``parts`` is every type the column's values hold (itself, a domain's base type, an array's
    element, a composite's fields, a range's subtype, recursively) and ``domain_constraints`` the
    constraints of the domains among them, by OID: a composite type altered or a domain constraint
    added changes what a statement on the column may raise, though the column's own type is the same.
    ``enum_labels`` are the labels of the enums among them, in each one's sort order: a label
    renamed (``ALTER TYPE ... RENAME VALUE``) changes no OID, yet a category the policy names
    can no longer be read as a value of the column. ``collation`` is the column's collation's schema
    and name unless it is the database's default (``ColumnInfo.collation``): one renamed or another
    one put on the column is a change the re-check notices.
    A named tuple: the periodic re-check makes one of each protected column's catalog row.
    """

    name: str
    type_oid: int
    type_modifier: int
    attnum: int
    deterministic_collation: bool
    array_type_oid: int
    container: bool
    enum: bool
    parts: tuple[int, ...]
    domain_constraints: tuple[int, ...]
    enum_labels: tuple[str, ...] = ()
    byte_order: bool = True
    collation: tuple[str, str] | None = None


Definition = tuple[ColumnFacts, ...]
"""A relation's columns' facts, in column order."""


@dataclass(frozen=True)
class ColumnInfo:
    """A column of a backend table: name as stored (case-folded), type OID and modifier.

    ``deterministic_collation`` is False when the column's collation is nondeterministic,
    which PostgreSQL ≤ 17 refuses in LIKE/ILIKE per compared row. ``array_type_oid`` is the
    type of an array of the column's values (0: none), which carries a GROUP BY's keys.
    ``container`` is True for an array or composite type (or a domain over one): comparing
    such values looks up the element or field types' equality and ordering only when two
    values meet, so ``pa = '{"(0,0)"}'`` on a ``point[]`` column fails only on a table that
    holds an array of that shape (rewriter/predicates.py refuses comparisons on them).
    ``distinct_countable`` is False when PostgreSQL has no ordering to sort the type's values
    by for ``count(DISTINCT ...)`` (json, point, box ...): it fails such a statement on every
    table, and dpproxy refuses it before the charge (asked of the backend at load). ``enum``:
    PostgreSQL has no operator comparing the column with a number or a boolean (42883, on every
    table: refused before the charge). ``builtin`` is False when the column's values are, or hold
    (through a domain, as an array's elements, a composite's fields or a range's bounds), values of
    a type not built into PostgreSQL: an extension's (pgvector's ``vector``) or a user's base,
    range or composite type. Its comparison, equality and hash functions are code dpproxy cannot
    vouch for, which may raise on some pairs of values only (``vector``'s on two of different
    dimensions): such a column is counted and tested for NULL, and nothing else.
    ``base_type_oid`` and ``base_type_modifier`` are a domain column's base type (through domains
    over domains; ``varchar(n)``'s n from the domain), 0 and -1 for a column that is no domain: a
    domain over ``text`` or ``bytea`` is bounded as its base type is (rewriter/text_bounds.py).
    ``unbounded_length`` is True when one value can be of any length and no header tells its size
    without reading it (``jsonb``, ``tsvector``, arrays, ``numrange``, ``path``, a composite, a
    ``bit(n)`` of over 2,048 bits …; not text, varchar, char, bytea, numeric, inet, cidr, a shorter
    ``bit(n)`` or a range of a fixed-length type): comparing, sorting or
    grouping such a value reads all of it, so such a column too is counted and tested for NULL only.
    ``byte_order`` is False when the column's collation orders text otherwise than by its bytes (ICU's,
    or libc's for a locale other than ``C``, ``POSIX`` and ``C.UTF-8``, directly or as the database's
    default): PostgreSQL then compares two values with ``<`` (and, under a nondeterministic
    collation, ``=``), sorts and hashes them through the locale's code, many times the cost a byte of
    ``memcmp`` (rewriter/text_bounds.py weighs it so).
    ``type_name`` is the column's type as the backend's ``format_type`` writes it (as psql's ``\\d``
    shows it: ``character varying(20)``, ``mood``, ``integer[]``), read with the rest at load; empty
    when not read.
    ``printed_labels`` are the declared categories, then ``other``, each as PostgreSQL prints a value
    of the column's type read from it (its output function: ``'Male'`` of a ``char(6)`` as ``'Male  '``,
    ``'yes'`` of a boolean as ``t``, ``'2024-1-1'`` of a date as ``2024-01-01``), read at load; empty
    when not read (:meth:`labels` then gives them as declared).
    ``collation`` is the column's own collation as its schema and name, None when it has none or
    the database's default: the outer statement compares and orders a category key's released labels
    under it (rewriter/post_process.py), as PostgreSQL compares the column's values.
    """

    name: str
    type_oid: int
    type_modifier: int
    attnum: int
    policy: ColumnPolicy | None
    deterministic_collation: bool = True
    array_type_oid: int = 0
    container: bool = False
    distinct_countable: bool = True
    enum: bool = False  # an enum (or a domain over one): compared only with its labels
    builtin: bool = True
    base_type_oid: int = 0
    base_type_modifier: int = -1
    unbounded_length: bool = False
    type_name: str = ""
    byte_order: bool = True
    printed_labels: tuple[str, ...] = ()
    collation: tuple[str, str] | None = None

    @property
    def value_type(self) -> tuple[int, int]:
        """The type OID and modifier the column's values are read as: a domain's base type, else its own."""
        return (self.base_type_oid, self.base_type_modifier) if self.base_type_oid else (self.type_oid, self.type_modifier)

    def labels(self) -> tuple[str, ...]:
        """What dpproxy releases for the column's categories (a MODE's answer, a GROUP BY key's
        cells), in the policy's order, ``other`` last: each as PostgreSQL prints the column's value
        equal to it (``printed_labels``), so a released label reads as PostgreSQL's answer would."""
        policy = self.policy
        assert policy is not None and policy.categories is not None
        return self.printed_labels or (*policy.categories, *((policy.other,) if policy.other is not None else ()))


@dataclass(frozen=True)
class Relation:
    """A backend relation named by the policy.

    ``partition_key`` is how sample and aggregate assigns rows to partitions
    (``rewriter.rewrite.partition_key``), from the policy's ``partitioning``: ``"row"``, a
    keyed hash of the values of ``hashed_columns`` (``row_hash``, the columns chosen at load
    from the schema), ``"random"``, a per-row ``random()`` draw, or ``"ctid"``, a keyed hash
    of the row's physical id (``ctid_hash``, checked at load to be possible on this relation
    and backend).

    ``sort_memory_kb`` is the memory a sort or hash of every row the relation could hold took when
    the policy was loaded (rewriter/sort_memory.py): above the table's ``max_sort_memory_mb`` its
    statements that sort rows are refused without ``answer_quantum_ms``. 0: not read.
    ``sort_memory_bases`` are the relations whose pages bound a view's rows, and whose bound is the
    view's (a view of one relation's rows, each column one of its columns, PostgreSQL's simple
    view: proxy/backend/view_rows.py); () a relation whose own pages do; None a view whose rows no
    pages bound (it may join or expand its relations, or compute its values): its statements that
    sort rows are refused without ``answer_quantum_ms``.
    ``view_input_bytes`` are, for such a view, the most the planner may estimate a read of each of
    its policy's columns to carry into an aggregate's input (the values it is computed from:
    proxy/backend/view_widths.py); empty for a relation whose columns carry themselves.
    """

    oid: int
    schema: str
    name: str
    policy: TablePolicy
    columns: Mapping[str, ColumnInfo] = field(default_factory=dict)
    partition_key: Literal["row", "ctid", "random"] = "random"
    hashed_columns: tuple[str, ...] = ()
    sort_memory_kb: int = 0
    sort_memory_tree: bool = False
    sort_memory_bases: tuple[int, ...] | None = ()
    view_input_bytes: Mapping[str, int] = field(default_factory=dict)

    @property
    def access(self) -> Access:
        return self.policy.access

    @property
    def qualified_name(self) -> str:
        """Schema-qualified and quoted, for SQL that dpproxy writes itself."""
        return f"{quote_identifier(self.schema)}.{quote_identifier(self.name)}"

    @property
    def display_name(self) -> str:
        """The name as an analyst writes it, each part as ``quote_ident`` writes it (``adult``,
        ``analytics.events``, ``"Sales"."Order.Items"``), the ``public`` schema left out."""
        table = quote_ident(self.name)
        return table if self.schema == "public" else f"{quote_ident(self.schema)}.{table}"


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: a reload makes a new one
class TableRegistry:
    """The policy's relations by OID, and the backend's pg_class and pg_database column lists (for
    neutralising)."""

    by_oid: Mapping[int, Relation]
    pg_class_columns: tuple[str, ...] = ()
    # Every function name on the backend (pg_proc.proname): a name after a dot that is one of
    # them may be an attribute-notation call (rewriter.function_check). None: not known.
    function_names: frozenset[str] | None = None
    # The protected relations the service role could not read at the last check, by OID, each
    # with that role's name: a statement on one is refused before its charge, not charged and
    # then failed with "permission denied" (proxy.backend.grants; rewriter.classify).
    unreadable: Mapping[int, str] = field(default_factory=dict)
    # The protected relations that read through an expression that can fail on a row (a view
    # redefined since the policy was loaded), by OID, each with that expression: a statement on
    # one is refused before its charge until a reload (proxy.backend.row_failures).
    fallible: Mapping[int, str] = field(default_factory=dict)
    # Each protected relation's columns as the catalog described them when this registry was
    # built, by OID: what ``by_oid``'s column facts were made of (proxy.backend.column_facts).
    definitions: Mapping[int, Definition] = field(default_factory=dict)
    # The protected relations whose definition differs from ``definitions`` at the last check (a
    # column's type, collation or domain changed, a column dropped or added, the table dropped), by
    # OID, each with what changed, when the policy in force no longer fits it (proxy.serving.server
    # resolves the policy again first): a statement on one is refused before its charge until a reload.
    redefined: Mapping[int, str] = field(default_factory=dict)
    pg_database_columns: tuple[str, ...] = ()

    def get(self, oid: int) -> Relation | None:
        return self.by_oid.get(oid)
