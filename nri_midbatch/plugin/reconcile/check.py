"""The check of one workload (a pod's own cgroup, or a container's): what it must hold,
what its files hold, and the repair where they differ.

Every trigger of the pass ends here, one workload at a time (walk.py paces them). The
target is state/baseline.py's `target`: the tier's values under the configuration in
force, kubelet's for what is given back. A workload with a change still planned (a reload
or a Synchronize not yet through: the target differs from what the plugin last applied) is
the planned change's to write, and is skipped; so is a pod whose kubelet values are not
known for sure. Nothing is learnt from what a file holds: kubelet's baseline moves only
with the events that tell it. The Synchronize's trigger compares a container with the
values the runtime reports it holds instead (the runtime applies the reply's updates
itself).

What a pass costs is mostly system calls, so this room keeps, per workload, its files
located (resolved and checked below the root, LocatedCgroups) and its target while what it
is derived from stays the same, both pruned to the known workloads; and per pod the note
`status` shows (drift.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Literal

import structlog

from nri_midbatch.cgroups.fs import OpenDirectories
from nri_midbatch.cgroups.values import CgroupValues, drifted
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable, LocatedCgroups
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import values_log
from nri_midbatch.plugin.reconcile.drift import Drift, PodCheck, Writer, changes_of, writer_of
from nri_midbatch.policy import (
    ContainerView,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)
from nri_midbatch.state.baseline import target

log = structlog.get_logger(__name__)

Level = Literal["pod", "container"]
#: A workload: a pod's sandbox id, and a container's id or None for the pod's own cgroup.
Workload = tuple[str, str | None]

#: Entries of gone pods (`checks`, located files) kept before they are pruned outside a pass.
_SLACK = 64


class Outcome(Enum):
    SKIPPED = "skipped"  # nothing of the plugin's, gone, or not comparable now
    HELD = "held"
    REPAIRED = "repaired"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class _Target:
    """A workload's target, and what it was derived from."""

    policy: Policy
    pod: PodView
    container: ContainerView | None
    enforce: bool
    applied: CgroupValues
    values: CgroupValues | None  # None: the pass leaves the workload


class Checker:
    def __init__(self, live: Live, counters: Counters, clock: Callable[[], float]) -> None:
        """`clock`: the wall clock of the times `status` shows."""
        self._live = live
        self._counters = counters
        self._clock = clock
        #: pod sandbox id -> when it was last checked and the last drift found; pruned to the
        #: known pods
        self.checks: dict[str, PodCheck] = {}
        #: each checked workload's cgroup files, located once, and its target; pruned to the
        #: known workloads
        self._located = LocatedCgroups()
        self._targets: dict[Workload, _Target] = {}

    def kept(self) -> tuple[set[Workload], set[Workload]]:
        """The workloads whose located files, and those whose targets, are kept."""
        return self._located.workloads(), set(self._targets)

    def check(
        self,
        workload: Workload,
        directories: OpenDirectories,
        reported: CgroupValues | None = None,
        *,
        final: bool = True,
    ) -> Outcome:
        """Check the workload, and repair it where it differs.

        `directories`: those the current piece opened on its way. `reported`: the values the
        runtime reports the container holds (the Synchronize's trigger), compared instead of
        the target; a failure then counts only if `final`."""
        known = self._live.known
        pod_id, container_id = workload
        pod = known.pods.get(pod_id)
        if pod is None:
            return Outcome.SKIPPED
        container: ContainerView | None = None
        if reported is not None:
            # The Synchronize's: as the runtime reports it, whatever the plugin applied.
            assert container_id is not None  # it reports containers only
            entry = known.containers.get(container_id)
            if entry is None or entry[0] != pod_id:
                return Outcome.SKIPPED  # removed since
            container = entry[1]
            return self._compare(workload, pod, container, reported, directories, final=final)
        if container_id is None:
            self._note(pod_id).checked_at = self._clock()
            if not known.baseline_known(pod_id):
                return Outcome.SKIPPED  # kubelet's values are not known: never guessed
            kubelet = pod.native
        else:
            entry = known.containers.get(container_id)
            if entry is None or entry[0] != pod_id:
                return Outcome.SKIPPED
            container = entry[1]
            kubelet = container.native
        applied = known.applied.get(pod_id if container_id is None else container_id)
        if applied is None:
            return Outcome.SKIPPED  # nothing of the plugin's here
        values = self._target(workload, pod, container, applied)
        if values is None:
            return Outcome.SKIPPED
        return self._compare(workload, pod, container, values, directories, kubelet)

    def _compare(
        self,
        key: Workload,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        directories: OpenDirectories,
        kubelet: NativeLimits | None = None,
        *,
        final: bool = True,
    ) -> Outcome:
        """Read the workload's files, and write `values` back where they differ.

        `kubelet`: its known values, to tell kubelet's write from anyone else's; None: the
        Synchronize's trigger, which counts a repair as the runtime's report not held, and a
        failure only if `final`."""
        in_force = self._live.in_force
        known = self._live.known
        pod_id, container_id = key
        path = "" if container_id is None else known.cgroups_path(container_id)
        try:
            if kubelet is None:
                # Once per Synchronize: located afresh, not kept (a node's worth of entries,
                # held for nothing with the period off).
                reading = in_force.cgroups.read(pod, container, path)
            else:
                reading = self._located.read(
                    in_force.cgroups, key, pod, container, path, directories
                )
        except CgroupUnreadable:
            return Outcome.SKIPPED  # gone, or not there yet: its own events say so
        finally:
            if len(self._located) > len(known.pods) + len(known.containers) + _SLACK:
                self._prune_kept()
        in_container = container is not None
        off = drifted(reading, values, container=in_container)
        if not off:
            return Outcome.HELD
        if kubelet is None:
            assert container is not None
            return self._repair_reported(pod, container, path, values, final=final)
        writer = writer_of(reading, off, kubelet, container=in_container)
        changes = changes_of(reading, values, off)
        return self._repair(pod_id, pod, container, path, values, changes, writer)

    def _target(
        self,
        key: Workload,
        pod: PodView,
        container: ContainerView | None,
        applied: CgroupValues,
    ) -> CgroupValues | None:
        """What the workload must hold; None: the pass leaves it (bad input, as the events
        leave it; a planned change, the reload's or Synchronize's to write).

        Kept per workload while the policy, the views (kubelet's values among them) and what
        was applied stay the same: a reload compiles another policy, an event replaces a view.
        """
        in_force = self._live.in_force
        policy = in_force.policy
        enforce = in_force.config.enforces(pod=container is None)
        kept = self._targets.get(key)
        if (
            kept is not None
            and kept.policy is policy
            and kept.pod is pod
            and kept.container is container
            and kept.enforce == enforce
            and kept.applied == applied
        ):
            return kept.values
        try:
            if container is None:
                decision = decide_pod(pod, policy)
            else:
                decision = decide_container(pod, container, policy)
        except Exception:  # the events that decide it report it
            values = None
        else:
            kubelet = pod.native if container is None else container.native
            values = None
            if decision.error is None:
                values = target(decision, applied, kubelet, enforce=enforce).values
                if values != applied:
                    values = None
        self._targets[key] = _Target(policy, pod, container, enforce, applied, values)
        return values

    def _repair(
        self,
        pod_id: str,
        pod: PodView,
        container: ContainerView | None,
        path: str,
        values: CgroupValues,
        changes: dict[str, list[int | None]],
        writer: Writer,
    ) -> Outcome:
        in_force = self._live.in_force
        level: Level = "pod" if container is None else "container"
        counters = self._counters
        counters.drift_found[level, writer] += 1
        failure = in_force.cgroups.write(pod, container, values, path).failure
        where = {"namespace": pod.namespace, "pod": pod.name}
        if container is not None:
            where["container"] = container.name
        self._note(pod_id).drift = Drift(
            self._clock(),
            None if container is None else container.name,
            writer,
            changes,
            failure is None,
        )
        if failure is not None:
            log.warning(
                "cgroup values changed by another writer, not put back",
                writer=writer,
                changes=changes,
                reason=failure,
                **where,
            )
            return Outcome.FAILED
        counters.drift_repaired[level, writer] += 1
        log.warning(
            "cgroup values changed by another writer, put back",
            writer=writer,
            changes=changes,
            **where,
            **values_log(values),
        )
        return Outcome.REPAIRED

    def _repair_reported(
        self,
        pod: PodView,
        container: ContainerView,
        path: str,
        values: CgroupValues,
        *,
        final: bool,
    ) -> Outcome:
        counters = self._counters
        where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
        reason = self._live.in_force.cgroups.write(pod, container, values, path).failure
        if reason is not None and not final:
            return Outcome.FAILED
        if reason is None:
            counters.containers_repaired += 1
            log.warning(
                "container cgroup repaired: the runtime reported values it did not hold",
                **where,
                **values_log(values),
            )
            return Outcome.REPAIRED
        counters.container_repairs_failed += 1
        log.warning("container cgroup not repaired", reason=reason, **where)
        return Outcome.FAILED

    def prune(self) -> None:
        """Keep what is kept per pod and per workload to the known ones (a whole pass's
        start)."""
        known = self._live.known
        for gone in [pod_id for pod_id in self.checks if pod_id not in known.pods]:
            del self.checks[gone]
        self._prune_kept()

    def _prune_kept(self) -> None:
        self._located.keep(self._is_known)
        for gone in [key for key in self._targets if not self._is_known(key)]:
            del self._targets[gone]

    def _is_known(self, key: Workload) -> bool:
        known = self._live.known
        pod_id, container_id = key
        if container_id is None:
            return pod_id in known.pods
        entry = known.containers.get(container_id)
        return entry is not None and entry[0] == pod_id

    def _note(self, pod_id: str) -> PodCheck:
        check = self.checks.get(pod_id)
        if check is None:
            known = self._live.known
            if len(self.checks) > len(known.pods) + _SLACK:  # passes off: prune here too
                for gone in [p for p in self.checks if p not in known.pods]:
                    del self.checks[gone]
            check = self.checks[pod_id] = PodCheck()
        return check
