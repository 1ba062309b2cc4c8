"""The ``dpproxy`` command: serve, demo, check-config, epsilon, risk, budget, health, demo-load,
scram-verifier, draft-policy.

``serve`` and ``demo`` run until SIGTERM or SIGINT (a graceful shutdown: running statements
get ``listen.shutdown_grace_s`` to finish; a second signal cuts that short) and reload
their policy file on SIGHUP.

A command that cannot run says why in one line on stderr (docs/deployment.md, "When
dpproxy does not start"): a ``StartupError`` (``proxy.startup``) as ``dpproxy: <what
failed>: <why> — check <key> in <file>:<line>``, a policy that is not valid as one
``file:line: key: what`` line per problem, a wrong command line as one line naming the
option. Exit status: 0 done, 1 a cause the user can fix (those above), 2 a wrong command
line, 70 an internal error (a bug: its traceback is printed, to be reported), 130
interrupted. ``-v``/``--verbose`` on any command prints the traceback of a failure too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Coroutine, NoReturn, Sequence, cast

from policies.loader import PolicyError, load_policy
from policies.model import Policy
from proxy.serving import event_loop
from proxy.serving.bound_port import PortFile
from proxy.serving.startup import StartupError, os_reason, port_free, port_number
from proxy.serving.workers import SupervisorLink, WorkerRole

from .budget import add_budget_commands
from .credentials import add_credential_commands
from .deploy import add_deploy_commands
from .draft_policy import add_draft_commands
from .privacy import add_privacy_commands

__all__ = ["EXIT_FAILED", "EXIT_INTERNAL_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "configure_logging", "main",
           "run_guarded", "serve_until_signal"]

log = logging.getLogger("dpproxy")

EXIT_FAILED = 1  # a cause the user can fix: the policy, the backend, the ledger, a port, a file
EXIT_USAGE = 2  # the command line is wrong
EXIT_INTERNAL_ERROR = 70  # a bug (sysexits' EX_SOFTWARE)
EXIT_INTERRUPTED = 130  # Ctrl-C before serving began


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    verbose = bool(args.verbose)
    configure_logging(verbose, "%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = getattr(args, "config", None)
    return run_guarded(lambda: args.run(args), config if isinstance(config, Path) else None, verbose)


def configure_logging(verbose: bool, line_format: str) -> None:
    """Log to stderr at INFO (DEBUG with ``verbose``) in ``line_format``, which names no source
    location, thread or process: a record then leaves them out (the logging HOWTO's
    "Optimization"), which halves the cost of the line each client connection logs."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format=line_format)
    logging._srcfile = None  # no findCaller() walk of the stack
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False


def run_guarded(command: Callable[[], int | None], config: Path | None, verbose: bool) -> int:
    """Run ``command``; turn what it raises into the one line and exit status the contract names."""
    try:
        return int(command() or 0)
    except StartupError as exc:
        if config is not None:
            exc.locate(config)
        return _failed(exc, [f"dpproxy: {exc}"], verbose)
    except PolicyError as exc:
        return _failed(exc, exc.problems, verbose)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - a bug: shown whole, with a line saying so
        traceback.print_exc()
        print(f"dpproxy: internal error ({type(exc).__name__}); this is a bug in dpproxy: "
              "please report it with the traceback above", file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def _failed(exc: BaseException, lines: list[str], verbose: bool) -> int:
    """Print why a command failed (the traceback first, under ``-v``); the exit status."""
    if verbose:
        traceback.print_exception(exc)
    for line in lines:
        print(line, file=sys.stderr)
    return EXIT_FAILED


class _Parser(argparse.ArgumentParser):
    """dpproxy's argument parsers: every command takes ``-v``, and a usage error is one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.add_help:  # not a parents= template
            # SUPPRESS: a command's parser leaves the top level's value alone unless given.
            self.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                              help="on failure, print the traceback too; log at debug level")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} — see {self.prog} --help\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dpproxy", description="A PostgreSQL proxy that answers only differentially private aggregates.",
        epilog="Exit status: 0 done, 1 failed (one line on stderr says why), 2 wrong command line, "
               "70 internal error. Add -v to a command to see a failure's traceback.",
    )
    parser.set_defaults(verbose=False)
    # Every command's parser is a _Parser (add_subparsers' default class is the parent's).
    commands = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
                    parser.add_subparsers(dest="command", required=True))

    serve = commands.add_parser("serve", help="serve clients in front of the backend named by a policy")
    serve.add_argument("-c", "--config", required=True, type=Path, help="policy file (YAML)")
    serve.add_argument("--host", help="override listen.host")
    serve.add_argument("--port", type=port_number, help="override listen.port (0: a free port the kernel chooses)")
    serve.add_argument("--port-file", type=Path, metavar="PATH",
                       help="once listening, write the bound port to PATH (removed on stop)")
    serve.set_defaults(run=_serve)

    demo = commands.add_parser("demo", help="embedded PostgreSQL + Adult demo table + dpproxy")
    demo.add_argument("--port", type=port_number, default=6432, help="0: a free port the kernel chooses")
    demo.add_argument("--port-file", type=Path, metavar="PATH",
                      help="once listening, write the bound port to PATH (removed on stop)")
    demo.add_argument("--data-dir", type=Path, help="where the demo keeps its database and policy")
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
    add_credential_commands(commands)
    add_draft_commands(commands)
    return parser


def _check_config(args: argparse.Namespace) -> int:
    """Exit 0 if ``serve`` would accept the policy (or, backend unreachable, the file is valid)."""
    from .config_check import BackendCheck, check_against_backend

    policy = load_policy(args.config)  # PolicyError: main prints each problem at its line
    protected = sum(1 for t in policy.tables.values() if t.access == "protected")
    users = len(policy.users)
    summary = (f"{users} user{'' if users == 1 else 's'}; tables: {protected} protected, "
               f"{len(policy.tables) - protected} public")
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


def _serve(args: argparse.Namespace) -> int:
    policy = load_policy(args.config)
    port_file = _cleared_port_file(args.port_file)
    if policy.listen.workers > 1:
        return _run_loop(_supervise(policy, args.config, args.host, args.port, bool(args.verbose), port_file),
                         args.config)
    return _run(policy, args.config, args.host, args.port, None, port_file)


def _cleared_port_file(path: Path | None) -> PortFile | None:
    """``--port-file``'s file, one left by an earlier run removed; StartupError if it cannot be."""
    if path is None:
        return None
    port_file = PortFile(path)
    port_file.clear()
    return port_file


def _demo(args: argparse.Namespace) -> int:
    from proxy.demo.embedded import default_data_dir
    from proxy.demo.lock import DemoLock

    data_dir: Path = args.data_dir or default_data_dir()
    other = "choose another --data-dir" if args.data_dir else "choose a directory with --data-dir"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(f"cannot create the demo's data directory {data_dir}: {os_reason(exc)}",
                           hint=other) from exc
    lock = DemoLock(data_dir)  # before anything in the directory is touched: its policy, its PostgreSQL
    try:
        return _demo_in(data_dir, args.port, bool(args.verbose), _cleared_port_file(args.port_file))
    finally:
        lock.release()


def _demo_in(data_dir: Path, port: int, verbose: bool, port_file: PortFile | None) -> int:
    """The demo on ``data_dir``, which this process holds (``DemoLock``), serving on ``port``
    (0: the one the kernel chooses, which the banner and ``port_file`` tell)."""
    from proxy.demo.embedded import EmbeddedPostgres, prepare_demo_database, write_demo_policy

    port_free("127.0.0.1", port, hint="choose another --port")  # before PostgreSQL and the data load
    # pgserver logs a failed start whole (pg_ctl's output and the server log); the one line
    # dpproxy prints names the log file instead, unless -v asks for everything.
    logging.getLogger("pgserver").setLevel(logging.WARNING if verbose else logging.CRITICAL)
    print(f"dpproxy demo: starting an embedded PostgreSQL in {data_dir / 'pgdata'} ...", flush=True)
    postgres = EmbeddedPostgres(data_dir / "pgdata")
    try:
        dsn = prepare_demo_database(postgres.uri("postgres"))
        policy_path = write_demo_policy(data_dir / "policy.yaml", dsn, port, data_dir / "ledger.sqlite3")
        policy = load_policy(policy_path)

        def banner(bound: int) -> str:
            return (
                f"dpproxy demo is serving the adult table on 127.0.0.1:{bound} (policy: {policy_path}).\n"
                "Connect with:\n\n"
                f'    PGPASSWORD=analyst psql "host=127.0.0.1 port={bound} dbname=demo user=analyst"\n\n'
                f"Its PostgreSQL, as dpproxy's service role: {dsn}\n"
                f"(dpproxy draft-policy --dsn '{dsn}' drafts a policy from its catalog, as for a database of yours)\n\n"
                "Try: SELECT COUNT(*) FROM adult WHERE age > 40;   Press Ctrl-C to stop."
            )

        return _run(policy, policy_path, "127.0.0.1", port, banner, port_file)
    finally:
        postgres.stop()
        print("dpproxy demo: stopped.", flush=True)


def _run(policy: Policy, config: Path, host: str | None, port: int | None, banner: Callable[[int], str] | None,
         port_file: PortFile | None) -> int:
    return _run_loop(serve_until_signal(policy, config, host, port, banner, port_file=port_file), config)


def _run_loop(main: Coroutine[Any, Any, int], config: Path) -> int:
    try:
        return event_loop.run(main)
    except KeyboardInterrupt:
        return 0
    except StartupError as exc:
        raise exc.locate(config)


async def _supervise(policy: Policy, config: Path, host: str | None, port: int | None, verbose: bool,
                     port_file: PortFile | None) -> int:
    """``serve`` with ``listen.workers`` > 1: run the workers until SIGTERM or SIGINT."""
    from proxy.serving.supervisor import Supervisor

    supervisor = Supervisor(policy, config, host, port, verbose, port_file)
    try:
        failed = await supervisor.start()
    except StartupError:
        await supervisor.stop()
        raise
    if failed:
        return failed
    stop = asyncio.Event()

    def on_stop() -> None:
        if stop.is_set():
            supervisor.signal_all(signal.SIGTERM)  # the second signal: cut the grace short
        stop.set()

    def on_hangup() -> None:
        log.info("SIGHUP: every worker reloads the policy from %s", config)
        supervisor.signal_all(signal.SIGHUP)

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_stop)
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    await stop.wait()
    log.info("shutting down %d workers: no new connections; running statements have %gs to finish",
             policy.listen.workers, policy.listen.shutdown_grace_s)
    await supervisor.stop()
    log.info("dpproxy stopped")
    return 0


async def serve_until_signal(
    policy: Policy, config: Path, host: str | None, port: int | None, banner: Callable[[int], str] | None,
    worker: WorkerRole | None = None, link: SupervisorLink | None = None, port_file: PortFile | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT (a second one cuts the grace short), reloading on SIGHUP.

    ``banner``: the text to print, given the bound port, once listening. ``port_file``: where
    to write the bound port once listening (removed when no longer accepting). ``worker`` and
    ``link``: serve as that worker of a ``listen.workers`` group, telling the supervisor at
    ``link`` when listening, and stopping when it is gone.
    """
    from proxy.serving.server import Server

    try:
        server = await Server.create(policy, worker)
    except PolicyError as exc:
        from .config_check import locate

        text = config.read_text(encoding="utf-8") if config.is_file() else ""
        for problem in exc.problems:
            where = locate(problem, policy, text, str(config))
            print(f"dpproxy: policy does not match the backend: {where}", file=sys.stderr)
        return 1
    try:
        _, bound = await server.start(host, port)
        if port_file is not None:
            port_file.write(bound)
    except StartupError:
        await server.close()
        raise
    if banner is not None:
        print(banner(bound), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    if link is not None:
        link.ready(server.database)
        link.watch(loop, stop.set)
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
    server.stop_accepting()  # before the line that says so: a client reading the log may try at once
    if port_file is not None:
        port_file.remove()
    log.info("shutting down: no new connections; running statements have %gs to finish", grace)
    await server.close(grace)
    log.info("dpproxy stopped")
    return 0

