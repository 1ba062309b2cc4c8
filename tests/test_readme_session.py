"""The README's psql session is reproducible: examples/session.sql run by psql through dpproxy
with the demo policy prints the README's statements, notices and errors, in order."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import TEST_DATABASE, RunningProxy, TestDatabase, psql_path

from proxy.demo.load import load_demo

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "demo=> "
MESSAGES = ("NOTICE:", "ERROR:", "HINT:")


def _readme_session() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## A psql session", 1)[1].split("```", 2)[1]
    return block.splitlines()


# AVG's noisy sum / noisy count states its noise from the released noisy count, so those two
# figures differ from run to run (in the fourth significant digit on the demo's 16,000 rows).
_FROM_NOISY_COUNT = re.compile(r"(noisy sum / noisy count, scale )[0-9.e+-]+( \(95% within ±)[0-9.e+-]+\)")


def _matches(expected: str, actual: str) -> bool:
    expected, actual = (_FROM_NOISY_COUNT.sub(r"\1<n>\2<n>)", line) for line in (expected, actual))
    if expected.endswith("..."):  # the README shortens some repeated hints
        return actual.startswith(expected.removesuffix("..."))
    return actual == expected


def test_session_sql_holds_the_readme_statements():
    statements = [line.removeprefix(PROMPT) for line in _readme_session() if line.startswith(PROMPT)]
    script = [line for line in (ROOT / "examples" / "session.sql").read_text().splitlines()
              if line and not line.startswith("--")]
    assert script == statements


def test_readme_session_reproduces_through_dpproxy_with_the_demo_policy(
    pg_admin_dsn: str, test_db: TestDatabase, tmp_path: Path
):
    policy = load_demo(pg_admin_dsn, tmp_path / "policy.yaml", database=TEST_DATABASE, port=0,
                       ledger=tmp_path / "fresh-ledger.sqlite3")
    proxy = RunningProxy(policy)
    try:
        result = subprocess.run(
            [psql_path(), "-X", "-e", f"host={proxy.host} port={proxy.port} dbname={TEST_DATABASE} user=analyst",
             "-f", str(ROOT / "examples" / "session.sql")],
            capture_output=True, text=True, env={**os.environ, "PGPASSWORD": "analyst"}, timeout=120,
        )
    finally:
        proxy.stop()
    assert result.returncode == 0, result.stderr

    expected = [line for line in _readme_session() if line.startswith(MESSAGES)]
    printed = [re.sub(r"^psql:[^:]*:\d+: ", "", line) for line in result.stderr.splitlines()]
    printed = [line for line in printed if line.startswith(MESSAGES)]
    assert len(printed) == len(expected), result.stderr
    for want, got in zip(expected, printed):
        assert _matches(want, got), f"README: {want}\npsql:   {got}"
