"""The policy's public entry points: a pod (and container) in, a Decision out.

Errors are values: an unusable annotation gives a Decision with `error` set and no values, and
the plugin handlers apply the failure policy.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from .calculate import CgroupValues, shared_values
from .calculators import CALCULATORS
from .chain import TierMatch
from .classes import PriorityClass, QoSClass
from .classify import Classified
from .compiled import Policy
from .cpuset import bound_cpuset
from .inputs import Inputs
from .quantity import INT64_MAX
from .spec import ExtendedSpec, SpecError, load_spec
from .tiers import Tier
from .trace import CpusetBound, SpecIgnored, Step
from .views import ContainerView, PodView

#: A step of a Decision's trace: the two classifications first, then the chain's steps.
TraceStep = Classified[QoSClass] | Classified[PriorityClass] | Step

__all__ = [
    "CgroupValues",
    "Decision",
    "ErrorKind",
    "PodClass",
    "classify_pod",
    "decide_container",
    "decide_pod",
]


class ErrorKind(StrEnum):
    """What made a decision fail, as a short label for metrics."""

    SPEC = "spec"  # the extended-resource-spec annotation is unusable
    OVERFLOW = "overflow"  # a computed value does not fit the runtime's int64


# A NamedTuple, immutable as the frozen dataclasses around it but built for a quarter of
# their cost (no object.__setattr__ per field): one is made for every decision, and that
# was a tenth of a decision's time.
class Decision(NamedTuple):
    tier: str | None
    values: CgroupValues | None  # None: leave the cgroup as kubelet/runtime set it
    error: str | None
    #: Why, as data (policy/trace.py); `render()` makes it lines of text.
    trace: tuple[TraceStep, ...]
    priority: Classified[PriorityClass]
    qos: Classified[QoSClass]
    error_kind: ErrorKind | None = None


class PodClass(NamedTuple):
    """What the decisions of a pod's containers share: its classes, spec and tier."""

    qos: Classified[QoSClass]
    priority: Classified[PriorityClass]
    spec: ExtendedSpec | SpecError | None
    match: TierMatch


def classify_pod(pod: PodView, policy: Policy) -> PodClass:
    """The pod's part of every decision about it: a third of a container's decision."""
    classifier = policy.classifier
    qos = classifier.qos(pod.labels, pod.cgroup_parent)
    annotation = pod.annotations.get(policy.spec_annotation)
    spec = None if annotation is None else load_spec(annotation)
    usable = spec if isinstance(spec, ExtendedSpec) else None
    priority = classifier.priority(
        pod.labels, qos.value, None if usable is None else usable.resource_names
    )
    return PodClass(
        qos, priority, spec, policy.chain.select(priority.value, qos.value, pod.namespace)
    )


def decide_pod(pod: PodView, policy: Policy, pod_class: PodClass | None = None) -> Decision:
    """Pod-level values, for the pod cgroup written at RunPodSandbox.

    `pod_class`: as for decide_container, where the pod's containers are decided too.
    """
    return _decide(pod, None, policy, classify_pod(pod, policy) if pod_class is None else pod_class)


def decide_container(
    pod: PodView, container: ContainerView, policy: Policy, pod_class: PodClass | None = None
) -> Decision:
    """Container-level values, for CreateContainer and UpdateContainer.

    `pod_class`: `classify_pod(pod, policy)`, made once for all of a pod's
    containers where they are decided together (a Synchronize).
    """
    return _decide(
        pod, container, policy, classify_pod(pod, policy) if pod_class is None else pod_class
    )


def _decide(
    pod: PodView, container: ContainerView | None, policy: Policy, pod_class: PodClass
) -> Decision:
    qos, priority, spec, match = pod_class
    tier = match.tier
    if tier is None:
        trace: tuple[TraceStep, ...] = (qos, priority, *match.reasons)
        if isinstance(spec, SpecError):
            trace += (SpecIgnored(str(spec)),)
        return Decision(None, None, None, trace, priority, qos)

    steps: list[Step] = [*match.reasons]
    inputs = Inputs(pod, container, tier, policy.rules, spec, policy.spec_annotation)
    outcome = CALCULATORS[tier.calculator](inputs, steps)
    if isinstance(outcome, SpecError):
        return _done(tier, qos, priority, steps, None, str(outcome), ErrorKind.SPEC)
    if outcome is None:
        return _done(tier, qos, priority, steps)
    values = outcome
    # koordlet's CPUSetAllocator runs after the batch hook and unsets the quota of a pod
    # bound to a cpuset, whatever the tier computed (never-loosen included): the cpuset is
    # the pod's bound.
    if values.cpu_quota != -1:
        cpuset = bound_cpuset(pod.annotations)
        if cpuset is not None:
            steps.append(CpusetBound(cpuset, values.cpu_quota))
            values = shared_values(values.cpu_shares, -1, values.memory_limit)

    if values.cpu_quota > INT64_MAX or (values.memory_limit or 0) > INT64_MAX:
        error = f"computed {values} does not fit in int64"
        return _done(tier, qos, priority, steps, None, error, ErrorKind.OVERFLOW)
    return _done(tier, qos, priority, steps, values)


def _done(
    tier: Tier,
    qos: Classified[QoSClass],
    priority: Classified[PriorityClass],
    steps: list[Step],
    values: CgroupValues | None = None,
    error: str | None = None,
    kind: ErrorKind | None = None,
) -> Decision:
    """The decision of a pod a tier took: the classifications, then the chain's steps."""
    return Decision(tier.name, values, error, (qos, priority, *steps), priority, qos, kind)
