"""The cpu-normalization calculator: koordlet's CPUNormalization hook, on the tier chain.

koordlet scales the CFS quota the runtime set for a pod of QoS LS or without a QoS class,
unless the pod is bound to a cpuset: a positive quota becomes ceil(quota / ratio) when the
node's ratio is above 1. It only ever lowers a quota, so never-loosen has nothing to do, and it
sets nothing else: shares and the memory limit stay as kubelet set them. Which pods it takes
is the tier's business (priority and QoS), so a Mid+LS pod, which the mid tier takes first, is
never scaled twice: the mid formula divides by the same ratio when the pod's spec has mid
entries, and without them nothing scales the pod at all (docs/koordinator.md).
"""

from __future__ import annotations

from .calculate import CgroupValues, normalize, shared_values
from .cpuset import bound_cpuset
from .inputs import Inputs
from .trace import Step, Untouched, UntouchedReason

__all__ = ["NAME", "normalized_values"]

NAME = "cpu-normalization"


def normalized_values(inputs: Inputs, trace: list[Step]) -> CgroupValues | None:
    """The quota scaled by the ratio, or None (traced) when there is nothing to scale."""
    cpuset = bound_cpuset(inputs.pod.annotations)
    if cpuset is not None:
        trace.append(Untouched(UntouchedReason.CPUSET_BOUND, detail=cpuset))
        return None
    container = inputs.container
    if container is not None and not container.native_known:
        trace.append(Untouched(UntouchedReason.NATIVE_UNKNOWN, container=container.name))
        return None
    native = inputs.pod.native if container is None else container.native
    quota = native.cpu_quota
    if quota is None or quota <= 0:
        trace.append(Untouched(UntouchedReason.NO_QUOTA))
        return None
    ratio = inputs.rules.cpu_normalization_ratio
    if ratio is None or ratio <= 1:
        trace.append(Untouched(UntouchedReason.NO_RATIO))
        return None
    return shared_values(None, normalize(quota, inputs.rules, trace), None)
