"""One scrape's body and Content-Type, as the scraper asked for them.

The families and their text are prometheus_client's: the text format 0.0.4 by default,
OpenMetrics 1.0 for a scraper whose `Accept` asks for `application/openmetrics-text` (as
Prometheus does), negotiated by the library's own `choose_encoder`.

The families are changed on the plugin's loop and rendered on the metrics server's thread.
What the library guarantees there: every value (a counter, a gauge, each histogram bucket and
sum) is a float behind a lock of its own, and a histogram's `_count` is the sum of the bucket
values it has just read, so its `+Inf` bucket and `_count` always agree. A scrape may see one
observation's bucket and not yet its sum; Prometheus's rate() of either does not mind. The
plugin's own collectors (process/metrics.py) copy plain counts at the scrape and need no
lock.
"""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry

__all__ = ["scrape"]


def scrape(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The page of every family in `registry`, and its Content-Type, for an `Accept` header."""
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type
