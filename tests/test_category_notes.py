"""A literal compared with a categorical column that is not among its declared categories gets a
NOTICE, computed from the policy and the statement alone (rewriter/category_notes.py): the demo's
``WHERE sex = 'male'`` was answered with a noised count near 0 and no word."""

from __future__ import annotations

import os
import subprocess
from typing import Iterator

import psycopg
import pytest
from conftest import TEST_DATABASE, RunningProxy, psql_path, spent_epsilon

from policies.model import ColumnPolicy
from policies.tables import ColumnInfo
from proxy.demo.load import load_demo
from rewriter.category_notes import category_note

_MALE = "dpproxy: 'male' is not one of the declared categories of sex; did you mean 'Male'?"


@pytest.fixture(scope="module")
def demo(pg_admin_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy under the demo's policy (sex: Male, Female; race: five categories; repeats on)."""
    directory = tmp_path_factory.mktemp("demo")
    policy = load_demo(pg_admin_dsn, directory / "policy.yaml", database=TEST_DATABASE, port=0,
                       ledger=directory / "ledger.sqlite3")
    running = RunningProxy(policy)
    try:
        yield running
    finally:
        running.stop()


def _answer(proxy: RunningProxy, sql: str, params: tuple[object, ...] | None = None) -> tuple[list[str], list[tuple]]:
    """The notices of ``sql``'s answer, in order, and its rows."""
    notices: list[str] = []
    with proxy.connect(autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        rows = conn.execute(sql, params).fetchall()
    return notices, rows


@pytest.mark.parametrize(("sql", "notes"), [
    ("SELECT COUNT(*) FROM adult WHERE sex = 'male'", [_MALE]),
    ("SELECT COUNT(*) FROM adult WHERE 'male' = sex", [_MALE]),
    ("SELECT COUNT(*) FROM adult WHERE sex <> ' Male'",
     ["dpproxy: ' Male' is not one of the declared categories of sex; did you mean 'Male'?"]),
    ("SELECT COUNT(*) FROM adult WHERE sex IN ('Male', 'FEMALE') AND age > 30",
     ["dpproxy: 'FEMALE' is not one of the declared categories of sex; did you mean 'Female'?"]),
    ("SELECT COUNT(*) FROM adult WHERE sex NOT IN ('male')", [_MALE]),
    ("SELECT COUNT(*) FILTER (WHERE sex = 'male') FROM adult", [_MALE]),
    ("SELECT SUM(CASE WHEN sex = 'male' THEN 1 ELSE 0 END) FROM adult", [_MALE]),
    ("SELECT COUNT(*) FROM adult WHERE sex = 'male' OR sex = 'male'", [_MALE]),  # once per literal
    ("SELECT sex, COUNT(*) FROM adult WHERE race = 'white' GROUP BY sex",
     ["dpproxy: 'white' is not one of the declared categories of race; did you mean 'White'?"]),
    ("SELECT COUNT(*) FROM adult WHERE race = 'Martian'",
     ["dpproxy: 'Martian' is not one of the declared categories of race ('White', 'Black', 'Asian-Pac-Islander', "
      "'Amer-Indian-Eskimo', 'Other'); the condition is applied as written"]),
])
def test_a_literal_not_among_declared_categories_gets_a_notice_before_the_answer_s(
        demo: RunningProxy, sql: str, notes: list[str]):
    notices, _ = _answer(demo, sql)
    assert notices[:-1] == notes
    assert notices[-1].startswith("dpproxy: ε charged")


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE sex = 'Male'",
    "SELECT COUNT(*) FROM adult WHERE sex IN ('Male', 'Female')",
    "SELECT COUNT(*) FROM adult WHERE lower(sex) = 'male'",  # lowered on purpose
    "SELECT COUNT(*) FROM adult WHERE sex LIKE 'male%'",
    "SELECT COUNT(*) FROM adult WHERE sex = CAST('male' AS text)",
    "SELECT COUNT(*) FROM adult WHERE sex > 'male'",
    "SELECT COUNT(*) FROM adult WHERE education = 'bachelors'",  # declares no categories
])
def test_what_is_not_noted(demo: RunningProxy, sql: str):
    notices, _ = _answer(demo, sql)
    assert len(notices) == 1 and notices[0].startswith("dpproxy: ε charged"), notices


def test_a_parameter_is_not_noted(demo: RunningProxy):
    notices, _ = _answer(demo, "SELECT COUNT(*) FROM adult WHERE sex = %s", ("male",))
    assert len(notices) == 1 and notices[0].startswith("dpproxy: ε charged"), notices


def test_a_noted_statement_is_charged_once_and_its_repeat_is_the_same_release_with_the_same_note(demo: RunningProxy):
    sql = "SELECT COUNT(*) FROM adult WHERE sex = 'male' AND age > 47"
    with demo.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
    first, first_rows = _answer(demo, sql)
    with demo.connect(autocommit=True) as conn:
        assert spent_epsilon(conn) == pytest.approx(before + 1)
    again, again_rows = _answer(demo, sql)
    with demo.connect(autocommit=True) as conn:
        assert spent_epsilon(conn) == pytest.approx(before + 1)
    assert again_rows == first_rows
    assert first[0] == again[0] == _MALE
    assert "a repeat of an earlier answer" in again[1]
    # The notice of the charge reads as it does for a statement that gets no note.
    plain, _ = _answer(demo, "SELECT COUNT(*) FROM adult WHERE sex = 'Male' AND age > 47")
    assert first[1].split("; remaining")[0] == plain[0].split("; remaining")[0]


def test_a_noted_copy_and_cursor_carry_the_note_too(demo: RunningProxy):
    notices: list[str] = []
    with demo.connect(autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        with conn.cursor() as cur, cur.copy("COPY (SELECT COUNT(*) FROM adult WHERE sex = 'male' AND age > 51) "
                                            "TO STDOUT") as copy:
            b"".join(bytes(chunk) for chunk in copy)
    assert notices[0] == _MALE and notices[1].startswith("dpproxy: ε charged")


def _column(type_oid: int, categories: list[str], other: str | None = None, deterministic: bool = True,
            enum: bool = False) -> ColumnInfo:
    policy = ColumnPolicy(categories=categories, other=other, group_by=other is not None)
    return ColumnInfo("c", type_oid, -1, 1, policy, deterministic_collation=deterministic, enum=enum)


def test_the_note_follows_the_column_s_type_and_collation():
    assert category_note(_column(25, ["Male"]), "Male ") == \
        "dpproxy: 'Male ' is not one of the declared categories of c; did you mean 'Male'?"
    assert category_note(_column(1042, ["Male"]), "Male  ") is None  # char(n): one value
    assert category_note(_column(25, ["Male"], deterministic=False), "male") is None  # may be equal
    assert category_note(_column(25, ["Male"], enum=True), "male") is None
    assert category_note(_column(16, ["t", "f"]), "yes") is None  # a boolean reads 'yes' as true
    assert category_note(_column(25, ["Male", "male"]), "MALE") == (
        "dpproxy: 'MALE' is not one of the declared categories of c; did you mean 'Male' or 'male'?")
    assert category_note(_column(25, ["a", "b"], other="Other"), "Other") == (
        "dpproxy: 'Other' is the 'other' key of c, not one of its declared categories: a condition matches the rows "
        "holding 'Other' itself, not the NULL and undeclared values its GROUP BY key collects")
    many = [f"k{i}" for i in range(12)]
    assert category_note(_column(25, many), "O'Brien") == (
        "dpproxy: 'O''Brien' is not one of the declared categories of c ('k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', "
        "'k7', 'k8', 'k9' and 2 more (SHOW dpproxy.columns lists them)); the condition is applied as written")


def test_a_long_in_list_of_misses_gets_five_notices_at_most(demo: RunningProxy):
    values = ", ".join(f"'r{i}'" for i in range(8))
    notices, _ = _answer(demo, f"SELECT COUNT(*) FROM adult WHERE race IN ({values})")
    assert len(notices) == 6 and notices[4] == "dpproxy: 4 more literals not among declared categories"


def test_the_demo_answers_a_misspelt_category_with_its_note_in_psql(demo: RunningProxy):
    result = subprocess.run(
        [psql_path(), "-X", f"host={demo.host} port={demo.port} dbname={TEST_DATABASE} user=analyst",
         "-c", "SELECT COUNT(*) FROM adult WHERE sex = 'male'"],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": "analyst"}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines()[0] == f"NOTICE:  {_MALE}"
