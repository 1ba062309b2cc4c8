"""Comparisons on the raw column, so that a B-tree index on it serves, where that gives the same answer:
text equality, and an unconstrained numeric's equality and orderings, on a table with a quantum; and
one hashed equality beside a WHERE's top-level ``=``/IN on a column of a declared size, on any table
(:func:`hashed_raw_equality`, at the end).

A DP statement reads a text column through the value bound (:mod:`rewriter.text_bounds`): ``CASE WHEN
octet_length(t) <= N THEN t END``, N the table's ``max_text_bytes``. A comparison of that expression
is one no index on ``t`` serves, so ``t = 'x'`` on a large table with an index on ``t`` became a
sequential scan (benchmarks/results.md, "Text equality and its index"). Here ``t = 'x'`` is rendered
on the raw column instead, as :func:`raw_comparison`, where it provably releases the same answer and
reads no long value on the table's rows:

* **The column is ``text`` or ``varchar`` and its collation deterministic.** ``=`` is then ``texteq``
  (varchar has no operator of its own; it is read as text), which in PostgreSQL 12–16
  (src/backend/utils/adt/varlena.c: C collation, the default one or any deterministic one) and 17–18
  (a deterministic locale) compares the two values' stored sizes first, with
  ``toast_raw_datum_size`` (the header; 0.17 µs for a 3 MB value, as ``octet_length``), and reads
  (detoasts) them only when the sizes are equal. A value longer than N bytes never has the size of
  a literal of at most N bytes: it is never read. Not so elsewhere, where the bounded form stays:
  ``char(n)``'s ``bpchareq`` detoasts both values to strip their trailing blanks before comparing
  lengths, and a ``char(n)`` value is padded, so ``'x'`` equals a ``char(1000)`` value that the
  bound reads as NULL (another answer); a nondeterministic collation compares with the collation
  (reads the whole value, and ``'x'`` may equal a long value that differs in ignorable characters);
  ``citext`` lowers both values; a domain or an extension's type is none of these types.
* **The other side is a string literal of at most N bytes** in every server encoding (a non-ASCII
  character counted as 4 bytes, the most any server encoding spends on one). A value read as NULL
  by the bound is longer than N; it never has such a literal's size, so ``texteq`` never reads it
  (a longer literal would have every value of its own size read), and the raw comparison is false
  exactly where the bounded one is NULL, and the same as the bounded one everywhere else.
* **The comparison stands where false and NULL decide alike**: reached from the root of a WHERE or
  FILTER condition through AND, OR and parentheses only. Such a condition is true of a row with the
  raw comparison false exactly when it is with it NULL (AND and OR are monotone in Kleene's
  three-valued logic, and a condition true with an unknown operand is true whatever it is), and the
  backend keeps exactly the rows where the condition is true. Under NOT (``NOT (t = 'x')``, ``t NOT IN
  (…)``), under ``IS [NOT] TRUE/FALSE``, and for ``<>`` (``textne``: true, not NULL, for a long value)
  the two differ, and the bounded form is kept. A share's denominator ``p OR NOT p`` holds ``p``
  both ways: each occurrence is rendered by where it stands, which keeps the condition's truth.
  ``IS [NOT] DISTINCT FROM`` is not in the language.

**The table has ``answer_quantum_ms``**, because the work is the same on the table's rows but not
in an index. A B-tree index on ``t`` holds values that a search compares, and it compares a value by
reading it (``bttextcmp`` detoasts, which for an index entry means decompressing it: an entry is at
most ~2.7 kB, so a long value is in one only compressed: 200 kB of one repeated character fits, with
pglz). One such row just after the searched value added +0.19 to +0.30 ms to ``t = 'a'``
(benchmarks/text_equality.py), where the bounded form's sequential scan added nothing: a lever of
the kind the value bound removed, which the quantum hides, as it lifts the work limit. On a table
without a quantum the bounded form stays.

The raw comparison keeps the bounded one beside it, ``("t" = 'x' AND <t's bound> = 'x')``, written
with :func:`rewriter.text_bounds.raw_sql` and ``column_sql`` (where the comparison is evaluated above
a subquery of the table, sample and aggregate's rows, the raw value is its output ``"raw 2"``:
:func:`rewriter.text_bounds.bounded_outputs`); the second is the bounded value (the same truth where the bounded one is not NULL; where it is NULL, a value past the
bound, stored apart or compressed, the conjunction is false or NULL, which decide alike here: hence
the placement rule). A plain index on ``t`` serves it through the first. No index serves the
bounded value: it also checks that the value is stored in the row (``pg_column_size``, not
immutable, :mod:`rewriter.text_bounds`), so the index on ``CASE WHEN octet_length(t) <= N THEN t
END`` advised before matches no expression of the backend SQL any more.

**Numerics of no declared precision.** Such a column (or a domain over one) is read through its
stored-form bound, ``CASE WHEN pg_column_compression(n) IS NULL AND pg_column_size(n) <= 127 AND
pg_column_size(n) % 2 = 1 THEN n END`` (:mod:`rewriter.text_bounds`), which no index can hold (``pg_column_size`` is not immutable):
``n = 5`` on a large table with an index on ``n`` became a sequential scan (×110–135 on 1,000,000 rows,
a 256-value IN list ×250–280; benchmarks/results.md, "Numeric comparisons and their index"). On a table
with ``answer_quantum_ms``, ``n = v``, ``n < v``, ``n <= v``, ``n > v`` and ``n >= v`` with a literal
``v`` (a number, or a string such as ``'NaN'``; an IN list's values, BETWEEN's two ends) are
rendered ``("raw 2" = v AND "n" = v)`` where they stand as above (under AND, OR and parentheses
only; ``<>``, NOT, ``IS [NOT] TRUE/FALSE`` keep the bounded form). The answer is the bounded one's
by the argument above, which needs of the operator only that it never fails (a numeric comparison
does not): where the bounded value is the value
the two conjuncts agree; where it is NULL (a value stored compressed, apart or past 127 bytes, or NULL) the
bounded conjunct is NULL and the conjunction false or NULL, which decide alike there. Unlike
``texteq``, ``numeric_eq`` and the orderings read (detoast) the whole value, so the raw conjunct, and
an index search that compares an entry of such a value (a B-tree entry holds one only compressed), read a
long value the bound would not: the work the bound removed, on one row, which the quantum hides, as
it hides the other levers it lifts. On a table without a quantum the bounded form stays. A range
scan is worth it: a selective ``n < v`` or BETWEEN went from a sequential scan to a bitmap one (×54
to ×87), and an unselective one stays a sequential scan whose rows pay one comparison more (up to
×1.2 slower at 90 % of the rows).

**Columns of a declared size** (``varchar(n)``/``char(n)`` within the bound, ``numeric(p, s)``,
the ranges of :data:`rewriter.text_bounds.WIDE_RANGES`: :func:`rewriter.text_bounds.declared_apart`)
are read through the check of their placement, which no index holds. Their raw column is compared
term by term nowhere, with or without a quantum: ``texteq``, ``bpchareq`` and ``numeric_eq`` read a
value stored apart once a term (64 OR'ed ``=``: +128 buffers; benchmarks/results.md). Instead a
WHERE's first ``=`` or IN list of literals on such a column standing at its top level gets one raw
conjunct, ``"raw N" = ANY (ARRAY[…])`` hashed, AND'ed before the whole condition: a row's raw value
is read at most twice (the hash, and the equality when it matches) whatever the other terms, and a
plain index serves it. Why it changes no answer: :func:`hashed_raw_equality`. Where that first
construct compares the column with one bound parameter (``code = $1``, ``code IN ($1)``: BI tools'
and drivers' filters), the conjunct is ``"raw N" = $1``, AND'ed after the condition, read once
(:func:`parameter_raw_equality`). A list of several parameters (``code IN ($1, $2, $3)``: JDBC's and
psycopg's lists, Superset's multi-value filters through SQLAlchemy's expanding IN) gets ``"raw N" =
ANY (ARRAY[$1, $2, $3, …])``, the list repeated to :data:`HASHED_LIST` values, AND'ed after the
condition where its parameters are provably typed alike (:func:`parameter_list_equality`); dpproxy's
backend connections plan every statement with its bound values (``plan_cache_mode`` pinned to
``force_custom_plan``, proxy/backend/pool.py), so the array is a constant and hashed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.tables import ColumnInfo, Relation

from .sql_text import operator
from .text_bounds import NUMERIC, column_sql, declared_apart, length_bounded, raw_sql, unconstrained_numeric

__all__ = ["HASHED_LIST", "NUMERIC_SYMBOLS", "RAW_TYPES", "ParameterList", "hashed_raw_equality", "literal_bytes",
           "parameter_list_equality", "parameter_raw_equality", "raw_comparison"]

RAW_TYPES = frozenset({25, 1043})
"""text and varchar: the types whose ``=`` is ``texteq``, which compares stored sizes before values."""
NUMERIC_SYMBOLS = frozenset({"=", "<", "<=", ">", ">="})
"""The comparisons of an unconstrained numeric rendered on the raw column too: equality and the
orderings, which a B-tree index on it serves (``<>`` is true, not NULL, for a value past the bound)."""
_MAX_BYTES_PER_CHARACTER = 4  # UTF-8, and every server encoding PostgreSQL has; ASCII is 1 in each
HASHED_LIST = 9
"""The fewest values from which PostgreSQL (14 on) hashes ``x = ANY (<constant array>)``
(MIN_ARRAY_SIZE_FOR_HASHED_SAOP): below it each value is compared in turn, reading ``x`` each time."""
_HASHED_EQUALITY = {1043: "text", 1042: "bpchar", NUMERIC: "numeric",
                    3926: "int8range", 3908: "tsrange", 3910: "tstzrange"}
"""Per type of a column of a declared size, the type its ``=`` compares a literal as (varchar's is
text's ``texteq``; the others their own), whose equality hashes. ``bit``'s ``biteq`` does not: a
list of a ``bit(n)`` would read the value once a value, so it gets no raw conjunct."""


def literal_bytes(value: str) -> int:
    """The most bytes ``value`` takes in any server encoding: 1 an ASCII character, else 4."""
    return sum(1 if character < "\x80" else _MAX_BYTES_PER_CHARACTER for character in value)


def _raw_allowed(table: Relation, column: ColumnInfo, symbol: str, text: str | None) -> bool:
    """Whether ``column symbol <a literal>`` (``text``: a string literal's value, else None) may be
    compared on the raw column too, as the module says."""
    if not table.policy.answer_quantum_ms or not length_bounded(column, table.policy):
        return False
    if unconstrained_numeric(column):
        return symbol in NUMERIC_SYMBOLS
    return (symbol == "=" and column.type_oid in RAW_TYPES and column.deterministic_collation and text is not None
            and literal_bytes(text) <= table.policy.max_text_bytes)


def raw_comparison(table: Relation, column: ColumnInfo, symbol: str, value: str, text: str | None) -> str | None:
    """``column symbol value`` on the raw column and on the bounded value, ``value`` the SQL of a
    literal (``text`` its value when a string, else None), for a condition where it stands as the
    module says (its caller knows where); or None when the bounded value alone must be compared: the
    table has no ``answer_quantum_ms``, the column is read raw anyway (no bound applies), or is not
    one of the module's (a deterministic text or varchar compared with ``=`` and a string of at most
    the bound, an unconstrained numeric compared with one of :data:`NUMERIC_SYMBOLS`)."""
    if not _raw_allowed(table, column, symbol, text):
        return None
    return f"({operator(raw_sql(column), symbol, value)} AND {operator(column_sql(column), symbol, value)})"


def hashed_raw_equality(table: Relation, column: ColumnInfo, values: Sequence[str]) -> str | None:
    """The raw conjunct beside a top-level ``column = v`` or ``column IN (v, …)`` of a WHERE on a
    column of a declared size read through its in-line check (:func:`rewriter.text_bounds.declared_apart`):
    ``"raw N" = ANY (ARRAY[<each value cast as the column's = casts it>, …])``, the values repeated
    to :data:`HASHED_LIST` so that PostgreSQL hashes the list, or None (no such column, or one whose
    equality does not hash). ``values``: the SQL of each literal the construct compares with (all of
    them: a raw conjunct that missed one would drop rows the condition keeps).

    AND'ed at the top of the WHERE beside the condition, whose every term reads the bounded value,
    it keeps exactly the rows the condition keeps: where the condition is true, its construct is,
    so the bounded value is not NULL, is the raw one, and equals one of ``values`` by the same
    operator; where it is false or NULL the row is dropped whatever the conjunct. The equalities
    never fail, and each literal is cast to the type PostgreSQL coerces it to beside the column
    (without the column's modifier, which would round or reject it), as the bounded form does
    while parsing, so it fails exactly where that does. Hashed, it reads a row's raw value at most
    twice (the hash, and the equality when the hash matches) whatever the statement's other terms,
    and a plain B-tree index on the column serves it (docs/threat-model.md, Timing)."""
    type_name = _HASHED_EQUALITY.get(column.value_type[0])
    if type_name is None or not values or not declared_apart(column, table.policy):
        return None
    cast = [f"CAST({value} AS pg_catalog.{type_name})" for value in dict.fromkeys(values)]
    listed = (cast * HASHED_LIST)[:max(HASHED_LIST, len(cast))]
    raw = raw_sql(column)
    return f"({raw} OPERATOR(pg_catalog.=) ANY (ARRAY[{', '.join(listed)}]))"


def parameter_raw_equality(table: Relation, column: ColumnInfo, value: str, column_first: bool) -> str | None:
    """The raw conjunct beside a top-level ``column = $k`` (or ``column IN ($k)``) of a WHERE, on a
    column :func:`hashed_raw_equality` serves: ``("raw N" OPERATOR(pg_catalog.=) <value>)``, the
    sides in the bounded term's order (``column_first``), or None where that function gives none.
    ``value``: the bounded term's other side as it is rendered (``$k``; ``CAST($k AS
    pg_catalog.numeric)`` beside a numeric column).

    AND'ed *after* the condition, it keeps exactly the rows the condition keeps, by the argument of
    :func:`hashed_raw_equality`, which here needs nothing of the parameter's type: PostgreSQL has
    typed ``$k`` by the time it reads the conjunct (its declared type, or the one its first use
    gave it, which is never the conjunct), and the raw column has the bounded value's type (a
    domain's base type where the bounded value is a CASE over a domain: operators resolve a domain
    as its base type), so ``=`` resolves to the bounded term's operator and coerces ``$k`` as it
    does. No cast is written, so none can fail or round where the bounded term's coercion does not:
    a value that fails to convert fails at Bind, once, for both. One comparison, not a hashed list:
    it reads a row's raw value at most once, in a custom plan or a generic one (where a list of
    parameters would not hash, and would read it once a value), and a plain B-tree index serves it.
    A list of several parameters: :func:`parameter_list_equality`."""
    if _HASHED_EQUALITY.get(column.value_type[0]) is None or not declared_apart(column, table.policy):
        return None
    raw = raw_sql(column)
    return operator(raw, "=", value) if column_first else operator(value, "=", raw)


_BARE = re.compile(r"\$([1-9][0-9]*)")
_CAST = re.compile(r"CAST\(\$[1-9][0-9]* AS (pg_catalog\.\w+)\)")
NAME = 19
"""``name``: beside a text column ``=`` is ``texteqname``, whose two sides hash with two functions, so
PostgreSQL never hashes a list of it (``ScalarArrayOpExpr`` needs one): each value would read the row's."""


@dataclass(frozen=True)
class ParameterList:
    """A raw conjunct over a list of parameters (:func:`parameter_list_equality`) and the numbers of
    its parameters written bare, which it holds only when the statement is bound with all of them
    declared of one type (:meth:`holds`)."""

    sql: str
    parameters: tuple[int, ...]

    def holds(self, types: Sequence[int]) -> bool:
        """Whether the conjunct keeps the condition's rows, its parameters declared ``types`` (0:
        unspecified; a parameter past ``types`` is unspecified): one type for all, not ``name``."""
        declared = {types[number - 1] if number <= len(types) else 0 for number in self.parameters}
        return len(declared) <= 1 and NAME not in declared


def parameter_list_equality(table: Relation, column: ColumnInfo, values: Sequence[str],
                            uses: Mapping[str, int]) -> ParameterList | None:
    """The raw conjunct beside a top-level ``column IN ($j, $k, …)`` of a WHERE, on a column
    :func:`hashed_raw_equality` serves: ``("raw N" OPERATOR(pg_catalog.=) ANY (ARRAY[<values>, …]))``,
    ``values`` repeated to :data:`HASHED_LIST`, or None. ``values``: the terms' other sides as they
    are rendered, each a bare ``$k`` or one cast of one (``CAST($k AS pg_catalog.numeric)`` beside a
    numeric column); ``uses``: how many times each parameter (``$k``) occurs in the statement.

    AND'ed after the condition it keeps exactly the rows the condition keeps, by the argument of
    :func:`hashed_raw_equality`, when every value has the type its own term gave it: then the array's
    type is theirs, nothing in it is converted, ``=`` resolves as each term's does (the raw column
    has the bounded value's type) and converts the array, if at all, as each term converts its
    value. Values of different types would be converted to their common type (a ``bpchar`` and a
    ``name`` to ``name``, cut at 63 bytes; a ``"char"`` and a ``text`` fail), so the values must be
    of one type: all cast to one type (the rewriter's cast to numeric), or all bare, each used only
    in this list (so that it is typed by its own term: a parameter typed elsewhere may differ from
    its neighbours while all are unspecified) and, when bound, declared of one type
    (:meth:`ParameterList.holds`). None where they are neither.

    Read: dpproxy's backend plans every statement with its bound values (``plan_cache_mode``
    pinned to ``force_custom_plan``), so the array is a constant of at least :data:`HASHED_LIST`
    values, which PostgreSQL hashes: a row's raw value is read for the hash, and once more by the
    equality when the hash matches, however many values the list has. In a generic plan the array
    would not be a constant, and each value would read it again (tests/test_attack_stop40.py)."""
    if len(values) < 2 or _HASHED_EQUALITY.get(column.value_type[0]) is None or not declared_apart(column, table.policy):
        return None
    bare = [_BARE.fullmatch(value) for value in values]
    if all(bare):
        numbers = tuple(dict.fromkeys(int(match.group(1)) for match in bare if match is not None))
        if any(uses.get(f"${number}", 0) != values.count(f"${number}") for number in numbers):
            return None
    else:
        casts = {match.group(1) if match is not None else None for match in map(_CAST.fullmatch, values)}
        if len(casts) != 1 or None in casts:
            return None
        numbers = ()
    distinct = list(dict.fromkeys(values))
    listed = (distinct * HASHED_LIST)[:max(HASHED_LIST, len(distinct))]
    raw = raw_sql(column)
    return ParameterList(f"({raw} OPERATOR(pg_catalog.=) ANY (ARRAY[{', '.join(listed)}]))", numbers)
