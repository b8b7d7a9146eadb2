"""The HTTP endpoint for Prometheus and kubelet probes.

It runs on a loop in a thread of its own (`obs.httpd`), not on the plugin's event loop: a
wedged loop must make `/healthz` fail with a reason, which a server on that same loop could
never answer. The loop proves it is alive by updating a heartbeat.

The DaemonSet binds it on all interfaces, so it is bounded like any server facing a network:
at most `MAX_CONNECTIONS` connections (the oldest waiting one is evicted for a new one), a
whole request within `REQUEST_DEADLINE` seconds, a request head of at most 16 KiB and no body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nri_midbatch.obs.exposition import scrape
from nri_midbatch.obs.httpd import BoundedHTTPServer, Request, Response, parse_address
from nri_midbatch.obs.metrics import Metrics

__all__ = [
    "DEFAULT_STALL_AFTER",
    "MAX_CONNECTIONS",
    "REQUEST_DEADLINE",
    "HealthServer",
    "Readiness",
    "parse_address",
]

HEARTBEAT_INTERVAL = 1.0
#: A loop that has not run for this long is wedged: the runtime would already
#: have dropped us after its 2 s request timeout.
DEFAULT_STALL_AFTER = 10.0
#: Prometheus and kubelet's two probes need a handful; the rest is room for a second scraper.
MAX_CONNECTIONS = 16
#: For a whole request, and for an idle keep-alive connection to send its next one.
REQUEST_DEADLINE = 10.0

Readiness = Callable[[], tuple[bool, str]]


class HealthServer:
    def __init__(
        self,
        address: str,
        metrics: Metrics,
        readiness: Readiness,
        *,
        stall_after: float = DEFAULT_STALL_AFTER,
        max_connections: int = MAX_CONNECTIONS,
        deadline: float = REQUEST_DEADLINE,
    ) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._stall_after = stall_after
        # Beat well within stall_after, or an idle loop would look stalled.
        self._interval = min(HEARTBEAT_INTERVAL, stall_after / 4)
        self._beat = time.monotonic()
        self.http = BoundedHTTPServer(
            address,
            self._handle,
            name="nri-midbatch-http",
            max_connections=max_connections,
            deadline=deadline,
            max_body=0,
            on_drop=lambda reason: metrics.http_dropped.labels(reason).inc(),
        )

    @property
    def port(self) -> int:
        return self.http.port

    def start(self) -> None:
        self.http.start()

    def stop(self) -> None:
        self.http.stop()

    async def heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self._interval)

    def _health(self) -> tuple[int, str]:
        stalled = time.monotonic() - self._beat
        if stalled > self._stall_after:
            return 500, f"event loop stalled for {stalled:.1f}s"
        return 200, "ok"

    def _ready(self) -> tuple[int, str]:
        ready, reason = self._readiness()
        return (200, "ok") if ready else (503, reason)

    def _handle(self, request: Request) -> Response:
        if request.method != "GET":
            return Response.text(405, "only GET is served")
        if request.path == "/metrics":
            body, content_type = scrape(self._metrics.registry, request.headers.get("accept"))
            return Response(200, body, content_type)
        if request.path == "/healthz":
            return Response.text(*self._health())
        if request.path == "/readyz":
            return Response.text(*self._ready())
        return Response.text(404, "not found")
