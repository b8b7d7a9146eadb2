"""Writing what an event decided into pod cgroup files.

NRI cannot adjust a pod sandbox, so every pod value an event decides is written
here; containers the runtime cannot reach (a reload's files, a Synchronize's
containers whose files do not hold what the runtime reports, drift) are the one
pass's (reconcile/). Each write is logged with its pod and counted; the
failure policy decides whether a failed pod write refuses the call.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from nri_midbatch.cgroups.values import exceeds
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import PodTarget, values_log
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import CgroupValues, ContainerView, PodView
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)


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

    def _pod_failed(self, method: str, where: Mapping[str, str], reason: str, refuse: bool) -> None:
        self._counters.pod_writes_failed += 1
        log.warning("pod cgroup not set", method=method, reason=reason, **where)
        if refuse:
            raise RpcError(Code.INTERNAL, f"nri-midbatch: pod cgroup not set: {reason}")
