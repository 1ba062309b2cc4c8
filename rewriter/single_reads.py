"""The single reads of a DP statement: its reads of a row's text value besides its conditions'
terms, each weighed in the statement's work limit (rewriter/text_bounds.py).

A condition term reads a text value once for each term; the work limit weighs each by the bytes
it may read, the column's bound (:func:`rewriter.text_bounds.value_bytes`). Four other constructs
read each row's value too, once a row whatever the conditions, and each touches every byte the
row holds up to the bound, so a row whose value is at the bound costs them more than one whose
value is empty, in proportion to the bound (benchmarks/single_reads.py; docs/threat-model.md,
Timing):

* ``COUNT(DISTINCT col)``: the rows are shuffled (a sort by ``random()``, which copies the value)
  and then sorted by the value, ~log2(n) comparisons a row, each of which copies both values
  into buffers where the collation is not ``C``: :data:`DISTINCT_WORK` a byte, and
  :data:`COLLATED_DISTINCT_WORK` where the collation's code compares (``ColumnInfo.byte_order``);
* a categorical GROUP BY key: each row's value is compared with each declared category to find
  its cell, which the rows are grouped by (rewriter/sort_memory.py):
  :func:`~rewriter.text_bounds.comparison_work` a byte those comparisons read (:func:`_compared_bytes`:
  under a deterministic collation the categories' own bytes, PostgreSQL comparing sizes first), and
  :data:`KEY_WORK` a byte (:data:`COLLATED_KEY_WORK` under a nondeterministic collation), what
  grouping by the raw value first cost (its hash, of the ICU sort key under a nondeterministic
  collation, its copy into a new group and its spill), kept though the value is no longer hashed:
  the weights then refuse more than they must, never less;
* MODE of a categorical column: one count per declared category, each comparing the value with
  that category (``col = 'category'``): :func:`~rewriter.text_bounds.comparison_work` a byte those
  comparisons read, as for a key;
* the ``row_hash`` partition key of sample and aggregate: each hashed text column is hashed
  (``hashtextextended``): :data:`HASH_WORK` a byte;
* the raw conjunct a WHERE's top-level ``=`` or IN list on a ``varchar(n)``/``char(n)`` column gets
  so that an index serves it (rewriter/raw_equality.py): it reads each row's raw value beside the
  bounded term, even a value the bound reads as NULL. A list (of literals, or of several parameters)
  is hashed: :data:`HASH_WORK` a byte (:data:`COLLATED_KEY_WORK` under a nondeterministic collation,
  whose hash is of the value's ICU sort key), and its equality when the hash matches; one parameter
  is one equality (:func:`raw_read`).

Each is weighed by the bytes it may read (the column's bound; a ``varchar(n)``'s 4·n when smaller)
times its cost a byte, in the work units of the conditions, and adds to their weight: a statement's
total stays within :data:`~rewriter.text_bounds.MAX_TEXT_WORK` on a table without
``answer_quantum_ms``, else it is refused before any charge (``DP001``, ``safe-predicate``, naming each
single read: :func:`rewriter.text_bounds.work_refusal`). A column of no bytes (a number, a date)
weighs nothing, and so does ``COUNT(col)``, which reads the header only. MODE's FILTER is
evaluated once for each category (each category's count carries it, rewriter/rewrite.py), so its
terms and reads count once a category too (``PredicateRenderer.template``'s ``times``).
"""

from __future__ import annotations

from typing import NamedTuple

from policies.model import TablePolicy
from policies.tables import ColumnInfo

from .text_bounds import comparison_work, distinct_by_bytes, value_bytes

__all__ = ["COLLATED_DISTINCT_WORK", "COLLATED_KEY_WORK", "DISTINCT_WORK", "HASH_WORK", "KEY_WORK", "SingleRead", "categories", "distinct_read", "hash_read",
           "key_read", "mode_read", "raw_read"]

DISTINCT_WORK = 50
"""Work units a byte of a value ``COUNT(DISTINCT)`` reads: measured at 0.43–0.85 of ``lower(t) = 'x'``'s
cost a byte (51 units), in memory and spilled to disk, on PostgreSQL 15 and 16 (benchmarks/results.md,
"Single reads of text"): weighed as that comparison is."""
KEY_WORK = 50
"""Work units a byte of a value a categorical GROUP BY key reads, besides its comparisons with the
categories: measured at 0.12–0.46 of ``lower(t) = 'x'``'s cost a byte in memory, 0.65–1.01 where the
groups spill to disk (``work_mem``)."""
COLLATED_DISTINCT_WORK = 300
"""Work units a byte ``COUNT(DISTINCT)`` reads where the column's collation does not order by bytes
(``ColumnInfo.byte_order``) and is nondeterministic: its sort compares through ICU, measured at
67–139 units a byte (1.3–2.7 of ``lower()``'s) under ``und-x-icu`` and a nondeterministic ICU
collation (benchmarks/collation_cost.py, on a loaded host), weighed at about twice the most. Under
a deterministic one the values are counted under ``COLLATE "C"`` (the same classes, sorted by
bytes: :func:`~rewriter.text_bounds.distinct_by_bytes`) and weighed ``DISTINCT_WORK``: a libc
locale's ``strcoll`` cost 1,270–1,360 units a byte, which no weight that leaves such a count
possible would cover."""
COLLATED_KEY_WORK = 800
"""Work units a byte a categorical GROUP BY key, or a hashed raw conjunct (:func:`raw_read`), reads
under a nondeterministic collation, besides its comparisons: PostgreSQL hashes the value's ICU sort
key, measured at 132–289 units a byte (2.6–5.7 of ``lower()``'s) on values of 2,000 bytes
(benchmarks/collation_cost.py). On values of 64 bytes the sort key costs more a byte: a key with its
comparisons with two categories measured 204–572 units a byte, a hashed raw conjunct with its
bounded term 185–806, 0.7–1.5 times the key in the same run (benchmarks/raw_conjunct_cost.py, five
runs at load 4–8). Weighed 800, so that both with their comparisons (900) are above the most
measured; twice the most (~1,600) would leave room for one such key or equality in a statement.
Under a deterministic collation the hash reads the bytes (:data:`KEY_WORK`, :data:`HASH_WORK`)."""
_BPCHAR = 1042
HASH_WORK = 10
"""Work units a byte of a text column the ``row_hash`` partition key, or a hashed raw conjunct under a
deterministic collation, hashes: measured at 0.065–0.072 of ``lower(t) = 'x'``'s cost a byte (~4
units; the raw conjunct 4.2–5.5, benchmarks/raw_conjunct_cost.py), weighed at about twice that."""


class SingleRead(NamedTuple):
    """One single read of a statement: what it is, as the statement writes it, and its weight."""

    what: str
    work: int


def distinct_read(column: ColumnInfo, policy: TablePolicy) -> SingleRead | None:
    """``COUNT(DISTINCT column)``'s read, or None: not a column of bytes."""
    size = value_bytes(column, policy)
    per_byte = DISTINCT_WORK if column.byte_order or distinct_by_bytes(column) else COLLATED_DISTINCT_WORK
    return None if size is None else SingleRead(f"COUNT(DISTINCT {column.name})", size * per_byte)


def key_read(column: ColumnInfo, policy: TablePolicy) -> SingleRead | None:
    """A categorical GROUP BY key's read of ``column``, or None: not a column of bytes."""
    size = value_bytes(column, policy)
    if size is None:
        return None
    per_byte = KEY_WORK if column.deterministic_collation else COLLATED_KEY_WORK
    return SingleRead(f"GROUP BY {column.name}", size * per_byte + _compared_bytes(column, size) * comparison_work(column, "="))


def mode_read(column: ColumnInfo, policy: TablePolicy) -> SingleRead | None:
    """MODE's read of ``column`` (one comparison a declared category), or None: not a column of bytes."""
    size = value_bytes(column, policy)
    if size is None:
        return None
    return SingleRead(f"MODE() of {column.name}", _compared_bytes(column, size) * comparison_work(column, "="))


def hash_read(column: ColumnInfo, policy: TablePolicy) -> SingleRead | None:
    """The ``row_hash`` partition key's read of ``column``, or None: not a column of bytes."""
    size = value_bytes(column, policy)
    return None if size is None else SingleRead(f"the row_hash key's hash of {column.name}", size * HASH_WORK)


def raw_read(column: ColumnInfo, policy: TablePolicy, hashed: bool) -> SingleRead | None:
    """The raw conjunct's read of ``column`` (rewriter/raw_equality.py), or None: not a column of bytes.
    ``hashed``: a list's ``= ANY (ARRAY[…])``, hashed (the hash through the collation's code where it
    is nondeterministic, and the equality when the hash matches), else one parameter's ``=``."""
    size = value_bytes(column, policy)
    if size is None:
        return None
    equality = comparison_work(column, "=")
    if not hashed:
        return SingleRead(f"the raw equality on {column.name}", size * equality)
    per_byte = HASH_WORK if column.deterministic_collation else COLLATED_KEY_WORK
    return SingleRead(f"the hashed equality on {column.name}", size * (per_byte + equality))


def _compared_bytes(column: ColumnInfo, size: int) -> int:
    """The bytes of one value of ``column`` (at most ``size``) that comparing it with each declared
    category reads. Under a deterministic collation ``texteq`` and ``byteaeq`` compare the two sizes
    first and read the value only where it is as long as the category: at most the category's own
    bytes each. A ``char(n)`` (``bpchareq`` scans the value's trailing spaces first) and a
    nondeterministic collation (ICU reads the value until it differs) may read the whole value each."""
    assert column.policy is not None and column.policy.categories is not None
    if column.deterministic_collation and column.value_type[0] != _BPCHAR:
        return sum(min(len(category.encode("utf-8")), size) for category in column.policy.categories)
    return size * len(column.policy.categories)


def categories(column: ColumnInfo | None) -> int:
    """How many categories ``column``, a MODE's or a categorical key's, declares."""
    assert column is not None and column.policy is not None and column.policy.categories is not None
    return len(column.policy.categories)
