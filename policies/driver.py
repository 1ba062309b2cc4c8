"""SQLAlchemy statements compiled once, run on the DB-API driver's own cursor.

The ledger's charge runs on every ``ledger.reserve``-th DP answer. Through a SQLAlchemy
``Connection`` it costs ~150 µs of Python per charge (execution contexts, events, result
objects), most of it holding the GIL that the event loop needs. A :class:`DriverStatement`
keeps SQLAlchemy's dialect-correct SQL text and its type conversions for parameters, and
leaves the rest to the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler

__all__ = ["DriverStatement"]


@dataclass(frozen=True)
class DriverStatement:
    """One statement as the driver takes it: SQL text in its paramstyle, and how to bind."""

    sql: str
    order: tuple[str, ...] | None  # parameter names in positional order; None: named
    convert: Mapping[str, Callable[[Any], Any]]  # the column types' bind conversions

    @classmethod
    def compile(cls, statement: sa.ClauseElement, dialect: Dialect) -> DriverStatement:
        compiled = statement.compile(dialect=dialect)
        assert isinstance(compiled, SQLCompiler)  # a DML statement's, with binds and positions
        convert = {}
        for name, bind in compiled.binds.items():
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                convert[name] = processor
        order = tuple(compiled.positiontup or ()) if compiled.positional else None
        return cls(compiled.string, order, convert)

    def parameters(self, values: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        """``values`` by name, converted and arranged for the driver's ``execute``."""
        bound = {name: self.convert[name](value) if name in self.convert else value for name, value in values.items()}
        if self.order is None:
            return bound
        return tuple(bound[name] for name in self.order)
