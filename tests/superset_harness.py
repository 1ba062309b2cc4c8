"""Apache Superset as a real client of dpproxy: find its venv, run it, talk to its REST API.

Superset lives in its own venv (tests/superset/install.sh; it needs SQLAlchemy 1.4, dpproxy
2.x). ``SupersetServer`` starts ``superset run`` on a free port with a copy of the metadata
database the install step initialised (admin/admin; ``db upgrade`` + ``init`` take ~20 s, a
copy takes none), and always stops it. ``SupersetApi`` logs in (JWT) and sends the CSRF
token with every write, as Superset's own front end does.
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from web_app import WebAppProcess, send_json

__all__ = ["ADMIN", "INSTALL_COMMAND", "SupersetApi", "SupersetServer", "superset_venv"]

HERE = Path(__file__).parent / "superset"
INSTALL_COMMAND = "bash tests/superset/install.sh"
ADMIN = ("admin", "admin")
TEMPLATE_NAME = "metadata-template.db"
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0


def superset_venv() -> Path:
    """The venv install.sh made; fail with the command that makes it when it is missing."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dpproxy" / "superset-6.1.0"
    venv = Path(os.environ.get("DPPROXY_SUPERSET_VENV", default))
    if not (venv / "bin" / "superset").is_file() or not (venv / TEMPLATE_NAME).is_file():
        raise RuntimeError(f"Apache Superset is not installed in {venv}: run `{INSTALL_COMMAND}` "
                           "(./run-tests does it on a fresh machine)")
    return venv


class SupersetServer:
    """``superset run`` on 127.0.0.1:<free port> (``port``, ``url``) with a fresh copy of the metadata template."""

    def __init__(self, workdir: Path, public: bool = False):
        """Starts from a copy of the template unless ``workdir`` has a metadata database already.
        ``public``: anonymous visitors get Admin's permissions, for a browser without a login
        (runs ``superset init`` to copy them, ~8 s); the API then acts as an anonymous user, so
        build what is to be shown first, on a server without it."""
        venv = superset_venv()
        self.workdir = workdir
        metadata = workdir / "superset.db"
        if not metadata.exists():
            shutil.copyfile(venv / TEMPLATE_NAME, metadata)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(SUPERSET_CONFIG_PATH=str(HERE / "superset_config.py"), DPPROXY_SUPERSET_METADATA=str(metadata),
                   FLASK_APP="superset", PYTHONUNBUFFERED="1")
        self.log_path = workdir / "superset.log"
        if public:
            env["DPPROXY_SUPERSET_PUBLIC"] = "1"
            with self.log_path.open("ab") as log:
                subprocess.run([str(venv / "bin" / "superset"), "init"], cwd=workdir, env=env, stdout=log,
                               stderr=subprocess.STDOUT, timeout=120, check=True)
        superset = str(venv / "bin" / "superset")
        self._app = WebAppProcess(
            "superset", lambda port: ([superset, "run", "-h", "127.0.0.1", "-p", str(port), "--with-threads"], env),
            workdir, self.log_path, "/health", START_TIMEOUT_S)
        self.port, self.url = self._app.port, self._app.url

    def log_tail(self, lines: int = 30) -> str:
        return self._app.log_tail(lines)

    def stop(self) -> None:
        self._app.stop()


class SupersetApi:
    """Superset's REST API as its front end uses it: a JWT bearer token plus the CSRF token."""

    def __init__(self, base_url: str, username: str = ADMIN[0], password: str = ADMIN[1]):
        self.base_url = base_url
        self._opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        self._headers: dict[str, str] = {}
        self._credentials = (username, password)
        self._web_session = False
        status, body = self.request("POST", "/api/v1/security/login",
                                    {"username": username, "password": password, "provider": "db", "refresh": True})
        assert status == 200, body
        self._headers["Authorization"] = f"Bearer {body['access_token']}"
        status, body = self.request("GET", "/api/v1/security/csrf_token/")
        assert status == 200, body
        self._headers["X-CSRFToken"] = body["result"]
        self._headers["Referer"] = base_url

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """The HTTP status and the decoded JSON body (the raw text when it is not JSON)."""
        data = None if body is None else json.dumps(body).encode()
        return self._send(method, path, data, "application/json")

    def explore_json(self, form_data: dict[str, Any]) -> tuple[int, Any]:
        """POST /superset/explore_json/ as the legacy chart plugins (``useLegacyApi``: Calendar
        Heatmap, Time-series Table, Period Pivot, Rose, Partition, World Map …) fetch their data:
        ``form_data`` in a form field, under the web session's login (no cache)."""
        self._log_in_web_session()
        data = urllib.parse.urlencode({"form_data": json.dumps(form_data)}).encode()
        return self._send("POST", "/superset/explore_json/?force=true", data, "application/x-www-form-urlencoded")

    def _log_in_web_session(self) -> None:
        """The legacy endpoints check Flask-Login's session cookie, not the API's bearer token."""
        if self._web_session:
            return
        # Flask-WTF takes the CSRF token from the X-CSRFToken header when the form has none.
        _, page = self._send("GET", "/login/", None, None)
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', str(page))
        form = {"username": self._credentials[0], "password": self._credentials[1],
                **({"csrf_token": token.group(1)} if token else {})}
        status, _ = self._send("POST", "/login/", urllib.parse.urlencode(form).encode(),
                               "application/x-www-form-urlencoded")
        assert status < 400, f"logging in to Superset's web session failed: HTTP {status}"
        self._web_session = True

    def _send(self, method: str, path: str, data: bytes | None, content_type: str | None) -> tuple[int, Any]:
        headers = {**self._headers, **({"Content-Type": content_type} if content_type is not None else {})}
        return send_json(self._opener, self.base_url + path, method, data, headers, REQUEST_TIMEOUT_S)

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request("POST", path, body)
