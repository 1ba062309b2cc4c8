"""Random output expressions over released aggregates, for the round-trip check of post-processing
(tests/round_trip_outputs.py, docs/threat-model.md, "The round-trip check").

Each case is a statement over the round-trip table whose outputs compute on aggregates (COUNT, SUM
and AVG of integer, numeric and double precision columns): arithmetic, shares (``count(*) * 100.0 /
sum(...)``), ``round``/``ceil``/``floor``/``trunc``, casts (``::int``, ``::numeric(10,2)``, ``::int2``,
``::real``, ``::text``), CASE, COALESCE/NULLIF/GREATEST, labels, comparisons, with an alias or none,
maybe under HAVING, ORDER BY, LIMIT and OFFSET; and, for each aggregate it names, the value released
for it (text), drawn from values of its type, the edges among them (0, NULL, a value past ``int4``
or ``int2``, one past ``int8``'s half, a long fraction).

The generator is a pure function of its :class:`random.Random`: a seed names its output.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["AGGREGATES", "OutputCase", "output_cases"]

# The aggregates outputs are computed from, each with the (kind, column) dpproxy's plan names it by.
AGGREGATES: dict[str, tuple[str, str | None]] = {
    "count(*)": ("count", None), "count(i)": ("count", "i"), "sum(i)": ("sum", "i"), "sum(n)": ("sum", "n"),
    "sum(f)": ("sum", "f"), "avg(i)": ("avg", "i"), "avg(n)": ("avg", "n"), "avg(f)": ("avg", "f"),
}
_INT8 = (b"0", b"40", b"-3", b"1", b"7", b"32768", b"2147483648", b"4611686018427387904", None)
_NUMERIC = (b"0", b"4.5", b"-2.345", b"12345678901234.5", b"0.125", b"2.5", b"-0.5", b"1", b"0.3333333333333333333",
            b"32767.5", None)
_FLOAT8 = (b"0.5", b"-0.25", b"1e300", b"-0", b"0.1", b"2.5", b"1e-300", b"40", b"123456.789", None)
_VALUES: dict[str, tuple[bytes | None, ...]] = {
    "count(*)": _INT8, "count(i)": _INT8, "sum(i)": _INT8, "sum(n)": _NUMERIC, "sum(f)": _FLOAT8, "avg(i)": _NUMERIC,
    "avg(n)": _NUMERIC, "avg(f)": _FLOAT8,
}
_FORMS = ("{a}", "{a} + 1", "{a} * 100.0 / {b}", "{a} / {b}", "{a} * 2", "{a} - {b}", "round({a})", "round({a}, 2)",
          "ceil({a})", "floor({a})", "trunc({a}, 1)", "abs({a})", "{a}::int", "{a}::int2", "{a}::numeric(10,2)",
          "CAST({a} AS numeric(5, 1))", "{a}::float8", "{a}::real", "{a}::text", "{a}::bigint",
          "CASE WHEN {a} > 10 THEN 'many' ELSE 'few' END", "CASE WHEN {a} > {b} THEN {a} ELSE {b} END",
          "coalesce({a}, 0)", "nullif({a}, 0)", "greatest({a}, {b})", "least({a}, 0)", "'label'", "1", "{a} % 3", "-{a}",
          "{a}::int * 2147483647", "round(100.0 * {a} / nullif({b}, 0), 1)", "{a} / 3", "{a}::int / 3", "{a} > 5",
          "{a} IS NULL", "round({a}::numeric, 1)", "{a} / 0", "{a} + {b} + 0.5", "sqrt(abs({a}))", "power({a}, 2)",
          "{a}::int4 + {b}::int4", "mod({a}, 7)", "round(({a})::numeric / 1000, 2)", "{a}::money", "{a}::varchar(3)",
          "({a})::text || ' rows'", "{a} * 1.0", "1.0 * {a} / {b}", "date '2000-01-01' + {a}::int", "{a} = {b}",
          "round({a} * 100) / 100", "ceil({a} / 2.0)", "{a}::decimal", "{a} BETWEEN 0 AND 100")
_ALIASES = ("", "", "", " AS x", ' AS "Total"', " total", " AS count")
_HAVING = ("", "", "", " HAVING {a} > 10", " HAVING count(*) > 0", " HAVING {a} IS NOT NULL")
_TAILS = ("", "", "", " ORDER BY 1", " ORDER BY 1 DESC", " LIMIT 1", " LIMIT 0", " OFFSET 1", " ORDER BY 1 LIMIT 5")


@dataclass(frozen=True)
class OutputCase:
    """A statement whose outputs compute on aggregates, and the value released for each aggregate."""

    statement: str
    released: dict[str, bytes | None]  # by the aggregate's text (a key of AGGREGATES)


def _expression(rng: random.Random) -> str:
    a, b = rng.choice(tuple(AGGREGATES)), rng.choice(tuple(AGGREGATES))
    text = rng.choice(_FORMS).format(a=a, b=b)
    if rng.random() < 0.2:  # one form inside another
        text = rng.choice(_FORMS).format(a=f"({text})", b=rng.choice(tuple(AGGREGATES)))
    return text


def output_cases(rng: random.Random, count: int) -> Iterator[OutputCase]:
    """``count`` cases: one to three outputs over aggregates, maybe HAVING/ORDER BY/LIMIT, and releases."""
    for _ in range(count):
        outputs = ", ".join(_expression(rng) + rng.choice(_ALIASES) for _ in range(rng.randint(1, 3)))
        having = rng.choice(_HAVING).format(a=rng.choice(tuple(AGGREGATES)))
        statement = f"SELECT {outputs} FROM rt{having}{rng.choice(_TAILS)}"
        yield OutputCase(statement, {text: rng.choice(_VALUES[text]) for text in AGGREGATES if text in statement})
