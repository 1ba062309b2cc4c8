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

A statement of several levels is read level by level, as PostgreSQL reads it: each CTE read once
is the derived table it stands for; below the release level (the one with the aggregates), each
name a derived table outputs is read as its expression (``"source"."k0"`` as ``date_trunc('day',
t)``; a GROUP BY name an input column first, an ORDER BY name an output first), and each enclosing
level (``SELECT a * 2 FROM (SELECT count(*) AS a ...) AS q``) is compared with the outer statement's
level at the same depth, each name of the level below read as that level's output. A share
(``avg(CASE WHEN p THEN 1 ELSE 0 END)``) is read as dpproxy's division of the two counts it stands
for (rewriter/shares.py), their rows as PostgreSQL's AVG averages over; a percentile by its
fraction too (DESC applied). :func:`label_divergences` compares the labels dpproxy releases for a
category key's cells with the categories the backend's ``CASE`` numbers.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, NamedTuple, Sequence

from rewriter.function_check import nodes_of
from tests.constant_values import AGGREGATES
from tests.parse_differential import Canon, Divergence, Same, alike, canonical, chosen_rows, conjuncts, read_columns, tree_of

__all__ = ["Labelled", "Printed", "Released", "label_divergences", "mode_divergences", "plain_divergences",
           "release_divergences"]

RELEASE = "dpproxy_release"
# Aggregates PostgreSQL defines as others
_SYNONYMS = {"stddev": "stddev_samp", "variance": "var_samp"}


def _name(parts: list[dict[str, Any]]) -> str:
    return str(parts[-1]["String"]["sval"]).lower()


def _inlined(node: Any, ctes: dict[str, Any]) -> Any:
    """``node`` (pglast JSON) with each CTE it reads as the derived table it stands for
    (dpproxy answers only CTEs read once, rewriter/ctes.py)."""
    if isinstance(node, list):
        return [_inlined(item, ctes) for item in node]
    if not isinstance(node, dict):
        return node
    if "SelectStmt" in node and "withClause" in node["SelectStmt"]:
        select = dict(node["SelectStmt"])
        visible = dict(ctes)
        for cte in select.pop("withClause")["ctes"]:
            visible[cte["CommonTableExpr"]["ctename"]] = _inlined(cte["CommonTableExpr"]["ctequery"], visible)
        return {"SelectStmt": _inlined(select, visible)}
    if "RangeVar" in node and "schemaname" not in node["RangeVar"] and node["RangeVar"]["relname"] in ctes:
        name = node["RangeVar"].get("alias", {}).get("aliasname", node["RangeVar"]["relname"])
        return {"RangeSubselect": {"subquery": ctes[node["RangeVar"]["relname"]], "alias": {"aliasname": name}}}
    return {key: _inlined(value, ctes) for key, value in node.items()}


def _select(statement: str) -> dict[str, Any]:
    """The SELECT of ``statement`` (of ``COPY (SELECT ...) TO``), each CTE it reads inlined."""
    tree = tree_of(statement)
    return dict(_inlined(tree["CopyStmt"]["query"] if "CopyStmt" in tree else tree, {})["SelectStmt"])


def _levels(select: dict[str, Any]) -> list[dict[str, Any]]:
    """``select`` and the levels below it, each the one derived table the level above reads, each
    output named as PostgreSQL names it (:func:`_output_name`)."""
    levels = [_named(select)]
    while len(sources := levels[-1].get("fromClause", [])) == 1 and "RangeSubselect" in sources[0]:
        levels.append(_named(sources[0]["RangeSubselect"]["subquery"]["SelectStmt"]))
    return levels


def _named(select: dict[str, Any]) -> dict[str, Any]:
    """``select`` with each output that has a name but no alias given its name as one, which it
    keeps once its expression is read otherwise."""
    targets = [{"ResTarget": {**target["ResTarget"], "name": name}} if (name := _output_name(target)) is not None
               else target for target in select.get("targetList", [])]
    return {**select, "targetList": targets} if "targetList" in select else select


def _output_name(target: dict[str, Any]) -> str | None:
    """The name of an output (a ``ResTarget``): its alias, else its column's or its function's, as
    PostgreSQL names it (None for another expression, which no name here reads)."""
    value = target["ResTarget"]["val"]
    if "name" in target["ResTarget"]:
        return str(target["ResTarget"]["name"])
    if "ColumnRef" in value and "String" in value["ColumnRef"]["fields"][-1]:
        return str(value["ColumnRef"]["fields"][-1]["String"]["sval"])
    return _name(value["FuncCall"]["funcname"]) if "FuncCall" in value else None


def _outputs(select: dict[str, Any]) -> dict[str, Any]:
    """Each output name of ``select`` (:func:`_output_name`) to its expression (the first's)."""
    named: dict[str, Any] = {}
    for target in select.get("targetList", []):
        name = _output_name(target)
        if name is not None:
            named.setdefault(name, target["ResTarget"]["val"])
    return named


def _substituted(node: Any, names: dict[str, Any]) -> Any:
    """``node`` with each column reference to one of ``names`` as its expression."""
    if isinstance(node, list):
        return [_substituted(item, names) for item in node]
    if not isinstance(node, dict):
        return node
    if "ColumnRef" in node and "String" in node["ColumnRef"]["fields"][-1] \
            and node["ColumnRef"]["fields"][-1]["String"]["sval"] in names:
        return names[node["ColumnRef"]["fields"][-1]["String"]["sval"]]
    if "SelectStmt" in node:  # a nested statement reads its own names
        return node
    return {key: _substituted(value, names) for key, value in node.items()}


def _read_through(select: dict[str, Any], below: dict[str, Any] | None) -> dict[str, Any]:
    """``select`` with each name of the level ``below`` it read as that level's output: in its
    outputs, WHERE, GROUP BY and HAVING, and in ORDER BY but for a bare name that is an output of
    its own (PostgreSQL reads that as the output; a qualified one as the column below)."""
    if below is None:
        return select
    names = _outputs(below)
    read = {key: _substituted(value, names) if key in _CLAUSES else value for key, value in select.items()}
    if "sortClause" in select:
        own = _outputs(select).keys()
        read["sortClause"] = [order if "ColumnRef" in order["SortBy"]["node"]
                              and len(order["SortBy"]["node"]["ColumnRef"]["fields"]) == 1
                              and order["SortBy"]["node"]["ColumnRef"]["fields"][0].get("String", {}).get("sval") in own
                              else _substituted(order, names) for order in select["sortClause"]]
    return read


def _ordered_by_outputs(select: dict[str, Any]) -> dict[str, Any]:
    """``select`` with each ORDER BY item that is a bare name of its outputs read as that output's
    expression, as PostgreSQL reads it (two outputs of that name and of other expressions:
    ambiguous, its 42702)."""
    if "sortClause" not in select:
        return select
    outputs: dict[str, list[Any]] = {}
    for target in select.get("targetList", []):
        name = _output_name(target)
        if name is not None:
            outputs.setdefault(name, []).append(target["ResTarget"]["val"])
    sort = []
    for order in select["sortClause"]:
        node = order["SortBy"]["node"]
        name = node["ColumnRef"]["fields"][0].get("String", {}).get("sval") \
            if "ColumnRef" in node and len(node["ColumnRef"]["fields"]) == 1 else None
        if name in outputs:
            values = outputs[name]
            alike_all = len({repr(canonical(value)) for value in values}) == 1
            read = values[0] if alike_all else {"Released": ("ambiguous", name)}
            order = {"SortBy": {**order["SortBy"], "node": read}}
        sort.append(order)
    return {**select, "sortClause": sort}


def _unresolved(node: Any) -> Any:
    """``node`` (the outer statement's release level) with each column reference left, which no
    input column of the release has (PostgreSQL's 42703 there), marked as such."""
    if isinstance(node, list):
        return [_unresolved(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "ColumnRef" in node:
        return {"Released": ("unresolved", repr(canonical(node)))}
    return {key: _unresolved(value) for key, value in node.items()}


_CLAUSES = ("targetList", "whereClause", "groupClause", "havingClause", "limitCount", "limitOffset")


def _release_level(levels: list[dict[str, Any]], table: str) -> dict[str, Any] | None:
    """The lowest of ``levels`` read through the ones below it, which must end at ``table``."""
    last = levels[-1].get("fromClause", [])
    if len(last) != 1 or "RangeVar" not in last[0] or last[0]["RangeVar"]["relname"] != table:
        return None
    read = None
    for level in reversed(levels):
        read = _read_through(level, read)
    return read


def _aggregate(call: dict[str, Any], boolean_columns: frozenset[str]) -> Canon | None:
    """An aggregate call of the statement by what dpproxy releases for it: its kind, its column (a
    conditional aggregate's column is its CASE's THEN; a sum of a constant or of a condition cast to
    integer is ``count(*)``), the conjuncts of the conditions that choose its rows and a percentile's
    fraction; a share (the AVG of an indicator) as :func:`_share`; None for another AVG of no column."""
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
        return _share(call, boolean_columns)
    if name == "sum" and not columns:
        name = "count"
    chosen = tuple(part for node in chosen_rows(call, boolean_columns) for part in conjuncts(canonical(node)))
    return ("aggregate", name, columns[0] if columns else None, chosen, _fraction(call), bool(call.get("agg_distinct")))


def _fraction(call: dict[str, Any]) -> str | None:
    """A percentile's fraction as :func:`_released` writes the plan's: ``1/4``, ``1/4,1/2`` (an
    array), ``$1`` (a parameter), each read as 1 − p under DESC; None for another aggregate."""
    if _name(call["funcname"]) not in ("percentile_cont", "percentile_disc") or not call.get("args"):
        return None
    desc = any(order["SortBy"].get("sortby_dir") == "SORTBY_DESC" for order in call.get("agg_order") or [])
    argument = call["args"][0]
    if "ParamRef" in argument:
        return f"{'1-' if desc else ''}${argument['ParamRef'].get('number', 0)}"
    values = argument["A_ArrayExpr"]["elements"] if "A_ArrayExpr" in argument else [argument]
    fractions = []
    for value in values:
        number = canonical(value)
        while number[:1] == ("value",) or (number[:1] == ("cast",) and number[1] in _EXACT):
            number = number[2]  # +0.5, 0.5::numeric: the number 0.5
        if number[:1] != ("number",):
            return "?" + repr(number)  # a form :func:`_fraction` does not read: reported
        fraction = Fraction(Decimal(number[1]))
        fractions.append(str(1 - fraction if desc else fraction))
    return ",".join(fractions)


# Types a fraction's number may be cast to without changing what the percentile reads
_EXACT = frozenset({"numeric", "float8"})  # percentile_cont reads its fraction as a float8 anyway
# dpproxy's share of rows n of d (rewriter/shares.py), ``n`` and ``d`` standing for the two counts
_SHARE = tree_of("SELECT CAST(GREATEST(0, LEAST(n, GREATEST(d, 1))) AS numeric) / GREATEST(d, 1)")["SelectStmt"][
    "targetList"][0]["ResTarget"]["val"]
_ONE, _ZERO = frozenset({("number", "1")}), frozenset({("number", "0")})


def _share(call: dict[str, Any], boolean_columns: frozenset[str]) -> Canon | None:
    """``AVG(CASE WHEN p THEN 1 ELSE 0 END)``, ``AVG(CASE WHEN p THEN 1 WHEN NOT p THEN 0 [ELSE NULL] END)`` or
    ``AVG((p)::int)``, with ``FILTER (WHERE q)``, as dpproxy's division of n by d (:data:`_SHARE`):
    n the rows where q and p hold, d those PostgreSQL's AVG averages over (where q holds; and p is
    not NULL, but for the ELSE 0 form, whose indicator is 0 there). None for another AVG."""
    argument = (call.get("args") or [{}])[0]
    condition: dict[str, Any] | None = None
    known = True  # whether d counts only the rows where p is not NULL
    if "TypeCast" in argument and _name(argument["TypeCast"]["typeName"]["names"]) in ("int4", "int"):
        condition = argument["TypeCast"]["arg"]
    elif "CaseExpr" in argument and "arg" not in argument["CaseExpr"]:
        whens = [when["CaseWhen"] for when in argument["CaseExpr"]["args"]]
        otherwise = argument["CaseExpr"].get("defresult")
        if canonical(whens[0]["result"]) not in _ONE:
            return None
        if len(whens) == 1 and otherwise is not None and canonical(otherwise) in _ZERO:
            condition, known = whens[0]["expr"], False
        elif len(whens) == 2 and (otherwise is None or canonical(otherwise) == ("null",)) \
                and canonical(whens[1]["result"]) in _ZERO \
                and canonical(whens[1]["expr"]) == ("bool", "NOT_EXPR", (canonical(whens[0]["expr"]),)):
            condition = whens[0]["expr"]
    if condition is None:
        return None
    rows = conjuncts(canonical(call["agg_filter"])) if "agg_filter" in call else ()
    held = canonical(condition)
    numerator = ("aggregate", "count", None, rows + conjuncts(held), None, False)
    denominator = ("aggregate", "count", None, rows + ((("bool", "OR_EXPR", (held, ("bool", "NOT_EXPR", (held,)))),)
                                                       if known else ()), None, False)
    return canonical(_composed(_SHARE, (), (), {"n": numerator, "d": denominator}))


class Released(NamedTuple):
    """One aggregate a plan releases, as :func:`_released` compares it with the statement's."""

    kind: str
    column: str | None
    filter_sql: str | None
    fraction: str | None  # a percentile's, as :func:`_fraction` writes it
    distinct: bool = False


def _released(aggregate: Released) -> Canon:
    """A released aggregate of the plan (its kind, column, FILTER, percentile fraction and
    DISTINCT) as :func:`_aggregate` reads the statement's."""
    chosen = conjuncts(canonical(tree_of(f"SELECT 1 WHERE {aggregate.filter_sql}")["SelectStmt"]["whereClause"])) \
        if aggregate.filter_sql is not None else ()
    return ("aggregate", _SYNONYMS.get(aggregate.kind, aggregate.kind), aggregate.column, chosen, aggregate.fraction,
            aggregate.distinct)


def _replaced(node: Any, tables: dict[str, Any], boolean_columns: frozenset[str]) -> Any:
    """``node`` (pglast JSON of the statement) with each aggregate call as :func:`_aggregate` reads
    it, a marker :func:`canonical` reads as that form (``tables["unread"]`` counts those it cannot)."""
    if isinstance(node, list):
        return [_replaced(item, tables, boolean_columns) for item in node]
    if not isinstance(node, dict):
        return node
    if "FuncCall" in node and _name(node["FuncCall"]["funcname"]) in AGGREGATES:
        read = _aggregate(node["FuncCall"], boolean_columns)
        if read is None:
            tables["unread"] += 1
            return {"A_Const": {"isnull": True}}
        return {"Released": read}
    return {key: _replaced(value, tables, boolean_columns) for key, value in node.items()}


def _composed(node: Any, keys: Sequence[Canon], released: Sequence[Canon], named: dict[str, Canon] | None = None) -> Any:
    """``node`` (pglast JSON of the outer statement) with each ``_kN`` as the N-th key and each
    ``_dpN`` as the N-th released aggregate (markers :func:`canonical` reads as those forms), and
    each column of ``named`` as its form."""
    if isinstance(node, list):
        return [_composed(item, keys, released, named) for item in node]
    if not isinstance(node, dict):
        return node
    if "ColumnRef" in node:
        fields = [field.get("String", {}).get("sval") for field in node["ColumnRef"]["fields"]]
        if len(fields) == 2 and fields[0] == RELEASE and fields[1] and fields[1].startswith(("_k", "_dp")):
            index = int(fields[1].removeprefix("_k").removeprefix("_dp")) - 1
            return {"Released": keys[index] if fields[1].startswith("_k") else released[index]}
        if named and len(fields) == 1 and fields[0] in named:
            return {"Released": named[fields[0]]}
    return {key: _composed(value, keys, released, named) for key, value in node.items()}


def _range_stripped(key: Canon) -> Canon:
    """A backend key without the test around it: ``CASE WHEN <range> THEN key END`` (a time or bin
    key's range) or ``CASE WHEN <NaN> THEN NULL ELSE key END`` (a numeric bin's NaN); a category
    key's cell, ``CASE WHEN col = 'a' THEN 0 WHEN col = 'b' THEN 1 [ELSE 2] END`` (the backend
    groups each row by its cell), read as ``col``: it groups the declared categories apart as
    ``col`` does, and the cells' labels are compared on their own (:func:`label_divergences`)."""
    if isinstance(key, tuple) and key[:1] == ("CaseExpr",):
        fields = dict(key[1])
        whens = fields.get("args", ())
        cell_column = _numbered_column(whens, fields.get("defresult"))
        if cell_column is not None:
            return cell_column
        if len(whens) == 1 and "defresult" not in fields:
            return _range_stripped(dict(whens[0][1])["result"])
        if len(whens) == 1 and dict(whens[0][1])["result"] == ("null",):
            return _range_stripped(fields["defresult"])
    if isinstance(key, tuple) and key[:2] == ("cast", "int8"):
        # a floor bin's index, grouped as an int8 within the bins' range: the same whole number
        inner = _range_stripped(key[2])
        if inner[:2] == ("call", "floor"):
            return inner
    return key


def _numbered_column(whens: Sequence[Canon], other: Canon | None) -> Canon | None:
    """``("column", col)`` where ``whens`` (a CASE's, canonical) number the strings ``col`` equals,
    each a number of its own (and ``other``, an ELSE, another number); else None."""
    tests = [dict(when[1]) for when in whens]
    if not tests or not all(test["expr"][:3] == ("expr", "AEXPR_OP", "=") and test["expr"][3][:1] == ("column",)
                            and test["expr"][4][:1] == ("string",) and test["result"][:1] == ("number",)
                            for test in tests):
        return None
    numbers = [test["result"] for test in tests] + ([other] if other is not None else [])
    columns = {test["expr"][3] for test in tests}
    if len(columns) != 1 or len(set(numbers)) != len(numbers) or (other is not None and other[:1] != ("number",)):
        return None
    return columns.pop()


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


def _reads_release(select: dict[str, Any]) -> bool:
    """Whether ``select`` (a level of the outer statement) reads the release itself."""
    return any(source.get("RangeSubselect", {}).get("alias", {}).get("aliasname") == RELEASE
               for source in select.get("fromClause", []))


def _compared(what: str, mine: Any, theirs: Any, same: Same | None) -> list[Divergence]:
    """``mine`` (a clause of the statement) against ``theirs`` (the outer statement's), both maybe None."""
    if (mine is None) != (theirs is None) or (mine is not None and not alike(canonical(mine), canonical(theirs), same)):
        return [Divergence(what, repr(canonical(mine)) if mine is not None else "(none)")]
    return []


def _level_divergences(mine: dict[str, Any], theirs: dict[str, Any], where: str, same: Same | None) -> list[Divergence]:
    """A level's outputs, ``where`` (its WHERE, or at the release level its HAVING, which the outer
    statement's WHERE is), ORDER BY, LIMIT and OFFSET against the outer statement's level."""
    targets = [target for target in theirs.get("targetList", []) if target["ResTarget"].get("name") != "dpproxy_cell"]
    found = [item for target, ran in zip(mine.get("targetList", []), targets)
             for item in _compared("output", target["ResTarget"]["val"], ran["ResTarget"]["val"], same)]
    if len(mine.get("targetList", [])) != len(targets):
        found.append(Divergence("output", f"{len(mine.get('targetList', []))} columns"))
    found += _compared("HAVING" if where == "havingClause" else "WHERE", mine.get(where), theirs.get("whereClause"), same)
    found += [item for order, ran in zip(mine.get("sortClause", []), theirs.get("sortClause", []))
              for item in _compared("ORDER BY", order, ran, same)]
    if len(mine.get("sortClause", [])) != len(theirs.get("sortClause", [])):
        found.append(Divergence("ORDER BY", f"{len(mine.get('sortClause', []))} items"))
    for clause in ("limitCount", "limitOffset"):
        found += _compared(clause, mine.get(clause), theirs.get(clause), same)
    found += _compared("DISTINCT", _distinct(mine), _distinct(theirs), same)
    return found


def _distinct(select: dict[str, Any]) -> dict[str, Any] | None:
    """A level's DISTINCT (its ON expressions) as a node :func:`_compared` reads; None without one."""
    return {"List": {"items": select["distinctClause"]}} if "distinctClause" in select else None


def release_divergences(statement: str, backend: str, post: str,
                        released: Sequence[Released], table: str,
                        table_columns: frozenset[str], boolean_columns: frozenset[str] = frozenset(),
                        same: Same | None = None, reached: Counter[str] | None = None) -> list[Divergence]:
    """What the DP statement ``statement`` computes from its aggregates and keys that dpproxy's
    outer statement ``post`` over the release of ``backend`` does not compute alike, level by level.

    ``released`` are the plan's aggregates in release order; ``table``, ``table_columns`` and
    ``boolean_columns`` the protected table's name, columns and boolean ones. ``reached`` counts the
    levels compared, and the statements this cannot compare (``skipped: ...``)."""
    reached = Counter() if reached is None else reached
    asked = _select(statement)
    theirs = _levels(tree_of(post)["SelectStmt"])
    depth = next((index for index, level in enumerate(theirs) if _reads_release(level)), None)
    mine = _levels(asked)
    level = _release_level(mine[depth:], table) if depth is not None and depth < len(mine) else None
    if depth is None or level is None:
        return [Divergence("level", f"the release level (the outer statement's {depth}, "
                                    f"the statement's of {len(mine)})")]
    counted = {"unread": 0}
    level = _distinct_as_grouped(level)
    replaced = _replaced(level, counted, boolean_columns)
    if counted["unread"]:
        reached["skipped: an aggregate not read"] += 1
        return []
    keys = _backend_keys(tree_of(backend), table_columns) if level.get("groupClause") else []
    if keys is None:
        return [Divergence("GROUP BY", "the keys (no backend GROUP BY over the table)")]
    if _highest(theirs[depth], "_k") > len(keys) or _highest(theirs[depth], "_dp") > len(released):
        return [Divergence("GROUP BY", "the keys (the outer statement reads more keys or aggregates than released)")]
    reached["release level"] += 1
    reached["DISTINCT"] += "distinctClause" in _select(statement) or any("distinctClause" in mine_level for mine_level in mine)
    reached["enclosing level"] += depth
    composed = _composed(theirs[depth], keys, [_released(aggregate) for aggregate in released])
    composed = _unresolved(_ordered_by_outputs(composed))
    outputs = {canonical(target["ResTarget"]["val"]) for target in level.get("targetList", [])}
    found = [Divergence("GROUP BY key", repr(canonical(key))) for key, ran in zip(_statement_keys(level), keys)
             if canonical(key) not in outputs and not alike(canonical(key), ran, same)]  # an output's is below
    replaced = _ordered_by_outputs(replaced)
    found += _level_divergences(replaced, composed, "havingClause", same)
    for index in range(depth - 1, -1, -1):  # the enclosing levels, each over the one below
        replaced = _ordered_by_outputs(_read_through(mine[index], replaced))
        composed = _ordered_by_outputs(_read_through(theirs[index], composed))
        found += [Divergence(f"level {index}: {item.what}", item.read)
                  for item in _level_divergences(replaced, composed, "whereClause", same)]
    return found


class Labelled(NamedTuple):
    """What dpproxy releases for a column's categories (a category key's cells, a MODE's answer):
    the column, its type as ``format_type`` writes it, and the labels, in the policy's order."""

    column: str
    type_name: str
    labels: tuple[str, ...]


# A declared category read as a value of a type and printed as PostgreSQL prints it
# (tests.constant_values.ConstantEvaluator.printed)
Printed = Callable[[str, str], str]


def _as_printed(value: str, type_name: str, printed: Printed | None) -> str:
    return printed(value, type_name) if printed is not None else value


def _distinct_as_grouped(select: dict[str, Any]) -> dict[str, Any]:
    """``select`` (a release level), if a ``SELECT DISTINCT`` of no aggregate and no GROUP BY, as
    PostgreSQL reads it: grouped by its outputs (``SELECT DISTINCT a, b`` is ``... GROUP BY a, b``),
    its DISTINCT then asking nothing more; else ``select`` as it is (``DISTINCT ON`` too)."""
    distinct = select.get("distinctClause")
    if not distinct or any(distinct) or "groupClause" in select or "havingClause" in select \
            or any(_name(call["funcname"]) in AGGREGATES for call in nodes_of(select.get("targetList", []), "FuncCall")):
        return select
    grouped = {key: value for key, value in select.items() if key != "distinctClause"}
    return {**grouped, "groupClause": [target["ResTarget"]["val"] for target in select.get("targetList", [])]}


def label_divergences(backend: str, labels: Sequence[Labelled | None], printed: Printed | None = None) -> list[Divergence]:
    """Where the labels dpproxy releases for a category key's cells (``labels``, per GROUP BY key in
    order; None for another kind of key) are not the categories the backend's cell numbers stand
    for, as PostgreSQL prints a value of the column equal to each (``printed``; without it, as
    written): ``CASE WHEN col = 'Male' THEN 0 WHEN col = 'Female' THEN 1 [ELSE 2] END AS kN``, whose
    cell i must be released as the i-th label (the ELSE's as the last, the policy's ``other``, which
    dpproxy adds on purpose: PostgreSQL has no such row)."""
    found = []
    targets = {target["name"]: target["val"] for target in nodes_of(tree_of(backend), "ResTarget")
               if target.get("name") and "val" in target}
    for index, key in enumerate(labels):
        if key is None:
            continue
        case, compared = _cell_case(targets, index, key.column)
        if case is None:
            found.append(Divergence("category key", f"k{index} (no CASE numbers its cells)"))
            continue
        numbered = {}
        for when in case.get("args", []):
            test, cell = canonical(when["CaseWhen"]["expr"]), canonical(when["CaseWhen"]["result"])
            if test[:3] != ("expr", "AEXPR_OP", "=") or test[3] != ("column", compared) or test[4][:1] != ("string",) \
                    or cell[:1] != ("number",):
                found.append(Divergence("category key", f"k{index}: {test!r} -> {cell!r}"))
                continue
            numbered[int(cell[1])] = _as_printed(test[4][1], key.type_name, printed)
        if "defresult" in case:
            numbered[int(canonical(case["defresult"])[1])] = key.labels[-1]
        if numbered != dict(enumerate(key.labels)):
            found.append(Divergence("category key", f"k{index}: cells {numbered!r}, released as {key.labels!r}"))
    return found


def _cell_case(targets: dict[str, dict[str, Any]], index: int, column: str) -> tuple[dict[str, Any] | None, str]:
    """The CASE that numbers key ``index``'s cells, and the column its tests compare: ``kN`` itself
    (tests on ``column``); or, where the backend groups each row by its cell (``group_sql``),
    ``kN`` is the group's ``vN`` and the CASE is ``vN``'s, on ``column``; or, for a long list of
    categories, ``kN`` numbers ``vN``, the row's value where it equals a category (a CASE over
    ``column``), by comparing ``vN``."""
    cell, group = targets.get(f"k{index}", {}), targets.get(f"v{index}", {})
    if "CaseExpr" in cell:
        on_group = "CaseExpr" in group and any(
            canonical(ref) == ("column", column) for ref in nodes_of(group, "ColumnRef"))
        return cell["CaseExpr"], f"v{index}" if on_group else column
    if "ColumnRef" in cell and canonical(cell) == ("column", f"v{index}") and "CaseExpr" in group:
        return group["CaseExpr"], column
    return None, column


def mode_divergences(backend: str, modes: Sequence[Labelled], printed: Printed | None = None) -> list[Divergence]:
    """Where a MODE's answer would not be the category PostgreSQL prints: each MODE of ``modes`` (in
    release order) counts the rows of each category in the backend, ``count(*) FILTER (WHERE ... AND
    col = 'Male')``, one run per MODE, and releases the i-th label for the run's i-th count. Each
    run's categories, printed as PostgreSQL prints a value of the column equal to each (``printed``),
    must be the labels, in order, and each MODE must have its run."""
    runs: list[tuple[str, list[str]]] = []
    for call in sorted(nodes_of(tree_of(backend), "FuncCall"), key=lambda call: int(call.get("location", 0))):
        last = conjuncts(canonical(call["agg_filter"]))[-1] if "agg_filter" in call else None
        if last is None or last[:3] != ("expr", "AEXPR_OP", "=") or last[3][:1] != ("column",) \
                or last[4][:1] != ("string",) or not any(mode.column == last[3][1] for mode in modes):
            continue
        column, value = last[3][1], last[4][1]
        if runs and runs[-1][0] == column and value not in runs[-1][1]:
            runs[-1][1].append(value)
        else:
            runs.append((column, [value]))
    found = []
    for mode in modes:
        run = next((index for index, (column, _) in enumerate(runs) if column == mode.column), None)
        if run is None:
            found.append(Divergence("MODE", f"{mode.column} (no backend count per category)"))
            continue
        _, values = runs.pop(run)
        released = [_as_printed(value, mode.type_name, printed) for value in values]
        if released != list(mode.labels):
            found.append(Divergence("MODE", f"{mode.column}: counts of {released!r}, released as {mode.labels!r}"))
    return found


def plain_divergences(statement: str, released: Sequence[Released], table: str,
                      boolean_columns: frozenset[str] = frozenset(), same: Same | None = None,
                      no_rows: bool = False) -> list[Divergence]:
    """What a statement dpproxy answers without post-processing (each output an aggregate, released
    as it is, in order) asks of its aggregates that ``released``, the plan's, does not release: a
    kind, column, condition or percentile fraction of another (or another number of outputs); and
    whether its LIMIT/OFFSET leave its one row where dpproxy answers none (``no_rows``) or the reverse."""
    level = _release_level(_levels(_select(statement)), table)
    if level is None:
        return [Divergence("level", "the release level (a statement answered as it is)")]
    found = []
    rows = _rows_left(level)
    if rows is None or (rows == 0) != no_rows:
        found.append(Divergence("LIMIT/OFFSET", f"{rows if rows is not None else 'an unread count of'} rows left, "
                                                f"{'none' if no_rows else 'the row'} answered"))
    targets = level.get("targetList", [])
    for target, aggregate in zip(targets, released):
        value = target["ResTarget"]["val"]
        mine = _aggregate(value["FuncCall"], boolean_columns) if "FuncCall" in value else None
        if mine is None or not alike(mine, _released(aggregate), same):
            found.append(Divergence("aggregate", repr(mine if mine is not None else canonical(value))))
    if len(targets) != len(released):
        found.append(Divergence("aggregate", f"{len(targets)} outputs, {len(released)} released"))
    return found


def _rows_left(select: dict[str, Any]) -> int | None:
    """How many rows of one aggregate row PostgreSQL returns under ``select``'s LIMIT (FETCH FIRST) and
    OFFSET (``LIMIT ALL`` and ``LIMIT NULL`` none); None where a count is no integer constant."""
    counts = []
    for clause in ("limitCount", "limitOffset"):
        node = select.get(clause)
        value = canonical(node) if node is not None else ("null",)
        while value[:1] == ("value",):
            value = value[2]
        if value == ("null",):
            counts.append(None)
        elif value[:1] == ("number",) and Decimal(value[1]) == int(Decimal(value[1])) >= 0:
            counts.append(int(Decimal(value[1])))
        else:
            return None
    limit, offset = counts
    left = max(0, 1 - (offset or 0))
    return left if limit is None else min(left, limit)
