"""Small statistics over measurements: percentiles and the median of repeated rounds."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

__all__ = ["median", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``; NaN when there are none."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan
