"""A result set written as COPY TO STDOUT writes it: text or csv rows in COPY's framing.

The values are the result's text-format values (the types' output functions, as COPY
uses them); only the quoting differs, and follows PostgreSQL's CopyAttributeOutText and
CopyAttributeOutCSV: text escapes backslash, the control characters and the delimiter;
csv quotes a value holding the delimiter, the quote, a newline, or equal to the NULL string.
"""

from __future__ import annotations

from proxy.backend.connection import ResultSet
from proxy.wire import protocol
from proxy.wire.encodings import client_encoding
from rewriter.copy import CopyOptions

__all__ = ["copy_messages"]

_TEXT_ESCAPES = {"\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v"}


def copy_messages(result: ResultSet, options: CopyOptions) -> bytes:
    """CopyOutResponse, one CopyData per row (and the header), CopyDone."""
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
