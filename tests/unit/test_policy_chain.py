"""The tier chain end to end: pod and container views in, decisions out."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    ErrorKind,
    NativeLimits,
    PodView,
    Policy,
    PriorityClass,
    QoSClass,
    Source,
    decide_pod,
    render,
)
from nri_midbatch.policy.chain import Chain
from tests.factory import (
    BATCH_CPU,
    BATCH_MEMORY,
    GI,
    MAIN,
    PRIORITY,
    QOS,
    SPEC,
    batch_spec,
    decide,
    mid_spec,
    policy,
    resource_spec,
)
from tests.factory import DEFAULT_POLICY as DEFAULT
from tests.factory import pod_view as pod


def test_batch_be() -> None:
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("500", "1k", "2Gi"))))
    assert decision.tier == "batch"
    assert decision.values == CgroupValues(512, 100_000, 2 * GI)
    assert decision.error is None
    assert decision.priority.value is PriorityClass.BATCH
    assert decision.qos.value is QoSClass.BE


def test_free_be_is_batch() -> None:
    decision = decide(pod("BE", "koord-free", batch_spec(main=("500", None, None))))
    assert (decision.tier, decision.values) == ("batch", CgroupValues(512, -1, -1))


@pytest.mark.parametrize("qos", ["BE", "LS"])
def test_mid(qos: str) -> None:
    decision = decide(pod(qos, "koord-mid", mid_spec(main=("2k", "4k", "1Gi"))))
    assert decision.tier == "mid"
    assert decision.values == CgroupValues(2048, 400_000, GI)


def test_mid_ignores_batch_resources() -> None:
    # A mid pod reads mid-*; batch-* in its spec are not its tier's resources.
    decision = decide(pod("BE", "koord-mid", batch_spec(main=("500", "1k", "2Gi"))))
    assert (decision.tier, decision.values) == ("mid", CgroupValues(2, -1, -1))


def test_prod_ls_is_left_alone() -> None:
    decision = decide(pod("LS", "koord-prod", batch_spec(main=("500", "1k", "2Gi"))))
    assert (decision.tier, decision.values, decision.error) == (None, None, None)
    assert render(decision.trace)[2:] == (
        "tier batch: priority koord-prod not in [koord-batch, koord-free]",
        "tier mid: priority koord-prod not in [koord-mid]",
        "no tier matched: pod left alone",
    )


def test_batch_priority_with_ls_qos_is_left_alone() -> None:
    decision = decide(pod("LS", "koord-batch", batch_spec(main=("500", "1k", "2Gi"))))
    assert decision.tier is None
    assert "tier batch: qos LS not in [BE]" in render(decision.trace)


def test_be_without_priority_label_and_batch_resources_is_batch() -> None:
    decision = decide(pod("BE", None, batch_spec(main=("500", "1k", None))))
    assert decision.tier == "batch"
    assert decision.priority.source is Source.SPEC_RESOURCES
    assert decision.values == CgroupValues(512, 100_000, -1)


def test_be_without_priority_label_and_mid_resources_is_mid() -> None:
    decision = decide(pod("BE", None, mid_spec(main=("500", "1k", None))))
    assert decision.tier == "mid"
    assert decision.priority.value is PriorityClass.MID
    assert decision.values == CgroupValues(512, 100_000, -1)


def test_be_without_priority_label_or_spec_defaults_to_batch_and_stays_untouched() -> None:
    decision = decide(pod("BE"))
    assert decision.tier == "batch"
    assert decision.priority.source is Source.QOS_DEFAULT
    assert decision.values is None
    assert render(decision.trace)[-1] == f"no containers in annotation {SPEC}: left untouched"


def test_ls_without_priority_label() -> None:
    prod = decide(pod("LS", None, json.dumps({"containers": {}})))
    assert (prod.priority.value, prod.tier) == (PriorityClass.PROD, None)
    # Batch resources make it koord-batch, but the batch tier takes only BE.
    batch = decide(pod("LS", None, batch_spec(main=("1", "1", "1"))))
    assert (batch.priority.value, batch.tier) == (PriorityClass.BATCH, None)
    assert "tier batch: qos LS not in [BE]" in render(batch.trace)
    # Mid resources make it koord-mid, and mid takes LS.
    mid = decide(pod("LS", None, mid_spec(main=("1", "1", "1"))))
    assert (mid.priority.value, mid.tier) == (PriorityClass.MID, "mid")


def test_invalid_priority_label_matches_no_tier() -> None:
    decision = decide(pod("BE", "batch", batch_spec(main=("500", "1k", "2Gi"))))
    assert (decision.tier, decision.values) == (None, None)
    assert decision.priority.value is None


def test_no_qos_label_matches_no_tier() -> None:
    decision = decide(pod(None, "koord-batch", batch_spec(main=("500", "1k", "2Gi"))))
    assert decision.tier is None
    assert "tier batch: qos none not in [BE]" in render(decision.trace)


def test_namespace_limited_tier() -> None:
    p = policy(
        """
tiers:
  - name: batch
    priorityClasses: [koord-batch]
    qosClasses: [BE]
    resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}
    namespaces: [jobs, etl]
"""
    )
    annotation = batch_spec(main=("500", "1k", "2Gi"))
    inside = decide(pod("BE", "koord-batch", annotation, namespace="etl"), policy=p)
    assert inside.values == CgroupValues(512, 100_000, 2 * GI)
    outside = decide(pod("BE", "koord-batch", annotation, namespace="default"), policy=p)
    assert (outside.tier, outside.values) == (None, None)
    assert "tier batch: namespace 'default' not in [etl, jobs]" in render(outside.trace)


def test_third_tier_from_config_alone() -> None:
    p = policy(
        """
tiers:
  - name: batch
    priorityClasses: [koord-batch]
    qosClasses: [BE]
    resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}
  - name: mid
    priorityClasses: [koord-mid]
    qosClasses: [BE, LS]
    resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}
  - name: scavenger
    priorityClasses: [koord-free]
    qosClasses: [BE]
    resources: {cpu: example.com/free-cpu, memory: example.com/free-memory}
rules:
  cpuNormalizationRatio: 2
"""
    )
    free = ("example.com/free-cpu", "example.com/free-memory")
    annotation = resource_spec(*free, main=("250", "3k", "1Gi"))
    labelled = decide(pod("BE", "koord-free", annotation), policy=p)
    assert labelled.tier == "scavenger"
    assert labelled.values == CgroupValues(256, 150_000, GI)
    inferred = decide(pod("BE", None, annotation), policy=p)
    assert inferred.priority.value is PriorityClass.FREE
    assert inferred.tier == "scavenger"
    # Batch no longer takes koord-free pods.
    assert decide(pod("BE", "koord-free", batch_spec(main=("1", "1", "1"))), policy=p).values == (
        CgroupValues(2, -1, -1)
    )


def test_malformed_quantity_is_an_error_decision_naming_the_container() -> None:
    annotation = json.dumps(
        {"containers": {"main": {"limits": {BATCH_CPU: "1k", BATCH_MEMORY: "2 Gi"}}}}
    )
    decision = decide(pod("BE", "koord-batch", annotation))
    assert decision.tier == "batch"
    assert decision.values is None
    assert decision.error is not None
    assert "container 'main'" in decision.error
    assert repr(BATCH_MEMORY) in decision.error
    assert decision.error_kind is ErrorKind.SPEC
    assert decide_pod(pod("BE", "koord-batch", annotation), DEFAULT).error == decision.error


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"containers": []}', "must be a JSON object"),
        ('{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": true}}}}', "'main'"),
        ('{"containers": {"main": {"requests": "1k"}}}', "'main' requests"),
    ],
)
def test_malformed_annotation_is_an_error(annotation: str, message: str) -> None:
    decision = decide(pod("BE", "koord-batch", annotation))
    assert decision.values is None
    assert decision.error is not None
    assert message in decision.error


def test_malformed_annotation_without_priority_label_falls_back_to_qos_then_errors() -> None:
    decision = decide(pod("BE", None, "{not json"))
    assert decision.priority.source is Source.QOS_DEFAULT
    assert decision.tier == "batch"
    assert decision.error is not None


def test_malformed_annotation_on_pod_outside_every_tier_is_not_an_error() -> None:
    decision = decide(pod("LS", "koord-prod", "{not json"))
    assert (decision.tier, decision.values, decision.error) == (None, None, None)
    assert decision.error_kind is None
    assert render(decision.trace)[-1].startswith(
        "ignored, as no tier applies: extended-resource spec"
    )


def test_container_not_listed_in_spec_is_left_untouched() -> None:
    annotation = batch_spec(main=("500", "1k", "2Gi"))
    decision = decide(pod("BE", "koord-batch", annotation), ContainerView("c1", "sidecar"))
    assert (decision.tier, decision.values, decision.error) == ("batch", None, None)
    assert render(decision.trace)[-1] == (
        "container 'sidecar' not listed in the extended-resource spec: left untouched"
    )


def test_container_native_limits_are_never_loosened() -> None:
    annotation = batch_spec(main=("500", "1k", "2Gi"))
    native = ContainerView("c0", "main", NativeLimits(cpu_quota=20_000, memory_limit=GI))
    decision = decide(pod("BE", "koord-batch", annotation), native)
    assert decision.values == CgroupValues(512, 20_000, GI)


def test_decide_pod_sums_listed_containers() -> None:
    annotation = batch_spec(a=("500", "500", "1Gi"), b=("1k", "1k", "2Gi"))
    decision = decide_pod(pod("BE", "koord-batch", annotation), DEFAULT)
    assert decision.tier == "batch"
    assert decision.values == CgroupValues(1536, 150_000, 3 * GI)


def test_decide_pod_unlimited_when_a_listed_container_has_no_limit() -> None:
    annotation = batch_spec(a=("500", "500", "1Gi"), b=("1k", None, None))
    decision = decide_pod(pod("BE", "koord-batch", annotation), DEFAULT)
    assert decision.values == CgroupValues(1536, -1, -1)


def test_decide_pod_uses_pod_native_limits() -> None:
    annotation = batch_spec(a=("500", "500", "1Gi"))
    native = NativeLimits(cpu_quota=10_000, memory_limit=GI // 2)
    decision = decide_pod(pod("BE", "koord-batch", annotation, native=native), DEFAULT)
    assert decision.values == CgroupValues(512, 10_000, GI // 2)


def test_decide_pod_applies_rules() -> None:
    p = policy("rules: {cfsQuota: false}")
    annotation = batch_spec(a=("500", "500", "1Gi"))
    assert decide_pod(pod("BE", "koord-batch", annotation), p).values == CgroupValues(512, -1, GI)
    ratio = policy("rules: {cpuNormalizationRatio: 1.2}")
    assert decide_pod(pod("BE", "koord-batch", annotation), ratio).values == (
        CgroupValues(512, 41_667, GI)
    )


def test_values_beyond_int64_are_an_error() -> None:
    annotation = batch_spec(a=(None, None, "8Ei"), b=(None, None, "8Ei"))
    decision = decide_pod(pod("BE", "koord-batch", annotation), DEFAULT)
    assert decision.values is None
    assert decision.error is not None
    assert "int64" in decision.error
    assert decision.error_kind is ErrorKind.OVERFLOW


def test_decisions_are_repeatable() -> None:
    p = pod("BE", "koord-batch", batch_spec(main=("500", "1k", "2Gi")))
    assert decide(p) == decide(p)


def test_chain_walks_tiers_in_order() -> None:
    chain = DEFAULT.chain
    match = chain.select(PriorityClass.MID, QoSClass.LS, "any")
    assert match.tier is not None
    assert match.tier.name == "mid"
    assert render(match.reasons) == (
        "tier batch: priority koord-mid not in [koord-batch, koord-free]",
        "tier mid: matched",
    )
    assert chain.select(PriorityClass.MID, QoSClass.LS, "other") is match


def test_chain_without_tiers_matches_nothing() -> None:
    match = Chain(()).select(PriorityClass.BATCH, QoSClass.BE, "ns")
    assert (match.tier, render(match.reasons)) == (None, ("no tier matched: pod left alone",))


RESOURCE_STATUS = "scheduling.koordinator.sh/resource-status"


@pytest.mark.parametrize("level", ["pod", "container"])
def test_a_pod_bound_to_a_cpuset_gets_no_quota_as_koordlet_unsets_it(level: str) -> None:
    # koordlet's CPUSetAllocator runs after BatchResource and sets pod and container quota
    # to -1 for a pod whose resource-status carries a cpuset; a native quota goes too.
    base = pod("LS", "koord-mid", mid_spec(main=("2k", "4k", "1Gi")), native=NativeLimits(300_000))
    bound = replace(base, annotations={**base.annotations, RESOURCE_STATUS: '{"CPUSet": "0-3"}'})
    native = ContainerView(id="c0", name="main", native=NativeLimits(300_000))
    decision = decide_pod(bound, DEFAULT) if level == "pod" else decide(bound, native)
    assert decision.values is not None
    assert decision.values.cpu_quota == -1
    assert render(decision.trace)[-1] == (
        "cpu quota -1 (not 300000): pod bound to cpuset 0-3 by "
        "scheduling.koordinator.sh/resource-status, whose quota koordlet unsets"
    )
    unbound = decide_pod(base, DEFAULT) if level == "pod" else decide(base, native)
    assert unbound.values is not None and unbound.values.cpu_quota == 300_000


@pytest.mark.parametrize(
    "status", ['{"cpuset": ""}', '{"numaNodeResources": []}', '{"cpuset": 3}', "not json", "[]"]
)
def test_no_cpuset_or_an_unreadable_status_is_not_bound(status: str) -> None:
    annotations = {SPEC: batch_spec(main=("500", "1k", "2Gi")), RESOURCE_STATUS: status}
    view = PodView("u", "default", "p", {QOS: "BE", PRIORITY: "koord-batch"}, annotations, "")
    decision = decide(view)
    assert decision.values == CgroupValues(512, 100_000, 2 * GI)


def test_a_quota_beyond_int64_is_refused_not_wrapped() -> None:
    # 1e17 milli-cores: koordlet's int64 product wraps; here the decision is an error.
    decision = decide(pod("BE", "koord-batch", batch_spec(main=(None, "1e17", None))))
    assert (decision.values, decision.error_kind) == (None, ErrorKind.OVERFLOW)


def test_negative_quantities_round_away_from_zero_and_count_as_absent() -> None:
    # Value() of -500m is -1 in apimachinery (away from zero); <= 0 is "absent" either way.
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("-500m", "-1m", "-1"))))
    assert decision.values == CgroupValues(2, -1, -1)


NORMALIZING = policy(
    """
rules: {cpuNormalizationRatio: 1.2}
tiers:
  - {name: batch, priorityClasses: [koord-batch, koord-free], qosClasses: [BE],
     resources: {cpu: kubernetes.io/batch-cpu, memory: kubernetes.io/batch-memory}}
  - {name: mid, priorityClasses: [koord-mid], qosClasses: [BE, LS],
     resources: {cpu: kubernetes.io/mid-cpu, memory: kubernetes.io/mid-memory}}
  - {name: prod, priorityClasses: [koord-prod, None], qosClasses: [LS, None],
     calculator: cpu-normalization}
"""
)
KUBELET_QUOTA = NativeLimits(cpu_quota=200_000, cpu_period=100_000, memory_limit=GI)


@pytest.mark.parametrize(
    ("qos", "priority"), [("LS", None), ("LS", "koord-prod"), (None, None), (None, "koord-prod")]
)
def test_normalization_scales_the_quota_kubelet_set_for_prod_ls_and_none(
    qos: str | None, priority: str | None
) -> None:
    ctr = ContainerView(id="c0", name="main", native=KUBELET_QUOTA)
    decision = decide(pod(qos, priority), ctr, NORMALIZING)
    assert decision.tier == "prod"
    # Only the quota: ceil(200000 / 1.2) = 166667; shares and memory stay kubelet's.
    assert decision.values == CgroupValues(None, 166_667, None)
    assert render(decision.trace)[-1] == (
        "cpu quota 166667 = ceil(200000 / cpuNormalizationRatio 1.2)"
    )
    pod_level = decide_pod(pod(qos, priority, native=KUBELET_QUOTA), NORMALIZING)
    assert pod_level.values == CgroupValues(None, 166_667, None)


def test_mid_ls_is_scaled_once_by_the_mid_tier() -> None:
    ctr = ContainerView(id="c0", name="main", native=NativeLimits(cpu_quota=400_000))
    decision = decide(pod("LS", "koord-mid", mid_spec(main=("2k", "4k", "1Gi"))), ctr, NORMALIZING)
    assert decision.tier == "mid"
    # ceil(400000 / 1.2) once; scaled twice it would be 277778.
    assert decision.values == CgroupValues(2048, 333_334, GI)
    assert sum("cpuNormalizationRatio" in line for line in render(decision.trace)) == 1


def test_batch_is_not_taken_by_the_normalization_tier() -> None:
    decision = decide(
        pod("BE", "koord-batch", batch_spec(main=("500", "1k", "2Gi"))), MAIN, NORMALIZING
    )
    assert (decision.tier, decision.values) == ("batch", CgroupValues(512, 83_334, 2 * GI))


@pytest.mark.parametrize(
    ("config", "view", "annotations", "why"),
    [
        (NORMALIZING, ContainerView("c0", "main"), {}, "no cpu quota set by kubelet"),
        (
            policy(
                "tiers: [{name: prod, priorityClasses: [koord-prod], "
                "qosClasses: [LS], calculator: cpu-normalization}]"
            ),
            ContainerView("c0", "main", KUBELET_QUOTA),
            {},
            "rules.cpuNormalizationRatio is not above 1",
        ),
        (
            NORMALIZING,
            ContainerView("c0", "main", KUBELET_QUOTA),
            {"scheduling.koordinator.sh/resource-status": '{"cpuset": "2-3"}'},
            "bound to cpuset 2-3",
        ),
        (
            NORMALIZING,
            ContainerView("c0", "main", KUBELET_QUOTA, native_known=False),
            {},
            "may already be scaled",
        ),
    ],
)
def test_normalization_leaves_alone_what_it_cannot_scale(
    config: Policy, view: ContainerView, annotations: dict[str, str], why: str
) -> None:
    p = PodView("u", "default", "web", {QOS: "LS", PRIORITY: "koord-prod"}, annotations, "")
    decision = decide(p, view, config)
    assert (decision.tier, decision.values) == ("prod", None)
    assert why in render(decision.trace)[-1]


@pytest.mark.parametrize("ratio", ["1.0", "0.8"])
def test_normalization_ignores_ratios_up_to_one(ratio: str) -> None:
    config = policy(
        f"rules: {{cpuNormalizationRatio: {ratio}}}\ntiers: [{{name: prod, priorityClasses: "
        "[koord-prod], qosClasses: [LS], calculator: cpu-normalization}]"
    )
    decision = decide(pod("LS", "koord-prod"), ContainerView("c0", "main", KUBELET_QUOTA), config)
    assert decision.values is None


def test_a_normalization_tier_takes_no_resources_and_an_extended_one_needs_them() -> None:
    from nri_midbatch.config.model import ConfigError

    with pytest.raises(ConfigError, match="reads no resources"):
        policy(
            "tiers: [{name: p, priorityClasses: [koord-prod], qosClasses: [LS], "
            "calculator: cpu-normalization, resources: {cpu: a, memory: b}}]"
        )
    with pytest.raises(ConfigError, match="needs resources"):
        policy("tiers: [{name: p, priorityClasses: [koord-prod], qosClasses: [LS]}]")
    with pytest.raises(ConfigError, match="'extended-resources' or 'cpu-normalization'"):
        policy("tiers: [{name: p, priorityClasses: [koord-prod], qosClasses: [LS], calculator: x}]")


def test_every_decisions_values_are_one_shared_instance_per_distinct_value() -> None:
    """The plugin holds decisions' values until after its replies: a fresh object per
    decision would be allocated among what it keeps. Computed, normalized and
    cpuset-bound values alike."""
    computed = pod("LS", "koord-mid", mid_spec(main=("2k", "4k", "1Gi")))
    bound = replace(
        computed, annotations={**computed.annotations, RESOURCE_STATUS: '{"CPUSet": "0-3"}'}
    )
    kubelet = ContainerView(id="c0", name="main", native=KUBELET_QUOTA)
    for p, c, used in (
        (computed, MAIN, DEFAULT),
        (bound, MAIN, DEFAULT),
        (pod("LS", None), kubelet, NORMALIZING),
    ):
        first, second = decide(p, c, used), decide(replace(p, name="other"), c, used)
        assert first.values is not None
        assert first.values is second.values, (first.values, first.trace)


# -- where koordlet's CPUNormalization does otherwise (docs/koordinator.md) -----------------


def test_mid_ls_without_mid_entries_is_not_scaled_at_all() -> None:
    """The mid tier takes the pod and finds nothing to compute; the prod tier never sees it.

    koordlet's CPUNormalization, which filters on QoS only, would scale its kubelet quota.
    """
    ctr = ContainerView(id="c0", name="main", native=KUBELET_QUOTA)
    # No spec: left as kubelet set it, quota 200000 and all.
    unlisted = decide(pod("LS", "koord-mid"), ctr, NORMALIZING)
    assert (unlisted.tier, unlisted.values) == ("mid", None)
    # Listed with batch entries only: the mid formulas find no mid-cpu limit (quota -1),
    # never-loosen keeps kubelet's 200000, unscaled.
    listed = decide(pod("LS", "koord-mid", batch_spec(main=("500", "1k", "2Gi"))), ctr, NORMALIZING)
    assert (listed.tier, listed.values) == ("mid", CgroupValues(2, 200_000, GI))
    for decision in (unlisted, listed):
        assert not any("cpuNormalizationRatio" in line for line in render(decision.trace))


def test_an_ls_pod_bound_to_a_cpuset_is_not_scaled_at_pod_level_either() -> None:
    """koordlet's reconciler scales it, after CPUSetAllocator unset its quota; we leave it."""
    status = {"scheduling.koordinator.sh/resource-status": '{"cpuset": "2-3"}'}
    bound = PodView("u", "default", "web", {QOS: "LS"}, status, "", native=KUBELET_QUOTA)
    decision = decide_pod(bound, NORMALIZING)
    assert (decision.tier, decision.values) == ("prod", None)
    assert "bound to cpuset 2-3" in render(decision.trace)[-1]


def test_a_pod_whose_kubelet_quota_is_unlimited_stays_unlimited_at_any_ratio() -> None:
    """A pod with a container without a CPU limit has no pod quota from kubelet.

    koordlet's reconciler writes the sum of the limits it finds (a partial sum) as the pod's
    quota, even at ratio 1.0; here the pod's own quota is what is scaled, and it has none.
    """
    for ratio in ("1.0", "1.2"):
        config = policy(
            f"rules: {{cpuNormalizationRatio: {ratio}}}\ntiers: [{{name: prod, priorityClasses: "
            "[koord-prod, None], qosClasses: [LS, None], calculator: cpu-normalization}]"
        )
        unlimited = pod("LS", native=NativeLimits(memory_limit=GI))
        decision = decide_pod(unlimited, config)
        assert (decision.tier, decision.values) == ("prod", None)


def test_a_ratio_change_below_a_hundredth_still_changes_the_quota() -> None:
    """koordlet ignores a ratio change below 0.01; the configured ratio is always the one used."""
    values = []
    for ratio in ("1.2", "1.205"):
        config = policy(
            f"rules: {{cpuNormalizationRatio: {ratio}}}\ntiers: [{{name: prod, priorityClasses: "
            "[koord-prod], qosClasses: [LS], calculator: cpu-normalization}]"
        )
        ctr = ContainerView("c0", "main", KUBELET_QUOTA)
        values.append(decide(pod("LS", "koord-prod"), ctr, config).values)
    # ceil(200000 / 1.2) and ceil(200000 / 1.205)
    assert values == [CgroupValues(None, 166_667, None), CgroupValues(None, 165_976, None)]


def test_a_quota_with_a_50ms_period_is_scaled_in_its_own_period() -> None:
    """kubelet with --cpu-cfs-quota-period=50ms gives 1 CPU a quota of 50000 per 50000 us.

    koordlet's reconciler takes the quota from the CPU limit with a 100000 us period and
    would write ceil(100000 / ratio) into the 50 ms period: twice the CPU meant.
    """
    ctr = ContainerView("c0", "main", NativeLimits(cpu_quota=50_000, cpu_period=50_000))
    decision = decide(pod("LS", "koord-prod"), ctr, NORMALIZING)
    assert decision.values == CgroupValues(None, 41_667, None)  # ceil(50000 / 1.2)


def test_a_negative_limit_below_nano_resolution_is_one_as_koordlet_reads_it() -> None:
    """apimachinery keeps -1e-10 as an inf.Dec of -1n, whose Value() is 1 (scaledValue
    truncates toward zero and adds 1 for the remainder): a limit of 1 milli-core, quota
    1000 (its minimum), as koordlet sets; `-1n` itself is int64-backed, Value() -1: none."""
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("1e-10", "-1e-10", None))))
    assert decision.values == CgroupValues(2, 1000, -1)
    decision = decide(pod("BE", "koord-batch", batch_spec(main=("1e-10", "-1n", None))))
    assert decision.values == CgroupValues(2, -1, -1)
