"""The calibration sites ``guard_ablation.py --sites calibration`` mutates, and the tests each must fail.

A calibration site is a place where a number of the guarantee is decided: a noise scale, a
sensitivity, the bounds the backend clamps to, the share of ε a column or a half of AVG gets,
the smoothing of the smooth sensitivity, the amount charged to the ledger and how the ledger
compares it with the limit, what makes a repeat free, a noise draw used once. Each mutation
makes the guarantee *quietly* weaker while every answer still looks plausible (a halved
scale, ε where ε/k belongs, sensitivity 1 for a SUM, a clamp twice as wide as the scale
assumes, half the charge, a repeat keyed without its parameters, a draw handed out twice,
``<=`` where ``<`` belongs). A refusal guard that no test pins is ``guard_sites``' business;
these are the numbers behind the answers that are given.

The :class:`guard_sites.Site` of each is a file, a snippet that occurs in it exactly once and
its mutated text; the selections are the tests of the area that observe the number (through
the proxy where that is how it is seen, the mechanism's unit tests where they are sharper).
"""

from __future__ import annotations

from guard_sites import Site

__all__ = ["SELECTIONS", "SITES", "WIDER"]

_NOISE = ("tests/test_noise_pool.py", "tests/test_smooth_median.py", "tests/test_exponential_mechanism.py",
          "tests/test_calibration.py")
_ANSWERS = ("tests/test_dp_count_sum.py", "tests/test_dp_avg_min_max_mode.py", "tests/test_clamping.py",
            "tests/test_attack_mechanisms.py", "tests/test_attack_mechanisms_2.py", "tests/test_partition_key.py",
            "tests/test_calibration.py")

SELECTIONS: dict[str, tuple[str, ...]] = {
    "noise": _NOISE,
    "answers": _ANSWERS,
    "grouped": ("tests/test_histograms.py", "tests/test_conditional_aggregates.py", "tests/test_attack_histograms.py",
                "tests/test_bi_shapes.py::test_a_series_limit_is_charged_once_its_epsilon_split_over_both_releases",
                "tests/test_calibration.py"),
    "budget": ("tests/test_budget.py", "tests/test_ledger.py", "tests/test_budget_refill.py",
               "tests/test_budget_limits.py", "tests/test_attack_budget.py", "tests/test_backend_faults.py",
               "tests/test_calibration.py"),
    "repeats": ("tests/test_budget.py", "tests/test_attack_outputs.py", "tests/test_conditional_aggregates.py",
                "tests/test_calibration.py"),
    "variance": ("tests/test_variance_mechanism.py", "tests/test_variance.py"),
    "duplicates": ("tests/test_duplicate_releases.py",),
}

WIDER: dict[str, tuple[str, ...]] = {
    "noise": _ANSWERS,
    "answers": ("tests/test_attack_backend_sql.py", "tests/test_type_matrix.py", "tests/test_neighbour_fuzz.py"),
    "grouped": ("tests/test_attack_new_keys.py", "tests/test_query_shapes.py", "tests/test_neighbour_fuzz.py"),
    "budget": ("tests/test_budget_processes.py", "tests/test_budget_faults.py", "tests/test_attack_settings.py",
               "tests/test_epsilon_setting_transactions.py"),
    "repeats": ("tests/test_histograms.py", "tests/test_query_shapes.py", "tests/test_attack_conditional.py",
                "tests/test_folded_constants.py", "tests/test_attack_new_keys.py"),
}

_LAP = "mechanisms/laplace.py"
_SC = "mechanisms/sum_count.py"
_VR = "mechanisms/variance.py"
_SM = "mechanisms/smooth_median.py"
_FP = "mechanisms/fixed_point.py"
_CR = "proxy/dp/column_release.py"
_A = "proxy/dp/answer.py"
_RU = "proxy/dp/release_units.py"
_E = "proxy/serving/executor.py"
_B = "proxy/dp/budget.py"
_LG = "policies/ledger.py"
_RW = "rewriter/rewrite.py"

SITES: tuple[Site, ...] = (
    # ------------------------------------------------------------------ Laplace: COUNT and SUM
    Site("lap.count-scale", _LAP, "    scale = 1.0 / epsilon\n", "    scale = 0.5 / epsilon\n", "answers"),
    Site("lap.sum-scale", _LAP, "        return laplace_int(exact, sensitivity / epsilon), sensitivity / epsilon",
         "        return laplace_int(exact, sensitivity / epsilon / 2), sensitivity / epsilon", "answers"),
    Site("lap.coarse-sensitivity-rounded-down", _LAP, "    coarse = -(-sensitivity // g)\n    return g",
         "    coarse = sensitivity // g\n    return g", "budget"),
    Site("lap.coarse-scale", _LAP, "return g * laplace_int(exact // g, coarse / epsilon)",
         "return g * laplace_int(exact // g, coarse / epsilon / 2)", "budget"),
    Site("sum.sensitivity-one-for-integers", _CR, "release_sum(int(total), epsilon, int(column.policy.sensitivity))",
         "release_sum(int(total), epsilon, 1)", "answers"),
    Site("sum.float-sensitivity-halved", _CR, "release_grid_sum(int(total), grid.sensitivity(lo, hi), grid, epsilon)",
         "release_grid_sum(int(total), grid.sensitivity(lo, hi) // 2, grid, epsilon)", "answers"),
    Site("sum.numeric-rounding-point", _CR, "grid.sensitivity(lo, hi) + 1, grid, epsilon",
         "grid.sensitivity(lo, hi), grid, epsilon", "answers"),
    Site("sum.policy-sensitivity-upper-bound-only", "policies/model.py",
         "        return max(abs(self.bounds[0]), abs(self.bounds[1]))", "        return abs(self.bounds[1])", "answers"),
    # ------------------------------------------------------------------ the fixed-point grid of float sums
    Site("grid.point-floor", _FP, "        return round(math.ldexp(float(value), self.exponent))",
         "        return math.floor(math.ldexp(float(value), self.exponent))", "answers"),
    Site("grid.sensitivity-upper-only", _FP, "        return max(abs(self.point(lo)), abs(self.point(hi)))",
         "        return abs(self.point(hi))", "answers"),
    Site("grid.factor-vs-step", _RW, "f\"CAST('{factor!r}' AS double precision)\"",
         "f\"CAST('{factor * 2!r}' AS double precision)\"", "answers"),
    # ------------------------------------------------------------------ the backend's clamp vs the scale's bounds
    Site("clamp.bounds-twice-as-wide", _RW,
         "for bound, upper in zip(column.policy.bounds, (False, True)))",
         "for bound, upper in zip((column.policy.bounds[0] - (column.policy.bounds[1] - column.policy.bounds[0]) / 2, "
         "column.policy.bounds[1] + (column.policy.bounds[1] - column.policy.bounds[0]) / 2), (False, True)))",
         "answers"),
    Site("clamp.filtered-sum-unclamped", _RW, "    total = filtered(clamped_sum(column), condition)\n",
         "    total = filtered(clamped_sum(column) if condition is None else "
         "f\"pg_catalog.sum({column_sql(column)})\", condition)\n", "grouped"),
    Site("clamp.partition-min-max-unclamped-in-sql", _RW,
         'return _to_double(clamped(column, filtered(f"pg_catalog.{kind}({column_sql(column)})", condition)), column)',
         'return _to_double(filtered(f"pg_catalog.{kind}({column_sql(column)})", condition), column)', "answers"),
    Site("clamp.numeric-shortest-decimal-outside", _RW, "inside = shortest <= exact if upper else shortest >= exact",
         "inside = True", "answers"),
    # ------------------------------------------------------------------ ε (and δ) split over a statement's columns
    Site("split.row-epsilon-not-divided", _A, "    share = epsilon / release_count(plan)\n    parts = split_row",
         "    share = epsilon\n    parts = split_row", "answers"),
    Site("split.cells-epsilon-not-divided", _A, "    share = epsilon / release_count(plan)\n    encoded",
         "    share = epsilon\n    encoded", "grouped"),
    Site("split.series-ranking-free", _E,
         "share = epsilon / max(1, release_count(plan) + release_count(ranking))",
         "share = epsilon / max(1, release_count(plan))", "grouped"),
    # A variance family counted as one release, but each member drawn afresh at its share: the
    # family spends its share once per member.
    Site("split.family-drawn-per-member", _CR,
         "            released[key] = (_from_moments(agg, drawn[unit]) if unit in drawn",
         "            released[key] = (_from_moments(agg, _moments(agg, agg_parts, epsilon) if agg.mechanism == "
         "\"moments\" else drawn[unit]) if unit in drawn", "variance"),
    # Identical aggregates counted as one release, but each drawn afresh at its share: the
    # release spends its share once per column.
    Site("split.duplicate-drawn-per-column", _CR, "        key = (unit, agg.kind if unit in drawn else \"\")\n",
         "        key = (unit, agg.kind if unit in drawn else str(len(releases)))\n", "duplicates"),
    # Aggregates of one column and kind under two conditions taken for one release: one of them
    # answered with the other's value, and ε split as if it were free.
    Site("split.duplicate-by-column-alone", _RU, "    return (agg.kind, agg.mechanism, agg.distinct, parts, fraction, "
         "agg.fractions)", "    return (agg.kind, agg.mechanism, agg.distinct, agg.column.name if agg.column else "
         "None, fraction, agg.fractions)", "duplicates"),
    # Variances of two conditions (or columns) taken for one family: one of them answered from
    # moments that are not its own, and ε split as if it were free.
    Site("split.family-by-column-alone", _RU, "        return (\"moments\", parts)\n",
         "        return (\"moments\", agg.column.name if agg.column is not None else \"\")\n", "variance"),
    Site("split.delta-max-not-sum", _A, "    return sum(plan.table.policy.delta for _ in releases)",
         "    return max(plan.table.policy.delta for _ in releases)", "answers"),
    Site("cells.empty-cell-dropped", _A,
         "        releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)\n        first = first",
         "        if all(value is None for part in parts for value in part):\n            continue\n"
         "        releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)\n"
         "        first = first", "grouped"),
    # ------------------------------------------------------------------ AVG as noisy sum / noisy count
    Site("avg.sum-share-whole-epsilon", _SC, "    share = epsilon / 2.0\n    if on_grid:",
         "    share = epsilon\n    if on_grid:", "answers"),
    Site("avg.count-scale-whole-epsilon", _SC, "denominator = max(laplace_int(count, 1.0 / share), 1)",
         "denominator = max(laplace_int(count, 1.0 / epsilon), 1)", "answers"),
    Site("avg.sensitivity-halved", _SC, "    return _Centred(grid, grid.point(c), math.ceil(half) + 1, Fraction(c))",
         "    return _Centred(grid, grid.point(c), math.ceil(half / 2) + 1, Fraction(c))", "answers"),
    Site("avg.on-grid-sensitivity-halved", _SC, "return _Centred(grid, point, max(grid.point(hi) - point, point - grid.point(lo)), Fraction(c))",
         "return _Centred(grid, point, max(grid.point(hi) - point, point - grid.point(lo)) // 2, Fraction(c))",
         "answers"),
    Site("avg.uncentred-sensitivity", _SC,
         "    half = max(Fraction(hi) - Fraction(c), Fraction(c) - Fraction(lo)) * Fraction(2) ** grid.exponent",
         "    half = (Fraction(hi) - Fraction(lo)) / 4 * Fraction(2) ** grid.exponent", "answers"),
    # ------------------------------------------------------------------ VARIANCE and STDDEV from noisy moments
    Site("var.shares-above-one", _VR,
         "SHARES = (1.0 / (2.0 + _CUBE_ROOT_4), _CUBE_ROOT_4 / (2.0 + _CUBE_ROOT_4), 1.0 / (2.0 + _CUBE_ROOT_4))",
         "SHARES = (1.0 / (1.0 + _CUBE_ROOT_4), _CUBE_ROOT_4 / (1.0 + _CUBE_ROOT_4), 1.0 / (1.0 + _CUBE_ROOT_4))",
         "variance"),
    Site("var.count-scale-whole-epsilon", _VR, "    count_scale = 1.0 / share_n\n",
         "    count_scale = 1.0 / epsilon\n", "variance"),
    Site("var.sum-sensitivity-halved", _VR, "laplace_integer_sum(centred_sum, reach, share_s)",
         "laplace_integer_sum(centred_sum, reach // 2, share_s)", "variance"),
    Site("var.squares-sensitivity-not-squared", _VR, "laplace_integer_sum(centred_squares, reach**2, share_q)",
         "laplace_integer_sum(centred_squares, reach, share_q)", "variance"),
    Site("var.reach-halved", _VR, "        return max(self.high - self.centre, self.centre - self.low)\n",
         "        return max(self.high - self.centre, self.centre - self.low) // 2\n", "variance"),
    Site("var.integer-grid-whole-units", _VR, "return cls(Grid(1), 2 * int(lo), 2 * int(hi), int(lo) + int(hi))",
         "return cls(Grid(0), int(lo), int(hi), (int(lo) + int(hi)) // 2)", "variance"),
    Site("var.count-floor-dropped", _VR, "    m = max(noisy.count, 2 if sample else 1)\n",
         "    m = noisy.count or 1\n", "variance"),
    Site("var.feasible-range-unclamped", _VR, "Fraction(0)),\n                 Fraction(reach**2))",
         "Fraction(0)),\n                 Fraction(reach**4))", "variance"),
    Site("var.mean-unclamped", _VR, "    value = min(max(_scaled(float(point), exponent), lo), hi)\n",
         "    value = _scaled(float(point), exponent)\n", "variance"),
    # An AVG read from the moments beside more releases than the rule allows: no privacy lost,
    # but its error larger than sum_count's would be (docs/mechanisms.md).
    Site("var.avg-from-moments-beside-any", _RU, "    if not families or len(releases) > AVG_FROM_MOMENTS_UP_TO:",
         "    if not families:", "variance"),
    # ------------------------------------------------------------------ sample and aggregate, smooth median
    Site("sa.beta-from-epsilon", _SM, "    return epsilon / (2.0 * math.log(2.0 / delta))",
         "    return epsilon / math.log(2.0 / delta)", "noise"),
    Site("sa.scale-s-star-over-epsilon", _SM, "noise_scale = max(2.0 * max(s_star,", "noise_scale = max(1.0 * max(s_star,",
         "noise"),
    Site("sa.weight-exponent-off-by-one", _SM, "return max(gap * math.exp(-beta * k) for",
         "return max(gap * math.exp(-beta * (k + 1)) for", "noise"),
    Site("sa.padding-not-the-bounds", _SM,
         "    x = np.concatenate(([float(lo)], np.asarray(sorted_values, dtype=float), [float(hi)]))",
         "    x = np.concatenate((np.asarray(sorted_values, dtype=float)[:1], np.asarray(sorted_values, dtype=float), "
         "np.asarray(sorted_values, dtype=float)[-1:]))", "noise"),
    Site("sa.partition-clamp-twice-as-wide", _SM, "    np.clip(prepared, lo, hi, out=prepared)",
         "    np.clip(prepared, lo - (hi - lo) / 2, hi + (hi - lo) / 2, out=prepared)", "noise"),
    Site("sa.output-not-clamped", _SM, "    noisy = min(max(laplace_float(median, noise_scale), lo), hi)",
         "    noisy = laplace_float(median, noise_scale)", "noise"),
    Site("sa.delta-of-the-release", _CR, "present, lo, hi, epsilon, table.delta, empty=",
         "present, lo, hi, epsilon, table.delta * 100, empty=", "answers"),
    Site("sa.empty-partitions-not-counted", _CR, "empty=table.partitions - len(present)", "empty=0", "answers"),
    Site("sa.partitions-one-fewer", _RW, '    partitions = table.policy.partitions\n    if table.partition_key == "row"',
         '    partitions = table.policy.partitions - 1\n    if table.partition_key == "row"', "answers"),
    Site("sa.partition-hash-sign-bit", _RW,
         'return operator(operator(row_hash_key(table, seed), "&", str(_SEED_MAX)), "%", str(partitions))',
         'return operator(row_hash_key(table, seed), "%", str(partitions))', "answers"),
    # ------------------------------------------------------------------ exponential mechanism (MODE)
    Site("mode.scale-epsilon-not-half", "mechanisms/exponential.py", "    scale = 2.0 * sensitivity / epsilon\n",
         "    scale = sensitivity / epsilon\n", "noise"),
    Site("mode.candidates-from-the-data", _CR,
         "        return release_mode(categories, counts, epsilon, padded=padded)",
         "        present = [(c, n) for c, n in zip(categories, counts) if n]\n"
         "        if present:\n"
         "            return release_mode([c for c, _ in present], [n for _, n in present], epsilon, padded=padded)\n"
         "        return release_mode(categories, counts, epsilon, padded=padded)", "answers"),
    Site("mode.permute-and-flip", "mechanisms/samplers.py",
         "dp.linf_distance(T=float), dp.zero_concentrated_divergence(), scale=scale)",
         "dp.linf_distance(T=float), dp.max_divergence(), scale=scale)", "noise"),
    # ------------------------------------------------------------------ the noise pool
    Site("pool.draw-handed-out-twice", "mechanisms/noise_pool.py",
         "self._values.extend(int(v) for v in _batch(self.scale)([0] * self.batch))",
         "self._values.extend(2 * [int(v) for v in _batch(self.scale)([0] * (self.batch // 2))])", "noise"),
    Site("pool.draw-not-removed", "mechanisms/noise_pool.py", "            return self._values.popleft()",
         "            return self._values[0]", "noise"),
    Site("pool.keyed-by-rounded-scale", "mechanisms/samplers.py", "return int(value) + pool_for(scale).take()",
         "return int(value) + pool_for(float(round(scale)) or scale).take()", "noise"),
    # ------------------------------------------------------------------ the charge
    Site("charge.half-epsilon", _E, "balance = await self.server.budget.charge(self.user, epsilon, delta, fingerprint)",
         "balance = await self.server.budget.charge(self.user, epsilon / 2, delta, fingerprint)", "budget"),
    Site("charge.no-delta", _E, "balance = await self.server.budget.charge(self.user, epsilon, delta, fingerprint)",
         "balance = await self.server.budget.charge(self.user, epsilon, 0.0, fingerprint)", "budget"),
    Site("charge.ranking-delta-dropped", _E,
         "delta = query_delta(plan) + (query_delta(ranking) if ranking is not None else 0.0)",
         "delta = query_delta(plan)", "grouped"),
    Site("charge.refund-after-reaching-the-backend", _E, "            if not exc.reached:\n",
         "            if True:\n", "budget"),
    # ------------------------------------------------------------------ repeats: free only when identical
    Site("repeat.key-without-parameters", _E, "settings, tuple(params.values),\n", "settings, (),\n", "repeats"),
    Site("repeat.key-without-epsilon", _E, "tuple(params.formats), epsilon, ranked_by)", "tuple(params.formats), ranked_by)",
         "repeats"),
    Site("repeat.key-without-aggregates", _E, "repeat_key = (self.user, sql, released,", "repeat_key = (self.user, sql,",
         "repeats"),
    Site("repeat.key-without-user", _E, "repeat_key = (self.user, sql, released,", "repeat_key = (sql, released,",
         "repeats"),
    # ------------------------------------------------------------------ the reservation
    Site("reserve.spends-half", _B, "        held.epsilon -= eps\n        held.delta -= dlt\n        held.used",
         "        held.epsilon -= eps / 2\n        held.delta -= dlt\n        held.used", "budget"),
    Site("reserve.delta-not-spent", _B, "        held.epsilon -= eps\n        held.delta -= dlt\n        held.used",
         "        held.epsilon -= eps\n        held.used", "budget"),
    Site("reserve.covers-epsilon-only", _B, "return self.epsilon >= epsilon and self.delta >= delta",
         "return self.epsilon >= epsilon", "budget"),
    Site("reserve.keeps-the-charge", _B, "held = self._add(user, budget, period, now, keep_eps, keep_dlt, result.balance)",
         "held = self._add(user, budget, period, now, keep_eps + eps, keep_dlt, result.balance)", "budget"),
    Site("reserve.refund-any-period", _B, "if held is None or held.period != charged.period:",
         "if held is None:", "budget"),
    # ------------------------------------------------------------------ the ledger's comparison with the limit
    Site("ledger.checks-spent-before-adding", _LG, "eps_col + eps <= eps_cap, dlt_col + dlt <= dlt_cap",
         "eps_col < eps_cap, dlt_col + dlt <= dlt_cap", "budget"),
    Site("ledger.delta-not-checked", _LG, "eps_col + eps <= eps_cap, dlt_col + dlt <= dlt_cap", "eps_col + eps <= eps_cap",
         "budget"),
    Site("ledger.charge-rounded-down", _LG, "    units = _units(value, scale, round_up=True)",
         "    units = _units(value, scale, round_up=False)", "budget"),
    Site("ledger.limit-rounded-up", _LG, "        return min(_MAX_UNITS, _units(value, scale, round_up=False))",
         "        return min(_MAX_UNITS, _units(value, scale, round_up=True))", "budget"),
    Site("ledger.keep-ignored", _LG,
         "        limit_eps -= min(_MAX_UNITS, _units(keep_epsilon, EPSILON_SCALE, round_up=True))\n",
         "", "budget"),
)
