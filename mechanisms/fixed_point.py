"""Exact sums of float columns: each clamped value put on a grid of step 2^-k, added as integers.

PostgreSQL adds ``double precision`` values one at a time, each addition rounded relative to
the running total, and in a parallel plan in an order that changes from run to run. Over n
rows the rounding errors add up to about n²·2^-53·max(|lo|, |hi|), which one row does not
bound: a row added early shifts the rounding of every later addition, so the computed sum can
move by more than the bound the noise is scaled to (Casacuberta, Shoemate, Vadhan and
Wagaman, "Widespread Underestimation of Sensitivity in Differentially Private Libraries and
How to Fix It", 2022). Past ~10^7 rows that is no longer a rounding error of the guarantee.

dpproxy therefore asks the backend for Σ rint(x·2^k) over the clamped values x, each term a
``bigint`` and their sum PostgreSQL's exact ``sum(bigint)``. Each term is a function of its
row alone and lies in [rint(lo·2^k), rint(hi·2^k)] (x·2^k is exact: scaling by a power of two;
rint is monotone), so one added or removed row moves the exact integer sum by at most
max(|L|, |H|) grid points, and the Laplace mechanism over the integers is ε-DP for it with no
rounding before the noise. k is chosen per column from its bounds so that max(|lo|, |hi|)·2^k
lies in [2^51, 2^52): the grid is as fine as a ``double``'s own spacing near the bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

__all__ = ["Grid"]

_TOP = 52  # the largest bound's magnitude is below 2^_TOP grid points
_MAX_EXPONENT = 1023  # 2^k must be a finite double


@dataclass(frozen=True)
class Grid:
    """The fixed-point grid of step 2^-``exponent`` a float column's values are summed on."""

    exponent: int

    @classmethod
    def for_bounds(cls, lo: float, hi: float) -> Grid:
        """The grid on which max(|lo|, |hi|) is below 2^52 points (and at least 2^51, unless the
        bounds are so close to 0 that 2^k would not be a finite double)."""
        largest = max(abs(float(lo)), abs(float(hi)))
        if not math.isfinite(largest):
            raise ValueError(f"bounds must be finite, got [{lo!r}, {hi!r}]")
        if largest == 0.0:
            return cls(0)
        _, binary_exponent = math.frexp(largest)  # largest < 2^binary_exponent
        return cls(min(_TOP - binary_exponent, _MAX_EXPONENT))

    def point(self, value: float) -> int:
        """rint(value·2^k), rounding half to even, as PostgreSQL's ``CAST(value * 2^k AS bigint)``."""
        return round(math.ldexp(float(value), self.exponent))

    def value(self, points: int) -> float:
        """``points``·2^-k as a double (post-processing of a released integer)."""
        return math.ldexp(float(points), -self.exponent)

    def rounded(self, exact: int | Decimal | Fraction) -> int:
        """An exact total (an integer or numeric column's sum) on the grid: rint(exact·2^k).

        Rounding moves a total by at most half a point, so where one row moves the exact total
        by at most d, it moves this by at most d·2^k + 1 points. A non-finite total (which
        clamped values never add up to) is a ValueError.
        """
        if isinstance(exact, Decimal) and not exact.is_finite():
            raise ValueError(f"an exact total must be finite, got {exact}")
        return round(Fraction(exact) * Fraction(2) ** self.exponent)

    def rounded_ratio(self, numerator: int, denominator: int) -> int:
        """rint(numerator/denominator · 2^k), rounding half to even: :meth:`rounded` of that
        fraction, in integer arithmetic (``denominator`` > 0). The same integer ``round`` of a
        ``Fraction`` gives, without building one (~500 bytecodes for an integer column's AVG)."""
        if denominator <= 0:
            raise ValueError(f"denominator must be positive, got {denominator}")
        if self.exponent >= 0:
            numerator <<= self.exponent
        else:
            denominator <<= -self.exponent
        floor, remainder = divmod(numerator, denominator)
        twice = 2 * remainder
        if twice < denominator or (twice == denominator and floor % 2 == 0):
            return floor
        return floor + 1

    def deciding_digits(self, centre: float = 0.0) -> int:
        """How many fraction digits of an exact decimal total T decide rint((T − centre·n)·2^k)
        for every integer n ≥ 0: D = max(k + 1, q, 0), q being the binary fraction digits of the
        double ``centre`` (0 for a plain sum).

        The totals at which that rounding changes or ties, T = centre·n + (2m + 1)/2^(k+1), are
        decimals of at most D fraction digits (1/2^(k+1) has k + 1; centre·n has q; for k < 0
        the second term is an integer), so they lie on the lattice 10^-D. Any T', equal to T
        when T is on that lattice and otherwise strictly between the same two neighbouring
        lattice points, therefore rounds exactly as T does: the backend sends such a T' of at
        most D + 1 fraction digits (``rewriter.rewrite.decided_total``), so that a row's
        16,383 fraction digits are never read or computed with here. A function of the policy's
        bounds alone.
        """
        q = Fraction(float(centre)).denominator.bit_length() - 1
        return max(self.exponent + 1, q, 0)

    @property
    def step(self) -> float:
        """2^-k, one grid point in the column's units."""
        return math.ldexp(1.0, -self.exponent)

    @property
    def factor(self) -> float:
        """2^k, the double the backend multiplies each clamped value by."""
        return math.ldexp(1.0, self.exponent)

    @property
    def rounds_to_zero_below(self) -> float | None:
        """For k < 0, the magnitude 2^(-k-1) below which a value's point is 0.

        Multiplying such a value by 2^k in ``double precision`` could underflow to 0, which
        PostgreSQL reports as an error ("value out of range: underflow"); whether a row held
        one would then decide whether the query fails. The backend takes these values as 0
        without multiplying: rint gives 0 for them anyway. None for k ≥ 0, where multiplying
        never shrinks a value.
        """
        return math.ldexp(1.0, -self.exponent - 1) if self.exponent < 0 else None

    def sensitivity(self, lo: float, hi: float) -> int:
        """The most one row moves the sum of points: max(|L|, |H|)."""
        return max(abs(self.point(lo)), abs(self.point(hi)))
