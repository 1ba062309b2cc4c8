"""Protected tables with row-level security policies or generated columns, for the timing fuzzer.

A catalogue (:data:`TABLE_SHAPES`) of what a protected *table* can compute or filter while the
backend reads it, beside benchmarks/view_shapes.py's views: row-level security policies whose
``USING`` reads the table's columns (permissive, restrictive, several OR-ed, reading columns the
statement does not, a subquery, a function of the session) and generated columns, ``STORED``
(computed when the row is written) and, on PostgreSQL 18, ``VIRTUAL`` (computed at each read).
Each shape is a pair of tables, ``rcv_<shape>_rc_base`` and ``rcv_<shape>_rc_plus``: copies of
row_cost's tables (``LIKE … INCLUDING ALL``: their storage, key and collations) holding their
rows, a generated column replacing the column of its name. row_cost writes the neighbour's row
into the copy a statement reads as it writes ``rc_plus`` (``_set_row``: the columns that are not
generated), so the pair still differs by the drawn row only.

A policy applies to neither a superuser nor a table's owner, so statements over a shape with
policies are measured as :data:`READER`, a role of no other privilege than reading the shapes'
tables (``Construct.role``); dpproxy's own load check still judges each shape as the
superuser's backend sees it, policies and generated expressions included
(``proxy/backend/row_failures.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from benchmarks.row_cost import ORDINARY_ROW
from benchmarks.view_shapes import ViewShape

__all__ = ["READER", "TABLE_SHAPES", "TableShape"]

READER = "rc_reader"
"""The role statements over a shape with policies are measured as (NOLOGIN, reads the shapes' tables)."""


@dataclass(frozen=True)
class TableShape(ViewShape):
    """A copy of ``{table}`` with ``generated`` columns (by name: its type and ``GENERATED ALWAYS AS
    (…) STORED`` or ``VIRTUAL``, replacing the column of that name) and row-level security
    ``policies`` (each what follows ``CREATE POLICY pN ON <table>``, ``TO`` :data:`READER` added).
    ``sources`` gives the base columns a generated column is computed from, ``varied`` the columns
    the policies read (the adversarial row varies those)."""

    generated: Mapping[str, str] = field(default_factory=dict)
    policies: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A generated column is the shape's computed column: what a statement over it reads.
        object.__setattr__(self, "outputs", {column: definition for column, definition in self.generated.items()})

    @property
    def role(self) -> str | None:
        return READER if self.policies else None

    def drop(self, table: str) -> str:
        return f"DROP TABLE IF EXISTS {self.relation(table)} CASCADE"

    def create(self, table: str) -> str:
        """The statements that make this shape's copy of ``table`` (rc_base or rc_plus), its rows
        copied (the neighbour's row is written per case), readable by :data:`READER`."""
        relation = self.relation(table)
        steps = [f"DO $$ BEGIN CREATE ROLE {READER} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
                 f"CREATE TABLE {relation} (LIKE {table} INCLUDING ALL)"]
        if self.generated:
            changes = [f"DROP COLUMN {column}" for column in self.generated]
            changes += [f"ADD COLUMN {column} {definition}" for column, definition in self.generated.items()]
            steps.append(f"ALTER TABLE {relation} {', '.join(changes)}")
        written = ", ".join(c for c in (*ORDINARY_ROW, "pad") if c not in self.generated)
        steps.append(f"INSERT INTO {relation} ({written}) SELECT {written} FROM {table} WHERE id <> 0")
        if self.policies:
            steps.append(f"ALTER TABLE {relation} ENABLE ROW LEVEL SECURITY")
            steps += [f"CREATE POLICY p{number} ON {relation} {policy.replace(' USING ', f' TO {READER} USING ', 1)}"
                      for number, policy in enumerate(self.policies)]
            steps.append(f"GRANT SELECT ON rc_small TO {READER}")  # what a policy's subquery reads
        steps.append(f"GRANT SELECT ON {relation} TO {READER}")
        return "; ".join(steps)

    def settle(self, table: str) -> tuple[str, ...]:
        """Vacuumed and analysed as row_cost's tables are: planned from statistics, every page all-visible."""
        return (f"VACUUM ANALYZE {self.relation(table)}",)

    @property
    def summary(self) -> str:
        parts = [f"{column} {definition}" for column, definition in self.generated.items()]
        parts += [f"POLICY {policy}" for policy in self.policies]
        return "; ".join(parts)


_ANY = "AS PERMISSIVE FOR SELECT USING (true)"  # a restrictive policy alone admits no row

TABLE_SHAPES: tuple[TableShape, ...] = (
    # Row-level security: USING over fixed-length columns, booleans, a bounded text equality, a
    # header-only read, a function of the session; restrictive beside a permissive; two permissive
    # ones OR-ed; and the forms the load check refuses (an order on text, arithmetic, a subquery
    # over another table, a numeric of no declared precision).
    TableShape("rls_fixed", policies=("FOR SELECT USING (age >= 0 OR age IS NULL)",), varied=("age",)),
    TableShape("rls_boolean", policies=("FOR SELECT USING (b IS NOT FALSE)",), varied=("b",)),
    TableShape("rls_text_equal", policies=("FOR SELECT USING (cat = 'a' OR cat = 'b' OR cat <> 'z')",), varied=("cat",)),
    TableShape("rls_null_test", policies=("FOR SELECT USING (t IS NOT NULL OR tx IS NULL)",), varied=("t", "tx")),
    TableShape("rls_octet_length", policies=("FOR SELECT USING (octet_length(t) < 100000 OR t IS NULL)",), varied=("t",)),
    TableShape("rls_session", policies=(f"FOR SELECT USING (current_user = '{READER}' AND (b OR NOT b OR b IS NULL))",),
               varied=("b",)),
    TableShape("rls_restrictive", policies=(_ANY, "AS RESTRICTIVE FOR SELECT USING (d >= '2000-01-01' OR d IS NULL)"),
               varied=("d",)),
    TableShape("rls_restrictive_pair", policies=(_ANY, "AS RESTRICTIVE FOR SELECT USING (ts < 'infinity' OR ts IS NULL)",
                                                 "AS RESTRICTIVE FOR SELECT USING (big <> 7 OR big IS NULL)"),
               varied=("ts", "big")),
    TableShape("rls_two_permissive", policies=("FOR SELECT USING (age < 50)", "FOR SELECT USING (age >= 50 OR age IS NULL)"),
               varied=("age",)),
    TableShape("rls_text_order", policies=("FOR SELECT USING (t > '' OR t IS NULL OR t = '')",), varied=("t",)),
    TableShape("rls_arithmetic", policies=("FOR SELECT USING (age + 1 > 0 OR age IS NULL)",), varied=("age",)),
    TableShape("rls_subquery", policies=("FOR SELECT USING (EXISTS (SELECT 1 FROM rc_small k WHERE k.k = cat) OR true)",),
               varied=("cat",)),
    TableShape("rls_wide_numeric", policies=("FOR SELECT USING (nx >= 0 OR nx < 0 OR nx IS NULL)",), varied=("nx",)),
    # Stored generated columns: computed when the row is written, read as stored.
    TableShape("stored_btrim", generated={"t": "text GENERATED ALWAYS AS (btrim(tx)) STORED"}, sources={"t": ("tx",)}),
    TableShape("stored_length", generated={"age": "integer GENERATED ALWAYS AS (length(tx)) STORED"}, sources={"age": ("tx",)}),
    TableShape("stored_abs", generated={"n": "numeric GENERATED ALWAYS AS (abs(nx)) STORED"}, sources={"n": ("nx",)}),
    TableShape("stored_case", generated={"cat": "text GENERATED ALWAYS AS (CASE WHEN age > 50 THEN 'c' ELSE 'a' END) STORED"},
               sources={"cat": ("age",)}),
    TableShape("stored_case_on_text",
               generated={"f": "double precision GENERATED ALWAYS AS (CASE WHEN tx > 'm' THEN 75.5 ELSE 25.5 END) STORED"},
               sources={"f": ("tx",)}),
    # PostgreSQL 18's virtual generated columns: computed at each read, as a view's column is.
    TableShape("virtual_case", generated={"cat": "text GENERATED ALWAYS AS (CASE WHEN age > 50 THEN 'c' ELSE 'a' END) VIRTUAL"},
               sources={"cat": ("age",)}, least_major=18),
    TableShape("virtual_widening", generated={"n": "numeric GENERATED ALWAYS AS (abs(age::numeric)) VIRTUAL"},
               sources={"n": ("age",)}, least_major=18),
    TableShape("virtual_btrim", generated={"t": "text GENERATED ALWAYS AS (btrim(tx)) VIRTUAL"}, sources={"t": ("tx",)},
               least_major=18),
    TableShape("virtual_arithmetic", generated={"big": "bigint GENERATED ALWAYS AS (age + 1) VIRTUAL"},
               sources={"big": ("age",)}, least_major=18),
)
