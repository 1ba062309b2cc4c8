"""Every column type × every role it plays in an accepted DP statement, on neighbouring tables.

The rule (docs/threat-model.md): an accepted DP statement must never fail, or come back
differently, because of the rows; only its noised values may depend on them. Past holes were
all one kind: a construct accepted on one column type that PostgreSQL evaluates per row and that
raises for some stored values. The matrix (tests/type_matrix.py) is generated from the backend's
types and from what dpproxy's policy loader and planner accept; each accepted statement runs
through a real dpproxy on tables that differ by one row holding an extreme value of every type,
and the masked outcome (answer or SQLSTATE and message; columns and types; number of rows and
keys of a histogram; notices with numbers masked) must be the same.

Tables: ``tm_empty`` (no row) and each ``tm_e<k>`` (only the k-th extreme row): neighbours. For
aggregates and keys, where rows interact (sums, sorts, partitions), also ``tm_base`` (ordinary
rows and a row of NULLs) and ``tm_all`` (``tm_base`` plus every extreme row): if those two differ,
some pair on the chain between them that differs by one row does too. A WHERE form is judged on
one row at a time: ``tm_empty`` against ``tm_all`` (an error any row raises shows there, also
through the planner's statistics, which ANALYZE fills with the extremes), and against each
``tm_e<k>`` when they differ, to name the row.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from dataclasses import dataclass, replace

import psycopg
import pytest

from policies.errors import Refusal
from policies.loader import PolicyError
from policies.tables import Relation
from proxy.serving.event_loop import new_event_loop
from proxy.serving.server import Server
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, spent_epsilon
from tests.neighbour_outcome import masked_outcome
from tests.type_matrix import (CURATED, GENERIC_LITERALS, VARIANTS, Probe, TypeCase, catalog_types_sql, column_name,
                               roles, where_roles)

EXTREMES = 6  # extreme rows: the k-th holds every type's k-th extreme (cycling through shorter lists)
ZONES = ("UTC", "Etc/GMT+12", "Etc/GMT-14")  # the WHERE forms run on the backend under each
CURATED_NAMES = frozenset(case.name for case in CURATED)
KEY_COLUMN = column_name(CURATED[9], "categories")  # text with declared categories: the per-cell key

_TRY_CAST = """
CREATE OR REPLACE FUNCTION pg_temp.tm_reads(v text, t text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE out text;
BEGIN EXECUTE format('SELECT CAST(CAST(%L AS %s) AS text)', v, t) INTO out; RETURN out;
EXCEPTION WHEN OTHERS THEN RETURN NULL; END $$
"""


@dataclass(frozen=True)
class Matrix:
    proxy: RunningProxy
    types: tuple[TypeCase, ...]
    columns: dict[str, tuple[TypeCase, str]]  # column → its type and the policy variant in force
    refused: dict[str, str]  # column → the loader's problem with its variant
    relation: Relation
    function_names: frozenset[str] | None
    admin_dsn: str


def _readable(conn: psycopg.Connection, sql_type: str, texts: tuple[str, ...]) -> tuple[str, ...]:
    """The texts the type reads, as the type prints them back (duplicates dropped)."""
    out: list[str] = []
    for text in texts:
        (value,) = conn.execute("SELECT pg_temp.tm_reads(%s, %s)", (text, sql_type)).fetchone() or (None,)
        if value is not None and value not in out:
            out.append(value)
    return tuple(out)


def _types(conn: psycopg.Connection) -> tuple[TypeCase, ...]:
    """:data:`CURATED` with the values this backend reads, and every other catalog type that reads some."""
    conn.execute(_TRY_CAST)
    types = []
    for case in CURATED:
        if case.setup:
            try:
                conn.execute(case.setup)
            except psycopg.Error:  # a build without ICU has no such collation: the type is left out
                continue
        extremes = _readable(conn, case.sql_type, case.extremes)
        ordinary = _readable(conn, case.sql_type, case.ordinary)
        if extremes and len(ordinary) == 2:  # a collation or type this server lacks: left out
            types.append(replace(case, extremes=extremes, ordinary=(ordinary[0], ordinary[1])))
    known = [c.sql_type for c in CURATED] + ["character varying", "character", "bit varying", "bit",
                                              "timestamp without time zone", "timestamp with time zone",
                                              "time without time zone", "time with time zone"]
    for (sql_type,) in conn.execute(catalog_types_sql(known)).fetchall():
        values = _readable(conn, sql_type, GENERIC_LITERALS)
        if values:
            types.append(TypeCase(sql_type, values[:EXTREMES], (values[0], values[-1])))
    return tuple(types)


def _yaml(text: str) -> str:
    return json.dumps(text)  # a JSON string is a YAML flow scalar


def _column_policy(case: TypeCase, variant: str) -> str:
    template = VARIANTS[variant]
    return template.replace("{a}", _yaml(case.ordinary[0])).replace("{b}", _yaml(case.ordinary[1]))


def _policy_text(columns: dict[str, tuple[TypeCase, str]], tables: list[str]) -> str:
    entries = [f"{_yaml(name)}: {{{_column_policy(case, variant)}}}" for name, (case, variant) in columns.items()
               if VARIANTS[variant]]
    escaped = ", ".join(entry.replace("{", "{{").replace("}", "}}") for entry in entries)  # make_policy formats
    policy = ("{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: 3, partitioning: row_hash, "
              f"columns: {{{{{escaped}}}}}}}}}")
    # Repeats off: a statement asked again would carry a repeat's notice, a function of the analyst's history.
    head = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
    assert head != ATTACK_POLICY_HEAD
    return head + "".join(f"  public.{table}: {policy}\n" for table in tables)


def _row(columns: dict[str, tuple[TypeCase, str]], pick: Callable[[TypeCase], str | None]) -> str:
    values = []
    for case, _ in columns.values():
        value = pick(case)
        values.append("NULL" if value is None else f"CAST({_literal(value)} AS {case.sql_type})")
    return "(" + ", ".join(values) + ")"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_TABLES = ["tm_empty", "tm_base", "tm_all", *(f"tm_e{k}" for k in range(EXTREMES))]


def _extreme(k: int, case: TypeCase) -> str:
    return case.extremes[k % len(case.extremes)]


def _create(admin: psycopg.Connection, columns: dict[str, tuple[TypeCase, str]]) -> None:
    ddl = ", ".join(f'"{name}" {case.column_type}' for name, (case, _) in columns.items())
    base = [_row(columns, lambda c: c.ordinary[0]), _row(columns, lambda c: c.ordinary[1]), _row(columns, lambda c: None)]
    extremes = [_row(columns, functools.partial(_extreme, k)) for k in range(EXTREMES)]
    contents: dict[str, list[str]] = {"tm_empty": [], "tm_base": base, "tm_all": base + extremes,
                **{f"tm_e{k}": [row] for k, row in enumerate(extremes)}}
    for table, rows in contents.items():
        admin.execute(f"DROP TABLE IF EXISTS {table}")
        admin.execute(f"CREATE TABLE {table} ({ddl}) WITH (autovacuum_enabled = off)")
        if rows:
            admin.execute(f"INSERT INTO {table} VALUES {', '.join(rows)}")
        for name in columns:  # the planner's statistics hold the extremes too
            try:
                admin.execute(f'ANALYZE {table} ("{name}")')
            except psycopg.Error:  # numrange's subdiff of 1e1000 overflows double precision: no statistics
                pass
        admin.execute(f"GRANT SELECT ON {table} TO dpproxy_service")


def _load_problems(policy_text: str, test_db: TestDatabase, ledger: Path) -> list[str]:
    """The loader's problems with the policy (empty: it loads), from a Server that is then closed."""
    loop = new_event_loop()
    try:
        policy = make_policy(test_db, ledger, policy_text)
        server = loop.run_until_complete(asyncio.wait_for(Server.create(policy), 120))
        loop.run_until_complete(server.close())
        return []
    except PolicyError as exc:
        return exc.problems
    finally:
        loop.close()


_PROBLEM = re.compile(r"^tables\.public\.tm_empty\.columns\.(?P<column>[^:]+): (?P<message>.+)$")


@pytest.fixture(scope="module")
def matrix(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        types = _types(admin)
        columns = {column_name(case, variant): (case, variant) for case in types for variant in VARIANTS
                   if case.name in CURATED_NAMES or variant == "plain" or (variant == "categories" and len(set(case.ordinary)) == 2)}
        _create(admin, columns)
    ledger = tmp_path_factory.mktemp("type-matrix") / "ledger.sqlite3"
    refused: dict[str, str] = {}
    for problem in _load_problems(_policy_text(columns, _TABLES), test_db, ledger):
        match = _PROBLEM.match(problem)
        if match is not None:
            refused[match["column"]] = match["message"]
        else:  # every table's problems are tm_empty's; nothing else may be wrong with the policy
            assert re.match(r"^tables\.public\.tm_\w+\.columns\.", problem), problem
    in_force = {name: (case, "plain" if name in refused else variant) for name, (case, variant) in columns.items()}
    running = RunningProxy(make_policy(test_db, ledger, _policy_text(in_force, _TABLES)))
    try:
        registry = running.server.registry
        relation = next(r for r in registry.by_oid.values() if r.name == "tm_empty")
        yield Matrix(running, types, in_force, refused, relation, registry.function_names, test_db.admin_dsn)
    finally:
        running.stop()


def _probes(matrix: Matrix) -> list[Probe]:
    """Every role of every column that dpproxy's planner accepts (the rest is refused from the text)."""
    plain = {case.name: column_name(case, "plain") for case in matrix.types}
    partners = {family: plain[family] for family in ("integer", "numeric", "float8", "real", "date", "timestamp",
                                                       "timestamptz", "text", "money", "interval", "time", "int4range")
                if family in plain}
    probes: list[Probe] = []
    for name, (case, variant) in matrix.columns.items():
        if name in matrix.refused:
            continue  # a clone of the type's plain column, without the policy the loader refused
        groups = roles(f'"{name}"', f'"{KEY_COLUMN}"', full=case.name in CURATED_NAMES)
        if variant == "plain":
            groups += [[probe] for probe in where_roles(case, f'"{name}"', {k: f'"{v}"' for k, v in partners.items()},
                                                        full=case.name in CURATED_NAMES)]
        for group in groups:
            for probe in group:
                try:
                    plan = plan_aggregate_query(probe.sql.replace("{t}", "tm_empty"), matrix.relation,
                                                matrix.function_names)
                except Refusal:
                    if probe is group[0]:
                        break
                    continue
                direct = None
                if probe.rowwise and plan.folding is None and not probe.params:
                    direct = backend_sql(plan, 0).replace(matrix.relation.qualified_name, "{t}")
                probes.append(replace(probe, role=f"{case.name} [{variant}] {probe.role}", backend=direct, case=case))
    return probes


def _backend_outcome(conn: psycopg.Connection, sql: str, table: str) -> tuple[object, ...]:
    """What the backend makes of the DP query's own SQL on ``table``: its one row's width, or the SQLSTATE."""
    try:
        row = conn.execute(sql.replace("{t}", f'"public"."{table}"')).fetchall()
        return ("answer", len(row))
    except psycopg.Error as exc:
        return ("error", exc.sqlstate)


def _outcome(conn: psycopg.Connection, probe: Probe, table: str) -> tuple[object, ...]:
    return masked_outcome(conn, probe.sql, table, probe.params or None, keys=probe.keys)


def test_the_policy_loader_refuses_unsafe_type_role_pairs_with_a_clear_error(matrix: Matrix) -> None:
    """Each variant the loader refuses names its column and says why, in a sentence; and every
    variant that a type can be given safely (bounds on numbers, a time range on times,
    categories on a type with an equality that cannot fail) is accepted."""
    for column, message in matrix.refused.items():
        assert column in matrix.columns and len(message) > 30 and "Traceback" not in message, (column, message)
    accepted = {(case.name, variant) for case, variant in matrix.columns.values()}
    for number in ("smallint", "integer", "bigint", "numeric", "real", "float8"):
        assert (number, "bounds") in accepted
    for time in ("date", "timestamp", "timestamptz"):
        assert (time, "time") in accepted
    for text in ("text", "varchar8", "char4", "text_c", "bool", "enum"):
        assert (text, "categories") in accepted
    for container in ("int4_array", "point_array", "composite", "json"):
        assert (container, "categories") not in accepted
    # A type not built in is only counted: the loader refuses any domain declared on it.
    foreign = {"vector", "vector_array", "halfvec", "sparsevec", "vector_range", "user_range"}
    assert {"vector", "vector_array", "vector_range", "user_range"} <= {case.name for case in matrix.types}
    assert not {(name, variant) for name, variant in accepted if name in foreign and variant != "plain"}
    # The catalog's other base types join by themselves (regclass, tsvector, pg_lsn ...).
    assert len([case for case in matrix.types if case.name not in CURATED_NAMES]) >= 20


def test_one_row_of_any_type_never_changes_an_accepted_statements_outcome(matrix: Matrix) -> None:
    probes = _probes(matrix)
    failures: list[str] = []
    answered: Counter[str] = Counter()
    with matrix.proxy.connect(connect_timeout=10, cursor_factory=psycopg.RawCursor) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        errors: list[tuple[Probe, tuple[object, ...]]] = []
        for index, probe in enumerate(probes):
            if probe.backend is not None:
                continue  # run on the backend directly, below
            outcomes = {"tm_empty": _outcome(conn, probe, "tm_empty")}
            empty = outcomes["tm_empty"]
            if empty[0] == "error":
                errors.append((probe, empty))
            else:
                answered[probe.role.split(" [")[0]] += 1  # the type's name
            pairs = [("tm_empty", "tm_all")]
            if not probe.rowwise:
                pairs.append(("tm_base", "tm_all"))
                # Three of the type's one-row tables, turning through its extremes from probe to probe.
                assert probe.case is not None
                extremes = min(len(probe.case.extremes), EXTREMES)
                pairs += [("tm_empty", f"tm_e{(index + k) % extremes}") for k in range(min(3, extremes))]
            for base, other in pairs:
                for table in (base, other):
                    if table not in outcomes:
                        outcomes[table] = _outcome(conn, probe, table)
                expected, got = outcomes[base], outcomes[other]
                if got != expected or _broken(got) or _broken(expected):
                    failures.append(f"{probe.role}: {probe.sql} params {probe.params!r}\n    {base}: {expected}\n"
                                    f"    {other}: {got}" + _culprit(conn, probe, expected))
                    break
        charged_errors = _charged(conn, errors)
    with psycopg.connect(matrix.admin_dsn, autocommit=True) as admin:
        for zone in ZONES:  # a time's conversions at the types' limits move with the session's TimeZone
            admin.execute(f"SET TimeZone = '{zone}'")
            for probe in probes:
                if probe.backend is None:
                    continue
                expected = _backend_outcome(admin, probe.backend, "tm_empty")
                got = _backend_outcome(admin, probe.backend, "tm_all")
                if got != expected:
                    culprit = next((f"tm_e{k}" for k in range(EXTREMES)
                                    if _backend_outcome(admin, probe.backend, f"tm_e{k}") != expected), "")
                    failures.append(f"{probe.role} (TimeZone {zone}): {probe.sql}\n    tm_empty: {expected}\n"
                                    f"    tm_all: {got} {culprit}")
    assert not failures, f"{len(failures)} of {len(probes)} statements depend on the rows:\n" + "\n".join(failures[:15])
    assert not charged_errors, "errors the rows do not decide were charged:\n" + "\n".join(charged_errors[:15])
    missing = [case.name for case in matrix.types if case.name in CURATED_NAMES and not answered[case.name]]
    assert not missing, f"no answered statement on {missing}: the matrix proves nothing for them"


def _charged(conn: psycopg.Connection, errors: list[tuple[Probe, tuple[object, ...]]]) -> list[str]:
    """The statements among ``errors`` (each failed on the empty table) that are charged when run again."""
    before = spent_epsilon(conn)
    for probe, _ in errors:
        _outcome(conn, probe, "tm_empty")
    if spent_epsilon(conn) == before:
        return []
    charged = []
    for probe, outcome in errors:
        before = spent_epsilon(conn)
        if _outcome(conn, probe, "tm_empty") == outcome and spent_epsilon(conn) > before:
            charged.append(f"{probe.role}: {probe.sql} {probe.params!r} -> {outcome}")
    return charged


def _broken(outcome: tuple[object, ...]) -> bool:
    return outcome[0] == "error" and outcome[1] in ("XX000", "08006", None)


def _culprit(conn: psycopg.Connection, probe: Probe, expected: tuple[object, ...]) -> str:
    """Which one-row neighbour of the empty table differs too (the extreme row to blame), if one does."""
    for k in range(EXTREMES):
        got = _outcome(conn, probe, f"tm_e{k}")
        if got != expected:
            return f"\n    tm_e{k} (one extreme row): {got}"
    return ""
