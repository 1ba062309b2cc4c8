"""How a released number is spelled besides its digits, for the neighbour checks to compare.

A noised value's digits follow the noise; the rule that prints them follows the statement and
the policy: PostgreSQL's float8out or float4out (the shortest digits that read back, in exponent
form outside [1e-4, 1e15) or [1e-4, 1e6)), an integer's digits, a numeric of a fixed scale s (a
numeric(p, s) column's SUM, MIN or MAX, an integer column's SUM, a CASE constant's digits), or a
numeric printed from a double (repr's shortest digits in fixed notation: dpproxy's AVG, MIN and
MAX of a numeric column), or a share (rewriter/shares.py: PostgreSQL's numeric division of two
released counts, n ≤ d, whose scale is 20, or 24, 28 ... where d has more base-10000 digits than
n: a function of the released counts, so one rule for all), and more generally any numeric division
of a release (``SUM(n) / 7``), whose scale, 16 − 4·w for a quotient of base-10000 weight w,
follows the noised value's magnitude. One text may follow several rules (``2.5`` follows float8out's, repr's
and scale 1's); the values of one output column, on a table and on its neighbour, must all
follow one rule, else their form says something the noise did not decide (a trailing zero, a
scale taken from the rows).

The rules are written here apart from dpproxy's own encoders (proxy/wire/values.py), so that a
change there is checked against PostgreSQL's output functions rather than against itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation

import numpy as np
from psycopg.adapt import AdaptersMap, Loader

__all__ = ["SPECIAL", "column_rules", "keep_number_texts", "rules", "spelled_apart", "spelling"]

SPECIAL = frozenset({"NaN", "Infinity", "-Infinity"})
_NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]\d+)?")
_ANY = frozenset({"*"})  # NaN and ±Infinity: one spelling, whatever the rule


def _float_out(digits: Decimal, fixed_below: int) -> str:
    """A finite float as PostgreSQL's float8out/float4out prints it (src/common/d2s.c, f2s.c),
    from its shortest digits: fixed notation when the first digit's decimal exponent is in
    [-4, ``fixed_below``), else d.ddde±XX."""
    number = digits.normalize()
    sign, figures, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    if not any(figures):
        return "-0" if sign else "0"
    leading = len(figures) + exponent - 1
    if -4 <= leading < fixed_below:
        return format(number, "f")
    mantissa = str(figures[0]) + ("." + "".join(map(str, figures[1:])) if len(figures) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if leading < 0 else '+'}{abs(leading):02d}"


def rules(text: str) -> frozenset[str] | None:
    """The spelling rules ``text`` follows; None for a text that is no number (a label, a date)."""
    if text in SPECIAL:
        return _ANY
    if not _NUMBER.fullmatch(text):
        return None
    found = set()
    value = float(text)
    if math.isfinite(value):
        if text == _float_out(Decimal(repr(value)), 15):
            found.add("float8out")
        with np.errstate(over="ignore"):  # past float4's range: no float4out spelling
            single = np.float32(value)
        if math.isfinite(single) and text == _float_out(Decimal(np.format_float_scientific(single, unique=True)), 6):
            found.add("float4out")
        try:
            if text == format(Decimal(repr(value)), "f"):
                found.add("repr")
        except InvalidOperation:  # pragma: no cover - repr of a finite double is a number
            pass
    if "e" not in text:
        fraction = text.partition(".")[2]
        if text == format(Decimal(text), f".{len(fraction)}f"):  # no leading zero, no "+"
            found.add(f"scale {len(fraction)}")
        if not fraction and text == str(int(text)):
            found.add("integer")
        if f"scale {len(fraction)}" in found and _division_scale(Decimal(text), len(fraction)):
            found.add("quotient")
    return frozenset(found)


def _division_scale(value: Decimal, scale: int) -> bool:
    """Whether ``scale`` is one PostgreSQL gives a numeric division whose result is ``value``:
    16 significant digits, so 16 − 4·w fraction digits for a quotient of base-10000 weight w
    (select_div_scale; its estimate of w may be one off), never fewer than 0. A function of the
    value, so of the noise where the dividend is a release (``SUM(n) / 7``)."""
    if scale % 4:
        return False
    if not value:
        return True
    weight = (value.adjusted()) // 4
    return scale in {max(16 - 4 * (weight + d), 0) for d in (-1, 0, 1)}


def column_rules(values: Iterable[str | None]) -> frozenset[str] | None:
    """The rules every one of ``values`` follows (None where there is no number among them)."""
    common: frozenset[str] | None = None
    for text in values:
        own = rules(text) if text is not None else None
        if own is None or own is _ANY:
            continue
        common = own if common is None else common & own
    return common


def spelled_apart(*answers: Sequence[Sequence[str | None]]) -> list[tuple[int, tuple[str, ...]]]:
    """The output columns whose numbers, over every row of every answer in ``answers`` (each a
    table's rows of spellings: None where a value is NULL, binary or no number), follow no
    rule in common: (column index, their spellings)."""
    width = max((len(row) for rows in answers for row in rows), default=0)
    apart = []
    for column in range(width):
        values = [row[column] for rows in answers for row in rows if column < len(row)]
        if column_rules(values) == frozenset():
            apart.append((column, tuple(v for v in values if v is not None)))
    return apart


class SpelledFloat(float):
    """A float8 or float4 read from text, with the text it was read from."""

    text: str


class SpelledInt(int):
    """An integer read from text, with the text it was read from."""

    text: str


class _TextKeepingLoader(Loader):
    """Reads a number's text as ``kind``, which keeps the text."""

    kind: type[SpelledFloat] | type[SpelledInt]

    def load(self, data: bytes | bytearray | memoryview) -> SpelledFloat | SpelledInt:
        text = bytes(data).decode("ascii")
        value = self.kind(text)
        value.text = text
        return value


class _FloatTextLoader(_TextKeepingLoader):
    kind = SpelledFloat


class _IntTextLoader(_TextKeepingLoader):
    kind = SpelledInt


def keep_number_texts(adapters: AdaptersMap) -> None:
    """Have ``adapters`` (a connection's or a cursor's) read float and integer texts as
    :class:`SpelledFloat` and :class:`SpelledInt`, which keep the text for :func:`spelling`."""
    for name in ("float4", "float8"):
        adapters.register_loader(name, _FloatTextLoader)
    for name in ("int2", "int4", "int8"):
        adapters.register_loader(name, _IntTextLoader)


def spelling(value: object) -> str | None:
    """A number's spelling as the client received it: a numeric's (text or binary: its scale),
    a float's or integer's text (read through :func:`keep_number_texts`); None for NULL, a binary
    float or integer, and what is no number."""
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else str(value)
    if isinstance(value, (SpelledFloat, SpelledInt)):
        return value.text
    return None
