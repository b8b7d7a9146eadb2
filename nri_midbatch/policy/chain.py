"""The one rule chain: walk the tiers in order through the priority, QoS and namespace filters."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

from .classes import PriorityClass, QoSClass
from .tiers import Tier
from .trace import Filter, NoTier, TierCheck

# Distinct (priority, qos, namespace) keys are few in practice; the cap only bounds memory.
_MEMO_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class TierMatch:
    tier: Tier | None
    #: A check for each tier walked, then `NoTier` when none matched.
    reasons: tuple[TierCheck | NoTier, ...]


class Chain:
    __slots__ = ("_lock", "_memo", "_namespaced", "tiers")

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = tuple(tiers)
        self._namespaced = any(tier.namespaces is not None for tier in self.tiers)
        self._memo: dict[tuple[PriorityClass | None, QoSClass | None, str], TierMatch] = {}
        # The webhook's workers share a policy. A hit is one dict lookup, atomic under the
        # GIL; a miss checks the cap, clears and stores under the lock, so the cap holds.
        self._lock = threading.Lock()

    def select(
        self, priority: PriorityClass | None, qos: QoSClass | None, namespace: str
    ) -> TierMatch:
        # The walk depends on the namespace only when some tier filters on it.
        key = (priority, qos, namespace if self._namespaced else "")
        match = self._memo.get(key)
        if match is None:
            match = _walk(self.tiers, priority, qos, namespace)
            with self._lock:
                if len(self._memo) >= _MEMO_LIMIT:
                    self._memo.clear()
                self._memo[key] = match
        return match


def _walk(
    tiers: Sequence[Tier], priority: PriorityClass | None, qos: QoSClass | None, namespace: str
) -> TierMatch:
    reasons: list[TierCheck | NoTier] = []
    for tier in tiers:
        check = check_tier(tier, priority, qos, namespace)
        reasons.append(check)
        if check.failed is None:
            return TierMatch(tier, tuple(reasons))
    reasons.append(NoTier())
    return TierMatch(None, tuple(reasons))


def check_tier(
    tier: Tier, priority: PriorityClass | None, qos: QoSClass | None, namespace: str
) -> TierCheck:
    """One tier through the priority, QoS and namespace filters, in that order."""
    if priority not in tier.priority_classes:
        return TierCheck(
            tier.name, Filter.PRIORITY, priority or "none", _shown(tier.priority_classes)
        )
    if qos not in tier.qos_classes:
        return TierCheck(tier.name, Filter.QOS, qos or "none", _shown(tier.qos_classes))
    if tier.namespaces is not None and namespace not in tier.namespaces:
        return TierCheck(tier.name, Filter.NAMESPACE, repr(namespace), _ordered(tier.namespaces))
    return TierCheck(tier.name)


def _shown(items: Sequence[str | None] | frozenset[str | None]) -> tuple[str, ...]:
    """The classes as the trace names them (None: "none"), sets sorted."""
    names = tuple(item or "none" for item in items)
    return names if isinstance(items, tuple) else tuple(sorted(names))


def _ordered(items: Sequence[str] | frozenset[str]) -> tuple[str, ...]:
    return items if isinstance(items, tuple) else tuple(sorted(items))
