"""Common table expressions used once, read as the derived tables they are.

dbt models, Tableau's and Metabase's custom SQL, and analysts write a wrapper as a CTE:
``WITH adults AS (SELECT * FROM people WHERE age >= 18) SELECT COUNT(*) FROM adults``. A
non-recursive CTE that the statement reads exactly once is, in PostgreSQL, the same query as
the derived table ``FROM (SELECT * FROM people WHERE age >= 18) AS adults`` (``MATERIALIZED``
only changes when it is computed, and it is computed once either way), so it releases exactly
what that statement releases: each such CTE is put in place of its one reference, and the
statement is then judged as any other (``rewriter.flatten`` folds the wrapper, or refuses it).

Refused (``no-subquery``): ``WITH RECURSIVE`` and its ``SEARCH``/``CYCLE`` clauses; a CTE read
twice or more (a self-join or a self-union by another name) or never (PostgreSQL does not run
it, but a statement that names a protected table for nothing is not worth guessing about); a CTE
with a column list (``WITH t(a, b) AS ...``), or read under one (``FROM t AS x(a, b)``), which
renames positionally; a CTE read with ``TABLESAMPLE`` or ``ONLY``, which the derived table would
drop; a CTE named in the body of an earlier CTE of its WITH, where PostgreSQL reads a relation of
that name instead (or fails). A name that a CTE of an inner level defines again is refused too
rather than resolved by scope.
"""

from __future__ import annotations

from sqlglot import exp

from policies.errors import SQLSTATE, Refusal

from .identifiers import identifier
from .scope import Scope

__all__ = ["inline_ctes"]

HINT = ("A CTE on a protected table may be read once, as a wrapper that selects and filters its columns: "
        "WITH t AS (SELECT * FROM {table} WHERE age > 30) SELECT COUNT(*) FROM t. Read twice, recursive or "
        "with a column list, it is not supported.")


def inline_ctes(tree: exp.Select, scope: Scope) -> exp.Select:
    """``tree`` with every CTE put in place of its one reference (``tree`` itself when it has none)."""
    withs = list(tree.find_all(exp.With))
    if not withs:
        return tree
    names = [identifier(cte.args["alias"]) for with_ in withs for cte in with_.expressions]
    if len(names) != len(set(names)):
        raise _refuse(scope, "a CTE name defined twice")
    tree = tree.copy()
    while (with_ := tree.find(exp.With)) is not None:
        _inline(with_, scope)
    return tree


def _inline(with_: exp.With, scope: Scope) -> None:
    """Put each CTE of ``with_`` in place of its one reference, then drop the WITH."""
    if with_.args.get("recursive"):
        raise _refuse(scope, "WITH RECURSIVE")
    if with_.args.get("search") is not None or with_.args.get("cycle") is not None:
        raise _refuse(scope, "WITH ... SEARCH/CYCLE")
    owner = with_.parent
    assert owner is not None
    ctes = list(with_.expressions)
    with_.pop()
    for index, cte in enumerate(ctes):
        alias = cte.args["alias"]
        if alias.args.get("columns"):
            raise _refuse(scope, "a CTE with a column list")
        name = identifier(alias)
        # Its name in an earlier CTE's body is no reference to it: PostgreSQL reads a relation
        # of that name there. Checked before any body is put in place (in ``owner``, below).
        if any(_references(earlier.this, name) for earlier in ctes[:index]):
            raise _refuse(scope, "a CTE named before it is defined")
        readers = [later.this for later in ctes[index + 1:]] + [owner]
        references = [table for reader in readers for table in _references(reader, name)]
        if len(references) != 1:
            raise _refuse(scope, "a CTE read more than once" if references else "a CTE that is never read")
        (reference,) = references
        as_name = reference.args.get("alias")
        if as_name is not None and as_name.args.get("columns"):
            raise _refuse(scope, "a CTE read under a column list")
        if any(value for key, value in reference.args.items() if key not in ("this", "alias")):
            raise _refuse(scope, f"a CTE read as {reference.sql(dialect='postgres')}")
        as_name = as_name or exp.TableAlias(this=exp.to_identifier(name, quoted=True))
        reference.replace(exp.Subquery(this=cte.this, alias=as_name))


def _references(reader: exp.Expression, name: str) -> list[exp.Table]:
    """The unqualified relations named ``name`` in ``reader``."""
    return [table for table in reader.find_all(exp.Table)
            if not table.args.get("db") and not table.args.get("catalog") and identifier(table.this) == name]


def _refuse(scope: Scope, what: str) -> Refusal:
    table = scope.table.display_name
    return Refusal(SQLSTATE.DP_QUERY_SHAPE, f"{what} is not allowed with protected table {table} (rule: no-subquery)",
                   HINT.format(table=table), "no-subquery")
