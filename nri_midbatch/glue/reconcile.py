"""What a configuration change means for containers that already run.

The plugin remembers the pods and containers it has seen (`Known`); a new
policy is compared with the old one for each of them, and only values that
differ are planned. Applying the plan is the caller's business: through the
runtime's UpdateContainers where that is safe, else through the cgroup files.
Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from sys import intern

from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)


@dataclass
class Known:
    """The live pods and containers, as the runtime last told us of them.

    Containers are written through `set_container` and `forget_container`,
    which keep an index by pod: forgetting a pod then costs its own
    containers, not a walk over every container on the node (1.3 ms per
    RemovePodSandbox with 10,000 containers known).
    """

    pods: dict[str, PodView] = field(default_factory=dict)
    #: container id -> (pod sandbox id, container); read-only outside this class
    containers: dict[str, tuple[str, ContainerView]] = field(default_factory=dict)
    #: container id -> the runtime's cgroups path for it, less the id it ends
    #: with (see _path_head); paths that do not end with the id: _paths
    _path_heads: dict[str, str] = field(default_factory=dict, repr=False)
    _paths: dict[str, str] = field(default_factory=dict, repr=False)
    #: pod sandbox id -> its containers' ids; a list, as a pod has a handful
    _by_pod: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def add_pod(self, pod_id: str, pod: PodView) -> PodView:
        """Remember the pod; returns the view kept, which owns its maps.

        Views of NRI messages share the messages' maps; copies keep a
        remembered pod from pinning the whole request in memory. Their keys,
        the same few on every pod, are interned, so that a thousand
        remembered pods share them.
        """
        labels, annotations = pod.labels, pod.annotations
        kept = self.pods[pod_id] = PodView(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            labels={intern(key): labels[key] for key in labels},
            annotations={intern(key): annotations[key] for key in annotations},
            cgroup_parent=pod.cgroup_parent,
            native=pod.native,
        )
        return kept

    def set_container(
        self, container_id: str, pod_id: str, container: ContainerView, cgroups_path: str = ""
    ) -> None:
        if container_id in self.containers:
            self.forget_container(container_id)
        self.containers[container_id] = (pod_id, container)
        if container_id and cgroups_path.endswith(container_id):
            self._path_heads[container_id] = _path_head(cgroups_path, container_id)
        elif cgroups_path:
            self._paths[container_id] = cgroups_path
        self._by_pod.setdefault(pod_id, []).append(container_id)

    def cgroups_path(self, container_id: str) -> str:
        """The runtime's path for the container's cgroup; empty where it gave none."""
        head = self._path_heads.get(container_id)
        if head is not None:
            return head + container_id
        return self._paths.get(container_id, "")

    def forget_container(self, container_id: str) -> None:
        entry = self.containers.pop(container_id, None)
        self._forget_path(container_id)
        if entry is None:
            return
        siblings = self._by_pod[entry[0]]
        siblings.remove(container_id)
        if not siblings:
            del self._by_pod[entry[0]]

    def remove_pod(self, pod_id: str) -> None:
        self.pods.pop(pod_id, None)
        for container_id in self._by_pod.pop(pod_id, ()):
            del self.containers[container_id]
            self._forget_path(container_id)

    def _forget_path(self, container_id: str) -> None:
        self._path_heads.pop(container_id, None)
        self._paths.pop(container_id, None)


def _path_head(cgroups_path: str, container_id: str) -> str:
    """The path less the container id at its end, one string for all of a pod's containers.

    Runtimes name a container's cgroup after its id, last:
    `slice:cri-containerd:<id>` (systemd) or `/kubepods/.../<id>` (cgroupfs).
    Held once per pod instead of once per container: 1.7 MB less for 10,000.
    """
    return intern(cgroups_path[: -len(container_id)])


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
