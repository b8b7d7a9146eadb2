"""Issue 34, defects 3 and 4: a pod is its uid, not its sandbox, and forgetting keeps its baseline.

Each test drives the real App through the containerd-like fake runtime (history_harness.py)
and compares the pod's files with the oracle (tests/oracle).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nri_midbatch.cgroups.paths import CgroupDriver
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config as PluginConfig
from nri_midbatch.deferred import AfterReply
from nri_midbatch.plugin import records as records_module
from nri_midbatch.plugin.cgroup_writer import CgroupWriter
from nri_midbatch.plugin.context import InForce, Live
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import CgroupValues, NativeLimits
from nri_midbatch.state.known import Known
from nri_midbatch.state.store import BaselineStore, Kept, PodRecord
from tests.factory import pod_view as factory_pod_view
from tests.oracle.model import MI, Config, ContainerModel, Extended, Kind, Native, PodModel
from tests.oracle.targets import Values, kubelet_container, kubelet_pod

from .history_harness import (
    CONTAINERD_1_7,
    CONTAINERD_2,
    HistoryNode,
    RuntimeFlavour,
    bound_the_table,
    recreate_sandbox,
    remembered,
    remove_stale_sandbox,
    start_node,
    validate_in_process,
)
from .nri_fixtures import run


@pytest.fixture(autouse=True)
def _validated_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    validate_in_process(monkeypatch)


#: Kubelet gives the pod 1.5 CPUs and 2Gi; the mid tier 1 CPU of shares, a limit of 2 CPUs
#: (halved by ratio 2) and 1Gi.
MID = Extended(cpu_request=1000, cpu_limit=2000, memory_limit=1024 * MI)
NATIVE = Native(cpu_request=1500, cpu_limit=1500, memory_limit=2048 * MI)
RATIO_2 = Config(ratio="2")


def mid_ls(pod_id: str, *names: str) -> PodModel:
    containers = tuple(ContainerModel(name, MID, NATIVE) for name in names or ("app",))
    return PodModel(pod_id, Kind.MID_LS, containers)


def pod_values(node: HistoryNode, pod: PodModel) -> tuple[int, int]:
    held = node.tree.read(pod.cgroup_parent)
    return held.quota, held.memory


FLAVOURS = pytest.mark.parametrize(
    "flavour", [CONTAINERD_2, CONTAINERD_1_7], ids=["containerd-2", "containerd-1.7"]
)


@FLAVOURS
@pytest.mark.parametrize("old_removed_first", [False, True], ids=["removed-after", "removed-first"])
def test_a_sandbox_recreated_under_the_same_uid_keeps_kubelets_pod_values(
    tmp_path: Path, flavour: RuntimeFlavour, old_removed_first: bool
) -> None:
    """Defect 3: the pod cgroup holds the plugin's 100000 / 1Gi (kubelet's: 150000 / 2Gi).

    Today the second RunPodSandbox reads them as kubelet's (on containerd 2.x too, which
    tells 150000), and removing the old sandbox deletes the record: after a reload to no
    ratio the pod stays at 100000.
    """
    pod = mid_ls("p0")
    assert kubelet_pod(pod) == Values(1536, 150_000, 2048 * MI)

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=flavour, config=RATIO_2)
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        assert pod_values(node, pod) == (100_000, 1024 * MI)
        await recreate_sandbox(node, pod.id, "p0-again", old_removed_first=old_removed_first)
        assert await node.create("p0-again", "app") == []
        if not old_removed_first:
            await remove_stale_sandbox(node, pod.id)
        await node.reload(Config())
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert pod_values(node, pod) == (150_000, 1024 * MI)
    assert node.mismatches() == []


@FLAVOURS
def test_a_recreated_sandbox_gives_back_what_the_plugin_set_under_the_old_one(
    tmp_path: Path, flavour: RuntimeFlavour
) -> None:
    """Defect 3: the mid tier set the pod's shares to 1024; without the tier kubelet's 1536
    come back, not the tier's 1024 taken for kubelet's at the second RunPodSandbox."""
    pod = mid_ls("p0")

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=flavour, config=Config())
        await node.run_pod(pod)
        assert node.tree.read(pod.cgroup_parent).shares == 1024
        await recreate_sandbox(node, pod.id, "p0-again", old_removed_first=False)
        await node.reload(Config(mid_tier=False))
        await remove_stale_sandbox(node, pod.id)
        await node.restart_plugin()
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert node.tree.read(pod.cgroup_parent) == Values(1536, 150_000, 2048 * MI)
    assert node.mismatches() == []


def test_a_pod_forgotten_past_the_bound_keeps_its_record(tmp_path: Path) -> None:
    """Defect 4: with room for 2 pods, a Synchronize of 3 forgets the first and deleted its
    record; restarted without the ratio on containerd 1.7, the plugin read its own 100000
    from the pod's cgroup as kubelet's, where 150000 is right."""
    pods = [mid_ls(f"p{i}") for i in range(3)]

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=RATIO_2)
        node.max_pods = 2
        await node.restart_plugin()
        for pod in pods:
            await node.run_pod(pod)
            assert await node.create(pod.id, "app") == []
        await node.synchronize()
        assert remembered(node) == {"p1", "p2"}
        node.max_pods = None
        node.write_config(Config())
        node.config = Config()
        await node.restart_plugin()
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert [pod_values(node, pod) for pod in pods] == [(150_000, 1024 * MI)] * 3
    assert node.mismatches() == []


def test_a_pod_met_again_after_it_was_forgotten_is_restored_from_its_record(
    tmp_path: Path,
) -> None:
    """Defect 4: a forgotten pod's next container brings it back; a reload to no ratio must
    give it kubelet's 300000 (two containers of 1.5 CPUs), not the 200000 of ratio 2 that its
    cgroup holds, taken for kubelet's."""
    first = mid_ls("p0", "app", "side")
    others = [mid_ls(f"p{i}") for i in (1, 2)]

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=RATIO_2)
        node.max_pods = 2
        await node.restart_plugin()
        await node.run_pod(first)
        assert await node.create(first.id, "app") == []
        for pod in others:
            await node.run_pod(pod)
        assert "p0" not in remembered(node)
        assert await node.create(first.id, "side") == []
        assert remembered(node) == {"p0", "p2"}
        await node.reload(Config())
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert pod_values(node, first) == (300_000, 2048 * MI)
    # p1 is forgotten now; p0's first container was forgotten with p0, and stays as it was
    # until a Synchronize.
    assert node.mismatches(skip={"p0", "p1"}) == []


def test_a_pods_record_goes_with_its_last_sandbox_and_its_cgroup(tmp_path: Path) -> None:
    """Kubelet removed the pod cgroup: the record goes with the sandbox. A pod whose cgroup
    stays keeps it, as a new sandbox may run in it."""
    gone, staying = mid_ls("gone"), mid_ls("staying")

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=RATIO_2)
        for pod in (gone, staying):
            await node.run_pod(pod)
        assert records(node) == {gone.uid, staying.uid}
        for controller in ("cpu", "memory"):
            shutil.rmtree(node.tree.directory(controller, gone.cgroup_parent))
        for pod in (gone, staying):
            await node.remove_pod(pod.id)
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert records(node) == {staying.uid}


def test_records_of_pods_without_a_sandbox_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_PARKED pods removed with their cgroup left, the oldest record goes."""
    monkeypatch.setattr(records_module, "MAX_PARKED", 2)
    pods = [mid_ls(f"p{i}") for i in range(3)]

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=RATIO_2)
        for pod in pods:
            await node.run_pod(pod)
        for pod in pods:
            await node.remove_pod(pod.id)
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert records(node) == {"uid-p1", "uid-p2"}


def records(node: HistoryNode) -> set[str]:
    return {path.stem for path in node.state_dir.glob("*.json")}


def test_a_synchronize_listing_two_sandboxes_of_a_pod_keeps_the_live_one(tmp_path: Path) -> None:
    """The runtime lists the dead sandbox kubelet has not removed yet, here after the live
    one: the plugin remembers the one with running containers, so a reload reaches them."""
    pod = mid_ls("p0")

    async def scenario() -> tuple[HistoryNode, set[str]]:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=RATIO_2)
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        await recreate_sandbox(node, pod.id, "p0-again", old_removed_first=False)
        assert await node.create("p0-again", "app") == []
        sandboxes = node.containerd.pods
        sandboxes[pod.id] = sandboxes.pop(pod.id)  # the dead one listed last
        await node.restart_plugin()
        kept = remembered(node)
        await node.reload(Config())
        await node.stop_plugin()
        return node, kept

    node, kept = run(scenario())
    assert kept == {"p0-again"}
    assert node.tree.read(f"{pod.cgroup_parent}/p0-again-app").quota == 150_000
    assert pod_values(node, pod) == (150_000, 1024 * MI)
    assert node.mismatches() == []


BATCH_BE = PodModel(
    "b0", Kind.BATCH_BE, (ContainerModel("app", Extended(500, 1000, 512 * MI), Native()),)
)
MID_BE = PodModel("m0", Kind.MID_BE, (ContainerModel("app", MID, Native()),))


@pytest.mark.parametrize(
    ("pod", "met_at", "want"),
    [
        (BATCH_BE, "CreateContainer", (100_000, 512 * MI)),
        (MID_BE, "UpdateContainer", (200_000, 1024 * MI)),
    ],
    ids=["create", "update"],
)
def test_a_forgotten_pod_met_again_at_a_container_event_gets_its_pod_values(
    tmp_path: Path, pod: PodModel, met_at: str, want: tuple[int, int]
) -> None:
    """A pod the plugin forgot past its bound is met again at its next CreateContainer, or at
    an UpdateContainer of a container forgotten with it: its pod cgroup gets the values a
    RunPodSandbox would have given it (the model test found a batch and a mid pod left at
    kubelet's unlimited values after pod level was turned on)."""
    others = [mid_ls(f"p{i}") for i in (1, 2)]

    async def scenario() -> HistoryNode:
        node = await start_node(
            tmp_path, cgroup_version=1, flavour=CONTAINERD_1_7, config=Config(pod_level=False)
        )
        node.max_pods = 2
        await node.restart_plugin()
        await node.run_pod(pod)
        if met_at == "UpdateContainer":
            await node.create(pod.id, "app")
        for other in others:
            await node.run_pod(other)
        assert pod.id not in remembered(node)
        await node.reload(Config())
        if met_at == "CreateContainer":
            await node.create(pod.id, "app")
        else:
            await node.resize(pod.id, "app", Native())
        assert pod.id in remembered(node)
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert pod_values(node, pod) == want
    assert node.mismatches(skip={"p1"}) == []


#: The app container's resize while its pod is forgotten: 1.5 CPUs and 2Gi down to 1 CPU and
#: 512Mi, kubelet's pod write after the container's (a decrease).
SMALLER = Native(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)


@FLAVOURS
@pytest.mark.parametrize("resized_before", [False, True], ids=["annotated", "recorded"])
def test_a_container_resized_while_its_pod_is_forgotten_moves_the_pods_values(
    tmp_path: Path, flavour: RuntimeFlavour, resized_before: bool
) -> None:
    """Defect 4: the UpdateContainer of a container forgotten with its pod was not taken as a
    resize (the plugin did not know its values before), so the pod's baseline did not move,
    no re-check came, and kubelet's pod write after the container's stayed: 250000 and 2.5Gi
    where ratio 2 and the mid tier give 200000 and 2Gi. The container's values before come
    from its annotation, or from the pod's record if it was resized before."""
    first = mid_ls("p0", "app", "side")
    others = [mid_ls(f"p{i}") for i in (1, 2)]

    async def scenario() -> tuple[HistoryNode, list[str]]:
        node = await start_node(tmp_path, cgroup_version=1, flavour=flavour, config=RATIO_2)
        bound_the_table(node, 2)
        await node.run_pod(first)
        for name in ("app", "side"):
            assert await node.create(first.id, name) == []
        if resized_before:
            assert await node.resize(first.id, "app", NATIVE, "pod-after") == []
        for pod in others:
            await node.run_pod(pod)
        assert first.id not in remembered(node)
        wrong = await node.resize(first.id, "app", SMALLER, "pod-after")
        bound_the_table(node, 3)
        await node.synchronize()
        await node.restart_plugin()
        await node.stop_plugin()
        return node, wrong

    node, wrong = run(scenario())
    assert wrong == []
    assert node.tree.read(first.cgroup_parent) == Values(2048, 200_000, 2048 * MI)
    assert node.mismatches() == []


def test_a_forgotten_pod_met_again_at_update_pod_sandbox_gets_its_pod_values(
    tmp_path: Path,
) -> None:
    """Defect 4: UpdatePodSandbox of a pod forgotten past the bound was ignored. Here a reload
    into observe mode did not reach the forgotten pod, and its resize, reverted, left the
    mid tier's 1024 shares where kubelet's 1536 are right (the model found it)."""
    pod = mid_ls("p0")
    others = [mid_ls(f"p{i}") for i in (1, 2)]

    async def scenario() -> tuple[HistoryNode, list[str]]:
        node = await start_node(tmp_path, cgroup_version=1, flavour=CONTAINERD_2, config=Config())
        bound_the_table(node, 2)
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        assert node.tree.read(pod.cgroup_parent).shares == 1024
        for other in others:
            await node.run_pod(other)
        assert pod.id not in remembered(node)
        await node.reload(Config(observe=True))
        wrong = await node.reverted_resize(pod.id, "app", SMALLER)
        assert pod.id in remembered(node)
        await node.stop_plugin()
        return node, wrong

    node, wrong = run(scenario())
    assert wrong == []
    assert node.tree.read(pod.cgroup_parent) == kubelet_pod(pod)


@FLAVOURS
def test_a_pod_met_again_keeps_its_records_containers_not_shown_yet(
    tmp_path: Path, flavour: RuntimeFlavour
) -> None:
    """Defect 4: a pod met again at its next CreateContainer, after a reload out of the mid
    tier that it missed, had its record rewritten with only the containers the plugin knew,
    which dropped the resized app container's baseline: restarted, the plugin took the app's
    annotation (1.5 CPUs and 2Gi, before the resize) for kubelet's and gave those back, where
    kubelet's are 1 CPU and 512Mi."""
    first = mid_ls("p0", "app", "side")
    others = [mid_ls(f"p{i}") for i in (1, 2)]

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=1, flavour=flavour, config=Config())
        bound_the_table(node, 2)
        await node.run_pod(first)
        assert await node.create(first.id, "app") == []
        assert await node.resize(first.id, "app", SMALLER, "pod-after") == []
        for pod in others:
            await node.run_pod(pod)
        assert first.id not in remembered(node)
        await node.reload(Config(mid_tier=False))
        assert await node.create(first.id, "side") == []
        await node.remove_pod("p1")
        await node.restart_plugin()
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert node.tree.read(f"{first.cgroup_parent}/p0-app") == kubelet_container(SMALLER)
    assert node.mismatches() == []


@pytest.mark.parametrize("met_again", [False, True], ids=["written", "met-again-first"])
def test_a_pod_forgotten_before_its_record_is_written_keeps_what_the_plugin_set(
    tmp_path: Path, met_again: bool
) -> None:
    """Defect 4: a pod's record is written after the reply (an UpdateContainer's resize); a
    pod forgotten before that lost what the record was to keep. Its record is now taken as it
    was when the pod was forgotten: written after the reply, or restored from at once if the
    runtime shows the pod again first."""
    settings = settings_of(PluginConfig())
    writer = CgroupWriter(Path(settings.cgroups.root), CgroupDriver(settings.cgroups.driver))
    native = NativeLimits(cpu_quota=150_000, memory_limit=2048 * MI, cpu_shares=1536)
    applied = CgroupValues(cpu_shares=1024, cpu_quota=100_000, memory_limit=1024 * MI)

    async def scenario() -> tuple[PodRecord | None, CgroupValues | None]:
        live = Live(InForce(settings, settings.compile(), writer), Known(max_pods=1))
        after_reply = AfterReply()
        records = Records(live, BaselineStore(tmp_path), after_reply, dry_run=False)
        records.meet("s0", factory_pod_view(uid="u0", native=native), True)
        live.known.set_applied("s0", applied)  # its record is written after the reply
        records.meet("s1", factory_pod_view(uid="u1", native=native), True)
        assert "s0" not in live.known.pods
        if met_again:
            live.known.max_pods = 2
            records.meet("s0", factory_pod_view(uid="u0"), False)
        after_reply.flush()
        return BaselineStore(tmp_path).load("u0"), live.known.applied.get("s0")

    record, restored = run(scenario())
    if met_again:
        assert restored == applied
    else:
        assert record == PodRecord(Kept(native, applied))


def test_a_pod_met_again_at_a_resize_down_is_lowered_after_its_container(
    tmp_path: Path,
) -> None:
    """Defect 4: a mid pod forgotten after its container was resized up (pod quota 400000)
    is met again on containerd 2.x at the container's resize down, whose pod values the
    runtime already tells. Its pod write then (100000) is refused on cgroup v1 while the
    container still holds 400000, and nothing wrote it after the container was lowered:
    kubelet's 512 shares stayed where the mid tier gives 1024 (the model found it)."""
    pod = PodModel("p0", Kind.MID_LS, (ContainerModel("app", MID, SMALLER),))
    batch = PodModel("p1", Kind.BATCH_BE, (ContainerModel("app", Extended(500, 1000), Native()),))

    async def scenario() -> list[str]:
        node = await start_node(
            tmp_path, cgroup_version=1, flavour=CONTAINERD_2, config=Config(cfs_quota=False)
        )
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        bound_the_table(node, 1)
        assert await node.resize(pod.id, "app", Native(1000, 4000, 2048 * MI), "pod-after") == []
        await node.run_pod(batch)
        assert pod.id not in remembered(node)
        wrong = await node.resize(pod.id, "app", SMALLER, "pod-after")
        await node.stop_plugin()
        return wrong

    assert run(scenario()) == []
