"""Regenerate docs/img/superset-dashboard.png: a Superset dashboard drawn through dpproxy's demo.

Starts ``dpproxy demo`` (its own data directory under a temporary folder), Apache Superset
(tests/superset/install.sh's venv, anonymous visitors given Admin's rights so that a browser
needs no login), registers the demo as a database, builds a dashboard of DP big numbers, a pie
of ``race`` and a monthly line of ``interview_date`` (histograms over keys the demo policy opts
in) and a table of aggregates on ``adult`` through Superset's REST API, and takes a PNG with headless
Chromium (Debian's ``chromium``). Not part of the test suite; run from the repository root:

    python tools/superset_screenshot.py [--out docs/img/superset-dashboard.png]

Every chart is a DP query charged to the demo analyst's budget (ε = 1 each).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from superset_harness import SupersetApi, SupersetServer  # noqa: E402

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars")
WINDOW = (1400, 1060)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"dpproxy demo exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"dpproxy demo did not listen on {port} within {timeout_s:.0f} s")


def _metric(aggregate: str, column: str, label: str) -> dict[str, Any]:
    return {"expressionType": "SIMPLE", "column": {"column_name": column}, "aggregate": aggregate, "label": label}


def _female() -> dict[str, Any]:
    return {"expressionType": "SIMPLE", "subject": "sex", "operator": "==", "comparator": "Female",
            "clause": "WHERE"}


def _charts(dataset: int) -> list[tuple[str, dict[str, Any]]]:
    """(name, form data) of each chart on the dashboard."""
    base = {"datasource": f"{dataset}__table", "adhoc_filters": [], "header_font_size": 0.3,
            "subheader_font_size": 0.15, "y_axis_format": ",d"}
    return [
        ("People (DP count)", {**base, "viz_type": "big_number_total", "metric": "count"}),
        ("Women (DP count)", {**base, "viz_type": "big_number_total", "metric": "count",
                              "adhoc_filters": [_female()]}),
        ("Average age (DP)", {**base, "viz_type": "big_number_total", "y_axis_format": ".1f",
                              "metric": _metric("AVG", "age", "AVG(age)")}),
        ("Race (DP histogram)", {"datasource": f"{dataset}__table", "viz_type": "pie", "groupby": ["race"],
                                 "metric": "count", "adhoc_filters": [], "row_limit": 100, "show_labels": True,
                                 "label_type": "key_percent", "show_legend": True, "sort_by_metric": True}),
        ("Interviews per month (DP time series)", {
            "datasource": f"{dataset}__table", "viz_type": "echarts_timeseries_line", "x_axis": "interview_date",
            "time_grain_sqla": "P1M", "metrics": ["count"], "groupby": [], "row_limit": 10000, "y_axis_format": ",d",
            "adhoc_filters": [{"expressionType": "SIMPLE", "subject": "interview_date", "operator": "TEMPORAL_RANGE",
                               "comparator": "No filter", "clause": "WHERE"}], "show_legend": False}),
        ("Aggregates of adult (DP)", {"datasource": f"{dataset}__table", "viz_type": "table",
                                      "query_mode": "aggregate", "groupby": [], "adhoc_filters": [],
                                      "metrics": ["count", _metric("AVG", "hours_per_week", "AVG(hours_per_week)"),
                                                  _metric("SUM", "capital_gain", "SUM(capital_gain)"),
                                                  _metric("MAX", "age", "MAX(age)")],
                                      "row_limit": 10, "include_time": False}),
    ]


def _position(chart_ids: list[tuple[int, str]]) -> dict[str, Any]:
    """Superset's dashboard layout: three big numbers in a row, the pie and the line, the table below."""
    layout: dict[str, Any] = {
        "DASHBOARD_VERSION_KEY": "v2",
        "ROOT_ID": {"type": "ROOT", "id": "ROOT_ID", "children": ["GRID_ID"]},
        "GRID_ID": {"type": "GRID", "id": "GRID_ID", "children": ["ROW-1", "ROW-2", "ROW-3"], "parents": ["ROOT_ID"]},
        "HEADER_ID": {"id": "HEADER_ID", "type": "HEADER", "meta": {"text": "adult through dpproxy"}},
    }
    rows = {"ROW-1": (chart_ids[:3], [4, 4, 4], 40), "ROW-2": (chart_ids[3:5], [4, 8], 60),
            "ROW-3": (chart_ids[5:], [12], 18)}
    for row, (charts, widths, height) in rows.items():
        layout[row] = {"type": "ROW", "id": row, "children": [f"CHART-{i}" for i, _ in charts],
                       "parents": ["ROOT_ID", "GRID_ID"], "meta": {"background": "BACKGROUND_TRANSPARENT"}}
        for (chart_id, name), width in zip(charts, widths):
            layout[f"CHART-{chart_id}"] = {
                "type": "CHART", "id": f"CHART-{chart_id}", "children": [], "parents": ["ROOT_ID", "GRID_ID", row],
                "meta": {"chartId": chart_id, "width": width, "height": height, "sliceName": name}}
    return layout


def build_dashboard(api: SupersetApi, proxy_port: int) -> int:
    """Register the demo, a dataset on adult, the charts and their dashboard; its id."""
    uri = f"postgresql+psycopg2://analyst:analyst@127.0.0.1:{proxy_port}/demo"
    status, body = api.post("/api/v1/database/", {"database_name": "dpproxy demo", "sqlalchemy_uri": uri})
    assert status == 201, body
    database = body["id"]
    status, body = api.post("/api/v1/dataset/", {"database": database, "schema": "public", "table_name": "adult"})
    assert status == 201, body
    dataset = body["id"]
    chart_ids: list[tuple[int, str]] = []
    for name, form_data in _charts(dataset):
        status, body = api.post("/api/v1/chart/", {"slice_name": name, "viz_type": form_data["viz_type"],
                                                   "datasource_id": dataset, "datasource_type": "table",
                                                   "params": json.dumps(form_data)})
        assert status == 201, body
        chart_ids.append((body["id"], name))
    status, body = api.post("/api/v1/dashboard/", {
        "dashboard_title": "adult through dpproxy (differentially private)", "published": True,
        "position_json": json.dumps(_position(chart_ids))})
    assert status == 201, body
    dashboard = body["id"]
    for chart_id, _ in chart_ids:
        status, body = api.request("PUT", f"/api/v1/chart/{chart_id}", {"dashboards": [dashboard]})
        assert status == 200, body
    return int(dashboard)


def screenshot(url: str, out: Path, profile: Path) -> None:
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    command = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
               "--virtual-time-budget=30000", f"--screenshot={out}", url]
    subprocess.run(command, check=True, timeout=180, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "superset-dashboard.png")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpproxy-superset-shot-") as tmp:
        workdir = Path(tmp)
        port = _free_port()
        demo_log = (workdir / "demo.log").open("wb")
        demo = subprocess.Popen([sys.executable, "-m", "proxy.cli", "demo", "--port", str(port), "--data-dir",
                                 str(workdir / "demo")], cwd=ROOT, stdout=demo_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        server = None
        try:
            _wait_port(port, demo)
            server = SupersetServer(workdir)
            dashboard = build_dashboard(SupersetApi(server.url), port)
            server.stop()
            server = SupersetServer(workdir, public=True)
            screenshot(f"{server.url}/superset/dashboard/{dashboard}/?standalone=1", args.out.resolve(),
                       workdir / "chromium")
            print(f"wrote {args.out}")
        except BaseException:
            if server is not None:
                print(server.log_tail(60), file=sys.stderr)
            raise
        finally:
            if server is not None:
                server.stop()
            if demo.poll() is None:
                os.killpg(demo.pid, signal.SIGINT)
                try:
                    demo.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(demo.pid, signal.SIGKILL)
            demo_log.close()


if __name__ == "__main__":
    main()
