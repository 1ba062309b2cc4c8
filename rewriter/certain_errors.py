"""Outer statements that fail whatever is released: a division by a zero no release can change.

The outer statement over a release (:mod:`rewriter.post_process`) is tried before the charge over
NULL aggregates, which finds the errors its text and keys decide alone (``1/0``). Over NULL, a
strict operator gives NULL and raises nothing, so ``stddev(x) / 0`` passed that trial, and so did
``1 / (count(*) - count(*))``, whose two counts are one release; both then failed after the
charge, on every release. :func:`fails_on_every_release` recognises such statements from their
tree alone, by an argument that holds for every value a release can take:

* A released number is never NULL and always finite (``rewriter.types`` bounds the columns so
  that it is; ``finite(k)`` says which release columns are such numbers: integers, numeric and
  double precision, not real, whose encoding may round past its range to infinity).
* An expression built from such columns and number literals by ``+ - * / %``, unary minus,
  ``abs``, ``round``, ``trunc``, ``floor``, ``ceil`` and casts to a number type is, in
  PostgreSQL, a finite non-NULL number or an error (integer, numeric and float arithmetic raise
  on overflow, and no such step makes a NaN from finite inputs). Call it *certain*.
* ``a - a`` of the same certain ``a`` (after merging, ``count(*) - count(*)`` is one column
  less itself) is 0; a number literal 0 is 0.
* A certain number divided by 0 (``/``, ``%``, ``div``) raises 22012 in PostgreSQL, for
  integers, numeric (its NaN being excluded) and double precision alike.
* Such a division fails every row it is evaluated on when only operators that evaluate all
  their arguments lie between it and an output column or ORDER BY item of the outermost
  SELECT (no CASE, COALESCE, AND or OR, which may skip it); and the rows do not depend on the
  release when nothing between the release and the output filters or limits on a released
  value (no HAVING on an aggregate, no function that might return a set).
* A query enclosing the SELECT over the release, each level the only FROM item of the one above
  (``SELECT x / 0 FROM (SELECT count(*) AS x FROM t) q``, a CTE read once being such a level),
  is read with each name it takes from the level below replaced by the expression that level
  outputs under it: ``x / 0`` is the release column divided by 0. A level with a join, GROUP BY,
  HAVING, DISTINCT, an aggregate or window function, a WHERE on anything but the keys, or a
  LIMIT that is not a whole-number literal is not read through; an output below that no output
  or ORDER BY item of the outermost level names is left out (PostgreSQL need not compute it),
  but a set-returning function anywhere in the levels' outputs still stops the proof.
  A LIMIT or OFFSET of a whole-number literal may stand: the release decides the rows' order,
  never how many there are, so the number the outputs are evaluated on is the same on every
  release (a series limit's ranking, ``ORDER BY count(*) / 0 DESC LIMIT 5``, is proved too).

So such a statement fails on every release that has a row; whether it has one (a HAVING over
the keys may keep no cell) is learnt by running it over one fixed trial release
(``proxy.dp.answer.witness_params``), which also gives PostgreSQL's own error. The argument
reads the statement's text, the release's types and the policy only, never a row or a released
value, so the refusal it leads to is the same on neighbouring tables.

Its limit: it proves failures of this one kind only. A cast that overflows for every possible
release (``(count(*) + 1000)::numeric(2, 0)``, a noisy count being at least 0) would need the
range of each release, and a failure a finite number of trial values shows is no proof (``CASE
WHEN count(*) = 12345 THEN 1 ELSE 1/0 END`` fails on all but one value): such statements are
answered, and charged, as before.
"""

from __future__ import annotations

from typing import Callable

from sqlglot import exp

__all__ = ["fails_on_every_release"]

_NUMBER_TYPES = frozenset({exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT,
                           exp.DataType.Type.DECIMAL, exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT})
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.IntDiv)
_DIVISIONS = (exp.Div, exp.Mod, exp.IntDiv)
_NUMBER_FUNCTIONS = (exp.Abs, exp.Round, exp.Trunc, exp.Floor, exp.Ceil)
# The most nodes the inlined roots may have: far above what wrappers of BI tools give (a few
# hundred), far below what costs the event loop a noticeable time to copy (~4 µs a node).
_MAX_INLINED_NODES = 10_000
# What may lie between a division and its output column: each evaluates all its arguments.
_STRICT = (exp.Paren, exp.Alias, exp.Ordered, exp.Cast, exp.Neg, *_ARITHMETIC, *_NUMBER_FUNCTIONS,
           exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
# Functions in the output that return one value (anything else might return a set, and so decide
# how many rows there are): the kinds a post-processing expression uses most.
_SCALAR_FUNCTIONS = (exp.Cast, exp.Neg, *_NUMBER_FUNCTIONS, exp.Coalesce, exp.Nullif, exp.Greatest, exp.Least,
                     exp.Case, exp.If, exp.Sqrt, exp.Exp, exp.Ln, exp.Log, exp.Pow, exp.Sign, exp.Concat, exp.Upper,
                     exp.Lower, exp.Length, exp.ToChar, exp.Extract, exp.TimestampTrunc, exp.DateTrunc)


def fails_on_every_release(statement: exp.Select, release: str, finite: Callable[[int], bool],
                           keys_only: Callable[[exp.Expr, exp.Select], bool]) -> bool:
    """Whether the outer statement ``statement`` (its release columns ``<release>._dp<k>``) raises
    division by zero on every row, whatever is released, in rows the release does not choose.

    ``statement`` reads the release itself, or encloses the SELECT that does as the only item of
    its FROM, level under level (``SELECT x / 0 FROM (<the SELECT over the release>) AS q``).

    ``finite(k)``: the k-th release column is a finite non-NULL number in every release.
    ``keys_only(condition, select)``: ``condition``, of ``select``'s WHERE, reads the cells' keys
    and constants only.
    A True answer is a proof (module docstring); False means none was found.
    """
    levels = _levels(statement, release)
    if levels is None:
        return False
    for level in levels:
        if not all(_whole_number(level.args.get(clause)) for clause in ("limit", "offset")):
            return False
        where = level.args.get("where")
        if where is not None and not keys_only(where.this, level):
            return False
    roots = _inlined_roots(levels)
    if roots is None:
        return False
    # Every level's outputs: a set-returning one decides how many rows there are, named or not.
    every = [*roots, *(item for level in levels for item in level.expressions),
             *(item for level in levels if level.args.get("order") for item in level.args["order"].expressions)]
    for root in every:
        for function in root.find_all(exp.Func):
            if not isinstance(function, _SCALAR_FUNCTIONS) or function.find(exp.Window) is not None:
                return False
    return any(_certain_division(division, root, release, finite)
               for root in roots for division in root.find_all(*_DIVISIONS))


def _levels(statement: exp.Select, release: str) -> list[exp.Select] | None:
    """``statement`` and the SELECTs under it, each the only FROM item of the one above, down to
    the one over the release; None when a level above that one may change which rows, or how
    many, reach its outputs otherwise than by its keys (a join, GROUP BY, HAVING, DISTINCT, an
    aggregate or window function, a set operation): such a statement is not proved."""
    levels = [statement]
    while True:
        source = levels[-1].args.get("from_")
        if source is None or not isinstance(source.this, exp.Subquery) or not isinstance(source.this.this, exp.Select) \
                or source.this.alias == release:
            return levels
        level = levels[-1]
        if level.args.get("joins") or any(level.args.get(clause) for clause in ("group", "having", "distinct", "qualify")) \
                or any(node.find(exp.AggFunc, exp.Window) for node in level.expressions):
            return None
        levels.append(source.this.this)


def _inlined_roots(levels: list[exp.Select]) -> list[exp.Expression] | None:
    """The output columns and ORDER BY items of the outermost level, each name of a level below
    put in place by the expression that level outputs under it, down to the release's columns
    (``SELECT x / 0 FROM (SELECT r._dp1 AS x FROM …) AS q`` is ``r._dp1 / 0``). An output below
    that no root names is left out: PostgreSQL need not compute it. None when a name cannot be
    traced to one output of the level below (a star is that level's outputs), or when the roots
    would grow past ``_MAX_INLINED_NODES`` nodes: a level naming the one below twice doubles them
    (``SELECT v || v AS v FROM (…)``), so that 25 such levels, under 2 KB of text, took
    gigabytes and hours to inline on the event loop. Such a statement is not proved."""
    top = levels[0]
    order = top.args.get("order")
    aliases = {item.alias for item in top.expressions if isinstance(item, exp.Alias)}
    ordered = [] if order is None else [item for item in order.expressions
                                        if not (isinstance(item.this, exp.Column) and not item.this.table
                                                and item.this.name in aliases)]  # an output, already a root
    roots = [item.copy() for item in [*top.expressions, *ordered]]
    for above, below in zip(levels, levels[1:]):
        alias = above.args["from_"].this.alias
        outputs = _outputs(below)
        if outputs is None:
            return None
        sizes = {name: _size(output) for name, output in outputs.items()}
        grown = sum(_size(root) for root in roots)
        traced: list[exp.Expression] = []
        for root in roots:
            if isinstance(root, exp.Star) or (isinstance(root, exp.Column) and isinstance(root.this, exp.Star)):
                traced.extend(output.copy() for output in outputs.values())
                continue
            for column in list(root.find_all(exp.Column)):
                if column.table not in ("", alias) or column.name not in outputs:
                    return None
                grown += sizes[column.name]
                if grown > _MAX_INLINED_NODES:
                    return None
                source = outputs[column.name].copy()
                if column is root:
                    root = source
                else:
                    column.replace(exp.Paren(this=source))
            traced.append(root)
        roots = traced
    return roots


def _size(node: exp.Expression) -> int:
    """How many nodes ``node``'s tree has."""
    return sum(1 for _ in node.walk())


def _outputs(level: exp.Select) -> dict[str, exp.Expression] | None:
    """``level``'s output columns by name, each the expression it outputs; None when a name is
    output twice or an output is a star."""
    outputs: dict[str, exp.Expression] = {}
    for item in level.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)) \
                or item.alias_or_name in outputs:
            return None
        outputs[item.alias_or_name] = item.this if isinstance(item, exp.Alias) else item
    return outputs


def _certain_division(division: exp.Expr, root: exp.Expr, release: str, finite: Callable[[int], bool]) -> bool:
    """A certain number divided by a certain zero, reached from ``root`` through strict steps only."""
    if division.args.get("safe") or not _certain(division.this, release, finite) \
            or not _zero(division.expression, release, finite):
        return False
    node: exp.Expr | None = division
    while node is not None and node is not root:
        node = node.parent
        if node is not None and not isinstance(node, _STRICT):
            return False
    return node is root


def _zero(node: exp.Expression, release: str, finite: Callable[[int], bool]) -> bool:
    """Whether ``node`` is 0 whatever is released: the literal 0, or ``a - a`` of a certain ``a``."""
    while isinstance(node, (exp.Paren, exp.Neg)) or (isinstance(node, exp.Cast) and _number_cast(node)):
        node = node.this
    if isinstance(node, exp.Literal):
        return not node.is_string and _number(node.this) == 0
    return (isinstance(node, exp.Sub) and node.this == node.expression
            and _certain(node.this, release, finite))


def _certain(node: exp.Expression, release: str, finite: Callable[[int], bool]) -> bool:
    """Whether ``node`` is a finite non-NULL number, or an error, whatever is released."""
    if isinstance(node, exp.Literal):
        return not node.is_string and _number(node.this) is not None
    if isinstance(node, exp.Column):
        name = node.name
        return (node.table == release and name.startswith("_dp") and name[3:].isdigit()
                and finite(int(name[3:])))
    if isinstance(node, (exp.Paren, exp.Neg)):
        return _certain(node.this, release, finite)
    if isinstance(node, exp.Cast):
        return _number_cast(node) and _certain(node.this, release, finite)
    if isinstance(node, _ARITHMETIC):
        return (not node.args.get("safe") and _certain(node.this, release, finite)
                and _certain(node.expression, release, finite))
    if isinstance(node, _NUMBER_FUNCTIONS):
        arguments = [value for key, value in node.args.items() if value is not None and key != "this"]
        return _certain(node.this, release, finite) and all(
            isinstance(value, exp.Expression) and _certain(value, release, finite) for value in arguments)
    return False


def _whole_number(clause: exp.Expression | None) -> bool:
    """Whether a LIMIT or OFFSET clause is absent or a whole-number literal: then how many rows
    PostgreSQL evaluates an output column or ORDER BY item on is decided by how many rows there
    are, the LIMIT and the OFFSET, which no release changes (the release decides only their order).
    Whether that is any is what the witness trial, run with them, shows."""
    if clause is None:
        return True
    value = clause.args.get("expression") if isinstance(clause, (exp.Limit, exp.Offset)) else None
    return isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()


def _number_cast(cast: exp.Cast) -> bool:
    """A cast to a number type (integer, numeric, real, double precision), whose value from a
    finite number is a finite number or an error."""
    return isinstance(cast.to, exp.DataType) and cast.to.this in _NUMBER_TYPES


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
