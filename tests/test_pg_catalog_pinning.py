"""Passthrough statements run PostgreSQL's own functions, operators and types, whatever the search_path.

A database owner (or, up to PostgreSQL 14, any role) can create objects in ``public`` that
shadow pg_catalog's: ``public.version()``, exact-type overloads such as ``public.upper(name)``
that win over ``pg_catalog.upper(text)`` even with pg_catalog first on the path, operators
such as ``public.=(name, name)``, domains named ``text`` or ``regclass``. Here every one of
them raises, so a statement that reached one fails; through dpproxy none may run, under the
default path and under ``SET search_path TO public, pg_catalog`` alike.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from pglast import parse_sql
from pglast import ast as pg_ast
from pglast.visitors import Visitor

from captured import Captured, adapt, load_captured
from conftest import RunningProxy, TestDatabase
from policies.errors import Refusal
from rewriter.qualify import qualify
from rewriter.statements import split_statements

_RAISE = "LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'planted object ran'; END$$"
_PLANTED_OPERATORS = (
    ("=", "name", "name"), ("<>", "name", "name"), ("=", "oid", "oid"), ("=", "oid", "regclass"),
    ("=", '"char"', '"char"'), ("=", "text", "text"), ("~~", "name", "text"), ("!~~", "name", "text"),
    (">=", "smallint", "integer"), ("<=", "smallint", "integer"), ("<", "name", "name"),
)
PLANT = [
    f"CREATE FUNCTION public.version() RETURNS text {_RAISE}",
    f"CREATE FUNCTION public.upper(name) RETURNS text {_RAISE}",
    f"CREATE FUNCTION public.lower(varchar) RETURNS text {_RAISE}",
    f"CREATE FUNCTION public.current_schemas(boolean) RETURNS name[] {_RAISE}",
    f"CREATE FUNCTION public.dpproxy_planted_check(anyelement) RETURNS boolean {_RAISE}",
    "CREATE DOMAIN public.text AS pg_catalog.text CHECK (public.dpproxy_planted_check(VALUE))",
    "CREATE DOMAIN public.regclass AS pg_catalog.regclass CHECK (public.dpproxy_planted_check(VALUE))",
]
for _i, (_op, _left, _right) in enumerate(_PLANTED_OPERATORS):
    PLANT.append(f"CREATE FUNCTION public.dpproxy_planted_op{_i}({_left}, {_right}) RETURNS boolean {_RAISE}")
    PLANT.append(f"CREATE OPERATOR public.{_op} (LEFTARG = {_left}, RIGHTARG = {_right}, "
                 f"FUNCTION = public.dpproxy_planted_op{_i})")
UNPLANT = [
    "DROP DOMAIN IF EXISTS public.text, public.regclass CASCADE",
    "DROP FUNCTION IF EXISTS public.version(), public.upper(name), public.lower(varchar), "
    "public.current_schemas(boolean), public.dpproxy_planted_check(anyelement) CASCADE",
    *(f"DROP FUNCTION IF EXISTS public.dpproxy_planted_op{i}({left}, {right}) CASCADE"
      for i, (_, left, right) in enumerate(_PLANTED_OPERATORS)),
]
PATHS = (None, "public, pg_catalog")


@pytest.fixture(scope="module")
def planted(test_db: TestDatabase) -> Iterator[None]:
    """The shadowing objects in public, created by a superuser; dropped again afterwards."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for statement in UNPLANT + PLANT:
            conn.execute(statement)
        conn.execute("SET search_path TO public, pg_catalog")
        with pytest.raises(psycopg.errors.RaiseException, match="planted object ran"):
            conn.execute("SELECT version()")  # the trap works when nothing pins the names
    try:
        yield
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            for statement in UNPLANT:
                conn.execute(statement)


def _connect(proxy: RunningProxy, path: str | None) -> psycopg.Connection:
    conn = proxy.connect(connect_timeout=10)
    if path is not None:
        conn.execute(f"SET search_path TO {path}")
    return conn


@pytest.mark.parametrize("path", PATHS)
def test_version_is_postgresqls_own(planted: None, proxy: RunningProxy, path: str | None):
    with _connect(proxy, path) as conn:
        (version,) = conn.execute("SELECT version()").fetchone()
    assert version.startswith("PostgreSQL ")


@pytest.mark.parametrize("path", PATHS)
def test_exact_type_overloads_in_public_are_not_called(planted: None, proxy: RunningProxy, path: str | None):
    with _connect(proxy, path) as conn:
        row = conn.execute(
            "SELECT upper(relname), lower(relname::varchar) FROM pg_class WHERE relname = 'pg_type'"
        ).fetchone()
    assert row == ("PG_TYPE", "pg_type")


# Each form hides an operator lookup PostgreSQL makes by name; the expected value is
# what PostgreSQL's own operators give.
HIDDEN_OPERATORS = {
    "IN": ("SELECT count(*) FROM pg_class WHERE relname IN ('pg_type', 'pg_class')", 2),
    "NOT IN": ("SELECT 'pg_type'::name NOT IN ('pg_class', 'pg_proc')", True),
    "IN subquery": ("SELECT 'pg_type'::name IN (SELECT relname FROM pg_class)", True),
    "BETWEEN": ("SELECT count(*) FROM pg_attribute WHERE attrelid = 'pg_type'::regclass "
                "AND attnum BETWEEN 1 AND 3", 3),
    "NOT BETWEEN SYMMETRIC": ("SELECT count(*) FROM pg_attribute WHERE attrelid = 'pg_type'::regclass "
                              "AND attnum > 0 AND attnum NOT BETWEEN SYMMETRIC 3 AND 1", None),
    "NULLIF": ("SELECT NULLIF(relname, 'pg_type') FROM pg_class WHERE relname = 'pg_type'", None),
    "CASE x WHEN": ("SELECT CASE relkind WHEN 'r' THEN 'table' ELSE 'other' END FROM pg_class "
                    "WHERE relname = 'pg_type'", "table"),
    "IS DISTINCT FROM": ("SELECT relname IS DISTINCT FROM 'pg_class' FROM pg_class WHERE relname = 'pg_type'", True),
    "IS NOT DISTINCT FROM": ("SELECT NULL::name IS NOT DISTINCT FROM NULL::name", True),
    "LIKE": ("SELECT count(*) FROM pg_class WHERE relname LIKE 'pg_typ_'", 1),
    "NOT LIKE ESCAPE": ("SELECT 'pg_type'::name NOT LIKE 'pg!_type' ESCAPE '!'", False),
    "ANY": ("SELECT 'pg_type'::name = ANY(ARRAY['pg_type', 'x']::name[])", True),
    "row comparison": ("SELECT ('pg_type'::name, 1) < ('pg_typf'::name, 0)", True),
    "JOIN USING": ("SELECT count(*) FROM pg_namespace n JOIN (SELECT 'pg_catalog'::name AS nspname) s "
                   "USING (nspname)", 1),
    "ORDER BY": ("SELECT relname FROM pg_class WHERE relname IN ('pg_type', 'pg_class') ORDER BY relname", "pg_class"),
    "oid = regclass": ("SELECT relname FROM pg_class WHERE oid = 'pg_type'::regclass", "pg_type"),
    "cast to text": ("SELECT 'x'::text || relname FROM pg_class WHERE oid = 1247", "xpg_type"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("form", HIDDEN_OPERATORS)
def test_operators_hidden_in_sql_forms_are_pg_catalogs(planted: None, proxy: RunningProxy, path: str | None,
                                                       form: str):
    sql, expected = HIDDEN_OPERATORS[form]
    with _connect(proxy, path) as conn:
        row = conn.execute(sql).fetchone()
    if form == "NOT BETWEEN SYMMETRIC":
        assert row[0] > 0
    else:
        assert row[0] == expected


CATALOG = [c for c in load_captured() if c.category == "catalog" and not re.search(r"\$\d", c.sql)]


@pytest.mark.parametrize("captured", CATALOG, ids=[c.id for c in CATALOG])
def test_client_catalog_queries_never_reach_a_planted_object(planted: None, proxy: RunningProxy,
                                                             captured: Captured):
    with _connect(proxy, "public, pg_catalog") as conn:
        oid = conn.execute("SELECT 'public.adult'::regclass::oid").fetchone()[0]
        conn.execute(adapt(captured.sql, oid)).fetchall()


@pytest.mark.parametrize("sql", ["SELECT public.version()", "SELECT 1 OPERATOR(public.=) 1", "SELECT 'x'::public.text"])
def test_names_qualified_with_another_schema_are_refused(proxy: RunningProxy, sql: str):
    with _connect(proxy, None) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        conn.execute(sql)
    assert "pg-catalog-names" in str(info.value) or "function-allowlist" in str(info.value)


@pytest.mark.parametrize("sql", [
    "SELECT relname FROM pg_class ORDER BY relname USING <",
    "SELECT count(*) FROM pg_namespace NATURAL JOIN pg_class",
    "SELECT count(*) FROM pg_class TABLESAMPLE bernoulli(50)",
    "SELECT count(*) FROM pg_namespace JOIN (SELECT 'pg_catalog'::name AS nspname) s USING (nspname) "
    "WHERE nspname = 'pg_catalog'",
])
def test_forms_that_cannot_be_pinned_are_refused_with_a_hint(proxy: RunningProxy, sql: str):
    with _connect(proxy, None) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported) as info:
            conn.execute(sql)
        assert info.value.diag.message_hint
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on


class _Unpinned(Visitor):  # type: ignore[misc]
    """Collects every function, operator and type name the statement leaves to the search_path."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def visit_FuncCall(self, ancestors, node):  # type: ignore[no-untyped-def]
        self._check(node.funcname)

    def visit_TypeName(self, ancestors, node):  # type: ignore[no-untyped-def]
        self._check(node.names)

    def visit_A_Expr(self, ancestors, node):  # type: ignore[no-untyped-def]
        if node.kind.name not in ("AEXPR_OP", "AEXPR_OP_ANY", "AEXPR_OP_ALL"):
            self.found.append(node.kind.name)
        self._check(node.name)

    def visit_SubLink(self, ancestors, node):  # type: ignore[no-untyped-def]
        if node.subLinkType.name in ("ANY_SUBLINK", "ALL_SUBLINK", "ROWCOMPARE_SUBLINK"):
            self._check(node.operName)

    def visit_CaseExpr(self, ancestors, node):  # type: ignore[no-untyped-def]
        if node.arg is not None:
            self.found.append("CASE x WHEN")

    def visit_JoinExpr(self, ancestors, node):  # type: ignore[no-untyped-def]
        if node.usingClause or node.isNatural:
            self.found.append("JOIN USING")

    def _check(self, names: tuple[pg_ast.String, ...] | None) -> None:
        parts = [n.sval for n in names or ()]
        if len(parts) != 2 or parts[0] not in ("pg_catalog", "information_schema"):
            self.found.append(".".join(parts))


def test_every_captured_client_select_is_fully_pinned():
    """The systematic check: after qualify, no captured client SELECT leaves a name to the search_path."""
    checked = 0
    for captured in load_captured():
        for statement in split_statements(captured.sql):
            if statement.kind == "SelectStmt":
                visitor = _Unpinned()
                visitor(parse_sql(qualify(statement.text))[0])
                assert visitor.found == [], (visitor.found, captured.id)
                checked += 1
    assert checked > 80


# The rewrites must mean what the forms they replace mean, NULLs included. Each template is
# evaluated for every pair/triple of these values, as written and as qualify rewrites it.
_VALUES = ("NULL::int", "1", "2", "3")
_FORMS = (
    "{a} IN ({b}, {c})", "{a} NOT IN ({b}, {c})", "{a} IN ({b})", "{a} BETWEEN {b} AND {c}",
    "{a} NOT BETWEEN {b} AND {c}", "{a} BETWEEN SYMMETRIC {b} AND {c}", "{a} NOT BETWEEN SYMMETRIC {b} AND {c}",
    "NULLIF({a}, {b})", "{a} IS DISTINCT FROM {b}", "{a} IS NOT DISTINCT FROM {b}",
    "CASE {a} WHEN {b} THEN 'x' WHEN {c} THEN 'y' ELSE 'z' END", "{a} = ANY(ARRAY[{b}, {c}])",
    "({a}, {b}) < ({c}, {a})", "{a} IN (SELECT {b} UNION ALL SELECT {c})", "{a} NOT IN (SELECT {b})",
    "{a}::text LIKE {b}::text || '%'", "{a}::text NOT ILIKE {c}::text",
)


@pytest.mark.parametrize("form", _FORMS)
def test_rewritten_forms_mean_the_same_on_every_null_and_order(admin: psycopg.Connection, form: str):
    cases = [form.format(a=a, b=b, c=c) for a in _VALUES for b in _VALUES for c in _VALUES]
    original = "SELECT " + ", ".join(f"({case})::text" for case in cases)
    rewritten = qualify(original)
    assert "OPERATOR(pg_catalog." in rewritten
    assert admin.execute(rewritten).fetchone() == admin.execute(original).fetchone()


_KEY_COLLATION = frozenset({("public", "dp ci")})


def test_a_released_keys_own_collation_is_let_through_on_its_unnest_only():
    """dpproxy's ``COLLATE`` of a key's column's collation on the key's ``unnest($k)`` in an outer
    statement (rewriter/post_process.py) may name its schema; nothing else may, not even with it given."""
    own = 'SELECT pg_catalog.unnest($1) COLLATE public."dp ci" AS _k1'
    assert qualify(own, collations=_KEY_COLLATION) == own
    for sql, collations in [
        (own, frozenset()),  # not given: the analyst's statement
        (own, frozenset({("public", "other")})),
        ('SELECT x COLLATE public."dp ci" FROM (SELECT pg_catalog.unnest($1) AS x) AS r', _KEY_COLLATION),
        ("SELECT 'b' COLLATE public.\"dp ci\"", _KEY_COLLATION),
        ('SELECT pg_catalog.unnest(ARRAY[\'b\']) COLLATE public."dp ci"', _KEY_COLLATION),
        ('SELECT pg_catalog.unnest($1, $2) COLLATE public."dp ci"', _KEY_COLLATION),
        ('SELECT public.unnest($1) COLLATE public."dp ci"', _KEY_COLLATION),
    ]:
        with pytest.raises(Refusal) as refused:
            qualify(sql, collations=collations)
        assert refused.value.rule == "pg-catalog-names", sql
