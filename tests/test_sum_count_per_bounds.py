"""AVG by noisy sum and count: what follows from the bounds alone is derived once per bounds.

``mechanisms.sum_count._centred_points`` (the grid, the centre and the sensitivity in grid points) is
kept per (lo, hi, on_grid): the policy's, never the data's or ε. A reloaded policy with new bounds
must get the new bounds' values, never a stale grid.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from mechanisms import sum_count
from mechanisms.fixed_point import Grid
from mechanisms.sum_count import mean_noise, release_mean


@pytest.fixture(autouse=True)
def fresh_cache() -> None:
    sum_count._centred_points.cache_clear()


def test_releases_over_any_data_and_epsilon_keep_one_entry_per_bounds() -> None:
    for total, count, epsilon in [(0, 0, 1.0), (4_000, 100, 0.5), (Decimal("123.25"), 7, 2.0), (-5, 3, 0.1)]:
        release_mean(total, count, 1.0, 99.0, epsilon)
    for total, count in [(0, 0), (2**60, 1_000), (-(2**40), 9)]:
        release_mean(total, count, 1.0, 99.0, 0.3, on_grid=True)
    assert sum_count._centred_points.cache_info().currsize == 2  # (1, 99, False) and (1, 99, True)


@pytest.mark.parametrize("on_grid", [False, True])
def test_new_bounds_after_old_ones_get_their_own_grid_and_sensitivity(on_grid: bool) -> None:
    narrow = mean_noise(0.0, 10.0, 1.0, on_grid)
    wide = mean_noise(-1e6, 1e6, 1.0, on_grid)  # as after a reload that widened the bounds
    sum_count._centred_points.cache_clear()
    assert mean_noise(-1e6, 1e6, 1.0, on_grid) == wide
    assert wide[0] > narrow[0] * 1e4  # the sum noise follows the wider bounds
    assert sum_count._centred_points(-1e6, 1e6, on_grid).grid == Grid.for_bounds(-1e6, 1e6)


def test_the_centre_kept_is_the_exact_centre_the_backend_subtracts() -> None:
    kept = sum_count._centred_points(17.0, 90.0, False)
    assert kept.centre == Fraction(sum_count.centre(17.0, 90.0)) == Fraction(107, 2)


def test_a_release_with_no_noise_room_is_unchanged_by_the_kept_values() -> None:
    # lo == hi releases lo exactly, before any grid is derived
    assert release_mean(10, 5, 3.0, 3.0, 1.0).value == 3.0
    assert sum_count._centred_points.cache_info().currsize == 0


_TOTALS = [0, 1, -1, 53, 107, 5_350, 5_351, -5_349, 2**60 + 3, -(2**70), 10**30 + 7]


@pytest.mark.parametrize("bounds", [(1.0, 99.0), (17.0, 90.0), (0.0, 1.5e6), (-5.0, 5.0), (3.0, 3.5), (1e15, 1e15 + 2)],
                         ids=str)
def test_an_integer_total_is_centred_on_the_grid_as_the_exact_fraction_rounds_it(bounds: tuple[float, float]) -> None:
    grid, _, _, centre = sum_count._centred_points(*bounds, False)
    for total in _TOTALS:
        for count in (0, 1, 2, 3, 100, 101, 2**40 + 1):
            expected = grid.rounded(Fraction(total) - centre * count)
            assert grid.rounded_ratio(total * centre.denominator - centre.numerator * count, centre.denominator) == expected


@pytest.mark.parametrize("exponent", [-3, 0, 5, 60])
def test_a_ratio_on_the_grid_rounds_half_to_even_as_a_fraction_does(exponent: int) -> None:
    grid = Grid(exponent)
    for numerator in range(-40, 41):
        for denominator in (1, 2, 3, 4, 6, 8, 2**70):
            assert grid.rounded_ratio(numerator, denominator) == grid.rounded(Fraction(numerator, denominator))
    with pytest.raises(ValueError):
        grid.rounded_ratio(1, 0)


def test_an_integer_columns_release_builds_no_fraction(monkeypatch: pytest.MonkeyPatch) -> None:
    # The centred sum of an int total in integer arithmetic: Fraction's Python arithmetic was
    # ~500 of an AVG statement's bytecodes. A numeric column's Decimal total still goes through it.
    release_mean(4_000, 100, 1.0, 99.0, 0.5)  # the bounds' values derived (with Fractions) once

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a Fraction built for an integer total")

    monkeypatch.setattr(sum_count, "Fraction", refused)
    for total, count in [(4_000, 100), (0, 0), (-7, 3), (10**25, 10**20)]:
        assert 1.0 <= release_mean(total, count, 1.0, 99.0, 0.5).value <= 99.0
    with pytest.raises(AssertionError, match="a Fraction built"):
        release_mean(Decimal("4000.5"), 100, 1.0, 99.0, 0.5)
