"""A dpproxy with TLS configured for client connections, and the self-signed certificate it uses."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy


def self_signed_certificate(folder: Path) -> tuple[Path, Path]:
    """A fresh certificate for CN=localhost and its key, made by ``openssl`` (a system package) in ``folder``."""
    cert, key = folder / "server.crt", folder / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def tls_proxy(test_db: TestDatabase, certificate: tuple[Path, Path], ledger: Path, required: bool) -> RunningProxy:
    """A running dpproxy with the test policy and ``listen.tls`` naming ``certificate``."""
    cert, key = certificate
    tls = f"listen: {{{{host: 127.0.0.1, port: 0, tls: {{{{cert: \"{cert}\", key: \"{key}\", required: {str(required).lower()}}}}}}}}}"
    text = TEST_POLICY.replace("listen: {{host: 127.0.0.1, port: 0}}", tls)
    return RunningProxy(make_policy(test_db, ledger, text))
