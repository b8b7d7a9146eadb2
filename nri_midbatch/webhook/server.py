"""The HTTPS server: stdlib http.server in threads, TLS per connection, bounded and timed.

- Each accepted connection gets a thread (at most `max_connections` at once; more are closed
  at once). The TLS handshake runs in that thread, under the connection timeout, so a slow or
  silent client never holds up accept().
- Bodies need a Content-Length of at most `max_body` bytes (413 otherwise, unread).
- The certificate and key are re-read when their files change (cert-manager and the Secret
  volume rotate them in place), and so is the configuration file; a file that does not load
  keeps the previous one in force and is logged once per change.
- POST /mutate and /validate answer AdmissionReviews; GET /healthz and /readyz serve probes
  (/readyz fails while draining, so the Service stops sending work before the server stops).
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import structlog

from nri_midbatch.config import Config, ConfigError, load_config_file
from nri_midbatch.obs.health import parse_address
from nri_midbatch.policy import Policy, compile_policy

from .admission import Answer, Endpoint, handle

__all__ = [
    "DEFAULT_ADDRESS",
    "DEFAULT_TIMEOUT",
    "MAX_BODY_BYTES",
    "WebhookServer",
    "load_tls_context",
]

DEFAULT_ADDRESS = "0.0.0.0:9443"
#: The API server's own request body limit (3 MiB); a Pod review is far smaller.
MAX_BODY_BYTES = 3 * 1024 * 1024
#: Per socket operation: the TLS handshake, reading a request, idle keep-alive. The API
#: server gives a webhook timeoutSeconds (5 in the examples) for the whole call.
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_RELOAD_INTERVAL = 10.0
_ENDPOINTS: dict[str, Endpoint] = {"/mutate": "mutate", "/validate": "validate"}

log = structlog.get_logger("nri_midbatch.webhook")

Signature = tuple[tuple[int, int, int] | None, ...]


def load_tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server context: TLS 1.2 or newer, the certificate chain and key from PEM files."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(cert), str(key))
    return context


def _signature(paths: tuple[Path, ...]) -> Signature:
    result: list[tuple[int, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows the ..data symlink a mounted volume swaps
        except OSError:
            result.append(None)
        else:
            result.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(result)


class _Watched:
    """Files loaded together; reloaded when any changes, retried until a load succeeds."""

    def __init__(self, what: str, paths: tuple[Path, ...], load: Callable[[], None]) -> None:
        self.what = what
        self.paths = paths
        self._load = load
        self._loaded = _signature(paths)
        self._failed: Signature | None = None

    def poll(self) -> bool:
        current = _signature(self.paths)
        if current == self._loaded or None in current:
            return False
        try:
            self._load()
        except Exception as error:  # any loader error keeps the old state
            if current != self._failed:
                log.error(
                    f"{self.what} changed but does not load; keeping the previous one",
                    error=str(error),
                    files=[str(p) for p in self.paths],
                )
            self._failed = current
            return False
        self._loaded, self._failed = current, None
        log.info(f"{self.what} reloaded", files=[str(p) for p in self.paths])
        return True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        owner: WebhookServer,
        family: socket.AddressFamily,
    ) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.owner._slots.acquire(blocking=False):
            log.warning("too many connections; closing one", client=str(client_address[0]))
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.owner._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(self.owner.timeout)
        try:
            # The handshake runs here, in this connection's thread, under the timeout.
            tls = self.owner.tls_context.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as error:  # ssl.SSLError and timeouts are OSErrors
            log.debug("TLS handshake failed", client=str(client_address[0]), error=str(error))
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        except OSError as error:  # the peer went away or timed out mid-request
            log.debug("connection ended", client=str(client_address[0]), error=str(error))
        finally:
            tls.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("unexpected error serving a connection", client=str(client_address[0]))


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
    ) -> None:
        self.max_body = max_body
        self.timeout = timeout
        self.reload_interval = reload_interval
        self.tls_context = load_tls_context(cert, key)
        self.policy: Policy = compile_policy(config)
        self.draining = False
        self._slots = threading.BoundedSemaphore(max_connections)
        self._stopping = threading.Event()
        self._watched = [
            _Watched("TLS certificate", (Path(cert), Path(key)), lambda: self._load_tls(cert, key))
        ]
        if config_path is not None:
            path = Path(config_path)
            self._watched.append(
                _Watched("configuration", (path,), lambda: self._load_config(path))
            )
        host, port = parse_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = _HTTPServer((host, port), _handler(self), self, family)
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="webhook-http", daemon=True),
            threading.Thread(target=self._watch, name="webhook-reload", daemon=True),
        ]

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        log.info("webhook serving", port=self.port)

    def drain(self) -> None:
        """Fail readiness from now on, keep answering reviews."""
        self.draining = True

    def stop(self) -> None:
        self._stopping.set()
        if self._threads[0].is_alive():  # shutdown() waits for a serve_forever that runs
            self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)

    def poll_files(self) -> None:
        for watched in self._watched:
            watched.poll()

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

    def answer(self, endpoint: Endpoint, body: bytes) -> Answer:
        started = time.perf_counter()
        try:
            answer = handle(body, endpoint, self.policy)
        except Exception:  # handle() never raises; this keeps a bug from dropping the call
            log.exception("admission handler failed", endpoint=endpoint)
            return Answer(500, {"error": "internal error"})
        _log_answer(endpoint, answer, time.perf_counter() - started)
        return answer


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


def _handler(server: WebhookServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the API server reuses connections
        timeout = server.timeout
        server_version = "nri-midbatch-webhook"
        sys_version = ""

        def do_POST(self) -> None:
            endpoint = _ENDPOINTS.get(self.path.split("?", 1)[0])
            if endpoint is None:
                self._plain(404, "not found")
                return
            if self.headers.get("Transfer-Encoding"):
                self._plain(411, "send the body with a Content-Length", close=True)
                return
            raw_length = self.headers.get("Content-Length")
            if raw_length is None:
                self._plain(411, "Content-Length is required", close=True)
                return
            if not raw_length.strip().isdigit():
                self._plain(400, "Content-Length is not a number", close=True)
                return
            length = int(raw_length)
            if length > server.max_body:
                # Not read: the connection closes instead.
                self._plain(413, f"body over {server.max_body} bytes", close=True)
                return
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                return
            media = (self.headers.get("Content-Type") or "application/json").split(";")[0]
            if media.strip().lower() != "application/json":
                self._plain(415, "Content-Type must be application/json")
                return
            answer = server.answer(endpoint, body)
            self._send(answer.status, json.dumps(answer.body).encode(), "application/json")

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._plain(200, "ok")
            elif path == "/readyz":
                if server.draining:
                    self._plain(503, "draining")
                else:
                    self._plain(200, "ok")
            else:
                self._plain(404, "not found")

        def _plain(self, status: int, text: str, close: bool = False) -> None:
            if close:
                self.close_connection = True
            self._send(status, (text + "\n").encode(), "text/plain; charset=utf-8")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # every review is logged by WebhookServer.answer; probes are not worth it

    return Handler
