"""The metrics and probe endpoint, queried over real HTTP from other threads.

Operability §8: readiness only after Configure and Synchronize; liveness fails, with the reason,
when the event loop is wedged. The server runs in its own thread precisely so that a wedged loop
can still be reported, so the wedge here is a real blocking call on the loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.client import HTTPConnection

import pytest
from prometheus_client.parser import text_string_to_metric_families

from nri_midbatch import __version__
from nri_midbatch.obs.health import HealthServer, parse_address
from nri_midbatch.obs.httpd import MAX_HEAD_BYTES
from nri_midbatch.obs.metrics import Metrics

from .http_fixtures import PROMETHEUS_ACCEPT, http_get, openmetrics_families
from .nri_fixtures import STEP_TIMEOUT, run

STALL_AFTER = 0.5


def stop_in_background(server: HealthServer) -> None:
    # stop() joins the server's thread; no test needs to wait for it.
    threading.Thread(target=server.stop, daemon=True).start()


class Readiness:
    def __init__(self) -> None:
        self.ready = False
        self.reason = "registered, waiting for Synchronize"

    def __call__(self) -> tuple[bool, str]:
        return self.ready, self.reason


# One server for the module's plain HTTP tests.
_READINESS = Readiness()


@pytest.fixture(scope="module")
def _shared() -> Iterator[HealthServer]:
    health = HealthServer("127.0.0.1:0", Metrics(), _READINESS, stall_after=STALL_AFTER)
    health.start()
    yield health
    stop_in_background(health)


@pytest.fixture
def readiness() -> Readiness:
    _READINESS.ready, _READINESS.reason = Readiness().ready, Readiness().reason
    return _READINESS


@pytest.fixture
def server(_shared: HealthServer, readiness: Readiness) -> HealthServer:
    return _shared


def url(server: HealthServer, path: str) -> str:
    return f"http://127.0.0.1:{server.port}{path}"


# ---------------------------------------------------------------------------
# /healthz
# ---------------------------------------------------------------------------


def test_healthz_stays_ok_while_the_loop_beats(server: HealthServer) -> None:
    async def scenario() -> list[tuple[int, str]]:
        beat = asyncio.create_task(server.heartbeat())
        seen: list[tuple[int, str]] = []
        try:
            # Longer than stall_after: an idle but healthy loop must never look stalled,
            # whatever stall_after is set to.
            end = time.monotonic() + 2 * STALL_AFTER
            while time.monotonic() < end or len(seen) <= 5:
                status, _, body = await asyncio.to_thread(http_get, url(server, "/healthz"))
                seen.append((status, body))
                await asyncio.sleep(0.05)
        finally:
            beat.cancel()
        return seen

    seen = run(scenario())
    assert len(seen) > 5
    assert set(seen) == {(200, "ok\n")}


def test_healthz_fails_with_the_stall_while_the_loop_is_wedged(server: HealthServer) -> None:
    probe = url(server, "/healthz")
    during: list[tuple[float, tuple[int, str, str]]] = []
    wedged = threading.Event()
    seen_stalled = threading.Event()

    def probe_during_the_wedge() -> None:
        # Probe until the stall shows, at whatever pace the machine allows: a stall is the
        # heartbeat's age passing stall_after, which no event announces.
        wedged.wait(timeout=STEP_TIMEOUT)
        give_up = time.monotonic() + STEP_TIMEOUT
        answer = http_get(probe)
        while answer[0] == 200 and time.monotonic() < give_up:
            time.sleep(0.05)
            answer = http_get(probe)
        during.append((time.monotonic(), answer))
        seen_stalled.set()

    async def scenario() -> tuple[float, tuple[int, str, str]]:
        beat = asyncio.create_task(server.heartbeat())
        try:
            await asyncio.sleep(0.05)
            probed = time.monotonic()
            before = await asyncio.to_thread(http_get, probe)
            assert before[0] == 200

            async def wedge() -> None:
                wedged.set()
                # Blocks the loop itself, as a stuck handler would, until the prober saw it.
                seen_stalled.wait(timeout=2 * STEP_TIMEOUT)

            prober = threading.Thread(target=probe_during_the_wedge)
            prober.start()
            await asyncio.create_task(wedge())
            await asyncio.to_thread(prober.join, STEP_TIMEOUT)

            # The loop runs again: the heartbeat catches up and health comes back, as the
            # server thread's clock judges it (asked again until it does).
            async with asyncio.timeout(STEP_TIMEOUT):
                after = await asyncio.to_thread(http_get, probe)
                while after[0] != 200:
                    await asyncio.sleep(0.02)
                    after = await asyncio.to_thread(http_get, probe)
            return probed, after
        finally:
            beat.cancel()

    probed, after = run(scenario())
    ((answered, answer),) = during
    status, content_type, body = answer
    assert status == 500
    assert content_type.startswith("text/plain")
    assert "event loop stalled for" in body
    match = re.search(r"stalled for ([0-9.]+)s", body)
    assert match is not None
    # The stall reported is past stall_after, and it is this wedge's: the loop had
    # beaten at most stall_after before `before` was answered healthy. (0.05: the
    # body rounds to a tenth.)
    reported = float(match.group(1))
    assert STALL_AFTER - 0.05 <= reported <= answered - probed + STALL_AFTER + 0.05
    assert after[0] == 200 and after[2] == "ok\n"


# ---------------------------------------------------------------------------
# /readyz, unknown paths, /metrics
# ---------------------------------------------------------------------------


def test_readyz_gives_the_reason_then_ok_when_ready(
    server: HealthServer, readiness: Readiness
) -> None:
    status, _, body = http_get(url(server, "/readyz"))
    assert (status, body) == (503, "registered, waiting for Synchronize\n")

    readiness.reason = "not registered with a runtime"
    assert http_get(url(server, "/readyz"))[::2] == (503, "not registered with a runtime\n")

    readiness.ready = True
    assert http_get(url(server, "/readyz"))[::2] == (200, "ok\n")
    # A query string does not change the path a probe asks for.
    assert http_get(url(server, "/readyz?verbose=1"))[0] == 200

    readiness.ready = False
    assert http_get(url(server, "/readyz"))[0] == 503


@pytest.mark.parametrize("path", ["/", "/metricsx", "/healthz/extra", "/ready"])
def test_unknown_paths_are_404(server: HealthServer, path: str) -> None:
    status, _, body = http_get(url(server, path))
    assert status == 404
    assert body == "not found\n"


def test_metrics_are_prometheus_text_with_build_info(server: HealthServer) -> None:
    status, content_type, body = http_get(url(server, "/metrics"))
    assert status == 200
    # The text format generate_latest writes: scrapers pick their parser by this header.
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(body)}
    (sample,) = families["nri_midbatch_build_info"].samples
    assert sample.value == 1
    assert sample.labels["version"] == __version__
    assert sample.labels["python"]


def test_metrics_are_openmetrics_for_prometheus(server: HealthServer) -> None:
    status, content_type, body = http_get(
        url(server, "/metrics"), headers={"Accept": PROMETHEUS_ACCEPT}
    )
    assert status == 200
    assert content_type.startswith("application/openmetrics-text; version=1.0.0")
    families = {f.name: f for f in openmetrics_families(body)}
    assert families["nri_midbatch_build_info"].samples[0].value == 1
    (rss,) = families["process_resident_memory_bytes"].samples
    assert rss.value > 10 * 2**20


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_serves_on_an_ipv6_address(readiness: Readiness) -> None:
    # parse_address (and so --metrics-address) accepts [v6]:port; the server must bind it.
    health = HealthServer("[::1]:0", Metrics(), readiness)
    health.start()
    try:
        assert http_get(f"http://[::1]:{health.port}/readyz")[0] == 503
    finally:
        stop_in_background(health)


# ---------------------------------------------------------------------------
# Bounds: connections, deadline, request size
# ---------------------------------------------------------------------------

IDLE_CLIENTS = 100  # far over the cap; the old threaded server spent a thread and fd on each


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def closed_by_peer(sock: socket.socket, wait: float) -> bool:
    """Whether the server has closed the connection (EOF or reset) within `wait` seconds."""
    readable, _, _ = select.select([sock], [], [], wait)
    if not readable:
        return False
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def dropped(exposition: str) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name == "nri_midbatch_http_connections_dropped"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_idle_connections_beyond_the_cap_cost_no_thread_and_lock_out_no_one(
    readiness: Readiness,
) -> None:
    # No heartbeat runs here: a long stall_after keeps /healthz about the connections.
    health = HealthServer("127.0.0.1:0", Metrics(), readiness, stall_after=3600)
    health.start()
    threads, fds = threading.active_count(), open_fds()
    idle = [socket.create_connection(("127.0.0.1", health.port)) for _ in range(IDLE_CLIENTS)]
    try:
        # A real client gets its answers while every idle connection is still open (they never
        # reach the deadline here: the newest connection evicts the oldest idle one).
        assert http_get(url(health, "/healthz"), timeout=10)[0::2] == (200, "ok\n")
        status, _, body = http_get(url(health, "/metrics"), timeout=10)
        assert status == 200
        assert "nri_midbatch_build_info" in body
        assert threading.active_count() <= threads
        server_fds = open_fds() - fds - len(idle)
        assert server_fds <= health.http.max_connections
        # The evicted ones were closed, oldest first; the newest are still being waited for.
        assert closed_by_peer(idle[0], 5.0)
        assert not closed_by_peer(idle[-1], 0.0)
        assert dropped(body)["evicted"] >= IDLE_CLIENTS - health.http.max_connections
    finally:
        for sock in idle:
            sock.close()
        stop_in_background(health)


_CHILD = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from nri_midbatch.obs.health import HealthServer
from nri_midbatch.obs.metrics import Metrics
health = HealthServer("127.0.0.1:0", Metrics(), lambda: (True, ""), stall_after=3600)
health.start()
print(health.port, flush=True)
sys.stdin.readline()
files = [open(os.devnull) for _ in range(100)]  # as many as a burst of cgroup writes
print(len(files), flush=True)
"""


def test_a_thousand_idle_connections_leave_a_256_fd_process_its_files() -> None:
    """The issue's case: under a 256-fd limit, idle connections took every descriptor."""
    limit = 1000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < limit + 200:
        pytest.skip(f"the test needs {limit + 200} file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, limit + 200), hard))
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    idle: list[socket.socket] = []
    try:
        assert child.stdout is not None and child.stdin is not None
        port = int(child.stdout.readline())
        for _ in range(limit):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        assert http_get(f"http://127.0.0.1:{port}/healthz", timeout=10)[0::2] == (200, "ok\n")
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "100"
    finally:
        for sock in idle:
            sock.close()
        child.kill()
        child.wait()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_trickled_request_is_cut_at_the_deadline(readiness: Readiness) -> None:
    health = HealthServer("127.0.0.1:0", Metrics(), readiness, deadline=0.5)
    health.start()
    request = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    sent = 0
    try:
        with socket.create_connection(("127.0.0.1", health.port)) as sock:
            # One byte every 50 ms: each arrives well within any per-read timeout, and the
            # whole request would take 11 s. Bounded: the loop ends when the bytes do.
            while sent < len(request):
                try:
                    sock.sendall(request[sent : sent + 1])
                except OSError:
                    break
                sent += 1
                if closed_by_peer(sock, 0.05):
                    break
        assert sent < len(request)
        assert dropped(http_get(url(health, "/metrics"))[2])["deadline"] == 1
    finally:
        stop_in_background(health)


def test_requests_over_the_size_bounds_are_refused(server: HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 1))
        assert sock.recv(4096).startswith(b"HTTP/1.1 431 ")
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 413 ")


def test_keep_alive_serves_many_requests_on_one_connection(server: HealthServer) -> None:
    connection = HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for _ in range(3):
            connection.request("GET", "/metrics")
            reply = connection.getresponse()
            assert reply.status == 200
            assert b"nri_midbatch_build_info" in reply.read()
    finally:
        connection.close()


# ---------------------------------------------------------------------------
# parse_address
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("[::]:9464", ("::", 9464)),
        (":9464", ("0.0.0.0", 9464)),
        ("localhost:0", ("localhost", 0)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_parse_address(address: str, expected: tuple[str, int]) -> None:
    assert parse_address(address) == expected


@pytest.mark.parametrize(
    "address",
    [
        "",
        "9464",
        "127.0.0.1",
        "127.0.0.1:",
        "127.0.0.1:http",
        "127.0.0.1:65536",
        "127.0.0.1:-1",
        "127.0.0.1: 9464",
        "[::1]",
    ],
)
def test_parse_address_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(address)
