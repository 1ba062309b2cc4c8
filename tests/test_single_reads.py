"""A DP statement's single reads of text (``COUNT(DISTINCT col)``, a categorical GROUP BY key, MODE,
the ``row_hash`` partition key) are weighed in its work limit, by the bytes the table's
``max_text_bytes`` lets them read (rewriter/single_reads.py), and MODE's FILTER counts once for each
category, as PostgreSQL evaluates it.

Each reads every matching row's value whole (sorts, hashes or compares it), so a row whose value is
at the bound costs them more than one whose value is empty, in proportion to the bound: nothing above
the jitter at the default 256 bytes, ~5–12 ns a byte of the row on a raised one (benchmarks/results.md,
"Single reads of text"). Past the limit the statement is refused before any charge; the default bound
answers what it answered. The premise that the read is of the whole value is pinned by what
PostgreSQL itself reports: the memory a sort or a hash table holds for one row grows by its bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator

import psycopg
import pytest

from policies.errors import Refusal
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.like_patterns import MAX_CASE_FOLDED_PATTERNS
from rewriter.predicate_terms import MAX_PREDICATE_TERMS
from rewriter.rewrite import backend_sql
from rewriter.single_reads import DISTINCT_WORK, HASH_WORK, KEY_WORK
from rewriter.text_bounds import CASE_FOLD_WORK, COMPARISON_WORK, MAX_TEXT_WORK
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours

BOUND = 256  # the default max_text_bytes
CATEGORIES = ("a", "b", "c")
_COLUMNS = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("t", 25, -1, 2, None),
            ColumnInfo("cat", 25, -1, 3, ColumnPolicy(categories=CATEGORIES, group_by=True)),
            ColumnInfo("x", 23, -1, 4, ColumnPolicy(bounds=(0, 100), avg="sample_aggregate")),
            ColumnInfo("v", 1043, 10 + 4, 5, None),
            ColumnInfo("ci", 25, -1, 6, ColumnPolicy(categories=CATEGORIES, group_by=True), deterministic_collation=False),
            ColumnInfo("ch", 1042, 8 + 4, 7, ColumnPolicy(categories=CATEGORIES)))


def _relation(max_text_bytes: int = BOUND, quantum: int = 0, hashed: tuple[str, ...] = ()) -> Relation:
    policy = TablePolicy(epsilon=1.0, max_text_bytes=max_text_bytes, answer_quantum_ms=quantum)
    return Relation(1, "public", "sr", policy, {column.name: column for column in _COLUMNS},
                    "row" if hashed else "random", hashed)


def _refusal(sql: str, relation: Relation) -> Refusal:
    with pytest.raises(Refusal) as refused:
        plan_aggregate_query(sql.replace("{t}", "sr"), relation)
    return refused.value


def _lowers(count: int) -> str:
    return " OR ".join(f"lower(t) = 'x{i}'" for i in range(count))


_ONE_LOWER = COMPARISON_WORK + CASE_FOLD_WORK  # a byte of lower(t) = '…'
_COMPARED = len("".join(CATEGORIES)) * COMPARISON_WORK  # cat = 'a', 'b', 'c': each reads at most the category's bytes
# (statement, a max_text_bytes past which it weighs too much, a read the refusal names and its work at a
# bound, the statement's work at a bound)
_READS = [
    ("SELECT count(DISTINCT t) FROM {t}", 20_000, "COUNT(DISTINCT t)", lambda b: b * DISTINCT_WORK,
     lambda b: b * DISTINCT_WORK),
    ("SELECT cat, count(*) FROM {t} GROUP BY cat", 20_000, "GROUP BY cat", lambda b: b * KEY_WORK + _COMPARED,
     lambda b: b * KEY_WORK + _COMPARED),
    # under a nondeterministic collation each comparison with a category may read the whole value
    ("SELECT mode() WITHIN GROUP (ORDER BY ci) FROM {t}", 250_000, "MODE() of ci", lambda b: 3 * b, lambda b: 3 * b),
    ("SELECT count(DISTINCT t) FROM {t} GROUP BY cat", 10_000, "COUNT(DISTINCT t)", lambda b: b * DISTINCT_WORK,
     lambda b: b * (DISTINCT_WORK + KEY_WORK) + _COMPARED),
]


@pytest.mark.parametrize("sql, raised, what, read_work, work", _READS)
def test_a_single_read_is_refused_on_a_raised_bound_and_answered_at_the_default(
        sql: str, raised: int, what: str, read_work: Callable[[int], int], work: Callable[[int], int]) -> None:
    """Answered before whatever the bound; now weighed by it: the same statement plans at the default
    bound, and on a raised one it is refused (DP001, safe-predicate) with a hint naming the read."""
    assert plan_aggregate_query(sql.replace("{t}", "sr"), _relation()).text_work == work(BOUND)
    refusal = _refusal(sql, _relation(raised))
    assert refusal.sqlstate == "DP001" and refusal.rule == "safe-predicate"
    assert (f"work of {work(raised):,} units in all, conditions and single reads (at most {MAX_TEXT_WORK:,}"
            in refusal.message)
    assert f"{what} weighs {read_work(raised):,}" in refusal.message
    assert refusal.hint is not None and f"whole for {what}" in refusal.hint
    assert "lower max_text_bytes" in refusal.hint and "answer_quantum_ms" in refusal.hint
    plan_aggregate_query(sql.replace("{t}", "sr"), _relation(raised, quantum=50))  # the quantum lifts the limit


def test_comparisons_with_the_categories_weigh_the_bytes_they_read() -> None:
    """``texteq`` compares the sizes first: under a deterministic collation MODE reads at most each
    category's own bytes of a value, whatever the bound; a ``char(n)`` (its trailing spaces scanned
    first) and a nondeterministic collation (ICU) the value's, up to the bound, for each category."""
    raised = _relation(1_000_000)
    assert plan_aggregate_query("SELECT mode() WITHIN GROUP (ORDER BY cat) FROM sr", raised).text_work == _COMPARED
    assert plan_aggregate_query("SELECT mode() WITHIN GROUP (ORDER BY ch) FROM sr", raised).text_work == 3 * 32
    assert plan_aggregate_query("SELECT mode() WITHIN GROUP (ORDER BY ci) FROM sr", _relation()).text_work == 3 * BOUND


def test_single_reads_and_conditions_add_up_to_one_limit() -> None:
    """``COUNT(DISTINCT t)`` and ``lower(t) = 'x'`` each fit on a bound of 10,000 bytes; together they do not."""
    relation = _relation(10_000)
    assert plan_aggregate_query("SELECT count(DISTINCT t) FROM sr", relation).text_work == 10_000 * DISTINCT_WORK
    assert plan_aggregate_query("SELECT count(*) FROM sr WHERE lower(t) = 'x'", relation).text_work == 10_000 * _ONE_LOWER
    refusal = _refusal("SELECT count(DISTINCT t) FROM {t} WHERE lower(t) = 'x'", relation)
    assert f"work of {10_000 * (DISTINCT_WORK + _ONE_LOWER):,} units in all" in refusal.message


def test_the_row_hash_partition_key_weighs_each_hashed_text_column() -> None:
    """Sample and aggregate over ``row_hash`` hashes each hashed column's whole value for each row;
    a sum (no partitions) or a ``random`` partitioning hashes none."""
    hashed = ("id", "t", "cat")
    assert plan_aggregate_query("SELECT avg(x) FROM sr", _relation(hashed=hashed)).text_work == 2 * BOUND * HASH_WORK
    raised = MAX_TEXT_WORK // (2 * HASH_WORK) + 1
    refusal = _refusal("SELECT avg(x) FROM {t}", _relation(raised, hashed=hashed))
    assert f"the row_hash key's hash of t weighs {raised * HASH_WORK:,}" in refusal.message
    assert plan_aggregate_query("SELECT sum(x) FROM sr", _relation(raised, hashed=hashed)).text_work == 0
    assert plan_aggregate_query("SELECT avg(x) FROM sr", _relation(raised)).text_work == 0


def test_reads_of_no_bytes_weigh_nothing() -> None:
    """``COUNT(t)`` reads the header only; a number is no text; a ``varchar(10)`` is read in its 40 bytes at most."""
    relation = _relation(1_000_000)
    assert plan_aggregate_query("SELECT count(t), count(DISTINCT x) FROM sr", relation).text_work == 0
    assert plan_aggregate_query("SELECT count(DISTINCT v) FROM sr", relation).text_work == 40 * DISTINCT_WORK


def test_a_mode_filter_counts_once_a_category_in_the_terms() -> None:
    """MODE's backend SQL counts each category under the FILTER: a row reaching it is compared with
    each of its values once a category (benchmarks/results.md: 254 numbers under 200 categories)."""
    within = MAX_PREDICATE_TERMS // len(CATEGORIES)  # 85
    numbers = ", ".join(str(1000 + i) for i in range(within + 1))
    sql = f"SELECT mode() WITHIN GROUP (ORDER BY cat) FILTER (WHERE x IN ({numbers})) FROM {{t}}"
    refusal = _refusal(sql, _relation())
    assert f"conditions with {(within + 1) * len(CATEGORIES)} values and comparisons in all" in refusal.message
    plan_aggregate_query(sql.replace(f", {1000 + within})", ")").replace("{t}", "sr"), _relation())
    plan_aggregate_query(sql.replace("mode() WITHIN GROUP (ORDER BY cat)", "count(*)").replace("{t}", "sr"), _relation())


def test_a_mode_filter_counts_once_a_category_in_the_work() -> None:
    per_category = BOUND * _ONE_LOWER
    within = (MAX_TEXT_WORK - _COMPARED) // (per_category * len(CATEGORIES))  # 15
    sql = "SELECT mode() WITHIN GROUP (ORDER BY cat) FILTER (WHERE {c}) FROM sr"
    plan = plan_aggregate_query(sql.format(c=_lowers(within)), _relation())
    assert plan.text_work == within * per_category * len(CATEGORIES) + _COMPARED
    refusal = _refusal(sql.format(c=_lowers(within + 1)), _relation())
    assert f"work of {(within + 1) * per_category * len(CATEGORIES):,} units in all" in refusal.message
    # one FILTER of a count evaluates them once: answered
    plan_aggregate_query(f"SELECT count(*) FILTER (WHERE {_lowers(within + 1)}) FROM sr", _relation())


def test_a_mode_filter_counts_its_ilike_patterns_once_a_category() -> None:
    """PostgreSQL lowers an ILIKE pattern again for each evaluation: under a MODE of three categories a
    pattern of a third of the bytes allowed, and a little more, is lowered past them for a row."""
    pattern = "x" * (MAX_CASE_FOLDED_PATTERNS // len(CATEGORIES) + 1) + "%"
    refusal = _refusal(f"SELECT mode() WITHIN GROUP (ORDER BY cat) FILTER (WHERE t ILIKE '{pattern}') FROM {{t}}",
                       _relation())
    assert f"ILIKE patterns of {len(pattern) * len(CATEGORIES)} bytes in all" in refusal.message
    plan_aggregate_query(f"SELECT count(*) FILTER (WHERE t ILIKE '{pattern}') FROM sr", _relation())


# ---------------------------------------------------------------- end to end, and the premise

_DDL = "(id int PRIMARY KEY, t text STORAGE PLAIN, cat text STORAGE PLAIN, x int, v varchar(10))"
_TABLE = """
    epsilon: 1.0
    columns: {{x: {{bounds: [0, 100]}}, cat: {{categories: [a, b, c], group_by: true, other: other}}}}
"""
_POLICY = (ATTACK_POLICY_HEAD + "  public.sr_default:" + _TABLE + "  public.sr_raised:" + _TABLE
           + "    max_text_bytes: 20000\n")
IN_ROW = 7_680  # bytes of a value PostgreSQL keeps in the row uncompressed (STORAGE PLAIN, one 8 kB page)


@pytest.fixture(scope="module")
def reads_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "sr_default", {"sr_raised": "(0, 'r', 'a', 1, 'v')", "sr_premise": "(0, 'r', 'a', 1, 'v')"},
                      _DDL, "SELECT g, 'row ' || g, (ARRAY['a', 'b', 'c'])[1 + g % 3], g % 100, 'v' FROM generate_series(1, 200) g")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


@pytest.mark.parametrize("sql", [_READS[0][0], _READS[1][0]])
def test_a_single_read_past_the_limit_is_refused_uncharged_end_to_end(reads_proxy: RunningProxy, sql: str) -> None:
    with reads_proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql.replace("{t}", "sr_raised")).fetchall()
        assert refused.value.sqlstate == "DP001" and "rule: safe-predicate" in str(refused.value)
        assert refused.value.diag.message_hint is not None and "lower max_text_bytes" in refused.value.diag.message_hint
        assert spent_epsilon(conn) == before
        conn.execute(sql.replace("{t}", "sr_default")).fetchall()
        assert spent_epsilon(conn) > before


def _memory_kb(conn: psycopg.Connection, sql: str, node: str, key: str) -> int:
    """The memory PostgreSQL reports for the deepest ``node`` of ``sql``'s plan (``EXPLAIN ANALYZE``), in
    kB: the one that reads the table's rows (a grouped statement's outer aggregate reads its groups)."""
    row = conn.execute(f"EXPLAIN (ANALYZE, TIMING OFF, COSTS OFF, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    nodes, found = [plan[0]["Plan"]], []
    while nodes:
        item = nodes.pop(0)
        if item["Node Type"] == node and key in item:
            found.append(int(item[key]))
        nodes.extend(item.get("Plans", []))
    assert found, f"no {node} with {key} in {json.dumps(plan)}"
    return found[-1]


@pytest.mark.parametrize("sql, node, key, held", [
    ("SELECT count(DISTINCT t) FROM {t}", "Sort", "Sort Space Used", True),  # the shuffle's sort holds each row's value
    # The rows are grouped by a declared category's value (or NULL), never their own: a group holds
    # a category (rewriter/group_keys.py), where grouped by the raw value a new group held the row's.
    ("SELECT cat, count(*) FROM {t} GROUP BY cat", "Aggregate", "Peak Memory Usage", False),
])
def test_a_single_read_holds_the_rows_whole_value(reads_proxy: RunningProxy, test_db: TestDatabase, sql: str,
                                                   node: str, key: str, held: bool) -> None:
    """What dpproxy sends for the statement, on a table whose one row holds a value of 7,680 bytes in
    the row (read under a bound of 8,000) and then an empty one: the sort PostgreSQL reports holds at
    least 7 kB more, the value whole, where a read of the header (``COUNT(t)``) would hold nothing of
    it; so the work grows with the value's bytes, which is what the weight charges. A categorical
    key's hash table holds no more (its weight stays, for the value's comparisons)."""
    relation = Relation(1, "public", "sr_premise", TablePolicy(epsilon=1.0, max_text_bytes=8_000),
                        {column.name: column for column in _COLUMNS if column.name != "v"}, "random")
    backend = backend_sql(plan_aggregate_query(sql.replace("{t}", "sr_premise"), relation), 0)
    column = re.search(r"\((DISTINCT )?(\w+)\)|GROUP BY (\w+)", sql)
    assert column is not None
    name = column.group(2) or column.group(3)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        sizes = {}
        for value in (f"repeat(md5('x'), {IN_ROW // 32})", "''"):
            conn.execute(f"UPDATE sr_premise SET {name} = {value} WHERE id = 1")
            assert conn.execute(f"SELECT pg_column_size({name}) > octet_length({name}) FROM sr_premise "
                                "WHERE id = 1").fetchone() == (True,)  # in the row, uncompressed: read
            sizes[value] = _memory_kb(conn, backend, node, key)
    long, empty = sizes.values()
    assert (long - empty >= IN_ROW // 1024) == held, sizes
