"""Issue 24: one slow review never delays another, over real HTTPS on 127.0.0.1.

A review is held "in progress" by its budget's clock: the pool's clock, read in the worker at
each check, blocks a large review's worker until the test releases it. Events synchronise;
nothing sleeps.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.pool import ReviewPool
from nri_midbatch.tools.webhook.server import WebhookServer
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
    """A clock that holds each large-lane worker at its first reading until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def clock(self) -> float:
        if threading.current_thread().name.startswith("webhook-large-review"):
            self.entered.set()
            # A bound so a failing test ends; the test releases long before.
            assert self.released.wait(30), "the test never released the large review"
        return 0.0


def serve(
    tls: Tls, gate: Gate, *, budget: float = 60.0, grace: float = 60.0, large_waiting: int = 2
) -> WebhookServer:
    pool = ReviewPool(
        workers=2,
        waiting=4,
        large_workers=1,
        large_waiting=large_waiting,
        large_body=LARGE_BODY,
        budget=budget,
        grace=grace,
        clock=gate.clock,
    )
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
        workers=1,
        waiting=0,
        large_workers=1,
        large_waiting=0,
        large_body=LARGE_BODY,
        budget=1.0,
        grace=60.0,
        clock=lambda: float(next(ticks)),
    )
    webhook = WebhookServer(
        "127.0.0.1:0", tls.cert, tls.key, Config(), reload_interval=3600, pool=pool
    )
    webhook.start()
    client = Client(webhook, tls)
    try:
        denied = client.admit("/validate", review(mid_pod()))["response"]
        assert (denied["allowed"], denied["status"]["code"]) == (False, 504)
        admitted = client.admit("/mutate", review(mid_pod()))["response"]
        assert admitted["allowed"] is True and "patch" not in admitted
        assert shed(client) == {"mutate/over_budget": 1.0, "validate/over_budget": 1.0}
    finally:
        webhook.stop()
