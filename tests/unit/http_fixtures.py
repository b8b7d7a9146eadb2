"""Plain HTTP requests for the tests of the health and metrics endpoints."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser

#: Upper bound for one request: a hang fails the test instead of blocking it. Generous,
#: as a loaded 2-core machine may be slow to answer; a passing test never waits for it.
REQUEST_TIMEOUT = 10.0
#: What Prometheus 2.x sends when it scrapes: OpenMetrics first, text 0.0.4 as a fallback.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def http_get(
    url: str, timeout: float = REQUEST_TIMEOUT, headers: Mapping[str, str] | None = None
) -> tuple[int, str, str]:
    """(status, Content-Type, body) for any status, 5xx and 404 included."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode()


def openmetrics_families(text: str) -> Iterator[Metric]:
    """The families of an OpenMetrics page, by prometheus_client's strict parser."""
    parse = openmetrics_parser.text_string_to_metric_families
    families: Iterator[Metric] = parse(text)  # type: ignore[no-untyped-call]
    return families
