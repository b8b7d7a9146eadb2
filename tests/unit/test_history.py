"""History independence, one defect at a time: values after a transition are what a fresh
plugin under the configuration in force sets from kubelet's values.

Each runs the real App against a loopback runtime and a fake cgroup v1 tree (the harness of
test_app_reload.py); the model-based test (test_history_model.py) walks many such histories.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.config.model import Config
from nri_midbatch.plugin.codec import NATIVE_LIMITS_ANNOTATION
from nri_midbatch.tools.status import status_command
from tests.factory import MI, PRIORITY, SPEC, prod_pod
from tests.fake_cgroups import FakeTree
from tests.oracle.targets import Values

from .app_node import Node, running_node, until
from .nri_fixtures import run

NORMALIZATION = {
    "name": "prod",
    "priorityClasses": ["koord-prod", "None"],
    "qosClasses": ["LS", "None"],
    "calculator": "cpu-normalization",
}
TIERS = [*Config().model_dump(mode="json", by_alias=True)["tiers"], NORMALIZATION]


def resources(shares: int, quota: int, memory: int = 0) -> api.LinuxResources:
    result = api.LinuxResources()
    result.cpu.shares.value = shares
    result.cpu.quota.value = quota
    result.cpu.period.value = 100_000
    if memory:
        result.memory.limit.value = memory
    return result


def web_container(pod: api.PodSandbox, quota: int = 150_000) -> api.Container:
    return api.Container(
        id="c-web",
        pod_sandbox_id=pod.id,
        name="web",
        state=api.CONTAINER_RUNNING,
        linux=api.LinuxContainer(resources=resources(1024, quota)),
    )


async def create(node: Node, pod: api.PodSandbox, ctr: api.Container) -> api.Container:
    """CreateContainer, and the container as the runtime then keeps it (adjustment applied)."""
    reply = await node.call(
        "CreateContainer",
        api.CreateContainerRequest(pod=pod, container=ctr),
        api.CreateContainerResponse,
    )
    kept = api.Container()
    kept.CopyFrom(ctr)
    kept.annotations.update(reply.adjust.annotations)
    if reply.adjust.linux.resources.cpu.HasField("quota"):
        kept.linux.resources.cpu.quota.value = reply.adjust.linux.resources.cpu.quota.value
    return kept


def test_a_restart_under_a_looser_configuration_gives_kubelet_s_values_back(
    tmp_path: Path,
) -> None:
    """Lowered to 75000 under ratio 2 where kubelet allowed 150000; restarted without a ratio,
    the pod and its container are back at 150000, though their files held 75000 (no ratchet)."""
    pod = prod_pod("web")
    parent = pod.linux.cgroup_parent
    state = tmp_path / "state"

    async def first_life() -> api.Container:
        async with running_node(
            tmp_path, state_dir=state, tiers=TIERS, rules={"cpuNormalizationRatio": 2.0}
        ) as node:
            node.tree.write(parent, Values(1536, 150000, 1024 * MI))
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            assert node.tree.read(parent).quota == 75000
            kept = await create(node, pod, web_container(pod))
            assert kept.linux.resources.cpu.quota.value == 75_000
            node.tree.write(parent, Values(1024, 75000, -1), kept.id)
            return kept

    async def second_life(kept: api.Container) -> None:
        async with running_node(
            tmp_path, state_dir=state, tiers=TIERS, synchronized=([pod], [kept])
        ) as node:
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent) == Values(1536, 150000, 1024 * MI)
            assert node.synchronized is not None
            (update,) = node.synchronized.update
            assert update.container_id == kept.id
            assert update.linux.resources.cpu.quota.value == 150_000
            # Given back: nothing of it is the plugin's now, and the record says so.
            assert node.app.plugin.live.known.applied == {}
            assert list(state.iterdir()) == []

    kept = run(first_life())
    assert json.loads(kept.annotations[NATIVE_LIMITS_ANNOTATION])["cpuQuota"] == 150_000
    run(second_life(kept))


def test_a_burstable_pod_stays_within_kubelet_s_limits_through_cfs_quota_off(
    tmp_path: Path,
) -> None:
    """containerd 1.7 sends no pod resources: kubelet's pod limits come from the pod's cgroup
    at RunPodSandbox and stay the bound through a reload to cfsQuota: false."""
    pod = prod_pod("mid")
    pod.labels[PRIORITY] = "koord-mid"
    spec = {"requests": {"kubernetes.io/mid-cpu": "500"}}
    spec["limits"] = {"kubernetes.io/mid-cpu": "1k", "kubernetes.io/mid-memory": "1Gi"}
    pod.annotations[SPEC] = json.dumps({"containers": {"main": spec}})
    parent = pod.linux.cgroup_parent

    async def scenario() -> None:
        async with running_node(tmp_path) as node:
            node.tree.write(parent, Values(512, 50000, 512 * MI))
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            assert node.tree.read(parent) == Values(512, 50000, 512 * MI)
            node.rewrite(rules={"cfsQuota": False})
            await node.watched_reload()
            assert node.tree.read(parent) == Values(512, 50000, 512 * MI)

    run(scenario())


def test_a_burst_of_reloads_ends_on_the_last_file(tmp_path: Path) -> None:
    """60 reloads asked while the file flips between ratio 2 and none, ending on ratio 2."""
    pod = prod_pod("web")
    parent = pod.linux.cgroup_parent

    async def scenario() -> None:
        async with running_node(tmp_path, watch=False, tiers=TIERS) as node:
            node.tree.write(parent, Values(1536, 150000, 1024 * MI))
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            ctr = await create(node, pod, web_container(pod))
            node.tree.write(parent, Values(1024, 150000, -1), ctr.id)
            reloads = []
            for n in range(60):
                rules = {"cpuNormalizationRatio": 2.0} if n % 2 else {}
                node.rewrite(tiers=TIERS, rules=rules)
                reloads.append(asyncio.create_task(node.app.reload("SIGHUP")))
                await asyncio.sleep(0)
            await asyncio.gather(*reloads)
            assert node.tree.read(parent).quota == 75000
            assert node.tree.read(parent, ctr.id).quota == 75000
            # Served in few passes, not 60.
            assert sum(node.app.reloads.values()) < 60

    run(scenario())


def test_a_resize_moves_the_pod_level_too(tmp_path: Path) -> None:
    """UpdateContainer raising a normalized container's limit rescales its pod as well."""
    pod = prod_pod("web")
    parent = pod.linux.cgroup_parent

    async def scenario() -> None:
        async with running_node(
            tmp_path, tiers=TIERS, rules={"cpuNormalizationRatio": 2.0}
        ) as node:
            node.tree.write(parent, Values(1024, 150000, -1))
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            ctr = await create(node, pod, web_container(pod))
            assert node.tree.read(parent).quota == 75000
            reply = await node.call(
                "UpdateContainer",
                api.UpdateContainerRequest(
                    pod=pod, container=ctr, linux_resources=resources(1024, 300_000)
                ),
                api.UpdateContainerResponse,
            )
            (update,) = reply.update
            assert update.linux.resources.cpu.quota.value == 150_000
            await until(lambda: node.tree.read(parent).quota == 150000, "pod rescaled")

    run(scenario())


def test_the_pod_overhead_is_part_of_kubelet_s_pod_quota(tmp_path: Path) -> None:
    """containerd 2.x tells pod resources and overhead apart; kubelet's pod quota is both."""
    pod = prod_pod(
        "web",
        pod_resources=resources(1024, 100_000),
        pod_overhead=resources(0, 10_000),
    )
    parent = pod.linux.cgroup_parent
    FakeTree(tmp_path / "cgroup").write(parent, Values(1024, 110000, -1))

    async def scenario() -> None:
        async with running_node(
            tmp_path,
            runtime_version="v2.1.9",
            nri_version="v0.8.0",
            tiers=TIERS,
            rules={"cpuNormalizationRatio": 2.0},
            synchronized=([pod], []),
        ) as node:
            await node.app.plugin.after_reply.settle()
            assert node.tree.read(parent).quota == 55000

    run(scenario())


def test_status_shows_kubelet_s_values_the_target_and_drift(tmp_path: Path) -> None:
    """`nri-midbatch status` against a running App: a drift appears when a file is changed
    behind the plugin's back, and the exit status says so."""
    pod = prod_pod("web", name="web")
    parent = pod.linux.cgroup_parent
    socket_path = tmp_path / "status.sock"

    async def ask() -> tuple[int, dict[str, Any], str]:
        out, err = io.StringIO(), io.StringIO()
        code = await asyncio.to_thread(status_command, socket_path, fmt="json", out=out, err=err)
        table = io.StringIO()
        await asyncio.to_thread(status_command, socket_path, fmt="table", out=table, err=err)
        return code, json.loads(out.getvalue()), table.getvalue()

    async def scenario() -> None:
        async with running_node(
            tmp_path,
            tiers=TIERS,
            rules={"cpuNormalizationRatio": 2.0},
            status_socket=socket_path,
        ) as node:
            assert socket_path.stat().st_mode & 0o077 == 0  # root's only
            node.tree.write(parent, Values(1536, 150000, 1024 * MI))
            await node.state_change(api.RUN_POD_SANDBOX, pod)
            ctr = await create(node, pod, web_container(pod))
            node.tree.write(parent, Values(1024, 75000, -1), ctr.id)
            code, document, table = await ask()
            assert code == 0
            pod_row, ctr_row = document["workloads"]
            assert pod_row["kubelet"] == {
                "cpu_shares": 1536,
                "cpu_quota": 150_000,
                "memory_limit": 1024 * MI,
            }
            assert pod_row["target"] == {"cpu_quota": 75_000}
            assert pod_row["now"]["cpu_quota"] == 75_000 and pod_row["drift"] is False
            assert ctr_row["container"] == "web" and ctr_row["tier"] == "prod"
            assert ctr_row["kubelet"]["cpu_quota"] == 150_000
            assert "default/web/web" in table and "0 drifting" in table
            node.tree.write(parent, Values(1024, 60000, -1), ctr.id)  # behind our back
            code, document, table = await ask()
            assert code == 1
            assert [w["drift"] for w in document["workloads"]] == [False, True]
            assert "DRIFT" in table

    run(scenario())


def test_status_without_a_plugin_says_so(tmp_path: Path) -> None:
    err = io.StringIO()
    assert status_command(tmp_path / "none.sock", fmt="table", out=io.StringIO(), err=err) == 2
    assert "none.sock" in err.getvalue()
