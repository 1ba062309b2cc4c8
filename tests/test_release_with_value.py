"""mechanisms.release.Release.with_value: the release with a post-processed value, all else kept."""

from __future__ import annotations

from dataclasses import fields, replace
from fractions import Fraction

import numpy as np

from mechanisms.quantile import QuantileGrid, release_quantiles
from mechanisms.release import Release
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo
from proxy.dp.column_release import release_column
from rewriter.dp_query import Aggregate


def test_with_value_keeps_every_other_field_as_replace_does() -> None:
    release = Release(38.6, 0.25, 1e-6, 3.5, 7.25, "smooth_median")
    rounded = release.with_value(39)
    assert rounded == replace(release, value=39)
    assert [getattr(rounded, f.name) for f in fields(Release) if f.name != "value"] == \
        [getattr(release, f.name) for f in fields(Release) if f.name != "value"]


def test_an_integer_columns_sample_and_aggregate_min_is_an_integer_release_of_its_column() -> None:
    age = ColumnPolicy(bounds=(17, 90))
    table = TablePolicy(epsilon=1.0, delta=1e-6, partitions=8, columns={"age": age})
    agg = Aggregate("min", ColumnInfo("age", 23, -1, 1, age), "min", 23, mechanism="sample_aggregate")
    release = release_column(agg, (np.array([30.0, 31.0, 29.0, 40.0, 35.0, 33.0]),), 0.5, table)
    assert isinstance(release.value, int) and 17 <= release.value <= 90
    assert (release.epsilon, release.delta, release.mechanism) == (0.5, 1e-6, "smooth_median")


def test_a_subclass_keeps_its_own_fields_and_type() -> None:
    several = release_quantiles(QuantileGrid.for_bounds(0.0, 100.0, False, 64), [5] * 64, (Fraction(1, 4), Fraction(3, 4)), 0.5)
    rounded = several.with_value(tuple(int(round(v)) for v in several.value))
    assert type(rounded) is type(several)
    assert rounded == replace(several, value=rounded.value)
