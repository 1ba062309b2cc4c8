"""pgcli (a real client, from PyPI) against dpproxy: its completion catalog queries, \\dt, a DP count.

The catalog queries pgcli runs in a background thread after connecting (schemata, tables,
columns, foreign keys, views, types, databases, functions) are run here through pgcli's own
refreshers, since the thread only starts in an interactive terminal; the commands run through
the ``pgcli -c`` command line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RunningProxy

from pgcli.completion_refresher import CompletionRefresher  # noqa: E402
from pgcli.pgcompleter import PGCompleter  # noqa: E402
from pgcli.pgexecute import PGExecute  # noqa: E402
from pgspecial.main import PGSpecial  # noqa: E402


def test_pgcli_completion_catalog_queries_all_pass(proxy: RunningProxy):
    executor = PGExecute("dpproxy_test", "analyst", "analyst", proxy.host, proxy.port)
    completer = PGCompleter(smart_completion=True, pgspecial=PGSpecial(), settings={})
    failed = {}
    try:
        for name, refresh in CompletionRefresher.refreshers.items():
            try:
                refresh(completer, executor)
            except Exception as exc:  # every failure is collected, then reported together
                failed[name] = f"{type(exc).__name__}: {exc}"
    finally:
        executor.conn.close()
    assert failed == {}
    tables = completer.dbmetadata["tables"]["public"]
    assert {"adult", "lookup"} <= set(tables) and {"workclass", "education"} <= set(tables["adult"])


def _pgcli(proxy: RunningProxy, home: Path, *commands: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSWORD": "analyst", "HOME": str(home), "XDG_CONFIG_HOME": str(home),
           "PGCONNECT_TIMEOUT": "10", "TERM": "dumb"}
    command = [os.path.join(os.path.dirname(sys.executable), "pgcli"), "-h", proxy.host, "-p", str(proxy.port),
               "-U", "analyst", "-d", "dpproxy_test", "--less-chatty"]
    for item in commands:
        command += ["-c", item]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)


def test_pgcli_lists_tables_and_shows_a_noised_count_under_its_alias(proxy: RunningProxy, tmp_path: Path):
    result = _pgcli(proxy, tmp_path, r"\dt", "SELECT count(*) AS n FROM adult WHERE age > 30")
    assert result.returncode == 0, result.stderr
    assert "| public | adult " in result.stdout and "| public | lookup " in result.stdout
    lines = result.stdout.splitlines()
    header = lines.index("| n     |")
    assert int(lines[header + 2].strip("| ")) > 30000  # the noised count, under the column n
    assert "dpproxy: ε charged 1" in result.stdout


def test_pgcli_dt_plus_shows_no_size(proxy: RunningProxy, tmp_path: Path):
    result = _pgcli(proxy, tmp_path, r"\dt+ adult")
    assert result.returncode == 0, result.stderr
    assert "| Size " in result.stdout and "<null>" in result.stdout
