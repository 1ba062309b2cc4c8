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
