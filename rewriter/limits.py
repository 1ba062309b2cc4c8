"""How complex a statement may be: checked on PostgreSQL's own parse, before any other analysis.

dpproxy analyses statements with recursive code (sqlglot, the predicate checker), so a
statement nested deeper than that code can follow would end in an internal error. Limits
well inside what it can follow, and far above what BI tools send, refuse such statements
from their text alone with 54001 and a hint that names the limit (docs/sqlstates.md):

* parentheses nested at most ``MAX_PARENTHESES`` deep;
* expressions (NOT, function calls, operators, subqueries ...) nested at most
  ``MAX_NESTING`` deep in the parse tree;
* at most ``MAX_BOOLEAN_TERMS`` operands in one AND or OR chain;
* a parse tree of at most ``MAX_TREE_BYTES`` (as pglast's JSON), which bounds the time one
  statement's analysis holds the interpreter (and so stalls other sessions);
* runs of at most ``MAX_OPERATOR_RUN`` operator characters (``+-*/<>=~!@#%^&|`?``), anywhere
  in the text, checked before it is parsed (:func:`check_text`): PostgreSQL's scanner reads
  such a run again for each comment opener in it and each trailing ``+``/``-`` it gives back,
  so its time grows with the square of the run (16 KB of ``+`` take a second). PostgreSQL
  accepts no operator longer than 63 characters; longer runs are comment banners and literals.
"""

from __future__ import annotations

import re
from typing import Any

from policies.errors import SQLSTATE, Refusal

__all__ = [
    "MAX_BOOLEAN_TERMS", "MAX_NESTING", "MAX_OPERATOR_RUN", "MAX_PARENTHESES", "MAX_TREE_BYTES", "check_complexity",
    "check_text", "longest_operator_run", "too_complex",
]

MAX_PARENTHESES = 32
MAX_NESTING = 64
MAX_BOOLEAN_TERMS = 256
MAX_TREE_BYTES = 4 * 1024 * 1024  # an IN list of about 75,000 numbers (a DP one: see rewriter/predicate_terms.py)
MAX_OPERATOR_RUN = 256  # at most ~0.3 ms of scanning per run: ~1 s per MB of such runs

_OPERATOR_RUNS = re.compile(r"[~!@#^&|`?+\-*/%<>=]+")

_TOKENS = re.compile(
    r"[Ee]'(?:[^'\\]|\\.|'')*'"  # E'...' with backslash escapes
    r"|'(?:[^']|'')*'"  # '...'
    r'|"(?:[^"]|"")*"'  # "identifier"
    # $tag$...$tag$, not where a $ continues an identifier (a$b$): there the search for the
    # closing tag would read to the end of the text, once per such identifier (quadratic).
    r"|(?<![A-Za-z_0-9$\x80-\U0010ffff])\$(?P<tag>[A-Za-z_][A-Za-z_0-9]*|)\$.*?\$(?P=tag)\$"
    r"|--[^\n]*|/\*.*?\*/"  # comments
    r"|[()]",
    re.DOTALL,
)


def too_complex(what: str, limit: int, unit: str) -> Refusal:
    """The 54001 refusal for a statement beyond one of the limits above."""
    return Refusal(
        SQLSTATE.STATEMENT_TOO_COMPLEX,
        f"statement too complex: {what} (rule: statement-limits)",
        f"dpproxy accepts at most {limit} {unit} (docs/sqlstates.md, 54001); simplify the statement, "
        "e.g. use IN (...) instead of a long OR chain.",
        "statement-limits",
    )


def longest_operator_run(sql: str) -> int:
    """The length of the longest run of operator characters in ``sql`` (linear in its length)."""
    return max((match.end() - match.start() for match in _OPERATOR_RUNS.finditer(sql)), default=0)


def check_text(sql: str) -> None:
    """Refuse (54001) a text whose scanning alone would take too long: see the module docstring."""
    run = longest_operator_run(sql)
    if run > MAX_OPERATOR_RUN:
        raise Refusal(
            SQLSTATE.STATEMENT_TOO_COMPLEX,
            f"statement too complex: a run of {run} operator characters (rule: statement-limits)",
            f"dpproxy accepts at most {MAX_OPERATOR_RUN} operator characters (+-*/<>=~!@#%^&|`?) in a row "
            "(docs/sqlstates.md, 54001), also in comments and literals; separate them with spaces or build "
            "a long literal with repeat().",
            "statement-limits",
        )


def check_complexity(sql: str, node: dict[str, Any]) -> None:
    """Refuse (54001) a statement whose text or parse tree ``node`` exceeds a limit."""
    if sql.count("(") > MAX_PARENTHESES:
        depth = _parenthesis_depth(sql)
        if depth > MAX_PARENTHESES:
            raise too_complex(f"parentheses nested {depth} deep", MAX_PARENTHESES, "nested parentheses")
    _check_tree(node)


def _parenthesis_depth(sql: str) -> int:
    """The deepest nesting of parentheses outside literals, quoted identifiers and comments.

    A regular-expression scan: PostgreSQL's scanner (pglast) takes seconds per MB and holds
    the GIL. Where it misreads an exotic literal, the executor's recursion net still turns a
    too-deep statement into 54001.
    """
    depth = deepest = 0
    for match in _TOKENS.finditer(sql):
        token = match.group()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token == ")":
            depth -= 1
    return deepest


def _check_tree(root: dict[str, Any]) -> None:
    # Iterative, so that the check itself cannot exhaust the stack.
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list):
            stack.extend((child, depth) for child in item)
            continue
        if not isinstance(item, dict):
            continue
        for key, value in item.items():
            child_depth = depth
            if key[:1].isupper():  # a node: BoolExpr, A_Expr, FuncCall, SubLink ...
                child_depth += 1
                if child_depth > MAX_NESTING:
                    raise too_complex(f"expressions nested more than {MAX_NESTING} deep", MAX_NESTING, "levels of nesting")
                if key == "BoolExpr" and len(value.get("args", ())) > MAX_BOOLEAN_TERMS:
                    kind = value.get("boolop", "").removesuffix("_EXPR")
                    raise too_complex(
                        f"{len(value['args'])} terms in one {kind} chain", MAX_BOOLEAN_TERMS, f"terms per {kind} chain"
                    )
            if isinstance(value, (dict, list)):
                stack.append((value, child_depth))
