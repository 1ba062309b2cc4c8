"""The code's layout: no module imports itself back, and the rooms depend on each other one way.

Every import counts, including those inside functions and under ``TYPE_CHECKING``: a cycle
hidden there is still two modules that cannot be understood, or moved, one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("proxy", "rewriter", "policies", "mechanisms")

# Each room, and the rooms it may import from (the README's "How it is built" map).
ALLOWED: dict[str, set[str]] = {
    "mechanisms": set(),
    "policies": {"mechanisms"},  # ε from breach probabilities, in the policy's terms
    "rewriter": {"policies"},
    "proxy.wire": {"rewriter", "policies"},  # rewriter.types: the type OIDs values are encoded in
    "proxy.ops": {"proxy.wire", "policies"},
    "proxy.backend": {"proxy.wire", "proxy.ops", "rewriter", "policies"},
    "proxy.dp": {"proxy.backend", "proxy.wire", "rewriter", "policies", "mechanisms"},
    "proxy.serving": {"proxy.dp", "proxy.backend", "proxy.ops", "proxy.wire", "rewriter", "policies"},
    "proxy.demo": {"proxy.serving", "policies"},
    "proxy.cli": {"proxy.serving", "proxy.demo", "proxy.backend", "proxy.ops", "policies", "mechanisms"},
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The project modules ``name`` imports, anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and known[target].name != "__init__.py":
                yield target


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: set(_imports(name, path, known)) for name, path in known.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "proxy" else parts[0]


def test_no_module_imports_itself_back() -> None:
    assert _cycles(_graph()) == []


def test_every_module_of_proxy_lives_in_a_room() -> None:
    loose = [p.name for p in (ROOT / "proxy").glob("*.py") if p.name != "__init__.py"]
    assert loose == []
    assert {_room(m) for m in _graph() if m != "proxy"} <= set(ALLOWED)


def test_rooms_import_only_the_rooms_below_them() -> None:
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        for target in targets
        if _room(target) != _room(module) and _room(target) not in ALLOWED[_room(module)]
    )
    assert wrong == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
