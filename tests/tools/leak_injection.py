"""Leak injection: does a neighbour check notice one row leaking through the form of an answer?

The neighbour checks (tests/test_neighbour_fuzz*.py, tests/neighbour_outcome.py and the attack
files that use it) run a statement on tables that differ in one row and require everything an
analyst sees to be the same but the noised values. To compare, they reduce what comes back (the
digits of a noised value are masked), and a reduction that masks too much is blind to a leak in
what it masked. Each site below is a file, a snippet that occurs there once, and the text that
makes dpproxy leak one row's presence through an output channel while the noised value stays
plausible: a released numeric's scale, a trailing zero, a notice's figure, the command tag, a
cell left out, the RowDescription's type modifier or type, NULL for a value, a binary float8's
low bit or numeric's dscale, a binary COPY cell, a COPY's row count, a percentile array's
element or lower bound, PortalSuspended after a row-limited Execute. The runner is
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

Seven more sites (branch h90, 2026-11-27), for the channels a release's text does not show,
on a machine shared with six other helpers:

* against the comparison as it was: 1 KILLED (a binary numeric's dscale, which psycopg's
  binary loader turns into a Decimal's scale), 6 SURVIVED: a binary float8's low bit, a binary
  COPY cell, a COPY's tag, a percentile array's element spelling and its lower bound (psycopg's
  array loader drops it), CommandComplete for PortalSuspended (13.5 min);
* two of the survivors were the hooks' fault first: a flag set per release_columns call was
  reset by the statement's later releases (all-NULL parts) before the answer's bytes were made;
  the flag now stays until a hooked value takes it;
* with binary values held to PostgreSQL's send of the same release's text (a repeat), arrays
  read with their text, the raw Execute path's rows spelled and four pinned forms (Execute with
  a row limit in text and binary, a percentile array in text, a binary COPY of numerics):
  6 KILLED of 7 (4.7 min). copy.tag-row-count SURVIVED: the fuzzer's COPY row count was never
  compared (psycopg's statusmessage is None after a COPY and its rowcount is forgotten once the
  cursor closes; it is now read before), and its hook's "some part odd" was true on every table;
* with the row count read and that site's flag the parity of its own statement's parts: all 16
  sites KILLED (one run, ~9 min, the machine less loaded than before).

Stop 40 (2026-11-27): copy.tag-row-count SURVIVED again, with the wider selection too, after the
fuzz table gained a column (the seed's draws and rows shifted). Its pinned binary COPY repeats the
release of the SELECT pinned before it, so no release runs inside the COPY and the hook never
leaks there; only a drawn COPY could catch it. A pinned text COPY of a count no other case asks
for (every neighbour moves it by one) now does: KILLED by the pinned cases alone.
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

# The channels a release's text does not show, each leaked by a hook that the mutation installs
# from release_columns (which sees the exact parts of an ungrouped answer and of every cell):
# that an exact integer part was odd is kept on the executor until the next value the hook
# alters takes it (:data:`_TAKE`: a statement releases more than once, some of its releases over
# parts all NULL, so a flag set per call was reset before the answer's bytes were made), and a
# function the answer's bytes pass through after its text is replaced by one that reads it.
_RELEASE = ("    if not units:\n"
            "        return [release_column(agg, agg_parts, epsilon, table) for agg, agg_parts in zip(aggregates, parts)]\n")


def _hooked(module: str, name: str, body: str, owner: str = "", parity: bool = False) -> str:
    """:data:`_RELEASE` preceded by the hook: ``module``'s ``name`` (or its ``owner`` class's),
    kept as ``_plain_<name>``, replaced once by ``_leaky``, whose ``body`` (indented for it)
    takes :data:`_TAKE`; with ``parity`` the flag is set where a call's exact integer parts add
    up to an odd number instead, for a hook that clears it as its statement starts."""
    return ("    import dataclasses as _d, struct as _s, sys as _y\n"
            "    import proxy.serving.executor as _x\n"
            + ("    if sum(p for ps in parts for p in ps if isinstance(p, int) and not isinstance(p, bool)) % 2:\n"
               "        _x._leak = True\n" if parity else
               "    if any(isinstance(p, int) and not isinstance(p, bool) and p % 2 for ps in parts for p in ps):\n"
               "        _x._leak = True\n")
            + f"    _m = _y.modules[{module!r}]{'.' + owner if owner else ''}\n"
            f"    if not hasattr(_m, '_plain_{name}'):\n"
            f"        _m._plain_{name} = _plain = getattr(_m, {name!r})\n"
            + "".join(f"        {line}\n" for line in body.splitlines())
            + f"        setattr(_m, {name!r}, _leaky)\n" + _RELEASE)


_TAKE = "_x.__dict__.pop('_leak', False)"
_FLIP = "_s.pack('!q', _s.unpack('!q', out)[0] ^ 1)"
# numeric_send with one more base-10000 digit, a zero: the same value, a longer cell
_LONGER = "_s.pack('!h', _s.unpack('!h', out[:2])[0] + 1) + out[2:] + bytes(2)"

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
    # A binary float8 (format code 1 in Bind, binary COPY) whose lowest mantissa bit is flipped
    # when an exact part is odd: the text stays the release's.
    Site("binary.float8-low-bit-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.serving.executor", "binary_from_text",
        "def _leaky(text, oid):\n"
        "    out = _plain(text, oid)\n"
        f"    return {_FLIP} if oid == 701 and {_TAKE} else out"), "values"),
    # A binary numeric whose dscale is one more than its text's when an exact part is odd.
    Site("binary.numeric-dscale-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.serving.executor", "binary_from_text",
        "def _leaky(text, oid):\n"
        "    out = _plain(text, oid)\n"
        f"    if oid == 1700 and not out[4] & 0x80 and {_TAKE}:\n"
        "        out = out[:6] + _s.pack('!h', _s.unpack('!h', out[6:8])[0] + 1) + out[8:]\n"
        "    return out"), "values"),
    # A binary COPY's cells (not a Bind's values) longer by a zero digit (numeric) or with the low
    # bit flipped (float8) when an exact part is odd.
    Site("copy.binary-cell-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.serving.executor", "copy_messages",
        "def _leaky(result, options):\n"
        f"    if options.binary and {_TAKE}:\n"
        "        def cell(out, oid):\n"
        f"            return out if out is None else {_LONGER} if oid == 1700 else {_FLIP} if oid == 701 else out\n"
        "        rows = [[cell(v, f.type_oid) for v, f in zip(row, result.fields)] for row in result.rows]\n"
        "        result = _d.replace(result, rows=rows)\n"
        "    return _plain(result, options)"), "values"),
    # A COPY's tag counting one row more than it sent when the exact integer parts of its releases
    # add up to an odd number: the flag is cleared as the COPY starts, so that it is this
    # statement's (a flag left by another statement, or "some part odd", was the same on every
    # table, and the site SURVIVED).
    Site("copy.tag-row-count-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.serving.executor", "_copy_out",
        "async def _leaky(self, *args, **kwargs):\n"
        "    _x._leak = False\n"
        "    copied, notices, cost = await _plain(self, *args, **kwargs)\n"
        f"    if {_TAKE}:\n"
        "        copied = _d.replace(copied, tag='COPY %d' % (int(copied.tag.split()[1]) + 1))\n"
        "    return copied, notices, cost", owner="Executor", parity=True), "values"),
    # A percentile array's first element with a trailing zero (or ".0" after an integer's digits)
    # when an exact part is odd.
    Site("array.element-spelling-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.dp.answer", "encode_array_text",
        "def _leaky(values, element, scale=None):\n"
        "    out = _plain(values, element, scale)\n"
        "    first, comma, rest = out[1:-1].partition(b',')\n"
        "    if first not in (b'', b'NULL') and b'e' not in first and first[-1:].isdigit() and " + _TAKE + ":\n"
        "        out = b'{' + first + (b'0' if b'.' in first else b'.0') + comma + rest + b'}'\n"
        "    return out"), "values"),
    # A percentile array printed with a lower bound of 0 ([0:n-1]={...}) when an exact part is odd.
    Site("array.lower-bound-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.dp.answer", "encode_array_text",
        "def _leaky(values, element, scale=None):\n"
        "    out = _plain(values, element, scale)\n"
        f"    return b'[0:%d]=' % (out.count(b',')) + out if out != b'{{}}' and {_TAKE} else out"), "values"),
    # Execute with a row limit: CommandComplete in place of PortalSuspended when an exact part is
    # odd (the rows sent the same).
    Site("portal.suspended-or-complete-follows-the-exact-value", _CR, _RELEASE, _hooked(
        "proxy.serving.extended", "protocol",
        "class _leaky:\n"
        "    def __getattr__(self, attribute):\n"
        f"        if attribute == 'PORTAL_SUSPENDED' and {_TAKE}:\n"
        "            return _plain.command_complete('SELECT 1')\n"
        "        return getattr(_plain, attribute)\n"
        "_leaky = _leaky()"), "values"),
)


def main(argv: list[str] | None = None) -> int:
    """guard_ablation's runner over :data:`SITES` (``--sites leaks``)."""
    guard_ablation.SITE_LISTS["leaks"] = sys.modules[__name__]
    return guard_ablation.main(["--sites", "leaks", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
