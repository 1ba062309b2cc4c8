"""Stop 42: what changed last stop (the lock step's pipeline, Metabase's binning, the stored-form
check, the pinned ``enable_indexonlyscan``, quoted policy keys), attacked by someone other than
its author.

Found and fixed, pinned here:

* A protected view's column computed from a value of any length (``btrim(note)``,
  ``length(note)``, ``payload::text`` of a jsonb, ``CASE WHEN note > 'm' THEN 1 END``, a whole row
  ``s42_base AS r``, which PostgreSQL builds fetching each value stored apart; the same in a
  flattened CTE or subquery) is computed by PostgreSQL again at each reference a statement makes to
  it: the view is flattened into the statement, so each term of the analyst's conditions reads the
  base column's whole value again. The value bound and the stored-form check
  (rewriter/text_bounds.py) read only the header of the value they are given, which for such a
  column is the computed value, in memory: a 250-byte text stored apart read as a value in the row
  (``pg_column_size`` of ``btrim(t)`` is 254 where the table's is 250) and was fetched again by
  every reference (64 OR'ed comparisons read ~500 buffers more on the view over the table holding
  that row than over the one without it), and a 3 MB text was read whole for every term before the
  bound could see its size (four OR'ed comparisons of ``btrim(t)`` on 1,000 rows: 2 ms, and 90 ms
  with one 3.2 MB row). An integer column computed so (``length(note)``) multiplied the same read
  with no bound at all. A timing oracle on one row's presence from one statement, within every
  limit, on a table without ``answer_quantum_ms``: the levers the value bound and the stored-form
  check closed on tables, back on views. Such a view is now refused at start, reload and
  ``check-config``, and a view redefined so while dpproxy runs is refused before the charge
  (proxy/backend/row_failures.py, as for a view that computes what can fail on a row). A column
  that passes the stored value on (a rename, a binary-compatible cast, ``COLLATE``, a ``CASE``'s or
  ``COALESCE``'s result), a column
  computed from fixed-length values (``id::text``, ``hours::numeric``, ``CASE WHEN hours > 2``), and
  an aggregate's or window function's arguments (computed once a row, before any reference) are
  accepted as before. PostgreSQL 18's virtual generated column is computed at each reference too:
  one computed from a value of any length (``btrim(note)``) refuses its table the same way.

Found and left open, pinned by a strict xfail: a view's own WHERE (``note > ''``), join condition,
GROUP BY key or aggregate over a text column reads each row's value whole once a statement, with no
bound (one 3.2 MB row: ~400 buffers, 2–6 ms); the design is in docs/threat-model.md.

Tried, and held:

* ``enable_indexonlyscan``, pinned off: ``SET`` in any case and quoted, ``SET LOCAL`` in a block,
  ``SET … TO DEFAULT``, ``set_config`` by a literal, by a computed name and schema-qualified are
  refused (42501); ``RESET ALL``, ``DISCARD ALL``, ``RESET enable_indexonlyscan`` and the pool's
  re-application after a session's SET return to the pin; ``options=-c enable_indexonlyscan=on``
  is not applied. The analyst can create no function, view or table (read-only, temporary
  tables refused) whose own ``SET`` clause could carry it; parallel workers take the leader's.
* Names of a protected table: quoted, upper case unquoted, schema-qualified in any quoting: each is
  the protected table (rows refused, counts charged); ``U&""`` escapes name it too and are refused
  before the charge (the DP analyser does not read them); ``pg_temp.``, the wrong quoted case and a
  near name are no relation.
* Metabase's numeric binning beside a row of 16,383 fraction digits (stored in a few bytes, so read
  in the row), whose numeric division runs to that scale: the same bins, no error, the same charge
  (and no time above the noise in PostgreSQL: 10,000 rows, 8–13 ms with and without the row).
* Examined without a test of its own (the code read, and PostgreSQL's behaviour checked by hand):
  the lock step's ``LIMIT 0`` runs no plan node, so an initplan, a ``LIMIT``/``OFFSET`` count
  (evaluated at the first fetch: dpproxy takes only non-negative integer literals, rewriter/dp_query.py)
  and every per-row expression wait for the run; the planner's index endpoint probe
  (``get_actual_variable_range``) reads the index's extreme entry in both, and no value read there
  makes it raise;
  a step's failure is refunded only when libpq reports the run PIPELINE_ABORTED, and a lost
  connection counts as the step's only when no step result arrived after the Flush; the run's
  ``floor()`` index cannot fail within the bounds (overflow refused from the text, underflow given
  its index), and a ``real`` column's arithmetic resolves to ``double precision``
  (``real - numeric``), as the index set assumes. The stored-form check on a computed value is the
  hole above.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from rewriter.text_bounds import in_line_text
from tests.conftest import (ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy,
                            spent_epsilon)
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.buffer_hits import buffer_hits
from tests.post_charge_wait import LONG_TEXT, keep_apart, store_apart

_VIEW_POLICY = ATTACK_POLICY_HEAD + """\
  public.s42_view:
    access: protected
    epsilon: 1.0
    columns:
      id: {{bounds: [0, 1000]}}
"""


@contextmanager
def _view(test_db: TestDatabase, view: str) -> Iterator[psycopg.Connection]:
    """s42_base (id, hours, note text, payload jsonb) and the view s42_view over it (``view``)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS s42_base CASCADE")
        admin.execute("CREATE TABLE s42_base AS SELECT g AS id, g % 5 + 1 AS hours, g::text AS note, "
                      "pg_catalog.jsonb_build_object('g', g) AS payload FROM generate_series(1, 200) g")
        admin.execute(f"CREATE VIEW s42_view AS {view}")
        admin.execute("GRANT SELECT ON s42_base, s42_view TO dpproxy_service")
        try:
            yield admin
        finally:
            admin.execute("DROP TABLE IF EXISTS s42_base CASCADE")


_REREADING_VIEWS = [
    ("SELECT id, btrim(note) AS note FROM s42_base", "note"),
    ("SELECT id, rtrim(note) AS trimmed, hours FROM s42_base", "trimmed"),
    ("SELECT id, length(note) AS l FROM s42_base", "l"),
    ("SELECT id, payload::text AS p FROM s42_base", "p"),
    ("SELECT id, CASE WHEN note > 'm' THEN 1 END AS late FROM s42_base", "late"),
    ("SELECT id, COALESCE(btrim(note), '') AS c FROM s42_base", "c"),
    ("SELECT id, CASE note WHEN 'a' THEN note END AS c FROM s42_base", "c"),
    ("SELECT id, CASE WHEN hours > 2 THEN ltrim(note) ELSE note END AS c FROM s42_base", "c"),
    ("SELECT id, COALESCE(note, payload::text) AS c FROM s42_base", "c"),
    ("SELECT id, s42_base AS r FROM s42_base", "r"),  # a whole row, built (values stored apart fetched) at each reference
    ("WITH w AS (SELECT id, ltrim(note) AS x FROM s42_base) SELECT id, x FROM w", "x"),
    ("SELECT id, x FROM (SELECT id, btrim(note) AS x FROM s42_base) AS s", "x"),
    ("SELECT id, note FROM s42_base UNION ALL SELECT id, btrim(note) FROM s42_base", "btrim"),
]


@pytest.mark.parametrize(("view", "column"), _REREADING_VIEWS)
def test_a_protected_view_column_computed_from_a_value_of_any_length_is_refused_at_load(
        test_db: TestDatabase, tmp_path: Path, view: str, column: str) -> None:
    """PostgreSQL computes such a column at each reference, reading the base value whole each
    time before dpproxy's bound sees the computed value's size: refused, naming the column."""
    with _view(test_db, view):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _VIEW_POLICY))
    assert len(problems) == 1, problems
    assert problems[0].startswith("tables.public.s42_view: view s42_view computes its column "), problems
    assert f"column {column} from a value of a type of any length" in problems[0], problems
    assert "each reference" in problems[0] and "materialized view" in problems[0], problems


@pytest.mark.parametrize(("view", "column"), [_REREADING_VIEWS[0], _REREADING_VIEWS[6]])
def test_a_protected_view_column_computed_from_a_value_of_any_length_is_refused_at_load_on_postgresql_17_and_18(
        newer_pg_db: TestDatabase, tmp_path: Path, view: str, column: str) -> None:
    """Their stored parse trees carry fields 16's do not: the output columns are found alike."""
    test_a_protected_view_column_computed_from_a_value_of_any_length_is_refused_at_load(newer_pg_db, tmp_path, view, column)


def _until(done: Callable[[], bool], seconds: float = 60.0) -> None:
    """Wait for the periodic re-check to see a change (``done``), polling; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not done():
        assert time.monotonic() < deadline, "the re-check never saw the change"
        time.sleep(0.1)


def test_a_view_redefined_to_compute_a_column_from_a_value_of_any_length_is_refused_before_the_charge(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The periodic re-check finds it (``CREATE OR REPLACE VIEW`` while dpproxy runs): statements
    on the view are refused, uncharged, until it passes the stored value on again."""
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    with _view(test_db, "SELECT id, note FROM s42_base") as admin, \
            running_proxy(test_db, tmp_path_factory, _VIEW_POLICY) as proxy, proxy.connect() as conn:
        conn.execute("SELECT count(*) FROM s42_view WHERE note > 'a'")
        admin.execute("CREATE OR REPLACE VIEW s42_view AS SELECT id, btrim(note) AS note FROM s42_base")
        _until(lambda: bool(proxy.server.registry.fallible))
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
            conn.execute("SELECT count(*) FROM s42_view WHERE note > 'a'")
        assert "computes again at each reference" in str(refused.value), str(refused.value)
        assert "view s42_view computes its column note from a value of a type of any length (rule: row-failure)" \
            in str(refused.value), str(refused.value)
        assert spent_epsilon(conn) == before
        admin.execute("CREATE OR REPLACE VIEW s42_view AS SELECT id, note FROM s42_base")
        _until(lambda: not proxy.server.registry.fallible)
        assert conn.execute("SELECT count(*) FROM s42_view WHERE note > 'a'").fetchone() is not None


_PASSING_VIEWS = [
    "SELECT id, note, payload FROM s42_base",
    "SELECT id, note::varchar AS v, note COLLATE \"C\" AS c FROM s42_base",
    "SELECT id, CASE WHEN hours > 2 THEN note END AS consented, COALESCE(note, '') AS c FROM s42_base",
    "SELECT id, id::text AS t, hours::numeric AS n, CASE WHEN hours > 2 THEN 'many' END AS k FROM s42_base",
    "SELECT hours AS id, count(*) AS rows, max(note) AS last, min(btrim(note)) AS first FROM s42_base GROUP BY hours",
    "SELECT id, count(*) OVER (PARTITION BY hours ORDER BY id) AS running FROM s42_base WHERE note <> 'x'",
]


@pytest.mark.parametrize("view", _PASSING_VIEWS)
def test_a_protected_view_passing_stored_values_on_is_answered(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, view: str) -> None:
    """A rename, a binary-compatible cast and COLLATE pass the stored value on (its header is the
    table's); fixed-length values cost the same whatever the row; an aggregate's and a window's
    arguments, and the view's own WHERE, are read once a row."""
    with _view(test_db, view), running_proxy(test_db, tmp_path_factory, _VIEW_POLICY) as proxy, proxy.connect() as conn:
        assert conn.execute("SELECT count(*) FROM s42_view WHERE id > 2").fetchone() is not None


def test_a_computed_view_column_reads_its_base_value_at_every_reference(test_db: TestDatabase) -> None:
    """The premise of the refusal, on PostgreSQL itself: over a view of ``btrim(t)``, the stored-form
    check reads a value the table stores apart as one in the row, and each of 64 OR'ed comparisons
    of the bounded column, as dpproxy's backend SQL writes them, fetches it again; over the table's
    own column the check reads it as NULL and it is fetched at most once."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("SET jit = off")
        for kind in ("flat", "apart"):
            admin.execute(f"DROP TABLE IF EXISTS s42_{kind} CASCADE")
            admin.execute(f"CREATE TABLE s42_{kind} (id int, t text)")
            admin.execute(f"INSERT INTO s42_{kind} SELECT g, 'row ' || g FROM generate_series(1, 100) g")
        keep_apart(admin, "s42_flat", "t")
        admin.execute("INSERT INTO s42_flat SELECT 0, 'row 0', 'x'")
        store_apart(admin, "s42_apart", "t", f"0, {LONG_TEXT}", most=256)
        hits = {}
        for kind in ("flat", "apart"):
            admin.execute(f"CREATE VIEW s42_{kind}_view AS SELECT id, btrim(t) AS t FROM s42_{kind}")
            for source in (f"s42_{kind}", f"s42_{kind}_view"):
                bounded = (f"(SELECT CASE WHEN octet_length(t) <= 256 AND {in_line_text('t')} THEN t END AS t "
                           f"FROM {source}) AS s")
                terms = " OR ".join(f"t > 'z{i}'" for i in range(64))
                hits[source] = buffer_hits(admin, f"SELECT count(*) FROM {bounded} WHERE {terms}")
            read = admin.execute(f"SELECT {in_line_text('t')} FROM s42_{kind}_view WHERE id = 0").fetchone()
            assert read == (True,), read  # the computed value's header: in the row, whatever the table's
        for kind in ("flat", "apart"):
            admin.execute(f"DROP TABLE s42_{kind} CASCADE")
    assert hits["s42_apart"] - hits["s42_flat"] <= 2, hits
    assert hits["s42_apart_view"] - hits["s42_flat_view"] > 64, hits


@pytest.mark.xfail(strict=True, reason="left open: a protected view's WHERE, join condition, GROUP BY or aggregate "
                   "reads a long value whole once a statement (docs/threat-model.md, stop 42)")
def test_a_protected_view_whose_conditions_read_a_long_value_whole_is_refused_at_load(
        test_db: TestDatabase, tmp_path: Path) -> None:
    """A view's own WHERE (``note > ''``) reads each row's value whole, before the analyst's
    conditions (PostgreSQL ran it first: ``Filter: ((note > ''::text) AND (id > 5))``), once a
    statement: one 3.2 MB row added ~400 buffers and 2–6 ms to ``count(*) … WHERE id > 5`` on
    1,000 rows. Not multiplied by the analyst's terms, as an output column is (refused above), but
    not bounded either, as a table's values are; the same for a join condition, a GROUP BY key or
    ``max(note)`` over a text column. Refusing them at load takes the gate view that
    tests/post_charge_wait.py places its post-charge wait with (``v >= ''``), so it is pinned here."""
    with _view(test_db, "SELECT id FROM s42_base WHERE note > ''"):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _VIEW_POLICY))
    assert problems and "note" in problems[0], problems


def test_a_virtual_generated_column_computed_from_a_value_of_any_length_refuses_its_table_at_load(
        pg18_db: TestDatabase, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """PostgreSQL 18 computes a virtual generated column at each reference, as a flattened view's:
    ``btrim(note)`` is refused; ``note`` itself and ``length`` of a fixed-length value are not."""
    policy = ATTACK_POLICY_HEAD + "  public.s42_gen:\n    access: protected\n    epsilon: 1.0\n"
    with psycopg.connect(pg18_db.admin_dsn, autocommit=True) as admin:
        for column, refused in (("g text GENERATED ALWAYS AS (btrim(note))", True),
                                ("g text GENERATED ALWAYS AS (note COLLATE \"C\")", False),
                                ("g text GENERATED ALWAYS AS (id::text)", False)):
            admin.execute("DROP TABLE IF EXISTS s42_gen")
            admin.execute(f"CREATE TABLE s42_gen (id int, note text, {column})")
            admin.execute("GRANT SELECT ON s42_gen TO dpproxy_service")
            try:
                if refused:
                    (problem,) = refused_at_load(make_policy(pg18_db, tmp_path / "ledger.sqlite3", policy))
                    assert problem.startswith("tables.public.s42_gen: virtual generated column g of s42_gen is computed "
                                              "from a value of a type of any length"), problem
                else:
                    with running_proxy(pg18_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
                        assert conn.execute("SELECT count(*) FROM s42_gen WHERE g > 'a'").fetchone() is not None
            finally:
                admin.execute("DROP TABLE s42_gen")


# ------------------------------------------------------------------ tried, and held

_HELD_POLICY = ATTACK_POLICY_HEAD + """\
  public.s42_keys:
    access: protected
    epsilon: 1.0
    columns:
      n: {{bounds: [0, 100], group_by: true}}
"""
# A base table and a neighbour whose one more row holds 5 with 16,383 fraction digits (a few bytes
# stored: trailing zeros are a display scale, read in the row), which Metabase's numeric division
# computes to that scale.
_DSCALE_ROW = "(CAST('5.' || repeat('0', 16383) AS numeric))"


@pytest.fixture(scope="module")
def held_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "s42_keys", {"s42_dscale": _DSCALE_ROW}, "(n numeric)",
                      "SELECT g % 100 FROM generate_series(1, 300) g")
    policy = _HELD_POLICY + "  public.s42_dscale:\n    access: protected\n    epsilon: 1.0\n    columns:\n" \
                            "      n: {{bounds: [0, 100], group_by: true}}\n"
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


@pytest.mark.parametrize("attempt", [
    "SET enable_indexonlyscan = on", "SET LOCAL enable_indexonlyscan = on", 'SET "ENABLE_INDEXONLYSCAN" TO on',
    "SET SESSION enable_indexonlyscan TO DEFAULT", "SELECT set_config('enable_indexonlyscan', 'on', false)",
    "SELECT set_config('enable_' || 'indexonlyscan', 'on', false)", "SELECT pg_catalog.set_config('ENABLE_INDEXONLYSCAN', 'on', true)",
])
def test_a_client_cannot_turn_index_only_scans_back_on(held_proxy: RunningProxy, attempt: str) -> None:
    """``enable_indexonlyscan`` is pinned off (proxy/backend/pool.py): SET in any case, quoted, LOCAL in
    a block, SET TO DEFAULT and set_config by a literal or a computed name are refused; the backend
    keeps it off."""
    with held_proxy.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with conn.transaction():
                conn.execute(attempt)
        assert conn.execute("SHOW enable_indexonlyscan").fetchone() == ("off",)


@pytest.mark.parametrize("reset", ["RESET ALL", "DISCARD ALL", "RESET enable_indexonlyscan", "SET search_path = public"])
def test_a_reset_returns_index_only_scans_to_the_pinned_off(held_proxy: RunningProxy, reset: str) -> None:
    """RESET returns to the connection's startup value, which is the pin; so does the pool's
    re-application of a session's settings on checkout (the SET first moves them)."""
    with held_proxy.connect() as conn:
        conn.execute("SET application_name = 's42'")
        conn.execute(reset)
        assert conn.execute("SHOW enable_indexonlyscan").fetchone() == ("off",)
        assert conn.execute("SELECT count(*) FROM s42_keys WHERE n > 3").fetchone() is not None


def test_a_startup_option_cannot_turn_index_only_scans_back_on(held_proxy: RunningProxy) -> None:
    """``options=-c enable_indexonlyscan=on`` (PGOPTIONS) is not applied, with a warning."""
    with psycopg.connect(held_proxy.dsn(), autocommit=True, options="-c enable_indexonlyscan=on") as conn:
        assert conn.execute("SHOW enable_indexonlyscan").fetchone() == ("off",)


_SPELLINGS = ['U&"s42\\005fkeys"', '"s42_keys"', 'public."s42_keys"', '"public"."s42_keys"',
              'U&"!0073!0034!0032_keys" UESCAPE \'!\'', "PUBLIC.S42_KEYS"]


@pytest.mark.parametrize("name", _SPELLINGS)
def test_every_spelling_of_a_protected_tables_name_is_answered_under_its_policy(held_proxy: RunningProxy,
                                                                               name: str) -> None:
    """Quotes, case and the schema: each names the protected table, whose rows are never passed
    through (``SELECT n``) and whose count is charged (a threshold of its own per spelling: a
    repeat is answered from the store, uncharged). Unicode escapes name it too, and the DP
    analyser, which does not read them, refuses the count before the charge."""
    with held_proxy.connect() as conn:
        with pytest.raises(psycopg.errors.DatabaseError):
            conn.execute(f"SELECT n FROM {name}").fetchall()
        before = spent_epsilon(conn)
        count = f"SELECT count(*) FROM {name} WHERE n > {_SPELLINGS.index(name) + 10}"
        if name.startswith("U&"):  # named as the protected table, and not analysed: refused, uncharged
            with pytest.raises(psycopg.DatabaseError, match="on protected table s42_keys"):
                conn.execute(count)
            assert spent_epsilon(conn) == before
        else:
            conn.execute(count).fetchone()
            assert spent_epsilon(conn) > before


@pytest.mark.parametrize("name", ["pg_temp.s42_keys", 'U&"s42\\005fkeyz"', '"S42_KEYS"'])
def test_a_name_that_is_not_the_protected_table_never_reaches_it(held_proxy: RunningProxy, name: str) -> None:
    """pg_temp (no temporary table can be made), another name, the wrong case quoted: no such relation."""
    with held_proxy.connect() as conn:
        with pytest.raises(psycopg.errors.UndefinedTable):
            conn.execute(f"SELECT count(*) FROM {name}").fetchone()


@pytest.mark.parametrize("key", ["floor((n - 0.5) / 33.333333333333333333333333333333333333)", "floor(n / 7)",
                                 "floor((n - 1e-100) / 0.3) * 0.3 + 1e-100"])
def test_metabase_binning_beside_a_row_of_16383_fraction_digits(held_proxy: RunningProxy, key: str) -> None:
    """A value of 16,383 fraction digits (a few bytes stored, so read) takes a numeric division
    to that scale: the same bins, no error, the same charge."""
    with held_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, f"SELECT {key} AS k, count(*) FROM {{t}} GROUP BY {key} ORDER BY {key}",
                                     ("s42_keys", "s42_dscale"), spent_epsilon, keys=1)
    assert outcome[0] == "answer", outcome
