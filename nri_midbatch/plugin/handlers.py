"""The plugin's NRI handlers: an event in, views, a decision, a reply out.

Each handler turns its NRI messages into plain views (codec.py), has them
decided (decisions.py, which also applies the failure policy), and answers
with container adjustments or updates; pod values go to their cgroup files
(writes.py; NRI cannot adjust a pod sandbox). The Synchronize pass has its
own room (synchronize.py). Kubelet's baseline is state/known.py's: the handlers
tell it what happened through its named methods (records.py reads the cgroups
and record files it needs). Each room is given what it uses when it is made; what
reloads and Synchronizes replace it asks `live` for (context.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.fs import KERNEL_FILES, CgroupFiles
from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import set_fields
from nri_midbatch.config.settings import ConfigError, Settings
from nri_midbatch.config.validator import load_settings_text
from nri_midbatch.deferred import AfterReply
from nri_midbatch.nri.events import Event, handles
from nri_midbatch.nri.session import RuntimeInfo
from nri_midbatch.plugin.codec import (
    NATIVE_LIMITS_ANNOTATION,
    container_update,
    container_view,
    current_values,
    encode_native_limits,
    limits_and_values,
    native_limits,
    pod_view,
    set_resources,
)
from nri_midbatch.plugin.context import InForce, Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.plugin.decisions import Decider, PodTarget
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.plugin.observer import Observer, told_of_decisions
from nri_midbatch.plugin.reconcile import ConvergenceTimings, Reconciler
from nri_midbatch.plugin.records import Records
from nri_midbatch.plugin.synchronize import SynchronizePass, told_baseline
from nri_midbatch.plugin.writes import Writes
from nri_midbatch.policy import NativeLimits, PodView, QoSClass, decide_pod
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.baseline import kubelets_after_resize, told_pod_baseline
from nri_midbatch.state.known import Known
from nri_midbatch.state.plan import Plan, plan, quota_in_force, raises_quota
from nri_midbatch.state.store import BaselineStore
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)


class MidBatchPlugin:
    def __init__(
        self,
        config: Settings,
        *,
        dry_run: bool = False,
        observers: Sequence[Observer] = (),
        after_reply: AfterReply | None = None,
        store: BaselineStore | None = None,
        lowering_timings: LoweringTimings = LoweringTimings(),
        convergence_timings: ConvergenceTimings = ConvergenceTimings(),
        cgroup_files: CgroupFiles = KERNEL_FILES,
    ) -> None:
        """dry_run: decide pod-level values but write no cgroup file (replay, audits).

        `store`: where kubelet's values are kept across restarts (state/store.py); none by
        default, as replays and tests keep nothing.
        `observers`: told of every decision. `after_reply`: the work left for after replies
        (deferred.py); the App's hears the session (observer.py, AfterReplyListener), so
        that it yields to the runtime's requests. By default one of the plugin's own, which never
        waits (replay, tests). `lowering_timings`: a Synchronize's wait for the runtime to
        lower containers (plugin/lowering.py). `convergence_timings`: when a resized pod is
        checked again, and the size of a pass's pieces (plugin/reconcile/). `cgroup_files`:
        what reads and writes the cgroup files (cgroups/fs.py), the kernel's unless a test
        gives its own.
        """
        self.runtime: RuntimeInfo | None = None
        #: Under the systemd driver, the units that hold our values (its task
        #: is the App's to run); chosen at start, as the driver of a node is.
        self.systemd = (
            SystemdUnits(Path(config.cgroups.root), self._systemd_containers, files=cgroup_files)
            if CgroupDriver(config.cgroups.driver) is CgroupDriver.SYSTEMD and not dry_run
            else None
        )
        #: The configuration in force and what the plugin knows: replaced while it runs, by
        #: reloads and Synchronizes; the state `status` shows.
        self.live = live = Live(InForce.of(config, "", self.systemd, cgroup_files), Known())
        #: What the plugin counts, for the metrics.
        self.counters = counters = Counters()
        counters.tiers = tuple(tier.name for tier in config.tiers)
        #: Where kubelet's values are kept across restarts.
        self.store = store if store is not None and not dry_run else BaselineStore(None)
        #: The work left for after replies (the status endpoint's too).
        self.after_reply = AfterReply() if after_reply is None else after_reply
        self._records = Records(live, self.store, self.after_reply, dry_run=dry_run)
        self._decide = Decider(
            live, self._records, counters, told_of_decisions(observers), dry_run=dry_run
        )
        self._writes = Writes(live, self._records, counters, dry_run=dry_run)
        #: The one pass that brings files and runtime in line with the targets, whatever
        #: triggers it: a reload, a Synchronize, its period (the App runs it), a resize.
        self.reconcile = Reconciler(
            live,
            counters,
            self.after_reply,
            self._records,
            self._writes,
            convergence_timings,
            lowering_timings,
            on_recheck=self._on_recheck,
            dry_run=dry_run,
        )
        self._sync = SynchronizePass(
            live,
            self.store,
            counters,
            self.after_reply,
            self._decide,
            self._writes,
            self._records,
            self.reconcile,
            dry_run=dry_run,
        )
        #: Pods newly limited by a resize whose new limit kubelet had not yet written when
        #: read (containerd 1.7): read again at the re-checks; and pods whose lowered values
        #: cgroup v1 refused before the runtime lowered their container: written again then.
        self._awaiting_kubelet: set[str] = set()
        #: Pods resized whose baseline is not known for sure, until it is read back: their
        #: baseline before the resize, and what their cgroup held at it (None: not read).
        self._resized: dict[str, tuple[NativeLimits, NativeLimits | None]] = {}

    def _apply_config(self, config: Settings) -> None:
        """Put `config` in force, with the policy and the writer it implies."""
        runtime = "" if self.runtime is None else self.runtime.name
        files = self.live.in_force.cgroups.files
        self.live.in_force = InForce.of(config, runtime, self.systemd, files)
        self.counters.tiers = tuple(tier.name for tier in config.tiers)

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
        in_force = self.live.in_force
        containers = in_force.config.enforces(pod=False)
        pods = in_force.config.enforces(pod=True)
        if pods:
            for pod_id, view in list(self.live.known.pods.items()):
                if not self.live.known.baseline_known(pod_id):
                    try:
                        in_tier = decide_pod(view, in_force.policy).tier is not None
                    except Exception:  # the plan reports bad input
                        continue
                    if in_tier:
                        self._records.establish_pod_baseline(pod_id, view)
        return plan(self.live.known, in_force.policy, containers=containers, pods=pods)

    def _systemd_containers(self) -> list[UnitTarget]:
        """What every known container holds of ours, for systemd's drift repair."""
        known = self.live.known
        targets = []
        for container_id, values in list(known.applied.items()):
            entry = known.containers.get(container_id)
            pod = None if entry is None else known.pods.get(entry[0])
            if entry is None or pod is None:
                continue
            path = known.cgroups_path(container_id)
            targets.append(self.live.in_force.cgroups.unit_target(pod, entry[1], values, path))
        return targets

    # -- session hooks -------------------------------------------------------

    async def configure(self, config: str, runtime: RuntimeInfo) -> None:
        self.runtime = runtime
        self.live.in_force = self.live.in_force.for_runtime(runtime.name)
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
            failure_policy=self.live.in_force.config.failure_policy,
        )

    def synchronize_part(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container], *, first: bool
    ) -> None:
        """Take in a chunk of the Synchronize (synchronize.py)."""
        self._sync.take(pods, containers, first=first)

    async def synchronize(
        self, pods: Sequence[api.PodSandbox] = (), containers: Sequence[api.Container] = ()
    ) -> api.SynchronizeResponse:
        """The whole Synchronize: what `synchronize_part` took in, then `pods` and `containers`."""
        self._sync.take(pods, containers, first=False)
        return self._sync.reply()

    async def create_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> api.CreateContainerResponse:
        pod_id = pod.id
        in_force = self.live.in_force
        known = self.live.known
        view = known.pods.get(pod_id)
        if view is None:
            # A pod the plugin forgot past its bounds, or never heard of: its pod values
            # as at its RunPodSandbox, before its container's (a pod goes up first on v1).
            self._set_met_pod(pod_id, self._meet(pod, "CreateContainer")[0], "CreateContainer")
            view = known.pods[pod_id]
        # The container's resources read and looked up once, for its view and its values.
        linux = container.linux
        native, current = limits_and_values(linux.resources)
        ctr_view = container_view(container, native=native)
        known.set_container(ctr_view.id, pod_id, ctr_view, linux.cgroups_path)
        self._records.keep_forgotten_later()
        lines = DecisionLines("CreateContainer")
        decided = self._decide.container(
            view, ctr_view, lines, refuse=in_force.fail, applied=None, current=current
        )
        lines.write_after(self.after_reply)
        if decided is None or decided.values is None:
            return api.CreateContainerResponse()
        values = decided.values
        known.adjusted_at_creation(ctr_view.id, values)
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
        in_force = self.live.in_force
        known, container_id = self.live.known, container.id
        ctr_view = container_view(container, resources)
        view = known.pods.get(pod.id)
        told = False
        if view is None:
            # As at CreateContainer: a pod forgotten past the bounds, or never heard of.
            view, told = self._meet(pod, "UpdateContainer")
            self._set_met_pod(pod.id, view, "UpdateContainer")
            view = known.pods[pod.id]
        if container_id not in known.containers:
            # Forgotten with its pod: as it was before this update, so that a resize moves
            # its pod's baseline and what the plugin set on it can be given back.
            self._records.meet_container(pod.id, container)
        entry = known.containers.get(container_id)
        moved = None
        if entry is not None:
            if entry[1].native != ctr_view.native:
                # Kubelet writes the pod cgroup after the containers when a resize lowers them.
                self.reconcile.recheck_soon(pod.id)
            path = container.linux.cgroups_path
            moved = known.container_updated(pod.id, ctr_view, path, entry[1], view, told=told)
        lines = DecisionLines("UpdateContainer")
        decided = self._decide.container(
            view if moved is None else moved,
            ctr_view,
            lines,
            refuse=in_force.fail,
            applied=known.applied.get(container_id),
            current=current_values(resources),
        )
        lines.write_after(self.after_reply)
        if decided is None:
            return []
        if entry is not None:
            known.note_set(container_id, decided.claimed)
        if moved is not None and pod.id in known.pods:
            self._follow_resize(pod.id, moved, resized_from=view.native)
        elif known.is_recorded(container_id):
            self._records.keep_later(pod.id)
        if decided.values is None:
            return []
        if decided.claimed is not None:
            self.counters.count_adjusted("UpdateContainer", fields=set_fields(decided.values))
        return [container_update(container_id, decided.values)]

    def _follow_resize(
        self, pod_id: str, view: PodView, *, resized_from: NativeLimits | None = None
    ) -> None:
        """A container of the pod was resized: its pod's values follow its new baseline.

        Raised now, before the reply (on cgroup v1 the container's new quota may not fit the
        old pod quota); lowered after it, once the runtime has applied the container's update.
        The pod's record keeps the new baselines. A pod whose baseline is not known for sure
        (`resized_from`: as it was before the resize) has it read back once kubelet has written it:
        what its cgroup holds now is noted, to tell kubelet's write from it.
        """
        in_force = self.live.in_force
        if in_force.pod_level and not self.live.known.baseline_known(pod_id):
            if resized_from is not None and pod_id not in self._resized:
                read = self._records.read_pod(view, None)
                self._resized[pod_id] = (resized_from, None if read is None else read[0])
            self.after_reply.defer(self._follow_resize_later, pod_id)
        elif in_force.pod_level:
            target = self._decide.pod(pod_id, view, "UpdateContainer", refuse=False)
            if target is not None:
                before = quota_in_force(self.live.known.applied.get(pod_id), view.native)
                if raises_quota(before, target.values.cpu_quota):
                    self._writes.pod(target, "UpdateContainer", refuse=False)
                else:
                    self.after_reply.defer(self._lower_pod, pod_id, target)
        self._records.keep_later(pod_id)

    def _lower_pod(self, pod_id: str, target: PodTarget) -> None:
        """A resized pod's lowered values, after the reply. On cgroup v1 a pod's quota may
        not go below a child's, and the runtime lowers the container only after our reply:
        refused then, the write is tried again at the pod's re-checks."""
        if self.live.known.pods.get(pod_id) is not target.pod:
            return  # removed, or a newer Synchronize took over
        if not self._writes.pod(target, "UpdateContainer", refuse=False, final=False):
            self._awaiting_kubelet.add(pod_id)

    def _follow_resize_later(self, pod_id: str, *, final: bool = False) -> None:
        """A resized pod's baseline read back from its cgroup, then its values written.

        Kubelet writes a pod's new values after the containers when a resize lowers them
        (and may for any resize): a read that finds a value as it was at the resize, still
        unlimited where kubelet's formula limits it, or the plugin's own, came before
        kubelet's write (or kubelet writes none there), and is tried again at the pod's
        re-checks (`final`: the last one; state/baseline.py, `kubelets_after_resize`).
        """
        known = self.live.known
        view = known.pods.get(pod_id)
        if view is None:
            self._awaiting_kubelet.discard(pod_id)
            self._resized.pop(pod_id, None)
            return
        if not known.baseline_known(pod_id):
            before, at_resize = self._resized.get(pod_id, (view.native, None))
            read = self._records.read_pod(view, known.applied.get(pod_id))
            if read is not None:
                native = kubelets_after_resize(
                    read[0], view.native, before, at_resize, read[1], final=final
                )
                if native is None:
                    self._awaiting_kubelet.add(pod_id)
                    return
                known.learn_pod_baseline(pod_id, replace(view, native=native))
        self._awaiting_kubelet.discard(pod_id)
        self._resized.pop(pod_id, None)
        view = known.pods[pod_id]
        target = self._decide.pod(pod_id, view, "UpdateContainer", refuse=False)
        if target is not None:
            self._writes.pod(target, "UpdateContainer", refuse=False)
        self._records.keep(pod_id)

    def _on_recheck(self, pod_id: str, final: bool) -> None:
        if pod_id in self._awaiting_kubelet:
            self._follow_resize_later(pod_id, final=final)

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        """An in-place pod resize (NRI v0.10+): kubelet's new pod values, overhead included.

        Never refused unless `failurePolicy: Fail`: from kubernetes#137555 an error here
        blocks kubelet's resize of the pod.
        """
        try:
            self._update_pod_sandbox(pod, overhead, resources)
        except RpcError:
            raise  # the failure policy's own refusal
        except Exception as exc:
            self.counters.count_invalid("internal")
            log.error(
                "UpdatePodSandbox failed"
                if self.live.in_force.fail
                else "UpdatePodSandbox failed, ignored",
                namespace=pod.namespace,
                pod=pod.name,
                error=f"{type(exc).__name__}: {exc}",
                exc_info=exc,
            )
            if self.live.in_force.fail:
                raise RpcError(Code.INTERNAL, f"nri-midbatch: UpdatePodSandbox: {exc}") from None

    def _update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        known = self.live.known
        view = known.pods.get(pod.id)
        if view is None:
            # A pod forgotten past the bounds: first its values from the baseline its record
            # keeps (a reload while it was forgotten did not reach it; the pod sent carries
            # the resize asked, which may yet fail), then the resize's.
            met, _ = self._meet(pod, "UpdatePodSandbox", kept_first=True)
            self._set_met_pod(pod.id, met, "UpdatePodSandbox")
            view = known.pods[pod.id]
        # Kubelet writes the pod cgroup right after this call (kubernetes#137555), or wrote
        # it before: either way its write may come after the plugin's.
        self.reconcile.recheck_soon(pod.id)
        if qos_from_cgroup_parent(view.cgroup_parent) is QoSClass.BE:
            return  # kubelet keeps a BestEffort pod's cgroup as it is, whatever it is told
        told = native_limits(resources)
        extra = native_limits(overhead)
        summed = NativeLimits(
            cpu_quota=None if told.cpu_quota is None else told.cpu_quota + (extra.cpu_quota or 0),
            cpu_period=told.cpu_period,
            memory_limit=(
                None if told.memory_limit is None else told.memory_limit + (extra.memory_limit or 0)
            ),
            cpu_shares=(
                None if told.cpu_shares is None else told.cpu_shares + (extra.cpu_shares or 0)
            ),
        )
        if not self._decide.holdable(
            summed, "UpdatePodSandbox", namespace=view.namespace, pod=view.name
        ):
            return
        native = told_pod_baseline(view.native, summed, told, known.applied.get(pod.id))
        if native == view.native:
            return
        view = replace(view, native=native)
        known.learn_pod_baseline(pod.id, view)
        self._follow_resize(pod.id, view)

    # Removals are handled only to forget what is gone, so a reload reaches live
    # workloads only.
    @handles(Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX)
    async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
        if event == Event.REMOVE_POD_SANDBOX:
            self._remove_pod_sandbox(pod)
        elif event == Event.RUN_POD_SANDBOX:
            self._run_pod_sandbox(pod)

    def _remove_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """Forget the sandbox; the pod's record and units stay while the pod lives on.

        It does when the plugin knows another sandbox of its uid (kubelet ran a new one in
        the pod's cgroup, and removes the old one later), or may yet (records.py).
        """
        known = self.live.known
        # A sandbox the plugin forgot past its bounds may have left a record.
        recorded = pod.id not in known.pods or known.record_of(pod.id) is not None
        known.remove_pod(pod.id)
        if known.sandbox_of(pod.uid) is not None:
            return
        if recorded:
            # Without the message's maps, which would keep the whole request while the
            # piece waits (a pod's labels and annotations: kilobytes).
            view = replace(pod_view(pod, NativeLimits()), labels={}, annotations={})
            self.after_reply.defer(self._records.sandbox_removed, view)
        if self.systemd is not None:
            self.systemd.forget_pod(pod.uid)

    def _meet(
        self, pod: api.PodSandbox, method: str, *, kept_first: bool = False
    ) -> tuple[PodView, bool]:
        """Remember a sandbox not known: with its pod's baseline, by uid (records.py); and
        whether the runtime or the pod's QoS class told that baseline."""
        told = told_baseline(pod, self._decide, method)
        view = self._records.meet(
            pod.id, pod_view(pod, told), told is not None, kept_first=kept_first
        )
        return view, told is not None

    def _run_pod_sandbox(self, pod: api.PodSandbox) -> None:
        """A new sandbox: kubelet's values are its pod's, if the plugin knew the pod under an
        older sandbox or keeps its record; else the runtime's, or what its cgroup holds now,
        before any write of ours."""
        self._set_met_pod(pod.id, self._meet(pod, "RunPodSandbox")[0], "RunPodSandbox")

    def _set_met_pod(self, pod_id: str, view: PodView, method: str) -> None:
        """A sandbox just met: its pod's values, unless pod level is off and the plugin set
        none there under an older sandbox (those are given back)."""
        in_force = self.live.in_force
        if not in_force.pod_level and pod_id not in self.live.known.applied:
            return
        target = self._decide.pod(pod_id, view, method, refuse=in_force.fail)
        if target is not None:
            self._writes.pod(target, method, refuse=in_force.fail)

    @handles(Event.REMOVE_CONTAINER)
    async def container_event(
        self, event: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        if event == Event.REMOVE_CONTAINER:
            known = self.live.known
            recorded = known.is_recorded(container.id)
            known.forget_container(container.id)
            if recorded:
                self._records.keep_later(pod.id)
            if self.systemd is not None:
                self.systemd.forget_container(pod.uid, container.id)
