"""Hostile pod records and runtime values through the real App: what no cgroup file holds is
refused with the pod named, and a bad record never fails a Synchronize."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.plugin.codec import decode_native_limits
from nri_midbatch.state.store import PRUNE_PER_PIECE, BaselineStore
from tests import factory
from tests.fake_cgroups import FakeTree
from tests.oracle.targets import Values

from .app_node import Node, running_node
from .nri_fixtures import run

INT64_MAX = (1 << 63) - 1
#: One tier: prod pods' quota scaled by the ratio.
TIERS = [
    dict(
        name="prod",
        priorityClasses=["koord-prod"],
        qosClasses=["LS"],
        calculator="cpu-normalization",
    )
]
#: Normalized by 2: a pod's quota is half of kubelet's.
RATIO = {"cpuNormalizationRatio": 2.0}


def resources(shares: int, quota: int) -> api.LinuxResources:
    return factory.resources(shares=shares, quota=quota, period=100_000)


def web_container(pod: api.PodSandbox) -> api.Container:
    return factory.container("c-web", pod, "web", current=resources(1024, 150_000))


def containerd_2(
    tmp_path: Path, nri_version: str, pod: api.PodSandbox, *containers: api.Container
) -> AbstractAsyncContextManager[Node]:
    """A node whose runtime tells pod resources and overhead, `pod` running at Synchronize."""
    return running_node(
        tmp_path,
        runtime_version="v2.1.9",
        nri_version=nri_version,
        tiers=TIERS,
        rules=RATIO,
        synchronized=([pod], containers),
    )


def _summed_past_64_bits() -> api.LinuxResources:
    return resources(1024, INT64_MAX)


def test_a_record_nested_200_000_deep_fails_no_synchronize(tmp_path: Path) -> None:
    """It made Synchronize answer status 2 at every registration until removed."""
    pod = factory.prod_pod("web")
    parent = pod.linux.cgroup_parent
    state = tmp_path / "state"
    state.mkdir()
    (state / f"{pod.uid}.json").write_text("[" * 200_000)
    FakeTree(tmp_path / "cgroup").write(parent, Values(1536, 150000, -1))

    async def scenario() -> None:
        async with running_node(
            tmp_path, state_dir=state, tiers=TIERS, rules=RATIO, synchronized=([pod], [])
        ) as node:
            assert node.synchronized is not None
            await node.app.plugin.after_reply.settle()
            assert node.app.plugin.store.refused == {"format": 1}
            # Without a record, kubelet's values came from the pod's cgroup.
            assert node.tree.read(parent).quota == 75000
            kept = BaselineStore(state).load(pod.uid)
            assert kept is not None and kept.pod is not None
            assert kept.pod.kubelet.cpu_quota == 150_000

    run(scenario())


def test_a_record_s_out_of_range_quota_is_never_written(tmp_path: Path) -> None:
    """A record saying kubelet's quota is -5 (or 2^64-2) is refused, not given back."""
    pod = factory.prod_pod("web")
    parent = pod.linux.cgroup_parent
    state = tmp_path / "state"
    state.mkdir()
    record = {"format": 1, "pod": {"kubelet": {"cpuQuota": (1 << 64) - 2}}}
    (state / f"{pod.uid}.json").write_text(json.dumps(record))
    FakeTree(tmp_path / "cgroup").write(parent, Values(1536, 150000, -1))

    async def scenario() -> None:
        async with running_node(
            tmp_path, state_dir=state, tiers=TIERS, rules=RATIO, synchronized=([pod], [])
        ) as node:
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent).quota == 75000
            assert node.app.plugin.store.refused == {"values": 1}

    run(scenario())


def test_pod_values_summed_past_64_bits_at_synchronize_are_refused(tmp_path: Path) -> None:
    """containerd 2.x's pod resources plus overhead: their sum is kubelet's pod quota, unless
    no cgroup file can hold it; then the pod's cgroup tells, as on containerd 1.7."""
    pod = factory.prod_pod(
        "web", pod_resources=_summed_past_64_bits(), pod_overhead=_summed_past_64_bits()
    )
    parent = pod.linux.cgroup_parent
    FakeTree(tmp_path / "cgroup").write(parent, Values(1024, 110000, -1))

    async def scenario() -> None:
        async with containerd_2(tmp_path, "v0.8.0", pod) as node:
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent).quota == 55000
            assert node.app.plugin.counters.invalid == {"runtime_values": 1}

    run(scenario())


def test_an_update_pod_sandbox_summed_past_64_bits_is_refused(tmp_path: Path) -> None:
    """18446744073709551614 was written to cpu.cfs_quota_us."""
    pod = factory.prod_pod(
        "web", pod_resources=resources(1024, 100_000), pod_overhead=resources(0, 10_000)
    )
    parent = pod.linux.cgroup_parent
    FakeTree(tmp_path / "cgroup").write(parent, Values(1024, 110000, -1))

    async def scenario() -> None:
        async with containerd_2(tmp_path, "v0.10.0", pod, web_container(pod)) as node:
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent).quota == 55000
            await node.call(
                "UpdatePodSandbox",
                api.UpdatePodSandboxRequest(
                    pod=pod,
                    linux_resources=_summed_past_64_bits(),
                    overhead_linux_resources=_summed_past_64_bits(),
                ),
                api.UpdatePodSandboxResponse,
            )
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent).quota == 55000
            assert node.app.plugin.counters.invalid == {"runtime_values": 1}
            assert node.app.plugin.live.known.pods["web"].native.cpu_quota == 110_000

    run(scenario())


@pytest.mark.parametrize(
    "text",
    ['{"cpuQuota": 1180591620717411303424}', '{"cpuQuota": 999}', '{"cpuShares": 262145}'],
)
def test_a_native_limits_annotation_no_cgroup_file_holds_is_not_kubelet_s(text: str) -> None:
    """The container's own record of kubelet's values: taken only within the same ranges."""
    assert decode_native_limits(text) is None
    assert decode_native_limits('{"cpuQuota": 1000, "cpuShares": 262144}') is not None


def test_stale_records_are_pruned_a_slice_at_a_time_and_a_live_one_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = factory.prod_pod("web")
    state = tmp_path / "state"
    state.mkdir()
    for n in range(3 * PRUNE_PER_PIECE):
        (state / f"gone-{n}.json").write_text("{}")
    FakeTree(tmp_path / "cgroup").write(pod.linux.cgroup_parent, Values(1536, 150000, -1))
    pieces: list[int] = []
    pruning = BaselineStore.pruning

    def counted(store: BaselineStore, live: Callable[[], Collection[str]]) -> Iterator[int]:
        for removed in pruning(store, live):
            pieces.append(removed)
            yield removed

    monkeypatch.setattr(BaselineStore, "pruning", counted)

    async def scenario() -> None:
        async with running_node(
            tmp_path, state_dir=state, tiers=TIERS, rules=RATIO, synchronized=([pod], [])
        ) as node:
            await node.app.plugin.after_reply.settle()

    run(scenario())
    assert os.listdir(state) == [f"{pod.uid}.json"]
    assert len(pieces) >= 3 and max(pieces) <= PRUNE_PER_PIECE
