"""What the plugin did, counted for the metrics (and for tests to assert on)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nri_midbatch.cgroups.values import VALUE_FIELDS
from nri_midbatch.policy import Decision


def _by_level_and_writer() -> dict[tuple[str, str], int]:
    return {
        (level, writer): 0 for level in ("pod", "container") for writer in ("kubelet", "unknown")
    }


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
    #: (reconcile.py), and those put back; writer: "kubelet" (its known value), "unknown"
    drift_found: dict[tuple[str, str], int] = field(default_factory=_by_level_and_writer)
    drift_repaired: dict[tuple[str, str], int] = field(default_factory=_by_level_and_writer)
    #: (level, result) -> values decided but not set in observe mode; result: whether
    #: they differ from what the container or pod has ("differs", "same", "unknown")
    observed: dict[tuple[str, str], int] = field(default_factory=dict)

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
