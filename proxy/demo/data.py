"""A deterministic table shaped like the UCI Adult census data (48,842 rows by default).

The marginals follow the published Adult dataset (age 17–90, education_num 1–16,
hours_per_week 1–99, mostly-zero capital_gain with a spike at 99,999, ...). It is
synthetic: generated from a fixed seed so that every run, test and benchmark sees the
same rows. The seeded generator here makes *data*; it is never used for DP noise.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Any, Iterator, Sequence

import numpy as np
import psycopg
from psycopg import sql

__all__ = ["ADULT_COLUMNS", "ADULT_ROWS", "CATEGORIES", "INTERVIEW_DAYS", "INTERVIEW_FIRST", "generate_adult", "load_adult"]

ADULT_ROWS = 48_842
_SEED = 20_26_11_21

ADULT_COLUMNS: tuple[tuple[str, str], ...] = (
    ("age", "integer NOT NULL"),
    ("workclass", "text NOT NULL"),
    ("fnlwgt", "integer NOT NULL"),
    ("education", "text NOT NULL"),
    ("education_num", "integer NOT NULL"),
    ("marital_status", "text NOT NULL"),
    ("occupation", "text NOT NULL"),
    ("relationship", "text NOT NULL"),
    ("race", "text NOT NULL"),
    ("sex", "text NOT NULL"),
    ("capital_gain", "integer NOT NULL"),
    ("capital_loss", "integer NOT NULL"),
    ("hours_per_week", "integer NOT NULL"),
    ("native_country", "text NOT NULL"),
    ("income", "text NOT NULL"),
    ("interview_date", "date NOT NULL"),
)

#: The synthetic interview dates span these four years (the demo's monthly time series).
INTERVIEW_FIRST = date(2021, 1, 1)
INTERVIEW_DAYS = 4 * 365 + 1

_EDUCATION = (
    ("Preschool", 0.002), ("1st-4th", 0.005), ("5th-6th", 0.010), ("7th-8th", 0.020),
    ("9th", 0.016), ("10th", 0.028), ("11th", 0.037), ("12th", 0.013), ("HS-grad", 0.323),
    ("Some-college", 0.222), ("Assoc-voc", 0.042), ("Assoc-acdm", 0.033), ("Bachelors", 0.164),
    ("Masters", 0.054), ("Prof-school", 0.017), ("Doctorate", 0.012),
)

CATEGORIES: dict[str, tuple[tuple[str, float], ...]] = {
    "workclass": (
        ("Private", 0.694), ("Self-emp-not-inc", 0.079), ("Local-gov", 0.064), ("?", 0.057),
        ("State-gov", 0.041), ("Self-emp-inc", 0.035), ("Federal-gov", 0.029),
        ("Without-pay", 0.0006), ("Never-worked", 0.0004),
    ),
    "marital_status": (
        ("Married-civ-spouse", 0.458), ("Never-married", 0.330), ("Divorced", 0.136),
        ("Separated", 0.031), ("Widowed", 0.031), ("Married-spouse-absent", 0.013),
        ("Married-AF-spouse", 0.001),
    ),
    "occupation": (
        ("Prof-specialty", 0.126), ("Craft-repair", 0.125), ("Exec-managerial", 0.125),
        ("Adm-clerical", 0.115), ("Sales", 0.113), ("Other-service", 0.101),
        ("Machine-op-inspct", 0.062), ("?", 0.058), ("Transport-moving", 0.048),
        ("Handlers-cleaners", 0.042), ("Farming-fishing", 0.031), ("Tech-support", 0.030),
        ("Protective-serv", 0.020), ("Priv-house-serv", 0.004),
    ),
    "relationship": (
        ("Husband", 0.404), ("Not-in-family", 0.258), ("Own-child", 0.155),
        ("Unmarried", 0.105), ("Wife", 0.048), ("Other-relative", 0.030),
    ),
    "race": (
        ("White", 0.855), ("Black", 0.096), ("Asian-Pac-Islander", 0.031),
        ("Amer-Indian-Eskimo", 0.010), ("Other", 0.008),
    ),
    "sex": (("Male", 0.668), ("Female", 0.332)),
    "native_country": (
        ("United-States", 0.897), ("Mexico", 0.019), ("?", 0.018), ("Philippines", 0.006),
        ("Germany", 0.004), ("Puerto-Rico", 0.004), ("Canada", 0.004), ("El-Salvador", 0.003),
        ("India", 0.003), ("Cuba", 0.003), ("England", 0.003), ("China", 0.003),
        ("South", 0.002), ("Jamaica", 0.002), ("Italy", 0.002), ("Dominican-Republic", 0.002),
        ("Japan", 0.002), ("Guatemala", 0.002), ("Poland", 0.002), ("Vietnam", 0.002),
        ("Columbia", 0.002), ("Haiti", 0.002), ("Portugal", 0.001), ("Taiwan", 0.001),
        ("Iran", 0.001), ("Greece", 0.001), ("Nicaragua", 0.001), ("Peru", 0.001),
        ("Ecuador", 0.001), ("France", 0.001), ("Ireland", 0.001), ("Hong", 0.001),
        ("Thailand", 0.001), ("Cambodia", 0.001), ("Trinadad&Tobago", 0.001),
        ("Yugoslavia", 0.0005), ("Outlying-US(Guam-USVI-etc)", 0.0005), ("Laos", 0.0005),
        ("Scotland", 0.0004), ("Honduras", 0.0004), ("Hungary", 0.0004),
        ("Holand-Netherlands", 0.0001),
    ),
}


def _choice(rng: np.random.Generator, table: Sequence[tuple[str, float]], n: int) -> np.ndarray:
    names = np.array([name for name, _ in table], dtype=object)
    weights = np.array([weight for _, weight in table])
    return names[rng.choice(len(names), size=n, p=weights / weights.sum())]


def generate_adult(rows: int = ADULT_ROWS, seed: int = _SEED) -> Iterator[tuple[Any, ...]]:
    """Yield ``rows`` Adult-shaped rows, the same ones for the same ``rows`` and ``seed``."""
    rng = np.random.Generator(np.random.PCG64(seed))
    age = np.clip(np.round(17 + rng.gamma(2.1, 10.2, rows)), 17, 90).astype(int)
    education_index = rng.choice(len(_EDUCATION), size=rows, p=_normalised(_EDUCATION))
    education = np.array([name for name, _ in _EDUCATION], dtype=object)[education_index]
    education_num = education_index + 1
    hours = np.where(
        rng.random(rows) < 0.47, 40, np.clip(np.round(rng.normal(40.5, 12.5, rows)), 1, 99)
    ).astype(int)
    gain_draw = rng.random(rows)
    capital_gain = np.where(
        gain_draw < 0.917,
        0,
        np.where(gain_draw < 0.995, np.round(rng.lognormal(8.5, 0.8, rows)), 99_999),
    )
    capital_gain = np.clip(capital_gain, 0, 99_999).astype(int)
    capital_loss = np.where(
        rng.random(rows) < 0.953, 0, np.clip(np.round(rng.normal(1870, 360, rows)), 155, 4356)
    ).astype(int)
    fnlwgt = np.clip(np.round(rng.lognormal(12.05, 0.5, rows)), 12_285, 1_490_400).astype(int)
    columns = {name: _choice(rng, table, rows) for name, table in CATEGORIES.items()}
    income_score = 0.03 * (age - 38) + 0.35 * (education_num - 10) + 0.03 * (hours - 40)
    income = np.where(rng.random(rows) < 1 / (1 + np.exp(-(income_score - 1.2))), ">50K", "<=50K")
    # Drawn last, so that the other columns stay the rows they were before it was added:
    # more interviews each year, and fewer in the summer months.
    days = np.arange(INTERVIEW_DAYS)
    weight = (1 + days / INTERVIEW_DAYS) * (1 - 0.3 * np.cos(2 * np.pi * (days - 15) / 365.25) ** 8)
    interview = rng.choice(INTERVIEW_DAYS, size=rows, p=weight / weight.sum())
    for i in range(rows):
        yield (
            int(age[i]), columns["workclass"][i], int(fnlwgt[i]), education[i],
            int(education_num[i]), columns["marital_status"][i], columns["occupation"][i],
            columns["relationship"][i], columns["race"][i], columns["sex"][i],
            int(capital_gain[i]), int(capital_loss[i]), int(hours[i]),
            columns["native_country"][i], str(income[i]),
            INTERVIEW_FIRST + timedelta(days=int(interview[i])),
        )


def _normalised(table: Sequence[tuple[str, float]]) -> np.ndarray:
    weights = np.array([weight for _, weight in table])
    return weights / weights.sum()


def load_adult(conninfo: str, table: str = "adult", rows: int = ADULT_ROWS, schema: str = "public") -> bool:
    """Create and fill ``schema.table`` unless it already holds ``rows`` rows; True if loaded."""
    target = sql.Identifier(schema, table)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (f'"{schema}"."{table}"',)).fetchone()
        if exists and exists[0] is not None:
            count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(target)).fetchone()
            names = conn.execute(
                "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute "
                "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                (f'"{schema}"."{table}"',),
            ).fetchone()
            # A table of an older demo (without a newer column) is loaded again.
            if count and count[0] == rows and names and names[0] == [name for name, _ in ADULT_COLUMNS]:
                return False
        with conn.transaction():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target))
            columns = sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind)) for name, kind in ADULT_COLUMNS
            )
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(target, columns))
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(target)) as copy:
                for row in generate_adult(rows):
                    copy.write_row(row)
        conn.execute(sql.SQL("ANALYZE {}").format(target))
    return True
