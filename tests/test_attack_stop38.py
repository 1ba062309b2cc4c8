"""Stop 38's constructs attacked on neighbouring tables: identical aggregates as one release,
pg_database rewritten as a subquery of its columns, attribute notation on a value.

The DP statements run on ``s38_0`` and on stop 36's twelve adversarial neighbours (NULLs, NaN,
±Infinity, integer limits, numerics of 1,000 and 131,072 digits, 1e-16383, -0.0, subnormals,
values on and just past the bounds, a 3 MB TOASTed and a 400 kB multibyte text). What the
analyst sees but the noised values (outcome, SQLSTATE, message and hint, columns and types,
rows, the tag, the notice with numbers masked, binary and COPY framing, a cursor's fetches)
must be the same on all, and a refusal costs nothing.

Held, and pinned here:

* Which aggregates are one release (``proxy.dp.release_units``) is read from the plan: the
  same on every neighbour, for duplicates spelled apart (``count(*)``/``count(1)``, a FILTER and
  its CASE, casts of the argument, a fraction written ``0.5``/``.5``/``5e-1``/``0.50`` or bound,
  ASC p and DESC 1 − p), under a FILTER that only one neighbour's row meets, per cell, in
  post-processing, in binary, COPY and a cursor. One release's value is encoded for each
  column's own type (``sum(a::float8), sum(a)``: the mechanism is the column's, so the value
  fits both).
* The module's one-entry memo of the last grouping is keyed by the aggregates' identity and
  holds them: two sessions alternating statements of different groupings, concurrently (one
  release drawn on a release thread), and two portals of one session bound before either runs,
  each get their own statement's split, notice and charge.
* δ is charged once per sample-and-aggregate release; a statement with a duplicate is not a
  repeat of the statement without it, and its repeat carries one value in both columns.
* pg_database's frozen ids are 0 in every spelling (qualified, aliased, ``*``, the whole row,
  ``row_to_json``, ``to_jsonb``, a CTE, a join with pg_class, a subquery, another search_path,
  extended protocol, COPY and a cursor), and every transaction id, WAL position or row address
  column of a relation on the catalog allowlist of 16, 17 and 18 reads 0 or no row.
* Attribute notation on a value: every function PostgreSQL could call for ``(value).name``
  (``name`` one that passes the function check) is read from the live pg_proc of 16, 17 and 18
  and tried through dpproxy with an argument of its type: each that runs is immutable or reads
  only the session's settings, the catalog or the transaction's start (``_SETTINGS_ONLY``), and
  ``age`` is refused for every argument type.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from proxy.dp.answer import selection_candidates
from proxy.serving.executor import _OFF_LOOP_CANDIDATES
from rewriter.catalog import allowed_catalog_relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.function_check import HARMLESS_FIELD_FUNCTIONS
from tests.conftest import (ATTACK_POLICY_HEAD, TEST_POLICY, RunningProxy, TestDatabase, make_policy,
                            running_proxy, spent_epsilon)
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.test_attack_stop36 import (_BASE_ROWS, _DDL, _NEIGHBOURS, _TABLE, _binary_outcome, _copy_outcome,
                                      _cursor_outcome)
from tests.wire import SYNC, Wire, bind, data_row_values, execute, parse

_N38 = {name.replace("s36", "s38"): row for name, row in _NEIGHBOURS.items()}
_NAMES = ("s38_0", *_N38)
_POLICY = ATTACK_POLICY_HEAD + "  public.s38_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _N38)
_SAME = "the same release as"


@pytest.fixture(scope="module")
def s38_tables(test_db: TestDatabase) -> TestDatabase:
    create_neighbours(test_db.admin_dsn, "s38_0", _N38, _DDL, _BASE_ROWS)
    return test_db


@pytest.fixture(scope="module")
def s38(s38_tables: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(s38_tables, tmp_path_factory, _POLICY) as running:
        yield running


def _same(proxy: RunningProxy, sql: str, params: tuple[object, ...] | None = None) -> tuple[object, ...]:
    with proxy.connect() as conn:
        keys = 1 if "GROUP BY" in sql and ("ORDER BY" not in sql or "ORDER BY 1" in sql) else 0
        return same_on_neighbours(conn, sql, _NAMES, spent_epsilon, keys, params)


# ------------------------------------------------------------------ identical aggregates

_P = "percentile_{}({}) WITHIN GROUP (ORDER BY {})"
# Each statement, and how many of its columns the notice calls the same release as another.
DUPLICATES = [
    ("SELECT count(*), count(*) FROM {t}", 1),
    ("SELECT count(*), count(1), count(id) FROM {t}", 1),  # count(id) counts a column: its own release
    ("SELECT sum(a), sum(a::int8), sum(a::numeric), sum(a::float8) FROM {t}", 3),
    ("SELECT sum(a::float8), sum(a), sum(b::float8), sum(b) FROM {t}", 2),
    ("SELECT avg(a::float8), avg(a), avg(a::numeric) FROM {t}", 2),
    ("SELECT avg(n2::float8), avg(n2), max(n2::float8), max(n2) FROM {t}", 2),
    ("SELECT min(b), max(b), min(b), min(b::numeric) FROM {t}", 2),
    ("SELECT max(fe), max(fe), min(fe), sum(fe), sum(fe) FROM {t}", 2),
    ("SELECT sum(r), sum(r), sum(r::float8), sum(nt::float8), sum(nt) FROM {t}", 3),
    ("SELECT sum(c), sum(c) FILTER (WHERE true), sum(c) FROM {t}", 1),
    ("SELECT avg(nw), avg(nw), sum(fw), sum(fw) FROM {t}", 2),
    (f"SELECT {_P.format('cont', '0.5', 'b')}, {_P.format('cont', '.5', 'b')}, {_P.format('cont', '5e-1', 'b')}, "
     f"{_P.format('cont', '0.50', 'b')}, {_P.format('cont', '0.5::float8', 'b')} FROM {{t}}", 4),
    (f"SELECT {_P.format('cont', '0.5', 'n')}, {_P.format('cont', '0.5', 'n DESC')}, "
     f"{_P.format('disc', '0.3', 'n')}, {_P.format('disc', '0.7', 'n DESC')} FROM {{t}}", 2),
    (f"SELECT {_P.format('disc', '0.5', 'b::float8')}, {_P.format('disc', '0.5', 'b')} FROM {{t}}", 1),
    (f"SELECT {_P.format('cont', '0.5', 'c')}, {_P.format('cont', 'ARRAY[0.5]', 'c')}, "
     f"{_P.format('cont', 'ARRAY[0.25, 0.75]', 'c')}, {_P.format('cont', 'ARRAY[0.75, 0.25]', 'c')}, "
     f"{_P.format('cont', 'ARRAY[.25, 75e-2]', 'c')} FROM {{t}}", 1),
    ("SELECT count(*) FILTER (WHERE s = 'a'), count(CASE WHEN s = 'a' THEN 1 END), "
     "sum(CASE WHEN s = 'a' THEN 1 ELSE 0 END) FROM {t}", 2),
    ("SELECT count(DISTINCT s), count(DISTINCT s), count(s), count(s) FROM {t}", 2),
    ("SELECT mode() WITHIN GROUP (ORDER BY s), mode() WITHIN GROUP (ORDER BY s) FROM {t}", 1),
    # conditions only one neighbour's row meets (s38_2's 'zz' and NaN, s38_3's and s38_5's extremes)
    ("SELECT count(*) FILTER (WHERE s = 'zz'), count(*) FILTER (WHERE s = 'zz') FROM {t}", 1),
    ("SELECT sum(n) FILTER (WHERE n > 1e300), sum(n) FILTER (WHERE n > 1e300), avg(f) FILTER (WHERE f > 1e300), "
     "avg(f) FILTER (WHERE f > 1e300) FROM {t}", 2),
    ("SELECT sum(f) FILTER (WHERE f = 'NaN'), sum(CASE WHEN f = 'NaN' THEN f ELSE 0 END), "
     "min(a) FILTER (WHERE a = 32767), min(a) FILTER (WHERE a = 32767) FROM {t}", 2),
    ("SELECT avg(n), avg(n), stddev(n), avg(n), variance(n) FROM {t}", 0),  # the AVGs from the moments
    # post-processing: an outer statement over the releases, HAVING and ORDER BY on a duplicate
    ("SELECT count(*) * 2, count(*), count(*) + 0 FROM {t}", 0),
    ("SELECT count(*), count(*) FROM {t} HAVING count(*) > 0", 0),
    ("SELECT sum(b) AS x, sum(b) AS y, sum(b) - sum(b) FROM {t} ORDER BY 1", 0),
    # per cell of a histogram
    ("SELECT s, count(*), count(*) FROM {t} GROUP BY s", 0),
    ("SELECT s, sum(b) FILTER (WHERE a > 0), sum(CASE WHEN a > 0 THEN b ELSE 0 END) FROM {t} GROUP BY s", 1),
    ("SELECT s, count(*), sum(b), sum(b) FROM {t} GROUP BY s HAVING sum(b) > 0 ORDER BY sum(b)", 0),
    (f"SELECT s, {_P.format('disc', 'ARRAY[0.25, 0.75]', 'nw')}, {_P.format('disc', 'ARRAY[0.25, 0.75]', 'nw')} "
     f"FROM {{t}} GROUP BY s", 0),
    ("SELECT s, avg(n2), avg(n2), avg(n2::float8) FROM {t} GROUP BY s ORDER BY 1", 1),
]


@pytest.mark.parametrize(("sql", "shared"), DUPLICATES)
def test_which_aggregates_are_one_release_is_the_same_on_every_table(s38: RunningProxy, sql: str, shared: int) -> None:
    outcome = _same(s38, sql)
    assert outcome[0] == "answer", outcome
    assert str(outcome[-1]).count(_SAME) == shared, outcome


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("sql", "params", "shared"), [
    (f"SELECT {_P.format('cont', '%s', 'b')}, {_P.format('cont', '%s', 'b')} FROM {{t}}", (0.5, 0.5), 1),
    (f"SELECT {_P.format('cont', '%s', 'b')}, {_P.format('cont', '%s', 'b')} FROM {{t}}", (0.5, 0.25), 0),
    (f"SELECT {_P.format('cont', '%s', 'b')}, {_P.format('cont', '0.5', 'b')} FROM {{t}}", (0.5,), 1),
    (f"SELECT {_P.format('disc', '%s', 'nw DESC')}, {_P.format('disc', '0.25', 'nw')} FROM {{t}}", (0.75,), 1),
    ("SELECT count(*) FILTER (WHERE b > %s), count(*) FILTER (WHERE b > %s) FROM {t}", (50, 50), 0),
    ("SELECT s, sum(a) FILTER (WHERE b > %s), sum(a) FILTER (WHERE b > %s) FROM {t} GROUP BY s", (50, 50), 0),
])
def test_a_bound_fraction_is_one_release_with_its_equal_and_a_bound_condition_never(
        s38: RunningProxy, sql: str, params: tuple[object, ...], shared: int, binary: bool) -> None:
    # A fraction is read before the split (its value is the statement's); a condition's
    # parameter stays a parameter in the backend SQL, so two are two releases whatever they hold.
    outcome = _same(s38, sql.replace("%s", "%b") if binary else sql, params)
    assert outcome[0] == "answer", outcome
    assert str(outcome[-1]).count(_SAME) == shared, outcome


_FORMS = [
    (_binary_outcome, "SELECT sum(a::float8), sum(a), sum(a::numeric), count(*), count(1) FROM {t}"),
    (_binary_outcome, f"SELECT {_P.format('disc', '0.5', 'b::float8')}, {_P.format('disc', '0.5', 'b')}, "
                      f"{_P.format('cont', 'ARRAY[0.25, 0.75]', 'b')}, {_P.format('cont', 'ARRAY[.25, .75]', 'b')} "
                      "FROM {t}"),
    (_binary_outcome, "SELECT s, avg(n2::float8), avg(n2) FROM {t} GROUP BY s"),
    (_copy_outcome, "COPY (SELECT avg(a::float8), avg(a), min(fe), min(fe) FROM {t}) TO STDOUT (FORMAT binary)"),
    (_copy_outcome, "COPY (SELECT s, count(*), count(*) FROM {t} GROUP BY s) TO STDOUT"),
    (_cursor_outcome, "SELECT sum(nt::float8), sum(nt), mode() WITHIN GROUP (ORDER BY s), "
                      "mode() WITHIN GROUP (ORDER BY s) FROM {t}"),
]


@pytest.mark.parametrize(("outcome", "sql"), _FORMS)
def test_one_release_in_several_columns_in_binary_copy_and_a_cursor_is_the_same_on_every_table(
        s38: RunningProxy, outcome: Callable[[psycopg.Connection, str], tuple[object, ...]], sql: str) -> None:
    with s38.connect() as conn:
        results = {name: outcome(conn, sql.replace("{t}", name)) for name in _NAMES}
    assert results["s38_0"][0] == "answer", results["s38_0"]
    assert all(result == results["s38_0"] for result in results.values()), results


def _charged(notice: str) -> str:
    """A notice's charge and columns, without the budget left (which moves with every charge)."""
    return notice.split("; remaining")[0]


def _notice_of(conn: psycopg.Connection, sql: str, prepare: bool | None = None) -> tuple[str, tuple[object, ...]]:
    notices: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    conn.add_notice_handler(handler)
    try:
        row = conn.execute(sql, prepare=prepare).fetchone()
    finally:
        conn.remove_notice_handler(handler)
    assert row is not None and len(notices) == 1, (sql, notices)
    return _charged(notices[0]), tuple(row)


# Statements of four columns each whose groupings differ (k = 1, 2, 3 and 2 releases), and the
# columns of each that are one release, so one value.
_ONE_VALUE = (((0, 1), (1, 2), (2, 3)), ((0, 2), (1, 3)), ((1, 3),), ((0, 1), (2, 3)))
_GROUPINGS = (
    "SELECT count(*), count(1), count(*), count(*) FROM s38_0 WHERE b > {i}",
    "SELECT count(*), sum(b), count(*), sum(b) FROM s38_0 WHERE b > {i}",
    "SELECT count(*), sum(b), min(b), sum(b) FROM s38_0 WHERE b > {i}",
    # 20 fractions over the column's grid: drawn on a release thread (executor._OFF_LOOP_CANDIDATES)
    "SELECT {p}, {p}, count(*), count(*) FROM s38_0 WHERE b > {i}".format(
        p=_P.format("disc", "ARRAY[" + ", ".join(str(k / 21) for k in range(1, 21)) + "]", "c"), i="{i}"),
)


def test_sessions_interleaving_statements_of_different_groupings_each_get_their_own(s38: RunningProxy) -> None:
    # What each statement's notice says alone (the split, the scales, which column shares whose release)
    with s38.connect() as conn:
        alone = [_notice_of(conn, sql.format(i=-1))[0] for sql in _GROUPINGS]
    assert [notice.count(_SAME) for notice in alone] == [3, 2, 1, 2]
    table = next(t for t in s38.server.registry.by_oid.values() if t.name == "s38_0")
    assert selection_candidates(plan_aggregate_query(_GROUPINGS[3].format(i=0), table)) >= _OFF_LOOP_CANDIDATES
    failures: list[object] = []

    def session(offset: int) -> None:
        try:
            with s38.connect() as conn:
                for i in range(12):
                    index = (i + offset) % len(_GROUPINGS)
                    notice, row = _notice_of(conn, _GROUPINGS[index].format(i=offset * 100 + i), prepare=i % 2 == 0)
                    if notice != alone[index]:  # the charge, each column's noise, which share a release
                        failures.append((index, notice, alone[index]))
                    if any(row[left] != row[right] for left, right in _ONE_VALUE[index]):
                        failures.append((index, row))
        except Exception as exc:  # noqa: BLE001 - told below, in the test's thread
            failures.append(exc)

    with s38.connect() as conn:
        before = spent_epsilon(conn)  # the user's, whichever session charged it
        threads = [threading.Thread(target=session, args=(offset,)) for offset in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert spent_epsilon(conn) - before == pytest.approx(36.0)
    assert not failures, "\n".join(map(repr, failures))


def test_two_portals_bound_before_either_runs_each_get_their_own_grouping(s38: RunningProxy) -> None:
    wire = Wire(s38.host, s38.port)
    try:
        wire.send(parse("one", "SELECT count(*), count(*) FROM s38_0 WHERE a > -100"),
                  parse("two", "SELECT count(*), sum(b) FROM s38_0 WHERE a > -100"),
                  bind("p1", "one"), bind("p2", "two"), execute("p2"), execute("p1"), SYNC)
        replies = wire.read_until(b"Z")
    finally:
        wire.close()
    notices = [body.decode() for kind, body in replies if kind == b"N"]
    rows = [data_row_values(body) for kind, body in replies if kind == b"D"]
    assert [kind for kind, _ in replies if kind == b"E"] == [], replies
    assert len(notices) == 2 and _SAME not in notices[0] and _SAME in notices[1], notices
    assert rows[1][0] == rows[1][1], rows  # p1's two columns, one value
    # p2 split ε over two releases, p1 gave its one release the whole ε
    scales = [float(re.search(r"laplace scale ([0-9.e+-]+)", notice).group(1)) for notice in notices]  # type: ignore[union-attr]
    assert scales[0] == pytest.approx(2 * scales[1]), notices


def test_delta_is_charged_once_per_sample_and_aggregate_release(s38: RunningProxy) -> None:
    def spent_delta(conn: psycopg.Connection) -> float:
        cursor = conn.execute("SHOW dpproxy.budget")
        assert cursor.description is not None
        return float(dict(zip([d.name for d in cursor.description], cursor.fetchone() or ()))["spent_delta"])

    with s38.connect() as conn:
        for sql, releases in (("SELECT min(b), min(b), min(b::numeric) FROM {t}", 1),
                              ("SELECT min(b), max(b), min(b) FROM {t}", 2),
                              ("SELECT max(fe), max(fe), count(*), count(*) FROM {t}", 1)):
            for name in _NAMES:
                before = spent_delta(conn)
                conn.execute(sql.replace("{t}", name)).fetchall()
                assert spent_delta(conn) - before == pytest.approx(releases * 1e-6), (sql, name)


def test_a_duplicate_is_no_repeat_of_the_statement_without_it_and_its_repeat_is_one_value(
        s38: RunningProxy) -> None:
    with s38.connect() as conn:
        spent = spent_epsilon(conn)
        single = conn.execute("SELECT sum(b) FROM s38_0 WHERE a <> 99").fetchone()
        double = conn.execute("SELECT sum(b), sum(b) FROM s38_0 WHERE a <> 99").fetchone()
        assert spent_epsilon(conn) - spent == pytest.approx(2.0)  # the second is a release of its own
        again = conn.execute("SELECT sum(b), sum(b::numeric) FROM s38_0 WHERE a <> 99").fetchone()
        spelled = conn.execute("SELECT sum(b) AS x, sum(b) AS y FROM s38_0 WHERE a <> 99").fetchone()
        assert spent_epsilon(conn) - spent == pytest.approx(3.0)  # sum(b::numeric) is another column type
        assert single is not None and double is not None and again is not None and spelled is not None
        assert double[0] == double[1] == spelled[0] == spelled[1] and again[0] == again[1]


def test_a_statement_prepared_before_a_reload_is_grouped_and_split_under_the_policy_in_force(
        s38_tables: TestDatabase, tmp_path: Path) -> None:
    # The reload halves b's bounds: the prepared statement is planned again, its duplicate still
    # one release with the sum's scale halved, the other session's statement unaffected.
    single = ATTACK_POLICY_HEAD + "  public.s38_0:" + _TABLE
    ledger = tmp_path / "ledger.sqlite3"
    reloaded = tmp_path / "policy.yaml"
    reloaded.write_text(single.replace("b: {{bounds: [0, 100]}}", "b: {{bounds: [0, 50]}}").format(
        dsn=s38_tables.service_dsn, ledger=ledger))
    proxy = RunningProxy(make_policy(s38_tables, ledger, single))
    duplicate = "SELECT sum(b), sum(b::numeric), count(*) FROM s38_0 WHERE a > %s"
    try:
        with proxy.connect() as conn, proxy.connect() as other:
            before = _notice_of(conn, duplicate.replace("%s", "-10"), prepare=True)[0]
            plain = _notice_of(other, "SELECT sum(b), count(*) FROM s38_0 WHERE a > -10")[0]
            assert proxy._call(proxy.server.reload(reloaded))
            after = _notice_of(conn, duplicate.replace("%s", "-9"), prepare=True)[0]
            assert _notice_of(other, "SELECT sum(b), count(*) FROM s38_0 WHERE a > -9")[0] == plain.replace(
                "scale 200 (95% within ±599.1)", "scale 100 (95% within ±299.6)")
    finally:
        proxy.stop()
    assert before.count(_SAME) == after.count(_SAME) == 1 and "sum: laplace scale 200 " in before, before
    assert after == before.replace("scale 200 (95% within ±599.1)", "scale 100 (95% within ±299.6)"), after


# ------------------------------------------------------------------ pg_database's frozen ids

_FROZEN = ("datfrozenxid", "datminmxid", "relfrozenxid", "relminmxid")
_HERE = "datname = current_database()"
DATABASE_SPELLINGS = [
    f"SELECT datfrozenxid, datminmxid FROM pg_database WHERE {_HERE}",
    f"SELECT d.datfrozenxid, d.datminmxid FROM pg_catalog.pg_database AS d WHERE d.{_HERE}",
    f'SELECT "datfrozenxid", DaTmInMxId FROM "pg_catalog"."pg_database" WHERE {_HERE}',
    f"SELECT d.* FROM pg_database d WHERE d.{_HERE}",
    f"SELECT pg_database.* FROM pg_database WHERE {_HERE}",
    f"SELECT * FROM ONLY pg_catalog.pg_database WHERE {_HERE}",
    f"SELECT (d).* FROM pg_database d WHERE d.{_HERE}",
    f"SELECT (d).datfrozenxid, (d).datminmxid FROM pg_database d WHERE d.{_HERE}",
    f"SELECT (d).datfrozenxid.text AS datfrozenxid FROM pg_database d WHERE d.{_HERE}",
    f"SELECT row_to_json(d)->>'datfrozenxid' AS datfrozenxid, to_jsonb(d)->>'datminmxid' AS datminmxid "
    f"FROM pg_database d WHERE d.{_HERE}",
    f"SELECT (pg_database).datfrozenxid FROM pg_database WHERE {_HERE}",
    f"SELECT split_part(trim(both '()' from d::text), ',', 9) AS datfrozenxid FROM pg_database d WHERE d.{_HERE}",
    f"WITH x AS (SELECT * FROM pg_database) SELECT datfrozenxid, datminmxid FROM x WHERE {_HERE}",
    f"WITH RECURSIVE x AS (SELECT datfrozenxid, datminmxid FROM pg_catalog.pg_database WHERE {_HERE}) SELECT * FROM x",
    f"SELECT x.datfrozenxid FROM (SELECT * FROM pg_catalog.pg_database) x WHERE x.{_HERE}",
    f"SELECT (SELECT datfrozenxid FROM pg_database WHERE {_HERE}) AS datfrozenxid",
    f"SELECT s.datfrozenxid FROM LATERAL (SELECT * FROM pg_database WHERE {_HERE}) s",
    f"SELECT d.datfrozenxid, c.relfrozenxid, c.relminmxid FROM pg_class c, pg_database d WHERE d.{_HERE} "
    "AND c.relname = 's38_0'",
    "SELECT d.datfrozenxid, c.relfrozenxid FROM pg_database d JOIN pg_class c ON c.relfrozenxid = d.datfrozenxid "
    "WHERE c.relname = 's38_0'",
    f"SELECT datfrozenxid::text::bigint AS datfrozenxid, datminmxid::text AS datminmxid FROM pg_database WHERE {_HERE}",
    f"SELECT max(datfrozenxid::text::bigint) AS datfrozenxid FROM pg_database",
    f"SELECT datfrozenxid FROM pg_database WHERE {_HERE} UNION ALL SELECT relfrozenxid FROM pg_class "
    "WHERE relname = 's38_0'",
]


def _frozen_ids(cursor: psycopg.Cursor[tuple[object, ...]]) -> list[object]:
    names = [d.name for d in cursor.description or ()]
    return [value for row in cursor.fetchall() for name, value in zip(names, row) if name in _FROZEN]


@pytest.mark.parametrize("sql", DATABASE_SPELLINGS)
def test_the_frozen_ids_are_0_in_every_spelling_of_pg_database(s38: RunningProxy, test_db: TestDatabase,
                                                                sql: str) -> None:
    with psycopg.connect(test_db.admin_dsn) as admin:  # the real ones are never 0 (FirstNormalTransactionId is 3)
        real = admin.execute(f"SELECT datfrozenxid::text, datminmxid::text FROM pg_database WHERE {_HERE}").fetchone()
    assert real is not None and "0" not in real
    with s38.connect() as conn:
        for path in (None, "public, pg_catalog", "''", "pg_catalog, public"):
            if path is not None:
                conn.execute(f"SET search_path = {path}")
            for prepare in (False, True):
                values = _frozen_ids(conn.execute(sql, prepare=prepare))
                assert values and all(str(value) == "0" for value in values), (sql, path, values)
        names = [d.name for d in conn.execute(sql).description or ()]
        with conn.cursor() as cursor, cursor.copy(f"COPY ({sql}) TO STDOUT") as copy:
            lines = b"".join(bytes(chunk) for chunk in copy).splitlines()
        copied = [field for line in lines for name, field in zip(names, line.split(b"\t")) if name in _FROZEN]
        assert copied and all(field == b"0" for field in copied), (sql, lines)
        conn.execute("BEGIN")
        conn.execute(f"DECLARE frozen CURSOR FOR {sql}")
        values = _frozen_ids(conn.execute("FETCH ALL FROM frozen"))
        conn.execute("COMMIT")
        assert values and all(str(value) == "0" for value in values), (sql, values)


# Every column of a transaction id, WAL position or row address type of the relations on the
# catalog allowlist: each moves with the server's writes (a protected table's among them).
_COUNTER_COLUMNS = """
SELECT n.nspname::text, c.relname::text, a.attname::text FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('pg_catalog', 'information_schema') AND a.attnum > 0 AND NOT a.attisdropped
  AND a.atttypid IN ('xid'::regtype, 'xid8'::regtype, 'cid'::regtype, 'tid'::regtype, 'pg_lsn'::regtype)
ORDER BY 1, 2, 3
"""


def _counters_read_0(proxy: RunningProxy, admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn) as admin:
        columns = [(schema, relation, column) for schema, relation, column in admin.execute(_COUNTER_COLUMNS).fetchall()
                   if allowed_catalog_relation(schema, relation)]
    assert ("pg_catalog", "pg_database", "datfrozenxid") in columns, columns
    with proxy.connect() as conn:
        for schema, relation, column in columns:
            values = {row[0] for row in conn.execute(f"SELECT {column}::text FROM {schema}.{relation}").fetchall()}
            assert values <= {"0"}, (relation, column, values)  # neutralised, or a relation answered empty


def test_every_transaction_id_and_wal_position_of_an_allowlisted_catalog_reads_0_on_16(
        proxy: RunningProxy, test_db: TestDatabase) -> None:
    _counters_read_0(proxy, test_db.admin_dsn)


# ------------------------------------------------------------------ attribute notation on a value

# The functions ``(value).name`` may call that read more than their argument, each with what it
# reads: none reads a counter or anything a row's write moves.
_SETTINGS_ONLY = {
    **{f"{name}({arg})": "the session's TimeZone" for name, arg in (
        ("date", "timestamp with time zone"), ("time", "timestamp with time zone"),
        ("timestamp", "timestamp with time zone"), ("timestamptz", "date"),
        ("timestamptz", "timestamp without time zone"), ("timetz", "time without time zone"),
        ("timetz", "timestamp with time zone"))},
    **{f"money({arg})": "lc_monetary" for arg in ("bigint", "integer", "numeric")},
    "numeric(money)": "lc_monetary",
    "regclass(text)": "a relation's name looked up in the catalog under search_path",
}
# pg_proc's functions ``(value).name`` can call: one argument, or the rest defaulted or variadic.
_REACHABLE = """
SELECT p.proname::text, p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')', p.provolatile::text, p.proargtypes[0]::regtype::text,
       t.typtype::text
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_type t ON t.oid = p.proargtypes[0]
WHERE p.proname = ANY(%s) AND p.prokind = 'f' AND p.pronargs >= 1 AND p.pronargs - p.pronargdefaults <= 1
ORDER BY 2
"""


def _field_functions(admin_dsn: str) -> list[tuple[str, str, str, str, str]]:
    with psycopg.connect(admin_dsn) as admin:
        return admin.execute(_REACHABLE, (sorted(HARMLESS_FIELD_FUNCTIONS),)).fetchall()


def _attribute_notation_holds(proxy: RunningProxy, admin_dsn: str) -> None:
    """Every function of a harmless field name, called on a value of its argument's type
    through ``proxy``: refused (``age``), or one that reads no more than the session's settings."""
    functions = _field_functions(admin_dsn)
    assert len(functions) > 80, functions  # the enumeration found what it looks for
    unreviewed = []
    with proxy.connect() as conn:
        conn.autocommit = True
        for name, signature, volatility, argument, kind in functions:
            assert kind not in ("p", "c"), f"{signature}: a pseudo-type or row argument to review"
            try:
                conn.execute(f"SELECT (CAST(NULL AS {argument})).{name}")
                ran = True
            except psycopg.errors.InsufficientPrivilege as exc:
                assert "function-allowlist" in str(exc), exc
                ran = False
            except psycopg.Error:
                ran = True  # resolved, then failed: PostgreSQL found the function
            if name == "age":
                assert not ran, f"(value).age reached {signature}"
            elif ran and volatility != "i" and signature not in _SETTINGS_ONLY:
                unreviewed.append((signature, volatility))
    assert not unreviewed, unreviewed


def test_every_function_attribute_notation_reaches_on_a_value_reads_no_state_on_16(
        proxy: RunningProxy, test_db: TestDatabase) -> None:
    _attribute_notation_holds(proxy, test_db.admin_dsn)


@pytest.fixture(scope="module")
def newer_proxy(newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(newer_pg_db, tmp_path_factory, TEST_POLICY) as running:
        yield running


def test_every_function_attribute_notation_reaches_on_a_value_reads_no_state_on_17_and_18(
        newer_proxy: RunningProxy, newer_pg_db: TestDatabase) -> None:
    _attribute_notation_holds(newer_proxy, newer_pg_db.admin_dsn)


def test_every_transaction_id_and_wal_position_of_an_allowlisted_catalog_reads_0_on_17_and_18(
        newer_proxy: RunningProxy, newer_pg_db: TestDatabase) -> None:
    _counters_read_0(newer_proxy, newer_pg_db.admin_dsn)
