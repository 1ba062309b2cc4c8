"""Shapes BI tools and ORMs send that release no more than an accepted DP query (issue 18).

Subquery wrappers that only project and filter are flattened into one aggregate of the base
table; LIMIT/FETCH FIRST/OFFSET act on the one released row; a repeat shares only the released
values, under the names the new statement asks for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon

_WITH_REPEATS = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{ttl_s: 600}}")


@pytest.fixture(scope="module")
def repeating(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy that answers repeats from its store (the suite's default proxy does not)."""
    with running_proxy(test_db, tmp_path_factory, _WITH_REPEATS) as running:
        yield running


def _answer(conn: psycopg.Connection, sql: str) -> tuple[list[str], list[tuple[object, ...]], list[str]]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    cur = conn.execute(sql)
    names = [column.name for column in cur.description or []]
    return names, cur.fetchall(), notices


Rows = list[tuple[object, ...]]


def _after_plain(proxy: RunningProxy, plain_sql: str, sql: str) -> tuple[Rows, list[str], Rows, list[str]]:
    """Run ``plain_sql`` then ``sql`` on one session; assert ``sql`` cost nothing (a repeat).

    Returns the plain rows, then the names, rows and notices of ``sql``.
    """
    with proxy.connect() as conn:
        _, plain, _ = _answer(conn, plain_sql)
        spent = spent_epsilon(conn)
        names, rows, notices = _answer(conn, sql)
        assert spent_epsilon(conn) == spent
    return plain, names, rows, notices


def test_a_repeat_is_headed_with_the_names_the_new_statement_asks_for(repeating: RunningProxy):
    with repeating.connect() as conn:
        names, rows, _ = _answer(conn, "SELECT count(*) AS total_people FROM adult WHERE age > 44")
        assert names == ["total_people"]
        spent = spent_epsilon(conn)
        renamed, again, notices = _answer(conn, "SELECT count(*) AS other_name FROM adult WHERE age > 44")
        unnamed, third, _ = _answer(conn, "SELECT count(*) FROM adult WHERE age > 44")
        assert spent_epsilon(conn) == spent
    assert renamed == ["other_name"] and unnamed == ["count"]
    assert again == rows and third == rows
    assert any("ε charged 0, δ 0 (a repeat of an earlier answer" in n and "other_name" in n and "remaining ε" in n for n in notices)


def test_a_wrapper_releases_what_the_plain_query_releases_so_it_is_a_free_repeat(repeating: RunningProxy):
    plain, names, wrapped, _ = _after_plain(
        repeating, "SELECT COUNT(*) AS count FROM adult WHERE age > 31",
        "SELECT COUNT(*) AS count FROM (SELECT * FROM adult WHERE age > 31) AS virtual_table LIMIT 1000",
    )
    assert names == ["count"] and wrapped == plain


@pytest.mark.parametrize("sql, names", [
    ("SELECT COUNT(*) AS count FROM (SELECT * FROM adult WHERE age > 30) AS virtual_table LIMIT 1000", ["count"]),
    ("SELECT count(*) AS count_1 FROM (SELECT adult.age AS adult_age, adult.sex AS adult_sex FROM adult "
     "WHERE adult.age > 40) AS anon_1", ["count_1"]),
    ('select count(1) as "a0", sum("_"."hours_per_week") as "a1" from (select "age", "hours_per_week" '
     'from "public"."adult" "$Table") "_"', ["a0", "a1"]),
    ("SELECT sum(h) AS s FROM (SELECT hours_per_week AS h, a FROM (SELECT age AS a, hours_per_week FROM adult "
     "WHERE age > 20 ORDER BY age) AS inner_level WHERE a < 60) AS outer_level WHERE h > 10", ["s"]),
])
def test_wrappers_that_only_project_and_filter_are_answered(proxy: RunningProxy, sql: str, names: list[str]):
    with proxy.connect() as conn:
        got, rows, notices = _answer(conn, sql)
    assert got == names and len(rows) == 1
    assert all(isinstance(value, int) for value in rows[0])
    assert any("ε charged" in n for n in notices)


def test_wrapper_filters_of_every_level_are_anded(repeating: RunningProxy):
    # The same release as the plain query with both filters ANDed: answered from the repeat store.
    plain, _, wrapped, notices = _after_plain(
        repeating, "SELECT count(*) FROM adult WHERE hours_per_week > 90 AND age > 85",
        "SELECT count(*) FROM (SELECT age AS a FROM adult WHERE hours_per_week > 90) t WHERE a > 85",
    )
    assert wrapped == plain and any("repeat" in n for n in notices)


@pytest.mark.parametrize("sql, message", [
    ("SELECT count(*) FROM (SELECT age + 1 AS a FROM adult) AS t", "computed columns"),
    ("SELECT count(*) FROM (SELECT * FROM adult LIMIT 5) AS t", "LIMIT"),
    ("SELECT count(*) FROM (SELECT DISTINCT age FROM adult) AS t", "DISTINCT"),
    ("SELECT count(*) FROM (SELECT age FROM adult GROUP BY age) AS t", "GROUP"),
])
def test_wrappers_that_do_more_than_project_and_filter_are_refused(proxy: RunningProxy, sql: str, message: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    diag = info.value.diag
    assert diag.sqlstate == "DP001" and "rule: no-subquery" in (diag.message_primary or "")
    assert message in (diag.message_primary or "")
    assert "plain columns" in (diag.message_hint or "")


def test_schema_qualified_columns_of_the_table_itself_are_answered(proxy: RunningProxy):
    # Metabase qualifies every column with schema and table.
    with proxy.connect() as conn:
        got, rows, _ = _answer(conn, 'SELECT avg("public"."adult"."age") AS "avg" FROM "public"."adult" '
                                     'WHERE "public"."adult"."age" > 30 AND public.adult.sex = \'Male\'')
    assert got == ["avg"] and len(rows) == 1 and 30 <= rows[0][0] <= 90


@pytest.mark.parametrize("sql", [
    'SELECT count(*) FROM public.adult AS a WHERE public.adult.age > 30',  # PostgreSQL: invalid reference
    'SELECT count(*) FROM public.adult WHERE other_schema.adult.age > 30',
    'SELECT count(*) FROM public.adult WHERE demo.public.adult.age > 30',
])
def test_schema_qualified_columns_naming_anything_else_are_refused(proxy: RunningProxy, sql: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.diag.sqlstate == "DP001" and "rule: column-reference" in (info.value.diag.message_primary or "")


@pytest.mark.parametrize("sql, names", [
    ("SELECT * FROM adult LIMIT 0", None),  # every column, in the table's order
    ("SELECT age, sex AS s FROM public.adult WHERE age > 30 LIMIT 0", ["age", "s"]),
    ("SELECT * FROM (SELECT age, sex FROM adult WHERE age > 30) AS virtual_table LIMIT 0", ["age", "sex"]),
    ("SELECT age FROM adult FETCH FIRST 0 ROWS ONLY", ["age"]),
])
@pytest.mark.parametrize("prepare", [False, True])
def test_a_row_level_probe_that_asks_for_no_row_gets_the_columns_free(
    proxy: RunningProxy, sql: str, names: list[str] | None, prepare: bool
):
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        cur = conn.execute(sql, prepare=prepare)
        got = [column.name for column in cur.description or []]
        assert cur.fetchall() == [] and spent_epsilon(conn) == before
    if names is None:
        assert got[:2] == ["age", "workclass"] and len(got) > 5
    else:
        assert got == names


@pytest.mark.parametrize("sql", ["SELECT * FROM adult LIMIT 1", "SELECT age FROM adult WHERE age > 30",
                                 "SELECT age FROM adult OFFSET 0 LIMIT 0 + 1"])
def test_a_row_level_select_that_asks_for_rows_stays_refused(proxy: RunningProxy, sql: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.diag.sqlstate == "DP001"
    assert "rule: no-row-access" in (info.value.diag.message_primary or "")


def test_wrapper_columns_are_checked_against_the_projection(proxy: RunningProxy):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT count(*) FROM (SELECT age FROM adult) AS t WHERE sex = 'Male'")
    assert info.value.diag.sqlstate == "42703"


def test_a_misspelt_column_is_refused_with_the_column_meant_first_and_nothing_charged(proxy: RunningProxy):
    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT AVG(agee) FROM adult")
        assert spent_epsilon(conn) == spent
    assert info.value.diag.sqlstate == "42703"
    assert (info.value.diag.message_hint or "").startswith("Perhaps you meant age. Columns: age, ")


@pytest.mark.parametrize("tail", ["FETCH FIRST 10 ROWS ONLY", "FETCH FIRST ROW ONLY", "OFFSET 0", "LIMIT ALL",
                                  "LIMIT 3", "LIMIT 5 OFFSET 0", "OFFSET 0 ROWS FETCH NEXT 1 ROW ONLY"])
def test_row_limits_that_keep_the_one_row_answer_it(proxy: RunningProxy, tail: str):
    with proxy.connect() as conn:
        names, rows, _ = _answer(conn, f"SELECT count(*) AS n FROM adult WHERE age > 40 {tail}")
    assert names == ["n"] and len(rows) == 1


@pytest.mark.parametrize("tail", ["OFFSET 1", "LIMIT 0", "FETCH FIRST 0 ROWS ONLY", "LIMIT 1 OFFSET 2"])
def test_row_limits_that_drop_the_one_row_answer_no_row_and_cost_nothing(proxy: RunningProxy, tail: str):
    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        names, rows, _ = _answer(conn, f"SELECT count(*) AS n FROM adult WHERE age > 40 {tail}")
        assert spent_epsilon(conn) == spent
    assert names == ["n"] and rows == []


@pytest.mark.parametrize("prepare, binary", [(True, False), (True, True)])
def test_a_wrapper_through_the_extended_protocol(proxy: RunningProxy, prepare: bool, binary: bool):
    sql = "SELECT count(*) AS count_1 FROM (SELECT adult.age AS adult_age FROM adult WHERE adult.age > %s) AS anon_1"
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        cur = conn.cursor(binary=binary)
        for _ in range(2):
            cur.execute(sql, (40,), prepare=prepare)
            assert [c.name for c in cur.description or []] == ["count_1"]
            (row,) = cur.fetchall()
            assert isinstance(row[0], int)


@pytest.mark.parametrize("sql, names", [
    ("SELECT count(1), count('x') AS c FROM adult", ["count", "c"]),
    ("SELECT 'total' AS label, count(*) FROM adult WHERE age > 30", ["label", "count"]),
    ("SELECT sum(hours_per_week)::int, CAST(avg(age) AS integer) FROM adult", ["sum", "avg"]),
    ("SELECT round(avg(age), 2) AS avg_age, coalesce(sum(capital_gain), 0) FROM adult", ["avg_age", "coalesce"]),
    ("SELECT count(*) * 1.0 AS c, sum(age) / count(*) AS ratio, 100.0 * count(*) / nullif(count(*), 0) AS pct "
     "FROM adult", ["c", "ratio", "pct"]),
    ("SELECT count(1) AS a0 FROM adult HAVING count(1) > 0 ORDER BY a0 LIMIT 10", ["a0"]),
    # Outer queries over one released row.
    ("SELECT MAX(n) FROM (SELECT COUNT(*) AS n, AVG(hours_per_week) AS a FROM adult WHERE age > 30) t", ["max"]),
    ("SELECT t.n + 1 AS next FROM (SELECT count(*) AS n FROM adult) AS t", ["next"]),
    ("SELECT * FROM (SELECT count(*), sum(age) AS s FROM adult) AS t", ["count", "s"]),
])
def test_post_processing_of_the_released_row_is_answered(proxy: RunningProxy, sql: str, names: list[str]):
    with proxy.connect() as conn:
        got, rows, notices = _answer(conn, sql)
    assert got == names and len(rows) == 1 and None not in rows[0]
    assert any("ε charged 1" in n for n in notices)


def test_post_processing_costs_what_the_plain_release_costs(repeating: RunningProxy):
    # sum(x)/count(*), count(*) releases sum and count: the same as the plain statement, so a repeat.
    plain, names, rows, notices = _after_plain(
        repeating, "SELECT count(*), sum(hours_per_week) FROM adult WHERE age > 62",
        "SELECT sum(hours_per_week) / count(*) AS mean, count(*) AS n FROM adult WHERE age > 62 "
        "HAVING count(*) > 0 ORDER BY 1",
    )
    assert names == ["mean", "n"] and rows[0][1] == plain[0][0]
    assert any("repeat" in n and "count(*)" in n and "sum(hours_per_week)" in n for n in notices)


def test_a_division_by_a_noised_zero_fails_by_the_released_value_alone_and_says_what_it_was_charged(
        repeating: RunningProxy):
    # age > 100 + k holds no row: the noisy count (discrete Laplace at ε = 1, clamped at 0) is 0
    # with probability 0.73, and 1/count(*) then fails with PostgreSQL's 22012, after the charge.
    # The plain count, a repeat of the same release, shows the value each outcome came from.
    seen: set[bool] = set()
    with repeating.connect() as conn:
        for k in range(60):
            before = spent_epsilon(conn)
            try:
                answer = conn.execute(f"SELECT 1 / count(*) AS r FROM adult WHERE age > {100 + k}").fetchone()
            except psycopg.errors.DivisionByZero as exc:
                answer = None
                assert exc.diag.message_detail is not None and exc.diag.message_detail.startswith(
                    "dpproxy: ε charged 1, δ 0; count(*): laplace scale 1"), exc.diag.message_detail
            assert spent_epsilon(conn) - before == pytest.approx(1.0)
            released = conn.execute(f"SELECT count(*) FROM adult WHERE age > {100 + k}").fetchone()
            assert spent_epsilon(conn) - before == pytest.approx(1.0)  # the repeat is free
            assert released is not None
            if answer is None:
                assert released[0] == 0
                with pytest.raises(psycopg.errors.DivisionByZero) as again:  # a repeat fails alike, free
                    conn.execute(f"SELECT 1 / count(*) AS r FROM adult WHERE age > {100 + k}")
                assert "ε charged 0, δ 0 (a repeat" in (again.value.diag.message_detail or "")
                assert spent_epsilon(conn) - before == pytest.approx(1.0)
            else:
                assert released[0] != 0 and answer[0] == int(1 / released[0])
            seen.add(answer is None)
            if seen == {True, False}:
                break
    assert seen == {True, False}


def test_a_having_that_drops_the_row_answers_no_row_but_is_charged(proxy: RunningProxy):
    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        names, rows, _ = _answer(conn, "SELECT count(*) AS n FROM adult HAVING count(*) < -1000000")
        assert spent_epsilon(conn) == pytest.approx(spent + 1)
    assert names == ["n"] and rows == []


def test_a_metadata_probe_of_a_post_processed_statement_costs_nothing(proxy: RunningProxy):
    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        names, rows, _ = _answer(conn, "SELECT round(avg(age), 1) AS a, 'x' AS l FROM (SELECT * FROM adult) t LIMIT 0")
        assert spent_epsilon(conn) == spent
    assert names == ["a", "l"] and rows == []


@pytest.mark.parametrize("sql, sqlstate, rule", [
    ("SELECT count(*) + age FROM adult", "DP001", "no-row-access"),
    ("SELECT 'x' AS label FROM adult", "DP001", "no-row-access"),
    ("SELECT pg_sleep(1), count(*) FROM adult", "DP001", "function-allowlist"),
    ("SELECT count(*) FROM adult HAVING (SELECT count(*) FROM pg_class) > 0", "DP001", "no-subquery"),
    ("SELECT age, count(*) FROM adult GROUP BY age", "DP001", "no-group-by"),
    ("SELECT dpproxy_release._dp1 + count(*) FROM adult", "DP001", "column-reference"),
    ("SELECT n FROM (SELECT count(*) AS n FROM adult) AS t WHERE n > (SELECT 1)", "DP001", "no-subquery"),
    ("SELECT n, age FROM (SELECT count(*) AS n, age FROM adult) AS t", "DP001", "no-row-access"),
])
def test_post_processing_that_reads_rows_or_more_is_refused(proxy: RunningProxy, sql: str, sqlstate: str, rule: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.diag.sqlstate == sqlstate and f"rule: {rule}" in (info.value.diag.message_primary or "")


@pytest.mark.parametrize("binary", [False, True])
def test_post_processing_through_the_extended_protocol_and_describe_is_free(proxy: RunningProxy, binary: bool):
    sql = "SELECT round(avg(age), 2) AS avg_age, count(1) AS n FROM adult WHERE age > %s HAVING count(1) > 0"
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        cur = conn.cursor(binary=binary)
        cur.execute(sql, (40,), prepare=True)
        assert [c.name for c in cur.description or []] == ["avg_age", "n"]
        (row,) = cur.fetchall()
        assert isinstance(row[1], int) and row[0] is not None


def test_describing_a_post_processed_statement_without_running_it_is_free(proxy: RunningProxy):
    async def described() -> list[str]:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test", timeout=20)
        try:
            statement = await conn.prepare(
                "SELECT round(avg(age), 2) AS avg_age, count(1) AS n FROM (SELECT * FROM adult) t "
                "WHERE age > $1 HAVING count(1) > 0", timeout=20
            )
            return [attribute.name for attribute in statement.get_attributes()]
        finally:
            await conn.close(timeout=10)

    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        assert asyncio.run(described()) == ["avg_age", "n"]
        assert spent_epsilon(conn) == spent


def test_a_superset_chart_on_an_aggregate_virtual_dataset_is_a_repeat_of_its_probe(repeating: RunningProxy):
    dataset = "SELECT count(*) AS n, avg(age) AS avg_age FROM adult WHERE age > 33"
    plain, names, rows, notices = _after_plain(
        repeating, dataset, f'SELECT MAX(n) AS "MAX(n)" FROM ({dataset}) AS virtual_table LIMIT 1000'
    )
    assert names == ["MAX(n)"] and rows == [(plain[0][0],)]
    assert any("repeat" in n for n in notices)


_REFUSED_ORDER = {"no-row-access": "ORDER BY column age, outside an aggregate",
                  "order-by-unselected": "orders the one-row answer by an aggregate it does not select"}


@pytest.mark.parametrize("tail, sqlstate, rule", [
    ("ORDER BY age", "DP001", "no-row-access"),
    ("ORDER BY age + 1 DESC", "DP001", "no-row-access"),
    ("ORDER BY 5", "42P10", None),
    ("ORDER BY 1 / 0", "22012", None),
    # an aggregate not selected: dropped unread before (ORDER BY sum(nosuch) answered where
    # PostgreSQL says 42703), and an expression of one released it, ε taken from the count
    ("ORDER BY sum(age)", "DP001", "order-by-unselected"),
    ("ORDER BY avg(hours_per_week) DESC LIMIT 10", "DP001", "order-by-unselected"),
    ("ORDER BY count(age)", "DP001", "order-by-unselected"),
    ("ORDER BY mode() WITHIN GROUP (ORDER BY sex)", "DP001", "order-by-unselected"),
    ("ORDER BY 1 / sum(age)", "DP001", "order-by-unselected"),
    ("ORDER BY count(*), sum(capital_gain) DESC", "DP001", "order-by-unselected"),
    ("ORDER BY sum(nosuch)", "42703", None),
    ("ORDER BY nosuch + sum(age)", "42703", None),  # PostgreSQL's error, not the rule's
    ("ORDER BY sum(age) DESC, adult.nosuch", "42703", None),
    ("ORDER BY sum(sex)", "DP001", "aggregate-argument"),
])
def test_a_one_row_order_by_postgresql_would_reject_or_that_would_release_more_is_refused_and_costs_nothing(
        proxy: RunningProxy, tail: str, sqlstate: str, rule: str | None):
    # Over one row an ORDER BY orders nothing, so it used to be dropped: answered where
    # PostgreSQL fails (a column outside an aggregate is 42803 there).
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT count(*) FROM adult WHERE age > 30 {tail}")
        assert info.value.diag.sqlstate == sqlstate
        message = info.value.diag.message_primary or ""
        assert rule is None or f"(rule: {rule})" in message
        assert _REFUSED_ORDER.get(rule or "", "") in message
        if rule == "order-by-unselected":
            assert "One row needs no order" in (info.value.diag.message_hint or "")
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("sql", [
    "SELECT count(*), sum(age) FROM adult WHERE age > 33 ORDER BY sum(age) DESC",
    "SELECT count(*) AS n FROM adult WHERE age > 33 ORDER BY count(*) + 1, 1",
    "SELECT count(1) FROM adult WHERE age > 33 ORDER BY count(*)",
    "SELECT count(*) FROM adult WHERE age > 33 HAVING sum(age) > 0 ORDER BY sum(age)",
])
def test_a_one_row_order_by_of_aggregates_the_statement_asks_for_anyway_is_answered(proxy: RunningProxy, sql: str):
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        assert len(conn.execute(sql).fetchall()) <= 1
        assert spent_epsilon(conn) - before == pytest.approx(1.0)


@pytest.mark.parametrize("tail", ["ORDER BY count(*) DESC", "ORDER BY 1", "ORDER BY n"])
def test_an_order_by_of_the_answer_itself_is_answered(proxy: RunningProxy, tail: str):
    with proxy.connect() as conn:
        assert len(conn.execute(f"SELECT count(*) AS n FROM adult WHERE age > 31 {tail}").fetchall()) == 1


@pytest.mark.parametrize("call", ["set_config('search_path', 'nowhere', false)", "pg_advisory_unlock_all()"])
def test_post_processing_cannot_change_the_session(proxy: RunningProxy, call: str):
    # set_config() over a DP answer would move search_path behind dpproxy's relation cache.
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT count(*), {call} FROM adult")
        assert info.value.diag.sqlstate == "DP001"
        assert "changes the session" in (info.value.diag.message_primary or "")
        assert conn.execute("SELECT current_setting('search_path')").fetchone() != ("nowhere",)


def test_a_session_changing_call_is_refused_also_where_the_one_row_answer_drops_it_unrun(proxy: RunningProxy):
    # A one-row answer's ORDER BY of aggregates orders nothing and is dropped: post-processing never
    # sees it, so only the check of the statement's function names refuses the setting there.
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT count(*) FROM adult ORDER BY max(set_config('search_path', 'nowhere', false))")
        assert info.value.diag.sqlstate == "DP001"
        assert "changes the session" in (info.value.diag.message_primary or "")
