"""Pod-level cgroup values as the cgroup files take them, and the v1 -> v2 conversions. Pure.

The values are the policy's `CgroupValues` (cgroup v1 units, as Koordinator computes
them) and so are the constants: one type and one set of limits for the whole plugin.
"""

from dataclasses import dataclass

from nri_midbatch.policy.calculate import CPU_SHARES_MAX, CPU_SHARES_MIN, UNLIMITED, CgroupValues

__all__ = [
    "CPU_SHARES_MAX",
    "CPU_SHARES_MIN",
    "CPU_WEIGHT_MAX",
    "CPU_WEIGHT_MIN",
    "UNLIMITED",
    "CgroupValues",
    "PodCgroupReading",
    "check_writable",
    "clamp_cpu_shares",
    "cpu_shares_to_weight",
]

CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000


def check_writable(values: CgroupValues) -> None:
    """Raise ValueError unless the quota and memory limit are positive or UNLIMITED.

    Other negatives mean "unlimited" to the v1 kernel but are rejected by v2's
    parser; refusing them keeps both versions meaning the same thing.
    """
    for name, value in (("cpu_quota", values.cpu_quota), ("memory_limit", values.memory_limit)):
        if value is not None and value != UNLIMITED and value <= 0:
            raise ValueError(f"{name} must be positive or {UNLIMITED}, got {value}")


@dataclass(frozen=True)
class PodCgroupReading:
    """What a pod's cgroup holds now; unlimited reads back as UNLIMITED on both versions.

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
