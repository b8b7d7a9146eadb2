"""Pods as the API server hands them to the admission webhook, the AdmissionReviews around
them, and the patches the webhook answers with, applied by the `jsonpatch` library.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import jsonpatch

from tests.factory import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY, QOS

POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}


def container(
    name: str,
    requests: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "image": "busybox"}
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = dict(requests)
    if limits:
        resources["limits"] = dict(limits)
    if resources:
        entry["resources"] = resources
    return entry


def pod(
    *containers: dict[str, Any],
    priority: int | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    name: str = "p",
    namespace: str = "default",
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels is not None:
        metadata["labels"] = dict(labels)
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"containers": list(containers) or [container("main")]}
    if priority is not None:
        spec["priority"] = priority
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _name_of(obj: Any) -> str:
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) else ""


def review(
    obj: Any,
    *,
    operation: str = "CREATE",
    old: Any = None,
    uid: str = "0b5c1d1e-7a3c-4e7f-9e1d-000000000001",
    namespace: str = "default",
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": POD_KIND,
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": POD_KIND,
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": _name_of(obj),
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "tester"},
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def mid_pod(**extra: Any) -> dict[str, Any]:
    """The issue's mid pod: priority 7500, QoS BE, mid-cpu 2k limit and 1k (written 1000)
    request, 1Gi memory; a sidecar without tier resources; a helper with limits only."""
    return pod(
        container(
            "main",
            requests={MID_CPU: "1000", MID_MEMORY: "1Gi"},
            limits={MID_CPU: "2k", MID_MEMORY: "1Gi"},
        ),
        container("sidecar", requests={"cpu": "0"}),
        container("helper", limits={MID_CPU: "1500", MID_MEMORY: "512Mi"}),
        priority=7500,
        labels={QOS: "BE", "app": "train"},
        name="mid",
        **extra,
    )


def mid_pod_of(count: int, cpu_limit: str = "2k") -> dict[str, Any]:
    containers = [
        container(
            f"c{n}",
            requests={MID_CPU: "1k", MID_MEMORY: "1Gi"},
            limits={MID_CPU: cpu_limit, MID_MEMORY: "1Gi"},
        )
        for n in range(count)
    ]
    return pod(*containers, priority=7500, labels={QOS: "BE"}, name="wide")


MID_SPEC = (
    '{"containers":{'
    '"helper":{"limits":{"kubernetes.io/mid-cpu":"1500","kubernetes.io/mid-memory":"512Mi"},'
    '"requests":{"kubernetes.io/mid-cpu":"1500","kubernetes.io/mid-memory":"512Mi"}},'
    '"main":{"limits":{"kubernetes.io/mid-cpu":"2k","kubernetes.io/mid-memory":"1Gi"},'
    '"requests":{"kubernetes.io/mid-cpu":"1k","kubernetes.io/mid-memory":"1Gi"}}}}'
)


def batch_pod(**extra: Any) -> dict[str, Any]:
    return pod(
        container(
            "job",
            requests={BATCH_CPU: "1500", BATCH_MEMORY: "2048Mi"},
            limits={BATCH_CPU: "3000", BATCH_MEMORY: "4Gi"},
        ),
        priority=5500,
        labels={QOS: "BE"},
        annotations={"team": "etl"},
        name="batch",
        **extra,
    )


BATCH_SPEC = (
    '{"containers":{"job":{'
    '"limits":{"kubernetes.io/batch-cpu":"3k","kubernetes.io/batch-memory":"4Gi"},'
    '"requests":{"kubernetes.io/batch-cpu":"1500","kubernetes.io/batch-memory":"2Gi"}}}}'
)


def patch_of(reply: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    response = reply["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert isinstance(ops, list)
    return ops


def mutated(obj: dict[str, Any], reply: Mapping[str, Any]) -> dict[str, Any]:
    ops = patch_of(reply)
    return obj if ops is None else jsonpatch.apply_patch(obj, ops)
