"""benchmarks/timing_fuzz.py's generator and shrinker against dpproxy's classifier, without timing:
the tool must keep drawing statements dpproxy answers, or its runs measure nothing."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest

from benchmarks.row_cost import Construct, load_tables, measure_constructs, measuring_session, plan_constructs, policy_file
from benchmarks.table_shapes import READER, TABLE_SHAPES
from benchmarks.timing_fuzz import (FORMS, WIDE_NUMERICS, Fuzzer, Statement, read_columns, buffers_confirmed, draw_row,
                                    draw_statement, is_long_text, shrink_candidates)
from benchmarks.view_shapes import SHAPES, ViewShape
from rewriter.text_bounds import NUMERIC_MAX_BYTES
from proxy.backend.pool import PINNED_SETTINGS
from tests.conftest import TestDatabase
from tests.post_charge_wait import LONG_NUMBER, LONG_NUMBER_BYTES, LONG_TEXT, PAD


def test_timing_fuzz_draws_statements_dpproxy_answers_and_shrinks_them_to_answered_ones(pg_admin_dsn: str, tmp_path: Path) -> None:
    load_tables(pg_admin_dsn, 20)
    policy = policy_file(pg_admin_dsn, tmp_path)
    rng = random.Random(7)
    statements = [draw_statement(rng) for _ in range(200)]
    plans = plan_constructs(policy, [Construct(str(i), s.sql) for i, s in enumerate(statements)])
    refused = [(s.sql, plan) for s, plan in zip(statements, plans) if isinstance(plan, str)]
    assert len(refused) <= 20, refused
    accepted = [s for s, plan in zip(statements, plans) if not isinstance(plan, str)]
    pairs = [(small, small_row) for s in accepted[:40] for small, small_row in shrink_candidates(s, draw_row(rng, s))]
    assert len(pairs) > 40
    plans = plan_constructs(policy, [Construct(str(i), s.sql, row) for i, (s, row) in enumerate(pairs)])
    assert [(s.sql, plan) for (s, _), plan in zip(pairs, plans) if isinstance(plan, str)] == []


def test_timing_fuzz_rows_draw_every_value_form_and_shrink_long_text_to_shorter_text() -> None:
    rng = random.Random(3)
    statement = draw_statement(rng)
    for form in FORMS:
        for _ in range(20):
            draw_row(rng, statement, (form,))  # each form either fits a column or leaves the row ordinary
    long_row = {"t": "repeat('ab', 50000)"}
    assert is_long_text(long_row) and not is_long_text({"t": "repeat('ab', 32)"})
    shorter = [row for _, row in shrink_candidates(statement, long_row) if row != long_row]
    assert shorter[-1] == {"t": "repeat('ab', 25000)"}


def test_timing_fuzz_stores_this_stops_value_forms_as_they_are_meant_and_confirms_no_apart_value(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """The wide numerics land out of line (random digits) and compressed in the row (repeated ones),
    the values at and past the bound in the row, the apart ones in the TOAST relation; and a statement
    whose IN list compares a value stored apart is no finding: the value reads as NULL, unfetched
    (it was confirmed by its buffers before, each comparison fetching it again: two hits each)."""
    load_tables(pg_admin_dsn, 20)
    storage = {}
    with psycopg.connect(pg_admin_dsn, autocommit=True) as conn:
        for index, value in enumerate((*WIDE_NUMERICS, LONG_NUMBER)):
            pad = PAD if value == LONG_NUMBER else "NULL"
            conn.execute(f"INSERT INTO rc_plus (id, nx, n, pad) SELECT {-1 - index}, {value}, {value}, {pad}")
        for column in ("n", "nx"):
            storage[column] = conn.execute(
                f"SELECT pg_column_size({column}), pg_column_compression({column}) IS NOT NULL FROM rc_plus "
                "WHERE id < 0 ORDER BY id DESC").fetchall()
        conn.execute("DELETE FROM rc_plus WHERE id < 0")
    random_wide, compressible, at_bound, past_bound, apart = storage["n"]
    assert random_wide[0] > 60_000 and not random_wide[1]  # out of line, whole
    assert compressible[0] < 2_000 and compressible[1]  # compressed in the row
    assert at_bound[0] <= NUMERIC_MAX_BYTES < past_bound[0] and not at_bound[1] and not past_bound[1]
    assert NUMERIC_MAX_BYTES < apart[0] <= LONG_NUMBER_BYTES and not apart[1]
    assert storage["nx"][1][1] is False  # STORAGE EXTERNAL: moved out, never compressed
    rng = random.Random(5)
    statement = Statement(("COUNT(*)",), ("nx IN (1, 2, 3, 4)",))
    assert "pad" in draw_row(rng, statement, ("apart",))
    fuzzer = Fuzzer(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1)
    # a value stored apart reads as NULL since the check of its placement (rewriter/text_bounds.py)
    assert fuzzer.confirmed(statement, {"nx": LONG_NUMBER, "pad": PAD}) is None
    assert fuzzer.confirmed(statement, {"nx": "repeat('9', 1024)::numeric"}) is None  # past the bound: unread


def test_timing_fuzz_no_longer_confirms_a_value_of_a_declared_size_stored_apart(pg_admin_dsn: str, tmp_path: Path) -> None:
    """The lever docs/threat-model.md left open (Timing, values of a declared size): a ``numeric(1000,
    0)`` (``nd``) was read as it is, so a value a wide row stored apart was fetched again (2 buffer
    hits) by each of an IN list's values, which the fuzzer confirmed by its buffers. It is read
    through its in-line check now (stored apart, it reads as NULL), and the IN list, at the top
    level, compares the raw column once more only as one hashed ``= ANY``: one fetch, no finding."""
    load_tables(pg_admin_dsn, 20)
    statement = Statement(("COUNT(*)",), ("nd IN (" + ", ".join(str(1000 + i) for i in range(16)) + ")",))
    row = draw_row(random.Random(5), statement, ("apart",))
    assert row == {"nd": LONG_NUMBER, "pad": PAD}
    fuzzer = Fuzzer(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1)
    assert fuzzer.confirmed(statement, row) is None
    or_ed = Statement(("COUNT(*)",), ("(" + " OR ".join(f"nd < {i}" for i in range(-16, 0)) + ")",))
    assert fuzzer.confirmed(or_ed, row) is None


def test_timing_fuzz_draws_statements_dpproxy_answers_over_the_views_its_load_check_accepts(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """The view catalogue as a drawn relation: dpproxy's own load check keeps or refuses each shape
    (a refusal recorded with its text), and statements are drawn over the accepted ones only, with
    rows that vary the base columns the views read; dpproxy answers them."""
    load_tables(pg_admin_dsn, 20)
    fuzzer, verdicts = Fuzzer.with_views(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1, tmp_path, SHAPES)
    assert set(verdicts) == {shape.name for shape in SHAPES}
    accepted = {name for name, refusal in verdicts.items() if refusal is None}
    assert {"plain", "renamed", "collate", "case_result", "where_fixed", "self_join", "barrier", "bytea_length",
            "text_size", "where_nullif_null", "where_coalesce_equality"} <= accepted, verdicts
    assert "computes its column t from a value of a type of any length" in (verdicts["btrim"] or ""), verdicts
    assert "reads t (text) whole in a WHERE or JOIN condition" in (verdicts["where_text"] or ""), verdicts
    assert "can fail on some row's values" in (verdicts["integer_plus"] or ""), verdicts
    assert set(fuzzer.shapes) == accepted
    rng = random.Random(11)
    pairs = [fuzzer.draw(rng, tuple(FORMS)) for _ in range(80)]
    over_views = [(s, row) for s, row in pairs if s.relation]
    assert len(over_views) >= 20 and len({s.relation for s, _ in over_views}) >= 8, [s.relation for s, _ in pairs]
    assert {s.relation for s, _ in over_views} <= accepted
    for s, row in over_views:  # the row varies what the view computes, where it computes anything
        shape = fuzzer.shapes[s.relation]
        assert not shape.outputs or any(base in row for c in shape.outputs for base in shape.base_columns(c)), (s.sql, row)
    plans = plan_constructs(fuzzer.policy_path, [Construct(str(i), s.sql, row) for i, (s, row) in enumerate(over_views)])
    outcomes = [(s, plan) for (s, _), plan in zip(over_views, plans) if isinstance(plan, str)]
    refused = [(s.sql, plan) for s, plan in outcomes]
    # A view with a computed column is no simple view of its table (proxy/backend/view_rows.py):
    # its statements that sort rows are refused (rule sort-memory), whatever the draw.
    unbounded = [s for s, plan in outcomes if "rule sort-memory" in plan]
    assert all(fuzzer.shapes[s.relation].outputs for s in unbounded), [s.sql for s in unbounded]
    assert len(refused) - len(unbounded) <= len(over_views) // 10, refused


def _confirmed_forced_past_the_check(dsn: str, tmp_path: Path, shapes: list[ViewShape], recomputed: str, kept: str,
                                     source: str) -> Fuzzer:
    """Over ``recomputed`` (a shape whose ``t`` is computed again at each reference, refused by
    the load check and forced past it), 16 OR-ed terms on ``t`` with a row whose ``source`` a wide
    row stored apart: confirmed by its buffers; over ``kept`` (accepted) the same row is no
    finding. The fuzzer, over both."""
    load_tables(dsn, 20)
    fuzzer, verdicts = Fuzzer.with_views(dsn, policy_file(dsn, tmp_path), 20, 1, tmp_path, shapes, unchecked=True)
    assert verdicts[kept] is None and verdicts[recomputed] is not None, verdicts
    statement = Statement(("COUNT(*)",), ("(" + " OR ".join(f"t > 'z{i}'" for i in range(16)) + ")",), relation=recomputed)
    row = draw_row(random.Random(5), statement, ("apart",), fuzzer.shapes[recomputed])
    assert row == {source: LONG_TEXT, "pad": PAD}
    proofs = fuzzer.confirmed(statement, row)
    assert proofs is not None and all(buffers_confirmed(proof) for proof in proofs), proofs
    assert fuzzer.confirmed(replace(statement, relation=kept), row) is None
    return fuzzer


def test_timing_fuzz_confirms_by_its_buffers_a_view_column_computed_from_a_value_stored_apart_forced_past_the_load_check(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """The lever dpproxy's load check closes (docs/threat-model.md, "A protected view's column is the
    stored value"), forced through: over a view of ``btrim(t)`` each term of an OR recomputes the
    column, fetching a value a wide row stored apart again, which the fuzzer confirms by its
    buffers; over a view passing ``t`` on, the same row is no finding. This fails the day the
    fuzzer stops seeing a view's recomputed column, or the load check stops refusing it."""
    shapes = [shape for shape in SHAPES if shape.name in ("plain", "btrim")]
    fuzzer = _confirmed_forced_past_the_check(pg_admin_dsn, tmp_path, shapes, "btrim", "plain", "t")
    jsonb = next(shape for shape in SHAPES if shape.name == "jsonb_text")  # a text form as a jsonb value: stored
    assert all(fuzzer.fits(draw_row(random.Random(i), Statement(("COUNT(tx)",), relation=jsonb.name), (form,), jsonb))
               for i, form in enumerate(FORMS))


def test_timing_fuzz_sets_the_neighbours_row_on_all_visible_pages_so_the_page_it_lands_on_is_no_finding(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """The last stop's unexplained confirmation: over the self-join on the key, ``percentile_cont(0.5)
    … WHERE t LIKE '%table'`` read 22 buffers more with a NULL ``t`` than with the ordinary row,
    though neither matches. It was the measurement: under the fuzzer's servers' ``synchronous_commit
    = off``, the VACUUM right after the row's INSERT left the visibility-map bit of the page it went
    to clear, so the view's index-only probe fetched the heap for each base row of that page (every
    one matches), and a short row (NULL ``t``) goes to a gap in an early page of 28 rows where the
    ordinary one goes to the last page, of 6. Both tables are now written with their commits
    flushed: every page all-visible, and the row's page no finding by its buffers."""
    database = "timing_fuzz_asynchronous_commit"
    with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {database}")
        admin.execute(f"CREATE DATABASE {database}")
        admin.execute(f"ALTER DATABASE {database} SET synchronous_commit = off")  # as tests/pg15.py's servers
    try:
        dsn = psycopg.conninfo.make_conninfo(pg_admin_dsn, dbname=database)
        load_tables(dsn, 2_000)
        shapes = [shape for shape in SHAPES if shape.name == "self_join"]
        fuzzer, verdicts = Fuzzer.with_views(dsn, policy_file(dsn, tmp_path), 2_000, 1, tmp_path, shapes)
        assert verdicts == {"self_join": None}
        statement = Statement(("percentile_cont(0.5) WITHIN GROUP (ORDER BY f)",), ("t LIKE '%table'",), relation="self_join")
        proofs = fuzzer.confirmed(statement, {"t": "NULL"})
        assert proofs is None or not all(buffers_confirmed(proof) for proof in proofs), [p.summary for p in proofs]
        with psycopg.connect(dsn) as conn:
            pages = conn.execute("SELECT relname, relpages, relallvisible FROM pg_class WHERE relname IN "
                                 "('rc_base', 'rc_plus') ORDER BY relname").fetchall()
        assert all(visible == total for _, total, visible in pages), pages
    finally:
        with psycopg.connect(pg_admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def _over_table_shapes(dsn: str, tmp_path: Path, major: int) -> None:
    """The table shapes on a server of ``major``: dpproxy's load check keeps the policies and
    generated columns it can show bounded and total and refuses the rest with their reasons;
    statements are drawn over the kept ones, dpproxy answers them, their rows vary the columns a
    policy reads and those a generated column is computed from, and the neighbour's row is
    written to the copy a statement reads, its generated columns computed."""
    load_tables(dsn, 20)
    fuzzer, verdicts = Fuzzer.with_views(dsn, policy_file(dsn, tmp_path), 20, 1, tmp_path, TABLE_SHAPES)
    assert set(verdicts) == {shape.name for shape in TABLE_SHAPES if shape.least_major <= major}
    refused = {name for name, refusal in verdicts.items() if refusal is not None}
    assert refused == {"rls_text_order", "rls_arithmetic", "rls_subquery", "rls_wide_numeric"} | (
        {"virtual_btrim", "virtual_arithmetic"} if major >= 18 else set()), verdicts
    assert "row-level security policy p0 on rcv_rls_text_order_rc_base reads t (text) whole" in (verdicts["rls_text_order"] or "")
    assert "calls int4pl(integer, integer), which can fail" in (verdicts["rls_arithmetic"] or "")
    rng = random.Random(13)
    pairs = [fuzzer.draw(rng, tuple(FORMS)) for _ in range(48)]
    over = [(s, row) for s, row in pairs if s.relation]
    assert {s.relation for s, _ in over} <= set(verdicts) - refused and len({s.relation for s, _ in over}) >= 8
    shapes = {shape.name: shape for shape in TABLE_SHAPES}
    assert any(set(row) - set(read_columns(s)) & set(shapes[s.relation].varied) for s, row in over), over
    assert all(not shapes[s.relation].generated or set(row) & {b for c in shapes[s.relation].generated
                                                              for b in shapes[s.relation].base_columns(c)} for s, row in over)
    measured = fuzzer.measure(over, 1)
    assert sum(item.refused is not None for item in measured) <= len(over) // 10, [m.refused for m in measured]
    statement = Statement(("COUNT(t)",), relation="stored_btrim")
    fuzzer.measure([(statement, {"tx": "'  padded  '"})], 1)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT t FROM rcv_stored_btrim_rc_plus WHERE id = 0").fetchone() == ("padded",)


def test_timing_fuzz_draws_over_tables_with_policies_and_stored_generated_columns_as_the_load_check_judges_them(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    _over_table_shapes(pg_admin_dsn, tmp_path, 16)


def test_timing_fuzz_draws_over_virtual_generated_columns_on_postgresql_18(pg18_db: TestDatabase, tmp_path: Path) -> None:
    """PostgreSQL 18's virtual generated columns besides: a total one computed from fixed-length
    columns kept, one from a value of any length and one that can overflow refused."""
    _over_table_shapes(pg18_db.admin_dsn, tmp_path, 18)


def test_timing_fuzz_measures_a_statement_over_a_table_with_policies_as_a_role_they_apply_to(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """A policy applies to neither a superuser nor the table's owner: a statement over a shape with
    policies is measured as the reader role, which may read the shapes' tables and nothing else."""
    load_tables(pg_admin_dsn, 20)
    policy = policy_file(pg_admin_dsn, tmp_path)
    shapes = [shape for shape in TABLE_SHAPES if shape.name == "rls_boolean"]
    fuzzer, _ = Fuzzer.with_views(pg_admin_dsn, policy, 20, 1, tmp_path, shapes)
    statement = Statement(("COUNT(*)",), relation="rls_boolean")
    assert fuzzer.measure([(statement, {"b": "false"})], 1)[0].refused is None
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the role is the reader's, not the superuser's
        list(measure_constructs(pg_admin_dsn, policy, [Construct("rc_base", "SELECT COUNT(*) FROM {table}", role=READER)], 20, 1))


def test_row_cost_measures_in_a_session_set_as_dpproxys_backend_sessions_are(pg_admin_dsn: str) -> None:
    """dpproxy's backend sessions plan without index-only scans (``PINNED_SETTINGS``): measured with
    them, the self-join view's probe fetched the heap only on pages the visibility map did not
    cover, a cost dpproxy's own plans never pay that way."""
    with measuring_session(pg_admin_dsn) as conn:
        for name, value in PINNED_SETTINGS.items():
            assert conn.execute("SELECT current_setting(%s)", [name]).fetchone() == (value,), name
        assert conn.execute("SHOW enable_indexonlyscan").fetchone() == ("off",)


def test_timing_fuzz_confirms_by_its_buffers_a_virtual_generated_column_forced_past_the_load_check(
        pg18_db: TestDatabase, tmp_path: Path) -> None:
    """The fuzzer sees over a table what it sees over a view: PostgreSQL 18 computes a virtual
    generated column ``btrim(tx)`` again at each reference, fetching a value a wide row stored
    apart again for each term of an OR, which the fuzzer confirms by its buffers once the load
    check's refusal is bypassed; the same column STORED is read as stored (a value stored apart
    reads as NULL) and is no finding. This fails the day the fuzzer stops seeing a table's
    computed column, or the load check stops refusing it."""
    shapes = [shape for shape in TABLE_SHAPES if shape.name in ("virtual_btrim", "stored_btrim")]
    _confirmed_forced_past_the_check(pg18_db.admin_dsn, tmp_path, shapes, "virtual_btrim", "stored_btrim", "tx")


def test_timing_fuzz_records_a_run_that_fails_on_the_row_forced_past_the_load_check(pg_admin_dsn: str, tmp_path: Path) -> None:
    """A policy's ``age + 1`` overflows on the row ``age = 2147483647``: the load check refuses the
    table for it; forced past the check, the fuzzer records the failure (an error oracle: what the
    check closes) where it used to stop the whole run with the backend's error."""
    load_tables(pg_admin_dsn, 20)
    shapes = [shape for shape in TABLE_SHAPES if shape.name == "rls_arithmetic"]
    fuzzer, verdicts = Fuzzer.with_views(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1, tmp_path, shapes,
                                         unchecked=True)
    assert "can fail on some row's values" in (verdicts["rls_arithmetic"] or ""), verdicts
    statement = Statement(("COUNT(*)",), relation="rls_arithmetic")
    failed, ordinary = fuzzer.measure([(statement, {"age": "2147483647"}), (statement, {})], 1)
    assert (failed.failed or "").startswith("22003"), failed
    assert ordinary.failed is None and ordinary.refused is None, ordinary
    assert fuzzer.confirmed(statement, {"age": "2147483647"}) is None
