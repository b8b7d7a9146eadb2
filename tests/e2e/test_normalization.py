"""The cpu-normalization tier on a real containerd: prod LS scaled, Mid+LS once, batch alone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess, wait_until
from tests.e2e.pods import NORMALIZATION_CONFIG, run, run_batch, spec
from tests.factory import GI, MI, SPEC, labels


@pytest.fixture
def plugin(containerd: Containerd, tmp_path: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config=NORMALIZATION_CONFIG)
    process.wait_for("synchronized")
    yield process
    assert process.stop() == 0


def decisions(plugin: PluginProcess, pod: str) -> list[tuple[str, str]]:
    return [
        (r["method"], r["tier"])
        for r in plugin.records()
        if r.get("event") == "decision" and r.get("pod") == pod
    ]


def test_prod_ls_quota_is_scaled_and_nothing_else(
    containerd: Containerd, plugin: PluginProcess
) -> None:
    native = {
        "cpu_shares": 1536,
        "cpu_period": 100000,
        "cpu_quota": 200000,
        "memory_limit_in_bytes": 512 * MI,
    }
    pod = run(containerd, "prod", "burstable", labels("LS", "koord-prod"), {}, native)
    # ceil(200000 / 1.25); kubelet's shares and memory limit stay.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1536, 160000, 512 * MI)
    assert ("CreateContainer", "prod") in decisions(plugin, "prod")

    # kubelet resizes the container: the new quota is scaled, once.
    containerd.update_container_resources(pod.container_id, {**native, "cpu_quota": 300000})
    assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id).quota == 240000), (
        NODE.read_values(pod.parent, pod.container_id)
    )


def test_a_pod_without_koordinator_labels_is_scaled(
    containerd: Containerd, plugin: PluginProcess
) -> None:
    native = {"cpu_shares": 512, "cpu_period": 100000, "cpu_quota": 50000}
    pod = run(containerd, "plain", "burstable", {}, {}, native)
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 40000, -1)


def test_mid_ls_is_scaled_once(containerd: Containerd, plugin: PluginProcess) -> None:
    native = {
        "cpu_shares": 1024,
        "cpu_period": 100000,
        "cpu_quota": 800000,
        "memory_limit_in_bytes": 2 * GI,
    }
    pod = run(
        containerd,
        "mid-ls",
        "burstable",
        labels("LS", "koord-mid"),
        {SPEC: spec("mid", "1k", "4k", "1Gi")},
        native,
    )
    # The mid formula: ceil(400000 / 1.25) = 320000. Scaled again it would be 256000.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1024, 320000, GI)
    assert set(decisions(plugin, "mid-ls")) == {("CreateContainer", "mid")}


def test_batch_is_untouched_by_normalization(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run_batch(containerd, "batch")
    # The batch formula with its own ratio, as koordlet: ceil(100000 / 1.25) = 80000.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 80000, 512 * MI)
    assert NODE.read_values(pod.parent, None) == NODE.expect(512, 80000, 512 * MI)
    assert {tier for _, tier in decisions(plugin, "batch")} == {"batch"}
