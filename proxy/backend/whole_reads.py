"""What a protected view's or policy's own conditions, keys and aggregates read of a value of any length.

PostgreSQL reads a value a view's WHERE or join condition compares (``note > ''``), a GROUP BY,
DISTINCT, ORDER BY or PARTITION BY key sorts or hashes, a UNION without ALL deduplicates, an
aggregate folds (``max(note)``, ``count(DISTINCT note)``), a subquery's condition tests or a
row-level security policy's USING reads whole, for every row the view reads, once a statement and
before the analyst's conditions: with no bound, one row's long value (3.2 MB: ~400 buffers more)
made every statement on the view measurably slower, a timing oracle on that row's presence
(docs/threat-model.md, "A protected view's column is the stored value").
:mod:`proxy.backend.row_failures` refuses such a view, as it refuses one whose output column is
computed from such a value; this module finds the reads in a stored parse tree, as its scan walks
it (:func:`read_at`, :func:`settle`), and says which are bounded whatever the row holds
(:func:`unbounded`), each checked by buffer counts (tests/test_attack_stop42.py) and in
PostgreSQL's source:

* ``IS [NOT] NULL`` reads no value, ``count(note)`` asks only whether it is NULL, and
  ``octet_length`` of a text or a bytea reads its size from the header or TOAST pointer
  (``toast_raw_datum_size``), in a condition and in an output column alike (row_failures);
* ``=``, ``<>`` and ``IS DISTINCT FROM`` of text (``texteq``, under a deterministic collation) or
  bytea (``byteaeq``) weigh the two sizes first and read the value only when they are equal:
  against a literal of at most the table's ``max_text_bytes``, they read at most that; so does
  such an equality of ``COALESCE(note, other)`` or a CASE's result (one of the values reaches it,
  as it is), and ``NULLIF(note, 'x')`` under ``IS [NOT] NULL`` or compared (its result, the value
  as it is, is read again by the comparison above it: ``NULLIF(note, 'x') = 'y'`` is bounded by
  both literals, ``NULLIF(note, 'x') > ''`` is not); and against ``CAST(current_user AS text)``, a
  name's text, as against a literal of a name's 63 bytes (:data:`_NAME_TO_TEXT`). Not ``IN (...)``
  (hashed from nine literals on, which reads the value whole), nor ``=`` of a text and a ``name``
  (``note = current_user``: ``texteqname`` reads the text whole before it compares, :data:`_WHY_FUNCTION`);
* a column of a declared size holds at most that many bytes (``rewriter.text_bounds.declared_size``:
  ``4·n`` for a ``varchar(n)`` or ``char(n)``, ``numeric(p, s)`` by its precision, ``bit(n)``, the
  ranges of fixed-size bounds: ``int4range``, ``daterange``, ``int8range``, ``tsrange``,
  ``tstzrange``): within ``max_text_bytes``, any read of it is bounded. A domain over one, an
  unconstrained numeric and ``numrange`` (whose bounds are numerics of any length) are refused.

An output column that passes the stored value on is no read here (the row_failures scan judges
output columns); it is one when it is also a sort or group key. A whole row is built, fetching
each of its values stored apart, whatever reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

from rewriter.text_bounds import declared_size

from .fetches import Fetches

__all__ = ["CALLS", "LISTS", "ONCE_PER_ROW", "PASSED_ON", "SIZE_ONLY", "TYPE_LENGTHS", "ReadCatalog", "TreeWalk",
           "ValueRead", "column_of", "read_at", "read_catalog", "read_whole", "settle", "unbounded", "value_of"]

# Nodes that call a function: the field that names it.
CALLS = {"OPEXPR": "opfuncid", "DISTINCTEXPR": "opfuncid", "NULLIFEXPR": "opfuncid",
          "SCALARARRAYOPEXPR": "opfuncid", "FUNCEXPR": "funcid", "AGGREF": "aggfnoid", "WINDOWFUNC": "winfnoid"}

# Where a node hands a column's stored value on as it is (a binary-compatible cast, a COLLATE, a
# CASE's or COALESCE's result, not its condition or CASE x's x): an output column of only these
# over a VAR is the stored value, read as dpproxy reads a table's. (node, the field it is under)
PASSED_ON = frozenset({("RELABELTYPE", "arg"), ("COLLATEEXPR", "arg"), ("CASEWHEN", "result"), ("CASEEXPR", "args"),
                        ("CASEEXPR", "defresult"), ("COALESCEEXPR", "args")})
# Nodes whose arguments are read once per row of a query computed before its outputs are read.
ONCE_PER_ROW = frozenset({"AGGREF", "WINDOWFUNC"})

# How long a value of each type a view column is computed from, or a view reads, is: -1 (or -2)
# for any length; and the type's name.
TYPE_LENGTHS = """
SELECT t.oid, t.typlen, pg_catalog.format_type(t.oid, NULL) FROM pg_catalog.pg_type t
WHERE t.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
"""

# The collations whose equality weighs sizes first (a nondeterministic one compares every value whole).
_DETERMINISTIC = """
SELECT c.oid FROM pg_catalog.pg_collation c
WHERE c.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) AND c.collisdeterministic
"""

# The columns of the tables whose row-level security policies read a value, by number.
_COLUMNS = """
SELECT a.attrelid, a.attnum, a.attname::pg_catalog.text FROM pg_catalog.pg_attribute a
WHERE a.attrelid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) AND a.attnum OPERATOR(pg_catalog.>) 0
"""

# Calls that read a value of any length no further than its size, which PostgreSQL takes from the
# value's header or TOAST pointer (toast_raw_datum_size): octet_length, and count of a value, which
# asks only whether it is NULL.
SIZE_ONLY = frozenset({"octet_length(text)", "octet_length(bytea)", 'count("any")'})
# Equalities that compare two values' sizes first and read them only when the sizes are equal
# (texteq under a deterministic collation, byteaeq): against a literal, bounded by the literal's.
_SIZES_FIRST = frozenset({"texteq(text, text)", "textne(text, text)", "byteaeq(bytea, bytea)",
                          "byteane(bytea, bytea)"})
# The 4-byte header declared_size counts in, which the read of the value's data does not.
_VARHDRSZ = 4


# Lists of scalars a scan keeps (a range table entry's column names, a set operation's column types).
LISTS = frozenset({"colnames", "colTypes", "colTypmods"})


@dataclass(frozen=True)
class ValueRead:
    """A value a view's or policy's own condition, key or aggregate reads, not an output column it
    passes on (:func:`read_at`): the column (its name as the tree gives it, ``#n`` by number in a
    policy's bare expression), its type and typmod, where it is read (``place``), the function
    reading it (an OID; 0 for a sort, a hash or a node that calls none), and, for a call of two
    arguments whose other one is a literal, the literal's bytes and the call's collation; ``whole``: a
    whole row, which PostgreSQL builds (fetching each of its values stored apart) whatever reads it."""

    column: str
    type: int
    typmod: int
    place: str
    function: int = 0
    literal: int | None = None
    collation: int = 0
    whole: bool = False


class TreeWalk:
    """The state of one scan that outlives a node: each query's range table as far as it is read
    (the names of its entries' columns, for naming what a VAR reads), the reads waiting for the node
    that reads them to end (its arguments are known only then), and the values under each sort or
    group entry (``TARGETENTRY``), by the ``id`` of the node's fields."""

    def __init__(self) -> None:
        self.rtables: list[list[tuple[str, list[str]]]] = []
        self.pending: dict[int, list[ValueRead]] = {}
        self.keys: dict[int, list[ValueRead]] = {}
        self.reads: list[ValueRead] = []


def value_of(tag: str, fields: Mapping[str, str]) -> tuple[int, int] | None:
    """The type and typmod of the value a node stands for, when it is a column's: a VAR's, or a
    PARAM that is a subquery's output column (``x IN (SELECT v ...)`` compares ``v`` by it)."""
    if tag == "VAR":
        kind, typmod = fields.get("vartype", ""), fields.get("vartypmod", "-1")
    elif tag == "PARAM" and fields.get("paramkind") == "2":
        kind, typmod = fields.get("paramtype", ""), fields.get("paramtypmod", "-1")
    else:
        return None
    return (int(kind), int(typmod) if typmod.lstrip("-").isdigit() else -1) if kind.isdigit() else None


def column_of(tag: str, fields: Mapping[str, str], walk: TreeWalk) -> str:
    """A VAR's column by the name its range table entry gives it (the entry's for a whole row),
    ``#n`` where the tree has no range table (a policy's expression: its table's column n)."""
    if tag != "VAR":
        return "a subquery's output column"
    number, up, attribute = (int(fields.get(name, "0")) if fields.get(name, "").lstrip("-").isdigit() else -1
                             for name in ("varno", "varlevelsup", "varattno"))
    if not walk.rtables:
        return f"#{attribute}"
    if 0 <= up < len(walk.rtables) and 1 <= number <= len(rtable := walk.rtables[-1 - up]):
        entry, columns = rtable[number - 1]
        return columns[attribute - 1] if 1 <= attribute <= len(columns) else entry
    return "a column"


def settle(tag: str, fields: dict[str, str], stack: list[tuple[str, dict[str, str]]], walk: TreeWalk) -> None:
    """What a node's end settles: the reads of a node that reads a value (now that its arguments are
    known), a sort or group entry's keys, a range table entry's column names, a set operation's
    comparisons, and what its parent learns of it (its arguments, a literal among them)."""
    reads = walk.pending.pop(id(fields), [])
    called, collation = fields.get(CALLS.get(tag, ""), ""), fields.get("inputcollid", "0")
    # An operator of one value and one literal: what a comparison that weighs sizes first is bounded
    # by. The value may come through COALESCE or CASE results (several reads, one value compared:
    # what reaches the operator is one of them, as it is). Not NULLIF but under IS [NOT] NULL (its
    # result is the value, read again above); nor x IN (...) (a SCALARARRAYOPEXPR), which
    # PostgreSQL hashes, reading the value whole, from nine literals on.
    literal = int(fields["_literal"]) if _compares(tag, stack) and fields.get("_args") == "2" \
        and "_literal" in fields else None
    walk.reads.extend(ValueRead(read.column, read.type, read.typmod, read.place, int(called) if called.isdigit() else 0,
                            literal, int(collation) if collation.isdigit() else -1, read.whole) for read in reads)
    if tag == "NULLIFEXPR" and stack and stack[-1][0] in _COMPARISONS:
        # Its result is its first argument as it is (not a copy the equality read): the comparison
        # above reads the value again, as that comparison does.
        walk.pending.setdefault(id(stack[-1][1]), []).extend(reads)
    keys = walk.keys.pop(id(fields), ())
    if tag == "TARGETENTRY" and fields.get("ressortgroupref", "0") != "0":
        place = _KEY if stack and stack[-1][0] == "QUERY" else "an aggregate's DISTINCT or ORDER BY"
        walk.reads.extend(ValueRead(key.column, key.type, key.typmod, place) for key in keys)
    elif tag == "SETOPERATIONSTMT" and fields.get("all") != "true":
        types = [t for t in fields.get("_colTypes", "").split("\0") if t.isdigit()]
        typmods = [t for t in fields.get("_colTypmods", "").split("\0") if t.lstrip("-").isdigit()]
        walk.reads.extend(ValueRead(f"its column {number}", int(kind), int(typmods[number - 1]) if number <= len(typmods)
                                else -1, "a UNION, INTERSECT or EXCEPT without ALL")
                          for number, kind in enumerate(types, 1))
    elif tag == "QUERY" and walk.rtables:
        walk.rtables.pop()
    elif tag == "ALIAS" and stack and stack[-1][0] == "RANGETBLENTRY" and fields.get("_in") == "eref":
        stack[-1][1]["_name"] = re.sub(r"\\(.)", r"\1", fields.get("aliasname", "?"))
        stack[-1][1]["_columns"] = fields.get("_colnames", "")
    elif tag == "RANGETBLENTRY" and walk.rtables:
        walk.rtables[-1].append((fields.get("_name", "?"), [re.sub(r"\\(.)", r"\1", name[1:-1])
                                                            for name in fields.get("_columns", "").split("\0") if name]))
    if stack and fields.get("_in") == "args":
        above = stack[-1][1]
        above["_args"] = str(int(above.get("_args", "0")) + 1)
        if tag == "CONST" and fields.get("constisnull") == "false" and fields.get("constlen") == "-1" and \
                fields.get("constvalue", "").isdigit():
            above["_literal"] = str(max(int(fields["constvalue"]) - 4, 0))  # its datum's size less the 4-byte header
        elif tag == "FUNCEXPR" and fields.get("funcid") == _NAME_TO_TEXT:
            above["_literal"] = str(_NAME_BYTES)  # CAST(current_user AS text): a name's text, at most 63 bytes


# text(name), the cast of a name (``CAST(current_user AS text)``) to text: its value is at most a name's
# bytes (NAMEDATALEN - 1), whatever the name, and compared with it, an equality weighing sizes first
# reads no more of the other value than a literal of that size would.
_NAME_TO_TEXT, _NAME_BYTES = "406", 63

# Operators whose result is their comparison's: an equality of a value with a literal may be bounded by it.
_COMPARISONS = frozenset({"OPEXPR", "DISTINCTEXPR"})
_KEY = "a GROUP BY, DISTINCT, ORDER BY or PARTITION BY key"
# Where in its query a value is read, by the query's field it is under.
_PLACES = {"jointree": "a WHERE or JOIN condition", "havingQual": "HAVING", "rtable": "a FROM item",
           "windowClause": "a window", "cteList": "a WITH query"}


def _compares(tag: str, stack: list[tuple[str, dict[str, str]]]) -> bool:
    """Whether a node (``stack``: the nodes above it) reads what it calls on only as far as that
    call reads it: a comparison (:data:`_COMPARISONS`), or a NULLIF whose result only an
    ``IS [NOT] NULL`` tests (which reads no value) or a comparison compares (which :func:`settle`
    judges again as reading the value NULLIF returns, as it is); any other use reads that value."""
    return tag in _COMPARISONS or (tag == "NULLIFEXPR" and bool(stack) and stack[-1][0] in ("NULLTEST", *_COMPARISONS))


def read_at(value: tuple[int, int], column: str, whole: bool, within: str, stack: list[tuple[str, dict[str, str]]],
             walk: TreeWalk) -> None:
    """Note a value (``value``: its type and typmod) a view's or policy's own conditions, keys or
    aggregates read, for the node that reads it (the first above that does not pass it on,
    :data:`PASSED_ON`), which settles at its end whether the read is bounded whatever the row
    holds (:func:`settle`). An output column's value is judged by row_failures' scan, and as a
    key when its entry is one; ``IS [NOT] NULL`` reads no value, a join's alias list none either.
    A whole row (``whole``) is built, fetching each value stored apart, whatever reads it."""
    place = "its expression"  # a bare expression: a policy's USING
    for depth in range(len(stack) - 1, -1, -1):
        above = stack[depth][0]
        if above == "TARGETENTRY" and depth and stack[depth - 1][0] == "QUERY":
            walk.keys.setdefault(id(stack[depth][1]), []).append(ValueRead(column, *value, ""))
            return
        if above in ONCE_PER_ROW:
            place = "an aggregate or window function"
            break
        if above == "QUERY":
            place = _PLACES.get(stack[depth + 1][1].get("_in", "") if depth + 1 < len(stack) else "", "its query")
            break
    for depth in range(len(stack) - 1, -1, -1):
        above, above_fields = stack[depth]
        if above == "RANGETBLENTRY" and within == "joinaliasvars":
            return
        if above == "RANGETBLENTRY" and within == "groupexprs":  # PostgreSQL 18's GROUP BY entry
            place = _KEY
        if above == "TARGETENTRY":  # an aggregate's argument: a key of its DISTINCT or ORDER BY too
            walk.keys.setdefault(id(above_fields), []).append(ValueRead(column, *value, ""))
        elif whole or (above, within) not in PASSED_ON:
            if above != "NULLTEST" or whole:
                walk.pending.setdefault(id(above_fields), []).append(ValueRead(column, *value, place, whole=whole))
            return
        within = above_fields.get("_in", "")


@dataclass(frozen=True)
class ReadCatalog:
    """What the catalog says of the functions, types and collations a relation's trees use."""

    functions: Mapping[int, tuple[str, bool, bool, bool]]
    any_length: Mapping[int, str]
    deterministic: frozenset[int]
    columns: Mapping[tuple[int, int], str]


def unbounded(read: ValueRead, catalog: ReadCatalog, most: int) -> bool:
    """Whether ``read`` may read more than ``most`` bytes of a value, whatever the row holds: a
    value of a type of any length, unless its declared size is within ``most``, or it is read only
    as far as its size (:data:`SIZE_ONLY`), or compared by an equality that weighs sizes first
    (:data:`_SIZES_FIRST`) with a literal of at most ``most`` bytes under a deterministic collation. A
    whole row is read whole whatever reads it: PostgreSQL builds it (``ExecEvalWholeRowVar``), fetching
    each of its values stored apart, before ``count(b)`` asks whether it is NULL."""
    if read.type not in catalog.any_length:
        return False
    if read.whole:
        return True
    declared = declared_size(read.type, read.typmod)
    if declared is not None and declared - _VARHDRSZ <= most:
        return False
    name = catalog.functions.get(read.function, ("",))[0] if read.function else ""
    if name in SIZE_ONLY:
        return False
    return not (name in _SIZES_FIRST and read.literal is not None and read.literal <= most
                and (read.collation == 0 or read.collation in catalog.deterministic))


async def read_catalog(session: Fetches, types: set[int], reads: list[ValueRead], tables: set[int],
                       functions: Mapping[int, tuple[str, bool, bool, bool]]) -> ReadCatalog:
    """What the catalog says of ``types`` (those output columns are computed from) and ``reads``:
    which of their types are of any length, which of their collations deterministic, and the
    columns of ``tables`` (the policies' tables whose expressions read a value); ``functions``,
    each called function's signature and kind, as :mod:`proxy.backend.row_failures` reads them."""
    kinds = sorted(types | {read.type for read in reads})
    any_length = {int(oid): str(name) for oid, length, name in await session.fetch_all(TYPE_LENGTHS, (kinds,))
                  if int(length) < 0} if kinds else {}
    collations = sorted({read.collation for read in reads if read.collation > 0})
    deterministic = frozenset(int(oid) for oid, in await session.fetch_all(_DETERMINISTIC, (collations,))
                              ) if collations else frozenset()
    columns = {(int(table), int(number)): str(name) for table, number, name in await session.fetch_all(
        _COLUMNS, (sorted(tables),))} if tables else {}
    return ReadCatalog(functions, any_length, deterministic, columns)


_WHY_ANY_LENGTH = {3906: "a numrange's bounds are numerics of any length; an int4range, int8range, daterange, "
                         "tsrange or tstzrange has bounds of a fixed size, and any read of it is bounded"}
"""Why a type that reads like one of a fixed size is of any length, where that is not plain (by OID)."""


_WHY_FUNCTION = {signature: "= or <> of a text and a name (as note = current_user) reads the text whole before "
                               "comparing (texteqname: a 3.2 MB value stored apart, +407 buffers; compressed, "
                               "decompressed whole); write note = CAST(current_user AS text), which weighs the sizes "
                               "first (a name's text is at most 63 bytes), or compare current_user with a name column "
                               "or one of a declared size within max_text_bytes (varchar(63))"
                  for signature in ("texteqname(text, name)", "textnename(text, name)", "nameeqtext(name, text)",
                                    "namenetext(name, text)")}
"""Why a comparison that reads like one weighing sizes first reads the value whole (by signature)."""


def read_whole(where: str, read: ValueRead, catalog: ReadCatalog, table: int | None) -> str:
    """What ``where`` reads whole, and where: ``view v reads note (text) whole in a WHERE or JOIN condition``."""
    column = read.column
    if column.startswith("#") and column[1:].isdigit() and table is not None:
        column = catalog.columns.get((table, int(column[1:])), column)
    place = "its USING" if where.startswith("row-level security policy") else read.place
    why = _WHY_ANY_LENGTH.get(read.type) or _WHY_FUNCTION.get(
        catalog.functions.get(read.function, ("",))[0] if read.function else "")
    return f"{where} reads {column} ({catalog.any_length[read.type]}) whole in {place}" + (f" ({why})" if why else "")


