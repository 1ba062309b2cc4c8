"""What a parsed statement refers to: relations, functions, CTE names, columns.

Works on pglast's JSON parse tree. Classification decides by these references, never by
the statement's surface text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.tables import quote_identifier

__all__ = ["RelationRef", "References", "collect_references", "first_parameter"]


@dataclass(frozen=True)
class RelationRef:
    """A relation named in FROM/JOIN/etc.; ``schema`` is None when unqualified."""

    schema: str | None
    name: str

    @property
    def qualified(self) -> str:
        """The name as ``to_regclass`` reads it: each part quoted, so case and dots survive."""
        quoted = quote_identifier(self.name)
        return f"{quote_identifier(self.schema)}.{quoted}" if self.schema else quoted


@dataclass(frozen=True)
class References:
    """Everything a statement names, as PostgreSQL would resolve it (names already case-folded)."""

    relations: tuple[RelationRef, ...]
    functions: frozenset[str]
    cte_names: frozenset[str]
    columns: frozenset[str]
    node_kinds: frozenset[str]
    # Names after a dot in a column reference (``a.b``, ``s.t.c``) or a field selection
    # (``(expr).b``): PostgreSQL calls the function ``b(a)`` when ``a`` has no column ``b``
    # (attribute notation), so each may be a function call that is no FuncCall.
    fields: frozenset[str] = frozenset()
    # Of those, the names after a parenthesised value (``(expr).b``): ``b(expr)`` whatever the
    # value's type, where a column reference's ``a.b`` can only be ``b`` of ``a``'s whole row.
    value_fields: frozenset[str] = frozenset()
    params: int = 0  # the highest $n referenced: the parameters a Bind must supply, at least
    operators: frozenset[str] = frozenset()  # the symbols of its operators (a + b, OPERATOR(s.==))


def collect_references(node: dict[str, Any]) -> References:
    relations: list[RelationRef] = []
    functions: set[str] = set()
    ctes: set[str] = set()
    columns: set[str] = set()
    kinds: set[str] = set()
    fields: set[str] = set()
    value_fields: set[str] = set()
    operators: set[str] = set()
    params = 0
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            if key[:1].isupper():
                kinds.add(key)
                if key == "RangeVar":
                    relations.append(RelationRef(value.get("schemaname"), value["relname"]))
                elif key == "FuncCall":
                    functions.add(_dotted(value["funcname"]))
                elif key == "CommonTableExpr":
                    ctes.add(value["ctename"])
                elif key == "ColumnRef":
                    names = value.get("fields", [])
                    if names and "String" in names[-1]:
                        columns.add(names[-1]["String"]["sval"])
                    elif names and "A_Star" in names[-1]:
                        columns.add("*")
                    fields.update(part["String"]["sval"] for part in names[1:] if "String" in part)
                elif key == "A_Indirection":
                    selected = [part["String"]["sval"] for part in value.get("indirection", []) if "String" in part]
                    fields.update(selected)
                    value_fields.update(selected)
                elif key == "ParamRef":
                    params = max(params, value.get("number", 0))
                elif key == "A_Expr" and value.get("kind") == "AEXPR_OP" and value.get("name"):
                    operators.add(value["name"][-1]["String"]["sval"])
            if isinstance(value, (dict, list)):
                stack.append(value)
    return References(tuple(relations), frozenset(functions), frozenset(ctes), frozenset(columns), frozenset(kinds),
                      frozenset(fields), frozenset(value_fields), params, frozenset(operators))


def first_parameter(node: dict[str, Any]) -> int | None:
    """The number of the parameter reference (``$n``) written first in ``node``'s text, the one
    PostgreSQL's parse analysis names when no Bind supplies it; None where there is none."""
    found: list[tuple[int, int]] = []
    stack: list[Any] = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if "ParamRef" in item:
                found.append((item["ParamRef"].get("location", 0), item["ParamRef"].get("number", 0)))
            stack.extend(value for value in item.values() if isinstance(value, (dict, list)))
    return min(found)[1] if found else None


def _dotted(parts: list[dict[str, Any]]) -> str:
    return ".".join(part["String"]["sval"] for part in parts)
