"""The ``dpproxy`` command: serve, demo, check-config, epsilon, risk, budget, health, demo-load.

``serve`` and ``demo`` run until SIGTERM or SIGINT (a graceful shutdown: running statements
get ``listen.shutdown_grace_s`` to finish; a second signal cuts that short) and reload
their policy file on SIGHUP.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Sequence

from policies.loader import PolicyError, load_policy
from policies.model import Policy

from . import event_loop
from .cli_budget import add_budget_commands
from .cli_deploy import add_deploy_commands
from .cli_privacy import add_privacy_commands

__all__ = ["main"]

log = logging.getLogger("dpproxy")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return int(args.run(args) or 0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpproxy", description="A PostgreSQL proxy that answers only differentially private aggregates."
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve clients in front of the backend named by a policy")
    serve.add_argument("-c", "--config", required=True, type=Path, help="policy file (YAML)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=int, help="override listen.port")
    serve.add_argument("-v", "--verbose", action="store_true")
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="embedded PostgreSQL + Adult demo table + dpproxy")
    demo.add_argument("--port", type=int, default=6432)
    demo.add_argument("--data-dir", type=Path, help="where the demo keeps its database and policy")
    demo.add_argument("-v", "--verbose", action="store_true")
    demo.set_defaults(run=_demo)

    check = commands.add_parser(
        "check-config", help="validate a policy file and, if its backend answers, check the policy against it"
    )
    check.add_argument("config", type=Path)
    check.add_argument("--file-only", action="store_true", help="do not connect to the backend")
    check.set_defaults(run=_check_config)

    add_privacy_commands(commands)
    add_budget_commands(commands)
    add_deploy_commands(commands)
    return parser


def _check_config(args: argparse.Namespace) -> int:
    """Exit 0 if ``serve`` would accept the policy (or, backend unreachable, the file is valid)."""
    from .config_check import BackendCheck, check_against_backend

    try:
        policy = load_policy(args.config)
    except PolicyError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        return 1
    protected = sum(1 for t in policy.tables.values() if t.access == "protected")
    summary = (f"{len(policy.users)} users, {protected} protected and "
               f"{len(policy.tables) - protected} public tables")
    if args.file_only:
        checked = BackendCheck(False, reason="--file-only")
    else:
        text = args.config.read_text(encoding="utf-8")
        checked = event_loop.run(check_against_backend(policy, text, str(args.config)))
    if checked.problems:
        for problem in checked.problems:
            print(problem, file=sys.stderr)
        return 1
    for warning in checked.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if checked.reached:
        print(f"{args.config}: OK ({summary}; checked against the backend: every table and column found)")
    else:
        print(f"{args.config}: OK ({summary}); checked the file only, not against the backend ({checked.reason})")
    return 0


def _load_or_exit(path: Path) -> Policy:
    try:
        return load_policy(path)
    except PolicyError as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        raise SystemExit(1) from None


def _serve(args: argparse.Namespace) -> int:
    policy = _load_or_exit(args.config)
    return _run(policy, args.config, args.host, args.port, banner=None)


def _demo(args: argparse.Namespace) -> int:
    from .demo import EmbeddedPostgres, default_data_dir, prepare_demo_database, write_demo_policy

    data_dir: Path = args.data_dir or default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)
    print(f"dpproxy demo: starting an embedded PostgreSQL in {data_dir / 'pgdata'} ...", flush=True)
    postgres = EmbeddedPostgres(data_dir / "pgdata")
    try:
        dsn = prepare_demo_database(postgres.uri("postgres"))
        policy_path = write_demo_policy(data_dir / "policy.yaml", dsn, args.port, data_dir / "ledger.sqlite3")
        policy = _load_or_exit(policy_path)
        banner = (
            f"dpproxy demo is serving the adult table on 127.0.0.1:{args.port} (policy: {policy_path}).\n"
            "Connect with:\n\n"
            f'    PGPASSWORD=analyst psql "host=127.0.0.1 port={args.port} dbname=demo user=analyst"\n\n'
            "Try: SELECT COUNT(*) FROM adult WHERE age > 40;   Press Ctrl-C to stop."
        )
        return _run(policy, policy_path, "127.0.0.1", args.port, banner)
    finally:
        postgres.stop()
        print("dpproxy demo: stopped.", flush=True)


def _run(policy: Policy, config: Path, host: str | None, port: int | None, banner: str | None) -> int:
    try:
        return event_loop.run(_serve_until_signal(policy, config, host, port, banner))
    except KeyboardInterrupt:
        return 0
    except OSError as exc:
        print(f"dpproxy: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 1


async def _serve_until_signal(
    policy: Policy, config: Path, host: str | None, port: int | None, banner: str | None
) -> int:
    from .server import Server

    try:
        server = await Server.create(policy)
    except PolicyError as exc:
        from .config_check import locate

        text = config.read_text(encoding="utf-8") if config.is_file() else ""
        for problem in exc.problems:
            print(f"policy does not match the backend: {locate(problem, policy, text, str(config))}", file=sys.stderr)
        return 1
    await server.start(host, port)
    if banner:
        print(banner, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    reloads: set[asyncio.Task[bool]] = set()  # strong references until each reload is done

    def on_stop() -> None:
        if stop.is_set():
            server.hurry()
        stop.set()

    def on_hangup() -> None:
        if stop.is_set():
            log.info("SIGHUP ignored: shutting down")
            return
        log.info("SIGHUP: reloading the policy from %s", config)
        task = loop.create_task(server.reload(config))
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_stop)
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    await stop.wait()
    grace = server.policy.listen.shutdown_grace_s
    log.info("shutting down: no new connections; running statements have %gs to finish", grace)
    await server.close(grace)
    log.info("dpproxy stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
