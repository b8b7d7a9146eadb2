"""The values to put in force from kubelet's, and kubelet's after a resize."""

from __future__ import annotations

from dataclasses import replace

from nri_midbatch.policy import CgroupValues, Decision, NativeLimits
from nri_midbatch.state.baseline import (
    in_force,
    kubelets_after_resize,
    moved_by,
    resized_pod_baseline,
    target,
    told_pod_baseline,
)
from tests.factory import decide, pod_view

MI = 1 << 20

KUBELET = NativeLimits(cpu_quota=200_000, cpu_period=100_000, memory_limit=1 << 30, cpu_shares=1024)
ALL = CgroupValues(512, 100_000, 512 << 20)
QUOTA_ONLY = CgroupValues(None, 166_667, None)


def test_nothing_set_before_is_the_tier_s_values() -> None:
    assert in_force(ALL, None, KUBELET) is ALL
    assert in_force(None, None, KUBELET) is None


def test_fields_no_longer_claimed_go_back_to_kubelet_s() -> None:
    assert in_force(QUOTA_ONLY, ALL, KUBELET) == CgroupValues(1024, 166_667, 1 << 30)
    assert in_force(None, ALL, KUBELET) == CgroupValues(1024, 200_000, 1 << 30)
    assert in_force(None, QUOTA_ONLY, KUBELET) == CgroupValues(None, 200_000, None)
    assert in_force(ALL, QUOTA_ONLY, KUBELET) is ALL


def test_unlimited_and_unknown_baselines() -> None:
    besteffort = NativeLimits(cpu_shares=2)
    assert in_force(None, ALL, besteffort) == CgroupValues(2, -1, -1)
    # Shares kubelet gave are unknown (an annotation of an earlier version): left alone.
    assert in_force(None, ALL, NativeLimits()) == CgroupValues(None, -1, -1)


def test_what_a_container_holds_of_the_plugin_s() -> None:
    assert moved_by(CgroupValues(1024, 200_000, 1 << 30), KUBELET) is None
    assert moved_by(CgroupValues(1024, 166_667, 1 << 30), KUBELET) == QUOTA_ONLY
    assert moved_by(CgroupValues(512, 100_000, 512 << 20), KUBELET) == ALL


def test_a_resize_moves_the_pod_by_the_container_s_change() -> None:
    pod = NativeLimits(cpu_quota=310_000, memory_limit=3 << 30, cpu_shares=2048)
    before = NativeLimits(cpu_quota=100_000, memory_limit=1 << 30, cpu_shares=1024)
    after = NativeLimits(cpu_quota=200_000, memory_limit=2 << 30, cpu_shares=2048)
    moved = resized_pod_baseline(pod, before, after, [before])
    # The overhead (10000 of quota here) stays in.
    assert moved == NativeLimits(cpu_quota=410_000, memory_limit=4 << 30, cpu_shares=3072)


def test_a_resize_to_or_from_unlimited() -> None:
    limited = NativeLimits(cpu_quota=100_000, memory_limit=1 << 30)
    pod = NativeLimits(cpu_quota=200_000, memory_limit=2 << 30)
    assert resized_pod_baseline(pod, limited, NativeLimits(), [limited]) == NativeLimits()
    # Back to limits for every container: their sum (no overhead known).
    assert resized_pod_baseline(NativeLimits(), NativeLimits(), limited, [limited]) == pod
    # A sibling still unlimited: the pod stays so.
    assert resized_pod_baseline(NativeLimits(), NativeLimits(), limited, [NativeLimits()]) == (
        NativeLimits()
    )


def test_update_pod_sandbox_never_takes_the_plugins_values_back_as_kubelets() -> None:
    """Kubelet tells the resized resource at its new value and fills the rest from the pod
    cgroup (doPodResizeAction), which holds the plugin's values: those keep the old baseline."""
    known = NativeLimits(cpu_quota=100_000, memory_limit=1024 * MI, cpu_shares=1024)
    applied = CgroupValues(1536, 83_334, 512 * MI)
    told = NativeLimits(cpu_quota=50_000, memory_limit=512 * MI, cpu_shares=1536)
    assert told_pod_baseline(known, told, told, applied) == NativeLimits(
        cpu_quota=50_000, memory_limit=1024 * MI, cpu_shares=1024
    )
    # The overhead added to a value read from the file: still the plugin's.
    overhead = 64 * MI
    with_overhead = NativeLimits(cpu_quota=50_000, memory_limit=512 * MI + overhead)
    assert told_pod_baseline(known, with_overhead, told, applied).memory_limit == 1024 * MI
    # A value that is neither the plugin's nor the known one is kubelet's new one.
    bigger = NativeLimits(cpu_quota=50_000, memory_limit=2048 * MI, cpu_shares=2048)
    assert told_pod_baseline(known, bigger, bigger, applied) == bigger
    # Nothing applied: everything told is kubelet's; shares not told stay as known.
    assert told_pod_baseline(known, bigger, bigger, None) == bigger
    no_shares = NativeLimits(cpu_quota=50_000)
    assert told_pod_baseline(known, no_shares, no_shares, None).cpu_shares == 1024


def _decision(values: CgroupValues | None, error: str | None = None) -> Decision:
    return decide(pod_view())._replace(tier="batch", values=values, error=error)


def test_a_pods_limit_read_back_after_a_resize_is_kubelets_once_it_moved() -> None:
    """Memory 1Gi -> 2Gi: the read finds 1Gi, as at the resize, until kubelet writes."""
    old, new = NativeLimits(memory_limit=1 << 30), NativeLimits(memory_limit=2 << 30)
    guess = NativeLimits(memory_limit=(2 << 30) - 64 * MI)  # without the overhead
    unknown = NativeLimits()

    def after(read: NativeLimits, *, final: bool = False) -> NativeLimits | None:
        return kubelets_after_resize(read, guess, unknown, old, None, final=final)

    assert after(old) is None
    assert after(new) == new
    assert after(old, final=True) == old  # at the last re-check, what is there


def test_a_pods_read_back_never_takes_the_plugins_values_as_kubelets() -> None:
    """A pod kubelet leaves unlimited holds the plugin's values; the resize guessed it newly
    limited (a container not created yet has no limit)."""
    before = NativeLimits(cpu_shares=768)
    guess = NativeLimits(cpu_quota=100_000, memory_limit=512 * MI, cpu_shares=1024)
    mine = NativeLimits(cpu_quota=400_000, memory_limit=2048 * MI, cpu_shares=3072)

    def after(read: NativeLimits, *, final: bool = False) -> NativeLimits | None:
        return kubelets_after_resize(read, guess, before, mine, mine, final=final)

    assert after(mine) is None
    assert after(replace(mine, cpu_shares=1024)) is None
    # Kubelet wrote the shares only: the limits it left unlimited stay so.
    assert after(replace(mine, cpu_shares=1024), final=True) == NativeLimits(cpu_shares=1024)
    assert after(mine, final=True) == NativeLimits(cpu_shares=1024)  # the shares guessed


def test_a_target_enforced_claims_the_tier_s_values() -> None:
    # The fields the tier no longer claims go back to kubelet's.
    assert target(_decision(QUOTA_ONLY), ALL, KUBELET, enforce=True) == (
        CgroupValues(1024, 166_667, 1 << 30),
        QUOTA_ONLY,
    )


def test_a_target_not_enforced_claims_nothing_and_gives_back_what_was_set() -> None:
    # Observe mode, or a pod with pod level off: kubelet's values where the plugin set any.
    assert target(_decision(ALL), ALL, KUBELET, enforce=False) == (
        CgroupValues(1024, 200_000, 1 << 30),
        None,
    )
    assert target(_decision(ALL), None, KUBELET, enforce=False) == (None, None)


def test_a_target_of_bad_input_claims_nothing() -> None:
    assert target(_decision(None, "bad spec"), ALL, KUBELET, enforce=True) == (
        CgroupValues(1024, 200_000, 1 << 30),
        None,
    )
