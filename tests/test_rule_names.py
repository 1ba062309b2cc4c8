"""Every rule a refusal can name (``(rule: no-group-by)``, the audit log's ``reason``) is
explained in docs/sqlstates.md's "Rules" table, and the table names no rule the code has
dropped: an analyst who searches the docs for the rule in an error finds what it means.

The rules are read from the source: the ``rule=`` of a ``Refusal``, the rule argument of the
``refuse`` helpers, ``rule = "…"`` assignments and ``(message, rule)`` pairs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_RULE = re.compile(r"^[a-z]+(-[a-z]+)*$")


def _is_rule(node: ast.AST, hyphenated: bool = False) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RULE.match(node.value):
        return node.value if not hyphenated or "-" in node.value else None
    return None


def _rules_in(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            found |= {rule for kw in node.keywords if kw.arg == "rule" and (rule := _is_rule(kw.value))}
            if name.endswith("refuse") or name == "Refusal":
                found |= {rule for arg in node.args if (rule := _is_rule(arg))}
        elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[0], (ast.Constant, ast.JoinedStr)):
            if (rule := _is_rule(node.elts[1], hyphenated=True)) is not None:
                found.add(rule)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "rule" for t in node.targets):
            if (rule := _is_rule(node.value)) is not None:
                found.add(rule)
    return found


def emitted_rules() -> set[str]:
    """The rule names in dpproxy's source."""
    rules: set[str] = set()
    for package in ("rewriter", "policies", "proxy"):
        for path in (ROOT / package).rglob("*.py"):
            rules |= _rules_in(ast.parse(path.read_text(encoding="utf-8")))
    return rules


def documented_rules() -> set[str]:
    """The rules of docs/sqlstates.md's "Rules" table."""
    text = (ROOT / "docs" / "sqlstates.md").read_text(encoding="utf-8")
    section = text.split("\n## Rules\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z-]+)` \|", section, re.MULTILINE))


def test_the_rules_are_read_from_the_source():
    assert {"no-row-access", "no-join", "no-group-by", "budget", "safe-predicate", "default-deny",
            "read-only", "unsupported-clause", "no-write"} <= emitted_rules()


def test_every_rule_a_refusal_names_is_explained_in_sqlstates_md():
    missing = sorted(emitted_rules() - documented_rules())
    assert not missing, f"rules not in docs/sqlstates.md's Rules table: {missing}"


def test_the_rules_table_names_only_rules_the_code_has():
    assert not sorted(documented_rules() - emitted_rules())
