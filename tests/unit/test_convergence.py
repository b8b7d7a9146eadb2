"""Issue 34: exact values whoever wrote last (plugin/reconcile/).

Kubelet writes a pod's cgroup after the plugin when a resize lowers it (and, from
kubernetes#137555, right after every UpdatePodSandbox); anyone else may write any file at any
time. Each test drives the real App through the containerd-like fake runtime
(history_harness.py) and compares the files with the oracle (tests/oracle). The plugin's
re-checks and passes are run explicitly (`recheck`, `converge`), as their time would.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from nri_midbatch.api import nri_pb2 as api
from nri_midbatch.cgroups.values import runtime_cpu_weights
from nri_midbatch.config.compile import settings_of
from nri_midbatch.config.model import load_config_text
from nri_midbatch.nri.events import Event
from nri_midbatch.plugin import handlers
from nri_midbatch.plugin.handlers import MidBatchPlugin
from nri_midbatch.plugin.reconcile import ConvergenceTimings
from nri_midbatch.policy import NativeLimits
from nri_midbatch.process.status import _rows, _workloads
from nri_midbatch.rpc.errors import RpcError
from tests import factory
from tests.factory import APP_MID, model_pod
from tests.fake_cgroups import KERNEL_RULES, FakeTree
from tests.oracle.model import MI, Config, ContainerModel, Kind, Native, PodModel
from tests.oracle.targets import Values, kubelet_pod

from .history_harness import (
    CONTAINERD_1_7,
    CONTAINERD_2,
    RECHECKS_ON_CUE,
    HistoryNode,
    RuntimeFlavour,
    start_node,
    validate_in_process,
)
from .nri_fixtures import run

FLAVOURS = pytest.mark.parametrize(
    "flavour", [CONTAINERD_2, CONTAINERD_1_7], ids=["containerd-2", "containerd-1.7"]
)


@pytest.fixture(autouse=True)
def _validated_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    validate_in_process(monkeypatch)


async def node_with(
    tmp_path: Path,
    flavour: RuntimeFlavour,
    config: Config,
    pod: PodModel,
    version: int = 1,
    timings: ConvergenceTimings = RECHECKS_ON_CUE,
) -> HistoryNode:
    node = await start_node(
        tmp_path,
        cgroup_version=version,
        flavour=flavour,
        config=config,
        convergence_timings=timings,
    )
    await node.run_pod(pod)
    for container in pod.containers:
        assert await node.create(pod.id, container.name) == []
    assert node.mismatches() == []
    return node


HALF_A_CPU = Native(cpu_request=500, cpu_limit=500, memory_limit=512 * MI)


async def lowered_kubelet_last(
    tmp_path: Path, flavour: RuntimeFlavour, config: Config, pod: PodModel, *, whole: bool = False
) -> tuple[Values, Values, list[str]]:
    """The pod's only container resized to HALF_A_CPU, kubelet's pod write after the plugin's
    (its order for a decrease; `whole`: all three values): the pod's files after kubelet's
    write, at the end, and how they differ from the oracle after the plugin's re-checks."""
    node = await node_with(tmp_path, flavour, config, pod)
    before, after = node.pods[pod.id], pod.resized("app", HALF_A_CPU)
    node.pods[pod.id] = after
    await node.containerd.resize(before, after, "app", pod_first=False)
    await node.settle()  # the plugin's own pod write, after its reply
    node.containerd.kubelet_pod_write(before, after, whole=whole)  # then kubelet's
    kubelets = node.tree.read(pod.cgroup_parent)
    await node.recheck()
    wrong = node.mismatches()
    await node.stop_plugin()
    return kubelets, node.tree.read(pod.cgroup_parent), wrong


@FLAVOURS
def test_a_resize_that_lowers_a_normalized_pod_ends_on_the_normalized_pod_quota(
    tmp_path: Path, flavour: RuntimeFlavour
) -> None:
    """Defect 1: CPU limit 1 -> 0.5 under ratio 1.2; kubelet writes the pod's 50000 after the
    plugin's 41667 (its order for a decrease). Before this, the pod kept 50000."""
    pod = model_pod(Kind.NORMALIZED_LS)

    config = Config(ratio="1.2", normalization_tier=True)
    kubelets, final, wrong = run(lowered_kubelet_last(tmp_path, flavour, config, pod))
    assert kubelets.quota == 50_000
    assert final.quota == 41_667  # ceil(50000 / 1.2)
    assert wrong == []


@FLAVOURS
def test_a_lowered_pod_quota_cgroup_v1_refused_after_the_reply_is_written_at_the_recheck(
    tmp_path: Path, flavour: RuntimeFlavour
) -> None:
    """CPU limit 1 -> 0.5 under ratio 1.2 on cgroup v1: the plugin's pod write right after its
    UpdateContainer reply comes before the runtime lowers the container, and the kernel
    refuses a pod quota below the container's (EINVAL). The pod's re-check writes it again
    (commit 5fd3217); before, the pod kept its old 83334 until something else moved it."""
    pod = model_pod(Kind.NORMALIZED_LS)
    config = Config(ratio="1.2", normalization_tier=True)

    async def scenario() -> tuple[Values, Values, list[str]]:
        node = await node_with(tmp_path, flavour, config, pod)
        before, after = node.pods[pod.id], pod.resized("app", HALF_A_CPU)
        node.pods[pod.id] = after
        await node.containerd.resize(before, after, "app", pod_first=False)
        await node.settle()  # the plugin's pod write after its reply: refused
        refused = node.tree.read(pod.cgroup_parent)
        await node.recheck()  # kubelet has not written the pod: only the plugin's re-check
        final = node.tree.read(pod.cgroup_parent)
        wrong = [w for w in node.mismatches() if "quota" in w]
        await node.stop_plugin()
        return refused, final, wrong

    refused, final, wrong = run(scenario())
    assert refused.quota == 83_334  # ceil(100000 / 1.2), as before the resize
    assert final.quota == 41_667  # ceil(50000 / 1.2)
    assert wrong == []


@FLAVOURS
def test_a_resize_that_lowers_a_mid_pod_ends_on_the_mid_pod_shares(
    tmp_path: Path, flavour: RuntimeFlavour
) -> None:
    """Defect 1: the container's CPU limit 1000 -> 500; kubelet writes its whole pod config
    after the plugin, shares 512 among it. Before this, the pod kept 512, not the tier's 1536."""
    pod = model_pod(Kind.MID_LS)

    scenario = lowered_kubelet_last(tmp_path, flavour, Config(), pod, whole=True)
    kubelets, final, wrong = run(scenario)
    assert kubelets.shares == 512
    assert final.shares == 1536
    assert wrong == []


def test_kubelets_pod_write_right_after_update_pod_sandbox_is_put_back(tmp_path: Path) -> None:
    """Defect 2 (kubernetes#137555): UpdatePodSandbox comes before kubelet's pod write, for an
    increase too; the plugin's values written at UpdatePodSandbox are overwritten at once."""
    pod = model_pod(Kind.NORMALIZED_LS)
    bigger = Native(cpu_request=1000, cpu_limit=2000, memory_limit=512 * MI)

    async def scenario() -> tuple[int, list[str]]:
        node = await node_with(
            tmp_path, CONTAINERD_2, Config(ratio="1.2", normalization_tier=True), pod
        )
        wrong = await node.resize(pod.id, "app", bigger, order="sandbox")
        await node.stop_plugin()
        return node.tree.read(pod.cgroup_parent).quota, wrong

    final, wrong = run(scenario())
    assert final == 166_667  # ceil(200000 / 1.2), not kubelet's 200000
    assert wrong == []


@pytest.mark.parametrize("version", [1, 2], ids=["cgroup-v1", "cgroup-v2"])
def test_a_foreign_write_to_a_pod_and_a_container_is_put_back_counted_and_shown(
    tmp_path: Path, version: int
) -> None:
    """Defect 5: anyone else's write lasted until the next Synchronize."""
    pod = model_pod(Kind.MID_LS)

    async def scenario() -> tuple[list[str], list[str], HistoryNode, dict[str, object]]:
        node = await node_with(tmp_path, CONTAINERD_2, Config(), pod, version)
        container_path = f"{pod.cgroup_parent}/{pod.id}-app"
        node.foreign_write(pod.cgroup_parent, Values(2048, 300_000, 4096 * MI), ("quota",))
        node.foreign_write(container_path, Values(2048, 300_000, 4096 * MI), ("quota", "memory"))
        drifting = node.mismatches()
        await node.converge()
        assert node.app is not None
        plugin = node.app.plugin
        document: dict[str, object] = {
            "workloads": list(
                _workloads(
                    plugin.live, _rows(plugin.live, plugin.reconcile, plugin.live.known.pods)
                )
            )
        }
        wrong = node.mismatches()
        await node.stop_plugin()
        return drifting, wrong, node, document

    drifting, wrong, node, document = run(scenario())
    assert any(w.startswith("pod mid:") for w in drifting)
    assert any(w.startswith("container mid-app:") for w in drifting)
    assert wrong == []
    assert node.app is None
    workloads = document["workloads"]
    assert isinstance(workloads, list)
    pod_row = next(w for w in workloads if w["level"] == "pod")
    assert pod_row["checked_at"] > 0
    assert pod_row["last_drift"]["writer"] == "unknown"
    assert pod_row["last_drift"]["repaired"] is True
    assert all(w["drift"] is False for w in workloads)


def test_kubelets_resize_write_counts_as_kubelets(tmp_path: Path) -> None:
    """A pod value found at kubelet's known value is kubelet's write, not anyone's."""
    pod = model_pod(Kind.MID_LS)

    async def scenario() -> dict[tuple[str, str], int]:
        node = await node_with(tmp_path, CONTAINERD_2, Config(), pod)
        node.foreign_write(pod.cgroup_parent, kubelet_pod(pod), ("shares",))
        await node.converge()
        assert node.app is not None
        found = dict(node.app.plugin.counters.drift_found)
        assert node.mismatches() == []
        await node.stop_plugin()
        return found

    found = run(scenario())
    assert found[("pod", "kubelet")] == 1
    assert found[("pod", "unknown")] == found[("container", "unknown")] == 0


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
def test_update_pod_sandbox_is_refused_only_under_failure_policy_fail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str
) -> None:
    """From kubernetes#137555 an error from UpdatePodSandbox blocks kubelet's resize."""
    tree = FakeTree(tmp_path / "cgroup")
    document = {"cgroups": {"root": str(tree.root)}, "failurePolicy": policy}
    settings = settings_of(load_config_text(json.dumps(document), "test"))
    plugin = MidBatchPlugin(settings, cgroup_files=KERNEL_RULES)
    sandbox = factory.pod("mid", qos="LS", priority="koord-mid", annotation=factory.mid_spec())
    tree.write(sandbox.linux.cgroup_parent, Values(1024, 200_000, 1024 * MI))

    def broken(*_: object) -> NativeLimits:
        raise RuntimeError("a bug")

    monkeypatch.setattr(handlers, "told_pod_baseline", broken)

    async def scenario() -> None:
        await plugin.pod_event(Event.RUN_POD_SANDBOX, sandbox)
        resources = factory.resources(shares=512, quota=100_000, memory=512 * MI)
        await plugin.update_pod_sandbox(sandbox, api.LinuxResources(), resources)

    if policy == "Fail":
        with pytest.raises(RpcError):
            run(scenario())
    else:
        run(scenario())
    assert plugin.counters.invalid["internal"] == 1


def test_a_reload_does_not_wait_for_a_whole_pass(tmp_path: Path) -> None:
    """A reload first lets the work after replies settle: a pass yields between its pieces."""
    pod = model_pod(Kind.MID_LS)
    one = replace(RECHECKS_ON_CUE, piece_workloads=1)  # the pod, then its container

    async def scenario() -> tuple[bool, bool]:
        node = await node_with(tmp_path, CONTAINERD_2, Config(), pod, timings=one)
        assert node.app is not None
        plugin = node.app.plugin
        passing = asyncio.create_task(plugin.reconcile.converge())
        await asyncio.sleep(0)
        await plugin.after_reply.settle()
        settled_first = not passing.done()
        await passing
        await node.stop_plugin()
        return settled_first, passing.done()

    assert run(scenario()) == (True, True)


def test_a_containers_cgroup_v2_weight_is_compared_with_the_runtimes_conversions(
    tmp_path: Path,
) -> None:
    """issue-34-left: a container's cpu.weight on cgroup v2 was not compared. A weight that
    no runtime writes for the container's shares is put back; runc 1.3's is held."""
    pod = model_pod(Kind.MID_LS)
    container_path = f"{pod.cgroup_parent}/{pod.id}-app"

    async def scenario() -> tuple[str, str, dict[tuple[str, str], int], list[str]]:
        node = await node_with(tmp_path, CONTAINERD_2, Config(), pod, version=2)
        weight_file = node.tree.directory("cpu", container_path) / "cpu.weight"
        plugins = weight_file.read_text().strip()
        linear, runc_1_3 = runtime_cpu_weights(1536)  # the tier's shares: 1500m of mid-cpu
        assert int(plugins) == linear != runc_1_3
        weight_file.write_text(f"{runc_1_3}\n")
        await node.converge()
        held = weight_file.read_text().strip()
        weight_file.write_text("7\n")  # anyone else's
        await node.converge()
        assert node.app is not None
        found = dict(node.app.plugin.counters.drift_found)
        wrong = node.mismatches()
        repaired = weight_file.read_text().strip()
        await node.stop_plugin()
        return held, repaired, found, [plugins, str(runc_1_3), *wrong]

    held, repaired, found, (plugins, runc_1_3, *wrong) = run(scenario())
    assert held == runc_1_3
    assert repaired == plugins
    assert found[("container", "unknown")] == 1
    assert wrong == []


async def run_trigger(node: HistoryNode, trigger: str) -> None:
    """Run the one pass (plugin/reconcile/) through one of its triggers."""
    assert node.app is not None
    if trigger == "period":
        await node.converge()
    elif trigger == "synchronize":
        await node.synchronize()
    else:  # a SIGHUP with the file unchanged
        await node.reload(node.config)
        await node.app.plugin.reconcile.through()
        await node.settle()


TRIGGERS = ("period", "synchronize", "reload")


@pytest.mark.parametrize("version", [1, 2], ids=["cgroup-v1", "cgroup-v2"])
def test_the_same_drift_is_repaired_the_same_way_whichever_trigger_runs_the_pass(
    tmp_path: Path, version: int
) -> None:
    """Issue 34 item 5: the reload, the Synchronize and the period run one pass. Before, a
    SIGHUP with the file unchanged left anyone else's write in place (defect 1)."""
    pod = model_pod(Kind.MID_LS)
    container_path = f"{pod.cgroup_parent}/{pod.id}-app"

    async def scenario(trigger: str) -> tuple[Values, Values, list[str], list[str]]:
        node = await node_with(tmp_path / trigger, CONTAINERD_2, Config(), pod, version)
        node.foreign_write(pod.cgroup_parent, Values(2048, 300_000, 4096 * MI), ("quota",))
        node.foreign_write(container_path, Values(2048, 300_000, 4096 * MI), ("quota", "memory"))
        drifting = node.mismatches()
        await run_trigger(node, trigger)
        files = node.tree.read(pod.cgroup_parent), node.tree.read(container_path)
        wrong = node.mismatches()
        await node.stop_plugin()
        return *files, drifting, wrong

    outcomes = {trigger: run(scenario(trigger)) for trigger in TRIGGERS}
    for trigger, (_, _, drifting, wrong) in outcomes.items():
        assert {w.split(":")[0] for w in drifting} == {"pod mid", "container mid-app"}, trigger
        assert wrong == [], trigger
    assert len({(pod_files, ctr_files) for pod_files, ctr_files, _, _ in outcomes.values()}) == 1


@pytest.mark.parametrize("trigger", TRIGGERS)
def test_each_trigger_raises_a_pod_before_its_container_on_cgroup_v1(
    tmp_path: Path, trigger: str
) -> None:
    """Someone lowered a container's quota, then its pod's: cgroup v1 (the fake tree as the
    kernel) refuses the container's quota back above its pod's until the pod is raised."""
    pod = model_pod(Kind.MID_LS)
    container_path = f"{pod.cgroup_parent}/{pod.id}-app"

    async def scenario() -> tuple[list[str], list[str]]:
        node = await node_with(tmp_path, CONTAINERD_2, Config(), pod, 1)
        low = Values(2048, 10_000, 4096 * MI)
        node.foreign_write(container_path, low, ("quota",))
        node.foreign_write(pod.cgroup_parent, low, ("quota",))
        drifting = node.mismatches()
        await run_trigger(node, trigger)
        wrong = node.mismatches()
        await node.stop_plugin()
        return drifting, wrong

    drifting, wrong = run(scenario())
    assert {w.split(":")[0] for w in drifting} == {"pod mid", "container mid-app"}
    assert wrong == []


HALF_GI = Native(cpu_request=500, cpu_limit=1000, memory_limit=512 * MI)
REQUEST_ONLY = Native(cpu_request=250)


@pytest.mark.parametrize("version", [1, 2], ids=["cgroup-v1", "cgroup-v2"])
def test_a_pod_whose_baseline_was_never_read_takes_kubelets_limit_written_after_a_resize(
    tmp_path: Path, version: int
) -> None:
    """A history the model found (issue 34): on containerd 1.7 (no pod resources told) no
    tier claims a mid pod at its RunPodSandbox, so the plugin never reads its baseline; a
    container's memory limit goes 512Mi -> 2Gi, kubelet writing the pod's limit after the
    container's. Before, the plugin read the pod cgroup after its reply, before that write,
    and kept the old limit as kubelet's: the mid tier, turned on later, was capped by it."""
    pod = PodModel(
        "mid",
        Kind.MID_LS,
        (ContainerModel("app", APP_MID, HALF_GI), ContainerModel("side", APP_MID, HALF_GI)),
    )
    bigger = Native(cpu_request=1000, cpu_limit=4000, memory_limit=2048 * MI)

    async def scenario() -> tuple[int, list[str], list[str]]:
        node = await node_with(tmp_path, CONTAINERD_1_7, Config(mid_tier=False), pod, version)
        resized = await node.resize(pod.id, "app", bigger, "pod-after")
        kubelets = node.tree.read(pod.cgroup_parent).memory
        await node.reload(Config())
        wrong = node.mismatches()
        await node.stop_plugin()
        return kubelets, resized, wrong

    kubelets, resized, wrong = run(scenario())
    assert kubelets == kubelet_pod(pod.resized("app", bigger)).memory == 2560 * MI
    assert resized == []
    assert wrong == []


@pytest.mark.parametrize("version", [1, 2], ids=["cgroup-v1", "cgroup-v2"])
def test_a_resize_of_a_pod_kubelet_leaves_unlimited_never_takes_the_plugins_values(
    tmp_path: Path, version: int
) -> None:
    """A history the model found (issue 34): on containerd 2.x a mid pod whose containers
    have no limits, which kubelet leaves unlimited, holds the mid tier's values; its one
    created container gets limits (the other, not created yet, has none). The plugin guessed
    the pod newly limited and read its cgroup back: before, it took its own values there as
    kubelet's, and a reload into observe mode left them in place of kubelet's unlimited."""
    pod = PodModel(
        "mid",
        Kind.MID_LS,
        (
            ContainerModel("app", APP_MID, REQUEST_ONLY),
            ContainerModel("side", APP_MID, REQUEST_ONLY),
        ),
        Native(cpu_request=250, cpu_limit=250, memory_limit=64 * MI),
    )

    async def scenario() -> tuple[list[str], list[str]]:
        node = await start_node(
            tmp_path, cgroup_version=version, flavour=CONTAINERD_2, config=Config()
        )
        await node.run_pod(pod)
        assert await node.create(pod.id, "app") == []
        resized = await node.resize(pod.id, "app", HALF_GI, "pod-after")
        await node.reload(Config(observe=True))
        wrong = node.mismatches()
        await node.stop_plugin()
        return resized, wrong

    resized, wrong = run(scenario())
    assert resized == []
    assert wrong == []
