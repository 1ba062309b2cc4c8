"""Invoking an OpenDP measurement with the Python conversions done once, not on every call.

``Measurement.__call__`` (OpenDP 0.16's Python wrapper) spends ~80 µs per call here, against
~25 µs for the same work done below: on every call it asks the library for the measurement's
input type, parses type names, sets the C prototypes of five library functions, and frees
its temporary objects through further wrapped calls. All of that is a function of the
measurement's types, which dpproxy fixes in code (a float, a vector of floats, a boolean, an
i64), never of the value it is given. This module sets the prototypes once, at import, and
calls the same library functions the wrapper calls, in the same order:
``opendp_data__slice_as_object`` (the argument), ``opendp_core__measurement_invoke`` (the
draw: the same Rust sampler on the same measurement), ``opendp_data__object_type`` (checked
against the expected output type, so a changed library fails loudly instead of being misread),
``opendp_data__object_as_slice`` (the result), then frees the slice and both objects. So the
released value has the distribution ``measurement(arg)`` has, and the work done is the same
whatever the value.

:func:`laplace_float_draw` does the same for the one measurement dpproxy builds per draw, the
smooth median's float Laplace, whose scale follows the data and so is never cached
(``mechanisms.samplers``): it calls the constructor ``dp.m.make_laplace`` calls,
``opendp_measurements__make_laplace``, with the arguments that wrapper passes for it (the
domain and metric objects, the scale as a double, no ``k``, ``MaxDivergence``), invokes the
measurement as above and frees it with ``opendp_core___measurement_free``. The wrapper's type
parsing and conversions (~30 µs of ~35 per construction here) are all that is left out; the
library builds the same measurement, on every draw.

It reaches into OpenDP's ``opendp._lib`` (the C library handle and its structures), which is
not public API; pyproject pins OpenDP to 0.16, and importing this module under another version
raises, so an upgrade has to review it (``tests/test_opendp_calls.py`` compares every kind of
call with the public path).
"""

from __future__ import annotations

import ctypes
from importlib.metadata import version
from typing import Any, Sequence

from opendp._lib import FfiResult, FfiSlice, FfiSlicePtr, lib, unwrap
from opendp.mod import Domain, Measurement, Metric

__all__ = ["invoke_bool", "invoke_float", "invoke_floats_to_index", "invoke_int", "laplace_float_draw"]

if not version("opendp").startswith("0.16."):
    raise ImportError(f"mechanisms.opendp_calls is written for OpenDP 0.16, found {version('opendp')}")

# An AnyObject pointer as a plain address: OpenDP's AnyObjectPtr frees itself through the
# wrapped (slow) object_free when collected; here each object is freed explicitly.
_Object = ctypes.c_void_p
# A measurement: OpenDP's wrapper object, or the address of one built by laplace_float_draw.
_MeasurementRef = Measurement | ctypes.c_void_p


def _function(name: str, argtypes: list[Any], restype: Any = FfiResult) -> Any:
    # lib[name] is a new function object, so setting its prototype leaves OpenDP's own alone.
    function = lib[name]
    function.argtypes = argtypes
    function.restype = restype
    return function


_slice_as_object = _function("opendp_data__slice_as_object", [FfiSlicePtr, ctypes.c_char_p])
# The measurement as a plain pointer too: an ``opendp.mod.Measurement`` (a ctypes pointer) passes
# as one, and so does a measurement built here, which has no Python wrapper to free it.
_measurement_invoke = _function("opendp_core__measurement_invoke", [_Object, _Object])
_object_type = _function("opendp_data__object_type", [_Object])
_object_as_slice = _function("opendp_data__object_as_slice", [_Object])
_slice_free = _function("opendp_data__slice_free", [FfiSlicePtr])
_object_free = _function("opendp_data__object_free", [_Object])
_str_free = _function("opendp_data__str_free", [ctypes.c_char_p])
_make_laplace = _function("opendp_measurements__make_laplace",
                          [Domain, Metric, ctypes.c_double, ctypes.c_void_p, ctypes.c_char_p])
_measurement_free = _function("opendp_core___measurement_free", [_Object])


def _ok(result: Any, type_: Any) -> Any:
    """The result's payload as ``type_``; an error is raised as OpenDP's wrapper raises it."""
    if result.tag == 0:
        return ctypes.cast(result.payload.Ok, type_)
    return unwrap(result, type_)


def _invoke(measurement: _MeasurementRef, buffer: Any, length: int, input_type: bytes, output_type: bytes,
            output_ctype: Any) -> Any:
    """``measurement`` invoked on the ``length`` values of ``buffer`` (a ctypes object of type
    ``input_type``); its result, of type ``output_type``, read as ``output_ctype``."""
    argument = FfiSlicePtr(FfiSlice(ctypes.cast(ctypes.pointer(buffer), ctypes.c_void_p), length))
    arg = _ok(_slice_as_object(argument, input_type), _Object)
    try:
        out = _ok(_measurement_invoke(measurement, arg), _Object)
    finally:
        _object_free(arg)
    try:
        # c_char_p as restype would copy the text and lose the pointer that must be freed
        name = _ok(_object_type(out), ctypes.c_void_p)
        try:
            found = ctypes.string_at(name)
        finally:
            _str_free(ctypes.cast(name, ctypes.c_char_p))
        if found != output_type:
            raise TypeError(f"OpenDP returned {found.decode()!r}, expected {output_type.decode()!r}")
        raw = _ok(_object_as_slice(out), FfiSlicePtr)
        try:
            return ctypes.cast(raw.contents.ptr, ctypes.POINTER(output_ctype)).contents.value
        finally:
            _slice_free(raw)
    finally:
        _object_free(out)


def invoke_float(measurement: _MeasurementRef, value: float) -> float:
    """``measurement(value)`` for a measurement on ``f64`` that releases an ``f64``."""
    return float(_invoke(measurement, ctypes.c_double(value), 1, b"f64", b"f64", ctypes.c_double))


def invoke_int(measurement: _MeasurementRef, value: int) -> int:
    """``measurement(value)`` for a measurement on ``i64`` that releases an ``i64``; a value
    outside i64 raises ``ValueError``, as OpenDP's wrapper does (ctypes would wrap it around)."""
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} is not representable by i64")
    return int(_invoke(measurement, ctypes.c_int64(value), 1, b"i64", b"i64", ctypes.c_int64))


def invoke_bool(measurement: _MeasurementRef, value: bool) -> bool:
    """``measurement(value)`` for a measurement on ``bool`` that releases a ``bool``."""
    return bool(_invoke(measurement, ctypes.c_bool(value), 1, b"bool", b"bool", ctypes.c_bool))


def invoke_floats_to_index(measurement: _MeasurementRef, values: Sequence[float]) -> int:
    """``measurement(values)`` for a measurement on ``Vec<f64>`` that releases a ``usize``."""
    buffer = (ctypes.c_double * len(values))(*values)
    return int(_invoke(measurement, buffer, len(values), b"Vec<f64>", b"usize", ctypes.c_size_t))


def laplace_float_draw(domain: Domain, metric: Metric, scale: float, value: float) -> float:
    """``dp.m.make_laplace(domain, metric, scale=scale)(value)``: the measurement built for this
    draw alone by the library's constructor, invoked with :func:`invoke_float`, then freed.

    ``domain`` and ``metric`` are OpenDP's objects for an ``f64`` atom (``dp.atom_domain(T=float,
    nan=False)``, ``dp.absolute_distance(T=float)``); a scale the library refuses (negative, NaN)
    raises its error, as the wrapper's constructor does.
    """
    measurement = _ok(_make_laplace(domain, metric, scale, None, b"MaxDivergence"), _Object)
    try:
        return invoke_float(measurement, value)
    finally:
        _measurement_free(measurement)
