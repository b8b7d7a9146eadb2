"""What the plugin did, counted for the metrics (and for tests to assert on).

Counted where it happens (`ctx.counters`), and described here for the metrics: the names,
help texts and labels of the plugin's families (nri_midbatch/counts.py says how they are
read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from nri_midbatch.cgroups.values import VALUE_FIELDS
from nri_midbatch.counts import CounterFamily, family, single
from nri_midbatch.policy import Decision, ErrorKind

#: The invalid-input reason of values from the runtime that no cgroup file holds (`holdable`).
RUNTIME_VALUES = "runtime_values"
#: Invalid-input reasons and adjusting methods are exposed from the start, at 0.
INVALID_REASONS = (*(kind.value for kind in ErrorKind), "internal", RUNTIME_VALUES)
ADJUSTING_METHODS = ("CreateContainer", "UpdateContainer", "Synchronize")
LEVELS = ("pod", "container")


def _by_level_and_writer() -> dict[tuple[str, str], int]:
    return {(level, writer): 0 for level in LEVELS for writer in ("kubelet", "unknown")}


@dataclass
class Counters:
    """What happened, for metrics and for tests to assert on."""

    decisions: dict[str, int] = field(default_factory=dict)
    invalid: dict[str, int] = field(default_factory=dict)
    #: (method, field) -> container values set through NRI
    adjusted: dict[tuple[str, str], int] = field(default_factory=dict)
    pod_writes_ok: int = 0
    pod_writes_failed: int = 0
    #: pods written before their containers were seen lowered (lowering.py)
    pods_lowered_unconfirmed: int = 0
    #: containers whose files did not hold what the runtime reported (Synchronize)
    containers_repaired: int = 0
    container_repairs_failed: int = 0
    config_rejected: int = 0
    #: (level, writer) -> cgroups found holding other values than the plugin keeps in force
    #: (reconcile/check.py), and those put back; writer: "kubelet" (its known value), "unknown"
    drift_found: dict[tuple[str, str], int] = field(default_factory=_by_level_and_writer)
    drift_repaired: dict[tuple[str, str], int] = field(default_factory=_by_level_and_writer)
    #: (level, result) -> values decided but not set in observe mode; result: whether
    #: they differ from what the container or pod has ("differs", "same", "unknown")
    observed: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The configuration's tiers, set by the plugin with each: their decisions are shown from 0.
    tiers: tuple[str, ...] = ()

    def count_decision(self, decision: Decision) -> None:
        key = decision.tier or "none"
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def count_invalid(self, reason: str) -> None:
        self.invalid[reason] = self.invalid.get(reason, 0) + 1

    def count_adjusted(
        self, method: str, containers: int = 1, fields: tuple[str, ...] | None = None
    ) -> None:
        """`fields`: those the adjustments set; all three unless a calculator left some."""
        for name in VALUE_FIELDS if fields is None else fields:
            key = (method, name)
            self.adjusted[key] = self.adjusted.get(key, 0) + containers

    def counter_families(self) -> Iterator[CounterFamily]:
        yield family(
            "nri_midbatch_decisions",
            "Decisions made, by tier (none: the pod is in no tier)",
            ("tier",),
            {(tier,): n for tier, n in dict(self.decisions).items()},
            zeros=[(tier,) for tier in (*self.tiers, "none")],
        )
        yield family(
            "nri_midbatch_invalid_inputs",
            "Pods or containers left alone (or refused) because of bad input, by reason",
            ("reason",),
            {(reason,): n for reason, n in dict(self.invalid).items()},
            zeros=[(reason,) for reason in INVALID_REASONS],
        )
        yield family(
            "nri_midbatch_adjusted_fields",
            "Container cgroup fields set through NRI, by method and field",
            ("method", "field"),
            self.adjusted,
            zeros=[(method, name) for method in ADJUSTING_METHODS for name in VALUE_FIELDS],
        )
        observed = dict(self.observed)
        yield family(
            "nri_midbatch_observed",
            "Values decided but not set (mode: observe), by level and whether they differ "
            "from what the container or pod has (differs, same, unknown)",
            ("level", "result"),
            {
                (level, result): observed.get((level, result), 0)
                for level in LEVELS
                for result in ("differs", "same", "unknown")
            },
        )
        yield family(
            "nri_midbatch_pod_cgroup_writes",
            "Pod-level cgroup updates, by result",
            ("result",),
            {("ok",): self.pod_writes_ok, ("failed",): self.pod_writes_failed},
        )
        yield family(
            "nri_midbatch_container_repairs",
            "Containers whose cgroup files did not hold what the runtime reported at Synchronize,"
            " written by the plugin, by result",
            ("result",),
            {("ok",): self.containers_repaired, ("failed",): self.container_repairs_failed},
        )
        yield single(
            "nri_midbatch_pods_lowered_unconfirmed",
            "Pods a Synchronize lowered without seeing the runtime lower their containers first",
            self.pods_lowered_unconfirmed,
        )
        yield family(
            "nri_midbatch_drift_found",
            "Pod and container cgroups found holding other values than the plugin keeps in"
            " force, by level and writer (kubelet: its known value, as after a resize; unknown:"
            " anyone else)",
            ("level", "writer"),
            self.drift_found,
        )
        yield family(
            "nri_midbatch_drift_repaired",
            "Pod and container cgroups put back to the values in force, by level and writer",
            ("level", "writer"),
            self.drift_repaired,
        )
