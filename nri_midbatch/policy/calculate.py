"""Koordinator batchresource formulas (koordlet util/system cgroup.go, batch_resource.go).

Every calculator appends one trace step per value it sets, saying which input produced it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from .bounded_cache import BoundedCache
from .spec import ContainerSpec
from .tiers import Tier
from .trace import Field, NeverLoosen, Normalized, PodSum, QuotaDisabled, Step, ValueFrom
from .views import NativeLimits

CPU_SHARE_UNIT = 1024
CFS_BASE_PERIOD = 100_000
CFS_QUOTA_MIN = 1000
CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262_144
UNLIMITED = -1


@dataclass(frozen=True, slots=True)
class CgroupValues:
    """cpu.shares, cfs quota (us per 100000us period) and memory limit; -1 is unlimited.

    None: the calculator leaves that value as kubelet and the runtime set it, and the plugin
    neither claims the field over NRI nor writes its file (CPU normalization sets the quota
    only).
    """

    cpu_shares: int | None
    cpu_quota: int
    memory_limit: int | None


@dataclass(frozen=True, slots=True)
class Rules:
    cfs_quota: bool = True
    cpu_normalization_ratio: Fraction | None = None


# A node's specs repeat a few dozen quantities, so decision after decision computes the
# same values and steps: each distinct one is built once, as building a frozen dataclass
# (object.__setattr__ per field) costs more than the rest of the formula. 1,024 of each
# hold well under 1 MB: their keys are ints and the names of the configuration's
# resources. Every CgroupValues a decision returns is one of these shared instances
# (`shared_values`): the plugin holds them until after its replies, and a fresh object
# each would leave the heap fragmented once freed.
_DISTINCT = 1024
_value_from = lru_cache(maxsize=_DISTINCT)(ValueFrom)
shared_values = lru_cache(maxsize=_DISTINCT)(CgroupValues)
#: A pod-sum step may name a container of the pod's annotation, which its author chose
#: and may make as long as the annotation: these are bounded in bytes as well.
POD_SUM_CACHE_BYTES = 1024 * 1024
#: PodSum's fields, in order.
_PodSumKey = tuple[Field, int, str, int, int, str | None]
pod_sum_cache: BoundedCache[_PodSumKey, PodSum] = BoundedCache(_DISTINCT, POD_SUM_CACHE_BYTES)


def _new_pod_sum(key: _PodSumKey) -> PodSum:
    return PodSum(*key)


_pod_sum = pod_sum_cache.memoize(_new_pod_sum)

# An enum member read through its class costs ten times a module global.
_SHARES, _QUOTA, _MEMORY = Field.CPU_SHARES, Field.CPU_QUOTA, Field.MEMORY_LIMIT


def milli_cpu_to_shares(milli_cpu: int) -> int:
    if milli_cpu <= 0:
        return CPU_SHARES_MIN
    shares = milli_cpu * CPU_SHARE_UNIT // 1000
    return max(CPU_SHARES_MIN, min(CPU_SHARES_MAX, shares))


def milli_cpu_to_quota(milli_cpu: int) -> int:
    if milli_cpu <= 0:
        return UNLIMITED
    quota = milli_cpu * CFS_BASE_PERIOD // 1000
    if quota <= 0:
        return UNLIMITED
    return max(quota, CFS_QUOTA_MIN)


def container_values(
    entry: ContainerSpec, tier: Tier, rules: Rules, native: NativeLimits, trace: list[Step]
) -> CgroupValues:
    cpu = tier.cpu_resource
    request = _positive(entry.requests, cpu)
    shares = milli_cpu_to_shares(request)
    trace.append(_value_from(_SHARES, shares, "request", cpu, request))

    if rules.cfs_quota:
        limit = _positive(entry.limits, cpu)
        quota = milli_cpu_to_quota(limit)
        trace.append(_value_from(_QUOTA, quota, "limit", cpu, limit))
    else:
        quota = _quota_disabled(trace)
    quota = _never_loosen_quota(normalize(quota, rules, trace), native, trace)

    memory = _positive(entry.limits, tier.memory_resource) or UNLIMITED
    trace.append(_value_from(_MEMORY, memory, "limit", tier.memory_resource, memory))
    memory = _never_loosen_memory(memory, native, trace)
    return shared_values(shares, quota, memory)


def pod_values(
    containers: Mapping[str, ContainerSpec],
    tier: Tier,
    rules: Rules,
    native: NativeLimits,
    trace: list[Step],
) -> CgroupValues:
    """Sums over the containers listed in the spec; unlisted containers do not count."""
    cpu, memory_name = tier.cpu_resource, tier.memory_resource
    requests = sum(_positive(entry.requests, cpu) for entry in containers.values())
    shares = milli_cpu_to_shares(requests)
    trace.append(_pod_sum((_SHARES, shares, cpu, requests, len(containers), None)))

    if rules.cfs_quota:
        total, unlimited_by = _pod_limit_sum(containers, cpu)
        quota = milli_cpu_to_quota(total)
        trace.append(_pod_sum((_QUOTA, quota, cpu, total, len(containers), unlimited_by)))
    else:
        quota = _quota_disabled(trace)
    quota = _never_loosen_quota(normalize(quota, rules, trace), native, trace)

    total, unlimited_by = _pod_limit_sum(containers, memory_name)
    # Koordinator would write 0 for a spec listing no containers; that means unlimited here.
    memory = total or UNLIMITED
    trace.append(_pod_sum((_MEMORY, memory, memory_name, total, len(containers), unlimited_by)))
    memory = _never_loosen_memory(memory, native, trace)
    return shared_values(shares, quota, memory)


def _positive(resources: Mapping[str, int], name: str) -> int:
    """The resource's value, or 0 where Koordinator treats it as absent (missing or <= 0)."""
    value = resources.get(name, 0)
    return value if value > 0 else 0


def _pod_limit_sum(
    containers: Mapping[str, ContainerSpec], resource: str
) -> tuple[int, str | None]:
    """Sum of the limits, or -1 and the container's name as soon as one listed has none."""
    total = 0
    for name, entry in containers.items():
        limit = _positive(entry.limits, resource)
        if not limit:
            return UNLIMITED, name
        total += limit
    return total, None


def _quota_disabled(trace: list[Step]) -> int:
    trace.append(QuotaDisabled())
    return UNLIMITED


def normalize(quota: int, rules: Rules, trace: list[Step]) -> int:
    ratio = rules.cpu_normalization_ratio
    # Koordinator ignores ratios in (0, 1]: "no support ratio in (0, 1) yet".
    if quota <= 0 or ratio is None or ratio <= 1:
        return quota
    scaled = int(-(-quota // ratio))  # ceil, exact
    trace.append(Normalized(scaled, quota, ratio))
    return scaled


def _never_loosen_quota(quota: int, native: NativeLimits, trace: list[Step]) -> int:
    native_quota = native.cpu_quota
    if native_quota is None or native_quota <= 0:
        return quota
    period = native.cpu_period if native.cpu_period and native.cpu_period > 0 else CFS_BASE_PERIOD
    # Compare rates, quota/period, without dividing: our quota assumes the 100000us period.
    if quota > 0 and quota * period <= native_quota * CFS_BASE_PERIOD:
        return quota
    trace.append(NeverLoosen(_QUOTA, native_quota, quota, period))
    return native_quota


def _never_loosen_memory(memory: int, native: NativeLimits, trace: list[Step]) -> int:
    native_memory = native.memory_limit
    if native_memory is None or native_memory <= 0:
        return memory
    if 0 < memory <= native_memory:
        return memory
    trace.append(NeverLoosen(_MEMORY, native_memory, memory))
    return native_memory
