"""Stop 42: what changed last stop (the lock step's pipeline, Metabase's binning, the stored-form
check, the pinned ``enable_indexonlyscan``, quoted policy keys), attacked by someone other than
its author.

Found and fixed, pinned here:

* A protected view's column computed from a value of any length (``btrim(note)``,
  ``length(note)``, ``payload::text`` of a jsonb, ``CASE WHEN note > 'm' THEN 1 END``, the same in a
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
  that passes the stored value on (a rename, a binary-compatible cast, ``COLLATE``), a column
  computed from fixed-length values (``id::text``, ``hours::numeric``, ``CASE WHEN hours > 2``), and
  an aggregate's or window function's arguments (computed once a row, before any reference) are
  accepted as before. PostgreSQL 18's virtual generated column is computed at each reference too:
  one computed from a value of any length (``btrim(note)``) refuses its table the same way.

Found and left open, pinned by a strict xfail: a view's own WHERE (``note > ''``), join condition,
GROUP BY key or aggregate over a text column reads each row's value whole once a statement, with no
bound (one 3.2 MB row: ~400 buffers, 2–6 ms); the design is in docs/threat-model.md.

Tried, and held:

* (listed below as each class is pinned)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from rewriter.text_bounds import in_line_text
from tests.conftest import ATTACK_POLICY_HEAD, TestDatabase, make_policy, refused_at_load, running_proxy, spent_epsilon
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
