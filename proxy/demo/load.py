"""``dpproxy demo-load``: the demo's data and policy on a PostgreSQL server of your own.

The one-shot loader of docker-compose.yml runs this, so that ``docker compose up`` gives
what ``dpproxy demo`` gives (login ``analyst``/``analyst``, database ``demo``, table
``adult``, ε = 1 per query, a budget of 1,000 ε) with PostgreSQL in its own container.

It is idempotent: the database, the service role and the table are created only when
missing (the table is reloaded if it does not hold the demo's rows), the role's password
is (re)set when one is given, and the policy file is rewritten. The policy written is
``proxy.demo.DEMO_POLICY`` with the listen host, the ledger path and (optionally) a
metrics endpoint filled in; it reaches the backend as the service role, without a
password in the file: libpq takes it from ``PGPASSWORD`` in dpproxy's environment.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from policies.loader import load_policy
from policies.model import Policy

from .embedded import DEMO_POLICY, SERVICE_ROLE, prepare_demo_database

__all__ = ["load_demo", "service_dsn"]

_DEMO_LISTEN = "listen:\n  host: 127.0.0.1\n"
_USERS = "\nusers:\n"


def load_demo(
    admin_dsn: str,
    policy_out: Path,
    *,
    database: str = "demo",
    service_password: str | None = None,
    listen_host: str = "127.0.0.1",
    port: int = 6432,
    ledger: Path = Path("dpproxy-ledger.sqlite3"),
    metrics_port: int | None = None,
) -> Policy:
    """Prepare ``database`` on the server ``admin_dsn`` (a superuser libpq URI), write the
    policy to ``policy_out``, and return it as loaded back (so what was written is valid)."""
    prepare_demo_database(admin_dsn, database)
    if service_password is not None:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(SERVICE_ROLE), sql.Literal(service_password))
            )
    text = DEMO_POLICY.format(dsn=service_dsn(admin_dsn, database), port=port, ledger=ledger)
    if _DEMO_LISTEN not in text or _USERS not in text:  # pragma: no cover - guards edits to DEMO_POLICY
        raise RuntimeError("proxy.demo.DEMO_POLICY no longer has the listen/users layout demo-load fills in")
    text = text.replace("(written by `dpproxy demo`;", "(written by `dpproxy demo-load`;", 1)
    text = text.replace(_DEMO_LISTEN, f"listen:\n  host: {listen_host}\n", 1)
    if metrics_port is not None:
        text = text.replace(_USERS, f"\nmetrics:\n  host: {listen_host}\n  port: {metrics_port}\nusers:\n", 1)
    policy_out.parent.mkdir(parents=True, exist_ok=True)
    policy_out.write_text(text, encoding="utf-8")
    return load_policy(policy_out)


def service_dsn(admin_dsn: str, database: str) -> str:
    """The connection string of the service role: the admin DSN's server, without its password."""
    params = conninfo_to_dict(admin_dsn)
    params.pop("password", None)
    params.update(user=SERVICE_ROLE, dbname=database)
    return make_conninfo("", **params)
