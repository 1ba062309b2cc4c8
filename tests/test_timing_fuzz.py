"""benchmarks/timing_fuzz.py's generator and shrinker against dpproxy's classifier, without timing:
the tool must keep drawing statements dpproxy answers, or its runs measure nothing."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import psycopg

from benchmarks.row_cost import Construct, load_tables, plan_constructs, policy_file
from benchmarks.timing_fuzz import (FORMS, WIDE_NUMERICS, Fuzzer, Statement, buffers_confirmed, draw_row,
                                    draw_statement, is_long_text, shrink_candidates)
from benchmarks.view_shapes import SHAPES
from rewriter.text_bounds import NUMERIC_MAX_BYTES
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
    fuzzer, verdicts = Fuzzer.with_views(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1, tmp_path)
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
    refused = [(s.sql, plan) for (s, _), plan in zip(over_views, plans) if isinstance(plan, str)]
    assert len(refused) <= len(over_views) // 10, refused


def test_timing_fuzz_confirms_by_its_buffers_a_view_column_computed_from_a_value_stored_apart_forced_past_the_load_check(
        pg_admin_dsn: str, tmp_path: Path) -> None:
    """The lever dpproxy's load check closes (docs/threat-model.md, "A protected view's column is the
    stored value"), forced through: over a view of ``btrim(t)`` each term of an OR recomputes the
    column, fetching a value a wide row stored apart again, which the fuzzer confirms by its
    buffers; over a view passing ``t`` on, the same row is no finding. This fails the day the
    fuzzer stops seeing a view's recomputed column, or the load check stops refusing it."""
    load_tables(pg_admin_dsn, 20)
    shapes = [shape for shape in SHAPES if shape.name in ("plain", "btrim")]
    fuzzer, verdicts = Fuzzer.with_views(pg_admin_dsn, policy_file(pg_admin_dsn, tmp_path), 20, 1, tmp_path, shapes,
                                         unchecked=True)
    assert verdicts["plain"] is None and verdicts["btrim"] is not None, verdicts
    statement = Statement(("COUNT(*)",), ("(" + " OR ".join(f"t > 'z{i}'" for i in range(16)) + ")",), relation="btrim")
    row = draw_row(random.Random(5), statement, ("apart",), fuzzer.shapes["btrim"])
    assert row == {"t": LONG_TEXT, "pad": PAD}
    proofs = fuzzer.confirmed(statement, row)
    assert proofs is not None and all(buffers_confirmed(proof) for proof in proofs), proofs
    assert fuzzer.confirmed(replace(statement, relation="plain"), row) is None
    jsonb = next(shape for shape in SHAPES if shape.name == "jsonb_text")  # a text form as a jsonb value: stored
    assert all(fuzzer.fits(draw_row(random.Random(i), Statement(("COUNT(tx)",), relation=jsonb.name), (form,), jsonb))
               for i, form in enumerate(FORMS))
