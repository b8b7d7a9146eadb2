"""Pod-level cgroup values and the cgroup v1 -> v2 conversions. Pure."""

from dataclasses import dataclass

UNLIMITED = -1
"""Quota or memory limit meaning "no limit" (written `-1` on v1, `max` on v2)."""

CPU_SHARES_MIN = 2
CPU_SHARES_MAX = 262144
CPU_WEIGHT_MIN = 1
CPU_WEIGHT_MAX = 10000


@dataclass(frozen=True)
class PodCgroupValues:
    """What the pod's cgroup should hold, in cgroup v1 units (as Koordinator computes them).

    cpu_shares: v1 `cpu.shares`; converted to `cpu.weight` on v2.
    cpu_quota: CFS quota in microseconds per period, or UNLIMITED.
    memory_limit: bytes, or UNLIMITED.
    """

    cpu_shares: int
    cpu_quota: int
    memory_limit: int

    def __post_init__(self) -> None:
        # Other negatives mean "unlimited" to the v1 kernel but are rejected by
        # v2's parser; refusing them keeps both versions meaning the same thing.
        for name, value in (("cpu_quota", self.cpu_quota), ("memory_limit", self.memory_limit)):
            if value != UNLIMITED and value <= 0:
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
