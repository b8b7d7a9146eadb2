"""The pods and containers the plugin remembers, with kubelet's values and the plugin's own.

Kept so that a reload reaches the workloads that run now (plan.py), a
Synchronize's pod writes can tell a pod that is gone, and a container's cgroup
can be found again. Each view's `native` is kubelet's baseline for it
(baseline.py); `applied` holds what the plugin put in force, so that a field no
tier claims any more can be given back. Bounded by what the runtime runs: a pod
or container is forgotten when the runtime removes it, and a Synchronize starts
afresh.

Kubelet's baseline is owned here: it moves only through the named methods below (a pod's
baseline learnt or guessed, a container adjusted at its creation or resized, values applied,
a pod met again or listed by a Synchronize). So is what a pod's record holds (`record_change`:
when it must be written) and how a pod or container is restored from its record (`meet_pod`,
`remember_pod`, `take_container`); reading the cgroups and the record files is the caller's
(plugin/records.py), which passes in what it read.

A pod is its uid, not its sandbox: kubelet runs a new sandbox for a pod whose sandbox died,
with the same uid and in the same pod cgroup, and runs one at a time. Known keeps one
sandbox per uid (`sandbox_of`); a new one takes over the pod's baseline and what the plugin
set there from the older, which is forgotten (`meet_pod`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from sys import intern

from nri_midbatch.counts import CounterFamily, single
from nri_midbatch.policy import CgroupValues, ContainerView, PodView, QoSClass
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.state.baseline import moved_by, newly_limited, resized_pod_baseline
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
#: records stay, and restore them when the runtime shows them again (`meet_pod`).
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
    #: fields it set; shared instances); absent: none. Read through `applied`.
    _applied: dict[str, CgroupValues] = field(default_factory=dict, repr=False)
    #: pod sandbox ids whose `native` is kubelet's for sure (read from the runtime, the
    #: pod's record, or its cgroup before the plugin wrote it), not a guess
    _baseline_known: set[str] = field(default_factory=set, repr=False)
    #: container ids whose baseline or set fields the native-limits annotation does not
    #: tell (resized, or never annotated): the pod's record keeps them
    _recorded: set[str] = field(default_factory=set, repr=False)
    #: container ids that carry the native-limits annotation (adjusted at their creation):
    #: the others' values are the record's to keep once the plugin sets any
    _annotated: set[str] = field(default_factory=set, repr=False)
    #: pod sandbox id -> the containers its record keeps that the runtime has not shown
    #: since the pod was met again after it was forgotten (`meet_pod`): the record keeps
    #: them until they are shown, or the pod goes
    _unshown: dict[str, dict[str, Kept]] = field(default_factory=dict, repr=False)

    max_pods: int = MAX_PODS
    max_containers: int = MAX_CONTAINERS
    #: Pods (or containers of unknown pods) forgotten to stay within the bounds. A forgotten
    #: pod's record stays (plugin/records.py): met again, the pod is restored from it.
    evicted: int = 0
    #: Whether the records of pods forgotten to stay within the bounds are taken as they were
    #: then (`take_forgotten`). Not while a Synchronize is taken in: its pods have no
    #: containers yet, and their records are as last written.
    collects_forgotten: bool = True
    #: pod uid -> the record of a pod forgotten to stay within the bounds, as it was then,
    #: not written yet: what the plugin knew of it is not lost
    _forgotten: dict[str, PodRecord | None] = field(default_factory=dict, repr=False)
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
                if self.collects_forgotten and self._by_uid.get(uid) == oldest:
                    self._forgotten[uid] = self.record_of(oldest)
                self.remove_pod(oldest)
            self.evicted += 1

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_known_evictions",
            "Pods forgotten because the plugin remembered more than it believes a node runs"
            " (a runtime that sends no removals)",
            self.evicted,
        )

    # Questions.

    @property
    def applied(self) -> Mapping[str, CgroupValues]:
        """Container or pod sandbox id -> the values the plugin put in force there."""
        return self._applied

    def baseline_known(self, pod_id: str) -> bool:
        """Whether the pod's `native` is kubelet's for sure, not a guess."""
        return pod_id in self._baseline_known

    def is_recorded(self, container_id: str) -> bool:
        """Whether the container's pod record keeps its baseline or the plugin's values."""
        return container_id in self._recorded

    # What happens to a pod's or a container's values.

    def set_applied(self, key: str, values: CgroupValues | None) -> None:
        """The plugin put `values` in force on a pod (or a container whose record does not
        change by it); None: nothing of its own is there."""
        if values is None:
            self._applied.pop(key, None)
        else:
            self._applied[key] = values

    def note_set(
        self, container_id: str, claimed: CgroupValues | None, *, by_files: bool = False
    ) -> None:
        """The plugin put `claimed` in force on a container: its record keeps that if the
        runtime cannot tell it (no annotation, or `by_files`: written to its cgroup files,
        which the runtime does not report)."""
        self.set_applied(container_id, claimed)
        if (claimed is not None and container_id not in self._annotated) or by_files:
            self._recorded.add(container_id)

    def adjusted_at_creation(self, container_id: str, values: CgroupValues) -> None:
        """The container was created with `values`, its baseline in the native-limits
        annotation: the runtime tells both after a restart, no record needs them."""
        self._annotated.add(container_id)
        self.set_applied(container_id, values)

    def learn_pod_baseline(self, pod_id: str, view: PodView) -> None:
        """`view.native` is kubelet's for sure: read from the pod's cgroup before the plugin
        wrote it, or told by the runtime."""
        if pod_id in self.pods:
            self.pods[pod_id] = view
        self._baseline_known.add(pod_id)

    def guess_pod_baseline(self, pod_id: str, view: PodView) -> None:
        """`view.native` is kubelet's as far as the plugin can tell, not for sure (kubelet's
        new limit after a resize also counts what the runtime does not tell): it is read back
        from the pod's cgroup before the plugin trusts it."""
        if pod_id in self.pods:
            self.pods[pod_id] = view
        self._baseline_known.discard(pod_id)

    def container_updated(
        self,
        pod_id: str,
        view: ContainerView,
        cgroups_path: str,
        before: ContainerView,
        pod: PodView,
        *,
        told: bool = False,
    ) -> PodView | None:
        """An UpdateContainer told kubelet's values of a known container (`before`: as known):
        returns the pod with its baseline as the resize moved it; None: not moved.

        A resize moves the container's baseline, which only its pod's record keeps, and its
        pod's (`resized_pod_baseline`); a BestEffort pod's cgroup stays unlimited. `told`: the
        runtime told the pod's values at this very call (a pod met here, containerd 2.x),
        kubelet's with the resize already: the pod follows them as they are.
        """
        self.set_container(view.id, pod_id, view, cgroups_path)
        if before.native == view.native:
            return None
        self._recorded.add(view.id)
        if qos_from_cgroup_parent(pod.cgroup_parent) is QoSClass.BE:
            return None
        if told:
            return pod
        siblings = [
            self.containers[other][1].native
            for other in self.containers_of(pod_id)
            if other != view.id
        ]
        native = resized_pod_baseline(pod.native, before.native, view.native, siblings)
        moved = replace(pod, native=native)
        if newly_limited(pod.native, native):
            # Kubelet's new pod limit also counts containers not created yet and the
            # overhead, which the runtime may not tell: read back from the pod's cgroup once
            # kubelet has written it.
            self.guess_pod_baseline(pod_id, moved)
        elif pod_id in self.pods:
            self.pods[pod_id] = moved
        return moved

    # Records: what a pod's record holds, and pods and containers restored from one.

    def record_of(self, pod_id: str) -> PodRecord | None:
        """What the pod's record must hold; None where nothing needs keeping."""
        pod = self.pods.get(pod_id)
        if pod is None:
            return None
        containers = {
            **self._unshown.get(pod_id, {}),
            **{
                container_id: Kept(
                    self.containers[container_id][1].native, self._applied.get(container_id)
                )
                for container_id in self.containers_of(pod_id)
                if container_id in self._recorded
            },
        }
        applied = self._applied.get(pod_id)
        if applied is None and not containers:
            return None
        # A baseline that is a guess (never read, told, or fixed by the QoS) is not kept:
        # a restarted plugin must not trust it.
        sure = pod_id in self._baseline_known
        return PodRecord(Kept(pod.native, applied) if sure else None, containers)

    def record_change(
        self, pod_id: str, before: PodRecord | bool | None = True
    ) -> tuple[str, PodRecord | None] | None:
        """The pod's uid and what its record must hold now (None: remove it); None where the
        record stays as it is. `before`: what the record held, True if not known."""
        pod = self.pods.get(pod_id)
        if pod is None:
            return None
        record = self.record_of(pod_id)
        if (before is not True and record == before) or (record is None and before is None):
            return None
        return pod.uid, record

    def kept_for(self, pod_id: str, uid: str) -> Kept | None:
        """Kubelet's values for the pod as this process knows them for sure (under this
        sandbox or another of its uid), with what the plugin set there; None: not known."""
        before = pod_id if pod_id in self.pods else self.sandbox_of(uid)
        if before is None or before not in self._baseline_known:
            return None
        return Kept(self.pods[before].native, self._applied.get(before))

    def remember_pod(
        self, pod_id: str, view: PodView, applied: CgroupValues | None, *, sure: bool
    ) -> PodView:
        """Remember the pod with what the plugin set there; `sure`: its baseline is kubelet's
        (not a guess). Returns the view kept (`add_pod`)."""
        view = self.add_pod(pod_id, view)
        if sure:
            self._baseline_known.add(pod_id)
        self.set_applied(pod_id, applied)
        return view

    def meet_pod(
        self,
        pod_id: str,
        view: PodView,
        record: PodRecord | None,
        *,
        told: bool,
        kept_first: bool = False,
    ) -> PodView:
        """Remember a sandbox the plugin does not know; returns the view kept.

        `view.native`: kubelet's values as the runtime or the pod's QoS class tell them
        (`told`), which win; else those of the pod's sandbox the plugin knows (an older one,
        dead: forgotten now), else its `record`'s (read where no sandbox of its uid is known).
        `kept_first`: those two win over the told ones (an UpdatePodSandbox's pod carries the
        resize it asks for, which may yet fail). What the plugin set on the pod carries over
        from either, so that it can be given back; so do its record's containers, until the
        runtime shows them.
        """
        kept: Kept | None = None
        unshown: Mapping[str, Kept] = {}
        sure = told
        twin = self.sandbox_of(view.uid)
        if twin is not None:
            kept = Kept(self.pods[twin].native, self._applied.get(twin))
            sure = sure or twin in self._baseline_known
            if twin != pod_id:
                self.remove_pod(twin)
        elif record is not None:
            kept, unshown = record.pod, record.containers
            sure = sure or kept is not None
        if kept is not None and (kept_first or not told):
            view = replace(view, native=kept.kubelet)
        view = self.remember_pod(pod_id, view, None if kept is None else kept.applied, sure=sure)
        if unshown:
            self._unshown[pod_id] = dict(unshown)
        return view

    def unshown_of(self, pod_id: str) -> Mapping[str, Kept]:
        """The containers the pod's record keeps that the runtime has not shown since the pod
        was met again (`meet_pod`)."""
        return self._unshown.get(pod_id, {})

    def take_forgotten(self, uid: str | None = None) -> dict[str, PodRecord | None]:
        """The records of pods forgotten to stay within the bounds (all, or `uid`'s), as they
        were then and not written yet: the caller's to write or use from now on."""
        if uid is None:
            taken, self._forgotten = self._forgotten, {}
            return taken
        if uid not in self._forgotten:
            return {}
        return {uid: self._forgotten.pop(uid)}

    @property
    def forgot(self) -> bool:
        """Whether pods were forgotten whose records are not taken yet (`take_forgotten`)."""
        return bool(self._forgotten)

    def take_container(
        self,
        previous: Known,
        record: PodRecord | None,
        pod_id: str,
        view: ContainerView,
        path: str,
        is_head: bool,
        current: CgroupValues,
        records_kept: bool,
    ) -> tuple[ContainerView, CgroupValues | None, bool]:
        """Remember a container a Synchronize listed, with kubelet's values: returns its view,
        what of it is the plugin's, and whether its pod's record must keep them. `path`,
        `is_head`: its cgroups path as `split_path` gives it.

        In order: what this process knew (`previous`: the runtime restarted), the pod's
        record, the native-limits annotation (then the plugin's are the values that differ
        from kubelet's: the runtime keeps what the plugin set), and last what it holds (a
        container created while no plugin ran: nothing of it is the plugin's). With records
        kept, a container in none of them never had a value of the plugin's, so what it holds
        is kubelet's for sure. What is the plugin's is the caller's to note, once decided.
        """
        annotated = view.native_known
        entry = previous.containers.get(view.id)
        if entry is not None:
            restored = entry[1], previous._applied.get(view.id), view.id in previous._recorded
        elif record is not None and (kept := record.containers.get(view.id)) is not None:
            restored = replace(view, native=kept.kubelet, native_known=True), kept.applied, True
        elif annotated:
            restored = view, moved_by(current, view.native), False
        elif records_kept:
            restored = replace(view, native_known=True), None, False
        else:
            restored = view, None, False
        self.set_split(view.id, pod_id, restored[0], path, is_head)
        if annotated:
            self._annotated.add(view.id)
        if restored[2]:
            self._recorded.add(view.id)
        return restored

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
        unshown = self._unshown.get(pod_id)
        if unshown is not None and unshown.pop(container_id, None) is not None and not unshown:
            del self._unshown[pod_id]
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
        self._applied.pop(container_id, None)
        self._recorded.discard(container_id)
        self._annotated.discard(container_id)

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
        self._applied.pop(pod_id, None)
        self._baseline_known.discard(pod_id)
        self._unshown.pop(pod_id, None)
        for container_id in self._by_pod.pop(pod_id, ()):
            del self.containers[container_id]
            self._forget_path(container_id)
            self._applied.pop(container_id, None)
            self._recorded.discard(container_id)
            self._annotated.discard(container_id)

    def _forget_path(self, container_id: str) -> None:
        self._path_heads.pop(container_id, None)
        self._paths.pop(container_id, None)
