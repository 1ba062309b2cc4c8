"""pgbench through dpproxy in all three query modes, with a DP COUNT script.

-M simple inlines the variable into a Query; -M extended sends an unnamed Parse per
statement (keeping the script's trailing ``;``); -M prepared Parses ``P_0`` once and
re-Binds it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clients import require_tool
from conftest import TEST_DATABASE, RunningProxy

_SCRIPT = """\\set a random(20, 60)
SELECT COUNT(*) FROM adult WHERE age > :a AND sex = 'Female';
SELECT COUNT(*), SUM(hours_per_week) FROM adult WHERE age BETWEEN :a AND 90;
"""
_TRANSACTIONS = 5


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pgbench") / "dp_count.sql"
    path.write_text(_SCRIPT)
    return path


@pytest.mark.parametrize("mode", ["simple", "extended", "prepared"])
def test_pgbench_runs_a_dp_script_without_errors(mode: str, proxy: RunningProxy, script: Path):
    pgbench = require_tool("pgbench", "postgresql (pgbench comes with the server package)")
    env = {**os.environ, "PGPASSWORD": "analyst", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [pgbench, "-n", "-M", mode, "-f", str(script), "-t", str(_TRANSACTIONS), "-c", "2",
         "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", TEST_DATABASE],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"number of transactions actually processed: {2 * _TRANSACTIONS}/{2 * _TRANSACTIONS}" in result.stdout
    assert "number of failed transactions: 0 " in result.stdout
    assert "ERROR" not in result.stderr, result.stderr
