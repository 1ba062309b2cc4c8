"""How many bytes of a text value a DP statement reads, and how much work its conditions may do on one row.

A text value someone chose, long or periodic, was the last lever by which one row could make a DP
statement measurably slower on a table without ``answer_quantum_ms`` (docs/threat-model.md, Timing):
every read of a 3 MB value detoasts it, ``lower()`` and ILIKE case-fold it, and a LIKE compares its
part after a ``%`` at every position, each up to 256 times in one statement. Two limits bound it.

**The value bound.** A DP statement reads a value of a ``text``, ``varchar``, ``char`` or ``bytea``
column, or of a domain over one of them, only
up to the table's ``max_text_bytes`` (policy; 256 by default): a longer value reads as NULL, in every
construct that reads it (conditions, GROUP BY keys, ``COUNT(col)``, ``COUNT(DISTINCT col)``, MODE's
categories, the ``row_hash`` partition key), as values beyond the bounds of a numeric column are
clamped. Every construct writes its read of a column as :func:`column_sql`, a token that the backend
SQL's writer turns into the bounded value where the construct reads the table
(``CASE WHEN octet_length(col) <= max_text_bytes THEN col END``, in the form below): in place where
each bounded column is read once, else through a projection of the bounded values that PostgreSQL
pulls up (:func:`read_table`, which says why); and into the column's name where it reads a subquery
that read it so (:func:`read_through`, :func:`bounded_outputs`). tests/test_bound_in_place.py parses
the backend SQL of every construct and checks that each reference sits inside its bound. ``octet_length`` reads the stored
size from the value's header (``toast_raw_datum_size``), detoasting nothing, so a longer value is
never read (0.17 µs on PostgreSQL 15 and 16 for a 64-byte value and a 3 MB one, out of line or
compressed, where ``length()`` of the 3 MB value took 17–23 ms; benchmarks/results.md). A
``varchar(n)`` or ``char(n)`` whose 4·n bytes fit the bound carries it already and is not sized (it
is still placed, below). The bound holds whatever the quantum: it decides answers, which must not depend on a timing
setting; an operator who wants longer values read raises ``max_text_bytes``. A column whose values
can be of any length with no header telling their size (``jsonb``, ``tsvector``, arrays,
``numrange``, …: ``ColumnInfo.unbounded_length``) cannot be bounded so: its values are not read at
all, only counted and tested for NULL (rewriter/predicates.py, rewriter/dp_query.py; categories on
one are a policy error, proxy/backend/policy_fit.py).

**Numerics of no declared precision.** A ``numeric`` column without a precision (``atttypmod``
-1), or a domain over one, can hold 131,072 digits (~64 kB, stored compressed or out of line),
which every term and every aggregate's clamp that reads it detoasted again: one such row added
milliseconds to 256 IN values or 250 FILTERed sums (docs/threat-model.md, Timing). Such a column is
read through ``CASE WHEN pg_column_compression(n) IS NULL AND pg_column_size(n) <= 127 AND
(pg_column_size(n) % 2 = 1 OR pg_column_size(n) <= 20) THEN n END`` (:func:`in_line_numeric`), so a
value stored compressed, out of line or in more than :data:`NUMERIC_MAX_BYTES` reads as NULL in
every construct, as a long text does
(conditions, clamps, sums, AVG, MIN/MAX, percentiles, variances, GROUP BY keys, ``COUNT(col)``).
Both functions read the value's header only (``toast_datum_size``, ``toast_get_compression_id``): 256
of them cost the same on a 64 kB value, out of line or compressed, as on a 7-byte one. The bound is
on the stored form, not on the digits: a row's own layout decides it, which is still a function of
that row alone.

**Values stored apart within the bounds.** A value short enough to be read can still be stored out
of line, in the table's TOAST relation, when a wide row pushes it out (or, on a ``STORAGE
EXTERNAL`` column, from ~25 bytes), and compressed in the row when it compresses: PostgreSQL then
fetches it again (two buffer hits) or decompresses it again for every reference that reads it, each
term of an OR or IN list, both ends of a BETWEEN, each comparison of ``COUNT(DISTINCT)``'s sort, so
what such a row adds grew with the terms. So only a value stored in the row, uncompressed, is read;
any other reads as NULL, as a value past the bound does (a legitimate value a wide row pushed out
too: the cost of the check, docs/threat-model.md). The check reads the header only, on PostgreSQL
15 to 18 (PostgreSQL 15 and 16 have no function that says so directly):

* text, ``varchar``, ``char``, ``bytea`` and domains over them (:func:`in_line_text`): ``pg_column_size``
  of a value stored apart uncompressed is the size of its data (the TOAST pointer's external size,
  which has no header), which ``octet_length`` is too; a value in the row has a 1- or 4-byte header
  more; a compressed one is smaller than its data (PostgreSQL keeps a compressed form only when
  it saves more than its 4-byte header). So ``pg_column_size(t) > octet_length(t)`` exactly when the
  value is in the row and uncompressed; checked on real values of every storage form (empty, 1- and
  4-byte headers, compressed in line, out of line with and without compression, multibyte text, in
  UTF8 and EUC_JP databases; ``pg_column_toast_chunk_id`` agreed on 17 and 18). The bound and this
  check are one comparison, ``int4smaller(pg_column_size(t), max_text_bytes + 1) > octet_length(t)``:
  four function calls a row where the two tests joined by AND took five, ~28 % less of the check's
  work (~290 → ~210 instructions a row read; benchmarks/profile.md, "The backend's share of a DP
  statement on 48,842 rows").
* a numeric of no declared precision: no function reads its raw size from the header. Its data is
  always an even number of bytes (a 2- or 4-byte header and 2-byte digit groups), and PostgreSQL
  stores a value of at most 126 bytes of data in the row with a 1-byte header: an odd
  ``pg_column_size`` of an uncompressed value is one in the row. A value stored apart has an even
  one, and so does one in the row with a 4-byte header (128 bytes or more), which cannot be told
  apart: so :data:`NUMERIC_MAX_BYTES` is 127 (up to 248 digits, about 240 in practice), where it was
  512 (1,000 digits) before values stored apart were found. A value of at most
  :data:`NUMERIC_NEVER_APART_BYTES` is read whatever its header: none stored apart is so small, and
  a 4-byte header is what a protected view's computed numeric (``hours::numeric``) and a ``STORAGE
  PLAIN`` column's value written by UPDATE have.

**Values of a declared size.** A ``varchar(n)``/``char(n)`` within the bound, a ``numeric(p, s)``,
a ``bit(n)`` (of at most 2,048 bits; a longer one is not read) and an ``int8range``, ``tsrange`` or
``tstzrange`` (or a domain over one) need no length bound, but their values can be stored apart or
compressed too, and were fetched again by each reference (docs/threat-model.md, Timing). Each is
read through its placement check now (:func:`declared_apart`): text's for ``varchar``/``char``, the
unconstrained numeric's for ``numeric(p, s)`` (so a value of more than :data:`NUMERIC_MAX_BYTES`
reads as NULL too), :func:`in_line_bit` and :func:`in_line_range`. A type whose values are never
more than :data:`TOAST_SMALLEST` bytes is read as it is: the toaster never touches it. Beside the
bounded terms a WHERE's first top-level ``=``/IN on such a column compares the raw column once,
hashed (:func:`rewriter.raw_equality.hashed_raw_equality`), so that a plain index still serves it.

**The work limit.** Below the bound, the terms of a statement still multiply: 256 LIKEs of a
63-character part on a 1 kB value cost that one row 35 ms. So each condition term that reads a text
value is weighed by the bytes it may read (the column's bound, :func:`value_bytes`) times its cost a
byte, in units of about 0.1 ns of PostgreSQL 16's time (warm, one row, measured with
benchmarks/row_cost.py and the per-byte figures in benchmarks/results.md): a comparison
(=, <>, <, …, an IN list's value) :data:`COMPARISON_WORK` (:data:`COLLATED_COMPARISON_WORK` or
:data:`COLLATED_ORDERING_WORK` where a collation's code compares: :func:`comparison_work`), ``lower()``/``upper()`` and ILIKE's own
case folding :data:`CASE_FOLD_WORK` more, a LIKE :data:`LIKE_WORK` per character of its pattern's
longest part after a ``%`` (at least one; a pattern bound as a parameter is weighed as one
character while planning, and by its own longest part when it is bound, before any charge:
proxy/dp/folding.py). ``IS NULL`` reads no value. A statement's single reads of a row's value
(``COUNT(DISTINCT col)``, a categorical GROUP BY key, MODE, the ``row_hash`` key) are weighed the
same way (:mod:`rewriter.single_reads`) and add to its conditions' weight.
The conditions and single reads of one statement may weigh :data:`MAX_TEXT_WORK` in all (~60 µs of
one row's time, the order the limit of 256 terms keeps a row of ordinary values to), else the
statement is refused before any charge (``DP001``, ``safe-predicate``). A table with ``answer_quantum_ms`` is not
limited, as for the terms (:mod:`rewriter.predicate_terms`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from policies.model import TablePolicy
from policies.tables import ColumnInfo, Relation, quote_identifier

from .sql_text import operator
from .types import numeric_precision

__all__ = ["BIT", "CASE_FOLD_WORK", "COLLATED_CASE_FOLD_WORK", "COLLATED_COMPARISON_WORK", "COLLATED_ORDERING_WORK", "COMPARISON_WORK", "LIKE_WORK", "MAX_TEXT_WORK", "NUMERIC", "NUMERIC_MAX_BYTES",
           "NUMERIC_NEVER_APART_BYTES", "RANGE_DATA_BYTES", "TEXT_TYPES", "TOAST_SMALLEST", "WIDE_RANGES",
           "bounded_outputs", "bounded_value", "column_sql", "raw_alias", "raw_sql", "read_in_place", "read_table", "read_through", "case_fold_work", "comparison_work", "declared_apart", "declared_size",
           "distinct_by_bytes", "in_line_bit", "in_line_numeric", "in_line_range", "in_line_text", "length_bounded", "unconstrained_numeric", "value_bytes", "work_refusal"]

TEXT_TYPES = frozenset({25, 1043, 1042, 17})
"""text, varchar, char (bpchar) and bytea: the types whose values the bound applies to (a domain's
by its base type), each of which ``octet_length`` takes and sizes by the header."""
NUMERIC = 1700
"""numeric: bounded by its stored form when it has no declared precision (:func:`unconstrained_numeric`)."""
NUMERIC_MAX_BYTES = 127
"""The most bytes a numeric of no declared precision may be stored in to be read: in the row,
uncompressed, with a 1-byte header (126 bytes of data, the most PostgreSQL stores so: up to 248
digits). Of a larger value, ``pg_column_size`` does not tell whether it is in the row."""
NUMERIC_NEVER_APART_BYTES = 20
"""The most bytes a numeric may report in ``pg_column_size`` to be read whatever its header: no value
stored apart uncompressed reports so few. The toaster stores apart only a value of more than
:data:`TOAST_SMALLEST` bytes, its 1- or 4-byte header included, and ``pg_column_size`` of one stored
apart uncompressed is its data's size without a header (the TOAST pointer's external size): at
least 21 bytes, and even for a numeric, so at least 22 (24 seen on PostgreSQL 15 to 18, where the
toaster is given values in their 1-byte header form). A value with a 4-byte header of at most this
many bytes (up to 25 significant digits) is in memory or in the row: a protected view's computed
value (``hours::numeric``: 8 bytes), a constant, a ``STORAGE PLAIN`` column's value written by
UPDATE. A compressed one can report fewer (pglz: 16 to 18 bytes for 153 repeated digits), told by
``pg_column_compression``."""
BIT = 1560
"""bit(n): read as it is (a bit(n) of at most 2,048 bits; a longer one is not read at all)."""
WIDE_RANGES = frozenset({3926, 3908, 3910})
"""int8range, tsrange, tstzrange: the built-in ranges read as they are whose values reach more than
:data:`TOAST_SMALLEST` bytes (two 8-byte bounds); int4range and daterange hold 17 at most."""
RANGE_DATA_BYTES = 21
"""The data of an int8range, tsrange or tstzrange with two finite bounds: its type's OID, two
8-byte bounds and a flags byte (without the header)."""
NARROW_RANGES = frozenset({3904, 3912})
"""int4range and daterange: ranges of two 4-byte bounds, never of more than
:data:`NARROW_RANGE_DATA_BYTES` bytes of data, too few for the toaster (read as they are)."""
NARROW_RANGE_DATA_BYTES = 13
"""The data of an int4range or daterange with two finite bounds: its type's OID, two 4-byte bounds
and a flags byte (``pg_column_size``: 14 in the row, with a 1-byte header)."""
TOAST_SMALLEST = 24
"""MAXALIGN(TOAST_POINTER_SIZE): the toaster compresses or stores apart only a value of more bytes
(4-byte header included; src/backend/access/table/toast_helper.c)."""
_DECLARED_LENGTH_TYPES = frozenset({1043, 1042})
_COUNTED_BY_BYTES = frozenset({25, 1043, 1042})  # text, varchar, char: equal exactly where their bytes are
_VARHDRSZ = 4  # a varchar(n)'s type modifier is n + 4
_MAX_BYTES_PER_CHARACTER = 4  # UTF-8, and every server encoding PostgreSQL has

COMPARISON_WORK = 1
"""Work units a byte of a comparison (=, <>, <, …, each IN value): ~0.02–0.1 ns a byte, warm."""
COLLATED_COMPARISON_WORK = 50
"""Work units a byte of a comparison through a collation's code (:func:`comparison_work`): ICU's,
level by level, measured at up to 16.5 units a byte (``<`` under ``und-x-icu``) and 24 (``=`` and
``<`` under a nondeterministic one) on a value that differs from the other only in case
(benchmarks/collation_cost.py), weighed at about twice the most, as ``lower()``."""
COLLATED_ORDERING_WORK = 260
"""Work units a byte of an ordering comparison (``<``, ``<=``, ``>``, ``>=``) through a collation's
code (:func:`comparison_work`): ICU's measured at up to 16.5 units a byte, a libc locale's
(``en_US.UTF-8``: glibc's ``strcoll``, which passes over the values once a level and cannot stop
at a shared prefix) at 105–128, against ``lower()``'s 51 in the same run, on values of a run of
``a`` (benchmarks/collation_cost.py, PostgreSQL 15, two runs at load 8–14); weighed at about twice
the most. Before, such a comparison weighed :data:`COLLATED_COMPARISON_WORK`, from ICU's alone."""
CASE_FOLD_WORK = 50
"""Work units a byte of ``lower()``/``upper()`` or of ILIKE's case folding: ~5 ns a byte."""
COLLATED_CASE_FOLD_WORK = 600
"""Work units a byte of that case folding through ICU's code (:func:`case_fold_work`): ``lower()``,
``upper()`` and ILIKE measured at 48–306 units a byte under ``und-x-icu`` and ``en-x-icu`` on
PostgreSQL 15 (ICU 72) and 18, on values of ASCII, Latin (``Aßé``) and Greek letters, where libc's
``C.UTF-8`` folding is the unit's 51 (benchmarks/case_fold_cost.py, ten runs at load 5–16), weighed at about twice the most."""
LIKE_WORK = 20
"""Work units a byte, per character of a LIKE pattern's longest part after ``%``: ~2 ns a byte and character."""
MAX_TEXT_WORK = 600_000
"""The most work units the conditions and single reads of one DP statement may weigh (~60 µs of one row's time)."""


def case_fold_work(column: ColumnInfo) -> int:
    """Work units a byte of ``lower()``/``upper()`` of ``column``, or ILIKE's folding of it:
    :data:`CASE_FOLD_WORK` under a collation ordering by bytes (libc's ``C``, ``POSIX`` and
    ``C.UTF-8``, the builtin provider's; measured at or below it on PostgreSQL 15 and 18), else
    :data:`COLLATED_CASE_FOLD_WORK` (ICU's case mapping, or a libc locale's, weighed as ICU's)."""
    return CASE_FOLD_WORK if column.byte_order else COLLATED_CASE_FOLD_WORK


def distinct_by_bytes(column: ColumnInfo) -> bool:
    """Whether ``COUNT(DISTINCT column)`` counts the values under ``COLLATE "C"``: a ``text``,
    ``varchar`` or ``char`` column (or a domain over one) whose collation does not order by bytes but
    is deterministic. Under such a collation two values are equal exactly where their bytes are (a
    ``char``'s trailing blanks aside, under either), so the values split into the same classes and
    the count is the same, while the sort compares bytes instead of going through the collation's
    code: glibc's ``strcoll`` under ``en_US.UTF-8`` cost the sort 1,270–1,360 units a byte of a
    row's value, four times the 300 a collated ``COUNT(DISTINCT)`` weighed (benchmarks/profile.md,
    h144), and ICU's 79–139."""
    return not column.byte_order and column.deterministic_collation and column.value_type[0] in _COUNTED_BY_BYTES


def comparison_work(column: ColumnInfo, symbol: str) -> int:
    """Work units a byte of ``column`` ``symbol`` (a comparison operator) costs: ``memcmp``'s
    :data:`COMPARISON_WORK` where PostgreSQL compares bytes (``=`` and ``<>`` under a deterministic
    collation, whatever its provider; any comparison under a collation ordering by bytes), else the
    collation's code's: :data:`COLLATED_COMPARISON_WORK` for ``=`` and ``<>`` under a
    nondeterministic collation, :data:`COLLATED_ORDERING_WORK` for ``<`` and the other orderings
    under ICU or a libc locale."""
    if column.byte_order or (symbol in ("=", "<>") and column.deterministic_collation):
        return COMPARISON_WORK
    return COLLATED_COMPARISON_WORK if symbol in ("=", "<>") else COLLATED_ORDERING_WORK


def _declared_bytes(column: ColumnInfo) -> int | None:
    """The most bytes a ``varchar(n)``/``char(n)`` value holds (4·n), or None: no declared length."""
    return _declared_characters_bytes(*column.value_type)


def _declared_characters_bytes(type_oid: int, modifier: int) -> int | None:
    if type_oid in _DECLARED_LENGTH_TYPES and modifier > _VARHDRSZ:
        return _MAX_BYTES_PER_CHARACTER * (modifier - _VARHDRSZ)
    return None


def value_bytes(column: ColumnInfo, policy: TablePolicy) -> int | None:
    """The most bytes of one of ``column``'s values a DP statement reads: the table's
    ``max_text_bytes``, or a ``varchar(n)``/``char(n)``'s 4·n when smaller; None when the
    column is not of a type the bound applies to (:data:`TEXT_TYPES`, or a domain over one)."""
    if column.value_type[0] not in TEXT_TYPES:
        return None
    declared = _declared_bytes(column)
    return policy.max_text_bytes if declared is None else min(declared, policy.max_text_bytes)


def unconstrained_numeric(column: ColumnInfo) -> bool:
    """Whether ``column`` is a ``numeric`` of no declared precision (or a domain over one), whose
    value may hold 131,072 digits (~64 kB, compressed or out of line)."""
    return column.value_type == (NUMERIC, -1)


def length_bounded(column: ColumnInfo, policy: TablePolicy) -> bool:
    """Whether ``column``'s values are bounded by their length or stored form, not by a declared
    size: a text, ``varchar``, ``char`` or ``bytea`` whose declared size (if any) exceeds
    ``max_text_bytes``, or a numeric of no declared precision."""
    if unconstrained_numeric(column):
        return True
    declared = _declared_bytes(column)
    return column.value_type[0] in TEXT_TYPES and (declared is None or declared > policy.max_text_bytes)


def declared_size(type_oid: int, modifier: int) -> int | None:
    """The most bytes one value of a type of declared size holds, 4-byte header included (the size
    the toaster weighs), from its type and type modifier: a ``varchar(n)``/``char(n)`` (4·n),
    ``numeric(p, s)``, ``bit(n)``, ``int8range``/``tsrange``/``tstzrange``, ``int4range``/``daterange``;
    None for any other (a text, an unconstrained numeric, a ``numrange``, a domain: its own OID)."""
    declared = _declared_characters_bytes(type_oid, modifier)
    if declared is not None:
        return _VARHDRSZ + declared
    digits = numeric_precision(modifier) if type_oid == NUMERIC else None
    if digits is not None:
        # p digits span at most ceil(p/4) + 1 four-digit groups of 2 bytes, behind a 2- or 4-byte header
        return _VARHDRSZ + 4 + 2 * (-(-digits // 4) + 1)
    if type_oid == BIT and modifier > 0:
        return _VARHDRSZ + _bit_data(modifier)
    if type_oid in WIDE_RANGES:
        return _VARHDRSZ + RANGE_DATA_BYTES
    if type_oid in NARROW_RANGES:
        return _VARHDRSZ + NARROW_RANGE_DATA_BYTES
    return None


def _bit_data(bits: int) -> int:
    """The bytes of data of a ``bit(n)`` value (its bit count, then its bits), without the header."""
    return 4 + -(-bits // 8)


def declared_apart(column: ColumnInfo, policy: TablePolicy) -> bool:
    """Whether ``column`` is of a type read as it is because a declared size bounds it
    (``varchar(n)``/``char(n)`` whose 4·n bytes fit ``max_text_bytes``, ``numeric(p, s)``,
    ``bit(n)``, ``int8range``/``tsrange``/``tstzrange``, or a domain over one) whose values may
    still be stored apart or compressed: of more than :data:`TOAST_SMALLEST` bytes, the least the
    toaster touches. Such a column is read through its in-line check too (:func:`bounded_value`)."""
    if length_bounded(column, policy):
        return False
    most = declared_size(*column.value_type)
    return most is not None and most > TOAST_SMALLEST


def _needs_bound(column: ColumnInfo, policy: TablePolicy) -> bool:
    return length_bounded(column, policy) or declared_apart(column, policy)


def in_line_text(sql: str, max_bytes: int | None = None) -> str:
    """The SQL of whether ``sql``, a text, ``varchar``, ``char`` or ``bytea`` value (or a domain's
    over one) read from a table, is stored in the row uncompressed: its stored size exceeds its
    data's by the header (stored apart uncompressed the two are equal, compressed it is smaller).
    With ``max_bytes``, also whether its data is at most that many bytes, in the same comparison:
    ``int4smaller(pg_column_size(t), max_bytes + 1) > octet_length(t)``, true exactly when
    ``pg_column_size(t) > octet_length(t)`` and ``octet_length(t) <= max_bytes`` (both are integers;
    ``max_bytes + 1`` fits an integer, the policy's ``max_text_bytes`` being at most 2^30 - 1), four
    function calls a row where the two tests joined by AND took five. Reads the header only; NULL
    for NULL."""
    size = f"pg_catalog.pg_column_size({sql})"
    if max_bytes is not None:
        size = f"pg_catalog.int4smaller({size}, CAST({max_bytes + 1} AS integer))"
    return operator(size, ">", f"pg_catalog.octet_length({sql})")


def in_line_numeric(sql: str) -> str:
    """The SQL of whether ``sql``, a numeric read from a table, is stored in the row, uncompressed,
    in at most :data:`NUMERIC_MAX_BYTES`: uncompressed, and either of an odd stored size (a 1-byte
    header and an even number of bytes of data) or of at most :data:`NUMERIC_NEVER_APART_BYTES`
    whatever its header (a 4-byte one: a view's computed value, a constant, a ``STORAGE PLAIN``
    column's). Reads the header only; NULL for NULL."""
    size = f"pg_catalog.pg_column_size({sql})"
    short_header = operator(operator(size, '%', '2'), '=', '1')
    never_apart = operator(size, '<=', str(NUMERIC_NEVER_APART_BYTES))
    return (f"pg_catalog.pg_column_compression({sql}) IS NULL AND "
            f"{operator(size, '<=', str(NUMERIC_MAX_BYTES))} AND ({short_header} OR {never_apart})")


def in_line_bit(sql: str, bits: int) -> str:
    """The SQL of whether ``sql``, a ``bit(bits)`` value read from a table, is stored in the row
    uncompressed: its stored size exceeds its data's (:func:`_bit_data`, fixed by the declared
    length) by a 1- or 4-byte header; stored apart uncompressed it equals it, compressed it is
    smaller. Reads the header only (``octet_length`` of a bit value reads the value); NULL for NULL."""
    return operator(f"pg_catalog.pg_column_size({sql})", ">", str(_bit_data(bits)))


def in_line_range(sql: str) -> str:
    """The SQL of whether ``sql``, an ``int8range``, ``tsrange`` or ``tstzrange`` read from a table,
    is stored in the row uncompressed. Such a value holds 5, 13 or 21 bytes of data (its type, a
    flags byte, and the bounds that are finite), with a 1- or 4-byte header in the row; only one of
    21 bytes (25 with its header) is large enough for the toaster, and stored apart uncompressed its
    size is 21, which no value in the row has. Reads the header only (the flags are in the value);
    NULL for NULL."""
    size = operator(f"pg_catalog.pg_column_size({sql})", "<>", str(RANGE_DATA_BYTES))
    return f"pg_catalog.pg_column_compression({sql}) IS NULL AND {size}"


def bounded_value(column: ColumnInfo, policy: TablePolicy) -> str:
    """The SQL of ``column`` as a DP statement reads it: NULL where its value is longer than the
    bound or not stored in the row uncompressed, else the value, in its own collation. A text value
    is sized by its length in bytes (``octet_length``) and placed by :func:`in_line_text`, in one
    comparison; a numeric
    of no declared precision by its stored form (:func:`in_line_numeric`). All from the header:
    the table's, never an index's copy (backend sessions never scan index-only,
    proxy/backend/pool.py ``PINNED_SETTINGS``)."""
    name = quote_identifier(column.name)
    if not _needs_bound(column, policy):
        return name
    type_oid, modifier = column.value_type
    if type_oid == NUMERIC:
        short = in_line_numeric(name)
    elif type_oid == BIT:
        short = in_line_bit(name, modifier)
    elif type_oid in WIDE_RANGES:
        short = in_line_range(name)
    elif declared_apart(column, policy):
        short = in_line_text(name)
    else:
        short = in_line_text(name, policy.max_text_bytes)
    return f"CASE WHEN {short} THEN {name} END"


# A column as a construct reads it (c) and its raw value (r), by name, until the level it is read at is
# known. NUL delimits them: no SQL text holds one (a protocol message's text ends at the first), and
# no identifier either, so a literal holding a column's quoted name is never taken for one.
_READ = re.compile("\x00([cr])([^\x00]+)\x00")


def column_sql(column: ColumnInfo) -> str:
    """The SQL every construct of a DP statement writes to read ``column`` (a condition's side, a
    key, an aggregate's argument, MODE's category test, the partition key's hash): a token that
    :func:`read_in_place` makes the bounded value (:func:`bounded_value`) where the construct reads
    the table, and :func:`read_through` the column's name where it reads a subquery whose output
    of it :func:`bounded_outputs` bounded. No construct names a column otherwise, so none reads it
    past the bound."""
    return f"\x00c{column.name}\x00"


def raw_sql(column: ColumnInfo) -> str:
    """The SQL of ``column``'s raw value, where :mod:`rewriter.raw_equality` shows that reading it
    gives the bounded value's answer: the column itself over the table (:func:`read_in_place`), its
    raw output (:func:`raw_alias`) over a subquery (:func:`read_through`)."""
    return f"\x00r{column.name}\x00"


def raw_alias(table: Relation, column: ColumnInfo) -> str:
    """The name a subquery's output of ``column``'s raw value has: none of the table's column names."""
    alias = f"raw {column.attnum}"
    while alias in table.columns:
        alias = "_" + alias
    return alias


def read_in_place(sql: str, table: Relation) -> str:
    """``sql``, evaluated on ``table``'s rows, with each column it reads (:func:`column_sql`) its
    bounded value and each raw value (:func:`raw_sql`) the column itself.

    Each reference is the bounded expression where it stands, as PostgreSQL makes it of a projection
    of the bounded columns it pulls up: the same plan. :func:`read_table` says when it is cheaper."""
    columns, policy = table.columns, table.policy

    def read(match: re.Match[str]) -> str:
        column = columns[match.group(2)]
        return bounded_value(column, policy) if match.group(1) == "c" else quote_identifier(column.name)
    return _READ.sub(read, sql)


def read_table(sql: str, table: Relation, source: str) -> str:
    """``sql``, whose one level reading ``table`` has ``source`` for it (and the only tokens left,
    :func:`column_sql` and :func:`raw_sql`), with the table read through the bound.

    Where no bounded column is read more than once, each read is its bound in place
    (:func:`read_in_place`) and ``source`` the table: the planner then has no subquery to pull up,
    ~0.04 M fewer instructions in each of the run and the lock step (COUNT with one condition on a
    text, benchmarks/profile.md). A bound written twice or more is parsed and analysed each time,
    which costs more than the pull-up (a GROUP BY on a text key +0.08 M, an IN list of 50 texts
    +2.0 M), so there ``source`` is a projection of the bounded values and the raw ones
    (:func:`bounded_outputs`, and ``ctid`` for ``ctid_hash``), which PostgreSQL pulls up, each
    reference then its bound, evaluated where it stands, as in place."""
    columns, policy = table.columns, table.policy
    reads = [match.group(2) for match in _READ.finditer(sql) if match.group(1) == "c"]
    bounded = [name for name in reads if _needs_bound(columns[name], policy)]
    if len(bounded) == len(set(bounded)):
        return read_in_place(sql, table).replace(source, table.qualified_name, 1)
    outputs = bounded_outputs(table, sorted(set(reads), key=lambda name: columns[name].attnum), sql)
    if table.partition_key == "ctid":
        outputs.append("ctid")
    projection = f"(SELECT {read_in_place(', '.join(outputs), table)} FROM {table.qualified_name}) AS {quote_identifier(table.name)}"
    return read_through(sql, table).replace(source, projection, 1)


def read_through(sql: str, table: Relation | None = None) -> str:
    """``sql``, evaluated on the rows of a subquery of ``table`` whose outputs are
    :func:`bounded_outputs`, with each column it reads its output's name and each raw value its
    raw output's (:func:`raw_alias`; without ``table``, ``sql`` reads no raw value)."""

    def read(match: re.Match[str]) -> str:
        name = match.group(2)
        if match.group(1) == "c":
            return quote_identifier(name)
        assert table is not None, "a raw value is read through a subquery of its table"
        return quote_identifier(raw_alias(table, table.columns[name]))
    return _READ.sub(read, sql)


def bounded_outputs(table: Relation, named: Iterable[str], above: str) -> list[str]:
    """The outputs of a subquery of ``table`` that a query ``above`` (written with
    :func:`column_sql` and :func:`raw_sql`, read by :func:`read_through`) reads: each of the
    ``named`` columns under its own name, then the raw value of each column ``above`` reads raw,
    under its :func:`raw_alias`. Written with the tokens too, for the subquery's own level to read
    (:func:`read_in_place` where it reads the table: the bounded values)."""
    columns = table.columns
    outputs = [f"{column_sql(columns[name])} AS {quote_identifier(name)}" for name in dict.fromkeys(named)]
    raw = dict.fromkeys(match.group(2) for match in _READ.finditer(above) if match.group(1) == "r")
    outputs += [f"{raw_sql(columns[name])} AS {quote_identifier(raw_alias(table, columns[name]))}" for name in raw]
    return outputs


def work_refusal(work: int, single_reads: Sequence[tuple[str, int]] = ()) -> tuple[str, str] | None:
    """Why conditions weighing ``work`` units in all are refused, and the hint, or None.

    ``single_reads``: what else of the statement reads each row's text value, once a row, and its
    weight, already in ``work`` (:mod:`rewriter.single_reads`: ``COUNT(DISTINCT col)``, a GROUP BY
    key, MODE, the partition key's hash), each named in the refusal."""
    if work <= MAX_TEXT_WORK:
        return None
    if not single_reads:
        return (f"conditions reading text values with a work of {work:,} units in all (at most {MAX_TEXT_WORK:,} in one "
                "statement: each term weighs the bytes it may read, the column's max_text_bytes, times its cost a byte)",
                "PostgreSQL reads a text value once for each term that compares it, and a LIKE compares its part after "
                "a % at every position, so many such terms, or long parts, make one row with a long value take "
                "measurably longer, which would tell whether that row is there. Use fewer terms or shorter LIKE parts "
                "after %, or have the operator set answer_quantum_ms on the table, which lifts this limit (or lower "
                "max_text_bytes).")
    named = ", ".join(f"{what} weighs {weight:,}" for what, weight in single_reads)
    reads = ", ".join(dict.fromkeys(what for what, _ in single_reads))
    return (f"reads of text values with a work of {work:,} units in all, conditions and single reads (at most "
            f"{MAX_TEXT_WORK:,} in one statement: each read weighs the bytes it may read, the column's max_text_bytes, "
            f"times its cost a byte; {named})",
            f"PostgreSQL reads each row's text value whole for {reads} (sorting, hashing or comparing it), as for "
            "each condition term that compares it (a LIKE at every position after a %), so the longer the values a "
            "table's max_text_bytes lets a statement read, the longer one row with a long value takes, which would "
            f"tell whether that row is there. Ask without {reads}, or use fewer terms or shorter LIKE parts after %, "
            "or have the operator lower max_text_bytes on the table (256 by default) or set answer_quantum_ms on it, "
            "which lifts this limit.")
