"""One pass that brings files and runtime in line with the targets, whatever triggers it.

A reload, a Synchronize, the period and a resize's re-checks are triggers of the same
pass; it owns the order of writes (pods before their containers going up on cgroup v1).
Read it in this order:

- reconciler.py: the Reconciler, the pass's face: its triggers, and a whole pass;
- walk.py: the pace, a walk over workloads in pieces of the work after replies, pods first;
- check.py: the check of one workload: its target, its files compared, the repair;
- drift.py: what a repair tells: who wrote the value, what changed, the notes `status` shows;
- follow.py: a reload's plan, through UpdateContainers or the cgroup files.

It stays inside plugin/: it writes through the plugin's cgroup writer and records, and a
Synchronize's pods through the plugin's writes and lowering wait.
"""

from nri_midbatch.plugin.reconcile.drift import Drift, PodCheck
from nri_midbatch.plugin.reconcile.follow import UpdateContainers
from nri_midbatch.plugin.reconcile.reconciler import ConvergenceTimings, Reconciler, Reported

__all__ = [
    "ConvergenceTimings",
    "Drift",
    "PodCheck",
    "Reconciler",
    "Reported",
    "UpdateContainers",
]
