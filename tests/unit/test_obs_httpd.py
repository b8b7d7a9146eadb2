"""The bounded HTTP server itself: what its users (health, webhook) rely on beyond the bounds."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from nri_midbatch.obs.httpd import BoundedHTTPServer, Request, Response

BIG = b"x" * (4 * 1024 * 1024)  # far over the transport's 64 KiB high-water mark


def answer(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("a handler bug")
    return Response(200, BIG, "application/octet-stream")


@pytest.fixture
def server() -> Iterator[BoundedHTTPServer]:
    http = BoundedHTTPServer(
        "127.0.0.1:0", answer, name="test-http", max_connections=4, deadline=30, max_body=0
    )
    http.start()
    yield http
    http.stop()


def test_a_large_answer_arrives_whole_before_the_connection_closes(
    server: BoundedHTTPServer,
) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.port}/", headers={"Connection": "close"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.read() == BIG


def test_a_handler_error_is_a_500_and_the_server_goes_on(server: BoundedHTTPServer) -> None:
    with pytest.raises(urllib.error.HTTPError) as failed:
        urllib.request.urlopen(f"http://127.0.0.1:{server.port}/boom", timeout=30)
    assert failed.value.code == 500
    failed.value.close()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=30) as reply:
        assert len(reply.read()) == len(BIG)


def test_an_awaitable_answer_is_awaited_while_other_requests_are_served() -> None:
    """A handler with slow work returns an awaitable; the loop serves others meanwhile."""
    opened = asyncio.Event()  # the server's loop is the only one that touches it
    entered = threading.Event()

    async def held() -> Response:
        entered.set()
        await opened.wait()
        return Response.text(200, "held, then answered")

    def handler(request: Request) -> Response | Coroutine[Any, Any, Response]:
        if request.path == "/held":
            return held()
        opened.set()
        return Response.text(200, "opened")

    http = BoundedHTTPServer(
        "127.0.0.1:0", handler, name="test-http", max_connections=4, deadline=30, max_body=0
    )
    http.start()
    executor = ThreadPoolExecutor(1)
    try:
        url = f"http://127.0.0.1:{http.port}"
        waiting = executor.submit(lambda: urllib.request.urlopen(f"{url}/held", timeout=30).read())
        assert entered.wait(30)
        # /held can only be answered once /open is: the loop must not be blocked by it.
        with urllib.request.urlopen(f"{url}/open", timeout=30) as reply:
            assert reply.read() == b"opened\n"
        assert waiting.result(30) == b"held, then answered\n"
    finally:
        executor.shutdown()
        http.stop()
