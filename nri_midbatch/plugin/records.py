"""Kubelet's values where the runtime does not tell them: read once, kept in the pod's record.

A pod's baseline is read from its cgroup before the plugin's first write to it
(containerd 1.7 sends no pod resources). What the runtime cannot tell after a
restart (that baseline, the fields the plugin owns, containers resized or set
through their files) goes into the pod's record (state/store.py), written
when it changes, after the reply where the reply does not need it.

A record is the pod's, by uid, not its sandbox's: it lives while the pod's cgroup may
be used again. A sandbox the plugin does not know (a new one of a pod whose sandbox
died, or a pod forgotten to stay within Known's bounds) takes the pod's baseline and
what the plugin set there from the sandbox of its uid the plugin knows, else from the
record (`meet`), never from a cgroup the plugin may have written; a container forgotten with
its pod, when the runtime shows it again, takes its own from the record or its annotation
(`meet_container`), and the record keeps those not shown yet (Known.unshown_of). The record
goes when the pod's last sandbox is removed and its cgroup is gone; while the cgroup stays (kubelet
may run a new sandbox in it) the record is parked, at most MAX_PARKED of them
(`sandbox_removed`). A Synchronize removes the records of pods it did not list, but
those parked (`keep_after_sync`).

What a record holds, when it changes and how a pod or container is restored from it is
state/known.py's to say (`record_change`, `meet_pod`, `kept_for`, `take_container`): this
room is the edge that reads and writes the record files and the pod cgroups a baseline is
read from, and schedules them around the replies.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import (
    CgroupReading,
    baseline_of,
    cpu_shares_to_weight,
    cpu_weight_to_shares,
)
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.codec import running_view
from nri_midbatch.plugin.context import Live
from nri_midbatch.policy import CgroupValues, NativeLimits, PodView
from nri_midbatch.state.known import split_path
from nri_midbatch.state.store import BaselineStore, PodRecord

log = structlog.get_logger(__name__)

#: Pod records written in one piece of the work after a Synchronize's reply. One: a
#: record is JSON, a file written and renamed, 0.1-0.2 ms of CPU on a 2-core VM's tmpfs
#: (more on a disk), and a request arriving meanwhile waits for the piece under way; 32
#: a piece held such requests for 3-7 ms (docs/performance-history.md, round 9).
RECORDS_PER_PIECE = 1
#: Records kept for pods with no sandbox but a cgroup (a pod between two sandboxes, or
#: deleted and its cgroup not yet removed): the oldest is removed past this (a uid each).
MAX_PARKED = 256


class Records:
    def __init__(
        self, live: Live, store: BaselineStore, after_reply: AfterReply, *, dry_run: bool
    ) -> None:
        """dry_run: read no cgroup (replay, audits)."""
        self._live = live
        self._store = store
        self._after_reply = after_reply
        self._dry_run = dry_run
        #: uids of parked records, oldest first
        self._parked: dict[str, None] = {}

    def meet(self, pod_id: str, view: PodView, told: bool, *, kept_first: bool = False) -> PodView:
        """Remember a sandbox the plugin does not know, its pod's baseline restored from the
        sandbox of its uid the plugin knows or from its record (Known.meet_pod); returns the
        view kept. `kept_first`: what is kept wins over what the runtime told."""
        self._parked.pop(view.uid, None)
        known = self._live.known
        record = None if known.sandbox_of(view.uid) is not None else self._record(view.uid)
        view = known.meet_pod(pod_id, view, record, told=told, kept_first=kept_first)
        self.keep_forgotten_later()
        return view

    def meet_container(self, pod_id: str, container: api.Container) -> None:
        """Remember a running container the plugin does not know (forgotten with its pod), as
        the runtime shows it before this event: kubelet's values and what the plugin set on
        it as its pod's record kept them, else as at a Synchronize (Known.take_container)."""
        known = self._live.known
        shown, current = running_view(container)
        record = PodRecord(None, dict(known.unshown_of(pod_id)))
        path, is_head = split_path(container.linux.cgroups_path, container.id)
        view, applied, _ = known.take_container(
            known, record, pod_id, shown, path, is_head, current, self._store.keeping
        )
        self.keep_forgotten_later()
        known.set_applied(view.id, applied)

    def _record(self, uid: str) -> PodRecord | None:
        """The pod's record: as it was when the pod was forgotten, if not written yet."""
        pending = self._live.known.take_forgotten(uid)
        if uid in pending:
            return pending[uid]
        store = self._store
        return store.load(uid) if store.keeping else None

    def sandbox_removed(self, pod: PodView) -> None:
        """A sandbox of the pod was removed: its record goes, unless the pod lives on.

        It does in a sandbox the plugin knows; or, while its cgroup stays, in one kubelet
        may still run: the record is parked then. Run after the reply.
        """
        store, known = self._store, self._live.known
        if not store.keeping or known.sandbox_of(pod.uid) is not None:
            return
        try:
            self._live.in_force.cgroups.read(pod)
        except CgroupUnreadable:
            store.remove(pod.uid)
            return
        self._parked.pop(pod.uid, None)  # to the back
        self._parked[pod.uid] = None
        while len(self._parked) > MAX_PARKED:
            oldest = next(iter(self._parked))
            del self._parked[oldest]
            if known.sandbox_of(oldest) is None:
                store.remove(oldest)

    def establish_pod_baseline(self, pod_id: str, view: PodView) -> PodView:
        """The pod with kubelet's values read from its cgroup, which the plugin has not written.

        Read at RunPodSandbox, and later only for a pod whose baseline neither the runtime,
        its record nor its QoS told (containerd 1.7 sends no pod resources). A replay reads
        nothing; an unreadable cgroup leaves the view as it is, and its write says why.
        """
        reading = self._read(view)
        if reading is None:
            return view
        kept = replace(view, native=baseline_of(reading, view.native))
        self._live.known.learn_pod_baseline(pod_id, kept)
        return kept

    def read_pod(
        self, view: PodView, applied: CgroupValues | None
    ) -> tuple[NativeLimits, NativeLimits | None] | None:
        """What the pod's cgroup holds now, as kubelet's values would be (`baseline_of`), and
        `applied` (what the plugin set there) as the cgroup gives it back (cgroup v2 keeps
        a weight); None where nothing is read (a replay, an unreadable cgroup). Learns
        nothing: the caller tells whose values they are."""
        reading = self._read(view)
        if reading is None:
            return None
        if applied is None:
            return baseline_of(reading, view.native), None
        shares = applied.cpu_shares
        if shares is not None and reading.cpu_weight is not None:
            shares = cpu_weight_to_shares(cpu_shares_to_weight(shares))
        mine = NativeLimits(
            cpu_quota=applied.cpu_quota, memory_limit=applied.memory_limit, cpu_shares=shares
        )
        return baseline_of(reading, view.native), mine

    def _read(self, view: PodView) -> CgroupReading | None:
        if self._dry_run:
            return None
        try:
            return self._live.in_force.cgroups.read(view)
        except CgroupUnreadable as exc:
            log.debug("pod cgroup not readable", error=str(exc), pod=view.name)
            return None

    def keep_forgotten_later(self) -> None:
        """`keep_forgotten` after the reply, if a pod was forgotten (adding a pod or a
        container may forget the oldest)."""
        if self._live.known.forgot:
            self._after_reply.defer(self.keep_forgotten)

    def keep_forgotten(self) -> None:
        """Write the records of the pods forgotten to stay within Known's bounds, as they
        were then (Known.take_forgotten); run after the reply that forgot them, and before
        any other record is written."""
        known, store = self._live.known, self._store
        for uid, record in known.take_forgotten().items():
            if not store.keeping or known.sandbox_of(uid) is not None:
                continue  # met again since: its record is its sandbox's to write
            if record is None:
                store.remove(uid)
            else:
                store.save(uid, record)

    def keep(self, pod_id: str, before: PodRecord | bool | None = True) -> None:
        """Write (or remove) the pod's record; `before`: what it held, True if not known."""
        store = self._store
        self.keep_forgotten()
        if not store.keeping:
            return
        change = self._live.known.record_change(pod_id, before)
        if change is None:
            return
        uid, record = change
        if record is None:
            store.remove(uid)
        else:
            store.save(uid, record)

    def keep_later(self, pod_id: str) -> None:
        """The pod's record, once the runtime has the reply."""
        self._after_reply.defer(self.keep, pod_id)

    def keep_after_sync(self, loaded: Mapping[str, PodRecord], listed: AbstractSet[str]) -> None:
        """After a Synchronize, a slice at a time: every pod's record, then none of the gone.

        `listed`: the uids of the pods the runtime listed. Their records stay, those of pods
        forgotten to stay within Known's bounds too: met again, they are restored from them.
        """
        if not self._store.keeping:
            return
        pod_ids = list(self._live.known.pods)
        for start in range(0, len(pod_ids), RECORDS_PER_PIECE):
            self._after_reply.defer(
                self._keep_all, pod_ids[start : start + RECORDS_PER_PIECE], loaded
            )
        self._after_reply.defer(self._prune, listed)

    def _keep_all(self, pod_ids: Sequence[str], loaded: Mapping[str, PodRecord]) -> None:
        for pod_id in pod_ids:
            self.keep(pod_id, loaded.get(pod_id))

    def _prune(self, listed: AbstractSet[str]) -> None:
        live = self._live
        self._prune_piece(
            self._store.pruning(
                lambda: {pod.uid for pod in live.known.pods.values()}.union(listed, self._parked)
            )
        )

    def _prune_piece(self, pruning: Iterator[int]) -> None:
        """One slice of the directory (store.PRUNE_PER_PIECE entries), the next queued behind
        whatever came meanwhile: 30,000 stale records made one piece of 1.15 s."""
        if next(pruning, None) is not None:
            self._after_reply.defer(self._prune_piece, pruning)
