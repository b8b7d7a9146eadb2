"""Prometheus metrics of one plugin process, on a registry of its own.

The families are prometheus_client's, so a scrape also has what operators expect of any
Python exporter: the process's memory, CPU, open files and start time (`process_*`), the
garbage collector's counts (`python_gc_*`) and `python_info`, from the library's own
collectors. The text of a scrape is `obs.exposition`'s.

Hot-path code does not touch metric objects: the rooms keep plain counts, which the
App gathers into families when scraped (process/metrics.py). The series here are fed
by the App's session observer (process/session_watch.py): per-call latency and results
cost one clock read and one histogram observation per call.
"""

from __future__ import annotations

import platform

import prometheus_client
from prometheus_client import (
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.registry import Collector, CollectorRegistry

from nri_midbatch import __version__

# The library adds a `<name>_created` series to every counter and histogram; our families
# never had one, and the page keeps its series (docs/metrics.md). Process-wide, as the
# library keeps it; nothing else in the process uses prometheus_client.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: Fine steps where handlers normally finish, then steps up to the runtime's
#: default 2 s request timeout, so a scrape shows how close calls come to it.
EVENT_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 1.5, 2.0,
)  # fmt: skip


#: The pod and container events that carry decisions; StateChange delivers the pod
#: events on runtimes before NRI v0.12.
EVENT_METHODS = ("RunPodSandbox", "CreateContainer", "UpdateContainer", "StateChange")


def new_registry() -> CollectorRegistry:
    """A registry with the library's process, garbage collector and platform collectors."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


def build_info(registry: CollectorRegistry) -> None:
    build = Gauge(
        "nri_midbatch_build_info", "Build information", ["version", "python"], registry=registry
    )
    build.labels(__version__, platform.python_version()).set(1)


#: Why the HTTP server ended a connection early (obs.httpd's on_drop).
DROP_REASONS = ("evicted", "refused", "deadline", "bad_request")


def connections_dropped(name: str, registry: CollectorRegistry) -> Counter:
    counter = Counter(
        name,
        "Connections ended by the server's bounds: evicted at the cap for a newer one, refused "
        "at the cap, past the request deadline, or a bad request",
        ["reason"],
        registry=registry,
    )
    for reason in DROP_REASONS:
        counter.labels(reason)
    return counter


class Metrics:
    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.events = Counter(
            "nri_midbatch_events", "NRI requests handled", ["method", "result"], registry=r
        )
        self.event_duration = Histogram(
            "nri_midbatch_event_duration_seconds",
            "Time to answer an NRI request (the runtime drops plugins at its request timeout)",
            ["method"],
            registry=r,
            buckets=EVENT_BUCKETS,
        )
        # Present at 0 from the start, so that rate() and increase() see the first calls
        # (a series born at its first call hides that call from them).
        for method in EVENT_METHODS:
            self.event_duration.labels(method)
            for result in ("ok", "error"):
                self.events.labels(method, result)
        self.registered = Gauge(
            "nri_midbatch_registered", "1 while registered and configured by a runtime", registry=r
        )
        self.synchronized = Gauge(
            "nri_midbatch_synchronized", "1 once Synchronize has completed", registry=r
        )
        self.reconnects = Counter(
            "nri_midbatch_reconnects", "Connection attempts after the first", registry=r
        )
        self.sync_objects = Gauge(
            "nri_midbatch_synchronize_objects",
            "Pods and containers in the last Synchronize",
            ["kind"],
            registry=r,
        )
        self.sync_duration = Histogram(
            "nri_midbatch_synchronize_duration_seconds",
            "Time from a Synchronize's first chunk to the reply to its last",
            (),
            registry=r,
            buckets=EVENT_BUCKETS,
        )
        self.http_dropped = connections_dropped("nri_midbatch_http_connections_dropped", r)
        # The rooms' counts (reloads among them) are gathered by process/metrics.py.
        build_info(r)

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)


#: The API server waits timeoutSeconds (at most 30 s, 5 s in the examples) for a review.
WEBHOOK_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


class WebhookMetrics:
    """The admission webhook's families, on a registry of its own (it is another process)."""

    def __init__(self) -> None:
        self.registry = new_registry()
        r = self.registry
        self.reviews = Counter(
            "nri_midbatch_webhook_requests",
            "AdmissionReviews answered, by endpoint and result",
            ["endpoint", "result"],
            registry=r,
        )
        self.review_duration = Histogram(
            "nri_midbatch_webhook_request_duration_seconds",
            "Time to decide an AdmissionReview, from its body read to its answer ready",
            ["endpoint"],
            registry=r,
            buckets=WEBHOOK_BUCKETS,
        )
        self.shed = Counter(
            "nri_midbatch_webhook_requests_shed",
            "AdmissionReviews not decided in full: over_budget (answered as the failure policy "
            "says), busy (503, every worker taken), abandoned (504, no answer by the deadline)",
            ["endpoint", "reason"],
            registry=r,
        )
        self.certificate_reloads = Counter(
            "nri_midbatch_webhook_certificate_reloads",
            "Changed TLS certificate and key files: loaded (ok) or kept the previous (failed)",
            ["result"],
            registry=r,
        )
        for endpoint in ("mutate", "validate"):
            self.review_duration.labels(endpoint)
            for result in ("allowed", "denied", "patched", "error"):
                self.reviews.labels(endpoint, result)
            for reason in ("over_budget", "busy", "abandoned"):
                self.shed.labels(endpoint, reason)
        for result in ("ok", "failed"):
            self.certificate_reloads.labels(result)
        self.dropped = connections_dropped("nri_midbatch_webhook_connections_dropped", r)
        build_info(r)
