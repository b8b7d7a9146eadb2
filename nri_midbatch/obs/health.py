"""The HTTP endpoint for Prometheus and kubelet probes.

It runs in a thread of its own, not on the event loop: a wedged loop must make
`/healthz` fail with a reason, which a server on that same loop could never
answer. The loop proves it is alive by updating a heartbeat.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import generate_latest

from nri_midbatch.obs.metrics import Metrics

HEARTBEAT_INTERVAL = 1.0
#: A loop that has not run for this long is wedged: the runtime would already
#: have dropped us after its 2 s request timeout.
DEFAULT_STALL_AFTER = 10.0
#: What `generate_latest` writes. Not prometheus_client's CONTENT_TYPE_LATEST,
#: which names text format 1.0.0 since 0.22 while the body stays 0.0.4.
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Readiness = Callable[[], tuple[bool, str]]


def parse_address(address: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port` or `:port` (all interfaces)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r} must be HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class HealthServer:
    def __init__(
        self,
        address: str,
        metrics: Metrics,
        readiness: Readiness,
        *,
        stall_after: float = DEFAULT_STALL_AFTER,
    ) -> None:
        self._metrics = metrics
        self._readiness = readiness
        self._stall_after = stall_after
        # Beat well within stall_after, or an idle loop would look stalled.
        self._interval = min(HEARTBEAT_INTERVAL, stall_after / 4)
        self._beat = time.monotonic()
        host, port = parse_address(address)
        server_type = _Server6 if ":" in host else _Server
        self._server = server_type((host, port), self._handler())
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="nri-midbatch-http", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    async def heartbeat(self) -> None:
        while True:
            self._beat = time.monotonic()
            await asyncio.sleep(self._interval)

    def _health(self) -> tuple[int, str]:
        stalled = time.monotonic() - self._beat
        if stalled > self._stall_after:
            return 500, f"event loop stalled for {stalled:.1f}s\n"
        return 200, "ok\n"

    def _ready(self) -> tuple[int, str]:
        ready, reason = self._readiness()
        return (200, "ok\n") if ready else (503, f"{reason}\n")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(server._metrics.registry), METRICS_CONTENT_TYPE)
                elif path == "/healthz":
                    status, text = server._health()
                    self._send(status, text.encode(), "text/plain; charset=utf-8")
                elif path == "/readyz":
                    status, text = server._ready()
                    self._send(status, text.encode(), "text/plain; charset=utf-8")
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the plugin's own log

        return Handler
