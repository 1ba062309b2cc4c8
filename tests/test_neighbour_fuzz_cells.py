"""The neighbour fuzzer at a table's ``max_cells``: one row must not move a histogram across it.

A GROUP BY is answered with one row per declared key (categories, integers in bounds, the time
buckets of a declared range narrowed by the statement's own constants, ``width_bucket`` bins) and
refused (``54000``-class ``DP001``, rule ``max-cells``) when the product of its keys' domains is
more than the table's ``max_cells``. That count must come from the statement and the policy
alone: here statements are drawn just within and just past the limit (731, the fewest cells
the fuzz columns' daily time ranges allow) from every kind of key, a series limit's ranking
and narrowed time ranges, and run on a base table and on a neighbour with one adversarial row
more. Both must have the same outcome (the released keys value for value, the refusal's text
whole), a refusal must charge nothing, and an answer the same ε on both.

``DPPROXY_FUZZ_CELLS_CASES`` sets the number of statements (default 90, ~20 s),
``DPPROXY_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from datetime import date, timedelta

import pytest

from tests.conftest import RunningProxy, TestDatabase
from tests.neighbour_cases import Case, _Builder
from tests.test_neighbour_fuzz import FAMILY_POLICY, Client, Outcome, _fuzz_proxy
from tests.test_neighbour_fuzz_paths import _any_broken, _charged, _failure, _on_neighbours, _report

CASES = int(os.environ.get("DPPROXY_FUZZ_CELLS_CASES", "90"))
MAX_CELLS = 731  # ts and tz opt days in over 1999-06-01 .. 2001-05-31: 731 buckets, the least max_cells allows
CELLS_FAMILY_POLICY = {family: f"{text}, max_cells: {MAX_CELLS}" for family, text in FAMILY_POLICY.items()}


@pytest.fixture(scope="module")
def cells_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The fuzzer's tables behind a dpproxy whose tables answer at most MAX_CELLS cells."""
    yield from _fuzz_proxy(test_db, tmp_path_factory, CELLS_FAMILY_POLICY)


def _days(first: date, count: int, column: str, rng: random.Random) -> str:
    """A WHERE range of ``count`` whole days of ``column`` from ``first``, in one of the ways a tool writes it."""
    last = first + timedelta(days=count)
    return rng.choice([f"{column} >= '{first}' AND {column} < '{last}'",
                       f"{column} BETWEEN '{first}' AND '{last - timedelta(days=1)}'",
                       f"{column} >= DATE '{first}' AND {column} < DATE '{first}' + {count}"])


def _near(rng: random.Random, limit: int) -> int:
    """A count of one key's cells that puts a statement just within or just past ``limit``."""
    return max(1, limit + rng.choice([-2, -1, 0, 0, 1, 1, 2, 5]))


def _cells_case(rng: random.Random) -> Case:
    """A GROUP BY whose cells are drawn around MAX_CELLS, with metrics (or keys only)."""
    builder = _Builder(rng)
    kind = rng.randrange(8)
    where: list[str] = []
    if kind == 0:  # bins alone: n + 2 cells (below the first bound and above the last)
        keys = [f"width_bucket(f8, -1, 1, {_near(rng, MAX_CELLS - 2)})"]
    elif kind == 1:  # 11 integers of i2 by bins
        keys = ["i2", f"width_bucket({rng.choice(['f8', 'n', 'nm'])}, 0, 1, {_near(rng, MAX_CELLS // 11 - 2)})"]
    elif kind == 2:  # 5 categories by days of a narrowed range
        column = rng.choice(["ts", "tz"])
        keys = ["t", f"date_trunc('day', {column})" if column == "tz" else f"CAST({column} AS date)"]
        where.append(_days(date(2000, rng.randint(1, 6), rng.randint(1, 28)), _near(rng, MAX_CELLS // 5), column, rng))
    elif kind == 3:  # days alone, the whole declared range (731) or a year and a day more of it
        keys = [rng.choice(["date_trunc('day', tz)", "CAST(ts AS date)", "floor(extract(epoch from tz)/86400)*86400"])]
    elif kind == 4:  # three keys: v's 3, t's 5 and a time unit (months: within; weeks: past)
        keys = ["v", "t", rng.choice(["date_trunc('month', d)", "date_trunc('week', d)", "EXTRACT(MONTH FROM ts)",
                                      "date_trunc('quarter', ts)", "EXTRACT(ISODOW FROM tz)", "date_trunc('week', tz)"])]
    elif kind == 5:  # i2's 11 by t's 5 by weeks of d (53 in 2000): past, unless a WHERE narrows them to 13
        keys = ["i2", "t", "date_trunc('week', d)"]
        if rng.random() < 0.7:
            where.append(_days(date(2000, 1, 3), 7 * _near(rng, MAX_CELLS // 55), "d", rng))
    elif kind == 6:  # epoch buckets of n days over ts's range
        span = rng.choice([1, 2, 7])
        keys = ["v", f"floor(extract(epoch from ts)/{86400 * span})*{86400 * span}"]
        if rng.random() < 0.6:
            where.append(_days(date(1999, 7, 1), _near(rng, MAX_CELLS // 3) * span, "ts", rng))
    else:  # bins by a category
        keys = ["t", f"width_bucket({rng.choice(['f8', 'n', 'nm'])}, 0, 1, {_near(rng, MAX_CELLS // 5 - 2)})"]
    rng.shuffle(keys)
    if rng.random() < 0.3:
        where.append(builder.predicate(rng.randint(0, 1)))
    metrics = [] if rng.random() < 0.15 else rng.sample(
        ["COUNT(*)", "SUM(i4)", "AVG(i2)", "COUNT(DISTINCT t)", "COUNT(f8)", "SUM(nm)", "SUM(n)"], rng.randint(1, 2))
    distinct = not metrics and rng.random() < 0.5
    positional = rng.random() < 0.4
    sql = f"SELECT {'DISTINCT ' if distinct else ''}{', '.join(keys + metrics)} FROM {{table}}"
    if rng.random() < 0.1 and "t" in keys and not distinct:  # a series limit over the categories
        sql += (" JOIN (SELECT t AS t__ FROM {table} GROUP BY t ORDER BY t LIMIT 2) AS series_limit ON t = t__")
    if where:
        sql += " WHERE " + " AND ".join(where)
    if not distinct:
        sql += " GROUP BY " + ", ".join(str(i + 1) if positional else key for i, key in enumerate(keys))
    if rng.random() < 0.2:
        sql += " ORDER BY 1"
    return Case(sql, tuple(builder.params), rng.random() < 0.2, keys=len(keys))


def test_a_histogram_near_max_cells_is_refused_or_answered_alike_on_every_neighbour(cells_proxy: RunningProxy) -> None:
    client = Client(cells_proxy)

    def draw(rng: random.Random) -> tuple[Case, Case]:
        case = _cells_case(rng)
        return case, case

    def run(case: Case, table: str) -> tuple[Outcome, float]:
        return _charged(client, lambda: client.run(case, table))

    failures: list[str] = []
    refused = answered = cases = 0
    for index, case, neighbour, runs in _on_neighbours(client, 29, CASES, draw, run):
        cases += 1
        (outcome, charge), _ = runs  # type: ignore[misc]
        over = outcome.kind == "error" and "(rule: max-cells)" in str(outcome.detail[1])
        refused += over
        answered += outcome.kind == "answer" and charge > 0
        charged_refusal = any(o.kind == "error" and "max-cells" in str(o.detail[1]) and c  # type: ignore[attr-defined]
                              for o, c in runs)  # type: ignore[misc]
        if runs[0] != runs[1] or _any_broken(runs) or charged_refusal:
            failures.append(_failure(index, case, neighbour, *runs))
    assert not failures, _report("histograms near max_cells", failures, cases)
    assert refused >= cases // 5, f"too few statements refused by max_cells: {refused} of {cases}"
    assert answered >= cases // 5, f"too few histograms answered: {answered} of {cases}"
