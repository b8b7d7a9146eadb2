"""Issue 24: one slow review never delays another, over real HTTPS on 127.0.0.1.

A review is held "in progress" by its budget's clock: the pool's clock, read in the worker at
each check, blocks a large review's worker until the test releases it. Events synchronise;
nothing sleeps.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.pool import Lane, ReviewPool
from nri_midbatch.tools.webhook.server import (
    LARGE_BODY_BYTES,
    REVIEW_BODY_BYTES,
    WIDE_WAITING,
    WIDE_WORKERS,
    WebhookServer,
    default_pool,
)
from tests.admission import (
    mid_pod,
    mid_pod_of,
    mutated,
    review,
)
from tests.factory import PRIORITY, SPEC
from tests.tls import Tls
from tests.webhook_client import Client, scrape

#: A body larger than this takes the large lane; the wide pod below is far over it.
LARGE_BODY = 64 * 1024
#: The wide pod: 1,000 containers, a body of about 200 KB.
WIDE = 1_000


class Gate:
    """A clock that holds each worker of one lane at its first reading until released."""

    def __init__(self, lane: str = "large-review") -> None:
        self.lane = lane
        self.entered = threading.Event()
        self.released = threading.Event()

    def clock(self) -> float:
        if threading.current_thread().name.startswith(f"webhook-{self.lane}"):
            self.entered.set()
            # A bound so a failing test ends; the test releases long before.
            assert self.released.wait(30), "the test never released the large review"
        return 0.0


def serve(
    tls: Tls, gate: Gate, *, budget: float = 60.0, grace: float = 60.0, large_waiting: int = 2
) -> WebhookServer:
    pool = ReviewPool(
        [Lane("review", 2, 4, LARGE_BODY), Lane("large-review", 1, large_waiting, None)],
        budget=budget,
        grace=grace,
        clock=gate.clock,
    )
    return serve_pool(tls, pool)


def serve_pool(tls: Tls, pool: ReviewPool) -> WebhookServer:
    webhook = WebhookServer(
        "127.0.0.1:0", tls.cert, tls.key, Config(), reload_interval=3600, pool=pool
    )
    webhook.start()
    return webhook


@pytest.fixture
def gate() -> Iterator[Gate]:
    gate = Gate()
    yield gate
    gate.released.set()


def in_background(call: Callable[[], Any]) -> tuple[ThreadPoolExecutor, Future[Any]]:
    executor = ThreadPoolExecutor(1)
    return executor, executor.submit(call)


def shed(client: Client) -> dict[str, float]:
    return {
        f"{dict(labels)['endpoint']}/{dict(labels)['reason']}": value
        for (name, labels), value in scrape(client).items()
        if name == "nri_midbatch_webhook_requests_shed_total" and value
    }


def test_a_normal_review_is_answered_while_a_huge_one_is_in_progress(tls: Tls, gate: Gate) -> None:
    webhook = serve(tls, gate)
    client = Client(webhook, tls)
    wide = mid_pod_of(WIDE)
    assert len(json.dumps(review(wide))) > LARGE_BODY
    executor, huge = in_background(lambda: client.admit("/mutate", review(wide, uid="huge")))
    try:
        assert gate.entered.wait(30)
        # The huge review is held in its worker; a normal one is answered in full meanwhile.
        normal = mid_pod()
        reply = client.admit("/mutate", review(normal, uid="normal"))
        assert mutated(normal, reply)["metadata"]["labels"][PRIORITY] == "koord-mid"
        assert not huge.done()
        gate.released.set()
        annotation = mutated(wide, huge.result(30))["metadata"]["annotations"][SPEC]
        assert len(json.loads(annotation)["containers"]) == WIDE
    finally:
        gate.released.set()
        executor.shutdown()
        webhook.stop()


def test_large_reviews_past_their_lanes_bound_get_503_at_once(tls: Tls, gate: Gate) -> None:
    webhook = serve(tls, gate, large_waiting=0)
    client = Client(webhook, tls)
    wide = review(mid_pod_of(WIDE), uid="held")
    executor, held = in_background(lambda: client.admit("/validate", wide))
    try:
        assert gate.entered.wait(30)
        status, _, text = client.raw(
            "POST", "/validate", json.dumps(wide).encode(), {"Content-Type": "application/json"}
        )
        assert (status, text) == (503, b"1 large-review reviews in progress or waiting\n")
        # The normal lane is not affected.
        assert client.admit("/validate", review(mid_pod()))["response"]["allowed"] is True
        gate.released.set()
        assert held.result(30)["response"]["allowed"] is True
        assert shed(client) == {"validate/busy": 1.0}
    finally:
        gate.released.set()
        executor.shutdown()
        webhook.stop()


def test_a_review_not_back_by_its_deadline_gets_504_and_keeps_its_worker(
    tls: Tls, gate: Gate
) -> None:
    # The held worker cannot check its budget: the loop answers at budget + grace.
    webhook = serve(tls, gate, budget=0.2, grace=0.0, large_waiting=0)
    client = Client(webhook, tls)
    wide = json.dumps(review(mid_pod_of(WIDE))).encode()
    headers = {"Content-Type": "application/json"}
    try:
        status, _, text = client.raw("POST", "/validate", wide, headers)
        assert status == 504
        assert text == b"no answer within the 0.2 s budget and 0 s grace\n"
        # Its worker is still held, so its lane is full until it returns.
        assert client.raw("POST", "/validate", wide, headers)[0] == 503
        assert shed(client) == {"validate/abandoned": 1.0, "validate/busy": 1.0}
    finally:
        gate.released.set()
        webhook.stop()


def test_a_review_over_budget_is_answered_as_the_failure_policy_says(tls: Tls) -> None:
    # A clock one second later at every reading: every review runs out at its first check.
    ticks = iter(range(1_000_000))
    pool = ReviewPool(
        [Lane("review", 1, 0, LARGE_BODY), Lane("large-review", 1, 0, None)],
        budget=1.0,
        grace=60.0,
        clock=lambda: float(next(ticks)),
    )
    webhook = serve_pool(tls, pool)
    client = Client(webhook, tls)
    try:
        denied = client.admit("/validate", review(mid_pod()))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 504)
        admitted = client.admit("/mutate", review(mid_pod()))["response"]
        assert admitted["allowed"] is True and "patch" not in admitted
        assert shed(client) == {"mutate/over_budget": 1.0, "validate/over_budget": 1.0}
    finally:
        webhook.stop()


# -- the default lanes (issue 30) ----------------------------------------------------------


def test_each_body_takes_the_lane_of_its_size_class() -> None:
    pool = default_pool()
    try:
        assert [pool.lane(size).name for size in (0, REVIEW_BODY_BYTES)] == ["review"] * 2
        wide = (REVIEW_BODY_BYTES + 1, LARGE_BODY_BYTES)
        assert [pool.lane(size).name for size in wide] == ["wide-review"] * 2
        assert pool.lane(LARGE_BODY_BYTES + 1).name == "large-review"
    finally:
        pool.shutdown()


def until(condition: Callable[[], bool]) -> None:
    """Waits (bounded) for something another thread does."""
    for _ in range(3000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("the condition never held")


def test_reviews_just_under_the_large_line_leave_normal_reviews_their_lane(tls: Tls) -> None:
    """24 connections posting 251 KiB reviews took the normal lane's 20 slots: normal
    reviews got 503 (4 of 13) or waited 3.5 s. Now such reviews have 2 workers and 2 places
    of their own: the rest get 503 at once, and a normal review is answered meanwhile.
    """
    gate = Gate("wide-review")
    webhook = serve_pool(tls, default_pool(gate.clock))
    client = Client(webhook, tls)
    document = json.dumps(review(mid_pod_of(WIDE))).encode()
    body = document + b" " * (LARGE_BODY_BYTES - 5 * 1024 - len(document))
    headers = {"Content-Type": "application/json"}
    held = WIDE_WORKERS + WIDE_WAITING
    executor = ThreadPoolExecutor(held)
    try:
        wide = [
            executor.submit(lambda: client.raw("POST", "/validate", body, headers)[0])
            for _ in range(held)
        ]
        assert gate.entered.wait(30)
        until(lambda: webhook.pool.lane(len(body)).taken == held)
        status, _, text = client.raw("POST", "/validate", body, headers)
        assert (status, text) == (
            503,
            f"{held} wide-review reviews in progress or waiting\n".encode(),
        )
        normal = client.admit("/validate", review(mid_pod()))["response"]
        assert normal["allowed"] is True
        assert not any(future.done() for future in wide)
        gate.released.set()
        assert [future.result(60) for future in wide] == [200] * held
    finally:
        gate.released.set()
        executor.shutdown()
        webhook.stop()
