"""Glue between the NRI session and the policy core.

NRI messages become plain views, the policy decides, and decisions become
container adjustments, container updates, or pod-level cgroup writes (NRI
cannot adjust a pod sandbox). This is also where the failure policy is
applied: the policy reports bad input as a value; only here does it turn into
"leave the container alone" or "make the runtime refuse it".
"""

from __future__ import annotations

import functools
import json
import resource
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from sys import intern
from typing import Any

import structlog

from nri_midbatch.after_reply import AfterReply
from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.fs import (
    apply_container_values,
    apply_pod_values,
    read_container_values,
    read_pod_values,
)
from nri_midbatch.cgroups.paths import CgroupDriver, CgroupPathError
from nri_midbatch.cgroups.report import WriteReport
from nri_midbatch.cgroups.systemd import SystemdUnits, UnitTarget
from nri_midbatch.cgroups.values import (
    UNLIMITED,
    PodCgroupReading,
    clamp_cpu_shares,
    cpu_shares_to_weight,
)
from nri_midbatch.config import Config, ConfigError, load_config_text
from nri_midbatch.decision_log import DecisionLines
from nri_midbatch.lowering import Check, LoweringWait
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.session import RuntimeInfo
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    Decision,
    NativeLimits,
    PodView,
    Policy,
    QoSClass,
    decide_container,
    decide_pod,
)
from nri_midbatch.policy.classify import qos_from_cgroup_parent
from nri_midbatch.policy_config import compile_policy
from nri_midbatch.reconcile import Known, Plan, plan, raises_quota, split_pods
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

_NO_LIMITS = NativeLimits()

_RUNNING_STATES = frozenset({api.CONTAINER_CREATED, api.CONTAINER_RUNNING, api.CONTAINER_PAUSED})

#: Told of every decision (container None: pod level), e.g. to record it with the call.
DecisionListener = Callable[[PodView, ContainerView | None, Decision], None]


@dataclass
class Counters:
    """What happened, for metrics and for tests to assert on."""

    decisions: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    #: (method, field) -> container values set through NRI
    adjusted: dict[tuple[str, str], int] = field(default_factory=dict)
    pod_writes_ok: int = 0
    pod_writes_failed: int = 0
    #: pods written before their containers were seen lowered (lowering.py)
    pods_lowered_unconfirmed: int = 0
    #: containers whose files did not hold what the runtime reported (Synchronize)
    containers_repaired: int = 0
    container_repairs_failed: int = 0
    config_rejected: int = 0
    #: (level, result) -> values decided but not set in observe mode; result: whether
    #: they differ from what the container or pod has ("differs", "same", "unknown")
    observed: dict[tuple[str, str], int] = field(default_factory=dict)

    def count_decision(self, decision: Decision) -> None:
        key = decision.tier or "none"
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def count_invalid(self, reason: str) -> None:
        self.invalid[reason] = self.invalid.get(reason, 0) + 1

    def count_adjusted(
        self, method: str, containers: int = 1, fields: tuple[str, ...] | None = None
    ) -> None:
        """`fields`: those the adjustments set; all three unless a calculator left some."""
        for name in _ADJUSTED_FIELDS if fields is None else fields:
            key = (method, name)
            self.adjusted[key] = self.adjusted.get(key, 0) + containers


_ADJUSTED_FIELDS = ("cpu_shares", "cpu_quota", "memory_limit")


def set_fields(values: CgroupValues) -> tuple[str, ...]:
    """The fields `values` sets (None: left as kubelet and the runtime set it)."""
    return tuple(name for name in _ADJUSTED_FIELDS if getattr(values, name) is not None)


# -- NRI -> views ----------------------------------------------------------


# An absent optional value reads as 0, which counts as unset here anyway:
# reading `.value` without HasField gives the same answer for half the cost.


def native_limits(resources: api.LinuxResources) -> NativeLimits:
    """Finite limits the runtime or kubelet already set; None where unlimited."""
    cpu = resources.cpu
    return _native_limits(cpu.quota.value, cpu.period.value, resources.memory.limit.value)


# Nodes have few distinct kubelet limits (often just the 100000us period):
# the caches below hold each once, bounded in case a node has many.
_DISTINCT_LIMITS = 1024

#: Containers checked per piece of work after a Synchronize's reply (about 2 ms).
_REPAIRS_PER_WORK = 64
_PAGE = resource.getpagesize()


@functools.lru_cache(maxsize=_DISTINCT_LIMITS)
def _native_limits(quota: int, period: int, limit: int) -> NativeLimits:
    """One instance per distinct value: remembered containers mostly share a handful."""
    return NativeLimits(
        cpu_quota=quota if quota > 0 else None,
        cpu_period=period if period > 0 else None,
        memory_limit=limit if limit > 0 else None,
    )


def pod_view(pod: api.PodSandbox) -> PodView:
    linux = pod.linux
    resources = linux.pod_resources if linux.HasField("pod_resources") else linux.resources
    return PodView(
        uid=pod.uid,
        namespace=pod.namespace,
        name=pod.name,
        labels=pod.labels,
        annotations=pod.annotations,
        cgroup_parent=linux.cgroup_parent,
        native=native_limits(resources),
    )


def container_view(
    container: api.Container, resources: api.LinuxResources | None = None
) -> ContainerView:
    current = resources if resources is not None else container.linux.resources
    return ContainerView(
        id=container.id, name=intern(container.name), native=native_limits(current)
    )


#: On containers we adjust: the limits kubelet gave them, before ours. A
#: running container's resources already hold our values, which must not be
#: mistaken for kubelet's when a restarted plugin synchronizes.
NATIVE_LIMITS_ANNOTATION = "nri-midbatch.io/native-limits"
_NATIVE_KEYS = (
    ("cpuQuota", "cpu_quota"),
    ("cpuPeriod", "cpu_period"),
    ("memoryLimit", "memory_limit"),
)


@functools.lru_cache(maxsize=_DISTINCT_LIMITS)
def encode_native_limits(native: NativeLimits) -> str:
    present = {key: getattr(native, attr) for key, attr in _NATIVE_KEYS}
    return json.dumps({k: v for k, v in present.items() if v is not None}, separators=(",", ":"))


@functools.lru_cache(maxsize=_DISTINCT_LIMITS)
def decode_native_limits(text: str) -> NativeLimits | None:
    """The remembered limits, or None if the text is not what we write."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not set(data) <= {key for key, _ in _NATIVE_KEYS}:
        return None
    values = []
    for key, _ in _NATIVE_KEYS:
        value = data.get(key)
        if value is not None and (type(value) is not int or value <= 0):
            return None
        values.append(value or 0)  # 0: absent, as _native_limits takes it
    return _native_limits(*values)


def synchronized_view(
    container: api.Container, resources: api.LinuxResources | None = None
) -> ContainerView:
    """A running container as kubelet set it up, as far as we can tell.

    `resources`: the container's current ones, if the caller has them at hand.
    """
    text = container.annotations.get(NATIVE_LIMITS_ANNOTATION)
    native = None if text is None else decode_native_limits(text)
    if native is None:
        # Never adjusted by us (created while no plugin ran): what it has is kubelet's, as
        # far as never-loosen goes; not sure enough to scale (cpu-normalization).
        return replace(container_view(container, resources), native_known=False)
    return ContainerView(id=container.id, name=intern(container.name), native=native)


# -- decisions -> NRI --------------------------------------------------------


# Replies are filled in place (a message built apart and then handed to its
# parent is copied into it), from one LinuxResources per distinct values:
# copying that is a quarter of the cost of setting three nested fields.


@functools.lru_cache(maxsize=_DISTINCT_LIMITS)
def _resources_holding(values: CgroupValues) -> api.LinuxResources:
    resources = api.LinuxResources()
    cpu = resources.cpu
    # A field left None is not claimed: NRI gives each field one owner.
    if values.cpu_shares is not None:
        cpu.shares.value = values.cpu_shares
    cpu.quota.value = values.cpu_quota
    if values.memory_limit is not None:
        resources.memory.limit.value = values.memory_limit
    return resources


def set_resources(resources: api.LinuxResources, values: CgroupValues) -> None:
    """Make `resources` hold the values set (each present, even 0); None fields are absent."""
    resources.CopyFrom(_resources_holding(values))


def container_update(container_id: str, values: CgroupValues) -> api.ContainerUpdate:
    update = api.ContainerUpdate(container_id=container_id)
    set_resources(update.linux.resources, values)
    return update


@functools.lru_cache(maxsize=_DISTINCT_LIMITS)
def _shared_values(values: CgroupValues) -> CgroupValues:
    """One instance per distinct value, for values held until after a reply.

    A fresh object each, allocated among the objects the plugin keeps, would
    leave the heap fragmented once freed.
    """
    return values


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What a pod decision that sets values needs for its cgroup to be written."""

    pod: PodView  # as decided: with kubelet's limits, if they were read from the cgroup
    tier: str | None
    values: CgroupValues


def differs(values: CgroupValues, current: CgroupValues) -> bool:
    """Whether a field that `values` sets is off in `current`."""
    return any(getattr(values, name) != getattr(current, name) for name in set_fields(values))


def current_values(resources: api.LinuxResources) -> CgroupValues:
    """A container's values as the runtime reports them, unlimited as -1 (see native_limits)."""
    cpu = resources.cpu
    quota, limit = cpu.quota.value, resources.memory.limit.value
    return CgroupValues(
        cpu_shares=cpu.shares.value,
        cpu_quota=quota if quota > 0 else -1,
        memory_limit=limit if limit > 0 else -1,
    )


class _SyncPart:
    """What a Synchronize's chunks brought so far, without their protobuf.

    Containers are held flat, `FIELDS` list slots each (pod id, view, cgroups
    path, current values), as the decision lines are (decision_log.py).
    """

    FIELDS = 4
    __slots__ = ("containers", "known", "listed")

    def __init__(self) -> None:
        self.known = Known()
        self.containers: list[Any] = []
        #: Pods and containers the runtime listed, running or not.
        self.listed = [0, 0]


class MidBatchPlugin:
    events = frozenset(
        {
            Event.RUN_POD_SANDBOX,
            Event.CREATE_CONTAINER,
            Event.UPDATE_CONTAINER,
            # Only to forget what is gone, so a reload reaches live workloads only.
            Event.REMOVE_CONTAINER,
            Event.REMOVE_POD_SANDBOX,
        }
    )

    def __init__(
        self,
        config: Config,
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
        self._apply_config(config)
        #: Under the systemd driver, the units that hold our values (its task
        #: is the App's to run); chosen at start, as the driver of a node is.
        self.systemd = (
            SystemdUnits(self._cgroup_root, self._systemd_containers)
            if self._cgroup_driver is CgroupDriver.SYSTEMD and not dry_run
            else None
        )

    def _apply_config(self, config: Config) -> None:
        self.config = config
        #: Decide and report, set nothing (`mode: observe`).
        self.observing = config.mode == "observe"
        self.policy: Policy = compile_policy(config)
        self._fail = config.failure_policy == "Fail"
        self._cgroup_root = Path(config.cgroups.root)
        self._cgroup_driver = CgroupDriver(config.cgroups.driver)

    def reconfigure(self, config: Config) -> Plan:
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
        try:
            if container is None:
                report = apply_pod_values(
                    self._cgroup_root, self._cgroup_driver, pod.cgroup_parent, values
                )
            else:
                report = apply_container_values(
                    self._cgroup_root,
                    self._cgroup_driver,
                    pod.cgroup_parent,
                    container.id,
                    values,
                    cgroups_path,
                    self.runtime.name if self.runtime is not None else "",
                )
        except CgroupPathError as exc:
            reason = str(exc)
        else:
            if report.ok:
                log.info("cgroup set for new configuration", **where, **_values_log(values))
                self._hold(pod, container, values, cgroups_path)
                return True
            reason = _describe_failures(report)
        if final:
            log.warning("cgroup not set for new configuration", reason=reason, **where)
        return False

    def _hold(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str = "",
    ) -> None:
        """Under the systemd driver, have systemd hold the values just written to files."""
        if self.systemd is not None:
            self.systemd.hold(self._unit_target(pod, container, values, cgroups_path))

    def _systemd_containers(self) -> list[UnitTarget]:
        """What every known container should hold now, for systemd's drift repair."""
        changes = plan(self.known, None, self.policy, pods_after=False).containers
        return [self._unit_target(c.pod, c.container, c.values, c.cgroups_path) for c in changes]

    def _unit_target(
        self,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        cgroups_path: str,
    ) -> UnitTarget:
        if container is None:
            return UnitTarget("pod", pod.uid, pod.namespace, pod.name, pod.cgroup_parent, values)
        return UnitTarget(
            "container",
            pod.uid,
            pod.namespace,
            pod.name,
            pod.cgroup_parent,
            values,
            container.name,
            container.id,
            cgroups_path,
            self.runtime.name if self.runtime is not None else "",
        )

    # -- session hooks -------------------------------------------------------

    async def configure(self, config: str, runtime: RuntimeInfo) -> None:
        self.runtime = runtime
        if not config.strip():
            return
        # Pre-launched plugins get their drop-in file here. A bad one must not
        # cost the node its plugin: keep what we have and say why.
        try:
            self._apply_config(load_config_text(config, source="NRI Configure"))
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
            resources = linux.resources
            waiting += (
                container.pod_sandbox_id,
                synchronized_view(container, resources),
                linux.cgroups_path,
                _shared_values(current_values(resources)),
            )

    async def synchronize(
        self, pods: Sequence[api.PodSandbox], containers: Sequence[api.Container]
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
        #: pod id -> checks that its containers being lowered have been
        lowered: dict[str, list[Check]] = {}
        watch_lowering = self.config.cgroups.pod_level and not self._dry_run
        #: containers the runtime reports at their values already, to check after the reply
        settled: list[tuple[PodView, ContainerView, CgroupValues]] = []
        lines = DecisionLines("Synchronize")
        waiting = part.containers
        for i in range(0, len(waiting), _SyncPart.FIELDS):
            pod_id = pod_ids.get(waiting[i])
            if pod_id is None:
                continue
            pod = pod_views[pod_id]
            ctr_view: ContainerView = waiting[i + 1]
            known.set_container(ctr_view.id, pod_id, ctr_view, waiting[i + 2])
            values = self._decide_container(pod, ctr_view, lines, refuse=False)
            if values is None:
                continue
            current: CgroupValues = waiting[i + 3]
            if self.observing:
                self._observed("Synchronize", pod, ctr_view, values, current)
            elif differs(values, current):
                set_resources(updates.add(container_id=ctr_view.id).linux.resources, values)
                self.counters.count_adjusted("Synchronize", fields=set_fields(values))
                if raises_quota(current.cpu_quota, values.cpu_quota):
                    raising.add(pod_id)
                if watch_lowering and lowers(current, values):
                    check = functools.partial(self._container_lowered, pod, ctr_view, values)
                    lowered.setdefault(pod_id, []).append(check)
            else:
                lines.unchanged()
                if not self._dry_run:
                    settled.append((pod, ctr_view, values))
        lines.write_after(self.after_reply)
        # Before the pods: a pod goes down only after its containers.
        for start in range(0, len(settled), _REPAIRS_PER_WORK):
            self.after_reply.defer(
                self._repair_containers, settled[start : start + _REPAIRS_PER_WORK]
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
        lowered: Mapping[str, list[Check]],
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
            checks = lowered.get(pod_id)
            if checks:
                wait.add(f"{view.namespace}/{view.name}", checks, write)
            else:
                self.after_reply.defer(write)
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
            now = read_container_values(
                self._cgroup_root,
                self._cgroup_driver,
                pod.cgroup_parent,
                container.id,
                cgroups_path,
            )
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
                now = read_container_values(
                    self._cgroup_root,
                    self._cgroup_driver,
                    pod.cgroup_parent,
                    container.id,
                    cgroups_path,
                )
            except (CgroupPathError, OSError, ValueError):
                continue  # gone, or not ours to read: nothing to repair here
            if holds(now, values):
                continue
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            try:
                report = apply_container_values(
                    self._cgroup_root,
                    self._cgroup_driver,
                    pod.cgroup_parent,
                    container.id,
                    values,
                    cgroups_path,
                )
            except CgroupPathError as exc:
                reason = str(exc)
            else:
                if report.ok:
                    self._hold(pod, container, values, cgroups_path)
                    self.counters.containers_repaired += 1
                    log.warning(
                        "container cgroup repaired: the runtime reported values it did not hold",
                        **where,
                        **_values_log(values),
                    )
                    continue
                reason = _describe_failures(report)
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

    async def stop_container(
        self, pod: api.PodSandbox, container: api.Container
    ) -> Sequence[api.ContainerUpdate]:
        return []

    async def update_pod_sandbox(
        self, pod: api.PodSandbox, overhead: api.LinuxResources, resources: api.LinuxResources
    ) -> None:
        return None

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
    ) -> CgroupValues | None:
        """Decide, count, and add the decision's line; the values to set, if any.

        `refuse` makes bad input an error reply.

        Only an operation the runtime can refuse on its own (creating or
        updating one container, running one pod) may be refused: an error from
        Synchronize would cost every pod on the node its plugin.
        """
        try:
            decision = decide_container(pod, container, self.policy)
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
        values = _shared_values(decision.values)
        lines.add(decision.tier, pod, container, values)
        return values

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
        return PodTarget(pod, decision.tier, _shared_values(decision.values))

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
        try:
            report = apply_pod_values(
                self._cgroup_root,
                self._cgroup_driver,
                pod.cgroup_parent,
                values,
            )
        except CgroupPathError as exc:
            reason = str(exc)
        else:
            if report.ok:
                self._hold(pod, None, values)
                self.counters.pod_writes_ok += 1
                # Changes at info; a pod whose files already held the values
                # (most of a Synchronize after a restart) at debug.
                (log.info if report.written else log.debug)(
                    "pod cgroup set",
                    method=method,
                    tier=target.tier,
                    **where,
                    **_values_log(values),
                    **({} if report.written else {"unchanged": True}),
                )
                return True
            reason = _describe_failures(report)
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
            now = read_pod_values(self._cgroup_root, self._cgroup_driver, pod.cgroup_parent)
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
            current = read_pod_values(self._cgroup_root, self._cgroup_driver, pod.cgroup_parent)
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


def _above(current: int, limit: int) -> bool:
    """Whether a quota or memory limit (UNLIMITED: none) is above `limit`."""
    if limit == UNLIMITED:
        return False
    return current == UNLIMITED or current > limit


def lowers(current: CgroupValues, new: CgroupValues) -> bool:
    """Whether `new` takes any of a container's values down (a None in `new` is kept)."""
    shares, memory = new.cpu_shares, new.memory_limit
    return (
        (shares is not None and current.cpu_shares is not None and shares < current.cpu_shares)
        or _above(current.cpu_quota, new.cpu_quota)
        or (
            memory is not None
            and current.memory_limit is not None
            and _above(current.memory_limit, memory)
        )
    )


def holds(reading: PodCgroupReading, values: CgroupValues) -> bool:
    """Whether a container's cgroup holds `values`, as far as it can be compared.

    The memory limit reads back rounded down to the page; cgroup v2 holds a
    weight, converted by the runtime its own way, which is not compared.
    """
    memory = values.memory_limit  # None (a quota-only tier): not ours to compare
    memory_held = (
        memory is None
        or reading.memory_limit == memory
        or (memory != UNLIMITED and 0 <= memory - reading.memory_limit < _PAGE)
    )
    shares = reading.cpu_shares
    return (
        memory_held
        and reading.cpu_quota == values.cpu_quota
        and (
            shares is None
            or values.cpu_shares is None
            or shares == clamp_cpu_shares(values.cpu_shares)
        )
    )


def exceeds(reading: PodCgroupReading, values: CgroupValues) -> bool:
    """Whether a cgroup holds more than `values` in any file it can be compared on.

    cgroup v2 holds a weight, which the runtime converts from shares its own
    way: only the quota and the memory limit are compared there.
    """
    shares, want_shares, memory = reading.cpu_shares, values.cpu_shares, values.memory_limit
    return (
        (shares is not None and want_shares is not None and shares > clamp_cpu_shares(want_shares))
        or _above(reading.cpu_quota, values.cpu_quota)
        or (memory is not None and _above(reading.memory_limit, memory))
    )


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


def _describe_failures(report: WriteReport) -> str:
    return "; ".join(f"{f.operation} {f.path}: {f.error}" for f in report.failed)
