"""Which QoS and priority class a pod has, and where that answer came from.

Mirrors Koordinator's GetQoSClassByAttrs and GetPodPriorityClassWithDefault, with NRI's limits:
a sandbox carries labels and annotations but no spec.priority, so the priority class comes from
the priority-class label, else from the tier resources named in the extended-resource spec, else
from the QoS class.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Generic, TypeVar

from .classes import PriorityClass, QoSClass
from .tiers import Tier

__all__ = [
    "ClassificationSettings",
    "Classified",
    "Classifier",
    "Source",
    "qos_from_cgroup_parent",
]

T = TypeVar("T", QoSClass, PriorityClass)


class Source(StrEnum):
    LABEL = "label"
    SPEC_RESOURCES = "spec resources"
    QOS_DEFAULT = "qos default"
    CGROUP_PARENT = "cgroup parent"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Classified(Generic[T]):
    """A class (None = no class) with its source and a line for the decision trace."""

    value: T | None
    source: Source
    detail: str

    def __str__(self) -> str:
        return self.detail


@dataclass(frozen=True, slots=True)
class ClassificationSettings:
    qos_label: str
    priority_class_label: str
    spec_annotation: str
    qos_from_cgroup_parent: bool


# GetPodPriorityClassWithQoS; Mid can combine with LS, so the mapping only runs one way.
_PRIORITY_BY_QOS = {
    QoSClass.SYSTEM: PriorityClass.PROD,
    QoSClass.LSE: PriorityClass.PROD,
    QoSClass.LSR: PriorityClass.PROD,
    QoSClass.LS: PriorityClass.PROD,
    QoSClass.BE: PriorityClass.BATCH,
}


def qos_from_cgroup_parent(path: str) -> QoSClass | None:
    """Kubelet's QoS directory: kubepods/besteffort, kubepods/burstable or kubepods itself.

    Handles cgroupfs (/kubepods/besteffort/pod<uid>) and systemd
    (/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice) names.
    Guaranteed maps to LSR, Koordinator's default QoSClassForGuaranteed.
    """
    words: set[str] = set()
    for segment in path.split("/"):
        words.update(segment.removesuffix(".slice").split("-"))
    if "kubepods" not in words:
        return None
    if "besteffort" in words:
        return QoSClass.BE
    if "burstable" in words:
        return QoSClass.LS
    return QoSClass.LSR


class Classifier:
    """Classification with every label-derived answer built once, at policy compile time."""

    __slots__ = (
        "_by_priority_label",
        "_by_qos",
        "_by_qos_label",
        "_inference",
        "_no_priority",
        "_no_qos",
        "settings",
    )

    def __init__(self, settings: ClassificationSettings, tiers: Sequence[Tier]) -> None:
        self.settings = settings
        qos_label = settings.qos_label
        priority_label = settings.priority_class_label
        self._by_qos_label = {
            qos.value: Classified(qos, Source.LABEL, f"qos {qos} from label {qos_label}")
            for qos in QoSClass
        }
        also = " and cgroup parent not under kubepods" if settings.qos_from_cgroup_parent else ""
        self._no_qos: Classified[QoSClass] = Classified(
            None, Source.NONE, f"qos none: label {qos_label} absent{also}"
        )
        self._by_priority_label = {
            pc.value: Classified(pc, Source.LABEL, f"priority {pc} from label {priority_label}")
            for pc in PriorityClass
        }
        self._inference = tuple(
            (
                frozenset((tier.cpu_resource, tier.memory_resource)),
                Classified(
                    tier.priority_classes[0],
                    Source.SPEC_RESOURCES,
                    f"priority {tier.priority_classes[0]} inferred from tier {tier.name} "
                    f"resources in the extended-resource spec",
                ),
            )
            for tier in tiers
            if tier.cpu_resource  # tiers whose calculator reads no resources infer nothing
        )
        self._by_qos = {
            qos: Classified(pc, Source.QOS_DEFAULT, f"priority {pc} by default for qos {qos}")
            for qos, pc in _PRIORITY_BY_QOS.items()
        }
        self._no_priority: Classified[PriorityClass] = Classified(
            None, Source.NONE, f"priority none: label {priority_label} absent and qos none"
        )

    def qos(self, labels: Mapping[str, str], cgroup_parent: str) -> Classified[QoSClass]:
        raw = labels.get(self.settings.qos_label)
        if raw is not None:
            found = self._by_qos_label.get(raw)
            if found is not None:
                return found
            return Classified(
                None,
                Source.LABEL,
                f"qos none: label {self.settings.qos_label} has unknown value {raw!r}",
            )
        if self.settings.qos_from_cgroup_parent:
            qos = qos_from_cgroup_parent(cgroup_parent)
            if qos is not None:
                return Classified(
                    qos, Source.CGROUP_PARENT, f"qos {qos} from cgroup parent {cgroup_parent}"
                )
        return self._no_qos

    def priority(
        self,
        labels: Mapping[str, str],
        qos: QoSClass | None,
        spec_resources: frozenset[str] | None,
    ) -> Classified[PriorityClass]:
        """spec_resources: resource names in the spec, or None when there is no usable spec."""
        raw = labels.get(self.settings.priority_class_label)
        if raw is not None:
            found = self._by_priority_label.get(raw)
            if found is not None:
                return found
            # Koordinator: a present but invalid label is PriorityNone, with no fallback.
            return Classified(
                None,
                Source.LABEL,
                f"priority none: label {self.settings.priority_class_label} "
                f"has unknown value {raw!r}",
            )
        if spec_resources:
            for resources, inferred in self._inference:
                if not resources.isdisjoint(spec_resources):
                    return inferred
        if qos is not None:
            return self._by_qos[qos]
        return self._no_priority
