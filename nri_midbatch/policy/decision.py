"""The policy's public entry points: a pod (and container) in, a Decision out.

Errors are values: an unusable annotation gives a Decision with `error` set and no values, and
the plugin glue applies the failure policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .calculate import CgroupValues, container_values, pod_values
from .classes import PriorityClass, QoSClass
from .classify import Classified
from .compiled import Policy
from .quantity import INT64_MAX
from .spec import ExtendedSpec, SpecError, load_spec
from .trace import SpecIgnored, Step, Untouched, UntouchedReason
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

    if isinstance(spec, SpecError):
        if tier is None:
            trace.append(SpecIgnored(str(spec)))
            return done()
        return done(error=str(spec), kind=ErrorKind.SPEC)
    if tier is None:
        return done()
    if usable is None:
        trace.append(Untouched(UntouchedReason.NO_CONTAINERS, annotation=policy.spec_annotation))
        return done()

    steps: list[Step] = []
    if container is None:
        values = pod_values(usable.containers, tier, policy.rules, pod.native, steps)
    else:
        entry = usable.containers.get(container.name)
        if entry is None:
            trace.append(Untouched(UntouchedReason.NOT_LISTED, container=container.name))
            return done()
        values = container_values(entry, tier, policy.rules, container.native, steps)
    trace += steps

    if values.cpu_quota > INT64_MAX or values.memory_limit > INT64_MAX:
        return done(error=f"computed {values} does not fit in int64", kind=ErrorKind.OVERFLOW)
    return done(values)
