"""Kubelet's values where the runtime does not tell them: read once, kept in the pod's record.

A pod's baseline is read from its cgroup before the plugin's first write to it
(containerd 1.7 sends no pod resources). What the runtime cannot tell after a
restart (that baseline, the fields the plugin owns, containers resized or set
through their files) goes into the pod's record (state/store.py), written
when it changes, after the reply where the reply does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import structlog

from nri_midbatch.cgroups.values import baseline_of
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.context import PluginContext
from nri_midbatch.policy import PodView
from nri_midbatch.state.store import PodRecord

log = structlog.get_logger(__name__)

#: Pod records written in one piece of the work after a Synchronize's reply. One: a
#: record is JSON, a file written and renamed, 0.1-0.2 ms of CPU on a 2-core VM's tmpfs
#: (more on a disk), and a request arriving meanwhile waits for the piece under way; 32
#: a piece held such requests for 3-7 ms (docs/performance-history.md, round 9).
RECORDS_PER_PIECE = 1


class Records:
    def __init__(self, ctx: PluginContext) -> None:
        self._ctx = ctx

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

    def keep(self, pod_id: str, before: PodRecord | bool | None = True) -> None:
        """Write (or remove) the pod's record; `before`: what it held, True if not known."""
        ctx = self._ctx
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

    def keep_after_sync(self, loaded: Mapping[str, PodRecord]) -> None:
        """After a Synchronize, a slice at a time: every pod's record, then none of the gone."""
        ctx = self._ctx
        if not ctx.store.keeping:
            return
        pod_ids = list(ctx.known.pods)
        for start in range(0, len(pod_ids), RECORDS_PER_PIECE):
            ctx.after_reply.defer(
                self._keep_all, pod_ids[start : start + RECORDS_PER_PIECE], loaded
            )
        ctx.after_reply.defer(self._prune)

    def _keep_all(self, pod_ids: Sequence[str], loaded: Mapping[str, PodRecord]) -> None:
        for pod_id in pod_ids:
            self.keep(pod_id, loaded.get(pod_id))

    def _prune(self) -> None:
        ctx = self._ctx
        ctx.store.prune(frozenset(pod.uid for pod in ctx.known.pods.values()))
