"""Pods of every tier on a real containerd: the cgroup files hold the tier's values."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess, wait_until

SPEC = "node.koordinator.sh/extended-resource-spec"
MIB = 1024 * 1024
GIB = 1024 * MIB


def spec(tier: str, request_cpu: str, limit_cpu: str, limit_memory: str) -> str:
    return json.dumps(
        {
            "containers": {
                "main": {
                    "requests": {f"kubernetes.io/{tier}-cpu": request_cpu},
                    "limits": {
                        f"kubernetes.io/{tier}-cpu": limit_cpu,
                        f"kubernetes.io/{tier}-memory": limit_memory,
                    },
                }
            }
        }
    )


def labels(qos: str, priority: str) -> dict[str, str]:
    return {"koordinator.sh/qosClass": qos, "koordinator.sh/priority-class": priority}


@dataclass
class Pod:
    parent: str
    pod_id: str
    container_id: str


def run(
    containerd: Containerd,
    name: str,
    qos_dir: str,
    pod_labels: dict[str, str],
    annotations: dict[str, str],
    resources: dict[str, int],
) -> Pod:
    parent = NODE.new_cgroup_parent(qos_dir)
    pod_id = containerd.run_pod(
        name,
        uid=str(uuid.uuid4()),
        labels=pod_labels,
        annotations=annotations,
        cgroup_parent=parent,
    )
    container_id = containerd.create_container(pod_id, name="main", resources=resources)
    containerd.start_container(container_id)
    return Pod(parent, pod_id, container_id)


BE_NATIVE = {"cpu_shares": 2}  # what kubelet gives a BestEffort container


@pytest.fixture
def plugin(containerd: Containerd, tmp_path: Path) -> Iterator[PluginProcess]:
    process = PluginProcess(tmp_path / "plugin", containerd.nri_socket)
    process.wait_for("synchronized")
    yield process
    assert process.stop() == 0


def test_batch_be_pod_gets_batch_values(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run(
        containerd,
        "batch",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: spec("batch", "500", "1k", "512Mi")},
        BE_NATIVE,
    )
    # Koordinator: request 500 -> shares 512; limit 1000 -> quota 100000.
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 100000, 512 * MIB)
    assert NODE.read_values(pod.parent, None) == NODE.expect(512, 100000, 512 * MIB)


def test_mid_be_pod_gets_mid_values(containerd: Containerd, plugin: PluginProcess) -> None:
    pod = run(
        containerd,
        "mid-be",
        "besteffort",
        labels("BE", "koord-mid"),
        {SPEC: spec("mid", "2k", "4k", "1Gi")},
        BE_NATIVE,
    )
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(2048, 400000, GIB)
    assert NODE.read_values(pod.parent, None) == NODE.expect(2048, 400000, GIB)


def test_mid_ls_pod_never_loosens_native_limits(
    containerd: Containerd, plugin: PluginProcess
) -> None:
    native = {
        "cpu_shares": 512,
        "cpu_period": 100000,
        "cpu_quota": 50000,
        "memory_limit_in_bytes": 512 * MIB,
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
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(1024, 50000, 512 * MIB)


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
    pod = run(
        containerd,
        "batch-upd",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: spec("batch", "500", "1k", "512Mi")},
        BE_NATIVE,
    )
    # A kubelet-style update with native values: the tier values are reapplied,
    # on the container that is being updated.
    containerd.update_container_resources(pod.container_id, {"cpu_shares": 2})
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(512, 100000, 512 * MIB)


def test_containers_created_while_plugin_was_away_are_corrected(
    containerd: Containerd, tmp_path: Path
) -> None:
    pod = run(
        containerd,
        "early",
        "besteffort",
        labels("BE", "koord-batch"),
        {SPEC: spec("batch", "500", "1k", "512Mi")},
        BE_NATIVE,
    )
    assert NODE.read_values(pod.parent, pod.container_id) == NODE.expect(2, -1, -1)
    process = PluginProcess(tmp_path / "late-plugin", containerd.nri_socket)
    try:
        process.wait_for("synchronized")
        expected = NODE.expect(512, 100000, 512 * MIB)
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
