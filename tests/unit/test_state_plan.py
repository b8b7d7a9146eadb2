"""What a configuration change plans for workloads that already run (state.plan, Known).

Real policies from compile_policy; values per Koordinator's formulas (1k batch-cpu limit ->
quota 100000, 500 request -> 512 shares), divided by cpuNormalizationRatio where set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest

from nri_midbatch.config.compile import compile_policy
from nri_midbatch.config.model import Config, load_config_text
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    NativeLimits,
    PodView,
    Policy,
)
from nri_midbatch.state.known import Known
from nri_midbatch.state.plan import ContainerChange, Plan, PodChange, plan
from tests.factory import MI, PRIORITY, QOS, SPEC, pod_view, spec

APP = {
    "requests": {"kubernetes.io/batch-cpu": "500"},
    "limits": {"kubernetes.io/batch-cpu": "1k", "kubernetes.io/batch-memory": "512Mi"},
}
#: No cpu limit: quota -1, which no normalization ratio changes.
NO_CPU_LIMIT = {
    "requests": {"kubernetes.io/batch-cpu": "250"},
    "limits": {"kubernetes.io/batch-memory": "256Mi"},
}
NORMALIZATION_TIER = {
    "name": "cpu-normalization",
    "priorityClasses": ["koord-prod", "None"],
    "qosClasses": ["LS", "None"],
    "calculator": "cpu-normalization",
}
MID_WORKER = {
    "requests": {"kubernetes.io/mid-cpu": "1k"},
    "limits": {"kubernetes.io/mid-cpu": "2k", "kubernetes.io/mid-memory": "1Gi"},
}


def policy(**document: Any) -> Policy:
    return compile_policy(load_config_text(json.dumps(document), "test"))


DEFAULT = policy()
HALVED = policy(rules={"cpuNormalizationRatio": 2.0})
NO_QUOTA = policy(rules={"cfsQuota": False})
#: Only the mid tier: batch pods leave every tier.
MID_ONLY = policy(
    tiers=[
        {
            "name": "mid",
            "priorityClasses": ["koord-mid"],
            "qosClasses": ["BE", "LS"],
            "resources": {"cpu": "kubernetes.io/mid-cpu", "memory": "kubernetes.io/mid-memory"},
        }
    ]
)


def pod(
    uid: str,
    containers: Mapping[str, Any],
    *,
    priority: str = "koord-batch",
    qos: str = "BE",
) -> PodView:
    return pod_view(qos, priority, spec(containers), uid=uid)


def known(*pods: tuple[str, PodView, list[ContainerView]]) -> Known:
    result = Known()
    for pod_id, view, containers in pods:
        result.add_pod(pod_id, view)
        for container in containers:
            result.set_container(container.id, pod_id, container)
    return result


def settled(node: Known, policy: Policy, *, pod_level: bool = True) -> Known:
    """`node` as the plugin leaves it once `policy`'s plan is in force."""
    result = plan(node, policy, pods=pod_level)
    for change in result.containers:
        node.set_applied(change.container.id, change.claimed)
    for pod_change in result.pods:
        node.set_applied(pod_change.pod_id, pod_change.claimed)
    return node


def summary(result: Plan) -> tuple[dict[str, CgroupValues], dict[str, CgroupValues]]:
    """({container id: values}, {pod uid: values})."""
    containers = {c.container.id: c.values for c in result.containers}
    assert len(containers) == len(result.containers), "a container planned twice"
    pods = {p.pod.uid: p.values for p in result.pods}
    assert len(pods) == len(result.pods), "a pod planned twice"
    return containers, pods


# ---------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------


def test_ratio_plans_only_the_values_it_changes() -> None:
    batch = pod("batch", {"app": APP, "helper": NO_CPU_LIMIT})
    node = known(
        (
            "sandbox-batch",
            batch,
            [
                ContainerView("c-app", "app"),
                # Quota -1 before and after: nothing to do.
                ContainerView("c-helper", "helper"),
                # Kubelet's 30000 is tighter than 100000 and 50000: never loosened, unchanged.
                ContainerView("c-tight", "app", NativeLimits(cpu_quota=30_000)),
                # Not in the spec: never ours.
                ContainerView("c-unlisted", "unlisted"),
            ],
        ),
    )
    containers, pods = summary(plan(settled(node, DEFAULT), HALVED))
    assert containers == {"c-app": CgroupValues(512, 50_000, 512 * MI)}
    # Pod: no pod-level quota (a listed container has no cpu limit), so only -1 -> -1: unchanged.
    assert pods == {}


def test_pod_level_values_are_planned_when_they_change() -> None:
    batch = pod("batch", {"app": APP})
    node = known(("sandbox-batch", batch, [ContainerView("c-app", "app")]))
    result = plan(settled(node, DEFAULT), HALVED)
    (pod_change,) = result.pods
    halved = CgroupValues(512, 50_000, 512 * MI)
    before = CgroupValues(512, 100_000, 512 * MI)
    assert pod_change == PodChange(
        node.pods["sandbox-batch"], halved, "sandbox-batch", before, halved
    )
    (container_change,) = result.containers
    assert container_change.pod == node.pods["sandbox-batch"]
    assert container_change.container == ContainerView("c-app", "app")


def test_pod_cgroups_follow_pod_level_turned_on_and_off() -> None:
    batch = pod("batch", {"app": APP})
    node = known(("sandbox-batch", batch, [ContainerView("c-app", "app")]))
    # Turned on: every pod in a tier is planned, though its values did not change.
    turned_on = plan(settled(node, DEFAULT, pod_level=False), DEFAULT)
    values = CgroupValues(512, 100_000, 512 * MI)
    assert turned_on.pods == (
        PodChange(node.pods["sandbox-batch"], values, "sandbox-batch", None, values),
    )
    assert turned_on.containers == ()
    # Turned off: pod cgroups go back to kubelet's (here unlimited; its shares unknown).
    turned_off = plan(settled(node, DEFAULT), HALVED, pods=False)
    assert [(p.values, p.claimed) for p in turned_off.pods] == [(CgroupValues(None, -1, -1), None)]
    assert len(turned_off.containers) == 1


def test_a_ratio_turned_off_gives_kubelets_quota_back() -> None:
    """Normalization off (ratio 1.0 or none): the scaled quota returns to kubelet's, 100000."""
    web = pod("web", {}, priority="koord-prod", qos="LS")
    kubelet = NativeLimits(cpu_quota=100_000, cpu_period=100_000, cpu_shares=1024)
    web = PodView(
        web.uid, web.namespace, web.name, web.labels, {}, "/kubepods/burstable/podweb", kubelet
    )
    node = known(("s-web", web, [ContainerView("c-web", "web", kubelet)]))
    tiers = [*Config().model_dump(mode="json", by_alias=True)["tiers"], NORMALIZATION_TIER]
    scaled = policy(tiers=tiers, rules={"cpuNormalizationRatio": 1.2})
    off = policy(tiers=tiers, rules={"cpuNormalizationRatio": 1.0})
    assert plan(settled(node, scaled), scaled) == Plan((), ())
    containers, pods = summary(plan(node, off))
    assert containers == {"c-web": CgroupValues(None, 100_000, None)}
    assert pods == {"web": CgroupValues(None, 100_000, None)}
    # Once given back, the quota is kubelet's again, not the plugin's: nothing more to do.
    assert not plan(settled(node, off), off)


@pytest.mark.parametrize(
    ("old", "new"), [(DEFAULT, DEFAULT), (HALVED, policy(rules={"cpuNormalizationRatio": 2.0}))]
)
def test_an_equal_policy_plans_nothing(old: Policy, new: Policy) -> None:
    node = known(("s", pod("batch", {"app": APP}), [ContainerView("c-app", "app")]))
    result = plan(settled(node, old), new)
    assert result == Plan((), ())
    assert not result


def test_disabling_quota_plans_unlimited_quota() -> None:
    node = known(("s", pod("batch", {"app": APP}), [ContainerView("c-app", "app")]))
    containers, pods = summary(plan(settled(node, DEFAULT), NO_QUOTA))
    assert containers == {"c-app": CgroupValues(512, -1, 512 * MI)}
    assert pods == {"batch": CgroupValues(512, -1, 512 * MI)}


def test_containers_without_a_known_pod_are_skipped() -> None:
    node = known(("s", pod("batch", {"app": APP}), [ContainerView("c-app", "app")]))
    # A container whose pod we never heard of (or forgot): nothing to decide it with.
    node.set_container("c-orphan", "sandbox-gone", ContainerView("c-orphan", "app"))
    containers, _ = summary(plan(settled(node, DEFAULT), HALVED))
    assert set(containers) == {"c-app"}


def test_workloads_leaving_every_tier_get_kubelets_values_back() -> None:
    batch = pod("batch", {"app": APP})
    mid = pod("mid", {"worker": MID_WORKER}, priority="koord-mid")
    node = known(
        ("s-batch", batch, [ContainerView("c-app", "app")]),
        ("s-mid", mid, [ContainerView("c-worker", "worker")]),
    )
    # Halving first, so the mid pod's values would change if it were planned ...
    result = plan(settled(node, HALVED), MID_ONLY)
    containers, pods = summary(result)
    # ... the batch pod left every tier: kubelet's values come back (unlimited, its shares
    # unknown here), and mid values go back from 100000 to 200000.
    assert containers == {
        "c-app": CgroupValues(None, -1, -1),
        "c-worker": CgroupValues(1024, 200_000, 1024 * MI),
    }
    assert pods == {
        "batch": CgroupValues(None, -1, -1),
        "mid": CgroupValues(1024, 200_000, 1024 * MI),
    }


def test_malformed_annotations_are_not_planned() -> None:
    broken = PodView(
        uid="bad",
        namespace="default",
        name="bad",
        labels={QOS: "BE", PRIORITY: "koord-batch"},
        annotations={SPEC: "{not json"},
        cgroup_parent="/kubepods/besteffort/podbad",
    )
    node = known(("s", broken, [ContainerView("c", "app")]))
    assert not plan(settled(node, DEFAULT), HALVED)


# ---------------------------------------------------------------------------
# Known
# ---------------------------------------------------------------------------


def test_remove_pod_drops_its_containers_only() -> None:
    node = known(
        ("s-a", pod("a", {"app": APP}), [ContainerView("a1", "app"), ContainerView("a2", "app")]),
        ("s-b", pod("b", {"app": APP}), [ContainerView("b1", "app")]),
    )
    node.remove_pod("s-a")
    assert set(node.pods) == {"s-b"}
    assert set(node.containers) == {"b1"}
    containers, pods = summary(plan(settled(node, DEFAULT), HALVED))
    assert set(containers) == {"b1"}
    assert set(pods) == {"b"}
    # Removing an unknown pod is no error (RemovePodSandbox for a pod we never saw).
    node.remove_pod("s-never")
    assert set(node.pods) == {"s-b"}


def test_add_pod_keeps_copies_of_labels_and_annotations() -> None:
    labels = {QOS: "BE", PRIORITY: "koord-batch"}
    annotations = {SPEC: json.dumps({"containers": {"app": APP}})}
    source = PodView(
        uid="batch",
        namespace="default",
        name="batch",
        labels=labels,
        annotations=annotations,
        cgroup_parent="/kubepods/besteffort/podbatch",
        native=NativeLimits(cpu_quota=400_000),
    )
    node = Known()
    node.add_pod("s", source)
    labels[PRIORITY] = "koord-prod"
    annotations[SPEC] = "{not json"
    labels["extra"] = "x"

    remembered = node.pods["s"]
    assert remembered.labels == {QOS: "BE", PRIORITY: "koord-batch"}
    assert remembered.annotations == {SPEC: json.dumps({"containers": {"app": APP}})}
    assert (remembered.uid, remembered.cgroup_parent) == ("batch", "/kubepods/besteffort/podbatch")
    assert remembered.native == NativeLimits(cpu_quota=400_000)
    # And the remembered pod still plans as the batch pod it was.
    node.set_container("c-app", "s", ContainerView("c-app", "app"))
    containers, _ = summary(plan(settled(node, DEFAULT), HALVED))
    assert containers == {"c-app": CgroupValues(512, 50_000, 512 * MI)}


def test_container_change_carries_the_remembered_views() -> None:
    node = known(("s", pod("batch", {"app": APP}), [ContainerView("c-app", "app")]))
    (change,) = plan(settled(node, DEFAULT), HALVED).containers
    assert isinstance(change, ContainerChange)
    assert change.pod is node.pods["s"]
    assert change.container is node.containers["c-app"][1]


def test_the_runtimes_cgroups_path_travels_with_the_change() -> None:
    node = Known()
    node.add_pod("s", pod("batch", {"app": APP}))
    crio_path = "kubepods-besteffort-podu.slice:crio:c-app"
    node.set_container("c-app", "s", ContainerView("c-app", "app"), crio_path)
    (change,) = plan(settled(node, DEFAULT), HALVED).containers
    assert change.cgroups_path == crio_path
    node.forget_container("c-app")
    assert node.cgroups_path("c-app") == ""
    node.set_container("c-app", "s", ContainerView("c-app", "app"), crio_path)
    node.remove_pod("s")
    assert node.cgroups_path("c-app") == ""


@pytest.mark.parametrize(
    "path",
    [
        "kubepods-besteffort-podu.slice:cri-containerd:{id}",
        "/kubepods/besteffort/podu/{id}",
        "/kubepods/besteffort/podu/{id}/extra",  # not ending with the id
        "",
    ],
)
def test_cgroups_paths_come_back_as_the_runtime_gave_them(path: str) -> None:
    node = Known()
    for container_id in ("c-1", "c-2"):
        node.set_container(
            container_id, "s", ContainerView(container_id, "app"), path.format(id=container_id)
        )
    for container_id in ("c-1", "c-2"):
        assert node.cgroups_path(container_id) == path.format(id=container_id)


def test_a_pods_containers_share_one_kept_path() -> None:
    node = Known()
    for container_id in ("c-1", "c-2"):
        node.set_container(
            container_id, "s", ContainerView(container_id, "app"), f"pod.slice:crio:{container_id}"
        )
    assert node._path_heads["c-1"] is node._path_heads["c-2"]


def test_known_forgets_the_oldest_pods_past_its_bounds() -> None:
    node = Known(max_pods=3, max_containers=4)
    for n in range(5):
        node.add_pod(f"s{n}", pod(f"p{n}", {"app": APP}))
        node.set_applied(f"s{n}", CgroupValues(512, 100_000, 512 * MI))
    assert list(node.pods) == ["s2", "s3", "s4"] and node.evicted == 2
    assert set(node.applied) == {"s2", "s3", "s4"}
    for n in range(5):
        node.set_container(f"c{n}", "s4", ContainerView(f"c{n}", "app"))
    # Past four containers the oldest pods go first, then the pod the containers are in.
    assert len(node.containers) <= 4 and node.evicted > 2
