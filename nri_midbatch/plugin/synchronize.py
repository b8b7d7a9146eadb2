"""The Synchronize pass: every pod and container on the node, brought to the configuration.

The runtime sends the node in chunks (`take`), then waits for one reply
(`reply`): container updates, whose values the runtime applies after it. Pods
are written around that: raised before the reply, lowered once their
containers are (lowering.py), the rest right after it; the containers left as
the runtime reports them are checked against their files by the one pass
(reconcile/ `Reconciler.check_reported`), and every pod's record is kept, after the
reply too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from sys import intern
from typing import Any

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import differs, lowers, set_fields
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.codec import (
    pod_view,
    running_view,
    runtime_pod_baseline,
    set_resources,
)
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.plugin.decisions import Decider
from nri_midbatch.plugin.lowering import Check
from nri_midbatch.plugin.reconcile import Reconciler, Reported
from nri_midbatch.plugin.records import Records
from nri_midbatch.plugin.writes import Writes
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    NativeLimits,
    PodClass,
    PodView,
    QoSClass,
)
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.state.known import Known, split_path
from nri_midbatch.state.plan import raises_quota
from nri_midbatch.state.store import BaselineStore, PodRecord, ReadBudget

#: Kubelet's cgroup for a BestEffort pod: the least shares, no quota, no memory limit.
BESTEFFORT_POD = NativeLimits(cpu_shares=2)


def told_baseline(pod: api.PodSandbox, decide: Decider, method: str) -> NativeLimits | None:
    """Kubelet's pod values as the runtime (containerd 2.x) or the pod's QoS class tell them.

    Runtime values no cgroup file holds (a sum past 64 bits) are refused, logged and counted
    (Decider.holdable): the pod's cgroup tells its values instead.
    """
    native = runtime_pod_baseline(pod)
    if native is not None and not decide.holdable(
        native, method, namespace=pod.namespace, pod=pod.name
    ):
        native = None
    if native is None and qos_from_cgroup_parent(pod.linux.cgroup_parent) is QoSClass.BE:
        return BESTEFFORT_POD
    return native


_RUNNING_STATES = frozenset({api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED})


class WaitingContainers:
    """A Synchronize's running containers, waiting as views for the pods of later chunks.

    Each is (pod id, view, cgroups path, whether that is the path's head, current values),
    held in one flat list rather than a tuple each: 10,000 tuples held through a large
    Synchronize would be allocated among the objects the plugin keeps, and leave the heap
    fragmented for good once freed (2.8 MB of resident memory), as the decision lines would
    (decision_log.py). Iterating yields each container's fields as one tuple, reused.
    """

    __slots__ = ("_flat",)

    def __init__(self) -> None:
        self._flat: list[Any] = []

    def add(
        self, pod_id: str, view: ContainerView, path: str, is_head: bool, current: CgroupValues
    ) -> None:
        self._flat += (pod_id, view, path, is_head, current)

    def __iter__(self) -> Iterator[tuple[str, ContainerView, str, bool, CgroupValues]]:
        fields = iter(self._flat)
        return zip(fields, fields, fields, fields, fields, strict=True)

    def pod_ids(self) -> set[str]:
        """The pods with a running container."""
        return set(self._flat[::5])


class SyncPart:
    """What a Synchronize's chunks brought so far, without their protobuf.

    Strings shared by a pod's containers where they can be (its id, the head of its
    containers' paths, as Known keeps them).
    """

    __slots__ = (
        "budget",
        "containers",
        "known",
        "listed",
        "records",
        "stored",
        "twins",
        "uids",
    )

    def __init__(self, stored: frozenset[str], bounds: Known) -> None:
        self.known = Known(max_pods=bounds.max_pods, max_containers=bounds.max_containers)
        self.known.evicted = bounds.evicted
        # Its pods get their containers at the reply: their records stay as last written.
        self.known.collects_forgotten = False
        self.containers = WaitingContainers()
        #: Pods and containers the runtime listed, running or not.
        self.listed = [0, 0]
        #: The uids of the pods listed, forgotten past the bounds or not: their records stay.
        self.uids: set[str] = set()
        #: uid -> its sandboxes, for the uids listed with more than one (a dead one kubelet
        #: has not removed yet, and the one it runs now)
        self.twins: dict[str, list[str]] = {}
        #: The uids of the pods with a record, and the records read (by pod sandbox id).
        self.stored = stored
        self.records: dict[str, PodRecord] = {}
        #: The bytes of records this Synchronize may still read.
        self.budget = ReadBudget()


class SynchronizePass:
    def __init__(
        self,
        live: Live,
        store: BaselineStore,
        counters: Counters,
        after_reply: AfterReply,
        decide: Decider,
        writes: Writes,
        records: Records,
        reconcile: Reconciler,
        *,
        dry_run: bool,
    ) -> None:
        """dry_run: write no cgroup file (replay, audits)."""
        self._live = live
        self._store = store
        self._counters = counters
        self._after_reply = after_reply
        self._dry_run = dry_run
        self._reconcile = reconcile
        self._decide = decide
        self._writes = writes
        self._records = records
        #: The Synchronize being received, chunk by chunk.
        self.part: SyncPart | None = None

    def take(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        """Take in a chunk as views: a large node's protobuf is never held all at once.

        Pods go into the Known that `reply` installs; running containers
        wait, as views with their current values, for the pods of later chunks.
        """
        if first or self.part is None:
            # Records of pods forgotten since the last write first: this pass reads records.
            self._records.keep_forgotten()
            self.part = SyncPart(self._store.uids(), self._live.known)
        part = self.part
        part.listed[0] += len(pods)
        part.listed[1] += len(containers)
        for pod in pods:
            self._take_pod(part, pod)
        waiting = part.containers
        for container in containers:
            if container.state not in _RUNNING_STATES:
                continue
            view, current = running_view(container)
            path, is_head = split_path(container.linux.cgroups_path, container.id)
            waiting.add(intern(container.pod_sandbox_id), view, path, is_head, current)

    def _take_pod(self, part: SyncPart, pod: api.PodSandbox) -> None:
        """Remember a listed pod with kubelet's values: as this process knew them (under
        this sandbox or another of its uid), as its record keeps them, as the runtime tells
        them, or as its QoS class fixes them."""
        previous, known, pod_id, uid = self._live.known, part.known, pod.id, pod.uid
        kept = previous.kept_for(pod_id, uid)
        if kept is not None:
            if unshown := previous.unshown_of(pod_id):
                # Met again since it was forgotten: its containers not shown since are its
                # record's.
                part.records[pod_id] = PodRecord(None, dict(unshown))
        elif (record := self._record(part, pod)) is not None:
            kept = record.pod
        native = (
            kept.kubelet if kept is not None else told_baseline(pod, self._decide, "Synchronize")
        )
        twin = known.sandbox_of(uid)
        if twin is not None:
            part.twins.setdefault(uid, [twin]).append(pod_id)
        part.uids.add(uid)
        applied = None if kept is None else kept.applied
        known.remember_pod(pod_id, pod_view(pod, native), applied, sure=native is not None)

    def _one_sandbox_each(self, part: SyncPart, previous: Known) -> None:
        """Of a uid's sandboxes, keep the one with running containers, else the one known
        before, else the last listed; the others are dead (kubelet runs one at a time)."""
        known = part.known
        running = part.containers.pod_ids()
        for uid, sandboxes in part.twins.items():
            live = [s for s in sandboxes if s in known.pods]
            if not live:
                continue  # forgotten past the bounds
            keep = next(
                (s for s in reversed(live) if s in running),
                next((s for s in reversed(live) if s in previous.pods), live[-1]),
            )
            known.keep_sandbox(uid, keep, live)

    def _record(self, part: SyncPart, pod: api.PodSandbox) -> PodRecord | None:
        """The pod's record, if it has one; kept with the part for its containers."""
        if pod.uid not in part.stored:
            return None
        record = self._store.load(pod.uid, part.budget)
        if record is not None:
            part.records[pod.id] = record
        return record

    def reply(self) -> api.SynchronizeResponse:
        """The container updates for everything `take` took in; pods written around them."""
        in_force, decide = self._live.in_force, self._decide
        part, self.part = self.part, None
        assert part is not None  # take made it
        # What this process knew (a runtime restart): more recent than any record.
        previous, self._live.known = self._live.known, part.known
        known = part.known
        if part.twins:
            self._one_sandbox_each(part, previous)
        pod_views = known.pods
        # Each pod's id once: every container of a pod refers to the same string.
        pod_ids = {pod_id: pod_id for pod_id in pod_views}
        response = api.SynchronizeResponse()
        updates = response.update
        raising: set[str] = set()
        #: pod id -> whether the last of its containers being lowered, in the
        #: reply's order, has been; in the order of those last containers
        lowered: dict[str, Check] = {}
        watch_lowering = in_force.pod_level and not self._dry_run
        #: containers the runtime reports at the values in force, whose files are checked
        settled: list[Reported] = []
        lines = DecisionLines("Synchronize")
        #: fields set -> containers updated with them, counted once at the end
        adjusted: dict[tuple[str, ...], int] = {}
        #: pod id -> what the decisions of its containers share (a third of each)
        classes: dict[str, PodClass | None] = {}
        records = part.records
        records_kept = self._store.keeping
        for listed_pod_id, listed, path, is_head, current in part.containers:
            pod_id = pod_ids.get(listed_pod_id)
            if pod_id is None:
                continue
            pod = pod_views[pod_id]
            ctr_view, applied, recorded = known.take_container(
                previous, records.get(pod_id), pod_id, listed, path, is_head, current, records_kept
            )
            ctr_id = ctr_view.id
            if pod_id in classes:
                pod_class = classes[pod_id]
            else:
                pod_class = classes[pod_id] = decide.classify(pod)
            decided = decide.container(
                pod,
                ctr_view,
                lines,
                refuse=False,
                applied=applied,
                current=current,
                pod_class=pod_class,
            )
            if decided is None:
                known.set_applied(ctr_id, applied)  # bad input loses nothing: kept as it is
                continue
            values = decided.values
            known.note_set(ctr_id, decided.claimed)
            if values is None:
                continue
            # What the runtime reports of a container kept in its pod's record may be older
            # than its files: the plugin may have written them itself after a reload, which
            # the runtime never learns (and a cgroup v2 weight cannot be compared back).
            if recorded or differs(values, current):
                set_resources(updates.add(container_id=ctr_id).linux.resources, values)
                fields = set_fields(values)
                adjusted[fields] = adjusted.get(fields, 0) + 1
                if raises_quota(current.cpu_quota, values.cpu_quota):
                    raising.add(pod_id)
                if watch_lowering and lowers(current, values):
                    # The runtime applies the updates in the reply's order:
                    # once a pod's last is applied, so are the others.
                    lowered.pop(pod_id, None)
                    lowered[pod_id] = functools.partial(
                        self._writes.container_lowered, pod, ctr_view, values
                    )
            else:
                lines.unchanged()
                if not self._dry_run:
                    settled.append((pod_id, ctr_id, values))
        known.collects_forgotten = True
        for fields, containers_updated in adjusted.items():
            self._counters.count_adjusted("Synchronize", containers_updated, fields)
        after_reply = self._after_reply
        lines.write_after(after_reply)
        # Before the pods: a pod goes down only after its containers.
        self._reconcile.check_reported(settled)
        self._pods(pod_views, raising, lowered)
        self._records.keep_after_sync(part.records, part.uids)
        # After the per-container lines: the node at a glance.
        lines.summarize_after(
            after_reply,
            "synchronized",
            pods=part.listed[0],
            containers=part.listed[1],
            updates=len(updates),
        )
        return response

    def _pods(
        self,
        pod_views: Mapping[str, PodView],
        raising: set[str],
        lowered: Mapping[str, Check],
    ) -> None:
        """Decide every pod now; the one pass writes them around the reply."""
        targets = []
        for pod_id, view in list(pod_views.items()):
            target = self._decide.pod(pod_id, view, "Synchronize", refuse=False)
            if target is not None:
                targets.append(target)
        self._reconcile.synchronize_pods(targets, raising, lowered)
