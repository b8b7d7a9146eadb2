"""Cgroup values as the cgroup files take them, and the v1 -> v2 conversions. Pure.

The values are the policy's `CgroupValues` (cgroup v1 units, as Koordinator computes
them) and so are the constants: one type and one set of limits for the whole plugin.
"""

import functools
import math
import resource
from dataclasses import dataclass

from nri_midbatch.policy.calculate import CPU_SHARES_MAX, CPU_SHARES_MIN, UNLIMITED, CgroupValues
from nri_midbatch.policy.views import NativeLimits

__all__ = [
    "CPU_SHARES_MAX",
    "CPU_SHARES_MIN",
    "CPU_WEIGHT_MAX",
    "CPU_WEIGHT_MIN",
    "UNLIMITED",
    "VALUE_FIELDS",
    "CgroupReading",
    "CgroupValues",
    "baseline_of",
    "check_writable",
    "clamp_cpu_shares",
    "cpu_shares_to_weight",
    "cpu_weight_to_shares",
    "differs",
    "drifted",
    "exceeds",
    "lowers",
    "runtime_cpu_weights",
    "set_fields",
]

CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000

#: The values a tier may set, as CgroupValues names them.
VALUE_FIELDS = ("cpu_shares", "cpu_quota", "memory_limit")

# A memory limit reads back rounded down to the page.
_PAGE_SIZE = resource.getpagesize()


def check_writable(values: CgroupValues) -> None:
    """Raise ValueError unless the quota and memory limit are positive or UNLIMITED.

    Other negatives mean "unlimited" to the v1 kernel but are rejected by v2's
    parser; refusing them keeps both versions meaning the same thing.
    """
    for name, value in (("cpu_quota", values.cpu_quota), ("memory_limit", values.memory_limit)):
        if value is not None and value != UNLIMITED and value <= 0:
            raise ValueError(f"{name} must be positive or {UNLIMITED}, got {value}")


@dataclass(frozen=True)
class CgroupReading:
    """What a pod's or a container's cgroup holds now; unlimited reads back as UNLIMITED on
    both versions.

    Exactly one of cpu_shares (v1) and cpu_weight (v2) is set: weight cannot
    be converted back to the shares it came from.
    """

    cpu_shares: int | None
    cpu_weight: int | None
    cpu_quota: int
    memory_limit: int


def clamp_cpu_shares(shares: int) -> int:
    """The range the v1 kernel stores (it clamps silently), so read-back compares equal."""
    return min(max(shares, CPU_SHARES_MIN), CPU_SHARES_MAX)


def cpu_shares_to_weight(shares: int) -> int:
    """kubelet's `CpuSharesToCpuWeight`, also used by Koordinator's `ConvertCPUSharesToWeight`.

    `1 + ((shares - 2) * 9999) // 262142`: shares [2, 262144] onto weight
    [1, 10000]. Shares are clamped first, so the result needs no clamping and
    the integer division never sees a negative operand.
    """
    clamped = clamp_cpu_shares(shares)
    span_shares = CPU_SHARES_MAX - CPU_SHARES_MIN
    span_weight = CPU_WEIGHT_MAX - CPU_WEIGHT_MIN
    return CPU_WEIGHT_MIN + ((clamped - CPU_SHARES_MIN) * span_weight) // span_shares


def cpu_weight_to_shares(weight: int) -> int:
    """The fewest shares that `cpu_shares_to_weight` turns into `weight`.

    A v2 cgroup keeps no shares, so kubelet's can be known only up to this: writing them back
    writes kubelet's weight again, exactly.
    """
    span_shares = CPU_SHARES_MAX - CPU_SHARES_MIN
    span_weight = CPU_WEIGHT_MAX - CPU_WEIGHT_MIN
    clamped = min(max(weight, CPU_WEIGHT_MIN), CPU_WEIGHT_MAX)
    return CPU_SHARES_MIN + -(-(clamped - CPU_WEIGHT_MIN) * span_shares // span_weight)


def _above(current: int, limit: int) -> bool:
    """Whether a quota or memory limit (UNLIMITED: none) is above `limit`."""
    if limit == UNLIMITED:
        return False
    return current == UNLIMITED or current > limit


def lowers(current: CgroupValues, new: CgroupValues) -> bool:
    """Whether `new` takes any of a container's values down (a None in `new` is kept)."""
    shares, memory = new.cpu_shares, new.memory_limit
    return (
        (shares is not None and current.cpu_shares is not None and shares < current.cpu_shares)
        or _above(current.cpu_quota, new.cpu_quota)
        or (
            memory is not None
            and current.memory_limit is not None
            and _above(current.memory_limit, memory)
        )
    )


def runtime_cpu_weights(shares: int) -> tuple[int, int]:
    """The cgroup v2 cpu weights an OCI runtime writes for a container's `shares`.

    Kubelet's linear conversion (`cpu_shares_to_weight`: runc up to 1.2, and what the plugin
    writes), and the curve runc 1.3 and crun use (opencontainers/cgroups
    `ConvertCPUSharesToCgroupV2Value`: 2, 1024 and 262144 shares onto weights 1, 100 and
    10000, through `10^((l^2 + 125 l) / 612 - 7/34)` with `l = log2(shares)`, rounded up).
    """
    linear = cpu_shares_to_weight(shares)
    clamped = clamp_cpu_shares(shares)
    if clamped <= CPU_SHARES_MIN:
        return linear, CPU_WEIGHT_MIN
    if clamped >= CPU_SHARES_MAX:
        return linear, CPU_WEIGHT_MAX
    log2 = math.log2(clamped)
    return linear, math.ceil(10 ** ((log2 * log2 + 125 * log2) / 612 - 7 / 34))


def drifted(reading: CgroupReading, values: CgroupValues, *, container: bool) -> tuple[str, ...]:
    """The fields of `values` (those it sets) that the cgroup does not hold.

    On cgroup v2 the cpu weight is compared: a pod's with the plugin's own conversion, which
    it writes; a container's with any of the conversions runtimes write
    (`runtime_cpu_weights`), as the runtime converted the shares it was given. The memory
    limit reads back rounded down to the page.
    """
    off = []
    shares = values.cpu_shares
    if shares is not None:
        if reading.cpu_shares is not None:
            if reading.cpu_shares != clamp_cpu_shares(shares):
                off.append("cpu_shares")
        elif container:
            if reading.cpu_weight not in runtime_cpu_weights(shares):
                off.append("cpu_shares")
        elif reading.cpu_weight != cpu_shares_to_weight(shares):
            off.append("cpu_shares")
    if reading.cpu_quota != values.cpu_quota:
        off.append("cpu_quota")
    memory = values.memory_limit
    if memory is not None and not (
        reading.memory_limit == memory
        or (memory != UNLIMITED and 0 <= memory - reading.memory_limit < _PAGE_SIZE)
    ):
        off.append("memory_limit")
    return tuple(off)


def exceeds(reading: CgroupReading, values: CgroupValues) -> bool:
    """Whether a cgroup holds more than `values` in any file it can be compared on.

    cgroup v2 holds a weight, which the runtime converts from shares its own
    way: only the quota and the memory limit are compared there.
    """
    shares, want_shares, memory = reading.cpu_shares, values.cpu_shares, values.memory_limit
    return (
        (shares is not None and want_shares is not None and shares > clamp_cpu_shares(want_shares))
        or _above(reading.cpu_quota, values.cpu_quota)
        or (memory is not None and _above(reading.memory_limit, memory))
    )


def differs(values: CgroupValues, current: CgroupValues) -> bool:
    """Whether a field that `values` sets is off in `current` (the quota is always set)."""
    shares, memory = values.cpu_shares, values.memory_limit
    return (
        values.cpu_quota != current.cpu_quota
        or (shares is not None and shares != current.cpu_shares)
        or (memory is not None and memory != current.memory_limit)
    )


# Values come from few distinct instances (a node has few distinct limits).
@functools.lru_cache(maxsize=1024)
def set_fields(values: CgroupValues) -> tuple[str, ...]:
    """The fields `values` sets (None: left as kubelet and the runtime set it)."""
    return tuple(name for name in VALUE_FIELDS if getattr(values, name) is not None)


def baseline_of(reading: CgroupReading, told: NativeLimits) -> NativeLimits:
    """Kubelet's values as a cgroup the plugin has not written holds them.

    cgroup v2 keeps a weight: the fewest shares that give it back (cgroups/values.py).
    """
    shares = reading.cpu_shares
    if shares is None and reading.cpu_weight is not None:
        shares = cpu_weight_to_shares(reading.cpu_weight)
    return NativeLimits(
        cpu_quota=reading.cpu_quota if reading.cpu_quota > 0 else None,
        cpu_period=told.cpu_period,
        memory_limit=reading.memory_limit if reading.memory_limit > 0 else None,
        cpu_shares=shares,
    )
