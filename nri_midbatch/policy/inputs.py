"""What a calculator is given: the pod (and container), its tier, the rules, the spec."""

from __future__ import annotations

from typing import NamedTuple

from .calculate import Rules
from .spec import ExtendedSpec, SpecError
from .tiers import Tier
from .views import ContainerView, PodView


# A NamedTuple, not a frozen dataclass: one is built for every decision, and a frozen
# dataclass's __init__ (object.__setattr__ per field) costs four times as much.
class Inputs(NamedTuple):
    pod: PodView
    container: ContainerView | None  # None: the pod level
    tier: Tier
    rules: Rules
    #: The extended-resource spec annotation as parsed: None when absent or without containers.
    spec: ExtendedSpec | SpecError | None
    spec_annotation: str
