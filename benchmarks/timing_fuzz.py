"""A timing fuzzer: drawn DP statements and drawn adversarial rows, flagged where one row changes the backend time.

Not a timed test: the generative version of :mod:`benchmarks.row_cost`, whose machinery it uses
(its tables ``rc_base``/``rc_plus``, its policy, its planning as dpproxy plans and its alternating
``EXPLAIN ANALYZE``). Each case is a DP statement drawn by :func:`draw_statement` over row_cost's
table (integer, bigint, numeric, float8, text, varchar, a declared-key text column, date,
timestamptz, boolean, a domain over numeric, a domain over text, bytea, and a numeric, a text and a
``numeric(1000, 0)`` of ``STORAGE EXTERNAL`` beside a ``pad`` kept in the row) — conditions, FILTER, CASE, histograms over declared keys, MODE,
percentiles, sample-and-aggregate MIN/MAX/AVG, COUNT(DISTINCT), variances, post-processing
wrappers — and a row drawn by :func:`draw_row` from the value forms of :data:`FORMS` (ordinary,
empty, NULL, each type's extremes, NaN and ±Infinity, infinite dates, values equal to or just
beside the statement's own literals and the policy's bounds, multibyte and periodic text, long
text as one class, numerics of no declared precision at their widest and either side of the
stored-form bound, and values within the bounds stored apart in the TOAST relation by a wide row).
A statement dpproxy refuses is drawn again.

Half the statements are drawn over a protected *view* instead (``Statement.relation``), one of
benchmarks/view_shapes.py's catalogue (renames, casts, ``COLLATE``, ``CASE``/``COALESCE`` outputs,
functions of text, bytea, numeric and jsonb columns, arithmetic on fixed-length ones, a whole row,
a view's WHERE, joins, ``GROUP BY``, ``DISTINCT``, ``security_barrier`` and ``security_invoker``
views, views over views), created over both tables so that the pair differs by the drawn row only;
the row varies the base columns the view's columns are computed from, and over a view that
computes a column the statement reads one and the row varies what it is computed from (drawn as
over the table, few cases read it with a value that matters). dpproxy's own load check
decides which shapes are drawn over (:meth:`Fuzzer.with_views`): a refused shape is listed in the
report with its refusal's text, and ``--unchecked-views`` draws over it too, planned with that check
bypassed, to see what the check closes. A finding over a view is shrunk to the table first, when
the table alone confirms it (a finding that stays on a view is the view's), and reported apart.
The same holds of benchmarks/table_shapes.py's tables, drawn over as the views are: copies of the
table with row-level security policies (measured as a role they apply to; the row varies the
columns a policy reads too, half the time) or generated columns, ``STORED`` and, on PostgreSQL 18,
``VIRTUAL`` (the row varies what they are computed from).

A case is *flagged* when the neighbour's median exceeds the base's by more than both the base's
interquartile range and :data:`THRESHOLD_MS`, or when the neighbour's last run read more than
:data:`BUFFER_THRESHOLD` shared buffers beyond the base's (``EXPLAIN (BUFFERS)``: a witness of what
was read that load does not move); a flagged case is measured twice more with more runs, beside
the same statement with an ordinary row, and *confirmed* only when both agree on one witness: each
flagged in time and above the ordinary row's difference by the threshold, or each reading more
than :data:`BUFFER_THRESHOLD` buffers beyond the ordinary row's (a finding is what the row's values
decide, not that a row is there); a confirmed case is *shrunk* (outputs and
conditions dropped, the row's other columns made ordinary, its values shortened) to the smallest
statement and row that are still accepted and still confirmed. The report lists the confirmed
findings by class: ``long text`` (a text value longer than :data:`LONG_TEXT_CHARS` characters
after shrinking: the known class, docs/threat-model.md's Timing) and the rest by the shrunk
statement. Bound parameters are not drawn: row_cost plans statement text (a parameter is bound
as a literal of its type before dpproxy renders the backend SQL, so the literal forms cover it).

Run from the repository root::

    python -m benchmarks.timing_fuzz --pg 16 --cases 400 --seed 1 --out /tmp/timing_fuzz.md

``--only-values FORM`` (repeatable) draws rows from those forms only (``--help`` names them);
``--no-views`` draws over the table only, ``--shapes views`` or ``--shapes tables`` over the table and
those shapes only;
``--minutes M`` stops drawing after M minutes, and so do Ctrl-C and SIGTERM: the report covers what was measured.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import psycopg

from benchmarks.row_cost import Construct, Measured, load_tables, measure_constructs, on_server, policy_file, print_report, write_row
from benchmarks.table_shapes import TABLE_SHAPES
from benchmarks.view_shapes import SHAPES, ViewShape, check_shapes, create_views, shape_policy, unchecked
from tests.post_charge_wait import LONG_NUMBER, LONG_TEXT, PAD

__all__ = ["FORMS", "WIDE_NUMERICS", "Finding", "Fuzzer", "Proof", "Statement", "buffers_confirmed", "draw_row", "draw_statement", "is_long_text", "read_columns", "shrink_candidates"]

THRESHOLD_MS = 0.05  # a difference below this is no finding, whatever the jitter
BUFFER_THRESHOLD = 2  # shared buffers a row may add beyond the ordinary row's (a new heap page) and be no finding
LONG_TEXT_CHARS = 256  # a text value longer than this puts a finding in the known long-text class
_TEXT_COLUMNS = ("t", "v", "ci", "cat", "dt", "tx", "by")  # by: bytea, its values drawn as text and converted

# Literals the statements compare with, by column: ordinary values, the policy's bounds and beside them.
_LITERALS: dict[str, tuple[str, ...]] = {
    "age": ("0", "17", "40", "100", "101", "-1", "2147483647"),
    "big": ("0", "5000000000", "10000000000", "10000000001", "-9223372036854775808"),
    "n": ("0", "50.5", "100", "100.0001", "-0.5", "1e20"),
    "dn": ("0", "50.5", "100", "100.0001", "-0.5", "1e20"),
    "nx": ("0", "50.5", "100", "-0.5"),
    "nd": ("0", "50", "100", "-1"),
    "f": ("0", "50.5", "100", "1e308", "-1e-300"),
    "t": ("''", "'ordinary text of a row'", "'row 7 of an ordinary table'", "'m'", "'Ünïcödé'", "'z'"),
    "v": ("''", "'ordinary'", "'w7'", "'w'", "'ß'"),
    "ci": ("''", "'ordinary'", "'V7'", "'m'"),
    "cat": ("'a'", "'b'", "'other'", "''", "'A'"),
    "dt": ("''", "'ordinary'", "'row 7'", "'m'"),
    "tx": ("''", "'ordinary'", "'row 7'", "'m'"),
    "by": ("'ordinary'", "'row 7'", "'x'"),
    "d": ("'2021-01-01'", "'2022-06-01'", "'2025-12-31'", "'2026-01-01'", "'infinity'", "'-infinity'"),
    "ts": ("'2021-01-01 00:00+00'", "'2022-06-01 12:00+00'", "'2025-12-31 23:59:59+00'", "'infinity'", "'-infinity'"),
}
_NUMERIC = ("age", "big", "n", "f", "nx", "nd")  # summed (dn, a domain, is only counted and compared)
_PATTERNS = ("'%a%'", "'row%'", "'%table'", "'_rdinary%'", "'%ü%'", "'%'", "'w_'", "'%x%y%'", "'a\\%%'")
_KEYS = ("cat", "age", "width_bucket(n, 0, 100, 10)", "date_trunc('month', ts)", "date_trunc('month', d)",
         "EXTRACT(MONTH FROM d)")


@dataclass(frozen=True)
class Statement:
    """A drawn DP statement over ``{table}``, or over the protected view ``relation`` names
    (benchmarks/view_shapes.py: ``rcv_<relation>_{table}``): its outputs, its AND-ed conditions and
    a GROUP BY key.

    ``literals`` are the (column, literal) pairs its conditions compare with: the row may equal them.
    """

    outputs: tuple[str, ...]
    conditions: tuple[str, ...] = ()
    key: str | None = None
    literals: tuple[tuple[str, str], ...] = ()
    relation: str = ""

    @property
    def sql(self) -> str:
        select = ", ".join(((f"{self.key} AS k",) if self.key else ()) + self.outputs)
        where = f" WHERE {' AND '.join(self.conditions)}" if self.conditions else ""
        group = " GROUP BY 1" if self.key else ""
        source = f"rcv_{self.relation}_{{table}}" if self.relation else "{table}"
        return f"SELECT {select} FROM {source}{where}{group}"


class _Draw:
    """One statement's drawing state: the random source and the literals used so far."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.literals: list[tuple[str, str]] = []

    def literal(self, column: str) -> str:
        value = self.rng.choice(_LITERALS[column])
        self.literals.append((column, value))
        return value

    def condition(self, depth: int = 1) -> str:
        rng = self.rng
        if depth > 0 and rng.random() < 0.2:
            joiner = rng.choice((" OR ", " AND "))
            return "(" + joiner.join(self.condition(depth - 1) for _ in range(rng.randint(2, 3))) + ")"
        if rng.random() < 0.06:
            return f"NOT ({self.condition(0)})"
        column = rng.choice((*_LITERALS, "b"))
        if column == "b":
            return rng.choice(("b", "NOT b", "b IS TRUE", "b IS NOT FALSE", "b = false", "b IS NULL"))
        kind = rng.random()
        if kind < 0.08:
            return f"{column} IS {rng.choice(('', 'NOT '))}NULL"
        if kind < 0.2:
            values = sorted({self.literal(column) for _ in range(rng.randint(1, 5))})
            return f"{column} {rng.choice(('IN', 'NOT IN'))} ({', '.join(values)})"
        if kind < 0.3:
            low, high = sorted((self.literal(column), self.literal(column)))
            return f"{column} BETWEEN {low} AND {high}"
        if column in ("t", "v", "ci") and kind < 0.5:
            operator = rng.choice(("LIKE", "ILIKE", "NOT LIKE", "NOT ILIKE"))
            pattern = rng.choice(_PATTERNS)
            self.literals.append((column, pattern.replace("%", "").replace("_", "")))
            return f"{column} {operator} {pattern}"
        if column in ("t", "v") and kind < 0.58:
            return f"{rng.choice(('lower', 'upper'))}({column}) = {self.literal(column)}"
        return f"{column} {rng.choice(('=', '<>', '<', '<=', '>', '>='))} {self.literal(column)}"

    def aggregate(self, grouped: bool) -> str:
        rng = self.rng
        kind = rng.randrange(12 if not grouped else 7)
        numeric = rng.choice(_NUMERIC)
        if kind == 0:
            return "COUNT(*)"
        if kind == 1:
            return f"COUNT({rng.choice((*_LITERALS, 'b'))})"
        if kind == 2:
            return f"SUM({numeric})"
        if kind == 3:
            return f"AVG({rng.choice(('age', 'big', 'n', 'nx'))})"
        if kind == 4:
            return f"COUNT(*) FILTER (WHERE {self.condition()})"
        if kind == 5:
            return rng.choice((f"SUM(CASE WHEN {self.condition()} THEN {numeric} ELSE 0 END)",
                               f"COUNT(CASE WHEN {self.condition()} THEN 1 END)",
                               f"SUM({numeric}) FILTER (WHERE {self.condition()})"))
        if kind == 6:
            return f"COUNT(DISTINCT {rng.choice(('t', 'v', 'cat', 'age', 'd', 'big', 'dn', 'nx', 'dt', 'tx', 'by', 'nd'))})"
        if kind == 7:
            return rng.choice(("AVG(f)", "MIN(f)", "MAX(f)", "MIN(n)", "MAX(n)", "MAX(age)"))
        if kind == 8:
            return (f"percentile_{rng.choice(('cont', 'disc'))}({rng.choice(('0.5', '0.1', '0.99'))}) "
                    f"WITHIN GROUP (ORDER BY {rng.choice(('age', 'n', 'f', 'big'))})")
        if kind == 9:
            return "MODE() WITHIN GROUP (ORDER BY cat)"
        if kind == 10:
            return f"{rng.choice(('VARIANCE', 'STDDEV', 'VAR_POP'))}({rng.choice(('age', 'n'))})"
        return rng.choice(("ROUND(AVG(n), 1)", "COUNT(*) * 2", "COALESCE(SUM(age), 0)", "CAST(SUM(n) AS integer)",
                           "SUM(age) / NULLIF(COUNT(*), 0)"))


# Aggregates that refuse company (one release a statement, or sample-and-aggregate alone).
_ALONE = ("percentile_", "MODE()", "MIN(", "MAX(", "AVG(f)", "VARIANCE", "STDDEV", "VAR_POP")


def draw_statement(rng: random.Random) -> Statement:
    """A DP statement over row_cost's table, drawn from the language dpproxy answers (most draws are accepted)."""
    draw = _Draw(rng)
    key = rng.choice(_KEYS) if rng.random() < 0.25 else None
    outputs: list[str] = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        output = draw.aggregate(key is not None)
        if any(marker in output for marker in _ALONE):
            outputs = [output]
            break
        if output not in outputs:
            outputs.append(output)
    conditions = tuple(draw.condition() for _ in range(rng.choice((0, 1, 1, 2, 3))))
    return Statement(tuple(outputs), conditions, key, tuple(dict.fromkeys(draw.literals)))


# The value forms of the adversarial row: name -> per column, the SQL of the value (None: not for that column).
_EXTREMES = {
    "age": ("-2147483648", "2147483647"), "big": ("-9223372036854775808", "9223372036854775807"),
    "n": ("'NaN'", "'Infinity'", "'-Infinity'", "1e-400", "('9' || repeat('9', 1000))::numeric",
          "('9' || repeat('9', 131071))::numeric", "('50.' || repeat('3', 16383))::numeric"),
    "f": ("'NaN'", "'Infinity'", "'-Infinity'", "1.7976931348623157e308", "5e-324", "-0.0"),
    "d": ("'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'"),
    "ts": ("'infinity'", "'-infinity'", "'294276-12-31 23:59:59+00'", "'4713-01-01 00:00+00 BC'"),
    "b": ("false", "true"),
}
_EXTREMES["dn"] = _EXTREMES["nx"] = _EXTREMES["nd"] = _EXTREMES["n"]
_BOUNDS = {"age": ("0", "100", "-1", "101"), "big": ("0", "10000000000", "10000000001", "-1"),
           "n": ("0", "100", "100.0000000001", "-0.0000000001"), "f": ("0", "100", "100.00000000000001", "-5e-324"),
           "d": ("'2021-01-01'", "'2025-12-31'", "'2020-12-31'", "'2026-01-01'"),
           "ts": ("'2021-01-01 00:00+00'", "'2025-12-31 23:59:59.999999+00'", "'2020-12-31 23:59:59.999999+00'")}
_MULTIBYTE = ("'Ünïcödé ß'", "'😀😀😀'", "'İı'", "'ǅ'", "'ﬀ'", "repeat('ß', 60)", "repeat('😀', 60)")
_PERIODIC = ("repeat('ab', 32)", "repeat('a', 63) || 'b'", "repeat('%', 40)", "repeat('row ', 16)", "repeat('_\\', 30)",
             "repeat('a', 255)", "repeat('ab', 128)", "repeat('ß', 128)")  # up to the long class's edge
# A numeric of no declared precision read under rewriter/text_bounds.py's bound (NUMERIC_MAX_BYTES, 512):
# at its widest, random (out of line) and repeated (compressed in the row); at the bound and past it.
WIDE_NUMERICS = ("(SELECT string_agg((random() * 9)::int::text, '') FROM generate_series(1, 131072))::numeric",
                  "repeat('1234', 10000)::numeric", "repeat('9', 248)::numeric", "repeat('9', 252)::numeric")
_NUMERIC_COLUMNS = ("n", "dn", "nx", "nd")
_LONG = ("repeat('a', 1000)", "repeat('ab', 50000)", "repeat('ß', 20000)",
         "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 3000) g)")


def _beside(column: str, literal: str) -> list[str]:
    """Values equal to ``literal`` and just beside it, for ``column``."""
    if column in ("d",) and literal.strip("'") not in ("infinity", "-infinity"):
        return [literal, f"{literal}::date + 1", f"{literal}::date - 1"]
    if column == "ts" and literal.strip("'") not in ("infinity", "-infinity"):
        return [literal, f"{literal}::timestamptz + interval '1 microsecond'", f"{literal}::timestamptz - interval '1 microsecond'"]
    if column in _TEXT_COLUMNS:
        body = literal if literal.startswith("'") else f"'{literal}'"
        return [body, f"{body} || 'a'", f"{body} || ' '", f"upper({body})", f"left({body}, -1)"]
    if column in ("age", "big") and literal.lstrip("-").isdigit():
        return [literal, f"{literal}::numeric + 1", f"{literal}::numeric - 1"]
    if column in ("n", "f"):
        return [literal, f"{literal}::numeric + 0.000001", f"{literal}::numeric - 0.000001"]
    return [literal]


FORMS: dict[str, Callable[[random.Random, str, Statement], str | None]] = {
    "ordinary": lambda rng, column, statement: None,
    "null": lambda rng, column, statement: "NULL",
    "empty": lambda rng, column, statement: "''" if column in _TEXT_COLUMNS else None,
    "extreme": lambda rng, column, statement: rng.choice(_EXTREMES[column]) if column in _EXTREMES else None,
    "bound": lambda rng, column, statement: rng.choice(_BOUNDS[column]) if column in _BOUNDS else None,
    "literal": lambda rng, column, statement: (
        rng.choice(_beside(column, rng.choice([v for c, v in statement.literals if c == column])))
        if any(c == column for c, _ in statement.literals) else None),
    "multibyte": lambda rng, column, statement: rng.choice(_MULTIBYTE) if column in _TEXT_COLUMNS else None,
    "periodic": lambda rng, column, statement: rng.choice(_PERIODIC) if column in _TEXT_COLUMNS else None,
    "long text": lambda rng, column, statement: rng.choice(_LONG) if column in _TEXT_COLUMNS else None,
    "wide numeric": lambda rng, column, statement: rng.choice(WIDE_NUMERICS) if column in _NUMERIC_COLUMNS else None,
    # within the bounds, stored apart in the TOAST relation by a wide row (draw_row adds the pad)
    "apart": lambda rng, column, statement: (LONG_NUMBER if column in _NUMERIC_COLUMNS else
                                             LONG_TEXT if column in ("t", "dt", "tx", "by") else None),
}
_ROW_COLUMNS = ("age", "big", "n", "f", "t", "v", "ci", "cat", "d", "ts", "b", "dn", "nx", "dt", "tx", "by", "nd")
_APART = (LONG_NUMBER, LONG_TEXT, f"convert_to({LONG_TEXT}, 'UTF8')", f"to_jsonb(({LONG_TEXT})::text)")


def read_columns(statement: Statement) -> list[str]:
    sql = replace(statement, relation="").sql.replace("{table}", "")
    return [c for c in _ROW_COLUMNS if any(f"{sep}{c}{end}" in sql for sep in "( ," for end in ") ,")]


# Base columns of other types a view computes from, and how a text form becomes one of their values.
_CONVERTED = {"by": "convert_to({value}, 'UTF8')", "j": "to_jsonb(({value})::text)"}


def draw_row(rng: random.Random, statement: Statement, forms: Sequence[str] = tuple(FORMS),
             shape: ViewShape | None = None) -> dict[str, str]:
    """The adversarial row (SQL by base column; the rest ordinary): 1 to 3 of the columns the
    statement reads, each given a value of a form drawn from ``forms`` that fits the column; over a
    view (``shape``), one of the base columns that decide the view's column is given it instead,
    and a column the view computes is among them when the statement reads one; over a table whose
    policies read other columns (``shape.varied``), one of those too, half the time."""
    read = read_columns(statement) or list(_ROW_COLUMNS)
    row: dict[str, str] = {}
    chosen = rng.sample(read, min(len(read), rng.randint(1, 3)))
    computed = [c for c in read if shape is not None and c in shape.outputs]
    if computed and not set(chosen) & set(computed):
        chosen[0] = rng.choice(computed)
    for column in chosen:
        _give_form(rng, row, rng.choice(shape.base_columns(column)) if shape is not None else column, statement, forms)
    if shape is not None and shape.varied and rng.random() < 0.5:
        _give_form(rng, row, rng.choice(shape.varied), statement, forms)
    if any(value in _APART for value in row.values()):
        row["pad"] = PAD  # kept in the row (STORAGE MAIN): pushes the value out to the TOAST relation
    return row


def _give_form(rng: random.Random, row: dict[str, str], base: str, statement: Statement, forms: Sequence[str]) -> None:
    """``row[base]``: a value of the first of ``forms`` (in a drawn order) that fits ``base``, if any does."""
    for form in rng.sample(list(forms), len(forms)):
        value = FORMS[form](rng, "t" if base == "j" else base, statement)
        if value is not None:
            row[base] = _CONVERTED[base].format(value=value) if base in _CONVERTED and value != "NULL" else value
            return


def is_long_text(row: dict[str, str]) -> bool:
    """Does ``row`` hold a text value of the known long class (longer than :data:`LONG_TEXT_CHARS`)?"""
    for column, value in row.items():
        if column not in _TEXT_COLUMNS:
            continue
        repeated = sum(len(unit) * int(count) for unit, count in _REPEAT.findall(value))
        hashed = sum(32 * int(count) for count in _MD5S.findall(value))  # string_agg of md5s: 32 characters each
        if max(repeated, hashed, len(value)) > LONG_TEXT_CHARS:
            return True
    return False


_REPEAT = re.compile(r"repeat\('((?:[^']|'')*)', (\d+)\)")
_MD5S = re.compile(r"string_agg\(md5\(g::text\), ''\) FROM generate_series\(1, (\d+)\)")


def _shorter(value: str) -> str | None:
    """``value`` with half its repetitions, or None when it cannot be shortened."""
    for head, tail in (("convert_to(", ", 'UTF8')"), ("to_jsonb((", ")::text)")):
        if value.startswith(head) and value.endswith(tail):
            inner = _shorter(value[len(head):-len(tail)])
            return None if inner is None else f"{head}{inner}{tail}"
    if value.startswith("repeat(") and value.endswith(")"):
        unit, count = value[len("repeat("):-1].rsplit(", ", 1)
        if count.isdigit() and int(count) > 1:
            return f"repeat({unit}, {int(count) // 2})"
    if value.startswith("(SELECT string_agg") and "generate_series(1, " in value:
        head, tail = value.split("generate_series(1, ")
        chunks = int(tail.split(")")[0])
        if chunks > 1:
            return f"{head}generate_series(1, {chunks // 2}) g)"
    return None


def _parts(condition: str) -> list[str]:
    """The terms of a drawn ``(a OR b …)`` or ``(a AND b …)`` (:meth:`_Draw.condition`), or none."""
    if not (condition.startswith("(") and condition.endswith(")")):
        return []
    for joiner in (" OR ", " AND "):
        parts = condition[1:-1].split(joiner)
        # a split inside a nested group or a BETWEEN … AND … leaves unbalanced parts: no candidate
        if len(parts) > 1 and all(p.count("(") == p.count(")") and " BETWEEN " not in p for p in parts):
            return parts
    return []


def shrink_candidates(statement: Statement, row: dict[str, str]) -> Iterator[tuple[Statement, dict[str, str]]]:
    """Smaller (statement, row) pairs, one step each: the view replaced by the table (a finding
    that stays on a view is the view's), an output, a condition or the key dropped, a column of the
    row made ordinary, a value shortened."""
    if statement.relation:
        yield replace(statement, relation=""), row
    if len(statement.outputs) > 1:
        for index in range(len(statement.outputs)):
            yield replace(statement, outputs=statement.outputs[:index] + statement.outputs[index + 1:]), row
    for index, condition in enumerate(statement.conditions):
        rest = statement.conditions[:index] + statement.conditions[index + 1:]
        yield replace(statement, conditions=rest), row
        for part in _parts(condition):
            yield replace(statement, conditions=rest[:index] + (part,) + rest[index:]), row
    if statement.key is not None:
        yield replace(statement, key=None), row
    if len(row) > 1:
        for column in row:
            yield statement, {c: v for c, v in row.items() if c != column}
    for column, value in row.items():
        shorter = _shorter(value)
        if shorter is not None:
            yield statement, {**row, column: shorter}


@dataclass(frozen=True)
class Proof:
    """One confirmation: the case's measurement and the same statement's with an ordinary row."""

    item: Measured
    control: Measured

    @property
    def summary(self) -> str:
        """The row's extra ms (jitter) and buffers (base → neighbour), and the ordinary row's."""
        return (f"{self.item.extra_ms:+.3f} ms (jitter {self.item.jitter_ms:.3f}), buffers {self.item.base_buffers:,} → "
                f"{self.item.plus_buffers:,}; ordinary row {self.control.extra_ms:+.3f} ms, buffers "
                f"{self.control.base_buffers:,} → {self.control.plus_buffers:,}")


@dataclass
class Finding:
    """A confirmed case: as drawn (with its first measurement and its confirmations), and as shrunk
    (with the confirmations of the shrunk case), each witnessed by ``witness``: ``time``,
    ``buffers`` or both."""

    statement: Statement
    row: dict[str, str]
    proofs: list[Proof] = field(default_factory=list)
    drawn: tuple[Statement, dict[str, str], Measured, list[Proof]] | None = None

    @property
    def long_text(self) -> bool:
        return is_long_text(self.row)

    @property
    def witness(self) -> str:
        return " and ".join(name for name, test in (("time", _time_confirmed), ("buffers", buffers_confirmed))
                            if self.proofs and all(test(p) for p in self.proofs)) or "none"


def _extra_buffers(item: Measured) -> int:
    return item.plus_buffers - item.base_buffers


def _flagged(item: Measured) -> bool:
    """Does the row add more than the jitter and the threshold to the time, or more than the
    buffer threshold to the shared buffers the statement reads (a witness load does not move)?"""
    return item.refused is None and (item.extra_ms > max(item.jitter_ms, THRESHOLD_MS)
                                     or _extra_buffers(item) > BUFFER_THRESHOLD)


def _time_confirmed(proof: Proof) -> bool:
    item = proof.item
    return item.extra_ms > max(item.jitter_ms, THRESHOLD_MS) and item.extra_ms - proof.control.extra_ms > THRESHOLD_MS


def buffers_confirmed(proof: Proof) -> bool:
    return _extra_buffers(proof.item) - _extra_buffers(proof.control) > BUFFER_THRESHOLD


class Fuzzer:
    """The measuring loop over one server: draws, flags, confirms, shrinks.

    ``shapes`` are the protected views (benchmarks/view_shapes.py) statements are drawn over besides
    the table, half the cases, each as likely: the policy at ``policy_path`` protects them, and the
    caller gives only the shapes dpproxy's load check accepts (:meth:`with_views`), unless
    ``unchecked``, which plans with that check bypassed to measure what it refuses."""

    def __init__(self, dsn: str, policy_path: Path, rows: int, repeats: int, shapes: Sequence[ViewShape] = (),
                 unchecked: bool = False) -> None:
        self.dsn, self.policy_path, self.rows, self.repeats = dsn, policy_path, rows, repeats
        self.shapes = {shape.name: shape for shape in shapes}
        self.unchecked = unchecked
        self.largest: list[tuple[float, float, int, str, str]] = []  # (extra, jitter, extra buffers, statement, row)
        self.failures: list[tuple[str, str, str]] = []  # (statement, row, error): a run that failed on the row

    @classmethod
    def with_views(cls, dsn: str, policy_path: Path, rows: int, repeats: int, directory: Path,
                   shapes: Sequence[ViewShape] = SHAPES + TABLE_SHAPES,
                   unchecked: bool = False) -> tuple[Fuzzer, dict[str, str | None]]:
        """A fuzzer over row_cost's tables (policy ``policy_path``) and ``shapes``' relations (views,
        and tables with policies or generated columns), created now, those the server's version
        can hold; with the load check's verdict on each (None: accepted, else the refusal's text).
        Statements are drawn over the accepted shapes only, or over all when ``unchecked``."""
        with psycopg.connect(dsn) as conn:
            major = int(conn.execute("SHOW server_version_num").fetchone()[0]) // 10_000  # type: ignore[index]
        shapes = [shape for shape in shapes if shape.least_major <= major]
        create_views(dsn, shapes)
        verdicts = check_shapes(policy_path, directory, shapes)
        drawn = [shape for shape in shapes if unchecked or verdicts[shape.name] is None]
        policy = shape_policy(policy_path, drawn, directory / "views.yaml")
        return cls(dsn, policy, rows, repeats, drawn, unchecked), verdicts

    def draw(self, rng: random.Random, forms: Sequence[str]) -> tuple[Statement, dict[str, str]]:
        """A statement over the table or one of the views (reading only columns it shows, and one it
        computes if it computes any: what sets the view apart) and a row that fits."""
        shape = rng.choice(list(self.shapes.values())) if self.shapes and rng.random() < 0.5 else None
        statement = draw_statement(rng)
        while shape is not None and not (set(read_columns(statement)) <= set(shape.columns)
                                         and (not shape.outputs or set(read_columns(statement)) & set(shape.outputs))):
            statement = draw_statement(rng)
        if shape is not None:
            statement = replace(statement, relation=shape.name)
        row = draw_row(rng, statement, forms, shape)
        while not self.fits(row, statement):
            row = draw_row(rng, statement, forms, shape)
        return statement, row

    def fits(self, row: dict[str, str], statement: Statement = Statement(())) -> bool:
        """Can ``row`` be stored in each table ``statement`` reads (a value beside a type's limit may
        not be, nor one a generated column's expression fails on)? Tried in a transaction rolled back."""
        with psycopg.connect(self.dsn) as conn:
            try:
                write_row(conn, statement.sql, row, "-1")  # beside the neighbour's row (id 0)
            except psycopg.errors.DataError:
                return False
            finally:
                conn.rollback()
        return True

    def measure(self, pairs: Sequence[tuple[Statement, dict[str, str]]], repeats: int) -> list[Measured]:
        constructs = [Construct(f"case {i}", s.sql, r, self.shapes[s.relation].role if s.relation in self.shapes else None)
                      for i, (s, r) in enumerate(pairs)]
        if not self.unchecked:
            return list(measure_constructs(self.dsn, self.policy_path, constructs, self.rows, repeats))
        with unchecked():
            return list(measure_constructs(self.dsn, self.policy_path, constructs, self.rows, repeats))

    def confirmed(self, statement: Statement, row: dict[str, str]) -> list[Proof] | None:
        """Two more measurements of more runs each, beside the same statement with an ordinary row,
        that agree on one witness: both flagged in time and each above the ordinary row's by more
        than :data:`THRESHOLD_MS` (a row's presence alone, and the neighbour table's layout, add a
        few hundredths of a ms that no value decides), or both reading more than
        :data:`BUFFER_THRESHOLD` shared buffers beyond the ordinary row's; None when not."""
        out = []
        for _ in range(2):
            item, control = self.measure([(statement, row), (statement, {})], 2 * self.repeats + 1)
            if control.refused is not None or item.failed is not None or control.failed is not None:
                return None
            out.append(Proof(item, control))
            if not any(all(test(p) for p in out) for test in (_time_confirmed, buffers_confirmed)):
                return None
        return out

    def shrink(self, statement: Statement, row: dict[str, str], budget: int) -> tuple[Statement, dict[str, str], list[Proof]]:
        """The smallest accepted, confirmed (statement, row) reachable by :func:`shrink_candidates`, in ``budget`` steps."""
        proof: list[Proof] = []
        progress = True
        while progress and budget > 0:
            progress = False
            for candidate, candidate_row in shrink_candidates(statement, row):
                budget -= 1
                if budget < 0:
                    break
                if not self.fits(candidate_row, candidate):
                    continue
                measured = self.confirmed(candidate, candidate_row)
                if measured is not None:
                    statement, row, proof, progress = candidate, candidate_row, measured, True
                    break
        return statement, row, proof

    def run(self, cases: int, seed: int, forms: Sequence[str], deadline: float = float("inf"), batch: int = 20,
            log: Callable[[str], None] = print) -> tuple[list[Finding], dict[str, int]]:
        """``cases`` accepted cases drawn from ``seed``, or as many as fit before ``deadline``
        (:func:`time.monotonic`) or an interrupt (Ctrl-C): the findings and the counts so far."""
        rng = random.Random(seed)
        findings: list[Finding] = []
        counts = {"cases": 0, "drawn": 0, "refused": 0, "failed": 0, "flagged": 0, "confirmed": 0, "over views": 0}
        try:
            while counts["cases"] < cases and time.monotonic() < deadline:
                pairs = [self.draw(rng, forms) for _ in range(min(batch, cases - counts["cases"]))]
                counts["drawn"] += len(pairs)
                for (statement, row), item in zip(pairs, self.measure(pairs, self.repeats)):
                    if item.refused is not None:  # drawn again in the next batch
                        counts["refused"] += 1
                        continue
                    counts["cases"] += 1
                    counts["over views"] += bool(statement.relation)
                    if item.failed is not None:  # an error oracle: what the load check refuses, forced past it
                        counts["failed"] += 1
                        self.failures.append((statement.sql, repr(row), item.failed))
                        log(f"failed on the row ({item.failed}): {statement.sql} | {row}")
                        continue
                    finding = self.case(statement, row, item, counts, log)
                    if finding is not None:
                        findings.append(finding)
                self.largest.sort(reverse=True)
                del self.largest[20:]
                log(f"{counts}")
        except KeyboardInterrupt:
            log("interrupted: the report covers the cases measured so far")
        return findings, counts

    def case(self, statement: Statement, row: dict[str, str], item: Measured, counts: dict[str, int],
             log: Callable[[str], None]) -> Finding | None:
        """One measured case: flagged, confirmed and shrunk, or None."""
        self.largest.append((item.extra_ms, item.jitter_ms, _extra_buffers(item), statement.sql, repr(row)))
        if not _flagged(item):
            return None
        counts["flagged"] += 1
        log(f"flagged {item.extra_ms:+.3f} ms (jitter {item.jitter_ms:.3f}), buffers {item.base_buffers} → "
            f"{item.plus_buffers}: {statement.sql} | {row}")
        drawn_proof = self.confirmed(statement, row)
        if drawn_proof is None:
            return None
        counts["confirmed"] += 1
        small, small_row, proof = self.shrink(statement, row, budget=12 if is_long_text(row) else 40)
        if not proof:
            small, small_row, proof = statement, row, drawn_proof
        finding = Finding(small, small_row, proof, (statement, row, item, drawn_proof))
        log(f"confirmed ({finding.witness}), shrunk: {small.sql} | {small_row} ({'; '.join(p.summary for p in proof)})")
        return finding


def report(findings: Sequence[Finding], counts: dict[str, int], largest: Sequence[tuple[float, float, int, str, str]],
           forms: Sequence[str], rows: int, repeats: int, seed: int, seconds: float,
           verdicts: Mapping[str, str | None] | None = None, unchecked: bool = False,
           failures: Sequence[tuple[str, str, str]] = ()) -> str:
    """The Markdown report: the run's figures, the shapes and the load check's verdicts
    (``verdicts``), the runs that failed on the row (``failures``: statement, row, error), the
    confirmed findings by class, the largest differences seen."""
    lines = [
        f"Seed {seed}; {counts['cases']:,} cases measured ({counts.get('over views', 0):,} over views; "
        f"{counts['drawn']:,} statements drawn, {counts['refused']:,} "
        f"refused and redrawn), {counts.get('failed', 0):,} failed on the row, {counts['flagged']:,} flagged, {counts['confirmed']:,} confirmed; tables of {rows:,} rows, "
        f"{repeats} runs each alternating (confirmations {2 * repeats + 1}); value forms: {', '.join(forms)}; {seconds:.0f} s.",
        "",
    ]
    shapes = {shape.name: shape for shape in SHAPES + TABLE_SHAPES}
    if verdicts:
        accepted = [name for name, refusal in verdicts.items() if refusal is None]
        lines += [f"### Shapes (views, tables with policies or generated columns): {len(accepted)} of {len(verdicts)} accepted by the load check"
                  + (" (the refused ones drawn too: the check bypassed)" if unchecked else ""), "",
                  f"Accepted: {', '.join(accepted) or 'none'}.", ""]
        for name, refusal in verdicts.items():
            if refusal is not None:
                shown = shapes[name].summary if name in shapes else name
                lines.append(f"- Refused `{name}` (`{shown}`): {refusal.split('. ')[0]}.")
        lines.append("")
    if failures:
        lines += [f"### Failed on the row: {len(failures)}", ""]
        lines += [f"- `{sql}` with `{row}`: {error.splitlines()[0]}." for sql, row, error in failures] + [""]
    for title, chosen in (("Over protected views and tables", [f for f in findings if f.statement.relation]),
                          ("Long text (the known class)", [f for f in findings if f.long_text and not f.statement.relation]),
                          ("Outside the long-text class", [f for f in findings if not f.long_text and not f.statement.relation])):
        lines += [f"### {title}: {len(chosen)}", ""]
        for number, finding in enumerate(chosen, 1):
            lines += [f"{number}. Witness: {finding.witness}. Shrunk: `{finding.statement.sql}` with `{finding.row}`: "
                      + "; ".join(p.summary for p in finding.proofs) + "."]
            if finding.statement.relation in shapes:
                lines += [f"   The relation: `{shapes[finding.statement.relation].summary}`."]
            if finding.drawn is not None:
                statement, row, first, proofs = finding.drawn
                lines += [f"   As drawn: `{statement.sql}` with `{row}`: first run {first.extra_ms:+.3f} ms (jitter "
                          f"{first.jitter_ms:.3f}), buffers {first.base_buffers:,} → {first.plus_buffers:,}; confirmed "
                          + "; ".join(p.summary for p in proofs) + "."]
        if chosen:
            lines.append("")
    lines += ["### The largest differences measured (first runs)", "",
              "| one row adds (ms) | jitter (ms) | buffers it adds | statement | row |", "|---:|---:|---:|---|---|"]
    for extra, jitter, buffers, sql, shown in largest[:10]:
        lines.append(f"| {extra:+.3f} | {jitter:.3f} | {buffers:+,} | `{sql}` | `{shown}` |")
    return "\n".join(lines) + "\n"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=float("inf"), help="stop drawing after this long")
    parser.add_argument("--rows", type=int, default=2_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--only-values", action="append", default=[], choices=tuple(FORMS), metavar="FORM",
                        help=f"draw rows from these value forms only: {', '.join(FORMS)}")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    parser.add_argument("--no-views", action="store_true", help="draw statements over the table only")
    parser.add_argument("--shapes", choices=("all", "views", "tables"), default="all",
                        help="the relations drawn over besides the table: views, tables with policies or generated columns, or both")
    parser.add_argument("--unchecked-views", action="store_true",
                        help="draw over the view shapes dpproxy's load check refuses too, planned with the check bypassed")
    args = parser.parse_args(argv)
    forms = tuple(args.only_values) or tuple(FORMS)
    signal.signal(signal.SIGTERM, _interrupt)  # a run in the background stops as on Ctrl-C (there SIGINT is ignored)
    started = time.monotonic()

    def run(dsn: str) -> str:
        load_tables(dsn, args.rows)
        with tempfile.TemporaryDirectory(prefix="dpproxy-timing-fuzz-") as directory:
            policy = policy_file(dsn, Path(directory))
            verdicts: dict[str, str | None] = {}
            if args.no_views:
                fuzzer = Fuzzer(dsn, policy, args.rows, args.repeats)
            else:
                shapes = {"all": SHAPES + TABLE_SHAPES, "views": SHAPES, "tables": TABLE_SHAPES}[args.shapes]
                fuzzer, verdicts = Fuzzer.with_views(dsn, policy, args.rows, args.repeats, Path(directory), shapes,
                                                     unchecked=args.unchecked_views)
                print(f"view shapes accepted: {', '.join(n for n, r in verdicts.items() if r is None)}; refused: "
                      f"{', '.join(n for n, r in verdicts.items() if r is not None)}", flush=True)
            findings, counts = fuzzer.run(args.cases, args.seed, forms, started + 60 * args.minutes, log=lambda line: print(line, flush=True))
            return report(findings, counts, fuzzer.largest, forms, args.rows, args.repeats, args.seed,
                          time.monotonic() - started, verdicts, args.unchecked_views, fuzzer.failures)

    text = on_server(args.dsn, args.pg, "timing-fuzz", run)
    return print_report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
