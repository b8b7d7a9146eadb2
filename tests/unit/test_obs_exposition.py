"""obs/exposition: a scrape in the format the scraper asked for.

Text 0.0.4 by default, OpenMetrics 1.0 for Prometheus's own Accept header, the same samples
in both; `promtool check metrics`, the linter Prometheus ships, reads the plugin's and the
webhook's whole text pages. The lock-free read obs/exposition documents is driven from two threads.
"""

from __future__ import annotations

import subprocess
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.obs.exposition import scrape
from nri_midbatch.obs.metrics import Metrics, WebhookMetrics
from nri_midbatch.process.app import App
from nri_midbatch.process.session_watch import SessionWatch
from tests.prometheus_tools import binary

from .http_fixtures import PROMETHEUS_ACCEPT, openmetrics_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def text_samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def openmetrics_samples(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in openmetrics_families(text)
        for s in family.samples
    }


def served_metrics() -> Metrics:
    metrics = Metrics()
    call = SessionWatch(metrics).call_begun("CreateContainer", api.CreateContainerRequest())
    call.replied(api.CreateContainerResponse())
    return metrics


@pytest.mark.parametrize("accept", [None, "", "*/*", "text/plain", "text/plain;version=0.0.4"])
def test_text_0_0_4_unless_openmetrics_is_asked_for(accept: str | None) -> None:
    body, content_type = scrape(served_metrics().registry, accept)
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    samples = text_samples(body.decode())
    ok = ("nri_midbatch_events_total", frozenset({("method", "CreateContainer"), ("result", "ok")}))
    assert samples[ok] == 1


def test_openmetrics_for_prometheus_with_the_same_samples() -> None:
    metrics = served_metrics()
    text, _ = scrape(metrics.registry, None)
    body, content_type = scrape(metrics.registry, PROMETHEUS_ACCEPT)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    assert body.endswith(b"# EOF\n")
    ours = {key: v for key, v in text_samples(text.decode()).items() if _stable(key[0])}
    theirs = {key: v for key, v in openmetrics_samples(body.decode()).items() if _stable(key[0])}
    assert theirs == ours
    assert not [name for name, _ in theirs if name.endswith("_created")]


def _stable(name: str) -> bool:
    """Samples that cannot change between two scrapes a moment apart."""
    return not name.startswith(("process_", "python_gc_"))


def test_the_process_families_operators_alert_on() -> None:
    body, _ = scrape(Metrics().registry, None)
    samples = {name: value for (name, labels), value in text_samples(body.decode()).items()}
    with open("/proc/self/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    # The same page a moment later: within 16 MiB of what the kernel says now.
    assert abs(samples["process_resident_memory_bytes"] - rss_kib * 1024) < 16 * 2**20
    assert samples["process_open_fds"] >= 3
    assert samples["process_cpu_seconds_total"] > 0
    assert samples["process_start_time_seconds"] > 1.7e9
    assert samples["process_max_fds"] >= samples["process_open_fds"]


def test_a_scrape_from_another_thread_sees_whole_histograms() -> None:
    """The loop changes families while the server's thread renders: +Inf always equals _count."""
    registry = CollectorRegistry()
    latency = Histogram("app_seconds", "Latency", ["method"], registry=registry, buckets=(0.5,))
    events = Counter("app_events", "Events", ["method"], registry=registry)
    stop = threading.Event()
    errors: list[BaseException] = []

    def scrape_until_stopped() -> None:
        try:
            while not stop.is_set():
                got = text_samples(scrape(registry, None)[0].decode())
                for (name, labels), value in got.items():
                    if name == "app_seconds_count":
                        inf = got[("app_seconds_bucket", labels | {("le", "+Inf")})]
                        assert inf == value
        except BaseException as exc:
            errors.append(exc)

    scraper = threading.Thread(target=scrape_until_stopped)
    scraper.start()
    try:
        for i in range(20_000):
            method = f"m{i % 500}"  # new children appear while the other thread renders
            latency.labels(method).observe(i % 3 * 0.4)
            events.labels(method).inc()
    finally:
        stop.set()
        scraper.join(10)
    assert not errors, errors[0]


@pytest.mark.monitoring
def test_promtool_accepts_the_plugins_and_the_webhooks_pages() -> None:
    """The whole text page of a plugin that has served a call, and a webhook's page.

    Debian 12's promtool (2.42) reads the text format only; the OpenMetrics page is read by
    the library's strict parser above and by a real Prometheus in tests/e2e/test_prometheus.py.
    """
    app = App(load_startup_settings(None), name="midbatch", idx="10", config_path=None)
    call = SessionWatch(app.metrics).call_begun("CreateContainer", api.CreateContainerRequest())
    call.replied(api.CreateContainerResponse())
    for registry in (app.metrics.registry, WebhookMetrics().registry):
        page, _ = scrape(registry, None)
        res = subprocess.run(
            [binary("promtool"), "check", "metrics"], input=page, capture_output=True
        )
        assert (res.returncode, res.stdout + res.stderr) == (0, b"")
