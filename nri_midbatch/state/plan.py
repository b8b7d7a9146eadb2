"""What a configuration change means for the containers and pods that already run.

For every workload the plugin remembers (known.py), the values to put in force now
(baseline.py's `target`: the tier's values, and kubelet's for every field the plugin set
before and no tier claims now) are compared with what the plugin last put in force there:
only workloads that differ are planned. Comparing with what was applied, not with the previous
configuration, makes the outcome the same whatever came before: a pass that failed halfway, or
a reload that came before it, is completed by the next one. Applying the plan is the caller's
business: through the runtime's UpdateContainers where that is safe, else through the cgroup
files; each change says what is applied once it is done (`claimed`). Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)
from nri_midbatch.state.baseline import kubelet_value, target
from nri_midbatch.state.known import Known


@dataclass(frozen=True, slots=True)
class ContainerChange:
    pod: PodView
    container: ContainerView
    #: What to put in force.
    values: CgroupValues
    #: The runtime's path for the container's cgroup; empty: derive containerd's.
    cgroups_path: str = ""
    #: What the plugin had put in force; None: nothing (kubelet's values held).
    before: CgroupValues | None = None
    #: What is the plugin's once `values` are in force (None: nothing, all given back).
    claimed: CgroupValues | None = None


@dataclass(frozen=True, slots=True)
class PodChange:
    pod: PodView
    values: CgroupValues
    pod_id: str = ""
    before: CgroupValues | None = None
    claimed: CgroupValues | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    containers: tuple[ContainerChange, ...]
    pods: tuple[PodChange, ...]

    def __bool__(self) -> bool:
        return bool(self.containers or self.pods)


def plan(known: Known, policy: Policy, *, containers: bool = True, pods: bool = True) -> Plan:
    """Every workload whose values in force under `policy` differ from what was applied.

    `containers`, `pods`: whether the plugin claims values there (Settings.enforces: neither
    in `mode: observe`, no pod with `cgroups.podLevel: false`); where it claims none,
    everything it set there is given back.
    """
    applied = known.applied
    container_changes = []
    for container_id, (pod_id, container) in known.containers.items():
        pod = known.pods.get(pod_id)
        if pod is None:
            continue
        before = applied.get(container_id)
        decision = decide_container(pod, container, policy) if containers else None
        values, claimed = target(decision, before, container.native, enforce=containers)
        if values is not None and values != before:
            path = known.cgroups_path(container_id)
            container_changes.append(ContainerChange(pod, container, values, path, before, claimed))
    pod_changes = []
    for pod_id, pod in known.pods.items():
        before = applied.get(pod_id)
        decision = decide_pod(pod, policy) if pods else None
        values, claimed = target(decision, before, pod.native, enforce=pods)
        if values is not None and values != before:
            pod_changes.append(PodChange(pod, values, pod_id, before, claimed))
    return Plan(tuple(container_changes), tuple(pod_changes))


def split_pods(plan: Plan) -> tuple[tuple[PodChange, ...], tuple[PodChange, ...]]:
    """The plan's pods to write before their containers, and those to write after.

    A pod goes up before its containers and down after them (lowering.py):
    first come the pods with a container whose CFS quota rises (on cgroup v1
    a child's quota above its pod's is EINVAL).
    """
    up = {
        change.pod.cgroup_parent
        for change in plan.containers
        if raises_quota(
            quota_in_force(change.before, change.container.native), change.values.cpu_quota
        )
    }
    first = tuple(change for change in plan.pods if change.pod.cgroup_parent in up)
    last = tuple(change for change in plan.pods if change.pod.cgroup_parent not in up)
    return first, last


def raises_quota(current: int, new: int) -> bool:
    """Whether a CFS quota (-1: unlimited) goes up, which a v1 pod quota must allow first."""
    return current >= 0 and (new < 0 or new > current)


def quota_in_force(applied: CgroupValues | None, kubelet: NativeLimits) -> int:
    """The quota a pod or container holds: the plugin's, else kubelet's."""
    if applied is not None:
        return applied.cpu_quota
    quota = kubelet_value(kubelet, "cpu_quota")
    assert quota is not None  # only the shares can be unknown
    return quota
