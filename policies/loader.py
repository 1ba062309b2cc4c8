"""Load a policy file and say precisely what is wrong with it.

Errors name the file, the line and the dotted key path, and what is wrong, e.g.
``policy.yaml:14: tables.adult.columns.age.bounds: bounds must be finite with lo <= hi``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .key_names import nearest_key
from .model import WITHOUT_SECRETS, Policy
from .placeholders import placeholder_problems, without_placeholder_columns
from .shape_messages import reworded

__all__ = ["PolicyError", "key_line", "load_policy", "parse_policy"]


class PolicyError(Exception):
    """A policy file that cannot be used; ``problems`` lists each one as a full sentence."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def load_policy(path: str | Path, *, secrets: bool = True) -> Policy:
    """Read, parse and validate the policy at ``path``; raise PolicyError with every problem.

    ``secrets=False`` leaves the environment variables of ``dsn_env`` and ``password_env``
    unread and users' SCRAM keys underived: for commands that neither connect to the backend
    nor authenticate anyone (``dpproxy budget``, ``dpproxy health``), so that they run where
    those secrets are not set."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError([f"{path}: cannot read policy file: {exc.strerror or exc}"]) from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise PolicyError([f"{path}:{line}: the policy file is not UTF-8 text "
                           f"(byte 0x{exc.object[exc.start]:02x}); save it as UTF-8"]) from exc
    return parse_policy(text, str(path), secrets=secrets)


def parse_policy(text: str, source: str = "<policy>", *, secrets: bool = True) -> Policy:
    """Validate policy YAML given as text; ``source`` names it in error messages
    (``secrets``: as ``load_policy``'s)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc)
        raise PolicyError([f"{where}: not valid YAML: {problem}"]) from exc
    duplicates = _duplicate_keys(root, source)
    if duplicates:
        raise PolicyError(duplicates)
    if not isinstance(data, dict):
        raise PolicyError([f"{source}:1: the policy must be a mapping with backend, users and tables"])
    placeholders, held = placeholder_problems(root, source)
    if placeholders:  # a draft not filled in: said first, with what the rest of it gets wrong
        rest = without_placeholder_columns(data, held)
        others = [] if rest is None else _problems(rest, root, source, secrets)
        raise PolicyError(sorted(placeholders + others, key=lambda problem: _line_in(problem, source)))
    try:
        return Policy.model_validate(data, context=None if secrets else WITHOUT_SECRETS)
    except ValidationError as exc:
        # Not chained: pydantic's own text quotes the input, passwords included.
        raise PolicyError([_describe(err, root, source) for err in exc.errors()]) from None


def _problems(data: Any, root: yaml.Node | None, source: str, secrets: bool) -> list[str]:
    """Every problem validating ``data`` finds, at its line."""
    try:
        Policy.model_validate(data, context=None if secrets else WITHOUT_SECRETS)
    except ValidationError as exc:
        return [_describe(err, root, source) for err in exc.errors()]
    return []


def _line_in(problem: str, source: str) -> int:
    line = problem[len(source) + 1 :].split(":", 1)[0]
    return int(line) if line.isdigit() else 0


def _duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """Every key repeated within one mapping, as ``file:line: dotted.key: ...`` problems.

    PyYAML keeps the last of two equal keys without a word; in a policy that would let a
    typo or a bad merge raise a budget. Keys compare as constructed values (``epsilon`` and
    ``"epsilon"`` are the same key); a merge key (``<<: *anchor``) may be overridden, as YAML intends.
    """
    constructor = yaml.constructor.SafeConstructor()
    problems: list[str] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple[str, ...]]] = [(root, ())] if root is not None else []
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue  # an alias of a node already checked
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, str(i))) for i, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    stack.append((value_node, path))
                    continue
                key = constructor.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                dotted = ".".join((*path, str(key)))
                try:
                    first = first_line.get(key)
                except TypeError:  # an unhashable key; the loader reports it
                    continue
                if first is None:
                    first_line[key] = line
                else:
                    problems.append(
                        f"{source}:{line}: {dotted}: duplicate key (first given at line {first}); "
                        "a key may appear once, so a later value never silently replaces an earlier one"
                    )
                stack.append((value_node, (*path, str(key))))
    return sorted(problems, key=lambda problem: int(problem[len(source) + 1 :].split(":", 1)[0]))


def key_line(text: str, keys: list[str]) -> int:
    """The 1-based line of the policy key reached by ``keys`` in the YAML ``text`` (of its
    deepest existing part; 1 if the text is not YAML)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return 1
    return _line_of(root, list(keys))


# "columns.<name>: ..." from a table's validator (policies.model.TablePolicy).
_COLUMN_PROBLEM = re.compile(r"columns\.(?P<name>[^:]+): (?P<what>.*)", re.DOTALL)


def _describe(err: Any, root: yaml.Node | None, source: str) -> str:
    loc = [part for part in err["loc"] if not _is_validator_tag(part)]
    plain = reworded(err["type"], loc, err.get("input"))
    if plain is not None:
        loc, message = list(plain[0]), plain[1]
    elif err["type"] == "missing":
        message = "required key is missing"
    elif err["type"] == "extra_forbidden":
        meant = nearest_key(loc)
        advice = f"did you mean {meant}?" if meant is not None else "check the spelling;"
        message = f"unknown key ({advice} see docs/policy.md)"
    else:
        message = err["msg"].removeprefix("Value error, ")
        column = _COLUMN_PROBLEM.match(message)
        if column is not None:  # a table's check about one of its columns: at that column's line
            loc, message = [*loc, "columns", column["name"]], column["what"]
    key = ".".join(str(part) for part in loc) or "(top level)"
    return f"{source}:{_line_of(root, loc)}: {key}: {message}"


def _is_validator_tag(part: Any) -> bool:
    # pydantic inserts the union member or validator name into loc (e.g. 'function-after').
    return isinstance(part, str) and ("[" in part or part.startswith("function-"))


def _line_of(node: yaml.Node | None, loc: list[Any]) -> int:
    """The 1-based line of the deepest YAML node that ``loc`` reaches."""
    best = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if key_node.value == str(part):
                    node, best = value_node, key_node.start_mark.line + 1
                    break
            else:
                return best
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            best = node.start_mark.line + 1
        else:
            return best
    return best
