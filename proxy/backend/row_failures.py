"""Whether reading a protected relation can fail on some row's values.

A protected *view* computes its columns and filters its rows while the backend reads them, and so
does a row-level security policy's ``USING`` expression. If such an expression can raise on a
row's values (``income / hours`` on a row whose hours are 0, an integer overflow, ``t::int`` of a
text that is no number, a scalar subquery that finds two rows, a ``LIKE`` pattern), every DP query
that reaches such a row fails: whether ``SELECT SUM(hourly) FROM v WHERE id = 7`` fails tells,
exactly and whatever the noise, whether row 7 holds hours 0. The analyst's WHERE is no shield:
PostgreSQL evaluates a view's expressions only on the rows it reads and orders quals as it likes.

``serve``, a reload and ``check-config`` therefore refuse a protected relation that reads through
an expression dpproxy cannot show to be total, naming it; the periodic re-check finds a view
redefined since (``CREATE OR REPLACE VIEW``) and its statements are refused before the charge
until a reload. The check reads PostgreSQL's own stored parse trees (``pg_rewrite.ev_action``,
``pg_policy.polqual``: the planner's input, not the view's text) of every view and policy the
relation reads through, transitively (a view of a view, an inheritance child's policies); a
materialized view's expressions ran when it was refreshed, not when it is read, and a foreign
table's rows are computed by its server, out of sight (refused), as are a table's or materialized
view's stored through a table access method whose handler is not heap's (an extension's columnar
store: what one row's value costs it to read, or whether it fails on it, was never measured). PostgreSQL 18's virtual
generated columns (its default kind) are computed when a statement reads them: their
expressions (``pg_attrdef.adbin``) are checked like a view's, every one of the table's, declared in
the policy or not (tests/test_attack_newer_servers.py, on 18). A stored generated column is computed
when its row is written, and read as stored. Every node must
be one that cannot raise, and every function a built-in one (initdb's: a user's ``abs(numeric)``
in a schema of its own, or an operator a user declares the negator of ``=``, is not) and one of:

* a comparison of a built-in btree operator family (=, <, <=, >, >=) or its negator (<>): such
  comparisons define a total order and never fail on a value of their types. Not the polymorphic
  ones of arrays and rows (``anyarray``, ``record``): they look up their elements' comparison only
  when the values come to need it, so ``a <> b`` of two ``(k int, p point)`` values fails exactly
  when their ``k`` are equal, and ``a = b`` of two ``point[]`` when their sizes are. The same holds
  of the operators a sort, ``DISTINCT``, ``GROUP BY`` or ``UNION`` use (``SortGroupClause``), and
  of a window's ``RANGE`` offset (its ``in_range`` function adds the offset to a row's value, and
  ``timestamp + '7 days'`` overflows);
* a function in ``TOTAL_FUNCTIONS`` below, each total on every value of its argument types;
* an aggregate in ``TOTAL_AGGREGATES`` (a per-person view such as ``SELECT id, COUNT(*) ...
  GROUP BY id`` is how a policy protects people with several rows), ``min``/``max`` of any type
  but an array.

Anything else (arithmetic, which overflows; casts from text; functions not built in, whose
bodies dpproxy cannot read; a recursive ``WITH``, which runs as long as the rows' chains are
and forever on a cycle) is a problem, with the fix: compute the column into a table or
a materialized view (which fails at refresh, before any analyst asks), or leave it out.

So is a view's output column computed from a value of a type of any length (``btrim(note)``,
``length(note)``, ``payload::text``; not ``octet_length(note)``, which reads its size alone from the
header or TOAST pointer, nor ``NULLIF(note, 'x') IS NULL`` or ``note = 'x'``, which weigh the sizes
first and read no more than the literal's, :class:`_OutputRead`), total or not: PostgreSQL flattens the view into the
statement, so the column is computed again at each reference, reading the base value whole each
time, and dpproxy's value bound and stored-form check (rewriter/text_bounds.py) see only the
computed value's header, after the read: one row's long value, or one stored apart, made every
term slower (docs/threat-model.md, "A protected view's column is the stored value"). A rename, a
binary-compatible cast and ``COLLATE`` pass the stored value on; an aggregate's arguments are read
once a row (:func:`_computed_from`). PostgreSQL 18's virtual generated column is computed at each
reference as such an output column is, and judged the same way.

And so is a view's or policy's own condition, key or aggregate that reads such a value whole
(``WHERE note > ''``, ``GROUP BY note``, ``max(note)``, a policy's ``USING (note > '')``), once a
statement but with no bound, unless the read is bounded whatever the row holds (``note = 'x'``,
``IS NULL``, ``count(note)``): :mod:`proxy.backend.whole_reads` finds them as the scan walks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator, Mapping

from policies.tables import Relation

from .fetches import Fetches
from .whole_reads import (CALLS, LISTS, ONCE_PER_ROW, PASSED_ON, TreeWalk, ValueRead, column_of, read_at,
                          read_catalog, read_whole, settle, unbounded, value_of)

__all__ = ["TOTAL_FUNCTIONS", "TOTAL_AGGREGATES", "failing_protected", "fallible_protected"]

# Nodes that compute nothing that can fail themselves (their children are checked on their own).
_STRUCTURAL = frozenset({
    "QUERY", "RANGETBLENTRY", "RTEPERMISSIONINFO", "ALIAS", "FROMEXPR", "JOINEXPR", "RANGETBLREF", "TARGETENTRY",
    "VAR", "CONST", "PARAM", "RELABELTYPE", "BOOLEXPR", "NULLTEST", "BOOLEANTEST", "CASEEXPR", "CASEWHEN",
    "CASETESTEXPR", "COALESCEEXPR", "ROWEXPR", "SETOPERATIONSTMT", "FIELDSELECT", "SQLVALUEFUNCTION",
    "RANGETBLFUNCTION", "GROUPINGSET", "GROUPINGFUNC", "NAMEDARGEXPR", "COLLATEEXPR", "CONVERTROWTYPEEXPR",
    "ARRAYCOERCEEXPR",
})
# GREATEST/LEAST compare with their type's btree comparison, total but for an anonymous row's
# (record, record[]): PostgreSQL checks its fields' comparisons only when two rows need them.
_RECORD_TYPES = frozenset({"2249", "2287"})
# Nodes that may call a function or an operator (a sort's, a window RANGE offset's) besides what
# their children call: the fields that name them, 0 when none.
_OPTIONAL_CALLS = {"WINDOWCLAUSE": ("startInRangeFunc", "endInRangeFunc")}
_OPTIONAL_OPERATORS = {"SORTGROUPCLAUSE": ("eqop", "sortop")}
# EXISTS, ALL and ANY subqueries: a scalar subquery (EXPR) fails when it finds two rows.
_TOTAL_SUBLINKS = frozenset({"0", "1", "2"})
# A conversion through text output is total when its result is text; from text, an input function is not.
_TEXT_TYPES = frozenset({"25", "1043"})

TOTAL_FUNCTIONS = frozenset({
    # Widening casts: every value of the argument type is a value of the result type.
    "int4(smallint)", "int8(smallint)", "int8(integer)",
    "numeric(smallint)", "numeric(integer)", "numeric(bigint)",
    "float8(smallint)", "float8(integer)", "float8(bigint)", "float8(real)",
    "float4(smallint)", "float4(integer)", "float4(bigint)",  # rounded, never out of range
    "text(character)", "text(boolean)", "text(name)",
    "date(timestamp without time zone)", "date(timestamp with time zone)",  # a timestamp's day is a date
    # Text functions that read any text. Not lower() or upper(): they ask for four bytes a
    # character where LC_CTYPE is not C (two under ICU), more than 1 GB for a 256 MB value.
    "length(text)", "char_length(text)", "octet_length(text)", "octet_length(bytea)",
    "btrim(text)", "ltrim(text)", "rtrim(text)",
    # Magnitudes and rounding that cannot leave their type (abs(integer) can: abs of its minimum;
    # round, ceil and floor of a numeric can: of 131072 nines and .5, one digit past its maximum).
    "abs(numeric)", "abs(double precision)", "abs(real)",
    "floor(double precision)", "ceil(double precision)", "round(double precision)",
    "numeric_uminus(numeric)", "float8um(double precision)", "float4um(real)",
    # Window functions of row positions.
    "row_number()", "rank()", "dense_rank()", "percent_rank()", "cume_dist()",
    # A window's RANGE offset of an integer column: computed in a wider type, never out of range.
    "in_range(smallint, smallint, smallint, boolean, boolean)", "in_range(integer, integer, integer, boolean, boolean)",
    "in_range(bigint, bigint, bigint, boolean, boolean)",
})
# Not sum/avg of numeric: two values of 131072 nines overflow the numeric format.
TOTAL_AGGREGATES = frozenset({
    "count()", 'count("any")', "sum(smallint)", "sum(integer)", "sum(bigint)",
    "avg(smallint)", "avg(integer)", "avg(bigint)", "bool_and(boolean)", "bool_or(boolean)", "every(boolean)",
})

# A pg_node_tree's tokens as PostgreSQL's own reader (pg_strtok) splits them: a brace or
# parenthesis, or a run of other characters where a backslash escapes the next one. A double
# quote is no delimiter: only a string's first character is escaped, so a name such as a"
# prints as `a"` (a field) or `"a""` (in a list) and must not open a string.
_TOKEN = re.compile(r'[{}()]|(?:[^\s{}()\\]|\\.)+')
_BRACKETS = frozenset("{}()")
# Comparisons (and min/max) of arrays and rows: they find their elements' comparison only when a
# value needs it, so whether they fail depends on the values.
_POLYMORPHIC = re.compile(r"\((?:anyarray|record)\b")

# Each protected root with every relation it reads at query time: inheritance children, what a
# (plain) view's rule reads and what a row-level security policy reads. A materialized view is
# read as stored; a foreign table (tree NULL) is computed by its server, out of dpproxy's sight,
# and a table or materialized view stored through a table access method whose handler is not
# heap's (tree NULL: an extension's, or a user's name for any handler) is read by code whose costs
# and failures dpproxy has not measured (docs/threat-model.md, Timing).
_READS = """
WITH RECURSIVE edges(parent, child) AS (
    SELECT i.inhparent, i.inhrelid FROM pg_catalog.pg_inherits i
    UNION ALL
    SELECT r.ev_class, d.refobjid FROM pg_catalog.pg_rewrite r
    JOIN pg_catalog.pg_class v ON v.oid OPERATOR(pg_catalog.=) r.ev_class AND v.relkind OPERATOR(pg_catalog.=) 'v'
    JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) r.oid
     AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_rewrite'::pg_catalog.regclass
     AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
     AND d.refobjid OPERATOR(pg_catalog.<>) r.ev_class
    UNION ALL
    SELECT p.polrelid, d.refobjid FROM pg_catalog.pg_policy p
    JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) p.oid
     AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_policy'::pg_catalog.regclass
     AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
     AND d.refobjid OPERATOR(pg_catalog.<>) p.polrelid
), reads(root, rel) AS (
    SELECT r, r FROM pg_catalog.unnest(%s::pg_catalog.oid[]) AS r
    UNION
    SELECT reads.root, edges.child FROM reads JOIN edges ON edges.parent OPERATOR(pg_catalog.=) reads.rel
)
SELECT reads.root, 'view ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text, r.ev_action::pg_catalog.text,
       NULL::pg_catalog.oid
FROM reads JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) reads.rel AND c.relkind OPERATOR(pg_catalog.=) 'v'
JOIN pg_catalog.pg_rewrite r ON r.ev_class OPERATOR(pg_catalog.=) c.oid
UNION ALL
SELECT reads.root, 'row-level security policy ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(p.polname::pg_catalog.text)
       OPERATOR(pg_catalog.||) ' on ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text,
       p.polqual::pg_catalog.text, c.oid
FROM reads JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) reads.rel AND c.relrowsecurity
JOIN pg_catalog.pg_policy p ON p.polrelid OPERATOR(pg_catalog.=) c.oid
 AND p.polcmd OPERATOR(pg_catalog.=) ANY('{r,*}'::pg_catalog."char"[]) AND p.polqual IS NOT NULL
UNION ALL
SELECT reads.root, 'virtual generated column ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(a.attname::pg_catalog.text)
       OPERATOR(pg_catalog.||) ' of ' OPERATOR(pg_catalog.||) a.attrelid::pg_catalog.regclass::pg_catalog.text,
       d.adbin::pg_catalog.text, NULL::pg_catalog.oid
FROM reads JOIN pg_catalog.pg_attribute a ON a.attrelid OPERATOR(pg_catalog.=) reads.rel
 AND a.attgenerated OPERATOR(pg_catalog.=) 'v' AND NOT a.attisdropped
JOIN pg_catalog.pg_attrdef d ON d.adrelid OPERATOR(pg_catalog.=) a.attrelid AND d.adnum OPERATOR(pg_catalog.=) a.attnum
UNION ALL
SELECT reads.root, 'foreign table ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text, NULL, NULL
FROM reads JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) reads.rel AND c.relkind OPERATOR(pg_catalog.=) 'f'
UNION ALL
SELECT reads.root, 'table ' OPERATOR(pg_catalog.||) c.oid::pg_catalog.regclass::pg_catalog.text
       OPERATOR(pg_catalog.||) ' (access method ' OPERATOR(pg_catalog.||) pg_catalog.quote_ident(m.amname::pg_catalog.text)
       OPERATOR(pg_catalog.||) ')', NULL, NULL
FROM reads JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) reads.rel
 AND c.relkind OPERATOR(pg_catalog.=) ANY('{r,m}'::pg_catalog."char"[])
JOIN pg_catalog.pg_am m ON m.oid OPERATOR(pg_catalog.=) c.relam
 AND m.amhandler OPERATOR(pg_catalog.<>) 'pg_catalog.heap_tableam_handler'::pg_catalog.regproc
ORDER BY 1, 2
"""

# For each function: its signature (schema-qualified unless built in), whether it is built in
# (an OID below FirstNormalObjectId: initdb's, not an extension's or a user's, whatever its schema
# or name), whether it is a built-in btree comparison (or the negator of one; the operator built
# in too, as a user's operator may name any function and any negator), and whether it is a
# built-in min/max aggregate.
_FUNCTIONS = """
SELECT f.oid, CASE WHEN f.oid OPERATOR(pg_catalog.<) 16384 THEN '' ELSE pg_catalog.quote_ident(n.nspname)
       OPERATOR(pg_catalog.||) '.' END OPERATOR(pg_catalog.||) f.proname::pg_catalog.text OPERATOR(pg_catalog.||) '('
       OPERATOR(pg_catalog.||) pg_catalog.pg_get_function_identity_arguments(f.oid) OPERATOR(pg_catalog.||) ')',
       f.oid OPERATOR(pg_catalog.<) 16384,
       f.oid OPERATOR(pg_catalog.<) 16384 AND EXISTS (
           SELECT FROM pg_catalog.pg_operator o
           JOIN pg_catalog.pg_amop a ON a.amopopr OPERATOR(pg_catalog.=) ANY(ARRAY[o.oid, o.oprnegate])
           JOIN pg_catalog.pg_am m ON m.oid OPERATOR(pg_catalog.=) a.amopmethod AND m.amname OPERATOR(pg_catalog.=) 'btree'
           WHERE o.oprcode OPERATOR(pg_catalog.=) f.oid AND o.oid OPERATOR(pg_catalog.<) 16384),
       f.oid OPERATOR(pg_catalog.<) 16384 AND f.prokind OPERATOR(pg_catalog.=) 'a'
           AND f.proname OPERATOR(pg_catalog.=) ANY('{min,max}'::pg_catalog.name[])
FROM pg_catalog.pg_proc f JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) f.pronamespace
WHERE f.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
"""


# The function of each operator a sort, DISTINCT, GROUP BY or UNION uses.
_OPERATOR_FUNCTIONS = """
SELECT o.oid, o.oprcode::pg_catalog.oid FROM pg_catalog.pg_operator o
WHERE o.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])
"""



@dataclass(frozen=True)
class _Scan:
    """What one stored parse tree computes: the functions it calls and the operators it sorts or
    groups with (by OID), the nodes that can fail, each output column it computes from a column's
    value (its name, and each read of a column's value computing it, :func:`_computed_from`: its
    type, the function reading it and the literal that function compares it with), and each value its
    conditions, keys and aggregates read (:func:`read_at`)."""

    functions: frozenset[int]
    operators: frozenset[int]
    nodes: tuple[str, ...]
    computed: tuple[tuple[str, frozenset[ValueRead]], ...] = ()
    reads: tuple[ValueRead, ...] = ()


# A foreign table's rows: a file's malformed line, a remote view's division fail on a row.
_FOREIGN = _Scan(frozenset(), frozenset(), ("its rows on its server (a remote view's division, a file's malformed line), "
                                            "out of dpproxy's sight",))
def _scan(tree: str) -> _Scan:
    """The function and operator OIDs a pg_node_tree's text calls, a description of each node in
    it that can fail whatever it calls (an unknown kind of node, a scalar subquery, a cast from
    text ...), the output columns it computes from a column's value and the values its conditions,
    keys and aggregates read."""
    functions: set[int] = set()
    operators: set[int] = set()
    failing: list[str] = []
    computed: dict[str, set[ValueRead]] = {}
    outputs: dict[int, list[_OutputRead]] = {}
    stack: list[tuple[str, dict[str, str]]] = []
    walk = TreeWalk()
    tokens = _TOKEN.findall(tree)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token == "{" and index < len(tokens):
            # "_in": the field of its parent it stands in (the parent's last field so far; fields
            # of the scan's own, which start with "_", are no parent's)
            within = next((name for name in reversed(stack[-1][1]) if not name.startswith("_")), "") if stack else ""
            stack.append((tokens[index], {"_in": within}))
            if tokens[index] == "QUERY":
                walk.rtables.append([])
            index += 1
        elif token == "}" and stack:
            tag, fields = stack.pop()
            failing += _node_failure(tag, fields, functions, operators)
            value = value_of(tag, fields)
            if value is not None:
                _computed_from(value[0], tag == "VAR" and fields.get("varattno") == "0", fields.get("_in", ""),
                               stack, computed, outputs)
                read_at(value, column_of(tag, fields, walk), tag == "VAR" and fields.get("varattno") == "0",
                         fields.get("_in", ""), stack, walk)
            elif tag == "TARGETENTRY" and fields.get("resjunk") != "true" and id(fields) in outputs:
                name = re.sub(r"\\(.)", r"\1", fields.get("resname", "?"))
                computed.setdefault(name, set()).update(read.settled(name) for read in outputs.pop(id(fields)))
            settle(tag, fields, stack, walk)
        elif token.startswith(":") and stack and token[1:] in LISTS and index < len(tokens) and tokens[index] == "(":
            end = next((at for at in range(index, len(tokens)) if tokens[at] == ")"), len(tokens))
            stack[-1][1][token[1:]] = ""
            stack[-1][1][f"_{token[1:]}"] = "\0".join(tokens[index + 1:end])
            index = end + 1
        elif token.startswith(":") and stack and index < len(tokens) and tokens[index] not in _BRACKETS:
            stack[-1][1][token[1:]] = tokens[index]  # a scalar value: never read as a field name itself
            index += 1
        elif token.startswith(":") and stack:
            stack[-1][1][token[1:]] = ""  # a node or a list follows
    return _Scan(frozenset(functions), frozenset(operators), tuple(dict.fromkeys(failing)),
                 tuple((name, frozenset(types)) for name, types in computed.items() if types),
                 tuple(dict.fromkeys(walk.reads)))


@dataclass(frozen=True)
class _OutputRead:
    """A read of a column's value computing an output column, noted at the value (:func:`_computed_from`)
    and settled when the output column ends (:meth:`settled`), when what its reader compares the value
    with is known: the value's type, the function reading it (0: none) and, for a reader that may be
    bounded by a literal, that reader's fields (``_literal``, ``_args``, ``inputcollid``)."""

    kind: int
    reader: int
    whole: bool
    compared: dict[str, str] | None = None

    def settled(self, column: str) -> ValueRead:
        """The read as :func:`proxy.backend.whole_reads.unbounded` judges it, of ``column``."""
        fields = self.compared or {}
        literal = int(fields["_literal"]) if fields.get("_args") == "2" and "_literal" in fields else None
        collation = fields.get("inputcollid", "0")
        return ValueRead(column, self.kind, -1, "its output column", self.reader, literal,
                         int(collation) if collation.isdigit() else -1, self.whole)


# The readers of a value computing an output column that may read no more than a literal's size: an
# equality weighing sizes first (OPEXPR, DISTINCTEXPR), and NULLIF under IS [NOT] NULL (which reads
# no value of NULLIF's result; under anything else that result, the value as it is, is read again).
_LITERAL_BOUNDED = frozenset({"OPEXPR", "DISTINCTEXPR"})


def _computed_from(kind: int, whole: bool, within: str, stack: list[tuple[str, dict[str, str]]],
                   computed: dict[str, set[ValueRead]], outputs: dict[int, list[_OutputRead]]) -> None:
    """Note, for an output column (a TARGETENTRY not junk) computed from a column's value, that
    column's type (``kind``) and the function of the node that reads the value (0 where it calls
    none: :func:`_findings` excuses a read of the size alone, ``octet_length``): a VAR (or a
    subquery's output column, :func:`value_of`) below the
    entry with a node between them that reads the value (anything but a RELABELTYPE's or
    COLLATEEXPR's argument and a CASE's or COALESCE's result, :data:`PASSED_ON`, which pass the
    stored value on as it is; a subquery's node too, so an EXISTS of an output reads its columns).
    A whole-row VAR (``whole``) is never the stored value: PostgreSQL builds the row, fetching each
    of its values stored apart, at each reference. A VAR in an aggregate's or a window function's
    arguments (their own TARGETENTRYs, below the AGGREF) is read once per row, where the query is
    computed before its outputs are referenced (an aggregate's or window's query is never flattened
    into the statement that reads the view), so it is not noted here (:func:`read_at` judges it).
    Reads are gathered in ``outputs`` by the entry until it ends, when its ``resjunk`` is known and
    its reader's literal (``NULLIF(note, 'x') IS NULL``, ``note = 'x'``: sizes weighed first, read no
    further than the literal's) too (:func:`_scan`)."""
    plain = not whole
    reader = 0
    compared: dict[str, str] | None = None
    for depth in range(len(stack) - 1, 0, -1):
        above, above_fields = stack[depth]
        if above in ONCE_PER_ROW:
            return
        if above == "TARGETENTRY" and stack[depth - 1][0] == "QUERY":  # an output (not an aggregate's argument)
            if not plain:
                outputs.setdefault(id(above_fields), []).append(_OutputRead(kind, reader, whole, compared))
            return
        if plain and (above, within) not in PASSED_ON:
            reader = _called(above, above_fields)
            if above in _LITERAL_BOUNDED or (above == "NULLIFEXPR" and stack[depth - 1][0] == "NULLTEST"):
                compared = above_fields
        plain, within = plain and (above, within) in PASSED_ON, above_fields.get("_in", "")
    # No output column above: a query's condition, or a bare expression (a virtual generated
    # column's, whose whole expression is the column, noted under ""; a policy's USING).
    if stack and (stack[0][0] == "QUERY" or stack[0][0] in ONCE_PER_ROW):
        return
    if stack and not (plain and (stack[0][0], within) in PASSED_ON):
        if plain:
            reader = _called(*stack[0])
        computed.setdefault("", set()).add(_OutputRead(kind, reader, whole).settled(""))


def _called(tag: str, fields: Mapping[str, str]) -> int:
    """The OID of the function a node calls (:data:`CALLS`), 0 for a node that calls none."""
    oid = fields.get(CALLS.get(tag, ""), "")
    return int(oid) if oid.isdigit() else 0


def _node_failure(tag: str, fields: Mapping[str, str], functions: set[int], operators: set[int]) -> Iterator[str]:
    if tag in CALLS:
        oid = fields.get(CALLS[tag], "0")
        if oid.isdigit() and int(oid) != 0:
            functions.add(int(oid))
        else:
            yield f"an operator whose function is not recorded ({tag.lower()})"
    elif tag == "SUBLINK":
        if fields.get("subLinkType") not in _TOTAL_SUBLINKS:
            yield "a scalar subquery (it fails when it finds more than one row)"
    elif tag == "COERCEVIAIO":
        if fields.get("resulttype") not in _TEXT_TYPES:
            yield "a cast through text (a value's text may not be a value of the result type)"
    elif tag == "ARRAYEXPR":
        if fields.get("multidims") != "false":
            yield "a multidimensional ARRAY[...] (it fails when the rows' arrays differ in size)"
    elif tag == "COMMONTABLEEXPR":
        if fields.get("cterecursive") != "false":
            yield "a recursive WITH (it runs as long as the rows' chains are, and forever on a cycle)"
    elif tag == "MINMAXEXPR":
        if fields.get("minmaxtype") in _RECORD_TYPES or not fields.get("minmaxtype", "").isdigit():
            yield "GREATEST/LEAST of anonymous rows (their fields' comparison is found only when two rows need it)"
    elif tag in _OPTIONAL_CALLS or tag in _OPTIONAL_OPERATORS:
        for field, into in [(f, functions) for f in _OPTIONAL_CALLS.get(tag, ())] + \
                [(f, operators) for f in _OPTIONAL_OPERATORS.get(tag, ())]:
            oid = fields.get(field, "")
            if not oid.isdigit():
                yield f"{tag.lower()} with a {field} dpproxy cannot read"
            elif int(oid) != 0:
                into.add(int(oid))
    elif tag not in _STRUCTURAL:
        yield f"{tag.lower()} (dpproxy cannot show that it never fails on a row)"


@dataclass(frozen=True)
class _Findings:
    """What a protected relation reads through: each thing that can fail on a row (``failures``),
    each output column computed from a value of any length (``rereads``), and each value of any
    length its views' or policies' own conditions, keys or aggregates read whole (``reads``), and each
    table it reads through a table access method other than heap (``storage``), with where it is."""

    failures: list[str]
    rereads: list[str]
    reads: list[str] = field(default_factory=list)
    storage: list[str] = field(default_factory=list)


async def _findings(session: Fetches, relations: Mapping[int, Relation]) -> dict[int, _Findings]:
    """For each protected relation of ``relations`` that reads through something that can fail on a
    row, a view column computed from a value of any length, or a condition, key or aggregate of a
    view or policy that reads such a value whole, a description of each such thing: what it is and
    where (the view or policy)."""
    protected = [oid for oid, relation in relations.items() if relation.access == "protected"]
    if not protected:
        return {}
    trees = await session.fetch_all(_READS, (protected,))
    found: dict[int, _Findings] = {}
    for root, where, _, _ in trees:
        if where.startswith("table "):  # stored through another access method (_READS)
            found.setdefault(int(root), _Findings([], [])).storage.append(where)
    scanned = [(int(root), where, _FOREIGN if text is None else _scan(text), None if table is None else int(table))
               for root, where, text, table in trees if not where.startswith("table ")]
    operators = sorted({oid for _, _, scan, _ in scanned for oid in scan.operators})
    code = {int(oid): int(function) for oid, function in await session.fetch_all(_OPERATOR_FUNCTIONS, (operators,))
            } if operators else {}
    # (A value's reader is a node that calls its function: among the scan's, known below.)
    scans = [(root, where, scan, scan.functions | {code.get(oid, 0) for oid in scan.operators}, table)
             for root, where, scan, table in scanned]
    called = sorted({oid for _, _, _, functions, _ in scans for oid in functions})
    known = {int(oid): (str(name), bool(builtin), bool(comparison), bool(min_max))
             for oid, name, builtin, comparison, min_max in await session.fetch_all(_FUNCTIONS, (called,))
             } if called else {}
    catalog = await read_catalog(
        session, {read.type for _, _, scan, _, _ in scans for _, reads in scan.computed for read in reads},
        [read for _, _, scan, _, _ in scans
         for read in (*scan.reads, *(computed for _, reads in scan.computed for computed in reads))],
        {table for _, _, scan, _, table in scans if table is not None and scan.reads}, known)
    for root, where, scan, functions, table in scans:
        problems = [f"{where} computes {node}" for node in scan.nodes]
        for oid in sorted(functions):
            name, builtin, comparison, min_max = known.get(oid, (f"function {oid}", False, False, False))
            total = comparison or min_max or name in TOTAL_FUNCTIONS or name in TOTAL_AGGREGATES
            if not builtin or _POLYMORPHIC.search(name) or not total:
                problems.append(f"{where} calls {name}")
        most = relations[root].policy.max_text_bytes
        # A value of any length read whole by the column's expression; not one read for its size
        # alone, nor one an equality weighing sizes first compares with a literal within max_text_bytes.
        whole = {column for column, reads in scan.computed if any(unbounded(read, catalog, most) for read in reads)}
        rereads = [f"{where} computes its column {column} from a value of a type of any length"
                   for column, _ in scan.computed if column and column in whole]
        if where.startswith("virtual generated column") and "" in whole:
            rereads.append(f"{where} is computed from a value of a type of any length")
        reads = [] if where.startswith("virtual generated column") else list(dict.fromkeys(
            read_whole(where, read, catalog, table) for read in scan.reads if unbounded(read, catalog, most)))
        if problems or rereads or reads:
            findings = found.setdefault(root, _Findings([], []))
            findings.failures.extend(problems)
            findings.rereads.extend(rereads)
            findings.reads.extend(reads)
    return found


async def fallible_protected(session: Fetches, relations: Mapping[int, Relation]) -> dict[int, str]:
    """The protected relations of ``relations`` that read through an expression that can fail on a
    row, a view column computed from a value of any length, or a view's or policy's condition, key
    or aggregate that reads such a value whole, or a table stored through an access method other than
    heap, by OID, each with the first such thing after what it is ("an expression that can fail on a
    row: view v calls int4div(integer, integer)"; the periodic re-check's question)."""
    return {oid: f"a table access method whose reads are unmeasured: {findings.storage[0]}" if findings.storage else
            f"an expression that can fail on a row: {findings.failures[0]}" if findings.failures else
            "an expression that PostgreSQL computes again at each reference, reading a value of any length whole: "
            f"{findings.rereads[0]}" if findings.rereads else
            "an expression that PostgreSQL reads a value of any length whole, unbounded, once a statement: "
            f"{findings.reads[0]}"
            for oid, findings in (await _findings(session, relations)).items()}


async def failing_protected(session: Fetches, relations: Mapping[int, Relation],
                            names: Mapping[int, str]) -> list[str]:
    """A problem (``tables.<name>: ...``) for each protected relation of ``relations`` that reads
    through an expression that can fail on a row, a view column computed from a value of any
    length, or a view's or policy's condition, key or aggregate that reads such a value whole;
    ``names`` gives each as the policy writes it."""
    found = await _findings(session, relations)
    return [f"tables.{names[oid]}: " + "; and ".join(_explained(findings, relations[oid].policy.max_text_bytes))
            for oid, findings in found.items()]


def _listed(items: list[str]) -> str:
    """The first three of ``items``, and an ellipsis for more."""
    return f"{'; '.join(items[:3])}{' …' if len(items) > 3 else ''}"


def _explained(findings: _Findings, most: int) -> list[str]:
    """What a protected relation reads through, each kind of finding with why it is refused and the
    fix (``most``: the table's ``max_text_bytes``, the longest literal an equality may compare)."""
    parts = []
    if findings.storage:
        parts.append(
            f"{_listed(findings.storage)} is stored through a table access method that is not heap's: its code "
            "reads every row, and how long it takes on one row's value, or whether it fails on it, was never measured "
            "(the value bound and the stored-form check, rewriter/text_bounds.py, read heap's value headers), so one "
            "row could make a DP query measurably slower or fail, which tells whether the row is there; store it "
            "with heap (ALTER TABLE ... SET ACCESS METHOD heap), or leave it out")
    if findings.failures:
        parts.append(
            f"{_listed(findings.failures)}, which can fail on some "
            "row's values. A DP query reaching a row on which that fails would fail, which tells whether the query's "
            "rows hold such a row, exactly; compute the column into a table or a materialized view (it then fails at "
            "refresh, before any analyst asks), declare a virtual generated column STORED (computed when a row is "
            "written), or leave it out of the view")
    if findings.rereads:
        parts.append(
            f"{_listed(findings.rereads)}. PostgreSQL computes such a "
            "column again at each reference a statement makes to it, reading the whole value each time, before "
            "dpproxy's value bound can see its size (rewriter/text_bounds.py reads a stored value's header only): one "
            "row's long value would make every term that reads the column measurably slower, which tells whether the "
            "row is there. An output column may be such a value's octet_length(), IS [NOT] NULL (of NULLIF(col, 'x') "
            f"too), or = and <> against a literal of at most {most} bytes, which weigh its size first. Compute "
            "anything else into a table or a materialized view, declare a virtual generated column STORED, or leave "
            "it out of the view")
    if findings.reads:
        parts.append(
            f"{_listed(findings.reads)}. PostgreSQL reads such a value whole for every row the view or policy reads, "
            "once a statement, before the analyst's conditions and with no bound: one row's long value (3.2 MB: ~400 "
            "buffers more) makes every statement on the relation measurably slower, which tells whether the row is "
            f"there. A view's or policy's condition may test such a column with IS [NOT] NULL (NULLIF(col, 'x') IS "
            f"NULL too), octet_length(), or = and <> (of the column, of COALESCE(col, other) or of NULLIF(col, 'x')) "
            f"against a literal of at most {most} bytes (max_text_bytes; a deterministic collation) or "
            "CAST(current_user AS text), which weigh its size first; for "
            "anything else (a range, a join, GROUP BY, DISTINCT, ORDER BY, UNION, max(), "
            "string_agg()) compute what it needs into a materialized view or a STORED generated column and read "
            "that, declare the column with a size (varchar(n)) within max_text_bytes, or leave it out")
    return parts
