"""Backend settings an operator sets behind dpproxy's back, attacked on neighbouring tables.

tests/test_attack_settings.py sweeps what an analyst can change. This module sweeps what only
the operator can: a default of the service role (``ALTER ROLE dpproxy_service SET``, as a
superuser for the settings only one can set), which is what its database's defaults and
postgresql.conf do too: dpproxy's backend connections take every such default unless they
pin the setting (``proxy.backend.pool.PINNED_SETTINGS``). Each (setting, value) of ``TRIED``
is set so, a fresh dpproxy is started on it (so its policy's load runs under it and its pool
opens new connections), and every accepted DP form of test_attack_settings runs on ``st0`` and
its neighbours, which each add one adversarial row, beside cursors over them and passthrough
probes whose reading could change with such a setting. One row must change nothing but the noised values (the
outcome, SQLSTATE, columns, keys, notices), and a form answered under PostgreSQL's defaults
must still be answered (a routine operator setting that breaks dpproxy for every row is a
compatibility fault), as must every statement Superset sends (tests/test_bi_statements.py).

Found and fixed (each now pinned, with a test below): ``array_nulls = off`` failed every
histogram with 22P02 (its release query's parameters are text arrays with NULLs);
``client_encoding = SQL_ASCII`` refused the policy at load (check-config too);
``idle_session_timeout`` ended pooled connections between
checkouts, and the load between its catalog queries; ``exit_on_error = on`` ended the backend
connection, and with it the client's session, at an analyst's ``SELECT 1/0``; ``row_security =
off`` failed every DP query on a table with a row-level security policy (42501), after its
charge (budget).

Held, and why (no pin needed): every DP query's functions, operators and types are
``pg_catalog``'s, written ``OPERATOR(pg_catalog.=)`` (``transform_null_equals`` rewrites only a
bare ``=``; ``search_path`` substitutes nothing); literals and folded values are read back in
the analyst's session (DateStyle, IntervalStyle, TimeZone, ``timezone_abbreviations``); plan
settings change how rows are found, not which (``enable_*``, costs, parallel query, jit,
``synchronize_seqscans``, ``gin_fuzzy_search_limit`` on no GIN scan of a DP query); no backend
notice of a DP statement reaches the client (``client_min_messages`` with every ``log_*`` and
``debug_print_*``). A ``search_path`` without ``public`` makes an unqualified protected name
unknown, as PostgreSQL itself would (42P01 on every table, uncharged); qualified names answer.

Not pinnable, left to the operator (docs/threat-model.md): settings only a superuser may set.
``temp_file_limit`` with a small ``work_mem`` fails dpproxy's own catalog queries at load
(asserted below as a refusal to start); a limit the load stays under can still fail a DP
query whose sort or hash the rows' volume spills past it (53400; threat-model.md, "Timing").

``DPPROXY_OPERATOR_SWEEP=full`` runs every (setting, value) on a dpproxy of its own (6 to 10
minutes); by default each round sets one value of every setting together (``ROUNDS``) and the
values that would hide the others' effects run alone (``APART``), about 40 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from proxy.backend.pool import PINNED_SETTINGS, PINNED_WHERE_KNOWN
from proxy.serving.startup import StartupError
from tests.bi_data import PEOPLE_POLICY, create_people
from tests.bi_statements import PEOPLE_OID, load_recorded
from tests.conftest import (ATTACK_POLICY_HEAD, TEST_DATABASE, RunningProxy, TestDatabase, running_proxy,
                            spent_epsilon)
from tests.neighbour_outcome import create_neighbours, masked_outcome
from tests.test_attack_settings import (_BASE_ROWS, _BINARY_AND_COPY, _DDL, _NEIGHBOURS, _POLICY, _TYPED_TIMES,
                                       ACCEPTED_FORMS, _answer_form, _dates_as_text)

TABLES = ("st0", *_NEIGHBOURS)

# Each setting a role or database may set (pg_settings' context user or superuser, PostgreSQL
# 16) that could change a read-only SELECT's result, errors or notices, with the values tried.
TRIED: dict[str, tuple[str, ...]] = {
    "DateStyle": ("'SQL, DMY'", "'German, YMD'", "'Postgres, MDY'", "'ISO, YMD'", "'SQL, YMD'", "'German, MDY'"),
    "IntervalStyle": ("postgres_verbose", "sql_standard", "iso_8601"),
    "TimeZone": ("'Pacific/Kiritimati'", "'Etc/GMT+12'", "'<-1559>+15:59'"),
    "timezone_abbreviations": ("'Australia'", "'India'"),
    "array_nulls": ("off",),
    "backslash_quote": ("on", "off"),
    "escape_string_warning": ("off",),
    "transform_null_equals": ("on",),
    "quote_all_identifiers": ("on",),
    "bytea_output": ("escape",),
    "client_encoding": ("SQL_ASCII", "LATIN1", "WIN1252", "EUC_JP", "SJIS"),
    "client_min_messages": ("debug5", "log", "error"),
    "lc_monetary": ("'C'",), "lc_numeric": ("'C'",), "lc_time": ("'C'",), "lc_messages": ("'C'",),
    "xmlbinary": ("hex",), "xmloption": ("document",),
    "default_text_search_config": ("'pg_catalog.simple'",),
    "default_transaction_isolation": ("'serializable'", "'repeatable read'", "'read uncommitted'"),
    "search_path": ("public, pg_catalog", "pg_temp, public", "''", "pg_catalog", "'$user'"),
    "row_security": ("off",),
    "session_replication_role": ("replica", "local"),
    "exit_on_error": ("on",),
    "idle_session_timeout": ("1",),
    "lock_timeout": ("1",),
    "check_function_bodies": ("off",),
    "lo_compat_privileges": ("on",),
    "max_stack_depth": ("100",),
    "temp_file_limit": ("0",),
    "work_mem": ("64",), "hash_mem_multiplier": ("1",), "temp_buffers": ("100",),
    "enable_bitmapscan": ("off",), "enable_hashagg": ("off",), "enable_indexscan": ("off",),
    "enable_indexonlyscan": ("off",), "enable_seqscan": ("off",), "enable_sort": ("off",),
    "enable_incremental_sort": ("off",), "enable_material": ("off",), "enable_memoize": ("off",),
    "enable_presorted_aggregate": ("off",), "enable_partition_pruning": ("off",),
    "enable_partitionwise_aggregate": ("on",), "enable_partitionwise_join": ("on",), "enable_gathermerge": ("off",),
    "enable_async_append": ("off",), "enable_parallel_append": ("off",), "enable_parallel_hash": ("off",),
    "enable_tidscan": ("off",), "enable_hashjoin": ("off",), "enable_mergejoin": ("off",), "enable_nestloop": ("off",),
    "constraint_exclusion": ("on", "off"),
    "cursor_tuple_fraction": ("0", "1"),
    "from_collapse_limit": ("1",), "join_collapse_limit": ("1",),
    "geqo": ("off",), "geqo_threshold": ("2",),
    "gin_fuzzy_search_limit": ("1",),
    "recursive_worktable_factor": ("0.001",),
    "plan_cache_mode": ("force_generic_plan", "force_custom_plan"),
    "jit": ("off",), "jit_above_cost": ("0",),
    "debug_parallel_query": ("on", "regress"),
    "max_parallel_workers_per_gather": ("0", "8"),
    "parallel_setup_cost": ("0",), "parallel_tuple_cost": ("0",), "min_parallel_table_scan_size": ("0",),
    "random_page_cost": ("0",), "seq_page_cost": ("0",), "cpu_tuple_cost": ("0",),
    "synchronize_seqscans": ("off",),
    "stats_fetch_consistency": ("snapshot", "none"),
    "compute_query_id": ("on",),
    "icu_validation_level": ("error",),
    "trace_sort": ("on",),
    "log_statement": ("'all'",), "log_min_duration_statement": ("0",), "log_duration": ("on",),
    "log_executor_stats": ("on",), "log_temp_files": ("0",), "debug_print_plan": ("on",),
}

# Settable per role or database, and skipped: they cannot change a read-only SELECT's rows,
# errors or notices.
SKIPPED: dict[str, str] = {
    **{name: "writes only (a read-only session writes nothing)" for name in (
        "backend_flush_after", "commit_delay", "commit_siblings", "default_table_access_method",
        "default_tablespace", "default_toast_compression", "gin_pending_list_limit", "synchronous_commit",
        "wal_compression", "wal_consistency_checking", "wal_init_zero", "wal_recycle", "wal_skip_threshold",
        "vacuum_buffer_usage_limit", "vacuum_cost_delay", "vacuum_cost_limit", "vacuum_cost_page_dirty",
        "vacuum_cost_page_hit", "vacuum_cost_page_miss", "vacuum_failsafe_age", "vacuum_freeze_min_age",
        "vacuum_freeze_table_age", "vacuum_multixact_failsafe_age", "vacuum_multixact_freeze_min_age",
        "vacuum_multixact_freeze_table_age", "maintenance_work_mem", "maintenance_io_concurrency",
        "max_parallel_maintenance_workers", "default_statistics_target", "allow_in_place_tablespaces",
        "allow_system_table_mods", "createrole_self_grant", "password_encryption", "scram_iterations",
        "temp_tablespaces", "logical_decoding_work_mem", "debug_logical_replication_streaming",
        "zero_damaged_pages", "ignore_checksum_failure", "trace_notify")},
    **{name: "the server's log and statistics only (client_min_messages and log_* are tried)" for name in (
        "application_name", "backtrace_functions", "log_error_verbosity", "log_lock_waits", "log_min_duration_sample",
        "log_min_error_statement", "log_min_messages", "log_parameter_max_length",
        "log_parameter_max_length_on_error", "log_parser_stats", "log_planner_stats", "log_replication_commands",
        "log_statement_sample_rate", "log_statement_stats", "log_transaction_sample_rate", "track_activities",
        "track_counts", "track_functions", "track_io_timing", "track_wal_io_timing", "update_process_title",
        "debug_pretty_print", "debug_print_parse", "debug_print_rewritten", "debug_discard_caches")},
    **{name: "the connection's transport, not its statements" for name in (
        "client_connection_check_interval", "tcp_keepalives_count", "tcp_keepalives_idle",
        "tcp_keepalives_interval", "tcp_user_timeout", "wal_sender_timeout")},
    **{name: "plan costs like the tried ones: how rows are found, not which" for name in (
        "cpu_index_tuple_cost", "cpu_operator_cost", "effective_cache_size", "effective_io_concurrency",
        "geqo_effort", "geqo_generations", "geqo_pool_size", "geqo_seed", "geqo_selection_bias",
        "jit_dump_bitcode", "jit_expressions", "jit_inline_above_cost", "jit_optimize_above_cost",
        "jit_tuple_deforming", "max_parallel_workers", "min_parallel_index_scan_size",
        "parallel_leader_participation", "deadlock_timeout")},
    "dynamic_library_path": "where LOAD looks; dpproxy refuses LOAD",
    "local_preload_libraries": "a library an operator installs runs inside the backend: trusted as the server is",
    "session_preload_libraries": "a library an operator installs runs inside the backend: trusted as the server is",
    "transaction_isolation": "per transaction, from default_transaction_isolation (tried)",
    "transaction_read_only": "per transaction, from default_transaction_read_only (pinned)",
    "transaction_deferrable": "per transaction, from default_transaction_deferrable (pinned)",
    "statement_timeout": "pinned to the policy's backend.statement_timeout_ms",
    # PostgreSQL 17 and 18 (tests/pg_versions.py); the ones that could matter are TRIED_SINCE.
    **{name: "writes only (a read-only session writes nothing)" for name in (
        "file_copy_method", "vacuum_truncate", "vacuum_max_eager_freeze_failure_rate")},
    **{name: "DDL and roles only, which dpproxy refuses" for name in (
        "event_triggers", "extension_control_path", "md5_password_warnings")},
    **{name: "the server's log and statistics only" for name in ("log_lock_failures", "track_cost_delay_timing")},
}

# The settings a role or database may set on a newer server that could change a read-only
# SELECT's result, errors or notices, by the major version that added them, with the values
# tried (together, as one round, on that version: tests/pg_versions.py).
TRIED_SINCE: dict[int, dict[str, str]] = {
    17: {"transaction_timeout": "1", "restrict_nonsystem_relation_kind": "'view, foreign-table'",
         "enable_group_by_reordering": "off", "io_combine_limit": "1"},
    18: {"enable_distinct_reordering": "off", "enable_self_join_elimination": "off"},
}

# Run alone by default: each would hide the other settings' effects in a round (a search_path
# without public hides the unqualified tables; work_mem with temp_file_limit fails the load).
APART = [{"search_path": "''"}, {"work_mem": "64"}]
# Round n sets the n-th value of every setting that has one, all together; not the values
# apart and their like.
_KEPT_OUT = {("search_path", "''"), ("search_path", "pg_catalog"), ("search_path", "'$user'"), ("work_mem", "64")}
_ROUND_VALUES = {name: kept for name, values in TRIED.items()
                 if (kept := tuple(value for value in values if (name, value) not in _KEPT_OUT))}
ROUNDS = [{name: values[n] for name, values in _ROUND_VALUES.items() if n < len(values)}
          for n in range(max(len(values) for values in _ROUND_VALUES.values()))]
EVERY_ONE = [{name: value} for name, values in TRIED.items() for value in values]

# Passthrough probes, with the outcome each must have whatever the operator set.
PASSTHROUGH = {
    # One literal to dpproxy: a catalog query of no row.
    "SELECT relname::text FROM pg_catalog.pg_class WHERE relname = '\\'' UNION ALL SELECT s FROM public.{t} --'":
        ("answer", (("relname", 25),), 0),
    "SELECT relname::text FROM pg_catalog.pg_class WHERE relname = E'\\'' UNION ALL SELECT s FROM public.{t} --'":
        ("error", "DP001"),
    "SELECT s FROM public.{t} WHERE s = NULL": ("error", "DP001"),
    "SELECT 1 / 0": ("error", "22012"),
    "SELECT relname::text FROM pg_catalog.pg_class WHERE relname = '{t}'": ("answer", (("relname", 25),), 1),
    "SELECT COUNT(*) FROM public.{t} WHERE s = 'a'": ("answer", (("count", 20),), 1),
}


# Cursors over a DP form and a catalog query (a DP cursor's rows are released at DECLARE).
CURSORS = [
    "SELECT COUNT(*) FROM public.{t} WHERE i > 50",
    "SELECT s, COUNT(*) FROM public.{t} GROUP BY s",
    "SELECT relname::text FROM pg_catalog.pg_class WHERE relname = '{t}'",
]


@pytest.fixture(scope="module")
def neighbours(test_db: TestDatabase) -> None:
    _create_neighbours(test_db)


@pytest.fixture(scope="module")
def newer_neighbours(newer_pg_db: TestDatabase) -> TestDatabase:
    """``neighbours`` on PostgreSQL 17, then 18: the database they are in."""
    _create_neighbours(newer_pg_db)
    return newer_pg_db


def _create_neighbours(test_db: TestDatabase) -> None:
    create_neighbours(test_db.admin_dsn, "st0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("CREATE TABLE IF NOT EXISTS sr0 (id int8 PRIMARY KEY, v int4)")  # in _POLICY
        admin.execute("GRANT SELECT ON sr0 TO dpproxy_service")


@contextmanager
def defaults_set(test_db: TestDatabase, settings: Mapping[str, str],
                 owner: str = "ROLE dpproxy_service") -> Iterator[None]:
    """The service role (or ``owner``: ``DATABASE …``) with the defaults ``settings``, set by a
    superuser as an operator's ``ALTER … SET`` is; all reset again afterwards."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        try:
            for name, value in settings.items():
                admin.execute(f"ALTER {owner} SET {name} = {value}")
            yield
        finally:
            admin.execute(f"ALTER {owner} RESET ALL")


@contextmanager
def operator_defaults(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, settings: Mapping[str, str],
                      owner: str = "ROLE dpproxy_service", policy: str = _POLICY) -> Iterator[RunningProxy]:
    """A dpproxy started (its policy loaded, its pool empty) under ``defaults_set``."""
    with defaults_set(test_db, settings, owner), running_proxy(test_db, tmp_path_factory, policy) as proxy:
        yield proxy


def _faults(conn: psycopg.Connection, hides_public: bool) -> list[str]:
    """What differs on one neighbour, fails on all or is charged for failing, among the DP
    forms and the probes."""
    faults = []
    for form in ACCEPTED_FORMS:
        sql = form.replace("{t}", "public.{t}") if hides_public else form
        keys = 1 if "GROUP BY" in sql else 0
        outcomes = {}
        for table in TABLES:
            before = spent_epsilon(conn)
            outcomes[table] = masked_outcome(conn, sql, table, keys=keys)
            if outcomes[table][0] != "answer" and spent_epsilon(conn) != before:
                faults.append(f"charged for a failure on {table}: {sql}: {outcomes[table]}")
        if len(set(outcomes.values())) != 1:
            faults.append(f"one row decides {sql}: {outcomes}")
        elif outcomes["st0"][0] != "answer":
            faults.append(f"not answered on any table: {sql}: {outcomes['st0']}")
    for sql in CURSORS:
        outcomes = {table: _fetched_from_cursor(conn, sql, table) for table in TABLES}
        if len(set(outcomes.values())) != 1 or outcomes["st0"][0] != "answer":
            faults.append(f"cursor over {sql}: {outcomes}")
    for sql, expected in PASSTHROUGH.items():
        outcomes = {table: masked_outcome(conn, sql, table)[:len(expected)] for table in TABLES}
        if set(outcomes.values()) != {expected}:
            faults.append(f"{sql}: {outcomes}")
    return faults


def _fetched_from_cursor(conn: psycopg.Connection, sql: str, table: str) -> tuple[object, ...]:
    """``FETCH ALL`` from a cursor declared over ``sql`` in a block: its outcome (masked_outcome)."""
    conn.execute("BEGIN")
    try:
        conn.execute(f"DECLARE c CURSOR FOR {sql.replace('{t}', table)}")
        return masked_outcome(conn, "FETCH ALL FROM c", table, keys=1 if "GROUP BY" in sql else 0)
    except psycopg.Error as exc:
        return ("error", exc.sqlstate)
    finally:
        conn.execute("ROLLBACK")


def _swept(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, settings: Mapping[str, str]) -> list[str]:
    with operator_defaults(test_db, tmp_path_factory, settings) as proxy, proxy.connect() as conn:
        _dates_as_text(conn)
        search_path = str(conn.execute("SHOW search_path").fetchone())
        return _faults(conn, hides_public="public" not in search_path)


SWEPT = EVERY_ONE if os.environ.get("DPPROXY_OPERATOR_SWEEP") == "full" else ROUNDS + APART


@pytest.mark.parametrize("settings", SWEPT, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())[:60])
def test_no_operator_default_lets_one_row_decide_an_outcome_or_breaks_every_row(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
        settings: dict[str, str]) -> None:
    faults = _swept(test_db, tmp_path_factory, settings)
    assert not faults, "\n".join(faults)


def test_a_cursor_over_every_accepted_dp_form_is_decided_by_no_row(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """DECLARE ... CURSOR FOR each accepted DP form, under PostgreSQL's defaults: FETCH ALL comes
    out the same (outcome, columns, row count, keys, tag) on every neighbouring table, and
    answered as the statement itself is."""
    faults = []
    with running_proxy(test_db, tmp_path_factory, _POLICY) as proxy, proxy.connect() as conn:
        _dates_as_text(conn)
        for form in ACCEPTED_FORMS:
            outcomes = {table: _fetched_from_cursor(conn, form, table) for table in TABLES}
            if len(set(outcomes.values())) != 1 or outcomes["st0"][0] != "answer":
                faults.append(f"cursor over {form}: {outcomes}")
    assert not faults, "\n".join(faults)


@pytest.mark.parametrize("settings", ROUNDS if SWEPT is EVERY_ONE else ROUNDS[:1],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())[:60])
def test_no_operator_default_lets_one_row_decide_a_binary_copy_or_typed_parameter_answer(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
        settings: dict[str, str]) -> None:
    with operator_defaults(test_db, tmp_path_factory, settings) as proxy, proxy.connect() as conn:
        for sql in _BINARY_AND_COPY:
            outcomes = {table: _answer_form(conn, sql.replace("{t}", table)) for table in TABLES}
            assert len(set(outcomes.values())) == 1 and outcomes["st0"][0] in ("answer", "copy"), (sql, outcomes)
        for sql, values, types in _TYPED_TIMES:
            for table in TABLES:
                result = conn.pgconn.exec_params(sql.replace("{t}", table).encode(), values, types)
                assert result.status == pq.ExecStatus.TUPLES_OK, (sql, table, result.error_message)


_ANSWERED = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY)


@pytest.mark.parametrize("settings", ROUNDS if SWEPT is EVERY_ONE else ROUNDS[:2],
                         ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())[:60])
def test_a_bi_tools_statements_get_their_outcomes_under_operator_defaults(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, settings: dict[str, str]) -> None:
    # What Superset sends to introspect and chart (tests/test_bi_statements.py), catalog
    # queries read under quote_all_identifiers, bytea_output, DateStyle … included.
    people_oid = create_people(test_db)
    with operator_defaults(test_db, tmp_path_factory, settings, policy=PEOPLE_POLICY) as proxy, \
            proxy.connect(options="-c statement_timeout=20000") as conn:
        wrong = []
        for expected in load_recorded():
            result = conn.pgconn.exec_(expected.sql.replace(PEOPLE_OID, str(people_oid)).encode())
            outcome = "ok" if result.status in _ANSWERED else \
                (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode()
            if outcome != expected.outcome:
                wrong.append(f"{expected.id}: {outcome} ({result.error_message!r})")
            if conn.pgconn.transaction_status == pq.TransactionStatus.INERROR:
                conn.pgconn.exec_(b"ROLLBACK")
    assert not wrong, "\n".join(wrong)


def test_every_setting_a_role_may_set_is_tried_pinned_or_skipped_for_a_reason(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        names = {name for (name,) in admin.execute(
            "SELECT name FROM pg_settings WHERE context IN ('user', 'superuser')").fetchall()}
    assert names - set(TRIED) - set(SKIPPED) - set(PINNED_SETTINGS) == set()


def test_every_setting_a_role_may_set_on_postgresql_17_and_18_is_tried_pinned_or_skipped_for_a_reason(
        newer_pg_db: TestDatabase) -> None:
    with psycopg.connect(newer_pg_db.admin_dsn, autocommit=True) as admin:
        major = admin.info.server_version // 10000
        names = {name for (name,) in admin.execute(
            "SELECT name FROM pg_settings WHERE context IN ('user', 'superuser')").fetchall()}
    newer = {name for version, tried in TRIED_SINCE.items() if version <= major for name in tried}
    assert names - set(TRIED) - newer - set(SKIPPED) - set(PINNED_SETTINGS) - set(PINNED_WHERE_KNOWN) == set()


def test_no_operator_default_of_postgresql_17_or_18_lets_one_row_decide_an_outcome_or_breaks_every_row(
        newer_neighbours: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The first round, with the settings 17 and 18 added (``TRIED_SINCE``). Found: a
    ``transaction_timeout`` of 1 ms stopped dpproxy's start (the load's catalog queries ended
    with the connection); a longer one failed a DP statement, after its charge, when its rows
    took longer. ``restrict_nonsystem_relation_kind`` is in ``test_a_protected_view_…`` below."""
    with psycopg.connect(newer_neighbours.admin_dsn) as admin:
        major = admin.info.server_version // 10000
    settings = {**ROUNDS[0], **{name: value for version, tried in TRIED_SINCE.items() if version <= major
                                for name, value in tried.items()}}
    faults = _swept(newer_neighbours, tmp_path_factory, settings)
    assert not faults, "\n".join(faults)


_CONTRARY = {"array_nulls": "off", "client_encoding": "SQL_ASCII", "idle_session_timeout": "1",
             "exit_on_error": "on", "standard_conforming_strings": "off", "extra_float_digits": "-15",
             "default_transaction_read_only": "off", "default_transaction_deferrable": "off",
             "idle_in_transaction_session_timeout": "1", "row_security": "off", "jit_above_cost": "0",
             "default_transaction_isolation": "serializable", "lock_timeout": "1", "enable_indexonlyscan": "on",
             "plan_cache_mode": "force_generic_plan"}
_CONTRARY_WHERE_KNOWN = {"transaction_timeout": "1", "restrict_nonsystem_relation_kind": "'view'"}


def _pinned_as_a_session_has_and_returns_to(proxy: RunningProxy, pinned: Mapping[str, str]) -> None:
    shown = "SELECT " + ", ".join(f"pg_catalog.current_setting('{name}')" for name in pinned)
    with proxy.connect() as conn:
        for reset in ((), ("RESET ALL",), ("DISCARD ALL",)):
            for statement in reset:
                conn.execute(statement)
            row = conn.execute(shown).fetchone()
            assert row is not None
            assert dict(zip(pinned, row)) == pinned


def test_the_pinned_settings_of_postgresql_17_and_18_are_what_a_session_has_and_returns_to(
        newer_neighbours: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """On the code before, a service role's ``transaction_timeout`` of 1 ms stopped dpproxy's
    start: its load's first catalog query ended the connection."""
    assert set(_CONTRARY_WHERE_KNOWN) == set(PINNED_WHERE_KNOWN)
    with operator_defaults(newer_neighbours, tmp_path_factory, {**_CONTRARY, **_CONTRARY_WHERE_KNOWN}) as proxy:
        _pinned_as_a_session_has_and_returns_to(proxy, {**PINNED_SETTINGS, **PINNED_WHERE_KNOWN})


def _one_table_policy(table: str, column: str) -> str:
    """An attack policy protecting ``table`` alone, its integer ``column`` in [0, 100] a GROUP BY key."""
    return ATTACK_POLICY_HEAD + f"""
  public.{table}:
    access: protected
    epsilon: 1.0
    columns:
      {column}: {{{{bounds: [0, 100], group_by: true}}}}
"""


_VIEW_POLICY = _one_table_policy("st0_view", "i")


def _protected_view_answered_restricting_views(database: TestDatabase,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    with psycopg.connect(database.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS st0_base CASCADE")
        admin.execute("CREATE TABLE st0_base AS SELECT g AS id, g % 90 AS i FROM generate_series(1, 300) g")
        admin.execute("CREATE VIEW st0_view AS SELECT id, i FROM st0_base")
        admin.execute("GRANT SELECT ON st0_base, st0_view TO dpproxy_service")
    try:
        with operator_defaults(database, tmp_path_factory, {"restrict_nonsystem_relation_kind": "'view'"},
                               policy=_VIEW_POLICY) as proxy, proxy.connect() as conn:
            for sql in ("SELECT COUNT(*) FROM st0_view WHERE i > 50", "SELECT i, COUNT(*) FROM st0_view GROUP BY i"):
                before = spent_epsilon(conn)
                assert conn.execute(sql).fetchall()
                assert spent_epsilon(conn) == before + 1
            assert conn.execute("SHOW restrict_nonsystem_relation_kind").fetchone() == ("",)
    finally:
        with psycopg.connect(database.admin_dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE st0_base CASCADE")


def test_a_protected_view_is_answered_under_an_operator_default_restricting_views_on_postgresql_17_and_18(
        newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """``restrict_nonsystem_relation_kind = 'view'`` failed every DP statement on a protected view
    with DP004, after its charge, whatever its rows: now pinned empty where the server knows it."""
    _protected_view_answered_restricting_views(newer_pg_db, tmp_path_factory)


def test_a_protected_view_is_answered_under_an_operator_default_restricting_views_on_postgresql_15(
        pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The same on Debian's 15.18, which has the setting from a minor release (August 2024)."""
    _protected_view_answered_restricting_views(pg15_db, tmp_path_factory)


@pytest.mark.parametrize("owner", ["ROLE dpproxy_service", f"DATABASE {TEST_DATABASE}"])
def test_the_pinned_settings_are_what_a_session_has_and_returns_to(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, owner: str) -> None:
    assert set(_CONTRARY) == set(PINNED_SETTINGS)
    with operator_defaults(test_db, tmp_path_factory, _CONTRARY, owner) as proxy:
        _pinned_as_a_session_has_and_returns_to(proxy, PINNED_SETTINGS)


def test_check_config_checks_against_the_backend_under_every_pinned_setting_turned_and_a_round_of_others(
        neighbours: None, test_db: TestDatabase, tmp_path: Path) -> None:
    contrary = {"array_nulls": "off", "client_encoding": "SQL_ASCII", "idle_session_timeout": "1",
                "exit_on_error": "on", "row_security": "off", "standard_conforming_strings": "off"}
    policy = tmp_path / "policy.yaml"
    policy.write_text(_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "ledger.sqlite3"))
    with defaults_set(test_db, {**ROUNDS[0], **contrary}):
        run = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(policy)],
                             capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checked against the backend" in run.stdout


def test_a_histogram_is_answered_under_an_operator_default_of_no_array_nulls(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # A histogram's release query takes its noised values as a text array with NULL elements:
    # under array_nulls = off they were the text "NULL", and every histogram failed with 22P02.
    with operator_defaults(test_db, tmp_path_factory, {"array_nulls": "off"}) as proxy, proxy.connect() as conn:
        assert len(conn.execute("SELECT s, COUNT(*) FROM st0 GROUP BY s").fetchall()) == 2


def test_dpproxy_starts_under_an_operator_default_client_encoding_of_sql_ascii(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The policy's load read the backend's answers unconverted and refused every column.
    with operator_defaults(test_db, tmp_path_factory, {"client_encoding": "SQL_ASCII"}) as proxy, \
            proxy.connect() as conn:
        assert conn.info.parameter_status("client_encoding") == "UTF8"
        assert conn.execute("SELECT COUNT(*) FROM st0").fetchone() is not None


def test_pooled_connections_outlive_an_operator_idle_session_timeout(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # idle_session_timeout = 1 (ms) ended the load between its catalog queries; set longer, it
    # ends the pool's idle connections between two statements of a session.
    with operator_defaults(test_db, tmp_path_factory, {"idle_session_timeout": "1"}) as proxy, proxy.connect() as conn:
        for _ in range(3):
            assert conn.execute("SELECT COUNT(*) FROM st0").fetchone() is not None
            time.sleep(0.05)


def test_an_analysts_error_does_not_end_the_session_under_an_operator_exit_on_error(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # exit_on_error = on made PostgreSQL end its connection at any error: the client saw
    # 08006 at SELECT 1/0 and its session was closed.
    with operator_defaults(test_db, tmp_path_factory, {"exit_on_error": "on"}) as proxy, proxy.connect() as conn:
        for block in (False, True):
            if block:
                conn.execute("BEGIN")
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1 / 0")
            if block:
                conn.execute("ROLLBACK")
            assert conn.execute("SELECT COUNT(*) FROM st0").fetchone() is not None


def test_a_temp_file_limit_dpproxy_cannot_pin_that_fails_its_load_refuses_to_start(
        neighbours: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Only a superuser can set temp_file_limit; a limit dpproxy's catalog queries reach stops
    # it at startup, naming the cause, rather than failing later statements.
    with pytest.raises(StartupError, match="temp_file_limit"):
        with operator_defaults(test_db, tmp_path_factory, {"work_mem": "64", "temp_file_limit": "0"}):
            pass


_RLS_POLICY = _one_table_policy("rls0", "v")


def test_a_protected_table_under_row_security_is_answered_under_an_operator_default_of_row_security_off(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # row_security = off does not bypass a policy: PostgreSQL fails every query the policy
    # would filter (42501), and dpproxy had charged each DP query before it failed.
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS rls0")
        admin.execute("CREATE TABLE rls0 (id int8 PRIMARY KEY, v int4)")
        admin.execute("INSERT INTO rls0 SELECT g, g % 100 FROM generate_series(1, 300) g")
        admin.execute("ALTER TABLE rls0 ENABLE ROW LEVEL SECURITY")
        admin.execute("CREATE POLICY under_50 ON rls0 FOR SELECT USING (v < 50)")
        admin.execute("GRANT SELECT ON rls0 TO dpproxy_service")
        try:
            with operator_defaults(test_db, tmp_path_factory, {"row_security": "off"}, policy=_RLS_POLICY) as proxy, \
                    proxy.connect() as conn:
                for sql in ("SELECT COUNT(*) FROM rls0", "SELECT v, COUNT(*) FROM rls0 GROUP BY v"):
                    assert conn.execute(sql).fetchall()
                assert conn.execute("SHOW row_security").fetchone() == ("on",)
        finally:
            admin.execute("DROP TABLE rls0")


def test_a_pin_the_server_lacks_after_all_is_left_out_and_the_connection_opened(
        test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server of a version said to have a setting it lacks (a fork, a build without a minor
    release's change) fails a connection naming it: it is left out, for that DSN, and the
    connection opened without it."""
    import asyncio

    from proxy.backend import pool
    from tests.conftest import make_policy

    monkeypatch.setattr(pool, "_SINCE", {**pool._SINCE, "transaction_timeout": {16: 0}})
    monkeypatch.setattr(pool, "_known_pins", {})
    config = make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY).backend

    async def opened_twice() -> list[str | None]:
        shown = []
        for _ in range(2):
            conn = await pool.open_backend(config)
            cursor = await conn.execute("SELECT pg_catalog.current_setting('transaction_timeout', true)")
            shown.append((await cursor.fetchone() or (None,))[0])
            await conn.close()
        return shown

    assert asyncio.run(opened_twice()) == [None, None]  # pgserver's 16.2 has no such setting
    version, pins = pool._known_pins[config.dsn or ""]
    assert version // 10000 == 16 and "transaction_timeout" not in pins


def test_a_first_connection_ended_in_its_own_start_is_opened_again_with_every_pin(
        newer_pg_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A DSN's first connection starts without ``PINNED_WHERE_KNOWN`` (the server's version is not
    known yet). Under a role's ``transaction_timeout`` of 1 ms, on a loaded machine, PostgreSQL 18
    ended it within its own start ("terminating connection due to transaction timeout", seen
    once in this file's sweep): dpproxy failed to start. That start's timing cannot be had on demand, so the first attempt is failed here as
    it failed there; the connection is then opened again with every pin, on the real server."""
    import asyncio

    from proxy.backend import pool
    from tests.conftest import make_policy

    monkeypatch.setattr(pool, "_known_pins", {})
    config = make_policy(newer_pg_db, tmp_path / "ledger.sqlite3", _POLICY).backend
    real_connect, attempts = pool._connect, []

    async def ended_once(config, settings, versioned):  # type: ignore[no-untyped-def]
        attempts.append(versioned)
        if len(attempts) == 1:
            raise psycopg.OperationalError("FATAL:  terminating connection due to transaction timeout")
        return await real_connect(config, settings, versioned)

    monkeypatch.setattr(pool, "_connect", ended_once)

    async def first_connections_setting() -> str | None:
        conn = await pool.open_backend(config)
        try:
            cursor = await conn.execute("SELECT pg_catalog.current_setting('transaction_timeout')")
            return (await cursor.fetchone() or (None,))[0]
        finally:
            await conn.close()

    with defaults_set(newer_pg_db, {"transaction_timeout": "'5min'"}):
        assert asyncio.run(first_connections_setting()) == "0"
    assert attempts == [frozenset(), frozenset(PINNED_WHERE_KNOWN)]
