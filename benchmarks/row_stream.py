"""CPU time to hand out a held passthrough rest, working tree against a git revision.

    python -m benchmarks.row_stream                    # against d7cafcf (before take was linear)
    python -m benchmarks.row_stream --before HEAD~3    # against another revision

A client that reads its rows late, or a suspended portal while other statements run, has the
rest of its result held in memory (``RowStream.hold``, at most 64 MB: 4,000,000 rows of 16
bytes) and then handed out a batch of 1,024 rows at a time (``RowStream.take``). Cutting each
batch off the front of the held list made that quadratic in the rows held. For each count of
held 16-byte rows, the CPU time (``time.thread_time``) of taking them all from
proxy/backend/row_stream.py of the working tree ("after") and of ``--before`` ("before"),
the best of ``--repeats`` runs, the two alternating. Prints a Markdown table; nothing is
asserted (tests/test_row_stream.py pins the growth).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from types import ModuleType

from . import revision

PATH = "proxy/backend/row_stream.py"
BEFORE = "d7cafcf"  # the last revision whose take was quadratic
ROW = b"D" * 16


def drain_cpu_s(module: ModuleType, count: int) -> float:
    """CPU seconds to take ``count`` held rows from a stream of ``module``'s RowStream."""
    async def pull() -> tuple[list[bytes], str | None]:
        return [], "SELECT"

    async def drain() -> float:
        stream = module.RowStream(pull, [ROW] * count, b"I")
        await stream.hold()  # the statement's end arrives; every row is now held
        started = time.thread_time()
        taken = 0
        async for batch in stream.take():
            taken += len(batch)
        assert taken == count
        return time.thread_time() - started

    return asyncio.run(drain())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE, help=f"git revision to compare with (default {BEFORE})")
    parser.add_argument("--rows", default="250000,1000000,4000000", help="comma-separated held row counts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    versions = {"before": revision.module_at(PATH, args.before), "after": revision.module_at(PATH, None)}
    print(f"| held rows | before ({args.before}) ms | after ms | before / after | after ns per row |")
    print("|---:|---:|---:|---:|---:|")
    for count in (int(part) for part in args.rows.split(",")):
        best = {name: float("inf") for name in versions}
        for _ in range(args.repeats):
            for name, module in versions.items():
                best[name] = min(best[name], drain_cpu_s(module, count))
        before, after = best["before"], best["after"]
        print(f"| {count:,} | {before * 1000:.1f} | {after * 1000:.1f} | {before / after:.0f} | "
              f"{after / count * 1e9:.1f} |")


if __name__ == "__main__":
    main()
