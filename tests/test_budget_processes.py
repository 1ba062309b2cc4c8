"""The ledger across processes: kill -9 keeps the spend; two replicas never overspend."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase
from test_cli import _start_serving
from wire import race

POLICY = TEST_POLICY.replace(
    "users:\n", "users:\n  tight:\n    password: tight\n    budget: {{epsilon: 10.5, delta: 0.001}}\n"
)


def _serve(config: Path) -> tuple[subprocess.Popen[str], int]:
    return _start_serving(config)


def _dsn(port: int) -> str:
    return f"host=127.0.0.1 port={port} dbname=dpproxy_test user=tight password=tight"


def _spent_via_show(port: int) -> float:
    with psycopg.connect(_dsn(port), autocommit=True) as conn:
        return conn.execute("SHOW dpproxy.budget").fetchone()[1]


def _spend_three(config: Path, stop: signal.Signals) -> float:
    """Answer three DP queries through a `dpproxy serve`, stop it with ``stop``, restart: spent ε."""
    process, port = _serve(config)
    try:
        with psycopg.connect(_dsn(port), autocommit=True, prepare_threshold=None) as conn:
            for i in range(3):
                conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {i}")
    finally:
        process.send_signal(stop)
        process.wait(timeout=20)
    process, port = _serve(config)
    try:
        return _spent_via_show(port)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def test_kill_minus_9_keeps_at_least_the_spend_and_at_most_the_reservation(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "ledger.sqlite3"))
    # One ledger write reserved 10 queries' worth (ledger.reserve); SIGKILL runs no release.
    assert 3.0 <= _spend_three(config, signal.SIGKILL) <= 10.0


def test_a_clean_stop_gives_unused_reservations_back(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "ledger.sqlite3"))
    assert _spend_three(config, signal.SIGTERM) == pytest.approx(3.0)


def test_two_proxy_processes_on_one_postgres_ledger_never_overspend(test_db: TestDatabase, tmp_path: Path):
    ledger = test_db.admin_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    text = POLICY.replace('ledger: {{url: "sqlite:///{ledger}"}}', f'ledger: {{{{url: "{ledger}", schema: replicas}}}}')
    config = tmp_path / "policy.yaml"
    config.write_text(text.format(dsn=test_db.service_dsn))
    replicas = [_serve(config), _serve(config)]
    try:
        outcomes = race([_dsn(port) for _, port in replicas],
                        [f"SELECT COUNT(*) FROM adult WHERE age > {i}" for i in range(40)])
        assert outcomes.count("ok") == 10 and outcomes.count("DP002") == 30
        assert _spent_via_show(replicas[0][1]) == pytest.approx(10.0)
        assert _spent_via_show(replicas[1][1]) == pytest.approx(10.0)
    finally:
        for process, _ in replicas:
            process.send_signal(signal.SIGTERM)
            log, _ = process.communicate(timeout=20)
            print(log)  # shown only if the test failed: a replica's traceback says why
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS replicas CASCADE")
