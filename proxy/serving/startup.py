"""Why dpproxy could not start, in one line: ``StartupError``, and the one place that turns
the known causes into it.

The known causes are the ones a configuration or the machine can cause: the backend cannot
be reached or refuses the service role, the ledger or the audit log cannot be opened, the
TLS files cannot be loaded, the listen or metrics address cannot be bound. The code that
meets one raises ``StartupError`` with a message saying what failed, where and why, and the
policy key to check; the CLI (``proxy.cli.main``) points that key at its line in the policy
file and prints ``dpproxy: <message> — check <key> in <file>:<line>``, exit status 1 (with
``-v``, the traceback first). Anything else is a bug and keeps its traceback.

No message shows a password: the ledger URL is shown with its password masked, and a cause
whose text contains the password of the backend DSN or ledger URL (libpq quotes a malformed
connection string back) is withheld.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket
import ssl
from pathlib import Path
from typing import Any, Sequence

import yaml

from policies.dsn import masked_url, without_passwords
from policies.ledger import ReadOnlyLedger
from policies.loader import key_line
from policies.model import BackendConfig, LedgerConfig, TLSConfig

__all__ = [
    "StartupError", "audit_failure", "backend_failure", "backend_reason", "backend_rejects_policy", "connection_failure",
    "ledger_failure",
    "listen_failure", "metrics_failure", "os_reason", "port_free", "port_number", "tls_failure",
]


class StartupError(Exception):
    """A reason a command cannot run that its user can fix, told in one line.

    ``key`` is the policy key to check (e.g. ``("backend", "dsn")``); ``hint`` is the advice
    when the fix is not in the policy (e.g. ``"choose another --port"``). ``locate`` finds the
    key's line in the policy file.
    """

    def __init__(self, message: str, key: Sequence[str] = (), hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.key = tuple(key)
        self.hint = hint
        self.where: str | None = None
        self.key_given = True

    def locate(self, policy_path: str | Path) -> "StartupError":
        """Point the advice at ``key``'s line in the policy file (once; returns ``self``)."""
        if not self.key or self.where is not None:
            return self
        try:
            text = Path(policy_path).read_text(encoding="utf-8")
        except (OSError, UnicodeError):
            self.where = str(policy_path)
            return self
        self.key_given = _has_key(text, self.key)
        self.where = f"{policy_path}:{key_line(text, list(self.key))}" if self.key_given else str(policy_path)
        return self

    def __str__(self) -> str:
        advice = self.hint
        if self.key:
            dotted = ".".join(self.key)
            if not self.key_given:  # the default is in force: the fix is to set the key
                advice = f"set {dotted} in {self.where}"
            else:
                advice = f"check {dotted} in {self.where or 'the policy'}"
        return f"{self.message} — {advice}" if advice else self.message


# ------------------------------------------------------------------ the backend

_AT = re.compile(r'connection to server at "(?P<host>[^"]*)"(?: \([^)]*\))?, port (?P<port>\d+) failed: (?P<why>.*)')
_SOCKET = re.compile(r'connection to server on socket "(?P<socket>[^"]*)" failed: (?P<why>.*)')
_RESOLVE = re.compile(r"failed to resolve host '(?P<host>[^']*)': (?:\[Errno -?\d+\] )?(?P<why>.*)")
_SERVER_SAID = re.compile(r"^(?:FATAL|ERROR): +")
# libpq's own words when the server asked for a password and the DSN, PGPASSWORD and
# PGPASSFILE gave none: the server answered, and said no to this login.
_NO_PASSWORD = re.compile(r"^fe_sendauth: no password supplied")


def backend_failure(backend: BackendConfig, exc: BaseException) -> StartupError:
    """The backend could not be connected to (or failed the policy's catalog queries)."""
    from proxy.backend.connection import BackendError

    key = ("backend", "dsn_env" if backend.dsn_env else "dsn")
    if isinstance(exc, BackendError):  # connected, but a catalog query failed
        return StartupError(f"the backend failed a catalog query as the service role: {exc.message}", key)
    return StartupError(connection_failure("the backend", backend.dsn or "", exc), key)


def connection_failure(server: str, dsn: str, exc: BaseException) -> str:
    """Why psycopg could not connect to (or use) ``server`` at ``dsn``, from its error ``exc``:
    ``cannot reach <server> at host:port: connection refused``, ``<server> at host:port
    refused the connection: password authentication failed for user "x"``, ..."""
    import psycopg

    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.ProgrammingError) and sqlstate is None:  # libpq could not parse the DSN
        why = without_passwords(_first_line(str(exc)), dsn)
        return f"the connection string of {server} is not valid: {why}"
    if sqlstate is not None:  # connected: a statement failed
        return f"{server} at {_dsn_address(dsn)} failed: {_sentence(_first_line(str(exc)))}"
    where, why, refused = _libpq_failure(str(exc), dsn)
    why = without_passwords(why, dsn)
    if refused:
        return f"{server} at {where} refused the connection: {why}"
    return f"cannot reach {server} at {where}: {why}"


def backend_reason(backend: BackendConfig, exc: BaseException) -> str:
    """``backend_failure``'s message alone, for ``check-config``'s "not checked because ..."."""
    return backend_failure(backend, exc).message


# What a server says when it is there but cannot take the connection now: passing, not the DSN's fault.
_PASSING = re.compile(r"starting up|shutting down|in recovery|too many (clients|connections)|not yet accepting")
_PASSING_CLASSES = ("08", "40", "53", "57")


def backend_rejects_policy(exc: BaseException) -> bool:
    """Whether ``exc``, from connecting to the backend and reading its catalog, is the backend
    answering that the policy's connection is wrong (no such database or role, a wrong password,
    no ``pg_hba.conf`` entry, a catalog query the role may not run), as opposed to no backend
    there (refused, unresolved, timed out) or one that cannot take connections for the moment."""
    sqlstate = getattr(exc, "sqlstate", None)  # BackendError's, or psycopg's once connected
    if sqlstate is not None:
        # Cancelled or timed out, out of resources, connection lost, a serialization failure:
        # the check did not finish, which says nothing about the policy.
        return not str(sqlstate).startswith(_PASSING_CLASSES)
    why, refused = _libpq_failure(str(exc), "")[1:]
    return refused and not _PASSING.search(why)


def _libpq_failure(text: str, dsn: str) -> tuple[str, str, bool]:
    """(where, why, refused by the server) from libpq's or psycopg's connection failure text."""
    line = _first_line(text).removeprefix("connection failed: ").removeprefix("connection is bad: ")
    found = _AT.search(line)
    if found:
        where = f"{found['host']}:{found['port']}"
    else:
        found = _SOCKET.search(line)
        where = f"socket {found['socket']}" if found else _dsn_address(dsn)
    if found is None:
        found = _RESOLVE.search(line)
    why = found["why"] if found else line
    if _NO_PASSWORD.match(why):
        return where, "it asks for a password and none was given (in the DSN, PGPASSWORD or PGPASSFILE)", True
    refused = bool(_SERVER_SAID.match(why))
    return where, _sentence(_SERVER_SAID.sub("", why)), refused


def _dsn_address(dsn: str) -> str:
    """host:port as the DSN gives them (defaults left to libpq are shown as such)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - a DSN libpq cannot parse names no address
        return "the address in the DSN"
    host = str(params.get("host") or params.get("hostaddr") or os.environ.get("PGHOST") or "localhost")
    port = str(params.get("port") or os.environ.get("PGPORT") or 5432)
    return f"{host}:{port}"


# ------------------------------------------------------------------ the ledger and the audit log

def ledger_failure(ledger: LedgerConfig, exc: BaseException) -> StartupError:
    """The ledger could not be opened (``Ledger.from_url`` raised ``exc``)."""
    url = ledger.url
    shown = masked_url(url)
    orig = getattr(exc, "orig", None)  # SQLAlchemy's DBAPIError: the driver's own error
    text = _first_line(str(orig if orig is not None else exc))
    key: tuple[str, ...] = ("ledger", "url")
    if isinstance(exc, ReadOnlyLedger):
        pass  # its own sentence: nothing of libpq's to reword
    elif isinstance(exc, ValueError) and "schema" in text:
        key = ("ledger", "schema")
    elif url.split("://", 1)[0] in ("postgresql", "postgres", "postgresql+psycopg"):
        text = _libpq_failure(text, "")[1]
    elif "unable to open database file" in text:
        text = _sqlite_directory_problem(Path(_sqlite_path(url))) or text
    why = without_passwords(_sentence(text), url)
    return StartupError(f"cannot open the ledger {shown}: {why}", key)


def _sqlite_directory_problem(path: Path) -> str | None:
    """Why SQLite could not open ``path`` in its directory, or None if the directory looks usable.

    A relative path is read from the working directory, which under systemd is ``/``: the
    directory is named absolute then, so that the operator sees where it was looked for.
    """
    directory = path.parent.absolute() if not path.is_absolute() else path.parent
    relative = "" if path.is_absolute() else " (a relative path is read from the working directory)"
    if not directory.is_dir():
        return f"the directory {directory} does not exist{relative}"
    if not os.access(directory, os.W_OK | os.X_OK):
        return f"this user cannot create files in the directory {directory}{relative}"
    return None


def audit_failure(path: str, exc: OSError) -> StartupError:
    """The audit log file could not be opened for appending (a relative ``path`` is shown with
    the working directory it was read from)."""
    where = path if Path(path).is_absolute() else f"{path} (in the working directory {Path.cwd()})"
    return StartupError(f"cannot open the audit log {where}: {os_reason(exc)}", ("audit", "path"))


# ------------------------------------------------------------------ TLS

def tls_failure(tls: TLSConfig, exc: OSError) -> StartupError:
    """``load_cert_chain(tls.cert, tls.key)`` raised ``exc``: say which file and why."""
    for name, path in (("certificate", tls.cert), ("key", tls.key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as unreadable:
            return StartupError(f"cannot read the TLS {name} {path}: {os_reason(unreadable)}",
                                ("listen", "tls", "cert" if name == "certificate" else "key"))
    try:
        ssl.create_default_context().load_verify_locations(cafile=tls.cert)
    except ssl.SSLError:
        return StartupError(f"the TLS certificate {tls.cert} is not a PEM certificate", ("listen", "tls", "cert"))
    if isinstance(exc, ssl.SSLError) and exc.reason == "KEY_VALUES_MISMATCH":
        return StartupError(f"the TLS key {tls.key} is not the key of the certificate {tls.cert}",
                            ("listen", "tls", "key"))
    if isinstance(exc, ssl.SSLError):
        return StartupError(f"the TLS key {tls.key} is not an unencrypted PEM private key", ("listen", "tls", "key"))
    return StartupError(f"cannot load the TLS key {tls.key}: {os_reason(exc)}", ("listen", "tls", "key"))


# ------------------------------------------------------------------ addresses

def listen_failure(host: str, port: int, exc: OSError, host_option: bool, port_option: bool) -> StartupError:
    """The client port could not be bound; ``*_option``: the value came from the command line."""
    about_host = isinstance(exc, socket.gaierror) or exc.errno in (errno.EADDRNOTAVAIL,)
    message = f"cannot listen on {host}:{port}: {os_reason(exc)}"
    if about_host:
        return StartupError(message, hint="check --host") if host_option else StartupError(message, ("listen", "host"))
    if port_option:
        return StartupError(message, hint="choose another --port")
    return StartupError(message, ("listen", "port"))


def port_file_failure(path: Path, exc: OSError) -> StartupError:
    """``--port-file PATH`` could not be cleared at startup or written once listening."""
    return StartupError(f"cannot write the port file {path}: {os_reason(exc)}", hint="choose another --port-file")


def port_free(host: str, port: int, hint: str) -> None:
    """Raise StartupError (with ``hint``) now if (host, port) cannot be bound, as a server
    would bind it, rather than after a slow start; the server's own bind still decides."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise StartupError(f"cannot listen on {host}:{port}: {os_reason(exc)}", hint=hint) from exc


def metrics_failure(host: str, port: int, exc: OSError) -> StartupError:
    """The metrics endpoint's port could not be bound."""
    about_host = isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL
    return StartupError(f"cannot serve metrics on {host}:{port}: {os_reason(exc)}",
                        ("metrics", "host" if about_host else "port"))


def port_number(text: str) -> int:
    """A command-line port: 0 to 65535 (argparse's ``type``; a larger one would wrap around)."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number (0 to 65535)")
    return port


# ------------------------------------------------------------------ text

def os_reason(exc: OSError) -> str:
    """``exc``'s cause in lower case, as ``strerror`` gives it (asyncio's is a sentence)."""
    if isinstance(exc, socket.gaierror):
        return _sentence(str(exc.strerror or exc))
    if exc.errno:
        return os.strerror(exc.errno).lower()
    return _sentence(str(exc))


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0].strip()


def _sentence(text: str) -> str:
    """``Connection refused`` → ``connection refused``; acronyms and quotes stay as they are."""
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        return text[0].lower() + text[1:]
    return text


def _sqlite_path(url: str) -> str:
    if "://" not in url:
        return url
    return url.split("://", 1)[1].removeprefix("/") or "."


def _has_key(text: str, keys: Sequence[str]) -> bool:
    """Whether the YAML ``text`` sets the key at ``keys`` (or only a default applies)."""
    try:
        node: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return True
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return False
        node = node[key]
    return True
