"""What a configuration change means for containers that already run.

The plugin remembers the pods and containers it has seen (known.py); a new
policy is compared with the old one for each of them, and only values that
differ are planned. Applying the plan is the caller's business: through the
runtime's UpdateContainers where that is safe, else through the cgroup files.
Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

from nri_midbatch.glue.known import Known
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)


@dataclass(frozen=True, slots=True)
class ContainerChange:
    pod: PodView
    container: ContainerView
    values: CgroupValues
    #: The runtime's path for the container's cgroup; empty: derive containerd's.
    cgroups_path: str = ""
    #: What the old configuration gave it; None: it was in no tier (kubelet's values).
    before: CgroupValues | None = None


@dataclass(frozen=True, slots=True)
class PodChange:
    pod: PodView
    values: CgroupValues


@dataclass(frozen=True, slots=True)
class Plan:
    containers: tuple[ContainerChange, ...]
    pods: tuple[PodChange, ...]

    def __bool__(self) -> bool:
        return bool(self.containers or self.pods)


def plan(
    known: Known,
    old: Policy | None,
    new: Policy,
    *,
    pods_before: bool = True,
    pods_after: bool = True,
) -> Plan:
    """Values that `new` gives differently from `old`, for every known workload.

    `old` None: every value `new` gives (what the workloads should hold now).

    `pods_before`/`pods_after`: whether pod cgroups are ours to write under
    the old and the new configuration (`cgroups.podLevel`). Pods are planned
    only when they are ours now, and all of them when they were not before.

    A workload that leaves every tier under `new` is not planned: we do not
    know the values kubelet gave it, so it keeps its last ones until it is
    recreated (documented in the configuration guide).
    """
    containers = []
    for container_id, (pod_id, container) in known.containers.items():
        pod = known.pods.get(pod_id)
        if pod is None:
            continue
        after = decide_container(pod, container, new).values
        before = None if old is None else decide_container(pod, container, old).values
        if after is not None and (old is None or after != before):
            path = known.cgroups_path(container_id)
            containers.append(ContainerChange(pod, container, after, path, before))
    pods = []
    for pod in known.pods.values() if pods_after else ():
        after = decide_pod(pod, new).values
        if after is not None and (
            old is None or not pods_before or after != decide_pod(pod, old).values
        ):
            pods.append(PodChange(pod, after))
    return Plan(tuple(containers), tuple(pods))


def split_pods(plan: Plan) -> tuple[tuple[PodChange, ...], tuple[PodChange, ...]]:
    """The plan's pods to write before their containers, and those to write after.

    A pod goes up before its containers and down after them (lowering.py):
    first come the pods with a container whose CFS quota may rise (on cgroup
    v1 a child's quota above its pod's is EINVAL), including one that was in
    no tier, whose kubelet values are unknown here.
    """
    up = {
        change.pod.cgroup_parent
        for change in plan.containers
        if change.before is None or raises_quota(change.before.cpu_quota, change.values.cpu_quota)
    }
    first = tuple(change for change in plan.pods if change.pod.cgroup_parent in up)
    last = tuple(change for change in plan.pods if change.pod.cgroup_parent not in up)
    return first, last


def raises_quota(current: int, new: int) -> bool:
    """Whether a CFS quota (-1: unlimited) goes up, which a v1 pod quota must allow first."""
    return current >= 0 and (new < 0 or new > current)
