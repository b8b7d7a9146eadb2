"""The policy's public entry points: a pod (and container) in, a Decision out.

Errors are values: an unusable annotation gives a Decision with `error` set and no values, and
the plugin glue applies the failure policy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from .calculate import CgroupValues
from .calculators import CALCULATORS
from .classes import PriorityClass, QoSClass
from .classify import Classified
from .compiled import Policy
from .cpuset import bound_cpuset
from .inputs import Inputs
from .quantity import INT64_MAX
from .spec import ExtendedSpec, SpecError, load_spec
from .trace import CpusetBound, SpecIgnored, Step
from .views import ContainerView, PodView

#: A step of a Decision's trace: the two classifications first, then the chain's steps.
TraceStep = Classified[QoSClass] | Classified[PriorityClass] | Step

__all__ = ["CgroupValues", "Decision", "ErrorKind", "decide_container", "decide_pod"]


class ErrorKind(StrEnum):
    """What made a decision fail, as a short label for metrics."""

    SPEC = "spec"  # the extended-resource-spec annotation is unusable
    OVERFLOW = "overflow"  # a computed value does not fit the runtime's int64


@dataclass(frozen=True, slots=True)
class Decision:
    tier: str | None
    values: CgroupValues | None  # None: leave the cgroup as kubelet/runtime set it
    error: str | None
    #: Why, as data (policy/trace.py); `render()` makes it lines of text.
    trace: tuple[TraceStep, ...]
    priority: Classified[PriorityClass]
    qos: Classified[QoSClass]
    error_kind: ErrorKind | None = None


def decide_pod(pod: PodView, policy: Policy) -> Decision:
    """Pod-level values, for the pod cgroup written at RunPodSandbox."""
    return _decide(pod, None, policy)


def decide_container(pod: PodView, container: ContainerView, policy: Policy) -> Decision:
    """Container-level values, for CreateContainer and UpdateContainer."""
    return _decide(pod, container, policy)


def _decide(pod: PodView, container: ContainerView | None, policy: Policy) -> Decision:
    classifier = policy.classifier
    qos = classifier.qos(pod.labels, pod.cgroup_parent)
    annotation = pod.annotations.get(policy.spec_annotation)
    spec = None if annotation is None else load_spec(annotation)
    usable = spec if isinstance(spec, ExtendedSpec) else None
    priority = classifier.priority(
        pod.labels, qos.value, None if usable is None else usable.resource_names
    )
    trace: list[TraceStep] = [qos, priority]
    match = policy.chain.select(priority.value, qos.value, pod.namespace)
    trace += match.reasons
    tier = match.tier

    def done(
        values: CgroupValues | None = None, error: str | None = None, kind: ErrorKind | None = None
    ) -> Decision:
        name = None if tier is None else tier.name
        return Decision(name, values, error, tuple(trace), priority, qos, kind)

    if tier is None:
        if isinstance(spec, SpecError):
            trace.append(SpecIgnored(str(spec)))
        return done()

    steps: list[Step] = []
    inputs = Inputs(pod, container, tier, policy.rules, spec, policy.spec_annotation)
    outcome = CALCULATORS[tier.calculator](inputs, steps)
    trace += steps
    if isinstance(outcome, SpecError):
        return done(error=str(outcome), kind=ErrorKind.SPEC)
    if outcome is None:
        return done()
    values = outcome
    # koordlet's CPUSetAllocator runs after the batch hook and unsets the quota of a pod
    # bound to a cpuset, whatever the tier computed (never-loosen included): the cpuset is
    # the pod's bound.
    cpuset = bound_cpuset(pod.annotations)
    if cpuset is not None and values.cpu_quota != -1:
        trace.append(CpusetBound(cpuset, values.cpu_quota))
        values = replace(values, cpu_quota=-1)

    if values.cpu_quota > INT64_MAX or (values.memory_limit or 0) > INT64_MAX:
        return done(error=f"computed {values} does not fit in int64", kind=ErrorKind.OVERFLOW)
    return done(values)
