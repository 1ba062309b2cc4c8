"""What a byte of a text value costs a comparison, a sort and a hash under each kind of collation.

Not a timed test: the measure behind the collation-dependent weights of rewriter/text_bounds.py and
rewriter/single_reads.py. For each collation of ``--collations`` it gives ``tp`` and ``cp`` that
collation (``ALTER TABLE … TYPE text COLLATE``), fills ``rc_base`` with ``--rows`` rows whose values
are ``--short`` random bytes and ``rc_plus`` with the same rows holding ``--long`` bytes: a run of
``a`` and 8 random characters, so that a comparison with the statements' literal (``a`` × ``--long``)
or with another value reads the whole run before it finds a difference, the worst case a byte
(both tables' rows equally wide, every value kept in the row), then runs the backend SQL dpproxy
sends for each statement (planned under ``max_text_bytes`` = ``--long`` and ``answer_quantum_ms``, which
lifts the work limit and leaves the SQL as it is), alternating, and reports
(neighbour − base) / rows / (long − short): PostgreSQL's time a byte of one row's value costs, in
ns and as a fraction of ``lower()``'s on the database's default collation (the calibration, run as
SQL of its own: the unit the work limit's weights are in is ``lower()``'s cost a byte / 51).

Run from the repository root (a server with ICU: Debian's 15, the default)::

    python -m benchmarks.collation_cost --rows 4000 --long 2000 --repeats 11
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from benchmarks.row_cost import (Construct, _writer, alternating_runs, load_tables, measuring_session, on_server, plan_constructs,
                                 policy_file)

LITERAL = "{literal}"  # replaced by 'a' × --long
STATEMENTS: tuple[Construct, ...] = (
    Construct("tp = 'a…a'", f"SELECT COUNT(*) FROM {{table}} WHERE tp = '{LITERAL}'"),
    Construct("tp < 'a…a'", f"SELECT COUNT(*) FROM {{table}} WHERE tp < '{LITERAL}'"),
    Construct("tp LIKE '%b'", "SELECT COUNT(*) FROM {table} WHERE tp LIKE '%b'"),
    Construct("COUNT(DISTINCT tp)", "SELECT COUNT(DISTINCT tp) FROM {table}"),
    Construct("GROUP BY cp (categories, other)", "SELECT cp, COUNT(*) FROM {table} GROUP BY cp"),
)
CALIBRATION = "SELECT COUNT(*) FROM {table} WHERE lower(tp COLLATE \"default\") = 'x'"
COLLATIONS = ("C", "default", "und-x-icu", "rc_ci")
"""``C``; the database's default (``C.UTF-8`` of libc on the measuring servers); ICU's root locale,
deterministic; ``rc_ci`` (benchmarks/row_cost.py: ICU ``und-u-ks-level2``, nondeterministic)."""
LOWER_UNITS = 51  # what rewriter/text_bounds.py weighs lower(t) = 'x' a byte (CASE_FOLD_WORK + COMPARISON_WORK)


PATTERNS = {
    "run": "repeat('a', {n})",
    "case": "'A' || repeat('a', {n} - 1)",
}
"""The neighbour values' first ``long`` − 8 bytes: a run of ``a``, which ``memcmp`` and ICU's
identical-prefix check pass through whole before they find a difference (the worst case of C and of
``=`` under a deterministic collation); or the same run behind an ``A``, which differs from the
literal at the first byte but only at the third (case) level, so that a collation that compares
level by level (ICU, libc's ``strcoll``) reads the whole run at the first level before it looks
at the case (their worst case; ``memcmp`` stops at once)."""


def _values(dsn: str, collation: str, short: int, long: int, pattern: str) -> None:
    """``tp``/``cp`` under ``collation``: random ``short``-byte values in ``rc_base``, ``long``-byte
    ones in ``rc_plus``: ``pattern`` (:data:`PATTERNS`) and 8 random characters; ``pad`` makes each
    row as wide."""
    width = long + 64
    with _writer(dsn) as conn:
        for table, size in (("rc_base", short), ("rc_plus", long)):
            random_text = "(SELECT left(string_agg(md5(id::text || k::text || random()::text), ''), {n}) " \
                          f"FROM generate_series(1, {(2 * width + 31) // 32}) k)"
            value = random_text.format(n=size) if size < 16 else \
                f"{PATTERNS[pattern].format(n=size - 8)} || {random_text.format(n=8)}"
            conn.execute(f'ALTER TABLE {table} ALTER COLUMN tp TYPE text COLLATE "{collation}", '
                         f'ALTER COLUMN cp TYPE text COLLATE "{collation}", ALTER COLUMN pad SET STORAGE PLAIN, '
                         "ALTER COLUMN tp SET STORAGE PLAIN, ALTER COLUMN cp SET STORAGE PLAIN")  # a new type's default is EXTENDED
            conn.execute(f"UPDATE {table} SET tp = {value}, pad = {random_text.format(n=2 * (width - size))}")
            conn.execute(f"UPDATE {table} SET cp = tp")
            conn.execute(f"VACUUM FULL ANALYZE {table}")


def _per_byte(conn: psycopg.Connection[object], pair: tuple[str, str], rows: int, span: int,
              repeats: int) -> tuple[float, float]:
    """ns a byte of one row's value, and the base's interquartile range relative to its median."""
    base, plus = alternating_runs(conn, pair, repeats)
    quartiles = statistics.quantiles(base, n=4)
    median = statistics.median(base)
    return (statistics.median(plus) - median) * 1e6 / rows / span, (quartiles[2] - quartiles[0]) / median


def measure(dsn: str, rows: int, short: int, long: int, repeats: int, collations: Sequence[str],
            pattern: str) -> list[tuple[str, str, float | str, float]]:
    """Per collation and statement: ns a byte (or the refusal) and the base's relative jitter; the
    calibration's under the name ``lower()``."""
    load_tables(dsn, rows)
    literal = "a" * long
    constructs = [Construct(c.name, c.sql.replace(LITERAL, literal)) for c in STATEMENTS]
    out: list[tuple[str, str, float | str, float]] = []
    for collation in collations:
        _values(dsn, collation, short, long, pattern)
        with tempfile.TemporaryDirectory(prefix="dpproxy-collation-cost-") as directory:
            # Planned as for a table with answer_quantum_ms, which lifts the work limit (the weights
            # measured here are what decides it) and leaves the backend SQL as it is.
            plans = plan_constructs(policy_file(dsn, Path(directory), quantum_ms=1, max_text_bytes=long), constructs)
        with measuring_session(dsn) as conn:
            calibration = (CALIBRATION.format(table="rc_base"), CALIBRATION.format(table="rc_plus"))
            out.append((collation, "lower()", *_per_byte(conn, calibration, rows, long - short, repeats)))
            for construct, plan in zip(constructs, plans):
                if isinstance(plan, str):
                    out.append((collation, construct.name, f"refused ({plan})", 0.0))
                else:
                    out.append((collation, construct.name, *_per_byte(conn, plan, rows, long - short, repeats)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=4_000)
    parser.add_argument("--short", type=int, default=8, help="bytes of each base row's value")
    parser.add_argument("--long", type=int, default=2_000, help="bytes of each neighbour row's value")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--collations", nargs="+", default=list(COLLATIONS))
    parser.add_argument("--pattern", choices=sorted(PATTERNS), default="run", help="the neighbour values' form")
    parser.add_argument("--dsn", help="a superuser DSN of a PostgreSQL with ICU (default: start one, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=15)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = on_server(args.dsn, args.pg, "collation-cost",
                        lambda dsn: measure(dsn, args.rows, args.short, args.long, args.repeats, args.collations,
                                                    args.pattern))
    print(f"{args.rows:,} rows of {args.short}-byte values against the same of {args.long:,}-byte ones (pattern {args.pattern}), "
          f"PostgreSQL {args.pg}; median of {args.repeats} alternating runs each; {time.monotonic() - started:.0f} s in all.\n")
    print("| collation | statement | ns a byte of a row | of lower()'s | in units (lower() = 51) | base's jitter |")
    print("|---|---|---:|---:|---:|---:|")
    calibration: dict[str, float] = {}
    for collation, name, per_byte, jitter in results:
        if isinstance(per_byte, str):
            print(f"| {collation} | {name} | {per_byte} | | | |")
            continue
        if name == "lower()":
            calibration[collation] = per_byte
        unit = calibration[collation]
        print(f"| {collation} | {name} | {per_byte:.3f} | {per_byte / unit:.2f} | {LOWER_UNITS * per_byte / unit:.1f} | "
              f"{100 * jitter:.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
