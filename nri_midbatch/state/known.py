"""The pods and containers the plugin remembers, with kubelet's values and the plugin's own.

Kept so that a reload reaches the workloads that run now (plan.py), a
Synchronize's pod writes can tell a pod that is gone, and a container's cgroup
can be found again. Each view's `native` is kubelet's baseline for it
(baseline.py); `applied` holds what the plugin put in force, so that a field no
tier claims any more can be given back. Bounded by what the runtime runs: a pod
or container is forgotten when the runtime removes it, and a Synchronize starts
afresh.

A pod is its uid, not its sandbox: kubelet runs a new sandbox for a pod whose sandbox died,
with the same uid and in the same pod cgroup, and runs one at a time. Known keeps one
sandbox per uid (`sandbox_of`); a new one takes over the pod's baseline and what the plugin
set there from the older, which is forgotten (plugin/records.py `meet`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from sys import intern

from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.state.baseline import moved_by
from nri_midbatch.state.store import Kept, PodRecord


def split_path(cgroups_path: str, container_id: str) -> tuple[str, bool]:
    """The path as Known keeps it: (its head, True) if it ends with the id, else (it, False).

    Runtimes name a container's cgroup after its id, last:
    `slice:cri-containerd:<id>` (systemd) or `/kubepods/.../<id>` (cgroupfs).
    The head, the path less the id, is one string for all of a pod's
    containers: 1.7 MB less for 10,000.
    """
    if container_id and cgroups_path.endswith(container_id):
        return intern(cgroups_path[: -len(container_id)]), True
    return cgroups_path, False


#: Ten times the largest node we claim (1,000 pods, 10,000 containers): past this a runtime
#: that never sends removals (nor a Synchronize, which starts afresh) is not believed, and the
#: pods remembered first are forgotten (about 2 KB each). Their baselines are not: their
#: records stay, and restore them when the runtime shows them again (plugin/records.py).
MAX_PODS = 10_000
MAX_CONTAINERS = 100_000


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
    #: with (see split_path); paths that do not end with the id: _paths
    _path_heads: dict[str, str] = field(default_factory=dict, repr=False)
    _paths: dict[str, str] = field(default_factory=dict, repr=False)
    #: pod sandbox id -> its containers' ids; a list, as a pod has a handful
    _by_pod: dict[str, list[str]] = field(default_factory=dict, repr=False)
    #: container id or pod sandbox id -> the values the plugin put in force there (the
    #: fields it set; shared instances); absent: none
    applied: dict[str, CgroupValues] = field(default_factory=dict)
    #: pod sandbox ids whose `native` is kubelet's for sure (read from the runtime, the
    #: pod's record, or its cgroup before the plugin wrote it), not a guess
    pod_baseline_known: set[str] = field(default_factory=set)
    #: container ids whose baseline or set fields the native-limits annotation does not
    #: tell (resized, or never annotated): the pod's record keeps them
    recorded: set[str] = field(default_factory=set)
    #: container ids that carry the native-limits annotation (adjusted at their creation):
    #: the others' values are the record's to keep once the plugin sets any
    annotated: set[str] = field(default_factory=set)
    #: pod sandbox id -> the containers its record keeps that the runtime has not shown
    #: since the pod was met again after it was forgotten (plugin/records.py `meet`): the
    #: record keeps them until they are shown, or the pod goes
    unshown: dict[str, dict[str, Kept]] = field(default_factory=dict)

    max_pods: int = MAX_PODS
    max_containers: int = MAX_CONTAINERS
    #: Pods (or containers of unknown pods) forgotten to stay within the bounds. A forgotten
    #: pod's record stays (plugin/records.py): met again, the pod is restored from it.
    evicted: int = 0
    #: pod uid -> the record of a pod forgotten to stay within the bounds, as it was then,
    #: to be written (plugin/records.py `keep_forgotten`): what the plugin knew of it and had
    #: not written yet is not lost. None: not collected (a Synchronize being taken in, whose
    #: pods have no containers yet: their records are as last written)
    forgotten_records: dict[str, PodRecord | None] | None = field(default_factory=dict)
    #: pod uid -> the sandbox of it last remembered (one a uid but while a Synchronize is
    #: taken in: `keep_sandbox`)
    _by_uid: dict[str, str] = field(default_factory=dict, repr=False)

    def _make_room(self) -> None:
        while len(self.pods) > self.max_pods or len(self.containers) > self.max_containers:
            oldest = next(iter(self.pods), None)
            if oldest is None:
                # Containers of pods never told of: the oldest of those go.
                self.forget_container(next(iter(self.containers)))
            else:
                uid = self.pods[oldest].uid
                if self.forgotten_records is not None and self._by_uid.get(uid) == oldest:
                    self.forgotten_records[uid] = self.record_of(oldest)
                self.remove_pod(oldest)
            self.evicted += 1

    def set_applied(self, key: str, values: CgroupValues | None) -> None:
        if values is None:
            self.applied.pop(key, None)
        else:
            self.applied[key] = values

    def note_set(self, container_id: str, claimed: CgroupValues | None) -> None:
        """The plugin put `claimed` in force on a container: its record keeps that if the
        runtime cannot tell it (no annotation)."""
        self.set_applied(container_id, claimed)
        if claimed is not None and container_id not in self.annotated:
            self.recorded.add(container_id)

    def record_of(self, pod_id: str) -> PodRecord | None:
        """What the pod's record must hold; None where nothing needs keeping."""
        known = self
        pod = known.pods.get(pod_id)
        if pod is None:
            return None
        containers = {
            **known.unshown.get(pod_id, {}),
            **{
                container_id: Kept(
                    known.containers[container_id][1].native, known.applied.get(container_id)
                )
                for container_id in known.containers_of(pod_id)
                if container_id in known.recorded
            },
        }
        applied = known.applied.get(pod_id)
        if applied is None and not containers:
            return None
        # A baseline that is a guess (never read, told, or fixed by the QoS) is not kept:
        # a restarted plugin must not trust it.
        sure = pod_id in known.pod_baseline_known
        return PodRecord(Kept(pod.native, applied) if sure else None, containers)

    def containers_of(self, pod_id: str) -> tuple[str, ...]:
        return tuple(self._by_pod.get(pod_id, ()))

    def sandbox_of(self, uid: str) -> str | None:
        """The sandbox id under which the pod `uid` is remembered; None: not remembered."""
        return self._by_uid.get(uid)

    def keep_sandbox(self, uid: str, pod_id: str, others: Iterable[str]) -> None:
        """`pod_id` is the pod's sandbox; `others` of the same uid (older, dead) are forgotten."""
        for other in others:
            if other != pod_id:
                self.remove_pod(other)
        self._by_uid[uid] = pod_id

    def add_pod(self, pod_id: str, pod: PodView) -> PodView:
        """Remember the pod; returns the view kept, which owns its maps.

        Views of NRI messages share the messages' maps; copies keep a
        remembered pod from pinning the whole request in memory. Their keys,
        the same few on every pod, are interned, so that a thousand
        remembered pods share them; so are their values, as the pods of a job
        carry the same extended-resource spec (1-2 KB) and most of the same
        labels: 3 MB less for the benchmark's 1,000 pods. Interned strings are
        freed with their last pod (CPython 3.11, and 3.12 from 3.12.6; 3.12.0
        to 3.12.5 kept every interned string for good).
        """
        labels, annotations = pod.labels, pod.annotations
        kept = self.pods[pod_id] = PodView(
            uid=pod.uid,
            namespace=pod.namespace,
            name=pod.name,
            labels={intern(key): intern(labels[key]) for key in labels},
            annotations={intern(key): intern(annotations[key]) for key in annotations},
            cgroup_parent=pod.cgroup_parent,
            native=pod.native,
        )
        self._by_uid[kept.uid] = pod_id
        if len(self.pods) > self.max_pods:
            self._make_room()
        return kept

    def set_container(
        self, container_id: str, pod_id: str, container: ContainerView, cgroups_path: str = ""
    ) -> None:
        self.set_split(container_id, pod_id, container, *split_path(cgroups_path, container_id))

    def set_split(
        self, container_id: str, pod_id: str, container: ContainerView, path: str, is_head: bool
    ) -> None:
        """`set_container` with its path already split (`split_path`), as a Synchronize holds it."""
        if container_id in self.containers:
            self._unlink(container_id)  # a new view of it: what was applied stays
        self.containers[container_id] = (pod_id, container)
        if is_head:
            self._path_heads[container_id] = path
        elif path:
            self._paths[container_id] = path
        self._by_pod.setdefault(pod_id, []).append(container_id)
        unshown = self.unshown.get(pod_id)
        if unshown is not None and unshown.pop(container_id, None) is not None and not unshown:
            del self.unshown[pod_id]
        if len(self.containers) > self.max_containers:
            self._make_room()

    def cgroups_path(self, container_id: str) -> str:
        """The runtime's path for the container's cgroup; empty where it gave none."""
        head = self._path_heads.get(container_id)
        if head is not None:
            return head + container_id
        return self._paths.get(container_id, "")

    def forget_container(self, container_id: str) -> None:
        self._unlink(container_id)
        self.applied.pop(container_id, None)
        self.recorded.discard(container_id)
        self.annotated.discard(container_id)

    def _unlink(self, container_id: str) -> None:
        entry = self.containers.pop(container_id, None)
        self._forget_path(container_id)
        if entry is None:
            return
        siblings = self._by_pod[entry[0]]
        siblings.remove(container_id)
        if not siblings:
            del self._by_pod[entry[0]]

    def remove_pod(self, pod_id: str) -> None:
        pod = self.pods.pop(pod_id, None)
        if pod is not None and self._by_uid.get(pod.uid) == pod_id:
            del self._by_uid[pod.uid]
        self.applied.pop(pod_id, None)
        self.pod_baseline_known.discard(pod_id)
        self.unshown.pop(pod_id, None)
        for container_id in self._by_pod.pop(pod_id, ()):
            del self.containers[container_id]
            self._forget_path(container_id)
            self.applied.pop(container_id, None)
            self.recorded.discard(container_id)
            self.annotated.discard(container_id)

    def _forget_path(self, container_id: str) -> None:
        self._path_heads.pop(container_id, None)
        self._paths.pop(container_id, None)


def container_at_sync(
    previous: Known,
    record: PodRecord | None,
    view: ContainerView,
    current: CgroupValues,
    records_kept: bool,
) -> tuple[ContainerView, CgroupValues | None, bool]:
    """A running container's view with kubelet's values, what of it is the plugin's, and
    whether its pod's record must keep them.

    In order: what this process knew (the runtime restarted), the pod's record, the
    native-limits annotation (then the plugin's are the values that differ from kubelet's:
    the runtime keeps what the plugin set), and last what it holds (a container created while
    no plugin ran: nothing of it is the plugin's). With records kept, a container in none of
    them never had a value of the plugin's, so what it holds is kubelet's for sure.
    """
    entry = previous.containers.get(view.id)
    if entry is not None:
        return entry[1], previous.applied.get(view.id), view.id in previous.recorded
    kept = None if record is None else record.containers.get(view.id)
    if kept is not None:
        return replace(view, native=kept.kubelet, native_known=True), kept.applied, True
    if view.native_known:
        return view, moved_by(current, view.native), False
    if records_kept:
        return replace(view, native_known=True), None, False
    return view, None, False
