"""The Prometheus endpoint, scraped over HTTP while real clients query through dpproxy.

Metrics live in the process-wide registry and other tests' proxies share this process, so
every assertion is on the change between two scrapes.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from prometheus_client import Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy
from proxy.ops import metrics

METRICS_POLICY = TEST_POLICY.replace(
    "users:\n",
    "metrics: {{host: 127.0.0.1, port: 0}}\n"
    "users:\n"
    "  frugal:\n"
    "    password: frugal\n"
    "    budget: {{epsilon: 1.5}}\n",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def metered(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("m") / "l.sqlite3", METRICS_POLICY))
    yield proxy
    proxy.stop()


def scrape(proxy: RunningProxy) -> Samples:
    endpoint = proxy.server.metrics
    assert endpoint is not None
    with urllib.request.urlopen(f"http://{endpoint.host}:{endpoint.port}/metrics", timeout=10) as reply:
        assert reply.status == 200
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def change(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in after, f"{name}{labels} is not exported"
    return after[key] - before.get(key, 0.0)


def scrape_once_recorded(proxy: RunningProxy, before: Samples, name: str, count: float, **labels: str) -> Samples:
    """A scrape that shows ``count`` more of ``name`` than ``before``, or the last of 50 tries: a
    statement's metrics are recorded just after its answer is sent (off the answer's path), so a
    scrape the client makes at once may come first."""
    for _ in range(50):
        after = scrape(proxy)
        if (name, tuple(sorted(labels.items()))) in after and change(before, after, name, **labels) >= count:
            break
        threading.Event().wait(0.1)
    return after


def test_statements_are_counted_by_decision_and_reason_with_epsilon_per_user(metered: RunningProxy):
    before = scrape(metered)
    with metered.connect() as conn:
        for _ in range(3):
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40")
        conn.execute("SELECT 1")
        with pytest.raises(psycopg.Error, match="rule: no-row-access"):
            conn.execute("SELECT * FROM adult")
    with psycopg.connect(metered.dsn("frugal", "frugal"), autocommit=True) as conn:
        conn.execute("SELECT COUNT(*) FROM adult")
        with pytest.raises(psycopg.Error, match="budget exhausted"):
            conn.execute("SELECT COUNT(*) FROM adult")
    after = scrape_once_recorded(metered, before, "dpproxy_budget_refusals_total", 1, user="frugal")

    assert change(before, after, "dpproxy_statements_total", decision="dp", reason="") == 4
    assert change(before, after, "dpproxy_statements_total", decision="passthrough", reason="") == 1
    assert change(before, after, "dpproxy_statements_total", decision="refused", reason="no-row-access") == 1
    assert change(before, after, "dpproxy_statements_total", decision="refused", reason="budget") == 1
    assert change(before, after, "dpproxy_epsilon_charged_total", user="analyst") == pytest.approx(3.0)
    assert change(before, after, "dpproxy_epsilon_charged_total", user="frugal") == pytest.approx(1.0)
    assert change(before, after, "dpproxy_budget_refusals_total", user="frugal") == 1
    assert ("dpproxy_budget_refusals_total", (("user", "analyst"),)) not in after or change(
        before, after, "dpproxy_budget_refusals_total", user="analyst"
    ) == 0


def test_latency_histograms_have_buckets_end_to_end_and_for_the_backend(metered: RunningProxy):
    before = scrape(metered)
    with metered.connect() as conn:
        conn.execute("SELECT COUNT(*), SUM(age) FROM adult")
    after = scrape_once_recorded(metered, before, "dpproxy_statement_duration_seconds_count", 1, decision="dp")
    assert change(before, after, "dpproxy_statement_duration_seconds_count", decision="dp") == 1
    assert change(before, after, "dpproxy_statement_duration_seconds_bucket", decision="dp", le="+Inf") == 1
    assert ("dpproxy_statement_duration_seconds_bucket", (("decision", "dp"), ("le", "0.005"))) in after
    assert change(before, after, "dpproxy_backend_duration_seconds_count") >= 1
    assert ("dpproxy_backend_duration_seconds_bucket", (("le", "0.001"),)) in after
    assert change(before, after, "dpproxy_statement_duration_seconds_sum", decision="dp") > 0


def test_statements_are_counted_and_timed_off_the_event_loop(metered: RunningProxy, monkeypatch: pytest.MonkeyPatch):
    threads: set[str] = set()
    per_statement = {"dpproxy_statements", "dpproxy_statement_duration_seconds", "dpproxy_backend_duration_seconds",
                     "dpproxy_epsilon_charged", "dpproxy_delta_charged", "dpproxy_backend_pool_checkout_wait_seconds"}

    def spy(original: Callable[..., None]) -> Callable[..., None]:
        def recorded(self: object, *args: float) -> None:
            # Only the per-statement metrics: a pool counter (a reset, an idle connection
            # discarded) is counted where it happens, on the event loop, as before.
            if getattr(self, "_name", None) in per_statement:
                threads.add(threading.current_thread().name)
            original(self, *args)
        return recorded

    monkeypatch.setattr(Histogram, "observe", spy(Histogram.observe))
    monkeypatch.setattr(Counter, "inc", spy(Counter.inc))
    before = scrape(metered)
    with metered.connect() as conn:
        conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40")
    after = scrape_once_recorded(metered, before, "dpproxy_statements_total", 1, decision="dp", reason="")
    assert change(before, after, "dpproxy_statements_total", decision="dp", reason="") == 1
    assert change(before, after, "dpproxy_epsilon_charged_total", user="analyst") == pytest.approx(1.0)
    assert change(before, after, "dpproxy_backend_pool_checkout_wait_seconds_count") >= 1
    assert threads and metered._thread.name not in threads  # the metrics thread's, or the scrape's


def test_a_scrape_shows_statements_the_metrics_thread_has_not_applied(metered: RunningProxy,
                                                                      monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(metrics, "_wake_up", lambda: None)  # the thread is not woken by these statements
    before = scrape(metered)
    with metered.connect() as conn:
        for _ in range(3):
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40")
    after = scrape(metered)
    assert change(before, after, "dpproxy_statements_total", decision="dp", reason="") == 3
    assert change(before, after, "dpproxy_statement_duration_seconds_count", decision="dp") == 3
    assert change(before, after, "dpproxy_backend_duration_seconds_count") >= 3


def test_open_connections_gauge_follows_sessions(metered: RunningProxy):
    before = scrape(metered)
    conns = [metered.connect() for _ in range(3)]
    try:
        assert change(before, scrape(metered), "dpproxy_open_connections") == 3
    finally:
        for conn in conns:
            conn.close()
    for _ in range(50):  # the sessions end asynchronously after Terminate
        if change(before, scrape(metered), "dpproxy_open_connections") == 0:
            break
        threading.Event().wait(0.1)
    assert change(before, scrape(metered), "dpproxy_open_connections") == 0


def test_scrapes_during_a_load_run_see_counters_only_grow(metered: RunningProxy):
    clients, queries = 4, 25
    before = scrape(metered)
    errors: list[BaseException] = []

    def load() -> None:
        try:
            with metered.connect() as conn:
                for _ in range(queries):
                    conn.execute("SELECT COUNT(*) FROM adult WHERE hours_per_week > 30")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(clients)]
    for thread in threads:
        thread.start()
    seen = [change(before, scrape(metered), "dpproxy_statements_total", decision="dp", reason="")]
    while any(thread.is_alive() for thread in threads):
        seen.append(change(before, scrape(metered), "dpproxy_statements_total", decision="dp", reason=""))
    for thread in threads:
        thread.join()
    assert not errors
    seen.append(change(before, scrape(metered), "dpproxy_statements_total", decision="dp", reason=""))
    assert seen == sorted(seen) and seen[-1] == clients * queries


def test_metrics_are_off_unless_the_policy_asks(proxy: RunningProxy):
    assert proxy.policy.metrics is None and proxy.server.metrics is None


def test_a_policy_reload_is_counted(metered: RunningProxy, tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("backend: {dsn: x}\nusers: {}\ntables: {}\n")
    before = scrape(metered)
    assert metered._call(metered.server.reload(broken)) is False
    after = scrape(metered)
    assert change(before, after, "dpproxy_policy_reloads_total", outcome="refused") == 1
