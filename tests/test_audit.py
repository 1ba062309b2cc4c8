"""The audit log: one parseable JSON line per statement, with exactly the documented fields."""

from __future__ import annotations

import json
import logging
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from policies.loader import PolicyError, parse_policy
from proxy.ops.audit import AuditEntry, AuditLog, fingerprint

FIELDS = [
    "at", "user", "client", "fingerprint", "decision", "reason",
    "epsilon", "delta", "remaining_epsilon", "remaining_delta", "latency_ms", "rows", "mechanisms",
]

MINIMAL_POLICY = """
backend: {dsn: "postgresql://nowhere/db"}
users:
  analyst: {password: x, budget: {epsilon: 10}}
tables: {}
"""


def _entry(**changes: Any) -> AuditEntry:
    fields: dict[str, Any] = dict(
        at=datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc).timestamp(),
        user="analyst",
        client="127.0.0.1:51234",
        fingerprint=fingerprint("SELECT COUNT(*) FROM adult"),
        decision="dp",
        reason=None,
        epsilon=1.0,
        delta=0.0,
        remaining_epsilon=999.0,
        remaining_delta=0.5,
        latency_ms=12.40219,
    )
    fields.update(changes)
    return AuditEntry(**fields)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_file_gets_one_json_line_per_entry_with_every_field_in_order(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.record(_entry())
    audit.record(_entry(decision="refused", reason="no-row-access", epsilon=None, delta=None,
                        remaining_epsilon=None, remaining_delta=None))
    audit.close()

    first, second = _lines(path)
    assert list(first) == FIELDS
    assert first == {
        "at": "2024-05-01T12:00:00.123Z", "user": "analyst", "client": "127.0.0.1:51234",
        "fingerprint": fingerprint("SELECT COUNT(*) FROM adult"), "decision": "dp", "reason": None,
        "epsilon": 1.0, "delta": 0.0, "remaining_epsilon": 999.0, "remaining_delta": 0.5,
        "latency_ms": 12.402, "rows": None, "mechanisms": None,
    }
    assert second["decision"] == "refused" and second["reason"] == "no-row-access"
    assert second["epsilon"] is None and second["remaining_delta"] is None


def test_a_file_is_appended_to_not_truncated(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"earlier": true}\n', encoding="utf-8")
    for user in ("a", "b"):
        audit = AuditLog(path)
        audit.record(_entry(user=user))
        audit.close()
    assert [line.get("user") for line in _lines(path)] == [None, "a", "b"]


def test_reopen_writes_to_a_new_file_after_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    audit.record(_entry(user="before"))
    audit.close()  # drains the queue so the rename below happens after the write
    audit = AuditLog(path)
    audit.record(_entry(user="kept"))
    path.rename(tmp_path / "audit.jsonl.1")
    audit.reopen()
    audit.record(_entry(user="after"))
    audit.close()
    assert [line["user"] for line in _lines(tmp_path / "audit.jsonl.1")] == ["before", "kept"]
    assert [line["user"] for line in _lines(path)] == ["after"]


def test_a_failed_reopen_keeps_writing_to_the_old_file_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    audit = AuditLog(directory / "audit.jsonl")
    audit.record(_entry(user="before"))
    (directory / "audit.jsonl").rename(tmp_path / "rotated.jsonl")
    directory.rmdir()  # the path can no longer be opened
    with caplog.at_level(logging.ERROR, logger="dpproxy"):
        audit.reopen()
        audit.record(_entry(user="after"))
        audit.close()
    assert [line["user"] for line in _lines(tmp_path / "rotated.jsonl")] == ["before", "after"]
    assert any("audit log" in record.getMessage() for record in caplog.records)


def test_an_unusable_path_fails_at_startup(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        AuditLog(tmp_path / "missing-dir" / "audit.jsonl")


def test_without_a_path_lines_go_to_the_dpproxy_audit_logger(caplog: pytest.LogCaptureFixture) -> None:
    audit = AuditLog.from_config(parse_policy(MINIMAL_POLICY).audit)
    with caplog.at_level(logging.INFO, logger="dpproxy.audit"):
        audit.record(_entry(decision="passthrough", epsilon=None, delta=None,
                            remaining_epsilon=None, remaining_delta=None))
    (record,) = [r for r in caplog.records if r.name == "dpproxy.audit"]
    assert record.levelno == logging.INFO
    assert json.loads(record.getMessage())["decision"] == "passthrough"


def test_the_policy_audit_path_selects_a_file(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    policy = parse_policy(MINIMAL_POLICY + f"audit: {{path: {json.dumps(str(path))}}}\n")
    audit = AuditLog.from_config(policy.audit)
    audit.record(_entry())
    audit.close()
    assert len(_lines(path)) == 1


def test_the_policy_rejects_an_empty_audit_path() -> None:
    with pytest.raises(PolicyError, match="audit.path"):
        parse_policy(MINIMAL_POLICY + 'audit: {path: ""}\n')


def test_an_infinite_remaining_budget_is_written_as_null_so_the_line_stays_json(tmp_path: Path) -> None:
    line = _entry(remaining_epsilon=math.inf).to_json()
    assert json.loads(line)["remaining_epsilon"] is None
    assert "Infinity" not in line


def test_an_unknown_decision_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown audit decision"):
        _entry(decision="allowed")


def test_an_entry_has_no_field_that_could_carry_a_result_or_the_statement_text() -> None:
    line = _entry().to_json()
    assert list(json.loads(line)) == FIELDS
    assert "adult" not in line and "COUNT" not in line


@pytest.mark.parametrize(
    "variant",
    [
        "SELECT COUNT(*) FROM adult WHERE age > 40",
        "select count(*) from adult where age > 40",
        "SELECT  COUNT( * )\n\tFROM Adult\nWHERE age>40;",
        "SELECT COUNT(*) -- how many\nFROM adult /* older */ WHERE age > 40 ;;",
    ],
)
def test_fingerprint_ignores_whitespace_case_comments_and_trailing_semicolons(variant: str) -> None:
    assert fingerprint(variant) == fingerprint("SELECT COUNT(*) FROM adult WHERE age > 40")


@pytest.mark.parametrize(
    "other",
    [
        "SELECT COUNT(*) FROM adult WHERE age > 41",
        "SELECT COUNT(*) FROM adult WHERE age >= 40",
        "SELECT SUM(age) FROM adult WHERE age > 40",
        'SELECT COUNT(*) FROM "Adult" WHERE age > 40',
        "SELECT COUNT(*) FROM adult WHERE name = 'a  b'",
    ],
)
def test_fingerprint_differs_for_different_statements_and_literals(other: str) -> None:
    assert fingerprint(other) != fingerprint("SELECT COUNT(*) FROM adult WHERE age > 40")


def test_fingerprint_keeps_whitespace_inside_string_literals() -> None:
    assert fingerprint("SELECT 'a  b'") != fingerprint("SELECT 'a b'")
    assert fingerprint("SELECT $$a  b$$") != fingerprint("SELECT $$a b$$")


def test_fingerprint_of_unscannable_text_is_stable_across_whitespace() -> None:
    assert fingerprint("SELECT 'unterminated") == fingerprint("SELECT   'unterminated")
    assert len(fingerprint("SELECT 'unterminated")) == 16
