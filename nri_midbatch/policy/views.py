"""Plain views of a pod and a container, built from NRI messages by `plugin/codec.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class NativeLimits:
    """Kubelet's own values for a cgroup (the baseline): what it set before any plugin of ours.

    For the quota and memory limit None (or a value <= 0) means unlimited; for the cpu shares
    None means unknown (a container annotated by an earlier version, which did not keep them):
    those cannot be given back.
    """

    cpu_quota: int | None = None
    cpu_period: int | None = None
    memory_limit: int | None = None
    cpu_shares: int | None = None


@dataclass(frozen=True, slots=True)
class PodView:
    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    cgroup_parent: str
    native: NativeLimits = field(default_factory=NativeLimits)


@dataclass(frozen=True, slots=True)
class ContainerView:
    id: str
    name: str
    native: NativeLimits = field(default_factory=NativeLimits)
    #: False when `native` is what the container holds now, which may include our own
    #: earlier values (a running container without the native-limits annotation).
    native_known: bool = True
