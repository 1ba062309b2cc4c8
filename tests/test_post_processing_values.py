"""Post-processing of a release calls value functions only, and no release decides how long its answer is.

A DP statement's outer expressions (``round(avg(x), 2)``, ``sum(n) / 7``, a CASE, a wrapper
query) run on the backend over the released values (``rewriter.post_process``). Catalog
statements may call the catalog helpers (``format_type``, ``pg_get_*def``, ``to_regclass`` ...);
over a release they would look the catalog up by a released number (``pg_describe_object``
answered XX000, ``pg_tablespace_location`` 58P01, ``count(*)::regclass`` a relation's name),
so they, casts to oid and the reg* types, and the calls whose output a released value could make
as long as it is large (``format('%*s', count(*)::int, 'x')``, a lengthening ``replace``) are
refused from the statement's text, before any charge. Value functions are answered as before.
"""

from __future__ import annotations

import psycopg
import pytest

from rewriter.catalog import PASSTHROUGH_FUNCTIONS, VALUE_FUNCTIONS
from tests.conftest import RunningProxy, spent_epsilon


def _refused(proxy: RunningProxy, sql: str, rule: str) -> psycopg.Error:
    """The error ``sql`` gets: DP001 naming ``rule``, with a hint, and nothing charged."""
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "DP001", (sql, refused.value.sqlstate, str(refused.value))
        assert f"(rule: {rule})" in str(refused.value), (sql, str(refused.value))
        assert refused.value.diag.message_hint, sql
        assert spent_epsilon(conn) == before, sql
    return refused.value


@pytest.mark.parametrize("sql", [
    "SELECT pg_describe_object(count(*)::int, 1, 0) FROM adult",
    "SELECT pg_tablespace_location(count(*)::int) FROM adult",
    "SELECT format_type(count(*)::int, NULL) FROM adult",
    "SELECT pg_get_userbyid(count(*)::int) FROM adult",
    "SELECT obj_description(count(*)::int) FROM adult",
    "SELECT pg_get_viewdef(count(*)::int) FROM adult",
    "SELECT has_table_privilege(count(*)::int, 'select') FROM adult",
    "SELECT to_regclass(count(*)::text) FROM adult",
    "SELECT (count(*)::text).to_regclass FROM adult",
    "SELECT round(avg(age)), n FROM (SELECT pg_get_userbyid(count(*)::int) AS n, avg(age) FROM adult) AS t "
    "GROUP BY n",
])
def test_a_catalog_function_over_a_release_is_refused_before_the_charge(proxy: RunningProxy, sql: str) -> None:
    error = _refused(proxy, sql, "function-allowlist")
    assert "reads the catalog" in str(error) and "value functions" in (error.diag.message_hint or "")


def test_every_catalog_function_is_refused_on_a_protected_table(proxy: RunningProxy) -> None:
    # Refused by its name, whatever its arguments: the call is never run.
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        for name in sorted(PASSTHROUGH_FUNCTIONS - VALUE_FUNCTIONS):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(f"SELECT {name}(count(*)) FROM adult")
            assert refused.value.sqlstate == "DP001" and "(rule: function-allowlist)" in str(refused.value), name
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("sql", [
    "SELECT count(*)::regclass FROM adult",
    "SELECT count(*)::oid FROM adult",
    "SELECT CAST(count(*)::int AS regtype) FROM adult",
    "SELECT count(*)::text::pg_lsn FROM adult",
    "SELECT (count(*)).oid FROM adult",
    "SELECT (count(*)::text).xid FROM adult",
    "SELECT regclass 'adult', count(*) FROM adult",
    "SELECT n::regclass FROM (SELECT count(*) AS n FROM adult) AS t",
])
def test_a_cast_to_an_identifier_type_over_a_release_is_refused_before_the_charge(
    proxy: RunningProxy, sql: str
) -> None:
    error = _refused(proxy, sql, "value-types")
    assert "value types" in (error.diag.message_hint or "")


@pytest.mark.parametrize("sql", [
    "SELECT format('%*s', count(*)::int, 'x') FROM adult",
    "SELECT length(format('%1$*2$s', 'x', count(*)::int)) FROM adult",
    "SELECT format('%-*s|', sum(age)::int, '') FROM adult",
    "SELECT format(count(*)::text, 'x') FROM adult",
    "SELECT replace(count(*)::text, '1', '1111111111') FROM adult",
    "SELECT replace(replace(n::text, '4', 'xxxx'), 'x', 'xxxx') FROM (SELECT count(*) AS n FROM adult) AS t",
    "SELECT replace(count(*)::text, '1', count(*)::text) FROM adult",
])
def test_an_output_a_release_sizes_is_refused_and_every_session_goes_on(proxy: RunningProxy, sql: str) -> None:
    error = _refused(proxy, sql, "sized-output")
    assert "how long the answer is" in (error.diag.message_hint or "")
    with proxy.connect() as conn, proxy.connect() as other:
        with pytest.raises(psycopg.Error):
            conn.execute(sql)
        for session in (conn, other):
            row = session.execute("SELECT count(*) FROM adult").fetchone()
            assert row is not None and row[0] > 0


@pytest.mark.parametrize(("sql", "check"), [
    ("SELECT format('%s people', count(*)) FROM adult", lambda v: v.endswith(" people")),
    ("SELECT format('%10s|', count(*)) FROM adult", lambda v: len(v) == 11),
    ("SELECT replace(round(avg(age), 2)::text, '.', ',') FROM adult", lambda v: "," in v),
    ("SELECT replace(count(*)::text, '1', '') FROM adult", lambda v: "1" not in v),
    ("SELECT count(*)::numeric(12, 1)::varchar FROM adult", lambda v: v.endswith(".0")),
    ("SELECT CAST(sum(age) AS double precision) > 0 FROM adult", lambda v: v is True),
    ("SELECT to_json(count(*))::text ~ '^[0-9-]+$' FROM adult", lambda v: v is True),
    ("SELECT pg_typeof(count(*))::text FROM adult", lambda v: v == "bigint"),
    ("SELECT date_trunc('year', now())::date <= current_date, count(*) > -1000 FROM adult", lambda v: v is True),
])
def test_value_functions_over_a_release_are_answered(proxy: RunningProxy, sql: str, check) -> None:  # type: ignore[no-untyped-def]
    with proxy.connect() as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None and check(row[0]), (sql, row)
