"""What the history tests generate: pods, their containers, and configurations.

Plain data, known to the oracle (which computes targets from it) and to the harness
(which turns it into NRI messages, kubelet's cgroup files and configuration files).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, replace
from typing import Any

QOS_LABEL = "koordinator.sh/qosClass"
PRIORITY_LABEL = "koordinator.sh/priority-class"
SPEC_ANNOTATION = "node.koordinator.sh/extended-resource-spec"
MI = 1024 * 1024


class Kind(enum.Enum):
    """The pod shapes of the brief: which tier may take a pod depends on its kind alone."""

    BATCH_BE = "batch-be"  # koord-batch, QoS BE, kubelet besteffort, batch-* resources
    MID_BE = "mid-be"  # koord-mid, QoS BE, kubelet besteffort, mid-* resources
    MID_LS = "mid-ls"  # koord-mid, QoS LS, kubelet burstable with limits, mid-* resources
    NORMALIZED_LS = "normalized-ls"  # koord-prod, QoS LS, kubelet burstable, no annotation
    PROD_LSR = "prod-lsr"  # koord-prod, QoS LSR: in no tier of any configuration here

    @property
    def labels(self) -> dict[str, str]:
        qos, priority = _LABELS[self]
        return {QOS_LABEL: qos, PRIORITY_LABEL: priority}

    @property
    def besteffort(self) -> bool:
        return self in (Kind.BATCH_BE, Kind.MID_BE)

    @property
    def resource_prefix(self) -> str | None:
        """The extended resources its annotation names, if it has one."""
        return {Kind.BATCH_BE: "batch", Kind.MID_BE: "mid", Kind.MID_LS: "mid"}.get(self)


_LABELS = {
    Kind.BATCH_BE: ("BE", "koord-batch"),
    Kind.MID_BE: ("BE", "koord-mid"),
    Kind.MID_LS: ("LS", "koord-mid"),
    Kind.NORMALIZED_LS: ("LS", "koord-prod"),
    Kind.PROD_LSR: ("LSR", "koord-prod"),
}


@dataclass(frozen=True)
class Native:
    """Native (kubelet) cpu and memory of a container or of a pod's overhead; None: unset."""

    cpu_request: int | None = None  # milli-cores
    cpu_limit: int | None = None  # milli-cores
    memory_limit: int | None = None  # bytes


@dataclass(frozen=True)
class Extended:
    """A container's entry in the extended-resource spec (milli-cores and bytes)."""

    cpu_request: int | None = None
    cpu_limit: int | None = None
    memory_limit: int | None = None


@dataclass(frozen=True)
class ContainerModel:
    name: str
    extended: Extended | None  # None: not listed in the annotation
    native: Native  # kubelet's resources, changed by a resize


@dataclass(frozen=True)
class PodModel:
    id: str
    kind: Kind
    containers: tuple[ContainerModel, ...]
    overhead: Native = Native()
    #: The pod's uid where it is not the sandbox's own: a sandbox kubelet recreated.
    pod_uid: str = ""

    @property
    def uid(self) -> str:
        return self.pod_uid or f"uid-{self.id}"

    @property
    def cgroup_parent(self) -> str:
        qos = "besteffort" if self.kind.besteffort else "burstable"
        return f"/kubepods/{qos}/pod{self.uid}"

    def container(self, name: str) -> ContainerModel:
        (found,) = [c for c in self.containers if c.name == name]
        return found

    def resized(self, name: str, native: Native) -> PodModel:
        return replace(
            self,
            containers=tuple(
                replace(c, native=native) if c.name == name else c for c in self.containers
            ),
        )

    def annotations(self) -> dict[str, str]:
        prefix = self.kind.resource_prefix
        if prefix is None:
            return {}
        entries = {c.name: _spec_entry(prefix, c.extended) for c in self.containers if c.extended}
        return {SPEC_ANNOTATION: json.dumps({"containers": entries})}


def _spec_entry(prefix: str, extended: Extended) -> dict[str, dict[str, str]]:
    """As Koordinator's webhook writes it: canonical quantity strings, empty maps left out."""
    requests, limits = {}, {}
    if extended.cpu_request is not None:
        requests[f"kubernetes.io/{prefix}-cpu"] = milli_text(extended.cpu_request)
    if extended.cpu_limit is not None:
        limits[f"kubernetes.io/{prefix}-cpu"] = milli_text(extended.cpu_limit)
    if extended.memory_limit is not None:
        limits[f"kubernetes.io/{prefix}-memory"] = bytes_text(extended.memory_limit)
    entry = {}
    if requests:
        entry["requests"] = requests
    if limits:
        entry["limits"] = limits
    return entry


def milli_text(milli: int) -> str:
    """Canonical form of an integer quantity: 1000 is `1k`, 1500 stays `1500`."""
    return f"{milli // 1000}k" if milli % 1000 == 0 else str(milli)


def bytes_text(size: int) -> str:
    return f"{size // MI}Mi" if size % MI == 0 else str(size)


@dataclass(frozen=True)
class Config:
    """One configuration of the set the tests reload between."""

    ratio: str | None = None  # the decimal as written in the file
    cfs_quota: bool = True
    mid_tier: bool = True
    normalization_tier: bool = False
    observe: bool = False
    pod_level: bool = True

    def document(self, cgroup_root: str) -> dict[str, Any]:
        """The configuration file's content (JSON is YAML)."""
        tiers: list[dict[str, Any]] = [
            {
                "name": "batch",
                "priorityClasses": ["koord-batch", "koord-free"],
                "qosClasses": ["BE"],
                "resources": {
                    "cpu": "kubernetes.io/batch-cpu",
                    "memory": "kubernetes.io/batch-memory",
                },
            }
        ]
        if self.mid_tier:
            tiers.append(
                {
                    "name": "mid",
                    "priorityClasses": ["koord-mid"],
                    "qosClasses": ["BE", "LS"],
                    "resources": {
                        "cpu": "kubernetes.io/mid-cpu",
                        "memory": "kubernetes.io/mid-memory",
                    },
                }
            )
        if self.normalization_tier:
            tiers.append(
                {
                    "name": "prod",
                    "priorityClasses": ["koord-prod", "None"],
                    "qosClasses": ["LS", "None"],
                    "calculator": "cpu-normalization",
                }
            )
        rules: dict[str, Any] = {"cfsQuota": self.cfs_quota}
        if self.ratio is not None:
            rules["cpuNormalizationRatio"] = float(self.ratio)
        return {
            "mode": "observe" if self.observe else "enforce",
            "tiers": tiers,
            "rules": rules,
            "cgroups": {"root": cgroup_root, "podLevel": self.pod_level},
        }
