"""Whether values told to the plugin (by the runtime, or by a pod's record) are ones a cgroup
file takes and kubelet writes. Pure.

Kubelet's values become the plugin's own writes (never-loosen gives them back): one that no
cgroup file holds would be written, and refused by the kernel, or worse, taken modulo 2^64.
Kubelet writes its shares within [2, 262144] (`MilliCPUToShares` clamps), a quota of at
least 1 ms (`MilliCPUToQuota`, the kernel's minimum) and a period within the kernel's
[1 ms, 1 s]; the kernel refuses a quota above 2^44-1 us (`max_cfs_runtime` in
kernel/sched/core.c, "more than 203 days") and a memory limit is at most the largest int64.
"""

from __future__ import annotations

from .calculate import CFS_QUOTA_MIN, CPU_SHARES_MAX, CPU_SHARES_MIN, UNLIMITED, CgroupValues
from .quantity import INT64_MAX
from .views import NativeLimits

__all__ = [
    "CFS_PERIOD_MAX",
    "CFS_PERIOD_MIN",
    "CFS_QUOTA_MAX",
    "unholdable_kubelet",
    "unholdable_set",
]

CFS_QUOTA_MAX = (1 << 44) - 1
CFS_PERIOD_MIN = 1000
CFS_PERIOD_MAX = 1_000_000

#: NativeLimits' fields and the range of each (None: not set, always allowed).
_KUBELET_RANGES = (
    ("cpu_shares", CPU_SHARES_MIN, CPU_SHARES_MAX),
    ("cpu_quota", CFS_QUOTA_MIN, CFS_QUOTA_MAX),
    ("cpu_period", CFS_PERIOD_MIN, CFS_PERIOD_MAX),
    ("memory_limit", 1, INT64_MAX),
)
#: CgroupValues' fields (UNLIMITED allowed for the quota and memory). The plugin's own quota
#: may be below 1 ms (cpu-normalization divides kubelet's) or above the kernel's bound (the
#: decision stops at int64): a record holds what the plugin set, whichever it was.
_SET_RANGES = (
    ("cpu_shares", CPU_SHARES_MIN, CPU_SHARES_MAX),
    ("cpu_quota", 1, INT64_MAX),
    ("memory_limit", 1, INT64_MAX),
)


def unholdable_kubelet(native: NativeLimits) -> str | None:
    """Why `native` cannot be kubelet's values, or None if it can."""
    for name, low, high in _KUBELET_RANGES:
        value = getattr(native, name)
        if value is not None and not (type(value) is int and low <= value <= high):
            return f"{name} {value!r} is outside [{low}, {high}]"
    return None


def unholdable_set(values: CgroupValues) -> str | None:
    """Why `values` cannot be what the plugin set, or None if they can."""
    for name, low, high in _SET_RANGES:
        value = getattr(values, name)
        if value is None or (value == UNLIMITED and name != "cpu_shares"):
            continue
        if not (type(value) is int and low <= value <= high):
            return f"{name} {value!r} is outside [{low}, {high}]"
    return None
