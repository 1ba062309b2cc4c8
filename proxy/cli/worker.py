"""``python -m proxy.cli.worker``: one serving process of a ``listen.workers`` group.

The supervisor (``proxy.serving.supervisor``) starts these; they are not for running by
hand. A worker serves like ``dpproxy serve`` (the same startup checks, one-line failures
and exit statuses, SIGHUP reload, SIGTERM graceful stop) on the supervisor's port with
SO_REUSEPORT, as worker ``--index`` of the group whose shared files are in ``--directory``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from policies.loader import load_policy
from proxy.serving import event_loop
from proxy.serving.workers import SupervisorLink, WorkerRole

from .main import configure_logging, run_guarded, serve_until_signal

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proxy.cli.worker", description=__doc__)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    configure_logging(args.verbose, f"%(asctime)s %(levelname)s %(name)s[worker {args.index}]: %(message)s")
    role = WorkerRole(args.index, args.directory)
    link = SupervisorLink(args.link_fd)

    def serve() -> int:
        policy = load_policy(args.config)
        return event_loop.run(serve_until_signal(policy, args.config, args.host, args.port, None, role, link))

    return run_guarded(serve, args.config, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
