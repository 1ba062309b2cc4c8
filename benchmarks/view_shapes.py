"""Protected views over row_cost's tables, for the timing fuzzer to draw statements over.

A catalogue (:data:`SHAPES`) of view shapes over ``rc_base`` and ``rc_plus``
(benchmarks/row_cost.py): renames, casts binary-compatible or not, ``COLLATE``, ``CASE`` and
``COALESCE`` outputs, functions of text, bytea, numeric and jsonb columns, arithmetic on
fixed-length columns, a whole row, a view's own WHERE, a self-join and a join to a second small
table, ``GROUP BY``, ``DISTINCT`` and aggregates, ``security_barrier`` and ``security_invoker``
views, and views over views. Each shape is created twice, ``rcv_<shape>_rc_base`` over
``rc_base`` and ``rcv_<shape>_rc_plus`` over ``rc_plus``, so that the neighbour pair differs by
the drawn row only, and a statement's ``{table}`` names either (``FROM rcv_<shape>_{table}``).

dpproxy's own load check decides which shapes a policy may protect: :func:`check_shapes` resolves
a policy protecting one shape's pair at a time, as ``serve`` and ``check-config`` do
(``proxy.backend.connection.build_registry``), and returns each refusal's text. :func:`unchecked`
plans with the part of that check that judges a relation's expressions
(``proxy/backend/row_failures.py``) bypassed, to measure what it refuses: a tool's switch, never
dpproxy's.

Row-level security policies and generated columns are benchmarks/table_shapes.py's: tables of
their own (a policy on ``rc_base`` would apply to every statement, and a refused one refuse it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import psycopg
import yaml

from policies.loader import PolicyError, load_policy
from proxy.backend.connection import build_registry, connect

__all__ = ["SHAPES", "VIEW_COLUMNS", "ViewShape", "check_shapes", "create_views", "shape_policy", "unchecked"]

# The columns a view shows by default: every column a drawn statement reads (timing_fuzz's), and id.
VIEW_COLUMNS = ("id", "age", "big", "n", "f", "t", "v", "ci", "cat", "d", "ts", "b", "dn", "nx", "dt", "tx", "by", "nd")
_TABLES = ("rc_base", "rc_plus")


@dataclass(frozen=True)
class ViewShape:
    """A view over ``{table}`` (aliased ``s``): each of :data:`VIEW_COLUMNS` as it is unless
    ``outputs`` computes it (by the view's column name, SQL over ``s``) or ``dropped`` leaves it out;
    ``tail`` follows ``FROM {table} s`` (joins, WHERE, GROUP BY); ``over`` names the shape whose view
    it reads instead of the table; ``sources`` gives, for a computed column, the base columns whose
    values decide it (the adversarial row varies those)."""

    name: str
    outputs: Mapping[str, str] = field(default_factory=dict)
    tail: str = ""
    options: str = ""
    distinct: bool = False
    over: str | None = None
    dropped: tuple[str, ...] = ()
    sources: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    varied: tuple[str, ...] = ()
    """Base columns the relation reads besides the ones the statement reads (a row-level security
    policy's, benchmarks/table_shapes.py): the adversarial row varies one of them too, at times."""
    least_major: int = 0
    """The oldest PostgreSQL major version the shape can be created on (0: any)."""

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for c in VIEW_COLUMNS if c not in self.dropped)

    def relation(self, table: str) -> str:
        return f"rcv_{self.name}_{table}"

    @property
    def role(self) -> str | None:
        """The role a statement over the shape is measured as (None: the superuser row_cost measures as)."""
        return None

    def drop(self, table: str) -> str:
        """The SQL that drops this shape's relation over ``table``, and what depends on it."""
        return f"DROP VIEW IF EXISTS {self.relation(table)} CASCADE"

    def settle(self, table: str) -> tuple[str, ...]:
        """Statements to run on their own once the relation over ``table`` is created (none for a view)."""
        return ()

    def create(self, table: str) -> str:
        """The ``CREATE VIEW`` of this shape over ``table`` (rc_base or rc_plus)."""
        select = ", ".join(f"{self.outputs.get(c, f's.{c}')} AS {c}" for c in self.columns)
        source = table if self.over is None else f"rcv_{self.over}_{table}"
        tail = f" {self.tail.format(table=table)}" if self.tail else ""
        options = f" WITH ({self.options})" if self.options else ""
        return (f"CREATE VIEW {self.relation(table)}{options} AS SELECT {'DISTINCT ' if self.distinct else ''}{select} "
                f"FROM {source} s{tail}")

    @property
    def summary(self) -> str:
        """What sets the shape apart from ``SELECT <the columns> FROM {table} s``, in SQL."""
        parts = [f"{expression} AS {column}" for column, expression in self.outputs.items()]
        parts += [f"WITH ({self.options})"] if self.options else []
        parts += ["DISTINCT"] if self.distinct else []
        parts += [f"FROM rcv_{self.over}_{{table}} s"] if self.over else []
        parts += [self.tail] if self.tail else []
        parts += [f"without {', '.join(self.dropped)}"] if self.dropped else []
        return "; ".join(parts) or "the columns as they are"

    def base_columns(self, column: str) -> tuple[str, ...]:
        """The base columns whose values decide the view's ``column``."""
        return self.sources.get(column, (column,))


def _aggregated() -> dict[str, str]:
    """Every column but id as an aggregate of the group's rows (bool_or for the boolean)."""
    return {c: ("bool_or(s.b)" if c == "b" else f"max(s.{c})") for c in VIEW_COLUMNS if c not in ("id", "by")}


SHAPES: tuple[ViewShape, ...] = (
    ViewShape("plain"),
    ViewShape("renamed", {"t": "s.tx", "tx": "s.t"}, sources={"t": ("tx",), "tx": ("t",)}),
    ViewShape("binary_cast", {"t": "s.t::varchar", "v": "s.v::text"}),
    ViewShape("collate", {"t": 's.t COLLATE "C"', "v": 's.v COLLATE "C"'}),
    ViewShape("case_result", {"t": "CASE WHEN s.b THEN s.t END"}, sources={"t": ("t", "b")}),
    ViewShape("coalesce_result", {"t": "COALESCE(s.t, '')", "tx": "COALESCE(s.tx, s.t)"}, sources={"tx": ("tx", "t")}),
    ViewShape("case_on_text", {"age": "CASE WHEN s.t > 'm' THEN s.age END"}, sources={"age": ("t", "age")}),
    ViewShape("case_on_fixed", {"cat": "CASE WHEN s.age > 50 THEN 'c' ELSE s.cat END"}, sources={"cat": ("cat", "age")}),
    ViewShape("btrim", {"t": "btrim(s.t)"}),
    ViewShape("length", {"age": "length(s.t)"}, sources={"age": ("t",)}),
    ViewShape("bytea_length", {"big": "octet_length(s.by)::bigint"}, sources={"big": ("by",)}),
    ViewShape("text_size", {"age": "octet_length(s.t)"}, sources={"age": ("t",)}),
    ViewShape("where_nullif_null", tail="WHERE NULLIF(s.t, 'x') IS NOT NULL"),
    ViewShape("where_coalesce_equality", tail="WHERE COALESCE(s.t, s.tx) <> 'x'"),
    ViewShape("numeric_abs", {"n": "abs(s.n)"}),
    ViewShape("numeric_text", {"tx": "s.nx::text"}, sources={"tx": ("nx",)}),
    ViewShape("jsonb_text", {"tx": "s.j::text"}, sources={"tx": ("j",)}),
    ViewShape("varchar_cast", {"v": "s.t::varchar(300)"}, sources={"v": ("t",)}),
    ViewShape("fixed_arithmetic", {"f": "abs(s.f)", "n": "s.age::numeric"}, sources={"n": ("age",)}),
    ViewShape("integer_plus", {"age": "s.age + 1"}),
    ViewShape("whole_row", {"t": "CASE WHEN s IS NULL THEN NULL ELSE s.t END"}, sources={"t": ("t", "tx", "nx")}),
    ViewShape("where_text", tail="WHERE s.t > ''"),
    ViewShape("where_fixed", tail="WHERE s.id >= 0"),
    ViewShape("self_join", tail="JOIN {table} s2 ON s2.id = s.id"),
    ViewShape("self_join_text", tail="JOIN {table} s2 ON s2.id = s.id AND s2.t = s.t"),
    ViewShape("small_join", tail="LEFT JOIN rc_small k ON k.k = s.cat"),
    ViewShape("group_by_id", _aggregated(), tail="GROUP BY s.id", dropped=("by",)),
    ViewShape("distinct", distinct=True),
    ViewShape("barrier", options="security_barrier", tail="WHERE s.id >= 0"),
    ViewShape("barrier_btrim", {"t": "btrim(s.t)"}, options="security_barrier"),
    ViewShape("invoker", options="security_invoker = true"),
    ViewShape("invoker_btrim", {"t": "btrim(s.t)"}, options="security_invoker = true"),
    ViewShape("over_plain", over="plain"),
    ViewShape("over_btrim", over="btrim"),
    ViewShape("btrim_over_plain", {"t": "btrim(s.t)"}, over="plain"),
)


def create_views(dsn: str, shapes: Sequence[ViewShape] = SHAPES) -> None:
    """``shapes``' relations over both tables (after :func:`benchmarks.row_cost.load_tables`): views,
    or the tables of benchmarks/table_shapes.py; and the small table a join reads; the base views
    before the views over them."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")  # a table's rows all-visible once vacuumed (row_cost._writer)
        conn.execute("DROP TABLE IF EXISTS rc_small CASCADE")
        conn.execute("CREATE TABLE rc_small (k text PRIMARY KEY, label text)")
        conn.execute("INSERT INTO rc_small VALUES ('a', 'first'), ('b', 'second'), ('c', 'third')")
        for shape in sorted(shapes, key=lambda s: s.over is not None):
            for table in _TABLES:
                conn.execute(shape.drop(table))
                conn.execute(shape.create(table))
                for statement in shape.settle(table):
                    conn.execute(statement)


def shape_policy(base: Path, shapes: Sequence[ViewShape], path: Path) -> Path:
    """row_cost's policy (``base``) with both views of each of ``shapes`` protected as its tables
    are (the columns each view shows), written to ``path``."""
    policy: dict[str, Any] = yaml.safe_load(base.read_text(encoding="utf-8"))
    table = policy["tables"]["public.rc_base"]
    for shape in shapes:
        columns = {c: spec for c, spec in table["columns"].items() if c in shape.columns}
        for name in _TABLES:
            policy["tables"][f"public.{shape.relation(name)}"] = {**table, "columns": columns}
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


async def _refusal(path: Path) -> str | None:
    policy = load_policy(path)
    backend = await connect(policy)
    try:
        await build_registry(backend, policy)
    except PolicyError as error:
        return "; ".join([p for p in error.problems if "_rc_base" in p] or error.problems)
    finally:
        await backend.close()
    return None


def check_shapes(base: Path, directory: Path, shapes: Sequence[ViewShape] = SHAPES) -> dict[str, str | None]:
    """Each shape's load check, one shape a policy (row_cost's, ``base``, with that shape's pair
    protected): None where dpproxy accepts it, else its refusal's text."""
    return {shape.name: asyncio.run(_refusal(shape_policy(base, [shape], directory / f"{shape.name}.yaml")))
            for shape in shapes}


async def _nothing_fails(*args: object) -> list[str]:
    return []


@contextmanager
def unchecked() -> Iterator[None]:
    """Plan with the check of a protected relation's expressions (``failing_protected``:
    what can fail on a row, and a view's columns computed from a value of any length) bypassed."""
    with mock.patch("proxy.backend.connection.failing_protected", _nothing_fails):
        yield
