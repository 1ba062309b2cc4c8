"""Stop 36's accepted constructs attacked on neighbouring tables: the VARIANCE/STDDEV family, a
percentile's fraction bound as a parameter and the array form, and the catalog reads let through
for pgAdmin 4 beside the pg_class columns a VACUUM maintains.

Each statement runs on ``s36_0`` and on neighbours that each add one adversarial row: NULLs,
NaN, ±Infinity, integer limits, a numeric of 1,000 digits and one of 131,072, 1e-16383, one of
1,000 fraction digits inside bounds 1e-300 wide, -0.0, subnormals, values just past and on the
bounds, a 3 MB TOASTed and a 400 kB multibyte text. The columns' bounds run from lo = hi and a
range 1e-300 wide to ±1e150 (the variance's cap) and ±9.2e18 on an int8, with half the base
rows on a bound, so that Σ d² of a wide column is ~2^104 per row. What the analyst sees but the
noised values (outcome, SQLSTATE, columns and types, rows, tag, notices with numbers masked,
COPY framing, a cursor's fetches) must be the same on all, and a refusal costs nothing.

Found and fixed, pinned here:

* ``(datfrozenxid).age`` (attribute notation: ``age(datfrozenxid)``) passed the field check as a
  harmless conversion name and answered the transactions begun since, the server's transaction
  counter, which an INSERT into a protected table moves by one (txid_current() is refused for
  that). ``age`` after a parenthesised value is now refused; ``rel.age``, a column or age of a
  whole row (no such function), stays.
* ``pg_class.relfrozenxid`` and ``relminmxid``: each VACUUM sets them to the oldest transaction
  (multixact) id still unfrozen in the table, the xmin of its oldest unfrozen row, so a table
  holding a row written before the others answered that row's xid and its neighbour without it
  the others'. Both are now constants like relpages and reltuples, and so are
  ``pg_database.datfrozenxid`` and ``datminmxid``, the least of them over the database's
  relations (a protected table's oldest unfrozen row where it is the database's oldest).

Held: everything else below.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from decimal import Decimal

import psycopg
import pytest
from psycopg.types.numeric import Float4, Int2, Int8

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import binary_copy_cells, create_neighbours, same_on_neighbours

_DDL = ("(id int, a int2, b int4, c int8, n numeric, n2 numeric(12, 2), f float8, r real, s text, "
        "nw numeric, fw float8, nt numeric, ft float8, fe float8)")
_BASE_ROWS = (
    "SELECT g, (g % 11) - 5, g % 101, CASE WHEN g % 2 = 0 THEN 9200000000000000000 ELSE -9200000000000000000 END, "
    "(g % 1000)::numeric / 10, ((g % 2000) - 1000)::numeric(12, 2), (g % 997)::float8 / 10, (g % 991)::real / 10, "
    "(ARRAY['a', 'b'])[1 + g % 2], "
    "CASE g % 3 WHEN 0 THEN 1e150 WHEN 1 THEN -1e150 ELSE g END, CASE g % 3 WHEN 0 THEN 1e150 WHEN 1 THEN -1e150 ELSE g END, "
    "g * 1e-303, 1e-300 + g * 1e-303, g FROM generate_series(1, 400) g"
)
_TINY = "CAST('0.' || repeat('0', 998) || '1' AS numeric)"
# One adversarial row each (columns as _DDL).
_NEIGHBOURS = {
    "s36_1": "(1001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "s36_2": "(1002, 32767, 2147483647, 9223372036854775807, 'NaN', 'NaN', 'NaN', 'NaN', 'zz', 'NaN', 'NaN', 'NaN', "
             "'NaN', 'NaN')",
    "s36_3": "(1003, -32768, -2147483648, -9223372036854775808, 'Infinity', -9999999999.99, 'Infinity', 'Infinity', '', "
             "'Infinity', 'Infinity', 'Infinity', 'Infinity', 'Infinity')",
    "s36_4": "(1004, 0, 0, 0, '-Infinity', 9999999999.99, '-Infinity', '-Infinity', 'b', '-Infinity', '-Infinity', "
             "'-Infinity', '-Infinity', '-Infinity')",
    "s36_5": f"(1005, 5, 100, 1, CAST(repeat('9', 1000) AS numeric), 100, 1e308, 3.4e38, 'a', "
             f"CAST(repeat('9', 1000) AS numeric), 1.7976931348623157e308, CAST(repeat('9', 1000) AS numeric), 1e308, 1e308)",
    "s36_6": f"(1006, 1, 50, 1, {_TINY}, 0.01, 5e-324, 1e-45, 'a', {_TINY}, 5e-324, {_TINY}, 5e-324, 5e-324)",
    "s36_7": "(1007, 0, 0, 0, CAST('-0.0' AS numeric), -0.00, '-0.0', '-0.0', repeat('x', 3000000), "
             "CAST('-0.0' AS numeric), '-0.0', CAST('-0.0' AS numeric), '-0.0', '-0.0')",
    "s36_8": "(1008, 5, 100, 9200000000000000000, 100, 1000, 100, 100, 'ä' || repeat('😀', 100000) || U&'\\+10FFFF', "
             "1e150, 1e150, 1e-300, 2e-300, 5)",  # every value on its upper bound
    "s36_9": "(1009, -5, 0, -9200000000000000000, CAST('1e-16383' AS numeric), -1000, 2.2250738585072014e-308, "
             "1.17549435e-38, 'b', CAST('1e-16383' AS numeric), 2.2250738585072014e-308, CAST('1e-16383' AS numeric), "
             "2.2250738585072014e-308, 2.2250738585072014e-308)",
    "s36_10": "(1010, 6, 101, 9200000000000000001, 100.0000000001, 1000.01, 100.00000000000001, 100.00001, 'a', "
              "1000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
              "000000000000000000000000000000000000000000000000001, 1.0000000000000002e150, 1.0000000001e-300, "
              "2.0000000001e-300, 5.000000000000001)",  # just past hi
    "s36_11": "(1011, -6, -1, -9200000000000000001, CAST('-' || repeat('9', 131072) AS numeric), -1000.01, -5e-324, "
              "-1e-45, 'b', CAST(repeat('9', 131072) AS numeric), -1e151, CAST('0.' || repeat('1', 16383) AS numeric), "
              "-1e-300, 4.9999999999999991)",  # the longest numerics, past lo
    "s36_12": "(1012, 3, 33, 123456789, 33.3, 33.33, 33.3, 33.3, 'a', 123456789, 123456789, 1e-301, 1.5e-300, 5)",
}
_TABLE = """
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      a: {{bounds: [-5, 5]}}
      b: {{bounds: [0, 100]}}
      c: {{bounds: [-9.2e18, 9.2e18]}}
      n: {{bounds: [0, 100]}}
      n2: {{bounds: [-1000, 1000]}}
      f: {{bounds: [0, 100]}}
      r: {{bounds: [0, 100]}}
      s: {{categories: [a, b], group_by: true}}
      nw: {{bounds: [-1.0e150, 1.0e150]}}
      fw: {{bounds: [-1.0e150, 1.0e150]}}
      nt: {{bounds: [0, 1.0e-300]}}
      ft: {{bounds: [1.0e-300, 2.0e-300]}}
      fe: {{bounds: [5, 5]}}
"""
# numeric(5, -2) (PostgreSQL 15 on: values rounded to hundreds), and a neighbour each adding one row
_NEGATIVE_SCALE = {"s36_neg_1": "(NULL)", "s36_neg_2": "('NaN')", "s36_neg_3": "(9999900)", "s36_neg_4": "(-9999900)",
                   "s36_neg_5": "(-0.0)", "s36_neg_6": "(49.999)"}
_POLICY = (ATTACK_POLICY_HEAD + "  public.s36_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)
           + "  public.pets36:\n    access: public\n"
           + "".join(f"  public.{name}:\n    epsilon: 1.0\n    columns:\n      h: {{{{bounds: [0, 100000]}}}}\n"
                     for name in ("s36_neg", *_NEGATIVE_SCALE)))
_NAMES = ("s36_0", *_NEIGHBOURS)
_MOMENT_COLUMNS = ("a", "b", "c", "n", "n2", "f", "r", "nw", "fw", "nt", "ft", "fe")


@pytest.fixture(scope="module")
def s36(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "s36_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, "pets36", {}, "(name text, age int)", "SELECT 'Rex', 3")
    create_neighbours(test_db.admin_dsn, "s36_neg", _NEGATIVE_SCALE, "(h numeric(5, -2))",
                      "SELECT g * 100 FROM generate_series(1, 500) g")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(proxy: RunningProxy, sql: str, params: tuple[object, ...] | None = None,
                        keys: int = 0) -> tuple[object, ...]:
    """``sql``'s masked outcome, the same on every table, an error charged nothing."""
    with proxy.connect() as conn:
        return same_on_neighbours(conn, sql, _NAMES, spent_epsilon, keys, params)


# ------------------------------------------------------------------ VARIANCE and STDDEV

# Every kind of every column (the backend SQL depends on the column only, the kind picks the
# release's formula), two columns a statement.
MOMENTS = [
    f"SELECT var_pop({c}), var_samp({c}), stddev_pop({c}), stddev_samp({d}), variance({d}), stddev({d}), "
    f"var_pop({d}), var_samp({d}), stddev_pop({d}), stddev_samp({c}), variance({c}), stddev({c}) FROM {{t}}"
    for c, d in zip(_MOMENT_COLUMNS[::2], _MOMENT_COLUMNS[1::2])
] + [
    "SELECT var_samp(n) FILTER (WHERE s = 'a'), stddev(fw) FILTER (WHERE n > 50), count(*) FROM {t}",
    "SELECT variance(nt) FILTER (WHERE f > 1e-300), stddev_pop(c) FILTER (WHERE r > 1e-40) FROM {t}",
    "SELECT variance(CASE WHEN s = 'a' THEN b END), stddev_pop(CASE WHEN f > 50 THEN nw END) FROM {t}",
    "SELECT s, var_pop(fw), stddev_samp(nt), variance(fe) FROM {t} GROUP BY s",
    "SELECT s, variance(c), avg(c), sum(n2), percentile_cont(0.5) WITHIN GROUP (ORDER BY ft) FROM {t} GROUP BY s "
    "ORDER BY 3",
    "SELECT stddev(fw) * 2, variance(nw)::text, round(stddev(n2), 3), stddev(ft) / 2 FROM {t}",
    "SELECT var_samp(r), min(r), max(nw), count(s) FROM {t} WHERE b > 50",
    "SELECT s, stddev(n) FROM {t} GROUP BY s HAVING stddev(n) > -1 ORDER BY stddev(n) DESC",
]


@pytest.mark.parametrize("sql", MOMENTS)
def test_one_row_changes_nothing_of_a_variance_but_its_noised_value(s36: RunningProxy, sql: str) -> None:
    outcome = _same_on_neighbours(s36, sql, keys=1 if "GROUP BY" in sql and "ORDER BY" not in sql else 0)
    assert outcome[0] == "answer", outcome


def _binary_outcome(conn: psycopg.Connection, sql: str) -> tuple[object, ...]:
    """``sql`` with binary results: an error's SQLSTATE and message, or the columns' names and
    types, and each row's NULLs."""
    try:
        with conn.cursor(binary=True) as cur:
            cur.execute(sql)
            rows = cur.fetchall()
            return ("answer", tuple((d.name, d.type_code) for d in cur.description or ()),
                    tuple(tuple(v is None for v in row) for row in rows), cur.statusmessage)
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, exc.diag.message_primary)


def _copy_outcome(conn: psycopg.Connection, sql: str) -> tuple[object, ...]:
    """``sql`` a COPY TO STDOUT: an error's SQLSTATE, or the framing (binary: each tuple's NULLs,
    header and trailer; text: the fields on each line) and the tag."""
    try:
        with conn.cursor() as cur, cur.copy(sql) as copy:
            data = b"".join(bytes(chunk) for chunk in copy)
        shape: object = (binary_copy_cells(data) if "binary" in sql.lower()
                         else tuple(line.count(b"\t") for line in data.splitlines()))
        return ("answer", shape, cur.statusmessage)
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, exc.diag.message_primary)


def _cursor_outcome(conn: psycopg.Connection, sql: str) -> tuple[object, ...]:
    """``sql`` read through DECLARE and two FETCHes in a block: what each step returned."""
    steps: list[object] = []
    try:
        conn.execute("BEGIN")
        conn.execute(f"DECLARE c36 CURSOR FOR {sql}")
        for fetch in ("FETCH 1 FROM c36", "FETCH ALL FROM c36"):
            cur = conn.execute(fetch)
            steps.append((tuple((d.name, d.type_code) for d in cur.description or ()), len(cur.fetchall())))
        conn.execute("COMMIT")
        return ("answer", tuple(steps))
    except psycopg.Error as exc:
        conn.execute("ROLLBACK")
        return ("error", exc.sqlstate, exc.diag.message_primary)


_OTHER_FORMS = [
    (_binary_outcome, "SELECT var_pop(nw), stddev_samp(ft), variance(c), stddev(r), var_samp(n2) FROM {t}"),
    (_binary_outcome, "SELECT s, variance(fw), stddev(nt) FROM {t} GROUP BY s"),
    (_copy_outcome, "COPY (SELECT var_pop(nw), stddev_samp(ft), variance(a), stddev(fe) FROM {t}) TO STDOUT (FORMAT binary)"),
    (_copy_outcome, "COPY (SELECT s, var_samp(n), stddev(c) FROM {t} GROUP BY s) TO STDOUT"),
    (_cursor_outcome, "SELECT variance(nw), stddev(nt), var_samp(b) FROM {t}"),
    (_cursor_outcome, "SELECT s, stddev_pop(fw) FROM {t} GROUP BY s"),
]


@pytest.mark.parametrize(("outcome", "sql"), _OTHER_FORMS)
def test_a_variance_in_binary_copy_and_a_cursor_is_the_same_on_every_table(
        s36: RunningProxy, outcome: Callable[[psycopg.Connection, str], tuple[object, ...]], sql: str) -> None:
    with s36.connect() as conn:
        results = {name: outcome(conn, sql.replace("{t}", name)) for name in _NAMES}
    assert results["s36_0"][0] == "answer", results["s36_0"]
    assert all(result == results["s36_0"] for result in results.values()), results


def test_a_variance_prints_in_its_types_shape_whatever_the_rows(s36: RunningProxy) -> None:
    # numeric for integer and numeric columns, double precision for float ones; no typmod (-1)
    # whatever the column's, and a finite value (the release is clamped into [0, 2h²]).
    sql = "SELECT " + ", ".join(f"variance({c})" for c in _MOMENT_COLUMNS) + " FROM {t}"
    with s36.connect() as conn:
        for name in _NAMES:
            cur = conn.execute(sql.replace("{t}", name))
            row = cur.fetchone() or ()
            types = [(d.type_code, d.internal_size, d.precision, d.scale) for d in cur.description or ()]
            assert [t[0] for t in types] == [1700] * 5 + [701] * 2 + [1700, 701, 1700, 701, 701], (name, types)
            assert all(t[2] is None for t in types), (name, types)
            assert all(value is not None and value >= 0 for value in row), (name, row)
            assert row[-1] == 0.0, (name, row)  # lo = hi: 0 whatever the rows


@pytest.mark.parametrize("sql", [
    "SELECT var_pop(h), var_samp(h), stddev_pop(h), stddev_samp(h) FROM {t}",
    "SELECT variance(h) FILTER (WHERE h > 50), sum(h), min(h) FROM {t}",
])
def test_a_variance_of_a_negative_scale_numeric_is_the_same_on_every_table(s36: RunningProxy, sql: str) -> None:
    # The typmod's scale -2 (stop 35 found it read unsigned): a variance carries no typmod, and
    # prints as a numeric of its value's digits whatever the rows.
    with s36.connect() as conn:
        outcome = same_on_neighbours(conn, sql, ("s36_neg", *_NEGATIVE_SCALE), spent_epsilon)
        assert outcome[0] == "answer", outcome
        (text,) = conn.execute("SELECT variance(h)::text FROM s36_neg").fetchone() or ("",)
    assert re.fullmatch(r"\d+(\.\d+)?", text), text


# ------------------------------------------------------------------ percentiles: bound fractions, arrays

_BOUND = "SELECT percentile_cont(%s) WITHIN GROUP (ORDER BY f), percentile_disc(%s) WITHIN GROUP (ORDER BY f DESC) FROM {t}"
ANSWERED_FRACTIONS: list[tuple[object, ...]] = [
    (0.5, 0.25), (Decimal("0.5"), Decimal("1")), (0, 1), (Int2(0), Int8(1)), (Float4(0.25), Float4(0.75)),
    ("0.5", "0.1"), (" 0.5 ", "1e-20"), ("0.333333333333333333", "0"),
]
# refused before the charge, as PostgreSQL or dpproxy refuses the same literal
REFUSED_FRACTIONS: list[tuple[object, ...]] = [
    (1.5, 0.5), (-0.1, 0.5), (float("nan"), 0.5), (float("inf"), 0.5), (None, 0.5), (Decimal("NaN"), 0.5),
    ("abc", 0.5), ("0.1234567890123456789012", 0.5), (Decimal("-Infinity"), 0.5), (2, 0.5), ("", 0.5),
]


@pytest.mark.parametrize("params", ANSWERED_FRACTIONS + REFUSED_FRACTIONS, ids=repr)
@pytest.mark.parametrize("binary", [False, True])
def test_a_bound_fraction_of_any_type_and_format_has_one_outcome_on_every_table(
        s36: RunningProxy, params: tuple[object, ...], binary: bool) -> None:
    sql = _BOUND.replace("%s", "%b") if binary else _BOUND
    outcome = _same_on_neighbours(s36, sql, params)
    # A str bound in binary is declared text, which no fraction may be (rule: aggregate-argument).
    answered = params in ANSWERED_FRACTIONS and not (binary and any(isinstance(p, str) for p in params))
    assert (outcome[0] == "answer") == answered, outcome
    if not answered:
        assert outcome[1] in ("DP001", "22003", "22P02"), outcome


_SPREAD = ", ".join(str(k / 19) for k in range(19)) + ", 1"
ARRAYS = [
    f"SELECT percentile_cont(ARRAY[{_SPREAD}]) WITHIN GROUP (ORDER BY n2) FROM {{t}}",
    f"SELECT percentile_disc(ARRAY[{_SPREAD}]) WITHIN GROUP (ORDER BY r DESC) FROM {{t}}",
    "SELECT percentile_cont(ARRAY[0.5, 0.5, 0, 1, 0.5]) WITHIN GROUP (ORDER BY nw DESC), count(*) FROM {t}",
    "SELECT percentile_disc('{0, 1, 1, 0}'::float8[]) WITHIN GROUP (ORDER BY ft), variance(ft) FROM {t}",
    "SELECT (percentile_cont(ARRAY[0.25, 0.75]) WITHIN GROUP (ORDER BY c))[2], "
    "percentile_disc(ARRAY[0.1]) WITHIN GROUP (ORDER BY c) FILTER (WHERE s = 'a') FROM {t}",
    "SELECT s, percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY f) FROM {t} GROUP BY s",  # per cell, since h60
    # refused before the charge
    "SELECT percentile_cont(ARRAY[" + ", ".join(["0.5"] * 21) + "]) WITHIN GROUP (ORDER BY f) FROM {t}",
    "SELECT percentile_cont(ARRAY[0.5, NULL]) WITHIN GROUP (ORDER BY f) FROM {t}",
    "SELECT percentile_cont(ARRAY[0.5, 1.5]) WITHIN GROUP (ORDER BY f) FROM {t}",
    "SELECT percentile_disc(ARRAY[]::float8[]) WITHIN GROUP (ORDER BY f) FROM {t}",
    "SELECT percentile_cont(ARRAY[0.5, 'NaN']) WITHIN GROUP (ORDER BY f) FROM {t}",
]


@pytest.mark.parametrize("sql", ARRAYS)
def test_the_array_form_has_one_outcome_on_every_table(s36: RunningProxy, sql: str) -> None:
    outcome = _same_on_neighbours(s36, sql)
    assert (outcome[0] == "answer") == (ARRAYS.index(sql) < 6), outcome


def test_the_array_form_in_binary_has_one_outcome_on_every_table(s36: RunningProxy) -> None:
    """Refused before the charge when this file was written; answered in array_send's bytes since
    h60: the same kind of answer on every neighbour."""
    with s36.connect() as conn:
        outcomes = {_binary_outcome(conn, f"SELECT percentile_cont(ARRAY[0.25, 0.5]) WITHIN GROUP (ORDER BY f) FROM {name}")
                    for name in _NAMES}
    assert len(outcomes) == 1 and next(iter(outcomes))[0] == "answer", outcomes


# ------------------------------------------------------------------ the catalog

# pgAdmin's connect and properties reads, and the catalog columns that VACUUM maintains, on each
# neighbour (after a VACUUM of them all): the same answer but for the table's name and the numbers
# it was given when created (masked, as the catalog fuzzer masks them).
CATALOG = [
    "SELECT name, setting, source FROM pg_show_all_settings() ORDER BY name",
    "SELECT count(*) FROM pg_replication_slots",
    "SELECT * FROM pg_stat_gssapi",
    "SELECT name, installed_version FROM pg_available_extensions ORDER BY name",
    "SELECT * FROM pg_db_role_setting",
    "SELECT count(*) FROM pg_seclabels",
    "SELECT (aclexplode(relacl)).* FROM pg_class WHERE relname = '{t}'",
    "SELECT relpages, reltuples, relallvisible, relfrozenxid, relminmxid FROM pg_class WHERE relname = '{t}'",
    "SELECT c.* FROM pg_catalog.pg_class c WHERE c.relname = '{t}'",
    "SELECT row_to_json(c) FROM pg_class c WHERE c.oid = '{t}'::regclass",
]


def _catalog_answer(conn: psycopg.Connection, sql: str, table: str) -> object:
    try:
        rows = conn.execute(sql.replace("{t}", table)).fetchall()
    except psycopg.Error as exc:
        return ("error", exc.sqlstate)
    return ("answer", [tuple(str(v).replace(table, "T") for v in row) for row in rows])


@pytest.mark.parametrize("sql", CATALOG)
def test_a_catalog_read_pgadmin_makes_is_the_same_beside_every_neighbour(s36: RunningProxy, admin: psycopg.Connection,
                                                                        sql: str) -> None:
    for name in _NAMES:
        admin.execute(f"VACUUM {name}")
    created = {}  # what each table was given when created: its OIDs, relfilenode, the creating xid
    for name in _NAMES:
        created[name] = {str(v) for v in admin.execute(
            "SELECT c.oid, c.relfilenode, c.reltype, t.typarray, c.reltoastrelid, c.xmin FROM pg_class c "
            "JOIN pg_type t ON t.oid = c.reltype WHERE c.oid = %s::regclass", (name,)).fetchone() or ()}
    with s36.connect() as conn:
        answers = {}
        for name in _NAMES:
            answer = repr(_catalog_answer(conn, sql, name))
            # Only a read of the table itself shows its numbers: masked elsewhere, a setting that
            # happened to equal one (an xmin of 16384 and shared_buffers) was masked on one side.
            for number in sorted(created[name], key=len, reverse=True) if "{t}" in sql else ():
                answer = re.sub(rf"\b{number}\b", "#", answer)
            answers[name] = answer
    assert all(answer == answers["s36_0"] for answer in answers.values()), answers


def test_relfrozenxid_does_not_tell_whether_a_row_older_than_the_others_is_there(
        s36: RunningProxy, admin: psycopg.Connection) -> None:
    # frz_1 holds one row written before the rest; the rest of both tables come in one transaction.
    admin.execute("DROP TABLE IF EXISTS frz_0, frz_1")
    for name in ("frz_0", "frz_1"):
        admin.execute(f"CREATE TABLE {name} (x int) WITH (autovacuum_enabled = off)")
        admin.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
    admin.execute("INSERT INTO frz_1 VALUES (42)")
    with admin.transaction():
        for name in ("frz_0", "frz_1"):
            admin.execute(f"INSERT INTO {name} SELECT g FROM generate_series(1, 100) g")
    admin.execute("VACUUM frz_0, frz_1")
    sql = "SELECT relname, relfrozenxid, relminmxid FROM pg_catalog.pg_class WHERE relname IN ('frz_0', 'frz_1') ORDER BY 1"
    (_, own_0, _), (_, own_1, _) = admin.execute(sql).fetchall()
    assert own_0 != own_1  # the backend's own: frz_1's is its older row's xid
    try:
        with s36.connect() as conn:
            rows = conn.execute(sql).fetchall()
            assert [row[1:] for row in rows] == [("0", "0")] * 2, rows
            whole = conn.execute("SELECT c.* FROM pg_class c WHERE relname = 'frz_1'")
            names = [d.name for d in whole.description or ()]
            assert dict(zip(names, whole.fetchone() or ()))["relfrozenxid"] == "0"
            assert conn.execute("SELECT count(*) FROM pg_class WHERE relfrozenxid::text::bigint > 0").fetchone() == (0,)
    finally:
        admin.execute("DROP TABLE frz_0, frz_1")


@pytest.mark.parametrize("sql", [
    "SELECT (datfrozenxid).age FROM pg_catalog.pg_database WHERE datname = current_database()",
    "SELECT (c.relfrozenxid).age FROM pg_catalog.pg_class c WHERE c.relname = 's36_0'",
    "SELECT (xmin).age FROM pg_catalog.pg_namespace",
    "SELECT ('1'::xid).age",
    "SELECT count(*) FROM pg_catalog.pg_type t WHERE (t.xmin).age > 0",
])
def test_the_transaction_counter_is_not_read_through_attribute_notation(s36: RunningProxy, admin: psycopg.Connection,
                                                                        sql: str) -> None:
    # age(xid) is the number of transactions begun since that xid: read twice, it counts the
    # server's write transactions in between, an INSERT into a protected table among them.
    first = admin.execute("SELECT (datfrozenxid).age FROM pg_database WHERE datname = current_database()").fetchone()
    admin.execute("CREATE TEMP TABLE IF NOT EXISTS counter36 (x int)")
    admin.execute("INSERT INTO counter36 VALUES (1)")
    second = admin.execute("SELECT (datfrozenxid).age FROM pg_database WHERE datname = current_database()").fetchone()
    assert first is not None and second is not None and second[0] > first[0]  # what dpproxy must not answer
    with s36.connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege, match="rule: function-allowlist"):
        conn.execute(sql)


def test_a_relations_age_column_is_still_read_by_its_qualified_name(s36: RunningProxy) -> None:
    # rel.age is rel's column (or age() of rel's whole row, which no function takes): not the counter.
    with s36.connect() as conn:
        assert conn.execute("SELECT p.age, public.pets36.age FROM pets36 p, public.pets36").fetchall() == [(3, 3)]


def test_pg_database_answers_no_frozen_xid(s36: RunningProxy, admin: psycopg.Connection) -> None:
    # datfrozenxid and datminmxid are the least relfrozenxid and relminmxid of the database's
    # relations, a protected table's among them: where its oldest unfrozen row is the database's
    # oldest, its xid.
    sql = "SELECT datname, datfrozenxid, datminmxid FROM pg_catalog.pg_database WHERE datname = current_database()"
    (_, own, _) = admin.execute(sql).fetchone() or ((), "", "")
    assert own != "0"
    with s36.connect() as conn:
        assert [row[1:] for row in conn.execute(sql).fetchall()] == [("0", "0")]
        whole = conn.execute("SELECT d.* FROM pg_database d WHERE d.datname = current_database()")
        names = [d.name for d in whole.description or ()]
        row = dict(zip(names, whole.fetchone() or ()))
        assert row["datfrozenxid"] == "0" and row["datminmxid"] == "0", row
        own_names = [d.name for d in admin.execute("SELECT * FROM pg_database LIMIT 0").description or ()]
        assert names == own_names  # pg_database's shape
        assert conn.execute("SELECT tableoid::int FROM pg_database LIMIT 1").fetchone() == (1262,)
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_database WHERE datfrozenxid::text <> '0'").fetchone() == (0,)
