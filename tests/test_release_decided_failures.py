"""Post-processing that fails on some releases only: charged once, its release kept, and known.

An outer statement over a release (``rewriter.post_process``) can fail on the values the noise
gave: ``substr('abc', 1, -count(*)::int)`` raises 22011 on every noisy count above 0,
``sum(x) / count(*)`` raises 22012 on a noisy count of 0, ``count(*)::int2`` 22003 past 32,767.
The error is a function of the release, so the charge stands (a refund would make it a free,
repeatable oracle of the noised values, docs/threat-model.md); the release is stored for its
repeats, so the statement asked again, or its aggregates asked without the failing expression,
cost nothing, and the error's HINT says so.

Which post-processing can fail so is found here from PostgreSQL itself: every value function
post-processing may call (``rewriter.catalog.VALUE_FUNCTIONS``), at each signature that takes a
value a release can be or be cast to, every operator and every cast to a value type
(``VALUE_CAST_TYPES``) on such a value, each over the edge values of its type. The families that fail on some values and not on others are the
list docs/threat-model.md gives; a function added to the allowlist that can fail so, or a
PostgreSQL that fails where it did not, changes the list here and there.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from rewriter.catalog import VALUE_CAST_TYPES, value_function
from tests.conftest import RunningProxy, TestDatabase, failed_twice, running_proxy, spent_epsilon
from tests.neighbour_outcome import masked_outcome
from tests.test_attack_histograms import _NEIGHBOURS, _POLICY, hist_proxy

__all__ = ["hist_proxy"]  # the fixture, used here as it is there

# The values a released column, or an analyst's cast of one, can hold: its type's edges, 0 and ±1.
_EDGES = {
    "smallint": ["0", "1", "-1", "32767", "-32768"],
    "integer": ["0", "1", "-1", "2147483647", "-2147483648"],
    "bigint": ["0", "1", "-1", "9223372036854775807", "-9223372036854775808"],
    "numeric": ["0", "1", "-1", "0.5", "-0.5", "1e20", "-1e20"],
    "double precision": ["0", "1", "-1", "0.5", "-0.5", "1e300", "-1e300", "1e-300"],
    "real": ["0", "1", "-1", "0.5", "3e38", "-3e38", "1e-38"],
    "oid": ["0", "1", "4294967295"],
    "date": ["2020-01-01", "4713-01-01 BC", "5874897-12-31"],
    "timestamp without time zone": ["2020-01-01", "4713-01-01 00:00 BC", "294276-12-31 23:59:59"],
    "timestamp with time zone": ["2020-01-01+00", "4713-01-01 00:00+00 BC", "294276-12-31 23:59:59+00"],
}
# The other arguments of a call: a value of their type that is valid for most functions.
_PLAIN = {**{name: "1" for name in _EDGES}, "date": "2020-01-01", "timestamp without time zone": "2020-01-01",
          "timestamp with time zone": "2020-01-01+00", "text": "day", "interval": "1 day", "boolean": "true",
          "name": "day", "character varying": "day"}
# The other operand of an operator: values that carry an edge past its type's range.
_OTHERS = {**{name: ["2", "-1"] for name in ("smallint", "integer", "bigint")},
           **{name: ["2", "-1", "0.5"] for name in ("numeric", "double precision", "real")},
           "interval": ["1 day", "178000000 years"]}
# Functions whose work grows with an argument (format's width, were it given as one): tried with
# small values only, so that the trial's time and memory do not depend on the machine.
_SIZED = frozenset({"format"})

# Found by the generator below on PostgreSQL 16 (pgserver): each fails on some of its values only.
_VALUE_DECIDED = frozenset({
    # value functions: a magnitude past the type (abs of its least value), a division by 0 (mod),
    # a negative length (substr, substring), a field position of 0 (split_part), a date past
    # timestamp's range (date_part)
    "abs", "date_part", "mod", "split_part", "substr", "substring",
    # operators: overflow, a division by 0, a root or a non-integer power of a negative number
    "operator *", "operator +", "operator -", "operator /", "operator %", "operator ^", "operator |/",
    "operator @",
    # casts to a narrower type
    "cast to smallint", "cast to integer", "cast to bigint", "cast to real",
    "cast to timestamp without time zone", "cast to timestamp with time zone",
    "cast to money", 'cast to "char"',
})


def _literal(value: str, type_name: str) -> str:
    return f"CAST('{value}' AS {type_name})"


def _calls(conn: psycopg.Connection) -> list[tuple[str, str, list[str]]]:
    """(family, call template with ``{}`` for the edge value, its type's edges) for every
    value function at every signature with an argument of a type in ``_EDGES``."""
    rows = conn.execute(
        "SELECT p.proname, array_agg(format_type(t, NULL) ORDER BY i) FROM pg_catalog.pg_proc AS p "
        "CROSS JOIN LATERAL unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i) "
        "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.prokind IN ('f', 'w') "
        "AND p.provariadic = 0 GROUP BY p.oid, p.proname").fetchall()
    calls = []
    for name, types in rows:
        if not value_function(name) or not all(t in _PLAIN for t in types):
            continue
        for position, type_name in enumerate(types):
            if type_name not in _EDGES:
                continue
            arguments = [_literal(_PLAIN[t], t) for t in types]
            arguments[position] = "{}"
            edges = [v for v in _EDGES[type_name] if name not in _SIZED or v in ("0", "1", "-1")]
            calls.append((name, f"pg_catalog.{name}({', '.join(arguments)})", [_literal(v, type_name) for v in edges]))
    return calls


def _operators_and_casts(conn: psycopg.Connection) -> list[tuple[str, str, list[str]]]:
    """The same for each operator with an operand of a type in ``_EDGES`` (the other a plain
    value of its type), and each cast from such a type to a value type."""
    found = []
    known = "', '".join(_EDGES)
    operators = conn.execute(
        "SELECT oprname, format_type(oprleft, NULL), format_type(oprright, NULL) FROM pg_catalog.pg_operator "
        f"WHERE format_type(oprright, NULL) IN ('{known}') OR format_type(oprleft, NULL) IN ('{known}')").fetchall()
    for symbol, left, right in operators:
        if left != "-" and left not in _PLAIN or right not in _PLAIN:
            continue
        sides = [("{}", _literal(other, right), left) for other in _OTHERS.get(right, [_PLAIN[right]])
                 ] if left in _EDGES else []
        sides += [(_literal(other, left) if left != "-" else "", "{}", right)
                  for other in (_OTHERS.get(left, [_PLAIN[left]]) if left != "-" else [""])] if right in _EDGES else []
        for left_text, right_text, type_name in sides:
            template = f"({left_text} OPERATOR(pg_catalog.{symbol}) {right_text})"
            found.append((f"operator {symbol}", template, [_literal(v, type_name) for v in _EDGES[type_name]]))
    casts = conn.execute(
        "SELECT format_type(castsource, NULL), format_type(casttarget, NULL), t.typname FROM pg_catalog.pg_cast "
        "JOIN pg_catalog.pg_type AS t ON t.oid = casttarget "
        f"WHERE format_type(castsource, NULL) IN ('{known}')").fetchall()
    for source, target, internal in casts:
        if internal in VALUE_CAST_TYPES:
            found.append((f"cast to {target}", f"CAST({{}} AS {target})", [_literal(v, source) for v in _EDGES[source]]))
    return found


def value_decided_failures(conn: psycopg.Connection) -> dict[str, set[str]]:
    """Each family that fails on some of its values and not on others, with the SQLSTATEs seen."""
    failing: dict[str, set[str]] = {}
    for family, template, values in [*_calls(conn), *_operators_and_casts(conn)]:
        errors = []
        for value in values:
            try:
                conn.execute(f"SELECT CAST({template.format(value)} AS text)").fetchall()
                errors.append(None)
            except psycopg.Error as exc:
                errors.append(exc.sqlstate)
        if any(errors) and not all(errors):
            failing.setdefault(family, set()).update(e for e in errors if e)
    return failing


def test_the_post_processing_that_fails_on_some_values_is_the_documented_list(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("SET search_path TO pg_catalog")
        found = value_decided_failures(conn)
    assert set(found) == _VALUE_DECIDED, (sorted(set(found) - _VALUE_DECIDED), sorted(_VALUE_DECIDED - set(found)))


_FAILS_ON_THE_RELEASE = "SELECT substr('abc', 1, -count(*)::int) FROM {t}"  # 22011 on every noisy count above 0
# A series limit whose ranking's outer statement fails on every release with a cell of 10 or more
# (hn0's cells hold about 20 rows each), not over the trial's NULL aggregates: 22003 after the charge.
_RANKING_FAILS_ON_THE_RELEASE = (
    "SELECT t, count(*) FROM {t} JOIN (SELECT t AS t__, count(*) AS m FROM {t} GROUP BY t "
    "ORDER BY count(*)::numeric(1, 0) LIMIT 1) AS s ON t = t__ GROUP BY t")
_BOTH = pytest.mark.parametrize("sql, sqlstate", [(_FAILS_ON_THE_RELEASE, "22011"),
                                                  (_RANKING_FAILS_ON_THE_RELEASE, "22003")],
                                ids=["outer statement", "series ranking"])


def test_a_failure_the_release_decides_is_charged_once_and_its_release_is_read_again_uncharged(
    hist_proxy: RunningProxy
) -> None:
    with hist_proxy.connect() as conn:
        failed, again = failed_twice(conn, _FAILS_ON_THE_RELEASE.format(t="hn0"), 0.871)
        # What the hint says: the aggregate alone reads the kept release too.
        spent = spent_epsilon(conn)
        row = conn.execute("SELECT count(*) FROM hn0").fetchone()
        assert row is not None and row[0] >= 1
        assert spent_epsilon(conn) == spent
    assert failed.sqlstate == again.sqlstate == "22011", str(failed)
    assert "dpproxy: ε charged 0.871" in (failed.diag.message_detail or "")
    assert "kept" in (failed.diag.message_hint or "") and "at no charge" in failed.diag.message_hint
    assert "a repeat of an earlier answer" in (again.diag.message_detail or "")


def test_a_series_rankings_failure_the_release_decides_is_charged_once_and_its_repeat_fails_alike_uncharged(
    hist_proxy: RunningProxy
) -> None:
    # The ranking's outer statement once failed with nothing kept (and its error withheld as
    # DP004): each repeat was a fresh release, charged again, unlike any other failure the
    # release decides. PostgreSQL's own error now, as any post-processing's, the charge its DETAIL.
    with hist_proxy.connect() as conn:
        failed, again = failed_twice(conn, _RANKING_FAILS_ON_THE_RELEASE.format(t="hn0"), 0.874)
    assert failed.sqlstate == again.sqlstate == "22003", str(failed)
    assert again.diag.message_primary == failed.diag.message_primary
    assert "dpproxy: ε charged 0.874" in (failed.diag.message_detail or "")
    assert "a repeat of an earlier answer" in (again.diag.message_detail or "")
    hint = failed.diag.message_hint or ""
    assert "kept" in hint and "at no charge" in hint and "asked again" in hint, hint
    assert again.diag.message_hint == hint


@_BOTH
def test_a_failure_the_release_decides_says_the_same_on_every_neighbour(hist_proxy: RunningProxy, sql: str,
                                                                         sqlstate: str) -> None:
    # Charged on each (the noise decided it); what the error says is the same on all, hint included.
    with hist_proxy.connect() as conn:
        conn.execute(f"SET dpproxy.epsilon = {0.872 if sqlstate == '22011' else 0.875}")
        outcomes = {masked_outcome(conn, sql, table) for table in ["hn0", *_NEIGHBOURS]}
    assert len(outcomes) == 1, outcomes
    (outcome,) = outcomes
    assert outcome[:2] == ("error", sqlstate) and "kept" in str(outcome[3]), outcome


@pytest.fixture(scope="module")
def forgetful_proxy(hist_proxy: RunningProxy, test_db: TestDatabase,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """hist_proxy's tables (made by its fixture) behind a dpproxy that keeps no repeats."""
    policy = _POLICY.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
    assert policy != _POLICY
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


@_BOTH
def test_without_repeats_the_error_promises_no_kept_release(forgetful_proxy: RunningProxy, sql: str,
                                                            sqlstate: str) -> None:
    epsilon = 0.873 if sqlstate == "22011" else 0.876
    with forgetful_proxy.connect() as conn:
        conn.execute(f"SET dpproxy.epsilon = {epsilon}")
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql.format(t="hn0"))
    assert failed.value.sqlstate == sqlstate, str(failed.value)
    assert f"dpproxy: ε charged {epsilon}" in (failed.value.diag.message_detail or "")
    assert "kept" not in (failed.value.diag.message_hint or ""), failed.value.diag.message_hint
