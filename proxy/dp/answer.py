"""Turn a DP plan's exact backend values into the noised values the client receives.

The query's ε is split evenly over its k releases (sequential composition): each aggregate
column is one, except that columns released by the same mechanism from the same exact parts are
one release, drawn once, and the variances and standard deviations of one column under one
condition are one release together, with an AVG of the column beside them in a small statement
(``proxy.dp.release_units``: their moments are drawn once).
Each release is drawn by its mechanism (``proxy.dp.column_release``) and each column encoded with
the type PostgreSQL would have reported for it in the original query. δ is not split
(docs/mechanisms.md): the answer's δ is the sum of its releases' δ, the table's δ for each
sample-and-aggregate release and 0 for the others.

A GROUP BY over declared keys releases one row per cell: each column is released in every
cell with its release's whole share ε/k, because the cells are disjoint (one row is in at most
one cell, so adding or removing it changes one cell's values: parallel composition,
docs/mechanisms.md). The cells' keys come from the policy, not from the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Iterator, Sequence

from mechanisms.quantile import QuantileRelease, QuantilesRelease
from mechanisms.release import Release
from mechanisms.sum_count import mean_noise
from mechanisms.variance import MomentsRelease, moment_noise
from proxy.backend.connection import BoundParams, ResultSet
from proxy.wire.protocol import Field
from proxy.wire.binary import TEXT
from proxy.wire.values import TYPE_SIZES, encode_array_text, encode_text
from policies.time_buckets import truncate
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.group_keys import GroupKey
from rewriter.rewrite import quantile_grid, split_cells, split_row
from rewriter.percentiles import decimal_text
from rewriter.types import ARRAY_ELEMENTS, ARRAY_TYPES, FLOAT_TYPES, INT4, INTEGER_TYPES, NUMERIC

from .column_release import release_columns
from .release_units import release_count, release_units

__all__ = ["DPAnswer", "declared_keys", "kept_series", "numeric_scale", "numeric_typmod_scale", "query_delta", "ranking_params", "release_cells",
           "release_params", "release_row", "released_labels", "result_fields", "selection_candidates", "series_release",
           "trial_params", "witness_params"]


@dataclass(frozen=True)
class DPAnswer:
    """The noised values and what they cost: total ε and δ, and how each column was noised.

    ``result`` is the released row with the statement's column names (one aggregate row), or
    the released cells (GROUP BY: each cell's keys, then its aggregates; named by their SQL).
    ``noise`` describes each column's noise in every cell of a GROUP BY, for the notice.
    ``ranked``: a series limit's answer before its ranking's outer statement kept any cell
    (:func:`series_release`, what is stored for repeats), the ranking's release.
    """

    result: ResultSet
    epsilon: float
    delta: float
    releases: tuple[Release[Any], ...]  # each column's (of the first cell, for a GROUP BY)
    noise: tuple[str, ...] = ()
    cells: int = 0  # GROUP BY cells; 0 for one aggregate row
    units: tuple[int, ...] = ()  # each column's release (proxy.dp.release_units); () when each is its own
    ranked: DPAnswer | None = None

    def notice(self, repeat: bool = False) -> str:
        """One line for the analyst: the cost and each column's noise (``repeat``: charged nothing,
        since these are the values an earlier answer released)."""
        if self.cells and not self.releases and not self.epsilon:
            return (f"dpproxy: ε charged 0, δ 0 for {self._groups()} (their declared keys only, from the policy: "
                    "no row is read and nothing is released)")
        if repeat:
            cost = "ε charged 0, δ 0 (a repeat of an earlier answer: the same noised values)"
        else:
            cost = f"ε charged {self.epsilon:g}, δ {self.delta:g}"
        if not self.cells:
            names = [f.name for f in self.result.fields]
            columns = ", ".join(_described(name, rel, shared)
                                for name, rel, shared in zip(names, self.releases, _shared(names, self.releases, self.units)))
            return f"dpproxy: {cost}; {columns}"
        shared = "" if repeat else " (each row is in one group, so the groups share that ε)"
        return f"dpproxy: {cost} for {self._groups()}{shared}; per group: {', '.join(self.noise)}"

    def _groups(self) -> str:
        return f"{self.cells} group{'' if self.cells == 1 else 's'}"

    def named_for(self, plan: AggregateQuery) -> DPAnswer:
        """The same released values headed as ``plan`` (a repeat) names its columns.

        A repeat has the same backend SQL, aggregates and keys' cells (the repeat key holds all
        three), hence the same types; only the names the statement gives them may differ (a
        GROUP BY's names come from its outer statement).
        """
        if plan.groups:
            return self
        result = ResultSet(result_fields(plan), self.result.rows, self.result.tag)
        return replace(self, result=result)


def result_fields(plan: AggregateQuery) -> list[Field]:
    """The RowDescription PostgreSQL would send for the original query (one aggregate row)."""
    return [
        Field(agg.output_name, agg.result_type_oid, TYPE_SIZES.get(agg.result_type_oid, -1))
        for agg in plan.aggregates
    ]


def release_row(plan: AggregateQuery, exact: Sequence[Any], epsilon: float, codec: str = "utf-8") -> DPAnswer:
    """Noise every column of the backend row ``exact`` (``backend_sql(plan)``'s) with ε/k each,
    its text in ``codec`` (the session's client_encoding; see :func:`released_labels`).

    The total cost is (ε, Σ δ_column).
    """
    fields = result_fields(plan)
    if plan.limit_zero:
        return DPAnswer(ResultSet(fields, [], "SELECT 0"), 0.0, 0.0, ())
    units = release_units(plan.aggregates)
    share = epsilon / release_count(plan)
    parts = split_row(plan, exact)
    releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)
    row = _encoded(plan, releases, codec)
    delta = sum(rel.delta for rel in {id(rel): rel for rel in releases}.values())  # each release once
    return DPAnswer(ResultSet(fields, [row], "SELECT 1"), epsilon, delta, tuple(releases), units=units)


def release_cells(plan: AggregateQuery, rows: Sequence[Sequence[Any]], epsilon: float, codec: str = "utf-8") -> DPAnswer:
    """Noise every aggregate in every cell of a GROUP BY, each with its release's share ε/k,
    its keys and text in ``codec`` (the session's client_encoding).

    ``rows`` are the grouped backend query's rows, loaded (``backend_sql(plan)``). The cost is
    (ε, 0): every mechanism a cell may use is pure ε-DP.
    """
    units = release_units(plan.aggregates)
    share = epsilon / release_count(plan)
    encoded: list[list[bytes | None]] = []
    first: list[Release[Any]] = []
    for keys, parts in zip(_cell_keys(plan, codec), split_cells(plan, rows)):
        releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)
        first = first or releases
        encoded.append([*keys, *_encoded(plan, releases, codec)])
    fields = _key_fields(plan) + [Field(agg.output_name, agg.result_type_oid) for agg in plan.aggregates]
    names = [agg.output_name for agg in plan.aggregates]
    noise = tuple(_per_cell(agg, share, release, shared)
                  for agg, release, shared in zip(plan.aggregates, first, _shared(names, first, units)))
    result = ResultSet(fields, encoded, f"SELECT {len(encoded)}")
    return DPAnswer(result, epsilon, 0.0, tuple(first), noise, cells=len(encoded), units=units)


def declared_keys(plan: AggregateQuery, codec: str = "utf-8") -> DPAnswer:
    """The cells' keys of a GROUP BY that asks for no aggregate (a filter's list of values), in
    ``codec`` (the session's client_encoding).

    They are the policy's declared keys, narrowed by the statement's own time bounds: no row is
    read, nothing is released and nothing is charged (ε 0). They are exactly the key columns
    :func:`release_cells` returns for the same GROUP BY with aggregates, whatever the rows.
    """
    if plan.aggregates or not plan.groups:
        raise ValueError("declared_keys answers a GROUP BY without aggregates")
    encoded: list[list[bytes | None]] = [list(keys) for keys in _cell_keys(plan, codec)]
    return DPAnswer(ResultSet(_key_fields(plan), encoded, f"SELECT {len(encoded)}"), 0.0, 0.0, (), cells=len(encoded))


def ranking_params(plan: AggregateQuery, answer: DPAnswer) -> BoundParams:
    """The values a ranking's outer statement reads (``rewriter.series_limit``): the release's
    (:func:`release_params`), then the cells' numbers 1 … n, which it returns for each row it keeps."""
    return _numbered(release_params(plan, answer), len(answer.result.rows))


def _numbered(params: BoundParams, cells: int) -> BoundParams:
    """``params`` and, last, the cells' numbers 1 … ``cells`` (a ranking's outer statement reads them)."""
    numbers = _array_literal([str(cell).encode() for cell in range(1, cells + 1)])
    return BoundParams([*params.values, numbers], [*params.formats, 0], [*params.types, ARRAY_TYPES[INT4]])


def series_release(answer: DPAnswer, ranked: DPAnswer) -> DPAnswer:
    """A series limit's two releases as one answer: ``answer``'s cells, all of them, with ``ranked``
    (the ranking's release) beside them; its cost is both releases' (ε and δ summed) and its notice
    names the ranking's noise too. It is what was released, and what is stored for repeats: the
    ranking's outer statement, which :func:`kept_series` follows, runs over it for each answer,
    a repeat's included, and fails or keeps the same cells on the same values."""
    noise = (*answer.noise, *(f"series ranking {line}" for line in ranked.noise))
    return replace(answer, epsilon=answer.epsilon + ranked.epsilon, delta=answer.delta + ranked.delta, noise=noise,
                   ranked=ranked)


def kept_series(plan: AggregateQuery, answer: DPAnswer, kept: Sequence[int], codec: str = "utf-8") -> DPAnswer:
    """``answer`` (a :func:`series_release`: ``plan``'s cells, keys in ``codec``) with only the cells
    whose join keys are those of a ranking cell that was kept (``kept``: their 1-based numbers);
    post-processing of both releases. Its cost and notice are ``answer``'s."""
    assert plan.series is not None
    pairs = plan.series.pairs
    ranking = plan.series.ranking
    labels = list(_cell_keys(ranking, codec))
    series = {tuple(_series_value(ranking.groups[ranked], labels[cell - 1][ranked]) for _, ranked in pairs)
              for cell in kept}
    rows = [row for row in answer.result.rows
            if tuple(_series_value(plan.groups[key], row[key]) for key, _ in pairs) in series]
    return replace(answer, result=ResultSet(answer.result.fields, rows, f"SELECT {len(rows)}"), ranked=None)


def _series_value(key: GroupKey, label: bytes | None) -> object:
    """What a series is kept by: a key's label, or for a date part (whose cells each plan names by
    a time of its own, ``rewriter.key_domain``) the part's value at that time."""
    if key.part is None or key.unit is None or label is None:
        return label
    return key.value_at(truncate(key.unit, datetime.fromisoformat(label.decode("ascii"))))


def selection_candidates(plan: AggregateQuery) -> int:
    """How many candidates the plan's exponential mechanisms score and draw over, all its cells
    together (a MODE's declared categories, a percentile's grid): the policy's and the
    statement's, never the rows'. It measures a release's work: ~1.4 ms per 1,000 here."""
    per_cell = 0
    for agg in plan.aggregates:
        if agg.mechanism == "exponential" and agg.column is not None and agg.column.policy is not None:
            per_cell += len(agg.column.policy.categories or ())
        elif agg.mechanism == "quantile" and agg.column is not None:
            per_cell += quantile_grid(agg.column, plan.table.policy).count * max(1, len(agg.fractions))
    return per_cell * plan.domain.size


def _cell_keys(plan: AggregateQuery, codec: str) -> Iterator[tuple[bytes, ...]]:
    """Every cell's keys, as text in ``codec``, in cell order (``plan.domain``'s)."""
    return (tuple(label.encode(codec) for label in labels) for labels in plan.domain.labels())


def _key_fields(plan: AggregateQuery) -> list[Field]:
    return [Field(f"_k{i}", key.result_type_oid) for i, key in enumerate(plan.groups, 1)]


def _encoded(plan: AggregateQuery, releases: Sequence[Release[Any]], codec: str) -> list[bytes | None]:
    return [encode_array_text(rel.value, ARRAY_ELEMENTS[agg.result_type_oid], numeric_scale(agg)) if agg.fractions
            else encode_text(rel.value, agg.result_type_oid, numeric_scale(agg), codec)
            for agg, rel in zip(plan.aggregates, releases)]


def released_labels(plan: AggregateQuery) -> Iterator[str]:
    """Every text an answer to ``plan`` may release: its cells' keys, and the categories a MODE
    may name. All come from the policy, so whether the session's encoding can write them is
    known before the charge."""
    for key in plan.groups:
        if key.kind == "category":  # the others' keys are numbers and dates, in ASCII
            yield from key.labels()
    for agg in plan.aggregates:
        if agg.kind == "mode" and agg.column is not None and agg.column.policy is not None:
            yield from agg.column.labels()


def _shared(names: Sequence[str], releases: Sequence[Release[Any]], units: Sequence[int]) -> list[tuple[str, bool] | None]:
    """For each column that is not the first of its release: the name of the column whose notice
    describes the release's noise (its first, or the first variance of a release of noisy
    moments, whose notice gives the moments' scales) and whether it is that column's very release
    (the same value) rather than computed from its moments; None for the others. ``units`` as
    :func:`proxy.dp.release_units.release_units` gives them, ``releases`` as
    :func:`proxy.dp.column_release.release_columns` draws them."""
    if not units:
        return [None] * len(names)
    lead: dict[int, int] = {}
    for index, (unit, release) in enumerate(zip(units, releases)):
        if isinstance(release, MomentsRelease):
            lead.setdefault(unit, index)
    for index, unit in enumerate(units):
        lead.setdefault(unit, index)
    return [None if lead[unit] == index else (names[lead[unit]], releases[index] is releases[lead[unit]])
            for index, unit in enumerate(units)]


def _described(name: str, release: Release[Any], shared: tuple[str, bool] | None = None) -> str:
    """One column's noise as the analyst reads it: the mechanism and the 95% bound that matters
    (``shared``: as :func:`_shared` gives it, the column whose release this column repeats, or
    whose noisy moments a variance or an AVG is computed from, named instead of the scales)."""
    if shared is not None and shared[1]:
        return f"{name}: the same release as {shared[0]}, no more ε"
    if release.mechanism == "smooth_median":
        # The noise actually used depends on the data, so only the worst case over all data is shown.
        return f"{name}: sample and aggregate, worst-case 95% bound ±{release.error95:.4g}"
    if release.mechanism == "exponential":
        return f"{name}: exponential mechanism, 95% within {release.error95:.4g} rows of the top category's count"
    if isinstance(release, QuantilesRelease):
        chosen = release.each[0]
        bounds = ", ".join(f"{c.error95:.4g} rows at {decimal_text(p)}" for c, p in zip(release.each, release.fractions))
        return (f"{name}: exponential mechanism over {chosen.candidates} candidates {chosen.step:.4g} apart, "
                f"ε {chosen.epsilon:.4g} for each of {len(release.each)} fractions, 95% within each quantile's rank "
                f"by {bounds}")
    if isinstance(release, QuantileRelease):
        return (f"{name}: exponential mechanism over {release.candidates} candidates {release.step:.4g} apart, "
                f"95% within {release.error95:.4g} rows of the quantile's rank")
    if release.mechanism == "sum_count":
        return f"{name}: noisy sum / noisy count, scale {release.scale:.4g} (95% within ±{release.error95:.4g})"
    if shared is not None:
        return f"{name}: from {shared[0]}'s noisy moments, no more ε (95% within ±{release.error95:.4g})"
    if isinstance(release, MomentsRelease):
        return f"{name}: {_moments(*release.scales)} (95% within ±{release.error95:.4g})"
    return f"{name}: {release.mechanism} scale {release.scale:.4g} (95% within ±{release.error95:.4g})"


def _moments(count: float, centred: float, squares: float) -> str:
    """How a variance's three noisy parts are described: the mechanism and each part's scale."""
    return (f"noisy moments (count, centred sum, centred sum of squares), scales {count:.4g}, {centred:.4g} "
            f"and {squares:.4g}")


def _per_cell(agg: Aggregate, share: float, release: Release[Any], shared: tuple[str, bool] | None = None) -> str:
    """A column's noise in every cell, known before the data (``release``: one cell's;
    ``shared``: as for :func:`_described`)."""
    if shared is not None:
        how = "the same release as {}" if shared[1] else "from {}'s noisy moments"
        return f"{agg.output_name}: {how.format(shared[0])}, no more ε"
    if agg.mechanism not in ("sum_count", "moments"):
        return _described(agg.output_name, release)  # Laplace and exponential: the same in every cell
    assert agg.column is not None and agg.column.policy is not None and agg.column.policy.bounds is not None
    if agg.mechanism == "moments":
        scales = moment_noise(agg.column.policy.moment_grid(agg.column.type_oid in INTEGER_TYPES), share)
        return f"{agg.output_name}: {_moments(*scales)} (its error shrinks as 1/n in a group of n rows)"
    sum_scale, count_scale, bound = mean_noise(*agg.column.policy.bounds, share,
                                               on_grid=agg.column.type_oid in FLOAT_TYPES)
    return (f"{agg.output_name}: noisy sum / noisy count, scales {sum_scale:.4g} and {count_scale:.4g} "
            f"(95% within ±{bound:.5g}/n in a group of n rows)")


def release_params(plan: AggregateQuery, answer: DPAnswer | None) -> BoundParams:
    """The values the plan's outer statement reads the release from (rewriter/post_process.py).

    One aggregate row: ``$k`` is the k-th released value. GROUP BY: ``$k`` is an array over the
    cells of the k-th key, then of each aggregate. ``answer`` None (nothing released, LIMIT 0):
    NULLs of the same types.
    """
    return _params(plan, answer.result.rows if answer is not None else None)


def trial_params(plan: AggregateQuery, codec: str = "utf-8", ranking: bool = False) -> list[BoundParams]:
    """The outer statement's values before anything is released: every cell's keys (known from
    the statement and the policy) with NULL for every aggregate, and with each category a MODE
    may name in its place (the exponential mechanism picks one of the policy's labels).

    Run over them, the outer statement fails only where its keys and its text alone make it
    fail (``CAST(EXTRACT(YEAR FROM d) AS numeric(3, 0))``, a category's label cast to integer,
    ``1/0``): an error known before the charge, which therefore costs nothing. A MODE's label
    cast to a type that cannot hold it would fail after the charge, on the label the noise
    picks; tried here, it fails before. Without GROUP BY, one set of values per label (the
    outer statement reads one row); with it, one set over every cell once per label.
    ``ranking``: the plan ranks a series limit's series, and its outer statement reads the
    cells' numbers too.
    """
    picks = _trial_picks(plan, codec)
    if not plan.groups:
        return [_params(plan, [values]) for values in picks]
    rows = [[*keys, *values] for values in picks for keys in _cell_keys(plan, codec)]
    params = _params(plan, rows)
    return [_numbered(params, len(rows)) if ranking else params]


def witness_params(plan: AggregateQuery, codec: str = "utf-8", ranking: bool = False) -> BoundParams:
    """One fixed release for an outer statement that fails on every release
    (``rewriter.certain_errors``): 1 for every finite number column, NULL for the others, over
    every cell's keys. Chosen from the plan's types alone, never from a row or a released value;
    run over it, the statement shows whether any row reaches its failure (a HAVING over the keys
    may keep none) and which error PostgreSQL raises. ``ranking`` as for :func:`trial_params`."""
    witness: list[bytes | None] = [b"1" if agg.finite_number else None for agg in plan.aggregates]
    if not plan.groups:
        return _params(plan, [witness])
    rows = [[*keys, *witness] for keys in _cell_keys(plan, codec)]
    params = _params(plan, rows)
    return _numbered(params, len(rows)) if ranking else params


def _trial_picks(plan: AggregateQuery, codec: str) -> list[list[bytes | None]]:
    """The aggregates' trial values: all NULL, then the i-th label of each MODE (NULL past its
    last, and for every other aggregate)."""
    labels = [[encode_text(label, agg.result_type_oid, None, codec) for label in agg.column.policy.categories or ()]
              if agg.kind == "mode" and agg.column is not None and agg.column.policy is not None else []
              for agg in plan.aggregates]
    count = max((len(own) for own in labels), default=0)
    nulls: list[bytes | None] = [None] * len(labels)
    return [nulls] + [[own[i] if i < len(own) else None for own in labels] for i in range(count)]


def _params(plan: AggregateQuery, rows: Sequence[Sequence[bytes | None]] | None) -> BoundParams:
    if not plan.groups:
        types = [agg.result_type_oid for agg in plan.aggregates]
        values = list(rows[0]) if rows is not None else [None] * len(types)
        return BoundParams(values, [0] * len(values), types)
    # An array-valued aggregate's cells come as their texts, cast back by the outer statement
    # (rewriter.post_process: an array of arrays would be one two-dimensional array).
    types = [_array_type(key.result_type_oid, key.column) for key in plan.groups]
    types += [ARRAY_TYPES[TEXT] if agg.fractions else _array_type(agg.result_type_oid, agg.column)
              for agg in plan.aggregates]
    arrays: list[bytes | None] = [_array_literal([row[i] for row in rows or []]) for i in range(len(types))]
    return BoundParams(arrays, [0] * len(arrays), types)


def _array_type(type_oid: int, column: Any) -> int:
    """The array type of ``type_oid``: built-in ones known, a column's own from the backend's catalog."""
    if type_oid in ARRAY_TYPES:
        return ARRAY_TYPES[type_oid]
    if column is not None and column.type_oid == type_oid and column.array_type_oid:
        return int(column.array_type_oid)
    raise ValueError(f"no array type known for type oid {type_oid}")


def _array_literal(values: Sequence[bytes | None]) -> bytes:
    """A one-dimensional array in PostgreSQL's text input form: every element quoted, NULL bare."""
    elements = [b"NULL" if v is None else b'"' + v.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"' for v in values]
    return b"{" + b",".join(elements) + b"}"


def numeric_scale(agg: Aggregate) -> int | None:
    """Fraction digits of a numeric SUM/MIN/MAX result (None: as many as the value needs).

    A function of the schema and the statement's text alone: a numeric(p, s) column's s, 0 for
    SUM of an integer column, at least the fraction digits of a CASE's constant (``ELSE 0.0``).
    The exact sum's own scale would say how many fraction digits the rows hold (one row with a
    longer fraction, or NaN, changes it), so it is never used.

    A negative s (PostgreSQL 15's ``numeric(5, -2)``, values rounded to hundreds) is returned
    as it is for MIN, MAX and percentile_disc, which give a value of the column's type:
    :func:`proxy.wire.values.encode_text` rounds to 10^-s and prints no fraction digits, as
    PostgreSQL prints such a value. A SUM's value has no typmod and prints as its scale, 0.
    """
    if (ARRAY_ELEMENTS[agg.result_type_oid] if agg.fractions else agg.result_type_oid) != NUMERIC:
        return None  # the array form: its elements' scale, as for the single form
    if agg.kind == "count":  # a counted SUM(CASE WHEN p THEN 1 ELSE 0.0 END): the constants' digits
        return agg.scale
    column = agg.column
    if column is None or agg.kind not in ("sum", "min", "max", "percentile_disc"):
        return None
    if column.type_modifier >= 4:
        own = numeric_typmod_scale(column.type_modifier)
        if own < 0 and agg.kind != "sum" and not agg.scale:
            return own
    elif agg.kind == "sum" and column.type_oid in INTEGER_TYPES:
        own = 0
    else:
        return None
    # SUM(CASE WHEN p THEN col ELSE 0.0 END): PostgreSQL adds a 0.0 for each row that fails p, and
    # prints the wider scale when any row does; that it does is assumed, never looked up.
    return max(own, agg.scale or 0)


def numeric_typmod_scale(type_modifier: int) -> int:
    """The scale s of a ``numeric(p, s)`` typmod: PostgreSQL keeps it in the low 11 bits, signed
    since PostgreSQL 15 (``NUMERIC_TYPMOD_SCALE``; ``numeric(5, -2)`` is 2046 read unsigned)."""
    return (((type_modifier - 4) & 0x7FF) ^ 1024) - 1024


def query_delta(plan: AggregateQuery) -> float:
    """The δ an answer to ``plan`` will cost, known before it runs (charged up front).

    The table's δ for each sample-and-aggregate release (two columns of one release cost it
    once: ``proxy.dp.release_units``), 0 for every other mechanism; ``release_row`` reports the
    same sum after the fact.
    """
    sampled = [index for index, agg in enumerate(plan.aggregates) if agg.mechanism == "sample_aggregate"]
    if not sampled:
        return 0.0
    units = release_units(plan.aggregates)
    releases = {units[index] for index in sampled} if units else sampled
    return sum(plan.table.policy.delta for _ in releases)

