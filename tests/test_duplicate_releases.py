"""Identical aggregates in one statement are one release (proxy/dp/release_units.py).

Two columns released by the same mechanism with the same parameters from the same exact backend
parts (``count(*), count(*)``; a FILTER and the CASE form of one condition; two MIN of one
column by sample and aggregate; one percentile twice; one MODE twice) are drawn once, with one
share of ε, and carry one value, as PostgreSQL answers identical expressions identically: the ε
of the statement is split over its distinct releases, and the notice says of the second that it
is the same release as the first, at no more ε.
"""

from __future__ import annotations

import re

import psycopg
import pytest
from conftest import RunningProxy, spent_epsilon

_MEDIAN = "percentile_cont(0.5) WITHIN GROUP (ORDER BY age)"
_MODE = "mode() WITHIN GROUP (ORDER BY sex)"


def _notices(conn: psycopg.Connection) -> list[str]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    return notices


def _asked(proxy: RunningProxy, sql: str, binary: bool = False) -> tuple[list[tuple], float, str]:
    """``sql``'s rows, the ε it cost (SHOW dpproxy.budget) and its notice (binary: prepared,
    with binary results)."""
    with proxy.connect() as conn:
        notices = _notices(conn)
        before = spent_epsilon(conn)
        rows = conn.execute(sql, prepare=binary or None, binary=binary).fetchall()
        spent = spent_epsilon(conn) - before
    (notice,) = [n for n in notices if "ε charged" in n]
    return rows, spent, notice


def _columns(notice: str) -> dict[str, str]:
    """Each column's noise as a notice of one row describes it, by the column's name, without the
    95% bound (a variance's depends on its noisy count)."""
    body = notice.split("; ", 1)[1].rsplit("; remaining", 1)[0]
    parts = re.split(r", (?=[a-z_]+: )", body)
    return {name: text.split(" (95%")[0] for name, text in (part.split(": ", 1) for part in parts)}


@pytest.mark.parametrize("sql, alone", [
    ("SELECT count(*) AS a, count(*) AS b FROM adult", "SELECT count(*) AS a FROM adult"),
    ("SELECT count(*) AS a, count(*) AS b, sum(age) AS s FROM adult", "SELECT count(*) AS a, sum(age) AS s FROM adult"),
    # one condition as FILTER, as COUNT(CASE) and as a numeric SUM(CASE): one release; another condition another
    ("SELECT count(*) FILTER (WHERE sex = 'Male') AS a, count(CASE WHEN sex = 'Male' THEN 1 END) AS b, "
     "sum(CASE WHEN sex = 'Male' THEN 1 ELSE 0.0 END) AS c, count(*) FILTER (WHERE sex = 'Female') AS d FROM adult",
     "SELECT count(*) FILTER (WHERE sex = 'Male') AS a, count(*) FILTER (WHERE sex = 'Female') AS d FROM adult"),
    # sample and aggregate: two MIN of one column are one release, the MAX another
    ("SELECT min(hours_per_week) AS a, min(hours_per_week) AS b, max(hours_per_week) AS m FROM adult",
     "SELECT min(hours_per_week) AS a, max(hours_per_week) AS m FROM adult"),
    (f"SELECT {_MEDIAN} AS a, {_MEDIAN} AS b, percentile_cont(0.25) WITHIN GROUP (ORDER BY age) AS q FROM adult",
     f"SELECT {_MEDIAN} AS a, percentile_cont(0.25) WITHIN GROUP (ORDER BY age) AS q FROM adult"),
    (f"SELECT {_MODE} AS a, {_MODE} AS b, sum(capital_gain) AS m, sum(capital_gain) AS n FROM adult",
     f"SELECT {_MODE} AS a, sum(capital_gain) AS m FROM adult"),
    ("SELECT var_pop(age) AS a, var_pop(age) AS b, count(*) AS n FROM adult",
     "SELECT var_pop(age) AS a, count(*) AS n FROM adult"),
])
def test_the_epsilon_is_split_over_distinct_releases_and_a_duplicate_is_the_same_release(
        histogram_proxy: RunningProxy, sql: str, alone: str) -> None:
    """Every column the statement without its duplicates has is described as there (the same
    mechanism at the same scale: the same share of ε); each duplicate is "the same release as"
    its first, at no more ε; the charge is the statement's ε once."""
    _, spent, notice = _asked(histogram_proxy, sql)
    _, _, notice_alone = _asked(histogram_proxy, alone)
    assert spent == pytest.approx(1.0), notice
    described, expected = _columns(notice), _columns(notice_alone)
    for name, text in described.items():
        if name in expected:
            assert text == expected[name], (notice, notice_alone)
        else:
            first = {"b": "a", "c": "a", "n": "m"}[name]
            assert text == f"the same release as {first}, no more ε", notice


@pytest.mark.parametrize("binary", [False, True])
def test_duplicate_columns_carry_one_value_in_text_and_binary(histogram_proxy: RunningProxy, binary: bool) -> None:
    """Each pair is one draw: equal values, each in its own column's type (a count as bigint and
    as the numeric a SUM(CASE ... ELSE 0.0) gives); a sample-and-aggregate pair costs δ once."""
    sampled = ("SELECT count(*) FILTER (WHERE age > 30), count(CASE WHEN age > 30 THEN 1 END), "
               "sum(CASE WHEN age > 30 THEN 1 ELSE 0.0 END), min(hours_per_week), "
               f"min(hours_per_week), {_MODE}, {_MODE} FROM adult")
    ranked = (f"SELECT {_MEDIAN}, {_MEDIAN}, percentile_disc(ARRAY[0.25, 0.75]) WITHIN GROUP (ORDER BY age), "
              "percentile_disc(ARRAY[0.25, 0.75]) WITHIN GROUP (ORDER BY age) FROM adult")
    for _ in range(3):  # independent draws would differ (a count's scale is 3 here, k = 3)
        ((count, again, numeric, least, least_again, mode, mode_again),), _, notice = _asked(histogram_proxy, sampled,
                                                                                             binary)
        assert count == again == numeric and isinstance(count, int) and str(numeric).endswith(".0"), notice
        assert (least, mode) == (least_again, mode_again)
        assert "δ 1e-06" in notice and notice.count("no more ε") == 4, notice
        ((median, median_again, quartiles, quartiles_again),), _, notice = _asked(histogram_proxy, ranked, binary)
        assert median == median_again and quartiles == quartiles_again, notice
        assert notice.count("no more ε") == 2, notice


def test_each_cell_s_duplicate_columns_are_one_release(histogram_proxy: RunningProxy) -> None:
    """Per cell of a GROUP BY: a FILTER and a SUM(CASE) of one condition are one release in
    every cell, at the whole ε (Laplace scale 1), and equal in each cell."""
    rows, spent, notice = _asked(histogram_proxy, "SELECT sex, count(*) FILTER (WHERE age > 30) AS a, "
                                                  "sum(CASE WHEN age > 30 THEN 1 ELSE 0.0 END) AS b "
                                                  "FROM adult GROUP BY sex ORDER BY sex")
    assert spent == pytest.approx(1.0) and len(rows) == 2
    assert all(a == b for _, a, b in rows), rows
    assert "per group: count(*) filter (where age > 30): laplace scale 1 (" in notice, notice
    assert "the same release as count(*) filter (where age > 30), no more ε" in notice, notice


@pytest.mark.parametrize("sql, counts", [
    ("SELECT count(*), count(*) FILTER (WHERE sex = 'Male') FROM adult", 2),  # another condition
    ("SELECT count(*) FILTER (WHERE age > 30), count(*) FILTER (WHERE age > 31) FROM adult", 2),
    ("SELECT count(*), count(age), count(DISTINCT age) FROM adult", 3),  # other parts
    ("SELECT count(*), sum(age), avg(age) FROM adult", 1),
])
def test_a_statement_without_duplicates_splits_its_epsilon_over_every_column_as_before(
        histogram_proxy: RunningProxy, sql: str, counts: int) -> None:
    """k columns, k releases: each count's Laplace scale is k (ε = 1)."""
    _, _, notice = _asked(histogram_proxy, sql)
    assert "no more ε" not in notice, notice
    assert notice.count(f"laplace scale {sql.count(',') + 1} (") == counts, notice
