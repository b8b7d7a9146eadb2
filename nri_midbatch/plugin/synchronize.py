"""The Synchronize pass: every pod and container on the node, brought to the configuration.

The runtime sends the node in chunks (`take`), then waits for one reply
(`reply`): container updates, whose values the runtime applies after it. Pods
are written around that: raised before the reply, lowered once their
containers are (lowering.py), the rest right after it; containers whose files
do not hold what the runtime reports are repaired, and every pod's record is
kept, after the reply too.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from sys import intern
from typing import Any

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import differs, lowers, set_fields
from nri_midbatch.plugin.codec import (
    pod_view,
    running_view,
    runtime_pod_baseline,
    set_resources,
)
from nri_midbatch.plugin.context import PluginContext
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.plugin.decisions import Decider
from nri_midbatch.plugin.deferred import CGROUP_READS_PER_PIECE
from nri_midbatch.plugin.lowering import Check, LoweringTimings, LoweringWait, Write
from nri_midbatch.plugin.records import Records
from nri_midbatch.plugin.writes import Settled, Writes
from nri_midbatch.policy import (
    CgroupValues,
    NativeLimits,
    PodClass,
    PodView,
    QoSClass,
)
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.state.baseline import in_force
from nri_midbatch.state.known import Known, container_at_sync, split_path
from nri_midbatch.state.plan import raises_quota
from nri_midbatch.state.store import PodRecord, ReadBudget

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


class SyncPart:
    """What a Synchronize's chunks brought so far, without their protobuf.

    Containers are held flat, `FIELDS` list slots each (pod id, view, cgroups
    path, whether that is the path's head, current values), as the decision
    lines are (decision_log.py). Strings shared by a pod's containers where
    they can be (its id, the head of its containers' paths, as Known keeps
    them): 10,000 strings held through a large Synchronize would be
    allocated among the objects the plugin keeps, and leave the heap
    fragmented for good once freed (2.8 MB of resident memory).
    """

    FIELDS = 5
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
        self.known.forgotten_records = None
        self.containers: list[Any] = []
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
        ctx: PluginContext,
        decide: Decider,
        writes: Writes,
        records: Records,
        lowering_timings: LoweringTimings,
    ) -> None:
        self._ctx = ctx
        self._lowering_timings = lowering_timings
        self._decide = decide
        self._writes = writes
        self._records = records
        #: The last Synchronize's pods waiting for their containers to be lowered.
        self._lowering: LoweringWait | None = None
        #: The Synchronize being received, chunk by chunk.
        self.part: SyncPart | None = None

    def take(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        """Take in a chunk as views: a large node's protobuf is never held all at once.

        Pods go into the Known that `reply` installs; running containers
        wait, as views with their current values, for the pods of later chunks.
        """
        ctx = self._ctx
        if first or self.part is None:
            # Records of pods forgotten since the last write first: this pass reads records.
            self._records.keep_forgotten()
            self.part = SyncPart(ctx.store.uids(), ctx.known)
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
            waiting += (
                intern(container.pod_sandbox_id),
                view,
                *split_path(container.linux.cgroups_path, container.id),
                current,
            )

    def _take_pod(self, part: SyncPart, pod: api.PodSandbox) -> None:
        """Remember a listed pod with kubelet's values: as this process knew them (under
        this sandbox or another of its uid), as its record keeps them, as the runtime tells
        them, or as its QoS class fixes them."""
        previous, known, pod_id, uid = self._ctx.known, part.known, pod.id, pod.uid
        before = pod_id if pod_id in previous.pods else previous.sandbox_of(uid)
        applied = None
        native: NativeLimits | None
        if before is not None and before in previous.pod_baseline_known:
            native, applied = previous.pods[before].native, previous.applied.get(before)
            if before == pod_id and pod_id in previous.unshown:
                # Met again since it was forgotten: its containers not shown since are its
                # record's.
                part.records[pod_id] = PodRecord(None, previous.unshown[pod_id])
        elif (record := self._record(part, pod)) is not None and record.pod is not None:
            native, applied = record.pod.kubelet, record.pod.applied
        else:
            native = told_baseline(pod, self._decide, "Synchronize")
        twin = known.sandbox_of(uid)
        if twin is not None:
            part.twins.setdefault(uid, [twin]).append(pod_id)
        part.uids.add(uid)
        known.add_pod(pod_id, pod_view(pod, native))
        if native is not None:
            known.pod_baseline_known.add(pod_id)
        known.set_applied(pod_id, applied)

    def _one_sandbox_each(self, part: SyncPart, previous: Known) -> None:
        """Of a uid's sandboxes, keep the one with running containers, else the one known
        before, else the last listed; the others are dead (kubelet runs one at a time)."""
        known = part.known
        waiting = part.containers
        running = {waiting[i] for i in range(0, len(waiting), SyncPart.FIELDS)}
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
        record = self._ctx.store.load(pod.uid, part.budget)
        if record is not None:
            part.records[pod.id] = record
        return record

    def reply(self) -> api.SynchronizeResponse:
        """The container updates for everything `take` took in; pods written around them."""
        ctx, decide = self._ctx, self._decide
        part, self.part = self.part, None
        assert part is not None  # take made it
        # What this process knew (a runtime restart): more recent than any record.
        previous, ctx.known = ctx.known, part.known
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
        watch_lowering = ctx.pod_level and not ctx.dry_run
        observing = ctx.observing
        settled: list[Settled] = []
        lines = DecisionLines("Synchronize")
        #: fields set -> containers updated with them, counted once at the end
        adjusted: dict[tuple[str, ...], int] = {}
        #: pod id -> what the decisions of its containers share (a third of each)
        classes: dict[str, PodClass | None] = {}
        waiting = part.containers
        records = part.records
        records_kept = ctx.store.keeping
        for i in range(0, len(waiting), SyncPart.FIELDS):
            pod_id = pod_ids.get(waiting[i])
            if pod_id is None:
                continue
            pod = pod_views[pod_id]
            current: CgroupValues = waiting[i + 4]
            annotated = waiting[i + 1].native_known  # its K from the annotation
            ctr_view, applied, recorded = container_at_sync(
                previous, records.get(pod_id), waiting[i + 1], current, records_kept
            )
            ctr_id = ctr_view.id
            known.set_split(ctr_id, pod_id, ctr_view, waiting[i + 2], waiting[i + 3])
            if annotated:
                known.annotated.add(ctr_id)
            if recorded:
                known.recorded.add(ctr_id)
            if pod_id in classes:
                pod_class = classes[pod_id]
            else:
                pod_class = classes[pod_id] = decide.classify(pod)
            decided, claimed = decide.container(
                pod, ctr_view, lines, refuse=False, pod_class=pod_class
            )
            if not decided:
                known.set_applied(ctr_id, applied)  # bad input loses nothing: kept as it is
                continue
            if observing and claimed is not None:
                decide.observed("Synchronize", pod, ctr_view, claimed, current)
                claimed = None
            values = in_force(claimed, applied, ctr_view.native)
            known.note_set(ctr_id, claimed)
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
                if not ctx.dry_run:
                    settled.append((pod, ctr_view, values))
        known.forgotten_records = {}
        for fields, containers_updated in adjusted.items():
            ctx.counters.count_adjusted("Synchronize", containers_updated, fields)
        after_reply = ctx.after_reply
        lines.write_after(after_reply)
        # Before the pods: a pod goes down only after its containers.
        for start in range(0, len(settled), CGROUP_READS_PER_PIECE):
            after_reply.defer(
                self._writes.repair_containers, settled[start : start + CGROUP_READS_PER_PIECE]
            )
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
        """Decide every pod now; write its cgroup before the reply, after it, or later.

        The runtime applies our container updates after the reply. A pod
        whose containers' quota goes up is raised first, now (on cgroup v1 a
        child's quota above its pod's is EINVAL). A pod whose containers go
        down is written once the runtime has lowered them, as their cgroup
        files show (lowering.py). Any other pod is written right after the
        reply, which also keeps 0.2 ms of file I/O per pod out of the one
        request the runtime gives 2 s for the whole node.
        """
        ctx, writes = self._ctx, self._writes
        if self._lowering is not None:
            self._lowering.cancel()
        wait = self._lowering = LoweringWait(
            ctx.after_reply, timings=self._lowering_timings, on_stall=self._count_unconfirmed
        )
        #: pod id -> its write, for the pods that wait
        waiting: dict[str, Write] = {}
        for pod_id, view in list(pod_views.items()):
            target = self._decide.pod(pod_id, view, "Synchronize", refuse=False)
            if target is None:
                continue
            if pod_id in raising and writes.pod(target, "Synchronize", refuse=False, final=False):
                continue
            # Not raised (or refused: it tries once more when its turn comes).
            write = functools.partial(writes.pod_if_current, target, "Synchronize")
            if pod_id in lowered:
                waiting[pod_id] = write
            else:
                ctx.after_reply.defer(write)
        # In the order the runtime will get to them.
        for pod_id, check in lowered.items():
            if pod_id in waiting:
                view = pod_views[pod_id]
                wait.add(f"{view.namespace}/{view.name}", check, waiting[pod_id])
        wait.start()

    def _count_unconfirmed(self, pods: int) -> None:
        self._ctx.counters.pods_lowered_unconfirmed += pods
