"""target(kubelet's values, configuration): what a fresh plugin sets, field by field.

Written from Koordinator's batchresource hook (`MilliCPUToShares`, `MilliCPUToQuota`, the
pod-level sums over the containers the spec lists, the cfsQuota rule and the normalization
ratio), its cpunormalization hook, and the plugin's documented additions: tiers chosen by
priority and QoS class, never loosening kubelet's quota or memory limit, and (issue 23)
kubelet's own value for every field no tier claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from .model import Config, ContainerModel, Kind, Native, PodModel

UNLIMITED = -1
SHARES_MIN, SHARES_MAX = 2, 262144
QUOTA_MIN = 1000
PERIOD = 100_000


@dataclass(frozen=True)
class Values:
    """cpu.shares (v1 units), CFS quota and memory limit; -1: unlimited."""

    shares: int
    quota: int
    memory: int


def shares_of(milli: int | None) -> int:
    if not milli or milli <= 0:
        return SHARES_MIN
    return max(SHARES_MIN, min(SHARES_MAX, milli * 1024 // 1000))


def quota_of(milli: int | None) -> int:
    quota = 0 if milli is None else milli * PERIOD // 1000
    if quota <= 0:
        return UNLIMITED
    return max(quota, QUOTA_MIN)


def weight_of(shares: int) -> int:
    """cgroup v2 weight, as kubelet and runc convert shares."""
    return 1 + (shares - SHARES_MIN) * 9999 // (SHARES_MAX - SHARES_MIN)


def tighter(ours: int, kubelets: int) -> int:
    """The smaller limit, -1 being +inf."""
    if ours == UNLIMITED:
        return kubelets
    if kubelets == UNLIMITED:
        return ours
    return min(ours, kubelets)


def scaled(quota: int, ratio: str | None) -> int:
    if ratio is None or quota <= 0:
        return quota
    r = Fraction(ratio)
    if r <= 1:
        return quota
    return math.ceil(Fraction(quota) / r)


def tier_of(kind: Kind, config: Config) -> str | None:
    if kind is Kind.BATCH_BE:
        return "extended"
    if kind in (Kind.MID_BE, Kind.MID_LS):
        return "extended" if config.mid_tier else None
    if kind is Kind.NORMALIZED_LS:
        return "normalization" if config.normalization_tier else None
    return None


# -- kubelet --------------------------------------------------------------


def kubelet_container(native: Native) -> Values:
    """What kubelet asks the runtime to create a container (or resize it) with."""
    memory = native.memory_limit if native.memory_limit else UNLIMITED
    return Values(shares_of(native.cpu_request), quota_of(native.cpu_limit), memory)


def kubelet_pod(pod: PodModel) -> Values:
    """kubelet's pod cgroup (ResourceConfigForPod): sums of the containers plus overhead."""
    if pod.kind.besteffort:
        return Values(SHARES_MIN, UNLIMITED, UNLIMITED)
    natives = [c.native for c in pod.containers]
    overhead = pod.overhead
    requests = sum(n.cpu_request or 0 for n in natives) + (overhead.cpu_request or 0)
    quota = UNLIMITED
    if all(n.cpu_limit for n in natives):
        quota = quota_of(sum(n.cpu_limit or 0 for n in natives) + (overhead.cpu_limit or 0))
    memory = UNLIMITED
    if all(n.memory_limit for n in natives):
        memory = sum(n.memory_limit or 0 for n in natives) + (overhead.memory_limit or 0)
    return Values(shares_of(requests), quota, memory)


# -- targets --------------------------------------------------------------


def container_target(pod: PodModel, container: ContainerModel, config: Config) -> Values:
    kubelet = kubelet_container(container.native)
    if config.observe:
        return kubelet
    tier = tier_of(pod.kind, config)
    if tier == "normalization":
        return Values(kubelet.shares, scaled(kubelet.quota, config.ratio), kubelet.memory)
    if tier != "extended" or container.extended is None:
        return kubelet
    extended = container.extended
    quota = scaled(quota_of(extended.cpu_limit), config.ratio)
    if not config.cfs_quota:
        quota = UNLIMITED
    memory = extended.memory_limit if extended.memory_limit else UNLIMITED
    return Values(
        shares_of(extended.cpu_request),
        tighter(quota, kubelet.quota),
        tighter(memory, kubelet.memory),
    )


def pod_target(pod: PodModel, config: Config, *, pod_resources: bool) -> Values:
    """`pod_resources`: whether the runtime sends them (containerd 2.x) or not (1.7).

    The target is the same either way: kubelet's pod values are kubelet's whoever tells
    them (docs/configuration.md, "What the values follow").
    """
    del pod_resources
    kubelet = kubelet_pod(pod)
    if config.observe or not config.pod_level:
        return kubelet
    tier = tier_of(pod.kind, config)
    if tier == "normalization":
        return Values(kubelet.shares, scaled(kubelet.quota, config.ratio), kubelet.memory)
    if tier != "extended":
        return kubelet
    listed = [c.extended for c in pod.containers if c.extended is not None]
    if not listed:
        return kubelet
    requests = sum(e.cpu_request for e in listed if e.cpu_request and e.cpu_request > 0)
    quota = UNLIMITED
    if all(e.cpu_limit and e.cpu_limit > 0 for e in listed):
        quota = scaled(quota_of(sum(e.cpu_limit or 0 for e in listed)), config.ratio)
    if not config.cfs_quota:
        quota = UNLIMITED
    memory = UNLIMITED
    if all(e.memory_limit and e.memory_limit > 0 for e in listed):
        memory = sum(e.memory_limit or 0 for e in listed)
    return Values(
        shares_of(requests), tighter(quota, kubelet.quota), tighter(memory, kubelet.memory)
    )


def looser_than(values: Values, kubelet: Values) -> list[str]:
    """The fields of `values` looser than kubelet's (quota and memory; -1 is +inf)."""
    return [
        name
        for name, ours, theirs in (
            ("quota", values.quota, kubelet.quota),
            ("memory", values.memory, kubelet.memory),
        )
        if tighter(ours, theirs) != ours
    ]
