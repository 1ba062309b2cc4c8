"""The one protected table a DP query reads: resolving its column references, and refusing.

Every part of a DP query's validation (the query itself, its predicates, its GROUP BY keys,
the wrappers flattened into it) names columns through a :class:`Scope`, so a reference is
judged the same way wherever it stands.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from sqlglot import exp

from policies.errors import SQLSTATE, Refusal
from policies.tables import ColumnInfo, Relation

from .identifiers import identifier

__all__ = ["SYSTEM_COLUMNS", "Scope"]

_ALLOWED_HINT = (
    "Protected tables answer only aggregates of one table: SELECT COUNT(*), COUNT(col), COUNT(DISTINCT col), "
    "SUM(col), AVG(col), MIN(col), MAX(col), MODE() WITHIN GROUP (ORDER BY col), PERCENTILE_CONT(p) WITHIN GROUP "
    "(ORDER BY col), VARIANCE(col), STDDEV(col) FROM {table} "
    "[WHERE col <op> literal [AND|OR ...]]; each answer is noised. "
    "SHOW dpproxy.columns lists what each column answers."
)

# PostgreSQL's system columns: every table has them, and each tells something of one row.
SYSTEM_COLUMNS = frozenset({"ctid", "xmin", "xmax", "cmin", "cmax", "tableoid"})


@dataclass(frozen=True)
class Scope:
    """The one table a DP query reads, and the names that may qualify its columns."""

    table: Relation
    qualifiers: frozenset[str]
    # Every function name of the backend (TableRegistry.function_names): a name after a dot in
    # the outer statement that is one may be an attribute-notation call. None: not known.
    function_names: frozenset[str] | None = None
    # The names a subquery joined to the table makes visible (a series limit's ranking outputs,
    # rewriter.series_limit): no column of the table, yet no undefined column either.
    joined: frozenset[str] = frozenset()

    @property
    def hint(self) -> str:
        return _ALLOWED_HINT.format(table=self.table.display_name)

    def refuse(self, message: str, rule: str, sqlstate: str = SQLSTATE.DP_QUERY_SHAPE) -> Refusal:
        """A refusal that names the table and the rule, with the standard hint."""
        return Refusal(sqlstate, f"{message} {self.table.display_name} (rule: {rule})", self.hint, rule)

    def _names_table(self, schema: exp.Expression, qualifier: exp.Expression | None) -> bool:
        return (
            qualifier is not None
            and identifier(schema) == self.table.schema
            and identifier(qualifier) == self.table.name
            and self.table.name in self.qualifiers
        )

    def column(self, node: exp.Column) -> ColumnInfo:
        """The table column a reference names; only the table (or its alias) may qualify it.

        A schema-qualified reference (``"public"."people"."age"``, as Metabase writes) is the
        table's own column when it names the table's schema and name and the table has no
        alias (with an alias PostgreSQL itself rejects it).
        """
        schema = node.args.get("db")
        qualifier = node.args.get("table")
        if node.args.get("catalog") or (schema is not None and not self._names_table(schema, qualifier)):
            raise self.refuse("a schema-qualified column reference must name, without an alias, protected table", "column-reference")
        if qualifier is not None and identifier(qualifier) not in self.qualifiers:
            raise self.refuse(f"column {node.sql('postgres')} does not belong to protected table", "column-reference")
        name = identifier(node.this)
        column = self.table.columns.get(name)
        if column is None and name in SYSTEM_COLUMNS:
            raise self.refuse(f"system column {name} (the row's physical identity) is not allowed on protected table",
                              "no-row-access")
        if column is None:
            # A typo's likeliest column first, as PostgreSQL's own hint does; names are schema, not data.
            close = difflib.get_close_matches(name, list(self.table.columns), n=1, cutoff=0.6)
            quoted = isinstance(node.this, exp.Identifier) and node.this.args.get("quoted")
            # WHERE sex = "Male": a string in double quotes, which SQL reads as a column's name.
            string = (f"Double quotes name a column; a string is written in single quotes: "
                      f"'{name.replace(chr(39), chr(39) * 2)}'. " if quoted and not close else "")
            raise Refusal(
                "42703",
                f'column "{name}" does not exist in {self.table.display_name}',
                string + (f"Perhaps you meant {close[0]}. " if close else "") + "Columns: " + ", ".join(self.table.columns),
                "undefined-column",
            )
        return column
