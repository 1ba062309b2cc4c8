"""The function allowlist of statements dpproxy passes to the backend (catalog queries, post-processing)."""

from __future__ import annotations

import re
from typing import Any

from policies.errors import SQLSTATE, Refusal

from .catalog import (
    NEUTRALISED_FUNCTIONS, SAFE_SETTINGS, VALUE_CAST_TYPES, allowed_function, ascii_safe_encoding, exact_floats,
    refused_function_reason, value_function,
)
from .statements import Statement

__all__ = ["catalog_function_refusal", "check_functions", "check_value_expressions", "inexact_floats", "nodes_of",
           "unsafe_client_encoding"]


# Column names that are also names of harmless (type conversion, formatting) functions: a
# reference ``x.oid`` stays allowed although PostgreSQL would call oid(x) if x had no column oid.
HARMLESS_FIELD_FUNCTIONS = frozenset({
    "oid", "name", "abbrev", "age", "text", "date", "time", "timestamp", "timestamptz", "timetz",
    "interval", "int2", "int4", "int8", "float4", "float8", "numeric", "bool", "char", "varchar",
    "bpchar", "money", "inet", "cidr", "macaddr", "bit", "varbit", "xid", "xid8", "regclass",
})
# Of those, the names whose function is harmless on a relation's whole row (``rel.age``: rel's
# column, or age(record), which does not exist) but not on a value: ``(datfrozenxid).age`` is
# age(xid), the transactions begun since that xid, a counter that moves with every write
# transaction on the server (an INSERT into a protected table included), as txid_current() does.
_WHOLE_ROW_ONLY_FIELD_FUNCTIONS = frozenset({"age"})
_RELEASE_COLUMN = re.compile(r"_(dp|k)[0-9]+")


def check_functions(statement: Statement, function_names: frozenset[str] | None = None) -> None:
    """Refuse a statement that calls a function off the passthrough allowlist, or an unsafe set_config().

    Attribute notation calls functions too: ``('...'::text).ts_stat`` is ``ts_stat('...')``
    and ``('t'::regclass).pg_relation_size`` is ``pg_relation_size('t')`` (a field name that
    is no column of its value is looked up as a function). So a name after a dot must be an
    allowlisted function (not a neutralised one: only FuncCalls are replaced), a harmless
    column-and-function name, or no function of the backend's (``function_names``, every
    pg_proc name); without that list (None), only the release columns ``_dpN``/``_kN`` of
    post-processing are accepted. ``age`` after a parenthesised value (``(xmin).age``) is
    refused: on an xid it reads the server's transaction counter.
    """
    for name in statement.references.fields:
        on_a_value = name in _WHOLE_ROW_ONLY_FIELD_FUNCTIONS and name in statement.references.value_fields
        if name in NEUTRALISED_FUNCTIONS or on_a_value or not (
            allowed_function(name)
            or name in HARMLESS_FIELD_FUNCTIONS
            or (function_names is not None and name not in function_names)
            or (function_names is None and _RELEASE_COLUMN.fullmatch(name))
        ):
            raise Refusal(
                SQLSTATE.INSUFFICIENT_PRIVILEGE,
                f'"{name}" after a dot may call function {name}() (attribute notation), which is not '
                "available through dpproxy (rule: function-allowlist)",
                "Write function calls as f(x); field notation x.f is for columns.",
                "function-allowlist",
            )
    for name in statement.references.functions:
        if not allowed_function(name):
            raise Refusal(
                SQLSTATE.INSUFFICIENT_PRIVILEGE,
                f"function {name}() is not available through dpproxy: {refused_function_reason(name)} "
                "(rule: function-allowlist)",
                "Catalog queries may call the catalog, string, array and formatting functions on "
                "dpproxy's allowlist; relation and database sizes answer NULL.",
                "function-allowlist",
            )
        if name.removeprefix("pg_catalog.") == "set_config":
            _check_set_config(statement.node)


def catalog_function_refusal(name: str, table: str | None = None) -> Refusal:
    """The refusal of a catalog helper (allowlisted for catalog statements, not a value function)
    in a statement on a protected table: over a release it looks the catalog up by a released number."""
    where = f"in a statement on protected table {table}" if table is not None else "over a DP answer"
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"function {name}() reads the catalog; it is not allowed {where} (rule: function-allowlist)",
        "Post-processing of a DP answer may use value functions only: arithmetic, rounding, string, date/time, "
        "JSON and array formatting, CASE/COALESCE/NULLIF/GREATEST/LEAST and casts to value types; "
        "query the catalog in a statement of its own.",
        "function-allowlist",
    )


def check_value_expressions(statement: Statement) -> None:
    """Refuse, in a DP statement's post-processing (``statement``: its outer statement), what is
    no value expression: a cast to a type outside ``VALUE_CAST_TYPES`` (``count(*)::regclass``
    names the relation whose OID the noise gave), attribute notation of a catalog helper or of
    such a type (``(count(*)::oid).pg_get_userbyid``, ``(count(*)).regclass``), and a
    ``format()`` whose width or format string an argument gives (``format('%*s', n, 'x')``:
    an output as long as the released n) or a replace() that lengthens (nested, each multiplies
    the size by how often the released digits match). Decided by the text alone, before any charge."""
    for name in sorted(statement.references.fields):
        if name in _SYSTEM_TYPE_FIELDS:
            raise _cast_refusal(f"{name} (attribute notation)")
        if allowed_function(name) and not value_function(name):
            raise catalog_function_refusal(name)
    for names in _cast_types(statement.node):
        if names[-1] not in VALUE_CAST_TYPES or names[:-1] not in ([], ["pg_catalog"]):
            raise _cast_refusal(".".join(names))
    for call in _function_calls(statement.node, "format"):
        pattern = _literal_text(call, 0)
        if pattern is None or "*" in pattern:
            raise _sized_output("format() with a width taken from an argument (*), or a format string that is not "
                                "a literal,", "write the width in the format string (format('%10s', ...))")
    for call in _function_calls(statement.node, "replace"):
        old, new = _literal_text(call, 1), _literal_text(call, 2)
        if old is None or new is None or len(new) > len(old):
            raise _sized_output("replace() whose replacement is longer than the text it replaces, or not a literal,",
                                "replace a literal by one no longer (replace(x::text, '.', ','))")


def _literal_text(call: dict[str, Any], position: int) -> str | None:
    """The string literal a FuncCall has as its argument at ``position``, or None."""
    args = call.get("args") or []
    if len(args) <= position:
        return None
    value = args[position].get("A_Const", {}).get("sval", {}).get("sval")
    return value if isinstance(value, str) else None


def _sized_output(what: str, instead: str) -> Refusal:
    """The refusal of a call whose output a released value could make as long as it is large."""
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{what} is not allowed over a DP answer (rule: sized-output)",
        f"A released value would decide how long the answer is; {instead}, or do it in the client. "
        "Post-processing may not multiply the size of a released value.",
        "sized-output",
    )


def _cast_refusal(type_name: str) -> Refusal:
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"a cast to {type_name} is not allowed over a DP answer (rule: value-types)",
        "Post-processing may cast to value types only: " + ", ".join(sorted(VALUE_CAST_TYPES)) +
        " (and arrays of them); oid and the reg* types would look the catalog up by a released number.",
        "value-types",
    )


# Field names that are casts to a system identifier type in attribute notation (``(x).oid`` is oid(x)).
_SYSTEM_TYPE_FIELDS = frozenset({"oid", "regclass", "xid"})


def _cast_types(node: Any) -> list[list[str]]:
    """The type names (their dotted parts) of every cast in a pglast JSON tree."""
    return [[part["String"]["sval"] for part in cast["typeName"]["names"]] for cast in nodes_of(node, "TypeCast")]


def _check_set_config(node: Any) -> None:
    """set_config(name, ...) is a SET: only for safe settings named by a literal."""
    for call in _function_calls(node, "set_config"):
        args = call.get("args") or []
        first = args[0].get("A_Const", {}).get("sval", {}).get("sval") if args else None
        if first is None or first.lower() not in SAFE_SETTINGS:
            raise Refusal(
                SQLSTATE.INSUFFICIENT_PRIVILEGE,
                f"set_config() of {first or 'a computed name'} is not allowed (rule: safe-settings)",
                "Only presentation and session settings may be changed: " + ", ".join(sorted(SAFE_SETTINGS)),
                "safe-settings",
            )
        second = args[1].get("A_Const", {}).get("sval", {}).get("sval") if len(args) > 1 else None
        if not exact_floats(first, second):
            raise inexact_floats()
        if first.lower() == "client_encoding" and not ascii_safe_encoding(second):
            raise unsafe_client_encoding(second)
        if first.lower() == "transaction_isolation" and not _is_true(args[2] if len(args) > 2 else None):
            # For the session (is_local false) it would stay on the backend connection with
            # source 'session', which nothing clears (see classify._TRANSACTION_SCOPED).
            raise Refusal(
                SQLSTATE.INSUFFICIENT_PRIVILEGE,
                "set_config() of transaction_isolation for the session is not allowed (rule: safe-settings)",
                "Use SET TRANSACTION ISOLATION LEVEL ... in the transaction, or set_config(..., true).",
                "safe-settings",
            )


def _is_true(arg: Any) -> bool:
    """Whether ``arg`` is the literal boolean true."""
    return bool(isinstance(arg, dict) and arg.get("A_Const", {}).get("boolval", {}).get("boolval") is True)


def _function_calls(node: Any, name: str) -> list[dict[str, Any]]:
    """The FuncCall nodes of a pglast JSON tree that call ``name`` (any schema)."""
    return [call for call in nodes_of(node, "FuncCall") if call["funcname"][-1]["String"]["sval"] == name]


def nodes_of(node: Any, kind: str) -> list[dict[str, Any]]:
    """Every node of ``kind`` (``FuncCall``, ``TypeCast`` ...) in a pglast JSON tree."""
    found: list[dict[str, Any]] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if kind in item:
                found.append(item[kind])
            stack.extend(v for v in item.values() if isinstance(v, (dict, list)))
    return found


def inexact_floats() -> Refusal:
    """The refusal of an extra_float_digits below 1."""
    return Refusal(
        SQLSTATE.INVALID_PARAMETER_VALUE,
        "extra_float_digits below 1 is not allowed through dpproxy (rule: exact-floats)",
        "Rounded float output would weaken the noise on float aggregates; use 1, 2 or 3 (1 is PostgreSQL's default).",
        "exact-floats",
    )


def unsafe_client_encoding(value: str | None) -> Refusal:
    """The refusal of a client_encoding in which PostgreSQL would read dpproxy's UTF-8 text otherwise."""
    shown = f'"{value}"' if value is not None else "a computed or bound value"
    return Refusal(
        SQLSTATE.INVALID_PARAMETER_VALUE,
        f"client_encoding {shown} is not allowed through dpproxy (rule: client-encoding)",
        "dpproxy reads queries as UTF-8; use UTF8. In SJIS, BIG5, GBK, GB18030, UHC and JOHAB a "
        "character can end in an ASCII byte, so PostgreSQL would read another statement; EUC_TW has no "
        "codec dpproxy could read it with; in EUC_JP, EUC_JIS_2004 and EUC_KR dpproxy's codecs read some "
        "characters as others than PostgreSQL does.",
        "client-encoding",
    )
