"""Would AVG(x) beside a variance of x be better read from the variance's noisy moments?

The variance's moments hold a noisy count ñ and centred sum S̃ of the clamped values, so
c + S̃·s/max(ñ, 1) (clamped into [lo, hi]) is a mean that costs nothing more. But the moments
spend only ε_n ≈ 0.279 and ε_S ≈ 0.443 of their share on ñ and S̃, where ``sum_count`` spends
1/2 and 1/2 of its own. Which route is better depends on how many releases the statement has:
merged, the AVG frees its share for the others (k − 1 releases instead of k), but its own noise
is drawn at a worse split. This measures both routes with the mechanisms themselves (OpenDP's
samplers), for statements of k releases when separate (the AVG, the variance family, k − 2
others), at ε = 1: the median absolute error of the AVG over ``--runs``
draws (its root mean square, which
the first-order analysis predicts), and the same for the variance. Run: ``python benchmarks/avg_from_moments.py``.
"""

from __future__ import annotations

import argparse
import statistics

from mechanisms.sum_count import release_mean
from mechanisms.variance import MomentGrid, mean_of, noisy_moments, variance_of

LO, HI = 17, 90  # adult's age bounds in the demo policy
# (label, n, exact sum of the clamped values, exact population variance): adult's ages
# (48,842 rows, mean 38.64: 0.41·h below the centre), and 200 rows all at 20, 0.92·h below it,
# near the worst case for the moments' split (|μ| = h, all at a bound; there the clamp into
# [lo, hi] would hide half of every error).
CASES = (("adult age, n = 48,842", 48842, 1887065, 195.24), ("200 rows of 20", 200, 200 * 20, 0.0))


def _moments_of(n: int, total: int, variance: float) -> tuple[int, int, int]:
    """n, Σ d and Σ d² on age's grid (step 1/2, d = 2x − (lo + hi)) of data with these n, sum, variance."""
    centred = 2 * total - (LO + HI) * n
    mean_d = centred / n
    return n, centred, round(n * (4 * variance + mean_d * mean_d))


def _errors(n: int, total: int, variance: float, k: int, runs: int) -> dict[str, list[float]]:
    grid = MomentGrid.for_bounds(LO, HI, integer=True)
    exact_mean = total / n
    count, centred, squares = _moments_of(n, total, variance)
    errors: dict[str, list[float]] = {"avg sum_count": [], "avg from moments": [], "var_pop separate": [],
                                      "var_pop merged": []}
    for _ in range(runs):
        separate = 1.0 / k
        errors["avg sum_count"].append(abs(release_mean(total, n, LO, HI, separate).value - exact_mean))
        errors["var_pop separate"].append(
            abs(variance_of("var_pop", noisy_moments(count, centred, squares, grid, separate)).value - variance))
        merged = noisy_moments(count, centred, squares, grid, 1.0 / (k - 1))
        errors["avg from moments"].append(abs(mean_of(merged, LO, HI).value - exact_mean))
        errors["var_pop merged"].append(abs(variance_of("var_pop", merged).value - variance))
    return errors


def _rms(errors: list[float]) -> float:
    return float(statistics.fmean(e * e for e in errors) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000)
    runs = parser.parse_args().runs
    print("| data | k separate | AVG by sum_count | AVG from the moments | var_pop separate | var_pop merged |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, n, total, variance in CASES:
        for k in (2, 3, 4, 6):
            errors = _errors(n, total, variance, k, runs)
            cells = [f"{statistics.median(e):.3g} ({_rms(e):.3g})" for e in errors.values()]
            print(f"| {label} | {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
