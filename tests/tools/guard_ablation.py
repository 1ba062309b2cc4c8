"""Guard ablation: for each privacy guard, does some test fail when the guard is switched off?

A guard is a refusal condition of the rewriter or the DP path (a predicate form, a LIKE pattern,
a parameter type, a catalog relation, a setting, a key ...). A guard that no test pins can be
dropped by a refactor with CI green. For each site of :data:`tests.tools.guard_sites.SITES` this
tool copies the tree once into a scratch directory, replaces the site's snippet (which must occur
exactly once) by the replacement that disables the guard, runs the site's test selection there
(``pytest -x -q -p no:cacheprovider``, one run at a time, with a timeout) and restores the file:

* KILLED: some test failed (the first one is named);
* SURVIVED: every test passed, nothing pins the guard;
* TIMEOUT: the run took longer than ``--timeout`` (counted as neither);
* ERROR: the snippet is not in the file exactly once, or pytest itself failed to run.

Run from the repository root (not collected by pytest: the file is no ``test_*.py``)::

    .venv/bin/python tests/tools/guard_ablation.py                # every site
    .venv/bin/python tests/tools/guard_ablation.py --only like    # sites whose name contains "like"
    .venv/bin/python tests/tools/guard_ablation.py --list         # the sites and their selections
    .venv/bin/python tests/tools/guard_ablation.py --baseline     # each selection unmutated, timed
    .venv/bin/python tests/tools/guard_ablation.py --wide --only keys.max-cells   # a survivor, wider tests
    .venv/bin/python tests/tools/guard_ablation.py --sites calibration             # the numbers of the guarantee
    .venv/bin/python tests/tools/guard_ablation.py --sites calibration --only sum. --tests tests/test_calibration.py

A full run of the fast selections takes about half an hour on two shared cores; run the
survivors again with ``--wide`` (the slower tests of their area, the neighbour fuzzer among them).

The working tree is never modified: the scratch copy holds the tracked and untracked (not
ignored) files as they are on disk, so uncommitted tests count. Bytecode is not written, so a
restored file is never run from a stale cache. One PostgreSQL serves every run
(``DPPROXY_TEST_DSN``, as conftest.py allows), which saves an initdb and the Adult load per run;
``--own-server`` gives each run its own. The order and the selections are fixed; the
result of a run depends on the code and the tests only (the neighbour fuzzer runs at its
default, seeded size).

What it found on its first run (branch guard-ablation, 2026-11): see :data:`FINDINGS`; with
``--sites calibration`` (the numbers of the guarantee rather than its refusals: scales,
sensitivities, clamps, ε and δ splits, charges, repeats, the noise pool; branch h43, 2026-11):
see :data:`CALIBRATION_FINDINGS`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibration_sites  # noqa: E402
import guard_sites  # noqa: E402
from guard_sites import Site  # noqa: E402

# The site lists: refusal guards, and the numbers of the guarantee (scales, sensitivities,
# clamps, ε splits, charges, repeats). Each module has SITES, SELECTIONS and WIDER.
SITE_LISTS = {"guards": guard_sites, "calibration": calibration_sites}

ROOT = Path(__file__).resolve().parents[2]

FINDINGS = """\
First run (branch guard-ablation, 2026-11-26), 168 sites, on a machine shared with other runs:

* the fast selections (SELECTIONS): 74 KILLED, 93 SURVIVED (~28 min, runs of 3-20 s);
* one guard was dead code: validate_predicate, which nothing called (removed);
* the survivors again with --wide: most die there (test_attack_backend_sql, test_attack_budget,
  test_folded_constants, test_attack_settings, test_attack_workers, test_histograms ...);
* 30 guards nothing pinned got a test (test_refusals, test_predicate_oracles, test_folded_constants,
  test_statement_limits, test_protected_view_failures, test_query_shapes, test_attack_histograms,
  test_histograms), each checked to fail with its guard off;
* left alive, each redundant with another check: a cast of a column or of a cast and a cast's
  typmod (the WHERE's fold path takes the expression), the plan's joins (the FROM check), a
  row-failure's builtin flag (a user function's name is schema-qualified and never total),
  GROUP BY's per-key cell limit (the plan's max-cells), the time keys' cell-in-range checks (the
  backend SQL's own in-range CASE), a date part without its unit (no unit can be chosen then);
* not investigated then, pinned afterwards: dpq.distinct-with-sample-aggregate (test_refusals:
  COUNT(DISTINCT age) beside MIN(age)); keys.epoch-whole-days (test_attack_histograms: 12- and
  36-hour epoch buckets fit max_cells over a year, nothing else refuses them); eps.positive-finite
  (test_epsilon_setting_transactions: NaN passes both range checks, and a text that is no number
  is read as NaN); dpq.limit-bigint was pinned all along, by test_attack_availability (a LIMIT
  past bigint answered, one of 5,000 digits an XX000), a file outside its selection until then.

A kill whose failing test has nothing to do with the guard is suspect: a selection runs test files
in another order than the full suite, and test_attack_catalog's pg_class test failed after modules
that left relations named adult or lookup behind (test_attacks' shadow_schema.adult,
test_backend_pool's and test_session_statements' shadow lookups), so its kills of the catalog and
classify survivors proved nothing. Since then those modules drop what they create and the test
reads public's relations only: rerun those survivors before trusting their first verdicts.
"""

CALIBRATION_FINDINGS = """\
First run of --sites calibration (branch h43, 2026-11-27), 58 sites, on a machine shared with
four other helpers; calibration_sites.py now lists 59 (one dropped, two added, below):

* the fast selections: 38 KILLED, 20 SURVIVED (~34 min, runs of 4-135 s); no survivor was a
  calibration error in the code: each was a number no test of its area observed;
* survivors pinned in tests/test_calibration.py, each run again to see it fail there (--tests)
  and with its whole selection (19 sites, ~10 min: 18 KILLED): the SUM sensitivity taken from
  the upper bound only (integer policy and float grid; every test's bounds were symmetric or
  non-negative), a coarse bigint sum's sensitivity rounded down, a numeric total's rounding
  point, the noisy sum / noisy count AVG drawing its count at ε or its centred sum at half the
  sensitivity (the AVG tests check accuracy and a loose neighbour ratio), the smooth
  sensitivity's β taken as ε/ln(2/δ) (the smooth-median tests compare the fast S* with the
  definition at the mechanism's own β), MODE choosing among the categories present, a
  noise-pool batch queued twice, a repeat keyed without the user or without ε, a reservation's
  δ not taken off (41 sample-and-aggregate answers on a δ budget of 20), and the ledger
  rounding charges down or limits up;
* killed by a wider test than the selection held: the series ranking's ε share
  (test_bi_shapes' series-limit charge test, now in the grouped selection);
* left alive, an equivalent mutation: charge.ranking-delta-dropped (a GROUP BY never has a
  sample-and-aggregate column, refused by dpq.grouped-mechanism, so a ranking's δ is always 0);
* dropped as no weakening: a repeat served past its TTL (the same release again costs nothing);
* added after the run: clamp.partition-min-max-unclamped-in-sql (KILLED by test_clamping) and
  clamp.filtered-sum-unclamped, a FILTERed SUM summing unclamped values, which SURVIVED the
  grouped selection and is pinned (test_calibration, both the FILTER and the CASE form).

Cursors, COPY and pipelines have no site of their own: each DP answer is charged at the one
place the executor charges (the charge.* sites), whichever way its rows are sent. The ``other``
key has none either: a row's cell is one CASE (rewriter.group_keys), so a row is in one cell.
"""


@dataclass(frozen=True)
class Outcome:
    """What one site's run gave: KILLED, SURVIVED, TIMEOUT or ERROR, how long it took, and why."""

    site: Site
    verdict: str
    seconds: float
    detail: str = ""


def scratch_copy(root: Path) -> Path:
    """A copy of ``root``'s tracked and untracked (not ignored) files, in a new temporary directory."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    target = Path(tempfile.mkdtemp(prefix="guard-ablation-"))
    for name in filter(None, listed):
        source = root / name
        if not source.is_file():  # deleted in the working tree
            continue
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    return target


_SERVER_DSN: dict[str, str] = {}  # DPPROXY_TEST_DSN of the PostgreSQL every run shares, once started


def _environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_SERVER_DSN)
    env["PYTHONPATH"] = str(copy)  # ahead of the editable install of the working tree
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_selection(copy: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """Run ``tests`` in ``copy``: (verdict, seconds, first failure or pytest's last line)."""
    command = [sys.executable, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider"]
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=copy, env=_environment(copy), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(process)
        return "TIMEOUT", time.monotonic() - start, f"over {timeout:.0f} s"
    except BaseException:
        _stop(process)
        raise
    seconds = time.monotonic() - start
    lines = stdout.strip().splitlines()
    last = lines[-1] if lines else stderr.strip()[-200:]
    if process.returncode == 0:
        return "SURVIVED", seconds, last
    if process.returncode == 1:
        failed = next((line for line in lines if line.startswith(("FAILED tests/", "ERROR tests/"))), last)
        return "KILLED", seconds, failed[:200]
    return "ERROR", seconds, f"pytest exit {process.returncode}: {last}"


def _stop(process: subprocess.Popen[str]) -> None:
    """Interrupt a pytest run (it stops its PostgreSQL on the way out); kill it if it lingers."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def selection(name: str, wide: bool, sites: str = "guards", tests: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The tests of selection ``name`` of the site list ``sites``; with ``wide``, also its WIDER ones;
    ``tests``, when given, instead of either."""
    if tests:
        return tests
    listed = SITE_LISTS[sites]
    return listed.SELECTIONS[name] + (listed.WIDER.get(name, ()) if wide else ())


def ablate(copy: Path, site: Site, timeout: float, wide: bool = False, sites: str = "guards",
           tests: tuple[str, ...] = ()) -> Outcome:
    """Switch ``site``'s guard off (or mutate its number) in ``copy``, run its selection, put the file back."""
    path = copy / site.path
    original = path.read_text()
    found = original.count(site.snippet)
    if found != 1:
        return Outcome(site, "ERROR", 0.0, f"snippet found {found} times in {site.path}")
    path.write_text(original.replace(site.snippet, site.replacement))
    try:
        verdict, seconds, detail = run_selection(copy, selection(site.selection, wide, sites, tests), timeout)
    finally:
        path.write_text(original)
    return Outcome(site, verdict, seconds, detail)


def _check_imports_from(copy: Path) -> None:
    """Fail unless the scratch copy's modules are the ones its tests import."""
    shown = subprocess.run([sys.executable, "-c", "import rewriter, proxy; print(rewriter.__file__)"],
                           cwd=copy, env=_environment(copy), check=True, capture_output=True, text=True).stdout
    if not Path(shown.strip()).is_relative_to(copy):
        raise SystemExit(f"the scratch copy's tests would import {shown.strip()}, not the copy's modules")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="run the sites whose name contains this")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per pytest run")
    parser.add_argument("--wide", action="store_true", help="run each site's wider selection too (for survivors)")
    parser.add_argument("--own-server", action="store_true",
                        help="let each run start its own PostgreSQL (slower; no state shared between runs)")
    parser.add_argument("--list", action="store_true", help="list the sites and exit")
    parser.add_argument("--baseline", action="store_true", help="run each selection unmutated and exit")
    parser.add_argument("--sites", choices=sorted(SITE_LISTS), default="guards",
                        help="the refusal guards (default) or the calibration sites (calibration_sites.py)")
    parser.add_argument("--tests", nargs="+", default=[],
                        help="run these tests instead of each site's selection (does a new test kill its site?)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    listed = SITE_LISTS[args.sites].SITES
    sites = [site for site in listed if not args.only or any(part in site.name for part in args.only)]
    if args.list:
        for site in sites:
            print(f"{site.name:45} {site.path:36} {site.selection}")
        return 0
    copy = scratch_copy(ROOT)
    server = None
    try:
        _check_imports_from(copy)
        if not args.own_server:
            import pgserver

            server = pgserver.get_server(copy / ".postgres", cleanup_mode="stop")
            _SERVER_DSN["DPPROXY_TEST_DSN"] = server.get_uri("postgres")
        if args.baseline:
            for name in sorted({site.selection for site in sites}):
                verdict, seconds, detail = run_selection(copy, selection(name, args.wide, args.sites), args.timeout)
                print(f"{name:12} {'PASSED' if verdict == 'SURVIVED' else verdict:9} {seconds:6.1f}s  {detail}", flush=True)
            return 0
        outcomes = []
        for site in sites:
            outcome = ablate(copy, site, args.timeout, args.wide, args.sites, tuple(args.tests))
            outcomes.append(outcome)
            print(f"{outcome.verdict:9} {outcome.seconds:6.1f}s  {site.name:45} {outcome.detail}", flush=True)
    finally:
        if server is not None:
            server.cleanup()
        shutil.rmtree(copy, ignore_errors=True)
    counts = {verdict: sum(o.verdict == verdict for o in outcomes) for verdict in ("KILLED", "SURVIVED", "TIMEOUT", "ERROR")}
    print(", ".join(f"{count} {verdict}" for verdict, count in counts.items()),
          f"of {len(outcomes)} sites, {sum(o.seconds for o in outcomes) / 60:.1f} min")
    survived = [o.site.name for o in outcomes if o.verdict == "SURVIVED"]
    if survived:
        print("SURVIVED:", " ".join(survived))
    return 1 if survived or counts["ERROR"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
