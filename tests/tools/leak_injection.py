"""Leak injection: does a neighbour check notice one row leaking through the form of an answer?

The neighbour checks (tests/test_neighbour_fuzz*.py, tests/neighbour_outcome.py and the attack
files that use it) run a statement on tables that differ in one row and require everything an
analyst sees to be the same but the noised values. To compare, they reduce what comes back (the
digits of a noised value are masked), and a reduction that masks too much is blind to a leak in
what it masked. Each site below is a file, a snippet that occurs there once, and the text that
makes dpproxy leak one row's presence through an output channel while the noised value stays
plausible: a released numeric's scale, a trailing zero, a notice's figure, the command tag, a
cell left out, the RowDescription's type modifier or type, NULL for a value. The runner is
:mod:`guard_ablation`'s (a scratch copy, one site at a time, its selection with ``-x``): a site is
KILLED when some test of its selection fails, SURVIVED when none does (that comparator is blind).

Run from the repository root (not collected by pytest)::

    .venv/bin/python tests/tools/leak_injection.py            # every site
    .venv/bin/python tests/tools/leak_injection.py --list     # the sites and their selections
    .venv/bin/python tests/tools/leak_injection.py --only notice --tests tests/test_neighbour_fuzz.py

Every option of guard_ablation.py applies (``--only``, ``--tests``, ``--timeout``, ``--baseline``).
What the first runs found: :data:`FINDINGS`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import guard_ablation  # noqa: E402
from guard_sites import Site  # noqa: E402

__all__ = ["FINDINGS", "SELECTIONS", "SITES", "WIDER"]

FINDINGS = """\
First runs (branch h77, 2026-11-27), on a machine shared with four other helpers:

* against the comparison as it was (NULL or not, type names, a SUM's scale where the generator
  knew it fixed, notices with every number masked, RowDescription names and types): 3 KILLED
  (float4 for float8, NULL for a SUM, a histogram's empty cells left out), 6 SURVIVED: the
  numeric SUM's scale, both trailing zeros, the type modifier, the notice's figure and a GROUP
  BY's tag (11.6 min);
* the GROUP BY tag was an equivalent mutant (the outer statement's tag reaches the client) and
  became a one-row answer's tag;
* with tests/value_spelling.py's rules per column, type modifiers and sizes compared and only
  the notice figures that follow the noise or the budget masked: 9 KILLED of 9 (11.5 min).
"""

_CR = "proxy/dp/column_release.py"
_A = "proxy/dp/answer.py"
_FUZZ = "tests/test_neighbour_fuzz.py"

# The neighbour tests of each area: the fuzzer (every release kind, text and binary, simple and
# extended protocol, COPY), the partitions fuzzer (sample and aggregate), the cells fuzzer (GROUP BY).
SELECTIONS: dict[str, tuple[str, ...]] = {
    "values": (f"{_FUZZ}::test_one_row_never_changes_a_statements_outcome",
               f"{_FUZZ}::test_the_forms_the_generator_draws_rarely_have_one_outcome_on_every_neighbour"),
    "partitions": ("tests/test_neighbour_fuzz_partitions.py",),
    "cells": ("tests/test_neighbour_fuzz_cells.py",
              f"{_FUZZ}::test_one_row_never_changes_a_statements_outcome"),
}
WIDER: dict[str, tuple[str, ...]] = {
    "values": ("tests/test_neighbour_fuzz_paths.py", "tests/test_attack_outputs.py"),
    "partitions": (f"{_FUZZ}::test_one_row_never_changes_a_statements_outcome",),
    "cells": ("tests/test_attack_histograms.py",),
}

_NUMERIC_SUM = "        return release_grid_sum(grid.rounded(total), grid.sensitivity(lo, hi) + 1, grid, epsilon)\n"
_MEAN = ("        return release_mean(total if total is not None else 0, int(count or 0), lo, hi, epsilon,\n"
         "                            on_grid=column.type_oid in FLOAT_TYPES)\n")
_ROW = "    row = _encoded(plan, releases, codec)\n"

SITES: tuple[Site, ...] = (
    # A numeric SUM printed with as many fraction digits as the exact total has (at most 40):
    # the value is the noised one, its scale says how many fraction digits the rows hold.
    Site("scale.numeric-sum-follows-the-exact-total", _CR, _NUMERIC_SUM,
         "        leak = release_grid_sum(grid.rounded(total), grid.sensitivity(lo, hi) + 1, grid, epsilon)\n"
         "        import decimal\n"
         "        own = decimal.Decimal(total).as_tuple().exponent\n"
         "        shown = decimal.Decimal(repr(leak.value))\n"
         "        if isinstance(own, int) and own < 0 and shown.is_finite() and own < shown.as_tuple().exponent:\n"
         "            shown = shown.quantize(decimal.Decimal(1).scaleb(max(own, -40)), context=decimal.Context(prec=decimal.MAX_PREC))\n"
         "            return replace(leak, value=shown)\n"
         "        return leak\n", "values"),
    # A numeric AVG (noisy sum / noisy count) with a trailing zero when the exact count is even.
    Site("spelling.avg-trailing-zero-on-an-even-count", _CR, _MEAN,
         "        leak = release_mean(total if total is not None else 0, int(count or 0), lo, hi, epsilon,\n"
         "                            on_grid=column.type_oid in FLOAT_TYPES)\n"
         "        import decimal, math\n"
         "        if int(count or 0) % 2 == 0 and math.isfinite(leak.value) and 'e' not in repr(leak.value):\n"
         "            return replace(leak, value=decimal.Decimal(repr(leak.value) + '0'))\n"
         "        return leak\n", "values"),
    # Every released text with a "." gets a trailing zero when the backend's first exact value is
    # an even integer (a count): float8 and numeric alike, text, binary (dscale) and COPY.
    Site("spelling.trailing-zero-when-the-exact-value-is-even", _A, _ROW,
         "    row = _encoded(plan, releases, codec)\n"
         "    if exact and isinstance(exact[0], int) and exact[0] % 2 == 0:\n"
         "        row = [v + b'0' if v is not None and b'.' in v and b'e' not in v and b'{' not in v else v for v in row]\n",
         "values"),
    # The RowDescription's type modifier of a numeric column copied from the exact value's length.
    Site("rowdescription.typmod-follows-the-exact-value", _A, _ROW,
         "    row = _encoded(plan, releases, codec)\n"
         "    fields = [replace(f, type_modifier=((len(str(exact[0])) + 10) << 16) + 4)\n"
         "              if exact and exact[0] is not None and f.type_oid == NUMERIC else f for f in fields]\n", "values"),
    # A float8 column announced as float4 when the exact first value is 0 (the text stays float8's).
    Site("rowdescription.float4-when-the-exact-value-is-zero", _A, _ROW,
         "    row = _encoded(plan, releases, codec)\n"
         "    fields = [replace(f, type_oid=700) if exact and not exact[0] and f.type_oid == 701 else f for f in fields]\n",
         "values"),
    # NULL instead of a noised SUM when no row reached it (SQL's answer over no rows).
    Site("null.sum-over-no-rows", _CR,
         "        total = parts[0] if parts[0] is not None else 0\n",
         "        total = parts[0] if parts[0] is not None else 0\n"
         "        if parts[0] is None:\n"
         "            return replace(release_count(0, epsilon), value=None)\n", "values"),
    # sample and aggregate's notice: its worst-case bound nudged by the partitions that held rows
    # (a figure the notice prints with four digits, as it prints the bound).
    Site("notice.partitions-that-held-rows", _CR,
         "            present, lo, hi, epsilon, table.delta, empty=table.partitions - len(present)\n        )\n",
         "            present, lo, hi, epsilon, table.delta, empty=table.partitions - len(present)\n        )\n"
         "        release = replace(release, error95=release.error95 * (1 + len(present) / 100))\n", "partitions"),
    # A one-row answer's command tag saying whether the backend aggregated any row (its first
    # exact value NULL or 0). A GROUP BY's tag is no site: its release reaches the client through
    # the outer statement (rewriter/post_process.py), whose tag PostgreSQL writes; with the
    # release's tag made the backend's group count, every neighbour test passed (an equivalent
    # mutant, first run).
    Site("tag.says-whether-any-row-was-aggregated", _A,
         '    return DPAnswer(ResultSet(fields, [row], "SELECT 1"), epsilon, delta, tuple(releases), units=units)\n',
         '    tag = "SELECT 0" if exact and exact[0] in (None, 0) else "SELECT 1"\n'
         '    return DPAnswer(ResultSet(fields, [row], tag), epsilon, delta, tuple(releases), units=units)\n', "values"),
    # A GROUP BY leaving out the cells no row reached.
    Site("cells.omit-the-empty-ones", _A,
         "        releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)\n        first = first or releases\n",
         "        if not any(bool(p) for ps in parts for p in ps):\n            continue\n"
         "        releases = release_columns(plan.aggregates, parts, units, share, plan.table.policy)\n        first = first or releases\n",
         "cells"),
)


def main(argv: list[str] | None = None) -> int:
    """guard_ablation's runner over :data:`SITES` (``--sites leaks``)."""
    guard_ablation.SITE_LISTS["leaks"] = sys.modules[__name__]
    return guard_ablation.main(["--sites", "leaks", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
