"""Every classification path: QoS from label or cgroup parent, priority from label, spec, QoS."""

from __future__ import annotations

import json

import pytest

from nri_midbatch.policy import (
    Classified,
    ContainerView,
    PodView,
    PriorityClass,
    QoSClass,
    Source,
    decide_container,
    render,
)
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from tests.factory import DEFAULT_POLICY, PRIORITY, QOS, SPEC, policy

DEFAULT = DEFAULT_POLICY
FROM_CGROUP = policy("classification: {qosFromCgroupParent: true}")


def spec_resources(*names: str) -> frozenset[str]:
    return frozenset(names)


@pytest.mark.parametrize("value", ["LSE", "LSR", "LS", "BE", "SYSTEM"])
def test_qos_from_label(value: str) -> None:
    result = DEFAULT.classifier.qos({QOS: value}, "")
    assert result == Classified(QoSClass(value), Source.LABEL, f"qos {value} from label {QOS}")


@pytest.mark.parametrize("value", ["be", "Burstable", "", "NONE"])
def test_unknown_qos_label_is_none_without_fallback(value: str) -> None:
    result = FROM_CGROUP.classifier.qos({QOS: value}, "/kubepods/besteffort/pod1")
    assert result.value is None
    assert result.source is Source.LABEL
    assert repr(value) in result.detail


def test_missing_qos_label_is_none_by_default_even_under_besteffort() -> None:
    result = DEFAULT.classifier.qos({}, "/kubepods/besteffort/pod1")
    assert (result.value, result.source) == (None, Source.NONE)


@pytest.mark.parametrize(
    ("cgroup_parent", "qos"),
    [
        ("/kubepods/besteffort/pod0a1b-2c3d", QoSClass.BE),
        ("/kubepods/burstable/pod0a1b-2c3d", QoSClass.LS),
        ("/kubepods/pod0a1b-2c3d", QoSClass.LSR),
        ("kubepods-besteffort-pod0a1b_2c3d.slice", QoSClass.BE),
        ("kubepods-burstable-pod0a1b_2c3d.slice", QoSClass.LS),
        ("kubepods-pod0a1b_2c3d.slice", QoSClass.LSR),
        (
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0a1b_2c3d.slice",
            QoSClass.BE,
        ),
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a1b_2c3d.slice",
            QoSClass.LS,
        ),
        ("/kubepods.slice/kubepods-pod0a1b_2c3d.slice", QoSClass.LSR),
        ("/custom-root/kubepods/besteffort/pod1", QoSClass.BE),
        ("", None),
        ("/system.slice/containerd.service", None),
        ("/besteffort/pod1", None),  # not under kubepods
    ],
)
def test_qos_from_cgroup_parent(cgroup_parent: str, qos: QoSClass | None) -> None:
    assert qos_from_cgroup_parent(cgroup_parent) == qos
    result = FROM_CGROUP.classifier.qos({}, cgroup_parent)
    assert result.value == qos
    assert result.source is (Source.NONE if qos is None else Source.CGROUP_PARENT)


def test_qos_label_wins_over_cgroup_parent() -> None:
    result = FROM_CGROUP.classifier.qos({QOS: "LS"}, "/kubepods/besteffort/pod1")
    assert (result.value, result.source) == (QoSClass.LS, Source.LABEL)


@pytest.mark.parametrize("value", ["koord-prod", "koord-mid", "koord-batch", "koord-free"])
def test_priority_from_label_wins(value: str) -> None:
    result = DEFAULT.classifier.priority(
        {PRIORITY: value}, QoSClass.BE, spec_resources("kubernetes.io/mid-cpu")
    )
    assert (result.value, result.source) == (PriorityClass(value), Source.LABEL)


@pytest.mark.parametrize("value", ["koord-Batch", "batch", "", "koord-none"])
def test_invalid_priority_label_is_none_without_fallback(value: str) -> None:
    result = DEFAULT.classifier.priority(
        {PRIORITY: value}, QoSClass.BE, spec_resources("kubernetes.io/batch-cpu")
    )
    assert (result.value, result.source) == (None, Source.LABEL)
    assert repr(value) in result.detail


@pytest.mark.parametrize(
    ("resources", "priority"),
    [
        (("kubernetes.io/mid-cpu",), PriorityClass.MID),
        (("kubernetes.io/mid-memory",), PriorityClass.MID),
        (("kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"), PriorityClass.BATCH),
        (("kubernetes.io/batch-memory",), PriorityClass.BATCH),
        # Resources of two tiers: the first configured tier wins.
        (("kubernetes.io/mid-cpu", "kubernetes.io/batch-cpu"), PriorityClass.BATCH),
    ],
)
def test_priority_inferred_from_spec_resources(
    resources: tuple[str, ...], priority: PriorityClass
) -> None:
    result = DEFAULT.classifier.priority({}, QoSClass.LS, spec_resources(*resources))
    assert (result.value, result.source) == (priority, Source.SPEC_RESOURCES)


@pytest.mark.parametrize(
    ("qos", "priority"),
    [
        (QoSClass.BE, PriorityClass.BATCH),
        (QoSClass.LS, PriorityClass.PROD),
        (QoSClass.LSR, PriorityClass.PROD),
        (QoSClass.LSE, PriorityClass.PROD),
        (QoSClass.SYSTEM, PriorityClass.PROD),
    ],
)
def test_priority_defaults_from_qos(qos: QoSClass, priority: PriorityClass) -> None:
    for resources in (None, spec_resources(), spec_resources("cpu", "example.com/gpu")):
        result = DEFAULT.classifier.priority({}, qos, resources)
        assert (result.value, result.source) == (priority, Source.QOS_DEFAULT)


def test_no_label_no_spec_no_qos_is_none() -> None:
    result = DEFAULT.classifier.priority({}, None, None)
    assert (result.value, result.source) == (None, Source.NONE)


def test_inferred_class_is_the_first_listed_in_the_tier() -> None:
    p = policy(
        """
tiers:
  - name: spare
    priorityClasses: [koord-free, koord-batch]
    qosClasses: [BE]
    resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}
"""
    )
    result = p.classifier.priority({}, QoSClass.BE, spec_resources("kubernetes.io/batch-cpu"))
    assert result.value is PriorityClass.FREE


def test_label_and_annotation_keys_come_from_config() -> None:
    p = policy(
        """
classification:
  qosLabel: example.com/qos
  priorityClassLabel: example.com/priority
  extendedResourceSpecAnnotation: example.com/spec
"""
    )
    assert p.classifier.qos({"example.com/qos": "BE"}, "").value is QoSClass.BE
    assert p.classifier.qos({QOS: "BE"}, "").value is None
    assert p.classifier.priority({"example.com/priority": "koord-mid"}, None, None).value is (
        PriorityClass.MID
    )
    assert p.spec_annotation == "example.com/spec"


def test_decision_records_sources() -> None:
    annotation = json.dumps({"containers": {"c": {"requests": {"kubernetes.io/mid-cpu": "1k"}}}})
    pod = PodView("u", "ns", "p", {}, {SPEC: annotation}, "/kubepods/burstable/pod1")
    decision = decide_container(pod, ContainerView("id", "c"), FROM_CGROUP)
    assert decision.qos.source is Source.CGROUP_PARENT
    assert decision.priority.source is Source.SPEC_RESOURCES
    assert render(decision.trace)[:2] == (decision.qos.detail, decision.priority.detail)
    assert decision.tier == "mid"
