"""connectorx's partitioned reads, refused on a protected table before anything is charged.

With ``partition_on`` (polars' ``read_database_uri(..., partition_on=col, partition_num=n)``,
``connectorx.read_sql(..., partition_on=...)``) connectorx wraps the analyst's query twice:
``SELECT min(t.col), max(t.col) FROM (query) AS CXTMPTAB_RANGE`` to learn the column's range,
then ``SELECT * FROM (query) AS CXTMPTAB_PART WHERE lo <= t.col AND t.col < hi`` once per
range, each read with ``COPY ... TO STDOUT WITH BINARY``. Over a row read the ranges would be
refused anyway (no-row-access), but only after the range query, itself a DP MIN/MAX, had
been charged; over an aggregate there is one row (or one per declared key) and nothing to
split, while each range would be a DP query of its own. Both wrappers are refused by their
alias, with a hint to read without partitioning. connectorx's row count for pandas
(``... AS CXTMPTAB_COUNT``) is a plain count over the query's answer and stays answered.
"""

from __future__ import annotations

from typing import Any

from policies.errors import SQLSTATE, Refusal
from policies.tables import Relation

__all__ = ["refuse_partitioned_read"]

_ALIASES = frozenset({"cxtmptab_range", "cxtmptab_part"})


def refuse_partitioned_read(node: dict[str, Any], relation: Relation) -> None:
    """Raise Refusal if the SELECT ``node`` reads from a subquery aliased as connectorx's
    partitioned read does (module docstring); return otherwise."""
    for item in node.get("fromClause") or []:
        alias = item.get("RangeSubselect", {}).get("alias", {}).get("aliasname", "")
        if alias.lower() in _ALIASES:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"a partitioned read (connectorx's partition_on) is not allowed on protected table "
                f"{relation.display_name} (rule: partitioned-read)",
                "A partitioned read splits a result into ranges of a column's values and reads each range "
                "apart; a protected table answers one noised row per query (or one per declared key), so "
                "read it in one piece: leave out partition_on, partition_range and partition_num. "
                "Nothing was charged.",
                "partitioned-read",
            )
