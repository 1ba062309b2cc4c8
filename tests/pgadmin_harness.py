"""pgAdmin 4 as a real client of dpproxy: find its venv, run it headless, talk to it as its UI does.

pgAdmin lives in its own venv (tests/pgadmin/install.sh; its Flask stack pins versions of its
own). ``PgAdminServer`` runs ``pgadmin4`` in desktop mode on a free port with a throwaway data
directory (tests/pgadmin/config_dpproxy.py: SQLite storage, no master password, no upgrade
check), and always stops it. ``PgAdminApi`` opens the browser page (desktop mode logs its one
user in), reads the CSRF token the page's script carries and sends it with every request, as
pgAdmin's front end does; ``query`` runs SQL in a Query Tool and polls for its answer.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any

from web_app import WebAppProcess, send_json

__all__ = ["INSTALL_COMMAND", "PgAdminApi", "PgAdminServer", "QueryResult", "pgadmin_venv"]

HERE = Path(__file__).parent / "pgadmin"
INSTALL_COMMAND = "bash tests/pgadmin/install.sh"
VERSION = "9.18"
START_TIMEOUT_S = 90.0
REQUEST_TIMEOUT_S = 60.0
POLL_TIMEOUT_S = 60.0


def pgadmin_venv() -> Path:
    """The venv install.sh made; fail with the command that makes it when it is missing."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dpproxy" / f"pgadmin4-{VERSION}"
    venv = Path(os.environ.get("DPPROXY_PGADMIN_VENV", default))
    if not (venv / "bin" / "pgadmin4").is_file():
        raise RuntimeError(f"pgAdmin 4 is not installed in {venv}: run `{INSTALL_COMMAND}` "
                           "(./run-tests does it on a fresh machine)")
    return venv


class PgAdminServer:
    """``pgadmin4`` (desktop mode) on 127.0.0.1:<free port> (``port``, ``url``), its data under ``workdir``."""

    def __init__(self, workdir: Path):
        venv = pgadmin_venv()
        self.workdir = workdir
        data = workdir / "pgadmin-data"
        data.mkdir(exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(CONFIG_DISTRO_FILE_PATH=str(HERE / "config_dpproxy.py"), DPPROXY_PGADMIN_DATA=str(data),
                   PYTHONUNBUFFERED="1")
        self.log_path = workdir / "pgadmin.log"
        pgadmin = str(venv / "bin" / "pgadmin4")
        self._app = WebAppProcess("pgadmin4", lambda port: ([pgadmin], {**env, "DPPROXY_PGADMIN_PORT": str(port)}),
                                  workdir, self.log_path, "/misc/ping", START_TIMEOUT_S)
        self.port, self.url = self._app.port, self._app.url

    def log_tail(self, lines: int = 30) -> str:
        return self._app.log_tail(lines)

    def stop(self) -> None:
        self._app.stop()


class QueryResult:
    """What the Query Tool shows for one run: the grid's columns and rows, or the error, and the
    *Messages* tab's text (notices and the command's status)."""

    def __init__(self, status: str, columns: list[str], rows: list[list[Any]], messages: str, error: str | None):
        self.status, self.columns, self.rows, self.messages, self.error = status, columns, rows, messages, error

    def __repr__(self) -> str:
        return (f"QueryResult(status={self.status!r}, columns={self.columns!r}, rows={self.rows!r}, "
                f"messages={self.messages!r}, error={self.error!r})")


class PgAdminApi:
    """pgAdmin's HTTP API as its front end uses it: the session cookie plus the CSRF header."""

    def __init__(self, base_url: str):
        self.base_url = base_url
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self._headers: dict[str, str] = {}
        status, _ = self._send("GET", "/browser/", None)  # desktop mode: logs the desktop user in
        assert status == 200, f"pgAdmin's browser page: HTTP {status}"
        status, script = self._send("GET", "/browser/js/utils.js", None)
        token = re.search(r"pgAdmin\['csrf_token'\] = '([^']+)'", str(script))
        header = re.search(r"pgAdmin\['csrf_token_header'\] = '([^']+)'", str(script))
        assert status == 200 and token and header, f"no CSRF token in pgAdmin's utils.js (HTTP {status})"
        self._headers[header.group(1)] = token.group(1)

    def _send(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        headers = {**self._headers, **({"Content-Type": "application/json"} if data is not None else {})}
        return send_json(self._opener, self.base_url + path, method, data, headers, REQUEST_TIMEOUT_S)

    def get(self, path: str) -> tuple[int, Any]:
        return self._send("GET", path, None)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self._send("POST", path, body)

    def data(self, path: str) -> Any:
        """The ``data`` of a GET that must succeed (pgAdmin wraps answers as success/errormsg/data)."""
        status, body = self.get(path)
        assert status == 200 and isinstance(body, dict) and body.get("success", 1), f"GET {path}: {status} {body}"
        return body["data"]

    @staticmethod
    def new_transaction_id() -> int:
        """A fresh id for a Query Tool or data grid (pgAdmin's front end draws one at random)."""
        return secrets.randbelow(9_000_000) + 1_000_000

    def open_query_tool(self, server_id: int, database_id: int, database: str, group_id: int = 1) -> int:
        """A new Query Tool on the database, as the *Query Tool* menu item opens one: its id."""
        trans_id = self.new_transaction_id()
        status, body = self.post(f"/sqleditor/initialize/sqleditor/{trans_id}/{group_id}/{server_id}/{database_id}",
                                 {"dbname": database})
        assert status == 200 and body.get("success"), f"opening a Query Tool: {status} {body}"
        return trans_id

    def query(self, trans_id: int, sql: str, explain_plan: Any = None) -> QueryResult:
        """Run ``sql`` in the Query Tool ``trans_id`` (the *Execute* button) and poll until it is done."""
        status, body = self.post(f"/sqleditor/query_tool/start/{trans_id}", {"sql": sql, "explain_plan": explain_plan})
        assert status == 200 and body.get("success"), f"starting a query: {status} {body}"
        return self._poll(trans_id)

    def _poll(self, trans_id: int) -> QueryResult:
        deadline = time.monotonic() + POLL_TIMEOUT_S
        # Each poll hands over the notices that arrived since the last one, a Busy poll's too (as
        # its ``result``, pgAdmin's sqleditor.poll): the web UI appends them all to *Messages*.
        earlier = ""
        while time.monotonic() < deadline:
            status, body = self.get(f"/sqleditor/poll/{trans_id}")
            if status != 200 or not body.get("success"):
                # An error: pgAdmin answers 500 with the message it shows in *Messages*.
                message = body.get("errormsg") if isinstance(body, dict) else str(body)
                return QueryResult("Error", [], [], earlier + str(message), str(message))
            data = body["data"]
            if data["status"] == "Busy":
                earlier += data["result"] if isinstance(data.get("result"), str) else ""
                time.sleep(0.1)
                continue
            columns = [c["name"] for c in data.get("colinfo") or []]
            rows = data["result"] if isinstance(data["result"], list) else []
            messages = earlier + (data.get("additional_messages") or "")
            if not isinstance(data["result"], list) and data["result"]:
                messages += str(data["result"])
            return QueryResult(data["status"], columns, rows, messages, None)
        raise AssertionError(f"the Query Tool did not finish within {POLL_TIMEOUT_S:.0f} s")
