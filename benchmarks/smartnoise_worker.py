"""SmartNoise SQL timing worker: run by the Python of SmartNoise's own virtual environment.

    python smartnoise_worker.py '<config JSON>'

SmartNoise SQL pins dependencies of its own (an older OpenDP, antlr4), so it cannot share
dpproxy's environment; ``benchmarks/smartnoise.py`` starts this script with the Python of a
separate venv and talks to it over pipes. The config holds psycopg2's connection keywords,
SmartNoise's metadata and the privacy parameters. Then, for every line on stdin (one SQL
statement), it answers one JSON line on stdout: ``{"ms": <time of reader.execute>}`` or
``{"error": "<type>: <message>"}``. It imports nothing from this repository.
"""

from __future__ import annotations

import json
import sys
import time


def main() -> int:
    import psycopg2
    import snsql

    config = json.loads(sys.argv[1])
    connection = psycopg2.connect(**config["connect"])
    connection.autocommit = True
    privacy = snsql.Privacy(epsilon=config["epsilon"], delta=config["delta"])
    reader = snsql.from_connection(connection, privacy=privacy, metadata=config["metadata"], engine="postgres")
    print(json.dumps({"ready": snsql.__name__}), flush=True)
    for line in sys.stdin:
        sql = line.strip()
        if not sql:
            continue
        answer: dict[str, float | str]
        try:
            started = time.perf_counter()
            reader.execute(sql)
            answer = {"ms": (time.perf_counter() - started) * 1000}
        except Exception as exc:  # reported to the benchmark, which notes it per query
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(answer), flush=True)
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
