"""The placeholders ``dpproxy draft-policy`` leaves where only the policy's author can decide.

A draft policy fills a column's ``bounds`` or ``categories`` only from what the schema declares;
elsewhere it writes the plain word ``FILL_IN`` (``bounds: [FILL_IN, FILL_IN]``, ``categories:
[FILL_IN]``). A policy holding one is not valid: each is a ``file:line`` problem saying what to
write there, so that a draft is never served with a value nobody chose. A quoted ``"FILL_IN"`` is
a value its author wrote on purpose (a category spelled so), not a placeholder.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["PLACEHOLDER", "placeholder_problems", "without_placeholder_columns"]

PLACEHOLDER = "FILL_IN"

_WHAT = {
    "bounds": "the column's least and greatest possible value (bounds: [lo, hi]; dates for a time range)",
    "categories": "every value the column may hold (categories: [a, b, c])",
}


def placeholder_problems(root: yaml.Node | None, source: str) -> tuple[list[str], list[tuple[str, ...]]]:
    """Each plain ``FILL_IN`` scalar under ``root`` as a ``source:line: dotted.key: ...`` problem,
    and the key paths holding them."""
    problems: list[str] = []
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[Any, tuple[str, ...]]] = [(root, ())] if root is not None else []
    seen: set[int] = set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if node.style is None and node.value == PLACEHOLDER:
                key = path[-1] if path and not path[-1].isdigit() else path[-2] if len(path) > 1 else ""
                what = _WHAT.get(key, "the value this key needs (docs/policy.md)")
                problems.append(f"{source}:{node.start_mark.line + 1}: {'.'.join(_key_path(path))}: "
                                f"a placeholder left by dpproxy draft-policy: replace FILL_IN with {what}, chosen "
                                "from what the column means and never from its rows; or delete the column's line "
                                "to only count it")
                paths.append(path)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend((value, (*path, str(key.value))) for key, value in node.value)
    # One problem per key: [FILL_IN, FILL_IN] is one decision to make.
    unique: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}
    for problem, path in zip(problems, paths):
        unique.setdefault(_key_path(path), (problem, path))
    ordered = sorted(unique.values(), key=lambda item: int(item[0][len(source) + 1 :].split(":", 1)[0]))
    return [problem for problem, _ in ordered], [path for _, path in ordered]


def without_placeholder_columns(data: Any, paths: list[tuple[str, ...]]) -> Any:
    """``data`` without the column entries holding a placeholder (``tables.T.columns.C...``), so
    that the rest of the policy is still checked; None if a placeholder is elsewhere."""
    if not isinstance(data, dict):
        return None
    for path in paths:
        if len(path) < 4 or path[0] != "tables" or path[2] != "columns":
            return None
    trimmed = dict(data)
    tables = dict(trimmed.get("tables") or {})
    for path in paths:
        table = tables.get(path[1])
        if isinstance(table, dict) and isinstance(table.get("columns"), dict):
            columns = {name: entry for name, entry in table["columns"].items() if str(name) != path[3]}
            tables[path[1]] = {**table, "columns": columns}
    trimmed["tables"] = tables
    return trimmed


def _key_path(path: tuple[str, ...]) -> tuple[str, ...]:
    """The mapping keys of ``path``, without list positions: ``bounds``, not ``bounds.0``."""
    while path and path[-1].isdigit():
        path = path[:-1]
    return path
