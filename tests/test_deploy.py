"""The commands the container runs: ``dpproxy health`` (HEALTHCHECK) and ``dpproxy demo-load``
(the compose stack's loader), against the test PostgreSQL and real dpproxy servers."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase
from test_auth_tls_cancel import _tls_proxy, certificate  # noqa: F401 - a fixture, used by name
from test_cli import _start
from test_startup_errors import closed_port

from policies.loader import load_policy
from proxy.demo.embedded import SERVICE_ROLE
from proxy.ops.health import probe


def _dpproxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def test_health_exits_0_when_dpproxy_answers_and_1_when_nothing_listens(proxy: RunningProxy):
    answered = _dpproxy("health", "--host", proxy.host, "--port", str(proxy.port))
    assert answered.returncode == 0, answered.stderr
    assert "answers (plain)" in answered.stdout
    refused = _dpproxy("health", "--port", str(closed_port()), "--timeout", "2")
    assert refused.returncode == 1
    # One plain line, as every other command's failure ("[Errno 111] Connection refused" before).
    assert refused.stderr.endswith(": connection refused — check --host and --port\n"), refused.stderr


def test_health_completes_the_tls_handshake_when_tls_is_on(test_db, certificate, tmp_path, caplog):  # noqa: F811
    tls_proxy = _tls_proxy(test_db, certificate, tmp_path, required=True)
    try:
        with caplog.at_level(logging.INFO, logger="dpproxy"):
            assert probe(tls_proxy.host, tls_proxy.port) == "tls"
            assert probe(tls_proxy.host, tls_proxy.port) == "tls"
        with tls_proxy.connect(sslmode="require") as conn:  # the probes left the server serving
            conn.execute("SELECT 1")
    finally:
        tls_proxy.stop()
    # (The test policy's 101-row clamp_test draws the start-up warning about its partitions.)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and not r.getMessage().startswith(
        "policy: tables.public.clamp_test.partitions")], caplog.text


def test_health_probe_opens_no_session(proxy: RunningProxy):
    before = proxy.server.session_count
    assert probe(proxy.host, proxy.port) == "plain"
    assert proxy.server.session_count == before


@pytest.fixture
def unset_service_password(test_db: TestDatabase) -> Iterator[None]:
    yield
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER ROLE {SERVICE_ROLE} PASSWORD NULL")


def test_demo_load_writes_a_policy_that_dpproxy_serves(
    pg_admin_dsn: str, test_db: TestDatabase, tmp_path: Path, unset_service_password: None
):
    out = tmp_path / "etc" / "policy.yaml"
    args = ["demo-load", "--admin-dsn", pg_admin_dsn, "--database", TEST_DATABASE, "--policy-out", str(out),
            "--service-password-env", "SERVICE_PW", "--port", "0", "--metrics-port", "0",
            "--ledger", str(tmp_path / "ledger.sqlite3")]
    for _ in range(2):  # idempotent: the compose loader runs on every `docker compose up`
        loaded = _dpproxy(*args, env={"SERVICE_PW": "s3cret"})
        assert loaded.returncode == 0, loaded.stderr
    assert f"policy written to {out}" in loaded.stdout

    text = out.read_text()
    assert "s3cret" not in text and "password" not in text.split("users:")[0]
    policy = load_policy(out)
    assert policy.metrics is not None and policy.metrics.port == 0
    assert policy.backend.dsn is not None and f"user={SERVICE_ROLE}" in policy.backend.dsn
    assert policy.users["analyst"].budget.epsilon == 1000
    with psycopg.connect(test_db.admin_dsn) as conn:
        (stored,) = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (SERVICE_ROLE,)).fetchone()
    assert stored is not None and stored.startswith("SCRAM-SHA-256$")

    served = RunningProxy(policy)
    try:
        with served.connect() as conn:
            notices: list[str] = []
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
        assert "ε charged 1," in notices[0]
        assert served.server.metrics is not None
    finally:
        served.stop()


def test_demo_load_fails_cleanly_without_a_server_or_a_password(tmp_path: Path):
    out = tmp_path / "policy.yaml"
    unreachable = _dpproxy("demo-load", "--admin-dsn", f"postgresql://postgres@127.0.0.1:{closed_port()}/postgres",
                           "--policy-out", str(out))
    assert unreachable.returncode == 1 and "dpproxy demo-load:" in unreachable.stderr
    no_password = _dpproxy("demo-load", "--admin-dsn", "postgresql://postgres@127.0.0.1/postgres",
                           "--policy-out", str(out), "--service-password-env", "DPPROXY_TEST_UNSET_VARIABLE")
    assert no_password.returncode == 1 and "DPPROXY_TEST_UNSET_VARIABLE is not set" in no_password.stderr
    assert not out.exists()


def test_health_reads_host_and_port_from_the_policy_and_the_options_still_win(proxy: RunningProxy, tmp_path: Path):
    # `health -c policy.yaml` was a usage error, though every other command takes the policy so.
    config = tmp_path / "policy.yaml"
    policy = TEST_POLICY.format(dsn="host=127.0.0.1", ledger=tmp_path / "l.sqlite3")
    config.write_text(policy.replace("listen: {host: 127.0.0.1, port: 0}",
                                     f"listen: {{host: 0.0.0.0, port: {proxy.port}}}"))
    answered = _dpproxy("health", "-c", str(config))
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout == f"dpproxy health: 127.0.0.1:{proxy.port} answers (plain)\n"  # the wildcard on loopback
    elsewhere = closed_port()
    refused = _dpproxy("health", "--config", str(config), "--port", str(elsewhere), "--timeout", "2")
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"dpproxy health: 127.0.0.1:{elsewhere}: connection refused — check "), \
        refused.stderr
    config.write_text(policy.replace("port: 0}", f"port: {elsewhere}}}"))
    unanswered = _dpproxy("health", "-c", str(config), "--port", str(proxy.port), "--host", "localhost")
    assert unanswered.returncode == 0 and f"localhost:{proxy.port} answers" in unanswered.stdout


def test_health_with_the_policy_needs_none_of_its_secrets(proxy: RunningProxy, tmp_path: Path):
    # A HEALTHCHECK's environment may not carry the DSN or the analysts' passwords, and a probe
    # every 10 s should not derive every user's SCRAM keys.
    config = tmp_path / "policy.yaml"
    config.write_text("backend: {dsn_env: DPPROXY_TEST_UNSET_DSN}\n"
                      f"listen: {{host: 127.0.0.1, port: {proxy.port}}}\n"
                      "users:\n  analyst: {password_env: DPPROXY_TEST_UNSET_PASSWORD, budget: {epsilon: 1}}\n"
                      "tables: {}\n")
    answered = _dpproxy("health", "-c", str(config))
    assert answered.returncode == 0, answered.stderr


def test_health_probes_the_port_a_port_file_names_where_listen_port_is_0(test_db: TestDatabase, tmp_path: Path):
    # `health -c policy.yaml` with listen.port: 0 probed port 0 and said "connection refused —
    # check listen.host and listen.port", though dpproxy answered on the port the kernel chose.
    config, port_file = tmp_path / "policy.yaml", tmp_path / "dpproxy.port"
    config.write_text(TEST_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3"))
    assert "listen: {host: 127.0.0.1, port: 0}" in config.read_text()
    unnamed = _dpproxy("health", "-c", str(config), "--timeout", "2")
    assert unnamed.returncode == 1 and unnamed.stdout == ""
    assert unnamed.stderr == (f"dpproxy health: listen.port is 0 in {config}: dpproxy serves on a port the kernel "
                              "chose, and nothing here says which — check --port-file PATH (the file serve "
                              "--port-file PATH writes) or --port\n")
    zero = _dpproxy("health", "--port", "0")
    assert zero.returncode == 2 and "0 is no port to probe" in zero.stderr and "--port-file PATH" in zero.stderr

    process, _ = _start(["serve", "-c", str(config), "--port-file", str(port_file)], "listening on")
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():  # written just after the listening line
            assert time.monotonic() < deadline, "serve never wrote its port file"
            time.sleep(0.01)
        port = int(port_file.read_text())
        answered = _dpproxy("health", "-c", str(config), "--port-file", str(port_file))
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout == f"dpproxy health: 127.0.0.1:{port} answers (plain)\n"
        alone = _dpproxy("health", "--port-file", str(port_file))
        assert alone.returncode == 0 and alone.stdout == answered.stdout, alone.stderr
        both = _dpproxy("health", "--port-file", str(port_file), "--port", str(port))
        assert both.returncode == 2 and "not allowed with argument" in both.stderr
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
    assert process.returncode == 0
    stopped = _dpproxy("health", "-c", str(config), "--port-file", str(port_file))
    assert stopped.returncode == 1
    assert stopped.stderr == (f"dpproxy health: the port file {port_file} does not exist: no dpproxy accepts "
                              "connections on a port it wrote there (not yet, or no longer) — check --port-file\n")


@pytest.mark.parametrize("text", ["", "6432", "0\n", "65536\n", "64 32\n", "٦٤٣٢\n", "6432\nmore\n"],
                         ids=["empty", "no-newline", "zero", "too-large", "space", "arabic-digits", "more-lines"])
def test_health_refuses_a_port_file_that_holds_no_port(tmp_path: Path, text: str):
    port_file = tmp_path / "dpproxy.port"
    port_file.write_text(text, encoding="utf-8")
    refused = _dpproxy("health", "--port-file", str(port_file))
    assert refused.returncode == 1 and refused.stdout == ""
    assert refused.stderr.startswith(f"dpproxy health: the port file {port_file} does not hold a port number "
                                     "and a newline (it holds "), refused.stderr
    assert refused.stderr.endswith(" — check --port-file\n")
