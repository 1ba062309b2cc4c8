"""dpproxy's own work on a release does not branch on the data where one row could switch the branch:
what an answer's latency would tell about one row (docs/threat-model.md, Timing;
benchmarks/proxy_cost.py measures the rest). No test here times anything: each counts the work.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import opendp.prelude as dp
import pytest

from mechanisms import samplers, smooth_median
from mechanisms.smooth_median import (
    prepare_partition_values, release_sample_and_aggregate, search_passes, smooth_sensitivity_median, smoothing_beta,
)


def _passes(values: list[float | None], monkeypatch: pytest.MonkeyPatch) -> int:
    """How many passes the S* search makes over ``values`` (m partition values on [0, 100])."""
    calls = [0]

    def counted(function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls[0] += 1
            return function(*args)
        return call

    with monkeypatch.context() as patched:
        patched.setattr(smooth_median, "_whole_rows", counted(smooth_median._whole_rows))
        patched.setattr(smooth_median, "_rows_within", counted(smooth_median._rows_within))
        smooth_sensitivity_median(prepare_partition_values(values, 0.0, 100.0), 0.0, 100.0, smoothing_beta(1.0, 1e-6))
    return calls[0]


def _spread(count: int) -> list[float | None]:
    return [10.0 + 80.0 * i / max(count, 1) for i in range(count)]


# Partition values with k of them moved to one place: at the upper bound (one partition more at hi
# made a small search of every row instead of three passes, ~35 µs less), at the lower bound, NaN
# (counted as hi), empty (the midpoint), all on one value.
FAMILIES: dict[str, Callable[[int, int], list[float | None]]] = {
    "k-at-hi": lambda m, k: [100.0] * k + _spread(m - k),
    "k-beyond-hi": lambda m, k: [1e308] * k + _spread(m - k),
    "k-at-lo": lambda m, k: [0.0] * k + _spread(m - k),
    "k-nan": lambda m, k: [float("nan")] * k + _spread(m - k),
    "k-empty": lambda m, k: [None] * k + _spread(m - k),
    "k-on-50-rest-at-hi": lambda m, k: [50.0] * k + [100.0] * (m - k),
}


@pytest.mark.parametrize("m", [3, 64, 256, 1024])
@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())
def test_the_smooth_median_search_makes_the_same_passes_whatever_the_partition_values(
        m: int, family: Callable[[int, int], list[float | None]], monkeypatch: pytest.MonkeyPatch) -> None:
    moved = range(m + 1) if m <= 256 else [0, 1, m // 2, m - 40, m - 33, m - 32, m - 31, m - 30, m - 1, m]
    passes = {k: _passes(family(m, k), monkeypatch) for k in moved}
    assert set(passes.values()) == {search_passes(m)}, passes


def test_the_search_passes_are_one_for_a_small_matrix_and_three_for_a_large_one() -> None:
    assert [search_passes(m) for m in (1, 2, 3, 64, 120)] == [1] * 5
    assert [search_passes(m) for m in (256, 512, 1024, 10_000)] == [3] * 4


def test_the_smooth_medians_laplace_measurement_is_built_on_every_release(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scale 2·S*/ε follows the data: a cache of measurements by scale would answer faster when an
    # earlier release had the same S* (here: the very same partition values), or S* was at its floor.
    built: list[float] = []
    make = dp.m.make_laplace

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(kwargs["scale"])
        return make(*args, **kwargs)

    monkeypatch.setattr(samplers.dp.m, "make_laplace", counted)
    values: list[float | None] = list(np.linspace(40.0, 60.0, 256))
    for _ in range(3):
        release_sample_and_aggregate(values, 0.0, 100.0, 1.0, 1e-6)
    assert len(built) == 3 and len(set(built)) == 1
