"""obs/exposition: the text format as Prometheus's own parsers read it.

prometheus_client stays a test dependency as the oracle: its parser reads what we
write, and its own families, fed the same operations, must give the same samples.
`promtool check metrics`, the linter Prometheus ships, reads the plugin's whole page.
"""

from __future__ import annotations

import math
import subprocess
import threading

import prometheus_client
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.validator import load_startup_settings
from nri_midbatch.obs.exposition import Counter, Family, Gauge, Histogram, Registry
from nri_midbatch.obs.metrics import EVENT_BUCKETS, CountersCollector, WebhookMetrics
from nri_midbatch.process.app import App
from tests.prometheus_tools import binary

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str, *, created: bool = False) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if created or not s.name.endswith("_created")
    }


def test_families_read_back_as_written() -> None:
    registry = Registry()
    events = Counter("app_events", "Events handled", ["method", "result"], registry)
    state = Gauge("app_up", "1 while up", (), registry)
    latency = Histogram("app_seconds", "Latency", ["method"], registry, buckets=(0.1, 1.0))
    events.labels("Create", "ok").inc()
    events.labels("Create", "ok").inc(2)
    events.labels("Create", "error")
    state.set(1)
    for value in (0.05, 0.1, 0.5, 3.0):
        latency.labels("Create").observe(value)

    text = registry.render().decode()
    assert samples(text) == {
        ("app_events_total", frozenset({("method", "Create"), ("result", "ok")})): 3.0,
        ("app_events_total", frozenset({("method", "Create"), ("result", "error")})): 0.0,
        ("app_up", frozenset()): 1.0,
        # Cumulative, and `le` takes a value equal to its bound.
        ("app_seconds_bucket", frozenset({("method", "Create"), ("le", "0.1")})): 2.0,
        ("app_seconds_bucket", frozenset({("method", "Create"), ("le", "1.0")})): 3.0,
        ("app_seconds_bucket", frozenset({("method", "Create"), ("le", "+Inf")})): 4.0,
        ("app_seconds_count", frozenset({("method", "Create")})): 4.0,
        ("app_seconds_sum", frozenset({("method", "Create")})): 3.65,
    }
    assert "# TYPE app_events_total counter\n" in text
    assert "# TYPE app_seconds histogram\n" in text
    assert text.endswith("\n")


def test_an_unlabelled_family_is_there_at_zero_before_its_first_change() -> None:
    registry = Registry()
    Counter("app_reconnects", "Reconnects", (), registry)
    Histogram("app_sync_seconds", "Sync", (), registry, buckets=(1.0,))
    assert samples(registry.render().decode()) == {
        ("app_reconnects_total", frozenset()): 0.0,
        ("app_sync_seconds_bucket", frozenset({("le", "1.0")})): 0.0,
        ("app_sync_seconds_bucket", frozenset({("le", "+Inf")})): 0.0,
        ("app_sync_seconds_count", frozenset()): 0.0,
        ("app_sync_seconds_sum", frozenset()): 0.0,
    }


def test_label_values_and_help_are_escaped() -> None:
    registry = Registry()
    odd = 'a "quoted" back\\slash\nnew line'
    Gauge("app_info", 'Help with a back\\slash\nand a "quote"', ["value"], registry).labels(
        odd
    ).set(1)
    (family,) = text_string_to_metric_families(registry.render().decode())
    assert family.documentation == 'Help with a back\\slash\nand a "quote"'
    (sample,) = family.samples
    assert sample.labels == {"value": odd}


@pytest.mark.parametrize("value", [math.inf, -math.inf, 1e300, 1e-9, 123456789.0])
def test_numbers_prometheus_can_read(value: float) -> None:
    registry = Registry()
    Gauge("app_value", "A value", (), registry).set(value)
    assert samples(registry.render().decode()) == {("app_value", frozenset()): value}


def test_nan_is_written_as_nan() -> None:
    registry = Registry()
    Gauge("app_value", "A value", (), registry).set(math.nan)
    assert math.isnan(samples(registry.render().decode())[("app_value", frozenset())])


def test_collectors_are_rendered_at_each_scrape() -> None:
    registry = Registry()
    counts: dict[tuple[str, ...], int] = {("spec",): 1}
    registry.register(CountersCollector(lambda: [("app_invalid", "Invalid", ("reason",), counts)]))
    registry.register(_ModeLike())
    assert samples(registry.render().decode()) == {
        ("app_invalid_total", frozenset({("reason", "spec")})): 1.0,
        ("app_mode", frozenset({("mode", "enforce")})): 1.0,
    }
    counts[("overflow",)] = 2
    assert samples(registry.render().decode())[
        ("app_invalid_total", frozenset({("reason", "overflow")}))
    ] == (2.0)


class _ModeLike:
    def collect(self) -> list[Family]:
        return [Family("app_mode", "Mode", "gauge", ("mode",), {("enforce",): 1})]


def test_mistakes_in_use_are_refused() -> None:
    registry = Registry()
    counter = Counter("app_events", "Events", ["method"], registry)
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("a").inc(-1)
    with pytest.raises(ValueError, match="registered twice"):
        Gauge("app_events", "Again", (), registry)
    for buckets in ((), (1.0, 0.5), (1.0, 1.0), (1.0, math.inf)):
        with pytest.raises(ValueError, match="buckets must rise"):
            Histogram("app_h", "H", (), Registry(), buckets=buckets)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ok", "error"]),
            st.floats(min_value=0, max_value=5, allow_nan=False)
            | st.sampled_from([b for b in EVENT_BUCKETS]),
        ),
        max_size=60,
    )
)
def test_the_same_samples_as_prometheus_client(observations: list[tuple[str, float]]) -> None:
    """The same operations on prometheus_client's families give the same samples."""
    ours = Registry()
    theirs = prometheus_client.CollectorRegistry()
    our_count = Counter("app_events", "Events", ["result"], ours)
    our_time = Histogram("app_seconds", "Time", ["result"], ours, buckets=EVENT_BUCKETS)
    their_count = prometheus_client.Counter("app_events", "Events", ["result"], registry=theirs)
    their_time = prometheus_client.Histogram(
        "app_seconds", "Time", ["result"], buckets=EVENT_BUCKETS, registry=theirs
    )
    for result in ("ok", "error"):
        our_count.labels(result)
        our_time.labels(result)
        their_count.labels(result)
        their_time.labels(result)
    for result, seconds in observations:
        our_count.labels(result).inc()
        our_time.labels(result).observe(seconds)
        their_count.labels(result).inc()
        their_time.labels(result).observe(seconds)
    expected = samples(prometheus_client.generate_latest(theirs).decode())
    got = samples(ours.render().decode())
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key


def test_a_scrape_from_another_thread_sees_whole_histograms() -> None:
    """The loop changes families while the server's thread renders: +Inf always equals _count."""
    registry = Registry()
    latency = Histogram("app_seconds", "Latency", ["method"], registry, buckets=(0.5,))
    events = Counter("app_events", "Events", ["method"], registry)
    stop = threading.Event()
    errors: list[BaseException] = []

    def scrape() -> None:
        try:
            while not stop.is_set():
                got = samples(registry.render().decode())
                for (name, labels), value in got.items():
                    if name == "app_seconds_count":
                        inf = got[("app_seconds_bucket", labels | {("le", "+Inf")})]
                        assert inf == value
        except BaseException as exc:
            errors.append(exc)

    scraper = threading.Thread(target=scrape)
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
def test_promtool_accepts_the_plugins_page() -> None:
    """The whole page of a plugin that has served a call and a webhook's page."""
    app = App(load_startup_settings(None), name="midbatch", idx="10", config_path=None)
    call = app.metrics.observer().begin("CreateContainer", api.CreateContainerRequest())
    call.replied(api.CreateContainerResponse())
    for page in (app.metrics.registry.render(), WebhookMetrics().registry.render()):
        res = subprocess.run(
            [binary("promtool"), "check", "metrics"], input=page, capture_output=True
        )
        assert (res.returncode, res.stdout + res.stderr) == (0, b"")
