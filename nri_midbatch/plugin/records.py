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
(`meet_container`), and the record keeps those not shown yet (Known.unshown). The record goes when
the pod's last sandbox is removed and its cgroup is gone; while the cgroup stays (kubelet
may run a new sandbox in it) the record is parked, at most MAX_PARKED of them
(`sandbox_removed`). A Synchronize removes the records of pods it did not list, but
those parked (`keep_after_sync`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace

import structlog

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import baseline_of
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.codec import running_view
from nri_midbatch.plugin.context import PluginContext
from nri_midbatch.policy import PodView
from nri_midbatch.state.known import container_at_sync
from nri_midbatch.state.store import Kept, PodRecord

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
    def __init__(self, ctx: PluginContext) -> None:
        self._ctx = ctx
        #: uids of parked records, oldest first
        self._parked: dict[str, None] = {}

    def meet(self, pod_id: str, view: PodView, told: bool, *, kept_first: bool = False) -> PodView:
        """Remember a sandbox the plugin does not know; returns the view kept.

        `view.native`: kubelet's values as the runtime or the pod's QoS class tell them
        (`told`), which win; else those of the pod's sandbox the plugin knows (an older one,
        dead: forgotten now), else its record's. `kept_first`: those two win over the told
        ones (an UpdatePodSandbox's pod carries the resize it asks for, which may yet fail).
        What the plugin set on the pod carries over from either, so that it can be given
        back; so do its record's containers, until the runtime shows them (Known.unshown).
        """
        ctx = self._ctx
        known, uid = ctx.known, view.uid
        kept: Kept | None = None
        unshown: dict[str, Kept] = {}
        sure = told
        twin = known.sandbox_of(uid)
        if twin is not None:
            older = known.pods[twin]
            kept = Kept(older.native, known.applied.get(twin))
            sure = sure or twin in known.pod_baseline_known
            if twin != pod_id:
                known.remove_pod(twin)
        elif ctx.store.keeping and (record := self._record(uid)) is not None:
            kept, unshown = record.pod, record.containers
            sure = sure or kept is not None
        self._parked.pop(uid, None)
        if kept is not None and (kept_first or not told):
            view = replace(view, native=kept.kubelet)
        view = known.add_pod(pod_id, view)
        self.keep_forgotten_later()
        if sure:
            known.pod_baseline_known.add(pod_id)
        known.set_applied(pod_id, None if kept is None else kept.applied)
        if unshown:
            known.unshown[pod_id] = dict(unshown)
        return view

    def meet_container(self, pod_id: str, container: api.Container) -> None:
        """Remember a running container the plugin does not know (forgotten with its pod), as
        the runtime shows it before this event: kubelet's values and what the plugin set on
        it as its pod's record kept them, else as at a Synchronize (`container_at_sync`)."""
        ctx = self._ctx
        known = ctx.known
        shown, current = running_view(container)
        record = PodRecord(None, known.unshown.get(pod_id, {}))
        view, applied, recorded = container_at_sync(
            known, record, shown, current, ctx.store.keeping
        )
        known.set_container(view.id, pod_id, view, container.linux.cgroups_path)
        self.keep_forgotten_later()
        known.set_applied(view.id, applied)
        if shown.native_known:
            known.annotated.add(view.id)
        if recorded:
            known.recorded.add(view.id)

    def sandbox_removed(self, pod: PodView) -> None:
        """A sandbox of the pod was removed: its record goes, unless the pod lives on.

        It does in a sandbox the plugin knows; or, while its cgroup stays, in one kubelet
        may still run: the record is parked then. Run after the reply.
        """
        ctx = self._ctx
        if not ctx.store.keeping or ctx.known.sandbox_of(pod.uid) is not None:
            return
        try:
            ctx.cgroups.read(pod)
        except CgroupUnreadable:
            ctx.store.remove(pod.uid)
            return
        self._parked.pop(pod.uid, None)  # to the back
        self._parked[pod.uid] = None
        while len(self._parked) > MAX_PARKED:
            oldest = next(iter(self._parked))
            del self._parked[oldest]
            if ctx.known.sandbox_of(oldest) is None:
                ctx.store.remove(oldest)

    def establish_pod_baseline(self, pod_id: str, view: PodView) -> PodView:
        """The pod with kubelet's values read from its cgroup, which the plugin has not written.

        Read at RunPodSandbox, and later only for a pod whose baseline neither the runtime,
        its record nor its QoS told (containerd 1.7 sends no pod resources). A replay reads
        nothing; an unreadable cgroup leaves the view as it is, and its write says why.
        """
        ctx = self._ctx
        if ctx.dry_run:
            return view
        try:
            reading = ctx.cgroups.read(view)
        except CgroupUnreadable as exc:
            log.debug("pod cgroup not readable", error=str(exc), pod=view.name)
            return view
        kept = replace(view, native=baseline_of(reading, view.native))
        if pod_id in ctx.known.pods:
            ctx.known.pods[pod_id] = kept
        ctx.known.pod_baseline_known.add(pod_id)
        return kept

    def _record(self, uid: str) -> PodRecord | None:
        """The pod's record: as it was when the pod was forgotten, if not written yet."""
        forgotten = self._ctx.known.forgotten_records
        if forgotten and uid in forgotten:
            return forgotten.pop(uid)
        return self._ctx.store.load(uid)

    def keep_forgotten_later(self) -> None:
        """`keep_forgotten` after the reply, if a pod was forgotten (adding a pod or a
        container may forget the oldest)."""
        if self._ctx.known.forgotten_records:
            self._ctx.after_reply.defer(self.keep_forgotten)

    def keep_forgotten(self) -> None:
        """Write the records of the pods forgotten to stay within Known's bounds, as they
        were then (Known.forgotten_records); run after the reply that forgot them, and before
        any other record is written."""
        ctx = self._ctx
        forgotten = ctx.known.forgotten_records
        if not forgotten:
            return
        ctx.known.forgotten_records = {}
        for uid, record in forgotten.items():
            if not ctx.store.keeping or ctx.known.sandbox_of(uid) is not None:
                continue  # met again since: its record is its sandbox's to write
            if record is None:
                ctx.store.remove(uid)
            else:
                ctx.store.save(uid, record)

    def keep(self, pod_id: str, before: PodRecord | bool | None = True) -> None:
        """Write (or remove) the pod's record; `before`: what it held, True if not known."""
        ctx = self._ctx
        self.keep_forgotten()
        pod = ctx.known.pods.get(pod_id)
        if pod is None or not ctx.store.keeping:
            return
        record = ctx.known.record_of(pod_id)
        if before is not True and record == before:
            return
        if record is None:
            if before is not None:
                ctx.store.remove(pod.uid)
        else:
            ctx.store.save(pod.uid, record)

    def keep_later(self, pod_id: str) -> None:
        """The pod's record, once the runtime has the reply."""
        self._ctx.after_reply.defer(self.keep, pod_id)

    def keep_after_sync(self, loaded: Mapping[str, PodRecord], listed: AbstractSet[str]) -> None:
        """After a Synchronize, a slice at a time: every pod's record, then none of the gone.

        `listed`: the uids of the pods the runtime listed. Their records stay, those of pods
        forgotten to stay within Known's bounds too: met again, they are restored from them.
        """
        ctx = self._ctx
        if not ctx.store.keeping:
            return
        pod_ids = list(ctx.known.pods)
        for start in range(0, len(pod_ids), RECORDS_PER_PIECE):
            ctx.after_reply.defer(
                self._keep_all, pod_ids[start : start + RECORDS_PER_PIECE], loaded
            )
        ctx.after_reply.defer(self._prune, listed)

    def _keep_all(self, pod_ids: Sequence[str], loaded: Mapping[str, PodRecord]) -> None:
        for pod_id in pod_ids:
            self.keep(pod_id, loaded.get(pod_id))

    def _prune(self, listed: AbstractSet[str]) -> None:
        ctx = self._ctx
        self._prune_piece(
            ctx.store.pruning(
                lambda: {pod.uid for pod in ctx.known.pods.values()}.union(listed, self._parked)
            )
        )

    def _prune_piece(self, pruning: Iterator[int]) -> None:
        """One slice of the directory (store.PRUNE_PER_PIECE entries), the next queued behind
        whatever came meanwhile: 30,000 stale records made one piece of 1.15 s."""
        if next(pruning, None) is not None:
            self._ctx.after_reply.defer(self._prune_piece, pruning)
