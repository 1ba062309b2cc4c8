"""Plain words for a policy value of the wrong shape, instead of pydantic's.

pydantic says "Input should be a valid tuple" for ``bounds: 20``, "Input should be a valid
dictionary or instance of MetricsConfig" for ``metrics: 9187``, "bounds.1: Field required"
for ``bounds: [17]`` and "Input should be a valid string" for ``password: 1234``, which YAML
read as a number. :func:`reworded` says what to write instead. A value is quoted back only
where it is a list (bounds, categories): never a string or number, which may be a password.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

__all__ = ["reworded"]

_LIST_EXAMPLES = {"bounds": "[lo, hi]", "categories": "[a, b, c]", "group_by": "[month]"}


def reworded(kind: str, loc: Sequence[Any], given: Any) -> tuple[Sequence[Any], str] | None:
    """(the key the problem is at, what to tell) for pydantic error type ``kind`` at ``loc``
    about the value ``given``; None where pydantic's own message says it well enough."""
    if kind == "missing" and loc and isinstance(loc[-1], int):  # an item of a fixed-length list
        return loc[:-1], f"too few values: got {_list(given)}{_example(loc[:-1], '; give ')}"
    if kind == "too_long":
        return loc, f"too many values: got {_list(given)}{_example(loc, '; give ')}"
    if kind in ("tuple_type", "list_type"):
        return loc, f"give a list in brackets ({_example(loc, '') or '[a, b]'}); got {_kind_of(given)}"
    if kind in ("dict_type", "model_type"):
        return loc, f"give its entries as indented key: value lines under it; got {_kind_of(given)}"
    if kind == "string_type" and isinstance(given, (bool, int, float)):
        return loc, f"give text; YAML read this value as {_kind_of(given)}: put it in quotes"
    return None


def _example(loc: Sequence[Any], lead: str) -> str:
    """``lead`` and an example of the list at ``loc`` (``bounds: [lo, hi]``), or ""."""
    example = _LIST_EXAMPLES.get(str(loc[-1])) if loc else None
    return f"{lead}{loc[-1]}: {example}" if example else ""


def _list(given: Any) -> str:
    if isinstance(given, (list, tuple)) and all(isinstance(v, (int, float)) for v in given):
        return yaml.safe_dump(list(given), default_flow_style=True).strip()
    return _kind_of(given)


def _kind_of(given: Any) -> str:
    """What YAML made of the value, without the value: it may be a secret."""
    if given is None:
        return "nothing"
    if isinstance(given, bool):
        return "a boolean (true, false, yes, no, on, off)"
    if isinstance(given, (int, float)):
        return "a number"
    if isinstance(given, str):
        return "a single value"
    if isinstance(given, (list, tuple)):
        return f"a list of {len(given)}"
    if isinstance(given, dict):
        return "a mapping"
    return type(given).__name__
