"""``dpproxy draft-policy``: a first policy for the tables of a PostgreSQL of your own, drafted
from its catalog and never from its rows.

It reads only ``pg_catalog`` (``proxy.backend.schema_catalog``: tables, columns, types, NOT NULL,
primary keys, enum labels, the simple forms of CHECK constraints of tables and domains) and writes
a commented YAML policy that protects every table. A column's ``bounds`` or ``categories`` are
filled only where the schema declares them (a CHECK constraint, an enum type, a boolean), with a
comment saying so; elsewhere they are the placeholder ``FILL_IN``, which ``check-config`` and
``serve`` refuse at its ``file:line`` until the author writes a value there (``policies.placeholders``).
A value computed from the rows (MIN, MAX, DISTINCT) would leak them: docs/threat-model.md,
"Assumptions" 2.

Exit status: 0 the draft was written, 1 a cause the user can fix (the server cannot be reached, a
table does not exist, no table found, the output cannot be written), each said in one line.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import shlex
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

import yaml

from policies.model import TablePolicy
from policies.placeholders import PLACEHOLDER
from policies.relation_keys import policy_key
from proxy.backend.check_domains import Declared
from proxy.backend.schema_catalog import CatalogColumn, CatalogTable, NoSuchTable, read_tables, views_in
from proxy.serving.startup import connection_failure, os_reason

__all__ = ["add_draft_commands", "draft_text"]

ASSUMPTION = ("The policy's bounds, categories and time ranges are fixed in advance, not derived from the data "
              "(bounds computed from the current MIN/MAX leak them; so do categories listed from SELECT DISTINCT "
              "or a time range from the first and last row).")

# A table's defaults: a GROUP BY domain of more cells, or a category of more bytes, is a policy error.
_MAX_CELLS: int = TablePolicy.model_fields["max_cells"].default
_MAX_TEXT_BYTES: int = TablePolicy.model_fields["max_text_bytes"].default
_INTEGER_RANGES = {"smallint": (-(2**15), 2**15 - 1), "integer": (-(2**31), 2**31 - 1)}


def add_draft_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``draft-policy`` on the ``dpproxy`` sub-command parser."""
    command = commands.add_parser(
        "draft-policy", help="draft a policy for your tables from the database's catalog (never from its rows)",
        description="Reads only the catalog (tables, columns, types, constraints, enum labels) and writes a commented "
                    "policy protecting every table. Bounds and categories are filled only where the schema declares "
                    f"them (CHECK constraints, enum types); elsewhere they are {PLACEHOLDER}, which check-config "
                    "refuses until you write a value. " + ASSUMPTION + " (docs/threat-model.md, Assumptions 2)",
    )
    source = command.add_mutually_exclusive_group(required=True)
    source.add_argument("--dsn", help="libpq URI or key=value string of the database (a role that can read its "
                                      "catalog; no SELECT on the tables is needed)")
    source.add_argument("--dsn-env", metavar="VAR", help="read that DSN from the environment variable VAR, so that a "
                                                         "password in it is in neither the shell's history nor ps")
    command.add_argument("--schema", default="public", help="the schema whose tables are drafted, and in which "
                                                            "unqualified TABLE names are found (default: public)")
    command.add_argument("tables", nargs="*", metavar="TABLE",
                         help="only these tables (as SQL names them: orders, sales.orders, '\"Orders\"'); "
                              "default: every table of --schema")
    command.add_argument("-o", "--output", type=Path, metavar="PATH", help="write the draft here (default: stdout)")
    command.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    command.set_defaults(run=_draft_policy)


def _draft_policy(args: argparse.Namespace) -> int:
    import psycopg

    if args.output is not None and args.output.exists() and not args.force:
        print(f"dpproxy draft-policy: {args.output} exists (maybe a policy you edited) — give another -o, "
              "or --force to overwrite it", file=sys.stderr)
        return 1
    dsn, option = (args.dsn, "--dsn") if args.dsn_env is None else (os.environ.get(args.dsn_env, ""), f"${args.dsn_env}")
    if not dsn.strip():
        print(f"dpproxy draft-policy: the environment variable {args.dsn_env} is not set or empty — export the "
              "database's DSN in it (--dsn-env names the variable, not the DSN)", file=sys.stderr)
        return 1
    try:
        tables, views = asyncio.run(_read(dsn, args.schema, args.tables))
    except psycopg.Error as exc:
        why = connection_failure("the PostgreSQL server", dsn, exc)
        check = option if getattr(exc, "sqlstate", None) is None else f"the TABLE names and {option}"
        print(f"dpproxy draft-policy: {why} — check {check}", file=sys.stderr)
        return 1
    except NoSuchTable as exc:
        print(f"dpproxy draft-policy: {exc} — {_meant(exc, args.schema, bool(args.tables))}", file=sys.stderr)
        return 1
    if not tables:
        print(f"dpproxy draft-policy: the schema {args.schema} holds no table{_views_said(views)} — name another with "
              "--schema, or the tables as TABLE arguments (schema.table)", file=sys.stderr)
        return 1
    text = draft_text(tables, dsn, views)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        args.output.write_text(text, encoding="utf-8")
    except OSError as exc:
        print(f"dpproxy draft-policy: cannot write {args.output}: {os_reason(exc)} — check -o", file=sys.stderr)
        return 1
    left = sum(1 for table in tables for column in table.columns if PLACEHOLDER in _column_line(column).split("#")[0])
    todo = f"replace each {PLACEHOLDER} (or delete its line), then " if left else ""
    print(f"dpproxy draft-policy: wrote {args.output} ({len(tables)} table{'s' if len(tables) != 1 else ''}; "
          f"{left} column{'' if left == 1 else 's'} with {PLACEHOLDER} to decide{_views_said(views)}). Next: {todo}"
          f"dpproxy check-config {args.output}", file=sys.stderr)
    return 0


def _meant(exc: NoSuchTable, schema: str, named: bool) -> str:
    """What to do about a name the catalog does not hold: the names it does hold that differ only in
    case or quotes, as SQL writes them, or where to look."""
    if not exc.meant:
        return (f"check the name (psql's \\dt lists the tables; one outside --schema {schema} as schema.table)"
                if named else "check the name (psql's \\dn lists the schemas)")
    if named:
        return (f"did you mean {' or '.join(shlex.quote(name) for name in exc.meant)}? (SQL folds an unquoted name to "
                "lower case: a part with capitals or a dot is written in double quotes)")
    return (f"did you mean --schema {' or '.join(shlex.quote(name) for name in exc.meant)}? (--schema takes the "
            "name as stored, case and all)")


class _Catalog:
    """A read-only connection, as ``schema_catalog``'s session."""

    def __init__(self, conn: Any):
        self._conn = conn

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._conn.cursor() as cursor:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall())


async def _read(dsn: str, schema: str, names: Sequence[str]) -> tuple[list[CatalogTable], list[str]]:
    """The tables to draft, and (without ``names``) the views of ``schema`` left out."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, connect_timeout=10) as conn:
        await conn.set_read_only(True)
        await conn.execute("SET LOCAL statement_timeout = 30000")
        tables = await read_tables(_Catalog(conn), schema, names)
        return tables, [] if names else await views_in(_Catalog(conn), schema)


def _views_said(views: Sequence[str]) -> str:
    if not views:
        return ""
    one = len(views) == 1
    return f"; {len(views)} view{'' if one else 's'} left out: name {'it' if one else 'one'} as a TABLE to draft it"


def draft_text(tables: Sequence[CatalogTable], dsn: str, views: Sequence[str] = ()) -> str:
    """The commented policy YAML for ``tables``, read from the database at ``dsn`` (whose password,
    if any, is not written); ``views``, of the schema drafted, are named in a closing comment."""
    lines = [
        "# A draft policy written by dpproxy draft-policy from the database's catalog only (no row was read).",
        "#",
        *(f"# {line}" for line in _wrapped(ASSUMPTION + " (docs/threat-model.md, Assumptions 2)")),
        "#",
        f"# So every {PLACEHOLDER} below is yours to decide, from what the column means (its unit, the form that",
        "# fills it, the business rule), and check-config refuses the file until none is left. Bounds and",
        "# categories already filled come from the schema itself (a CHECK constraint, an enum type), as the",
        "# comment on their line says. A column with no entry is only counted (COUNT(col), IS NULL).",
        "#",
        "#   dpproxy check-config policy.yaml     (file:line of every problem; checks the backend too)",
        "#   dpproxy serve -c policy.yaml",
        "# Every key: docs/policy.md.",
        "backend:",
        f"  dsn_env: DPPROXY_BACKEND_DSN   # e.g. {_without_password(dsn)}",
        "  # serve reads the tables as this role: GRANT SELECT on them to a role that may do nothing else.",
        "listen:",
        "  host: 127.0.0.1",
        "  port: 6432",
        "ledger:",
        '  url: "sqlite:///dpproxy-ledger.sqlite3"   # spent budgets; postgresql://... for replicas',
        "audit:",
        "  path: audit.jsonl                         # one JSON line per statement, never values",
        "users:",
        "  analyst:",
        "    password_env: ANALYST_PASSWORD          # or scram_verifier: (dpproxy scram-verifier makes one)",
        "    budget: {epsilon: 100, delta: 1.0e-4, period: month}",
        "tables:",
    ]
    for table in tables:
        lines.extend(_table_lines(table))
    if views:
        lines += ["#", *(f"# {line}" for line in _wrapped(
            f"Not drafted, views and foreign tables of the schema: {', '.join(views)}. A protected view must compute "
            "nothing that can fail on a row (docs/policy.md, tables); to draft one, name it as a TABLE argument."))]
    return "\n".join(lines) + "\n"


def _table_lines(table: CatalogTable) -> list[str]:
    keys = [column.name for column in table.columns if column.primary_key]
    key = f"; primary key ({', '.join(keys)})" if keys else "; no primary key"
    lines = [
        f"  {_scalar(policy_key(table.schema, table.name))}:   # a {table.kind}{key}",
        "    access: protected",
        "    epsilon: 1.0          # per query, split evenly over its aggregate columns",
        "    delta: 1.0e-6         # per MIN/MAX column (sample and aggregate)",
        *_text_bytes_lines(table),
    ]
    entries = [_column_line(column) for column in table.columns]
    if any(entry.startswith("  ") for entry in entries):
        lines.append("    columns:")
    else:
        lines.append("    columns: {}")
    lines.extend(f"    {entry}" if entry.startswith("  ") else f"      {entry}" for entry in entries)
    return lines


def _text_bytes_lines(table: CatalogTable) -> list[str]:
    """A ``max_text_bytes`` line where a category the schema declares is longer than the default
    (a category past it could never be matched, and the policy would not load); none otherwise."""
    longest = max(((len(value.encode("utf-8")), column.name) for column in table.columns
                   if _declared_text(column) for value in column.declared.values or ()), default=None)
    if longest is None or longest[0] <= _MAX_TEXT_BYTES:
        return []
    return [f"    max_text_bytes: {longest[0]}   # not {_MAX_TEXT_BYTES}: the schema declares a category of "
            f"{_scalar(longest[1])} this long; a longer value reads as NULL, and each condition on text weighs this "
            "many bytes (docs/policy.md)"]


def _declared_text(column: CatalogColumn) -> bool:
    """Whether the column's entry is the text categories its CHECK constraints declare."""
    return column.kind == "text" and not column.primary_key and bool(column.declared.values)


def _column_line(column: CatalogColumn) -> str:
    """The column's entry (indented two more, under ``columns:``), or a comment line for a column
    that takes none."""
    about = column.type_name + (" NOT NULL" if column.not_null else "") + (
        f" (domain {column.domain})" if column.domain else "")
    name = _scalar(column.name)
    if column.kind == "counted":
        return f"# {name}: {about}: only counted and tested for NULL (values of any length, or a type not built in)"
    if column.primary_key:
        return f"# {name}: {about}, in the primary key: an identifier, counted (COUNT, COUNT(DISTINCT)); no entry"
    if column.kind == "other":
        return f"# {name}: {about}: counted and tested for NULL; no entry (categories: [...] if it has a few values)"
    if column.domain and column.kind in ("integer", "number", "date", "timestamp"):
        declared = _bounds(column)
        said = f"; its domain declares [{declared[0]}, {declared[1]}]" if PLACEHOLDER not in declared else ""
        return (f"# {name}: {about}: counted only (bounds need a column of a numeric, date or timestamp type "
                f"itself, not of a domain over one){said}")
    entry, source = _entry(column)
    return f"  {name}: {entry}   # {about}: {source}"


def _entry(column: CatalogColumn) -> tuple[str, str]:
    """The column's ``{...}`` entry, and the comment saying where its values come from."""
    declared = column.declared
    checks = f"from the schema: CHECK {', '.join(declared.sources)}"
    if column.kind in ("integer", "number", "date", "timestamp"):
        lo, hi = _bounds(column)
        if PLACEHOLDER not in (lo, hi):
            return f"{{bounds: [{lo}, {hi}]}}", checks
        partly = f" ({checks}, one end)" if declared.sources else ""
        what = ("the first and last day its DATE_TRUNC buckets cover, e.g. [2021-01-01, 2024-12-31]"
                if column.kind in ("date", "timestamp") else "its least and greatest possible value")
        return f"{{bounds: [{lo}, {hi}]}}", f"{PLACEHOLDER}: {what}{partly}"
    if column.kind == "enum" and column.enum_labels:
        return _categories(column.enum_labels), "from the schema: its enum type's labels"
    if column.kind == "boolean":
        return _categories(("true", "false")), "from the schema: a boolean's two values"
    if _declared_text(column):
        assert declared.values is not None
        return _categories(declared.values), checks
    return (f"{{categories: [{PLACEHOLDER}]}}",
            f"{PLACEHOLDER}: every value it may hold, if it is a category (MODE, GROUP BY); if not, delete this line")


def _categories(values: Sequence[str]) -> str:
    """A declared domain's entry, opted in to GROUP BY where its cells fit the default ``max_cells``."""
    group_by = ", group_by: true" if len(values) <= _MAX_CELLS else ""
    return f"{{categories: {_flow(values)}{group_by}}}"


def _bounds(column: CatalogColumn) -> tuple[str, str]:
    """The column's declared [lo, hi] as YAML text, ``FILL_IN`` for an end the schema does not declare."""
    declared: Declared = column.declared
    integer = column.kind == "integer"
    lo = _number(declared.lower, declared.lower_strict, integer, up=True)
    hi = _number(declared.upper, declared.upper_strict, integer, up=False)
    limits = _INTEGER_RANGES.get(column.type_name) if column.domain is None else None
    if limits is not None:  # a bound beyond the type's values holds no more, and the clamp could not cast it
        lo = lo if lo == PLACEHOLDER else str(max(int(lo), limits[0]))
        hi = hi if hi == PLACEHOLDER else str(min(int(hi), limits[1]))
    if PLACEHOLDER not in (lo, hi) and column.kind in ("integer", "number") and Decimal(lo) > Decimal(hi):
        return PLACEHOLDER, PLACEHOLDER  # a constraint no value meets: nothing to take from it
    return lo, hi


def _number(value: Decimal | str | None, strict: bool, integer: bool, up: bool) -> str:
    if value is None:
        return PLACEHOLDER
    if isinstance(value, str):  # an ISO date
        return value
    if integer:  # the integers the constraint allows: x > 1.5 is x >= 2, x > 1 is x >= 2
        whole = math.ceil(value) if up else math.floor(value)
        if strict and whole == value:
            whole += 1 if up else -1
        return str(whole)
    return str(int(value)) if value == value.to_integral_value() else str(value.normalize())


def _flow(values: Sequence[str]) -> str:
    return "[" + ", ".join(_scalar(value) for value in values) + "]"


def _scalar(value: str) -> str:
    """``value`` as a YAML string: plain where YAML reads it back as that string, quoted otherwise
    (``"yes"``, ``"1"``), and always quoted where it spells the placeholder."""
    if value == PLACEHOLDER:
        return f'"{PLACEHOLDER}"'
    dumped = yaml.safe_dump([value], default_flow_style=True, width=2**31, allow_unicode=True).strip()
    if len(dumped.splitlines()) > 1:  # a line break in the value: escaped, so that the entry stays on its line
        dumped = yaml.safe_dump([value], default_flow_style=True, default_style='"', width=2**31,
                                allow_unicode=True).strip()
    return dumped[1:-1]


_SECRETS = frozenset({"password", "sslpassword"})  # the key file's passphrase is one too


def _without_password(dsn: str) -> str:
    """``dsn`` without its password (nor its key file's), as libpq key=value pairs, for the comment that shows it."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        params = {key: value for key, value in conninfo_to_dict(dsn).items() if key not in _SECRETS}
    except Exception:  # noqa: BLE001 - the connection that read the catalog parsed it; say nothing then
        return "postgresql://dpproxy_service@db.internal/analytics"
    return make_conninfo(**{key: str(value) for key, value in params.items()})


def _wrapped(text: str, width: int = 98) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width)
