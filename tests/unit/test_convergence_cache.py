"""What the convergence pass keeps per workload to stay cheap (plugin/reconcile/check.py,
plugin/cgroup_writer.py `LocatedCgroups`): each cgroup's files located once, and its target.

What is kept must never make a pass read other files, or compare with another target, than a
pass without it would; and it is bounded by the workloads the plugin knows.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from nri_midbatch.cgroups.fs import OpenDirectories, read_values
from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.plugin.cgroup_writer import CgroupUnreadable, CgroupWriter, LocatedCgroups
from nri_midbatch.policy import PodView
from tests import factory
from tests.factory import model_pod
from tests.fake_cgroups import FakeTree
from tests.oracle.model import MI, Config, Kind, PodModel
from tests.oracle.targets import Values

from .history_harness import (
    CONTAINERD_2,
    HistoryNode,
    recreate_sandbox,
    start_node,
    validate_in_process,
)
from .nri_fixtures import run

FOREIGN = Values(2048, 300_000, 4096 * MI)


@pytest.fixture(autouse=True)
def _validated_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    validate_in_process(monkeypatch)


async def node_of(tmp_path: Path, *pods: PodModel) -> HistoryNode:
    node = await start_node(tmp_path, cgroup_version=2, flavour=CONTAINERD_2, config=Config())
    for pod in pods:
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
    await node.converge()  # every workload's files located, its target kept
    return node


def kept(node: HistoryNode) -> tuple[set[tuple[str, str | None]], set[tuple[str, str | None]]]:
    """The workloads whose located files, and whose targets, the pass keeps; and the known."""
    assert node.app is not None
    located, targets = node.app.plugin.reconcile.checker.kept()
    return located | targets, known_keys(node)


def known_keys(node: HistoryNode) -> set[tuple[str, str | None]]:
    assert node.app is not None
    known = node.app.plugin.live.known
    pods: set[tuple[str, str | None]] = {(pod_id, None) for pod_id in known.pods}
    return pods | {(pod_id, cid) for cid, (pod_id, _) in known.containers.items()}


def test_a_reload_to_another_root_reads_the_new_roots_files(tmp_path: Path) -> None:
    """The files located under the old root are not read once the root moves: a drift in the
    new root's pod and container is found and put back."""
    pod = model_pod(Kind.MID_LS, "moved")

    async def scenario() -> tuple[list[str], list[str]]:
        node = await node_of(tmp_path, pod)
        moved = tmp_path / "moved-root"
        shutil.copytree(node.tree.root, moved)
        node.tree = FakeTree(moved, version=2)
        await node.reload(node.config)  # the same configuration but for the root
        node.foreign_write(pod.cgroup_parent, FOREIGN, ("quota",))
        node.foreign_write(f"{pod.cgroup_parent}/{pod.id}-app", FOREIGN, ("memory",))
        drifting = node.mismatches()
        await node.converge()
        wrong = node.mismatches()
        await node.stop_plugin()
        return drifting, wrong

    drifting, wrong = run(scenario())
    assert any(w.startswith("pod moved:") for w in drifting)
    assert any(w.startswith("container moved-app:") for w in drifting)
    assert wrong == []


def test_what_a_pass_keeps_follows_the_known_workloads(tmp_path: Path) -> None:
    """A removed pod's and container's entries go; a new sandbox of the same uid is located
    afresh, and its drift is put back."""
    pods = [model_pod(Kind.MID_LS, f"p{i}") for i in range(3)]

    async def scenario() -> None:
        node = await node_of(tmp_path, *pods)
        entries, known = kept(node)
        assert entries == known
        assert len(known) == 6
        await node.remove_container(next(c for c, p in node.created.items() if p == "p0"))
        await node.remove_pod("p1")
        await recreate_sandbox(node, "p2", "p2-again", old_removed_first=True)
        assert await node.create("p2-again", "app") == []
        node.foreign_write(pods[2].cgroup_parent, FOREIGN, ("quota", "shares"))
        assert node.mismatches() != []
        await node.converge()
        assert node.mismatches() == []
        entries, known = kept(node)
        assert entries == known
        assert {pod_id for pod_id, _ in known} == {"p0", "p2-again"}
        await node.stop_plugin()

    run(scenario())


def test_entries_of_gone_workloads_are_pruned_between_passes(tmp_path: Path) -> None:
    """With passes off, re-checks alone keep it bounded: gone pods' entries are dropped once
    they outnumber the known workloads by the slack."""
    pods = [model_pod(Kind.MID_LS, f"q{i}") for i in range(40)]

    async def scenario() -> tuple[int, int]:
        node = await node_of(tmp_path, *pods)
        for pod in pods[1:]:
            await node.remove_pod(pod.id)
        assert node.app is not None
        reconcile = node.app.plugin.reconcile
        reconcile.check_pod("q0")  # a re-check, not a pass: it prunes only past the slack
        await node.settle()
        located, targets = reconcile.checker.kept()
        entries = len(located) + len(targets)
        await node.stop_plugin()
        return entries, len(pods)

    entries, created = run(scenario())
    assert created == 40
    assert entries == 2 * 2  # q0 and its container, in both


# -- LocatedCgroups against a fresh read ------------------------------------------------


def tree_with_two_pods(tmp_path: Path) -> tuple[FakeTree, CgroupWriter, PodView, PodView]:
    tree = FakeTree(tmp_path / "cgroup", version=2)
    first, second = "/kubepods/besteffort/poda", "/kubepods/besteffort/podb"
    tree.write(first, Values(2, 10_000, 64 * MI))
    tree.write(second, Values(1024, 70_000, 128 * MI))
    writer = CgroupWriter(tree.root, CgroupDriver.CGROUPFS)
    return tree, writer, pod_view("a", first), pod_view("b", second)


def pod_view(uid: str, cgroup_parent: str) -> PodView:
    return replace(factory.pod_view(uid=uid), cgroup_parent=cgroup_parent)


def read(located: LocatedCgroups, writer: CgroupWriter, pod: PodView) -> object:
    directories = OpenDirectories()
    try:
        return located.read(writer, (pod.uid, None), pod, None, "", directories)
    except CgroupUnreadable as exc:
        return type(exc)
    finally:
        directories.close()


def fresh(writer: CgroupWriter, pod: PodView) -> object:
    try:
        return read_values(writer.root, writer.location(pod, None))
    except (OSError, ValueError):
        return CgroupUnreadable


def test_a_directory_swapped_for_a_link_reads_as_a_fresh_read_does(tmp_path: Path) -> None:
    """A pod directory become a symlink to another pod's, inside the root: a fresh read
    follows it (realpath), and so does a read of the located files."""
    tree, writer, pod, other = tree_with_two_pods(tmp_path)
    located = LocatedCgroups()
    assert read(located, writer, pod) == fresh(writer, pod)
    directory = tree.directory("cpu", pod.cgroup_parent)
    shutil.rmtree(directory)
    os.symlink(tree.directory("cpu", other.cgroup_parent), directory)
    assert fresh(writer, pod) == read_values(writer.root, writer.location(other, None))
    assert read(located, writer, pod) == fresh(writer, pod)
    assert len(located) == 0  # met a symlink: not kept


def test_a_value_file_swapped_for_a_link_is_refused_as_a_fresh_read_refuses(
    tmp_path: Path,
) -> None:
    tree, writer, pod, other = tree_with_two_pods(tmp_path)
    located = LocatedCgroups()
    read(located, writer, pod)
    quota = tree.directory("cpu", pod.cgroup_parent) / "cpu.max"
    quota.unlink()
    os.symlink(tree.directory("cpu", other.cgroup_parent) / "cpu.max", quota)
    assert fresh(writer, pod) is CgroupUnreadable
    assert read(located, writer, pod) is CgroupUnreadable


def test_entries_belong_to_their_writer_and_location(tmp_path: Path) -> None:
    tree, writer, pod, other = tree_with_two_pods(tmp_path)
    located = LocatedCgroups()
    read(located, writer, pod)
    assert len(located) == 1
    # The same key at another location (a sandbox's parent changed) reads the other's files.
    moved = replace(pod, cgroup_parent=other.cgroup_parent)
    assert read(located, writer, moved) == fresh(writer, other)
    # Another writer (a reload) drops every entry.
    copy = tmp_path / "copy"
    shutil.copytree(tree.root, copy)
    FakeTree(copy, version=2).write(other.cgroup_parent, Values(4, 20_000, 32 * MI))
    elsewhere = CgroupWriter(copy, CgroupDriver.CGROUPFS)
    assert read(located, elsewhere, moved) == fresh(elsewhere, other)
    assert read(located, elsewhere, moved) != fresh(writer, other)
    located.keep(lambda key: False)
    assert len(located) == 0
