"""The release differential for a series limit (rewriter/series_limit.py): its two statements read
apart, as PostgreSQL reads them (tests/release_differential.py, tests/parse_differential.py).

dpproxy answers Superset's series limit::

    SELECT sex, date_trunc('month', t) AS m, count(*) FROM people
    JOIN (SELECT sex AS sex__ FROM people WHERE <R> GROUP BY sex ORDER BY count(*) DESC LIMIT 5) AS series_limit
    ON sex = sex__ WHERE <W> GROUP BY sex, m

as two releases: the *ranking*, the subquery with its own WHERE, ORDER BY and LIMIT, and the
*restricted* statement, the statement without its join, whose cells are kept where their join keys
are those of a cell the ranking kept. So the check reads the subquery and the statement without
the join as two statements, each compared with its own backend SQL and outer statement (a
condition of one level answered at the other is reported, which one pooled set of conjuncts
missed), and the join's ON as the pairs of keys the plan keeps cells by: each conjunct an equality
of a column the statement groups by and an output of the subquery it groups by.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import pglast
from pglast.stream import RawStream

from tests.parse_differential import Divergence, canonical, tree_of
from tests.release_differential import _outputs, _statement_keys

__all__ = ["SeriesParts", "pair_divergences", "series_parts"]


class SeriesParts(NamedTuple):
    """A series limit's statement read as PostgreSQL reads it, in two: the subquery that ranks the
    series and the statement without its join, each as SQL; and the join's key pairs (:func:`_pairs`)."""

    ranking: str
    restricted: str
    pairs: frozenset[tuple[int, int]] | None


def series_parts(statement: str) -> SeriesParts | None:
    """``statement``'s two parts, or None where it is not a table joined to one subquery."""
    select = pglast.parse_sql(statement)[0].stmt
    sources = getattr(select, "fromClause", None) or ()
    if len(sources) != 1 or not isinstance(sources[0], pglast.ast.JoinExpr):
        return None
    join = sources[0]
    ranked = join.rarg if isinstance(join.rarg, pglast.ast.RangeSubselect) else join.larg
    table = join.larg if ranked is join.rarg else join.rarg
    if not isinstance(ranked, pglast.ast.RangeSubselect) or not isinstance(table, pglast.ast.RangeVar):
        return None
    restricted = copy.deepcopy(select)
    restricted.fromClause = (table,)
    tree = tree_of(statement)["SelectStmt"]
    return SeriesParts(RawStream()(ranked.subquery), RawStream()(restricted), _pairs(tree, tree_of(RawStream()(ranked.subquery))))


def _pairs(select: dict[str, Any], ranking: dict[str, Any]) -> frozenset[tuple[int, int]] | None:
    """Each ON conjunct of ``select``'s join (pglast JSON) as (the position of the statement's GROUP
    BY key that is its table side, the position of the subquery's GROUP BY key that its subquery
    side's output is); None where one is no equality of such a key and output."""
    join = select["fromClause"][0]["JoinExpr"]
    subquery = next(side for side in (join["larg"], join["rarg"]) if "RangeSubselect" in side)["RangeSubselect"]
    alias = subquery["alias"]["aliasname"]
    outputs = _outputs(ranking["SelectStmt"])
    quals = join.get("quals", {})
    conditions = quals["BoolExpr"]["args"] if quals.get("BoolExpr", {}).get("boolop") == "AND_EXPR" else [quals]
    keys = [canonical(key) for key in _statement_keys(select)]
    ranked = [canonical(key) for key in _statement_keys(ranking["SelectStmt"])]
    pairs = set()
    for condition in conditions:
        expression = condition.get("A_Expr", {})
        if expression.get("kind") != "AEXPR_OP" or [part["String"]["sval"] for part in expression["name"]] not in (
                ["="], ["pg_catalog", "="]):
            return None
        sides = [_field_names(expression.get("lexpr", {})), _field_names(expression.get("rexpr", {}))]
        if any(side is None for side in sides):
            return None
        inner = [index for index, side in enumerate(sides) if side is not None and _names_output(side, alias, outputs)]
        if len(inner) != 1:
            return None
        output, column = sides[inner[0]], sides[1 - inner[0]]
        assert output is not None and column is not None
        own = ("column", column[-1])
        theirs = canonical(outputs[output[-1]])
        if len(column) > 1 and column[0] == alias or own not in keys or theirs not in ranked:
            return None
        pairs.add((keys.index(own), ranked.index(theirs)))
    return frozenset(pairs)


def _field_names(node: dict[str, Any]) -> list[str] | None:
    """The names of a column reference, None for another expression."""
    if "ColumnRef" not in node or not all("String" in field for field in node["ColumnRef"]["fields"]):
        return None
    return [field["String"]["sval"] for field in node["ColumnRef"]["fields"]]


def _names_output(names: list[str], alias: str, outputs: dict[str, Any]) -> bool:
    """Whether ``names`` reads an output of the subquery ``alias``: qualified by it, or an output's bare name."""
    return names[-1] in outputs and (names[0] == alias if len(names) > 1 else True)


def pair_divergences(parts: SeriesParts, pairs: tuple[tuple[int, int], ...]) -> list[Divergence]:
    """Where the plan keeps the restricted statement's cells by other key pairs (``pairs``: the
    restricted plan's key, the ranking's key) than the join's ON reads."""
    if parts.pairs is None:
        return [Divergence("series limit ON", "a conjunct that is no equality of a grouped key and a ranked output")]
    if parts.pairs != frozenset(pairs):
        return [Divergence("series limit ON", f"pairs {sorted(parts.pairs)}, kept by {sorted(pairs)}")]
    return []
