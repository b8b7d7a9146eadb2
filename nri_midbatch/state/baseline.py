"""Kubelet's own values (the baseline), and the values a workload must hold given them. Pure.

The promise: for every pod and container the plugin has touched, what is in force is what a
fresh plugin would set now from kubelet's values under the configuration in force. A field the
tier claims holds the tier's value (never looser than kubelet's: the calculators see the
baseline); a field the plugin set before and no tier claims any more holds kubelet's value
again, and is then no longer the plugin's. Nothing else is touched: a field the plugin never set
may belong to another plugin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import NamedTuple

from nri_midbatch.policy import CgroupValues, Decision, NativeLimits
from nri_midbatch.policy.calculate import UNLIMITED, shared_values

__all__ = [
    "Target",
    "in_force",
    "kubelet_value",
    "kubelets_after_resize",
    "moved_by",
    "newly_limited",
    "resized_pod_baseline",
    "target",
    "told_pod_baseline",
]


def kubelet_value(kubelet: NativeLimits, field: str) -> int | None:
    """Kubelet's value of one field, -1 for unlimited; None: not known (cpu shares only)."""
    if field == "cpu_shares":
        return kubelet.cpu_shares
    value = kubelet.cpu_quota if field == "cpu_quota" else kubelet.memory_limit
    return value if value is not None and value > 0 else UNLIMITED


def in_force(
    claimed: CgroupValues | None, applied: CgroupValues | None, kubelet: NativeLimits
) -> CgroupValues | None:
    """What to put in force: `claimed` (the tier's now), and kubelet's for the rest of `applied`.

    `applied`: the fields the plugin set before (None: none). Returns None where nothing is
    or was the plugin's. Kubelet's cpu shares may be unknown (a container annotated by an
    earlier version): that field is then left as it is.
    """
    if applied is None:
        return claimed
    if claimed is None:
        shares = kubelet.cpu_shares if applied.cpu_shares is not None else None
        memory = None if applied.memory_limit is None else kubelet_value(kubelet, "memory_limit")
        quota = kubelet_value(kubelet, "cpu_quota")
        assert quota is not None  # only the shares can be unknown
        return shared_values(shares, quota, memory)
    shares, memory = claimed.cpu_shares, claimed.memory_limit
    if shares is None and applied.cpu_shares is not None:
        shares = kubelet.cpu_shares
    if memory is None and applied.memory_limit is not None:
        memory = kubelet_value(kubelet, "memory_limit")
    if shares is claimed.cpu_shares and memory is claimed.memory_limit:
        return claimed
    return shared_values(shares, claimed.cpu_quota, memory)


class Target(NamedTuple):
    """What a pod or container must hold, and what of it is the plugin's once it does."""

    #: What to put in force; None: nothing is or was the plugin's there.
    values: CgroupValues | None
    #: The tier's values the plugin claims (None: none, all it set is given back).
    claimed: CgroupValues | None


def target(
    decision: Decision | None,
    applied: CgroupValues | None,
    kubelet: NativeLimits,
    *,
    enforce: bool,
) -> Target:
    """What a pod or container must hold under the configuration in force.

    The one recipe of every path that decides (the events, a Synchronize, a reload's plan,
    the convergence pass and `status`). `decision`: the policy's for it now (None: the
    policy was not asked, as nothing is claimed there); `enforce`:
    whether the plugin claims anything there (Settings.enforces: not in observe mode; for a
    pod, not with pod level off). A decision on bad input claims nothing, so what the plugin
    set goes back to kubelet's values.
    """
    claimed = None
    if enforce and decision is not None and decision.error is None:
        claimed = decision.values
    return Target(in_force(claimed, applied, kubelet), claimed)


def moved_by(current: CgroupValues, kubelet: NativeLimits) -> CgroupValues | None:
    """The fields of `current` that differ from kubelet's, as values; None where none does.

    What a container created under the plugin (it carries kubelet's values in an annotation)
    holds of the plugin's after a restart: the runtime keeps what the plugin last set.
    """
    differ = {
        field: getattr(current, field)
        for field in ("cpu_shares", "cpu_quota", "memory_limit")
        if getattr(current, field) is not None
        and kubelet_value(kubelet, field) is not None
        and getattr(current, field) != kubelet_value(kubelet, field)
    }
    if not differ:
        return None
    return shared_values(differ.get("cpu_shares"), current.cpu_quota, differ.get("memory_limit"))


def resized_pod_baseline(
    pod: NativeLimits,
    before: NativeLimits,
    after: NativeLimits,
    siblings: Iterable[NativeLimits],
) -> NativeLimits:
    """Kubelet's pod values after one of its containers went from `before` to `after`.

    Kubelet's pod limit is the sum of its containers' plus the overhead, and unlimited as soon
    as one container is: a resize moves it by the container's change. A pod that was
    unlimited becomes limited once every container is, at their sum (the overhead, which
    containerd 1.7 does not tell, is then left out). Its shares move by the change in shares.
    """
    siblings = tuple(siblings)
    return NativeLimits(
        cpu_quota=_moved(
            pod.cpu_quota, before.cpu_quota, after.cpu_quota, [s.cpu_quota for s in siblings]
        ),
        cpu_period=pod.cpu_period,
        memory_limit=_moved(
            pod.memory_limit,
            before.memory_limit,
            after.memory_limit,
            [s.memory_limit for s in siblings],
        ),
        cpu_shares=_moved_shares(pod.cpu_shares, before.cpu_shares, after.cpu_shares),
    )


def _moved(
    pod: int | None, before: int | None, after: int | None, siblings: list[int | None]
) -> int | None:
    """A pod limit (None or <= 0: unlimited) after one container's limit moved."""
    if after is None or after <= 0:
        return None
    if pod is not None and pod > 0 and before is not None and before > 0:
        return pod + after - before
    if all(limit is not None and limit > 0 for limit in siblings):
        return after + sum(limit for limit in siblings if limit is not None)
    return pod if pod is not None and pod > 0 else None


def _moved_shares(pod: int | None, before: int | None, after: int | None) -> int | None:
    if pod is None or before is None or after is None:
        return pod
    return pod + after - before


def newly_limited(before: NativeLimits, after: NativeLimits) -> bool:
    """Whether a pod's quota or memory limit went from unlimited to a limit."""
    return (before.cpu_quota is None and after.cpu_quota is not None) or (
        before.memory_limit is None and after.memory_limit is not None
    )


def kubelets_after_resize(
    read: NativeLimits,
    moved: NativeLimits,
    before: NativeLimits,
    at_resize: NativeLimits | None,
    applied: NativeLimits | None,
    *,
    final: bool,
) -> NativeLimits | None:
    """Kubelet's pod values after a resize, read back from the pod's cgroup (`read`); None:
    kubelet has not written them yet, the read is tried again at the pod's next re-check.

    `moved`: the baseline as the resize moved it, a guess (kubelet's limit also counts
    containers not created yet and the overhead, which the runtime may not tell); `before`:
    the baseline before the resize; `at_resize`: what the cgroup held at the resize (None:
    not read); `applied`: what the plugin set there, as the cgroup gives it back. A field
    the resize moves that still holds what it held at the resize, a field still unlimited
    where the guess limits it, and a field holding the plugin's own value are not kubelet's
    new values (yet). At the last re-check (`final`) kubelet has written what it writes: a
    field that holds the plugin's value then keeps kubelet's value before the resize where
    the guess newly limits it (kubelet left it unlimited), else the guess's; the others are
    what is read.
    """
    values: dict[str, int | None] = {}
    pending = False
    for name in ("cpu_quota", "memory_limit", "cpu_shares"):
        value, guess, old = getattr(read, name), getattr(moved, name), getattr(before, name)
        mine = applied is not None and _is_set(name, getattr(applied, name), value)
        stale = at_resize is not None and guess != old and value == getattr(at_resize, name)
        unwritten = name != "cpu_shares" and guess is not None and value is None
        pending = pending or mine or stale or unwritten
        if mine:
            value = old if name != "cpu_shares" and old is None else guess
        values[name] = value
    if pending and not final:
        return None
    return NativeLimits(
        cpu_quota=values["cpu_quota"],
        cpu_period=read.cpu_period,
        memory_limit=values["memory_limit"],
        cpu_shares=values["cpu_shares"],
    )


def _is_set(name: str, applied: int | None, value: int | None) -> bool:
    """Whether the cgroup holds `applied`, a value the plugin set (None: not set there)."""
    return applied is not None and _as_file(name, applied) == _as_file(name, value)


def told_pod_baseline(
    known: NativeLimits,
    told: NativeLimits,
    resources: NativeLimits,
    applied: CgroupValues | None,
) -> NativeLimits:
    """Kubelet's pod values after an UpdatePodSandbox told `told` (its resources plus overhead).

    Kubelet sends the resource it resizes at its new value and fills the others from the pod
    cgroup as it finds it (doPodResizeAction: GetPodCgroupConfig, then the merge), which may
    hold the plugin's own value. A field told at the value the plugin applied there (with or
    without the overhead: `resources` is the told value less it) that differs from the known
    baseline keeps the known one: the plugin's value is never taken back as kubelet's.
    Shares not told (None) are kept as known.
    """
    if told.cpu_shares is None:
        told = replace(told, cpu_shares=known.cpu_shares)
    if applied is None:
        return told

    def field(mine: int | None, name: str, value: int | None, before: int | None) -> int | None:
        if mine is None or _as_file(name, value) == _as_file(name, before):
            return value
        told_here = (_as_file(name, value), _as_file(name, getattr(resources, name)))
        return before if mine in told_here else value

    return NativeLimits(
        cpu_quota=field(applied.cpu_quota, "cpu_quota", told.cpu_quota, known.cpu_quota),
        cpu_period=told.cpu_period,
        memory_limit=field(
            applied.memory_limit, "memory_limit", told.memory_limit, known.memory_limit
        ),
        cpu_shares=field(applied.cpu_shares, "cpu_shares", told.cpu_shares, known.cpu_shares),
    )


def _as_file(name: str, value: int | None) -> int | None:
    """A told value as a file holds it: a quota or memory limit of none or <= 0 is unlimited."""
    if name == "cpu_shares":
        return value
    return value if value is not None and value > 0 else UNLIMITED
