"""µs per column of the smooth-sensitivity median (sample and aggregate), before and after a change.

    python -m benchmarks.median_speed                  # working tree against HEAD
    python -m benchmarks.median_speed --before 249ae81 # against another revision

Times mechanisms/smooth_median.py of the working tree ("after") and of git revision
``--before`` ("before") at m = 512 and 1,024 partitions on a few data shapes. Each figure is
the mean µs per call of the fastest of ``--repeats`` batches of ``--calls`` calls
(time.perf_counter); batches of before and after alternate, so a busy shared machine slows
both alike, and the minimum is the figure least disturbed by other processes.

Two figures per column: release_sample_and_aggregate with OpenDP's Laplace sampler replaced
by a stub (the pure Python the proxy runs in its event loop besides the noise: preparing the
partition values, S*, the bookkeeping), and the whole call (the same plus the sampler, whose
cost this module does not control). ε differs on every call, as it does between queries, so
no per-β or per-scale cache helps. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import math
import random
import time
from types import ModuleType
from typing import Callable, Sequence

from . import revision

LO, HI, DELTA = 0.0, 100.0, 1e-6
SHAPES = ("concentrated", "quarter-empty", "spread", "all-equal")


def module_at(rev: str | None, noise: bool = True) -> ModuleType:
    """A fresh copy of mechanisms/smooth_median.py as of git revision ``rev`` (None: the working
    tree), importing the working tree's siblings; without ``noise``, its sampler returns the
    value unchanged."""
    module = revision.module_at("mechanisms/smooth_median.py", rev)
    if not noise:
        setattr(module, "laplace_float", lambda value, scale: value)  # the release without its draw
    return module


def partition_values(shape: str, m: int, rng: random.Random) -> list[float | None]:
    """m partition values of an AVG-like column in [0, 100]."""
    if shape == "concentrated":
        return [rng.gauss(38.6, 0.8) for _ in range(m)]
    if shape == "quarter-empty":
        return [*(rng.gauss(38.6, 3.0) for _ in range(m - m // 4)), *[None] * (m // 4)]
    if shape == "spread":
        return [rng.uniform(LO - 10, HI + 10) for _ in range(m)]
    if shape == "all-equal":
        return [42.0] * m
    raise ValueError(shape)


def release(module: ModuleType, values: list[float | None]) -> Callable[[float], object]:
    def call(epsilon: float) -> object:
        return module.release_sample_and_aggregate(values, LO, HI, epsilon, DELTA)

    return call


def fastest_batches_us(calls: Sequence[Callable[[float], object]], size: int, repeats: int) -> list[float]:
    """For each call, µs per call of its fastest batch; batches of the calls alternate.

    Every call gets a new ε = 1 + i·1e-9, hence a new β and a new noise scale.
    """
    best = [math.inf] * len(calls)
    for batch in range(repeats):
        epsilons = [1.0 + (batch * size + i) * 1e-9 for i in range(size)]
        for n, call in enumerate(calls):
            start = time.perf_counter()
            for epsilon in epsilons:
                call(epsilon)
            best[n] = min(best[n], (time.perf_counter() - start) / size)
    return [b * 1e6 for b in best]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.median_speed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="HEAD", help="git revision to compare with (default HEAD)")
    parser.add_argument("--calls", type=int, default=200, help="calls per batch")
    parser.add_argument("--repeats", type=int, default=20, help="batches per figure")
    parser.add_argument("--partitions", default="512,1024")
    parser.add_argument("--epsilon-scale", type=float, default=1.0,
                        help="multiply ε (≈ 1) by this: smaller ε, smaller β, wider search")
    args = parser.parse_args(argv)

    modules = [module_at(rev, noise) for noise in (False, True) for rev in (args.before, None)]
    rng = random.Random(7)
    scale = args.epsilon_scale
    print(f"µs per column, fastest of {args.repeats} batches of {args.calls} calls; "
          f"ε ≈ {scale:g}, δ = {DELTA:g}, bounds [{LO:g}, {HI:g}]\n")
    print(f"| m | data | without noise, {args.before} | without noise, working tree "
          f"| whole release, {args.before} | whole release, working tree |")
    print("|---|---|---:|---:|---:|---:|")
    for m in (int(p) for p in args.partitions.split(",")):
        for shape in SHAPES:
            values = partition_values(shape, m, rng)
            scaled = [lambda eps, call=release(module, values): call(eps * scale) for module in modules]
            figures = fastest_batches_us(scaled, args.calls, args.repeats)
            print(f"| {m} | {shape} | " + " | ".join(f"{f:.1f}" for f in figures) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
