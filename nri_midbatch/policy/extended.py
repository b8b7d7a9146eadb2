"""The extended-resources calculator: koordlet's BatchResource hook, for any tier's resources.

Values come from the tier's `*-cpu` and `*-memory` entries of the extended-resource spec
annotation (formulas in calculate.py). Batch and mid tiers use it.
"""

from __future__ import annotations

from .calculate import CgroupValues, container_values, pod_values
from .inputs import Inputs
from .spec import SpecError
from .trace import Step, Untouched, UntouchedReason

__all__ = ["NAME", "extended_values"]

NAME = "extended-resources"


def extended_values(inputs: Inputs, trace: list[Step]) -> CgroupValues | SpecError | None:
    """The tier's values; the spec's error; or None (traced) when the spec sets nothing."""
    spec = inputs.spec
    if isinstance(spec, SpecError):
        return spec
    if spec is None:
        trace.append(Untouched(UntouchedReason.NO_CONTAINERS, annotation=inputs.spec_annotation))
        return None
    container = inputs.container
    if container is None:
        return pod_values(spec.containers, inputs.tier, inputs.rules, inputs.pod.native, trace)
    entry = spec.containers.get(container.name)
    if entry is None:
        trace.append(Untouched(UntouchedReason.NOT_LISTED, container=container.name))
        return None
    return container_values(entry, inputs.tier, inputs.rules, container.native, trace)
