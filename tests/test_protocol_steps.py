"""A DP statement through the extended protocol fails with PostgreSQL's SQLSTATE, in PostgreSQL's
order: what its Parse cannot read before any value bound to it, as on PostgreSQL (compared on a raw
connection straight to PostgreSQL in the same run, ``tests.wire.replies_on_both``), and uncharged.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import RunningProxy, TestDatabase, proxy_over_table, spent_by_plain
from tests.wire import SYNC, Reply, Wire, bind, cstr, describe, execute, message, parse, replies_on_both

_TABLE = "steps_values"


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``steps_values`` (i int4, d date, ts timestamp, n numeric(10, 2)), 30 rows, n 4.5 in each."""
    with proxy_over_table(test_db, tmp_path_factory, _TABLE, "i int4, d date, ts timestamp, n numeric(10, 2)",
                          "SELECT g, date '2000-05-01' + g % 3, timestamp '2000-05-01', 4.5 FROM generate_series(1, 30) g",
                          "{i: {bounds: [0, 100]}, d: {bounds: [2000-01-01, 2000-12-31]}, "
                          "ts: {bounds: [2000-01-01, 2000-12-31]}, n: {bounds: [0, 100]}}") as running:
        yield running


def _errors(replied: list[Reply]) -> list[tuple[object, ...]]:
    return [reply[1:] for reply in replied if reply[0] == b"E"]


def _run_on_both(test_db: TestDatabase, proxy: RunningProxy, sql: str, types: tuple[int, ...],
                 values: tuple[bytes | None, ...]) -> tuple[list[Reply], list[Reply]]:
    """PostgreSQL's replies to ``sql`` parsed with ``types``, bound to ``values`` and executed, and
    dpproxy's, which must have charged nothing when it failed."""
    spent = spent_by_plain(proxy)
    direct, proxied = replies_on_both(test_db.admin_dsn, proxy.host, proxy.port,
                                      (parse("", sql, types), bind("", "", values), execute(""), SYNC))
    if _errors(proxied[0]):
        assert spent_by_plain(proxy) == spent
    return direct[0], proxied[0]


@pytest.mark.parametrize(("condition", "types", "values"), [
    # ts <> integer has no operator (42883): the fold of $2::timestamptz would read 'abc' (22007)
    ("ts <> $1 OR d >= $2::timestamptz", (23, 25), (b"5", b"abc")),
    # the same beside a folded expression in an aggregate's FILTER
    ("ts <> $1 AND i > $2 + 1", (23, 20), (b"5", b"abc")),
])
def test_a_statement_postgresql_cannot_parse_fails_with_its_error_before_a_folded_value_is_read(
        test_db: TestDatabase, proxy: RunningProxy, condition: str, types: tuple[int, ...],
        values: tuple[bytes, ...]) -> None:
    for shape in ("SELECT count(*) FROM {} WHERE {}", "SELECT count(*) FILTER (WHERE {1}) FROM {0}"):
        direct, proxied = _run_on_both(test_db, proxy, shape.format(_TABLE, condition), types, values)
        # (its message names the backend SQL's operator, OPERATOR(pg_catalog.<>))
        assert _errors(direct) and [error[0] for error in _errors(proxied)] == [error[0] for error in _errors(direct)]


def _outcome(replied: list[Reply]) -> str:
    """``answered``, or the SQLSTATE the statement failed with."""
    errors = _errors(replied)
    return str(errors[0][0], "ascii") if errors else "answered"


@pytest.mark.parametrize(("condition", "types", "value"), [
    # PostgreSQL compares the list in its common type, numeric, and reads $1 so: 5.0 is 5
    ("i IN ($1, 5.5)", (), b"5.0"),
    ("i IN ($1, 5.5)", (), b"5.5"),
    ("i NOT IN (5.5, $1)", (), b"1e1"),
    ("i IN ($1, 5.5)", (23,), b"5"),
    ("i IN ($1, 5.5)", (), b"abc"),
    # a bigint literal makes the list bigint
    ("i IN ($1, 3000000000)", (), b"3000000000"),
    ("i IN ($1, 2147483648)", (), b"-2147483649"),
    ("i IN ($1, -2147483648)", (), b"-2147483649"),  # an integer: PostgreSQL fails (22003)
    ("i IN ($1, -2147483649)", (), b"-2147483649"),
    # an untyped string beside them is read in the list's type too
    ("i IN ('5.0', 5.5, $1)", (), b"5"),
    ("i IN ('3000000000', 3000000000, $1)", (), b"5"),
    ("i IN ('abc', 5.5, $1)", (), b"5"),
])
def test_an_in_list_reads_an_unspecified_parameter_in_the_lists_common_type(
        test_db: TestDatabase, proxy: RunningProxy, condition: str, types: tuple[int, ...], value: bytes) -> None:
    direct, proxied = _run_on_both(test_db, proxy, f"SELECT count(*) FROM {_TABLE} WHERE {condition}", types, (value,))
    assert _outcome(proxied) == _outcome(direct), (direct, proxied)


@pytest.mark.parametrize("condition", ["i IN ($1, 5.5)", "i IN ($1, $2, 3000000000)", "i IN ($1, 5)"])
def test_an_in_lists_parameters_are_described_in_the_lists_common_type(
        test_db: TestDatabase, proxy: RunningProxy, condition: str) -> None:
    described = []
    for wire in (Wire.direct(test_db.admin_dsn), Wire(proxy.host, proxy.port)):
        try:
            wire.send(parse("", f"SELECT count(*) FROM {_TABLE} WHERE {condition}"), describe(b"S", ""), SYNC)
            described.append([body for kind, body in wire.read_until(b"Z") if kind == b"t"])
        finally:
            wire.close()
    assert described[0] and described[1] == described[0]


# A numeric column's IN list with a double precision parameter: PostgreSQL compares the list in double
# precision, the others' values converted to it (a numeric or unspecified one bound to
# 4.5000000000000001 is 4.5), where dpproxy casts each parameter to numeric (exact). It answered
# another question, charged; refused now before any charge (rule in-list-parameter-types), unless the
# others are double precision or an integer type, exact in double precision for every value a
# numeric column of at most 15 digits holds (the only one a double precision parameter is answered beside).
_NUMERIC_LIST = f"SELECT count(*) FROM {_TABLE} WHERE n IN ($1, $2)"


@pytest.mark.parametrize("types", [(0, 701), (1700, 701), (701, 705)])
def test_a_numeric_lists_double_precision_parameter_beside_a_numeric_or_unspecified_one_is_refused_uncharged(
        test_db: TestDatabase, proxy: RunningProxy, types: tuple[int, int]) -> None:
    direct, proxied = _run_on_both(test_db, proxy, _NUMERIC_LIST, types, (b"4.5000000000000001", b"0"))
    assert (b"D", b"30") in direct  # PostgreSQL reads 4.5000000000000001 as 4.5: every row
    assert [error[0] for error in _errors(proxied)] == [b"0A000"]
    assert b"in-list-parameter-types" in _errors(proxied)[0][1]  # type: ignore[operator]


@pytest.mark.parametrize("types", [(701, 701), (20, 701), (0, 0), (1700, 0), (1700, 20)])
def test_a_numeric_list_read_alike_in_its_common_type_is_answered(
        test_db: TestDatabase, proxy: RunningProxy, types: tuple[int, int]) -> None:
    _, proxied = _run_on_both(test_db, proxy, _NUMERIC_LIST, types, (b"4", b"0"))
    assert not _errors(proxied), proxied


def _query(sql: str) -> tuple[bytes, ...]:
    return (message(b"Q", cstr(sql)),)


@pytest.mark.parametrize("taken", [_query("DECLARE c CURSOR FOR SELECT 1"),
                                   (parse("", "SELECT 1"), bind("c", ""), SYNC)])
def test_a_bind_naming_a_cursor_or_portal_the_session_has_fails_as_on_postgresql(
        test_db: TestDatabase, proxy: RunningProxy, taken: tuple[bytes, ...]) -> None:
    # In PostgreSQL a SQL cursor is a portal: one namespace (42P03, 'cursor "c" already exists').
    direct, proxied = replies_on_both(test_db.admin_dsn, proxy.host, proxy.port, _query("BEGIN"), taken,
                                      (parse("", "SELECT 2"), bind("c", ""), execute("c"), SYNC), _query("ROLLBACK"))
    assert _errors(direct[2]) == [(b"42P03", b'cursor "c" already exists')]
    assert _errors(proxied[2]) == _errors(direct[2]) and [r[0] for r in proxied[2]] == [r[0] for r in direct[2]]
    # (the block goes on after it, as after any refusal dpproxy makes itself: PostgreSQL's is failed)
