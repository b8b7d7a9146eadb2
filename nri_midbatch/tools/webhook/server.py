"""The HTTPS server: one thread and event loop (`obs.httpd`), TLS per connection, bounded and timed.

- At most `max_connections` connections at once; a new one evicts the connection that has
  waited longest for its request, so silent or trickling clients cannot lock out the API
  server. A whole request, the TLS handshake included, must arrive within `timeout` seconds,
  however its bytes trickle in.
- Bodies need a Content-Length of at most `max_body` bytes (413 otherwise, unread).
- Reviews are decided in worker threads (`pool.ReviewPool`), never on the loop: a slow one
  delays no other. Each has a time budget, its wait for a worker included; one that spends it
  is answered as the failure policy says; with every worker taken and the waiting room full, a
  review gets 503 at once, and one not back from its worker in time 504.
- The certificate and key are re-read when their files change (cert-manager and the Secret
  volume rotate them in place), and so is the configuration file; a file that does not load
  keeps the previous one in force and is logged once per change (`reload.FileWatch`).
- POST /mutate and /validate answer AdmissionReviews; GET /healthz and /readyz serve probes
  (/readyz fails while draining, so the Service stops sending work before the server stops);
  GET /metrics serves the webhook's own Prometheus families.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config, ConfigError, load_config_file
from nri_midbatch.obs.exposition import scrape
from nri_midbatch.obs.httpd import BoundedHTTPServer, Request, Response
from nri_midbatch.obs.metrics import WebhookMetrics
from nri_midbatch.policy import Policy
from nri_midbatch.process.reload import FileWatch

from .admission import Answer, Endpoint, handle
from .budget import Budget
from .pool import Abandoned, Busy, Lane, ReviewPool

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "MAX_BODY_BYTES",
    "WebhookServer",
    "default_pool",
    "load_tls_context",
]

DEFAULT_ADDRESS = "0.0.0.0:9443"
#: The API server's own request body limit (3 MiB); a Pod review is far smaller.
MAX_BODY_BYTES = 3 * 1024 * 1024
#: For a whole request, TLS handshake included, and for an idle keep-alive connection to send
#: its next one. The API server gives a webhook timeoutSeconds (5 in the examples) for the
#: whole call, so a real review never comes near it.
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_RELOAD_INTERVAL = 10.0
#: Seconds a review may take, its wait for a worker included. The examples give the API
#: server's call timeoutSeconds: 5; the answer must be back well within it.
REVIEW_BUDGET = 2.0
#: After the budget, how long the loop still waits for a worker's own over-budget answer
#: (admission checks the budget per container; a step between checks, such as parsing a
#: 3 MiB body, is not interrupted) before it answers 504 without it.
REVIEW_GRACE = 1.0
#: Workers for bodies up to REVIEW_BODY_BYTES (a pod of a few hundred containers; a real
#: pod is a few KiB), and reviews that may wait for one.
REVIEW_BODY_BYTES = 64 * 1024
REVIEW_WORKERS, REVIEW_WAITING = 4, 16
#: Bodies up to LARGE_BODY_BYTES have workers of their own: however many arrive just under
#: the large line, they take none of the normal lane's slots, and run two at a time.
LARGE_BODY_BYTES = 256 * 1024
WIDE_WORKERS, WIDE_WAITING = 2, 2
#: Larger bodies have a worker of their own: they never hold up the others, and the memory
#: a large review parses into (about twenty times its body) is held by one at a time.
LARGE_WORKERS, LARGE_WAITING = 1, 2
_ENDPOINTS: dict[str, Endpoint] = {"/mutate": "mutate", "/validate": "validate"}

log = structlog.get_logger("nri_midbatch.tools.webhook")


def load_tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the certificate chain and key from PEM files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


class _Watched:
    """Files loaded together; reloaded when any changes, the old state kept if that fails."""

    def __init__(self, what: str, paths: tuple[Path, ...], load: Callable[[], None]) -> None:
        self.what = what
        self.paths = paths
        self._load = load
        self._watch = FileWatch(*paths, settle=False)

    def poll(self) -> bool | None:
        """True when reloaded, False when a change did not load, None when nothing changed."""
        if not self._watch.changed():
            return None
        try:
            self._load()
        except Exception as error:  # any loader error keeps the old state
            log.error(
                f"{self.what} changed but does not load; keeping the previous one",
                error=str(error),
                files=[str(p) for p in self.paths],
            )
            return False
        log.info(f"{self.what} reloaded", files=[str(p) for p in self.paths])
        return True


def default_pool(clock: Callable[[], float] = time.monotonic) -> ReviewPool:
    return ReviewPool(
        [
            Lane("review", REVIEW_WORKERS, REVIEW_WAITING, REVIEW_BODY_BYTES),
            Lane("wide-review", WIDE_WORKERS, WIDE_WAITING, LARGE_BODY_BYTES),
            Lane("large-review", LARGE_WORKERS, LARGE_WAITING, None),
        ],
        budget=REVIEW_BUDGET,
        grace=REVIEW_GRACE,
        clock=clock,
    )


class WebhookServer:
    def __init__(
        self,
        address: str,
        cert: str | Path,
        key: str | Path,
        config: Config,
        *,
        config_path: str | Path | None = None,
        max_body: int = MAX_BODY_BYTES,
        timeout: float = DEFAULT_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        reload_interval: float = DEFAULT_RELOAD_INTERVAL,
        pool: ReviewPool | None = None,
    ) -> None:
        self.max_body = max_body
        self.timeout = timeout
        self.reload_interval = reload_interval
        self.tls_context = load_tls_context(cert, key)
        self.policy: Policy = compile_policy(config)
        self.metrics = WebhookMetrics()
        self.pool = default_pool() if pool is None else pool
        self.draining = False
        self._stopping = threading.Event()
        self._certificate = _Watched(
            "TLS certificate", (Path(cert), Path(key)), lambda: self._load_tls(cert, key)
        )
        self._watched = [self._certificate]
        if config_path is not None:
            path = Path(config_path)
            self._watched.append(
                _Watched("configuration", (path,), lambda: self._load_config(path))
            )
        self.http = BoundedHTTPServer(
            address,
            self._handle,
            name="webhook-http",
            max_connections=max_connections,
            deadline=timeout,
            max_body=max_body,
            tls=lambda: self.tls_context,
            server_header="nri-midbatch-webhook",
            on_drop=lambda reason: self.metrics.dropped.labels(reason).inc(),
        )
        self._reload_thread = threading.Thread(
            target=self._watch, name="webhook-reload", daemon=True
        )

    @property
    def port(self) -> int:
        return self.http.port

    def start(self) -> None:
        self.http.start()
        self._reload_thread.start()
        log.info("webhook serving", port=self.port)

    def drain(self) -> None:
        """Fail readiness from now on, keep answering reviews."""
        self.draining = True

    def stop(self) -> None:
        self._stopping.set()
        self.http.stop()
        self.pool.shutdown()
        if self._reload_thread.is_alive():
            self._reload_thread.join(timeout=5)

    def poll_files(self) -> None:
        for watched in self._watched:
            reloaded = watched.poll()
            if watched is self._certificate and reloaded is not None:
                self.metrics.certificate_reloads.labels("ok" if reloaded else "failed").inc()

    def _watch(self) -> None:
        while not self._stopping.wait(self.reload_interval):
            self.poll_files()

    def _load_tls(self, cert: str | Path, key: str | Path) -> None:
        self.tls_context = load_tls_context(cert, key)

    def _load_config(self, path: Path) -> None:
        try:
            config = load_config_file(path)
        except ConfigError as error:
            raise ValueError(str(error)) from None
        self.policy = compile_policy(config)

    @staticmethod
    def _decide(policy: Policy, endpoint: Endpoint, body: bytes, budget: Budget) -> Answer:
        """In a worker."""
        try:
            return handle(body, endpoint, policy, budget)
        except Exception:  # handle() never raises; this keeps a bug from dropping the call
            log.exception("admission handler failed", endpoint=endpoint)
            return Answer(500, {"error": "internal error"})

    def _record(self, endpoint: Endpoint, answer: Answer, elapsed: float) -> None:
        """On the loop (the metrics are not shared between threads): count and log."""
        self.metrics.review_duration.labels(endpoint).observe(elapsed)
        self.metrics.reviews.labels(endpoint, _result(answer)).inc()
        if answer.over_budget:
            self.metrics.shed.labels(endpoint, "over_budget").inc()
        if answer.status != 500:
            _log_answer(endpoint, answer, elapsed)

    async def _review(self, endpoint: Endpoint, body: bytes) -> Response:
        policy = self.policy  # the one in force when the review arrived, whatever reloads
        # The duration includes the wait for a worker: the API server waits for it too.
        started = time.perf_counter()
        try:
            answer = await self.pool.run(
                len(body), lambda budget: self._decide(policy, endpoint, body, budget)
            )
        except (Busy, Abandoned) as shed:
            busy = isinstance(shed, Busy)
            self.metrics.shed.labels(endpoint, "busy" if busy else "abandoned").inc()
            self.metrics.reviews.labels(endpoint, "error").inc()
            log.warning(
                "review not answered: " + ("every worker busy" if busy else "over its deadline"),
                endpoint=endpoint,
                reason=str(shed),
                body_bytes=len(body),
            )
            # The API server applies the webhook's failure policy to either.
            return Response.text(503 if busy else 504, str(shed))
        self._record(endpoint, answer, time.perf_counter() - started)
        return Response(answer.status, json.dumps(answer.body).encode(), "application/json")

    def _handle(self, request: Request) -> Response | Coroutine[Any, Any, Response]:
        if request.method == "POST":
            endpoint = _ENDPOINTS.get(request.path)
            if endpoint is None:
                return Response.text(404, "not found")
            media = (request.headers.get("content-type") or "application/json").split(";")[0]
            if media.strip().lower() != "application/json":
                self.metrics.reviews.labels(endpoint, "error").inc()
                return Response.text(415, "Content-Type must be application/json")
            return self._review(endpoint, request.body)
        if request.method != "GET":
            return Response.text(405, "only GET and POST are served")
        if request.path == "/healthz":
            return Response.text(200, "ok")
        if request.path == "/readyz":
            return Response.text(503, "draining") if self.draining else Response.text(200, "ok")
        if request.path == "/metrics":
            body, content_type = scrape(self.metrics.registry, request.headers.get("accept"))
            return Response(200, body, content_type)
        return Response.text(404, "not found")


def _result(answer: Answer) -> str:
    verdict = answer.verdict
    if verdict is None:
        return "error"
    if not verdict.allowed:
        return "denied"
    return "patched" if verdict.patch else "allowed"


def _log_answer(endpoint: Endpoint, answer: Answer, seconds: float) -> None:
    fields: dict[str, Any] = {
        "endpoint": endpoint,
        "uid": answer.uid,
        "duration_ms": round(seconds * 1000, 3),
    }
    verdict = answer.verdict
    if verdict is None:
        log.warning("bad admission request", status=answer.status, error=answer.error, **fields)
        return
    fields.update(
        operation=answer.operation,
        namespace=answer.namespace,
        pod=answer.name,
        tier=verdict.tier,
        allowed=verdict.allowed,
        patch_ops=len(verdict.patch),
    )
    if not verdict.allowed:
        log.info("pod denied", reason=verdict.message, **fields)
    elif verdict.patch:
        log.info("pod mutated", **fields)
    else:
        log.debug("pod admitted", **fields)
