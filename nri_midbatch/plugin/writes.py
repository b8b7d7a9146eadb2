"""Writing what was decided into cgroup files: pods, and containers the runtime cannot reach.

NRI cannot adjust a pod sandbox, so every pod value an event decides is written
here. Containers are written here only when the runtime reports values their
files do not hold (`repair_containers`); a reload's files and the convergence
pass are reconcile.py's. Each write is logged with its pod and container and
counted; the failure policy decides whether a failed pod write refuses the call.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from nri_midbatch.cgroups.values import exceeds, holds
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import PodTarget, values_log
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

#: A container the runtime reports at its values, to check against its files.
Settled = tuple[PodView, ContainerView, CgroupValues]


class Writes:
    def __init__(self, live: Live, records: Records, counters: Counters, *, dry_run: bool) -> None:
        """dry_run: write no cgroup file (replay, audits)."""
        self._live = live
        self._records = records
        self._counters = counters
        self._dry_run = dry_run

    def pod(self, target: PodTarget, method: str, *, refuse: bool, final: bool = True) -> bool:
        """Write a pod's values; a failure is reported only if `final`."""
        in_force = self._live.in_force
        pod, values = target.pod, target.values
        where = {"namespace": pod.namespace, "pod": pod.name}
        if self._dry_run:
            log.info(
                "pod cgroup not written: dry run",
                method=method,
                tier=target.tier,
                **where,
                **values_log(values),
            )
            return True
        written = in_force.cgroups.write(pod, None, values)
        reason = written.failure
        if reason is None:
            self._counters.pod_writes_ok += 1
            before = self._live.known.applied.get(target.pod_id)
            self._live.known.set_applied(target.pod_id, target.claimed)
            if before != target.claimed:
                self._records.keep(target.pod_id)
            # Changes at info; a pod whose files already held the values
            # (most of a Synchronize after a restart) at debug.
            (log.info if written.changed else log.debug)(
                "pod cgroup set",
                method=method,
                tier=target.tier,
                **where,
                **values_log(values),
                **({} if written.changed else {"unchanged": True}),
            )
            return True
        if final:
            self._pod_failed(method, where, reason, refuse)
        return False

    def pod_if_current(self, target: PodTarget, method: str) -> None:
        """Write the pod's values unless it was removed or a newer Synchronize took over."""
        if self._live.known.pods.get(target.pod_id) is target.pod:
            self.pod(target, method, refuse=False)

    def container_lowered(
        self, pod: PodView, container: ContainerView, values: CgroupValues
    ) -> bool:
        """Whether the container's cgroup holds no more than `values` (or is gone)."""
        in_force = self._live.in_force
        # The path as Known keeps it: one string per pod, not one per waiting container.
        cgroups_path = self._live.known.cgroups_path(container.id)
        try:
            now = in_force.cgroups.read(pod, container, cgroups_path)
        except CgroupUnreadable as exc:
            # Gone, or unreadable: waiting would not change that; the pod's
            # own write reports what is wrong with the tree.
            log.debug("container cgroup not readable", error=str(exc), container=container.name)
            return True
        return not exceeds(now, values)

    def repair_containers(self, settled: list[Settled]) -> None:
        """Write the cgroup files of containers the runtime says hold their values but do not.

        A runtime killed while it applied an update may have stored the new
        resources without their reaching the cgroup (containerd persists the
        spec first): its next Synchronize reports values the files do not
        hold, and asks for no update. Read after the reply, a slice at a time.
        """
        in_force = self._live.in_force
        for pod, container, values in settled:
            if container.id not in self._live.known.containers:
                continue  # removed since
            cgroups_path = self._live.known.cgroups_path(container.id)
            try:
                now = in_force.cgroups.read(pod, container, cgroups_path)
            except CgroupUnreadable:
                continue  # gone, or not ours to read: nothing to repair here
            if holds(now, values):
                continue
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            reason = in_force.cgroups.write(pod, container, values, cgroups_path).failure
            if reason is None:
                self._counters.containers_repaired += 1
                log.warning(
                    "container cgroup repaired: the runtime reported values it did not hold",
                    **where,
                    **values_log(values),
                )
                continue
            self._counters.container_repairs_failed += 1
            log.warning("container cgroup not repaired", reason=reason, **where)

    def _pod_failed(self, method: str, where: Mapping[str, str], reason: str, refuse: bool) -> None:
        self._counters.pod_writes_failed += 1
        log.warning("pod cgroup not set", method=method, reason=reason, **where)
        if refuse:
            raise RpcError(Code.INTERNAL, f"nri-midbatch: pod cgroup not set: {reason}")
