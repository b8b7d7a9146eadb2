"""A tier is data: which pods it takes and which extended resources it reads."""

from __future__ import annotations

from dataclasses import dataclass

from .classes import PriorityClass, QoSClass


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    # Ordered: the first class is the one inferred for an unlabelled pod carrying this tier's
    # resources (batch lists koord-batch before koord-free).
    priority_classes: tuple[PriorityClass, ...]
    qos_classes: frozenset[QoSClass]
    cpu_resource: str
    memory_resource: str
    namespaces: frozenset[str] | None = None  # None: every namespace
