"""The parse differential's second half: what PostgreSQL computes from the aggregates and GROUP BY
keys of a DP statement against what dpproxy computes from its release (tests/parse_differential.py).

dpproxy answers ``SELECT round(avg(income), 1) AS a, date_trunc('month', t) AS m ... GROUP BY m
HAVING count(*) > 10 ORDER BY a DESC LIMIT 3`` in two parts (rewriter/post_process.py): the
backend SQL groups the rows by each key (``GROUP BY <key>``, the key's range test around it) and
releases the aggregates; an outer statement, sqlglot's writing of the statement's own outputs,
HAVING, ORDER BY and LIMIT, runs over the release, ``dpproxy_release._kN`` standing for the N-th
key and ``dpproxy_release._dpN`` for the N-th released aggregate.

This module composes the two back into one reading and compares it with PostgreSQL's reading of
the statement (both with pglast): each GROUP BY key with the backend's, each output, the HAVING,
each ORDER BY item and the LIMIT and OFFSET, with each ``_kN`` read as the N-th GROUP BY key of
the backend SQL and each aggregate, in the statement and as ``_dpN``, by its kind, column and the conditions that choose its rows
(:func:`tests.parse_differential.canonical` reads a date part of a truncated time as the part of
the time only where the truncation keeps that part).

Only statements of one level are compared (a SELECT of one protected table, no CTE or enclosing
query), and only where dpproxy post-processes; an aggregate dpproxy computes from others (the
share ``avg(CASE WHEN p THEN 1 ELSE 0 END)``) is not compared.
"""

from __future__ import annotations

from typing import Any, Sequence

from rewriter.function_check import nodes_of
from tests.constant_values import AGGREGATES
from tests.parse_differential import Canon, Divergence, Same, alike, canonical, chosen_rows, conjuncts, read_columns, tree_of

__all__ = ["release_divergences"]

RELEASE = "dpproxy_release"
# Aggregates PostgreSQL defines as others
_SYNONYMS = {"stddev": "stddev_samp", "variance": "var_samp"}


def _name(parts: list[dict[str, Any]]) -> str:
    return str(parts[-1]["String"]["sval"]).lower()


def _one_level(select: dict[str, Any], table: str) -> bool:
    """Whether ``select`` reads only ``table``, itself, with no CTE and no set operation."""
    sources = select.get("fromClause", [])
    return (len(sources) == 1 and "RangeVar" in sources[0] and sources[0]["RangeVar"]["relname"] == table
            and "withClause" not in select and select.get("op", "SETOP_NONE") == "SETOP_NONE")


def _aggregate(call: dict[str, Any], boolean_columns: frozenset[str]) -> Canon | None:
    """An aggregate call of the statement by what dpproxy releases for it: its kind, its column (a
    conditional aggregate's column is its CASE's THEN; a sum of a constant or of a condition cast to
    integer is ``count(*)``) and the conjuncts of the conditions that choose its rows; None for a
    share (the AVG of a constant or a condition), which dpproxy computes from two counts."""
    name = _SYNONYMS.get(_name(call["funcname"]), _name(call["funcname"]))
    arguments = call.get("args") or [order["SortBy"]["node"] for order in call.get("agg_order") or []]
    if name in ("percentile_cont", "percentile_disc"):
        arguments = [order["SortBy"]["node"] for order in call.get("agg_order") or []]
    argument = arguments[-1] if arguments else None
    if argument is not None and "CaseExpr" in argument:
        argument = argument["CaseExpr"]["args"][0]["CaseWhen"]["result"]
    if argument is not None and "TypeCast" in argument and (
            "ColumnRef" not in argument["TypeCast"]["arg"] or read_columns(argument) <= boolean_columns):
        argument = None  # SUM((p)::int), SUM(b::int): the rows where p (b) holds, counted
    columns = sorted(read_columns(argument)) if argument is not None else []
    if name == "avg" and not columns:
        return None
    if name == "sum" and not columns:
        name = "count"
    chosen = tuple(part for node in chosen_rows(call, boolean_columns) for part in conjuncts(canonical(node)))
    return ("aggregate", name, columns[0] if columns else None, chosen)


def _released(kind: str, column: str | None, filter_sql: str | None) -> Canon:
    chosen = conjuncts(canonical(tree_of(f"SELECT 1 WHERE {filter_sql}")["SelectStmt"]["whereClause"])) \
        if filter_sql is not None else ()
    return ("aggregate", _SYNONYMS.get(kind, kind), column, chosen)


def _replaced(node: Any, tables: dict[str, Any], boolean_columns: frozenset[str]) -> Any:
    """``node`` (pglast JSON of the statement) with each aggregate call as :func:`_aggregate` reads
    it, a marker :func:`canonical` reads as that form (``tables["shares"]`` counts those it cannot)."""
    if isinstance(node, list):
        return [_replaced(item, tables, boolean_columns) for item in node]
    if not isinstance(node, dict):
        return node
    if "FuncCall" in node and _name(node["FuncCall"]["funcname"]) in AGGREGATES:
        read = _aggregate(node["FuncCall"], boolean_columns)
        if read is None:
            tables["shares"] += 1
            return {"A_Const": {"isnull": True}}
        return {"Released": read}
    return {key: _replaced(value, tables, boolean_columns) for key, value in node.items()}


def _composed(node: Any, keys: Sequence[Canon], released: Sequence[Canon]) -> Any:
    """``node`` (pglast JSON of the outer statement) with each ``_kN`` as the N-th key and each
    ``_dpN`` as the N-th released aggregate (markers :func:`canonical` reads as those forms)."""
    if isinstance(node, list):
        return [_composed(item, keys, released) for item in node]
    if not isinstance(node, dict):
        return node
    if "ColumnRef" in node:
        fields = [field.get("String", {}).get("sval") for field in node["ColumnRef"]["fields"]]
        if len(fields) == 2 and fields[0] == RELEASE and fields[1] and fields[1].startswith(("_k", "_dp")):
            index = int(fields[1].removeprefix("_k").removeprefix("_dp")) - 1
            return {"Released": keys[index] if fields[1].startswith("_k") else released[index]}
    return {key: _composed(value, keys, released) for key, value in node.items()}


def _range_stripped(key: Canon) -> Canon:
    """A backend key without the test around it: ``CASE WHEN <range> THEN key END`` (a time or bin
    key's range) or ``CASE WHEN <NaN> THEN NULL ELSE key END`` (a numeric bin's NaN)."""
    if isinstance(key, tuple) and key[:1] == ("CaseExpr",):
        fields = dict(key[1])
        whens = fields.get("args", ())
        if len(whens) == 1 and "defresult" not in fields:
            return _range_stripped(dict(whens[0][1])["result"])
        if len(whens) == 1 and dict(whens[0][1])["result"] == ("null",):
            return _range_stripped(fields["defresult"])
    return key


def _released_key(key: Canon) -> Canon:
    """What dpproxy releases of a backend key: the key, but of an epoch bucket's index
    ``floor(extract(epoch from t) / N)`` its start, ``* N`` (rewriter/epoch_buckets.py)."""
    if key[:2] == ("call", "floor") and key[2][0] == "args" and len(key[2][1]) == 1:
        quotient = key[2][1][0]
        if quotient[:3] == ("expr", "AEXPR_OP", "/") and quotient[3][:2] == ("call", "extract") \
                and quotient[3][2][1][0] == ("string", "epoch"):
            return ("expr", "AEXPR_OP", "*", key, quotient[4])
    return key


def _highest(outer: dict[str, Any], prefix: str) -> int:
    """The highest N of the release's columns ``<prefix>N`` that ``outer`` reads."""
    numbers = [int(name[len(prefix):]) for ref in nodes_of(outer, "ColumnRef") if len(ref["fields"]) == 2
               and (name := ref["fields"][1].get("String", {}).get("sval", "")).startswith(prefix)
               and name[len(prefix):].isdigit()]
    return max(numbers, default=0)


def _backend_keys(backend: dict[str, Any], table_columns: frozenset[str]) -> list[Canon] | None:
    """The GROUP BY keys of the backend SELECT that groups the table's rows, in order."""
    for select in nodes_of(backend, "SelectStmt"):
        keys = select.get("groupClause", [])
        if keys and all(read_columns(key) and read_columns(key) <= table_columns for key in keys):
            return [_released_key(_range_stripped(canonical(key))) for key in keys]
    return None


def _statement_keys(select: dict[str, Any]) -> list[dict[str, Any]]:
    """The statement's GROUP BY keys, an ordinal or an output name read as that output's expression."""
    targets = select.get("targetList", [])
    names = {target["ResTarget"].get("name"): target["ResTarget"]["val"] for target in targets}
    keys = []
    for key in select.get("groupClause", []):
        if "A_Const" in key and "ival" in key["A_Const"]:
            key = targets[int(key["A_Const"]["ival"].get("ival", 0)) - 1]["ResTarget"]["val"]
        elif "ColumnRef" in key and len(key["ColumnRef"]["fields"]) == 1:
            key = names.get(key["ColumnRef"]["fields"][0].get("String", {}).get("sval"), key)
        keys.append(key)
    return keys


def release_divergences(statement: str, backend: str, post: str,
                        released: Sequence[tuple[str, str | None, str | None]], table: str,
                        table_columns: frozenset[str], boolean_columns: frozenset[str] = frozenset(),
                        same: Same | None = None) -> list[Divergence]:
    """What the one-level DP statement ``statement`` computes from its aggregates and keys that
    dpproxy's outer statement ``post`` over the release of ``backend`` does not compute alike.

    ``released`` are the plan's aggregates in release order (kind, column, FILTER); ``table``,
    ``table_columns`` and ``boolean_columns`` the protected table's name, columns and boolean ones."""
    asked = tree_of(statement).get("SelectStmt", {})
    if not _one_level(asked, table):  # COPY (SELECT ...), a CTE, an enclosing query: not compared
        return []
    counted = {"shares": 0}
    replaced = _replaced(asked, counted, boolean_columns)
    if counted["shares"]:
        return []
    ran_tree = tree_of(backend)
    keys = _backend_keys(ran_tree, table_columns) if asked.get("groupClause") else []
    if keys is None:
        return [Divergence("GROUP BY", "the keys (no backend GROUP BY over the table)")]
    outer = tree_of(post)["SelectStmt"]
    if _highest(outer, "_k") > len(keys) or _highest(outer, "_dp") > len(released):
        return []  # keys the statement does not group by (SELECT DISTINCT): another shape
    composed = _composed(outer, keys, [_released(*aggregate) for aggregate in released])
    outputs = {canonical(target["ResTarget"]["val"]) for target in asked.get("targetList", [])}
    found = [Divergence("GROUP BY key", repr(canonical(key))) for key, ran in zip(_statement_keys(asked), keys)
             if canonical(key) not in outputs and not alike(canonical(key), ran, same)]  # an output's is below
    targets = [target for target in composed.get("targetList", [])
               if target["ResTarget"].get("name") != "dpproxy_cell"]
    pairs = [("output", target["ResTarget"]["val"], ran["ResTarget"]["val"])
             for target, ran in zip(replaced.get("targetList", []), targets)]
    if len(replaced.get("targetList", [])) != len(targets):
        found.append(Divergence("output", f"{len(replaced.get('targetList', []))} columns"))
    pairs.append(("HAVING", replaced.get("havingClause"), composed.get("whereClause")))
    pairs += [("ORDER BY", item, ran) for item, ran in zip(replaced.get("sortClause", []), composed.get("sortClause", []))]
    if len(replaced.get("sortClause", [])) != len(composed.get("sortClause", [])):
        found.append(Divergence("ORDER BY", f"{len(replaced.get('sortClause', []))} items"))
    pairs += [(clause, replaced.get(clause), composed.get(clause)) for clause in ("limitCount", "limitOffset")]
    for what, mine, theirs in pairs:
        if (mine is None) != (theirs is None) or (mine is not None and not alike(canonical(mine), canonical(theirs), same)):
            found.append(Divergence(what, repr(canonical(mine)) if mine is not None else "(none)"))
    return found
