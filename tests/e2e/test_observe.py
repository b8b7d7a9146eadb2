"""mode: observe on a real containerd: decided and reported, nothing set; a reload enforces."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.containerd import Containerd
from tests.e2e.node import NODE
from tests.e2e.plugin_process import PluginProcess, scrape, wait_until
from tests.e2e.pods import run_batch
from tests.factory import MI


def test_observe_then_a_reload_to_enforce(containerd: Containerd, tmp_path: Path) -> None:
    applied = NODE.expect(512, 100000, 512 * MI)
    plugin = PluginProcess(tmp_path / "plugin", containerd.nri_socket, config="mode: observe\n")
    config = tmp_path / "plugin" / "config.yaml"
    try:
        plugin.wait_for("synchronized")
        port = plugin.metrics_port()
        pod = run_batch(containerd, "batch")
        # What kubelet and the runtime gave it, untouched.
        container_before = NODE.read_values(pod.parent, pod.container_id)
        pod_before = NODE.read_values(pod.parent, None)
        assert container_before.quota == -1 and container_before.memory == -1
        assert container_before != applied and pod_before != applied

        index, would = plugin.wait_for("would set")
        assert would["method"] == "RunPodSandbox"
        _, would = plugin.wait_for("would set", after=index + 1)
        assert (would["method"], would["container"]) == ("CreateContainer", "main")
        assert would["changes"]["cpu_quota"] == [-1, 100000]
        assert scrape(port, "nri_midbatch_observed_total", level="container", result="differs") == 1
        assert scrape(port, "nri_midbatch_mode", mode="observe") == 1

        config.write_text(NODE.plugin_config("mode: enforce\n"))
        assert wait_until(lambda: NODE.read_values(pod.parent, pod.container_id) == applied), (
            NODE.read_values(pod.parent, pod.container_id)
        )
        assert wait_until(lambda: NODE.read_values(pod.parent, None) == applied)
        assert scrape(port, "nri_midbatch_mode", mode="enforce") == 1
        assert scrape(port, "nri_midbatch_mode", mode="observe") == 0
    finally:
        assert plugin.stop() == 0
