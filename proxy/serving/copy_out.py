"""A result set written as COPY TO STDOUT writes it: text, csv or binary rows in COPY's framing.

Text and csv: the values are the result's text-format values (the types' output functions,
as COPY uses them); only the quoting differs, and follows PostgreSQL's CopyAttributeOutText
and CopyAttributeOutCSV: text escapes backslash, the control characters and the delimiter;
csv quotes a value holding the delimiter, the quote, a newline, or equal to the NULL string.

Binary: the result's binary-format values (the types' send functions), framed as
PostgreSQL's CopyTo frames them: the 19-byte file header in the first CopyData with the first
row, each row as a field count and length-prefixed values (-1 for NULL), and the trailer (-1)
in a CopyData of its own.
"""

from __future__ import annotations

import struct

from proxy.backend.connection import ResultSet
from proxy.wire import protocol
from proxy.wire.encodings import client_encoding
from rewriter.copy import CopyOptions

__all__ = ["copy_messages"]

_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)  # signature, flags, no extension
_BINARY_TRAILER = struct.pack("!h", -1)
_TEXT_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def copy_messages(result: ResultSet, options: CopyOptions) -> bytes:
    """CopyOutResponse, one CopyData per row (and the header), CopyDone.

    For binary, every field of ``result`` must be in binary format already."""
    if options.binary:
        return _binary_messages(result)
    codec = client_encoding.get().codec  # the rows' text is in it, and so must the lines be
    out = [protocol.copy_out_response(len(result.fields))]
    if options.header:
        out.append(protocol.copy_data(_line([f.name for f in result.fields], options, codec)))
    for row in result.rows:
        values = [None if value is None else value.decode(codec) for value in row]
        out.append(protocol.copy_data(_line(values, options, codec)))
    out.append(protocol.COPY_DONE)
    return b"".join(out)


def _line(values: list[str | None], options: CopyOptions, codec: str) -> bytes:
    single = len(values) == 1
    cells = [
        options.null if value is None else _csv(value, options, single) if options.csv else _text(value, options)
        for value in values
    ]
    return (options.delimiter.join(cells) + "\n").encode(codec, "replace")


def _text(value: str, options: CopyOptions) -> str:
    return "".join(
        _TEXT_ESCAPES.get(c) or ("\\" + c if c == options.delimiter else c) for c in value
    )


def _csv(value: str, options: CopyOptions, single: bool) -> str:
    quote = (
        value == options.null
        or (single and value == "\\.")  # alone on a line it would read back as the end-of-data marker
        or any(c in value for c in (options.delimiter, '"', "\n", "\r"))
    )
    return '"' + value.replace('"', '""') + '"' if quote else value


def _binary_messages(result: ResultSet) -> bytes:
    assert all(field.format == 1 for field in result.fields), "binary COPY of text values"
    out = [protocol.copy_out_response(len(result.fields), binary=True)]
    header = _BINARY_HEADER
    for row in result.rows:
        cells = [struct.pack("!h", len(row))]
        for value in row:
            cells.append(struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + bytes(value))
        out.append(protocol.copy_data(header + b"".join(cells)))
        header = b""
    out.append(protocol.copy_data(header + _BINARY_TRAILER))
    out.append(protocol.COPY_DONE)
    return b"".join(out)
