"""Known: one sandbox a pod by uid, whatever was added, forgotten or evicted; kubelet's
baseline moved by the named events; what a pod's record holds, and pods and containers
restored from one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nri_midbatch.policy import CgroupValues, ContainerView, NativeLimits
from nri_midbatch.state.known import Known
from nri_midbatch.state.store import Kept, PodRecord
from tests.factory import pod_view

MI = 1 << 20
POD_KUBELET = NativeLimits(cpu_quota=300_000, cpu_period=100_000, memory_limit=768 * MI)
APP_KUBELET = NativeLimits(cpu_quota=200_000, cpu_period=100_000, memory_limit=512 * MI)
SIDE_KUBELET = NativeLimits(cpu_quota=100_000, cpu_period=100_000, memory_limit=256 * MI)
SET = CgroupValues(512, 100_000, 256 * MI)


def _burstable(uid: str = "u", native: NativeLimits = POD_KUBELET) -> Known:
    """A node with one burstable pod "s" of two containers, its baseline known for sure."""
    node = Known()
    view = replace(pod_view(uid=uid, native=native), cgroup_parent=f"/kubepods/burstable/pod{uid}")
    node.remember_pod("s", view, None, sure=True)
    node.set_container("app", "s", ContainerView("app", "app", APP_KUBELET))
    node.set_container("side", "s", ContainerView("side", "side", SIDE_KUBELET))
    return node


def test_the_sandbox_of_a_uid_follows_what_is_added_and_removed() -> None:
    node = Known()
    node.add_pod("old", pod_view(uid="u"))
    node.add_pod("new", pod_view(uid="u"))
    assert node.sandbox_of("u") == "new"
    node.remove_pod("old")  # the older sandbox of a pod still remembered under its new one
    assert node.sandbox_of("u") == "new"
    node.remove_pod("new")
    assert node.sandbox_of("u") is None


def test_keeping_one_sandbox_forgets_the_others_and_their_containers() -> None:
    node = Known()
    for sandbox in ("a", "b", "c"):
        node.add_pod(sandbox, pod_view(uid="u"))
        node.set_container(f"{sandbox}-app", sandbox, ContainerView(f"{sandbox}-app", "app"))
    node.keep_sandbox("u", "a", ["a", "b", "c"])
    assert list(node.pods) == ["a"] and node.sandbox_of("u") == "a"
    assert list(node.containers) == ["a-app"]


def test_a_pod_evicted_past_the_bound_is_no_uids_sandbox() -> None:
    node = Known(max_pods=2)
    for n in range(3):
        node.add_pod(f"s{n}", pod_view(uid=f"u{n}"))
    assert node.sandbox_of("u0") is None
    assert [node.sandbox_of(f"u{n}") for n in (1, 2)] == ["s1", "s2"]


def test_a_container_adjusted_at_creation_is_no_record_s_until_set_through_its_files() -> None:
    node = _burstable()
    node.adjusted_at_creation("app", SET)
    node.note_set("app", SET)  # an UpdateContainer: the runtime tells it after a restart
    assert node.applied["app"] == SET and not node.is_recorded("app")
    node.note_set("app", SET, by_files=True)  # a reload's write the runtime never learns
    assert node.is_recorded("app")
    record = node.record_of("s")
    assert record is not None and record.containers == {"app": Kept(APP_KUBELET, SET)}


def test_a_container_set_without_the_annotation_is_the_record_s() -> None:
    node = _burstable()
    node.note_set("side", SET)
    record = node.record_of("s")
    assert record is not None and record.containers == {"side": Kept(SIDE_KUBELET, SET)}


def test_a_resize_moves_the_container_s_and_its_pod_s_baseline() -> None:
    node = _burstable()
    before = node.containers["app"][1]
    grown = NativeLimits(cpu_quota=250_000, cpu_period=100_000, memory_limit=640 * MI)
    moved = node.container_updated(
        "s", ContainerView("app", "app", grown), "", before, node.pods["s"]
    )
    assert moved is not None and node.pods["s"] is moved
    assert moved.native == replace(POD_KUBELET, cpu_quota=350_000, memory_limit=896 * MI)
    assert node.baseline_known("s") and node.is_recorded("app")


def test_a_resize_that_limits_an_unlimited_pod_leaves_its_baseline_a_guess() -> None:
    node = _burstable(native=NativeLimits(cpu_period=100_000))
    before = node.containers["app"][1]
    moved = node.container_updated(
        "s",
        ContainerView("app", "app", APP_KUBELET),
        "",
        replace(before, native=NativeLimits()),
        node.pods["s"],
    )
    assert moved is not None and moved.native.cpu_quota == 300_000
    # Kubelet's limit also counts what the runtime does not tell: read back before trusted.
    assert not node.baseline_known("s")
    node.set_applied("s", SET)
    record = node.record_of("s")
    assert record is not None and record.pod is None


def test_an_update_that_resizes_nothing_moves_no_baseline() -> None:
    node = _burstable()
    before = node.containers["app"][1]
    assert node.container_updated("s", before, "", before, node.pods["s"]) is None
    assert not node.is_recorded("app") and node.pods["s"].native == POD_KUBELET


def test_a_besteffort_pod_s_baseline_does_not_follow_a_resize() -> None:
    node = Known()
    node.remember_pod("s", pod_view(uid="u"), None, sure=True)  # besteffort cgroup parent
    node.set_container("app", "s", ContainerView("app", "app"))
    moved = node.container_updated(
        "s", ContainerView("app", "app", APP_KUBELET), "", node.containers["app"][1], node.pods["s"]
    )
    assert moved is None and node.is_recorded("app")


def test_a_baseline_learnt_is_sure_and_one_guessed_is_not() -> None:
    node = _burstable()
    guessed = replace(node.pods["s"], native=APP_KUBELET)
    node.guess_pod_baseline("s", guessed)
    assert node.pods["s"] is guessed and not node.baseline_known("s")
    learnt = replace(guessed, native=POD_KUBELET)
    node.learn_pod_baseline("s", learnt)
    assert node.pods["s"] is learnt and node.baseline_known("s")


def test_the_record_changes_only_when_what_it_must_hold_does() -> None:
    node = _burstable()
    assert node.record_change("s", None) is None  # nothing to keep, nothing kept
    assert node.record_change("s") == ("u", None)  # not known what it held: removed
    node.set_applied("s", SET)
    record = PodRecord(Kept(POD_KUBELET, SET))
    assert node.record_change("s", None) == ("u", record)
    assert node.record_change("s", record) is None
    assert node.record_change("gone") is None


def test_a_pod_met_again_under_a_new_sandbox_takes_over_the_older_s() -> None:
    node = _burstable()
    node.set_applied("s", SET)
    # The older sandbox is more recent than any record: the record is passed over.
    kept = node.meet_pod("s2", pod_view(uid="u"), PodRecord(Kept(APP_KUBELET, None)), told=False)
    assert kept.native == POD_KUBELET and node.applied["s2"] == SET
    assert node.baseline_known("s2") and "s" not in node.pods and node.containers == {}


@pytest.mark.parametrize("told", [False, True])
def test_a_pod_met_unknown_is_restored_from_its_record(told: bool) -> None:
    node = Known()
    told_native = NativeLimits(cpu_shares=2)
    view = pod_view(uid="u", native=told_native if told else None)
    kept = node.meet_pod("s", view, PodRecord(Kept(POD_KUBELET, SET)), told=told)
    # What the runtime or the QoS class tells wins; what the plugin set carries over.
    assert kept.native == (told_native if told else POD_KUBELET)
    assert node.applied["s"] == SET and node.baseline_known("s")


def test_a_pod_met_with_kept_first_takes_its_records_baseline_over_the_told_one() -> None:
    """An UpdatePodSandbox's pod carries the resize it asks for, which may yet fail."""
    node = Known()
    view = pod_view(uid="u", native=NativeLimits(cpu_shares=2))
    kept = node.meet_pod("s", view, PodRecord(Kept(POD_KUBELET, SET)), told=True, kept_first=True)
    assert kept.native == POD_KUBELET


def test_a_pod_met_with_no_record_is_a_guess_unless_told() -> None:
    node = Known()
    node.meet_pod("s", pod_view(uid="u"), None, told=False)
    assert not node.baseline_known("s") and "s" not in node.applied


def test_kept_for_is_what_this_process_knows_for_sure() -> None:
    node = _burstable()
    node.set_applied("s", SET)
    assert node.kept_for("s", "u") == Kept(POD_KUBELET, SET)
    assert node.kept_for("s2", "u") == Kept(POD_KUBELET, SET)  # another sandbox of the uid
    node.guess_pod_baseline("s", node.pods["s"])
    assert node.kept_for("s", "u") is None
    assert node.kept_for("s3", "other") is None


def test_a_listed_container_is_restored_in_order_process_record_annotation_holding() -> None:
    previous = _burstable()
    previous.note_set("app", SET)
    record = PodRecord(None, {"rec": Kept(SIDE_KUBELET, SET)})
    shown = NativeLimits(cpu_quota=100_000, cpu_period=100_000)
    held = CgroupValues(None, 50_000, None)  # the plugin's quota, kept by the runtime
    node = Known()
    node.remember_pod("s", previous.pods["s"], None, sure=True)

    def take(
        container_id: str, native_known: bool, kept: bool = True
    ) -> tuple[ContainerView, CgroupValues | None, bool]:
        view = ContainerView(container_id, container_id, shown, native_known)
        return node.take_container(previous, record, "s", view, "/p/", True, held, kept)

    # What this process knew.
    assert take("app", False) == (previous.containers["app"][1], SET, True)
    # The pod's record.
    assert take("rec", False) == (ContainerView("rec", "rec", SIDE_KUBELET), SET, True)
    assert node.is_recorded("rec") and node.cgroups_path("rec") == "/p/rec"
    # The annotation: what differs from kubelet's is the plugin's.
    annotated = ContainerView("ann", "ann", shown, True)
    assert take("ann", True) == (annotated, held, False) and not node.is_recorded("ann")
    # What it holds: kubelet's for sure only where records are kept.
    assert take("new", False) == (ContainerView("new", "new", shown, True), None, False)
    assert take("old", False, kept=False) == (
        ContainerView("old", "old", shown, False),
        None,
        False,
    )
