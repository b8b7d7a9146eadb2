"""Koordinator's QoS and priority class names (apis/extension qos.go, priority.go)."""

from __future__ import annotations

from enum import StrEnum


class QoSClass(StrEnum):
    LSE = "LSE"
    LSR = "LSR"
    LS = "LS"
    BE = "BE"
    SYSTEM = "SYSTEM"


class PriorityClass(StrEnum):
    PROD = "koord-prod"
    MID = "koord-mid"
    BATCH = "koord-batch"
    FREE = "koord-free"


# Koordinator apis/extension priority.go: inclusive value ranges of the four classes (mid was
# raised from 7099 to 7999 in PR #693). Everything else is PriorityNone.
PRIORITY_RANGES: tuple[tuple[PriorityClass, int, int], ...] = (
    (PriorityClass.PROD, 9000, 9999),
    (PriorityClass.MID, 7000, 7999),
    (PriorityClass.BATCH, 5000, 5999),
    (PriorityClass.FREE, 3000, 3999),
)


def priority_class_from_value(priority: int) -> PriorityClass | None:
    """The class of a numeric spec.priority (GetPodPriorityClassRaw's range lookup); None: none."""
    for priority_class, low, high in PRIORITY_RANGES:
        if low <= priority <= high:
            return priority_class
    return None


# The intended priority x QoS matrix (Koordinator PR #2270/#2280), checked loosely as review asked:
# only the combinations that contradict themselves. Batch+LS and Free+LS stay allowed.
_FORBIDDEN_QOS: dict[PriorityClass, frozenset[QoSClass]] = {
    PriorityClass.PROD: frozenset({QoSClass.BE}),
    PriorityClass.MID: frozenset({QoSClass.LSE, QoSClass.LSR}),
    PriorityClass.BATCH: frozenset({QoSClass.LSE, QoSClass.LSR}),
    PriorityClass.FREE: frozenset({QoSClass.LSE, QoSClass.LSR}),
}


def forbidden_combination(priority: PriorityClass | None, qos: QoSClass | None) -> str | None:
    """Why this priority class cannot run with this QoS class, or None when it may."""
    if priority is None or qos is None or qos not in _FORBIDDEN_QOS[priority]:
        return None
    if priority is PriorityClass.PROD:
        why = "best-effort QoS would let a production pod be suppressed and evicted"
    else:
        why = f"QoS {qos} reserves dedicated CPUs, which only koord-prod pods may hold"
    return f"priority class {priority} cannot run with QoS class {qos}: {why}"
