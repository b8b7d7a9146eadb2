"""The plugin's handlers: an NRI event in, views, a decision, a reply out.

NRI messages become plain views (codec.py), the policy decides, and decisions
become container adjustments, container updates, or pod-level cgroup writes
(cgroup_writer.py; NRI cannot adjust a pod sandbox). This is also where the
failure policy is applied: the policy reports bad input as a value; only here
does it turn into "leave the container alone" or "make the runtime refuse it".

Longer than the house's 400 lines on purpose: the Synchronize handler and the
work it leaves for after its reply (pods written after their containers were
lowered, containers repaired) share the handlers' state and failure policy,
and read best beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from sys import intern
from typing import Any

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupPathError
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import (
    baseline_of,
    cpu_shares_to_weight,
    differs,
    exceeds,
    holds,
    lowers,
    set_fields,
)
from nri_midbatch.config.settings import ConfigError, Settings
from nri_midbatch.config.validator import load_settings_text
from nri_midbatch.nri.events import Event, handles
from nri_midbatch.nri.session import RuntimeInfo
from nri_midbatch.plugin.cgroup_writer import CgroupWriter
from nri_midbatch.plugin.codec import (
    NATIVE_LIMITS_ANNOTATION,
    annotated_baseline,
    container_update,
    container_view,
    current_values,
    encode_native_limits,
    limits_and_values,
    native_limits,
    pod_view,
    runtime_pod_baseline,
    set_resources,
)
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.plugin.deferred import CGROUP_READS_PER_PIECE, AfterReply
from nri_midbatch.plugin.lowering import Check, LoweringWait, Write
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    Decision,
    NativeLimits,
    PodClass,
    PodView,
    Policy,
    QoSClass,
    classify_pod,
    decide_container,
    decide_pod,
)
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.baseline import in_force, newly_limited, resized_pod_baseline
from nri_midbatch.state.known import Known, container_at_sync, split_path
from nri_midbatch.state.plan import Plan, plan, raises_quota, split_pods
from nri_midbatch.state.store import BaselineStore, PodRecord
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

#: Pod records written in one piece of the work after a Synchronize's reply (~50 us each).
RECORDS_PER_PIECE = 32

#: Kubelet's cgroup for a BestEffort pod: the least shares, no quota, no memory limit.
_BESTEFFORT_POD = NativeLimits(cpu_shares=2)


_RUNNING_STATES = frozenset({api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED})


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What a pod decision that puts values in force needs for its cgroup to be written."""

    pod_id: str
    pod: PodView  # as decided: with kubelet's values
    tier: str | None
    #: What to write: the tier's values, and kubelet's for fields given back.
    values: CgroupValues
    #: What is the plugin's once written (None: everything given back).
    claimed: CgroupValues | None


class _SyncPart:
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
    __slots__ = ("containers", "known", "listed", "records", "stored")

    def __init__(self, stored: frozenset[str]) -> None:
        self.known = Known()
        self.containers: list[Any] = []
        #: Pods and containers the runtime listed, running or not.
        self.listed = [0, 0]
        #: The uids of the pods with a record, and the records read (by pod sandbox id).
        self.stored = stored
        self.records: dict[str, PodRecord] = {}


class MidBatchPlugin:
    def __init__(
        self,
        config: Settings,
        *,
        dry_run: bool = False,
        observers: Sequence[Observer] = (),
        after_reply: AfterReply | None = None,
        store: BaselineStore | None = None,
    ) -> None:
        """dry_run: decide pod-level values but write no cgroup file (replay, audits).

        observers: told of every decision. after_reply: the work left for after replies; the
        App's is also among the session's observers, so that it yields to the runtime's
        requests. By default one of the plugin's own, which never waits (replay, tests).

        `store`: where kubelet's values are kept across restarts (state/store.py); none by
        default, as replays and tests keep nothing.
        """
        self.counters = Counters()
        self.known = Known()
        self.store = store if store is not None and not dry_run else BaselineStore(None)
        self.runtime: RuntimeInfo | None = None
        #: Log lines and Synchronize's pod cgroups, once the runtime has its reply.
        self.after_reply = AfterReply() if after_reply is None else after_reply
        #: The last Synchronize's pods waiting for their containers to be lowered.
        self._lowering: LoweringWait | None = None
        #: The Synchronize being received, chunk by chunk.
        self._sync_part: _SyncPart | None = None
        #: The Known a Synchronize replaces, while it is taken in.
        self._previous_known = Known()
        self._dry_run = dry_run
        self._observers = tuple(observers)
        #: Under the systemd driver, the units that hold our values (its task
        #: is the App's to run); chosen at start, as the driver of a node is.
        self.systemd = (
            SystemdUnits(Path(config.cgroups.root), self._systemd_containers)
            if CgroupDriver(config.cgroups.driver) is CgroupDriver.SYSTEMD and not dry_run
            else None
        )
        self._apply_config(config)

    def _apply_config(self, config: Settings) -> None:
        self.config = config
        #: Decide and report, set nothing (`mode: observe`).
        self.observing = config.mode == "observe"
        self.policy: Policy = config.compile()
        self._fail = config.failure_policy == "Fail"
        self.cgroups = CgroupWriter(
            Path(config.cgroups.root),
            CgroupDriver(config.cgroups.driver),
            "" if self.runtime is None else self.runtime.name,
            self.systemd,
        )

    def reconfigure(self, config: Settings) -> Plan:
        """Switch to `config`; returns what running workloads need to follow it.

        Planned against what the plugin last put in force (state/plan.py), so the outcome is
        the configuration's, whatever came before. Into observe mode, or with pod level off,
        what the plugin set is given back (kubelet's values). Pods about to get values for the
        first time have their baseline read from their cgroup first, as the plugin never wrote
        it.
        """
        self._apply_config(config)
        return self.catch_up()

    def catch_up(self) -> Plan:
        """What running workloads need to hold what the configuration in force gives them."""
        enforce, pod_level = not self.observing, self.config.cgroups.pod_level
        if enforce and pod_level:
            for pod_id, view in list(self.known.pods.items()):
                if pod_id not in self.known.pod_baseline_known:
                    with contextlib.suppress(Exception):  # the plan reports bad input
                        if decide_pod(view, self.policy).tier is not None:
                            self._establish_pod_baseline(pod_id, view)
        return plan(self.known, self.policy, enforce=enforce, pod_level=pod_level)

    def write_plan(self, plan: Plan) -> Plan:
        """Bring running workloads to `plan` through their cgroup files; returns what failed.

        For runtimes whose UpdateContainers is unsafe. Blocking file I/O: run
        it in a thread, then `applied` in the loop with what went through. A pod
        goes up before its containers and down after them (lowering.py says
        why): pods whose containers' quota rises first, then the containers,
        then the other pods and those of the first that failed once more.
        """
        first, last = split_pods(plan)
        retry = [
            change
            for change in first
            if not self._write_values(change.pod, None, change.values, final=False)
        ]
        failed_containers = tuple(
            change
            for change in plan.containers
            if not self._write_values(
                change.pod, change.container, change.values, cgroups_path=change.cgroups_path
            )
        )
        failed_pods = tuple(
            change
            for change in (*retry, *last)
            if not self._write_values(change.pod, None, change.values)
        )
        return Plan(failed_containers, failed_pods)

    def applied(self, plan: Plan, failed: Plan | None = None, *, by_files: bool = False) -> None:
        """Remember that `plan`, less `failed`, is in force, and keep the pods' records.

        A change that failed stays planned: the next reload or Synchronize tries it again.
        `by_files`: the containers' values went into their cgroup files, which the runtime
        does not know of; their pods' records keep them, as the runtime will not report them.
        """
        known = self.known
        failed_ids = set() if failed is None else {c.container.id for c in failed.containers}
        failed_pods = set() if failed is None else {c.pod_id for c in failed.pods}
        touched: set[str] = set()
        for change in plan.containers:
            entry = known.containers.get(change.container.id)
            if change.container.id in failed_ids or entry is None:
                continue
            known.note_set(change.container.id, change.claimed)
            if by_files:
                known.recorded.add(change.container.id)
            touched.add(entry[0])
        for pod_change in plan.pods:
            if pod_change.pod_id in failed_pods or pod_change.pod_id not in known.pods:
                continue
            known.set_applied(pod_change.pod_id, pod_change.claimed)
            touched.add(pod_change.pod_id)
        for pod_id in touched:
            self._keep_record(pod_id)

    def _write_values(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        *,
        cgroups_path: str = "",
        final: bool = True,
    ) -> bool:
        where = {"namespace": pod.namespace, "pod": pod.name}
        if container is not None:
            where["container"] = container.name
        reason = self.cgroups.write(pod, container, values, cgroups_path).failure
        if reason is None:
            log.info("cgroup set for new configuration", **where, **_values_log(values))
            return True
        if final:
            log.warning("cgroup not set for new configuration", reason=reason, **where)
        return False

    def _systemd_containers(self) -> list[UnitTarget]:
        """What every known container holds of ours, for systemd's drift repair."""
        known = self.known
        targets = []
        for container_id, values in list(known.applied.items()):
            entry = known.containers.get(container_id)
            pod = None if entry is None else known.pods.get(entry[0])
            if entry is None or pod is None:
                continue
            path = known.cgroups_path(container_id)
            targets.append(self.cgroups.unit_target(pod, entry[1], values, path))
        return targets

    # -- kubelet's values ----------------------------------------------------

    def _establish_pod_baseline(self, pod_id: str, view: PodView) -> PodView:
        """The pod with kubelet's values read from its cgroup, which the plugin has not written.

        Read at RunPodSandbox, and later only for a pod whose baseline neither the runtime,
        its record nor its QoS told (containerd 1.7 sends no pod resources). A replay reads
        nothing; an unreadable cgroup leaves the view as it is, and its write says why.
        """
        if self._dry_run:
            return view
        try:
            reading = self.cgroups.read(view)
        except (CgroupPathError, OSError, ValueError) as exc:
            log.debug("pod cgroup not readable", error=str(exc), pod=view.name)
            return view
        kept = replace(view, native=baseline_of(reading, view.native))
        if pod_id in self.known.pods:
            self.known.pods[pod_id] = kept
        self.known.pod_baseline_known.add(pod_id)
        return kept

    def _keep_record(self, pod_id: str, before: PodRecord | bool | None = True) -> None:
        """Write (or remove) the pod's record; `before`: what it held, True if not known."""
        pod = self.known.pods.get(pod_id)
        if pod is None or not self.store.keeping:
            return
        record = self.known.record_of(pod_id)
        if before is not True and record == before:
            return
        if record is None:
            if before is not None:
                self.store.remove(pod.uid)
        else:
            self.store.save(pod.uid, record)

    def _keep_records_after_sync(self, loaded: Mapping[str, PodRecord]) -> None:
        """After a Synchronize, a slice at a time: every pod's record, then none of the gone."""
        if not self.store.keeping:
            return
        pod_ids = list(self.known.pods)
        for start in range(0, len(pod_ids), RECORDS_PER_PIECE):
            self.after_reply.defer(
                self._keep_records, pod_ids[start : start + RECORDS_PER_PIECE], loaded
            )
        self.after_reply.defer(self._prune_records)

    def _keep_records(self, pod_ids: Sequence[str], loaded: Mapping[str, PodRecord]) -> None:
        for pod_id in pod_ids:
            self._keep_record(pod_id, loaded.get(pod_id))

    def _prune_records(self) -> None:
        self.store.prune(frozenset(pod.uid for pod in self.known.pods.values()))

    # -- session hooks -------------------------------------------------------

    async def configure(self, config: str, runtime: RuntimeInfo) -> None:
        self.runtime = runtime
        self.cgroups = replace(self.cgroups, runtime=runtime.name)
        if not config.strip():
            return
        # Pre-launched plugins get their drop-in file here. A bad one must not
        # cost the node its plugin: keep what we have and say why.
        try:
            # In a thread: the configuration is validated in a child process (0.3 s).
            settings = await asyncio.to_thread(load_settings_text, config, "NRI Configure")
            self._apply_config(settings)
        except ConfigError as exc:
            self.counters.config_rejected += 1
            log.error("configuration from the runtime rejected", error=str(exc))
            return
        log.info(
            "configuration applied",
            source="NRI Configure",
            failure_policy=self.config.failure_policy,
        )

    def synchronize_part(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        """Take in a chunk as views: a large node's protobuf is never held all at once.

        Pods go into the Known that `synchronize` installs; running containers
        wait, as views with their current values, for the pods of later chunks.
        """
        if first or self._sync_part is None:
            self._sync_part = _SyncPart(self.store.uids())
            self._sync_part.known.evicted = self.known.evicted
        part = self._sync_part
        part.listed[0] += len(pods)
        part.listed[1] += len(containers)
        for pod in pods:
            self._take_pod_at_sync(part, pod)
        waiting = part.containers
        for container in containers:
            if container.state not in _RUNNING_STATES:
                continue
            linux = container.linux
            shown, current = limits_and_values(linux.resources)
            annotated = annotated_baseline(container)
            # Never adjusted by us (created while no plugin ran), or kept in the pod's record:
            # what it holds is kubelet's as far as never-loosen goes; not sure enough to scale
            # until the record says so (cpu-normalization).
            view = ContainerView(
                id=container.id,
                name=intern(container.name),
                native=shown if annotated is None else annotated,
                native_known=annotated is not None,
            )
            waiting += (
                intern(container.pod_sandbox_id),
                view,
                *split_path(linux.cgroups_path, container.id),
                current,
            )

    def _load_record(self, part: _SyncPart, pod_id: str, uid: str) -> PodRecord | None:
        record = self.store.load(uid)
        if record is not None:
            part.records[pod_id] = record
        return record

    def _take_pod_at_sync(self, part: _SyncPart, pod: api.PodSandbox) -> None:
        """Remember a listed pod with kubelet's values: as this process knew them, as its
        record keeps them, as the runtime tells them, or as its QoS class fixes them."""
        previous, known, pod_id = self.known, part.known, pod.id
        old = previous.pods.get(pod_id)
        applied = None
        native: NativeLimits | None
        if old is not None and pod_id in previous.pod_baseline_known:
            native, applied = old.native, previous.applied.get(pod_id)
        elif (
            pod.uid in part.stored
            and (record := self._load_record(part, pod_id, pod.uid)) is not None
            and record.pod is not None
        ):
            native, applied = record.pod.kubelet, record.pod.applied
        else:
            native = runtime_pod_baseline(pod)
            if native is None and qos_from_cgroup_parent(pod.linux.cgroup_parent) is QoSClass.BE:
                native = _BESTEFFORT_POD
        known.add_pod(pod_id, pod_view(pod, native))
        if native is not None:
            known.pod_baseline_known.add(pod_id)
        known.set_applied(pod_id, applied)

    async def synchronize(
        self, pods: Sequence[api.PodSandbox] = (), containers: Sequence[api.Container] = ()
    ) -> api.SynchronizeResponse:
        """The whole Synchronize: what `synchronize_part` took in, then `pods` and `containers`."""
        self.synchronize_part(pods, containers, first=False)
        part, self._sync_part = self._sync_part, None
        assert part is not None  # synchronize_part made it
        # What this process knew (a runtime restart): more recent than any record.
        self._previous_known, self.known = self.known, part.known
        known = part.known
        pod_views = known.pods
        # Each pod's id once: every container of a pod refers to the same string.
        pod_ids = {pod_id: pod_id for pod_id in pod_views}
        response = api.SynchronizeResponse()
        updates = response.update
        raising: set[str] = set()
        #: pod id -> whether the last of its containers being lowered, in the
        #: reply's order, has been; in the order of those last containers
        lowered: dict[str, Check] = {}
        watch_lowering = self.config.cgroups.pod_level and not self._dry_run
        #: containers the runtime reports at their values already, to check after the reply
        settled: list[tuple[PodView, ContainerView, CgroupValues]] = []
        lines = DecisionLines("Synchronize")
        #: fields set -> containers updated with them, counted once at the end
        adjusted: dict[tuple[str, ...], int] = {}
        #: pod id -> what the decisions of its containers share (a third of each)
        classes: dict[str, PodClass | None] = {}
        waiting = part.containers
        previous, records = self._previous_known, part.records
        records_kept = self.store.keeping
        for i in range(0, len(waiting), _SyncPart.FIELDS):
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
            if pod_id in classes:
                pod_class = classes[pod_id]
            else:
                pod_class = classes[pod_id] = self._classify(pod)
            decided, claimed = self._decide_container(
                pod, ctr_view, lines, refuse=False, pod_class=pod_class
            )
            if not decided:
                known.set_applied(ctr_id, applied)  # bad input loses nothing: kept as it is
                if recorded:
                    known.recorded.add(ctr_id)
                continue
            if self.observing and claimed is not None:
                self._observed("Synchronize", pod, ctr_view, claimed, current)
                claimed = None
            if recorded:
                known.recorded.add(ctr_id)
            values = in_force(claimed, applied, ctr_view.native)
            known.note_set(ctr_id, claimed)
            if values is None:
                continue
            if differs(values, current):
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
                        self._container_lowered, pod, ctr_view, values
                    )
            else:
                lines.unchanged()
                if not self._dry_run:
                    settled.append((pod, ctr_view, values))
        self._previous_known = Known()
        for fields, containers_updated in adjusted.items():
            self.counters.count_adjusted("Synchronize", containers_updated, fields)
        lines.write_after(self.after_reply)
        # Before the pods: a pod goes down only after its containers.
        for start in range(0, len(settled), CGROUP_READS_PER_PIECE):
            self.after_reply.defer(
                self._repair_containers, settled[start : start + CGROUP_READS_PER_PIECE]
            )
        self._synchronize_pods(pod_views, raising, lowered)
        self._keep_records_after_sync(part.records)
        # After the per-container lines: the node at a glance.
        lines.summarize_after(
            self.after_reply,
            "synchronized",
            pods=part.listed[0],
            containers=part.listed[1],
            updates=len(updates),
        )
        return response

    def _synchronize_pods(
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
        if self._lowering is not None:
            self._lowering.cancel()
        wait = self._lowering = LoweringWait(self.after_reply, on_stall=self._count_unconfirmed)
        #: pod id -> its write, for the pods that wait
        waiting: dict[str, Write] = {}
        for pod_id, view in list(pod_views.items()):
            target = self._decide_pod(pod_id, view, "Synchronize", refuse=False)
            if target is None:
                continue
            if pod_id in raising and self._set_pod_cgroup(
                target, "Synchronize", refuse=False, final=False
            ):
                continue
            # Not raised (or refused: it tries once more when its turn comes).
            write = functools.partial(self._set_synchronized_pod, target)
            if pod_id in lowered:
                waiting[pod_id] = write
            else:
                self.after_reply.defer(write)
        # In the order the runtime will get to them.
        for pod_id, check in lowered.items():
            if pod_id in waiting:
                view = pod_views[pod_id]
                wait.add(f"{view.namespace}/{view.name}", check, waiting[pod_id])
        wait.start()

    def _set_synchronized_pod(self, target: PodTarget) -> None:
        if self.known.pods.get(target.pod_id) is not target.pod:
            return  # removed, or a newer Synchronize has taken over
        self._set_pod_cgroup(target, "Synchronize", refuse=False)

    def _container_lowered(
        self, pod: PodView, container: ContainerView, values: CgroupValues
    ) -> bool:
        """Whether the container's cgroup holds no more than `values` (or is gone)."""
        # The path as Known keeps it: one string per pod, not one per waiting container.
        cgroups_path = self.known.cgroups_path(container.id)
        try:
            now = self.cgroups.read(pod, container, cgroups_path)
        except (CgroupPathError, OSError, ValueError) as exc:
            # Gone, or unreadable: waiting would not change that; the pod's
            # own write reports what is wrong with the tree.
            log.debug("container cgroup not readable", error=str(exc), container=container.name)
            return True
        return not exceeds(now, values)

    def _repair_containers(
        self, settled: list[tuple[PodView, ContainerView, CgroupValues]]
    ) -> None:
        """Write the cgroup files of containers the runtime says hold their values but do not.

        A runtime killed while it applied an update may have stored the new
        resources without their reaching the cgroup (containerd persists the
        spec first): its next Synchronize reports values the files do not
        hold, and asks for no update. Read after the reply, a slice at a time.
        """
        for pod, container, values in settled:
            if container.id not in self.known.containers:
                continue  # removed since
            cgroups_path = self.known.cgroups_path(container.id)
            try:
                now = self.cgroups.read(pod, container, cgroups_path)
            except (CgroupPathError, OSError, ValueError):
                continue  # gone, or not ours to read: nothing to repair here
            if holds(now, values):
                continue
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            reason = self.cgroups.write(pod, container, values, cgroups_path).failure
            if reason is None:
                self.counters.containers_repaired += 1
                log.warning(
                    "container cgroup repaired: the runtime reported values it did not hold",
                    **where,
                    **_values_log(values),
                )
                continue
            self.counters.container_repairs_failed += 1
            log.warning("container cgroup not repaired", reason=reason, **where)

    def _count_unconfirmed(self, pods: int) -> None:
        self.counters.pods_lowered_unconfirmed += pods

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        pod_id = pod.id
        known = self.known
        view = known.pods.get(pod_id)
        if view is None:
            view = known.add_pod(pod_id, pod_view(pod))
        ctr_view = container_view(container)
        known.set_container(ctr_view.id, pod_id, ctr_view, container.linux.cgroups_path)
        lines = DecisionLines("CreateContainer")
        _, values = self._decide_container(view, ctr_view, lines, refuse=self._fail)
        lines.write_after(self.after_reply)
        if values is None:
            return api.CreateContainerResponse()
        if self.observing:
            current = current_values(container.linux.resources)
            self._observed("CreateContainer", view, ctr_view, values, current)
            return api.CreateContainerResponse()
        known.annotated.add(ctr_view.id)
        known.set_applied(ctr_view.id, values)
        self.counters.count_adjusted("CreateContainer", fields=set_fields(values))
        response = api.CreateContainerResponse()
        adjust = response.adjust
        adjust.annotations[NATIVE_LIMITS_ANNOTATION] = encode_native_limits(ctr_view.native)
        set_resources(adjust.linux.resources, values)
        return response

    async def update_container(
        self, pod: api.PodSandbox, container: api.Container, resources: api.LinuxResources
    ) -> Sequence[api.ContainerUpdate]:
        # Decide from the resources being requested, not the container's
        # current ones, and name the container: an update without its id is
        # silently dropped by the runtime (koordlet's NRI bug). The requested
        # resources are kubelet's new values: a resize moves the baseline, of
        # the container and of its pod.
        known, container_id = self.known, container.id
        ctr_view = container_view(container, resources)
        entry = known.containers.get(container_id)
        view = known.pods.get(pod.id)
        if view is None:
            view = pod_view(pod)
        resized = entry is not None and entry[1].native != ctr_view.native
        pod_moved = False
        if entry is not None:
            known.set_container(container_id, pod.id, ctr_view, container.linux.cgroups_path)
            if resized:
                known.recorded.add(container_id)
            # Kubelet keeps a BestEffort pod's cgroup unlimited whatever its containers ask.
            if resized and qos_from_cgroup_parent(view.cgroup_parent) is not QoSClass.BE:
                siblings = [
                    known.containers[other][1].native
                    for other in known.containers_of(pod.id)
                    if other != container_id
                ]
                native = resized_pod_baseline(
                    view.native, entry[1].native, ctr_view.native, siblings
                )
                if newly_limited(view.native, native):
                    # Kubelet's new pod limit also counts containers not created yet and
                    # the overhead, which the runtime may not tell: read back from the pod's
                    # cgroup once kubelet has written it, after the reply.
                    known.pod_baseline_known.discard(pod.id)
                view = replace(view, native=native)
                pod_moved = pod.id in known.pods
                if pod_moved:
                    known.pods[pod.id] = view
        lines = DecisionLines("UpdateContainer")
        decided, claimed = self._decide_container(view, ctr_view, lines, refuse=self._fail)
        lines.write_after(self.after_reply)
        if not decided:
            return []
        if self.observing and claimed is not None:
            current = current_values(resources)
            self._observed("UpdateContainer", view, ctr_view, claimed, current)
            claimed = None
        values = in_force(claimed, known.applied.get(container_id), ctr_view.native)
        if entry is not None:
            known.note_set(container_id, claimed)
        if pod_moved:
            self._follow_resize(pod.id, view)
        elif container_id in known.recorded:
            self.after_reply.defer(self._keep_record, pod.id)
        if values is None:
            return []
        if claimed is not None:
            self.counters.count_adjusted("UpdateContainer", fields=set_fields(values))
        return [container_update(container_id, values)]

    def _follow_resize(self, pod_id: str, view: PodView) -> None:
        """A container of the pod was resized: its pod's values follow its new baseline.

        Raised now, before the reply (on cgroup v1 the container's new quota may not fit the
        old pod quota); lowered after it, once the runtime has applied the container's update.
        The pod's record keeps the new baselines.
        """
        if self.config.cgroups.pod_level and pod_id not in self.known.pod_baseline_known:
            self.after_reply.defer(self._follow_resize_later, pod_id)
        elif self.config.cgroups.pod_level:
            target = self._decide_pod(pod_id, view, "UpdateContainer", refuse=False)
            if target is not None:
                before = self.known.applied.get(pod_id)
                before_quota = (
                    before.cpu_quota if before is not None else view.native.cpu_quota or -1
                )
                if raises_quota(before_quota, target.values.cpu_quota):
                    self._set_pod_cgroup(target, "UpdateContainer", refuse=False)
                else:
                    self.after_reply.defer(self._set_synchronized_pod, target)
        self.after_reply.defer(self._keep_record, pod_id)

    def _follow_resize_later(self, pod_id: str) -> None:
        view = self.known.pods.get(pod_id)
        if view is None:
            return
        target = self._decide_pod(pod_id, view, "UpdateContainer", refuse=False)
        if target is not None:
            self._set_pod_cgroup(target, "UpdateContainer", refuse=False)
        self._keep_record(pod_id)

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        """An in-place pod resize (NRI v0.10+): kubelet's new pod values, overhead included."""
        known = self.known
        view = known.pods.get(pod.id)
        if view is None:
            return
        told = native_limits(resources)
        extra = native_limits(overhead)
        native = NativeLimits(
            cpu_quota=None if told.cpu_quota is None else told.cpu_quota + (extra.cpu_quota or 0),
            cpu_period=told.cpu_period,
            memory_limit=(
                None if told.memory_limit is None else told.memory_limit + (extra.memory_limit or 0)
            ),
            cpu_shares=(
                None if told.cpu_shares is None else told.cpu_shares + (extra.cpu_shares or 0)
            ),
        )
        if native == view.native:
            return
        view = known.pods[pod.id] = replace(view, native=native)
        known.pod_baseline_known.add(pod.id)
        self._follow_resize(pod.id, view)

    # Removals are handled only to forget what is gone, so a reload reaches live
    # workloads only.
    @handles(Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX)
    async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
        if event == Event.REMOVE_POD_SANDBOX:
            self.known.remove_pod(pod.id)
            self.store.remove(pod.uid)
            if self.systemd is not None:
                self.systemd.forget_pod(pod.uid)
        elif event == Event.RUN_POD_SANDBOX:
            self._run_pod_sandbox(pod)

    def _run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """A new pod: kubelet's values are what its cgroup holds now, before any write of ours."""
        known, pod_id = self.known, pod.id
        besteffort = qos_from_cgroup_parent(pod.linux.cgroup_parent) is QoSClass.BE
        view = known.add_pod(pod_id, pod_view(pod, _BESTEFFORT_POD if besteffort else None))
        if besteffort:
            known.pod_baseline_known.add(pod_id)
        if not self.config.cgroups.pod_level:
            return
        target = self._decide_pod(pod_id, view, "RunPodSandbox", refuse=self._fail)
        if target is not None:
            self._set_pod_cgroup(target, "RunPodSandbox", refuse=self._fail)

    @handles(Event.REMOVE_CONTAINER)
    async def container_event(
        self, event: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        if event == Event.REMOVE_CONTAINER:
            recorded = container.id in self.known.recorded
            self.known.forget_container(container.id)
            if recorded:
                self.after_reply.defer(self._keep_record, pod.id)
            if self.systemd is not None:
                self.systemd.forget_container(pod.uid, container.id)

    # -- decisions -----------------------------------------------------------

    def _decide_container(
        self,
        pod: PodView,
        container: ContainerView,
        lines: DecisionLines,
        *,
        refuse: bool,
        pod_class: PodClass | None = None,
    ) -> tuple[bool, CgroupValues | None]:
        """Decide, count, and add the decision's line: whether it was decided, and the
        values the tier claims, if any.

        Not decided: bad input or a bug, logged and counted; the container keeps what it
        has. `refuse` makes bad input an error reply. `pod_class`: the pod's
        classification, made once for its containers (`_classify`).

        Only an operation the runtime can refuse on its own (creating or
        updating one container, running one pod) may be refused: an error from
        Synchronize would cost every pod on the node its plugin.
        """
        try:
            decision = decide_container(pod, container, self.policy, pod_class)
        except Exception as exc:
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            self._decision_failed(exc, lines.method, where, refuse)
            return False, None
        self.counters.count_decision(decision)
        for observer in self._observers:
            observer.decided(pod, container, decision)
        if decision.error is not None:
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            self._invalid(decision, lines.method, where, refuse)
            return False, None
        if decision.values is None:
            # Untouched workloads are the common case: visible at debug only
            # (SIGUSR1), with the trace that says why.
            lines.add(None, pod, container, decision.trace[-1])
            return True, None
        values = decision.values  # a shared instance (policy/calculate.py)
        lines.add(decision.tier, pod, container, values)
        return True, values

    def _classify(self, pod: PodView) -> PodClass | None:
        """The pod's part of its containers' decisions; None if it raised (a bug).

        Then each container is classified with its own decision, whose failure
        is reported with the container it came from.
        """
        try:
            return classify_pod(pod, self.policy)
        except Exception:
            return None

    def _decision_failed(
        self, exc: Exception, method: str, where: Mapping[str, str], refuse: bool
    ) -> None:
        """A decision that raised (a bug): the failure policy decides, as for bad input.

        Under Ignore the workload is left alone rather than its creation made to fail.
        """
        self.counters.count_invalid("internal")
        log.error(
            "decision failed, refusing it" if refuse else "decision failed, left untouched",
            method=method,
            error=f"{type(exc).__name__}: {exc}",
            failure_policy=self.config.failure_policy,
            exc_info=exc,
            **where,
        )
        if refuse:
            raise RpcError(Code.INTERNAL, f"nri-midbatch: decision failed: {exc}")

    def _invalid(
        self, decision: Decision, method: str, where: Mapping[str, str], refuse: bool
    ) -> None:
        self.counters.count_invalid(decision.error_kind or "invalid")
        log.warning(
            "invalid input, refusing it" if refuse else "invalid input, left untouched",
            method=method,
            reason=decision.error,
            failure_policy=self.config.failure_policy,
            **where,
        )
        if refuse:
            raise RpcError(Code.INVALID_ARGUMENT, f"nri-midbatch: {decision.error}")

    def _decide_pod(
        self, pod_id: str, pod: PodView, method: str, *, refuse: bool
    ) -> PodTarget | None:
        """The pod decision, counted, and what to write for it; None if nothing is to be.

        What to write is the tier's values and kubelet's for what the plugin gives back
        (`in_force`). In observe mode the tier's values are only reported.
        """
        where = {"namespace": pod.namespace, "pod": pod.name}
        try:
            decision = decide_pod(pod, self.policy)
            # A pod in a tier needs kubelet's values: to bound the tier's, or to scale them.
            if decision.tier is not None and pod_id not in self.known.pod_baseline_known:
                pod = self._establish_pod_baseline(pod_id, pod)
                decision = decide_pod(pod, self.policy)
        except Exception as exc:
            self._decision_failed(exc, method, where, refuse)
            return None
        self.counters.count_decision(decision)
        for observer in self._observers:
            observer.decided(pod, None, decision)
        if decision.error is not None:
            self._invalid(decision, method, where, refuse)
            return None
        claimed = decision.values if self.config.cgroups.pod_level else None
        if self.observing and claimed is not None:
            self._observed(method, pod, None, claimed, self._pod_now(pod, claimed))
            claimed = None
        values = in_force(claimed, self.known.applied.get(pod_id), pod.native)
        if values is None:
            return None
        return PodTarget(pod_id, pod, decision.tier, values, claimed)

    def _set_pod_cgroup(
        self, target: PodTarget, method: str, *, refuse: bool, final: bool = True
    ) -> bool:
        """Write a pod's values; a failure is reported only if `final`."""
        pod, values = target.pod, target.values
        where = {"namespace": pod.namespace, "pod": pod.name}
        if self._dry_run:
            log.info(
                "pod cgroup not written: dry run",
                method=method,
                tier=target.tier,
                **where,
                **_values_log(values),
            )
            return True
        written = self.cgroups.write(pod, None, values)
        reason = written.failure
        if reason is None:
            self.counters.pod_writes_ok += 1
            before = self.known.applied.get(target.pod_id)
            self.known.set_applied(target.pod_id, target.claimed)
            if before != target.claimed:
                self._keep_record(target.pod_id)
            # Changes at info; a pod whose files already held the values
            # (most of a Synchronize after a restart) at debug.
            (log.info if written.changed else log.debug)(
                "pod cgroup set",
                method=method,
                tier=target.tier,
                **where,
                **_values_log(values),
                **({} if written.changed else {"unchanged": True}),
            )
            return True
        if final:
            self._pod_write_failed(method, where, reason, refuse)
        return False

    # -- observe mode --------------------------------------------------------

    def _observed(
        self,
        method: str,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        current: CgroupValues | None,
    ) -> None:
        """Log and count what `mode: observe` would set, and how it differs from `current`."""
        changes = None if current is None else _changes(values, current)
        result = "unknown" if changes is None else "differs" if changes else "same"
        level = "pod" if container is None else "container"
        key = (level, result)
        self.counters.observed[key] = self.counters.observed.get(key, 0) + 1
        where = {"namespace": pod.namespace, "pod": pod.name}
        if container is not None:
            where["container"] = container.name
        log.info(
            "would set",
            mode="observe",
            method=method,
            **where,
            **_values_log(values),
            differs=result,
            changes=changes,
        )

    def _pod_now(self, pod: PodView, values: CgroupValues) -> CgroupValues | None:
        """What the pod cgroup holds now, for observe mode's comparison; None: unreadable."""
        if self._dry_run:
            return None
        try:
            now = self.cgroups.read(pod)
        except (CgroupPathError, OSError, ValueError):
            return None
        shares = now.cpu_shares
        if shares is None and values.cpu_shares is not None and now.cpu_weight is not None:
            # v2 keeps a weight, which cannot be turned back into shares: compare weights.
            same = cpu_shares_to_weight(values.cpu_shares) == now.cpu_weight
            shares = values.cpu_shares if same else None
        return CgroupValues(shares, now.cpu_quota, now.memory_limit)

    def _pod_write_failed(
        self, method: str, where: Mapping[str, str], reason: str, refuse: bool
    ) -> None:
        self.counters.pod_writes_failed += 1
        log.warning("pod cgroup not set", method=method, reason=reason, **where)
        if refuse:
            raise RpcError(Code.INTERNAL, f"nri-midbatch: pod cgroup not set: {reason}")


def _changes(values: CgroupValues, current: CgroupValues) -> dict[str, list[int | None]]:
    """field -> [now, would be], for every field `values` sets that `current` holds otherwise."""
    return {
        name: [getattr(current, name), getattr(values, name)]
        for name in set_fields(values)
        if getattr(current, name) != getattr(values, name)
    }


def _values_log(values: CgroupValues) -> dict[str, int | None]:
    return {
        "cpu_shares": values.cpu_shares,
        "cpu_quota": values.cpu_quota,
        "memory_limit": values.memory_limit,
    }
