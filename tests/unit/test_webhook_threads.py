"""Issue 30: the webhook's review workers share the policy's caches; many clients, distinct pods.

Every review's quantities differ from every other's, so the caches miss, fill and evict all
along; they are shrunk to a few entries here so that every review evicts, and the
interpreter switches threads every microsecond (`switching_often`), so a race between the
workers shows within these few hundred containers instead of after minutes of traffic. On
the unlocked caches this answered HTTP 500 (a KeyError from `move_to_end`) and could
segfault. Bounded by work, a fixed number of reviews per client, not by the clock.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest

from nri_midbatch.config.model import Config
from nri_midbatch.policy import calculate, spec
from nri_midbatch.policy.bounded_cache import BoundedCache
from nri_midbatch.tools.webhook import admission, pods
from nri_midbatch.tools.webhook.pool import Lane, ReviewPool
from nri_midbatch.tools.webhook.server import WebhookServer
from tests.admission import container, mutated, pod, review
from tests.factory import MID_CPU, MID_MEMORY, QOS, SPEC
from tests.tls import Tls
from tests.webhook_client import Client

CLIENTS = 8
REVIEWS = 8  # per client, alternately validated and mutated
CONTAINERS = 250
#: Every cache a review goes through, and what it is shrunk to.
CACHES: tuple[BoundedCache[Any, Any], ...] = (
    pods.quantity_cache,
    admission.canonical_cache,
    spec.spec_cache,
    spec.quantity_cache,
    calculate.pod_sum_cache,
)
SHRUNK = 2


def distinct_pod(client: int, number: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A mid pod whose quantities no other pod of the test has, and the spec it derives.

    Odd values: Kubernetes writes them back as they are ("1234567m", "1234567Ki").
    """
    containers, expected = [], {}
    for index in range(CONTAINERS):
        value = 2 * ((client * REVIEWS + number) * CONTAINERS + index) + 100_001
        cpu, memory = f"{value}m", f"{value}Ki"
        resources = {MID_CPU: cpu, MID_MEMORY: memory}
        containers.append(container(f"c{index}", requests=resources, limits=resources))
        expected[f"c{index}"] = {"limits": resources, "requests": resources}
    obj = pod(*containers, priority=7500, labels={QOS: "BE"}, name=f"p{client}-{number}")
    return obj, {"containers": expected}


@pytest.fixture
def shrunk_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    for cache in CACHES:
        monkeypatch.setattr(cache, "max_entries", SHRUNK)


def test_concurrent_reviews_of_distinct_pods_are_all_answered_right(
    tls: Tls, shrunk_caches: None, switching_often: None
) -> None:
    # A budget no review reaches however slowly the switching makes it: every answer is
    # the review's own, not the over-budget one.
    pool = ReviewPool([Lane("review", CLIENTS, CLIENTS, None)], budget=300, grace=60)
    webhook = WebhookServer(
        "127.0.0.1:0", tls.cert, tls.key, Config(), reload_interval=3600, pool=pool
    )
    webhook.start()
    statuses: Counter[int] = Counter()
    wrong: list[str] = []

    def client(number: int) -> None:
        http = Client(webhook, tls)
        for turn in range(REVIEWS):
            obj, derived = distinct_pod(number, turn)
            endpoint = "/mutate" if turn % 2 else "/validate"
            status, reply = http.post(endpoint, review(obj))
            statuses[status] += 1
            if status != 200:
                wrong.append(f"{endpoint} {status}: {reply}")
            elif not reply["response"]["allowed"]:
                wrong.append(f"{endpoint} denied: {reply['response']['status']['message']}")
            elif endpoint == "/mutate":
                annotation = mutated(obj, reply)["metadata"]["annotations"][SPEC]
                if json.loads(annotation) != derived:
                    wrong.append(f"pod {obj['metadata']['name']} got another pod's spec")

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        webhook.stop()
    assert wrong == []
    assert statuses == {200: CLIENTS * REVIEWS}
    for cache in CACHES:
        costs = cache.costs()  # in the order list, which still agrees with the table
        assert len(costs) == len(cache) <= SHRUNK
        assert cache.bytes == sum(costs)
