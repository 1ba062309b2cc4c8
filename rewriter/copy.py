"""COPY (SELECT ...) TO STDOUT: the inner query and the output options dpproxy can honour exactly.

Only a query copied to the client is accepted: it is answered like the same SELECT (same
release, same ε, same repeat), in COPY's framing. A table (``COPY people TO``, psql's
``\\copy people TO 'file'``) would release its rows; COPY FROM writes; ``TO 'file'`` and
``TO PROGRAM`` act on the server: all are refused. psql's ``\\copy ... TO 'file'`` opens
(and truncates) the local file before it sends the statement, so a refused ``\\copy ... TO
'file'`` leaves an empty file behind; the server never hears of the file and cannot prevent
that. psql sends the same ``COPY ... TO STDOUT`` for ``\\copy ... TO STDOUT``, which leaves no
file: the hint says what happened in either case (:data:`COPY_HINT`).

Options: FORMAT text, csv or binary, HEADER, DELIMITER, NULL, with PostgreSQL's defaults and
checks (binary takes none of the other three). The others (QUOTE, ESCAPE, FORCE_QUOTE,
ENCODING ...) are refused. Binary is what connectorx and Arrow's ADBC driver read results
with (``COPY (query) TO STDOUT WITH BINARY``): the same values in the types' send format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pglast import parser

from policies.errors import SQLSTATE, Refusal

__all__ = ["COPY_HINT", "CopyOptions", "copy_query"]

_COPY_INSTEAD = (
    "Copy an aggregate query instead: \\copy (SELECT count(*) FROM t WHERE ...) TO 'file' in psql, "
    "or COPY (SELECT ...) TO STDOUT."
)
# psql sends COPY ... TO STDOUT for \copy ... TO STDOUT and for \copy ... TO 'file' alike: the
# hint is true of both, and says what only the second did.
COPY_HINT = (
    f"{_COPY_INSTEAD} Nothing was copied. If this was psql's \\copy ... TO 'file', psql had already "
    "created (or emptied) that local file before it sent COPY, and it is left empty."
)
_COPY_FROM_HINT = "dpproxy answers queries and writes no table. " + _COPY_INSTEAD
_SERVER_FILE_HINT = (
    "A file or program on the database server is out of reach through dpproxy. Copy to the client: "
    "COPY (SELECT count(*) FROM t WHERE ...) TO STDOUT, or psql's \\copy (SELECT ...) TO 'file', which "
    "writes the file on your machine."
)
_OPTIONS_HINT = "COPY through dpproxy supports FORMAT text, csv or binary, HEADER, DELIMITER and NULL."
_TRUE = frozenset({"true", "on", "1", "yes"})
_FALSE = frozenset({"false", "off", "0", "no"})


@dataclass(frozen=True)
class CopyOptions:
    """How COPY TO STDOUT writes rows: PostgreSQL's defaults unless the statement says otherwise."""

    csv: bool = False
    binary: bool = False
    header: bool = False
    delimiter: str = "\t"
    null: str = "\\N"


def copy_query(text: str, node: dict[str, Any]) -> tuple[str, CopyOptions]:
    """The inner query's text and the options of ``COPY (query) TO STDOUT [options]``.

    Raises Refusal for every other COPY (module docstring).
    """
    query = node.get("query")
    if query is None or node.get("is_from") or node.get("is_program") or node.get("filename"):
        what, hint = (("COPY FROM", _COPY_FROM_HINT) if node.get("is_from") else
                      ("COPY to a server file or program", _SERVER_FILE_HINT)
                      if node.get("is_program") or node.get("filename") else ("COPY of a table", COPY_HINT))
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            f"{what} is not supported through dpproxy (rule: statement-not-allowed)",
            hint,
            "statement-not-allowed",
        )
    if "SelectStmt" not in query or query["SelectStmt"].get("valuesLists"):
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            "COPY through dpproxy copies a SELECT only (rule: statement-not-allowed)",
            COPY_HINT,
            "statement-not-allowed",
        )
    return _inner_text(text), _options(node.get("options") or [])


def _inner_text(text: str) -> str:
    """The text between COPY's first parenthesis and its match (the grammar puts the query there).

    pglast's scanner gives character offsets into ``text`` (not byte offsets).
    """
    depth = 0
    start = 0
    for token in parser.scan(text):
        if token.name == "ASCII_40":
            depth += 1
            if depth == 1:
                start = token.end + 1
        elif token.name == "ASCII_41":
            depth -= 1
            if depth == 0:
                return text[start : token.start].strip()
    raise AssertionError("COPY (query) without its parentheses")  # the parser accepted it


def _options(items: list[dict[str, Any]]) -> CopyOptions:
    values: dict[str, Any] = {}
    for item in items:
        element = item["DefElem"]
        name = element["defname"]
        if name in values:
            raise Refusal(SQLSTATE.SYNTAX_ERROR, "conflicting or redundant options",
                          f'Give the option "{name}" once.')
        values[name] = _argument(element.get("arg"))
    unknown = sorted(set(values) - {"format", "header", "delimiter", "null"})
    if unknown:
        raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED,
                      f"COPY option {unknown[0].upper()} is not supported through dpproxy (rule: copy-options)",
                      _OPTIONS_HINT, "copy-options")
    form = str(values.get("format", "text")).lower()
    if form not in ("text", "csv", "binary"):
        raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED,
                      f"COPY format {form} is not supported through dpproxy (rule: copy-options)",
                      _OPTIONS_HINT, "copy-options")
    if form == "binary":
        return _binary(values)
    csv = form == "csv"
    header = _boolean(values.get("header", False))
    delimiter = _string(values.get("delimiter", "," if csv else "\t"), "delimiter")
    null = _string(values.get("null", "" if csv else "\\N"), "null")
    _check(csv, delimiter, null)
    return CopyOptions(csv=csv, header=header, delimiter=delimiter, null=null)


def _binary(values: dict[str, Any]) -> CopyOptions:
    """FORMAT binary: PostgreSQL's own refusals of the text options beside it, same SQLSTATEs."""
    for name in ("delimiter", "null"):
        if name in values:
            raise Refusal(SQLSTATE.SYNTAX_ERROR, f"cannot specify {name.upper()} in BINARY mode",
                          "Binary COPY has no delimiter or NULL string: leave them out.")
    if _boolean(values.get("header", False)):
        raise Refusal(SQLSTATE.FEATURE_NOT_SUPPORTED, "cannot specify HEADER in BINARY mode",
                      "Binary COPY has no header line: leave HEADER out.")
    return CopyOptions(binary=True)


def _argument(arg: dict[str, Any] | None) -> Any:
    if arg is None:
        return True  # HEADER alone
    ((kind, inner),) = arg.items()
    if kind == "Boolean":
        return bool(inner.get("boolval", False))
    if kind == "Integer":
        return int(inner.get("ival", 0))
    if kind == "String":
        return str(inner.get("sval", ""))
    return inner  # A_Star, lists: rejected by the checks that read them


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    raise Refusal(SQLSTATE.INVALID_PARAMETER_VALUE, "header requires a Boolean value",
                  "HEADER takes true or false (MATCH is for COPY FROM).")


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise Refusal(SQLSTATE.SYNTAX_ERROR, f"{name} requires a string value", f"Write {name.upper()} 'x'.")
    return value


def _check(csv: bool, delimiter: str, null: str) -> None:
    """PostgreSQL's own checks of DELIMITER and NULL (ProcessCopyOptions), same SQLSTATEs."""
    problem = None
    if len(delimiter.encode("utf-8")) != 1:
        problem = "COPY delimiter must be a single one-byte character"
    elif delimiter in "\r\n":
        problem = "COPY delimiter cannot be newline or carriage return"
    elif "\r" in null or "\n" in null:
        problem = "COPY null representation cannot use newline or carriage return"
    elif not csv and delimiter in "\\.abcdefghijklmnopqrstuvwxyz0123456789":
        problem = f'COPY delimiter cannot be "{delimiter}"'
    elif csv and delimiter == '"':
        problem = "COPY delimiter and quote must be different"
    elif csv and '"' in null:
        problem = "CSV quote character must not appear in the NULL specification"
    elif delimiter in null:
        problem = "COPY delimiter must not appear in the NULL specification"
    if problem is not None:
        raise Refusal(SQLSTATE.INVALID_PARAMETER_VALUE, problem, _OPTIONS_HINT)
