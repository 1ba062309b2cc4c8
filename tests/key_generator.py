"""Random GROUP BY statements over ``gk`` (tests/key_data.py), for the round-trip check of GROUP BY
keys (tests/round_trip_keys.py, docs/threat-model.md, "The round-trip check").

Each key is one a policy can declare (a category, an integer, ``width_bucket``, a floor bin, a time
grain, a date part, Grafana's epoch bucket) in the spellings analysts and BI tools send (Superset's
``DATE_TRUNC('MONTH', x)``, Metabase's ``CAST(extract(...) AS integer)`` and numeric binning,
Tableau's ``date_trunc('month', CAST(x AS date))`` and ``CAST(x AS TEXT)``), grouped by the
expression again, its position or its alias, maybe beside a second key. Two shapes:

* :func:`cell_statements`: ``SELECT <key> AS k, count(*) AS n FROM gk GROUP BY ...``, whose backend
  SQL is run row by row to find the cell each row lands in;
* :func:`answer_statements`: the aggregate with a condition of :mod:`tests.expression_generator`
  or a range on a time column (which narrows a time key's buckets) inside, a HAVING, ORDER BY, LIMIT and OFFSET over its keys, maybe wrapped as BI tools wrap it
  (Superset's ``virtual_table`` over it or under it, Metabase's ``source``, a CTE) with a condition
  outside, whose whole answer is compared with the noise off.

The generator is a pure function of its :class:`random.Random`: a seed names its output.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from tests.expression_generator import condition

__all__ = ["KEYS", "KeyCase", "answer_statements", "cell_statements", "part_statements"]

_UNITS = ("MONTH", "month", "mon", "Qtr", "quarter", "QUARTER", "year", "Y", "YEAR", "week", "WEEK", "day", "DAY", "days")
# Key templates by what their HAVING compares them with: {c} a time column, {u} a date_trunc unit.
_TIME_KEYS = (
    "DATE_TRUNC('{u}', {c})", "date_trunc('{u}', {c})", "date_trunc('{u}', CAST({c} AS date))",
    "date_trunc('{u}', CAST({c} AS timestamp))", "date_trunc('{u}', {c}::timestamptz)", "CAST(date_trunc('{u}', {c}) AS date)",
    "date_trunc('{u}', {c})::timestamp", "DATE_TRUNC('{u}', CAST({c} AS DATE))", "CAST({c} AS DATE)",
    "date_trunc('week', ({c} + INTERVAL '1 day')) + INTERVAL '-1 day'",
    "CAST((date_trunc('week', ({c} + INTERVAL '1 day')) + INTERVAL '-1 day') AS date)",
    "DATE_TRUNC('day', CAST({c} AS DATE)) + (-EXTRACT(DOW FROM {c}) * INTERVAL '1 DAY')",
    "date_trunc('{u}', {c}) AT TIME ZONE 'UTC'",
)
_PART_KEYS = (
    "EXTRACT(YEAR FROM {c})", "CAST(extract(year from {c}) AS integer)", "TRUNC(EXTRACT(YEAR FROM {c}))",
    "date_part('year', {c})", "CAST(EXTRACT(YEAR FROM {c}) AS numeric)", "CAST(extract(month from {c}) AS integer)",
    "EXTRACT(MONTH FROM {c})", "date_part('month', {c})", "EXTRACT(QUARTER FROM {c})", "date_part('quarter', {c})",
    "EXTRACT(DAY FROM {c})", "EXTRACT(DOW FROM {c})", "EXTRACT(ISODOW FROM {c})", "EXTRACT(DOY FROM {c})",
    "EXTRACT(WEEK FROM {c})", "CAST(extract(dow from {c}) AS integer) + 1", "extract(month from CAST({c} AS timestamp))",
    "CASE WHEN mod(CAST(extract(dow from {c}) AS integer) + 1, 7) = 0 THEN 7 ELSE mod(CAST(extract(dow from {c}) AS integer) + 1, 7) END",
    "floor(extract(epoch from {c})/86400)*86400", "floor(extract(epoch from {c})/604800)*604800",
    "EXTRACT(YEAR FROM {c}) - 2000", "EXTRACT(HOUR FROM {c})",
)
_NUMBER_KEYS = (
    "i", "big", "s", '"i"', "gk.i", "(i)", "i + 0", "CAST(i AS bigint)", "s::int",
    "width_bucket(f, 0, 10, 5)", "width_bucket(f, 10, 0, 4)", "width_bucket(n, 0, 10, 3)", "width_bucket(n, 0.5, 9.5, 7)",
    "width_bucket(i, 0, 20, 4)", "width_bucket(i, 0, 20.0, 3)", "width_bucket(f, -1, 11, 6)", "width_bucket(big, -5, 5, 2)",
    "width_bucket(s, 0, 3, 3)", "width_bucket(n, 1e-20, 10, 2)", "width_bucket(f, 0, 1e-300, 2)",
    "floor(f)", "floor(n)", "floor(f / 2.5) * 2.5", "floor(n / 2.5) * 2.5", "((floor(((f - 0.5) / 2.0)) * 2.0) + 0.5)",
    "((floor(((n - 0.5) / 2.0)) * 2.0) + 0.5)", "floor(i / 3) * 3", "floor((i - 1) / 4) * 4 + 1", "floor(n / 3) * 3",
    "floor(f / 0.1) * 0.1", "floor(n / 0.1) * 0.1", "floor(n / 3.0) * 3.0", "floor(s / 2) * 2", "floor(big / 2.5) * 2.5",
    "((floor(((\"n\" - 0.0) / 1.25)) * 1.25) + 0.0)", "floor(f / 3) * 3", "floor((n - 10) / 5) * 5 + 10",
)
_CATEGORY_KEYS = (
    "t", '"t"', "gk.t", "CAST(t AS TEXT)", "t::varchar", "(t)", 't COLLATE "C"', "lower(t)",
    "h", "CAST(h AS TEXT)", "h::varchar", "ho", "CAST(ho AS TEXT)", "ho::varchar", "v", "CAST(v AS TEXT)", "v::text", "c", "CAST(c AS TEXT)", "c::varchar",
    "CAST(c AS varchar(4))", "b", "CAST(b AS TEXT)", "dc", "CAST(dc AS TEXT)", "CAST(dc AS DATE)", "dc::timestamp",
    "dt", "CAST(dt AS TEXT)", "dt::varchar", "en", "CAST(en AS TEXT)", "en::text", "di", "CAST(di AS TEXT)",
)
_TIME_COLUMNS = ("d", "ts", "tz", "w")
# Bounds on a time column a WHERE may narrow a time key's buckets by (rewriter/group_keys.py, key_ranges):
# at bucket edges, a microsecond off them, with a zone, as typed literals and as BETWEEN.
_TIME_RANGES = (
    "{c} >= '2000-03-01'", "{c} < '2000-10-29'", "{c} BETWEEN '2000-02-01' AND '2000-04-30'", "{c} > '2000-03-31 23:59:59.999999'",
    "{c} >= '2000-01-01 00:00+14'", "{c} < '2000-06-30 22:00-05'", "{c} = '2000-03-31'", "{c} <= date '2000-04-01'",
    "{c} >= timestamptz '2000-03-26 01:00+00' AND {c} < '2000-10-29 01:00+00'", "'2000-07-01' > {c}",
    "{c} >= '2001-03-31' AND {c} < '2003-01-01'", "{c} >= '1999-12-27' AND {c} <= '2000-01-02 23:59'",
    "{c} BETWEEN '2000-12-31' AND 'infinity'", "{c} > '-infinity'", "{c} >= now() - interval '30 years'",
)
# What a HAVING or outer WHERE compares a key with, by the key's kind (a condition PostgreSQL reads
# for every key of that kind: the time ones cast their side, the category ones compare text).
_KEY_TESTS = {
    "time": ("{k} >= '2000-03-01'", "{k} < '2000-06-15'", "{k} IS NOT NULL", "{k} <> '2000-01-01'",
             "CAST({k} AS date) BETWEEN '2000-02-01' AND '2000-09-30'", "{k}::text LIKE '2000-0%'"),
    "number": ("{k} > 2", "{k} <= 3", "{k} IS NOT NULL", "{k} <> 0", "{k} BETWEEN 1 AND 4", "{k} IN (0, 2, 5)"),
    "category": ("{k}::text <> 'a'", "{k}::text > 'A'", "{k} IS NOT NULL", "{k}::text IN ('a', 'Other', 'f')",
                 "{k}::text LIKE '%a%'", "length({k}::text) = 1"),
}


def _time_key(rng: random.Random) -> str:
    template = rng.choice(_TIME_KEYS + _PART_KEYS)
    return template.format(u=rng.choice(_UNITS), c=rng.choice(_TIME_COLUMNS))


KEYS = {"time": _time_key, "number": lambda rng: rng.choice(_NUMBER_KEYS),
        "category": lambda rng: rng.choice(_CATEGORY_KEYS)}


@dataclass(frozen=True)
class KeyCase:
    """A GROUP BY statement over ``gk``, its key expressions (each over ``gk``'s columns) and their
    kinds (``time``, ``number``, ``category``)."""

    statement: str
    keys: tuple[str, ...]
    kinds: tuple[str, ...]


def _keys(rng: random.Random) -> tuple[list[str], list[str]]:
    """One key (sometimes two), each with its kind."""
    kinds = [rng.choice(tuple(KEYS))]
    if rng.random() < 0.2:
        kinds.append(rng.choice(tuple(KEYS)))
    return [KEYS[kind](rng) for kind in kinds], kinds


def _grouped(keys: list[str], rng: random.Random) -> str:
    """The GROUP BY of ``keys`` (output k1, k2 ...): each by its expression, position or alias."""
    return ", ".join(rng.choice((key, str(position), f"k{position}")) for position, key in enumerate(keys, 1))


def cell_statements(rng: random.Random, count: int) -> Iterator[KeyCase]:
    """``count`` statements ``SELECT <keys>, count(*) AS n FROM gk GROUP BY <keys>``."""
    for _ in range(count):
        keys, kinds = _keys(rng)
        outputs = ", ".join(f"{key} AS k{position}" for position, key in enumerate(keys, 1))
        yield KeyCase(f"SELECT {outputs}, count(*) AS n FROM gk GROUP BY {_grouped(keys, rng)}", tuple(keys), tuple(kinds))


def _test(kind: str, key: str, rng: random.Random) -> str:
    """A test of ``key`` (a name, or an expression, parenthesised: ``k + 1::text`` would cast the 1)."""
    return rng.choice(_KEY_TESTS[kind]).format(k=key if key.isidentifier() else f"({key})")


def _order(names: list[str], rng: random.Random) -> str:
    """An ORDER BY that orders the groups totally (their keys are distinct: each by one of ``names``,
    which may be the key's name, position or expression), or none."""
    roll = rng.random()
    if roll < 0.3:
        return ""
    items = [name + rng.choice(("", " DESC", " NULLS FIRST", " DESC NULLS LAST")) for name in names]
    if roll < 0.5:
        items.insert(0, rng.choice(("n DESC", "n", "count(*) DESC")))
    return " ORDER BY " + ", ".join(items)


def _limit(ordered: bool, rng: random.Random) -> str:
    if not ordered or rng.random() < 0.5:
        return ""
    return rng.choice((" LIMIT 3", " LIMIT 1", " LIMIT 5 OFFSET 2", " OFFSET 1", " LIMIT ALL", " FETCH FIRST 2 ROWS ONLY"))


def answer_statements(rng: random.Random, count: int) -> Iterator[KeyCase]:
    """``count`` statements: the aggregate with a condition inside, HAVING, ORDER BY and LIMIT over its
    keys, maybe wrapped in a derived table or a CTE with a condition outside (docs/bi-tools.md)."""
    for _ in range(count):
        keys, kinds = _keys(rng)
        outputs = ", ".join(f"{key} AS k{position}" for position, key in enumerate(keys, 1))
        roll = rng.random()
        inside = (f" WHERE {condition(rng, 1)}" if roll < 0.4 else
                  f" WHERE {rng.choice(_TIME_RANGES).format(c=rng.choice(_TIME_COLUMNS))}" if roll < 0.65 else "")
        having = " HAVING count(*) > 0" + (f" AND {_test(kinds[0], keys[0], rng)}" if rng.random() < 0.5 else "")
        names = [f"k{position}" for position in range(1, len(keys) + 1)]
        shape = rng.random()
        if shape < 0.4:  # the aggregate itself, ordered by each key's name, position or expression
            order = _order([rng.choice((name, str(position), key)) for position, (name, key) in enumerate(zip(names, keys), 1)],
                           rng)
            statement = (f"SELECT {outputs}, count(*) AS n FROM gk{inside} GROUP BY {_grouped(keys, rng)}{having}"
                         f"{order}{_limit(bool(order), rng)}")
        elif shape < 0.65:  # Superset's virtual_table (or a CTE) over it, a condition outside
            order = _order(names, rng).replace("count(*)", "n")
            outside = f" WHERE {_test(kinds[0], 'k1', rng)}" if rng.random() < 0.5 else ""
            inner = f"SELECT {outputs}, count(*) AS n FROM gk{inside} GROUP BY {_grouped(keys, rng)}{having}"
            if rng.random() < 0.5:
                statement = f"SELECT {', '.join(names)}, n FROM ({inner}) AS virtual_table{outside}{order}{_limit(bool(order), rng)}"
            else:
                statement = f"WITH agg AS ({inner}) SELECT * FROM agg{outside}{order}{_limit(bool(order), rng)}"
        elif shape < 0.85:  # a virtual dataset under it: the rows chosen inside, the key outside
            order = _order(names, rng)
            source = f"(SELECT * FROM gk{inside}) AS virtual_table" if rng.random() < 0.5 else "src"
            cte = f"WITH src AS (SELECT * FROM gk{inside}) " if source == "src" else ""
            statement = (f"{cte}SELECT {outputs}, count(*) AS n FROM {source} GROUP BY {_grouped(keys, rng)}{having}"
                         f"{order}{_limit(bool(order), rng)}")
        else:  # Metabase's source: the key computed in the derived table, grouped by its name
            columns = ", ".join(f'{key} AS "k{position}"' for position, key in enumerate(keys, 1))
            picked = ", ".join(f'"source"."k{position}" AS "k{position}"' for position in range(1, len(keys) + 1))
            grouped = ", ".join(f'"source"."k{position}"' for position in range(1, len(keys) + 1))
            order = _order([rng.choice((name, f'"source"."{name}"')) for name in names], rng).replace("count(*)", '"n"')
            statement = (f'SELECT {picked}, count(*) AS "n" FROM (SELECT {columns} FROM gk{inside}) AS "source" '
                         f"GROUP BY {grouped} HAVING count(*) > 0{order}{_limit(bool(order), rng)}")
        yield KeyCase(statement, tuple(keys), tuple(kinds))


# Aggregates per cell beside count(*) (tests/round_trip_keys.py, KeyRoundTrip.parts): COUNT of a
# column (NULLs left out), COUNT(DISTINCT) of an integer and of a category column (a value held in
# several undeclared categories is one value of ``other``), SUM and AVG of integers clamped to
# their bounds, MODE of a category column (its declared categories' counts).
_PART_AGGREGATES = (
    "count(i)", "count(t)", "count(DISTINCT i)", "count(DISTINCT big)", "count(DISTINCT s)", "count(DISTINCT t)",
    "count(DISTINCT h)", "count(DISTINCT ho)", "count(DISTINCT v)", "count(DISTINCT dt)", "count(DISTINCT en)", "count(DISTINCT di)", "sum(i)", "sum(big)", "sum(s)", "avg(i)", "avg(s)",
    "mode() within group (order by t)", "mode() within group (order by h)", "mode() within group (order by ho)",
    "mode() within group (order by c)", "mode() within group (order by dt)", "mode() within group (order by en)",
)


def part_statements(rng: random.Random, count: int) -> Iterator[KeyCase]:
    """``count`` statements ``SELECT <keys>, <aggregates> FROM gk GROUP BY <keys>``: one or two of
    :data:`_PART_AGGREGATES` per cell, the key a category (a hashed one, of ``h`` or ``ho``, or a
    per-row CASE, of ``t``, ``v``, ``c``, ``dc``, with ``other`` and NULLs) half the time."""
    for _ in range(count):
        keys, kinds = _keys(rng)
        if rng.random() < 0.5:
            keys[0], kinds[0] = KEYS["category"](rng), "category"
        outputs = ", ".join(f"{key} AS k{position}" for position, key in enumerate(keys, 1))
        aggregates = ", ".join(rng.sample(_PART_AGGREGATES, rng.choice((1, 2))))
        yield KeyCase(f"SELECT {outputs}, {aggregates} FROM gk GROUP BY {_grouped(keys, rng)}", tuple(keys), tuple(kinds))
