"""Every statement through dpproxy leaves one JSON line in the audit log."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, make_policy


def test_audit_log_has_one_line_per_statement_with_decision_cost_and_no_values(test_db, tmp_path: Path):
    log = tmp_path / "audit.jsonl"
    text = TEST_POLICY.replace("users:\n", f'audit: {{{{path: "{log}"}}}}\nusers:\n')
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", text))
    try:
        with proxy.connect() as conn:
            (answer,) = conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchone()
            with pytest.raises(psycopg.Error):
                conn.execute("SELECT * FROM adult")
            conn.execute("SELECT 1")
    finally:
        proxy.stop()
    for _ in range(50):
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        if len(lines) >= 3:
            break
        time.sleep(0.1)
    dp, refused, passthrough = lines[-3:]
    assert dp["decision"] == "dp" and dp["epsilon"] == 1.0 and dp["remaining_epsilon"] == pytest.approx(999999.0)
    assert refused["decision"] == "refused" and refused["reason"] == "no-row-access" and refused["epsilon"] is None
    assert passthrough["decision"] == "passthrough"
    assert all(line["user"] == "analyst" and line["client"].startswith("127.0.0.1:") for line in lines)
    assert str(answer) not in log.read_text()  # answers never reach the audit log


def test_each_dp_line_names_the_mechanism_of_every_released_column_in_order(test_db, tmp_path: Path):
    # As the NOTICE does, and nothing else of the answer; the older fields keep their names.
    log = tmp_path / "audit.jsonl"
    text = (TEST_POLICY.replace("users:\n", f'audit: {{{{path: "{log}"}}}}\nusers:\n')
            .replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")
            .replace("sex: {{categories: [Male, Female]}}", "sex: {{categories: [Male, Female], group_by: true}}"))
    assert "group_by: true" in text and "repeats: {{enabled: true}}" in text
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", text))
    statements = {
        "SELECT COUNT(*), SUM(age), AVG(age) FROM adult WHERE age > 40": ["laplace", "laplace", "sum_count"],
        "SELECT MIN(age), AVG(hours_per_week) FROM adult WHERE age > 40": ["sample_aggregate", "sample_aggregate"],
        "SELECT MODE() WITHIN GROUP (ORDER BY sex) FROM adult": ["exponential"],
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM adult": ["quantile"],
        "SELECT stddev(age), var_pop(age) FROM adult": ["moments", "moments"],
        # the AVG read from the standard deviation's moments (proxy/dp/release_units.py)
        "SELECT AVG(age), stddev(age) FROM adult": ["moments", "moments"],
        "SELECT sex, AVG(age), var_pop(age) FROM adult GROUP BY sex": ["histogram_moments", "histogram_moments"],
        "SELECT sex, COUNT(*), AVG(age) FROM adult GROUP BY sex": ["histogram_laplace", "histogram_sum_count"],
    }
    try:
        with proxy.connect() as conn:
            for sql in statements:
                conn.execute(sql).fetchall()
            conn.execute(next(iter(statements))).fetchall()  # a repeat: the columns' mechanisms, uncharged
            conn.execute("SELECT 1")
    finally:
        proxy.stop()
    lines = [json.loads(line) for line in log.read_text().splitlines()][-len(statements) - 2:]
    assert [line["mechanisms"] for line in lines[:len(statements)]] == list(statements.values())
    assert all(line["decision"] == "dp" and line["epsilon"] == 1.0 for line in lines[:len(statements)])
    repeat, passthrough = lines[-2:]
    assert repeat["epsilon"] == 0.0 and repeat["mechanisms"] == ["laplace", "laplace", "sum_count"]
    assert passthrough["decision"] == "passthrough" and passthrough["mechanisms"] is None
    assert list(lines[0])[:12] == ["at", "user", "client", "fingerprint", "decision", "reason", "epsilon", "delta",
                                   "remaining_epsilon", "remaining_delta", "latency_ms", "rows"]
