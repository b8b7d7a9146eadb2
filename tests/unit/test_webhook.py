"""The admission webhook over real HTTPS: a certificate made here, AdmissionReviews posted
to the running server, patches applied with the `jsonpatch` library and verdicts asserted.

Issue #7: mutation writes the priority-class label and the extended-resource spec annotation
(every container's batch and mid resources, canonical quantities); validation rejects what
the tiers cannot serve; malformed input gets 400 or a denial with the reason, uid echoed.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator, Mapping
from http.client import HTTPSConnection
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from nri_midbatch.config.model import Config
from nri_midbatch.tools.webhook.server import WebhookServer
from tests.admission import (
    BATCH_SPEC,
    MID_SPEC,
    batch_pod,
    container,
    mid_pod,
    mutated,
    patch_of,
    pod,
    review,
)
from tests.factory import BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY, PRIORITY, QOS, SPEC
from tests.tls import Tls, issue_tls
from tests.webhook_client import Client, read_reply

# ------------------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def server(tls: Tls) -> Iterator[WebhookServer]:
    webhook = WebhookServer("127.0.0.1:0", tls.cert, tls.key, Config(), reload_interval=3600)
    webhook.start()
    yield webhook
    webhook.stop()


@pytest.fixture
def client(server: WebhookServer, tls: Tls) -> Client:
    return Client(server, tls)


# ------------------------------------------------------------------------------- mutation


def test_mid_pod_gets_the_label_and_every_containers_mid_resources(client: Client) -> None:
    obj = mid_pod()
    reply = client.admit("/mutate", review(obj))
    assert reply["response"]["allowed"] is True
    assert patch_of(reply) == [
        {
            "op": "add",
            "path": "/metadata/labels/koordinator.sh~1priority-class",
            "value": "koord-mid",
        },
        {"op": "add", "path": "/metadata/annotations", "value": {SPEC: MID_SPEC}},
    ]
    after = mutated(copy.deepcopy(obj), reply)
    assert after["metadata"]["labels"] == {QOS: "BE", "app": "train", PRIORITY: "koord-mid"}
    spec = json.loads(after["metadata"]["annotations"][SPEC])
    # Canonical quantities: "1000" -> "1k", "2k" stays; the sidecar is left out; the helper's
    # limit-only resources get the limit as request.
    assert spec == {
        "containers": {
            "main": {
                "requests": {MID_CPU: "1k", MID_MEMORY: "1Gi"},
                "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"},
            },
            "helper": {
                "requests": {MID_CPU: "1500", MID_MEMORY: "512Mi"},
                "limits": {MID_CPU: "1500", MID_MEMORY: "512Mi"},
            },
        }
    }
    # The pod spec itself is not touched.
    assert after["spec"] == obj["spec"]


def test_batch_pod_gets_the_label_and_batch_resources_beside_other_annotations(
    client: Client,
) -> None:
    obj = batch_pod()
    reply = client.admit("/mutate", review(obj))
    assert patch_of(reply) == [
        {
            "op": "add",
            "path": "/metadata/labels/koordinator.sh~1priority-class",
            "value": "koord-batch",
        },
        {
            "op": "add",
            "path": "/metadata/annotations/node.koordinator.sh~1extended-resource-spec",
            "value": BATCH_SPEC,
        },
    ]
    after = mutated(obj, reply)
    assert after["metadata"]["annotations"] == {"team": "etl", SPEC: BATCH_SPEC}
    assert after["metadata"]["labels"][PRIORITY] == "koord-batch"


def test_free_priority_joins_the_batch_tier(client: Client) -> None:
    obj = batch_pod()
    obj["spec"]["priority"] = 3999
    after = mutated(obj, client.admit("/mutate", review(obj)))
    assert after["metadata"]["labels"][PRIORITY] == "koord-free"
    assert after["metadata"]["annotations"][SPEC] == BATCH_SPEC


def test_null_labels_count_as_none(client: Client) -> None:
    obj = pod(container("c", limits={MID_CPU: "500"}), priority=7000)
    obj["metadata"]["labels"] = None
    # No QoS label: the mid tier (BE, LS) does not take the pod.
    assert patch_of(client.admit("/mutate", review(obj))) is None
    obj["metadata"]["labels"] = {QOS: "LS"}
    after = mutated(obj, client.admit("/mutate", review(obj)))
    assert after["metadata"]["labels"] == {QOS: "LS", PRIORITY: "koord-mid"}
    assert json.loads(after["metadata"]["annotations"][SPEC]) == {
        "containers": {"c": {"requests": {MID_CPU: "500"}, "limits": {MID_CPU: "500"}}}
    }


@pytest.mark.parametrize(
    "obj",
    [
        pod(container("c", limits={"cpu": "1"}), priority=9500, labels={QOS: "LS"}),
        pod(container("c"), priority=9000, labels={QOS: "LSR"}),
        pod(container("c"), labels={QOS: "BE"}),  # no priority at all
        pod(container("c"), priority=0, labels={QOS: "BE"}),  # outside every range
        pod(container("c"), priority=6500, labels={QOS: "BE"}),
        pod(container("c", limits={BATCH_CPU: "1k"}), priority=5000, labels={QOS: "LS"}),
        pod(container("c", limits={MID_CPU: "1k"}), priority=7100, labels={QOS: "LSE"}),
    ],
    ids=[
        "prod-LS",
        "prod-LSR",
        "no-priority",
        "priority-0",
        "between-ranges",
        "batch-LS",
        "mid-LSE",
    ],
)
def test_pods_in_no_tier_pass_untouched(client: Client, obj: dict[str, Any]) -> None:
    reply = client.admit("/mutate", review(obj))
    assert reply["response"]["allowed"] is True
    assert set(reply["response"]) == {"uid", "allowed"}


def test_mutating_a_mutated_pod_yields_no_patch(client: Client) -> None:
    for obj in (mid_pod(), batch_pod()):
        once = mutated(obj, client.admit("/mutate", review(obj)))
        again = client.admit("/mutate", review(once))
        assert again["response"] == {"uid": again["response"]["uid"], "allowed": True}


def test_the_priority_class_label_wins_over_spec_priority(client: Client) -> None:
    # spec.priority says mid, the label says batch: batch it is, label kept as is.
    obj = pod(
        container("c", requests={BATCH_CPU: "500"}, limits={BATCH_CPU: "1k", MID_CPU: "1k"}),
        priority=7500,
        labels={QOS: "BE", PRIORITY: "koord-batch"},
    )
    ops = patch_of(client.admit("/mutate", review(obj)))
    assert ops == [
        {
            "op": "add",
            "path": "/metadata/annotations",
            "value": {
                SPEC: '{"containers":{"c":{"limits":{"kubernetes.io/batch-cpu":"1k",'
                '"kubernetes.io/mid-cpu":"1k"},"requests":{"kubernetes.io/batch-cpu":"500",'
                '"kubernetes.io/mid-cpu":"1k"}}}}'
            },
        }
    ]
    # And the other way round: spec.priority batch, label mid.
    obj = mid_pod()
    obj["spec"]["priority"] = 5500
    obj["metadata"]["labels"][PRIORITY] = "koord-mid"
    after = mutated(obj, client.admit("/mutate", review(obj)))
    assert after["metadata"]["labels"][PRIORITY] == "koord-mid"
    assert after["metadata"]["annotations"][SPEC] == MID_SPEC


def test_an_unknown_priority_label_means_no_tier_and_a_warning(client: Client) -> None:
    obj = mid_pod()
    obj["metadata"]["labels"][PRIORITY] = "koord-medium"
    reply = client.admit("/mutate", review(obj))
    assert patch_of(reply) is None
    assert reply["response"]["warnings"] == [
        "label koordinator.sh/priority-class='koord-medium' is not a Koordinator priority "
        "class: the pod is in no tier"
    ]


def test_a_stale_annotation_is_rewritten_from_the_spec(client: Client) -> None:
    stale = json.dumps(
        {"containers": {"main": {"limits": {MID_CPU: "64k"}}, "gone": {"limits": {MID_CPU: "1"}}}}
    )
    obj = mid_pod(annotations={SPEC: stale})
    reply = client.admit("/mutate", review(obj))
    ops = patch_of(reply)
    assert ops is not None
    assert ops[-1] == {
        "op": "replace",
        "path": "/metadata/annotations/node.koordinator.sh~1extended-resource-spec",
        "value": MID_SPEC,
    }
    assert mutated(obj, reply)["metadata"]["annotations"][SPEC] == MID_SPEC


def test_an_equal_annotation_in_other_spelling_is_left_alone(client: Client) -> None:
    # Same JSON document, other whitespace and key order: no patch.
    obj = batch_pod()
    obj["metadata"]["labels"][PRIORITY] = "koord-batch"
    obj["metadata"]["annotations"][SPEC] = json.dumps(json.loads(BATCH_SPEC), indent=2)
    assert patch_of(client.admit("/mutate", review(obj))) is None
    # Same values, non-canonical quantity strings ("3000" for "3k"): rewritten canonically.
    obj["metadata"]["annotations"][SPEC] = BATCH_SPEC.replace('"3k"', '"3000"')
    ops = patch_of(client.admit("/mutate", review(obj)))
    assert ops == [
        {
            "op": "replace",
            "path": "/metadata/annotations/node.koordinator.sh~1extended-resource-spec",
            "value": BATCH_SPEC,
        }
    ]


def test_a_tier_pod_without_tier_resources_loses_a_hand_written_spec(client: Client) -> None:
    hand_written = '{"containers":{"main":{"limits":{"kubernetes.io/mid-cpu":"8k"}}}}'
    obj = pod(
        container("main", requests={"cpu": "1"}),
        priority=7500,
        labels={QOS: "LS"},
        annotations={SPEC: hand_written},
    )
    reply = client.admit("/mutate", review(obj))
    assert patch_of(reply) == [
        {
            "op": "add",
            "path": "/metadata/labels/koordinator.sh~1priority-class",
            "value": "koord-mid",
        },
        {
            "op": "remove",
            "path": "/metadata/annotations/node.koordinator.sh~1extended-resource-spec",
        },
    ]
    assert reply["response"]["warnings"] == [
        "koord-mid pod requests none of kubernetes.io/mid-cpu, kubernetes.io/mid-memory: "
        "its cgroups stay as kubelet sets them"
    ]
    # An annotation that already says "no spec" ({} as Koordinator writes it) stays.
    obj["metadata"]["annotations"][SPEC] = "{}"
    obj["metadata"]["labels"][PRIORITY] = "koord-mid"
    assert patch_of(client.admit("/mutate", review(obj))) is None


def test_update_is_never_mutated(client: Client) -> None:
    obj = mid_pod()
    reply = client.admit("/mutate", review(obj, operation="UPDATE", old=obj))
    assert reply["response"] == {"uid": reply["response"]["uid"], "allowed": True}


def test_a_namespace_from_the_request_fills_a_pod_without_one(client: Client) -> None:
    obj = mid_pod()
    del obj["metadata"]["namespace"]
    reply = client.admit("/mutate", review(obj, namespace="ml"))
    assert mutated(obj, reply)["metadata"]["annotations"][SPEC] == MID_SPEC


# ------------------------------------------------------------------------------ validation


def deny_message(client: Client, document: Mapping[str, Any]) -> str:
    reply = client.admit("/validate", document)
    response = reply["response"]
    assert response["allowed"] is False, response
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    message = response["status"]["message"]
    assert isinstance(message, str)
    return message


@pytest.mark.parametrize(
    ("priority", "qos", "message"),
    [
        (
            9500,
            "BE",
            "priority class koord-prod cannot run with QoS class BE: best-effort QoS would "
            "let a production pod be suppressed and evicted",
        ),
        (
            7500,
            "LSR",
            "priority class koord-mid cannot run with QoS class LSR: QoS LSR reserves "
            "dedicated CPUs, which only koord-prod pods may hold",
        ),
        (
            5500,
            "LSE",
            "priority class koord-batch cannot run with QoS class LSE: QoS LSE reserves "
            "dedicated CPUs, which only koord-prod pods may hold",
        ),
        (
            3500,
            "LSR",
            "priority class koord-free cannot run with QoS class LSR: QoS LSR reserves "
            "dedicated CPUs, which only koord-prod pods may hold",
        ),
    ],
)
def test_forbidden_priority_and_qos_combinations_are_rejected(
    client: Client, priority: int, qos: str, message: str
) -> None:
    assert deny_message(client, review(pod(priority=priority, labels={QOS: qos}))) == message


def test_the_label_decides_the_priority_for_validation_too(client: Client) -> None:
    obj = pod(priority=7500, labels={QOS: "BE", PRIORITY: "koord-prod"})
    assert deny_message(client, review(obj)).startswith(
        "priority class koord-prod cannot run with QoS class BE"
    )


def test_batch_resources_without_qos_be_are_rejected(client: Client) -> None:
    obj = pod(container("c", limits={BATCH_CPU: "1k"}), priority=5500, labels={QOS: "LS"})
    assert deny_message(client, review(obj)) == (
        "resources kubernetes.io/batch-cpu (tier batch) need QoS class BE in label "
        "koordinator.sh/qosClass, but the pod's QoS class is LS"
    )
    # No QoS label and no priority: still batch resources without BE.
    obj = pod(container("c", requests={BATCH_MEMORY: "1Gi"}))
    assert deny_message(client, review(obj)) == (
        "resources kubernetes.io/batch-memory (tier batch) need QoS class BE in label "
        "koordinator.sh/qosClass, but the pod's QoS class is none"
    )


def test_mid_resources_on_a_batch_pod_are_rejected(client: Client) -> None:
    obj = pod(
        container("c", limits={MID_CPU: "1k", MID_MEMORY: "1Gi"}), priority=5500, labels={QOS: "BE"}
    )
    assert deny_message(client, review(obj)) == (
        "resources kubernetes.io/mid-cpu, kubernetes.io/mid-memory (tier mid) are for priority "
        "class koord-mid, but the pod's priority class is koord-batch"
    )


def test_batch_resources_on_a_mid_pod_are_rejected(client: Client) -> None:
    obj = mid_pod()
    obj["spec"]["containers"][0]["resources"]["limits"][BATCH_CPU] = "1k"
    assert deny_message(client, review(obj)) == (
        "resources kubernetes.io/batch-cpu (tier batch) are for priority class koord-batch or "
        "koord-free, but the pod's priority class is koord-mid"
    )


def test_tier_resources_in_an_init_container_count(client: Client) -> None:
    obj = pod(priority=9500, labels={QOS: "LS"})
    obj["spec"]["initContainers"] = [container("init", limits={MID_CPU: "1k"})]
    assert deny_message(client, review(obj)) == (
        "resources kubernetes.io/mid-cpu (tier mid) are for priority class koord-mid, but the "
        "pod's priority class is koord-prod"
    )


def test_every_problem_is_reported_at_once(client: Client) -> None:
    obj = pod(container("c", limits={BATCH_CPU: "1k"}), priority=9500, labels={QOS: "BE"})
    assert deny_message(client, review(obj)).split("; ") == [
        "priority class koord-prod cannot run with QoS class BE: best-effort QoS would let a "
        "production pod be suppressed and evicted",
        "resources kubernetes.io/batch-cpu (tier batch) are for priority class koord-batch or "
        "koord-free, but the pod's priority class is koord-prod",
    ]


@pytest.mark.parametrize(
    "obj",
    [
        mid_pod(),
        batch_pod(),
        pod(container("c", limits={MID_CPU: "1k"}), priority=7500, labels={QOS: "LS"}),
        pod(container("c", limits={"cpu": "2"}), priority=9500, labels={QOS: "LSR"}),
        pod(container("c")),
        pod(container("c"), priority=5500, labels={QOS: "LS"}),  # batch + LS: allowed loosely
    ],
    ids=["mid-BE", "batch-BE", "mid-LS", "prod-LSR", "plain", "batch-LS"],
)
def test_valid_pods_are_allowed(client: Client, obj: dict[str, Any]) -> None:
    for candidate in (obj, mutated(obj, client.admit("/mutate", review(obj)))):
        reply = client.admit("/validate", review(candidate))
        assert reply["response"] == {"uid": reply["response"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda p: p["metadata"]["labels"].__setitem__(QOS, "LS"),
            "label koordinator.sh/qosClass is immutable: 'BE' -> 'LS'",
        ),
        (
            lambda p: p["metadata"]["labels"].pop(QOS),
            "label koordinator.sh/qosClass is immutable: 'BE' -> absent",
        ),
        (
            lambda p: p["metadata"]["labels"].__setitem__(PRIORITY, "koord-batch"),
            "label koordinator.sh/priority-class is immutable: 'koord-mid' -> 'koord-batch'",
        ),
        (
            lambda p: p["metadata"]["annotations"].__setitem__(SPEC, "{}"),
            f"annotation node.koordinator.sh/extended-resource-spec is immutable: "
            f"{MID_SPEC[:77] + '...'!r} -> '{{}}'",
        ),
    ],
    ids=["qos-changed", "qos-removed", "priority-changed", "annotation-changed"],
)
def test_update_changing_what_the_node_reads_is_rejected(
    client: Client, change: Any, message: str
) -> None:
    old = mutated(mid_pod(), client.admit("/mutate", review(mid_pod())))
    new = copy.deepcopy(old)
    change(new)
    assert deny_message(client, review(new, operation="UPDATE", old=old)) == message


def test_update_adding_the_labels_to_an_unlabelled_pod_is_rejected(client: Client) -> None:
    old = pod(container("c"))
    new = pod(container("c"), labels={QOS: "BE", PRIORITY: "koord-batch"})
    assert deny_message(client, review(new, operation="UPDATE", old=old)) == (
        "label koordinator.sh/qosClass is immutable: absent -> 'BE'; "
        "label koordinator.sh/priority-class is immutable: absent -> 'koord-batch'"
    )


def test_update_leaving_them_alone_is_allowed(client: Client) -> None:
    old = mutated(mid_pod(), client.admit("/mutate", review(mid_pod())))
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["app"] = "serve"
    new["metadata"]["finalizers"] = []
    # The same annotation document, written differently, is no change either.
    new["metadata"]["annotations"][SPEC] = json.dumps(json.loads(MID_SPEC), indent=1)
    reply = client.admit("/validate", review(new, operation="UPDATE", old=old))
    assert reply["response"] == {"uid": reply["response"]["uid"], "allowed": True}


def test_update_is_not_checked_against_the_create_rules(client: Client) -> None:
    # A prod+BE pod that predates the webhook can still have its finalizers removed.
    old = pod(priority=9500, labels={QOS: "BE"})
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = []
    reply = client.admit("/validate", review(new, operation="UPDATE", old=old))
    assert reply["response"]["allowed"] is True


def test_delete_and_subresources_are_allowed(client: Client) -> None:
    obj = pod(priority=9500, labels={QOS: "BE"})
    document = review(None, operation="DELETE", old=obj)
    for path in ("/mutate", "/validate"):
        assert client.admit(path, document)["response"]["allowed"] is True
    status_update = review(obj, operation="UPDATE", old=pod())
    status_update["request"]["subResource"] = "status"
    assert client.admit("/validate", status_update)["response"]["allowed"] is True


# ------------------------------------------------------------------------ malformed requests


UID = "0b5c1d1e-7a3c-4e7f-9e1d-00000000bad0"


@pytest.mark.parametrize(
    ("body", "error", "uid"),
    [
        (b"{not json", "the body is not valid JSON: ", None),
        (b"[1, 2]", "the body must be a JSON object: an AdmissionReview", None),
        (
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
            "the AdmissionReview has no request object",
            None,
        ),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1beta1",
                    "kind": "AdmissionReview",
                    "request": {"uid": UID},
                }
            ).encode(),
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got apiVersion "
            "'admission.k8s.io/v1beta1' and kind 'AdmissionReview'",
            UID,
        ),
        (
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1", "kind": "Pod", "request": {"uid": UID}}
            ).encode(),
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview, got apiVersion "
            "'admission.k8s.io/v1' and kind 'Pod'",
            UID,
        ),
        (
            json.dumps(
                {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "request": {"operation": "CREATE"},
                }
            ).encode(),
            "request.uid is missing or not a non-empty string",
            None,
        ),
        (b"", "the body is not valid JSON: ", None),
    ],
    ids=["bad-json", "not-object", "no-request", "v1beta1", "wrong-kind", "no-uid", "empty"],
)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_body_that_is_no_admission_review_is_a_400(
    client: Client, path: str, body: bytes, error: str, uid: str | None
) -> None:
    status, reply = client.post(path, body)
    assert status == 400
    assert reply["error"].startswith(error), reply
    assert reply.get("uid") == uid


def bad_request(client: Client, path: str, document: Mapping[str, Any]) -> str:
    reply = client.admit(path, document)
    response = reply["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert response["status"]["reason"] == "BadRequest"
    assert "patch" not in response
    message = response["status"]["message"]
    assert isinstance(message, str)
    return message


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_a_review_of_something_else_than_a_pod_is_denied_with_the_reason(
    client: Client, path: str
) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    document = review(deployment, uid=UID)
    document["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    assert bad_request(client, path, document) == (
        "cannot admit: request.kind is apps/v1/Deployment: this webhook only admits v1 Pods"
    )
    # request.kind says Pod, the object says otherwise.
    document = review({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}, uid=UID)
    assert bad_request(client, path, document) == (
        "cannot admit: request.object.kind is 'ConfigMap', not 'Pod'"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["request"].pop("kind"), "cannot admit: request.kind is missing"),
        (lambda d: d["request"].pop("object"), "cannot admit: request.object is missing"),
        (
            lambda d: d["request"].__setitem__("object", "pod"),
            "cannot admit: request.object must be an object, not str",
        ),
        (
            lambda d: d["request"]["object"].pop("spec"),
            "cannot admit: request.object.spec is missing",
        ),
        (
            lambda d: d["request"]["object"]["spec"].__setitem__("containers", {}),
            "cannot admit: request.object.spec.containers must be a list",
        ),
        (
            lambda d: d["request"]["object"]["spec"].__setitem__("priority", "high"),
            "cannot admit: request.object.spec.priority must be an integer, not 'high'",
        ),
        (
            lambda d: d["request"]["object"]["metadata"].__setitem__("labels", {QOS: 1}),
            "cannot admit: request.object.metadata.labels['koordinator.sh/qosClass'] must be a "
            "string",
        ),
        (
            lambda d: d["request"]["object"]["spec"]["containers"][0]["resources"][
                "limits"
            ].__setitem__(MID_CPU, "2 cores"),
            "cannot admit: request.object.spec.containers[0].resources.limits"
            "['kubernetes.io/mid-cpu']: invalid quantity '2 cores': unexpected ' ' after the "
            "number",
        ),
        (
            lambda d: d["request"].__setitem__("operation", "PATCH"),
            "cannot admit: request.operation 'PATCH' is not an admission operation",
        ),
        (
            lambda d: (
                d["request"].__setitem__("oldObject", None)
                or d["request"].__setitem__("operation", "UPDATE")
            ),
            "cannot admit: request.oldObject is missing",
        ),
    ],
    ids=[
        "no-kind",
        "no-object",
        "object-string",
        "no-spec",
        "containers-map",
        "priority-string",
        "label-number",
        "bad-quantity",
        "bad-operation",
        "update-no-old",
    ],
)
def test_a_pod_that_cannot_be_read_is_denied_with_the_reason(
    client: Client, edit: Any, message: str
) -> None:
    document = review(mid_pod(), uid=UID)
    edit(document)
    path = "/validate" if document["request"]["operation"] == "UPDATE" else "/mutate"
    assert bad_request(client, path, document) == message


# ------------------------------------------------------------------------------- HTTP level


def test_probes_and_unknown_paths(client: Client) -> None:
    assert client.raw("GET", "/healthz")[0::2] == (200, b"ok\n")
    assert client.raw("GET", "/readyz")[0::2] == (200, b"ok\n")
    assert client.raw("GET", "/mutate")[0] == 404
    assert client.raw("POST", "/nope", b"{}", {"Content-Type": "application/json"})[0] == 404


def test_a_body_over_the_limit_is_refused_unread(server: WebhookServer, tls: Tls) -> None:
    # Only the headers are sent: the answer comes without waiting for the body.
    with tls_socket(server, tls) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {server.max_body + 1}\r\n\r\n".encode()
        )
        reply = read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 413 ")
        assert reply.endswith(f"\r\n\r\nbody over {3 * 1024 * 1024} bytes\n".encode())
        assert b"\r\nConnection: close\r\n" in reply
        sock.settimeout(10)
        assert sock.recv(1) == b""


def test_a_body_at_the_limit_is_read(client: Client, server: WebhookServer) -> None:
    document = json.dumps(review(mid_pod())).encode()
    body = document + b" " * (server.max_body - len(document))
    status, reply = client.post("/mutate", body)
    assert status == 200
    assert patch_of(reply) is not None


def test_other_content_types_are_refused(client: Client) -> None:
    body = json.dumps(review(mid_pod())).encode()
    assert client.raw("POST", "/mutate", body, {"Content-Type": "text/plain"})[0] == 415
    # application/json with parameters is fine.
    status, _, _ = client.raw(
        "POST", "/mutate", body, {"Content-Type": "application/json; charset=utf-8"}
    )
    assert status == 200


def tls_socket(server: WebhookServer, tls: Tls) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    return tls.client().wrap_socket(raw, server_hostname="localhost")


def test_a_body_without_content_length_is_refused(server: WebhookServer, tls: Tls) -> None:
    with tls_socket(server, tls) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        assert read_reply(sock).startswith(b"HTTP/1.1 411 ")
    with tls_socket(server, tls) as sock:
        sock.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(sock).startswith(b"HTTP/1.1 411 ")


@pytest.mark.parametrize(
    ("framing", "reason"),
    [
        # RFC 9112 section 6.3: a proxy may have taken either; the last one won here.
        (b"Content-Length: 2\r\nContent-Length: 40\r\n", b"Content-Length headers that differ"),
        (
            b"Transfer-Encoding: chunked\r\nContent-Length: 2\r\n",
            b"both Transfer-Encoding and Content-Length",
        ),
        (b"Content-Length: 2x\r\n", b"Content-Length is not a number of at most 20 digits"),
        # str.isdigit takes a superscript two, int() does not.
        ("Content-Length: \u00b2\r\n".encode("latin-1"), b"Content-Length is not a number"),
        # int() refuses more than 4,300 digits.
        (b"Content-Length: " + b"0" * 5000 + b"2\r\n", b"Content-Length is not a number"),
    ],
)
def test_a_body_whose_length_is_ambiguous_is_refused_and_the_connection_closed(
    server: WebhookServer, tls: Tls, framing: bytes, reason: bytes
) -> None:
    with tls_socket(server, tls) as sock:
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + framing
            + b"\r\n{}"
        )
        reply = read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 400 ")
        assert reason in reply.partition(b"\r\n\r\n")[2]
        assert b"\r\nConnection: close\r\n" in reply
        sock.settimeout(10)
        assert sock.recv(1) == b""


def test_a_repeated_content_length_of_one_value_is_read(server: WebhookServer, tls: Tls) -> None:
    body = json.dumps(review(mid_pod())).encode()
    with tls_socket(server, tls) as sock:
        length = f"Content-Length: {len(body)}\r\n".encode()
        sock.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + length * 2
            + b"Connection: close\r\n\r\n"
            + body
        )
        assert read_reply(sock).startswith(b"HTTP/1.1 200 ")


def test_one_connection_serves_many_reviews(server: WebhookServer, tls: Tls) -> None:
    connection = HTTPSConnection("127.0.0.1", server.port, context=tls.client(), timeout=5)
    try:
        for index in range(5):
            document = review(mid_pod(), uid=f"uid-{index}")
            connection.request(
                "POST", "/mutate", json.dumps(document), {"Content-Type": "application/json"}
            )
            reply = json.loads(connection.getresponse().read())
            assert reply["response"]["uid"] == f"uid-{index}"
    finally:
        connection.close()


def test_a_silent_client_does_not_hold_up_others(tls: Tls) -> None:
    # The silent client's deadline: long enough that a loaded machine answers the
    # other client well before it, short enough to see the silent one dropped.
    deadline = 5.0
    webhook = WebhookServer(
        "127.0.0.1:0", tls.cert, tls.key, Config(), timeout=deadline, reload_interval=3600
    )
    webhook.start()
    try:
        # Connects, never starts the handshake.
        with socket.create_connection(("127.0.0.1", webhook.port), timeout=5) as silent:
            client = Client(webhook, tls)
            assert client.admit("/mutate", review(mid_pod()))["response"]["allowed"] is True
            # Answered while the silent one still holds its connection, not after it is dropped.
            silent.setblocking(False)
            with pytest.raises(BlockingIOError):
                silent.recv(1)
            # The silent one is dropped after the timeout.
            silent.settimeout(deadline + 30)
            assert silent.recv(1) == b""
    finally:
        webhook.stop()


def test_a_client_that_does_not_trust_the_ca_is_refused(server: WebhookServer) -> None:
    connection = HTTPSConnection(
        "127.0.0.1", server.port, context=ssl.create_default_context(), timeout=5
    )
    with pytest.raises(ssl.SSLCertVerificationError):
        connection.request("GET", "/healthz")
    connection.close()


def test_draining_fails_readiness_only(tls: Tls) -> None:
    webhook = WebhookServer("127.0.0.1:0", tls.cert, tls.key, Config(), reload_interval=3600)
    webhook.start()
    try:
        client = Client(webhook, tls)
        webhook.drain()
        assert client.raw("GET", "/readyz")[0::2] == (503, b"draining\n")
        assert client.raw("GET", "/healthz")[0] == 200
        assert client.admit("/mutate", review(mid_pod()))["response"]["allowed"] is True
    finally:
        webhook.stop()


# ----------------------------------------------------------------------------------- reloads


def peer_certificate(webhook: WebhookServer, tls: Tls) -> bytes:
    with tls_socket(webhook, tls) as sock:
        der = sock.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_rotated_certificate_is_served_without_restart(tmp_path: Path) -> None:
    first = issue_tls(tmp_path / "live")
    webhook = WebhookServer("127.0.0.1:0", first.cert, first.key, Config(), reload_interval=3600)
    webhook.start()
    try:
        before = peer_certificate(webhook, first)
        assert before == x509.load_pem_x509_certificate(first.cert.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )
        # A broken pair (new certificate, old key) is not taken, and the old one stays.
        second = issue_tls(tmp_path / "next")
        first.cert.write_bytes(second.cert.read_bytes())
        webhook.poll_files()
        assert peer_certificate(webhook, first) == before
        # Both files rotated: the next connection gets the new certificate.
        first.key.write_bytes(second.key.read_bytes())
        webhook.poll_files()
        after = peer_certificate(webhook, second)
        assert after == x509.load_pem_x509_certificate(second.cert.read_bytes()).public_bytes(
            serialization.Encoding.DER
        )
    finally:
        webhook.stop()


def test_a_changed_configuration_is_used_without_restart(tmp_path: Path, tls: Tls) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("")
    webhook = WebhookServer(
        "127.0.0.1:0", tls.cert, tls.key, Config(), config_path=config, reload_interval=3600
    )
    webhook.start()
    try:
        client = Client(webhook, tls)
        assert patch_of(client.admit("/mutate", review(mid_pod()))) is not None
        # The mid tier now only takes pods in namespace "ml".
        config.write_text(
            "tiers:\n"
            "  - name: mid\n"
            "    priorityClasses: [koord-mid]\n"
            "    qosClasses: [BE, LS]\n"
            "    resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}\n"
            "    namespaces: [ml]\n"
        )
        webhook.poll_files()
        assert patch_of(client.admit("/mutate", review(mid_pod()))) is None
        in_ml = mid_pod(namespace="ml")
        assert patch_of(client.admit("/mutate", review(in_ml, namespace="ml"))) is not None
        # An invalid file keeps the last good configuration.
        config.write_text("tiers: nonsense\n")
        webhook.poll_files()
        assert patch_of(client.admit("/mutate", review(mid_pod()))) is None
    finally:
        webhook.stop()


# --------------------------------------------------------------------------------------- CLI


def nri_midbatch(*args: str) -> list[str]:
    return [sys.executable, "-m", "nri_midbatch.tools.cli", *args]


def test_cli_serves_until_sigterm(tmp_path: Path, tls: Tls) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("rules:\n  cfsQuota: true\n")
    process = subprocess.Popen(
        nri_midbatch(
            "webhook",
            "--tls-cert",
            str(tls.cert),
            "--tls-key",
            str(tls.key),
            "--address",
            "127.0.0.1:0",
            "--config",
            str(config),
            "--shutdown-delay",
            "0.2",
            "--log-format",
            "json",
        ),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        event = json.loads(line)
        assert event["event"] == "webhook serving", line
        port = int(event["port"])
        connection = HTTPSConnection("127.0.0.1", port, context=tls.client(), timeout=5)
        connection.request(
            "POST", "/mutate", json.dumps(review(mid_pod())), {"Content-Type": "application/json"}
        )
        reply = json.loads(connection.getresponse().read())
        connection.close()
        assert mutated(mid_pod(), reply)["metadata"]["annotations"][SPEC] == MID_SPEC
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--tls-cert", "/nonexistent/tls.crt", "--tls-key", "/nonexistent/tls.key"],
            "nri-midbatch: TLS /nonexistent/tls.crt, /nonexistent/tls.key: "
            "No such file or directory",
        ),
        (["--address", "nowhere"], "argument --address: address 'nowhere' must be HOST:PORT"),
        (
            ["--config", "/nonexistent/config.yaml"],
            "nri-midbatch: /nonexistent/config.yaml: cannot read: No such file or directory",
        ),
    ],
    ids=["missing-cert", "bad-address", "missing-config"],
)
def test_cli_refuses_what_it_cannot_serve_with(tls: Tls, args: list[str], message: str) -> None:
    base = ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key)]
    result = subprocess.run(
        nri_midbatch("webhook", *base, *args),
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 2, result
    assert message in result.stderr


def test_cli_requires_the_certificate_and_key() -> None:
    result = subprocess.run(nri_midbatch("webhook"), capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "the following arguments are required: --tls-cert, --tls-key" in result.stderr


def test_every_webhook_flag_is_in_the_doc() -> None:
    import argparse

    from nri_midbatch.tools.cli import DEFAULT_WEBHOOK_ADDRESS, command_line
    from nri_midbatch.tools.webhook.server import DEFAULT_ADDRESS, MAX_BODY_BYTES

    assert DEFAULT_WEBHOOK_ADDRESS == DEFAULT_ADDRESS
    text = (Path(__file__).resolve().parents[2] / "docs" / "webhook.md").read_text()
    subparsers = next(
        a for a in command_line()._actions if isinstance(a, argparse._SubParsersAction)
    )
    options = [
        option
        for action in subparsers.choices["webhook"]._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert options
    for option in options:
        assert f"`{option}" in text or f" {option} " in text, option
    assert f"`{DEFAULT_ADDRESS}`" in text
    assert MAX_BODY_BYTES == 3 * 1024 * 1024 and "3 MiB" in text
