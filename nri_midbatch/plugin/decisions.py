"""Deciding a pod or a container, and the failure policy.

The policy reports bad input as a value; only here does it turn into "leave
the workload alone" or "make the runtime refuse it". Each decision is counted
and told to the listener; in observe mode what would be set is reported
instead (`observed`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from nri_midbatch.cgroups.values import cpu_shares_to_weight, set_fields
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable
from nri_midbatch.plugin.context import Live
from nri_midbatch.plugin.counters import RUNTIME_VALUES, Counters
from nri_midbatch.plugin.decision_log import DecisionLines
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import (
    CgroupValues,
    ContainerView,
    Decision,
    NativeLimits,
    PodClass,
    PodView,
    classify_pod,
    decide_container,
    decide_pod,
)
from nri_midbatch.policy.holdable import unholdable_kubelet
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.state.baseline import Target, target
from nri_midbatch.wire.status import Code

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class PodTarget:
    """What a pod decision that puts values in force needs for its cgroup to be written."""

    pod_id: str
    pod: PodView  # as decided: with kubelet's values
    tier: str | None
    #: What to write: the tier's values, and kubelet's for fields given back.
    values: CgroupValues
    #: What is the plugin's once written (None: everything given back).
    claimed: CgroupValues | None


class Decider:
    def __init__(
        self,
        live: Live,
        records: Records,
        counters: Counters,
        observers: Sequence[Observer],
        *,
        dry_run: bool,
    ) -> None:
        """observers: told of every decision. dry_run: read no cgroup (replay, audits)."""
        self._live = live
        self._records = records
        self._counters = counters
        self._observers = tuple(observers)
        self._dry_run = dry_run

    def container(
        self,
        pod: PodView,
        container: ContainerView,
        lines: DecisionLines,
        *,
        refuse: bool,
        applied: CgroupValues | None,
        current: CgroupValues | None,
        pod_class: PodClass | None = None,
    ) -> Target | None:
        """Decide, count, add the decision's line, and return the container's target
        (state/baseline.py): what to put in force given `applied`, what the plugin set
        there before, and what of it is the plugin's.

        None: not decided (bad input or a bug, logged and counted); the container keeps
        what it has. `refuse` makes bad input an error reply. In observe mode what the tier
        would set is reported (against `current`, what the container holds) and nothing
        claimed. `pod_class`: the pod's classification, made once for its containers
        (`classify`).

        Only an operation the runtime can refuse on its own (creating or
        updating one container, running one pod) may be refused: an error from
        Synchronize would cost every pod on the node its plugin.
        """
        in_force = self._live.in_force
        try:
            decision = decide_container(pod, container, in_force.policy, pod_class)
        except Exception as exc:
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            self._failed(exc, lines.method, where, refuse)
            return None
        self._counters.count_decision(decision)
        for observer in self._observers:
            observer.decided(pod, container, decision)
        if decision.error is not None:
            where = {"namespace": pod.namespace, "pod": pod.name, "container": container.name}
            self._invalid(decision, lines.method, where, refuse)
            return None
        enforce = in_force.config.enforces(pod=False)
        if decision.values is None:
            # Untouched workloads are the common case: visible at debug only
            # (SIGUSR1), with the trace that says why.
            lines.add(None, pod, container, decision.trace[-1])
        else:
            # A shared instance (policy/calculate.py).
            lines.add(decision.tier, pod, container, decision.values)
            if not enforce:
                self.observed(lines.method, pod, container, decision.values, current)
        return target(decision, applied, container.native, enforce=enforce)

    def classify(self, pod: PodView) -> PodClass | None:
        """The pod's part of its containers' decisions; None if it raised (a bug).

        Then each container is classified with its own decision, whose failure
        is reported with the container it came from.
        """
        try:
            return classify_pod(pod, self._live.in_force.policy)
        except Exception:
            return None

    def pod(self, pod_id: str, pod: PodView, method: str, *, refuse: bool) -> PodTarget | None:
        """The pod decision, counted, and what to write for it; None if nothing is to be.

        What to write is the pod's target (state/baseline.py): the tier's values and
        kubelet's for what the plugin gives back. In observe mode the tier's values are only
        reported.
        """
        in_force = self._live.in_force
        where = {"namespace": pod.namespace, "pod": pod.name}
        try:
            decision = decide_pod(pod, in_force.policy)
            # A pod in a tier needs kubelet's values: to bound the tier's, or to scale them.
            if decision.tier is not None and not self._live.known.baseline_known(pod_id):
                pod = self._records.establish_pod_baseline(pod_id, pod)
                decision = decide_pod(pod, in_force.policy)
        except Exception as exc:
            self._failed(exc, method, where, refuse)
            return None
        self._counters.count_decision(decision)
        for observer in self._observers:
            observer.decided(pod, None, decision)
        if decision.error is not None:
            self._invalid(decision, method, where, refuse)
            return None
        if in_force.observing and in_force.pod_level and decision.values is not None:
            self.observed(method, pod, None, decision.values, self._pod_now(pod, decision.values))
        enforce = in_force.config.enforces(pod=True)
        values, claimed = target(
            decision, self._live.known.applied.get(pod_id), pod.native, enforce=enforce
        )
        if values is None:
            return None
        return PodTarget(pod_id, pod, decision.tier, values, claimed)

    def holdable(self, native: NativeLimits, method: str, *, namespace: str, pod: str) -> bool:
        """Whether kubelet's values as the runtime tells them (a pod's resources plus its
        overhead, summed by the plugin) are ones a cgroup file takes and kubelet writes.

        If not (18446744073709551614, a sum past 64 bits, was written to a pod's quota), they
        are refused: logged with the pod, counted, and the caller keeps what it knew.
        """
        why = unholdable_kubelet(native)
        if why is None:
            return True
        self._counters.count_invalid(RUNTIME_VALUES)
        log.warning(
            "kubelet's values from the runtime refused: no cgroup file holds them",
            method=method,
            namespace=namespace,
            pod=pod,
            reason=why,
        )
        return False

    def observed(
        self,
        method: str,
        pod: PodView,
        container: ContainerView | None,
        values: CgroupValues,
        current: CgroupValues | None,
    ) -> None:
        """Log and count what `mode: observe` would set, and how it differs from `current`."""
        changes = None if current is None else _changes(values, current)
        result = "unknown" if changes is None else "differs" if changes else "same"
        level = "pod" if container is None else "container"
        key = (level, result)
        observed = self._counters.observed
        observed[key] = observed.get(key, 0) + 1
        where = {"namespace": pod.namespace, "pod": pod.name}
        if container is not None:
            where["container"] = container.name
        log.info(
            "would set",
            mode="observe",
            method=method,
            **where,
            **values_log(values),
            differs=result,
            changes=changes,
        )

    def _pod_now(self, pod: PodView, values: CgroupValues) -> CgroupValues | None:
        """What the pod cgroup holds now, for observe mode's comparison; None: unreadable."""
        in_force = self._live.in_force
        if self._dry_run:
            return None
        try:
            now = in_force.cgroups.read(pod)
        except CgroupUnreadable:
            return None
        shares = now.cpu_shares
        if shares is None and values.cpu_shares is not None and now.cpu_weight is not None:
            # v2 keeps a weight, which cannot be turned back into shares: compare weights.
            same = cpu_shares_to_weight(values.cpu_shares) == now.cpu_weight
            shares = values.cpu_shares if same else None
        return CgroupValues(shares, now.cpu_quota, now.memory_limit)

    def _failed(self, exc: Exception, method: str, where: Mapping[str, str], refuse: bool) -> None:
        """A decision that raised (a bug): the failure policy decides, as for bad input.

        Under Ignore the workload is left alone rather than its creation made to fail.
        """
        in_force = self._live.in_force
        self._counters.count_invalid("internal")
        log.error(
            "decision failed, refusing it" if refuse else "decision failed, left untouched",
            method=method,
            error=f"{type(exc).__name__}: {exc}",
            failure_policy=in_force.config.failure_policy,
            exc_info=exc,
            **where,
        )
        if refuse:
            raise RpcError(Code.INTERNAL, f"nri-midbatch: decision failed: {exc}")

    def _invalid(
        self, decision: Decision, method: str, where: Mapping[str, str], refuse: bool
    ) -> None:
        in_force = self._live.in_force
        self._counters.count_invalid(decision.error_kind or "invalid")
        log.warning(
            "invalid input, refusing it" if refuse else "invalid input, left untouched",
            method=method,
            reason=decision.error,
            failure_policy=in_force.config.failure_policy,
            **where,
        )
        if refuse:
            raise RpcError(Code.INVALID_ARGUMENT, f"nri-midbatch: {decision.error}")


def _changes(values: CgroupValues, current: CgroupValues) -> dict[str, list[int | None]]:
    """field -> [now, would be], for every field `values` sets that `current` holds otherwise."""
    return {
        name: [getattr(current, name), getattr(values, name)]
        for name in set_fields(values)
        if getattr(current, name) != getattr(values, name)
    }


def values_log(values: CgroupValues) -> dict[str, int | None]:
    """The values as log fields."""
    return {
        "cpu_shares": values.cpu_shares,
        "cpu_quota": values.cpu_quota,
        "memory_limit": values.memory_limit,
    }
