"""Known's pods by uid: one sandbox a pod, whatever was added, forgotten or evicted."""

from __future__ import annotations

from nri_midbatch.policy import ContainerView
from nri_midbatch.state.known import Known
from tests.factory import pod_view


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
