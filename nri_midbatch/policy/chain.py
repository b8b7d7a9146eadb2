"""The one rule chain: walk the tiers in order through the priority, QoS and namespace filters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .classes import PriorityClass, QoSClass
from .tiers import Tier

# Distinct (priority, qos, namespace) keys are few in practice; the cap only bounds memory.
_MEMO_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class TierMatch:
    tier: Tier | None
    reasons: tuple[str, ...]


class Chain:
    __slots__ = ("_memo", "_namespaced", "tiers")

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = tuple(tiers)
        self._namespaced = any(tier.namespaces is not None for tier in self.tiers)
        self._memo: dict[tuple[PriorityClass | None, QoSClass | None, str], TierMatch] = {}

    def select(
        self, priority: PriorityClass | None, qos: QoSClass | None, namespace: str
    ) -> TierMatch:
        # The walk depends on the namespace only when some tier filters on it.
        key = (priority, qos, namespace if self._namespaced else "")
        match = self._memo.get(key)
        if match is None:
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
            match = self._memo[key] = _walk(self.tiers, priority, qos, namespace)
        return match


def _walk(
    tiers: Sequence[Tier], priority: PriorityClass | None, qos: QoSClass | None, namespace: str
) -> TierMatch:
    reasons: list[str] = []
    for tier in tiers:
        if priority not in tier.priority_classes:
            reasons.append(
                f"tier {tier.name}: priority {priority or 'none'} not in "
                f"{_names(tier.priority_classes)}"
            )
        elif qos not in tier.qos_classes:
            reasons.append(
                f"tier {tier.name}: qos {qos or 'none'} not in {_names(tier.qos_classes)}"
            )
        elif tier.namespaces is not None and namespace not in tier.namespaces:
            reasons.append(
                f"tier {tier.name}: namespace {namespace!r} not in {_names(tier.namespaces)}"
            )
        else:
            reasons.append(f"tier {tier.name}: matched")
            return TierMatch(tier, tuple(reasons))
    reasons.append("no tier matched: pod left alone")
    return TierMatch(None, tuple(reasons))


def _names(items: Sequence[str] | frozenset[str]) -> str:
    ordered = items if isinstance(items, tuple) else sorted(items)
    return "[" + ", ".join(ordered) + "]"
