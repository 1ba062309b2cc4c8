"""The result of one DP mechanism applied to one aggregate column."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class Release(Generic[T]):
    """A noised value and what it cost.

    ``scale`` is the noise scale actually used (the Laplace b, or its analogue), and
    ``error95`` a bound that the absolute noise stays below with probability 0.95 — both are
    reported to the analyst, neither depends on the data beyond what is already released.
    """

    value: T
    epsilon: float
    delta: float
    scale: float
    error95: float
    mechanism: str

    def with_value(self, value: U) -> "Release[U]":
        """This release with ``value`` (a post-processed form of its own, such as an integer
        column's rounded MIN) in its place, all else the same: ``dataclasses.replace(self,
        value=value)``, without its per-field introspection (~200 bytecodes a column) where
        this is a plain Release; a subclass (a percentile's, the moments') keeps its own
        fields through ``replace``."""
        if type(self) is not Release:
            return cast("Release[U]", replace(cast(Any, self), value=value))
        return Release(value, self.epsilon, self.delta, self.scale, self.error95, self.mechanism)
