"""benchmarks/timing_fuzz.py's generator and shrinker against dpproxy's classifier, without timing:
the tool must keep drawing statements dpproxy answers, or its runs measure nothing."""

from __future__ import annotations

import random
from pathlib import Path

from benchmarks.row_cost import Construct, load_tables, plan_constructs, policy_file
from benchmarks.timing_fuzz import FORMS, draw_row, draw_statement, is_long_text, shrink_candidates


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
