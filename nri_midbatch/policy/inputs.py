"""What a calculator is given: the pod (and container), its tier, the rules, the spec."""

from __future__ import annotations

from dataclasses import dataclass

from .calculate import Rules
from .spec import ExtendedSpec, SpecError
from .tiers import Tier
from .views import ContainerView, PodView


@dataclass(frozen=True, slots=True)
class Inputs:
    pod: PodView
    container: ContainerView | None  # None: the pod level
    tier: Tier
    rules: Rules
    #: The extended-resource spec annotation as parsed: None when absent or without containers.
    spec: ExtendedSpec | SpecError | None
    spec_annotation: str
