"""Pods of every tier on a real containerd: the cgroup files hold the tier's values."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess, wait_until
from tests.e2e.pods import BE_NATIVE, run, run_batch, spec
from tests.factory import GI, MI, SPEC, labels


@pytest.fixture
def plugin(containerd: Containerd, tmp_path: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    process.wait_for("synchronized")
    yield process
    assert process.stop() == 0


def test_batch_be_pod_gets_batch_values(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run_batch(containerd, "batch")
    # Koordinator: request 500 -> shares 512; limit 1000 -> quota 100000.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 100000, 512 * MI)
    assert NODE.read_values(pod.parent, None) == NODE.expect(512, 100000, 512 * MI)


def test_mid_be_pod_gets_mid_values(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run(
        containerd,
        "mid-be",
        "besteffort",
        labels("BE", "koord-mid"),
        {SPEC: spec("mid", "2k", "4k", "1Gi")},
        BE_NATIVE,
    )
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(2048, 400000, GI)
    assert NODE.read_values(pod.parent, None) == NODE.expect(2048, 400000, GI)


def test_mid_ls_pod_never_loosens_native_limits(
    containerd: Containerd, plugin: PluginProcess
) -> None:
    native = {
        "cpu_shares": 512,
        "cpu_period": 100000,
        "cpu_quota": 50000,
        "memory_limit_in_bytes": 512 * MI,
    }
    pod = run(
        containerd,
        "mid-ls",
        "burstable",
        labels("LS", "koord-mid"),
        {SPEC: spec("mid", "1k", "2k", "1Gi")},
        native,
    )
    # The tier asks quota 200000 and 1 GiB; kubelet's tighter limits stay.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1024, 50000, 512 * MI)


def test_prod_pod_is_left_alone(containerd: Containerd, plugin: PluginProcess) -> None:
    native = {"cpu_shares": 1536, "cpu_period": 100000, "cpu_quota": 150000}
    pod = run(containerd, "prod", "burstable", labels("LS", "koord-prod"), {}, native)
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1536, 150000, -1)
    assert not [r for r in plugin.records() if r.get("pod") == "prod" and r["event"] == "decision"]


def test_malformed_annotation_leaves_container_untouched_and_is_logged(
    containerd: Containerd, plugin: PluginProcess
) -> None:
    pod = run(
        containerd,
        "broken",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: '{"containers": {"main": {"limits": {"kubernetes.io/batch-cpu": "1.2.3"}}}}'},
        BE_NATIVE,
    )
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(2, -1, -1)
    warnings = [r for r in plugin.records() if r.get("pod") == "broken" and r["level"] == "warning"]
    # Once for the pod cgroup at RunPodSandbox, once for the container.
    assert [(w["method"], w.get("container")) for w in warnings] == [
        ("RunPodSandbox", None),
        ("CreateContainer", "main"),
    ]
    assert all("1.2.3" in w["reason"] for w in warnings)


def test_update_container_keeps_tier_values(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run_batch(containerd, "batch-upd")
    # A kubelet-style update with native values: the tier values are reapplied,
    # on the container that is being updated.
    containerd.update_container_resources(pod.container_id, {"cpu_shares": 2})
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 100000, 512 * MI)


def test_containers_created_while_plugin_was_away_are_corrected(
    containerd: Containerd, tmp_path: Path
) -> None:
    pod = run_batch(containerd, "early")
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(2, -1, -1)
    process = PluginProcess(tmp_path / "late-plugin", containerd.nri_socket)
    try:
        process.wait_for("synchronized")
        expected = NODE.expect(512, 100000, 512 * MI)
        # containerd applies the container's update once it has our reply,
        # and the plugin writes the pod's cgroup after that reply too.
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id) == expected), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert wait_until(lambda: NODE.read_values(pod.parent, None) == expected), NODE.read_values(
            pod.parent, None
        )
    finally:
        assert process.stop() == 0
