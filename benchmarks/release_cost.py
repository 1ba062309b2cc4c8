"""µs of CPU per released column, by kind, of the working tree against a git revision.

    python -m benchmarks.release_cost                  # working tree against HEAD
    python -m benchmarks.release_cost --before main    # against another revision

One release of each kind, as ``proxy.dp.column_release`` makes it: COUNT and SUM (discrete
Laplace from the pool), AVG by noisy sum and count (an integer and a float column), a sample and
aggregate column (AVG where selected, MIN, MAX: the smooth median of ``--partitions`` values) and
MODE over ten declared categories (the exponential mechanism with its padding). The mechanism
modules of the working tree ("after") and of git revision ``--before`` ("before") are loaded side
by side (``benchmarks.revision``: each with its own ``mechanisms/samplers.py``), and batches of
``--calls`` calls alternate between them, so that a loaded machine slows both alike. Each batch
gives its thread CPU time per call; the figure is the median over ``--batches`` batches, with
the interquartile range. ε is the same on every call (0.5), as for statements at a policy's default
ε: the pools of discrete Laplace draws and the exponential mechanism's measurement are per scale,
a function of ε (``mechanisms.noise_pool``, ``mechanisms.samplers``). The smooth median builds its
measurement on every call whatever ε is. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from types import ModuleType
from typing import Callable

import numpy as np

from . import revision

Release = Callable[[float], object]


def mechanisms_at(rev: str | None) -> dict[str, ModuleType]:
    """The mechanism modules as of ``rev`` (None: the working tree), wired to that revision's samplers."""
    samplers = revision.module_at("mechanisms/samplers.py", rev)
    laplace = revision.module_at("mechanisms/laplace.py", rev)
    sum_count = revision.module_at("mechanisms/sum_count.py", rev)
    smooth_median = revision.module_at("mechanisms/smooth_median.py", rev)
    exponential = revision.module_at("mechanisms/exponential.py", rev)
    setattr(smooth_median, "laplace_float", samplers.laplace_float)
    setattr(exponential, "gumbel_argmax", samplers.gumbel_argmax)
    return {"laplace": laplace, "sum_count": sum_count, "smooth_median": smooth_median, "exponential": exponential}


def releases(modules: dict[str, ModuleType], partitions: int) -> dict[str, Release]:
    """One call per kind, of the given modules, taking the column's ε."""
    rng = random.Random(7)
    values = np.array([rng.gauss(38.6, 3.0) for _ in range(partitions)])
    categories = [f"category {i}" for i in range(10)]
    counts = [rng.randrange(1_000) for _ in categories]
    laplace, sum_count = modules["laplace"], modules["sum_count"]
    smooth_median, exponential = modules["smooth_median"], modules["exponential"]
    return {
        "COUNT": lambda eps: laplace.release_count(1_000, eps),
        "SUM (integer)": lambda eps: laplace.release_sum(40_000, eps, 99),
        "AVG, sum_count (integer)": lambda eps: sum_count.release_mean(40_000, 1_000, 1.0, 99.0, eps),
        "AVG, sum_count (float)": lambda eps: sum_count.release_mean(40_000 << 45, 1_000, 1.0, 99.0, eps, on_grid=True),
        f"sample and aggregate, m = {partitions}": lambda eps: smooth_median.release_sample_and_aggregate(
            values, 1.0, 99.0, eps, 1e-6),
        "MODE, 10 categories": lambda eps: exponential.release_mode(categories, counts, eps),
    }


EPSILON = 0.5


def batch_us(release: Release, calls: int) -> float:
    """Thread CPU µs per call over one batch of ``calls`` calls."""
    start = time.thread_time_ns()
    for _ in range(calls):
        release(EPSILON)
    return (time.thread_time_ns() - start) / calls / 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="HEAD", help="git revision to compare with (default HEAD)")
    parser.add_argument("--batches", type=int, default=41)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--partitions", type=int, default=512, help="m of the sample-and-aggregate column")
    args = parser.parse_args()
    before = releases(mechanisms_at(args.before), args.partitions)
    after = releases(mechanisms_at(None), args.partitions)
    print(f"| release (before = {args.before}) | before µs | after µs | after / before |")
    print("|---|---:|---:|---:|")
    for kind in before:
        for release in (before[kind], after[kind]):  # warm-up: pools, caches of ε-only values
            batch_us(release, args.calls)
        times: dict[str, list[float]] = {"before": [], "after": []}
        for _ in range(args.batches):
            times["before"].append(batch_us(before[kind], args.calls))
            times["after"].append(batch_us(after[kind], args.calls))
        median = {side: statistics.median(ts) for side, ts in times.items()}
        print(f"| {kind} | {_spread(times['before'])} | {_spread(times['after'])} | {median['after'] / median['before']:.2f} |")


def _spread(times: list[float]) -> str:
    q1, q2, q3 = statistics.quantiles(times, n=4)
    return f"{statistics.median(times):.1f} ({q1:.1f}–{q3:.1f})"


if __name__ == "__main__":
    main()
