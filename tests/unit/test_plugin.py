"""MidBatchPlugin driven by a real Session over a socket pair, as a runtime drives it.

Koordinator semantics §4 (values and where they go) and §8 (koordlet's NRI gaps we fix);
NRI protocol §4.3-§4.5 (error statuses, merge rules, updates keyed by container id).
Pod-level values land in a fake cgroup v1 tree under tmp_path.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import structlog
import structlog.testing

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.files import CgroupVersion
from nri_midbatch.cgroups.paths import CgroupLocation
from nri_midbatch.cgroups.report import FileFailure, WriteReport
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import Config, load_config_text
from nri_midbatch.config.settings import Settings
from nri_midbatch.nri.events import Event
from nri_midbatch.nri.session import Session
from nri_midbatch.nri.testing import LoopbackRuntime
from nri_midbatch.plugin import decisions as decisions_module
from nri_midbatch.plugin.codec import NATIVE_LIMITS_ANNOTATION
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.plugin.lowering import LoweringTimings
from nri_midbatch.plugin.observer import Observer
from nri_midbatch.plugin.reconcile import ConvergenceTimings
from nri_midbatch.plugin.records import Records
from nri_midbatch.policy import CgroupValues, ContainerView, Decision, PodView, decide_container
from nri_midbatch.policy.cpuset import RESOURCE_STATUS_ANNOTATION
from nri_midbatch.rpc.errors import RpcError
from nri_midbatch.wire.status import Code
from tests.factory import (
    BATCH_APP,
    BATCH_CPU,
    BATCH_MEMORY,
    GI,
    MI,
    MID_CPU,
    MID_MEMORY,
    batch_pod,
    prod_pod,
    resources,
    spec,
)
from tests.factory import container as make_container
from tests.factory import pod as make_pod
from tests.fake_cgroups import BESTEFFORT, KERNEL_RULES, FakeTree, KernelRules, Watched
from tests.oracle.targets import Values

from .hostile_config import HOSTILE_YAML
from .nri_fixtures import STEP_TIMEOUT, run

#: A burstable pod with 1 CPU request and limit, 1 GiB memory limit.
BURSTABLE_DEFAULTS = Values(1024, 100000, GI)

# NRI event bits, 1 << (event - 1).
RUN_POD_SANDBOX_BIT, CREATE_CONTAINER_BIT, UPDATE_CONTAINER_BIT = 0x1, 0x8, 0x80
REMOVE_POD_SANDBOX_BIT, REMOVE_CONTAINER_BIT = 0x4, 0x400
#: The events that set values.
ACTING_EVENTS = RUN_POD_SANDBOX_BIT | CREATE_CONTAINER_BIT | UPDATE_CONTAINER_BIT
#: Removal events, subscribed only to forget pods and containers that are gone
#: (the handlers' `known`, for config reloads); they set no value.
BOOKKEEPING_EVENTS = REMOVE_POD_SANDBOX_BIT | REMOVE_CONTAINER_BIT
EXPECTED_EVENTS = ACTING_EVENTS | BOOKKEEPING_EVENTS
#: From NRI v0.10 also UpdatePodSandbox: an in-place pod resize moves kubelet's pod values.
UPDATE_POD_SANDBOX_BIT = 0x800
EXPECTED_EVENTS_V010 = EXPECTED_EVENTS | UPDATE_POD_SANDBOX_BIT


@pytest.fixture
def tree(tmp_path: Path) -> FakeTree:
    return FakeTree(tmp_path / "cgroup")


def make_config(tree: FakeTree, **overrides: Any) -> Settings:
    document: dict[str, Any] = {"cgroups": {"root": str(tree.root)}}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            document[key] = {**document[key], **value}
        else:
            document[key] = value
    return settings_of(load_config_text(json.dumps(document), "test"))


# ---------------------------------------------------------------------------
# NRI message builders
# ---------------------------------------------------------------------------


BATCH_VALUES = (512, 100_000, 512 * MI)


def values_of(res: api.LinuxResources) -> tuple[int, int, int]:
    return res.cpu.shares.value, res.cpu.quota.value, res.memory.limit.value


def assert_only_cgroup_values(res: api.LinuxResources) -> None:
    """shares, quota and memory limit set; nothing else (no period, cpuset, swap, ...)."""
    assert {f.name for f, _ in res.ListFields()} == {"cpu", "memory"}
    assert {f.name for f, _ in res.cpu.ListFields()} == {"shares", "quota"}
    assert {f.name for f, _ in res.memory.ListFields()} == {"limit"}


# ---------------------------------------------------------------------------
# A plugin connected to a LoopbackRuntime over a socket pair
# ---------------------------------------------------------------------------


@dataclass
class Connected:
    runtime: LoopbackRuntime
    session: Session
    plugin: MidBatchPlugin
    configured: api.ConfigureResponse

    async def create(self, pod: api.PodSandbox, ctr: api.Container) -> api.CreateContainerResponse:
        return await self.runtime.call(
            "CreateContainer",
            api.CreateContainerRequest(pod=pod, container=ctr),
            api.CreateContainerResponse,
        )

    async def update(
        self, pod: api.PodSandbox, ctr: api.Container, res: api.LinuxResources
    ) -> api.UpdateContainerResponse:
        return await self.runtime.call(
            "UpdateContainer",
            api.UpdateContainerRequest(pod=pod, container=ctr, linux_resources=res),
            api.UpdateContainerResponse,
        )

    async def sync(
        self, pods: list[api.PodSandbox], ctrs: list[api.Container], more: bool = False
    ) -> api.SynchronizeResponse:
        return await self.runtime.call(
            "Synchronize",
            api.SynchronizeRequest(pods=pods, containers=ctrs, more=more),
            api.SynchronizeResponse,
        )

    async def run_pod_sandbox(self, pod: api.PodSandbox) -> api.RunPodSandboxResponse:
        return await self.runtime.call(
            "RunPodSandbox", api.RunPodSandboxRequest(pod=pod), api.RunPodSandboxResponse
        )

    async def state_change_run(self, pod: api.PodSandbox) -> api.Empty:
        return await self.runtime.call(
            "StateChange",
            api.StateChangeEvent(event=api.RUN_POD_SANDBOX, pod=pod),
            api.Empty,
        )


@asynccontextmanager
async def connected(
    config: Settings,
    *,
    runtime_name: str = "containerd",
    runtime_version: str = "v2.3.0",
    nri_version: str = "",
    config_text: str = "",
) -> AsyncIterator[Connected]:
    """Register, Configure; the caller sends Synchronize and events."""
    plugin = MidBatchPlugin(config, cgroup_files=KERNEL_RULES)
    plugin_end, runtime_end = socket.socketpair()
    runtime = await LoopbackRuntime.over(runtime_end)
    session = Session(plugin, "midbatch", "10", registration_timeout=STEP_TIMEOUT)
    task = asyncio.create_task(session.run(plugin_end))
    try:
        configured = await runtime.configure(
            config=config_text,
            runtime_name=runtime_name,
            runtime_version=runtime_version,
            nri_version=nri_version,
        )
        (registration,) = runtime.record.registrations
        assert (registration.plugin_name, registration.plugin_idx) == ("midbatch", "10")
        yield Connected(runtime, session, plugin, configured)
        # What the plugin does after its replies (pod cgroups of a Synchronize,
        # log lines) is part of what a scenario leaves behind.
        await plugin.after_reply.settle()
    finally:
        await runtime.close()
        session.close()
        await asyncio.gather(task, return_exceptions=True)


# ---------------------------------------------------------------------------
# CreateContainer
# ---------------------------------------------------------------------------


def test_create_batch_be_adjusts_exactly_shares_quota_memory(tree: FakeTree) -> None:
    pod = batch_pod()
    ctr = make_container("c-app", pod, "app", state=api.CONTAINER_CREATED)

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.create(pod, ctr)
            assert values_of(reply.adjust.linux.resources) == BATCH_VALUES
            # Nothing else but the remembered native limits (none for a BE
            # container): no env, mounts, hooks, devices, cgroups path, ...
            assert [f.name for f, _ in reply.ListFields()] == ["adjust"]
            assert [f.name for f, _ in reply.adjust.ListFields()] == ["annotations", "linux"]
            assert dict(reply.adjust.annotations) == {NATIVE_LIMITS_ANNOTATION: "{}"}
            assert [f.name for f, _ in reply.adjust.linux.ListFields()] == ["resources"]
            assert_only_cgroup_values(reply.adjust.linux.resources)
            # Never ask to update the container being created (NRI §4.4).
            assert list(reply.update) == []
            assert list(reply.evict) == []
            # The pod, first met here (no RunPodSandbox was seen), and its container.
            assert c.plugin.counters.decisions == {"batch": 2}

    run(scenario())


def test_create_mid_be_computes_from_mid_resources_and_keeps_looser_native(
    tree: FakeTree,
) -> None:
    pod = make_pod(
        "mid-be",
        qos="BE",
        priority="koord-mid",
        annotation=spec(
            {"worker": {"requests": {MID_CPU: "250"}, "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"}}}
        ),
    )
    # Native limits looser than the computed ones: the computed ones win.
    ctr = make_container(
        "c-worker", pod, "worker", current=resources(quota=400_000, period=100_000, memory=4 * GI)
    )

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.create(pod, ctr)
            assert values_of(reply.adjust.linux.resources) == (256, 200_000, GI)
            assert_only_cgroup_values(reply.adjust.linux.resources)
            assert list(reply.update) == []
            # The pod, first met here (no RunPodSandbox was seen), and its container.
            assert c.plugin.counters.decisions == {"mid": 2}

    run(scenario())


def test_create_mid_ls_never_loosens_native_limits(tree: FakeTree) -> None:
    pod = make_pod(
        "mid-ls",
        qos="LS",
        priority="koord-mid",
        annotation=spec(
            {"web": {"requests": {MID_CPU: "1k"}, "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"}}}
        ),
    )
    # Kubelet put the burstable container at 0.5 CPU and 256Mi: tighter than 200000 and 1Gi.
    native = resources(shares=512, quota=50_000, period=100_000, memory=256 * MI)
    ctr = make_container("c-web", pod, "web", current=native)

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.create(pod, ctr)
            assert values_of(reply.adjust.linux.resources) == (1024, 50_000, 256 * MI)
            assert list(reply.update) == []

    run(scenario())


@pytest.mark.parametrize(
    ("labels", "why"),
    [
        ({"qos": "LS", "priority": "koord-prod"}, "prod LS"),
        ({"qos": None, "priority": None}, "no labels"),
    ],
)
def test_create_untouched_pods_get_an_empty_response(
    tree: FakeTree, labels: dict[str, str | None], why: str
) -> None:
    # Even with batch resources in the annotation, these pods are not a tier's.
    pod = make_pod(
        "p", qos=labels["qos"], priority=labels["priority"], annotation=spec({"app": BATCH_APP})
    )
    ctr = make_container("c", pod, "app", current=resources(quota=100_000, memory=GI))

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.create(pod, ctr)
            assert reply.SerializeToString() == b"", why
            assert c.plugin.counters.invalid == {}
            # The pod, first met here (no RunPodSandbox was seen), and its container.
            assert c.plugin.counters.decisions == {"none": 2}

    run(scenario())


# ---------------------------------------------------------------------------
# UpdateContainer
# ---------------------------------------------------------------------------


def test_update_container_names_the_container_and_decides_from_the_request(
    tree: FakeTree,
) -> None:
    pod = batch_pod()
    # The container's current limits are tight (30000, 128Mi); the update request raises
    # them (300000, 2Gi). Deciding from the current ones would give (30000, 128Mi).
    ctr = make_container("c-app", pod, "app", current=resources(quota=30_000, memory=128 * MI))
    requested = resources(shares=2, quota=300_000, period=100_000, memory=2 * GI)

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.update(pod, ctr, requested)
            (update,) = reply.update
            assert update.container_id == "c-app"
            assert values_of(update.linux.resources) == BATCH_VALUES
            assert_only_cgroup_values(update.linux.resources)
            assert not update.ignore_failure
            assert list(reply.evict) == []

            # And the other way round: a request tighter than the tier's values is kept.
            tight = resources(quota=20_000, memory=64 * MI)
            loose_now = make_container("c-app", pod, "app", current=resources())
            (update,) = (await c.update(pod, loose_now, tight)).update
            assert update.container_id == "c-app"
            assert values_of(update.linux.resources) == (512, 20_000, 64 * MI)

    run(scenario())


def test_update_container_of_untouched_pod_returns_no_update(tree: FakeTree) -> None:
    pod = prod_pod("prod")
    ctr = make_container("c", pod, "app")

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.update(pod, ctr, resources(quota=100_000))
            assert reply.SerializeToString() == b""

    run(scenario())


# ---------------------------------------------------------------------------
# Synchronize
# ---------------------------------------------------------------------------

SIDECAR = {"requests": {BATCH_CPU: "250"}, "limits": {BATCH_CPU: "500", BATCH_MEMORY: "256Mi"}}
MID_WORKER = {"requests": {MID_CPU: "1k"}, "limits": {MID_CPU: "2k", MID_MEMORY: "1Gi"}}


@dataclass
class SyncNode:
    pods: list[api.PodSandbox]
    containers: list[api.Container]
    batch: api.PodSandbox
    prod: api.PodSandbox
    mid: api.PodSandbox


def sync_node(tree: FakeTree) -> SyncNode:
    """3 pods, 5 containers: one at tier values, one off, one stopped, one prod, one orphan."""
    batch = batch_pod("batch", annotation=spec({"app": BATCH_APP, "sidecar": SIDECAR}))
    prod = prod_pod("prod")
    mid = make_pod("mid", qos="BE", priority="koord-mid", annotation=spec({"worker": MID_WORKER}))
    tree.write(batch.linux.cgroup_parent, BESTEFFORT)
    tree.write(prod.linux.cgroup_parent, BURSTABLE_DEFAULTS)
    tree.write(mid.linux.cgroup_parent, BESTEFFORT)
    at_tier = resources(shares=512, quota=100_000, memory=512 * MI)
    kubelet_be = resources(shares=2)
    containers = [
        make_container("c-app", batch, "app", current=at_tier),
        make_container("c-sidecar", batch, "sidecar", current=kubelet_be),
        make_container("c-worker", mid, "worker", state=api.CONTAINER_STOPPED, current=kubelet_be),
        make_container("c-prod", prod, "app", current=resources(shares=1024, quota=100_000)),
        make_container("c-orphan", "gone", "app", current=kubelet_be),
    ]
    return SyncNode([batch, prod, mid], containers, batch, prod, mid)


def test_synchronize_updates_only_the_container_off_its_tier_values(tree: FakeTree) -> None:
    node = sync_node(tree)

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.sync(node.pods, node.containers)
            assert not reply.more
            (update,) = reply.update
            assert update.container_id == "c-sidecar"
            assert values_of(update.linux.resources) == (256, 50_000, 256 * MI)
            assert_only_cgroup_values(update.linux.resources)

    run(scenario())
    # Pod level: the tier pods get the sums over their listed containers ...
    assert tree.read(node.batch.linux.cgroup_parent) == Values(768, 150000, 768 * MI)
    assert tree.read(node.mid.linux.cgroup_parent) == Values(1024, 200000, GI)
    # ... and the prod pod keeps what kubelet set.
    assert tree.read(node.prod.linux.cgroup_parent) == BURSTABLE_DEFAULTS


def test_synchronize_logs_changes_at_info_and_the_rest_at_debug_with_a_summary(
    tree: FakeTree,
) -> None:
    """A large node must not bury the log: one summary line, and lines for changes only."""
    node = sync_node(tree)

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            await c.sync(node.pods, node.containers)

    with structlog.testing.capture_logs() as logs:
        run(scenario())
    decisions = {
        line["container"]: line
        for line in logs
        if line["event"] == "decision" and line.get("method") == "Synchronize"
    }
    # The sidecar is changed: info. The app already has its values: debug, so marked.
    assert decisions["sidecar"]["log_level"] == "info"
    assert "unchanged" not in decisions["sidecar"]
    assert (decisions["app"]["log_level"], decisions["app"]["unchanged"]) == ("debug", True)
    info = [line for line in logs if line["log_level"] == "info"]
    assert [line["event"] for line in info].count("decision") == 1
    (summary,) = [line for line in logs if line["event"] == "synchronized"]
    assert summary["log_level"] == "info"
    assert (summary["pods"], summary["containers"], summary["updates"]) == (3, 5, 1)
    assert summary["tiers"] == {
        "batch": {"updated": 1, "unchanged": 1},
        "none": {"untouched": 1},
    }
    # It comes after every per-container line of the Synchronize.
    assert logs.index(summary) > max(logs.index(line) for line in decisions.values())


def test_synchronize_loosens_values_we_set_under_a_stricter_config(tree: FakeTree) -> None:
    """A restarted plugin tells our own earlier values from kubelet's by the annotation."""
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    # Created under cpuNormalizationRatio 2: our quota 50000 is on the container,
    # and kubelet gave it no limits at all ("{}").
    ours = make_container(
        "c-app", pod, "app", current=resources(quota=50_000, period=100_000, memory=512 * MI)
    )
    ours.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
    # The same, created before any plugin ran: its limits are kubelet's own.
    theirs = make_container(
        "c-old", pod, "app", current=resources(quota=50_000, period=100_000, memory=512 * MI)
    )

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.sync([pod], [ours, theirs])
            by_id = {u.container_id: values_of(u.linux.resources) for u in reply.update}
            assert by_id == {
                "c-app": BATCH_VALUES,
                "c-old": (512, 50_000, 512 * MI),
            }

    run(scenario())


def test_synchronize_keeps_remembered_kubelet_limits(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    ctr = make_container(
        "c-app", pod, "app", current=resources(quota=50_000, period=100_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = '{"cpuQuota":20000,"cpuPeriod":100000}'

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.sync([pod], [ctr])
            (update,) = reply.update
            assert values_of(update.linux.resources) == (512, 20_000, 512 * MI)

    run(scenario())


@pytest.mark.parametrize(
    "garbage", ["not json", "[]", '{"cpuQuota": -5}', '{"cpuQuota": "1"}', '{"bogus": 1}']
)
def test_a_garbled_native_annotation_falls_back_to_current_resources(
    tree: FakeTree, garbage: str
) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    ctr = make_container(
        "c-app", pod, "app", current=resources(quota=50_000, period=100_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = garbage

    async def scenario() -> None:
        async with connected(make_config(tree)) as c:
            reply = await c.sync([pod], [ctr])
            (update,) = reply.update
            assert values_of(update.linux.resources) == (512, 50_000, 512 * MI)

    run(scenario())


def test_synchronize_decides_each_container_as_it_would_be_decided_alone(
    tree: FakeTree,
) -> None:
    """A Synchronize classifies each pod once for all its containers; no decision differs."""
    pods = [
        batch_pod("batch", annotation=spec({"app": BATCH_APP, "sidecar": SIDECAR})),
        make_pod("mid", qos="LS", priority="koord-mid", annotation=spec({"worker": MID_WORKER})),
        batch_pod("garbled", annotation="{not json"),
        prod_pod("prod"),
        batch_pod("pinned"),
    ]
    pods[-1].annotations[RESOURCE_STATUS_ANNOTATION] = '{"cpuset": "0-3"}'
    names = {"batch": ["app", "sidecar", "unlisted"], "mid": ["worker", "worker-2"]}
    containers = [
        make_container(f"{pod.id}-{name}", pod, name, current=resources(shares=2))
        for pod in pods
        for name in names.get(pod.id, ["app", "app-2"])
    ]
    decided: list[tuple[PodView, ContainerView, Decision]] = []

    class Decisions(Observer):
        def decided(
            self, pod: PodView, container: ContainerView | None, decision: Decision
        ) -> None:
            if container is not None:
                decided.append((pod, container, decision))

    plugin = MidBatchPlugin(make_config(tree), dry_run=True, observers=[Decisions()])
    run(plugin.synchronize(pods[::-1], containers[::-1]))  # pods' containers apart
    assert len(decided) == len(containers)
    alone = [
        decide_container(pod, container, plugin.live.in_force.policy)
        for pod, container, _ in decided
    ]
    assert alone == [decision for _, _, decision in decided]
    # Every kind of outcome was among them: values, none, an error, the cpuset's quota.
    by_id = {container.id: decision for _, container, decision in decided}
    assert by_id["batch-app"].values is not None and by_id["mid-worker"].values is not None
    assert by_id["batch-unlisted"].values is None and by_id["prod-app"].tier is None
    assert by_id["garbled-app"].error is not None
    pinned = by_id["pinned-app"].values
    assert pinned is not None and pinned.cpu_quota == -1


def test_split_synchronize_gives_the_same_updates_as_one_chunk(tmp_path: Path) -> None:
    def updates(chunks: list[tuple[list[api.PodSandbox], list[api.Container]]], root: Path) -> Any:
        tree = FakeTree(root)
        node = sync_node(tree)
        by_id = {p.id: p for p in node.pods} | {c.id: c for c in node.containers}

        async def scenario() -> list[bytes]:
            async with connected(make_config(tree)) as c:
                for pods, ctrs in chunks[:-1]:
                    partial = await c.sync(
                        [by_id[p.id] for p in pods], [by_id[x.id] for x in ctrs], more=True
                    )
                    # Partial chunks: more=true and nothing else (NRI §4.2).
                    assert partial.more
                    assert list(partial.update) == []
                    # Nothing decided before the last chunk, not even pod files.
                    assert tree.read(node.batch.linux.cgroup_parent) == BESTEFFORT
                pods, ctrs = chunks[-1]
                last = await c.sync([by_id[p.id] for p in pods], [by_id[x.id] for x in ctrs])
                assert not last.more
                return [u.SerializeToString() for u in last.update]

        return run(scenario()), tree.snapshot()

    node = sync_node(FakeTree(tmp_path / "layout"))
    pods, ctrs = node.pods, node.containers
    whole = updates([(pods, ctrs)], tmp_path / "whole")
    # The sidecar and its pod in different chunks.
    split = updates(
        [([pods[1]], [ctrs[1], ctrs[4]]), ([pods[2]], [ctrs[0], ctrs[2]]), ([pods[0]], [ctrs[3]])],
        tmp_path / "split",
    )
    assert len(whole[0]) == 1
    assert split == whole


# ---------------------------------------------------------------------------
# Synchronize: pod cgroups once the reply is out
# ---------------------------------------------------------------------------


def sync_directly(
    tree: FakeTree,
    plugin: MidBatchPlugin,
    pods: list[api.PodSandbox],
    ctrs: list[api.Container],
) -> tuple[Sequence[api.ContainerUpdate], Values, Values]:
    """Synchronize one pod: (updates, its pod files at the reply, its pod files after)."""
    (pod,) = pods
    parent = pod.linux.cgroup_parent

    async def scenario() -> Any:
        response = await plugin.synchronize(pods, ctrs)
        at_reply = tree.read(parent)
        await plugin.after_reply.settle()
        return response.update, at_reply, tree.read(parent)

    return run(scenario())  # type: ignore[no-any-return]


def new_batch_pod(tree: FakeTree) -> tuple[api.PodSandbox, api.Container, MidBatchPlugin]:
    """A batch pod with kubelet's cgroup and a container without values yet, and a plugin."""
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    ctr = make_container("c-app", pod, "app", current=resources(shares=2))
    return pod, ctr, MidBatchPlugin(make_config(tree), cgroup_files=KERNEL_RULES)


def test_synchronize_writes_pod_cgroups_after_the_reply(tree: FakeTree) -> None:
    """Lowered containers first (by the runtime, after our reply), then their pod: v1 order."""
    pod, ctr, plugin = new_batch_pod(tree)

    updates, at_reply, after = sync_directly(tree, plugin, [pod], [ctr])

    assert [values_of(u.linux.resources) for u in updates] == [BATCH_VALUES]
    assert at_reply == BESTEFFORT
    assert after == Values(512, 100000, 512 * MI)
    assert plugin.counters.pod_writes_ok == 1


def test_synchronize_raises_a_pod_before_the_reply_when_a_container_goes_up(
    tree: FakeTree,
) -> None:
    """On v1 a container's quota above its pod's is EINVAL: the pod must be raised first."""
    pod = batch_pod()
    # Both set under a config that halved the quota (cpuNormalizationRatio 2).
    tree.write(pod.linux.cgroup_parent, Values(512, 50000, 512 * MI))
    ctr = make_container(
        "c-app", pod, "app", current=resources(shares=512, quota=50_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
    plugin = MidBatchPlugin(make_config(tree), cgroup_files=KERNEL_RULES)

    updates, at_reply, after = sync_directly(tree, plugin, [pod], [ctr])

    assert [values_of(u.linux.resources) for u in updates] == [BATCH_VALUES]
    assert at_reply == after == Values(512, 100000, 512 * MI)


HALVED_CONFIG = {"rules": {"cpuNormalizationRatio": 2.0}}
#: Containers read every millisecond, so that a test sees polls in a few.
QUICK_POLLS = LoweringTimings(poll=0.001)


def lowered_batch_pod(
    tree: FakeTree, lowering: LoweringTimings = QUICK_POLLS, files: KernelRules = KERNEL_RULES
) -> tuple[api.PodSandbox, api.Container, MidBatchPlugin]:
    """A batch pod and its container at the batch values, and a plugin that halves the quota."""
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    tree.write(parent, Values(512, 100000, 512 * MI))
    tree.write(f"{parent}/c-app", Values(512, 100000, 512 * MI))
    ctr = make_container(
        "c-app", pod, "app", current=resources(shares=512, quota=100_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
    plugin = MidBatchPlugin(
        make_config(tree, **HALVED_CONFIG), lowering_timings=lowering, cgroup_files=files
    )
    return pod, ctr, plugin


def count_container_reads(files: Watched) -> asyncio.Queue[str]:
    """Each read of a container's cgroup files by the plugin, by container id, from now."""
    reads: asyncio.Queue[str] = asyncio.Queue()

    def read(location: CgroupLocation) -> None:
        if location.container_id is not None:
            reads.put_nowait(location.container_id)

    files.reading = read
    return reads


def test_synchronize_lowers_a_pod_only_once_the_runtime_lowered_its_containers(
    tree: FakeTree,
) -> None:
    """The runtime applies the reply's updates later: the pod waits for the container files."""
    files = Watched()
    pod, ctr, plugin = lowered_batch_pod(tree, files=files)
    parent = pod.linux.cgroup_parent

    async def scenario() -> tuple[Values, Values]:
        reads = count_container_reads(files)
        response = await plugin.synchronize([pod], [ctr])
        assert [values_of(u.linux.resources) for u in response.update] == [(512, 50_000, 512 * MI)]
        for _ in range(3):  # three polls saw the container still at its old quota
            await asyncio.wait_for(reads.get(), STEP_TIMEOUT)
        before_runtime = tree.read(parent)
        # The runtime applies the update.
        tree.write(f"{parent}/c-app", Values(512, 50000, 512 * MI))
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)
        return before_runtime, tree.read(parent)

    before_runtime, after = run(scenario())
    assert before_runtime == Values(512, 100000, 512 * MI)
    assert after == Values(512, 50000, 512 * MI)
    assert (plugin.counters.pod_writes_ok, plugin.counters.pods_lowered_unconfirmed) == (1, 0)


def test_synchronize_waits_for_the_container_the_runtime_lowers_last(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime applies the reply in order: the pod's last update is its one witness."""
    pod = batch_pod(annotation=spec({"app": BATCH_APP, "side": BATCH_APP}))
    parent = pod.linux.cgroup_parent
    tree.write(parent, Values(1024, 200000, GI))
    current = resources(shares=512, quota=100_000, memory=512 * MI)
    containers = []
    for name in ("app", "side"):
        tree.write(f"{parent}/c-{name}", Values(512, 100000, 512 * MI))
        ctr = make_container(f"c-{name}", pod, name, current=current)
        ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
        containers.append(ctr)
    files = Watched()
    plugin = MidBatchPlugin(
        make_config(tree, **HALVED_CONFIG), lowering_timings=QUICK_POLLS, cgroup_files=files
    )

    async def scenario() -> tuple[list[str], Values, Values]:
        reads = count_container_reads(files)
        response = await plugin.synchronize([pod], containers)
        assert [u.container_id for u in response.update] == ["c-app", "c-side"]
        seen = [await asyncio.wait_for(reads.get(), STEP_TIMEOUT) for _ in range(2)]
        before_runtime = tree.read(parent)
        # The runtime applies both updates, in order.
        for name in ("app", "side"):
            tree.write(f"{parent}/c-{name}", Values(512, 50000, 512 * MI))
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)
        while not reads.empty():
            seen.append(reads.get_nowait())
        return seen, before_runtime, tree.read(parent)

    seen, before_runtime, after = run(scenario())
    assert set(seen) == {"c-side"}
    assert before_runtime == Values(1024, 200000, GI)
    assert after == Values(1024, 100000, GI)


def test_synchronize_writes_a_pod_whose_containers_are_never_lowered_after_a_while(
    tree: FakeTree,
) -> None:
    """An update the runtime failed to apply must not hold the pod forever: logged, counted."""
    pod, ctr, plugin = lowered_batch_pod(tree, LoweringTimings(poll=0.001, stall=0.05))

    async def scenario() -> None:
        await plugin.synchronize([pod], [ctr])
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)

    with structlog.testing.capture_logs() as logs:
        run(scenario())
    # Tried, and refused as cgroup v1 refuses a pod quota below its container's (EINVAL).
    assert tree.read(pod.linux.cgroup_parent) == Values(512, 100000, 512 * MI)
    assert plugin.counters.pods_lowered_unconfirmed == 1
    warning, refused = [line for line in logs if line["log_level"] == "warning"]
    assert warning["event"] == "runtime did not lower containers in time, writing their pods anyway"
    assert warning["first_pod"] == f"default/{pod.name}"
    assert refused["event"] == "pod cgroup not set" and "EINVAL" in refused["reason"]


def test_synchronize_takes_a_removed_container_as_lowered(tree: FakeTree) -> None:
    """A container whose cgroup is gone holds nothing back: its pod is written at once."""
    pod, ctr, plugin = lowered_batch_pod(tree)
    parent = pod.linux.cgroup_parent
    for controller in ("cpu", "memory"):
        directory = tree.directory(controller, parent, "c-app")
        for file in directory.iterdir():
            file.unlink()
        directory.rmdir()

    async def scenario() -> None:
        await plugin.synchronize([pod], [ctr])
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)

    run(scenario())
    assert tree.read(parent) == Values(512, 50000, 512 * MI)
    assert plugin.counters.pods_lowered_unconfirmed == 0


def test_a_newer_synchronize_ends_the_wait_of_the_last_one(tree: FakeTree) -> None:
    """The newer one decides every pod anew: nothing of the old one stays waiting."""
    pod, ctr, plugin = lowered_batch_pod(tree, LoweringTimings(poll=0.001, stall=60.0))

    async def scenario() -> None:
        await plugin.synchronize([pod], [ctr])
        # The pod is gone by the next one; its container's files never changed.
        await plugin.synchronize([], [])
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == Values(512, 100000, 512 * MI)
    assert plugin.counters.pods_lowered_unconfirmed == 0


def raised_batch_pod(
    tree: FakeTree, files: KernelRules = KERNEL_RULES
) -> tuple[api.PodSandbox, api.Container, MidBatchPlugin]:
    """A batch pod set under a config that halved the quota, and a plugin with the default."""
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, Values(512, 50000, 512 * MI))
    ctr = make_container(
        "c-app", pod, "app", current=resources(shares=512, quota=50_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
    return pod, ctr, MidBatchPlugin(make_config(tree), cgroup_files=files)


def test_synchronize_tries_a_refused_raise_once_more_after_the_reply(tree: FakeTree) -> None:
    files = PodWritesRefused(times=1)
    pod, ctr, plugin = raised_batch_pod(tree, files)
    refusals = files.refused

    with structlog.testing.capture_logs() as logs:
        _, at_reply, after = sync_directly(tree, plugin, [pod], [ctr])

    assert refusals == [pod.linux.cgroup_parent]
    assert at_reply == Values(512, 50000, 512 * MI)
    assert after == Values(512, 100000, 512 * MI)
    assert (plugin.counters.pod_writes_ok, plugin.counters.pod_writes_failed) == (1, 0)
    assert not [line for line in logs if line["log_level"] == "warning"]


def test_synchronize_reports_a_pod_write_that_fails_twice(tree: FakeTree) -> None:
    files = PodWritesRefused(times=2)
    pod, ctr, plugin = raised_batch_pod(tree, files)
    refusals = files.refused

    with structlog.testing.capture_logs() as logs:
        _, _, after = sync_directly(tree, plugin, [pod], [ctr])

    assert len(refusals) == 2
    assert after == Values(512, 50000, 512 * MI)
    assert (plugin.counters.pod_writes_ok, plugin.counters.pod_writes_failed) == (0, 1)
    (warning,) = [line for line in logs if line["log_level"] == "warning"]
    assert warning["event"] == "pod cgroup not set"
    assert (warning["method"], warning["pod"]) == ("Synchronize", pod.name)
    assert "Invalid argument" in warning["reason"]


def test_synchronize_leaves_a_pod_removed_before_its_write_alone(tree: FakeTree) -> None:
    pod, ctr, plugin = new_batch_pod(tree)

    async def scenario() -> None:
        await plugin.synchronize([pod], [ctr])
        await plugin.pod_event(Event.REMOVE_POD_SANDBOX, pod)
        await plugin.after_reply.settle()

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == BESTEFFORT
    assert (plugin.counters.pod_writes_ok, plugin.counters.pod_writes_failed) == (0, 0)


def test_a_removed_sandboxs_record_piece_keeps_none_of_the_requests_maps(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The piece waits in the work after replies, under steady load for a while: a view of
    the message would keep the whole RemovePodSandbox request (its maps) that long."""
    pod, _ctr, plugin = new_batch_pod(tree)
    pod.labels["app"] = "x" * 1000
    seen: list[PodView] = []
    monkeypatch.setattr(Records, "sandbox_removed", lambda _records, view: seen.append(view))

    async def scenario() -> None:
        await plugin.pod_event(Event.REMOVE_POD_SANDBOX, pod)  # a pod the plugin forgot
        await plugin.after_reply.settle()

    run(scenario())
    (view,) = seen
    assert (view.uid, view.name, view.cgroup_parent) == (pod.uid, pod.name, pod.linux.cgroup_parent)
    assert pod.annotations
    assert (view.labels, view.annotations) == ({}, {})


class PodWritesRefused(KernelRules):
    """The first `times` pod writes fail with EINVAL, as v1 answers a quota below a child's;
    `refused` holds their cgroup parents."""

    def __init__(self, *, times: int) -> None:
        self.times = times
        self.refused: list[str] = []

    def apply_values(
        self, root: Path, location: CgroupLocation, values: CgroupValues
    ) -> WriteReport:
        parent = location.cgroup_parent
        if location.container_id is None and len(self.refused) < self.times:
            self.refused.append(parent)
            path = root / "cpu" / parent.strip("/") / "cpu.cfs_quota_us"
            einval = OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            failure = FileFailure.from_os_error(path, "write", einval)
            return WriteReport(CgroupVersion.V1, (), (), (failure,))
        return super().apply_values(root, location, values)


# ---------------------------------------------------------------------------
# RunPodSandbox: pod-level files
# ---------------------------------------------------------------------------


def test_run_pod_sandbox_never_loosens_kubelets_pod_limits(tree: FakeTree) -> None:
    """containerd 1.7 sends no pod resources: kubelet's limits are read from the cgroup."""
    pod = make_pod(
        "mid-ls",
        qos="LS",
        priority="koord-mid",
        annotation=spec(
            {"app": {"requests": {MID_CPU: "1k"}, "limits": {MID_CPU: "4k", MID_MEMORY: "4Gi"}}}
        ),
    )
    # kubelet gave the burstable pod 1 core and 1 GiB.
    tree.write(pod.linux.cgroup_parent, BURSTABLE_DEFAULTS)

    async def scenario() -> None:
        async with connected(make_config(tree), nri_version="v0.12.0") as c:
            await c.run_pod_sandbox(pod)

    run(scenario())
    # The tier asks 400000 and 4 GiB; the pod keeps kubelet's tighter limits.
    assert tree.read(pod.linux.cgroup_parent) == Values(1024, 100000, GI)


def test_run_pod_sandbox_takes_no_besteffort_values_for_kubelets(tree: FakeTree) -> None:
    """A best-effort pod's cgroup holds only what we wrote: it is no kubelet limit to keep."""
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, Values(256, 20000, 128 * MI))

    async def scenario() -> None:
        async with connected(make_config(tree), nri_version="v0.12.0") as c:
            await c.run_pod_sandbox(pod)

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == Values(512, 100000, 512 * MI)


def test_run_pod_sandbox_dedicated_rpc_writes_pod_files(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)

    async def scenario() -> None:
        async with connected(make_config(tree), nri_version="v0.12.0") as c:
            reply = await c.run_pod_sandbox(pod)
            assert reply.SerializeToString() == b""
            assert c.plugin.counters.pod_writes_failed == 0

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == Values(512, 100000, 512 * MI)


def test_run_pod_sandbox_via_state_change_writes_pod_files(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)

    async def scenario() -> None:
        async with connected(
            make_config(tree), runtime_name="containerd", runtime_version="v1.7.24"
        ) as c:
            await c.state_change_run(pod)

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == Values(512, 100000, 512 * MI)


def test_run_pod_sandbox_with_pod_level_off_writes_nothing(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    before = tree.snapshot()

    async def scenario() -> None:
        config = make_config(tree, cgroups={"podLevel": False})
        async with connected(config, nri_version="v0.12.0") as c:
            await c.run_pod_sandbox(pod)
            await c.state_change_run(pod)
            # Synchronize does not write pod files either.
            await c.sync([pod], [])

    run(scenario())
    assert tree.snapshot() == before


def test_run_pod_sandbox_refuses_a_cgroup_parent_leaving_the_tree(tree: FakeTree) -> None:
    pod = batch_pod(cgroup_parent="/kubepods/../../etc")
    # What the parent would reach if it were joined naively: <root>/cpu/../etc.
    tree.write("/kubepods/bystander", BESTEFFORT)
    (tree.root / "etc").mkdir()
    for name in ("cpu.shares", "cpu.cfs_quota_us", "memory.limit_in_bytes"):
        (tree.root / "etc" / name).write_text("sentinel\n")
    outside = tree.root.parent / "etc"
    before = tree.snapshot()

    async def scenario() -> None:
        async with connected(make_config(tree), nri_version="v0.12.0") as c:
            reply = await c.run_pod_sandbox(pod)  # Ignore: no error status
            assert reply.SerializeToString() == b""
            await c.state_change_run(pod)
            assert c.plugin.counters.pod_writes_failed == 2
            # Still connected and working.
            ok = await c.create(batch_pod(), make_container("c", "batch", "app"))
            assert values_of(ok.adjust.linux.resources) == BATCH_VALUES

    run(scenario())
    assert tree.snapshot() == before
    assert not outside.exists()


# ---------------------------------------------------------------------------
# Failure policy
# ---------------------------------------------------------------------------

MALFORMED = [
    pytest.param("{not json", id="bad-json"),
    pytest.param(spec({"app": {"limits": {BATCH_CPU: "1.2.3"}}}), id="bad-quantity"),
]


@pytest.mark.parametrize("annotation", MALFORMED)
def test_ignore_leaves_malformed_pods_alone_and_counts_them(
    tree: FakeTree, annotation: str
) -> None:
    pod = batch_pod(annotation=annotation)
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    ctr = make_container("c-app", pod, "app")

    async def scenario() -> None:
        async with connected(make_config(tree, failurePolicy="Ignore"), nri_version="v0.12.0") as c:
            reply = await c.create(pod, ctr)
            assert reply.SerializeToString() == b""
            # Once for the pod, first met here (no RunPodSandbox was seen), once for its
            # container.
            assert c.plugin.counters.invalid == {"spec": 2}
            update = await c.update(pod, ctr, resources(quota=100_000))
            assert update.SerializeToString() == b""
            assert c.plugin.counters.invalid == {"spec": 3}
            await c.run_pod_sandbox(pod)
            assert c.plugin.counters.invalid == {"spec": 4}

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == BESTEFFORT


@pytest.mark.parametrize("annotation", MALFORMED)
def test_fail_refuses_malformed_pods_and_stays_connected(tree: FakeTree, annotation: str) -> None:
    bad = batch_pod("bad", annotation=annotation)
    good = batch_pod("good")
    tree.write(bad.linux.cgroup_parent, BESTEFFORT)
    tree.write(good.linux.cgroup_parent, BESTEFFORT)

    async def scenario() -> None:
        async with connected(make_config(tree, failurePolicy="Fail"), nri_version="v0.12.0") as c:
            with pytest.raises(RpcError) as create_error:
                await c.create(bad, make_container("c-bad", bad, "app"))
            assert create_error.value.code != Code.OK
            assert "extended-resource spec" in create_error.value.message
            # The connection survives the error reply (NRI §4.3): the next call works.
            ok = await c.create(good, make_container("c-good", good, "app"))
            assert values_of(ok.adjust.linux.resources) == BATCH_VALUES

            with pytest.raises(RpcError) as run_error:
                await c.run_pod_sandbox(bad)
            assert run_error.value.code != Code.OK
            assert "extended-resource spec" in run_error.value.message
            await c.run_pod_sandbox(good)
            assert c.plugin.counters.invalid == {"spec": 2}

    run(scenario())
    assert tree.read(bad.linux.cgroup_parent) == BESTEFFORT
    assert tree.read(good.linux.cgroup_parent) == Values(512, 100000, 512 * MI)


def test_fail_refuses_run_pod_sandbox_whose_cgroup_parent_is_refused(tree: FakeTree) -> None:
    bad = batch_pod("bad", cgroup_parent="/kubepods/../../etc")
    before = tree.snapshot()

    async def scenario() -> None:
        async with connected(make_config(tree, failurePolicy="Fail"), nri_version="v0.12.0") as c:
            with pytest.raises(RpcError) as error:
                await c.run_pod_sandbox(bad)
            assert error.value.code != Code.OK
            assert c.plugin.counters.pod_writes_failed == 1
            await c.sync([], [])  # still connected

    run(scenario())
    assert tree.snapshot() == before


def test_fail_policy_does_not_fail_synchronize_for_one_malformed_pod(tree: FakeTree) -> None:
    bad = batch_pod("bad", annotation="{not json")
    good = batch_pod("good")
    tree.write(good.linux.cgroup_parent, BESTEFFORT)
    tree.write(bad.linux.cgroup_parent, BESTEFFORT)
    ctrs = [make_container("c-bad", bad, "app"), make_container("c-good", good, "app")]

    async def scenario() -> None:
        async with connected(make_config(tree, failurePolicy="Fail")) as c:
            # Synchronize is no container's creation: refusing it would only get the plugin
            # closed by the runtime (NRI §4.2), so the bad pod is left alone and counted.
            reply = await c.sync([bad, good], ctrs)
            assert [u.container_id for u in reply.update] == ["c-good"]
            assert c.plugin.counters.invalid == {"spec": 2}  # container + pod level

    run(scenario())
    assert tree.read(good.linux.cgroup_parent) == Values(512, 100000, 512 * MI)
    assert tree.read(bad.linux.cgroup_parent) == BESTEFFORT


# ---------------------------------------------------------------------------
# Configure
# ---------------------------------------------------------------------------


def test_configure_with_a_drop_in_config_replaces_the_config(tree: FakeTree) -> None:
    pod = batch_pod(annotation=spec({"app": {"limits": {BATCH_CPU: "500"}}}))
    ctr = make_container("c-app", pod, "app")
    drop_in = f"rules: {{cpuNormalizationRatio: 1.2}}\ncgroups: {{root: {tree.root}}}\n"

    async def scenario() -> None:
        async with connected(make_config(tree), config_text=drop_in) as c:
            assert c.configured.events == EXPECTED_EVENTS_V010
            assert c.plugin.live.in_force.config.rules.cpu_normalization_ratio == Fraction("1.2")
            assert c.plugin.counters.config_rejected == 0
            reply = await c.create(pod, ctr)
            # ceil(50000 / 1.2); shares 2 (no request), memory unlimited (no limit).
            assert values_of(reply.adjust.linux.resources) == (2, 41_667, -1)

    run(scenario())


def test_configure_with_an_invalid_config_keeps_the_previous_one(tree: FakeTree) -> None:
    pod = batch_pod(annotation=spec({"app": {"limits": {BATCH_CPU: "500"}}}))
    ctr = make_container("c-app", pod, "app")
    startup = make_config(tree, rules={"cpuNormalizationRatio": 2.0})

    async def scenario() -> None:
        async with connected(startup, config_text="rules: {cpuNormalisationRatio: 1.2}\n") as c:
            # Configure still succeeds, with our events.
            assert c.configured.events == EXPECTED_EVENTS_V010
            assert c.plugin.counters.config_rejected == 1
            assert c.plugin.live.in_force.config is startup
            reply = await c.create(pod, ctr)
            assert values_of(reply.adjust.linux.resources) == (2, 25_000, -1)

    run(scenario())


@pytest.mark.parametrize(("text", "reason"), HOSTILE_YAML.values(), ids=HOSTILE_YAML.keys())
def test_configure_with_a_hostile_drop_in_keeps_the_previous_config(
    tree: FakeTree, text: str, reason: str
) -> None:
    """A pre-launched plugin's bad drop-in is refused: registration still succeeds."""
    startup = make_config(tree, rules={"cpuNormalizationRatio": 2.0})

    async def scenario() -> None:
        async with connected(startup, config_text=text) as c:
            assert c.configured.events == EXPECTED_EVENTS_V010
            assert c.plugin.counters.config_rejected == 1
            assert c.plugin.live.in_force.config is startup

    with structlog.testing.capture_logs() as logs:
        run(scenario())
    (refused,) = [e for e in logs if e["event"] == "configuration from the runtime rejected"]
    assert refused["log_level"] == "error"
    assert reason in refused["error"]


def test_configure_event_mask_for_containerd_1_7(tree: FakeTree) -> None:
    async def scenario() -> None:
        async with connected(
            make_config(tree), runtime_name="containerd", runtime_version="v1.7.24"
        ) as c:
            # Nothing else: no START/STOP/POST_* events on the runtime's serial NRI path,
            # and no bit a v0.6.1 runtime (valid mask 0x7FF) would reject.
            assert c.configured.events == EXPECTED_EVENTS
            assert c.configured.events & ACTING_EVENTS == 0x1 | 0x8 | 0x80
            assert c.configured.events & ~0x7FF == 0
            assert c.session.state.events == EXPECTED_EVENTS

    run(scenario())


# ---------------------------------------------------------------------------
# A decision that raises (a bug): the failure policy decides, logged and counted
# ---------------------------------------------------------------------------


def break_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any) -> Any:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(decisions_module, "decide_container", broken)
    monkeypatch.setattr(decisions_module, "decide_pod", broken)


def test_ignore_leaves_a_workload_alone_when_its_decision_raises(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    break_decisions(monkeypatch)

    async def scenario() -> Connected:
        async with connected(make_config(tree), nri_version="v0.12.0") as c:
            await c.run_pod_sandbox(pod)
            reply = await c.create(pod, make_container("c-app", pod, "app"))
            assert reply.SerializeToString() == b""
            synced = await c.sync([pod], [make_container("c-app", pod, "app")])
            assert list(synced.update) == []
            return c

    with structlog.testing.capture_logs() as logs:
        c = run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == BESTEFFORT
    # RunPodSandbox, CreateContainer, and Synchronize's container and pod.
    assert c.plugin.counters.invalid == {"internal": 4}
    errors = [line for line in logs if line["log_level"] == "error"]
    assert [(e["method"], e["pod"], e.get("container")) for e in errors] == [
        ("RunPodSandbox", pod.name, None),
        ("CreateContainer", pod.name, "app"),
        ("Synchronize", pod.name, "app"),
        ("Synchronize", pod.name, None),
    ]
    assert all(e["event"] == "decision failed, left untouched" for e in errors)
    assert all("ZeroDivisionError" in e["error"] for e in errors)


def test_fail_refuses_a_workload_whose_decision_raises(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    pod = batch_pod()
    break_decisions(monkeypatch)

    async def scenario() -> None:
        async with connected(make_config(tree, failurePolicy="Fail"), nri_version="v0.12.0") as c:
            with pytest.raises(RpcError) as error:
                await c.create(pod, make_container("c-app", pod, "app"))
            assert error.value.code == Code.INTERNAL
            assert "decision failed" in error.value.message
            assert c.plugin.counters.invalid == {"internal": 1}

    run(scenario())


# ---------------------------------------------------------------------------
# Synchronize: containers the runtime reports right but whose files are not
# ---------------------------------------------------------------------------


def settled_batch_pod(
    tree: FakeTree, container_files: Values
) -> tuple[api.PodSandbox, api.Container, MidBatchPlugin]:
    """A batch container the runtime reports at the batch values, its files as given."""
    pod = batch_pod()
    parent = pod.linux.cgroup_parent
    tree.write(parent, Values(512, 100000, 512 * MI))
    tree.write(f"{parent}/c-app", container_files)
    ctr = make_container(
        "c-app", pod, "app", current=resources(shares=512, quota=100_000, memory=512 * MI)
    )
    ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
    return pod, ctr, MidBatchPlugin(make_config(tree), cgroup_files=KERNEL_RULES)


def test_synchronize_repairs_a_container_whose_files_miss_the_reported_values(
    tree: FakeTree,
) -> None:
    """containerd killed mid-update stores the new values first: its next report lies."""
    pod, ctr, plugin = settled_batch_pod(tree, BESTEFFORT)

    async def scenario() -> Sequence[api.ContainerUpdate]:
        response = await plugin.synchronize([pod], [ctr])
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)
        return list(response.update)

    with structlog.testing.capture_logs() as logs:
        assert list(run(scenario())) == []
    assert tree.read(f"{pod.linux.cgroup_parent}/c-app") == Values(512, 100000, 512 * MI)
    assert (plugin.counters.containers_repaired, plugin.counters.container_repairs_failed) == (1, 0)
    (warning,) = [line for line in logs if line["log_level"] == "warning"]
    assert warning["event"].startswith("container cgroup repaired")
    assert (warning["pod"], warning["container"]) == (pod.name, "app")


def test_synchronize_leaves_containers_that_hold_their_values_alone(tree: FakeTree) -> None:
    pod, ctr, plugin = settled_batch_pod(tree, Values(512, 100000, 512 * MI))
    before = tree.snapshot()

    async def scenario() -> None:
        await plugin.synchronize([pod], [ctr])
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)

    run(scenario())
    assert tree.snapshot() == before
    assert (plugin.counters.containers_repaired, plugin.counters.container_repairs_failed) == (0, 0)


def test_synchronize_reads_settled_containers_a_few_to_a_piece_of_work(
    tree: FakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request arriving while a node's containers are checked waits for a piece of the
    pass only (plugin/reconcile/walk.py: `piece_workloads`, or `piece_seconds`)."""
    pods, containers = [], []
    for n in range(10):
        pod = batch_pod(f"batch-{n}")
        parent = pod.linux.cgroup_parent
        tree.write(parent, Values(512, 100000, 512 * MI))
        tree.write(f"{parent}/c-{n}", Values(512, 100000, 512 * MI))
        ctr = make_container(
            f"c-{n}", pod, "app", current=resources(shares=512, quota=100_000, memory=512 * MI)
        )
        ctr.annotations[NATIVE_LIMITS_ANNOTATION] = "{}"
        pods.append(pod)
        containers.append(ctr)
    files = Watched()
    plugin = MidBatchPlugin(
        make_config(tree),
        cgroup_files=files,
        convergence_timings=ConvergenceTimings(piece_workloads=3),
    )
    #: Container cgroups read in each piece of work after the reply.
    pieces: list[int] = []
    queue = plugin.after_reply.defer

    def counted(work: Any, *args: Any) -> None:
        def piece() -> None:
            pieces.append(0)
            work(*args)

        queue(piece)

    monkeypatch.setattr(plugin.after_reply, "defer", counted)

    def read(location: CgroupLocation) -> None:
        if location.container_id is not None:
            pieces[-1] += 1

    files.reading = read

    async def scenario() -> None:
        await plugin.synchronize(pods, containers)
        await asyncio.wait_for(plugin.after_reply.settle(), STEP_TIMEOUT)

    run(scenario())
    assert sum(pieces) == 10
    assert max(pieces) <= 3  # fewer where a piece ran out of time first


def test_a_pod_cgroup_that_already_holds_its_values_is_logged_at_debug(tree: FakeTree) -> None:
    pod, ctr, plugin = new_batch_pod(tree)
    sync_directly(tree, plugin, [pod], [ctr])  # writes the pod's values

    with structlog.testing.capture_logs() as logs:
        sync_directly(tree, plugin, [pod], [ctr])  # a restarted plugin finds them in place

    (line,) = [line for line in logs if line["event"] == "pod cgroup set"]
    assert (line["log_level"], line["unchanged"], line["pod"]) == ("debug", True, pod.name)
    assert plugin.counters.pod_writes_ok == 2


# ---------------------------------------------------------------------------
# cpu-normalization tier
# ---------------------------------------------------------------------------

NORMALIZATION_TIER = {
    "name": "prod",
    "priorityClasses": ["koord-prod", "None"],
    "qosClasses": ["LS", "None"],
    "calculator": "cpu-normalization",
}


def normalizing_config(tree: FakeTree) -> Settings:
    tiers = [*Config().model_dump(mode="json", by_alias=True)["tiers"], NORMALIZATION_TIER]
    return make_config(tree, tiers=tiers, rules={"cpuNormalizationRatio": 1.25})


def test_normalization_claims_only_the_quota(tree: FakeTree) -> None:
    pod = prod_pod("web")
    kubelet = resources(shares=1024, quota=200_000, period=100_000, memory=GI)
    ctr = make_container("c-web", pod, "web", state=api.CONTAINER_CREATED, current=kubelet)

    async def scenario() -> None:
        async with connected(normalizing_config(tree)) as c:
            reply = await c.create(pod, ctr)
            linux = reply.adjust.linux.resources
            # ceil(200000 / 1.25); shares and memory are not claimed (NRI: one owner a field).
            assert linux.cpu.quota.value == 160_000
            assert [f.name for f, _ in linux.cpu.ListFields()] == ["quota"]
            assert not linux.HasField("memory")
            assert c.plugin.counters.adjusted == {("CreateContainer", "cpu_quota"): 1}
            kubelet_limits = (
                '{"cpuQuota":200000,"cpuPeriod":100000,"memoryLimit":1073741824,"cpuShares":1024}'
            )
            assert dict(reply.adjust.annotations) == {NATIVE_LIMITS_ANNOTATION: kubelet_limits}
            # An update is decided from kubelet's requested resources, not scaled twice.
            (update,) = (await c.update(pod, ctr, resources(quota=300_000, period=100_000))).update
            assert update.linux.resources.cpu.quota.value == 240_000
            assert not update.linux.resources.cpu.HasField("shares")

    run(scenario())


def test_normalization_at_synchronize_scales_only_known_kubelet_quotas(tree: FakeTree) -> None:
    pod = prod_pod("web")
    scaled = make_container("c-ours", pod, "web", current=resources(shares=1024, quota=160_000))
    scaled.annotations[NATIVE_LIMITS_ANNOTATION] = '{"cpuQuota":200000,"cpuPeriod":100000}'
    unknown = make_container("c-old", pod, "web", current=resources(shares=1024, quota=200_000))
    off = make_container("c-off", pod, "side", current=resources(shares=512, quota=100_000))
    off.annotations[NATIVE_LIMITS_ANNOTATION] = '{"cpuQuota":100000,"cpuPeriod":100000}'

    async def scenario() -> None:
        async with connected(normalizing_config(tree)) as c:
            reply = await c.sync([pod], [scaled, unknown, off])
            # c-ours already holds ceil(200000/1.25); c-old may already be scaled, so it is
            # left alone; c-off is repaired to ceil(100000/1.25) = 80000, quota only.
            (update,) = reply.update
            assert update.container_id == "c-off"
            assert update.linux.resources.cpu.quota.value == 80_000
            assert not update.linux.resources.cpu.HasField("shares")

    run(scenario())


def test_normalization_writes_only_the_pod_quota_file(tree: FakeTree) -> None:
    pod = prod_pod("web")
    pod.linux.pod_resources.CopyFrom(
        resources(shares=1024, quota=200_000, period=100_000, memory=GI)
    )
    tree.write(pod.linux.cgroup_parent, Values(1024, 200000, GI))

    async def scenario() -> None:
        async with connected(normalizing_config(tree)) as c:
            await c.run_pod_sandbox(pod)

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == Values(1024, 160000, GI)


# ---------------------------------------------------------------------------
# mode: observe
# ---------------------------------------------------------------------------


def test_observe_answers_synchronize_and_updates_with_nothing(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, BESTEFFORT)
    off = make_container("c-app", pod, "app", current=resources(shares=2))

    async def scenario() -> None:
        async with connected(make_config(tree, mode="observe")) as c:
            reply = await c.sync([pod], [off])
            assert list(reply.update) == []
            updated = await c.update(pod, off, resources(shares=2))
            assert list(updated.update) == []
            await c.plugin.after_reply.settle()
            assert c.plugin.counters.observed == {
                ("container", "differs"): 2,
                ("pod", "differs"): 1,
            }
            assert c.plugin.counters.adjusted == {}

    run(scenario())
    assert tree.read(pod.linux.cgroup_parent) == BESTEFFORT


def test_observe_says_same_when_the_values_are_already_there(tree: FakeTree) -> None:
    pod = batch_pod()
    tree.write(pod.linux.cgroup_parent, Values(512, 100000, 512 * MI))
    done = make_container(
        "c-app", pod, "app", current=resources(shares=512, quota=100_000, memory=512 * MI)
    )

    async def scenario() -> None:
        async with connected(make_config(tree, mode="observe")) as c:
            await c.sync([pod], [done])
            await c.plugin.after_reply.settle()
            assert c.plugin.counters.observed == {("container", "same"): 1, ("pod", "same"): 1}

    run(scenario())
