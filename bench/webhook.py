"""Admission latency of the webhook's decision (`admission.handle`), in this process.

Mid pods of 1, 10 and 100 containers, each reviewed `reviews` times by /mutate and by
/validate; then the largest pod whose AdmissionReview fits the body limit (3 MiB), once by
each. Every container has its own quantities, so the quantity caches help no more than a
pod author who varies them would let them.
"""

from __future__ import annotations

import json
import time
from typing import Any

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.admission import Endpoint, handle
from nri_midbatch.tools.webhook.server import MAX_BODY_BYTES

SIZES = (1, 10, 100)
ENDPOINTS: tuple[Endpoint, ...] = ("mutate", "validate")
MID_CPU, MID_MEMORY = "kubernetes.io/mid-cpu", "kubernetes.io/mid-memory"


def review_body(containers: int) -> bytes:
    """A CREATE review of a mid pod (priority 7500, QoS BE) with `containers` containers."""
    spec = [
        {
            "name": f"c{n}",
            "image": "busybox",
            "resources": {
                "requests": {MID_CPU: f"{1000 + n}m", MID_MEMORY: f"{1 + n}Mi"},
                "limits": {MID_CPU: f"{2000 + n}m", MID_MEMORY: f"{1 + n}Mi"},
            },
        }
        for n in range(containers)
    ]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "wide",
            "namespace": "default",
            "labels": {"koordinator.sh/qosClass": "BE"},
        },
        "spec": {"priority": 7500, "containers": spec},
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "default",
            "operation": "CREATE",
            "object": pod,
        },
    }
    return json.dumps(review, separators=(",", ":")).encode()


def largest_admitted() -> tuple[int, bytes]:
    """The most containers whose review is within MAX_BODY_BYTES, and that review."""
    low, high = 1, 2
    while len(review_body(high)) <= MAX_BODY_BYTES:
        low, high = high, high * 2
    while high - low > 1:  # len(review_body(low)) fits, high's does not
        middle = (low + high) // 2
        if len(review_body(middle)) <= MAX_BODY_BYTES:
            low = middle
        else:
            high = middle
    return low, review_body(low)


def timed(body: bytes, endpoint: Endpoint, policy: Any) -> float:
    started = time.perf_counter()
    answer = handle(body, endpoint, policy)
    elapsed = time.perf_counter() - started
    if answer.verdict is None or not answer.verdict.allowed or answer.over_budget:
        raise AssertionError(f"the benchmark pod must be admitted: {answer.body}")
    return elapsed


def admission(reviews: int) -> dict[str, Any]:
    """{"sizes": {containers: {endpoint: [seconds, ...]}}, "largest": {...}}."""
    policy = compile_policy(Config())
    sizes: dict[int, dict[str, list[float]]] = {}
    for containers in SIZES:
        body = review_body(containers)
        sizes[containers] = {
            endpoint: [timed(body, endpoint, policy) for _ in range(reviews)]
            for endpoint in ENDPOINTS
        }
    count, body = largest_admitted()
    largest: dict[str, float] = {"containers": count, "body_bytes": len(body)}
    for endpoint in ENDPOINTS:
        largest[endpoint] = timed(body, endpoint, policy)
    return {"sizes": sizes, "largest": largest}
