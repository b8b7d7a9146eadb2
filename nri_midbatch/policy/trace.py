"""A decision's trace as data: which filter, which tier, which rule, which value.

The policy records steps; text is made only where a person reads it (`str()` of a step, or
`render()` of a whole trace): the recorder, the debug log line of an untouched container,
`explain`. Readers that need to know what kind of step they hold (`explain` showing the
classification and the tier walk apart from the values) test its type, never its text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from fractions import Fraction

__all__ = [
    "CpusetBound",
    "Field",
    "Filter",
    "NeverLoosen",
    "NoTier",
    "Normalized",
    "PodSum",
    "QuotaDisabled",
    "SpecIgnored",
    "Step",
    "TierCheck",
    "Untouched",
    "UntouchedReason",
    "ValueFrom",
    "render",
]


class Filter(StrEnum):
    """The filter of the rule chain that turned a tier down."""

    PRIORITY = "priority"
    QOS = "qos"
    NAMESPACE = "namespace"


class Field(StrEnum):
    """A cgroup value, as the trace names it."""

    CPU_SHARES = "cpu.shares"
    CPU_QUOTA = "cpu quota"
    MEMORY_LIMIT = "memory limit"


@dataclass(frozen=True, slots=True)
class TierCheck:
    """One tier of the chain: matched (`failed` None), or the filter that turned it down."""

    tier: str
    failed: Filter | None = None
    got: str = ""  # the pod's class or namespace that the filter did not allow
    allowed: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.failed is None:
            return f"tier {self.tier}: matched"
        return f"tier {self.tier}: {self.failed} {self.got} not in [{', '.join(self.allowed)}]"


@dataclass(frozen=True, slots=True)
class NoTier:
    """The chain ran out of tiers."""

    def __str__(self) -> str:
        return "no tier matched: pod left alone"


@dataclass(frozen=True, slots=True)
class ValueFrom:
    """A container's value from one resource of its extended-resource spec entry.

    `amount` is the resource's positive quantity, 0 when it has none (the value is then
    the formula's default).
    """

    field: Field
    value: int
    kind: str  # "request" or "limit"
    resource: str
    amount: int

    def __str__(self) -> str:
        if self.amount > 0:
            source = f"{self.kind} {self.resource}={self.amount}"
        else:
            source = f"no positive {self.kind} {self.resource}"
        return f"{self.field} {self.value} from {source}"


@dataclass(frozen=True, slots=True)
class PodSum:
    """A pod's value from the sum over the containers listed in the spec.

    `unlimited_by` names the listed container whose missing limit makes the pod unlimited.
    """

    field: Field
    value: int
    resource: str
    total: int
    containers: int
    unlimited_by: str | None = None

    def __str__(self) -> str:
        if self.field is Field.CPU_SHARES:
            source = (
                f"{self.resource} requests summing to {self.total} "
                f"over {self.containers} listed container(s)"
            )
        elif self.unlimited_by is not None:
            source = (
                f"container {self.unlimited_by!r} having no limit {self.resource} (pod unlimited)"
            )
        else:
            source = (
                f"limits {self.resource} summing to {self.total} over {self.containers} "
                "container(s)"
            )
        return f"pod {self.field} {self.value} from {source}"


@dataclass(frozen=True, slots=True)
class QuotaDisabled:
    """rules.cfsQuota is off: the quota is unlimited."""

    def __str__(self) -> str:
        return "cpu quota -1: rules.cfsQuota is false"


@dataclass(frozen=True, slots=True)
class Normalized:
    """The quota divided by the CPU normalization ratio, rounded up."""

    value: int
    quota: int
    ratio: Fraction

    def __str__(self) -> str:
        ratio = format(Decimal(self.ratio.numerator) / Decimal(self.ratio.denominator), "f")
        return f"cpu quota {self.value} = ceil({self.quota} / cpuNormalizationRatio {ratio})"


@dataclass(frozen=True, slots=True)
class CpusetBound:
    """The quota unset, as koordlet's CPUSetAllocator unsets it for a pod bound to a cpuset."""

    cpuset: str
    computed: int

    def __str__(self) -> str:
        return (
            f"cpu quota -1 (not {self.computed}): pod bound to cpuset {self.cpuset} by "
            "scheduling.koordinator.sh/resource-status, whose quota koordlet unsets"
        )


@dataclass(frozen=True, slots=True)
class NeverLoosen:
    """The native limit kept, as it is tighter than the computed one (-1: unlimited)."""

    field: Field
    native: int
    computed: int
    period: int | None = None  # the native CFS period, for a quota

    def __str__(self) -> str:
        computed = "unlimited" if self.computed <= 0 else str(self.computed)
        native = self.native if self.period is None else f"{self.native}/{self.period}us"
        return (
            f"{self.field} {self.native}: native {native} is tighter than computed {computed}; "
            "never loosen"
        )


class UntouchedReason(StrEnum):
    NO_CONTAINERS = "no containers in the spec"
    NOT_LISTED = "container not listed"
    # cpu-normalization
    CPUSET_BOUND = "pod bound to a cpuset"
    NATIVE_UNKNOWN = "kubelet's quota unknown"
    NO_QUOTA = "no quota to scale"
    NO_RATIO = "ratio not above 1"


@dataclass(frozen=True, slots=True)
class Untouched:
    """A tier applies, but its calculator gives this pod or container nothing to set."""

    reason: UntouchedReason
    annotation: str = ""
    container: str = ""
    detail: str = ""  # the cpuset, for CPUSET_BOUND

    def __str__(self) -> str:
        reason = self.reason
        if reason is UntouchedReason.NO_CONTAINERS:
            return f"no containers in annotation {self.annotation}: left untouched"
        if reason is UntouchedReason.NOT_LISTED:
            return (
                f"container {self.container!r} not listed in the extended-resource spec: "
                "left untouched"
            )
        if reason is UntouchedReason.CPUSET_BOUND:
            return f"bound to cpuset {self.detail}: quota not normalized, left untouched"
        if reason is UntouchedReason.NATIVE_UNKNOWN:
            return (
                f"container {self.container!r} has no {'nri-midbatch.io/native-limits'} "
                "annotation, so its current quota may already be scaled: left untouched"
            )
        if reason is UntouchedReason.NO_QUOTA:
            return "no cpu quota set by kubelet to normalize: left untouched"
        return "rules.cpuNormalizationRatio is not above 1: left untouched"


@dataclass(frozen=True, slots=True)
class SpecIgnored:
    """An unusable spec annotation that does not matter, as no tier applies."""

    error: str

    def __str__(self) -> str:
        return f"ignored, as no tier applies: {self.error}"


#: A step of a decision's trace. The classification steps are `Classified` (classify.py):
#: they carry their own `detail` line, built once per class at policy compile time.
Step = (
    TierCheck
    | NoTier
    | ValueFrom
    | PodSum
    | QuotaDisabled
    | Normalized
    | NeverLoosen
    | CpusetBound
    | Untouched
    | SpecIgnored
)


def render(steps: Iterable[object]) -> tuple[str, ...]:
    """The trace as the lines a person reads."""
    return tuple(str(step) for step in steps)
