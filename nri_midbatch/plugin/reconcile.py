"""One pass that brings files and runtime in line with the targets, whatever triggers it.

The values in force are a state the plugin keeps, not a reply it once sent. Events are the
fast path: each sets what it decides at once. This pass is what makes the promise hold
whoever wrote last. For a set of workloads it reads the cgroup files, compares them with
what they must hold, writes back what differs, and counts and logs it, pods before their
containers and a pod whose write failed once more after them (on cgroup v1 a pod's quota
may not go below a child's, nor a child's above its pod's). Its triggers:

- the period: every `convergence.intervalSeconds` over every known pod and container
  (`run`), compared with the target (state/baseline.py's `target`: the tier's values under
  the configuration in force, kubelet's for what is given back); only reads and repairs;
- a resize or an UpdatePodSandbox (`recheck_soon`), for that pod alone, shortly after:
  kubelet writes the pod cgroup after the containers when a resize lowers them, and (from
  kubernetes#137555) right after UpdatePodSandbox whatever the direction, so its write
  comes after the plugin's;
- a reload (`reload`): its plan first (state/plan.py: what differs from what was applied),
  through the runtime's UpdateContainers where that is safe, else the cgroup files
  (`write_plan`): pods whose containers' quota rises first, then the containers, then the
  other pods; what went through is applied and kept in the pods' records; then a whole
  pass, so a reload that changes nothing still puts back what someone else wrote;
- a Synchronize: it answers container updates in its reply (synchronize.py); its pods are
  written around the reply (`synchronize_pods`: raised before it, lowered once the runtime
  has lowered their containers, lowering.py, the rest after it); after the reply the
  containers it left are compared with the values the runtime reports they hold
  (`check_reported`), and a container whose write failed is tried once more after the
  pods (a pod someone lowered holds it back on v1).

A workload with a change still planned (a reload or a Synchronize not yet through: the
target differs from what the plugin last applied) is the planned change's to write, and is
skipped; so is a pod whose kubelet values are not known for sure. A value found that is
kubelet's known one is counted as kubelet's (a resize's write after the plugin's); any
other as unknown (an operator, an agent, another plugin, systemd). Nothing is learnt from
what a file holds: kubelet's baseline moves only with the events that tell it.

The checks run in pieces of the work left for after replies (deferred.py): each
workload's three files read, and written only where they differ, up to PIECE_WORKLOADS
workloads or PIECE_SECONDS a piece, so a request waits for at most one piece; the pieces of
a pass are queued one at a time. What a pass costs is mostly system calls: each workload's
files are located (resolved and checked below the root) once and kept (LocatedCgroups), a
piece opens each directory on its way once, and each workload's target is kept while what
it is derived from stays the same.
Under the systemd driver a repaired value is also handed back to systemd to hold (the
cgroup writer does it for every write); unit properties are not read: setting them makes
systemd write the files, where the pass sees any change.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.fs import OpenDirectories
from nri_midbatch.cgroups.values import CgroupReading, CgroupValues, cpu_shares_to_weight, drifted
from nri_midbatch.counts import CounterFamily, family, single
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable, LocatedCgroups
from nri_midbatch.plugin.codec import container_update
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import PodTarget, values_log
from nri_midbatch.plugin.lowering import Check, LoweringTimings, LoweringWait, Write
from nri_midbatch.plugin.records import Records
from nri_midbatch.plugin.writes import Writes
from nri_midbatch.policy import (
    ContainerView,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.baseline import kubelet_value, target
from nri_midbatch.state.plan import Plan, split_pods
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)

Level = Literal["pod", "container"]
Writer = Literal["kubelet", "unknown"]

#: With the periodic pass off (interval 0), how often the setting is looked at again.
IDLE_SECONDS = 1.0
#: A piece of a pass checks workloads until it has checked this many, or spent this long:
#: a request waits for at most one piece (about 0.05 ms a workload with its files located
#: already, a repair's writes more).
PIECE_WORKLOADS = 16
PIECE_SECONDS = 0.0005
#: Entries of gone pods (`checks`, located files) kept before they are pruned outside a pass.
_SLACK = 64

#: The runtime's UpdateContainers, for a reload where it is safe: the updates it could not
#: apply come back.
UpdateContainers = Callable[[list[api.ContainerUpdate]], Awaitable[Sequence[api.ContainerUpdate]]]
#: A container a Synchronize left as the runtime reports it (pod id, container id, values):
#: its files are checked against those values.
Reported = tuple[str, str, CgroupValues]


@dataclass(frozen=True, slots=True)
class ConvergenceTimings:
    #: Seconds after a resize or an UpdatePodSandbox at which the pod is checked again:
    #: kubelet writes the pod cgroup within milliseconds of the runtime's answer; the
    #: second check is for a kubelet that is slow (a loaded node).
    rechecks: tuple[float, ...] = (0.3, 2.0)


@dataclass(frozen=True, slots=True)
class Drift:
    """Values found in a cgroup that were neither the target nor left alone."""

    at: float  # wall clock, seconds
    container: str | None  # its name; None: the pod's own cgroup
    writer: Writer
    #: field -> [found, target]
    fields: dict[str, list[int | None]]
    repaired: bool


@dataclass(slots=True)
class PodCheck:
    """What `status` shows of a pod's convergence."""

    checked_at: float = 0.0  # wall clock, seconds; 0: not yet
    drift: Drift | None = None  # the last drift found in the pod or its containers


class _Outcome(Enum):
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


@dataclass(slots=True)
class _Walk:
    """Where a pass (or a re-check) is: the pods left, and the current pod's workloads."""

    pods: deque[str]
    done: asyncio.Future[None] | None = None
    items: deque[tuple[str, str | None]] = field(default_factory=deque)
    retried: bool = False
    #: workloads whose files were read, and those put back
    read: int = 0
    repaired: int = 0
    #: The Synchronize's trigger: container id -> the values the runtime reports it holds,
    #: which the walk compares its files with (not the target: the runtime applies the
    #: reply's updates itself); None: the target
    reported: dict[str, CgroupValues] | None = None
    #: Of those, the ones whose write failed, tried once more after the Synchronize's pods
    #: (`final`: the last try)
    again: list[tuple[str, str | None]] = field(default_factory=list)
    final: bool = False


class Reconciler:
    def __init__(
        self,
        live: Live,
        counters: Counters,
        after_reply: AfterReply,
        records: Records,
        writes: Writes,
        timings: ConvergenceTimings = ConvergenceTimings(),
        lowering_timings: LoweringTimings = LoweringTimings(),
        clock: Callable[[], float] = time.time,
        on_recheck: Callable[[str, bool], None] | None = None,
        *,
        dry_run: bool = False,
    ) -> None:
        """`writes`: the pods' writes (a Synchronize's, decided around its reply).
        `lowering_timings`: a Synchronize's wait for the runtime to lower containers
        (lowering.py). `clock`: the wall clock of the times `status` shows.
        `on_recheck(pod_id, final)`: run first at each re-check of a pod (`final`: its last),
        after the reply. `dry_run`: no check nor write (replay, audits)."""
        self._live = live
        self._counters = counters
        self._after_reply = after_reply
        self._dry_run = dry_run
        self._records = records
        self._writes = writes
        self._lowering_timings = lowering_timings
        #: The last Synchronize's pods waiting for their containers to be lowered.
        self._lowering: LoweringWait | None = None
        self._on_recheck = on_recheck
        self._timings = timings
        self._clock = clock
        #: pod sandbox id -> when it was last checked and the last drift found; pruned to the
        #: known pods
        self.checks: dict[str, PodCheck] = {}
        #: (pod id, delay) -> its pending re-check: a newer event moves it, so a pod has at
        #: most one per delay
        self._rechecks: dict[tuple[str, float], asyncio.TimerHandle] = {}
        self._closed = False
        #: whole passes over every known pod
        self.passes = 0
        #: each checked workload's cgroup files, located once, and its target; pruned to the
        #: known workloads
        self._located = LocatedCgroups()
        self._targets: dict[tuple[str, str | None], _Target] = {}
        #: (path, result) -> workloads brought to a reloaded configuration
        self.followed: dict[tuple[str, str], int] = {
            key: 0
            for key in (
                ("update_containers", "ok"),
                ("update_containers", "refused"),
                ("cgroup_files", "ok"),
                ("cgroup_files", "failed"),
            )
        }
        #: Passes a reload started, not awaited
        self._passes: set[asyncio.Task[None]] = set()
        #: Whole passes run one at a time (a reload's after the period's, or the reverse)
        self._passing = asyncio.Lock()

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_convergence_passes",
            "Convergence passes over every known pod and container",
            self.passes,
        )
        yield family(
            "nri_midbatch_reload_writes",
            "Containers and pods brought to a reloaded configuration, by path and result",
            ("path", "result"),
            self.followed,
        )

    # -- triggers ----------------------------------------------------------------

    def recheck_soon(self, pod_id: str) -> None:
        """Check the pod and its containers again after each of `ConvergenceTimings.rechecks`."""
        if self._dry_run or self._closed:
            return
        loop = asyncio.get_running_loop()
        for delay in self._timings.rechecks:
            key = (pod_id, delay)
            pending = self._rechecks.pop(key, None)
            if pending is not None:
                pending.cancel()
            self._rechecks[key] = loop.call_later(delay, self._recheck_due, key)

    def recheck_now(self) -> None:
        """Run every pending re-check now (tests, instead of waiting for their time)."""
        for key in sorted(self._rechecks, key=lambda key: key[1]):
            self._rechecks.pop(key).cancel()
            self._recheck(key)

    def _recheck_due(self, key: tuple[str, float]) -> None:
        self._rechecks.pop(key, None)
        self._recheck(key)

    def _recheck(self, key: tuple[str, float]) -> None:
        pod_id, delay = key
        if self._on_recheck is not None and not self._closed:
            final = delay == max(self._timings.rechecks)
            self._after_reply.defer(self._on_recheck, pod_id, final)
        self.check_pod(pod_id)

    def check_pod(self, pod_id: str) -> None:
        """Check the pod and its containers after the current reply, a piece at a time."""
        if not self._closed:
            self._after_reply.defer(self._step, _Walk(deque((pod_id,))))

    async def converge(self) -> None:
        """One pass over every known pod and container, after any other; returns once it is
        through."""
        if self._dry_run or self._closed:
            return
        async with self._passing:
            if not self._closed:
                await self._converge()

    async def _converge(self) -> None:
        known = self._live.known
        for gone in [pod_id for pod_id in self.checks if pod_id not in known.pods]:
            del self.checks[gone]
        self._prune()
        done = asyncio.get_running_loop().create_future()
        walk = _Walk(deque(known.pods), done)
        started, cpu = time.perf_counter(), time.process_time()
        self._after_reply.defer(self._step, walk)
        await done
        self.passes += 1
        # Its cost, for operators and `make bench`: three files per workload read.
        (log.info if walk.repaired else log.debug)(
            "convergence pass",
            pods=len(self.checks),
            cgroups_read=walk.read,
            files_read=3 * walk.read,
            repaired=walk.repaired,
            seconds=round(time.perf_counter() - started, 4),
            cpu_seconds=round(time.process_time() - cpu, 4),
        )

    async def run(self) -> None:
        """The periodic pass, for as long as the plugin runs: `convergence.intervalSeconds`
        after the end of the last one, the setting read again at least every IDLE_SECONDS (a
        reload applies within that)."""
        loop = asyncio.get_running_loop()
        since = loop.time()
        while True:
            interval = self._live.in_force.config.convergence.interval_seconds
            wait = IDLE_SECONDS if interval <= 0 else since + interval - loop.time()
            await asyncio.sleep(min(max(wait, 0.0), IDLE_SECONDS))
            interval = self._live.in_force.config.convergence.interval_seconds
            if interval > 0 and loop.time() >= since + interval:
                await self.converge()
                since = loop.time()

    def check_reported(self, reported: list[Reported]) -> None:
        """The Synchronize's trigger, after its reply: containers the runtime reports at the
        values in force (so asked for no update) whose files may not hold them.

        A runtime killed while it applied an update may have stored the new resources
        without their reaching the cgroup (containerd persists the spec first): its next
        Synchronize reports values the files do not hold. Queued now, before the pods the
        Synchronize writes after its reply (a pod goes down only after its containers).
        """
        for start in range(0, len(reported), PIECE_WORKLOADS):
            chunk = reported[start : start + PIECE_WORKLOADS]
            walk = _Walk(
                deque(),
                items=deque((pod_id, container_id) for pod_id, container_id, _ in chunk),
                reported={container_id: values for _, container_id, values in chunk},
            )
            self._after_reply.defer(self._step, walk)

    def synchronize_pods(
        self, targets: Sequence[PodTarget], raising: set[str], lowered: Mapping[str, Check]
    ) -> None:
        """The Synchronize's trigger for its pods (decided, `targets`): written before its
        reply, after it, or later.

        The runtime applies the reply's container updates after the reply. A pod whose
        containers' quota goes up (`raising`) is raised first, now (on cgroup v1 a child's
        quota above its pod's is EINVAL); refused, it tries once more when its turn comes. A
        pod whose containers go down (`lowered`: the check of its last container, in the
        reply's order) is written once the runtime has lowered them, as their cgroup files
        show (lowering.py). Any other pod is written right after the reply, which also keeps
        0.2 ms of file I/O per pod out of the one request the runtime gives 2 s for the
        whole node.
        """
        writes = self._writes
        if self._lowering is not None:
            self._lowering.cancel()  # a newer Synchronize decides every pod anew
        wait = self._lowering = LoweringWait(
            self._after_reply, timings=self._lowering_timings, counters=self._counters
        )
        #: pod id -> its pod and its write, for the pods that wait
        waiting: dict[str, tuple[PodView, Write]] = {}
        for decided in targets:
            pod_id = decided.pod_id
            if pod_id in raising and writes.pod(decided, "Synchronize", refuse=False, final=False):
                continue
            write: Write = functools.partial(writes.pod_if_current, decided, "Synchronize")
            if pod_id in lowered:
                waiting[pod_id] = decided.pod, write
            else:
                self._after_reply.defer(write)
        # In the order the runtime will get to them.
        for pod_id, check in lowered.items():
            if pod_id in waiting:
                pod, write = waiting[pod_id]
                wait.add(f"{pod.namespace}/{pod.name}", check, write)
        wait.start()

    async def through(self) -> None:
        """Wait for the passes reloads started (tests)."""
        while self._passes:
            await asyncio.gather(*self._passes)

    def close(self) -> None:
        """Stop: no re-check or piece of a pass runs any more (shutting down)."""
        self._closed = True
        for timer in self._rechecks.values():
            timer.cancel()
        self._rechecks.clear()
        for task in self._passes:
            task.cancel()  # its walk's pieces stop: it would wait for good

    # -- the reload's trigger ----------------------------------------------------------

    async def reload(
        self, plan: Plan, update_containers: UpdateContainers | None, timeout: float
    ) -> None:
        """Bring running workloads to a reload's `plan`, then start a pass over every one.

        `update_containers`: the runtime's, where it is safe (it returns once the runtime
        has applied the updates; `timeout` its deadline); else, and for what it refuses, the
        cgroup files. Pods whose containers' quota rises go first, the other pods after the
        containers. The pass (with convergence on) puts back what anyone else wrote, which no
        plan sees: a reload that changes nothing still repairs drift.
        """
        if plan:
            await self._follow(plan, update_containers, timeout)
        interval = self._live.in_force.config.convergence.interval_seconds
        if interval > 0 and not self._dry_run and not self._closed:
            task = asyncio.create_task(self.converge())
            self._passes.add(task)
            task.add_done_callback(self._passes.discard)

    async def _follow(
        self, plan: Plan, update_containers: UpdateContainers | None, timeout: float
    ) -> None:
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
            self._count_followed("update_containers", "failed", len(updates))
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
        self._count_followed("update_containers", "ok", len(updates) - len(refused))
        self._count_followed("update_containers", "refused", len(refused))
        updated = tuple(c for c in plan.containers if c.container.id not in refused)
        self.applied(Plan(updated, ()))
        rest = tuple(c for c in plan.containers if c.container.id in refused)
        await self._write_files(Plan(rest, rest_of_pods))

    async def _write_files(self, plan: Plan) -> None:
        if not plan:
            return
        failed = await asyncio.to_thread(self.write_plan, plan)
        failures = len(failed.containers) + len(failed.pods)
        self.applied(plan, failed, by_files=True)
        self._count_followed("cgroup_files", "ok", len(plan.containers) + len(plan.pods) - failures)
        self._count_followed("cgroup_files", "failed", failures)
        if failures:
            log.warning("some cgroups did not take the new configuration", failures=failures)

    def _count_followed(self, path: str, result: str, count: int) -> None:
        key = (path, result)
        self.followed[key] = self.followed.get(key, 0) + count

    def applied(self, plan: Plan, failed: Plan | None = None, *, by_files: bool = False) -> None:
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
        """Bring running workloads to a reload's `plan` through their cgroup files; returns
        what failed.

        For runtimes whose UpdateContainers is unsafe, and for what the runtime refused.
        Blocking file I/O: run it in a thread (`reload` does). The order is the pass's: a pod
        goes up before its containers and down after them (lowering.py says why): pods whose
        containers' quota rises first, then the containers, then the other pods and those of
        the first that failed once more.
        """
        first, last = split_pods(plan)
        retry = [
            change
            for change in first
            if not self._for_reload(change.pod, None, change.values, final=False)
        ]
        failed_containers = tuple(
            change
            for change in plan.containers
            if not self._for_reload(
                change.pod, change.container, change.values, cgroups_path=change.cgroups_path
            )
        )
        failed_pods = tuple(
            change
            for change in (*retry, *last)
            if not self._for_reload(change.pod, None, change.values)
        )
        return Plan(failed_containers, failed_pods)

    def _for_reload(
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

    # -- the pieces ----------------------------------------------------------------

    def _step(self, walk: _Walk) -> None:
        """One piece: workloads checked until PIECE_WORKLOADS or PIECE_SECONDS; then the next
        piece is queued."""
        if self._closed:
            return
        deadline = time.perf_counter() + PIECE_SECONDS
        # A pod's and its containers' cgroups sit side by side: the piece opens each
        # directory on their way once.
        directories = OpenDirectories()
        try:
            for _ in range(PIECE_WORKLOADS):
                item = self._next(walk)
                if item is None:
                    self._through(walk)
                    return
                pod_id, container_id = item
                outcome = self._check(walk, pod_id, container_id, directories)
                if outcome is not _Outcome.SKIPPED:
                    walk.read += 1
                    walk.repaired += outcome is _Outcome.REPAIRED
                if outcome is _Outcome.FAILED and walk.reported is not None and not walk.final:
                    walk.again.append(item)
                elif container_id is None and outcome is _Outcome.FAILED and not walk.retried:
                    # Once more after its containers: they may hold it back (cgroup v1).
                    walk.retried = True
                    walk.items.append((pod_id, None))
                if time.perf_counter() >= deadline:
                    break
        finally:
            directories.close()
        if not walk.items and not walk.pods:
            self._through(walk)
        elif walk.done is None:
            self._after_reply.defer(self._step, walk)
        else:
            # A turn of the loop between the pieces of a pass: whatever waits for the work
            # after replies to settle (a reload) does not wait for the whole pass.
            asyncio.get_running_loop().call_soon(self._after_reply.defer, self._step, walk)

    def _through(self, walk: _Walk) -> None:
        if walk.done is not None and not walk.done.done():
            walk.done.set_result(None)
        if walk.again:
            # Once more after the pods the Synchronize writes after its reply, queued
            # before: on cgroup v1 a pod's quota that someone lowered holds its containers'
            # back until the pod is written.
            again = _Walk(deque(), items=deque(walk.again), reported=walk.reported)
            again.final = True
            self._after_reply.defer(self._step, again)

    def _next(self, walk: _Walk) -> tuple[str, str | None] | None:
        """The walk's next workload (a pod before its containers); None once through."""
        known = self._live.known
        while not walk.items:
            if not walk.pods:
                return None
            pod_id = walk.pods.popleft()
            if pod_id in known.pods:
                walk.retried = False
                walk.items.append((pod_id, None))
                walk.items.extend((pod_id, c) for c in known.containers_of(pod_id))
        return walk.items.popleft()

    def _check(
        self,
        walk: _Walk,
        pod_id: str,
        container_id: str | None,
        directories: OpenDirectories,
    ) -> _Outcome:
        known = self._live.known
        pod = known.pods.get(pod_id)
        if pod is None:
            return _Outcome.SKIPPED
        container: ContainerView | None = None
        if walk.reported is not None:
            # The Synchronize's: as the runtime reports it, whatever the plugin applied.
            assert container_id is not None  # it reports containers only
            entry = known.containers.get(container_id)
            if entry is None or entry[0] != pod_id:
                return _Outcome.SKIPPED  # removed since
            container = entry[1]
            return self._compare(
                (pod_id, container_id),
                pod,
                container,
                walk.reported[container_id],
                directories,
                final=walk.final,
            )
        if container_id is None:
            self._note(pod_id).checked_at = self._clock()
            if not known.baseline_known(pod_id):
                return _Outcome.SKIPPED  # kubelet's values are not known: never guessed
            kubelet = pod.native
        else:
            entry = known.containers.get(container_id)
            if entry is None or entry[0] != pod_id:
                return _Outcome.SKIPPED
            container = entry[1]
            kubelet = container.native
        applied = known.applied.get(pod_id if container_id is None else container_id)
        if applied is None:
            return _Outcome.SKIPPED  # nothing of the plugin's here
        key = (pod_id, container_id)
        values = self._target(key, pod, container, applied)
        if values is None:
            return _Outcome.SKIPPED
        return self._compare(key, pod, container, values, directories, kubelet)

    def _compare(
        self,
        key: tuple[str, str | None],
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        directories: OpenDirectories,
        kubelet: NativeLimits | None = None,
        *,
        final: bool = True,
    ) -> _Outcome:
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
            return _Outcome.SKIPPED  # gone, or not there yet: its own events say so
        finally:
            if len(self._located) > len(known.pods) + len(known.containers) + _SLACK:
                self._prune()
        in_container = container is not None
        off = drifted(reading, values, container=in_container)
        if not off:
            return _Outcome.HELD
        if kubelet is None:
            assert container is not None
            return self._repair_reported(pod, container, path, values, final=final)
        writer = _writer(reading, off, kubelet, container=in_container)
        changes = _changes(reading, values, off)
        return self._repair(pod_id, pod, container, path, values, changes, writer)

    def _target(
        self,
        key: tuple[str, str | None],
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
    ) -> _Outcome:
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
            return _Outcome.FAILED
        counters.drift_repaired[level, writer] += 1
        log.warning(
            "cgroup values changed by another writer, put back",
            writer=writer,
            changes=changes,
            **where,
            **values_log(values),
        )
        return _Outcome.REPAIRED

    def _repair_reported(
        self,
        pod: PodView,
        container: ContainerView,
        path: str,
        values: CgroupValues,
        *,
        final: bool,
    ) -> _Outcome:
        counters = self._counters
        where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
        reason = self._live.in_force.cgroups.write(pod, container, values, path).failure
        if reason is not None and not final:
            return _Outcome.FAILED
        if reason is None:
            counters.containers_repaired += 1
            log.warning(
                "container cgroup repaired: the runtime reported values it did not hold",
                **where,
                **values_log(values),
            )
            return _Outcome.REPAIRED
        counters.container_repairs_failed += 1
        log.warning("container cgroup not repaired", reason=reason, **where)
        return _Outcome.FAILED

    def _prune(self) -> None:
        """Keep what is kept per workload to the known workloads."""
        self._located.keep(self._is_known)
        for gone in [key for key in self._targets if not self._is_known(key)]:
            del self._targets[gone]

    def _is_known(self, key: tuple[str, str | None]) -> bool:
        """Whether the workload (a pod's sandbox id, and a container's id or None) is known."""
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


def _writer(
    reading: CgroupReading, off: tuple[str, ...], kubelet: NativeLimits, *, container: bool
) -> Writer:
    """Kubelet's, if every field off holds kubelet's known value there; else unknown."""
    if "cpu_shares" in off and kubelet.cpu_shares is None:
        return "unknown"
    quota = kubelet_value(kubelet, "cpu_quota")
    assert quota is not None  # only the shares can be unknown
    theirs = CgroupValues(kubelet.cpu_shares, quota, kubelet_value(kubelet, "memory_limit"))
    still_off = drifted(reading, theirs, container=container)
    return "unknown" if any(name in still_off for name in off) else "kubelet"


def _changes(
    reading: CgroupReading, values: CgroupValues, off: tuple[str, ...]
) -> dict[str, list[int | None]]:
    """field -> [found, target], for the fields off; a v2 weight as the weight."""
    changes: dict[str, list[int | None]] = {}
    for name in off:
        if name == "cpu_shares" and reading.cpu_shares is None:
            assert values.cpu_shares is not None  # only a field set is off
            changes["cpu_weight"] = [reading.cpu_weight, cpu_shares_to_weight(values.cpu_shares)]
        else:
            changes[name] = [getattr(reading, name), getattr(values, name)]
    return changes
