"""Convergence: the values in force are a state the plugin keeps, not a reply it once sent.

Events are the fast path: each sets what it decides at once. This pass is what makes the
promise hold whoever wrote last. For every pod and container the plugin has values in force
on, it reads the cgroup files, compares them with the target (state/baseline.py's `target`:
the tier's values under the configuration in force, kubelet's for what is given back), and
writes back what differs. It runs

- every `convergence.intervalSeconds` over every known pod and container (`run`), pods
  before their containers and a pod whose write failed once more after them (on cgroup v1 a
  pod's quota may not go below a child's, nor a child's above its pod's);
- shortly after a resize or an UpdatePodSandbox (`recheck_soon`), for that pod alone:
  kubelet writes the pod cgroup after the containers when a resize lowers them, and (from
  kubernetes#137555) right after UpdatePodSandbox whatever the direction, so its write
  comes after the plugin's.

A workload with a change still planned (a reload or a Synchronize not yet through: the
target differs from what the plugin last applied) is the planned change's to write, and is
skipped; so is a pod whose kubelet values are not known for sure. A value found that is
kubelet's known one is counted as kubelet's (a resize's write after the plugin's); any
other as unknown (an operator, an agent, another plugin, systemd). Nothing is learnt from
what a file holds: kubelet's baseline moves only with the events that tell it.

A reload's writes through the cgroup files (`write_plan`) follow the same order: pods whose
containers go up first, then the containers, then the other pods.

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
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

import structlog

from nri_midbatch.cgroups.fs import OpenDirectories
from nri_midbatch.cgroups.values import CgroupReading, CgroupValues, cpu_shares_to_weight, drifted
from nri_midbatch.counts import CounterFamily, single
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable, LocatedCgroups
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import Counters
from nri_midbatch.plugin.decisions import values_log
from nri_midbatch.policy import (
    ContainerView,
    NativeLimits,
    PodView,
    Policy,
    decide_container,
    decide_pod,
)
from nri_midbatch.state.baseline import kubelet_value, target
from nri_midbatch.state.plan import Plan, split_pods

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


class Reconciler:
    def __init__(
        self,
        live: Live,
        counters: Counters,
        after_reply: AfterReply,
        timings: ConvergenceTimings = ConvergenceTimings(),
        clock: Callable[[], float] = time.time,
        on_recheck: Callable[[str, bool], None] | None = None,
        *,
        dry_run: bool = False,
    ) -> None:
        """`clock`: the wall clock of the times `status` shows. `on_recheck(pod_id, final)`:
        run first at each re-check of a pod (`final`: its last), after the reply. `dry_run`:
        no check nor write (replay, audits)."""
        self._live = live
        self._counters = counters
        self._after_reply = after_reply
        self._dry_run = dry_run
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

    # -- triggers ----------------------------------------------------------------

    def counter_families(self) -> Iterator[CounterFamily]:
        yield single(
            "nri_midbatch_convergence_passes",
            "Convergence passes over every known pod and container",
            self.passes,
        )

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
        """One pass over every known pod and container; returns once it is through."""
        if self._dry_run or self._closed:
            return
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

    def close(self) -> None:
        """Stop: no re-check or piece of a pass runs any more (shutting down)."""
        self._closed = True
        for timer in self._rechecks.values():
            timer.cancel()
        self._rechecks.clear()

    # -- a reload's files ---------------------------------------------------------

    def write_plan(self, plan: Plan) -> Plan:
        """Bring running workloads to a reload's `plan` through their cgroup files; returns
        what failed.

        For runtimes whose UpdateContainers is unsafe, and for what the runtime refused.
        Blocking file I/O: run it in a thread. The order is the pass's: a pod goes up before
        its containers and down after them (lowering.py says why): pods whose containers'
        quota rises first, then the containers, then the other pods and those of the first
        that failed once more.
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
                    if walk.done is not None and not walk.done.done():
                        walk.done.set_result(None)
                    return
                pod_id, container_id = item
                outcome = self._check(pod_id, container_id, directories)
                if outcome is not _Outcome.SKIPPED:
                    walk.read += 1
                    walk.repaired += outcome is _Outcome.REPAIRED
                if container_id is None and outcome is _Outcome.FAILED and not walk.retried:
                    # Once more after its containers: they may hold it back (cgroup v1).
                    walk.retried = True
                    walk.items.append((pod_id, None))
                if time.perf_counter() >= deadline:
                    break
        finally:
            directories.close()
        if walk.done is None:
            self._after_reply.defer(self._step, walk)
        else:
            # A turn of the loop between the pieces of a pass: whatever waits for the work
            # after replies to settle (a reload) does not wait for the whole pass.
            asyncio.get_running_loop().call_soon(self._after_reply.defer, self._step, walk)

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
        self, pod_id: str, container_id: str | None, directories: OpenDirectories
    ) -> _Outcome:
        in_force = self._live.in_force
        known = self._live.known
        pod = known.pods.get(pod_id)
        if pod is None:
            return _Outcome.SKIPPED
        container: ContainerView | None = None
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
        path = "" if container_id is None else known.cgroups_path(container_id)
        try:
            reading = self._located.read(in_force.cgroups, key, pod, container, path, directories)
        except CgroupUnreadable:
            return _Outcome.SKIPPED  # gone, or not there yet: its own events say so
        finally:
            if len(self._located) > len(known.pods) + len(known.containers) + _SLACK:
                self._prune()
        weight = container is None
        off = drifted(reading, values, weight=weight)
        if not off:
            return _Outcome.HELD
        writer = _writer(reading, off, kubelet, weight=weight)
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
    reading: CgroupReading, off: tuple[str, ...], kubelet: NativeLimits, *, weight: bool
) -> Writer:
    """Kubelet's, if every field off holds kubelet's known value there; else unknown."""
    if "cpu_shares" in off and kubelet.cpu_shares is None:
        return "unknown"
    quota = kubelet_value(kubelet, "cpu_quota")
    assert quota is not None  # only the shares can be unknown
    theirs = CgroupValues(kubelet.cpu_shares, quota, kubelet_value(kubelet, "memory_limit"))
    still_off = drifted(reading, theirs, weight=weight)
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
