"""A reload's plan followed: running workloads brought to a new configuration.

The plan (state/plan.py: what differs from what was applied) goes through the runtime's
UpdateContainers where that is safe, else the cgroup files (`write_plan`), in the pass's
order of writes: pods whose containers' quota rises first, then the containers, then the
other pods. What went through is applied and kept in the pods' records; what failed stays
planned, for the next reload or Synchronize. After it the Reconciler runs a whole pass
(reconciler.py), so a reload that changes nothing still puts back what someone else wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import CgroupValues
from nri_midbatch.plugin.codec import container_update
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.decisions import values_log
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import ContainerView, PodView
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.plan import Plan, split_pods
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

#: The runtime's UpdateContainers, for a reload where it is safe: the updates it could not
#: apply come back.
UpdateContainers = Callable[[list[api.ContainerUpdate]], Awaitable[Sequence[api.ContainerUpdate]]]


class ReloadFollow:
    def __init__(self, live: Live, records: Records) -> None:
        self._live = live
        self._records = records
        #: (path, result) -> workloads brought to a reloaded configuration (the
        #: Reconciler's metrics)
        self.followed: dict[tuple[str, str], int] = {
            key: 0
            for key in (
                ("update_containers", "ok"),
                ("update_containers", "refused"),
                ("cgroup_files", "ok"),
                ("cgroup_files", "failed"),
            )
        }

    async def follow(
        self, plan: Plan, update_containers: UpdateContainers | None, timeout: float
    ) -> None:
        """Bring running workloads to `plan`.

        `update_containers`: the runtime's, where it is safe (it returns once the runtime
        has applied the updates; `timeout` its deadline); else, and for what it refuses, the
        cgroup files."""
        if not plan.containers or update_containers is None:
            await self._write_files(plan)
            return
        # Pods go up before their containers; down only after the reply to
        # UpdateContainers, by which the runtime has applied the updates.
        raised_first, rest_of_pods = split_pods(plan)
        await self._write_files(Plan((), raised_first))
        updates = [container_update(c.container.id, c.values) for c in plan.containers]
        try:
            # A runtime that never answers must not hold the reload, and with it the
            # watch, for good: the call's deadline ends the wait.
            failed = await update_containers(updates)
        except Exception as exc:  # a lost connection must not lose the pass
            self._count("update_containers", "failed", len(updates))
            if isinstance(exc, RpcError) and exc.code is Code.DEADLINE_EXCEEDED:
                error = f"no answer within {timeout:g} s"
            else:
                error = str(exc) or type(exc).__name__
            log.warning(
                "UpdateContainers failed, writing cgroup files",
                error=error,
                containers=len(updates),
            )
            await self._write_files(Plan(plan.containers, rest_of_pods))
            return
        refused = {u.container_id for u in failed}
        for change in plan.containers:
            if change.container.id in refused:
                log.warning(
                    "runtime could not update the container, writing its cgroup files",
                    namespace=change.pod.namespace,
                    pod=change.pod.name,
                    container=change.container.name,
                )
        self._count("update_containers", "ok", len(updates) - len(refused))
        self._count("update_containers", "refused", len(refused))
        updated = tuple(c for c in plan.containers if c.container.id not in refused)
        self._applied(Plan(updated, ()))
        rest = tuple(c for c in plan.containers if c.container.id in refused)
        await self._write_files(Plan(rest, rest_of_pods))

    async def _write_files(self, plan: Plan) -> None:
        if not plan:
            return
        failed = await asyncio.to_thread(self.write_plan, plan)
        failures = len(failed.containers) + len(failed.pods)
        self._applied(plan, failed, by_files=True)
        self._count("cgroup_files", "ok", len(plan.containers) + len(plan.pods) - failures)
        self._count("cgroup_files", "failed", failures)
        if failures:
            log.warning("some cgroups did not take the new configuration", failures=failures)

    def _count(self, path: str, result: str, count: int) -> None:
        key = (path, result)
        self.followed[key] = self.followed.get(key, 0) + count

    def _applied(self, plan: Plan, failed: Plan | None = None, *, by_files: bool = False) -> None:
        """Remember that `plan`, less `failed`, is in force, and keep the pods' records.

        A change that failed stays planned: the next reload or Synchronize tries it again.
        `by_files`: the containers' values went into their cgroup files, which the runtime
        does not know of; their pods' records keep them, as the runtime will not report them.
        """
        known = self._live.known
        failed_ids = set() if failed is None else {c.container.id for c in failed.containers}
        failed_pods = set() if failed is None else {c.pod_id for c in failed.pods}
        touched: set[str] = set()
        for change in plan.containers:
            entry = known.containers.get(change.container.id)
            if change.container.id in failed_ids or entry is None:
                continue
            known.note_set(change.container.id, change.claimed, by_files=by_files)
            touched.add(entry[0])
        for pod_change in plan.pods:
            if pod_change.pod_id in failed_pods or pod_change.pod_id not in known.pods:
                continue
            known.set_applied(pod_change.pod_id, pod_change.claimed)
            touched.add(pod_change.pod_id)
        for pod_id in touched:
            self._records.keep(pod_id)

    def write_plan(self, plan: Plan) -> Plan:
        """Bring running workloads to `plan` through their cgroup files; returns what failed.

        For runtimes whose UpdateContainers is unsafe, and for what the runtime refused.
        Blocking file I/O: run it in a thread (`follow` does). The order is the pass's: a pod
        goes up before its containers and down after them (lowering.py says why): pods whose
        containers' quota rises first, then the containers, then the other pods and those of
        the first that failed once more.
        """
        first, last = split_pods(plan)
        retry = [
            change
            for change in first
            if not self._write(change.pod, None, change.values, final=False)
        ]
        failed_containers = tuple(
            change
            for change in plan.containers
            if not self._write(
                change.pod, change.container, change.values, cgroups_path=change.cgroups_path
            )
        )
        failed_pods = tuple(
            change for change in (*retry, *last) if not self._write(change.pod, None, change.values)
        )
        return Plan(failed_containers, failed_pods)

    def _write(
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
        reason = self._live.in_force.cgroups.write(pod, container, values, cgroups_path).failure
        if reason is None:
            log.info("cgroup set for new configuration", **where, **values_log(values))
            return True
        if final:
            log.warning("cgroup not set for new configuration", reason=reason, **where)
        return False
