"""The BI tools' web-server harness (tests/web_app.py): a port another process takes between
being found free and being bound costs a retry on another port, never a failed test, nor a
test talking to the other process's server.

The server here is Python's ``http.server`` (it binds the port it is given, as ``superset
run`` and ``pgadmin4`` do, and exits when it cannot); the other process is a server in this
test process, which answers the same URL with 200.
"""

from __future__ import annotations

import http.server
import os
import sys
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import web_app
from web_app import PORT_ATTEMPTS, WebAppProcess, listening_sessions


@contextmanager
def _other_server(answers: bool) -> Iterator[int]:
    """A listening port of this process: an HTTP server answering 200 with ``theirs``, or (not
    ``answers``) a socket that accepts and never answers."""
    class Theirs(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"theirs")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Theirs, bind_and_activate=True)
    thread = None
    if answers:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
    try:
        yield server.server_address[1]
    finally:
        if thread is not None:
            server.shutdown()
        server.server_close()


def _http_server(directory: Path):
    def command(port: int) -> tuple[list[str], dict[str, str]]:
        argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)]
        return argv, dict(os.environ)

    return command


@pytest.fixture
def site(tmp_path: Path) -> Path:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "ready").write_text("ours")
    return tmp_path / "site"


@pytest.mark.parametrize("answers", [True, False], ids=["taken-by-a-server-answering-200", "taken-by-a-bare-listener"])
def test_a_port_taken_before_the_server_binds_it_is_given_up_for_another(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, site: Path, answers: bool) -> None:
    real = web_app.free_port
    with _other_server(answers) as taken:
        given: list[int] = []

        def free_port() -> int:  # the first port found free is taken meanwhile
            given.append(taken if not given else real())
            return given[-1]

        monkeypatch.setattr(web_app, "free_port", free_port)
        app = WebAppProcess("http.server", _http_server(site), tmp_path, tmp_path / "app.log", "/ready", 60)
        try:
            assert given[0] == taken and app.port == given[-1] != taken
            assert app.url == f"http://127.0.0.1:{app.port}"
            with urllib.request.urlopen(app.url + "/ready", timeout=10) as reply:
                assert reply.read() == b"ours"
            assert listening_sessions(app.port) == {app.process.pid}
            assert f"port {taken} was taken by another process" in app.log_tail()
        finally:
            app.stop()


def test_a_server_that_never_gets_a_port_fails_with_its_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                            site: Path) -> None:
    with _other_server(True) as taken:
        monkeypatch.setattr(web_app, "free_port", lambda: taken)
        with pytest.raises(RuntimeError, match=f"every one of {PORT_ATTEMPTS} free ports was taken"):
            WebAppProcess("http.server", _http_server(site), tmp_path, tmp_path / "app.log", "/ready", 60)
    assert (tmp_path / "app.log").read_text().count("was taken by another process") == PORT_ATTEMPTS


def test_a_server_that_fails_for_another_reason_fails_at_once_with_its_log(tmp_path: Path) -> None:
    def command(port: int) -> tuple[list[str], dict[str, str]]:
        return [sys.executable, "-c", "import sys; print('no configuration'); sys.exit(3)"], dict(os.environ)

    with pytest.raises(RuntimeError, match="exited with 3: no configuration"):
        WebAppProcess("broken", command, tmp_path, tmp_path / "app.log", "/ready", 60)
    assert "was taken" not in (tmp_path / "app.log").read_text()  # not started again
