"""The webhook's server under slow clients, and its metrics, over real sockets on 127.0.0.1.

Deadlines are short here so that the tests are quick; the loops that trickle bytes are bounded
by the bytes they have to send, never by the clock.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.server import WebhookServer
from tests.admission import (
    container,
    mid_pod,
    pod,
    review,
)
from tests.factory import PRIORITY, QOS
from tests.tls import Tls, issue_tls
from tests.webhook_client import Client, read_reply, scrape

from .http_fixtures import PROMETHEUS_ACCEPT, openmetrics_families

CAP = 8


#: The per-connection deadline of the slow-client tests: long enough that a loaded machine
#: finishes an honest TLS handshake and request within it, far below the 20 s and more
#: that the trickles would take.
DEADLINE = 2.0


def serve(tls: Tls, *, timeout: float = 10.0, max_connections: int = 128) -> WebhookServer:
    webhook = WebhookServer(
        "127.0.0.1:0",
        tls.cert,
        tls.key,
        Config(),
        reload_interval=3600,
        timeout=timeout,
        max_connections=max_connections,
    )
    webhook.start()
    return webhook


def closed_by_peer(sock: socket.socket, wait: float) -> bool:
    """Whether the server closed the connection (EOF, reset, TLS error) within `wait` s.

    Never blocks past `wait`: a TLS 1.3 session ticket makes the socket readable with no data.
    """
    pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
    if not pending and not select.select([sock], [], [], wait)[0]:
        return False
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except (ssl.SSLWantReadError, BlockingIOError):
        return False
    except (ConnectionError, ssl.SSLError):
        return True
    finally:
        sock.settimeout(timeout)


def trickle(sock: socket.socket, data: bytes, every: float = 0.05) -> int:
    """Sends one byte every `every` s until the server closes; returns how many were sent."""
    sent = 0
    while sent < len(data):
        try:
            sock.sendall(data[sent : sent + 1])
        except (OSError, ssl.SSLError):
            break
        sent += 1
        if closed_by_peer(sock, every):
            break
    return sent


# ----------------------------------------------------------------------- slow clients


def test_slow_clients_at_the_cap_do_not_keep_real_reviews_out(tls: Tls) -> None:
    # A deadline far beyond the test: only fairness at the cap can let the reviews in.
    webhook = serve(tls, max_connections=CAP, timeout=120)
    slow: list[socket.socket] = []
    try:
        # TLS clients that started a request and then stall, one byte sent ...
        for _ in range(CAP):
            tls_sock = tls.client().wrap_socket(
                socket.create_connection(("127.0.0.1", webhook.port), timeout=10),
                server_hostname="localhost",
            )
            tls_sock.sendall(b"P")
            slow.append(tls_sock)
        # ... and as many silent TCP connections that never start the handshake.
        slow += [socket.create_connection(("127.0.0.1", webhook.port)) for _ in range(CAP)]
        client = Client(webhook, tls)
        for index in range(3):
            reply = client.admit("/mutate", review(mid_pod(), uid=f"uid-{index}"))
            assert reply["response"]["allowed"] is True
        assert webhook.http.open_connections <= CAP
        # The oldest slow ones were evicted for them, and counted.
        assert closed_by_peer(slow[0], 5.0)
        # Each silent one evicted a TLS one; the first review evicted a silent one.
        assert dropped(client)["evicted"] >= CAP + 1
    finally:
        for sock in slow:
            sock.close()
        webhook.stop()


def test_a_trickled_tls_handshake_is_cut_at_the_deadline(tls: Tls) -> None:
    webhook = serve(tls, timeout=DEADLINE)
    try:
        with socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as sock:
            # A TLS handshake record announcing 512 bytes, then its bytes one by one: every
            # byte arrives long before any per-read timeout, the whole would take 26 s.
            hello = b"\x16\x03\x01\x02\x00" + b"\x01" * 512
            assert trickle(sock, hello) < len(hello)
    finally:
        webhook.stop()


def test_a_trickled_request_is_cut_at_the_deadline(tls: Tls) -> None:
    webhook = serve(tls, timeout=DEADLINE)
    try:
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)
        with tls.client().wrap_socket(raw, server_hostname="localhost") as sock:
            head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 400 + b"\r\n\r\n"
            assert trickle(sock, head) < len(head)
        assert dropped(Client(webhook, tls))["deadline"] == 1
    finally:
        webhook.stop()


def test_an_idle_keep_alive_connection_is_closed_at_the_deadline(tls: Tls) -> None:
    webhook = serve(tls, timeout=DEADLINE)
    try:
        raw = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)
        with tls.client().wrap_socket(raw, server_hostname="localhost") as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_reply(sock).startswith(b"HTTP/1.1 200 ")
            # Bounded: the deadline is 2 s; anything but a close within 30 s fails.
            closed = False
            for _ in range(300):
                closed = closed_by_peer(sock, 0.1)
                if closed:
                    break
            assert closed
    finally:
        webhook.stop()


# ----------------------------------------------------------------------------- metrics


@pytest.fixture
def webhook(tls: Tls) -> Iterator[WebhookServer]:
    server = serve(tls)
    yield server
    server.stop()


def test_the_page_is_openmetrics_for_prometheus_with_the_process_families(
    webhook: WebhookServer, tls: Tls
) -> None:
    status, content_type, body = Client(webhook, tls).raw(
        "GET", "/metrics", headers={"Accept": PROMETHEUS_ACCEPT}
    )
    assert status == 200
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in openmetrics_families(body.decode())}
    assert [s.value for s in families["nri_midbatch_webhook_requests"].samples] == [0.0] * 8
    (rss,) = families["process_resident_memory_bytes"].samples
    assert rss.value > 10 * 2**20


def requests(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    return {
        f"{dict(labels)['endpoint']}/{dict(labels)['result']}": value
        for (name, labels), value in samples.items()
        if name == "nri_midbatch_webhook_requests_total"
    }


def dropped(client: Client) -> dict[str, float]:
    return {
        dict(labels)["reason"]: value
        for (name, labels), value in scrape(client).items()
        if name == "nri_midbatch_webhook_connections_dropped_total"
    }


def test_reviews_are_counted_by_endpoint_and_result(webhook: WebhookServer, tls: Tls) -> None:
    client = Client(webhook, tls)
    assert set(requests(scrape(client)).values()) == {0.0}
    no_tier = pod(container("c"))
    forbidden = pod(container("c"), labels={QOS: "BE", PRIORITY: "koord-prod"})
    client.admit("/mutate", review(mid_pod()))  # patched
    client.admit("/mutate", review(mid_pod()))
    client.admit("/mutate", review(no_tier))  # allowed
    client.admit("/validate", review(mid_pod()))  # allowed
    client.admit("/validate", review(forbidden))  # denied
    assert client.post("/validate", b"not json")[0] == 400  # error
    assert client.raw("POST", "/mutate", b"{}", {"Content-Type": "text/plain"})[0] == 415
    samples = scrape(client)
    assert requests(samples) == {
        "mutate/patched": 2,
        "mutate/allowed": 1,
        "mutate/denied": 0,
        "mutate/error": 1,
        "validate/allowed": 1,
        "validate/denied": 1,
        "validate/patched": 0,
        "validate/error": 1,
    }
    histogram = "nri_midbatch_webhook_request_duration_seconds_count"
    assert samples[(histogram, (("endpoint", "mutate"),))] == 3
    assert samples[(histogram, (("endpoint", "validate"),))] == 3


def test_certificate_reloads_are_counted(tmp_path: Path) -> None:
    first = issue_tls(tmp_path / "live")
    webhook = serve(first)
    try:
        client = Client(webhook, first)

        def reloads() -> dict[str, float]:
            return {
                dict(labels)["result"]: value
                for (name, labels), value in scrape(client).items()
                if name == "nri_midbatch_webhook_certificate_reloads_total"
            }

        assert reloads() == {"ok": 0, "failed": 0}
        second = issue_tls(tmp_path / "next")
        first.cert.write_bytes(second.cert.read_bytes())  # does not match the old key
        webhook.poll_files()
        webhook.poll_files()  # the same broken pair is not counted twice
        assert reloads() == {"ok": 0, "failed": 1}
        first.key.write_bytes(second.key.read_bytes())
        webhook.poll_files()
        client = Client(webhook, second)
        assert reloads() == {"ok": 1, "failed": 1}
    finally:
        webhook.stop()
