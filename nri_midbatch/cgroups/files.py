"""Which pod-level cgroup files hold which values, and what text goes into them. Pure."""

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from nri_midbatch.cgroups.values import (
    UNLIMITED,
    CgroupValues,
    check_writable,
    clamp_cpu_shares,
    cpu_shares_to_weight,
)

Controller = Literal["cpu", "memory"]

_INTEGER = re.compile(r"-?[0-9]+")

# v1 stores memory limits in pages and reads "unlimited" back as LONG_MAX
# rounded down to the page size (9223372036854771712 with 4 KiB pages), so any
# value this large means unlimited whatever the page size; no real limit is 4 EiB.
_V1_MEMORY_UNLIMITED_FLOOR = 1 << 62


class CgroupVersion(StrEnum):
    V1 = "v1"
    V2 = "v2"


@dataclass(frozen=True)
class CgroupFile:
    """A cgroup interface file; on v1 it lives in its controller's own hierarchy."""

    controller: Controller
    name: str


CPU_SHARES = CgroupFile("cpu", "cpu.shares")
CPU_CFS_QUOTA_US = CgroupFile("cpu", "cpu.cfs_quota_us")
MEMORY_LIMIT_IN_BYTES = CgroupFile("memory", "memory.limit_in_bytes")
CPU_WEIGHT = CgroupFile("cpu", "cpu.weight")
CPU_MAX = CgroupFile("cpu", "cpu.max")
MEMORY_MAX = CgroupFile("memory", "memory.max")


@dataclass(frozen=True)
class Setting:
    """One file and the value it should hold.

    value is what the file reads back as (UNLIMITED for no limit), for
    comparing with the current content; text is what gets written.
    """

    file: CgroupFile
    value: int
    text: str


def pod_files(version: CgroupVersion) -> tuple[CgroupFile, CgroupFile, CgroupFile]:
    """The (cpu weight, cpu quota, memory limit) files of a pod cgroup, in write order.

    The order is Koordinator's. The three files are independent (two
    controllers), and every one is attempted whatever happened to the others,
    so the order only decides what is already in place if a later write fails:
    shares/weight first because it cannot fail for a clamped value and is what
    keeps a batch pod from competing with latency-sensitive ones; the quota
    next (v1 refuses a pod quota below a child's with EINVAL, which at
    RunPodSandbox can only be the sandbox container's, normally unlimited);
    memory last because it is the write most likely to fail (EBUSY on v1 when
    usage is above the new limit).
    """
    if version is CgroupVersion.V1:
        return CPU_SHARES, CPU_CFS_QUOTA_US, MEMORY_LIMIT_IN_BYTES
    return CPU_WEIGHT, CPU_MAX, MEMORY_MAX


def pod_settings(version: CgroupVersion, values: CgroupValues) -> tuple[Setting, ...]:
    """The writes that give a pod cgroup these values, in write order.

    Raises ValueError for values no cgroup version takes alike (check_writable).
    """
    check_writable(values)
    cpu_file, quota_file, memory_file = pod_files(version)
    shares = values.cpu_shares
    if version is CgroupVersion.V1:
        cpu_value = None if shares is None else clamp_cpu_shares(shares)
        unlimited_text = "-1"
    else:
        cpu_value = None if shares is None else cpu_shares_to_weight(shares)
        unlimited_text = "max"

    def limit(file: CgroupFile, value: int) -> Setting:
        return Setting(file, value, unlimited_text if value == UNLIMITED else str(value))

    # cpu.max holds "<quota> <period>"; writing the quota token alone makes the
    # kernel keep the current period (cpu_max_write starts from it). That is
    # atomic, unlike reading the period and writing both back, which could undo
    # a period change made in between by someone else.
    # A value left as None (CPU normalization sets the quota only) is not written.
    settings = (
        None if cpu_value is None else Setting(cpu_file, cpu_value, str(cpu_value)),
        limit(quota_file, values.cpu_quota),
        None if values.memory_limit is None else limit(memory_file, values.memory_limit),
    )
    return tuple(setting for setting in settings if setting is not None)


def parse_value(file: CgroupFile, text: str) -> int:
    """The value a file's content stands for, UNLIMITED for no limit.

    Raises ValueError for content that is not a cgroup value.
    """
    tokens = text.split()
    # cpu.max reads "<quota> <period>"; the quota comes first.
    token = tokens[0] if tokens else ""
    if token == "max":
        return UNLIMITED
    if not _INTEGER.fullmatch(token):
        raise ValueError(f"{file.name}: unexpected content {text!r}")
    value = int(token)
    if file == MEMORY_LIMIT_IN_BYTES and value >= _V1_MEMORY_UNLIMITED_FLOOR:
        return UNLIMITED
    return value


def needs_write(setting: Setting, current_text: str) -> bool:
    """Whether the file's current content differs from what the setting asks for."""
    try:
        return parse_value(setting.file, current_text) != setting.value
    except ValueError:
        return True
