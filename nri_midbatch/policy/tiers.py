"""A tier is data: which pods it takes, which calculator gives their values, what it reads."""

from __future__ import annotations

from dataclasses import dataclass

from .classes import PriorityClass, QoSClass

#: The calculator of Koordinator's batch hook: values from the tier's extended resources.
EXTENDED_RESOURCES = "extended-resources"


@dataclass(frozen=True, slots=True)
class Tier:
    name: str
    # Ordered: the first class is the one inferred for an unlabelled pod carrying this tier's
    # resources (batch lists koord-batch before koord-free). None: a pod without the class.
    priority_classes: tuple[PriorityClass | None, ...]
    qos_classes: frozenset[QoSClass | None]
    # Empty for a calculator that reads no extended resources (cpu-normalization).
    cpu_resource: str = ""
    memory_resource: str = ""
    namespaces: frozenset[str] | None = None  # None: every namespace
    #: A name of policy/calculators.py's CALCULATORS.
    calculator: str = EXTENDED_RESOURCES
