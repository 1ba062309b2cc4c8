"""The neighbour fuzzer on sample and aggregate's partitions: where the added row lands must not show.

MIN, MAX and AVG where ``avg: sample_aggregate`` is selected split the filtered rows into the
table's ``partitions`` by a keyed hash (``row_hash`` of the row's values, ``ctid_hash`` of its
place) under a fresh secret per query, and release a smoothed median of the partitions' values
(docs/mechanisms.md). Here the secret is pinned per statement (``partition_seed`` patched in the
in-process dpproxy) and drawn afresh for each, the same on the base table and its neighbour, so
that the added row lands in each partition in turn; the families are tiny (one row, fewer than
the partitions), all in one partition (equal rows under ``row_hash``), empty, and ordinary; the
added row holds NULL, NaN, ±Infinity, values past the bounds, type limits, or a copy of a base
row. The outcome (answer or the same refusal, the same notices with numbers masked, the same
NULLs) and the charge must be the same on both tables.

``DPPROXY_FUZZ_PARTITION_CASES`` sets the number of statements (default 150, ~15 s),
``DPPROXY_FUZZ_SEED`` the seed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import psycopg
import pytest

from rewriter.rewrite import partition_key
from rewriter.text_bounds import read_through
from tests.conftest import RunningProxy, TestDatabase, make_policy
from tests.neighbour_cases import COLUMNS, TABLE_DDL, Case, _Builder, domain_ddl, policy_columns
from tests.test_neighbour_fuzz import _POLICY, SEED, Client, draw_tables
from tests.test_neighbour_fuzz_paths import _any_broken, _charged, _failure, _report

CASES = int(os.environ.get("DPPROXY_FUZZ_PARTITION_CASES", "150"))

# Sampled columns: AVG is sample and aggregate on i4, f8 and n (neighbour_cases.COLUMNS); MIN and MAX on all.
_SAMPLED = ("i4", "f8", "n")
_BOUNDED = tuple(c.name for c in COLUMNS if c.bounds is not None)
_ORDINARY = {"t": "'Male'", "v": "'a'", "i2": "1", "i4": "50", "i8": "7", "f4": "0.5", "f8": "2.5", "fz": "1e-310",
             "n": "3", "nm": "12.5", "d": "'2000-03-01'", "ts": "'2000-03-01'", "tz": "'2000-03-01 00:00+00'"}
# The added rows: each sets the bounded columns to one kind of extreme (the others NULL or ordinary).
_EXTREMES: dict[str, dict[str, str]] = {
    "nulls": {},
    "nan": {name: "'NaN'" for name in ("f4", "f8", "fz", "n", "nm")} | {"i4": "0", "i2": "0"},
    "infinity": {name: "'Infinity'" for name in ("f4", "f8", "n")} | {"fz": "1e308", "i4": "2147483647",
                                                                       "i2": "32767", "i8": "9223372036854775807"},
    "-infinity": {name: "'-Infinity'" for name in ("f4", "f8", "fz", "n")} | {"i4": "-2147483648", "i2": "-32768",
                                                                               "i8": "-9223372036854775808"},
    "above": {"i4": "101", "i2": "6", "f4": "1.0000001", "f8": "1e300", "fz": "2.2250738585072014e-308", "n": "1e21",
              "nm": "999999.99", "i8": "9223372036854775807"},
    "below": {"i4": "-1", "i2": "-6", "f4": "-3.4e38", "f8": "-1e301", "fz": "-5e-324", "n": "-1e100", "nm": "-1000.004"},
    "tiny": {"f8": "5e-324", "fz": "5e-324", "n": "1e-400", "i4": "1", "nm": "-0.005"},
    "ordinary": dict(_ORDINARY),
    "at-bounds": {"i4": "100", "i2": "-5", "f4": "1.0", "f8": "1e280", "fz": "3e-310", "n": "1e20", "nm": "1000"},
}
# Each family: its rows, partitioning and partition count.
_FAMILIES: dict[str, tuple[list[dict[str, str]], str, int]] = {
    "tiny": ([_ORDINARY], "row_hash", 8),  # fewer rows than partitions
    "one": ([_ORDINARY] * 6, "row_hash", 5),  # equal rows: one partition holds them all
    "empty": ([], "row_hash", 3),
    "spread": ([_ORDINARY, {**_ORDINARY, "i4": "7", "f8": "-0.5", "n": "90"}, {"i4": "0", "f8": "0", "n": "0"},
                {"i4": "100", "f8": "1", "n": "1e20", "i2": "5"}], "ctid_hash", 3),
    # A primary key (a text column "id" ahead of the others): `auto` hashes the key alone
    # (rewrite.py's hashed_columns), which no other family reaches.
    "keyed": ([_ORDINARY, {**_ORDINARY, "i4": "7", "f8": "-0.5", "n": "90"}], "auto", 4),
}
# The keyed family's ids: its base rows', then each neighbour's added row's (empty, blank, a
# base id with a trailing space or another case, unicode, a backslash, long), by neighbour.
_BASE_IDS = ("r0", "r1")
_ADDED_IDS = ("", " ", "r0 ", "R0", "Ω", "\\", "x" * 300, "r2", "ß", "r1\t")


def _row(values: dict[str, str]) -> str:
    return "(" + ", ".join(f"({values[c.name]})::{c.sql_type}" if c.name in values else "NULL" for c in COLUMNS) + ")"


def _keyed(row: str, key: str) -> str:
    """``row`` (as :func:`_row` gives it) with the keyed family's ``id`` ahead."""
    return "('" + key.replace("'", "''") + "', " + row[1:]


def _tables() -> dict[str, list[str]]:
    """Each table's rows: a family's base (``sa_<family>``) and its neighbours, one per extreme."""
    tables = {}
    for family, (rows, _, _) in _FAMILIES.items():
        keyed = family == "keyed"
        tables[f"sa_{family}"] = [_keyed(_row(row), key) if keyed else _row(row) for row, key in zip(rows, _BASE_IDS * len(rows))]
        added = [*_EXTREMES.values(), *rows[:1]]  # and a copy of a base row: it shares that row's partition under row_hash
        for k, extreme in enumerate(added[:len(_EXTREMES) + bool(rows)]):
            tables[f"sa_{family}_{k}"] = tables[f"sa_{family}"] + [_keyed(_row(extreme), _ADDED_IDS[k]) if keyed else _row(extreme)]
    return tables


class _Seed:
    """The partition seed the patched ``partition_seed`` gives the next statements."""

    value = 1


@pytest.fixture(scope="module")
def partitions_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tables = _tables()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for statement in domain_ddl():
            conn.execute(statement)
        for name, rows in tables.items():
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            key = "id text PRIMARY KEY, " if name.startswith("sa_keyed") else ""
            conn.execute(f"CREATE TABLE {name} ({key}{TABLE_DDL}) WITH (autovacuum_enabled = off)")
            if rows:
                conn.execute(f"INSERT INTO {name} VALUES {', '.join(rows)}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
    columns = policy_columns().replace("{", "{{").replace("}", "}}")
    text = _POLICY.format(tables="".join(
        f"  public.{name}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: {_FAMILIES[name.split('_')[1]][2]}, "
        f"partitioning: {_FAMILIES[name.split('_')[1]][1]}, columns: {columns}}}}}\n" for name in tables))
    policy = make_policy(test_db, tmp_path_factory.mktemp("partitions-ledger") / "ledger.sqlite3", text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("proxy.serving.executor.partition_seed", lambda: _Seed.value)
        running = RunningProxy(policy)
        try:
            yield running
        finally:
            running.stop()


def _partition_case(rng: random.Random, added: dict[str, str]) -> Case:
    """MIN, MAX or a sampled AVG (maybe several, maybe FILTERed, maybe per group), maybe under a
    WHERE; mostly of the columns the ``added`` row sets."""
    builder = _Builder(rng)
    outputs = []
    for _ in range(rng.randint(1, 3)):
        function = rng.choice(["AVG", "MIN", "MAX"])
        columns = _SAMPLED if function == "AVG" else _BOUNDED
        set_by_row = [name for name in columns if name in added]
        column = rng.choice(set_by_row if set_by_row and rng.random() < 0.8 else columns)
        output = f"{function}({column})"
        if rng.random() < 0.2:
            output += f" FILTER (WHERE {builder.predicate(0)})"
        outputs.append(output)
    grouped = rng.random() < 0.2
    sql = f"SELECT {'i2, ' if grouped else ''}{', '.join(outputs)} FROM {{table}}"
    if rng.random() < 0.3:
        sql += f" WHERE {builder.predicate(rng.randint(0, 2))}"
    if grouped:
        sql += " GROUP BY i2"
    return Case(sql, tuple(builder.params), rng.random() < 0.2, keys=int(grouped))


def test_where_the_added_row_lands_among_the_partitions_changes_no_outcome(partitions_proxy: RunningProxy) -> None:
    client = Client(partitions_proxy)
    rng = random.Random(SEED * 7919 + 31)
    failures: list[str] = []
    answered = cases = 0
    drawn: set[tuple[str, str]] = set()
    families = list(_FAMILIES)
    try:
        for index in range(CASES):
            family = rng.choice(families)
            base_rows = _FAMILIES[family][0]
            k = rng.randrange(len(_EXTREMES) + bool(base_rows))
            neighbour = f"sa_{family}_{k}"
            case = _partition_case(rng, list(_EXTREMES.values())[k] if k < len(_EXTREMES) else base_rows[0])
            draw_tables(random.Random(index), client, drawn, case)  # a fresh ε where the statement was drawn before
            _Seed.value = rng.getrandbits(63)
            runs = [_charged(client, lambda: client.run(case, table)) for table in (f"sa_{family}", neighbour)]
            cases += 1
            answered += runs[0][0].kind == "answer" and runs[0][1] > 0
            if runs[0] != runs[1] or _any_broken(runs):
                failures.append(_failure(index, case, f"{neighbour} (seed {_Seed.value})", *runs))
    finally:
        client.conn.close()
    assert not failures, _report("sampled aggregates", failures, cases)
    assert answered >= cases // 2, f"too few sampled aggregates answered: {answered} of {cases}"


def test_the_pinned_secret_moves_the_added_row_between_partitions(partitions_proxy: RunningProxy,
                                                                    test_db: TestDatabase) -> None:
    """The test above means something only if the seeds it draws put a row in different partitions:
    the partition key dpproxy runs, over the tiny family's neighbour (two rows, eight partitions),
    under a few seeds."""
    registry = partitions_proxy.server.registry
    table = next(t for t in registry.by_oid.values() if t.display_name.endswith("sa_tiny_7"))
    seen = set()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for seed in range(12):
            rows = conn.execute(f"SELECT {read_through(partition_key(table, seed))} FROM sa_tiny_7").fetchall()
            seen.add(tuple(sorted(row[0] for row in rows)))
    assert len(seen) > 3, seen
