"""Issue 23, one defect at a time: values in force must not depend on the way there.

Each test drives the real App through a containerd-like fake runtime and compares every
pod and container file with the oracle (tests/oracle): what a fresh plugin would set from
kubelet's values under the configuration in force, never looser than kubelet's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

import pytest

from nri_midbatch.config.settings import Settings
from nri_midbatch.process import app as app_module
from tests.factory import model_pod
from tests.oracle.model import MI, Config, Extended, Kind, Native, PodModel
from tests.oracle.targets import Values, container_target, kubelet_pod, pod_target

from .history_harness import (
    CONTAINERD_1_7,
    CONTAINERD_2,
    HistoryNode,
    RuntimeFlavour,
    in_process_settings,
    start_node,
    validate_in_process,
)
from .nri_fixtures import run


@pytest.fixture(autouse=True)
def _validated_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    validate_in_process(monkeypatch)


async def node_with(
    tmp_path: Path, flavour: RuntimeFlavour, config: Config, *pods: PodModel
) -> HistoryNode:
    node = await start_node(tmp_path, cgroup_version=1, flavour=flavour, config=config)
    for pod in pods:
        await node.run_pod(pod)
        for container in pod.containers:
            assert await node.create(pod.id, container.name) == []
    assert node.mismatches() == []
    return node


def quota(node: HistoryNode, pod: PodModel, container: str | None = None) -> int:
    relpath = (
        pod.cgroup_parent if container is None else f"{pod.cgroup_parent}/{pod.id}-{container}"
    )
    return node.tree.read(relpath).quota


NORMALIZING = Config(ratio="1.2", normalization_tier=True)


@pytest.mark.parametrize(
    "after",
    [
        Config(ratio="1.0", normalization_tier=True),
        Config(ratio=None, normalization_tier=True),
        Config(ratio="1.2", normalization_tier=False),
    ],
    ids=["ratio-1.0", "no-ratio", "tier-removed"],
)
def test_scaled_quotas_go_back_to_kubelets_when_normalization_ends(
    tmp_path: Path, after: Config
) -> None:
    """Defect 1: today they stay at ceil(100000 / 1.2) = 83334."""
    pod = model_pod(Kind.NORMALIZED_LS)

    async def scenario() -> HistoryNode:
        node = await node_with(tmp_path, CONTAINERD_2, NORMALIZING, pod)
        assert (quota(node, pod), quota(node, pod, "app")) == (83334, 83334)
        await node.reload(after)
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert (quota(node, pod), quota(node, pod, "app")) == (100_000, 100_000)
    assert node.mismatches() == []


def test_cfs_quota_off_keeps_a_burstable_mid_pod_within_kubelets_pod_limits(
    tmp_path: Path,
) -> None:
    """Defect 2 (containerd 1.7, no pod resources): today the pod gets -1 and 1Gi."""
    pod = model_pod(
        Kind.MID_LS,
        tier=Extended(cpu_request=500, cpu_limit=1000, memory_limit=1024 * MI),
        native=Native(cpu_request=500, cpu_limit=500, memory_limit=512 * MI),
    )
    assert kubelet_pod(pod) == Values(512, 50_000, 512 * MI)

    async def scenario() -> HistoryNode:
        node = await node_with(tmp_path, CONTAINERD_1_7, Config(), pod)
        await node.reload(Config(cfs_quota=False))
        await node.stop_plugin()
        return node

    node = run(scenario())
    held = node.tree.read(pod.cgroup_parent)
    assert 0 < held.quota <= 50_000
    assert 0 < held.memory <= 512 * MI
    assert node.mismatches() == []


def test_a_restart_under_a_looser_configuration_undoes_the_pod_ratchet(tmp_path: Path) -> None:
    """Defect 3: the pod went down to 100000 under ratio 2 where kubelet allowed 150000.

    containerd 1.7 sends no pod resources, so today the restarted plugin takes the pod
    cgroup's 100000 for kubelet's limit and keeps it.
    """
    pod = model_pod(
        Kind.MID_LS,
        tier=Extended(cpu_request=1000, cpu_limit=2000, memory_limit=1024 * MI),
        native=Native(cpu_request=1000, cpu_limit=1500, memory_limit=1024 * MI),
    )

    async def scenario() -> HistoryNode:
        node = await node_with(tmp_path, CONTAINERD_1_7, Config(ratio="2"), pod)
        assert quota(node, pod) == 100_000
        await node.stop_plugin()
        node.write_config(Config())
        node.config = Config()
        await node.start_plugin()
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert quota(node, pod, "app") == 150_000
    assert quota(node, pod) == 150_000
    assert node.mismatches() == []


def test_a_burst_of_reloads_ends_on_the_last_files_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 4: 60 reloads while the file flips between A (ratio 2) and B (no ratio).

    Each file is written once the previous reload has read its own, and validating B takes
    longer the later it is asked (5 ms more each time; the App's child takes 0.3 s, give
    or take), so loads finish out of order, as they may on a node: the last file must win.
    """
    a, b = Config(ratio="2", normalization_tier=True), Config(normalization_tier=True)
    pods = (model_pod(Kind.BATCH_BE), model_pod(Kind.NORMALIZED_LS))
    loads = itertools.count()

    async def scenario() -> HistoryNode:
        loop = asyncio.get_running_loop()
        reads: asyncio.Queue[Settings] = asyncio.Queue()

        def validate_b_slowly(path: str | Path) -> Settings:
            settings = in_process_settings(path)
            loop.call_soon_threadsafe(reads.put_nowait, settings)
            if settings.rules.cpu_normalization_ratio is None:
                time.sleep(0.005 * next(loads))  # a slower validation, in its thread
            return settings

        monkeypatch.setattr(app_module, "load_settings_file", validate_b_slowly)
        node = await node_with(tmp_path, CONTAINERD_2, b, *pods)
        assert node.app is not None
        reloads = []
        for i in range(61):
            node.write_config(a if i % 2 == 0 else b)  # 0, 2, ... 60: A
            reloads.append(asyncio.create_task(node.app.reload("SIGHUP")))
            # Until this reload has read the file (or, if it reads none, has ended).
            read = asyncio.create_task(reads.get())
            await asyncio.wait((read, reloads[-1]), return_when=asyncio.FIRST_COMPLETED)
            read.cancel()
        node.config = a
        await asyncio.gather(*reloads)
        await node.settle()
        await node.stop_plugin()
        return node

    node = run(scenario())
    batch, normalized = pods
    assert quota(node, batch, "app") == quota(node, batch) == 50_000
    assert quota(node, normalized, "app") == quota(node, normalized) == 50_000
    assert node.mismatches() == []


def test_a_resize_of_a_normalized_container_recomputes_its_pod(tmp_path: Path) -> None:
    """Defect 5: kubelet raises the limit from 1 to 2 CPUs; under ratio 2 the pod is 100000.

    Today the plugin answers the container's UpdateContainer and leaves the pod as
    kubelet's resize wrote it (200000).
    """
    pod = model_pod(Kind.NORMALIZED_LS)
    config = Config(ratio="2", normalization_tier=True)

    async def scenario() -> HistoryNode:
        node = await node_with(tmp_path, CONTAINERD_2, config, pod)
        assert quota(node, pod) == 50_000
        raised = Native(cpu_request=500, cpu_limit=2000, memory_limit=512 * MI)
        assert await node.resize(pod.id, "app", raised) == []
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert quota(node, pod, "app") == 100_000
    assert quota(node, pod) == 100_000
    assert node.mismatches() == []


def test_the_pod_level_normalized_quota_includes_the_pod_overhead(tmp_path: Path) -> None:
    """Defect 6: kubelet's pod quota is 100000 + 25000 of overhead; ratio 1.2 gives 104167.

    Today the plugin scales pod_resources alone (ceil(100000 / 1.2) = 83334).
    """
    pod = model_pod(
        Kind.NORMALIZED_LS, overhead=Native(cpu_request=250, cpu_limit=250, memory_limit=64 * MI)
    )
    assert kubelet_pod(pod).quota == 125_000
    assert pod_target(pod, NORMALIZING, pod_resources=True).quota == 104_167
    assert container_target(pod, pod.containers[0], NORMALIZING).quota == 83_334

    async def scenario() -> HistoryNode:
        node = await node_with(tmp_path, CONTAINERD_2, NORMALIZING, pod)
        await node.stop_plugin()
        return node

    node = run(scenario())
    assert quota(node, pod) == 104_167
    assert node.mismatches() == []


def test_a_container_a_reload_wrote_through_its_files_is_updated_at_the_next_synchronize(
    tmp_path: Path,
) -> None:
    """Found by the history model (session 9): the runtime still reports the mid tier's 1024
    shares it was created with, but a reload without the tier gave kubelet's 512 back
    through the files (containerd 1.7). Restarted with the tier, the plugin took the
    runtime's word for the files; cgroup v2's weight is not compared by the repair, so the
    container kept weight 20 where the tier gives 39."""
    pod = model_pod(
        Kind.MID_LS,
        tier=Extended(cpu_request=1000, cpu_limit=2000, memory_limit=1024 * MI),
        native=Native(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI),
    )
    with_mid, without = Config(mid_tier=True), Config(mid_tier=False)

    async def scenario() -> HistoryNode:
        node = await start_node(tmp_path, cgroup_version=2, flavour=CONTAINERD_1_7, config=with_mid)
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        await node.reload(without)
        assert node.mismatches() == []
        await node.stop_plugin()
        node.write_config(with_mid)
        node.config = with_mid
        await node.start_plugin()
        await node.stop_plugin()
        return node

    node = run(scenario())
    weight = node.tree.read(f"{pod.cgroup_parent}/{pod.id}-app").shares
    assert weight == node.tree.expected(container_target(pod, pod.containers[0], with_mid)).shares
    assert node.mismatches() == []
