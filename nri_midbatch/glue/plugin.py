"""The plugin's handlers: an NRI event in, views, a decision, a reply out.

NRI messages become plain views (views.py), the policy decides, and decisions
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
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from sys import intern
from typing import Any

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupPathError
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import (
    cpu_shares_to_weight,
    differs,
    exceeds,
    holds,
    lowers,
    set_fields,
)
from nri_midbatch.config.settings import ConfigError, Settings
from nri_midbatch.config.validator import load_settings_text
from nri_midbatch.glue.after_reply import CGROUP_READS_PER_PIECE, AfterReply
from nri_midbatch.glue.cgroup_writer import CgroupWriter
from nri_midbatch.glue.counters import Counters
from nri_midbatch.glue.decision_log import DecisionLines
from nri_midbatch.glue.known import Known, split_path
from nri_midbatch.glue.lowering import Check, LoweringWait, Write
from nri_midbatch.glue.reconcile import Plan, plan, raises_quota, split_pods
from nri_midbatch.glue.views import (
    NATIVE_LIMITS_ANNOTATION,
    container_update,
    container_view,
    current_values,
    encode_native_limits,
    limits_and_values,
    pod_view,
    set_resources,
    synchronized_view,
)
from nri_midbatch.nri.events import Event, handles
from nri_midbatch.nri.session import RuntimeInfo
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
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

_NO_LIMITS = NativeLimits()


_RUNNING_STATES = frozenset({api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED})

#: Told of every decision (container None: pod level), e.g. to record it with the call.
DecisionListener = Callable[[PodView, ContainerView | None, Decision], None]


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What a pod decision that sets values needs for its cgroup to be written."""

    pod: PodView  # as decided: with kubelet's limits, if they were read from the cgroup
    tier: str | None
    values: CgroupValues


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
    __slots__ = ("containers", "known", "listed")

    def __init__(self) -> None:
        self.known = Known()
        self.containers: list[Any] = []
        #: Pods and containers the runtime listed, running or not.
        self.listed = [0, 0]


class MidBatchPlugin:
    def __init__(
        self,
        config: Settings,
        *,
        dry_run: bool = False,
        on_decision: DecisionListener | None = None,
    ) -> None:
        """dry_run: decide pod-level values but write no cgroup file (replay, audits)."""
        self.counters = Counters()
        self.known = Known()
        self.runtime: RuntimeInfo | None = None
        #: Log lines and Synchronize's pod cgroups, once the runtime has its reply.
        self.after_reply = AfterReply()
        #: The last Synchronize's pods waiting for their containers to be lowered.
        self._lowering: LoweringWait | None = None
        #: The Synchronize being received, chunk by chunk.
        self._sync_part: _SyncPart | None = None
        self._dry_run = dry_run
        self._on_decision = on_decision
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

        Nothing, into observe mode; everything with values, out of it, as nothing was set.
        """
        old, pods_before = self.policy, self.config.cgroups.pod_level
        set_before = not self.observing
        self._apply_config(config)
        if self.observing:
            return Plan((), ())
        return plan(
            self.known,
            old if set_before else None,  # out of observe mode: every value, none was set
            self.policy,
            pods_before=pods_before and set_before,
            pods_after=config.cgroups.pod_level,
        )

    def write_plan(self, plan: Plan) -> int:
        """Bring running workloads to `plan` through their cgroup files; returns failures.

        For runtimes whose UpdateContainers is unsafe. Blocking file I/O: run
        it in a thread. A pod goes up before its containers and down after
        them (lowering.py says why): pods whose containers' quota may rise
        first, then the containers, then the other pods and those of the
        first that failed once more.
        """
        first, last = split_pods(plan)
        retry = [
            change
            for change in first
            if not self._write_values(change.pod, None, change.values, final=False)
        ]
        failures = sum(
            not self._write_values(
                change.pod, change.container, change.values, cgroups_path=change.cgroups_path
            )
            for change in plan.containers
        )
        failures += sum(
            not self._write_values(change.pod, None, change.values) for change in (*retry, *last)
        )
        return failures

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
        """What every known container should hold now, for systemd's drift repair."""
        changes = plan(self.known, None, self.policy, pods_after=False).containers
        return [
            self.cgroups.unit_target(c.pod, c.container, c.values, c.cgroups_path) for c in changes
        ]

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
            self._sync_part = _SyncPart()
        part = self._sync_part
        known = part.known
        part.listed[0] += len(pods)
        part.listed[1] += len(containers)
        for pod in pods:
            known.add_pod(pod.id, pod_view(pod))
        waiting = part.containers
        for container in containers:
            if container.state not in _RUNNING_STATES:
                continue
            linux = container.linux
            shown, current = limits_and_values(linux.resources)
            waiting += (
                intern(container.pod_sandbox_id),
                synchronized_view(container, shown),
                *split_path(linux.cgroups_path, container.id),
                current,
            )

    async def synchronize(
        self, pods: Sequence[api.PodSandbox] = (), containers: Sequence[api.Container] = ()
    ) -> api.SynchronizeResponse:
        """The whole Synchronize: what `synchronize_part` took in, then `pods` and `containers`."""
        self.synchronize_part(pods, containers, first=False)
        part, self._sync_part = self._sync_part, None
        assert part is not None  # synchronize_part made it
        self.known = known = part.known
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
        for i in range(0, len(waiting), _SyncPart.FIELDS):
            pod_id = pod_ids.get(waiting[i])
            if pod_id is None:
                continue
            pod = pod_views[pod_id]
            ctr_view: ContainerView = waiting[i + 1]
            known.set_split(ctr_view.id, pod_id, ctr_view, waiting[i + 2], waiting[i + 3])
            if pod_id in classes:
                pod_class = classes[pod_id]
            else:
                pod_class = classes[pod_id] = self._classify(pod)
            values = self._decide_container(pod, ctr_view, lines, refuse=False, pod_class=pod_class)
            if values is None:
                continue
            current: CgroupValues = waiting[i + 4]
            if self.observing:
                self._observed("Synchronize", pod, ctr_view, values, current)
            elif differs(values, current):
                set_resources(updates.add(container_id=ctr_view.id).linux.resources, values)
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
        for fields, containers_updated in adjusted.items():
            self.counters.count_adjusted("Synchronize", containers_updated, fields)
        lines.write_after(self.after_reply)
        # Before the pods: a pod goes down only after its containers.
        for start in range(0, len(settled), CGROUP_READS_PER_PIECE):
            self.after_reply.defer(
                self._repair_containers, settled[start : start + CGROUP_READS_PER_PIECE]
            )
        if self.config.cgroups.pod_level:
            self._synchronize_pods(pod_views, raising, lowered)
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
        for pod_id, view in pod_views.items():
            target = self._decide_pod(view, "Synchronize", refuse=False)
            if target is None:
                continue
            if pod_id in raising and self._set_pod_cgroup(
                target, "Synchronize", refuse=False, final=False
            ):
                continue
            # Not raised (or refused: it tries once more when its turn comes).
            write = functools.partial(self._set_synchronized_pod, pod_id, view, target)
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

    def _set_synchronized_pod(self, pod_id: str, view: PodView, target: PodTarget) -> None:
        if self.known.pods.get(pod_id) is not view:
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
        if pod_id in self.known.pods:
            view = pod_view(pod)
        else:
            view = self.known.add_pod(pod_id, pod_view(pod))
        ctr_view = container_view(container)
        self.known.set_container(ctr_view.id, pod_id, ctr_view, container.linux.cgroups_path)
        lines = DecisionLines("CreateContainer")
        values = self._decide_container(view, ctr_view, lines, refuse=self._fail)
        lines.write_after(self.after_reply)
        if values is None:
            return api.CreateContainerResponse()
        if self.observing:
            current = current_values(container.linux.resources)
            self._observed("CreateContainer", view, ctr_view, values, current)
            return api.CreateContainerResponse()
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
        # silently dropped by the runtime (koordlet's NRI bug).
        ctr_view = container_view(container, resources)
        if container.id in self.known.containers:
            self.known.set_container(container.id, pod.id, ctr_view, container.linux.cgroups_path)
        lines = DecisionLines("UpdateContainer")
        values = self._decide_container(pod_view(pod), ctr_view, lines, refuse=self._fail)
        lines.write_after(self.after_reply)
        if values is None:
            return []
        if self.observing:
            current = current_values(resources)
            self._observed("UpdateContainer", pod_view(pod), ctr_view, values, current)
            return []
        self.counters.count_adjusted("UpdateContainer", fields=set_fields(values))
        return [container_update(container.id, values)]

    # Removals are handled only to forget what is gone, so a reload reaches live
    # workloads only.
    @handles(Event.RUN_POD_SANDBOX, Event.REMOVE_POD_SANDBOX)
    async def pod_event(self, event: Event, pod: api.PodSandbox) -> None:
        if event == Event.REMOVE_POD_SANDBOX:
            self.known.remove_pod(pod.id)
            if self.systemd is not None:
                self.systemd.forget_pod(pod.uid)
        elif event == Event.RUN_POD_SANDBOX:
            view = self.known.add_pod(pod.id, pod_view(pod))
            if self.config.cgroups.pod_level:
                target = self._decide_pod(view, "RunPodSandbox", refuse=self._fail)
                if target is not None:
                    self._set_pod_cgroup(target, "RunPodSandbox", refuse=self._fail)

    @handles(Event.REMOVE_CONTAINER)
    async def container_event(
        self, event: Event, pod: api.PodSandbox, container: api.Container
    ) -> None:
        if event == Event.REMOVE_CONTAINER:
            self.known.forget_container(container.id)
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
    ) -> CgroupValues | None:
        """Decide, count, and add the decision's line; the values to set, if any.

        `refuse` makes bad input an error reply. `pod_class`: the pod's
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
            return None
        self.counters.count_decision(decision)
        if self._on_decision is not None:
            self._on_decision(pod, container, decision)
        if decision.error is not None:
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            self._invalid(decision, lines.method, where, refuse)
            return None
        if decision.values is None:
            # Untouched workloads are the common case: visible at debug only
            # (SIGUSR1), with the trace that says why.
            lines.add(None, pod, container, decision.trace[-1])
            return None
        values = decision.values  # a shared instance (policy/calculate.py)
        lines.add(decision.tier, pod, container, values)
        return values

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

    def _decide_pod(self, pod: PodView, method: str, *, refuse: bool) -> PodTarget | None:
        """The pod decision, counted, and the pod it was made for; None if it sets nothing."""
        try:
            decision = decide_pod(pod, self.policy)
            if decision.values is not None and self._lacks_kubelet_limits(pod):
                pod = self._with_kubelet_pod_limits(pod)
                decision = decide_pod(pod, self.policy)
        except Exception as exc:
            self._decision_failed(
                exc, method, {"namespace": pod.namespace, "pod": pod.name}, refuse
            )
            return None
        self.counters.count_decision(decision)
        if self._on_decision is not None:
            self._on_decision(pod, None, decision)
        if decision.error is not None:
            self._invalid(decision, method, {"namespace": pod.namespace, "pod": pod.name}, refuse)
            return None
        if decision.values is None:
            return None
        return PodTarget(pod, decision.tier, decision.values)

    def _set_pod_cgroup(
        self, target: PodTarget, method: str, *, refuse: bool, final: bool = True
    ) -> bool:
        """Write a pod's values; a failure is reported only if `final`."""
        pod, values = target.pod, target.values
        where = {"namespace": pod.namespace, "pod": pod.name}
        if self.observing:
            self._observed(method, pod, None, values, self._pod_now(pod, values))
            return True
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

    def _lacks_kubelet_limits(self, pod: PodView) -> bool:
        """Whether kubelet may have limited the pod's cgroup without the runtime saying so."""
        return (
            not self._dry_run
            and pod.native == _NO_LIMITS
            and qos_from_cgroup_parent(pod.cgroup_parent) not in (None, QoSClass.BE)
        )

    def _with_kubelet_pod_limits(self, pod: PodView) -> PodView:
        """The pod, with kubelet's pod-level limits read from its cgroup.

        Runtimes that do not pass pod resources (containerd 1.7 among them)
        would otherwise let a burstable pod's cgroup be loosened past the
        limits kubelet gave it. Best-effort pods have no kubelet limits: what
        their cgroup holds is ours, which must not be kept as if it were
        kubelet's. Replays read nothing from the machine.
        """
        try:
            current = self.cgroups.read(pod)
        except (CgroupPathError, OSError, ValueError):
            return pod  # the write that follows reports what is wrong with the cgroup
        native = NativeLimits(
            cpu_quota=current.cpu_quota if current.cpu_quota > 0 else None,
            memory_limit=current.memory_limit if current.memory_limit > 0 else None,
        )
        return pod if native == _NO_LIMITS else replace(pod, native=native)

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
