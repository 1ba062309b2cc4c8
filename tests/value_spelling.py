"""How a released number is spelled besides its digits, for the neighbour checks to compare.

A noised value's digits follow the noise; the rule that prints them follows the statement and
the policy: PostgreSQL's float8out or float4out (the shortest digits that read back, in exponent
form outside [1e-4, 1e15) or [1e-4, 1e6)), an integer's digits, a numeric of a fixed scale s (a
numeric(p, s) column's SUM, MIN or MAX, an integer column's SUM, a CASE constant's digits), or a
numeric printed from a double (repr's shortest digits in fixed notation: dpproxy's AVG, MIN and
MAX of a numeric column), or a quotient: a share (rewriter/shares.py: PostgreSQL's numeric
division of two released counts) and any numeric division of a release (``SUM(n) / 7``), whose
scale PostgreSQL's select_div_scale takes from the quotient's magnitude, which the noise decides
(16 − 4·w or 20 − 4·w for a quotient of base-10000 weight w: :func:`_division_scale`). One
text may follow several rules (``2.5`` follows float8out's, repr's and scale 1's); the values of
one output column, on a table and on its neighbour, must all follow one rule, else their form says something the noise did not decide (a trailing zero, a
scale taken from the rows).

An array of numbers (``PERCENTILE_CONT(ARRAY[...])``) is read with its text: its shape (the
``[l:u]=`` prefix array_out prints for a lower bound other than 1, its braces and NULLs) is
compared as it is, and each element position as a column of its own.

A value received in binary has no spelling of its own but its bytes: they must be what
PostgreSQL's send function gives for the value its output function printed
(:func:`canonical_binary`, :func:`misencoded`), so that the neighbour checks compare the text of
the same release (a repeat) and require its binary form to be that text's, byte for byte: a
float8 whose low mantissa bit, or a numeric whose dscale or digit count, the rows decided.

The rules are written here apart from dpproxy's own encoders (proxy/wire/values.py,
proxy/wire/binary.py), so that a change there is checked against PostgreSQL's output and send
functions rather than against itself.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Sequence
from decimal import Decimal, InvalidOperation

import numpy as np
from psycopg.adapt import AdaptersMap, Loader

__all__ = ["SPECIAL", "canonical_binary", "column_rules", "keep_number_texts", "misencoded", "raw_spelling", "rules", "shape",
           "spelled_apart", "spelling"]

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
    """Whether ``scale`` is one PostgreSQL gives a numeric division whose result is ``value``.

    select_div_scale (src/backend/utils/adt/numeric.c) estimates the quotient's base-10000
    weight as the operands' weights' difference, less one where the dividend's first digit is
    not above the divisor's: the true weight w or w − 1; the scale is 16 − 4·estimate, at least
    0 (and at least the operands' scales: integers in a share, and nothing this reads beside
    the value). Printed, a quotient rounded up to a power of 10000 shows the next weight. So a
    function of the value, hence of the noise where an operand is a release (a share,
    ``SUM(n) / 7``), never a choice the rows make. A zero quotient's estimate follows the
    divisor alone: any multiple of 4."""
    if scale % 4:
        return False
    if not value:
        return True
    weight = value.adjusted() // 4
    estimates = {weight, weight - 1}
    if abs(value) == Decimal(10000) ** weight:  # a quotient of weight − 1 rounded up
        estimates.add(weight - 2)
    return scale in {max(16 - 4 * estimate, 0) for estimate in estimates}


def column_rules(values: Iterable[str | None]) -> frozenset[str] | None:
    """The rules every one of ``values`` follows (None where there is no number among them)."""
    common: frozenset[str] | None = None
    for text in values:
        own = rules(text) if text is not None else None
        if own is None or own is _ANY:
            continue
        common = own if common is None else common & own
    return common


Spelled = str | tuple[str | None, ...] | None
"""One value's :func:`spelling`: an array's is the tuple of its elements'."""


def spelled_apart(*answers: Sequence[Sequence[Spelled]]) -> list[tuple[int, tuple[str, ...]]]:
    """The output columns whose numbers, over every row of every answer in ``answers`` (each a
    table's rows of spellings: None where a value is NULL, binary or no number; a tuple for an
    array, each of whose element positions is a column of its own), follow no rule in common:
    (column index, their spellings)."""
    width = max((len(row) for rows in answers for row in rows), default=0)
    apart = []
    for column in range(width):
        values = [row[column] for rows in answers for row in rows if column < len(row)]
        scalars = [v for v in values if not isinstance(v, tuple)]
        elements = [v for v in values if isinstance(v, tuple)]
        positions = [scalars] + [[v[k] for v in elements if k < len(v)]
                                 for k in range(max(map(len, elements), default=0))]
        for texts in positions:
            if column_rules(texts) == frozenset():
                apart.append((column, tuple(v for v in texts if v is not None)))
    return apart


class SpelledFloat(float):
    """A float8 or float4 read from text, with the text it was read from."""

    text: str


class SpelledInt(int):
    """An integer read from text, with the text it was read from."""

    text: str


class SpelledArray(list[object]):
    """A one-dimensional array of numbers read from text, with the text it was read from."""

    text: str


_ARRAY_TEXT = re.compile(r"(?:\[(-?\d+):(-?\d+)\]=)?\{(.*)\}", re.DOTALL)


class _ArrayTextLoader(Loader):
    """Reads array_out's text of a one-dimensional array of numbers as a :class:`SpelledArray`
    of element texts (None for NULL), keeping the text (psycopg's own loader drops a lower bound)."""

    def load(self, data: bytes | bytearray | memoryview) -> SpelledArray:
        text = bytes(data).decode("ascii")
        match = _ARRAY_TEXT.fullmatch(text)
        inner = match[3] if match else ""
        value = SpelledArray(None if item == "NULL" else item for item in (inner.split(",") if inner else ()))
        value.text = text
        return value


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
    for oid in _NUMBER_ARRAYS:
        adapters.register_loader(oid, _ArrayTextLoader)


def spelling(value: object) -> Spelled:
    """A number's spelling as the client received it: a numeric's (text or binary: its scale),
    a float's or integer's text (read through :func:`keep_number_texts`), an array's elements'
    texts; None for NULL, a binary float or integer, and what is no number."""
    if isinstance(value, SpelledArray):
        return tuple(None if item is None else str(item) for item in value)
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else str(value)
    if isinstance(value, (SpelledFloat, SpelledInt)):
        return value.text
    return None


def shape(value: object) -> str | None:
    """What an array of numbers shows besides its elements' digits: array_out's text with every
    element but NULL masked, a ``[l:u]=`` prefix kept as it is (``{#,NULL}``, ``[0:1]={#,#}``);
    None for any other value."""
    if not isinstance(value, SpelledArray):
        return None
    bounds, _, body = value.text.rpartition("=") if value.text.startswith("[") else ("", "", value.text)
    return (bounds + "=" if bounds else "") + re.sub(r"[^{},]+", lambda m: m[0] if m[0] == "NULL" else "#", body)


# PostgreSQL's number types and the arrays of them (pg_type's oids), for their send functions.
INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC, BOOL = 21, 23, 20, 700, 701, 1700, 16
_TEXT_LIKE = frozenset({18, 19, 25, 1042, 1043})
_NUMBER_ARRAYS = {1005: INT2, 1007: INT4, 1016: INT8, 1021: FLOAT4, 1022: FLOAT8, 1231: NUMERIC}


def canonical_binary(type_oid: int, text: bytes) -> bytes | None:
    """The bytes PostgreSQL's send function gives for the value its output function printed as
    ``text`` (int2send ... float8send, numeric_send, array_send of those, bool and the text
    types); None for a type this does not model (its binary form is not checked)."""
    if type_oid in _TEXT_LIKE:
        return text
    if type_oid == BOOL:
        return b"\x01" if text == b"t" else b"\x00"
    if type_oid in _NUMBER_ARRAYS:
        return _array_send(text.decode("ascii"), _NUMBER_ARRAYS[type_oid])
    s = text.decode("ascii")
    if type_oid in (INT2, INT4, INT8):
        return struct.pack({INT2: "!h", INT4: "!i", INT8: "!q"}[type_oid], int(s))
    if type_oid == FLOAT8:
        return struct.pack("!d", float(s))
    if type_oid == FLOAT4:
        return struct.pack("!f", float(np.float32(s)))
    if type_oid == NUMERIC:
        return _numeric_send(s)
    return None


def _numeric_send(s: str) -> bytes:
    """numeric_send: ndigits, weight, sign, dscale, then the base-10000 digits without leading
    or trailing zero digits; dscale is the number of fraction digits numeric_out printed."""
    if s in SPECIAL:
        # the dscale numeric_send takes from a special value's header reads as 32 for ±Infinity
        return struct.pack("!hhHh", 0, 0, *{"NaN": (0xC000, 0), "Infinity": (0xD000, 32), "-Infinity": (0xF000, 32)}[s])
    negative = s.startswith("-")
    whole, _, fraction = s.lstrip("-").partition(".")
    # pad to whole base-10000 digits each side of the point: weight counts the whole ones from 0
    whole = whole.zfill(-(-len(whole) // 4) * 4)
    fraction = fraction.ljust(-(-len(fraction) // 4) * 4, "0")
    digits = [int((whole + fraction)[i:i + 4]) for i in range(0, len(whole + fraction), 4)]
    weight = len(whole) // 4 - 1
    while digits and digits[0] == 0:
        digits.pop(0)
        weight -= 1
    while digits and digits[-1] == 0:
        digits.pop()
    if not digits:
        weight, negative = 0, False
    head = struct.pack("!hhHh", len(digits), weight, 0x4000 if negative else 0, len(s.partition(".")[2]))
    return head + b"".join(struct.pack("!H", d) for d in digits)


def _array_send(s: str, element: int) -> bytes:
    """array_send of a one-dimensional array of numbers from array_out's text: ndim (0 for
    ``{}``), whether an element is NULL, the element type, the length and the lower bound
    (1 unless a ``[l:u]=`` prefix says otherwise), then each element's length and bytes."""
    match = _ARRAY_TEXT.fullmatch(s)
    assert match, s
    items = match[3].split(",") if match[3] else []
    if not items:
        return struct.pack("!iii", 0, 0, element)
    sent = [None if item == "NULL" else canonical_binary(element, item.encode("ascii")) for item in items]
    lower = int(match[1]) if match[1] else 1
    out = [struct.pack("!iiiii", 1, int(None in sent), element, len(sent), lower)]
    out += [b"\xff\xff\xff\xff" if value is None else struct.pack("!i", len(value)) + value for value in sent]
    return b"".join(out)


def raw_spelling(type_oid: int, text: bytes | None) -> Spelled:
    """:func:`spelling` of a value read off the wire in text (a DataRow's): the text of a number
    type's value, the element texts of an array of them; None for NULL and any other type."""
    if text is None:
        return None
    if type_oid in _NUMBER_ARRAYS:
        match = _ARRAY_TEXT.fullmatch(text.decode("ascii"))
        items = match[3].split(",") if match and match[3] else []
        return tuple(None if item == "NULL" else item for item in items)
    return text.decode("ascii") if type_oid in (INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC) else None


def misencoded(types: Sequence[int], binary: Sequence[Sequence[bytes | None]],
               text: Sequence[Sequence[bytes | None]]) -> list[tuple[int, int]]:
    """The cells (row, column) of a binary result whose bytes are not PostgreSQL's send of the
    text the same release (a repeat) printed: ``types`` are the columns' type oids, ``binary``
    and ``text`` the raw values of both results. A row count of its own makes every cell apart."""
    if len(binary) != len(text):
        return [(r, -1) for r in range(max(len(binary), len(text)))]
    apart = []
    for r, (sent, printed) in enumerate(zip(binary, text)):
        for c, type_oid in enumerate(types):
            got, shown = sent[c] if c < len(sent) else None, printed[c] if c < len(printed) else None
            if (got is None) != (shown is None):
                apart.append((r, c))
            elif got is not None and shown is not None:
                expected = canonical_binary(type_oid, shown)
                if expected is not None and bytes(got) != expected:
                    apart.append((r, c))
    return apart
