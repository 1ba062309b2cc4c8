"""``dpproxy health`` and ``dpproxy demo-load``: the commands the container image runs.

``health`` is the image's HEALTHCHECK: exit 0 when dpproxy answers on host:port, 1 when
not (the reason on stderr). With ``-c policy.yaml`` host and port are the policy's
``listen`` section's (a wildcard host probed on loopback); ``--host``/``--port`` still win.
``--port-file PATH`` probes the port ``serve --port-file PATH`` wrote, the way to find a
port the kernel chose (``listen.port: 0``), which ``health`` never probes as port 0.

``demo-load`` is docker-compose.yml's one-shot loader: the demo database, service role and
policy on a PostgreSQL server of your own; exit 0 when the policy is written and valid, 1
when the server cannot be reached or a password variable is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from proxy.serving.startup import os_reason, port_number

__all__ = ["add_deploy_commands"]


def add_deploy_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``health`` and ``demo-load`` on the ``dpproxy`` sub-command parser."""
    health = commands.add_parser("health", help="exit 0 if a dpproxy answers on host:port (container HEALTHCHECK)")
    health.add_argument("-c", "--config", type=Path, help="policy file (YAML): probe its listen.host and listen.port")
    health.add_argument("--host", help="where dpproxy listens (default: listen.host of -c, else 127.0.0.1)")
    port = health.add_mutually_exclusive_group()
    port.add_argument("--port", type=_probed_port, help="its port (default: listen.port of -c, else 6432)")
    port.add_argument("--port-file", type=Path, metavar="PATH",
                      help="probe the port written to PATH by serve --port-file PATH (for listen.port: 0)")
    health.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    health.set_defaults(run=_health)

    load = commands.add_parser(
        "demo-load", help="create the demo database, service role and policy on a PostgreSQL of your own"
    )
    load.add_argument("--admin-dsn", required=True, help="libpq URI of a superuser (password via PGPASSWORD)")
    load.add_argument("--policy-out", required=True, type=Path, help="where to write the policy")
    load.add_argument("--database", default="demo")
    load.add_argument("--service-password-env", metavar="VAR",
                      help="set the service role's password to this environment variable's value")
    load.add_argument("--listen-host", default="127.0.0.1", help="listen.host of the written policy")
    load.add_argument("--port", type=port_number, default=6432, help="listen.port of the written policy")
    load.add_argument("--ledger", type=Path, default=Path("dpproxy-ledger.sqlite3"), help="SQLite ledger file")
    load.add_argument("--metrics-port", type=port_number, help="serve metrics on listen-host:PORT (default: none)")
    load.set_defaults(run=_demo_load)


def _probed_port(text: str) -> int:
    """``health --port``: a port number other than 0, which names no port to connect to."""
    port = port_number(text)
    if port == 0:
        raise argparse.ArgumentTypeError("0 is no port to probe; for a dpproxy serving on the port the kernel "
                                         "chose, give --port-file PATH, the file its --port-file PATH wrote")
    return port


class _NoTarget(Exception):
    """Nothing says which port to probe: the line to print, and what to check."""

    def __init__(self, message: str, check: str):
        super().__init__(message)
        self.check = check


def _health(args: argparse.Namespace) -> int:
    from proxy.ops.health import HealthError, probe

    try:
        host, port, check = _health_target(args)
    except _NoTarget as exc:
        print(f"dpproxy health: {exc} — check {exc.check}", file=sys.stderr)
        return 1
    try:
        mode = probe(host, port, args.timeout)
    except (OSError, HealthError) as exc:
        why = os_reason(exc) if isinstance(exc, OSError) else exc
        print(f"dpproxy health: {host}:{port}: {why} — check {check}", file=sys.stderr)
        return 1
    print(f"dpproxy health: {host}:{port} answers ({mode})")
    return 0


# A policy listening on every address answers on loopback; a wildcard is no address to connect to.
_LOOPBACK = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "*": "127.0.0.1", "::": "::1"}


def _health_target(args: argparse.Namespace) -> tuple[str, int, str]:
    """The host and port ``health`` probes, and what to check when nothing answers there:
    ``--host``/``--port`` (or the port in ``--port-file``) if given, else the ``listen``
    section of ``-c`` (PolicyError if that file is not a valid policy), else 127.0.0.1:6432.
    Raises _NoTarget if the port file cannot be read, or if the port would be the policy's
    ``listen.port: 0``."""
    host, port = "127.0.0.1", 6432
    check = "--host and --port"
    if args.config is not None:
        from policies.loader import load_policy

        listen = load_policy(args.config, secrets=False).listen  # a probe needs no password
        host, port = _LOOPBACK.get(listen.host, listen.host), listen.port
        check = f"listen.host and listen.port in {args.config} (or --host and --port)"
    if args.port_file is not None:
        return args.host or host, _port_in(args.port_file), f"--port-file {args.port_file}"
    if args.port is not None:
        return args.host or host, args.port, check
    if port == 0:
        raise _NoTarget(f"listen.port is 0 in {args.config}: dpproxy serves on a port the kernel chose, and "
                        "nothing here says which", "--port-file PATH (the file serve --port-file PATH writes) "
                        "or --port")
    return args.host or host, port, check


def _port_in(path: Path) -> int:
    """The port in ``serve --port-file``'s file at ``path``; _NoTarget if there is none."""
    from proxy.serving.bound_port import PortFile

    try:
        return PortFile(path).read()
    except FileNotFoundError:
        raise _NoTarget(f"the port file {path} does not exist: no dpproxy accepts connections on a port it "
                        "wrote there (not yet, or no longer)", "--port-file") from None
    except OSError as exc:
        raise _NoTarget(f"cannot read the port file {path}: {os_reason(exc)}", "--port-file") from None
    except ValueError as exc:
        raise _NoTarget(f"the port file {path} {exc}", "--port-file") from None


def _demo_load(args: argparse.Namespace) -> int:
    import psycopg

    from policies.loader import PolicyError
    from proxy.demo.load import load_demo
    from proxy.serving.startup import connection_failure

    password = None
    if args.service_password_env:
        password = os.environ.get(args.service_password_env)
        if not password:
            print(f"dpproxy demo-load: environment variable {args.service_password_env} is not set", file=sys.stderr)
            return 1
    try:
        policy = load_demo(
            args.admin_dsn, args.policy_out, database=args.database, service_password=password,
            listen_host=args.listen_host, port=args.port, ledger=args.ledger, metrics_port=args.metrics_port,
        )
    except psycopg.Error as exc:
        why = connection_failure("the PostgreSQL server", args.admin_dsn, exc)
        print(f"dpproxy demo-load: {why} — check --admin-dsn", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"dpproxy demo-load: cannot write the policy {args.policy_out}: {os_reason(exc)} — check --policy-out",
              file=sys.stderr)
        return 1
    except PolicyError as exc:  # pragma: no cover - the template is tested
        print("\n".join(exc.problems), file=sys.stderr)
        return 1
    print(f"dpproxy demo-load: database {args.database} ready; policy written to {args.policy_out} "
          f"(listen {policy.listen.host}:{policy.listen.port})")
    return 0
