"""The webhook's pure parts: the policy helpers it added, reading pods, configuration variants,
JSON pointers. No server here; test_webhook.py drives the same code over HTTPS."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import load_config_text
from nri_midbatch.policy import PriorityClass, QoSClass
from nri_midbatch.policy.classes import (
    PRIORITY_RANGES,
    forbidden_combination,
    priority_class_from_value,
)
from nri_midbatch.tools.webhook.admission import derive_spec, handle, tier_resources
from nri_midbatch.tools.webhook.jsonpatch import pointer
from nri_midbatch.tools.webhook.pods import PodError, pod_qos, read_pod
from tests.admission import (
    MID_SPEC,
    container,
    mid_pod,
    pod,
    review,
)
from tests.factory import DEFAULT_POLICY, MID_CPU, MID_MEMORY, PRIORITY, QOS, SPEC

DEFAULT = DEFAULT_POLICY


def run(path: str, document: dict[str, Any], policy: Any = DEFAULT) -> dict[str, Any]:
    answer = handle(json.dumps(document).encode(), path, policy)  # type: ignore[arg-type]
    assert answer.status == 200, answer.body
    response = answer.body["response"]
    assert isinstance(response, dict)
    return response


def apply(obj: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    if "patch" not in response:
        return obj
    ops = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(obj, ops)  # type: ignore[no-any-return]


# -------------------------------------------------------------------------- policy helpers


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-1, None),
        (0, None),
        (2999, None),
        (3000, PriorityClass.FREE),
        (3999, PriorityClass.FREE),
        (4000, None),
        (4999, None),
        (5000, PriorityClass.BATCH),
        (5999, PriorityClass.BATCH),
        (6000, None),
        (6999, None),
        (7000, PriorityClass.MID),
        (7099, PriorityClass.MID),
        (7100, PriorityClass.MID),  # mid reaches 7999 since Koordinator PR #693
        (7999, PriorityClass.MID),
        (8000, None),
        (8999, None),
        (9000, PriorityClass.PROD),
        (9999, PriorityClass.PROD),
        (10000, None),
        (2_000_000_000, None),  # system-cluster-critical
    ],
)
def test_priority_class_from_value(value: int, expected: PriorityClass | None) -> None:
    assert priority_class_from_value(value) is expected


def test_priority_ranges_are_koordinators() -> None:
    assert [(str(c), low, high) for c, low, high in PRIORITY_RANGES] == [
        ("koord-prod", 9000, 9999),
        ("koord-mid", 7000, 7999),
        ("koord-batch", 5000, 5999),
        ("koord-free", 3000, 3999),
    ]


# Reference §2: the intended matrix, checked loosely (batch+LS and free+LS allowed).
_MATRIX = {
    # qos:      prod   mid    batch  free
    "LSE": (True, False, False, False),
    "LSR": (True, False, False, False),
    "LS": (True, True, True, True),
    "BE": (False, True, True, True),
    "SYSTEM": (True, True, True, True),
}


@pytest.mark.parametrize("qos", list(_MATRIX))
def test_forbidden_combination_follows_the_matrix(qos: str) -> None:
    classes = (PriorityClass.PROD, PriorityClass.MID, PriorityClass.BATCH, PriorityClass.FREE)
    allowed = tuple(forbidden_combination(p, QoSClass(qos)) is None for p in classes)
    assert allowed == _MATRIX[qos]
    # No class on either side: nothing to check.
    assert forbidden_combination(None, QoSClass(qos)) is None
    for priority in classes:
        assert forbidden_combination(priority, None) is None


# ------------------------------------------------------------------------------- pointers


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (
            ("metadata", "labels", "koordinator.sh/priority-class"),
            "/metadata/labels/koordinator.sh~1priority-class",
        ),
        (("a~b",), "/a~0b"),
        (("~1",), "/~01"),  # '~' first, or "~1" would come back as "/"
        (("a/b~c/",), "/a~1b~0c~1"),
        (("",), "/"),
    ],
)
def test_pointer_escapes_tilde_then_slash(tokens: tuple[str, ...], expected: str) -> None:
    assert pointer(*tokens) == expected
    # The jsonpatch library reads each token back unchanged.
    document: dict[str, Any] = {}
    cursor = document
    for token in tokens[:-1]:
        cursor = cursor.setdefault(token, {})
    cursor[tokens[-1]] = "old"
    patched = jsonpatch.apply_patch(document, [{"op": "replace", "path": expected, "value": "new"}])
    for token in tokens:
        patched = patched[token]
    assert patched == "new"


def test_keys_with_tilde_and_slash_are_patched_in_place() -> None:
    # Label and annotation keys come from the configuration; escape them, not just '/'.
    policy = compile_policy(
        load_config_text(
            "classification:\n"
            "  priorityClassLabel: example.com/prio~class\n"
            "  extendedResourceSpecAnnotation: example.com/spec~v1\n",
            "odd keys",
        )
    )
    obj = mid_pod(annotations={"example.com/spec~v1": "{}", "other": "x"})
    response = run("mutate", review(obj), policy)
    ops = json.loads(base64.b64decode(response["patch"]))
    assert [op["path"] for op in ops] == [
        "/metadata/labels/example.com~1prio~0class",
        "/metadata/annotations/example.com~1spec~0v1",
    ]
    after = apply(obj, response)
    assert after["metadata"]["labels"]["example.com/prio~class"] == "koord-mid"
    assert after["metadata"]["annotations"] == {"example.com/spec~v1": MID_SPEC, "other": "x"}


# ---------------------------------------------------------------------------- reading pods


def test_read_pod_parses_quantities_and_keeps_names() -> None:
    facts = read_pod(mid_pod(), "")
    assert facts.namespace == "default"
    assert facts.priority == 7500
    assert [c.name for c in facts.containers] == ["main", "sidecar", "helper"]
    main = facts.containers[0]
    assert main.requests[MID_CPU].value() == 1000
    assert main.limits[MID_CPU].value() == 2000
    assert main.limits[MID_MEMORY].value() == 1 << 30


def test_read_pod_rejects_duplicate_container_names() -> None:
    with pytest.raises(PodError, match=r"object.spec.containers\[1\].name 'c' is used by an"):
        read_pod(pod(container("c"), container("c")), "default")


def test_spec_priority_must_not_be_a_boolean() -> None:
    obj = pod(container("c"))
    obj["spec"]["priority"] = True
    with pytest.raises(PodError, match=r"spec\.priority must be an integer, not True"):
        read_pod(obj, "default")


@pytest.mark.parametrize(
    ("containers", "init", "expected"),
    [
        ([container("a")], [], "besteffort"),
        ([container("a", requests={MID_CPU: "1k"})], [], "besteffort"),  # extended: no QoS
        ([container("a", requests={"cpu": "0"})], [], "besteffort"),  # zero counts as unset
        ([container("a", requests={"cpu": "100m"})], [], "burstable"),
        # Requests default to limits, as the API server's defaulting sets them.
        ([container("a", limits={"cpu": "1", "memory": "1Gi"})], [], "guaranteed"),
        ([container("a", limits={"cpu": "1"})], [], "burstable"),
        (
            [
                container(
                    "a",
                    requests={"cpu": "1", "memory": "1Gi"},
                    limits={"cpu": "1", "memory": "1Gi"},
                )
            ],
            [],
            "guaranteed",
        ),
        (
            [
                container(
                    "a",
                    requests={"cpu": "1000m", "memory": "1024Mi"},
                    limits={"cpu": "1", "memory": "1Gi"},
                )
            ],
            [],
            "guaranteed",
        ),
        (
            [
                container(
                    "a",
                    requests={"cpu": "1", "memory": "1Gi"},
                    limits={"cpu": "1", "memory": "1Gi"},
                )
            ],
            [container("init", requests={"cpu": "100m"})],
            "burstable",
        ),
        ([container("a")], [container("init", requests={"memory": "1Mi"})], "burstable"),
    ],
)
def test_kubernetes_qos(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], expected: str
) -> None:
    obj = pod(*containers)
    if init:
        obj["spec"]["initContainers"] = init
    assert pod_qos(read_pod(obj, "default")) == expected


def test_derive_spec_only_lists_tier_resources_of_app_containers() -> None:
    obj = pod(
        container("a", requests={"cpu": "1", MID_CPU: "2000"}, limits={"example.com/gpu": "1"}),
        container("b", requests={"cpu": "1"}),
    )
    obj["spec"]["initContainers"] = [container("init", limits={MID_CPU: "1k"})]
    facts = read_pod(obj, "default")
    assert derive_spec(facts, tier_resources(DEFAULT)) == {
        "containers": {"a": {"requests": {MID_CPU: "2k"}}}
    }
    assert derive_spec(read_pod(pod(container("c")), ""), tier_resources(DEFAULT)) is None
    assert tier_resources(DEFAULT) == (
        "kubernetes.io/batch-cpu",
        "kubernetes.io/batch-memory",
        "kubernetes.io/mid-cpu",
        "kubernetes.io/mid-memory",
    )


# ---------------------------------------------------------------------- configuration variants


def test_a_third_tier_from_the_configuration_is_written_too() -> None:
    policy = compile_policy(
        load_config_text(
            "tiers:\n"
            "  - name: free\n"
            "    priorityClasses: [koord-free]\n"
            "    qosClasses: [BE]\n"
            "    resources: {cpu: example.com/free-cpu, memory: example.com/free-memory}\n"
            "  - name: mid\n"
            "    priorityClasses: [koord-mid]\n"
            "    qosClasses: [BE]\n"
            "    resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}\n",
            "three tiers",
        )
    )
    obj = pod(
        container(
            "c", requests={"example.com/free-cpu": "250"}, limits={"example.com/free-cpu": "1k"}
        ),
        priority=3100,
        labels={QOS: "BE"},
    )
    after = apply(obj, run("mutate", review(obj), policy))
    assert after["metadata"]["labels"][PRIORITY] == "koord-free"
    assert json.loads(after["metadata"]["annotations"][SPEC]) == {
        "containers": {
            "c": {
                "requests": {"example.com/free-cpu": "250"},
                "limits": {"example.com/free-cpu": "1k"},
            }
        }
    }
    # koord-batch is in no tier here: untouched; and batch-cpu is nobody's resource now.
    obj["spec"]["priority"] = 5500
    assert "patch" not in run("mutate", review(obj), policy)
    # mid is BE-only in this configuration: mid resources on an LS pod are rejected.
    obj = pod(container("c", limits={MID_CPU: "1k"}), priority=7500, labels={QOS: "LS"})
    response = run("validate", review(obj), policy)
    assert response["status"]["message"] == (
        "resources kubernetes.io/mid-cpu (tier mid) need QoS class BE in label "
        "koordinator.sh/qosClass, but the pod's QoS class is LS"
    )


def test_tier_namespaces_limit_the_mutation() -> None:
    policy = compile_policy(
        load_config_text(
            "tiers:\n"
            "  - name: mid\n"
            "    priorityClasses: [koord-mid]\n"
            "    qosClasses: [BE, LS]\n"
            "    resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}\n"
            "    namespaces: [ml]\n",
            "namespaced",
        )
    )
    assert "patch" not in run("mutate", review(mid_pod(), namespace="default"), policy)
    response = run("mutate", review(mid_pod(namespace="ml"), namespace="ml"), policy)
    assert apply(mid_pod(), response)["metadata"]["annotations"][SPEC] == MID_SPEC


def test_qos_from_the_kubernetes_class_when_configured() -> None:
    policy = compile_policy(
        load_config_text("classification:\n  qosFromCgroupParent: true\n", "cgroup qos")
    )
    # No labels map at all; no cpu/memory: BestEffort -> BE -> the mid tier.
    obj = pod(container("c", requests={MID_CPU: "500"}, limits={MID_CPU: "1k"}), priority=7500)
    response = run("mutate", review(obj), policy)
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops[0] == {"op": "add", "path": "/metadata/labels", "value": {PRIORITY: "koord-mid"}}
    assert apply(obj, response)["metadata"]["annotations"][SPEC] == (
        '{"containers":{"c":{"limits":{"kubernetes.io/mid-cpu":"1k"},'
        '"requests":{"kubernetes.io/mid-cpu":"500"}}}}'
    )
    # The same pod with the default configuration has no QoS class: untouched.
    assert "patch" not in run("mutate", review(obj))
    # A Guaranteed koord-mid pod reads as LSR: in no tier, but not rejected, since the
    # priority x QoS matrix only judges the QoS label.
    guaranteed = pod(
        container(
            "c", requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"}
        ),
        priority=7500,
    )
    assert "patch" not in run("mutate", review(guaranteed), policy)
    assert run("validate", review(guaranteed), policy) == {
        "uid": review(guaranteed)["request"]["uid"],
        "allowed": True,
    }


def test_custom_label_keys_are_used_for_classification_and_validation() -> None:
    policy = compile_policy(
        load_config_text(
            "classification:\n"
            "  qosLabel: example.com/qos\n"
            "  priorityClassLabel: example.com/tier\n",
            "custom labels",
        )
    )
    obj = mid_pod()
    obj["metadata"]["labels"] = {"example.com/qos": "BE"}
    after = apply(obj, run("mutate", review(obj), policy))
    assert after["metadata"]["labels"] == {"example.com/qos": "BE", "example.com/tier": "koord-mid"}
    # Koordinator's own label keys mean nothing under this configuration.
    obj["metadata"]["labels"] = {QOS: "BE", PRIORITY: "koord-batch"}
    assert "patch" not in run("mutate", review(obj), policy)
    old = after
    new = json.loads(json.dumps(after))
    new["metadata"]["labels"]["example.com/qos"] = "LS"
    response = run("validate", review(new, operation="UPDATE", old=old), policy)
    assert response["status"]["message"] == "label example.com/qos is immutable: 'BE' -> 'LS'"


# ---------------------------------------------------------------------------- any input


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    [
        "metadata",
        "spec",
        "labels",
        "annotations",
        "containers",
        "initContainers",
        "resources",
        "requests",
        "limits",
        "name",
        "priority",
        "kind",
        "apiVersion",
        QOS,
        PRIORITY,
        SPEC,
        MID_CPU,
    ]
)
_PODISH = st.recursive(
    st.none() | st.integers() | st.text(max_size=6) | st.sampled_from(["1k", "2Gi", "BE", "LS"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    endpoint=st.sampled_from(["mutate", "validate"]),
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "", 7]),
    obj=_PODISH,
    old=_PODISH,
    extra=_JSON,
)
def test_any_review_gets_an_answer_with_its_uid(
    endpoint: str, operation: Any, obj: Any, old: Any, extra: Any
) -> None:
    document = review(obj, operation="CREATE", old=old)
    document["request"]["operation"] = operation
    document["request"]["extra"] = extra
    answer = handle(json.dumps(document).encode(), endpoint, DEFAULT)  # type: ignore[arg-type]
    assert answer.status == 200
    response = answer.body["response"]
    assert response["uid"] == document["request"]["uid"]
    assert isinstance(response["allowed"], bool)
    if "patch" in response:
        jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64) | _JSON.map(lambda v: json.dumps(v).encode()))
def test_any_body_gets_an_answer(body: bytes) -> None:
    answer = handle(body, "mutate", DEFAULT)
    assert answer.status in (200, 400)
    assert isinstance(answer.body, dict)


# -------------------------------------------------------------------------- absurd quantities


def absurd_pod(resource: str, quantity: str) -> dict[str, Any]:
    return pod(
        container("main", requests={resource: quantity}, limits={resource: quantity}),
        labels={QOS: "BE", PRIORITY: "koord-mid"},
    )


ABSURD = [
    (MID_CPU, "1e18"),  # fits int64 as a quantity; the CFS quota computed from it does not
    (MID_MEMORY, "99999999999999999999"),  # does not fit int64 even as a quantity
]


@pytest.mark.parametrize(("resource", "quantity"), ABSURD)
def test_a_quantity_the_node_cannot_use_is_denied_with_the_reason(
    resource: str, quantity: str
) -> None:
    response = run("validate", review(absurd_pod(resource, quantity)))
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 400
    message = status["message"]
    assert "container 'main'" in message
    assert "int64" in message


@pytest.mark.parametrize(("resource", "quantity"), ABSURD)
def test_a_quantity_the_node_cannot_use_is_never_patched(resource: str, quantity: str) -> None:
    response = run("mutate", review(absurd_pod(resource, quantity)))
    assert response["allowed"] is True
    assert "patch" not in response
    assert any("int64" in warning for warning in response.get("warnings", []))


def test_large_quantities_that_fit_are_still_admitted() -> None:
    obj = absurd_pod(MID_MEMORY, "1Ei")
    assert run("validate", review(obj))["allowed"] is True
    patched = apply(obj, run("mutate", review(obj)))
    assert "1Ei" in patched["metadata"]["annotations"][SPEC]
