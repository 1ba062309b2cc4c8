"""An IN list of parameters on a numeric column, one declared double precision: PostgreSQL compares
the list in double precision, the others' values converted to it (a numeric or unspecified one bound
to ``4.5000000000000001`` is 4.5), where dpproxy casts each parameter to numeric (exact). Such a list
answered another question, charged: refused now before any charge (rule ``in-list-parameter-types``),
unless the others are declared double precision or an integer type (exact in double precision for
every value a numeric column of at most 15 digits holds, the only one a double precision parameter
is answered beside).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.wire import SYNC, bind, execute, parse, replies_on_both

_TABLE = "numeric_in_lists"
_POLICY = TEST_POLICY + (
    f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, columns: {{{{n: {{{{bounds: [0, 100]}}}}}}}}}}}}\n")
_SQL = f"SELECT count(*) FROM {_TABLE} WHERE n IN ($1, $2)"


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``numeric_in_lists`` (n numeric(10, 2)), 1,000 rows of 4.5."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        admin.execute(f"CREATE TABLE {_TABLE} (n numeric(10, 2))")
        admin.execute(f"INSERT INTO {_TABLE} SELECT 4.5 FROM generate_series(1, 1000)")
        admin.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _spent(proxy: RunningProxy) -> float:
    with psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True, prepare_threshold=None) as conn:
        return spent_epsilon(conn)


@pytest.mark.parametrize("types", [(0, 701), (1700, 701), (701, 705)])
def test_a_double_precision_parameter_beside_a_numeric_or_unspecified_one_is_refused_uncharged(
        test_db: TestDatabase, proxy: RunningProxy, types: tuple[int, int]) -> None:
    spent = _spent(proxy)
    direct, proxied = replies_on_both(test_db.admin_dsn, proxy.host, proxy.port,
                                      (parse("", _SQL, types), bind("", "", (b"4.5000000000000001", b"0")), execute(""), SYNC))
    assert (b"D", b"1000") in direct[0]  # PostgreSQL reads 4.5000000000000001 as 4.5: every row
    assert [reply[:2] for reply in proxied[0] if reply[0] == b"E"] == [(b"E", b"0A000")]
    assert b"in-list-parameter-types" in next(reply[2] for reply in proxied[0] if reply[0] == b"E")  # type: ignore[operator]
    assert _spent(proxy) == spent


@pytest.mark.parametrize("types", [(701, 701), (20, 701), (0, 0), (1700, 0), (1700, 20)])
def test_a_list_read_alike_in_its_common_type_is_answered(
        test_db: TestDatabase, proxy: RunningProxy, types: tuple[int, int]) -> None:
    _, proxied = replies_on_both(test_db.admin_dsn, proxy.host, proxy.port,
                                 (parse("", _SQL, types), bind("", "", (b"4", b"0")), execute(""), SYNC))
    assert not [reply for reply in proxied[0] if reply[0] == b"E"], proxied
