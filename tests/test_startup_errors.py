"""A command that cannot start says why in one line, and ``-v`` shows the traceback.

Each case runs the real CLI as a subprocess and checks stderr is exactly the one line
(``dpproxy: <what failed>: <why> — check <key> in <file>:<line>``, or a policy problem at
its line, or a usage error naming the option) and the exit status (1 a cause the user can
fix, 2 a wrong command line, 70 a bug); then runs it again with ``-v`` and checks the same
line follows a traceback. No password of a DSN or a ledger URL is ever printed.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest
from conftest import TestDatabase

POLICY = """\
backend:
  dsn: "{dsn}"
  connect_timeout_s: 5
listen:
  host: 127.0.0.1
  port: {port}
ledger:
  url: "{ledger}"
users:
  analyst:
    password: analyst
    budget: {{epsilon: 10}}
tables:
  public.adult:
    epsilon: 1.0
    columns:
      age: {{bounds: [17, 90]}}
"""

TRACEBACK = "Traceback (most recent call last):"
PASSWORD = "hunter2-secret"


def _dpproxy(*args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "proxy.cli"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)


def _fails(args: list[str], line: str, status: int = 1, verbose: bool = True) -> None:
    """``dpproxy *args`` prints exactly ``line`` on stderr and exits ``status``; with ``-v``,
    the same line after a traceback. No password anywhere."""
    run = _dpproxy(*args)
    assert (run.returncode, run.stderr) == (status, line + "\n"), run.stderr
    assert PASSWORD not in run.stdout + run.stderr
    if verbose:
        run = _dpproxy(*args, "-v")
        assert run.returncode == status, run.stderr
        assert TRACEBACK in run.stderr
        assert run.stderr.strip().splitlines()[-1] == line
        assert PASSWORD not in run.stdout + run.stderr


def closed_port() -> int:
    """A port nothing listens on, for a connection that must be refused: one the kernel gave a
    socket that is closed at once (another test may take it in between: rare, and such a test
    then fails on a connection that was not refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _line(text: str, start: str) -> int:
    """The 1-based line of ``text`` that starts with ``start``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(start))


def _policy(tmp_path: Path, dsn: str, *, port: int = 0, ledger: str | None = None, extra: str = "",
            listen_extra: str = "") -> tuple[Path, str]:
    text = POLICY.format(dsn=dsn, port=port, ledger=ledger or f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    text = text.replace(f"  port: {port}\n", f"  port: {port}\n{listen_extra}") + extra
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return path, text


def _refused_dsn() -> str:
    return f"postgresql://svc:{PASSWORD}@127.0.0.1:{closed_port()}/db"


# ------------------------------------------------------------------ the policy file

def test_a_missing_policy_file(tmp_path: Path):
    path = tmp_path / "nope.yaml"
    _fails(["serve", "-c", str(path)], f"{path}: cannot read policy file: No such file or directory")


def test_a_policy_path_that_is_a_directory(tmp_path: Path):
    _fails(["serve", "-c", str(tmp_path)], f"{tmp_path}: cannot read policy file: Is a directory")


def test_a_policy_file_that_is_not_utf8(tmp_path: Path):
    path = tmp_path / "policy.yaml"
    path.write_bytes(b"backend:\n  dsn: \"caf\xe9\"\n")
    _fails(["check-config", str(path)], f"{path}:2: the policy file is not UTF-8 text (byte 0xe9); save it as UTF-8")


def test_a_backend_dsn_libpq_cannot_parse_is_a_policy_problem_at_its_line(tmp_path: Path):
    path, _ = _policy(tmp_path, "host=db port")
    _fails(["serve", "-c", str(path)],
           f'{path}:2: backend.dsn: not a valid connection string: missing "=" after "port" in connection info string')


def test_a_malformed_dsn_is_reported_without_its_password(tmp_path: Path):
    path, _ = _policy(tmp_path, f"postgresql://svc:{PASSWORD}%zz@db/analytics")
    _fails(["check-config", str(path), "--file-only"],
           f"{path}:2: backend.dsn: not a valid connection string: "
           "(libpq's message is not shown: it contains the password)")


# ------------------------------------------------------------------ the backend

def test_an_unreachable_backend(tmp_path: Path):
    dsn = _refused_dsn()
    path, _ = _policy(tmp_path, dsn)
    port = urlparse(dsn).port
    _fails(["serve", "-c", str(path)],
           f"dpproxy: cannot reach the backend at 127.0.0.1:{port}: connection refused — check backend.dsn in {path}:2")


def test_an_unreachable_backend_given_by_dsn_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    dsn = _refused_dsn()
    monkeypatch.setenv("DPPROXY_TEST_BACKEND_DSN", dsn)
    path, text = _policy(tmp_path, "unused")
    path.write_text(text.replace('  dsn: "unused"', "  dsn_env: DPPROXY_TEST_BACKEND_DSN"), encoding="utf-8")
    _fails(["serve", "-c", str(path)],
           f"dpproxy: cannot reach the backend at 127.0.0.1:{urlparse(dsn).port}: connection refused "
           f"— check backend.dsn_env in {path}:2")


def test_a_backend_that_refuses_the_service_role(test_db: TestDatabase, tmp_path: Path):
    dsn = test_db.service_dsn.replace("dpproxy_service@", f"dpproxy_ghost:{PASSWORD}@")
    path, _ = _policy(tmp_path, dsn)
    parsed = urlparse(dsn)
    socket_dir = parse_qs(parsed.query).get("host", [None])[0]
    # pgserver's socket, or the host:port of DPPROXY_TEST_DSN as libpq names it
    where = re.escape(f"socket {socket_dir}/.s.PGSQL.{parsed.port or 5432}") if socket_dir else r"\S+:\d+"
    why = '(role "dpproxy_ghost" does not exist|password authentication failed for user "dpproxy_ghost")'
    run = _dpproxy("serve", "-c", str(path))
    assert run.returncode == 1
    assert re.fullmatch(f"dpproxy: the backend at {where} refused the connection: {why} "
                        f"— check backend.dsn in {re.escape(str(path))}:2\n", run.stderr), run.stderr
    assert PASSWORD not in run.stderr


@pytest.fixture
def password_asking_backend() -> Iterator[int]:
    """A port where a server answers every startup with AuthenticationCleartextPassword, as a
    PostgreSQL whose pg_hba.conf wants a password does (SSLRequest answered N)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    while True:
                        length = struct.unpack("!i", conn.recv(4))[0]
                        code = struct.unpack("!i", conn.recv(length - 4)[:4])[0]
                        if code != 80877103:  # not an SSLRequest: the StartupMessage
                            break
                        conn.sendall(b"N")
                    conn.sendall(b"R" + struct.pack("!ii", 8, 3))
                    conn.recv(1024)
                except (OSError, struct.error):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    server.close()


def test_a_dsn_without_the_password_the_backend_asks_for(tmp_path: Path, password_asking_backend: int,
                                                         monkeypatch: pytest.MonkeyPatch):
    # Was "cannot reach the backend ...: fe_sendauth: no password supplied", and check-config
    # said OK (not checked against the backend) although serve could never start.
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-such-pgpass"))
    path, _ = _policy(tmp_path, f"postgresql://svc@127.0.0.1:{password_asking_backend}/db")
    why = "it asks for a password and none was given (in the DSN, PGPASSWORD or PGPASSFILE)"
    _fails(["serve", "-c", str(path)],
           f"dpproxy: the backend at 127.0.0.1:{password_asking_backend} refused the connection: {why} "
           f"— check backend.dsn in {path}:2", verbose=False)
    run = _dpproxy("check-config", str(path))
    assert (run.returncode, run.stderr) == (
        1, f"{path}:2: backend.dsn: the backend at 127.0.0.1:{password_asking_backend} refused the connection: "
           f"{why}\n"), run.stdout


def test_check_config_says_why_the_backend_was_not_checked(tmp_path: Path):
    dsn = _refused_dsn()
    path, _ = _policy(tmp_path, dsn)
    run = _dpproxy("check-config", str(path))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith(
        f"checked the file only, not against the backend (cannot reach the backend at 127.0.0.1:{urlparse(dsn).port}: "
        "connection refused)")


# ------------------------------------------------------------------ the ledger

def test_a_ledger_in_a_missing_directory(test_db: TestDatabase, tmp_path: Path):
    ledger = tmp_path / "missing" / "ledger.sqlite3"
    path, _ = _policy(tmp_path, test_db.service_dsn, ledger=f"sqlite:///{ledger}")
    line = (f"dpproxy: cannot open the ledger sqlite:///{ledger}: the directory {ledger.parent} does not exist "
            f"— check ledger.url in {path}:8")
    _fails(["serve", "-c", str(path)], line)
    _fails(["budget", "show", "-c", str(path)], line)


def test_a_relative_ledger_path_names_the_directory_it_was_looked_for_in(test_db: TestDatabase, tmp_path: Path):
    # examples/policy.yaml's ledger is relative; under systemd (working directory /) it said only
    # "unable to open database file" or "the directory missing does not exist", not where.
    path, _ = _policy(tmp_path, test_db.service_dsn, ledger="sqlite:///missing/ledger.sqlite3")
    run = subprocess.run([sys.executable, "-m", "proxy.cli", "budget", "show", "-c", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (run.returncode, run.stderr) == (
        1, f"dpproxy: cannot open the ledger sqlite:///missing/ledger.sqlite3: the directory {tmp_path}/missing "
           f"does not exist (a relative path is read from the working directory) — check ledger.url in {path}:8\n")


def test_an_unreachable_postgresql_ledger_is_shown_without_its_password(tmp_path: Path):
    port = closed_port()
    path, _ = _policy(tmp_path, _refused_dsn(), ledger=f"postgresql://ledger:{PASSWORD}@127.0.0.1:{port}/ledger")
    _fails(["budget", "show", "-c", str(path)],
           f"dpproxy: cannot open the ledger postgresql://ledger:***@127.0.0.1:{port}/ledger: connection refused "
           f"— check ledger.url in {path}:8")


def test_a_ledger_database_that_is_not_supported(tmp_path: Path):
    path, _ = _policy(tmp_path, _refused_dsn(), ledger="mysql://ledger@db/ledger")
    _fails(["budget", "grant", "analyst", "--epsilon", "1", "-c", str(path)],
           "dpproxy: cannot open the ledger mysql://ledger@db/ledger: unsupported ledger database 'mysql': "
           f"use sqlite or postgresql — check ledger.url in {path}:8")


# ------------------------------------------------------------------ addresses

def test_a_listen_port_in_use(test_db: TestDatabase, tmp_path: Path, taken_port: int):
    path, _ = _policy(tmp_path, test_db.service_dsn, port=taken_port)
    _fails(["serve", "-c", str(path)],
           f"dpproxy: cannot listen on 127.0.0.1:{taken_port}: address already in use — check listen.port in {path}:6")


def test_a_port_option_in_use(test_db: TestDatabase, tmp_path: Path, taken_port: int):
    path, _ = _policy(tmp_path, test_db.service_dsn)
    _fails(["serve", "-c", str(path), "--port", str(taken_port)],
           f"dpproxy: cannot listen on 127.0.0.1:{taken_port}: address already in use — choose another --port")


def test_a_port_file_in_a_missing_directory_is_told_before_serving(test_db: TestDatabase, tmp_path: Path):
    path, _ = _policy(tmp_path, test_db.service_dsn)
    port_file = tmp_path / "missing" / "dpproxy.port"
    _fails(["serve", "-c", str(path), "--port-file", str(port_file)],
           f"dpproxy: cannot write the port file {port_file}: no such file or directory — choose another --port-file")


def test_the_default_listen_port_in_use_says_to_set_it(test_db: TestDatabase, tmp_path: Path):
    path, text = _policy(tmp_path, test_db.service_dsn)
    path.write_text(text.replace("  port: 0\n", ""), encoding="utf-8")
    with socket.socket() as blocker:  # the default, 6432, may be free or not: take it
        try:
            blocker.bind(("127.0.0.1", 6432))
            blocker.listen()
        except OSError:
            pass  # something listens there already
        _fails(["serve", "-c", str(path)],
               f"dpproxy: cannot listen on 127.0.0.1:6432: address already in use — set listen.port in {path}")


def test_a_listen_host_that_does_not_resolve(test_db: TestDatabase, tmp_path: Path):
    path, text = _policy(tmp_path, test_db.service_dsn)
    path.write_text(text.replace("  host: 127.0.0.1", "  host: no-such-host.invalid"), encoding="utf-8")
    run = _dpproxy("serve", "-c", str(path))
    assert run.returncode == 1
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("dpproxy: cannot listen on no-such-host.invalid:0: ")  # the resolver's words vary
    assert line.endswith(f" — check listen.host in {path}:5")


def test_a_metrics_port_in_use(test_db: TestDatabase, tmp_path: Path, taken_port: int):
    extra = f"metrics:\n  host: 127.0.0.1\n  port: {taken_port}\n"
    path, text = _policy(tmp_path, test_db.service_dsn, extra=extra)
    _fails(["serve", "-c", str(path)],
           f"dpproxy: cannot serve metrics on 127.0.0.1:{taken_port}: address already in use "
           f"— check metrics.port in {path}:{_line(text, f'  port: {taken_port}')}")


@pytest.mark.parametrize("port", ["70000", "-1", "x"])
def test_an_invalid_port_option(tmp_path: Path, port: str):
    # 70000 used to be bound as 70000 - 65536 = 4464 without a word.
    _fails(["serve", "-c", str(tmp_path / "policy.yaml"), f"--port={port}"],
           f"dpproxy serve: argument --port: '{port}' is not a port number (0 to 65535) — see dpproxy serve --help",
           status=2, verbose=False)


def test_a_missing_required_option_is_one_line():
    _fails(["budget", "show"], "dpproxy budget show: the following arguments are required: -c/--config "
           "— see dpproxy budget show --help", status=2, verbose=False)


# ------------------------------------------------------------------ TLS and the audit log

@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("tls")
    files = {}
    for name in ("a", "b"):
        files[f"{name}.crt"], files[f"{name}.key"] = folder / f"{name}.crt", folder / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        "/CN=localhost", "-keyout", str(files[f"{name}.key"]), "-out", str(files[f"{name}.crt"])],
                       check=True, capture_output=True)
    return files


@pytest.mark.parametrize("cert, key, message, which", [
    ("missing.crt", "a.key", "cannot read the TLS certificate {cert}: no such file or directory", "cert"),
    ("a.crt", "missing.key", "cannot read the TLS key {key}: no such file or directory", "key"),
    ("a.key", "a.key", "the TLS certificate {cert} is not a PEM certificate", "cert"),
    ("a.crt", "b.key", "the TLS key {key} is not the key of the certificate {cert}", "key"),
    ("a.crt", "a.crt", "the TLS key {key} is not an unencrypted PEM private key", "key"),
])
def test_tls_files_that_cannot_be_loaded(test_db: TestDatabase, tmp_path: Path, certificates: dict[str, Path],
                                         cert: str, key: str, message: str, which: str):
    cert_path = certificates.get(cert, tmp_path / cert)
    key_path = certificates.get(key, tmp_path / key)
    path, text = _policy(tmp_path, test_db.service_dsn,
                         listen_extra=f"  tls:\n    cert: {cert_path}\n    key: {key_path}\n")
    _fails(["serve", "-c", str(path)],
           f"dpproxy: {message.format(cert=cert_path, key=key_path)} "
           f"— check listen.tls.{which} in {path}:{_line(text, f'    {which}: ')}")


def test_an_audit_log_that_cannot_be_opened(test_db: TestDatabase, tmp_path: Path):
    audit = tmp_path / "missing" / "audit.jsonl"
    path, text = _policy(tmp_path, test_db.service_dsn, extra=f"audit:\n  path: {audit}\n")
    _fails(["serve", "-c", str(path)],
           f"dpproxy: cannot open the audit log {audit}: no such file or directory "
           f"— check audit.path in {path}:{_line(text, '  path: ')}")


def test_a_relative_audit_log_path_names_the_working_directory(test_db: TestDatabase, tmp_path: Path):
    # Under systemd the working directory is /, where examples/policy.yaml's audit.jsonl cannot be made.
    path, text = _policy(tmp_path, test_db.service_dsn, extra="audit:\n  path: missing/audit.jsonl\n")
    run = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "-c", str(path)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (run.returncode, run.stderr) == (
        1, f"dpproxy: cannot open the audit log missing/audit.jsonl (in the working directory {tmp_path}): "
           f"no such file or directory — check audit.path in {path}:{_line(text, '  path: ')}\n")


# ------------------------------------------------------------------ the demo

def test_the_demo_on_a_port_in_use_fails_before_starting_postgresql(tmp_path: Path, taken_port: int):
    _fails(["demo", "--data-dir", str(tmp_path / "demo"), "--port", str(taken_port)],
           f"dpproxy: cannot listen on 127.0.0.1:{taken_port}: address already in use — choose another --port")
    assert not (tmp_path / "demo" / "pgdata").exists()


def test_a_demo_data_directory_that_cannot_be_created(tmp_path: Path):
    (tmp_path / "file").write_text("")
    data_dir = tmp_path / "file" / "demo"
    _fails(["demo", "--data-dir", str(data_dir), "--port", "0"],
           f"dpproxy: cannot create the demo's data directory {data_dir}: not a directory — choose another --data-dir")


# ------------------------------------------------------------------ bugs

def test_an_internal_error_keeps_its_traceback_and_says_it_is_a_bug():
    code = ("import sys, proxy.cli.privacy as p\n"
            "def boom(*args): raise RuntimeError('boom')\n"
            "p.epsilon_report = boom\n"
            "from proxy.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    run = _dpproxy("epsilon", "--prior", "0.1", "--posterior", "0.5", code=code)
    assert run.returncode == 70
    assert TRACEBACK in run.stderr and "RuntimeError: boom" in run.stderr
    assert run.stderr.strip().splitlines()[-1] == (
        "dpproxy: internal error (RuntimeError); this is a bug in dpproxy: please report it with the traceback above")
