"""Stop 37's new constructs attacked on neighbouring tables: the variance family as one release
with an AVG read from its moments, percentile arrays per cell of a histogram and in binary,
ARRAY[$1, $2] and list parameters refused, the failed login's and the unknown relation's hints.

The statements run on ``s37_0`` and on neighbours that each add one adversarial row (stop 36's
twelve: NULLs, NaN, ±Infinity, integer limits, numerics of 1,000 and 131,072 digits, 1e-16383,
-0.0, subnormals, values on and just past the bounds, a 3 MB TOASTed and a 400 kB multibyte
text), and on ``s37n_0``, a numeric(5, -2) column (PostgreSQL 15 on: values rounded to
hundreds) beside a real column whose bounds, [0, 1e-44], hold only float4 subnormals. What the
analyst sees but the noised values (outcome, SQLSTATE, message and hint, columns and types,
rows, the keys' order, tag, notices with numbers masked, binary and COPY framing, a cursor's
fetches) must be the same on all, and a refusal costs nothing.

Held: everything below. The AVG read from a family's moments has the type, typmod and text
form of the AVG released on its own (numeric for integer and numeric columns, double precision
for float ones, no typmod), under an empty FILTER, an all-NULL CASE, in an expression
(``stddev(x) / avg(x)``), under HAVING and ORDER BY, in binary, COPY and a cursor. A cell's
percentile array read back by an outer statement (``CAST(unnest($k) AS real[])``) is the array
dpproxy sends without one, in text and binary, for every column type, float4 subnormals and a
negative-scale numeric included; subscripts, slices, ``array_length``, ``= ANY``,
``array_to_string``, HAVING on an element and ORDER BY an element hold. Every spelling of a
bound fraction inside an array or of a list bound as one parameter is refused before the
charge, in text and binary Bind formats.
"""

from __future__ import annotations

import base64
import socket
import struct
from collections.abc import Callable, Iterator
from decimal import Decimal

import psycopg
import pytest
from psycopg.types.numeric import Float4

from tests.conftest import ATTACK_POLICY_HEAD, TEST_DATABASE, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.test_attack_stop36 import (_BASE_ROWS, _DDL, _NEIGHBOURS, _TABLE, _binary_outcome, _copy_outcome,
                                      _cursor_outcome)

_N37 = {name.replace("s36", "s37"): row for name, row in _NEIGHBOURS.items()}
_NAMES = ("s37_0", *_N37)
# numeric(5, -2) and a real column whose bounds hold only float4 subnormals, one adversarial row each
_SMALL = {"s37n_1": "('a', NULL, NULL)", "s37n_2": "('b', 'NaN', 'NaN')", "s37n_3": "('a', 9999900, 'Infinity')",
          "s37n_4": "('a', -9999900, '-Infinity')", "s37n_5": "('b', -0.0, '-0.0')", "s37n_6": "('a', 49.999, 1e-45)",
          "s37n_7": "('b', 100000, 3.4e38)"}
_SMALL_NAMES = ("s37n_0", *_SMALL)
_SMALL_TABLE = """
    epsilon: 1.0
    columns:
      k: {{categories: [a, b], group_by: true}}
      h: {{bounds: [0, 100000]}}
      q: {{bounds: [0, 1.0e-44]}}
"""
_POLICY = (ATTACK_POLICY_HEAD + "  public.s37_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _N37)
           + "  public.s37n_0: &N" + _SMALL_TABLE + "".join(f"  public.{name}: *N\n" for name in _SMALL))
_COLUMNS = ("a", "b", "c", "n", "n2", "f", "r", "nw", "fw", "nt", "ft", "fe")


@pytest.fixture(scope="module")
def s37(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "s37_0", _N37, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, "s37n_0", _SMALL, "(k text, h numeric(5, -2), q real)",
                      "SELECT (ARRAY['a', 'b'])[1 + g % 2], g * 100, CAST((g % 7) * 1.401298464324817e-45 AS float8)::real "
                      "FROM generate_series(1, 500) g")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _keys(sql: str) -> int:
    """How many leading columns of each row are keys whose values and order must match: the
    cell's key of a GROUP BY in the keys' order (none when the rows are ordered by a value)."""
    return 1 if "GROUP BY" in sql and "ORDER BY 2" not in sql and "ORDER BY avg" not in sql else 0


def _same(proxy: RunningProxy, sql: str, names: tuple[str, ...] = _NAMES,
          params: tuple[object, ...] | None = None) -> tuple[object, ...]:
    with proxy.connect() as conn:
        return same_on_neighbours(conn, sql, names, spent_epsilon, _keys(sql), params)


# ------------------------------------------------------------------ the variance family and its AVG

FAMILY = [
    *(f"SELECT avg({c}), variance({c}), stddev_pop({c}) FROM {{t}}" for c in _COLUMNS),
    "SELECT avg(n) FILTER (WHERE s = 'zz'), variance(n) FILTER (WHERE s = 'zz') FROM {t}",  # empty but on s37_2
    "SELECT avg(f) FILTER (WHERE f > 1e300), stddev(f) FILTER (WHERE f > 1e300) FROM {t}",  # only s37_5's 1e308
    "SELECT avg(CASE WHEN s = 'zz' THEN r END), stddev(CASE WHEN s = 'zz' THEN r END) FROM {t}",
    "SELECT stddev(f) / avg(f), avg(f), stddev(f) / nullif(avg(f), 0) FROM {t}",
    "SELECT avg(c)::text, variance(c)::text, stddev(c) * 2, round(avg(n2), 1) FROM {t}",
    "SELECT avg(a), sum(a), variance(a), count(*) FROM {t}",  # four releases: the AVG stays sum_count
    "SELECT avg(h), stddev(h), var_samp(h) FROM {t}",
    "SELECT avg(q), stddev(q), var_pop(q) FILTER (WHERE k = 'a') FROM {t}",
    "SELECT s, avg(n2), stddev(n2) FROM {t} GROUP BY s",
    "SELECT s, avg(n2), stddev(n2) FROM {t} GROUP BY s HAVING avg(n2) > -2000 ORDER BY avg(n2), stddev(n2)",
    "SELECT s, avg(fw) FILTER (WHERE s = 'zz'), var_pop(fw) FILTER (WHERE s = 'zz') FROM {t} GROUP BY s",
    "SELECT s, avg(nt), stddev(nt) FROM {t} GROUP BY s HAVING stddev(nt) >= 0 ORDER BY 1",
    "SELECT k, avg(h), stddev(h) FROM {t} GROUP BY k ORDER BY 1",
    "SELECT k, avg(q) * 1e44, variance(q) FROM {t} GROUP BY k",
]


@pytest.mark.parametrize("sql", FAMILY)
def test_an_avg_read_from_a_variance_familys_moments_is_the_same_on_every_table(s37: RunningProxy, sql: str) -> None:
    names = _SMALL_NAMES if "(h)" in sql or "(q)" in sql else _NAMES
    outcome = _same(s37, sql, names)
    assert outcome[0] == "answer", outcome
    merged = "avg" in sql and "sum(a)" not in sql
    assert ("from" in str(outcome[-1]) and "noisy moments, no more ε" in str(outcome[-1])) == merged, outcome


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("sql", "params", "merged"), [
    ("SELECT avg(n) FILTER (WHERE b > %s), stddev(n) FILTER (WHERE b > %s) FROM {t}", (50, 50), False),
    ("SELECT avg(n) FILTER (WHERE b > %s), stddev(n) FILTER (WHERE b > %s) FROM {t}", (50, 51), False),
    ("SELECT avg(f) FILTER (WHERE s = %s), variance(f) FILTER (WHERE s = %s), stddev(f) FILTER (WHERE s = %s) FROM {t}",
     ("zz", "zz", "zz"), False),
    ("SELECT s, avg(c) FILTER (WHERE b > %s), stddev(c) FILTER (WHERE b > %s) FROM {t} GROUP BY s", (1000, 1000), False),
])
def test_a_familys_grouping_reads_where_a_parameter_stands_not_its_value(
        s37: RunningProxy, sql: str, params: tuple[object, ...], merged: bool, binary: bool) -> None:
    # $1 and $2 are two conditions whatever their values: the grouping is the same for equal and
    # different values (the values are the statement's, but the split must not wait for them).
    outcome = _same(s37, sql.replace("%s", "%b") if binary else sql, params=params)
    assert outcome[0] == "answer", outcome
    assert ("noisy moments, no more ε" in str(outcome[-1])) == merged, outcome


def _same_form(proxy: RunningProxy, outcome: Callable[[psycopg.Connection, str], tuple[object, ...]],
               sql: str) -> None:
    """``sql`` answered, and ``outcome`` (binary, COPY or cursor: stop 36's) the same, on every table."""
    with proxy.connect() as conn:
        results = {name: outcome(conn, sql.replace("{t}", name)) for name in _NAMES}
    assert results["s37_0"][0] == "answer", results["s37_0"]
    assert all(result == results["s37_0"] for result in results.values()), results


def _shape(cursor: psycopg.Cursor[tuple[object, ...]]) -> list[tuple[object, ...]]:
    return [(d.name, d.type_code, d.internal_size, d.precision, d.scale) for d in cursor.description or ()]


@pytest.mark.parametrize("column", _COLUMNS)
def test_an_avg_from_moments_has_the_type_and_typmod_of_an_avg_released_alone(s37: RunningProxy, column: str) -> None:
    with s37.connect() as conn:
        for name in _NAMES:
            alone = conn.execute(f"SELECT avg({column}) FROM {name}")
            merged = conn.execute(f"SELECT avg({column}), stddev({column}) FROM {name}")
            assert _shape(alone) == _shape(merged)[:1], (name, _shape(alone), _shape(merged))
            texts = [conn.execute(f"SELECT avg({column})::text, variance({column}) FROM {name}").fetchone(),
                     conn.execute(f"SELECT avg({column})::text FROM {name}").fetchone()]
            # a number as the type prints it: no NaN, infinity or NULL on any neighbour
            assert all(row is not None and row[0] is not None and Decimal(row[0]).is_finite() for row in texts), texts


_FORMS = [
    (_binary_outcome, "SELECT avg(nw), var_pop(nw), avg(ft), stddev(ft) FROM {t}"),
    (_binary_outcome, "SELECT avg(c), variance(c), avg(r) FILTER (WHERE s = 'zz'), stddev(r) FILTER (WHERE s = 'zz') FROM {t}"),
    (_binary_outcome, "SELECT s, avg(n2), stddev(n2) FROM {t} GROUP BY s"),
    (_binary_outcome, "SELECT s, avg(fw), variance(fw) FROM {t} GROUP BY s ORDER BY 1"),
    (_copy_outcome, "COPY (SELECT avg(n), var_samp(n), avg(fe), stddev(fe) FROM {t}) TO STDOUT (FORMAT binary)"),
    (_copy_outcome, "COPY (SELECT s, avg(b), stddev(b) FROM {t} GROUP BY s) TO STDOUT"),
    (_copy_outcome, "COPY (SELECT s, avg(nt), variance(nt) FROM {t} GROUP BY s HAVING avg(nt) >= 0) TO STDOUT (FORMAT binary)"),
    (_cursor_outcome, "SELECT avg(a), stddev(a) FROM {t}"),
    (_cursor_outcome, "SELECT s, avg(f), stddev_samp(f) FROM {t} GROUP BY s"),
]


@pytest.mark.parametrize(("outcome", "sql"), _FORMS)
def test_an_avg_from_moments_in_binary_copy_and_a_cursor_is_the_same_on_every_table(
        s37: RunningProxy, outcome: Callable[[psycopg.Connection, str], tuple[object, ...]], sql: str) -> None:
    _same_form(s37, outcome, sql)


# ------------------------------------------------------------------ percentile arrays per cell

CELL_ARRAYS = [
    *(f"SELECT s, (percentile_{kind}(ARRAY[0, 0.5, 1]) WITHIN GROUP (ORDER BY {c}))[2] FROM {{t}} GROUP BY s ORDER BY 2"
      for c in _COLUMNS for kind in ("cont", "disc")),
    *(f"SELECT s, percentile_disc(ARRAY[0, 0.01, 0.99, 1]) WITHIN GROUP (ORDER BY {c}) FROM {{t}} GROUP BY s HAVING true "
      "ORDER BY 1" for c in _COLUMNS),
    "SELECT s, array_length(percentile_cont(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY nw), 1) FROM {t} GROUP BY s ORDER BY 1",
    "SELECT s, 5 = ANY(percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY a)) FROM {t} GROUP BY s ORDER BY 1",
    "SELECT s, array_to_string(percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY n2), ';') FROM {t} GROUP BY s "
    "ORDER BY 1",
    "SELECT s FROM {t} GROUP BY s HAVING (percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY c))[1] > -1e30 ORDER BY 1",
    "SELECT s, percentile_cont(ARRAY[0.5]) WITHIN GROUP (ORDER BY ft) FILTER (WHERE s = 'zz') FROM {t} GROUP BY s "
    "ORDER BY 1",
    "SELECT s, (percentile_disc(ARRAY[0.5, 0.6]) WITHIN GROUP (ORDER BY r))[1:2]::text FROM {t} GROUP BY s ORDER BY 1",
    "SELECT s, (percentile_disc(ARRAY[0.5, 0.6]) WITHIN GROUP (ORDER BY c))[3] FROM {t} GROUP BY s ORDER BY 1",
    "SELECT k, percentile_disc(ARRAY[0, 0.5, 1]) WITHIN GROUP (ORDER BY h) FROM {t} GROUP BY k ORDER BY 1",
    "SELECT k, (percentile_disc(ARRAY[0, 0.5, 1]) WITHIN GROUP (ORDER BY q))[3] FROM {t} GROUP BY k ORDER BY 2",
    "SELECT k, percentile_cont(ARRAY[0, 0.5, 1]) WITHIN GROUP (ORDER BY q) FROM {t} GROUP BY k ORDER BY 1",
    "SELECT (percentile_disc(ARRAY[0, 1]) WITHIN GROUP (ORDER BY q))[1], percentile_disc(ARRAY[0.5]) WITHIN GROUP "
    "(ORDER BY q) FROM {t}",
]


@pytest.mark.parametrize("sql", CELL_ARRAYS)
def test_a_cells_percentile_array_read_back_by_an_outer_statement_is_the_same_on_every_table(
        s37: RunningProxy, sql: str) -> None:
    names = _SMALL_NAMES if "(ORDER BY h)" in sql or "(ORDER BY q)" in sql else _NAMES
    assert _same(s37, sql, names)[0] == "answer"


_ARRAY_COLUMNS = [(c, kind, _NAMES) for c in _COLUMNS for kind in ("cont", "disc")] + [
    ("h", "disc", _SMALL_NAMES), ("q", "disc", _SMALL_NAMES), ("q", "cont", _SMALL_NAMES)]


@pytest.mark.parametrize(("column", "kind", "names"), _ARRAY_COLUMNS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_cells_array_cast_back_is_the_array_dpproxy_sends_without_an_outer_statement(
        s37: RunningProxy, column: str, kind: str, names: tuple[str, ...]) -> None:
    # The first statement is answered by dpproxy alone, the second (ORDER BY) by an outer
    # statement that casts each cell's text back: a repeat of the same release, so the same
    # values, which must come back with the same type, typmod and bytes in text and in binary.
    key = "s" if names is _NAMES else "k"
    with s37.connect() as conn:
        for name in names[:3] + names[-2:]:
            plain = (f"SELECT {key}, percentile_{kind}(ARRAY[0, 0.3, 1]) WITHIN GROUP (ORDER BY {column}) FROM {name} "
                     f"GROUP BY {key}")
            seen = []
            for sql in (plain, plain + " ORDER BY 1"):
                for binary in (False, True):
                    with conn.cursor(binary=binary) as cursor:
                        cursor.execute(sql)
                        raw = [cursor.pgresult.get_value(i, 1) for i in range(cursor.pgresult.ntuples)]
                        seen.append((binary, _shape(cursor), raw))
            assert seen[0] == (False, *seen[2][1:]) and seen[1] == (True, *seen[3][1:]), (name, seen)


@pytest.mark.parametrize("sql", [
    "COPY (SELECT s, percentile_cont(ARRAY[0.1, 0.5]) WITHIN GROUP (ORDER BY nw) FROM {t} GROUP BY s) TO STDOUT (FORMAT binary)",
    "COPY (SELECT s, percentile_disc(ARRAY[0.1, 0.5]) WITHIN GROUP (ORDER BY c) FROM {t} GROUP BY s ORDER BY 1) "
    "TO STDOUT (FORMAT binary)",
    "COPY (SELECT s, percentile_disc(ARRAY[0, 1]) WITHIN GROUP (ORDER BY n2) FROM {t} GROUP BY s ORDER BY 1) TO STDOUT",
])
def test_a_cells_percentile_array_in_copy_is_the_same_on_every_table(s37: RunningProxy, sql: str) -> None:
    _same_form(s37, _copy_outcome, sql)


# ------------------------------------------------------------------ fractions bound inside an array

_IN_ARRAY = "SELECT percentile_cont({p}) WITHIN GROUP (ORDER BY f) FROM {{t}}"
# A bound fraction inside an array, or a list of fractions bound as one parameter (declared or
# cast as a number array): refused before the charge, with the hint that says what is answered.
BOUND_ARRAYS: list[tuple[str, tuple[object, ...]]] = [
    ("ARRAY[%s]", (0.5,)), ("ARRAY[%s, %s]", (0.25, 0.75)), ("ARRAY[%s, 0.5]", (0.25,)), ("ARRAY[0.5, %s]", (0.25,)),
    ("ARRAY[%s::float8, %s::numeric]", (0.25, Decimal("0.5"))), ("ARRAY[(%s)]", (0.5,)), ("ARRAY[-%s]", (-0.5,)),
    ("ARRAY[%s]::float8[]", (0.5,)), ("ARRAY[%s, %s]", (Float4(0.5), 1)), ("%s::float8[]", ([0.25, 0.5],)),
    ("CAST(%s AS numeric[])", ([Decimal("0.5")],)), ("(%s)::real[]", ([0.5],)), ("%s::float8[]", ("{0.25,0.5}",)),
    ("%s", ([0.25, 0.5],)), ("%s", ([Decimal("0.25"), Decimal("0.5")],)), ("%s", ([1, 0],)), ("%s", ([Float4(0.5)],)),
]
# Refused as PostgreSQL or dpproxy refuses the value bound as one fraction.
OTHER_BOUND: list[tuple[str, tuple[object, ...]]] = [
    ("%s", ("{0.25,0.5}",)), ("%s", ([],)), ("string_to_array(%s, ',')::float8[]", ("0.25,0.5",)),
]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize(("fraction", "params"), BOUND_ARRAYS + OTHER_BOUND, ids=repr)
def test_a_fraction_bound_inside_an_array_is_refused_before_the_charge_in_both_formats(
        s37: RunningProxy, fraction: str, params: tuple[object, ...], binary: bool) -> None:
    sql = _IN_ARRAY.format(p=fraction.replace("%s", "%b") if binary else fraction)
    outcome = _same(s37, sql, params=params)
    assert outcome[0] == "error" and outcome[1] in ("DP001", "22P02"), outcome
    if (fraction, params) in BOUND_ARRAYS:
        assert "parameter" in str(outcome[2]) and "aggregate-argument" in str(outcome[2]), outcome
        assert "bind each fraction to a percentile of its own" in str(outcome[3]), outcome


# ------------------------------------------------------------------ the new hints

def _read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = b""
    while len(head) < 5:
        head += sock.recv(5 - len(head))
    (size,) = struct.unpack("!i", head[1:])
    body = b""
    while len(body) < size - 4:
        body += sock.recv(size - 4 - len(body))
    return head[:1], body


def _failed_scram_login(proxy: RunningProxy, user: str) -> bytes:
    """The ErrorResponse, every byte of it, that ends a SCRAM login as ``user`` whose proof is wrong."""
    with socket.create_connection((proxy.host, proxy.port), timeout=30) as sock:
        params = f"user\0{user}\0database\0{TEST_DATABASE}\0\0".encode()
        sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        kind, body = _read_message(sock)
        assert kind == b"R" and body.startswith(struct.pack("!i", 10)) and b"SCRAM-SHA-256" in body, (kind, body)
        first = b"n,,n=,r=" + base64.b64encode(b"client nonce 37!")
        sasl = b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first
        sock.sendall(b"p" + struct.pack("!i", 4 + len(sasl)) + sasl)
        kind, body = _read_message(sock)
        assert kind == b"R" and body[:4] == struct.pack("!i", 11), (kind, body)
        nonce = dict(item.split("=", 1) for item in body[4:].decode().split(","))["r"]
        final = f"c=biws,r={nonce},p={base64.b64encode(bytes(32)).decode()}".encode()
        sock.sendall(b"p" + struct.pack("!i", 4 + len(final)) + final)
        kind, body = _read_message(sock)
        assert kind == b"E", (kind, body)
        return body


def test_a_failed_login_is_the_same_bytes_for_a_known_user_and_an_unknown_one(s37: RunningProxy) -> None:
    # analyst is the policy's (SCRAM); the others are not its users: a backend role, a made-up
    # name of the same length as analyst's. The hint is the same words for each, and nothing else
    # but the name in the message differs.
    failures = {user: _failed_scram_login(s37, user) for user in ("analyst", "postgres", "analyse", "dpproxy_service")}
    masked = {failure.replace(user.encode(), b"U") for user, failure in failures.items()}
    assert len(masked) == 1, failures
    fields = {body[:1]: body[1:] for body in next(iter(masked)).split(b"\0") if body}
    assert fields[b"C"] == b"28P01" and fields[b"S"] == b"FATAL", fields
    assert fields[b"H"] == b"Logins are the users of dpproxy's policy, not the backend's PostgreSQL roles: " \
                           b"check the user name and password with the policy's owner.", fields


@pytest.mark.parametrize("user", ["analyst", "plain"])
def test_an_unknown_relations_hint_names_only_the_policys_tables_whoever_asks(
        s37: RunningProxy, admin: psycopg.Connection, user: str) -> None:
    # s37_hidden exists in the backend but the policy does not name it: refused by default-deny
    # (as before), and named by no hint; each unknown name gets the same hint.
    admin.execute("CREATE TABLE IF NOT EXISTS s37_hidden (x int)")
    admin.execute("GRANT SELECT ON s37_hidden TO dpproxy_service")
    policy_tables = {*_NAMES, *_SMALL_NAMES}
    outcomes = set()
    with psycopg.connect(s37.dsn(user=user, password=user), autocommit=True) as conn:
        for relation in ("s37_nosuch", "public.s37_nosuch", "pg_catalog.s37_nosuch", "s37_0x", '"S37_0"'):
            with pytest.raises(psycopg.errors.UndefinedTable) as refused:
                conn.execute(f"SELECT count(*) FROM {relation}")
            diag = refused.value.diag
            outcomes.add((diag.sqlstate, diag.message_hint))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="default-deny"):
            conn.execute("SELECT count(*) FROM s37_hidden")
    assert len(outcomes) == 1, outcomes
    (_, hint), = outcomes
    assert hint is not None and hint.startswith("The tables dpproxy's policy names: "), hint
    listed, more = hint.removeprefix("The tables dpproxy's policy names: ").removesuffix(".").split(" and ")
    assert set(listed.split(", ")) <= policy_tables and len(listed.split(", ")) == 20, hint
    assert more == f"{len(policy_tables) - 20} more", hint
