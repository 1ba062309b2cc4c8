"""The keys a policy mapping accepts, to suggest the one a mis-typed key meant.

``nearest_key(["tables", "public.adult", "epsilom"])`` is ``"epsilon"``: the keys of the
mapping the unknown key is in are read from the policy model (``policies.model``), following
its fields and, for ``users``, ``tables`` and ``columns``, the entries named by the user.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .model import Policy

__all__ = ["nearest_key"]


def nearest_key(loc: Sequence[Any]) -> str | None:
    """The accepted key closest in spelling to ``loc``'s last part, among the keys of the
    mapping ``loc[:-1]`` leads to; None when none is close or the mapping is not a model's."""
    model = _model_at(loc[:-1])
    if model is None:
        return None
    keys = [field.alias or name for name, field in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), keys, n=1, cutoff=0.6)
    return close[0] if close else None


def _model_at(path: Sequence[Any]) -> type[BaseModel] | None:
    """The model class of the mapping at ``path`` in a policy, or None."""
    annotation: Any = Policy
    for part in path:
        annotation = _unwrapped(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for name, f in annotation.model_fields.items() if part in (name, f.alias)), None)
            if field is None:
                return None
            annotation = field.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]  # ``part`` names an entry: a user, a table, a column
        else:
            return None
    annotation = _unwrapped(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _unwrapped(annotation: Any) -> Any:
    """``X | None`` as ``X`` (the one member that is not None); anything else as it is."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return members[0]
    return annotation
