"""What benchmarks/declared_apart.py measured of the candidate closures of the stored-apart lever for
values of a declared size, pinned on PostgreSQL itself (docs/threat-model.md, Timing, values of a
declared size stored apart): the premises the closure that keeps the index rests on, and dpproxy's
own backend SQL, which built it. Buffer counts and plans, never times."""

from __future__ import annotations

import psycopg
import pytest

from benchmarks.declared_apart import TYPES, extra_buffers, load, plans

_INDEXED = ("one =", "IN (64 values), hashed")
Measured = tuple[dict[tuple[str, str, str], int | None], dict[tuple[str, str, str], list[str]]]


@pytest.fixture(scope="module")
def measured(pg_admin_dsn: str) -> Measured:
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        load(conn, 20_000)
        return extra_buffers(conn), plans(conn)


def test_the_in_line_check_at_every_reference_reads_nothing_apart_and_no_index_serves_it(measured: Measured) -> None:
    buffers, planned = measured
    assert {key: extra for key, extra in buffers.items() if key[2] == "bounded" and extra != 0} == {}
    assert [key for key, nodes in planned.items() if key[2] == "bounded" and key[1] in _INDEXED
            and any("Index" in node for node in nodes)] == []


def test_one_hashed_raw_conjunct_beside_the_in_line_check_keeps_the_index_and_fetches_at_most_twice(measured: Measured) -> None:
    """Every term on the bounded value, and one top-level ``=``/IN also on the raw column as a
    hashed ``= ANY``: at most two fetches (4 buffers: the hash, and the equality when the hash
    matches, the value itself) whatever the terms, and a plain index serves ``=`` and IN."""
    buffers, planned = measured
    applied = {key: extra for key, extra in buffers.items() if key[2] == "one raw" and extra is not None}
    assert len(applied) == 4 * len(TYPES)
    assert {key: extra for key, extra in applied.items() if extra > 4} == {}
    assert max(applied.values()) == 4  # the value itself: its hash matches, the equality fetches again
    assert [key for key, nodes in planned.items() if key[2] in ("raw", "one raw") and key[1] in _INDEXED
            and not any("Index" in node for node in nodes)] == []


def test_raw_equality_multiplies_when_or_ed_and_a_guard_before_each_term_multiplies_at_the_top_level(measured: Measured) -> None:
    """Why the other candidates fail: OR'ed ``=`` and short IN lists fetch the value once a value
    (``texteq`` reads a value of the literal's size, ``bpchareq`` and ``numeric_eq`` every one), and
    ``(<in the row> AND term)`` keeps its order under OR but not at the top level, where PostgreSQL
    orders the conjuncts by cost and the raw term, cheaper than the check, runs first."""
    buffers, _ = measured
    for column_type in TYPES:
        assert buffers[column_type, "64 OR'ed =", "raw"] == 128
        assert buffers[column_type, "16 OR'ed IN (8 values)", "raw"] == 256
        assert buffers[column_type, "64 OR'ed =", "guarded"] == 0
        assert buffers[column_type, "64 AND'ed <>", "guarded"] == 128


def test_dpproxys_backend_sql_fetches_a_value_apart_at_most_twice_and_keeps_the_index(measured: Measured) -> None:
    """The rewriter's SQL for the same statements (the ``dpproxy`` form): within two fetches (+4, the
    value itself, whose hash matches) whatever the terms, nothing under OR or for ``<>``, and a plain
    index serves a selective ``=`` and IN, planned with index-only scans off, as dpproxy's backend
    connections plan (an Index Scan or a Bitmap scan, which fetch the row)."""
    buffers, planned = measured
    applied = {key: extra for key, extra in buffers.items() if key[2] == "dpproxy" and extra is not None}
    assert len(applied) == 8 * len(TYPES)
    assert {key: extra for key, extra in applied.items() if extra > 4} == {}
    assert {key: extra for key, extra in applied.items() if "OR'ed" in key[1] or "<>" in key[1]} == {
        key: 0 for key in applied if "OR'ed" in key[1] or "<>" in key[1]}
    assert [key for key, nodes in planned.items() if key[2] == "dpproxy" and key[1] in _INDEXED
            and not any(node.startswith(("Index Scan", "Bitmap Index Scan")) for node in nodes)] == []
