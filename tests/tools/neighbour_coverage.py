"""Which accepted-path branches do the neighbour fuzzers never reach, though other tests do?

The neighbour fuzzers (``tests/test_neighbour_fuzz*.py``) compare everything a client sees of a
statement on two tables that differ by one row; a construct they never generate has never had
its row-independence compared. This tool measures that blind spot with coverage.py's branch
coverage of the dpproxy code the tests run (in process, and in ``dpproxy serve``'s worker
processes):

1. runs the fuzz files, then a reference set of tests (by default the DP-path files below), each
   under ``coverage run`` into a directory of its own (``--run`` picks which; the other's data is reused);
2. prints line and branch coverage of ``rewriter/``, ``proxy/dp/``, ``mechanisms/`` and
   ``proxy/wire/`` for each set;
3. lists, file by file, the branch arcs the reference set takes and the fuzzers do not, leaving
   out arcs into a refusal (a block that raises or returns a refusal, a hint's text): those are
   accepted paths, constructs dpproxy answers or post-processes, that no neighbour check has
   compared. Each is shown with a reference test that takes it.

Not part of the test suite (coverage slows the fuzzers down, and a percentage is no test; the
file is no ``test_*.py``, so pytest does not collect it). Run from the repository root with the
test extras installed (coverage.py 7.10 or later); about 10 minutes on two cores:

    .venv/bin/python tests/tools/neighbour_coverage.py [--out /tmp/neighbour-coverage] [--run both|fuzz|reference|none]
        [--reference tests/test_attack_*.py ...] [--pytest-args "-m 'not clients'"]

The refusal filter is a heuristic read from the source (``_refusal_lines``): an arc into a
helper that builds a refusal under another name still counts as accepted.
"""

from __future__ import annotations

import argparse
import ast
import glob
import os
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coverage import Coverage
from coverage.python import PythonFileReporter

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("rewriter/", "proxy/dp/", "mechanisms/", "proxy/wire/")
FUZZ = ("tests/test_neighbour_fuzz*.py",)
REFERENCE = ("tests/test_dp_*.py", "tests/test_histograms.py", "tests/test_query_shapes.py",
             "tests/test_conditional_aggregates.py", "tests/test_percentiles.py", "tests/test_variance.py")
_RCFILE = """\
[run]
branch = True
source = rewriter, proxy, mechanisms, policies
parallel = True
patch = subprocess
"""

Arc = tuple[int, int]


def run(name: str, patterns: Sequence[str], out: Path, pytest_args: Sequence[str]) -> Path:
    """Run the test files ``patterns`` under coverage into ``out/name``; the combined data file."""
    directory = out / name
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(".coverage*"):
        stale.unlink()
    rcfile = out / "coveragerc"
    rcfile.write_text(_RCFILE)
    files = sorted({path for pattern in patterns for path in glob.glob(pattern, root_dir=ROOT)})
    data_file = directory / ".coverage"
    # This module is also the pytest plugin that names each test's context (pytest_runtest_setup).
    command = [sys.executable, "-m", "coverage", "run", f"--rcfile={rcfile}", f"--data-file={data_file}",
               "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "-p", "neighbour_coverage", *pytest_args]
    print(f"$ {shlex.join(command)}", file=sys.stderr)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests" / "tools"), os.environ.get("PYTHONPATH")]))}
    # Failing tests still measure what they ran: report their outcome, go on.
    result = subprocess.run(command, cwd=ROOT, env=environment, stdout=sys.stderr, check=False)
    if result.returncode != 0:
        print(f"{name}: pytest exited {result.returncode}", file=sys.stderr)
    return combined(directory)


def combined(directory: Path) -> Path:
    """The data file of ``directory``, its processes' parallel files combined into it first."""
    data_file = directory / ".coverage"
    if any(directory.glob(".coverage.*")):
        cov = Coverage(data_file=str(data_file), config_file=False)
        if data_file.exists():
            cov.load()
        cov.combine([str(directory)], keep=False)
        cov.save()
    return data_file


def pytest_runtest_setup(item: Any) -> None:
    """As a pytest plugin: record what runs from here on (in every thread, the in-process
    dpproxy's too) under the test's node id, so that the report can name a test per arc."""
    current = Coverage.current()
    if current is not None:
        current.switch_context(item.nodeid)


@dataclass
class Measured:
    """What one data file says was run, per source file (relative path): lines and arcs."""

    lines: dict[str, set[int]] = field(default_factory=dict)
    arcs: dict[str, set[Arc]] = field(default_factory=dict)
    # Per file and line, the tests (contexts) that ran it, where the run recorded them.
    tests: dict[str, dict[int, list[str]]] = field(default_factory=dict)


def load(data_file: Path) -> Measured:
    cov = Coverage(data_file=str(data_file), config_file=False)
    cov.load()
    data = cov.get_data()
    measured = Measured()
    for filename in data.measured_files():
        relative = Path(filename).resolve().relative_to(ROOT).as_posix() if filename.startswith(str(ROOT)) else None
        if relative is None or not relative.startswith(AREAS):
            continue
        reporter = _reporter(relative)
        measured.lines[relative] = set(reporter.translate_lines(data.lines(filename) or ()))
        measured.arcs[relative] = set(reporter.translate_arcs(data.arcs(filename) or ()))
        measured.tests[relative] = {line: [c for c in contexts if c] for line, contexts in data.contexts_by_lineno(filename).items()}
    return measured


_REPORTERS: dict[str, PythonFileReporter] = {}
_SETTINGS = Coverage(config_file=False, branch=True)


def _reporter(relative: str) -> PythonFileReporter:
    if relative not in _REPORTERS:
        # The reporter reads its exclusions (``# pragma: no cover``) from a Coverage's settings.
        _REPORTERS[relative] = PythonFileReporter(str(ROOT / relative), coverage=_SETTINGS)
    return _REPORTERS[relative]


def _sources() -> list[str]:
    return sorted(path.relative_to(ROOT).as_posix() for area in AREAS for path in (ROOT / area).rglob("*.py"))


def _branch_arcs(reporter: PythonFileReporter) -> set[Arc]:
    """The possible arcs out of lines with more than one exit (what branch coverage counts)."""
    exits = reporter.exit_counts()
    excluded = reporter.excluded_lines()
    return {arc for arc in reporter.arcs() if exits.get(arc[0], 0) > 1 and arc[0] not in excluded}


def totals(measured: Measured, area: str) -> tuple[int, int, int, int]:
    """Statements run, statements, branch arcs taken, branch arcs: for the files under ``area``."""
    run_lines = lines = taken = branches = 0
    for relative in _sources():
        if not relative.startswith(area):
            continue
        reporter = _reporter(relative)
        statements = set(reporter.lines())
        possible = _branch_arcs(reporter)
        run_lines += len(statements & measured.lines.get(relative, set()))
        lines += len(statements)
        taken += len(possible & measured.arcs.get(relative, set()))
        branches += len(possible)
    return run_lines, lines, taken, branches


def _refusal_lines(source: str) -> set[int]:
    """Lines that start a statement on a refusal path: a ``raise``; every statement of a block
    (an if/else/except/with body) whose last statement raises or returns a refusal (a call or a
    name that says ``refus``); and every line of a function that writes a hint (``*_hint``).

    An arc into one of these lines leads to an error, not to an answer."""
    refusing: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name.endswith("_hint"):
            refusing.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        for name in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(node, name, None)
            if not isinstance(block, list) or not block or not isinstance(block[0], ast.stmt | ast.excepthandler):
                continue
            statements = [s for s in block if isinstance(s, ast.stmt)]
            if statements and _refuses(statements[-1]):
                refusing.update(s.lineno for s in statements)
    return refusing


def _refuses(statement: ast.stmt) -> bool:
    """A ``raise``, or a ``return`` of a refusal: ``Refusal(...)``, ``_refuse(...)``, ``refusal``."""
    if isinstance(statement, ast.Raise):
        return True
    if not isinstance(statement, ast.Return) or statement.value is None:
        return False
    value = statement.value.func if isinstance(statement.value, ast.Call) else statement.value
    name = value.id if isinstance(value, ast.Name) else value.attr if isinstance(value, ast.Attribute) else ""
    return "refus" in name.lower()


def _function_of(tree: ast.Module, line: int) -> str:
    """The innermost function or class around ``line`` (its qualified name), or "<module>"."""
    names: list[str] = []
    nodes: Iterable[ast.AST] = tree.body
    while True:
        inner = next((n for n in nodes if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                      and n.lineno <= line <= (n.end_lineno or n.lineno)), None)
        if inner is None:
            return ".".join(names) or "<module>"
        names.append(inner.name)
        nodes = inner.body


def missed(fuzz: Measured, reference: Measured) -> dict[str, list[Arc]]:
    """Per file, the branch arcs ``reference`` takes that ``fuzz`` does not, without refusals."""
    found: dict[str, list[Arc]] = {}
    for relative in sorted(reference.arcs):
        reporter = _reporter(relative)
        refusing = _refusal_lines(reporter.source())
        arcs = (_branch_arcs(reporter) & reference.arcs[relative]) - fuzz.arcs.get(relative, set())
        accepted = sorted(arc for arc in arcs if arc[1] not in refusing)
        if accepted:
            found[relative] = accepted
    return found


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "  n/a"


def print_report(sets: dict[str, Measured], fuzz: str, reference: str) -> None:
    print(f"{'area':<14}" + "".join(f"{name + ' lines':>22}{name + ' branches':>26}" for name in sets))
    for area in (*AREAS, ""):
        row = f"{area or 'all four':<14}"
        for measured in sets.values():
            run_lines, lines, taken, branches = totals(measured, area) if area else _summed(measured)
            row += f"{f'{run_lines}/{lines} {_percent(run_lines, lines)}':>22}{f'{taken}/{branches} {_percent(taken, branches)}':>26}"
        print(row)
    gaps = missed(sets[fuzz], sets[reference])
    count = sum(len(arcs) for arcs in gaps.values())
    print(f"\n{count} accepted-path branch arcs that {reference} takes and {fuzz} never does "
          "(line -> line; a negative target leaves the function):")
    for relative, arcs in gaps.items():
        reporter = _reporter(relative)
        tree = ast.parse(reporter.source())
        text = reporter.source().splitlines()
        print(f"\n{relative}")
        tests = sets[reference].tests.get(relative, {})
        for start, end in arcs:
            target = text[end - 1].strip() if end > 0 else "(exit)"
            print(f"  {start:>5} -> {end:<6} {_function_of(tree, start):<40} {target[:90]}")
            both = sorted(set(tests.get(start, ())) & set(tests.get(end, ()))) if end > 0 else sorted(tests.get(start, ()))
            if both:
                print(f"{'':17}reached by {both[0]}" + (f" and {len(both) - 1} more" if len(both) > 1 else ""))


def _summed(measured: Measured) -> tuple[int, int, int, int]:
    parts = [totals(measured, area) for area in AREAS]
    run_lines, lines, taken, branches = (sum(part[i] for part in parts) for i in range(4))
    return run_lines, lines, taken, branches


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/neighbour-coverage"),
                        help="where the coverage data of each set goes (default %(default)s)")
    parser.add_argument("--run", choices=("both", "fuzz", "reference", "none"), default="both",
                        help="which sets to run; the others' data is what a previous run left in --out")
    parser.add_argument("--reference", nargs="+", default=list(REFERENCE),
                        help="test files (globs, from the repository root) whose reach the fuzzers' is compared with")
    parser.add_argument("--pytest-args", default="-m 'not clients'",
                        help="extra pytest arguments for both runs (default %(default)r: no system clients)")
    args = parser.parse_args(argv)
    extra = shlex.split(args.pytest_args)
    patterns = {"fuzz": FUZZ, "reference": args.reference}
    paths = {name: run(name, patterns[name], args.out, extra) if args.run in ("both", name) else combined(args.out / name)
             for name in ("fuzz", "reference")}
    print_report({name: load(path) for name, path in paths.items()}, "fuzz", "reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
